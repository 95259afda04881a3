//! `coordinatorctl diagnostics list|get ADDRESS`: the diagnostics bundles node-agents sent
//! for repair entries (`@collect-diagnostics` steps), kept in the coordinator's store.

use anyhow::bail;
use clap::Subcommand;
use clap::builder::NonEmptyStringValueParser;
use protocol::admin::diagnostics::{DiagnosticsRequest, DiagnosticsResponse, DiagnosticsSummary};
use protocol::admin::{AdminRequest, AdminResponse};
use serde_json::json;

use super::common::{CommandGroup, Ctx, fmt_time, print_table, rfc3339_ms};

/// Diagnostics commands.
#[derive(Debug, Subcommand)]
pub enum DiagnosticsCommand {
    /// List the bundles kept for a machine, newest first.
    List {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a bundle of a machine (the newest unless --id is given).
    Get {
        /// The machine: its address or its hostname.
        #[arg(value_name = "MACHINE", value_parser = NonEmptyStringValueParser::new())]
        address: String,
        /// The bundle's id (from `list`).
        #[arg(long)]
        id: Option<u64>,
        /// Print JSON (summary and content).
        #[arg(long)]
        json: bool,
    },
}

/// One summary as JSON.
pub fn summary_json(s: &DiagnosticsSummary) -> serde_json::Value {
    json!({
        "id": s.id,
        "address": s.address,
        "entry_index": s.entry_index,
        "collected_at": rfc3339_ms(u64::try_from(s.collected_unix_ms).unwrap_or(0)),
        "bytes": s.bytes,
        "truncated_parts": s.truncated_parts,
    })
}

/// Summaries as a table.
pub fn summary_table(list: &[DiagnosticsSummary]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.id.to_string(),
                s.entry_index.to_string(),
                fmt_time(u64::try_from(s.collected_unix_ms).unwrap_or(0)),
                s.bytes.to_string(),
                if s.truncated_parts.is_empty() {
                    "-".into()
                } else {
                    s.truncated_parts.join(", ")
                },
            ]
        })
        .collect();
    print_table(&["ID", "ENTRY", "COLLECTED", "BYTES", "TRUNCATED"], &rows);
}

impl CommandGroup for DiagnosticsCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let client = ctx.client().await?;
        let (req, json_out) = match &self {
            DiagnosticsCommand::List { address, json } => (
                DiagnosticsRequest::List {
                    address: address.clone(),
                },
                *json,
            ),
            DiagnosticsCommand::Get { address, id, json } => (
                DiagnosticsRequest::Get {
                    address: address.clone(),
                    id: *id,
                },
                *json,
            ),
        };
        let resp = client.request(&AdminRequest::Diagnostics(req)).await?;
        client.close().await;
        match resp {
            AdminResponse::Diagnostics(DiagnosticsResponse::List(list)) => {
                if json_out {
                    let v: Vec<_> = list.iter().map(summary_json).collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    // None kept: the header alone, as every listing prints.
                    summary_table(&list);
                }
            }
            AdminResponse::Diagnostics(DiagnosticsResponse::Get(r)) => {
                if json_out {
                    let mut v = summary_json(&r.summary);
                    v["content"] = json!(r.content);
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    eprintln!(
                        "diagnostics #{} of {} (entry {}, {} bytes, collected {})",
                        r.summary.id,
                        r.summary.address,
                        r.summary.entry_index,
                        r.summary.bytes,
                        fmt_time(u64::try_from(r.summary.collected_unix_ms).unwrap_or(0))
                    );
                    print!("{}", r.content);
                }
            }
            AdminResponse::Error(e) => bail!("{}", e.reason),
            other => bail!("unexpected answer from the coordinator: {other:?}"),
        }
        Ok(())
    }
}
