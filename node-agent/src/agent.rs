//! The reporting loop: one long-lived QUIC connection to the coordinator, a health report
//! every interval, reconnects with backoff, and a goodbye when stopped.
//!
//! ```text
//! connect (hello) ──accepted──▶ report ─ack─▶ wait interval ─▶ report …
//!     ▲ refused / failed               │ refused / error / timeout
//!     └────────── backoff ◀────────────┘
//! stop signal (at any point) ─▶ goodbye on the current connection, or on a fresh one
//! ```
//!
//! Every network step is bounded by a timeout, and the watchdog is pinged between steps
//! and while waiting, so a hung agent is restarted by systemd but a coordinator outage is
//! not mistaken for one. This module does not decide what is healthy (see `checks`) nor
//! what the coordinator does with reports.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::frame::MAX_FRAME_LEN;
use protocol::identity::Role;
use protocol::messages::{
    AgentMessage, CoordinatorReply, Goodbye, GoodbyeReason, HealthReport, HelloBody, Refusal,
    RefusalCode,
};
use protocol::transport::{self, Session, TlsFiles, TlsMaterial, TransportError};
use quinn::Endpoint;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backoff::{Backoff, INITIAL_BACKOFF, MAX_BACKOFF};
use crate::checks::Checker;
use crate::config::{Config, ConfigError, CoordinatorConfig};
use crate::node::{self, NodeError};
use crate::systemd::{Notifier, ShutdownProbe};

/// How long to wait for the coordinator's answer to a report. Longer than any sane
/// coordinator write (a SQLite transaction) and well under the unreachable grace period,
/// so a stuck connection is replaced before the machine is declared unreachable.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The whole goodbye (connecting if needed, sending, reading the ack) must fit in this:
/// systemd's stop timeout is 90 s by default but shutdown should not wait on an agent;
/// 3 s is many round trips on any datacenter network.
pub const GOODBYE_TIMEOUT: Duration = Duration::from_secs(3);

/// After closing the connection, how long to let quinn deliver the close frame so the
/// coordinator sees a clean close instead of an idle timeout.
const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// Errors that end the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot run an agent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The certificate, key or CA could not be loaded.
    #[error("TLS files: {0}")]
    Tls(#[source] TransportError),
    /// The certificate does not name this node.
    #[error(
        "certificate identity {identity} does not match this node: expected role node and name {hostname:?}; issue a certificate for this hostname or set `hostname`"
    )]
    IdentityMismatch {
        /// Identity in the certificate.
        identity: String,
        /// This node's hostname.
        hostname: String,
    },
    /// Node facts (hostname, boot id) cannot be read.
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl AgentError {
    /// Whether restarting the agent unchanged could help (TLS files may still be being
    /// provisioned); configuration and identity problems need an operator.
    pub fn is_retriable(&self) -> bool {
        matches!(self, AgentError::Tls(_))
    }

    /// Process exit code: 64 (EX_USAGE) for configuration problems, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_) | AgentError::IdentityMismatch { .. } => 64,
            _ => 1,
        }
    }
}

/// Why one connection or report round failed; always followed by a reconnect.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("coordinator refused: {0}")]
    Refused(Refusal),
    #[error("cannot resolve coordinator address {addr}: {detail}")]
    Resolve { addr: String, detail: String },
    #[error("no answer to report {seq} within {timeout:?}")]
    ReplyTimeout { seq: u64, timeout: Duration },
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Tuning knobs that tests shorten.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Report reply timeout.
    pub reply_timeout: Duration,
    /// Goodbye budget.
    pub goodbye_timeout: Duration,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            backoff_initial: INITIAL_BACKOFF,
            backoff_max: MAX_BACKOFF,
            reply_timeout: REPLY_TIMEOUT,
            goodbye_timeout: GOODBYE_TIMEOUT,
        }
    }
}

/// What a finished run did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Reports the coordinator acknowledged.
    pub reports_acked: u64,
    /// Connections whose hello was accepted.
    pub connections: u64,
    /// The goodbye reason, if a goodbye was sent.
    pub goodbye: Option<GoodbyeReason>,
    /// Whether the coordinator acknowledged the goodbye.
    pub goodbye_acked: bool,
}

/// An accepted connection with its endpoint.
struct Link {
    endpoint: Endpoint,
    session: Session,
}

impl Link {
    async fn close(self, reason: &[u8]) {
        let Link {
            endpoint,
            mut session,
        } = self;
        let _ = session.send.finish();
        session.conn.close(0u32.into(), reason);
        let _ = tokio::time::timeout(CLOSE_LINGER, endpoint.wait_idle()).await;
    }
}

/// The agent: configuration, TLS material, checks and its systemd contacts.
pub struct Agent {
    cfg: Config,
    coordinator: CoordinatorConfig,
    tls: TlsMaterial,
    checker: Checker,
    notifier: Arc<dyn Notifier>,
    probe: Box<dyn ShutdownProbe>,
    opts: AgentOptions,
    seq: u64,
    summary: RunSummary,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("coordinator", &self.coordinator)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// `Some(output)` when `fut` finished, `None` when `stop` fired first.
async fn unless_stopped<T>(
    stop: &mut (impl Future<Output = ()> + Unpin),
    fut: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        _ = stop => None,
        v = fut => Some(v),
    }
}

impl Agent {
    /// Builds an agent: loads the TLS files and checks that the certificate names this node.
    pub fn new(
        cfg: Config,
        checker: Checker,
        notifier: Arc<dyn Notifier>,
        probe: Box<dyn ShutdownProbe>,
        opts: AgentOptions,
    ) -> Result<Self, AgentError> {
        let coordinator = cfg.require_coordinator()?.clone();
        let tls = TlsMaterial::load(&TlsFiles {
            ca: coordinator.ca.clone(),
            cert: coordinator.cert.clone(),
            key: coordinator.key.clone(),
        })
        .map_err(AgentError::Tls)?;
        let hostname = node::hostname(&cfg.root, cfg.hostname.as_deref())?;
        let id = tls.identity();
        if id.role != Role::Node || id.name != hostname {
            return Err(AgentError::IdentityMismatch {
                identity: id.to_string(),
                hostname,
            });
        }
        Ok(Self {
            cfg,
            coordinator,
            tls,
            checker,
            notifier,
            probe,
            opts,
            seq: 0,
            summary: RunSummary::default(),
        })
    }

    /// Sleeps `d`, pinging the watchdog often enough; `false` if `stop` fired.
    async fn pause(&self, d: Duration, stop: &mut (impl Future<Output = ()> + Unpin)) -> bool {
        let until = Instant::now() + d;
        loop {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            let slice = match self.notifier.watchdog_period() {
                Some(p) => (until - now).min(p),
                None => until - now,
            };
            if unless_stopped(stop, tokio::time::sleep(slice))
                .await
                .is_none()
            {
                return false;
            }
            self.notifier.watchdog();
        }
    }

    async fn resolve(&self) -> Result<Vec<SocketAddr>, RoundError> {
        let addr = &self.coordinator.address;
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr.as_str())
            .await
            .map_err(|e| RoundError::Resolve {
                addr: addr.clone(),
                detail: e.to_string(),
            })?
            .collect();
        if resolved.is_empty() {
            return Err(RoundError::Resolve {
                addr: addr.clone(),
                detail: "no addresses".into(),
            });
        }
        Ok(resolved)
    }

    /// Resolves the coordinator and connects to its addresses in turn.
    async fn connect(&self) -> Result<Link, RoundError> {
        let hello = node::hello(&self.cfg.root, self.cfg.hostname.as_deref())?;
        let mut last = None;
        for addr in self.resolve().await? {
            let endpoint = self.tls.client_endpoint(addr)?;
            match transport::connect(
                &endpoint,
                addr,
                &self.coordinator.server_name,
                Role::Coordinator,
                HelloBody::Agent(hello.clone()),
            )
            .await
            {
                Ok(session) => {
                    info!(coordinator = %addr, peer = %session.peer, "connected");
                    return Ok(Link { endpoint, session });
                }
                Err(TransportError::Refused(r)) => return Err(RoundError::Refused(r)),
                Err(e) => {
                    debug!(coordinator = %addr, error = %e, "connect attempt failed");
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one address was tried").into())
    }

    /// Runs the checks, sends one report and reads its ack.
    async fn report(&mut self, link: &mut Link) -> Result<(), RoundError> {
        let checks = self.checker.run().await;
        let boot_id = node::boot_id(&self.cfg.root)?;
        self.seq += 1;
        let seq = self.seq;
        let time_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let failing: Vec<String> = checks
            .iter()
            .filter(|c| c.status == protocol::messages::CheckStatus::Fail)
            .map(|c| format!("{}/{}", c.kind.as_str(), c.subject))
            .collect();
        let msg = AgentMessage::Report(HealthReport {
            seq,
            time_unix_ms,
            boot_id,
            checks,
        });
        transport::write_msg(&mut link.session.send, &msg, MAX_FRAME_LEN).await?;
        let reply = tokio::time::timeout(
            self.opts.reply_timeout,
            transport::expect_msg::<CoordinatorReply>(&mut link.session.recv, MAX_FRAME_LEN),
        )
        .await
        .map_err(|_| RoundError::ReplyTimeout {
            seq,
            timeout: self.opts.reply_timeout,
        })??;
        match reply {
            CoordinatorReply::Ack { seq: acked } => {
                if acked != seq {
                    warn!(
                        sent = seq,
                        acked, "coordinator acknowledged another sequence number"
                    );
                }
                debug!(seq, failing = ?failing, "report acknowledged");
                Ok(())
            }
            CoordinatorReply::Refused(r) => Err(RoundError::Refused(r)),
        }
    }

    fn log_round_error(&self, e: &RoundError, retry_in: Duration) {
        let refusal = match e {
            RoundError::Refused(r) | RoundError::Transport(TransportError::Refused(r)) => Some(r),
            _ => None,
        };
        match refusal {
            Some(r)
                if matches!(
                    r.code,
                    RefusalCode::IdentityMismatch | RefusalCode::NotAuthorized
                ) =>
            {
                error!(
                    code = ?r.code,
                    reason = %r.reason,
                    identity = %self.tls.identity(),
                    retry_in = ?retry_in,
                    "COORDINATOR REFUSED THIS NODE'S IDENTITY: reports are not being accepted; check the certificate, the hostname and the coordinator's inventory"
                );
            }
            Some(r) => {
                warn!(code = ?r.code, reason = %r.reason, retry_in = ?retry_in, "coordinator refused");
            }
            None => warn!(error = %e, retry_in = ?retry_in, "coordinator connection failed"),
        }
    }

    /// Reports until `stop` completes, then says goodbye. Never fails: connection problems
    /// are retried forever.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> RunSummary {
        let mut stop = std::pin::pin!(stop);
        let mut backoff = Backoff::new(self.opts.backoff_initial, self.opts.backoff_max);
        let mut link: Option<Link> = None;
        let mut ready = false;
        let interval = self.cfg.report_interval;
        self.notifier.status("connecting to coordinator");
        'run: loop {
            let l = match link.as_mut() {
                Some(l) => l,
                None => match unless_stopped(&mut stop, self.connect()).await {
                    None => break 'run,
                    Some(Ok(l)) => {
                        self.summary.connections += 1;
                        link.insert(l)
                    }
                    Some(Err(e)) => {
                        let d = backoff.next(rand::random::<f64>());
                        self.log_round_error(&e, d);
                        self.notifier.watchdog();
                        if !self.pause(d, &mut stop).await {
                            break 'run;
                        }
                        continue;
                    }
                },
            };
            let started = Instant::now();
            // A stop in the middle of a report abandons this stream (it may hold half a
            // frame); the goodbye then goes over a fresh connection.
            let outcome = {
                let round = self.report(l);
                tokio::select! {
                    biased;
                    _ = &mut stop => None,
                    r = round => Some(r),
                }
            };
            let outcome = match outcome {
                None => {
                    if let Some(l) = link.take() {
                        l.close(b"agent stopping").await;
                    }
                    break 'run;
                }
                Some(r) => r,
            };
            match outcome {
                Ok(()) => {
                    self.summary.reports_acked += 1;
                    backoff.reset();
                    if !ready {
                        ready = true;
                        self.notifier.ready();
                        info!(seq = self.seq, "first report accepted");
                    }
                    self.notifier.status("reporting");
                    self.notifier.watchdog();
                    let next = started + interval;
                    if !self
                        .pause(next.saturating_duration_since(Instant::now()), &mut stop)
                        .await
                    {
                        break 'run;
                    }
                }
                Err(e) => {
                    if let Some(l) = link.take() {
                        l.close(b"report failed").await;
                    }
                    let d = backoff.next(rand::random::<f64>());
                    self.log_round_error(&e, d);
                    self.notifier.status("reconnecting to coordinator");
                    self.notifier.watchdog();
                    if !self.pause(d, &mut stop).await {
                        break 'run;
                    }
                }
            }
        }
        self.goodbye(link).await;
        self.summary
    }

    async fn goodbye(&mut self, link: Option<Link>) {
        self.notifier.stopping();
        let reason = self.probe.reason().await;
        info!(reason = ?reason, "stopping; saying goodbye to the coordinator");
        self.summary.goodbye = Some(reason);
        let work = async {
            let mut l = match link {
                Some(l) => l,
                None => self.connect().await?,
            };
            let msg = AgentMessage::Goodbye(Goodbye { reason });
            transport::write_msg(&mut l.session.send, &msg, MAX_FRAME_LEN).await?;
            let reply =
                transport::expect_msg::<CoordinatorReply>(&mut l.session.recv, MAX_FRAME_LEN)
                    .await?;
            l.close(b"goodbye").await;
            Ok::<_, RoundError>(reply)
        };
        match tokio::time::timeout(self.opts.goodbye_timeout, work).await {
            Ok(Ok(CoordinatorReply::Ack { .. })) => {
                self.summary.goodbye_acked = true;
                info!("goodbye acknowledged");
            }
            Ok(Ok(CoordinatorReply::Refused(r))) => warn!(reason = %r, "goodbye refused"),
            Ok(Err(e)) => warn!(error = %e, "goodbye not delivered"),
            Err(_) => warn!(timeout = ?self.opts.goodbye_timeout, "goodbye not delivered in time"),
        }
    }
}
