//! `restart-unit`: at most once per request id, also across agent restarts, and one run
//! per unit at a time.
//!
//! The request is written to the restart record ([`super::ledger`]) as running before the
//! command starts, and with its outcome after. When the state directory cannot be written
//! the restart still runs, remembered in memory only (said in the log): refusing restarts
//! would take the gentlest repair step away for a bookkeeping problem, and a restart run
//! twice leaves the unit as one run does.
//!
//! A request for a unit whose restart is already running (the coordinator gave up on the
//! first, and its retry came under a new attempt id) does not start a second command: it
//! waits for the running one and is answered with its outcome, said so in the answer. This
//! module does not decide whether a restart is wise; the coordinator's repair steps do.

use protocol::actions::{ActionFailure, ActionStatus};
use quinn::SendStream;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{ActionServer, COMMAND_OUTPUT_KEPT, answer, command_status, exec};

/// The restart of a unit running now: its request id and its answer to come.
#[derive(Debug, Clone)]
pub(super) struct Running {
    id: String,
    answer: watch::Receiver<Option<ActionStatus>>,
}

/// Takes the unit's entry out of the running restarts when the run ends (or is dropped).
struct RunningGuard<'a> {
    server: &'a ActionServer,
    unit: &'a str,
    id: &'a str,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        let mut running = self.server.running.lock().expect("running lock");
        if running.get(self.unit).is_some_and(|r| r.id == self.id) {
            running.remove(self.unit);
        }
    }
}

/// `status` with a note at the end of its first line that request `first`'s run answered it.
fn shared(status: ActionStatus, first: &str) -> ActionStatus {
    let note = |detail: String| {
        let (head, rest) = match detail.split_once('\n') {
            Some((h, r)) => (h.to_string(), format!("\n{r}")),
            None => (detail, String::new()),
        };
        format!(
            "{head} (one run shared with request {first}, which was restarting the unit when this request came){rest}"
        )
    };
    match status {
        ActionStatus::Done { detail } => ActionStatus::Done {
            detail: note(detail),
        },
        ActionStatus::Failed { code, detail } => ActionStatus::Failed {
            code,
            detail: note(detail),
        },
        other => other,
    }
}

impl ActionServer {
    /// Restarts `unit` for the new request `id` (the ledger has just marked it in progress),
    /// or shares the restart of `unit` running now.
    pub(super) async fn restart(&self, id: &str, unit: &str, send: &mut SendStream) {
        let cfg = self.config();
        let mut argv = cfg.restart_command.clone();
        argv.push(unit.to_string());
        let mine = self.ledger.lock().expect("ledger lock").watch(id);
        let joined = {
            let mut running = self.running.lock().expect("running lock");
            match (running.get(unit), mine) {
                (Some(r), _) => Some(r.clone()),
                (None, Some(answer)) => {
                    let r = Running {
                        id: id.to_string(),
                        answer,
                    };
                    running.insert(unit.to_string(), r);
                    None
                }
                (None, None) => None,
            }
        };
        let guard = joined.is_none().then_some(RunningGuard {
            server: self,
            unit,
            id,
        });
        let what = match &joined {
            Some(r) => format!("restart-unit {unit}, sharing the run of request {}", r.id),
            None => {
                let boot = crate::node::boot_id(&self.root).unwrap_or_default();
                format!(
                    "restart-unit {unit} with `{}` during boot {boot}",
                    argv.join(" ")
                )
            }
        };
        if let Err(e) = self
            .ledger
            .lock()
            .expect("ledger lock")
            .record_restart_running(id, &what)
        {
            warn!(id, %unit, error = %e, "cannot write the restart record: restarting anyway, this id remembered in memory only (a resend after an agent crash could restart again)");
        }
        answer(send, id, ActionStatus::Accepted).await;
        let status = match joined {
            Some(Running { id: first, answer }) => {
                info!(id, %unit, first = %first, "a restart of this unit is running; sharing its outcome instead of restarting again");
                self.shared_outcome(unit, &first, answer).await
            }
            None => {
                info!(id, %unit, command = %argv.join(" "), "restarting unit as the coordinator asked");
                let ran = exec::run(&argv, cfg.command_timeout, COMMAND_OUTPUT_KEPT).await;
                command_status(
                    &format!("restart-unit {unit}"),
                    &argv,
                    cfg.command_timeout,
                    ran,
                )
            }
        };
        // The run is over: a request from now on starts a run of its own; the ones that
        // joined this run hold its answer's receiver and get it below.
        drop(guard);
        match &status {
            ActionStatus::Failed { detail, .. } => {
                warn!(id, %unit, %detail, "unit restart failed")
            }
            _ => info!(id, %unit, "unit restarted"),
        }
        {
            let mut ledger = self.ledger.lock().expect("ledger lock");
            if let Err(e) = ledger.record_restart_outcome(id, &status) {
                warn!(id, %unit, error = %e, "cannot write the restart's outcome to the restart record");
            }
            ledger.finish(id, status.clone());
        }
        answer(send, id, status).await;
    }

    /// Waits for the outcome of request `first`'s restart of `unit`.
    async fn shared_outcome(
        &self,
        unit: &str,
        first: &str,
        mut answer: watch::Receiver<Option<ActionStatus>>,
    ) -> ActionStatus {
        match answer.wait_for(Option::is_some).await {
            Ok(s) => shared(s.clone().expect("waited for Some"), first),
            Err(_) => ActionStatus::Failed {
                code: ActionFailure::Error,
                detail: format!(
                    "restart-unit {unit}: the outcome of request {first}'s run, which this request shared, was lost"
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_answer_says_so_on_its_first_line() {
        let s = shared(
            ActionStatus::Failed {
                code: ActionFailure::CommandFailed,
                detail: "restart-unit kubelet: `x` exit status: 1\nout".into(),
            },
            "r1",
        );
        let ActionStatus::Failed { detail, .. } = s else {
            panic!("{s:?}")
        };
        let (head, rest) = detail.split_once('\n').unwrap();
        assert!(head.ends_with("(one run shared with request r1, which was restarting the unit when this request came)"), "{head}");
        assert_eq!(rest, "out");
    }
}
