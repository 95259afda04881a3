//! Admin requests about automatic remediation: the operator switches (`auto-repair`,
//! `constraints`, `remediation pause|resume|observe|confirm-outage`, `machines clear`), the
//! limits holding now (`remediation status`) and the decision journal (`events`).
//!
//! Decisions travel as plain strings (outcome, rule) so the CLI renders them without knowing
//! the coordinator's rule set; times are milliseconds since the Unix epoch. Same postcard
//! rules as the rest of the admin API: append variants, never reorder.

use serde::{Deserialize, Serialize};

/// Requests about automatic remediation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RemediationRequest {
    /// Which limits hold now, the switches and the last pass.
    Status,
    /// Stops new remediations (running repairs go on) until `Resume`.
    Pause {
        /// Why, shown in every held decision.
        reason: String,
    },
    /// Lifts a pause.
    Resume,
    /// Observe mode on (`true`: record "would enqueue", enqueue nothing) or off.
    Observe(bool),
    /// An operator says the silence of many agents is real: self-isolation stops holding.
    ConfirmOutage,
    /// sabakan-style auto-repair on (`true`) or off.
    SetAutoRepair(bool),
    /// Whether sabakan-style auto-repair is on.
    IsAutoRepairEnabled,
    /// Replaces auto-repair's `having` / `notHaving` (JSON text, sabakan's variables).
    SetVariables {
        /// `{"having": {...}, "notHaving": {...}}`.
        json: String,
    },
    /// Auto-repair's `having` / `notHaving` in force, as JSON text.
    GetVariables,
    /// Sets one CKE constraint (`maximum-repair-queue-entries`,
    /// `wait-seconds-to-repair-rebooting`).
    SetConstraint {
        /// The constraint's name.
        name: String,
        /// Its new value.
        value: u64,
    },
    /// The constraints in force.
    Constraints,
    /// Clears a machine's `needs-human`: its earlier remediations no longer count.
    ClearMachine {
        /// The machine's address.
        address: String,
    },
    /// Journal lines, oldest first.
    Events(EventsQuery),
}

/// Which journal lines `events` wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsQuery {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only lines last seen at or after this time (ms since the Unix epoch).
    pub since_unix_ms: Option<u64>,
    /// Only lines changed after this journal sequence number (for `--follow`).
    pub after_seq: Option<u64>,
    /// At most this many lines (the newest); 0 = the server's default.
    pub limit: u32,
}

/// Answers to [`RemediationRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RemediationResponse {
    /// Answer to `Status` and to every switch: the state now.
    Status(Box<RemediationStatus>),
    /// Answer to `SetAutoRepair` and `IsAutoRepairEnabled`.
    AutoRepairEnabled(bool),
    /// Answer to `SetVariables` and `GetVariables`: the JSON text in force.
    Variables(String),
    /// Answer to `SetConstraint` and `Constraints`.
    Constraints(Constraints),
    /// Answer to `ClearMachine`: when the machine was cleared.
    Cleared {
        /// The machine.
        address: String,
        /// When, ms since the Unix epoch.
        at_unix_ms: u64,
        /// Whether its newest decision held it as `needs-human` (otherwise the clear only
        /// forgot remediations that had not reached the limit yet).
        was_needs_human: bool,
    },
    /// Answer to `Events`.
    Events(Vec<JournalLine>),
}

/// CKE's constraints that auto-repair obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraints {
    /// Existing entries plus new candidates above this: none enqueued.
    pub maximum_repair_queue_entries: u64,
    /// A rebooting or non-node machine waits this long first.
    pub wait_seconds_to_repair_rebooting: u64,
}

/// What `remediation status` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemediationStatus {
    /// Observe mode in force (config or switch).
    pub observe: bool,
    /// sabakan-style auto-repair in force.
    pub auto_repair_enabled: bool,
    /// The pause's reason and since when, if paused.
    pub paused: Option<(String, u64)>,
    /// When an operator last confirmed an outage.
    pub outage_confirmed_unix_ms: Option<u64>,
    /// Whether a Kubernetes view is configured (else the agent signal alone counts).
    pub kubernetes: bool,
    /// When the last pass ran.
    pub last_pass_unix_ms: Option<u64>,
    /// Every limit's state in the last pass.
    pub limits: Vec<LimitLine>,
    /// The last pass's decisions (admitted first, then held, then findings), at most
    /// a screenful; `coordinatorctl events` has them all.
    pub decisions: Vec<JournalLine>,
    /// Decisions of the last pass left out of `decisions`.
    pub decisions_omitted: u64,
}

/// One limit in `remediation status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitLine {
    /// The rule, kebab-case.
    pub rule: String,
    /// Whether it holds anything now.
    pub holding: bool,
    /// Its numbers.
    pub sentence: String,
}

/// One decision-journal line. Identical decisions repeated pass after pass are one line
/// whose `count` and `last_unix_ms` grow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalLine {
    /// Sequence number: grows whenever the line is written or repeated.
    pub seq: u64,
    /// First time this decision was made.
    pub first_unix_ms: u64,
    /// Last time it was made.
    pub last_unix_ms: u64,
    /// How many passes made it.
    pub count: u64,
    /// The machine.
    pub address: String,
    /// Its failure domain.
    pub domain: String,
    /// `admitted`, `would-enqueue`, `held`, `finding`.
    pub outcome: String,
    /// The rule, kebab-case.
    pub rule: String,
    /// The proposed operation, if any.
    pub operation: Option<String>,
    /// The sentence with the numbers (the latest).
    pub sentence: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_through_postcard() {
        for req in [
            RemediationRequest::Pause {
                reason: "switch upgrade".into(),
            },
            RemediationRequest::Events(EventsQuery {
                machine: Some("10.0.0.1".into()),
                since_unix_ms: Some(5),
                after_seq: None,
                limit: 10,
            }),
        ] {
            let bytes = postcard::to_stdvec(&req).unwrap();
            assert_eq!(
                postcard::from_bytes::<RemediationRequest>(&bytes).unwrap(),
                req
            );
        }
    }
}
