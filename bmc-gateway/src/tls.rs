//! The gateway's own TLS files, checked the same way at start, at each reload and by
//! `bmc-gateway check`: they load (the key is the certificate's), the certificate names a
//! gateway, and it chains to the configured CA and is valid now ([`TlsMaterial::verify_own_chain`],
//! the check a coordinator makes at the handshake). A certificate from another fleet's CA
//! would otherwise be found only as every coordinator connection failing.
//!
//! It does not compare with a running identity (that is [`crate::reload`]'s) and does not
//! bind anything.

use std::path::PathBuf;

use protocol::Role;
use protocol::transport::{TlsFiles, TlsMaterial, TransportError};

use crate::config::TlsConfig;

/// Why the gateway's TLS files cannot serve coordinators.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or unreadable, or the key is not the certificate's.
    #[error("TLS files: {0}")]
    Load(#[source] TransportError),
    /// The certificate names another role.
    #[error(
        "the certificate {cert} names {identity}, not a gateway (spiffe://<domain>/gateway/<rack>); issue one with `coordinatorctl pki issue --role gateway`"
    )]
    NotAGateway {
        /// The certificate file.
        cert: PathBuf,
        /// The identity it names.
        identity: String,
    },
    /// The certificate does not chain to the configured CA (another fleet's CA) or is not
    /// valid now (expired): every coordinator would refuse this gateway.
    #[error(transparent)]
    ForeignCertificate(#[from] protocol::transport::ForeignCertificate),
}

/// Loads the files `tls` names and checks that they make a gateway of the fleet of `tls.ca`.
pub fn load_own(tls: &TlsConfig) -> Result<TlsMaterial, TlsError> {
    let material = TlsMaterial::load(&TlsFiles {
        ca: tls.ca.clone(),
        cert: tls.cert.clone(),
        key: tls.key.clone(),
    })
    .map_err(TlsError::Load)?;
    let me = material.identity();
    if me.role != Role::Gateway {
        return Err(TlsError::NotAGateway {
            cert: tls.cert.clone(),
            identity: me.to_string(),
        });
    }
    material.check_own_chain(&tls.cert, &tls.ca, "tls.ca")?;
    Ok(material)
}

/// `bmc-gateway check`'s TLS line: who the files make this gateway and when they expire, or
/// why they cannot serve.
pub fn check(tls: &TlsConfig) -> Result<String, String> {
    let material = load_own(tls).map_err(|e| e.to_string())?;
    let when = material.expiry().summary(
        protocol::transport::unix_now(),
        "`coordinatorctl pki issue --role gateway`, then `systemctl reload bmc-gateway`",
    );
    Ok(format!(
        "{} ({}), chains to {}; {when}",
        material.identity(),
        tls.cert.display(),
        tls.ca.display()
    ))
}

/// `check`'s TLS line for a person, printed under the BMC table: `tls  ok  …` or
/// `tls  FAIL  …`.
pub fn render_check(line: &Result<String, String>) -> String {
    match line {
        Ok(detail) => format!("tls  ok    {detail}\n"),
        Err(detail) => format!("tls  FAIL  {detail}\n"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use protocol::pki::{Ca, IssueOptions};

    use super::*;

    /// Writes a CA and a certificate of `role` issued by `issuer` (the CA itself when
    /// `None`) into `dir`; returns the `[tls]` section naming them.
    pub(crate) fn files(dir: &Path, ca: &Ca, issuer: Option<&Ca>, role: Role) -> TlsConfig {
        let issued = issuer
            .unwrap_or(ca)
            .issue(role, "rack-1", &IssueOptions::default())
            .unwrap();
        let (cert, key) = issued.write(dir, true).unwrap();
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).unwrap();
        TlsConfig {
            ca: ca_path,
            cert,
            key,
        }
    }

    #[test]
    fn a_gateway_certificate_of_the_configured_ca_passes() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test.local").unwrap();
        let tls = files(dir.path(), &ca, None, Role::Gateway);
        let line = check(&tls).unwrap();
        assert!(
            line.contains("gateway/rack-1") && line.contains("chains to"),
            "{line}"
        );
        assert!(render_check(&Ok(line)).starts_with("tls  ok    spiffe://"));
    }

    #[test]
    fn a_certificate_of_another_ca_is_refused_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test.local").unwrap();
        let other = Ca::generate("test.local").unwrap();
        let tls = files(dir.path(), &ca, Some(&other), Role::Gateway);
        let e = load_own(&tls).unwrap_err();
        assert!(matches!(e, TlsError::ForeignCertificate { .. }), "{e}");
        let msg = check(&tls).unwrap_err();
        assert!(render_check(&Err(msg.clone())).starts_with("tls  FAIL  certificate "));
        assert!(
            msg.contains(&format!(
                "{} is not valid under the CA {}",
                tls.cert.display(),
                tls.ca.display()
            )),
            "{msg}"
        );
    }

    #[test]
    fn another_role_a_missing_file_or_a_foreign_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test.local").unwrap();
        let tls = files(dir.path(), &ca, None, Role::Node);
        let msg = check(&tls).unwrap_err();
        assert!(msg.contains("not a gateway"), "{msg}");

        let tls = files(dir.path(), &ca, None, Role::Gateway);
        let missing = TlsConfig {
            key: dir.path().join("nope.key"),
            ..tls.clone()
        };
        let msg = check(&missing).unwrap_err();
        assert!(msg.contains("nope.key"), "{msg}");

        // The key of another pair.
        let other_dir = tempfile::tempdir().unwrap();
        let other = files(other_dir.path(), &ca, None, Role::Gateway);
        let mixed = TlsConfig {
            key: other.key,
            ..tls
        };
        let msg = check(&mixed).unwrap_err();
        assert!(msg.contains("not the key of the certificate"), "{msg}");
    }
}
