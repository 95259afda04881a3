//! rustls and quinn glue: TLS 1.3 configurations with mutual authentication against the
//! fleet CA, QUIC endpoints, the peer identity of a connection, framed message I/O on QUIC
//! streams, and both halves of the hello handshake.
//!
//! Everything uses the ring crypto provider explicitly, so no process-wide default provider
//! is needed and no second provider can sneak in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint, RecvStream, SendStream};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Serialize, de::DeserializeOwned};

use crate::frame::{self, FrameError, HEADER_LEN};
use crate::identity::{Identity, IdentityError, Role};
use crate::messages::{ClientHello, HelloBody, HelloReply, Refusal, RefusalCode, peek_version};
use crate::{ALPN, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};

mod client;
pub mod clock;
pub mod expiry;
mod probe;
mod settings;
mod tls;

pub use client::{Session, connect, connect_with, connect_within};
pub use expiry::{
    EXPIRY_WARNING, Expiry, expiry_date, expiry_distance, not_after_from_cert_der, peer_not_after,
    unix_now,
};
pub use probe::port_refused;
use settings::transport_config;
pub use settings::{
    CONNECTION_RECEIVE_WINDOW, MULTIPLEXED_STREAMS, SEND_WINDOW, STREAM_RECEIVE_WINDOW,
    STREAMS_PER_CONNECTION, immediate_acks,
};
pub use tls::{ForeignCertificate, SERVER_UDP_RECEIVE_BUFFER, TlsFiles, TlsMaterial, udp_socket};

/// How long a QUIC connection may stay silent before it is considered dead.
///
/// Agents report every few seconds and keep-alives run every [`KEEP_ALIVE`], so 30 s of
/// silence means the peer or the path is gone; health state does not depend on this (it is
/// derived from reports), only resource cleanup does.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Keep-alive period: well under [`IDLE_TIMEOUT`] so an idle admin or gateway connection
/// survives, and NAT/conntrack entries stay fresh.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// How long the hello exchange may take before the connection is dropped. Bounds what a peer
/// that connects and says nothing can hold.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors moving messages between Fleetmend components.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A certificate, key or CA file could not be read or parsed.
    #[error("cannot load {what} from {path}: {detail}")]
    Pem {
        /// Which file (CA, certificate, key).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(String),
    /// Binding a UDP socket failed.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// A connection could not be started.
    #[error("cannot connect to {addr}: {detail}")]
    Connect {
        /// Peer address.
        addr: SocketAddr,
        /// Cause.
        detail: String,
    },
    /// The connection failed or was closed.
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// Writing to a stream failed.
    #[error("write failed: {0}")]
    Write(#[from] quinn::WriteError),
    /// Reading from a stream failed.
    #[error("read failed: {0}")]
    Read(String),
    /// A frame was malformed or too large.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer closed the stream where a message was expected.
    #[error("peer closed the stream before answering")]
    Closed,
    /// The peer refused us.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The coordinator at `addr` does not lead now ([`HelloReply::Standby`]).
    #[error("the coordinator at {addr} answered {reason}")]
    Standby {
        /// Who answered.
        addr: SocketAddr,
        /// Its name, from its certificate.
        name: String,
        /// The leader's address, when the standby knows it.
        leader: Option<String>,
        /// Its words.
        reason: String,
    },
    /// The peer's certificate names no usable identity.
    #[error("peer identity: {0}")]
    Identity(#[from] IdentityError),
    /// The peer is not the kind of component we meant to talk to.
    #[error("peer {peer} is not a {expected}")]
    UnexpectedPeer {
        /// Role we required.
        expected: Role,
        /// Who answered.
        peer: Identity,
    },
    /// The exchange took too long.
    #[error("timed out after {}", crate::duration::display(*.0))]
    Timeout(Duration),
    /// The server closed the connection during or right after the TLS handshake with a
    /// certificate alert: it does not accept our certificate (another CA, expired, revoked).
    #[error("the {server} rejected this certificate ({detail})")]
    CertificateRejected {
        /// Who rejected it.
        server: Role,
        /// The TLS alert and reason the server gave, its dates in words.
        detail: String,
        /// Whether the server refused it for its dates by its own clock (expired, not valid
        /// yet): a clock or a renewal to fix, not the CA.
        dates: bool,
    },
    /// This side did not accept the server's certificate during the TLS handshake: it is not
    /// issued by our CA, or it does not name the server name we asked for.
    #[error(
        "the {server}'s certificate was not accepted here ({detail}){}",
        if *.dates { String::new() } else { format!(": check that the CA file is the fleet's CA and that the server name (default: the host part of the address) is one the {server}'s certificate names") }
    )]
    ServerCertificateRefused {
        /// Whose certificate it was.
        server: Role,
        /// The TLS alert and rustls' reason, its dates in words.
        detail: String,
        /// Whether it was refused for its dates by this host's clock.
        dates: bool,
    },
    /// Nothing completed a QUIC handshake at the address in time: no server there, a wrong
    /// port, or a firewall dropping UDP.
    #[error(
        "nothing answered at {addr} within {}: check that the {server} runs and that this is its QUIC (UDP) port", crate::duration::display(*.after)
    )]
    NoAnswer {
        /// The address tried.
        addr: SocketAddr,
        /// How long we waited.
        after: Duration,
        /// Who we expected.
        server: Role,
    },
    /// The server's host answered our probe with ICMP "port unreachable": no process
    /// listens on that UDP port (the server is stopped, or this is not its port).
    #[error(
        "nothing listens on {addr} (UDP): its host answered \"port unreachable\"; check that the {server} runs and that this is its QUIC port"
    )]
    NothingListens {
        /// The address tried.
        addr: SocketAddr,
        /// Who we expected.
        server: Role,
    },
}

impl TransportError {
    /// True when trying again later may succeed (network trouble), false when the
    /// configuration or the peer's policy must change first.
    pub fn is_retriable(&self) -> bool {
        match self {
            TransportError::Connect { .. }
            | TransportError::Connection(_)
            | TransportError::Write(_)
            | TransportError::Read(_)
            | TransportError::Closed
            | TransportError::Timeout(_)
            | TransportError::NoAnswer { .. }
            | TransportError::NothingListens { .. }
            | TransportError::Standby { .. } => true,
            TransportError::Refused(r) => matches!(r.code, RefusalCode::ShuttingDown),
            _ => false,
        }
    }
}

/// The ring provider, the only crypto provider Fleetmend uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Extracts the single `spiffe://` URI SAN from a DER certificate.
pub fn identity_from_cert_der(der: &[u8]) -> Result<Identity, IdentityError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
    let uris: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) if u.starts_with("spiffe://") => Some(*u),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match uris.as_slice() {
        [] => Err(IdentityError::NoIdentity),
        [one] => one.parse(),
        many => Err(IdentityError::Ambiguous(many.len())),
    }
}

/// The verified identity of the peer of an established connection.
pub fn peer_identity(conn: &Connection) -> Result<Identity, IdentityError> {
    let any = conn.peer_identity().ok_or(IdentityError::NoIdentity)?;
    let certs = any
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| IdentityError::BadCertificate("unexpected peer identity type".into()))?;
    let leaf = certs.first().ok_or(IdentityError::NoIdentity)?;
    identity_from_cert_der(leaf)
}

/// Writes one framed message.
pub async fn write_msg<T: Serialize>(
    send: &mut SendStream,
    msg: &T,
    max: usize,
) -> Result<(), TransportError> {
    let bytes = frame::encode_frame(msg, max)?;
    send.write_all(&bytes).await?;
    Ok(())
}

/// Reads one frame's payload. `Ok(None)` when the peer finished the stream cleanly before a
/// new frame began; an oversized header is refused before its payload is read.
pub async fn read_payload(
    recv: &mut RecvStream,
    max: usize,
) -> Result<Option<Vec<u8>>, TransportError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match recv
            .read(&mut header[got..])
            .await
            .map_err(|e| TransportError::Read(e.to_string()))?
        {
            Some(n) => got += n,
            None if got == 0 => return Ok(None),
            None => {
                return Err(FrameError::Truncated {
                    got,
                    expected: HEADER_LEN,
                }
                .into());
            }
        }
    }
    let len = frame::payload_len(header, max)?;
    let mut payload = vec![0u8; len];
    recv.read_exact(&mut payload).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(n) => TransportError::Frame(FrameError::Truncated {
            got: HEADER_LEN + n,
            expected: HEADER_LEN + len,
        }),
        quinn::ReadExactError::ReadError(e) => TransportError::Read(e.to_string()),
    })?;
    Ok(Some(payload))
}

/// Reads and decodes one framed message; `Ok(None)` at a clean end of stream.
pub async fn read_msg<T: DeserializeOwned>(
    recv: &mut RecvStream,
    max: usize,
) -> Result<Option<T>, TransportError> {
    match read_payload(recv, max).await? {
        Some(p) => Ok(Some(frame::decode_payload(&p)?)),
        None => Ok(None),
    }
}

/// Reads one framed message where the peer must answer.
pub async fn expect_msg<T: DeserializeOwned>(
    recv: &mut RecvStream,
    max: usize,
) -> Result<T, TransportError> {
    read_msg(recv, max).await?.ok_or(TransportError::Closed)
}

/// A hello the server has read and version-checked but not yet accepted: the caller decides,
/// from `peer` and `hello`, whether to [`PendingHello::accept`] or [`PendingHello::refuse`].
#[derive(Debug)]
pub struct PendingHello {
    /// The connection.
    pub conn: Connection,
    /// The verified peer identity (from its certificate).
    pub peer: Identity,
    /// What the peer said.
    pub hello: HelloBody,
    /// The protocol version of the peer's hello, spoken on this connection.
    pub version: u16,
    send: SendStream,
    recv: RecvStream,
}

impl PendingHello {
    /// Accepts the connection and returns its session. Peers other than node-agents get
    /// [`MULTIPLEXED_STREAMS`] stream slots (agents keep [`STREAMS_PER_CONNECTION`]).
    pub async fn accept(mut self, server: &str) -> Result<Session, TransportError> {
        if self.peer.role != Role::Node {
            self.conn
                .set_max_concurrent_bi_streams(MULTIPLEXED_STREAMS.into());
        }
        let reply = HelloReply::Accepted {
            protocol_version: self.version,
            server: server.to_string(),
        };
        write_msg(&mut self.send, &reply, frame::MAX_FRAME_LEN).await?;
        Ok(Session {
            conn: self.conn,
            peer: self.peer,
            send: self.send,
            recv: self.recv,
            version: self.version,
        })
    }

    /// Refuses the connection with a reason, then closes it.
    pub async fn refuse(mut self, refusal: Refusal) {
        send_refusal(&self.conn, &mut self.send, refusal).await;
    }

    /// Answers that this coordinator does not lead and names the leader if it knows it
    /// ([`HelloReply::Standby`]), then closes the connection. A client of version 1 cannot
    /// read that answer: it gets a `shutting-down` refusal with the same words, which it
    /// retries later.
    pub async fn refuse_standby(mut self, leader: Option<String>) {
        let reason = crate::messages::standby_reason(leader.as_deref());
        if self.version >= 2 {
            let reply = HelloReply::Standby { leader, reason };
            send_reply_and_close(&self.conn, &mut self.send, &reply).await;
        } else {
            let r = Refusal::new(RefusalCode::ShuttingDown, reason);
            send_refusal(&self.conn, &mut self.send, r).await;
        }
    }
}

/// Writes a refusal hello reply, finishes the stream, and closes the connection once the
/// peer has had a moment to read it.
pub async fn send_refusal(conn: &Connection, send: &mut SendStream, refusal: Refusal) {
    send_reply_and_close(conn, send, &HelloReply::Refused(refusal)).await;
}

/// Writes `reply`, finishes the stream, and closes the connection once the peer has had a
/// moment to read it.
async fn send_reply_and_close(conn: &Connection, send: &mut SendStream, reply: &HelloReply) {
    let reason = match reply {
        HelloReply::Refused(r) => r.reason.clone(),
        HelloReply::Standby { reason, .. } => reason.clone(),
        HelloReply::Accepted { .. } => String::new(),
    };
    let _ = write_msg(send, reply, frame::MAX_FRAME_LEN).await;
    let _ = send.finish();
    // Give the reply a chance to be delivered before the close frame overtakes it.
    let _ = tokio::time::timeout(Duration::from_secs(2), send.stopped()).await;
    let mut r = reason.into_bytes();
    r.truncate(200);
    conn.close(1u32.into(), &r);
}

/// Why the server side of a hello failed before the caller could decide anything.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    /// The connection or stream failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The client was refused (the refusal has already been sent).
    #[error("refused {peer}: {refusal}")]
    Refused {
        /// Who, if known (address or identity).
        peer: String,
        /// What was said.
        refusal: Refusal,
    },
}

/// Server side: completes the QUIC handshake of an incoming connection, verifies the peer's
/// identity (same trust domain as ours), reads and version-checks its hello. Protocol-level
/// failures are answered with a refusal and returned as [`HelloError::Refused`].
pub async fn accept_hello(
    incoming: quinn::Incoming,
    trust_domain: &str,
) -> Result<PendingHello, HelloError> {
    let remote = incoming.remote_address();
    let work = async {
        let conn = incoming.await.map_err(TransportError::from)?;
        let (mut send, mut recv) = conn.accept_bi().await.map_err(TransportError::from)?;
        let refuse = |code, reason: String| Refusal::new(code, reason);
        let peer = match peer_identity(&conn) {
            Ok(p) if p.trust_domain == trust_domain => p,
            Ok(p) => {
                let r = refuse(
                    RefusalCode::NotAuthorized,
                    format!("identity {p} is not in trust domain {trust_domain}"),
                );
                send_refusal(&conn, &mut send, r.clone()).await;
                return Err(HelloError::Refused {
                    peer: remote.to_string(),
                    refusal: r,
                });
            }
            Err(e) => {
                let r = refuse(RefusalCode::NotAuthorized, format!("certificate: {e}"));
                send_refusal(&conn, &mut send, r.clone()).await;
                return Err(HelloError::Refused {
                    peer: remote.to_string(),
                    refusal: r,
                });
            }
        };
        let who = format!("{peer} at {remote}");
        let payload = match read_payload(&mut recv, frame::MAX_FRAME_LEN).await {
            Ok(Some(p)) => p,
            Ok(None) => return Err(TransportError::Closed.into()),
            Err(TransportError::Frame(e)) => {
                let code = match e {
                    FrameError::Oversized { .. } => RefusalCode::FrameTooLarge,
                    _ => RefusalCode::Malformed,
                };
                let r = refuse(code, format!("hello: {e}"));
                send_refusal(&conn, &mut send, r.clone()).await;
                return Err(HelloError::Refused {
                    peer: who,
                    refusal: r,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let version = match peek_version(&payload) {
            Ok(v) => v,
            Err(e) => {
                let r = refuse(RefusalCode::Malformed, format!("hello: {e}"));
                send_refusal(&conn, &mut send, r.clone()).await;
                return Err(HelloError::Refused {
                    peer: who,
                    refusal: r,
                });
            }
        };
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            let r = refuse(
                RefusalCode::UnsupportedVersion,
                format!(
                    "protocol version {version} is not supported; this server speaks {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}: \
                     run this client and this server from releases that share a version (upgrade the older one)"
                ),
            );
            send_refusal(&conn, &mut send, r.clone()).await;
            return Err(HelloError::Refused {
                peer: who,
                refusal: r,
            });
        }
        let hello: ClientHello = match frame::decode_payload(&payload) {
            Ok(h) => h,
            Err(e) => {
                let r = refuse(RefusalCode::Malformed, format!("hello: {e}"));
                send_refusal(&conn, &mut send, r.clone()).await;
                return Err(HelloError::Refused {
                    peer: who,
                    refusal: r,
                });
            }
        };
        Ok(PendingHello {
            conn,
            peer,
            hello: hello.body,
            version,
            send,
            recv,
        })
    };
    match tokio::time::timeout(HELLO_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(TransportError::Timeout(HELLO_TIMEOUT).into()),
    }
}
