//! A loaded coordinator at work: [`App::run`] starts the loops and servers and stops them,
//! on a shutdown or at the end of its term; the health sweep is one of its loops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{App, Ended};
use crate::agent_server::{self, ServerCtx};
use crate::fleet::Fleet;
use crate::metrics::HttpState;

/// Bounds of the sweep period. The sweep turns silent machines unreachable; running it four
/// times per report interval keeps the detection delay under a quarter interval, and the
/// bounds keep it from spinning with tiny test intervals or dawdling with huge ones.
const SWEEP_MIN: Duration = Duration::from_millis(50);
const SWEEP_MAX: Duration = Duration::from_secs(1);

impl App {
    /// What puts renewed TLS files in place (on SIGHUP).
    pub fn tls_reloader(&self) -> Arc<crate::certs::TlsReloader> {
        self.tls_reloader.clone()
    }

    /// The bound QUIC address.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.endpoint.local_addr().ok()
    }

    /// The bound HTTP address, if enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` fires, then drains open connections within the configured
    /// grace and returns [`Ended::Stopped`]; a coordinator that leads by election gives the
    /// lead up then. When its term ends first, every part stops at once (its connections
    /// are closed, not drained: its clients go to the new leader) and it returns
    /// [`Ended::Deposed`].
    pub async fn run(mut self, shutdown: CancellationToken) -> Ended {
        let grace = self.config.shutdown_grace;
        let elected = self.elected.take();
        let lost = elected.as_ref().map(|e| e.lost.clone());
        // Every part stops on `stop`: the shutdown, or the end of the term.
        let stop = shutdown.child_token();
        if let Some(lost) = lost.clone() {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost.cancelled() => stop.cancel(),
                    _ = stop.cancelled() => {}
                }
            });
        }
        let shutdown = stop;
        let ctx = Arc::new(ServerCtx {
            name: self.name.clone(),
            trust_domain: self.trust_domain.clone(),
            fleet: self.fleet.clone(),
            metrics: self.metrics.clone(),
            admin: self.admin.clone(),
            links: self.links.clone(),
            kdump: Some(self.kdump.clone()),
            leadership: crate::leadership::Leadership::new(self.role.clone()),
        });
        tracing::info!(
            name = %self.name,
            quic = %protocol::telemetry::OrNone(&self.quic_addr()),
            http = %protocol::telemetry::OrNone(&self.http_addr()),
            machines = self.fleet.list().len(),
            role = self.role.current().name(),
            epoch = self.role.current().epoch().unwrap_or(0),
            "coordinator serving"
        );
        let server = tokio::spawn(agent_server::serve(
            self.endpoint.clone(),
            ctx,
            shutdown.clone(),
            grace,
        ));
        let sweeper = tokio::spawn(sweep_loop(
            self.fleet.clone(),
            self.links.clone(),
            shutdown.clone(),
        ));
        let certificates = tokio::spawn(crate::certs::watch_agent_certificates(
            self.fleet.clone(),
            shutdown.clone(),
        ));
        let gateways = self
            .gateways
            .clone()
            .map(|g| tokio::spawn(g.watch_reach(shutdown.clone())));
        let probe = tokio::spawn(crate::store::health::probe_loop(
            self.store.clone(),
            crate::store::health::PROBE_PERIOD,
            shutdown.clone(),
        ));
        let node_view = self.node_view.as_ref().map(|(view, every)| {
            (
                view.spawn_poller(*every, shutdown.clone()),
                view.spawn_watcher(shutdown.clone()),
            )
        });
        let remediation = self
            .remediation
            .map(|(rem, deps)| rem.spawn(deps, shutdown.clone()));
        let http = self.http.take().map(|listener| {
            let state = HttpState {
                fleet: Some(self.fleet.clone()),
                metrics: self.metrics.clone(),
                store: self.store.clone(),
                sources: self.metrics_sources.clone(),
                role: self.role.clone(),
            };
            tokio::spawn(crate::metrics::serve(listener, state, shutdown.clone()))
        });
        shutdown.cancelled().await;
        self.metrics.set_shutting_down();
        let deposed = lost.as_ref().is_some_and(CancellationToken::is_cancelled);
        if deposed {
            // Its sessions belong to the new leader now: closed at once, not drained.
            self.endpoint.close(
                agent_server::CLOSE_DEPOSED.into(),
                b"this coordinator no longer leads",
            );
            tracing::warn!("deposed: every part stops now");
        } else {
            tracing::info!(grace = ?grace, "shutting down");
        }
        self.repair_stop.cancel();
        let _ = server.await;
        let _ = sweeper.await;
        let _ = certificates.await;
        if let Some(h) = gateways {
            let _ = h.await;
        }
        let _ = probe.await;
        if let Some(h) = remediation {
            let _ = h.await;
        }
        if let Some((poller, watcher)) = node_view {
            let _ = poller.await;
            let _ = watcher.await;
        }
        if let Some(h) = self.repair_join.take()
            && tokio::time::timeout(grace, h).await.is_err()
        {
            tracing::warn!("repair queue did not stop within the grace");
        }
        if let Some(h) = http {
            match tokio::time::timeout(grace, h).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP endpoint failed"),
                _ => tracing::warn!("HTTP endpoint did not stop within the grace"),
            }
        }
        match elected {
            Some(e) if !deposed => {
                // Every loop has stopped: a standby may take over now, at once.
                e.give_up().await;
                tracing::info!("coordinator stopped; the lead was given up");
                Ended::Stopped
            }
            Some(e) => {
                let _ = e.holder.await;
                tracing::warn!(
                    exit = crate::ha::EXIT_DEPOSED,
                    "coordinator stopped: it no longer leads"
                );
                Ended::Deposed
            }
            None => {
                tracing::info!("coordinator stopped");
                Ended::Stopped
            }
        }
    }
}

/// The sweep period for a report interval.
pub fn sweep_period(report_interval: Duration) -> Duration {
    (report_interval / 4).clamp(SWEEP_MIN, SWEEP_MAX)
}

async fn sweep_loop(
    fleet: Arc<Fleet>,
    links: Arc<crate::agent_link::AgentLinks>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(sweep_period(fleet.config().report_interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A store that keeps failing (a full disk) fails every sweep: said when it starts, when
    // its error changes, once a minute while it lasts, and when it ends, not every tick.
    let mut failing = crate::store::repeated::RepeatedFailure::new(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let received = links.received(&fleet.silent_connected());
        match fleet.sweep_heard(&received).await {
            Ok(_) => {
                if let Some(n) = failing.succeeded() {
                    tracing::info!(failed_sweeps = n, "health sweep works again");
                }
            }
            Err(e) => {
                let e = e.to_string();
                if let Some(n) = failing.failed(&e, tokio::time::Instant::now()) {
                    tracing::error!(error = %e, failed_sweeps = n, "health sweep failed; retrying every tick");
                }
            }
        }
    }
}
