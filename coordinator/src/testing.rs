//! Hand-written fakes for the coordinator's traits, one of each, for unit tests and (with
//! the `testing` feature) the tests crate: power control ([`FakePower`]), the drainer
//! ([`FakeDrainer`]), node release ([`FakeNodeRelease`]), the node view ([`FakeNodeView`]),
//! agent health ([`FakeAgents`]) and the clock ([`FakeClock`]).
//!
//! Each fake records the calls it gets and plays scripted answers: queued answers first,
//! then a default the test can change. None of them does I/O or sleeps. Real peers (BMC
//! simulators, the fake API server) stay in the tests crate; these stand in for a whole
//! system when a test is about the coordinator's own logic.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use jiff::{SignedDuration, Timestamp};
use protocol::gateway::{PowerOutcome, PowerRequest, PowerResponse, PowerState};

use crate::clock::Clock;
use crate::fence::proof::DownProof;
use crate::gateway::{PowerControl, PowerError};
use crate::k8s::release::{Release, ReleaseProgress, RestoreProgress, SavedNodeMetadata};
use crate::k8s::view::NodeViewSnapshot;
use crate::k8s::{
    DrainOptions, DrainProgress, Drainer, KubeError, NodeEvent, NodeRelease, NodeViewSource,
};
use crate::repair::{AgentHealth, AgentHealthView};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct FakeClock(Mutex<Timestamp>);

impl FakeClock {
    /// A fake clock starting at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Mutex::new(start))
    }

    /// Moves the clock forward (or back, with a negative duration).
    pub fn advance(&self, by: SignedDuration) {
        let mut t = lock(&self.0);
        *t = t.checked_add(by).expect("fake clock overflow");
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        *lock(&self.0) = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        *lock(&self.0)
    }
}

type PowerHook = Box<dyn Fn(&PowerRequest) + Send + Sync>;

/// A gateway: records every request, answers with the scripted outcomes in order, then
/// with the default (power on, done).
pub struct FakePower {
    requests: Mutex<Vec<PowerRequest>>,
    script: Mutex<VecDeque<Result<PowerOutcome, PowerError>>>,
    default: Mutex<PowerOutcome>,
    hook: Mutex<Option<PowerHook>>,
    /// How long each answer takes (a slow BMC).
    delay: Mutex<std::time::Duration>,
}

impl Default for FakePower {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            script: Mutex::default(),
            default: Mutex::new(PowerOutcome::Done {
                state: PowerState::On,
                confirmed_off_unix_ms: None,
                detail: "fake".into(),
            }),
            hook: Mutex::default(),
            delay: Mutex::default(),
        }
    }
}

impl FakePower {
    /// Every answer takes `d` (a slow BMC); the request is recorded when it arrives.
    pub fn slow(&self, d: std::time::Duration) -> &Self {
        *lock(&self.delay) = d;
        self
    }

    /// A gateway answering every request with `outcome`.
    pub fn answering(outcome: PowerOutcome) -> Self {
        let me = Self::default();
        *lock(&me.default) = outcome;
        me
    }

    /// A gateway confirming power-off at `confirmed_off` for every request (a fence).
    pub fn confirming_off(confirmed_off: Timestamp) -> Self {
        Self::answering(PowerOutcome::Done {
            state: PowerState::Off,
            confirmed_off_unix_ms: Some(u64::try_from(confirmed_off.as_millisecond()).unwrap_or(0)),
            detail: "chassis power is off".into(),
        })
    }

    /// Queues the answer to the next unscripted request.
    pub fn then(&self, answer: Result<PowerOutcome, PowerError>) -> &Self {
        lock(&self.script).push_back(answer);
        self
    }

    /// Runs `f` on every request before it is answered (a machine that reboots when
    /// cycled, …).
    pub fn on_request(&self, f: impl Fn(&PowerRequest) + Send + Sync + 'static) {
        *lock(&self.hook) = Some(Box::new(f));
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<PowerRequest> {
        lock(&self.requests).clone()
    }
}

impl PowerControl for FakePower {
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>> {
        lock(&self.requests).push(req.clone());
        if let Some(f) = lock(&self.hook).as_ref() {
            f(&req);
        }
        let answer = lock(&self.script)
            .pop_front()
            .unwrap_or_else(|| Ok(lock(&self.default).clone()));
        let delay = *lock(&self.delay);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            answer.map(|outcome| PowerResponse {
                id: req.id,
                outcome,
            })
        })
    }
}

/// Agents' live health: one answer for every address unless an address has its own.
#[derive(Default)]
pub struct FakeAgents {
    all: Mutex<Option<AgentHealth>>,
    by_address: Mutex<HashMap<String, Option<AgentHealth>>>,
    lookups: Mutex<Vec<String>>,
}

impl FakeAgents {
    /// Every machine's agent reports `h` (`None`: never reported).
    pub fn with(h: Option<AgentHealth>) -> Self {
        let me = Self::default();
        me.set(h);
        me
    }

    /// Sets the answer for every address without one of its own.
    pub fn set(&self, h: Option<AgentHealth>) {
        *lock(&self.all) = h;
    }

    /// Sets the answer for `address`.
    pub fn set_for(&self, address: &str, h: Option<AgentHealth>) {
        lock(&self.by_address).insert(address.to_string(), h);
    }

    /// Addresses looked up so far.
    pub fn lookups(&self) -> Vec<String> {
        lock(&self.lookups).clone()
    }
}

impl AgentHealthView for FakeAgents {
    fn agent_health(&self, address: &str) -> Option<AgentHealth> {
        lock(&self.lookups).push(address.to_string());
        match lock(&self.by_address).get(address) {
            Some(h) => h.clone(),
            None => lock(&self.all).clone(),
        }
    }
}

/// A drainer where machine `a` is node `n-a` (or no machine is a node), drains stay in
/// progress until [`FakeDrainer::finish_drains`] (or play scripted answers), and uncordons
/// and Events are recorded.
#[derive(Default)]
pub struct FakeDrainer {
    not_nodes: bool,
    no_view: bool,
    done: Mutex<bool>,
    drain_script: Mutex<VecDeque<Result<DrainProgress, KubeError>>>,
    lookups: Mutex<Vec<String>>,
    drains: Mutex<Vec<String>>,
    uncordons: Mutex<Vec<String>>,
    events: Mutex<Vec<(String, NodeEvent, String)>>,
}

impl FakeDrainer {
    /// A drainer for a cluster where no machine is a node.
    pub fn without_nodes() -> Self {
        Self {
            not_nodes: true,
            ..Self::default()
        }
    }

    /// A drainer whose node view has not been filled yet: [`Drainer::known_node`] knows
    /// nothing, [`Drainer::node_for`] still finds every node.
    pub fn without_view() -> Self {
        Self {
            no_view: true,
            ..Self::default()
        }
    }

    /// From now on, every unscripted drain pass reports `Done`.
    pub fn finish_drains(&self) {
        *lock(&self.done) = true;
    }

    /// Queues the answer to the next drain pass.
    pub fn then(&self, answer: Result<DrainProgress, KubeError>) -> &Self {
        lock(&self.drain_script).push_back(answer);
        self
    }

    /// Addresses whose node was looked up so far.
    pub fn lookups(&self) -> Vec<String> {
        lock(&self.lookups).clone()
    }

    /// The node of every drain pass so far.
    pub fn drains(&self) -> Vec<String> {
        lock(&self.drains).clone()
    }

    /// Nodes uncordoned so far, in order.
    pub fn uncordons(&self) -> Vec<String> {
        lock(&self.uncordons).clone()
    }

    /// Events recorded so far: (node, event, message).
    pub fn events(&self) -> Vec<(String, NodeEvent, String)> {
        lock(&self.events).clone()
    }
}

impl Drainer for FakeDrainer {
    fn node_for(&self, address: &str) -> BoxFuture<'_, Result<Option<String>, KubeError>> {
        lock(&self.lookups).push(address.to_string());
        let n = (!self.not_nodes).then(|| format!("n-{address}"));
        Box::pin(async move { Ok(n) })
    }

    fn known_node(&self, address: &str) -> Option<String> {
        (!self.not_nodes && !self.no_view).then(|| format!("n-{address}"))
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        _opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, KubeError>> {
        lock(&self.drains).push(node.to_string());
        let answer = lock(&self.drain_script).pop_front().unwrap_or_else(|| {
            Ok(if *lock(&self.done) {
                DrainProgress::Done
            } else {
                DrainProgress::InProgress {
                    remaining: 1,
                    detail: "pod p terminating".into(),
                }
            })
        });
        Box::pin(async move { answer })
    }

    fn uncordon_if_ours<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), KubeError>> {
        lock(&self.uncordons).push(node.to_string());
        Box::pin(async { Ok(()) })
    }

    fn record_event<'a>(
        &'a self,
        node: &'a str,
        event: NodeEvent,
        message: &'a str,
    ) -> BoxFuture<'a, ()> {
        lock(&self.events).push((node.to_string(), event, message.to_string()));
        Box::pin(async {})
    }
}

/// What a [`FakeNodeRelease`] was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseCall {
    /// `save_node_metadata(node)`.
    Save(String),
    /// `release_plan(node)`.
    Plan(String),
    /// `release(node, proof.describe(), how)`.
    Release(String, String, Release),
    /// `restore(node, proof.describe(), how)`.
    Restore(String, String, Release),
}

/// Node release: records calls; releases and restores play scripted progress, then `Done`;
/// the plan is the out-of-service taint unless set.
pub struct FakeNodeRelease {
    calls: Mutex<Vec<ReleaseCall>>,
    plan: Mutex<Release>,
    releases: Mutex<VecDeque<Result<ReleaseProgress, KubeError>>>,
    restores: Mutex<VecDeque<Result<RestoreProgress, KubeError>>>,
}

impl Default for FakeNodeRelease {
    fn default() -> Self {
        Self {
            calls: Mutex::default(),
            plan: Mutex::new(Release::Taint),
            releases: Mutex::default(),
            restores: Mutex::default(),
        }
    }
}

impl FakeNodeRelease {
    /// Sets the release plan.
    pub fn plan(&self, how: Release) {
        *lock(&self.plan) = how;
    }

    /// Queues the answer to the next release pass.
    pub fn then_release(&self, answer: Result<ReleaseProgress, KubeError>) -> &Self {
        lock(&self.releases).push_back(answer);
        self
    }

    /// Queues the answer to the next restore pass.
    pub fn then_restore(&self, answer: Result<RestoreProgress, KubeError>) -> &Self {
        lock(&self.restores).push_back(answer);
        self
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<ReleaseCall> {
        lock(&self.calls).clone()
    }
}

impl NodeRelease for FakeNodeRelease {
    fn save_node_metadata<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<SavedNodeMetadata, KubeError>> {
        lock(&self.calls).push(ReleaseCall::Save(node.to_string()));
        let saved = SavedNodeMetadata {
            name: node.to_string(),
            internal_ip: None,
            labels: Default::default(),
            annotations: Default::default(),
        };
        Box::pin(async move { Ok(saved) })
    }

    fn release_plan<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Release, KubeError>> {
        lock(&self.calls).push(ReleaseCall::Plan(node.to_string()));
        let plan = lock(&self.plan).clone();
        Box::pin(async move { Ok(plan) })
    }

    fn release<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<ReleaseProgress, KubeError>> {
        lock(&self.calls).push(ReleaseCall::Release(
            node.to_string(),
            proof.describe(),
            how.clone(),
        ));
        let answer = lock(&self.releases)
            .pop_front()
            .unwrap_or(Ok(ReleaseProgress::Done));
        Box::pin(async move { answer })
    }

    fn restore<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<RestoreProgress, KubeError>> {
        lock(&self.calls).push(ReleaseCall::Restore(
            node.to_string(),
            proof.describe(),
            how.clone(),
        ));
        let answer = lock(&self.restores)
            .pop_front()
            .unwrap_or(Ok(RestoreProgress::Done));
        Box::pin(async move { answer })
    }
}

/// A node view holding whatever snapshot the test sets; counts reads.
#[derive(Default)]
pub struct FakeNodeView {
    current: Mutex<Arc<NodeViewSnapshot>>,
    reads: Mutex<u64>,
    failure: Mutex<Option<String>>,
}

impl FakeNodeView {
    /// Sets (or, with `None`, clears) the last refresh's failure.
    pub fn fail(&self, failure: Option<&str>) {
        *lock(&self.failure) = failure.map(str::to_string);
    }

    /// Replaces the snapshot.
    pub fn set(&self, snapshot: NodeViewSnapshot) {
        *lock(&self.current) = Arc::new(snapshot);
    }

    /// Snapshots read so far.
    pub fn reads(&self) -> u64 {
        *lock(&self.reads)
    }
}

impl NodeViewSource for FakeNodeView {
    fn snapshot(&self) -> Arc<NodeViewSnapshot> {
        *lock(&self.reads) += 1;
        lock(&self.current).clone()
    }

    fn last_failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use protocol::gateway::PowerAction;

    use super::*;
    use crate::fence::proof::confirm_power_off;

    #[tokio::test]
    async fn fake_power_records_and_plays_its_script_then_the_default() {
        let p = FakePower::default();
        p.then(Err(PowerError::NotAvailable {
            address: "10.0.0.1".into(),
            reason: "none".into(),
        }));
        let req = |id: &str| PowerRequest {
            id: id.into(),
            address: "10.0.0.1".into(),
            serial: String::new(),
            action: PowerAction::Cycle,
            timeout_ms: 0,
        };
        assert!(p.power(req("a")).await.is_err());
        let r = p.power(req("b")).await.unwrap();
        assert_eq!(r.id, "b");
        assert!(matches!(r.outcome, PowerOutcome::Done { .. }));
        assert_eq!(p.requests().len(), 2);
    }

    #[tokio::test]
    async fn a_confirming_fake_power_yields_a_real_proof_and_the_view_reports_freshness() {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let p = FakePower::confirming_off(at);
        let proof = confirm_power_off(&p, "10.0.0.1", "S", "f1", 0)
            .await
            .unwrap();
        assert_eq!(proof.confirmed_off(), at);
        let r = FakeNodeRelease::default();
        let how = r.release_plan("n1").await.unwrap();
        let down: DownProof = proof.into();
        assert_eq!(
            r.release("n1", &down, &how).await.unwrap(),
            ReleaseProgress::Done
        );
        assert!(matches!(r.calls()[1], ReleaseCall::Release(..)));
        let v = FakeNodeView::default();
        assert!(!v.is_fresh(at, Duration::from_secs(30)));
        v.set(NodeViewSnapshot {
            refreshed_at: Some(at),
            ..Default::default()
        });
        assert!(v.is_fresh(at, Duration::from_secs(30)));
        assert_eq!(v.reads(), 2);
    }
}
