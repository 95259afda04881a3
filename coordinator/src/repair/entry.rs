//! A repair queue entry as the engine holds it: CKE's fields plus where, inside its step,
//! the coordinator stands ([`Phase`]), so that a restart resumes without re-running a command
//! that already completed.
//!
//! Conversion to the wire type lives here; persistence lives in [`super::store`].

use jiff::Timestamp;
use protocol::admin::repair::{RepairEntry, RepairStatus, RepairStepStatus};

use crate::clock::to_unix_ms;

/// Where the coordinator stands inside the current step. Not part of CKE's entry; it is what
/// makes "resume where it stood" exact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Nothing in flight (queued, waiting, draining, finished).
    Idle,
    /// Attempt `attempt` (0-based) of the step's repair command was started and has not
    /// reported. After a restart it is run again: it never completed.
    Command {
        /// 0-based attempt.
        attempt: u32,
    },
    /// An attempt failed; attempt `attempt` starts at `until`.
    RetryWait {
        /// The attempt to run next.
        attempt: u32,
        /// When.
        until: Timestamp,
    },
    /// The step's command completed at `since`; the health check is watched until
    /// `since + watch_seconds`.
    Watching {
        /// When the command completed.
        since: Timestamp,
    },
    /// The machine was found healthy; the success command runs (again, after a restart).
    SuccessCommand,
}

impl Phase {
    /// Name stored in SQLite.
    pub fn kind(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Command { .. } => "command",
            Phase::RetryWait { .. } => "retry-wait",
            Phase::Watching { .. } => "watching",
            Phase::SuccessCommand => "success-command",
        }
    }
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Index, never reused.
    pub index: u64,
    /// The machine's address.
    pub address: String,
    /// The Kubernetes Node, empty if none (or not known yet).
    pub nodename: String,
    /// Serial, may be empty.
    pub serial: String,
    /// Machine type.
    pub machine_type: String,
    /// Operation.
    pub operation: String,
    /// CKE status.
    pub status: RepairStatus,
    /// Current step.
    pub step: u32,
    /// CKE step status.
    pub step_status: RepairStepStatus,
    /// Marked for deletion.
    pub deleted: bool,
    /// Last change of status, step or step status.
    pub last_transition: Timestamp,
    /// Drain retries so far.
    pub drain_backoff_count: u32,
    /// No drain before this time.
    pub drain_backoff_expire: Option<Timestamp>,
    /// Progress inside the step.
    pub phase: Phase,
    /// The agent's boot id when a power step's command started (empty otherwise):
    /// `@agent-healthy` then requires a different one.
    pub boot_id_before: String,
}

impl Entry {
    /// A new queued entry (index 0 until stored).
    pub fn new_queued(
        address: &str,
        serial: &str,
        machine_type: &str,
        operation: &str,
        now: Timestamp,
    ) -> Self {
        Self {
            index: 0,
            address: address.to_string(),
            nodename: String::new(),
            serial: serial.to_string(),
            machine_type: machine_type.to_string(),
            operation: operation.to_string(),
            status: RepairStatus::Queued,
            step: 0,
            step_status: RepairStepStatus::Waiting,
            deleted: false,
            last_transition: now,
            drain_backoff_count: 0,
            drain_backoff_expire: None,
            phase: Phase::Idle,
            boot_id_before: String::new(),
        }
    }

    /// True while the entry holds or waits for a repair slot.
    pub fn is_active(&self) -> bool {
        matches!(self.status, RepairStatus::Queued | RepairStatus::Processing)
    }

    /// The wire form.
    pub fn to_wire(&self) -> RepairEntry {
        RepairEntry {
            index: self.index,
            address: self.address.clone(),
            nodename: self.nodename.clone(),
            serial: self.serial.clone(),
            machine_type: self.machine_type.clone(),
            operation: self.operation.clone(),
            status: self.status,
            step: self.step,
            step_status: self.step_status,
            deleted: self.deleted,
            last_transition_time_unix_ms: ms(self.last_transition),
            drain_backoff_count: self.drain_backoff_count,
            drain_backoff_expire_unix_ms: self.drain_backoff_expire.map(ms).unwrap_or(0),
        }
    }
}

fn ms(t: Timestamp) -> u64 {
    u64::try_from(to_unix_ms(t)).unwrap_or(0)
}

/// One history line, before it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    /// What happened, e.g. `command-failed`.
    pub event: &'static str,
    /// Why.
    pub detail: String,
    /// Command output, empty if none.
    pub output: String,
}

impl HistoryEvent {
    /// An event without output.
    pub fn new(event: &'static str, detail: impl Into<String>) -> Self {
        Self {
            event,
            detail: detail.into(),
            output: String::new(),
        }
    }

    /// Adds command output.
    pub fn with_output(mut self, output: impl Into<String>) -> Self {
        self.output = output.into();
        self
    }
}

/// Which of an entry's commands a power request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFor {
    /// Attempt `attempt` of step `step`'s repair command.
    Repair {
        /// The step.
        step: u32,
        /// 0-based attempt.
        attempt: u32,
    },
    /// The operation's health check.
    Health,
    /// The operation's success command.
    Success,
}

/// The id of a power request: `<store id>-repair-<index>-step<s>-attempt<a>` (or `-health`,
/// `-success`).
///
/// The same command of the same entry gets the same id after a coordinator restart, so the
/// gateway, which executes an id at most once, never acts twice for one attempt. The store's
/// identity ([`crate::store::identity`]) makes it unique across databases: another database's
/// entry 3 is not this one's.
pub fn power_request_id(store_id: &str, index: u64, what: RequestFor) -> String {
    match what {
        RequestFor::Repair { step, attempt } => {
            format!("{store_id}-repair-{index}-step{step}-attempt{attempt}")
        }
        RequestFor::Health => format!("{store_id}-repair-{index}-health"),
        RequestFor::Success => format!("{store_id}-repair-{index}-success"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_request_ids_carry_the_store_identity() {
        let a = power_request_id(
            "aa11",
            3,
            RequestFor::Repair {
                step: 0,
                attempt: 1,
            },
        );
        assert_eq!(a, "aa11-repair-3-step0-attempt1");
        assert_ne!(
            a,
            power_request_id(
                "bb22",
                3,
                RequestFor::Repair {
                    step: 0,
                    attempt: 1
                }
            ),
            "two databases' entry 3 must not share ids"
        );
        assert_eq!(
            power_request_id("aa11", 3, RequestFor::Health),
            "aa11-repair-3-health"
        );
        assert_eq!(
            power_request_id("aa11", 3, RequestFor::Success),
            "aa11-repair-3-success"
        );
    }
}
