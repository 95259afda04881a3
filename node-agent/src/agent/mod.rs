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
//! While connected, the coordinator may open action streams on the same connection
//! ([`crate::actions`]); a reboot it asks for ends the round like a stop, with a goodbye
//! saying reboot, after which the reboot command runs and the agent carries on (until the
//! system stops it).
//!
//! A reload request (SIGHUP, see [`crate::reload`]) is taken between reports: the new
//! settings apply from the next report, a changed coordinator reconnects at once, a changed
//! report interval ends the wait at once (the report sent then tells the coordinator the
//! new interval, and the next is due one new interval later), and settings that cannot be
//! applied are refused as a whole with an error log.
//!
//! Every report carries the agent's interval, on which the coordinator judges the machine's
//! silence. A coordinator from before that field refuses such a report as malformed; the
//! agent then reports without it on its next connection (and tries again after any other
//! failure, so an upgraded coordinator learns it).
//!
//! Every network step is bounded by a timeout, and the watchdog is pinged between steps,
//! while waiting and during a step (connecting, reporting) up to [`STEP_LIMIT`], so a hung
//! agent is restarted by systemd but a coordinator outage is not mistaken for one. This module does not decide what is healthy (see `checks`) nor
//! what the coordinator does with reports.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::frame::MAX_FRAME_LEN;
use protocol::messages::{
    AgentMessage, CoordinatorReply, Goodbye, GoodbyeReason, HealthReport, RefusalCode,
};
use protocol::transport::{self, Session, TlsFiles, TlsMaterial};
use quinn::Endpoint;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, warn};

use crate::actions::{self, ActionServer, RebootOrder};
use crate::backoff::{Backoff, INITIAL_BACKOFF, MAX_BACKOFF};
use crate::checks::Checker;
use crate::config::{Config, CoordinatorConfig};
use crate::node;
use crate::reload::{self, Reloads};
use crate::systemd::{Notifier, STEP_LIMIT, ShutdownProbe, pinging};

mod certs;
mod connect;
mod endpoint;
pub(crate) mod error;
pub mod preflight;
mod report_form;

use report_form::{ReportForm, Shaped};

use error::RoundError;
pub use error::{AgentError, ForeignCertificate, check_own_chain};

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
    /// One span per connection, so every report's log lines name the coordinator.
    span: tracing::Span,
    /// The configured coordinator (`host:port`) it connected to.
    target: String,
}

impl Link {
    async fn close(self, reason: &[u8]) {
        let Link {
            endpoint,
            mut session,
            ..
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
    /// Last STATUS sent, so it is sent on change only (one datagram less per cycle).
    status: &'static str,
    /// Reload requests, when the binary handles SIGHUP.
    reloads: Option<Reloads>,
    /// A reload changed the coordinator: drop the connection after this pause.
    reconnect: bool,
    /// Serves the coordinator's action requests on every connection.
    actions: Arc<ActionServer>,
    /// Reboots the action server asks for.
    reboot_orders: tokio::sync::mpsc::UnboundedReceiver<RebootOrder>,
    /// The reboot this round ends for.
    reboot: Option<RebootOrder>,
    /// Times the waits between reports and before reconnects.
    alarm: crate::timer::Alarm,
    /// The boot id sent with every report.
    boot_id: node::BootIdFile,
    /// What the coordinator refused of this release's reports as malformed (a release from
    /// before them): reports leave it out until a connection fails for another reason.
    form: ReportForm,
    /// The last report sent in the full form held a plugin, gpu or memory result.
    sent_newer_kinds: bool,
    /// The client endpoint of each address family (IPv4, IPv6), made at the first connect and
    /// kept for the agent's life; see [`Agent::client_endpoint`].
    endpoints: std::sync::Mutex<[Option<Endpoint>; 2]>,
    /// What the connect rounds learnt about the coordinators ([`connect::Route`]).
    route: std::sync::Mutex<connect::Route>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("coordinator", &self.coordinator)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// Completes on the next reload request; never without a request source.
async fn next_reload(reloads: &mut Option<Reloads>) {
    match reloads {
        Some(r) => {
            if r.requests.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
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
        let preflight::Preflight {
            coordinator, tls, ..
        } = preflight::preflight(&cfg)?;
        certs::warn_if_expiring(&tls, &coordinator.cert);
        let (orders, reboot_orders) = tokio::sync::mpsc::unbounded_channel();
        let actions = Arc::new(ActionServer::new(
            cfg.actions.clone(),
            cfg.root.clone(),
            orders,
        ));
        Ok(Self {
            actions,
            reboot_orders,
            reboot: None,
            alarm: crate::timer::Alarm::default(),
            boot_id: node::BootIdFile::new(&cfg.root),
            cfg,
            coordinator,
            tls,
            checker,
            notifier,
            probe,
            opts,
            seq: 0,
            summary: RunSummary::default(),
            status: "",
            reloads: None,
            reconnect: false,
            form: ReportForm::Full,
            sent_newer_kinds: false,
            endpoints: std::sync::Mutex::new([None, None]),
            route: std::sync::Mutex::default(),
        })
    }

    /// Takes reload requests from `reloads` while running.
    pub fn with_reloads(mut self, reloads: Reloads) -> Self {
        self.reloads = Some(reloads);
        self
    }

    /// Reads the configuration and TLS files again and applies them, or keeps the running
    /// ones (error log) when they cannot be applied. True when the report interval changed.
    fn reload(&mut self) -> bool {
        let Some(r) = &self.reloads else {
            return false;
        };
        let prepared = (r.load)()
            .map_err(reload::ReloadError::from)
            .and_then(|new| reload::prepare(&self.cfg, &self.tls, new));
        match prepared {
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running configuration and TLS files");
                false
            }
            Ok(r) => {
                let interval_changed = r.cfg.report_interval != self.cfg.report_interval;
                if r.checks_changed {
                    self.checker = Checker::new(&r.cfg);
                }
                self.reconnect |= r.reconnect;
                self.coordinator = r
                    .cfg
                    .require_coordinator()
                    .cloned()
                    .unwrap_or_else(|_| self.coordinator.clone());
                self.actions.set_config(r.cfg.actions.clone());
                self.boot_id = node::BootIdFile::new(&r.cfg.root);
                self.cfg = r.cfg;
                self.tls = r.tls;
                info!(changed = ?r.changed, "configuration and TLS files reloaded");
                certs::warn_if_expiring(&self.tls, &self.coordinator.cert);
                interval_changed
            }
        }
    }

    fn set_status(&mut self, status: &'static str) {
        if self.status != status {
            self.status = status;
            self.notifier.status(status);
        }
    }

    /// Sleeps `d`, pinging the watchdog often enough and taking reload requests; `false`
    /// if `stop` fired. A reload that changes the report interval ends the sleep early: the
    /// agent reports (or reconnects) at once, so the coordinator hears the new interval
    /// before the agent waits it out, and an old, longer wait is never slept to its end.
    async fn pause(&mut self, d: Duration, stop: &mut (impl Future<Output = ()> + Unpin)) -> bool {
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
            let reload_requested = tokio::select! {
                biased;
                _ = &mut *stop => return false,
                Some(order) = self.reboot_orders.recv() => {
                    self.reboot = Some(order);
                    return false;
                }
                _ = next_reload(&mut self.reloads) => true,
                _ = self.alarm.sleep(slice) => false,
            };
            if reload_requested {
                if self.reload() {
                    return true;
                }
            } else {
                self.notifier.watchdog();
            }
        }
    }

    /// Re-reads the TLS files before a reconnect, so a renewed certificate is used without
    /// restarting the agent. Unreadable files or a certificate naming someone else keep the
    /// material already loaded (with a warning): a half-written renewal must not take the
    /// node off the air.
    fn reload_tls(&mut self) {
        let files = TlsFiles {
            ca: self.coordinator.ca.clone(),
            cert: self.coordinator.cert.clone(),
            key: self.coordinator.key.clone(),
        };
        match TlsMaterial::load(&files) {
            Ok(tls) if tls.identity() == self.tls.identity() => self.tls = tls,
            Ok(tls) => warn!(
                loaded = %tls.identity(),
                keeping = %self.tls.identity(),
                "certificate file now names another identity; keeping the previous certificate"
            ),
            Err(e) => warn!(error = %e, "cannot reload TLS files; keeping the previous ones"),
        }
    }

    /// Runs the checks, sends one report and reads its ack.
    async fn report(&mut self, link: &mut Link) -> Result<(), RoundError> {
        let checks = self.checker.run().await;
        self.actions.set_checks(&checks);
        let boot_id = self.boot_id.read()?;
        self.seq += 1;
        let seq = self.seq;
        let time_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let failing = checks
            .iter()
            .filter(|c| c.status == protocol::messages::CheckStatus::Fail)
            .count();
        let msg = AgentMessage::Report(HealthReport {
            seq,
            time_unix_ms,
            boot_id,
            checks,
            report_interval_ms: u64::try_from(self.cfg.report_interval.as_millis())
                .unwrap_or(u64::MAX),
        });
        self.sent_newer_kinds = self.form == ReportForm::Full
            && matches!(&msg, AgentMessage::Report(r) if r.has_newer_kinds());
        match self.form.shape(msg) {
            Shaped::Current(msg) => {
                transport::write_msg(&mut link.session.send, &msg, MAX_FRAME_LEN).await?;
            }
            Shaped::V1(old) => {
                transport::write_msg(&mut link.session.send, &old, MAX_FRAME_LEN).await?;
            }
        }
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
                debug!(seq, failing, "report acknowledged");
                Ok(())
            }
            CoordinatorReply::Refused(r) => Err(RoundError::Refused(r)),
        }
    }

    /// Reports until `stop` completes, then says goodbye. Never fails: connection problems
    /// are retried forever.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> RunSummary {
        let mut stop = std::pin::pin!(stop);
        let mut backoff = Backoff::new(self.opts.backoff_initial, self.opts.backoff_max);
        let mut ready = false;
        // Ready once started: configuration, TLS files and identity are checked (`new`), and
        // the agent now reports, or retries until it can. Waiting for the coordinator here
        // would make `systemctl start` (and a serial rollout, and every boot) hang while the
        // coordinator is away; its acceptance shows in the status line and the log instead.
        self.set_status("connecting to coordinator");
        self.notifier.ready();
        loop {
            let link = self.rounds(&mut stop, &mut backoff, &mut ready).await;
            self.goodbye(link).await;
            match self.reboot.take() {
                Some(order) => {
                    if !self.run_reboot(order, &mut stop).await {
                        break;
                    }
                }
                None => break,
            }
        }
        self.summary
    }

    /// Runs the reboot command after the goodbye and records its outcome; the agent then
    /// reconnects (a real reboot stops it soon; the coordinator waits for a new boot id).
    /// `false` when `stop` fired meanwhile: during a real reboot that is the shutdown
    /// stopping the agent, which must end at once rather than hold the shutdown for the
    /// command's time limit. The command is then killed (its reboot, if it asked for one,
    /// is already under way), the id stays recorded, and the goodbye was said.
    async fn run_reboot(
        &mut self,
        order: RebootOrder,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> bool {
        let cfg = self.actions.config();
        info!(id = %order.id, command = %cfg.reboot_command.join(" "), "rebooting as the coordinator asked");
        // Boxed: the command's future, awaited through `pinging` and `unless_stopped` (which
        // each hold it more than once), would otherwise make the agent's whole future, built
        // on the main thread's stack, several times its size (docs/benchmarks.md).
        let run = Box::pin(actions::exec::run(
            &cfg.reboot_command,
            cfg.command_timeout,
            2048,
        ));
        let notifier = self.notifier.clone();
        let Some(ran) = unless_stopped(stop, pinging(&*notifier, STEP_LIMIT, run)).await else {
            info!(id = %order.id, "stopped while the reboot command ran; not waiting for it");
            self.actions.reboot_interrupted(&order.id);
            return false;
        };
        let status =
            actions::command_status("reboot", &cfg.reboot_command, cfg.command_timeout, ran);
        if let protocol::actions::ActionStatus::Failed { detail, .. } = &status {
            error!(id = %order.id, %detail, "reboot command failed; carrying on");
        }
        self.actions.reboot_finished(&order.id, status);
        self.notifier.watchdog();
        true
    }

    /// Connects and reports until `stop` completes or a reboot is ordered; returns the
    /// connection, if any, for the goodbye.
    async fn rounds(
        &mut self,
        stop: &mut (impl Future<Output = ()> + Unpin),
        backoff: &mut Backoff,
        ready: &mut bool,
    ) -> Option<Link> {
        let mut link: Option<Link> = None;
        'run: loop {
            if link.is_none() {
                if self.summary.connections > 0 || backoff.attempts() > 0 {
                    self.reload_tls();
                }
                // Boxed, as the reboot command is: only while connecting, not in every
                // round's future (see `run_reboot`).
                let connect = pinging(&*self.notifier, STEP_LIMIT, Box::pin(self.connect()));
                match unless_stopped(&mut *stop, connect).await {
                    None => break 'run,
                    Some(Ok(l)) => {
                        self.summary.connections += 1;
                        link = Some(l);
                    }
                    Some(Err(e)) => {
                        // Only standbys answered: a takeover is under way; ask again soon.
                        let jitter = rand::random::<f64>();
                        let d = self
                            .standby_wait(jitter)
                            .unwrap_or_else(|| backoff.next(jitter));
                        e.log(d, self.tls.identity());
                        self.notifier.watchdog();
                        if !self.pause(d, &mut *stop).await {
                            break 'run;
                        }
                        continue;
                    }
                }
            }
            let l = link.as_mut().expect("connected above");
            let started = Instant::now();
            let grace = self.opts.goodbye_timeout / 2;
            let mut stopping = false;
            let outcome = {
                let span = l.span.clone();
                let notifier = self.notifier.clone();
                let round = pinging(&*notifier, STEP_LIMIT, self.report(l).instrument(span));
                let mut round = std::pin::pin!(round);
                tokio::select! {
                    biased;
                    _ = &mut *stop => {
                        // Let the report in flight finish briefly so the goodbye can use
                        // this connection; a stream abandoned mid-frame cannot be reused.
                        stopping = true;
                        tokio::time::timeout(grace, &mut round).await.ok()
                    }
                    r = &mut round => Some(r),
                }
            };
            if stopping {
                match outcome {
                    Some(Ok(())) => self.summary.reports_acked += 1,
                    _ => {
                        if let Some(l) = link.take() {
                            l.close(b"agent stopping").await;
                        }
                    }
                }
                break 'run;
            }
            let outcome = outcome.expect("a report outcome when not stopping");
            match outcome {
                Ok(()) => {
                    self.summary.reports_acked += 1;
                    backoff.reset();
                    if !*ready {
                        *ready = true;
                        info!(seq = self.seq, "first report accepted");
                    }
                    self.set_status("reporting");
                    self.notifier.watchdog();
                    let next = started + self.cfg.report_interval;
                    if !self
                        .pause(next.saturating_duration_since(Instant::now()), &mut *stop)
                        .await
                    {
                        break 'run;
                    }
                    if std::mem::take(&mut self.reconnect)
                        && let Some(l) = link.take()
                    {
                        info!("coordinator or certificate changed; reconnecting");
                        l.close(b"agent reconnecting").await;
                    }
                }
                Err(e) => {
                    if let Some(l) = link.take() {
                        // Its coordinator may be dead: the next round tries the others first.
                        self.route
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .lost(&l.target);
                        l.close(b"report failed").await;
                    }
                    self.note_failed_report(&e);
                    let d = backoff.next(rand::random::<f64>());
                    e.log(d, self.tls.identity());
                    self.set_status("reconnecting to coordinator");
                    self.notifier.watchdog();
                    if !self.pause(d, &mut *stop).await {
                        break 'run;
                    }
                }
            }
        }
        link
    }

    /// After a failed report: a refusal as malformed is a coordinator from before a part of
    /// this release's reports. The next reports leave out the newer check kinds first (when
    /// the refused one had any), then the report interval too; any other failure tries the
    /// full form again on the next connection.
    fn note_failed_report(&mut self, e: &RoundError) {
        let malformed = matches!(e, RoundError::Refused(r) if r.code == RefusalCode::Malformed);
        if !malformed {
            self.form = ReportForm::Full;
            return;
        }
        let next = match self.form {
            ReportForm::Full if self.sent_newer_kinds => ReportForm::WithoutNewerKinds,
            _ => ReportForm::V1,
        };
        if next != self.form {
            match next {
                ReportForm::WithoutNewerKinds => warn!(
                    "the coordinator cannot read plugin, gpu or memory check results (a release \
                     from before them?); reporting without them, so it does not see those \
                     checks: upgrade the coordinator"
                ),
                _ => warn!(
                    "the coordinator cannot read reports that carry the report interval (a \
                     release from before it?); reporting without it, so the coordinator judges \
                     this machine on its own [health] report_interval: upgrade the coordinator"
                ),
            }
        }
        self.form = next;
    }

    async fn goodbye(&mut self, link: Option<Link>) {
        let reason = if self.reboot.is_some() {
            GoodbyeReason::Reboot
        } else {
            self.notifier.stopping();
            self.probe.reason().await
        };
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

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};

    use protocol::identity::Role;
    use protocol::messages::{AgentHello, CheckKind, CheckStatus, HelloBody, Refusal};
    use protocol::pki::{Ca, IssueOptions};
    use protocol::transport::{accept_hello, read_payload, write_msg};
    use tokio::sync::{mpsc, oneshot};

    use super::*;
    use crate::config::Settings;
    use crate::systemd::SystemdShutdownProbe;
    use crate::testkit_fixture::{AgentConfig, NodeFixture};

    /// Every wait in these tests is bounded by this.
    const WAIT: Duration = Duration::from_secs(20);

    /// Records notifications; asks for watchdog pings every 20 ms.
    #[derive(Default)]
    struct FakeNotifier {
        ready: AtomicU64,
        watchdog: AtomicU64,
        stopping: AtomicU64,
        statuses: std::sync::Mutex<Vec<String>>,
    }

    impl Notifier for FakeNotifier {
        fn ready(&self) {
            self.ready.fetch_add(1, Ordering::SeqCst);
        }
        fn watchdog(&self) {
            self.watchdog.fetch_add(1, Ordering::SeqCst);
        }
        fn watchdog_period(&self) -> Option<Duration> {
            Some(Duration::from_millis(20))
        }
        fn status(&self, s: &str) {
            self.statuses.lock().unwrap().push(s.to_string());
        }
        fn stopping(&self) {
            self.stopping.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[derive(Debug)]
    enum Event {
        HelloRefused,
        /// The hello, the DER of the client certificate that came with it, and the address
        /// it came from.
        Hello(AgentHello, Vec<u8>, SocketAddr),
        Report(HealthReport),
        ReportRefused(u64),
        Goodbye(GoodbyeReason),
    }

    /// How the coordinator stand-in behaves.
    #[derive(Clone, Copy, Default)]
    struct Script {
        /// Refuse this many hellos (identity mismatch) before accepting.
        refuse_hellos: usize,
        /// Refuse the report with this sequence number (the connection is then closed).
        refuse_report: Option<u64>,
        /// Be a coordinator from before report intervals: a report carrying one does not
        /// decode there and is refused as malformed.
        before_intervals: bool,
        /// Be a coordinator from before the plugin, gpu and memory checks: a report holding
        /// one does not decode there and is refused as malformed.
        before_newer_kinds: bool,
    }

    struct Pki {
        authority: Ca,
        dir: tempfile::TempDir,
        ca: std::path::PathBuf,
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        server: TlsMaterial,
    }

    fn pki(node: &str) -> Pki {
        let ca = Ca::generate("test.local").unwrap();
        let coord = ca
            .issue(
                Role::Coordinator,
                "coord",
                &IssueOptions {
                    ips: vec!["127.0.0.1".parse().unwrap()],
                    ..Default::default()
                },
            )
            .unwrap();
        let n = ca
            .issue(Role::Node, node, &IssueOptions::default())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = n.write(dir.path(), false).unwrap();
        let ca_path = dir.path().join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).unwrap();
        let server = coord.tls_material(ca.cert_pem().as_bytes()).unwrap();
        Pki {
            authority: ca,
            dir,
            ca: ca_path,
            cert,
            key,
            server,
        }
    }

    /// A tiny coordinator: accept_hello → accept → read reports → ack.
    fn coordinator(
        tls: &TlsMaterial,
        script: Script,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<Event>, Endpoint) {
        let ep = tls.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = ep.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let server = ep.clone();
        tokio::spawn(async move {
            let mut hellos = 0;
            while let Some(inc) = server.accept().await {
                let Ok(pending) = accept_hello(inc, "test.local").await else {
                    continue;
                };
                hellos += 1;
                if hellos <= script.refuse_hellos {
                    let _ = tx.send(Event::HelloRefused);
                    pending
                        .refuse(Refusal::new(
                            RefusalCode::IdentityMismatch,
                            "test coordinator refuses this hello",
                        ))
                        .await;
                    continue;
                }
                let HelloBody::Agent(h) = pending.hello.clone() else {
                    continue;
                };
                let der = pending
                    .conn
                    .peer_identity()
                    .and_then(|a| {
                        a.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
                            .ok()
                    })
                    .and_then(|c| c.first().map(|c| c.to_vec()))
                    .unwrap_or_default();
                let _ = tx.send(Event::Hello(h, der, pending.conn.remote_address()));
                let Ok(mut s) = pending.accept("coord").await else {
                    continue;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(Some(payload)) = read_payload(&mut s.recv, MAX_FRAME_LEN).await {
                        // A coordinator from before report intervals reads the old form
                        // only; this release reads either.
                        let old = protocol::decode_payload::<protocol::messages::v1::AgentMessage>(
                            &payload,
                        );
                        let Ok(msg) = protocol::messages::decode_agent_message(&payload) else {
                            return;
                        };
                        let reply = match msg {
                            AgentMessage::Report(r)
                                if Some(r.seq) == script.refuse_report
                                    || (script.before_intervals && old.is_err())
                                    || (script.before_newer_kinds && r.has_newer_kinds()) =>
                            {
                                let _ = tx.send(Event::ReportRefused(r.seq));
                                let refusal = CoordinatorReply::Refused(
                                    if script.before_intervals || script.before_newer_kinds {
                                        Refusal::new(
                                            RefusalCode::Malformed,
                                            "agent message: trailing bytes",
                                        )
                                    } else {
                                        Refusal::new(
                                            RefusalCode::BadRequest,
                                            "test refuses this report",
                                        )
                                    },
                                );
                                let _ = write_msg(&mut s.send, &refusal, MAX_FRAME_LEN).await;
                                let _ = s.send.finish();
                                let _ = tokio::time::timeout(WAIT, s.send.stopped()).await;
                                s.conn.close(1u32.into(), b"refused");
                                return;
                            }
                            AgentMessage::Report(r) => {
                                let seq = r.seq;
                                let _ = tx.send(Event::Report(r));
                                CoordinatorReply::Ack { seq }
                            }
                            AgentMessage::Goodbye(g) => {
                                let _ = tx.send(Event::Goodbye(g.reason));
                                CoordinatorReply::Ack { seq: 0 }
                            }
                        };
                        if write_msg(&mut s.send, &reply, MAX_FRAME_LEN).await.is_err() {
                            return;
                        }
                    }
                    s.conn.closed().await;
                });
            }
        });
        (addr, rx, ep)
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("coordinator stand-in saw nothing in time")
            .expect("coordinator stand-in stopped")
    }

    fn test_opts() -> AgentOptions {
        AgentOptions {
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
            reply_timeout: Duration::from_secs(5),
            goodbye_timeout: Duration::from_secs(2),
        }
    }

    struct Running {
        stop: oneshot::Sender<()>,
        handle: tokio::task::JoinHandle<RunSummary>,
        notifier: Arc<FakeNotifier>,
    }

    #[test]
    fn a_reload_reconnects_for_a_renewed_certificate_or_a_new_coordinator_only() {
        let pki = pki("node-1");
        let fx = NodeFixture::builder("node-1").build().unwrap();
        let load = |addr: &str| {
            let path = fx
                .write_agent_config(&AgentConfig::new(addr, &pki.ca, &pki.cert, &pki.key))
                .unwrap();
            Config::load(&Settings {
                config: Some(path),
                ..Settings::default()
            })
            .unwrap()
        };
        let files = TlsFiles {
            ca: pki.ca.clone(),
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        };
        let running = load("127.0.0.1:7443");
        let tls = TlsMaterial::load(&files).unwrap();

        let same = reload::prepare(&running, &tls, load("127.0.0.1:7443")).unwrap();
        assert!(!same.reconnect);
        assert!(same.changed.is_empty(), "{:?}", same.changed);

        let moved = reload::prepare(&running, &tls, load("127.0.0.1:7444")).unwrap();
        assert!(moved.reconnect);
        assert_eq!(moved.changed, ["coordinator"]);

        // The same files, a new certificate in them.
        let renewed = pki
            .authority
            .issue(Role::Node, "node-1", &IssueOptions::default())
            .unwrap();
        std::fs::write(&pki.cert, &renewed.cert_pem).unwrap();
        std::fs::write(&pki.key, &renewed.key_pem).unwrap();
        let r = reload::prepare(&running, &tls, load("127.0.0.1:7443")).unwrap();
        assert!(r.reconnect, "a renewed certificate reconnects");
        assert_eq!(r.changed, ["tls files"]);
    }

    #[test]
    fn a_reload_that_changes_only_the_actions_says_so() {
        let pki = pki("node-1");
        let fx = NodeFixture::builder("node-1").build().unwrap();
        let path = fx
            .write_agent_config(&AgentConfig::new(
                "127.0.0.1:7443",
                &pki.ca,
                &pki.cert,
                &pki.key,
            ))
            .unwrap();
        let load = || {
            Config::load(&Settings {
                config: Some(path.clone()),
                ..Settings::default()
            })
            .unwrap()
        };
        let running = load();
        let tls = TlsMaterial::load(&TlsFiles {
            ca: pki.ca.clone(),
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        })
        .unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("\n[actions]\nrestart_command = [\"/usr/local/bin/restart-unit\"]\n");
        std::fs::write(&path, text).unwrap();
        let r = reload::prepare(&running, &tls, load()).unwrap();
        assert_eq!(r.changed, ["actions"]);
        assert!(!r.reconnect && !r.checks_changed);
        assert_eq!(
            r.cfg.actions.restart_command,
            ["/usr/local/bin/restart-unit"]
        );
    }

    #[test]
    fn a_reload_refuses_a_certificate_of_another_ca_as_the_start_does() {
        let pki = pki("node-1");
        let fx = NodeFixture::builder("node-1").build().unwrap();
        let load = || {
            let path = fx
                .write_agent_config(&AgentConfig::new(
                    "127.0.0.1:7443",
                    &pki.ca,
                    &pki.cert,
                    &pki.key,
                ))
                .unwrap();
            Config::load(&Settings {
                config: Some(path),
                ..Settings::default()
            })
            .unwrap()
        };
        let running = load();
        let tls = TlsMaterial::load(&TlsFiles {
            ca: pki.ca.clone(),
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        })
        .unwrap();
        // This node's name, issued by another fleet's CA, into the same files.
        let foreign = Ca::generate("test.local")
            .unwrap()
            .issue(Role::Node, "node-1", &IssueOptions::default())
            .unwrap();
        std::fs::write(&pki.cert, &foreign.cert_pem).unwrap();
        std::fs::write(&pki.key, &foreign.key_pem).unwrap();
        let e = reload::prepare(&running, &tls, load()).unwrap_err();
        assert!(
            matches!(e, reload::ReloadError::ForeignCertificate(_)),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "{} is not valid under the CA {}",
                pki.cert.display(),
                pki.ca.display()
            )),
            "{msg}"
        );
        // The start refuses the same files.
        let e = Agent::new(
            running.clone(),
            Checker::new(&running),
            Arc::new(FakeNotifier::default()),
            Box::new(SystemdShutdownProbe::new(running.root.clone())),
            test_opts(),
        )
        .unwrap_err();
        assert!(matches!(e, AgentError::ForeignCertificate(_)), "{e}");
    }

    fn start_agent(fx: &NodeFixture, pki: &Pki, addr: SocketAddr) -> Running {
        start_agent_with(fx, pki, addr, Duration::from_millis(100), None)
    }

    /// Writes the agent's configuration with `interval` into the fixture and starts it,
    /// taking reload requests from `reloads` when given (each re-reads that file).
    fn start_agent_with(
        fx: &NodeFixture,
        pki: &Pki,
        addr: SocketAddr,
        interval: Duration,
        reloads: Option<mpsc::UnboundedReceiver<()>>,
    ) -> Running {
        let path = fx
            .write_agent_config(
                &AgentConfig::new(&addr.to_string(), &pki.ca, &pki.cert, &pki.key)
                    .report_interval(interval),
            )
            .unwrap();
        run_agent_at(path, reloads)
    }

    /// Starts an agent on the configuration file at `path`.
    fn run_agent_at(
        path: std::path::PathBuf,
        reloads: Option<mpsc::UnboundedReceiver<()>>,
    ) -> Running {
        let settings = Settings {
            config: Some(path),
            ..Settings::default()
        };
        let cfg = Config::load(&settings).unwrap();
        let notifier = Arc::new(FakeNotifier::default());
        let mut agent = Agent::new(
            cfg.clone(),
            Checker::new(&cfg),
            notifier.clone(),
            Box::new(SystemdShutdownProbe::new(cfg.root.clone())),
            test_opts(),
        )
        .unwrap();
        if let Some(requests) = reloads {
            agent = agent.with_reloads(Reloads {
                requests,
                load: Box::new(move || Config::load(&settings)),
            });
        }
        let (stop, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(agent.run(async move {
            let _ = rx.await;
        }));
        Running {
            stop,
            handle,
            notifier,
        }
    }

    async fn finish(r: Running) -> (RunSummary, Arc<FakeNotifier>) {
        let _ = r.stop.send(());
        let s = tokio::time::timeout(WAIT, r.handle)
            .await
            .expect("agent did not stop in time")
            .unwrap();
        (s, r.notifier)
    }

    #[tokio::test]
    async fn reports_arrive_refusal_is_retried_and_goodbye_is_sent() {
        let pki = pki("node-1");
        let fx = NodeFixture::builder("node-1")
            .nic("eth0")
            .mount("/var")
            .address("10.9.0.1".parse().unwrap())
            .build()
            .unwrap();
        let (addr, mut rx, _ep) = coordinator(
            &pki.server,
            Script {
                refuse_hellos: 1,
                ..Script::default()
            },
        );
        let agent = start_agent(&fx, &pki, addr);

        assert!(matches!(next(&mut rx).await, Event::HelloRefused));
        match next(&mut rx).await {
            Event::Hello(h, _, _) => {
                assert_eq!(h.hostname, "node-1");
                assert_eq!(h.boot_id, fx.boot_id());
                assert_eq!(
                    h.addresses,
                    vec!["10.9.0.1".parse::<std::net::IpAddr>().unwrap()]
                );
            }
            other => panic!("expected hello, got {other:?}"),
        }
        for want in 1..=3 {
            match next(&mut rx).await {
                Event::Report(r) => {
                    assert_eq!(r.seq, want);
                    assert_eq!(r.boot_id, fx.boot_id());
                    assert!(r.all_ok(), "{r:?}");
                    let kinds: Vec<CheckKind> = r.checks.iter().map(|c| c.kind).collect();
                    assert_eq!(kinds, [CheckKind::Nic, CheckKind::Disk, CheckKind::Kdump]);
                }
                other => panic!("expected report {want}, got {other:?}"),
            }
        }
        assert_eq!(agent.notifier.ready.load(Ordering::SeqCst), 1);

        // Break the NIC: a later report names it.
        fx.set_carrier("eth0", false).unwrap();
        loop {
            match next(&mut rx).await {
                Event::Report(r) if !r.all_ok() => {
                    let f: Vec<_> = r.failing().collect();
                    assert_eq!(f.len(), 1);
                    assert_eq!((f[0].kind, f[0].subject.as_str()), (CheckKind::Nic, "eth0"));
                    assert_eq!(f[0].status, CheckStatus::Fail);
                    break;
                }
                Event::Report(_) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }

        fx.schedule_shutdown(true).unwrap();
        let (summary, notifier) = finish(agent).await;
        loop {
            match next(&mut rx).await {
                Event::Goodbye(reason) => {
                    assert_eq!(reason, GoodbyeReason::Shutdown);
                    break;
                }
                Event::Report(_) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(summary.goodbye, Some(GoodbyeReason::Shutdown));
        assert!(summary.goodbye_acked, "{summary:?}");
        assert_eq!(summary.connections, 1);
        assert!(summary.reports_acked >= 4, "{summary:?}");
        assert_eq!(notifier.ready.load(Ordering::SeqCst), 1);
        assert_eq!(notifier.stopping.load(Ordering::SeqCst), 1);
        // STATUS only on change, not every cycle.
        assert_eq!(
            *notifier.statuses.lock().unwrap(),
            ["connecting to coordinator", "reporting"]
        );
        assert!(notifier.watchdog.load(Ordering::SeqCst) >= 4);
    }

    /// The next report, skipping nothing else: a hello or a refusal here is a failure.
    async fn next_report(rx: &mut mpsc::UnboundedReceiver<Event>) -> HealthReport {
        match next(rx).await {
            Event::Report(r) => r,
            other => panic!("expected a report, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_reload_that_changes_the_interval_reports_at_once_carrying_it() {
        let pki = pki("node-6");
        let fx = NodeFixture::builder("node-6").build().unwrap();
        let (addr, mut rx, _ep) = coordinator(&pki.server, Script::default());
        let (hup, reloads) = mpsc::unbounded_channel();
        let agent = start_agent_with(&fx, &pki, addr, Duration::from_secs(5), Some(reloads));
        assert!(matches!(next(&mut rx).await, Event::Hello(..)));
        let first = next_report(&mut rx).await;
        assert_eq!(
            first.report_interval_ms, 5_000,
            "every report says the interval"
        );
        // 5 s → 300 ms: the report comes at once (not after the 5 s wait already begun)
        // and says 300 ms; the next one 300 ms later.
        let interval = |ms| {
            AgentConfig::new(&addr.to_string(), &pki.ca, &pki.cert, &pki.key)
                .report_interval(Duration::from_millis(ms))
        };
        fx.write_agent_config(&interval(300)).unwrap();
        let asked = Instant::now();
        hup.send(()).unwrap();
        let r = next_report(&mut rx).await;
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!((r.seq, r.report_interval_ms), (2, 300));
        let r = next_report(&mut rx).await;
        assert_eq!((r.seq, r.report_interval_ms), (3, 300));
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{:?}",
            asked.elapsed()
        );
        // Longer again: the coordinator hears the new interval before the agent waits it.
        fx.write_agent_config(&interval(20_000)).unwrap();
        let asked = Instant::now();
        hup.send(()).unwrap();
        let r = next_report(&mut rx).await;
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(r.report_interval_ms, 20_000);
        finish(agent).await;
    }

    #[tokio::test]
    async fn a_coordinator_from_before_intervals_gets_reports_without_one() {
        let pki = pki("node-7");
        let fx = NodeFixture::builder("node-7").build().unwrap();
        let script = Script {
            before_intervals: true,
            ..Script::default()
        };
        let (addr, mut rx, _ep) = coordinator(&pki.server, script);
        let agent = start_agent(&fx, &pki, addr);
        assert!(matches!(next(&mut rx).await, Event::Hello(..)));
        assert!(matches!(next(&mut rx).await, Event::ReportRefused(1)));
        assert!(matches!(next(&mut rx).await, Event::Hello(..)));
        for seq in 2..=3 {
            let r = next_report(&mut rx).await;
            assert_eq!((r.seq, r.report_interval_ms), (seq, 0));
        }
        let (summary, _) = finish(agent).await;
        assert_eq!(summary.connections, 2);
    }

    /// An agent with a memory check (a newer kind) against coordinators from before it:
    /// reports leave the newer kinds out, then (before intervals too) the interval.
    #[tokio::test]
    async fn a_coordinator_from_before_the_newer_check_kinds_gets_reports_without_them() {
        for before_intervals in [false, true] {
            let pki = pki("node-8");
            let fx = NodeFixture::builder("node-8").build().unwrap();
            let script = Script {
                before_newer_kinds: true,
                before_intervals,
                ..Script::default()
            };
            let (addr, mut rx, _ep) = coordinator(&pki.server, script);
            let path = fx
                .write_agent_config(
                    &AgentConfig::new(&addr.to_string(), &pki.ca, &pki.cert, &pki.key)
                        .report_interval(Duration::from_millis(100)),
                )
                .unwrap();
            let mut text = std::fs::read_to_string(&path).unwrap();
            text.push_str("\n[checks.memory]\nenabled = \"on\"\n");
            std::fs::write(&path, text).unwrap();
            let agent = run_agent_at(path, None);
            assert!(matches!(next(&mut rx).await, Event::Hello(..)));
            assert!(matches!(next(&mut rx).await, Event::ReportRefused(1)));
            assert!(matches!(next(&mut rx).await, Event::Hello(..)));
            let mut seq = 2;
            if before_intervals {
                // Without the newer kinds, but still with the interval: refused again.
                assert!(matches!(next(&mut rx).await, Event::ReportRefused(2)));
                assert!(matches!(next(&mut rx).await, Event::Hello(..)));
                seq = 3;
            }
            for seq in seq..seq + 2 {
                let r = next_report(&mut rx).await;
                assert_eq!(r.seq, seq);
                assert_eq!(r.report_interval_ms, if before_intervals { 0 } else { 100 });
                assert!(!r.has_newer_kinds(), "{r:?}");
                assert!(r.checks.iter().any(|c| c.kind == CheckKind::Kdump), "{r:?}");
            }
            let (summary, _) = finish(agent).await;
            assert_eq!(summary.connections, if before_intervals { 3 } else { 2 });
        }
    }

    #[tokio::test]
    async fn refused_report_reconnects_and_sequence_keeps_growing() {
        let pki = pki("node-2");
        let fx = NodeFixture::builder("node-2").build().unwrap();
        let (addr, mut rx, _ep) = coordinator(
            &pki.server,
            Script {
                refuse_report: Some(2),
                ..Script::default()
            },
        );
        let agent = start_agent(&fx, &pki, addr);
        let mut seen = Vec::new();
        let mut certs = Vec::new();
        let mut froms = Vec::new();
        while seen.len() < 6 {
            match next(&mut rx).await {
                Event::Hello(_, der, from) => {
                    seen.push("hello".to_string());
                    certs.push(der);
                    froms.push(from);
                }
                Event::Report(r) => {
                    if r.seq == 1 {
                        // Renew the certificate on disk: the reconnect must present it.
                        let renewed = pki
                            .authority
                            .issue(Role::Node, "node-2", &IssueOptions::default())
                            .unwrap();
                        renewed.write(pki.dir.path(), true).unwrap();
                    }
                    seen.push(format!("report {}", r.seq));
                }
                Event::ReportRefused(s) => seen.push(format!("refused {s}")),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            seen,
            [
                "hello",
                "report 1",
                "refused 2",
                "hello",
                "report 3",
                "report 4"
            ]
        );
        assert!(!certs[0].is_empty());
        assert!(certs[0] != certs[1], "the renewed certificate was not used");
        // One endpoint for every connection: a new one per reconnect left the agent about
        // 2.9 MiB larger for good after a coordinator restart (see Agent::client_endpoint).
        assert_eq!(froms[0], froms[1], "the reconnect came from a new endpoint");
        let (summary, _) = finish(agent).await;
        assert_eq!(summary.connections, 2);
        // No scheduled shutdown under the fixture root: only the agent restarts.
        assert_eq!(summary.goodbye, Some(GoodbyeReason::Restart));
        assert!(summary.goodbye_acked);
    }

    #[tokio::test]
    async fn the_watchdog_is_pinged_while_connecting_to_a_coordinator_that_drops_packets() {
        let pki = pki("node-5");
        let fx = NodeFixture::builder("node-5").build().unwrap();
        // Bound but never read: the handshake goes unanswered until the hello timeout (10 s).
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let agent = start_agent(&fx, &pki, sock.local_addr().unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        // A 20 ms period: about 20 pings; none before the connect's own timeout without them.
        let pings = agent.notifier.watchdog.load(Ordering::SeqCst);
        assert!(pings >= 5, "{pings} pings in 400 ms of connecting");
        finish(agent).await;
    }

    #[tokio::test]
    async fn stop_while_coordinator_is_down_ends_promptly() {
        let pki = pki("node-3");
        let fx = NodeFixture::builder("node-3").build().unwrap();
        // A port with nothing behind it.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        drop(sock);
        let agent = start_agent(&fx, &pki, addr);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        let (summary, notifier) = finish(agent).await;
        assert_eq!(summary.reports_acked, 0);
        assert!(!summary.goodbye_acked);
        // Ready at start, not at the first accepted report: `systemctl start` must not wait
        // for a coordinator that is away.
        assert_eq!(notifier.ready.load(Ordering::SeqCst), 1);
        // Bounded by the goodbye budget, not by connection timeouts.
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn certificate_for_another_host_is_a_config_error() {
        let pki = pki("node-a");
        let fx = NodeFixture::builder("node-b").build().unwrap();
        let path = fx
            .write_agent_config(&AgentConfig::new(
                "127.0.0.1:1",
                &pki.ca,
                &pki.cert,
                &pki.key,
            ))
            .unwrap();
        let cfg = Config::load(&Settings {
            config: Some(path),
            ..Settings::default()
        })
        .unwrap();
        let e = Agent::new(
            cfg.clone(),
            Checker::new(&cfg),
            Arc::new(FakeNotifier::default()),
            Box::new(SystemdShutdownProbe::new(cfg.root.clone())),
            test_opts(),
        )
        .unwrap_err();
        assert!(matches!(e, AgentError::IdentityMismatch { .. }), "{e}");
        assert_eq!(e.exit_code(), 64);
        assert!(e.to_string().contains("node-b"), "{e}");
    }
}
