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
//!   is gone (force-deleted by the release under its proof) and the attach-detach controller
//!   removed the VolumeAttachment; on the way, the coordinator's node view reads the Nodes
//!   and kubelet Leases and its Node watch sees the node lifecycle controller's Ready Unknown;
//! - a machine whose kubelet still renews (a live node wrongly suspected, a proof for the
//!   wrong machine): the release is held, so no taint, its pod runs and its volume stays
//!   attached, through two pod GC periods, whether the rule for a live kubelet is Ready True
//!   (the default) or the renewing Lease (`second_signal = "lease"`). (Without the hold, the
//!   taint alone made the real taint-eviction controller terminate the pod and the
//!   attach-detach controller detach its volume at once, kubelet or not: the test failed so.)
//! - with `second_signal = "lease"` and production's 50 s node monitor grace, two dead
//!   machines released while their Nodes still say Ready, by the taint and by Node
//!   deletion, then restored, with Events in the real API.
//! - a drain blocked by a PodDisruptionBudget the real disruption controller keeps (429 from
//!   the real Eviction API) holds, and resumes when more replicas make the budget allow it;
//!   a DaemonSet's pod stays.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coordinator::clock::SystemClock;
use coordinator::fence::proof::{DownProof, confirm_power_off};
use coordinator::k8s::lease::SecondSignal;
use coordinator::k8s::release::{Release, ReleaseProgress, RestoreProgress};
use coordinator::k8s::{DrainOptions, DrainProgress, Drainer, KubeDrainer, KubernetesConfig};
use coordinator::testing::FakePower;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::real_k8s::kubelet::{CsiAttacher, Kubelets};
use testkit::real_k8s::workload::{PodSpec, namespace, pdb, stateful_pod_with_volume};
use testkit::real_k8s::{Options, RealK8s};

const DEAD: &str = "m1";
const DEAD_IP: &str = "10.0.9.1";
const LIVE: &str = "m2";
const LIVE_IP: &str = "10.0.9.2";
/// A node released by deleting it.
const GONE: &str = "m3";
const GONE_IP: &str = "10.0.9.3";
const DRIVER: &str = "csi.fleetmend.test";
/// `remediation.lease_stale` of the drainers with `second_signal = "lease"`: six renewals.
const LEASE_STALE: Duration = Duration::from_secs(3);
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
        Self::start_with(Options::default(), &[]).await
    }

    /// A cluster with `opts`, and `more` nodes registered besides m1 and m2.
    async fn start_with(opts: Options, more: &[(&str, &str)]) -> Result<Self> {
        let k8s = RealK8s::start(opts).await?;
        let client = k8s.client();
        let kubelets = Kubelets::start(client.clone(), RENEW);
        kubelets.register(DEAD, DEAD_IP).await?;
        kubelets.register(LIVE, LIVE_IP).await?;
        for (name, ip) in more {
            kubelets.register(name, ip).await?;
        }
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

    /// A drainer with `remediation.second_signal = "lease"` and `lease_stale` [`LEASE_STALE`].
    async fn lease_drainer(&self) -> Result<KubeDrainer> {
        Ok(self
            .drainer()
            .await?
            .with_second_signal(SecondSignal::Lease, LEASE_STALE))
    }

    async fn node(&self, name: &str) -> Result<Option<Node>> {
        Ok(Api::<Node>::all(self.client.clone()).get_opt(name).await?)
    }

    /// The reasons of the Events recorded on Node `name` (in `default`, as the kubelet's).
    async fn event_reasons(&self, name: &str) -> Result<Vec<String>> {
        Ok(Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect())
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

    // The coordinator's node view over the real API: Nodes with their kubelet Leases, and
    // (no poller here) only its Node watch to refresh it.
    let d = c.drainer().await?;
    let view = d.node_view().clone();
    view.refresh().await?;
    let m1 = view.get(DEAD).context("m1 not in the node view")?;
    assert_eq!(m1.ready, Some(true), "{m1:?}");
    assert_eq!(m1.internal_ip.as_deref(), Some(DEAD_IP));
    assert!(
        m1.lease_renew_time.is_some() && m1.lease_seen_since.is_some(),
        "m1's kubelet Lease not read from kube-node-lease: {m1:?}"
    );
    let changes = view.changes();
    let cancel = tokio_util::sync::CancellationToken::new();
    let watcher = view.spawn_watcher(cancel.clone());

    // The machine dies: its kubelet stops renewing. The real node lifecycle controller
    // turns Ready Unknown after the grace period (the second signal of death).
    c.kubelets.set_alive(DEAD, false);
    c.phase("machine m1 dies (its kubelet stops)");
    c.wait("Ready Unknown on the dead node", SETTLE, async || {
        Ok(c.ready(DEAD).await?.filter(|s| s != "True"))
    })
    .await?;
    c.phase("node lifecycle controller: m1 Ready Unknown");
    // The watch saw it and refreshed the view, which said so to its waiter.
    let deadline = Instant::now() + Duration::from_secs(20);
    while view.get(DEAD).and_then(|n| n.ready) != Some(false) {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, changes.notified())
            .await
            .context("the Node watch never refreshed the view after m1 turned Ready Unknown")?;
    }
    c.phase("node view: m1 not Ready, refreshed by its Node watch");
    cancel.cancel();
    watcher.await?;

    // Power-off confirmed: the fence flow releases with the out-of-service taint, one pass
    // at a time until done.
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
    // Both rules for a live kubelet hold: Ready True (the default), and the renewing Lease
    // (`second_signal = "lease"`, which does not look at Ready at all).
    let by_ready = c.drainer().await?;
    let by_lease = c.lease_drainer().await?;
    let proof = proof_for(DEAD_IP).await?;
    let start = Instant::now();
    let mut last = None;
    // Two pod GC periods (20 s each) and more.
    while start.elapsed() < Duration::from_secs(45) {
        for (rule, d) in [("Ready", &by_ready), ("Lease", &by_lease)] {
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
            match &p {
                ReleaseProgress::Waiting {
                    held: Some(why), ..
                } => assert!(
                    why.contains(rule) && why.contains("check the BMC mapping"),
                    "held by {rule}: {why}"
                ),
                other => bail!("release on a live node (rule {rule}): {other:?}"),
            }
            let node = Api::<Node>::all(c.client.clone()).get(DEAD).await?;
            let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
            assert!(
                !taints
                    .iter()
                    .any(|t| t.key == "node.kubernetes.io/out-of-service"),
                "a node whose kubelet renews was tainted out of service"
            );
            last = Some(p);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    c.phase("45 s: release held by either rule (Node Ready, Lease renewing): web-0 running, its volume attached, no taint");
    assert!(last.is_some());
    Ok(())
}

/// `second_signal = "lease"` at production's node monitor grace (50 s): two dead machines
/// are released long before the node lifecycle controller would turn them not Ready, one
/// by the out-of-service taint and one by deleting its Node; the coordinator deletes their
/// pods itself (the pod GC would not act on a Ready node, and waits 40 s for a deleted
/// Node's), the attach-detach controller detaches their volumes; then both come back and
/// are restored (taint removed; the Node re-registered with its saved labels put back).
/// Events on both Nodes in the real API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_second_signal_lease_dead_nodes_are_released_before_ready_leaves_true_and_restored()
-> Result<()> {
    let c = Cluster::start_with(
        Options {
            node_monitor_grace: Duration::from_secs(50),
        },
        &[(GONE, GONE_IP)],
    )
    .await?;
    namespace(&c.client, "db2").await?;
    c.stateful_pod_attached(DEAD, 30).await?;
    stateful_pod_with_volume(&c.client, "db2", "store", GONE, DRIVER, 30).await?;
    let nodes = Api::<Node>::all(c.client.clone());
    nodes
        .patch(
            GONE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "db2"}}})),
        )
        .await?;
    c.wait("store-0's volume attached", SETTLE, async || {
        Ok((c.attachments_on(GONE).await?.iter())
            .any(|va| va.status.as_ref().is_some_and(|s| s.attached))
            .then_some(()))
    })
    .await?;
    let d = c.lease_drainer().await?;
    let by_delete = Release::DeleteNode(d.save_node_metadata(GONE).await?);
    let (p1, p2) = (proof_for(DEAD_IP).await?, proof_for(GONE_IP).await?);

    // Both machines die, and their BMCs confirm them off at once.
    c.kubelets.set_alive(DEAD, false);
    c.kubelets.set_alive(GONE, false);
    let died = Instant::now();
    c.phase("machines m1 and m3 die (kubelets stop); power-off confirmed");
    // Within lease_stale of the last renewal the Lease still counts as renewed: held.
    for (node, proof, how) in [(DEAD, &p1, &Release::Taint), (GONE, &p2, &by_delete)] {
        let p = d.release(node, proof, how).await?;
        assert!(
            matches!(&p, ReleaseProgress::Waiting { held: Some(why), .. } if why.contains("Lease")),
            "{node} released within lease_stale of its last renewal: {p:?}"
        );
    }
    let (mut taint_done, mut delete_done) = (false, false);
    c.wait("both releases to complete", SETTLE, async || {
        if !taint_done {
            taint_done = d.release(DEAD, &p1, &Release::Taint).await? == ReleaseProgress::Done;
            if taint_done {
                c.phase("m1 released by the taint: pods gone, VolumeAttachment gone");
            }
        }
        if !delete_done {
            delete_done = d.release(GONE, &p2, &by_delete).await? == ReleaseProgress::Done;
            if delete_done {
                c.phase("m3 released by Node deletion: pods gone, VolumeAttachment gone");
            }
        }
        Ok((taint_done && delete_done).then_some(()))
    })
    .await?;
    let took = died.elapsed();
    // Long before the node lifecycle controller's 50 s, and the pod GC's 40 s quarantine.
    assert!(took < Duration::from_secs(30), "released after {took:?}");
    assert_eq!(
        c.ready(DEAD).await?.as_deref(),
        Some("True"),
        "the node lifecycle controller acted first: the test proves nothing"
    );
    assert!(c.pod("db", "web-0").await?.is_none(), "web-0 still exists");
    assert!(
        c.pod("db2", "store-0").await?.is_none(),
        "store-0 still exists"
    );
    assert!(c.node(GONE).await?.is_none(), "Node m3 not deleted");
    for n in [DEAD, GONE] {
        assert!(
            c.attachments_on(n).await?.is_empty(),
            "a VolumeAttachment still names {n}"
        );
    }
    assert!(
        c.event_reasons(DEAD)
            .await?
            .contains(&"FleetmendReleased".to_string())
    );
    assert!(
        c.event_reasons(GONE)
            .await?
            .contains(&"FleetmendReleased".to_string())
    );

    // Powered on: m1's kubelet comes back; m3's registers its Node again, without the label.
    c.kubelets.set_alive(DEAD, true);
    c.kubelets.register(GONE, GONE_IP).await?;
    c.wait("both restores", SETTLE, async || {
        let a = d.restore(DEAD, &p1, &Release::Taint).await? == RestoreProgress::Done;
        let b = d.restore(GONE, &p2, &by_delete).await? == RestoreProgress::Done;
        Ok((a && b).then_some(()))
    })
    .await?;
    c.phase("both restored: m1's taint removed, m3's saved labels back");
    let m1 = c.node(DEAD).await?.context("m1 gone")?;
    assert!(
        !m1.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"),
        "m1 still tainted"
    );
    let m3 = c.node(GONE).await?.context("m3 not back")?;
    assert_eq!(
        m3.metadata
            .labels
            .unwrap_or_default()
            .get("pool")
            .map(String::as_str),
        Some("db2")
    );
    for n in [DEAD, GONE] {
        assert!(
            c.event_reasons(n)
                .await?
                .contains(&"FleetmendRestored".to_string()),
            "no FleetmendRestored Event on {n}"
        );
    }
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
