//! [`KubeDrainer`]: the real [`Drainer`], CKE's repair drain through kube-rs.
//!
//! One call of [`Drainer::drain`] is one idempotent pass: cordon (marked ours with
//! [`CORDON_ANNOTATION`], never over an admin's cordon), list the node's pods, decide per pod
//! ([`super::decision`]), evict or delete what must go (with `evict_retries` ×
//! `evict_interval` on budget refusals), and report how many pods are left. Pods are
//! identified by UID: evictions and deletions carry a UID precondition, so a StatefulSet pod
//! recreated under the same name is never mistaken for the one we evicted.
//!
//! Deliberately not here: the eviction timeout and the drain backoff (the repair engine owns
//! them; it calls `drain` until `Done` or its timeout, then `uncordon_if_ours`), and any
//! retry of API outages (they come back as [`KubeError::Unavailable`] so the entry holds).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};

use super::client::{self, KubernetesConfig, api_status, is_conflict, is_not_found, map_err};
use super::cordon::cordoned_by_us;
pub use super::cordon::{CORDON_ANNOTATION, CORDON_OWNER};
use super::decision::{
    EvictNext, EvictionAnswer, PodAction, PodFacts, ProtectedNamespaces, after_eviction, decide_pod,
};
use super::events::{EventRecorder, NodeEvent};
use super::lease::SecondSignal;
use super::selector::LabelSelector;
use super::view::{NodeView, internal_ip};
use super::{DrainOptions, DrainProgress, Drainer, KubeError};
use crate::clock::Clock;

/// Evictions in flight at once for one node.
///
/// Serial evictions make a pass take pods × attempts × `evict_interval` when budgets push
/// back; unbounded ones burst dozens of requests at the API server and let one node's drain
/// take a large bite out of many workloads within milliseconds, before their controllers
/// have started replacements. Eight keeps a 100-pod node's pass to a few round trips while
/// staying well under API priority-and-fairness limits for one client.
pub const CONCURRENT_EVICTIONS: usize = 8;

/// The outcome of trying to make one pod go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PodOutcome {
    Going,
    Blocked(String),
    Stop(String),
    Unavailable(String),
}

/// The Kubernetes drainer.
pub struct KubeDrainer {
    pub(super) client: kube::Client,
    pub(super) events: EventRecorder,
    pub(super) view: NodeView,
    pub(super) release_method: client::ReleaseMethod,
    /// What the release takes as the sign that a node's kubelet is alive (see
    /// [`super::release`]), with the remediation's `lease_stale`.
    pub(super) second_signal: SecondSignal,
    pub(super) lease_stale: Duration,
    pub(super) clock: Arc<dyn Clock>,
    /// Each released node's Lease `renewTime` as the release passes last read it, and when
    /// this coordinator first saw that value (with the node view's sightings, the Lease's
    /// age as observed: [`super::lease`]).
    pub(super) lease_seen: Mutex<HashMap<String, (Option<Timestamp>, Timestamp)>>,
    /// Last budget message reported per node, so a drain waiting on a budget records one
    /// Event rather than one per pass.
    last_blocked: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for KubeDrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDrainer")
            .field("release_method", &self.release_method)
            .finish()
    }
}

impl KubeDrainer {
    /// A drainer over `client` (which must have kube's default retry turned off, as
    /// [`client::build_client`] does). `instance` names this coordinator in Events; `clock`
    /// stamps Events and node view refreshes.
    pub fn new(client: kube::Client, instance: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self {
            events: EventRecorder::new(client.clone(), instance, clock.clone()),
            view: NodeView::new(client.clone(), clock.clone()),
            client,
            release_method: client::ReleaseMethod::Auto,
            second_signal: SecondSignal::default(),
            lease_stale: crate::remediation::config::DEFAULT_LEASE_STALE,
            clock,
            lease_seen: Mutex::new(HashMap::new()),
            last_blocked: Mutex::new(HashMap::new()),
        }
    }

    /// Builds the client from the coordinator's `kubernetes` section.
    pub async fn from_config(
        cfg: &KubernetesConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, KubeError> {
        Self::from_config_gated(cfg, clock, None).await
    }

    /// [`KubeDrainer::from_config`] with every write behind `gate` ([`super::gate`]).
    pub async fn from_config_gated(
        cfg: &KubernetesConfig,
        clock: Arc<dyn Clock>,
        gate: Option<&super::gate::WriteGate>,
    ) -> Result<Self, KubeError> {
        let client = client::build_client(cfg, gate).await?;
        let instance = cfg.instance.clone().unwrap_or_else(|| "coordinator".into());
        let mut me = Self::new(client, instance, clock);
        me.release_method = cfg.release_method;
        Ok(me)
    }

    /// Sets how fenced nodes are released.
    pub fn with_release_method(mut self, m: client::ReleaseMethod) -> Self {
        self.release_method = m;
        self
    }

    /// Sets what the release reads as a live kubelet: with [`SecondSignal::LeaseAndReady`]
    /// (the default) a Node whose Ready is True; with [`SecondSignal::Lease`] a Lease renewed
    /// within `lease_stale` (`[remediation]`'s `second_signal` and `lease_stale`).
    pub fn with_second_signal(mut self, signal: SecondSignal, lease_stale: Duration) -> Self {
        self.second_signal = signal;
        self.lease_stale = lease_stale;
        self
    }

    /// The node view this drainer keeps (detectors read it; see [`NodeView`]).
    pub fn node_view(&self) -> &NodeView {
        &self.view
    }

    /// The Event recorder.
    pub fn events(&self) -> &EventRecorder {
        &self.events
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn get_node(&self, node: &str) -> Result<Option<Node>, KubeError> {
        self.nodes()
            .get_opt(node)
            .await
            .map_err(|e| map_err(&format!("get node {node}"), e))
    }

    pub(super) async fn record(&self, node: &Node, event: NodeEvent, message: &str) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        self.events
            .record(name, node.metadata.uid.as_deref(), event, message)
            .await;
    }

    /// Cordons `node` as ours unless it already is unschedulable. Returns `false` when a
    /// concurrent change made the patch conflict (try again next pass).
    async fn cordon(&self, node: &Node) -> Result<bool, KubeError> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if unschedulable {
            // Ours already, or an admin's: either way leave it exactly as it is.
            return Ok(true);
        }
        // The resourceVersion makes the patch conditional: if an admin cordons between our
        // read and our write, we must not mark their cordon as ours.
        let patch = serde_json::json!({
            "metadata": {
                "annotations": { CORDON_ANNOTATION: CORDON_OWNER },
                "resourceVersion": node.metadata.resource_version,
            },
            "spec": { "unschedulable": true }
        });
        match self
            .nodes()
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, "cordoned");
                self.record(
                    node,
                    NodeEvent::Cordoned,
                    "cordoned by Fleetmend for repair",
                )
                .await;
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(map_err(&format!("cordon node {name}"), e)),
        }
    }

    async fn protected_namespaces(
        &self,
        selector: Option<&str>,
    ) -> Result<ProtectedNamespaces, KubeError> {
        let Some(sel) = selector else {
            return Ok(ProtectedNamespaces::All);
        };
        let api: Api<Namespace> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default().labels(sel))
            .await
            .map_err(|e| map_err("list protected namespaces", e))?;
        Ok(ProtectedNamespaces::Only(
            list.items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect::<BTreeSet<_>>(),
        ))
    }

    async fn pods_on(&self, node: &str) -> Result<Vec<PodFacts>, KubeError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|e| map_err(&format!("list pods on {node}"), e))?;
        Ok(list.items.iter().map(PodFacts::from_pod).collect())
    }

    async fn delete_pod(&self, pod: &PodFacts) -> PodOutcome {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&pod.name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %pod.key(), "deleted pod");
                PodOutcome::Going
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => PodOutcome::Going,
            Err(e) => match map_err(&format!("delete pod {}", pod.key()), e) {
                KubeError::Unavailable(m) => PodOutcome::Unavailable(m),
                KubeError::Refused(m) | KubeError::Config(m) => PodOutcome::Stop(m),
            },
        }
    }

    async fn post_eviction(&self, pod: &PodFacts) -> Result<EvictionAnswer, kube::Error> {
        let body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": { "name": pod.name, "namespace": pod.namespace },
            "deleteOptions": { "preconditions": { "uid": pod.uid } },
        });
        let req = kube::core::Request::new(format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        ))
        .create(
            &Default::default(),
            serde_json::to_vec(&body).expect("json serialises"),
        )
        .map_err(kube::Error::BuildRequest)?;
        match self.client.request::<serde_json::Value>(req).await {
            Ok(_) => Ok(EvictionAnswer::Allowed),
            Err(e) => match api_status(&e) {
                Some((code, msg)) => Ok(EvictionAnswer::classify(code, &msg)),
                None => Err(e),
            },
        }
    }

    async fn evict(&self, pod: &PodFacts, protected: bool, opts: &DrainOptions) -> PodOutcome {
        let attempts = opts.evict_retries.saturating_add(1);
        let interval = Duration::from_secs(opts.evict_interval_seconds);
        let mut attempt = 1;
        loop {
            let answer = match self.post_eviction(pod).await {
                Ok(a) => a,
                Err(e) => {
                    return match map_err(&format!("evict {}", pod.key()), e) {
                        KubeError::Unavailable(m) => PodOutcome::Unavailable(m),
                        KubeError::Refused(m) | KubeError::Config(m) => PodOutcome::Stop(m),
                    };
                }
            };
            match after_eviction(&answer, pod, protected, attempt, attempts) {
                EvictNext::Going => {
                    tracing::info!(pod = %pod.key(), ?answer, "evicted pod");
                    return PodOutcome::Going;
                }
                EvictNext::RetryAfterInterval => {
                    tracing::info!(pod = %pod.key(), attempt, "eviction blocked by a budget, retrying");
                    tokio::time::sleep(interval).await;
                    attempt += 1;
                }
                EvictNext::DeleteInstead => {
                    tracing::warn!(pod = %pod.key(), "eviction blocked by a budget in an unprotected namespace, deleting");
                    return self.delete_pod(pod).await;
                }
                EvictNext::BudgetBlocked(m) => return PodOutcome::Blocked(m),
                EvictNext::Stop(m) => return PodOutcome::Stop(m),
                EvictNext::Unavailable(m) => return PodOutcome::Unavailable(m),
            }
        }
    }

    async fn act_on(&self, pod: &PodFacts, action: &PodAction, opts: &DrainOptions) -> PodOutcome {
        match action {
            PodAction::Evict { protected } => self.evict(pod, *protected, opts).await,
            PodAction::Delete => self.delete_pod(pod).await,
            PodAction::Wait | PodAction::Skip(_) | PodAction::Block { .. } => PodOutcome::Going,
        }
    }

    /// Abandons the drain: uncordon if ours, record why.
    async fn abandon(&self, node: &Node, reason: String) -> Result<DrainProgress, KubeError> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        tracing::warn!(node = name, %reason, "drain abandoned");
        self.record(node, NodeEvent::DrainAbandoned, &reason).await;
        self.uncordon(name).await?;
        Ok(DrainProgress::Abandoned { reason })
    }

    async fn uncordon(&self, node: &str) -> Result<(), KubeError> {
        let Some(n) = self.get_node(node).await? else {
            return Ok(());
        };
        if !cordoned_by_us(&n) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {
                "annotations": { CORDON_ANNOTATION: null },
                "resourceVersion": n.metadata.resource_version,
            },
            "spec": { "unschedulable": false }
        });
        match self
            .nodes()
            .patch(node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node, "uncordoned");
                self.record(&n, NodeEvent::Uncordoned, "Fleetmend's cordon removed")
                    .await;
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(map_err(&format!("uncordon node {node}"), e)),
        }
    }

    async fn drain_pass(
        &self,
        node: &str,
        opts: &DrainOptions,
    ) -> Result<DrainProgress, KubeError> {
        let job_selector = opts
            .protected_job_pods
            .as_deref()
            .map(LabelSelector::parse)
            .transpose()
            .map_err(|e| KubeError::Refused(e.to_string()))?;
        let Some(n) = self.get_node(node).await? else {
            return Err(KubeError::Refused(format!(
                "node {node} does not exist; it cannot be drained"
            )));
        };
        if !self.cordon(&n).await? {
            return Ok(DrainProgress::InProgress {
                remaining: 0,
                detail: format!("node {node} changed while cordoning; retrying"),
            });
        }
        let protected_ns = self
            .protected_namespaces(opts.protected_namespaces.as_deref())
            .await?;
        let pods = self.pods_on(node).await?;
        let decided: Vec<(PodFacts, PodAction)> = pods
            .into_iter()
            .map(|p| {
                let a = decide_pod(&p, &protected_ns, job_selector.as_ref());
                (p, a)
            })
            .collect();
        if let Some(reason) = decided.iter().find_map(|(_, a)| match a {
            PodAction::Block { reason } => Some(reason.clone()),
            _ => None,
        }) {
            return self.abandon(&n, reason).await;
        }

        // Collected first so the stream's type holds no closure (keeps the future `Send`
        // for the boxed trait method).
        let work: Vec<_> = decided
            .iter()
            .map(|(pod, action)| self.act_on(pod, action, opts))
            .collect();
        let outcomes: Vec<PodOutcome> = stream::iter(work)
            .buffer_unordered(CONCURRENT_EVICTIONS)
            .collect()
            .await;

        if let Some(m) = outcomes.iter().find_map(|o| match o {
            PodOutcome::Unavailable(m) => Some(m.clone()),
            _ => None,
        }) {
            return Err(KubeError::Unavailable(m));
        }
        if let Some(m) = outcomes.iter().find_map(|o| match o {
            PodOutcome::Stop(m) => Some(m.clone()),
            _ => None,
        }) {
            return self.abandon(&n, m).await;
        }
        let blocked: Vec<&str> = outcomes
            .iter()
            .filter_map(|o| match o {
                PodOutcome::Blocked(m) => Some(m.as_str()),
                _ => None,
            })
            .collect();
        if let Some(first) = blocked.first() {
            let detail = format!(
                "{} pod(s) blocked by budgets; first: {first}",
                blocked.len()
            );
            let repeat = self
                .last_blocked
                .lock()
                .expect("last_blocked poisoned")
                .insert(node.to_string(), first.to_string())
                .is_some_and(|prev| prev == *first);
            if !repeat {
                self.record(&n, NodeEvent::DrainBlockedByBudget, &detail)
                    .await;
            }
        }

        // Count what is still there after this pass's evictions and deletions.
        let remaining: Vec<PodFacts> = self
            .pods_on(node)
            .await?
            .into_iter()
            .filter(|p| decide_pod(p, &protected_ns, job_selector.as_ref()).must_go())
            .collect();
        if remaining.is_empty() {
            self.last_blocked
                .lock()
                .expect("last_blocked poisoned")
                .remove(node);
            self.record(
                &n,
                NodeEvent::Drained,
                "all pods that had to leave are gone",
            )
            .await;
            return Ok(DrainProgress::Done);
        }
        let detail = if blocked.is_empty() {
            let names: Vec<String> = remaining.iter().take(5).map(PodFacts::key).collect();
            format!(
                "waiting for {} pod(s) to terminate: {}",
                remaining.len(),
                names.join(", ")
            )
        } else {
            format!(
                "{} pod(s) left; {} blocked by PodDisruptionBudgets: {}",
                remaining.len(),
                blocked.len(),
                blocked[0]
            )
        };
        Ok(DrainProgress::InProgress {
            remaining: remaining.len(),
            detail,
        })
    }

    /// The name of the Node whose InternalIP is `address`, refreshing the node view.
    pub async fn find_node(&self, address: &str) -> Result<Option<String>, KubeError> {
        let nodes = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|e| map_err("list nodes", e))?;
        let found = nodes
            .items
            .iter()
            .find(|n| internal_ip(n).as_deref() == Some(address))
            .and_then(|n| n.metadata.name.clone());
        self.view.absorb_nodes(nodes.items);
        Ok(found)
    }
}

impl Drainer for KubeDrainer {
    fn node_for(&self, address: &str) -> BoxFuture<'_, Result<Option<String>, KubeError>> {
        let address = address.to_string();
        Box::pin(async move { self.find_node(&address).await })
    }

    fn known_node(&self, address: &str) -> Option<String> {
        self.view
            .snapshot()
            .by_address(address)
            .map(|n| n.name.clone())
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, KubeError>> {
        Box::pin(self.drain_pass(node, opts))
    }

    fn cordoned_by_us(&self) -> Vec<String> {
        let snap = self.view.snapshot();
        snap.nodes
            .values()
            .filter(|n| n.cordoned_by_us)
            .map(|n| n.name.clone())
            .collect()
    }

    fn uncordon_if_ours<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), KubeError>> {
        Box::pin(async move {
            self.last_blocked
                .lock()
                .expect("last_blocked poisoned")
                .remove(node);
            self.uncordon(node).await
        })
    }

    fn record_event<'a>(
        &'a self,
        node: &'a str,
        event: NodeEvent,
        message: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let uid = self.view.get(node).map(|n| n.uid);
            self.events
                .record(node, uid.as_deref(), event, message)
                .await;
        })
    }
}
