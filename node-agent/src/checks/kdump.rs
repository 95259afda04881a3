//! kdump check: the crash kernel is loaded (`<root>/sys/kernel/kexec_crash_loaded` is 1)
//! and crash memory is reserved (`<root>/sys/kernel/kexec_crash_size` > 0).
//!
//! Without both, a kernel panic leaves no dump and the coordinator cannot wait for one.
//! Whether a dump is in progress is reported from the kdump initramfs, not here.

use std::path::Path;

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::kept::KeptFile;
use super::{result, under_root};

/// Subject of the kdump result.
pub const SUBJECT: &str = "kdump";

/// The two files, kept open between rounds (see `checks::kept`).
#[derive(Debug)]
pub struct KdumpFiles {
    loaded: KeptFile,
    size: KeptFile,
}

impl KdumpFiles {
    /// The files under `root`, opened on the first check.
    pub fn new(root: &Path) -> Self {
        Self {
            loaded: KeptFile::new(under_root(root, "/sys/kernel/kexec_crash_loaded")),
            size: KeptFile::new(under_root(root, "/sys/kernel/kexec_crash_size")),
        }
    }

    /// Reads both files and judges them.
    pub fn check(&mut self) -> CheckResult {
        let r = |s, d: String| result(CheckKind::Kdump, SUBJECT, s, d);
        let loaded = match self.loaded.read_trimmed() {
            Ok(s) => s,
            Err(e) => {
                return r(
                    CheckStatus::Fail,
                    format!(
                        "cannot read {}: {e} (kernel without kexec?)",
                        self.loaded.path().display()
                    ),
                );
            }
        };
        let size: Option<u64> = self.size.read_trimmed().ok().and_then(|s| s.parse().ok());
        judge(&loaded, size)
    }
}

/// Reads both files by path and judges them.
pub fn check(root: &Path) -> CheckResult {
    KdumpFiles::new(root).check()
}

/// Judges `kexec_crash_loaded` and `kexec_crash_size`. Pure.
fn judge(loaded: &str, size: Option<u64>) -> CheckResult {
    let r = |s, d: String| result(CheckKind::Kdump, SUBJECT, s, d);
    match (loaded, size) {
        ("1", Some(n)) if n > 0 => r(
            CheckStatus::Ok,
            format!("crash kernel loaded, {} MiB reserved", n >> 20),
        ),
        ("1", _) => r(
            CheckStatus::Fail,
            "crash kernel loaded but no crash memory reserved (crashkernel= missing?)".into(),
        ),
        (_, Some(n)) if n > 0 => r(
            CheckStatus::Fail,
            format!(
                "crash memory reserved ({} MiB) but no crash kernel loaded",
                n >> 20
            ),
        ),
        _ => r(
            CheckStatus::Fail,
            "no crash kernel loaded and no crash memory reserved".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::NodeFixture;

    #[test]
    fn loaded_with_memory_is_ok() {
        let f = NodeFixture::builder("n").build().unwrap();
        let r = check(f.root());
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        assert!(r.detail.contains("256 MiB"), "{r:?}");
    }

    #[test]
    fn unloaded_fails_and_reload_recovers() {
        let f = NodeFixture::builder("n")
            .kdump_loaded(false)
            .build()
            .unwrap();
        let r = check(f.root());
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("no crash kernel loaded"), "{r:?}");
        f.set_kdump_loaded(true).unwrap();
        assert_eq!(check(f.root()).status, CheckStatus::Ok);
    }

    #[test]
    fn kept_files_see_each_change() {
        let f = NodeFixture::builder("n").build().unwrap();
        let mut k = KdumpFiles::new(f.root());
        assert_eq!(k.check().status, CheckStatus::Ok);
        f.set_kdump_loaded(false).unwrap();
        assert_eq!(k.check().status, CheckStatus::Fail);
        std::fs::remove_file(f.path_of("sys/kernel/kexec_crash_loaded")).unwrap();
        assert!(k.check().detail.contains("cannot read"));
        f.set_kdump_loaded(true).unwrap();
        assert_eq!(k.check().status, CheckStatus::Ok);
    }

    #[test]
    fn no_reserved_memory_fails() {
        let f = NodeFixture::builder("n").build().unwrap();
        f.write("sys/kernel/kexec_crash_size", "0\n").unwrap();
        let r = check(f.root());
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("no crash memory"), "{r:?}");
    }

    #[test]
    fn missing_files_fail_with_the_path() {
        let f = NodeFixture::builder("n").build().unwrap();
        std::fs::remove_file(f.path_of("sys/kernel/kexec_crash_loaded")).unwrap();
        let r = check(f.root());
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("kexec_crash_loaded"), "{r:?}");
    }
}
