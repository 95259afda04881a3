//! Counters and the plain-HTTP `/metrics` (Prometheus text format) and `/healthz` endpoint.
//!
//! The endpoint is read-only and unauthenticated, so it shows counts, never machine
//! details; it listens on its own port so it can be firewalled apart from the QUIC API.
//! Other areas add their series by registering a [`MetricsSource`] with the server.
//!
//! `/healthz` answers 503 while shutting down, while the store's writes are failing (see
//! [`crate::store::StoreHealth`]) and when the database cannot be read.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use protocol::messages::RefusalCode;
use tokio_util::sync::CancellationToken;

use crate::fleet::Fleet;
use crate::store::{Probe, Store, StoreHealth};

/// Label of a refusal reason in metrics and logs.
pub fn refusal_label(code: RefusalCode) -> &'static str {
    match code {
        RefusalCode::UnsupportedVersion => "unsupported-version",
        RefusalCode::NotAuthorized => "not-authorized",
        RefusalCode::IdentityMismatch => "identity-mismatch",
        RefusalCode::Malformed => "malformed",
        RefusalCode::FrameTooLarge => "frame-too-large",
        RefusalCode::ShuttingDown => "shutting-down",
        RefusalCode::Internal => "internal",
        RefusalCode::BadRequest => "bad-request",
    }
}

/// Label for connections that failed before any hello: TLS handshake refused (no client
/// certificate, another CA), or the peer vanished.
pub const HANDSHAKE_FAILED: &str = "handshake-failed";

/// Upper bounds (seconds) of the report-latency histograms: from a tenth of a millisecond
/// (a report answered on a quiet coordinator, a round trip inside a rack) to ten seconds
/// (the agent's own timeout). Half a second is a bound because `FleetmendReportsSlow`
/// compares the p99 with it: between two bounds a quantile is interpolated, and a p99 of
/// 0.3 s read as 0.85 s would page for nothing.
pub const LATENCY_BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// A Prometheus histogram over [`LATENCY_BUCKETS`] that many tasks observe at once without
/// a lock (one observation per report).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket, not cumulative; the last one is above every bound.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    /// Counts one observation.
    pub fn observe(&self, took: std::time::Duration) {
        let secs = took.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Appends the series `name` (`_bucket`, `_sum`, `_count`) with its HELP and TYPE lines.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (le, c) in LATENCY_BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        cumulative += self.counts[LATENCY_BUCKETS.len()].load(Ordering::Relaxed);
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {cumulative}\n{name}_sum {sum}\n{name}_count {cumulative}"
        );
    }
}

/// The coordinator's own counters. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    reports: AtomicU64,
    /// From a report read off its stream to its acknowledgement written.
    report_handling: LatencyHistogram,
    /// The connection's smoothed round-trip time (quinn's estimate) at each report.
    agent_rtt: LatencyHistogram,
    open_agent: AtomicI64,
    open_admin: AtomicI64,
    accepted: AtomicU64,
    admin_requests: AtomicU64,
    /// Agent sessions closed because a newer one of the same machine was accepted.
    replaced: AtomicU64,
    refused: Mutex<BTreeMap<&'static str, u64>>,
    shutting_down: AtomicBool,
}

/// Which kind of session a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// node-agent.
    Agent,
    /// coordinatorctl.
    Admin,
}

/// Decrements the open-connection gauge when dropped.
#[derive(Debug)]
pub struct OpenGuard {
    metrics: Arc<Metrics>,
    kind: SessionKind,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.metrics
            .gauge(self.kind)
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    fn gauge(&self, kind: SessionKind) -> &AtomicI64 {
        match kind {
            SessionKind::Agent => &self.open_agent,
            SessionKind::Admin => &self.open_admin,
        }
    }

    /// Counts an accepted session as open until the guard drops.
    pub fn session_opened(self: &Arc<Self>, kind: SessionKind) -> OpenGuard {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.gauge(kind).fetch_add(1, Ordering::Relaxed);
        OpenGuard {
            metrics: self.clone(),
            kind,
        }
    }

    /// Counts a received health report, with its connection's round-trip time.
    pub fn report_received(&self, rtt: std::time::Duration) {
        self.reports.fetch_add(1, Ordering::Relaxed);
        self.agent_rtt.observe(rtt);
    }

    /// Records how long a report took from being read to its acknowledgement being written.
    pub fn report_answered(&self, took: std::time::Duration) {
        self.report_handling.observe(took);
    }

    /// Counts an agent session closed because a newer one of its machine was accepted.
    pub fn agent_session_replaced(&self) {
        self.replaced.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an admin request.
    pub fn admin_request(&self) {
        self.admin_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused or failed connection by reason label.
    pub fn refused(&self, reason: &'static str) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    /// Reports received so far.
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }

    /// Marks the process as shutting down: `/healthz` answers 503 from now on.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Renders the coordinator's series in Prometheus text format.
    /// Without a registry (a standby has not loaded one) the machine counts are left out.
    pub fn render(&self, fleet: Option<&Fleet>, out: &mut String) {
        if let Some(fleet) = fleet {
            let _ = writeln!(
                out,
                "# HELP fleetmend_machines Machines by health state.\n# TYPE fleetmend_machines gauge"
            );
            for (state, n) in fleet.counts_by_state() {
                let _ = writeln!(out, "fleetmend_machines{{state=\"{state}\"}} {n}");
            }
        }
        let _ = writeln!(
            out,
            "# HELP fleetmend_reports_received_total Health reports received from agents.\n\
             # TYPE fleetmend_reports_received_total counter\n\
             fleetmend_reports_received_total {}",
            self.reports()
        );
        self.report_handling.render(
            "fleetmend_report_handling_seconds",
            "Time from an agent's report read to its acknowledgement written (the coordinator's share of the report round trip).",
            out,
        );
        self.agent_rtt.render(
            "fleetmend_agent_rtt_seconds",
            "Smoothed round-trip time of the agent's QUIC connection, sampled at each report.",
            out,
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_connections_open Open sessions by kind.\n\
             # TYPE fleetmend_connections_open gauge\n\
             fleetmend_connections_open{{kind=\"agent\"}} {}\n\
             fleetmend_connections_open{{kind=\"admin\"}} {}",
            self.open_agent.load(Ordering::Relaxed),
            self.open_admin.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_connections_accepted_total Sessions accepted after hello.\n\
             # TYPE fleetmend_connections_accepted_total counter\n\
             fleetmend_connections_accepted_total {}",
            self.accepted.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_agent_sessions_replaced_total Agent sessions closed because a newer connection with the same machine's certificate was accepted (an agent back before its old connection timed out, or, when it keeps rising, two agents sharing one certificate).\n\
             # TYPE fleetmend_agent_sessions_replaced_total counter\n\
             fleetmend_agent_sessions_replaced_total {}",
            self.replaced.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_connections_refused_total Connections refused or failed, by reason.\n\
             # TYPE fleetmend_connections_refused_total counter"
        );
        for (reason, n) in self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "fleetmend_connections_refused_total{{reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP fleetmend_admin_requests_total Admin API requests.\n\
             # TYPE fleetmend_admin_requests_total counter\n\
             fleetmend_admin_requests_total {}",
            self.admin_requests.load(Ordering::Relaxed)
        );
    }
}

/// The store's series: failures counted and whether writes are failing now.
pub fn render_store(health: &StoreHealth, out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP fleetmend_store_failures_total Database operations that failed because the store could not be written or read.\n\
         # TYPE fleetmend_store_failures_total counter\n\
         fleetmend_store_failures_total {}\n\
         # HELP fleetmend_store_failing 1 while database writes are failing (/healthz answers 503).\n\
         # TYPE fleetmend_store_failing gauge\n\
         fleetmend_store_failing {}\n\
         # HELP fleetmend_store_etcd_member_moves_total Times requests moved off an etcd member that failed or did not answer one (etcd only).\n\
         # TYPE fleetmend_store_etcd_member_moves_total counter\n\
         fleetmend_store_etcd_member_moves_total {}",
        health.failures(),
        u8::from(health.failing().is_some()),
        health.member_moves()
    );
}

/// Something that adds series to `/metrics` (e.g. the repair queue).
pub trait MetricsSource: Send + Sync + 'static {
    /// Appends series in Prometheus text format.
    fn render(&self, out: &mut String);
}

/// What the HTTP handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// The registry; `None` on a standby, which has not loaded it.
    pub fleet: Option<Arc<Fleet>>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The database, probed by `/healthz`.
    pub store: Store,
    /// More series.
    pub sources: Vec<Arc<dyn MetricsSource>>,
    /// This coordinator's role (always leader with SQLite), said by `/healthz`.
    pub role: Arc<crate::ha::RoleHandle>,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

async fn metrics_handler(State(s): State<HttpState>) -> impl IntoResponse {
    let mut out = String::new();
    s.metrics.render(s.fleet.as_deref(), &mut out);
    render_store(s.store.health(), &mut out);
    for src in &s.sources {
        src.render(&mut out);
    }
    protocol::process_metrics::render_into(&mut out);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
}

async fn healthz_handler(State(s): State<HttpState>) -> impl IntoResponse {
    if s.metrics.shutting_down.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n".to_string(),
        );
    }
    if let Some(why) = s.store.health().failing() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database writes are failing: {why}\n"),
        );
    }
    if let Some(why) = role_unhealthy(&s.role) {
        return (StatusCode::SERVICE_UNAVAILABLE, why);
    }
    match s.store.ping().await {
        Ok(_) => (StatusCode::OK, role_line(&s.role)),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unavailable: {e}\n"),
        ),
    }
}

/// Why `/healthz` must fail for the role: a leader whose term has ended (it stops acting and
/// exits).
fn role_unhealthy(role: &crate::ha::RoleHandle) -> Option<String> {
    match role.current() {
        crate::ha::Role::Deposed { epoch, why, .. } => Some(format!(
            "deposed: this coordinator no longer leads (epoch {epoch}: {why}); it is stopping\n"
        )),
        crate::ha::Role::Leader { epoch, .. } if !role.is_leading() => Some(format!(
            "deposed: the term of epoch {epoch} is over; this coordinator is stopping\n"
        )),
        _ => None,
    }
}

/// `/healthz`'s answer when healthy: `ok`, and with an election the role (a standby is
/// healthy: it is ready to take over).
fn role_line(role: &crate::ha::RoleHandle) -> String {
    if !role.is_elected() {
        return "ok\n".to_string();
    }
    let since = |t: Option<jiff::Timestamp>| t.map(|t| t.to_string()).unwrap_or_default();
    match role.current() {
        r @ crate::ha::Role::Leader { .. } => format!(
            "ok: leader, epoch {} since {}\n",
            r.epoch().unwrap_or(0),
            since(r.since())
        ),
        crate::ha::Role::Standby {
            leader,
            epoch,
            since: s,
        } => match leader {
            Some(l) => format!(
                "ok: standby since {s}; the leader is {} at {} (epoch {})\n",
                l.name,
                l.address,
                epoch.unwrap_or(0)
            ),
            None => format!("ok: standby since {s}; no leader seen\n"),
        },
        r => format!("ok: {}\n", r.name()),
    }
}

/// The router serving `/metrics` and `/healthz`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .with_state(state)
}

/// Serves the HTTP endpoint on an already bound listener until `shutdown`; a connection that sends
/// no complete request header within [`protocol::http::HEADER_READ_TIMEOUT`] is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(?addr, "serving /metrics and /healthz");
    protocol::http::serve_router(
        listener,
        router(state),
        protocol::http::HEADER_READ_TIMEOUT,
        async move { shutdown.cancelled().await },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::health::HealthConfig;

    #[tokio::test]
    async fn renders_every_state_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let fleet = Fleet::open(store, Arc::new(SystemClock), HealthConfig::default())
            .await
            .unwrap();
        let m = Arc::new(Metrics::default());
        m.report_received(std::time::Duration::from_micros(300));
        m.refused(refusal_label(RefusalCode::IdentityMismatch));
        let g = m.session_opened(SessionKind::Agent);
        let mut out = String::new();
        m.render(Some(&fleet), &mut out);
        assert!(out.contains("fleetmend_machines{state=\"unreachable\"} 0"));
        assert!(out.contains("fleetmend_reports_received_total 1"));
        assert!(
            out.contains("fleetmend_connections_refused_total{reason=\"identity-mismatch\"} 1")
        );
        assert!(out.contains("fleetmend_connections_open{kind=\"agent\"} 1"));
        drop(g);
        out.clear();
        m.render(Some(&fleet), &mut out);
        assert!(out.contains("fleetmend_connections_open{kind=\"agent\"} 0"));
    }

    #[test]
    fn latency_histograms_are_cumulative_and_sum_in_seconds() {
        use std::time::Duration;
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50)); // first bucket
        h.observe(Duration::from_micros(100)); // on a bound: counted in it
        h.observe(Duration::from_millis(3)); // 0.005
        h.observe(Duration::from_secs(12)); // above every bound
        let mut out = String::new();
        h.render("x_seconds", "Help.", &mut out);
        let value = |series: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{series} missing in\n{out}"))
                .to_string()
        };
        assert_eq!(value("x_seconds_bucket{le=\"0.0001\"}"), "2");
        assert_eq!(value("x_seconds_bucket{le=\"0.0025\"}"), "2");
        assert_eq!(value("x_seconds_bucket{le=\"0.005\"}"), "3");
        assert_eq!(value("x_seconds_bucket{le=\"1\"}"), "3");
        assert_eq!(value("x_seconds_bucket{le=\"+Inf\"}"), "4");
        assert_eq!(value("x_seconds_count"), "4");
        let sum: f64 = value("x_seconds_sum").parse().unwrap();
        assert!((sum - 12.00315).abs() < 1e-9, "{sum}");
        assert!(out.starts_with("# HELP x_seconds Help.\n# TYPE x_seconds histogram\n"));
        assert_eq!(h.count(), 4);
    }

    /// `/healthz` with an election: a standby is healthy and names the leader; a leader whose
    /// term is over answers 503 at once, before its keep-alive loop has noticed.
    #[test]
    fn healthz_says_the_role_and_fails_a_leader_whose_term_is_over() {
        use crate::ha::{LeaderRecord, RoleHandle};
        use crate::store::etcd::fence::Term;
        let sole = RoleHandle::sole();
        assert_eq!(role_line(&sole), "ok\n");
        assert!(role_unhealthy(&sole).is_none());
        let r = RoleHandle::elected();
        r.stand_by(
            Some(LeaderRecord {
                name: "c2".into(),
                address: "c2.example:7443".into(),
                since: jiff::Timestamp::UNIX_EPOCH,
                pid: 1,
            }),
            Some(41),
        );
        let line = role_line(&r);
        assert!(
            line.starts_with("ok: standby since ")
                && line.ends_with("the leader is c2 at c2.example:7443 (epoch 41)\n"),
            "{line}"
        );
        let term = Arc::new(Term::new(
            42,
            std::time::Instant::now() + std::time::Duration::from_secs(60),
        ));
        r.lead(term.clone());
        assert!(role_line(&r).starts_with("ok: leader, epoch 42 since "));
        assert!(role_unhealthy(&r).is_none());
        // The deadline passed (a paused process): unhealthy before anyone marks it deposed.
        let paused = Arc::new(Term::new(43, std::time::Instant::now()));
        r.lead(paused);
        let why = role_unhealthy(&r).expect("503");
        assert!(why.contains("epoch 43"), "{why}");
        r.deposed("the leader key was deleted");
        let why = role_unhealthy(&r).expect("503");
        assert!(why.starts_with("deposed:"), "{why}");
    }

    /// The real listener: a client that sends nothing is dropped after the header-read timeout,
    /// while a GET of /healthz is answered.
    #[tokio::test]
    async fn a_silent_connection_is_dropped_and_a_get_answered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let fleet = Fleet::open(
            store.clone(),
            Arc::new(SystemClock),
            HealthConfig::default(),
        )
        .await
        .unwrap();
        let state = HttpState {
            fleet: Some(Arc::new(fleet)),
            metrics: Arc::new(Metrics::default()),
            store,
            sources: Vec::new(),
            role: crate::ha::RoleHandle::sole(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, state, stop.clone()));

        let started = std::time::Instant::now();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut get = tokio::net::TcpStream::connect(addr).await.unwrap();
        get.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        get.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut rest = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            silent.read_to_end(&mut rest),
        )
        .await
        .expect("a silent connection is closed within 10 s")
        .unwrap();
        assert!(started.elapsed() >= protocol::http::HEADER_READ_TIMEOUT);
        stop.cancel();
    }
}
