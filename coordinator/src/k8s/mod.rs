//! Kubernetes: node mapping, cordon, drain, release and restore, the node view detectors
//! read, and Events.
//!
//! The coordinator reaches Kubernetes only through three traits, so it can run with no
//! cluster at all and be tested with hand-written fakes (`crate::testing`): [`Drainer`]
//! (node lookup, drain, uncordon, Events; [`NotANode`] without a cluster), [`NodeRelease`]
//! (releasing a fenced node's workload and restoring it) and [`NodeViewSource`] (the node
//! view). The real implementations are [`KubeDrainer`] (CKE's repair drain, release and
//! restore through kube-rs) and [`NodeView`]. Every call fails with a [`KubeError`].
//!
//! Submodules: [`config`] (the `[kubernetes]` section), [`client`] (client, error mapping),
//! [`selector`] (label selectors), [`cordon`] (whose cordon it is), [`decision`] (pure
//! per-pod drain decisions), [`drain`], [`release`], [`release_wait`], [`lease`] (a Lease's
//! age, the second signal's rule), [`view`], [`events`], [`probe`] (`coordinator check`'s
//! look at the API server).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;

pub mod client;
pub mod config;
pub mod cordon;
pub mod decision;
pub mod drain;
pub mod events;
pub mod gate;
pub mod lease;
pub mod probe;
pub mod release;
pub mod release_wait;
pub mod selector;
pub mod view;

pub use config::{KubernetesConfig, ReleaseMethod};
pub use drain::KubeDrainer;
pub use events::NodeEvent;
pub use view::NodeView;

use crate::fence::proof::DownProof;
use release::{Release, ReleaseProgress, RestoreProgress, SavedNodeMetadata};
use view::NodeViewSnapshot;

/// Everything a drain needs from the repair configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainOptions {
    /// Label selector (Kubernetes syntax) of namespaces whose pods are evicted through the
    /// Eviction API (respecting PodDisruptionBudgets) rather than deleted.
    pub protected_namespaces: Option<String>,
    /// Label selector of Job pods whose running presence on the node blocks the drain.
    pub protected_job_pods: Option<String>,
    /// Extra eviction attempts after a 429.
    pub evict_retries: u32,
    /// Seconds between eviction attempts.
    pub evict_interval_seconds: u64,
}

/// Where a drain stands after one idempotent pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainProgress {
    /// Every pod that had to go is gone.
    Done,
    /// Evictions/deletions were issued; pods are still terminating or waiting on budgets.
    InProgress {
        /// Pods still on the node that must go.
        remaining: usize,
        /// What is being waited on, for the entry's history.
        detail: String,
    },
    /// The drain must be abandoned now and backed off (protected Job pod running, several
    /// budgets matching a pod, eviction forbidden): the node has been uncordoned if the
    /// cordon was ours.
    Abandoned {
        /// Why.
        reason: String,
    },
}

/// Why a Kubernetes call failed: any call of this module (node lookup, drain, uncordon,
/// release, restore, node view refresh), not only drains.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The API server could not be reached or answered 5xx: hold and try again.
    #[error("Kubernetes API unavailable: {0}")]
    Unavailable(String),
    /// The API server refused the request for a reason retrying will not fix.
    #[error("Kubernetes API refused: {0}")]
    Refused(String),
    /// The client could not be built from the `[kubernetes]` section (kubeconfig, context,
    /// in-cluster account): no API server was asked.
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
}

impl KubeError {
    /// True when the same call may succeed later.
    pub fn is_retriable(&self) -> bool {
        matches!(self, KubeError::Unavailable(_))
    }
}

/// The repair queue's view of Kubernetes.
pub trait Drainer: Send + Sync + 'static {
    /// The Node whose InternalIP is `address`, or `None` when the machine is not a node.
    fn node_for(&self, address: &str) -> BoxFuture<'_, Result<Option<String>, KubeError>>;

    /// The Node whose InternalIP is `address` in what the drainer last saw, without asking
    /// the API server: a name to show and to post Events on, never a reason to drain (a
    /// drain looks the node up with [`Self::node_for`]). Default: not known.
    fn known_node(&self, address: &str) -> Option<String> {
        let _ = address;
        None
    }

    /// One idempotent drain pass: cordon (marked as ours), check protected Job pods, evict
    /// or delete what must go, report progress. Called repeatedly until `Done`.
    fn drain<'a>(
        &'a self,
        node: &'a str,
        opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, KubeError>>;

    /// Nodes the current node view shows cordoned by Fleetmend (the cordon annotation), for
    /// the repair queue's sweep of cordons no entry owns any more. Empty without a view.
    fn cordoned_by_us(&self) -> Vec<String> {
        Vec::new()
    }

    /// Uncordons `node` if, and only if, the cordon is ours.
    fn uncordon_if_ours<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), KubeError>>;

    /// Records a remediation step as a Kubernetes Event on `node` (best effort, never
    /// fails). The repair engine calls it for steps the drainer cannot see, such as
    /// [`NodeEvent::Repaired`] and [`NodeEvent::Failed`]. Default: nothing.
    fn record_event<'a>(
        &'a self,
        node: &'a str,
        event: NodeEvent,
        message: &'a str,
    ) -> BoxFuture<'a, ()> {
        let _ = (node, event, message);
        Box::pin(async {})
    }
}

/// Releasing a fenced node's workload and restoring the node once its machine is back
/// (see [`release`]). Every call that lets workload go elsewhere takes a [`DownProof`]
/// (invariant 1). The real implementation is [`KubeDrainer`].
pub trait NodeRelease: Send + Sync + 'static {
    /// Reads what must be saved before a Node is deleted. Read-only; no proof needed.
    fn save_node_metadata<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<SavedNodeMetadata, KubeError>>;

    /// How to release on this cluster (out-of-service taint or Node deletion).
    fn release_plan<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Release, KubeError>>;

    /// One idempotent pass of releasing `node`'s workload.
    fn release<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<ReleaseProgress, KubeError>>;

    /// One idempotent pass of restoring `node` after its machine is back.
    fn restore<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<RestoreProgress, KubeError>>;
}

/// The node view detectors read (see [`view`]): an immutable snapshot of every Node, and
/// whether it is fresh enough to act on (invariant 7). The real implementation is
/// [`NodeView`].
pub trait NodeViewSource: Send + Sync + 'static {
    /// The current snapshot.
    fn snapshot(&self) -> Arc<NodeViewSnapshot>;

    /// True when the snapshot was refreshed within `max_age` of `now`.
    fn is_fresh(&self, now: Timestamp, max_age: Duration) -> bool {
        self.snapshot().is_fresh(now, max_age)
    }

    /// Why the last refresh failed, while no later one has succeeded (`None` by default:
    /// a source that cannot fail).
    fn last_failure(&self) -> Option<String> {
        None
    }
}

/// The drainer used when no cluster is configured: no machine is a node.
#[derive(Debug, Default, Clone, Copy)]
pub struct NotANode;

impl Drainer for NotANode {
    fn node_for(&self, _address: &str) -> BoxFuture<'_, Result<Option<String>, KubeError>> {
        Box::pin(async { Ok(None) })
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        _opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, KubeError>> {
        Box::pin(async move {
            Err(KubeError::Refused(format!(
                "no Kubernetes cluster is configured, cannot drain {node}"
            )))
        })
    }

    fn uncordon_if_ours<'a>(&'a self, _node: &'a str) -> BoxFuture<'a, Result<(), KubeError>> {
        Box::pin(async { Ok(()) })
    }
}
