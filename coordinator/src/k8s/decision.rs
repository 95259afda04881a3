//! The drain's decisions, as pure functions: what to do with each pod on a node being drained,
//! and what an Eviction API answer means.
//!
//! Semantics follow CKE's repair drain: DaemonSet pods, mirror (static) pods and finished pods
//! stay; a running Job pod matching `protected_job_pods` (every Job pod when unset) blocks the
//! drain; other running Job pods are deleted; every other pod is evicted through the Eviction
//! API, and when a PodDisruptionBudget refuses (429) a pod outside the protected namespaces is
//! deleted instead. Pods already terminating are waited on. No I/O happens here; the
//! [`super::drain`] executor acts on the answers.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use super::selector::LabelSelector;

/// The annotation the kubelet puts on a mirror pod (the API's copy of a static pod).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The facts about a pod the decision needs, extracted from the API object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID: a pod recreated under the same name (StatefulSet) is a different pod.
    pub uid: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`), empty if unset.
    pub phase: String,
    /// Kind of the controlling owner reference, if any.
    pub controller_kind: Option<String>,
    /// Carries the mirror-pod annotation.
    pub mirror: bool,
    /// Has a deletion timestamp: already terminating.
    pub terminating: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl PodFacts {
    /// Extracts the facts from a Pod object.
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            controller_kind: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.kind.clone()),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION)),
            terminating: meta.deletion_timestamp.is_some(),
            labels: meta.labels.clone().unwrap_or_default(),
        }
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn finished(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// Which namespaces are protected (evict only, never delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtectedNamespaces {
    /// No selector configured: every namespace is protected (CKE's default).
    All,
    /// The namespaces matching the configured selector.
    Only(BTreeSet<String>),
}

impl ProtectedNamespaces {
    /// True when pods in `ns` must only be evicted.
    pub fn contains(&self, ns: &str) -> bool {
        match self {
            ProtectedNamespaces::All => true,
            ProtectedNamespaces::Only(set) => set.contains(ns),
        }
    }
}

/// Why a pod is left on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Owned by a DaemonSet: it would be recreated on the node anyway.
    DaemonSet,
    /// A mirror pod: the kubelet owns it; the API cannot remove it.
    Mirror,
    /// Succeeded or Failed: nothing runs.
    Finished,
    /// A Job pod that is not running (Pending, or phase unknown to CKE's rule).
    JobNotRunning,
}

/// What the drain does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodAction {
    /// Leave it.
    Skip(SkipReason),
    /// Evict through the Eviction API. When a budget refuses: retry if `protected`, else
    /// delete.
    Evict {
        /// The pod's namespace is protected.
        protected: bool,
    },
    /// Delete directly (an unprotected running Job pod).
    Delete,
    /// Already terminating: wait for it to be gone.
    Wait,
    /// A running protected Job pod: the drain must stop and back off.
    Block {
        /// Why, for the entry and the Event.
        reason: String,
    },
}

impl PodAction {
    /// True when this pod keeps the drain from being done.
    pub fn must_go(&self) -> bool {
        !matches!(self, PodAction::Skip(_))
    }
}

/// Decides what to do with `pod`. `protected_job_pods` of `None` protects every Job pod, as
/// in CKE.
pub fn decide_pod(
    pod: &PodFacts,
    protected_ns: &ProtectedNamespaces,
    protected_job_pods: Option<&LabelSelector>,
) -> PodAction {
    if pod.mirror {
        return PodAction::Skip(SkipReason::Mirror);
    }
    if pod.controller_kind.as_deref() == Some("DaemonSet") {
        return PodAction::Skip(SkipReason::DaemonSet);
    }
    if pod.finished() {
        return PodAction::Skip(SkipReason::Finished);
    }
    if pod.terminating {
        return PodAction::Wait;
    }
    if pod.controller_kind.as_deref() == Some("Job") {
        if pod.phase == "Pending" {
            return PodAction::Skip(SkipReason::JobNotRunning);
        }
        let protected = protected_job_pods.is_none_or(|s| s.matches(&pod.labels));
        if protected {
            return PodAction::Block {
                reason: format!(
                    "protected Job pod {} is running (phase {})",
                    pod.key(),
                    if pod.phase.is_empty() {
                        "unset"
                    } else {
                        &pod.phase
                    }
                ),
            };
        }
        return PodAction::Delete;
    }
    PodAction::Evict {
        protected: protected_ns.contains(&pod.namespace),
    }
}

/// What the API server answered to an eviction, reduced to what matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionAnswer {
    /// 2xx: the pod is being deleted.
    Allowed,
    /// 404: the pod is already gone.
    NotFound,
    /// 409: the pod with that UID is gone (a new one may have the same name).
    Conflict,
    /// 429: a PodDisruptionBudget does not allow the disruption now.
    TooManyRequests(String),
    /// 500 naming several budgets: misconfiguration that retrying will not fix.
    MultipleBudgets(String),
    /// 403: forbidden (RBAC, or a namespace being terminated).
    Forbidden(String),
    /// Any other answer.
    Other {
        /// HTTP status.
        code: u16,
        /// The Status message.
        message: String,
    },
}

impl EvictionAnswer {
    /// Classifies an HTTP status and Status message.
    pub fn classify(code: u16, message: &str) -> Self {
        match code {
            200..=299 => EvictionAnswer::Allowed,
            404 => EvictionAnswer::NotFound,
            409 => EvictionAnswer::Conflict,
            429 => EvictionAnswer::TooManyRequests(message.to_string()),
            403 => EvictionAnswer::Forbidden(message.to_string()),
            // The API server answers 500 with "This pod has more than one
            // PodDisruptionBudget, which the eviction subresource does not support."
            500 if message.contains("more than one PodDisruptionBudget") => {
                EvictionAnswer::MultipleBudgets(message.to_string())
            }
            _ => EvictionAnswer::Other {
                code,
                message: message.to_string(),
            },
        }
    }
}

/// The next step after an eviction answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictNext {
    /// The pod is going (or gone); wait for it.
    Going,
    /// Blocked by a budget: try again after `evict_interval`.
    RetryAfterInterval,
    /// Blocked by a budget and out of attempts (protected namespace): report, try again on
    /// the next drain pass.
    BudgetBlocked(String),
    /// Blocked by a budget in an unprotected namespace: delete the pod instead.
    DeleteInstead,
    /// Stop the drain and report; retrying will not help.
    Stop(String),
    /// The API server is struggling (5xx other than several budgets): hold and retry later.
    Unavailable(String),
}

/// Decides what follows an eviction answer. `attempt` counts from 1; `attempts` is
/// `evict_retries + 1`.
pub fn after_eviction(
    answer: &EvictionAnswer,
    pod: &PodFacts,
    protected: bool,
    attempt: u32,
    attempts: u32,
) -> EvictNext {
    match answer {
        EvictionAnswer::Allowed | EvictionAnswer::NotFound | EvictionAnswer::Conflict => {
            EvictNext::Going
        }
        EvictionAnswer::TooManyRequests(msg) => {
            if !protected {
                EvictNext::DeleteInstead
            } else if attempt < attempts {
                EvictNext::RetryAfterInterval
            } else {
                EvictNext::BudgetBlocked(format!(
                    "eviction of {} blocked by a PodDisruptionBudget: {msg}",
                    pod.key()
                ))
            }
        }
        EvictionAnswer::MultipleBudgets(msg) => {
            EvictNext::Stop(format!("cannot evict {}: {msg}", pod.key()))
        }
        EvictionAnswer::Forbidden(msg) => {
            EvictNext::Stop(format!("eviction of {} forbidden: {msg}", pod.key()))
        }
        EvictionAnswer::Other { code, message } if *code >= 500 => EvictNext::Unavailable(format!(
            "eviction of {} failed with {code}: {message}",
            pod.key()
        )),
        EvictionAnswer::Other { code, message } => EvictNext::Stop(format!(
            "eviction of {} refused with {code}: {message}",
            pod.key()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chainable pod fixture.
    #[derive(Clone)]
    struct P(PodFacts);

    fn pod(ns: &str, name: &str) -> P {
        P(PodFacts {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            phase: "Running".into(),
            ..Default::default()
        })
    }

    impl P {
        fn owner(mut self, kind: &str) -> Self {
            self.0.controller_kind = Some(kind.into());
            self
        }
        fn phase(mut self, phase: &str) -> Self {
            self.0.phase = phase.into();
            self
        }
        fn mirror(mut self) -> Self {
            self.0.mirror = true;
            self
        }
        fn terminating(mut self) -> Self {
            self.0.terminating = true;
            self
        }
        fn label(mut self, k: &str, v: &str) -> Self {
            self.0.labels.insert(k.into(), v.into());
            self
        }
    }

    fn only(ns: &[&str]) -> ProtectedNamespaces {
        ProtectedNamespaces::Only(ns.iter().map(|s| s.to_string()).collect())
    }

    fn decide(p: P, ns: &ProtectedNamespaces, jobs: Option<&str>) -> PodAction {
        let sel = jobs.map(|s| LabelSelector::parse(s).unwrap());
        decide_pod(&p.0, ns, sel.as_ref())
    }

    #[test]
    fn replicaset_and_statefulset_pods_are_evicted_protected_or_not() {
        let ns = only(&["prod"]);
        assert_eq!(
            decide(pod("prod", "a").owner("ReplicaSet"), &ns, None),
            PodAction::Evict { protected: true }
        );
        assert_eq!(
            decide(pod("dev", "b").owner("StatefulSet"), &ns, None),
            PodAction::Evict { protected: false }
        );
        assert_eq!(
            decide(pod("dev", "bare"), &ProtectedNamespaces::All, None),
            PodAction::Evict { protected: true }
        );
        // Pending non-Job pods hold resources on the node: they go too.
        assert_eq!(
            decide(pod("dev", "p").phase("Pending"), &ns, None),
            PodAction::Evict { protected: false }
        );
    }

    #[test]
    fn daemonset_mirror_and_finished_pods_are_skipped() {
        let ns = ProtectedNamespaces::All;
        assert_eq!(
            decide(pod("kube-system", "ds").owner("DaemonSet"), &ns, None),
            PodAction::Skip(SkipReason::DaemonSet)
        );
        assert_eq!(
            decide(pod("kube-system", "etcd").mirror().owner("Node"), &ns, None),
            PodAction::Skip(SkipReason::Mirror)
        );
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(
                decide(pod("a", "done").phase(phase), &ns, None),
                PodAction::Skip(SkipReason::Finished)
            );
            assert!(!decide(pod("a", "done").phase(phase), &ns, None).must_go());
        }
    }

    #[test]
    fn terminating_pods_are_waited_on() {
        let action = decide(
            pod("a", "slow").owner("ReplicaSet").terminating(),
            &ProtectedNamespaces::All,
            None,
        );
        assert_eq!(action, PodAction::Wait);
        assert!(action.must_go());
    }

    #[test]
    fn running_job_pods_block_when_protected_and_are_deleted_otherwise() {
        let ns = ProtectedNamespaces::All;
        // No selector: every running Job pod is protected (CKE).
        assert!(matches!(
            decide(pod("batch", "j").owner("Job"), &ns, None),
            PodAction::Block { .. }
        ));
        let sel = Some("fleetmend.io/protected=true");
        assert!(matches!(
            decide(
                pod("batch", "j")
                    .owner("Job")
                    .label("fleetmend.io/protected", "true"),
                &ns,
                sel
            ),
            PodAction::Block { .. }
        ));
        assert_eq!(
            decide(pod("batch", "j").owner("Job"), &ns, sel),
            PodAction::Delete
        );
        assert_eq!(
            decide(pod("batch", "j").owner("Job").phase("Pending"), &ns, None),
            PodAction::Skip(SkipReason::JobNotRunning)
        );
        assert_eq!(
            decide(pod("batch", "j").owner("Job").phase("Succeeded"), &ns, None),
            PodAction::Skip(SkipReason::Finished)
        );
    }

    #[test]
    fn eviction_answers() {
        let p = pod("a", "x").0;
        let go = |code, msg: &str, protected, attempt| {
            after_eviction(
                &EvictionAnswer::classify(code, msg),
                &p,
                protected,
                attempt,
                3,
            )
        };
        assert_eq!(go(201, "", true, 1), EvictNext::Going);
        assert_eq!(go(404, "not found", true, 1), EvictNext::Going);
        assert_eq!(go(409, "uid mismatch", true, 1), EvictNext::Going);
        assert_eq!(go(429, "budget", true, 1), EvictNext::RetryAfterInterval);
        assert!(matches!(
            go(429, "budget", true, 3),
            EvictNext::BudgetBlocked(_)
        ));
        assert_eq!(go(429, "budget", false, 1), EvictNext::DeleteInstead);
        assert!(matches!(
            go(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                true,
                1
            ),
            EvictNext::Stop(_)
        ));
        assert!(matches!(go(403, "forbidden", true, 1), EvictNext::Stop(_)));
        assert!(matches!(
            go(503, "etcd", true, 1),
            EvictNext::Unavailable(_)
        ));
        assert!(matches!(go(422, "invalid", true, 1), EvictNext::Stop(_)));
    }

    #[test]
    fn facts_from_a_pod_object() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-1", "namespace": "prod", "uid": "u1",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"kubernetes.io/config.mirror": "abc"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "x", "controller": false},
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "y", "controller": true}
                ]
            },
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let f = PodFacts::from_pod(&pod);
        assert_eq!(f.controller_kind.as_deref(), Some("StatefulSet"));
        assert!(f.mirror && f.terminating);
        assert_eq!((f.uid.as_str(), f.phase.as_str()), ("u1", "Running"));
    }
}
