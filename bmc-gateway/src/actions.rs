//! What each power action means, on top of [`PowerControl`] primitives: `status`, `on`, `off`,
//! `soft-off`, `cycle` (which powers on a machine that is off), `reset`, and `fence` (off, then
//! poll the power state until it reads off).
//!
//! Every action runs under one overall time limit and ends in a [`PowerOutcome`] saying what the
//! BMC said or what was seen. This module does not queue, deduplicate or log; see
//! [`crate::worker`] and [`crate::gateway`].

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::gateway::{POWERED_ON_ONLY, PowerAction, PowerOutcome};

use crate::power::{BmcError, ChassisOp, PowerControl, PowerState};

/// How often a fence reads the power state while waiting for off.
///
/// 1 s: a BMC answers a status read in milliseconds, so this costs nothing, and it bounds how
/// late "confirmed off" can be reported after the fact.
pub const FENCE_POLL: Duration = Duration::from_secs(1);

/// Wall-clock time, fakeable in tests.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_unix_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// Settings for one action.
#[derive(Debug, Clone, Copy)]
pub struct ActionLimits {
    /// Overall limit.
    pub timeout: Duration,
    /// Power-state poll period during a fence.
    pub poll: Duration,
}

fn failed(e: &BmcError, context: &str) -> PowerOutcome {
    PowerOutcome::Failed {
        detail: format!("{context}: {e}"),
        retriable: e.is_retriable(),
    }
}

/// Formats a Unix-ms time as RFC 3339 UTC, e.g. `2026-11-21T10:03:21.123Z`.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let ms = unix_ms % 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// A cycle this BMC accepted for another request shortly before, for a cycle that then
/// finds the machine off: that one is still under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierCycle {
    /// The request id of that cycle.
    pub id: String,
    /// How long before this action the BMC accepted it.
    pub ago: Duration,
}

/// Runs `action` against `power` within `limits.timeout` and says what happened.
pub async fn run(
    power: &dyn PowerControl,
    action: PowerAction,
    limits: ActionLimits,
    clock: &dyn Clock,
) -> PowerOutcome {
    run_after(power, action, limits, clock, None).await
}

/// As [`run`], knowing the cycle this BMC accepted shortly before, if any: a cycle that
/// finds the machine off then says it was being cycled by that request, and that it was
/// powered on only ([`POWERED_ON_ONLY`]).
pub async fn run_after(
    power: &dyn PowerControl,
    action: PowerAction,
    limits: ActionLimits,
    clock: &dyn Clock,
    earlier: Option<&EarlierCycle>,
) -> PowerOutcome {
    // What was last seen, kept outside the future so a timeout can still report it.
    let seen = Mutex::new(String::from("no answer from the BMC yet"));
    let work = run_inner(power, action, limits, clock, &seen, earlier);
    match tokio::time::timeout(limits.timeout, work).await {
        Ok(outcome) => outcome,
        Err(_) => PowerOutcome::Failed {
            detail: format!(
                "{} timed out after {} ms; last seen: {}",
                action_name(action),
                limits.timeout.as_millis(),
                seen.lock().expect("not poisoned")
            ),
            retriable: true,
        },
    }
}

/// The kebab-case name of an action.
pub fn action_name(a: PowerAction) -> &'static str {
    match a {
        PowerAction::Status => "status",
        PowerAction::On => "on",
        PowerAction::Off => "off",
        PowerAction::SoftOff => "soft-off",
        PowerAction::Cycle => "cycle",
        PowerAction::Reset => "reset",
        PowerAction::Fence => "fence",
    }
}

async fn run_inner(
    power: &dyn PowerControl,
    action: PowerAction,
    limits: ActionLimits,
    clock: &dyn Clock,
    seen: &Mutex<String>,
    earlier: Option<&EarlierCycle>,
) -> PowerOutcome {
    let note = |s: String| *seen.lock().expect("not poisoned") = s;
    // Why a cycle only powered the machine on, when it did.
    let mut on_only = None;
    let op = match action {
        PowerAction::Status => {
            return match power.power_reading().await {
                Ok(r) => PowerOutcome::Done {
                    state: r.state,
                    confirmed_off_unix_ms: None,
                    detail: format!("power is {}", r.describe()),
                },
                Err(e) => failed(&e, "reading power state"),
            };
        }
        PowerAction::Fence => return fence(power, limits, clock, seen).await,
        PowerAction::On => ChassisOp::On,
        PowerAction::Off => ChassisOp::Off,
        PowerAction::SoftOff => ChassisOp::SoftOff,
        PowerAction::Reset => ChassisOp::Reset,
        PowerAction::Cycle => {
            // Many BMCs refuse a power cycle on a machine that is off; what the caller wants
            // from "cycle" is a machine that runs again, so an off machine is powered on.
            match power.power_reading().await {
                Ok(r) if r.state == PowerState::Off => {
                    // Off moments after another request's cycle: that cycle holds it off.
                    // Cycling again would only add a reboot; powering on ends both.
                    let why = match earlier {
                        Some(c) => format!(
                            "the machine was being cycled by request {} (accepted {} s before) \
                             and read off",
                            c.id,
                            c.ago.as_secs()
                        ),
                        None => "the machine was off".into(),
                    };
                    note(format!("{why} before the cycle"));
                    on_only = Some(why);
                    ChassisOp::On
                }
                Ok(r) => {
                    note(format!("power was {} before the cycle", r.describe()));
                    ChassisOp::Cycle
                }
                Err(e) => return failed(&e, "reading power state before the cycle"),
            }
        }
    };
    // A BMC may take long to answer (a Redfish task it makes us follow): a timeout then says
    // the request went out, not that the BMC never answered anything.
    let before = match action {
        PowerAction::Cycle => format!("{}; ", seen.lock().expect("not poisoned")),
        _ => String::new(),
    };
    note(format!(
        "{before}power {} sent; the BMC has not finished answering it",
        op.as_str()
    ));
    let said = match power.chassis(op).await {
        Ok(said) => said,
        Err(e) => return failed(&e, &format!("power {}", op.as_str())),
    };
    note(format!("BMC accepted power {}: {said}", op.as_str()));
    let prefix = match on_only {
        Some(why) => format!("{POWERED_ON_ONLY}{why}, so the cycle powered it on; "),
        None => String::new(),
    };
    // Read the state once afterwards for the record; BMCs may apply a change later, so this
    // does not decide success (a fence does that).
    let (state, after) = match power.power_reading().await {
        Ok(r) => (r.state, format!("power reads {} right after", r.describe())),
        Err(e) => (
            PowerState::Unknown,
            format!("power state not read after: {e}"),
        ),
    };
    PowerOutcome::Done {
        state,
        confirmed_off_unix_ms: None,
        detail: format!("{prefix}power {} accepted: {said}; {after}", op.as_str()),
    }
}

async fn fence(
    power: &dyn PowerControl,
    limits: ActionLimits,
    clock: &dyn Clock,
    seen: &Mutex<String>,
) -> PowerOutcome {
    let note = |s: String| *seen.lock().expect("not poisoned") = s;
    // An unanswered power off is sent again while the limit lasts: the answer may be what was
    // lost (the BMC applied it), and powering off a machine that is off does nothing. A refusal
    // (credentials, a completion code) ends the fence at once: asking again would not change it.
    let mut attempts = 0u32;
    let said = loop {
        attempts += 1;
        if attempts == 1 {
            note("power off sent; the BMC has not finished answering it".into());
        }
        match power.chassis(ChassisOp::Off).await {
            Ok(s) => break s,
            Err(e) if e.is_retriable() => note(format!(
                "power off not answered after {attempts} attempt{}: {e}",
                if attempts == 1 { "" } else { "s" }
            )),
            Err(e) => return failed(&e, "fence: power off"),
        }
        tokio::time::sleep(limits.poll).await;
    };
    note(format!(
        "BMC accepted power off ({said}); power not read yet"
    ));
    let mut reads = 0u32;
    loop {
        match power.power_reading().await {
            Ok(r) if r.state == PowerState::Off => {
                let t = clock.now_unix_ms();
                return PowerOutcome::Done {
                    state: PowerState::Off,
                    confirmed_off_unix_ms: Some(t),
                    detail: format!(
                        "fenced, confirmed off at {} (power off accepted: {said}; read off after {} reads)",
                        rfc3339_ms(t),
                        reads + 1
                    ),
                };
            }
            Ok(r) => {
                reads += 1;
                note(format!(
                    "power off accepted ({said}) but power still reads {} after {reads} reads",
                    r.describe()
                ));
            }
            Err(e) => {
                reads += 1;
                note(format!(
                    "power off accepted ({said}) but reading power state failed: {e}"
                ));
            }
        }
        tokio::time::sleep(limits.poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::fake::FakePower;

    struct FixedClock(u64);
    impl Clock for FixedClock {
        fn now_unix_ms(&self) -> u64 {
            self.0
        }
    }

    fn limits(timeout_ms: u64) -> ActionLimits {
        ActionLimits {
            timeout: Duration::from_millis(timeout_ms),
            poll: Duration::from_millis(5),
        }
    }

    async fn go(p: &FakePower, a: PowerAction, timeout_ms: u64) -> PowerOutcome {
        run(p, a, limits(timeout_ms), &FixedClock(1_795_255_401_123)).await
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_795_255_401_123), "2026-11-21T10:03:21.123Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[tokio::test]
    async fn status_reads_only() {
        let p = FakePower::new(PowerState::On);
        let o = go(&p, PowerAction::Status, 1000).await;
        assert!(
            matches!(
                o,
                PowerOutcome::Done {
                    state: PowerState::On,
                    ..
                }
            ),
            "{o:?}"
        );
        assert_eq!(p.calls(), ["status"]);
    }

    #[tokio::test]
    async fn cycle_on_an_off_machine_powers_it_on() {
        let p = FakePower::new(PowerState::Off);
        let o = go(&p, PowerAction::Cycle, 1000).await;
        assert_eq!(p.calls(), ["status", "on", "status"]);
        let PowerOutcome::Done { state, detail, .. } = o else {
            panic!("{o:?}")
        };
        assert_eq!(state, PowerState::On);
        assert!(detail.contains("was off"), "{detail}");
        assert!(detail.starts_with(POWERED_ON_ONLY), "{detail}");

        let p = FakePower::new(PowerState::On);
        go(&p, PowerAction::Cycle, 1000).await;
        assert_eq!(p.calls(), ["status", "cycle", "status"]);
    }

    #[tokio::test]
    async fn fence_polls_until_off_and_reports_when() {
        let p = FakePower::new(PowerState::On).with_off_lag(3);
        let o = go(&p, PowerAction::Fence, 2000).await;
        let PowerOutcome::Done {
            state,
            confirmed_off_unix_ms,
            detail,
        } = o
        else {
            panic!("{o:?}")
        };
        assert_eq!(state, PowerState::Off);
        assert_eq!(confirmed_off_unix_ms, Some(1_795_255_401_123));
        assert!(
            detail.starts_with("fenced, confirmed off at 2026-11-21T10:03:21.123Z"),
            "{detail}"
        );
        assert_eq!(p.calls(), ["off", "status", "status", "status", "status"]);
    }

    #[tokio::test]
    async fn fence_that_never_reads_off_fails_saying_what_was_seen() {
        let p = FakePower::new(PowerState::On).with_off_lag(u32::MAX);
        let o = go(&p, PowerAction::Fence, 100).await;
        let PowerOutcome::Failed { detail, retriable } = o else {
            panic!("{o:?}")
        };
        assert!(retriable);
        assert!(detail.contains("fence timed out after 100 ms"), "{detail}");
        assert!(detail.contains("still reads on"), "{detail}");
    }

    #[tokio::test]
    async fn fence_whose_off_is_refused_fails_at_once() {
        let p = FakePower::new(PowerState::On);
        p.fail_next(BmcError::Refused {
            bmc: "b".into(),
            what: "off".into(),
            detail: "cc 0xd5".into(),
        });
        let o = go(&p, PowerAction::Fence, 1000).await;
        let PowerOutcome::Failed { detail, retriable } = o else {
            panic!("{o:?}")
        };
        assert!(!retriable);
        assert!(detail.contains("cc 0xd5"), "{detail}");
        assert_eq!(p.calls(), ["off"]);
    }

    #[tokio::test]
    async fn fence_sends_an_unanswered_off_again_within_its_limit() {
        let p = FakePower::new(PowerState::On);
        p.fail_next(BmcError::Timeout {
            bmc: "b".into(),
            what: "power off".into(),
            waited_ms: 1500,
        });
        let o = go(&p, PowerAction::Fence, 1000).await;
        assert!(
            matches!(
                o,
                PowerOutcome::Done {
                    state: PowerState::Off,
                    ..
                }
            ),
            "{o:?}"
        );
        assert_eq!(p.calls(), ["off", "off", "status"]);

        // A BMC that never answers: the fence ends at its limit, saying so.
        let p = FakePower::new(PowerState::On);
        for _ in 0..100 {
            p.fail_next(BmcError::Timeout {
                bmc: "b".into(),
                what: "power off".into(),
                waited_ms: 1500,
            });
        }
        let o = go(&p, PowerAction::Fence, 100).await;
        let PowerOutcome::Failed { detail, retriable } = o else {
            panic!("{o:?}")
        };
        assert!(retriable);
        assert!(detail.contains("fence timed out after 100 ms"), "{detail}");
        assert!(detail.contains("power off not answered after"), "{detail}");
        assert!(p.calls().len() > 2, "{:?}", p.calls());
    }

    #[tokio::test]
    async fn a_hanging_bmc_times_out() {
        let p = FakePower::new(PowerState::On).with_delay(Duration::from_secs(5));
        let t = std::time::Instant::now();
        let o = go(&p, PowerAction::Off, 50).await;
        assert!(t.elapsed() < Duration::from_secs(2));
        let PowerOutcome::Failed { detail, retriable } = o else {
            panic!("{o:?}")
        };
        assert!(retriable);
        assert!(detail.contains("off timed out after 50 ms"), "{detail}");
        // The request went out: the detail says so instead of "no answer from the BMC yet".
        assert!(
            detail.contains("power off sent; the BMC has not finished answering it"),
            "{detail}"
        );
    }

    /// A Redfish BMC that accepts the reset with a task it never completes: the fence's
    /// timeout said "last seen: no answer from the BMC yet", as if nothing had been sent.
    #[tokio::test]
    async fn a_fence_whose_off_is_never_answered_says_the_off_was_sent() {
        let p = FakePower::new(PowerState::On).with_delay(Duration::from_secs(5));
        let o = go(&p, PowerAction::Fence, 50).await;
        let PowerOutcome::Failed { detail, .. } = o else {
            panic!("{o:?}")
        };
        assert!(detail.contains("fence timed out after 50 ms"), "{detail}");
        assert!(
            detail.contains("last seen: power off sent; the BMC has not finished answering it"),
            "{detail}"
        );
    }

    #[tokio::test]
    async fn off_then_on_changes_state() {
        let p = FakePower::new(PowerState::On);
        let o = go(&p, PowerAction::Off, 1000).await;
        assert!(
            matches!(
                o,
                PowerOutcome::Done {
                    state: PowerState::Off,
                    ..
                }
            ),
            "{o:?}"
        );
        let o = go(&p, PowerAction::On, 1000).await;
        assert!(
            matches!(
                o,
                PowerOutcome::Done {
                    state: PowerState::On,
                    ..
                }
            ),
            "{o:?}"
        );
        let o = go(&p, PowerAction::SoftOff, 1000).await;
        assert!(
            matches!(
                o,
                PowerOutcome::Done {
                    state: PowerState::Off,
                    ..
                }
            ),
            "{o:?}"
        );
        assert_eq!(
            p.calls(),
            ["off", "status", "on", "status", "soft-off", "status"]
        );
    }
}
