//! SIGHUP: what a running gateway takes from its files again.
//!
//! The TLS files are read again and used for new coordinator connections (open ones keep
//! the certificate they were made with): that is how a renewed certificate is put in place
//! without a restart. The rest of the configuration (BMCs, their credentials, limits,
//! listen addresses) is read and validated, but never swapped under running power actions:
//! one action per BMC at a time and the at-most-once record rely on the BMC set staying put.
//! When it differs from the running one, the gateway says that a restart is needed; so it
//! does when a BMC's password file, or a PDU's password or community file, now holds another
//! secret than the one the running gateway read at start (the path alone would not show it).
//!
//! A file that does not load, a certificate that names another identity, or one that does
//! not chain to the configured CA ([`crate::tls`], the start's check) is refused as a whole
//! with an error log, and the running material stays.

use std::collections::BTreeMap;
use std::path::PathBuf;

use protocol::Identity;
use protocol::transport::TransportError;
use quinn::Endpoint;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError};
use crate::tls::TlsError;

/// Why a reload was refused; the running configuration and certificate stay.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The new TLS configuration cannot be put in place.
    #[error("TLS files: {0}")]
    Tls(#[from] TransportError),
    /// The TLS files do not load, or would not make a gateway of the configured CA.
    #[error(transparent)]
    Certificate(#[from] TlsError),
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
    /// Machines whose password file, and PDUs (`pdu NAME`) whose password or community file,
    /// holds another secret than the running gateway uses (it keeps using the old one until a
    /// restart).
    pub credentials_changed: Vec<String>,
}

/// The BMC passwords by machine and the PDU secrets (password or SNMP community) by PDU name
/// that the running gateway read at start; compared with what the files hold at each reload.
/// Its `Debug` form names the machines and PDUs only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    bmcs: BTreeMap<String, String>,
    pdus: BTreeMap<String, String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bmcs", &self.bmcs.keys().collect::<Vec<_>>())
            .field("pdus", &self.pdus.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Credentials {
    /// Records the password `machine`'s BMC client was built with.
    pub fn insert(&mut self, machine: &str, password: &str) {
        self.bmcs.insert(machine.to_string(), password.to_string());
    }

    /// Records the secret (password or community) the PDU `name`'s agent runs with.
    pub fn insert_pdu(&mut self, name: &str, secret: &str) {
        self.pdus.insert(name.to_string(), secret.to_string());
    }

    /// Machines of `new` whose password file, then PDUs of `new` (as `pdu NAME`) whose
    /// password or community file, now hold another secret than the recorded one. A machine
    /// or PDU added or removed, or a secret file named or no longer named, is a change of
    /// the configuration ([`needs_restart`]), not of credentials; a file that cannot be read
    /// counts as changed.
    pub fn changed(&self, new: &Config) -> Vec<String> {
        let bmcs = new.bmcs.iter().filter_map(|b| {
            let running = self.bmcs.get(&b.machine)?;
            (b.read_password().ok().as_ref() != Some(running)).then(|| b.machine.clone())
        });
        let pdus = new.pdus.iter().filter_map(|p| {
            let running = self.pdus.get(&p.name)?;
            let now = p.read_secret().ok().flatten();
            (now.as_ref() != Some(running)).then(|| format!("pdu {}", p.name))
        });
        bmcs.chain(pdus).collect()
    }
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
    credentials: Credentials,
    identity: Identity,
    endpoint: Endpoint,
}

impl Reloader {
    /// A reloader for the gateway started from `running` (read from `path`) with the BMC
    /// passwords `credentials`, as `identity`.
    pub fn new(
        path: PathBuf,
        running: Config,
        credentials: Credentials,
        identity: Identity,
        endpoint: Endpoint,
    ) -> Self {
        Self {
            path,
            running,
            credentials,
            identity,
            endpoint,
        }
    }

    /// Reads the files again and puts the new certificate in place for new connections,
    /// after the same checks as at start.
    pub fn reload(&mut self) -> Result<Reloaded, ReloadError> {
        let new = Config::load(&self.path)?;
        let tls = crate::tls::load_own(&new.tls)?;
        if tls.identity() != &self.identity {
            return Err(ReloadError::Identity {
                running: self.identity.to_string(),
                new: tls.identity().to_string(),
            });
        }
        self.endpoint
            .set_server_config(Some(tls.quinn_server_config()?));
        let needs_restart = needs_restart(&self.running, &new);
        let credentials_changed = self.credentials.changed(&new);
        self.running.tls = new.tls;
        Ok(Reloaded {
            needs_restart,
            expiry: tls.expiry(),
            credentials_changed,
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
                if !r.credentials_changed.is_empty() {
                    warn!(
                        devices = ?r.credentials_changed,
                        "BMC password or PDU password/community files changed: device credentials apply only after a restart (`systemctl restart bmc-gateway`); until then the gateway uses the secrets it started with"
                    );
                }
            }
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running configuration and TLS files")
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

    /// A gateway's files in a directory: the fleet CA, its certificate, one BMC's password
    /// and the configuration naming them.
    struct Files {
        dir: tempfile::TempDir,
        ca: protocol::pki::Ca,
        config: PathBuf,
        tls: crate::config::TlsConfig,
    }

    fn files() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let ca = protocol::pki::Ca::generate("test.local").unwrap();
        let tls = crate::tls::tests::files(dir.path(), &ca, None, protocol::Role::Gateway);
        let pw = dir.path().join("m1.pw");
        std::fs::write(&pw, "first-secret\n").unwrap();
        let config = dir.path().join("gw.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n\
                 [[bmc]]\nmachine = \"m1\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = {:?}\n",
                tls.ca.display().to_string(),
                tls.cert.display().to_string(),
                tls.key.display().to_string(),
                pw.display().to_string(),
            ),
        )
        .unwrap();
        Files {
            dir,
            ca,
            config,
            tls,
        }
    }

    /// A reloader as `run` makes it: the running configuration, the passwords read at start
    /// and an endpoint serving the certificate.
    fn reloader(f: &Files) -> Reloader {
        let running = Config::load(&f.config).unwrap();
        let tls = crate::tls::load_own(&running.tls).unwrap();
        let mut credentials = Credentials::default();
        for b in &running.bmcs {
            credentials.insert(&b.machine, &b.read_password().unwrap());
        }
        let endpoint = tls.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        Reloader::new(
            f.config.clone(),
            running,
            credentials,
            tls.identity().clone(),
            endpoint,
        )
    }

    #[tokio::test]
    async fn a_reload_refuses_a_certificate_of_another_ca_as_the_start_does() {
        let f = files();
        let mut r = reloader(&f);
        r.reload().unwrap();
        // The same name, issued by another fleet's CA, into the same files.
        let other = protocol::pki::Ca::generate("test.local").unwrap();
        let issued = other
            .issue(
                protocol::Role::Gateway,
                "rack-1",
                &protocol::pki::IssueOptions::default(),
            )
            .unwrap();
        std::fs::write(&f.tls.cert, &issued.cert_pem).unwrap();
        std::fs::write(&f.tls.key, &issued.key_pem).unwrap();
        let e = r.reload().unwrap_err();
        assert!(
            matches!(
                e,
                ReloadError::Certificate(TlsError::ForeignCertificate { .. })
            ),
            "{e}"
        );
        assert!(e.to_string().contains("is not valid under the CA"), "{e}");
        // Back to one of the fleet's CA: accepted again.
        let own =
            f.ca.issue(
                protocol::Role::Gateway,
                "rack-1",
                &protocol::pki::IssueOptions::default(),
            )
            .unwrap();
        std::fs::write(&f.tls.cert, &own.cert_pem).unwrap();
        std::fs::write(&f.tls.key, &own.key_pem).unwrap();
        r.reload().unwrap();
    }

    #[tokio::test]
    async fn a_changed_password_file_is_said_to_need_a_restart() {
        let f = files();
        let mut r = reloader(&f);
        let same = r.reload().unwrap();
        assert!(same.credentials_changed.is_empty());
        assert!(!same.needs_restart);
        std::fs::write(f.dir.path().join("m1.pw"), "second-secret\n").unwrap();
        let changed = r.reload().unwrap();
        assert_eq!(changed.credentials_changed, ["m1"]);
        // Still the old password running: said again at the next reload.
        assert_eq!(r.reload().unwrap().credentials_changed, ["m1"]);
        // The password never shows in the debug form.
        let dbg = format!("{r:?}");
        assert!(!dbg.contains("secret") && dbg.contains("m1"), "{dbg}");
    }

    /// Issue 32: a PDU's community (or password) file rewritten under a running gateway is
    /// reported like a BMC's password file; the PDU's agent keeps the secret read at start.
    #[tokio::test]
    async fn a_changed_pdu_community_file_is_said_to_need_a_restart() {
        use std::os::unix::fs::PermissionsExt;
        let f = files();
        let community = f.dir.path().join("pdu-a.community");
        std::fs::write(&community, "private\n").unwrap();
        std::fs::set_permissions(&community, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut text = std::fs::read_to_string(&f.config).unwrap();
        // `true` stands for an installed fence agent (any program found along PATH is one).
        text = text.replace(
            "[[bmc]]",
            &format!(
                "[[pdu]]\nname = \"pdu-a\"\nagent = \"true\"\nhost = \"10.1.0.50\"\n\
                 password_file = {:?}\nsecret_option = \"community\"\n[[bmc]]",
                community.display().to_string()
            ),
        );
        std::fs::write(&f.config, text).unwrap();
        let mut r = reloader(&f);
        // As `build` records them: the PDU's secret as its device was made with it.
        crate::pdu_devices(&r.running, &mut r.credentials).unwrap();
        let same = r.reload().unwrap();
        assert!(same.credentials_changed.is_empty(), "{same:?}");
        assert!(!same.needs_restart);
        std::fs::write(&community, "c0mmunity-2\n").unwrap();
        let changed = r.reload().unwrap();
        assert_eq!(changed.credentials_changed, ["pdu pdu-a"]);
        assert!(
            !changed.needs_restart,
            "the configuration file itself is the same"
        );
        // Both kinds at once, BMCs first. A secret file that is gone refuses the reload as a
        // whole (the configuration does not load), as at start.
        std::fs::write(f.dir.path().join("m1.pw"), "second-secret\n").unwrap();
        std::fs::remove_file(&community).unwrap();
        assert!(r.reload().is_err(), "a missing secret file does not load");
        std::fs::write(&community, "c0mmunity-3\n").unwrap();
        std::fs::set_permissions(&community, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(r.reload().unwrap().credentials_changed, ["m1", "pdu pdu-a"]);
        // Back to the secret it runs with: nothing to say about the PDU.
        std::fs::write(&community, "private\n").unwrap();
        assert_eq!(r.reload().unwrap().credentials_changed, ["m1"]);
        let dbg = format!("{r:?}");
        assert!(
            !dbg.contains("private") && !dbg.contains("c0mm") && dbg.contains("pdu-a"),
            "{dbg}"
        );
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
