//! The admin API client: one QUIC connection with an admin certificate, one bidirectional
//! stream per request.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use protocol::Role;
use protocol::admin::{AdminRequest, AdminResponse};
use protocol::frame::{MAX_ADMIN_FRAME_LEN, MAX_FRAME_LEN};
use protocol::messages::{AdminHello, HelloBody};
use protocol::transport::{TlsFiles, TlsMaterial, connect, expect_msg, write_msg};

/// How to reach the coordinator (flags, else environment).
#[derive(Debug, Clone, Default, clap::Args)]
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
}

/// A connected admin session.
#[derive(Debug)]
pub struct AdminClient {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
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
        let session = connect(&endpoint, addr, &name, Role::Coordinator, hello)
            .await
            .with_context(|| format!("cannot open an admin session with {server}"))?;
        Ok(Self {
            endpoint,
            conn: session.conn,
        })
    }

    /// Sends one request and returns the answer; an `Error` answer is returned as is.
    pub async fn request_raw(&self, req: &AdminRequest) -> anyhow::Result<AdminResponse> {
        let (mut send, mut recv) = self.conn.open_bi().await?;
        write_msg(&mut send, req, MAX_FRAME_LEN).await?;
        send.finish()?;
        Ok(expect_msg::<AdminResponse>(&mut recv, MAX_ADMIN_FRAME_LEN).await?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_part_handles_ipv6_and_names() {
        assert_eq!(host_part("127.0.0.1:7443"), "127.0.0.1");
        assert_eq!(host_part("[::1]:7443"), "::1");
        assert_eq!(host_part("coord.example:7443"), "coord.example");
    }
}
