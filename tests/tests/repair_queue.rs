//! Issue 3's end-to-end "must show": a real coordinator process with a CKE-style
//! `cluster.yml` whose repair commands are small shell scripts, driven by
//! `coordinatorctl repair-queue` exactly as an operator would:
//! - a two-step procedure whose first watch expires and whose second step succeeds,
//! - a failing repair command marks the entry failed,
//! - a failing success command turns success into failed,
//! - `disable` stops new work while health checks still finish entries,
//! - `delete` of a running entry cancels it (its command is killed),
//! - a hung command is killed at its timeout while another entry completes meanwhile,
//! - SIGKILL of the coordinator mid-step, then a restart: the entry continues where it stood
//!   and a completed step's command is not run again (counter files prove it),
//! - `add` refuses unknown procedures and malformed addresses; a bad repair file stops the
//!   coordinator with exit code 64 naming the key;
//! - `@agent-healthy` follows a real node-agent's reports;
//! - `bench_10000_entries` (ignored, run by name) is the queue's benchmark.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, wait_for};

/// Bound for anything the test causes (commands are instant; watches are a few seconds).
const SETTLE: Duration = Duration::from_secs(40);

/// A CKE cluster.yml: the `repair:` section is what CKE's docs describe; the other keys are
/// there to prove they are ignored. `@D@` is replaced by the test's directory.
const CLUSTER_YML: &str = r#"
name: e2e
nodes:
  - address: 10.0.0.1
    user: cybozu
service_subnet: 10.34.56.0/24
reboot:
  reboot_command: ["true"]
  boot_check_command: ["sh", "-c", "echo true"]
repair:
  max_concurrent_repairs: 10
  evict_retries: 1
  evict_interval: 1
  eviction_timeout_seconds: 60
  protected_namespaces:
    matchLabels:
      team: core
  repair_procedures:
    - machine_types: ["twostep"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo x >> @D@/step0-$1", "step0"]
              watch_seconds: 3
            - repair_command: ["sh", "-c", "echo x >> @D@/step1-$1; touch @D@/healthy-$1", "step1"]
              need_drain: true
              watch_seconds: 30
          health_check_command: ["sh", "-c", "test -f @D@/healthy-$1 && echo true || echo false", "check"]
          command_timeout_seconds: 10
    - machine_types: ["broken"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo cannot reach BMC of $1 >&2; exit 2", "broken"]
          health_check_command: ["sh", "-c", "echo false"]
    - machine_types: ["badsuccess"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["true"]
          health_check_command: ["sh", "-c", "echo true"]
          success_command: ["sh", "-c", "echo notify failed for $1; exit 1", "notify"]
    - machine_types: ["longrun"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo $$ > @D@/pid-$1; exec sleep 120", "long"]
              command_timeout_seconds: 0
          health_check_command: ["sh", "-c", "echo false"]
    - machine_types: ["hung"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo $$ > @D@/pid-$1; exec sleep 120", "hung"]
              command_timeout_seconds: 3
          health_check_command: ["sh", "-c", "echo false"]
    - machine_types: ["quick"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["true"]
              watch_seconds: 60
          health_check_command: ["sh", "-c", "test -f @D@/healthy-$1 && echo true || echo false", "check"]
        - operation: "instant"
          repair_steps:
            - repair_command: ["true"]
          health_check_command: ["sh", "-c", "echo true"]
options:
  kubelet:
    extra_args: ["--v=2"]
"#;

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pki: Pki,
    coord: Coordinator,
}

fn start(yaml: &str) -> anyhow::Result<Env> {
    start_with(yaml, None)
}

fn start_with(yaml: &str, inventory: Option<String>) -> anyhow::Result<Env> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
    let cluster = dir.join("cluster.yml");
    std::fs::write(&cluster, yaml.replace("@D@", &dir.display().to_string()))?;
    let opts = CoordinatorOptions {
        extra: format!("[repair]\nconfig = {:?}\n", cluster.display().to_string()),
        inventory,
        ..Default::default()
    };
    let coord = Coordinator::start(&dir.join("coord"), &pki, &opts)?;
    Ok(Env {
        _tmp: tmp,
        dir,
        pki,
        coord,
    })
}

impl Env {
    fn rq(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut all = vec!["repair-queue"];
        all.extend_from_slice(args);
        self.coord.ctl(&all)
    }

    /// `repair-queue` that is expected to fail; returns its stderr.
    fn rq_fails(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["repair-queue"];
        all.extend_from_slice(args);
        let out = self.coord.ctl_command(&all).output()?;
        if out.status.success() {
            bail!("repair-queue {args:?} succeeded but should have failed");
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn add(&self, op: &str, machine_type: &str, address: &str) -> anyhow::Result<String> {
        let out = self.rq(&["add", "--force", op, machine_type, address])?;
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    /// `repair-queue list --json` (CKE's shape).
    fn list(&self) -> anyhow::Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }

    fn entry(&self, index: &str) -> anyhow::Result<Option<Value>> {
        Ok(self.list()?.into_iter().find(|e| e["index"] == index))
    }

    fn show(&self, index: &str) -> anyhow::Result<Value> {
        self.coord
            .ctl_json(&["repair-queue", "show", index, "--json"])
    }

    fn events(&self, index: &str) -> anyhow::Result<Vec<String>> {
        Ok(self.show(index)?["history"]
            .as_array()
            .context("history")?
            .iter()
            .map(|h| h["event"].as_str().unwrap_or("").to_string())
            .collect())
    }

    /// Waits until entry `index` satisfies `f`.
    fn wait_entry(
        &self,
        index: &str,
        what: &str,
        f: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        wait_for(&format!("entry {index}: {what}"), SETTLE, || {
            match self.entry(index) {
                Ok(Some(e)) if f(&e) => Ok(e),
                Ok(e) => Err(format!("{e:?}; history {:?}", self.show(index).ok())),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn status_is(&self, index: &str, status: &str) -> anyhow::Result<Value> {
        self.wait_entry(index, status, |e| e["status"] == status)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn process_gone(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z")
}

fn read_pid(path: &Path) -> anyhow::Result<String> {
    wait_for(
        &format!("pid file {}", path.display()),
        SETTLE,
        || match std::fs::read_to_string(path) {
            Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            _ => Err("not written yet".into()),
        },
    )
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn repair_queue_semantics_end_to_end() -> anyhow::Result<()> {
    let env = start(CLUSTER_YML)?;
    // The CKE cluster.yml loaded: other top-level keys were noticed and ignored.
    env.coord
        .wait_for_log(&["ignoring top-level keys", "nodes"], SETTLE)?;
    assert_eq!(
        String::from_utf8(env.rq(&["is-enabled"])?.stdout)?.trim(),
        "true"
    );

    // add refuses what no procedure covers, and malformed addresses.
    let err = env.rq_fails(&["add", "--force", "unreachable", "nosuchtype", "10.1.0.1"])?;
    assert!(
        err.contains("no repair procedure for machine type `nosuchtype`"),
        "{err}"
    );
    let err = env.rq_fails(&["add", "--force", "reboot", "twostep", "10.1.0.1"])?;
    assert!(err.contains("has no operation `reboot`"), "{err}");
    let err = env.rq_fails(&["add", "--force", "unreachable", "twostep", "10.1.0"])?;
    assert!(err.contains("not an IP address"), "{err}");

    // Two steps: step 0's watch expires (still unhealthy), step 1 (need_drain on a machine
    // that is not a node: no drain) makes it healthy.
    let two = env.add("unreachable", "twostep", "10.1.0.1")?;
    // A failing repair command.
    let broken = env.add("unreachable", "broken", "10.1.0.2")?;
    // A failing success command.
    let badsuccess = env.add("unreachable", "badsuccess", "10.1.0.3")?;
    // A hung command (timeout 3 s) while another entry completes.
    let hung = env.add("unreachable", "hung", "10.1.0.4")?;
    let quick = env.add("instant", "quick", "10.1.0.5")?;
    // A long command that will be deleted while it runs.
    let long = env.add("unreachable", "longrun", "10.1.0.6")?;

    let e = env.status_is(&quick, "succeeded")?;
    assert_eq!(e["step"], 0);
    let h = env.entry(&hung)?.context("hung entry")?;
    assert_eq!(
        h["status"], "processing",
        "the hung entry is still running: {h}"
    );
    assert_eq!(h["step_status"], "watching");

    let e = env.status_is(&broken, "failed")?;
    assert_eq!(e["step"], 0);
    let show = env.show(&broken)?;
    let failed = show["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["event"] == "failed")
        .context("failed event")?;
    assert!(
        failed["detail"].as_str().unwrap().contains("exit status 2"),
        "{failed}"
    );
    assert!(
        failed["output"]
            .as_str()
            .unwrap()
            .contains("cannot reach BMC of 10.1.0.2"),
        "{failed}"
    );

    env.status_is(&badsuccess, "failed")?;
    let ev = env.events(&badsuccess)?;
    assert!(
        ev.contains(&"healthy".to_string()) && ev.last().unwrap() == "failed",
        "{ev:?}"
    );
    let show = env.show(&badsuccess)?;
    let last = show["history"].as_array().unwrap().last().unwrap().clone();
    assert!(
        last["detail"]
            .as_str()
            .unwrap()
            .contains("success command failed"),
        "{last}"
    );
    assert!(
        last["output"]
            .as_str()
            .unwrap()
            .contains("notify failed for 10.1.0.3"),
        "{last}"
    );

    // Hung command: killed at its timeout, the entry fails saying so, its process is gone.
    let hung_pid = read_pid(&env.path("pid-10.1.0.4"))?;
    env.status_is(&hung, "failed")?;
    let show = env.show(&hung)?;
    assert!(show.to_string().contains("timed out after 3 s"), "{show}");
    wait_for("hung command killed", SETTLE, || {
        if process_gone(&hung_pid) {
            Ok(())
        } else {
            Err(format!("pid {hung_pid} alive"))
        }
    })?;

    // Delete of a running entry: its command is killed and the entry leaves the queue.
    let long_pid = read_pid(&env.path("pid-10.1.0.6"))?;
    assert!(!process_gone(&long_pid));
    env.rq(&["delete", &long])?;
    wait_for("deleted entry dequeued", SETTLE, || {
        match env.entry(&long) {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    wait_for("deleted entry's command killed", SETTLE, || {
        if process_gone(&long_pid) {
            Ok(())
        } else {
            Err(format!("pid {long_pid} alive"))
        }
    })?;

    // The two-step entry.
    let e = env.status_is(&two, "succeeded")?;
    assert_eq!(e["step"], 1, "{e}");
    assert_eq!(e["nodename"], "");
    assert_eq!(count_lines(&env.path("step0-10.1.0.1")), 1);
    assert_eq!(count_lines(&env.path("step1-10.1.0.1")), 1);
    let ev = env.events(&two)?;
    let pos = |name: &str| ev.iter().position(|e| e == name);
    assert!(
        pos("next-step").is_some() && pos("next-step") < pos("succeeded"),
        "{ev:?}"
    );
    assert!(
        !ev.iter().any(|e| e.starts_with("drain")),
        "not a node, no drain: {ev:?}"
    );

    // CKE's JSON shape.
    let e = env.entry(&two)?.unwrap();
    for k in [
        "index",
        "address",
        "nodename",
        "machine_type",
        "operation",
        "status",
        "step",
        "step_status",
        "deleted",
        "last_transition_time",
        "drain_backoff_count",
        "drain_backoff_expire",
    ] {
        assert!(e.get(k).is_some(), "missing {k} in {e}");
    }
    assert!(e["index"].is_string());
    assert_eq!(e["drain_backoff_expire"], "0001-01-01T00:00:00Z");

    // wait returns once nothing is queued or processing; metrics agree.
    env.rq(&["wait", "--timeout-seconds", "30"])?;
    let (code, metrics) = env.coord.http_get("/metrics")?;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("fleetmend_repair_queue_items{status=\"succeeded\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fleetmend_repair_queue_items{status=\"failed\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fleetmend_repair_queue_enabled 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fleetmend_repair_commands_total{kind=\"repair\",result=\"timeout\"} 1"),
        "{metrics}"
    );

    // delete-finished empties the queue; indexes are never reused.
    env.rq(&["delete-finished"])?;
    wait_for("finished entries dequeued", SETTLE, || match env.list() {
        Ok(l) if l.is_empty() => Ok(()),
        other => Err(format!("{other:?}")),
    })?;
    let next = env.add("instant", "quick", "10.1.0.5")?;
    assert_eq!(next.parse::<u64>()?, long.parse::<u64>()? + 1);
    Ok(())
}

#[test]
fn disable_stops_new_work_while_health_checks_finish_entries() -> anyhow::Result<()> {
    let env = start(CLUSTER_YML)?;
    let a = env.add("unreachable", "quick", "10.2.0.1")?;
    env.wait_entry(&a, "watching", |e| e["step_status"] == "watching")?;
    wait_for("command completed", SETTLE, || match env.events(&a) {
        Ok(ev) if ev.iter().any(|e| e == "command-succeeded") => Ok(()),
        other => Err(format!("{other:?}")),
    })?;
    let said = String::from_utf8(env.rq(&["disable"])?.stdout)?;
    assert!(said.starts_with("repair queue disabled"), "{said}");
    assert_eq!(
        String::from_utf8(env.rq(&["is-enabled"])?.stdout)?.trim(),
        "false"
    );
    let b = env.add("instant", "quick", "10.2.0.2")?;
    // The machine becomes healthy: the health check still runs and finishes the entry.
    std::fs::write(env.path("healthy-10.2.0.1"), "")?;
    env.status_is(&a, "succeeded")?;
    // Nothing new started meanwhile, and still nothing a while later.
    std::thread::sleep(Duration::from_secs(2));
    let e = env.entry(&b)?.context("b")?;
    assert_eq!(e["status"], "queued", "{e}");
    let err = env.rq_fails(&["wait", "--timeout-seconds", "1"])?;
    assert!(err.contains("timed out"), "{err}");
    env.rq(&["enable"])?;
    env.status_is(&b, "succeeded")?;
    // The flag is durable: disabled before a clean restart (SIGTERM, exit 0), still
    // disabled after it.
    env.rq(&["disable"])?;
    let mut env = env;
    env.coord.restart()?;
    assert_eq!(
        String::from_utf8(env.rq(&["is-enabled"])?.stdout)?.trim(),
        "false"
    );
    assert_eq!(env.list()?.len(), 2, "entries survive the restart");
    Ok(())
}

#[test]
fn sigkill_mid_step_resumes_without_rerunning_a_completed_command() -> anyhow::Result<()> {
    let mut env = start(CLUSTER_YML)?;
    let i = env.add("unreachable", "twostep", "10.3.0.1")?;
    // Step 0's command has completed; the entry is watching its health check.
    wait_for("step 0 command completed", SETTLE, || {
        match env.events(&i) {
            Ok(ev) if ev.iter().any(|e| e == "command-succeeded") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    let e = env.entry(&i)?.context("entry")?;
    assert_eq!(
        (e["step"].as_u64(), e["step_status"].as_str()),
        (Some(0), Some("watching")),
        "{e}"
    );
    env.coord.proc.take().context("running")?.sigkill();
    env.coord.restart()?;
    let e = env.status_is(&i, "succeeded")?;
    assert_eq!(e["step"], 1);
    assert_eq!(
        count_lines(&env.path("step0-10.3.0.1")),
        1,
        "step 0's command ran exactly once"
    );
    assert_eq!(
        count_lines(&env.path("step1-10.3.0.1")),
        1,
        "step 1's command ran exactly once"
    );
    Ok(())
}

#[test]
fn sigkill_while_a_command_runs_restarts_only_that_command() -> anyhow::Result<()> {
    // A step whose command is interrupted by the crash did not complete: it runs again
    // (once), and the entry finishes.
    let yaml = CLUSTER_YML.replace(
        r#"["sh", "-c", "echo x >> @D@/step0-$1", "step0"]"#,
        r#"["sh", "-c", "echo x >> @D@/step0-$1; test -f @D@/resumed || { touch @D@/resumed; echo $$ > @D@/orphan; exec sleep 120; }", "step0"]"#,
    );
    let mut env = start(&yaml)?;
    let i = env.add("unreachable", "twostep", "10.4.0.1")?;
    wait_for("step 0 command started", SETTLE, || {
        if env.path("resumed").exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })?;
    env.coord.proc.take().context("running")?.sigkill();
    env.coord.restart()?;
    env.status_is(&i, "succeeded")?;
    assert_eq!(
        count_lines(&env.path("step0-10.4.0.1")),
        2,
        "interrupted command ran again once"
    );
    assert_eq!(count_lines(&env.path("step1-10.4.0.1")), 1);
    let ev = env.events(&i)?;
    assert_eq!(
        ev.iter().filter(|e| *e == "command-started").count(),
        3,
        "{ev:?}"
    );
    // The killed coordinator could not reap its command; end that orphan by its pid.
    let orphan = read_pid(&env.path("orphan"))?;
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &orphan])
        .status();
    Ok(())
}

#[test]
fn agent_healthy_builtin_follows_the_agents_reports() -> anyhow::Result<()> {
    use testkit::fixture::{AgentConfig, NodeFixture};
    use testkit::procs::{inventory_toml, start_agent};

    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"true\"]\n              watch_seconds: 60\n          health_check_command: [\"@agent-healthy\"]\n";
    let env = start_with(yaml, Some(inventory_toml(&[("10.6.0.1", "node-a")])))?;
    let fixture = NodeFixture::builder("node-a")
        .nic("eth0")
        .mount("/var")
        .address("10.6.0.1".parse()?)
        .build()?;
    fixture.set_carrier("eth0", false)?;
    let tls = Coordinator::agent_tls(&env.pki, "node-a")?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&env.coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_millis(300)),
    )?;
    let _agent = start_agent("node-a", &cfg, &env.dir.join("node-a.log"))?;
    env.coord.wait_for_state("node-a", "unhealthy", SETTLE)?;

    let i = env.add("unhealthy", "qemu", "10.6.0.1")?;
    wait_for("a failed @agent-healthy check", SETTLE, || {
        match env.events(&i) {
            Ok(ev) if ev.iter().any(|e| e == "health-check-failed") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let e = env.entry(&i)?.context("entry")?;
    assert_eq!(
        e["status"], "processing",
        "a failing check keeps it unhealthy: {e}"
    );
    let show = env.show(&i)?;
    assert!(show.to_string().contains("failing check"), "{show}");

    // The NIC recovers: the agent's next reports are all ok, @agent-healthy passes.
    fixture.set_carrier("eth0", true)?;
    env.status_is(&i, "succeeded")?;
    Ok(())
}

#[test]
fn a_bad_repair_file_stops_the_coordinator_naming_the_key() -> anyhow::Result<()> {
    let yaml = CLUSTER_YML.replace(
        "watch_seconds: 3\n",
        "watch_seconds: 3\n              repair_comand: [x]\n",
    );
    let err = match start(&yaml) {
        Ok(_) => bail!("coordinator started with a bad repair file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(
            "repair.repair_procedures[0].repair_operations[0].repair_steps[0].repair_comand"
        ),
        "{err}"
    );
    assert!(err.contains("exit status: 64"), "{err}");
    Ok(())
}

/// Benchmark (run by name, release build):
/// `cargo test --release -p fleetmend-tests --test repair_queue -- --ignored --nocapture bench_10000_entries`.
/// Enqueues 10,000 entries through the admin API over one QUIC connection (64 requests in
/// flight) and runs them with no-op commands; prints enqueue and completion throughput and
/// the SQLite file size.
#[test]
#[ignore = "benchmark: run by name"]
fn bench_10000_entries() -> anyhow::Result<()> {
    use coordinator::ctl::{AdminClient, ConnectArgs};
    use futures::StreamExt;
    use protocol::admin::repair::{AddRepairEntry, RepairQueueRequest, RepairQueueResponse};
    use protocol::admin::{AdminRequest, AdminResponse};

    const N: u32 = 10_000;
    const IN_FLIGHT: usize = 64;
    // The health check is `sh -c 'echo true' <address>`: `echo true <address>` would not
    // print exactly `true`.
    let yaml = "repair:\n  max_concurrent_repairs: 100\n  repair_procedures:\n    - machine_types: [noop]\n      repair_operations:\n        - operation: bench\n          repair_steps:\n            - repair_command: [\"true\"]\n          health_check_command: [\"sh\", \"-c\", \"echo true\"]\n";
    let env = start(yaml)?;
    let args = ConnectArgs {
        server: Some(env.coord.quic.to_string()),
        server_name: None,
        ca: Some(env.coord.admin.ca.clone()),
        cert: Some(env.coord.admin.cert.clone()),
        key: Some(env.coord.admin.key.clone()),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = AdminClient::connect(&args).await?;
        let started = std::time::Instant::now();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..N)
            .map(|i| {
                let client = &client;
                async move {
                    let req = AdminRequest::RepairQueue(RepairQueueRequest::Add(AddRepairEntry {
                        operation: "bench".into(),
                        machine_type: "noop".into(),
                        address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                        serial: String::new(),
                    }));
                    match client.request(&req).await? {
                        AdminResponse::RepairQueue(RepairQueueResponse::Added(_)) => Ok(()),
                        other => bail!("unexpected {other:?}"),
                    }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for r in results {
            r?;
        }
        let enqueued = started.elapsed();
        println!(
            "enqueue: {N} entries in {:.2} s = {:.0} entries/s",
            enqueued.as_secs_f64(),
            f64::from(N) / enqueued.as_secs_f64()
        );
        let counts = loop {
            match client
                .request(&AdminRequest::RepairQueue(RepairQueueRequest::Counts))
                .await?
            {
                AdminResponse::RepairQueue(RepairQueueResponse::Counts(c))
                    if c.succeeded + c.failed == u64::from(N) =>
                {
                    break c;
                }
                AdminResponse::RepairQueue(RepairQueueResponse::Counts(_)) => {}
                other => bail!("unexpected {other:?}"),
            }
            if started.elapsed() > Duration::from_secs(1800) {
                bail!("not finished after 30 minutes");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let done = started.elapsed();
        assert_eq!(counts.succeeded, u64::from(N), "{counts:?}");
        println!(
            "completion: {N} entries (2 processes each) in {:.2} s after the first add = {:.0} entries/s",
            done.as_secs_f64(),
            f64::from(N) / done.as_secs_f64()
        );
        client.close().await;
        anyhow::Ok(())
    })?;
    let db = env.coord.dir.join("coordinator.db");
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let wal = db.with_extension("db-wal");
    println!(
        "sqlite: {} bytes (+ {} bytes WAL) for {N} entries with their history",
        size(&db),
        size(&wal)
    );
    Ok(())
}
