//! The live timeline: what the coordinator says changed, asked the way an operator would
//! (`coordinatorctl machines list`, `events`, `repair-queue list` and `show`, all `--json`),
//! printed one timestamped line per change; and what the fake API server holds for the dead
//! machine: its out-of-service taint and its workload (a fence sets the one and releases the
//! other).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::Value;
use testkit::ctl_json::{JournalLine, MachineSummary};

use super::{DEAD_HOST, DEAD_POD, Demo, POLL, field};

/// The taint a fence puts on a powered-off Node so its pods and volumes are released.
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

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
    /// The dead machine's Node: out-of-service taint set, pod bound, volume attached.
    dead_node: Option<(bool, bool, bool)>,
    /// Bytes of the coordinator's log already read.
    log_read: usize,
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
        self.watch_diagnostics();
        Ok(())
    }

    /// Before a power action the coordinator asks the machine's agent for diagnostics, for
    /// up to 10 s: a killed agent's connection has not timed out yet, so the step waits. The
    /// coordinator's log says when it gave up; the timeline says so, to explain the pause.
    fn watch_diagnostics(&mut self) {
        let log = self.coord().log_text();
        let Some(end) = log.rfind('\n').map(|i| i + 1) else {
            return;
        };
        let from = self.seen.log_read.min(end);
        self.seen.log_read = end;
        let lines: Vec<String> = log[from..end]
            .lines()
            .filter(|l| l.contains("no diagnostics before the power action"))
            .map(str::to_string)
            .collect();
        for l in lines {
            let addr = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("machine="))
                .unwrap_or_default();
            let why = l
                .split_once("timeout: ")
                .and_then(|(_, r)| r.split([' ', '}']).next())
                .map_or(String::new(), |t| {
                    format!(" within {t} (the killed agent's connection had not timed out yet)")
                });
            self.say(
                "repair",
                &format!(
                    "coordinator: no diagnostics from {}'s agent before the power action{why}; acting without them",
                    self.host_of(addr)
                ),
            );
        }
    }

    /// Prints what changed on the dead machine's Node in the API server: the out-of-service
    /// taint coming and going, its StatefulSet pod and volume attachment released.
    ///
    /// Called after the BMCs' power changes are shown, so a taint set after the power-off
    /// reads after it.
    pub(super) fn watch_dead_node(&mut self) {
        let (ns, pod, _) = DEAD_POD;
        let tainted = self.k8s.node(DEAD_HOST).is_some_and(|n| {
            n["spec"]["taints"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["key"] == OUT_OF_SERVICE))
        });
        let bound = self
            .k8s
            .pods_on(DEAD_HOST)
            .iter()
            .any(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == pod);
        let attached = !self.k8s.volume_attachments_on(DEAD_HOST).is_empty();
        let now = (tainted, bound, attached);
        let Some(before) = self.seen.dead_node.replace(now) else {
            return;
        };
        if before.0 != tainted {
            let what = if tainted { "set on" } else { "removed from" };
            self.say(
                "k8s",
                &format!("{OUT_OF_SERVICE} taint {what} Node {DEAD_HOST}"),
            );
        }
        if before.1 && !bound {
            self.say(
                "k8s",
                &format!("workload released: pod {ns}/{pod} is gone from {DEAD_HOST}"),
            );
        }
        if before.2 && !attached {
            self.say(
                "k8s",
                &format!("workload released: {DEAD_HOST}'s volume attachment is gone"),
            );
        }
    }
}
