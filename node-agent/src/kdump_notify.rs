//! `node-agent kdump-notify --phase start|done`: run inside the kdump initramfs, it tells
//! the coordinator that this machine is writing a crash dump ("dumping"), or has written it
//! ("dump done"), so the coordinator can release the machine's workload without a power-off
//! and hold power actions until the dump is written.
//!
//! It reads no configuration file: the initramfs carries only the coordinator's address,
//! the fleet CA and the node's certificate and key, all given as flags (or their
//! `FLEETMEND_AGENT_*` variables). Each notice goes on a fresh mutual-TLS QUIC connection
//! whose hello is the notice; the coordinator's acceptance means it was recorded. It
//! retries until `--timeout`, because the dump kernel's network may come up late.
//!
//! Exit codes (sysexits): 0 recorded, 64 bad input (a missing flag, an unreadable or invalid
//! certificate), 69 the coordinator could not be reached in time or refused the notice.
//! It runs no checks and keeps no state.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use protocol::Role;
use protocol::messages::{HelloBody, KdumpNotice, KdumpPhase, RefusalCode};
use protocol::transport::{self, TlsFiles, TlsMaterial, TransportError};

use crate::config::{Settings, parse_duration, split_host_port};

/// Default `--timeout`: long enough for a dump kernel's network to come up (DHCP, link
/// negotiation) and a coordinator restart, short enough not to hold up the dump for long.
pub const DEFAULT_TIMEOUT: &str = "30s";

/// The longest one connection attempt may take: a lost handshake is retried instead of
/// waited on for the whole timeout.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(5);

/// Pause before the first retry, doubled up to [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Longest pause between attempts: a dozen attempts fit the default timeout.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Less time than this left before the timeout is not worth another attempt.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// `kdump-notify`'s flags. The connection flags (and their `FLEETMEND_AGENT_*` variables)
/// are the agent's; the flags of `run` and `check` that do not apply here are declared
/// hidden under the same names, so that `--help` lists only what kdump-notify takes and
/// giving one is refused by name instead of silently ignored.
#[derive(Debug, Clone, Args)]
pub struct KdumpNotifyArgs {
    /// `start` when the dump begins, `done` when it is written.
    #[arg(long)]
    pub phase: KdumpPhase,
    /// Give up after this long without an acknowledgement, e.g. 30s, 2m.
    #[arg(long, default_value = DEFAULT_TIMEOUT)]
    pub timeout: String,
    /// The boot id of the kernel that crashed, if known (it is shown with the dump).
    #[arg(long)]
    pub boot_id: Option<String>,
    /// Coordinator address, host:port.
    #[arg(long, env = protocol::env_var!(AGENT, "COORDINATOR"))]
    pub coordinator: Option<String>,
    /// TLS server name of the coordinator [default: host part of --coordinator].
    #[arg(long, env = protocol::env_var!(AGENT, "SERVER_NAME"))]
    pub server_name: Option<String>,
    /// Fleet CA certificate (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "CA"))]
    pub ca: Option<PathBuf>,
    /// This node's certificate (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "CERT"))]
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "KEY"))]
    pub key: Option<PathBuf>,
    /// `run`'s and `check`'s flags, refused here (see [`Notify::new`]).
    #[command(flatten)]
    pub not_here: NotHere,
}

/// The agent's flags that kdump-notify does not take: hidden, parsed only to be refused.
#[derive(Debug, Clone, Default, Args)]
pub struct NotHere {
    #[arg(long, hide = true)]
    config: Option<PathBuf>,
    #[arg(long, hide = true)]
    report_interval: Option<String>,
    #[arg(long, hide = true)]
    root: Option<PathBuf>,
    #[arg(long, hide = true)]
    hostname: Option<String>,
    #[arg(long = "nic", hide = true)]
    nics: Vec<String>,
    #[arg(long, hide = true)]
    kubelet_url: Option<String>,
}

impl NotHere {
    /// The first of these flags given, as written on the command line.
    fn first_given(&self) -> Option<&'static str> {
        [
            (self.config.is_some(), "--config"),
            (self.report_interval.is_some(), "--report-interval"),
            (self.root.is_some(), "--root"),
            (self.hostname.is_some(), "--hostname"),
            (!self.nics.is_empty(), "--nic"),
            (self.kubelet_url.is_some(), "--kubelet-url"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// Why a notice was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// A flag is missing or invalid, or the TLS files cannot be used.
    #[error("{0}")]
    BadInput(String),
    /// No attempt reached the coordinator before the timeout.
    #[error("coordinator {addr} not reached within {}: {last}", protocol::duration::display(*after))]
    Unreachable {
        /// The coordinator, as given.
        addr: String,
        /// The timeout.
        after: Duration,
        /// What the last attempt saw.
        last: String,
    },
    /// The coordinator refused the notice.
    #[error("coordinator refused the kdump notice: {0}")]
    Refused(String),
}

impl NotifyError {
    /// The process exit code: 64 bad input, 69 coordinator unreachable or refusing.
    pub fn exit_code(&self) -> u8 {
        match self {
            NotifyError::BadInput(_) => 64,
            NotifyError::Unreachable { .. } | NotifyError::Refused(_) => 69,
        }
    }

    /// True when running the command again later may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, NotifyError::Unreachable { .. })
    }
}

/// A validated notice, ready to send.
#[derive(Debug)]
pub struct Notify {
    address: String,
    server_name: String,
    tls: TlsMaterial,
    notice: KdumpNotice,
    timeout: Duration,
}

impl Notify {
    /// Checks the flags and loads the TLS files. The hostname is the one the certificate
    /// names, so the notice can only ever be about this node.
    pub fn new(settings: &Settings, args: &KdumpNotifyArgs) -> Result<Self, NotifyError> {
        let bad = |s: String| NotifyError::BadInput(s);
        if let Some(c) = &settings.config {
            return Err(bad(format!(
                "kdump-notify reads no config file (got --config {}): pass --coordinator, --ca, --cert and --key",
                c.display()
            )));
        }
        if let Some(flag) = args.not_here.first_given() {
            return Err(bad(format!(
                "kdump-notify takes no {flag} (a flag of `run` and `check`): pass --coordinator, --ca, --cert and --key, and --phase"
            )));
        }
        // Given after the subcommand (its own flags) or before it (the agent's).
        let coordinator = args.coordinator.as_ref().or(settings.coordinator.as_ref());
        let server_name = args.server_name.as_ref().or(settings.server_name.as_ref());
        let ca = args.ca.as_ref().or(settings.ca.as_ref());
        let cert = args.cert.as_ref().or(settings.cert.as_ref());
        let key = args.key.as_ref().or(settings.key.as_ref());
        let need = |flag: &str, v: Option<&PathBuf>| {
            v.cloned()
                .ok_or_else(|| bad(format!("--{flag} is required (a PEM file)")))
        };
        let address = coordinator
            .cloned()
            .ok_or_else(|| bad("--coordinator HOST:PORT is required".into()))?;
        let (host, _) =
            split_host_port(&address).map_err(|e| bad(format!("--coordinator: {e}")))?;
        let files = TlsFiles {
            ca: need("ca", ca)?,
            cert: need("cert", cert)?,
            key: need("key", key)?,
        };
        let timeout = parse_duration(&args.timeout).map_err(|e| bad(format!("--timeout: {e}")))?;
        if timeout.is_zero() {
            return Err(bad("--timeout must be greater than 0".into()));
        }
        let tls = TlsMaterial::load(&files).map_err(|e| bad(e.to_string()))?;
        if tls.identity().role != Role::Node {
            return Err(bad(format!(
                "the certificate names {}, not a node: use this node's certificate",
                tls.identity()
            )));
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Ok(Self {
            notice: KdumpNotice {
                hostname: tls.identity().name.clone(),
                phase: args.phase,
                boot_id: args.boot_id.clone().filter(|b| !b.is_empty()),
                time_unix_ms: now_ms,
            },
            server_name: server_name.cloned().unwrap_or(host),
            address,
            tls,
            timeout,
        })
    }

    /// Sends the notice, retrying until it is acknowledged, refused, or the timeout passes.
    pub async fn send(&self) -> Result<(), NotifyError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = FIRST_RETRY_PAUSE;
        let mut attempts = 0u32;
        let mut last = String::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Attempts go on until the timeout, however fast each fails (a stopped
            // coordinator's host refuses at once): one may come back in the meantime.
            if attempts > 0 && left < MIN_ATTEMPT {
                return Err(NotifyError::Unreachable {
                    addr: self.address.clone(),
                    after: self.timeout,
                    last,
                });
            }
            attempts += 1;
            last = match self.attempt(left.min(ATTEMPT_LIMIT)).await {
                Ok(addr) => {
                    tracing::info!(coordinator = %addr, phase = self.notice.phase.as_str(), attempts, "kdump notice recorded");
                    return Ok(());
                }
                Err(Attempt::Refused(code, reason)) if !retry_refusal(code) => {
                    return Err(NotifyError::Refused(reason));
                }
                Err(Attempt::Refused(_, reason)) => reason,
                Err(Attempt::Failed(e)) => e,
            };
            tracing::warn!(attempt = attempts, error = %last, "kdump notice not delivered; retrying");
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    async fn attempt(&self, limit: Duration) -> Result<SocketAddr, Attempt> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(self.address.as_str())
            .await
            .map_err(|e| Attempt::Failed(format!("cannot resolve {}: {e}", self.address)))?
            .collect();
        let mut last = Attempt::Failed(format!("{} resolves to no address", self.address));
        for addr in addrs {
            let endpoint = self
                .tls
                .client_endpoint(addr)
                .map_err(|e| Attempt::Failed(e.to_string()))?;
            let r = transport::connect_within(
                &endpoint,
                addr,
                &self.server_name,
                Role::Coordinator,
                HelloBody::Kdump(self.notice.clone()),
                limit,
            )
            .await;
            match r {
                Ok(session) => {
                    session.conn.close(0u32.into(), b"kdump notice sent");
                    // Let the close reach the coordinator, which waits for it.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
                    return Ok(addr);
                }
                Err(TransportError::Refused(r)) => {
                    return Err(Attempt::Refused(r.code, r.to_string()));
                }
                Err(e) => last = Attempt::Failed(e.to_string()),
            }
        }
        Err(last)
    }
}

enum Attempt {
    Refused(RefusalCode, String),
    Failed(String),
}

/// A coordinator that is shutting down or failed to write will take the notice later;
/// every other refusal (wrong node, unknown host, version) will not change by retrying.
fn retry_refusal(code: RefusalCode) -> bool {
    matches!(code, RefusalCode::ShuttingDown | RefusalCode::Internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(timeout: &str) -> KdumpNotifyArgs {
        KdumpNotifyArgs {
            phase: KdumpPhase::Start,
            timeout: timeout.into(),
            boot_id: None,
            coordinator: None,
            server_name: None,
            ca: None,
            cert: None,
            key: None,
            not_here: NotHere::default(),
        }
    }

    #[test]
    fn missing_flags_and_a_config_file_are_bad_input_with_exit_64() {
        let e = Notify::new(&Settings::default(), &args("30s")).unwrap_err();
        assert!(e.to_string().contains("--coordinator"), "{e}");
        assert_eq!(e.exit_code(), 64);
        let s = Settings {
            coordinator: Some("127.0.0.1:7443".into()),
            ..Settings::default()
        };
        let e = Notify::new(&s, &args("30s")).unwrap_err();
        assert!(e.to_string().contains("--ca"), "{e}");
        let s = Settings {
            config: Some("/etc/fleetmend/node-agent.toml".into()),
            ..s
        };
        let e = Notify::new(&s, &args("30s")).unwrap_err();
        assert!(e.to_string().contains("no config file"), "{e}");
        let s = Settings {
            coordinator: Some("no-port".into()),
            ..Settings::default()
        };
        assert!(
            Notify::new(&s, &args("30s"))
                .unwrap_err()
                .to_string()
                .contains("port")
        );
    }

    /// Parsed as the binary parses its command line.
    fn parse(argv: &[&str]) -> (Settings, KdumpNotifyArgs) {
        use clap::Parser;
        let cli = crate::config::Cli::try_parse_from(argv).expect("parses");
        match cli.command {
            Some(crate::config::Command::KdumpNotify(a)) => (cli.settings, *a),
            other => panic!("not kdump-notify: {other:?}"),
        }
    }

    #[test]
    fn connection_flags_count_before_or_after_the_subcommand_and_run_flags_are_refused() {
        let (s, a) = parse(&[
            "node-agent",
            "kdump-notify",
            "--phase",
            "start",
            "--coordinator",
            "no-port",
        ]);
        let e = Notify::new(&s, &a).unwrap_err();
        assert!(
            e.to_string()
                .contains("--coordinator: \"no-port\" has no port"),
            "{e}"
        );
        let (s, a) = parse(&[
            "node-agent",
            "--coordinator",
            "c:7443",
            "kdump-notify",
            "--phase",
            "done",
        ]);
        let e = Notify::new(&s, &a).unwrap_err();
        assert!(e.to_string().contains("--ca is required"), "{e}");
        for flag in [
            "--root",
            "--report-interval",
            "--hostname",
            "--nic",
            "--kubelet-url",
        ] {
            let (s, a) = parse(&["node-agent", "kdump-notify", "--phase", "start", flag, "x"]);
            let e = Notify::new(&s, &a).unwrap_err();
            assert!(e.to_string().contains(&format!("takes no {flag}")), "{e}");
            assert_eq!(e.exit_code(), 64);
        }
        let (s, a) = parse(&[
            "node-agent",
            "kdump-notify",
            "--phase",
            "start",
            "--config",
            "/x",
        ]);
        assert!(
            Notify::new(&s, &a)
                .unwrap_err()
                .to_string()
                .contains("--config")
        );
    }

    #[test]
    fn help_lists_only_the_flags_kdump_notify_takes() {
        use clap::CommandFactory;
        let mut cmd = crate::config::Cli::command();
        // Building propagates the agent's global flags into the subcommands, as at run time.
        cmd.build();
        let help = cmd
            .find_subcommand_mut("kdump-notify")
            .expect("the subcommand")
            .render_long_help()
            .to_string();
        for taken in [
            "--phase",
            "--timeout",
            "--boot-id",
            "--coordinator",
            "--server-name",
            "--ca",
            "--cert",
            "--key",
        ] {
            assert!(help.contains(taken), "{taken} missing:\n{help}");
        }
        for not_taken in [
            "--config",
            "--report-interval",
            "--root",
            "--hostname",
            "--nic",
            "--kubelet-url",
        ] {
            assert!(!help.contains(not_taken), "{not_taken} listed:\n{help}");
        }
    }

    #[test]
    fn only_transient_refusals_are_retried() {
        assert!(retry_refusal(RefusalCode::ShuttingDown));
        assert!(!retry_refusal(RefusalCode::IdentityMismatch));
        assert!(!retry_refusal(RefusalCode::BadRequest));
        assert_eq!(
            NotifyError::Unreachable {
                addr: "a:1".into(),
                after: Duration::from_secs(1),
                last: String::new()
            }
            .exit_code(),
            69
        );
    }
}
