//! The coordinator's QUIC server: agents report here and coordinatorctl calls the admin API.
//!
//! One accept loop; every connection is its own task with its own tracing span. After the
//! hello (read and version-checked by `protocol::transport::accept_hello`), the certificate
//! decides what the peer may do:
//! - a `node` certificate may open an agent session, only for the hostname it names;
//! - an `admin` certificate may open an admin session;
//! - anything else is refused with `not-authorized`.
//!
//! Every refusal is answered with a reason, logged at warn with structured fields and
//! counted in metrics; a misbehaving peer only ever loses its own connection.
//!
//! An agent's connection is registered in [`crate::agent_link::AgentLinks`] while its
//! session lasts, so the repair queue can open action streams on it; the coordinator
//! accepts no stream an agent opens besides the first.
//!
//! One machine, one session: a newer connection with the machine's certificate replaces
//! the open one, which is closed with a reason naming the newcomer, logged with both peers'
//! addresses and counted (`fleetmend_agent_sessions_replaced_total`). Once is an agent back
//! before its old connection timed out (a crash, a network break); again and again is two
//! agents sharing one certificate (a cloned image, a copied certificate), which then take
//! the session from each other. A goodbye read on a session that was replaced meanwhile
//! changes nothing: the machine's current agent did not say it.
//!
//! This module moves frames and enforces who may say what; what a report means is
//! [`crate::fleet`]'s business, what an admin request does is [`crate::admin`]'s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use protocol::Role;
use protocol::frame::{self, FrameError, MAX_ADMIN_FRAME_LEN, MAX_FRAME_LEN};
use protocol::messages::{
    AgentHello, AgentMessage, CoordinatorReply, HelloBody, KdumpNotice, Refusal, RefusalCode,
};
use protocol::transport::{
    HelloError, PendingHello, Session, TransportError, accept_hello, read_payload, write_msg,
};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::admin::Admin;
use crate::fleet::{Fleet, FleetError};
use crate::metrics::{HANDSHAKE_FAILED, Metrics, SessionKind, refusal_label};

/// How long a refused peer gets to read its refusal before the connection is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);

/// QUIC application close code for a normal close.
const CLOSE_OK: u32 = 0;
/// The close of every session of a coordinator whose term ended: the same code as a clean
/// close, so clients reconnect at once (and find the new leader).
pub(crate) const CLOSE_DEPOSED: u32 = CLOSE_OK;
/// QUIC application close code after a refusal.
const CLOSE_REFUSED: u32 = 1;
/// QUIC application close code of a session replaced by a newer one of the same machine.
const CLOSE_REPLACED: u32 = 2;

/// What every connection task needs.
#[derive(Debug, Clone)]
pub struct ServerCtx {
    /// Our name, sent in hello replies.
    pub name: String,
    /// Our trust domain: peers from another are refused.
    pub trust_domain: String,
    /// The registry.
    pub fleet: Arc<Fleet>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Admin request handlers.
    pub admin: Arc<Admin>,
    /// Connections of connected agents, for agent actions.
    pub links: Arc<crate::agent_link::AgentLinks>,
    /// Crash-dump notices from kdump initramfs; `None` refuses them.
    pub kdump: Option<Arc<crate::kdump::Kdumps>>,
    /// Whether this coordinator leads: a standby answers every hello with the leader.
    pub leadership: crate::leadership::Leadership,
}

/// Accepts connections until `shutdown`, then gives open sessions up to `grace` to end and
/// closes the endpoint.
pub async fn serve(
    endpoint: Endpoint,
    ctx: Arc<ServerCtx>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let mut tasks = JoinSet::new();
    loop {
        // Reap finished connection tasks so the set does not grow with every connection.
        while tasks.try_join_next().is_some() {}
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let remote = incoming.remote_address();
        let span = tracing::info_span!("conn", %remote);
        let hello = hello(incoming, ctx.clone());
        tasks.spawn(
            handle_connection(hello, remote, ctx.clone(), shutdown.clone()).instrument(span),
        );
    }
    tracing::info!(
        open = tasks.len(),
        "no longer accepting connections; draining"
    );
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "connections still open after the shutdown grace; closing them"
        );
        tasks.abort_all();
    }
    endpoint.close(CLOSE_OK.into(), b"coordinator shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
}

/// The handshake and hello of one incoming connection, boxed: see [`handle_connection`].
fn hello(
    incoming: quinn::Incoming,
    ctx: Arc<ServerCtx>,
) -> BoxFuture<'static, Result<PendingHello, HelloError>> {
    Box::pin(async move { accept_hello(incoming, &ctx.trust_domain).await })
}

/// One connection's task. A task keeps room for the largest state its future can be in (and
/// for its arguments) for as long as it lives, and an agent's task lives as long as its
/// session: so the handshake, the hello, the refusals and the other kinds of session run as
/// boxed futures of their own, freed when they end, and what stays for the session is
/// [`agent_reports`], a few hundred bytes.
async fn handle_connection(
    hello: BoxFuture<'static, Result<PendingHello, HelloError>>,
    remote: SocketAddr,
    ctx: Arc<ServerCtx>,
    shutdown: CancellationToken,
) {
    let pending = match hello.await {
        Ok(p) => p,
        Err(HelloError::Refused { peer, refusal }) => {
            ctx.metrics.refused(refusal_label(refusal.code));
            tracing::warn!(
                %peer,
                code = refusal_label(refusal.code),
                reason = %refusal.reason,
                "connection refused"
            );
            return;
        }
        Err(HelloError::Transport(e)) => {
            ctx.metrics.refused(HANDSHAKE_FAILED);
            // A peer's certificate refused for its dates is said in dates, with whose clock.
            let error =
                protocol::transport::clock::explain_dates(&e.to_string(), "this coordinator", None);
            tracing::warn!(%error, %remote, "connection failed before hello (TLS handshake refused or peer gone)");
            return;
        }
    };
    let Some((agent, span)) = Box::pin(after_hello(pending, remote, &ctx, &shutdown)).await else {
        return;
    };
    agent_reports(agent, &ctx, shutdown).instrument(span).await;
}

/// Decides what a hello's peer may do and does it: refusals, kdump notices and admin
/// sessions end here; an agent's hello is recorded and accepted, and its connection
/// returned with its tracing span for [`agent_reports`].
async fn after_hello(
    pending: PendingHello,
    remote: SocketAddr,
    ctx: &ServerCtx,
    shutdown: &CancellationToken,
) -> Option<(AgentConn, tracing::Span)> {
    let peer = pending.peer.clone();
    if let Some(leader) = ctx.leadership.standby_of() {
        // Not leading: nothing is served or recorded here; the client goes to the leader.
        ctx.metrics.refused("standby");
        tracing::info!(%peer, leader = ?leader, "hello answered as a standby");
        pending.refuse_standby(leader).await;
        return None;
    }
    match (peer.role, pending.hello.clone()) {
        (Role::Node, HelloBody::Agent(hello)) => {
            if hello.hostname != peer.name {
                let r = Refusal::new(
                    RefusalCode::IdentityMismatch,
                    format!(
                        "hello claims hostname {:?} but the certificate names {:?}; a node may only report about itself",
                        hello.hostname, peer.name
                    ),
                );
                tracing::warn!(
                    certificate = %peer,
                    claimed = %hello.hostname,
                    code = refusal_label(r.code),
                    "agent hello refused: hostname differs from certificate"
                );
                ctx.metrics.refused(refusal_label(r.code));
                pending.refuse(r).await;
                return None;
            }
            let span = tracing::info_span!("agent", hostname = %peer.name);
            let agent = agent_hello(pending, hello, remote, ctx)
                .instrument(span.clone())
                .await?;
            Some((agent, span))
        }
        (Role::Node, HelloBody::Kdump(notice)) => {
            kdump_notice(pending, notice, ctx)
                .instrument(tracing::info_span!("kdump", hostname = %peer.name))
                .await;
            None
        }
        (Role::Admin, HelloBody::Admin(hello)) => {
            tracing::info!(admin = %peer.name, client = %hello.client, "admin connected");
            admin_session(pending, ctx, shutdown.clone())
                .instrument(tracing::info_span!("admin", user = %peer.name))
                .await;
            None
        }
        (role, body) => {
            let wants = match body {
                HelloBody::Agent(_) => "an agent session",
                HelloBody::Admin(_) => "the admin API",
                HelloBody::Coordinator(_) => "a coordinator session",
                HelloBody::Kdump(_) => "a kdump notice",
            };
            let r = Refusal::new(
                RefusalCode::NotAuthorized,
                format!("a {role} certificate may not open {wants} on a coordinator"),
            );
            tracing::warn!(
                certificate = %peer,
                wants,
                code = refusal_label(r.code),
                "connection refused: role not authorized"
            );
            ctx.metrics.refused(refusal_label(r.code));
            pending.refuse(r).await;
            None
        }
    }
}

/// A kdump initramfs's notice: recorded (durably) for the machine its certificate names,
/// then acknowledged by accepting the hello; the connection ends there. The certificate,
/// never the notice, says which machine is dumping.
async fn kdump_notice(pending: PendingHello, notice: KdumpNotice, ctx: &ServerCtx) {
    let hostname = pending.peer.name.clone();
    let refusal = if notice.hostname != hostname {
        Some(Refusal::new(
            RefusalCode::IdentityMismatch,
            format!(
                "kdump notice claims hostname {:?} but the certificate names {hostname:?}; a node may only report about itself",
                notice.hostname
            ),
        ))
    } else {
        match &ctx.kdump {
            None => Some(Refusal::new(
                RefusalCode::BadRequest,
                "this coordinator does not record kdump notices",
            )),
            Some(k) => match k.notice(&hostname, &notice).await {
                Ok(_) => None,
                Err(e @ crate::kdump::KdumpError::UnknownHost(_)) => {
                    Some(Refusal::new(RefusalCode::BadRequest, e.to_string()))
                }
                Err(e) => Some(Refusal::new(RefusalCode::Internal, e.to_string())),
            },
        }
    };
    if let Some(r) = refusal {
        tracing::warn!(code = refusal_label(r.code), reason = %r.reason, "kdump notice refused");
        ctx.metrics.refused(refusal_label(r.code));
        pending.refuse(r).await;
        return;
    }
    match pending.accept(&ctx.name).await {
        Ok(Session { conn, mut send, .. }) => {
            let _ = send.finish();
            // The client closes once it has read the acceptance; wait for that (bounded).
            let _ = tokio::time::timeout(REFUSAL_LINGER, conn.closed()).await;
            conn.close(CLOSE_OK.into(), b"kdump notice recorded");
        }
        Err(e) => tracing::info!(error = %e, "kdump notifier left before the acknowledgement"),
    }
}

/// Answers a refusal on an open session, logs it, and closes the connection.
async fn refuse_in_session(
    conn: &Connection,
    send: &mut SendStream,
    refusal: Refusal,
    metrics: &Metrics,
) {
    tracing::warn!(
        code = refusal_label(refusal.code),
        reason = %refusal.reason,
        "session refused; closing connection"
    );
    metrics.refused(refusal_label(refusal.code));
    let _ = write_msg(
        send,
        &CoordinatorReply::Refused(refusal.clone()),
        MAX_FRAME_LEN,
    )
    .await;
    let _ = send.finish();
    let _ = tokio::time::timeout(REFUSAL_LINGER, send.stopped()).await;
    let mut reason = refusal.reason.into_bytes();
    reason.truncate(200);
    conn.close(CLOSE_REFUSED.into(), &reason);
}

fn frame_refusal(what: &str, e: &FrameError) -> Refusal {
    let code = match e {
        FrameError::Oversized { .. } => RefusalCode::FrameTooLarge,
        _ => RefusalCode::Malformed,
    };
    Refusal::new(code, format!("{what}: {e}"))
}

/// What an agent's session keeps between reports: its names, its connection and the two
/// halves of its stream (the hello and everything else it said are dropped once handled).
struct AgentConn {
    hostname: String,
    address: String,
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    /// The session number in [`crate::agent_link::AgentLinks`].
    link: u64,
}

/// Records an agent's hello and accepts it; `None` when the hello could not be recorded
/// (refused) or the agent left meanwhile.
async fn agent_hello(
    pending: PendingHello,
    hello: AgentHello,
    remote: SocketAddr,
    ctx: &ServerCtx,
) -> Option<AgentConn> {
    let hostname = pending.peer.name.clone();
    let address = match ctx.fleet.agent_hello(&hostname, &hello, remote.ip()).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot record agent hello");
            pending
                .refuse(Refusal::new(
                    RefusalCode::Internal,
                    format!("coordinator cannot record the hello: {e}"),
                ))
                .await;
            return None;
        }
    };
    let Session {
        conn,
        send,
        recv,
        version,
        ..
    } = match pending.accept(&ctx.name).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "agent left during hello");
            ctx.fleet.disconnected(&hostname).await;
            return None;
        }
    };
    let (link, replaced) = ctx.links.insert(&address, conn.clone(), version);
    tracing::info!(machine = %address, agent_version = %hello.agent_version, boot_id = %hello.boot_id, version, "agent connected");
    if let Some(old) = replaced {
        replace_session(&old, &address, &hostname, remote, ctx);
    }
    if let Some(t) = protocol::transport::peer_not_after(&conn) {
        ctx.fleet.note_certificate(&hostname, t);
        crate::certs::agent_connected(&hostname, &address, t);
    }
    Some(AgentConn {
        hostname,
        address,
        conn,
        send,
        recv,
        link,
    })
}

/// Closes `old`, the session of `address` that the connection from `remote` replaced, and
/// says so: a warning with both peers' addresses and a count.
fn replace_session(
    old: &Connection,
    address: &str,
    hostname: &str,
    remote: SocketAddr,
    ctx: &ServerCtx,
) {
    ctx.metrics.agent_session_replaced();
    tracing::warn!(
        machine = %address,
        hostname,
        new_peer = %remote,
        old_peer = %old.remote_address(),
        "a new connection with this machine's certificate replaced its open one, now closed: \
         an agent back before its old connection timed out, or, if this repeats, two agents \
         using one certificate (a cloned image or a copied certificate)"
    );
    let reason =
        format!("replaced by a newer connection of this machine's certificate from {remote}");
    old.close(CLOSE_REPLACED.into(), reason.as_bytes());
}

/// An accepted agent's reports, each acknowledged, until it leaves or we shut down. This
/// future is what every connected agent's task holds: the report handling and the rare
/// paths are boxed so that it stays small (see [`handle_connection`]).
///
/// Not an `async fn`: one keeps its arguments twice for its whole life (as arguments and as
/// the body's locals), where this block uses its captures in place.
#[allow(clippy::manual_async_fn)] // on purpose: see above
fn agent_reports<'a>(
    mut agent: AgentConn,
    ctx: &'a ServerCtx,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'a {
    async move {
        let _open = ctx.metrics.session_opened(SessionKind::Agent);
        loop {
            let read = tokio::select! {
                _ = shutdown.cancelled() => {
                    agent.conn.close(CLOSE_OK.into(), b"coordinator shutting down");
                    break;
                }
                r = read_payload(&mut agent.recv, MAX_FRAME_LEN) => r,
            };
            let read_at = Instant::now();
            // Everything between a frame and its ack runs boxed, so that this future (held
            // between reports) has room only for the read and the write.
            let Some((seq, report)) = Box::pin(agent_frame(read, &mut agent, ctx)).await else {
                break;
            };
            if let Err(e) = write_msg(
                &mut agent.send,
                &CoordinatorReply::Ack { seq },
                MAX_FRAME_LEN,
            )
            .await
            {
                tracing::info!(machine = %agent.address, error = %e, "agent connection lost");
                break;
            }
            if report {
                ctx.metrics.report_answered(read_at.elapsed());
            }
        }
        ctx.links.remove(&agent.address, agent.link);
        Box::pin(ctx.fleet.disconnected(&agent.hostname)).await;
    }
}

/// Handles what one read of an agent's stream gave: a message is handed to the registry
/// and its sequence number returned for the ack, with whether it was a report; `None` ends
/// the session (stream closed, connection lost, or a malformed frame, refused here).
async fn agent_frame(
    read: Result<Option<Vec<u8>>, TransportError>,
    agent: &mut AgentConn,
    ctx: &ServerCtx,
) -> Option<(u64, bool)> {
    let decoded = match read {
        // This release's messages and those of agents before report intervals.
        Ok(Some(payload)) => protocol::messages::decode_agent_message(&payload),
        Ok(None) => {
            tracing::info!(machine = %agent.address, "agent closed its stream");
            return None;
        }
        Err(TransportError::Frame(e)) => Err(e),
        Err(e) => {
            tracing::info!(machine = %agent.address, error = %e, "agent connection lost");
            return None;
        }
    };
    let msg = match decoded {
        Ok(m) => m,
        Err(e) => {
            let r = frame_refusal("agent message", &e);
            refuse_in_session(&agent.conn, &mut agent.send, r, &ctx.metrics).await;
            return None;
        }
    };
    let address = &agent.address;
    match msg {
        AgentMessage::Report(report) => {
            ctx.metrics.report_received(agent.conn.rtt());
            let seq = report.seq;
            tracing::debug!(machine = %address, seq, ok = report.all_ok(), "report");
            match ctx.fleet.report(&agent.hostname, report).await {
                Ok(()) => {}
                // Deleted while connected (a delete closes the session too; this report was
                // on its way): end the session, so that the agent's next hello registers it.
                Err(FleetError::UnknownHost(_)) => {
                    tracing::info!(machine = %address, "machine deleted while its agent was connected; closing the session so that it registers again");
                    agent.conn.close(
                        crate::agent_link::CLOSE_DELETED.into(),
                        b"machine deleted; reconnect to register again",
                    );
                    return None;
                }
                // The report is in memory; the sweep retries the transition. A failing store
                // is said once by the store (and counted), not at every report.
                Err(e) if e.is_storage_failure() => {
                    tracing::debug!(machine = %address, error = %e, "cannot record state transition");
                }
                Err(e) => {
                    tracing::error!(machine = %address, error = %e, "cannot record state transition");
                }
            }
            Some((seq, true))
        }
        AgentMessage::Goodbye(g) if !ctx.links.is_current(address, agent.link) => {
            tracing::warn!(
                machine = %address,
                reason = ?g.reason,
                peer = %agent.conn.remote_address(),
                "goodbye on a connection that a newer one of this machine replaced; the machine's state is left as it is"
            );
            Some((0, false))
        }
        AgentMessage::Goodbye(g) => {
            tracing::info!(machine = %address, reason = ?g.reason, "agent said goodbye");
            if let Err(e) = ctx.fleet.goodbye(&agent.hostname, g.reason).await {
                tracing::error!(machine = %address, error = %e, "cannot record goodbye");
            }
            Some((0, false))
        }
    }
}

async fn admin_session(pending: PendingHello, ctx: &ServerCtx, shutdown: CancellationToken) {
    let who = pending.peer.clone();
    let Session { conn, .. } = match pending.accept(&ctx.name).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "admin left during hello");
            return;
        }
    };
    let _open = ctx.metrics.session_opened(SessionKind::Admin);
    let mut requests = JoinSet::new();
    loop {
        while requests.try_join_next().is_some() {}
        let (send, recv) = tokio::select! {
            _ = shutdown.cancelled() => break,
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "admin connection closed");
                    break;
                }
            },
        };
        let ctx = ctx.clone();
        let who = who.clone();
        requests
            .spawn(async move { admin_request(send, recv, &ctx, &who).await }.in_current_span());
    }
    // Requests already being answered finish (the caller's grace bounds this).
    while requests.join_next().await.is_some() {}
    if shutdown.is_cancelled() {
        // Said, not just dropped: coordinatorctl tells its user why the connection ended.
        conn.close(CLOSE_OK.into(), b"coordinator shutting down");
    }
}

async fn admin_request(
    mut send: SendStream,
    mut recv: RecvStream,
    ctx: &ServerCtx,
    who: &protocol::Identity,
) {
    use protocol::admin::{AdminRequest, AdminResponse};
    ctx.metrics.admin_request();
    // An admin's request may be as large as an answer: an inventory of a whole fleet to
    // import. The peer is an authenticated admin by now.
    let resp = match read_payload(&mut recv, MAX_ADMIN_FRAME_LEN).await {
        Ok(Some(p)) => match frame::decode_payload::<AdminRequest>(&p) {
            Ok(req) => ctx.admin.handle(who, req).await,
            Err(e) => {
                let r = frame_refusal("admin request", &e);
                tracing::warn!(code = refusal_label(r.code), reason = %r.reason, "admin request refused");
                ctx.metrics.refused(refusal_label(r.code));
                AdminResponse::Error(r)
            }
        },
        Ok(None) => return,
        Err(TransportError::Frame(e)) => {
            let r = frame_refusal("admin request", &e);
            tracing::warn!(code = refusal_label(r.code), reason = %r.reason, "admin request refused");
            ctx.metrics.refused(refusal_label(r.code));
            AdminResponse::Error(r)
        }
        Err(e) => {
            tracing::debug!(error = %e, "admin request stream failed");
            return;
        }
    };
    let written = match write_msg(&mut send, &resp, MAX_ADMIN_FRAME_LEN).await {
        Err(TransportError::Frame(e)) => {
            let r = AdminResponse::Error(Refusal::new(
                RefusalCode::Internal,
                format!("the answer is too large to send: {e}"),
            ));
            write_msg(&mut send, &r, MAX_ADMIN_FRAME_LEN).await
        }
        other => other,
    };
    if let Err(e) = written {
        tracing::debug!(error = %e, "cannot answer admin request");
        return;
    }
    let _ = send.finish();
    // Let the answer drain before the stream is dropped.
    let _ = tokio::time::timeout(REFUSAL_LINGER, send.stopped()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without running it.
    fn future_size<A, B, C, F: Future>(_: impl Fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every connected agent's task holds its connection future for the whole session: that
    /// future must not keep room for the handshake, the hello or the report handling (3.7 KiB
    /// when they were inline; under 0.6 KiB with them boxed, in a debug build).
    #[test]
    fn a_connection_task_keeps_little_between_reports() {
        let whole = future_size(
            |h: BoxFuture<'static, Result<PendingHello, HelloError>>,
             ctx: Arc<ServerCtx>,
             shutdown: CancellationToken| {
                handle_connection(h, "127.0.0.1:1".parse().unwrap(), ctx, shutdown)
            },
        );
        let session = future_size(
            |a: AgentConn, ctx: Arc<ServerCtx>, shutdown: CancellationToken| async move {
                agent_reports(a, &ctx, shutdown).await
            },
        );
        assert!(whole <= 1024, "a connection's task future is {whole} bytes");
        assert!(
            session <= 1024,
            "an agent session's future is {session} bytes"
        );
    }
}
