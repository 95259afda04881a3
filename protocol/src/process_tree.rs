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
