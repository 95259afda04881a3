//! Admin API: fence flows and their steps (`coordinatorctl fence list|show ID`).

use serde::{Deserialize, Serialize};

/// A fence request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FenceRequest {
    /// The newest flows, at most `limit`.
    List {
        /// How many at most.
        limit: u32,
    },
    /// One flow with its steps.
    Show {
        /// The flow's id.
        id: u64,
    },
    /// The newest flows of one machine, at most `limit` (added last: the variants before
    /// it keep their encoding).
    ListFor {
        /// The machine's address or hostname.
        machine: String,
        /// How many at most.
        limit: u32,
    },
}

/// The answer to a [`FenceRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FenceResponse {
    /// Answer to `List`, newest first.
    List(Vec<FenceFlowSummary>),
    /// Answer to `Show`.
    Show(Box<FenceFlowDetail>),
}

/// One fence flow as committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceFlowSummary {
    /// The flow's id.
    pub id: u64,
    /// The machine's address.
    pub address: String,
    /// The machine's serial.
    pub serial: String,
    /// Its Kubernetes Node.
    pub node: String,
    /// The state (`plan`, `power-off`, …, `done`, `failed`).
    pub state: String,
    /// Why it failed (for `failed`), or the failure it is recovering from.
    pub failure: String,
    /// How the workload is released: `taint`, `delete-node`, or empty before the plan.
    pub release: String,
    /// Leave the machine off after a failure past the release.
    pub keep_off: bool,
    /// When the current state was entered, milliseconds since the Unix epoch.
    pub state_since_unix_ms: i64,
    /// When power-off was confirmed, if it was.
    pub confirmed_off_unix_ms: Option<i64>,
    /// When the machine was powered on again, if it was.
    pub powered_on_unix_ms: Option<i64>,
}

/// One fence flow with its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceFlowDetail {
    /// The flow.
    pub flow: FenceFlowSummary,
    /// Its steps, oldest first.
    pub steps: Vec<FenceFlowStep>,
}

/// One committed step of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceFlowStep {
    /// When it was committed, milliseconds since the Unix epoch.
    pub at_unix_ms: i64,
    /// The state entered (or kept).
    pub state: String,
    /// What happened.
    pub event: String,
}
