//! The gateway's network faces: the QUIC service the coordinator commands (mutual TLS, hello,
//! then one bidirectional stream per [`PowerRequest`] answered with a [`PowerResponse`]), and
//! plain HTTP for `/metrics` and `/healthz`.
//!
//! Only peers whose certificate names a coordinator and whose hello is a coordinator hello may
//! send actions; everyone else is refused with `NotAuthorized` and logged. This module runs
//! nothing against BMCs itself (see [`crate::gateway`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use protocol::gateway::{PowerRequest, PowerResponse};
use protocol::messages::{HelloBody, Refusal, RefusalCode};
use protocol::transport::{self, HelloError};
use protocol::{Role, frame};
use quinn::Endpoint;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::gateway::Gateway;

/// Largest request frame accepted. A [`PowerRequest`] is well under 1 KiB; 64 KiB leaves room
/// for long ids and addresses while refusing garbage early.
pub const MAX_REQUEST: usize = 64 * 1024;

/// Accepts connections on `endpoint` until `stop` is cancelled.
pub async fn serve_quic(
    endpoint: Endpoint,
    gateway: Arc<Gateway>,
    trust_domain: String,
    server_name: String,
    stop: CancellationToken,
) {
    loop {
        let incoming = tokio::select! {
            _ = stop.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let gw = gateway.clone();
        let td = trust_domain.clone();
        let name = server_name.clone();
        let stop = stop.clone();
        let remote = incoming.remote_address();
        tokio::spawn(
            async move { connection(incoming, gw, &td, &name, stop).await }
                .instrument(info_span!("conn", %remote)),
        );
    }
    endpoint.close(0u32.into(), b"gateway stopping");
}

async fn connection(
    incoming: quinn::Incoming,
    gw: Arc<Gateway>,
    trust_domain: &str,
    server_name: &str,
    stop: CancellationToken,
) {
    let pending = match transport::accept_hello(incoming, trust_domain).await {
        Ok(p) => p,
        Err(HelloError::Refused { peer, refusal }) => {
            warn!(%peer, reason = %refusal.reason, "connection refused");
            gw.metrics().refused("hello");
            return;
        }
        Err(HelloError::Transport(e)) => {
            debug!(error = %e, "connection failed before hello");
            return;
        }
    };
    let peer = pending.peer.clone();
    let is_coordinator =
        peer.role == Role::Coordinator && matches!(pending.hello, HelloBody::Coordinator(_));
    if !is_coordinator {
        let reason = format!(
            "{peer} may not command this gateway: only coordinator certificates with a coordinator hello may"
        );
        warn!(%peer, "refused a non-coordinator peer: {reason}");
        gw.metrics().refused("not-a-coordinator");
        pending
            .refuse(Refusal::new(RefusalCode::NotAuthorized, reason))
            .await;
        return;
    }
    let session = match pending.accept(server_name).await {
        Ok(s) => s,
        Err(e) => {
            debug!(%peer, error = %e, "accept failed");
            return;
        }
    };
    info!(%peer, "coordinator connected");
    let conn = session.conn.clone();
    loop {
        let (mut send, mut recv) = tokio::select! {
            _ = stop.cancelled() => {
                conn.close(0u32.into(), b"gateway stopping");
                break;
            }
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => {
                    debug!(%peer, error = %e, "coordinator connection ended");
                    break;
                }
            },
        };
        let gw = gw.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            let req: PowerRequest = match transport::read_msg(&mut recv, MAX_REQUEST).await {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    warn!(%peer, error = %e, "unreadable power request");
                    let _ = send.reset(1u32.into());
                    return;
                }
            };
            let span = info_span!("request", id = %req.id, machine = %req.address, coordinator = %peer.name);
            let resp: PowerResponse = gw.handle(req).instrument(span).await;
            if let Err(e) = transport::write_msg(&mut send, &resp, frame::MAX_FRAME_LEN).await {
                warn!(%peer, error = %e, "could not send the power response");
                return;
            }
            let _ = send.finish();
            let _ = send.stopped().await;
        });
    }
}

/// The HTTP router: `/metrics` and `/healthz`.
pub fn http_router(gateway: Arc<Gateway>) -> Router {
    let m = gateway.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        m.metrics().render(),
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/healthz",
            get(move || async move { (StatusCode::OK, "ok\n").into_response() }),
        )
}

/// Serves HTTP on `addr` until `stop` is cancelled.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    debug!(?addr, "HTTP listening");
    axum::serve(listener, http_router(gateway))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}
