//! `coordinatorctl auto-repair`, `constraints`, `remediation`, `events` and
//! `machines clear`: the operator's handles on automatic remediation (as `ckecli
//! auto-repair` and `ckecli constraints` where CKE has the word), and the decision journal.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand, ValueEnum};
use protocol::admin::remediation::{
    EventsQuery, JournalLine, RemediationRequest, RemediationResponse, RemediationStatus,
};
use protocol::admin::{AdminRequest, AdminResponse};

use super::client::AdminClient;
use super::common::{
    CommandGroup, Ctx, Polling, fmt_time, print_json, print_table, rfc3339_ms, script_value,
};

async fn call(
    client: &AdminClient,
    req: RemediationRequest,
) -> anyhow::Result<RemediationResponse> {
    match client.request(&AdminRequest::Remediation(req)).await? {
        AdminResponse::Remediation(r) => Ok(r),
        other => bail!("unexpected answer from the coordinator: {other:?}"),
    }
}

/// Connects, runs `f`, closes.
async fn with_client<T>(
    ctx: &Ctx,
    f: impl AsyncFnOnce(&AdminClient) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let client = ctx.client().await?;
    let r = f(&client).await;
    client.close().await;
    r
}

/// sabakan-style auto-repair (as `ckecli auto-repair`).
#[derive(Debug, Subcommand)]
pub enum AutoRepairCommand {
    /// Turn auto-repair on.
    Enable,
    /// Turn auto-repair off (health checks and running repairs go on).
    Disable,
    /// Print `true` if auto-repair is on, `false` otherwise.
    IsEnabled {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace the `having` / `notHaving` variables from a JSON file, e.g.
    /// `{"having": {"states": ["unhealthy"]}, "notHaving": {"roles": ["boot"]}}`.
    SetVariables {
        /// The JSON file.
        file: PathBuf,
    },
    /// Print the variables in force.
    GetVariables {
        /// Print compact JSON (the default output is indented JSON too).
        #[arg(long)]
        json: bool,
    },
}

impl CommandGroup for AutoRepairCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        use AutoRepairCommand as C;
        let (req, json) = match self {
            C::Enable => (RemediationRequest::SetAutoRepair(true), false),
            C::Disable => (RemediationRequest::SetAutoRepair(false), false),
            C::IsEnabled { json } => (RemediationRequest::IsAutoRepairEnabled, json),
            C::SetVariables { file } => {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                (RemediationRequest::SetVariables { json: text }, false)
            }
            C::GetVariables { json } => (RemediationRequest::GetVariables, json),
        };
        let quiet = matches!(
            req,
            RemediationRequest::SetAutoRepair(_) | RemediationRequest::SetVariables { .. }
        );
        match with_client(ctx, async |c| call(c, req).await).await? {
            RemediationResponse::AutoRepairEnabled(on) if json => {
                print_json(&serde_json::json!({ "enabled": on }))?
            }
            RemediationResponse::AutoRepairEnabled(_) if quiet => {}
            RemediationResponse::AutoRepairEnabled(on) => println!("{on}"),
            RemediationResponse::Variables(_) if quiet => {}
            RemediationResponse::Variables(v) => {
                let v: serde_json::Value = serde_json::from_str(&v)?;
                if json {
                    println!("{v}");
                } else {
                    print_json(&v)?;
                }
            }
            other => bail!("unexpected answer: {other:?}"),
        }
        Ok(())
    }
}

/// CKE's constraints that auto-repair obeys (as `ckecli constraints`).
#[derive(Debug, Subcommand)]
pub enum ConstraintsCommand {
    /// Set one constraint: `maximum-repair-queue-entries` or
    /// `wait-seconds-to-repair-rebooting`.
    Set {
        /// The constraint.
        name: String,
        /// Its value.
        value: u64,
        /// Print the constraints in force afterwards, as JSON (as `show --json`).
        #[arg(long)]
        json: bool,
    },
    /// Print the constraints in force.
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl CommandGroup for ConstraintsCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let (req, json, quiet) = match self {
            // Quiet as `ckecli constraints set`, unless asked for JSON.
            ConstraintsCommand::Set { name, value, json } => (
                RemediationRequest::SetConstraint { name, value },
                json,
                !json,
            ),
            ConstraintsCommand::Show { json } => (RemediationRequest::Constraints, json, false),
        };
        match with_client(ctx, async |c| call(c, req).await).await? {
            RemediationResponse::Constraints(_) if quiet => {}
            RemediationResponse::Constraints(c) if json => print_json(&c)?,
            RemediationResponse::Constraints(c) => {
                println!(
                    "maximum-repair-queue-entries: {}",
                    c.maximum_repair_queue_entries
                );
                println!(
                    "wait-seconds-to-repair-rebooting: {}",
                    c.wait_seconds_to_repair_rebooting
                );
            }
            other => bail!("unexpected answer: {other:?}"),
        }
        Ok(())
    }
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// Automatic remediation's switches and limits.
#[derive(Debug, Subcommand)]
pub enum RemediationCommand {
    /// Stop new remediations (running repairs, health checks and uncordons go on).
    Pause {
        /// Why; shown in every held decision.
        #[arg(long)]
        reason: String,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lift a pause.
    Resume {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Which limits hold now and why, the switches, and the last pass's decisions.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Say the silence of many agents is real (a power loss, not the coordinator's own
    /// network): self-isolation stops holding; every other limit still applies.
    ConfirmOutage {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Observe mode: record "would enqueue", enqueue nothing.
    Observe {
        /// `on` or `off`.
        state: OnOff,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
}

impl CommandGroup for RemediationCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        use RemediationCommand as C;
        let (req, json) = match self {
            C::Pause { reason, json } => (RemediationRequest::Pause { reason }, json),
            C::Resume { json } => (RemediationRequest::Resume, json),
            C::Status { json } => (RemediationRequest::Status, json),
            C::ConfirmOutage { json } => (RemediationRequest::ConfirmOutage, json),
            C::Observe { state, json } => (
                RemediationRequest::Observe(matches!(state, OnOff::On)),
                json,
            ),
        };
        match with_client(ctx, async |c| call(c, req).await).await? {
            RemediationResponse::Status(s) if json => print_json(&s)?,
            RemediationResponse::Status(s) => print_status(&s),
            other => bail!("unexpected answer: {other:?}"),
        }
        Ok(())
    }
}

fn print_status(s: &RemediationStatus) {
    match &s.paused {
        Some((reason, at)) => println!("paused:      yes, since {} ({reason})", fmt_time(*at)),
        None => println!("paused:      no"),
    }
    println!(
        "observe:     {}",
        if s.observe {
            "on (nothing is enqueued)"
        } else {
            "off"
        }
    );
    println!(
        "auto-repair: {}",
        if s.auto_repair_enabled { "on" } else { "off" }
    );
    println!(
        "signals:     {}",
        if s.kubernetes {
            "agent and Kubernetes (Lease and Ready)"
        } else {
            "agent only (no [kubernetes])"
        }
    );
    if let Some(t) = s.outage_confirmed_unix_ms {
        println!("outage:      confirmed at {}", fmt_time(t));
    }
    println!(
        "last pass:   {}",
        s.last_pass_unix_ms.map_or("never".into(), fmt_time)
    );
    println!();
    let rows: Vec<Vec<String>> = s
        .limits
        .iter()
        .map(|l| {
            vec![
                l.rule.clone(),
                if l.holding { "HOLDING" } else { "ok" }.into(),
                l.sentence.clone(),
            ]
        })
        .collect();
    print_table(&["LIMIT", "STATE", "NOW"], &rows);
    if !s.decisions.is_empty() {
        println!();
        events_table(&s.decisions);
    }
    if s.decisions_omitted > 0 {
        println!(
            "… and {} more decisions of the last pass (coordinatorctl events)",
            s.decisions_omitted
        );
    }
}

fn event_row(l: &JournalLine) -> Vec<String> {
    vec![
        fmt_time(l.last_unix_ms),
        l.address.clone(),
        l.outcome.clone(),
        l.rule.clone(),
        l.count.to_string(),
        l.sentence.clone(),
    ]
}

fn events_table(lines: &[JournalLine]) {
    let rows: Vec<Vec<String>> = lines.iter().map(event_row).collect();
    print_table(
        &["TIME", "MACHINE", "OUTCOME", "RULE", "COUNT", "DECISION"],
        &rows,
    );
}

/// The decision journal: every remediation decision, admitted or held, with its reason.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this machine (its address or its hostname).
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    machine: Option<String>,
    /// Only decisions made since this time: RFC 3339 (`2026-11-23T04:00:00Z`) or a
    /// duration ago (`10m`, `2h`).
    #[arg(long, value_parser = since_arg)]
    since: Option<String>,
    /// Keep printing decisions as they are made: new ones and changed ones (a decision
    /// repeated unchanged by the next pass is not printed again; its COUNT grows).
    #[arg(long)]
    follow: bool,
    /// Print JSON (with --follow: one object per line).
    #[arg(long)]
    json: bool,
    /// At most this many lines (the newest; 0 = the coordinator's default of 1000).
    #[arg(long, default_value_t = 0)]
    limit: u32,
}

super::common::flags_only_command!(EventsArgs);

/// Parses `--since`.
pub fn parse_since(s: &str, now: jiff::Timestamp) -> anyhow::Result<u64> {
    let t = match s.parse::<jiff::Timestamp>() {
        Ok(t) => t,
        Err(_) => {
            let d = crate::duration::parse(s).map_err(|_| {
                anyhow::anyhow!(
                    "neither an RFC 3339 time (`2026-11-23T04:00:00Z`) nor a duration ago (`10m`, `2h`)"
                )
            })?;
            jiff::SignedDuration::try_from(d)
                .ok()
                .and_then(|d| now.checked_sub(d).ok())
                .ok_or_else(|| anyhow::anyhow!("the duration reaches back before 1970"))?
        }
    };
    Ok(u64::try_from(t.as_millisecond()).unwrap_or(0))
}

/// Checks `--since` when the command line is read, so a bad value is a usage error (exit 2)
/// that names the flag; it is turned into a time when the request is made.
fn since_arg(s: &str) -> Result<String, String> {
    parse_since(s, jiff::Timestamp::now())
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// How often `events --follow` asks for new lines: a pass is seconds apart, so a second
/// shows each one promptly without loading the coordinator.
const FOLLOW_POLL: Duration = Duration::from_secs(1);

impl CommandGroup for EventsArgs {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        use crate::clock::Clock as _;
        let since = match &self.since {
            Some(s) => Some(parse_since(s, crate::clock::SystemClock.now())?),
            None => None,
        };
        let mut q = EventsQuery {
            machine: self.machine.clone(),
            since_unix_ms: since,
            after_seq: None,
            limit: self.limit,
        };
        let mut poll = Polling::connect(ctx).await?;
        let result = async {
            let mut header = false;
            let mut printed = Printed::default();
            loop {
                let req = AdminRequest::Remediation(RemediationRequest::Events(q.clone()));
                // A follow goes on through a coordinator restart, as `tail -F` would.
                let answer = if self.follow {
                    poll.request(&req, None).await?
                } else {
                    poll.request(&req, Some(tokio::time::Instant::now()))
                        .await?
                };
                let lines = match answer {
                    AdminResponse::Remediation(RemediationResponse::Events(l)) => l,
                    other => bail!("unexpected answer: {other:?}"),
                };
                if let Some(l) = lines.last() {
                    q.after_seq = Some(l.seq);
                }
                let lines: Vec<JournalLine> = if self.follow {
                    lines.into_iter().filter(|l| printed.changed(l)).collect()
                } else {
                    lines
                };
                if self.json && self.follow {
                    for l in &lines {
                        println!("{}", script_value(serde_json::to_value(l)?));
                    }
                } else if self.json {
                    print_json(&lines)?;
                } else if !self.follow {
                    events_table(&lines);
                } else if !header {
                    // One header with the lines so far, then rows as they come.
                    events_table(&lines);
                    header = true;
                } else {
                    for l in &lines {
                        println!("{}", super::common::shown(&event_row(l).join("  ")));
                    }
                }
                if !self.follow {
                    return Ok(());
                }
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                tokio::time::sleep(FOLLOW_POLL).await;
                if stdout_reader_gone() {
                    return Ok(());
                }
            }
        }
        .await;
        poll.close().await;
        result
    }
}

/// What `events --follow` has printed: each journal line's decision as last printed, so a
/// pass that repeats it unchanged (the line's seq, count and time move on) prints nothing,
/// as `kubectl get --watch` shows changes only.
#[derive(Debug, Default)]
struct Printed(std::collections::HashMap<DecisionKey, (Option<String>, String)>);

/// One journal line's decision, as its machine, outcome, rule and first time name it.
type DecisionKey = (String, String, String, u64);

impl Printed {
    /// True when `l` is a decision not printed yet, or one whose operation or sentence
    /// changed since it was.
    fn changed(&mut self, l: &JournalLine) -> bool {
        let key = (
            l.address.clone(),
            l.outcome.clone(),
            l.rule.clone(),
            l.first_unix_ms,
        );
        let now = (l.operation.clone(), l.sentence.clone());
        self.0.insert(key, now.clone()).as_ref() != Some(&now)
    }
}

/// True when stdout's reader has gone (`events --follow | head -3` once head has its
/// lines): the kernel flags the write end of a pipe without readers with `POLLERR`, and a
/// hung-up terminal or socket with `POLLHUP`. Without this check a follow that has nothing
/// new to print would never write, so never see the broken pipe, and would run until
/// killed; checked between polls it ends within a second, as `tail -f` does.
pub(super) fn stdout_reader_gone() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let out = std::io::stdout();
    let mut fds = [PollFd::new(out.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// `machines clear ADDRESS`: clears `needs-human`.
pub async fn clear_machine(ctx: &Ctx, address: String, json: bool) -> anyhow::Result<()> {
    let req = RemediationRequest::ClearMachine { address };
    match with_client(ctx, async |c| call(c, req).await).await? {
        RemediationResponse::Cleared {
            address,
            at_unix_ms,
            was_needs_human,
        } => {
            if json {
                print_json(&serde_json::json!({
                    "address": address,
                    "cleared_at": rfc3339_ms(at_unix_ms),
                    "was_needs_human": was_needs_human,
                }))?;
            } else if was_needs_human {
                println!(
                    "{address} cleared at {}: no longer needs a human; automatic remediation may repair it again",
                    fmt_time(at_unix_ms)
                );
            } else {
                println!(
                    "{address} was not held as needs-human; cleared at {} anyway: its remediations before then no longer count toward the limit",
                    fmt_time(at_unix_ms)
                );
            }
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_prints_new_and_changed_decisions_not_unchanged_repeats() {
        let line = |seq: u64, count: u64, sentence: &str| JournalLine {
            seq,
            first_unix_ms: 1_000,
            last_unix_ms: 1_000 + seq,
            count,
            address: "10.0.0.1".into(),
            domain: "r1".into(),
            outcome: "held".into(),
            rule: "fleet-cap".into(),
            operation: Some("unhealthy".into()),
            sentence: sentence.into(),
        };
        let mut p = Printed::default();
        assert!(p.changed(&line(1, 1, "held: 1 of 1 repairs in flight")));
        assert!(!p.changed(&line(2, 2, "held: 1 of 1 repairs in flight")));
        assert!(!p.changed(&line(3, 3, "held: 1 of 1 repairs in flight")));
        assert!(p.changed(&line(4, 4, "held: 2 of 2 repairs in flight")));
        let other = JournalLine {
            address: "10.0.0.2".into(),
            ..line(5, 1, "held: 2 of 2 repairs in flight")
        };
        assert!(p.changed(&other), "another machine's decision is new");
    }

    #[test]
    fn since_takes_a_time_or_a_duration_ago() {
        let now: jiff::Timestamp = "2026-11-23T04:00:00Z".parse().unwrap();
        assert_eq!(
            parse_since("2026-11-23T03:00:00Z", now).unwrap(),
            parse_since("1h", now).unwrap()
        );
        assert!(parse_since("yesterday", now).is_err());
    }
}
