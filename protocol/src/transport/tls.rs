//! A component's TLS material (fleet CA, its own chain and key, its identity) and the
//! rustls and quinn configurations and endpoints built from it.

use super::*;

/// Receive buffer asked for on a server endpoint's UDP socket. Every connection shares that
/// one socket: when a fleet reconnects at once (a coordinator restart) or thousands of
/// reports arrive together, datagrams come faster than one thread drains them, and the
/// kernel's default buffer (208 KiB, about 150 full packets) drops the rest. A dropped
/// handshake packet costs its connection a retransmission backoff of a second and more, so
/// a burst of drops turned into hello timeouts in the 5,000-agent simulation. Linux caps the
/// request at `net.core.rmem_max` (raise that sysctl to get all of it); 4 MiB holds about
/// 3,000 packets.
pub const SERVER_UDP_RECEIVE_BUFFER: usize = 4 * 1024 * 1024;

/// A UDP socket bound to `addr` whose receive buffer is asked to be `receive_buffer` bytes
/// (best effort: the kernel may grant less, and a refusal is not an error), for
/// `quinn::Endpoint::new`.
pub fn udp_socket(
    addr: SocketAddr,
    receive_buffer: usize,
) -> Result<std::net::UdpSocket, TransportError> {
    let bind = |source| TransportError::Bind { addr, source };
    let socket = std::net::UdpSocket::bind(addr).map_err(bind)?;
    let state = quinn::udp::UdpSocketState::new((&socket).into()).map_err(bind)?;
    if let Err(error) = state.set_recv_buffer_size((&socket).into(), receive_buffer) {
        tracing::debug!(%error, %addr, receive_buffer, "cannot enlarge the UDP receive buffer");
    }
    Ok(socket)
}

/// Paths of a component's TLS files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The fleet CA certificate (PEM).
    pub ca: PathBuf,
    /// This component's certificate (PEM).
    pub cert: PathBuf,
    /// This component's private key (PEM).
    pub key: PathBuf,
}

/// Loaded TLS material: trust roots, our chain and key, and our own identity.
#[derive(Debug)]
pub struct TlsMaterial {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    identity: Identity,
    expiry: Expiry,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> Self {
        Self {
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            expiry: self.expiry,
            identity: self.identity.clone(),
        }
    }
}

fn pem_err(what: &'static str, path: &Path, detail: impl ToString) -> TransportError {
    TransportError::Pem {
        what,
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

impl TlsMaterial {
    /// Loads the CA, certificate and key from PEM files.
    pub fn load(files: &TlsFiles) -> Result<Self, TransportError> {
        // A FIFO or a device named by mistake is refused, never waited on.
        let read =
            |what, path: &Path| crate::file::read_regular(path).map_err(|e| pem_err(what, path, e));
        let ca = read("CA certificate", &files.ca)?;
        let cert = read("certificate", &files.cert)?;
        let key = read("private key", &files.key)?;
        Self::from_pem(&ca, &cert, &key).map_err(|e| match e {
            TransportError::Pem { what, detail, .. } => {
                let path = match what {
                    "CA certificate" => &files.ca,
                    "certificate" => &files.cert,
                    _ => &files.key,
                };
                pem_err(what, path, detail)
            }
            other => other,
        })
    }

    /// Builds from PEM bytes (tests, in-memory PKI).
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, TransportError> {
        let none = Path::new("<memory>");
        let mut roots = RootCertStore::empty();
        let mut n = 0;
        let mut ca_expiry = i64::MAX;
        for c in CertificateDer::pem_slice_iter(ca) {
            let c = c.map_err(|e| pem_err("CA certificate", none, e))?;
            ca_expiry = ca_expiry
                .min(not_after_from_cert_der(&c).map_err(|e| pem_err("CA certificate", none, e))?);
            roots
                .add(c)
                .map_err(|e| pem_err("CA certificate", none, e))?;
            n += 1;
        }
        if n == 0 {
            return Err(pem_err("CA certificate", none, "no certificate in file"));
        }
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_err("certificate", none, e))?;
        let leaf = chain
            .first()
            .ok_or_else(|| pem_err("certificate", none, "no certificate in file"))?;
        let identity = identity_from_cert_der(leaf).map_err(|e| pem_err("certificate", none, e))?;
        let expiry = Expiry {
            certificate: not_after_from_cert_der(leaf)
                .map_err(|e| pem_err("certificate", none, e))?,
            ca: ca_expiry,
        };
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| pem_err("private key", none, e))?;
        // A key from another pair (a renewal copied in halves, say) loads fine and fails
        // every handshake later; find it here, where the error can name the file.
        rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider()).map_err(
            |e| {
                let detail = match e {
                    rustls::Error::InconsistentKeys(_) => format!(
                        "it is not the key of the certificate (for {identity}): install the key \
                         issued with that certificate"
                    ),
                    other => other.to_string(),
                };
                pem_err("private key", none, detail)
            },
        )?;
        Ok(Self {
            roots: Arc::new(roots),
            chain,
            key,
            identity,
            expiry,
        })
    }

    /// Whether `other` holds the same certificate chain and a CA of the same expiry: false
    /// after a renewal of either.
    pub fn same_certificate(&self, other: &Self) -> bool {
        self.chain == other.chain && self.expiry == other.expiry
    }

    /// When our certificate and our CA expire.
    pub fn expiry(&self) -> Expiry {
        self.expiry
    }

    /// [`TlsMaterial::verify_own_chain`], its failure said with the files it was loaded from
    /// (`cert`, `ca`) and the setting naming the CA (`ca_key`), as every program says it at
    /// start, at a reload and in its `check`.
    pub fn check_own_chain(
        &self,
        cert: &std::path::Path,
        ca: &std::path::Path,
        ca_key: &'static str,
    ) -> Result<(), ForeignCertificate> {
        self.verify_own_chain().map_err(|e| {
            let text = e.to_string();
            ForeignCertificate {
                cert: cert.to_path_buf(),
                ca: ca.to_path_buf(),
                ca_key,
                dates: super::clock::date_refusal(&text).is_some(),
                detail: super::clock::explain_dates(&text, "this host", None),
            }
        })
    }

    /// Checks that our own certificate chains to our CA and is valid now, as a peer will
    /// check it: a certificate from another fleet's CA (or expired) is found at start, not
    /// as a refused connection later. The error is the verifier's reason.
    pub fn verify_own_chain(&self) -> Result<(), TransportError> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let (leaf, intermediates) = self
            .chain
            .split_first()
            .ok_or_else(|| TransportError::Verifier("no certificate".into()))?;
        verifier
            .verify_client_cert(leaf, intermediates, rustls_pki_types::UnixTime::now())
            .map(|_| ())
            .map_err(TransportError::Tls)
    }

    /// Our own identity, from our certificate.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The rustls server configuration: TLS 1.3 only, client certificate required and
    /// verified against the fleet CA.
    pub fn rustls_server_config(&self) -> Result<rustls::ServerConfig, TransportError> {
        let provider = provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        // No session tickets: a ticket is remembered by the server (rustls keeps the last
        // 256 sessions, each with the client's certificate chain) and costs every handshake
        // two more messages, yet it cannot help whom it is for: 10,000 agents overflow that
        // cache, and after a coordinator restart (when they all reconnect) it is empty.
        cfg.send_tls13_tickets = 0;
        cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(cfg)
    }

    /// The rustls client configuration: TLS 1.3 only, server verified against the fleet CA,
    /// our certificate presented.
    pub fn rustls_client_config(&self) -> Result<rustls::ClientConfig, TransportError> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        Ok(cfg)
    }

    /// quinn server configuration with our transport settings.
    pub fn quinn_server_config(&self) -> Result<quinn::ServerConfig, TransportError> {
        let crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(self.rustls_server_config()?)
                .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        cfg.transport_config(Arc::new(transport_config(true)));
        Ok(cfg)
    }

    /// quinn client configuration with our transport settings.
    pub fn quinn_client_config(&self) -> Result<quinn::ClientConfig, TransportError> {
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(self.rustls_client_config()?)
                .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
        cfg.transport_config(Arc::new(transport_config(false)));
        Ok(cfg)
    }

    /// As [`TlsMaterial::quinn_client_config`], with a keep-alive every `keep_alive` instead
    /// of [`super::KEEP_ALIVE`] and `idle_timeout` instead of [`super::IDLE_TIMEOUT`]: for a client that waits on a few connections for answers
    /// and must learn soon that the peer restarted (its stateless reset answers the first
    /// packet the client sends after the restart, and a keep-alive is that packet).
    pub fn quinn_client_config_keep_alive(
        &self,
        keep_alive: std::time::Duration,
        idle_timeout: std::time::Duration,
    ) -> Result<quinn::ClientConfig, TransportError> {
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(self.rustls_client_config()?)
                .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
        let mut t = transport_config(false);
        t.keep_alive_interval(Some(keep_alive));
        // A VarInt of milliseconds holds 146 million years: no caller's constant overflows.
        t.max_idle_timeout(Some(
            idle_timeout.try_into().expect("idle timeout fits a VarInt"),
        ));
        cfg.transport_config(Arc::new(t));
        Ok(cfg)
    }

    /// A server endpoint listening on `addr` (which also works as a client), its socket's
    /// receive buffer enlarged ([`SERVER_UDP_RECEIVE_BUFFER`]).
    pub fn server_endpoint(&self, addr: SocketAddr) -> Result<Endpoint, TransportError> {
        let socket = udp_socket(addr, SERVER_UDP_RECEIVE_BUFFER)?;
        let runtime = Arc::new(quinn::TokioRuntime);
        let mut ep = Endpoint::new(
            self.restart_stable_endpoint_config(),
            Some(self.quinn_server_config()?),
            socket,
            runtime,
        )
        .map_err(|source| TransportError::Bind { addr, source })?;
        ep.set_default_client_config(self.quinn_client_config()?);
        Ok(ep)
    }

    /// Endpoint settings whose connection-id and stateless-reset keys are derived from this
    /// endpoint's private key, so that they are the same after a restart (quinn's default
    /// draws both at random per process).
    ///
    /// A server killed and started again on its port gets packets for connections its
    /// previous run had. With the same keys it recognises their connection ids as its own and
    /// answers each with a stateless reset (RFC 9000, section 10.3) that the peer can verify,
    /// so the peer drops the connection and reconnects at once. With fresh keys it drops them
    /// silently, and a peer waits for its own timeout: an agent for its report's answer
    /// (10 s), which at the default 5 s interval is past the 15 s after which the restarted
    /// coordinator calls a silent machine unreachable; the coordinator for a gateway's answer,
    /// until its keep-alive is not acknowledged. The keys are HMACs of the private key, which
    /// stays secret; a new key (certificate renewal) only means one restart without resets.
    fn restart_stable_endpoint_config(&self) -> quinn::EndpointConfig {
        use ring::hmac;
        let secret = hmac::Key::new(hmac::HMAC_SHA256, self.key.secret_der());
        let reset = hmac::sign(&secret, b"fleetmend QUIC stateless reset key v1");
        let cid = hmac::sign(&secret, b"fleetmend QUIC connection id key v1");
        let mut cfg =
            quinn::EndpointConfig::new(Arc::new(hmac::Key::new(hmac::HMAC_SHA256, reset.as_ref())));
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&cid.as_ref()[..8]);
        let cid_key = u64::from_le_bytes(cid_key);
        cfg.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        });
        cfg
    }

    /// A client-only endpoint on an ephemeral port of the family of `peer`.
    pub fn client_endpoint(&self, peer: SocketAddr) -> Result<Endpoint, TransportError> {
        let bind: SocketAddr = if peer.is_ipv6() {
            "[::]:0".parse().expect("literal address")
        } else {
            "0.0.0.0:0".parse().expect("literal address")
        };
        let mut ep =
            Endpoint::client(bind).map_err(|source| TransportError::Bind { addr: bind, source })?;
        ep.set_default_client_config(self.quinn_client_config()?);
        Ok(ep)
    }
}

/// Our certificate does not chain to our CA (another fleet's CA) or is not valid now
/// (expired, or not valid yet by this host's clock): every peer would refuse every
/// connection made with it.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.sentence())]
pub struct ForeignCertificate {
    /// The certificate file.
    pub cert: std::path::PathBuf,
    /// The CA file.
    pub ca: std::path::PathBuf,
    /// The setting that names the CA file (`ca`, `tls.ca`).
    pub ca_key: &'static str,
    /// The verifier's reason, its dates in words.
    pub detail: String,
    /// Whether the certificate was refused for its dates (expired or not valid yet by this
    /// host's clock) rather than for whom it was issued by: then the advice is the clock or
    /// a renewal, not the CA.
    pub dates: bool,
}

impl ForeignCertificate {
    fn sentence(&self) -> String {
        let (cert, ca) = (self.cert.display(), self.ca.display());
        if self.dates {
            format!(
                "certificate {cert} (CA {ca}) is not valid now: {}; a certificate that expired needs renewing (`coordinatorctl pki issue`)",
                self.detail
            )
        } else {
            format!(
                "certificate {cert} is not valid under the CA {ca} ({}); issue it from this fleet's CA or fix `{}`",
                self.detail, self.ca_key
            )
        }
    }
}
