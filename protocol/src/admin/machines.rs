//! Admin requests about machines: inventory and live health.

use serde::{Deserialize, Serialize};

use crate::messages::HealthReport;

/// Requests about machines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MachinesRequest {
    /// Every machine with its state.
    List,
    /// One machine in detail.
    Show {
        /// The machine's address.
        address: String,
    },
    /// Registers or updates a machine.
    Add(MachineSpec),
    /// Registers or updates several machines at once, all or nothing.
    Import(Vec<MachineSpec>),
    /// Removes a machine's record. Refused while a repair of it is active unless `force`,
    /// which cancels the repair.
    Delete {
        /// The machine's address.
        address: String,
        /// Cancel an active repair instead of refusing.
        force: bool,
    },
    /// Sets an admin state (`updating`, `retiring`, `retired`), or `auto` to hand the
    /// machine back to health derivation.
    SetState {
        /// The machine's address.
        address: String,
        /// The state's name, or `auto`.
        state: String,
    },
    /// One machine in detail, answered with [`MachinesResponse::ShowWithInterval`] (added
    /// last: the variants before it keep their encoding). A coordinator from before it refuses
    /// it as malformed; the client then asks [`MachinesRequest::Show`].
    ShowWithInterval {
        /// The machine's address.
        address: String,
    },
    /// One machine in detail with every check of its last report, answered with
    /// [`MachinesResponse::ShowWithChecks`] (added after `ShowWithInterval`). A coordinator
    /// from before it refuses it as malformed; the client then asks `ShowWithInterval`.
    ShowWithChecks {
        /// The machine's address.
        address: String,
    },
}

/// Answers to [`MachinesRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MachinesResponse {
    /// Answer to `List`.
    List(Vec<MachineSummary>),
    /// Answer to `Show`.
    Show(Box<MachineDetail>),
    /// Answer to `Add`.
    Added(Box<MachineSummary>),
    /// Answer to `Import`, one summary per imported machine.
    Imported(Vec<MachineSummary>),
    /// Answer to `Delete`.
    Deleted {
        /// The machine deleted.
        address: String,
        /// Repair entries cancelled by `force` (their indexes).
        cancelled_repairs: Vec<u64>,
    },
    /// Answer to `SetState`: the machine now.
    StateSet(Box<MachineSummary>),
    /// Answer to `ShowWithInterval`: the detail and the report interval its agent announced
    /// in the last report (0: not said), which [`MachineDetail`]'s wire form leaves out.
    ShowWithInterval {
        /// The machine.
        detail: Box<MachineDetail>,
        /// The last report's [`HealthReport::report_interval_ms`].
        report_interval_ms: u64,
    },
    /// Answer to `ShowWithChecks`: as `ShowWithInterval`, and the last report's plugin, gpu
    /// and memory results, which the detail leaves out so that every coordinatorctl can
    /// read it (see [`crate::messages::CheckKind::known_to_every_coordinator`]).
    ShowWithChecks {
        /// The machine, its last report without the newer kinds.
        detail: Box<MachineDetail>,
        /// The last report's [`HealthReport::report_interval_ms`].
        report_interval_ms: u64,
        /// The last report's results of the newer kinds, in report order.
        newer_checks: Vec<crate::messages::CheckResult>,
    },
}

/// What an operator registers about a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSpec {
    /// Address (the key, as in CKE).
    pub address: String,
    /// Hostname; must match the name in the node's certificate.
    pub hostname: String,
    /// Serial number.
    pub serial: String,
    /// Rack.
    pub rack: String,
    /// Role, e.g. `cs` or `ss`.
    pub role: String,
    /// Machine type: selects the repair procedure.
    pub machine_type: String,
    /// Free-form labels, `key=value`.
    pub labels: Vec<(String, String)>,
}

/// A machine's line in `machines list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSummary {
    /// Registered attributes.
    pub spec: MachineSpec,
    /// Health state: uninitialized, healthy, unhealthy, unreachable, awaiting-registration, …
    pub state: String,
    /// When the state was entered, milliseconds since the Unix epoch.
    pub state_since_unix_ms: u64,
    /// Failing checks as `kind:subject`, for the table.
    pub failing: Vec<String>,
    /// Why the machine entered its state.
    pub reason: String,
    /// When the last report was received, by the coordinator's clock.
    pub last_report_unix_ms: Option<u64>,
    /// Whether an agent connection for this machine is open now.
    pub connected: bool,
}

/// One recorded state transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTransition {
    /// Previous state.
    pub from: String,
    /// New state.
    pub to: String,
    /// When, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Why.
    pub reason: String,
}

/// Answer to `machines show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineDetail {
    /// Summary line.
    pub summary: MachineSummary,
    /// The last report received, if any. Encoded for the admin API as reports were before
    /// [`HealthReport::report_interval_ms`] ([`crate::messages::v1`]), so a coordinatorctl
    /// and a coordinator of releases on either side of it read each other's `machines show`
    /// (the interval travels in [`MachinesResponse::ShowWithInterval`]); JSON keeps it.
    #[serde(with = "report_before_intervals")]
    pub last_report: Option<HealthReport>,
    /// When the last report was received, by the coordinator's clock.
    pub last_report_unix_ms: Option<u64>,
    /// Recent transitions, oldest first.
    pub transitions: Vec<StateTransition>,
    /// Boot id last announced by the agent.
    pub boot_id: Option<String>,
    /// Version of the agent, from its hello.
    pub agent_version: Option<String>,
    /// Start of the current unbroken run of reports with no failing check.
    pub healthy_since_unix_ms: Option<u64>,
    /// Each currently failing check (`kind:subject`) and since when it fails.
    pub failing_since: Vec<(String, u64)>,
    /// The last crash-dump notice from the machine's kdump initramfs, if any.
    pub kdump: Option<KdumpDetail>,
}

/// What `machines show` says about a machine's crash dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdumpDetail {
    /// The last phase reported (`start`: dumping, `done`: dump written).
    pub phase: crate::messages::KdumpPhase,
    /// True while the coordinator holds the machine for down because of the dump (a
    /// "dumping" with no "done" and no agent report since).
    pub dumping_now: bool,
    /// When the last "dumping" notice arrived (coordinator clock).
    pub dumping_since_unix_ms: Option<u64>,
    /// When "dump done" arrived, if it did after the last "dumping".
    pub done_at_unix_ms: Option<u64>,
    /// The crashed kernel's boot id, if the initramfs knew it.
    pub boot_id: Option<String>,
    /// The node's own time in the last notice.
    pub node_time_unix_ms: u64,
}

/// [`MachineDetail::last_report`] in postcard as a [`crate::messages::v1::HealthReport`], in
/// human-readable formats (JSON) whole.
mod report_before_intervals {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::messages::{HealthReport, v1};

    pub(super) fn serialize<S: Serializer>(
        r: &Option<HealthReport>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return r.serialize(s);
        }
        r.clone()
            .map(|r| v1::HealthReport {
                seq: r.seq,
                time_unix_ms: r.time_unix_ms,
                boot_id: r.boot_id,
                checks: r.checks,
            })
            .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<HealthReport>, D::Error> {
        if d.is_human_readable() {
            return Option::<HealthReport>::deserialize(d);
        }
        Ok(
            Option::<v1::HealthReport>::deserialize(d)?.map(|r| HealthReport {
                seq: r.seq,
                time_unix_ms: r.time_unix_ms,
                boot_id: r.boot_id,
                checks: r.checks,
                report_interval_ms: 0,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MAX_FRAME_LEN;
    use crate::messages::{CheckKind, CheckResult, CheckStatus, v1};
    use crate::{decode_payload, encode_frame};

    /// `MachineDetail` as coordinators and coordinatorctls before report intervals encode
    /// it: the same fields, the last report in the [`v1`] form.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct DetailBeforeIntervals {
        summary: MachineSummary,
        last_report: Option<v1::HealthReport>,
        last_report_unix_ms: Option<u64>,
        transitions: Vec<StateTransition>,
        boot_id: Option<String>,
        agent_version: Option<String>,
        healthy_since_unix_ms: Option<u64>,
        failing_since: Vec<(String, u64)>,
        kdump: Option<KdumpDetail>,
    }

    fn detail(report_interval_ms: u64) -> MachineDetail {
        MachineDetail {
            summary: MachineSummary {
                spec: MachineSpec {
                    address: "10.0.1.12".into(),
                    hostname: "lab-2".into(),
                    serial: String::new(),
                    rack: "rack-1".into(),
                    role: String::new(),
                    machine_type: "lab".into(),
                    labels: vec![],
                },
                state: "healthy".into(),
                state_since_unix_ms: 1,
                failing: vec![],
                reason: "all checks passing".into(),
                last_report_unix_ms: Some(2),
                connected: true,
            },
            last_report: Some(HealthReport {
                seq: 43,
                time_unix_ms: 2,
                boot_id: "b1".into(),
                checks: vec![CheckResult {
                    kind: CheckKind::Disk,
                    subject: "/var".into(),
                    status: CheckStatus::Ok,
                    detail: String::new(),
                }],
                report_interval_ms,
            }),
            last_report_unix_ms: Some(2),
            transitions: vec![],
            boot_id: Some("b1".into()),
            agent_version: Some("0.1.0".into()),
            healthy_since_unix_ms: Some(1),
            failing_since: vec![],
            kdump: None,
        }
    }

    #[test]
    fn machines_show_reads_across_the_report_interval_change_and_json_keeps_it() {
        // This release's answer, read by a coordinatorctl from before the interval.
        let frame = encode_frame(&detail(5_000), MAX_FRAME_LEN).unwrap();
        let old: DetailBeforeIntervals = decode_payload(&frame[4..]).unwrap();
        assert_eq!(old.last_report.unwrap().seq, 43);
        // An older coordinator's answer, read by this release (no interval).
        let old = DetailBeforeIntervals {
            last_report: Some(v1::HealthReport {
                seq: 43,
                time_unix_ms: 2,
                boot_id: "b1".into(),
                checks: detail(0).last_report.unwrap().checks,
            }),
            ..decode_payload(&frame[4..]).unwrap()
        };
        let frame = encode_frame(&old, MAX_FRAME_LEN).unwrap();
        assert_eq!(
            decode_payload::<MachineDetail>(&frame[4..]).unwrap(),
            detail(0)
        );
        // JSON (`machines show --json`) keeps the interval.
        let js = serde_json::to_string(&detail(5_000)).unwrap();
        assert!(js.contains("\"report_interval_ms\":5000"), "{js}");
        assert_eq!(
            serde_json::from_str::<MachineDetail>(&js).unwrap(),
            detail(5_000)
        );
    }
}
