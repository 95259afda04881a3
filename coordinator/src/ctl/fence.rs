//! `coordinatorctl fence list|show ID`: the fence flows the coordinator ran or is running,
//! and the committed steps of one (see docs/fencing.md). Read-only.
//!
//! Tables by default (times to the second; no flows, the header alone); `--json` prints
//! times as RFC 3339 strings with milliseconds.

use anyhow::bail;
use clap::Subcommand;
use clap::builder::NonEmptyStringValueParser;
use protocol::admin::fence::{FenceFlowSummary, FenceRequest, FenceResponse};
use protocol::admin::{AdminRequest, AdminResponse};
use serde_json::json;

use super::common::{CommandGroup, Ctx, fmt_time, print_table};

/// Fence commands.
#[derive(Debug, Subcommand)]
pub enum FenceCommand {
    /// List fence flows, newest first.
    List {
        /// Only the flows of this machine (address or hostname).
        #[arg(long, value_parser = NonEmptyStringValueParser::new())]
        machine: Option<String>,
        /// How many at most (1 or more).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one fence flow and its steps.
    Show {
        /// The flow's id (from `list`).
        id: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A time for tables: RFC 3339, to the second.
fn time(ms: i64) -> String {
    fmt_time(u64::try_from(ms).unwrap_or(0))
}

/// A time for JSON: RFC 3339 with milliseconds (a fence takes seconds; its steps are
/// compared to the millisecond).
fn precise(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn opt_time(ms: Option<i64>) -> Option<String> {
    ms.map(time)
}

/// One flow as JSON (times as RFC 3339 strings, `null` when not reached; `failure` is
/// `null` when there is none).
pub fn flow_json(f: &FenceFlowSummary) -> serde_json::Value {
    json!({
        "id": f.id,
        "address": f.address,
        "serial": f.serial,
        "node": f.node,
        "state": f.state,
        "failure": (!f.failure.is_empty()).then_some(&f.failure),
        "release": f.release,
        "keep_off": f.keep_off,
        "state_since": precise(f.state_since_unix_ms),
        "confirmed_off": f.confirmed_off_unix_ms.map(precise),
        "powered_on": f.powered_on_unix_ms.map(precise),
    })
}

fn dash(s: Option<String>) -> String {
    s.unwrap_or_else(|| "-".into())
}

fn flows_table(list: &[FenceFlowSummary]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|f| {
            vec![
                f.id.to_string(),
                f.address.clone(),
                f.node.clone(),
                f.state.clone(),
                time(f.state_since_unix_ms),
                dash(opt_time(f.confirmed_off_unix_ms)),
                dash(opt_time(f.powered_on_unix_ms)),
                if f.failure.is_empty() {
                    "-".into()
                } else {
                    f.failure.clone()
                },
            ]
        })
        .collect();
    print_table(
        &[
            "ID", "MACHINE", "NODE", "STATE", "SINCE", "OFF", "ON", "FAILURE",
        ],
        &rows,
    );
}

impl CommandGroup for FenceCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let (req, json_out) = match &self {
            FenceCommand::List {
                machine: None,
                limit,
                json,
            } => (FenceRequest::List { limit: *limit }, *json),
            FenceCommand::List {
                machine: Some(m),
                limit,
                json,
            } => (
                FenceRequest::ListFor {
                    machine: m.clone(),
                    limit: *limit,
                },
                *json,
            ),
            FenceCommand::Show { id, json } => (FenceRequest::Show { id: *id }, *json),
        };
        let client = ctx.client().await?;
        let resp = client.request(&AdminRequest::Fence(req)).await?;
        client.close().await;
        match resp {
            AdminResponse::Fence(FenceResponse::List(list)) => {
                if json_out {
                    let v: Vec<_> = list.iter().map(flow_json).collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    // No flows: the header alone, as `repair-queue list` and `events` print.
                    flows_table(&list);
                }
            }
            AdminResponse::Fence(FenceResponse::Show(d)) => {
                if json_out {
                    let mut v = flow_json(&d.flow);
                    v["steps"] = d
                        .steps
                        .iter()
                        .map(|s| json!({"at": precise(s.at_unix_ms), "state": s.state, "event": s.event}))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    flows_table(std::slice::from_ref(&d.flow));
                    println!();
                    let rows: Vec<Vec<String>> = d
                        .steps
                        .iter()
                        .map(|s| vec![time(s.at_unix_ms), s.state.clone(), s.event.clone()])
                        .collect();
                    print_table(&["AT", "STATE", "EVENT"], &rows);
                }
            }
            AdminResponse::Error(e) => bail!("{}", e.reason),
            other => bail!("unexpected answer from the coordinator: {other:?}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(failure: &str) -> FenceFlowSummary {
        FenceFlowSummary {
            id: 1,
            address: "10.0.0.1".into(),
            serial: "S1".into(),
            node: "n1".into(),
            state: "done".into(),
            failure: failure.into(),
            release: "taint".into(),
            keep_off: false,
            state_since_unix_ms: 1_795_414_698_418,
            confirmed_off_unix_ms: None,
            powered_on_unix_ms: None,
        }
    }

    /// `--limit 0` printed the header alone, as if there were no flows.
    #[test]
    fn a_zero_limit_is_refused() {
        use clap::Parser;
        let parse = |n: &str| {
            crate::ctl::Cli::try_parse_from(["coordinatorctl", "fence", "list", "--limit", n])
        };
        assert!(parse("0").is_err());
        assert!(parse("1").is_ok());
    }

    #[test]
    fn no_failure_is_null_in_json() {
        assert_eq!(flow_json(&flow(""))["failure"], serde_json::Value::Null);
        assert_eq!(flow_json(&flow("BMC said no"))["failure"], "BMC said no");
        assert_eq!(
            flow_json(&flow(""))["confirmed_off"],
            serde_json::Value::Null
        );
    }
}
