//! Running repair, health-check and success commands: external programs with the machine's
//! address appended, under a time limit that kills the whole process group, with output kept
//! (truncated) for the entry's history; and the `@` built-ins, which go through
//! [`crate::gateway::PowerControl`] and [`AgentHealthView`], or to the agent ([`super::agent_steps`]).
//!
//! Each call runs inside its own task spawned by the engine; nothing here blocks a thread.
//! This module does not decide what a result means for the entry: see [`super::decide`].
//!
//! An external command's process group is recorded in the store while it runs
//! ([`super::orphans`]), so a coordinator killed with SIGKILL has it killed by the next one;
//! the child also gets a parent-death signal where `setpriv` can give it one. Every running
//! command's group is also known in memory ([`kill_running_groups`]), so a coordinator whose
//! leadership ended kills them at once, before anything else stops.

use std::path::Path;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::config::{Builtin, CommandSpec};
use super::decide::CommandEnd;
use super::orphans::GroupLedger;
pub use super::run_context::{
    AgentHealth, AgentHealthView, CommandKind, NoAgents, NoReport, OUTPUT_LIMIT, Outcome,
    RunContext,
};

/// Runs a command of `kind` and says how it ended.
pub fn run(
    spec: CommandSpec,
    kind: CommandKind,
    ctx: RunContext,
) -> BoxFuture<'static, (CommandEnd, Outcome)> {
    Box::pin(async move {
        match spec {
            CommandSpec::External(argv) => {
                let mut argv = argv;
                argv.push(ctx.address.clone());
                let (mut end, mut outcome) =
                    run_external(&argv, ctx.timeout, ctx.groups.as_ref()).await;
                if kind == CommandKind::Health && end.ok {
                    let said = end.output.lines().next().unwrap_or("").to_string();
                    if first_stdout(&end.output).trim() != "true" {
                        end.ok = false;
                        end.summary = format!("stdout was not `true` (first line: {said:?})");
                        outcome = Outcome::Failed;
                    }
                }
                (end, outcome)
            }
            CommandSpec::Builtin(Builtin::AgentHealthy) => agent_healthy(&ctx),
            CommandSpec::Builtin(Builtin::Fence) if ctx.fence.is_some() => {
                super::power_steps::fence(&ctx).await
            }
            CommandSpec::Builtin(Builtin::Fence) => {
                super::power_steps::fence_without_release(&ctx).await
            }
            CommandSpec::Agent(step) => super::agent_steps::run(step, &ctx).await,
            CommandSpec::Builtin(b) => super::power_steps::power(b, &ctx).await,
        }
    })
}

/// Stdout as stored by [`run_external`] (everything before the stderr marker).
fn first_stdout(output: &str) -> &str {
    output.split(STDERR_MARKER).next().unwrap_or("")
}

const STDERR_MARKER: &str = "\n--- stderr ---\n";

fn agent_healthy(ctx: &RunContext) -> (CommandEnd, Outcome) {
    let fail = |summary: String| {
        (
            CommandEnd {
                ok: false,
                summary,
                output: String::new(),
                unknown_since: None,
            },
            Outcome::Failed,
        )
    };
    let Some(h) = ctx.agents.agent_health(&ctx.address) else {
        return fail(match ctx.agents.no_report(&ctx.address) {
            NoReport::Never => "the agent has never reported".into(),
            NoReport::SinceStart(at) => {
                format!("no report from the agent since the coordinator started at {at:.0}")
            }
        });
    };
    if h.last_report <= ctx.step_began {
        return fail(format!(
            "no report since the step began at {:.0}",
            ctx.step_began
        ));
    }
    let Some(ok_since) = h.ok_since else {
        return fail("the last report has a failing check".into());
    };
    if !ctx.boot_id_before.is_empty() && h.boot_id == ctx.boot_id_before {
        return fail(format!(
            "boot id {} unchanged since the power step",
            h.boot_id
        ));
    }
    (
        CommandEnd {
            ok: true,
            summary: format!("every check ok since {ok_since:.0}, boot id {}", h.boot_id),
            output: String::new(),
            unknown_since: None,
        },
        Outcome::Ok,
    )
}

/// Kills the process group it names when dropped, unless disarmed: a timeout or a cancelled
/// task (entry deleted, coordinator stopping) leaves no grandchild behind. Removes the
/// group's record either way.
struct GroupGuard {
    pgid: Option<u32>,
    record: Option<(GroupLedger, u32)>,
    /// The group as listed in [`RUNNING`], removed when the guard goes.
    running: Option<u32>,
}

/// The process groups of the commands running now in this process (their leaders' pids).
static RUNNING: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn running() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u32>> {
    RUNNING.lock().unwrap_or_else(|p| p.into_inner())
}

/// SIGKILLs the group `pgid` and what left it under its leader (`setsid`).
fn kill_group(pgid: u32) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    for pid in protocol::process_tree::descendants(pgid) {
        if let Ok(p) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Kills the process group of every command running in this process now; how many. For a
/// coordinator whose leadership ended: its commands must not go on acting on machines a
/// successor now owns. Each command's task then ends as if timed out, and its group record
/// is removed (or, when the store refuses the deposed leader, left for the successor's
/// reaper, which finds the group gone).
pub fn kill_running_groups() -> usize {
    let groups: Vec<u32> = running().iter().copied().collect();
    for pgid in &groups {
        kill_group(*pgid);
    }
    groups.len()
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.running.take() {
            running().remove(&pgid);
        }
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid);
        }
        if let Some((ledger, pgid)) = self.record.take() {
            // A destructor cannot await; the delete is one small transaction, off the
            // async threads when a runtime is there to take it.
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn_blocking(move || ledger.forget(pgid));
                }
                Err(_) => ledger.forget(pgid),
            }
        }
    }
}

/// `setpriv --pdeathsig` ([`protocol::process_tree::pdeathsig_helper`]), said once in the
/// log when missing. The signal fires when the spawning thread dies, which for tokio's
/// worker threads is the runtime's end; the group record ([`super::orphans`]) stays the
/// primary defence, this is the second. Without it commands run unguarded by it.
fn pdeathsig_helper() -> Option<&'static Path> {
    static SAID: OnceLock<()> = OnceLock::new();
    let found = protocol::process_tree::pdeathsig_helper();
    if found.is_none() {
        SAID.get_or_init(|| {
            tracing::warn!("util-linux setpriv with --pdeathsig not found: repair commands get no parent-death signal (their process groups are still recorded and killed after a crash)");
        });
    }
    found
}

/// Reads `r` to its end into `kept` (at most [`OUTPUT_LIMIT`] bytes) and whether more came;
/// what was read stays kept if this is dropped half-way.
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, kept: &mut (Vec<u8>, bool)) {
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let room = OUTPUT_LIMIT.saturating_sub(kept.0.len());
                kept.0.extend_from_slice(&buf[..n.min(room)]);
                kept.1 |= n > room;
            }
        }
    }
}

fn text(bytes: &[u8], truncated: bool) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if truncated {
        s.push_str("\n[… truncated]");
    }
    s
}

/// Runs `argv` (address already appended) in its own process group, with stdin closed,
/// under `timeout`, its group recorded in `groups` while it runs. Output is stdout, then a
/// marker and stderr when stderr is not empty.
pub async fn run_external(
    argv: &[String],
    timeout: Option<Duration>,
    groups: Option<&GroupLedger>,
) -> (CommandEnd, Outcome) {
    let Some(program) = protocol::process_tree::resolve_program(&argv[0]) else {
        return (
            CommandEnd {
                ok: false,
                summary: format!("cannot run {}: no such program", argv[0]),
                output: String::new(),
                unknown_since: None,
            },
            Outcome::Error,
        );
    };
    let mut cmd = match pdeathsig_helper() {
        Some(helper) => {
            let mut c = tokio::process::Command::new(helper);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&program);
            c
        }
        None => tokio::process::Command::new(&program),
    };
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return (
                CommandEnd {
                    ok: false,
                    summary: format!("cannot run {}: {e}", argv[0]),
                    output: String::new(),
                    unknown_since: None,
                },
                Outcome::Error,
            );
        }
    };
    let mut guard = GroupGuard {
        pgid: child.id(),
        record: None,
        running: child.id(),
    };
    if let Some(pgid) = child.id() {
        running().insert(pgid);
    }
    if let (Some(ledger), Some(pid)) = (groups, child.id()) {
        ledger.record(pid, argv).await;
        guard.record = Some((ledger.clone(), pid));
    }
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let (mut out, mut err) = ((Vec::new(), false), (Vec::new(), false));
    // A child the command left running may hold its output open: read until the command
    // exits, and a little after (protocol::process_tree::OUTPUT_AFTER_EXIT).
    let work = protocol::process_tree::wait_reading_output(&mut child, async {
        tokio::join!(read_capped(stdout, &mut out), read_capped(stderr, &mut err));
    });
    let finished = match timeout {
        Some(t) => tokio::time::timeout(t, work).await.ok(),
        None => Some(work.await),
    };
    let Some(status) = finished else {
        drop(guard);
        let secs = timeout.map(|t| t.as_secs_f64()).unwrap_or(0.0);
        return (
            CommandEnd {
                ok: false,
                summary: format!("timed out after {secs} s; process group killed"),
                output: String::new(),
                unknown_since: None,
            },
            Outcome::Timeout,
        );
    };
    guard.pgid = None;
    drop(guard);
    let ((out, out_trunc), (err, err_trunc)) = (out, err);
    let mut output = text(&out, out_trunc);
    if !err.is_empty() {
        output.push_str(STDERR_MARKER);
        output.push_str(&text(&err, err_trunc));
    }
    match status {
        Ok(s) if s.success() => (
            CommandEnd {
                ok: true,
                summary: "exit status 0".into(),
                output,
                unknown_since: None,
            },
            Outcome::Ok,
        ),
        Ok(s) => (
            CommandEnd {
                ok: false,
                summary: match s.code() {
                    Some(c) => format!("exit status {c}"),
                    None => format!("terminated: {s}"),
                },
                output,
                unknown_since: None,
            },
            Outcome::Failed,
        ),
        Err(e) => (
            CommandEnd {
                ok: false,
                summary: format!("waiting for {} failed: {e}", argv[0]),
                output,
                unknown_since: None,
            },
            Outcome::Error,
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jiff::Timestamp;
    use protocol::gateway::{PowerAction, PowerOutcome};

    use super::*;
    use crate::gateway::NoGateway;
    use crate::testing::{FakeAgents, FakePower};

    fn ctx(timeout: Option<Duration>) -> RunContext {
        RunContext {
            address: "10.0.0.9".into(),
            serial: String::new(),
            request_id: "r1".into(),
            timeout,
            step_began: Timestamp::from_second(1_800_000_000).unwrap(),
            boot_id_before: String::new(),
            power: Arc::new(NoGateway),
            agents: Arc::new(NoAgents),
            groups: None,
            actions: Arc::new(crate::agent_link::NoAgentLinks),
            diagnostics: None,
            entry_index: 0,
            fence: None,
            keep_off: None,
            fence_timeouts: None,
            kdump: None,
        }
    }

    fn sh(script: &str) -> CommandSpec {
        CommandSpec::External(vec!["sh".into(), "-c".into(), script.into(), "cmd".into()])
    }

    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(20), f)
            .await
            .expect("test timed out")
    }

    #[tokio::test]
    async fn address_is_appended_and_output_kept() {
        let (end, o) = within(run(
            sh("echo \"addr=$1\"; echo oops >&2"),
            CommandKind::Repair,
            ctx(None),
        ))
        .await;
        assert!(end.ok, "{end:?}");
        assert_eq!(o, Outcome::Ok);
        assert_eq!(end.output, "addr=10.0.0.9\n\n--- stderr ---\noops\n");
    }

    #[tokio::test]
    async fn health_check_passes_only_on_exactly_true() {
        let t = Some(Duration::from_secs(10));
        let (end, _) = within(run(sh("echo '  true  '"), CommandKind::Health, ctx(t))).await;
        assert!(end.ok);
        for script in ["echo True", "echo 'true true'", "echo true; exit 1", "true"] {
            let (end, _) = within(run(sh(script), CommandKind::Health, ctx(t))).await;
            assert!(!end.ok, "{script}: {end:?}");
        }
        let (end, _) = within(run(sh("echo true"), CommandKind::Repair, ctx(t))).await;
        assert!(end.ok);
    }

    #[tokio::test]
    async fn a_command_that_exits_leaving_a_child_on_its_output_ends_with_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        // The child inherits stdout and stderr and keeps them open past the command's exit.
        let script = format!("echo started; sleep 30 & echo $! > {}", file.display());
        let (end, o) = within(run(
            sh(&script),
            CommandKind::Repair,
            ctx(Some(Duration::from_secs(10))),
        ))
        .await;
        let pid = std::fs::read_to_string(&file).unwrap();
        let _ = std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status();
        assert_eq!(o, Outcome::Ok, "{end:?}");
        assert_eq!(end.output, "started\n");
    }

    #[tokio::test]
    async fn failing_command_reports_exit_status_and_output() {
        let (end, o) = within(run(
            sh("echo broken; exit 3"),
            CommandKind::Repair,
            ctx(None),
        ))
        .await;
        assert!(!end.ok);
        assert_eq!(o, Outcome::Failed);
        assert_eq!(end.summary, "exit status 3");
        assert_eq!(end.output, "broken\n");
        let (end, o) = within(run(
            CommandSpec::External(vec!["/nonexistent/fleetmend-cmd".into()]),
            CommandKind::Repair,
            ctx(None),
        ))
        .await;
        assert!(!end.ok);
        assert_eq!(o, Outcome::Error);
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        for spawn in ["sleep 300", "setsid sleep 300"] {
            timeout_kills(spawn).await;
        }
    }

    /// `spawn` (a grandchild in the group, or one that left it) dies at the time limit.
    async fn timeout_kills(spawn: &str) {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("{spawn} & echo $! > {}; wait", pidfile.display());
        let started = std::time::Instant::now();
        let (end, o) = within(run(
            sh(&script),
            CommandKind::Repair,
            ctx(Some(Duration::from_millis(500))),
        ))
        .await;
        assert_eq!(o, Outcome::Timeout);
        assert!(!end.ok);
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .to_string();
        // The grandchild `sleep` must be gone (allow a moment for the kernel to reap it).
        let mut gone = false;
        for _ in 0..50 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(gone, "grandchild {pid} ({spawn}) survived the timeout");
    }

    #[tokio::test]
    async fn output_is_truncated() {
        let (end, _) = within(run(
            sh("head -c 100000 /dev/zero | tr '\\0' x"),
            CommandKind::Repair,
            ctx(None),
        ))
        .await;
        assert!(end.ok);
        assert!(end.output.len() < OUTPUT_LIMIT + 64, "{}", end.output.len());
        assert!(end.output.ends_with("[… truncated]"));
    }

    #[tokio::test]
    async fn power_builtins_without_gateway_fail_clearly() {
        let (end, o) = within(run(
            CommandSpec::Builtin(Builtin::PowerCycle),
            CommandKind::Repair,
            ctx(None),
        ))
        .await;
        assert!(!end.ok);
        assert_eq!(o, Outcome::Error);
        assert!(end.summary.contains("not available"), "{}", end.summary);
    }

    fn unreachable() -> crate::gateway::PowerError {
        crate::gateway::PowerError::Unreachable {
            gateway: "rack-a".into(),
            detail: "connection refused".into(),
        }
    }

    #[tokio::test]
    async fn an_unreachable_gateway_holds_the_step_and_resends_the_same_id() {
        // The two retriable kinds: nothing sent, then an answer lost.
        let gw = Arc::new(FakePower::default());
        gw.then(Err(unreachable()))
            .then(Err(crate::gateway::PowerError::AnswerLost {
                gateway: "rack-a".into(),
                id: "r1".into(),
                detail: "connection lost".into(),
            }));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        let (end, o) = within(run(
            CommandSpec::Builtin(Builtin::PowerCycle),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(end.ok, "{end:?}");
        assert_eq!(o, Outcome::Ok);
        let ids: Vec<String> = gw.requests().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["r1", "r1", "r1"]);
        // Each gives the gateway the step's time left less 2 s, so that a gateway at its
        // limit still answers, in words, before this side gives up.
        for r in gw.requests() {
            assert!(
                (20_000..=28_000).contains(&r.timeout_ms),
                "{}",
                r.timeout_ms
            );
        }
        assert!(
            end.summary.contains("held") && end.summary.contains("over 2 attempts"),
            "{}",
            end.summary
        );
    }

    #[tokio::test]
    async fn a_fence_with_nothing_to_release_powers_on_again_unless_kept_off() {
        let off = Timestamp::from_second(1_800_000_100).unwrap();
        for (keep_off, expect) in [
            (
                Some(false),
                vec![("r1", PowerAction::Fence), ("r1-on", PowerAction::On)],
            ),
            (Some(true), vec![("r1", PowerAction::Fence)]),
            (None, vec![("r1", PowerAction::Fence)]),
        ] {
            let gw = Arc::new(FakePower::confirming_off(off));
            let mut c = ctx(Some(Duration::from_secs(30)));
            c.power = gw.clone();
            c.keep_off = keep_off
                .map(|k| -> super::super::fencing::KeepOffOf { Arc::new(move |_: &str| k) });
            let (end, o) = within(run(
                CommandSpec::Builtin(Builtin::Fence),
                CommandKind::Repair,
                c,
            ))
            .await;
            assert!(end.ok, "{keep_off:?}: {end:?}");
            assert_eq!(o, Outcome::Ok);
            let sent: Vec<(String, PowerAction)> = gw
                .requests()
                .into_iter()
                .map(|r| (r.id, r.action))
                .collect();
            let expect: Vec<(String, PowerAction)> = expect
                .into_iter()
                .map(|(i, a)| (i.to_string(), a))
                .collect();
            assert_eq!(sent, expect, "{keep_off:?}");
            assert!(
                end.summary.contains("nothing to release"),
                "{}",
                end.summary
            );
        }
        // An off that fails is not followed by an on.
        let gw = Arc::new(FakePower::default());
        gw.then(Ok(PowerOutcome::Failed {
            detail: "BMC refused".into(),
            retriable: false,
        }));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        c.keep_off = Some(Arc::new(|_: &str| false));
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::Fence),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(!end.ok, "{end:?}");
        assert_eq!(gw.requests().len(), 1);
    }

    /// A gateway that has not answered when the step's limit runs out: the step says which
    /// request it waited for and that the gateway may still be carrying it out (it used to
    /// say only "timed out after 1 s").
    #[tokio::test]
    async fn a_power_step_that_runs_out_of_time_names_the_request_it_awaited() {
        let gw = Arc::new(FakePower::default());
        gw.slow(Duration::from_secs(5));
        let mut c = ctx(Some(Duration::from_secs(1)));
        c.power = gw.clone();
        let id = c.request_id.clone();
        let (end, outcome) = within(run(
            CommandSpec::Builtin(Builtin::PowerOff),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert_eq!(outcome, Outcome::Timeout, "{end:?}");
        assert!(
            end.summary.contains(&format!("answer to request {id}"))
                && end.summary.contains("may still be carrying it out"),
            "{}",
            end.summary
        );
    }

    /// `[fence] off_timeout = "15s"` with a 120 s step: the off used to get the step's whole
    /// limit, so a BMC that never read off failed the step after 118 s, not 15 s.
    #[tokio::test]
    async fn a_fence_with_nothing_to_release_keeps_the_fence_off_and_on_limits() {
        let off = Timestamp::from_second(1_800_000_100).unwrap();
        let gw = Arc::new(FakePower::confirming_off(off));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        c.keep_off = Some(Arc::new(|_: &str| false));
        c.fence_timeouts = Some(Arc::new(|_: &str| crate::fence::flow::FenceTimeouts {
            off: Duration::from_secs(5),
            on: Duration::from_secs(7),
            ..Default::default()
        }));
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::Fence),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(end.ok, "{end:?}");
        let sent: Vec<(PowerAction, u64)> = gw
            .requests()
            .into_iter()
            .map(|r| (r.action, r.timeout_ms))
            .collect();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0].0, PowerAction::Fence);
        assert!((4_000..=5_000).contains(&sent[0].1), "{sent:?}");
        assert_eq!(sent[1].0, PowerAction::On);
        assert!((6_000..=7_000).contains(&sent[1].1), "{sent:?}");
    }

    /// "Dumping" for its first `dumping_reads` reads, then "dump done".
    struct DumpFor(std::sync::atomic::AtomicU32);

    impl crate::fence::kdump::KdumpView for DumpFor {
        fn dump(&self, _address: &str) -> crate::fence::kdump::DumpSeen {
            use std::sync::atomic::Ordering;
            let left = self.0.load(Ordering::SeqCst);
            if left == 0 {
                return crate::fence::kdump::DumpSeen::Done {
                    at: Timestamp::now(),
                };
            }
            self.0.store(left - 1, Ordering::SeqCst);
            crate::fence::kdump::DumpSeen::Dumping {
                started: Timestamp::now(),
                timeout: Duration::from_secs(600),
            }
        }
    }

    /// A machine that is not a node, whose kdump initramfs said "dumping": `@fence` (and
    /// `@power-cycle`, `@power-off`) powered it off at once, losing the dump. It now waits for "dump done" (or the kdump timeout),
    /// and powers nothing off if the step's limit comes first.
    #[tokio::test]
    async fn a_fence_with_nothing_to_release_waits_for_a_dump_in_progress() {
        let off = Timestamp::from_second(1_800_000_100).unwrap();
        let gw = Arc::new(FakePower::confirming_off(off));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        c.keep_off = Some(Arc::new(|_: &str| false));
        c.kdump = Some(Arc::new(DumpFor(2.into())));
        let t = std::time::Instant::now();
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::Fence),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(end.ok, "{end:?}");
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(end.summary.contains("crash dump to end"), "{}", end.summary);
        assert_eq!(gw.requests().len(), 2);

        // Still dumping when the step's limit comes: nothing is sent.
        let gw = Arc::new(FakePower::confirming_off(off));
        let mut c = ctx(Some(Duration::from_millis(1500)));
        c.power = gw.clone();
        c.kdump = Some(Arc::new(DumpFor(u32::MAX.into())));
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::Fence),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(!end.ok, "{end:?}");
        assert!(
            end.summary.contains("still writing its crash dump"),
            "{}",
            end.summary
        );
        assert!(gw.requests().is_empty(), "{:?}", gw.requests());

        // `@power-cycle` and `@power-off` of a dumping machine wait as well.
        for b in [Builtin::PowerCycle, Builtin::PowerOff] {
            let gw = Arc::new(FakePower::confirming_off(off));
            let mut c = ctx(Some(Duration::from_millis(1500)));
            c.power = gw.clone();
            c.kdump = Some(Arc::new(DumpFor(u32::MAX.into())));
            let (end, _) = within(run(CommandSpec::Builtin(b), CommandKind::Repair, c)).await;
            assert!(!end.ok, "{end:?}");
            assert!(
                end.summary.starts_with(b.name()) && end.summary.contains("crash dump"),
                "{}",
                end.summary
            );
            assert!(gw.requests().is_empty(), "{:?}", gw.requests());
        }
    }

    #[tokio::test]
    async fn an_off_or_on_the_gateway_lost_in_a_restart_is_sent_again_but_a_cycle_is_not() {
        let unknown = || {
            Ok(PowerOutcome::Failed {
                detail: format!(
                    "{}the gateway restarted while request r1 ran",
                    protocol::gateway::OUTCOME_UNKNOWN
                ),
                retriable: false,
            })
        };
        let off = Timestamp::from_second(1_800_000_100).unwrap();
        // A fence of a machine with nothing to release: the off and then the on are each
        // lost once; both are sent again under new ids and the machine ends powered on.
        let gw = Arc::new(FakePower::confirming_off(off));
        gw.then(unknown());
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        c.keep_off = Some(Arc::new(|_: &str| false));
        let first = within(run(
            CommandSpec::Builtin(Builtin::Fence),
            CommandKind::Repair,
            c.clone(),
        ));
        let (end, o) = first.await;
        assert!(end.ok, "{end:?}");
        assert_eq!(o, Outcome::Ok);
        assert!(
            end.summary.contains("sent again as r1-resend1"),
            "{}",
            end.summary
        );
        let gw2 = Arc::new(FakePower::answering(PowerOutcome::Done {
            state: protocol::gateway::PowerState::On,
            confirmed_off_unix_ms: None,
            detail: "on".into(),
        }));
        gw2.then(unknown());
        c.power = gw2.clone();
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::PowerOn),
            CommandKind::Repair,
            c.clone(),
        ))
        .await;
        assert!(end.ok, "{end:?}");
        let ids: Vec<String> = gw2.requests().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["r1", "r1-resend1"]);
        let ids: Vec<(String, PowerAction)> = gw
            .requests()
            .into_iter()
            .map(|r| (r.id, r.action))
            .collect();
        assert_eq!(
            ids,
            [
                ("r1".to_string(), PowerAction::Fence),
                ("r1-resend1".to_string(), PowerAction::Fence),
                ("r1-on".to_string(), PowerAction::On)
            ]
        );
        // A cycle is not done twice on a guess: it fails, saying why.
        let gw3 = Arc::new(FakePower::default());
        gw3.then(unknown());
        c.power = gw3.clone();
        let (end, o) = within(run(
            CommandSpec::Builtin(Builtin::PowerCycle),
            CommandKind::Repair,
            c.clone(),
        ))
        .await;
        assert!(!end.ok && o == Outcome::Failed, "{end:?}");
        assert!(end.output.contains("outcome unknown"), "{end:?}");
        assert_eq!(gw3.requests().len(), 1);
        // And it tells the decision, so a retry of the step waits for evidence
        // (`decide`'s a_power_action_of_unknown_outcome_is_retried_only_on_the_agents_evidence).
        assert!(end.unknown_since.is_some(), "{end:?}");
        // A gateway that keeps losing it: three resends, then the step fails.
        let gw4 = Arc::new(FakePower::default());
        for _ in 0..10 {
            gw4.then(unknown());
        }
        c.power = gw4.clone();
        let (end, _) = within(run(
            CommandSpec::Builtin(Builtin::PowerOff),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(!end.ok, "{end:?}");
        assert_eq!(gw4.requests().len(), 4);
        // An off done twice is an off: its retry needs no evidence.
        assert_eq!(end.unknown_since, None, "{end:?}");
    }

    /// Issue 34: a cycle the gateway answered with "powered on only" (the machine was off,
    /// or another request's cycle was under way) is not recorded as a plain "done".
    #[tokio::test]
    async fn a_cycle_that_only_powered_on_says_so() {
        let gw = Arc::new(FakePower::answering(PowerOutcome::Done {
            state: protocol::gateway::PowerState::On,
            confirmed_off_unix_ms: None,
            detail: format!(
                "{}the machine was being cycled by request other-1 (accepted 0 s before) and \
                 read off, so the cycle powered it on; power on accepted: ok",
                protocol::gateway::POWERED_ON_ONLY
            ),
        }));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw;
        let (end, o) = within(run(
            CommandSpec::Builtin(Builtin::PowerCycle),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert!(end.ok && o == Outcome::Ok, "{end:?}");
        assert!(
            end.summary.starts_with(
                "@power-cycle: powered on only, not cycled: the machine was being cycled by \
                 request other-1 (accepted 0 s before) and read off, so the cycle powered it \
                 on (power read just after: On)"
            ),
            "{}",
            end.summary
        );
    }

    #[tokio::test]
    async fn a_fence_with_nothing_to_release_whose_step_stops_mid_way_still_powers_on() {
        // Trap: the entry is deleted (its step task dropped) between the off and the on;
        // the machine stayed off with no record.
        let off = Timestamp::from_second(1_800_000_100).unwrap();
        let gw = Arc::new(FakePower::confirming_off(off));
        gw.slow(Duration::from_millis(300));
        let mut c = ctx(Some(Duration::from_secs(30)));
        c.power = gw.clone();
        c.keep_off = Some(Arc::new(|_: &str| false));
        let step = run(CommandSpec::Builtin(Builtin::Fence), CommandKind::Repair, c);
        // Dropped while the off is under way.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), step)
                .await
                .is_err()
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while gw.requests().len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                gw.requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let sent: Vec<PowerAction> = gw.requests().into_iter().map(|r| r.action).collect();
        assert_eq!(sent, [PowerAction::Fence, PowerAction::On]);
    }

    #[tokio::test]
    async fn a_gateway_down_past_the_step_limit_times_out_saying_it_held() {
        let gw = Arc::new(FakePower::default());
        for _ in 0..1000 {
            gw.then(Err(unreachable()));
        }
        let mut c = ctx(Some(Duration::from_secs(2)));
        c.power = gw.clone();
        let started = std::time::Instant::now();
        let (end, o) = within(run(
            CommandSpec::Builtin(Builtin::PowerOff),
            CommandKind::Repair,
            c,
        ))
        .await;
        assert_eq!(o, Outcome::Timeout, "{end:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(end.summary.contains("held"), "{}", end.summary);
        // Nothing reached the gateway: it is not said to be carrying the request out.
        assert!(
            end.summary.contains("could not be reached")
                && !end.summary.contains("may still be carrying"),
            "{}",
            end.summary
        );
        assert!(gw.requests().len() >= 2);
    }

    #[tokio::test]
    async fn agent_healthy_needs_ok_reports_since_the_step_and_a_new_boot_after_power() {
        let began = Timestamp::from_second(1_800_000_000).unwrap();
        let later = began + jiff::SignedDuration::from_secs(30);
        let check = |h: Option<AgentHealth>, boot_before: &str| {
            let mut c = ctx(None);
            c.agents = Arc::new(FakeAgents::with(h));
            c.boot_id_before = boot_before.into();
            run(
                CommandSpec::Builtin(Builtin::AgentHealthy),
                CommandKind::Health,
                c,
            )
        };
        let ok = AgentHealth {
            boot_id: "b2".into(),
            last_report: later,
            ok_since: Some(later),
        };
        assert!(check(Some(ok.clone()), "").await.0.ok);
        assert!(check(Some(ok.clone()), "b1").await.0.ok, "new boot id");
        assert!(
            !check(Some(ok.clone()), "b2").await.0.ok,
            "same boot id after a power step"
        );
        let (end, _) = check(None, "").await;
        assert!(!end.ok);
        assert_eq!(end.summary, "the agent has never reported");
        // No report since a restart: it may have reported for hours before.
        struct Restarted(Timestamp);
        impl AgentHealthView for Restarted {
            fn agent_health(&self, _: &str) -> Option<AgentHealth> {
                None
            }
            fn no_report(&self, _: &str) -> NoReport {
                NoReport::SinceStart(self.0)
            }
        }
        let mut c = ctx(None);
        c.agents = Arc::new(Restarted(began));
        let (end, _) = run(
            CommandSpec::Builtin(Builtin::AgentHealthy),
            CommandKind::Health,
            c,
        )
        .await;
        assert!(!end.ok);
        assert_eq!(
            end.summary,
            format!("no report from the agent since the coordinator started at {began:.0}")
        );
        let stale = AgentHealth {
            last_report: began,
            ..ok.clone()
        };
        assert!(
            !check(Some(stale), "").await.0.ok,
            "no report since the step began"
        );
        let failing = AgentHealth {
            ok_since: None,
            ..ok
        };
        assert!(!check(Some(failing), "").await.0.ok, "failing check");
    }
}
