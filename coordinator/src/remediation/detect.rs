//! The detectors: two-signal death, sabakan-style auto-repair and MachineHealthCheck-style
//! checks. Each turns the facts of one pass into candidates (proposals for the limits),
//! held decisions (a detector-level limiter said no, with its reason) and findings.
//!
//! Pure: no I/O, no clock, no state kept between passes.

use std::time::Duration;

use protocol::messages::GoodbyeReason;

use super::config::{HealthCheck, Threshold};
use super::decision::{Proposal, Rule};
use super::input::{Dump, Machine};
use super::{Candidate, Ctx, Detected, Note, elapsed, human};
use crate::health::MachineState;
use crate::k8s::lease::{SecondSignal, is_stale, lease_age};

/// What the two signals say about a machine whose agent is silent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Death {
    /// Dead for remediation (both signals, or the agent's alone where there is no other).
    Dead(String),
    /// The agent is silent but the kubelet renews its Lease.
    NodeAlive(String),
    /// The Lease is stale but Ready is still True: not confirmed yet.
    NotConfirmed(String),
    /// The Kubernetes view is too old to confirm anything.
    ViewStale(String),
    /// Known down without either signal: its kdump initramfs said "dumping".
    Dumping(String),
    /// The crash kernel was loaded: waiting `kdump_wait` for a "dumping" first.
    KdumpWait(String),
}

/// Two-signal death of an `unreachable` machine: agent silent past its grace (the state
/// says so) and, with Kubernetes, the kubelet Lease unrenewed for `lease_stale` and Ready
/// not True (with `second_signal = "lease"`: the Lease unrenewed for `lease_stale` by its
/// stamp and as the node view saw it, Ready not waited for). kdump first: a machine whose kdump initramfs says "dumping" is known down (an
/// authenticated word from the machine itself, needing no second signal); one that would be
/// dead but whose crash kernel was loaded is given `kdump_wait` after its last report to
/// say so. A live kubelet, a stale view or a Ready node still decide first: a machine that
/// runs its kubelet is not in a dump kernel.
pub(super) fn death(m: &Machine, ctx: &Ctx<'_>) -> Death {
    let now = ctx.now;
    let last = m.last_report_at.unwrap_or(m.since);
    let silent = human(elapsed(now, last));
    if let Dump::Dumping { since } = m.dump {
        return Death::Dumping(format!(
            "kdump in progress: its kdump initramfs said \"dumping\" {} ago (agent silent \
             for {silent}), so the machine is known down",
            human(elapsed(now, since))
        ));
    }
    let dumped_since = matches!(m.dump, Dump::Done { at } if at > last);
    match two_signals(m, ctx, &silent) {
        Death::Dead(_)
            if m.kdump_loaded && !dumped_since && elapsed(now, last) < ctx.cfg.kdump_wait =>
        {
            Death::KdumpWait(format!(
                "agent silent for {silent}, but its crash kernel was loaded: waiting for its \
                 kdump initramfs to say \"dumping\" until kdump_wait {} has passed",
                human(ctx.cfg.kdump_wait)
            ))
        }
        d => d,
    }
}

fn two_signals(m: &Machine, ctx: &Ctx<'_>, silent: &str) -> Death {
    let now = ctx.now;
    let Some(kube) = ctx.input.kube else {
        return Death::Dead(format!(
            "agent silent for {silent}; no [kubernetes] section, so the agent signal alone counts"
        ));
    };
    if !kube.is_fresh(now) {
        let age = kube
            .age(now)
            .map_or("never loaded".to_string(), |a| format!("{} old", human(a)));
        return Death::ViewStale(format!(
            "agent silent for {silent}, but the Kubernetes view is {age} (limit {}): cannot \
             check the kubelet Lease, holding rather than guessing",
            human(kube.max_age)
        ));
    }
    let Some(node) = &m.node else {
        return Death::Dead(format!(
            "agent silent for {silent}; not a Kubernetes node, so the agent signal alone counts"
        ));
    };
    let lease_only = ctx.cfg.second_signal == SecondSignal::Lease;
    // With Ready as a second witness the kubelet's own stamp is enough (the node lifecycle
    // controller's judgement needs no clocks to agree); without it, the Lease must also
    // have looked unchanged to the coordinator for as long (see `crate::k8s::lease`).
    let lease = if lease_only {
        lease_age(now, node.lease_renewed_at, node.lease_seen_since)
    } else {
        node.lease_renewed_at.map(|t| elapsed(now, t))
    };
    let lease_text = lease.map_or("never renewed".to_string(), |a| {
        format!("last renewed {} ago", human(a))
    });
    if !is_stale(lease, ctx.cfg.lease_stale) {
        return Death::NodeAlive(format!(
            "agent lost, node alive: agent silent for {silent}, but the kubelet Lease was \
             {lease_text} (lease_stale {}); not remediated",
            human(ctx.cfg.lease_stale)
        ));
    }
    let ready = node.ready();
    let ready_text = ready.map_or("absent".to_string(), |r| {
        format!("{} for {}", r.status, human(elapsed(now, r.since)))
    });
    match ready {
        Some(r) if r.status == "True" && !lease_only => Death::NotConfirmed(format!(
            "agent silent for {silent} and kubelet Lease {lease_text}, but Ready is still True; \
             waiting for the node controller to agree"
        )),
        _ if lease_only => Death::Dead(format!(
            "agent silent for {silent}, kubelet Lease {lease_text} (lease_stale {}), Ready \
             {ready_text} (second_signal = \"lease\": Ready not waited for)",
            human(ctx.cfg.lease_stale),
        )),
        _ => Death::Dead(format!(
            "agent silent for {silent}, kubelet Lease {lease_text} (lease_stale {}), Ready \
             {ready_text}",
            human(ctx.cfg.lease_stale),
        )),
    }
}

/// "Agent lost, node alive" findings for every unreachable machine.
pub(super) fn findings<'a>(ctx: &Ctx<'a>, out: &mut Detected<'a>) {
    for m in &ctx.input.machines {
        if m.state == MachineState::Unreachable
            && let Death::NodeAlive(s) = death(m, ctx)
        {
            out.findings
                .push(Note::new(m, Rule::AgentLostNodeAlive, None, s));
        }
    }
}

/// CKE's `wait_seconds_to_repair_rebooting`: an unreachable machine that said goodbye, or
/// that no Node vouches for, waits before repair. `Some(sentence)` while it waits.
fn rebooting_wait(m: &Machine, ctx: &Ctx<'_>) -> Option<String> {
    if m.state != MachineState::Unreachable {
        return None;
    }
    let why = match (m.goodbye, ctx.input.kube.is_some() && m.node.is_some()) {
        (Some((reason, at)), _) => format!(
            "said goodbye ({}) {} ago",
            match reason {
                GoodbyeReason::Shutdown => "shutdown or reboot",
                GoodbyeReason::Restart => "agent restart",
                GoodbyeReason::Reboot => "reboot asked by a repair",
            },
            human(elapsed(ctx.now, at))
        ),
        (None, false) if ctx.input.kube.is_none() => {
            "has no Kubernetes view ([kubernetes] not configured)".to_string()
        }
        (None, false) => "is not a Kubernetes node".to_string(),
        (None, true) => return None,
    };
    let wait = Duration::from_secs(ctx.cfg.wait_seconds_to_repair_rebooting);
    let waited = elapsed(ctx.now, m.since);
    (waited < wait).then(|| {
        format!(
            "held: {} {why} and has been unreachable for {}; it waits {} first \
             (wait_seconds_to_repair_rebooting {})",
            m.address,
            human(waited),
            human(wait),
            ctx.cfg.wait_seconds_to_repair_rebooting
        )
    })
}

/// Per-machine limiters shared by both detectors: no machine type, an entry in the queue
/// (finished or not), the reboot wait. `Some(note)` holds the proposal.
fn machine_limiter<'a>(m: &'a Machine, ctx: &Ctx<'a>, p: &Proposal) -> Option<Note<'a>> {
    if m.machine_type.is_none() {
        let s = format!(
            "held: {} has no machine type, so no repair procedure applies; register it with \
             `coordinatorctl machines add`",
            m.address
        );
        return Some(Note::new(m, Rule::NoMachineType, Some(p.clone()), s));
    }
    if let Some(e) = ctx.entry(&m.address) {
        // A finished entry holds until someone deletes it (CKE's rule): say how.
        let succeeded = e.status == protocol::admin::repair::RepairStatus::Succeeded;
        let finished = if e.is_active() {
            String::new()
        } else if let (true, Some(after)) = (succeeded, ctx.cfg.delete_succeeded_after) {
            format!(
                "; a succeeded entry that remediation enqueued is deleted {} after it \
                 succeeded (delete_succeeded_after), one added by hand stays until deleted \
                 (`coordinatorctl repair-queue delete {}`)",
                super::human(after),
                e.index
            )
        } else {
            format!(
                "; a finished entry stays until deleted (`coordinatorctl repair-queue delete {}`, \
                 or `delete-finished` for all)",
                e.index
            )
        };
        let s = format!(
            "held: {} already has repair queue entry {} (operation {}, {}); one entry per \
             machine while any exists{finished}",
            m.address,
            e.index,
            e.operation,
            e.status.as_str()
        );
        return Some(Note::new(m, Rule::QueueHasEntry, Some(p.clone()), s));
    }
    rebooting_wait(m, ctx).map(|s| Note::new(m, Rule::WaitRebooting, Some(p.clone()), s))
}

fn proposal(m: &Machine, operation: &str, source: String, reason: String) -> Proposal {
    Proposal {
        operation: operation.to_string(),
        machine_type: m.machine_type.clone().unwrap_or_default(),
        serial: m.serial.clone(),
        source,
        reason,
    }
}

/// sabakan-style auto-repair with CKE's limiters.
pub(super) fn auto_repair<'a>(ctx: &Ctx<'a>, out: &mut Detected<'a>) {
    let ar = &ctx.cfg.auto_repair;
    // A source that cannot be read holds auto-repair as a whole (see `decide`).
    let (true, Ok(machines)) = (ar.enabled, &ctx.auto_repair_from) else {
        return;
    };
    let mut candidates = Vec::new();
    // sabakan filtered its answer itself (its racks are numbers, not the registry's names).
    let filtered = ctx.input.sabakan.is_some();
    for m in machines.iter() {
        if !filtered && (!ar.having.matches_all(m) || ar.not_having.matches_any(m)) {
            continue;
        }
        let (reason, needs_view) = if m.state == MachineState::Unreachable {
            match death(m, ctx) {
                Death::Dead(s) => (s, ctx.input.kube.is_some()),
                Death::Dumping(s) => (s, false),
                Death::KdumpWait(s) => {
                    let s = format!("held: {}: {s}", m.address);
                    out.hold(Note::new(m, Rule::KdumpWait, None, s));
                    continue;
                }
                // Reported once by `findings`; nothing to propose.
                Death::NodeAlive(_) => continue,
                Death::NotConfirmed(s) => {
                    let s = format!("held: {}: {s}", m.address);
                    out.hold(Note::new(m, Rule::TwoSignal, None, s));
                    continue;
                }
                Death::ViewStale(s) => {
                    let s = format!("held: {}: {s}", m.address);
                    out.hold(Note::new(m, Rule::NodeViewStale, None, s));
                    continue;
                }
            }
        } else {
            let failing: Vec<&str> = m.failing_checks.iter().map(|c| c.name.as_str()).collect();
            let what = if failing.is_empty() {
                String::new()
            } else {
                format!(" (failing: {})", failing.join(", "))
            };
            let for_ = elapsed(ctx.now, m.since);
            if !filtered && m.state == MachineState::Unhealthy && for_ < ar.unhealthy_for {
                let s = format!(
                    "held: {} unhealthy for {}{what}; auto-repair waits until it has been for {} \
                     (auto_repair.unhealthy_for), so a passing failure is not repaired",
                    m.address,
                    human(for_),
                    human(ar.unhealthy_for)
                );
                out.hold(Note::new(m, Rule::UnhealthyFor, None, s));
                continue;
            }
            (format!("{} for {}{what}", m.state, human(for_)), false)
        };
        let p = proposal(m, auto_operation(ar, m), "auto-repair".into(), reason);
        match machine_limiter(m, ctx, &p) {
            Some(note) => out.hold(note),
            None => candidates.push(Candidate::new(m, ctx, Rule::AutoRepair, p, needs_view)),
        }
    }
    // CKE: all or nothing.
    let max = ctx.cfg.maximum_repair_queue_entries as usize;
    let queued = ctx.input.queue.len();
    if !candidates.is_empty() && queued + candidates.len() > max {
        let n = candidates.len();
        for c in candidates {
            let s = format!(
                "held: {queued} entries in the repair queue + {n} candidates exceed \
                 maximum_repair_queue_entries {max}; none of the {n} is enqueued"
            );
            out.hold(Note::new(
                c.m,
                Rule::MaximumRepairQueueEntries,
                Some(c.proposal),
                s,
            ));
        }
    } else {
        for c in candidates {
            out.propose(c);
        }
    }
}

/// The operation auto-repair enqueues for `m`: the first `operation_by_check` entry one of
/// its failing checks matches, else its state's name (sabakan's `unhealthy`,
/// `unreachable`). Pure.
fn auto_operation<'a>(ar: &'a super::config::AutoRepair, m: &'a Machine) -> &'a str {
    if m.state != MachineState::Unhealthy {
        return m.state.as_str();
    }
    ar.operation_by_check
        .iter()
        .find(|o| m.failing_checks.iter().any(|f| f.is(&o.check)))
        .map_or(m.state.as_str(), |o| o.operation.as_str())
}

/// A machine as one health check sees it.
enum Verdict {
    Healthy,
    /// Counts against the gate; `Some((reason, needs_view))` when it is to be remediated.
    Unhealthy(Option<(String, bool)>),
}

fn classify(hc: &HealthCheck, agent: &[bool], m: &Machine, active: bool, ctx: &Ctx<'_>) -> Verdict {
    use MachineState as S;
    let now = ctx.now;
    // Under remediation, rebooting on purpose, or in an operator's hands: never healthy
    // (counting them healthy lets a gate remediate the whole cluster), never proposed.
    if active || matches!(m.state, S::Stopped | S::Updating | S::Retiring) {
        return Verdict::Unhealthy(None);
    }
    if ctx.input.kube.is_some() && m.node.as_ref().is_none_or(|n| n.ready().is_none()) {
        let what = if m.node.is_none() {
            "no Node"
        } else {
            "Node never Ready"
        };
        let up = m.booted_at.map(|t| elapsed(now, t));
        return Verdict::Unhealthy(up.filter(|u| *u > hc.node_startup_timeout).map(|u| {
            let s = format!(
                "{what} {} after boot (node_startup_timeout {})",
                human(u),
                human(hc.node_startup_timeout)
            );
            (s, true)
        }));
    }
    let reporting = matches!(m.state, S::Healthy | S::Unhealthy);
    let mut pending = false;
    for (c, &is_agent) in hc.unhealthy_conditions.iter().zip(agent) {
        let since = if is_agent {
            // A silent agent's last failures are old news; two-signal death covers it.
            if !reporting {
                continue;
            }
            m.failing_checks
                .iter()
                .filter(|f| f.is(&c.type_))
                .map(|f| f.since_for(&c.type_))
                .min()
        } else {
            m.node
                .as_ref()
                .and_then(|n| n.condition(&c.type_))
                .filter(|x| x.status == c.status)
                .map(|x| x.since)
        };
        let Some(since) = since else { continue };
        let held = elapsed(now, since);
        if held >= c.timeout {
            let s = format!(
                "{} is {} for {} (timeout {})",
                c.type_,
                if is_agent { "failing" } else { &c.status },
                human(held),
                human(c.timeout)
            );
            return Verdict::Unhealthy(Some((s, !is_agent)));
        }
        pending = true;
    }
    if pending || !reporting {
        Verdict::Unhealthy(None)
    } else {
        Verdict::Healthy
    }
}

/// MachineHealthCheck-style checks, each with its gate over the machines it selects.
pub(super) fn health_checks<'a>(ctx: &Ctx<'a>, out: &mut Detected<'a>) {
    for hc in &ctx.cfg.health_checks {
        let mut pool = 0usize;
        let mut unhealthy = 0usize;
        let mut proposed = Vec::new();
        let agent: Vec<bool> = hc
            .unhealthy_conditions
            .iter()
            .map(|c| c.is_agent_check())
            .collect();
        for (i, m) in ctx.input.machines.iter().enumerate() {
            if m.state == MachineState::Retired || !hc.selector.matches(m) {
                continue;
            }
            pool += 1;
            let Verdict::Unhealthy(fire) = classify(hc, &agent, m, ctx.is_active_at(i), ctx) else {
                continue;
            };
            unhealthy += 1;
            if let Some((reason, needs_view)) = fire
                && !out.taken(&m.address)
            {
                let p = proposal(
                    m,
                    &hc.operation,
                    format!("health-check {}", hc.name),
                    reason,
                );
                proposed.push((m, p, needs_view));
            }
        }
        if proposed.is_empty() {
            continue;
        }
        let gate = match (hc.max_unhealthy, hc.unhealthy_range) {
            (Some(t), _) => {
                let allowed = t.of(pool);
                (unhealthy > allowed).then(|| {
                    let how = match t {
                        Threshold::Count(_) => String::new(),
                        Threshold::Percent(_) => format!(" of {pool}"),
                    };
                    format!("max_unhealthy {t}{how} allows {allowed}")
                })
            }
            (None, Some(r)) => (unhealthy < r.min || unhealthy > r.max)
                .then(|| format!("unhealthy_range [{}-{}]", r.min, r.max)),
            (None, None) => None,
        };
        for (m, p, needs_view) in proposed {
            if let Some(g) = &gate {
                let s = format!(
                    "held: health check {}: {unhealthy} of {pool} selected machines are \
                     unhealthy (machines under remediation, starting or without a Node \
                     included) and {g}",
                    hc.name
                );
                out.hold(Note::new(m, Rule::HealthCheckGate, Some(p), s));
                continue;
            }
            match machine_limiter(m, ctx, &p) {
                Some(note) => out.hold(note),
                None => out.propose(Candidate::new(m, ctx, Rule::HealthCheck, p, needs_view)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use protocol::admin::repair::RepairStatus;

    use super::super::config::{HealthCheck, Selector, Threshold, UnhealthyCondition};
    use super::super::fixture::{Case, case};
    use super::*;

    fn only_checks(c: Case) -> Case {
        c.roomy().cfg(|c| c.auto_repair.enabled = false)
    }

    fn check(name: &str, t: &str, status: &str, timeout: u64) -> HealthCheck {
        HealthCheck {
            name: name.into(),
            selector: Selector::default(),
            unhealthy_conditions: vec![UnhealthyCondition {
                type_: t.into(),
                status: status.into(),
                timeout: Duration::from_secs(timeout),
            }],
            node_startup_timeout: Duration::from_secs(1800),
            max_unhealthy: None,
            unhealthy_range: None,
            operation: "unhealthy".into(),
        }
    }

    // ---- two-signal death ----

    #[test]
    fn agent_silent_lease_stale_and_ready_not_true_is_dead() {
        let p = case().machine("a").dead(120).run();
        assert_eq!(p.admitted.len(), 1, "{p:#?}");
        let d = &p.admitted[0];
        assert_eq!(d.rule, Rule::AutoRepair);
        let s = &d.sentence;
        assert!(s.contains("agent silent for 2m"), "{s}");
        assert!(
            s.contains("Lease last renewed 2m ago (lease_stale 20s)"),
            "{s}"
        );
        assert!(s.contains("Ready Unknown for 1m 20s"), "{s}");
    }

    #[test]
    fn agent_silent_while_kubelet_renews_is_agent_lost_node_alive_and_no_proposal() {
        let p = case().machine("a").silent(600).run();
        assert!(p.admitted.is_empty() && p.held.is_empty(), "{p:#?}");
        assert_eq!(p.findings.len(), 1);
        assert_eq!(p.findings[0].rule, Rule::AgentLostNodeAlive);
        assert!(p.findings[0].sentence.starts_with("agent lost, node alive"));
        // 15 s without a renewal is under lease_stale (20 s): still alive.
        let p = case().machine("a").silent(600).lease(15).run();
        assert_eq!(p.findings[0].rule, Rule::AgentLostNodeAlive);
    }

    // ---- kdump ----

    #[test]
    fn a_silent_machine_with_a_crash_kernel_waits_kdump_wait_for_a_dumping_message() {
        // Dead by both signals 40 s after its last report, but kdump_wait is 60 s.
        let (rule, s) = case().machine("a").crash_kernel().dead(40).held("a");
        assert_eq!(rule, Rule::KdumpWait);
        assert!(
            s.contains("crash kernel was loaded") && s.contains("kdump_wait 1m"),
            "{s}"
        );
        // Once kdump_wait passed without a word, it is dead as usual.
        let p = case().machine("a").crash_kernel().dead(61).run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        assert!(p.admitted[0].sentence.contains("Lease"), "{:?}", p.admitted);
        // Without a crash kernel there is nothing to wait for.
        let p = case().machine("a").dead(40).run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        // kdump_wait is configurable.
        let p = case()
            .cfg(|c| c.kdump_wait = Duration::from_secs(30))
            .machine("a")
            .crash_kernel()
            .dead(40)
            .run();
        assert_eq!(p.admitted_addresses(), ["a"]);
    }

    #[test]
    fn a_live_kubelet_is_agent_lost_node_alive_even_with_a_crash_kernel() {
        // A machine running its kubelet is not in a dump kernel: no kdump wait, the finding.
        let p = case().machine("a").crash_kernel().silent(30).run();
        assert!(p.held.is_empty(), "{p:#?}");
        assert_eq!(p.findings.len(), 1);
        assert_eq!(p.findings[0].rule, Rule::AgentLostNodeAlive);
    }

    #[test]
    fn a_dumping_machine_is_known_down_without_the_second_signal_and_the_decision_says_so() {
        // Silent only 30 s (kdump_wait is 60 s), kubelet Lease fresh and Ready True: the dump alone decides.
        let p = case()
            .machine("a")
            .crash_kernel()
            .silent(30)
            .dumping(5)
            .run();
        assert_eq!(p.admitted_addresses(), ["a"], "{p:#?}");
        let s = &p.admitted[0].sentence;
        assert!(
            s.contains("kdump in progress") && s.contains("known down"),
            "{s}"
        );
        // Even with a stale Kubernetes view: the dump needs no view.
        let p = case()
            .machine("a")
            .crash_kernel()
            .silent(30)
            .dumping(5)
            .view_age(300)
            .run();
        assert_eq!(p.admitted_addresses(), ["a"], "{p:#?}");
    }

    #[test]
    fn a_dump_done_after_the_silence_ends_the_kdump_wait_but_an_old_one_does_not() {
        // "Dump done" 10 s ago, silent 40 s: no more waiting, the two signals decide.
        let p = case()
            .machine("a")
            .crash_kernel()
            .dead(40)
            .dump_done(10)
            .run();
        assert_eq!(p.admitted_addresses(), ["a"], "{p:#?}");
        // A "dump done" from before the last report is an old crash: the wait applies.
        let (rule, _) = case()
            .machine("a")
            .crash_kernel()
            .dead(40)
            .dump_done(3600)
            .held("a");
        assert_eq!(rule, Rule::KdumpWait);
    }

    #[test]
    fn lease_stale_but_ready_still_true_waits_for_the_node_controller() {
        let (rule, s) = case().machine("a").silent(60).lease(30).held("a");
        assert_eq!(rule, Rule::TwoSignal);
        assert!(s.contains("Ready is still True"), "{s}");
    }

    fn lease_only(c: Case) -> Case {
        c.cfg(|c| c.second_signal = SecondSignal::Lease)
    }

    #[test]
    fn with_second_signal_lease_a_stale_lease_is_death_without_waiting_for_ready() {
        let p = lease_only(case()).machine("a").silent(60).lease(30).run();
        assert_eq!(p.admitted_addresses(), ["a"], "{p:#?}");
        let s = &p.admitted[0].sentence;
        assert!(
            s.contains("Lease last renewed 30s ago (lease_stale 20s)")
                && s.contains("Ready True for")
                && s.contains("second_signal = \"lease\": Ready not waited for"),
            "{s}"
        );
        // A Lease renewed within lease_stale is still a live node, in either mode.
        let p = lease_only(case()).machine("a").silent(60).lease(15).run();
        assert_eq!(p.findings[0].rule, Rule::AgentLostNodeAlive, "{p:#?}");
    }

    #[test]
    fn with_second_signal_lease_a_lease_the_view_saw_change_lately_is_alive_whatever_its_stamp() {
        // The kubelet's clock is 60 s behind: its stamp looks a minute old, but the view
        // saw this renewal 5 s ago. Only the Lease decides here, so the clocks must not.
        let p = lease_only(case())
            .machine("a")
            .silent(60)
            .lease(60)
            .lease_seen(5)
            .run();
        assert!(p.admitted.is_empty(), "{p:#?}");
        assert_eq!(p.findings[0].rule, Rule::AgentLostNodeAlive);
        assert!(p.findings[0].sentence.contains("last renewed 5s ago"));
        // Seen unchanged for lease_stale: dead.
        let p = lease_only(case())
            .machine("a")
            .silent(60)
            .lease(60)
            .lease_seen(25)
            .run();
        assert_eq!(p.admitted_addresses(), ["a"], "{p:#?}");
        // With Ready as the second witness the stamp alone still counts (unchanged).
        let (rule, _) = case()
            .machine("a")
            .silent(60)
            .lease(60)
            .lease_seen(5)
            .held("a");
        assert_eq!(rule, Rule::TwoSignal);
    }

    #[test]
    fn without_kubernetes_the_agent_signal_alone_counts_and_says_so() {
        // Not a Kubernetes node: CKE's wait_seconds_to_repair_rebooting first.
        let (rule, s) = case().no_kube().machine("a").silent(200).held("a");
        assert_eq!(rule, Rule::WaitRebooting);
        assert!(
            s.contains("has no Kubernetes view ([kubernetes] not configured)"),
            "{s}"
        );
        let p = case().no_kube().machine("a").silent(400).run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        let s = &p.admitted[0].sentence;
        assert!(
            s.contains("no [kubernetes] section, so the agent signal alone counts"),
            "{s}"
        );
    }

    #[test]
    fn a_stale_node_view_holds_with_its_age() {
        let (rule, s) = case().machine("a").dead(300).view_age(120).held("a");
        assert_eq!(rule, Rule::NodeViewStale);
        assert!(s.contains("Kubernetes view is 2m old (limit 30s)"), "{s}");
        let p = case().machine("a").dead(300).view_age(120).run();
        let l = p
            .limits
            .iter()
            .find(|l| l.rule == Rule::NodeViewStale)
            .unwrap();
        assert!(l.holding && l.sentence.contains("2m old"), "{}", l.sentence);
        let (rule, _) = case()
            .machine("a")
            .dead(300)
            .input(|i, _| i.kube.as_mut().unwrap().refreshed_at = None)
            .held("a");
        assert_eq!(rule, Rule::NodeViewStale);
    }

    // ---- sabakan-style auto-repair ----

    #[test]
    fn auto_repair_entry_has_state_as_operation_machine_type_and_serial() {
        let p = case().machine("a").failing("kubelet:kubelet", 30).run();
        let prop = p.admitted[0].proposal.as_ref().unwrap();
        assert_eq!(prop.operation, "unhealthy");
        assert_eq!(prop.machine_type, "qemu");
        assert_eq!(prop.serial, "SN-a");
        assert_eq!(prop.source, "auto-repair");
        assert!(
            prop.reason.contains("failing: kubelet:kubelet"),
            "{}",
            prop.reason
        );
        let p = case().machine("b").dead(120).run();
        assert_eq!(
            p.admitted[0].proposal.as_ref().unwrap().operation,
            "unreachable"
        );
    }

    #[test]
    fn auto_repair_having_and_not_having() {
        let c = case()
            .roomy()
            .machine("boot")
            .m(|m, _| m.role = "boot".into())
            .failing("kubelet", 60)
            .machine("cs")
            .failing("kubelet", 60)
            .machine("ss")
            .m(|m, _| m.role = "ss".into())
            .failing("kubelet", 60);
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["cs", "ss"]);
        assert!(
            p.held_for("boot").is_none(),
            "not_having role boot: left alone"
        );
        let c = c.cfg(|c| c.auto_repair.having.roles = vec!["ss".into()]);
        assert_eq!(c.admitted(), ["ss"]);
        let c = c.cfg(|c| {
            c.auto_repair.having.roles.clear();
            c.auto_repair.having.states = vec![MachineState::Unreachable];
        });
        assert!(c.admitted().is_empty(), "unhealthy is no longer selected");
    }

    #[test]
    fn a_machine_with_any_entry_finished_or_not_is_skipped() {
        for status in [
            RepairStatus::Queued,
            RepairStatus::Processing,
            RepairStatus::Succeeded,
            RepairStatus::Failed,
        ] {
            let (rule, s) = case()
                .machine("a")
                .failing("kubelet", 60)
                .entry("a", status)
                .held("a");
            assert_eq!(rule, Rule::QueueHasEntry, "{status:?}");
            assert!(s.contains(status.as_str()), "{s}");
            assert!(s.contains("repair queue entry 1 "), "{s}");
            // Only a finished entry needs deleting by hand, and the hold says how; a
            // succeeded one also when remediation will delete it.
            let finished = matches!(status, RepairStatus::Succeeded | RepairStatus::Failed);
            assert_eq!(
                s.contains("`coordinatorctl repair-queue delete 1`"),
                finished,
                "{s}"
            );
            assert_eq!(
                s.contains("is deleted 1h after it succeeded (delete_succeeded_after)"),
                status == RepairStatus::Succeeded,
                "{s}"
            );
        }
        let (_, s) = case()
            .cfg(|c| c.delete_succeeded_after = None)
            .machine("a")
            .failing("kubelet", 60)
            .entry("a", RepairStatus::Succeeded)
            .held("a");
        assert!(s.contains("a finished entry stays until deleted"), "{s}");
    }

    #[test]
    fn an_unhealthy_machine_waits_unhealthy_for_before_auto_repair_proposes_it() {
        // Failing for 10 s of the default 30 s: held, saying why and for how long more.
        let (rule, s) = case().machine("a").failing("kubelet", 10).held("a");
        assert_eq!(rule, Rule::UnhealthyFor);
        assert!(
            s.contains("unhealthy for 10s (failing: kubelet); auto-repair waits until it has been for 30s (auto_repair.unhealthy_for)"),
            "{s}"
        );
        // At 30 s it is proposed, and with the setting at zero at once.
        assert_eq!(case().machine("a").failing("kubelet", 30).admitted(), ["a"]);
        let c = case()
            .cfg(|c| c.auto_repair.unhealthy_for = std::time::Duration::ZERO)
            .machine("a")
            .failing("kubelet", 0);
        assert_eq!(c.admitted(), ["a"]);
        // Unreachable machines have their own waits (grace, two signals): not this one.
        assert_eq!(case().machine("b").dead(60).admitted(), ["b"]);
    }

    #[test]
    fn maximum_repair_queue_entries_is_all_or_nothing() {
        let c = case()
            .roomy()
            .cfg(|c| c.maximum_repair_queue_entries = 3)
            .machine_in("x", "r9")
            .entry("x", RepairStatus::Failed)
            .machine_in("a", "r1")
            .failing("kubelet", 60)
            .machine_in("b", "r2")
            .failing("kubelet", 60);
        assert_eq!(c.admitted(), ["a", "b"], "1 entry + 2 candidates = 3");
        let c = c.machine_in("c", "r3").failing("kubelet", 60);
        let p = c.run();
        assert!(p.admitted.is_empty(), "1 + 3 > 3: none of them");
        for a in ["a", "b", "c"] {
            let d = p.held_for(a).unwrap();
            assert_eq!(d.rule, Rule::MaximumRepairQueueEntries);
            assert!(d.sentence.contains("1 entries in the repair queue + 3 candidates exceed maximum_repair_queue_entries 3"), "{}", d.sentence);
        }
        // Shown as a limit (status, the holding gauge and its alert), naming failed entries.
        let l = p
            .limits
            .iter()
            .find(|l| l.rule == Rule::MaximumRepairQueueEntries)
            .unwrap();
        assert!(l.holding);
        assert!(
            l.sentence
                .starts_with("1 of 3 entries in the repair queue (1 failed: each stays until"),
            "{}",
            l.sentence
        );
        let l = case()
            .machine("a")
            .failing("kubelet", 60)
            .run()
            .limits
            .into_iter()
            .find(|l| l.rule == Rule::MaximumRepairQueueEntries)
            .unwrap();
        assert!(!l.holding, "{l:?}");
    }

    #[test]
    fn a_machine_without_machine_type_is_held() {
        let (rule, _) = case()
            .machine("a")
            .m(|m, _| m.machine_type = None)
            .failing("kubelet", 60)
            .held("a");
        assert_eq!(rule, Rule::NoMachineType);
    }

    #[test]
    fn a_machine_that_said_goodbye_waits_before_repair_when_unreachable() {
        // Overran the goodbye grace: unreachable 60 s ago, said goodbye 11 min ago.
        let c = case().machine("a").dead(700).m(|m, now| {
            m.goodbye = Some((
                GoodbyeReason::Shutdown,
                now - jiff::SignedDuration::from_secs(660),
            ));
            m.since = now - jiff::SignedDuration::from_secs(60);
        });
        let (rule, s) = c.held("a");
        assert_eq!(rule, Rule::WaitRebooting);
        assert!(
            s.contains("said goodbye (shutdown or reboot) 11m ago"),
            "{s}"
        );
        assert!(s.contains("unreachable for 1m; it waits 5m first"), "{s}");
        assert_eq!(c.later(250).admitted(), ["a"]);
    }

    #[test]
    fn a_machine_without_a_node_waits_before_repair() {
        let c = case().machine("a").silent(100).m(|m, _| m.node = None);
        assert_eq!(c.held("a").0, Rule::WaitRebooting);
        assert_eq!(c.later(300).admitted(), ["a"]);
    }

    #[test]
    fn auto_repair_chooses_the_operation_by_failing_check() {
        let by = |c: &mut super::super::config::RemediationConfig| {
            c.auto_repair.operation_by_check = vec![
                super::super::config::CheckOperation {
                    check: "gpu".into(),
                    operation: "gpu".into(),
                },
                super::super::config::CheckOperation {
                    check: "nic:eth0".into(),
                    operation: "nic".into(),
                },
            ];
        };
        let op = |c: Case| c.run().admitted[0].proposal.clone().unwrap().operation;
        let c = case().cfg(by).machine("a").failing("gpu:0000:3b:00", 60);
        assert_eq!(op(c), "gpu");
        // First match first: a GPU and a NIC failing is a GPU repair.
        let c = case()
            .cfg(by)
            .machine("a")
            .failing("nic:eth0", 60)
            .failing("gpu:0000:3b:00", 60);
        assert_eq!(op(c), "gpu");
        let c = case().cfg(by).machine("a").failing("nic:eth0", 60);
        assert_eq!(op(c), "nic");
        // Another NIC, another check: the state's name, as without the table.
        let c = case().cfg(by).machine("a").failing("nic:eth1", 60);
        assert_eq!(op(c), "unhealthy");
        let c = case().cfg(by).machine("b").dead(120);
        assert_eq!(op(c), "unreachable");
        let e = super::super::config::RemediationConfig::from_toml(
            "[auto_repair]\noperation_by_check = [{ check = \"Ready\", operation = \"x\" }]\n",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("auto_repair.operation_by_check[0].check"),
            "{e}"
        );
    }

    // ---- MachineHealthCheck-style checks ----

    #[test]
    fn an_agent_check_fires_after_its_timeout() {
        let c = only_checks(case())
            .cfg(|c| c.health_checks.push(check("nic", "nic:eth0", "False", 120)))
            .machine("a")
            .failing("nic:eth0", 60);
        assert!(c.run().admitted.is_empty() && c.run().held.is_empty());
        let p = c.later(61).run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        let prop = p.admitted[0].proposal.as_ref().unwrap();
        assert_eq!(prop.source, "health-check nic");
        assert_eq!(prop.reason, "nic:eth0 is failing for 2m 1s (timeout 2m)");
    }

    #[test]
    fn a_node_condition_fires_after_its_timeout() {
        let c = only_checks(case())
            .cfg(|c| {
                let mut hc = check("npd", "KernelDeadlock", "True", 300);
                hc.operation = "kernel".into();
                c.health_checks.push(hc)
            })
            .machine("a")
            .condition("KernelDeadlock", "True", 301)
            .machine("b")
            .condition("KernelDeadlock", "False", 900);
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        assert_eq!(p.admitted[0].proposal.as_ref().unwrap().operation, "kernel");
        // Same condition on a stale view: held.
        assert_eq!(c.view_age(60).held("a").0, Rule::NodeViewStale);
    }

    #[test]
    fn a_gate_of_40_percent_over_5_machines_holds_the_third_failure() {
        let c = only_checks(case())
            .cfg(|c| {
                let mut hc = check("ready", "Ready", "False", 60);
                hc.max_unhealthy = Some(Threshold::Percent(40));
                c.health_checks.push(hc);
                c.limits.slow_start.width = 8;
                c.limits.slow_start.max_width = 8;
            })
            .rack("r1", 5)
            .on("r1.0", fixture_ready_false)
            .entry("r1.0", RepairStatus::Processing)
            .on("r1.1", fixture_ready_false);
        assert_eq!(c.admitted(), ["r1.1"], "2 of 5 unhealthy, 40% allows 2");
        let c = c
            .entry("r1.1", RepairStatus::Processing)
            .on("r1.2", fixture_ready_false);
        let (rule, s) = c.held("r1.2");
        assert_eq!(rule, Rule::HealthCheckGate);
        assert!(s.contains("3 of 5 selected machines are unhealthy"), "{s}");
        assert!(s.contains("max_unhealthy 40% of 5 allows 2"), "{s}");
    }

    fn fixture_ready_false(m: &mut super::super::input::Machine, now: jiff::Timestamp) {
        super::super::fixture::set_condition(m, now, "Ready", "False", 120);
    }

    #[test]
    fn unhealthy_range_admits_only_inside_the_range() {
        let c = only_checks(case())
            .cfg(|c| {
                let mut hc = check("ready", "Ready", "False", 60);
                hc.unhealthy_range = Some(super::super::config::UnhealthyRange { min: 2, max: 3 });
                c.health_checks.push(hc);
                c.limits.slow_start.width = 8;
                c.limits.slow_start.max_width = 8;
            })
            .rack("r1", 6)
            .on("r1.0", fixture_ready_false);
        let (rule, s) = c.held("r1.0");
        assert_eq!(rule, Rule::HealthCheckGate);
        assert!(s.contains("unhealthy_range [2-3]"), "{s}");
        let c = c.on("r1.1", fixture_ready_false);
        assert_eq!(c.admitted(), ["r1.0", "r1.1"]);
        let c = c
            .on("r1.2", fixture_ready_false)
            .on("r1.3", fixture_ready_false);
        assert!(c.admitted().is_empty(), "4 > 3");
    }

    #[test]
    fn node_startup_timeout_applies_to_machines_without_a_ready_node() {
        let c = only_checks(case())
            .cfg(|c| c.health_checks.push(check("ready", "Ready", "False", 60)))
            .machine("a")
            .m(|m, now| {
                m.node = None;
                m.booted_at = Some(now - jiff::SignedDuration::from_mins(20));
            });
        assert!(
            c.run().admitted.is_empty(),
            "20 min < 30 min: still starting"
        );
        let p = c.later(11 * 60).run();
        assert_eq!(p.admitted_addresses(), ["a"]);
        let r = &p.admitted[0].proposal.as_ref().unwrap().reason;
        assert_eq!(r, "no Node 31m after boot (node_startup_timeout 30m)");
        // A Node without a Ready condition yet counts as starting too.
        let c = only_checks(case())
            .cfg(|c| c.health_checks.push(check("ready", "Ready", "False", 60)))
            .machine("a")
            .m(|m, now| {
                m.node.as_mut().unwrap().conditions.clear();
                m.booted_at = Some(now - jiff::SignedDuration::from_mins(31));
            });
        assert!(c.admitted() == ["a"]);
    }

    #[test]
    fn a_selector_limits_the_check_and_its_percentages() {
        let c = only_checks(case())
            .cfg(|c| {
                let mut hc = check("ss", "kubelet", "False", 60);
                hc.selector.roles = vec!["ss".into()];
                hc.selector.machine_types = vec!["qemu".into()];
                hc.selector.labels.insert("pool".into(), "a".into());
                hc.max_unhealthy = Some(Threshold::Percent(50));
                c.health_checks.push(hc);
            })
            .machine("cs")
            .failing("kubelet", 120)
            .machine("ss1")
            .m(|m, _| {
                m.role = "ss".into();
                m.labels.insert("pool".into(), "a".into());
            })
            .failing("kubelet", 120)
            .machine("ss2")
            .m(|m, _| {
                m.role = "ss".into();
                m.labels.insert("pool".into(), "a".into());
            });
        assert_eq!(c.admitted(), ["ss1"], "1 of 2 selected, 50% allows 1");
    }
}
