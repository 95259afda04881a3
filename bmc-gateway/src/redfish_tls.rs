//! How the Redfish client trusts a BMC's certificate ([`Trust`], [`rustls_config`]): a CA
//! file whose certificates are also pinned (a BMC's own self-signed certificate), or anything
//! (`insecure`, plain HTTP); and what a failed connection most likely means in configuration
//! terms ([`connect_hint`]). It sends nothing itself; see [`crate::redfish`].

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// How to trust the BMC's certificate.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Plain HTTP (no TLS at all).
    PlainHttp,
    /// Certificates must chain to these CA certificates (PEM).
    Ca(Vec<u8>),
    /// Accept any certificate (logged loudly at start).
    Insecure,
}

/// Accepts any server certificate but still checks handshake signatures (for `insecure`).
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Trusts what chains to the CA file, and also a certificate the CA file holds itself: a
/// BMC's self-signed certificate copied into `ca_file` (often marked as a CA, or without the
/// BMC's address, which chain verification refuses) is pinned, as SSH pins a host key.
/// Handshake signatures are always checked.
#[derive(Debug)]
struct CaOrPinned {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for CaOrPinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(v) => Ok(v),
            Err(_)
                if self
                    .pinned
                    .iter()
                    .any(|c| c.as_ref() == end_entity.as_ref()) =>
            {
                Ok(ServerCertVerified::assertion())
            }
            Err(e) => Err(e),
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The certificates of a CA file (PEM) as trust roots, and each of them for pinning. Also
/// run when the configuration is loaded, so that a file that is not one is a configuration
/// error naming `redfish.ca_file`.
pub fn ca_roots(
    pem: &[u8],
) -> Result<(rustls::RootCertStore, Vec<CertificateDer<'static>>), String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let mut pinned = Vec::new();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| format!("CA file: {e}"))?;
        roots.add(c.clone()).map_err(|e| format!("CA file: {e}"))?;
        pinned.push(c);
    }
    if roots.is_empty() {
        return Err(
            "CA file holds no certificate (no PEM \"-----BEGIN CERTIFICATE-----\" block)".into(),
        );
    }
    Ok((roots, pinned))
}

/// The verifier of a CA file (PEM): its certificates as roots, and each of them pinned.
fn ca_verifier(
    pem: &[u8],
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<CaOrPinned>, String> {
    let (roots, pinned) = ca_roots(pem)?;
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("CA file: {e}"))?;
    Ok(Arc::new(CaOrPinned { inner, pinned }))
}

/// Builds the rustls client configuration for a trust setting (TLS 1.2 and 1.3: BMCs rarely
/// speak 1.3), with the ring provider.
pub fn rustls_config(trust: &Trust) -> Result<rustls::ClientConfig, String> {
    let provider = protocol::transport::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let cfg = match trust {
        Trust::Ca(pem) => builder
            .dangerous()
            .with_custom_certificate_verifier(ca_verifier(pem, &provider)?)
            .with_no_client_auth(),
        Trust::Insecure | Trust::PlainHttp => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth(),
    };
    Ok(cfg)
}

/// What a connection error most likely means in configuration terms, from its text: the
/// HTTP stack's words ("tls handshake eof", "UnknownIssuer") name no setting.
pub(crate) fn connect_hint(https: bool, detail: &str) -> Option<&'static str> {
    let d = detail.to_ascii_lowercase();
    if https && (d.contains("unknownissuer") || d.contains("causedasendentity")) {
        Some(
            "the BMC's certificate does not chain to redfish.ca_file and is not in it: \
             put its CA, or the BMC's own self-signed certificate, there",
        )
    } else if https && d.contains("notvalidforname") {
        Some("the BMC's certificate does not name the configured host")
    } else if https && (d.contains("tls handshake eof") || d.contains("invalidcontenttype")) {
        Some("the BMC may speak plain HTTP on this port: check the port and redfish.scheme")
    } else if !https
        && (d.contains("connection reset") || d.contains("connection closed before message"))
    {
        Some("the BMC may speak only HTTPS on this port: redfish.scheme is \"http\"")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An https/http mix-up or an untrusted certificate said only "tls handshake eof",
    /// "Connection reset by peer" or "UnknownIssuer", naming no setting.
    #[test]
    fn connection_errors_name_the_setting_to_check() {
        let cases = [
            (
                true,
                "client error (Connect): invalid peer certificate: UnknownIssuer",
                "redfish.ca_file",
            ),
            (
                true,
                "client error (Connect): tls handshake eof",
                "plain HTTP",
            ),
            (
                false,
                "connection error: Connection reset by peer (os error 104)",
                "only HTTPS",
            ),
        ];
        for (https, detail, hint) in cases {
            let got = connect_hint(https, detail).unwrap_or_default();
            assert!(got.contains(hint), "{detail}: {got:?}");
        }
        assert_eq!(
            connect_hint(true, "tcp connect error: Connection refused"),
            None
        );
        assert_eq!(connect_hint(false, "tls handshake eof"), None);
    }

    /// A BMC's self-signed certificate (a CA certificate, as `openssl req -x509` makes) put
    /// in `ca_file` was refused: "invalid peer certificate: … CaUsedAsEndEntity".
    #[test]
    fn a_self_signed_certificate_in_the_ca_file_is_trusted_and_no_other() {
        let der = |pem: &str| {
            use rustls::pki_types::pem::PemObject;
            CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
        };
        let bmc = protocol::pki::Ca::generate("bmc.test").unwrap();
        let other = protocol::pki::Ca::generate("bmc.test").unwrap();
        let verifier =
            ca_verifier(bmc.cert_pem().as_bytes(), &protocol::transport::provider()).unwrap();
        let name = ServerName::try_from("10.1.0.7").unwrap();
        let now = UnixTime::now();
        verifier
            .verify_server_cert(&der(bmc.cert_pem()), &[], &name, &[], now)
            .expect("the pinned certificate");
        let e = verifier
            .verify_server_cert(&der(other.cert_pem()), &[], &name, &[], now)
            .unwrap_err();
        assert!(format!("{e:?}").contains("CaUsedAsEndEntity"), "{e:?}");
    }
}
