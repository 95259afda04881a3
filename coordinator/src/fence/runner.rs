//! The fence runner: carries out the action of a flow's committed state, feeds what it saw
//! to the pure [`step`], and commits the result before the next action (so a flow resumed
//! after a restart repeats at most the last action, whose effects are idempotent or answered
//! from the gateway's durable record).
//!
//! It holds the proof of power-off in memory only. A release pass without one (after a
//! restart) first re-reads the power state ([`reconfirm_power_off`]): no release without a
//! confirmed off, even from a committed row. A restore pass after a restart rebuilds the
//! proof from the committed confirmation, since the machine is on again by then.
//!
//! kdump: before the first power-off it reads the kdump view ([`Flow::checks_kdump_first`]),
//! and a release pass of the kdump leg builds its [`KdumpProof`] from the view *now*
//! ("dumping", nothing since), never from the committed row, so a dump that ended stops
//! the release. A restore pass after a restart rebuilds the kdump proof from the committed
//! leg when the flow never confirmed an off. The view is [`NoKdump`] unless
//! [`FenceRunner::with_kdump`] gives one.
//!
//! Power-state reads get a fresh request id each time (a repeated id would be answered from
//! the gateway's record of an earlier read); power actions use the flow's ids, which change
//! only after a failed answer, and each gives the gateway only what is left of its state's
//! limit. A pass that changes nothing because a peer did not answer, and the first pass of a
//! flow left by an earlier process in a power state, add a line to the flow's history (what
//! it waits for, until when; see [`hold`]), once per state. This module decides nothing:
//! every choice is in [`flow`] and [`hold`].
//!
//! [`flow`]: super::flow
//! [`hold`]: super::hold
//! [`KdumpProof`]: super::proof::KdumpProof

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::gateway::{PowerAction, PowerOutcome, PowerRequest};
use tracing::{info, warn};

use super::flow::{Action, FenceTimeouts, Flow, Observation, PowerAnswer, State, step};
use super::hold::{self, Hold};
use super::kdump::{DumpSeen, KdumpView, NoKdump};
use super::killpoint::{KillPoints, Killed};
use super::metrics::FenceMetrics;
use super::proof::{
    DownProof, KdumpProof, PowerOffProof, ProofError, confirm_power_off, reconfirm_power_off,
};
use super::store::FenceStore;
use crate::clock::{Clock, to_unix_ms};
use crate::gateway::PowerControl;
use crate::k8s::NodeRelease;
use crate::k8s::release::{ReleaseProgress, RestoreProgress};
use crate::repair::AgentHealthView;
use crate::store::{Store, StoreError};

/// Why the runner could not go on with a flow.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The store failed: the flow stays where it was committed.
    #[error("fence flow store: {0}")]
    Store(#[from] StoreError),
    /// The machine already has an unfinished fence flow.
    #[error("machine {address} already has a fence flow in progress")]
    InProgress {
        /// The machine.
        address: String,
    },
    /// No flow has this id.
    #[error("no fence flow {0}")]
    NotFound(u64),
    /// A kill point stopped the runner (tests only).
    #[error(transparent)]
    Killed(#[from] Killed),
}

impl FenceError {
    /// True when trying again later may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            FenceError::Store(e) => e.is_retriable(),
            FenceError::InProgress { .. } => true,
            FenceError::NotFound(_) | FenceError::Killed(_) => false,
        }
    }
}

/// What to fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRequest {
    /// Machine address.
    pub address: String,
    /// Machine serial.
    pub serial: String,
    /// Its Kubernetes Node.
    pub node: String,
    /// Leave it off if the flow fails after the release.
    pub keep_off: bool,
}

/// The systems a runner works with.
#[derive(Clone)]
pub struct FenceDeps {
    /// Power, through the rack gateways.
    pub power: Arc<dyn PowerControl>,
    /// Releasing and restoring Nodes.
    pub release: Arc<dyn NodeRelease>,
    /// The agents' live health.
    pub agents: Arc<dyn AgentHealthView>,
    /// Time.
    pub clock: Arc<dyn Clock>,
}

/// The time limits of a machine's fence flow, by machine address (per BMC: some confirm off
/// or accept power-on much later than others).
pub type TimeoutsOf = Arc<dyn Fn(&str) -> FenceTimeouts + Send + Sync>;

/// Runs fence flows (see the module doc).
pub struct FenceRunner {
    store: Store,
    store_id: String,
    deps: FenceDeps,
    timeouts: TimeoutsOf,
    poll: Duration,
    kill: KillPoints,
    proofs: Mutex<HashMap<u64, PowerOffProof>>,
    /// Per flow this process has driven, the hold already said in its current state (see
    /// [`hold`]); a flow missing here was left unfinished by an earlier process.
    said: Mutex<HashMap<u64, Option<Hold>>>,
    kdump: Arc<dyn KdumpView>,
    metrics: Arc<FenceMetrics>,
}

/// Pause between passes of a state that did not change (waiting on pods, the agent, a
/// busy BMC): short enough that a release completes within a second of the API server
/// saying so, long enough not to load the API server or the gateway.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);

impl FenceRunner {
    /// A runner over `store`, whose identity `store_id` prefixes power request ids.
    pub fn new(store: Store, store_id: impl Into<String>, deps: FenceDeps) -> Self {
        Self {
            store,
            store_id: store_id.into(),
            deps,
            timeouts: Arc::new(|_: &str| FenceTimeouts::default()),
            poll: DEFAULT_POLL,
            kill: KillPoints::from_env(),
            proofs: Mutex::default(),
            said: Mutex::default(),
            kdump: Arc::new(NoKdump),
            metrics: Arc::default(),
        }
    }

    /// Counts the flows this runner starts and moves in `metrics` (served on `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<FenceMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reads crash dumps from `kdump` (the coordinator's [`crate::kdump::Kdumps`]): a
    /// machine dumping when its flow is about to power it off is released on the dump and
    /// power-cycled after it. Without this, flows never hear of dumps ([`NoKdump`]).
    pub fn with_kdump(mut self, kdump: Arc<dyn KdumpView>) -> Self {
        self.kdump = kdump;
        self
    }

    /// Sets the time limits of every machine.
    pub fn with_timeouts(mut self, t: FenceTimeouts) -> Self {
        self.timeouts = Arc::new(move |_: &str| t);
        self
    }

    /// Sets the time limits per machine (from its BMC's or machine type's settings).
    pub fn with_timeouts_of(mut self, of: TimeoutsOf) -> Self {
        self.timeouts = of;
        self
    }

    /// Sets the pause between passes that changed nothing.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The kill points (tests arm them).
    pub fn kill_points(&self) -> &KillPoints {
        &self.kill
    }

    /// Commits a new flow for `req` at `Plan`, with the agent's current boot id; returns its
    /// id. Nothing is acted on until [`FenceRunner::advance`] or [`FenceRunner::run`].
    pub async fn start(&self, req: FenceRequest) -> Result<u64, FenceError> {
        let now = self.deps.clock.now();
        let boot = self.deps.agents.boot_id(&req.address);
        let flow = Flow::new(
            &req.address,
            &req.serial,
            &req.node,
            boot,
            req.keep_off,
            now,
        );
        self.kill.hit("before:plan")?;
        let id = self
            .store
            .start(flow.clone(), "fence requested".into(), now)
            .await?
            .ok_or(FenceError::InProgress {
                address: req.address.clone(),
            })?;
        self.metrics.started(id);
        self.said_lock().insert(id, None);
        self.kill.hit("after:plan")?;
        info!(flow = id, machine = %req.address, node = %req.node, "fence flow started");
        Ok(id)
    }

    /// The committed flow `id`.
    pub async fn load(&self, id: u64) -> Result<Flow, FenceError> {
        self.store.load(id).await?.ok_or(FenceError::NotFound(id))
    }

    /// One pass: the committed state's action, the step, and the commit of what changed.
    /// Returns the flow as now committed.
    pub async fn advance(&self, id: u64) -> Result<Flow, FenceError> {
        let flow = self.load(id).await?;
        self.metrics.at(id, &flow.state);
        if flow.state.is_terminal() {
            self.forget(id);
            return Ok(flow);
        }
        let action = flow.action(&self.store_id);
        let first = !self.said_lock().contains_key(&id);
        if first {
            // Left unfinished by a coordinator that stopped: a power request it sent may
            // still be running at the gateway, which the repeat below waits for.
            // (Not when the machine is dumping: the flow takes the kdump leg instead.)
            let dumping = flow.checks_kdump_first()
                && matches!(self.kdump.dump(&flow.address), DumpSeen::Dumping { .. });
            let line = hold::resumed(&flow, &action).filter(|_| !dumping);
            self.said_lock()
                .insert(id, line.as_ref().map(|_| Hold::Resumed));
            if let Some(line) = line {
                info!(flow = id, machine = %flow.address, "{line}");
                self.note(&flow, line).await?;
            }
        }
        let (obs, read_id, said) = self.act(&flow, &action).await;
        let now = self.deps.clock.now();
        let held = hold::holding(&flow, &obs);
        let mut s = step(&flow, obs, now, &(self.timeouts)(&flow.address));
        // Which fencing level acted, and why the ones before it did not, in the gateway's
        // words: the history and `coordinatorctl fence show` say it.
        if let (Some(e), Some(said)) = (s.event.as_mut(), said) {
            e.push_str(&format!(" (gateway: {said})"));
        }
        let Some(event) = s.event.take() else {
            if let Some((kind, line)) = held {
                let before = self.said_lock().insert(id, Some(kind));
                if before != Some(Some(kind)) {
                    warn!(flow = id, machine = %flow.address, state = flow.state.kind(), "{line}");
                    self.note(&flow, line).await?;
                }
            }
            return Ok(flow);
        };
        self.said_lock().insert(id, None);
        if flow.state == State::ConfirmOff && s.flow.confirmed_off.is_some() {
            s.flow.confirm_request = read_id;
        }
        let kind = s.flow.state.kind();
        self.kill.hit(&format!("before:{kind}"))?;
        self.store
            .update(s.flow.clone(), event.clone(), now)
            .await?;
        self.metrics.moved(id, &s.flow.state);
        self.kill.hit(&format!("after:{kind}"))?;
        match &s.flow.state {
            State::Failed { detail } => {
                warn!(flow = id, machine = %flow.address, %detail, "fence flow failed")
            }
            state => {
                info!(flow = id, machine = %flow.address, state = state.kind(), %event, "fence flow moved")
            }
        }
        if s.flow.state.is_terminal() {
            self.forget(id);
        }
        Ok(s.flow)
    }

    /// Advances flow `id` until it is done or failed, pausing between passes that changed
    /// nothing.
    pub async fn run(&self, id: u64) -> Result<Flow, FenceError> {
        loop {
            let before = self.load(id).await?;
            let after = self.advance(id).await?;
            if after.state.is_terminal() {
                return Ok(after);
            }
            if after == before {
                tokio::time::sleep(self.poll).await;
            }
        }
    }

    /// Ids of the flows a restarted coordinator must resume, oldest first.
    pub async fn unfinished(&self) -> Result<Vec<u64>, FenceError> {
        let flows = self.store.unfinished().await?;
        for f in &flows {
            self.metrics.at(f.id, &f.state);
        }
        Ok(flows.into_iter().map(|f| f.id).collect())
    }

    fn forget(&self, id: u64) {
        self.proofs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.said_lock().remove(&id);
    }

    fn said_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Option<Hold>>> {
        self.said.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `line` to the history of flow `id` if it is still in `state` (a wait outside the
    /// runner, such as the repair step taking the agent's diagnostics before the flow's
    /// first power action); returns whether it did.
    pub async fn say_while(&self, id: u64, state: State, line: String) -> Result<bool, FenceError> {
        let now = self.deps.clock.now();
        match self.store.note(id, Some(state), line, now).await {
            Ok(said) => Ok(said),
            // Unknown flow: as `load` says it.
            Err(_) if self.store.load(id).await?.is_none() => Err(FenceError::NotFound(id)),
            Err(e) => Err(e.into()),
        }
    }

    /// Adds `line` to the history of `flow`, which stays as committed.
    async fn note(&self, flow: &Flow, line: String) -> Result<(), FenceError> {
        let now = self.deps.clock.now();
        self.store.note(flow.id, None, line, now).await?;
        Ok(())
    }

    fn held_proof(&self, id: u64) -> Option<PowerOffProof> {
        self.proofs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// The time limit a power request of `flow` gives the gateway: what is left of the
    /// state's committed deadline, at most `limit`. A new attempt late in the state (a busy
    /// BMC), or a flow resumed after a restart, then cannot keep the gateway working past
    /// the flow's own limit; at least 1 ms (0 would mean the gateway's default), so a request
    /// past the deadline is answered "not attempted" unless the gateway already ran its id.
    fn limit_ms(&self, flow: &Flow, limit: Duration) -> u64 {
        let left = flow.deadline.map_or(limit, |d| {
            let left = d.duration_since(self.deps.clock.now());
            Duration::try_from(left)
                .unwrap_or(Duration::ZERO)
                .min(limit)
        });
        ms(left).max(1)
    }

    fn read_id(&self, base: &str) -> String {
        format!("{base}-read{}", to_unix_ms(self.deps.clock.now()))
    }

    /// Re-reads the power state to confirm off; keeps the proof.
    async fn read_back(&self, flow: &Flow, request_id: &str) -> Result<PowerOffProof, PowerAnswer> {
        let clock = self.deps.clock.as_ref();
        match reconfirm_power_off(
            self.deps.power.as_ref(),
            clock,
            &flow.address,
            &flow.serial,
            request_id,
        )
        .await
        {
            Ok(p) => {
                self.proofs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(flow.id, p.clone());
                Ok(p)
            }
            Err(e) => Err(proof_error(e)),
        }
    }

    /// Carries out `action`; returns what was seen, the id of a read-back, and what the
    /// gateway said of a confirmed fence when it names the fencing level that acted (for the
    /// history).
    async fn act(
        &self,
        flow: &Flow,
        action: &Action,
    ) -> (Observation, Option<String>, Option<String>) {
        let d = &self.deps;
        let mut said = None;
        if flow.checks_kdump_first() {
            // A dumping machine is not powered off: the flow takes the kdump leg instead.
            let seen = self.kdump.dump(&flow.address);
            if matches!(seen, DumpSeen::Dumping { .. }) {
                return (Observation::Kdump(seen), None, None);
            }
        }
        let obs = match action {
            Action::Plan => match d.release.release_plan(&flow.node).await {
                Ok(how) => Observation::Planned(how),
                Err(e) => kube(e),
            },
            Action::Power {
                action: PowerAction::Fence,
                request_id,
            } => Observation::Power(
                match confirm_power_off(
                    d.power.as_ref(),
                    &flow.address,
                    &flow.serial,
                    request_id,
                    self.limit_ms(flow, (self.timeouts)(&flow.address).off),
                )
                .await
                {
                    Ok(p) => {
                        said = Some(p.gateway_said().to_string())
                            .filter(|s| s.contains("level ") && s.contains(" acted"));
                        PowerAnswer::ConfirmedOff(p.confirmed_off())
                    }
                    Err(e) => proof_error(e),
                },
            ),
            Action::Power { action, request_id } => {
                Observation::Power(self.power(flow, *action, request_id).await)
            }
            Action::ReadBack { request_id } => {
                let rid = self.read_id(request_id);
                let obs = match self.read_back(flow, &rid).await {
                    Ok(p) => PowerAnswer::ConfirmedOff(p.confirmed_off()),
                    Err(a) => a,
                };
                return (Observation::Power(obs), Some(rid), None);
            }
            Action::ReleasePass => self.release_pass(flow).await,
            Action::CheckAgent => Observation::Agent(d.agents.agent_health(&flow.address)),
            Action::RestorePass => self.restore_pass(flow).await,
            Action::CheckKdump => Observation::Kdump(self.kdump.dump(&flow.address)),
            Action::None => Observation::Tick,
        };
        (obs, None, said)
    }

    async fn power(&self, flow: &Flow, action: PowerAction, request_id: &str) -> PowerAnswer {
        let req = PowerRequest {
            id: request_id.to_string(),
            address: flow.address.clone(),
            serial: flow.serial.clone(),
            action,
            timeout_ms: self.limit_ms(flow, (self.timeouts)(&flow.address).on),
        };
        match self.deps.power.power(req).await {
            // The gateway restarted while it ran this id: it may or may not have reached the
            // BMC. An off or an on may be done again, so it is a new attempt (a new id), as
            // for a busy BMC; a machine is never left off on an unknown answer.
            Ok(r) if r.outcome.is_outcome_unknown() && action.is_idempotent() => {
                let PowerOutcome::Failed { detail, .. } = r.outcome else {
                    unreachable!("outcome unknown is a failure")
                };
                PowerAnswer::Failed {
                    detail,
                    retriable: true,
                }
            }
            Ok(r) => match r.outcome {
                PowerOutcome::Done { state, detail, .. } => PowerAnswer::Done { state, detail },
                PowerOutcome::Failed { detail, retriable } => {
                    PowerAnswer::Failed { detail, retriable }
                }
            },
            Err(e) if e.is_retriable() => PowerAnswer::NoAnswer {
                detail: e.to_string(),
            },
            Err(e) => PowerAnswer::Failed {
                detail: e.to_string(),
                retriable: false,
            },
        }
    }

    async fn release_pass(&self, flow: &Flow) -> Observation {
        if matches!(flow.state, State::KdumpRelease | State::KdumpWaitReleased) {
            return match self.kdump.dump(&flow.address) {
                DumpSeen::Dumping { started, .. } => {
                    let proof = KdumpProof::from_dump_in_progress(&flow.address, started);
                    self.release_with(flow, DownProof::from(proof)).await
                }
                ended => Observation::Kdump(ended),
            };
        }
        let proof = match self.held_proof(flow.id) {
            Some(p) => p,
            None => {
                let rid = self.read_id(&format!("{}-fence-{}-reconfirm", self.store_id, flow.id));
                match self.read_back(flow, &rid).await {
                    Ok(p) => p,
                    Err(a) => return Observation::Power(a),
                }
            }
        };
        self.release_with(flow, DownProof::from(proof)).await
    }

    async fn release_with(&self, flow: &Flow, down: DownProof) -> Observation {
        let Some(how) = &flow.how else {
            return Observation::KubeFailed {
                detail: "no release plan was committed".into(),
                retriable: false,
            };
        };
        match self.deps.release.release(&flow.node, &down, how).await {
            Ok(ReleaseProgress::Done) => Observation::Released {
                done: true,
                detail: String::new(),
            },
            Ok(ReleaseProgress::Waiting {
                pods,
                volume_attachments,
                node_ready,
            }) => Observation::Released {
                done: false,
                detail: format!(
                    "{} to go, {}{}",
                    plural(pods, "pod", "pods"),
                    plural(volume_attachments, "VolumeAttachment", "VolumeAttachments"),
                    if node_ready {
                        "; not released: the Node still reports Ready though its machine \
                         was confirmed off; waiting for the node lifecycle controller (if its \
                         kubelet keeps renewing, the machine confirmed off is not this node: \
                         check the BMC mapping)"
                    } else {
                        ""
                    }
                ),
            },
            Err(e) => kube(e),
        }
    }

    async fn restore_pass(&self, flow: &Flow) -> Observation {
        let proof = self.held_proof(flow.id).map(DownProof::from).or_else(|| {
            let off = flow.confirmed_off.map(|at| {
                PowerOffProof::from_committed_confirmation(
                    &flow.address,
                    flow.confirm_request.clone().unwrap_or_default(),
                    at,
                )
            });
            // A kdump flow whose power-off failed after its release: restore on the dump it
            // released on (the machine is on again by now).
            let dump = flow
                .kdump
                .map(|leg| KdumpProof::from_dump_in_progress(&flow.address, leg.started));
            off.map(DownProof::from).or(dump.map(DownProof::from))
        });
        let (Some(down), Some(how)) = (proof, &flow.how) else {
            return Observation::KubeFailed {
                detail: "no committed power-off confirmation or release plan to restore from"
                    .into(),
                retriable: false,
            };
        };
        match self.deps.release.restore(&flow.node, &down, how).await {
            Ok(RestoreProgress::Done) => Observation::Restored { done: true },
            Ok(RestoreProgress::WaitingForNode) => Observation::Restored { done: false },
            Err(e) => kube(e),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn kube(e: crate::k8s::KubeError) -> Observation {
    Observation::KubeFailed {
        retriable: e.is_retriable(),
        detail: e.to_string(),
    }
}

fn proof_error(e: ProofError) -> PowerAnswer {
    match e {
        ProofError::Power { ref source, .. } if source.is_retriable() => PowerAnswer::NoAnswer {
            detail: e.to_string(),
        },
        ProofError::Power { .. } => PowerAnswer::Failed {
            detail: e.to_string(),
            retriable: false,
        },
        ProofError::NotConfirmed {
            detail, retriable, ..
        } => PowerAnswer::Failed { detail, retriable },
    }
}

/// `n` and the word for it: `1 pod`, `2 pods`, `0 pods`.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use jiff::{SignedDuration, Timestamp};
    use protocol::gateway::{PowerResponse, PowerState};

    use super::*;
    use crate::fence::flow::State;
    use crate::gateway::PowerError;
    use crate::k8s::KubeError;
    use crate::k8s::release::{Release, SavedNodeMetadata};
    use crate::repair::AgentHealth;
    use crate::testing::FakeClock;

    const ADDR: &str = "10.0.0.1";

    /// One machine, its BMC behind a gateway with a durable request record, its Node and its
    /// agent, with one log of what was *executed*, in order.
    struct World {
        clock: Arc<FakeClock>,
        on: Mutex<bool>,
        boots: Mutex<u32>,
        record: Mutex<HashMap<String, PowerResponse>>,
        log: Mutex<Vec<String>>,
        refuse_off: Mutex<Option<String>>,
        busy_on: Mutex<u32>,
        release_waits: Mutex<u32>,
        release_refused: Mutex<bool>,
        plan: Mutex<Release>,
        lose_answers: Mutex<u32>,
        /// The gateway restarts while running the first request of these actions: it
        /// reaches the BMC, but the id answers "outcome unknown" from then on.
        restart_during: Mutex<Vec<PowerAction>>,
        /// A crash dump: (started, "dump done" at, if ever), with a 60 s kdump_timeout.
        dump: Mutex<Option<(Timestamp, Option<Timestamp>)>>,
        /// Sees every power request as sent.
        on_request: Mutex<Option<OnRequest>>,
    }

    const KDUMP_TIMEOUT: Duration = Duration::from_secs(60);

    type OnRequest = Box<dyn Fn(&PowerRequest) + Send>;

    impl KdumpView for World {
        fn dump(&self, _address: &str) -> DumpSeen {
            let now = self.clock.now();
            match *self.dump.lock().unwrap() {
                None => DumpSeen::None,
                Some((_, Some(done))) if now >= done => DumpSeen::Done { at: done },
                Some((started, _)) => DumpSeen::Dumping {
                    started,
                    timeout: KDUMP_TIMEOUT,
                },
            }
        }
    }

    impl World {
        /// True while the dump runs and its kdump_timeout has not passed: no power action
        /// may reach the BMC then.
        fn dumping_now(&self) -> bool {
            let now = self.clock.now();
            self.dump.lock().unwrap().is_some_and(|(started, done)| {
                done.is_none_or(|d| now < d)
                    && now < started + SignedDuration::try_from(KDUMP_TIMEOUT).unwrap()
            })
        }
    }

    impl World {
        fn new(clock: Arc<FakeClock>) -> Arc<Self> {
            Arc::new(Self {
                clock,
                on: Mutex::new(true),
                boots: Mutex::new(0),
                record: Mutex::default(),
                log: Mutex::default(),
                refuse_off: Mutex::default(),
                busy_on: Mutex::default(),
                release_waits: Mutex::new(1),
                release_refused: Mutex::default(),
                plan: Mutex::new(Release::Taint),
                lose_answers: Mutex::default(),
                restart_during: Mutex::default(),
                dump: Mutex::default(),
                on_request: Mutex::default(),
            })
        }
        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
        fn push(&self, s: &str) {
            self.log.lock().unwrap().push(s.to_string());
        }
        fn count(&self, what: &str) -> usize {
            self.log().iter().filter(|l| l.as_str() == what).count()
        }
        fn execute(&self, req: &PowerRequest) -> PowerOutcome {
            let now_ms = u64::try_from(self.clock.now().as_millisecond()).unwrap();
            let done = |state: PowerState, off: Option<u64>| PowerOutcome::Done {
                state,
                confirmed_off_unix_ms: off,
                detail: "sim".into(),
            };
            if matches!(req.action, PowerAction::Fence | PowerAction::On) {
                assert!(!self.dumping_now(), "{:?} sent during a dump", req.action);
            }
            match req.action {
                PowerAction::Fence => {
                    if let Some(why) = self.refuse_off.lock().unwrap().clone() {
                        return PowerOutcome::Failed {
                            detail: why,
                            retriable: false,
                        };
                    }
                    *self.on.lock().unwrap() = false;
                    self.push("off");
                    done(PowerState::Off, Some(now_ms))
                }
                PowerAction::On => {
                    let mut busy = self.busy_on.lock().unwrap();
                    if *busy > 0 {
                        *busy -= 1;
                        return PowerOutcome::Failed {
                            detail: "409 Conflict".into(),
                            retriable: true,
                        };
                    }
                    *self.on.lock().unwrap() = true;
                    *self.boots.lock().unwrap() += 1;
                    self.push("on");
                    done(PowerState::On, None)
                }
                PowerAction::Status => {
                    if *self.on.lock().unwrap() {
                        done(PowerState::On, None)
                    } else {
                        done(PowerState::Off, None)
                    }
                }
                other => panic!("the fence flow sent {other:?}"),
            }
        }
    }

    impl PowerControl for World {
        fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>> {
            if let Some(f) = &*self.on_request.lock().unwrap() {
                f(&req);
            }
            let resp = {
                let mut rec = self.record.lock().unwrap();
                match rec.get(&req.id) {
                    Some(r) => r.clone(),
                    None => {
                        let mut outcome = self.execute(&req);
                        let mut restarts = self.restart_during.lock().unwrap();
                        if let Some(i) = restarts.iter().position(|a| *a == req.action) {
                            restarts.remove(i);
                            outcome = PowerOutcome::Failed {
                                detail: format!(
                                    "{}the gateway restarted while request {} ran",
                                    protocol::gateway::OUTCOME_UNKNOWN,
                                    req.id
                                ),
                                retriable: false,
                            };
                        }
                        let r = PowerResponse {
                            id: req.id.clone(),
                            outcome,
                        };
                        rec.insert(req.id.clone(), r.clone());
                        r
                    }
                }
            };
            let mut lose = self.lose_answers.lock().unwrap();
            let lost = *lose > 0;
            if lost {
                *lose -= 1;
            }
            Box::pin(async move {
                if lost {
                    return Err(PowerError::AnswerLost {
                        gateway: "g".into(),
                        id: req.id,
                        detail: "connection lost".into(),
                    });
                }
                Ok(resp)
            })
        }
    }

    impl NodeRelease for World {
        fn save_node_metadata<'a>(
            &'a self,
            node: &'a str,
        ) -> BoxFuture<'a, Result<SavedNodeMetadata, KubeError>> {
            unreachable!("the plan carries the metadata: {node}")
        }
        fn release_plan<'a>(&'a self, _node: &'a str) -> BoxFuture<'a, Result<Release, KubeError>> {
            let plan = self.plan.lock().unwrap().clone();
            Box::pin(async move { Ok(plan) })
        }
        fn release<'a>(
            &'a self,
            _node: &'a str,
            proof: &'a DownProof,
            _how: &'a Release,
        ) -> BoxFuture<'a, Result<ReleaseProgress, KubeError>> {
            match proof {
                DownProof::Kdump(k) => {
                    assert!(self.dumping_now(), "released on a dump that ended");
                    assert_eq!(
                        Some(k.dump_started()),
                        self.dump.lock().unwrap().map(|d| d.0)
                    );
                    self.push("release-on-dump");
                    let mut waits = self.release_waits.lock().unwrap();
                    let answer = if *waits > 0 {
                        *waits -= 1;
                        Ok(ReleaseProgress::Waiting {
                            pods: 1,
                            volume_attachments: 0,
                            node_ready: false,
                        })
                    } else {
                        Ok(ReleaseProgress::Done)
                    };
                    return Box::pin(async move { answer });
                }
                DownProof::PowerOff(_) => assert!(
                    !*self.on.lock().unwrap(),
                    "released while the machine is on"
                ),
            }
            assert_eq!(proof.address(), ADDR);
            self.push("release");
            let refused = *self.release_refused.lock().unwrap();
            let mut waits = self.release_waits.lock().unwrap();
            let answer = if refused {
                Err(KubeError::Refused("forbidden".into()))
            } else if *waits > 0 {
                *waits -= 1;
                Ok(ReleaseProgress::Waiting {
                    pods: 1,
                    volume_attachments: 1,
                    node_ready: false,
                })
            } else {
                Ok(ReleaseProgress::Done)
            };
            Box::pin(async move { answer })
        }
        fn restore<'a>(
            &'a self,
            _node: &'a str,
            _proof: &'a DownProof,
            _how: &'a Release,
        ) -> BoxFuture<'a, Result<RestoreProgress, KubeError>> {
            self.push("restore");
            Box::pin(async { Ok(RestoreProgress::Done) })
        }
    }

    impl AgentHealthView for World {
        fn agent_health(&self, _address: &str) -> Option<AgentHealth> {
            if !*self.on.lock().unwrap() {
                return None;
            }
            let now = self.clock.now();
            Some(AgentHealth {
                boot_id: format!("boot-{}", self.boots.lock().unwrap()),
                last_report: now,
                ok_since: Some(now),
            })
        }
    }

    struct Rig {
        _dir: tempfile::TempDir,
        db: std::path::PathBuf,
        clock: Arc<FakeClock>,
        world: Arc<World>,
    }

    fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let clock = Arc::new(FakeClock::new(
            Timestamp::from_second(1_800_000_000).unwrap(),
        ));
        Rig {
            world: World::new(clock.clone()),
            db,
            _dir: dir,
            clock,
        }
    }

    impl Rig {
        /// A runner, as a freshly started coordinator makes it.
        fn runner(&self) -> FenceRunner {
            let deps = FenceDeps {
                power: self.world.clone(),
                release: self.world.clone(),
                agents: self.world.clone(),
                clock: self.clock.clone(),
            };
            FenceRunner::new(Store::open(&self.db).unwrap(), "aa11", deps)
                .with_poll(Duration::ZERO)
                .with_kdump(self.world.clone())
        }

        /// Advances until terminal, the clock moving a second per pass.
        async fn finish(&self, r: &FenceRunner, id: u64) -> Result<Flow, FenceError> {
            for _ in 0..1000 {
                self.clock.advance(SignedDuration::from_secs(1));
                let f = r.advance(id).await?;
                if f.state.is_terminal() {
                    return Ok(f);
                }
            }
            panic!("flow {id} did not finish");
        }
    }

    fn request() -> FenceRequest {
        FenceRequest {
            address: ADDR.into(),
            serial: "SER1".into(),
            node: "n1".into(),
            keep_off: false,
        }
    }

    /// Off once, then releases, then on once, then restore; nothing else.
    fn assert_clean_fence(w: &World) {
        let log = w.log();
        assert_eq!((w.count("off"), w.count("on")), (1, 1), "{log:?}");
        let off = log.iter().position(|l| l == "off").unwrap();
        let on = log.iter().position(|l| l == "on").unwrap();
        let releases: Vec<_> = log
            .iter()
            .enumerate()
            .filter(|(_, l)| l.as_str() == "release")
            .map(|(i, _)| i)
            .collect();
        assert!(!releases.is_empty(), "{log:?}");
        assert!(
            releases.iter().all(|&i| off < i && i < on),
            "every release between the confirmed off and the power-on: {log:?}"
        );
        assert!(log.iter().skip(on).all(|l| l != "release"), "{log:?}");
        assert!(*w.on.lock().unwrap(), "the machine ends powered on");
    }

    #[tokio::test]
    async fn a_fence_runs_to_done_releasing_only_while_off() {
        let r = rig();
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        assert_clean_fence(&r.world);
        assert_eq!(r.world.log().last().map(String::as_str), Some("restore"));
        let store = Store::open(&r.db).unwrap();
        let h = store
            .with(|c| crate::fence::store::sqlite::history_of(c, id))
            .unwrap();
        let states: Vec<_> = h.iter().map(|l| l.state.as_str()).collect();
        assert_eq!(
            states,
            [
                "plan",
                "power-off",
                "confirm-off",
                "release",
                "wait-released",
                "power-on",
                "wait-back",
                "restore",
                "done"
            ]
        );
        assert!(
            run.start(request()).await.is_ok(),
            "a finished flow does not block the next"
        );
    }

    /// `/metrics` follows the runner: a started flow is running at `plan`; a runner of a
    /// restarted coordinator counts what it resumes as running from `unfinished`, and the
    /// flow's end once, as `done`.
    #[tokio::test]
    async fn metrics_count_running_flows_across_a_restart_and_each_end_once() {
        let value = |m: &FenceMetrics, series: &str| -> u64 {
            let out = m.render();
            out.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{series} missing in\n{out}"))
        };
        let r = rig();
        let before = Arc::new(FenceMetrics::default());
        let id = r
            .runner()
            .with_metrics(before.clone())
            .start(request())
            .await
            .unwrap();
        assert_eq!(value(&before, "fleetmend_fence_flows_started_total"), 1);
        assert_eq!(
            value(&before, "fleetmend_fence_flows_running{state=\"plan\"}"),
            1
        );

        // The coordinator restarts: a new runner, new counters, the flow still in the store.
        let after = Arc::new(FenceMetrics::default());
        let run = r.runner().with_metrics(after.clone());
        assert_eq!(run.unfinished().await.unwrap(), [id]);
        assert_eq!(
            value(&after, "fleetmend_fence_flows_running{state=\"plan\"}"),
            1
        );
        assert_eq!(value(&after, "fleetmend_fence_flows_started_total"), 0);
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        run.advance(id).await.unwrap(); // a pass over the finished flow counts nothing
        assert_eq!(
            value(
                &after,
                "fleetmend_fence_flows_finished_total{outcome=\"done\"}"
            ),
            1
        );
        assert_eq!(
            value(
                &after,
                "fleetmend_fence_flows_finished_total{outcome=\"failed\"}"
            ),
            0
        );
        assert!(
            after
                .render()
                .lines()
                .filter(|l| l.starts_with("fleetmend_fence_flows_running{"))
                .all(|l| l.ends_with(" 0")),
            "{}",
            after.render()
        );
    }

    #[tokio::test]
    async fn per_machine_timeouts_bound_a_busy_power_on() {
        let r = rig();
        *r.world.busy_on.lock().unwrap() = 1000;
        let run = r.runner().with_timeouts_of(Arc::new(|addr: &str| {
            assert_eq!(addr, ADDR);
            FenceTimeouts {
                on: Duration::from_secs(5),
                ..FenceTimeouts::default()
            }
        }));
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        let State::Failed { detail } = &f.state else {
            panic!("{f:?}")
        };
        assert!(detail.contains("within 5 s"), "{detail}");
        let ons = r
            .world
            .record
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.contains("-on-"))
            .count();
        assert!(
            (4..=6).contains(&ons),
            "one attempt a second for 5 s: {ons}"
        );
        assert_eq!(
            r.world.count("on"),
            0,
            "the machine is left off, and the flow says so"
        );
    }

    /// Each power-on attempt of a BMC that stays busy gives the gateway only what is left of
    /// the on limit, so the last attempt cannot keep it trying past the flow's deadline.
    #[tokio::test]
    async fn every_power_attempt_gives_the_gateway_only_what_is_left_of_the_state_limit() {
        let r = rig();
        *r.world.busy_on.lock().unwrap() = 1000;
        let limits = Arc::new(Mutex::new(Vec::new()));
        let seen = limits.clone();
        *r.world.on_request.lock().unwrap() = Some(Box::new(move |req: &PowerRequest| {
            if req.action == PowerAction::On {
                seen.lock().unwrap().push(req.timeout_ms);
            }
        }));
        let run = r.runner().with_timeouts(FenceTimeouts {
            on: Duration::from_secs(5),
            ..FenceTimeouts::default()
        });
        let id = run.start(request()).await.unwrap();
        r.finish(&run, id).await.unwrap();
        let limits = limits.lock().unwrap().clone();
        assert!(limits.len() >= 4, "{limits:?}");
        assert!(limits[0] <= 5_000, "{limits:?}");
        assert!(
            limits.windows(2).all(|w| w[1] < w[0]) && *limits.last().unwrap() <= 2_000,
            "the limit shrinks with the state's time: {limits:?}"
        );
    }

    #[tokio::test]
    async fn a_second_flow_for_the_same_machine_is_refused_while_one_runs() {
        let r = rig();
        let run = r.runner();
        run.start(request()).await.unwrap();
        let e = run.start(request()).await.unwrap_err();
        assert!(matches!(e, FenceError::InProgress { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_refused_power_off_releases_nothing_and_says_what_the_bmc_said() {
        let r = rig();
        *r.world.refuse_off.lock().unwrap() = Some("completion code 0xD5: not supported".into());
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        let State::Failed { detail } = f.state else {
            panic!("{f:?}")
        };
        assert!(detail.contains("0xD5"), "{detail}");
        assert!(r.world.log().is_empty(), "{:?}", r.world.log());
    }

    #[tokio::test]
    async fn a_refused_release_powers_the_machine_on_and_restores_before_failing() {
        let r = rig();
        *r.world.release_refused.lock().unwrap() = true;
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert!(matches!(f.state, State::Failed { .. }), "{f:?}");
        assert_eq!(r.world.log(), ["off", "release", "on", "restore"]);
    }

    #[tokio::test]
    async fn keep_off_leaves_the_machine_off_when_the_release_fails() {
        let r = rig();
        *r.world.release_refused.lock().unwrap() = true;
        let run = r.runner();
        let id = run
            .start(FenceRequest {
                keep_off: true,
                ..request()
            })
            .await
            .unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert!(matches!(f.state, State::Failed { .. }), "{f:?}");
        assert_eq!(r.world.log(), ["off", "release"]);
    }

    #[tokio::test]
    async fn a_busy_bmc_delays_the_power_on_with_new_attempts_and_the_flow_completes() {
        let r = rig();
        *r.world.busy_on.lock().unwrap() = 3;
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done);
        assert_clean_fence(&r.world);
        let ons = r
            .world
            .record
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.contains("-on-"))
            .count();
        assert_eq!(ons, 4, "three refused attempts, then the one that worked");
    }

    #[tokio::test]
    async fn a_gateway_restart_during_the_off_or_the_on_is_a_new_attempt_not_a_machine_left_off() {
        let r = rig();
        *r.world.restart_during.lock().unwrap() = vec![PowerAction::Fence, PowerAction::On];
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        assert!(*r.world.on.lock().unwrap(), "the machine was left off");
        // Each lost request reached the BMC and was done again: harmless for an off and
        // an on. Nothing is released before the second off is confirmed.
        let log = r.world.log();
        assert_eq!(
            (r.world.count("off"), r.world.count("on")),
            (2, 2),
            "{log:?}"
        );
        let first_release = log.iter().position(|l| l == "release").unwrap();
        let first_on = log.iter().position(|l| l == "on").unwrap();
        assert!(log[..first_release].iter().all(|l| l == "off"), "{log:?}");
        assert!(log[first_on..].iter().all(|l| l != "release"), "{log:?}");
    }

    /// The history lines of flow `id`.
    fn events(r: &Rig, id: u64) -> Vec<(String, String)> {
        let store = Store::open(&r.db).unwrap();
        let h = store
            .with(|c| crate::fence::store::sqlite::history_of(c, id))
            .unwrap();
        h.into_iter().map(|l| (l.state, l.event)).collect()
    }

    /// A gateway that does not answer holds the flow in its state: its history says why,
    /// once (not once per pass), and the flow then goes on when the gateway answers.
    #[tokio::test]
    async fn a_gateway_that_does_not_answer_is_said_once_in_the_history() {
        let r = rig();
        *r.world.lose_answers.lock().unwrap() = 4;
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        r.finish_one(&run, id, 5).await;
        assert_eq!(run.load(id).await.unwrap().state, State::PowerOff);
        let said = |r: &Rig| {
            events(r, id)
                .into_iter()
                .filter(|(_, e)| {
                    e.starts_with("no answer from the gateway (") && e.contains("asking again")
                })
                .count()
        };
        assert_eq!(said(&r), 1, "{:#?}", events(&r, id));
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        assert_eq!(said(&r), 1, "{:#?}", events(&r, id));
    }

    /// A coordinator that restarts while a flow's power request runs: the new runner says,
    /// before it asks again, that it asks for the same request and awaits its outcome; a
    /// runner that drove the flow from its start does not.
    #[tokio::test]
    async fn a_flow_resumed_in_a_power_state_says_it_awaits_the_request_sent_before() {
        let r = rig();
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        r.finish_one(&run, id, 1).await;
        assert_eq!(run.load(id).await.unwrap().state, State::PowerOff);
        let resumed = |r: &Rig| {
            events(r, id)
                .into_iter()
                .filter(|(_, e)| e.starts_with("resumed after a coordinator restart"))
                .collect::<Vec<_>>()
        };
        assert!(resumed(&r).is_empty());
        let again = r.runner();
        let f = r.finish(&again, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        let lines = resumed(&r);
        assert_eq!(lines.len(), 1, "{:#?}", events(&r, id));
        assert_eq!(lines[0].0, "power-off");
        assert!(
            lines[0].1.contains("aa11-fence-1-off-attempt0") && lines[0].1.contains("until "),
            "{lines:?}"
        );
        assert_clean_fence(&r.world);
    }

    #[tokio::test]
    async fn lost_answers_are_asked_again_with_the_same_id_and_never_repeat_the_action() {
        let r = rig();
        *r.world.lose_answers.lock().unwrap() = 1;
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        // The plan, then the fence whose answer is lost.
        r.finish_one(&run, id, 2).await;
        assert_eq!(run.load(id).await.unwrap().state, State::PowerOff);
        assert_eq!(
            r.world.count("off"),
            1,
            "executed although the answer was lost"
        );
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done);
        assert_clean_fence(&r.world);
    }

    impl Rig {
        async fn finish_one(&self, r: &FenceRunner, id: u64, passes: usize) {
            for _ in 0..passes {
                self.clock.advance(SignedDuration::from_secs(1));
                r.advance(id).await.unwrap();
            }
        }
    }

    const STATES: [&str; 9] = [
        "plan",
        "power-off",
        "confirm-off",
        "release",
        "wait-released",
        "power-on",
        "wait-back",
        "restore",
        "done",
    ];

    /// Runs a fence that is stopped at `point`; a new runner (a restarted coordinator, with no
    /// proof in memory) resumes it. Returns the outcome for the table.
    async fn crash_at(point: &str, plan: Release) -> (Rig, Flow) {
        let r = rig();
        *r.world.plan.lock().unwrap() = plan;
        let first = r.runner();
        first.kill_points().arm(point);
        let mut started = None;
        let res = match first.start(request()).await {
            Ok(id) => {
                started = Some(id);
                r.finish(&first, id).await
            }
            Err(e) => Err(e),
        };
        match res {
            Err(FenceError::Killed(k)) => assert_eq!(k.0, point),
            other => panic!("kill point {point} never reached: {other:?}"),
        }
        drop(first);
        let second = r.runner();
        let ids = second.unfinished().await.unwrap();
        let flow = match ids.as_slice() {
            [] if point == "after:done" => second.load(started.unwrap()).await.unwrap(),
            [] => {
                // Killed before the flow was committed: the request is simply made again.
                assert_eq!(point, "before:plan");
                let id = second.start(request()).await.unwrap();
                r.finish(&second, id).await.unwrap()
            }
            [id] => r.finish(&second, *id).await.unwrap(),
            more => panic!("{more:?}"),
        };
        (r, flow)
    }

    #[tokio::test]
    async fn restarting_at_every_kill_point_completes_without_a_second_power_action_or_early_release()
     {
        let mut table = Vec::new();
        for plan in [
            Release::Taint,
            Release::DeleteNode(SavedNodeMetadata {
                name: "n1".into(),
                internal_ip: Some(ADDR.into()),
                labels: [("zone".to_string(), "a".to_string())].into(),
                annotations: Default::default(),
            }),
        ] {
            for state in STATES {
                for when in ["before", "after"] {
                    let point = format!("{when}:{state}");
                    let (r, f) = crash_at(&point, plan.clone()).await;
                    assert_eq!(f.state, State::Done, "{point}: {f:?}");
                    assert_eq!(f.how.as_ref(), Some(&plan), "{point}: plan kept");
                    assert_clean_fence(&r.world);
                    table.push(format!("{point:22} → done; log {:?}", r.world.log()));
                }
            }
        }
        println!("{}", table.join("\n"));
        assert_eq!(table.len(), 36);
    }

    #[tokio::test]
    async fn a_machine_found_on_after_a_restart_is_not_released() {
        let r = rig();
        let first = r.runner();
        first.kill_points().arm("after:release");
        let id = first.start(request()).await.unwrap();
        assert!(matches!(
            r.finish(&first, id).await,
            Err(FenceError::Killed(_))
        ));
        drop(first);
        // Someone powers the machine on while no coordinator runs.
        *r.world.on.lock().unwrap() = true;
        let second = r.runner();
        let f = r.finish(&second, id).await.unwrap();
        let State::Failed { detail } = &f.state else {
            panic!("{f:?}")
        };
        assert!(detail.contains("power On"), "{detail}");
        assert_eq!(r.world.count("release"), 0, "{:?}", r.world.log());
    }

    // ---- kdump ----

    /// A dump running since the rig's start; "dump done" `done_after` seconds later (never
    /// with `None`).
    fn dumping(r: &Rig, done_after: Option<i64>) {
        let t = r.clock.now();
        *r.world.dump.lock().unwrap() =
            Some((t, done_after.map(|s| t + SignedDuration::from_secs(s))));
    }

    /// The history's states, in order, without repeats.
    fn states(r: &Rig, id: u64) -> Vec<String> {
        let store = Store::open(&r.db).unwrap();
        let mut v: Vec<String> = store
            .with(|c| crate::fence::store::sqlite::history_of(c, id))
            .unwrap()
            .into_iter()
            .map(|l| l.state)
            .collect();
        v.dedup();
        v
    }

    /// Released on the dump, before any power action; then off once, on once, restored.
    fn assert_clean_kdump_fence(w: &World) {
        let log = w.log();
        assert_eq!((w.count("off"), w.count("on")), (1, 1), "{log:?}");
        let first_power = log.iter().position(|l| l == "off").unwrap();
        assert!(
            log[..first_power].iter().all(|l| l == "release-on-dump"),
            "only releases on the dump before the power-off: {log:?}"
        );
        assert!(w.count("release-on-dump") >= 1, "{log:?}");
        assert_eq!(w.count("release"), 0, "no second release: {log:?}");
        assert_eq!(log.last().map(String::as_str), Some("restore"), "{log:?}");
        assert!(*w.on.lock().unwrap(), "the machine ends powered on");
    }

    #[tokio::test]
    async fn dumping_releases_the_workload_with_no_power_action_and_dump_done_lets_the_cycle_proceed()
     {
        let r = rig();
        dumping(&r, Some(20));
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        // Until the dump is done: released, no power action at all.
        r.finish_one(&run, id, 10).await;
        let f = run.load(id).await.unwrap();
        assert_eq!(f.state, State::KdumpWait, "{f:?}");
        assert_eq!(r.world.log(), ["release-on-dump", "release-on-dump"]);
        assert_eq!(f.kdump.map(|l| l.released), Some(true));
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        assert_clean_kdump_fence(&r.world);
        assert_eq!(
            states(&r, id),
            [
                "plan",
                "power-off",
                "kdump-release",
                "kdump-wait-released",
                "kdump-wait",
                "power-off",
                "confirm-off",
                "power-on",
                "wait-back",
                "restore",
                "done"
            ]
        );
    }

    #[tokio::test]
    async fn without_dump_done_the_power_cycle_waits_for_the_kdump_timeout() {
        let r = rig();
        dumping(&r, None);
        let run = r.runner();
        let started = r.clock.now();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        assert_clean_kdump_fence(&r.world);
        let store = Store::open(&r.db).unwrap();
        let h = store
            .with(|c| crate::fence::store::sqlite::history_of(c, id))
            .unwrap();
        let cycle = h
            .iter()
            .find(|l| l.event.contains("kdump_timeout passed"))
            .expect("the timeout let the cycle go");
        assert!(
            cycle.at >= started + SignedDuration::try_from(KDUMP_TIMEOUT).unwrap(),
            "{cycle:?}"
        );
    }

    #[tokio::test]
    async fn a_machine_not_dumping_is_fenced_by_power_off_as_before() {
        let r = rig();
        // An old dump, finished before the flow: no kdump leg.
        let t = r.clock.now() - SignedDuration::from_secs(3600);
        *r.world.dump.lock().unwrap() = Some((t, Some(t + SignedDuration::from_secs(60))));
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!((f.state, f.kdump), (State::Done, None));
        assert_clean_fence(&r.world);
    }

    const KDUMP_STATES: [&str; 6] = [
        "kdump-release",
        "kdump-wait-released",
        "kdump-wait",
        "power-off",
        "confirm-off",
        "power-on",
    ];

    #[tokio::test]
    async fn restarting_at_every_kdump_kill_point_completes_without_a_power_action_during_the_dump()
    {
        let mut table = Vec::new();
        for state in KDUMP_STATES {
            for when in ["before", "after"] {
                let point = format!("{when}:{state}");
                let r = rig();
                dumping(&r, Some(20));
                let first = r.runner();
                first.kill_points().arm(&point);
                let id = first.start(request()).await.unwrap();
                match r.finish(&first, id).await {
                    Err(FenceError::Killed(k)) => assert_eq!(k.0, point),
                    other => panic!("kill point {point} never reached: {other:?}"),
                }
                drop(first);
                // A restarted coordinator: no proof in memory, the kdump view as it is now.
                let second = r.runner();
                assert_eq!(second.unfinished().await.unwrap(), [id], "{point}");
                let f = r.finish(&second, id).await.unwrap();
                assert_eq!(f.state, State::Done, "{point}: {f:?}");
                assert_clean_kdump_fence(&r.world);
                table.push(format!("{point:26} → done; log {:?}", r.world.log()));
            }
        }
        println!("{}", table.join("\n"));
        assert_eq!(table.len(), 12);
    }

    /// A flow resumed in power-off while its machine dumps takes the kdump leg and sends no
    /// power request: it does not say it asks the gateway again.
    #[tokio::test]
    async fn a_flow_resumed_in_power_off_during_a_dump_does_not_say_it_asks_the_gateway() {
        let r = rig();
        dumping(&r, Some(20));
        let first = r.runner();
        let id = first.start(request()).await.unwrap();
        r.finish_one(&first, id, 1).await;
        assert_eq!(first.load(id).await.unwrap().state, State::PowerOff);
        let second = r.runner();
        r.finish_one(&second, id, 1).await;
        assert_eq!(second.load(id).await.unwrap().state, State::KdumpRelease);
        let lines = events(&r, id);
        assert!(
            lines.iter().all(|(_, e)| !e.starts_with("resumed after")),
            "{lines:#?}"
        );
    }

    #[tokio::test]
    async fn a_dump_that_ends_mid_release_is_finished_after_a_confirmed_power_off() {
        let r = rig();
        // The release needs six passes, but the dump ends 4 s in, after the second.
        *r.world.release_waits.lock().unwrap() = 5;
        dumping(&r, Some(4));
        let run = r.runner();
        let id = run.start(request()).await.unwrap();
        let f = r.finish(&run, id).await.unwrap();
        assert_eq!(f.state, State::Done, "{f:?}");
        let log = r.world.log();
        let off = log.iter().position(|l| l == "off").unwrap();
        assert_eq!(log[..off], ["release-on-dump"], "{log:?}");
        assert!(
            log[off..].iter().any(|l| l == "release"),
            "the release went on after the confirmed off: {log:?}"
        );
        assert_eq!((r.world.count("off"), r.world.count("on")), (1, 1));
    }
}
