//! The processes under a process, for killing a timed-out command with everything it
//! started: its process group catches what it forked, but not a child that left the group
//! on purpose (`setsid`, a daemonizing helper). Read from Linux's
//! `/proc/<pid>/task/<tid>/children` while the command still runs; a child whose parent
//! already exited has been reparented and is not found here.

/// Most processes collected: a fork bomb under a command must not make the kill itself
/// run away.
const MOST: usize = 4096;

/// Every descendant of `pid` (children, their children, …), not `pid` itself; empty when
/// `pid` is gone or the kernel does not say.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in text
                .split_whitespace()
                .filter_map(|s| s.parse::<u32>().ok())
            {
                if found.len() < MOST && !found.contains(&child) {
                    found.push(child);
                    next.push(child);
                }
            }
        }
    }
    found
}

/// How long a command's output is still read once the command has exited. What it wrote is
/// in the pipe already and read at once; a child it left running (`tool &`, a daemon a
/// restart script started) may hold the pipe open for ever, and its output is not the
/// command's.
#[cfg(feature = "transport")]
pub const OUTPUT_AFTER_EXIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits for `child` to exit while `read` reads its stdout and stderr; once it has exited,
/// `read` gets [`OUTPUT_AFTER_EXIT`] more and is then dropped, so a child the command left
/// running with its output open neither holds the caller until its time limit nor makes a
/// command that ended look timed out. (Behind the `transport` feature, which brings tokio.)
#[cfg(feature = "transport")]
pub async fn wait_reading_output(
    child: &mut tokio::process::Child,
    read: impl std::future::Future<Output = ()>,
) -> std::io::Result<std::process::ExitStatus> {
    let (exited_tx, exited_rx) = tokio::sync::oneshot::channel::<()>();
    let waiting = async {
        let status = child.wait().await;
        let _ = exited_tx.send(());
        status
    };
    let reading = async {
        tokio::select! {
            _ = read => {}
            _ = async {
                let _ = exited_rx.await;
                tokio::time::sleep(OUTPUT_AFTER_EXIT).await;
            } => {}
        }
    };
    tokio::join!(waiting, reading).0
}

/// Finds `program` as `execvp` would (a path as given, else along `PATH`), so that a
/// missing program is reported as such before it is started through a helper (whose exit
/// status would otherwise stand for it).
pub fn resolve_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = std::path::PathBuf::from(program);
        return runnable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
}

/// `setpriv` from util-linux, when it is installed and knows `--pdeathsig`; looked up once.
///
/// Why a helper program: the parent-death signal (`PR_SET_PDEATHSIG`) must be set by the
/// child itself, between `fork` and `exec`. The workspace forbids `unsafe`, and
/// `CommandExt::pre_exec` is unsafe; `setpriv --pdeathsig KILL -- CMD` sets it and then
/// execs the command, keeping the pid (so a recorded process group stays the command's).
/// The kernel sends the signal when the *thread* that spawned the child ends, and only to
/// the command's first process: callers spawn from threads that live as long as they do,
/// and keep their own defences for what the command forked.
pub fn pdeathsig_helper() -> Option<&'static std::path::Path> {
    static HELPER: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    HELPER
        .get_or_init(|| {
            ["/usr/bin/setpriv", "/bin/setpriv"]
                .into_iter()
                .map(std::path::PathBuf::from)
                .find(|p| {
                    std::process::Command::new(p)
                        .arg("--help")
                        .stdin(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--pdeathsig"))
                })
        })
        .as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_left_the_process_group_is_still_found() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut under = descendants(sh.id());
        while under.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            under = descendants(sh.id());
        }
        assert_eq!(under.len(), 2, "{under:?}");
        for pid in &under {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(descendants(u32::MAX).is_empty());
    }
}
