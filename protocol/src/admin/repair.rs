//! Admin requests about the repair queue: the words of `ckecli repair-queue`.
//!
//! The entry's fields are CKE's `RepairQueueEntry` fields (plus `serial`); times travel as
//! milliseconds since the Unix epoch and `coordinatorctl` renders CKE's JSON shape from them.
//! Same postcard rules as the rest of the admin API: append variants, never reorder.

use serde::{Deserialize, Serialize};

/// Requests about the repair queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RepairQueueRequest {
    /// Appends an entry (`repair-queue add OPERATION MACHINE_TYPE ADDRESS [SERIAL]`).
    Add(AddRepairEntry),
    /// Every entry, oldest first.
    List,
    /// One entry with its history.
    Show {
        /// The entry's index.
        index: u64,
    },
    /// Marks one entry for deletion; a running entry is cancelled.
    Delete {
        /// The entry's index.
        index: u64,
    },
    /// Marks every succeeded or failed entry for deletion.
    DeleteFinished,
    /// Marks every queued or processing entry for deletion.
    DeleteUnfinished,
    /// Enables processing.
    Enable,
    /// Disables processing: nothing new starts, drains are abandoned, health checks go on.
    Disable,
    /// Whether processing is enabled.
    IsEnabled,
    /// Clears every entry's drain backoff.
    ResetBackoff,
    /// Entry counts by status, cheap enough to poll (`repair-queue wait`).
    Counts,
    /// `Add` as `coordinatorctl repair-queue add` sends it: checked against the inventory
    /// first. An address no machine has is refused unless `force`; a serial that
    /// contradicts the machine's is refused; an empty serial or machine type is filled
    /// from the machine's record; a retired or retiring machine is refused unless `force`.
    AddChecked {
        /// The entry as typed.
        entry: AddRepairEntry,
        /// Queue it even for an address the inventory does not know.
        force: bool,
    },
}

/// What `repair-queue add` carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRepairEntry {
    /// Operation name, e.g. `unreachable`.
    pub operation: String,
    /// Machine type, selects the repair procedure.
    pub machine_type: String,
    /// The machine's IP address.
    pub address: String,
    /// The machine's serial, may be empty.
    pub serial: String,
}

/// Answers to [`RepairQueueRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RepairQueueResponse {
    /// Answer to `Add`: the new entry.
    Added(RepairEntry),
    /// Answer to `List`.
    List(Vec<RepairEntry>),
    /// Answer to `Show`.
    Show(Box<RepairEntryDetail>),
    /// Answer to `Delete`, `DeleteFinished`, `DeleteUnfinished`: how many entries were marked.
    Deleted {
        /// Entries newly marked for deletion.
        count: u64,
    },
    /// Answer to `Enable`, `Disable` and `IsEnabled`: the state now.
    Enabled(bool),
    /// Answer to `ResetBackoff`: how many entries had a backoff.
    BackoffReset {
        /// Entries whose backoff was cleared.
        count: u64,
    },
    /// Answer to `Counts`.
    Counts(RepairQueueCounts),
}

/// Status of an entry, CKE's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairStatus {
    /// Waiting for a slot.
    Queued,
    /// Being repaired.
    Processing,
    /// The machine became healthy (and the success command, if any, succeeded).
    Succeeded,
    /// The repair ended without the machine becoming healthy, or a command failed.
    Failed,
}

impl RepairStatus {
    /// CKE's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairStatus::Queued => "queued",
            RepairStatus::Processing => "processing",
            RepairStatus::Succeeded => "succeeded",
            RepairStatus::Failed => "failed",
        }
    }

    /// Parses CKE's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => RepairStatus::Queued,
            "processing" => RepairStatus::Processing,
            "succeeded" => RepairStatus::Succeeded,
            "failed" => RepairStatus::Failed,
            _ => return None,
        })
    }

    /// True for succeeded and failed.
    pub fn is_finished(self) -> bool {
        matches!(self, RepairStatus::Succeeded | RepairStatus::Failed)
    }

    /// Every status, in display order.
    pub const ALL: [RepairStatus; 4] = [
        RepairStatus::Queued,
        RepairStatus::Processing,
        RepairStatus::Succeeded,
        RepairStatus::Failed,
    ];
}

/// Status of the current step, CKE's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairStepStatus {
    /// Before the step's drain or command.
    Waiting,
    /// Pods are being evicted from the node.
    Draining,
    /// The repair command was started; the health check is watched.
    Watching,
}

impl RepairStepStatus {
    /// CKE's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairStepStatus::Waiting => "waiting",
            RepairStepStatus::Draining => "draining",
            RepairStepStatus::Watching => "watching",
        }
    }

    /// Parses CKE's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "waiting" => RepairStepStatus::Waiting,
            "draining" => RepairStepStatus::Draining,
            "watching" => RepairStepStatus::Watching,
            _ => return None,
        })
    }
}

/// One repair queue entry: CKE's `RepairQueueEntry` fields plus the serial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairEntry {
    /// Index, never reused.
    pub index: u64,
    /// The machine's address.
    pub address: String,
    /// The Kubernetes Node, empty when the machine is not a node (or not looked up yet).
    pub nodename: String,
    /// The machine's serial, may be empty.
    pub serial: String,
    /// Machine type.
    pub machine_type: String,
    /// Operation.
    pub operation: String,
    /// Status.
    pub status: RepairStatus,
    /// Current step, 0-based.
    pub step: u32,
    /// Status of the current step.
    pub step_status: RepairStepStatus,
    /// Marked for deletion; dequeued (and cancelled if running) by the engine.
    pub deleted: bool,
    /// Last change of status, step or step status, ms since the Unix epoch.
    pub last_transition_time_unix_ms: u64,
    /// Drain retries so far (linear backoff).
    pub drain_backoff_count: u32,
    /// No drain before this time, ms since the Unix epoch; 0 = none.
    pub drain_backoff_expire_unix_ms: u64,
}

/// One line of an entry's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairHistoryRecord {
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// Status after the event.
    pub status: RepairStatus,
    /// Step after the event.
    pub step: u32,
    /// Step status after the event.
    pub step_status: RepairStepStatus,
    /// What happened, e.g. `command-failed`.
    pub event: String,
    /// Why, for a person.
    pub detail: String,
    /// Command output (stdout then stderr, truncated), empty if none.
    pub output: String,
}

/// Answer to `Show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairEntryDetail {
    /// The entry.
    pub entry: RepairEntry,
    /// Its history, oldest first.
    pub history: Vec<RepairHistoryRecord>,
    /// Diagnostics collected for it, oldest first, without their contents
    /// (`coordinatorctl diagnostics get ADDRESS --id ID` prints one).
    pub diagnostics: Vec<super::diagnostics::DiagnosticsSummary>,
}

/// Entry counts by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairQueueCounts {
    /// Whether processing is enabled.
    pub enabled: bool,
    /// Queued entries.
    pub queued: u64,
    /// Processing entries.
    pub processing: u64,
    /// Succeeded entries.
    pub succeeded: u64,
    /// Failed entries.
    pub failed: u64,
    /// Entries marked for deletion and not yet dequeued.
    pub deleting: u64,
}

impl RepairQueueCounts {
    /// True when nothing is queued or processing.
    pub fn all_finished(&self) -> bool {
        self.queued == 0 && self.processing == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_spellings_round_trip() {
        for s in RepairStatus::ALL {
            assert_eq!(RepairStatus::parse(s.as_str()), Some(s));
        }
        for s in [
            RepairStepStatus::Waiting,
            RepairStepStatus::Draining,
            RepairStepStatus::Watching,
        ] {
            assert_eq!(RepairStepStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RepairStatus::parse("done"), None);
    }

    #[test]
    fn request_round_trips_through_postcard() {
        let req = RepairQueueRequest::Add(AddRepairEntry {
            operation: "unreachable".into(),
            machine_type: "qemu".into(),
            address: "10.0.0.1".into(),
            serial: "abc".into(),
        });
        let bytes = postcard::to_stdvec(&req).unwrap();
        assert_eq!(
            postcard::from_bytes::<RepairQueueRequest>(&bytes).unwrap(),
            req
        );
    }
}
