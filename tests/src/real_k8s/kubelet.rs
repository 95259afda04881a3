//! Stand-ins for what runs outside the control plane, playing through the real API what a
//! kubelet and a CSI driver's external-attacher do there. Only these are played; the
//! controllers that react to them are the real ones ([`super::RealK8s`]).
//!
//! [`Kubelets`]: each registered node's kubelet, while it is alive, renews its Lease in
//! `kube-node-lease` every `renew`, reports Ready True whenever the Node says otherwise (a
//! kubelet back after the node lifecycle controller set Unknown), turns its pods Running and
//! Ready, and ends a pod's graceful termination when its grace period is over, as a kubelet
//! does after its containers stopped (the pod object is deleted with grace 0). A dead
//! kubelet does nothing at all, like a machine that is off.
//!
//! [`CsiAttacher`]: the external-attacher of one CSI driver: a VolumeAttachment the
//! attach-detach controller creates gets the attacher's finalizer and `status.attached`;
//! one being deleted loses the finalizer (the volume is detached), so it goes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// `now` as Kubernetes' MicroTime.
pub fn micro_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// `now` as Kubernetes' Time (seconds).
pub fn time_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The played kubelets of a test cluster. Dropping it stops them all.
pub struct Kubelets {
    client: kube::Client,
    alive: Arc<Mutex<BTreeMap<String, bool>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelets {
    /// Starts the kubelets' loop: each alive one acts every `renew` (a real kubelet renews
    /// its Lease every 10 s; tests go faster).
    pub fn start(client: kube::Client, renew: Duration) -> Self {
        let alive: Arc<Mutex<BTreeMap<String, bool>>> = Arc::default();
        let task = tokio::spawn(run(client.clone(), alive.clone(), renew));
        Self {
            client,
            alive,
            task,
        }
    }

    /// Registers a node as its kubelet does: the Node (InternalIP `ip`, controller-managed
    /// attach and detach), its Ready status and its Lease. The kubelet is alive from then on.
    pub async fn register(&self, name: &str, ip: &str) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
            },
            "spec": {}
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("register Node {name}"))?;
        let now = time_now();
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {
                    "addresses": [
                        {"type": "InternalIP", "address": ip},
                        {"type": "Hostname", "address": name}
                    ],
                    "conditions": [{
                        "type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status (played by the test kit)",
                        "lastHeartbeatTime": now, "lastTransitionTime": now
                    }],
                    "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                    "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}
                }})),
            )
            .await
            .with_context(|| format!("report Node {name} Ready"))?;
        renew_lease(&self.client, name).await?;
        self.alive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), true);
        Ok(())
    }

    /// A kubelet that dies stops acting at once (its machine is off); one that comes back
    /// renews and reports Ready again.
    pub fn set_alive(&self, name: &str, alive: bool) {
        self.alive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), alive);
    }
}

async fn renew_lease(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = micro_now();
    let patch =
        json!({"spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}});
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
            }))?;
            leases.create(&PostParams::default(), &lease).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

async fn run(client: kube::Client, alive: Arc<Mutex<BTreeMap<String, bool>>>, renew: Duration) {
    loop {
        let live: Vec<String> = alive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, a)| **a)
            .map(|(n, _)| n.clone())
            .collect();
        for node in &live {
            // A failure (API server restarting, a Node deleted by a release) is retried on
            // the next tick, as a kubelet does.
            if let Err(e) = tick(&client, node).await {
                tracing::debug!(%node, error = %format!("{e:#}"), "played kubelet tick failed");
            }
        }
        tokio::time::sleep(renew).await;
    }
}

async fn tick(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    renew_lease(client, node).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(n) = nodes.get_opt(node).await? {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        if ready.as_deref() != Some("True") {
            let now = time_now();
            nodes
                .patch_status(
                    node,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"status": {"conditions": [{
                        "type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status (played by the test kit)",
                        "lastHeartbeatTime": now, "lastTransitionTime": now
                    }]}})),
                )
                .await?;
        }
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let mine = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let now = jiff::Timestamp::now();
    for p in mine.items {
        let (Some(ns), Some(name)) = (p.metadata.namespace.clone(), p.metadata.name.clone()) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if let Some(deadline) = &p.metadata.deletion_timestamp {
            // The containers took their whole grace period to stop; the kubelet then
            // removes the pod object.
            if deadline.0 <= now {
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(kube::api::Preconditions {
                        uid: p.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let _ = api.delete(&name, &dp).await;
            }
            continue;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        if phase.as_deref() != Some("Running") {
            let t = time_now();
            let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {
                    "phase": "Running",
                    "startTime": t,
                    "conditions": [cond("PodScheduled"), cond("Initialized"),
                                   cond("ContainersReady"), cond("Ready")]
                }})),
            )
            .await?;
        }
    }
    Ok(())
}

/// A CSI driver's external-attacher, played. Dropping it stops it.
pub struct CsiAttacher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CsiAttacher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CsiAttacher {
    /// Starts attaching and detaching `driver`'s VolumeAttachments; creates its CSIDriver
    /// object (attach required).
    pub async fn start(client: kube::Client, driver: &str) -> anyhow::Result<Self> {
        let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(client.clone());
        let obj = serde_json::from_value(json!({
            "metadata": {"name": driver},
            "spec": {"attachRequired": true, "podInfoOnMount": false}
        }))?;
        drivers
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("create CSIDriver {driver}"))?;
        let finalizer = format!("external-attacher/{}", driver.replace('/', "-"));
        let driver = driver.to_string();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = attach_pass(&client, &driver, &finalizer).await {
                    tracing::debug!(error = %format!("{e:#}"), "played external-attacher pass failed");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(Self { task })
    }
}

async fn attach_pass(client: &kube::Client, driver: &str, finalizer: &str) -> anyhow::Result<()> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for va in vas.list(&ListParams::default()).await?.items {
        if va.spec.attacher != driver {
            continue;
        }
        let Some(name) = va.metadata.name.clone() else {
            continue;
        };
        let finalizers = va.metadata.finalizers.clone().unwrap_or_default();
        if va.metadata.deletion_timestamp.is_some() {
            if finalizers.iter().any(|f| f == finalizer) {
                let kept: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
                vas.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {
                        "finalizers": kept,
                        "resourceVersion": va.metadata.resource_version
                    }})),
                )
                .await?;
            }
            continue;
        }
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        if !attached {
            if !finalizers.iter().any(|f| f == finalizer) {
                let mut with = finalizers.clone();
                with.push(finalizer.to_string());
                vas.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {
                        "finalizers": with,
                        "resourceVersion": va.metadata.resource_version
                    }})),
                )
                .await?;
            }
            vas.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"attached": true}})),
            )
            .await?;
        }
    }
    Ok(())
}
