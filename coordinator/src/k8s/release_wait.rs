//! What a release pass still waits for, and which of the released node's pods it may
//! force-delete itself: a pure function of the Node (or its absence), the pods bound to it,
//! the release method and whether the node's kubelet looks alive. [`super::release`] reads
//! the cluster, judges the kubelet (Ready, or the Lease with `second_signal = "lease"`) and
//! acts on the answer.
//!
//! The real control plane (kube-controller-manager, checked in tests/tests/real_k8s.rs):
//! after the out-of-service taint the taint-eviction controller makes every pod that does
//! not tolerate it terminating at once, but the pod GC force-deletes them only on its next
//! pass (every 20 s) and only once the Node is not Ready; the pods of a deleted Node it
//! removes only after a 40 s quarantine. The attach-detach controller detaches a volume
//! once its pod is gone. With a proof of power-off in hand the coordinator does the pod
//! GC's part itself, without its wait and without waiting for Ready to leave True: it
//! force-deletes (grace 0) every pod of the tainted node that does not tolerate the taint,
//! and every pod of a deleted Node. It never does so while the kubelet looks alive: a
//! kubelet still reporting means the "off" may be another machine's; the pass then waits
//! and says why.
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
}

/// The Node's Ready condition is True: its kubelet reports, so it is not released.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Node carries the out-of-service taint.
pub fn has_oos_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_KEY))
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
/// to it, `by_taint` whether the release is the out-of-service taint (else Node deletion),
/// `kubelet_alive` whether the node's kubelet looks alive (nothing is force-deleted then).
pub fn release_wait(
    node: Option<&Node>,
    pods: &[Pod],
    by_taint: bool,
    kubelet_alive: bool,
) -> ReleaseWait {
    let must_go: Vec<&Pod> = pods
        .iter()
        .filter(|p| !by_taint || !tolerates_out_of_service(p))
        .collect();
    // Released: the taint is on the Node, or the Node is gone.
    let released = if by_taint {
        node.is_some_and(has_oos_taint)
    } else {
        node.is_none()
    };
    let force_delete = if released && !kubelet_alive {
        must_go
            .iter()
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Node with the out-of-service taint and Ready `ready`.
    fn node(ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": [{"key": OUT_OF_SERVICE_KEY, "value": OUT_OF_SERVICE_VALUE,
                                 "effect": OUT_OF_SERVICE_EFFECT}]},
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
    fn a_tainted_node_whose_kubelet_is_gone_has_all_its_pods_force_deleted_at_once() {
        // Terminating (the taint-eviction controller was there first) or not yet: both go,
        // without waiting for the pod GC or for Ready to leave True.
        let pods = [pod("web-0", true), pod("cache", false)];
        for ready in ["Unknown", "True"] {
            let w = release_wait(Some(&node(ready)), &pods, true, false);
            assert_eq!(names(&w), ["web-0", "cache"], "Ready {ready}");
            assert_eq!(w.pods_left, 2);
        }
    }

    #[test]
    fn a_node_whose_kubelet_looks_alive_has_nothing_force_deleted() {
        let pods = [pod("web-0", true)];
        for by_taint in [true, false] {
            let node = by_taint.then(|| node("True"));
            let w = release_wait(node.as_ref(), &pods, by_taint, true);
            assert!(w.force_delete.is_empty(), "{w:?}");
            assert_eq!(w.pods_left, 1);
        }
    }

    #[test]
    fn a_pod_tolerating_the_taint_stays_and_is_not_waited_on() {
        let pods = [tolerating(pod("agent", false))];
        let w = release_wait(Some(&node("False")), &pods, true, false);
        assert_eq!(w, ReleaseWait::default());
    }

    #[test]
    fn a_deleted_nodes_pods_are_all_force_deleted_even_if_tolerating() {
        let pods = [pod("web-0", false), tolerating(pod("agent", false))];
        let w = release_wait(None, &pods, false, false);
        assert_eq!(names(&w), ["web-0", "agent"]);
        assert_eq!(w.pods_left, 2);
    }

    #[test]
    fn a_node_not_yet_deleted_or_not_yet_tainted_has_nothing_force_deleted() {
        let pods = [pod("web-0", true)];
        let w = release_wait(Some(&node("Unknown")), &pods, false, false);
        assert!(w.force_delete.is_empty());
        assert_eq!(w.pods_left, 1);
        let w = release_wait(None, &pods, true, false);
        assert!(
            w.force_delete.is_empty(),
            "a Node deleted under a taint release"
        );
        let mut untainted = node("Unknown");
        untainted.spec = None;
        let w = release_wait(Some(&untainted), &pods, true, false);
        assert!(w.force_delete.is_empty(), "a Node not tainted yet");
    }

    #[test]
    fn nothing_left_is_done() {
        assert_eq!(
            release_wait(Some(&node("Unknown")), &[], true, false),
            ReleaseWait::default()
        );
    }
}
