//! The node view detectors read: a cache of every Node's conditions (with last transition
//! times), Ready, taints, unschedulable, InternalIP, and its kubelet Lease renew time from
//! `coordination.k8s.io/v1` Leases in `kube-node-lease`.
//!
//! Refreshed by polling (a full list of Nodes and node Leases every
//! `node_view_refresh`), which is simple, survives API server restarts without
//! watch bookkeeping, and costs two list calls per interval. Reads are cheap: a clone of an
//! `Arc` to an immutable snapshot. [`NodeView::is_fresh`] says whether the view can be
//! trusted; when it cannot (API down), detectors must hold rather than guess (invariant 7).
//! This module deliberately makes no health judgement.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

use super::client::map_err;
use super::cordon::cordoned_by_us;
use super::{KubeError, NodeViewSource};
use crate::clock::Clock;

/// The namespace holding the kubelets' heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

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
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// The cached node view. Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct NodeView {
    client: kube::Client,
    clock: Arc<dyn Clock>,
    current: Arc<RwLock<Arc<NodeViewSnapshot>>>,
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
        }
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

    /// Lists Nodes and node Leases and replaces the snapshot.
    pub async fn refresh(&self) -> Result<Arc<NodeViewSnapshot>, KubeError> {
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
        let mut snap = NodeViewSnapshot {
            nodes: BTreeMap::new(),
            refreshed_at: Some(self.clock.now()),
        };
        for n in &node_list.items {
            let mut s = snapshot_of(n);
            s.lease_renew_time = renew.get(&s.name).copied();
            snap.nodes.insert(s.name.clone(), s);
        }
        let snap = Arc::new(snap);
        *self.current.write().expect("node view poisoned") = snap.clone();
        Ok(snap)
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
            s.lease_renew_time = old.nodes.get(&s.name).and_then(|o| o.lease_renew_time);
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

impl NodeViewSource for NodeView {
    fn snapshot(&self) -> Arc<NodeViewSnapshot> {
        NodeView::snapshot(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::cordon::{CORDON_ANNOTATION, CORDON_OWNER};

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
