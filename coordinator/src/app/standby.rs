//! A coordinator on etcd that does not lead (yet): while it campaigns, its QUIC port answers
//! every hello "standby; the leader is X" and its HTTP port serves `/healthz` and `/metrics`
//! with its role, and probes the store as the leader does, so `/healthz` follows etcd. It has
//! loaded nothing (no registry, no queue): a standby keeps no state
//! that could go stale, and loads everything from etcd when it wins.
//!
//! The standby serves on clones of the bound sockets, so when it stops the coordinator that
//! now leads serves on the same ports, and a connection that arrived in between waits in the
//! socket's queue for the new server instead of being refused.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use protocol::transport::accept_hello;
use quinn::Endpoint;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::ha::RoleHandle;
use crate::leadership::Leadership;
use crate::metrics::{HttpState, Metrics, MetricsSource};
use crate::store::Store;

/// The standby's servers, until [`Standby::stop`].
pub(super) struct Standby {
    stop: CancellationToken,
    quic: JoinHandle<()>,
    http: Option<JoinHandle<std::io::Result<()>>>,
    probe: JoinHandle<()>,
}

/// What the standby serves with.
pub(super) struct StandbyParts<'a> {
    pub endpoint: &'a Endpoint,
    pub http: Option<&'a tokio::net::TcpListener>,
    pub trust_domain: &'a str,
    pub role: &'a Arc<RoleHandle>,
    pub store: &'a Store,
    pub metrics: &'a Arc<Metrics>,
}

impl Standby {
    /// Starts answering on the bound ports.
    pub(super) fn spawn(p: StandbyParts<'_>) -> std::io::Result<Self> {
        let stop = CancellationToken::new();
        let quic = tokio::spawn(answer_hellos(
            p.endpoint.clone(),
            p.trust_domain.to_string(),
            Leadership::new(p.role.clone()),
            p.metrics.clone(),
            stop.clone(),
        ));
        let http = match p.http {
            Some(listener) => {
                let listener = clone_listener(listener)?;
                let state = HttpState {
                    fleet: None,
                    metrics: p.metrics.clone(),
                    store: p.store.clone(),
                    sources: vec![Arc::new(crate::ha::metrics::RoleMetrics(p.role.clone()))
                        as Arc<dyn MetricsSource>],
                    role: p.role.clone(),
                };
                Some(tokio::spawn(crate::metrics::serve(
                    listener,
                    state,
                    stop.clone(),
                )))
            }
            None => None,
        };
        // The store's health, as the leader keeps it: a failed campaign request marks the
        // store failing (503), and only a probe that reaches etcd again clears it. Reads
        // only: a standby never moves etcd's revision.
        let probe = tokio::spawn(crate::store::health::probe_loop(
            p.store.clone(),
            crate::store::health::PROBE_PERIOD,
            stop.clone(),
        ));
        Ok(Self {
            stop,
            quic,
            http,
            probe,
        })
    }

    /// Stops answering: the ports stay bound for the coordinator that leads now.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.quic.await;
        let _ = self.probe.await;
        if let Some(h) = self.http
            && let Ok(Ok(Err(e))) = tokio::time::timeout(Duration::from_secs(5), h).await
        {
            tracing::warn!(error = %e, "the standby's HTTP endpoint failed");
        }
    }
}

/// A second handle on the listening socket `l` (the same socket: connections queue for
/// whichever handle accepts next).
fn clone_listener(l: &tokio::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    let fd = l.as_fd().try_clone_to_owned()?;
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std)
}

/// Answers every hello with the standby refusal, naming the leader when one is known,
/// until `stop`; the endpoint stays open.
async fn answer_hellos(
    endpoint: Endpoint,
    trust_domain: String,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let incoming = tokio::select! {
            _ = stop.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let (domain, leadership, metrics) =
            (trust_domain.clone(), leadership.clone(), metrics.clone());
        tasks.spawn(async move {
            match accept_hello(incoming, &domain).await {
                Ok(pending) => {
                    let leader = leadership.standby_of().unwrap_or(None);
                    metrics.refused("standby");
                    tracing::debug!(peer = %pending.peer, leader = ?leader, "hello answered as a standby");
                    pending.refuse_standby(leader).await;
                }
                Err(e) => tracing::debug!(error = %e, "a connection to the standby failed before its hello"),
            }
        });
    }
    // The answers under way finish (each is one reply); nothing waits longer than a second.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
}
