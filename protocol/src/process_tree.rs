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
