//! The remediation loop: every `interval`, and about a second after the node view saw a
//! Node's Ready status change ([`LoopDeps::view_changed`]), gather the facts
//! ([`super::gather`]), call [`super::decide`] with the injected clock, enqueue the
//! admitted entries through the same door as `coordinatorctl repair-queue add`
//! ([`RepairQueue::request`] with `RepairQueueRequest::Add`), write every decision to the
//! journal ([`super::journal`]) and post a Kubernetes Event on the Node for each new
//! admission or hold.
//!
//! The order of a pass is socket → decision → store → action: the decision is pure, the
//! enqueue goes through the repair queue's own transaction, and the journal records what
//! happened (an admission the queue refused is journalled as held `enqueue-refused`).
//!
//! What it deliberately does not do: it keeps no pending proposals (a held proposal is
//! dropped; the next pass derives afresh), and it never touches a running repair: it only
//! adds entries. When the queue cannot be listed, the pass is skipped (deciding without
//! knowing which machines have entries could enqueue twice).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use protocol::admin::remediation::{JournalLine, LimitLine, RemediationStatus};
use protocol::admin::repair::{
    AddRepairEntry, RepairEntry, RepairQueueRequest, RepairQueueResponse,
};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::cleanup::{delete_succeeded, finished_ago};
use super::config::RemediationConfig;
use super::decision::{Decision, Outcome, Pass, Rule};
use super::gather::{self, ViewFacts};
use super::input::RepairOutcome;
use super::journal::{self, JournalWrite};
use super::metrics::RemediationMetrics;
use super::sabakan::SabakanSource;
use super::shared::{LoopDeps, Remediation, Shared};
use super::store::RemediationStore;
use super::switches::Switches;
use crate::clock::{Clock, to_unix_ms};
use crate::health::MachineState;
use crate::k8s::NodeEvent;
use crate::repair::Requester;
use crate::store::{Store, StoreError};

/// How often the journal is pruned: retention is counted in days, so once a minute is
/// plenty and keeps the delete off most passes.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How many of the last pass's decisions `remediation status` shows: a screenful; a storm
/// holding thousands is summed up by the limits' sentences, and `events` lists them all.
const STATUS_DECISIONS: usize = 50;

/// A restarted loop continues the repeats of a pass journalled at most this many intervals
/// ago: a restart takes seconds, and a decision still made after it is the same decision.
const RESUME_INTERVALS: u32 = 6;

/// The Kubernetes view may be this many refresh periods old before decisions that need it
/// hold: one missed refresh is a slow API server, three is an outage.
pub const VIEW_MAX_AGE_REFRESHES: u32 = 3;

/// Wait between a node view change and the pass it triggers: a rack losing power turns its
/// Nodes NotReady over a second or so, and one pass that sees them together lets the storm
/// limits (correlated failure, self-isolation) judge the whole event, not its first node.
pub const VIEW_CHANGE_DEBOUNCE: Duration = Duration::from_secs(1);

/// Waits for `n`, or for ever without one.
async fn notified(n: Option<&Notify>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

impl Remediation {
    /// Loads the operator switches from the store.
    pub async fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        base: RemediationConfig,
        kubernetes: bool,
    ) -> Result<Self, StoreError> {
        let board = store.switchboard().await?;
        let switches = Switches::from_rows(&board.switches, board.cleared);
        Ok(Self {
            shared: Arc::new(Shared {
                store,
                clock,
                base,
                switches: Mutex::new(switches),
                last: Mutex::new(RemediationStatus::default()),
                wake: Notify::new(),
                switched: AtomicU64::new(0),
                passed: watch::Sender::new(None),
                metrics: Arc::new(RemediationMetrics::default()),
                kubernetes,
            }),
        })
    }

    /// The loop's `/metrics` series.
    pub fn metrics(&self) -> Arc<RemediationMetrics> {
        self.shared.metrics.clone()
    }

    /// Starts the loop; it stops when `shutdown` fires.
    pub fn spawn(
        &self,
        deps: LoopDeps,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let shared = self.shared.clone();
        let ar = &shared.base.auto_repair;
        let sabakan = match (ar.source, &ar.sabakan) {
            (super::sabakan::Source::Sabakan, Some(cfg)) => {
                let s = Arc::new(SabakanSource::new(cfg, shared.base.interval));
                tokio::spawn(s.clone().run(shared.clone(), shutdown.clone()));
                Some(s)
            }
            _ => None,
        };
        tokio::spawn(async move {
            let mut state = match LoopState::load(&shared).await {
                Ok(s) => s,
                Err(error) => {
                    // Without the journal's history the rate limit and escalation would
                    // count from zero; better no remediation than an unbounded one.
                    tracing::error!(%error, "remediation journal unreadable; automatic remediation does not run");
                    return;
                }
            };
            if deps.queue.is_none() {
                tracing::warn!(
                    "[remediation] without a [repair] configuration: decisions are journalled, nothing can be enqueued"
                );
            }
            tracing::info!(interval = ?shared.base.interval, kubernetes = shared.kubernetes, "remediation loop started");
            shared
                .passed
                .send_replace(Some(shared.switched.load(Ordering::SeqCst)));
            let mut tick = tokio::time::interval(shared.base.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                    _ = shared.wake.notified() => {}
                    _ = notified(deps.view_changed.as_deref()) => {
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(VIEW_CHANGE_DEBOUNCE) => {}
                        }
                        tracing::debug!("node view changed: remediation pass now");
                        // The next periodic pass counts from this one.
                        tick.reset();
                    }
                }
                // Switches changed up to here are in the switches this pass reads.
                let seen = shared.switched.load(Ordering::SeqCst);
                if let Err(error) = state.pass(&shared, &deps, sabakan.as_deref()).await {
                    shared.metrics.pass_failed();
                    tracing::warn!(%error, "remediation pass skipped; retrying next interval");
                }
                shared.passed.send_replace(Some(seen));
            }
            shared.passed.send_replace(None);
        })
    }
}

/// What the loop remembers between passes (all of it also in the store).
struct LoopState {
    seq: u64,
    /// The previous pass's line per machine: (line id, outcome, rule, operation).
    prev: HashMap<String, (i64, Outcome, Rule, Option<String>)>,
    admissions: Vec<Decision>,
    outcomes: Vec<(u64, RepairOutcome)>,
    known_outcomes: HashSet<u64>,
    /// Entries this loop enqueued (not by hand), still in the queue as far as it knows.
    own: HashSet<u64>,
    last_prune: Option<Timestamp>,
}

/// Why a pass could not run.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error("cannot list the repair queue: {0}")]
    Queue(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn history_window(cfg: &RemediationConfig) -> Duration {
    cfg.limits.escalation.window.max(Duration::from_secs(3600))
}

fn ago(now: Timestamp, d: Duration) -> i64 {
    to_unix_ms(now) - i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl LoopState {
    async fn load(shared: &Shared) -> Result<Self, StoreError> {
        let now = shared.clock.now();
        let hist = ago(now, history_window(&shared.base));
        let out = ago(now, shared.base.limits.slow_start.lookback);
        // A pass journalled within a few intervals before a restart is "the previous pass".
        let recent = ago(now, shared.base.interval * RESUME_INTERVALS);
        let resumed = shared.store.resume(hist, out, recent).await?;
        let (seq, admissions, outcomes, last, own) = (
            resumed.max_seq,
            resumed.admissions,
            resumed.outcomes,
            resumed.last_pass,
            resumed.own_entries,
        );
        let prev = last
            .into_iter()
            .filter_map(|(id, a, o, r, op)| {
                let o: Outcome = serde_json::from_value(serde_json::Value::String(o)).ok()?;
                let r: Rule = serde_json::from_value(serde_json::Value::String(r)).ok()?;
                Some((a, (id, o, r, op)))
            })
            .collect();
        Ok(Self {
            seq,
            prev,
            admissions,
            known_outcomes: outcomes.iter().map(|(i, _)| *i).collect(),
            outcomes,
            own: own.into_iter().collect(),
            last_prune: None,
        })
    }

    async fn queue(deps: &LoopDeps) -> Result<Vec<RepairEntry>, PassError> {
        match &deps.queue {
            None => Ok(Vec::new()),
            Some(q) => match q.request(RepairQueueRequest::List).await {
                Ok(RepairQueueResponse::List(l)) => Ok(l),
                Ok(other) => Err(PassError::Queue(format!("unexpected answer {other:?}"))),
                Err(e) => Err(PassError::Queue(e.to_string())),
            },
        }
    }

    async fn pass(
        &mut self,
        shared: &Shared,
        deps: &LoopDeps,
        sabakan: Option<&SabakanSource>,
    ) -> Result<(), PassError> {
        let mut queue = Self::queue(deps).await?;
        let now = shared.clock.now();
        let (cfg, control) = {
            let s = shared.switches();
            (s.effective(&shared.base), s.control())
        };
        self.remember_outcomes(shared, &queue, &cfg, now).await?;
        self.forget_gone(shared, &queue).await?;
        let deleted = delete_succeeded(&self.own, deps, &mut queue, &cfg, now).await;
        let fleet = deps.fleet.snapshot();
        let view = deps.view.as_ref().map(|(v, max)| (v.snapshot(), *max));
        let keep = ago(now, history_window(&cfg));
        self.admissions.retain(|d| to_unix_ms(d.at) >= keep);
        let view = view.as_ref().map(|(s, max)| ViewFacts {
            snapshot: s,
            max_age: *max,
        });
        let mut input = gather::input(
            &fleet,
            view,
            &queue,
            self.admissions.clone(),
            self.outcomes.iter().map(|(_, o)| o.clone()).collect(),
            control,
        );
        gather::add_dumps(&mut input, deps.kdump.as_ref());
        input.sabakan = sabakan.map(|s| s.facts(&cfg.auto_repair, &input.machines, view));
        let mut pass = super::decide(&input, &cfg, now);
        let view_failure = deps.view.as_ref().and_then(|(v, _)| v.last_failure());
        if let Some(why) = &view_failure {
            // The journal says why the view is stale, as `remediation status` does.
            for d in pass
                .held
                .iter_mut()
                .filter(|d| d.rule == Rule::NodeViewStale)
            {
                d.sentence = format!("{}; the last refresh failed: {why}", d.sentence);
            }
        }
        for e in deleted {
            pass.findings.push(Decision {
                at: now,
                domain: input
                    .machines
                    .iter()
                    .find(|m| m.address == e.address)
                    .map(|m| cfg.failure_domain.of(m).to_string())
                    .unwrap_or_default(),
                sentence: format!(
                    "repair queue entry {} (operation {}) succeeded {} ago: deleted, so {} may \
                     be remediated again (delete_succeeded_after {})",
                    e.index,
                    e.operation,
                    super::human(finished_ago(now, &e)),
                    e.address,
                    super::human(cfg.delete_succeeded_after.unwrap_or_default()),
                ),
                address: e.address,
                outcome: Outcome::Finding,
                rule: Rule::SucceededEntryDeleted,
                proposal: None,
            });
        }
        let added = enqueue(&mut pass, deps).await;
        if !added.is_empty() {
            let at = to_unix_ms(now);
            self.own.extend(added.iter().map(|(i, _)| *i));
            shared
                .store
                .update_own_entries(added, Vec::new(), at)
                .await?;
        }
        let nodes: HashMap<&str, &str> = input
            .machines
            .iter()
            .filter_map(|m| Some((m.address.as_str(), m.node.as_ref()?.name.as_str())))
            .collect();
        let new = self.journal(shared, &pass).await?;
        self.admissions
            .extend(pass.admitted.iter().filter(|d| d.is_admission()).cloned());
        let lost_now = pass
            .findings
            .iter()
            .filter(|d| d.rule == Rule::AgentLostNodeAlive)
            .count() as u64;
        let mut new_lost = 0;
        let mut events = Vec::new();
        for d in &new {
            shared.metrics.decided(d.outcome, d.rule);
            log(d);
            let ev = match (d.outcome, d.rule) {
                (Outcome::Admitted, _) => Some(NodeEvent::RemediationAdmitted),
                (Outcome::Held, _) => Some(NodeEvent::RemediationHeld),
                (Outcome::Finding, Rule::AgentLostNodeAlive) => {
                    new_lost += 1;
                    Some(NodeEvent::AgentLostNodeAlive)
                }
                _ => None,
            };
            if let (Some(ev), Some(node)) = (ev, nodes.get(d.address.as_str())) {
                events.push((node.to_string(), ev, d.sentence.clone()));
            }
        }
        shared.metrics.pass(&pass.limits, lost_now, new_lost);
        if !events.is_empty() {
            // Best effort and off the loop: a slow API server must not delay the next pass.
            let sink = deps.events.clone();
            tokio::spawn(async move {
                for (node, ev, msg) in events {
                    sink.record_event(&node, ev, &msg).await;
                }
            });
        }
        let mut status = status_of(shared, &pass, now);
        explain_stale_view(&mut status, view_failure);
        if let Some(line) = warming_up(
            deps.fleet.started_at(),
            deps.fleet.config().unreachable_grace + protocol::AGENT_RECONNECT_MAX,
            now,
            input.machines.iter().map(|m| (m.state, m.last_report_at)),
        ) {
            status.limits.insert(0, line);
        }
        *shared.last() = status;
        self.prune(shared, &cfg, now).await
    }

    /// Records the outcomes of entries that finished since the last pass, so slow start
    /// still sees them after the entries are deleted.
    async fn remember_outcomes(
        &mut self,
        shared: &Shared,
        queue: &[RepairEntry],
        cfg: &RemediationConfig,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let new = gather::finished(queue, &self.known_outcomes);
        let before = ago(now, cfg.limits.slow_start.lookback);
        if !new.is_empty() {
            let rows = new.clone();
            shared.store.add_outcomes(rows, before).await?;
            self.known_outcomes.extend(new.iter().map(|(i, _)| *i));
            self.outcomes.extend(new);
        }
        self.outcomes
            .retain(|(_, o)| to_unix_ms(o.finished_at) >= before);
        Ok(())
    }

    /// Forgets the entries this loop enqueued that have left the queue or are marked for
    /// deletion (by anyone).
    async fn forget_gone(
        &mut self,
        shared: &Shared,
        queue: &[RepairEntry],
    ) -> Result<(), StoreError> {
        let listed: HashSet<u64> = queue
            .iter()
            .filter(|e| !e.deleted)
            .map(|e| e.index)
            .collect();
        let gone: Vec<u64> = self
            .own
            .iter()
            .copied()
            .filter(|i| !listed.contains(i))
            .collect();
        if !gone.is_empty() {
            self.own.retain(|i| listed.contains(i));
            shared.store.update_own_entries(Vec::new(), gone, 0).await?;
        }
        Ok(())
    }

    /// Writes the pass's decisions: a decision the previous pass also made is a repeat of
    /// its line; anything else (and every admission) a new line. Returns the new ones.
    async fn journal(&mut self, shared: &Shared, pass: &Pass) -> Result<Vec<Decision>, StoreError> {
        let mut writes = Vec::new();
        let mut new = Vec::new();
        for d in pass.decisions() {
            self.seq += 1;
            let op = journal::operation(d).map(str::to_string);
            match self.prev.get(&d.address) {
                Some((id, o, r, p))
                    if *o == d.outcome && *r == d.rule && *p == op && !d.is_admission() =>
                {
                    writes.push(JournalWrite::Repeat {
                        id: *id,
                        seq: self.seq,
                        decision: d.clone(),
                    });
                }
                _ => {
                    writes.push(JournalWrite::Insert {
                        seq: self.seq,
                        decision: d.clone(),
                    });
                    new.push(d.clone());
                }
            }
        }
        let keys: Vec<_> = pass
            .decisions()
            .map(|d| {
                (
                    d.address.clone(),
                    d.outcome,
                    d.rule,
                    journal::operation(d).map(str::to_string),
                )
            })
            .collect();
        let ids = if writes.is_empty() {
            Vec::new()
        } else {
            shared.store.write_journal(writes).await?
        };
        self.prev = keys
            .into_iter()
            .zip(ids)
            .map(|((a, o, r, p), id)| (a, (id, o, r, p)))
            .collect();
        Ok(new)
    }

    async fn prune(
        &mut self,
        shared: &Shared,
        cfg: &RemediationConfig,
        now: Timestamp,
    ) -> Result<(), PassError> {
        let due = self.last_prune.is_none_or(|t| {
            now.duration_since(t) >= SignedDuration::try_from(PRUNE_EVERY).unwrap_or_default()
        });
        if !due {
            return Ok(());
        }
        self.last_prune = Some(now);
        let before = ago(now, cfg.journal_retention);
        let max = cfg.journal_max_rows;
        let gone = shared.store.prune_journal(before, max).await?;
        if gone > 0 {
            tracing::debug!(lines = gone, "remediation journal pruned");
        }
        Ok(())
    }
}

/// Enqueues every admitted decision through the repair queue's `add`; one the queue refuses
/// becomes held `enqueue-refused` with the queue's reason. Returns the entries added
/// (index, address).
async fn enqueue(pass: &mut Pass, deps: &LoopDeps) -> Vec<(u64, String)> {
    let mut added = Vec::new();
    let mut kept = Vec::with_capacity(pass.admitted.len());
    for mut d in std::mem::take(&mut pass.admitted) {
        let (Outcome::Admitted, Some(p)) = (d.outcome, d.proposal.as_ref()) else {
            kept.push(d);
            continue;
        };
        let add = AddRepairEntry {
            operation: p.operation.clone(),
            machine_type: p.machine_type.clone(),
            address: d.address.clone(),
            serial: p.serial.clone(),
        };
        let by = Requester::remediation(d.rule.as_str());
        let refused = match &deps.queue {
            None => Some("no repair queue is configured ([repair] config)".to_string()),
            Some(q) => match q.request_by(RepairQueueRequest::Add(add), by).await {
                Ok(RepairQueueResponse::Added(e)) => {
                    d.sentence = format!("{} (repair queue entry {})", d.sentence, e.index);
                    added.push((e.index, d.address.clone()));
                    None
                }
                Ok(other) => Some(format!("unexpected answer {other:?}")),
                Err(e) => Some(e.to_string()),
            },
        };
        match refused {
            None => kept.push(d),
            Some(why) => {
                d.outcome = Outcome::Held;
                d.rule = Rule::EnqueueRefused;
                d.sentence = format!(
                    "held: {}: the repair queue refused the entry: {why}",
                    d.address
                );
                pass.held.push(d);
            }
        }
    }
    pass.admitted = kept;
    added
}

fn log(d: &Decision) {
    let (outcome, rule) = (d.outcome.as_str(), d.rule.as_str());
    match d.outcome {
        Outcome::Admitted | Outcome::WouldEnqueue => {
            tracing::info!(machine = %d.address, outcome, rule, "{}", d.sentence)
        }
        Outcome::Held | Outcome::Finding => {
            tracing::warn!(machine = %d.address, outcome, rule, "{}", d.sentence)
        }
    }
}

/// A decision as a journal line of the last pass (not yet numbered).
pub(super) fn line(d: &Decision) -> JournalLine {
    let at = u64::try_from(to_unix_ms(d.at)).unwrap_or(0);
    JournalLine {
        seq: 0,
        first_unix_ms: at,
        last_unix_ms: at,
        count: 1,
        address: d.address.clone(),
        domain: d.domain.clone(),
        outcome: d.outcome.as_str().into(),
        rule: d.rule.as_str().into(),
        operation: journal::operation(d).map(str::to_string),
        sentence: d.sentence.clone(),
    }
}

/// A holding `node-view-stale` says why the view is stale, when the last refresh failed:
/// "never loaded" alone leaves an operator guessing between an address, a CA, credentials
/// and RBAC, while the API server's own answer names the one.
fn explain_stale_view(status: &mut RemediationStatus, failure: Option<String>) {
    let Some(failure) = failure else { return };
    for l in &mut status.limits {
        if l.rule == Rule::NodeViewStale.as_str() && l.holding {
            l.sentence = format!("{}; the last refresh failed: {failure}", l.sentence);
        }
    }
}

/// While the grace of a start (or a takeover) runs and not every agent that reported before
/// it is back: a `remediation status` line counting the agents back. Until the grace ends no
/// machine is judged unreachable by its silence alone (`crate::health`), so a failover or a
/// restart never looks like a mass failure; this line says so, and how far the fleet is.
/// `machines` are (state, last report) of every machine, as the pass's input has them.
fn warming_up(
    started: Timestamp,
    grace: Duration,
    now: Timestamp,
    machines: impl Iterator<Item = (MachineState, Option<Timestamp>)>,
) -> Option<LimitLine> {
    let since = crate::health::elapsed(now, started);
    if since > grace {
        return None;
    }
    // Those expected to report: in service and not already judged down.
    let (mut expected, mut back) = (0, 0);
    for (state, at) in machines {
        if matches!(state, MachineState::Healthy | MachineState::Unhealthy) {
            expected += 1;
            if at.is_some_and(|t| t >= started) {
                back += 1;
            }
        }
    }
    if back == expected {
        return None;
    }
    Some(LimitLine {
        rule: "warming-up".into(),
        holding: true,
        sentence: format!(
            "warming up after a start or a takeover {} s ago: {back} of {} agents back;              silence alone judges no machine unreachable for {} s after it",
            since.as_secs(),
            expected,
            grace.as_secs()
        ),
    })
}

fn status_of(shared: &Shared, pass: &Pass, now: Timestamp) -> RemediationStatus {
    let mut s = super::admin::switch_status(shared);
    s.last_pass_unix_ms = u64::try_from(to_unix_ms(now)).ok();
    s.limits = pass
        .limits
        .iter()
        .map(|l| LimitLine {
            rule: l.rule.as_str().into(),
            holding: l.holding,
            sentence: l.sentence.clone(),
        })
        .collect();
    s.decisions = pass.decisions().take(STATUS_DECISIONS).map(line).collect();
    s.decisions_omitted = pass.decisions().count().saturating_sub(STATUS_DECISIONS) as u64;
    s
}

#[cfg(test)]
mod tests {
    //! The loop over a real SQLite store and registry, without a repair queue (admissions
    //! are then refused, which is itself a decision to journal).

    use std::collections::BTreeMap;

    use protocol::admin::remediation::EventsQuery;
    use protocol::admin::remediation::RemediationRequest as R;
    use protocol::admin::remediation::RemediationResponse;
    use protocol::admin::repair::RepairStatus;
    use protocol::messages::{AgentHello, CheckKind, CheckResult, CheckStatus, HealthReport};

    use super::*;
    use crate::fleet::Fleet;
    use crate::health::HealthConfig;
    use crate::inventory::{MachineRecord, RecordSource};
    use crate::k8s::NotANode;
    use crate::repair::RepairQueue;
    use crate::testing::FakeClock;

    struct Fx {
        _dir: tempfile::TempDir,
        clock: Arc<FakeClock>,
        store: Store,
        rem: Remediation,
        deps: LoopDeps,
        state: LoopState,
        _queue_stop: Option<tokio_util::sync::DropGuard>,
    }

    impl Fx {
        async fn new() -> Self {
            Self::with(RemediationConfig::default(), None).await
        }

        /// The loop's tests admit a failing machine at the first pass.
        fn at_once(mut cfg: RemediationConfig) -> RemediationConfig {
            cfg.auto_repair.unhealthy_for = Duration::ZERO;
            cfg
        }

        /// With `repair`, a real repair queue (on the same store and clock) runs this
        /// `repair:` YAML.
        async fn with(rcfg: RemediationConfig, repair: Option<&str>) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&dir.path().join("c.db")).unwrap();
            let clock = Arc::new(FakeClock::new("2026-01-01T00:00:00Z".parse().unwrap()));
            let cfg = HealthConfig {
                report_interval: Duration::from_secs(1),
                unreachable_grace: Duration::from_secs(3),
                goodbye_grace: Duration::from_secs(60),
            };
            let fleet = Arc::new(
                Fleet::open(store.clone(), clock.clone(), cfg)
                    .await
                    .unwrap(),
            );
            fleet
                .upsert(vec![MachineRecord {
                    address: "10.0.0.1".into(),
                    hostname: "n1".into(),
                    serial: "S1".into(),
                    rack: "r1".into(),
                    role: "cs".into(),
                    machine_type: Some("qemu".into()),
                    labels: BTreeMap::new(),
                    source: RecordSource::Admin,
                }])
                .await
                .unwrap();
            let hello = AgentHello {
                hostname: "n1".into(),
                serial: "S1".into(),
                addresses: vec![],
                agent_version: "0.1".into(),
                boot_id: "b1".into(),
            };
            fleet
                .agent_hello("n1", &hello, "10.0.0.1".parse().unwrap())
                .await
                .unwrap();
            let report = HealthReport {
                seq: 1,
                time_unix_ms: 0,
                boot_id: "b1".into(),
                checks: vec![CheckResult {
                    kind: CheckKind::Kubelet,
                    subject: "kubelet".into(),
                    status: CheckStatus::Fail,
                    detail: "healthz refused".into(),
                }],
                report_interval_ms: 0,
            };
            fleet.report("n1", report).await.unwrap();
            let rem = Remediation::open(store.clone(), clock.clone(), Self::at_once(rcfg), false)
                .await
                .unwrap();
            let state = LoopState::load(&rem.shared).await.unwrap();
            let (queue, queue_stop) = match repair {
                None => (None, None),
                Some(yaml) => {
                    let config = crate::repair::load::load_str(yaml, std::path::Path::new("r.yml"))
                        .unwrap()
                        .config;
                    let deps = crate::repair::RepairDeps::new(
                        store.clone(),
                        Arc::new(config),
                        clock.clone(),
                        Arc::new(NotANode),
                        Arc::new(crate::gateway::NoGateway),
                        Arc::new(crate::repair::NoAgents),
                    );
                    let stop = CancellationToken::new();
                    let (q, _join) = RepairQueue::start(deps, stop.clone()).await.unwrap();
                    (Some(q), Some(stop.drop_guard()))
                }
            };
            let deps = LoopDeps {
                fleet,
                view: None,
                queue,
                events: Arc::new(NotANode),
                kdump: Arc::new(crate::fence::kdump::NoKdump),
                view_changed: None,
            };
            Self {
                _dir: dir,
                clock,
                store,
                rem,
                deps,
                state,
                _queue_stop: queue_stop,
            }
        }

        async fn passes(&mut self, n: usize) {
            for _ in 0..n {
                self.clock.advance(SignedDuration::from_secs(10));
                self.state
                    .pass(&self.rem.shared, &self.deps, None)
                    .await
                    .unwrap();
            }
        }

        async fn lines(&self) -> Vec<JournalLine> {
            self.store.events(EventsQuery::default()).await.unwrap()
        }

        async fn admin(&self, req: R) -> protocol::admin::AdminResponse {
            self.rem.handle_admin(req).await
        }
    }

    /// A hold on a stale view named no reason in `events`; the view's last failure is the
    /// reason (a 403, a refused connection).
    #[test]
    fn the_warm_up_line_counts_agents_back_until_all_are_or_the_grace_ends() {
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| t0.checked_add(SignedDuration::from_secs(s)).unwrap();
        let fleet = [
            (MachineState::Healthy, Some(at(5))),
            (MachineState::Healthy, Some(at(-20))),
            (MachineState::Unhealthy, None),
            (MachineState::Unreachable, Some(at(-100))),
        ];
        let grace = Duration::from_secs(75);
        let line = warming_up(t0, grace, at(10), fleet.iter().copied()).expect("warming up");
        assert_eq!(line.rule, "warming-up");
        assert!(
            line.sentence.contains("10 s ago: 1 of 3 agents back"),
            "{}",
            line.sentence
        );
        assert_eq!(
            warming_up(t0, grace, at(80), fleet.iter().copied()),
            None,
            "the grace is over"
        );
        let back: Vec<_> = fleet.iter().map(|(s, _)| (*s, Some(at(6)))).collect();
        assert_eq!(
            warming_up(t0, grace, at(10), back.into_iter()),
            None,
            "every agent is back"
        );
    }

    #[tokio::test]
    async fn a_hold_on_a_stale_view_says_why_the_view_is_stale() {
        let mut fx = Fx::new().await;
        let view = Arc::new(crate::testing::FakeNodeView::default());
        view.fail(Some(
            "Kubernetes API refused: list nodes: 403 nodes is forbidden",
        ));
        fx.deps.view = Some((view, Duration::from_secs(30)));
        // The agent falls silent: unreachable, which only the view may confirm as dead.
        fx.clock.advance(SignedDuration::from_secs(60));
        fx.deps.fleet.sweep().await.unwrap();
        fx.passes(1).await;
        let lines = fx.lines().await;
        let held = lines
            .iter()
            .find(|l| l.rule == "node-view-stale")
            .unwrap_or_else(|| panic!("no node-view-stale line: {lines:#?}"));
        assert!(
            held.sentence.contains("the last refresh failed")
                && held.sentence.contains("403 nodes is forbidden"),
            "{}",
            held.sentence
        );
    }

    #[tokio::test]
    async fn a_decision_repeated_pass_after_pass_is_one_line_with_a_count() {
        let mut fx = Fx::new().await;
        fx.passes(5).await;
        let lines = fx.lines().await;
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let l = &lines[0];
        assert_eq!(
            (l.outcome.as_str(), l.rule.as_str()),
            ("held", "enqueue-refused")
        );
        assert_eq!(l.count, 5);
        assert_eq!(l.operation.as_deref(), Some("unhealthy"));
        assert_eq!(l.last_unix_ms - l.first_unix_ms, 40_000);
        assert!(l.sentence.contains("no repair queue"), "{}", l.sentence);

        // A reason that would break a line or reach a terminal as escapes is refused.
        for reason in ["multi\nline", "red \u{1b}[31m", &"x".repeat(1001)] {
            let r = fx
                .admin(R::Pause {
                    reason: reason.into(),
                })
                .await;
            assert!(
                matches!(r, protocol::admin::AdminResponse::Error(_)),
                "{r:?}"
            );
        }
        // A pause is another decision: a new line, then repeats of it.
        let r = fx
            .admin(R::Pause {
                reason: "switch upgrade".into(),
            })
            .await;
        assert!(
            matches!(r, protocol::admin::AdminResponse::Remediation(_)),
            "{r:?}"
        );
        fx.passes(3).await;
        let lines = fx.lines().await;
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert_eq!(lines[1].rule, "paused");
        assert_eq!(lines[1].count, 3);
        assert!(lines[1].sentence.contains("switch upgrade"));
        assert!(lines[1].seq > lines[0].seq);
    }

    #[tokio::test]
    async fn a_restarted_loop_continues_the_repeats_of_its_last_pass() {
        let mut fx = Fx::new().await;
        fx.passes(3).await;
        fx.state = LoopState::load(&fx.rem.shared).await.unwrap();
        fx.passes(2).await;
        let lines = fx.lines().await;
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert_eq!(lines[0].count, 5);
        // Long after, the same decision is a new line (a new episode).
        fx.clock.advance(SignedDuration::from_hours(1));
        fx.state = LoopState::load(&fx.rem.shared).await.unwrap();
        fx.passes(1).await;
        assert_eq!(fx.lines().await.len(), 2);
    }

    #[tokio::test]
    async fn switches_survive_a_restart_and_status_names_the_holding_limit() {
        let mut fx = Fx::new().await;
        fx.admin(R::Pause {
            reason: "maintenance".into(),
        })
        .await;
        fx.admin(R::Observe(true)).await;
        fx.admin(R::SetConstraint {
            name: "maximum-repair-queue-entries".into(),
            value: 4,
        })
        .await;
        fx.passes(1).await;
        let protocol::admin::AdminResponse::Remediation(RemediationResponse::Status(s)) =
            fx.admin(R::Status).await
        else {
            panic!("no status");
        };
        assert!(s.observe);
        assert_eq!(s.paused.as_ref().unwrap().0, "maintenance");
        assert!(
            s.limits.iter().any(|l| l.rule == "paused" && l.holding),
            "{:#?}",
            s.limits
        );
        // A new coordinator on the same store sees the same switches.
        let again = Remediation::open(
            fx.store.clone(),
            fx.clock.clone(),
            RemediationConfig::default(),
            false,
        )
        .await
        .unwrap();
        let s = again.shared.switches().clone();
        assert_eq!(s.paused.unwrap().0, "maintenance");
        assert_eq!(s.observe, Some(true));
        assert_eq!(s.max_entries, Some(4));
        let r = fx
            .admin(R::SetConstraint {
                name: "maximum-repair-queue-entries".into(),
                value: 0,
            })
            .await;
        assert!(
            matches!(r, protocol::admin::AdminResponse::Error(_)),
            "{r:?}"
        );
        let r = fx
            .admin(R::SetConstraint {
                name: "wait-seconds-to-repair-rebooting".into(),
                value: 99_999_999,
            })
            .await;
        let protocol::admin::AdminResponse::Error(e) = r else {
            panic!("a wait of three years was taken: {r:?}");
        };
        assert!(e.reason.contains("more than a week"), "{e:?}");
    }

    #[tokio::test]
    async fn the_journal_keeps_only_its_newest_rows() {
        let mut fx = Fx::new().await;
        fx.passes(1).await;
        fx.admin(R::Pause { reason: "a".into() }).await;
        fx.passes(1).await;
        fx.admin(R::Resume).await;
        fx.passes(1).await;
        assert_eq!(fx.lines().await.len(), 3);
        let now = to_unix_ms(fx.clock.now());
        let gone = fx.store.prune_journal(now - 3_600_000, 2).await.unwrap();
        assert_eq!(gone, 1);
        let lines = fx.lines().await;
        assert_eq!(lines[0].rule, "paused");
        let gone = fx.store.prune_journal(now + 1, 10).await.unwrap();
        assert_eq!(gone, 2);
    }

    const REPAIR: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["qemu"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["true"]
              watch_seconds: 30
          health_check_command: ["sh", "-c", "echo true"]
"#;

    impl Fx {
        async fn queue(&self) -> Vec<RepairEntry> {
            LoopState::queue(&self.deps).await.unwrap()
        }

        /// Waits (real time: the engine runs `true` as a process) until every entry of the
        /// queue has finished.
        async fn until_finished(&self) -> Vec<RepairEntry> {
            for _ in 0..500 {
                let q = self.queue().await;
                if q.iter().all(|e| e.status.is_finished()) {
                    return q;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("entries did not finish: {:#?}", self.queue().await);
        }

        async fn pass_after(&mut self, secs: i64) {
            self.clock.advance(SignedDuration::from_secs(secs));
            self.state
                .pass(&self.rem.shared, &self.deps, None)
                .await
                .unwrap();
        }
    }

    fn deleting_after(after: Option<Duration>, observe: bool) -> RemediationConfig {
        RemediationConfig {
            delete_succeeded_after: after,
            observe,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_succeeded_entry_of_the_loop_is_deleted_after_the_setting_and_the_machine_repaired_again()
     {
        let mut fx = Fx::with(
            deleting_after(Some(Duration::from_secs(60)), false),
            Some(REPAIR),
        )
        .await;
        // An entry added by hand for a machine of its own: a person's to delete, always.
        let by_hand = match fx
            .deps
            .queue
            .as_ref()
            .unwrap()
            .request(RepairQueueRequest::Add(AddRepairEntry {
                operation: "unhealthy".into(),
                machine_type: "qemu".into(),
                address: "10.0.0.9".into(),
                serial: String::new(),
            }))
            .await
            .unwrap()
        {
            RepairQueueResponse::Added(e) => e.index,
            r => panic!("{r:?}"),
        };
        // Finished first: in flight, it would use up this one-machine fleet's cap.
        fx.until_finished().await;
        fx.pass_after(10).await;
        let lines = fx.lines().await;
        assert_eq!(lines.last().unwrap().outcome, "admitted", "{lines:#?}");
        let q = fx.until_finished().await;
        assert_eq!(q.len(), 2, "{q:#?}");
        assert!(
            q.iter().all(|e| e.status == RepairStatus::Succeeded),
            "{q:#?}"
        );
        let own = q.iter().find(|e| e.index != by_hand).unwrap().index;
        // n1 still reports its kubelet failing: held by its entry until the setting passes.
        fx.pass_after(30).await;
        let held = fx.lines().await;
        let last = held.last().unwrap();
        assert_eq!(last.rule, "queue-has-entry", "{held:#?}");
        assert!(last.sentence.contains("succeeded"), "{}", last.sentence);
        assert_eq!(fx.queue().await.len(), 2);
        fx.pass_after(40).await;
        let lines = fx.lines().await;
        let deleted = lines
            .iter()
            .find(|l| l.rule == "succeeded-entry-deleted")
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert_eq!(deleted.outcome, "finding");
        assert_eq!(deleted.address, "10.0.0.1");
        assert!(
            deleted.sentence.contains(&format!(
                "repair queue entry {own} (operation unhealthy) succeeded"
            )),
            "{}",
            deleted.sentence
        );
        assert!(
            deleted.sentence.contains("delete_succeeded_after 1m"),
            "{}",
            deleted.sentence
        );
        // In the same pass the machine, failing still, is admitted again: a second entry.
        let admitted: Vec<_> = lines.iter().filter(|l| l.outcome == "admitted").collect();
        assert_eq!(admitted.len(), 2, "{lines:#?}");
        let q = fx.queue().await;
        assert!(q.iter().any(|e| e.index == by_hand && !e.deleted), "{q:#?}");
        assert!(q.iter().all(|e| e.index != own || e.deleted), "{q:#?}");
        // Its successor is the loop's own, remembered across a restart of the loop.
        let q = fx.until_finished().await;
        let second = q
            .iter()
            .find(|e| e.index != by_hand && e.index != own)
            .unwrap()
            .index;
        fx.state = LoopState::load(&fx.rem.shared).await.unwrap();
        assert!(fx.state.own.contains(&second), "{:?}", fx.state.own);
        fx.pass_after(61).await;
        assert!(!fx.state.own.contains(&own), "{:?}", fx.state.own);
        let q = fx.queue().await;
        assert!(q.iter().all(|e| e.index != second || e.deleted), "{q:#?}");
        assert!(q.iter().any(|e| e.index == by_hand && !e.deleted), "{q:#?}");
    }

    #[tokio::test]
    async fn never_and_observe_mode_keep_succeeded_entries() {
        for (after, observe) in [(None, false), (Some(Duration::from_secs(60)), true)] {
            let mut fx = Fx::with(deleting_after(after, false), Some(REPAIR)).await;
            fx.pass_after(10).await;
            let q = fx.until_finished().await;
            assert_eq!(q.len(), 1, "{q:#?}");
            if observe {
                fx.admin(R::Observe(true)).await;
            }
            fx.pass_after(3600).await;
            fx.pass_after(10).await;
            let q = fx.queue().await;
            assert!(!q[0].deleted, "{after:?} {observe}: {q:#?}");
            let lines = fx.lines().await;
            assert!(
                lines.iter().all(|l| l.rule != "succeeded-entry-deleted"),
                "{lines:#?}"
            );
        }
    }

    #[tokio::test]
    async fn a_switch_is_answered_with_the_limits_of_a_pass_that_saw_it() {
        let fx = Fx::new().await;
        let Fx { rem, deps, .. } = &fx;
        let rem = rem.clone();
        let deps = LoopDeps {
            fleet: deps.fleet.clone(),
            view: None,
            queue: None,
            events: Arc::new(NotANode),
            kdump: Arc::new(crate::fence::kdump::NoKdump),
            view_changed: None,
        };
        let stop = CancellationToken::new();
        let join = rem.spawn(deps, stop.clone());
        let mut passed = rem.shared.passed.subscribe();
        passed.wait_for(|p| p.is_some()).await.unwrap();
        let status = |r| match r {
            protocol::admin::AdminResponse::Remediation(RemediationResponse::Status(s)) => s,
            other => panic!("{other:?}"),
        };
        let paused = |s: &RemediationStatus| {
            s.limits
                .iter()
                .find(|l| l.rule == "paused")
                .map(|l| l.holding)
        };
        let s = status(
            fx.admin(R::Pause {
                reason: "rack work".into(),
            })
            .await,
        );
        assert_eq!(s.paused.as_ref().unwrap().0, "rack work");
        assert_eq!(paused(&s), Some(true), "{:#?}", s.limits);
        let s = status(fx.admin(R::Resume).await);
        assert!(s.paused.is_none());
        assert_eq!(paused(&s), Some(false), "{:#?}", s.limits);
        // Once the loop has stopped, a switch is answered at once.
        stop.cancel();
        join.await.unwrap();
        let t = std::time::Instant::now();
        let s = status(fx.admin(R::Pause { reason: "x".into() }).await);
        assert!(t.elapsed() < PASS_WAIT_LIMIT, "{:?}", t.elapsed());
        assert!(s.paused.is_some());
    }

    /// Issue 33 (Karpenter 2833's trap): a machine failing all along, but on another check
    /// of the same kind and with another message at every report, is unhealthy under a
    /// health check naming the kind for as long as it fails. The repair is admitted once the
    /// condition's timeout has passed since the first failure, not never. Without the
    /// kind's own timer each report restarted the condition (held at every pass).
    #[tokio::test]
    async fn a_failing_reason_that_changes_every_report_does_not_restart_the_timer() {
        let mut rcfg = RemediationConfig::from_toml(
            r#"
[auto_repair]
enabled = false
[[health_checks]]
name = "gpus"
unhealthy_conditions = [{ type = "nic", status = "False", timeout = "60s" }]
max_unhealthy = 1
"#,
        )
        .unwrap();
        rcfg.interval = Duration::from_secs(10);
        let mut fx = Fx::with(rcfg, Some(REPAIR)).await;
        let first = fx.clock.now();
        let report = |seq: u64| HealthReport {
            seq,
            time_unix_ms: 0,
            boot_id: "b1".into(),
            checks: vec![
                CheckResult {
                    kind: CheckKind::Nic,
                    subject: if seq.is_multiple_of(2) {
                        "eth0"
                    } else {
                        "eth1"
                    }
                    .into(),
                    status: CheckStatus::Fail,
                    detail: format!("no carrier (report {seq})"),
                },
                CheckResult {
                    kind: CheckKind::Nic,
                    subject: if seq.is_multiple_of(2) {
                        "eth1"
                    } else {
                        "eth0"
                    }
                    .into(),
                    status: CheckStatus::Ok,
                    detail: "up".into(),
                },
            ],
            report_interval_ms: 10_000,
        };
        let mut admitted_after = None;
        for seq in 2..=12u64 {
            fx.clock.advance(SignedDuration::from_secs(10));
            fx.deps.fleet.report("n1", report(seq)).await.unwrap();
            fx.state.pass(&fx.rem.shared, &fx.deps, None).await.unwrap();
            if !fx.queue().await.is_empty() {
                admitted_after = Some(fx.clock.now().duration_since(first).as_secs());
                break;
            }
        }
        // The NICs fail from the second report on, 10 s after the first: the condition
        // holds from there and fires 60 s after it, at the pass of the eighth report.
        assert_eq!(admitted_after, Some(70));
        let lines = fx.lines().await;
        assert!(
            lines
                .iter()
                .any(|l| l.sentence.contains("nic is failing for 1m (timeout 1m)")),
            "{lines:#?}"
        );
    }

    /// Below the admin's wait for a pass: the answer did not wait for a loop that is gone.
    const PASS_WAIT_LIMIT: Duration = Duration::from_secs(1);
}
