//! `coordinatorctl status`: each coordinator of `--server` (one, or several sharing an etcd
//! store) and its role: the leader with its epoch and since when, a standby with the leader
//! it names, or why it did not answer. Read-only; asks every server, not only the leader.

use clap::Args;
use protocol::admin::{AdminRequest, AdminResponse, CoordinatorStatus};
use protocol::transport::TransportError;
use serde_json::json;

use super::common::{CommandGroup, Ctx, error_line, fmt_time, print_table};

/// `status` (no subcommands).
#[derive(Debug, Args)]
pub struct StatusCommand {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// What one server answered.
enum Seen {
    /// It served the admin session: its own account of its role.
    Serving(CoordinatorStatus),
    /// It stands by: its name (from its certificate) and the leader it names, if any.
    Standby {
        name: String,
        leader: Option<String>,
    },
    /// No answer, or a refusal.
    Failed(String),
}

impl CommandGroup for StatusCommand {
    async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let mut seen = Vec::new();
        for (server, conn) in super::client::AdminClient::connect_each(&ctx.connect).await? {
            let s = match conn {
                Ok(client) => {
                    let answer = client.request(&AdminRequest::Status).await;
                    client.close().await;
                    match answer {
                        Ok(AdminResponse::Status(st)) => Seen::Serving(st),
                        Ok(other) => Seen::Failed(format!("unexpected answer {other:?}")),
                        Err(e) => Seen::Failed(error_line(&e)),
                    }
                }
                Err(e) => match e.downcast_ref::<TransportError>() {
                    Some(TransportError::Standby { name, leader, .. }) => Seen::Standby {
                        name: name.clone(),
                        leader: leader.clone(),
                    },
                    _ => Seen::Failed(error_line(&e)),
                },
            };
            seen.push((server, s));
        }
        if self.json {
            let list: Vec<_> = seen.iter().map(|(server, s)| as_json(server, s)).collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            let rows: Vec<Vec<String>> = seen.iter().map(|(server, s)| row(server, s)).collect();
            print_table(&["SERVER", "NAME", "ROLE", "EPOCH", "SINCE", "NOTE"], &rows);
        }
        let leaders = seen
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Serving(st) if st.role == "leader"))
            .count();
        if leaders == 0 {
            anyhow::bail!("no coordinator of the list leads now");
        }
        Ok(())
    }
}

fn since(st: &CoordinatorStatus) -> String {
    st.since_unix_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .map(fmt_time)
        .unwrap_or_else(|| "-".into())
}

fn row(server: &str, s: &Seen) -> Vec<String> {
    match s {
        Seen::Serving(st) => vec![
            server.to_string(),
            st.name.clone(),
            st.role.clone(),
            st.epoch.to_string(),
            since(st),
            if st.elected {
                format!("store {}", st.store)
            } else {
                format!("store {}; the only coordinator of its store", st.store)
            },
        ],
        Seen::Standby { name, leader } => vec![
            server.to_string(),
            name.clone(),
            "standby".into(),
            "-".into(),
            "-".into(),
            match leader {
                Some(l) => format!("the leader is {l}"),
                None => "no leader known".into(),
            },
        ],
        Seen::Failed(why) => vec![
            server.to_string(),
            "-".into(),
            "unreachable".into(),
            "-".into(),
            "-".into(),
            why.clone(),
        ],
    }
}

fn as_json(server: &str, s: &Seen) -> serde_json::Value {
    match s {
        Seen::Serving(st) => json!({
            "server": server,
            "name": st.name,
            "role": st.role,
            "epoch": st.epoch,
            "since": st.since_unix_ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()).map(|t| t.to_string()),
            "store": st.store,
            "elected": st.elected,
        }),
        Seen::Standby { name, leader } => json!({
            "server": server,
            "name": name,
            "role": "standby",
            "leader": leader,
        }),
        Seen::Failed(why) => json!({
            "server": server,
            "role": "unreachable",
            "error": why,
        }),
    }
}

super::common::flags_only_command!(StatusCommand);
