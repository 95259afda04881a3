//! SIGHUP: read the configuration and the TLS files again and work out what the running
//! agent may take from them.
//!
//! Everything but the node's identity can change while running: the report interval (the
//! agent then reports at once, so the coordinator learns the new interval from that report
//! before the agent waits it out), the checks (NICs, mounts, kubelet, kdump, `[checks]`, root), the
//! `[actions]`, the coordinator's address and server name (the agent then reconnects at
//! once) and the TLS files (a renewed certificate or CA reconnects at once too, so the
//! coordinator sees it).
//! A configuration that does not load, TLS files that do not load, a certificate that names
//! another node, or one that does not chain to the configured CA (the start's check, see
//! [`crate::agent::AgentError::ForeignCertificate`]) are refused as a whole: the running settings stay, and the refusal is
//! logged as an error. The agent applies the result ([`crate::agent::Agent`]); this module
//! reads files and compares, it does not touch the connection.

use protocol::transport::{TlsFiles, TlsMaterial, TransportError};
use tokio::sync::mpsc;

use crate::config::{Config, ConfigError};
use crate::node::{self, NodeError};

/// Reads the configuration again, exactly as at start (file, environment, flags).
pub type LoadConfig = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Reload requests (one per SIGHUP) and how to read the configuration.
pub struct Reloads {
    /// One message per request.
    pub requests: mpsc::UnboundedReceiver<()>,
    /// Reads the configuration.
    pub load: LoadConfig,
}

impl std::fmt::Debug for Reloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloads").finish_non_exhaustive()
    }
}

/// Why a reload was refused; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS files do not load.
    #[error("TLS files: {0}")]
    Tls(#[source] TransportError),
    /// The new settings would make this agent another node.
    #[error(
        "the new settings name {new}, but this agent runs as {running}; restart the agent to change its identity"
    )]
    Identity {
        /// Identity now.
        running: String,
        /// Identity the new settings name.
        new: String,
    },
    /// The new certificate does not chain to the new CA.
    #[error(transparent)]
    ForeignCertificate(#[from] crate::agent::error::ForeignCertificate),
    /// Node facts cannot be read under the new root.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// A reload that may be applied.
#[derive(Debug)]
pub struct Reloaded {
    /// The new configuration.
    pub cfg: Config,
    /// The TLS material its files hold now.
    pub tls: TlsMaterial,
    /// The coordinator's address or server name, or this node's certificate, changed:
    /// reconnect now.
    pub reconnect: bool,
    /// The checks' settings changed: rebuild the checker.
    pub checks_changed: bool,
    /// Names of the settings that changed, for the log.
    pub changed: Vec<&'static str>,
}

/// Checks `new` against the running `cfg` and `tls` and loads its TLS files.
pub fn prepare(cfg: &Config, tls: &TlsMaterial, new: Config) -> Result<Reloaded, ReloadError> {
    let coordinator = new.require_coordinator()?.clone();
    let new_tls = TlsMaterial::load(&TlsFiles {
        ca: coordinator.ca.clone(),
        cert: coordinator.cert.clone(),
        key: coordinator.key.clone(),
    })
    .map_err(ReloadError::Tls)?;
    crate::agent::error::check_own_chain(&new_tls, &coordinator)?;
    let hostname = node::hostname(&new.root, new.hostname.as_deref())?;
    let running = tls.identity();
    if new_tls.identity() != running || running.name != hostname {
        return Err(ReloadError::Identity {
            running: running.to_string(),
            new: format!("{} (hostname {hostname})", new_tls.identity()),
        });
    }
    let old = cfg.coordinator.as_ref();
    // A renewed certificate reconnects too: the coordinator reads a certificate at the
    // handshake only, so until then it would count the old one as expiring (and the alert
    // on it would stay) for as long as the connection lasts, months.
    let renewed = !new_tls.same_certificate(tls);
    let moved = old.is_none_or(|o| {
        o.address != coordinator.address || o.server_name != coordinator.server_name
    });
    let reconnect = moved || renewed;
    let checks_changed = cfg.root != new.root
        || cfg.nics != new.nics
        || cfg.mounts != new.mounts
        || cfg.kubelet != new.kubelet
        || cfg.kdump != new.kdump
        || cfg.checks != new.checks;
    let mut changed = Vec::new();
    if moved {
        changed.push("coordinator");
    }
    if renewed
        || old.is_some_and(|o| {
            o.ca != coordinator.ca || o.cert != coordinator.cert || o.key != coordinator.key
        })
    {
        changed.push("tls files");
    }
    if cfg.report_interval != new.report_interval {
        changed.push("report_interval");
    }
    if checks_changed {
        changed.push("checks");
    }
    if cfg.actions != new.actions {
        changed.push("actions");
    }
    Ok(Reloaded {
        cfg: new,
        tls: new_tls,
        reconnect,
        checks_changed,
        changed,
    })
}
