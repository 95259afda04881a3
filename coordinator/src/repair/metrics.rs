//! The repair queue's `/metrics` series: entries by status, the enabled flag, entries that
//! ended by status, and commands run by kind and result.
//!
//! The engine writes these after each pass and each command report; rendering happens on
//! the `/metrics` request. This module keeps no other state and takes no decision.

use std::collections::BTreeMap;
use std::sync::Mutex;

use protocol::admin::repair::{RepairQueueCounts, RepairStatus};

use super::command::{CommandKind, Outcome};

/// Counters and gauges of the queue.
#[derive(Debug, Default)]
pub struct RepairMetrics(Mutex<MetricsState>);

#[derive(Debug, Default)]
struct MetricsState {
    by_status: [u64; 4],
    deleting: u64,
    enabled: bool,
    commands: BTreeMap<(CommandKind, Outcome), u64>,
    /// Entries that became `succeeded` and `failed`, in that order.
    finished: [u64; 2],
}

impl RepairMetrics {
    fn with<T>(&self, f: impl FnOnce(&mut MetricsState) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Sets the gauges from the queue's counts.
    pub(super) fn set_counts(&self, c: &RepairQueueCounts) {
        self.with(|m| {
            m.by_status = [c.queued, c.processing, c.succeeded, c.failed];
            m.deleting = c.deleting;
            m.enabled = c.enabled;
        });
    }

    /// Counts one command that ended with `outcome`.
    pub(super) fn command_ended(&self, kind: CommandKind, outcome: Outcome) {
        self.with(|m| *m.commands.entry((kind, outcome)).or_default() += 1);
    }

    /// Counts one entry that became `status` (`succeeded` or `failed`). The gauge of
    /// failed entries alone misses a failure when an older failed entry is deleted
    /// between two scrapes; this counter does not.
    pub(super) fn entry_finished(&self, status: RepairStatus) {
        self.with(|m| match status {
            RepairStatus::Succeeded => m.finished[0] += 1,
            RepairStatus::Failed => m.finished[1] += 1,
            _ => {}
        });
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
            s.push_str("# HELP fleetmend_repair_entries_finished_total Repair queue entries that ended, by status, since the coordinator started.\n");
            s.push_str("# TYPE fleetmend_repair_entries_finished_total counter\n");
            for (st, n) in [("succeeded", m.finished[0]), ("failed", m.finished[1])] {
                let _ = writeln!(s, "fleetmend_repair_entries_finished_total{{status=\"{st}\"}} {n}");
            }
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
