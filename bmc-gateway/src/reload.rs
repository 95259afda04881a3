//! SIGHUP: what a running gateway takes from its files again.
//!
//! The TLS files are read again and used for new coordinator connections (open ones keep
//! the certificate they were made with): that is how a renewed certificate is put in place
//! without a restart. The rest of the configuration (BMCs, their credentials, limits,
//! listen addresses) is read and validated, but never swapped under running power actions:
//! one action per BMC at a time and the at-most-once record rely on the BMC set staying put.
//! When it differs from the running one, the gateway says that a restart is needed.
//!
//! A file that does not load, or a certificate that names another identity, is refused as a
//! whole with an error log, and the running material stays.

use std::path::PathBuf;

use protocol::Identity;
use protocol::transport::{TlsFiles, TlsMaterial, TransportError};
use quinn::Endpoint;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError};

/// Why a reload was refused; the running configuration and certificate stay.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS files do not load.
    #[error("TLS files: {0}")]
    Tls(#[from] TransportError),
    /// The certificate names someone else.
    #[error(
        "the certificate now names {new}, but this gateway runs as {running}; restart to change identity"
    )]
    Identity {
        /// Running identity.
        running: String,
        /// Identity in the new certificate.
        new: String,
    },
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings other than the TLS files differ from the running ones and wait for a restart.
    pub needs_restart: bool,
    /// When the new certificate and CA expire.
    pub expiry: protocol::transport::Expiry,
}

/// Where reload requests come from: the configuration file and one message per SIGHUP.
#[derive(Debug)]
pub struct Reloads {
    /// The configuration file the gateway was started from.
    pub path: PathBuf,
    /// One message per request.
    pub requests: mpsc::UnboundedReceiver<()>,
}

/// Reloads the gateway's TLS material into its QUIC endpoint.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    running: Config,
    identity: Identity,
    endpoint: Endpoint,
}

impl Reloader {
    /// A reloader for the gateway started from `running` (read from `path`) as `identity`.
    pub fn new(path: PathBuf, running: Config, identity: Identity, endpoint: Endpoint) -> Self {
        Self {
            path,
            running,
            identity,
            endpoint,
        }
    }

    /// Reads the files again and puts the new certificate in place for new connections.
    pub fn reload(&mut self) -> Result<Reloaded, ReloadError> {
        let new = Config::load(&self.path)?;
        let tls = TlsMaterial::load(&TlsFiles {
            ca: new.tls.ca.clone(),
            cert: new.tls.cert.clone(),
            key: new.tls.key.clone(),
        })?;
        if tls.identity() != &self.identity {
            return Err(ReloadError::Identity {
                running: self.identity.to_string(),
                new: tls.identity().to_string(),
            });
        }
        self.endpoint
            .set_server_config(Some(tls.quinn_server_config()?));
        let needs_restart = needs_restart(&self.running, &new);
        self.running.tls = new.tls;
        Ok(Reloaded {
            needs_restart,
            expiry: tls.expiry(),
        })
    }
}

/// True when `new` differs from `running` in anything but the `[tls]` section. Compared via
/// the `Debug` form so that a key added to [`Config`] later is covered without being listed.
pub fn needs_restart(running: &Config, new: &Config) -> bool {
    let mut same_tls = running.clone();
    same_tls.tls = new.tls.clone();
    format!("{same_tls:?}") != format!("{new:?}")
}

/// Carries out one reload per request until the senders are gone.
pub async fn serve(
    mut reloader: Reloader,
    mut requests: mpsc::UnboundedReceiver<()>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    while requests.recv().await.is_some() {
        match reloader.reload() {
            Ok(r) => {
                info!(identity = %reloader.identity, "TLS files reloaded; new connections use them");
                metrics.certificate(r.expiry);
                crate::warn_if_expiring(r.expiry, &reloader.running.tls.cert);
                if r.needs_restart {
                    warn!(
                        config = %reloader.path.display(),
                        "configuration changed beyond [tls]: BMCs, credentials, limits and listen addresses apply only after a restart"
                    );
                }
            }
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running configuration and certificate")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const BASE: &str = "listen = \"127.0.0.1:7444\"\n\n[tls]\nca = \"/a/ca.crt\"\ncert = \"/a/gw.crt\"\nkey = \"/a/gw.key\"\n";

    fn cfg(text: &str) -> Config {
        Config::parse(Path::new("gw.toml"), text).unwrap()
    }

    #[test]
    fn only_tls_changes_apply_without_a_restart() {
        let running = cfg(BASE);
        assert!(!needs_restart(&running, &cfg(BASE)));
        assert!(!needs_restart(
            &running,
            &cfg(&BASE.replace("/a/gw.crt", "/b/gw-renewed.crt"))
        ));
        assert!(needs_restart(
            &running,
            &cfg(&BASE.replace("127.0.0.1:7444", "127.0.0.1:7445"))
        ));
    }
}
