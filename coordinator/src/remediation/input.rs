//! What the remediation core is told about the world, in types of its own.
//!
//! These are plain data, filled by whoever runs a pass (the remediation loop, a test, the
//! benchmark). They deliberately do not borrow the registry's or the repair store's internal
//! types, which change under other areas; only the shared enums ([`MachineState`],
//! [`GoodbyeReason`], [`RepairStatus`]) are reused. Nothing here does I/O or reads a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use protocol::admin::repair::RepairStatus;
use protocol::messages::GoodbyeReason;

use super::decision::Decision;
use crate::health::MachineState;

/// Everything one pass looks at.
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// Every registered machine.
    pub machines: Vec<Machine>,
    /// The Kubernetes view; `None` when the coordinator has no `[kubernetes]` section.
    pub kube: Option<KubeFacts>,
    /// The repair queue: every entry it holds, finished or not.
    pub queue: Vec<QueueEntry>,
    /// The decision journal's recent lines (at least the longest limit window), any order.
    pub history: Vec<Decision>,
    /// How recent repairs ended (including entries already deleted from the queue).
    pub outcomes: Vec<RepairOutcome>,
    /// Operator switches: pause, confirmed outage, cleared machines.
    pub control: Control,
    /// With `auto_repair.source = "sabakan"`: what sabakan said; auto-repair reads its
    /// machines instead of `machines`.
    pub sabakan: Option<SabakanFacts>,
}

/// What the configured sabakan said, as of this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SabakanFacts {
    /// The GraphQL endpoint, for sentences.
    pub url: String,
    /// The last answer asked with the `having` / `not_having` in force: when, and the
    /// machines it returned.
    pub read: Option<(Timestamp, Vec<Machine>)>,
    /// The last attempt's error, when the last attempt failed.
    pub error: Option<String>,
    /// An answer older than this is not used.
    pub max_age: Duration,
}

/// One machine: its record, its health state and what its agent last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// Address: the key.
    pub address: String,
    /// Serial number (may be empty).
    pub serial: String,
    /// Rack.
    pub rack: String,
    /// Role (e.g. `cs`, `ss`, `boot`).
    pub role: String,
    /// Machine type; `None` while awaiting registration (no repair procedure applies).
    pub machine_type: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Health state.
    pub state: MachineState,
    /// When the state was entered.
    pub since: Timestamp,
    /// When the agent last reported (coordinator clock); `None`: never since start.
    pub last_report_at: Option<Timestamp>,
    /// Agent checks failing now, with since when.
    pub failing_checks: Vec<FailingCheck>,
    /// The last goodbye, if no report came after it.
    pub goodbye: Option<(GoodbyeReason, Timestamp)>,
    /// The agent reported the crash kernel loaded.
    pub kdump_loaded: bool,
    /// What the machine's kdump initramfs last said.
    pub dump: Dump,
    /// When the current boot was first seen (or the machine registered): the node startup
    /// timeout counts from here.
    pub booted_at: Option<Timestamp>,
    /// The machine's Node, when the Kubernetes view has one with its address.
    pub node: Option<NodeFacts>,
    /// The last silence that ended: (last report before it, first report after it). A
    /// partition's agents return one by one; self-isolation still counts the returned
    /// ones for a window so that the last to return are not repaired as stragglers.
    pub last_silence: Option<(Timestamp, Timestamp)>,
}

impl Machine {
    /// A machine known only by its address, state and since when: no record fields, no
    /// report, no Node (callers fill in what they know).
    pub fn unreported(address: &str, state: MachineState, since: Timestamp) -> Self {
        Self {
            address: address.to_string(),
            serial: String::new(),
            rack: String::new(),
            role: String::new(),
            machine_type: None,
            labels: BTreeMap::new(),
            state,
            since,
            last_report_at: None,
            failing_checks: Vec::new(),
            goodbye: None,
            kdump_loaded: false,
            dump: Dump::None,
            booted_at: None,
            node: None,
            last_silence: None,
        }
    }
}

/// A machine's crash dump, as its kdump initramfs reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dump {
    /// Nothing reported (or the machine has reported healthy since).
    #[default]
    None,
    /// "Dumping" since this time, nothing since: the machine is known down.
    Dumping {
        /// When "dumping" arrived.
        since: Timestamp,
    },
    /// "Dump done" at this time.
    Done {
        /// When "dump done" arrived.
        at: Timestamp,
    },
}

/// A failing agent check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingCheck {
    /// `kind:subject` as the registry keys it (`nic:eth0`, `disk:/var`, `kubelet:kubelet`)
    /// or just the kind (`kubelet`, `kdump`).
    pub name: String,
    /// Failing since.
    pub since: Timestamp,
    /// Since when some check of the same kind has failed in every report: at or before
    /// `since`. A condition naming the kind alone counts from here, so checks of one kind
    /// failing in turn do not restart its timer.
    pub kind_since: Timestamp,
}

impl FailingCheck {
    /// True when a condition type written in a health check (`kubelet`, `nic`, `nic:eth0`)
    /// names this check: the kind alone matches every subject of that kind.
    pub fn is(&self, written: &str) -> bool {
        let kind = self.name.split(':').next().unwrap_or("");
        self.name == written || (!written.contains(':') && kind == written)
    }

    /// Since when the condition `written` (which [`FailingCheck::is`] matched) has held:
    /// the check's own start for `kind:subject`, the kind's for the kind alone.
    pub fn since_for(&self, written: &str) -> Timestamp {
        if written.contains(':') {
            self.since
        } else {
            self.kind_since
        }
    }
}

/// The Kubernetes view as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeFacts {
    /// When the view was last refreshed from the API server (`None`: never).
    pub refreshed_at: Option<Timestamp>,
    /// The oldest a view may be and still be trusted.
    pub max_age: Duration,
}

impl KubeFacts {
    /// How old the view is, or `None` if it never loaded.
    pub fn age(&self, now: Timestamp) -> Option<Duration> {
        self.refreshed_at.map(|t| super::elapsed(now, t))
    }

    /// True when decisions that need the view may trust it.
    pub fn is_fresh(&self, now: Timestamp) -> bool {
        self.age(now).is_some_and(|a| a <= self.max_age)
    }
}

/// What the Kubernetes view says about one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node name.
    pub name: String,
    /// The kubelet Lease's last `renewTime`.
    pub lease_renewed_at: Option<Timestamp>,
    /// When the node view first saw that `renewTime` (the coordinator's clock; `None`:
    /// unknown, the stamp alone counts).
    pub lease_seen_since: Option<Timestamp>,
    /// Every condition, Ready included.
    pub conditions: Vec<Condition>,
}

impl NodeFacts {
    /// The condition of type `t`.
    pub fn condition(&self, t: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == t)
    }

    /// The Ready condition.
    pub fn ready(&self) -> Option<&Condition> {
        self.condition("Ready")
    }

    /// True when Ready is present and True.
    pub fn is_ready(&self) -> bool {
        self.ready().is_some_and(|c| c.status == "True")
    }
}

/// One Node condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Ready`, `KernelDeadlock`, …
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Last transition (status change) time.
    pub since: Timestamp,
}

/// One repair queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// The entry's index (`coordinatorctl repair-queue show INDEX`).
    pub index: u64,
    /// The machine's address.
    pub address: String,
    /// Operation.
    pub operation: String,
    /// CKE status.
    pub status: RepairStatus,
    /// Last change of status.
    pub last_transition: Timestamp,
}

impl QueueEntry {
    /// True while queued or processing.
    pub fn is_active(&self) -> bool {
        matches!(self.status, RepairStatus::Queued | RepairStatus::Processing)
    }
}

/// How one repair ended, for slow start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOutcome {
    /// The machine's address.
    pub address: String,
    /// When the entry finished.
    pub finished_at: Timestamp,
    /// Succeeded (the health check passed) or failed.
    pub succeeded: bool,
}

/// Operator switches, set through `coordinatorctl` and stored by the loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Control {
    /// `remediation pause --reason TEXT`: the reason, and when.
    pub paused: Option<(String, Timestamp)>,
    /// `remediation confirm-outage`: when an operator last said "the silence is real".
    pub outage_confirmed_at: Option<Timestamp>,
    /// `machines clear ADDRESS`: when each machine was last cleared of `needs-human`.
    pub cleared: BTreeMap<String, Timestamp>,
}
