//! Issue 10's end-to-end "must show": automatic remediation in a real coordinator process,
//! with real node-agents (each with a fake kubelet healthz it can break), the fake
//! Kubernetes API server with simulated kubelets renewing their Leases (and a node
//! lifecycle controller turning Ready Unknown when they stop), and repair procedures that
//! are small shell scripts. Everything is observed the way an operator would:
//! `coordinatorctl events`, `remediation status`, `repair-queue list`, Node Events.
//!
//! - (a) a kubelet fails → enqueued automatically with operation `unhealthy`, repaired;
//! - (b) a rack's agents and Leases stop at once → nothing enqueued, status names the rack;
//! - (c) the coordinator cut off from most agents (a UDP relay that drops their traffic),
//!   without `[kubernetes]` → nothing enqueued, status names the suspected partition, and
//!   nothing stale is enqueued when traffic returns;
//! - (d) an agent killed while its kubelet renews → "agent lost, node alive", no repair;
//! - (e) a 40 % gate over 5 machines holds the third failure;
//! - (f) observe mode → decisions journalled once (repeats counted), no entries; turning it
//!   off enqueues;
//! - (g) slow start: one repair in flight per rack, two after a success;
//! - (h) a pause that is lifted replays nothing that healed meanwhile;
//! - (i) a planned reboot (goodbye) waits `wait_seconds_to_repair_rebooting`; a crash
//!   next to it does not;
//! - (j) a repaired machine that fails again is repaired again once its succeeded entry is
//!   deleted (`delete_succeeded_after`), until escalation calls for a human.
//!
//! Intervals are short (reports 300 ms, passes 500 ms, Leases 500 ms); every wait is
//! bounded by [`SETTLE`] so a missing decision fails instead of hanging.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use testkit::ctl_json::{JournalLine, RemediationStatus};
use testkit::fake_k8s::{BackgroundFake, FakeK8s, NodeSeed};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, start_agent, wait_for};
use testkit::relay::UdpRelay;

/// Bound for anything a test causes (the machine is shared and loaded: generous).
const SETTLE: Duration = Duration::from_secs(60);
const REPORT: Duration = Duration::from_millis(300);

/// Repair procedures for machine type `qemu`: the repair command leaves a mark, the health
/// check passes once the test says the machine is healthy again.
const REPAIR_YML: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["qemu"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["sh", "-c", "touch @D@/repaired-$1", "repair"]
              watch_seconds: 600
          health_check_command: ["sh", "-c", "test -f @D@/healthy-$1 && echo true || echo false", "check"]
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "touch @D@/repaired-$1", "repair"]
              watch_seconds: 600
          health_check_command: ["sh", "-c", "test -f @D@/healthy-$1 && echo true || echo false", "check"]
"#;

/// One test machine: its agent, its kubelet healthz, and where it lives.
struct Node {
    addr: String,
    host: String,
    kubelet: FakeKubelet,
    fixture: NodeFixture,
    agent: Option<Proc>,
}

/// What a test sets up.
struct Setup {
    /// `(rack)` per machine; machine i is `10.0.1.{i+1}`, host `n{i+1}`.
    racks: Vec<&'static str>,
    kubernetes: bool,
    /// Keys of `[remediation]` itself.
    root: String,
    /// Sub-tables (`[remediation.auto_repair]`, `[[remediation.health_checks]]`, …).
    tables: String,
    health_extra: String,
    /// The first this-many agents reach the coordinator through a [`UdpRelay`] that the
    /// test can cut.
    relayed: usize,
}

impl Setup {
    fn new(racks: &[&'static str]) -> Self {
        Self {
            racks: racks.to_vec(),
            kubernetes: true,
            root: String::new(),
            tables: String::new(),
            health_extra: String::new(),
            relayed: 0,
        }
    }
}

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    coord: Coordinator,
    k8s: Option<BackgroundFake>,
    nodes: Vec<Node>,
    relay: Option<UdpRelay>,
}

fn inventory(racks: &[&str]) -> String {
    racks
        .iter()
        .enumerate()
        .map(|(i, rack)| {
            format!(
                "[[machines]]\naddress = \"10.0.1.{n}\"\nhostname = \"n{n}\"\nserial = \"SN{n}\"\n\
                 rack = \"{rack}\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n\n",
                n = i + 1
            )
        })
        .collect()
}

impl Env {
    fn start(s: Setup) -> anyhow::Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
        let repair = dir.join("repair.yml");
        std::fs::write(
            &repair,
            REPAIR_YML.replace("@D@", &dir.display().to_string()),
        )?;
        let k8s = if s.kubernetes {
            let fake = FakeK8s::start_background()?;
            for (i, _) in s.racks.iter().enumerate() {
                let host = format!("n{}", i + 1);
                fake.add_node(NodeSeed::new(&host, &format!("10.0.1.{}", i + 1)));
                fake.renew_lease(&host);
                fake.set_kubelet_alive(&host, true);
            }
            // Kubelets renew every 500 ms; a Node silent for 3 s turns Ready Unknown.
            fake.run_kubelets(Duration::from_millis(500), Duration::from_secs(3));
            Some(fake)
        } else {
            None
        };
        let mut extra = format!("[repair]\nconfig = {:?}\n\n", repair.display().to_string());
        if let Some(f) = &k8s {
            extra.push_str(&format!(
                "[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"1s\"\nrequest_timeout = \"5s\"\n\n",
                f.kubeconfig().display().to_string()
            ));
        }
        // A silence settles in 1 s here (reports every 300 ms), not the default 10 s.
        let settle = if s.tables.contains("self_isolation") {
            ""
        } else {
            "self_isolation = { settle = \"1s\" }\n"
        };
        extra.push_str(&format!(
            // The fixtures load a crash kernel but no kdump initramfs runs here: no kdump
            // wait (tests/tests/kdump.rs and the remediation unit tests cover it).
            "[remediation]\ninterval = \"500ms\"\nlease_stale = \"3s\"\nkdump_wait = \"0s\"\n{}\n\
             [remediation.limits]\nfleet_cap = {{ count = 10, percent = 100 }}\n{settle}{}\n",
            s.root, s.tables
        ));
        // A failing machine is proposed at once here: these tests are about what comes after
        // (the debounce has its own unit test).
        if !s.tables.contains("[remediation.auto_repair]") {
            extra.push_str("\n[remediation.auto_repair]\nunhealthy_for = \"0s\"\n");
        }
        let coord = Coordinator::start(
            &dir.join("coord"),
            &pki,
            &CoordinatorOptions {
                report_interval: REPORT,
                unreachable_grace: REPORT * 3,
                inventory: Some(inventory(&s.racks)),
                extra,
                health_extra: s.health_extra,
            },
        )?;
        let relay = (s.relayed > 0)
            .then(|| UdpRelay::start(coord.quic))
            .transpose()?;
        let mut nodes = Vec::new();
        for (i, _) in s.racks.iter().enumerate() {
            let server = match &relay {
                Some(r) if i < s.relayed => r.addr(),
                _ => coord.quic,
            };
            let host = format!("n{}", i + 1);
            let addr = format!("10.0.1.{}", i + 1);
            let fixture = NodeFixture::builder(&host).address(addr.parse()?).build()?;
            let kubelet = FakeKubelet::start()?;
            let tls = pki.issue("node", &host, &[])?;
            let cfg = fixture.write_agent_config(
                &AgentConfig::new(&server.to_string(), &tls.ca, &tls.cert, &tls.key)
                    .report_interval(REPORT)
                    .kubelet_url(&kubelet.url()),
            )?;
            let agent = start_agent(&host, &cfg, &dir.join(format!("{host}.log")))?;
            nodes.push(Node {
                addr,
                host,
                kubelet,
                fixture,
                agent: Some(agent),
            });
        }
        for n in &nodes {
            coord.wait_for_state(&n.host, "healthy", SETTLE)?;
        }
        Ok(Self {
            _tmp: tmp,
            dir,
            coord,
            k8s,
            nodes,
            relay,
        })
    }

    fn node(&mut self, host: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.host == host)
            .expect("known node")
    }

    fn addr(&self, host: &str) -> String {
        self.nodes
            .iter()
            .find(|n| n.host == host)
            .map(|n| n.addr.clone())
            .expect("known node")
    }

    fn k8s(&self) -> &FakeK8s {
        self.k8s.as_ref().expect("kubernetes configured")
    }

    /// Kills the agent (and, with `kubelet_too`, the node's kubelet: its Lease stops).
    fn crash(&mut self, host: &str, kubelet_too: bool) {
        if let Some(mut a) = self.node(host).agent.take() {
            a.sigkill();
        }
        if kubelet_too && let Some(k) = &self.k8s {
            k.set_kubelet_alive(host, false);
        }
    }

    fn entries(&self) -> anyhow::Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }

    fn events(&self, host: &str) -> anyhow::Result<Vec<JournalLine>> {
        let a = self.addr(host);
        self.coord.ctl_json(&["events", "--machine", &a, "--json"])
    }

    fn status(&self) -> anyhow::Result<RemediationStatus> {
        self.coord.ctl_json(&["remediation", "status", "--json"])
    }

    /// Waits until `host` has a journal line with `outcome` and `rule`; returns it.
    fn wait_event(&self, host: &str, outcome: &str, rule: &str) -> anyhow::Result<JournalLine> {
        wait_for(&format!("{host}: {outcome} {rule}"), SETTLE, || {
            let lines = self.events(host).map_err(|e| e.to_string())?;
            lines
                .iter()
                .rev()
                .find(|l| l.outcome == outcome && l.rule == rule)
                .cloned()
                .ok_or_else(|| format!("{lines:#?}"))
        })
    }

    /// Waits until the line for `host` with `rule` was repeated `n` times: proof that that
    /// many passes ran since, without sleeping a guessed time.
    fn wait_repeats(&self, host: &str, rule: &str, n: u64) -> anyhow::Result<JournalLine> {
        wait_for(
            &format!("{host}: {rule} repeated {n} times"),
            SETTLE,
            || {
                let lines = self.events(host).map_err(|e| e.to_string())?;
                lines
                    .iter()
                    .rev()
                    .find(|l| l.rule == rule && l.count >= n)
                    .cloned()
                    .ok_or_else(|| format!("{lines:#?}"))
            },
        )
    }
}

fn field<'a>(e: &'a Value, k: &str) -> &'a str {
    e[k].as_str().unwrap_or_default()
}

/// An entry's index (a string in CKE's JSON).
fn index(e: &Value) -> Option<u64> {
    field(e, "index").parse().ok()
}

/// The machine fails, is repaired (the script leaves its mark, the test makes it healthy),
/// and its entry succeeds; returns that entry's index.
fn fail_and_repair(env: &mut Env, host: &str) -> anyhow::Result<u64> {
    let a = env.addr(host);
    let (mark, healthy) = (
        env.dir.join(format!("repaired-{a}")),
        env.dir.join(format!("healthy-{a}")),
    );
    let _ = std::fs::remove_file(&mark);
    let _ = std::fs::remove_file(&healthy);
    env.node(host).kubelet.set_healthy(false);
    wait_for("the repair command", SETTLE, || {
        mark.exists()
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })?;
    env.node(host).kubelet.set_healthy(true);
    std::fs::write(&healthy, "")?;
    wait_for("the entry to succeed", SETTLE, || {
        let l = env.entries().map_err(|e| e.to_string())?;
        l.iter()
            .find(|e| field(e, "address") == a && field(e, "status") == "succeeded")
            .and_then(index)
            .ok_or_else(|| format!("{l:#?}"))
    })
}

#[test]
fn a_machine_that_fails_again_is_repaired_again_until_it_needs_a_human() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r2"]);
    s.kubernetes = false;
    s.root = "delete_succeeded_after = \"1s\"\n".into();
    s.tables = "escalation = { max_remediations = 2, window = \"1h\" }\n".into();
    let mut env = Env::start(s)?;
    let a = env.addr("n1");
    // An entry added by hand (for n2) is a person's: it stays, succeeded, whatever the setting.
    let by_hand = index(&env.coord.ctl_json::<Value>(&[
        "repair-queue",
        "add",
        "unhealthy",
        "qemu",
        &env.addr("n2"),
        "--json",
    ])?)
    .context("index of the entry added by hand")?;
    std::fs::write(env.dir.join(format!("healthy-{}", env.addr("n2"))), "")?;
    let first = fail_and_repair(&mut env, "n1")?;
    let l = env.wait_event("n1", "finding", "succeeded-entry-deleted")?;
    assert!(
        l.sentence.contains(&format!(
            "repair queue entry {first} (operation unhealthy) succeeded"
        )),
        "{}",
        l.sentence
    );
    wait_for("the deleted entry to leave the queue", SETTLE, || {
        let l = env.entries().map_err(|e| e.to_string())?;
        (!l.iter().any(|e| index(e) == Some(first)))
            .then_some(())
            .ok_or_else(|| format!("{l:#?}"))
    })?;
    // It fails again: repaired again, no person involved.
    let second = fail_and_repair(&mut env, "n1")?;
    assert_ne!(first, second);
    let admitted = |env: &Env| -> anyhow::Result<usize> {
        Ok(env
            .events("n1")?
            .iter()
            .filter(|l| l.outcome == "admitted")
            .count())
    };
    assert_eq!(admitted(&env)?, 2);
    // A third failure within the hour: two remediations already, so a human is needed.
    env.wait_event("n1", "finding", "succeeded-entry-deleted")?;
    env.node("n1").kubelet.set_healthy(false);
    let l = env.wait_event("n1", "held", "needs-human")?;
    assert!(l.sentence.contains(&a), "{}", l.sentence);
    assert_eq!(admitted(&env)?, 2);
    let entries = env.entries()?;
    assert!(
        entries
            .iter()
            .any(|e| index(e) == Some(by_hand) && field(e, "status") == "succeeded"),
        "{entries:#?}"
    );
    Ok(())
}

#[test]
fn a_failed_kubelet_is_enqueued_as_unhealthy_and_repaired() -> anyhow::Result<()> {
    let mut env = Env::start(Setup::new(&["r1", "r2", "r3"]))?;
    let a = env.addr("n1");
    env.node("n1").kubelet.set_healthy(false);
    let line = env.wait_event("n1", "admitted", "auto-repair")?;
    assert_eq!(line.operation.as_deref(), Some("unhealthy"));
    assert!(
        line.sentence.contains("repair queue entry"),
        "{}",
        line.sentence
    );
    let entries = env.entries()?;
    assert_eq!(entries.len(), 1, "{entries:#?}");
    let e = &entries[0];
    assert_eq!(
        (
            field(e, "address"),
            field(e, "operation"),
            field(e, "machine_type"),
            field(e, "serial")
        ),
        (a.as_str(), "unhealthy", "qemu", "SN1")
    );
    // Its history says remediation added it, and by which rule.
    let shown: Value = env.coord.ctl_json(&[
        "repair-queue",
        "show",
        &index(e).context("the entry's index")?.to_string(),
        "--json",
    ])?;
    let added = &shown["history"][0];
    assert_eq!(added["event"], "added", "{shown:#}");
    assert_eq!(
        added["detail"],
        format!("unhealthy qemu {a}, by remediation (auto-repair)"),
        "{shown:#}"
    );
    // The script ran; the machine comes back, the health check sees it, the entry succeeds.
    let mark = env.dir.join(format!("repaired-{a}"));
    wait_for("the repair command", SETTLE, || {
        mark.exists()
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })?;
    env.node("n1").kubelet.set_healthy(true);
    std::fs::write(env.dir.join(format!("healthy-{a}")), "")?;
    wait_for("the entry to succeed", SETTLE, || {
        let l = env.entries().map_err(|e| e.to_string())?;
        match l.first().map(|e| field(e, "status").to_string()) {
            Some(s) if s == "succeeded" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    // One admission, one entry: the finished entry keeps the machine out (CKE), no second.
    let lines = env.events("n1")?;
    assert_eq!(
        lines.iter().filter(|l| l.outcome == "admitted").count(),
        1,
        "{lines:#?}"
    );
    let reasons = env.k8s().node_event_reasons("n1");
    assert!(
        reasons.iter().any(|r| r == "FleetmendRemediationAdmitted"),
        "{reasons:?}"
    );
    let (_, metrics) = env.coord.http_get("/metrics")?;
    assert!(
        metrics.contains(
            "fleetmend_remediation_decisions_total{outcome=\"admitted\",rule=\"auto-repair\"} 1"
        ),
        "{metrics}"
    );
    Ok(())
}

#[test]
fn a_rack_that_goes_dark_at_once_is_an_infrastructure_event_not_three_repairs() -> anyhow::Result<()>
{
    let mut s = Setup::new(&["r1", "r1", "r1", "r2", "r2", "r2", "r3"]);
    // 3 of 7 silent is 43 %: let correlated failure, not self-isolation, be the rule here.
    s.tables =
        "self_isolation = { percent = 60, min_silent = 3, window = \"1m\", settle = \"1s\" }\n"
            .into();
    let mut env = Env::start(s)?;
    for h in ["n1", "n2", "n3"] {
        env.crash(h, true);
    }
    for h in ["n1", "n2", "n3"] {
        let l = env.wait_event(h, "held", "correlated-failure")?;
        assert!(l.sentence.contains("rack r1 lost 3 of 3"), "{}", l.sentence);
    }
    let st = env.status()?;
    let corr = st
        .limits
        .iter()
        .find(|l| l.rule == "correlated-failure")
        .context("no correlated-failure limit in status")?;
    assert!(corr.holding, "{st:#?}");
    assert!(corr.sentence.contains("r1"), "{}", corr.sentence);
    // Passes keep running and keep holding: still nothing enqueued.
    env.wait_repeats("n1", "correlated-failure", 4)?;
    assert!(env.entries()?.is_empty(), "{:#?}", env.entries()?);
    let reasons = env.k8s().node_event_reasons("n2");
    assert!(
        reasons.iter().any(|r| r == "FleetmendRemediationHeld"),
        "{reasons:?}"
    );
    Ok(())
}

#[test]
fn an_agent_lost_while_its_kubelet_renews_is_reported_not_remediated() -> anyhow::Result<()> {
    let mut env = Env::start(Setup::new(&["r1", "r2", "r3"]))?;
    env.crash("n1", false);
    let l = env.wait_event("n1", "finding", "agent-lost-node-alive")?;
    assert!(
        l.sentence.contains("agent lost, node alive"),
        "{}",
        l.sentence
    );
    env.wait_repeats("n1", "agent-lost-node-alive", 6)?;
    assert!(env.entries()?.is_empty(), "{:#?}", env.entries()?);
    let lines = env.events("n1")?;
    assert!(lines.iter().all(|l| l.outcome == "finding"), "{lines:#?}");
    let reasons = env.k8s().node_event_reasons("n1");
    assert!(
        reasons.iter().any(|r| r == "FleetmendAgentLostNodeAlive"),
        "{reasons:?}"
    );
    let (_, metrics) = env.coord.http_get("/metrics")?;
    assert!(
        metrics.contains("fleetmend_remediation_agent_lost_node_alive 1"),
        "{metrics}"
    );
    Ok(())
}

#[test]
fn a_forty_percent_gate_over_five_machines_holds_the_third_failure() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r2", "r3", "r4", "r5"]);
    s.kubernetes = false;
    s.tables = "[remediation.auto_repair]\nenabled = false\n\n[[remediation.health_checks]]\n\
                name = \"kubelet\"\nunhealthy_conditions = [{ type = \"kubelet\", status = \"False\", timeout = \"1s\" }]\n\
                max_unhealthy = \"40%\"\noperation = \"unhealthy\"\n"
        .into();
    let mut env = Env::start(s)?;
    for h in ["n1", "n2"] {
        env.node(h).kubelet.set_healthy(false);
    }
    for h in ["n1", "n2"] {
        env.wait_event(h, "admitted", "health-check")?;
    }
    env.node("n3").kubelet.set_healthy(false);
    let l = env.wait_event("n3", "held", "health-check-gate")?;
    assert!(
        l.sentence
            .contains("3 of 5 selected machines are unhealthy"),
        "{}",
        l.sentence
    );
    env.wait_repeats("n3", "health-check-gate", 4)?;
    let entries = env.entries()?;
    let mut addrs: Vec<&str> = entries.iter().map(|e| field(e, "address")).collect();
    addrs.sort_unstable();
    assert_eq!(addrs, ["10.0.1.1", "10.0.1.2"], "{entries:#?}");
    Ok(())
}

#[test]
fn observe_mode_journals_what_it_would_do_and_enqueues_nothing() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r2"]);
    s.kubernetes = false;
    s.root = "observe = true\n".into();
    let mut env = Env::start(s)?;
    env.node("n1").kubelet.set_healthy(false);
    env.wait_event("n1", "would-enqueue", "auto-repair")?;
    // Pass after pass the same decision: one line whose count grows, no entry.
    let l = env.wait_repeats("n1", "auto-repair", 5)?;
    assert_eq!(l.outcome, "would-enqueue");
    let lines = env.events("n1")?;
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(env.entries()?.is_empty());
    assert!(env.status()?.observe);
    // The operator ends the trial week: the next pass enqueues.
    env.coord.ctl(&["remediation", "observe", "off"])?;
    env.wait_event("n1", "admitted", "auto-repair")?;
    assert_eq!(env.entries()?.len(), 1);
    Ok(())
}

#[test]
fn a_planned_reboot_waits_and_a_crash_next_to_it_does_not() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r2", "r3"]);
    s.health_extra = "goodbye_grace = \"2s\"\n".into();
    s.root = "wait_seconds_to_repair_rebooting = 6\n".into();
    let mut env = Env::start(s)?;
    // n1 reboots on purpose: systemd schedules the shutdown, the agent says goodbye.
    env.node("n1").fixture.schedule_shutdown(true)?;
    let mut agent = env.node("n1").agent.take().context("agent")?;
    agent.sigterm(Duration::from_secs(10))?;
    env.k8s().set_kubelet_alive("n1", false);
    // n2 crashes: no goodbye.
    env.crash("n2", true);
    let crashed = env.wait_event("n2", "admitted", "auto-repair")?;
    assert_eq!(crashed.operation.as_deref(), Some("unreachable"));
    let waiting = env.wait_event("n1", "held", "wait-rebooting")?;
    assert!(
        waiting
            .sentence
            .contains("said goodbye (shutdown or reboot)"),
        "{}",
        waiting.sentence
    );
    let rebooted = env.wait_event("n1", "admitted", "auto-repair")?;
    // It waited: the hold lasted passes, and the admission came at least the wait after
    // the machine became unreachable (its first hold is later than that moment).
    let held = env
        .events("n1")?
        .into_iter()
        .find(|l| l.rule == "wait-rebooting")
        .context("hold line")?;
    assert!(held.count >= 2, "{held:#?}");
    assert!(
        rebooted.first_at >= held.first_at + jiff::SignedDuration::from_secs(3),
        "held at {} admitted at {}",
        held.first_at,
        rebooted.first_at
    );
    let entries = env.entries()?;
    assert_eq!(entries.len(), 2, "{entries:#?}");
    Ok(())
}

#[test]
fn slow_start_admits_one_per_rack_then_two_after_a_success() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r1", "r1", "r1", "r2"]);
    s.kubernetes = false;
    // One after another is not a rack event here; a success counts after 1 s healthy.
    s.tables = "correlated_failure = { machines = 10, window = \"1m\" }\n\
                slow_start = { width = 1, max_width = 8, success_after = \"1s\", lookback = \"1h\" }\n"
        .into();
    let mut env = Env::start(s)?;
    env.node("n1").kubelet.set_healthy(false);
    env.wait_event("n1", "admitted", "auto-repair")?;
    // One after another, so the oldest failures are n2 then n3.
    for h in ["n2", "n3", "n4"] {
        env.node(h).kubelet.set_healthy(false);
        let l = env.wait_event(h, "held", "slow-start")?;
        assert!(l.sentence.contains("width 1"), "{}", l.sentence);
    }
    assert_eq!(env.entries()?.len(), 1);
    // n1's repair works: its health check passes and the entry succeeds; the agent reports
    // the machine healthy after that (as a loaded host or a longer report interval has
    // it), and once it has been healthy success_after the rack's width doubles: the two
    // oldest failures go in.
    let a1 = env.addr("n1");
    std::fs::write(env.dir.join(format!("healthy-{a1}")), "")?;
    wait_for("n1's entry to succeed", SETTLE, || {
        let l = env.entries().map_err(|e| e.to_string())?;
        let e = l.iter().find(|e| field(e, "address") == a1);
        match e.map(|e| field(e, "status")) {
            Some("succeeded") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    env.node("n1").kubelet.set_healthy(true);
    for h in ["n2", "n3"] {
        env.wait_event(h, "admitted", "auto-repair")?;
    }
    let l = env.wait_repeats("n4", "slow-start", 2)?;
    assert!(l.sentence.contains("width 2"), "{}", l.sentence);
    let entries = env.entries()?;
    let active: Vec<&str> = entries
        .iter()
        .filter(|e| matches!(field(e, "status"), "queued" | "processing"))
        .map(|e| field(e, "address"))
        .collect();
    assert_eq!(active.len(), 2, "{entries:#?}");
    assert!(!active.contains(&env.addr("n4").as_str()), "{entries:#?}");
    Ok(())
}

#[test]
fn a_limit_that_clears_does_not_replay_what_it_held() -> anyhow::Result<()> {
    let mut s = Setup::new(&["r1", "r2"]);
    s.kubernetes = false;
    let mut env = Env::start(s)?;
    let out = env
        .coord
        .ctl(&["remediation", "pause", "--reason", "switch upgrade"])?;
    // The pause's answer shows the limits of a pass that saw it, not of the pass before.
    let out = String::from_utf8_lossy(&out.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with("paused "))
        .context("no paused row")?;
    assert!(
        row.contains("HOLDING") && row.contains("switch upgrade"),
        "{out}"
    );
    env.node("n1").kubelet.set_healthy(false);
    let l = env.wait_event("n1", "held", "paused")?;
    assert!(l.sentence.contains("switch upgrade"), "{}", l.sentence);
    // The machine heals itself while remediation is paused; then the pause is lifted.
    env.node("n1").kubelet.set_healthy(true);
    env.coord.wait_for_state("n1", "healthy", SETTLE)?;
    env.coord.ctl(&["remediation", "resume"])?;
    assert!(env.status()?.paused.is_none());
    // Passes run (n2's machine is fine, so watch the pass counter) and nothing replays.
    let passes = |env: &Env| -> anyhow::Result<u64> {
        let (_, m) = env.coord.http_get("/metrics")?;
        m.lines()
            .find_map(|l| l.strip_prefix("fleetmend_remediation_passes_total "))
            .context("no pass counter")?
            .trim()
            .parse()
            .context("pass counter")
    };
    let before = passes(&env)?;
    wait_for("four more passes", SETTLE, || match passes(&env) {
        Ok(n) if n >= before + 4 => Ok(()),
        other => Err(format!("{other:?}")),
    })?;
    assert!(env.entries()?.is_empty(), "{:#?}", env.entries()?);
    let lines = env.events("n1")?;
    assert!(lines.iter().all(|l| l.outcome == "held"), "{lines:#?}");
    Ok(())
}

#[test]
fn a_coordinator_cut_off_from_most_agents_suspects_itself_and_repairs_nobody() -> anyhow::Result<()>
{
    let mut s = Setup::new(&["r1", "r2", "r3", "r4", "r5"]);
    s.kubernetes = false;
    s.relayed = 4;
    // Only self-isolation stands between the silent machines and a repair: no reboot wait.
    s.root = "wait_seconds_to_repair_rebooting = 0\n".into();
    let env = Env::start(s)?;
    env.relay.as_ref().context("relay")?.cut();
    for h in ["n1", "n2", "n3", "n4"] {
        env.coord.wait_for_state(h, "unreachable", SETTLE)?;
    }
    for h in ["n1", "n2", "n3", "n4"] {
        let l = env.wait_event(h, "held", "self-isolation")?;
        assert!(
            l.sentence.contains("suspects its own network"),
            "{}",
            l.sentence
        );
    }
    let st = env.status()?;
    let iso = st
        .limits
        .iter()
        .find(|l| l.rule == "self-isolation")
        .context("no self-isolation limit in status")?;
    assert!(iso.holding, "{st:#?}");
    assert!(iso.sentence.contains("4 of 5 agents"), "{}", iso.sentence);
    env.wait_repeats("n1", "self-isolation", 4)?;
    assert!(env.entries()?.is_empty(), "{:#?}", env.entries()?);
    // The network comes back: the agents report again, and nothing held is replayed.
    env.relay.as_ref().context("relay")?.restore();
    for h in ["n1", "n2", "n3", "n4"] {
        env.coord.wait_for_state(h, "healthy", SETTLE)?;
    }
    let st = env.status()?;
    let before = st.last_pass_at.map_or(0, testkit::ctl_json::ms);
    wait_for("two passes after recovery", SETTLE, || {
        let s = env.status().map_err(|e| e.to_string())?;
        match s.last_pass_at.map(testkit::ctl_json::ms) {
            Some(t) if t >= before + 1000 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    assert!(env.entries()?.is_empty(), "{:#?}", env.entries()?);
    Ok(())
}
