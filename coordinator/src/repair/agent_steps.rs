//! The repair steps a machine's node-agent carries out: `@restart-unit NAME`, `@reboot` and
//! `@collect-diagnostics`, asked through [`crate::agent_link::AgentActions`].
//!
//! A machine whose agent is not connected fails the step at once, saying so, so that the
//! procedure's next step (a power cycle) runs without waiting out a timeout. Every request
//! carries the step attempt's id, the same after a coordinator restart, and the agent acts
//! at most once per id. `@reboot` is done when the agent reports from a new boot; its
//! goodbye (reason reboot) keeps the machine from being taken for crashed meanwhile.
//!
//! Like [`super::command`], this module decides nothing about the entry.

use std::time::Duration;

use protocol::actions::ActionStatus;

use super::config::AgentStep;
use super::decide::CommandEnd;
use super::run_context::{Outcome, RunContext};
use crate::agent_link::{ActionAnswer, AgentActionError};

/// Limit of an agent step whose `command_timeout_seconds` is 0 (no limit): a reboot of a
/// big server with slow firmware takes up to ~10 min; past 15 the next step should run.
pub const DEFAULT_AGENT_STEP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How long a power action or fence waits for diagnostics from the machine's agent before
/// it acts. Collecting takes a second or two; the fence must not wait on a sick agent, and
/// 10 s is small next to a BMC's power cycle.
pub const DIAGNOSTICS_BEFORE_POWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How often `@reboot` looks for the agent's return. Reports come every 5 s by default;
/// polling the in-memory view faster costs nothing and makes the step end promptly.
const REBOOT_POLL: Duration = Duration::from_millis(500);

/// How often `@reboot` asks again, under the same id, once the agent reports from the same
/// boot after accepting: the agent acts at most once per id and answers with the reboot
/// command's failure if it failed, so a refused or failed `systemctl reboot` ends the step
/// within seconds instead of after its whole limit (up to 15 min). Asking costs one stream.
const REBOOT_REASK: Duration = Duration::from_secs(5);

/// Pause before asking again after the connection broke mid-request.
const RESEND_PAUSE: Duration = Duration::from_secs(1);

/// How long a step waits for an agent this coordinator has not heard from at all since it
/// started (a step resumed after a coordinator restart, before the agents reconnected). An
/// agent notices a dead coordinator within its 10 s reply timeout and reconnects after a
/// backoff of seconds; a machine that did report and is not connected fails at once.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(30);

/// True while it is worth waiting for the agent of the entry to connect: nothing heard
/// from it since this coordinator started, and the grace since `started` not over.
fn worth_waiting(ctx: &RunContext, started: tokio::time::Instant) -> bool {
    ctx.agents.agent_health(&ctx.address).is_none() && started.elapsed() < RECONNECT_GRACE
}

fn end(ok: bool, summary: String, output: String, outcome: Outcome) -> (CommandEnd, Outcome) {
    (
        CommandEnd {
            ok,
            summary,
            output,
            unknown_since: None,
        },
        outcome,
    )
}

/// An agent's detail as a one-line summary and the lines after it (a failed command's
/// output), which the entry's history shows under the event instead of in its line.
fn split_detail(detail: &str) -> (&str, String) {
    match detail.split_once('\n') {
        Some((first, rest)) => (first.trim_end(), rest.to_string()),
        None => (detail, String::new()),
    }
}

fn failed(step: &AgentStep, status: ActionStatus) -> (CommandEnd, Outcome) {
    match status {
        ActionStatus::Failed { code, detail } => {
            let (first, output) = split_detail(&detail);
            end(
                false,
                format!("{step}: the agent answered {}: {first}", code.as_str()),
                output,
                Outcome::Failed,
            )
        }
        other => end(
            false,
            format!("{step}: unexpected answer from the agent: {other:?}"),
            String::new(),
            Outcome::Error,
        ),
    }
}

/// Runs an agent step for the entry in `ctx`.
pub async fn run(step: AgentStep, ctx: &RunContext) -> (CommandEnd, Outcome) {
    let limit = ctx.timeout.unwrap_or(DEFAULT_AGENT_STEP_TIMEOUT);
    let deadline = tokio::time::Instant::now() + limit;
    if step == AgentStep::Reboot {
        return reboot(ctx, deadline, limit).await;
    }
    let started = tokio::time::Instant::now();
    let mut id = ctx.request_id.clone();
    // When the connection broke mid-request: the agent was killed or restarted while it
    // acted, and is worth waiting for (a packaged agent is back within seconds) so that it
    // can say how the request ended instead of the step failing as unreachable.
    let mut lost_at: Option<tokio::time::Instant> = None;
    let answer = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match ctx
            .actions
            .act(&ctx.address, &id, step.action(), left)
            .await
        {
            Err(AgentActionError::NotConnected { .. })
                if (worth_waiting(ctx, started)
                    || lost_at.is_some_and(|t| t.elapsed() < RECONNECT_GRACE))
                    && !left.is_zero() =>
            {
                tokio::time::sleep(REBOOT_POLL.min(left)).await;
            }
            Err(e) if e.is_retriable() && !left.is_zero() => {
                tracing::warn!(machine = %ctx.address, id = %ctx.request_id, error = %e, "agent step: connection lost; asking again with the same id");
                lost_at = Some(tokio::time::Instant::now());
                tokio::time::sleep(RESEND_PAUSE.min(left)).await;
            }
            Ok(ActionAnswer {
                status: Some(s), ..
            }) if s.is_outcome_unknown()
                && matches!(step, AgentStep::RestartUnit(_))
                && id == ctx.request_id
                && !left.is_zero() =>
            {
                // The agent stopped while it ran the restart and does not run that id again.
                // A second restart leaves the unit as one does; giving up would leave it as
                // the crash left it. Once only: an agent that dies in every restart must not
                // be restarted in a loop.
                id = format!("{}-resend1", ctx.request_id);
                tracing::warn!(machine = %ctx.address, id = %ctx.request_id, resend = %id, "agent step: the agent stopped while it ran the restart; asking again under a new id");
            }
            other => break other,
        }
    };
    let resent = if id == ctx.request_id {
        String::new()
    } else {
        format!(" (sent again as {id}: the agent stopped while it ran the first, outcome unknown)")
    };
    let outcome = |e: &AgentActionError| match e {
        AgentActionError::Timeout { .. } | AgentActionError::StillRunning { .. } => {
            Outcome::Timeout
        }
        _ => Outcome::Error,
    };
    match answer {
        Err(e) => end(false, format!("{step}: {e}"), String::new(), outcome(&e)),
        Ok(a) => match a.status {
            Some(ActionStatus::Done { detail }) => {
                let (first, output) = split_detail(&detail);
                end(
                    true,
                    format!("{step}: {first}{resent}"),
                    output,
                    Outcome::Ok,
                )
            }
            Some(ActionStatus::Diagnostics(bundle)) => {
                let Some(shelf) = &ctx.diagnostics else {
                    return end(
                        false,
                        format!("{step}: nowhere to keep diagnostics"),
                        String::new(),
                        Outcome::Error,
                    );
                };
                match shelf.keep(&ctx.address, &ctx.request_id, &bundle).await {
                    Ok(id) => {
                        let cut: Vec<&str> = bundle
                            .parts
                            .iter()
                            .filter(|p| p.truncated)
                            .map(|p| p.name.as_str())
                            .collect();
                        end(
                            true,
                            format!(
                                "{step}: {} bytes in {} parts kept as diagnostics #{id}{}",
                                bundle.total_bytes(),
                                bundle.parts.len(),
                                if cut.is_empty() {
                                    String::new()
                                } else {
                                    format!(" (cut to fit: {})", cut.join(", "))
                                }
                            ),
                            String::new(),
                            Outcome::Ok,
                        )
                    }
                    Err(e) => end(
                        false,
                        format!("{step}: cannot store the diagnostics: {e}"),
                        String::new(),
                        Outcome::Error,
                    ),
                }
            }
            Some(other) => {
                let (mut e, outcome) = failed(&step, other);
                e.summary.push_str(&resent);
                (e, outcome)
            }
            None => end(
                false,
                format!("{step}: the agent accepted the request but gave no result"),
                String::new(),
                Outcome::Error,
            ),
        },
    }
}

/// Before a power action or fence: when the machine's agent is connected, keep its
/// diagnostics with the entry, bounded by [`DIAGNOSTICS_BEFORE_POWER_TIMEOUT`] (the step's
/// own limit if shorter). Never fails and never waits for an agent that is not connected;
/// returns a note for the step's summary.
pub async fn diagnostics_before_power(ctx: &RunContext) -> String {
    let Some(shelf) = &ctx.diagnostics else {
        return String::new();
    };
    let limit = ctx.timeout.map_or(DIAGNOSTICS_BEFORE_POWER_TIMEOUT, |t| {
        t.min(DIAGNOSTICS_BEFORE_POWER_TIMEOUT)
    });
    let id = format!("{}-diagnostics", ctx.request_id);
    let asked = ctx.actions.act(
        &ctx.address,
        &id,
        protocol::actions::AgentAction::CollectDiagnostics,
        limit,
    );
    match tokio::time::timeout(limit, asked).await {
        Ok(Ok(ActionAnswer {
            status: Some(ActionStatus::Diagnostics(bundle)),
            ..
        })) => match shelf.keep(&ctx.address, &id, &bundle).await {
            Ok(n) => format!(" (diagnostics #{n} kept first)"),
            Err(e) => {
                tracing::warn!(machine = %ctx.address, error = %e, "cannot keep diagnostics before the power action");
                String::new()
            }
        },
        Ok(Err(AgentActionError::NotConnected { .. })) => String::new(),
        other => {
            tracing::info!(machine = %ctx.address, answer = ?other.map(|r| r.map(|a| a.status.is_some())), "no diagnostics before the power action");
            String::new()
        }
    }
}

/// `@reboot`: ask once (again with the same id if the connection broke before an answer),
/// then wait for a report from a new boot.
async fn reboot(
    ctx: &RunContext,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> (CommandEnd, Outcome) {
    let step = AgentStep::Reboot;
    let before = if ctx.boot_id_before.is_empty() {
        ctx.agents
            .agent_health(&ctx.address)
            .map(|h| h.boot_id)
            .unwrap_or_default()
    } else {
        ctx.boot_id_before.clone()
    };
    let mut asked = false;
    let mut first = true;
    let started = tokio::time::Instant::now();
    let mut last_asked = started;
    loop {
        if let Some(h) = ctx.agents.agent_health(&ctx.address)
            && h.boot_id != before
            && h.last_report > ctx.step_began
        {
            return end(
                true,
                format!(
                    "@reboot: the agent is back from a new boot (boot id {} → {})",
                    before, h.boot_id
                ),
                String::new(),
                Outcome::Ok,
            );
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return end(
                false,
                format!(
                    "@reboot: no report from a new boot within {} s (boot id still {before}{})",
                    limit.as_secs(),
                    if asked {
                        ""
                    } else {
                        "; the request never reached the agent"
                    }
                ),
                String::new(),
                Outcome::Timeout,
            );
        }
        if !asked {
            match ctx
                .actions
                .act(&ctx.address, &ctx.request_id, step.action(), left)
                .await
            {
                Err(AgentActionError::NotConnected { .. })
                    if first && worth_waiting(ctx, started) =>
                {
                    tokio::time::sleep(REBOOT_POLL.min(left)).await;
                    continue;
                }
                Err(e @ AgentActionError::NotConnected { .. }) if first => {
                    return end(
                        false,
                        format!("@reboot: {e}"),
                        String::new(),
                        Outcome::Error,
                    );
                }
                Err(e) => {
                    tracing::info!(machine = %ctx.address, id = %ctx.request_id, error = %e, "@reboot: no answer yet; asking again with the same id when the agent is back");
                }
                Ok(a) => match a.status {
                    Some(s @ ActionStatus::Failed { .. }) => return failed(&step, s),
                    _ => {
                        tracing::info!(machine = %ctx.address, id = %ctx.request_id, boot_id = %before, "@reboot: accepted; waiting for the agent's return from a new boot");
                        asked = true;
                    }
                },
            }
            first = false;
            last_asked = tokio::time::Instant::now();
        } else if last_asked.elapsed() >= REBOOT_REASK
            && ctx.agents.agent_health(&ctx.address).is_some_and(|h| {
                // Still the same boot: the agent knows the id (its memory, or the reboot
                // record written before the command ran), so asking again cannot reboot twice.
                h.boot_id == before && h.last_report > ctx.step_began
            })
        {
            last_asked = tokio::time::Instant::now();
            if let Ok(ActionAnswer {
                status: Some(s @ ActionStatus::Failed { .. }),
                ..
            }) = ctx
                .actions
                .act(
                    &ctx.address,
                    &ctx.request_id,
                    step.action(),
                    left.min(REBOOT_REASK),
                )
                .await
            {
                return failed(&step, s);
            }
        }
        tokio::time::sleep(REBOOT_POLL.min(left)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::future::BoxFuture;
    use jiff::Timestamp;
    use protocol::actions::{ActionFailure, AgentAction};

    use super::*;
    use crate::agent_link::{ActionAnswer, AgentActions, NoAgentLinks};
    use crate::gateway::NoGateway;
    use crate::repair::command::{AgentHealth, AgentHealthView, NoAgents};

    /// Answers every request with one scripted status and records the requests.
    struct Scripted {
        status: ActionStatus,
        asked: Mutex<Vec<(String, AgentAction)>>,
    }

    impl AgentActions for Scripted {
        fn act(
            &self,
            _address: &str,
            id: &str,
            action: AgentAction,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>> {
            self.asked.lock().unwrap().push((id.to_string(), action));
            let status = Some(self.status.clone());
            Box::pin(async move {
                Ok(ActionAnswer {
                    accepted: true,
                    status,
                })
            })
        }
    }

    /// An agent that reported (so it is known to this coordinator).
    struct Reported;

    impl AgentHealthView for Reported {
        fn agent_health(&self, _address: &str) -> Option<AgentHealth> {
            Some(AgentHealth {
                boot_id: "b1".into(),
                last_report: Timestamp::from_second(1_800_000_000).unwrap(),
                ok_since: None,
            })
        }
    }

    fn ctx(actions: Arc<dyn AgentActions>, agents: Arc<dyn AgentHealthView>) -> RunContext {
        RunContext {
            address: "10.0.0.9".into(),
            serial: String::new(),
            request_id: "db-e1-r0-a0".into(),
            timeout: Some(Duration::from_secs(20)),
            step_began: Timestamp::from_second(1_800_000_000).unwrap(),
            boot_id_before: String::new(),
            power: Arc::new(NoGateway),
            agents,
            groups: None,
            actions,
            diagnostics: None,
            entry_index: 0,
            fence: None,
            keep_off: None,
            fence_timeouts: None,
            kdump: None,
        }
    }

    #[tokio::test]
    async fn an_unreachable_agent_fails_the_step_at_once_with_that_reason() {
        let started = std::time::Instant::now();
        for step in [
            AgentStep::RestartUnit("kubelet".into()),
            AgentStep::Reboot,
            AgentStep::CollectDiagnostics,
        ] {
            let (end, outcome) = run(
                step.clone(),
                &ctx(Arc::new(NoAgentLinks), Arc::new(Reported)),
            )
            .await;
            assert!(!end.ok, "{step}");
            assert!(end.summary.contains("not connected"), "{}", end.summary);
            assert_eq!(outcome, Outcome::Error);
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "did not fail at once"
        );
    }

    #[tokio::test]
    async fn an_agent_unheard_since_the_coordinator_started_gets_a_grace_to_reconnect() {
        let started = tokio::time::Instant::now();
        let mut c = ctx(Arc::new(NoAgentLinks), Arc::new(NoAgents));
        c.timeout = Some(Duration::from_secs(2));
        let (end, _) = run(AgentStep::RestartUnit("kubelet".into()), &c).await;
        assert!(!end.ok);
        let waited = started.elapsed();
        // Waited for the agent until the step's limit (under the grace), then failed.
        assert!(waited >= Duration::from_millis(1900), "{waited:?}");
        assert!(end.summary.contains("not connected"), "{}", end.summary);
    }

    #[tokio::test]
    async fn the_agents_answer_decides_the_step_and_the_request_carries_the_step_id() {
        let refused = Arc::new(Scripted {
            status: ActionStatus::Failed {
                code: ActionFailure::NotAllowed,
                detail: "restart-unit docker is not allowed".into(),
            },
            asked: Mutex::new(Vec::new()),
        });
        let (end, outcome) = run(
            AgentStep::RestartUnit("docker".into()),
            &ctx(refused.clone(), Arc::new(Reported)),
        )
        .await;
        assert!(!end.ok);
        assert!(end.summary.contains("not-allowed"), "{}", end.summary);
        assert_eq!(outcome, Outcome::Failed);
        assert_eq!(
            *refused.asked.lock().unwrap(),
            [(
                "db-e1-r0-a0".to_string(),
                AgentAction::RestartUnit {
                    unit: "docker".into()
                }
            )]
        );
        let done = Arc::new(Scripted {
            status: ActionStatus::Done {
                detail: "restart-unit kubelet: exit status: 0".into(),
            },
            asked: Mutex::new(Vec::new()),
        });
        let (end, outcome) = run(
            AgentStep::RestartUnit("kubelet".into()),
            &ctx(done, Arc::new(Reported)),
        )
        .await;
        assert!(end.ok, "{}", end.summary);
        assert_eq!(outcome, Outcome::Ok);
    }

    #[tokio::test]
    async fn diagnostics_before_power_are_kept_when_the_agent_is_there_and_skipped_at_once_when_not()
     {
        use protocol::actions::{DiagnosticsBundle, DiagnosticsPart};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("db")).unwrap();
        let shelf = crate::repair::diagnostics::DiagnosticsShelf::new(
            store.clone(),
            Arc::new(crate::clock::SystemClock),
            3,
        );
        let agent = Arc::new(Scripted {
            status: ActionStatus::Diagnostics(DiagnosticsBundle {
                parts: vec![DiagnosticsPart {
                    name: "kernel log".into(),
                    content: "oops".into(),
                    truncated: false,
                }],
                limit_bytes: 1024,
            }),
            asked: Mutex::new(Vec::new()),
        });
        let mut c = ctx(agent.clone(), Arc::new(Reported));
        c.diagnostics = Some(shelf.clone());
        let note = diagnostics_before_power(&c).await;
        assert!(note.contains("kept first"), "{note}");
        assert_eq!(agent.asked.lock().unwrap()[0].0, "db-e1-r0-a0-diagnostics");
        let kept = store
            .with(|conn| crate::repair::store::sqlite::diagnostics::for_entry(conn, 3))
            .unwrap();
        assert_eq!(kept.len(), 1);

        let mut c = ctx(Arc::new(NoAgentLinks), Arc::new(NoAgents));
        c.diagnostics = Some(shelf);
        let started = std::time::Instant::now();
        assert_eq!(diagnostics_before_power(&c).await, "");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited for a missing agent"
        );
    }

    #[tokio::test]
    async fn a_failed_commands_output_goes_under_the_event_not_into_its_line() {
        let refused = Arc::new(Scripted {
            status: ActionStatus::Failed {
                code: ActionFailure::CommandFailed,
                detail: "restart-unit kubelet: `restart kubelet` exit status: 1\n1\n2\n3\n--- stderr ---\nJob failed".into(),
            },
            asked: Mutex::new(Vec::new()),
        });
        let (end, _) = run(
            AgentStep::RestartUnit("kubelet".into()),
            &ctx(refused, Arc::new(Reported)),
        )
        .await;
        assert!(!end.ok);
        assert_eq!(
            end.summary,
            "@restart-unit kubelet: the agent answered command-failed: restart-unit kubelet: `restart kubelet` exit status: 1"
        );
        assert_eq!(end.output, "1\n2\n3\n--- stderr ---\nJob failed");
    }

    /// Answers each request with the next scripted status (the last one again when done),
    /// and records the ids asked.
    #[derive(Default)]
    struct Sequence(Mutex<Vec<Option<ActionStatus>>>, Mutex<Vec<String>>);

    impl AgentActions for Sequence {
        fn act(
            &self,
            _address: &str,
            id: &str,
            _action: AgentAction,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>> {
            self.1.lock().unwrap().push(id.to_string());
            let mut next = self.0.lock().unwrap();
            let status = if next.len() > 1 {
                next.remove(0)
            } else {
                next[0].clone()
            };
            Box::pin(async move {
                Ok(ActionAnswer {
                    accepted: true,
                    status,
                })
            })
        }
    }

    /// An agent reporting from boot `b1` after the step began.
    struct SameBoot;

    impl AgentHealthView for SameBoot {
        fn agent_health(&self, _address: &str) -> Option<AgentHealth> {
            Some(AgentHealth {
                boot_id: "b1".into(),
                last_report: Timestamp::from_second(1_800_000_010).unwrap(),
                ok_since: None,
            })
        }
    }

    #[tokio::test]
    async fn a_reboot_command_that_failed_after_the_accept_ends_the_step_with_its_failure() {
        let agent = Arc::new(Sequence(
            Mutex::new(vec![
            None,
            Some(ActionStatus::Failed {
                code: ActionFailure::CommandFailed,
                detail:
                    "this reboot request failed earlier: reboot: `systemctl reboot` exit status: 1"
                        .into(),
            }),
        ]),
            Mutex::default(),
        ));
        let mut c = ctx(agent, Arc::new(SameBoot));
        c.timeout = Some(Duration::from_secs(600));
        let started = tokio::time::Instant::now();
        let (end, outcome) =
            tokio::time::timeout(Duration::from_secs(20), run(AgentStep::Reboot, &c))
                .await
                .expect("the step waited for a new boot after the reboot command failed");
        assert!(!end.ok);
        assert_eq!(outcome, Outcome::Failed);
        assert!(
            end.summary
                .contains("failed earlier: reboot: `systemctl reboot` exit status: 1"),
            "{}",
            end.summary
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited {:?} for a new boot",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_restart_the_agent_was_killed_in_is_asked_again_once_under_a_new_id() {
        let unknown = Some(ActionStatus::Failed {
            code: ActionFailure::Error,
            detail: format!(
                "{}restart-unit kubelet: the agent stopped",
                protocol::actions::OUTCOME_UNKNOWN
            ),
        });
        let done = Some(ActionStatus::Done {
            detail: "restart-unit kubelet: exit status: 0".into(),
        });
        let agent = Arc::new(Sequence(
            Mutex::new(vec![unknown.clone(), done]),
            Mutex::default(),
        ));
        let c = ctx(agent.clone(), Arc::new(Reported));
        let (end, outcome) = run(AgentStep::RestartUnit("kubelet".into()), &c).await;
        assert_eq!(outcome, Outcome::Ok, "{}", end.summary);
        assert!(
            end.summary.contains("sent again as db-e1-r0-a0-resend1"),
            "{}",
            end.summary
        );
        assert_eq!(
            *agent.1.lock().unwrap(),
            ["db-e1-r0-a0", "db-e1-r0-a0-resend1"]
        );
        // Unknown again: the step fails with the agent's words, after one resend only.
        let agent = Arc::new(Sequence(Mutex::new(vec![unknown]), Mutex::default()));
        let c = ctx(agent.clone(), Arc::new(Reported));
        let (end, outcome) = run(AgentStep::RestartUnit("kubelet".into()), &c).await;
        assert_eq!(outcome, Outcome::Failed);
        assert!(end.summary.contains("outcome unknown"), "{}", end.summary);
        assert_eq!(agent.1.lock().unwrap().len(), 2);
    }

    /// Plays scripted results, one per request.
    struct Script(Mutex<Vec<Result<ActionAnswer, AgentActionError>>>);

    impl AgentActions for Script {
        fn act(
            &self,
            _address: &str,
            _id: &str,
            _action: AgentAction,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>> {
            let next = self.0.lock().unwrap().remove(0);
            Box::pin(async move { next })
        }
    }

    #[tokio::test]
    async fn an_agent_lost_mid_request_is_waited_for_to_say_how_it_ended() {
        let gone = || AgentActionError::NotConnected {
            address: "10.0.0.9".into(),
        };
        let agent = Arc::new(Script(Mutex::new(vec![
            Err(AgentActionError::Lost {
                address: "10.0.0.9".into(),
                action: "restart-unit kubelet".into(),
                detail: "connection closed".into(),
            }),
            Err(gone()),
            Err(gone()),
            Ok(ActionAnswer {
                accepted: true,
                status: Some(ActionStatus::Done {
                    detail: "restart-unit kubelet: exit status: 0".into(),
                }),
            }),
        ])));
        let (end, outcome) = run(
            AgentStep::RestartUnit("kubelet".into()),
            &ctx(agent, Arc::new(Reported)),
        )
        .await;
        assert_eq!(outcome, Outcome::Ok, "{}", end.summary);
    }
}
