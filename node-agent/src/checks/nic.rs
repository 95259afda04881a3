//! NIC check: for a required interface, `operstate`, `carrier` and `carrier_changes` from
//! `<root>/sys/class/net/<if>/`.
//!
//! `fail` when the interface is missing, its carrier is 0 (or unreadable, which is how the
//! kernel reports an administratively down link) or its operstate is down; `warn` when the
//! link is up but flapped since the previous round (its carrier change counter grew). The
//! first round has no baseline and reports no flaps. Speed, duplex and error counters are
//! deliberately not judged here.

use std::collections::HashMap;
use std::path::Path;

use protocol::messages::{CheckKind, CheckResult, CheckStatus};

use super::{read_trimmed, result, under_root};

/// Carrier change counters seen in the previous round, per interface.
#[derive(Debug, Default, Clone)]
pub struct NicTracker {
    last: HashMap<String, u64>,
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

/// Reads an interface's state; `Err` with a reason when it does not exist.
pub fn observe(root: &Path, name: &str) -> Result<NicObservation, String> {
    let dir = under_root(root, &format!("/sys/class/net/{name}"));
    if !dir.is_dir() {
        return Err(format!(
            "interface {name} not found ({} missing)",
            dir.display()
        ));
    }
    let operstate = read_trimmed(&dir.join("operstate"))
        .map_err(|e| format!("cannot read {}: {e}", dir.join("operstate").display()))?;
    let carrier = match read_trimmed(&dir.join("carrier")).as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    };
    let carrier_changes = read_trimmed(&dir.join("carrier_changes"))
        .ok()
        .and_then(|s| s.parse().ok());
    Ok(NicObservation {
        operstate,
        carrier,
        carrier_changes,
    })
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

/// Observes and judges `name`, updating the tracker's baseline.
pub fn check(root: &Path, name: &str, tracker: &mut NicTracker) -> CheckResult {
    let obs = observe(root, name);
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
