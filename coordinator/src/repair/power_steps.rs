//! The power built-ins of the repair queue: `@power-cycle`, `@power-off`, `@power-on` and
//! `@fence` (through a fence flow when there is a cluster to release from, else a power-off
//! confirmed off and, unless kept off, a power-on), sent to the rack's gateway with the
//! step's request id. A gateway that cannot be reached holds the step instead of failing
//! it (see [`power`]).

use std::time::Duration;

use protocol::gateway::{PowerAction, PowerOutcome, PowerRequest};

use super::config::Builtin;
use super::decide::CommandEnd;
use super::fencing::{FenceEnd, describe};
use super::run_context::{Outcome, RunContext};
use crate::fence::flow::State;
use crate::fence::proof::fence_confirmed;

/// First pause before resending a power request whose gateway could not be reached.
///
/// 1 s: a gateway restarting (upgrade, crash with systemd's `RestartSec=5s`) is back within
/// seconds; sooner only spins on a dead address.
pub(super) const HOLD_FIRST_PAUSE: Duration = Duration::from_secs(1);

/// Longest pause between resends while holding: the backoff doubles up to this. 10 s keeps
/// the step punctual when the gateway returns (at most 10 s late) at one handshake per 10 s
/// against a dead address.
pub(super) const HOLD_MAX_PAUSE: Duration = Duration::from_secs(10);

/// How many times an off, an on or a fence is sent again under a new id when the gateway
/// answers that it restarted while running it ("outcome unknown"). More would only follow a
/// gateway that keeps crashing.
pub(super) const MAX_RESENDS: u32 = 3;

/// How a power built-in waited for an unreachable gateway, for the summary.
struct Held {
    since: tokio::time::Instant,
    attempts: u32,
    /// How many of the attempts were sent and their answers lost.
    lost: u32,
    last: String,
}

impl Held {
    fn describe(&self) -> String {
        let why = match self.lost {
            0 => "for an unreachable gateway".to_string(),
            n => format!(
                "for the gateway: its answer was lost {n} time(s) (it may have acted) and the \
                 request was sent again with the same id, which it carries out at most once"
            ),
        };
        format!(
            "held {} s {why} over {} attempts (last: {})",
            self.since.elapsed().as_secs(),
            self.attempts,
            self.last
        )
    }
}

/// `@fence` with a cluster: runs the fence flow (power off, confirm, release, power on,
/// restore) and succeeds when it is done; a machine that is not a node has nothing to
/// release and is only powered off and confirmed off.
pub(super) async fn fence(ctx: &RunContext) -> (CommandEnd, Outcome) {
    let Some(svc) = &ctx.fence else {
        return fence_without_release(ctx).await;
    };
    // The flow is committed (and recorded for this step) before anything acts; the agent's
    // diagnostics are taken next, before the flow's first power action.
    let flow = match svc
        .flow_for_step(&ctx.request_id, ctx.entry_index, &ctx.address, &ctx.serial)
        .await
    {
        Ok(Some(id)) => id,
        Ok(None) => return fence_without_release(ctx).await,
        Err(e) => {
            let end = CommandEnd {
                ok: false,
                summary: format!("@fence: {e}"),
                output: String::new(),
                unknown_since: None,
            };
            return (end, Outcome::Error);
        }
    };
    // A silent agent's connection may not be known dead yet (QUIC idle timeout): asking it
    // would only spend the diagnostics bound before the power-off of a dead machine.
    let diagnostics = if ctx.agents.is_unreachable(&ctx.address) {
        String::new()
    } else {
        // The flow waits in `plan` meanwhile: its history says why.
        let line = format!(
            "taking the agent's diagnostics before the power-off (at most {} s)",
            super::agent_steps::DIAGNOSTICS_BEFORE_POWER_TIMEOUT.as_secs()
        );
        if let Err(e) = svc.runner().say_while(flow, State::Plan, line).await {
            tracing::warn!(flow, error = %e, "cannot note the diagnostics in the fence flow's history");
        }
        super::agent_steps::diagnostics_before_power(ctx).await
    };
    let end = svc
        .fence_step(
            &ctx.request_id,
            ctx.entry_index,
            &ctx.address,
            &ctx.serial,
            ctx.timeout,
        )
        .await;
    let (ok, summary, output, outcome) = match end {
        FenceEnd::NotANode => return fence_without_release(ctx).await,
        FenceEnd::Done(f) => (true, describe(&f), String::new(), Outcome::Ok),
        FenceEnd::Failed(f) => (
            false,
            describe(&f),
            f.failure.clone().unwrap_or_default(),
            Outcome::Failed,
        ),
        FenceEnd::Error(e) => (false, format!("@fence: {e}"), String::new(), Outcome::Error),
    };
    (
        CommandEnd {
            ok,
            summary: format!("{summary}{diagnostics}"),
            output,
            unknown_since: None,
        },
        outcome,
    )
}

/// `@fence` of a machine with nothing to release (not a Kubernetes node, or no cluster):
/// powered off and confirmed off, then powered on again, as a fence flow does, unless
/// `[fence] keep_off` keeps it off. The power-on is its own request (`<id>-on`), so a step
/// run again after a restart fetches both answers instead of acting twice; it gets what is
/// left of the step's time limit.
///
/// It runs as a task of its own, which the step only awaits: a step that is dropped (its
/// entry deleted mid-way, or its time limit) leaves the off and the on to run to their end,
/// as a fence flow does, so a machine is never left off because its entry went away.
pub(super) async fn fence_without_release(ctx: &RunContext) -> (CommandEnd, Outcome) {
    let awaited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let guard = Awaited(awaited.clone());
    let c = ctx.clone();
    let task = tokio::spawn(async move {
        let (end, outcome) = off_then_on(&c).await;
        if !awaited.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!(machine = %c.address, id = %c.request_id, ok = end.ok, summary = %end.summary, "@fence of a machine with nothing to release ran to its end after its step stopped (entry deleted or step timed out)");
        }
        (end, outcome)
    });
    let answer = task.await;
    drop(guard);
    match answer {
        Ok(a) => a,
        Err(e) => (
            CommandEnd {
                ok: false,
                summary: format!("@fence: {e}"),
                output: String::new(),
                unknown_since: None,
            },
            Outcome::Error,
        ),
    }
}

/// Clears its flag when dropped while the task it watches still runs: nobody awaits the
/// task any more.
struct Awaited(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Awaited {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// [`fence_without_release`]'s work: the confirmed off, then the on unless kept off.
async fn off_then_on(ctx: &RunContext) -> (CommandEnd, Outcome) {
    let started = tokio::time::Instant::now();
    let limits = ctx.fence_timeouts.as_ref().map(|t| t(&ctx.address));
    let waited = match wait_for_dump(Builtin::Fence, ctx, started).await {
        Ok(Some(w)) => format!("{w}; "),
        Ok(None) => String::new(),
        Err(end) => return (end, Outcome::Failed),
    };
    // `[fence] off_timeout` bounds the off as it bounds a flow's: a BMC that accepts the off
    // but never reads off fails the step then, not when the step's limit runs out.
    let off_ctx = RunContext {
        timeout: within(
            ctx.timeout.map(|t| t.saturating_sub(started.elapsed())),
            limits.map(|l| l.off),
        ),
        ..ctx.clone()
    };
    let (mut off, outcome) = power(Builtin::Fence, &off_ctx).await;
    off.summary = format!("{waited}{}", off.summary);
    if !off.ok {
        return (off, outcome);
    }
    let keep_off = ctx.keep_off.as_ref().is_none_or(|k| k(&ctx.address));
    if keep_off {
        let end = CommandEnd {
            summary: format!(
                "{}; nothing to release (not a Kubernetes node) and kept off ([fence] keep_off)",
                off.summary
            ),
            ..off
        };
        return (end, outcome);
    }
    let on_ctx = RunContext {
        request_id: format!("{}-on", ctx.request_id),
        timeout: within(
            ctx.timeout.map(|t| t.saturating_sub(started.elapsed())),
            limits.map(|l| l.on),
        ),
        ..ctx.clone()
    };
    let (on, outcome) = power(Builtin::PowerOn, &on_ctx).await;
    let end = CommandEnd {
        ok: on.ok,
        summary: format!(
            "{}; nothing to release (not a Kubernetes node); then {}",
            off.summary, on.summary
        ),
        output: [off.output, on.output]
            .into_iter()
            .filter(|o| !o.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        unknown_since: None,
    };
    (end, outcome)
}

/// How often a fence of a dumping machine reads the kdump view again.
///
/// 1 s: the view is in memory, and "dump done" then starts the off within a second.
const DUMP_POLL: Duration = Duration::from_secs(1);

/// Holds the off of a machine whose kdump initramfs said "dumping" (a power-off would lose
/// the dump) until "dump done", the dump no longer reported, or its kdump timeout; says how
/// long it waited (`None` when it did not). Fails, with nothing powered off, when the step's
/// limit runs out first.
async fn wait_for_dump(
    b: Builtin,
    ctx: &RunContext,
    started: tokio::time::Instant,
) -> Result<Option<String>, CommandEnd> {
    use crate::fence::kdump::DumpSeen;
    let Some(view) = &ctx.kdump else {
        return Ok(None);
    };
    let mut waited = false;
    while let DumpSeen::Dumping {
        started: at,
        timeout,
    } = view.dump(&ctx.address)
    {
        let ends = jiff::SignedDuration::try_from(timeout)
            .ok()
            .and_then(|d| at.checked_add(d).ok())
            .unwrap_or(jiff::Timestamp::MAX);
        if jiff::Timestamp::now() >= ends {
            break;
        }
        if ctx
            .timeout
            .is_some_and(|t| started.elapsed() + DUMP_POLL > t)
        {
            return Err(CommandEnd {
                ok: false,
                summary: format!(
                    "{}: the machine is still writing its crash dump (dumping since {at}, \
                     kdump timeout at {ends}); nothing powered off within the step's time limit",
                    b.name()
                ),
                output: String::new(),
                unknown_since: None,
            });
        }
        waited = true;
        tokio::time::sleep(DUMP_POLL).await;
    }
    Ok(waited.then(|| {
        format!(
            "waited {} s for the machine's crash dump to end",
            started.elapsed().as_secs()
        )
    }))
}

/// The smaller of the step's limit and a `[fence]` limit, either of which may be absent.
fn within(step: Option<Duration>, fence: Option<Duration>) -> Option<Duration> {
    match (step, fence) {
        (Some(s), Some(f)) => Some(s.min(f)),
        (s, f) => s.or(f),
    }
}

/// The part of `left` a power request gives the gateway: all but a tenth, at most 2 s, kept
/// for its answer to travel back.
pub(super) fn gateway_share(left: Duration) -> Duration {
    left.saturating_sub((left / 10).min(Duration::from_secs(2)))
}

/// Sends a power built-in. A gateway that cannot be reached (nothing sent) or whose answer
/// was lost (maybe sent) does not fail the step: the request is resent with the same id, with
/// backoff, until the step's time limit, like a drain holds while the Kubernetes API is down.
/// The gateway executes an id at most once, so a resend can only fetch the first result.
pub(super) async fn power(b: Builtin, ctx: &RunContext) -> (CommandEnd, Outcome) {
    let action = match b {
        Builtin::PowerCycle => PowerAction::Cycle,
        Builtin::PowerOff => PowerAction::Off,
        Builtin::PowerOn => PowerAction::On,
        Builtin::Fence => PowerAction::Fence,
        Builtin::AgentHealthy => unreachable!("not a power action"),
    };
    // Evidence before force: the agent's diagnostics, if it is there to give them, within a
    // short bound that never delays the action much (and counts against the step's limit).
    let started = tokio::time::Instant::now();
    // A power-off or cycle during a crash dump would lose the dump: wait for it to end, as
    // a fence does (an `@fence` waited before it got here).
    let dump = if matches!(b, Builtin::PowerCycle | Builtin::PowerOff) {
        match wait_for_dump(b, ctx, started).await {
            Ok(w) => w.map(|w| format!(" ({w})")).unwrap_or_default(),
            Err(end) => return (end, Outcome::Failed),
        }
    } else {
        String::new()
    };
    let diagnostics = if matches!(b, Builtin::PowerCycle | Builtin::PowerOff | Builtin::Fence) {
        super::agent_steps::diagnostics_before_power(ctx).await
    } else {
        String::new()
    };
    let deadline = ctx.timeout.map(|t| started + t);
    let mut held: Option<Held> = None;
    let mut pause = HOLD_FIRST_PAUSE;
    // The id sent: the step's, then `<id>-resend<n>` after an "outcome unknown" answer.
    // Derived, not drawn, so a step run again after a coordinator restart fetches the same
    // answers instead of acting again.
    let mut id = ctx.request_id.clone();
    let mut resends = 0;
    // Whether the request may have reached the gateway (for the summary of a timeout).
    let mut maybe_sent = false;
    let note = |held: &Option<Held>| {
        held.as_ref()
            .map(|h| format!(" ({})", h.describe()))
            .unwrap_or_default()
    };
    let answer = loop {
        let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        let req = PowerRequest {
            id: id.clone(),
            address: ctx.address.clone(),
            serial: ctx.serial.clone(),
            action,
            // What is left of the step's limit, so a resend does not run past it, less a
            // margin: a gateway that gives up at its limit then answers (what it last saw)
            // before this side gives up on it.
            timeout_ms: left
                .map(|d| gateway_share(d).as_millis().max(1) as u64)
                .unwrap_or(0),
        };
        let call = ctx.power.power(req.clone());
        let answer = match left {
            Some(t) => match tokio::time::timeout(t, call).await {
                Ok(a) if !t.is_zero() => a,
                _ => {
                    let t = ctx.timeout.unwrap_or_default();
                    // Say what was awaited: the gateway may still be carrying the request
                    // out (one sent before a coordinator restart keeps its own limit), unless
                    // it could not even be reached.
                    let unreached = held.is_some() && !maybe_sent;
                    let why = if unreached {
                        "the gateway could not be reached"
                    } else {
                        "the gateway may still be carrying it out (it acts on a request id \
                         once; a retry of this step is a new request)"
                    };
                    return (
                        CommandEnd {
                            ok: false,
                            summary: format!(
                                "{} timed out after {} s waiting for the gateway's answer to \
                                 request {id}; {why}{}",
                                b.name(),
                                t.as_secs(),
                                note(&held)
                            ),
                            output: String::new(),
                            // Still running at the gateway, maybe: a cycle sent again
                            // under the retry's id would be a second one.
                            unknown_since: (!unreached && !action.is_idempotent())
                                .then(jiff::Timestamp::now),
                        },
                        Outcome::Timeout,
                    );
                }
            },
            None => call.await,
        };
        match answer {
            Err(e) if e.is_retriable() => {
                let h = held.get_or_insert_with(|| {
                    tracing::warn!(machine = %ctx.address, id = %ctx.request_id, error = %e, "power: gateway unreachable or its answer lost; holding the step and resending with the same id");
                    Held {
                        since: tokio::time::Instant::now(),
                        attempts: 0,
                        lost: 0,
                        last: String::new(),
                    }
                });
                h.attempts += 1;
                h.lost += u32::from(e.may_have_reached_gateway());
                h.last = e.to_string();
                maybe_sent |= e.may_have_reached_gateway();
                let wait = match deadline {
                    Some(d) => pause.min(d.saturating_duration_since(tokio::time::Instant::now())),
                    None => pause,
                };
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(HOLD_MAX_PAUSE);
            }
            Ok(resp)
                if resp.outcome.is_outcome_unknown()
                    && action.is_idempotent()
                    && resends < MAX_RESENDS =>
            {
                // The gateway restarted while it ran `id`: whether it reached the BMC is
                // unknown. Doing an off or an on again is harmless; giving up would leave
                // the machine as the crash left it, maybe off.
                resends += 1;
                id = format!("{}-resend{resends}", ctx.request_id);
                tracing::warn!(machine = %ctx.address, id = %req.id, resend = %id, "power: the gateway restarted while it ran the request; sending it again under a new id");
            }
            other => break (req, other),
        }
    };
    let resent = if resends > 0 {
        format!(" (sent again as {id}: the gateway restarted while it ran the first)")
    } else {
        String::new()
    };
    let held = format!("{resent}{}{dump}{diagnostics}", note(&held));
    let (req, answer) = answer;
    // The gateway restarted while it ran a cycle, which is not sent again (a second cycle
    // reboots again): the step fails, and says so to the decision, which retries it only on
    // evidence that the first did not happen ([`super::decide`]).
    let unknown_since = match &answer {
        Ok(r) if r.outcome.is_outcome_unknown() && !action.is_idempotent() => {
            Some(jiff::Timestamp::now())
        }
        _ => None,
    };
    match answer {
        Err(e) => (
            CommandEnd {
                ok: false,
                summary: format!("{}: {e}{held}", b.name()),
                output: String::new(),
                unknown_since: None,
            },
            Outcome::Error,
        ),
        Ok(resp) => match (
            // `@fence` needs power-off confirmed as `crate::fence::proof` defines it.
            (b == Builtin::Fence).then(|| fence_confirmed(&req, &resp)),
            resp.outcome,
        ) {
            (Some(Err(e)), PowerOutcome::Done { detail, .. }) => (
                CommandEnd {
                    ok: false,
                    summary: format!("@fence: {e}{held}"),
                    output: detail,
                    unknown_since: None,
                },
                Outcome::Failed,
            ),
            (_, PowerOutcome::Done { detail, state, .. }) => (
                CommandEnd {
                    ok: true,
                    summary: match powered_on_only(&detail) {
                        // The gateway did not cycle: it says why (off, or another request's
                        // cycle under way), and the history says so rather than "done".
                        Some(why) => format!(
                            "{}: powered on only, not cycled: {why} (power read just after: \
                             {state:?}){held}",
                            b.name()
                        ),
                        None => format!(
                            "{}: done (power read just after: {state:?}){held}",
                            b.name()
                        ),
                    },
                    output: detail,
                    unknown_since: None,
                },
                Outcome::Ok,
            ),
            (_, PowerOutcome::Failed { detail, .. }) => (
                CommandEnd {
                    ok: false,
                    summary: format!("{} failed{held}", b.name()),
                    output: detail,
                    unknown_since,
                },
                Outcome::Failed,
            ),
        },
    }
}

/// Why a cycle's gateway only powered the machine on ([`protocol::gateway::POWERED_ON_ONLY`]),
/// from its answer's detail: the clause before its first `; `.
fn powered_on_only(detail: &str) -> Option<&str> {
    let why = detail.strip_prefix(protocol::gateway::POWERED_ON_ONLY)?;
    Some(why.split("; ").next().unwrap_or(why))
}
