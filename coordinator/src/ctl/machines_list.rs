//! `coordinatorctl machines list`: the filters people reach for (`--state`, `--rack`, a
//! label selector `-l key=value,…` as kubectl's) and `--watch`.
//!
//! The coordinator answers with the whole list; the filters are applied here, so they work
//! against coordinators of every release. `--watch` prints the (filtered) table, then one
//! line per machine whose state, failing checks or connection changed (as
//! `kubectl get --watch`), polling every [`WATCH_POLL`], until Ctrl-C or until its reader
//! goes. This module decides nothing and changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use protocol::admin::machines::{MachineSummary, MachinesRequest, MachinesResponse};
use protocol::admin::{AdminRequest, AdminResponse};

use super::common::{Ctx, Polling, fmt_age, print_json, print_table, shown};

/// How often `--watch` asks for the list: states change at report intervals (seconds), so
/// two seconds shows a change promptly without loading the coordinator with full lists.
const WATCH_POLL: Duration = Duration::from_secs(2);

/// `machines list`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Print JSON instead of a table (with --watch: one object per changed machine and line).
    #[arg(long)]
    json: bool,
    /// Only machines in these states (comma-separated or repeated): uninitialized,
    /// healthy, unhealthy, unreachable, updating, retiring, retired, awaiting-registration,
    /// stopped.
    #[arg(long, value_delimiter = ',', value_parser = state_arg)]
    state: Vec<String>,
    /// Only machines of these racks (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    rack: Vec<String>,
    /// Only machines whose labels match every term: `key=value`, `key!=value`, `key` (has
    /// the label), `!key` (has it not); comma-separated, as kubectl's -l.
    #[arg(short = 'l', long = "selector", value_parser = Selector::parse)]
    selector: Option<Selector>,
    /// Print the list, then a line for each machine whose state, failing checks or
    /// connection changes (and for machines added or deleted), until Ctrl-C.
    #[arg(short = 'w', long)]
    watch: bool,
}

fn state_arg(s: &str) -> Result<String, String> {
    let s = s.trim();
    if crate::health::MachineState::ALL
        .iter()
        .any(|m| m.as_str() == s)
    {
        return Ok(s.to_string());
    }
    let known: Vec<&str> = crate::health::MachineState::ALL
        .iter()
        .map(|m| m.as_str())
        .collect();
    Err(format!(
        "{s:?} is not a state; use one of {}",
        known.join(", ")
    ))
}

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    /// `key=value` (or `key==value`).
    Is(String, String),
    /// `key!=value`: the label is absent or has another value.
    IsNot(String, String),
    /// `key`: the label is present.
    Has(String),
    /// `!key`: the label is absent.
    HasNot(String),
}

/// A label selector: every term must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<Term>);

impl Selector {
    /// Parses `key=value,key!=value,key,!key`.
    fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for raw in s.split(',') {
            let t = raw.trim();
            let bad_key =
                |k: &str| k.is_empty() || k.chars().any(|c| c.is_whitespace() || "=!,".contains(c));
            let term = if let Some((k, v)) = t.split_once("!=") {
                Term::IsNot(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Term::Is(k.trim().into(), v.trim().into())
            } else if let Some(k) = t.strip_prefix('!') {
                Term::HasNot(k.trim().into())
            } else {
                Term::Has(t.into())
            };
            let key = match &term {
                Term::Is(k, _) | Term::IsNot(k, _) | Term::Has(k) | Term::HasNot(k) => k,
            };
            if bad_key(key) {
                return Err(format!(
                    "{t:?} in {s:?} is not a selector term; write key=value, key!=value, key \
                     or !key, separated by commas"
                ));
            }
            terms.push(term);
        }
        Ok(Self(terms))
    }

    fn matches(&self, labels: &[(String, String)]) -> bool {
        let get = |k: &str| labels.iter().find(|(l, _)| l == k).map(|(_, v)| v.as_str());
        self.0.iter().all(|t| match t {
            Term::Is(k, v) => get(k) == Some(v.as_str()),
            Term::IsNot(k, v) => get(k) != Some(v.as_str()),
            Term::Has(k) => get(k).is_some(),
            Term::HasNot(k) => get(k).is_none(),
        })
    }
}

impl ListArgs {
    /// True when `m` passes every filter given.
    fn keeps(&self, m: &MachineSummary) -> bool {
        (self.state.is_empty() || self.state.contains(&m.state))
            && (self.rack.is_empty() || self.rack.contains(&m.spec.rack))
            && self
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(&m.spec.labels))
    }

    /// Runs `machines list`.
    pub async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let mut poll = Polling::connect(ctx).await?;
        let result = self.list(&mut poll).await;
        poll.close().await;
        result
    }

    async fn list(&self, poll: &mut Polling<'_>) -> anyhow::Result<()> {
        let mut shown_before: Option<BTreeMap<String, Seen>> = None;
        loop {
            let req = AdminRequest::Machines(MachinesRequest::List);
            // A watch goes on through a coordinator restart, as `events --follow` does.
            let until = (!self.watch).then(tokio::time::Instant::now);
            let list = match poll.request(&req, until).await? {
                AdminResponse::Machines(MachinesResponse::List(l)) => l,
                AdminResponse::Error(r) => return Err(super::client::refused(&r)),
                other => bail!("unexpected answer from the coordinator: {other:?}"),
            };
            let list: Vec<MachineSummary> = list.into_iter().filter(|m| self.keeps(m)).collect();
            let now: BTreeMap<String, Seen> = list
                .iter()
                .map(|m| (m.spec.address.clone(), Seen::of(m)))
                .collect();
            match &shown_before {
                None if self.json && self.watch => {
                    for m in &list {
                        println!("{}", serde_json::to_string(m)?);
                    }
                }
                None if self.json => print_json(&list)?,
                None => summaries_table(&list),
                Some(before) => {
                    for m in list
                        .iter()
                        .filter(|m| before.get(&m.spec.address) != Some(&Seen::of(m)))
                    {
                        if self.json {
                            println!("{}", serde_json::to_string(m)?);
                        } else {
                            println!("{}", shown(&summary_row(m).join("  ")));
                        }
                    }
                    for gone in before.keys().filter(|a| !now.contains_key(*a)) {
                        if self.json {
                            println!(
                                "{}",
                                serde_json::json!({ "address": gone, "deleted": true })
                            );
                        } else {
                            println!("{}  (no longer listed)", shown(gone));
                        }
                    }
                }
            }
            if !self.watch {
                return Ok(());
            }
            shown_before = Some(now);
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            tokio::time::sleep(WATCH_POLL).await;
            if super::remediation::stdout_reader_gone() {
                return Ok(());
            }
        }
    }
}

/// What a watch compares between two polls: a line is printed when any of it changed.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    state: String,
    since: u64,
    failing: Vec<String>,
    connected: bool,
}

impl Seen {
    fn of(m: &MachineSummary) -> Self {
        Self {
            state: m.state.clone(),
            since: m.state_since_unix_ms,
            failing: m.failing.clone(),
            connected: m.connected,
        }
    }
}

/// Now, in Unix milliseconds (the ages in the tables count from it).
pub(super) fn now_ms() -> u64 {
    use crate::clock::Clock as _;
    u64::try_from(crate::clock::SystemClock.now().as_millisecond()).unwrap_or(0)
}

/// An empty field as `-`, so a table's columns stay where `awk` expects them.
pub(super) fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// One machine's row of the `machines list` table.
pub(super) fn summary_row(m: &protocol::admin::machines::MachineSummary) -> Vec<String> {
    let now = now_ms();
    vec![
        m.spec.address.clone(),
        m.spec.hostname.clone(),
        m.state.clone(),
        fmt_age(m.state_since_unix_ms, now),
        or_dash(&m.spec.rack),
        or_dash(&m.spec.role),
        or_dash(&m.spec.machine_type),
        // Reports are kept in memory: after a restart, none until the next one.
        m.last_report_unix_ms
            .map(|t| format!("{} ago", fmt_age(t, now)))
            .unwrap_or_else(|| "-".into()),
        m.failing.join(","),
    ]
}

/// The `machines list` table.
pub(super) fn summaries_table(list: &[protocol::admin::machines::MachineSummary]) {
    let rows: Vec<Vec<String>> = list.iter().map(summary_row).collect();
    print_table(
        &[
            "ADDRESS", "HOSTNAME", "STATE", "FOR", "RACK", "ROLE", "TYPE", "REPORT", "FAILING",
        ],
        &rows,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        list: ListArgs,
    }

    fn machine(address: &str, state: &str, rack: &str, labels: &[(&str, &str)]) -> MachineSummary {
        MachineSummary {
            spec: protocol::admin::machines::MachineSpec {
                address: address.into(),
                hostname: format!("host-{address}"),
                serial: String::new(),
                rack: rack.into(),
                role: String::new(),
                machine_type: String::new(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            state: state.into(),
            state_since_unix_ms: 0,
            failing: vec![],
            reason: String::new(),
            last_report_unix_ms: None,
            connected: false,
        }
    }

    fn kept(args: &[&str], fleet: &[MachineSummary]) -> Vec<String> {
        let cli = Cli::try_parse_from(std::iter::once("list").chain(args.iter().copied())).unwrap();
        fleet
            .iter()
            .filter(|m| cli.list.keeps(m))
            .map(|m| m.spec.address.clone())
            .collect()
    }

    #[test]
    fn filters_by_state_rack_and_label_selector_together() {
        let fleet = [
            machine("a", "healthy", "r1", &[("gpu", "a100"), ("zone", "x")]),
            machine("b", "unhealthy", "r1", &[("gpu", "h100")]),
            machine("c", "unreachable", "r2", &[("zone", "x")]),
            machine("d", "healthy", "r2", &[]),
        ];
        assert_eq!(kept(&[], &fleet), ["a", "b", "c", "d"]);
        assert_eq!(
            kept(&["--state", "unhealthy,unreachable"], &fleet),
            ["b", "c"]
        );
        assert_eq!(kept(&["--state", "healthy", "--rack", "r2"], &fleet), ["d"]);
        assert_eq!(kept(&["-l", "gpu"], &fleet), ["a", "b"]);
        assert_eq!(kept(&["-l", "gpu=a100"], &fleet), ["a"]);
        assert_eq!(kept(&["-l", "gpu!=a100"], &fleet), ["b", "c", "d"]);
        assert_eq!(kept(&["-l", "!gpu,zone=x"], &fleet), ["c"]);
        assert_eq!(
            kept(&["--selector", "gpu,zone==x", "--rack", "r1"], &fleet),
            ["a"]
        );
    }

    #[test]
    fn a_bad_state_or_selector_is_refused_saying_what_is_expected() {
        let e = Cli::try_parse_from(["list", "--state", "sick"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("\"sick\" is not a state; use one of uninitialized, healthy"),
            "{e}"
        );
        for bad in ["=x", "a=b,", "a b=c", "!"] {
            let e = Cli::try_parse_from(["list", "-l", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("is not a selector term"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_watch_prints_a_machine_again_only_when_it_changed() {
        let a = machine("a", "healthy", "r1", &[]);
        let mut b = a.clone();
        b.spec.hostname = "renamed".into();
        assert_eq!(Seen::of(&a), Seen::of(&b), "not what a watch compares");
        b.state = "unhealthy".into();
        assert_ne!(Seen::of(&a), Seen::of(&b));
        let mut c = a.clone();
        c.connected = true;
        assert_ne!(Seen::of(&a), Seen::of(&c));
    }
}
