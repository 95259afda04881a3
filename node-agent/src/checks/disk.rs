//! Disk check: for each required mount, that it is mounted, read-write when it should be,
//! and that free space and free inodes are above the configured thresholds (statvfs of
//! `<root><mountpoint>`).
//!
//! The mount table is read from `<root>/proc/self/mountinfo` when present, else
//! `<root>/proc/mounts`, else `<root>/proc/self/mounts`. mountinfo is preferred because it
//! separates the filesystem's own (super block) options from the per-mount ones: under the
//! unit's `ProtectSystem=strict`, systemd bind-remounts everything read-only *in the
//! agent's mount namespace*, which `/proc/mounts` shows as `ro` on every mount. The super
//! block's `ro` is what a filesystem remounted read-only after I/O errors
//! (`errors=remount-ro`) sets, so that is what is judged. With `/proc/mounts` only, the
//! mount's `ro` option is used.
//!
//! The table is kept between cycles ([`MountTable`]) and re-read only when it may have
//! changed: procfs's mountinfo reports `POLLPRI | POLLERR` to `poll(2)` after any mount,
//! unmount or remount in the namespace. A filesystem that the kernel turns read-only after
//! errors raises no such event, so a kept entry is trusted only while statvfs's `ST_RDONLY`
//! agrees with it, which it can judge only for a mount whose own options are `rw`
//! (`ST_RDONLY` is the mount's flag or the super block's): for a mount bind-remounted
//! read-only (`ProtectSystem=strict`), a statvfs error, or a table that is not procfs's (a
//! fixture tree, `/proc/mounts`), the table is read every cycle, as before.
//!
//! A filesystem gone read-only after I/O errors is the classic silent failure this catches.
//! The check deliberately does not read kernel logs or SMART data.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::{result, under_root};
use crate::config::MountConfig;

/// Space and inode counts of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    /// Total blocks.
    pub blocks: u64,
    /// Blocks available to unprivileged users.
    pub blocks_avail: u64,
    /// Total inodes (0 when the filesystem has no fixed inode table, e.g. btrfs).
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
    /// `ST_RDONLY`: the mount or its filesystem is read-only.
    pub read_only: bool,
}

/// Filesystem usage, the one external system of this check.
pub trait FsStats: Send + Sync {
    /// Usage of the filesystem holding `path`.
    fn usage(&self, path: &Path) -> io::Result<FsUsage>;
}

/// The real [`FsStats`]: the statvfs system call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Statvfs;

impl FsStats for Statvfs {
    fn usage(&self, path: &Path) -> io::Result<FsUsage> {
        let s = rustix::fs::statvfs(path)?;
        Ok(FsUsage {
            blocks: s.f_blocks,
            blocks_avail: s.f_bavail,
            files: s.f_files,
            files_free: s.f_ffree,
            read_only: s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
        })
    }
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Source device.
    pub device: String,
    /// Mount point (octal escapes decoded).
    pub mountpoint: String,
    /// Filesystem type.
    pub fstype: String,
    /// Whether the filesystem is read-only: the super block's `ro` (mountinfo), else the
    /// mount's.
    pub read_only: bool,
    /// Whether the mount itself has the `ro` option.
    pub mount_read_only: bool,
}

/// Decodes the kernel's octal escapes (`\040` for a space) in mount table fields.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..=i + 3].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a mount table; malformed lines are skipped.
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_ascii_whitespace();
            let device = unescape(f.next()?);
            let mountpoint = unescape(f.next()?);
            let fstype = f.next()?.to_string();
            let ro = f.next()?.split(',').any(|o| o == "ro");
            Some(MountEntry {
                device,
                mountpoint,
                fstype,
                read_only: ro,
                mount_read_only: ro,
            })
        })
        .collect()
}

/// Parses `/proc/self/mountinfo`:
/// `id parent maj:min root mountpoint mount-opts [optional…] - fstype source super-opts`.
/// `read_only` reflects the super block options. Malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let left: Vec<&str> = left.split_ascii_whitespace().collect();
            let mountpoint = unescape(left.get(4)?);
            let mount_read_only = left.get(5)?.split(',').any(|o| o == "ro");
            let mut r = right.split_ascii_whitespace();
            let fstype = r.next()?.to_string();
            let device = unescape(r.next()?);
            let super_opts = r.next()?;
            Some(MountEntry {
                device,
                mountpoint,
                fstype,
                read_only: super_opts.split(',').any(|o| o == "ro"),
                mount_read_only,
            })
        })
        .collect()
}

/// Reads the mount table under `root` (see the module docs for the order).
pub fn read_mounts(root: &Path) -> Result<Vec<MountEntry>, String> {
    if let Ok(t) = std::fs::read_to_string(under_root(root, "/proc/self/mountinfo")) {
        return Ok(parse_mountinfo(&t));
    }
    let primary = under_root(root, "/proc/mounts");
    match std::fs::read_to_string(&primary) {
        Ok(t) => Ok(parse_mounts(&t)),
        Err(e1) => {
            let fallback = under_root(root, "/proc/self/mounts");
            std::fs::read_to_string(&fallback)
                .map(|t| parse_mounts(&t))
                .map_err(|e2| {
                    format!(
                        "cannot read mount table: {}: {e1}; {}: {e2}",
                        primary.display(),
                        fallback.display()
                    )
                })
        }
    }
}

/// Percentage of `part` in `total`.
fn percent(part: u64, total: u64) -> f64 {
    part as f64 * 100.0 / total as f64
}

/// Judges one mount. Pure: `entry` is its last line in the mount table (the mount on top),
/// `usage` its statvfs result.
pub fn evaluate(
    cfg: &MountConfig,
    entry: Option<&MountEntry>,
    usage: Option<io::Result<FsUsage>>,
) -> CheckResult {
    let r = |s, d: String| result(CheckKind::Disk, &cfg.path, s, d);
    let Some(entry) = entry else {
        return r(CheckStatus::Fail, "not mounted".into());
    };
    if cfg.read_write && entry.read_only {
        return r(
            CheckStatus::Fail,
            format!(
                "{} ({}) is mounted read-only but must be read-write",
                entry.device, entry.fstype
            ),
        );
    }
    let u = match usage {
        Some(Ok(u)) => u,
        Some(Err(e)) => return r(CheckStatus::Unknown, format!("statvfs failed: {e}")),
        None => return r(CheckStatus::Unknown, "no usage data".into()),
    };
    let mut status = CheckStatus::Ok;
    let mut notes = Vec::new();
    let mut worsen = |s: CheckStatus| {
        if s == CheckStatus::Fail || status == CheckStatus::Ok {
            status = s;
        }
    };
    if u.blocks > 0 {
        let free = percent(u.blocks_avail, u.blocks);
        notes.push(format!("{free:.1}% space free"));
        if free < cfg.fail_free_percent {
            worsen(CheckStatus::Fail);
            notes.push(format!("below {}%", cfg.fail_free_percent));
        } else if free < cfg.warn_free_percent {
            worsen(CheckStatus::Warn);
            notes.push(format!("below {}%", cfg.warn_free_percent));
        }
    }
    if u.files > 0 {
        let free = percent(u.files_free, u.files);
        notes.push(format!("{free:.1}% inodes free"));
        if free < cfg.fail_free_inodes_percent {
            worsen(CheckStatus::Fail);
            notes.push(format!("below {}%", cfg.fail_free_inodes_percent));
        } else if free < cfg.warn_free_inodes_percent {
            worsen(CheckStatus::Warn);
            notes.push(format!("below {}%", cfg.warn_free_inodes_percent));
        }
    }
    let mode = if entry.read_only { "ro" } else { "rw" };
    if notes.is_empty() {
        notes.push("no block or inode counts".into());
    }
    r(status, format!("{mode}, {}", notes.join(", ")))
}

/// Whether a kept entry still says what the filesystem is, given this cycle's statvfs:
/// only a mount whose own options are `rw` lets `ST_RDONLY` tell the super block's state.
/// An absent entry is trusted (mounting raises a poll event). Pure.
pub fn entry_still_true(entry: Option<&MountEntry>, usage: Option<&io::Result<FsUsage>>) -> bool {
    match (entry, usage) {
        (None, _) => true,
        (Some(e), Some(Ok(u))) => !e.mount_read_only && u.read_only == e.read_only,
        (Some(_), _) => false,
    }
}

/// The mount table under a root, kept between cycles (see the module docs).
#[derive(Debug)]
pub struct MountTable {
    root: PathBuf,
    /// `<root>/proc/self/mountinfo` kept open, when poll can tell its changes.
    watched: Option<File>,
    /// The last table read; `None` before the first.
    entries: Option<Result<Vec<MountEntry>, String>>,
    /// Reads of the table so far (tests and debugging).
    reads: u64,
}

impl MountTable {
    /// A table under `root`; mountinfo is watched when it is procfs's.
    pub fn new(root: &Path) -> Self {
        let watched = File::open(under_root(root, "/proc/self/mountinfo"))
            .ok()
            .filter(|f| {
                rustix::fs::fstatfs(f).is_ok_and(|s| s.f_type == rustix::fs::PROC_SUPER_MAGIC)
            });
        Self::with_watched(root, watched)
    }

    /// A table watching `watched` as if it were procfs's mountinfo (tests: poll never
    /// reports a change on a regular file).
    fn with_watched(root: &Path, watched: Option<File>) -> Self {
        Self {
            root: root.to_path_buf(),
            watched,
            entries: None,
            reads: 0,
        }
    }

    /// Reads of the table so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Whether the watched table reported a change since the last poll (and, unwatched,
    /// always).
    fn changed(&self) -> bool {
        let Some(f) = &self.watched else {
            return true;
        };
        let flags = rustix::event::PollFlags::PRI;
        let mut fds = [rustix::event::PollFd::new(f, flags)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_) => fds[0]
                .revents()
                .intersects(rustix::event::PollFlags::PRI | rustix::event::PollFlags::ERR),
            Err(_) => true,
        }
    }

    /// Reads the table again: from the watched file (from its start), else by path.
    fn read(&mut self) {
        self.reads += 1;
        let mut text = String::new();
        let watched = self.watched.as_mut().map(|f| {
            f.rewind()?;
            f.read_to_string(&mut text)
        });
        self.entries = Some(match watched {
            Some(Ok(_)) => Ok(parse_mountinfo(&text)),
            _ => read_mounts(&self.root),
        });
    }

    /// Checks every configured mount against the table, re-reading it when it may have
    /// changed.
    pub fn check(&mut self, mounts: &[MountConfig], fs: &dyn FsStats) -> Vec<CheckResult> {
        let mut fresh = self.entries.is_none() || self.changed();
        loop {
            if fresh {
                self.read();
            }
            let table = match self.entries.as_ref().expect("read above or before") {
                Ok(t) => t,
                Err(e) => {
                    return mounts
                        .iter()
                        .map(|m| result(CheckKind::Disk, &m.path, CheckStatus::Unknown, e.clone()))
                        .collect();
                }
            };
            let found: Vec<_> = mounts
                .iter()
                .map(|m| {
                    let entry = table.iter().rev().find(|e| e.mountpoint == m.path);
                    let usage = entry.map(|_| fs.usage(&under_root(&self.root, &m.path)));
                    (entry, usage)
                })
                .collect();
            if !fresh && !found.iter().all(|(e, u)| entry_still_true(*e, u.as_ref())) {
                fresh = true;
                continue;
            }
            return mounts
                .iter()
                .zip(found)
                .map(|(m, (entry, usage))| evaluate(m, entry, usage))
                .collect();
        }
    }
}

/// Checks every configured mount, reading the table once.
pub fn check(root: &Path, mounts: &[MountConfig], fs: &dyn FsStats) -> Vec<CheckResult> {
    MountTable::new(root).check(mounts, fs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::NodeFixture;

    /// Scripted usage per path suffix (`*` matches any path).
    struct FakeFs(Vec<(&'static str, io::Result<FsUsage>)>);

    impl FsStats for FakeFs {
        fn usage(&self, path: &Path) -> io::Result<FsUsage> {
            for (suffix, u) in &self.0 {
                if *suffix == "*" || path.ends_with(suffix.trim_start_matches('/')) {
                    return match u {
                        Ok(u) => Ok(*u),
                        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                    };
                }
            }
            Err(io::Error::new(io::ErrorKind::NotFound, "no such fake path"))
        }
    }

    fn usage(avail_pct: u64, inodes_free_pct: u64) -> FsUsage {
        FsUsage {
            blocks: 1000,
            blocks_avail: avail_pct * 10,
            files: 1000,
            files_free: inodes_free_pct * 10,
            read_only: false,
        }
    }

    #[test]
    fn real_statvfs_on_a_fixture_is_ok() {
        let f = NodeFixture::builder("n").mount("/var").build().unwrap();
        let r = check(f.root(), &[MountConfig::new("/var")], &Statvfs);
        assert_eq!(r.len(), 1);
        // The temporary directory's real filesystem: not full on a sane test machine.
        assert_ne!(r[0].status, CheckStatus::Unknown, "{r:?}");
        assert!(r[0].detail.starts_with("rw, "), "{r:?}");
    }

    #[test]
    fn read_only_remount_fails_unless_allowed() {
        let f = NodeFixture::builder("n")
            .mount("/var")
            .mount("/boot")
            .build()
            .unwrap();
        f.set_read_only("/var", true).unwrap();
        f.set_read_only("/boot", true).unwrap();
        let fs = FakeFs(vec![
            ("/var", Ok(usage(50, 50))),
            ("/boot", Ok(usage(50, 50))),
        ]);
        let mut boot = MountConfig::new("/boot");
        boot.read_write = false;
        let r = check(f.root(), &[MountConfig::new("/var"), boot], &fs);
        assert_eq!(r[0].status, CheckStatus::Fail);
        assert!(r[0].detail.contains("read-only"), "{r:?}");
        assert_eq!(r[1].status, CheckStatus::Ok, "{r:?}");
        f.set_read_only("/var", false).unwrap();
        let r = check(f.root(), &[MountConfig::new("/var")], &fs);
        assert_eq!(r[0].status, CheckStatus::Ok, "{r:?}");
    }

    #[test]
    fn unmounted_fails() {
        let f = NodeFixture::builder("n").mount("/var").build().unwrap();
        f.set_mounted("/var", false).unwrap();
        let r = check(f.root(), &[MountConfig::new("/var")], &Statvfs);
        assert_eq!(r[0].status, CheckStatus::Fail);
        assert_eq!(r[0].detail, "not mounted");
    }

    #[test]
    fn thresholds_warn_then_fail_for_space_and_inodes() {
        let f = NodeFixture::builder("n").mount("/var").build().unwrap();
        let m = [MountConfig::new("/var")];
        let st = |u: FsUsage| check(f.root(), &m, &FakeFs(vec![("/var", Ok(u))]))[0].clone();
        assert_eq!(st(usage(50, 50)).status, CheckStatus::Ok);
        let r = st(usage(8, 50));
        assert_eq!(r.status, CheckStatus::Warn, "{r:?}");
        assert!(r.detail.contains("8.0% space free"), "{r:?}");
        assert_eq!(st(usage(3, 50)).status, CheckStatus::Fail);
        assert_eq!(st(usage(50, 7)).status, CheckStatus::Warn);
        let r = st(usage(50, 2));
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("inodes"), "{r:?}");
        // Warn on space does not mask a fail on inodes.
        assert_eq!(st(usage(8, 2)).status, CheckStatus::Fail);
        // No inode table (btrfs): only space is judged.
        let mut u = usage(50, 0);
        u.files = 0;
        assert_eq!(st(u).status, CheckStatus::Ok);
    }

    #[test]
    fn statvfs_error_is_unknown() {
        let f = NodeFixture::builder("n").mount("/var").build().unwrap();
        let fs = FakeFs(vec![("/var", Err(io::Error::other("EIO")))]);
        let r = check(f.root(), &[MountConfig::new("/var")], &fs);
        assert_eq!(r[0].status, CheckStatus::Unknown, "{r:?}");
    }

    #[test]
    fn mount_table_parsing() {
        let t = "/dev/sda1 / ext4 rw,relatime 0 0\n\
                 /dev/sdb1 /mnt/my\\040disk xfs ro,noatime 0 0\n\
                 garbage\n\
                 /dev/sdc1 / ext4 ro 0 0\n";
        let m = parse_mounts(t);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].mountpoint, "/mnt/my disk");
        assert!(m[1].read_only);
        assert!(!m[0].read_only);
        // The last entry for a mount point is the one on top.
        let cfg = [MountConfig::new("/")];
        let f = NodeFixture::builder("n").build().unwrap();
        std::fs::remove_file(f.path_of("proc/self/mountinfo")).unwrap();
        f.write("proc/mounts", t).unwrap();
        let r = check(f.root(), &cfg, &FakeFs(vec![("*", Ok(usage(50, 50)))]));
        assert_eq!(r[0].status, CheckStatus::Fail, "{r:?}");
    }

    #[test]
    fn mountinfo_judges_the_super_block_not_the_bind_mount() {
        // What the agent sees under ProtectSystem=strict: /var bind-mounted read-only in
        // its namespace (mount options) while the filesystem itself is fine, and /data
        // whose filesystem went read-only after errors.
        let t = "29 1 8:1 / / ro,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n\
                 30 29 8:2 / /var ro,nosuid,relatime shared:2 - ext4 /dev/sda2 rw\n\
                 31 29 8:3 / /data ro,relatime shared:3 - xfs /dev/sdb1 ro,attr2\n\
                 32 29 0:5 / /mnt/a\\040b rw master:1 - tmpfs tmpfs rw\n\
                 broken line\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].mountpoint, "/var");
        assert!(!m[1].read_only);
        assert!(m[2].read_only);
        assert_eq!(
            (m[2].device.as_str(), m[2].fstype.as_str()),
            ("/dev/sdb1", "xfs")
        );
        assert_eq!(m[3].mountpoint, "/mnt/a b");
    }

    /// One `/var` line of mountinfo with the given mount and super block options.
    fn var_line(mount_opts: &str, super_opts: &str) -> String {
        format!("30 1 8:2 / /var {mount_opts} shared:2 - ext4 /dev/sda2 {super_opts}\n")
    }

    /// A fixture whose mountinfo is kept open as if procfs's, and a table over it.
    fn watched_table(mountinfo: &str) -> (NodeFixture, MountTable) {
        let f = NodeFixture::builder("n").build().unwrap();
        let path = f.path_of("proc/self/mountinfo");
        std::fs::write(&path, mountinfo).unwrap();
        let t = MountTable::with_watched(f.root(), Some(File::open(&path).unwrap()));
        (f, t)
    }

    /// Rewrites the fixture's mountinfo in place (the kept handle sees it).
    fn rewrite(f: &NodeFixture, mountinfo: &str) {
        std::fs::write(f.path_of("proc/self/mountinfo"), mountinfo).unwrap();
    }

    fn usage_ro(read_only: bool) -> FakeFs {
        FakeFs(vec![(
            "/var",
            Ok(FsUsage {
                read_only,
                ..usage(50, 50)
            }),
        )])
    }

    #[test]
    fn a_kept_entry_is_trusted_only_while_statvfs_agrees() {
        let rw = FsUsage {
            read_only: false,
            ..usage(50, 50)
        };
        let ro = FsUsage {
            read_only: true,
            ..rw
        };
        let e = |mount_ro, sb_ro| MountEntry {
            device: "/dev/sda2".into(),
            mountpoint: "/var".into(),
            fstype: "ext4".into(),
            read_only: sb_ro,
            mount_read_only: mount_ro,
        };
        assert!(entry_still_true(None, None));
        assert!(entry_still_true(Some(&e(false, false)), Some(&Ok(rw))));
        assert!(entry_still_true(Some(&e(false, true)), Some(&Ok(ro))));
        // The kernel turned the filesystem read-only after errors: no mount event.
        assert!(!entry_still_true(Some(&e(false, false)), Some(&Ok(ro))));
        assert!(!entry_still_true(Some(&e(false, true)), Some(&Ok(rw))));
        // A read-only bind mount hides the super block's state from statvfs.
        assert!(!entry_still_true(Some(&e(true, false)), Some(&Ok(ro))));
        assert!(!entry_still_true(
            Some(&e(false, false)),
            Some(&Err(io::Error::other("EIO")))
        ));
    }

    #[test]
    fn the_kept_table_is_reread_when_statvfs_sees_a_read_only_filesystem() {
        let (f, mut t) = watched_table(&var_line("rw,relatime", "rw"));
        let m = [MountConfig::new("/var")];
        for _ in 0..3 {
            assert_eq!(t.check(&m, &usage_ro(false))[0].status, CheckStatus::Ok);
        }
        assert_eq!(t.reads(), 1, "nothing changed: read once");
        // errors=remount-ro: the super block goes ro, the mount options stay, and poll
        // reports nothing (a regular file here; procfs raises no event for it either).
        rewrite(&f, &var_line("rw,relatime", "ro,errors=remount-ro"));
        let r = t.check(&m, &usage_ro(true));
        assert_eq!(r[0].status, CheckStatus::Fail, "{r:?}");
        assert!(r[0].detail.contains("read-only"), "{r:?}");
        assert_eq!(t.reads(), 2);
        // It stays failed without further reads while statvfs agrees.
        assert_eq!(t.check(&m, &usage_ro(true))[0].status, CheckStatus::Fail);
        assert_eq!(t.reads(), 2);
    }

    #[test]
    fn a_read_only_bind_mount_is_reread_every_cycle() {
        // ProtectSystem=strict: statvfs says read-only whatever the super block says.
        let (f, mut t) = watched_table(&var_line("ro,relatime", "rw"));
        let m = [MountConfig::new("/var")];
        for _ in 0..3 {
            assert_eq!(t.check(&m, &usage_ro(true))[0].status, CheckStatus::Ok);
        }
        assert_eq!(t.reads(), 3, "one read per cycle");
        rewrite(&f, &var_line("ro,relatime", "ro"));
        assert_eq!(t.check(&m, &usage_ro(true))[0].status, CheckStatus::Fail);
    }

    #[test]
    fn procfs_mountinfo_is_watched_and_quiet_while_nothing_mounts() {
        let mut t = MountTable::new(Path::new("/"));
        assert!(t.watched.is_some(), "procfs mountinfo is watched");
        for _ in 0..3 {
            assert!(t.check(&[], &Statvfs).is_empty());
        }
        assert_eq!(t.reads(), 1);
        let fixture = NodeFixture::builder("n").mount("/var").build().unwrap();
        assert!(
            MountTable::new(fixture.root()).watched.is_none(),
            "a fixture tree is not procfs: read every cycle"
        );
    }

    #[test]
    fn a_mount_in_the_namespace_is_seen_through_poll() {
        use std::io::{BufRead, BufReader, Write};
        use std::process::{Command, Stdio};
        // A shell in a mount namespace of its own (so the host's mounts are left alone)
        // mounts a tmpfs when told to; the table watches that process's mountinfo.
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("m");
        std::fs::create_dir(&mp).unwrap();
        let mp = mp.to_str().unwrap().to_string();
        let Ok(mut child) = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "echo ready; read go; mount -t tmpfs fleetmend-test {mp} && echo mounted; read end"
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        else {
            eprintln!("skipped: no unshare(1)");
            return;
        };
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.trim() != "ready" {
            eprintln!("skipped: cannot make a mount namespace here (not root?)");
            let _ = child.wait();
            return;
        }
        let info = File::open(format!("/proc/{}/mountinfo", child.id())).unwrap();
        let mut t = MountTable::with_watched(Path::new("/"), Some(info));
        let m = [MountConfig::new(&mp)];
        let fs = FakeFs(vec![("*", Ok(usage(50, 50)))]);
        let r = t.check(&m, &fs);
        assert_eq!(r[0].detail, "not mounted", "{r:?}");
        assert_eq!(t.check(&m, &fs)[0].detail, "not mounted");
        assert_eq!(t.reads(), 1);
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        if line.trim() != "mounted" {
            drop(stdin);
            let _ = child.wait();
            eprintln!("skipped: mount not permitted here");
            return;
        }
        let r = t.check(&m, &fs);
        assert_eq!(r[0].status, CheckStatus::Ok, "{r:?}");
        assert_eq!(t.reads(), 2, "the mount raised a poll event");
        assert_eq!(t.check(&m, &fs)[0].status, CheckStatus::Ok);
        assert_eq!(t.reads(), 2);
        drop(stdin);
        child.wait().unwrap();
    }

    #[test]
    fn falls_back_to_proc_self_mounts() {
        let f = NodeFixture::builder("n").mount("/var").build().unwrap();
        std::fs::remove_file(f.path_of("proc/self/mountinfo")).unwrap();
        let t = f.read("proc/mounts").unwrap();
        std::fs::remove_file(f.path_of("proc/mounts")).unwrap();
        let r = check(f.root(), &[MountConfig::new("/var")], &Statvfs);
        assert_eq!(r[0].status, CheckStatus::Unknown);
        f.write("proc/self/mounts", &t).unwrap();
        let r = check(f.root(), &[MountConfig::new("/var")], &Statvfs);
        assert_ne!(r[0].status, CheckStatus::Unknown, "{r:?}");
    }
}
