//! Issue 2's end-to-end "must show": a PKI made with `coordinatorctl pki`, a coordinator and
//! three node-agents as real processes on loopback with fixture sysfs/procfs trees; all
//! three healthy through `coordinatorctl machines list --json`; a NIC carrier down makes
//! one unhealthy naming the check; SIGKILL of an agent makes it unreachable within the
//! grace plus one interval; a coordinator restart keeps machines and transition history.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use protocol::messages::{CheckKind, CheckStatus};
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, inventory_toml, start_agent};

const INTERVAL: Duration = Duration::from_millis(300);
const GRACE: Duration = Duration::from_millis(900);
/// Bound for a state the test causes to appear (agents connecting on a loaded machine).
const SETTLE: Duration = Duration::from_secs(30);

const HOSTS: [(&str, &str); 3] = [
    ("10.0.0.1", "node-1"),
    ("10.0.0.2", "node-2"),
    ("10.0.0.3", "node-3"),
];

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

struct Node {
    fixture: NodeFixture,
    agent: Proc,
}

fn start_node(
    dir: &std::path::Path,
    pki: &Pki,
    coord: &Coordinator,
    addr: &str,
    host: &str,
) -> anyhow::Result<Node> {
    let fixture = NodeFixture::builder(host)
        .nic("eth0")
        .mount("/var")
        .address(addr.parse()?)
        .build()?;
    let tls = pki.issue("node", host, &[])?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(INTERVAL),
    )?;
    let agent = start_agent(host, &cfg, &dir.join(format!("{host}.log")))?;
    Ok(Node { fixture, agent })
}

#[test]
fn agents_report_health_states_persist_across_restart() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let mut coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            report_interval: INTERVAL,
            unreachable_grace: GRACE,
            inventory: Some(inventory_toml(&HOSTS)),
            ..Default::default()
        },
    )?;

    // Registered from the inventory, never reported.
    let list = coord.machines()?;
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|m| m.state == "uninitialized"), "{list:?}");

    let mut nodes = Vec::new();
    for (addr, host) in HOSTS {
        nodes.push(start_node(tmp.path(), &pki, &coord, addr, host)?);
    }
    for (_, host) in HOSTS {
        coord.wait_for_state(host, "healthy", SETTLE)?;
    }
    let list = coord.machines()?;
    assert!(
        list.iter().all(|m| m.connected && m.failing.is_empty()),
        "{list:?}"
    );

    // NIC carrier down on node-2: unhealthy, naming the check.
    nodes[1].fixture.set_carrier("eth0", false)?;
    let m = coord.wait_for_state("node-2", "unhealthy", SETTLE)?;
    assert_eq!(m.failing, vec!["nic:eth0".to_string()], "{m:?}");
    assert!(m.reason.contains("nic:eth0"), "{}", m.reason);
    let detail = coord.machine("10.0.0.2")?;
    let report = detail
        .last_report
        .clone()
        .context("node-2 has a last report")?;
    let nic = report
        .checks
        .iter()
        .find(|c| c.kind == CheckKind::Nic && c.subject == "eth0")
        .context("report has the eth0 check")?;
    assert_eq!(nic.status, CheckStatus::Fail, "{nic:?}");
    assert!(
        detail.failing_since.iter().any(|(k, _)| k == "nic:eth0"),
        "{:?}",
        detail.failing_since
    );
    // The others are unaffected.
    coord.wait_for_state("node-1", "healthy", SETTLE)?;

    // SIGKILL node-3's agent: no goodbye, so unreachable once the grace has passed. The
    // transition time is the coordinator's own record, so slow polling cannot hide a late
    // transition.
    let killed_ms = now_ms();
    nodes[2].agent.sigkill();
    let m = coord.wait_for_state("node-3", "unreachable", SETTLE)?;
    let took = Duration::from_millis(m.state_since_unix_ms.saturating_sub(killed_ms));
    assert!(
        took <= GRACE + INTERVAL,
        "unreachable {took:?} after SIGKILL; must be within grace {GRACE:?} + one interval {INTERVAL:?}"
    );
    assert!(m.reason.contains("no report for"), "{}", m.reason);
    // (The QUIC connection of a SIGKILLed agent only times out after the idle timeout; state
    // does not wait for that.)

    let (code, metrics) = coord.http_get("/metrics")?;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("fleetmend_machines{state=\"unreachable\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fleetmend_machines{state=\"unhealthy\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("fleetmend_reports_received_total 0\n"),
        "{metrics}"
    );

    // Restart the coordinator: machines and their transition history are still there.
    let before: Vec<_> = HOSTS
        .iter()
        .map(|(a, _)| coord.machine(a).map(|d| d.transitions))
        .collect::<Result<_, _>>()?;
    coord.restart()?;
    let list = coord.machines()?;
    assert_eq!(list.len(), 3, "{list:?}");
    let node3 = list.iter().find(|m| m.spec.hostname == "node-3").unwrap();
    assert_eq!(node3.state, "unreachable");
    assert_eq!(node3.spec.machine_type, "qemu");
    for ((addr, _), before) in HOSTS.iter().zip(before) {
        let after = coord.machine(addr)?.transitions;
        assert!(
            after.len() >= before.len() && after[..before.len()] == before[..],
            "{addr}: history before restart {before:?}, after {after:?}"
        );
    }
    let tos = |addr: &str| -> anyhow::Result<Vec<String>> {
        Ok(coord
            .machine(addr)?
            .transitions
            .into_iter()
            .map(|t| t.to)
            .collect())
    };
    let n3 = tos("10.0.0.3")?;
    assert_eq!(
        &n3[..3],
        ["uninitialized", "healthy", "unreachable"],
        "{n3:?}"
    );
    let n2 = tos("10.0.0.2")?;
    assert_eq!(
        &n2[..3],
        ["uninitialized", "healthy", "unhealthy"],
        "{n2:?}"
    );

    // The surviving agents reconnect to the new process and keep reporting.
    let detail = testkit::procs::wait_for("node-1 to report again", SETTLE, || {
        let d = coord.machine("10.0.0.1").map_err(|e| e.to_string())?;
        if d.last_report.is_some() {
            Ok(d)
        } else {
            Err(format!("{:?}", d.summary))
        }
    })?;
    assert_eq!(detail.summary.state, "healthy", "{detail:?}");
    Ok(())
}

#[test]
fn goodbye_on_sigterm_is_stopped_not_unreachable() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            report_interval: INTERVAL,
            unreachable_grace: GRACE,
            inventory: Some(inventory_toml(&HOSTS[..1])),
            ..Default::default()
        },
    )?;
    let mut node = start_node(tmp.path(), &pki, &coord, HOSTS[0].0, HOSTS[0].1)?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    node.agent.sigterm(Duration::from_secs(10))?;
    let m = coord.wait_for_state("node-1", "stopped", SETTLE)?;
    assert!(m.reason.contains("goodbye"), "{}", m.reason);
    // Well past the unreachable grace it is still stopped: a planned stop is no failure.
    std::thread::sleep(GRACE * 3);
    let list = coord.machines()?;
    assert_eq!(list[0].state, "stopped", "{list:?}");
    Ok(())
}

#[test]
fn unknown_host_awaits_registration_until_added() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            report_interval: INTERVAL,
            unreachable_grace: GRACE,
            ..Default::default()
        },
    )?;
    let _node = start_node(tmp.path(), &pki, &coord, "10.0.0.7", "stray")?;
    let m = coord.wait_for_state("stray", "awaiting-registration", SETTLE)?;
    assert_eq!(
        m.spec.machine_type, "",
        "an unknown host gets no type: {m:?}"
    );
    coord.ctl(&[
        "machines",
        "add",
        "10.0.0.7",
        "--hostname",
        "stray",
        "--type",
        "qemu",
        "--rack",
        "r9",
        "--label",
        "zone=a",
    ])?;
    let m = coord.wait_for_state("stray", "healthy", SETTLE)?;
    assert_eq!(m.spec.address, "10.0.0.7");
    assert_eq!(m.spec.machine_type, "qemu");
    assert_eq!(m.spec.labels, vec![("zone".to_string(), "a".to_string())]);
    assert_eq!(
        coord.machines()?.len(),
        1,
        "the awaiting record was adopted"
    );
    // The table form is readable and names the machine.
    let out = coord.ctl(&["machines", "list"])?;
    let table = String::from_utf8(out.stdout)?;
    assert!(table.starts_with("ADDRESS"), "{table}");
    assert!(
        table.contains("stray") && table.contains("healthy"),
        "{table}"
    );
    Ok(())
}

#[test]
fn bad_config_exits_64_naming_the_key() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("coordinator.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:1\"\ndatabase = \"/nonexistent/c.db\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n[health]\nreport_intervall = \"1s\"\n",
    )?;
    let out = testkit::procs::command("coordinator")
        .arg("--config")
        .arg(&path)
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("report_intervall"), "{stderr}");

    let out = testkit::procs::command("coordinator")
        .arg("--config")
        .arg(tmp.path().join("missing.toml"))
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    Ok(())
}

#[test]
fn pki_refuses_to_overwrite_without_force() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let ca = pki.ca_dir.to_string_lossy().into_owned();
    let init = |force: bool| {
        let mut c = testkit::procs::command("coordinatorctl");
        c.args(["pki", "init", "--out", &ca]);
        if force {
            c.arg("--force");
        }
        c.output()
    };
    let again = init(false)?;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--force"),
        "{again:?}"
    );
    assert!(init(true)?.status.success());

    let files = pki.issue("node", "web-1", &["10.0.0.1".parse()?])?;
    let mode = std::fs::metadata(&files.key)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "key file mode");
    let e = pki.issue("node", "web-1", &[]).unwrap_err().to_string();
    assert!(e.contains("--force"), "{e}");
    let bad_role = testkit::procs::command("coordinatorctl")
        .args([
            "pki", "issue", "--ca", &ca, "--role", "root", "--name", "x", "--out",
        ])
        .arg(tmp.path())
        .output()?;
    assert!(!bad_role.status.success());
    assert!(
        String::from_utf8_lossy(&bad_role.stderr).contains("root"),
        "{bad_role:?}"
    );
    Ok(())
}
