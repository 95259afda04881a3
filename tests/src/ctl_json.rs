//! What `coordinatorctl … --json` prints, as a script reads it: times are RFC 3339 strings
//! (UTC, milliseconds) parsed into [`Timestamp`]s, labels are maps. Every type denies
//! unknown fields, so a leftover `*_unix_ms` integer or a label list fails to parse: the
//! tests that read these outputs are also the check of their types.
//!
//! Deliberately separate from the admin API's wire types in `protocol::admin`, which keep
//! Unix milliseconds on the wire.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Deserialize;

/// Milliseconds since the Unix epoch, for arithmetic in tests.
pub fn ms(t: Timestamp) -> u64 {
    u64::try_from(t.as_millisecond()).unwrap_or(0)
}

/// `spec` of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// Address.
    pub address: String,
    /// Hostname.
    pub hostname: String,
    /// Serial.
    pub serial: String,
    /// Rack.
    pub rack: String,
    /// Role.
    pub role: String,
    /// Machine type.
    pub machine_type: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// One element of `machines list --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSummary {
    /// Registered attributes.
    pub spec: MachineSpec,
    /// Health state.
    pub state: String,
    /// When the state was entered.
    pub state_since: Timestamp,
    /// Failing checks.
    pub failing: Vec<String>,
    /// Why the machine entered its state.
    pub reason: String,
    /// When the last report was received.
    pub last_report_at: Option<Timestamp>,
    /// An agent connection is open.
    pub connected: bool,
}

/// One state transition of `machines show --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateTransition {
    /// Previous state.
    pub from: String,
    /// New state.
    pub to: String,
    /// When.
    pub at: Timestamp,
    /// Why.
    pub reason: String,
}

/// The last report of `machines show --json`, as the agent sent it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthReport {
    /// Sequence number within the agent process.
    pub seq: u64,
    /// When the checks ran, by the agent's clock.
    pub time: Timestamp,
    /// Boot id.
    pub boot_id: String,
    /// One result per check and subject.
    pub checks: Vec<protocol::messages::CheckResult>,
    /// The agent's report interval in milliseconds; 0 when the agent did not say.
    pub report_interval_ms: u64,
}

/// `machines show ADDRESS --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineDetail {
    /// The summary.
    pub summary: MachineSummary,
    /// The last report.
    pub last_report: Option<HealthReport>,
    /// When it was received.
    pub last_report_at: Option<Timestamp>,
    /// Recent transitions.
    pub transitions: Vec<StateTransition>,
    /// Boot id.
    pub boot_id: Option<String>,
    /// Agent version.
    pub agent_version: Option<String>,
    /// Start of the current run of healthy reports.
    pub healthy_since: Option<Timestamp>,
    /// Each failing check and since when.
    pub failing_since: BTreeMap<String, Timestamp>,
    /// What the machine's kdump initramfs last said, if anything.
    pub kdump: Option<KdumpDetail>,
}

/// `machines show --json`'s `kdump`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdumpDetail {
    /// The last phase reported.
    pub phase: protocol::messages::KdumpPhase,
    /// The machine is held for down because of the dump.
    pub dumping_now: bool,
    /// When the last "dumping" notice arrived.
    pub dumping_since: Option<Timestamp>,
    /// When "dump done" arrived, if it did after the last "dumping".
    pub done_at: Option<Timestamp>,
    /// The crashed kernel's boot id, if the initramfs knew it.
    pub boot_id: Option<String>,
    /// The node's own time in the last notice.
    pub node_time: Option<Timestamp>,
}

/// One line of `events --json` (and of `remediation status --json`'s decisions).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalLine {
    /// Sequence number.
    pub seq: u64,
    /// First time the decision was made.
    pub first_at: Timestamp,
    /// Last time it was made.
    pub last_at: Timestamp,
    /// How many passes made it.
    pub count: u64,
    /// The machine.
    pub address: String,
    /// Its failure domain.
    pub domain: String,
    /// Outcome.
    pub outcome: String,
    /// Rule.
    pub rule: String,
    /// Proposed operation.
    pub operation: Option<String>,
    /// The sentence.
    pub sentence: String,
}

/// `paused` of `remediation status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paused {
    /// The operator's reason.
    pub reason: String,
    /// Since when.
    pub since: Timestamp,
}

/// One limit of `remediation status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitLine {
    /// Rule.
    pub rule: String,
    /// Holds anything now.
    pub holding: bool,
    /// Its numbers.
    pub sentence: String,
}

/// `remediation status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemediationStatus {
    /// Observe mode.
    pub observe: bool,
    /// Auto-repair on.
    pub auto_repair_enabled: bool,
    /// The pause, if paused.
    pub paused: Option<Paused>,
    /// When an outage was last confirmed.
    pub outage_confirmed_at: Option<Timestamp>,
    /// A Kubernetes view is configured.
    pub kubernetes: bool,
    /// When the last pass ran.
    pub last_pass_at: Option<Timestamp>,
    /// Every limit.
    pub limits: Vec<LimitLine>,
    /// The last pass's decisions.
    pub decisions: Vec<JournalLine>,
    /// Decisions left out.
    pub decisions_omitted: u64,
}

/// `constraints show --json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    /// CKE's `maximum-repair-queue-entries`.
    pub maximum_repair_queue_entries: u64,
    /// CKE's `wait-seconds-to-repair-rebooting`.
    pub wait_seconds_to_repair_rebooting: u64,
}

/// `machines clear ADDRESS --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cleared {
    /// The machine.
    pub address: String,
    /// When.
    pub cleared_at: jiff::Timestamp,
    /// Whether it was held as `needs-human`.
    pub was_needs_human: bool,
}
