//! The admin API client: one QUIC connection with an admin certificate, one bidirectional
//! stream per request, each under a time limit (`--timeout`). A request that times out may
//! or may not have been carried out; the error says so and how to find out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use protocol::Role;
use protocol::admin::{AdminRequest, AdminResponse};
use protocol::frame::{MAX_ADMIN_FRAME_LEN, MAX_FRAME_LEN};
use protocol::messages::{AdminHello, HelloBody};
use protocol::transport::{TlsFiles, TlsMaterial, connect, expect_msg, write_msg};

/// How long a request may take by default. A coordinator answers in milliseconds; one whose
/// store is stuck should not hang a script forever, and 30 s outlasts any queue commit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the coordinator (flags, else environment).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    /// Coordinator QUIC address, `host:port`.
    #[arg(long, env = "FLEETMEND_SERVER", global = true)]
    pub server: Option<String>,
    /// Name the coordinator's certificate must carry (default: the host part of --server).
    #[arg(long, env = "FLEETMEND_SERVER_NAME", global = true)]
    pub server_name: Option<String>,
    /// Fleet CA certificate (PEM).
    #[arg(long, env = "FLEETMEND_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Admin certificate (PEM).
    #[arg(long, env = "FLEETMEND_CERT", global = true)]
    pub cert: Option<PathBuf>,
    /// Admin private key (PEM).
    #[arg(long, env = "FLEETMEND_KEY", global = true)]
    pub key: Option<PathBuf>,
    /// Time limit for connecting and for each request (`30s`, `2m`). A request that runs
    /// out of time may still be carried out by the coordinator.
    #[arg(long, env = "FLEETMEND_TIMEOUT", global = true, default_value = "30s",
          value_parser = crate::config::duration::parse)]
    pub timeout: Duration,
}

impl Default for ConnectArgs {
    fn default() -> Self {
        Self {
            server: None,
            server_name: None,
            ca: None,
            cert: None,
            key: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A connected admin session.
#[derive(Debug)]
pub struct AdminClient {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    timeout: Duration,
}

fn need<'a, T>(v: &'a Option<T>, flag: &str, env: &str) -> anyhow::Result<&'a T> {
    v.as_ref()
        .ok_or_else(|| anyhow!("no {flag} given: pass {flag} or set {env}"))
}

/// Splits `host:port` into its host part (brackets removed) for the TLS server name.
fn host_part(server: &str) -> &str {
    let host = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl AdminClient {
    /// Connects and completes the admin hello.
    pub async fn connect(args: &ConnectArgs) -> anyhow::Result<Self> {
        let server = need(&args.server, "--server", "FLEETMEND_SERVER")?;
        let files = TlsFiles {
            ca: need(&args.ca, "--ca", "FLEETMEND_CA")?.clone(),
            cert: need(&args.cert, "--cert", "FLEETMEND_CERT")?.clone(),
            key: need(&args.key, "--key", "FLEETMEND_KEY")?.clone(),
        };
        let tls = TlsMaterial::load(&files)?;
        let addr: SocketAddr = tokio::net::lookup_host(server.as_str())
            .await
            .with_context(|| format!("cannot resolve {server} (expected host:port)"))?
            .next()
            .ok_or_else(|| anyhow!("{server} resolves to no address"))?;
        let name = args
            .server_name
            .clone()
            .unwrap_or_else(|| host_part(server).to_string());
        let endpoint = tls.client_endpoint(addr)?;
        let hello = HelloBody::Admin(AdminHello {
            client: format!("coordinatorctl {}", env!("CARGO_PKG_VERSION")),
        });
        let session = tokio::time::timeout(
            args.timeout,
            connect(&endpoint, addr, &name, Role::Coordinator, hello),
        )
        .await
        .map_err(|_| {
            anyhow!(
                "no admin session with {server} within {:?} (--timeout); nothing was sent",
                args.timeout
            )
        })?
        .with_context(|| format!("cannot open an admin session with {server}"))?;
        Ok(Self {
            endpoint,
            conn: session.conn,
            timeout: args.timeout,
        })
    }

    /// Sends one request and returns the answer; an `Error` answer is returned as is. No
    /// answer within the time limit is an error saying the outcome is unknown.
    pub async fn request_raw(&self, req: &AdminRequest) -> anyhow::Result<AdminResponse> {
        let exchange = async {
            let (mut send, mut recv) = self.conn.open_bi().await?;
            write_msg(&mut send, req, MAX_FRAME_LEN).await?;
            send.finish()?;
            Ok::<_, anyhow::Error>(
                expect_msg::<AdminResponse>(&mut recv, MAX_ADMIN_FRAME_LEN).await?,
            )
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| anyhow!("{}", timed_out(req, self.timeout)))?
    }

    /// Sends one request; an `Error` answer becomes an error carrying its reason.
    pub async fn request(&self, req: &AdminRequest) -> anyhow::Result<AdminResponse> {
        match self.request_raw(req).await? {
            AdminResponse::Error(r) => bail!("coordinator refused the request: {}", r.reason),
            other => Ok(other),
        }
    }

    /// Closes the connection politely.
    pub async fn close(self) {
        self.conn.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.endpoint.wait_idle())
            .await;
    }
}

/// The error for a request that got no answer in time: what may have happened and how to
/// find out before retrying.
fn timed_out(req: &AdminRequest, timeout: Duration) -> String {
    let check = match req {
        AdminRequest::Machines(_) => "coordinatorctl machines list",
        AdminRequest::RepairQueue(_) => "coordinatorctl repair-queue list",
        AdminRequest::Diagnostics(_) => "coordinatorctl diagnostics list ADDRESS",
        AdminRequest::Remediation(_) => "coordinatorctl remediation status",
    };
    format!(
        "no answer from the coordinator within {timeout:?} (--timeout): the outcome is unknown, the request may or may not have been carried out; check with `{check}` before retrying, and the coordinator's /healthz and log for why it is slow"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_message_says_the_outcome_is_unknown_and_how_to_check() {
        let req = AdminRequest::RepairQueue(protocol::admin::repair::RepairQueueRequest::List);
        let msg = timed_out(&req, Duration::from_secs(30));
        assert!(msg.contains("outcome is unknown"), "{msg}");
        assert!(msg.contains("coordinatorctl repair-queue list"), "{msg}");
    }

    #[test]
    fn host_part_handles_ipv6_and_names() {
        assert_eq!(host_part("127.0.0.1:7443"), "127.0.0.1");
        assert_eq!(host_part("[::1]:7443"), "::1");
        assert_eq!(host_part("coord.example:7443"), "coord.example");
    }
}
