//! The kdump leg of the fence flow (pure, like the rest of [`super`]).
//!
//! A flow about to power a machine off (`PowerOff`, before its first power-off) whose
//! kdump view says "dumping" takes this leg instead: the machine runs only the dump kernel,
//! so the workload is released on a [`KdumpProof`] with no power action (`KdumpRelease`,
//! `KdumpWaitReleased`), and every power action waits until the dump is done or
//! `kdump_timeout` after its start has passed (`KdumpWait`). Then the usual power cycle
//! runs: `PowerOff` → `ConfirmOff` → `PowerOn` → `WaitBack` → `Restore`.
//!
//! ```text
//! PowerOff ─(dumping)─▶ KdumpRelease ─▶ KdumpWaitReleased ─▶ KdumpWait ─(done | timeout)─▶
//!     PowerOff ─▶ ConfirmOff ─▶ PowerOn ─▶ WaitBack ─▶ Restore ─▶ Done
//! ```
//!
//! Failures: a release refused or too slow records the failure and still waits for the
//! dump before the power cycle (power actions never interrupt a dump), so the machine is
//! cycled and restored before the flow ends failed (or, with `keep_off`, left as it is).
//! If the dump ends before the release completed, the kdump proof is gone: the flow fences
//! by power-off and the release goes on after the confirmed off, as on the plain path.
//! A failed power-off after the release powers the machine on before giving up.
//!
//! [`KdumpProof`]: crate::fence::proof::KdumpProof

use jiff::Timestamp;
use protocol::gateway::PowerState;

use super::{
    FenceTimeouts, Flow, Observation, PowerAnswer, State, add, enter, fail_after_release, past,
    start_power_on, start_power_on_or_stop,
};
use crate::fence::kdump::DumpSeen;

/// The dump a flow released on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdumpLeg {
    /// When the dump started ("dumping" received, coordinator clock): what the proof says.
    pub started: Timestamp,
    /// Until when power actions wait for "dump done": the start plus `kdump_timeout`.
    pub until: Timestamp,
    /// The release on the kdump proof completed.
    pub released: bool,
}

/// The kdump leg's part of [`super::transition`]: `Ok(event)` when the observation was
/// the leg's to handle, `Err(obs)` to hand it back to the plain flow.
pub(super) fn transition(
    f: &mut Flow,
    obs: Observation,
    now: Timestamp,
    t: &FenceTimeouts,
) -> Result<Option<String>, Observation> {
    match (f.state.clone(), f.kdump, obs) {
        (State::PowerOff, None, Observation::Kdump(DumpSeen::Dumping { started, timeout })) => {
            let until = add(started, timeout);
            f.kdump = Some(KdumpLeg {
                started,
                until,
                released: false,
            });
            enter(f, State::KdumpRelease);
            f.deadline = Some(add(now, t.release));
            Ok(Some(format!(
                "machine dumping its kernel since {started:.0}: releasing on the kdump proof, no \
                 power action until \"dump done\" (kdump_timeout ends {until:.0})"
            )))
        }
        (State::KdumpRelease | State::KdumpWaitReleased, Some(leg), obs) => {
            Ok(releasing(f, leg, obs, now, t))
        }
        (State::KdumpWait, Some(leg), obs) => Ok(waiting(f, leg, obs, now, t)),
        (State::PowerOff | State::ConfirmOff, Some(leg), obs) => Ok(match obs {
            Observation::Power(a) => cycle_off_answer(f, leg, a, now, t),
            // Released already: a power-off that never comes must not end "nothing released".
            _ if past(f, now) => fail_after_release(
                f,
                now,
                t,
                format!(
                    "power-off after the dump not confirmed within {} s",
                    t.off.as_secs()
                ),
            ),
            _ => None,
        }),
        (_, _, obs) => Err(obs),
    }
}

fn releasing(
    f: &mut Flow,
    leg: KdumpLeg,
    obs: Observation,
    now: Timestamp,
    t: &FenceTimeouts,
) -> Option<String> {
    match obs {
        Observation::Released { done: true, .. } => {
            f.kdump = Some(KdumpLeg {
                released: true,
                ..leg
            });
            enter(f, State::KdumpWait);
            f.deadline = Some(leg.until);
            Some(
                "workload released on the kdump proof (no pod or VolumeAttachment left); \
                 waiting for \"dump done\" before the power cycle"
                    .into(),
            )
        }
        Observation::Released { detail, .. } if f.state == State::KdumpRelease => {
            enter(f, State::KdumpWaitReleased);
            Some(format!("kdump release started; waiting: {detail}"))
        }
        Observation::Released { detail, .. } if past(f, now) => {
            release_failed(f, leg, format!("release not complete in time: {detail}"))
        }
        Observation::Kdump(DumpSeen::None | DumpSeen::Done { .. }) => {
            enter(f, State::PowerOff);
            f.deadline = Some(add(now, t.off));
            Some(
                "the dump ended before the release completed: fencing by power-off; the \
                 release goes on after the confirmed off"
                    .into(),
            )
        }
        Observation::KubeFailed {
            detail,
            retriable: false,
        } => release_failed(f, leg, detail),
        _ if past(f, now) => release_failed(f, leg, "release not complete in time".into()),
        _ => None,
    }
}

/// A kdump release failed: record it and wait for the dump before cycling and restoring
/// (power actions never interrupt a dump), unless `keep_off`.
fn release_failed(f: &mut Flow, leg: KdumpLeg, detail: String) -> Option<String> {
    let line = format!("{} failed: {detail}", f.state.kind());
    f.failure = Some(line.clone());
    if f.keep_off {
        enter(
            f,
            State::Failed {
                detail: format!("{line}; machine left as it is (keep_off)"),
            },
        );
        f.deadline = None;
        return Some(format!("{line}; keep_off: no power action"));
    }
    enter(f, State::KdumpWait);
    f.deadline = Some(leg.until);
    Some(format!(
        "{line}; the machine is power-cycled and restored after the dump before giving up"
    ))
}

fn waiting(
    f: &mut Flow,
    leg: KdumpLeg,
    obs: Observation,
    now: Timestamp,
    t: &FenceTimeouts,
) -> Option<String> {
    let why = match obs {
        Observation::Kdump(DumpSeen::Dumping { .. }) if now < leg.until => return None,
        Observation::Kdump(DumpSeen::Done { at }) => format!("dump done at {at:.0}"),
        Observation::Kdump(DumpSeen::None) => {
            "the dump is no longer reported (the machine reported since)".to_string()
        }
        _ if now >= leg.until => format!(
            "kdump_timeout passed without \"dump done\" (dump started {})",
            leg.started
        ),
        _ => return None,
    };
    // The attempt number is kept: the leg began before the power-off of this attempt was
    // sent, so its id is still fresh, and earlier ones were answered.
    enter(f, State::PowerOff);
    f.deadline = Some(add(now, t.off));
    Some(format!("{why}: power cycle (off, confirm, on)"))
}

fn cycle_off_answer(
    f: &mut Flow,
    leg: KdumpLeg,
    a: PowerAnswer,
    now: Timestamp,
    t: &FenceTimeouts,
) -> Option<String> {
    match a {
        PowerAnswer::ConfirmedOff(at) if f.state == State::ConfirmOff => {
            f.confirmed_off = Some(at);
            if f.failure.is_some() {
                start_power_on(f, now, t);
                Some(format!(
                    "power-off confirmed by read-back at {at:.0}; powering on before giving up"
                ))
            } else if leg.released {
                let next = start_power_on_or_stop(f, now, t).unwrap_or_default();
                Some(format!(
                    "power-off confirmed by read-back at {at:.0} after the dump; {next}"
                ))
            } else {
                enter(f, State::Release);
                f.deadline = Some(add(now, t.release));
                Some(format!(
                    "power-off confirmed by read-back at {at:.0}; the release goes on"
                ))
            }
        }
        PowerAnswer::ConfirmedOff(at) => {
            enter(f, State::ConfirmOff);
            Some(format!(
                "gateway confirmed power-off at {at:.0}; reading back"
            ))
        }
        PowerAnswer::Failed {
            detail,
            retriable: true,
        } if !past(f, now) => {
            f.power_attempt += 1;
            Some(format!("BMC busy ({detail}); attempt {}", f.power_attempt))
        }
        PowerAnswer::NoAnswer { .. } if !past(f, now) => None,
        PowerAnswer::Done {
            state: PowerState::Off,
            ..
        } if !past(f, now) => None,
        other => {
            let what = match other {
                PowerAnswer::Failed { detail, .. } | PowerAnswer::NoAnswer { detail } => detail,
                PowerAnswer::Done { state, detail } => format!("power {state:?} ({detail})"),
                PowerAnswer::ConfirmedOff(_) => unreachable!("handled above"),
            };
            fail_after_release(
                f,
                now,
                t,
                format!("power-off after the dump not confirmed: {what}"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jiff::SignedDuration;

    use super::*;
    use crate::fence::flow::{Action, Step, step};
    use crate::k8s::release::Release;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    /// Fixture builder: a flow at `PowerOff` (planned, taint), optionally already on its
    /// kdump leg; `.step(obs)` runs the pure step.
    struct Case {
        flow: Flow,
        now: Timestamp,
        t: FenceTimeouts,
    }

    fn case() -> Case {
        let mut flow = Flow::new("10.0.0.1", "SER1", "n1", Some("boot-a".into()), false, t0());
        flow.id = 7;
        flow.state = State::PowerOff;
        flow.how = Some(Release::Taint);
        flow.deadline = Some(t0() + secs(60));
        Case {
            flow,
            now: t0(),
            t: FenceTimeouts::default(),
        }
    }

    impl Case {
        /// On the leg of a dump started at t0 with a 600 s timeout, in `state`.
        fn on_leg(mut self, state: State, released: bool) -> Self {
            self.flow.kdump = Some(KdumpLeg {
                started: t0(),
                until: t0() + secs(600),
                released,
            });
            self.flow.deadline = Some(match state {
                State::KdumpWait => t0() + secs(600),
                State::PowerOff | State::ConfirmOff => t0() + secs(60),
                _ => t0() + secs(600),
            });
            self.flow.state = state;
            self
        }
        fn keep_off(mut self) -> Self {
            self.flow.keep_off = true;
            self
        }
        fn later(mut self, s: i64) -> Self {
            self.now += secs(s);
            self
        }
        fn step(&self, obs: Observation) -> Step {
            step(&self.flow, obs, self.now, &self.t)
        }
        /// Steps and keeps the result.
        fn go(mut self, obs: Observation) -> Self {
            self.now += secs(1);
            let s = self.step(obs);
            assert!(
                s.event.is_some(),
                "expected a move from {:?}",
                self.flow.state
            );
            self.flow = s.flow;
            self
        }
    }

    fn dumping() -> Observation {
        Observation::Kdump(DumpSeen::Dumping {
            started: t0(),
            timeout: Duration::from_secs(600),
        })
    }
    fn dump_done() -> Observation {
        Observation::Kdump(DumpSeen::Done {
            at: t0() + secs(30),
        })
    }
    fn released(done: bool) -> Observation {
        Observation::Released {
            done,
            detail: "1 pod terminating".into(),
        }
    }
    fn confirmed() -> Observation {
        Observation::Power(PowerAnswer::ConfirmedOff(t0() + secs(40)))
    }
    fn refused() -> Observation {
        Observation::Power(PowerAnswer::Failed {
            detail: "0xD5".into(),
            retriable: false,
        })
    }

    #[test]
    fn dumping_releases_with_no_power_action_and_dump_done_lets_the_power_cycle_proceed() {
        let c = case();
        assert!(c.flow.checks_kdump_first());
        let c = c.go(dumping());
        assert_eq!(c.flow.state, State::KdumpRelease);
        assert_eq!(c.flow.action("s"), Action::ReleasePass);
        assert!(!c.flow.checks_kdump_first(), "one leg per flow");
        let leg = c.flow.kdump.unwrap();
        assert_eq!((leg.started, leg.until), (t0(), t0() + secs(600)));
        let c = c.go(released(false)).go(released(true));
        assert_eq!(c.flow.state, State::KdumpWait);
        assert!(c.flow.kdump.unwrap().released);
        assert_eq!(c.flow.action("s"), Action::CheckKdump);
        assert_eq!(c.flow.confirmed_off, None, "released with no power-off");
        // Still dumping: nothing moves, no power action is asked for.
        assert_eq!(c.step(dumping()).event, None);
        let c = c.go(dump_done());
        assert_eq!(c.flow.state, State::PowerOff);
        assert!(matches!(c.flow.action("s"), Action::Power { .. }));
        let c = c.go(confirmed());
        assert_eq!(c.flow.state, State::ConfirmOff);
        let c = c.go(confirmed());
        assert_eq!(
            c.flow.state,
            State::PowerOn,
            "released already: straight to power-on"
        );
        assert_eq!(c.flow.confirmed_off, Some(t0() + secs(40)));
        assert_eq!(c.flow.failure, None);
    }

    #[test]
    fn kdump_timeout_lets_the_power_cycle_proceed_without_dump_done() {
        let c = case().on_leg(State::KdumpWait, true).later(599);
        assert_eq!(c.step(dumping()).event, None);
        let s = c.later(1).step(dumping());
        assert_eq!(s.flow.state, State::PowerOff);
        assert!(s.event.unwrap().contains("kdump_timeout passed"));
        // A tick past the timeout does the same; the dump vanishing (agent back) too.
        let s = case()
            .on_leg(State::KdumpWait, true)
            .later(600)
            .step(Observation::Tick);
        assert_eq!(s.flow.state, State::PowerOff);
        let s = case()
            .on_leg(State::KdumpWait, true)
            .step(Observation::Kdump(DumpSeen::None));
        assert_eq!(s.flow.state, State::PowerOff);
    }

    #[test]
    fn a_dump_that_ends_before_the_release_completes_falls_back_to_power_off_then_release() {
        let c = case()
            .on_leg(State::KdumpWaitReleased, false)
            .go(dump_done());
        assert_eq!(c.flow.state, State::PowerOff);
        let c = c.go(confirmed()).go(confirmed());
        assert_eq!(
            c.flow.state,
            State::Release,
            "the rest of the release, now on the off"
        );
        assert_eq!(c.flow.confirmed_off, Some(t0() + secs(40)));
    }

    #[test]
    fn a_refused_kdump_release_waits_for_the_dump_then_cycles_before_failing() {
        let c = case()
            .on_leg(State::KdumpWaitReleased, false)
            .go(Observation::KubeFailed {
                detail: "forbidden".into(),
                retriable: false,
            });
        assert_eq!(
            c.flow.state,
            State::KdumpWait,
            "no power action during the dump"
        );
        assert!(c.flow.failure.as_deref().unwrap().contains("forbidden"));
        let c = c.go(dump_done()).go(confirmed()).go(confirmed());
        assert_eq!(
            c.flow.state,
            State::PowerOn,
            "power on, then restore, then fail"
        );
        // keep_off: nothing at all is done to the machine.
        let s = case()
            .keep_off()
            .on_leg(State::KdumpWaitReleased, false)
            .step(Observation::KubeFailed {
                detail: "forbidden".into(),
                retriable: false,
            });
        assert!(matches!(s.flow.state, State::Failed { .. }), "{s:?}");
        // A release that never completes times out into the same wait.
        let s = case()
            .on_leg(State::KdumpWaitReleased, false)
            .later(600)
            .step(released(false));
        assert_eq!(s.flow.state, State::KdumpWait);
    }

    #[test]
    fn keep_off_ends_off_after_the_dump_and_its_power_off() {
        let c = case()
            .keep_off()
            .on_leg(State::ConfirmOff, true)
            .go(confirmed());
        assert_eq!(c.flow.state, State::Done);
        assert!(c.flow.confirmed_off.is_some());
    }

    #[test]
    fn a_failed_power_off_after_the_kdump_release_powers_on_instead_of_claiming_nothing_released() {
        let s = case().on_leg(State::PowerOff, true).step(refused());
        assert_eq!(s.flow.state, State::PowerOn, "{s:?}");
        assert!(s.flow.failure.unwrap().contains("0xD5"));
        let s = case()
            .on_leg(State::ConfirmOff, true)
            .later(60)
            .step(Observation::Tick);
        assert_eq!(s.flow.state, State::PowerOn, "{s:?}");
        // A busy BMC is asked again with a new attempt, as on the plain path.
        let s = case()
            .on_leg(State::PowerOff, true)
            .step(Observation::Power(PowerAnswer::Failed {
                detail: "409".into(),
                retriable: true,
            }));
        assert_eq!((s.flow.state, s.flow.power_attempt), (State::PowerOff, 1));
    }

    #[test]
    fn a_flow_already_past_its_leg_never_starts_another() {
        let c = case().on_leg(State::PowerOff, true);
        assert!(!c.flow.checks_kdump_first());
        assert_eq!(c.step(dumping()).event, None);
        // Without a dump the plain flow handles the power-off.
        let s = case().step(confirmed());
        assert_eq!(s.flow.state, State::ConfirmOff);
        assert_eq!(s.flow.kdump, None);
    }

    #[test]
    fn kdump_state_names_round_trip() {
        for s in [
            State::KdumpRelease,
            State::KdumpWaitReleased,
            State::KdumpWait,
        ] {
            assert_eq!(State::parse(s.kind(), ""), Some(s.clone()));
            assert!(s.released_or_after());
        }
    }
}
