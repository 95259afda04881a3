//! Workload objects for the real control plane's scenarios, created through the API as a
//! user and the controllers that are not run here would leave them: a StatefulSet's pod
//! bound to a node with its PersistentVolumeClaim bound to a CSI PersistentVolume (the
//! StatefulSet controller, the scheduler and the PV binder do not run: the objects are made
//! as they would have made them), plain pods, PodDisruptionBudgets, namespaces.

use anyhow::Context;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Creates namespace `name`.
pub async fn namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}}))?,
    )
    .await
    .with_context(|| format!("create namespace {name}"))?;
    Ok(())
}

/// A pod to create on a node.
#[derive(Debug, Clone)]
pub struct PodSpec {
    obj: Value,
}

impl PodSpec {
    /// Pod `namespace/name` bound to `node`, labelled `app=<name>`, whose containers take
    /// `grace_seconds` to stop.
    pub fn new(namespace: &str, name: &str, node: &str, grace_seconds: i64) -> Self {
        Self {
            obj: json!({
                "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": grace_seconds,
                    "containers": [{"name": "main", "image": "registry.invalid/app:1"}]
                }
            }),
        }
    }

    /// Sets label `k=v`.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.obj["metadata"]["labels"][k] = json!(v);
        self
    }

    /// The mirror of a static pod (annotation `kubernetes.io/config.mirror`, which the API
    /// server accepts only at creation).
    pub fn mirror(mut self) -> Self {
        self.obj["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("mirror");
        self
    }

    /// Owned (as controller) by `kind` `name` with `uid`, of `api_version`.
    pub fn owner(mut self, api_version: &str, kind: &str, name: &str, uid: &str) -> Self {
        self.obj["metadata"]["ownerReferences"] = json!([{
            "apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true
        }]);
        self
    }

    /// Mounts PersistentVolumeClaim `claim` at `/data`.
    pub fn claim(mut self, claim: &str) -> Self {
        self.obj["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        self.obj["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "data", "mountPath": "/data"}]);
        self
    }

    /// Creates it.
    pub async fn create(self, client: &kube::Client) -> anyhow::Result<Pod> {
        let ns = self.obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let pod: Pod = serde_json::from_value(self.obj)?;
        api.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("create pod {ns}/{:?}", pod.metadata.name))
    }
}

/// A StatefulSet `name` of one replica whose pod `<name>-0` runs on `node` with its volume
/// claim `data-<name>-0` bound to a PersistentVolume of CSI driver `driver`. The
/// attach-detach controller then attaches the volume through a VolumeAttachment. Returns
/// the pod.
pub async fn stateful_pod_with_volume(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    driver: &str,
    grace_seconds: i64,
) -> anyhow::Result<Pod> {
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1"}]}
            }
        }
    }))?;
    let sts = sts_api
        .create(&PostParams::default(), &sts)
        .await
        .with_context(|| format!("create StatefulSet {namespace}/{name}"))?;
    let uid = sts.metadata.uid.clone().unwrap_or_default();
    let claim = format!("data-{name}-0");
    let pv_name = format!("pv-{namespace}-{name}-0");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}}
        }
    }))?;
    let pvc = pvcs
        .create(&PostParams::default(), &pvc)
        .await
        .with_context(|| format!("create claim {namespace}/{claim}"))?;
    let claim_uid = pvc.metadata.uid.clone().unwrap_or_default();
    pvcs.patch_status(
        &claim,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Bound",
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"}
        }})),
    )
    .await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": claim, "uid": claim_uid},
            "csi": {"driver": driver, "volumeHandle": format!("vol-{namespace}-{name}-0")}
        }
    }))?;
    pvs.create(&PostParams::default(), &pv)
        .await
        .with_context(|| format!("create PersistentVolume {pv_name}"))?;
    pvs.patch_status(
        &pv_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await?;
    PodSpec::new(namespace, &format!("{name}-0"), node, grace_seconds)
        .label("app", name)
        .owner("apps/v1", "StatefulSet", name, &uid)
        .claim(&claim)
        .create(client)
        .await
}

/// A policy/v1 PodDisruptionBudget over pods labelled `app=<app>` with `minAvailable`.
pub async fn pdb(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    app: &str,
    min_available: i32,
) -> anyhow::Result<PodDisruptionBudget> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let obj: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}
    }))?;
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("create PodDisruptionBudget {namespace}/{name}"))
}
