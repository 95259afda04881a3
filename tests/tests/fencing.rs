//! Issue 11's end-to-end "must show" for fencing, with real processes: a coordinator, a
//! real bmc-gateway driving OpenIPMI's `ipmi_sim` (or, for a busy BMC, pyghmi's IPMI
//! server), a node-agent, and the fake Kubernetes API server (Node, Lease, a StatefulSet pod
//! and its VolumeAttachment):
//! - a machine whose agent and kubelet Lease die is found dead by automatic remediation and
//!   fenced by `@fence`: its workload is released only after the simulator reads off (the
//!   fake API server's request log against the simulator's power log, both timed), then the
//!   machine is powered on, its agent comes back with a new boot id and the Node is restored,
//! - a `need_drain` step on the dead node fences instead of draining and says why; a
//!   `@fence` step with `need_drain` fences once,
//! - a BMC that refuses power-off: nothing is released and the entry fails with the BMC's
//!   words; a BMC busy for 20 s after the off: the power-on waits and the flow completes,
//! - kdump: a machine whose agent reported its crash kernel loaded dies and its kdump
//!   initramfs says "dumping" (`node-agent kdump-notify --phase start`): its StatefulSet pod
//!   and VolumeAttachment are released with no power action at all; "dump done" then lets
//!   the power cycle proceed (off, confirm, on), the machine comes back with a new boot id
//!   and the taint goes,
//! - the crash test (`#[ignore]`d, run by name): the coordinator killed with SIGKILL at each
//!   of 11 kill points of the flow, each a separate run; after every restart the flow
//!   completes, the simulator's log shows one off and one on, the machine ends on, and no
//!   release came before the off. It prints a table of kill point → outcome,
//! - a Node turning Ready Unknown wakes automatic remediation through the node view's
//!   watch: with the view and remediation at 60 s, the machine is still admitted within
//!   seconds of the change,
//! - the benchmark (`#[ignore]`d): death → release with its breakdown.
//!
//! Needs `ipmi_sim` and `ipmitool` (scripts/setup-test-deps.sh installs them).

mod fence_rig;

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use fence_rig::*;
use protocol::messages::{CheckKind, CheckStatus};
use serde_json::Value;
use testkit::procs::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_machine_is_fenced_released_after_off_powered_on_and_restored() -> Result<()> {
    dead_machine_story(Tuning::quick(true)).await
}

/// Holding back never blocks recovery (invariant 9): remediation paused once the dead
/// machine's entry exists declines new work only. The fence flow already running releases,
/// powers on, waits for the agent's healthy report and restores the Node, and the entry
/// succeeds, all while the pause holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_a_fence_lets_the_running_flow_bring_the_machine_back() -> Result<()> {
    let mut rig = Rig::start(true).await?;
    rig.kill_machine();
    blocking(|| {
        wait_for(
            "automatic remediation to enqueue the dead machine",
            SETTLE,
            || {
                rig.entries()
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .next()
                    .map(|_| ())
                    .ok_or_else(|| "no entry yet".to_string())
            },
        )
    })?;
    blocking(|| {
        rig.coord
            .ctl(&["remediation", "pause", "--reason", "maintenance window"])
    })?;
    let paused_at = SystemTime::now();
    rig.wait_powered_on()?;
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "succeeded", "{v:#}");
    rig.assert_back()?;
    // The restore (the last write to the Node) came while paused, and the pause still holds.
    let writes = rig.node_writes();
    let last = writes.last().context("no write to the Node")?;
    assert!(last.0 > paused_at, "{writes:?}");
    let status = blocking(|| rig.coord.ctl(&["remediation", "status"]))?;
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(
        status.contains("paused:      yes") && status.contains("maintenance window"),
        "{status}"
    );
    let scrape = blocking(|| rig.coord.scrape())?;
    assert_fence_metrics(&scrape, 1, "done");
    Ok(())
}

/// A `@fence` step that runs out of time ends its entry, not its flow: the flow goes on,
/// powers the machine on, waits for it and restores its Node (never a machine left off or a
/// Node left tainted because a step gave up waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_step_that_times_out_leaves_its_flow_to_finish() -> Result<()> {
    let yml = REPAIR_YML.replace("command_timeout_seconds: 600", "command_timeout_seconds: 2");
    let mut rig = Rig::start_with(false, &yml, None).await?;
    rig.kill_machine();
    rig.enqueue_unreachable()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "failed", "{v:#}");
    let history = v["history"].to_string().to_lowercase();
    // "@fence: fence flow 1 still in wait-back after 2 s (it goes on; a retry waits for it)"
    assert!(
        history.contains("still in") && history.contains("it goes on"),
        "not the step's timeout: {history}"
    );
    // The machine is not booted yet: the flow powers it on and waits for it.
    rig.wait_powered_on()?;
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    assert_eq!(flows.len(), 1, "{flows:#?}");
    assert_ne!(flows[0]["state"], "done", "{flows:#?}");
    assert_ne!(flows[0]["state"], "failed", "{flows:#?}");
    rig.boot_machine()?;
    blocking(|| {
        wait_for("the flow to finish", SETTLE, || {
            let flows: Vec<Value> = rig
                .coord
                .ctl_json(&["fence", "list", "--json"])
                .map_err(|e| e.to_string())?;
            (flows.len() == 1 && flows[0]["state"] == "done")
                .then_some(())
                .ok_or_else(|| format!("{flows:?}"))
        })
    })?;
    rig.assert_back()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_busy_for_20_s_after_the_off_delays_the_power_on_and_the_flow_completes() -> Result<()>
{
    let busy = Duration::from_secs(20);
    let mut rig = Rig::start_with(false, REPAIR_YML, Some(busy)).await?;
    rig.kill_machine();
    rig.enqueue_unreachable()?;
    blocking(|| {
        wait_for("the BMC to power on again", SETTLE, || {
            (rig.count_power("1") > 0).then_some(()).ok_or_else(|| {
                let flows = rig
                    .coord
                    .ctl(&["fence", "list"])
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string());
                format!(
                    "power log {:?}; flows {flows:?}; gateway {}",
                    rig.sim.events(),
                    rig._gw.log()
                )
            })
        })
    })?;
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let events = rig.sim.timed_events();
    let off = rig.first_power("0").context("never powered off")?;
    let on = rig.first_power("1").context("never powered on")?;
    let refused = events.iter().filter(|(_, e)| e == "busy power 1").count();
    let waited = on.duration_since(off)?;
    assert!(refused >= 2, "the BMC never said busy: {events:?}");
    assert!(
        waited >= busy,
        "powered on {waited:?} after the off, inside the busy window"
    );
    assert_eq!(rig.count_power("0"), 1, "{events:?}");
    assert_eq!(rig.count_power("1"), 1, "{events:?}");
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    assert_eq!(flows[0]["state"], "done", "{flows:#?}");
    eprintln!("power-on {waited:?} after the off, {refused} busy answers before it");
    Ok(())
}

/// A step that needs a drain; the repair command itself only leaves a mark.
const DRAIN_YML: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["qemu"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo $1 >> \"$0\"", "@MARK@"]
              need_drain: true
              watch_seconds: 60
          health_check_command: ["@agent-healthy"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_of_a_dead_node_fences_first_and_releases_after() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mark = dir.path().join("repaired");
    let yml = DRAIN_YML.replace("@MARK@", &mark.display().to_string());
    let mut rig = Rig::start_with(true, &yml, None).await?;
    rig.kill_machine();
    rig.wait_powered_on()?;
    assert!(
        !mark.exists(),
        "the repair command ran before the fence released the node"
    );
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let history = v["history"].as_array().context("history")?;
    let why = history
        .iter()
        .find(|h| h["event"] == "fence-instead-of-drain")
        .with_context(|| format!("no fence-instead-of-drain in {history:#?}"))?;
    let why = why["detail"].as_str().unwrap_or_default();
    assert!(
        why.contains("agent silent") && why.contains("Lease"),
        "the reason does not name the two signals: {why}"
    );
    assert_eq!(std::fs::read_to_string(&mark)?.trim(), MACHINE);
    rig.assert_one_off_one_on();
    let off = rig.first_power("0").context("never powered off")?;
    for (at, what) in rig.node_writes() {
        assert!(at > off, "{what} came before the simulator powered off");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_step_that_needs_a_drain_on_a_dead_node_fences_once() -> Result<()> {
    let yml = REPAIR_YML.replace(
        "command_timeout_seconds: 600",
        "command_timeout_seconds: 600\n              need_drain: true",
    );
    let mut rig = Rig::start_with(true, &yml, None).await?;
    rig.kill_machine();
    rig.wait_powered_on()?;
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let history = v["history"].to_string();
    assert!(history.contains("drain-skipped-for-fence"), "{history}");
    assert!(!history.contains("fence-instead-of-drain"), "{history}");
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    assert_eq!(flows.len(), 1, "fenced twice: {flows:#?}");
    rig.assert_one_off_one_on();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_refuses_power_off_releases_nothing_and_fails_with_its_words() -> Result<()> {
    let rig = Rig::start(false).await?;
    rig.sim.ipmi().refuse_power(false, true)?;
    rig.enqueue_unreachable()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "failed", "{v:#}");
    let history = v["history"].to_string();
    assert!(history.contains("fence flow"), "{history}");
    assert!(
        history.to_lowercase().contains("unspecified error"),
        "the BMC's words are not in the entry: {history}"
    );
    assert!(rig.node_writes().is_empty(), "{:?}", rig.node_writes());
    assert_eq!(rig.k8s.pods_on(HOST).len(), 1, "the pod was released");
    assert_eq!(rig.k8s.volume_attachments_on(HOST).len(), 1);
    assert!(blocking(|| rig.sim_power_is_on())?);
    assert_eq!(rig.count_power("1"), 0, "{:?}", rig.sim.events());
    // The agent was up: the flow waited in plan for its diagnostics, and said so.
    let flow: Value = blocking(|| rig.coord.ctl_json(&["fence", "show", "1", "--json"]))?;
    assert!(
        flow["steps"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["state"] == "plan"
                && s["event"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("taking the agent's diagnostics")))),
        "{flow:#}"
    );
    // What the FleetmendFenceFailed alert reads.
    let scrape = blocking(|| rig.coord.scrape())?;
    assert_fence_metrics(&scrape, 1, "failed");
    Ok(())
}

/// Issue 34 ("never left off"): the release fails after the machine was confirmed off (the
/// API server refuses the out-of-service taint for good). The flow must power the machine on
/// before it gives up: the simulator sees the off, then an on, and the machine ends on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_api_server_refuses_powers_the_machine_on_before_failing() -> Result<()> {
    let mut rig = Rig::start(false).await?;
    rig.kill_machine();
    rig.k8s.inject(testkit::fake_k8s::Fault {
        path_contains: Some(format!("/api/v1/nodes/{HOST}")),
        method: Some("PATCH".into()),
        status: 403,
        message: "nodes is forbidden: refused by the test".into(),
        times: None,
    });
    rig.enqueue_unreachable()?;
    // The flow then waits for the machine to come back (its agent is dead here): what
    // matters is that it powered the machine on and said why.
    let flow = blocking(|| {
        wait_for("the flow to give up on the release", SETTLE, || {
            let flow: Value = rig
                .coord
                .ctl_json(&["fence", "show", "1", "--json"])
                .map_err(|e| e.to_string())?;
            let steps = flow["steps"].to_string();
            (steps.contains("refused by the test") && steps.contains("powering the machine on"))
                .then_some(flow)
                .ok_or(steps)
        })
    })?;
    rig.wait_powered_on()
        .with_context(|| format!("the machine was left off: {flow:#}"))?;
    // The off came first, then the on the failure asked for; the machine is on.
    let off = rig.first_power("0").context("no power-off")?;
    let on = rig.first_power("1").context("the machine was left off")?;
    assert!(off < on, "{:?}", rig.sim.events());
    assert!(blocking(|| rig.sim_power_is_on())?, "machine left off");
    assert!(!rig.has_out_of_service_taint());
    Ok(())
}

/// Issue 34 ("no release without a confirmed off, after a crash"): the coordinator is
/// killed with the flow in `release` (the off confirmed and committed, nothing released
/// yet), and the machine is powered on by someone else before the coordinator is back. The
/// resumed flow must not trust the committed "off": it reads the power state again, finds
/// it on, releases nothing and says so. (The crash test's machine stays off, so it cannot
/// see this re-read go missing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_turned_on_while_the_coordinator_was_down_in_release_is_not_released()
-> Result<()> {
    let mut rig = Rig::start(false).await?;
    rig.coord.env = vec![("FLEETMEND_FENCE_KILL_AT".into(), "after:release".into())];
    blocking(|| rig.coord.restart())?;
    rig.kill_machine();
    rig.enqueue_unreachable()?;
    let t0 = Instant::now();
    loop {
        let proc = rig.coord.proc.as_mut().context("coordinator")?;
        if let Some(st) = proc.try_exit() {
            use std::os::unix::process::ExitStatusExt;
            if st.signal() != Some(9) {
                bail!(
                    "coordinator exited with {st}, not SIGKILL:\n{}",
                    proc.log_text()
                );
            }
            break;
        }
        if t0.elapsed() > SETTLE {
            bail!("kill point never reached:\n{}", rig.coord.log_text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.coord.proc.take();
    rig.coord.env.clear();
    assert_eq!(rig.count_power("0"), 1, "{:?}", rig.sim.events());
    assert!(rig.node_writes().is_empty(), "{:?}", rig.node_writes());
    // Someone powers the machine on while no coordinator runs.
    rig.sim.ipmi().ipmitool(&["chassis", "power", "on"]).await?;
    assert!(blocking(|| rig.sim_power_is_on())?);
    blocking(|| rig.coord.restart())?;
    // The resumed flow reads the power state again and gives up on the release (it then
    // waits for the machine to come back, which its dead agent never does here).
    let flow = blocking(|| {
        wait_for("the resumed flow to find the machine on", SETTLE, || {
            let flow: Value = rig
                .coord
                .ctl_json(&["fence", "show", "1", "--json"])
                .map_err(|e| e.to_string())?;
            let text = flow.to_string();
            text.contains("not re-confirmed")
                .then_some(flow)
                .ok_or(text)
        })
    })?;
    // Give a wrong release time to happen, were it to come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        rig.node_writes().is_empty(),
        "the Node was written after the machine was seen on: {:?}",
        rig.node_writes()
    );
    assert!(!rig.has_out_of_service_taint());
    assert_eq!(rig.k8s.pods_on(HOST).len(), 1, "the pod was released");
    assert_eq!(rig.k8s.volume_attachments_on(HOST).len(), 1, "{flow:#}");
    assert!(blocking(|| rig.sim_power_is_on())?, "machine left off");
    Ok(())
}

/// `node-agent kdump-notify --phase PHASE` as the machine's kdump initramfs runs it: its
/// own certificate, the coordinator's address, nothing else.
fn kdump_notify(rig: &Rig, phase: &str) -> Result<()> {
    let tls = rig.agent_tls.as_ref().context("agent TLS")?;
    let out = testkit::procs::command("node-agent")
        .args(["kdump-notify", "--phase", phase, "--coordinator"])
        .arg(rig.coord.quic.to_string())
        .arg("--ca")
        .arg(&tls.ca)
        .arg("--cert")
        .arg(&tls.cert)
        .arg("--key")
        .arg(&tls.key)
        .args(["--timeout", "30s"])
        .output()?;
    if !out.status.success() {
        bail!(
            "kdump-notify --phase {phase}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kdump_dumping_releases_with_no_power_action_and_dump_done_lets_the_cycle_proceed()
-> Result<()> {
    // The agent reported its crash kernel loaded (the fixture loads one), so a silent
    // machine is given kdump_wait to say "dumping"; a dump may take up to 120 s here, far
    // longer than the test waits, so only "dump done" can start the power cycle in time.
    let mut tuning = Tuning::quick(true);
    tuning.remediation = tuning
        .remediation
        .replace("kdump_wait = \"0s\"", "kdump_wait = \"30s\"");
    tuning.remediation.push_str("[kdump]\ntimeout = \"120s\"\n");
    let mut rig = Rig::start_tuned(tuning, REPAIR_YML, None).await?;
    let machine = blocking(|| rig.coord.machine(MACHINE))?;
    let loaded = machine.last_report.as_ref().is_some_and(|r| {
        r.checks
            .iter()
            .any(|c| c.kind == CheckKind::Kdump && c.status == CheckStatus::Ok)
    });
    assert!(
        loaded,
        "the agent did not report its crash kernel loaded: {:?}",
        machine.last_report
    );
    // The kernel panics: the agent and the kubelet stop, the kdump kernel boots and says so.
    rig.kill_machine();
    let dumping_at = SystemTime::now();
    blocking(|| kdump_notify(&rig, "start"))?;
    let released = blocking(|| {
        wait_for("the workload released on the dump", SETTLE, || {
            (rig.k8s.pods_on(HOST).is_empty() && rig.k8s.volume_attachments_on(HOST).is_empty())
                .then(SystemTime::now)
                .ok_or_else(|| {
                    format!(
                        "pods {:?}; power log {:?}",
                        rig.k8s.pods_on(HOST),
                        rig.sim.events()
                    )
                })
        })
    })?;
    assert!(
        rig.has_out_of_service_taint(),
        "released without the taint: {:?}",
        rig.k8s.node(HOST)
    );
    // While the dump runs, no power action at all, however long we look.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        rig.sim.events().iter().all(|e| !e.starts_with("set power")),
        "a power action while the machine was dumping: {:?}",
        rig.sim.events()
    );
    blocking(|| {
        wait_for("the flow to wait for \"dump done\"", SETTLE, || {
            let flows = rig
                .coord
                .ctl_json::<Vec<Value>>(&["fence", "list", "--json"])
                .map_err(|e| e.to_string())?;
            (flows.len() == 1 && flows[0]["state"] == "kdump-wait")
                .then_some(())
                .ok_or_else(|| format!("{flows:#?}"))
        })
    })?;
    for (at, what) in rig.node_writes() {
        assert!(
            at >= dumping_at,
            "{what} came before the \"dumping\" notice"
        );
    }

    // The dump is written: the power cycle goes ahead, off confirmed, then on.
    let done_at = SystemTime::now();
    blocking(|| kdump_notify(&rig, "done"))?;
    rig.wait_powered_on()?;
    let off = rig.first_power("0").context("never powered off")?;
    let on = rig.first_power("1").context("never powered on")?;
    assert!(off > done_at, "powered off before \"dump done\"");
    assert!(
        off.duration_since(done_at)? < Duration::from_secs(30),
        "the power cycle waited for the kdump timeout, not for \"dump done\": {:?}",
        off.duration_since(done_at)?
    );
    assert!(on > off);
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "succeeded", "{v:#}");
    rig.assert_back()?;
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    let id = flows[0]["id"].to_string();
    let shown: Value = blocking(|| rig.coord.ctl_json(&["fence", "show", &id, "--json"]))?;
    assert_eq!(shown["state"], "done", "{shown:#}");
    let states: Vec<&str> = shown["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .filter_map(|s| s["state"].as_str())
        .collect();
    for want in [
        "kdump-release",
        "kdump-wait",
        "power-off",
        "confirm-off",
        "power-on",
        "wait-back",
        "restore",
        "done",
    ] {
        assert!(states.contains(&want), "{want} missing from {states:?}");
    }
    // The machine came back with a new boot id.
    let back = blocking(|| rig.coord.machine(MACHINE))?;
    assert_eq!(back.summary.state, "healthy", "{back:?}");
    assert_ne!(
        back.boot_id, machine.boot_id,
        "the same boot id after the cycle"
    );
    eprintln!(
        "kdump: released {:.1} s after \"dumping\"; off {:.1} s and on {:.1} s after \"dump done\"",
        released.duration_since(dumping_at)?.as_secs_f64(),
        off.duration_since(done_at)?.as_secs_f64(),
        on.duration_since(done_at)?.as_secs_f64()
    );
    Ok(())
}

/// Issue 11's crash test: one run per kill point (each about 20-30 s), printing the table.
/// `cargo test -p fleetmend-tests --test fencing -- --ignored --nocapture crash`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: one full fence per kill point; run by name"]
async fn crash_at_every_kill_point_completes_with_one_off_one_on_and_no_early_release() -> Result<()>
{
    kill_point_table(crash_at).await
}

/// Milliseconds since the Unix epoch of a JSON time: a number of ms, or an RFC 3339 string.
fn json_ms(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_u64().and_then(|n| i64::try_from(n).ok()))
        .or_else(|| {
            v.as_str()?
                .parse::<jiff::Timestamp>()
                .ok()
                .map(|t| t.as_millisecond())
        })
}

fn ms_of(t: SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

/// One benchmark run: kills the machine and measures until its workload is released.
/// Returns `(total, [(phase, seconds)])`.
async fn time_to_release(tuning: Tuning) -> Result<(f64, Vec<(&'static str, f64)>)> {
    let mut rig = Rig::start_tuned(tuning, REPAIR_YML, None).await?;
    let killed = SystemTime::now();
    rig.kill_machine();
    let deadline = Instant::now() + Duration::from_secs(180);
    let released = loop {
        if rig.k8s.pods_on(HOST).is_empty() && rig.k8s.volume_attachments_on(HOST).is_empty() {
            break SystemTime::now();
        }
        if Instant::now() > deadline {
            bail!(
                "not released within 180 s; power log {:?}",
                rig.sim.events()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let journal: Vec<Value> = blocking(|| {
        rig.coord
            .ctl_json(&["events", "--machine", MACHINE, "--json"])
    })?;
    let admitted = journal
        .iter()
        .find(|l| l["outcome"] == "admitted")
        .and_then(|l| json_ms(&l["first_at"]).or_else(|| json_ms(&l["first"])))
        .with_context(|| format!("no admitted decision in {journal:#?}"))?;
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    let id = flows.first().context("no flow")?["id"].to_string();
    let shown: Value = blocking(|| rig.coord.ctl_json(&["fence", "show", &id, "--json"]))?;
    let step = |state: &str| -> Result<i64> {
        shown["steps"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["state"] == state))
            .and_then(|s| json_ms(&s["at"]))
            .with_context(|| format!("no {state} step in {shown:#}"))
    };
    let plan = step("plan")?;
    let release = step("release")?;
    // When the (simulated) node lifecycle controller turned Ready Unknown: the second signal.
    let unready = rig
        .k8s
        .node(HOST)
        .and_then(|n| {
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready" && c["status"] != "True")
                .and_then(|c| json_ms(&c["lastTransitionTime"]))
        })
        .context("Ready never left True")?;
    let off = ms_of(rig.first_power("0").context("never powered off")?);
    let (killed, released) = (ms_of(killed), ms_of(released));
    let s = |a: i64, b: i64| (b - a) as f64 / 1000.0;
    Ok((
        s(killed, released),
        vec![
            ("detect (kill → remediation admits)", s(killed, admitted)),
            ("  of which: kill → Ready Unknown", s(killed, unready)),
            ("  of which: Ready Unknown → admitted", s(unready, admitted)),
            ("decide (admitted → flow committed)", s(admitted, plan)),
            ("power off (flow → BMC applies off)", s(plan, off)),
            (
                "confirm (off → read back, release committed)",
                s(off, release),
            ),
            (
                "release (taint → pod and attachment gone)",
                s(release, released),
            ),
        ],
    ))
}

/// The node view's watch wakes automatic remediation: with the node view refreshed and the
/// remediation pass run only every 60 s, a dead machine is still admitted and released
/// within seconds of its Node turning Ready Unknown, not at the next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_turning_unready_wakes_remediation_long_before_its_next_pass() -> Result<()> {
    let tuning = Tuning {
        report: REPORT,
        remediation:
            "[remediation]\ninterval = \"60s\"\nlease_stale = \"3s\"\nkdump_wait = \"0s\"\n\
                      [remediation.limits]\nfleet_cap = { count = 10, percent = 100 }\n\
                      self_isolation = { settle = \"1s\" }\n"
                .into(),
        view_refresh: "60s",
        kubelet: (Duration::from_millis(500), Duration::from_secs(3)),
        store: String::new(),
    };
    let (total, phases) = time_to_release(tuning).await?;
    let phase = |name: &str| {
        phases
            .iter()
            .find(|(p, _)| p.contains(name))
            .map(|(_, s)| *s)
            .unwrap_or(f64::NAN)
    };
    let after_unready = phase("Ready Unknown → admitted");
    eprintln!("kill → released {total:.1} s; Ready Unknown → admitted {after_unready:.2} s");
    assert!(
        after_unready < 10.0,
        "admitted {after_unready:.1} s after Ready turned Unknown: remediation waited for its interval"
    );
    assert!(total < 20.0, "kill → released took {total:.1} s");
    Ok(())
}

/// Issue 11's benchmark: time from killing a machine's agent and kubelet Lease to its
/// workload released, with the breakdown. Run by name:
/// `cargo test -p fleetmend-tests --test fencing -- --ignored --nocapture bench`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints timings; run by name"]
async fn bench_time_from_death_to_release() -> Result<()> {
    // One machine is the whole fleet here, so its death is also "most agents lost at once":
    // self-isolation settles in 1 s instead of 10 s, in both configurations.
    // The fixture's crash kernel is loaded, so a silent machine would first be given
    // kdump_wait (60 s) to say "dumping"; this measures a machine that simply died.
    let limits = "kdump_wait = \"0s\"\n[remediation.limits]\nfleet_cap = { count = 10, percent = 100 }\n\
                  self_isolation = { settle = \"1s\" }\n";
    let fast = Tuning {
        report: Duration::from_secs(1),
        remediation: format!("[remediation]\ninterval = \"1s\"\nlease_stale = \"3s\"\n{limits}"),
        view_refresh: "1s",
        kubelet: (Duration::from_secs(1), Duration::from_secs(3)),
        store: String::new(),
    };
    // Production defaults: reports every 5 s (unreachable after 15 s), lease_stale 20 s,
    // remediation every 10 s, node view every 10 s; kubelets renew every 10 s and the node
    // lifecycle controller marks Ready Unknown after 40 s (Kubernetes' defaults).
    let production = Tuning {
        report: Duration::from_secs(5),
        remediation: format!("[remediation]\n{limits}"),
        view_refresh: "10s",
        kubelet: (Duration::from_secs(10), Duration::from_secs(40)),
        store: String::new(),
    };
    for (name, tuning) in [("fast", fast), ("production defaults", production)] {
        let (total, phases) = time_to_release(tuning).await?;
        eprintln!("\n{name}: kill → released {total:.1} s");
        for (phase, secs) in phases {
            eprintln!("  {phase:<48} {secs:>6.2} s");
        }
    }
    Ok(())
}

/// The coordinator is SIGKILLed while the gateway still runs the flow's power-off (a BMC
/// that accepts the off and never reads off). The restarted coordinator asks again under the
/// same id, says so in the flow's history (what it waits for, until when), and ends with the
/// gateway's outcome of the first request: one off at the BMC, nothing released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_the_power_off_awaits_the_request_already_sent() -> Result<()> {
    let mut t = Tuning::quick(false);
    t.remediation = "[fence]\noff_timeout = \"8s\"\n".into();
    let mut rig = Rig::start_tuned(t, REPAIR_YML, None).await?;
    rig.sim.ipmi().ignore_off(true)?;
    rig.kill_machine();
    // Known silent, so the step takes no diagnostics first.
    blocking(|| rig.coord.wait_for_state(HOST, "unreachable", SETTLE))?;
    rig.enqueue_unreachable()?;
    blocking(|| {
        wait_for("the gateway to start the off", SETTLE, || {
            (rig.count_power("0") > 0)
                .then_some(())
                .ok_or_else(|| rig._gw.log())
        })
    })?;
    blocking(|| rig.coord.crash_restart())?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    assert_eq!(v["status"], "failed", "{v:#}");
    let flow: Value = blocking(|| rig.coord.ctl_json(&["fence", "show", "1", "--json"]))?;
    let steps = flow["steps"].as_array().context("steps")?;
    let said = steps
        .iter()
        .position(|s| {
            s["state"] == "power-off"
                && s["event"].as_str().is_some_and(|e| {
                    e.starts_with("resumed after a coordinator restart")
                        && e.contains("-fence-1-off-attempt0")
                        && e.contains("until ")
                })
        })
        .with_context(|| format!("the restart is not said: {flow:#}"))?;
    let failure = flow["failure"].as_str().unwrap_or_default();
    assert!(
        said < steps.len() - 1 && failure.contains("power still reads on"),
        "not the gateway's outcome of the first request: {flow:#}"
    );
    assert!(
        rig._gw.log().contains("repeated request id"),
        "{}",
        rig._gw.log()
    );
    assert_eq!(rig.sim.events(), ["set power 0"], "one off, no on");
    assert!(rig.node_writes().is_empty(), "{:?}", rig.node_writes());
    Ok(())
}
