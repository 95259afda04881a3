//! Power actions through rack BMC gateways.
//!
//! The repair queue and fencing use power only through the [`PowerControl`] trait. The real
//! implementation, [`QuicGateways`], sends [`PowerRequest`]s to the bmc-gateway that serves the
//! machine (chosen by machine address, else by the machine's rack), over mutual-TLS QUIC, one
//! bidirectional stream per request, reusing one connection per gateway; [`NoGateway`] answers
//! "not available" when none is configured.
//!
//! A request that could not be sent on a pooled connection (found dead) is tried once more on
//! a fresh connection. One that was sent and whose answer was lost (the gateway killed or
//! restarted meanwhile, noticed within [`GATEWAY_KEEP_ALIVE`] of its restart) is not resent
//! here: errors say whether the request may have reached the gateway
//! ([`PowerError::AnswerLost`]) or surely did not ([`PowerError::Unreachable`]); both are
//! retriable with the same id (the gateway executes an id at most once, so a resend can only
//! fetch the first result), and the repair queue holds on them and says so in the entry's
//! history (see [`crate::repair::command`]). This module decides nothing about which
//! action to take, and does not wait between attempts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use protocol::fencing::{FENCING_VERSION, FencingToken};
use protocol::gateway::{
    CoordinatorHello, FencedPowerRequest, PowerAction, PowerRequest, PowerResponse,
};
use protocol::messages::HelloBody;
use protocol::transport::{self, TlsMaterial, TransportError};
use protocol::{Role, frame};
use serde::Deserialize;

use crate::lease_token::LeaseToken;

pub mod config;
pub mod reach;
mod served;

/// What [`QuicGateways::probe`] learnt of a gateway that answered: the machines it has a BMC
/// for, or why that is not known (a gateway from before the question).
pub type Served = Result<Vec<String>, String>;
use tracing::{debug, error, warn};

/// Why a power request could not be carried to a gateway or answered.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// No gateway is configured for the machine.
    #[error("power control not available for {address}: {reason}")]
    NotAvailable {
        /// The machine.
        address: String,
        /// Why.
        reason: String,
    },
    /// The gateway could not be reached: nothing was sent (no answer to the handshake,
    /// connection refused, the gateway shutting down).
    #[error("gateway {gateway} unreachable: {detail}")]
    Unreachable {
        /// The gateway.
        gateway: String,
        /// What happened.
        detail: String,
    },
    /// The request was sent but no answer came back (connection lost, no answer in time):
    /// the gateway may have executed it. Resending the same id fetches its result.
    #[error("gateway {gateway}: no answer to request {id}: {detail}")]
    AnswerLost {
        /// The gateway.
        gateway: String,
        /// The request id.
        id: String,
        /// What happened.
        detail: String,
    },
    /// The gateway refused this coordinator (certificate, protocol version).
    #[error("gateway {gateway} refused the coordinator: {detail}")]
    Refused {
        /// The gateway.
        gateway: String,
        /// What it said.
        detail: String,
    },
}

impl PowerError {
    /// True when retrying later (with the same request id) may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            PowerError::Unreachable { .. } | PowerError::AnswerLost { .. }
        )
    }

    /// True when the request may have reached the gateway (and may have been executed).
    pub fn may_have_reached_gateway(&self) -> bool {
        matches!(self, PowerError::AnswerLost { .. })
    }
}

/// Sends power requests to whatever gateway serves the machine.
pub trait PowerControl: Send + Sync + 'static {
    /// Carries out `req` (the gateway executes a given id at most once) and returns what the
    /// gateway answered.
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>>;
}

/// Used when no gateway is configured: every request fails with "not available".
#[derive(Debug, Default, Clone, Copy)]
pub struct NoGateway;

impl PowerControl for NoGateway {
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>> {
        Box::pin(async move {
            Err(PowerError::NotAvailable {
                address: req.address,
                reason: "no bmc-gateway is configured".into(),
            })
        })
    }
}

/// One gateway in the coordinator's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayTarget {
    /// A name for logs (usually the rack).
    pub name: String,
    /// UDP address of the gateway's QUIC listener.
    pub address: SocketAddr,
    /// Name that must match a DNS or IP SAN of the gateway's certificate.
    pub server_name: String,
    /// Racks whose machines this gateway serves.
    #[serde(default)]
    pub racks: Vec<String>,
    /// Machines (addresses) this gateway serves, in addition to its racks.
    #[serde(default)]
    pub machines: Vec<String>,
}

/// Which of `targets` serves the machine at `address`: the gateway listing the address, else
/// the one serving its rack (`rack`, asked only then).
pub fn serving(
    targets: &[GatewayTarget],
    address: &str,
    rack: impl FnOnce() -> Option<String>,
) -> Option<usize> {
    if let Some(i) = targets
        .iter()
        .position(|t| t.machines.iter().any(|m| m == address))
    {
        return Some(i);
    }
    let rack = rack()?;
    targets.iter().position(|t| t.racks.contains(&rack))
}

/// Maps a machine address to its rack (from the inventory).
pub type RackOf = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Margin over a request's own time limit before the coordinator stops waiting: the gateway
/// answers at its limit, so this only covers transport and queueing on a busy gateway.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Keep-alive on a gateway connection. A gateway killed while it carries out a request
/// sends nothing more; the coordinator learns of it from the stateless reset the restarted
/// gateway answers its next packet with, and while it waits for an answer that packet is a
/// keep-alive. At the default 10 s a lost answer took up to 10 s after the restart to be
/// noticed; at 1 s it takes a second, for one small packet a second per gateway (a few dozen
/// connections).
pub const GATEWAY_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Silence after which a gateway connection is taken for dead. A gateway killed and not
/// restarted sends no stateless reset: only this timeout says it is gone, and a request
/// waiting on it learns that its answer is lost ([`PowerError::AnswerLost`]: the step holds
/// and resends the same id). With keep-alives every [`GATEWAY_KEEP_ALIVE`], five missed in a
/// row is no accident of a loaded link, while the transport's default (30 s) left a power step
/// silent for half a minute before the entry's history said it was holding. A long power
/// action does not count as silence: the gateway's QUIC stack answers the keep-alives while
/// its BMC call runs. QUIC takes the lower of both sides' limits, so this one applies.
pub const GATEWAY_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Limit the gateway applies to a request without one (it defaults to 30 s, 60 s for a fence);
/// mirrored here to know how long to wait.
fn gateway_default(action: PowerAction) -> Duration {
    if action == PowerAction::Fence {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(30)
    }
}

/// The coordinator's TLS material, shared with what reloads it on SIGHUP
/// ([`crate::certs::TlsReloader`]): connections opened after a reload present the new
/// certificate.
pub type SharedTls = Arc<std::sync::RwLock<TlsMaterial>>;

/// The real [`PowerControl`]: mutual-TLS QUIC to the configured gateways.
pub struct QuicGateways {
    tls: SharedTls,
    coordinator: String,
    targets: Vec<GatewayTarget>,
    rack_of: RackOf,
    /// The fencing token every request is sent with, read at send time.
    lease: LeaseToken,
    /// target → (endpoint, connection, the protocol version spoken on it).
    conns: std::sync::Mutex<HashMap<usize, (quinn::Endpoint, quinn::Connection, u16)>>,
    /// The client endpoint of each address family (IPv4, IPv6), made at the first connection
    /// and shared by every gateway connection after it. Not one per connection: each
    /// endpoint has a receive buffer of about 2.9 MiB (quinn), and once one is freed glibc
    /// serves the next from the heap, zeroed whole and resident, so every gateway reconnected
    /// once would hold its own 2.9 MiB for good.
    endpoints: std::sync::Mutex<[Option<quinn::Endpoint>; 2]>,
    /// One lock per target, held while connecting to it: requests to one gateway make one
    /// connection, and a gateway whose handshake runs to its limit (its host gone, nothing
    /// answering) delays no other gateway's requests.
    connecting: Vec<tokio::sync::Mutex<()>>,
    /// The last look at each gateway ([`QuicGateways::watch_reach`]).
    reach: reach::Reach,
}

impl std::fmt::Debug for QuicGateways {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicGateways")
            .field("coordinator", &self.coordinator)
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

impl QuicGateways {
    /// A client presenting `tls` (a coordinator certificate) as `coordinator`, sending each
    /// request with the token `lease` holds at that moment (none: nothing is sent).
    pub fn new(
        tls: SharedTls,
        coordinator: impl Into<String>,
        targets: Vec<GatewayTarget>,
        rack_of: RackOf,
        lease: LeaseToken,
    ) -> Self {
        let connecting = targets
            .iter()
            .map(|_| tokio::sync::Mutex::new(()))
            .collect();
        Self {
            tls,
            coordinator: coordinator.into(),
            targets,
            rack_of,
            lease,
            conns: std::sync::Mutex::new(HashMap::new()),
            endpoints: std::sync::Mutex::new([None, None]),
            connecting,
            reach: reach::Reach::default(),
        }
    }

    /// The gateway serving `address`: one listing the machine, else one serving its rack.
    pub fn route(&self, address: &str) -> Option<&GatewayTarget> {
        self.route_index(address).map(|i| &self.targets[i])
    }

    fn route_index(&self, address: &str) -> Option<usize> {
        serving(&self.targets, address, || (self.rack_of)(address))
    }

    #[allow(clippy::type_complexity)]
    fn conns(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<usize, (quinn::Endpoint, quinn::Connection, u16)>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection to target `i` and its protocol version, if any.
    fn open(&self, i: usize) -> Option<(quinn::Connection, u16)> {
        self.conns()
            .get(&i)
            .filter(|(_, c, _)| c.close_reason().is_none())
            .map(|(_, c, v)| (c.clone(), *v))
    }

    async fn connection(
        &self,
        i: usize,
        fresh: bool,
    ) -> Result<(quinn::Connection, u16), PowerError> {
        let t = &self.targets[i];
        if !fresh && let Some(c) = self.open(i) {
            return Ok(c);
        }
        // Only this target's lock is held across the handshake (see `connecting`).
        let _one = self.connecting[i].lock().await;
        if !fresh && let Some(c) = self.open(i) {
            return Ok(c);
        }
        self.conns().remove(&i);
        let tls = self.tls.read().unwrap_or_else(|p| p.into_inner()).clone();
        let endpoint = self
            .endpoint(&tls, t.address)
            .map_err(|e| unreachable(t, &e))?;
        let hello = HelloBody::Coordinator(CoordinatorHello {
            coordinator: self.coordinator.clone(),
        });
        let session =
            match transport::connect(&endpoint, t.address, &t.server_name, Role::Gateway, hello)
                .await
            {
                Ok(s) => s,
                // A gateway shutting down refuses retriably: it will be back.
                Err(e) if e.is_retriable() => return Err(unreachable(t, &e)),
                Err(TransportError::Refused(r)) => {
                    return Err(PowerError::Refused {
                        gateway: t.name.clone(),
                        detail: r.to_string(),
                    });
                }
                Err(e @ TransportError::UnexpectedPeer { .. }) => {
                    return Err(PowerError::Refused {
                        gateway: t.name.clone(),
                        detail: e.to_string(),
                    });
                }
                Err(e) => {
                    return Err(PowerError::Refused {
                        gateway: t.name.clone(),
                        detail: e.to_string(),
                    });
                }
            };
        debug!(gateway = %t.name, addr = %t.address, version = session.version, "connected to gateway");
        if session.version < FENCING_VERSION {
            warn!(gateway = %t.name, addr = %t.address, "the gateway is of a release from before fencing tokens: it cannot refuse a coordinator that lost the lead; upgrade it");
        }
        self.conns()
            .insert(i, (endpoint, session.conn.clone(), session.version));
        Ok((session.conn, session.version))
    }

    /// The shared client endpoint for `peer`'s family (see `endpoints`), presenting `tls`:
    /// the client configuration is the handle's own, set on this clone, so a connection
    /// opened after a certificate reload presents the new certificate.
    fn endpoint(
        &self,
        tls: &TlsMaterial,
        peer: SocketAddr,
    ) -> Result<quinn::Endpoint, TransportError> {
        let family = usize::from(peer.is_ipv6());
        let mut kept = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let mut endpoint = match &kept[family] {
            Some(e) => e.clone(),
            None => {
                let e = tls.client_endpoint(peer)?;
                kept[family] = Some(e.clone());
                e
            }
        };
        endpoint.set_default_client_config(
            tls.quinn_client_config_keep_alive(GATEWAY_KEEP_ALIVE, GATEWAY_IDLE_TIMEOUT)?,
        );
        Ok(endpoint)
    }

    /// Connects to every configured gateway at once, as a power request would (QUIC, both
    /// certificates, the hello), within `limit` each, and sends no power request: no BMC is
    /// touched. For `coordinator check`: whether each gateway answers at its address, is
    /// the gateway its `server_name` says, and accepts this coordinator's certificate; and
    /// for each that does, the machines it has a BMC for (or why that is not known).
    pub async fn probe(
        &self,
        limit: Duration,
    ) -> Vec<(&GatewayTarget, Result<Served, PowerError>)> {
        let each = (0..self.targets.len()).map(|i| async move {
            let t = &self.targets[i];
            let r = match tokio::time::timeout(limit, self.connection(i, true)).await {
                Ok(Ok((conn, _))) => {
                    let served = served::ask(&conn, limit).await;
                    conn.close(0u32.into(), b"check");
                    Ok(served)
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(unreachable(
                    t,
                    &format!("no answer within {} s", limit.as_secs_f64()),
                )),
            };
            (t, r)
        });
        let out = futures::future::join_all(each).await;
        // The closes reach the gateways before the caller's runtime ends, so they log a
        // closed connection, not a lost one.
        let endpoints: Vec<quinn::Endpoint> =
            self.conns().drain().map(|(_, (e, _, _))| e).collect();
        let idle = futures::future::join_all(endpoints.iter().map(|e| e.wait_idle()));
        let _ = tokio::time::timeout(Duration::from_secs(1), idle).await;
        out
    }

    /// Sends `req` (with `token` on a connection of [`FENCING_VERSION`] or later) and reads
    /// the answer. On error, says whether anything was sent: `false` only when no stream
    /// could be opened.
    async fn exchange(
        (conn, version): &(quinn::Connection, u16),
        req: &PowerRequest,
        token: &FencingToken,
        wait: Duration,
    ) -> Result<PowerResponse, (TransportError, bool)> {
        let sent = std::sync::atomic::AtomicBool::new(false);
        let work = async {
            let (mut send, mut recv) = conn.open_bi().await?;
            sent.store(true, std::sync::atomic::Ordering::SeqCst);
            if *version >= FENCING_VERSION {
                let fenced = FencedPowerRequest {
                    request: req.clone(),
                    token: token.clone(),
                };
                transport::write_msg(&mut send, &fenced, frame::MAX_FRAME_LEN).await?;
            } else {
                transport::write_msg(&mut send, req, frame::MAX_FRAME_LEN).await?;
            }
            let _ = send.finish();
            transport::expect_msg::<PowerResponse>(&mut recv, frame::MAX_FRAME_LEN).await
        };
        let r = match tokio::time::timeout(wait, work).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout(wait)),
        };
        r.map_err(|e| (e, sent.load(std::sync::atomic::Ordering::SeqCst)))
    }
}

fn answer_lost(t: &GatewayTarget, req: &PowerRequest, e: &dyn std::fmt::Display) -> PowerError {
    PowerError::AnswerLost {
        gateway: t.name.clone(),
        id: req.id.clone(),
        detail: format!("{} ({}): {e}", t.address, t.server_name),
    }
}

fn unreachable(t: &GatewayTarget, e: &dyn std::fmt::Display) -> PowerError {
    PowerError::Unreachable {
        gateway: t.name.clone(),
        detail: format!("{} ({}): {e}", t.address, t.server_name),
    }
}

impl PowerControl for QuicGateways {
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>> {
        Box::pin(async move {
            let Some(i) = self.route_index(&req.address) else {
                return Err(PowerError::NotAvailable {
                    address: req.address.clone(),
                    reason: "no configured gateway serves this machine or its rack".into(),
                });
            };
            let t = &self.targets[i];
            let Some(token) = self.lease.current() else {
                return Err(PowerError::NotAvailable {
                    address: req.address.clone(),
                    reason: "this coordinator holds no fencing token (it does not lead): nothing is sent".into(),
                });
            };
            let limit = if req.timeout_ms > 0 {
                Duration::from_millis(req.timeout_ms)
            } else {
                gateway_default(req.action)
            };
            let wait = limit + ANSWER_MARGIN;
            let mut last = None;
            for fresh in [false, true] {
                let conn = self.connection(i, fresh).await?;
                match Self::exchange(&conn, &req, &token, wait).await {
                    Ok(resp) => {
                        if resp.outcome.is_refused_epoch() {
                            error!(gateway = %t.name, id = %req.id, machine = %req.address, epoch = token.epoch, store = %token.store, "the gateway refused this coordinator's request: a coordinator of a newer epoch of this store has spoken to it, so this one no longer leads; nothing was done");
                        }
                        return Ok(resp);
                    }
                    Err((e @ TransportError::Timeout(_), _)) => {
                        // The gateway holds the request; resending at once would only wait again.
                        return Err(answer_lost(t, &req, &e));
                    }
                    Err((e, true)) => {
                        // Sent, maybe executed: the caller resends (the same id) and says so,
                        // rather than this client hiding the lost answer behind a resend.
                        warn!(gateway = %t.name, id = %req.id, error = %e, fresh, "power request sent but its answer was lost");
                        return Err(answer_lost(t, &req, &e));
                    }
                    Err((e, false)) => {
                        // A pooled connection found dead before anything went out: one more
                        // try on a fresh one.
                        warn!(gateway = %t.name, id = %req.id, error = %e, fresh, "power request could not be sent on the connection");
                        last = Some(e);
                    }
                }
            }
            Err(match last {
                Some(e) => unreachable(t, &e),
                None => unreachable(t, &"no attempt"),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::gateway::{PowerOutcome, PowerState};
    use protocol::messages::{Refusal, RefusalCode};
    use protocol::pki::{Ca, IssueOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
        ca.issue(role, name, &IssueOptions::loopback())
            .unwrap()
            .tls_material(ca.cert_pem().as_bytes())
            .unwrap()
    }

    /// A fake gateway: accepts coordinators, answers each request with Done, counts them.
    async fn fake_gateway(ca: &Ca, served: Arc<AtomicUsize>) -> SocketAddr {
        let tls = material(ca, Role::Gateway, "rack-a");
        let ep = tls.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = ep.local_addr().unwrap();
        let td = ca.trust_domain().to_string();
        tokio::spawn(async move {
            while let Some(inc) = ep.accept().await {
                let td = td.clone();
                let served = served.clone();
                tokio::spawn(async move {
                    let Ok(p) = transport::accept_hello(inc, &td).await else {
                        return;
                    };
                    if p.peer.role != Role::Coordinator {
                        p.refuse(Refusal::new(
                            RefusalCode::NotAuthorized,
                            "coordinators only",
                        ))
                        .await;
                        return;
                    }
                    let s = p.accept("rack-a").await.unwrap();
                    while let Ok((mut send, mut recv)) = s.conn.accept_bi().await {
                        let fenced: FencedPowerRequest =
                            transport::expect_msg(&mut recv, 65536).await.unwrap();
                        assert_eq!(fenced.token, test_lease().current().unwrap());
                        let req = fenced.request;
                        served.fetch_add(1, Ordering::SeqCst);
                        let resp = PowerResponse {
                            id: req.id.clone(),
                            outcome: PowerOutcome::Done {
                                state: PowerState::On,
                                confirmed_off_unix_ms: None,
                                detail: format!("{} {:?}", req.address, req.action),
                            },
                        };
                        transport::write_msg(&mut send, &resp, 65536).await.unwrap();
                        let _ = send.finish();
                    }
                });
            }
        });
        addr
    }

    /// A gateway that reads each request, records its id, and drops the connection without
    /// answering (as a gateway killed mid-request would).
    async fn silent_gateway(
        ca: &Ca,
        ids: Arc<std::sync::Mutex<Vec<String>>>,
        froms: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    ) -> SocketAddr {
        let tls = material(ca, Role::Gateway, "rack-a");
        let ep = tls.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = ep.local_addr().unwrap();
        let td = ca.trust_domain().to_string();
        tokio::spawn(async move {
            while let Some(inc) = ep.accept().await {
                let td = td.clone();
                let ids = ids.clone();
                let froms = froms.clone();
                tokio::spawn(async move {
                    let Ok(p) = transport::accept_hello(inc, &td).await else {
                        return;
                    };
                    froms.lock().unwrap().push(p.conn.remote_address());
                    let s = p.accept("rack-a").await.unwrap();
                    if let Ok((_send, mut recv)) = s.conn.accept_bi().await {
                        let req: FencedPowerRequest =
                            transport::expect_msg(&mut recv, 65536).await.unwrap();
                        ids.lock().unwrap().push(req.request.id);
                        s.conn.close(0u32.into(), b"gone");
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_lost_answer_is_retriable_and_says_the_request_may_have_arrived() {
        let ca = Ca::generate("fleet.test").unwrap();
        let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
        let froms = Arc::new(std::sync::Mutex::new(Vec::new()));
        let addr = silent_gateway(&ca, ids.clone(), froms.clone()).await;
        let g = QuicGateways::new(
            Arc::new(std::sync::RwLock::new(material(
                &ca,
                Role::Coordinator,
                "c1",
            ))),
            "c1",
            vec![target(addr)],
            racks(),
            test_lease(),
        );
        let e = tokio::time::timeout(Duration::from_secs(30), g.power(req("lost", "10.0.0.1")))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, PowerError::AnswerLost { .. }), "{e}");
        assert!(e.is_retriable() && e.may_have_reached_gateway(), "{e}");
        // Not resent behind the caller's back: the caller resends and says so.
        assert_eq!(*ids.lock().unwrap(), ["lost"]);
        // The caller's resend, with the same id, goes out on a fresh connection from the
        // same endpoint: one per connection held a receive buffer of its own.
        let again = tokio::time::timeout(Duration::from_secs(30), g.power(req("lost", "10.0.0.1")))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(again, PowerError::AnswerLost { .. }), "{again}");
        assert_eq!(*ids.lock().unwrap(), ["lost", "lost"]);
        let froms = froms.lock().unwrap().clone();
        assert_eq!(froms.len(), 2);
        assert_eq!(
            froms[0], froms[1],
            "the fresh connection came from a new endpoint"
        );
    }

    fn req(id: &str, address: &str) -> PowerRequest {
        PowerRequest {
            id: id.into(),
            address: address.into(),
            serial: String::new(),
            action: PowerAction::Status,
            timeout_ms: 2000,
        }
    }

    fn test_lease() -> LeaseToken {
        LeaseToken::fixed(FencingToken {
            store: "s".into(),
            epoch: 1,
        })
    }

    fn target(addr: SocketAddr) -> GatewayTarget {
        GatewayTarget {
            name: "rack-a".into(),
            address: addr,
            server_name: "127.0.0.1".into(),
            racks: vec!["a".into()],
            machines: vec!["10.9.9.9".into()],
        }
    }

    fn racks() -> RackOf {
        Arc::new(|addr: &str| addr.starts_with("10.0.").then(|| "a".to_string()))
    }

    #[tokio::test]
    async fn sends_requests_to_the_gateway_of_the_machine_or_its_rack() {
        let ca = Ca::generate("fleet.test").unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let addr = fake_gateway(&ca, served.clone()).await;
        let g = QuicGateways::new(
            Arc::new(std::sync::RwLock::new(material(
                &ca,
                Role::Coordinator,
                "c1",
            ))),
            "c1",
            vec![target(addr)],
            racks(),
            test_lease(),
        );
        for (i, m) in ["10.0.0.1", "10.9.9.9", "10.0.0.2"].iter().enumerate() {
            let r = tokio::time::timeout(Duration::from_secs(10), g.power(req(&i.to_string(), m)))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(r.id, i.to_string());
            assert!(
                matches!(&r.outcome, PowerOutcome::Done { detail, .. } if detail.starts_with(m))
            );
        }
        assert_eq!(served.load(Ordering::SeqCst), 3);
        // One connection reused.
        assert_eq!(g.conns().len(), 1);
        let e = g.power(req("x", "192.168.1.1")).await.unwrap_err();
        assert!(matches!(e, PowerError::NotAvailable { .. }), "{e}");
        assert!(!e.is_retriable());
    }

    /// A rack whose gateway host is gone (its switch dead: no answer, not even "port
    /// unreachable") must not hold up power requests to other racks' gateways while the
    /// handshake to it runs to its limit (10 s): they used to wait behind it.
    #[tokio::test]
    async fn a_gateway_that_never_answers_does_not_delay_requests_to_another() {
        let ca = Ca::generate("fleet.test").unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let good = fake_gateway(&ca, served.clone()).await;
        // Bound and never read: datagrams vanish, as with a host that is gone.
        let hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let gateway = |name: &str, address, racks: &[&str], machines: &[&str]| GatewayTarget {
            name: name.into(),
            address,
            server_name: "127.0.0.1".into(),
            racks: racks.iter().map(|r| r.to_string()).collect(),
            machines: machines.iter().map(|m| m.to_string()).collect(),
        };
        let g = Arc::new(QuicGateways::new(
            Arc::new(std::sync::RwLock::new(material(
                &ca,
                Role::Coordinator,
                "c1",
            ))),
            "c1",
            vec![
                gateway("rack-a", hole.local_addr().unwrap(), &["a"], &[]),
                gateway("rack-b", good, &[], &["10.9.9.9"]),
            ],
            racks(),
            test_lease(),
        ));
        let stuck = {
            let g = g.clone();
            tokio::spawn(async move { g.power(req("a", "10.0.0.1")).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = tokio::time::timeout(Duration::from_secs(5), g.power(req("b", "10.9.9.9")))
            .await
            .expect("waited behind the handshake to the silent gateway")
            .unwrap();
        assert_eq!(r.id, "b");
        assert!(
            !stuck.is_finished(),
            "the silent gateway's request ended early"
        );
        stuck.abort();
    }

    #[tokio::test]
    async fn refusal_and_unreachable_gateways_are_errors_not_hangs() {
        let ca = Ca::generate("fleet.test").unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let addr = fake_gateway(&ca, served.clone()).await;
        // An admin certificate is refused by the gateway.
        let g = QuicGateways::new(
            Arc::new(std::sync::RwLock::new(material(&ca, Role::Admin, "alice"))),
            "alice",
            vec![target(addr)],
            racks(),
            test_lease(),
        );
        let e = tokio::time::timeout(Duration::from_secs(10), g.power(req("a", "10.0.0.1")))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, PowerError::Refused { .. }), "{e}");
        assert_eq!(served.load(Ordering::SeqCst), 0);

        // Nothing listening: unreachable (retriable) within the hello timeout.
        let dead = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let g = QuicGateways::new(
            Arc::new(std::sync::RwLock::new(material(
                &ca,
                Role::Coordinator,
                "c1",
            ))),
            "c1",
            vec![target(dead)],
            racks(),
            test_lease(),
        );
        let e = tokio::time::timeout(Duration::from_secs(30), g.power(req("b", "10.0.0.1")))
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.is_retriable(), "{e}");
        assert!(!e.may_have_reached_gateway(), "{e}");
    }
}
