//! GPU check: NVIDIA Xid errors from the kernel log (`<root>/dev/kmsg`).
//!
//! The log is opened once and read from where the last round left off (the kernel keeps
//! the position of an open `/dev/kmsg`; a regular file stand-in in tests keeps its offset),
//! so a round reads only what is new, never the whole buffer. The first round of a boot
//! reads what the buffer still holds: Xids from before the agent started count.
//!
//! Each GPU's worst Xid is kept: one that asks for a reset or a reboot fails the GPU until
//! the machine reboots (a new boot id); one that warns is shown for [`WARN_KEEP`] after the
//! last. What was seen, and the sequence number of the last record read, are written to
//! `<state_dir>/gpu-xid.state` at each new Xid, so a restarted agent neither forgets a
//! failed GPU nor reports the same Xid lines again as new.
//!
//! Off in `auto` mode when no NVIDIA display or 3D controller is on the PCI bus
//! (`<root>/sys/bus/pci/devices/*/vendor` 0x10de, class 0x03xxxx).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::config::{Enabled, GpuConfig};
use super::xid::{self, XidAction, XidTable};
use super::{result, under_root};

/// Subject of the result when no GPU has an Xid to show.
pub const SUBJECT: &str = "gpus";

/// A warning Xid (ECC page retirement, a contained error) is shown this long after the
/// last one: long enough for a report or two to carry it to the coordinator and a person to
/// see it, short enough that one event a month does not keep a GPU flagged for ever.
pub const WARN_KEEP: Duration = Duration::from_secs(3600);

/// The most a round reads: a kernel flooding its log must not hold a report up. What is
/// left is read next round.
const MAX_BYTES_PER_ROUND: usize = 4 << 20;

/// A kernel log record is at most 1 KiB of text plus its dictionary; `/dev/kmsg` refuses a
/// read into a buffer too small for the next record.
const READ_BUF: usize = 8192;

/// The file the findings are kept in, under the agent's state directory.
pub const STATE_FILE: &str = "gpu-xid.state";

/// One GPU's worst Xid so far this boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Xid number.
    pub code: u32,
    /// What it asks for.
    pub action: String,
    /// The line's text after the code.
    pub text: String,
    /// When the agent read it (Unix seconds).
    pub seen_unix: u64,
    /// The record's kernel time (microseconds since boot), when it had one.
    pub kernel_us: Option<u64>,
    /// Xids of this GPU (not ignored) so far this boot.
    pub count: u64,
}

/// What the state file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Saved {
    boot_id: String,
    last_seq: Option<u64>,
    gpus: BTreeMap<String, Finding>,
    ignored: u64,
}

impl Saved {
    /// Tab-separated lines: `boot`, `seq` and `ignored` lines, then one `gpu` line per GPU
    /// (address, code, action, seen, kernel time or `-`, count, text). Hand-written rather
    /// than JSON: a deserializer for one small file would cost the agent's binary more than
    /// this does.
    fn encode(&self) -> String {
        let mut out = format!(
            "boot	{}
ignored	{}
",
            self.boot_id, self.ignored
        );
        if let Some(n) = self.last_seq {
            out.push_str(&format!(
                "seq	{n}
"
            ));
        }
        for (gpu, f) in &self.gpus {
            let us = f.kernel_us.map_or("-".to_string(), |u| u.to_string());
            let text = f.text.replace(['\t', '\n'], " ");
            out.push_str(&format!(
                "gpu	{gpu}	{}	{}	{}	{us}	{}	{text}
",
                f.code, f.action, f.seen_unix, f.count
            ));
        }
        out
    }

    /// Reads [`Saved::encode`]'s text; `None` when a line is not understood.
    fn decode(text: &str) -> Option<Self> {
        let mut s = Saved::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["boot", b] => s.boot_id = b.to_string(),
                ["ignored", n] => s.ignored = n.parse().ok()?,
                ["seq", n] => s.last_seq = Some(n.parse().ok()?),
                ["gpu", gpu, code, action, seen, us, count, text] => {
                    s.gpus.insert(
                        gpu.to_string(),
                        Finding {
                            code: code.parse().ok()?,
                            action: action.to_string(),
                            text: text.to_string(),
                            seen_unix: seen.parse().ok()?,
                            kernel_us: us.parse().ok(),
                            count: count.parse().ok()?,
                        },
                    );
                }
                _ => return None,
            }
        }
        Some(s)
    }
}

/// The check and what it keeps between rounds.
#[derive(Debug)]
pub struct GpuCheck {
    kmsg: PathBuf,
    file: Option<File>,
    open_error: Option<String>,
    partial: Vec<u8>,
    buf: Vec<u8>,
    table: XidTable,
    state: PathBuf,
    saved: Saved,
    devices: usize,
    save_error: Option<String>,
}

/// Counts the NVIDIA display and 3D controllers under `<root>/sys/bus/pci/devices`.
pub fn nvidia_devices(root: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(under_root(root, "/sys/bus/pci/devices")) else {
        return 0;
    };
    dir.flatten()
        .filter(|d| {
            let read = |f: &str| super::read_trimmed(&d.path().join(f)).unwrap_or_default();
            read("vendor") == "0x10de" && read("class").starts_with("0x03")
        })
        .count()
}

impl GpuCheck {
    /// The check for `cfg`, or `None` when it is off (or `auto` finds no NVIDIA GPU).
    /// `boot_id` is the current boot's: findings saved under another are dropped.
    pub fn new(root: &Path, cfg: &GpuConfig, state_dir: &Path, boot_id: &str) -> Option<Self> {
        let devices = nvidia_devices(root);
        match cfg.enabled {
            Enabled::Off => return None,
            Enabled::Auto if devices == 0 => return None,
            _ => {}
        }
        let state = state_dir.join(STATE_FILE);
        let saved = std::fs::read_to_string(&state)
            .ok()
            .and_then(|t| Saved::decode(&t))
            .filter(|s| s.boot_id == boot_id)
            .unwrap_or_else(|| Saved {
                boot_id: boot_id.to_string(),
                ..Saved::default()
            });
        Some(Self {
            kmsg: under_root(root, &cfg.kmsg),
            file: None,
            open_error: None,
            partial: Vec::new(),
            buf: Vec::new(),
            table: cfg.table.clone(),
            state,
            saved,
            devices,
            save_error: None,
        })
    }

    /// Reads what is new in the log and reports each GPU with an Xid to show (or one `ok`
    /// result when there is none).
    pub fn check(&mut self) -> Vec<CheckResult> {
        let now = unix_now();
        if self.file.is_none() {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(&self.kmsg)
            {
                Ok(f) => {
                    self.file = Some(f);
                    self.open_error = None;
                }
                Err(e) => {
                    let hint = if e.kind() == std::io::ErrorKind::PermissionDenied
                        || e.kind() == std::io::ErrorKind::NotFound
                    {
                        " (the packaged unit hides the kernel log: give GPU nodes the drop-in \
                         of docs/operations.md, or set [checks.gpu] enabled = \"off\")"
                    } else {
                        ""
                    };
                    self.open_error =
                        Some(format!("cannot read {}: {e}{hint}", self.kmsg.display()));
                }
            }
        }
        if self.read_new(now) {
            self.save();
        }
        self.results(now)
    }

    /// Reads the records that arrived since the last round; true when a finding changed.
    fn read_new(&mut self, now: u64) -> bool {
        let Some(mut f) = self.file.take() else {
            return false;
        };
        let mut keep = true;
        self.buf.resize(READ_BUF, 0);
        let mut read = 0usize;
        let mut changed = false;
        while read < MAX_BYTES_PER_ROUND {
            match f.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => {
                    read += n;
                    self.partial.extend_from_slice(&self.buf[..n]);
                    // Whole lines only: a stand-in's writer may be half-way through one.
                    let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
                        continue;
                    };
                    let lines: Vec<u8> = self.partial.drain(..=end).collect();
                    for line in lines.split(|&b| b == b'\n') {
                        changed |= self.record(&String::from_utf8_lossy(line), now);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // The kernel overwrote records before they were read: the next read goes on
                // from the oldest one left.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()) => {
                    tracing::warn!(kmsg = %self.kmsg.display(), "kernel log records were overwritten before the gpu check read them");
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.open_error = Some(format!("cannot read {}: {e}", self.kmsg.display()));
                    keep = false;
                    break;
                }
            }
        }
        if keep {
            self.file = Some(f);
        }
        changed
    }

    /// Takes one line of `/dev/kmsg` (`prio,seq,usec,flags;message`; dictionary lines
    /// start with a space). True when a finding changed.
    fn record(&mut self, line: &str, now: u64) -> bool {
        if line.is_empty() || line.starts_with(' ') {
            return false;
        }
        let (seq, kernel_us, message) = match line.split_once(';') {
            Some((head, msg)) => {
                let mut f = head.split(',');
                let _prio = f.next();
                let seq = f.next().and_then(|s| s.parse::<u64>().ok());
                let us = f.next().and_then(|s| s.parse::<u64>().ok());
                (seq, us, msg)
            }
            None => (None, None, line),
        };
        if let (Some(seq), Some(last)) = (seq, self.saved.last_seq)
            && seq <= last
        {
            return false;
        }
        let Some(x) = xid::parse(message) else {
            return false;
        };
        if let Some(seq) = seq {
            self.saved.last_seq = Some(seq);
        }
        let action = self.table.action(x.code);
        if action == XidAction::Ignore {
            self.saved.ignored += 1;
            return true;
        }
        tracing::warn!(gpu = %x.gpu, xid = x.code, action = action.as_str(), text = %x.text, "GPU Xid error");
        let count = self.saved.gpus.get(&x.gpu).map_or(0, |f| f.count) + 1;
        let worse = self.saved.gpus.get(&x.gpu).is_none_or(|f| {
            let held = parse_action(&f.action);
            // The worst so far stays; a warning that has run out is replaced.
            action >= held
                || (held == XidAction::Warn
                    && now.saturating_sub(f.seen_unix) > WARN_KEEP.as_secs())
        });
        let entry = self
            .saved
            .gpus
            .entry(x.gpu.clone())
            .or_insert_with(|| Finding {
                code: x.code,
                action: action.as_str().into(),
                text: String::new(),
                seen_unix: now,
                kernel_us,
                count: 0,
            });
        if worse {
            *entry = Finding {
                code: x.code,
                action: action.as_str().into(),
                text: x.text,
                seen_unix: now,
                kernel_us,
                count,
            };
        } else {
            entry.count = count;
        }
        true
    }

    fn save(&mut self) {
        let write = || -> std::io::Result<()> {
            let tmp = self.state.with_extension("tmp");
            std::fs::write(&tmp, self.saved.encode())?;
            std::fs::rename(&tmp, &self.state)
        };
        match write() {
            Ok(()) => self.save_error = None,
            Err(e) => {
                let msg = format!(
                    "cannot keep the GPU findings in {}: {e} (a restarted agent would forget them)",
                    self.state.display()
                );
                if self.save_error.as_ref() != Some(&msg) {
                    tracing::warn!("{msg}");
                }
                self.save_error = Some(msg);
            }
        }
    }

    fn results(&self, now: u64) -> Vec<CheckResult> {
        let mut out = Vec::new();
        for (gpu, f) in &self.saved.gpus {
            let action = parse_action(&f.action);
            let status = match action {
                XidAction::Reset | XidAction::Reboot => CheckStatus::Fail,
                XidAction::Warn if now.saturating_sub(f.seen_unix) <= WARN_KEEP.as_secs() => {
                    CheckStatus::Warn
                }
                _ => continue,
            };
            let meaning = xid::meaning(f.code)
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            let when = match f.kernel_us {
                Some(us) => format!(
                    "{} [{}.{:06} s after boot]",
                    utc(f.seen_unix),
                    us / 1_000_000,
                    us % 1_000_000
                ),
                None => utc(f.seen_unix),
            };
            let asks = match action {
                XidAction::Reboot => "asks for a node reboot",
                XidAction::Reset => "asks for a GPU reset",
                _ => "a warning",
            };
            let mut detail = format!("Xid {}{meaning} at {when}: {asks}", f.code);
            if f.count > 1 {
                detail.push_str(&format!("; {} Xids on this GPU this boot", f.count));
            }
            if !f.text.is_empty() {
                detail.push_str(&format!("; driver: {}", cut(&f.text, 160)));
            }
            out.push(result(CheckKind::Gpu, gpu, status, detail));
        }
        if out.is_empty() {
            let (status, detail) = match &self.open_error {
                Some(e) => (CheckStatus::Unknown, e.clone()),
                None => (
                    CheckStatus::Ok,
                    format!(
                        "{} NVIDIA GPU(s), no Xid asking for action this boot{}",
                        self.devices,
                        match self.saved.ignored {
                            0 => String::new(),
                            n => format!(" ({n} application Xid(s) ignored)"),
                        }
                    ),
                ),
            };
            out.push(result(CheckKind::Gpu, SUBJECT, status, detail));
        }
        if let Some(e) = &self.save_error {
            for r in &mut out {
                r.detail.push_str(&format!("; {e}"));
            }
        }
        out
    }
}

fn parse_action(s: &str) -> XidAction {
    match s {
        "reboot" => XidAction::Reboot,
        "reset" => XidAction::Reset,
        "warn" => XidAction::Warn,
        _ => XidAction::Ignore,
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `2026-11-27T21:00:00Z` for Unix seconds (civil calendar from a day count).
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a proleptic Gregorian date, by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::testkit_fixture::NodeFixture;

    fn gpu_fixture() -> NodeFixture {
        let f = NodeFixture::builder("g").build().unwrap();
        for (i, class) in [(0x3b, "0x030200"), (0x86, "0x030200"), (0x01, "0x060400")] {
            let dev = format!("sys/bus/pci/devices/0000:{i:02x}:00.0");
            f.write(&format!("{dev}/vendor"), "0x10de\n").unwrap();
            f.write(&format!("{dev}/class"), &format!("{class}\n"))
                .unwrap();
        }
        f.write("dev/kmsg", "").unwrap();
        f
    }

    fn append(f: &NodeFixture, lines: &[&str]) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(f.path_of("dev/kmsg"))
            .unwrap();
        for l in lines {
            writeln!(file, "{l}").unwrap();
        }
    }

    fn cfg() -> GpuConfig {
        GpuConfig {
            enabled: Enabled::Auto,
            kmsg: "/dev/kmsg".into(),
            table: XidTable::default(),
        }
    }

    #[test]
    fn the_state_file_round_trips() {
        let mut s = Saved {
            boot_id: "b".into(),
            last_seq: Some(7),
            ignored: 2,
            ..Saved::default()
        };
        s.gpus.insert(
            "0000:3b:00".into(),
            Finding {
                code: 79,
                action: "reboot".into(),
                text: "pid=1,\tfell off".into(),
                seen_unix: 5,
                kernel_us: None,
                count: 3,
            },
        );
        let back = Saved::decode(&s.encode()).unwrap();
        assert_eq!(back.gpus["0000:3b:00"].text, "pid=1, fell off");
        assert_eq!(
            (back.last_seq, back.ignored, back.gpus["0000:3b:00"].count),
            (Some(7), 2, 3)
        );
        assert_eq!(Saved::decode("boot\tb\nnonsense\n"), None);
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_813_200), "2026-11-27T21:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn off_without_an_nvidia_gpu_in_auto_mode() {
        let f = NodeFixture::builder("n").build().unwrap();
        let state = tempfile::tempdir().unwrap();
        assert!(GpuCheck::new(f.root(), &cfg(), state.path(), "b").is_none());
        let on = GpuConfig {
            enabled: Enabled::On,
            ..cfg()
        };
        let mut g = GpuCheck::new(f.root(), &on, state.path(), "b").unwrap();
        let r = g.check();
        assert_eq!(r[0].status, CheckStatus::Unknown, "{r:?}");
        assert!(r[0].detail.contains("dev/kmsg"), "{r:?}");
    }

    #[test]
    fn xids_are_classified_per_gpu_read_once_and_kept_across_a_restart() {
        let f = gpu_fixture();
        let state = tempfile::tempdir().unwrap();
        append(
            &f,
            &[
                "6,1,100,-;eth0: link up",
                "4,2,200,-;NVRM: Xid (PCI:0000:86:00): 13, pid=7, Graphics SM Warp Exception",
            ],
        );
        let mut g = GpuCheck::new(f.root(), &cfg(), state.path(), "b1").unwrap();
        let r = g.check();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].subject.as_str(), r[0].status),
            (SUBJECT, CheckStatus::Ok)
        );
        assert!(
            r[0].detail.contains("2 NVIDIA GPU(s)") && r[0].detail.contains("1 application Xid"),
            "{r:?}"
        );
        append(
            &f,
            &[
                "4,3,3000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                " SUBSYSTEM=pci",
                "4,4,3100000,-;NVRM: Xid (PCI:0000:86:00): 63, pid=1, Row remapping event",
            ],
        );
        let r = g.check();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(
            (r[0].subject.as_str(), r[0].status),
            ("0000:3b:00", CheckStatus::Fail)
        );
        assert!(
            r[0].detail.contains("Xid 79 (GPU has fallen off the bus)"),
            "{r:?}"
        );
        assert!(
            r[0].detail.contains("asks for a node reboot")
                && r[0].detail.contains("[3.000000 s after boot]"),
            "{r:?}"
        );
        assert_eq!(
            (r[1].subject.as_str(), r[1].status),
            ("0000:86:00", CheckStatus::Warn)
        );
        // Nothing new: the same results, nothing read again.
        assert_eq!(g.check(), r);
        // A restarted agent (same boot) reports the same and counts nothing twice.
        drop(g);
        let mut g = GpuCheck::new(f.root(), &cfg(), state.path(), "b1").unwrap();
        let again = g.check();
        assert_eq!(again, r);
        assert!(!again[0].detail.contains("Xids on this GPU"), "{again:?}");
        // A second fatal Xid on the GPU is counted.
        append(&f, &["4,5,4000000,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE"]);
        let r = g.check();
        assert!(
            r[0].detail.contains("Xid 48") && r[0].detail.contains("2 Xids on this GPU"),
            "{r:?}"
        );
        // A new boot forgets the old one.
        drop(g);
        let mut g = GpuCheck::new(f.root(), &cfg(), state.path(), "b2").unwrap();
        std::fs::write(f.path_of("dev/kmsg"), "").unwrap();
        let r = g.check();
        assert_eq!((r.len(), r[0].status), (1, CheckStatus::Ok), "{r:?}");
    }

    #[test]
    fn a_half_written_line_waits_for_its_end() {
        let f = gpu_fixture();
        let state = tempfile::tempdir().unwrap();
        let mut g = GpuCheck::new(f.root(), &cfg(), state.path(), "b").unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(f.path_of("dev/kmsg"))
            .unwrap();
        write!(file, "4,9,1,-;NVRM: Xid (PCI:0000:3b:").unwrap();
        assert_eq!(g.check()[0].status, CheckStatus::Ok);
        writeln!(file, "00): 79, fell off").unwrap();
        assert_eq!(g.check()[0].status, CheckStatus::Fail);
    }
}
