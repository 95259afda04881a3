//! The fake API server kept honest: one scenario runs against the fake
//! (`testkit::fake_k8s`) and against the real control plane (`testkit::real_k8s`: etcd,
//! kube-apiserver, kube-controller-manager 1.37 with played kubelets), and what each did is
//! compared, step by step. Timings differ on purpose (the fake's controllers act after
//! 50 ms, the real pod GC every 20 s, 40 s after a Node's deletion); outcomes must not.
//!
//! The scenario, on two nodes:
//! - node a's kubelet keeps renewing while an operator puts the out-of-service taint on it:
//!   its pod becomes terminating (taint eviction) and is not force-deleted (its node is
//!   Ready; the fake used to remove it 50 ms after the taint);
//! - node b's kubelet dies: once its Node is not Ready, a graceful delete of one of its pods
//!   leaves it terminating, as no kubelet ends it (the fake used to remove it at once);
//! - node a's kubelet dies too: once a is not Ready its terminating pod is force-deleted by
//!   the pod GC; node b's Node is deleted: its pods are removed.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use testkit::fake_k8s::{FakeK8s, NodeSeed, PodSeed};
use testkit::real_k8s::kubelet::Kubelets;
use testkit::real_k8s::workload::{PodSpec, namespace};
use testkit::real_k8s::{Options, RealK8s, client_for};

/// One of the two API servers with its kubelets.
enum Server {
    Fake(FakeK8s),
    Real(Box<RealK8s>, Kubelets),
}

impl Server {
    async fn client(&self) -> Result<kube::Client> {
        Ok(match self {
            Server::Fake(f) => client_for(f.kubeconfig()).await?,
            Server::Real(r, _) => r.client(),
        })
    }

    async fn node(&self, name: &str, ip: &str) -> Result<()> {
        match self {
            Server::Fake(f) => {
                f.add_node(NodeSeed::new(name, ip));
                f.renew_lease(name);
                f.set_kubelet_alive(name, true);
            }
            Server::Real(_, k) => k.register(name, ip).await?,
        }
        Ok(())
    }

    /// A pod whose containers take `grace` to stop.
    async fn pod(&self, name: &str, node: &str, grace: Duration) -> Result<()> {
        match self {
            Server::Fake(f) => {
                f.add_pod(PodSeed::new("db", name, node).terminate_after(grace));
            }
            Server::Real(r, _) => {
                let secs = i64::try_from(grace.as_secs())?;
                PodSpec::new("db", name, node, secs)
                    .create(&r.client())
                    .await?;
            }
        }
        Ok(())
    }

    fn kubelet(&self, node: &str, alive: bool) {
        match self {
            Server::Fake(f) => f.set_kubelet_alive(node, alive),
            Server::Real(_, k) => k.set_alive(node, alive),
        }
    }
}

/// `Some(true)`: terminating; `Some(false)`: there; `None`: gone.
async fn pod_state(c: &kube::Client, name: &str) -> Result<Option<bool>> {
    Ok(Api::<Pod>::namespaced(c.clone(), "db")
        .get_opt(name)
        .await?
        .map(|p| p.metadata.deletion_timestamp.is_some()))
}

async fn wait_until(
    what: &str,
    limit: Duration,
    mut f: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !f().await? {
        if Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn not_ready(c: &kube::Client, node: &str) -> Result<bool> {
    let n = Api::<Node>::all(c.clone()).get(node).await?;
    Ok(!n
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
}

fn state(s: Option<bool>) -> &'static str {
    match s {
        Some(true) => "terminating",
        Some(false) => "running",
        None => "gone",
    }
}

/// Runs the scenario; returns what was seen at each step.
async fn scenario(server: &Server) -> Result<Vec<String>> {
    let c = server.client().await?;
    if let Server::Real(..) = server {
        namespace(&c, "db").await?;
    } else if let Server::Fake(f) = server {
        f.add_namespace("db", &[]);
        f.run_kubelets(Duration::from_millis(500), Duration::from_secs(5));
    }
    server.node("a", "10.0.8.1").await?;
    server.node("b", "10.0.8.2").await?;
    // A pod that takes 10 minutes to stop, and two ordinary ones.
    server.pod("slow", "a", Duration::from_secs(600)).await?;
    server.pod("r", "b", Duration::from_secs(30)).await?;
    server.pod("q", "b", Duration::from_secs(30)).await?;
    let mut seen = Vec::new();

    // The taint on a node whose kubelet renews.
    Api::<Node>::all(c.clone())
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{
                "key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                "effect": "NoExecute"
            }]}})),
        )
        .await?;
    let tainted = Instant::now();
    server.kubelet("b", false);
    wait_until("b not Ready", Duration::from_secs(60), async || {
        not_ready(&c, "b").await
    })
    .await?;
    Api::<Pod>::namespaced(c.clone(), "db")
        .delete("r", &DeleteParams::default())
        .await?;
    // Past one pod GC period (20 s) after the taint, and a few seconds after the delete.
    let past_gc = Duration::from_secs(25).saturating_sub(tainted.elapsed());
    tokio::time::sleep(past_gc.max(Duration::from_secs(3))).await;
    seen.push(format!(
        "a tainted, Ready, 25 s: slow {}",
        state(pod_state(&c, "slow").await?)
    ));
    seen.push(format!(
        "b not Ready, r deleted gracefully: r {}",
        state(pod_state(&c, "r").await?)
    ));

    // Node a dies; node b's Node is deleted.
    server.kubelet("a", false);
    wait_until("a not Ready", Duration::from_secs(60), async || {
        not_ready(&c, "a").await
    })
    .await?;
    Api::<Node>::all(c.clone())
        .delete("b", &DeleteParams::default())
        .await?;
    // The pod GC's period (20 s) and its quarantine for a deleted Node's pods (40 s).
    let limit = Duration::from_secs(90);
    let gone = wait_until("the pod GC", limit, async || {
        Ok(pod_state(&c, "slow").await?.is_none()
            && pod_state(&c, "q").await?.is_none()
            && pod_state(&c, "r").await?.is_none())
    })
    .await;
    seen.push(format!(
        "a not Ready: slow {}",
        state(pod_state(&c, "slow").await?)
    ));
    seen.push(format!(
        "b deleted: q {}, r {}",
        state(pod_state(&c, "q").await?),
        state(pod_state(&c, "r").await?)
    ));
    if let Err(e) = gone {
        seen.push(e.to_string());
    }
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_api_server_releases_as_the_real_control_plane_does() -> Result<()> {
    let fake = Server::Fake(FakeK8s::start().await?);
    let real = {
        let r = RealK8s::start(Options::default()).await?;
        let k = Kubelets::start(r.client(), Duration::from_millis(500));
        Server::Real(Box::new(r), k)
    };
    let t = Instant::now();
    let (from_fake, from_real) = tokio::join!(scenario(&fake), scenario(&real));
    let (from_fake, from_real) = (from_fake?, from_real?);
    eprintln!("after {:.1} s:", t.elapsed().as_secs_f64());
    for (f, r) in from_fake.iter().zip(&from_real) {
        eprintln!("  fake: {f:<48} real: {r}");
    }
    assert_eq!(
        from_real,
        [
            "a tainted, Ready, 25 s: slow terminating",
            "b not Ready, r deleted gracefully: r terminating",
            "a not Ready: slow gone",
            "b deleted: q gone, r gone",
        ],
        "the real control plane behaved otherwise than this test says"
    );
    assert_eq!(
        from_fake, from_real,
        "the fake differs from the real control plane"
    );
    Ok(())
}
