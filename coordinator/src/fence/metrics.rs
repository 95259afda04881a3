//! The fence flows' `/metrics` series: flows started and finished (by outcome) since the
//! coordinator started, and the flows running now by the state they are in.
//!
//! The runner tells this module each state it commits or resumes; this module keeps no
//! other state and takes no decision. A flow's terminal state is counted once, when the
//! runner commits it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use super::flow::State;
use crate::metrics::MetricsSource;

/// Counters and gauges of the fence flows.
#[derive(Debug, Default)]
pub struct FenceMetrics(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    started: u64,
    done: u64,
    failed: u64,
    /// Unfinished flows by id: the kind of their committed state.
    running: BTreeMap<u64, &'static str>,
}

impl FenceMetrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A new flow was committed (at `plan`).
    pub fn started(&self, id: u64) {
        self.with(|m| {
            m.started += 1;
            m.running.insert(id, State::Plan.kind());
        });
    }

    /// Flow `id` is at `state`, as read from the store (a resume, a pass that changed
    /// nothing): a finished flow is only dropped from the running ones, not counted.
    pub fn at(&self, id: u64, state: &State) {
        self.with(|m| {
            if state.is_terminal() {
                m.running.remove(&id);
            } else {
                m.running.insert(id, state.kind());
            }
        });
    }

    /// The runner committed `state` for flow `id`: a terminal state counts the flow as
    /// finished.
    pub fn moved(&self, id: u64, state: &State) {
        self.with(|m| match state {
            State::Done => {
                m.done += 1;
                m.running.remove(&id);
            }
            State::Failed { .. } => {
                m.failed += 1;
                m.running.remove(&id);
            }
            s => {
                m.running.insert(id, s.kind());
            }
        });
    }

    /// Prometheus text lines.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "# HELP fleetmend_fence_flows_started_total Fence flows started since the coordinator started.\n\
                 # TYPE fleetmend_fence_flows_started_total counter\n\
                 fleetmend_fence_flows_started_total {}\n\
                 # HELP fleetmend_fence_flows_finished_total Fence flows finished since the coordinator started, by outcome (done, failed).\n\
                 # TYPE fleetmend_fence_flows_finished_total counter\n\
                 fleetmend_fence_flows_finished_total{{outcome=\"done\"}} {}\n\
                 fleetmend_fence_flows_finished_total{{outcome=\"failed\"}} {}\n\
                 # HELP fleetmend_fence_flows_running Fence flows not yet done or failed, by the state they are in.\n\
                 # TYPE fleetmend_fence_flows_running gauge",
                m.started, m.done, m.failed
            );
            // Every running state has its series, zero included, so that a dashboard sees
            // every line.
            for state in State::running().iter().map(State::kind) {
                let n = m.running.values().filter(|s| **s == state).count();
                let _ = writeln!(out, "fleetmend_fence_flows_running{{state=\"{state}\"}} {n}");
            }
            out
        })
    }
}

impl MetricsSource for FenceMetrics {
    fn render(&self, out: &mut String) {
        out.push_str(&FenceMetrics::render(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(out: &str, series: &str) -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing in\n{out}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn every_running_state_is_a_series_and_each_end_counts_once() {
        // `running` lists every state but the two ends.
        let running = State::running();
        assert!(running.iter().all(|s| !s.is_terminal()));
        let kinds: std::collections::BTreeSet<_> = running.iter().map(State::kind).collect();
        assert_eq!(kinds.len(), running.len());
        // Whoever adds a state to the flow meets this match, and `State::running` with it.
        let listed = |s: &State| match s {
            State::Plan
            | State::PowerOff
            | State::ConfirmOff
            | State::Release
            | State::WaitReleased
            | State::KdumpWait
            | State::KdumpRelease
            | State::KdumpWaitReleased
            | State::PowerOn
            | State::WaitBack
            | State::Restore => running.contains(s),
            State::Done | State::Failed { .. } => !running.contains(s),
        };
        assert!(running.iter().all(listed));
        assert!(listed(&State::Done));
        let m = FenceMetrics::default();
        m.started(1);
        m.started(2);
        m.moved(1, &State::PowerOff);
        m.at(3, &State::WaitBack); // resumed after a restart
        let out = m.render();
        assert_eq!(value(&out, "fleetmend_fence_flows_started_total"), 2);
        assert_eq!(
            value(&out, "fleetmend_fence_flows_running{state=\"plan\"}"),
            1
        );
        assert_eq!(
            value(&out, "fleetmend_fence_flows_running{state=\"power-off\"}"),
            1
        );
        assert_eq!(
            value(&out, "fleetmend_fence_flows_running{state=\"wait-back\"}"),
            1
        );
        assert_eq!(
            value(&out, "fleetmend_fence_flows_running{state=\"restore\"}"),
            0
        );

        m.moved(1, &State::Done);
        m.moved(
            2,
            &State::Failed {
                detail: "bmc said no".into(),
            },
        );
        // A pass that reads a finished flow again does not count it twice.
        m.at(
            2,
            &State::Failed {
                detail: "bmc said no".into(),
            },
        );
        m.at(3, &State::Done);
        let out = m.render();
        assert_eq!(
            value(
                &out,
                "fleetmend_fence_flows_finished_total{outcome=\"done\"}"
            ),
            1
        );
        assert_eq!(
            value(
                &out,
                "fleetmend_fence_flows_finished_total{outcome=\"failed\"}"
            ),
            1
        );
        for state in running.iter().map(State::kind) {
            let series = format!("fleetmend_fence_flows_running{{state=\"{state}\"}}");
            assert_eq!(value(&out, &series), 0, "{state}");
        }
    }
}
