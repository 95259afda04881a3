//! Running an action's command: no shell, stdin closed, killed at its time limit, output
//! kept bounded (the tail, where a log's newest lines are).
//!
//! The command runs in a process group of its own, and at its time limit (or when the agent
//! drops the run) the whole group is killed: a script's children (`( sleep 5; reboot ) &`)
//! die with it instead of acting after the agent said the command was killed. A command that
//! exits in time may leave children behind on purpose; those are not touched. A child that
//! left the group (`setsid`) is killed too while the command still runs, found as its
//! descendant ([`protocol::process_tree`]).
//!
//! If the agent itself is killed (SIGKILL, a crash, the OOM killer) while a command runs:
//! under the packaged systemd unit, systemd kills what is left in the service's control
//! group. Elsewhere the command is started through `setpriv --pdeathsig KILL` when util-linux
//! has it, so the kernel kills the command with the agent; what the command forked lives on
//! (see `parent_death_guard`).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It exited; `success` is exit status 0.
    Exited {
        /// Exit status 0.
        success: bool,
        /// `exit status N` or `signal N`.
        status: String,
        /// The kept tail of stdout.
        stdout: String,
        /// The kept tail of stderr.
        stderr: String,
        /// Whether stdout was cut.
        truncated: bool,
    },
    /// Killed at its time limit.
    TimedOut,
    /// Could not be started.
    NotStarted(String),
}

/// The last `keep` bytes read from a command's stdout or stderr, and whether anything was
/// dropped.
struct Tail {
    buf: Vec<u8>,
    keep: usize,
    dropped: bool,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Self {
            buf: Vec::new(),
            keep,
            dropped: false,
        }
    }

    /// Reads `r` to its end; what was read stays kept if this is dropped half-way.
    async fn fill<R: AsyncRead + Unpin>(&mut self, r: Option<R>) {
        let Some(mut r) = r else { return };
        // On the heap: an array here sits in the future of every command run (two streams),
        // and again in each wrapper that holds that future; through the reboot command's it
        // made up most of the agent's 316 KB main future (docs/benchmarks.md).
        let mut chunk = vec![0u8; 8192];
        loop {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    // Drain in big steps so a long output costs O(n), not O(n²).
                    if self.buf.len() > self.keep.saturating_mul(2).max(16 * 1024) {
                        self.cut();
                    }
                }
            }
        }
    }

    fn cut(&mut self) {
        if self.buf.len() > self.keep {
            let cut = self.buf.len() - self.keep;
            self.buf.drain(..cut);
            self.dropped = true;
        }
    }

    fn text(mut self) -> (String, bool) {
        self.cut();
        (
            String::from_utf8_lossy(&self.buf).into_owned(),
            self.dropped,
        )
    }
}

/// Kills the command's process group when dropped, unless [`GroupKill::disarm`]ed: at the
/// time limit, and when the run itself is dropped (the agent stopping).
struct GroupKill(Option<rustix::process::Pid>);

impl GroupKill {
    /// The command exited by itself: what it left running stays.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // First what left the group (found under the leader while it runs), then the
            // group. ESRCH (already gone) is the only expected error, and harmless.
            let leader = u32::try_from(pgid.as_raw_nonzero().get()).unwrap_or(0);
            for pid in protocol::process_tree::descendants(leader) {
                if let Some(p) = i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// How long to wait for the killed command to be reaped: SIGKILL ends it at once unless it
/// sits in an uninterruptible wait (a hung NFS mount); the run must not hang on that.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// The `setpriv` to start a command through so that the kernel kills it when the agent
/// dies, when that is both needed and sound:
/// - not under systemd's service manager (`INVOCATION_ID` unset): there the service's
///   control group is killed with the agent, and the unit's seccomp filter is not something
///   to run a helper into;
/// - on the process's main thread: the signal follows the spawning *thread*, and only the
///   main thread (where the agent's single-threaded runtime runs every task) lives exactly
///   as long as the agent. From any other thread (a test's runtime) no signal is asked for.
fn parent_death_guard() -> Option<&'static std::path::Path> {
    let main_thread = rustix::thread::gettid() == rustix::process::getpid();
    if !main_thread || std::env::var_os("INVOCATION_ID").is_some() {
        return None;
    }
    protocol::process_tree::pdeathsig_helper()
}

/// Runs `argv` under `timeout`, keeping at most `keep` bytes of stdout (its end) and 4 KiB
/// of stderr.
pub async fn run(argv: &[String], timeout: Duration, keep: usize) -> Ran {
    let Some((program, args)) = argv.split_first() else {
        return Ran::NotStarted("empty command".into());
    };
    let mut cmd = match parent_death_guard() {
        Some(helper) => {
            let Some(resolved) = protocol::process_tree::resolve_program(program) else {
                return Ran::NotStarted(format!(
                    "cannot run {program}: not found or not executable"
                ));
            };
            let mut c = tokio::process::Command::new(helper);
            c.args(["--pdeathsig", "KILL", "--"]).arg(resolved);
            c
        }
        None => tokio::process::Command::new(program),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A group of its own (its id is the child's pid), so that the time limit reaches
        // whatever the command forked.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(format!("cannot run {program}: {e}")),
    };
    let mut group = GroupKill(
        child
            .id()
            .and_then(|pid| rustix::process::Pid::from_raw(pid as i32)),
    );
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (mut o, mut e) = (Tail::new(keep), Tail::new(4096));
    // A child the command left running may hold its stdout or stderr open: once the
    // command has exited, what it wrote is read and the rest is not waited for
    // (protocol::process_tree::OUTPUT_AFTER_EXIT).
    let work = protocol::process_tree::wait_reading_output(&mut child, async {
        tokio::join!(o.fill(out), e.fill(err));
    });
    let done = tokio::time::timeout(timeout, work).await;
    if done.is_ok() {
        group.disarm();
    }
    match done {
        Err(_) => {
            // The whole group, then reap the command itself (its children are reparented
            // and reaped by init).
            drop(group);
            let _ = tokio::time::timeout(REAP_TIMEOUT, child.wait()).await;
            Ran::TimedOut
        }
        Ok(Err(e)) => Ran::NotStarted(format!("cannot wait for {program}: {e}")),
        Ok(Ok(st)) => {
            let (stdout, truncated) = o.text();
            let (stderr, _) = e.text();
            Ran::Exited {
                success: st.success(),
                status: st.to_string(),
                stdout,
                stderr,
                truncated,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn output_tail_status_and_timeout() {
        match run(
            &sh("seq 1 100000; echo oops >&2; exit 3"),
            Duration::from_secs(20),
            100,
        )
        .await
        {
            Ran::Exited {
                success,
                status,
                stdout,
                stderr,
                truncated,
            } => {
                assert!(!success);
                assert!(status.contains('3'), "{status}");
                assert!(
                    stdout.len() <= 100 && stdout.ends_with("100000\n"),
                    "{stdout}"
                );
                assert!(truncated);
                assert_eq!(stderr, "oops\n");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            run(&sh("sleep 5"), Duration::from_millis(200), 100).await,
            Ran::TimedOut
        );
        assert!(matches!(
            run(&["/nonexistent/x".to_string()], Duration::from_secs(1), 10).await,
            Ran::NotStarted(_)
        ));
    }

    /// Whether `pid` is gone (or a zombie waiting for init to reap it: dead either way).
    /// The child whose pid the command wrote to `file` is still running (a command that
    /// exited in time keeps the children it left); kills it after the check.
    fn assert_child_alive_then_kill(file: &std::path::Path) {
        let pid = std::fs::read_to_string(file).unwrap();
        let pid = pid.trim().to_string();
        let alive = !dead(&pid);
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        assert!(alive, "a command that exited in time had its child killed");
    }

    fn dead(pid: &str) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // "pid (comm) S ...": the state follows the last ')'.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        }
    }

    #[tokio::test]
    async fn the_time_limit_kills_what_the_command_forked_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", file.display());
        assert_eq!(
            run(&sh(&script), Duration::from_millis(500), 100).await,
            Ran::TimedOut
        );
        let pid = std::fs::read_to_string(&file).unwrap();
        let pid = pid.trim();
        assert!(!pid.is_empty());
        // SIGKILL is delivered at once; give the reparenting and init's reaping a moment.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !dead(pid) && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            dead(pid),
            "the command's child {pid} outlived its time limit"
        );
    }

    #[tokio::test]
    async fn the_time_limit_kills_a_child_that_left_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        let script = format!("setsid sleep 30 & echo $! > {}; wait", file.display());
        assert_eq!(
            run(&sh(&script), Duration::from_millis(500), 100).await,
            Ran::TimedOut
        );
        let pid = std::fs::read_to_string(&file).unwrap();
        let pid = pid.trim();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !dead(pid) && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(dead(pid), "the setsid child {pid} outlived its time limit");
    }

    #[tokio::test]
    async fn a_command_that_exits_in_time_keeps_what_it_left_running() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        let script = format!("sleep 30 >/dev/null 2>&1 & echo $! > {}", file.display());
        assert!(matches!(
            run(&sh(&script), Duration::from_secs(10), 100).await,
            Ran::Exited { success: true, .. }
        ));
        assert_child_alive_then_kill(&file);
    }

    #[tokio::test]
    async fn a_command_that_exits_leaving_a_child_on_its_output_is_done_not_timed_out() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        // The child inherits stdout and stderr and keeps them open past the command's exit.
        let script = format!("echo started; sleep 30 & echo $! > {}", file.display());
        let started = std::time::Instant::now();
        let ran = run(&sh(&script), Duration::from_secs(10), 100).await;
        let Ran::Exited {
            success: true,
            stdout,
            ..
        } = ran
        else {
            panic!("{ran:?}");
        };
        assert_eq!(stdout, "started\n");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited for the child"
        );
        assert_child_alive_then_kill(&file);
    }
}
