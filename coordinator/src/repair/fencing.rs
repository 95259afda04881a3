//! The repair queue's side of fencing: `@fence` steps and drains that must fence run the
//! durable fence flow ([`crate::fence`]) and wait for its end.
//!
//! - Exactly one flow per step: the flow's id is committed with the step's key (table
//!   `repair_fence_flows`, migration 0008) right after the flow is started, and a step re-run
//!   after a restart finds it there and waits for that flow instead of starting another. A
//!   coordinator killed between the two commits finds the machine's unfinished flow and adopts
//!   it (one machine, one active entry, so that flow is this step's).
//! - Every unfinished flow is driven by one task ([`FenceService::drive`]), started at
//!   coordinator start for the flows a killed coordinator left behind, and by the step that
//!   starts a flow; a step only polls the committed row, so its task being cancelled (entry
//!   deleted, step timed out) never stops a flow halfway (a machine left off).
//!
//! This module decides nothing about a flow: every choice is in [`crate::fence::flow`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::Clock;
use crate::fence::flow::{Flow, State};
use crate::fence::runner::{FenceError, FenceRequest, FenceRunner};
use crate::fence::store::FenceStore;
use crate::k8s::Drainer;
use crate::store::Store;

/// Pause between reads of a flow's committed row while a step waits for it. The flow moves
/// at most once a second while it waits on the BMC or the API server; half a second keeps
/// the step's end within a beat of the flow's.
pub const STEP_POLL: Duration = Duration::from_millis(500);

/// Pause before driving a flow again after its runner stopped on an error (the store
/// briefly unwritable): long enough not to spin, short enough not to hold a machine off.
const DRIVE_RETRY: Duration = Duration::from_secs(2);

/// Whether a machine's node is dead by the two signals (agent silent past its grace *and*
/// kubelet Lease stale with Ready not True), as automatic remediation decides it. A drain
/// of such a node cannot complete; its machine is fenced instead.
pub trait NodeLiveness: Send + Sync + 'static {
    /// `Some(why)` when the machine at `address` is dead; `None` when alive or not known.
    fn dead(&self, address: &str) -> Option<String>;
}

/// Every node alive: drains always drain.
#[derive(Debug, Default, Clone, Copy)]
pub struct NeverDead;

impl NodeLiveness for NeverDead {
    fn dead(&self, _address: &str) -> Option<String> {
        None
    }
}

/// How a step's wait for its fence flow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceEnd {
    /// The flow is done.
    Done(Flow),
    /// The flow failed; its detail is the BMC's or the API server's words.
    Failed(Flow),
    /// The machine is not a Kubernetes node: there is nothing to release, so no flow ran.
    NotANode,
    /// The flow could not be started or read (the store failed, no node lookup).
    Error(String),
}

/// Whether the machine at an address stays off after its fence (`[fence] keep_off`).
pub type KeepOffOf = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The `[fence]` time limits of the machine at an address (its machine type's, its
/// gateway's, or the section's).
pub type FenceTimeoutsOf = Arc<dyn Fn(&str) -> crate::fence::flow::FenceTimeouts + Send + Sync>;

/// Fence flows for the repair queue (see the module doc).
pub struct FenceService {
    runner: Arc<FenceRunner>,
    keep_off: KeepOffOf,
    store: Store,
    clock: Arc<dyn Clock>,
    drainer: Arc<dyn Drainer>,
    driving: Mutex<HashSet<u64>>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for FenceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceService").finish_non_exhaustive()
    }
}

impl FenceService {
    /// A service over `runner`; node names come from `drainer`; flows it starts leave the
    /// machines `keep_off` names off (the flow's [`crate::fence::flow::Flow::keep_off`]).
    /// Flow tasks stop when `shutdown` is cancelled (the flows resume at the next start).
    pub fn new(
        runner: Arc<FenceRunner>,
        store: Store,
        clock: Arc<dyn Clock>,
        drainer: Arc<dyn Drainer>,
        keep_off: KeepOffOf,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            runner,
            keep_off,
            store,
            clock,
            drainer,
            driving: Mutex::default(),
            shutdown,
        })
    }

    /// The runner.
    pub fn runner(&self) -> &Arc<FenceRunner> {
        &self.runner
    }

    /// Drives every flow a previous coordinator left unfinished; returns how many.
    pub async fn resume_unfinished(self: &Arc<Self>) -> Result<usize, FenceError> {
        let ids = self.runner.unfinished().await?;
        for &id in &ids {
            let flow = self.runner.load(id).await?;
            tracing::info!(
                flow = id,
                address = %flow.address,
                state = flow.state.kind(),
                "resuming fence flow left unfinished"
            );
            if !flow.node.is_empty() {
                let message = format!(
                    "fence flow {id} of {} resumed at {} by a coordinator that started or took the lead",
                    flow.address,
                    flow.state.kind()
                );
                self.drainer
                    .record_event(&flow.node, crate::k8s::NodeEvent::FenceResumed, &message)
                    .await;
            }
            self.drive(id);
        }
        Ok(ids.len())
    }

    /// Makes sure one task drives flow `id` to its end.
    pub fn drive(self: &Arc<Self>, id: u64) {
        if !self
            .driving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id)
        {
            return;
        }
        let me = self.clone();
        tokio::spawn(
            async move {
                loop {
                    let run = tokio::select! {
                        _ = me.shutdown.cancelled() => break,
                        r = me.runner.run(id) => r,
                    };
                    match run {
                        Ok(_) | Err(FenceError::NotFound(_) | FenceError::Killed(_)) => break,
                        Err(e) => {
                            tracing::warn!(flow = id, error = %e, "fence flow stopped; driving it again");
                            tokio::select! {
                                _ = me.shutdown.cancelled() => break,
                                _ = tokio::time::sleep(DRIVE_RETRY) => {}
                            }
                        }
                    }
                }
                me.driving
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
            }
            .instrument(tracing::info_span!("fence_flow", flow = id)),
        );
    }

    /// The flow of step `key` of entry `index`: the one recorded for it, else a new one
    /// (or the machine's unfinished one) recorded now. `None` when the machine is not a node.
    pub async fn flow_for_step(
        self: &Arc<Self>,
        key: &str,
        index: u64,
        address: &str,
        serial: &str,
    ) -> Result<Option<u64>, String> {
        let recorded = self
            .store
            .flow_of_step(key.to_string())
            .await
            .map_err(|e| e.to_string())?;
        if let Some(id) = recorded {
            return Ok(Some(id));
        }
        let node = match self.drainer.node_for(address).await {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(None),
            Err(e) => return Err(format!("looking up the machine's Node: {e}")),
        };
        let req = FenceRequest {
            address: address.to_string(),
            serial: serial.to_string(),
            node,
            keep_off: (self.keep_off)(address),
        };
        let id = match self.runner.start(req).await {
            Ok(id) => id,
            Err(FenceError::InProgress { .. }) => {
                // Started by this step before a crash (or still running from one): adopt it.
                let a = address.to_string();
                let f = self
                    .store
                    .unfinished()
                    .await
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .find(|f| f.address == a)
                    .ok_or("the machine's unfinished fence flow vanished; try again")?;
                tracing::info!(flow = f.id, machine = %address, "adopting the machine's unfinished fence flow");
                f.id
            }
            Err(e) => return Err(e.to_string()),
        };
        self.store
            .link_step(key.to_string(), index, id, self.clock.now())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some(id))
    }

    /// Starts (or finds) the flow of step `key` and waits until it ends, or `timeout`.
    pub async fn fence_step(
        self: &Arc<Self>,
        key: &str,
        index: u64,
        address: &str,
        serial: &str,
        timeout: Option<Duration>,
    ) -> FenceEnd {
        let id = match self.flow_for_step(key, index, address, serial).await {
            Ok(Some(id)) => id,
            Ok(None) => return FenceEnd::NotANode,
            Err(e) => return FenceEnd::Error(e),
        };
        self.drive(id);
        let wait = async {
            loop {
                match self.runner.load(id).await {
                    Ok(f) if f.state == State::Done => return FenceEnd::Done(f),
                    Ok(f) if f.state.is_terminal() => return FenceEnd::Failed(f),
                    Ok(_) => {}
                    Err(e) if e.is_retriable() => {}
                    Err(e) => return FenceEnd::Error(e.to_string()),
                }
                tokio::time::sleep(STEP_POLL).await;
            }
        };
        match timeout {
            None => wait.await,
            Some(t) => match tokio::time::timeout(t, wait).await {
                Ok(end) => end,
                Err(_) => {
                    let state = self
                        .runner
                        .load(id)
                        .await
                        .map(|f| f.state.kind().to_string())
                        .unwrap_or_else(|e| e.to_string());
                    FenceEnd::Error(format!(
                        "fence flow {id} still in {state} after {} s (it goes on; a retry waits for it)",
                        t.as_secs()
                    ))
                }
            },
        }
    }
}

/// One line saying how a finished flow went, for the entry's history.
pub fn describe(f: &Flow) -> String {
    let off = f
        .confirmed_off
        .map(|t| format!(", off confirmed at {t:.0}"))
        .unwrap_or_default();
    match &f.state {
        State::Done => format!(
            "fence flow {} done{off}; workload released, machine powered on, node {} restored",
            f.id, f.node
        ),
        State::Failed { detail } => format!("fence flow {} failed: {detail}", f.id),
        other => format!("fence flow {} in {}", f.id, other.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::runner::FenceDeps;
    use crate::testing::{FakeAgents, FakeClock, FakeDrainer, FakeNodeRelease, FakePower};

    struct Setup {
        _dir: tempfile::TempDir,
        store: Store,
        svc: Arc<FenceService>,
        stop: CancellationToken,
    }

    fn setup(drainer: FakeDrainer) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let clock = Arc::new(FakeClock::new(
            jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        ));
        let runner = FenceRunner::new(
            store.clone(),
            "db1",
            FenceDeps {
                power: Arc::new(FakePower::default()),
                release: Arc::new(FakeNodeRelease::default()),
                agents: Arc::new(FakeAgents::with(None)),
                clock: clock.clone(),
            },
        );
        let stop = CancellationToken::new();
        let svc = FenceService::new(
            Arc::new(runner),
            store.clone(),
            clock,
            Arc::new(drainer),
            Arc::new(|_: &str| false),
            stop.clone(),
        );
        Setup {
            _dir: dir,
            store,
            svc,
            stop,
        }
    }

    fn flows(s: &Store) -> Vec<Flow> {
        s.with(|c| crate::fence::store::sqlite::list(c, 100))
            .unwrap()
    }

    #[tokio::test]
    async fn a_step_run_again_waits_for_the_flow_it_started_instead_of_a_second() {
        let s = setup(FakeDrainer::default());
        let a = s
            .svc
            .flow_for_step("db1-repair-1-step0-attempt0", 1, "10.0.0.1", "S")
            .await
            .unwrap()
            .unwrap();
        let again = s
            .svc
            .flow_for_step("db1-repair-1-step0-attempt0", 1, "10.0.0.1", "S")
            .await
            .unwrap();
        assert_eq!(again, Some(a));
        let all = flows(&s.store);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].node, "n-10.0.0.1");
        s.stop.cancel();
    }

    #[tokio::test]
    async fn a_flow_started_but_not_recorded_before_a_crash_is_adopted() {
        let s = setup(FakeDrainer::default());
        // The previous coordinator committed the flow and died before recording it.
        let orphan = s
            .svc
            .runner()
            .start(FenceRequest {
                address: "10.0.0.1".into(),
                serial: "S".into(),
                node: "n-10.0.0.1".into(),
                keep_off: false,
            })
            .await
            .unwrap();
        let id = s
            .svc
            .flow_for_step("db1-repair-1-step0-attempt0", 1, "10.0.0.1", "S")
            .await
            .unwrap();
        assert_eq!(id, Some(orphan));
        assert_eq!(flows(&s.store).len(), 1);
        // Recorded now: the next run of the step finds it without looking for orphans.
        let recorded: i64 = s
            .store
            .with(|c| {
                c.query_row(
                    "SELECT flow_id FROM repair_fence_flows WHERE step_key = 'db1-repair-1-step0-attempt0'",
                    [],
                    |r| r.get(0),
                )
            })
            .unwrap();
        assert_eq!(recorded as u64, orphan);
        s.stop.cancel();
    }

    #[tokio::test]
    async fn a_machine_that_is_not_a_node_gets_no_flow() {
        let s = setup(FakeDrainer::without_nodes());
        let id = s
            .svc
            .flow_for_step("db1-repair-1-step0-attempt0", 1, "10.0.0.1", "S")
            .await
            .unwrap();
        assert_eq!(id, None);
        assert!(flows(&s.store).is_empty());
        s.stop.cancel();
    }

    #[tokio::test]
    async fn a_failed_flow_ends_the_step_with_its_reason() {
        let s = setup(FakeDrainer::default());
        let id = s
            .svc
            .flow_for_step("k", 1, "10.0.0.1", "S")
            .await
            .unwrap()
            .unwrap();
        let mut f = s.svc.runner().load(id).await.unwrap();
        f.state = State::Failed {
            detail: "BMC said: Unspecified error".into(),
        };
        s.store
            .with(|c| crate::fence::store::sqlite::update(c, &f, "gave up", f.state_since))
            .unwrap();
        match s.svc.fence_step("k", 1, "10.0.0.1", "S", None).await {
            FenceEnd::Failed(f) => {
                assert!(
                    describe(&f).contains("Unspecified error"),
                    "{}",
                    describe(&f)
                )
            }
            other => panic!("{other:?}"),
        }
        s.stop.cancel();
    }
}
