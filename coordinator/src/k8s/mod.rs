//! Kubernetes: node mapping, cordon, drain, release and restore, the node view detectors
//! read, and Events.
//!
//! The repair queue drives drains only through the [`Drainer`] trait, so it can run with no
//! cluster at all ([`NotANode`]) and be tested with hand-written fakes. The real
//! implementation is [`KubeDrainer`] (CKE's repair drain through kube-rs); it also releases
//! and restores fenced nodes ([`release`]), keeps the [`view::NodeView`] detectors read, and
//! records [`events`] on Nodes.
//!
//! Submodules: [`client`] (configuration, client, error mapping), [`selector`] (label
//! selectors), [`decision`] (pure per-pod drain decisions), [`drain`], [`release`], [`view`],
//! [`events`].

use futures::future::BoxFuture;

pub mod client;
pub mod decision;
pub mod drain;
pub mod events;
pub mod release;
pub mod selector;
pub mod view;

pub use client::{KubernetesConfig, ReleaseMethod};
pub use drain::KubeDrainer;
pub use events::NodeEvent;

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

/// Why a Kubernetes call failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The API server could not be reached or answered 5xx: hold and try again.
    #[error("Kubernetes API unavailable: {0}")]
    Unavailable(String),
    /// The API server refused the request for a reason retrying will not fix.
    #[error("Kubernetes API refused: {0}")]
    Refused(String),
}

impl DrainError {
    /// True when the same call may succeed later.
    pub fn is_retriable(&self) -> bool {
        matches!(self, DrainError::Unavailable(_))
    }
}

/// The repair queue's view of Kubernetes.
pub trait Drainer: Send + Sync + 'static {
    /// The Node whose InternalIP is `address`, or `None` when the machine is not a node.
    fn node_for(&self, address: &str) -> BoxFuture<'_, Result<Option<String>, DrainError>>;

    /// One idempotent drain pass: cordon (marked as ours), check protected Job pods, evict
    /// or delete what must go, report progress. Called repeatedly until `Done`.
    fn drain<'a>(
        &'a self,
        node: &'a str,
        opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, DrainError>>;

    /// Uncordons `node` if, and only if, the cordon is ours.
    fn uncordon_if_ours<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), DrainError>>;

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

/// The drainer for the coordinator's `[kubernetes]` section: a [`KubeDrainer`] when the
/// section is present, [`NotANode`] (no machine is a node) when it is absent. Builds the
/// client only; nothing is sent to the API server until the first drain.
pub async fn drainer_for(
    cfg: Option<&KubernetesConfig>,
) -> Result<std::sync::Arc<dyn Drainer>, DrainError> {
    Ok(match cfg {
        Some(cfg) => std::sync::Arc::new(KubeDrainer::from_config(cfg).await?),
        None => std::sync::Arc::new(NotANode),
    })
}

/// The drainer used when no cluster is configured: no machine is a node.
#[derive(Debug, Default, Clone, Copy)]
pub struct NotANode;

impl Drainer for NotANode {
    fn node_for(&self, _address: &str) -> BoxFuture<'_, Result<Option<String>, DrainError>> {
        Box::pin(async { Ok(None) })
    }

    fn drain<'a>(
        &'a self,
        node: &'a str,
        _opts: &'a DrainOptions,
    ) -> BoxFuture<'a, Result<DrainProgress, DrainError>> {
        Box::pin(async move {
            Err(DrainError::Refused(format!(
                "no Kubernetes cluster is configured, cannot drain {node}"
            )))
        })
    }

    fn uncordon_if_ours<'a>(&'a self, _node: &'a str) -> BoxFuture<'a, Result<(), DrainError>> {
        Box::pin(async { Ok(()) })
    }
}
