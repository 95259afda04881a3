//! The repair queue engine: one task that owns the queue, answers admin requests, runs the
//! pure decision ([`super::decide`]) and carries out its actions.
//!
//! Order of work, always: decide → commit every transition of the pass to SQLite in one
//! transaction → only then act (spawn a command, start a drain, uncordon). A coordinator
//! killed at any moment therefore finds in SQLite at least every transition whose effect
//! began, and resumes each entry where it stood ([`super::entry::Phase`]).
//!
//! Commands, health checks, drains and node lookups run as their own tasks and report back
//! through a channel, so a hung command never stalls another entry or the admin API. Each
//! task carries a generation number; a report from a task that was cancelled (entry deleted,
//! step moved on) is ignored.
//!
//! The engine does not parse configuration, choose a drainer or a gateway, or listen on any
//! socket: the app wires those in ([`RepairDeps`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::admin::AdminResponse;
use protocol::admin::repair::{
    AddRepairEntry, RepairEntryDetail, RepairQueueCounts, RepairQueueRequest, RepairQueueResponse,
    RepairStatus,
};
use protocol::messages::{Refusal, RefusalCode};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::command::{self, AgentHealthView, CommandKind, Outcome, RunContext};
use super::config::{CommandSpec, RepairConfig};
use super::decide::{self, Action, CommandEnd, DrainEnd, NodeObs, Observations, Observed, TaskObs};
use super::entry::{Entry, HistoryEvent, RequestFor, power_request_id};
use super::store::{self as rstore, Write};
use crate::clock::Clock;
use crate::gateway::PowerControl;
use crate::k8s::{DrainProgress, Drainer};
use crate::store::{Store, StoreError};

/// How often the engine re-decides without news. Entries only change on task reports and
/// admin requests (which wake it at once) or on time passing (watch, backoff, retry, drain
/// timeouts, which are second-granular); a quarter second keeps those punctual at no cost.
pub const TICK: Duration = Duration::from_millis(250);

/// Pause between drain passes while pods terminate. Evictions take seconds; polling faster
/// only loads the API server.
pub const DRAIN_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Wait before retrying a failed node lookup or uncordon (API server down).
pub const K8S_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// Admin requests handled per commit. Group commit: one fsync for a burst of `add`s instead
/// of one each, which is what makes enqueueing thousands of entries fast.
const ADMIN_BATCH: usize = 512;

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
    /// `rand(n)` in `0..n`, for the drain backoff; injectable for tests.
    pub rand: Box<dyn FnMut(u64) -> u64 + Send + Sync>,
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
            rand: Box::new(|n| if n == 0 { 0 } else { rand::random_range(0..n) }),
        }
    }
}

/// Why a repair queue request failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairQueueError {
    /// The request is invalid; the message says why.
    #[error("{0}")]
    BadRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The engine has stopped (coordinator shutting down).
    #[error("the repair queue is not running (coordinator shutting down?)")]
    Stopped,
}

impl RepairQueueError {
    /// True when the same request may succeed later.
    pub fn is_retriable(&self) -> bool {
        match self {
            RepairQueueError::BadRequest(_) => false,
            RepairQueueError::Store(e) => e.is_retriable(),
            RepairQueueError::Stopped => true,
        }
    }

    /// As an admin API refusal.
    pub fn to_refusal(&self) -> Refusal {
        let code = match self {
            RepairQueueError::BadRequest(_) => RefusalCode::BadRequest,
            RepairQueueError::Stopped => RefusalCode::ShuttingDown,
            RepairQueueError::Store(_) => RefusalCode::Internal,
        };
        Refusal::new(code, self.to_string())
    }
}

type Reply = oneshot::Sender<Result<RepairQueueResponse, RepairQueueError>>;

/// Handle to the running engine. Cheap to clone.
#[derive(Clone)]
pub struct RepairQueue {
    tx: mpsc::Sender<(RepairQueueRequest, Reply)>,
    metrics: Arc<RepairMetrics>,
}

impl std::fmt::Debug for RepairQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairQueue").finish_non_exhaustive()
    }
}

impl RepairQueue {
    /// Loads the queue from the store and starts the engine; it stops when `shutdown` is
    /// cancelled (running commands are killed; they run again after a restart).
    pub async fn start(
        deps: RepairDeps,
        shutdown: CancellationToken,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), StoreError> {
        let (enabled, entries) = deps.store.call(|c| rstore::load(c)).await?;
        let store_id = deps.store.call(|c| crate::store::identity::read(c)).await?;
        let (tx, rx) = mpsc::channel(4096);
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(RepairMetrics::default());
        let engine = Engine {
            deps,
            store_id,
            enabled,
            entries: entries.into_iter().map(|e| (e.index, e)).collect(),
            rt: HashMap::new(),
            ev_tx,
            pending_history: Vec::new(),
            next_gen: 1,
            metrics: metrics.clone(),
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
        Ok((Self { tx, metrics }, handle))
    }

    /// Carries out one request.
    pub async fn request(
        &self,
        req: RepairQueueRequest,
    ) -> Result<RepairQueueResponse, RepairQueueError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((req, reply))
            .await
            .map_err(|_| RepairQueueError::Stopped)?;
        rx.await.map_err(|_| RepairQueueError::Stopped)?
    }

    /// Carries out one admin request and wraps the answer for the admin API.
    pub async fn handle_admin(&self, req: RepairQueueRequest) -> AdminResponse {
        match self.request(req).await {
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

/// Counters and gauges of the queue.
#[derive(Debug, Default)]
pub struct RepairMetrics(Mutex<MetricsState>);

#[derive(Debug, Default)]
struct MetricsState {
    by_status: [u64; 4],
    deleting: u64,
    enabled: bool,
    commands: BTreeMap<(CommandKind, Outcome), u64>,
}

impl RepairMetrics {
    fn with<T>(&self, f: impl FnOnce(&mut MetricsState) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Prometheus text exposition lines (with HELP and TYPE).
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        self.with(|m| {
            let mut s = String::new();
            s.push_str("# HELP fleetmend_repair_queue_items Repair queue entries by status.\n");
            s.push_str("# TYPE fleetmend_repair_queue_items gauge\n");
            for (i, st) in RepairStatus::ALL.iter().enumerate() {
                let _ = writeln!(s, "fleetmend_repair_queue_items{{status=\"{}\"}} {}", st.as_str(), m.by_status[i]);
            }
            s.push_str("# HELP fleetmend_repair_queue_deleting Entries marked for deletion, not yet dequeued.\n");
            s.push_str("# TYPE fleetmend_repair_queue_deleting gauge\n");
            let _ = writeln!(s, "fleetmend_repair_queue_deleting {}", m.deleting);
            s.push_str("# HELP fleetmend_repair_queue_enabled 1 when the repair queue is enabled.\n");
            s.push_str("# TYPE fleetmend_repair_queue_enabled gauge\n");
            let _ = writeln!(s, "fleetmend_repair_queue_enabled {}", u8::from(m.enabled));
            s.push_str("# HELP fleetmend_repair_entries_in_progress Entries being repaired (status processing).\n");
            s.push_str("# TYPE fleetmend_repair_entries_in_progress gauge\n");
            let _ = writeln!(s, "fleetmend_repair_entries_in_progress {}", m.by_status[1]);
            s.push_str("# HELP fleetmend_repair_commands_total Repair, health-check and success commands run, by result.\n");
            s.push_str("# TYPE fleetmend_repair_commands_total counter\n");
            for kind in [CommandKind::Repair, CommandKind::Health, CommandKind::Success] {
                for out in [Outcome::Ok, Outcome::Failed, Outcome::Timeout, Outcome::Error] {
                    let n = m.commands.get(&(kind, out)).copied().unwrap_or(0);
                    let _ = writeln!(
                        s,
                        "fleetmend_repair_commands_total{{kind=\"{}\",result=\"{}\"}} {n}",
                        kind.as_str(),
                        out.as_str()
                    );
                }
            }
            s
        })
    }
}

/// A task's report.
enum Event {
    Node {
        index: u64,
        generation: u64,
        node: Result<Option<String>, String>,
    },
    Drain {
        index: u64,
        generation: u64,
        end: DrainEnd,
    },
    Command {
        index: u64,
        generation: u64,
        kind: CommandKind,
        end: CommandEnd,
        outcome: Outcome,
    },
}

#[derive(Default)]
struct Runtime {
    obs: Observations,
    node_gen: u64,
    drain_gen: u64,
    command_gen: u64,
    health_gen: u64,
    drain_task: Option<AbortHandle>,
    command_task: Option<AbortHandle>,
    health_task: Option<AbortHandle>,
    /// The last health check's (passed, summary), to record only changes in the history.
    last_health: Option<(bool, String)>,
}

impl Runtime {
    fn abort_all(&mut self) {
        for t in [
            self.drain_task.take(),
            self.command_task.take(),
            self.health_task.take(),
        ]
        .into_iter()
        .flatten()
        {
            t.abort();
        }
    }
}

struct Engine {
    deps: RepairDeps,
    /// This database's identity, the prefix of every power request id.
    store_id: String,
    enabled: bool,
    entries: BTreeMap<u64, Entry>,
    rt: HashMap<u64, Runtime>,
    ev_tx: mpsc::UnboundedSender<Event>,
    pending_history: Vec<(u64, HistoryEvent)>,
    next_gen: u64,
    metrics: Arc<RepairMetrics>,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<(RepairQueueRequest, Reply)>,
        mut ev_rx: mpsc::UnboundedReceiver<Event>,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
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
        for rt in self.rt.values_mut() {
            rt.abort_all();
        }
        tracing::info!("repair queue stopped");
    }

    fn next_generation(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    fn event(&mut self, ev: Event) {
        let now = self.deps.clock.now();
        match ev {
            Event::Node {
                index,
                generation,
                node,
            } => {
                let Some(rt) = self.rt.get_mut(&index) else {
                    return;
                };
                if rt.node_gen != generation {
                    return;
                }
                rt.obs.node = match node {
                    Ok(Some(n)) => NodeObs::Node(n),
                    Ok(None) => NodeObs::NotANode,
                    Err(e) => {
                        tracing::warn!(index, error = %e, "repair: node lookup failed; will retry");
                        NodeObs::Unknown
                    }
                };
            }
            Event::Drain {
                index,
                generation,
                end,
            } => {
                let Some(rt) = self.rt.get_mut(&index) else {
                    return;
                };
                if rt.drain_gen == generation {
                    rt.obs.drain = TaskObs::Finished(end);
                    rt.drain_task = None;
                }
            }
            Event::Command {
                index,
                generation,
                kind,
                end,
                outcome,
            } => {
                self.metrics
                    .with(|m| *m.commands.entry((kind, outcome)).or_default() += 1);
                let Some(rt) = self.rt.get_mut(&index) else {
                    return;
                };
                match kind {
                    CommandKind::Health => {
                        if rt.health_gen != generation {
                            return;
                        }
                        rt.health_task = None;
                        rt.obs.health.running = false;
                        rt.obs.health.completed += 1;
                        rt.obs.health.last = Some((now, end.ok));
                        let key = (end.ok, end.summary.clone());
                        if rt.last_health.as_ref() != Some(&key) {
                            rt.last_health = Some(key);
                            let event = if end.ok {
                                "health-check-passed"
                            } else {
                                "health-check-failed"
                            };
                            self.pending_history.push((
                                index,
                                HistoryEvent::new(event, end.summary).with_output(end.output),
                            ));
                        }
                    }
                    CommandKind::Repair | CommandKind::Success => {
                        if rt.command_gen == generation {
                            rt.command_task = None;
                            rt.obs.command = TaskObs::Finished(end);
                        }
                    }
                }
            }
        }
    }

    fn counts(&self) -> RepairQueueCounts {
        let mut c = RepairQueueCounts {
            enabled: self.enabled,
            ..Default::default()
        };
        for e in self.entries.values() {
            if e.deleted {
                c.deleting += 1;
            }
            match e.status {
                RepairStatus::Queued => c.queued += 1,
                RepairStatus::Processing => c.processing += 1,
                RepairStatus::Succeeded => c.succeeded += 1,
                RepairStatus::Failed => c.failed += 1,
            }
        }
        c
    }

    fn update_metrics(&self) {
        let c = self.counts();
        self.metrics.with(|m| {
            m.by_status = [c.queued, c.processing, c.succeeded, c.failed];
            m.deleting = c.deleting;
            m.enabled = c.enabled;
        });
    }

    async fn commit(&self, writes: Vec<Write>) -> Result<Vec<u64>, StoreError> {
        let now = self.deps.clock.now();
        self.deps
            .store
            .call(move |c| rstore::commit(c, &writes, now))
            .await
    }

    async fn admin_batch(&mut self, batch: Vec<(RepairQueueRequest, Reply)>) {
        let now = self.deps.clock.now();
        let mut writes = Vec::new();
        // Entries changed by earlier requests of this batch, not yet committed.
        let mut staged: BTreeMap<u64, Entry> = BTreeMap::new();
        let mut enabled = self.enabled;
        enum Pending {
            Now(Result<RepairQueueResponse, RepairQueueError>),
            Added(usize),
            Show(u64),
        }
        let mut pending = Vec::with_capacity(batch.len());
        let mut inserts = Vec::new();
        for (req, reply) in batch {
            let p = match req {
                RepairQueueRequest::Add(add) => match self.validate_add(&add) {
                    Err(e) => Pending::Now(Err(e)),
                    Ok(()) => {
                        let e = Entry::new_queued(
                            &add.address,
                            &add.serial,
                            &add.machine_type,
                            &add.operation,
                            now,
                        );
                        writes.push(Write::Insert(
                            e.clone(),
                            HistoryEvent::new(
                                "added",
                                format!("{} {} {}", add.operation, add.machine_type, add.address),
                            ),
                        ));
                        inserts.push(e);
                        Pending::Added(inserts.len() - 1)
                    }
                },
                RepairQueueRequest::List => {
                    let list = self
                        .entries
                        .values()
                        .map(|e| staged.get(&e.index).unwrap_or(e).to_wire())
                        .collect();
                    Pending::Now(Ok(RepairQueueResponse::List(list)))
                }
                RepairQueueRequest::Show { index } => {
                    if self.entries.contains_key(&index) {
                        Pending::Show(index)
                    } else {
                        Pending::Now(Err(RepairQueueError::BadRequest(format!(
                            "no repair queue entry {index}"
                        ))))
                    }
                }
                RepairQueueRequest::Delete { index } => match self.entries.get(&index) {
                    None => Pending::Now(Err(RepairQueueError::BadRequest(format!(
                        "no repair queue entry {index}"
                    )))),
                    Some(e) => {
                        let mut e = staged.get(&index).unwrap_or(e).clone();
                        let count = u64::from(!e.deleted);
                        if !e.deleted {
                            e.deleted = true;
                            writes.push(Write::Update(
                                e.clone(),
                                Some(HistoryEvent::new("delete-requested", "repair-queue delete")),
                            ));
                            staged.insert(index, e);
                        }
                        Pending::Now(Ok(RepairQueueResponse::Deleted { count }))
                    }
                },
                RepairQueueRequest::DeleteFinished | RepairQueueRequest::DeleteUnfinished => {
                    let finished = matches!(req, RepairQueueRequest::DeleteFinished);
                    let mut count = 0;
                    for e in self.entries.values() {
                        let e = staged.get(&e.index).unwrap_or(e);
                        if !e.deleted && e.status.is_finished() == finished {
                            let mut e = e.clone();
                            e.deleted = true;
                            let why = if finished {
                                "repair-queue delete-finished"
                            } else {
                                "repair-queue delete-unfinished"
                            };
                            writes.push(Write::Update(
                                e.clone(),
                                Some(HistoryEvent::new("delete-requested", why)),
                            ));
                            staged.insert(e.index, e);
                            count += 1;
                        }
                    }
                    Pending::Now(Ok(RepairQueueResponse::Deleted { count }))
                }
                RepairQueueRequest::Enable | RepairQueueRequest::Disable => {
                    enabled = matches!(req, RepairQueueRequest::Enable);
                    writes.push(Write::SetEnabled(enabled));
                    Pending::Now(Ok(RepairQueueResponse::Enabled(enabled)))
                }
                RepairQueueRequest::IsEnabled => {
                    Pending::Now(Ok(RepairQueueResponse::Enabled(enabled)))
                }
                RepairQueueRequest::ResetBackoff => {
                    let mut count = 0;
                    for e in self.entries.values() {
                        let e = staged.get(&e.index).unwrap_or(e);
                        if e.drain_backoff_count != 0 || e.drain_backoff_expire.is_some() {
                            let mut e = e.clone();
                            e.drain_backoff_count = 0;
                            e.drain_backoff_expire = None;
                            writes.push(Write::Update(
                                e.clone(),
                                Some(HistoryEvent::new(
                                    "backoff-reset",
                                    "repair-queue reset-backoff",
                                )),
                            ));
                            staged.insert(e.index, e);
                            count += 1;
                        }
                    }
                    Pending::Now(Ok(RepairQueueResponse::BackoffReset { count }))
                }
                RepairQueueRequest::Counts => {
                    let mut c = self.counts();
                    c.enabled = enabled;
                    Pending::Now(Ok(RepairQueueResponse::Counts(c)))
                }
            };
            pending.push((p, reply));
        }
        let committed = if writes.is_empty() {
            Ok(Vec::new())
        } else {
            self.commit(writes).await
        };
        let ids = match committed {
            Ok(ids) => {
                for (index, e) in staged {
                    self.entries.insert(index, e);
                }
                self.enabled = enabled;
                ids
            }
            Err(e) => {
                tracing::error!(error = %e, "repair queue: cannot commit admin requests");
                for (p, reply) in pending {
                    let r = match p {
                        Pending::Now(Ok(RepairQueueResponse::List(l))) => {
                            Ok(RepairQueueResponse::List(l))
                        }
                        Pending::Now(Err(err)) => Err(err),
                        _ => Err(RepairQueueError::Store(StoreError::Task(e.to_string()))),
                    };
                    let _ = reply.send(r);
                }
                return;
            }
        };
        for (p, reply) in pending {
            let r = match p {
                Pending::Now(r) => r,
                Pending::Added(i) => {
                    let mut e = inserts[i].clone();
                    e.index = ids[i];
                    let wire = e.to_wire();
                    self.entries.insert(e.index, e);
                    Ok(RepairQueueResponse::Added(wire))
                }
                Pending::Show(index) => {
                    let entry = self.entries[&index].to_wire();
                    match self
                        .deps
                        .store
                        .call(move |c| rstore::history(c, index))
                        .await
                    {
                        Ok(history) => Ok(RepairQueueResponse::Show(Box::new(RepairEntryDetail {
                            entry,
                            history,
                        }))),
                        Err(e) => Err(RepairQueueError::Store(e)),
                    }
                }
            };
            let _ = reply.send(r);
        }
    }

    fn validate_add(&self, add: &AddRepairEntry) -> Result<(), RepairQueueError> {
        if add.address.parse::<IpAddr>().is_err() {
            return Err(RepairQueueError::BadRequest(format!(
                "`{}` is not an IP address; the repair queue is keyed by machine address",
                add.address
            )));
        }
        self.deps
            .config
            .operation_for(&add.machine_type, &add.operation)
            .map_err(|no| {
                RepairQueueError::BadRequest(format!("{no}; check the repair configuration"))
            })?;
        Ok(())
    }

    /// Decide and act until a pass makes no transition.
    async fn step(&mut self) {
        for _ in 0..8 {
            let now = self.deps.clock.now();
            let empty = Observations::default();
            let actions = {
                let observed: Vec<Observed<'_>> = self
                    .entries
                    .values()
                    .filter(|e| e.is_active() || e.deleted)
                    .map(|e| Observed {
                        entry: e,
                        obs: self.rt.get(&e.index).map(|r| &r.obs).unwrap_or(&empty),
                    })
                    .collect();
                decide::decide(&observed, &self.deps.config, self.enabled, now)
            };
            let mut writes = Vec::new();
            // Health-check results first: they are what the transitions below react to.
            for (index, ev) in std::mem::take(&mut self.pending_history) {
                if let Some(e) = self.entries.get(&index) {
                    writes.push(Write::History(e.clone(), ev));
                }
            }
            let mut effects = Vec::new();
            for (index, action) in actions {
                if matches!(action, Action::Hold(_)) {
                    continue;
                }
                let e = &self.entries[&index];
                if !action.is_transition() {
                    effects.push((index, action, None));
                    continue;
                }
                let op = self
                    .deps
                    .config
                    .operation_for(&e.machine_type, &e.operation)
                    .ok();
                let with_success = op.is_some_and(|o| o.success_command.is_some());
                let power_boot = match (
                    &action,
                    op.and_then(|o| o.repair_steps.get(e.step as usize)),
                ) {
                    (Action::Execute { .. }, Some(s))
                        if s.repair_command.power_builtin().is_some() =>
                    {
                        Some(
                            self.deps
                                .agents
                                .agent_health(&e.address)
                                .map(|h| h.boot_id)
                                .unwrap_or_default(),
                        )
                    }
                    _ => None,
                };
                let Some((new, ev)) = decide::transition(
                    e,
                    &action,
                    now,
                    with_success,
                    power_boot,
                    &mut self.deps.rand,
                ) else {
                    continue;
                };
                tracing::info!(index, address = %e.address, event = ev.event, detail = %ev.detail, "repair queue");
                if matches!(action, Action::Dequeue) {
                    writes.push(Write::Delete(index));
                } else {
                    writes.push(Write::Update(new.clone(), Some(ev)));
                }
                effects.push((index, action, Some(new)));
            }
            let transitions = effects.iter().any(|(_, _, n)| n.is_some());
            if !writes.is_empty()
                && let Err(e) = self.commit(writes).await
            {
                // Nothing was acted on: the same decisions are made again next tick.
                tracing::error!(error = %e, "repair queue: cannot commit transitions; holding");
                return;
            }
            for (index, action, new) in effects {
                self.act(index, action, new);
            }
            self.update_metrics();
            if !transitions {
                break;
            }
        }
    }

    fn run_ctx(&self, e: &Entry, request_id: String, timeout_seconds: u64) -> RunContext {
        RunContext {
            address: e.address.clone(),
            serial: e.serial.clone(),
            request_id,
            timeout: (timeout_seconds > 0).then(|| Duration::from_secs(timeout_seconds)),
            step_began: e.last_transition,
            boot_id_before: e.boot_id_before.clone(),
            power: self.deps.power.clone(),
            agents: self.deps.agents.clone(),
        }
    }

    fn spawn_command(
        &mut self,
        index: u64,
        kind: CommandKind,
        spec: CommandSpec,
        ctx: RunContext,
    ) -> (u64, AbortHandle) {
        let generation = self.next_generation();
        let tx = self.ev_tx.clone();
        let h = tokio::spawn(async move {
            let (end, outcome) = command::run(spec, kind, ctx).await;
            let _ = tx.send(Event::Command {
                index,
                generation,
                kind,
                end,
                outcome,
            });
        });
        (generation, h.abort_handle())
    }

    /// A Kubernetes Event on the entry's node (when it has one) saying how the repair
    /// ended; best effort, never delays the loop.
    fn record_outcome(&self, e: &Entry) {
        let event = match e.status {
            RepairStatus::Succeeded => crate::k8s::NodeEvent::Repaired,
            RepairStatus::Failed => crate::k8s::NodeEvent::Failed,
            _ => return,
        };
        if e.nodename.is_empty() {
            return;
        }
        let drainer = self.deps.drainer.clone();
        let (node, message) = (
            e.nodename.clone(),
            format!(
                "repair entry {} ({} on {}) {}",
                e.index,
                e.operation,
                e.address,
                e.status.as_str()
            ),
        );
        tokio::spawn(async move { drainer.record_event(&node, event, &message).await });
    }

    fn uncordon(&self, node: String) {
        if node.is_empty() {
            return;
        }
        let drainer = self.deps.drainer.clone();
        tokio::spawn(async move {
            for attempt in 1..=5 {
                match drainer.uncordon_if_ours(&node).await {
                    Ok(()) => return,
                    Err(e) if e.is_retriable() && attempt < 5 => {
                        tracing::warn!(%node, error = %e, "repair: uncordon failed; retrying");
                        tokio::time::sleep(K8S_RETRY_INTERVAL).await;
                    }
                    Err(e) => {
                        tracing::error!(%node, error = %e, "repair: cannot uncordon node; uncordon it by hand");
                        return;
                    }
                }
            }
        });
    }

    fn act(&mut self, index: u64, action: Action, new: Option<Entry>) {
        if let Some(n) = new {
            self.entries.insert(index, n);
        }
        let Some(e) = self.entries.get(&index).cloned() else {
            return;
        };
        let op = self
            .deps
            .config
            .operation_for(&e.machine_type, &e.operation)
            .ok()
            .cloned();
        let step = op
            .as_ref()
            .and_then(|o| o.repair_steps.get(e.step as usize))
            .cloned();
        self.rt.entry(index).or_default();
        match action {
            Action::Hold(_) => {}
            Action::Dequeue => {
                if let Some(mut rt) = self.rt.remove(&index) {
                    rt.abort_all();
                }
                self.entries.remove(&index);
                self.uncordon(e.nodename.clone());
            }
            Action::Fail { .. } | Action::Succeed { .. } => {
                if let Some(rt) = self.rt.get_mut(&index) {
                    rt.abort_all();
                }
                self.rt.remove(&index);
                self.record_outcome(&e);
                self.uncordon(e.nodename.clone());
            }
            Action::Start => {
                self.rt.insert(index, Runtime::default());
            }
            Action::ResolveNode => {
                let generation = self.next_generation();
                let rt = self.rt.get_mut(&index).expect("runtime");
                rt.obs.node = NodeObs::Resolving;
                rt.node_gen = generation;
                let drainer = self.deps.drainer.clone();
                let tx = self.ev_tx.clone();
                let address = e.address.clone();
                tokio::spawn(async move {
                    let node = drainer.node_for(&address).await.map_err(|e| e.to_string());
                    if node.is_err() {
                        tokio::time::sleep(K8S_RETRY_INTERVAL).await;
                    }
                    let _ = tx.send(Event::Node {
                        index,
                        generation,
                        node,
                    });
                });
            }
            Action::StartDrain(_) | Action::ResumeDrain => {
                let generation = self.next_generation();
                let drainer = self.deps.drainer.clone();
                let opts = self.deps.config.drain_options();
                let tx = self.ev_tx.clone();
                let node = e.nodename.clone();
                let h = tokio::spawn(async move {
                    let end = loop {
                        match drainer.drain(&node, &opts).await {
                            Ok(DrainProgress::Done) => break DrainEnd::Done,
                            Ok(DrainProgress::Abandoned { reason }) => {
                                break DrainEnd::Abandoned(reason);
                            }
                            Ok(DrainProgress::InProgress { remaining, detail }) => {
                                tracing::debug!(%node, remaining, %detail, "repair: draining");
                            }
                            Err(err) if err.is_retriable() => {
                                tracing::warn!(%node, error = %err, "repair: drain pass failed; retrying");
                            }
                            Err(err) => break DrainEnd::Abandoned(err.to_string()),
                        }
                        tokio::time::sleep(DRAIN_POLL_INTERVAL).await;
                    };
                    let _ = tx.send(Event::Drain {
                        index,
                        generation,
                        end,
                    });
                });
                let rt = self.rt.get_mut(&index).expect("runtime");
                if let Some(old) = rt.drain_task.replace(h.abort_handle()) {
                    old.abort();
                }
                rt.drain_gen = generation;
                rt.obs.drain = TaskObs::Running;
            }
            Action::AbandonDrain(_) => {
                let rt = self.rt.get_mut(&index).expect("runtime");
                if let Some(t) = rt.drain_task.take() {
                    t.abort();
                }
                rt.drain_gen = 0;
                rt.obs.drain = TaskObs::NotStarted;
                self.uncordon(e.nodename.clone());
            }
            Action::Execute { attempt } => {
                let Some(step) = step else { return };
                let ctx = self.run_ctx(
                    &e,
                    power_request_id(
                        &self.store_id,
                        index,
                        RequestFor::Repair {
                            step: e.step,
                            attempt,
                        },
                    ),
                    step.command_timeout_seconds,
                );
                let (generation, h) = self.spawn_command(
                    index,
                    CommandKind::Repair,
                    step.repair_command.clone(),
                    ctx,
                );
                let rt = self.rt.get_mut(&index).expect("runtime");
                if let Some(old) = rt.command_task.replace(h) {
                    old.abort();
                }
                rt.command_gen = generation;
                rt.obs.command = TaskObs::Running;
                rt.obs.drain = TaskObs::NotStarted;
            }
            Action::RetryLater { .. } => {
                let rt = self.rt.get_mut(&index).expect("runtime");
                rt.obs.command = TaskObs::NotStarted;
            }
            Action::CommandDone { .. } | Action::NextStep | Action::Healthy => {
                let rt = self.rt.get_mut(&index).expect("runtime");
                if let Some(t) = rt.health_task.take() {
                    t.abort();
                }
                rt.health_gen = 0;
                rt.obs.command = TaskObs::NotStarted;
                rt.obs.health = Default::default();
                rt.last_health = None;
                if e.status == RepairStatus::Succeeded {
                    self.rt.remove(&index);
                    self.record_outcome(&e);
                    self.uncordon(e.nodename.clone());
                }
            }
            Action::RunHealthCheck => {
                let Some(op) = op else { return };
                let ctx = self.run_ctx(
                    &e,
                    power_request_id(&self.store_id, index, RequestFor::Health),
                    op.command_timeout_seconds,
                );
                let (generation, h) = self.spawn_command(
                    index,
                    CommandKind::Health,
                    op.health_check_command.clone(),
                    ctx,
                );
                let rt = self.rt.get_mut(&index).expect("runtime");
                rt.health_task = Some(h);
                rt.health_gen = generation;
                rt.obs.health.running = true;
            }
            Action::RunSuccessCommand => {
                let Some(op) = op else { return };
                let Some(spec) = op.success_command.clone() else {
                    return;
                };
                let ctx = self.run_ctx(
                    &e,
                    power_request_id(&self.store_id, index, RequestFor::Success),
                    op.success_command_timeout,
                );
                let (generation, h) = self.spawn_command(index, CommandKind::Success, spec, ctx);
                let rt = self.rt.get_mut(&index).expect("runtime");
                rt.command_task = Some(h);
                rt.command_gen = generation;
                rt.obs.command = TaskObs::Running;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::future::BoxFuture;
    use jiff::{SignedDuration, Timestamp};
    use protocol::admin::repair::{RepairEntry, RepairStepStatus};

    use super::*;
    use crate::clock::{FakeClock, SystemClock};
    use crate::gateway::NoGateway;
    use crate::k8s::{DrainError, DrainOptions, NotANode};
    use crate::repair::config::load_str;
    use crate::repair::{AgentHealth, NoAgents};

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

    /// A drainer that says every machine is node `n-<address>`, drains until told to finish,
    /// and records uncordons.
    #[derive(Default)]
    struct FakeDrainer {
        done: AtomicBool,
        drains: Mutex<u32>,
        uncordons: Mutex<Vec<String>>,
    }

    impl Drainer for FakeDrainer {
        fn node_for(&self, address: &str) -> BoxFuture<'_, Result<Option<String>, DrainError>> {
            let n = format!("n-{address}");
            Box::pin(async move { Ok(Some(n)) })
        }
        fn drain<'a>(
            &'a self,
            _node: &'a str,
            _opts: &'a DrainOptions,
        ) -> BoxFuture<'a, Result<DrainProgress, DrainError>> {
            Box::pin(async move {
                *self.drains.lock().unwrap() += 1;
                Ok(if self.done.load(Ordering::SeqCst) {
                    DrainProgress::Done
                } else {
                    DrainProgress::InProgress {
                        remaining: 1,
                        detail: "pod p terminating".into(),
                    }
                })
            })
        }
        fn uncordon_if_ours<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), DrainError>> {
            Box::pin(async move {
                self.uncordons.lock().unwrap().push(node.to_string());
                Ok(())
            })
        }
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
        while drainer.uncordons.lock().unwrap().is_empty() {
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
        drainer.done.store(true, Ordering::SeqCst);
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
        drainer.done.store(true, Ordering::SeqCst);
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

    /// Power built-ins through a fake gateway; `@agent-healthy` through a fake fleet view
    /// whose boot id changes when the gateway power-cycles the machine.
    #[derive(Default)]
    struct FakeFleet {
        agent: Mutex<Option<AgentHealth>>,
        requests: Mutex<Vec<protocol::gateway::PowerRequest>>,
        reboots: AtomicBool,
        store_id: Mutex<String>,
    }

    impl AgentHealthView for FakeFleet {
        fn agent_health(&self, _address: &str) -> Option<AgentHealth> {
            self.agent.lock().unwrap().clone()
        }
    }

    struct Gw(Arc<FakeFleet>);

    impl PowerControl for Gw {
        fn power(
            &self,
            req: protocol::gateway::PowerRequest,
        ) -> BoxFuture<'_, Result<protocol::gateway::PowerResponse, crate::gateway::PowerError>>
        {
            Box::pin(async move {
                let f = &self.0;
                f.requests.lock().unwrap().push(req.clone());
                if f.reboots.load(Ordering::SeqCst) {
                    let at = Timestamp::now() + SignedDuration::from_millis(5);
                    *f.agent.lock().unwrap() = Some(AgentHealth {
                        boot_id: "b2".into(),
                        last_report: at,
                        ok_since: Some(at),
                    });
                }
                Ok(protocol::gateway::PowerResponse {
                    id: req.id,
                    outcome: protocol::gateway::PowerOutcome::Done {
                        state: protocol::gateway::PowerState::On,
                        confirmed_off_unix_ms: None,
                        detail: "cycled".into(),
                    },
                })
            })
        }
    }

    async fn power_case(reboots: bool) -> (Harness, u64, Arc<FakeFleet>, tempfile::TempDir) {
        let (d, s) = store();
        let cfg = config(&yaml(
            "      - repair_command: ['@power-cycle']\n        watch_seconds: 2\n",
            "['@agent-healthy']",
            "",
            "",
        ));
        let fleet = Arc::new(FakeFleet::default());
        fleet.reboots.store(reboots, Ordering::SeqCst);
        let before = Timestamp::now() - SignedDuration::from_secs(60);
        *fleet.agent.lock().unwrap() = Some(AgentHealth {
            boot_id: "b1".into(),
            last_report: Timestamp::now() + SignedDuration::from_secs(3600),
            ok_since: Some(before),
        });
        let deps = RepairDeps::new(
            s.clone(),
            cfg,
            Arc::new(SystemClock),
            Arc::new(NotANode),
            Arc::new(Gw(fleet.clone())),
            fleet.clone(),
        );
        let h = start_deps(deps).await;
        let i = h.add("op", "t", "10.0.0.1").await;
        *fleet.store_id.lock().unwrap() = s.with(|c| crate::store::identity::read(c)).unwrap();
        (h, i, fleet, d)
    }

    #[tokio::test]
    async fn power_cycle_then_agent_healthy_needs_a_new_boot() {
        let (h, i, fleet, _d) = power_case(true).await;
        h.wait(i, "succeeded", |e| e.status == RepairStatus::Succeeded)
            .await;
        let reqs = fleet.requests.lock().unwrap().clone();
        assert_eq!(reqs.len(), 1);
        let sid = fleet.store_id.lock().unwrap().clone();
        assert_eq!(reqs[0].id, format!("{sid}-repair-{i}-step0-attempt0"));
        assert_eq!(reqs[0].action, protocol::gateway::PowerAction::Cycle);
        assert_eq!(reqs[0].address, "10.0.0.1");
        h.stop().await;

        // Same boot id after the power cycle: never healthy, the entry fails when the
        // watch of its last step expires.
        let (h, i, _fleet, _d) = power_case(false).await;
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
        let (_d, s) = store();
        let cfg = config(
            "repair:\n  max_concurrent_repairs: 4\n  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: ok\n      repair_steps:\n      - repair_command: ['true']\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n    - operation: fail\n      repair_steps:\n      - repair_command: ['false']\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n    - operation: hang\n      repair_steps:\n      - repair_command: [sleep, '60']\n        need_drain: true\n      health_check_command: [sh, -c, 'echo true']\n",
        );
        let drainer = Arc::new(FakeDrainer::default());
        drainer.done.store(true, Ordering::SeqCst);
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
        h.q.request(RepairQueueRequest::Delete { index: hang })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut u = drainer.uncordons.lock().unwrap().clone();
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
}
