//! The node view detectors read: a cache of every Node's conditions (with last transition
//! times), Ready, taints, unschedulable, InternalIP, and its kubelet Lease renew time from
//! `coordination.k8s.io/v1` Leases in `kube-node-lease`.
//!
//! Refreshed by polling (a full list of Nodes and node Leases every
//! `node_view_refresh`), which is simple, survives API server restarts without
//! watch bookkeeping, and costs two list calls per interval. On top of it a watch on Nodes
//! ([`NodeView::spawn_watcher`]) refreshes at once (at most once per [`WATCH_REFRESH_GAP`])
//! when a Node's Ready status changes or a Node comes or goes, so a death is seen within
//! about a second of the node controller saying so instead of up to a refresh period
//! later; a refresh that finds such a change wakes whoever waits on
//! [`NodeView::changes`] (the remediation loop). The watch is an accelerator only: if it
//! fails, polling alone keeps the view as before. Reads are cheap: a clone of an `Arc` to
//! an immutable snapshot. [`NodeView::is_fresh`] says whether the view can be trusted;
//! when it cannot (API down), detectors must hold rather than guess (invariant 7).
//! This module deliberately makes no health judgement.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::map_err;
use super::cordon::cordoned_by_us;
use super::lease::seen_since;
use super::{KubeError, NodeViewSource};
use crate::clock::Clock;

/// The namespace holding the kubelets' heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Least time between two refreshes the Node watch triggers: a rack losing power flips
/// dozens of Nodes within a second or two, and one refresh then sees them all for the cost
/// of two list calls, where one per event would load the API server exactly when it is busy.
pub const WATCH_REFRESH_GAP: Duration = Duration::from_secs(1);

/// The watch's own wait after a failure, doubled after each failure in a row up to
/// [`WATCH_RETRY_MAX`] and back to this after an event. kube's backoff alone retried about
/// once a second for as long as the API server refused or was down (a log line each time,
/// 86,000 a day); the watch only speeds the poller up, which goes on meanwhile.
pub const WATCH_RETRY_MIN: Duration = Duration::from_secs(1);

/// Longest wait between two watch attempts while they fail: a minute, so a recovered API
/// server is watched again within a minute, and polled within `node_view_refresh`.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(60);

/// One condition of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConditionView {
    /// `Ready`, `MemoryPressure`, …
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    pub reason: Option<String>,
    /// When the status last changed.
    pub last_transition: Option<Timestamp>,
}

/// A taint on a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintView {
    /// Key.
    pub key: String,
    /// Value.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// What the view knows of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    /// Node name.
    pub name: String,
    /// Node UID.
    pub uid: String,
    /// The InternalIP address, the key to the machine.
    pub internal_ip: Option<String>,
    /// `Some(true)` when the Ready condition is True, `Some(false)` when False or Unknown,
    /// `None` when the node has no Ready condition yet.
    pub ready: Option<bool>,
    /// Every condition.
    pub conditions: Vec<NodeConditionView>,
    /// Taints.
    pub taints: Vec<TaintView>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The cordon is Fleetmend's.
    pub cordoned_by_us: bool,
    /// The kubelet's Lease `renewTime`.
    pub lease_renew_time: Option<Timestamp>,
    /// When this view first saw that `renewTime` value, by the coordinator's clock (`None`
    /// before the first refresh): how long the Lease has gone unrenewed as the coordinator
    /// saw it, whatever the kubelet's clock says ([`super::lease`]).
    pub lease_seen_since: Option<Timestamp>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeSnapshot {
    /// The condition of type `t`.
    pub fn condition(&self, t: &str) -> Option<&NodeConditionView> {
        self.conditions.iter().find(|c| c.type_ == t)
    }
}

/// An immutable snapshot of all Nodes.
#[derive(Debug, Clone, Default)]
pub struct NodeViewSnapshot {
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeSnapshot>,
    /// When this snapshot was taken from the API (None: never).
    pub refreshed_at: Option<Timestamp>,
}

impl NodeViewSnapshot {
    /// True when the snapshot was refreshed within `max_age` of `now`.
    pub fn is_fresh(&self, now: Timestamp, max_age: Duration) -> bool {
        self.refreshed_at
            .is_some_and(|t| now.duration_since(t).unsigned_abs() <= max_age && t <= now + max_age)
    }

    /// The Node whose InternalIP is `address`.
    pub fn by_address(&self, address: &str) -> Option<&NodeSnapshot> {
        self.nodes
            .values()
            .find(|n| n.internal_ip.as_deref() == Some(address))
    }
}

/// The InternalIP of a Node object.
pub fn internal_ip(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// Extracts a [`NodeSnapshot`] from a Node object.
pub fn snapshot_of(node: &Node) -> NodeSnapshot {
    let conditions: Vec<NodeConditionView> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| NodeConditionView {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            last_transition: c.last_transition_time.as_ref().map(|t| t.0),
        })
        .collect();
    let ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True");
    let spec = node.spec.as_ref();
    NodeSnapshot {
        name: node.metadata.name.clone().unwrap_or_default(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        internal_ip: internal_ip(node),
        ready,
        conditions,
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .map(|t| TaintView {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
            .collect(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        cordoned_by_us: cordoned_by_us(node),
        lease_renew_time: None,
        lease_seen_since: None,
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// The cached node view. Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct NodeView {
    client: kube::Client,
    clock: Arc<dyn Clock>,
    current: Arc<RwLock<Arc<NodeViewSnapshot>>>,
    changed: Arc<Notify>,
    /// Why the last refresh failed; cleared by one that succeeds.
    failure: Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView").finish_non_exhaustive()
    }
}

impl NodeView {
    /// An empty view over `client` whose refreshes are stamped by `clock`; call
    /// [`NodeView::refresh`] or [`NodeView::spawn_poller`].
    pub fn new(client: kube::Client, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            clock,
            current: Arc::new(RwLock::new(Arc::new(NodeViewSnapshot::default()))),
            changed: Arc::new(Notify::new()),
            failure: Arc::default(),
        }
    }

    /// Notified (one permit, so none is lost while its waiter is busy) after a refresh
    /// that found a Node's Ready status changed or a Node added or gone.
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<NodeViewSnapshot> {
        self.current.read().expect("node view poisoned").clone()
    }

    /// One Node from the current snapshot.
    pub fn get(&self, name: &str) -> Option<NodeSnapshot> {
        self.snapshot().nodes.get(name).cloned()
    }

    /// True when the view was refreshed within `max_age` of `now`.
    pub fn is_fresh(&self, now: Timestamp, max_age: Duration) -> bool {
        self.snapshot().is_fresh(now, max_age)
    }

    /// Why the last refresh failed, while no later one has succeeded.
    pub fn last_failure(&self) -> Option<String> {
        self.failure.lock().expect("node view poisoned").clone()
    }

    /// Lists Nodes and node Leases and replaces the snapshot; a failure is kept for
    /// [`NodeView::last_failure`] until a refresh succeeds.
    pub async fn refresh(&self) -> Result<Arc<NodeViewSnapshot>, KubeError> {
        let r = self.list_all().await;
        *self.failure.lock().expect("node view poisoned") =
            r.as_ref().err().map(ToString::to_string);
        r
    }

    async fn list_all(&self) -> Result<Arc<NodeViewSnapshot>, KubeError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let node_list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| map_err("list nodes", e))?;
        let lease_list = leases
            .list(&ListParams::default())
            .await
            .map_err(|e| map_err("list node leases", e))?;
        let renew: BTreeMap<String, Timestamp> = lease_list
            .items
            .iter()
            .filter_map(|l| {
                let t = l.spec.as_ref()?.renew_time.as_ref()?.0;
                Some((l.metadata.name.clone()?, t))
            })
            .collect();
        let now = self.clock.now();
        let mut snap = NodeViewSnapshot {
            nodes: BTreeMap::new(),
            refreshed_at: Some(now),
        };
        let mut guard = self.current.write().expect("node view poisoned");
        for n in &node_list.items {
            let mut s = snapshot_of(n);
            s.lease_renew_time = renew.get(&s.name).copied();
            let earlier = guard
                .nodes
                .get(&s.name)
                .and_then(|o| Some((o.lease_renew_time, o.lease_seen_since?)));
            s.lease_seen_since = Some(seen_since(s.lease_renew_time, earlier, now));
            snap.nodes.insert(s.name.clone(), s);
        }
        let snap = Arc::new(snap);
        let old = std::mem::replace(&mut *guard, snap.clone());
        drop(guard);
        if readiness_changed(&old, &snap) {
            self.changed.notify_one();
        }
        Ok(snap)
    }

    /// True when `node` is unknown to the snapshot or its Ready status differs from it.
    fn ready_differs(&self, node: &Node) -> bool {
        let seen = snapshot_of(node);
        self.snapshot()
            .nodes
            .get(&seen.name)
            .is_none_or(|s| s.ready != seen.ready)
    }

    /// Watches Nodes until `cancel` fires and refreshes the view (see the module doc) when
    /// one's Ready status changed or a Node was deleted. Watch errors are retried with
    /// kube's backoff; polling goes on regardless.
    pub fn spawn_watcher(&self, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let view = self.clone();
        tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(view.client.clone());
            let mut events = watcher::watcher(nodes, watcher::Config::default())
                .default_backoff()
                .boxed();
            let mut pending = false;
            let mut last = tokio::time::Instant::now();
            let mut retry = WATCH_RETRY_MIN;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = events.next() => match ev {
                        None => return,
                        // `Init` starts every attempt, so only what a listing or a watch
                        // delivered shows the API server answering again.
                        Some(Ok(Event::Init)) => {}
                        Some(Ok(ev)) => {
                            retry = WATCH_RETRY_MIN;
                            match ev {
                                Event::Apply(n) | Event::InitApply(n) => {
                                    pending |= view.ready_differs(&n);
                                }
                                Event::Delete(_) => pending = true,
                                Event::Init | Event::InitDone => {}
                            }
                        }
                        Some(Err(error)) => {
                            tracing::debug!(%error, ?retry, "node watch failed; retrying (polling goes on)");
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(retry) => {}
                            }
                            retry = (retry * 2).min(WATCH_RETRY_MAX);
                        }
                    },
                    _ = tokio::time::sleep_until(last + WATCH_REFRESH_GAP), if pending => {
                        pending = false;
                        last = tokio::time::Instant::now();
                        if let Err(error) = view.refresh().await {
                            tracing::warn!(%error, "node view refresh after a Node change failed");
                        }
                    }
                }
            }
        })
    }

    /// Folds a fresh Node list (from node mapping) into the view, keeping lease times.
    pub(super) fn absorb_nodes(&self, nodes: Vec<Node>) {
        let mut guard = self.current.write().expect("node view poisoned");
        let old = guard.clone();
        let mut snap = NodeViewSnapshot {
            nodes: BTreeMap::new(),
            refreshed_at: old.refreshed_at,
        };
        for n in &nodes {
            let mut s = snapshot_of(n);
            if let Some(o) = old.nodes.get(&s.name) {
                s.lease_renew_time = o.lease_renew_time;
                s.lease_seen_since = o.lease_seen_since;
            }
            snap.nodes.insert(s.name.clone(), s);
        }
        *guard = Arc::new(snap);
    }

    /// Refreshes every `every` until `cancel` fires. Failures are logged; the old
    /// snapshot stays and ages, which [`NodeView::is_fresh`] reports.
    pub fn spawn_poller(
        &self,
        every: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let view = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Err(error) = view.refresh().await {
                    tracing::warn!(%error, "node view refresh failed; keeping the last snapshot");
                }
            }
        })
    }
}

/// True when a Node's Ready status differs between `old` and `new`, or a Node is in one
/// only: what can turn a machine's death (or life) decision.
fn readiness_changed(old: &NodeViewSnapshot, new: &NodeViewSnapshot) -> bool {
    old.nodes.len() != new.nodes.len()
        || new
            .nodes
            .iter()
            .any(|(name, n)| old.nodes.get(name).is_none_or(|o| o.ready != n.ready))
}

/// Whether the coordinator can read the cluster, with or without `[remediation]`: a view
/// that stopped refreshing holds every decision that needs it and every drain's node
/// lookup, so it must be seen before a machine dies.
impl crate::metrics::MetricsSource for NodeView {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let refreshed = self
            .snapshot()
            .refreshed_at
            .map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0);
        let _ = write!(
            out,
            "# HELP fleetmend_kubernetes_view_refresh_failing 1 while the node view's last refresh \
             (Nodes and node Leases) failed.\n\
             # TYPE fleetmend_kubernetes_view_refresh_failing gauge\n\
             fleetmend_kubernetes_view_refresh_failing {}\n\
             # HELP fleetmend_kubernetes_view_refreshed_timestamp_seconds When the node view was last \
             refreshed from the API server, Unix seconds (0: never).\n\
             # TYPE fleetmend_kubernetes_view_refreshed_timestamp_seconds gauge\n\
             fleetmend_kubernetes_view_refreshed_timestamp_seconds {refreshed:.3}\n",
            u8::from(self.last_failure().is_some())
        );
    }
}

impl NodeViewSource for NodeView {
    fn snapshot(&self) -> Arc<NodeViewSnapshot> {
        NodeView::snapshot(self)
    }

    fn last_failure(&self) -> Option<String> {
        NodeView::last_failure(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::cordon::{CORDON_ANNOTATION, CORDON_OWNER};

    fn snap(nodes: &[(&str, Option<bool>, i64)]) -> NodeViewSnapshot {
        NodeViewSnapshot {
            nodes: nodes
                .iter()
                .map(|&(name, ready, lease)| {
                    let node: Node =
                        serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
                            .unwrap();
                    let mut s = snapshot_of(&node);
                    s.ready = ready;
                    s.lease_renew_time = Some(Timestamp::from_second(lease).unwrap());
                    (name.to_string(), s)
                })
                .collect(),
            refreshed_at: None,
        }
    }

    #[test]
    fn a_ready_change_or_a_node_coming_or_going_is_a_change_a_lease_renewal_is_not() {
        let a = snap(&[("n1", Some(true), 1), ("n2", Some(true), 1)]);
        assert!(!readiness_changed(
            &a,
            &snap(&[("n1", Some(true), 9), ("n2", Some(true), 9)])
        ));
        assert!(readiness_changed(
            &a,
            &snap(&[("n1", Some(false), 1), ("n2", Some(true), 1)])
        ));
        assert!(readiness_changed(
            &a,
            &snap(&[("n1", Some(true), 1), ("n2", None, 1)])
        ));
        assert!(readiness_changed(&a, &snap(&[("n1", Some(true), 1)])));
        assert!(readiness_changed(
            &a,
            &snap(&[("n1", Some(true), 1), ("n3", Some(true), 1)])
        ));
    }

    #[test]
    fn snapshot_extracts_what_detectors_need() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u", "annotations": {CORDON_ANNOTATION: CORDON_OWNER}},
            "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoExecute"}]},
            "status": {
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }
        }))
        .unwrap();
        let s = snapshot_of(&node);
        assert_eq!(s.internal_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(s.ready, Some(false));
        assert!(s.unschedulable && s.cordoned_by_us);
        assert_eq!(s.taints[0].effect, "NoExecute");
        assert_eq!(
            s.condition("Ready").unwrap().last_transition,
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
    }
}
