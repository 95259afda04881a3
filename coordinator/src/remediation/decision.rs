//! What a pass returns: decisions, each naming a machine, a rule and a sentence with the
//! numbers behind it. Serializable so the decision journal can store them as they are and
//! hand them back as history.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The rule behind a decision. Detector rules propose or find; limit rules hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// sabakan-style auto-repair proposed the machine.
    AutoRepair,
    /// A MachineHealthCheck-style check proposed the machine.
    HealthCheck,
    /// Agent silent, kubelet still renews its Lease: reported, never remediated.
    AgentLostNodeAlive,
    /// Agent silent but the second signal (Lease stale and Ready not True) is missing.
    TwoSignal,
    /// The Kubernetes view is older than its freshness limit.
    NodeViewStale,
    /// The machine already has an entry in the repair queue (finished or not).
    QueueHasEntry,
    /// Existing entries plus candidates exceed `maximum_repair_queue_entries`.
    MaximumRepairQueueEntries,
    /// A rebooting or non-node machine waits `wait_seconds_to_repair_rebooting` first.
    WaitRebooting,
    /// The machine has no machine type, so no repair procedure applies.
    NoMachineType,
    /// A health check's `max_unhealthy` / `unhealthy_range` gate.
    HealthCheckGate,
    /// Remediation is paused by an operator.
    Paused,
    /// Most agents went silent at once: the coordinator suspects its own network.
    SelfIsolation,
    /// Many machines of one failure domain failed within a window: an infrastructure event.
    CorrelatedFailure,
    /// The machine was remediated `max_remediations` times within the window.
    NeedsHuman,
    /// The fleet-wide cap on repairs in flight.
    FleetCap,
    /// Slow start: the failure domain's width is used up.
    SlowStart,
    /// The hourly rate of disruptive remediations, fleet-wide or per domain.
    RateLimit,
    /// auto-repair reads sabakan, which cannot be read or answered too long ago.
    SabakanUnavailable,
    /// Admitted, but the repair queue refused the entry (no repair queue, or no procedure
    /// for the machine type and operation). Set by the remediation loop, never by a rule.
    EnqueueRefused,
    /// A silent machine whose crash kernel was loaded waits `kdump_wait` for its kdump
    /// initramfs to say "dumping" before it counts as dead.
    KdumpWait,
    /// An unhealthy machine waits `auto_repair.unhealthy_for` before auto-repair proposes it.
    UnhealthyFor,
    /// A repair queue entry the loop enqueued succeeded `delete_succeeded_after` ago and was
    /// deleted, so its machine may be remediated again. Set by the remediation loop.
    SucceededEntryDeleted,
}

impl Rule {
    /// Kebab-case name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::AutoRepair => "auto-repair",
            Rule::HealthCheck => "health-check",
            Rule::AgentLostNodeAlive => "agent-lost-node-alive",
            Rule::TwoSignal => "two-signal",
            Rule::NodeViewStale => "node-view-stale",
            Rule::QueueHasEntry => "queue-has-entry",
            Rule::MaximumRepairQueueEntries => "maximum-repair-queue-entries",
            Rule::WaitRebooting => "wait-rebooting",
            Rule::NoMachineType => "no-machine-type",
            Rule::HealthCheckGate => "health-check-gate",
            Rule::Paused => "paused",
            Rule::SelfIsolation => "self-isolation",
            Rule::CorrelatedFailure => "correlated-failure",
            Rule::NeedsHuman => "needs-human",
            Rule::FleetCap => "fleet-cap",
            Rule::SlowStart => "slow-start",
            Rule::RateLimit => "rate-limit",
            Rule::SabakanUnavailable => "sabakan-unavailable",
            Rule::EnqueueRefused => "enqueue-refused",
            Rule::KdumpWait => "kdump-wait",
            Rule::SucceededEntryDeleted => "succeeded-entry-deleted",
            Rule::UnhealthyFor => "unhealthy-for",
        }
    }
}

/// What became of a machine in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// To be enqueued now.
    Admitted,
    /// Observe mode: would have been enqueued; nothing is.
    WouldEnqueue,
    /// Proposed, then held by a rule; dropped, never queued for later.
    Held,
    /// Reported only (an event and a metric); there was nothing to propose.
    Finding,
}

impl Outcome {
    /// Kebab-case name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::WouldEnqueue => "would-enqueue",
            Outcome::Held => "held",
            Outcome::Finding => "finding",
        }
    }
}

/// A repair a detector proposes: the fields of a queue entry, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Operation to enqueue.
    pub operation: String,
    /// Machine type to enqueue.
    pub machine_type: String,
    /// Serial to enqueue.
    pub serial: String,
    /// The detector that proposed it: `auto-repair` or `health-check NAME`.
    pub source: String,
    /// Why the detector proposed it, with numbers.
    pub reason: String,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// When the pass ran.
    pub at: Timestamp,
    /// The machine.
    pub address: String,
    /// Its failure domain (rack, or the value of the domain label).
    pub domain: String,
    /// What became of it.
    pub outcome: Outcome,
    /// The rule that decided: the proposing detector when admitted, the holding rule when
    /// held, the finding's rule for a finding.
    pub rule: Rule,
    /// The proposal, if there was one (admitted and held decisions).
    pub proposal: Option<Proposal>,
    /// A sentence for a person, with the numbers behind it.
    pub sentence: String,
}

impl Decision {
    /// True for a remediation that was (or in observe mode would have been) enqueued.
    pub fn is_admission(&self) -> bool {
        self.outcome == Outcome::Admitted
    }
}

/// The state of one limit in this pass, for `remediation status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitStatus {
    /// The limit.
    pub rule: Rule,
    /// Whether it held anything (or would hold everything) in this pass.
    pub holding: bool,
    /// Its numbers now, e.g. `3 of 10 in flight (count 10, 5% of 200 = 10)`.
    pub sentence: String,
}

/// The result of one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pass {
    /// Admitted (or, in observe mode, would-enqueue) remediations.
    pub admitted: Vec<Decision>,
    /// Proposals held this pass, each with the holding rule. Dropped after this pass.
    pub held: Vec<Decision>,
    /// Findings: reported, nothing proposed.
    pub findings: Vec<Decision>,
    /// Every limit's numbers.
    pub limits: Vec<LimitStatus>,
}

impl Pass {
    /// Every decision of the pass, for the journal.
    pub fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.admitted.iter().chain(&self.held).chain(&self.findings)
    }

    /// Addresses admitted, in order.
    pub fn admitted_addresses(&self) -> Vec<&str> {
        self.admitted.iter().map(|d| d.address.as_str()).collect()
    }

    /// The held decision for `address`, if any.
    pub fn held_for(&self, address: &str) -> Option<&Decision> {
        self.held.iter().find(|d| d.address == address)
    }
}
