//! `coordinatorctl repair-queue`: the words of `ckecli repair-queue`.
//!
//! `list --json` prints CKE's JSON shape (index as a string, RFC 3339 times, Go's zero time
//! for "no backoff"), so scripts written for `ckecli repair-queue list` keep working.
//! This module only talks to the admin API; it decides nothing.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use protocol::admin::repair::{
    AddRepairEntry, RepairEntry, RepairEntryDetail, RepairHistoryRecord, RepairQueueRequest,
    RepairQueueResponse, RepairStatus,
};
use protocol::admin::{AdminRequest, AdminResponse};
use serde_json::json;

use super::client::AdminClient;
use super::common::{CommandGroup, Ctx, Polling, fmt_time, print_table, shown};

/// Repair queue commands (as `ckecli repair-queue`).
#[derive(Debug, Subcommand)]
pub enum RepairQueueCommand {
    /// Append a repair request for a machine: `add OPERATION [MACHINE_TYPE] ADDRESS [SERIAL]`.
    ///
    /// The address must be a machine of the inventory (or pass --force); a serial or a
    /// machine type that contradicts the inventory is refused, even with --force; a missing
    /// serial or machine type is taken from the inventory.
    ///
    /// An IP address is never a machine type: `add unreachable 10.0.1.12 SN-n2` is the
    /// address and its serial (type from the inventory), `add unreachable qemu 10.0.1.12`
    /// the type and the address, as in CKE.
    Add {
        /// Operation name, e.g. `unreachable`.
        operation: String,
        /// Machine type: selects the repair procedure. Left out, the type comes from the
        /// inventory: an IP address here is the ADDRESS, and what follows it the SERIAL.
        #[arg(value_name = "MACHINE_TYPE")]
        machine_type: String,
        /// The machine's IP address.
        address: Option<String>,
        /// The machine's serial number.
        serial: Option<String>,
        /// Queue it even for an address the inventory does not know, or a retired machine.
        #[arg(long)]
        force: bool,
        /// Print the new entry as JSON (CKE's shape) instead of its index.
        #[arg(long)]
        json: bool,
    },
    /// List the entries.
    List {
        /// Print CKE's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry with its history and command outputs.
    Show {
        /// The entry's index.
        index: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete an entry; a running repair is cancelled.
    Delete {
        /// The entry's index.
        index: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete every succeeded or failed entry.
    DeleteFinished {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete every queued or processing entry.
    DeleteUnfinished {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Enable processing of the queue.
    Enable {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Disable processing: nothing new starts, drains are abandoned, health checks go on.
    Disable {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print `true` if processing is enabled, `false` otherwise.
    IsEnabled {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Clear every entry's drain backoff.
    ResetBackoff {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait until no entry is queued or processing.
    Wait {
        /// Give up after this many seconds (0 = never); exits 1 then.
        #[arg(long, default_value_t = 0)]
        timeout_seconds: u64,
        /// Seconds between polls.
        #[arg(long, default_value_t = 1)]
        interval_seconds: u64,
    },
}

async fn call(
    client: &AdminClient,
    req: RepairQueueRequest,
) -> anyhow::Result<RepairQueueResponse> {
    match client.request(&AdminRequest::RepairQueue(req)).await? {
        AdminResponse::RepairQueue(r) => Ok(r),
        other => bail!("unexpected answer from the coordinator: {other:?}"),
    }
}

impl CommandGroup for RepairQueueCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        if let RepairQueueCommand::Wait {
            timeout_seconds,
            interval_seconds,
        } = self
        {
            return wait(ctx, timeout_seconds, interval_seconds).await;
        }
        let client = ctx.client().await?;
        let result = run(self, &client).await;
        client.close().await;
        result
    }
}

async fn run(cmd: RepairQueueCommand, client: &AdminClient) -> anyhow::Result<()> {
    use RepairQueueCommand as C;
    match cmd {
        C::Add {
            operation,
            machine_type,
            address,
            serial,
            force,
            json,
        } => {
            let (machine_type, address, serial) = add_arguments(machine_type, address, serial)?;
            let req = RepairQueueRequest::AddChecked {
                entry: AddRepairEntry {
                    operation,
                    machine_type,
                    address,
                    serial,
                },
                force,
            };
            // The coordinator checks the arguments; the warning is for an entry it queued,
            // not printed before a refusal of a malformed address or a contradiction.
            let added = call(client, req).await?;
            if let RepairQueueResponse::Added(e) = &added
                && force
            {
                eprintln!(
                    "coordinatorctl: warning: queued with --force: {} is repaired even if the inventory does not know it or it is retired",
                    e.address
                );
            }
            match added {
                RepairQueueResponse::Added(e) if json => {
                    println!("{}", serde_json::to_string_pretty(&cke_json(&e))?)
                }
                RepairQueueResponse::Added(e) => println!("{}", e.index),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        C::List { json } => match call(client, RepairQueueRequest::List).await? {
            RepairQueueResponse::List(list) => {
                if json {
                    let v: Vec<_> = list.iter().map(cke_json).collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    table(&list);
                }
            }
            other => bail!("unexpected answer: {other:?}"),
        },
        C::Show { index, json } => match call(client, RepairQueueRequest::Show { index }).await? {
            RepairQueueResponse::Show(d) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&detail_json(&d))?);
                } else {
                    print_detail(&d);
                }
            }
            other => bail!("unexpected answer: {other:?}"),
        },
        C::Delete { index, json } => deleted(
            call(client, RepairQueueRequest::Delete { index }).await?,
            json,
        )?,
        C::DeleteFinished { json } => deleted(
            call(client, RepairQueueRequest::DeleteFinished).await?,
            json,
        )?,
        C::DeleteUnfinished { json } => deleted(
            call(client, RepairQueueRequest::DeleteUnfinished).await?,
            json,
        )?,
        C::Enable { json } => enabled(
            call(client, RepairQueueRequest::Enable).await?,
            Said::Enable,
            json,
        )?,
        C::Disable { json } => enabled(
            call(client, RepairQueueRequest::Disable).await?,
            Said::Disable,
            json,
        )?,
        C::IsEnabled { json } => enabled(
            call(client, RepairQueueRequest::IsEnabled).await?,
            Said::Ask,
            json,
        )?,
        C::ResetBackoff { json } => match call(client, RepairQueueRequest::ResetBackoff).await? {
            RepairQueueResponse::BackoffReset { count } if json => {
                println!("{}", json!({ "backoff_reset": count }))
            }
            RepairQueueResponse::BackoffReset { count } => {
                println!("drain backoff cleared on {}", entries(count))
            }
            other => bail!("unexpected answer: {other:?}"),
        },
        C::Wait { .. } => unreachable!("run by `wait`, which reconnects"),
    }
    Ok(())
}

/// `repair-queue wait`: polls the counts until nothing is queued or processing, through a
/// coordinator restart (it connects again).
async fn wait(ctx: &Ctx, timeout_seconds: u64, interval_seconds: u64) -> anyhow::Result<()> {
    let interval = Duration::from_secs(interval_seconds.max(1));
    // A limit past what the clock can count is no limit.
    let deadline = (timeout_seconds > 0)
        .then(|| tokio::time::Instant::now().checked_add(Duration::from_secs(timeout_seconds)))
        .flatten();
    let mut poll = Polling::connect(ctx).await?;
    let req = AdminRequest::RepairQueue(RepairQueueRequest::Counts);
    // Waits the full timeout: the last sleep is cut to what is left, then one last look.
    let result = loop {
        let counts = match poll.request(&req, deadline).await {
            Ok(AdminResponse::RepairQueue(RepairQueueResponse::Counts(c))) => c,
            Ok(other) => break Err(anyhow::anyhow!("unexpected answer: {other:?}")),
            Err(e) => break Err(e),
        };
        if counts.all_finished() {
            break Ok(());
        }
        let now = tokio::time::Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break Err(anyhow::anyhow!(
                "timed out after {timeout_seconds} s: {} queued, {} processing",
                counts.queued,
                counts.processing
            ));
        }
        let nap = deadline.map_or(interval, |d| interval.min(d - now));
        tokio::time::sleep(nap).await;
    };
    poll.close().await;
    result
}

/// The step status for a person: a finished entry's last step status (`watching` when it
/// failed while watching) is history, not what it does now, so it shows as `-`. The CKE
/// JSON keeps it, as CKE does.
fn step_status_shown(e: &RepairEntry) -> &'static str {
    match e.status {
        RepairStatus::Succeeded | RepairStatus::Failed => "-",
        _ => e.step_status.as_str(),
    }
}

/// `1 entry`, `2 entries`.
fn entries(n: u64) -> String {
    if n == 1 {
        "1 entry".to_string()
    } else {
        format!("{n} entries")
    }
}

fn deleted(r: RepairQueueResponse, json: bool) -> anyhow::Result<()> {
    match r {
        RepairQueueResponse::Deleted { count } if json => {
            println!("{}", json!({ "marked_for_deletion": count }));
            Ok(())
        }
        RepairQueueResponse::Deleted { count } => {
            eprintln!("{} marked for deletion", entries(count));
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// Which command asked, for what `enabled` says.
enum Said {
    Enable,
    Disable,
    Ask,
}

fn enabled(r: RepairQueueResponse, said: Said, json: bool) -> anyhow::Result<()> {
    let RepairQueueResponse::Enabled(on) = r else {
        bail!("unexpected answer: {r:?}");
    };
    match (json, said) {
        (true, _) => println!("{}", json!({ "enabled": on })),
        (false, Said::Ask) => println!("{on}"),
        (false, Said::Enable) => {
            println!("repair queue enabled: queued entries start as slots are free")
        }
        (false, Said::Disable) => println!(
            "repair queue disabled: nothing new starts, drains are abandoned, entries in progress finish their health checks"
        ),
    }
    Ok(())
}

/// Go's zero `time.Time`, which CKE prints for "never".
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn rfc3339(ms: u64) -> String {
    if ms == 0 {
        return GO_ZERO_TIME.into();
    }
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(0))
        .map(|t| t.to_string())
        .unwrap_or_else(|_| GO_ZERO_TIME.into())
}

/// One entry in CKE's JSON shape (`cke.RepairQueueEntry`).
pub fn cke_json(e: &RepairEntry) -> serde_json::Value {
    json!({
        "index": e.index.to_string(),
        "address": e.address,
        "nodename": e.nodename,
        "serial": e.serial,
        "machine_type": e.machine_type,
        "operation": e.operation,
        "status": e.status.as_str(),
        "step": e.step,
        "step_status": e.step_status.as_str(),
        "deleted": e.deleted,
        "last_transition_time": rfc3339(e.last_transition_time_unix_ms),
        "drain_backoff_count": e.drain_backoff_count,
        "drain_backoff_expire": rfc3339(e.drain_backoff_expire_unix_ms),
    })
}

fn detail_json(d: &RepairEntryDetail) -> serde_json::Value {
    let mut v = cke_json(&d.entry);
    v["history"] = d
        .history
        .iter()
        .map(|h| {
            json!({
                "time": rfc3339(h.at_unix_ms),
                "status": h.status.as_str(),
                "step": h.step,
                "step_status": h.step_status.as_str(),
                "event": h.event,
                "detail": h.detail,
                "output": h.output,
            })
        })
        .collect();
    v["diagnostics"] = d
        .diagnostics
        .iter()
        .map(super::diagnostics::summary_json)
        .collect();
    v
}

fn table(list: &[RepairEntry]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                e.index.to_string(),
                e.address.clone(),
                if e.nodename.is_empty() {
                    "-".into()
                } else {
                    e.nodename.clone()
                },
                e.machine_type.clone(),
                e.operation.clone(),
                format!(
                    "{}{}",
                    e.status.as_str(),
                    if e.deleted { " (deleting)" } else { "" }
                ),
                e.step.to_string(),
                step_status_shown(e).to_string(),
                fmt_time(e.last_transition_time_unix_ms),
                if e.drain_backoff_expire_unix_ms == 0 {
                    "-".into()
                } else {
                    format!(
                        "#{} until {}",
                        e.drain_backoff_count,
                        fmt_time(e.drain_backoff_expire_unix_ms)
                    )
                },
            ]
        })
        .collect();
    print_table(
        &[
            "INDEX",
            "ADDRESS",
            "NODE",
            "TYPE",
            "OPERATION",
            "STATUS",
            "STEP",
            "STEP STATUS",
            "SINCE",
            "DRAIN BACKOFF",
        ],
        &rows,
    );
}

fn print_detail(d: &RepairEntryDetail) {
    let e = &d.entry;
    println!("index:        {}", e.index);
    println!("address:      {}", e.address);
    println!(
        "node:         {}",
        if e.nodename.is_empty() {
            "-"
        } else {
            &e.nodename
        }
    );
    println!("serial:       {}", e.serial);
    println!("type:         {}", e.machine_type);
    println!("operation:    {}", e.operation);
    println!(
        "status:       {}{} (step {}{}) since {}",
        e.status.as_str(),
        if e.deleted { ", deleting" } else { "" },
        e.step,
        match step_status_shown(e) {
            "-" => String::new(),
            st => format!(", {st}"),
        },
        fmt_time(e.last_transition_time_unix_ms)
    );
    // Only once a drain has failed: CKE's counter, and when the next attempt may start.
    if e.drain_backoff_count > 0 || e.drain_backoff_expire_unix_ms != 0 {
        println!(
            "drain:        {} failed attempt{}, next not before {}",
            e.drain_backoff_count,
            if e.drain_backoff_count == 1 { "" } else { "s" },
            if e.drain_backoff_expire_unix_ms == 0 {
                "-".into()
            } else {
                fmt_time(e.drain_backoff_expire_unix_ms)
            }
        );
    }
    println!("history:");
    for h in &d.history {
        for line in history_lines(h) {
            println!("{line}");
        }
    }
    if !d.diagnostics.is_empty() {
        println!(
            "diagnostics:  (coordinatorctl diagnostics get {} --id ID)",
            e.address
        );
        super::diagnostics::summary_table(&d.diagnostics);
    }
}

/// One history event as `show` prints it: its line, then its output's lines under it.
/// Details and output come from commands and agents, so control characters (a terminal
/// escape sequence in a command's output) are shown escaped, and the detail stays one line.
fn history_lines(h: &RepairHistoryRecord) -> Vec<String> {
    let mut lines = vec![format!(
        "  {}  {:<10} step {} {:<8} {:<20} {}",
        fmt_time(h.at_unix_ms),
        h.status.as_str(),
        h.step,
        h.step_status.as_str(),
        shown(&h.event),
        shown(&h.detail)
    )];
    lines.extend(h.output.lines().map(|l| format!("      | {}", shown(l))));
    lines
}

/// Parses a CKE JSON entry back (used by tests to prove the shape round-trips).
pub fn parse_cke_index(v: &serde_json::Value) -> anyhow::Result<u64> {
    v["index"]
        .as_str()
        .context("index is not a string")?
        .parse()
        .context("index is not a number")
}

/// `add`'s arguments after the operation as (machine type, address, serial), empty when left
/// out. CKE's form is `TYPE ADDRESS [SERIAL]`; the type may be left out, and an IP address
/// is never a machine type, so `ADDRESS [SERIAL]` cannot be misread.
fn add_arguments(
    first: String,
    second: Option<String>,
    third: Option<String>,
) -> anyhow::Result<(String, String, String)> {
    let is_ip = first.parse::<std::net::IpAddr>().is_ok();
    match (is_ip, second, third) {
        (true, Some(second), Some(third)) => bail!(
            "{first} is an IP address, so it is not a machine type, and {second:?} and {third:?} \
             cannot both follow it: write `add OPERATION MACHINE_TYPE ADDRESS [SERIAL]` or \
             `add OPERATION ADDRESS [SERIAL]`"
        ),
        (true, serial, _) => Ok((String::new(), first, serial.unwrap_or_default())),
        (false, Some(address), serial) => Ok((first, address, serial.unwrap_or_default())),
        // One argument that is no IP address: the coordinator names it as a bad address.
        (false, None, _) => Ok((String::new(), first, String::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_reads_every_form_and_an_ip_address_is_never_a_machine_type() {
        let add = |a: &str, b: Option<&str>, c: Option<&str>| {
            add_arguments(a.into(), b.map(Into::into), c.map(Into::into)).map_err(|e| e.to_string())
        };
        let t = |m: &str, a: &str, s: &str| Ok((m.to_string(), a.to_string(), s.to_string()));
        // CKE's form, with and without the serial.
        assert_eq!(
            add("qemu", Some("10.0.1.12"), Some("SN-n2")),
            t("qemu", "10.0.1.12", "SN-n2")
        );
        assert_eq!(
            add("qemu", Some("10.0.1.12"), None),
            t("qemu", "10.0.1.12", "")
        );
        // The type left out: from the inventory.
        assert_eq!(add("10.0.1.12", None, None), t("", "10.0.1.12", ""));
        assert_eq!(
            add("10.0.1.12", Some("SN-n2"), None),
            t("", "10.0.1.12", "SN-n2")
        );
        assert_eq!(
            add("fd00::12", Some("SN-n2"), None),
            t("", "fd00::12", "SN-n2")
        );
        // One argument that is no address is passed on for the coordinator to refuse.
        assert_eq!(add("node-12", None, None), t("", "node-12", ""));
        let e = add("10.0.1.12", Some("qemu"), Some("SN-n2")).unwrap_err();
        assert!(
            e.contains("10.0.1.12 is an IP address, so it is not a machine type"),
            "{e}"
        );
    }
    use protocol::admin::repair::RepairStepStatus;

    #[test]
    fn history_shows_command_output_under_its_event_with_control_characters_escaped() {
        let h = RepairHistoryRecord {
            at_unix_ms: 0,
            status: RepairStatus::Failed,
            step: 0,
            step_status: RepairStepStatus::Watching,
            event: "failed".into(),
            detail: "exit status 1\u{1b}[2J".into(),
            output: "line 1\n\u{1b}]0;owned\u{7}line 2\n--- stderr ---\noops".into(),
        };
        let lines = history_lines(&h);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(
            lines[0].ends_with("exit status 1\\u{1b}[2J"),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "      | line 1");
        assert_eq!(lines[2], "      | \\u{1b}]0;owned\\u{7}line 2");
        assert_eq!(lines[4], "      | oops");
        assert!(lines.iter().all(|l| !l.chars().any(char::is_control)));
    }

    #[test]
    fn counts_are_singular_for_one() {
        assert_eq!(entries(1), "1 entry");
        assert_eq!(entries(0), "0 entries");
        assert_eq!(entries(3), "3 entries");
    }

    #[test]
    fn finished_entries_show_no_step_status() {
        let mut e = RepairEntry {
            index: 1,
            address: "10.0.0.1".into(),
            nodename: "".into(),
            serial: "".into(),
            machine_type: "qemu".into(),
            operation: "unreachable".into(),
            status: RepairStatus::Failed,
            step: 0,
            step_status: RepairStepStatus::Watching,
            deleted: false,
            last_transition_time_unix_ms: 0,
            drain_backoff_count: 0,
            drain_backoff_expire_unix_ms: 0,
        };
        assert_eq!(step_status_shown(&e), "-");
        e.status = RepairStatus::Processing;
        assert_eq!(step_status_shown(&e), "watching");
    }

    #[test]
    fn list_json_has_ckes_shape() {
        let e = RepairEntry {
            index: 7,
            address: "10.0.0.1".into(),
            nodename: "".into(),
            serial: "S1".into(),
            machine_type: "qemu".into(),
            operation: "unreachable".into(),
            status: RepairStatus::Processing,
            step: 1,
            step_status: RepairStepStatus::Watching,
            deleted: false,
            last_transition_time_unix_ms: 1_700_000_000_000,
            drain_backoff_count: 0,
            drain_backoff_expire_unix_ms: 0,
        };
        let v = cke_json(&e);
        assert_eq!(v["index"], "7");
        assert_eq!(parse_cke_index(&v).unwrap(), 7);
        assert_eq!(v["status"], "processing");
        assert_eq!(v["step_status"], "watching");
        assert_eq!(v["last_transition_time"], "2023-11-14T22:13:20Z");
        assert_eq!(v["drain_backoff_expire"], GO_ZERO_TIME);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "index",
            "address",
            "nodename",
            "machine_type",
            "operation",
            "status",
            "step",
            "step_status",
            "deleted",
            "last_transition_time",
            "drain_backoff_count",
            "drain_backoff_expire",
        ] {
            assert!(keys.contains(&k), "missing {k}");
        }
    }
}
