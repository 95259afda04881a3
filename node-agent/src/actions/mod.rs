//! Actions the coordinator may ask this agent for, over the connection the agent opened:
//! restart an allowed unit, reboot cleanly, collect diagnostics (see
//! [`protocol::actions`] for the exchange).
//!
//! The agent listens on no port: the coordinator opens a stream on the agent's own
//! mutual-TLS connection, so only the coordinator this agent authenticated can ask. Each
//! action is refused unless `[actions]` enables it ([`config`]); a request id seen before
//! is answered from the [`ledger`] instead of acted on again, also after the agent itself
//! restarted (reboot and restart ids are recorded in `state_dir` before their command runs).
//! A unit has one restart running at a time (`restart.rs`). A reboot is handed to the
//! reporting loop, which says goodbye with reason reboot before running the reboot command.
//!
//! Every request of a coordinator of this release carries its fencing token
//! ([`protocol::fencing`]): one whose epoch is older than one seen for its store is refused
//! before anything else ([`epochs`]), with the words the gateways use, and the refusal is the
//! answer. A coordinator of an older release (a protocol version 1 connection) sends none.
//!
//! This module does not decide when an action is wise; the coordinator's repair steps do.

pub mod allowed;
pub mod config;
pub mod diagnostics;
pub mod epochs;
pub mod exec;
pub mod ledger;
mod restart;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::actions::{
    ActionFailure, ActionReply, ActionRequest, ActionStatus, AgentAction, FencedActionRequest,
    MAX_ACTION_FRAME_LEN, MAX_REQUEST_ID_LEN,
};
use protocol::fencing::{FENCING_VERSION, FencingToken};
use protocol::frame::MAX_FRAME_LEN;
use protocol::messages::CheckResult;
use protocol::transport::{read_msg, write_msg};
use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::mpsc;
use tracing::{Instrument, info, warn};

use self::config::ActionsConfig;
use self::epochs::EpochRecord;
use self::exec::Ran;
use self::ledger::{Begin, Ledger};

/// How long the coordinator has to send its request after opening a stream: it writes it
/// at once, so only a broken peer takes longer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to let an answer drain to the coordinator before the stream is dropped.
const ANSWER_LINGER: Duration = Duration::from_secs(2);

/// Output kept of a restart or reboot command for the answer's detail.
const COMMAND_OUTPUT_KEPT: usize = 2048;

/// A reboot the reporting loop must carry out: goodbye first, then the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootOrder {
    /// The request id, to record the outcome under.
    pub id: String,
}

/// Serves action requests for every connection of this agent.
#[derive(Debug)]
pub struct ActionServer {
    cfg: Mutex<ActionsConfig>,
    root: PathBuf,
    ledger: Mutex<Ledger>,
    /// The highest fencing epoch seen per coordinator store.
    epochs: Mutex<EpochRecord>,
    /// Failing and warning checks of the last round, for diagnostics.
    checks: Mutex<Vec<CheckResult>>,
    reboots: mpsc::UnboundedSender<RebootOrder>,
    /// Restarts running now, by unit: the request id running the command and its answer
    /// to come. A second request for the unit shares that run ([`restart`]).
    running: Mutex<HashMap<String, restart::Running>>,
}

/// How a restart or reboot command's run under `timeout` reads as an answer. The detail's
/// first line says what happened; a failed command's output follows on the next lines
/// (stdout, then stderr after a marker), so the coordinator can keep it apart from the
/// one-line summary.
pub fn command_status(what: &str, argv: &[String], timeout: Duration, ran: Ran) -> ActionStatus {
    let cmd = argv.join(" ");
    match ran {
        Ran::Exited {
            success: true,
            status,
            ..
        } => ActionStatus::Done {
            detail: format!("{what}: `{cmd}` {status}"),
        },
        Ran::Exited {
            status,
            stdout,
            stderr,
            truncated,
            ..
        } => {
            let mut detail = format!("{what}: `{cmd}` {status}");
            if !stdout.trim().is_empty() {
                detail.push('\n');
                if truncated {
                    detail.push_str("[… earlier output cut]\n");
                }
                detail.push_str(stdout.trim_end());
            }
            if !stderr.trim().is_empty() {
                detail.push_str("\n--- stderr ---\n");
                detail.push_str(stderr.trim_end());
            }
            ActionStatus::Failed {
                code: ActionFailure::CommandFailed,
                detail,
            }
        }
        Ran::TimedOut => ActionStatus::Failed {
            code: ActionFailure::TimedOut,
            detail: format!(
                "{what}: `{cmd}` did not finish within {} ([actions] command_timeout) and was killed",
                protocol::duration::display(timeout)
            ),
        },
        Ran::NotStarted(e) => ActionStatus::Failed {
            code: ActionFailure::Error,
            detail: format!("{what}: {e}"),
        },
    }
}

impl ActionServer {
    /// A server acting under `cfg` on the node under `root`; reboots are sent to `reboots`.
    pub fn new(
        cfg: ActionsConfig,
        root: PathBuf,
        reboots: mpsc::UnboundedSender<RebootOrder>,
    ) -> Self {
        let mut ledger = Ledger::load(&cfg.state_dir);
        ledger.set_boot(&crate::node::boot_id(&root).unwrap_or_default());
        warn_about_unusable_settings(&cfg);
        let epochs = EpochRecord::load(&cfg.state_dir);
        Self {
            cfg: Mutex::new(cfg),
            root,
            ledger: Mutex::new(ledger),
            epochs: Mutex::new(epochs),
            checks: Mutex::new(Vec::new()),
            reboots,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Applies reloaded settings to the next requests.
    pub fn set_config(&self, cfg: ActionsConfig) {
        self.ledger
            .lock()
            .expect("ledger lock")
            .move_to(&cfg.state_dir);
        self.epochs
            .lock()
            .expect("epochs lock")
            .move_to(&cfg.state_dir);
        warn_about_unusable_settings(&cfg);
        *self.cfg.lock().expect("actions config lock") = cfg;
    }

    /// The settings in force.
    pub fn config(&self) -> ActionsConfig {
        self.cfg.lock().expect("actions config lock").clone()
    }

    /// Keeps the checks of the last round that were not ok.
    pub fn set_checks(&self, checks: &[CheckResult]) {
        let mut kept = self.checks.lock().expect("checks lock");
        kept.clear();
        kept.extend(
            checks
                .iter()
                .filter(|c| c.status != protocol::messages::CheckStatus::Ok)
                .cloned(),
        );
    }

    /// Records the outcome of a reboot command (called by the reporting loop).
    pub fn reboot_finished(&self, id: &str, status: ActionStatus) {
        let line = match &status {
            ActionStatus::Failed { detail, .. } => format!("failed {detail}"),
            _ => "reboot command ran".to_string(),
        };
        let mut l = self.ledger.lock().expect("ledger lock");
        if let Err(e) = l.record_reboot(id, &line) {
            warn!(error = %e, id, "cannot record the reboot's outcome");
        }
        if matches!(status, ActionStatus::Failed { .. }) {
            l.finish(id, status);
        }
    }

    /// Records that the agent was stopped while the reboot command of `id` ran (called by
    /// the reporting loop on SIGTERM, which during a real reboot is the shutdown itself): a
    /// resend is answered as a reboot asked for, and the coordinator's step judges by the
    /// boot id the agent comes back with.
    pub fn reboot_interrupted(&self, id: &str) {
        let boot = crate::node::boot_id(&self.root).unwrap_or_default();
        let line = format!(
            "{}; the agent was stopped while the reboot command ran",
            ledger::reboot_asked(&boot)
        );
        let mut l = self.ledger.lock().expect("ledger lock");
        if let Err(e) = l.record_reboot(id, &line) {
            warn!(error = %e, id, "cannot record the reboot's outcome");
        }
    }

    /// Is `action` allowed by the settings in force? `Err` says why not.
    fn allowed(&self, action: &AgentAction) -> Result<(), String> {
        let cfg = self.cfg.lock().expect("actions config lock");
        match action {
            AgentAction::RestartUnit { unit } => {
                if !config::valid_unit_name(unit) {
                    Err(format!("{unit:?} is not a unit name"))
                } else if !cfg.allowed_units.iter().any(|u| u == unit) {
                    Err(format!(
                        "restart-unit {unit} is not allowed by this agent: [actions] allowed_units = [{}]",
                        cfg.allowed_units.join(", ")
                    ))
                } else {
                    Ok(())
                }
            }
            AgentAction::Reboot if !cfg.reboot => Err(
                "reboot is not allowed by this agent: set reboot = true in its [actions]".into(),
            ),
            AgentAction::CollectDiagnostics if !cfg.collect_diagnostics => Err(
                "collect-diagnostics is not allowed by this agent: [actions] collect_diagnostics = false".into(),
            ),
            _ => Ok(()),
        }
    }

    /// Carries out one request, writing each answer with `answer`. `token` is the
    /// coordinator's (none from a coordinator of a release before fencing tokens): an older
    /// epoch than one seen for its store is refused before anything else, a resent id too.
    async fn handle(&self, req: ActionRequest, token: Option<FencingToken>, send: &mut SendStream) {
        let id = req.id.clone();
        if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN {
            let detail = format!("request id must be 1..={MAX_REQUEST_ID_LEN} bytes");
            return answer(
                send,
                &id,
                ActionStatus::Failed {
                    code: ActionFailure::BadRequest,
                    detail,
                },
            )
            .await;
        }
        let what = req.action.describe();
        if let Some(token) = &token {
            let admitted = self.epochs.lock().expect("epochs lock").admit(token);
            if let Err(status) = admitted {
                if let ActionStatus::Failed { detail, .. } = &status {
                    warn!(id, action = %what, epoch = token.epoch, store = %token.store, %detail, "action refused");
                }
                return answer(send, &id, status).await;
            }
        }
        if let Err(detail) = self.allowed(&req.action) {
            warn!(id, action = %what, %detail, "action refused");
            return answer(
                send,
                &id,
                ActionStatus::Failed {
                    code: ActionFailure::NotAllowed,
                    detail,
                },
            )
            .await;
        }
        if req.action == AgentAction::CollectDiagnostics {
            answer(send, &id, ActionStatus::Accepted).await;
            let cfg = self.config();
            let checks = self.checks.lock().expect("checks lock").clone();
            let bundle = diagnostics::collect(&cfg, &self.root, &checks).await;
            info!(id, bytes = bundle.total_bytes(), "diagnostics collected");
            return answer(send, &id, ActionStatus::Diagnostics(bundle)).await;
        }
        let begun = self.ledger.lock().expect("ledger lock").begin(&id);
        if let Begin::Seen(mut rx) = begun {
            info!(id, action = %what, "request seen before; answering without acting again");
            answer(send, &id, ActionStatus::Accepted).await;
            if req.action == AgentAction::Reboot {
                // A reboot's answer is its goodbye; only a recorded failure is sent.
                let recorded = rx.borrow().clone();
                if let Some(s @ ActionStatus::Failed { .. }) = recorded {
                    answer(send, &id, s).await;
                }
                return;
            }
            let status = match rx.wait_for(Option::is_some).await {
                Ok(s) => s.clone(),
                Err(_) => return,
            };
            let Some(status) = status else { return };
            return answer(send, &id, status).await;
        }
        match req.action {
            AgentAction::RestartUnit { unit } => self.restart(&id, &unit, send).await,
            AgentAction::Reboot => {
                if let Err(status) = self.record_reboot(&id) {
                    return answer(send, &id, status).await;
                }
                answer(send, &id, ActionStatus::Accepted).await;
                info!(id, "reboot asked by the coordinator; saying goodbye first");
                let _ = self.reboots.send(RebootOrder { id });
            }
            AgentAction::CollectDiagnostics => unreachable!("handled above"),
        }
    }
}

impl ActionServer {
    /// Writes reboot request `id` to the reboot record before anything is done; a reboot
    /// that cannot be recorded is refused (a resend could run it twice), logged on the node
    /// like the other refusals, and its answer is returned.
    fn record_reboot(&self, id: &str) -> Result<(), ActionStatus> {
        let boot = crate::node::boot_id(&self.root).unwrap_or_default();
        let mut ledger = self.ledger.lock().expect("ledger lock");
        let Err(e) = ledger.record_reboot(id, &ledger::reboot_asked(&boot)) else {
            return Ok(());
        };
        let detail = format!("not rebooting: {e}");
        warn!(id, action = "reboot", %detail, "action refused");
        let status = ActionStatus::Failed {
            code: ActionFailure::Error,
            detail,
        };
        ledger.finish(id, status.clone());
        Err(status)
    }
}

/// Says at start and at each reload what would make an allowed action fail whenever it is
/// asked for, so the operator learns it now rather than from a repair at night: a restart
/// or reboot command whose program cannot be run, and a `state_dir` that cannot be written,
/// which refuses every reboot (with `reboot = true`) and keeps restart ids in memory only.
fn warn_about_unusable_settings(cfg: &ActionsConfig) {
    let commands = [
        (
            !cfg.allowed_units.is_empty(),
            "actions.restart_command",
            &cfg.restart_command,
        ),
        (cfg.reboot, "actions.reboot_command", &cfg.reboot_command),
    ];
    for (used, key, argv) in commands {
        if let Some(program) = argv
            .first()
            .filter(|p| used && protocol::process_tree::resolve_program(p).is_none())
        {
            warn!(
                key,
                program = %program,
                "an action's program cannot be run (not found or not executable): the coordinator's requests for it will fail"
            );
        }
    }
    let restarts = !cfg.allowed_units.is_empty();
    if !cfg.reboot && !restarts {
        return;
    }
    let dir = &cfg.state_dir;
    let writable = std::fs::create_dir_all(dir).and_then(|()| {
        rustix::fs::access(
            dir,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
        )
        .map_err(std::io::Error::from)
    });
    let Err(e) = writable else { return };
    if cfg.reboot {
        warn!(
            state_dir = %dir.display(),
            error = %e,
            "reboot is allowed but actions.state_dir cannot be written: every reboot the coordinator asks for will be refused; point it at a directory this agent may write"
        );
    }
    if restarts {
        warn!(
            state_dir = %dir.display(),
            error = %e,
            "restarts are allowed but actions.state_dir is not writable: restart ids are kept in memory only, so a restart interrupted by an agent crash could run again when the coordinator resends it; point it at a directory this agent may write"
        );
    }
}

/// Writes one answer frame for request `id`.
async fn answer(send: &mut SendStream, id: &str, status: ActionStatus) {
    let msg = ActionReply {
        id: id.to_string(),
        status,
    };
    if let Err(e) = write_msg(send, &msg, MAX_ACTION_FRAME_LEN).await {
        warn!(error = %e, id, "cannot answer the coordinator's action request");
    }
}

/// Serves action streams the coordinator opens on `conn`, whose hello spoke protocol
/// `version`, until the connection ends.
pub async fn serve(conn: Connection, server: Arc<ActionServer>, version: u16) {
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(_) => return,
        };
        let server = server.clone();
        tokio::spawn(async move { one(send, recv, &server, version).await }.in_current_span());
    }
}

async fn one(mut send: SendStream, mut recv: RecvStream, server: &ActionServer, version: u16) {
    let read = async {
        if version >= FENCING_VERSION {
            let r = read_msg::<FencedActionRequest>(&mut recv, MAX_FRAME_LEN).await?;
            Ok(r.map(|f| (f.request, Some(f.token))))
        } else {
            let r = read_msg::<ActionRequest>(&mut recv, MAX_FRAME_LEN).await?;
            Ok::<_, protocol::transport::TransportError>(r.map(|r| (r, None)))
        }
    };
    let (req, token) = match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            warn!(error = %e, "unreadable action request");
            return;
        }
        Err(_) => {
            warn!("no action request on a stream the coordinator opened");
            return;
        }
    };
    let span = tracing::info_span!("action", id = %req.id, action = %req.action.describe());
    server.handle(req, token, &mut send).instrument(span).await;
    let _ = send.finish();
    let _ = tokio::time::timeout(ANSWER_LINGER, send.stopped()).await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    use super::*;

    /// Keeps `level message` of every event: the log lines a test expects.
    #[derive(Default)]
    struct Lines {
        lines: Mutex<Vec<String>>,
        next_span: AtomicU64,
    }

    struct Message(String);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    impl Subscriber for &'static Lines {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(self.next_span.fetch_add(1, Ordering::SeqCst) + 1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut m = Message(String::new());
            event.record(&mut m);
            let line = format!("{} {}", event.metadata().level(), m.0);
            self.lines.lock().unwrap().push(line);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn a_reboot_that_cannot_be_recorded_is_refused_and_logged() {
        let dir = tempfile::tempdir().unwrap();
        // The record's path is a directory: it can be neither read nor replaced.
        std::fs::create_dir(dir.path().join("reboot-requests")).unwrap();
        let cfg = ActionsConfig {
            reboot: true,
            state_dir: dir.path().to_path_buf(),
            ..ActionsConfig::default()
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let logs: &'static Lines = Box::leak(Box::default());
        let server = tracing::subscriber::with_default(logs, || {
            ActionServer::new(cfg, dir.path().to_path_buf(), tx)
        });
        assert!(matches!(
            server.ledger.lock().unwrap().begin("r1"),
            Begin::New
        ));
        let refused = tracing::subscriber::with_default(logs, || server.record_reboot("r1"));
        let Err(ActionStatus::Failed { detail, .. }) = refused else {
            panic!("{refused:?}");
        };
        assert!(detail.starts_with("not rebooting: "), "{detail}");
        assert!(rx.try_recv().is_err(), "no reboot ordered");
        let lines = logs.lines.lock().unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l == &format!("{} action refused", Level::WARN)),
            "{lines:?}"
        );
    }

    #[test]
    fn a_failed_commands_answer_says_what_on_its_first_line_and_its_output_below() {
        let argv = vec!["restart".to_string(), "kubelet".to_string()];
        let ran = Ran::Exited {
            success: false,
            status: "exit status: 1".into(),
            stdout: "17\n18\n".into(),
            stderr: "Job for kubelet failed\n".into(),
            truncated: true,
        };
        let timeout = Duration::from_secs(5);
        let status = command_status("restart-unit kubelet", &argv, timeout, ran);
        let ActionStatus::Failed { detail, .. } = status else {
            panic!("{status:?}");
        };
        assert_eq!(
            detail,
            "restart-unit kubelet: `restart kubelet` exit status: 1\n[… earlier output cut]\n17\n18\n--- stderr ---\nJob for kubelet failed"
        );
        let status = command_status("reboot", &argv, timeout, Ran::TimedOut);
        let ActionStatus::Failed { detail, .. } = status else {
            panic!("{status:?}");
        };
        assert_eq!(
            detail,
            "reboot: `restart kubelet` did not finish within 5s ([actions] command_timeout) and was killed"
        );
    }

    #[test]
    fn a_reloaded_state_dir_keeps_the_reboot_record_there_and_remembers_the_old_one() {
        let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let cfg = |dir: &std::path::Path| ActionsConfig {
            reboot: true,
            state_dir: dir.to_path_buf(),
            ..ActionsConfig::default()
        };
        std::fs::write(
            new.path().join("reboot-requests"),
            "r0\treboot command ran\n",
        )
        .unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let server = ActionServer::new(cfg(old.path()), old.path().to_path_buf(), tx.clone());
        server.record_reboot("r1").unwrap();
        server.set_config(cfg(new.path()));
        // Written there at once: a crash before the next record must not forget r1.
        let moved = std::fs::read_to_string(new.path().join("reboot-requests")).unwrap();
        assert!(
            moved.contains("r0\t") && moved.contains("r1\t"),
            "{moved:?}"
        );
        server.record_reboot("r2").unwrap();
        let kept = std::fs::read_to_string(new.path().join("reboot-requests")).unwrap();
        for id in ["r0\t", "r1\t", "r2\t"] {
            assert!(kept.contains(id), "{id} missing from {kept:?}");
        }
        // After a restart on the new directory, every id is still known.
        let restarted = ActionServer::new(cfg(new.path()), new.path().to_path_buf(), tx);
        for id in ["r0", "r1", "r2"] {
            assert!(
                matches!(restarted.ledger.lock().unwrap().begin(id), Begin::Seen(_)),
                "{id}"
            );
        }
    }

    #[test]
    fn an_unwritable_state_dir_with_reboots_allowed_is_said_at_start_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the directory should be: it can be neither created nor written.
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let cfg = ActionsConfig {
            reboot: true,
            state_dir: file.clone(),
            restart_command: vec!["true".into()],
            reboot_command: vec!["true".into()],
            ..ActionsConfig::default()
        };
        let warned = |lines: &Lines| {
            lines
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("actions.state_dir cannot be written"))
                .count()
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let logs: &'static Lines = Box::leak(Box::default());
        let server = tracing::subscriber::with_default(logs, || {
            ActionServer::new(cfg.clone(), dir.path().to_path_buf(), tx)
        });
        assert_eq!(warned(logs), 1);
        tracing::subscriber::with_default(logs, || server.set_config(cfg.clone()));
        assert_eq!(warned(logs), 2);
        // Reboots not allowed, or a directory it may write: nothing to say.
        let quiet = |cfg: ActionsConfig| {
            tracing::subscriber::with_default(logs, || server.set_config(cfg));
        };
        quiet(ActionsConfig {
            reboot: false,
            ..cfg.clone()
        });
        quiet(ActionsConfig {
            state_dir: dir.path().join("state"),
            ..cfg
        });
        assert_eq!(warned(logs), 2);
        // Restarts allowed (the default units): their ids would be kept in memory only.
        let memory_only = logs
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("actions.state_dir is not writable"))
            .count();
        assert_eq!(
            memory_only, 3,
            "start, reload, and the reload without reboots"
        );
    }

    #[test]
    fn an_action_program_that_cannot_be_run_is_said_at_start_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let not_executable = dir.path().join("restart");
        std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
        let cfg = ActionsConfig {
            reboot: true,
            state_dir: dir.path().join("state"),
            restart_command: vec![not_executable.display().to_string()],
            reboot_command: vec!["fleetmend-no-such-program".into()],
            ..ActionsConfig::default()
        };
        let said = |lines: &Lines| {
            lines
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("an action's program cannot be run"))
                .count()
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let logs: &'static Lines = Box::leak(Box::default());
        let server = tracing::subscriber::with_default(logs, || {
            ActionServer::new(cfg.clone(), dir.path().to_path_buf(), tx)
        });
        assert_eq!(said(logs), 2);
        // Runnable programs (a path, a name in PATH), or actions not allowed: nothing to say.
        tracing::subscriber::with_default(logs, || {
            server.set_config(ActionsConfig {
                restart_command: vec!["/bin/sh".into()],
                reboot_command: vec!["sh".into()],
                ..cfg.clone()
            });
            server.set_config(ActionsConfig {
                allowed_units: Vec::new(),
                reboot: false,
                ..cfg.clone()
            });
        });
        assert_eq!(said(logs), 2);
        tracing::subscriber::with_default(logs, || server.set_config(cfg));
        assert_eq!(said(logs), 4);
    }
}
