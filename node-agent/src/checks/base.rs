//! What every check, and the node facts of the agent's hello, share: where a node path lives
//! under the root, reading a small sysfs or procfs file, and building a result.

use std::path::{Path, PathBuf};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

/// `<root><node_path>`: where a node path such as `/sys/class/net` lives under `root`.
pub fn under_root(root: &Path, node_path: &str) -> PathBuf {
    root.join(node_path.trim_start_matches('/'))
}

/// Reads a small sysfs/procfs file and trims it.
pub(crate) fn read_trimmed(path: &Path) -> std::io::Result<String> {
    // Not `fs::read_to_string`: its size probe (a `statx` per file) is wasted on sysfs and
    // procfs, which report 4096 or 0; one `pread` holds any of these files.
    super::kept::read_path_trimmed(path)
}

/// Builds a result.
pub fn result(
    kind: CheckKind,
    subject: &str,
    status: CheckStatus,
    detail: impl Into<String>,
) -> CheckResult {
    CheckResult {
        kind,
        subject: subject.to_string(),
        status,
        detail: detail.into(),
    }
}
