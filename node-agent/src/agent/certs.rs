//! The node's certificate and CA against the clock: refused at start once expired
//! ([`super::preflight`]), warned about from a month before (at start and at each reload).

use protocol::transport::{TlsMaterial, unix_now};
use tracing::warn;

use super::AgentError;

/// An expired certificate or CA, said as such (the chain check would only say the
/// certificate is "not valid under the CA"): the coordinator would refuse every report.
pub(super) fn refuse_expired(
    tls: &TlsMaterial,
    files: &crate::config::CoordinatorConfig,
    now: i64,
) -> Result<(), AgentError> {
    let e = tls.expiry();
    match e.warning(now) {
        Some(detail) if e.certificate < now || e.ca < now => Err(AgentError::Expired {
            cert: files.cert.clone(),
            ca: files.ca.clone(),
            name: tls.identity().name.clone(),
            detail,
        }),
        _ => Ok(()),
    }
}

/// Logs a warning when this node's certificate or the CA expires within a month (or has
/// expired): past it the coordinator refuses every report, and the machine turns
/// `unreachable`. Said at start and at each reload, not at every reconnect.
pub(super) fn warn_if_expiring(tls: &TlsMaterial, cert: &std::path::Path) {
    if let Some(w) = tls.expiry().warning(unix_now()) {
        warn!(
            certificate = %cert.display(),
            identity = %tls.identity(),
            "{w}: install a new certificate (`coordinatorctl pki issue --role node --name {}`) and reload (`systemctl reload node-agent`); past it the coordinator refuses this node's reports",
            tls.identity().name
        );
    }
}

#[cfg(test)]
mod tests {
    use protocol::identity::Role;
    use protocol::pki::{Ca, IssueOptions};

    use super::*;

    #[test]
    fn an_expired_certificate_or_ca_is_said_to_be_expired() {
        let ca = Ca::generate("test.local").unwrap();
        let issued = ca
            .issue(Role::Node, "n1", &IssueOptions::default())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = issued.write(dir.path(), false).unwrap();
        let ca_path = dir.path().join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).unwrap();
        let files = crate::config::CoordinatorConfig {
            address: "127.0.0.1:1".into(),
            server_name: "127.0.0.1".into(),
            targets: vec![("127.0.0.1:1".into(), "127.0.0.1".into())],
            server_name_set: None,
            ca: ca_path,
            cert,
            key,
        };
        let tls = TlsMaterial::load(&protocol::transport::TlsFiles {
            ca: files.ca.clone(),
            cert: files.cert.clone(),
            key: files.key.clone(),
        })
        .unwrap();
        let now = unix_now();
        const DAY: i64 = 86_400;
        // A month before the certificate's year is up: valid, only warned about.
        refuse_expired(&tls, &files, now + 340 * DAY).unwrap();
        let e = refuse_expired(&tls, &files, now + 400 * DAY).unwrap_err();
        assert_eq!(e.exit_code(), 64);
        let msg = e.to_string();
        assert!(
            msg.starts_with("the certificate expired 35 days ago ("),
            "{msg}"
        );
        assert!(!msg.contains("the CA"), "{msg}");
        assert!(
            msg.contains("--role node --name n1`) and start the agent again"),
            "{msg}"
        );
        // The CA's ten years.
        let msg = refuse_expired(&tls, &files, now + 3700 * DAY)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("; the CA expired "), "{msg}");
    }
}
