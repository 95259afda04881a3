//! Bookkeeping of the tasks an entry runs (node lookup, drain, command, health check):
//! their reports ([`Event`]), what the engine observed from them ([`Observations`]), and
//! the generation numbers that make a report from a cancelled task harmless.
//!
//! Each task gets a fresh generation when it is spawned; a report whose generation is not
//! the current one for its kind (entry deleted, step moved on, task replaced) is ignored.
//! Health-check results that changed since the last one become history lines, handed to
//! the engine's next commit ([`Tasks::take_history`]).
//!
//! This module spawns nothing ([`super::effects`] does) and writes nothing to the store.

use std::collections::HashMap;

use jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::command::{CommandKind, Outcome};
use super::decide::{CommandEnd, DrainEnd, NodeObs, Observations, TaskObs};
use super::entry::HistoryEvent;

/// A task's report.
#[derive(Debug)]
pub(super) enum Event {
    /// The node lookup ended.
    Node {
        index: u64,
        generation: u64,
        node: Result<Option<String>, String>,
    },
    /// The drain ended.
    Drain {
        index: u64,
        generation: u64,
        end: DrainEnd,
    },
    /// A command ended.
    Command {
        index: u64,
        generation: u64,
        kind: CommandKind,
        end: CommandEnd,
        outcome: Outcome,
    },
    /// A task's note for the entry's history (a drain that fences, and why).
    Note {
        index: u64,
        generation: u64,
        event: HistoryEvent,
    },
}

/// What runs for one entry and what was observed of it.
#[derive(Default)]
pub(super) struct Runtime {
    pub(super) obs: Observations,
    pub(super) node_gen: u64,
    pub(super) drain_gen: u64,
    pub(super) command_gen: u64,
    pub(super) health_gen: u64,
    pub(super) drain_task: Option<AbortHandle>,
    pub(super) command_task: Option<AbortHandle>,
    pub(super) health_task: Option<AbortHandle>,
    /// The last health check's (passed, summary), to record only changes in the history.
    pub(super) last_health: Option<(bool, String)>,
    /// The last failed node lookup's error, to record only changes in the history.
    pub(super) last_node_error: Option<String>,
}

impl Runtime {
    /// Cancels every task of the entry.
    pub(super) fn abort_all(&mut self) {
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

/// Every entry's [`Runtime`], the channel tasks report on, and the next generation.
pub(super) struct Tasks {
    rt: HashMap<u64, Runtime>,
    tx: mpsc::UnboundedSender<Event>,
    pending_history: Vec<(u64, HistoryEvent)>,
    next_gen: u64,
}

impl Tasks {
    /// No tasks; they will report on `tx`.
    pub(super) fn new(tx: mpsc::UnboundedSender<Event>) -> Self {
        Self {
            rt: HashMap::new(),
            tx,
            pending_history: Vec::new(),
            next_gen: 1,
        }
    }

    /// Where a new task reports.
    pub(super) fn sender(&self) -> mpsc::UnboundedSender<Event> {
        self.tx.clone()
    }

    /// A generation no task had before.
    pub(super) fn next_generation(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    /// What was observed of entry `index` (nothing, if it runs nothing).
    pub(super) fn obs(&self, index: u64) -> Option<&Observations> {
        self.rt.get(&index).map(|r| &r.obs)
    }

    /// Entry `index`'s runtime, created empty if it has none.
    pub(super) fn runtime(&mut self, index: u64) -> &mut Runtime {
        self.rt.entry(index).or_default()
    }

    /// Starts entry `index` afresh: nothing observed (a queued entry runs nothing).
    pub(super) fn reset(&mut self, index: u64) {
        self.rt.insert(index, Runtime::default());
    }

    /// Cancels entry `index`'s tasks and forgets it.
    pub(super) fn remove(&mut self, index: u64) {
        if let Some(mut rt) = self.rt.remove(&index) {
            rt.abort_all();
        }
    }

    /// Cancels every task (engine stopping).
    pub(super) fn abort_all(&mut self) {
        for rt in self.rt.values_mut() {
            rt.abort_all();
        }
    }

    /// History lines from health checks since the last call, for the next commit.
    pub(super) fn take_history(&mut self) -> Vec<(u64, HistoryEvent)> {
        std::mem::take(&mut self.pending_history)
    }

    /// Folds a task's report, received at `now`, into the observations. Returns the
    /// command's kind and outcome for metrics when the report is about a command (even a
    /// stale one: the command did run).
    pub(super) fn record(&mut self, ev: Event, now: Timestamp) -> Option<(CommandKind, Outcome)> {
        match ev {
            Event::Node {
                index,
                generation,
                node,
            } => {
                let rt = self.rt.get_mut(&index)?;
                if rt.node_gen != generation {
                    return None;
                }
                rt.obs.node = match node {
                    Ok(Some(n)) => NodeObs::Node(n),
                    Ok(None) => NodeObs::NotANode,
                    Err(e) => {
                        tracing::warn!(index, error = %e, "repair: node lookup failed; will retry");
                        // The entry holds until the lookup succeeds; its history says why,
                        // once per distinct error, so `repair-queue show` is not silent.
                        if rt.last_node_error.as_ref() != Some(&e) {
                            let detail = format!(
                                "cannot tell whether the machine is a Kubernetes node, so the \
                                 entry holds (never runs a step without its drain) and retries: {e}"
                            );
                            self.pending_history
                                .push((index, HistoryEvent::new("node-lookup-failed", detail)));
                            rt.last_node_error = Some(e);
                        }
                        NodeObs::Unknown
                    }
                };
                None
            }
            Event::Drain {
                index,
                generation,
                end,
            } => {
                let rt = self.rt.get_mut(&index)?;
                if rt.drain_gen == generation {
                    rt.obs.drain = TaskObs::Finished(end);
                    rt.drain_task = None;
                }
                None
            }
            Event::Command {
                index,
                generation,
                kind,
                end,
                outcome,
            } => {
                if let Some(rt) = self.rt.get_mut(&index) {
                    match kind {
                        CommandKind::Health if rt.health_gen == generation => {
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
                        CommandKind::Health => {}
                        CommandKind::Repair | CommandKind::Success => {
                            if rt.command_gen == generation {
                                rt.command_task = None;
                                rt.obs.command = TaskObs::Finished(end);
                            }
                        }
                    }
                }
                Some((kind, outcome))
            }
            Event::Note {
                index,
                generation,
                event,
            } => {
                let rt = self.rt.get(&index)?;
                if rt.drain_gen == generation {
                    self.pending_history.push((index, event));
                }
                None
            }
        }
    }
}
