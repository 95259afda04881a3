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

/// A coordinator in `dir` with the test intervals and `hosts` as its inventory (none when
/// empty: every agent is then an unknown host).
fn coordinator(
    dir: &std::path::Path,
    pki: &Pki,
    hosts: &[(&str, &str)],
) -> anyhow::Result<Coordinator> {
    Coordinator::start(
        &dir.join("coordinator"),
        pki,
        &CoordinatorOptions {
            report_interval: INTERVAL,
            unreachable_grace: GRACE,
            inventory: (!hosts.is_empty()).then(|| inventory_toml(hosts)),
            ..Default::default()
        },
    )
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
    let mut coord = coordinator(tmp.path(), &pki, &HOSTS)?;

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
    let took =
        Duration::from_millis(testkit::ctl_json::ms(m.state_since).saturating_sub(killed_ms));
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
    // Every report is in the latency histograms: its round-trip time when it arrived, and
    // how long the coordinator took to acknowledge it (sub-second on loopback).
    let value = |series: &str| {
        testkit::procs::metric(&metrics, series).unwrap_or_else(|| panic!("no {series}"))
    };
    // (The series are read one after the other while agents report: each agent may have
    // one report in one and not yet in another.)
    let (reports, agents) = (
        value("fleetmend_reports_received_total"),
        HOSTS.len() as f64,
    );
    let rtts = value("fleetmend_agent_rtt_seconds_count");
    assert!(
        rtts > 0.0 && (rtts - reports).abs() <= agents,
        "{rtts} of {reports}"
    );
    let handled = value("fleetmend_report_handling_seconds_count");
    assert!(
        handled > 0.0 && handled <= reports + agents,
        "{handled} of {reports}"
    );
    assert_eq!(
        value("fleetmend_report_handling_seconds_bucket{le=\"1\"}"),
        handled,
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

/// A coordinator that crashes and comes back on its port answers the agents' packets for
/// the old connections with a stateless reset it can prove (keys derived from its private
/// key, the same in every run), so an agent reconnects on its next report, not after its
/// 10 s wait for an answer that will never come. With that wait, the agents whose report
/// fell just after a quick crash and restart came back after the 15 s the new coordinator
/// gives a silent machine (at the default 5 s interval), and so were unreachable for a
/// moment; at shorter intervals, every agent was.
#[test]
fn agents_reconnect_at_once_to_a_coordinator_restarted_after_a_crash() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let mut coord = coordinator(tmp.path(), &pki, &HOSTS[..1])?;
    let (addr, host) = HOSTS[0];
    let _node = start_node(tmp.path(), &pki, &coord, addr, host)?;
    coord.wait_for_state(host, "healthy", SETTLE)?;

    coord.crash_restart()?;
    let serving = std::time::Instant::now();
    let back = testkit::procs::wait_for(
        "the agent's first report to the new coordinator",
        SETTLE,
        || {
            let scrape = coord.scrape().map_err(|e| e.to_string())?;
            let n =
                testkit::procs::metric(&scrape, "fleetmend_reports_received_total").unwrap_or(0.0);
            (n >= 1.0)
                .then(|| serving.elapsed())
                .ok_or_else(|| format!("{n} reports"))
        },
    )?;
    // One interval to the next report, its reset, the first reconnect delay (1 s) and a
    // handshake: about 1.5 s; the answer wait it replaces is 10 s.
    assert!(
        back < Duration::from_secs(6),
        "the agent reported again {back:?} after the restart; it waited for its answer timeout"
    );
    let log = coord.log_text();
    assert!(log.contains("agent connected"), "{log}");
    Ok(())
}

#[test]
fn goodbye_on_sigterm_is_stopped_not_unreachable() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let coord = coordinator(tmp.path(), &pki, &HOSTS[..1])?;
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

/// The agent ships statically linked against glibc (scripts/build-agent.sh), where only the
/// `files` and `dns` name sources are built in: a coordinator given by host name (here
/// `localhost`, from /etc/hosts) must still be found.
#[test]
fn an_agent_finds_its_coordinator_by_host_name() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let coord = coordinator(tmp.path(), &pki, &HOSTS[..1])?;
    assert!(coord.quic.ip().is_loopback(), "{}", coord.quic);
    let (addr, host) = HOSTS[0];
    let fixture = NodeFixture::builder(host)
        .nic("eth0")
        .address(addr.parse()?)
        .build()?;
    let tls = pki.issue("node", host, &[])?;
    let by_name = format!("localhost:{}", coord.quic.port());
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&by_name, &tls.ca, &tls.cert, &tls.key)
            .server_name(&coord.quic.ip().to_string())
            .report_interval(INTERVAL),
    )?;
    let _agent = start_agent(host, &cfg, &tmp.path().join("agent.log"))?;
    coord.wait_for_state(host, "healthy", SETTLE)?;
    Ok(())
}

/// `coordinator backup` while it runs, `coordinator restore` refused while it runs and done
/// once it is stopped: the restored store has a new identity (so no gateway answers a new
/// power request with a result from before the restore), the replaced one is kept, and the
/// coordinator starts on it with its inventory.
#[test]
fn a_backup_taken_live_restores_under_a_new_identity() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let mut coord = coordinator(tmp.path(), &pki, &HOSTS[..2])?;
    let run = |args: &[&str]| -> anyhow::Result<std::process::Output> {
        Ok(testkit::procs::command("coordinator")
            .arg("--config")
            .arg(&coord.config)
            .args(args)
            .output()?)
    };
    let backup = tmp.path().join("backup.db");
    let out = run(&["backup", "--to", &backup.to_string_lossy(), "--json"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let id_before = made["store"]["store_id"]
        .as_str()
        .context("store_id")?
        .to_string();

    let out = run(&["restore", "--from", &backup.to_string_lossy()])?;
    assert_eq!(out.status.code(), Some(1), "refused while running");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another coordinator"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let code = coord
        .proc
        .take()
        .context("running")?
        .sigterm(Duration::from_secs(10))?;
    assert_eq!(code, Some(0));
    let out = run(&["restore", "--from", &backup.to_string_lossy(), "--json"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(restored["backup_store_id"], id_before.as_str());
    assert_ne!(restored["store"]["store_id"], id_before.as_str());
    let kept = restored["replaced_kept_at"].as_str().context("kept")?;
    assert!(std::path::Path::new(kept).is_file(), "{kept}");

    coord.restart()?;
    assert_eq!(coord.machines()?.len(), 2);
    Ok(())
}

/// A backup killed half-way (a cron job's timeout, the host going down) leaves nothing under
/// the name asked for, only a `.<name>.partial-<pid>` file, so nobody later takes a torn
/// copy for a backup; the next run makes a whole one.
#[test]
fn a_backup_killed_half_way_leaves_no_file_under_its_name() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let mut coord = coordinator(tmp.path(), &pki, &HOSTS[..1])?;
    coord
        .proc
        .take()
        .context("running")?
        .sigterm(Duration::from_secs(10))?;
    // A store large enough for the copy to take a while.
    let db = rusqlite::Connection::open(coord.dir.join("coordinator.db"))?;
    db.execute_batch(
        "CREATE TABLE filler (b BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 96)
         INSERT INTO filler SELECT randomblob(1048576) FROM n;",
    )?;
    drop(db);
    let backups = tmp.path().join("backups");
    std::fs::create_dir(&backups)?;
    let to = backups.join("nightly.db");
    let mut child = testkit::procs::command("coordinator")
        .arg("--config")
        .arg(&coord.config)
        .args(["backup", "--to", &to.to_string_lossy()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let partial = backups.join(format!(".nightly.db.partial-{}", child.id()));
    let deadline = std::time::Instant::now() + SETTLE;
    while !partial.exists() {
        assert!(
            child.try_wait()?.is_none(),
            "the backup ended before it was seen writing {}",
            partial.display()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no {}",
            partial.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill()?;
    child.wait()?;
    assert!(!to.exists(), "a torn copy under the name asked for");

    let out = testkit::procs::command("coordinator")
        .arg("--config")
        .arg(&coord.config)
        .args(["backup", "--to", &to.to_string_lossy()])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = rusqlite::Connection::open(&to)?;
    let rows: i64 = copy.query_row("SELECT count(*) FROM filler", [], |r| r.get(0))?;
    assert_eq!(rows, 96);
    Ok(())
}

#[test]
fn unknown_host_awaits_registration_until_added() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let coord = coordinator(tmp.path(), &pki, &[])?;
    let _node = start_node(tmp.path(), &pki, &coord, "10.0.0.7", "stray")?;
    let m = coord.wait_for_state("stray", "awaiting-registration", SETTLE)?;
    assert_eq!(
        m.spec.machine_type, "",
        "an unknown host gets no type: {m:?}"
    );
    assert_eq!(
        m.spec.address, "10.0.0.7",
        "recorded under the address the agent reports, not its UDP source: {m:?}"
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
    assert_eq!(
        m.spec.labels,
        std::collections::BTreeMap::from([("zone".to_string(), "a".to_string())])
    );
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
    // Empty fields (the adopted machine has no rack or role) print as `-`, so every column
    // but the last (FAILING, empty when nothing fails) is a word for `awk`.
    let header = table.lines().next().unwrap_or_default();
    for col in ["RACK", "ROLE", "TYPE"] {
        let at = header.find(col).expect("column in the header");
        for row in table.lines().skip(1) {
            let cell = row.get(at..).unwrap_or_default();
            assert!(
                cell.starts_with(|c: char| !c.is_whitespace()),
                "{col} empty: {table}"
            );
        }
    }
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

/// Load benchmark (not a timed test): `AGENTS` simulated agents (in-process QUIC clients,
/// each with its own node certificate) report every `INTERVAL_MS` to a real coordinator
/// process for `SECS` seconds. Prints reports/s, ack latency percentiles and the
/// coordinator's CPU and RSS. Run:
/// `cargo test --release -p fleetmend-tests --test foundation -- --ignored --nocapture coordinator_load`
/// with optional env `BENCH_AGENTS`, `BENCH_INTERVAL_MS`, `BENCH_SECS`.
#[test]
#[ignore]
fn coordinator_load() -> anyhow::Result<()> {
    use protocol::Role;
    use protocol::frame::MAX_FRAME_LEN;
    use protocol::messages::{
        AgentHello, AgentMessage, CheckResult, CoordinatorReply, HealthReport, HelloBody,
    };
    use protocol::pki::{Ca, IssueOptions};
    use protocol::transport::{connect, expect_msg, write_msg};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let agents = env("BENCH_AGENTS", 1000) as usize;
    let interval = Duration::from_millis(env("BENCH_INTERVAL_MS", 1000));
    let secs = env("BENCH_SECS", 20);

    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let hosts: Vec<(String, String)> = (0..agents)
        .map(|i| {
            (
                format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                format!("sim-{i}"),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = hosts
        .iter()
        .map(|(a, h)| (a.as_str(), h.as_str()))
        .collect();
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            report_interval: interval,
            unreachable_grace: interval * 3,
            inventory: Some(inventory_toml(&pairs)),
            ..Default::default()
        },
    )?;
    let pid = coord.proc.as_ref().and_then(|p| p.pid()).context("pid")?;
    let ca = Arc::new(Ca::load(&pki.ca_dir)?);
    let ca_pem = Arc::new(std::fs::read(pki.ca_cert())?);
    let addr = coord.quic;

    let cpu_ticks = || -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let rest = stat.rsplit_once(')').context("stat")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
    };
    let rss_kib = || -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("VmRSS")
    };

    let materials = hosts
        .iter()
        .map(|(_, host)| {
            let issued = ca.issue(Role::Node, host, &IssueOptions::default())?;
            let tls = issued.tls_material(&ca_pem)?;
            anyhow::Ok((host.clone(), tls))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let latencies = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let connected = Instant::now();
    let (window_start, window_end, ticks, reports) = rt.block_on(async {
        let mut tasks = Vec::new();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Bounded concurrent handshakes: a thousand at once would only measure the hello
        // timeout on two cores (real agents spread out with jittered backoff).
        let handshakes = Arc::new(tokio::sync::Semaphore::new(32));
        for (i, (host, tls)) in materials.into_iter().enumerate() {
            let handshakes = handshakes.clone();
            let stop = stop.clone();
            let lat = latencies.clone();
            // Spread the agents over one interval, as real agents started at random times are.
            let offset = interval * (i as u32) / (agents as u32);
            tasks.push(tokio::spawn(async move {
                let ep = tls.client_endpoint(addr)?;
                let hello = HelloBody::Agent(AgentHello {
                    hostname: host.clone(),
                    serial: String::new(),
                    addresses: vec![],
                    agent_version: "bench".into(),
                    boot_id: "b".into(),
                });
                let permit = handshakes.acquire().await?;
                let mut s = connect(&ep, addr, "127.0.0.1", Role::Coordinator, hello).await?;
                drop(permit);
                tokio::time::sleep(offset).await;
                let mut tick = tokio::time::interval(interval);
                let mut seq = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    tick.tick().await;
                    seq += 1;
                    let report = HealthReport {
                        seq,
                        time_unix_ms: now_ms(),
                        boot_id: "b".into(),
                        checks: vec![CheckResult {
                            kind: CheckKind::Nic,
                            subject: "eth0".into(),
                            status: CheckStatus::Ok,
                            detail: "up".into(),
                        }],
                        report_interval_ms: 0,
                    };
                    let t0 = Instant::now();
                    write_msg(&mut s.send, &AgentMessage::Report(report), MAX_FRAME_LEN).await?;
                    let reply = expect_msg::<CoordinatorReply>(&mut s.recv, MAX_FRAME_LEN).await?;
                    anyhow::ensure!(reply == CoordinatorReply::Ack { seq }, "{reply:?}");
                    lat.lock().unwrap().push(t0.elapsed());
                }
                anyhow::Ok(())
            }));
        }
        // Steady state: every agent connected and reporting.
        let all = agents;
        let lat = latencies.clone();
        let connect_deadline = Instant::now() + Duration::from_secs(120);
        while lat.lock().unwrap().len() < all {
            anyhow::ensure!(
                Instant::now() < connect_deadline,
                "agents did not all connect"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(interval * 2).await;
        latencies.lock().unwrap().clear();
        let t0 = Instant::now();
        let c0 = cpu_ticks()?;
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let c1 = cpu_ticks()?;
        let t1 = Instant::now();
        let n = latencies.lock().unwrap().len();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        anyhow::Ok((t0, t1, c1 - c0, n))
    })?;
    let wall = window_end - window_start;
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
    // Linux reports CPU time in clock ticks of 10 ms (USER_HZ = 100).
    let cpu = Duration::from_millis(ticks * 10);
    println!("coordinator load: {agents} agents, interval {interval:?}, window {wall:?}");
    println!(
        "  setup (certs + connections): {:?}",
        window_start - connected
    );
    println!(
        "  reports acked: {reports} ({:.0}/s)",
        reports as f64 / wall.as_secs_f64()
    );
    println!(
        "  ack latency: p50 {:?}  p99 {:?}  max {:?}",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "  coordinator CPU: {cpu:?} in {wall:?} = {:.1} % of one core, {:.1} µs per report",
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / reports.max(1) as f64
    );
    println!("  coordinator RSS: {} KiB", rss_kib()?);
    let list = coord.machines()?;
    let healthy = list.iter().filter(|m| m.state == "healthy").count();
    println!("  healthy machines at the end: {healthy}/{agents}");
    assert_eq!(healthy, agents);
    Ok(())
}
