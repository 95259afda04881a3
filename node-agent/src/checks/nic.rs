//! NIC check: for a required interface, `operstate`, `carrier` and `carrier_changes` from
//! `<root>/sys/class/net/<if>/`.
//!
//! `fail` when the interface is missing, its carrier is 0 (or unreadable, which is how the
//! kernel reports an administratively down link) or its operstate is down; `warn` when the
//! link is up but flapped since the previous round (its carrier change counter grew). The
//! first round has no baseline and reports no flaps. Speed, duplex and error counters are
//! deliberately not judged here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::kept::KeptFile;
use super::{result, under_root};

/// Per interface: the carrier change counter seen in the previous round, and its sysfs
/// files, kept open between rounds.
#[derive(Debug, Default)]
pub struct NicTracker {
    last: HashMap<String, u64>,
    files: HashMap<String, NicFiles>,
}

/// The sysfs files of one interface (see `checks::kept`).
#[derive(Debug)]
struct NicFiles {
    dir: PathBuf,
    operstate: KeptFile,
    carrier: KeptFile,
    carrier_changes: KeptFile,
    /// `uevent`, whose `INTERFACE=` line names the device the kept descriptors read now.
    uevent: KeptFile,
}

impl NicFiles {
    fn new(root: &Path, name: &str) -> Self {
        let dir = under_root(root, &format!("/sys/class/net/{name}"));
        Self {
            operstate: KeptFile::new(dir.join("operstate")),
            carrier: KeptFile::new(dir.join("carrier")),
            carrier_changes: KeptFile::new(dir.join("carrier_changes")),
            uevent: KeptFile::new(dir.join("uevent")),
            dir,
        }
    }

    fn forget(&mut self) {
        self.operstate.forget();
        self.carrier.forget();
        self.carrier_changes.forget();
        self.uevent.forget();
    }

    /// Whether kept descriptors read a device that no longer has this name (renamed while
    /// the agent runs; the name may now be another device's, or nobody's). Read from the
    /// device's own `uevent` with one `pread`, which costs less than a `stat` of the path
    /// (a walk of five sysfs directories). A device that is gone fails the read.
    fn renamed(&mut self, name: &str) -> bool {
        if !self.operstate.is_kept() {
            return false;
        }
        match self.uevent.read_trimmed() {
            Ok(ev) => !ev
                .lines()
                .any(|l| l.strip_prefix("INTERFACE=") == Some(name)),
            Err(_) => true,
        }
    }

    /// Reads the interface's state; `Err` with a reason when it does not exist.
    fn observe(&mut self, name: &str) -> Result<NicObservation, String> {
        // Kept descriptors follow a device that was renamed away; then the path says which
        // device the name is now.
        if self.renamed(name) {
            self.forget();
        }
        if !self.operstate.is_kept() && !self.dir.is_dir() {
            self.forget();
            return Err(format!(
                "interface {name} not found ({} missing)",
                self.dir.display()
            ));
        }
        let operstate = self
            .operstate
            .read_trimmed()
            .map_err(|e| format!("cannot read {}: {e}", self.operstate.path().display()))?;
        let carrier = match self.carrier.read_trimmed().as_deref() {
            Ok("1") => Some(true),
            Ok("0") => Some(false),
            _ => None,
        };
        let carrier_changes = self
            .carrier_changes
            .read_trimmed()
            .ok()
            .and_then(|s| s.parse().ok());
        Ok(NicObservation {
            operstate,
            carrier,
            carrier_changes,
        })
    }
}

/// What was read for one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicObservation {
    /// `operstate` (`up`, `down`, `unknown`, `dormant`, …).
    pub operstate: String,
    /// `carrier`: `Some(true)` for 1, `None` when unreadable (link administratively down).
    pub carrier: Option<bool>,
    /// `carrier_changes`, if the kernel exposes it.
    pub carrier_changes: Option<u64>,
}

/// Reads an interface's state by path; `Err` with a reason when it does not exist.
pub fn observe(root: &Path, name: &str) -> Result<NicObservation, String> {
    NicFiles::new(root, name).observe(name)
}

/// Judges one observation against the previous carrier change counter. Pure.
pub fn evaluate(
    name: &str,
    obs: &Result<NicObservation, String>,
    previous_changes: Option<u64>,
) -> CheckResult {
    let fail = |d: String| result(CheckKind::Nic, name, CheckStatus::Fail, d);
    let o = match obs {
        Ok(o) => o,
        Err(e) => return fail(e.clone()),
    };
    match o.carrier {
        Some(true) => {}
        Some(false) => return fail(format!("no carrier (operstate {})", o.operstate)),
        None => {
            return fail(format!(
                "carrier unreadable: link administratively down (operstate {})",
                o.operstate
            ));
        }
    }
    match o.operstate.as_str() {
        // `unknown` is what many virtual and some physical drivers report while working;
        // with carrier present it is treated as up.
        "up" | "unknown" => {}
        "dormant" | "testing" => {
            return result(
                CheckKind::Nic,
                name,
                CheckStatus::Warn,
                format!("operstate {} with carrier", o.operstate),
            );
        }
        other => return fail(format!("operstate {other}")),
    }
    let flaps = match (previous_changes, o.carrier_changes) {
        (Some(prev), Some(now)) => now.saturating_sub(prev),
        _ => 0,
    };
    if flaps > 0 {
        return result(
            CheckKind::Nic,
            name,
            CheckStatus::Warn,
            format!("link up, but carrier changed {flaps} times since the last report"),
        );
    }
    result(
        CheckKind::Nic,
        name,
        CheckStatus::Ok,
        format!(
            "up, carrier changes {}",
            o.carrier_changes
                .map_or("n/a".to_string(), |c| c.to_string())
        ),
    )
}

/// Observes and judges `name`, updating the tracker's baseline and keeping the files
/// open for the next round.
pub fn check(root: &Path, name: &str, tracker: &mut NicTracker) -> CheckResult {
    let obs = tracker
        .files
        .entry(name.to_string())
        .or_insert_with(|| NicFiles::new(root, name))
        .observe(name);
    let prev = tracker.last.get(name).copied();
    let r = evaluate(name, &obs, prev);
    match obs.ok().and_then(|o| o.carrier_changes) {
        Some(c) => {
            tracker.last.insert(name.to_string(), c);
        }
        None => {
            tracker.last.remove(name);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::NodeFixture;

    fn fx() -> NodeFixture {
        NodeFixture::builder("n1")
            .nic("eth0")
            .nic("eth1")
            .build()
            .unwrap()
    }

    #[test]
    fn healthy_interface_is_ok() {
        let f = fx();
        let mut t = NicTracker::default();
        let r = check(f.root(), "eth0", &mut t);
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        assert_eq!(r.subject, "eth0");
    }

    #[test]
    fn carrier_down_fails_and_recovers() {
        let f = fx();
        let mut t = NicTracker::default();
        f.set_carrier("eth1", false).unwrap();
        let r = check(f.root(), "eth1", &mut t);
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("no carrier"), "{r:?}");
        assert_eq!(check(f.root(), "eth0", &mut t).status, CheckStatus::Ok);
        f.set_carrier("eth1", true).unwrap();
        // Back up, but the counter moved since the last round: a flap.
        let r = check(f.root(), "eth1", &mut t);
        assert_eq!(r.status, CheckStatus::Warn, "{r:?}");
        assert_eq!(check(f.root(), "eth1", &mut t).status, CheckStatus::Ok);
    }

    #[test]
    fn flaps_warn_once_with_the_count() {
        let f = fx();
        let mut t = NicTracker::default();
        assert_eq!(check(f.root(), "eth0", &mut t).status, CheckStatus::Ok);
        f.flap("eth0", 3).unwrap();
        let r = check(f.root(), "eth0", &mut t);
        assert_eq!(r.status, CheckStatus::Warn);
        assert!(r.detail.contains("changed 6 times"), "{r:?}");
        assert_eq!(check(f.root(), "eth0", &mut t).status, CheckStatus::Ok);
    }

    #[test]
    fn first_round_has_no_baseline() {
        let f = fx();
        f.flap("eth0", 5).unwrap();
        let mut t = NicTracker::default();
        assert_eq!(check(f.root(), "eth0", &mut t).status, CheckStatus::Ok);
    }

    #[test]
    fn missing_interface_fails_naming_it() {
        let f = fx();
        let mut t = NicTracker::default();
        let r = check(f.root(), "eth7", &mut t);
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("eth7 not found"), "{r:?}");
        f.remove_nic("eth0").unwrap();
        assert_eq!(check(f.root(), "eth0", &mut t).status, CheckStatus::Fail);
    }

    #[test]
    fn the_loopback_device_is_read_through_kept_files() {
        if !Path::new("/sys/class/net/lo").is_dir() {
            eprintln!("no sysfs here; skipped");
            return;
        }
        let mut t = NicTracker::default();
        for _ in 0..3 {
            let r = check(Path::new("/"), "lo", &mut t);
            assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        }
        let files = &t.files["lo"];
        assert!(files.operstate.is_kept() && files.carrier.is_kept());
        assert!(files.carrier_changes.is_kept() && files.uevent.is_kept());
    }

    /// Runs `ip` with `args`; panics with its stderr when it fails.
    fn ip(args: &str) {
        let out = std::process::Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .expect("ip(8) runs");
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A real network device through the kept descriptors: up, down, removed, back, renamed
    /// away and replaced. Needs root and veth in the network namespace, so run by hand:
    /// `cargo test -p fleetmend-node-agent --lib nic::tests::real_veth -- --ignored`.
    /// Creates the veth pair `a`–`b`, both up, and waits for the kernel to say so.
    fn veth_up(a: &str, b: &str) {
        ip(&format!("link add {a} type veth peer name {b}"));
        ip(&format!("link set {a} up"));
        ip(&format!("link set {b} up"));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    #[test]
    #[ignore = "needs root and creates network devices"]
    fn real_veth_lifecycle_is_seen_through_kept_files() {
        let (a, b, c) = ("fmkept0", "fmkept1", "fmkept2");
        let root = Path::new("/");
        let mut t = NicTracker::default();
        let st = |t: &mut NicTracker| check(root, a, t);
        let _ = std::process::Command::new("ip")
            .args(["link", "del", a])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", c])
            .status();
        veth_up(a, b);
        let r = st(&mut t);
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        assert!(t.files[a].operstate.is_kept());
        // The peer goes down: no carrier, seen on the same descriptors.
        ip(&format!("link set {b} down"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let r = st(&mut t);
        assert_eq!(r.status, CheckStatus::Fail, "{r:?}");
        assert!(r.detail.contains("no carrier"), "{r:?}");
        ip(&format!("link set {b} up"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(st(&mut t).status, CheckStatus::Warn, "a flap");
        assert_eq!(st(&mut t).status, CheckStatus::Ok);
        // Administratively down: carrier unreadable.
        ip(&format!("link set {a} down"));
        let r = st(&mut t);
        assert!(r.detail.contains("administratively down"), "{r:?}");
        // Removed: the kept descriptors answer ENODEV; the path says it is gone.
        ip(&format!("link del {a}"));
        let r = st(&mut t);
        assert!(r.detail.contains("not found"), "{r:?}");
        // Back under the same name.
        veth_up(a, b);
        let r = st(&mut t);
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        // Renamed away while up: the name no longer exists, though the kept descriptors
        // still read the (renamed) device.
        ip(&format!("link set {a} down"));
        ip(&format!("link set {a} name {c}"));
        ip(&format!("link set {c} up"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let r = st(&mut t);
        assert!(r.detail.contains("not found"), "{r:?}");
        // Another device takes the name, administratively down: that one is reported.
        ip(&format!("link set {b} down"));
        ip(&format!("link add {a} type veth peer name fmkept3"));
        let r = st(&mut t);
        assert!(r.detail.contains("administratively down"), "{r:?}");
        ip(&format!("link del {a}"));
        ip(&format!("link del {c}"));
    }

    #[test]
    fn operstate_rules() {
        let obs = |op: &str, carrier| {
            Ok(NicObservation {
                operstate: op.into(),
                carrier,
                carrier_changes: Some(4),
            })
        };
        let st = |o, p| evaluate("x", &o, p).status;
        assert_eq!(st(obs("up", Some(true)), Some(4)), CheckStatus::Ok);
        assert_eq!(st(obs("unknown", Some(true)), None), CheckStatus::Ok);
        assert_eq!(st(obs("dormant", Some(true)), None), CheckStatus::Warn);
        assert_eq!(
            st(obs("lowerlayerdown", Some(true)), None),
            CheckStatus::Fail
        );
        assert_eq!(st(obs("down", None), None), CheckStatus::Fail);
        // A counter that went backwards (driver reload) is not a flap.
        assert_eq!(st(obs("up", Some(true)), Some(9)), CheckStatus::Ok);
    }
}
