//! What `node-agent run` verifies before it connects: a coordinator is configured, the TLS
//! files load, the certificate has not expired, chains to the configured CA and is valid by
//! this host's clock, and names this host. `node-agent check` runs the same function, so it
//! refuses exactly what `run` would refuse, with the same words and exit code. It does not
//! reach the coordinator: whether the coordinator accepts the certificate is the agent's
//! log and status once it runs.

use protocol::identity::Role;
use protocol::messages::CheckStatus;
use protocol::transport::{TlsFiles, TlsMaterial, unix_now};
use serde::Serialize;

use super::{AgentError, certs, check_own_chain};
use crate::config::{Config, CoordinatorConfig};
use crate::node;

/// What `run` starts with once everything checked out.
pub struct Preflight {
    /// The coordinator and the TLS files' paths.
    pub coordinator: CoordinatorConfig,
    /// The loaded TLS files.
    pub tls: TlsMaterial,
    /// This host's name, as its certificate names it.
    pub hostname: String,
}

/// Runs every check `run` makes before connecting; the error is the one `run` exits with.
pub fn preflight(cfg: &Config) -> Result<Preflight, AgentError> {
    let coordinator = cfg.require_coordinator()?.clone();
    let tls = TlsMaterial::load(&TlsFiles {
        ca: coordinator.ca.clone(),
        cert: coordinator.cert.clone(),
        key: coordinator.key.clone(),
    })
    .map_err(AgentError::Tls)?;
    certs::refuse_expired(&tls, &coordinator, unix_now())?;
    check_own_chain(&tls, &coordinator)?;
    let hostname = node::hostname(&cfg.root, cfg.hostname.as_deref())?;
    let id = tls.identity();
    if id.role != Role::Node || id.name != hostname {
        return Err(AgentError::IdentityMismatch {
            identity: id.to_string(),
            hostname,
        });
    }
    Ok(Preflight {
        coordinator,
        tls,
        hostname,
    })
}

/// One line of `node-agent check` about whether the agent can run (not about the machine's
/// health): its TLS files, its actions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetupRow {
    /// `tls`, `coordinator`, `actions`.
    pub kind: &'static str,
    /// What the line is about (a file, an action).
    pub subject: String,
    /// `ok`, `warn` (works, but look), `fail` (`run` refuses to start, or the action would
    /// be refused).
    pub status: CheckStatus,
    /// What was found, and what to do.
    pub detail: String,
}

/// The `check` lines about starting `run`, and `Some(64)` when `run` would not start (it
/// exits 64 itself, or 1 for TLS files it cannot read yet, which it retries: to a person
/// running `check` either is a file to fix before starting the agent).
pub fn rows(cfg: &Config) -> (Vec<SetupRow>, Option<u8>) {
    let Some(files) = &cfg.coordinator else {
        return (
            vec![SetupRow {
                kind: "coordinator",
                subject: "-".into(),
                status: CheckStatus::Warn,
                detail: "not set: `node-agent run` refuses to start (exit 64) until `coordinator`, `ca`, `cert` and `key` are set".into(),
            }],
            None,
        );
    };
    let subject = files.cert.display().to_string();
    match preflight(cfg) {
        Ok(p) => {
            let expiry = p.tls.expiry();
            let soon = expiry.warning(unix_now()).is_some();
            let when = expiry.summary(
                unix_now(),
                &format!(
                    "`coordinatorctl pki issue --role node --name {}`, then `systemctl reload node-agent`",
                    p.hostname
                ),
            );
            let row = SetupRow {
                kind: "tls",
                subject,
                status: if soon {
                    CheckStatus::Warn
                } else {
                    CheckStatus::Ok
                },
                detail: format!(
                    "{} under the CA {}; {when}",
                    p.tls.identity(),
                    files.ca.display()
                ),
            };
            (vec![row], None)
        }
        Err(e) => (
            vec![SetupRow {
                kind: "tls",
                subject,
                status: CheckStatus::Fail,
                detail: format!("`node-agent run` refuses to start: {e}"),
            }],
            Some(64),
        ),
    }
}

#[cfg(test)]
mod tests {
    use protocol::pki::{Ca, IssueOptions};

    use super::*;
    use crate::config::Settings;
    use crate::testkit_fixture::{AgentConfig, NodeFixture};

    /// The config of host `n1` (in `fx`) whose certificate is issued by `issuer` with `opts`,
    /// trusting `trusted`'s CA.
    fn config(
        fx: &NodeFixture,
        issuer: &Ca,
        trusted: &Ca,
        opts: IssueOptions,
    ) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let issued = issuer.issue(Role::Node, "n1", &opts).unwrap();
        let (cert, key) = issued.write(dir.path(), false).unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, trusted.cert_pem()).unwrap();
        let path = fx
            .write_agent_config(&AgentConfig::new("127.0.0.1:1", &ca, &cert, &key))
            .unwrap();
        let settings = Settings {
            config: Some(path),
            ..Settings::default()
        };
        (dir, Config::load(&settings).unwrap())
    }

    #[test]
    fn check_refuses_what_run_refuses_with_runs_exit_code() {
        let fx = NodeFixture::builder("n1").build().unwrap();
        let ca = Ca::generate("test.local").unwrap();
        let (_d, good) = config(&fx, &ca, &ca, IssueOptions::default());
        let (lines, exit) = rows(&good);
        assert_eq!(exit, None, "{lines:?}");
        assert_eq!(lines[0].status, CheckStatus::Ok, "{lines:?}");
        assert!(lines[0].detail.contains("node/n1"), "{lines:?}");

        // Expired two days ago (issued 367 days ago for 365).
        let expired = IssueOptions {
            clock_offset_secs: -367 * 86_400,
            ..Default::default()
        };
        let (_d, cfg) = config(&fx, &ca, &ca, expired);
        let (lines, exit) = rows(&cfg);
        assert_eq!(exit, Some(64), "{lines:?}");
        assert_eq!(lines[0].status, CheckStatus::Fail);
        assert!(lines[0].detail.contains("expired 2 days ago"), "{lines:?}");

        // Another fleet's CA.
        let other = Ca::generate("test.local").unwrap();
        let (_d, cfg) = config(&fx, &other, &ca, IssueOptions::default());
        let (lines, exit) = rows(&cfg);
        assert_eq!(exit, Some(64), "{lines:?}");
        assert!(
            lines[0].detail.contains("not valid under the CA"),
            "{lines:?}"
        );

        // Issued on a host whose clock is 3 h ahead: not valid yet here, said as the clocks.
        let ahead = IssueOptions {
            clock_offset_secs: 3 * 3600 + 300,
            ..Default::default()
        };
        let (_d, cfg) = config(&fx, &ca, &ca, ahead);
        let (lines, exit) = rows(&cfg);
        assert_eq!(exit, Some(64), "{lines:?}");
        let d = &lines[0].detail;
        assert!(
            d.contains("is not valid yet by the clock of this host"),
            "{d}"
        );
        assert!(
            d.contains("behind the clock of the host that issued it by more than 2 hours"),
            "{d}"
        );
        assert!(
            !d.contains("UNIX") && !d.contains("issue it from this fleet's CA"),
            "{d}"
        );

        // No coordinator: only a warning, `check` still checks the machine.
        let mut cfg = good.clone();
        cfg.coordinator = None;
        let (lines, exit) = rows(&cfg);
        assert_eq!((exit, lines[0].status), (None, CheckStatus::Warn));
    }
}
