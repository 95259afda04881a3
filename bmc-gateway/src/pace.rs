//! Pacing one BMC: a minimum interval between commands, and a power-on asked again while the
//! BMC refuses it as busy.
//!
//! Some BMCs drop or refuse a command that follows the previous one too closely, and some
//! refuse a power-on for up to a minute after a power-off (Redfish 409 Conflict, IPMI
//! completion code 0xC0 "node busy"; see [`BmcError::Busy`]). [`Paced`] wraps a BMC client
//! so every caller (actions, idle probes) gets both behaviours; the action's own time limit
//! still bounds the whole. Only power-on is retried: an off, reset or cycle refused as busy
//! is reported, since asking again later is the caller's decision.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::warn;

use crate::power::{BmcError, ChassisOp, PowerControl, PowerReading, PowerState};

/// Default minimum interval between two commands to one BMC.
///
/// 300 ms: enough for the BMCs known to drop back-to-back IPMI commands, short enough that a
/// fence (an off, then a status read per second) loses nothing; BMCs that need seconds set
/// `min_command_interval` for themselves.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_millis(300);

/// Default window in which a power-on refused as busy is asked again.
///
/// 90 s: BMCs that refuse a power-on after an off accept it within about a minute; the rest
/// is margin.
pub const DEFAULT_BUSY_RETRY: Duration = Duration::from_secs(90);

/// Pause between power-on attempts while the BMC is busy.
///
/// 2 s: adds at most 2 s to a power-on once the BMC accepts, at one command per 2 s.
pub const BUSY_POLL: Duration = Duration::from_secs(2);

/// A BMC client with pacing (see the module doc).
pub struct Paced {
    inner: Arc<dyn PowerControl>,
    min_interval: Duration,
    busy_retry: Duration,
    busy_poll: Duration,
    /// When the last command ended; held across a command so commands never overlap.
    last_end: tokio::sync::Mutex<Option<Instant>>,
}

impl Paced {
    /// Wraps `inner`: at least `min_interval` between the end of a command and the start of
    /// the next, and power-on asked again for up to `busy_retry` while the BMC is busy.
    pub fn new(inner: Arc<dyn PowerControl>, min_interval: Duration, busy_retry: Duration) -> Self {
        Self {
            inner,
            min_interval,
            busy_retry,
            busy_poll: BUSY_POLL,
            last_end: tokio::sync::Mutex::new(None),
        }
    }

    /// Sets the pause between busy power-on attempts (tests).
    pub fn with_busy_poll(mut self, poll: Duration) -> Self {
        self.busy_poll = poll;
        self
    }

    async fn paced<T>(&self, call: impl FnOnce() -> BoxFuture<'static, T> + Send) -> T {
        let mut last = self.last_end.lock().await;
        if let Some(end) = *last {
            tokio::time::sleep_until(end + self.min_interval).await;
        }
        let r = call().await;
        *last = Some(Instant::now());
        r
    }

    async fn chassis_once(&self, op: ChassisOp) -> Result<String, BmcError> {
        let inner = self.inner.clone();
        self.paced(move || Box::pin(async move { inner.chassis(op).await }))
            .await
    }
}

impl PowerControl for Paced {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        let inner = self.inner.clone();
        Box::pin(self.paced(move || Box::pin(async move { inner.power_state().await })))
    }

    fn power_reading(&self) -> BoxFuture<'_, Result<PowerReading, BmcError>> {
        let inner = self.inner.clone();
        Box::pin(self.paced(move || Box::pin(async move { inner.power_reading().await })))
    }

    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            let start = Instant::now();
            let mut attempts = 1u32;
            loop {
                match self.chassis_once(op).await {
                    Err(BmcError::Busy { bmc, detail, .. })
                        if op == ChassisOp::On
                            && start.elapsed() + self.busy_poll < self.busy_retry =>
                    {
                        warn!(%bmc, %detail, attempts, "BMC busy; power-on will be asked again");
                        tokio::time::sleep(self.busy_poll).await;
                        attempts += 1;
                    }
                    Err(BmcError::Busy { bmc, what, detail }) if attempts > 1 => {
                        return Err(BmcError::Busy {
                            bmc,
                            what,
                            detail: format!(
                                "{detail} (still busy after {attempts} attempts in {} s)",
                                start.elapsed().as_secs()
                            ),
                        });
                    }
                    Ok(said) if attempts > 1 => {
                        return Ok(format!("{said} (accepted at attempt {attempts})"));
                    }
                    r => return r,
                }
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant as StdInstant;

    use super::*;
    use crate::power::fake::FakePower;

    fn busy() -> BmcError {
        BmcError::Busy {
            bmc: "b".into(),
            what: "power on".into(),
            detail: "HTTP 409 Conflict".into(),
        }
    }

    #[tokio::test]
    async fn commands_to_one_bmc_are_spaced_by_the_minimum_interval() {
        let fake = Arc::new(FakePower::new(PowerState::On));
        let p = Paced::new(fake.clone(), Duration::from_millis(80), Duration::ZERO);
        let t = StdInstant::now();
        p.power_state().await.unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(80),
            "the first command does not wait"
        );
        p.chassis(ChassisOp::Off).await.unwrap();
        p.power_state().await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(160),
            "two gaps of 80 ms: {:?}",
            t.elapsed()
        );
        assert_eq!(fake.calls(), ["status", "off", "status"]);
    }

    #[tokio::test]
    async fn a_busy_power_on_is_asked_again_within_the_window_and_then_succeeds() {
        let fake = Arc::new(FakePower::new(PowerState::Off));
        fake.fail_next(busy());
        fake.fail_next(busy());
        let p = Paced::new(fake.clone(), Duration::ZERO, Duration::from_secs(5))
            .with_busy_poll(Duration::from_millis(10));
        let said = p.chassis(ChassisOp::On).await.unwrap();
        assert!(said.contains("attempt 3"), "{said}");
        assert_eq!(fake.calls(), ["on", "on", "on"]);
        assert_eq!(fake.power(), PowerState::On);
    }

    #[tokio::test]
    async fn a_power_on_still_busy_at_the_end_of_the_window_reports_busy() {
        let fake = Arc::new(FakePower::new(PowerState::Off));
        for _ in 0..100 {
            fake.fail_next(busy());
        }
        let p = Paced::new(fake.clone(), Duration::ZERO, Duration::from_millis(100))
            .with_busy_poll(Duration::from_millis(20));
        let e = p.chassis(ChassisOp::On).await.unwrap_err();
        assert!(
            matches!(e, BmcError::Busy { .. }) && e.is_retriable(),
            "{e}"
        );
        assert!(e.to_string().contains("still busy after"), "{e}");
        let n = fake.calls().len();
        assert!((2..=6).contains(&n), "{n} attempts in 100 ms at 20 ms");
    }

    #[tokio::test]
    async fn only_power_on_is_retried_and_other_errors_are_not() {
        let fake = Arc::new(FakePower::new(PowerState::On));
        fake.fail_next(busy());
        let p = Paced::new(fake.clone(), Duration::ZERO, Duration::from_secs(5))
            .with_busy_poll(Duration::from_millis(10));
        assert!(p.chassis(ChassisOp::Off).await.is_err());
        fake.fail_next(BmcError::Refused {
            bmc: "b".into(),
            what: "power on".into(),
            detail: "0xD4 insufficient privilege".into(),
        });
        assert!(p.chassis(ChassisOp::On).await.is_err());
        assert_eq!(fake.calls(), ["off", "on"]);
    }
}
