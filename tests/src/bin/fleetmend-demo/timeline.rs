//! The live timeline: what the coordinator says changed, asked the way an operator would
//! (`coordinatorctl machines list`, `events`, `repair-queue list` and `show`, all `--json`),
//! printed one timestamped line per change.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::Value;
use testkit::ctl_json::{JournalLine, MachineSummary};

use super::{Demo, POLL, field};

/// What the timeline has seen, to print only what changed.
#[derive(Default)]
pub(super) struct Seen {
    /// Health state by address.
    states: BTreeMap<String, String>,
    /// Journal lines by (address, outcome, rule, first made): a repeat is not news.
    decisions: BTreeSet<(String, String, String, jiff::Timestamp)>,
    /// Status and step by entry index.
    entries: BTreeMap<String, String>,
    /// History events printed, by entry index.
    history: BTreeMap<String, usize>,
    /// Finished entries whose history was read after they finished.
    done: BTreeSet<String>,
}

/// The latest answers of `coordinatorctl`.
#[derive(Default)]
pub(super) struct Snapshot {
    pub(super) machines: Vec<MachineSummary>,
    pub(super) events: Vec<JournalLine>,
    pub(super) entries: Vec<Value>,
}

impl Demo {
    /// Asks the coordinator what changed (at most every [`POLL`]) and prints it.
    pub(super) fn poll(&mut self) -> anyhow::Result<()> {
        if self.last_poll.is_some_and(|t| t.elapsed() < POLL) {
            return Ok(());
        }
        self.last_poll = Some(Instant::now());
        let c = self.coord();
        let machines: Vec<MachineSummary> = c.ctl_json(&["machines", "list", "--json"])?;
        let events: Vec<JournalLine> = c.ctl_json(&["events", "--json"])?;
        let entries: Vec<Value> = c.ctl_json(&["repair-queue", "list", "--json"])?;
        for m in &machines {
            let before = self
                .seen
                .states
                .insert(m.spec.address.clone(), m.state.clone());
            if before.as_deref() != Some(m.state.as_str()) && before.is_some() {
                let why = if m.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", m.reason)
                };
                self.say(
                    "machine",
                    &format!(
                        "{} {} → {}{why}",
                        m.spec.hostname,
                        before.unwrap_or_default(),
                        m.state
                    ),
                );
            }
        }
        for l in &events {
            let key = (
                l.address.clone(),
                l.outcome.clone(),
                l.rule.clone(),
                l.first_at,
            );
            if self.seen.decisions.insert(key) {
                self.say(
                    "decide",
                    &format!(
                        "{} {} [{}]: {}",
                        self.host_of(&l.address),
                        l.outcome,
                        l.rule,
                        l.sentence
                    ),
                );
            }
        }
        for e in &entries {
            let index = field(e, "index").to_string();
            let state = format!(
                "{} (step {} {})",
                field(e, "status"),
                e["step"],
                field(e, "step_status")
            );
            // An entry's history is read while it runs, and once more after it finished.
            let finished = matches!(field(e, "status"), "succeeded" | "failed");
            if !self.seen.done.contains(&index) {
                let shown = self.seen.history.get(&index).copied().unwrap_or(0);
                let v: Value =
                    self.coord()
                        .ctl_json(&["repair-queue", "show", &index, "--json"])?;
                let history = v["history"].as_array().cloned().unwrap_or_default();
                for h in history.iter().skip(shown) {
                    let detail = field(h, "detail");
                    let sep = if detail.is_empty() { "" } else { ": " };
                    self.say(
                        "repair",
                        &format!("entry {index}: {}{sep}{detail}", field(h, "event")),
                    );
                }
                self.seen.history.insert(index.clone(), history.len());
                if finished {
                    self.seen.done.insert(index.clone());
                }
            }
            if self.seen.entries.get(&index) != Some(&state) {
                self.say(
                    "queue",
                    &format!(
                        "entry {index} {} {}: {state}",
                        field(e, "operation"),
                        self.host_of(field(e, "address"))
                    ),
                );
                self.seen.entries.insert(index.clone(), state);
            }
        }
        self.snap = Snapshot {
            machines,
            events,
            entries,
        };
        Ok(())
    }
}
