//! The fence flow as a pure state machine: a committed [`Flow`] and one [`Observation`] give
//! the next flow; the next action is a function of the flow alone ([`Flow::action`]), so a
//! runner resumed after a restart knows what to do from the committed row, and each state is
//! committed before its action runs.
//!
//! The happy path:
//!
//! ```text
//! Plan ─▶ PowerOff ─▶ ConfirmOff ─▶ Release ─▶ WaitReleased ─▶ PowerOn ─▶ WaitBack ─▶ Restore ─▶ Done
//! ```
//!
//! - `Plan` reads how the cluster releases (out-of-service taint, or Node deletion with the
//!   Node's labels and annotations saved) while the Node still exists.
//! - `PowerOff` sends a `fence` (power off, confirmed by the gateway). `ConfirmOff` reads the
//!   power state back: that read is the only source of the [`PowerOffProof`] that opens the
//!   release (see [`crate::fence::proof`]).
//! - `Release` / `WaitReleased` pass the release until no pod of the node is terminating and
//!   no VolumeAttachment names it.
//! - `PowerOn` powers the machine on; `WaitBack` waits for its agent to report healthy with a
//!   boot id other than the one it had before the fence; `Restore` removes the taint or puts
//!   the saved metadata back once the Node has registered again.
//!
//! Failures: before anything is released (`Plan`, `PowerOff`, `ConfirmOff`) the flow fails
//! at once with what the BMC or the API server said, leaving the machine as it is. After the
//! release started, a failure is recorded in [`Flow::failure`] and the flow goes on to
//! `PowerOn` → `WaitBack` → `Restore` and ends `Failed` there, so the machine is never left
//! off, unless [`Flow::keep_off`] asks for exactly that. A failure of the power-on itself
//! ends the flow failed with the machine off: nothing more can be done without a person.
//!
//! A machine dumping its kernel takes the kdump leg instead of the power-off ([`kdump`]).
//!
//! Power requests carry ids derived from the flow id and an attempt number that only grows
//! after a *failed answer* ([`power_request_id`]); a lost answer is asked again with the same
//! id and the gateway's durable record answers, so a completed power action is never
//! repeated. A "cycle" is never used: a cycle has no moment where the machine is known off.
//!
//! [`PowerOffProof`]: crate::fence::proof::PowerOffProof

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use protocol::gateway::{PowerAction, PowerState};

use crate::fence::kdump::DumpSeen;
use crate::k8s::release::Release;
use crate::repair::AgentHealth;

pub mod kdump;
mod state;

pub use kdump::KdumpLeg;
pub use state::State;

/// Per-BMC time limits of a fence flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceTimeouts {
    /// From entering `PowerOff` until the read-back says off.
    pub off: Duration,
    /// From entering `PowerOn` until the gateway says on (it retries a busy BMC inside).
    pub on: Duration,
    /// From the first release pass until the pods and VolumeAttachments are gone.
    pub release: Duration,
    /// From the power-on until the agent is back with a new boot id and the Node restored.
    pub back: Duration,
}

impl Default for FenceTimeouts {
    fn default() -> Self {
        Self {
            // IPMI and Redfish BMCs confirm a hard power-off within seconds; a minute covers
            // slow BMCs and the gateway's own command spacing.
            off: Duration::from_secs(60),
            // Some BMCs refuse power-on for up to a minute after an off (the gateway retries
            // that for 90 s); two minutes leave room for the answer.
            on: Duration::from_secs(120),
            // The pod GC and attach-detach controller act within seconds of the taint; ten
            // minutes is for a busy control plane, not the normal case.
            release: Duration::from_secs(600),
            // Server firmware (memory training, option ROMs) takes several minutes to boot.
            back: Duration::from_secs(900),
        }
    }
}

/// One fence flow as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// Row id (0 before the first commit).
    pub id: u64,
    /// Machine address (the BMC's machine, as the gateway knows it).
    pub address: String,
    /// Machine serial, passed to the gateway.
    pub serial: String,
    /// The machine's Kubernetes Node.
    pub node: String,
    /// Leave the machine off if the flow fails after the release.
    pub keep_off: bool,
    /// The agent's boot id when the flow started; the machine is back only with another one.
    pub boot_id_before: Option<String>,
    /// Where it stands.
    pub state: State,
    /// When the current state was entered.
    pub state_since: Timestamp,
    /// When the current timed phase (off, release, on, back) ends.
    pub deadline: Option<Timestamp>,
    /// Attempt number of the current power action; grows only after a failed answer.
    pub power_attempt: u32,
    /// How the workload is released, decided in `Plan`.
    pub how: Option<Release>,
    /// When power-off was confirmed by the read-back.
    pub confirmed_off: Option<Timestamp>,
    /// The power request whose read-back confirmed the power-off.
    pub confirm_request: Option<String>,
    /// When the power-on was answered.
    pub powered_on: Option<Timestamp>,
    /// A failure after the release started: the flow powers on and restores, then fails.
    pub failure: Option<String>,
    /// The dump the flow released on, when it took the kdump path.
    pub kdump: Option<KdumpLeg>,
}

impl Flow {
    /// A new flow, at `Plan`.
    pub fn new(
        address: impl Into<String>,
        serial: impl Into<String>,
        node: impl Into<String>,
        boot_id_before: Option<String>,
        keep_off: bool,
        now: Timestamp,
    ) -> Self {
        Self {
            id: 0,
            address: address.into(),
            serial: serial.into(),
            node: node.into(),
            keep_off,
            boot_id_before,
            state: State::Plan,
            state_since: now,
            deadline: None,
            power_attempt: 0,
            how: None,
            confirmed_off: None,
            confirm_request: None,
            powered_on: None,
            failure: None,
            kdump: None,
        }
    }

    /// True when the runner must read the kdump view before this state's power-off: a
    /// machine that is dumping is released on its dump instead (once per flow; after the
    /// dump the power-off goes ahead whatever the view says).
    pub fn checks_kdump_first(&self) -> bool {
        self.state == State::PowerOff && self.kdump.is_none()
    }

    /// The action the committed state asks for.
    pub fn action(&self, store_id: &str) -> Action {
        let req = |what: &str| power_request_id(store_id, self.id, what, self.power_attempt);
        match &self.state {
            State::Plan => Action::Plan,
            State::PowerOff => Action::Power {
                action: PowerAction::Fence,
                request_id: req("off"),
            },
            State::ConfirmOff => Action::ReadBack {
                request_id: req("confirm"),
            },
            State::Release | State::WaitReleased => Action::ReleasePass,
            State::KdumpRelease | State::KdumpWaitReleased => Action::ReleasePass,
            State::KdumpWait => Action::CheckKdump,
            State::PowerOn => Action::Power {
                action: PowerAction::On,
                request_id: req("on"),
            },
            State::WaitBack => Action::CheckAgent,
            State::Restore => Action::RestorePass,
            State::Done | State::Failed { .. } => Action::None,
        }
    }
}

/// The power request id of a flow's action: the repair queue's scheme
/// ([`crate::repair::entry::power_request_id`]: store identity, area, row, what, attempt), so
/// two databases never share an id and the gateway's durable record answers a resend.
pub fn power_request_id(store_id: &str, flow: u64, what: &str, attempt: u32) -> String {
    format!("{store_id}-fence-{flow}-{what}-attempt{attempt}")
}

/// What the runner must do for the committed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the release plan (and the Node's metadata if it will be deleted).
    Plan,
    /// Send a power request (`fence` or `on`) with this id.
    Power {
        /// The power action.
        action: PowerAction,
        /// Its id.
        request_id: String,
    },
    /// Read the power state; an "off" makes the proof.
    ReadBack {
        /// Its id.
        request_id: String,
    },
    /// One release pass (with a proof the runner holds or re-reads).
    ReleasePass,
    /// Read the agent's health.
    CheckAgent,
    /// One restore pass.
    RestorePass,
    /// Read the kdump view.
    CheckKdump,
    /// Nothing: the flow is over.
    None,
}

/// What the runner saw when it carried out the state's action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The release plan.
    Planned(Release),
    /// A power request (fence, on) or read-back was answered.
    Power(PowerAnswer),
    /// A release pass: done (`true`) or still waiting on pods / VolumeAttachments.
    Released {
        /// Nothing of the node is left.
        done: bool,
        /// What is still there, for the history.
        detail: String,
    },
    /// The agent's live health.
    Agent(Option<AgentHealth>),
    /// A restore pass: done, or the Node has not registered yet.
    Restored {
        /// The taint is gone / the metadata is back.
        done: bool,
    },
    /// A Kubernetes call failed.
    KubeFailed {
        /// What the API server said.
        detail: String,
        /// Trying again may help.
        retriable: bool,
    },
    /// Only time passed (a retry is due); used to check deadlines.
    Tick,
    /// What the kdump view says of the machine's dump.
    Kdump(DumpSeen),
}

/// A gateway's answer to a power request, as the flow needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerAnswer {
    /// The power-off is confirmed at this time (a fence answer, or a read-back saying off).
    ConfirmedOff(Timestamp),
    /// The action completed and the BMC reports this state.
    Done {
        /// Power state after the action.
        state: PowerState,
        /// The BMC's words.
        detail: String,
    },
    /// The gateway answered that the action failed.
    Failed {
        /// The BMC's words.
        detail: String,
        /// The gateway says a new attempt may succeed (busy BMC).
        retriable: bool,
    },
    /// No answer (gateway unreachable, answer lost): ask again with the same id.
    NoAnswer {
        /// What happened.
        detail: String,
    },
}

/// The outcome of one step: the flow to commit and a line for its history, if it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The next flow (equal to the input when nothing changed).
    pub flow: Flow,
    /// What happened, for the flow's history; `None` when nothing changed.
    pub event: Option<String>,
}

fn add(now: Timestamp, d: Duration) -> Timestamp {
    now.saturating_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(now)
}

/// The pure step: the committed `flow`, what its action produced, and `now` give the next
/// flow. Never does I/O; the caller commits the result before carrying out its action.
pub fn step(flow: &Flow, obs: Observation, now: Timestamp, t: &FenceTimeouts) -> Step {
    let mut f = flow.clone();
    let event = transition(&mut f, obs, now, t);
    if event.is_some() && f.state != flow.state {
        f.state_since = now;
    }
    Step { flow: f, event }
}

fn enter(f: &mut Flow, state: State) {
    f.state = state;
}

fn fail(f: &mut Flow, detail: String) -> Option<String> {
    let line = format!("failed in {}: {detail}", f.state.kind());
    enter(
        f,
        State::Failed {
            detail: line.clone(),
        },
    );
    f.deadline = None;
    Some(line)
}

/// A failure once the release started: record it and power on (unless `keep_off`).
fn fail_after_release(
    f: &mut Flow,
    now: Timestamp,
    t: &FenceTimeouts,
    detail: String,
) -> Option<String> {
    let line = format!("{} failed: {detail}", f.state.kind());
    f.failure = Some(line.clone());
    if f.keep_off {
        enter(
            f,
            State::Failed {
                detail: format!("{line}; machine left off (keep_off)"),
            },
        );
        f.deadline = None;
        return Some(format!("{line}; keep_off: the machine stays off"));
    }
    start_power_on(f, now, t);
    Some(format!("{line}; powering the machine on before giving up"))
}

fn start_power_on(f: &mut Flow, now: Timestamp, t: &FenceTimeouts) {
    enter(f, State::PowerOn);
    f.power_attempt = 0;
    f.deadline = Some(add(now, t.on));
}

fn past(f: &Flow, now: Timestamp) -> bool {
    f.deadline.is_some_and(|d| now >= d)
}

fn transition(f: &mut Flow, obs: Observation, now: Timestamp, t: &FenceTimeouts) -> Option<String> {
    let obs = match kdump::transition(f, obs, now, t) {
        Ok(event) => return event,
        Err(not_kdump) => not_kdump,
    };
    match (f.state.clone(), obs) {
        (State::Plan, Observation::Planned(how)) => {
            let line = match &how {
                Release::Taint => "release by out-of-service taint".to_string(),
                Release::DeleteNode(m) => format!(
                    "release by Node deletion; saved {} labels, {} annotations",
                    m.labels.len(),
                    m.annotations.len()
                ),
            };
            f.how = Some(how);
            enter(f, State::PowerOff);
            f.power_attempt = 0;
            f.deadline = Some(add(now, t.off));
            Some(line)
        }
        (State::Plan, Observation::KubeFailed { detail, retriable }) if !retriable => {
            fail(f, format!("cannot plan the release: {detail}"))
        }
        (State::Plan, Observation::KubeFailed { detail, .. })
            if now >= add(f.state_since, t.off) =>
        {
            fail(f, format!("cannot plan the release in time: {detail}"))
        }
        (State::PowerOff | State::ConfirmOff, Observation::Power(a)) => off_answer(f, a, now, t),
        // The runner re-read the power state to get a proof after a restart, and the machine
        // is no longer off (or the BMC cannot say): stop releasing.
        (
            State::Release | State::WaitReleased,
            Observation::Power(PowerAnswer::Done { state, detail }),
        ) => fail_after_release(
            f,
            now,
            t,
            format!("the machine is no longer off (power {state:?}: {detail})"),
        ),
        (
            State::Release | State::WaitReleased,
            Observation::Power(PowerAnswer::Failed {
                detail,
                retriable: false,
            }),
        ) => fail_after_release(f, now, t, format!("power-off not re-confirmed: {detail}")),
        (State::Release | State::WaitReleased, Observation::Released { done, detail }) => {
            if done {
                start_power_on_or_stop(f, now, t)
            } else if f.state == State::Release {
                enter(f, State::WaitReleased);
                Some(format!("release started; waiting: {detail}"))
            } else if past(f, now) {
                fail_after_release(f, now, t, format!("release not complete in time: {detail}"))
            } else {
                None
            }
        }
        (State::Release | State::WaitReleased, Observation::KubeFailed { detail, retriable })
            if !retriable =>
        {
            fail_after_release(f, now, t, detail)
        }
        (State::PowerOn, Observation::Power(a)) => on_answer(f, a, now, t),
        (State::WaitBack, Observation::Agent(h)) => {
            let back = h.as_ref().is_some_and(|h| {
                h.ok_since.is_some()
                    && Some(&h.boot_id) != f.boot_id_before.as_ref()
                    && f.powered_on.is_none_or(|on| h.last_report >= on)
            });
            if back {
                let boot = h.map(|h| h.boot_id).unwrap_or_default();
                enter(f, State::Restore);
                Some(format!("agent healthy with new boot id {boot}"))
            } else if past(f, now) {
                fail(
                    f,
                    "the machine did not come back healthy with a new boot id in time".into(),
                )
            } else {
                None
            }
        }
        (State::Restore, Observation::Restored { done }) => {
            if done {
                f.deadline = None;
                match f.failure.clone() {
                    None => {
                        enter(f, State::Done);
                        Some("node restored; fence complete".into())
                    }
                    Some(why) => {
                        enter(
                            f,
                            State::Failed {
                                detail: format!("{why}; machine powered on and node restored"),
                            },
                        );
                        Some("node restored after a failure".into())
                    }
                }
            } else if past(f, now) {
                fail(f, "the Node did not register again in time".into())
            } else {
                None
            }
        }
        (State::Restore, Observation::KubeFailed { detail, retriable }) if !retriable => {
            fail(f, format!("cannot restore the node: {detail}"))
        }
        // Retriable failures, ticks and anything unexpected: same state, unless its time is up.
        (state, _) if past(f, now) => deadline_passed(f, &state, now, t),
        _ => None,
    }
}

fn deadline_passed(
    f: &mut Flow,
    state: &State,
    now: Timestamp,
    t: &FenceTimeouts,
) -> Option<String> {
    match state {
        State::PowerOff | State::ConfirmOff => fail(
            f,
            format!(
                "power-off not confirmed within {} s; nothing released",
                t.off.as_secs()
            ),
        ),
        State::Release | State::WaitReleased => {
            fail_after_release(f, now, t, "release not complete in time".into())
        }
        State::PowerOn => fail(
            f,
            format!(
                "power-on not done within {} s; the machine is off",
                t.on.as_secs()
            ),
        ),
        State::WaitBack | State::Restore => fail(f, "the machine did not come back in time".into()),
        _ => None,
    }
}

fn start_power_on_or_stop(f: &mut Flow, now: Timestamp, t: &FenceTimeouts) -> Option<String> {
    if f.keep_off {
        enter(f, State::Done);
        f.deadline = None;
        return Some("workload released; keep_off: the machine stays off".into());
    }
    start_power_on(f, now, t);
    Some("workload released (no pod or VolumeAttachment left)".into())
}

fn off_answer(f: &mut Flow, a: PowerAnswer, now: Timestamp, t: &FenceTimeouts) -> Option<String> {
    let confirm = f.state == State::ConfirmOff;
    match a {
        PowerAnswer::ConfirmedOff(at) if confirm => {
            f.confirmed_off = Some(at);
            enter(f, State::Release);
            f.deadline = Some(add(now, t.release));
            Some(format!("power-off confirmed by read-back at {at:.0}"))
        }
        PowerAnswer::ConfirmedOff(at) => {
            enter(f, State::ConfirmOff);
            Some(format!(
                "gateway confirmed power-off at {at:.0}; reading back"
            ))
        }
        PowerAnswer::Done { state, detail } => fail(
            f,
            format!("BMC reports power {state:?} ({detail}); nothing released"),
        ),
        PowerAnswer::Failed { detail, retriable } if retriable && !past(f, now) => {
            f.power_attempt += 1;
            Some(format!("BMC busy ({detail}); attempt {}", f.power_attempt))
        }
        PowerAnswer::Failed {
            detail,
            retriable: true,
        } => fail(
            f,
            format!(
                "power-off not confirmed within {} s (last: {detail}); nothing released",
                t.off.as_secs()
            ),
        ),
        PowerAnswer::Failed { detail, .. } => fail(f, format!("BMC: {detail}; nothing released")),
        PowerAnswer::NoAnswer { detail } if past(f, now) => fail(
            f,
            format!("no answer from the gateway ({detail}); nothing released"),
        ),
        PowerAnswer::NoAnswer { .. } => None,
    }
}

fn on_answer(f: &mut Flow, a: PowerAnswer, now: Timestamp, t: &FenceTimeouts) -> Option<String> {
    match a {
        PowerAnswer::Done {
            state: PowerState::On,
            detail,
        } => {
            f.powered_on = Some(now);
            enter(f, State::WaitBack);
            f.deadline = Some(add(now, t.back));
            Some(format!("powered on ({detail})"))
        }
        PowerAnswer::Failed { detail, retriable } if retriable && !past(f, now) => {
            f.power_attempt += 1;
            Some(format!(
                "power-on refused ({detail}); attempt {}",
                f.power_attempt
            ))
        }
        PowerAnswer::Done { state, detail } => fail(
            f,
            format!("power-on answered power {state:?} ({detail}); the machine is off"),
        ),
        PowerAnswer::ConfirmedOff(_) => fail(f, "power-on answered off; the machine is off".into()),
        PowerAnswer::Failed {
            detail,
            retriable: true,
        } => fail(
            f,
            format!(
                "power-on not done within {} s (last: {detail}); the machine is off",
                t.on.as_secs()
            ),
        ),
        PowerAnswer::Failed { detail, .. } => {
            fail(f, format!("power-on failed: {detail}; the machine is off"))
        }
        PowerAnswer::NoAnswer { detail } if past(f, now) => fail(
            f,
            format!("no answer to the power-on ({detail}); the machine may be off"),
        ),
        PowerAnswer::NoAnswer { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::release::SavedNodeMetadata;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    /// Fixture builder: a flow in some state, an observation, a time; `.step()` runs it.
    struct Case {
        flow: Flow,
        now: Timestamp,
        t: FenceTimeouts,
    }

    fn case() -> Case {
        let mut flow = Flow::new("10.0.0.1", "SER1", "n1", Some("boot-a".into()), false, t0());
        flow.id = 7;
        Case {
            flow,
            now: t0(),
            t: FenceTimeouts::default(),
        }
    }

    impl Case {
        fn at(mut self, state: State) -> Self {
            self.flow.state = state.clone();
            self.flow.how = Some(Release::Taint);
            if state.released_or_after() {
                self.flow.confirmed_off = Some(t0());
            }
            self.flow.deadline = match state {
                State::PowerOff | State::ConfirmOff => Some(self.now + secs(60)),
                State::Release | State::WaitReleased => Some(self.now + secs(600)),
                State::PowerOn => Some(self.now + secs(120)),
                State::WaitBack | State::Restore => Some(self.now + secs(900)),
                _ => None,
            };
            self
        }
        fn keep_off(mut self) -> Self {
            self.flow.keep_off = true;
            self
        }
        fn failing(mut self, why: &str) -> Self {
            self.flow.failure = Some(why.into());
            self
        }
        fn powered_on_at(mut self, at: Timestamp) -> Self {
            self.flow.powered_on = Some(at);
            self
        }
        fn later(mut self, s: i64) -> Self {
            self.now += secs(s);
            self
        }
        fn step(&self, obs: Observation) -> Step {
            step(&self.flow, obs, self.now, &self.t)
        }
    }

    fn confirmed() -> Observation {
        Observation::Power(PowerAnswer::ConfirmedOff(t0()))
    }
    fn busy() -> Observation {
        Observation::Power(PowerAnswer::Failed {
            detail: "409 Conflict".into(),
            retriable: true,
        })
    }
    fn refused(detail: &str) -> Observation {
        Observation::Power(PowerAnswer::Failed {
            detail: detail.into(),
            retriable: false,
        })
    }
    fn lost() -> Observation {
        Observation::Power(PowerAnswer::NoAnswer {
            detail: "connection lost".into(),
        })
    }
    fn power(state: PowerState) -> Observation {
        Observation::Power(PowerAnswer::Done {
            state,
            detail: "bmc".into(),
        })
    }
    fn agent(boot: &str, ok: bool, at: Timestamp) -> Observation {
        Observation::Agent(Some(AgentHealth {
            boot_id: boot.into(),
            last_report: at,
            ok_since: ok.then_some(at),
        }))
    }
    fn released(done: bool) -> Observation {
        Observation::Released {
            done,
            detail: "1 pod terminating".into(),
        }
    }
    fn kube(retriable: bool) -> Observation {
        Observation::KubeFailed {
            detail: "forbidden".into(),
            retriable,
        }
    }
    fn failed_detail(s: &Step) -> String {
        match &s.flow.state {
            State::Failed { detail } => detail.clone(),
            other => panic!("expected failed, got {other:?}"),
        }
    }

    #[test]
    fn the_happy_path_visits_every_state_in_order() {
        let mut c = case();
        let saved = SavedNodeMetadata {
            name: "n1".into(),
            internal_ip: None,
            labels: [("a".to_string(), "b".to_string())].into(),
            annotations: Default::default(),
        };
        let script = [
            Observation::Planned(Release::DeleteNode(saved.clone())),
            confirmed(),
            confirmed(),
            released(false),
            released(true),
            power(PowerState::On),
            agent("boot-b", true, t0() + secs(10)),
            Observation::Restored { done: true },
        ];
        let mut seen = vec![c.flow.state.kind()];
        for obs in script {
            c = c.later(1);
            let s = c.step(obs);
            assert!(s.event.is_some(), "every observation here moves the flow");
            c.flow = s.flow;
            seen.push(c.flow.state.kind());
        }
        assert_eq!(
            seen,
            [
                "plan",
                "power-off",
                "confirm-off",
                "release",
                "wait-released",
                "power-on",
                "wait-back",
                "restore",
                "done"
            ]
        );
        assert_eq!(c.flow.how, Some(Release::DeleteNode(saved)));
        assert_eq!(c.flow.confirmed_off, Some(t0()));
        assert_eq!(c.flow.failure, None);
        assert_eq!(c.flow.action("s"), Action::None);
    }

    #[test]
    fn actions_follow_from_the_committed_state_and_power_ids_carry_the_attempt() {
        let c = case().at(State::PowerOff);
        assert_eq!(
            c.flow.action("aa11"),
            Action::Power {
                action: PowerAction::Fence,
                request_id: "aa11-fence-7-off-attempt0".into()
            }
        );
        let c = case().at(State::ConfirmOff);
        assert!(matches!(c.flow.action("s"), Action::ReadBack { .. }));
        let mut c = case().at(State::PowerOn);
        c.flow.power_attempt = 2;
        assert_eq!(
            c.flow.action("aa11"),
            Action::Power {
                action: PowerAction::On,
                request_id: "aa11-fence-7-on-attempt2".into()
            }
        );
        for (s, a) in [
            (State::Plan, Action::Plan),
            (State::Release, Action::ReleasePass),
            (State::WaitReleased, Action::ReleasePass),
            (State::WaitBack, Action::CheckAgent),
            (State::Restore, Action::RestorePass),
        ] {
            assert_eq!(case().at(s).flow.action("s"), a);
        }
        assert_ne!(
            power_request_id("aa11", 3, "off", 0),
            crate::repair::entry::power_request_id(
                "aa11",
                3,
                crate::repair::entry::RequestFor::Repair {
                    step: 0,
                    attempt: 0
                }
            ),
            "fence and repair ids never collide"
        );
    }

    #[test]
    fn no_action_ever_is_a_cycle() {
        for s in [
            State::Plan,
            State::PowerOff,
            State::ConfirmOff,
            State::Release,
            State::WaitReleased,
            State::PowerOn,
            State::WaitBack,
            State::Restore,
        ] {
            if let Action::Power { action, .. } = case().at(s).flow.action("s") {
                assert!(matches!(action, PowerAction::Fence | PowerAction::On));
            }
        }
    }

    #[test]
    fn a_refused_power_off_fails_with_the_bmc_words_and_releases_nothing() {
        let s = case()
            .at(State::PowerOff)
            .step(refused("ipmi: 0xD5 not supported"));
        let d = failed_detail(&s);
        assert!(
            d.contains("0xD5 not supported") && d.contains("nothing released"),
            "{d}"
        );
        assert_eq!(s.flow.confirmed_off, None);
    }

    #[test]
    fn a_power_off_answer_saying_on_fails_before_release() {
        let s = case().at(State::PowerOff).step(power(PowerState::On));
        assert!(failed_detail(&s).contains("On"));
    }

    #[test]
    fn a_busy_bmc_at_power_off_is_asked_again_with_a_new_attempt_until_the_deadline() {
        let s = case().at(State::PowerOff).step(busy());
        assert_eq!(s.flow.state, State::PowerOff);
        assert_eq!(s.flow.power_attempt, 1);
        let s = case().at(State::PowerOff).later(61).step(busy());
        assert!(failed_detail(&s).contains("409"));
    }

    #[test]
    fn a_lost_answer_keeps_the_same_request_id() {
        let c = case().at(State::PowerOff);
        let s = c.step(lost());
        assert_eq!(s.event, None);
        assert_eq!(s.flow, c.flow, "same state, same attempt, same id");
        let s = case().at(State::PowerOff).later(61).step(lost());
        assert!(failed_detail(&s).contains("nothing released"));
    }

    #[test]
    fn the_read_back_must_say_off_before_release() {
        let s = case().at(State::ConfirmOff).step(power(PowerState::On));
        assert!(failed_detail(&s).contains("nothing released"));
        let s = case().at(State::ConfirmOff).step(confirmed());
        assert_eq!(s.flow.state, State::Release);
        assert_eq!(s.flow.confirmed_off, Some(t0()));
        let s = case()
            .at(State::ConfirmOff)
            .later(60)
            .step(Observation::Tick);
        assert!(failed_detail(&s).contains("not confirmed within 60 s"));
    }

    #[test]
    fn plan_failures_fail_at_once_or_after_the_off_timeout() {
        let s = case().step(kube(false));
        assert!(failed_detail(&s).contains("forbidden"));
        let s = case().step(kube(true));
        assert_eq!(s.flow.state, State::Plan);
        let s = case().later(61).step(kube(true));
        assert!(failed_detail(&s).contains("in time"));
    }

    #[test]
    fn a_release_refused_powers_the_machine_on_before_giving_up() {
        let s = case().at(State::WaitReleased).step(kube(false));
        assert_eq!(s.flow.state, State::PowerOn);
        assert_eq!(s.flow.power_attempt, 0);
        assert!(s.flow.failure.as_deref().unwrap().contains("forbidden"));
        // … and the flow ends failed once the node is restored.
        let s = case()
            .at(State::Restore)
            .failing("release failed")
            .step(Observation::Restored { done: true });
        assert!(failed_detail(&s).contains("release failed"));
    }

    #[test]
    fn a_release_that_never_completes_times_out_into_power_on() {
        let c = case().at(State::WaitReleased);
        assert_eq!(c.step(released(false)).event, None);
        let s = case()
            .at(State::WaitReleased)
            .later(600)
            .step(released(false));
        assert_eq!(s.flow.state, State::PowerOn);
        assert!(s.flow.failure.unwrap().contains("not complete in time"));
        let s = case().at(State::Release).later(600).step(kube(true));
        assert_eq!(s.flow.state, State::PowerOn);
    }

    #[test]
    fn keep_off_leaves_the_machine_off_after_a_failed_or_finished_release() {
        let s = case().at(State::WaitReleased).keep_off().step(kube(false));
        assert!(failed_detail(&s).contains("keep_off"));
        let s = case()
            .at(State::WaitReleased)
            .keep_off()
            .step(released(true));
        assert_eq!(s.flow.state, State::Done);
    }

    #[test]
    fn a_machine_found_on_while_releasing_stops_the_release() {
        let s = case().at(State::WaitReleased).step(power(PowerState::On));
        assert_eq!(s.flow.state, State::PowerOn);
        assert!(s.flow.failure.unwrap().contains("no longer off"));
    }

    #[test]
    fn a_busy_power_on_is_retried_with_a_new_attempt_until_its_deadline() {
        let s = case().at(State::PowerOn).step(busy());
        assert_eq!(
            (s.flow.state.clone(), s.flow.power_attempt),
            (State::PowerOn, 1)
        );
        let s = case().at(State::PowerOn).later(120).step(busy());
        assert!(failed_detail(&s).contains("the machine is off"));
        let s = case().at(State::PowerOn).step(refused("no power"));
        assert!(failed_detail(&s).contains("no power"));
        let c = case().at(State::PowerOn);
        assert_eq!(c.step(lost()).flow, c.flow);
        let s = case().at(State::PowerOn).later(120).step(lost());
        assert!(failed_detail(&s).contains("may be off"));
    }

    #[test]
    fn power_on_answered_off_fails() {
        let s = case().at(State::PowerOn).step(power(PowerState::Off));
        assert!(failed_detail(&s).contains("Off"));
    }

    #[test]
    fn the_machine_is_back_only_with_a_new_boot_id_healthy_and_reported_after_power_on() {
        let on = t0() + secs(5);
        let c = case().at(State::WaitBack).powered_on_at(on);
        assert_eq!(
            c.step(agent("boot-a", true, on + secs(1))).event,
            None,
            "old boot id"
        );
        assert_eq!(
            c.step(agent("boot-b", false, on + secs(1))).event,
            None,
            "failing check"
        );
        assert_eq!(
            c.step(agent("boot-b", true, on - secs(1))).event,
            None,
            "report before power-on"
        );
        assert_eq!(c.step(Observation::Agent(None)).event, None);
        let s = c.step(agent("boot-b", true, on + secs(1)));
        assert_eq!(s.flow.state, State::Restore);
        let s = case()
            .at(State::WaitBack)
            .later(900)
            .step(Observation::Agent(None));
        assert!(failed_detail(&s).contains("new boot id"));
    }

    #[test]
    fn restore_waits_for_the_node_then_fails_after_the_back_timeout() {
        let c = case().at(State::Restore);
        assert_eq!(c.step(Observation::Restored { done: false }).event, None);
        let s = case()
            .at(State::Restore)
            .later(900)
            .step(Observation::Restored { done: false });
        assert!(failed_detail(&s).contains("register"));
        let s = case().at(State::Restore).step(kube(false));
        assert!(failed_detail(&s).contains("forbidden"));
    }

    #[test]
    fn terminal_states_do_not_move() {
        for s in [State::Done, State::Failed { detail: "x".into() }] {
            let c = case().at(s).later(100_000);
            assert_eq!(c.step(confirmed()).flow, c.flow);
            assert_eq!(c.step(Observation::Tick).event, None);
        }
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            State::Plan,
            State::PowerOff,
            State::ConfirmOff,
            State::Release,
            State::WaitReleased,
            State::PowerOn,
            State::WaitBack,
            State::Restore,
            State::Done,
            State::Failed { detail: "d".into() },
        ] {
            assert_eq!(State::parse(s.kind(), "d"), Some(s));
        }
        assert_eq!(State::parse("cycle", ""), None);
    }
}
