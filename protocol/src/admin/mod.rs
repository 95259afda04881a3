//! The admin API, spoken by `coordinatorctl` with an admin certificate.
//!
//! After the hello exchange on the connection's first stream, every request opens its own
//! bidirectional stream: one [`AdminRequest`] frame in, one [`AdminResponse`] frame out. Each
//! area of the API has its own request/response pair in a submodule, so the envelope stays
//! small and areas can grow independently. Same postcard rules as [`crate::messages`]:
//! append variants, never reorder.

pub mod diagnostics;
pub mod fence;
pub mod machines;
pub mod remediation;
pub mod repair;

use serde::{Deserialize, Serialize};

use crate::messages::Refusal;

/// One admin request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// Inventory and health.
    Machines(machines::MachinesRequest),
    /// The repair queue.
    RepairQueue(repair::RepairQueueRequest),
    /// Diagnostics collected from agents.
    Diagnostics(diagnostics::DiagnosticsRequest),
    /// Automatic remediation: switches, limits, the decision journal.
    Remediation(remediation::RemediationRequest),
    /// Fence flows.
    Fence(fence::FenceRequest),
    /// This coordinator's role: who it is, whether it leads, its epoch and since when.
    Status,
}

/// The answer to one [`AdminRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminResponse {
    /// Answer to a [`AdminRequest::Machines`].
    Machines(machines::MachinesResponse),
    /// The request failed; the reason says why and what to do.
    Error(Refusal),
    /// Answer to a [`AdminRequest::RepairQueue`].
    RepairQueue(repair::RepairQueueResponse),
    /// Answer to a [`AdminRequest::Diagnostics`].
    Diagnostics(diagnostics::DiagnosticsResponse),
    /// Answer to a [`AdminRequest::Remediation`].
    Remediation(remediation::RemediationResponse),
    /// Answer to a [`AdminRequest::Fence`].
    Fence(fence::FenceResponse),
    /// An answer given while the coordinator's database writes are failing (a full disk, a
    /// read-only remount): what it shows is as last written, as a state the coordinator
    /// could not store is not shown (a machine that died may still read `healthy`), and
    /// changes cannot be stored. Clients show the answer and say this beside it.
    StoreFailing {
        /// The database's error, as `/healthz` gives it.
        reason: String,
        /// The answer itself.
        answer: Box<AdminResponse>,
    },
    /// Answer to [`AdminRequest::Status`].
    Status(CoordinatorStatus),
}

/// A coordinator's role as it reports it (`coordinatorctl status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStatus {
    /// Its name.
    pub name: String,
    /// `leader`, `standby`, `starting` or `deposed`.
    pub role: String,
    /// The epoch it leads with (0 for the sole coordinator of a SQLite store).
    pub epoch: u64,
    /// Since when it has played this role (Unix ms), when known.
    pub since_unix_ms: Option<i64>,
    /// Its store: `sqlite` or `etcd`.
    pub store: String,
    /// True when its role comes from an election (several coordinators may share its store).
    pub elected: bool,
}
