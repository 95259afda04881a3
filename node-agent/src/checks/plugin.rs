//! Plugin checks (`[[checks.exec]]`): programs that follow node-problem-detector's custom
//! plugin contract, so a fleet's existing NPD plugin scripts run unchanged.
//!
//! The contract: exit 0 is OK, 1 a problem, 2 unknown; the first line of stdout is the
//! message. Here a message is cut at [`MESSAGE_MAX`] bytes; any other exit status, a signal
//! and the time limit are `unknown` with the reason. Exit 1 is `fail` for a check of
//! severity `problem` and `warn` for `warning`.
//!
//! Bounded: one run of each check at a time, at most `max_concurrent` runs at once, each
//! in a process group of its own that is killed at the time limit (with any descendant that
//! left the group) and when the run ends (a check has no business leaving processes
//! behind). No shell runs unless the configured program is one. stdin is closed and stderr
//! discarded, as NPD does.
//!
//! Runs happen in the background on each check's own interval; a report carries each
//! check's latest result. Only the first round waits for a check's first run, so the first
//! report already says something about it.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::config::{ChecksConfig, ExecCheck, Severity};
use super::result;

/// A plugin's message (its first line of stdout) is cut here. NPD's own default
/// (`max_output_length`) is 80; 256 bytes keeps what longer scripts say and still costs
/// little in every report.
pub const MESSAGE_MAX: usize = 256;

/// How much of stdout is looked at for the first line; the rest is read and dropped so a
/// chatty script never blocks on a full pipe.
const STDOUT_KEPT: usize = 4096;

/// How long a killed plugin may take to be reaped: SIGKILL ends it at once unless it sits
/// in an uninterruptible wait (a hung NFS mount); the check must not hang on that.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Kills a run's process group (and what left it) when dropped.
struct Group(Option<rustix::process::Pid>);

impl Drop for Group {
    fn drop(&mut self) {
        let Some(pgid) = self.0.take() else { return };
        let leader = u32::try_from(pgid.as_raw_nonzero().get()).unwrap_or(0);
        for pid in protocol::process_tree::descendants(leader) {
            if let Some(p) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        // ESRCH (the group is empty) is the usual and harmless answer.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

/// Runs `check` once and judges it by the contract.
pub async fn run_once(check: &ExecCheck) -> CheckResult {
    let r = |s, d: String| result(CheckKind::Plugin, &check.name, s, d);
    let program = &check.argv[0];
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&check.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return r(CheckStatus::Unknown, format!("cannot run {program}: {e}")),
    };
    let group = Group(
        child
            .id()
            .and_then(|pid| rustix::process::Pid::from_raw(pid as i32)),
    );
    let mut out = child.stdout.take();
    let mut kept = Vec::new();
    let read = async {
        let Some(o) = out.as_mut() else { return };
        let mut chunk = [0u8; 1024];
        loop {
            match o.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = STDOUT_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    };
    let work = protocol::process_tree::wait_reading_output(&mut child, read);
    let done = tokio::time::timeout(check.timeout, work).await;
    let status = match done {
        Err(_) => {
            drop(group);
            let _ = tokio::time::timeout(REAP_TIMEOUT, child.wait()).await;
            return r(
                CheckStatus::Unknown,
                format!(
                    "timed out after {}; its process group was killed",
                    protocol::duration::display(check.timeout)
                ),
            );
        }
        Ok(Err(e)) => {
            return r(
                CheckStatus::Unknown,
                format!("cannot wait for {program}: {e}"),
            );
        }
        Ok(Ok(s)) => s,
    };
    // Whatever the plugin left in its group goes with it.
    drop(group);
    let message = first_line(&kept);
    let said = |what: &str| {
        if message.is_empty() {
            format!("{what} (no output)")
        } else {
            message.clone()
        }
    };
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => r(CheckStatus::Ok, said("ok")),
        (Some(1), _) => {
            let s = match check.severity {
                Severity::Problem => CheckStatus::Fail,
                Severity::Warning => CheckStatus::Warn,
            };
            r(s, said("problem"))
        }
        (Some(2), _) => r(
            CheckStatus::Unknown,
            format!("unknown (exit 2): {}", said("no message")),
        ),
        (Some(n), _) => r(
            CheckStatus::Unknown,
            format!(
                "exit status {n}, which the plugin contract does not define (0 ok, 1 problem, \
                 2 unknown): {}",
                said("no message")
            ),
        ),
        (None, Some(sig)) => r(
            CheckStatus::Unknown,
            format!("killed by signal {sig}: {}", said("no message")),
        ),
        (None, None) => r(CheckStatus::Unknown, format!("ended with {status}")),
    }
}

/// The first line of `out`, trimmed and cut at [`MESSAGE_MAX`] bytes.
fn first_line(out: &[u8]) -> String {
    let line = out.split(|&b| b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    super::gpu::cut(text.trim(), MESSAGE_MAX).to_string()
}

/// One configured check and its latest result.
#[derive(Debug)]
struct Slot {
    check: Arc<ExecCheck>,
    last: Arc<Mutex<Option<CheckResult>>>,
    running: Option<JoinHandle<()>>,
    next_due: Instant,
}

/// The plugin checks of a configuration, run on their intervals.
#[derive(Debug)]
pub struct Plugins {
    slots: Vec<Slot>,
    limit: Arc<Semaphore>,
}

impl Drop for Plugins {
    /// A run still going when its checker is replaced (a reload) or the agent stops is
    /// ended, and its process group killed with it.
    fn drop(&mut self) {
        for s in &self.slots {
            if let Some(h) = &s.running {
                h.abort();
            }
        }
    }
}

impl Plugins {
    /// The checks of `cfg`, none run yet.
    pub fn new(cfg: &ChecksConfig) -> Self {
        let now = Instant::now();
        Self {
            slots: cfg
                .exec
                .iter()
                .map(|c| Slot {
                    check: Arc::new(c.clone()),
                    last: Arc::new(Mutex::new(None)),
                    running: None,
                    next_due: now,
                })
                .collect(),
            limit: Arc::new(Semaphore::new(cfg.max_concurrent)),
        }
    }

    /// Whether any check is configured.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Starts every check that is due and not running, waits for the first run of those
    /// that never ran, and returns each check's latest result in configuration order.
    pub async fn poll(&mut self) -> Vec<CheckResult> {
        let now = Instant::now();
        for s in &mut self.slots {
            if s.running.as_ref().is_some_and(|h| h.is_finished()) {
                s.running = None;
            }
            if s.running.is_none() && now >= s.next_due {
                s.next_due = now + s.check.interval;
                let (check, last, limit) = (s.check.clone(), s.last.clone(), self.limit.clone());
                s.running = Some(tokio::spawn(async move {
                    let Ok(_permit) = limit.acquire().await else {
                        return;
                    };
                    let r = run_once(&check).await;
                    *last.lock().expect("plugin result lock") = Some(r);
                }));
            }
        }
        let mut out = Vec::with_capacity(self.slots.len());
        for s in &mut self.slots {
            let never = s.last.lock().expect("plugin result lock").is_none();
            if never && let Some(h) = s.running.take() {
                let _ = h.await;
            }
            let last = s.last.lock().expect("plugin result lock").clone();
            out.push(last.unwrap_or_else(|| {
                result(
                    CheckKind::Plugin,
                    &s.check.name,
                    CheckStatus::Unknown,
                    "not run yet",
                )
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(script: &str, timeout: Duration) -> ExecCheck {
        ExecCheck {
            name: "t".into(),
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            interval: Duration::from_secs(30),
            timeout,
            severity: Severity::Problem,
        }
    }

    async fn run(script: &str) -> CheckResult {
        run_once(&check(script, Duration::from_secs(10))).await
    }

    #[tokio::test]
    async fn the_npd_contract() {
        let r = run("echo 'NTP is in sync'; echo second line; exit 0").await;
        assert_eq!(
            (r.kind, r.subject.as_str(), r.status),
            (CheckKind::Plugin, "t", CheckStatus::Ok)
        );
        assert_eq!(r.detail, "NTP is in sync");
        let r = run("echo 'NTP is not in sync'; exit 1").await;
        assert_eq!(
            (r.status, r.detail.as_str()),
            (CheckStatus::Fail, "NTP is not in sync")
        );
        let mut w = check("echo drifting; exit 1", Duration::from_secs(10));
        w.severity = Severity::Warning;
        assert_eq!(run_once(&w).await.status, CheckStatus::Warn);
        let r = run("echo 'cannot tell'; exit 2").await;
        assert_eq!(
            (r.status, r.detail.as_str()),
            (CheckStatus::Unknown, "unknown (exit 2): cannot tell")
        );
        let r = run("exit 3").await;
        assert_eq!(r.status, CheckStatus::Unknown);
        assert!(
            r.detail.contains("exit status 3") && r.detail.contains("does not define"),
            "{r:?}"
        );
        let r = run("kill -TERM $$").await;
        assert!(r.detail.starts_with("killed by signal 15"), "{r:?}");
        let r = run("exit 1").await;
        assert_eq!(
            (r.status, r.detail.as_str()),
            (CheckStatus::Fail, "problem (no output)")
        );
        let r = run(&format!("printf '%0{}d\\n' 0; exit 0", MESSAGE_MAX * 4)).await;
        assert_eq!(r.detail.len(), MESSAGE_MAX);
        let r = run("yes | head -c 10000000; exit 0").await;
        assert_eq!(
            (r.status, r.detail.as_str()),
            (CheckStatus::Ok, "y"),
            "a chatty plugin is read to its end"
        );
        let nope = ExecCheck {
            argv: vec!["/nonexistent/plugin.sh".into()],
            ..check("", Duration::from_secs(1))
        };
        let r = run_once(&nope).await;
        assert_eq!(r.status, CheckStatus::Unknown);
        assert!(
            r.detail.contains("cannot run /nonexistent/plugin.sh"),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_unknown_and_its_process_group_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let script = format!(
            "sleep 300 & echo $! > {p}; setsid sleep 300 & echo $! >> {p}; echo started; wait",
            p = pids.display()
        );
        let t = Instant::now();
        let r = run_once(&check(&script, Duration::from_millis(500))).await;
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(r.status, CheckStatus::Unknown);
        assert!(
            r.detail
                .starts_with("timed out after 500ms; its process group was killed"),
            "{r:?}"
        );
        let text = std::fs::read_to_string(&pids).unwrap();
        for pid in text.split_whitespace() {
            let gone = (0..100).any(|_| {
                let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // Gone, or a zombie waiting for init.
                let dead = st.is_empty()
                    || st
                        .rsplit(')')
                        .next()
                        .is_some_and(|s| s.trim_start().starts_with('Z'));
                if !dead {
                    std::thread::sleep(Duration::from_millis(20));
                }
                dead
            });
            assert!(gone, "process {pid} outlived the plugin's time limit");
        }
    }

    #[tokio::test]
    async fn one_run_at_a_time_and_at_most_max_concurrent() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut cfg = ChecksConfig {
            max_concurrent: 2,
            ..ChecksConfig::default()
        };
        for i in 0..4 {
            cfg.exec.push(ExecCheck {
                name: format!("c{i}"),
                interval: Duration::from_millis(10),
                // Each run notes its start and end; at most two may overlap.
                ..check(
                    &format!(
                        "echo start >> {l}; sleep 0.2; echo end >> {l}; echo ok",
                        l = log.display()
                    ),
                    Duration::from_secs(5),
                )
            });
        }
        let mut p = Plugins::new(&cfg);
        let first = p.poll().await;
        assert!(
            first.iter().all(|r| r.status == CheckStatus::Ok),
            "{first:?}"
        );
        // Polled again at once: the second runs start in the background, and a check still
        // running is not started twice.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let again = p.poll().await;
        assert_eq!(again.len(), 4);
        let _ = p.poll().await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let text = std::fs::read_to_string(&log).unwrap();
        let (mut now, mut most) = (0i32, 0i32);
        for l in text.lines() {
            now += if l == "start" { 1 } else { -1 };
            most = most.max(now);
        }
        assert_eq!(most, 2, "{text}");
        assert_eq!(text.lines().filter(|l| *l == "start").count(), 8, "{text}");
    }
}
