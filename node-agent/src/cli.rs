//! Output of `node-agent check`: a table for an operator at the console, or JSON for
//! scripts. Pure formatting; running the checks is the caller's job.

use protocol::messages::{CheckResult, CheckStatus};
use serde::Serialize;

use crate::agent::preflight::SetupRow;

/// The JSON document `node-agent check --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct CheckOutput<'a> {
    /// This node's hostname.
    pub hostname: &'a str,
    /// True when no check failed.
    pub healthy: bool,
    /// Whether `node-agent run` would start (its TLS files, its coordinator setting) and
    /// whether the actions it allows would be carried out: not health, but why it could not
    /// report or repair.
    pub setup: &'a [SetupRow],
    /// Every result, in check order.
    pub checks: &'a [CheckResult],
}

/// True when no check failed (`warn` and `unknown` do not fail `check`).
pub fn healthy(results: &[CheckResult]) -> bool {
    results.iter().all(|c| c.status != CheckStatus::Fail)
}

/// A left-aligned table with a header: KIND, SUBJECT, STATUS, DETAIL; the `setup` lines
/// first, then the checks.
pub fn table(setup: &[SetupRow], results: &[CheckResult]) -> String {
    let head = ["KIND", "SUBJECT", "STATUS", "DETAIL"];
    let rows: Vec<[&str; 4]> = setup
        .iter()
        .map(|r| {
            [
                r.kind,
                r.subject.as_str(),
                r.status.as_str(),
                r.detail.as_str(),
            ]
        })
        .chain(results.iter().map(|c| {
            [
                c.kind.as_str(),
                c.subject.as_str(),
                c.status.as_str(),
                c.detail.as_str(),
            ]
        }))
        .collect();
    let mut w = [0usize; 3];
    for r in std::iter::once(&head).chain(rows.iter()) {
        for i in 0..3 {
            w[i] = w[i].max(r[i].chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&head).chain(rows.iter()) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if results.is_empty() {
        out.push_str("(no checks configured)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::result;
    use protocol::messages::CheckKind;

    #[test]
    fn table_aligns_columns_and_json_has_lowercase_names() {
        let rs = vec![
            result(CheckKind::Kubelet, "kubelet", CheckStatus::Ok, "healthz ok"),
            result(CheckKind::Nic, "eth0", CheckStatus::Fail, "no carrier"),
        ];
        let t = table(&[], &rs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "KIND     SUBJECT  STATUS  DETAIL");
        assert_eq!(lines[2], "nic      eth0     fail    no carrier");
        assert!(!healthy(&rs));
        let js = serde_json::to_value(CheckOutput {
            hostname: "n1",
            healthy: healthy(&rs),
            setup: &[],
            checks: &rs,
        })
        .unwrap();
        assert_eq!(js["checks"][1]["status"], "fail");
        assert_eq!(js["checks"][1]["kind"], "nic");
        assert_eq!(js["healthy"], false);
        assert!(healthy(&rs[..1]));
        assert!(table(&[], &[]).contains("no checks"));
    }
}
