//! The `[kubernetes]` section on day one: an API server that cannot be reached, that refuses
//! the coordinator's identity (403, RBAC missing) or that answers again. `coordinator check`
//! must say what is wrong and where before the start, and the running coordinator must say
//! why it holds (`remediation status`) and recover by itself.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use testkit::fake_k8s::{FakeK8s, Fault, NodeSeed};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, free_tcp_port, wait_for};

/// Bound for anything a test waits on (node view refreshes every 300 ms here).
const SETTLE: Duration = Duration::from_secs(30);

/// A repair whose one step drains the machine's node first; its command leaves a mark.
const REPAIR_YML: &str = r#"
repair:
  max_concurrent_repairs: 10
  evict_retries: 0
  evict_interval: 0
  eviction_timeout_seconds: 60
  repair_procedures:
    - machine_types: ["worker"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["sh", "-c", "echo x >> @D@/repaired-$1", "repair"]
              need_drain: true
          health_check_command: ["sh", "-c", "echo true"]
"#;

fn start(dir: &Path, kubeconfig: &Path) -> Result<Coordinator> {
    let pki = Pki::create(&dir.join("pki"), "k8s.test")?;
    let repair = dir.join("cluster.yml");
    std::fs::write(
        &repair,
        REPAIR_YML.replace("@D@", &dir.display().to_string()),
    )?;
    let opts = CoordinatorOptions {
        extra: format!(
            "[repair]\nconfig = {:?}\n\n\
             [kubernetes]\nkubeconfig = {:?}\nrequest_timeout = \"2s\"\nnode_view_refresh = \"300ms\"\n\n\
             [remediation]\ninterval = \"300ms\"\n",
            repair.display().to_string(),
            kubeconfig.display().to_string()
        ),
        ..Default::default()
    };
    Coordinator::start(&dir.join("coord"), &pki, &opts)
}

/// `coordinator check`'s `kubernetes` line and exit code.
fn check(coord: &Coordinator) -> Result<(Option<i32>, String)> {
    let out = testkit::procs::command("coordinator")
        .arg("check")
        .arg("--config")
        .arg(&coord.config)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("kubernetes"))
        .unwrap_or_default()
        .to_string();
    Ok((out.status.code(), line))
}

fn forbid_nodes(fake: &FakeK8s) {
    fake.inject(Fault {
        path_contains: Some("/api/v1/nodes".into()),
        method: Some("GET".into()),
        status: 403,
        message: "nodes is forbidden: User \"system:serviceaccount:fleetmend:coordinator\" \
                  cannot list resource \"nodes\""
            .into(),
        times: None,
    });
}

/// A kubeconfig that parses and names its context but whose API server cannot be used was
/// "ok" in `coordinator check`: the operator learnt of it from a `node-view-stale` hold
/// when the first machine died.
#[test]
fn check_reaches_the_api_server_and_names_what_is_wrong() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    let tmp = tempfile::tempdir()?;
    let coord = start(tmp.path(), fake.kubeconfig())?;

    let (code, line) = check(&coord)?;
    assert_eq!(code, Some(0), "{line}");
    assert!(line.contains("may list Nodes"), "{line}");

    forbid_nodes(&fake);
    let (code, line) = check(&coord)?;
    assert_eq!(code, Some(64), "{line}");
    assert!(line.contains(&fake.url()), "names the server: {line}");
    assert!(
        line.contains("403") && line.contains("cannot list resource"),
        "{line}"
    );
    assert!(line.contains("docs/kubernetes.md#rbac"), "{line}");
    fake.clear_faults();

    // Something that is not an API server (another HTTP service, a wrong path prefix):
    // every API server has Nodes, so a 404 for their list says the address is wrong.
    fake.inject(Fault {
        path_contains: Some("/api/v1/nodes".into()),
        method: Some("GET".into()),
        status: 404,
        message: "the server could not find the requested resource".into(),
        times: None,
    });
    let (code, line) = check(&coord)?;
    assert_eq!(code, Some(64), "{line}");
    assert!(
        line.contains("does not look like a Kubernetes API server")
            && line.contains("kubeconfig's `server`"),
        "{line}"
    );
    fake.clear_faults();

    // A kubeconfig pointing at a port where nothing listens.
    let port = free_tcp_port();
    let closed = tmp.path().join("closed.yaml");
    let text = std::fs::read_to_string(fake.kubeconfig())?;
    std::fs::write(
        &closed,
        text.replace(&fake.url(), &format!("http://127.0.0.1:{port}")),
    )?;
    let config = std::fs::read_to_string(&coord.config)?;
    std::fs::write(
        &coord.config,
        config.replace(
            &format!("{:?}", fake.kubeconfig().display().to_string()),
            &format!("{:?}", closed.display().to_string()),
        ),
    )?;
    let (code, line) = check(&coord)?;
    assert_eq!(code, Some(64), "{line}");
    assert!(
        line.contains(&format!("127.0.0.1:{port}")) && line.contains("Connection refused"),
        "{line}"
    );
    Ok(())
}

/// The node-view-stale limit of `remediation status`.
fn view_limit(coord: &Coordinator) -> Result<Value> {
    let s: Value = coord.ctl_json(&["remediation", "status", "--json"])?;
    s["limits"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["rule"] == "node-view-stale"))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no node-view-stale limit in {s}"))
}

/// A coordinator whose identity may not list Nodes held with "Kubernetes view never loaded"
/// and nothing else: the 403 and its message were only in the log.
#[test]
fn a_refused_view_says_why_it_holds_and_recovers_when_the_api_answers() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    forbid_nodes(&fake);
    let tmp = tempfile::tempdir()?;
    let coord = start(tmp.path(), fake.kubeconfig())?;

    let l = wait_for("node-view-stale names the 403", SETTLE, || {
        let l = view_limit(&coord).map_err(|e| e.to_string())?;
        let s = l["sentence"].as_str().unwrap_or_default();
        if l["holding"] == true && s.contains("403") && s.contains("cannot list resource") {
            Ok(l)
        } else {
            Err(l.to_string())
        }
    })?;
    assert!(
        l["sentence"]
            .as_str()
            .unwrap_or_default()
            .contains("list nodes"),
        "{l}"
    );
    let m = coord.scrape()?;
    assert!(
        m.contains("fleetmend_kubernetes_view_refresh_failing 1"),
        "{m}"
    );
    assert!(
        m.contains("fleetmend_kubernetes_view_refreshed_timestamp_seconds 0.000"),
        "{m}"
    );

    fake.clear_faults();
    wait_for("the view is fresh again", SETTLE, || {
        let l = view_limit(&coord).map_err(|e| e.to_string())?;
        if l["holding"] == false && !l.to_string().contains("403") {
            Ok(())
        } else {
            Err(l.to_string())
        }
    })?;
    let m = coord.scrape()?;
    assert!(
        m.contains("fleetmend_kubernetes_view_refresh_failing 0"),
        "{m}"
    );
    Ok(())
}

/// An entry whose machine's Node cannot be looked up (403) held "processing, step 0,
/// waiting" with nothing in its history: the reason was only in the coordinator's log.
#[test]
fn an_entry_that_cannot_look_up_its_node_holds_and_says_why() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    fake.add_node(NodeSeed::new("node-1", "10.0.0.1"));
    forbid_nodes(&fake);
    let tmp = tempfile::tempdir()?;
    let coord = start(tmp.path(), fake.kubeconfig())?;
    let out = coord.ctl(&[
        "repair-queue",
        "add",
        "--force",
        "unhealthy",
        "worker",
        "10.0.0.1",
    ])?;
    let index = String::from_utf8(out.stdout)?.trim().to_string();
    let history = |coord: &Coordinator| -> Result<String, String> {
        let v: Value = coord
            .ctl_json(&["repair-queue", "show", &index, "--json"])
            .map_err(|e| e.to_string())?;
        Ok(v["history"].to_string())
    };
    let h = wait_for("node-lookup-failed in the history", SETTLE, || {
        let h = history(&coord)?;
        if h.contains("node-lookup-failed") && h.contains("403") {
            Ok(h)
        } else {
            Err(h)
        }
    })?;
    // Once per distinct error, however many retries.
    std::thread::sleep(Duration::from_secs(6));
    let h2 = history(&coord).map_err(anyhow::Error::msg)?;
    assert_eq!(h2.matches("node-lookup-failed").count(), 1, "{h2}");
    assert!(
        !tmp.path().join("repaired-10.0.0.1").exists(),
        "ran without its drain: {h}"
    );

    fake.clear_faults();
    wait_for("the entry succeeds once the API answers", SETTLE, || {
        let v: Value = coord
            .ctl_json(&["repair-queue", "show", &index, "--json"])
            .map_err(|e| e.to_string())?;
        if v["status"] == "succeeded" {
            Ok(())
        } else {
            Err(v["history"].to_string())
        }
    })?;
    assert!(tmp.path().join("repaired-10.0.0.1").exists());
    Ok(())
}

/// A node cordoned by Fleetmend whose entry is gone (the uncordon at the entry's end gave up
/// while the API server was down, or the coordinator was killed between the end and the
/// uncordon) stayed cordoned for good: nothing looked at it again, across restarts too.
/// An admin's cordon (no Fleetmend annotation) is never touched.
#[test]
fn a_cordon_no_entry_owns_is_lifted_and_an_admins_is_kept() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    fake.add_node(
        NodeSeed::new("node-1", "10.0.0.1")
            .cordoned()
            .annotation("fleetmend.io/cordoned-by", "fleetmend-coordinator"),
    );
    fake.add_node(NodeSeed::new("node-2", "10.0.0.2").cordoned());
    let tmp = tempfile::tempdir()?;
    let coord = start(tmp.path(), fake.kubeconfig())?;
    let unschedulable = |n: &str| {
        fake.node(n)
            .is_some_and(|v| v["spec"]["unschedulable"] == true)
    };
    wait_for("node-1 uncordoned", Duration::from_secs(60), || {
        if unschedulable("node-1") {
            Err("still cordoned".to_string())
        } else {
            Ok(())
        }
    })?;
    let n1 = fake.node("node-1").unwrap_or_default();
    assert!(
        n1["metadata"]["annotations"]["fleetmend.io/cordoned-by"].is_null(),
        "{n1}"
    );
    assert!(unschedulable("node-2"), "an admin's cordon stays");
    coord.wait_for_log(&["no active entry; uncordoning it"], SETTLE)?;
    Ok(())
}

/// While the API server refuses every Node list, the watch retried about once a second
/// (kube's backoff did not grow), each retry a request and an ERROR line, all night. It now
/// backs off (1 s doubling to a minute); the poller goes on at `node_view_refresh`.
#[test]
fn a_failing_node_watch_backs_off() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    fake.inject(Fault {
        path_contains: Some("/api/v1/nodes".into()),
        method: Some("GET".into()),
        status: 503,
        message: "etcd leader changed".into(),
        times: None,
    });
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "k8s.test")?;
    let opts = CoordinatorOptions {
        extra: format!(
            "[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"30s\"\n",
            fake.kubeconfig().display().to_string()
        ),
        ..Default::default()
    };
    let _coord = Coordinator::start(&tmp.path().join("coord"), &pki, &opts)?;
    let lists = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/api/v1/nodes")
            .count()
    };
    let start = lists();
    std::thread::sleep(Duration::from_secs(14));
    let n = lists() - start;
    // Backing off: attempts near 1, 3, 7 and 15 s (and kube's own waits on top); without
    // it, about one a second.
    assert!(
        n <= 6,
        "{n} Node lists in 14 s while the API server answered 503"
    );
    Ok(())
}

/// A coordinator killed mid-drain (a budget holds the last pod) resumes the drain after
/// its restart, keeps its cordon while it does, and uncordons the node when the entry ends.
#[test]
fn a_coordinator_killed_mid_drain_resumes_it_and_uncordons_at_the_end() -> Result<()> {
    let fake = FakeK8s::start_background()?;
    fake.add_namespace("prod", &[]);
    fake.add_node(NodeSeed::new("node-1", "10.0.0.1"));
    fake.add_pod(
        testkit::fake_k8s::PodSeed::new("prod", "db-0", "node-1")
            .owner("StatefulSet", "db")
            .label("app", "db"),
    );
    fake.add_pdb(
        "prod",
        "db",
        serde_json::json!({"matchLabels": {"app": "db"}}),
        0,
    );
    let tmp = tempfile::tempdir()?;
    let mut coord = start(tmp.path(), fake.kubeconfig())?;
    let out = coord.ctl(&[
        "repair-queue",
        "add",
        "--force",
        "unhealthy",
        "worker",
        "10.0.0.1",
    ])?;
    let index = String::from_utf8(out.stdout)?.trim().to_string();
    let cordoned = |fake: &FakeK8s| {
        fake.node("node-1")
            .is_some_and(|v| v["spec"]["unschedulable"] == true)
    };
    wait_for("node-1 cordoned by the drain", SETTLE, || {
        if cordoned(&fake) {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })?;
    coord.proc.take().expect("running").sigkill();
    coord.restart()?;
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        cordoned(&fake),
        "the drain's cordon stays while the entry drains"
    );
    assert!(
        !tmp.path().join("repaired-10.0.0.1").exists(),
        "ran before its drain"
    );
    fake.set_disruptions_allowed("prod", "db", 1);
    wait_for("the entry succeeds", SETTLE, || {
        let v: Value = coord
            .ctl_json(&["repair-queue", "show", &index, "--json"])
            .map_err(|e| e.to_string())?;
        if v["status"] == "succeeded" {
            Ok(())
        } else {
            Err(v["history"].to_string())
        }
    })?;
    assert!(tmp.path().join("repaired-10.0.0.1").exists());
    wait_for("node-1 uncordoned", SETTLE, || {
        if cordoned(&fake) {
            Err("still cordoned".to_string())
        } else {
            Ok(())
        }
    })?;
    Ok(())
}
