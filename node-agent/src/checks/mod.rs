//! The health checks. Each check is a function over the node's root directory (and, for
//! kubelet, an HTTP endpoint) that returns [`CheckResult`]s; [`Checker`] runs the configured
//! set in a fixed order and keeps the little state checks need between rounds (the last
//! carrier change counters, for flaps, and the sysfs files read every round, open: see
//! `kept`).
//!
//! Checks never fail as a whole: an unreadable file is a `fail` or `unknown` result with the
//! path in its detail, so one broken subsystem cannot hide the others. They deliberately do
//! not decide whether the machine should be repaired; the coordinator does.

pub mod disk;
pub mod kdump;
pub(crate) mod kept;
pub mod kubelet;
pub mod nic;

use std::path::{Path, PathBuf};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use crate::config::Config;

/// `<root><node_path>`: where a node path such as `/sys/class/net` lives under `root`.
pub fn under_root(root: &Path, node_path: &str) -> PathBuf {
    root.join(node_path.trim_start_matches('/'))
}

/// Reads a small sysfs/procfs file and trims it.
pub(crate) fn read_trimmed(path: &Path) -> std::io::Result<String> {
    // Not `fs::read_to_string`: its size probe (a `statx` per file) is wasted on sysfs and
    // procfs, which report 4096 or 0; one `pread` holds any of these files.
    kept::read_path_trimmed(path)
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

/// Runs the configured checks; owns the state kept between rounds.
pub struct Checker {
    root: PathBuf,
    nics: Vec<String>,
    mounts: Vec<crate::config::MountConfig>,
    kdump: bool,
    kubelet: Option<kubelet::KubeletClient>,
    nic_tracker: nic::NicTracker,
    kdump_files: kdump::KdumpFiles,
    fs: Box<dyn disk::FsStats>,
    mount_table: disk::MountTable,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("root", &self.root)
            .field("nics", &self.nics)
            .field("mounts", &self.mounts)
            .field("kdump", &self.kdump)
            .field("kubelet", &self.kubelet)
            .finish_non_exhaustive()
    }
}

impl Checker {
    /// A checker for `cfg`, reading filesystem usage with statvfs.
    pub fn new(cfg: &Config) -> Self {
        Self::with_fs(cfg, Box::new(disk::Statvfs))
    }

    /// A checker with another [`disk::FsStats`] (tests).
    pub fn with_fs(cfg: &Config, fs: Box<dyn disk::FsStats>) -> Self {
        let kubelet = cfg.kubelet.url.as_ref().map(|u| {
            kubelet::KubeletClient::new(
                kubelet::HttpUrl::parse(u).expect("kubelet URL validated with the config"),
                cfg.kubelet.timeout,
            )
        });
        Self {
            root: cfg.root.clone(),
            nics: cfg.nics.clone(),
            mounts: cfg.mounts.clone(),
            kdump: cfg.kdump,
            kubelet,
            nic_tracker: nic::NicTracker::default(),
            kdump_files: kdump::KdumpFiles::new(&cfg.root),
            fs,
            mount_table: disk::MountTable::new(&cfg.root),
        }
    }

    /// Runs every check once: kubelet, NICs, mounts, kdump, in that order.
    pub async fn run(&mut self) -> Vec<CheckResult> {
        let mut out = Vec::with_capacity(2 + self.nics.len() + self.mounts.len());
        if let Some(k) = &mut self.kubelet {
            out.push(k.check().await);
        }
        for n in &self.nics {
            out.push(nic::check(&self.root, n, &mut self.nic_tracker));
        }
        if !self.mounts.is_empty() {
            out.extend(self.mount_table.check(&self.mounts, self.fs.as_ref()));
        }
        if self.kdump {
            out.push(self.kdump_files.check());
        }
        out
    }
}
