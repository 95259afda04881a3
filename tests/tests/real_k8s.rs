//! The coordinator's drain and release against a real Kubernetes control plane: etcd,
//! kube-apiserver and kube-controller-manager 1.37 built from their Go modules
//! (`scripts/build-k8s.sh`, run by `scripts/setup-test-deps.sh`) and started on loopback by
//! `testkit::real_k8s`. The node lifecycle, taint-eviction, pod GC, attach-detach and
//! disruption controllers are the real ones, with their real timings (the pod GC acts every
//! 20 s) except a 5 s node monitor grace period. Kubelets and the CSI driver's
//! external-attacher are played through the API by the test kit (`real_k8s::kubelet`).
//!
//! The coordinator's `KubeDrainer` runs as a library, exactly as the repair engine and the
//! fence flow call it (one idempotent pass per call), with a proof of power-off from a
//! gateway stand-in (the end-to-end fence flow with a real gateway and BMC simulator is in
//! `real_k8s_fence.rs`). Each test prints the time of each phase.
//!
//! - a dead machine's StatefulSet pod with a CSI volume: the release ends only when the pod
//!   GC removed the pod and the attach-detach controller the VolumeAttachment;
//! - a machine whose kubelet still renews (a live node wrongly suspected, a proof for the
//!   wrong machine): the release is held, so no taint, its pod runs and its volume stays
//!   attached, through two pod GC periods. (Without the hold, the taint alone made the real
//!   taint-eviction controller terminate the pod and the attach-detach controller detach its
//!   volume at once, kubelet or not: the test failed so.)
//! - a drain blocked by a PodDisruptionBudget the real disruption controller keeps (429 from
//!   the real Eviction API) holds, and resumes when more replicas make the budget allow it;
//!   a DaemonSet's pod stays.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coordinator::clock::SystemClock;
use coordinator::fence::proof::{DownProof, confirm_power_off};
use coordinator::k8s::release::{Release, ReleaseProgress};
use coordinator::k8s::{DrainOptions, DrainProgress, Drainer, KubeDrainer, KubernetesConfig};
use coordinator::testing::FakePower;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testkit::real_k8s::kubelet::{CsiAttacher, Kubelets};
use testkit::real_k8s::workload::{PodSpec, namespace, pdb, stateful_pod_with_volume};
use testkit::real_k8s::{Options, RealK8s};

const DEAD: &str = "m1";
const DEAD_IP: &str = "10.0.9.1";
const LIVE: &str = "m2";
const LIVE_IP: &str = "10.0.9.2";
const DRIVER: &str = "csi.fleetmend.test";
/// Kubelets renew their Lease this often (a real one: every 10 s).
const RENEW: Duration = Duration::from_millis(500);
/// Bound for what the controllers do: the pod GC alone may take 20 s, and the machine is
/// shared and loaded.
const SETTLE: Duration = Duration::from_secs(90);

/// A cluster of two registered nodes (one zone: the node lifecycle controller only taints
/// and evicts while some node of the zone is healthy), a played kubelet for each and a
/// played external-attacher.
struct Cluster {
    k8s: RealK8s,
    kubelets: Kubelets,
    _csi: CsiAttacher,
    client: kube::Client,
    t0: Instant,
}

impl Cluster {
    async fn start() -> Result<Self> {
        let k8s = RealK8s::start(Options::default()).await?;
        let client = k8s.client();
        let kubelets = Kubelets::start(client.clone(), RENEW);
        kubelets.register(DEAD, DEAD_IP).await?;
        kubelets.register(LIVE, LIVE_IP).await?;
        let csi = CsiAttacher::start(client.clone(), DRIVER).await?;
        namespace(&client, "db").await?;
        Ok(Self {
            k8s,
            kubelets,
            _csi: csi,
            client,
            t0: Instant::now(),
        })
    }

    fn phase(&self, what: &str) {
        eprintln!("[{:>6.1} s] {what}", self.t0.elapsed().as_secs_f64());
    }

    async fn drainer(&self) -> Result<KubeDrainer> {
        let cfg = KubernetesConfig {
            kubeconfig: Some(self.k8s.kubeconfig().to_path_buf()),
            request_timeout: Duration::from_secs(10),
            instance: Some("test-coordinator".into()),
            ..Default::default()
        };
        Ok(KubeDrainer::from_config(&cfg, Arc::new(SystemClock)).await?)
    }

    async fn pod(&self, ns: &str, name: &str) -> Result<Option<Pod>> {
        Ok(Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?)
    }

    async fn attachments_on(&self, node: &str) -> Result<Vec<VolumeAttachment>> {
        Ok(Api::<VolumeAttachment>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|va| va.spec.node_name == node)
            .collect())
    }

    async fn ready(&self, node: &str) -> Result<Option<String>> {
        let n = Api::<Node>::all(self.client.clone()).get(node).await?;
        Ok(n.status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status))
    }

    /// Polls `f` every 200 ms until it gives `Some`, at most `limit`.
    async fn wait<T>(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl AsyncFnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = f().await? {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                bail!(
                    "timed out after {limit:?} waiting for {what}\n{}",
                    self.k8s.logs_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The StatefulSet pod `db/web-0` on `node` with its volume attached by the real
    /// attach-detach controller.
    async fn stateful_pod_attached(&self, node: &str, grace: i64) -> Result<()> {
        stateful_pod_with_volume(&self.client, "db", "web", node, DRIVER, grace).await?;
        self.wait(
            "the attach-detach controller to attach web-0's volume",
            SETTLE,
            async || {
                Ok(self
                    .attachments_on(node)
                    .await?
                    .into_iter()
                    .find(|va| va.status.as_ref().is_some_and(|s| s.attached)))
            },
        )
        .await?;
        self.phase("web-0 running on its node, volume attached (VolumeAttachment by the attach-detach controller)");
        Ok(())
    }
}

/// A proof of power-off for `address`, as the fence flow has it after the gateway's
/// confirmation (a gateway stand-in here: `real_k8s_fence.rs` has the real one).
async fn proof_for(address: &str) -> Result<DownProof> {
    let gw = FakePower::confirming_off(jiff::Timestamp::now());
    Ok(confirm_power_off(&gw, address, "SER", "fence-1", 0)
        .await?
        .into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_machines_stateful_pod_and_volume_are_released_by_the_real_controllers() -> Result<()>
{
    let c = Cluster::start().await?;
    c.stateful_pod_attached(DEAD, 30).await?;
    PodSpec::new("db", "cache", DEAD, 30)
        .create(&c.client)
        .await?;

    // The machine dies: its kubelet stops renewing. The real node lifecycle controller
    // turns Ready Unknown after the grace period (the second signal of death).
    c.kubelets.set_alive(DEAD, false);
    c.phase("machine m1 dies (its kubelet stops)");
    c.wait("Ready Unknown on the dead node", SETTLE, async || {
        Ok(c.ready(DEAD).await?.filter(|s| s != "True"))
    })
    .await?;
    c.phase("node lifecycle controller: m1 Ready Unknown");

    // Power-off confirmed: the fence flow releases with the out-of-service taint, one pass
    // at a time until done.
    let d = c.drainer().await?;
    let proof = proof_for(DEAD_IP).await?;
    let released_at = Instant::now();
    let (mut terminating_seen, mut pod_gone_seen) = (None, None);
    let progress = c
        .wait("the release to complete", SETTLE, async || {
            let p = d.release(DEAD, &proof, &Release::Taint).await?;
            let pod = c.pod("db", "web-0").await?;
            if terminating_seen.is_none()
                && pod
                    .as_ref()
                    .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
            {
                terminating_seen = Some(released_at.elapsed());
                c.phase("taint-eviction controller: web-0 terminating");
            }
            if pod_gone_seen.is_none() && pod.is_none() {
                pod_gone_seen = Some(released_at.elapsed());
                c.phase("web-0 gone (force-deleted by the release pass, as the pod GC would on its next 20 s pass)");
            }
            Ok((p == ReleaseProgress::Done).then_some(p))
        })
        .await?;
    c.phase("release done: no pod of m1 terminating, no VolumeAttachment names m1");
    assert_eq!(progress, ReleaseProgress::Done);
    // Done means gone: the pods and the VolumeAttachment, removed by the real controllers.
    assert!(c.pod("db", "web-0").await?.is_none(), "web-0 still exists");
    assert!(c.pod("db", "cache").await?.is_none(), "cache still exists");
    assert!(
        c.attachments_on(DEAD).await?.is_empty(),
        "a VolumeAttachment still names m1"
    );
    // The terminating state is sampled once per pass: on a loaded machine the release pass can
    // force-delete the pod between two samples, so only its going is required here.
    assert!(pod_gone_seen.is_some(), "web-0 was never seen gone");
    let terminating = terminating_seen.map_or("between two samples".to_string(), |t| {
        format!("{:.1} s", t.as_secs_f64())
    });
    eprintln!(
        "release: taint -> terminating {terminating}, -> pod gone {:.1} s, -> done {:.1} s",
        pod_gone_seen.unwrap_or_default().as_secs_f64(),
        released_at.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_kubelet_renews_is_not_released_despite_a_proof_of_power_off() -> Result<()> {
    let c = Cluster::start().await?;
    // A database that takes up to 10 minutes to stop cleanly.
    c.stateful_pod_attached(DEAD, 600).await?;
    // A wrong proof: the BMC read off, but the machine's kubelet still renews its Lease.
    let d = c.drainer().await?;
    let proof = proof_for(DEAD_IP).await?;
    let start = Instant::now();
    let mut last = None;
    // Two pod GC periods (20 s each) and more.
    while start.elapsed() < Duration::from_secs(45) {
        let p = d.release(DEAD, &proof, &Release::Taint).await?;
        let pod = c
            .pod("db", "web-0")
            .await?
            .context("web-0 force-deleted while its kubelet renews")?;
        assert_eq!(c.ready(DEAD).await?.as_deref(), Some("True"));
        assert_eq!(
            c.attachments_on(DEAD).await?.len(),
            1,
            "the volume was detached while its kubelet renews"
        );
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "web-0 made terminating while its kubelet renews"
        );
        assert!(
            matches!(
                p,
                ReleaseProgress::Waiting {
                    node_ready: true,
                    ..
                }
            ),
            "release on a live node: {p:?}"
        );
        let node = Api::<Node>::all(c.client.clone()).get(DEAD).await?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t.key == "node.kubernetes.io/out-of-service"),
            "a node whose kubelet renews was tainted out of service"
        );
        last = Some(p);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    c.phase("45 s: release held (Node Ready): web-0 running, its volume attached, no taint");
    assert!(last.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_blocked_by_a_real_budget_holds_and_resumes_when_it_allows() -> Result<()> {
    let c = Cluster::start().await?;
    let client = &c.client;
    for i in 0..2 {
        PodSpec::new("db", &format!("web-{i}"), LIVE, 1)
            .label("app", "web")
            .create(client)
            .await?;
    }
    // A DaemonSet's pod stays on a drained node. (A mirror pod cannot be made here: the API
    // server accepts its annotation only from the node's own kubelet.)
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "db"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"containers": [{"name": "a", "image": "registry.invalid/a:1"}]}}
        }
    }))?;
    let ds = Api::<DaemonSet>::namespaced(client.clone(), "db")
        .create(&PostParams::default(), &ds)
        .await?;
    PodSpec::new("db", "agent-x", LIVE, 1)
        .label("app", "agent")
        .owner(
            "apps/v1",
            "DaemonSet",
            "agent",
            &ds.metadata.uid.unwrap_or_default(),
        )
        .create(client)
        .await?;

    pdb(client, "db", "web", "web", 2).await?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "db");
    c.wait(
        "the disruption controller to count 2 healthy of 2",
        SETTLE,
        async || {
            let b = pdbs.get("web").await?;
            Ok(b.status
                .filter(|s| s.current_healthy == 2 && s.disruptions_allowed == 0)
                .map(|_| ()))
        },
    )
    .await?;
    c.phase("budget db/web: 2 healthy, 0 disruptions allowed (disruption controller)");

    let d = c.drainer().await?;
    let o = DrainOptions {
        protected_namespaces: None,
        protected_job_pods: None,
        evict_retries: 0,
        evict_interval_seconds: 0,
    };
    for _ in 0..3 {
        match d.drain(LIVE, &o).await? {
            DrainProgress::InProgress {
                remaining: 2,
                detail,
            } => {
                assert!(
                    detail.contains("PodDisruptionBudget") || detail.contains("budget"),
                    "{detail}"
                );
            }
            other => bail!("expected a budget-blocked pass, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(c.pod("db", "web-0").await?.is_some() && c.pod("db", "web-1").await?.is_some());
    c.phase("drain holds: the real Eviction API answers 429 for both web pods");

    // Two more replicas elsewhere: the budget allows two disruptions.
    for i in 2..4 {
        PodSpec::new("db", &format!("web-{i}"), DEAD, 1)
            .label("app", "web")
            .create(client)
            .await?;
    }
    let done = c
        .wait("the drain to finish", SETTLE, async || {
            Ok(match d.drain(LIVE, &o).await? {
                DrainProgress::Done => Some(()),
                DrainProgress::InProgress { .. } => None,
                DrainProgress::Abandoned { reason } => bail!("drain abandoned: {reason}"),
            })
        })
        .await;
    done?;
    c.phase("drain done: both web pods evicted once the budget allowed");
    for p in ["web-0", "web-1"] {
        assert!(
            c.pod("db", p).await?.is_none(),
            "{p} still on the drained node"
        );
    }
    for p in ["agent-x"] {
        assert!(
            c.pod("db", p).await?.is_some(),
            "{p} must stay on a drained node"
        );
    }
    let node = Api::<Node>::all(client.clone()).get(LIVE).await?;
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true));
    Ok(())
}
