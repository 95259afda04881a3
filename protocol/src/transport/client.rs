//! The client side of a connection: connect, say hello in the newest protocol version the
//! server speaks, and read its answer (accepted, refused with the reason, or a standby naming
//! the leader), telling a refused certificate apart from a lost path.

use super::*;

/// The streams of a connection whose hello was accepted.
#[derive(Debug)]
pub struct Session {
    /// The connection.
    pub conn: Connection,
    /// The verified peer.
    pub peer: Identity,
    /// Send half of the hello stream.
    pub send: SendStream,
    /// Receive half of the hello stream.
    pub recv: RecvStream,
    /// The protocol version spoken on this connection: the client's hello's, between
    /// [`OLDEST_PROTOCOL_VERSION`] and [`PROTOCOL_VERSION`]. What travels on the
    /// connection's streams depends on it (e.g. fencing tokens from version 2,
    /// [`crate::fencing`]).
    pub version: u16,
}

/// Client side: connects to `addr`, checks the server's certificate names a `server_role`,
/// sends `body` as hello and waits for acceptance.
///
/// `server_name` must match a DNS or IP SAN of the server's certificate; by default use the
/// host part of the address.
pub async fn connect(
    endpoint: &Endpoint,
    addr: SocketAddr,
    server_name: &str,
    server_role: Role,
    body: HelloBody,
) -> Result<Session, TransportError> {
    connect_within(
        endpoint,
        addr,
        server_name,
        server_role,
        body,
        HELLO_TIMEOUT,
    )
    .await
}

/// [`connect`] with another time limit for the handshake and the hello exchange together.
/// Errors say what the client can tell: [`TransportError::NoAnswer`] when no QUIC handshake
/// completed in time (wrong address or port), [`TransportError::CertificateRejected`] when
/// the server closed the connection over our certificate.
pub async fn connect_within(
    endpoint: &Endpoint,
    addr: SocketAddr,
    server_name: &str,
    server_role: Role,
    body: HelloBody,
    limit: Duration,
) -> Result<Session, TransportError> {
    negotiate(
        || endpoint.connect(addr, server_name),
        addr,
        server_role,
        body,
        limit,
    )
    .await
}

/// [`connect_within`] with a client configuration of its own instead of the endpoint's
/// default: one endpoint (one UDP socket) can then hold connections under many identities,
/// as the fleet simulator does with thousands of node certificates.
pub async fn connect_with(
    endpoint: &Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    server_role: Role,
    body: HelloBody,
    limit: Duration,
) -> Result<Session, TransportError> {
    negotiate(
        || endpoint.connect_with(config.clone(), addr, server_name),
        addr,
        server_role,
        body,
        limit,
    )
    .await
}

/// Says hello in [`PROTOCOL_VERSION`]; when the server refuses that version (a server of an
/// older release), says it again on a new connection in [`OLDEST_PROTOCOL_VERSION`], which
/// every release speaks. The session's [`Session::version`] says which was accepted.
async fn negotiate(
    connect: impl Fn() -> Result<quinn::Connecting, quinn::ConnectError>,
    addr: SocketAddr,
    server_role: Role,
    body: HelloBody,
    limit: Duration,
) -> Result<Session, TransportError> {
    let first = hello_exchange(
        connect(),
        addr,
        server_role,
        body.clone(),
        limit,
        PROTOCOL_VERSION,
    )
    .await;
    match first {
        Err(TransportError::Refused(r))
            if r.code == RefusalCode::UnsupportedVersion
                && OLDEST_PROTOCOL_VERSION < PROTOCOL_VERSION =>
        {
            tracing::info!(%addr, server = %server_role, reason = %r.reason, version = OLDEST_PROTOCOL_VERSION, "the server is of an older release; saying hello in the older protocol version");
            hello_exchange(
                connect(),
                addr,
                server_role,
                body,
                limit,
                OLDEST_PROTOCOL_VERSION,
            )
            .await
        }
        other => other,
    }
}

/// The client side after `Endpoint::connect`: QUIC handshake, server role check and hello.
async fn hello_exchange(
    connecting: Result<quinn::Connecting, quinn::ConnectError>,
    addr: SocketAddr,
    server_role: Role,
    body: HelloBody,
    limit: Duration,
    version: u16,
) -> Result<Session, TransportError> {
    let handshaken = std::sync::atomic::AtomicBool::new(false);
    let attempt = async {
        let conn = connecting
            .map_err(|e| TransportError::Connect {
                addr,
                detail: e.to_string(),
            })?
            .await
            .map_err(|e| certificate_rejected(&e, server_role).unwrap_or(e.into()))?;
        handshaken.store(true, std::sync::atomic::Ordering::Relaxed);
        let peer = peer_identity(&conn)?;
        if peer.role != server_role {
            conn.close(0u32.into(), b"unexpected server role");
            return Err(TransportError::UnexpectedPeer {
                expected: server_role,
                peer,
            });
        }
        let exchange = async {
            let (mut send, mut recv) = conn.open_bi().await?;
            let hello = ClientHello {
                protocol_version: version,
                body,
            };
            write_msg(&mut send, &hello, frame::MAX_FRAME_LEN).await?;
            let reply = expect_msg::<HelloReply>(&mut recv, frame::MAX_FRAME_LEN).await?;
            Ok::<_, TransportError>((send, recv, reply))
        };
        // TLS 1.3: the server checks our certificate after our side of the handshake is
        // done, so its refusal surfaces here, as the connection's close reason.
        match exchange.await {
            Ok((send, recv, HelloReply::Accepted { .. })) => Ok(Session {
                conn,
                peer,
                send,
                recv,
                version,
            }),
            Ok((_, _, HelloReply::Refused(r))) => Err(TransportError::Refused(r)),
            Ok((_, _, HelloReply::Standby { leader, reason })) => Err(TransportError::Standby {
                addr,
                name: peer.name.clone(),
                leader,
                reason,
            }),
            Err(e) => Err(conn
                .close_reason()
                .and_then(|reason| certificate_rejected(&reason, server_role))
                .unwrap_or(e)),
        }
    };
    // A stopped server on a reachable host is said at once, not after the whole limit.
    let refused = async {
        probe::port_refused(addr).await;
        Err(TransportError::NothingListens {
            addr,
            server: server_role,
        })
    };
    let result = tokio::time::timeout(limit, async {
        tokio::select! {
            r = attempt => r,
            e = refused => e,
        }
    })
    .await;
    match result {
        Ok(r) => r,
        Err(_) if !handshaken.load(std::sync::atomic::Ordering::Relaxed) => {
            Err(TransportError::NoAnswer {
                addr,
                after: limit,
                server: server_role,
            })
        }
        Err(_) => Err(TransportError::Timeout(limit)),
    }
}

/// TLS alerts that mean "your certificate is not acceptable" (RFC 8446 §6.2). A server
/// sends decrypt_error (51) when a certificate's signature does not verify under its CA,
/// which is what a certificate from another CA with the same name looks like.
const CERTIFICATE_ALERTS: &[(u8, &str)] = &[
    (42, "bad_certificate"),
    (43, "unsupported_certificate"),
    (44, "certificate_revoked"),
    (45, "certificate_expired"),
    (46, "certificate_unknown"),
    (48, "unknown_ca"),
    (49, "access_denied"),
    (
        51,
        "decrypt_error: the certificate's signature does not verify under the server's CA",
    ),
    (116, "certificate_required"),
];

/// The explanation when the handshake ended with a TLS certificate alert (QUIC carries TLS
/// alerts as transport error codes 0x100 + alert, RFC 9001 §4.8): sent by the server
/// ([`TransportError::CertificateRejected`]), or raised here because the server's
/// certificate did not verify ([`TransportError::ServerCertificateRefused`]).
fn certificate_rejected(e: &quinn::ConnectionError, server: Role) -> Option<TransportError> {
    // The peer's close arrives as `ConnectionClosed`; `TransportError` is one we detected.
    let (code, reason, ours) = match e {
        quinn::ConnectionError::ConnectionClosed(c) => (
            u64::from(c.error_code),
            String::from_utf8_lossy(&c.reason).into_owned(),
            false,
        ),
        quinn::ConnectionError::TransportError(t) => (u64::from(t.code), t.reason.clone(), true),
        _ => return None,
    };
    let alert = u8::try_from(code.checked_sub(0x100)?).ok()?;
    let (_, name) = CERTIFICATE_ALERTS.iter().find(|(a, _)| *a == alert)?;
    // Ours: checked by this host's clock. The server's: by its clock, which may differ.
    let dates = clock::date_refusal(&reason).is_some();
    let reason = if ours {
        clock::explain_dates(&reason, "this host", None)
    } else {
        clock::explain_dates(&reason, &format!("the {server}"), Some(unix_now()))
    };
    let detail = if reason.is_empty() {
        format!("TLS alert {name}")
    } else {
        format!("TLS alert {name}: {reason}")
    };
    Some(if ours {
        TransportError::ServerCertificateRefused {
            server,
            detail,
            dates,
        }
    } else {
        TransportError::CertificateRejected {
            server,
            detail,
            dates,
        }
    })
}
