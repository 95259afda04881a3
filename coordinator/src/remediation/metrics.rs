//! The remediation loop's `/metrics` series: decisions by outcome and rule, the limits
//! holding now, machines whose agent is lost while their node is alive, and passes.
//!
//! Decisions are counted when they are first made: a proposal held pass after pass counts
//! once (as its journal line does), an admission counts each time. This module keeps no
//! other state and takes no decision.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use super::decision::{LimitStatus, Outcome, Rule};
use crate::metrics::MetricsSource;

/// Counters and gauges of the remediation loop.
#[derive(Debug, Default)]
pub struct RemediationMetrics(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    decisions: BTreeMap<(&'static str, &'static str), u64>,
    holding: BTreeMap<&'static str, bool>,
    agent_lost_node_alive: u64,
    agent_lost_node_alive_total: u64,
    passes: u64,
    pass_failures: u64,
}

impl RemediationMetrics {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Counts one new decision.
    pub fn decided(&self, outcome: Outcome, rule: Rule) {
        self.with(|m| {
            *m.decisions
                .entry((outcome.as_str(), rule.as_str()))
                .or_default() += 1
        });
    }

    /// Records one pass: its limits, and how many machines are "agent lost, node alive" now
    /// (`new_lost` of them newly so).
    pub fn pass(&self, limits: &[LimitStatus], lost_now: u64, new_lost: u64) {
        self.with(|m| {
            m.passes += 1;
            m.holding = limits
                .iter()
                .map(|l| (l.rule.as_str(), l.holding))
                .collect();
            m.agent_lost_node_alive = lost_now;
            m.agent_lost_node_alive_total += new_lost;
        });
    }

    /// Counts a pass that could not run (queue or store unavailable).
    pub fn pass_failed(&self) {
        self.with(|m| m.pass_failures += 1);
    }
}

impl MetricsSource for RemediationMetrics {
    fn render(&self, out: &mut String) {
        self.with(|m| {
            out.push_str("# HELP fleetmend_remediation_decisions_total Remediation decisions by outcome and rule (a decision repeated by consecutive passes counts once).\n");
            out.push_str("# TYPE fleetmend_remediation_decisions_total counter\n");
            for ((outcome, rule), n) in &m.decisions {
                let _ = writeln!(
                    out,
                    "fleetmend_remediation_decisions_total{{outcome=\"{outcome}\",rule=\"{rule}\"}} {n}"
                );
            }
            out.push_str("# HELP fleetmend_remediation_limit_holding 1 while the limit holds proposals (in the last pass).\n");
            out.push_str("# TYPE fleetmend_remediation_limit_holding gauge\n");
            for (rule, h) in &m.holding {
                let _ = writeln!(
                    out,
                    "fleetmend_remediation_limit_holding{{rule=\"{rule}\"}} {}",
                    u8::from(*h)
                );
            }
            out.push_str("# HELP fleetmend_remediation_agent_lost_node_alive Machines whose agent is silent while their kubelet renews its Lease.\n");
            out.push_str("# TYPE fleetmend_remediation_agent_lost_node_alive gauge\n");
            let _ = writeln!(
                out,
                "fleetmend_remediation_agent_lost_node_alive {}",
                m.agent_lost_node_alive
            );
            out.push_str("# HELP fleetmend_remediation_agent_lost_node_alive_total Times a machine's agent was found lost while its node was alive.\n");
            out.push_str("# TYPE fleetmend_remediation_agent_lost_node_alive_total counter\n");
            let _ = writeln!(
                out,
                "fleetmend_remediation_agent_lost_node_alive_total {}",
                m.agent_lost_node_alive_total
            );
            out.push_str("# HELP fleetmend_remediation_passes_total Remediation passes run.\n");
            out.push_str("# TYPE fleetmend_remediation_passes_total counter\n");
            let _ = writeln!(out, "fleetmend_remediation_passes_total {}", m.passes);
            out.push_str("# HELP fleetmend_remediation_pass_failures_total Remediation passes skipped because the repair queue or the store failed.\n");
            out.push_str("# TYPE fleetmend_remediation_pass_failures_total counter\n");
            let _ = writeln!(
                out,
                "fleetmend_remediation_pass_failures_total {}",
                m.pass_failures
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_decisions_and_holding_limits() {
        let m = RemediationMetrics::default();
        m.decided(Outcome::Held, Rule::CorrelatedFailure);
        m.decided(Outcome::Held, Rule::CorrelatedFailure);
        m.pass(
            &[LimitStatus {
                rule: Rule::CorrelatedFailure,
                holding: true,
                sentence: String::new(),
            }],
            1,
            1,
        );
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains(
            "fleetmend_remediation_decisions_total{outcome=\"held\",rule=\"correlated-failure\"} 2"
        ));
        assert!(s.contains("fleetmend_remediation_limit_holding{rule=\"correlated-failure\"} 1"));
        assert!(s.contains("fleetmend_remediation_agent_lost_node_alive 1"));
    }
}
