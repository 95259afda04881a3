//! The repair queue engine: one task that owns the queue, runs the pure decisions and
//! commits their transitions before anything is acted on.
//!
//! Order of work, always: decide ([`super::decide`], [`super::admin`]) → commit every
//! transition of the pass to SQLite in one transaction → only then act
//! ([`super::effects`]: spawn a command, start a drain, uncordon). A coordinator killed at
//! any moment therefore finds in SQLite at least every transition whose effect began, and
//! resumes each entry where it stood ([`super::entry::Phase`]).
//!
//! Commands, health checks, drains and node lookups run as their own tasks and report back
//! through a channel ([`super::tasks`]), so a hung command never stalls another entry or the
//! admin API.
//!
//! The engine does not parse configuration, choose a drainer or a gateway, or listen on any
//! socket: the app wires those in ([`RepairDeps`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use protocol::admin::AdminResponse;
use protocol::admin::repair::{RepairEntryDetail, RepairQueueRequest, RepairQueueResponse};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::admin::{self, Reply, Requester};
use super::command::AgentHealthView;
use super::config::RepairConfig;
use super::decide::{self, Action, Observations, Observed, TaskObs};
use super::effects::Effects;
use super::entry::Entry;
use super::metrics::RepairMetrics;
use super::store::diagnostics::DiagnosticsStore;
use super::store::{RepairQueueStore, Write};
use super::tasks::{Event, Tasks};
use crate::clock::Clock;
use crate::gateway::PowerControl;
use crate::k8s::Drainer;
use crate::store::repeated::RepeatedFailure;
use crate::store::{IdentityStore, Store, StoreError};

pub use super::admin::RepairQueueError;
pub use super::effects::{DRAIN_POLL_INTERVAL, K8S_RETRY_INTERVAL};

/// How often the engine re-decides without news. Entries only change on task reports and
/// admin requests (which wake it at once) or on time passing (watch, backoff, retry, drain
/// timeouts, which are second-granular); a quarter second keeps those punctual at no cost.
pub const TICK: Duration = Duration::from_millis(250);

/// Admin requests handled per commit. Group commit: one fsync for a burst of `add`s instead
/// of one each, which is what makes enqueueing thousands of entries fast.
const ADMIN_BATCH: usize = 512;

/// Passes per wake-up at most. A pass whose transitions enable further ones (start → look
/// up the node → drain) runs again at once; the bound keeps a bug from spinning the loop.
const MAX_PASSES: usize = 8;

/// How often the engine looks for nodes cordoned by Fleetmend that no active entry drains
/// (an uncordon that gave up while the API server was down, or one a crash cut off). Longer
/// than an entry's own uncordon retries (5 × 5 s), so the sweep does not race them; short
/// enough that a node's capacity comes back within a minute of the API server.
const LEFTOVER_CORDON_SWEEP: Duration = Duration::from_secs(30);

/// The first such sweep after a start, once the node view has had time to load: a cordon a
/// crash left between an entry's end and its uncordon is lifted within seconds of the
/// restart, not half a minute.
const LEFTOVER_CORDON_FIRST: Duration = Duration::from_secs(5);

/// Everything the engine needs from the rest of the coordinator.
pub struct RepairDeps {
    /// The store (migrated).
    pub store: Store,
    /// The `repair:` configuration.
    pub config: Arc<RepairConfig>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// Kubernetes drains ([`crate::k8s::NotANode`] without a cluster).
    pub drainer: Arc<dyn Drainer>,
    /// Power actions ([`crate::gateway::NoGateway`] without gateways).
    pub power: Arc<dyn PowerControl>,
    /// Agent health, for `@agent-healthy`.
    pub agents: Arc<dyn AgentHealthView>,
    /// Agent actions, for `@restart-unit`, `@reboot`, `@collect-diagnostics`
    /// ([`crate::agent_link::NoAgentLinks`] unless set).
    pub actions: Arc<dyn crate::agent_link::AgentActions>,
    /// `rand(n)` in `0..n`, for the drain backoff; injectable for tests.
    pub rand: Box<dyn FnMut(u64) -> u64 + Send + Sync>,
    /// Fence flows for `@fence` and for drains of dead nodes, and which nodes are dead;
    /// `None` = `@fence` only powers off and confirms, and every drain drains.
    pub fence: Option<(
        Arc<super::fencing::FenceService>,
        Arc<dyn super::fencing::NodeLiveness>,
    )>,
    /// `[fence] keep_off` per machine, for an `@fence` with nothing to release (a machine
    /// that is not a node, or no cluster): powered on after its confirmed off unless this
    /// says to keep it off. `None` = keep every such machine off.
    pub keep_off: Option<super::fencing::KeepOffOf>,
    /// `[fence]` `off_timeout` and `on_timeout` per machine, for an `@fence` with nothing
    /// to release: its off and its on each get the smaller of this and what is left of the
    /// step's limit. `None` = the step's limit alone.
    pub fence_timeouts: Option<super::fencing::FenceTimeoutsOf>,
    /// What the machines' kdump initramfs said, for an `@fence` with nothing to release: a
    /// dumping machine is not powered off until its dump is done or its kdump timeout
    /// passes. `None` = no dump is ever known.
    pub kdump: Option<Arc<dyn crate::fence::kdump::KdumpView>>,
}

impl RepairDeps {
    /// Deps with the system's randomness.
    pub fn new(
        store: Store,
        config: Arc<RepairConfig>,
        clock: Arc<dyn Clock>,
        drainer: Arc<dyn Drainer>,
        power: Arc<dyn PowerControl>,
        agents: Arc<dyn AgentHealthView>,
    ) -> Self {
        Self {
            store,
            config,
            clock,
            drainer,
            power,
            agents,
            actions: Arc::new(crate::agent_link::NoAgentLinks),
            rand: Box::new(|n| if n == 0 { 0 } else { rand::random_range(0..n) }),
            fence: None,
            keep_off: None,
            fence_timeouts: None,
            kdump: None,
        }
    }
}

type ReplyTx = oneshot::Sender<Result<RepairQueueResponse, RepairQueueError>>;

/// Handle to the running engine. Cheap to clone.
#[derive(Clone)]
pub struct RepairQueue {
    tx: mpsc::Sender<(RepairQueueRequest, Requester, ReplyTx)>,
    metrics: Arc<RepairMetrics>,
    config: Arc<RepairConfig>,
}

impl std::fmt::Debug for RepairQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairQueue").finish_non_exhaustive()
    }
}

impl RepairQueue {
    /// The repair procedures it runs (loaded once, at start).
    pub fn config(&self) -> &RepairConfig {
        &self.config
    }

    /// Loads the queue from the store and starts the engine; it stops when `shutdown` is
    /// cancelled or the last handle is dropped (running commands are killed; they run
    /// again after a restart).
    pub async fn start(
        deps: RepairDeps,
        shutdown: CancellationToken,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), StoreError> {
        let (enabled, entries) = deps.store.load().await?;
        super::orphans::reap_previous(&deps.store, deps.clock.as_ref(), &entries).await?;
        let store_id = deps.store.identity().await?;
        let (tx, rx) = mpsc::channel(4096);
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(RepairMetrics::default());
        let config = deps.config.clone();
        let effects = Effects::new(
            deps.drainer.clone(),
            deps.power.clone(),
            deps.agents.clone(),
            deps.actions.clone(),
            deps.config.drain_options(),
            deps.store.clone(),
            deps.clock.clone(),
            store_id,
            deps.fence
                .as_ref()
                .map(|(service, liveness)| super::effects::Fencing {
                    service: service.clone(),
                    liveness: liveness.clone(),
                }),
            deps.keep_off.clone(),
            deps.fence_timeouts.clone(),
            deps.kdump.clone(),
        );
        let engine = Engine {
            deps,
            enabled,
            entries: entries.into_iter().map(|e| (e.index, e)).collect(),
            tasks: Tasks::new(ev_tx),
            effects,
            metrics: metrics.clone(),
            commit_failing: RepeatedFailure::new(Duration::from_secs(60)),
        };
        let resumed = engine.entries.values().filter(|e| e.is_active()).count();
        tracing::info!(
            entries = engine.entries.len(),
            active = resumed,
            enabled,
            "repair queue loaded"
        );
        engine.update_metrics();
        let handle = tokio::spawn(engine.run(rx, ev_rx, shutdown));
        Ok((
            Self {
                tx,
                metrics,
                config,
            },
            handle,
        ))
    }

    /// Carries out one request of the coordinator's own (entries' history names "the
    /// coordinator" as its requester).
    pub async fn request(
        &self,
        req: RepairQueueRequest,
    ) -> Result<RepairQueueResponse, RepairQueueError> {
        self.request_by(req, Requester::coordinator()).await
    }

    /// Carries out one request of `by`.
    pub async fn request_by(
        &self,
        req: RepairQueueRequest,
        by: Requester,
    ) -> Result<RepairQueueResponse, RepairQueueError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((req, by, reply))
            .await
            .map_err(|_| RepairQueueError::Stopped)?;
        rx.await.map_err(|_| RepairQueueError::Stopped)?
    }

    /// Carries out one admin request of `by` and wraps the answer for the admin API.
    pub async fn handle_admin(&self, req: RepairQueueRequest, by: Requester) -> AdminResponse {
        match self.request_by(req, by).await {
            Ok(r) => AdminResponse::RepairQueue(r),
            Err(e) => AdminResponse::Error(e.to_refusal()),
        }
    }

    /// Prometheus text lines for `/metrics`.
    pub fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    /// The metrics, to register with the `/metrics` server. Holding them does not keep
    /// the engine running.
    pub fn metrics(&self) -> Arc<RepairMetrics> {
        self.metrics.clone()
    }
}

struct Engine {
    deps: RepairDeps,
    enabled: bool,
    entries: BTreeMap<u64, Entry>,
    tasks: Tasks,
    effects: Effects,
    metrics: Arc<RepairMetrics>,
    /// Commits that keep failing (a full disk), logged when it starts, when its error
    /// changes and once a minute, not at every tick.
    commit_failing: RepeatedFailure,
}

/// The span an entry's work runs in.
fn entry_span(e: &Entry) -> tracing::Span {
    tracing::info_span!("repair_entry", index = e.index, address = %e.address)
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<(RepairQueueRequest, Requester, ReplyTx)>,
        mut ev_rx: mpsc::UnboundedReceiver<Event>,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let first = tokio::time::Instant::now() + LEFTOVER_CORDON_FIRST;
        let mut sweep = tokio::time::interval_at(first, LEFTOVER_CORDON_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = sweep.tick() => self.sweep_cordons(),
                msg = rx.recv() => {
                    let Some(first) = msg else { break };
                    let mut batch = vec![first];
                    while batch.len() < ADMIN_BATCH {
                        match rx.try_recv() {
                            Ok(m) => batch.push(m),
                            Err(_) => break,
                        }
                    }
                    self.admin_batch(batch).await;
                }
                ev = ev_rx.recv() => {
                    if let Some(ev) = ev {
                        self.event(ev);
                        while let Ok(ev) = ev_rx.try_recv() {
                            self.event(ev);
                        }
                    }
                }
                _ = tick.tick() => {}
            }
            self.step().await;
        }
        self.tasks.abort_all();
        tracing::info!("repair queue stopped");
    }

    /// Uncordons Fleetmend's cordons that no active entry owns (see
    /// [`Effects::uncordon_leftovers`]); decided from the engine's own entries, so an entry
    /// added meanwhile is seen.
    fn sweep_cordons(&self) {
        let mut busy = std::collections::HashSet::new();
        for e in self.entries.values().filter(|e| e.is_active() || e.deleted) {
            if !e.nodename.is_empty() {
                busy.insert(e.nodename.clone());
            }
            busy.extend(self.effects.known_node(&e.address));
        }
        self.effects.uncordon_leftovers(&busy);
    }

    fn event(&mut self, ev: Event) {
        if let Some((kind, outcome)) = self.tasks.record(ev, self.deps.clock.now()) {
            self.metrics.command_ended(kind, outcome);
        }
    }

    fn update_metrics(&self) {
        self.metrics
            .set_counts(&admin::counts(self.entries.values(), self.enabled));
    }

    async fn commit(&self, writes: Vec<Write>) -> Result<Vec<u64>, StoreError> {
        let now = self.deps.clock.now();
        self.deps.store.commit(writes, now).await
    }

    async fn admin_batch(&mut self, batch: Vec<(RepairQueueRequest, Requester, ReplyTx)>) {
        let (requests, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|(q, by, tx)| ((q, by), tx)).unzip();
        let plan = admin::plan(
            &self.entries,
            self.enabled,
            &self.deps.config,
            requests,
            self.deps.clock.now(),
        );
        let committed = if plan.writes.is_empty() {
            Ok(Vec::new())
        } else {
            self.commit(plan.writes).await
        };
        let ids = match committed {
            Ok(ids) => ids,
            Err(e) => {
                tracing::error!(error = %e, "repair queue: cannot commit admin requests");
                for (r, tx) in plan.replies.into_iter().zip(replies) {
                    let _ = tx.send(r.uncommitted(&e));
                }
                return;
            }
        };
        self.entries.extend(plan.staged);
        self.enabled = plan.enabled;
        for (r, tx) in plan.replies.into_iter().zip(replies) {
            let r = match r {
                Reply::Now(r) => r,
                Reply::Added(i) => {
                    let mut e = plan.inserts[i].clone();
                    e.index = ids[i];
                    let wire = e.to_wire();
                    self.entries.insert(e.index, e);
                    Ok(RepairQueueResponse::Added(wire))
                }
                Reply::Show(index) => {
                    let entry = self.entries[&index].to_wire();
                    let store = &self.deps.store;
                    let read = async {
                        Ok::<_, StoreError>((
                            store.history(index).await?,
                            store.bundles_for_entry(index).await?,
                        ))
                    };
                    match read.await {
                        Ok((history, diagnostics)) => {
                            Ok(RepairQueueResponse::Show(Box::new(RepairEntryDetail {
                                entry,
                                history,
                                diagnostics,
                            })))
                        }
                        Err(e) => Err(RepairQueueError::Store(e)),
                    }
                }
            };
            let _ = tx.send(r);
        }
    }

    /// Decide and act until a pass makes no transition.
    async fn step(&mut self) {
        let config = self.deps.config.clone();
        for _ in 0..MAX_PASSES {
            let now = self.deps.clock.now();
            let empty = Observations::default();
            // A command whose power action's outcome is unknown is retried only on the
            // agent's evidence: its observations get the agent's last report.
            let with_agent: HashMap<u64, Observations> = self
                .entries
                .values()
                .filter_map(|e| {
                    let obs = self.tasks.obs(e.index)?;
                    let TaskObs::Finished(end) = &obs.command else {
                        return None;
                    };
                    end.unknown_since?;
                    let mut obs = obs.clone();
                    obs.agent =
                        self.deps
                            .agents
                            .agent_health(&e.address)
                            .map(|h| decide::AgentSeen {
                                boot_id: h.boot_id,
                                last_report: h.last_report,
                            });
                    Some((e.index, obs))
                })
                .collect();
            let actions = {
                let observed: Vec<Observed<'_>> = self
                    .entries
                    .values()
                    .filter(|e| e.is_active() || e.deleted)
                    .map(|e| Observed {
                        entry: e,
                        obs: with_agent
                            .get(&e.index)
                            .or_else(|| self.tasks.obs(e.index))
                            .unwrap_or(&empty),
                    })
                    .collect();
                decide::decide(&observed, &config, self.enabled, now)
            };
            let mut writes = Vec::new();
            // Health-check results first: they are what the transitions below react to.
            for (index, ev) in self.tasks.take_history() {
                if let Some(e) = self.entries.get(&index) {
                    writes.push(Write::History(e.clone(), ev));
                }
            }
            let mut effects = Vec::new();
            let mut logged = Vec::new();
            for (index, action) in actions {
                if matches!(action, Action::Hold(_)) {
                    continue;
                }
                let e = &self.entries[&index];
                let op = config.operation_for(&e.machine_type, &e.operation).ok();
                if !action.is_transition() {
                    effects.push((index, op, action, None));
                    continue;
                }
                let agents = &self.deps.agents;
                let boot_id = || agents.boot_id(&e.address);
                let Some((mut new, ev)) =
                    decide::transition(e, op, &action, now, &boot_id, &mut self.deps.rand)
                else {
                    continue;
                };
                // As CKE fills `nodename` for machines that are nodes: from the node view,
                // without an API call, so a started entry names its Node even when no step
                // drains (a drain looks the node up itself and writes what it found).
                if matches!(action, Action::Start) && new.nodename.is_empty() {
                    new.nodename = self.deps.drainer.known_node(&e.address).unwrap_or_default();
                }
                // Logged once committed: a transition that cannot be stored is decided again
                // next tick, and would be logged at every one.
                logged.push((entry_span(e), ev.event, ev.detail.clone()));
                if matches!(action, Action::Dequeue) {
                    writes.push(Write::Delete(index));
                } else {
                    writes.push(Write::Update(new.clone(), Some(ev)));
                }
                effects.push((index, op, action, Some(new)));
            }
            let transitions = effects.iter().any(|(.., n)| n.is_some());
            if !writes.is_empty() {
                if let Err(e) = self.commit(writes).await {
                    // Nothing was acted on: the same decisions are made again next tick.
                    let e = e.to_string();
                    if let Some(n) = self.commit_failing.failed(&e, tokio::time::Instant::now()) {
                        tracing::error!(error = %e, failed_commits = n, "repair queue: cannot commit transitions; holding, and retrying every tick");
                    }
                    return;
                }
                if let Some(n) = self.commit_failing.succeeded() {
                    tracing::info!(failed_commits = n, "repair queue: commits work again");
                }
            }
            for (span, event, detail) in logged {
                span.in_scope(|| tracing::info!(event, detail = %detail, "repair queue"));
            }
            for (index, op, action, new) in effects {
                if let Some(n) = new {
                    let was = self.entries.get(&index).map(|o| o.status);
                    if n.status.is_finished() && was != Some(n.status) {
                        self.metrics.entry_finished(n.status);
                    }
                    self.entries.insert(index, n);
                }
                let Some(e) = self.entries.get(&index).cloned() else {
                    continue;
                };
                if matches!(action, Action::Dequeue) {
                    self.entries.remove(&index);
                }
                entry_span(&e).in_scope(|| self.effects.act(&mut self.tasks, &e, op, action));
            }
            self.update_metrics();
            if !transitions {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use jiff::{SignedDuration, Timestamp};
    use protocol::admin::repair::{AddRepairEntry, RepairEntry, RepairStatus, RepairStepStatus};

    use super::*;
    use crate::clock::SystemClock;
    use crate::gateway::NoGateway;
    use crate::k8s::{NodeEvent, NotANode};
    use crate::repair::load::load_str;
    use crate::repair::{AgentHealth, NoAgents};
    use crate::testing::{FakeAgents, FakeClock, FakeDrainer, FakePower};

    fn config(yaml: &str) -> Arc<RepairConfig> {
        Arc::new(load_str(yaml, Path::new("test.yml")).unwrap().config)
    }

    struct Harness {
        q: RepairQueue,
        shutdown: CancellationToken,
        join: tokio::task::JoinHandle<()>,
    }

    async fn start(
        store: &Store,
        cfg: Arc<RepairConfig>,
        clock: Arc<dyn Clock>,
        drainer: Arc<dyn Drainer>,
    ) -> Harness {
        let deps = RepairDeps::new(
            store.clone(),
            cfg,
            clock,
            drainer,
            Arc::new(NoGateway),
            Arc::new(NoAgents),
        );
        start_deps(deps).await
    }

    async fn start_deps(mut deps: RepairDeps) -> Harness {
        deps.rand = Box::new(|_| 5);
        let shutdown = CancellationToken::new();
        let (q, join) = RepairQueue::start(deps, shutdown.clone()).await.unwrap();
        Harness { q, shutdown, join }
    }

    impl Harness {
        async fn stop(self) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(10), self.join)
                .await
                .unwrap()
                .unwrap();
        }

        async fn add(&self, op: &str, t: &str, addr: &str) -> u64 {
            match self
                .q
                .request(RepairQueueRequest::Add(AddRepairEntry {
                    operation: op.into(),
                    machine_type: t.into(),
                    address: addr.into(),
                    serial: String::new(),
                }))
                .await
                .unwrap()
            {
                RepairQueueResponse::Added(e) => e.index,
                r => panic!("{r:?}"),
            }
        }

        async fn list(&self) -> Vec<RepairEntry> {
            match self.q.request(RepairQueueRequest::List).await.unwrap() {
                RepairQueueResponse::List(l) => l,
                r => panic!("{r:?}"),
            }
        }

        async fn entry(&self, index: u64) -> Option<RepairEntry> {
            self.list().await.into_iter().find(|e| e.index == index)
        }

        async fn history(&self, index: u64) -> Vec<String> {
            match self
                .q
                .request(RepairQueueRequest::Show { index })
                .await
                .unwrap()
            {
                RepairQueueResponse::Show(d) => d
                    .history
                    .iter()
                    .map(|h| format!("{} {} | {}", h.event, h.detail, h.output))
                    .collect(),
                r => panic!("{r:?}"),
            }
        }

        /// Polls until `f` holds for entry `index`, or panics after 20 s.
        async fn wait(
            &self,
            index: u64,
            what: &str,
            f: impl Fn(&RepairEntry) -> bool,
        ) -> RepairEntry {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(e) = self.entry(index).await
                    && f(&e)
                {
                    return e;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "timed out waiting for entry {index}: {what}; now {:?}; history {:?}",
                    self.entry(index).await,
                    self.history(index).await
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("c.db")).unwrap();
        (dir, s)
    }

    fn yaml(steps: &str, health: &str, extra_op: &str, top: &str) -> String {
        format!(
            "repair:\n  max_concurrent_repairs: 4\n{top}  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: op\n      repair_steps:\n{steps}      health_check_command: {health}\n{extra_op}"
        )
    }

    #[tokio::test]
    async fn entry_succeeds_and_history_keeps_command_output() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: [sh, -c, 'echo fixing $1', fix]\n",
            "[sh, -c, 'echo true']",
            "      success_command: [sh, -c, 'echo notified $1', notify]\n",
            "",
        ));
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        let hist = h.history(i).await;
        assert!(
            hist.iter()
                .any(|l| l.starts_with("command-succeeded") && l.contains("fixing 10.0.0.1")),
            "{hist:?}"
        );
        assert!(
            hist.iter()
                .any(|l| l.starts_with("succeeded") && l.contains("notified 10.0.0.1")),
            "{hist:?}"
        );
        assert!(
            h.q.metrics_text()
                .contains("fleetmend_repair_queue_items{status=\"succeeded\"} 1")
        );
        assert!(
            h.q.metrics_text()
                .contains("fleetmend_repair_commands_total{kind=\"repair\",result=\"ok\"} 1")
        );
        h.stop().await;
    }

    #[tokio::test]
    async fn a_repair_without_a_drain_is_recorded_on_its_node() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: [sh, -c, 'test \"$1\" = 10.0.0.1', fix]\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let drainer = Arc::new(FakeDrainer::default());
        let h = start(&s, cfg, Arc::new(SystemClock), drainer.clone()).await;
        let ok = h.add("op", "t", "10.0.0.1").await;
        let bad = h.add("op", "t", "10.0.0.2").await;
        h.wait(ok, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        h.wait(bad, "failed", |e| e.status == RepairStatus::Failed)
            .await;
        let text = h.q.metrics_text();
        for st in ["succeeded", "failed"] {
            let line = format!("fleetmend_repair_entries_finished_total{{status=\"{st}\"}} 1\n");
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while drainer.events().len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                drainer.events()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut got: Vec<(String, NodeEvent)> = drainer
            .events()
            .into_iter()
            .map(|(n, e, _)| (n, e))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            [
                ("n-10.0.0.1".to_string(), NodeEvent::Repaired),
                ("n-10.0.0.2".to_string(), NodeEvent::Failed)
            ]
        );
        assert!(drainer.drains().is_empty());
        // Started entries name their Node from the view, as CKE's do, drain or not.
        assert_eq!(h.entry(ok).await.unwrap().nodename, "n-10.0.0.1");
        assert_eq!(h.entry(bad).await.unwrap().nodename, "n-10.0.0.2");
        assert!(drainer.lookups().is_empty(), "{:?}", drainer.lookups());
        h.stop().await;
    }

    #[tokio::test]
    async fn an_entry_started_before_the_node_view_filled_looks_its_node_up_at_the_end() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let drainer = Arc::new(FakeDrainer::without_view());
        let h = start(&s, cfg, Arc::new(SystemClock), drainer.clone()).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let e = h
            .wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        assert_eq!(e.nodename, "", "nothing known when it started");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while drainer.events().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "no Event");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (node, event, _) = drainer.events().remove(0);
        assert_eq!((node.as_str(), event), ("n-10.0.0.1", NodeEvent::Repaired));
        assert_eq!(drainer.lookups(), ["10.0.0.1"]);
        h.stop().await;
    }

    #[tokio::test]
    async fn add_refuses_unknown_procedure_and_bad_address() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        for (op, t, addr, want) in [
            ("op", "x", "10.0.0.1", "machine type `x`"),
            ("nope", "t", "10.0.0.1", "no operation `nope`"),
            ("op", "t", "node-1", "not an IP address"),
        ] {
            let r =
                h.q.request(RepairQueueRequest::Add(AddRepairEntry {
                    operation: op.into(),
                    machine_type: t.into(),
                    address: addr.into(),
                    serial: String::new(),
                }))
                .await;
            match r {
                Err(RepairQueueError::BadRequest(m)) => assert!(m.contains(want), "{m}"),
                r => panic!("{r:?}"),
            }
        }
        h.stop().await;
    }

    #[tokio::test]
    async fn a_hung_health_check_does_not_hold_up_another_entry() {
        let (_d, s) = store();
        let cfg = config(
            "repair:\n  max_concurrent_repairs: 4\n  repair_procedures:\n  - machine_types: [slow]\n    repair_operations:\n    - operation: op\n      repair_steps:\n      - repair_command: ['true']\n      health_check_command: [sh, -c, 'sleep 60']\n      command_timeout_seconds: 3\n  - machine_types: [fast]\n    repair_operations:\n    - operation: op\n      repair_steps:\n      - repair_command: ['true']\n      health_check_command: [sh, -c, 'echo true']\n",
        );
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let slow = h.add("op", "slow", "10.0.0.1").await;
        let fast = h.add("op", "fast", "10.0.0.2").await;
        h.wait(fast, "fast succeeded", |e| {
            e.status == RepairStatus::Succeeded
        })
        .await;
        assert_eq!(
            h.entry(slow).await.unwrap().status,
            RepairStatus::Processing,
            "slow still hung"
        );
        let e = h
            .wait(slow, "slow failed at its timeout", |e| {
                e.status == RepairStatus::Failed
            })
            .await;
        assert_eq!(e.step, 0);
        let hist = h.history(slow).await;
        assert!(
            hist.iter().any(|l| l.contains("timed out after 3")),
            "{hist:?}"
        );
        assert!(
            h.q.metrics_text()
                .contains("fleetmend_repair_commands_total{kind=\"health\",result=\"timeout\"} 1")
        );
        h.stop().await;
    }

    #[tokio::test]
    async fn restart_resumes_without_rerunning_a_completed_command() {
        let (d, s) = store();
        let dir = d.path().display().to_string();
        let cfg = config(&yaml(
            &format!(
                "      - repair_command: [sh, -c, 'echo x >> {dir}/step0']\n        watch_seconds: 2\n      - repair_command: [sh, -c, 'echo x >> {dir}/step1; touch {dir}/healthy']\n"
            ),
            &format!("[sh, -c, 'test -f {dir}/healthy && echo true || echo false']"),
            "",
            "",
        ));
        let h = start(&s, cfg.clone(), Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        h.wait(i, "watching step 0", |e| {
            e.step_status == RepairStepStatus::Watching
        })
        .await;
        // Wait for the command to complete, then stop the engine mid-watch.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !h
            .history(i)
            .await
            .iter()
            .any(|l| l.starts_with("command-succeeded"))
        {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        h.stop().await;
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        h.wait(i, "succeeded after restart", |e| {
            e.status == RepairStatus::Succeeded && e.step == 1
        })
        .await;
        assert_eq!(
            std::fs::read_to_string(d.path().join("step0")).unwrap(),
            "x\n",
            "step 0 ran once"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("step1")).unwrap(),
            "x\n",
            "step 1 ran once"
        );
        h.stop().await;
    }

    #[tokio::test]
    async fn deleting_a_running_entry_kills_its_command() {
        let (d, s) = store();
        let pidfile = d.path().join("pid");
        let cfg = config(&yaml(
            &format!(
                "      - repair_command: [sh, -c, 'echo $$ > {}; exec sleep 60']\n        command_timeout_seconds: 0\n",
                pidfile.display()
            ),
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Ok(p) = std::fs::read_to_string(&pidfile)
                && !p.trim().is_empty()
            {
                break p.trim().to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "command never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(matches!(
            h.q.request(RepairQueueRequest::Delete { index: i })
                .await
                .unwrap(),
            RepairQueueResponse::Deleted { count: 1 }
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while h.entry(i).await.is_some() {
            assert!(tokio::time::Instant::now() < deadline, "entry not dequeued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "command {pid} still running"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The index is never reused.
        assert_eq!(h.add("op", "t", "10.0.0.1").await, i + 1);
        h.stop().await;
    }

    #[tokio::test]
    async fn drain_timeout_backs_off_linearly_then_drains_again() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n        need_drain: true\n",
            "[sh, -c, 'echo true']",
            "",
            "  eviction_timeout_seconds: 60\n",
        ));
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let clock = Arc::new(FakeClock::new(t0));
        let drainer = Arc::new(FakeDrainer::default());
        let h = start(&s, cfg, clock.clone(), drainer.clone()).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let e = h
            .wait(i, "draining", |e| {
                e.step_status == RepairStepStatus::Draining
            })
            .await;
        assert_eq!(e.nodename, "n-10.0.0.1");
        clock.advance(SignedDuration::from_secs(61));
        let e = h
            .wait(i, "drain abandoned", |e| e.drain_backoff_count == 1)
            .await;
        assert_eq!(e.step_status, RepairStepStatus::Waiting);
        // 300 s base + injected rand (5).
        let expire = t0 + SignedDuration::from_secs(61 + 305);
        assert_eq!(
            e.drain_backoff_expire_unix_ms,
            expire.as_millisecond() as u64
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while drainer.uncordons().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "not uncordoned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Still backing off a second before expiry.
        clock.advance(SignedDuration::from_secs(304));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            h.entry(i).await.unwrap().step_status,
            RepairStepStatus::Waiting
        );
        drainer.finish_drains();
        clock.advance(SignedDuration::from_secs(1));
        h.wait(i, "succeeded after the second drain", |e| {
            e.status == RepairStatus::Succeeded
        })
        .await;
        h.stop().await;
    }

    #[tokio::test]
    async fn disable_abandons_a_drain_and_starts_nothing_and_reset_backoff_clears_it() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n        need_drain: true\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let clock = Arc::new(FakeClock::new(
            Timestamp::from_second(1_800_000_000).unwrap(),
        ));
        let drainer = Arc::new(FakeDrainer::default());
        let h = start(&s, cfg, clock.clone(), drainer.clone()).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        h.wait(i, "draining", |e| {
            e.step_status == RepairStepStatus::Draining
        })
        .await;
        assert!(matches!(
            h.q.request(RepairQueueRequest::Disable).await.unwrap(),
            RepairQueueResponse::Enabled(false)
        ));
        let e = h
            .wait(i, "drain abandoned", |e| e.drain_backoff_count == 1)
            .await;
        assert_eq!(e.status, RepairStatus::Processing);
        let j = h.add("op", "t", "10.0.0.2").await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            h.entry(j).await.unwrap().status,
            RepairStatus::Queued,
            "nothing new starts"
        );
        assert!(
            h.q.metrics_text()
                .contains("fleetmend_repair_queue_enabled 0")
        );
        assert!(matches!(
            h.q.request(RepairQueueRequest::ResetBackoff).await.unwrap(),
            RepairQueueResponse::BackoffReset { count: 1 }
        ));
        assert_eq!(h.entry(i).await.unwrap().drain_backoff_count, 0);
        drainer.finish_drains();
        assert!(matches!(
            h.q.request(RepairQueueRequest::Enable).await.unwrap(),
            RepairQueueResponse::Enabled(true)
        ));
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        h.wait(j, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        // The flag is durable.
        h.q.request(RepairQueueRequest::Disable).await.unwrap();
        h.stop().await;
        let h = start(
            &s,
            config(&yaml(
                "      - repair_command: ['true']\n",
                "[sh, -c, 'echo true']",
                "",
                "",
            )),
            clock,
            Arc::new(NotANode),
        )
        .await;
        assert!(matches!(
            h.q.request(RepairQueueRequest::IsEnabled).await.unwrap(),
            RepairQueueResponse::Enabled(false)
        ));
        assert!(matches!(
            h.q.request(RepairQueueRequest::DeleteFinished)
                .await
                .unwrap(),
            RepairQueueResponse::Deleted { count: 2 }
        ));
        h.stop().await;
    }

    #[tokio::test]
    async fn a_failed_attempt_is_retried_after_the_interval() {
        let (d, s) = store();
        let f = d.path().join("attempts");
        let cfg = config(&yaml(
            &format!(
                "      - repair_command: [sh, -c, 'n=$(cat {f} 2>/dev/null || echo 0); echo $((n+1)) > {f}; test $n -ge 1', retry]\n        command_retries: 2\n        command_interval: 1\n",
                f = f.display()
            ),
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        assert_eq!(
            std::fs::read_to_string(&f).unwrap().trim(),
            "2",
            "two attempts"
        );
        let hist = h.history(i).await;
        let events: Vec<&str> = hist.iter().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(
            events,
            [
                "added",
                "started",
                "command-started",
                "command-failed",
                "command-started",
                "command-succeeded",
                "health-check-passed",
                "succeeded"
            ],
            "{hist:?}"
        );
        h.stop().await;
    }

    /// Power built-ins through a fake gateway; `@agent-healthy` through fake agents whose
    /// boot id changes when the gateway power-cycles the machine (if it `reboots`).
    async fn power_case(
        reboots: bool,
    ) -> (Harness, u64, Arc<FakePower>, tempfile::TempDir, String) {
        let (d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['@power-cycle']\n        watch_seconds: 2\n",
            "['@agent-healthy']",
            "",
            "",
        ));
        let before = Timestamp::now() - SignedDuration::from_secs(60);
        let agents = Arc::new(FakeAgents::with(Some(AgentHealth {
            boot_id: "b1".into(),
            last_report: Timestamp::now() + SignedDuration::from_secs(3600),
            ok_since: Some(before),
        })));
        let power = Arc::new(FakePower::default());
        if reboots {
            let agents = agents.clone();
            power.on_request(move |_| {
                let at = Timestamp::now() + SignedDuration::from_millis(5);
                agents.set(Some(AgentHealth {
                    boot_id: "b2".into(),
                    last_report: at,
                    ok_since: Some(at),
                }));
            });
        }
        let deps = RepairDeps::new(
            s.clone(),
            cfg,
            Arc::new(SystemClock),
            Arc::new(NotANode),
            power.clone(),
            agents,
        );
        let h = start_deps(deps).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let sid = s.identity().await.unwrap();
        (h, i, power, d, sid)
    }

    #[tokio::test]
    async fn power_cycle_then_agent_healthy_needs_a_new_boot() {
        let (h, i, power, _d, sid) = power_case(true).await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        let reqs = power.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].id, format!("{sid}-repair-{i}-step0-attempt0"));
        assert_eq!(reqs[0].action, protocol::gateway::PowerAction::Cycle);
        assert_eq!(reqs[0].address, "10.0.0.1");
        h.stop().await;

        // Same boot id after the power cycle: never healthy, the entry fails when the
        // watch of its last step expires.
        let (h, i, _power, _d, _sid) = power_case(false).await;
        h.wait(i, "failed", |e| e.status == RepairStatus::Failed)
            .await;
        let hist = h.history(i).await;
        assert!(
            hist.iter().any(|l| l.contains("boot id b1 unchanged")),
            "{hist:?}"
        );
        h.stop().await;
    }

    /// CKE's RepairSucceededUncordon, RepairFailedUncordon and RepairDeletedUncordon: the
    /// node a drain cordoned is uncordoned when its entry ends, however it ends.
    #[tokio::test]
    async fn repair_succeeded_failed_and_deleted_uncordon() {
        let (d, s) = store();
        // The hanging command ignores the address appended to it, so it really hangs
        // until its entry is deleted.
        let started = d.path().join("hang-started");
        let cfg = config(&format!(
            "repair:\n  max_concurrent_repairs: 4\n  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: ok\n      repair_steps:\n      - repair_command: ['true']\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n    - operation: fail\n      repair_steps:\n      - repair_command: ['false']\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n    - operation: hang\n      repair_steps:\n      - repair_command: [sh, -c, 'touch {started}; exec sleep 60', hang]\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n",
            started = started.display()
        ));
        let drainer = Arc::new(FakeDrainer::default());
        drainer.finish_drains();
        let h = start(&s, cfg, Arc::new(SystemClock), drainer.clone()).await;
        let ok = h.add("ok", "t", "10.0.0.1").await;
        let fail = h.add("fail", "t", "10.0.0.2").await;
        let hang = h.add("hang", "t", "10.0.0.3").await;
        h.wait(ok, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        h.wait(fail, "failed", |e| e.status == RepairStatus::Failed)
            .await;
        h.wait(hang, "running", |e| {
            e.step_status == RepairStepStatus::Watching
        })
        .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !started.exists() {
            assert!(tokio::time::Instant::now() < deadline, "hang never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its command runs: the entry is still processing and its node still cordoned, so
        // the uncordon below can only come from the delete.
        assert_eq!(
            h.entry(hang).await.unwrap().status,
            RepairStatus::Processing
        );
        assert!(
            !drainer.uncordons().contains(&"n-10.0.0.3".to_string()),
            "{:?}",
            drainer.uncordons()
        );
        h.q.request(RepairQueueRequest::Delete { index: hang })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut u = drainer.uncordons();
            u.sort();
            if u == ["n-10.0.0.1", "n-10.0.0.2", "n-10.0.0.3"] {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "uncordoned only {u:?}"
            );
            drop(u);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        h.stop().await;
    }

    #[tokio::test]
    async fn need_drain_on_a_machine_that_is_not_a_node_runs_without_draining() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n        need_drain: true\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let e = h
            .wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        assert_eq!(e.nodename, "");
        assert!(!h.history(i).await.iter().any(|l| l.starts_with("drain")));
        h.stop().await;
    }

    /// Makes every commit that records a history line of `event` fail, as a full disk or a
    /// failing device would: the whole pass's transaction rolls back.
    async fn break_writes_of(s: &Store, event: &str) {
        let sql = format!(
            "CREATE TRIGGER break_writes BEFORE INSERT ON repair_queue_history \
             WHEN NEW.event = '{event}' BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;"
        );
        s.call(move |c| c.execute_batch(&sql)).await.unwrap();
    }

    async fn mend_writes(s: &Store) {
        s.call(|c| c.execute_batch("DROP TRIGGER break_writes;"))
            .await
            .unwrap();
    }

    /// Invariant 6: a command runs only after its `command-started` transition is committed.
    #[tokio::test]
    async fn a_command_does_not_run_before_its_start_is_committed() {
        let (d, s) = store();
        let counter = d.path().join("runs");
        let cfg = config(&yaml(
            &format!(
                "      - repair_command: [sh, -c, 'echo x >> {}', cmd]\n",
                counter.display()
            ),
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        break_writes_of(&s, "command-started").await;
        let h = start(&s, cfg, Arc::new(SystemClock), Arc::new(NotANode)).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        // The pass that started the entry went on to decide `Execute`, whose commit failed;
        // later ticks try again and fail again.
        h.wait(i, "started", |e| e.status == RepairStatus::Processing)
            .await;
        tokio::time::sleep(TICK * 6).await;
        assert!(
            std::fs::read_to_string(&counter)
                .unwrap_or_default()
                .is_empty(),
            "the command ran before its start was committed"
        );
        let e = h.entry(i).await.unwrap();
        assert_eq!(e.step_status, RepairStepStatus::Waiting, "not committed");
        mend_writes(&s).await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        assert_eq!(
            std::fs::read_to_string(&counter).unwrap(),
            "x\n",
            "ran exactly once"
        );
        h.stop().await;
    }

    /// Invariant 6: a drain starts only after its `drain-started` transition is committed.
    #[tokio::test]
    async fn a_drain_does_not_start_before_it_is_committed() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n        need_drain: true\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let drainer = Arc::new(FakeDrainer::default());
        drainer.finish_drains();
        break_writes_of(&s, "drain-started").await;
        let h = start(&s, cfg, Arc::new(SystemClock), drainer.clone()).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while drainer.lookups().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "node never looked up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // From the next pass on, every pass decides `StartDrain` and fails to commit it.
        tokio::time::sleep(TICK * 6).await;
        assert!(
            drainer.drains().is_empty(),
            "drained before the drain was committed: {:?}",
            drainer.drains()
        );
        let e = h.entry(i).await.unwrap();
        assert_eq!(e.step_status, RepairStepStatus::Waiting, "not committed");
        mend_writes(&s).await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        assert_eq!(drainer.drains(), ["n-10.0.0.1"], "one drain, one pass");
        h.stop().await;
    }

    /// Invariant 6: a node is uncordoned only after the transition ending its entry is
    /// committed.
    #[tokio::test]
    async fn an_uncordon_does_not_happen_before_the_end_is_committed() {
        let (_d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['true']\n        need_drain: true\n",
            "[sh, -c, 'echo true']",
            "",
            "",
        ));
        let drainer = Arc::new(FakeDrainer::default());
        drainer.finish_drains();
        break_writes_of(&s, "succeeded").await;
        let h = start(&s, cfg, Arc::new(SystemClock), drainer.clone()).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        // Once a health check passed, every pass decides the entry healthy and fails to
        // commit its success.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !h
            .q
            .metrics_text()
            .contains("fleetmend_repair_commands_total{kind=\"health\",result=\"ok\"} 1")
        {
            assert!(tokio::time::Instant::now() < deadline, "never checked");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(TICK * 6).await;
        assert!(
            drainer.uncordons().is_empty(),
            "uncordoned before the end was committed: {:?}",
            drainer.uncordons()
        );
        assert_eq!(h.entry(i).await.unwrap().status, RepairStatus::Processing);
        mend_writes(&s).await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while drainer.uncordons().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "never uncordoned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(drainer.uncordons(), ["n-10.0.0.1"], "uncordoned once");
        h.stop().await;
    }
}
