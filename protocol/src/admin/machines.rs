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
    /// The last report received, if any.
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
