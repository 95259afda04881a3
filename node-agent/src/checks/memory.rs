//! Memory check: the EDAC counters of each memory controller under
//! `<root>/sys/devices/system/edac/mc/mcN/`.
//!
//! An uncorrectable error (`ue_count` above 0; the counters start at 0 each boot) fails the
//! controller: memory lost data, and the kernel only survived it by luck or by killing a
//! process. Correctable errors are normal one at a time; more than the configured number
//! within the window warns. The DIMMs concerned are named by their `dimm_label` (what the
//! board's silkscreen or the BIOS calls the slot) when the kernel gives one, else by the
//! `dimmN` directory; kernels with only the older `csrowN` layout are read for the totals.
//!
//! Off in `auto` mode when the kernel has no EDAC memory controller (no driver for the
//! platform, or a virtual machine).
//!
//! Each controller's `ue_count` and `ce_count` are read every round through descriptors kept
//! open (`checks::kept`: one `pread` each instead of an open, a read and a close). A
//! controller whose driver is unloaded answers `ENODEV` on them; the path is then opened
//! again, which fails while the controller is gone (`unknown`) and finds it when it is back.
//! The DIMM files are read by path, and only when there is something to name.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::config::{Enabled, MemoryConfig};
use super::kept::KeptFile;
use super::{read_trimmed, result, under_root};

/// The EDAC memory controllers, as a node path.
pub const EDAC_MC: &str = "/sys/devices/system/edac/mc";

/// Samples kept per controller for the correctable rate: one per window/`SAMPLES`, so a
/// window of an hour costs a few hundred bytes however short the report interval.
const SAMPLES: u32 = 60;

/// The DIMMs named in a result at most: a board with every DIMM counting is one message,
/// not a page.
const MOST_DIMMS: usize = 4;

/// One DIMM's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dimm {
    name: String,
    ue: u64,
    ce: u64,
}

/// One controller: its two counters, kept open, and its correctable counts over time.
#[derive(Debug)]
struct Controller {
    dir: PathBuf,
    name: String,
    ue: KeptFile,
    ce: KeptFile,
    samples: VecDeque<(Instant, u64)>,
}

/// The check and its samples.
#[derive(Debug)]
pub struct MemoryCheck {
    root: PathBuf,
    cfg: MemoryConfig,
    controllers: Vec<Controller>,
}

fn controllers(root: &Path) -> Vec<Controller> {
    let Ok(dir) = std::fs::read_dir(under_root(root, EDAC_MC)) else {
        return Vec::new();
    };
    let mut out: Vec<Controller> = dir
        .flatten()
        .filter_map(|d| {
            let name = d.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("mc")?;
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| {
                let dir = d.path();
                Controller {
                    ue: KeptFile::new(dir.join("ue_count")),
                    ce: KeptFile::new(dir.join("ce_count")),
                    dir,
                    name,
                    samples: VecDeque::new(),
                }
            })
        })
        .collect();
    out.sort_by_key(|c| c.name[2..].parse::<u32>().unwrap_or(u32::MAX));
    out
}

fn count(path: &Path) -> Option<u64> {
    read_trimmed(path).ok()?.parse().ok()
}

/// A counter read through its kept descriptor.
fn kept_count(file: &mut KeptFile) -> Option<u64> {
    file.read_trimmed().ok()?.parse().ok()
}

/// The DIMMs of a controller, with their labels (the `dimmN` layout).
fn dimms(dir: &Path) -> Vec<Dimm> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Dimm> = entries
        .flatten()
        .filter(|d| {
            let n = d.file_name();
            let n = n.to_string_lossy();
            (n.starts_with("dimm") || n.starts_with("rank")) && d.path().is_dir()
        })
        .map(|d| {
            let p = d.path();
            let label = read_trimmed(&p.join("dimm_label")).unwrap_or_default();
            let name = if label.is_empty() {
                d.file_name().to_string_lossy().into_owned()
            } else {
                label
            };
            Dimm {
                name,
                ue: count(&p.join("dimm_ue_count")).unwrap_or(0),
                ce: count(&p.join("dimm_ce_count")).unwrap_or(0),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `A1 (3 uncorrectable), B2 (1 uncorrectable)` for the DIMMs `pick` counts, most first.
fn named(dimms: &[Dimm], pick: impl Fn(&Dimm) -> u64, what: &str) -> String {
    let mut v: Vec<(&Dimm, u64)> = dimms
        .iter()
        .map(|d| (d, pick(d)))
        .filter(|(_, n)| *n > 0)
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    let more = v.len().saturating_sub(MOST_DIMMS);
    let mut s: Vec<String> = v
        .iter()
        .take(MOST_DIMMS)
        .map(|(d, n)| format!("DIMM {} ({n} {what})", d.name))
        .collect();
    if more > 0 {
        s.push(format!("{more} more"));
    }
    s.join(", ")
}

impl MemoryCheck {
    /// The check for `cfg`, or `None` when it is off (or `auto` finds no controller).
    pub fn new(root: &Path, cfg: &MemoryConfig) -> Option<Self> {
        let found = controllers(root);
        match cfg.enabled {
            Enabled::Off => None,
            Enabled::Auto if found.is_empty() => None,
            _ => Some(Self {
                root: root.to_path_buf(),
                cfg: cfg.clone(),
                controllers: found,
            }),
        }
    }

    /// Reads every controller's counters; one result per controller.
    pub fn check(&mut self) -> Vec<CheckResult> {
        self.check_at(Instant::now())
    }

    fn check_at(&mut self, now: Instant) -> Vec<CheckResult> {
        if self.controllers.is_empty() {
            self.controllers = controllers(&self.root);
            if self.controllers.is_empty() {
                let dir = under_root(&self.root, EDAC_MC);
                return vec![result(
                    CheckKind::Memory,
                    "edac",
                    CheckStatus::Unknown,
                    format!(
                        "no EDAC memory controller under {} (no EDAC driver loaded?)",
                        dir.display()
                    ),
                )];
            }
        }
        let window = self.cfg.correctable_window;
        let limit = self.cfg.correctable_per_window;
        let mut out = Vec::with_capacity(self.controllers.len());
        for c in &mut self.controllers {
            let r = |s, d: String| result(CheckKind::Memory, &c.name, s, d);
            let (Some(ue), Some(ce)) = (kept_count(&mut c.ue), kept_count(&mut c.ce)) else {
                out.push(r(
                    CheckStatus::Unknown,
                    format!("cannot read {}/ue_count and ce_count", c.dir.display()),
                ));
                continue;
            };
            // The DIMMs only when there is something to name: a quiet controller costs two
            // reads a round, not two plus three per DIMM.
            let rate = note(&mut c.samples, now, ce, window);
            if ue > 0 {
                let which = named(&dimms(&c.dir), |d| d.ue, "uncorrectable");
                let which = if which.is_empty() {
                    String::new()
                } else {
                    format!(": {which}")
                };
                out.push(r(
                    CheckStatus::Fail,
                    format!("{ue} uncorrectable memory error(s) this boot{which}; {ce} corrected"),
                ));
            } else if rate > limit {
                let which = named(&dimms(&c.dir), |d| d.ce, "corrected this boot");
                let which = if which.is_empty() {
                    String::new()
                } else {
                    format!(": {which}")
                };
                out.push(r(
                    CheckStatus::Warn,
                    format!(
                        "{rate} corrected memory errors within {} (more than {limit}){which}",
                        span(window)
                    ),
                ));
            } else {
                out.push(r(
                    CheckStatus::Ok,
                    format!(
                        "no uncorrectable errors, {ce} corrected this boot ({rate} within {})",
                        span(window)
                    ),
                ));
            }
        }
        out
    }
}

/// Records `ce` at `now` and returns how many correctable errors the window holds: the
/// rise since the oldest sample still inside it (since the agent started, for a window
/// longer than that).
fn note(samples: &mut VecDeque<(Instant, u64)>, now: Instant, ce: u64, window: Duration) -> u64 {
    // A counter that went down was reset (the driver reloaded): start over.
    if samples.back().is_some_and(|&(_, last)| ce < last) {
        samples.clear();
    }
    let step = window / SAMPLES;
    if samples
        .back()
        .is_none_or(|&(t, _)| now.duration_since(t) >= step)
    {
        samples.push_back((now, ce));
    }
    // Keep the newest sample at or before the window's start as the baseline.
    while samples.len() > 1 && samples[1].0 + window <= now {
        samples.pop_front();
    }
    ce - samples.front().map_or(ce, |&(_, c)| c)
}

/// `1h`, `30m`, else the fleet's duration display: a window as the operator wrote it.
fn span(d: Duration) -> String {
    match d.as_secs() {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        _ => protocol::duration::display(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::NodeFixture;

    fn mc(f: &NodeFixture, n: u32, ue: u64, ce: u64, dimms: &[(&str, u64, u64)]) {
        let d = format!("sys/devices/system/edac/mc/mc{n}");
        f.write(&format!("{d}/ue_count"), &format!("{ue}\n"))
            .unwrap();
        f.write(&format!("{d}/ce_count"), &format!("{ce}\n"))
            .unwrap();
        for (i, (label, due, dce)) in dimms.iter().enumerate() {
            let p = format!("{d}/dimm{i}");
            f.write(&format!("{p}/dimm_label"), &format!("{label}\n"))
                .unwrap();
            f.write(&format!("{p}/dimm_ue_count"), &format!("{due}\n"))
                .unwrap();
            f.write(&format!("{p}/dimm_ce_count"), &format!("{dce}\n"))
                .unwrap();
        }
    }

    #[test]
    fn off_without_a_controller_unless_asked_for() {
        let f = NodeFixture::builder("n").build().unwrap();
        assert!(MemoryCheck::new(f.root(), &MemoryConfig::default()).is_none());
        let on = MemoryConfig {
            enabled: Enabled::On,
            ..MemoryConfig::default()
        };
        let r = MemoryCheck::new(f.root(), &on).unwrap().check();
        assert_eq!(r[0].status, CheckStatus::Unknown);
        assert!(r[0].detail.contains("edac/mc"), "{r:?}");
    }

    #[test]
    fn uncorrectable_fails_naming_the_dimm_and_a_correctable_burst_warns() {
        let f = NodeFixture::builder("n").build().unwrap();
        mc(
            &f,
            0,
            0,
            3,
            &[("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", 0, 3), ("", 0, 0)],
        );
        mc(&f, 1, 0, 0, &[]);
        let mut m = MemoryCheck::new(f.root(), &MemoryConfig::default()).unwrap();
        let t0 = Instant::now();
        let r = m.check_at(t0);
        assert_eq!(
            r.iter()
                .map(|r| (r.subject.as_str(), r.status))
                .collect::<Vec<_>>(),
            [("mc0", CheckStatus::Ok), ("mc1", CheckStatus::Ok)]
        );
        // 150 more corrected within ten minutes: above the default 100 an hour.
        mc(
            &f,
            0,
            0,
            153,
            &[("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", 0, 150), ("", 0, 3)],
        );
        let r = m.check_at(t0 + Duration::from_secs(600));
        assert_eq!(r[0].status, CheckStatus::Warn, "{r:?}");
        assert!(
            r[0].detail
                .starts_with("150 corrected memory errors within 1h"),
            "{r:?}"
        );
        assert!(
            r[0].detail
                .contains("DIMM CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (150"),
            "{r:?}"
        );
        assert!(
            r[0].detail.contains("DIMM dimm1 (3"),
            "an unlabelled DIMM by its directory: {r:?}"
        );
        // An hour later with no new errors: the burst has left the window.
        let r = m.check_at(t0 + Duration::from_secs(4300));
        assert_eq!(r[0].status, CheckStatus::Ok, "{r:?}");
        mc(&f, 1, 2, 0, &[("P1-DIMMB1", 2, 0)]);
        let r = m.check_at(t0 + Duration::from_secs(4400));
        assert_eq!(r[1].status, CheckStatus::Fail, "{r:?}");
        assert!(
            r[1].detail.contains("2 uncorrectable")
                && r[1].detail.contains("DIMM P1-DIMMB1 (2 uncorrectable)"),
            "{r:?}"
        );
    }

    fn ok_count(r: &CheckResult) -> u64 {
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        let d = r.detail.strip_prefix("no uncorrectable errors, ").unwrap();
        d.split(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_controller_that_goes_away_is_unknown_and_read_again_when_it_is_back() {
        let f = NodeFixture::builder("n").build().unwrap();
        mc(&f, 0, 0, 3, &[]);
        mc(&f, 1, 0, 0, &[]);
        let mut m = MemoryCheck::new(f.root(), &MemoryConfig::default()).unwrap();
        let t0 = Instant::now();
        assert_eq!(ok_count(&m.check_at(t0)[0]), 3);
        let mc0 = f.root().join("sys/devices/system/edac/mc/mc0");
        std::fs::remove_dir_all(&mc0).unwrap();
        let r = m.check_at(t0 + Duration::from_secs(5));
        assert_eq!(r[0].status, CheckStatus::Unknown, "{r:?}");
        assert!(r[0].detail.contains("mc0/ue_count"), "{r:?}");
        assert_eq!(ok_count(&r[1]), 0, "the other controller is still read");
        // Back (a driver reload): its counters start again from 0.
        mc(&f, 0, 0, 1, &[]);
        let r = m.check_at(t0 + Duration::from_secs(10));
        assert_eq!(ok_count(&r[0]), 1);
        assert!(r[0].detail.contains("(0 within 1h)"), "{r:?}");
    }

    /// procfs stands in for sysfs here: a file the kernel generates on every read, which
    /// this test can change (a child's `oom_score_adj`) and make vanish (the child reaped),
    /// as a controller's counter moves and goes with its driver.
    #[test]
    fn counters_are_read_through_kept_descriptors_which_see_changes_and_a_controller_coming_back() {
        fn child() -> (std::process::Child, PathBuf) {
            let c = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap();
            let p = PathBuf::from(format!("/proc/{}/oom_score_adj", c.id()));
            // Raising a process's own oom_score_adj needs no privilege; a negative one
            // would not read as a counter.
            let v: i64 = std::fs::read_to_string(&p).unwrap().trim().parse().unwrap();
            if v < 0 {
                std::fs::write(&p, "0").unwrap();
            }
            (c, p)
        }
        let value =
            |p: &Path| -> u64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
        let f = NodeFixture::builder("n").build().unwrap();
        mc(&f, 0, 0, 0, &[]);
        let ce = f.root().join("sys/devices/system/edac/mc/mc0/ce_count");
        let (mut first, p) = child();
        std::fs::remove_file(&ce).unwrap();
        std::os::unix::fs::symlink(&p, &ce).unwrap();
        let on = MemoryConfig {
            enabled: Enabled::On,
            ..MemoryConfig::default()
        };
        let mut m = MemoryCheck::new(f.root(), &on).unwrap();
        let t0 = Instant::now();
        assert_eq!(ok_count(&m.check_at(t0)[0]), value(&p));
        assert!(
            m.controllers[0].ce.is_kept(),
            "a kernel-generated counter is kept open"
        );
        assert!(
            !m.controllers[0].ue.is_kept(),
            "a regular file is read by path"
        );
        // The counter moves: the kept descriptor, read at offset 0, says so.
        let next = if value(&p) <= 990 {
            value(&p) + 7
        } else {
            value(&p) - 7
        };
        std::fs::write(&p, next.to_string()).unwrap();
        assert_eq!(ok_count(&m.check_at(t0 + Duration::from_secs(1))[0]), next);
        assert!(m.controllers[0].ce.is_kept());
        // Gone: the kept descriptor fails, and so does the path.
        first.kill().unwrap();
        first.wait().unwrap();
        let r = m.check_at(t0 + Duration::from_secs(2));
        assert_eq!(r[0].status, CheckStatus::Unknown, "{r:?}");
        assert!(!m.controllers[0].ce.is_kept());
        // Back, as another kernel object: read and kept again.
        let (mut second, p2) = child();
        std::fs::remove_file(&ce).unwrap();
        std::os::unix::fs::symlink(&p2, &ce).unwrap();
        assert_eq!(
            ok_count(&m.check_at(t0 + Duration::from_secs(3))[0]),
            value(&p2)
        );
        assert!(m.controllers[0].ce.is_kept());
        second.kill().unwrap();
        second.wait().unwrap();
    }

    #[test]
    fn the_window_counts_from_the_oldest_sample_inside_it() {
        let mut s = VecDeque::new();
        let t = Instant::now();
        let h = Duration::from_secs(3600);
        assert_eq!(note(&mut s, t, 10, h), 0);
        assert_eq!(note(&mut s, t + Duration::from_secs(120), 40, h), 30);
        // The sample at 0 s is the newest at or before the window start (100 s).
        assert_eq!(note(&mut s, t + Duration::from_secs(3700), 50, h), 40);
        assert_eq!(note(&mut s, t + Duration::from_secs(3790), 50, h), 10);
        assert_eq!(
            note(&mut s, t + Duration::from_secs(3800), 5, h),
            0,
            "a reset counter starts over"
        );
        assert!(s.len() <= SAMPLES as usize + 1);
    }
}
