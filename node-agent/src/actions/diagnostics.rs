//! `collect-diagnostics`: what an operator wants to read after a repair destroyed the
//! evidence. The journal of the kubelet and container runtime units, the kernel log tail,
//! the details of failing checks, the mount table and the NIC counters, each gathered
//! independently (one that cannot be read says why instead) and cut to fit a total limit.
//!
//! Collecting is read-only: a resent request collects afresh instead of keeping a bundle
//! in memory.

use std::path::Path;
use std::time::Duration;

use protocol::actions::{DiagnosticsBundle, DiagnosticsPart, TRUNCATED_MARKER};
use protocol::messages::{CheckResult, CheckStatus};

use super::config::ActionsConfig;
use super::exec::{self, Ran};
use crate::checks::under_root;

/// Time limit of each diagnostics command: `journalctl` with a line limit answers in well
/// under a second; 10 s covers a slow disk without holding the coordinator's step long.
const PART_TIMEOUT: Duration = Duration::from_secs(10);

/// Gathers the parts and cuts them to `cfg.diagnostics_max_bytes` in total.
pub async fn collect(
    cfg: &ActionsConfig,
    root: &Path,
    checks: &[CheckResult],
) -> DiagnosticsBundle {
    let max = cfg.diagnostics_max_bytes;
    let timeout = PART_TIMEOUT.min(cfg.command_timeout);
    let mut parts: Vec<(String, String)> = Vec::new();
    for unit in &cfg.journal_units {
        let mut argv = cfg.journal_command.clone();
        argv.push(unit.clone());
        parts.push((
            format!("journal {unit}"),
            command_text(&argv, timeout, max).await,
        ));
    }
    parts.push((
        "kernel log".into(),
        command_text(&cfg.kernel_log_command, timeout, max).await,
    ));
    parts.push(("failing checks".into(), failing_checks(checks)));
    parts.push((
        "mounts".into(),
        read_file(root, "/proc/self/mountinfo", max),
    ));
    parts.push(("nic counters".into(), read_file(root, "/proc/net/dev", max)));
    fit(parts, max)
}

async fn command_text(argv: &[String], timeout: Duration, keep: usize) -> String {
    match exec::run(argv, timeout, keep).await {
        Ran::Exited {
            success: true,
            stdout,
            ..
        } => stdout,
        Ran::Exited {
            status,
            stdout,
            stderr,
            ..
        } => format!(
            "(`{}` ended with {status}; stderr: {})\n{stdout}",
            argv.join(" "),
            stderr.trim()
        ),
        Ran::TimedOut => format!("({} timed out after {timeout:?})\n", argv.join(" ")),
        Ran::NotStarted(e) => format!("({e})\n"),
    }
}

fn failing_checks(checks: &[CheckResult]) -> String {
    let mut out = String::new();
    for c in checks.iter().filter(|c| c.status != CheckStatus::Ok) {
        out.push_str(&format!(
            "{} {} {}: {}\n",
            c.kind.as_str(),
            c.subject,
            c.status.as_str(),
            c.detail
        ));
    }
    if out.is_empty() {
        out.push_str("(no failing or warning checks in the last round)\n");
    }
    out
}

fn read_file(root: &Path, node_path: &str, keep: usize) -> String {
    let path = under_root(root, node_path);
    match std::fs::read(&path) {
        Ok(mut b) => {
            b.truncate(keep.saturating_mul(2));
            String::from_utf8_lossy(&b).into_owned()
        }
        Err(e) => format!("(cannot read {}: {e})\n", path.display()),
    }
}

/// Shares `max` bytes among the parts: small parts keep everything, and what they leave is
/// shared by the larger ones. A cut part keeps its end (a log's newest lines), after
/// [`TRUNCATED_MARKER`].
pub fn fit(parts: Vec<(String, String)>, max: usize) -> DiagnosticsBundle {
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| parts[i].1.len());
    let mut caps = vec![0usize; parts.len()];
    let mut left = max;
    for (k, &i) in order.iter().enumerate() {
        let share = left / (parts.len() - k);
        caps[i] = parts[i].1.len().min(share);
        left -= caps[i];
    }
    let parts = parts
        .into_iter()
        .zip(caps)
        .map(|((name, content), cap)| {
            if content.len() <= cap {
                return DiagnosticsPart {
                    name,
                    content,
                    truncated: false,
                };
            }
            let room = cap.saturating_sub(TRUNCATED_MARKER.len());
            let mut start = content.len() - room;
            while !content.is_char_boundary(start) {
                start += 1;
            }
            let mut cut = String::with_capacity(cap);
            cut.push_str(&TRUNCATED_MARKER[..TRUNCATED_MARKER.len().min(cap)]);
            cut.push_str(&content[start..]);
            DiagnosticsPart {
                name,
                content: cut,
                truncated: true,
            }
        })
        .collect();
    DiagnosticsBundle {
        parts,
        limit_bytes: max as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_stay_whole_and_large_ones_share_the_rest_keeping_their_end() {
        let parts = vec![
            ("big".to_string(), format!("{}END", "x".repeat(5000))),
            ("small".to_string(), "tiny".to_string()),
            ("mid".to_string(), "é".repeat(300)),
        ];
        let b = fit(parts, 1000);
        assert!(b.total_bytes() <= 1000, "{}", b.total_bytes());
        let small = &b.parts[1];
        assert_eq!((small.content.as_str(), small.truncated), ("tiny", false));
        let big = &b.parts[0];
        assert!(big.truncated && big.content.starts_with(TRUNCATED_MARKER));
        assert!(big.content.ends_with("END"));
        // Multi-byte text is cut on a character boundary and still marked.
        assert!(b.parts[2].truncated, "600 bytes of é exceed their share");
        assert_eq!(b.limit_bytes, 1000);
    }

    #[tokio::test]
    async fn collect_names_every_part_and_stays_under_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/net")).unwrap();
        std::fs::write(dir.path().join("proc/net/dev"), "eth0: 1 2 3\n").unwrap();
        let cfg = ActionsConfig {
            journal_units: vec!["kubelet".into()],
            journal_command: vec!["sh".into(), "-c".into(), "seq 1 50000; echo unit=$0".into()],
            kernel_log_command: vec!["sh".into(), "-c".into(), "echo oops; exit 1".into()],
            diagnostics_max_bytes: 4096,
            ..ActionsConfig::default()
        };
        let checks = vec![CheckResult {
            kind: protocol::messages::CheckKind::Kubelet,
            subject: "kubelet".into(),
            status: CheckStatus::Fail,
            detail: "healthz 500".into(),
        }];
        let b = collect(&cfg, dir.path(), &checks).await;
        let names: Vec<&str> = b.parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "journal kubelet",
                "kernel log",
                "failing checks",
                "mounts",
                "nic counters"
            ]
        );
        assert!(b.total_bytes() <= 4096);
        assert!(b.parts[0].truncated && b.parts[0].content.ends_with("unit=kubelet\n"));
        assert!(
            b.parts[1].content.contains("ended with exit status: 1"),
            "{:?}",
            b.parts[1]
        );
        assert!(b.parts[2].content.contains("healthz 500"));
        assert!(b.parts[3].content.contains("cannot read"));
        assert_eq!(b.parts[4].content, "eth0: 1 2 3\n");
    }
}
