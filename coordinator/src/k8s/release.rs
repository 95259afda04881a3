//! Releasing a fenced node's workload, and restoring the node after it comes back.
//!
//! Release follows the Kubernetes documentation for non-graceful node shutdown: add the
//! `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint (Kubernetes 1.28+), after
//! which the pod GC force-deletes the node's terminating pods and the attach-detach controller
//! detaches its volumes; or, where configured or on older clusters, save the Node's labels and
//! annotations and delete the Node object, which makes the pod GC remove its pods. Either way
//! release is complete only when no pod of the node is left (but those tolerating the taint)
//! and no VolumeAttachment names the node. With its proof of power-off a pass force-deletes
//! the node's pods itself, as the pod GC would but without waiting for it
//! ([`super::release_wait`]). A node whose kubelet looks alive is not released at all,
//! proof or not: against the real controllers the out-of-service taint alone makes the
//! attach-detach controller detach the volumes of its terminating pods even while the
//! kubelet renews (tests/tests/real_k8s.rs), so a proof for the wrong machine would release
//! a live node's volumes. What "looks alive" means follows `remediation.second_signal`
//! ([`SecondSignal`]): by default the Node still reports Ready (the pass waits for the node
//! lifecycle controller, as the pod GC would); with `lease`, the kubelet's Lease was renewed
//! within `lease_stale`, by its stamp or as this coordinator saw it change (its own reads
//! and the node view's, [`super::lease`]), so a kubelet that renews after the proof holds
//! the release whatever its clock says, and a dead one does not wait for Ready. The pass
//! waits, and says why. Restore removes the taint, or puts the saved labels and annotations
//! back on the re-registered Node.
//!
//! Both require a [`DownProof`] for the node's machine: they cannot be called otherwise
//! (invariant 1; see [`crate::fence::proof`]). Both are idempotent passes that report progress;
//! the fencing flow calls them until done and persists [`SavedNodeMetadata`] before deleting.
//! This module deliberately does not power anything on or off.

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde::{Deserialize, Serialize};

use super::client::{ReleaseMethod, is_conflict, is_not_found, map_err};
use super::drain::KubeDrainer;
use super::events::NodeEvent;
use super::lease::{SecondSignal, is_stale, lease_age, seen_since};
use super::release_wait::{has_oos_taint, is_ready, release_wait};
use super::view::{NODE_LEASE_NAMESPACE, internal_ip};
use super::{KubeError, NodeRelease};
use crate::fence::proof::DownProof;

pub use super::release_wait::{OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE};

/// The first Kubernetes minor version where the out-of-service taint is GA.
pub const OUT_OF_SERVICE_MIN_MINOR: u32 = 28;

/// What was saved of a Node before deleting it, to put back when it re-registers. The
/// fencing flow persists this (it is serde) before calling [`KubeDrainer::release`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedNodeMetadata {
    /// Node name.
    pub name: String,
    /// The Node's InternalIP when saved.
    pub internal_ip: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// How to release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Release {
    /// The out-of-service taint.
    Taint,
    /// Delete the Node; `SavedNodeMetadata` is restored later.
    DeleteNode(SavedNodeMetadata),
}

/// Where a release stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseProgress {
    /// No pod of the node is left (except those tolerating the taint) and no
    /// VolumeAttachment names it.
    Done,
    /// Still waiting.
    Waiting {
        /// Pods of the node that must still go (terminating, or about to be by the taint).
        pods: usize,
        /// VolumeAttachments still naming the node.
        volume_attachments: usize,
        /// Why the release is held (no taint, no Node deletion, no force delete): the node's
        /// kubelet looks alive though its machine was confirmed off (its Node still reports
        /// Ready, or, with `second_signal = "lease"`, its Lease is still renewed).
        held: Option<String>,
    },
}

/// Where a restore stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreProgress {
    /// The taint is gone / the metadata is back.
    Done,
    /// The Node has not re-registered yet.
    WaitingForNode,
}

/// Parses a minor version as the API server reports it (`"33"`, `"28+"`).
pub fn parse_minor(minor: &str) -> Option<u32> {
    minor
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}

impl KubeDrainer {
    /// Reads what must be saved before a Node is deleted. Read-only; no proof needed.
    pub async fn save_node_metadata(&self, node: &str) -> Result<SavedNodeMetadata, KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let n = api
            .get(node)
            .await
            .map_err(|e| map_err(&format!("get node {node}"), e))?;
        Ok(SavedNodeMetadata {
            name: node.to_string(),
            internal_ip: internal_ip(&n),
            labels: n.metadata.labels.clone().unwrap_or_default(),
            annotations: n.metadata.annotations.clone().unwrap_or_default(),
        })
    }

    /// Decides how to release on this cluster: the configured method, with `auto` meaning
    /// the taint on 1.28+ and Node deletion before.
    pub async fn release_plan(&self, node: &str) -> Result<Release, KubeError> {
        let use_taint = match self.release_method {
            ReleaseMethod::Taint => true,
            ReleaseMethod::DeleteNode => false,
            ReleaseMethod::Auto => {
                let v = self
                    .client
                    .apiserver_version()
                    .await
                    .map_err(|e| map_err("read API server version", e))?;
                let minor = parse_minor(&v.minor).unwrap_or(0);
                v.major.trim() != "1" || minor >= OUT_OF_SERVICE_MIN_MINOR
            }
        };
        Ok(if use_taint {
            Release::Taint
        } else {
            Release::DeleteNode(self.save_node_metadata(node).await?)
        })
    }

    fn check_proof(node: &str, ip: Option<&str>, proof: &DownProof) -> Result<(), KubeError> {
        match ip {
            Some(ip) if ip == proof.address() => Ok(()),
            other => Err(KubeError::Refused(format!(
                "refusing to release node {node} (InternalIP {}): the proof of power-off is for {}",
                other.unwrap_or("unknown"),
                proof.address()
            ))),
        }
    }

    /// One pass of releasing `node`'s workload; call until [`ReleaseProgress::Done`].
    pub async fn release(
        &self,
        node: &str,
        proof: &DownProof,
        how: &Release,
    ) -> Result<ReleaseProgress, KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let current = api
            .get_opt(node)
            .await
            .map_err(|e| map_err(&format!("get node {node}"), e))?;
        match how {
            Release::Taint => {
                let Some(n) = current else {
                    return Err(KubeError::Refused(format!(
                        "node {node} does not exist; nothing to taint"
                    )));
                };
                Self::check_proof(node, internal_ip(&n).as_deref(), proof)?;
                if !has_oos_taint(&n)
                    && let Some(why) = self.kubelet_alive(node, Some(&n), proof).await?
                {
                    return self.hold(node, how, proof, why).await;
                }
                if !has_oos_taint(&n) {
                    let mut taints = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.clone())
                        .unwrap_or_default();
                    taints.push(Taint {
                        key: OUT_OF_SERVICE_KEY.into(),
                        value: Some(OUT_OF_SERVICE_VALUE.into()),
                        effect: OUT_OF_SERVICE_EFFECT.into(),
                        time_added: None,
                    });
                    // Taints are replaced as a whole list; the resourceVersion keeps a
                    // concurrent taint change (by the node lifecycle controller) from being lost.
                    let patch = serde_json::json!({
                        "metadata": {"resourceVersion": n.metadata.resource_version},
                        "spec": {"taints": taints},
                    });
                    match api
                        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {
                            self.record(
                                &n,
                                NodeEvent::Released,
                                &format!("out-of-service taint added: {}", proof.describe()),
                            )
                            .await;
                        }
                        Err(e) if is_conflict(&e) => {
                            return Ok(ReleaseProgress::Waiting {
                                pods: 0,
                                volume_attachments: 0,
                                held: None,
                            });
                        }
                        Err(e) => return Err(map_err(&format!("taint node {node}"), e)),
                    }
                }
            }
            Release::DeleteNode(saved) => {
                Self::check_proof(node, saved.internal_ip.as_deref(), proof)?;
                if let Some(n) = current {
                    Self::check_proof(node, internal_ip(&n).as_deref(), proof)?;
                    if let Some(why) = self.kubelet_alive(node, Some(&n), proof).await? {
                        return self.hold(node, how, proof, why).await;
                    }
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: n.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(node, &dp).await {
                        Ok(_) => {
                            self.record(
                                &n,
                                NodeEvent::Released,
                                &format!(
                                    "Node deleted after saving {} labels and {} annotations: {}",
                                    saved.labels.len(),
                                    saved.annotations.len(),
                                    proof.describe()
                                ),
                            )
                            .await;
                        }
                        Err(e) if is_not_found(&e) || is_conflict(&e) => {}
                        Err(e) => return Err(map_err(&format!("delete node {node}"), e)),
                    }
                }
            }
        }
        self.release_wait(node, how, proof).await
    }

    /// Whether `node`'s kubelet looks alive, as the configured second signal reads it:
    /// `Some(why)` holds the release. With `lease-and-ready`, a Node (`current`) whose Ready
    /// is True; with `lease`, a Lease renewed within `lease_stale` by its stamp or as this
    /// coordinator saw it ([`super::lease`]), whatever Ready says.
    async fn kubelet_alive(
        &self,
        node: &str,
        current: Option<&Node>,
        proof: &DownProof,
    ) -> Result<Option<String>, KubeError> {
        if self.second_signal == SecondSignal::LeaseAndReady {
            return Ok(current.filter(|n| is_ready(n)).map(|_| {
                format!(
                    "the Node still reports Ready though its machine was confirmed off ({}); \
                     waiting for the node lifecycle controller (if its kubelet keeps renewing, \
                     the machine confirmed off is not this node: check the BMC mapping)",
                    proof.describe()
                )
            }));
        }
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        // A list by name, not a get: the coordinator's role may list Leases, not get them.
        let renew = leases
            .list(&ListParams::default().fields(&format!("metadata.name={node}")))
            .await
            .map_err(|e| map_err(&format!("read the kubelet Lease of {node}"), e))?
            .items
            .into_iter()
            .next()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0);
        let now = self.clock.now();
        let since = {
            let mut seen = self.lease_seen.lock().expect("lease memory poisoned");
            let mine = seen.get(node).copied();
            let view = self
                .view
                .get(node)
                .and_then(|s| Some((s.lease_renew_time, s.lease_seen_since?)));
            let since = [mine, view]
                .into_iter()
                .map(|earlier| seen_since(renew, earlier, now))
                .min()
                .unwrap_or(now);
            seen.insert(node.to_string(), (renew, since));
            since
        };
        let age = lease_age(now, renew, Some(since));
        if is_stale(age, self.lease_stale) {
            return Ok(None);
        }
        let age = age.unwrap_or_default();
        Ok(Some(format!(
            "the kubelet Lease of {node} was renewed {}s ago (renewTime {}), though its machine \
             was confirmed off ({}); a kubelet that renews runs, so the machine confirmed off \
             may not be this node (check the BMC mapping); held until the Lease has gone \
             unrenewed for lease_stale {}s",
            age.as_secs(),
            renew.map_or("none".to_string(), |t| format!("{t:.0}")),
            proof.describe(),
            self.lease_stale.as_secs_f64()
        )))
    }

    /// A release held because the node's kubelet looks alive: what is left, unreleased.
    async fn hold(
        &self,
        node: &str,
        how: &Release,
        proof: &DownProof,
        why: String,
    ) -> Result<ReleaseProgress, KubeError> {
        tracing::warn!(node, "not releasing: {why}");
        Ok(match self.release_wait(node, how, proof).await? {
            ReleaseProgress::Done => ReleaseProgress::Waiting {
                pods: 0,
                volume_attachments: 0,
                held: Some(why),
            },
            ReleaseProgress::Waiting {
                pods,
                volume_attachments,
                ..
            } => ReleaseProgress::Waiting {
                pods,
                volume_attachments,
                held: Some(why),
            },
        })
    }

    /// Waits for the node's pods and VolumeAttachments to go, force-deleting them itself
    /// under the proof, as the pod GC would but without its wait (see
    /// [`super::release_wait`]), unless the node's kubelet looks alive.
    async fn release_wait(
        &self,
        node: &str,
        how: &Release,
        proof: &DownProof,
    ) -> Result<ReleaseProgress, KubeError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let current = nodes
            .get_opt(node)
            .await
            .map_err(|e| map_err(&format!("get node {node}"), e))?;
        let pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|e| map_err(&format!("list pods on {node}"), e))?
            .items;
        let alive = self.kubelet_alive(node, current.as_ref(), proof).await?;
        let wait = release_wait(
            current.as_ref(),
            &on_node,
            matches!(how, Release::Taint),
            alive.is_some(),
        );
        let mut gone = 0;
        for p in &wait.force_delete {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.namespace);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: p.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&p.name, &dp).await {
                Ok(_) => gone += 1,
                // Gone already, or a new pod under the name: not ours to delete.
                Err(e) if is_not_found(&e) || is_conflict(&e) => gone += 1,
                Err(e) => {
                    return Err(map_err(
                        &format!(
                            "force-delete pod {}/{} of released node {node}",
                            p.namespace, p.name
                        ),
                        e,
                    ));
                }
            }
        }
        if gone > 0 {
            tracing::info!(
                node,
                pods = gone,
                "force-deleted the released node's terminating pods (grace 0), as the pod GC would"
            );
        }
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let attachments = vas
            .list(&ListParams::default())
            .await
            .map_err(|e| map_err("list volume attachments", e))?
            .items
            .iter()
            .filter(|va| va.spec.node_name == node)
            .count();
        let pods_left = wait.pods_left - gone;
        Ok(if pods_left == 0 && attachments == 0 {
            ReleaseProgress::Done
        } else {
            ReleaseProgress::Waiting {
                pods: pods_left,
                volume_attachments: attachments,
                held: alive,
            }
        })
    }

    /// One pass of restoring `node` after its machine is back; call until
    /// [`RestoreProgress::Done`].
    pub async fn restore(
        &self,
        node: &str,
        proof: &DownProof,
        how: &Release,
    ) -> Result<RestoreProgress, KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let Some(n) = api
            .get_opt(node)
            .await
            .map_err(|e| map_err(&format!("get node {node}"), e))?
        else {
            return Ok(RestoreProgress::WaitingForNode);
        };
        Self::check_proof(node, internal_ip(&n).as_deref(), proof)?;
        let (patch, message) = match how {
            Release::Taint => {
                if !has_oos_taint(&n) {
                    return Ok(RestoreProgress::Done);
                }
                let taints: Vec<Taint> = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|t| t.key != OUT_OF_SERVICE_KEY)
                    .collect();
                (
                    serde_json::json!({
                        "metadata": {"resourceVersion": n.metadata.resource_version},
                        "spec": {"taints": taints},
                    }),
                    "out-of-service taint removed".to_string(),
                )
            }
            Release::DeleteNode(saved) => {
                let labels = n.metadata.labels.clone().unwrap_or_default();
                let annotations = n.metadata.annotations.clone().unwrap_or_default();
                let missing_l: BTreeMap<&String, &String> = saved
                    .labels
                    .iter()
                    .filter(|(k, v)| labels.get(*k) != Some(*v))
                    .collect();
                let missing_a: BTreeMap<&String, &String> = saved
                    .annotations
                    .iter()
                    .filter(|(k, v)| annotations.get(*k) != Some(*v))
                    .collect();
                if missing_l.is_empty() && missing_a.is_empty() {
                    return Ok(RestoreProgress::Done);
                }
                (
                    serde_json::json!({
                        "metadata": {
                            "resourceVersion": n.metadata.resource_version,
                            "labels": missing_l,
                            "annotations": missing_a,
                        }
                    }),
                    format!(
                        "restored {} labels and {} annotations saved before the Node was deleted",
                        missing_l.len(),
                        missing_a.len()
                    ),
                )
            }
        };
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.record(&n, NodeEvent::Restored, &message).await;
                Ok(RestoreProgress::Done)
            }
            // Changed under us (the kubelet updates its Node often): next pass.
            Err(e) if is_conflict(&e) => Ok(RestoreProgress::WaitingForNode),
            Err(e) => Err(map_err(&format!("restore node {node}"), e)),
        }
    }
}

impl NodeRelease for KubeDrainer {
    fn save_node_metadata<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<SavedNodeMetadata, KubeError>> {
        Box::pin(KubeDrainer::save_node_metadata(self, node))
    }

    fn release_plan<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Release, KubeError>> {
        Box::pin(KubeDrainer::release_plan(self, node))
    }

    fn release<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<ReleaseProgress, KubeError>> {
        Box::pin(KubeDrainer::release(self, node, proof, how))
    }

    fn restore<'a>(
        &'a self,
        node: &'a str,
        proof: &'a DownProof,
        how: &'a Release,
    ) -> BoxFuture<'a, Result<RestoreProgress, KubeError>> {
        Box::pin(KubeDrainer::restore(self, node, proof, how))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions_as_servers_report_them() {
        assert_eq!(parse_minor("33"), Some(33));
        assert_eq!(parse_minor("27+"), Some(27));
        assert_eq!(parse_minor(""), None);
    }
}
