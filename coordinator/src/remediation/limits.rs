//! The storm limits: pure rules over (candidates, queue, fleet facts, decision history,
//! outcomes, operator switches, config, now) that admit or hold each candidate, each with
//! its own reason and the numbers behind it.
//!
//! They never latch: nothing here keeps state between passes, a held candidate is dropped,
//! and the next pass derives its candidates afresh from the state of its own `now`. Holding
//! only ever stops *new* remediations: the only thing this module can do is not admit a
//! candidate, so it cannot stop an uncordon, a restore, a health check or a running flow.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;

use super::decision::{LimitStatus, Rule};
use super::{Candidate, Ctx, elapsed, human};
use crate::health::MachineState;

/// One hour, the rate limit's window.
const HOUR: Duration = Duration::from_secs(3600);

/// The largest number of `onsets` (sorted) within any `window`, and the spread of that run.
fn burst(onsets: &[Timestamp], window: Duration) -> (usize, Duration, Option<Timestamp>) {
    let mut best = (0, Duration::ZERO, None);
    let mut lo = 0;
    for hi in 0..onsets.len() {
        while elapsed(onsets[hi], onsets[lo]) > window {
            lo += 1;
        }
        if hi + 1 - lo > best.0 {
            best = (
                hi + 1 - lo,
                elapsed(onsets[hi], onsets[lo]),
                Some(onsets[hi]),
            );
        }
    }
    best
}

/// Facts every rule reads, computed once per pass.
pub(super) struct Limiter<'a> {
    ctx: &'a Ctx<'a>,
    /// Self-isolation's sentence while it holds everything.
    isolated: Option<String>,
    /// Domains in a correlated-failure event, with their sentence.
    events: BTreeMap<&'a str, String>,
    fleet: usize,
    cap: usize,
    in_flight: usize,
    in_flight_by_domain: HashMap<&'a str, usize>,
    admitted_last_hour: usize,
    admitted_last_hour_by_domain: HashMap<&'a str, usize>,
    /// Observe mode: proposals this pass would have enqueued, by domain. They use up the
    /// limits as admissions would (so the journal shows what would happen), but no sentence
    /// calls them in flight or admitted: nothing was.
    would: HashMap<&'a str, usize>,
    widths: HashMap<&'a str, (usize, String)>,
    held_by: BTreeMap<Rule, usize>,
}

impl<'a> Limiter<'a> {
    /// Computes the facts of this pass.
    pub(super) fn new(ctx: &'a Ctx<'a>) -> Self {
        let cfg = &ctx.cfg.limits;
        let now = ctx.now;
        // The registry's machines and those only sabakan knows (`by_address` holds both).
        let fleet = ctx
            .by_address
            .values()
            .filter(|m| m.state != MachineState::Retired)
            .count();
        let cap = (cfg.fleet_cap.count as usize)
            .min(super::config::Threshold::Percent(cfg.fleet_cap.percent).of(fleet));
        let mut in_flight = 0;
        let mut in_flight_by_domain = HashMap::new();
        for e in ctx.input.queue.iter().filter(|e| e.is_active()) {
            in_flight += 1;
            if let Some(d) = ctx.domain_of(&e.address) {
                *in_flight_by_domain.entry(d).or_insert(0) += 1;
            }
        }
        let mut admitted_last_hour = 0;
        let mut admitted_last_hour_by_domain = HashMap::new();
        for d in ctx.input.history.iter().filter(|d| d.is_admission()) {
            if d.at <= now && elapsed(now, d.at) < HOUR {
                admitted_last_hour += 1;
                let dom = ctx.domain_of(&d.address).unwrap_or(d.domain.as_str());
                *admitted_last_hour_by_domain.entry(dom).or_insert(0) += 1;
            }
        }
        let mut l = Self {
            ctx,
            isolated: None,
            events: BTreeMap::new(),
            fleet,
            cap,
            in_flight,
            in_flight_by_domain,
            admitted_last_hour,
            admitted_last_hour_by_domain,
            would: HashMap::new(),
            widths: HashMap::new(),
            held_by: BTreeMap::new(),
        };
        l.events = l.correlated();
        l.isolated = l.self_isolation();
        l
    }

    /// More than a share of all agents went silent within one window (and have not come
    /// back), and no operator confirmed an outage since: the coordinator suspects its own
    /// network. Derived from the silent machines of now, so it clears as agents return.
    ///
    /// A burst that lies within one failure domain while the others report (a rack that
    /// lost power, in a fleet of a few racks) is that domain's event, not the coordinator's
    /// network: when correlated failure holds the domain, it is left to that rule, which
    /// names the domain and lets the other domains' repairs go on.
    fn self_isolation(&self) -> Option<String> {
        let si = &self.ctx.cfg.limits.self_isolation;
        let domain = &self.ctx.cfg.failure_domain;
        let mut agents = 0;
        let mut silent = Vec::new();
        let mut back = Vec::new();
        let mut silent_domains = std::collections::BTreeSet::new();
        let mut reporting_domains = std::collections::BTreeSet::new();
        for m in &self.ctx.input.machines {
            let last = match m.last_report_at {
                Some(last) => last,
                // No report since this coordinator started, yet unreachable: it reported to
                // an earlier run (nothing else turns unreachable unreported), and went
                // silent with every other agent the restart cut off. Counted as silent
                // since it turned unreachable, so a restart's burst is one burst.
                None if m.state == MachineState::Unreachable && m.goodbye.is_none() => m.since,
                None => continue,
            };
            if m.state == MachineState::Retired {
                continue;
            }
            agents += 1;
            if m.state == MachineState::Unreachable && m.goodbye.is_none() {
                silent.push(last);
                silent_domains.insert(domain.of(m));
            } else if let Some((went, returned)) = m.last_silence
                && elapsed(self.ctx.now, returned) < si.window
            {
                // Back already, but part of the burst for a window: agents return one by
                // one, and the last to return must not look like a few ordinary failures.
                silent.push(went);
                back.push(went);
                silent_domains.insert(domain.of(m));
            } else {
                reporting_domains.insert(domain.of(m));
            }
        }
        if let [only] = silent_domains.iter().collect::<Vec<_>>()[..]
            && self.events.contains_key(only)
            && reporting_domains.iter().any(|d| d != only)
        {
            return None;
        }
        silent.sort_unstable();
        let (n, spread, last) = burst(&silent, si.window);
        let share = n * 100 / agents.max(1);
        if n < si.min_silent as usize || n * 100 <= si.percent as usize * agents {
            return None;
        }
        if let (Some(c), Some(last)) = (self.ctx.input.control.outage_confirmed_at, last)
            && c >= last
        {
            return None;
        }
        // Of the burst, those that have reported again since: still part of it (see above),
        // but not to be counted as silent now.
        let returned = last.map_or(0, |last| {
            let first = last - jiff::SignedDuration::try_from(spread).unwrap_or_default();
            back.iter().filter(|t| **t >= first && **t <= last).count()
        });
        let returned = if returned == 0 {
            String::new()
        } else {
            format!(", {returned} of them reporting again since")
        };
        Some(format!(
            "held: {n} of {agents} agents ({share}%) went silent {} (more than {}% \
             within {}){returned}: the coordinator suspects its own network and admits \
             nothing until they report again or an operator runs `coordinatorctl remediation \
             confirm-outage`",
            over(spread, "within"),
            si.percent,
            human(si.window)
        ))
    }

    /// Domains where `machines` or more turned unhealthy or unreachable within `window`
    /// and still are.
    fn correlated(&self) -> BTreeMap<&'a str, String> {
        let cf = &self.ctx.cfg.limits.correlated_failure;
        let domain = &self.ctx.cfg.failure_domain;
        let machines = &self.ctx.input.machines;
        // Only failed machines are grouped (a handful); a domain's size is counted only
        // when it is in an event, so a pass does not hash every machine's domain.
        let mut failed: HashMap<&str, Vec<Timestamp>> = HashMap::new();
        for m in machines {
            let is_failed = match m.state {
                MachineState::Unhealthy => true,
                MachineState::Unreachable => m.goodbye.is_none(),
                _ => false,
            };
            if is_failed {
                failed.entry(domain.of(m)).or_default().push(m.since);
            }
        }
        let mut out = BTreeMap::new();
        for (d, mut onsets) in failed {
            if onsets.len() < cf.machines as usize {
                continue;
            }
            onsets.sort_unstable();
            let (n, spread, _) = burst(&onsets, cf.window);
            if n >= cf.machines as usize {
                let total = machines.iter().filter(|m| domain.of(m) == d).count();
                out.insert(
                    d,
                    format!(
                        "held: {} {d} lost {n} of {total} machines {} ({} or more \
                         within {} is an infrastructure event, not {n} repairs)",
                        domain.word(),
                        over(spread, "in"),
                        cf.machines,
                        human(cf.window)
                    ),
                );
            }
        }
        out
    }

    /// Slow start: 1, doubling per success held for `success_after`, back to 1 on a
    /// failure, at most `max_width`.
    fn width(&mut self, domain: &'a str) -> usize {
        if let Some((w, _)) = self.widths.get(domain) {
            return *w;
        }
        let ss = &self.ctx.cfg.limits.slow_start;
        let now = self.ctx.now;
        let mut outcomes: Vec<_> = self
            .ctx
            .input
            .outcomes
            .iter()
            .filter(|o| o.finished_at <= now && elapsed(now, o.finished_at) <= ss.lookback)
            .filter(|o| self.ctx.domain_of(&o.address) == Some(domain))
            .collect();
        outcomes.sort_by_key(|o| o.finished_at);
        let (mut width, mut successes, mut failures) = (ss.width as usize, 0, 0);
        for o in outcomes {
            match self.confirmed(o) {
                Some(true) => {
                    successes += 1;
                    width = (width * 2).min(ss.max_width as usize);
                }
                Some(false) => {
                    failures += 1;
                    width = ss.width as usize;
                }
                None => {}
            }
        }
        let why = format!(
            "width {width} (from {}: {successes} confirmed successes, {failures} failures in \
             the last {}; max_width {})",
            ss.width,
            human(ss.lookback),
            ss.max_width
        );
        self.widths.insert(domain, (width, why));
        width
    }

    /// A success is confirmed when the machine stayed healthy `success_after` past the end
    /// of its repair; a relapse within that time is a failure; `None`: not known (yet).
    ///
    /// The repair ends when its health check passes, which may come before the agent's
    /// report that shows the machine healthy (up to a report interval later, more on a
    /// loaded host): a machine that turns healthy within `success_after` of the end counts
    /// from then. One still failing meanwhile counts as a failure at once (the cautious
    /// reading while that report is on its way; it counts as a success once it arrives).
    fn confirmed(&self, o: &super::input::RepairOutcome) -> Option<bool> {
        if !o.succeeded {
            return Some(false);
        }
        let after =
            jiff::SignedDuration::try_from(self.ctx.cfg.limits.slow_start.success_after).ok()?;
        let m = self.ctx.machine(&o.address)?;
        let held_until = o.finished_at + after;
        let now = self.ctx.now;
        match m.state {
            // Healthy since before the end of the repair, or since within success_after of
            // it: confirmed once held success_after from the later of the two. (Only the
            // current state is kept: a relapse that also recovered within that window is
            // not seen.)
            MachineState::Healthy if m.since < held_until => {
                (now >= m.since.max(o.finished_at) + after).then_some(true)
            }
            // Relapsed and recovered since: this outcome says nothing either way.
            MachineState::Healthy => None,
            // Not healthy again, from within success_after: the repair did not hold.
            _ if m.since < held_until => Some(false),
            // Broke again later: the repair itself had held.
            _ => Some(true),
        }
    }

    /// Admits `c` or says which rule holds it and why. Admission consumes capacity.
    pub(super) fn check(&mut self, c: &Candidate<'a>) -> Result<(), (Rule, String)> {
        let r = self.rules(c);
        match &r {
            Ok(()) if self.ctx.cfg.observe => *self.would.entry(c.domain).or_insert(0) += 1,
            Ok(()) => {
                self.in_flight += 1;
                *self.in_flight_by_domain.entry(c.domain).or_insert(0) += 1;
                self.admitted_last_hour += 1;
                *self
                    .admitted_last_hour_by_domain
                    .entry(c.domain)
                    .or_insert(0) += 1;
            }
            Err((rule, _)) => *self.held_by.entry(*rule).or_insert(0) += 1,
        }
        r
    }

    fn rules(&mut self, c: &Candidate<'a>) -> Result<(), (Rule, String)> {
        let ctx = self.ctx;
        let cfg = &ctx.cfg.limits;
        let addr = &c.m.address;
        if let Some((reason, at)) = &ctx.input.control.paused {
            return Err((
                Rule::Paused,
                format!(
                    "held: remediation paused by an operator {} ago: {reason}",
                    human(elapsed(ctx.now, *at))
                ),
            ));
        }
        if let Some(s) = &self.isolated {
            return Err((Rule::SelfIsolation, s.clone()));
        }
        // A partition or a dark rack silences its agents within one report interval, but
        // they turn unreachable one sweep at a time: a silent machine waits `settle` so the
        // burst it may belong to is visible before the first of it is repaired.
        let settle = cfg.self_isolation.settle;
        if c.m.state == MachineState::Unreachable && c.m.goodbye.is_none() {
            let silent_for = elapsed(ctx.now, c.m.since);
            if silent_for < settle {
                return Err((
                    Rule::SelfIsolation,
                    format!(
                        "held: {addr} went silent {} ago; waiting {} (self_isolation.settle) \
                         to see whether other agents fall silent with it",
                        human(silent_for),
                        human(settle)
                    ),
                ));
            }
        }
        if let Some(s) = self.events.get(c.domain) {
            return Err((Rule::CorrelatedFailure, s.clone()));
        }
        let esc = &cfg.escalation;
        let cleared = ctx.input.control.cleared.get(addr.as_str()).copied();
        let times = ctx
            .input
            .history
            .iter()
            .filter(|d| d.is_admission() && &d.address == addr && d.at <= ctx.now)
            .filter(|d| elapsed(ctx.now, d.at) < esc.window && cleared.is_none_or(|c| d.at > c))
            .count();
        if times >= esc.max_remediations as usize {
            return Err((
                Rule::NeedsHuman,
                format!(
                    "held: {addr} needs a human: remediated {times} times within {} \
                     (max_remediations {}); left alone until `coordinatorctl machines clear {addr}`",
                    human(esc.window),
                    esc.max_remediations
                ),
            ));
        }
        let would = self.would.values().sum::<usize>();
        let would_here = self.would.get(c.domain).copied().unwrap_or(0);
        if self.in_flight + would >= self.cap {
            return Err((Rule::FleetCap, format!("held: {}", self.cap_sentence())));
        }
        let width = self.width(c.domain);
        let busy = self.in_flight_by_domain.get(c.domain).copied().unwrap_or(0);
        if busy + would_here >= width {
            let word = ctx.cfg.failure_domain.word();
            return Err((
                Rule::SlowStart,
                format!(
                    "held: {word} {} has {busy} repairs in flight{} and slow start allows {}",
                    c.domain,
                    also_would(would_here),
                    self.widths[c.domain].1
                ),
            ));
        }
        if self.admitted_last_hour + would >= cfg.rate.per_hour as usize {
            return Err((
                Rule::RateLimit,
                format!(
                    "held: {} remediations admitted fleet-wide in the last hour{} \
                     (rate.per_hour {})",
                    self.admitted_last_hour,
                    also_would(would),
                    cfg.rate.per_hour
                ),
            ));
        }
        let in_domain = self
            .admitted_last_hour_by_domain
            .get(c.domain)
            .copied()
            .unwrap_or(0);
        if in_domain + would_here >= cfg.rate.per_domain_per_hour as usize {
            return Err((
                Rule::RateLimit,
                format!(
                    "held: {in_domain} remediations admitted in {} {} in the last hour{} \
                     (rate.per_domain_per_hour {})",
                    ctx.cfg.failure_domain.word(),
                    c.domain,
                    also_would(would_here),
                    cfg.rate.per_domain_per_hour
                ),
            ));
        }
        Ok(())
    }

    fn cap_sentence(&self) -> String {
        let fc = &self.ctx.cfg.limits.fleet_cap;
        let by_percent = super::config::Threshold::Percent(fc.percent).of(self.fleet);
        let would = self.would.values().sum::<usize>();
        format!(
            "{} of {} repairs in flight{} (fleet cap: count {}, {}% of {} machines = {}; the \
             smaller binds)",
            self.in_flight,
            self.cap,
            also_would(would),
            fc.count,
            fc.percent,
            self.fleet,
            by_percent
        )
    }

    /// Every limit's state after the pass, for `remediation status`.
    pub(super) fn status(&self) -> Vec<LimitStatus> {
        let ctx = self.ctx;
        let cfg = &ctx.cfg.limits;
        let held = |r: Rule| self.held_by.get(&r).copied().unwrap_or(0);
        let mut v = Vec::new();
        let mut push = |rule, holding, sentence: String| {
            v.push(LimitStatus {
                rule,
                holding,
                sentence,
            })
        };
        match &ctx.input.control.paused {
            Some((reason, _)) => push(Rule::Paused, true, format!("paused: {reason}")),
            None => push(Rule::Paused, false, "not paused".into()),
        }
        match ctx.input.kube {
            None => push(
                Rule::NodeViewStale,
                false,
                "no [kubernetes] section: the agent signal alone counts".into(),
            ),
            Some(k) if k.is_fresh(ctx.now) => push(
                Rule::NodeViewStale,
                false,
                format!("Kubernetes view fresh (limit {})", human(k.max_age)),
            ),
            Some(k) => push(
                Rule::NodeViewStale,
                true,
                format!(
                    "Kubernetes view {} (limit {}): decisions that need it are held",
                    k.age(ctx.now)
                        .map_or("never loaded".into(), |a| format!("{} old", human(a))),
                    human(k.max_age)
                ),
            ),
        }
        match &self.isolated {
            Some(s) => push(Rule::SelfIsolation, true, s.clone()),
            None => push(
                Rule::SelfIsolation,
                false,
                "no burst of silent agents".into(),
            ),
        }
        if self.events.is_empty() {
            push(
                Rule::CorrelatedFailure,
                false,
                "no failure domain in an infrastructure event".into(),
            );
        }
        for s in self.events.values() {
            push(Rule::CorrelatedFailure, true, s.clone());
        }
        push(
            Rule::NeedsHuman,
            held(Rule::NeedsHuman) > 0,
            format!(
                "{} machines held as needs-human this pass (max_remediations {} within {})",
                held(Rule::NeedsHuman),
                cfg.escalation.max_remediations,
                human(cfg.escalation.window)
            ),
        );
        // HOLDING only when the limit held a proposal this pass (as for the other rules and
        // the holding gauge); a fleet at its cap that had nothing to admit held nothing.
        push(
            Rule::FleetCap,
            held(Rule::FleetCap) > 0,
            self.cap_sentence(),
        );
        let mut domains: Vec<_> = self.widths.iter().collect();
        domains.sort_by_key(|(d, _)| **d);
        let slow: Vec<String> = domains
            .iter()
            .map(|(d, (_, why))| {
                let busy = self.in_flight_by_domain.get(**d).copied().unwrap_or(0);
                format!("{d}: {busy} in flight, {why}")
            })
            .collect();
        push(
            Rule::SlowStart,
            held(Rule::SlowStart) > 0,
            if slow.is_empty() {
                "no domain had a candidate".into()
            } else {
                slow.join("; ")
            },
        );
        push(
            Rule::RateLimit,
            held(Rule::RateLimit) > 0,
            format!(
                "{} of {} remediations admitted fleet-wide in the last hour; at most {} per \
                 domain",
                self.admitted_last_hour, cfg.rate.per_hour, cfg.rate.per_domain_per_hour
            ),
        );
        v
    }
}

/// `, and N more would be (observe mode)` for the proposals observe mode let through this
/// pass, which count against the limits but are not in flight or admitted; empty for none.
fn also_would(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", and {n} more would be (observe mode)")
    }
}

/// How long a burst took, for a sentence: `in 2.5s` / `within 40s`, or `at once` when the
/// onsets share a health sweep (the states changed in the same pass).
fn over(spread: Duration, preposition: &str) -> String {
    if spread < Duration::from_millis(100) {
        "at once".into()
    } else {
        format!("{preposition} {}", human(spread))
    }
}

#[cfg(test)]
mod tests {
    use protocol::admin::repair::RepairStatus;

    use super::super::fixture::{Case, case, dead, failing};
    use super::super::input::Machine;
    use super::super::{Outcome, Rule};
    use crate::health::MachineState;
    use jiff::Timestamp;

    fn roomy(c: Case) -> Case {
        c.roomy()
            .cfg(|c| c.limits.correlated_failure = Default::default())
    }

    #[test]
    fn pause_holds_every_proposal_with_the_operators_reason() {
        let c = case()
            .machine("a")
            .failing("kubelet", 60)
            .input(|i, now| i.control.paused = Some(("switch upgrade".into(), now)));
        let (rule, s) = c.held("a");
        assert_eq!(rule, Rule::Paused);
        assert!(s.ends_with("switch upgrade"), "{s}");
        let p = c.run();
        assert!(p.limits.iter().any(|l| l.rule == Rule::Paused && l.holding));
    }

    #[test]
    fn fleet_cap_the_smaller_of_count_and_percent_binds() {
        // 4 machines, 5 %: the percentage binds, but never below one machine.
        let c = roomy(case())
            .cfg(|c| {
                c.limits.fleet_cap.count = 10;
                c.limits.fleet_cap.percent = 5;
            })
            .rack("r1", 4)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60))
            .on("r1.1", |m, now| failing(m, now, "kubelet", 50));
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r1.0"]);
        let d = p.held_for("r1.1").unwrap();
        assert_eq!(d.rule, Rule::FleetCap);
        assert!(
            d.sentence
                .contains("1 of 1 repairs in flight (fleet cap: count 10, 5% of 4 machines = 1"),
            "{}",
            d.sentence
        );
        // 1,000 machines, 5 % would be 50: the count (10) binds.
        let mut c = roomy(case()).cfg(|c| {
            c.limits.fleet_cap.count = 10;
            c.limits.fleet_cap.percent = 5;
        });
        for r in 0..50 {
            c = c.rack(&format!("r{r}"), 20);
            c = c.on(&format!("r{r}.0"), |m, now| failing(m, now, "kubelet", 60));
        }
        let p = c.run();
        assert_eq!(p.admitted.len(), 10);
        assert_eq!(p.held.len(), 40);
        assert!(
            p.held[0]
                .sentence
                .contains("5% of 1000 machines = 50; the smaller binds")
        );
    }

    #[test]
    fn fleet_cap_counts_entries_already_in_flight() {
        let c = roomy(case())
            .cfg(|c| c.limits.fleet_cap.count = 2)
            .rack("r1", 10)
            .entry("r1.8", RepairStatus::Processing)
            .entry("r1.9", RepairStatus::Queued)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60));
        assert_eq!(c.held("r1.0").0, Rule::FleetCap);
    }

    fn slow(c: Case) -> Case {
        c.roomy().cfg(|c| {
            c.limits.slow_start.width = 1;
            c.limits.slow_start.max_width = 4;
        })
    }

    #[test]
    fn slow_start_width_one_then_doubles_after_a_held_success() {
        let c = slow(case())
            .rack("r1", 10)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 90))
            .on("r1.1", |m, now| failing(m, now, "kubelet", 80))
            .on("r1.2", |m, now| failing(m, now, "kubelet", 70))
            .machine_in("other", "r2")
            .failing("kubelet", 60);
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r1.0", "other"], "one per rack");
        let d = p.held_for("r1.1").unwrap();
        assert_eq!(d.rule, Rule::SlowStart);
        assert!(
            d.sentence
                .contains("rack r1 has 1 repairs in flight and slow start allows width 1"),
            "{}",
            d.sentence
        );
        // r1.9 was repaired 10 min ago and has been healthy since: width 2.
        let c2 = c.clone().outcome("r1.9", 600, true);
        assert_eq!(c2.admitted(), ["r1.0", "r1.1", "other"]);
        // Two held successes: width 4, capped by max_width.
        let c3 = c2
            .clone()
            .outcome("r1.8", 400, true)
            .outcome("r1.7", 300, true);
        assert_eq!(c3.admitted(), ["r1.0", "r1.1", "r1.2", "other"]);
        // A success not yet held for success_after (5 min) does not count yet.
        let c4 = c.clone().outcome("r1.9", 60, true);
        assert_eq!(c4.admitted(), ["r1.0", "other"]);
        // A failure after a success: back to 1.
        let c5 = c2.clone().outcome("r1.8", 300, false);
        assert_eq!(c5.admitted(), ["r1.0", "other"]);
        // A success whose machine relapsed within success_after is a failure.
        let c6 = c
            .clone()
            .outcome("r1.0", 600, true)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 500));
        assert_eq!(c6.admitted(), ["r1.0", "other"]);
    }

    /// The entry ends when its health check passes; the agent's report that shows the
    /// machine healthy can come a little later. Such a success counts once held from then.
    #[test]
    fn a_success_whose_healthy_report_came_after_the_end_counts_once_held() {
        let c = slow(case())
            .rack("r1", 10)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 90))
            .on("r1.1", |m, now| failing(m, now, "kubelet", 80))
            .machine_in("other", "r2")
            .failing("kubelet", 60);
        let healthy_for = |s: i64| {
            move |m: &mut Machine, now: Timestamp| {
                m.state = MachineState::Healthy;
                m.since = now - jiff::SignedDuration::from_secs(s);
            }
        };
        // Healthy 2 s after its entry ended, and for 5 min since: width 2.
        let held = c
            .clone()
            .outcome("r1.9", 400, true)
            .on("r1.9", healthy_for(398));
        assert_eq!(held.admitted(), ["r1.0", "r1.1", "other"]);
        // Not yet 5 min from when it turned healthy: not yet.
        let young = c
            .clone()
            .outcome("r1.9", 299, true)
            .on("r1.9", healthy_for(297));
        assert_eq!(young.admitted(), ["r1.0", "other"]);
        // Still failing 5 min after its end: the repair did not hold, back to 1.
        let failed = c
            .clone()
            .outcome("r1.9", 400, true)
            .outcome("r1.8", 301, true)
            .on("r1.8", |m, now| failing(m, now, "kubelet", 400));
        let (rule, why) = failed.held("r1.0");
        assert_eq!(rule, Rule::SlowStart);
        assert!(
            why.contains("width 1") && why.contains("1 failures"),
            "{why}"
        );
    }

    #[test]
    fn slow_start_counts_repairs_in_flight_in_the_domain() {
        let c = slow(case())
            .rack("r1", 5)
            .entry("r1.4", RepairStatus::Processing)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60));
        assert_eq!(c.held("r1.0").0, Rule::SlowStart);
        let c = c.cfg(|c| {
            c.failure_domain = super::super::config::FailureDomain::Label("zone".into());
        });
        let c = c.on("r1.0", |m, _| {
            m.labels.insert("zone".into(), "z1".into());
        });
        assert_eq!(
            c.admitted(),
            ["r1.0"],
            "r1.4 is in zone <unset>, r1.0 in z1"
        );
    }

    #[test]
    fn machines_lost_in_one_sweep_are_lost_at_once() {
        let c = roomy(case())
            .rack("r12", 20)
            .on("r12.0", |m, now| dead(m, now, 30))
            .on("r12.1", |m, now| dead(m, now, 30))
            .on("r12.2", |m, now| dead(m, now, 30));
        let p = c.run();
        let d = p.held_for("r12.1").unwrap();
        assert!(
            d.sentence
                .starts_with("held: rack r12 lost 3 of 20 machines at once ("),
            "{}",
            d.sentence
        );
    }

    #[test]
    fn correlated_failure_in_one_rack_is_an_infrastructure_event() {
        let c = roomy(case())
            .rack("r12", 20)
            .rack("r13", 20)
            .on("r12.0", |m, now| dead(m, now, 70))
            .on("r12.1", |m, now| dead(m, now, 50))
            .on("r12.2", |m, now| dead(m, now, 30))
            .on("r13.0", |m, now| failing(m, now, "kubelet", 60));
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r13.0"]);
        let d = p.held_for("r12.1").unwrap();
        assert_eq!(d.rule, Rule::CorrelatedFailure);
        assert!(
            d.sentence
                .starts_with("held: rack r12 lost 3 of 20 machines in 40s"),
            "{}",
            d.sentence
        );
        assert!(
            p.limits.iter().any(|l| l.rule == Rule::CorrelatedFailure
                && l.holding
                && l.sentence.contains("r12"))
        );
        // One after another, further apart than the window: three separate repairs.
        let c = roomy(case())
            .rack("r12", 20)
            .on("r12.0", |m, now| dead(m, now, 400))
            .on("r12.1", |m, now| dead(m, now, 300))
            .on("r12.2", |m, now| dead(m, now, 200));
        assert_eq!(c.admitted().len(), 3);
    }

    #[test]
    fn the_first_of_a_burst_of_silences_waits_for_the_rest_to_show() {
        // Trap: a partition silences agents within one report interval, but they turn
        // unreachable one sweep at a time; a pass between two sweeps would repair the first
        // before self-isolation (or a rack event) can see the burst.
        let c = case()
            .roomy()
            .no_kube()
            .cfg(|c| c.wait_seconds_to_repair_rebooting = 0)
            .rack("r1", 10)
            .on("r1.0", |m, now| super::super::fixture::silent(m, now, 20));
        let (rule, sentence) = c.held("r1.0");
        assert_eq!(rule, Rule::SelfIsolation);
        assert!(
            sentence.contains("waiting 10s (self_isolation.settle)"),
            "{sentence}"
        );
        // Settled and still alone: an ordinary failure, repaired.
        let c = c.later(10);
        assert_eq!(c.admitted(), ["r1.0"]);
    }

    #[test]
    fn agents_returning_one_by_one_do_not_leave_the_last_ones_to_be_repaired() {
        // Trap: a partition heals, agents reconnect one by one; once most are back the
        // remaining silent ones look like a couple of ordinary failures and get repaired.
        let mut c = case()
            .roomy()
            .no_kube()
            .cfg(|c| c.wait_seconds_to_repair_rebooting = 0);
        for r in 0..10 {
            c = c.rack(&format!("r{r}"), 1);
        }
        for r in 0..4 {
            c = c.on(&format!("r{r}.0"), |m, now| {
                super::super::fixture::silent(m, now, 40)
            });
        }
        assert_eq!(c.held("r3.0").0, Rule::SelfIsolation);
        // Three are back (a second ago); r3.0 is not yet.
        for r in 0..3 {
            let a = format!("r{r}.0");
            let rack = format!("r{r}");
            c = c.on(&a.clone(), move |m, now| {
                *m = super::super::fixture::healthy(&a, &rack, now);
                m.last_silence = Some((
                    now - jiff::SignedDuration::from_secs(40),
                    now - jiff::SignedDuration::from_secs(1),
                ));
            });
        }
        let (rule, sentence) = c.held("r3.0");
        assert_eq!(rule, Rule::SelfIsolation, "{sentence}");
        assert!(sentence.contains("4 of 10 agents"), "{sentence}");
        assert!(
            sentence.contains("3 of them reporting again since"),
            "the three back are not silent now: {sentence}"
        );
        // A window after the others returned, one still silent is an ordinary failure.
        let c = c.later(61);
        assert_eq!(c.admitted(), ["r3.0"]);
    }

    #[test]
    fn self_isolation_admits_nothing_until_agents_return_or_an_operator_confirms() {
        let mut c = case().roomy().no_kube();
        for r in 0..10 {
            c = c.rack(&format!("r{r}"), 10);
        }
        // 40 of 100 agents went silent within 20 s, ten minutes ago.
        for i in 0..40 {
            let a = format!("r{}.{}", i % 10, i / 10);
            c = c.on(&a, move |m, now| {
                super::super::fixture::silent(m, now, 600 + i % 20)
            });
        }
        // One machine reports a genuinely failing check.
        let c = c.on("r9.9", |m, now| failing(m, now, "kubelet", 120));
        let p = c.run();
        assert!(p.admitted.is_empty(), "{:#?}", p.admitted);
        let d = p.held_for("r9.9").unwrap();
        assert_eq!(d.rule, Rule::SelfIsolation);
        assert!(
            d.sentence.starts_with(
                "held: 40 of 100 agents (40%) went silent within 19s (more than 30% within 1m)"
            ),
            "{}",
            d.sentence
        );
        // An operator confirms the outage: the rule lets go (the other limits still apply).
        let confirmed = c
            .clone()
            .input(|i, now| i.control.outage_confirmed_at = Some(now));
        assert_eq!(
            confirmed.run().admitted.len(),
            41,
            "the silence is real: repair"
        );
        // A confirmation from before the silence does not count.
        let stale = c.clone().input(|i, now| {
            i.control.outage_confirmed_at = Some(now - jiff::SignedDuration::from_hours(1))
        });
        assert_eq!(stale.held("r9.9").0, Rule::SelfIsolation);
    }

    #[test]
    fn a_rack_outage_in_a_small_fleet_is_a_rack_event_not_the_coordinators_network() {
        // Trap: with the defaults (30 %, 3 agents), one rack of four in a fleet of eight
        // going dark is 50 % of the agents: it was called "the coordinator suspects its own
        // network" and held the other rack's repairs too.
        let c = case()
            .roomy()
            .no_kube()
            .cfg(|c| {
                c.wait_seconds_to_repair_rebooting = 0;
                c.limits.correlated_failure.machines = 3;
            })
            .rack("r1", 4)
            .rack("r2", 4);
        let mut c = c.on("r1.0", |m, now| failing(m, now, "kubelet", 120));
        for i in 0..4 {
            c = c.on(&format!("r2.{i}"), |m, now| {
                super::super::fixture::silent(m, now, 40)
            });
        }
        let (rule, sentence) = c.held("r2.0");
        assert_eq!(rule, Rule::CorrelatedFailure, "{sentence}");
        assert!(
            sentence.contains("rack r2 lost 4 of 4 machines"),
            "{sentence}"
        );
        assert_eq!(c.admitted(), ["r1.0"], "the other rack is repaired");
        // The same silence spread over both racks is the coordinator's network.
        let mut c = case()
            .roomy()
            .no_kube()
            .cfg(|c| c.wait_seconds_to_repair_rebooting = 0)
            .rack("r1", 4)
            .rack("r2", 4);
        for a in ["r1.1", "r1.2", "r2.0", "r2.1"] {
            c = c.on(a, |m, now| super::super::fixture::silent(m, now, 40));
        }
        assert_eq!(c.held("r2.0").0, Rule::SelfIsolation);
        // So is a fleet of one rack that goes silent whole.
        let mut c = case()
            .roomy()
            .no_kube()
            .cfg(|c| c.wait_seconds_to_repair_rebooting = 0)
            .rack("r1", 4);
        for i in 0..4 {
            c = c.on(&format!("r1.{i}"), |m, now| {
                super::super::fixture::silent(m, now, 40)
            });
        }
        assert_eq!(c.held("r1.0").0, Rule::SelfIsolation);
    }

    #[test]
    fn agents_silent_since_a_coordinator_restart_count_as_one_burst() {
        // Trap: after a restart no machine has a report yet, and those whose agents are
        // still in reconnect backoff turn unreachable together; skipping machines without
        // a report since the start hid the burst and a live machine was fenced.
        let mut c = case()
            .roomy()
            .no_kube()
            .cfg(|c| c.wait_seconds_to_repair_rebooting = 0);
        for r in 0..10 {
            c = c.rack(&format!("r{r}"), 1);
        }
        for r in 0..10 {
            c = c.on(&format!("r{r}.0"), |m, now| {
                super::super::fixture::silent(m, now, 20);
                m.last_report_at = None;
            });
        }
        let (rule, sentence) = c.held("r3.0");
        assert_eq!(rule, Rule::SelfIsolation, "{sentence}");
        assert!(sentence.contains("10 of 10 agents"), "{sentence}");
    }

    #[test]
    fn rate_limit_per_hour_fleet_wide_and_per_domain() {
        let c = roomy(case())
            .cfg(|c| {
                c.limits.rate.per_hour = 3;
                c.limits.rate.per_domain_per_hour = 2;
            })
            .rack("r1", 5)
            .rack("r2", 5)
            .admitted_before("r1.3", 1800)
            .admitted_before("r1.4", 600)
            .admitted_before("r2.4", 4000)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60))
            .on("r2.0", |m, now| failing(m, now, "kubelet", 50))
            .on("r2.1", |m, now| failing(m, now, "kubelet", 40));
        let p = c.run();
        assert_eq!(p.admitted_addresses(), ["r2.0"]);
        let d = p.held_for("r1.0").unwrap();
        assert_eq!(d.rule, Rule::RateLimit);
        assert!(
            d.sentence
                .contains("2 remediations admitted in rack r1 in the last hour"),
            "{}",
            d.sentence
        );
        let d = p.held_for("r2.1").unwrap();
        assert!(
            d.sentence.contains("3 remediations admitted fleet-wide"),
            "{}",
            d.sentence
        );
    }

    #[test]
    fn escalation_ends_in_needs_human_until_cleared() {
        let c = roomy(case())
            .machine("a")
            .failing("kubelet", 60)
            .admitted_before("a", 3 * 3600)
            .admitted_before("a", 2 * 3600)
            .admitted_before("a", 3600);
        let (rule, s) = c.held("a");
        assert_eq!(rule, Rule::NeedsHuman);
        assert!(
            s.contains("remediated 3 times within 24h (max_remediations 3)"),
            "{s}"
        );
        assert!(s.contains("coordinatorctl machines clear a"), "{s}");
        let cleared = c.clone().input(|i, now| {
            i.control
                .cleared
                .insert("a".into(), now - jiff::SignedDuration::from_mins(90));
        });
        assert_eq!(cleared.admitted(), ["a"]);
        // Older than the window: forgotten.
        let old = roomy(case())
            .machine("a")
            .failing("kubelet", 60)
            .admitted_before("a", 3 * 86_400)
            .admitted_before("a", 2 * 86_400)
            .admitted_before("a", 3600);
        assert_eq!(old.admitted(), ["a"]);
    }

    #[test]
    fn observe_mode_records_would_enqueue_and_those_do_not_count_as_admissions() {
        let c = case()
            .cfg(|c| c.observe = true)
            .machine("a")
            .failing("kubelet", 60);
        let p = c.run();
        assert_eq!(p.admitted[0].outcome, Outcome::WouldEnqueue);
        assert!(
            p.admitted[0]
                .sentence
                .starts_with("would enqueue (observe mode): a")
        );
        // A week of would-enqueue lines neither rate-limits nor escalates.
        let mut c = c.apply(&p);
        for _ in 0..5 {
            let p = c.run();
            c = c.apply(&p);
        }
        assert_eq!(c.input.history.len(), 6);
        assert_eq!(c.run().admitted[0].outcome, Outcome::WouldEnqueue);
        assert!(c.input.queue.is_empty(), "observe mode enqueues nothing");
    }

    #[test]
    fn limit_status_names_every_limit_with_numbers() {
        let p = case()
            .rack("r1", 3)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60))
            .run();
        let rules: Vec<Rule> = p.limits.iter().map(|l| l.rule).collect();
        for r in [
            Rule::Paused,
            Rule::SelfIsolation,
            Rule::CorrelatedFailure,
            Rule::NeedsHuman,
            Rule::FleetCap,
            Rule::SlowStart,
            Rule::RateLimit,
        ] {
            assert!(rules.contains(&r), "{r:?} missing");
        }
        let cap = p.limits.iter().find(|l| l.rule == Rule::FleetCap).unwrap();
        assert!(
            cap.sentence.starts_with("1 of 1 repairs in flight"),
            "{}",
            cap.sentence
        );
        // At the cap, but nothing was held in this pass: not HOLDING.
        assert!(!cap.holding, "{cap:?}");
        // A second candidate is held by it, and then it holds.
        let p = case()
            .rack("r1", 3)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60))
            .on("r1.1", |m, now| failing(m, now, "kubelet", 60))
            .run();
        let cap = p.limits.iter().find(|l| l.rule == Rule::FleetCap).unwrap();
        assert!(cap.holding, "{cap:?}");
    }

    #[test]
    fn observe_mode_calls_nothing_in_flight_or_admitted_that_was_not() {
        let p = case()
            .cfg(|c| c.observe = true)
            .rack("r1", 3)
            .on("r1.0", |m, now| failing(m, now, "kubelet", 60))
            .on("r1.1", |m, now| failing(m, now, "kubelet", 60))
            .run();
        assert_eq!(p.admitted.len(), 1, "{:?}", p.admitted);
        assert_eq!(p.admitted[0].outcome, Outcome::WouldEnqueue);
        let held = &p.held[0].sentence;
        assert!(
            held.starts_with(
                "held: 0 of 1 repairs in flight, and 1 more would be (observe mode) (fleet cap"
            ),
            "{held}"
        );
        let cap = p.limits.iter().find(|l| l.rule == Rule::FleetCap).unwrap();
        assert!(
            cap.sentence
                .starts_with("0 of 1 repairs in flight, and 1 more would be"),
            "{}",
            cap.sentence
        );
        for l in &p.limits {
            assert!(!l.sentence.contains("1 remediations admitted"), "{l:?}");
        }
    }
}
