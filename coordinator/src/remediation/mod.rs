//! Automatic remediation's decision core: which machines to repair now, and which to leave
//! alone because repairing them could make things worse.
//!
//! [`decide`] is one pure function of (fleet facts, node view, repair queue, decision
//! history, repair outcomes, operator switches, config, now) → a [`Pass`]: remediations
//! admitted, proposals held (each with the rule and the numbers that held it), findings, and
//! the state of every limit. It does no I/O and reads no clock. The remediation loop
//! ([`runner`]) gathers the [`Input`] ([`gather`]), enqueues the admitted entries through the
//! same door as `repair-queue add` and writes every decision to the journal ([`journal`],
//! kept through [`store::RemediationStore`]); [`admin`] answers `coordinatorctl` and
//! [`switches`] holds what operators changed.
//!
//! - module `detect`: two-signal death, sabakan-style auto-repair with CKE's limiters,
//!   MachineHealthCheck-style checks with their gates;
//! - module `limits`: pause, self-isolation, correlated failure, escalation to
//!   `needs-human`, fleet cap, slow start per failure domain, hourly rate;
//! - [`config`]: the `[remediation]` section and its defaults;
//! - [`sabakan`]: auto-repair's machines from a real sabakan's GraphQL API;
//! - [`input`] and [`decision`]: what goes in and what comes out.
//!
//! What it deliberately does not do:
//! - **It never latches.** No function here takes or returns "pending" state: a held
//!   proposal is dropped with its reason, and the next pass derives proposals afresh from
//!   the facts of its own `now`. When a limit clears, only what is still true is proposed;
//!   nothing held days ago is replayed.
//! - **Holding only stops new remediations.** The only effect a limit can have is not to
//!   admit a proposal. Nothing in this API can stop an uncordon, a restore, a health check
//!   or a flow already running (safety invariant 9).
//! - It does not guess (invariant 7): a Kubernetes view older than its freshness limit
//!   holds every decision that needs it, and a burst of silent agents holds everything.

pub mod admin;
mod cleanup;
pub mod config;
pub mod decision;
mod detect;
pub mod gather;
pub mod input;
pub mod journal;
mod limits;
mod limits_config;
pub mod metrics;
pub mod runner;
pub mod sabakan;
pub mod store;
pub mod switches;

#[cfg(test)]
mod fixture;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;

pub use config::RemediationConfig;
pub use decision::{Decision, LimitStatus, Outcome, Pass, Proposal, Rule};
pub use input::{Control, Input, Machine};
pub use runner::{LoopDeps, Remediation};

/// `now - since`, zero when `since` is in the future.
pub(crate) fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    let ms = now.as_millisecond().saturating_sub(since.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A duration for sentences: `40s`, `5m`, `2m 5s`, `1h 30m`; under 10 s to the tenth
/// (`1.9s`, `0.2s`, `3s`), so that short intervals do not read `silent for 1s (grace 2s)`
/// at 1.96 s or `lost 4 machines in 0s`. Always cut down, never rounded up: a sentence
/// never claims a threshold was reached before it was.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        let tenths = d.as_millis() / 100;
        return match tenths % 10 {
            0 => format!("{}s", tenths / 10),
            t => format!("{}.{t}s", tenths / 10),
        };
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m, s) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// The facts of one pass with the indexes every rule needs.
pub(crate) struct Ctx<'a> {
    input: &'a Input,
    cfg: &'a RemediationConfig,
    now: Timestamp,
    by_address: HashMap<&'a str, &'a Machine>,
    /// Per address, its active entry, else any entry.
    entries: HashMap<&'a str, &'a input::QueueEntry>,
    /// Per machine (same order as `input.machines`): it has an active entry. Looked up
    /// once here so each health check does not hash every address again.
    active: Vec<bool>,
    /// The machines auto-repair looks at (the registry's or sabakan's), or why it holds.
    auto_repair_from: Result<&'a [Machine], String>,
}

impl<'a> Ctx<'a> {
    fn new(input: &'a Input, cfg: &'a RemediationConfig, now: Timestamp) -> Self {
        let mut by_address = HashMap::with_capacity(input.machines.len());
        by_address.extend(input.machines.iter().map(|m| (m.address.as_str(), m)));
        let auto_repair_from = sabakan::auto_repair_machines(input, now);
        if input.sabakan.is_some()
            && let Ok(from) = &auto_repair_from
        {
            // Machines only sabakan knows still need a failure domain for the limits.
            for m in from.iter() {
                by_address.entry(m.address.as_str()).or_insert(m);
            }
        }
        let mut entries: HashMap<&str, &input::QueueEntry> = HashMap::new();
        for e in &input.queue {
            let slot = entries.entry(e.address.as_str()).or_insert(e);
            if e.is_active() {
                *slot = e;
            }
        }
        let active = input
            .machines
            .iter()
            .map(|m| {
                !entries.is_empty()
                    && entries
                        .get(m.address.as_str())
                        .is_some_and(|e| e.is_active())
            })
            .collect();
        Self {
            input,
            cfg,
            now,
            by_address,
            entries,
            active,
            auto_repair_from,
        }
    }

    fn machine(&self, address: &str) -> Option<&'a Machine> {
        self.by_address.get(address).copied()
    }

    fn domain_of(&self, address: &str) -> Option<&'a str> {
        self.machine(address).map(|m| self.cfg.failure_domain.of(m))
    }

    fn entry(&self, address: &str) -> Option<&'a input::QueueEntry> {
        self.entries.get(address).copied()
    }

    /// The machine at `index` of `input.machines` has an active entry.
    fn is_active_at(&self, index: usize) -> bool {
        self.active[index]
    }
}

/// A proposal on its way through the limits.
pub(crate) struct Candidate<'a> {
    m: &'a Machine,
    domain: &'a str,
    rule: Rule,
    proposal: Proposal,
    /// It rests on the Kubernetes view, so a stale view holds it.
    needs_view: bool,
}

impl<'a> Candidate<'a> {
    fn new(
        m: &'a Machine,
        ctx: &Ctx<'a>,
        rule: Rule,
        proposal: Proposal,
        needs_view: bool,
    ) -> Self {
        Self {
            m,
            domain: ctx.cfg.failure_domain.of(m),
            rule,
            proposal,
            needs_view,
        }
    }
}

/// A decision before it is stamped with the pass's time and domain.
pub(crate) struct Note<'a> {
    m: &'a Machine,
    rule: Rule,
    proposal: Option<Proposal>,
    sentence: String,
}

impl<'a> Note<'a> {
    fn new(m: &'a Machine, rule: Rule, proposal: Option<Proposal>, sentence: String) -> Self {
        Self {
            m,
            rule,
            proposal,
            sentence,
        }
    }

    fn stamp(self, ctx: &Ctx<'_>, outcome: Outcome) -> Decision {
        Decision {
            at: ctx.now,
            address: self.m.address.clone(),
            domain: ctx.cfg.failure_domain.of(self.m).to_string(),
            outcome,
            rule: self.rule,
            proposal: self.proposal,
            sentence: self.sentence,
        }
    }
}

/// What the detectors found. One decision per machine: the first detector to decide about
/// a machine wins (auto-repair, then the health checks in their order).
#[derive(Default)]
pub(crate) struct Detected<'a> {
    candidates: Vec<Candidate<'a>>,
    held: Vec<Note<'a>>,
    findings: Vec<Note<'a>>,
    taken: HashSet<&'a str>,
}

impl<'a> Detected<'a> {
    fn taken(&self, address: &str) -> bool {
        self.taken.contains(address)
    }

    fn hold(&mut self, n: Note<'a>) {
        if self.taken.insert(n.m.address.as_str()) {
            self.held.push(n);
        }
    }

    fn propose(&mut self, c: Candidate<'a>) {
        if self.taken.insert(c.m.address.as_str()) {
            self.candidates.push(c);
        }
    }
}

/// Two-signal death of one machine, as the detectors decide it: `Some(why)` when the machine
/// at `address` is `unreachable` and dead by the two signals (see the module `detect`);
/// `None` when it is alive, not confirmed dead, the view is too old, or it is unknown. The
/// repair queue asks this before a drain, which cannot complete on a dead node.
pub fn dead(
    input: &Input,
    cfg: &RemediationConfig,
    address: &str,
    now: Timestamp,
) -> Option<String> {
    let ctx = Ctx::new(input, cfg, now);
    let m = ctx.machine(address)?;
    if m.state != crate::health::MachineState::Unreachable {
        return None;
    }
    match detect::death(m, &ctx) {
        detect::Death::Dead(why) => Some(why),
        _ => None,
    }
}

/// One pass: runs the detectors, then the limits over their candidates (oldest failure
/// first), and returns every decision with its reason.
pub fn decide(input: &Input, cfg: &RemediationConfig, now: Timestamp) -> Pass {
    let ctx = Ctx::new(input, cfg, now);
    let mut found = Detected::default();
    detect::findings(&ctx, &mut found);
    detect::auto_repair(&ctx, &mut found);
    detect::health_checks(&ctx, &mut found);

    let mut pass = Pass {
        findings: found
            .findings
            .into_iter()
            .map(|n| n.stamp(&ctx, Outcome::Finding))
            .collect(),
        held: found
            .held
            .into_iter()
            .map(|n| n.stamp(&ctx, Outcome::Held))
            .collect(),
        ..Pass::default()
    };

    if let Err(sentence) = &ctx.auto_repair_from
        && cfg.auto_repair.enabled
    {
        pass.held.push(Decision {
            at: now,
            address: sabakan::JOURNAL_ADDRESS.into(),
            domain: String::new(),
            outcome: Outcome::Held,
            rule: Rule::SabakanUnavailable,
            proposal: None,
            sentence: sentence.clone(),
        });
    }

    let mut candidates = found.candidates;
    candidates.sort_by(|a, b| (a.m.since, &a.m.address).cmp(&(b.m.since, &b.m.address)));
    let view_fresh = input.kube.is_none_or(|k| k.is_fresh(now));
    let mut limiter = limits::Limiter::new(&ctx);
    for c in candidates {
        let addr = &c.m.address;
        let verdict = if c.needs_view && !view_fresh {
            Err((
                Rule::NodeViewStale,
                format!(
                    "held: {addr}: the proposal rests on the Kubernetes view, which is older \
                     than its freshness limit; holding rather than guessing"
                ),
            ))
        } else {
            limiter.check(&c)
        };
        let Candidate {
            m, rule, proposal, ..
        } = c;
        match verdict {
            Ok(()) => {
                let (outcome, verb) = if cfg.observe {
                    (Outcome::WouldEnqueue, "would enqueue (observe mode)")
                } else {
                    (Outcome::Admitted, "admitted")
                };
                let sentence = format!(
                    "{verb}: {addr} operation {} ({}): {}",
                    proposal.operation, proposal.source, proposal.reason
                );
                let n = Note::new(m, rule, Some(proposal), sentence);
                pass.admitted.push(n.stamp(&ctx, outcome));
            }
            Err((rule, sentence)) => {
                let n = Note::new(m, rule, Some(proposal), sentence);
                pass.held.push(n.stamp(&ctx, Outcome::Held));
            }
        }
    }
    pass.limits = limiter.status();
    pass.limits.push(queue_status(input, cfg, &pass));
    pass.limits
        .extend(sabakan::status(input, cfg.auto_repair.enabled, now));
    pass
}

/// `maximum_repair_queue_entries` as a limit: it holds all of auto-repair, and failed
/// entries count towards it until a person deletes them, so a fleet can stop being repaired
/// by failures piling up; `remediation status` and `fleetmend_remediation_limit_holding`
/// must show it like the storm limits.
fn queue_status(input: &Input, cfg: &RemediationConfig, pass: &Pass) -> LimitStatus {
    let failed = input
        .queue
        .iter()
        .filter(|e| e.status == protocol::admin::repair::RepairStatus::Failed)
        .count();
    LimitStatus {
        rule: Rule::MaximumRepairQueueEntries,
        holding: pass
            .held
            .iter()
            .any(|d| d.rule == Rule::MaximumRepairQueueEntries),
        sentence: format!(
            "{} of {} entries in the repair queue ({failed} failed: each stays until a person \
             deletes it, `coordinatorctl repair-queue delete INDEX`)",
            input.queue.len(),
            cfg.maximum_repair_queue_entries
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The traps other systems fell into, one test each, through [`decide`].

    use std::time::{Duration, Instant};

    use protocol::admin::repair::RepairStatus;

    use super::config::{HealthCheck, Selector, Threshold, UnhealthyCondition};
    use super::fixture::{case, dead, failing, set_condition, silent};
    use super::*;
    use crate::health::MachineState;

    fn ready_check(max: Option<Threshold>) -> HealthCheck {
        let cond = |status: &str| UnhealthyCondition {
            type_: "Ready".into(),
            status: status.into(),
            timeout: Duration::from_secs(300),
        };
        HealthCheck {
            name: "ready".into(),
            selector: Selector::default(),
            unhealthy_conditions: vec![cond("Unknown"), cond("False")],
            node_startup_timeout: Duration::from_secs(1800),
            max_unhealthy: max,
            unhealthy_range: None,
            operation: "not-ready".into(),
        }
    }

    #[test]
    fn a_gate_counts_machines_under_remediation_as_unhealthy() {
        // Trap: a gate that counts machines under remediation as healthy lets one more
        // through each pass until the whole cluster is being remediated.
        let c = case()
            .cfg(|c| {
                c.auto_repair.enabled = false;
                c.health_checks.push(ready_check(Some(Threshold::Count(1))));
                c.limits.slow_start.width = 8;
                c.limits.slow_start.max_width = 8;
            })
            .rack("r1", 5)
            .on("r1.0", |m, now| {
                set_condition(m, now, "Ready", "False", 400)
            });
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r1.0"]);
        // r1.0 is now under remediation: drained and Ready again while its repair runs.
        let c = c
            .apply(&p)
            .on("r1.0", |m, now| set_condition(m, now, "Ready", "True", 10))
            .on("r1.1", |m, now| {
                set_condition(m, now, "Ready", "False", 400)
            });
        let p = c.run();
        assert!(p.admitted.is_empty(), "{:#?}", p.admitted);
        let d = p.held_for("r1.1").unwrap();
        assert_eq!(d.rule, Rule::HealthCheckGate);
        assert!(
            d.sentence
                .contains("2 of 5 selected machines are unhealthy"),
            "{}",
            d.sentence
        );
    }

    #[test]
    fn a_percentage_gate_fires_in_a_pool_of_four_and_the_count_caps_a_pool_of_thousands() {
        // Trap 1: 20 % of 4 is 0.8; rounded down to 0 the gate would never let one through.
        let c = case()
            .cfg(|c| {
                c.auto_repair.enabled = false;
                c.health_checks
                    .push(ready_check(Some(Threshold::Percent(20))));
            })
            .rack("r1", 4)
            .on("r1.0", |m, now| {
                set_condition(m, now, "Ready", "False", 400)
            });
        assert_eq!(c.admitted(), ["r1.0"]);
        // Trap 2: 40 % of 2,000 is 800 at once. The gate lets them through, and the fleet
        // cap's count binds: 10, not 800.
        let mut c = case().cfg(|c| {
            c.auto_repair.enabled = false;
            c.health_checks
                .push(ready_check(Some(Threshold::Percent(40))));
            c.limits.rate.per_hour = 1000;
        });
        for r in 0..50 {
            c = c
                .rack(&format!("r{r}"), 40)
                .on(&format!("r{r}.0"), |m, now| {
                    set_condition(m, now, "Ready", "False", 400)
                });
        }
        let p = c.run();
        assert_eq!(p.admitted.len(), 10);
        assert_eq!(p.held.len(), 40);
        assert!(p.held.iter().all(|d| d.rule == Rule::FleetCap));
        assert!(
            p.held[0]
                .sentence
                .contains("count 10, 5% of 2000 machines = 100; the smaller binds"),
            "{}",
            p.held[0].sentence
        );
    }

    #[test]
    fn a_limit_that_clears_does_not_replay_what_it_held() {
        // Trap: a breaker that latches shut, then replays days-old decisions when it opens.
        let c = case()
            .rack("r1", 20)
            .on("r1.0", |m, now| dead(m, now, 70))
            .on("r1.1", |m, now| dead(m, now, 60))
            .on("r1.2", |m, now| dead(m, now, 50));
        let p = c.run();
        assert!(p.admitted.is_empty());
        assert_eq!(p.held.len(), 3);
        assert!(p.held.iter().all(|d| d.rule == Rule::CorrelatedFailure));
        // The PDU comes back: two machines return, one stays dead. Nothing held earlier is
        // replayed; only what is true now is proposed.
        let c = c
            .later(3600)
            .on("r1.0", |m, now| *m = fixture::healthy("r1.0", "r1", now))
            .on("r1.1", |m, now| *m = fixture::healthy("r1.1", "r1", now));
        assert_eq!(c.admitted(), ["r1.2"]);
        // Paused, then resumed after the machine healed itself: nothing to do.
        let c = case()
            .machine("a")
            .failing("kubelet", 60)
            .input(|i, now| i.control.paused = Some(("maintenance".into(), now)));
        assert_eq!(c.held("a").0, Rule::Paused);
        let c = c
            .later(86_400)
            .input(|i, _| i.control.paused = None)
            .on("a", |m, now| *m = fixture::healthy("a", "r1", now));
        let p = c.run();
        assert!(p.admitted.is_empty() && p.held.is_empty(), "{p:#?}");
    }

    #[test]
    fn holding_never_touches_repairs_already_running() {
        // Trap: a breaker that also stops uncordons and restores. A pass only returns
        // decisions about proposals; a machine whose entry runs gets none from any limit.
        let c = case()
            .rack("r1", 20)
            .entry("r1.5", RepairStatus::Processing)
            .on("r1.5", |m, now| failing(m, now, "kubelet", 600))
            .on("r1.0", |m, now| dead(m, now, 70))
            .on("r1.1", |m, now| dead(m, now, 60))
            .on("r1.2", |m, now| dead(m, now, 50))
            .input(|i, now| i.control.paused = Some(("storm".into(), now)));
        let p = c.run();
        let running: Vec<&Decision> = p.decisions().filter(|d| d.address == "r1.5").collect();
        assert_eq!(running.len(), 1);
        assert_eq!(
            running[0].rule,
            Rule::QueueHasEntry,
            "the detector skips it; no limit holds it"
        );
    }

    #[test]
    fn ready_unknown_then_false_does_not_remediate_twice() {
        let c = case()
            .cfg(|c| {
                c.auto_repair.enabled = false;
                c.health_checks.push(ready_check(None));
            })
            .rack("r1", 5)
            .on("r1.0", |m, now| {
                set_condition(m, now, "Ready", "Unknown", 301)
            });
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r1.0"]);
        // Unknown → False resets the transition time; 6 minutes later False has timed out too.
        let c = c
            .apply(&p)
            .later(60)
            .on("r1.0", |m, now| set_condition(m, now, "Ready", "False", 0))
            .later(360);
        assert!(
            c.admitted().is_empty(),
            "queued entry: no second remediation"
        );
        let c = c.input(|i, _| i.queue[0].status = RepairStatus::Processing);
        assert!(c.admitted().is_empty());
        // The entry failed and is still in the queue: still no second entry.
        let c = c.input(|i, _| i.queue[0].status = RepairStatus::Failed);
        assert_eq!(c.held("r1.0").0, Rule::QueueHasEntry);
    }

    #[test]
    fn a_planned_reboot_is_not_a_crash() {
        // A whole rack reboots on purpose: goodbyes, Leases stop, Ready goes Unknown.
        let mut c = case().cfg(|c| c.health_checks.push(ready_check(None)));
        for i in 0..5 {
            c = c.machine(&format!("r1.{i}")).dead(400).goodbye(400);
        }
        let p = c.run();
        assert!(p.admitted.is_empty(), "{:#?}", p.admitted);
        assert!(p.held.is_empty(), "{:#?}", p.held);
        assert!(
            p.limits
                .iter()
                .all(|l| !l.holding || l.rule == Rule::FleetCap)
        );
    }

    #[test]
    fn a_coordinator_that_loses_its_network_fences_nobody() {
        // No [kubernetes]: only self-isolation stands between a partition and remediation.
        let mut c = case().no_kube().roomy();
        for r in 0..10 {
            c = c.rack(&format!("r{r}"), 10);
        }
        for i in 0..80 {
            let a = format!("r{}.{}", i % 10, i / 10);
            c = c.on(&a, move |m, now| silent(m, now, 1800 + i % 5));
        }
        let p = c.run();
        assert!(p.admitted.is_empty());
        assert_eq!(p.held.len(), 80);
        assert!(p.held.iter().all(|d| d.rule == Rule::SelfIsolation));
        let status = p
            .limits
            .iter()
            .find(|l| l.rule == Rule::SelfIsolation)
            .unwrap();
        assert!(status.holding);
        assert!(
            status
                .sentence
                .contains("80 of 100 agents (80%) went silent within 4s")
        );
        // Traffic returns: every agent reports again, and nothing stale is enqueued.
        let mut back = c.clone();
        for m in &mut back.input.machines {
            *m = fixture::healthy(&m.address.clone(), &m.rack.clone(), back.now);
        }
        let p = back.run();
        assert!(p.admitted.is_empty() && p.held.is_empty(), "{p:#?}");
        // Only part returns (the burst shrinks under the share): the rest is repaired.
        let mut partial = c;
        for m in partial.input.machines.iter_mut().take(75) {
            *m = fixture::healthy(&m.address.clone(), &m.rack.clone(), partial.now);
        }
        let n = partial
            .input
            .machines
            .iter()
            .filter(|m| m.state == MachineState::Unreachable)
            .count();
        assert_eq!(n, 19, "19 of 100 silent: under the 30% share");
        assert!(
            partial
                .run()
                .held
                .iter()
                .all(|d| d.rule != Rule::SelfIsolation)
        );
    }

    #[test]
    fn decisions_serialize_for_the_journal() {
        let p = case().machine("a").failing("kubelet", 60).run();
        let json = serde_json::to_string(&p.admitted[0]).unwrap();
        assert!(json.contains("\"rule\":\"auto-repair\""), "{json}");
        assert!(json.contains("\"outcome\":\"admitted\""), "{json}");
        let back: Decision = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p.admitted[0]);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(40)), "40s");
        assert_eq!(human(Duration::from_millis(10_960)), "10s");
        assert_eq!(human(Duration::from_millis(1_960)), "1.9s");
        assert_eq!(human(Duration::from_millis(3_000)), "3s");
        assert_eq!(human(Duration::from_millis(3_040)), "3s");
        assert_eq!(human(Duration::from_millis(240)), "0.2s");
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(125)), "2m 5s");
        assert_eq!(human(Duration::from_secs(5400)), "1h 30m");
        assert_eq!(human(Duration::from_secs(86_400)), "24h");
    }

    /// Benchmark: detectors and limits over 10,000 machines (1 % unhealthy) per pass.
    /// Run with `cargo test --release -p fleetmend-coordinator --lib
    /// remediation::tests::bench_pass_over_ten_thousand_machines -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark; run by name in release"]
    fn bench_pass_over_ten_thousand_machines() {
        let mut c = case().cfg(|c| {
            // Room for every candidate to reach the storm limits, so all of them run.
            c.maximum_repair_queue_entries = 1000;
            c.health_checks
                .push(ready_check(Some(Threshold::Percent(40))));
            c.health_checks.push(HealthCheck {
                name: "nic".into(),
                unhealthy_conditions: vec![UnhealthyCondition {
                    type_: "nic".into(),
                    status: "False".into(),
                    timeout: Duration::from_secs(60),
                }],
                ..ready_check(None)
            });
        });
        for r in 0..100 {
            c = c.rack(&format!("r{r}"), 100);
        }
        // 1 %: 100 machines, one per rack, a mix of failures; plus queue and history.
        for r in 0..100 {
            let a = format!("r{r}.{}", r % 100);
            c = match r % 4 {
                0 => c.on(&a, |m, now| failing(m, now, "nic:eth0", 120)),
                1 => c.on(&a, |m, now| dead(m, now, 200)),
                2 => c.on(&a, |m, now| set_condition(m, now, "Ready", "False", 400)),
                _ => c.on(&a, |m, now| silent(m, now, 60)),
            };
            if r % 25 == 0 {
                c = c.entry(&format!("r{r}.50"), RepairStatus::Processing);
            }
            c = c.admitted_before(&format!("r{r}.60"), 7200).outcome(
                &format!("r{r}.60"),
                3600,
                true,
            );
        }
        let passes = 200;
        let first = c.run();
        assert_eq!(c.input.machines.len(), 10_000);
        // CPU time of this thread (ns), from the scheduler: wall time on a shared machine
        // also counts the time other processes held the core.
        let cpu_ns = || -> Option<u64> {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let (start, cpu_start) = (Instant::now(), cpu_ns());
        for _ in 0..passes {
            std::hint::black_box(decide(&c.input, &c.cfg, c.now));
        }
        let per = start.elapsed() / passes;
        let cpu_per_ms = cpu_start
            .zip(cpu_ns())
            .map(|(a, b)| (b - a) as f64 / f64::from(passes) / 1e6);
        let mut by_rule = std::collections::BTreeMap::new();
        for d in &first.held {
            *by_rule.entry(d.rule.as_str()).or_insert(0) += 1;
        }
        println!(
            "remediation pass over 10,000 machines (1% unhealthy): {:.3} ms wall, {} CPU \
             per pass ({} admitted, {} held {by_rule:?}, {} findings; target < 5 ms)",
            per.as_secs_f64() * 1e3,
            cpu_per_ms.map_or("?".into(), |c| format!("{c:.3} ms")),
            first.admitted.len(),
            first.held.len(),
            first.findings.len()
        );
        assert!(!first.admitted.is_empty());
    }
}
