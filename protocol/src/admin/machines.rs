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
}

/// Answers to [`MachinesRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MachinesResponse {
    /// Answer to `List`.
    List(Vec<MachineSummary>),
    /// Answer to `Show`.
    Show(Box<MachineDetail>),
    /// Answer to `Add`.
    Added(MachineSummary),
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
}
