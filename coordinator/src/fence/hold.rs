//! What a fence flow says while it waits without moving: the lines the runner adds to a
//! flow's history (`coordinatorctl fence show`) so that a flow sitting in one state says why.
//!
//! Pure: given the committed flow and what a pass saw, the line to say, with a kind so that
//! the runner says each kind once per state rather than once per pass. It decides nothing
//! about the flow itself (see [`super::flow::step`]), and only covers holds that are not
//! already history events (a busy BMC's new attempt, a release that started waiting).

use super::flow::{Action, Flow, Observation, PowerAnswer, State};

/// The kind of a hold, said once per state by the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A flow found unfinished by a coordinator that (re)started, about to repeat its power
    /// request.
    Resumed,
    /// The gateway did not answer (unreachable, answer lost).
    NoAnswer,
    /// The API server did not answer.
    Kube,
}

fn until(f: &Flow) -> String {
    f.deadline
        .map(|d| format!(" until {d:.0}"))
        .unwrap_or_default()
}

/// The line for a flow that this coordinator process had not driven before (left unfinished
/// by a coordinator that stopped), when its state repeats a power request: the request may
/// already be running at the gateway, and the repeat waits for its outcome.
pub fn resumed(f: &Flow, action: &Action) -> Option<String> {
    let Action::Power { request_id, .. } = action else {
        return None;
    };
    let what = match f.state {
        State::PowerOff => "power-off",
        State::PowerOn => "power-on",
        _ => return None,
    };
    Some(format!(
        "resumed after a coordinator restart: asking the gateway again for {what} request \
         {request_id}; the gateway acts on an id once, so a request that reached it before \
         the restart is not repeated and its outcome is awaited{}",
        until(f)
    ))
}

/// The line for a pass that changed nothing because a peer did not answer; `None` for
/// passes that are waiting as expected.
pub fn holding(f: &Flow, obs: &Observation) -> Option<(Hold, String)> {
    match (&f.state, obs) {
        (
            State::PowerOff | State::PowerOn,
            Observation::Power(PowerAnswer::NoAnswer { detail }),
        ) => Some((
            Hold::NoAnswer,
            format!(
                "no answer from the gateway ({detail}); asking again with the same request \
                     id{}",
                until(f)
            ),
        )),
        (State::ConfirmOff, Observation::Power(PowerAnswer::NoAnswer { detail })) => Some((
            Hold::NoAnswer,
            format!(
                "no answer to the power read-back ({detail}); nothing is released until it \
                 reads off; reading again{}",
                until(f)
            ),
        )),
        (
            State::Release | State::WaitReleased,
            Observation::Power(PowerAnswer::NoAnswer { detail }),
        ) => Some((
            Hold::NoAnswer,
            format!(
                "cannot read the power state again before releasing ({detail}); nothing is \
                 released until it reads off; reading again{}",
                until(f)
            ),
        )),
        (
            _,
            Observation::KubeFailed {
                detail,
                retriable: true,
            },
        ) => Some((
            Hold::Kube,
            format!(
                "the API server did not answer ({detail}); asking again{}",
                until(f)
            ),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use protocol::gateway::PowerAction;

    fn flow(state: State) -> Flow {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut f = Flow::new("10.0.0.1", "S", "n1", None, false, now);
        f.state = state;
        f.deadline = Some(now + jiff::SignedDuration::from_secs(60));
        f
    }

    fn no_answer() -> Observation {
        Observation::Power(PowerAnswer::NoAnswer {
            detail: "gateway g unreachable".into(),
        })
    }

    #[test]
    fn a_resumed_power_state_names_its_request_and_limit() {
        let f = flow(State::PowerOff);
        let line = resumed(&f, &f.action("aa")).unwrap();
        assert!(line.contains("aa-fence-0-off-attempt0"), "{line}");
        assert!(line.contains("until 2027-01-15T08:01:00Z"), "{line}");
        let f = flow(State::WaitBack);
        assert_eq!(resumed(&f, &f.action("aa")), None);
        let on = Action::Power {
            action: PowerAction::On,
            request_id: "x".into(),
        };
        assert!(
            resumed(&flow(State::PowerOn), &on)
                .unwrap()
                .contains("power-on request x")
        );
    }

    #[test]
    fn only_peers_that_do_not_answer_are_holds() {
        let (kind, line) = holding(&flow(State::PowerOff), &no_answer()).unwrap();
        assert_eq!(kind, Hold::NoAnswer);
        assert!(line.contains("gateway g unreachable") && line.contains("same request id"));
        let (_, line) = holding(&flow(State::WaitReleased), &no_answer()).unwrap();
        assert!(line.contains("nothing is released"), "{line}");
        let busy = Observation::KubeFailed {
            detail: "503".into(),
            retriable: true,
        };
        assert_eq!(holding(&flow(State::Plan), &busy).unwrap().0, Hold::Kube);
        let waiting = Observation::Released {
            done: false,
            detail: "1 pod terminating".into(),
        };
        assert_eq!(holding(&flow(State::WaitReleased), &waiting), None);
        assert_eq!(holding(&flow(State::WaitBack), &Observation::Tick), None);
    }
}
