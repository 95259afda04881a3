//! The repair queue's effects: what an action does once its transition is committed.
//! Spawning commands and health checks, node lookups and drain loops, uncordoning, and
//! Kubernetes Events recording how an entry ended.
//!
//! Every effect runs as its own task inside the entry's `repair_entry` span (index and
//! address) and reports back through [`Tasks`]; none blocks the engine's loop. The engine
//! calls [`Effects::act`] only after the pass's transitions are in SQLite (invariant 6);
//! this module decides nothing and writes nothing to the queue's tables (a spawned command
//! records only its own process group, through [`super::orphans::GroupLedger`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use protocol::admin::repair::RepairStatus;
use tracing::Instrument;

use super::command::{self, AgentHealthView, CommandKind, RunContext};
use super::config::{Builtin, CommandSpec, RepairOperation};
use super::decide::{Action, DrainEnd, NodeObs, TaskObs};
use super::diagnostics::DiagnosticsShelf;
use super::entry::{Entry, HistoryEvent, RequestFor, power_request_id};
use super::fencing::{FenceEnd, FenceService, NodeLiveness, describe};
use super::orphans::GroupLedger;
use super::tasks::{Event, Tasks};
use crate::agent_link::AgentActions;
use crate::clock::Clock;
use crate::gateway::PowerControl;
use crate::k8s::{DrainOptions, DrainProgress, Drainer};
use crate::store::Store;

/// Pause between drain passes while pods terminate. Evictions take seconds; polling faster
/// only loads the API server.
pub const DRAIN_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Wait before retrying a failed node lookup or uncordon (API server down).
pub const K8S_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// Attempts at uncordoning a node before asking a person to do it. With
/// [`K8S_RETRY_INTERVAL`] between them this rides out a short API server restart.
const UNCORDON_ATTEMPTS: u32 = 5;

/// The systems effects reach.
pub(super) struct Effects {
    drainer: Arc<dyn Drainer>,
    power: Arc<dyn PowerControl>,
    agents: Arc<dyn AgentHealthView>,
    actions: Arc<dyn AgentActions>,
    drain_opts: DrainOptions,
    /// Where running commands' process groups are recorded ([`super::orphans`]).
    store: Store,
    /// The clock of the process-group records.
    clock: Arc<dyn Clock>,
    /// This database's identity, the prefix of every power request id.
    store_id: String,
    /// Fence flows (`@fence`, and drains of dead nodes), with a cluster.
    fence: Option<Fencing>,
    /// `[fence] keep_off` for an `@fence` with nothing to release.
    keep_off: Option<super::fencing::KeepOffOf>,
    /// `[fence]` limits for an `@fence` with nothing to release.
    fence_timeouts: Option<super::fencing::FenceTimeoutsOf>,
    /// Crash dumps, for an `@fence` with nothing to release.
    kdump: Option<Arc<dyn crate::fence::kdump::KdumpView>>,
}

/// What effects need for fencing: the flows, and whether a node is dead.
#[derive(Clone)]
pub(super) struct Fencing {
    pub(super) service: Arc<FenceService>,
    pub(super) liveness: Arc<dyn NodeLiveness>,
}

impl Effects {
    /// Effects through these systems; drains use `drain_opts`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        drainer: Arc<dyn Drainer>,
        power: Arc<dyn PowerControl>,
        agents: Arc<dyn AgentHealthView>,
        actions: Arc<dyn AgentActions>,
        drain_opts: DrainOptions,
        store: Store,
        clock: Arc<dyn Clock>,
        store_id: String,
        fence: Option<Fencing>,
        keep_off: Option<super::fencing::KeepOffOf>,
        fence_timeouts: Option<super::fencing::FenceTimeoutsOf>,
        kdump: Option<Arc<dyn crate::fence::kdump::KdumpView>>,
    ) -> Self {
        Self {
            drainer,
            power,
            agents,
            actions,
            drain_opts,
            store,
            clock,
            store_id,
            fence,
            keep_off,
            fence_timeouts,
            kdump,
        }
    }

    /// Carries out `action` for entry `e` (as it is after the action's committed
    /// transition; for `Dequeue`, as it was) whose operation is `op`.
    pub(super) fn act(
        &self,
        tasks: &mut Tasks,
        e: &Entry,
        op: Option<&RepairOperation>,
        action: Action,
    ) {
        let index = e.index;
        let step = op.and_then(|o| o.repair_steps.get(e.step as usize));
        tasks.runtime(index);
        match action {
            Action::Hold(_) => {}
            Action::Dequeue => {
                tasks.remove(index);
                self.uncordon(e.nodename.clone());
            }
            Action::Fail { .. } | Action::Succeed { .. } => {
                tasks.remove(index);
                self.record_outcome(e);
                self.uncordon(e.nodename.clone());
            }
            Action::Start => tasks.reset(index),
            Action::ResolveNode => self.resolve_node(tasks, e),
            Action::StartDrain(_) | Action::ResumeDrain => {
                let fences = step.is_some_and(|s| {
                    matches!(s.repair_command, CommandSpec::Builtin(Builtin::Fence))
                });
                self.start_drain(tasks, e, fences)
            }
            Action::AbandonDrain(_) => {
                let rt = tasks.runtime(index);
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
                    e,
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
                    tasks,
                    index,
                    CommandKind::Repair,
                    step.repair_command.clone(),
                    ctx,
                );
                let rt = tasks.runtime(index);
                if let Some(old) = rt.command_task.replace(h) {
                    old.abort();
                }
                rt.command_gen = generation;
                rt.obs.command = TaskObs::Running;
                rt.obs.drain = TaskObs::NotStarted;
            }
            Action::RetryLater { .. } => {
                tasks.runtime(index).obs.command = TaskObs::NotStarted;
            }
            Action::CommandDone { .. }
            | Action::NextStep
            | Action::Escalate { .. }
            | Action::Healthy => {
                let rt = tasks.runtime(index);
                if let Some(t) = rt.health_task.take() {
                    t.abort();
                }
                rt.health_gen = 0;
                rt.obs.command = TaskObs::NotStarted;
                rt.obs.health = Default::default();
                rt.last_health = None;
                if e.status == RepairStatus::Succeeded {
                    tasks.remove(index);
                    self.record_outcome(e);
                    self.uncordon(e.nodename.clone());
                }
            }
            Action::RunHealthCheck => {
                let Some(op) = op else { return };
                let ctx = self.run_ctx(
                    e,
                    power_request_id(&self.store_id, index, RequestFor::Health),
                    op.command_timeout_seconds,
                );
                let (generation, h) = self.spawn_command(
                    tasks,
                    index,
                    CommandKind::Health,
                    op.health_check_command.clone(),
                    ctx,
                );
                let rt = tasks.runtime(index);
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
                    e,
                    power_request_id(&self.store_id, index, RequestFor::Success),
                    op.success_command_timeout,
                );
                let (generation, h) =
                    self.spawn_command(tasks, index, CommandKind::Success, spec, ctx);
                let rt = tasks.runtime(index);
                rt.command_task = Some(h);
                rt.command_gen = generation;
                rt.obs.command = TaskObs::Running;
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
            power: self.power.clone(),
            agents: self.agents.clone(),
            groups: Some(GroupLedger::new(
                self.store.clone(),
                self.clock.clone(),
                e.index,
            )),
            actions: self.actions.clone(),
            diagnostics: Some(DiagnosticsShelf::new(
                self.store.clone(),
                self.clock.clone(),
                e.index,
            )),
            entry_index: e.index,
            fence: self.fence.as_ref().map(|f| f.service.clone()),
            keep_off: self.keep_off.clone(),
            fence_timeouts: self.fence_timeouts.clone(),
            kdump: self.kdump.clone(),
        }
    }

    /// Runs a command as its own task; returns its generation and a handle to cancel it.
    fn spawn_command(
        &self,
        tasks: &mut Tasks,
        index: u64,
        kind: CommandKind,
        spec: CommandSpec,
        ctx: RunContext,
    ) -> (u64, tokio::task::AbortHandle) {
        let generation = tasks.next_generation();
        let tx = tasks.sender();
        let h = tokio::spawn(
            async move {
                let (end, outcome) = command::run(spec, kind, ctx).await;
                let _ = tx.send(Event::Command {
                    index,
                    generation,
                    kind,
                    end,
                    outcome,
                });
            }
            .in_current_span(),
        );
        (generation, h.abort_handle())
    }

    /// Looks up the entry's Node; a failed lookup reports after [`K8S_RETRY_INTERVAL`] so
    /// the retry does not spin.
    fn resolve_node(&self, tasks: &mut Tasks, e: &Entry) {
        let (index, generation) = (e.index, tasks.next_generation());
        let rt = tasks.runtime(index);
        rt.obs.node = NodeObs::Resolving;
        rt.node_gen = generation;
        let drainer = self.drainer.clone();
        let tx = tasks.sender();
        let address = e.address.clone();
        tokio::spawn(
            async move {
                let node = drainer.node_for(&address).await.map_err(|e| e.to_string());
                if node.is_err() {
                    tokio::time::sleep(K8S_RETRY_INTERVAL).await;
                }
                let _ = tx.send(Event::Node {
                    index,
                    generation,
                    node,
                });
            }
            .in_current_span(),
        );
    }

    /// Starts (or restarts) the drain loop of the entry's node: idempotent passes every
    /// [`DRAIN_POLL_INTERVAL`] until done or abandoned. A node dead by the two signals cannot
    /// drain (its pods never terminate): its machine is fenced instead, and the fence's
    /// release is the drain ([`Self::fence_instead_of_drain`]).
    /// A step whose own command is `@fence` (`step_fences`) does not fence twice: its drain
    /// of a dead node ends at once and the step's flow releases the workload.
    fn start_drain(&self, tasks: &mut Tasks, e: &Entry, step_fences: bool) {
        let (index, generation) = (e.index, tasks.next_generation());
        let drainer = self.drainer.clone();
        let opts = self.drain_opts.clone();
        let tx = tasks.sender();
        let node = e.nodename.clone();
        let fence = self.fence.clone();
        let (address, serial) = (e.address.clone(), e.serial.clone());
        let key = format!(
            "{}-repair-{index}-step{}-drain{}-fence",
            self.store_id, e.step, e.drain_backoff_count
        );
        let h = tokio::spawn(
            async move {
                let mut last_error = None;
                let end = loop {
                    if let Some(f) = &fence
                        && let Some(why) = f.liveness.dead(&address)
                        && step_fences
                    {
                        let note = HistoryEvent::new(
                            "drain-skipped-for-fence",
                            format!("node {node} cannot drain: {why}; the step's @fence releases its workload after a confirmed power-off"),
                        );
                        let _ = tx.send(Event::Note {
                            index,
                            generation,
                            event: note,
                        });
                        break DrainEnd::Done;
                    }
                    if let Some(f) = &fence
                        && let Some(why) = f.liveness.dead(&address)
                    {
                        let note = HistoryEvent::new(
                            "fence-instead-of-drain",
                            format!("node {node} cannot drain: {why}; fencing its machine first, releasing its workload after"),
                        );
                        let _ = tx.send(Event::Note {
                            index,
                            generation,
                            event: note,
                        });
                        break Self::fence_instead_of_drain(f, &key, index, &address, &serial)
                            .await;
                    }
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
                            // Once per distinct error: "draining" alone would not say the
                            // API server is what the entry waits for.
                            let err = err.to_string();
                            if last_error.as_ref() != Some(&err) {
                                let note = HistoryEvent::new(
                                    "drain-pass-failed",
                                    format!("node {node}: {err}; retrying"),
                                );
                                let _ = tx.send(Event::Note {
                                    index,
                                    generation,
                                    event: note,
                                });
                                last_error = Some(err);
                            }
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
            }
            .in_current_span(),
        );
        let rt = tasks.runtime(index);
        if let Some(old) = rt.drain_task.replace(h.abort_handle()) {
            old.abort();
        }
        rt.drain_gen = generation;
        rt.obs.drain = TaskObs::Running;
    }

    /// The drain of a dead node: its fence flow, whose end is the drain's.
    async fn fence_instead_of_drain(
        f: &Fencing,
        key: &str,
        index: u64,
        address: &str,
        serial: &str,
    ) -> DrainEnd {
        match f
            .service
            .fence_step(key, index, address, serial, None)
            .await
        {
            FenceEnd::Done(_) => DrainEnd::Done,
            FenceEnd::Failed(flow) => DrainEnd::Abandoned(describe(&flow)),
            FenceEnd::NotANode => DrainEnd::Done,
            FenceEnd::Error(e) => DrainEnd::Abandoned(format!("fence instead of drain: {e}")),
        }
    }

    /// A Kubernetes Event on the entry's node (when it has one) saying how the repair
    /// ended; best effort, never delays the loop. An entry that never drained has not
    /// looked its node up: that is done here, so a repair without a drain is on its Node too.
    fn record_outcome(&self, e: &Entry) {
        let event = match e.status {
            RepairStatus::Succeeded => crate::k8s::NodeEvent::Repaired,
            RepairStatus::Failed => crate::k8s::NodeEvent::Failed,
            _ => return,
        };
        let drainer = self.drainer.clone();
        let (known, address, message) = (
            e.nodename.clone(),
            e.address.clone(),
            format!(
                "repair entry {} ({} on {}) {}",
                e.index,
                e.operation,
                e.address,
                e.status.as_str()
            ),
        );
        tokio::spawn(
            async move {
                let node = if known.is_empty() {
                    match drainer.node_for(&address).await {
                        Ok(Some(n)) => n,
                        Ok(None) => return,
                        Err(error) => {
                            tracing::debug!(%address, %error, "no Node event for the repair: node lookup failed");
                            return;
                        }
                    }
                } else {
                    known
                };
                drainer.record_event(&node, event, &message).await
            }
            .in_current_span(),
        );
    }

    /// Uncordons every node the view shows cordoned by Fleetmend that no active entry
    /// drains (`busy`: their nodes, and the nodes of their addresses). The uncordon at an
    /// entry's end gives up after [`UNCORDON_ATTEMPTS`], and a coordinator killed between
    /// an entry's end and its uncordon never makes it; without this sweep such a node stayed
    /// cordoned until a person noticed the lost capacity. Only our cordon is touched
    /// (`uncordon_if_ours`), never an admin's. Returns the nodes it uncordons.
    pub(super) fn uncordon_leftovers(&self, busy: &HashSet<String>) -> Vec<String> {
        let left: Vec<String> = self
            .drainer
            .cordoned_by_us()
            .into_iter()
            .filter(|n| !busy.contains(n))
            .collect();
        for node in &left {
            tracing::warn!(%node, "repair: node cordoned by Fleetmend with no active entry; uncordoning it");
            self.uncordon(node.clone());
        }
        left
    }

    /// The node of `address` as the view knows it, for [`Self::uncordon_leftovers`]'s
    /// `busy`.
    pub(super) fn known_node(&self, address: &str) -> Option<String> {
        self.drainer.known_node(address)
    }

    /// Uncordons `node` if the cordon is ours, retrying while the API server is down.
    fn uncordon(&self, node: String) {
        if node.is_empty() {
            return;
        }
        let drainer = self.drainer.clone();
        tokio::spawn(
            async move {
                for attempt in 1..=UNCORDON_ATTEMPTS {
                    match drainer.uncordon_if_ours(&node).await {
                        Ok(()) => return,
                        Err(e) if e.is_retriable() && attempt < UNCORDON_ATTEMPTS => {
                            tracing::warn!(%node, error = %e, "repair: uncordon failed; retrying");
                            tokio::time::sleep(K8S_RETRY_INTERVAL).await;
                        }
                        Err(e) => {
                            tracing::error!(%node, error = %e, "repair: cannot uncordon node; uncordon it by hand");
                            return;
                        }
                    }
                }
            }
            .in_current_span(),
        );
    }
}
