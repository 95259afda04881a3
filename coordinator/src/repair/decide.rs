//! The step decision: a pure function of (entries, configuration, observations, enabled flag,
//! now) → one [`Action`] per entry, and the pure transition each action makes to its entry.
//!
//! It reproduces CKE's repair strategy (server/strategy.go and op/repair_*.go), case by case,
//! with these deliberate differences:
//! - one machine never has two active entries, whatever `max_concurrent_repairs` is (CKE only
//!   avoids it for two queued entries picked in the same pass);
//! - an entry whose machine type or operation matches nothing fails at once with that reason
//!   instead of holding a concurrency slot forever;
//! - a step's watch starts when its command completes, and the watch only expires after at
//!   least one health check ran since then (CKE always runs one per loop before deciding);
//! - CKE's API-server-specific rules (RepairApiServerHighPriority, RepairMaxConcurrentApiServer,
//!   RepairApiServerAnotherRebooting, RepairRebootingApiServer) do not apply: the
//!   coordinator's repair queue does not know control-plane roles;
//! - CKE's `…Uncordon` cases are not separate operations here: uncordoning is an effect of
//!   the actions that end a drain or an entry (`AbandonDrain`, `Fail`, `Succeed`, `Dequeue`),
//!   tested in [`super::engine`].
//!
//! The tests at the bottom are named after CKE's `server/strategy_test.go` repair cases
//! (`RepairDrainWaitRetryExpire` → `repair_drain_wait_retry_expire`), plus the cases above.
//!
//! It does no I/O and reads no clock: the engine ([`super::engine`]) gathers observations,
//! calls [`decide`], commits each action's [`transition`] to SQLite, and only then acts.

use std::borrow::Cow;
use std::collections::HashSet;

use jiff::{SignedDuration, Timestamp};
use protocol::admin::repair::{RepairStatus, RepairStepStatus};

use super::config::{CommandSpec, RepairConfig, RepairOperation};
use super::entry::{Entry, HistoryEvent, Phase};
pub use super::evidence::{AgentSeen, UNKNOWN_EVIDENCE_WAIT};

/// Base of the drain backoff, CKE's `drainBackOffBaseSeconds`: the wait after the n-th failed
/// drain is `300 s + rand(300 s × n)`, long enough for a PodDisruptionBudget to recover.
pub const DRAIN_BACKOFF_BASE_SECONDS: u64 = 300;

/// How often a watched entry's health check runs. CKE runs it once per control loop (a few
/// seconds); one second keeps short `watch_seconds` meaningful and is cheap because only
/// processing entries (at most `max_concurrent_repairs`) are checked.
pub const HEALTH_CHECK_INTERVAL: SignedDuration = SignedDuration::from_secs(1);

/// What is known about an entry's machine as a Kubernetes node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodeObs {
    /// Not looked up yet (or the lookup failed and will be retried).
    #[default]
    Unknown,
    /// A lookup is running.
    Resolving,
    /// The machine is not a node of the cluster (or there is no cluster).
    NotANode,
    /// The machine's Node.
    Node(String),
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainEnd {
    /// Every pod that had to go is gone.
    Done,
    /// The drainer gave up (protected Job pod, budgets, refusal).
    Abandoned(String),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandEnd {
    /// Exit status 0 (and, for a health check, stdout `true`).
    pub ok: bool,
    /// What happened, for a person (`exit status 1`, `timed out after 30 s`, …).
    pub summary: String,
    /// Truncated output.
    pub output: String,
    /// Set when a power action that is not safe to do twice (a cycle) may have been carried
    /// out although the step failed: the gateway restarted while it ran it ("outcome
    /// unknown"), or no answer came in time. When that became known. A retry then needs
    /// evidence that the first did not happen (see [`UNKNOWN_EVIDENCE_WAIT`]).
    pub unknown_since: Option<Timestamp>,
}

/// A background task's state, as the engine observed it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TaskObs<T> {
    /// No task for the current phase (never started, or lost in a restart).
    #[default]
    NotStarted,
    /// Running.
    Running,
    /// Ended.
    Finished(T),
}

/// Health checks since the current watch began.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthObs {
    /// A check is running.
    pub running: bool,
    /// Checks completed since the watch began.
    pub completed: u32,
    /// The last completed check: when it ended and whether it passed.
    pub last: Option<(Timestamp, bool)>,
}

/// Everything the decision needs to know beyond the entry and the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observations {
    /// The machine as a node.
    pub node: NodeObs,
    /// The drain task of the current draining step.
    pub drain: TaskObs<DrainEnd>,
    /// The repair command attempt (phase `Command`) or success command (phase
    /// `SuccessCommand`).
    pub command: TaskObs<CommandEnd>,
    /// Health checks.
    pub health: HealthObs,
    /// The machine's agent; only filled while a command whose outcome is unknown waits
    /// for evidence ([`CommandEnd::unknown_since`]).
    pub agent: Option<AgentSeen>,
}

/// What to do with one entry now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing now; the reason is for logs and tests. Static where possible: with thousands
    /// of queued entries a pass would otherwise allocate a string per entry.
    Hold(Cow<'static, str>),
    /// Marked deleted: cancel whatever runs, uncordon if the cordon is ours, remove the entry.
    Dequeue,
    /// The entry fails: cancel what runs, uncordon.
    Fail {
        /// Why.
        reason: String,
        /// Output of the command that failed, if any.
        output: String,
    },
    /// queued → processing, step 0, waiting.
    Start,
    /// Look up the machine's Node (no transition).
    ResolveNode,
    /// waiting → draining the given node.
    StartDrain(String),
    /// Restart the drain task of a draining entry (after a coordinator restart; no transition).
    ResumeDrain,
    /// draining → waiting with a linear backoff; uncordon.
    AbandonDrain(String),
    /// → watching: run attempt `attempt` of the step's command.
    Execute {
        /// 0-based attempt.
        attempt: u32,
    },
    /// A failed attempt will be retried at `until`.
    RetryLater {
        /// The next attempt.
        attempt: u32,
        /// When.
        until: Timestamp,
        /// The failed attempt's summary.
        summary: String,
        /// Its output.
        output: String,
    },
    /// The step's command completed; watching begins.
    CommandDone {
        /// Summary.
        summary: String,
        /// Output.
        output: String,
    },
    /// Run one health check (no transition).
    RunHealthCheck,
    /// The watch expired: step + 1, waiting.
    NextStep,
    /// A graceful (agent) step's command failed, e.g. the agent is unreachable or refused:
    /// step + 1, waiting, so the procedure escalates instead of failing the entry.
    Escalate {
        /// The failed attempt's summary.
        summary: String,
        /// Its output.
        output: String,
    },
    /// The health check passed: run the success command.
    Healthy,
    /// Run (again) the success command (no transition).
    RunSuccessCommand,
    /// processing → succeeded.
    Succeed {
        /// Success command output, if one ran.
        output: String,
    },
}

impl Action {
    /// True for actions that change the entry (and are committed before their effect).
    pub fn is_transition(&self) -> bool {
        !matches!(
            self,
            Action::Hold(_)
                | Action::ResolveNode
                | Action::ResumeDrain
                | Action::RunHealthCheck
                | Action::RunSuccessCommand
        )
    }
}

/// An entry with what was observed about it.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The entry.
    pub entry: &'a Entry,
    /// Observations.
    pub obs: &'a Observations,
}

/// Decides one action per entry. `entries` must be sorted by index: queued entries get
/// slots in index order, as in CKE.
pub fn decide(
    entries: &[Observed<'_>],
    config: &RepairConfig,
    enabled: bool,
    now: Timestamp,
) -> Vec<(u64, Action)> {
    let max = config.max_concurrent_repairs as usize;
    let mut busy: HashSet<&str> = HashSet::new();
    let mut processing = 0usize;
    for o in entries {
        if o.entry.status == RepairStatus::Processing && !o.entry.deleted {
            processing += 1;
            busy.insert(o.entry.address.as_str());
        }
    }
    let mut out = Vec::with_capacity(entries.len());
    for o in entries {
        let e = o.entry;
        let action = if e.deleted {
            Action::Dequeue
        } else {
            match e.status {
                RepairStatus::Succeeded | RepairStatus::Failed => continue,
                RepairStatus::Queued => match config.operation_for(&e.machine_type, &e.operation) {
                    Err(no) => fail(no.to_string()),
                    Ok(_) if !enabled => Action::Hold("repair queue disabled".into()),
                    Ok(_) if busy.contains(e.address.as_str()) => Action::Hold(Cow::Owned(
                        format!("another entry for {} is being processed", e.address),
                    )),
                    Ok(_) if processing >= max => {
                        Action::Hold("max_concurrent_repairs entries are being processed".into())
                    }
                    Ok(_) => {
                        processing += 1;
                        busy.insert(e.address.as_str());
                        Action::Start
                    }
                },
                RepairStatus::Processing => {
                    match config.operation_for(&e.machine_type, &e.operation) {
                        Err(no) => fail(no.to_string()),
                        Ok(op) => decide_processing(e, op, o.obs, config, enabled, now),
                    }
                }
            }
        };
        out.push((e.index, action));
    }
    out
}

fn fail(reason: String) -> Action {
    Action::Fail {
        reason,
        output: String::new(),
    }
}

/// True when the machine's agent reported, after `since`, the boot id it had before the
/// step (a power action that had happened would have stopped or replaced that boot).
fn untouched(e: &Entry, obs: &Observations, since: Timestamp) -> bool {
    obs.agent.as_ref().is_some_and(|a| {
        !e.boot_id_before.is_empty() && a.boot_id == e.boot_id_before && a.last_report > since
    })
}

/// A step whose power action's outcome stayed unknown without evidence that it did not
/// happen: not retried. A step before the last escalates (the next step is the procedure's
/// answer to this one failing); the last fails the entry.
fn not_retried(e: &Entry, end: &CommandEnd, attempt: u32, is_last: bool) -> Action {
    let why = "its outcome is unknown and no report from the machine's agent since shows it \
               did not happen (the boot id from before the step), so it is not retried: \
               doing it again could power-cycle the machine a second time";
    if is_last {
        Action::Fail {
            reason: format!(
                "repair command of step {} failed ({}) after {} attempt(s); {why}",
                e.step,
                end.summary,
                attempt + 1
            ),
            output: end.output.clone(),
        }
    } else {
        Action::Escalate {
            summary: format!("{}; {why}", end.summary),
            output: end.output.clone(),
        }
    }
}

/// The decision for one processing, not deleted entry.
pub fn decide_processing(
    e: &Entry,
    op: &RepairOperation,
    obs: &Observations,
    config: &RepairConfig,
    enabled: bool,
    now: Timestamp,
) -> Action {
    let Some(step) = op.repair_steps.get(e.step as usize) else {
        return fail(format!(
            "step {} is out of range: operation `{}` has {} steps",
            e.step,
            op.operation,
            op.repair_steps.len()
        ));
    };
    let is_last = e.step as usize + 1 == op.repair_steps.len();
    match e.step_status {
        RepairStepStatus::Waiting => {
            if !enabled {
                return Action::Hold("repair queue disabled".into());
            }
            if !step.need_drain {
                return Action::Execute { attempt: 0 };
            }
            match &obs.node {
                NodeObs::Unknown => Action::ResolveNode,
                NodeObs::Resolving => Action::Hold("looking up the machine's node".into()),
                NodeObs::NotANode => Action::Execute { attempt: 0 },
                NodeObs::Node(n) => match e.drain_backoff_expire {
                    Some(t) if t > now => {
                        Action::Hold(Cow::Owned(format!("drain backoff until {t:.0}")))
                    }
                    _ => Action::StartDrain(n.clone()),
                },
            }
        }
        RepairStepStatus::Draining => {
            if !enabled {
                return Action::AbandonDrain("repair queue disabled".into());
            }
            match &obs.drain {
                TaskObs::Finished(DrainEnd::Done) => Action::Execute { attempt: 0 },
                TaskObs::Finished(DrainEnd::Abandoned(r)) => Action::AbandonDrain(r.clone()),
                _ if now >= add_secs(e.last_transition, config.eviction_timeout_seconds) => {
                    Action::AbandonDrain(format!(
                        "drain did not finish within eviction_timeout_seconds ({} s)",
                        config.eviction_timeout_seconds
                    ))
                }
                TaskObs::NotStarted => Action::ResumeDrain,
                TaskObs::Running => Action::Hold("draining".into()),
            }
        }
        RepairStepStatus::Watching => match &e.phase {
            Phase::Command { attempt } => match &obs.command {
                TaskObs::Running => Action::Hold("repair command running".into()),
                TaskObs::NotStarted if enabled => Action::Execute { attempt: *attempt },
                TaskObs::NotStarted => {
                    Action::Hold("repair queue disabled; interrupted command not restarted".into())
                }
                TaskObs::Finished(end) if end.ok => Action::CommandDone {
                    summary: end.summary.clone(),
                    output: end.output.clone(),
                },
                TaskObs::Finished(end)
                    if *attempt < step.command_retries
                        && end
                            .unknown_since
                            .is_some_and(|since| !untouched(e, obs, since)) =>
                {
                    let since = end.unknown_since.unwrap_or(now);
                    if now < since.saturating_add(UNKNOWN_EVIDENCE_WAIT).unwrap_or(since) {
                        return Action::Hold(
                            "the power action's outcome is unknown; waiting for the machine's \
                             agent to show it did not happen before retrying"
                                .into(),
                        );
                    }
                    not_retried(e, end, *attempt, is_last)
                }
                TaskObs::Finished(end) if *attempt < step.command_retries => Action::RetryLater {
                    attempt: attempt + 1,
                    until: add_secs(now, step.command_interval),
                    summary: end.summary.clone(),
                    output: end.output.clone(),
                },
                TaskObs::Finished(end) if end.unknown_since.is_some() => {
                    not_retried(e, end, *attempt, is_last)
                }
                TaskObs::Finished(end)
                    if !is_last && matches!(step.repair_command, CommandSpec::Agent(_)) =>
                {
                    Action::Escalate {
                        summary: end.summary.clone(),
                        output: end.output.clone(),
                    }
                }
                TaskObs::Finished(end) => Action::Fail {
                    reason: format!(
                        "repair command of step {} failed ({}) after {} attempt(s)",
                        e.step,
                        end.summary,
                        attempt + 1
                    ),
                    output: end.output.clone(),
                },
            },
            Phase::RetryWait { attempt, until } => {
                if !enabled {
                    Action::Hold("repair queue disabled".into())
                } else if now >= *until {
                    Action::Execute { attempt: *attempt }
                } else {
                    Action::Hold(Cow::Owned(format!(
                        "retrying the repair command at {until:.0}"
                    )))
                }
            }
            Phase::Watching { since } => {
                let h = &obs.health;
                if matches!(h.last, Some((_, true))) {
                    return Action::Healthy;
                }
                if h.running {
                    return Action::Hold("health check running".into());
                }
                let expired = now >= add_secs(*since, step.watch_seconds) && h.completed > 0;
                if expired {
                    return if is_last {
                        fail(format!(
                            "the machine did not become healthy within watch_seconds ({} s) of the last step ({})",
                            step.watch_seconds, e.step
                        ))
                    } else if enabled {
                        Action::NextStep
                    } else {
                        Action::Hold("repair queue disabled; next step not started".into())
                    };
                }
                match h.last {
                    Some((at, _)) if now < at + HEALTH_CHECK_INTERVAL => {
                        Action::Hold("watching".into())
                    }
                    _ => Action::RunHealthCheck,
                }
            }
            Phase::SuccessCommand => match &obs.command {
                TaskObs::Running => Action::Hold("success command running".into()),
                TaskObs::NotStarted => Action::RunSuccessCommand,
                TaskObs::Finished(end) if end.ok => Action::Succeed {
                    output: end.output.clone(),
                },
                TaskObs::Finished(end) => Action::Fail {
                    reason: format!(
                        "the machine is healthy but the success command failed ({})",
                        end.summary
                    ),
                    output: end.output.clone(),
                },
            },
            Phase::Idle => fail("inconsistent entry: watching without a command".into()),
        },
    }
}

fn add_secs(t: Timestamp, secs: u64) -> Timestamp {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX / 2);
    t.saturating_add(SignedDuration::from_secs(secs))
        .unwrap_or(t)
}

/// When a drain may be tried again after the `count`-th failure (count ≥ 1): CKE's linear
/// backoff `now + 300 s + rand(300 s × count)`. `rand(n)` must return a value in `0..n`.
pub fn drain_backoff_expire(
    now: Timestamp,
    count: u32,
    rand: &mut dyn FnMut(u64) -> u64,
) -> Timestamp {
    let span = DRAIN_BACKOFF_BASE_SECONDS * u64::from(count.max(1));
    add_secs(now, DRAIN_BACKOFF_BASE_SECONDS + rand(span).min(span - 1))
}

/// The new state of `e` after `action`, with its history line; `None` for actions that do
/// not change the entry. `op` is the entry's resolved operation (`None` when its machine
/// type or operation matches nothing): it says whether a success command follows a passed
/// health check and whether the step's command is a power action, whose start remembers
/// the agent's current boot id (read through `agent_boot_id`, only then).
pub fn transition(
    e: &Entry,
    op: Option<&RepairOperation>,
    action: &Action,
    now: Timestamp,
    agent_boot_id: &dyn Fn() -> Option<String>,
    rand: &mut dyn FnMut(u64) -> u64,
) -> Option<(Entry, HistoryEvent)> {
    let with_success_command = op.is_some_and(|o| o.success_command.is_some());
    let power_step = op
        .and_then(|o| o.repair_steps.get(e.step as usize))
        .is_some_and(|s| s.repair_command.changes_boot());
    let mut n = e.clone();
    let moved = |n: &mut Entry, status, step, step_status| {
        n.status = status;
        n.step = step;
        n.step_status = step_status;
        n.last_transition = now;
    };
    let ev = match action {
        Action::Hold(_)
        | Action::ResolveNode
        | Action::ResumeDrain
        | Action::RunHealthCheck
        | Action::RunSuccessCommand => return None,
        Action::Dequeue => {
            n.phase = Phase::Idle;
            HistoryEvent::new("dequeued", "deleted by request")
        }
        Action::Fail { reason, output } => {
            moved(&mut n, RepairStatus::Failed, e.step, e.step_status);
            n.phase = Phase::Idle;
            HistoryEvent::new("failed", reason.clone()).with_output(output.clone())
        }
        Action::Start => {
            moved(
                &mut n,
                RepairStatus::Processing,
                0,
                RepairStepStatus::Waiting,
            );
            n.phase = Phase::Idle;
            HistoryEvent::new("started", "a repair slot is free")
        }
        Action::StartDrain(node) => {
            moved(
                &mut n,
                RepairStatus::Processing,
                e.step,
                RepairStepStatus::Draining,
            );
            n.nodename = node.clone();
            HistoryEvent::new("drain-started", format!("draining node {node}"))
        }
        Action::AbandonDrain(reason) => {
            moved(
                &mut n,
                RepairStatus::Processing,
                e.step,
                RepairStepStatus::Waiting,
            );
            n.drain_backoff_count = e.drain_backoff_count.saturating_add(1);
            let until = drain_backoff_expire(now, n.drain_backoff_count, rand);
            n.drain_backoff_expire = Some(until);
            HistoryEvent::new(
                "drain-abandoned",
                format!(
                    "{reason}; uncordoned; next drain not before {until:.0} (backoff #{})",
                    n.drain_backoff_count
                ),
            )
        }
        Action::Execute { attempt } => {
            moved(
                &mut n,
                RepairStatus::Processing,
                e.step,
                RepairStepStatus::Watching,
            );
            n.phase = Phase::Command { attempt: *attempt };
            let resumed = matches!(e.phase, Phase::Command { attempt: a } if a == *attempt);
            // A resumed power step keeps the boot id seen before its first start: the
            // machine may already have rebooted.
            if !resumed {
                n.boot_id_before = if power_step {
                    agent_boot_id().unwrap_or_default()
                } else {
                    String::new()
                };
            }
            HistoryEvent::new(
                "command-started",
                if resumed {
                    format!(
                        "step {} attempt {attempt}: restarted, the coordinator stopped while it ran",
                        e.step
                    )
                } else {
                    // Counted from 0 like the step and like the power request id
                    // (`…-step<s>-attempt<a>`), so a history line names the gateway request.
                    format!("step {} attempt {attempt}", e.step)
                },
            )
        }
        Action::RetryLater {
            attempt,
            until,
            summary,
            output,
        } => {
            n.phase = Phase::RetryWait {
                attempt: *attempt,
                until: *until,
            };
            HistoryEvent::new(
                "command-failed",
                format!(
                    "step {} attempt {}: {summary}; attempt {attempt} at {until:.0}",
                    e.step,
                    attempt.saturating_sub(1)
                ),
            )
            .with_output(output.clone())
        }
        Action::CommandDone { summary, output } => {
            n.phase = Phase::Watching { since: now };
            HistoryEvent::new(
                "command-succeeded",
                format!("step {}: {summary}; watching", e.step),
            )
            .with_output(output.clone())
        }
        Action::NextStep => {
            moved(
                &mut n,
                RepairStatus::Processing,
                e.step + 1,
                RepairStepStatus::Waiting,
            );
            n.phase = Phase::Idle;
            HistoryEvent::new(
                "next-step",
                format!("watch of step {} expired, machine still unhealthy", e.step),
            )
        }
        Action::Escalate { summary, output } => {
            moved(
                &mut n,
                RepairStatus::Processing,
                e.step + 1,
                RepairStepStatus::Waiting,
            );
            n.phase = Phase::Idle;
            HistoryEvent::new(
                "escalated",
                format!(
                    "step {} failed ({summary}); going on to step {}",
                    e.step,
                    e.step + 1
                ),
            )
            .with_output(output.clone())
        }
        Action::Healthy => {
            if with_success_command {
                n.phase = Phase::SuccessCommand;
                HistoryEvent::new(
                    "healthy",
                    "health check passed; running the success command",
                )
            } else {
                moved(&mut n, RepairStatus::Succeeded, e.step, e.step_status);
                n.phase = Phase::Idle;
                HistoryEvent::new("succeeded", "health check passed")
            }
        }
        Action::Succeed { output } => {
            moved(&mut n, RepairStatus::Succeeded, e.step, e.step_status);
            n.phase = Phase::Idle;
            HistoryEvent::new(
                "succeeded",
                "health check passed and the success command succeeded",
            )
            .with_output(output.clone())
        }
    };
    Some((n, ev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::config::{Builtin, RepairProcedure, RepairStep};

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    fn step(watch: u64) -> RepairStep {
        RepairStep {
            repair_command: CommandSpec::External(vec!["repair".into()]),
            command_timeout_seconds: 30,
            command_retries: 0,
            command_interval: 0,
            need_drain: false,
            watch_seconds: watch,
        }
    }

    /// CKE's `withRepairConfig`: type1/op1 with two steps, type2 unknown.
    fn config() -> RepairConfig {
        RepairConfig {
            repair_procedures: vec![RepairProcedure {
                machine_types: vec!["type1".into()],
                repair_operations: vec![RepairOperation {
                    operation: "op1".into(),
                    repair_steps: vec![step(0), step(0)],
                    health_check_command: CommandSpec::External(vec!["check".into()]),
                    command_timeout_seconds: 30,
                    success_command: None,
                    success_command_timeout: 30,
                }],
            }],
            max_concurrent_repairs: 1,
            protected_namespaces: None,
            protected_job_pods: None,
            evict_retries: 0,
            evict_interval: 0,
            eviction_timeout_seconds: 600,
        }
    }

    struct Case {
        config: RepairConfig,
        enabled: bool,
        now: Timestamp,
        entries: Vec<(Entry, Observations)>,
    }

    /// Fixture builder in CKE's `newData().withRepairConfig()...` style.
    fn case() -> Case {
        Case {
            config: config(),
            enabled: true,
            now: t0(),
            entries: Vec::new(),
        }
    }

    impl Case {
        fn entry(mut self, address: &str, machine_type: &str, operation: &str) -> Self {
            let mut e = Entry::new_queued(address, "", machine_type, operation, t0());
            e.index = self.entries.len() as u64 + 1;
            self.entries.push((e, Observations::default()));
            self
        }
        fn e(self, f: impl FnOnce(&mut Entry)) -> Self {
            self.last(|e, _| f(e))
        }
        fn o(self, f: impl FnOnce(&mut Observations)) -> Self {
            self.last(|_, o| f(o))
        }
        fn last(mut self, f: impl FnOnce(&mut Entry, &mut Observations)) -> Self {
            let (e, o) = self.entries.last_mut().expect("an entry");
            f(e, o);
            self
        }
        fn processing(self, status: RepairStepStatus, ago: i64) -> Self {
            let now = self.now;
            self.e(|e| {
                e.status = RepairStatus::Processing;
                e.step_status = status;
                e.last_transition = now - secs(ago);
            })
        }
        fn watching_since(self, ago: i64) -> Self {
            let now = self.now;
            self.processing(RepairStepStatus::Watching, ago).e(|e| {
                e.phase = Phase::Watching {
                    since: now - secs(ago),
                }
            })
        }
        fn need_drain(mut self) -> Self {
            self.config.repair_procedures[0].repair_operations[0].repair_steps[0].need_drain = true;
            self
        }
        fn watch(mut self, s: u64) -> Self {
            self.config.repair_procedures[0].repair_operations[0].repair_steps[0].watch_seconds = s;
            self
        }
        fn eviction_timeout(mut self, s: u64) -> Self {
            self.config.eviction_timeout_seconds = s;
            self
        }
        fn max(mut self, n: u32) -> Self {
            self.config.max_concurrent_repairs = n;
            self
        }
        fn disabled(mut self) -> Self {
            self.enabled = false;
            self
        }
        /// The resolved operation of the first entry, as the engine passes it to
        /// [`transition`].
        fn op(&self) -> Option<&RepairOperation> {
            let (e, _) = self.entries.first()?;
            self.config
                .operation_for(&e.machine_type, &e.operation)
                .ok()
        }
        fn run(&self) -> Vec<(u64, Action)> {
            let observed: Vec<Observed<'_>> = self
                .entries
                .iter()
                .map(|(entry, obs)| Observed { entry, obs })
                .collect();
            decide(&observed, &self.config, self.enabled, self.now)
        }
        /// Actions other than `Hold`, by kind, as CKE's `ExpectedOps` lists operators.
        fn ops(&self) -> Vec<&'static str> {
            self.run().iter().filter_map(|(_, a)| kind(a)).collect()
        }
    }

    fn kind(a: &Action) -> Option<&'static str> {
        Some(match a {
            Action::Hold(_) => return None,
            Action::Dequeue => "dequeue",
            Action::Fail { .. } => "fail",
            Action::Start => "start",
            Action::ResolveNode => "resolve-node",
            Action::StartDrain(_) => "drain-start",
            Action::ResumeDrain => "drain-resume",
            Action::AbandonDrain(_) => "drain-timeout",
            Action::Execute { .. } => "execute",
            Action::RetryLater { .. } => "retry-later",
            Action::CommandDone { .. } => "command-done",
            Action::RunHealthCheck => "health-check",
            Action::NextStep => "next-step",
            Action::Escalate { .. } => "escalate",
            Action::Healthy => "healthy",
            Action::RunSuccessCommand => "success-command",
            Action::Succeed { .. } => "succeed",
        })
    }

    fn node(o: &mut Observations) {
        o.node = NodeObs::Node("node4".into());
    }

    fn health(o: &mut Observations, passed: bool, ago: i64) {
        o.health.completed = 1;
        o.health.last = Some((t0() - secs(ago), passed));
    }

    fn started(c: &Case) -> Entry {
        let (e, _) = &c.entries[0];
        let (n, _) = transition(e, c.op(), &Action::Start, c.now, &|| None, &mut |_| 0).unwrap();
        n
    }

    // ---- CKE server/strategy_test.go repair cases, by their names ----

    #[test]
    fn repair_queued_entry_starts_and_executes_first_step() {
        let c = case().entry("10.0.0.4", "type1", "op1");
        assert_eq!(c.ops(), ["start"]);
        let n = started(&c);
        assert_eq!(
            (n.status, n.step, n.step_status),
            (RepairStatus::Processing, 0, RepairStepStatus::Waiting)
        );
        let c = c.e(|e| *e = n);
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 0 });
    }

    #[test]
    fn repair_without_config_procedure_fails_at_once() {
        // CKE: RepairWithoutConfig does nothing. Here an entry nothing matches fails at once.
        let mut c = case().entry("10.0.0.4", "type1", "op1");
        c.config.repair_procedures.clear();
        assert_eq!(c.ops(), ["fail"]);
    }

    #[test]
    fn repair_bad_machine_type_fails_at_once_with_reason() {
        let c = case().entry("10.0.0.4", "type2", "op1");
        match &c.run()[0].1 {
            Action::Fail { reason, .. } => {
                assert!(reason.contains("machine type `type2`"), "{reason}")
            }
            a => panic!("{a:?}"),
        }
    }

    #[test]
    fn repair_bad_operation_fails_at_once_and_does_not_hold_a_slot() {
        // CKE: RepairBadOperation — the bad entry consumes the only slot and nothing runs.
        let c = case()
            .entry("10.0.0.4", "type1", "noop")
            .entry("10.0.0.5", "type1", "op1");
        let r = c.run();
        match &r[0].1 {
            Action::Fail { reason, .. } => {
                assert!(reason.contains("no operation `noop`"), "{reason}")
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(r[1].1, Action::Start);
    }

    #[test]
    fn repair_out_of_cluster_machine_executes_without_drain() {
        let c = case()
            .need_drain()
            .entry("10.0.99.99", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(|o| o.node = NodeObs::NotANode);
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 0 });
    }

    #[test]
    fn repair_need_drain_looks_up_the_node_first() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0);
        assert_eq!(c.ops(), ["resolve-node"]);
        let c = c.o(|o| o.node = NodeObs::Resolving);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_max_concurrent() {
        let c = case()
            .max(2)
            .entry("10.0.0.1", "type1", "op1")
            .entry("10.0.0.4", "type1", "op1")
            .entry("10.0.0.5", "type1", "op1");
        assert_eq!(c.ops(), ["start", "start"]);
        assert!(matches!(c.run()[2].1, Action::Hold(_)));
    }

    #[test]
    fn repair_max_concurrent_counts_processing_entries() {
        let c = case()
            .max(2)
            .entry("10.0.0.1", "type1", "op1")
            .watching_since(1)
            .o(|o| o.health.running = true)
            .entry("10.0.0.4", "type1", "op1")
            .entry("10.0.0.5", "type1", "op1");
        assert_eq!(c.ops(), ["start"]);
        assert_eq!(c.run()[1].1, Action::Start);
    }

    #[test]
    fn repair_max_concurrent_same_machine() {
        let c = case()
            .max(2)
            .entry("10.0.0.1", "type1", "op1")
            .entry("10.0.0.1", "type1", "op1");
        assert_eq!(c.ops(), ["start"]);
    }

    #[test]
    fn one_machine_never_has_two_active_entries_whatever_max_concurrent_repairs_is() {
        // A processing entry for the machine blocks a queued one even with free slots.
        let c = case()
            .max(10)
            .entry("10.0.0.1", "type1", "op1")
            .watching_since(1)
            .o(|o| o.health.running = true)
            .entry("10.0.0.1", "type1", "op1")
            .entry("10.0.0.2", "type1", "op1");
        let r = c.run();
        assert!(
            matches!(&r[1].1, Action::Hold(why) if why.contains("another entry")),
            "{r:?}"
        );
        assert_eq!(r[2].1, Action::Start);
        // A deleted processing entry no longer blocks it.
        let c = c.e(|_| {}).entries.into_iter().enumerate().fold(
            case().max(10),
            |acc, (i, (mut e, o))| {
                if i == 0 {
                    e.deleted = true;
                }
                let mut acc = acc;
                acc.entries.push((e, o));
                acc
            },
        );
        assert_eq!(c.ops(), ["dequeue", "start", "start"]);
    }

    #[test]
    fn repair_drain() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node);
        assert_eq!(c.run()[0].1, Action::StartDrain("node4".into()));
    }

    #[test]
    fn repair_drain_wait_completion() {
        let c = case()
            .need_drain()
            .eviction_timeout(60)
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 30)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_drain_wait_completion_expire() {
        let c = case()
            .need_drain()
            .eviction_timeout(60)
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 120)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), ["drain-timeout"]);
    }

    #[test]
    fn repair_drain_wait_completion_default_timeout() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 300)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_drain_wait_completion_expire_default_timeout() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 1200)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), ["drain-timeout"]);
    }

    #[test]
    fn repair_drain_wait_retry() {
        let now = t0();
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node)
            .e(|e| e.drain_backoff_expire = Some(now + secs(60)));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_drain_wait_retry_expire() {
        let now = t0();
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node)
            .e(|e| e.drain_backoff_expire = Some(now - secs(60)));
        assert_eq!(c.ops(), ["drain-start"]);
    }

    #[test]
    fn repair_drain_completed() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 0)
            .o(node)
            .o(|o| o.drain = TaskObs::Finished(DrainEnd::Done));
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 0 });
    }

    #[test]
    fn repair_drain_completed_wins_over_timeout() {
        let c = case()
            .need_drain()
            .eviction_timeout(60)
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 120)
            .o(node)
            .o(|o| o.drain = TaskObs::Finished(DrainEnd::Done));
        assert_eq!(c.ops(), ["execute"]);
    }

    #[test]
    fn repair_drain_abandoned_by_drainer_backs_off() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 0)
            .o(node)
            .o(|o| o.drain = TaskObs::Finished(DrainEnd::Abandoned("protected job pod".into())));
        assert_eq!(
            c.run()[0].1,
            Action::AbandonDrain("protected job pod".into())
        );
    }

    #[test]
    fn repair_draining_after_restart_resumes_the_drain() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 10)
            .o(node);
        assert_eq!(c.ops(), ["drain-resume"]);
    }

    #[test]
    fn repair_watch() {
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_watch_runs_the_health_check_every_interval() {
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30);
        assert_eq!(c.ops(), ["health-check"], "first check at once");
        let c = c.o(|o| health(o, false, 2));
        assert_eq!(c.ops(), ["health-check"], "again after the interval");
    }

    #[test]
    fn repair_watch_expire() {
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(120)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), ["next-step"]);
    }

    #[test]
    fn repair_watch_expire_default_timeout() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), ["next-step"]);
    }

    #[test]
    fn repair_watch_expire_waits_for_one_health_check() {
        let c = case().entry("10.0.0.4", "type1", "op1").watching_since(30);
        assert_eq!(c.ops(), ["health-check"]);
        let c = c.o(|o| o.health.running = true);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_watch_expire_last_step() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .e(|e| e.step = 1)
            .o(|o| health(o, false, 0));
        match &c.run()[0].1 {
            Action::Fail { reason, .. } => assert!(reason.contains("last step"), "{reason}"),
            a => panic!("{a:?}"),
        }
    }

    #[test]
    fn repair_next_step_then_executes_it() {
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(120)
            .o(|o| health(o, false, 0));
        let (e, _) = &c.entries[0];
        let (n, ev) =
            transition(e, c.op(), &Action::NextStep, c.now, &|| None, &mut |_| 0).unwrap();
        assert_eq!(
            (n.step, n.step_status, &n.phase),
            (1, RepairStepStatus::Waiting, &Phase::Idle)
        );
        assert_eq!(ev.event, "next-step");
        let c = c.e(|e| *e = n).o(|o| *o = Observations::default());
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 0 });
    }

    #[test]
    fn repair_completed() {
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .o(|o| health(o, true, 0));
        assert_eq!(c.ops(), ["healthy"]);
        let (e, _) = &c.entries[0];
        let (n, _) = transition(e, c.op(), &Action::Healthy, c.now, &|| None, &mut |_| 0).unwrap();
        assert_eq!(n.status, RepairStatus::Succeeded);
    }

    #[test]
    fn health_check_passing_mid_step_finishes_before_the_watch_expires() {
        let c = case()
            .watch(3600)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(1)
            .o(|o| health(o, true, 0));
        assert_eq!(c.ops(), ["healthy"]);
    }

    #[test]
    fn health_check_pass_wins_over_watch_expiry() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(600)
            .e(|e| e.step = 1)
            .o(|o| health(o, true, 0));
        assert_eq!(c.ops(), ["healthy"]);
    }

    #[test]
    fn repair_succeeded() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .e(|e| e.status = RepairStatus::Succeeded);
        assert!(c.run().is_empty());
    }

    #[test]
    fn repair_failed() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .e(|e| e.status = RepairStatus::Failed);
        assert!(c.run().is_empty());
    }

    #[test]
    fn repair_deleted() {
        for status in RepairStatus::ALL {
            let c = case().entry("10.0.0.4", "type1", "op1").e(|e| {
                e.status = status;
                e.deleted = true;
            });
            assert_eq!(c.ops(), ["dequeue"], "{status:?}");
        }
    }

    #[test]
    fn repair_deleted_while_running_is_dequeued() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(1)
            .e(|e| {
                e.phase = Phase::Command { attempt: 0 };
                e.deleted = true;
            })
            .o(|o| o.command = TaskObs::Running);
        assert_eq!(c.ops(), ["dequeue"]);
    }

    #[test]
    fn repair_disabled() {
        let c = case().disabled().entry("10.0.0.4", "type1", "op1");
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_waiting_does_not_execute() {
        let c = case()
            .disabled()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_drain() {
        let c = case()
            .disabled()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_drain_wait_completion() {
        let c = case()
            .disabled()
            .need_drain()
            .eviction_timeout(60)
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 30)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), ["drain-timeout"]);
    }

    #[test]
    fn repair_disabled_drain_wait_completion_expire() {
        let c = case()
            .disabled()
            .need_drain()
            .eviction_timeout(60)
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 120)
            .o(node)
            .o(|o| o.drain = TaskObs::Running);
        assert_eq!(c.ops(), ["drain-timeout"]);
    }

    #[test]
    fn repair_disabled_drain_wait_retry() {
        let now = t0();
        let c = case()
            .disabled()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node)
            .e(|e| e.drain_backoff_expire = Some(now + secs(60)));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_drain_wait_retry_expire() {
        let now = t0();
        let c = case()
            .disabled()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .o(node)
            .e(|e| e.drain_backoff_expire = Some(now - secs(60)));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_drain_completed() {
        let c = case()
            .disabled()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 0)
            .o(node)
            .o(|o| o.drain = TaskObs::Finished(DrainEnd::Done));
        assert_eq!(c.ops(), ["drain-timeout"]);
    }

    #[test]
    fn repair_disabled_watch() {
        let c = case()
            .disabled()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_watch_still_runs_health_checks() {
        let c = case()
            .disabled()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30);
        assert_eq!(c.ops(), ["health-check"]);
    }

    #[test]
    fn repair_disabled_watch_expire() {
        let c = case()
            .disabled()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(120)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_disabled_watch_expire_last_step() {
        let c = case()
            .disabled()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .e(|e| e.step = 1)
            .o(|o| health(o, false, 0));
        assert_eq!(c.ops(), ["fail"]);
    }

    #[test]
    fn repair_disabled_completed() {
        let c = case()
            .disabled()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .o(|o| health(o, true, 0));
        assert_eq!(c.ops(), ["healthy"]);
    }

    #[test]
    fn repair_disabled_success_command_still_runs() {
        let c = case()
            .disabled()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(30)
            .e(|e| e.phase = Phase::SuccessCommand);
        assert_eq!(c.ops(), ["success-command"]);
    }

    #[test]
    fn repair_disabled_deleted() {
        let c = case()
            .disabled()
            .entry("10.0.0.4", "type1", "op1")
            .e(|e| e.deleted = true);
        assert_eq!(c.ops(), ["dequeue"]);
    }

    #[test]
    fn repair_disabled_bad_operation_still_fails() {
        let c = case().disabled().entry("10.0.0.4", "type1", "nope");
        assert_eq!(c.ops(), ["fail"]);
    }

    #[test]
    fn repair_step_out_of_range_fails() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0)
            .e(|e| e.step = 2);
        match &c.run()[0].1 {
            Action::Fail { reason, .. } => assert!(reason.contains("out of range"), "{reason}"),
            a => panic!("{a:?}"),
        }
    }

    // ---- commands ----

    fn command_phase(c: Case, attempt: u32, end: Option<CommandEnd>) -> Case {
        c.processing(RepairStepStatus::Watching, 0)
            .e(|e| e.phase = Phase::Command { attempt })
            .o(|o| o.command = end.map(TaskObs::Finished).unwrap_or(TaskObs::Running))
    }

    fn end(ok: bool) -> CommandEnd {
        CommandEnd {
            ok,
            summary: if ok { "exit status 0" } else { "exit status 1" }.into(),
            output: "out".into(),
            unknown_since: None,
        }
    }

    #[test]
    fn repair_command_running_holds() {
        let c = command_phase(case().entry("10.0.0.4", "type1", "op1"), 0, None);
        assert_eq!(c.ops(), Vec::<&str>::new());
    }

    #[test]
    fn repair_command_succeeded_starts_watching() {
        let c = command_phase(case().entry("10.0.0.4", "type1", "op1"), 0, Some(end(true)));
        assert_eq!(c.ops(), ["command-done"]);
        let (e, _) = &c.entries[0];
        let (n, ev) = transition(e, c.op(), &c.run()[0].1, c.now, &|| None, &mut |_| 0).unwrap();
        assert_eq!(n.phase, Phase::Watching { since: c.now });
        assert_eq!(ev.output, "out");
    }

    #[test]
    fn repair_command_failure_fails_the_entry() {
        let c = command_phase(
            case().entry("10.0.0.4", "type1", "op1"),
            0,
            Some(end(false)),
        );
        match &c.run()[0].1 {
            Action::Fail { reason, output } => {
                assert!(reason.contains("exit status 1"), "{reason}");
                assert_eq!(output, "out");
            }
            a => panic!("{a:?}"),
        }
    }

    #[test]
    fn failed_agent_step_escalates_to_the_next_step_but_fails_the_entry_when_last() {
        use crate::repair::config::AgentStep;
        let mut c = command_phase(
            case().entry("10.0.0.4", "type1", "op1"),
            0,
            Some(end(false)),
        );
        c.config.repair_procedures[0].repair_operations[0].repair_steps[0].repair_command =
            CommandSpec::Agent(AgentStep::RestartUnit("kubelet".into()));
        assert_eq!(c.ops(), ["escalate"]);
        let e = &c.entries[0].0;
        let (n, ev) = transition(e, c.op(), &c.run()[0].1, c.now, &|| None, &mut |_| 0).unwrap();
        assert_eq!((n.step, n.step_status), (1, RepairStepStatus::Waiting));
        assert_eq!(n.status, RepairStatus::Processing);
        assert_eq!(ev.event, "escalated");
        assert!(ev.detail.contains("exit status 1"), "{}", ev.detail);
        // The same failure on the last step fails the entry, as any command does.
        c.config.repair_procedures[0].repair_operations[0].repair_steps[1].repair_command =
            CommandSpec::Agent(AgentStep::Reboot);
        let c = c.e(|e| e.step = 1);
        assert_eq!(c.ops(), ["fail"]);
    }

    #[test]
    fn repair_command_retries_after_interval() {
        let mut c = command_phase(
            case().entry("10.0.0.4", "type1", "op1"),
            0,
            Some(end(false)),
        );
        c.config.repair_procedures[0].repair_operations[0].repair_steps[0].command_retries = 1;
        c.config.repair_procedures[0].repair_operations[0].repair_steps[0].command_interval = 5;
        let until = c.now + secs(5);
        assert!(
            matches!(&c.run()[0].1, Action::RetryLater { attempt: 1, until: u, .. } if *u == until)
        );
        let c = c
            .e(|e| e.phase = Phase::RetryWait { attempt: 1, until })
            .o(|o| o.command = TaskObs::NotStarted);
        assert_eq!(c.ops(), Vec::<&str>::new());
        let mut c = c;
        c.now = until;
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 1 });
        // The retry fails too: no retries left.
        let c = command_phase(c, 1, Some(end(false)));
        assert_eq!(c.ops(), ["fail"]);
    }

    /// Issue 34: a cycle whose outcome is unknown (the gateway restarted while it ran it) is
    /// not retried blind: the step holds for the agent's evidence, retries only when the
    /// agent reported the old boot id after the outcome became unknown, and otherwise
    /// escalates (not the last step) or fails the entry (the last), saying why.
    #[test]
    fn a_power_action_of_unknown_outcome_is_retried_only_on_the_agents_evidence() {
        let unknown = |c: Case, step: u32| {
            let since = c.now;
            let mut c = command_phase(c.e(|e| e.step = step), 0, Some(end(false)))
                .e(|e| e.boot_id_before = "boot-a".into())
                .o(|o| {
                    if let TaskObs::Finished(end) = &mut o.command {
                        end.unknown_since = Some(since);
                    }
                });
            c.config.repair_procedures[0].repair_operations[0].repair_steps[step as usize]
                .command_retries = 1;
            c
        };
        let wait = UNKNOWN_EVIDENCE_WAIT.as_secs();
        let mut c = unknown(case().entry("10.0.0.4", "type1", "op1"), 0);
        assert!(
            matches!(&c.run()[0].1, Action::Hold(r) if r.contains("outcome is unknown")),
            "{:?}",
            c.run()
        );
        // The agent's last report is from before the outcome became unknown, or from
        // another boot: no evidence, still holding.
        for (boot, at) in [("boot-a", -1), ("boot-b", 5)] {
            c = c.o(|o| {
                o.agent = Some(AgentSeen {
                    boot_id: boot.into(),
                    last_report: t0() + secs(at),
                })
            });
            assert_eq!(c.ops(), Vec::<&str>::new(), "{boot} at {at}");
        }
        // Past the wait without evidence: the step escalates, naming why.
        c.now = t0() + secs(wait);
        match &c.run()[0].1 {
            Action::Escalate { summary, .. } => {
                assert!(summary.contains("not retried"), "{summary}")
            }
            other => panic!("{other:?}"),
        }
        // On the last step it fails the entry instead.
        let mut last = unknown(case().entry("10.0.0.4", "type1", "op1"), 1);
        last.now = t0() + secs(wait);
        match &last.run()[0].1 {
            Action::Fail { reason, .. } => assert!(reason.contains("not retried"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // The agent reported the old boot after the outcome became unknown: the machine
        // was not cycled, so the retry goes ahead as usual.
        let c = unknown(case().entry("10.0.0.4", "type1", "op1"), 0).o(|o| {
            o.agent = Some(AgentSeen {
                boot_id: "boot-a".into(),
                last_report: t0() + secs(3),
            })
        });
        assert!(
            matches!(&c.run()[0].1, Action::RetryLater { attempt: 1, .. }),
            "{:?}",
            c.run()
        );
        // Without retries left, an unknown outcome escalates at once too (no evidence is
        // awaited: nothing would be retried).
        let mut c = unknown(case().entry("10.0.0.4", "type1", "op1"), 0);
        c.config.repair_procedures[0].repair_operations[0].repair_steps[0].command_retries = 0;
        assert_eq!(c.ops(), ["escalate"]);
    }

    #[test]
    fn interrupted_command_is_run_again_after_restart_but_a_completed_one_is_not() {
        let c = command_phase(case().entry("10.0.0.4", "type1", "op1"), 0, None)
            .o(|o| o.command = TaskObs::NotStarted);
        assert_eq!(c.run()[0].1, Action::Execute { attempt: 0 });
        let c = case()
            .watch(60)
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(10);
        assert_eq!(
            c.ops(),
            ["health-check"],
            "a completed command is not run again"
        );
    }

    #[test]
    fn success_command_failure_turns_success_into_failure() {
        let mut c = case()
            .entry("10.0.0.4", "type1", "op1")
            .watching_since(10)
            .o(|o| health(o, true, 0));
        c.config.repair_procedures[0].repair_operations[0].success_command =
            Some(CommandSpec::External(vec!["notify".into()]));
        let (e, _) = &c.entries[0];
        let (n, _) = transition(e, c.op(), &Action::Healthy, c.now, &|| None, &mut |_| 0).unwrap();
        assert_eq!(
            (n.status, &n.phase),
            (RepairStatus::Processing, &Phase::SuccessCommand)
        );
        let c = c.e(|e| *e = n).o(|o| *o = Observations::default());
        assert_eq!(c.ops(), ["success-command"]);
        let c = c.o(|o| o.command = TaskObs::Finished(end(false)));
        match &c.run()[0].1 {
            Action::Fail { reason, .. } => {
                assert!(reason.contains("success command failed"), "{reason}")
            }
            a => panic!("{a:?}"),
        }
        let c = c.o(|o| o.command = TaskObs::Finished(end(true)));
        assert_eq!(c.ops(), ["succeed"]);
    }

    #[test]
    fn health_checks_of_different_entries_are_decided_independently() {
        // Two watched entries: one's check is running (possibly hung until its timeout), the
        // other's check is started and its pass is acted on, in the same pass.
        let c = case()
            .max(3)
            .entry("10.0.0.1", "type1", "op1")
            .watching_since(1)
            .o(|o| o.health.running = true)
            .entry("10.0.0.2", "type1", "op1")
            .watching_since(1)
            .entry("10.0.0.3", "type1", "op1")
            .watching_since(1)
            .o(|o| health(o, true, 0));
        let c = c.watch(60);
        assert_eq!(c.ops(), ["health-check", "healthy"]);
    }

    // ---- drain backoff ----

    #[test]
    fn drain_timeout_backoff_is_linear_with_injected_randomness() {
        let now = t0();
        let mut seen = Vec::new();
        let mut rand = |n: u64| {
            seen.push(n);
            n / 2
        };
        assert_eq!(
            drain_backoff_expire(now, 1, &mut rand),
            now + secs(300 + 150)
        );
        assert_eq!(
            drain_backoff_expire(now, 3, &mut rand),
            now + secs(300 + 450)
        );
        assert_eq!(seen, [300, 900]);
        // rand's contract is 0..n; a bad generator is clamped.
        assert_eq!(
            drain_backoff_expire(now, 1, &mut |n| n * 10),
            now + secs(300 + 299)
        );
    }

    #[test]
    fn abandon_drain_counts_and_sets_backoff() {
        let c = case()
            .need_drain()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Draining, 700)
            .o(node)
            .e(|e| e.drain_backoff_count = 1);
        let a = &c.run()[0].1;
        assert!(matches!(a, Action::AbandonDrain(_)));
        let (e, _) = &c.entries[0];
        let (n, ev) = transition(e, c.op(), a, c.now, &|| None, &mut |_| 7).unwrap();
        assert_eq!(n.step_status, RepairStepStatus::Waiting);
        assert_eq!(n.drain_backoff_count, 2);
        assert_eq!(n.drain_backoff_expire, Some(c.now + secs(307)));
        assert_eq!(ev.event, "drain-abandoned");
        // The history says when in whole seconds, however precise the clock.
        let at = c.now + SignedDuration::from_nanos(123_456_789);
        let (_, ev) = transition(e, c.op(), a, at, &|| None, &mut |_| 7).unwrap();
        assert!(
            ev.detail.contains(&format!(
                "not before {}",
                (at + secs(307)).round(jiff::Unit::Second).unwrap()
            )),
            "{}",
            ev.detail
        );
        assert!(!ev.detail.contains(".123"), "{}", ev.detail);
        // While the backoff runs, nothing; after it, the drain starts again.
        let mut c = c.e(|e| *e = n).o(|o| o.drain = TaskObs::NotStarted);
        assert_eq!(c.ops(), Vec::<&str>::new());
        c.now += secs(307);
        assert_eq!(c.ops(), ["drain-start"]);
    }

    #[test]
    fn execute_remembers_boot_id_for_power_steps() {
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0);
        let mut power = c.op().unwrap().clone();
        power.repair_steps[0].repair_command = CommandSpec::Builtin(Builtin::PowerCycle);
        let (e, _) = &c.entries[0];
        let (n, ev) = transition(
            e,
            Some(&power),
            &Action::Execute { attempt: 0 },
            c.now,
            &|| Some("boot-a".into()),
            &mut |_| 0,
        )
        .unwrap();
        assert_eq!(n.boot_id_before, "boot-a");
        assert_eq!(
            (n.step_status, &n.phase),
            (RepairStepStatus::Watching, &Phase::Command { attempt: 0 })
        );
        assert_eq!(ev.event, "command-started");
        let (again, ev) = transition(
            &n,
            Some(&power),
            &Action::Execute { attempt: 0 },
            c.now,
            &|| Some("boot-b".into()),
            &mut |_| 0,
        )
        .unwrap();
        assert!(ev.detail.contains("restarted"), "{}", ev.detail);
        assert_eq!(
            again.boot_id_before, "boot-a",
            "a resumed attempt keeps the first boot id"
        );
        let (next, _) = transition(
            &again,
            c.op(),
            &Action::Execute { attempt: 1 },
            c.now,
            &|| Some("boot-c".into()),
            &mut |_| 0,
        )
        .unwrap();
        assert_eq!(next.boot_id_before, "", "a non-power attempt clears it");
    }

    #[test]
    fn history_names_the_attempt_of_the_power_request_id() {
        use crate::repair::entry::{RequestFor, power_request_id};
        let c = case()
            .entry("10.0.0.4", "type1", "op1")
            .processing(RepairStepStatus::Waiting, 0);
        let (e, _) = &c.entries[0];
        let run = |e: &Entry, action: &Action| {
            transition(e, c.op(), action, c.now, &|| None, &mut |_| 0).unwrap()
        };
        let (n, started) = run(e, &Action::Execute { attempt: 0 });
        assert_eq!(started.detail, "step 0 attempt 0");
        let id = power_request_id(
            "aa11",
            1,
            RequestFor::Repair {
                step: 0,
                attempt: 0,
            },
        );
        assert!(id.ends_with("-step0-attempt0"), "{id}");
        let (_, failed) = run(
            &n,
            &Action::RetryLater {
                attempt: 1,
                until: c.now,
                summary: "exit 1".into(),
                output: String::new(),
            },
        );
        assert!(
            failed
                .detail
                .starts_with("step 0 attempt 0: exit 1; attempt 1 at "),
            "{}",
            failed.detail
        );
    }
}
