//! Kubernetes: drain, release, restore, node view and Events, against the fake API server
//! over real HTTP with the real kube-rs client.
//!
//! These run the coordinator's `KubeDrainer` as a library, exactly as the repair engine
//! calls it (one idempotent pass per call until `Done`). Every wait is bounded.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use coordinator::clock::SystemClock;
use coordinator::fence::proof::{DownProof, confirm_power_off};
use coordinator::k8s::release::{Release, ReleaseProgress, RestoreProgress};
use coordinator::k8s::{
    DrainOptions, DrainProgress, Drainer, KubeDrainer, KubeError, KubernetesConfig, NodeEvent,
    ReleaseMethod,
};
use coordinator::testing::FakePower;
use serde_json::json;
use testkit::fake_k8s::{FakeK8s, Fault, NodeSeed, PodSeed};

const NODE: &str = "node-1";
const IP: &str = "10.0.0.1";

async fn drainer(fake: &FakeK8s) -> Result<KubeDrainer> {
    let cfg = KubernetesConfig {
        kubeconfig: Some(fake.kubeconfig().to_path_buf()),
        request_timeout: std::time::Duration::from_secs(5),
        instance: Some("test-coordinator".into()),
        ..Default::default()
    };
    Ok(KubeDrainer::from_config(&cfg, Arc::new(SystemClock)).await?)
}

fn opts() -> DrainOptions {
    DrainOptions {
        protected_namespaces: Some("fleetmend.io/protected=true".into()),
        protected_job_pods: None,
        evict_retries: 0,
        evict_interval_seconds: 0,
    }
}

/// One drain pass, bounded: a pass that hangs (hidden retries) fails the test.
async fn pass(d: &KubeDrainer, o: &DrainOptions) -> Result<DrainProgress> {
    Ok(
        tokio::time::timeout(Duration::from_secs(10), d.drain(NODE, o))
            .await
            .context("a drain pass hung")??,
    )
}

/// Calls `drain` until it is no longer in progress, at most `limit` in total.
async fn drain_until_settled(
    d: &KubeDrainer,
    o: &DrainOptions,
    limit: Duration,
) -> Result<(DrainProgress, Vec<DrainProgress>)> {
    let mut seen = Vec::new();
    tokio::time::timeout(limit, async {
        loop {
            let p = d.drain(NODE, o).await?;
            match p {
                DrainProgress::InProgress { .. } => {
                    seen.push(p);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                other => return Ok::<_, anyhow::Error>((other, seen)),
            }
        }
    })
    .await
    .context("drain did not settle in time")?
}

fn unschedulable(fake: &FakeK8s) -> bool {
    fake.node(NODE).expect("node")["spec"]["unschedulable"] == json!(true)
}

fn base(fake: &FakeK8s) {
    fake.add_namespace("prod", &[("fleetmend.io/protected", "true")]);
    fake.add_namespace("dev", &[]);
    fake.add_node(NodeSeed::new(NODE, IP));
    fake.add_node(NodeSeed::new("node-2", "10.0.0.2"));
}

#[tokio::test]
async fn drain_evicts_skips_deletes_and_waits() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(PodSeed::new("prod", "web-1", NODE).owner("ReplicaSet", "web-abc"));
    fake.add_pod(PodSeed::new("kube-system", "agent-x", NODE).owner("DaemonSet", "agent"));
    fake.add_pod(PodSeed::new("kube-system", "etcd-node-1", NODE).mirror());
    fake.add_pod(PodSeed::new("prod", "done", NODE).phase("Succeeded"));
    fake.add_pod(
        PodSeed::new("prod", "db-0", NODE)
            .owner("StatefulSet", "db")
            .terminate_after(Duration::from_millis(400)),
    );
    // An unprotected pod whose budget refuses: CKE deletes it instead.
    fake.add_pod(
        PodSeed::new("dev", "tool", NODE)
            .owner("ReplicaSet", "tool")
            .label("app", "tool"),
    );
    fake.add_pdb("dev", "tool", json!({"matchLabels": {"app": "tool"}}), 0);
    fake.add_pod(PodSeed::new("prod", "elsewhere", "node-2"));

    let d = drainer(&fake).await?;
    assert_eq!(d.node_for(IP).await?.as_deref(), Some(NODE));
    assert_eq!(d.node_for("10.9.9.9").await?, None, "no node: not a node");

    let (last, waits) = drain_until_settled(&d, &opts(), Duration::from_secs(10)).await?;
    assert_eq!(last, DrainProgress::Done);
    assert!(
        waits.iter().any(|p| matches!(p, DrainProgress::InProgress { detail, .. } if detail.contains("prod/db-0"))),
        "the slow StatefulSet pod was waited on: {waits:?}"
    );
    assert!(fake.pod("prod", "web-1").is_none());
    assert!(fake.pod("prod", "db-0").is_none());
    assert!(fake.pod("dev", "tool").is_none());
    assert!(
        fake.pod("kube-system", "agent-x").is_some(),
        "DaemonSet pod stays"
    );
    assert!(
        fake.pod("kube-system", "etcd-node-1").is_some(),
        "mirror pod stays"
    );
    assert!(fake.pod("prod", "done").is_some(), "finished pod stays");
    assert!(fake.pod("prod", "elsewhere").is_some());

    let reqs = fake.requests();
    let evicted = |ns: &str, n: &str| {
        reqs.iter().any(|r| {
            r.method == "POST" && r.path == format!("/api/v1/namespaces/{ns}/pods/{n}/eviction")
        })
    };
    let deleted = |ns: &str, n: &str| {
        reqs.iter()
            .any(|r| r.method == "DELETE" && r.path == format!("/api/v1/namespaces/{ns}/pods/{n}"))
    };
    assert!(evicted("prod", "web-1") && !deleted("prod", "web-1"));
    assert!(
        evicted("dev", "tool") && deleted("dev", "tool"),
        "429 in an unprotected namespace → delete"
    );
    assert!(!evicted("kube-system", "agent-x") && !evicted("kube-system", "etcd-node-1"));
    // The ReplicaSet pod's eviction is the only one sent for it: a pass never re-evicts
    // what is already gone, and kube's silent retries are off.
    assert_eq!(
        reqs.iter()
            .filter(|r| r.path.ends_with("/web-1/eviction"))
            .count(),
        1
    );

    let node = fake.node(NODE).unwrap();
    assert_eq!(node["spec"]["unschedulable"], json!(true));
    assert_eq!(
        node["metadata"]["annotations"]["fleetmend.io/cordoned-by"],
        "fleetmend-coordinator"
    );

    d.uncordon_if_ours(NODE).await?;
    assert!(!unschedulable(&fake));
    assert!(
        fake.node(NODE).unwrap()["metadata"]["annotations"]["fleetmend.io/cordoned-by"].is_null()
    );
    let reasons = fake.node_event_reasons(NODE);
    assert_eq!(
        reasons,
        [
            "FleetmendCordoned",
            "FleetmendDrained",
            "FleetmendUncordoned"
        ],
        "{reasons:?}"
    );
    Ok(())
}

#[tokio::test]
async fn budget_blocked_drain_retries_then_succeeds_when_the_budget_frees() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(
        PodSeed::new("prod", "web-1", NODE)
            .owner("ReplicaSet", "web")
            .label("app", "web"),
    );
    // An empty selector matches every pod in the namespace (policy/v1).
    fake.add_pdb("prod", "all", json!({}), 0);
    let d = drainer(&fake).await?;
    let o = DrainOptions {
        evict_retries: 2,
        evict_interval_seconds: 0,
        ..opts()
    };
    for _ in 0..3 {
        match pass(&d, &o).await? {
            DrainProgress::InProgress {
                remaining: 1,
                detail,
            } => {
                assert!(detail.contains("PodDisruptionBudget"), "{detail}")
            }
            other => bail!("expected a budget-blocked pass, got {other:?}"),
        }
    }
    let evictions = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .count();
    assert_eq!(evictions, 9, "3 passes × (1 + evict_retries) attempts");
    assert!(fake.pod("prod", "web-1").is_some());
    fake.set_disruptions_allowed("prod", "all", 1);
    let (last, _) = drain_until_settled(&d, &o, Duration::from_secs(5)).await?;
    assert_eq!(last, DrainProgress::Done);
    assert!(fake.pod("prod", "web-1").is_none());
    assert_eq!(
        fake.pdb("prod", "all").unwrap()["status"]["disruptionsAllowed"],
        0
    );
    let reasons = fake.node_event_reasons(NODE);
    assert_eq!(
        reasons
            .iter()
            .filter(|r| *r == "FleetmendDrainBlockedByBudget")
            .count(),
        1,
        "one Event while the same budget blocks: {reasons:?}"
    );
    assert!(reasons.contains(&"FleetmendDrained".to_string()));
    Ok(())
}

#[tokio::test]
async fn two_budgets_on_one_pod_abandon_the_drain() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(PodSeed::new("prod", "web-1", NODE).label("app", "web"));
    fake.add_pdb("prod", "a", json!({}), 3);
    fake.add_pdb("prod", "b", json!({"matchLabels": {"app": "web"}}), 3);
    let d = drainer(&fake).await?;
    match pass(&d, &opts()).await? {
        DrainProgress::Abandoned { reason } => {
            assert!(
                reason.contains("more than one PodDisruptionBudget"),
                "{reason}"
            )
        }
        other => bail!("expected abandon, got {other:?}"),
    }
    assert!(
        !unschedulable(&fake),
        "our cordon is removed when abandoning"
    );
    assert!(fake.pod("prod", "web-1").is_some());
    Ok(())
}

#[tokio::test]
async fn running_protected_job_pod_makes_the_drain_back_off() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(PodSeed::new("prod", "web-1", NODE).owner("ReplicaSet", "web"));
    fake.add_pod(
        PodSeed::new("prod", "backup-xyz", NODE)
            .owner("Job", "backup")
            .label("fleetmend.io/protected-job", "true"),
    );
    let d = drainer(&fake).await?;
    match pass(&d, &opts()).await? {
        DrainProgress::Abandoned { reason } => {
            assert!(reason.contains("prod/backup-xyz"), "{reason}")
        }
        other => bail!("expected abandon, got {other:?}"),
    }
    assert!(!unschedulable(&fake), "uncordoned when backing off");
    assert!(fake.pod("prod", "web-1").is_some(), "nothing evicted");
    assert_eq!(
        fake.node_event_reasons(NODE),
        [
            "FleetmendCordoned",
            "FleetmendDrainAbandoned",
            "FleetmendUncordoned"
        ]
    );
    // A selector that does not match this Job's pods: the Job pod is deleted like CKE does.
    let o = DrainOptions {
        protected_job_pods: Some("fleetmend.io/protected-job=never".into()),
        ..opts()
    };
    let (last, _) = drain_until_settled(&d, &o, Duration::from_secs(5)).await?;
    assert_eq!(last, DrainProgress::Done);
    assert!(fake.pod("prod", "backup-xyz").is_none());
    Ok(())
}

#[tokio::test]
async fn an_admins_cordon_survives_a_repair() -> Result<()> {
    let fake = FakeK8s::start().await?;
    fake.add_namespace("prod", &[("fleetmend.io/protected", "true")]);
    fake.add_node(NodeSeed::new(NODE, IP).cordoned());
    fake.add_pod(PodSeed::new("prod", "web-1", NODE).owner("ReplicaSet", "web"));
    let d = drainer(&fake).await?;
    let (last, _) = drain_until_settled(&d, &opts(), Duration::from_secs(5)).await?;
    assert_eq!(last, DrainProgress::Done);
    d.uncordon_if_ours(NODE).await?;
    assert!(unschedulable(&fake), "the admin's cordon stays");
    assert!(
        fake.node(NODE).unwrap()["metadata"]["annotations"]["fleetmend.io/cordoned-by"].is_null()
    );
    let reasons = fake.node_event_reasons(NODE);
    assert!(
        !reasons
            .iter()
            .any(|r| r.contains("Cordoned") || r.contains("Uncordoned")),
        "{reasons:?}"
    );
    Ok(())
}

#[tokio::test]
async fn api_down_mid_drain_holds_and_resumes() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(
        PodSeed::new("prod", "db-0", NODE)
            .owner("StatefulSet", "db")
            .terminate_after(Duration::from_millis(300)),
    );
    fake.add_pod(PodSeed::new("prod", "web-1", NODE).owner("ReplicaSet", "web"));
    let d = drainer(&fake).await?;
    assert!(matches!(
        pass(&d, &opts()).await?,
        DrainProgress::InProgress { .. }
    ));

    fake.set_down(true);
    let err = tokio::time::timeout(Duration::from_secs(10), d.drain(NODE, &opts()))
        .await
        .context("a down API server must not hang the drain")?
        .expect_err("API down is an error");
    assert!(
        matches!(err, KubeError::Unavailable(_)) && err.is_retriable(),
        "{err}"
    );
    fake.set_down(false);

    // 5xx answers are "unavailable" too, never a verdict on the node.
    fake.inject(Fault {
        path_contains: Some("/pods".into()),
        method: Some("GET".into()),
        status: 503,
        message: "etcdserver: leader changed".into(),
        times: Some(1),
    });
    let err = tokio::time::timeout(Duration::from_secs(10), d.drain(NODE, &opts()))
        .await?
        .expect_err("503 is an error");
    assert!(err.is_retriable(), "{err}");

    let (last, _) = drain_until_settled(&d, &opts(), Duration::from_secs(5)).await?;
    assert_eq!(last, DrainProgress::Done);
    assert!(fake.pods_on(NODE).is_empty());
    Ok(())
}

#[tokio::test]
async fn a_statefulset_pod_recreated_under_the_same_name_is_a_new_pod() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.add_pod(PodSeed::new("prod", "db-0", NODE).owner("StatefulSet", "db"));
    let d = drainer(&fake).await?;
    let first_uid = fake.pod("prod", "db-0").unwrap()["metadata"]["uid"].clone();
    assert_eq!(pass(&d, &opts()).await?, DrainProgress::Done);
    // The StatefulSet controller recreates db-0 with a new UID (here: on the same node).
    fake.add_pod(PodSeed::new("prod", "db-0", NODE).owner("StatefulSet", "db"));
    let second_uid = fake.pod("prod", "db-0").unwrap()["metadata"]["uid"].clone();
    assert_ne!(first_uid, second_uid);
    let (last, _) = drain_until_settled(&d, &opts(), Duration::from_secs(5)).await?;
    assert_eq!(last, DrainProgress::Done);
    assert!(fake.pod("prod", "db-0").is_none());
    Ok(())
}

async fn proof_for(address: &str) -> Result<DownProof> {
    // A gateway stand-in that confirms every fence: the test's way to get a real proof.
    let gw = FakePower::confirming_off(jiff::Timestamp::from_millisecond(1_700_000_000_000)?);
    Ok(confirm_power_off(&gw, address, "SER", "fence-1", 0)
        .await?
        .into())
}

async fn release_until_done(
    d: &KubeDrainer,
    proof: &DownProof,
    how: &Release,
) -> Result<Vec<ReleaseProgress>> {
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let p = d.release(NODE, proof, how).await?;
            seen.push(p.clone());
            if p == ReleaseProgress::Done {
                return Ok::<_, anyhow::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("release did not complete in time")??;
    Ok(seen)
}

#[tokio::test]
async fn release_with_the_out_of_service_taint_and_restore() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.set_gc_delay(Duration::from_millis(100));
    // The machine is off: its kubelet stopped, the node lifecycle controller said Unknown.
    fake.set_ready(NODE, "Unknown");
    fake.add_pod(PodSeed::new("prod", "db-0", NODE).owner("StatefulSet", "db"));
    fake.add_volume_attachment("csi-abc", NODE);
    let d = drainer(&fake).await?;
    assert_eq!(
        d.release_plan(NODE).await?,
        Release::Taint,
        "1.33 supports the taint"
    );

    let wrong = proof_for("10.0.0.2").await?;
    let err = d
        .release(NODE, &wrong, &Release::Taint)
        .await
        .expect_err("proof for another machine");
    assert!(matches!(err, KubeError::Refused(_)), "{err}");
    assert!(fake.node(NODE).unwrap()["spec"]["taints"].is_null());

    let proof = proof_for(IP).await?;
    d.record_event(NODE, NodeEvent::Fenced, &proof.describe())
        .await;
    let seen = release_until_done(&d, &proof, &Release::Taint).await?;
    assert!(
        matches!(
            seen[0],
            ReleaseProgress::Waiting {
                pods: 0,
                volume_attachments: 1,
                held: None,
            }
        ),
        "the first pass force-deleted the terminating pod itself; the attachment goes after it: {seen:?}"
    );
    let taints = fake.node(NODE).unwrap()["spec"]["taints"].clone();
    assert_eq!(
        taints,
        json!([{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}])
    );
    assert!(fake.pods_on(NODE).is_empty() && fake.volume_attachments_on(NODE).is_empty());

    assert_eq!(
        d.restore(NODE, &proof, &Release::Taint).await?,
        RestoreProgress::Done
    );
    assert_eq!(fake.node(NODE).unwrap()["spec"]["taints"], json!([]));
    d.record_event(NODE, NodeEvent::Repaired, "repair succeeded")
        .await;
    assert_eq!(
        fake.node_event_reasons(NODE),
        [
            "FleetmendFenced",
            "FleetmendReleased",
            "FleetmendRestored",
            "FleetmendRepaired"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn release_by_node_deletion_and_restore_of_labels_and_annotations() -> Result<()> {
    let fake = FakeK8s::start().await?;
    fake.add_namespace("prod", &[]);
    fake.add_node(
        NodeSeed::new(NODE, IP)
            .label("topology.kubernetes.io/zone", "rack-7")
            .label("node-role.kubernetes.io/storage", "")
            .annotation("example.com/owner", "team-a"),
    );
    fake.add_pod(PodSeed::new("prod", "db-0", NODE).owner("StatefulSet", "db"));
    // The machine is off: its kubelet stopped, the node lifecycle controller said Unknown.
    fake.set_ready(NODE, "Unknown");
    fake.add_volume_attachment("csi-abc", NODE);
    // A cluster older than 1.28 has no out-of-service taint: auto picks Node deletion.
    fake.set_version("1", "27+");
    let d = drainer(&fake).await?;
    let plan = d.release_plan(NODE).await?;
    let Release::DeleteNode(saved) = &plan else {
        bail!("expected Node deletion on 1.27, got {plan:?}");
    };
    assert_eq!(saved.labels["topology.kubernetes.io/zone"], "rack-7");
    assert_eq!(saved.annotations["example.com/owner"], "team-a");

    let proof = proof_for(IP).await?;
    release_until_done(&d, &proof, &plan).await?;
    assert!(fake.node(NODE).is_none());
    assert!(fake.pods_on(NODE).is_empty() && fake.volume_attachments_on(NODE).is_empty());

    assert_eq!(
        d.restore(NODE, &proof, &plan).await?,
        RestoreProgress::WaitingForNode
    );
    // The kubelet re-registers the Node with only its own labels.
    fake.add_node(NodeSeed::new(NODE, IP));
    assert_eq!(d.restore(NODE, &proof, &plan).await?, RestoreProgress::Done);
    let node = fake.node(NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "rack-7"
    );
    assert_eq!(
        node["metadata"]["labels"]["node-role.kubernetes.io/storage"],
        ""
    );
    assert_eq!(
        node["metadata"]["annotations"]["example.com/owner"],
        "team-a"
    );
    let reasons = fake.node_event_reasons(NODE);
    assert_eq!(
        reasons,
        ["FleetmendReleased", "FleetmendRestored"],
        "{reasons:?}"
    );

    // Configured explicitly, the taint is used even where auto would delete.
    let d = drainer(&fake)
        .await?
        .with_release_method(ReleaseMethod::Taint);
    assert_eq!(d.release_plan(NODE).await?, Release::Taint);
    Ok(())
}

#[tokio::test]
async fn node_view_reads_conditions_leases_taints_and_cordons() -> Result<()> {
    let fake = FakeK8s::start().await?;
    fake.add_node(NodeSeed::new(NODE, IP).ready("Unknown").taint(
        "example.com/maint",
        "x",
        "NoSchedule",
    ));
    fake.add_node(NodeSeed::new("node-2", "10.0.0.2").cordoned());
    fake.set_lease(NODE, "2026-11-21T10:00:00.000000Z");
    let d = drainer(&fake).await?;
    let view = d.node_view().clone();
    assert!(!view.is_fresh(jiff::Timestamp::now(), Duration::from_secs(60)));
    let snap = view.refresh().await?;
    let n1 = &snap.nodes[NODE];
    assert_eq!(n1.ready, Some(false));
    assert_eq!(n1.internal_ip.as_deref(), Some(IP));
    assert_eq!(n1.lease_renew_time, Some("2026-11-21T10:00:00Z".parse()?));
    assert_eq!(n1.taints[0].key, "example.com/maint");
    assert!(n1.condition("Ready").unwrap().last_transition.is_some());
    let n2 = snap.by_address("10.0.0.2").unwrap();
    assert!(n2.unschedulable && !n2.cordoned_by_us && n2.ready == Some(true));
    assert!(view.is_fresh(jiff::Timestamp::now(), Duration::from_secs(60)));

    fake.set_down(true);
    let err = view.refresh().await.expect_err("down");
    assert!(err.is_retriable());
    assert_eq!(view.snapshot().nodes.len(), 2, "the last snapshot stays");
    Ok(())
}

#[tokio::test]
async fn kube_silent_retries_are_off_a_429_comes_back_at_once() -> Result<()> {
    let fake = FakeK8s::start().await?;
    base(&fake);
    fake.inject(Fault {
        path_contains: Some("/api/v1/nodes".into()),
        method: Some("GET".into()),
        status: 429,
        message: "too many requests, please try again later".into(),
        times: Some(1),
    });
    let d = drainer(&fake).await?;
    let started = std::time::Instant::now();
    let err = d
        .node_for(IP)
        .await
        .expect_err("429 is reported, not retried");
    assert!(err.is_retriable(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no hidden backoff"
    );
    let node_gets = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/nodes")
        .count();
    assert_eq!(
        node_gets, 1,
        "exactly one request: kube's default retry is off"
    );
    assert_eq!(d.node_for(IP).await?.as_deref(), Some(NODE));
    Ok(())
}

#[tokio::test]
async fn node_view_poller_follows_the_cluster() -> Result<()> {
    let fake = FakeK8s::start().await?;
    fake.add_node(NodeSeed::new(NODE, IP));
    let d = drainer(&fake).await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = d
        .node_view()
        .spawn_poller(Duration::from_millis(30), cancel.clone());
    let view = d.node_view().clone();
    let wait = |want: usize| {
        let view = view.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), async {
                while view.snapshot().nodes.len() != want {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
        }
    };
    wait(1).await.context("first node seen")?;
    fake.add_node(NodeSeed::new("node-2", "10.0.0.2"));
    wait(2).await.context("second node seen")?;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await??;
    Ok(())
}

// ---- Through a real coordinator ---------------------------------------------------------
//
// A coordinator process with a `[kubernetes]` section pointing at the fake API server and a
// CKE `repair:` file whose procedure drains (`need_drain: true`), driven with
// `coordinatorctl repair-queue` as an operator would.

mod e2e {
    use std::path::PathBuf;
    use std::process::Output;
    use std::time::Duration;

    use anyhow::{Context, Result};
    use serde_json::{Value, json};
    use testkit::fake_k8s::{BackgroundFake, FakeK8s, NodeSeed, PodSeed};
    use testkit::procs::{Coordinator, CoordinatorOptions, Pki, wait_for};

    /// Bound for anything a test causes (drains take well under a second; timeouts a few).
    const SETTLE: Duration = Duration::from_secs(40);

    const REPAIR_YML: &str = r#"
repair:
  max_concurrent_repairs: 10
  evict_retries: 1
  evict_interval: 0
  eviction_timeout_seconds: @T@
  protected_namespaces:
    matchLabels:
      fleetmend.io/protected: "true"
  repair_procedures:
    - machine_types: ["worker"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["sh", "-c", "echo x >> @D@/repaired-$1", "repair"]
              need_drain: true
              watch_seconds: 30
          health_check_command: ["sh", "-c", "test -f @D@/repaired-$1 && echo true || echo false", "check"]
          command_timeout_seconds: 10
    - machine_types: ["quick"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["true"]
          health_check_command: ["sh", "-c", "echo true"]
    - machine_types: ["broken"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["sh", "-c", "echo BMC unreachable >&2; exit 2"]
              need_drain: true
          health_check_command: ["sh", "-c", "echo false"]
"#;

    struct Env {
        _tmp: tempfile::TempDir,
        dir: PathBuf,
        // Dropped before the fake: the coordinator stops first.
        coord: Coordinator,
        fake: BackgroundFake,
    }

    fn start(eviction_timeout_seconds: u64, seed: impl FnOnce(&FakeK8s)) -> Result<Env> {
        let fake = FakeK8s::start_background()?;
        fake.add_namespace("prod", &[("fleetmend.io/protected", "true")]);
        fake.add_namespace("dev", &[]);
        seed(&fake);
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let pki = Pki::create(&dir.join("pki"), "k8s.test")?;
        let repair = dir.join("cluster.yml");
        std::fs::write(
            &repair,
            REPAIR_YML
                .replace("@D@", &dir.display().to_string())
                .replace("@T@", &eviction_timeout_seconds.to_string()),
        )?;
        let opts = CoordinatorOptions {
            extra: format!(
                "[repair]\nconfig = {:?}\n\n[kubernetes]\nkubeconfig = {:?}\nrequest_timeout = \"3s\"\ninstance = \"coord-e2e\"\n",
                repair.display().to_string(),
                fake.kubeconfig().display().to_string()
            ),
            ..Default::default()
        };
        let coord = Coordinator::start(&dir.join("coord"), &pki, &opts)?;
        Ok(Env {
            _tmp: tmp,
            dir,
            coord,
            fake,
        })
    }

    impl Env {
        fn rq(&self, args: &[&str]) -> Result<Output> {
            let mut all = vec!["repair-queue"];
            all.extend_from_slice(args);
            self.coord.ctl(&all)
        }

        fn add(&self, address: &str) -> Result<String> {
            let out = self.rq(&["add", "--force", "unhealthy", "worker", address])?;
            Ok(String::from_utf8(out.stdout)?.trim().to_string())
        }

        fn entry(&self, index: &str) -> Result<Value> {
            let list: Vec<Value> = self.coord.ctl_json(&["repair-queue", "list", "--json"])?;
            list.into_iter()
                .find(|e| e["index"] == index)
                .context("entry present")
        }

        fn history(&self, index: &str) -> Result<Vec<(String, String)>> {
            let show: Value = self
                .coord
                .ctl_json(&["repair-queue", "show", index, "--json"])?;
            Ok(show["history"]
                .as_array()
                .context("history")?
                .iter()
                .map(|h| {
                    (
                        h["event"].as_str().unwrap_or_default().to_string(),
                        h["detail"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect())
        }

        fn wait_entry(&self, index: &str, what: &str, f: impl Fn(&Value) -> bool) -> Result<Value> {
            wait_for(&format!("entry {index}: {what}"), SETTLE, || {
                match self.entry(index) {
                    Ok(e) if f(&e) => Ok(e),
                    Ok(e) => Err(format!("{e}; history {:?}", self.history(index).ok())),
                    Err(e) => Err(e.to_string()),
                }
            })
        }

        fn repaired(&self, address: &str) -> bool {
            self.dir.join(format!("repaired-{address}")).exists()
        }
    }

    fn unschedulable(fake: &FakeK8s, node: &str) -> bool {
        fake.node(node).expect("node")["spec"]["unschedulable"] == json!(true)
    }

    /// A repair that never drains still names its Node, as CKE's entries do, and ends with
    /// an Event on it; a machine that is no node has neither.
    #[test]
    fn a_repair_without_a_drain_names_its_node_and_leaves_an_event() -> Result<()> {
        let env = start(60, |fake| {
            fake.add_node(NodeSeed::new("node-5", "10.0.0.5"));
        })?;
        // The coordinator's node view has listed the Nodes (it does at start).
        wait_for("the node view's first list", SETTLE, || {
            let listed = env.fake.requests().iter().any(|r| {
                r.method == "GET" && r.path == "/api/v1/nodes" && !r.query.contains("watch")
            });
            if listed {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        })?;
        std::thread::sleep(Duration::from_millis(300));
        let node = String::from_utf8(
            env.rq(&["add", "--force", "unhealthy", "quick", "10.0.0.5"])?
                .stdout,
        )?;
        let other = String::from_utf8(
            env.rq(&["add", "--force", "unhealthy", "quick", "10.0.0.99"])?
                .stdout,
        )?;
        let e = env.wait_entry(node.trim(), "succeeded", |e| e["status"] == "succeeded")?;
        assert_eq!(e["nodename"], "node-5", "{e}");
        let e = env.wait_entry(other.trim(), "succeeded", |e| e["status"] == "succeeded")?;
        assert_eq!(e["nodename"], "", "{e}");
        wait_for("FleetmendRepaired on node-5", SETTLE, || {
            let r = env.fake.node_event_reasons("node-5");
            if r.iter().any(|x| x == "FleetmendRepaired") {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        })?;
        assert!(!unschedulable(&env.fake, "node-5"));
        Ok(())
    }

    #[test]
    fn coordinator_drains_through_kubernetes_and_keeps_an_admins_cordon() -> Result<()> {
        let env = start(60, |fake| {
            fake.add_node(NodeSeed::new("node-1", "10.0.0.1"));
            fake.add_node(NodeSeed::new("node-2", "10.0.0.2").cordoned());
            fake.add_pod(PodSeed::new("prod", "web-1", "node-1").owner("ReplicaSet", "web"));
            fake.add_pod(
                PodSeed::new("kube-system", "agent-1", "node-1").owner("DaemonSet", "agent"),
            );
            fake.add_pod(PodSeed::new("kube-system", "etcd-node-1", "node-1").mirror());
            fake.add_pod(
                PodSeed::new("dev", "tool", "node-1")
                    .owner("ReplicaSet", "tool")
                    .label("app", "tool"),
            );
            fake.add_pdb("dev", "tool", json!({"matchLabels": {"app": "tool"}}), 0);
            fake.add_pod(
                PodSeed::new("prod", "db-0", "node-1")
                    .owner("StatefulSet", "db")
                    .terminate_after(Duration::from_millis(1500)),
            );
            fake.add_pod(PodSeed::new("prod", "web-2", "node-2").owner("ReplicaSet", "web"));
            fake.add_node(NodeSeed::new("node-3", "10.0.0.3"));
        })?;
        let one = env.add("10.0.0.1")?;
        let two = env.add("10.0.0.2")?;
        let three = String::from_utf8(
            env.rq(&["add", "--force", "unhealthy", "broken", "10.0.0.3"])?
                .stdout,
        )?
        .trim()
        .to_string();
        // A machine that is not a node is repaired without a drain.
        let other = env.add("10.0.0.9")?;

        // While the StatefulSet pod terminates, the entry is draining and the command waits.
        env.wait_entry(&one, "draining", |e| e["step_status"] == "draining")?;
        assert!(unschedulable(&env.fake, "node-1"));
        assert!(
            !env.repaired("10.0.0.1"),
            "the repair command waits for the drain"
        );

        for idx in [&one, &two, &other] {
            env.wait_entry(idx, "succeeded", |e| e["status"] == "succeeded")?;
        }
        assert!(env.repaired("10.0.0.1") && env.repaired("10.0.0.2") && env.repaired("10.0.0.9"));
        let fake = &env.fake;
        assert!(fake.pod("prod", "web-1").is_none() && fake.pod("prod", "db-0").is_none());
        assert!(
            fake.pod("dev", "tool").is_none(),
            "unprotected pod deleted past its budget"
        );
        assert!(
            fake.pod("kube-system", "agent-1").is_some()
                && fake.pod("kube-system", "etcd-node-1").is_some()
        );
        assert!(
            fake.pod("prod", "web-2").is_none(),
            "node-2 was drained too"
        );

        // Finished entries uncordon only what Fleetmend cordoned.
        wait_for("node-1 uncordoned", SETTLE, || {
            if unschedulable(fake, "node-1") {
                Err("still cordoned".into())
            } else {
                Ok(())
            }
        })?;
        assert!(
            unschedulable(fake, "node-2"),
            "the admin's cordon survives the repair"
        );

        let h = env.history(&one)?;
        let pos = |ev: &str| h.iter().position(|(e, _)| e == ev);
        assert!(pos("drain-started") < pos("succeeded"), "{h:?}");
        let reasons = fake.node_event_reasons("node-1");
        assert_eq!(
            &reasons[..2],
            ["FleetmendCordoned", "FleetmendDrained"],
            "{reasons:?}"
        );
        let has = |node: &str, reason: &str| {
            let r = fake.node_event_reasons(node);
            if r.iter().any(|x| x == reason) {
                Ok(())
            } else {
                Err(format!("{node}: {r:?}"))
            }
        };
        wait_for("Uncordoned and Repaired events", SETTLE, || {
            has("node-1", "FleetmendUncordoned")?;
            has("node-1", "FleetmendRepaired")
        })?;
        // A failing repair after its drain: failed, uncordoned, and said so on the Node.
        env.wait_entry(&three, "failed", |e| e["status"] == "failed")?;
        wait_for("node-3 failure recorded and uncordoned", SETTLE, || {
            has("node-3", "FleetmendDrained")?;
            has("node-3", "FleetmendRepairFailed")?;
            if unschedulable(fake, "node-3") {
                Err("node-3 still cordoned".into())
            } else {
                Ok(())
            }
        })?;
        let r2 = fake.node_event_reasons("node-2");
        assert!(
            r2.contains(&"FleetmendDrained".to_string())
                && !r2.iter().any(|r| r.ends_with("Cordoned")),
            "{r2:?}"
        );
        assert!(fake.node_event_reasons("node-9").is_empty());
        Ok(())
    }

    #[test]
    fn blocked_drains_back_off_and_succeed_once_unblocked() -> Result<()> {
        let env = start(3, |fake| {
            fake.add_node(NodeSeed::new("node-1", "10.0.0.1"));
            fake.add_node(NodeSeed::new("node-2", "10.0.0.2"));
            // node-1: a budget that allows no disruption.
            fake.add_pod(
                PodSeed::new("prod", "web-1", "node-1")
                    .owner("ReplicaSet", "web")
                    .label("app", "web"),
            );
            fake.add_pdb("prod", "web", json!({"matchLabels": {"app": "web"}}), 0);
            // node-2: a running Job pod (every Job pod is protected when protected_job_pods is unset).
            fake.add_pod(PodSeed::new("prod", "batch-1", "node-2").owner("Job", "batch"));
            fake.add_pod(PodSeed::new("prod", "web-9", "node-2").owner("ReplicaSet", "web9"));
        })?;
        let one = env.add("10.0.0.1")?;
        let two = env.add("10.0.0.2")?;

        // The Job pod makes node-2's drain back off at once; the budget makes node-1's time
        // out after eviction_timeout_seconds. Both are uncordoned and backed off.
        for idx in [&two, &one] {
            env.wait_entry(idx, "drain backed off", |e| {
                e["drain_backoff_count"] == 1 && e["step_status"] == "waiting"
            })?;
        }
        let h2 = env.history(&two)?;
        assert!(
            h2.iter()
                .any(|(e, d)| e == "drain-abandoned" && d.contains("prod/batch-1")),
            "{h2:?}"
        );
        let h1 = env.history(&one)?;
        assert!(
            h1.iter()
                .any(|(e, d)| e == "drain-abandoned" && d.contains("eviction_timeout_seconds")),
            "{h1:?}"
        );
        let fake = &env.fake;
        wait_for("both uncordoned", SETTLE, || {
            if unschedulable(fake, "node-1") || unschedulable(fake, "node-2") {
                Err("cordoned".into())
            } else {
                Ok(())
            }
        })?;
        assert!(fake.pod("prod", "web-1").is_some() && fake.pod("prod", "web-9").is_some());
        assert!(!env.repaired("10.0.0.1") && !env.repaired("10.0.0.2"));
        assert!(
            fake.node_event_reasons("node-1")
                .contains(&"FleetmendDrainBlockedByBudget".to_string())
        );
        assert!(
            fake.node_event_reasons("node-2")
                .contains(&"FleetmendDrainAbandoned".to_string())
        );

        // The budget frees up and the Job finishes; the operator resets the backoff.
        fake.set_disruptions_allowed("prod", "web", 1);
        fake.remove_pod("prod", "batch-1");
        env.rq(&["reset-backoff"])?;
        for idx in [&one, &two] {
            env.wait_entry(idx, "succeeded", |e| e["status"] == "succeeded")?;
        }
        assert!(fake.pod("prod", "web-1").is_none() && fake.pod("prod", "web-9").is_none());
        assert!(env.repaired("10.0.0.1") && env.repaired("10.0.0.2"));
        Ok(())
    }

    #[test]
    fn api_server_down_mid_drain_holds_the_entry_and_it_resumes() -> Result<()> {
        let env = start(120, |fake| {
            fake.add_node(NodeSeed::new("node-1", "10.0.0.1"));
            fake.add_pod(
                PodSeed::new("prod", "db-0", "node-1")
                    .owner("StatefulSet", "db")
                    .terminate_after(Duration::from_millis(1500)),
            );
            fake.add_pod(PodSeed::new("prod", "web-1", "node-1").owner("ReplicaSet", "web"));
        })?;
        let one = env.add("10.0.0.1")?;
        env.wait_entry(&one, "draining", |e| e["step_status"] == "draining")?;
        env.fake.set_down(true);
        std::thread::sleep(Duration::from_secs(4));
        let e = env.entry(&one)?;
        assert_eq!(
            (e["status"].as_str(), e["step_status"].as_str()),
            (Some("processing"), Some("draining")),
            "{e}"
        );
        assert_eq!(
            e["drain_backoff_count"], 0,
            "an API outage is not a failed drain: {e}"
        );
        assert!(!env.repaired("10.0.0.1"));
        env.coord
            .wait_for_log(&["drain pass failed; retrying", "unavailable"], SETTLE)?;
        env.fake.set_down(false);
        env.wait_entry(&one, "succeeded", |e| e["status"] == "succeeded")?;
        assert!(env.fake.pods_on("node-1").is_empty());
        assert!(env.repaired("10.0.0.1"));
        Ok(())
    }

    #[test]
    fn an_unusable_kubernetes_section_stops_the_coordinator_with_64() -> Result<()> {
        for (section, needle) in [
            (
                "[kubernetes]\nkubeconfig = \"/nonexistent/kubeconfig\"\n",
                "cannot read kubeconfig /nonexistent/kubeconfig",
            ),
            ("[kubernetes]\nkubeconfg = \"/etc/k\"\n", "kubeconfg"),
        ] {
            let tmp = tempfile::tempdir()?;
            let pki = Pki::create(&tmp.path().join("pki"), "k8s.test")?;
            let opts = CoordinatorOptions {
                extra: section.to_string(),
                ..Default::default()
            };
            let err = match Coordinator::start(&tmp.path().join("coord"), &pki, &opts) {
                Ok(_) => anyhow::bail!("coordinator started with {section:?}"),
                Err(e) => format!("{e:#}"),
            };
            assert!(err.contains("exit status: 64"), "{err}");
            assert!(err.contains(needle), "{needle:?} not in {err}");
            // No API server was asked: the message must not blame one.
            assert!(!err.contains("API refused"), "{err}");
        }
        Ok(())
    }
}
