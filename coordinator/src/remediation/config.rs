//! The `[remediation]` section: detectors, their gates and the storm limits.
//!
//! Parsed with serde like the rest of the coordinator config (`deny_unknown_fields`,
//! durations as strings such as `"30s"` or `"5m"` through [`crate::duration`]).
//! Every default is chosen to work on a fresh install and carries its reason. It is the
//! coordinator config's optional `[remediation]` section: absent, no remediation loop runs.
//! [`RemediationConfig::validate`] (in `validate`) names the offending key in every error.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::input::Machine;
pub use super::limits_config::{
    Correlated, Escalation, FleetCap, Limits, Rate, SelfIsolation, SlowStart,
};
use super::sabakan::config::{SabakanConfig, Source};
use crate::duration;
use crate::health::MachineState;
pub use crate::k8s::lease::SecondSignal;

mod validate;

/// Two kubelet Lease renewals (kubelet renews every 10 s): one late renewal is not death.
pub const DEFAULT_LEASE_STALE: Duration = Duration::from_secs(20);

/// A panicking kernel kexecs into the crash kernel within seconds, and the kdump initramfs
/// reaches the network (and sends "dumping") within a minute even with DHCP and a slow
/// link; a machine that said nothing by then is treated as dead as usual.
pub const DEFAULT_KDUMP_WAIT: Duration = Duration::from_secs(60);
/// Enough for a rack's worth of repairs, small enough that a detector bug cannot fill the
/// queue with the fleet. CKE's default 0 never enqueues anything.
pub const DEFAULT_MAXIMUM_REPAIR_QUEUE_ENTRIES: u32 = 10;
/// A machine that overran its goodbye grace, or has no Lease to confirm its death, gets
/// five more minutes: a slow firmware POST of a large server takes that long.
pub const DEFAULT_WAIT_SECONDS_TO_REPAIR_REBOOTING: u64 = 300;
/// The longest `wait_seconds_to_repair_rebooting` taken: a week. A longer wait means "never
/// repair a rebooting machine", which reads better as auto-repair off, and a typo's extra
/// digits would otherwise hold repairs for years without a word.
pub const MAX_WAIT_SECONDS_TO_REPAIR_REBOOTING: u64 = 7 * 24 * 3600;

/// What is wrong with a `wait_seconds_to_repair_rebooting` of `secs`, if anything.
pub fn check_wait_rebooting(secs: u64) -> Result<(), String> {
    if secs > MAX_WAIT_SECONDS_TO_REPAIR_REBOOTING {
        return Err(format!(
            "{secs} is more than a week ({MAX_WAIT_SECONDS_TO_REPAIR_REBOOTING}); to stop \
             repairing machines, turn auto-repair off instead"
        ));
    }
    Ok(())
}
/// Bare metal: POST, firmware, PXE and a full boot take far longer than a cloud VM's
/// 10 minutes (Cluster API's default).
pub const DEFAULT_NODE_STARTUP_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A pass every 10 s: well inside the grace periods and timeouts the detectors read
/// (minutes), and cheap (a pass over 10,000 machines takes a few milliseconds).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// A week of decisions: long enough to look back over an incident and its aftermath.
pub const DEFAULT_JOURNAL_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Bounds the journal however noisy a week was (identical decisions are already one line).
pub const DEFAULT_JOURNAL_MAX_ROWS: u64 = 100_000;
/// A succeeded entry the loop enqueued keeps its machine out of automatic remediation (CKE's
/// one-entry-per-machine limiter) for an hour, then the loop deletes it: a machine that
/// fails again within the hour waits, one that fails again later is repaired again without
/// a person, and the escalation bound (`needs-human` after `max_remediations` within its
/// window) is what stops a machine that keeps failing.
pub const DEFAULT_DELETE_SUCCEEDED_AFTER: Duration = Duration::from_secs(3600);

/// Why a `[remediation]` section cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemediationConfigError {
    /// The TOML does not parse, or a key is unknown, missing or of the wrong type (the
    /// message names it and its position).
    #[error("config section [remediation]: {0}")]
    Parse(String),
    /// A value parses but cannot be used.
    #[error("config key `remediation.{key}`: {message}")]
    Invalid {
        /// The dotted key below `remediation.`.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl RemediationConfigError {
    /// Never: a config must be fixed by a person.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// `[remediation]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemediationConfig {
    /// How often the remediation loop runs a pass.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Journal lines last seen longer ago than this are deleted.
    #[serde(with = "duration")]
    pub journal_retention: Duration,
    /// At most this many journal lines are kept (the oldest go first).
    pub journal_max_rows: u64,
    /// How long after it succeeded an entry this loop enqueued is deleted from the repair
    /// queue, so that its machine may be remediated again; `None` (`"never"`) keeps it until
    /// a person deletes it, as CKE does. Failed entries and entries added by hand always
    /// stay for a person.
    #[serde(with = "duration_or_never")]
    pub delete_succeeded_after: Option<Duration>,
    /// Observe mode (dry run): every decision recorded as "would enqueue", nothing enqueued.
    /// Off by default so a configured remediation acts; turn it on for a first week.
    pub observe: bool,
    /// The failure domain: `rack` (default: a rack shares a switch and a PDU) or
    /// `label:NAME` for a label's value.
    pub failure_domain: FailureDomain,
    /// How long the kubelet Lease must be unrenewed before it counts as the second signal.
    #[serde(with = "duration")]
    pub lease_stale: Duration,
    /// What the second signal of death is: the stale Lease with Ready not True
    /// (`lease-and-ready`, the default) or the stale Lease alone (`lease`), which releases a
    /// dead machine's workload about the node lifecycle controller's grace period sooner.
    pub second_signal: SecondSignal,
    /// sabakan-style auto-repair.
    pub auto_repair: AutoRepair,
    /// CKE's limiter: if entries in the queue plus new candidates exceed this, none of the
    /// candidates is enqueued.
    pub maximum_repair_queue_entries: u32,
    /// CKE's limiter: an unreachable machine that said goodbye for a reboot, or is not a
    /// Kubernetes node, waits this many seconds (from becoming unreachable) first.
    pub wait_seconds_to_repair_rebooting: u64,
    /// A silent machine whose last report said its crash kernel is loaded is not dead until
    /// this long after that report passed without a "dumping" from its kdump initramfs.
    #[serde(with = "duration")]
    pub kdump_wait: Duration,
    /// MachineHealthCheck-style checks.
    pub health_checks: Vec<HealthCheck>,
    /// Storm limits over every detector.
    pub limits: Limits,
}

impl Default for RemediationConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            journal_retention: DEFAULT_JOURNAL_RETENTION,
            journal_max_rows: DEFAULT_JOURNAL_MAX_ROWS,
            delete_succeeded_after: Some(DEFAULT_DELETE_SUCCEEDED_AFTER),
            observe: false,
            failure_domain: FailureDomain::Rack,
            lease_stale: DEFAULT_LEASE_STALE,
            second_signal: SecondSignal::LeaseAndReady,
            auto_repair: AutoRepair::default(),
            maximum_repair_queue_entries: DEFAULT_MAXIMUM_REPAIR_QUEUE_ENTRIES,
            wait_seconds_to_repair_rebooting: DEFAULT_WAIT_SECONDS_TO_REPAIR_REBOOTING,
            kdump_wait: DEFAULT_KDUMP_WAIT,
            health_checks: Vec::new(),
            limits: Limits::default(),
        }
    }
}

/// A duration string, or `"never"` for none.
mod duration_or_never {
    use std::time::Duration;

    use serde::Deserialize;

    use crate::duration::Written;

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Written::deserialize(d)? {
            Written::Text(s) if s.trim() == "never" => Ok(None),
            w => w.duration().map(Some).map_err(|e| {
                serde::de::Error::custom(format!("expected a duration or \"never\": {e}"))
            }),
        }
    }
}

/// What groups machines that fail together.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum FailureDomain {
    /// The machine's rack.
    Rack,
    /// The value of a label (machines without it share the domain `<unset>`).
    Label(String),
}

impl TryFrom<String> for FailureDomain {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.strip_prefix("label:") {
            _ if s == "rack" => Ok(FailureDomain::Rack),
            Some(l) if !l.is_empty() => Ok(FailureDomain::Label(l.to_string())),
            _ => Err(format!(
                "failure_domain {s:?} is neither \"rack\" nor \"label:NAME\""
            )),
        }
    }
}

impl FailureDomain {
    /// The domain `m` belongs to; machines without the domain label share `<unset>`.
    pub fn of<'m>(&self, m: &'m Machine) -> &'m str {
        match self {
            FailureDomain::Rack => &m.rack,
            FailureDomain::Label(l) => m.labels.get(l).map_or("<unset>", String::as_str),
        }
    }

    /// `rack` or the label's name, for sentences.
    pub fn word(&self) -> &str {
        match self {
            FailureDomain::Rack => "rack",
            FailureDomain::Label(l) => l,
        }
    }
}

/// `[remediation.auto_repair]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoRepair {
    /// On by default: the defaults below are safe to run.
    pub enabled: bool,
    /// A machine must match every field given here (each list: any of its values).
    pub having: MachineFilter,
    /// A machine matching any field given here is left alone.
    pub not_having: MachineFilter,
    /// Where the machines come from: `inventory` (default) or `sabakan`.
    pub source: Source,
    /// The sabakan to read with `source = "sabakan"`.
    pub sabakan: Option<SabakanConfig>,
    /// With the inventory source, how long a machine must have been `unhealthy` before it
    /// is proposed: one failed check (a kubelet slow to answer its healthz once, a NIC
    /// flapping during a switch reload) is not a broken machine. sabakan judges its own
    /// states, so its machines are taken as they are.
    #[serde(with = "duration")]
    pub unhealthy_for: Duration,
    /// The operation of an `unhealthy` machine by failing check, first match first
    /// (`{ check = "gpu", operation = "gpu" }`), so the repair procedure fits what is broken;
    /// a machine no entry matches gets `unhealthy`, sabakan's name.
    pub operation_by_check: Vec<CheckOperation>,
}

/// One `operation_by_check` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckOperation {
    /// An agent check as a health check condition names it: a kind (`gpu`, `nic`) or
    /// `kind:subject` (`plugin:ntp`, `nic:eth0`).
    pub check: String,
    /// The operation to enqueue (a `repair_operations` entry of the repair file).
    pub operation: String,
}

/// Six reports at the default 5 s interval: a failure that outlasts that is not a blip, and
/// a hung kubelet is still restarted within a minute.
pub const DEFAULT_UNHEALTHY_FOR: Duration = Duration::from_secs(30);

impl Default for AutoRepair {
    fn default() -> Self {
        Self {
            enabled: true,
            // sabakan's defaults: repair what is broken or gone …
            having: MachineFilter {
                states: vec![MachineState::Unhealthy, MachineState::Unreachable],
                ..MachineFilter::default()
            },
            // … but never the boot servers the repairs themselves depend on.
            not_having: MachineFilter {
                roles: vec!["boot".into()],
                ..MachineFilter::default()
            },
            source: Source::Inventory,
            sabakan: None,
            unhealthy_for: DEFAULT_UNHEALTHY_FOR,
            operation_by_check: Vec::new(),
        }
    }
}

/// Why a `having` without states is refused: it would match every machine.
pub const NO_HAVING_STATES: &str = "having.states must name at least one state, e.g. [\"unhealthy\", \"unreachable\"]: without one, every machine (healthy ones included) is a candidate";

/// Why `having` and `not_having` are refused when `not_having.states` names every state
/// `having` asks for: no machine can match both, so auto-repair would never propose one
/// while its status says it is on.
pub fn states_excluded(having: &MachineFilter, not_having: &MachineFilter) -> Option<String> {
    let all =
        !having.states.is_empty() && having.states.iter().all(|s| not_having.states.contains(s));
    all.then(|| {
        "notHaving.states excludes every state having.states names, so no machine can ever be \
         a candidate; to stop auto-repair, disable it (enabled = false or \
         `coordinatorctl auto-repair disable`)"
            .to_string()
    })
}

/// sabakan's `MachineParams`: states, roles, racks, labels. Empty fields say nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MachineFilter {
    /// States, by name (`unhealthy`, `unreachable`, …).
    #[serde(deserialize_with = "states")]
    pub states: Vec<MachineState>,
    /// Roles.
    pub roles: Vec<String>,
    /// Racks.
    pub racks: Vec<String>,
    /// Labels, each `key = value`.
    pub labels: BTreeMap<String, String>,
}

impl MachineFilter {
    /// True when `m` matches every field given (sabakan's `having`).
    pub fn matches_all(&self, m: &Machine) -> bool {
        (self.states.is_empty() || self.states.contains(&m.state))
            && (self.roles.is_empty() || self.roles.contains(&m.role))
            && (self.racks.is_empty() || self.racks.contains(&m.rack))
            && self.labels.iter().all(|(k, v)| m.labels.get(k) == Some(v))
    }

    /// True when `m` matches any field given (sabakan's `notHaving`).
    pub fn matches_any(&self, m: &Machine) -> bool {
        self.states.contains(&m.state)
            || self.roles.contains(&m.role)
            || self.racks.contains(&m.rack)
            || self.labels.iter().any(|(k, v)| m.labels.get(k) == Some(v))
    }
}

fn states<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<MachineState>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
}

/// One `[[remediation.health_checks]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// Name, shown in decisions.
    pub name: String,
    /// Which machines it watches; empty matches all.
    #[serde(default)]
    pub selector: Selector,
    /// Any of these, held for its timeout, makes a machine unhealthy.
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// A machine whose Node has not turned Ready this long after boot is unhealthy.
    #[serde(default = "default_node_startup_timeout", with = "duration")]
    pub node_startup_timeout: Duration,
    /// Remediate only while at most this many (count or `"N%"`) of the selected machines
    /// are unhealthy. Exclusive with `unhealthy_range`.
    #[serde(default)]
    pub max_unhealthy: Option<Threshold>,
    /// Remediate only while the unhealthy count is within `"[min-max]"`.
    #[serde(default)]
    pub unhealthy_range: Option<UnhealthyRange>,
    /// The operation to enqueue; defaults to `unhealthy`, the operation auto-repair uses
    /// for the same machines, so one repair procedure serves both.
    #[serde(default = "default_operation")]
    pub operation: String,
}

fn default_node_startup_timeout() -> Duration {
    DEFAULT_NODE_STARTUP_TIMEOUT
}
fn default_operation() -> String {
    "unhealthy".into()
}

/// A health check's machine selector. Every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Selector {
    /// Labels, each `key = value`.
    pub labels: BTreeMap<String, String>,
    /// Racks.
    pub racks: Vec<String>,
    /// Roles.
    pub roles: Vec<String>,
    /// Machine types.
    pub machine_types: Vec<String>,
}

impl Selector {
    /// True when `m` is watched.
    pub fn matches(&self, m: &Machine) -> bool {
        self.labels.iter().all(|(k, v)| m.labels.get(k) == Some(v))
            && (self.racks.is_empty() || self.racks.contains(&m.rack))
            && (self.roles.is_empty() || self.roles.contains(&m.role))
            && (self.machine_types.is_empty()
                || m.machine_type
                    .as_ref()
                    .is_some_and(|t| self.machine_types.contains(t)))
    }
}

/// The agent check kinds a condition `type` may name instead of a Node condition.
pub const AGENT_CHECK_KINDS: [&str; 7] =
    ["kubelet", "nic", "disk", "kdump", "plugin", "gpu", "memory"];

/// One unhealthy condition.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnhealthyCondition {
    /// A Node condition type (`Ready`, `KernelDeadlock`, …) or an agent check (`kubelet`,
    /// `nic`, `nic:eth0`, `disk:/var`, `kdump`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`. An agent check's status is `False` while it fails.
    pub status: String,
    /// How long the condition must hold.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl UnhealthyCondition {
    /// True when `type` names an agent check.
    pub fn is_agent_check(&self) -> bool {
        let kind = self.type_.split(':').next().unwrap_or("");
        AGENT_CHECK_KINDS.contains(&kind)
    }
}

/// A count or a percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawThreshold")]
pub enum Threshold {
    /// A number of machines.
    Count(u32),
    /// A percentage of the machines considered.
    Percent(u32),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawThreshold {
    Count(i64),
    Text(String),
    // Anything else (a negative or fractional number, a boolean) gets a sentence that says
    // what is expected instead of serde's "did not match any variant of untagged enum".
    Other(serde::de::IgnoredAny),
}

impl TryFrom<RawThreshold> for Threshold {
    type Error = String;
    fn try_from(r: RawThreshold) -> Result<Self, String> {
        let expected = "must be a count of machines (0 or more) or a percentage like \"40%\"";
        match r {
            RawThreshold::Count(n) => u32::try_from(n)
                .map(Threshold::Count)
                .map_err(|_| format!("{n} {expected}")),
            RawThreshold::Other(_) => Err(expected.to_string()),
            RawThreshold::Text(s) => {
                let bad = || format!("{s:?} is neither a count nor a percentage like \"40%\"");
                match s.trim().strip_suffix('%') {
                    Some(p) => p.trim().parse().map(Threshold::Percent).map_err(|_| bad()),
                    None => s.trim().parse().map(Threshold::Count).map_err(|_| bad()),
                }
            }
        }
    }
}

impl Threshold {
    /// How many machines of `total` this allows. A percentage rounds down (Cluster API's
    /// rule) but never below one machine of a non-empty pool: 20 % of a pool of four would
    /// otherwise be zero, and the gate would never let a single repair through. `"0%"`
    /// allows none, as `0` does: it is written to stop the check's repairs.
    pub fn of(self, total: usize) -> usize {
        match self {
            Threshold::Count(n) => n as usize,
            Threshold::Percent(0) => 0,
            Threshold::Percent(_) if total == 0 => 0,
            Threshold::Percent(p) => (total * p as usize / 100).max(1),
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threshold::Count(n) => write!(f, "{n}"),
            Threshold::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// `"[min-max]"`: remediate only while the unhealthy count is within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct UnhealthyRange {
    /// Smallest count that remediates.
    pub min: usize,
    /// Largest count that remediates.
    pub max: usize,
}

impl TryFrom<String> for UnhealthyRange {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a range like \"[1-3]\"");
        let inner = s
            .trim()
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .ok_or_else(bad)?;
        let (a, b) = inner.split_once('-').ok_or_else(bad)?;
        let (min, max) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if min > max {
            return Err(format!("{s:?}: min is larger than max"));
        }
        Ok(Self { min, max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_gets_working_defaults() {
        let c = RemediationConfig::from_toml("").unwrap();
        assert_eq!(c, RemediationConfig::default());
        assert_eq!(c.lease_stale, Duration::from_secs(20));
        assert_eq!(c.kdump_wait, DEFAULT_KDUMP_WAIT);
        assert!(c.auto_repair.enabled);
        assert_eq!(
            c.auto_repair.having.states,
            [MachineState::Unhealthy, MachineState::Unreachable]
        );
        assert_eq!(c.auto_repair.not_having.roles, ["boot"]);
        assert!(c.maximum_repair_queue_entries > 0, "CKE's 0 never enqueues");
        c.validate().unwrap();
    }

    #[test]
    fn a_reboot_wait_of_more_than_a_week_is_refused() {
        let ok = "wait_seconds_to_repair_rebooting = 604800";
        assert_eq!(
            RemediationConfig::from_toml(ok)
                .unwrap()
                .wait_seconds_to_repair_rebooting,
            604_800
        );
        let e = RemediationConfig::from_toml("wait_seconds_to_repair_rebooting = 6048000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("wait_seconds_to_repair_rebooting") && e.contains("more than a week"),
            "{e}"
        );
    }

    #[test]
    fn succeeded_entries_are_deleted_after_an_hour_unless_never() {
        let c = RemediationConfig::from_toml("").unwrap();
        assert_eq!(c.delete_succeeded_after, Some(Duration::from_secs(3600)));
        let c = RemediationConfig::from_toml("delete_succeeded_after = \"10m\"").unwrap();
        assert_eq!(c.delete_succeeded_after, Some(Duration::from_secs(600)));
        let c = RemediationConfig::from_toml("delete_succeeded_after = \"never\"").unwrap();
        assert_eq!(c.delete_succeeded_after, None);
        for bad in ["60", "\"soon\""] {
            let e = RemediationConfig::from_toml(&format!("delete_succeeded_after = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("delete_succeeded_after"), "{e}");
        }
        let e = RemediationConfig::from_toml("delete_succeeded_after = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a duration or \"never\""), "{e}");
    }

    #[test]
    fn full_section_parses_with_units() {
        let c = RemediationConfig::from_toml(
            r#"
observe = true
failure_domain = "label:topology.kubernetes.io/zone"
lease_stale = "30s"
second_signal = "lease"
kdump_wait = "90s"
maximum_repair_queue_entries = 4
wait_seconds_to_repair_rebooting = 120
[auto_repair]
having = { states = ["unreachable"], racks = ["r1"] }
not_having = { roles = ["boot"], labels = { pinned = "yes" } }
[[health_checks]]
name = "ready"
selector = { roles = ["cs"], machine_types = ["qemu"] }
unhealthy_conditions = [
  { type = "Ready", status = "Unknown", timeout = "5m" },
  { type = "nic:eth0", status = "False", timeout = "1m" },
]
max_unhealthy = "40%"
operation = "node-not-ready"
[[health_checks]]
name = "kdump"
unhealthy_conditions = [{ type = "kdump", status = "False", timeout = "10m" }]
unhealthy_range = "[1-3]"
[limits]
fleet_cap = { count = 20, percent = 10 }
slow_start = { max_width = 4, success_after = "10m" }
correlated_failure = { machines = 5, window = "2m" }
self_isolation = { percent = 50, window = "30s" }
rate = { per_hour = 6 }
escalation = { max_remediations = 2, window = "12h" }
"#,
        )
        .unwrap();
        assert!(c.observe);
        assert_eq!(
            c.failure_domain,
            FailureDomain::Label("topology.kubernetes.io/zone".into())
        );
        assert_eq!(c.lease_stale, Duration::from_secs(30));
        assert_eq!(c.second_signal, SecondSignal::Lease);
        assert_eq!(c.kdump_wait, Duration::from_secs(90));
        let hc = &c.health_checks[0];
        assert_eq!(hc.max_unhealthy, Some(Threshold::Percent(40)));
        assert_eq!(hc.unhealthy_conditions[0].timeout, Duration::from_secs(300));
        assert!(hc.unhealthy_conditions[1].is_agent_check());
        assert!(!hc.unhealthy_conditions[0].is_agent_check());
        assert_eq!(hc.node_startup_timeout, Duration::from_secs(1800));
        assert_eq!(
            c.health_checks[1].unhealthy_range,
            Some(UnhealthyRange { min: 1, max: 3 })
        );
        assert_eq!(c.health_checks[1].operation, "unhealthy");
        assert_eq!(c.limits.slow_start.width, 1, "unset keys keep defaults");
        assert_eq!(c.limits.slow_start.success_after, Duration::from_secs(600));
        assert_eq!(c.limits.rate.per_domain_per_hour, 5);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = RemediationConfig::from_toml("[limits.fleet_cap]\ncount = 3\npercentage = 5\n")
            .unwrap_err();
        assert!(e.to_string().contains("percentage"), "{e}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("lease_stale = \"0s\"", "remediation.lease_stale"),
            ("lease_stale = \"soon\"", "soon"),
            ("second_signal = \"ready\"", "second_signal"),
            ("[limits]\nrate = { per_hour = 0 }", "limits.rate.per_hour"),
            (
                "[limits]\nfleet_cap = { percent = 150 }",
                "limits.fleet_cap.percent",
            ),
            (
                "[limits]\nslow_start = { width = 4, max_width = 2 }",
                "limits.slow_start.max_width",
            ),
            ("failure_domain = \"row\"", "row"),
            (
                "[[health_checks]]\nname = \"a\"\nunhealthy_conditions = []",
                "health_checks[0].unhealthy_conditions",
            ),
            (
                "[[health_checks]]\nname = \"a\"\nmax_unhealthy = 2\nunhealthy_range = \"[1-2]\"\n\
                 unhealthy_conditions = [{ type = \"Ready\", status = \"False\", timeout = \"1m\" }]",
                "health_checks[0].unhealthy_range",
            ),
            (
                "[[health_checks]]\nname = \"a\"\n\
                 unhealthy_conditions = [{ type = \"kubelet\", status = \"True\", timeout = \"1m\" }]",
                "health_checks[0].unhealthy_conditions[0].status",
            ),
            (
                "[[health_checks]]\nname = \"a\"\nunhealthy_range = \"[3-1]\"\n\
                 unhealthy_conditions = [{ type = \"Ready\", status = \"False\", timeout = \"1m\" }]",
                "min is larger",
            ),
        ] {
            let e = RemediationConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn percent_rounds_down_but_never_below_one_machine() {
        assert_eq!(Threshold::Percent(40).of(5), 2);
        assert_eq!(
            Threshold::Percent(20).of(4),
            1,
            "not 0: a small pool still heals"
        );
        assert_eq!(Threshold::Percent(20).of(0), 0);
        assert_eq!(Threshold::Percent(40).of(5000), 2000);
        assert_eq!(Threshold::Count(3).of(5000), 3);
    }

    #[test]
    fn contradictions_that_would_never_repair_are_refused_with_their_key() {
        for (text, key) in [
            (
                "[auto_repair]\nhaving = { states = [\"unhealthy\"] }\n\
                 not_having = { states = [\"unhealthy\", \"unreachable\"] }\n",
                "auto_repair.not_having.states",
            ),
            (
                "[limits]\ncorrelated_failure = { machines = 1, window = \"1m\" }\n",
                "limits.correlated_failure.machines",
            ),
        ] {
            let e = RemediationConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("ever"), "{text}: {e}");
        }
        // One state left over is a working filter.
        RemediationConfig::from_toml(
            "[auto_repair]\nhaving = { states = [\"unhealthy\", \"unreachable\"] }\n\
             not_having = { states = [\"unhealthy\"] }\n",
        )
        .unwrap();
    }

    #[test]
    fn zero_percent_allows_none_as_zero_does() {
        assert_eq!(Threshold::Count(0).of(4), 0);
        assert_eq!(Threshold::Percent(0).of(4), 0, "not raised to one machine");
        assert_eq!(Threshold::Percent(0).of(5000), 0);
    }

    #[test]
    fn a_threshold_that_is_no_count_says_what_is_expected() {
        let hc = |v: &str| {
            format!(
                "[[health_checks]]\nname = \"r\"\nunhealthy_conditions = [{{ type = \"Ready\", \
                 status = \"Unknown\", timeout = \"5m\" }}]\nmax_unhealthy = {v}\n"
            )
        };
        for v in ["-1", "1.5", "true"] {
            let e = RemediationConfig::from_toml(&hc(v))
                .unwrap_err()
                .to_string();
            assert!(e.contains("a percentage like"), "{v}: {e}");
            assert!(!e.contains("untagged"), "{v}: {e}");
        }
        let ok = RemediationConfig::from_toml(&hc("2")).unwrap();
        assert_eq!(ok.health_checks[0].max_unhealthy, Some(Threshold::Count(2)));
    }

    #[test]
    fn failing_check_matches_kind_or_full_name() {
        use super::super::input::FailingCheck;
        let t = jiff::Timestamp::UNIX_EPOCH;
        let c = FailingCheck {
            name: "nic:eth0".into(),
            since: t,
            kind_since: t,
        };
        assert!(c.is("nic") && c.is("nic:eth0"));
        assert!(!c.is("nic:eth1") && !c.is("disk"));
        let k = FailingCheck {
            name: "kubelet:kubelet".into(),
            since: t,
            kind_since: t,
        };
        assert!(k.is("kubelet"));
    }
}
