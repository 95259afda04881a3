//! The gateway's core, independent of the network: finds the BMC serving a machine, runs each
//! request at most once per id, one action per BMC at a time in arrival order, under a deadline,
//! and records metrics.
//!
//! Request ids and their outcomes are remembered in memory ([`crate::dedup`]) and, when the
//! gateway has a state directory, on disk ([`crate::journal`]): "started" is on disk before
//! an action runs and "finished" before its answer is sent, so a resend after a restart is
//! answered from the record and never executed again.
//!
//! Each BMC has a worker task fed by a queue; a request's time limit counts from its arrival,
//! so one waiting behind a long fence fails with "not attempted" instead of running late. This
//! module does not speak QUIC (see [`crate::service`]) or any BMC protocol (see [`crate::power`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use protocol::fencing::{Epochs, FencingToken, Verdict};
use protocol::gateway::{PowerAction, PowerOutcome, PowerRequest, PowerResponse};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, error, info, info_span, warn};

use crate::actions::{self, ActionLimits, Clock, SystemClock};
use crate::dedup::{self, Admission, RequestLog};
use crate::journal::{Journal, JournalError, Record};
use crate::metrics::{Metrics, Reach};
use crate::power::{BmcError, ChassisOp, PowerControl, PowerReading, PowerState};

/// Default limits applied when a request does not carry its own.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// Overall limit for non-fence actions.
    pub action_timeout: Duration,
    /// Overall limit for a fence.
    pub fence_timeout: Duration,
    /// Window in which a busy BMC's power-on is asked again (see [`crate::pace`]); added to
    /// `action_timeout` for `on` and `cycle` requests without their own limit.
    pub busy_retry: Duration,
    /// Fence poll period.
    pub poll: Duration,
    /// How often an idle BMC's power state is read to keep the reachability metric current
    /// (`None` = never).
    pub probe: Option<Duration>,
}

/// Default idle probe period.
///
/// 60 s: an unreachable BMC shows on `/metrics` within a minute, well before anyone needs it
/// for a repair, at the cost of one status read per BMC per minute.
pub const PROBE_EVERY: Duration = Duration::from_secs(60);

/// Longest a probe may take: a status read answers in milliseconds when the BMC is up, and
/// 10 s covers an IPMI session set-up with retries; a real action waits at most this long.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// One BMC as the gateway knows it.
pub struct Bmc {
    /// The machine's address.
    pub machine: String,
    /// The machine's serial ("" = not checked).
    pub serial: String,
    /// `ipmi` or `redfish`, for metrics.
    pub protocol: &'static str,
    /// The BMC client.
    pub power: Arc<dyn PowerControl>,
}

struct Job {
    id: String,
    action: PowerAction,
    deadline: Instant,
    arrived: Instant,
    reply: oneshot::Sender<PowerOutcome>,
}

struct Handle {
    serial: String,
    protocol: &'static str,
    queue: mpsc::UnboundedSender<Job>,
    power: Arc<dyn PowerControl>,
}

/// The gateway: BMCs by machine, the request log and metrics.
pub struct Gateway {
    bmcs: HashMap<String, Handle>,
    log: Mutex<RequestLog>,
    /// The record on disk; `None` = memory only (unit tests).
    journal: Option<Arc<Mutex<Journal>>>,
    /// The highest fencing epoch seen per store identity (also in the record). An async
    /// lock: it is held while a raised epoch is written, so no request of an older epoch
    /// runs between the check and the write.
    epochs: tokio::sync::Mutex<Epochs>,
    metrics: Arc<Metrics>,
    defaults: Defaults,
}

/// Wraps a [`PowerControl`] to keep the reachability metric current.
struct Observed {
    inner: Arc<dyn PowerControl>,
    machine: String,
    protocol: &'static str,
    metrics: Arc<Metrics>,
}

/// What a BMC's answer says about reaching it: a BMC that refuses the credentials answered,
/// but no action can run on it, so it is not counted reachable.
pub fn reach<T>(r: &Result<T, BmcError>) -> Reach {
    match r {
        Ok(_) => Reach::Up,
        Err(BmcError::Auth { .. }) => Reach::CredentialsRefused,
        Err(e) if e.is_unreachable() => Reach::Down,
        Err(_) => Reach::Up,
    }
}

impl Observed {
    fn see<T>(&self, r: &Result<T, BmcError>) {
        let now = reach(r);
        let before = self.metrics.reachable(&self.machine, self.protocol, now);
        // Said once when it starts, not at every idle probe: the metric keeps saying it.
        if now == Reach::CredentialsRefused
            && before != Some(Reach::CredentialsRefused)
            && let Err(error) = r
        {
            warn!(machine = %self.machine, protocol = self.protocol, %error, "the BMC refused the credentials; check the username and password file");
        }
    }
}

impl PowerControl for Observed {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        Box::pin(async move {
            let r = self.inner.power_state().await;
            self.see(&r);
            r
        })
    }
    fn power_reading(&self) -> BoxFuture<'_, Result<PowerReading, BmcError>> {
        Box::pin(async move {
            let r = self.inner.power_reading().await;
            self.see(&r);
            r
        })
    }
    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            let r = self.inner.chassis(op).await;
            self.see(&r);
            r
        })
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }
}

impl Gateway {
    /// Builds the gateway and starts one worker task per BMC (needs a Tokio runtime).
    pub fn new(bmcs: Vec<Bmc>, defaults: Defaults, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_clock(bmcs, defaults, metrics, Arc::new(SystemClock))
    }

    /// As [`Gateway::new`], remembering request ids in `state_dir` across restarts: reads the
    /// record back (ids interrupted by the last stop answer "outcome unknown") and keeps
    /// appending to it.
    pub fn durable(
        bmcs: Vec<Bmc>,
        defaults: Defaults,
        metrics: Arc<Metrics>,
        state_dir: &Path,
    ) -> Result<Arc<Self>, JournalError> {
        let (journal, loaded) = Journal::open(state_dir, dedup::REMEMBERED_IDS)?;
        let mut log = RequestLog::new();
        for r in &loaded.finished {
            log.remember(&r.id, &r.fingerprint, r.outcome.clone());
        }
        if loaded.skipped > 0 {
            warn!(file = %journal.path().display(), skipped = loaded.skipped, "request record: skipped torn or corrupt lines");
        }
        for id in &loaded.interrupted {
            warn!(%id, "request record: this request was running when the gateway stopped; its outcome is unknown and it will not be executed again");
        }
        info!(file = %journal.path().display(), remembered = loaded.finished.len(), stores = loaded.epochs.len(), "request record loaded");
        let mut g = Self::assemble(bmcs, defaults, metrics, Arc::new(SystemClock));
        g.log = Mutex::new(log);
        g.epochs = tokio::sync::Mutex::new(loaded.epochs);
        g.journal = Some(Arc::new(Mutex::new(journal)));
        Ok(Arc::new(g))
    }

    /// As [`Gateway::new`] with a given clock (tests).
    pub fn with_clock(
        bmcs: Vec<Bmc>,
        defaults: Defaults,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new(Self::assemble(bmcs, defaults, metrics, clock))
    }

    fn assemble(
        bmcs: Vec<Bmc>,
        defaults: Defaults,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut map = HashMap::new();
        for b in bmcs {
            let (tx, rx) = mpsc::unbounded_channel();
            let observed: Arc<dyn PowerControl> = Arc::new(Observed {
                inner: b.power.clone(),
                machine: b.machine.clone(),
                protocol: b.protocol,
                metrics: metrics.clone(),
            });
            tokio::spawn(
                worker(
                    rx,
                    observed,
                    b.protocol,
                    defaults.poll,
                    defaults.probe,
                    metrics.clone(),
                    clock.clone(),
                )
                .instrument(info_span!("bmc", machine = %b.machine, protocol = b.protocol)),
            );
            map.insert(
                b.machine,
                Handle {
                    serial: b.serial,
                    protocol: b.protocol,
                    queue: tx,
                    power: b.power,
                },
            );
        }
        Self {
            bmcs: map,
            log: Mutex::new(RequestLog::new()),
            journal: None,
            epochs: tokio::sync::Mutex::new(Epochs::new()),
            metrics,
            defaults,
        }
    }

    /// Appends `rec` to the record on disk (fsync'd) on a blocking thread.
    async fn record(&self, rec: Record) -> Result<(), JournalError> {
        let Some(j) = self.journal.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || j.lock().expect("not poisoned").append(&rec))
            .await
            .unwrap_or_else(|e| {
                Err(JournalError::Io {
                    path: "request record".into(),
                    source: std::io::Error::other(e.to_string()),
                })
            })
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Machines served, sorted.
    pub fn machines(&self) -> Vec<String> {
        let mut v: Vec<_> = self.bmcs.keys().cloned().collect();
        v.sort();
        v
    }

    /// Handles one request of a coordinator from before fencing tokens (protocol version 1):
    /// no epoch to judge. See [`Gateway::handle_fenced`].
    pub async fn handle(&self, req: PowerRequest) -> PowerResponse {
        self.handle_fenced(req, None).await
    }

    /// Judges `token` before a new request runs: an epoch older than one seen for its store
    /// is refused (final, not retriable), a higher one is recorded (fsync'd) first. `Err`
    /// is the refusal.
    async fn admit_epoch(&self, id: &str, token: &FencingToken) -> Result<(), PowerOutcome> {
        let mut epochs = self.epochs.lock().await;
        match epochs.judge(token) {
            Verdict::Current => Ok(()),
            Verdict::Older(detail) => {
                warn!(%id, store = %token.store, epoch = token.epoch, seen = epochs.get(&token.store), "refused a power request of an older fencing epoch: a newer coordinator leads; no BMC was touched");
                self.metrics.refused_older_epoch(&token.store);
                Err(PowerOutcome::Failed {
                    detail,
                    retriable: false,
                })
            }
            Verdict::Newer => {
                let rec = Record::Epoch {
                    store: token.store.clone(),
                    epoch: token.epoch,
                };
                if let Err(e) = self.record(rec).await {
                    error!(%id, error = %e, "cannot record a new fencing epoch; not executing the request");
                    return Err(PowerOutcome::Failed {
                        detail: format!("not executed: the gateway cannot record {token}: {e}"),
                        retriable: true,
                    });
                }
                info!(store = %token.store, epoch = token.epoch, before = epochs.get(&token.store), "a coordinator of a newer fencing epoch spoke; older epochs of its store are refused from now on");
                epochs.raise(&token.store, token.epoch);
                Ok(())
            }
        }
    }

    /// Handles one request: at most once per id, queued behind earlier actions on the same
    /// BMC. A repeated id is answered from the record whatever its token; a new one whose
    /// `token` is older than one seen for its store is refused before any BMC is touched,
    /// and not remembered under its id (the successor may send the same id: a resumed flow
    /// keeps its request ids).
    pub async fn handle_fenced(
        &self,
        req: PowerRequest,
        token: Option<FencingToken>,
    ) -> PowerResponse {
        let arrived = Instant::now();
        let admission = self.log.lock().expect("not poisoned").admit(&req);
        let outcome = match admission {
            Admission::Answer(o) => {
                info!(id = %req.id, machine = %req.address, "repeated request id: answering with the first result");
                o
            }
            Admission::Wait(mut rx) => {
                info!(id = %req.id, machine = %req.address, "repeated request id still running: waiting for the first execution");
                match rx.wait_for(|v| v.is_some()).await {
                    Ok(v) => v.clone().expect("waited for Some"),
                    Err(_) => PowerOutcome::Failed {
                        detail: "the first execution of this id was abandoned".into(),
                        retriable: true,
                    },
                }
            }
            Admission::Execute(tx) => {
                if let Some(token) = &token
                    && let Err(o) = self.admit_epoch(&req.id, token).await
                {
                    self.log.lock().expect("not poisoned").forget(&req.id);
                    tx.send_replace(Some(o.clone()));
                    return PowerResponse {
                        id: req.id,
                        outcome: o,
                    };
                }
                let fingerprint = dedup::fingerprint(&req);
                let started = Record::Started {
                    id: req.id.clone(),
                    fingerprint: fingerprint.clone(),
                };
                if let Err(e) = self.record(started).await {
                    // Not executed: without the record a restart could execute it twice.
                    error!(id = %req.id, error = %e, "cannot record the request; not executing it");
                    self.log.lock().expect("not poisoned").forget(&req.id);
                    let o = PowerOutcome::Failed {
                        detail: format!("not executed: the gateway cannot record it: {e}"),
                        retriable: true,
                    };
                    tx.send_replace(Some(o.clone()));
                    return PowerResponse {
                        id: req.id,
                        outcome: o,
                    };
                }
                let o = self.execute(&req, arrived).await;
                let finished = Record::Finished {
                    id: req.id.clone(),
                    fingerprint,
                    outcome: o.clone(),
                };
                if let Err(e) = self.record(finished).await {
                    error!(id = %req.id, error = %e, "cannot record the outcome; after a restart this id answers \"outcome unknown\"");
                }
                tx.send_replace(Some(o.clone()));
                self.log
                    .lock()
                    .expect("not poisoned")
                    .finish(&req.id, o.clone());
                o
            }
        };
        PowerResponse {
            id: req.id,
            outcome,
        }
    }

    fn timeout_for(&self, req: &PowerRequest) -> Duration {
        if req.timeout_ms > 0 {
            Duration::from_millis(req.timeout_ms)
        } else if req.action == PowerAction::Fence {
            self.defaults.fence_timeout
        } else if matches!(req.action, PowerAction::On | PowerAction::Cycle) {
            self.defaults.action_timeout + self.defaults.busy_retry
        } else {
            self.defaults.action_timeout
        }
    }

    async fn execute(&self, req: &PowerRequest, arrived: Instant) -> PowerOutcome {
        let Some(h) = self.bmcs.get(&req.address) else {
            warn!(id = %req.id, machine = %req.address, "no BMC configured for machine");
            return PowerOutcome::Failed {
                detail: format!(
                    "this gateway serves no machine {}; it serves {}",
                    req.address,
                    self.machines().join(", ")
                ),
                retriable: false,
            };
        };
        if !req.serial.is_empty() && !h.serial.is_empty() && req.serial != h.serial {
            warn!(id = %req.id, machine = %req.address, asked = %req.serial, configured = %h.serial, "serial mismatch: not acting");
            return PowerOutcome::Failed {
                detail: format!(
                    "machine {} has serial {} here, not {}; not acting on a possibly different machine",
                    req.address, h.serial, req.serial
                ),
                retriable: false,
            };
        }
        let (reply, rx) = oneshot::channel();
        let job = Job {
            id: req.id.clone(),
            action: req.action,
            deadline: arrived + self.timeout_for(req),
            arrived,
            reply,
        };
        info!(id = %req.id, machine = %req.address, action = actions::action_name(req.action), protocol = h.protocol, "power request queued");
        if h.queue.send(job).is_err() {
            return PowerOutcome::Failed {
                detail: "the BMC worker has stopped (gateway shutting down)".into(),
                retriable: true,
            };
        }
        match rx.await {
            Ok(o) => {
                match &o {
                    PowerOutcome::Done { detail, .. } => {
                        info!(id = %req.id, machine = %req.address, action = actions::action_name(req.action), %detail, "power action done")
                    }
                    PowerOutcome::Failed { detail, .. } => {
                        warn!(id = %req.id, machine = %req.address, action = actions::action_name(req.action), %detail, "power action failed")
                    }
                }
                o
            }
            Err(_) => PowerOutcome::Failed {
                detail: "the BMC worker stopped before answering".into(),
                retriable: true,
            },
        }
    }

    /// Closes every BMC session (at shutdown).
    pub async fn close(&self) {
        for h in self.bmcs.values() {
            h.power.close().await;
        }
    }
}

/// How long after a cycle a machine that reads off is taken to be still in that cycle (the
/// BMC holding it off before it powers it on again), so a second cycle says so.
///
/// 30 s: BMCs hold a cycled machine off from 1 s (IPMI's minimum) to about 10 s; three
/// times that, and still far shorter than any repair's step.
const CYCLE_HOLDS_OFF: Duration = Duration::from_secs(30);

async fn worker(
    mut rx: mpsc::UnboundedReceiver<Job>,
    power: Arc<dyn PowerControl>,
    protocol: &'static str,
    poll: Duration,
    probe: Option<Duration>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
) {
    let mut last_activity = Instant::now();
    // The last cycle this BMC carried out (not one that only powered on), and when.
    let mut last_cycle: Option<(String, Instant)> = None;
    loop {
        // Wake for the next job, or to probe an idle BMC.
        let job = match probe {
            Some(every) => {
                let idle_until = last_activity + every;
                match tokio::time::timeout_at(idle_until.into(), rx.recv()).await {
                    Ok(Some(job)) => job,
                    Ok(None) => break,
                    Err(_) => {
                        // The Observed wrapper records reachability; the state itself is not
                        // needed. Bounded by PROBE_TIMEOUT so a dead BMC delays a real action
                        // queued behind the probe by little.
                        let _ = tokio::time::timeout(PROBE_TIMEOUT.min(every), power.power_state())
                            .await;
                        last_activity = Instant::now();
                        continue;
                    }
                }
            }
            None => match rx.recv().await {
                Some(job) => job,
                None => break,
            },
        };
        let now = Instant::now();
        let outcome = if now >= job.deadline {
            PowerOutcome::Failed {
                detail: format!(
                    "not attempted: waited {} ms behind earlier actions on this BMC, past the request's time limit",
                    now.duration_since(job.arrived).as_millis()
                ),
                retriable: true,
            }
        } else {
            let limits = ActionLimits {
                timeout: job.deadline - now,
                poll,
            };
            info!(id = %job.id, action = actions::action_name(job.action), waited_ms = now.duration_since(job.arrived).as_millis() as u64, "power action started");
            let earlier = last_cycle
                .as_ref()
                .filter(|(_, at)| now.duration_since(*at) < CYCLE_HOLDS_OFF)
                .map(|(id, at)| actions::EarlierCycle {
                    id: id.clone(),
                    ago: now.duration_since(*at),
                });
            let o = actions::run_after(
                power.as_ref(),
                job.action,
                limits,
                clock.as_ref(),
                earlier.as_ref(),
            )
            .await;
            if job.action == PowerAction::Cycle
                && matches!(o, PowerOutcome::Done { .. })
                && !o.is_powered_on_only()
            {
                last_cycle = Some((job.id.clone(), now));
            }
            o
        };
        info!(id = %job.id, action = actions::action_name(job.action), ok = matches!(outcome, PowerOutcome::Done { .. }), "power action finished");
        metrics.action(
            protocol,
            actions::action_name(job.action),
            matches!(outcome, PowerOutcome::Done { .. }),
            job.arrived.elapsed(),
        );
        let _ = job.reply.send(outcome);
        last_activity = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::fake::FakePower;

    fn defaults() -> Defaults {
        Defaults {
            action_timeout: Duration::from_secs(2),
            fence_timeout: Duration::from_secs(2),
            busy_retry: Duration::ZERO,
            poll: Duration::from_millis(5),
            probe: None,
        }
    }

    #[tokio::test]
    async fn power_on_without_a_limit_gets_the_busy_window_on_top() {
        let g = Gateway::new(
            Vec::new(),
            Defaults {
                busy_retry: Duration::from_secs(90),
                ..defaults()
            },
            Arc::new(Metrics::new()),
        );
        let two = Duration::from_secs(2);
        assert_eq!(
            g.timeout_for(&req("a", "m", PowerAction::On)),
            two + Duration::from_secs(90)
        );
        assert_eq!(
            g.timeout_for(&req("b", "m", PowerAction::Cycle)),
            two + Duration::from_secs(90)
        );
        assert_eq!(g.timeout_for(&req("c", "m", PowerAction::Off)), two);
        let mut own = req("d", "m", PowerAction::On);
        own.timeout_ms = 500;
        assert_eq!(g.timeout_for(&own), Duration::from_millis(500));
    }

    fn req(id: &str, addr: &str, action: PowerAction) -> PowerRequest {
        PowerRequest {
            id: id.into(),
            address: addr.into(),
            serial: String::new(),
            action,
            timeout_ms: 0,
        }
    }

    fn gw(fakes: Vec<(&str, Arc<FakePower>)>) -> Arc<Gateway> {
        Gateway::new(
            fakes
                .into_iter()
                .map(|(m, p)| Bmc {
                    machine: m.into(),
                    serial: "S-".to_string() + m,
                    protocol: "ipmi",
                    power: p,
                })
                .collect(),
            defaults(),
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test]
    async fn repeated_id_does_not_act_twice() {
        let p = Arc::new(FakePower::new(PowerState::On));
        let g = gw(vec![("m1", p.clone())]);
        let a = g.handle(req("r1", "m1", PowerAction::Cycle)).await;
        let b = g.handle(req("r1", "m1", PowerAction::Cycle)).await;
        assert_eq!(a, b);
        assert_eq!(p.calls(), ["status", "cycle", "status"]);
    }

    /// Issue 34: two cycles of one machine asked at once (two coordinators, two entries).
    /// The BMC cycles once; the second finds the machine off in the middle of that cycle
    /// and powers it on. Its answer says so and names the first request, instead of a
    /// plain "done" for a cycle that never happened.
    #[tokio::test]
    async fn a_cycle_that_finds_another_cycle_under_way_says_it_only_powered_on() {
        let p = Arc::new(FakePower::new(PowerState::On).with_cycle_off(5));
        let g = gw(vec![("m1", p.clone())]);
        let (a, b) = tokio::join!(
            g.handle(req("first", "m1", PowerAction::Cycle)),
            g.handle(req("second", "m1", PowerAction::Cycle))
        );
        assert_eq!(
            p.calls(),
            ["status", "cycle", "status", "status", "on", "status"]
        );
        assert!(!a.outcome.is_powered_on_only(), "{a:?}");
        let PowerOutcome::Done { detail, .. } = &b.outcome else {
            panic!("{b:?}")
        };
        assert!(b.outcome.is_powered_on_only(), "{detail}");
        assert!(detail.contains("being cycled by request first"), "{detail}");
        // A machine simply off before a cycle is powered on, as before, naming no request.
        let p = Arc::new(FakePower::new(PowerState::Off));
        let g = gw(vec![("m1", p.clone())]);
        let c = g.handle(req("third", "m1", PowerAction::Cycle)).await;
        assert!(c.outcome.is_powered_on_only(), "{c:?}");
        assert!(
            matches!(&c.outcome, PowerOutcome::Done { detail, .. } if detail.contains("the machine was off")),
            "{c:?}"
        );
    }

    #[tokio::test]
    async fn concurrent_repeat_waits_for_first() {
        let p = Arc::new(FakePower::new(PowerState::On).with_delay(Duration::from_millis(50)));
        let g = gw(vec![("m1", p.clone())]);
        let (a, b) = tokio::join!(
            g.handle(req("r1", "m1", PowerAction::Off)),
            g.handle(req("r1", "m1", PowerAction::Off))
        );
        assert_eq!(a, b);
        assert_eq!(p.calls(), ["off", "status"]);
    }

    #[tokio::test]
    async fn one_action_per_bmc_in_order() {
        let p = Arc::new(FakePower::new(PowerState::On).with_delay(Duration::from_millis(20)));
        let g = gw(vec![("m1", p.clone())]);
        let (_, _, _) = tokio::join!(
            g.handle(req("1", "m1", PowerAction::Off)),
            g.handle(req("2", "m1", PowerAction::On)),
            g.handle(req("3", "m1", PowerAction::Status)),
        );
        assert_eq!(p.calls(), ["off", "status", "on", "status", "status"]);
        assert_eq!(p.max_in_flight(), 1, "two actions ran on one BMC at once");
    }

    #[tokio::test]
    async fn a_hung_bmc_does_not_block_others() {
        let slow = Arc::new(FakePower::new(PowerState::On).with_delay(Duration::from_secs(10)));
        let fast = Arc::new(FakePower::new(PowerState::On));
        let g = gw(vec![("slow", slow), ("fast", fast)]);
        let g2 = g.clone();
        let hung = tokio::spawn(async move {
            let mut r = req("h", "slow", PowerAction::Off);
            r.timeout_ms = 300;
            g2.handle(r).await
        });
        let t = Instant::now();
        let r = g.handle(req("f", "fast", PowerAction::Status)).await;
        assert!(t.elapsed() < Duration::from_millis(200));
        assert!(matches!(r.outcome, PowerOutcome::Done { .. }));
        let h = tokio::time::timeout(Duration::from_secs(2), hung)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(&h.outcome, PowerOutcome::Failed { retriable: true, detail } if detail.contains("timed out")),
            "{h:?}"
        );
        assert!(g.metrics().render().contains("result=\"failed\""));
    }

    /// A gateway for one IPMI BMC `m1` behind `p`, probing it every 20 ms when idle.
    fn probing(p: &Arc<FakePower>) -> Arc<Gateway> {
        let mut d = defaults();
        d.probe = Some(Duration::from_millis(20));
        Gateway::new(
            vec![Bmc {
                machine: "m1".into(),
                serial: String::new(),
                protocol: "ipmi",
                power: p.clone(),
            }],
            d,
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test]
    async fn idle_bmcs_are_probed_for_reachability() {
        let p = Arc::new(FakePower::new(PowerState::On));
        p.fail_next(BmcError::Unreachable {
            bmc: "m1".into(),
            detail: "no route".into(),
        });
        let g = probing(&p);
        let down = "fleetmend_gateway_bmc_reachable{machine=\"m1\",protocol=\"ipmi\"} 0";
        let up = "fleetmend_gateway_bmc_reachable{machine=\"m1\",protocol=\"ipmi\"} 1";
        tokio::time::timeout(Duration::from_secs(5), async {
            while !g.metrics().render().contains(down) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            while !g.metrics().render().contains(up) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the probe marked the BMC down, then up");
        assert!(p.calls().iter().all(|c| c == "status"));
    }

    #[tokio::test]
    async fn a_bmc_refusing_the_credentials_is_not_reachable() {
        let p = Arc::new(FakePower::new(PowerState::On));
        p.fail_next(BmcError::Auth {
            bmc: "m1".into(),
            detail: "RAKP integrity check failed (wrong password?)".into(),
        });
        let g = probing(&p);
        let refused = [
            "fleetmend_gateway_bmc_reachable{machine=\"m1\",protocol=\"ipmi\"} 0",
            "fleetmend_gateway_bmc_credentials_refused{machine=\"m1\",protocol=\"ipmi\"} 1",
        ];
        tokio::time::timeout(Duration::from_secs(5), async {
            while !refused.iter().all(|l| g.metrics().render().contains(l)) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the probe's auth failure reads as refused credentials:\n{}",
                g.metrics().render()
            )
        });
    }

    #[test]
    fn only_refused_credentials_and_silence_read_as_not_reachable() {
        let e = |e: BmcError| reach::<()>(&Err(e));
        let (bmc, what, detail) = (String::new(), String::new(), String::new());
        assert_eq!(reach(&Ok(())), Reach::Up);
        assert_eq!(
            e(BmcError::Auth {
                bmc: bmc.clone(),
                detail: detail.clone()
            }),
            Reach::CredentialsRefused
        );
        assert_eq!(
            e(BmcError::Timeout {
                bmc: bmc.clone(),
                what: what.clone(),
                waited_ms: 1
            }),
            Reach::Down
        );
        assert_eq!(
            e(BmcError::Unreachable {
                bmc: bmc.clone(),
                detail: detail.clone()
            }),
            Reach::Down
        );
        assert_eq!(e(BmcError::Busy { bmc, what, detail }), Reach::Up);
    }

    fn durable(dir: &Path, p: Arc<FakePower>) -> Arc<Gateway> {
        let bmcs = vec![Bmc {
            machine: "m1".into(),
            serial: String::new(),
            protocol: "ipmi",
            power: p,
        }];
        Gateway::durable(bmcs, defaults(), Arc::new(Metrics::new()), dir).unwrap()
    }

    #[tokio::test]
    async fn a_resend_after_a_restart_is_answered_from_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let first = Arc::new(FakePower::new(PowerState::On));
        let g = durable(dir.path(), first.clone());
        let a = g.handle(req("r1", "m1", PowerAction::Cycle)).await;
        assert!(matches!(a.outcome, PowerOutcome::Done { .. }), "{a:?}");
        drop(g);
        // A new gateway on the same state directory, with a BMC that has seen nothing.
        let second = Arc::new(FakePower::new(PowerState::On));
        let g = durable(dir.path(), second.clone());
        let b = g.handle(req("r1", "m1", PowerAction::Cycle)).await;
        assert_eq!(a, b);
        assert!(second.calls().is_empty(), "{:?}", second.calls());
        // Another id still runs.
        let c = g.handle(req("r2", "m1", PowerAction::Status)).await;
        assert!(matches!(c.outcome, PowerOutcome::Done { .. }));
        assert_eq!(second.calls(), ["status"]);
    }

    #[tokio::test]
    async fn an_older_epoch_is_refused_before_any_bmc_also_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let token = |epoch| {
            Some(FencingToken {
                store: "s1".into(),
                epoch,
            })
        };
        let first = Arc::new(FakePower::new(PowerState::On));
        let g = durable(dir.path(), first.clone());
        let a = g
            .handle_fenced(req("r1", "m1", PowerAction::Off), token(42))
            .await;
        assert!(matches!(a.outcome, PowerOutcome::Done { .. }), "{a:?}");
        let calls = first.calls();
        drop(g);
        // Restarted: the record says 42 was seen.
        let p = Arc::new(FakePower::new(PowerState::Off));
        let g = durable(dir.path(), p.clone());
        let refused = g
            .handle_fenced(req("r2", "m1", PowerAction::On), token(41))
            .await;
        assert!(refused.outcome.is_refused_epoch(), "{refused:?}");
        let PowerOutcome::Failed { detail, retriable } = &refused.outcome else {
            unreachable!()
        };
        assert!(!retriable);
        assert!(
            detail.starts_with(
                "refused: epoch 41 is older than 42 for store s1; a newer coordinator leads"
            ),
            "{detail}"
        );
        assert!(p.calls().is_empty(), "a BMC was touched: {:?}", p.calls());
        assert!(
            g.metrics()
                .render()
                .contains("fleetmend_gateway_requests_refused_older_epoch_total{store=\"s1\"} 1")
        );
        // A repeated id is answered from its record, whatever its epoch.
        let again = g
            .handle_fenced(req("r1", "m1", PowerAction::Off), token(41))
            .await;
        assert_eq!(again, a);
        // The refused id was not remembered: the successor may send it.
        let newer = g
            .handle_fenced(req("r2", "m1", PowerAction::On), token(43))
            .await;
        assert!(
            matches!(newer.outcome, PowerOutcome::Done { .. }),
            "{newer:?}"
        );
        // Another store's epochs are its own; a coordinator from before tokens is not judged.
        let other = g
            .handle_fenced(
                req("r3", "m1", PowerAction::Status),
                Some(FencingToken {
                    store: "s2".into(),
                    epoch: 1,
                }),
            )
            .await;
        assert!(
            matches!(other.outcome, PowerOutcome::Done { .. }),
            "{other:?}"
        );
        let legacy = g.handle(req("r4", "m1", PowerAction::Status)).await;
        assert!(
            matches!(legacy.outcome, PowerOutcome::Done { .. }),
            "{legacy:?}"
        );
        assert!(!calls.is_empty());
    }

    #[tokio::test]
    async fn a_request_interrupted_by_a_restart_is_not_executed_again() {
        let dir = tempfile::tempdir().unwrap();
        let r = req("r1", "m1", PowerAction::Cycle);
        {
            let (mut j, _) = Journal::open(dir.path(), 10).unwrap();
            j.append(&Record::Started {
                id: "r1".into(),
                fingerprint: dedup::fingerprint(&r),
            })
            .unwrap();
        }
        let p = Arc::new(FakePower::new(PowerState::On));
        let g = durable(dir.path(), p.clone());
        let resp = g.handle(r).await;
        assert!(
            matches!(&resp.outcome, PowerOutcome::Failed { detail, retriable: false } if detail.starts_with("outcome unknown: the gateway restarted")),
            "{resp:?}"
        );
        assert!(p.calls().is_empty(), "{:?}", p.calls());
    }

    #[tokio::test]
    async fn unknown_machine_and_wrong_serial_are_refused() {
        let p = Arc::new(FakePower::new(PowerState::On));
        let g = gw(vec![("m1", p.clone())]);
        let r = g.handle(req("a", "m9", PowerAction::Off)).await;
        assert!(
            matches!(&r.outcome, PowerOutcome::Failed { detail, retriable: false } if detail.contains("serves no machine m9"))
        );
        let mut bad = req("b", "m1", PowerAction::Off);
        bad.serial = "OTHER".into();
        let r = g.handle(bad).await;
        assert!(
            matches!(&r.outcome, PowerOutcome::Failed { detail, .. } if detail.contains("serial"))
        );
        assert!(p.calls().is_empty());
    }
}
