//! The agent's two contacts with systemd: `sd_notify` (READY, WATCHDOG, STATUS, STOPPING)
//! and telling a system shutdown from a restart of the agent alone.
//!
//! Shutdown vs restart: on SIGTERM the agent says goodbye with reason `shutdown` when
//! 1. `<root>/run/systemd/shutdown/scheduled` exists (written by `shutdown -r +N` /
//!    `systemctl reboot --when=…`, and present while that shutdown proceeds), or
//! 2. the root is `/` and `systemctl is-system-running` prints `stopping` (the manager has a
//!    shutdown/reboot/poweroff job running: what every `systemctl reboot` and
//!    `poweroff` goes through, when the agent's stop job is part of it).
//!
//! Otherwise (`systemctl restart node-agent`, package upgrade, kill by hand) the reason is
//! `restart`. Both are planned stops; the coordinator only uses the reason to expect the
//! machine to go away for a reboot or to be back in seconds. Nothing here parses systemd's
//! D-Bus API, on purpose: the two signals above need no extra dependency.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use protocol::messages::GoodbyeReason;

use crate::checks::under_root;

/// How long `systemctl is-system-running` may take: it is a local D-Bus property read, so
/// 2 s without an answer means the bus is wedged and guessing `restart` is better than
/// delaying the goodbye past the stop timeout.
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(2);

/// Service-manager notifications.
pub trait Notifier: Send + Sync {
    /// The agent is up: its first report was accepted.
    fn ready(&self);
    /// The agent's loop is alive.
    fn watchdog(&self);
    /// How often [`Notifier::watchdog`] must be called at least, if a watchdog is armed.
    fn watchdog_period(&self) -> Option<Duration>;
    /// A one-line status for `systemctl status`.
    fn status(&self, status: &str);
    /// The agent is stopping.
    fn stopping(&self);
}

/// The real [`Notifier`]: `sd_notify` on `$NOTIFY_SOCKET` (a no-op without it).
#[derive(Debug, Clone)]
pub struct SdNotifier {
    watchdog: Option<Duration>,
}

impl SdNotifier {
    /// Reads `WATCHDOG_USEC`/`WATCHDOG_PID` once.
    pub fn from_env() -> Self {
        Self {
            watchdog: sd_notify::watchdog_enabled(),
        }
    }
}

impl Notifier for SdNotifier {
    fn ready(&self) {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    }

    fn watchdog(&self) {
        if self.watchdog.is_some() {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
        }
    }

    fn watchdog_period(&self) -> Option<Duration> {
        // Ping at half the timeout, as sd_watchdog_enabled(3) recommends.
        self.watchdog.map(|d| d / 2)
    }

    fn status(&self, status: &str) {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(status)]);
    }

    fn stopping(&self) {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
}

/// Longest a single step of the agent's loop (resolving and connecting to every coordinator
/// address, or running the checks and waiting for a report's answer) is pinged through.
///
/// Each step is bounded by its own timeouts (a 10 s hello per address, a 10 s reply, the
/// kubelet check's timeout), so 2 min is well past any step that is still making progress:
/// one running longer is hung, the pings stop and systemd restarts the agent.
pub const STEP_LIMIT: Duration = Duration::from_secs(120);

/// Awaits `work`, pinging the watchdog every [`Notifier::watchdog_period`] while it runs, so
/// a wait on the network (a coordinator that drops packets) is not taken for a hung agent.
/// Pings stop once `work` has run for `limit`, so a step that never ends still gets the
/// agent restarted. Without an armed watchdog this is `work.await`.
pub async fn pinging<F: Future>(notifier: &dyn Notifier, limit: Duration, work: F) -> F::Output {
    let Some(period) = notifier.watchdog_period() else {
        return work.await;
    };
    let until = tokio::time::Instant::now() + limit;
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            biased;
            v = &mut work => return v,
            _ = tokio::time::sleep(period) => {}
        }
        if tokio::time::Instant::now() >= until {
            return work.await;
        }
        notifier.watchdog();
    }
}

/// A boxed future, for the object-safe async trait below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Decides the goodbye reason when the agent is told to stop.
pub trait ShutdownProbe: Send + Sync {
    /// `Shutdown` when the whole system is going down, `Restart` otherwise.
    fn reason(&self) -> BoxFuture<'_, GoodbyeReason>;
}

/// The real [`ShutdownProbe`], described in the module docs.
#[derive(Debug, Clone)]
pub struct SystemdShutdownProbe {
    root: PathBuf,
}

impl SystemdShutdownProbe {
    /// A probe reading under `root`.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
}

impl ShutdownProbe for SystemdShutdownProbe {
    fn reason(&self) -> BoxFuture<'_, GoodbyeReason> {
        Box::pin(async move {
            if under_root(&self.root, "/run/systemd/shutdown/scheduled").exists() {
                return GoodbyeReason::Shutdown;
            }
            if self.root != std::path::Path::new("/") {
                // A fixture root: the host's systemd state is not this node's.
                return GoodbyeReason::Restart;
            }
            let out = tokio::time::timeout(
                SYSTEMCTL_TIMEOUT,
                tokio::process::Command::new("systemctl")
                    .arg("is-system-running")
                    .kill_on_drop(true)
                    .output(),
            )
            .await;
            match out {
                Ok(Ok(o)) if String::from_utf8_lossy(&o.stdout).trim() == "stopping" => {
                    GoodbyeReason::Shutdown
                }
                _ => GoodbyeReason::Restart,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::testkit_fixture::NodeFixture;

    /// Counts pings; asks for one every 10 ms when armed.
    #[derive(Default)]
    struct Pings {
        armed: bool,
        count: AtomicU64,
    }

    impl Notifier for Pings {
        fn ready(&self) {}
        fn watchdog(&self) {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
        fn watchdog_period(&self) -> Option<Duration> {
            self.armed.then_some(Duration::from_millis(10))
        }
        fn status(&self, _: &str) {}
        fn stopping(&self) {}
    }

    fn armed() -> Pings {
        Pings {
            armed: true,
            ..Pings::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_is_pinged_through() {
        let n = armed();
        let v = pinging(&n, STEP_LIMIT, async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            7
        })
        .await;
        assert_eq!(v, 7);
        // 20 periods of 10 ms (time is paused: no timer slack); the last may lose to the
        // work's own end at the same instant.
        let count = n.count.load(Ordering::SeqCst);
        assert!(count >= 19, "{count} pings in 200 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_limit_is_not_pinged_any_more() {
        let n = armed();
        pinging(
            &n,
            Duration::from_millis(50),
            tokio::time::sleep(Duration::from_millis(300)),
        )
        .await;
        let count = n.count.load(Ordering::SeqCst);
        assert!(count <= 5, "{count} pings: pinged past the 50 ms limit");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_pinged_without_a_watchdog() {
        let n = Pings::default();
        pinging(
            &n,
            STEP_LIMIT,
            tokio::time::sleep(Duration::from_millis(50)),
        )
        .await;
        assert_eq!(n.count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn scheduled_shutdown_file_means_shutdown() {
        let f = NodeFixture::builder("n").build().unwrap();
        let p = SystemdShutdownProbe::new(f.root().to_path_buf());
        assert_eq!(p.reason().await, GoodbyeReason::Restart);
        f.schedule_shutdown(true).unwrap();
        assert_eq!(p.reason().await, GoodbyeReason::Shutdown);
        f.schedule_shutdown(false).unwrap();
        assert_eq!(p.reason().await, GoodbyeReason::Restart);
    }
}
