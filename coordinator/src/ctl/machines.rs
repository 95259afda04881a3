//! `coordinatorctl machines`: list, show, add and import machines.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use clap::builder::NonEmptyStringValueParser;
use protocol::admin::machines::{MachineDetail, MachineSpec, MachinesRequest, MachinesResponse};
use protocol::admin::{AdminRequest, AdminResponse};

use super::common::{CommandGroup, Ctx, fmt_age, fmt_time, print_json, print_table, shown};
use super::machines_list::{now_ms, or_dash, summaries_table};
use crate::inventory::{RecordSource, load_inventory};

/// Machine commands.
#[derive(Debug, Subcommand)]
pub enum MachinesCommand {
    /// Every machine with its state, as a table; filtered by state, rack or labels, and
    /// watched for changes with --watch.
    List(super::machines_list::ListArgs),
    /// One machine: state, since when, why, last report with each check, history.
    Show {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register (or update) a machine.
    Add {
        /// Address (IP), the machine's key.
        address: String,
        /// Hostname; must equal the name in the node's certificate.
        #[arg(long)]
        hostname: String,
        /// Serial number.
        #[arg(long, default_value = "")]
        serial: String,
        /// Rack.
        #[arg(long, default_value = "")]
        rack: String,
        /// Role (e.g. cs, ss).
        #[arg(long, default_value = "")]
        role: String,
        /// Machine type: selects the repair procedure.
        #[arg(long = "type")]
        machine_type: String,
        /// Label `key=value` (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a machine's record (its history stays). Refused for a machine the inventory
    /// file lists (change the file instead) and while a repair of it is active.
    Delete {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Cancel an active repair of the machine instead of refusing.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Retire a machine: admin state `retired`, never repaired, reports ignored.
    Retire {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hand a retired machine back to health checks.
    Unretire {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set an admin state: `updating` (maintenance: no detector touches it), `retiring`,
    /// `retired`, or `auto` to hand the machine back to health checks.
    SetState {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// updating, retiring, retired or auto.
        #[arg(value_parser = ["updating", "retiring", "retired", "auto"])]
        state: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register or update every machine in an inventory file (TOML, or YAML by extension),
    /// all or nothing.
    Import {
        /// The inventory file.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Clear a machine's `needs-human`: automatic remediation may repair it again.
    Clear {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("label {s:?} is not key=value")),
    }
}

/// Whether the agent's connection is open. An unreachable machine's connection can still
/// be open: a machine that lost power or panicked closes nothing, and its connection stays
/// until QUIC's idle timeout; the reason line says whether packets still arrive.
fn connected_line(s: &protocol::admin::machines::MachineSummary) -> String {
    match (s.connected, s.state.as_str()) {
        (true, "unreachable") => format!(
            "yes, but it does not report (a dead machine's connection stays open until QUIC's \
             idle timeout, {}s; the reason says whether packets still arrive)",
            protocol::transport::IDLE_TIMEOUT.as_secs()
        ),
        (true, _) => "yes".into(),
        (false, _) => "no".into(),
    }
}

/// `dumping since T (Ns ago)` / `dump done at T (dumping since T)`, with the crashed boot.
fn kdump_line(k: &protocol::admin::machines::KdumpDetail, now: u64) -> String {
    let mut s = match (k.dumping_now, k.dumping_since_unix_ms, k.done_at_unix_ms) {
        (true, Some(t), _) => format!("dumping since {} ({} ago)", fmt_time(t), fmt_age(t, now)),
        (_, started, Some(t)) => format!(
            "dump done at {}{}",
            fmt_time(t),
            started.map_or(String::new(), |s| format!(
                " (dumping since {})",
                fmt_time(s)
            ))
        ),
        (_, Some(t), None) => format!(
            "dumping reported at {}, but the agent has reported since",
            fmt_time(t)
        ),
        _ => format!("last notice: {}", k.phase.as_str()),
    };
    if let Some(b) = &k.boot_id {
        s.push_str(&format!("; crashed boot {b}"));
    }
    s
}

fn print_detail(d: &MachineDetail) {
    let s = &d.summary;
    let now = now_ms();
    println!("address:   {}", s.spec.address);
    println!("hostname:  {}", s.spec.hostname);
    println!("serial:    {}", or_dash(&s.spec.serial));
    println!("rack:      {}", or_dash(&s.spec.rack));
    println!("role:      {}", or_dash(&s.spec.role));
    println!(
        "type:      {}",
        if s.spec.machine_type.is_empty() {
            "- (awaiting registration)"
        } else {
            &s.spec.machine_type
        }
    );
    let labels: Vec<String> = s
        .spec
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "labels:    {}",
        if labels.is_empty() {
            "-".to_string()
        } else {
            labels.join(",")
        }
    );
    println!(
        "state:     {} since {} ({} ago)",
        s.state,
        fmt_time(s.state_since_unix_ms),
        fmt_age(s.state_since_unix_ms, now)
    );
    println!("reason:    {}", shown(&s.reason));
    println!("connected: {}", connected_line(s));
    if let Some(b) = &d.boot_id {
        println!("boot id:   {b}");
    }
    if let Some(v) = &d.agent_version {
        println!("agent:     {v}");
    }
    if let Some(t) = d.healthy_since_unix_ms {
        println!("healthy since: {}", fmt_time(t));
    }
    if let Some(k) = &d.kdump {
        println!("kdump:     {}", kdump_line(k, now));
    }
    match (&d.last_report, d.last_report_unix_ms) {
        (Some(r), Some(at)) => {
            // The interval the coordinator judges this machine's silence on.
            let every = r
                .report_interval()
                .map(|d| format!(", reports every {}", protocol::duration::display(d)))
                .unwrap_or_default();
            println!(
                "last report: #{} at {} ({} ago){every}",
                r.seq,
                fmt_time(at),
                fmt_age(at, now)
            );
            let since: std::collections::HashMap<&str, u64> = d
                .failing_since
                .iter()
                .map(|(k, t)| (k.as_str(), *t))
                .collect();
            let rows: Vec<Vec<String>> = r
                .checks
                .iter()
                .map(|c| {
                    let key = format!("{}:{}", c.kind.as_str(), c.subject);
                    vec![
                        c.kind.as_str().to_string(),
                        c.subject.clone(),
                        c.status.as_str().to_string(),
                        since
                            .get(key.as_str())
                            .map(|t| fmt_time(*t))
                            .unwrap_or_default(),
                        c.detail.clone(),
                    ]
                })
                .collect();
            print_table(
                &["CHECK", "SUBJECT", "STATUS", "FAILING SINCE", "DETAIL"],
                &rows,
            );
        }
        _ => println!("last report: none since the coordinator started"),
    }
    println!("history:");
    let rows: Vec<Vec<String>> = d
        .transitions
        .iter()
        .map(|t| {
            vec![
                fmt_time(t.at_unix_ms),
                if t.from.is_empty() {
                    "-".into()
                } else {
                    t.from.clone()
                },
                t.to.clone(),
                t.reason.clone(),
            ]
        })
        .collect();
    print_table(&["AT", "FROM", "TO", "REASON"], &rows);
}

fn machines(resp: AdminResponse) -> anyhow::Result<MachinesResponse> {
    match resp {
        AdminResponse::Machines(m) => Ok(m),
        other => bail!("unexpected answer from the coordinator: {other:?}"),
    }
}

/// `machines show`: asks with every check and the report interval, and asks again with
/// less when the coordinator is of a release before [`MachinesRequest::ShowWithChecks`] or
/// [`MachinesRequest::ShowWithInterval`] (it refuses the request as malformed), so this
/// coordinatorctl works against it during an upgrade.
async fn show(ctx: &Ctx, address: String, json: bool) -> anyhow::Result<()> {
    let client = ctx.client().await?;
    let malformed = |resp: &anyhow::Result<AdminResponse>| matches!(resp, Ok(AdminResponse::Error(r)) if r.code == protocol::messages::RefusalCode::Malformed);
    let mut resp = client
        .request_raw(&AdminRequest::Machines(MachinesRequest::ShowWithChecks {
            address: address.clone(),
        }))
        .await;
    if malformed(&resp) {
        resp = client
            .request_raw(&AdminRequest::Machines(MachinesRequest::ShowWithInterval {
                address: address.clone(),
            }))
            .await;
    }
    if malformed(&resp) {
        resp = client
            .request_raw(&AdminRequest::Machines(MachinesRequest::Show { address }))
            .await;
    }
    client.close().await;
    let d = match resp? {
        AdminResponse::Error(r) => return Err(super::client::refused(&r)),
        AdminResponse::Machines(MachinesResponse::ShowWithChecks {
            mut detail,
            report_interval_ms,
            newer_checks,
        }) => {
            if let Some(r) = detail.last_report.as_mut() {
                r.report_interval_ms = report_interval_ms;
                r.checks.extend(newer_checks);
            }
            detail
        }
        AdminResponse::Machines(MachinesResponse::ShowWithInterval {
            mut detail,
            report_interval_ms,
        }) => {
            if let Some(r) = detail.last_report.as_mut() {
                r.report_interval_ms = report_interval_ms;
            }
            detail
        }
        AdminResponse::Machines(MachinesResponse::Show(d)) => d,
        other => bail!("unexpected answer from the coordinator: {other:?}"),
    };
    if json {
        print_json(&d)
    } else {
        print_detail(&d);
        Ok(())
    }
}

impl CommandGroup for MachinesCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let (req, json) = match self {
            MachinesCommand::Clear { address, json } => {
                return super::remediation::clear_machine(ctx, address, json).await;
            }
            MachinesCommand::List(args) => return args.run(ctx).await,
            MachinesCommand::Show { address, json } => {
                return show(ctx, address, json).await;
            }
            MachinesCommand::Add {
                address,
                hostname,
                serial,
                rack,
                role,
                machine_type,
                labels,
                json,
            } => (
                MachinesRequest::Add(MachineSpec {
                    address,
                    hostname,
                    serial,
                    rack,
                    role,
                    machine_type,
                    labels,
                }),
                json,
            ),
            MachinesCommand::Delete {
                address,
                force,
                json,
            } => (MachinesRequest::Delete { address, force }, json),
            MachinesCommand::Retire { address, json } => (
                MachinesRequest::SetState {
                    address,
                    state: "retired".into(),
                },
                json,
            ),
            MachinesCommand::Unretire { address, json } => (
                MachinesRequest::SetState {
                    address,
                    state: "auto".into(),
                },
                json,
            ),
            MachinesCommand::SetState {
                address,
                state,
                json,
            } => (MachinesRequest::SetState { address, state }, json),
            MachinesCommand::Import { file, json } => {
                let records = load_inventory(&file, RecordSource::Admin)
                    .with_context(|| format!("cannot import {}", file.display()))?;
                (
                    MachinesRequest::Import(records.iter().map(|r| r.to_spec()).collect()),
                    json,
                )
            }
        };
        let client = ctx.client().await?;
        let resp = client.request(&AdminRequest::Machines(req)).await;
        client.close().await;
        match machines(resp?)? {
            MachinesResponse::List(list) | MachinesResponse::Imported(list) => {
                if json {
                    print_json(&list)?
                } else {
                    summaries_table(&list)
                }
            }
            MachinesResponse::Show(d)
            | MachinesResponse::ShowWithInterval { detail: d, .. }
            | MachinesResponse::ShowWithChecks { detail: d, .. } => {
                if json {
                    print_json(&d)?
                } else {
                    print_detail(&d)
                }
            }
            MachinesResponse::Deleted {
                address,
                cancelled_repairs,
            } => {
                if json {
                    print_json(&serde_json::json!({
                        "address": address,
                        "cancelled_repairs": cancelled_repairs,
                    }))?
                } else if cancelled_repairs.is_empty() {
                    println!("deleted {address}");
                } else {
                    let list: Vec<String> = cancelled_repairs.iter().map(u64::to_string).collect();
                    println!(
                        "deleted {address}; cancelled repair entries {}",
                        list.join(",")
                    );
                }
            }
            MachinesResponse::StateSet(s) | MachinesResponse::Added(s) => {
                if json {
                    print_json(&s)?
                } else {
                    summaries_table(std::slice::from_ref(&s))
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse() {
        assert_eq!(parse_label("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_label("=x").is_err());
        assert!(parse_label("novalue").is_err());
    }

    #[test]
    fn an_open_connection_of_an_unreachable_machine_is_explained() {
        let summary = |state: &str, connected| protocol::admin::machines::MachineSummary {
            spec: protocol::admin::machines::MachineSpec {
                address: "10.0.0.1".into(),
                hostname: "n1".into(),
                serial: String::new(),
                rack: "r1".into(),
                role: "cs".into(),
                machine_type: String::new(),
                labels: Vec::new(),
            },
            state: state.into(),
            state_since_unix_ms: 0,
            failing: Vec::new(),
            reason: String::new(),
            last_report_unix_ms: None,
            connected,
        };
        assert_eq!(connected_line(&summary("healthy", true)), "yes");
        assert_eq!(connected_line(&summary("unreachable", false)), "no");
        let line = connected_line(&summary("unreachable", true));
        assert!(line.starts_with("yes, but it does not report"), "{line}");
        assert!(line.contains("idle timeout, 30s"), "{line}");
    }
}
