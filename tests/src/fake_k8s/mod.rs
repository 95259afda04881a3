//! A fake Kubernetes API server: a real HTTP server on loopback speaking the Kubernetes JSON
//! API, written from the API documentation, for testing the coordinator's drain, release,
//! restore, node view and Events without a cluster.
//!
//! Served: Nodes, Pods, Namespaces, core/v1 Events, policy/v1 PodDisruptionBudgets,
//! storage.k8s.io/v1 VolumeAttachments and coordination.k8s.io/v1 Leases, with get, list
//! (`labelSelector`, `fieldSelector` with each resource's supported field labels),
//! create, replace, patch (JSON merge, strategic merge, JSON patch), delete (with grace
//! periods and UID/resourceVersion preconditions), optimistic concurrency on
//! `resourceVersion`, the `status` subresource, the Pod `eviction` subresource with
//! PodDisruptionBudget semantics (`disruptionsAllowed`, an empty selector matches every pod in
//! the namespace, two matching budgets → 500, 429 with the DisruptionBudget cause, 404 for a
//! gone pod, UID preconditions → 409), and `/version`. Requests a real server would reject are
//! rejected with a `Status` body: unknown resources (404), bad JSON (400), wrong media types
//! (415), invalid objects (422), wrong apiVersion/kind (400).
//!
//! Simulated control plane, as the real controllers behave (compared side by side in
//! `tests/tests/real_k8s_compare.rs`) but faster: pods take a configurable time to
//! terminate (deletionTimestamp set, then gone) while their node is Ready, and stay
//! terminating on a node that is not (no kubelet ends them); the out-of-service taint makes
//! a node's pods terminating (taint eviction); the pod GC force-deletes terminating pods of
//! an out-of-service node only once it is not Ready, and the pods of a deleted Node; a
//! VolumeAttachment of a released node goes after its pods (attach-detach controller).
//! Each of these acts after [`FakeK8s::set_gc_delay`] (50 ms by default; the real pod GC
//! looks every 20 s, and waits 40 s for a deleted Node's pods). PodDisruptionBudget status
//! is set by the test ([`FakeK8s::set_disruptions_allowed`]) in place of the disruption
//! controller.
//!
//! Fault injection: per-path/method error answers ([`Fault`]), added latency, and the whole
//! server going down ([`FakeK8s::set_down`]: connections are cut and refused).
//!
//! Watch (`?watch=true` on a collection, with `resourceVersion`, `timeoutSeconds` and the
//! selectors) streams `ADDED`/`MODIFIED`/`DELETED` events as newline-delimited JSON, as the
//! real server does, for every served resource (Leases included).
//!
//! Not implemented: bookmarks and `sendInitialEvents`, server-side apply (415),
//! deletecollection (405), authentication (the kubeconfig carries no credentials).

mod api;
mod net;
mod patch;
mod route;
mod select;
mod store;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use store::{Res, State};

/// An injected failure: requests whose path contains `path_contains` (all paths when
/// `None`) and whose method is `method` (all when `None`) are answered with `status` and a
/// `Status` body carrying `message`, `times` times (forever when `None`).
#[derive(Debug, Clone, Default)]
pub struct Fault {
    /// Substring of the request path.
    pub path_contains: Option<String>,
    /// HTTP method (`GET`, `POST`, …).
    pub method: Option<String>,
    /// HTTP status to answer.
    pub status: u16,
    /// The Status message.
    pub message: String,
    /// How many requests to fail.
    pub times: Option<u32>,
}

/// A request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// When it was received (wall clock, to order it against other processes' logs).
    pub at: std::time::SystemTime,
}

/// State shared by the HTTP handlers and the test API.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Mutex<Vec<Fault>>,
    pub(crate) latency: Mutex<Duration>,
    pub(crate) log: Mutex<Vec<Recorded>>,
    switch: Arc<net::Switch>,
    /// Nodes whose simulated kubelet renews its Lease (see [`FakeK8s::run_kubelets`]).
    kubelets: Mutex<std::collections::BTreeSet<String>>,
    kubelets_running: std::sync::atomic::AtomicBool,
}

/// A running fake API server. Dropping it stops the server.
pub struct FakeK8s {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeK8s {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeK8s").field("addr", &self.addr).finish()
    }
}

impl Drop for FakeK8s {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn set_ready(st: &mut State, node: &str, status: &str) -> bool {
    let Some(mut obj) = st.get(Res::Node, "", node).cloned() else {
        return false;
    };
    let Some(conds) = obj["status"]["conditions"].as_array_mut() else {
        return false;
    };
    let Some(ready) = conds.iter_mut().find(|c| c["type"] == "Ready") else {
        return false;
    };
    if ready["status"] == json!(status) {
        return true;
    }
    ready["status"] = json!(status);
    ready["reason"] = json!(if status == "True" {
        "KubeletReady"
    } else {
        "NodeStatusUnknown"
    });
    ready["lastTransitionTime"] = json!(store::now_rfc3339());
    st.insert_new(Res::Node, obj);
    true
}

/// A [`FakeK8s`] running on its own runtime (see [`FakeK8s::start_background`]).
pub struct BackgroundFake {
    fake: Option<FakeK8s>,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::ops::Deref for BackgroundFake {
    type Target = FakeK8s;
    fn deref(&self) -> &FakeK8s {
        self.fake.as_ref().expect("fake present until drop")
    }
}

impl Drop for BackgroundFake {
    fn drop(&mut self) {
        drop(self.fake.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A Node to seed.
#[derive(Debug, Clone)]
pub struct NodeSeed {
    obj: Value,
}

impl NodeSeed {
    /// A Ready node named `name` with InternalIP `ip`.
    pub fn new(name: &str, ip: &str) -> Self {
        Self {
            obj: json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {},
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": ip},
                        {"type": "Hostname", "address": name}
                    ],
                    "conditions": [{
                        "type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": store::now_rfc3339(),
                        "lastTransitionTime": store::now_rfc3339()
                    }]
                }
            }),
        }
    }

    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.obj["metadata"]["labels"][k] = json!(v);
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.obj["metadata"]["annotations"][k] = json!(v);
        self
    }

    /// Marks the node unschedulable (an admin's cordon: no Fleetmend annotation).
    pub fn cordoned(mut self) -> Self {
        self.obj["spec"]["unschedulable"] = json!(true);
        self
    }

    /// Sets the Ready condition's status (`True`, `False`, `Unknown`).
    pub fn ready(mut self, status: &str) -> Self {
        self.obj["status"]["conditions"][0]["status"] = json!(status);
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        let t = json!({"key": key, "value": value, "effect": effect});
        match self.obj["spec"]["taints"].as_array_mut() {
            Some(a) => a.push(t),
            None => self.obj["spec"]["taints"] = json!([t]),
        }
        self
    }
}

/// A Pod to seed.
#[derive(Debug, Clone)]
pub struct PodSeed {
    obj: Value,
    terminate_after: Option<Duration>,
}

impl PodSeed {
    /// A Running pod `namespace/name` on `node`, with no owner.
    pub fn new(namespace: &str, name: &str, node: &str) -> Self {
        Self {
            obj: json!({
                "metadata": {"name": name, "namespace": namespace, "labels": {}},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "registry.invalid/app:1"}],
                    "terminationGracePeriodSeconds": 30
                },
                "status": {"phase": "Running"}
            }),
            terminate_after: None,
        }
    }

    /// Sets the controlling owner (`ReplicaSet`, `DaemonSet`, `Job`, `StatefulSet`, …).
    pub fn owner(mut self, kind: &str, name: &str) -> Self {
        let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
        self.obj["metadata"]["ownerReferences"] = json!([{
            "apiVersion": api_version, "kind": kind, "name": name,
            "uid": format!("owner-{kind}-{name}").to_lowercase(),
            "controller": true, "blockOwnerDeletion": true
        }]);
        self
    }

    /// Makes it a mirror pod (the kubelet's API copy of a static pod).
    pub fn mirror(mut self) -> Self {
        self.obj["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("hash");
        self.obj["metadata"]["annotations"]["kubernetes.io/config.source"] = json!("file");
        self
    }

    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.obj["metadata"]["labels"][k] = json!(v);
        self
    }

    /// Sets `status.phase`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.obj["status"]["phase"] = json!(phase);
        self
    }

    /// After a graceful delete, the pod stays (terminating) this long before it is gone.
    pub fn terminate_after(mut self, d: Duration) -> Self {
        self.terminate_after = Some(d);
        self
    }
}

impl FakeK8s {
    /// Starts the server on an ephemeral loopback port and writes a kubeconfig for it.
    pub async fn start() -> anyhow::Result<Self> {
        let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = inner.local_addr()?;
        let switch = Arc::new(net::Switch::default());
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            faults: Mutex::new(Vec::new()),
            latency: Mutex::new(Duration::ZERO),
            log: Mutex::new(Vec::new()),
            switch: switch.clone(),
            kubelets: Mutex::new(Default::default()),
            kubelets_running: Default::default(),
        });
        let listener = net::CutListener { inner, switch };
        let app = api::router(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
                 current-context: fake\n"
            ),
        )?;
        Ok(Self {
            shared,
            addr,
            _dir: dir,
            kubeconfig,
            task,
        })
    }

    /// Starts the server on its own runtime thread, for synchronous tests that drive real
    /// processes (the returned value derefs to [`FakeK8s`]).
    pub fn start_background() -> anyhow::Result<BackgroundFake> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-k8s")
            .enable_all()
            .build()?;
        let fake = rt.block_on(Self::start())?;
        Ok(BackgroundFake {
            fake: Some(fake),
            rt: Some(rt),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file pointing at this server (no credentials).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.shared.state.lock().expect("fake state poisoned");
        s.sweep();
        s
    }

    // ---- seeding ------------------------------------------------------------------------

    /// Adds (or replaces) a Node.
    pub fn add_node(&self, node: NodeSeed) -> Value {
        self.state().insert_new(Res::Node, node.obj)
    }

    /// Adds (or replaces) a Pod; the namespace is created if missing.
    pub fn add_pod(&self, pod: PodSeed) -> Value {
        let mut s = self.state();
        let ns = pod.obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        if s.get(Res::Namespace, "", &ns).is_none() {
            s.insert_new(
                Res::Namespace,
                json!({"metadata": {"name": ns}, "status": {"phase": "Active"}}),
            );
        }
        let name = pod.obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match pod.terminate_after {
            Some(d) => s.termination.insert((ns, name), d),
            None => s.termination.remove(&(ns, name)),
        };
        s.insert_new(Res::Pod, pod.obj)
    }

    /// Adds (or relabels) a Namespace.
    pub fn add_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Value {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.state().insert_new(
            Res::Namespace,
            json!({"metadata": {"name": name, "labels": labels}, "status": {"phase": "Active"}}),
        )
    }

    /// Adds a policy/v1 PodDisruptionBudget. `selector` is a LabelSelector object (`{}`
    /// matches every pod in the namespace); `disruptions_allowed` is its status.
    pub fn add_pdb(
        &self,
        namespace: &str,
        name: &str,
        selector: Value,
        disruptions_allowed: i64,
    ) -> Value {
        self.state().insert_new(
            Res::Pdb,
            json!({
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"selector": selector, "minAvailable": 1},
                "status": {
                    "disruptionsAllowed": disruptions_allowed,
                    "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1,
                    "observedGeneration": 1
                }
            }),
        )
    }

    /// Plays the disruption controller: sets a budget's `status.disruptionsAllowed`.
    pub fn set_disruptions_allowed(&self, namespace: &str, name: &str, n: i64) {
        let mut s = self.state();
        let rv = s.next_rv();
        if let Some(b) = s
            .objects
            .get_mut(&(Res::Pdb, namespace.to_string(), name.to_string()))
        {
            b["status"]["disruptionsAllowed"] = json!(n);
            b["status"]["currentHealthy"] = json!(1 + n);
            b["metadata"]["resourceVersion"] = json!(rv);
        }
    }

    /// Adds a VolumeAttachment of a CSI volume to `node`.
    pub fn add_volume_attachment(&self, name: &str, node: &str) -> Value {
        self.state().insert_new(
            Res::VolumeAttachment,
            json!({
                "metadata": {"name": name},
                "spec": {"attacher": "csi.fake.invalid", "nodeName": node,
                         "source": {"persistentVolumeName": format!("pv-{name}")}},
                "status": {"attached": true}
            }),
        )
    }

    /// Adds or renews the kubelet Lease of `node`, with `renew_time` as RFC 3339.
    pub fn set_lease(&self, node: &str, renew_time: &str) -> Value {
        self.state().insert_new(
            Res::Lease,
            json!({
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                         "renewTime": renew_time}
            }),
        )
    }

    /// Renews the kubelet Lease of `node` now.
    pub fn renew_lease(&self, node: &str) -> Value {
        self.set_lease(node, &store::now_rfc3339_micros())
    }

    /// Sets the Node's Ready condition (`True`, `False`, `Unknown`), with a new
    /// `lastTransitionTime` when the status changes, as the kubelet and the node lifecycle
    /// controller do. Returns false when there is no such Node.
    pub fn set_ready(&self, node: &str, status: &str) -> bool {
        set_ready(&mut self.state(), node, status)
    }

    /// Simulates the kubelets of the nodes marked alive ([`FakeK8s::set_kubelet_alive`]) and
    /// the node lifecycle controller, on a thread of its own until the server is dropped:
    /// every `renew` each live kubelet renews its Lease and reports Ready True; a Node whose
    /// Lease is older than `monitor_grace` turns Ready Unknown (Kubernetes' defaults are 10 s
    /// and 40 s; tests pass shorter ones). Starting it twice keeps the first.
    pub fn run_kubelets(&self, renew: Duration, monitor_grace: Duration) {
        use std::sync::atomic::Ordering;
        if self.shared.kubelets_running.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        std::thread::spawn(move || {
            // Last renewal per node; a node first seen starts its grace now.
            let mut renewed: std::collections::BTreeMap<String, std::time::Instant> =
                Default::default();
            while let Some(shared) = weak.upgrade() {
                let alive = shared.kubelets.lock().expect("kubelets").clone();
                {
                    let mut st = shared.state.lock().expect("fake state poisoned");
                    let now = store::now_rfc3339_micros();
                    let names: Vec<String> = st
                        .list(Res::Node, None)
                        .iter()
                        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                        .collect();
                    for name in names {
                        if alive.contains(&name) {
                            st.insert_new(
                                Res::Lease,
                                json!({
                                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                             "renewTime": now}
                                }),
                            );
                            set_ready(&mut st, &name, "True");
                            renewed.insert(name, std::time::Instant::now());
                        } else if renewed
                            .entry(name.clone())
                            .or_insert_with(std::time::Instant::now)
                            .elapsed()
                            > monitor_grace
                        {
                            set_ready(&mut st, &name, "Unknown");
                        }
                    }
                }
                drop(shared);
                std::thread::sleep(renew);
            }
        });
    }

    /// Marks the simulated kubelet of `node` alive (renewing) or dead (silent).
    /// A dead kubelet also ends no graceful termination of its pods, even while its Node
    /// still reports Ready.
    pub fn set_kubelet_alive(&self, node: &str, alive: bool) {
        let mut k = self.shared.kubelets.lock().expect("kubelets");
        let mut st = self.state();
        if alive {
            k.insert(node.to_string());
            st.dead_kubelets.remove(node);
        } else {
            k.remove(node);
            st.dead_kubelets.insert(node.to_string());
        }
    }

    /// Sets what `/version` reports (e.g. `("1", "27")` for a cluster without the
    /// out-of-service taint).
    pub fn set_version(&self, major: &str, minor: &str) {
        self.state().version = (major.into(), minor.into());
    }

    /// How long the simulated pod GC and attach-detach controller wait before acting.
    pub fn set_gc_delay(&self, d: Duration) {
        self.state().gc_delay = d;
    }

    // ---- inspection ---------------------------------------------------------------------

    /// Removes a Pod at once (as its controller or a person would).
    pub fn remove_pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state().remove(Res::Pod, namespace, name)
    }

    /// A Node as stored.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.state().get(Res::Node, "", name).cloned()
    }

    /// A Pod as stored.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state().get(Res::Pod, namespace, name).cloned()
    }

    /// Pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<Value> {
        self.state()
            .list(Res::Pod, None)
            .into_iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .cloned()
            .collect()
    }

    /// A PodDisruptionBudget as stored.
    pub fn pdb(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state().get(Res::Pdb, namespace, name).cloned()
    }

    /// VolumeAttachments naming `node`.
    pub fn volume_attachments_on(&self, node: &str) -> Vec<Value> {
        self.state()
            .list(Res::VolumeAttachment, None)
            .into_iter()
            .filter(|v| v["spec"]["nodeName"] == node)
            .cloned()
            .collect()
    }

    /// Events whose involvedObject is the Node `node`, oldest first.
    pub fn node_events(&self, node: &str) -> Vec<Value> {
        self.state()
            .list(Res::Event, None)
            .into_iter()
            .filter(|e| {
                e["involvedObject"]["kind"] == "Node" && e["involvedObject"]["name"] == node
            })
            .cloned()
            .collect()
    }

    /// The `reason`s of [`FakeK8s::node_events`].
    pub fn node_event_reasons(&self, node: &str) -> Vec<String> {
        self.node_events(node)
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.log.lock().expect("log poisoned").clone()
    }

    // ---- faults -------------------------------------------------------------------------

    /// Adds an injected failure.
    pub fn inject(&self, fault: Fault) {
        self.shared
            .faults
            .lock()
            .expect("faults poisoned")
            .push(fault);
    }

    /// Removes every injected failure.
    pub fn clear_faults(&self) {
        self.shared.faults.lock().expect("faults poisoned").clear();
    }

    /// Delays every answer by `d`.
    pub fn set_latency(&self, d: Duration) {
        *self.shared.latency.lock().expect("latency poisoned") = d;
    }

    /// Takes the whole server down (open connections reset, new ones dropped) or back up.
    pub fn set_down(&self, down: bool) {
        self.shared.switch.set_down(down);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One HTTP/1.1 request over a fresh connection; (status, JSON body or Null).
    async fn raw(
        fake: &FakeK8s,
        method: &str,
        path: &str,
        ct: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fut = async {
            let mut s = tokio::net::TcpStream::connect(fake.addr).await?;
            let mut req = format!(
                "{method} {path} HTTP/1.1\r\nHost: fake\r\nConnection: close\r\nContent-Length: {}\r\n",
                body.len()
            );
            if let Some(ct) = ct {
                req.push_str(&format!("Content-Type: {ct}\r\n"));
            }
            req.push_str("\r\n");
            req.push_str(body);
            s.write_all(req.as_bytes()).await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
        };
        let text = tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .expect("answer in time")
            .expect("request");
        let code: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
        (code, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    async fn call(
        fake: &FakeK8s,
        method: &str,
        path: &str,
        ct: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        raw(
            fake,
            method,
            path,
            ct,
            &body.map(|b| b.to_string()).unwrap_or_default(),
        )
        .await
    }

    #[tokio::test]
    async fn rejects_what_a_real_server_rejects() {
        let fake = FakeK8s::start().await.unwrap();
        fake.add_node(NodeSeed::new("n1", "10.0.0.1"));
        fake.add_pod(PodSeed::new("web", "p1", "n1"));
        let (c, v) = call(&fake, "GET", "/api/v1/widgets", None, None).await;
        assert_eq!(
            (c, v["kind"].as_str(), v["reason"].as_str()),
            (404, Some("Status"), Some("NotFound"))
        );
        let (c, _) = call(&fake, "GET", "/api/v1/nodes/nope", None, None).await;
        assert_eq!(c, 404);
        let (c, v) = call(
            &fake,
            "PATCH",
            "/api/v1/nodes/n1",
            Some("text/plain"),
            Some(json!({})),
        )
        .await;
        assert_eq!(
            (c, v["reason"].as_str()),
            (415, Some("UnsupportedMediaType"))
        );
        let (c, _) = raw(
            &fake,
            "PATCH",
            "/api/v1/nodes/n1",
            Some("application/merge-patch+json"),
            "{not json",
        )
        .await;
        assert_eq!(c, 400);
        let (c, v) = call(
            &fake,
            "PATCH",
            "/api/v1/nodes/n1",
            Some("application/merge-patch+json"),
            Some(json!({"spec": {"unschedulable": "yes"}})),
        )
        .await;
        assert_eq!((c, v["reason"].as_str()), (422, Some("Invalid")));
        let (c, _) = call(
            &fake,
            "PATCH",
            "/api/v1/nodes/n1",
            Some("application/merge-patch+json"),
            Some(json!({"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}})),
        )
        .await;
        assert_eq!(c, 422);
        let (c, _) = call(
            &fake,
            "GET",
            "/api/v1/pods?fieldSelector=spec.bogus%3Dx",
            None,
            None,
        )
        .await;
        assert_eq!(c, 400);
        // Evictions with the wrong apiVersion or kind, or a name that is not the URL's.
        for body in [
            json!({"apiVersion": "v1", "kind": "Eviction", "metadata": {"name": "p1"}}),
            json!({"apiVersion": "policy/v1", "kind": "Pod", "metadata": {"name": "p1"}}),
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p2"}}),
        ] {
            let (c, _) = call(
                &fake,
                "POST",
                "/api/v1/namespaces/web/pods/p1/eviction",
                Some("application/json"),
                Some(body),
            )
            .await;
            assert_eq!(c, 400);
        }
        // Stale resourceVersion → 409.
        let (c, v) = call(
            &fake,
            "PATCH",
            "/api/v1/nodes/n1",
            Some("application/strategic-merge-patch+json"),
            Some(json!({"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": true}})),
        )
        .await;
        assert_eq!((c, v["reason"].as_str()), (409, Some("Conflict")));
    }

    #[tokio::test]
    async fn leases_get_list_put_and_watch_like_the_api_server() {
        use futures::{StreamExt, TryStreamExt};
        use k8s_openapi::api::coordination::v1::Lease;
        use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
        let fake = FakeK8s::start().await.unwrap();
        fake.add_node(NodeSeed::new("n1", "10.0.0.1"));
        fake.renew_lease("n1");
        let kc = kube::config::Kubeconfig::read_from(fake.kubeconfig()).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let api: Api<Lease> =
            Api::namespaced(kube::Client::try_from(cfg).unwrap(), "kube-node-lease");
        let list = api.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
        let rv = list.metadata.resource_version.clone().unwrap();
        let mut stream = api
            .watch(&WatchParams::default().timeout(10), "0")
            .await
            .unwrap()
            .boxed();
        let next =
            async |s: &mut futures::stream::BoxStream<'_, kube::Result<WatchEvent<Lease>>>| {
                tokio::time::timeout(Duration::from_secs(5), s.try_next())
                    .await
                    .expect("a watch event in time")
                    .unwrap()
                    .expect("stream open")
            };
        assert!(
            matches!(next(&mut stream).await, WatchEvent::Added(l) if l.metadata.name.as_deref() == Some("n1"))
        );
        // A kubelet renews with PUT (replace), as the real one does.
        let mut lease = api.get("n1").await.unwrap();
        let renewed = "2030-01-01T00:00:00.123456Z";
        lease.spec.as_mut().unwrap().renew_time = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(renewed.parse().unwrap()),
        );
        api.replace("n1", &PostParams::default(), &lease)
            .await
            .unwrap();
        match next(&mut stream).await {
            WatchEvent::Modified(l) => assert_eq!(
                l.spec.unwrap().renew_time.unwrap().0.to_string(),
                "2030-01-01T00:00:00.123456Z"
            ),
            other => panic!("{other:?}"),
        }
        // A watch from the list's version sees only what changed after it.
        let mut later = api
            .watch(&WatchParams::default().timeout(10), &rv)
            .await
            .unwrap()
            .boxed();
        assert!(matches!(next(&mut later).await, WatchEvent::Modified(_)));
    }

    #[tokio::test]
    async fn eviction_follows_budgets() {
        let fake = FakeK8s::start().await.unwrap();
        fake.add_node(NodeSeed::new("n1", "10.0.0.1"));
        fake.add_pod(PodSeed::new("a", "p1", "n1").label("app", "x"));
        fake.add_pod(PodSeed::new("a", "p2", "n1").label("app", "y"));
        fake.add_pdb("a", "all", json!({}), 0);
        let evict = |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "a"}});
        let path = |n: &str| format!("/api/v1/namespaces/a/pods/{n}/eviction");
        let (c, v) = call(
            &fake,
            "POST",
            &path("p1"),
            Some("application/json"),
            Some(evict("p1")),
        )
        .await;
        assert_eq!(c, 429);
        assert_eq!(v["details"]["causes"][0]["reason"], "DisruptionBudget");
        fake.set_disruptions_allowed("a", "all", 1);
        let (c, _) = call(
            &fake,
            "POST",
            &path("p1"),
            Some("application/json"),
            Some(evict("p1")),
        )
        .await;
        assert_eq!(c, 201);
        assert!(fake.pod("a", "p1").is_none());
        assert_eq!(
            fake.pdb("a", "all").unwrap()["status"]["disruptionsAllowed"],
            0
        );
        let (c, _) = call(
            &fake,
            "POST",
            &path("p1"),
            Some("application/json"),
            Some(evict("p1")),
        )
        .await;
        assert_eq!(c, 404);
        fake.add_pdb("a", "y-only", json!({"matchLabels": {"app": "y"}}), 5);
        let (c, v) = call(
            &fake,
            "POST",
            &path("p2"),
            Some("application/json"),
            Some(evict("p2")),
        )
        .await;
        assert_eq!(c, 500, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("more than one PodDisruptionBudget")
        );
    }

    #[tokio::test]
    async fn slow_pods_terminate_and_released_nodes_lose_their_pods() {
        let fake = FakeK8s::start().await.unwrap();
        fake.set_gc_delay(Duration::from_millis(20));
        fake.add_node(NodeSeed::new("n1", "10.0.0.1"));
        fake.add_pod(PodSeed::new("a", "slow", "n1").terminate_after(Duration::from_millis(100)));
        fake.add_volume_attachment("va1", "n1");
        let (c, v) = call(
            &fake,
            "DELETE",
            "/api/v1/namespaces/a/pods/slow",
            None,
            None,
        )
        .await;
        assert_eq!(c, 200);
        assert!(v["metadata"]["deletionTimestamp"].is_string());
        assert!(fake.pod("a", "slow").is_some());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(fake.pod("a", "slow").is_none());
        let (c, _) = call(&fake, "DELETE", "/api/v1/nodes/n1", None, None).await;
        assert_eq!(c, 200);
        assert_eq!(fake.volume_attachments_on("n1").len(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(fake.volume_attachments_on("n1").is_empty());
    }

    #[tokio::test]
    async fn a_dead_kubelets_pods_stay_terminating_while_its_node_still_reports_ready() {
        // As against the real control plane (real_k8s.rs, second_signal = "lease"): the
        // taint makes the pod terminating, no kubelet ends it, the pod GC leaves a Ready node.
        let fake = FakeK8s::start().await.unwrap();
        fake.set_gc_delay(Duration::from_millis(20));
        fake.add_node(NodeSeed::new("n1", "10.0.0.1"));
        fake.add_pod(PodSeed::new("a", "db-0", "n1").terminate_after(Duration::from_millis(50)));
        fake.set_kubelet_alive("n1", false);
        let (c, _) = call(
            &fake,
            "DELETE",
            "/api/v1/namespaces/a/pods/db-0",
            None,
            None,
        )
        .await;
        assert_eq!(c, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pod = fake.pod("a", "db-0").expect("ended by a dead kubelet");
        assert!(pod["metadata"]["deletionTimestamp"].is_string());
        // The kubelet back: it ends the termination it missed.
        fake.set_kubelet_alive("n1", true);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while fake.pod("a", "db-0").is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "a kubelet back never ended the termination"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn faults_and_down() {
        let fake = FakeK8s::start().await.unwrap();
        fake.inject(Fault {
            path_contains: Some("/nodes".into()),
            status: 503,
            message: "etcd leader changed".into(),
            times: Some(1),
            ..Default::default()
        });
        let (c, _) = call(&fake, "GET", "/api/v1/nodes", None, None).await;
        assert_eq!(c, 503);
        let (c, _) = call(&fake, "GET", "/api/v1/nodes", None, None).await;
        assert_eq!(c, 200);
        fake.set_down(true);
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(fake.addr).await?;
            s.write_all(b"GET /api/v1/nodes HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n\r\n")
                .await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        })
        .await
        .expect("no hang");
        // Dropped without an answer: either an error or an empty read.
        assert!(r.map(|o| o.is_empty()).unwrap_or(true));
        fake.set_down(false);
        let (c, _) = call(&fake, "GET", "/api/v1/nodes", None, None).await;
        assert_eq!(c, 200);
    }
}
