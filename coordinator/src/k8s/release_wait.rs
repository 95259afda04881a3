//! What a release pass still waits for, and which of the released node's pods it may
//! force-delete itself: a pure function of the Node (or its absence), the pods bound to it
//! and the release method. [`super::release`] reads the cluster and acts on the answer.
//!
//! The real control plane (kube-controller-manager, checked in tests/tests/real_k8s.rs):
//! after the out-of-service taint the taint-eviction controller makes every pod that does
//! not tolerate it terminating at once, but the pod GC force-deletes them only on its next
//! pass (every 20 s) and only once the Node is not Ready; the pods of a deleted Node it
//! removes only after a 40 s quarantine. The attach-detach controller detaches a volume
//! once its pod is gone. With a proof of power-off in hand the coordinator does what the pod
//! GC would, without its wait: it force-deletes (grace 0) the terminating pods of a
//! tainted node that is not Ready, and the pods of a deleted Node. It never does so while
//! the Node is Ready: a kubelet still reporting means the "off" may be another machine's,
//! and the real pod GC would not act either; the pass then waits and says why (the node
//! lifecycle controller turns a really dead node not Ready after its grace period).
//!
//! This module does not read or write the cluster.

use k8s_openapi::api::core::v1::{Node, Pod};

/// The out-of-service taint's key.
pub const OUT_OF_SERVICE_KEY: &str = "node.kubernetes.io/out-of-service";
/// The out-of-service taint's value.
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// The out-of-service taint's effect.
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";

/// A pod to force-delete: its UID is the precondition, so a pod recreated under the same
/// name (a StatefulSet's) is never deleted by mistake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: Option<String>,
}

/// The answer for one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReleaseWait {
    /// Pods of the node that must still go (the release is not done while any remain).
    pub pods_left: usize,
    /// Of those, the ones to force-delete now.
    pub force_delete: Vec<PodRef>,
    /// The Node still reports Ready: nothing is force-deleted, by the pod GC or by us.
    pub node_ready: bool,
}

/// The Node's Ready condition is True: its kubelet reports, so it is not released.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod tolerates the out-of-service NoExecute taint, so the release leaves it.
fn tolerates_out_of_service(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                let key = t.key.as_deref().unwrap_or_default();
                let op = t.operator.as_deref().unwrap_or("Equal");
                let key_ok = key == OUT_OF_SERVICE_KEY || (key.is_empty() && op == "Exists");
                let effect_ok = t
                    .effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == OUT_OF_SERVICE_EFFECT);
                key_ok && effect_ok
            })
        })
}

/// Decides one pass: `node` is the Node as it is now (`None`: deleted), `pods` the pods bound
/// to it, `by_taint` whether the release is the out-of-service taint (else Node deletion).
pub fn release_wait(node: Option<&Node>, pods: &[Pod], by_taint: bool) -> ReleaseWait {
    let node_ready = node.is_some_and(is_ready);
    let must_go: Vec<&Pod> = pods
        .iter()
        .filter(|p| !by_taint || !tolerates_out_of_service(p))
        .collect();
    let may_force = if by_taint {
        node.is_some() && !node_ready
    } else {
        node.is_none()
    };
    let force_delete = if may_force {
        must_go
            .iter()
            .filter(|p| !by_taint || p.metadata.deletion_timestamp.is_some())
            .map(|p| PodRef {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: p.metadata.uid.clone(),
            })
            .collect()
    } else {
        Vec::new()
    };
    ReleaseWait {
        pods_left: must_go.len(),
        force_delete,
        node_ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    fn pod(name: &str, terminating: bool) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "db", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}
        });
        if terminating {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    fn tolerating(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().tolerations = Some(vec![
            serde_json::from_value(json!({"operator": "Exists"})).unwrap(),
        ]);
        p
    }

    fn names(w: &ReleaseWait) -> Vec<&str> {
        w.force_delete.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn a_tainted_node_not_ready_has_its_terminating_pods_force_deleted_at_once() {
        let pods = [pod("web-0", true), pod("cache", false)];
        let w = release_wait(Some(&node("Unknown")), &pods, true);
        assert_eq!(
            names(&w),
            ["web-0"],
            "a pod not yet terminating is the taint's"
        );
        assert_eq!(w.pods_left, 2);
        assert!(!w.node_ready);
    }

    #[test]
    fn a_node_still_ready_has_nothing_force_deleted_and_says_so() {
        let pods = [pod("web-0", true)];
        let w = release_wait(Some(&node("True")), &pods, true);
        assert!(w.force_delete.is_empty(), "{w:?}");
        assert_eq!(w.pods_left, 1);
        assert!(w.node_ready);
    }

    #[test]
    fn a_pod_tolerating_the_taint_stays_and_is_not_waited_on() {
        let pods = [tolerating(pod("agent", false))];
        let w = release_wait(Some(&node("False")), &pods, true);
        assert_eq!(w, ReleaseWait::default());
    }

    #[test]
    fn a_deleted_nodes_pods_are_all_force_deleted_even_if_tolerating() {
        let pods = [pod("web-0", false), tolerating(pod("agent", false))];
        let w = release_wait(None, &pods, false);
        assert_eq!(names(&w), ["web-0", "agent"]);
        assert_eq!(w.pods_left, 2);
    }

    #[test]
    fn a_node_not_yet_deleted_has_nothing_force_deleted() {
        let pods = [pod("web-0", true)];
        let w = release_wait(Some(&node("Unknown")), &pods, false);
        assert!(w.force_delete.is_empty());
        assert_eq!(w.pods_left, 1);
    }

    #[test]
    fn nothing_left_is_done() {
        assert_eq!(
            release_wait(Some(&node("Unknown")), &[], true),
            ReleaseWait::default()
        );
    }
}
