//! Health states and the pure function that derives them.
//!
//! States use sabakan's vocabulary: `uninitialized` (registered, never reported),
//! `healthy`, `unhealthy` (a check reports `fail`), `unreachable` (no report for the grace
//! period), and the admin states `updating`, `retiring`, `retired`, which only an operator
//! sets and reports never change. Two more states are Fleetmend's own:
//!
//! - `awaiting-registration`: an agent with a valid node certificate said hello, but no
//!   inventory record names its hostname. It has no machine type, so no repair procedure
//!   applies to it, until an operator registers it.
//! - `stopped`: the agent said goodbye (planned shutdown, reboot or agent restart). The
//!   machine is down on purpose, which is not a failure, so detectors that look for
//!   `unreachable` leave it alone. If it stays silent longer than the goodbye grace
//!   (default 10 min) it becomes `unreachable` after all: a planned reboot that never comes
//!   back is a failure.
//!
//! [`derive`] is a pure function of (previous state, observation, now, config); the
//! [`crate::fleet::Fleet`] registry feeds it and persists what it returns. This module does
//! no I/O and reads no clock. Its `[health]` section is parsed in [`config`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use protocol::messages::{GoodbyeReason, HealthReport};

pub mod config;

/// Default report interval; must match node-agent's default so the unreachable grace
/// (3 intervals) means "three missed reports".
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// How many missed report intervals make a machine unreachable by default. Three tolerates
/// one lost report and one reconnect without flapping to unreachable.
pub const DEFAULT_GRACE_INTERVALS: u32 = 3;

/// How long a machine whose agent said goodbye may stay silent before it is called
/// unreachable. Ten minutes covers a slow firmware POST plus a full boot of a large server.
pub const DEFAULT_GOODBYE_GRACE: Duration = Duration::from_secs(600);

/// Settings of the derivation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// How often agents report.
    pub report_interval: Duration,
    /// Silence after which a machine is unreachable.
    pub unreachable_grace: Duration,
    /// Silence after a goodbye after which a machine is unreachable.
    pub goodbye_grace: Duration,
}

impl HealthConfig {
    /// The report interval a machine is judged on: the one its agent announced in its last
    /// `report` (at most [`protocol::messages::MAX_REPORT_INTERVAL`]), else the configured
    /// one (an agent from before the announcement, or no report yet).
    pub fn interval_for(&self, report: Option<&HealthReport>) -> Duration {
        report
            .and_then(HealthReport::report_interval)
            .unwrap_or(self.report_interval)
    }

    /// The silence after which a machine whose last report is `report` is unreachable: the
    /// configured grace, or, when its agent announced a longer interval than the configured
    /// one, the grace stretched in proportion (as many of the agent's intervals as the grace
    /// holds of the configured one). Never shorter than the configured grace: a machine is
    /// judged on the interval its agent keeps, not on one it was never told.
    pub fn grace_for(&self, report: Option<&HealthReport>) -> Duration {
        let interval = self.interval_for(report);
        if interval <= self.report_interval || self.report_interval.is_zero() {
            return self.unreachable_grace;
        }
        let stretched = self.unreachable_grace.as_nanos() * interval.as_nanos()
            / self.report_interval.as_nanos();
        Duration::from_nanos(u64::try_from(stretched).unwrap_or(u64::MAX))
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        let report_interval = DEFAULT_REPORT_INTERVAL;
        Self {
            report_interval,
            unreachable_grace: report_interval * DEFAULT_GRACE_INTERVALS,
            goodbye_grace: DEFAULT_GOODBYE_GRACE,
        }
    }
}

/// A machine's health state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MachineState {
    /// Registered, never reported.
    Uninitialized,
    /// Reporting, no check failing.
    Healthy,
    /// Reporting, at least one check failing.
    Unhealthy,
    /// No report for the grace period.
    Unreachable,
    /// Being updated by an operator (admin state).
    Updating,
    /// Being retired (admin state).
    Retiring,
    /// Retired (admin state).
    Retired,
    /// An unknown host said hello; not in the inventory, no machine type.
    AwaitingRegistration,
    /// The agent said goodbye: down on purpose.
    Stopped,
}

impl MachineState {
    /// Every state, for metrics.
    pub const ALL: [MachineState; 9] = [
        MachineState::Uninitialized,
        MachineState::Healthy,
        MachineState::Unhealthy,
        MachineState::Unreachable,
        MachineState::Updating,
        MachineState::Retiring,
        MachineState::Retired,
        MachineState::AwaitingRegistration,
        MachineState::Stopped,
    ];

    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Uninitialized => "uninitialized",
            MachineState::Healthy => "healthy",
            MachineState::Unhealthy => "unhealthy",
            MachineState::Unreachable => "unreachable",
            MachineState::Updating => "updating",
            MachineState::Retiring => "retiring",
            MachineState::Retired => "retired",
            MachineState::AwaitingRegistration => "awaiting-registration",
            MachineState::Stopped => "stopped",
        }
    }

    /// True for states only an operator sets, which reports never change.
    pub fn is_admin(self) -> bool {
        matches!(
            self,
            MachineState::Updating | MachineState::Retiring | MachineState::Retired
        )
    }
}

impl fmt::Display for MachineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of [`MachineState::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown machine state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for MachineState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MachineState::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// What is known about a machine when deciding its state.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// Whether an inventory record (with a machine type) exists.
    pub registered: bool,
    /// The last report and when the coordinator received it (by its own clock).
    pub last_report: Option<(Timestamp, &'a HealthReport)>,
    /// The last goodbye and when it was received.
    pub goodbye: Option<(GoodbyeReason, Timestamp)>,
    /// When this coordinator process started watching (reports before it are unknown).
    pub watching_since: Timestamp,
    /// Whether the agent's connection is open and QUIC heard from it well after its last
    /// report (keep-alives answered): the agent lives but does not report.
    pub heard_since_report: bool,
}

/// The state a machine is in now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    /// State.
    pub state: MachineState,
    /// When it was entered.
    pub since: Timestamp,
}

/// A state change decided by [`derive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// The new state.
    pub state: MachineState,
    /// Why, for the transition history.
    pub reason: String,
}

pub(crate) fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    let ms = now.as_millisecond().saturating_sub(since.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Formats a duration for reasons: `1.2s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn goodbye_word(r: GoodbyeReason) -> &'static str {
    match r {
        GoodbyeReason::Shutdown => "shutdown",
        GoodbyeReason::Restart => "restart",
        GoodbyeReason::Reboot => "reboot",
    }
}

/// Failing checks of a report as `kind:subject (detail)`.
pub fn failing_summary(report: &HealthReport) -> Vec<String> {
    report
        .failing()
        .map(|c| {
            if c.detail.is_empty() {
                format!("{}:{}", c.kind.as_str(), c.subject)
            } else {
                format!("{}:{} ({})", c.kind.as_str(), c.subject, c.detail)
            }
        })
        .collect()
}

/// Decides a machine's state. Returns `None` when the state does not change.
pub fn derive(
    prev: Current,
    obs: &Observation<'_>,
    now: Timestamp,
    cfg: &HealthConfig,
) -> Option<Derived> {
    use MachineState as S;
    if prev.state.is_admin() {
        return None;
    }
    let (state, reason) = if !obs.registered {
        (
            S::AwaitingRegistration,
            "agent said hello but no inventory record names this host; register it with \
             `coordinatorctl machines add`"
                .to_string(),
        )
    } else if let Some((why, at)) = obs
        .goodbye
        .filter(|(_, at)| obs.last_report.is_none_or(|(r, _)| *at >= r))
    {
        let silent = elapsed(now, at);
        if silent >= cfg.goodbye_grace {
            (
                S::Unreachable,
                format!(
                    "agent said goodbye ({}) {} ago and has not reported since (goodbye grace {})",
                    goodbye_word(why),
                    secs(silent),
                    secs(cfg.goodbye_grace)
                ),
            )
        } else {
            (
                S::Stopped,
                format!("agent said goodbye ({})", goodbye_word(why)),
            )
        }
    } else if let Some((at, report)) = obs.last_report {
        let silent = elapsed(now, at);
        let grace = cfg.grace_for(Some(report));
        if silent > grace {
            // Heard from after its last report, yet silent: the agent is alive (its QUIC
            // stack answers keep-alives), so either it reports less often than this
            // coordinator expects (a report_interval that differs between the two configs
            // makes every machine flap) or it is stuck. An open connection alone says
            // nothing: a machine that lost power closes nothing, and its connection stays
            // until QUIC's idle timeout.
            let open = if !obs.heard_since_report {
                String::new()
            } else if let Some(announced) = report.report_interval() {
                format!(
                    "; its connection is alive (QUIC heard from it after that report), so the \
                     agent runs but does not report, although it said it reports every {}: \
                     the agent is stuck",
                    secs(announced)
                )
            } else {
                format!(
                    "; its connection is alive (QUIC heard from it after that report), so the \
                     agent runs but does not report: is its report_interval longer than this \
                     coordinator's ({})? Otherwise the agent is stuck",
                    secs(cfg.report_interval)
                )
            };
            (
                S::Unreachable,
                format!(
                    "no report for {} (grace {}){open}",
                    secs(silent),
                    secs(grace)
                ),
            )
        } else if !report.all_ok() {
            (
                S::Unhealthy,
                format!("failing: {}", failing_summary(report).join(", ")),
            )
        } else {
            (S::Healthy, "all checks passing".to_string())
        }
    } else {
        // Registered, and no report since this coordinator started.
        match prev.state {
            S::AwaitingRegistration => (
                S::Uninitialized,
                "registered; no report received yet".to_string(),
            ),
            S::Healthy | S::Unhealthy => {
                let from = if prev.since > obs.watching_since {
                    prev.since
                } else {
                    obs.watching_since
                };
                let silent = elapsed(now, from);
                // Its agent may be waiting out a reconnect backoff drawn while this
                // coordinator was down: a restart alone must not make machines unreachable.
                let grace = cfg.unreachable_grace + protocol::AGENT_RECONNECT_MAX;
                if silent > grace {
                    (
                        S::Unreachable,
                        format!(
                            "no report since the coordinator started {} ago (grace {} after a \
                             start: {} plus {} for agents to reconnect)",
                            secs(silent),
                            secs(grace),
                            secs(cfg.unreachable_grace),
                            secs(protocol::AGENT_RECONNECT_MAX)
                        ),
                    )
                } else {
                    return None;
                }
            }
            S::Stopped => {
                let silent = elapsed(now, prev.since);
                if silent >= cfg.goodbye_grace {
                    (
                        S::Unreachable,
                        format!(
                            "stopped {} ago and has not reported since (goodbye grace {})",
                            secs(silent),
                            secs(cfg.goodbye_grace)
                        ),
                    )
                } else {
                    return None;
                }
            }
            _ => return None,
        }
    };
    (state != prev.state).then_some(Derived { state, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::testing::FakeClock;
    use jiff::SignedDuration;
    use protocol::messages::{CheckKind, CheckResult, CheckStatus};

    fn cfg() -> HealthConfig {
        HealthConfig {
            report_interval: Duration::from_secs(5),
            unreachable_grace: Duration::from_secs(15),
            goodbye_grace: Duration::from_secs(600),
        }
    }

    fn report(fail_nic: bool) -> HealthReport {
        HealthReport {
            seq: 1,
            time_unix_ms: 0,
            boot_id: "b".into(),
            checks: vec![
                CheckResult {
                    kind: CheckKind::Kubelet,
                    subject: "kubelet".into(),
                    status: CheckStatus::Ok,
                    detail: String::new(),
                },
                CheckResult {
                    kind: CheckKind::Nic,
                    subject: "eth0".into(),
                    status: if fail_nic {
                        CheckStatus::Fail
                    } else {
                        CheckStatus::Warn
                    },
                    detail: "carrier down".into(),
                },
            ],
            report_interval_ms: 0,
        }
    }

    struct Case {
        clock: FakeClock,
        start: Timestamp,
    }

    impl Case {
        fn new() -> Self {
            let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
            Self {
                clock: FakeClock::new(start),
                start,
            }
        }
        fn after(&self, secs: i64) -> &Self {
            self.clock.advance(SignedDuration::from_secs(secs));
            self
        }
        fn now(&self) -> Timestamp {
            self.clock.now()
        }
        fn obs<'a>(&self, last: Option<(Timestamp, &'a HealthReport)>) -> Observation<'a> {
            Observation {
                registered: true,
                last_report: last,
                goodbye: None,
                watching_since: self.start,
                heard_since_report: false,
            }
        }
    }

    fn cur(state: MachineState, since: Timestamp) -> Current {
        Current { state, since }
    }

    #[test]
    fn registered_machine_without_report_stays_uninitialized() {
        let c = Case::new();
        c.after(3600);
        let d = derive(
            cur(MachineState::Uninitialized, c.start),
            &c.obs(None),
            c.now(),
            &cfg(),
        );
        assert_eq!(d, None);
    }

    #[test]
    fn first_report_makes_healthy_and_warn_is_not_failure() {
        let c = Case::new();
        let r = report(false);
        let d = derive(
            cur(MachineState::Uninitialized, c.start),
            &c.obs(Some((c.now(), &r))),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Healthy);
    }

    #[test]
    fn failing_check_makes_unhealthy_naming_it() {
        let c = Case::new();
        let r = report(true);
        let d = derive(
            cur(MachineState::Healthy, c.start),
            &c.obs(Some((c.now(), &r))),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Unhealthy);
        assert!(d.reason.contains("nic:eth0 (carrier down)"), "{}", d.reason);
    }

    #[test]
    fn silence_past_grace_makes_unreachable_not_before() {
        let c = Case::new();
        let r = report(false);
        let at = c.now();
        c.after(15);
        assert_eq!(
            derive(
                cur(MachineState::Healthy, at),
                &c.obs(Some((at, &r))),
                c.now(),
                &cfg()
            ),
            None,
            "exactly at the grace is still healthy"
        );
        c.after(1);
        let d = derive(
            cur(MachineState::Healthy, at),
            &c.obs(Some((at, &r))),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Unreachable);
        assert!(d.reason.contains("no report for 16.0s"), "{}", d.reason);
        assert!(!d.reason.contains("connection"), "{}", d.reason);
        // Heard from after its last report: the reason points at a report_interval mismatch.
        let open = Observation {
            heard_since_report: true,
            ..c.obs(Some((at, &r)))
        };
        let d = derive(cur(MachineState::Healthy, at), &open, c.now(), &cfg()).unwrap();
        assert!(
            d.reason.contains(
                "so the agent runs but does not report: is its report_interval longer than \
                 this coordinator's (5.0s)?"
            ),
            "{}",
            d.reason
        );
    }

    #[test]
    fn a_machine_is_judged_on_the_longer_interval_its_agent_announced_never_a_shorter_one() {
        let c = Case::new();
        let at = c.now();
        let announcing = |ms| HealthReport {
            report_interval_ms: ms,
            ..report(false)
        };
        // 30 s announced under a 5 s / 15 s coordinator: six intervals of the configured
        // grace's three, 90 s.
        let slow = announcing(30_000);
        assert_eq!(cfg().grace_for(Some(&slow)), Duration::from_secs(90));
        c.after(89);
        let derived = |r: &HealthReport| {
            derive(
                cur(MachineState::Healthy, at),
                &c.obs(Some((at, r))),
                c.now(),
                &cfg(),
            )
        };
        assert_eq!(derived(&slow), None, "89 s of a 30 s agent is not silence");
        // The same silence of an agent that did not say: unreachable on the configured grace.
        assert_eq!(
            derived(&report(false)).unwrap().state,
            MachineState::Unreachable
        );
        c.after(2);
        let d = derived(&slow).unwrap();
        assert_eq!(d.state, MachineState::Unreachable);
        assert!(
            d.reason.contains("no report for 91.0s (grace 90.0s)"),
            "{}",
            d.reason
        );
        let open = Observation {
            heard_since_report: true,
            ..c.obs(Some((at, &slow)))
        };
        let d = derive(cur(MachineState::Healthy, at), &open, c.now(), &cfg()).unwrap();
        assert!(
            d.reason
                .contains("although it said it reports every 30.0s: the agent is stuck"),
            "{}",
            d.reason
        );
        // A faster agent keeps the configured grace; an hour is taken as the one-minute
        // maximum (three minutes of grace).
        assert_eq!(
            cfg().grace_for(Some(&announcing(1_000))),
            Duration::from_secs(15)
        );
        assert_eq!(
            cfg().grace_for(Some(&announcing(3_600_000))),
            Duration::from_secs(180)
        );
        assert_eq!(cfg().grace_for(None), Duration::from_secs(15));
    }

    #[test]
    fn report_after_unreachable_recovers() {
        let c = Case::new();
        let r = report(false);
        c.after(100);
        let d = derive(
            cur(MachineState::Unreachable, c.start),
            &c.obs(Some((c.now(), &r))),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Healthy);
    }

    #[test]
    fn goodbye_is_stopped_then_unreachable_after_goodbye_grace() {
        let c = Case::new();
        let r = report(false);
        let report_at = c.now();
        let bye_at = c.after(1).now();
        let mut o = c.obs(Some((report_at, &r)));
        o.goodbye = Some((GoodbyeReason::Shutdown, bye_at));
        let d = derive(cur(MachineState::Healthy, report_at), &o, c.now(), &cfg()).unwrap();
        assert_eq!(d.state, MachineState::Stopped);
        assert!(d.reason.contains("shutdown"));
        // Well past the unreachable grace, still stopped: a planned reboot is no crash.
        c.after(60);
        assert_eq!(
            derive(cur(MachineState::Stopped, bye_at), &o, c.now(), &cfg()),
            None
        );
        c.after(600);
        let d = derive(cur(MachineState::Stopped, bye_at), &o, c.now(), &cfg()).unwrap();
        assert_eq!(d.state, MachineState::Unreachable);
        // A report after the goodbye wins over it.
        let later = c.after(1).now();
        let o2 = Observation {
            last_report: Some((later, &r)),
            ..o
        };
        let d = derive(cur(MachineState::Unreachable, bye_at), &o2, later, &cfg()).unwrap();
        assert_eq!(d.state, MachineState::Healthy);
    }

    #[test]
    fn admin_states_are_sticky() {
        let c = Case::new();
        let r = report(true);
        for s in [
            MachineState::Updating,
            MachineState::Retiring,
            MachineState::Retired,
        ] {
            assert_eq!(
                derive(
                    cur(s, c.start),
                    &c.obs(Some((c.now(), &r))),
                    c.now(),
                    &cfg()
                ),
                None
            );
        }
    }

    #[test]
    fn unknown_host_awaits_registration_then_uninitialized() {
        let c = Case::new();
        let r = report(false);
        let mut o = c.obs(Some((c.now(), &r)));
        o.registered = false;
        let d = derive(cur(MachineState::Healthy, c.start), &o, c.now(), &cfg()).unwrap();
        assert_eq!(d.state, MachineState::AwaitingRegistration);
        let d = derive(
            cur(MachineState::AwaitingRegistration, c.start),
            &c.obs(None),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Uninitialized);
    }

    #[test]
    fn after_restart_a_silent_machine_gets_the_grace_and_the_agents_reconnect_time() {
        let c = Case::new();
        // Healthy since long before this coordinator started.
        let long_ago = c.start - SignedDuration::from_hours(5);
        // Past the grace, but its agent may still be waiting out a reconnect backoff.
        c.after(70);
        assert_eq!(
            derive(
                cur(MachineState::Healthy, long_ago),
                &c.obs(None),
                c.now(),
                &cfg()
            ),
            None
        );
        c.after(6);
        let d = derive(
            cur(MachineState::Healthy, long_ago),
            &c.obs(None),
            c.now(),
            &cfg(),
        )
        .unwrap();
        assert_eq!(d.state, MachineState::Unreachable);
        assert!(
            d.reason.contains("since the coordinator started"),
            "{}",
            d.reason
        );
        assert!(
            d.reason.contains("60.0s for agents to reconnect"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn state_names_round_trip() {
        for s in MachineState::ALL {
            assert_eq!(s.as_str().parse::<MachineState>().unwrap(), s);
        }
        assert!("broken".parse::<MachineState>().is_err());
    }
}
