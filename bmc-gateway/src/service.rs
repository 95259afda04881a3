//! The gateway's network faces: the QUIC service the coordinator commands (mutual TLS, hello,
//! then one bidirectional stream per [`PowerRequest`] answered with a [`PowerResponse`], or
//! per [`ServedQuery`] answered with the machines served), and plain HTTP for `/metrics` and
//! `/healthz`.
//!
//! Only peers whose certificate names a coordinator and whose hello is a coordinator hello may
//! send actions; everyone else is refused with `NotAuthorized` and logged. This module runs
//! nothing against BMCs itself (see [`crate::gateway`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use protocol::gateway::{
    FencedPowerRequest, PowerRequest, PowerResponse, ServedMachines, ServedQuery,
};
use protocol::messages::{HelloBody, Refusal, RefusalCode};
use protocol::transport::{self, HelloError};
use protocol::{Identity, Role, frame};
use quinn::Endpoint;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::gateway::Gateway;

/// Largest request frame accepted. A [`PowerRequest`] is well under 1 KiB; 64 KiB leaves room
/// for long ids and addresses while refusing garbage early.
pub const MAX_REQUEST: usize = 64 * 1024;

/// The gateway's one authorisation rule: only a peer whose certificate names a coordinator and
/// who says a coordinator hello may command it. `Err` carries the reason sent to the peer.
pub fn may_command(peer: &Identity, hello: &HelloBody) -> Result<(), String> {
    if peer.role == Role::Coordinator && matches!(hello, HelloBody::Coordinator(_)) {
        Ok(())
    } else {
        Err(format!(
            "{peer} may not command this gateway: only coordinator certificates with a coordinator hello may"
        ))
    }
}

/// Longest the gateway waits on SIGTERM for power requests in flight to be answered before it
/// closes the connections.
///
/// 10 s: a status, an on or an off is answered in well under that, and with the 3 s for the
/// answers to leave and 5 s to close BMC sessions it stays under the unit's
/// `TimeoutStopSec=20s`. A fence still polling past it is cut off: its id answers "outcome
/// unknown" after the restart and the coordinator sends the fence again under a new id.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Accepts connections on `endpoint` until `stop` is cancelled, then lets the power requests
/// in flight be answered (within [`DRAIN_GRACE`]) before it closes the endpoint.
pub async fn serve_quic(
    endpoint: Endpoint,
    gateway: Arc<Gateway>,
    trust_domain: String,
    server_name: String,
    stop: CancellationToken,
) {
    // Each request task holds a clone; once all are dropped, `recv` says so.
    let (in_flight, mut drained) = mpsc::channel::<()>(1);
    loop {
        let incoming = tokio::select! {
            biased;
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
        let held = in_flight.clone();
        tokio::spawn(
            async move { connection(incoming, gw, &td, &name, stop, held).await }
                .instrument(info_span!("conn", %remote)),
        );
    }
    // Connections stop taking new requests (see `connection`); the ones already taken are
    // answered first. Closing at once lost their answers: a power action the BMC carried out
    // came back to the coordinator as a lost connection.
    let running = in_flight.strong_count() - 1;
    drop(in_flight);
    if running > 0 {
        info!(
            running,
            grace_s = DRAIN_GRACE.as_secs(),
            "stopping: answering the power requests in flight first"
        );
    }
    if tokio::time::timeout(DRAIN_GRACE, drained.recv())
        .await
        .is_err()
    {
        warn!(
            grace_s = DRAIN_GRACE.as_secs(),
            "power requests still running at the end of the stop grace; their ids answer \"outcome unknown\" after a restart"
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
    in_flight: mpsc::Sender<()>,
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
    if let Err(reason) = may_command(&peer, &pending.hello) {
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
    let version = session.version;
    if version < protocol::fencing::FENCING_VERSION {
        warn!(%peer, version, "coordinator of a release from before fencing tokens connected: its requests carry no epoch, so this gateway cannot refuse them if it lost the lead; upgrade it");
    }
    info!(%peer, version, "coordinator connected");
    let conn = session.conn.clone();
    loop {
        let (mut send, mut recv) = tokio::select! {
            biased;
            // No new requests; the endpoint closes this connection once those taken are
            // answered (`serve_quic`).
            _ = stop.cancelled() => break,
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
        let held = in_flight.clone();
        tokio::spawn(async move {
            let _held = held;
            let payload = match transport::read_payload(&mut recv, MAX_REQUEST).await {
                Ok(Some(p)) => p,
                Ok(None) => return,
                Err(e) => {
                    warn!(%peer, error = %e, "unreadable power request");
                    let _ = send.reset(1u32.into());
                    return;
                }
            };
            if ServedQuery::is_query(&payload) {
                // `coordinator check` asking which machines this gateway has a BMC for.
                let answer = ServedMachines {
                    machines: gw.machines(),
                };
                debug!(%peer, machines = answer.machines.len(), "told which machines are served");
                if transport::write_msg(&mut send, &answer, frame::MAX_FRAME_LEN)
                    .await
                    .is_ok()
                {
                    let _ = send.finish();
                    let _ = send.stopped().await;
                }
                return;
            }
            let read = if version >= protocol::fencing::FENCING_VERSION {
                frame::decode_payload::<FencedPowerRequest>(&payload)
                    .map(|f| (f.request, Some(f.token)))
            } else {
                frame::decode_payload::<PowerRequest>(&payload).map(|r| (r, None))
            };
            let (req, token) = match read {
                Ok(r) => r,
                Err(e) => {
                    warn!(%peer, error = %e, "unreadable power request");
                    let _ = send.reset(1u32.into());
                    return;
                }
            };
            let epoch = token.as_ref().map(|t| t.epoch);
            let span = info_span!("request", id = %req.id, machine = %req.address, coordinator = %peer.name, epoch);
            let resp: PowerResponse = gw.handle_fenced(req, token).instrument(span).await;
            if let Err(e) = transport::write_msg(&mut send, &resp, frame::MAX_FRAME_LEN).await {
                warn!(%peer, error = %e, "could not send the power response");
                return;
            }
            let _ = send.finish();
            let _ = send.stopped().await;
        });
    }
    // Stopping: this connection is closed with the others, "gateway stopping", once the
    // requests in flight are answered; dropped here it would close at once without a reason.
    drop(in_flight);
    if stop.is_cancelled() {
        conn.closed().await;
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

/// Serves HTTP on `addr` until `stop` is cancelled; a connection that sends no complete request
/// header within [`protocol::http::HEADER_READ_TIMEOUT`] is closed.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    debug!(?addr, "HTTP listening");
    protocol::http::serve_router(
        listener,
        http_router(gateway),
        protocol::http::HEADER_READ_TIMEOUT,
        async move { stop.cancelled().await },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use protocol::gateway::{CoordinatorHello, PowerAction, PowerOutcome, PowerState};
    use protocol::messages::{AdminHello, AgentHello};
    use protocol::pki::{Ca, IssueOptions};
    use protocol::transport::{TlsMaterial, TransportError};

    use crate::gateway::{Bmc, Defaults};
    use crate::metrics::Metrics;
    use crate::power::fake::FakePower;

    fn coordinator_hello() -> HelloBody {
        HelloBody::Coordinator(CoordinatorHello {
            coordinator: "c1".into(),
        })
    }

    #[test]
    fn only_a_coordinator_certificate_with_a_coordinator_hello_may_command() {
        let id = |role, name| Identity::new("fleet.test", role, name).unwrap();
        assert!(may_command(&id(Role::Coordinator, "c1"), &coordinator_hello()).is_ok());
        for (role, name) in [
            (Role::Node, "n1"),
            (Role::Admin, "alice"),
            (Role::Gateway, "rack-2"),
        ] {
            let e = may_command(&id(role, name), &coordinator_hello()).unwrap_err();
            assert!(e.contains("may not command"), "{e}");
            assert!(e.contains(name), "{e}");
        }
        let admin_hello = HelloBody::Admin(AdminHello {
            client: "coordinatorctl".into(),
        });
        assert!(may_command(&id(Role::Coordinator, "c1"), &admin_hello).is_err());
        let agent_hello = HelloBody::Agent(AgentHello {
            hostname: "n1".into(),
            serial: String::new(),
            addresses: vec![],
            agent_version: "0".into(),
            boot_id: "b".into(),
        });
        assert!(may_command(&id(Role::Coordinator, "c1"), &agent_hello).is_err());
    }

    fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
        ca.issue(role, name, &IssueOptions::loopback())
            .unwrap()
            .tls_material(ca.cert_pem().as_bytes())
            .unwrap()
    }

    /// Over real QUIC on loopback with certificates of each role: node, admin and gateway
    /// certificates are refused before any request is read; a coordinator's is served.
    #[tokio::test]
    async fn node_admin_and_gateway_certificates_are_refused_over_quic() {
        let ca = Ca::generate("fleet.test").unwrap();
        let power = Arc::new(FakePower::new(PowerState::On));
        let gw = Gateway::new(
            vec![Bmc {
                machine: "m1".into(),
                serial: String::new(),
                protocol: "ipmi",
                power: power.clone(),
            }],
            Defaults {
                action_timeout: Duration::from_secs(5),
                fence_timeout: Duration::from_secs(5),
                busy_retry: Duration::ZERO,
                poll: Duration::from_millis(5),
                probe: None,
            },
            Arc::new(Metrics::new()),
        );
        let me = material(&ca, Role::Gateway, "rack-1");
        let ep = me.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = ep.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_quic(
            ep,
            gw.clone(),
            "fleet.test".into(),
            "spiffe://fleet.test/gateway/rack-1".into(),
            stop.clone(),
        ));
        let connect = |role, name: &'static str| {
            let tls = material(&ca, role, name);
            async move {
                let ep = tls.client_endpoint(addr).unwrap();
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    transport::connect(&ep, addr, "127.0.0.1", Role::Gateway, coordinator_hello()),
                )
                .await
                .expect("no answer to the hello");
                (ep, r)
            }
        };
        for (role, name) in [
            (Role::Node, "n1"),
            (Role::Admin, "alice"),
            (Role::Gateway, "rack-2"),
        ] {
            let (_ep, r) = connect(role, name).await;
            match r {
                Err(TransportError::Refused(refusal)) => {
                    assert_eq!(
                        refusal.code,
                        RefusalCode::NotAuthorized,
                        "{name}: {refusal:?}"
                    )
                }
                Err(e) => panic!("{name}: expected a refusal, got {e}"),
                Ok(_) => panic!("{name}: a {role:?} certificate was accepted"),
            }
        }
        let (_ep, r) = connect(Role::Coordinator, "c1").await;
        let session = r.expect("a coordinator is accepted");
        let (mut send, mut recv) = session.conn.open_bi().await.unwrap();
        let req = PowerRequest {
            id: "q1".into(),
            address: "m1".into(),
            serial: String::new(),
            action: PowerAction::Status,
            timeout_ms: 0,
        };
        // A protocol version 2 session: the request travels with its fencing token.
        let req = protocol::gateway::FencedPowerRequest {
            request: req,
            token: protocol::fencing::FencingToken {
                store: "0123456789abcdef0123456789abcdef".into(),
                epoch: 1,
            },
        };
        transport::write_msg(&mut send, &req, frame::MAX_FRAME_LEN)
            .await
            .unwrap();
        let _ = send.finish();
        let resp: PowerResponse = tokio::time::timeout(
            Duration::from_secs(20),
            transport::expect_msg(&mut recv, frame::MAX_FRAME_LEN),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            matches!(resp.outcome, PowerOutcome::Done { .. }),
            "{resp:?}"
        );
        assert_eq!(
            power.calls(),
            ["status"],
            "only the coordinator's request ran"
        );
        assert!(gw.metrics().render().contains("not-a-coordinator"));
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    }
}
