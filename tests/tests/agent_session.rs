//! An agent's session with a real coordinator, with real processes on loopback:
//! - a report interval changed by SIGHUP takes effect at once, and the coordinator judges the
//!   machine on the interval the agent announces in its reports, so a machine whose agent
//!   moves to a longer interval is never called unreachable on the shorter one; an interval
//!   over a minute is refused, at start and on reload;
//! - one machine, one session: a second agent with the same certificate replaces the first
//!   one's connection (logged with both peers and counted), and the goodbye of the replaced
//!   agent does not stop the machine; the current agent's goodbye still does.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    Coordinator, CoordinatorOptions, Pki, Proc, command, inventory_toml, metric, start_agent,
    wait_for,
};

/// Bound for anything the test causes (processes start in seconds on a loaded machine).
const SETTLE: Duration = Duration::from_secs(30);

fn send_signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let st = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()?;
    ensure!(st.success(), "kill -{sig} {pid} failed");
    Ok(())
}

/// The transitions of `address` into `state`, as `machines show` lists them.
fn entered(coord: &Coordinator, address: &str, state: &str) -> anyhow::Result<Vec<String>> {
    Ok(coord
        .machine(address)?
        .transitions
        .into_iter()
        .filter(|t| t.to == state)
        .map(|t| format!("{} → {} at {}: {}", t.from, t.to, t.at, t.reason))
        .collect())
}

/// Waits for a report received after `after` (coordinator time, ms) that announces
/// `interval_ms`; returns when it was received.
fn report_announcing(
    coord: &Coordinator,
    address: &str,
    after: u64,
    interval_ms: u64,
    within: Duration,
) -> anyhow::Result<u64> {
    wait_for(
        &format!("a report announcing {interval_ms} ms"),
        within,
        || {
            let m = coord.machine(address).map_err(|e| e.to_string())?;
            let at = m.last_report_at.map(testkit::ctl_json::ms).unwrap_or(0);
            let said = m.last_report.as_ref().map(|r| r.report_interval_ms);
            if at > after && said == Some(interval_ms) {
                Ok(at)
            } else {
                Err(format!("last report at {at} announcing {said:?}"))
            }
        },
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `node-agent run --config <config>` that must exit by itself: its exit code and stderr.
fn agent_exit(config: &Path, log: &Path) -> anyhow::Result<(Option<i32>, String)> {
    let mut cmd = command("node-agent");
    cmd.arg("run").arg("--config").arg(config);
    let mut p = Proc::spawn("node-agent", cmd, log)?;
    let status = wait_for("node-agent to exit", SETTLE, || {
        p.try_exit().ok_or_else(|| "still running".to_string())
    })?;
    Ok((status.code(), p.log_text()))
}

#[test]
fn a_changed_report_interval_reaches_the_coordinator_at_once_and_is_judged_on() -> anyhow::Result<()>
{
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    // A 3 s grace: the walk's coordinator judged the agent on 3 intervals of 1 s.
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            report_interval: Duration::from_secs(1),
            unreachable_grace: Duration::from_secs(3),
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
        .report_interval(Duration::from_secs(1));
    let cfg_path = fixture.write_agent_config(&cfg)?;
    let agent = start_agent("node-1", &cfg_path, &tmp.path().join("agent.log"))?;
    let pid = agent.pid().context("agent pid")?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    let reloads = |n: usize| {
        wait_for("the agent to reload", SETTLE, || {
            let log = agent.log_text();
            let seen = log
                .lines()
                .filter(|l| l.contains("reloaded") && l.contains("report_interval"))
                .count();
            if seen >= n {
                Ok(())
            } else {
                Err(format!("{seen} reloads logged"))
            }
        })
    };

    // 1 s → 30 s, and 5 s later, well past the 3 s grace of the 1 s interval, the machine
    // is still healthy: the coordinator heard the new interval in a report sent at once.
    fixture.write_agent_config(&cfg.clone().report_interval(Duration::from_secs(30)))?;
    let asked = now_ms();
    send_signal(pid, "HUP")?;
    reloads(1)?;
    std::thread::sleep(Duration::from_secs(5));
    let m = coord.machine("10.0.0.1")?;
    ensure!(
        m.summary.state == "healthy",
        "a live agent at 30 s was judged on 1 s: {} ({})",
        m.summary.state,
        m.summary.reason
    );
    let heard = report_announcing(&coord, "10.0.0.1", asked, 30_000, Duration::from_secs(1))?;
    ensure!(
        heard - asked < 2_500,
        "the report announcing 30 s came {} ms after the reload",
        heard - asked
    );

    // Back to 1 s, as the walk did: the 30 s wait already begun is not slept out.
    fixture.write_agent_config(&cfg)?;
    let asked = Instant::now();
    send_signal(pid, "HUP")?;
    reloads(2)?;
    report_announcing(&coord, "10.0.0.1", heard, 1_000, Duration::from_secs(3))?;
    ensure!(
        asked.elapsed() < Duration::from_secs(4),
        "the report at the new interval came {:?} after the reload",
        asked.elapsed()
    );
    let before = now_ms();
    report_announcing(&coord, "10.0.0.1", before, 1_000, Duration::from_secs(3))?;
    let unreachable = entered(&coord, "10.0.0.1", "unreachable")?;
    ensure!(unreachable.is_empty(), "{unreachable:?}");

    // An hour is refused: on reload (the agent keeps its 1 s), and at start (exit 64).
    let text = std::fs::read_to_string(&cfg_path)?;
    let hour = text.replace("report_interval = \"1000ms\"", "report_interval = \"1h\"");
    ensure!(hour != text, "{text}");
    std::fs::write(&cfg_path, &hour)?;
    send_signal(pid, "HUP")?;
    agent.wait_for_log(
        &[
            "reload refused",
            "report_interval",
            "longest this setting takes (1m)",
        ],
        SETTLE,
    )?;
    let before = now_ms();
    report_announcing(&coord, "10.0.0.1", before, 1_000, Duration::from_secs(3))?;
    let second = tmp.path().join("hour.toml");
    std::fs::write(&second, &hour)?;
    let (code, err) = agent_exit(&second, &tmp.path().join("hour.log"))?;
    ensure!(code == Some(64), "exit {code:?}: {err}");
    ensure!(
        err.contains("invalid setting `report_interval`")
            && err.contains("1h is above the longest this setting takes (1m)"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_second_agent_with_the_same_certificate_replaces_the_first_and_its_goodbye_is_ignored()
-> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    // 10 s between reports: the replaced agent does not take the session back during the
    // test (its next report would find its connection closed and reconnect).
    let cfg_path = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_secs(10)),
    )?;
    let mut first = start_agent("first", &cfg_path, &tmp.path().join("first.log"))?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    coord.wait_for_log(&["agent connected", "machine=10.0.0.1"], SETTLE)?;

    // The same configuration, certificate and all, started again (a copied image).
    let mut second = start_agent("second", &cfg_path, &tmp.path().join("second.log"))?;
    let line = coord.wait_for_log(
        &[
            "replaced its open one",
            "machine=10.0.0.1",
            "new_peer=127.0.0.1:",
            "old_peer=127.0.0.1:",
        ],
        SETTLE,
    )?;
    ensure!(line.contains("two agents using one certificate"), "{line}");
    let replaced = metric(&coord.scrape()?, "fleetmend_agent_sessions_replaced_total");
    ensure!(replaced == Some(1.0), "{replaced:?}");

    // Ctrl-C of the replaced agent: its goodbye does not make the machine stopped.
    let code = first.sigterm(SETTLE)?;
    ensure!(code == Some(0), "first agent exited {code:?}");
    std::thread::sleep(Duration::from_secs(2));
    let stopped = entered(&coord, "10.0.0.1", "stopped")?;
    ensure!(
        stopped.is_empty(),
        "the replaced agent's goodbye stopped the machine: {stopped:?}\n{}",
        coord.log_text()
    );
    ensure!(coord.machine("10.0.0.1")?.summary.state == "healthy");

    // The current agent's goodbye is the machine's.
    let code = second.sigterm(SETTLE)?;
    ensure!(code == Some(0), "second agent exited {code:?}");
    coord.wait_for_state("node-1", "stopped", SETTLE)?;
    Ok(())
}

/// Issue 31 item 4: an agent given several coordinators finds the one that leads. Its list
/// is [a standby that knows no leader, a standby that names the leader]; the leader is not
/// in the list at all. The agent passes the first on to the second at once, is sent by the
/// second to the leader at once (no backoff for a standby), and reports there within
/// seconds. The standbys are coordinators of a test build told to answer as standbys
/// (`FLEETMEND_TEST_ONLY_STANDBY_OF`), so the agent's side is tested alone; elected standbys
/// are in `etcd_ha.rs`.
#[test]
fn test_only_standbys_send_an_agent_to_the_leader_at_once() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let opts = CoordinatorOptions {
        inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
        ..Default::default()
    };
    let leader = Coordinator::start(&tmp.path().join("leader"), &pki, &opts)?;
    let standby = |name: &str, of: String| -> anyhow::Result<Coordinator> {
        // The same CA, certificates of its own (each coordinator's are issued as "coord").
        let own = Pki {
            ca_dir: pki.ca_dir.clone(),
            certs_dir: tmp.path().join(format!("certs-{name}")),
        };
        let mut c = Coordinator::start(&tmp.path().join(name), &own, &opts)?;
        c.env = vec![("FLEETMEND_TEST_ONLY_STANDBY_OF".into(), of)];
        c.restart()?;
        Ok(c)
    };
    let lost = standby("lost", String::new())?;
    let knows = standby("knows", leader.quic.to_string())?;
    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let cfg_path = fixture.write_agent_config(
        &AgentConfig::new(
            &format!("{}, {}", lost.quic, knows.quic),
            &tls.ca,
            &tls.cert,
            &tls.key,
        )
        .report_interval(Duration::from_millis(300)),
    )?;
    let started = Instant::now();
    let agent = start_agent("agent", &cfg_path, &tmp.path().join("agent.log"))?;
    leader.wait_for_state("node-1", "healthy", SETTLE)?;
    let took = started.elapsed();
    eprintln!("agent start → healthy report at the leader: {took:?}");
    // The agent's own start is in it; the point is that no backoff (1 s and more) was
    // waited for either standby.
    ensure!(took < Duration::from_secs(5), "took {took:?}");
    lost.wait_for_log(&["hello answered as a standby"], SETTLE)?;
    knows.wait_for_log(&["hello answered as a standby"], SETTLE)?;
    let log = agent.wait_for_log(&["does not lead", "standby; the leader is"], SETTLE)?;
    ensure!(log.contains(&leader.quic.to_string()), "{log}");
    agent.wait_for_log(&["does not lead", "no leader is known"], SETTLE)?;
    // coordinatorctl is sent on the same way: by the standby that knows the leader, to it…
    let out = knows.ctl_command(&["machines", "list"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "{err}");
    ensure!(text.contains("node-1"), "{text}");
    ensure!(
        err.contains(&format!("standby; the leader is {}", leader.quic))
            && err.contains(&format!("using {}", leader.quic)),
        "{err}"
    );
    // …while the one that knows none says so and serves nothing.
    let out = lost.ctl_command(&["machines", "list"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a standby answered machines list");
    ensure!(err.contains("standby; no leader is known"), "{err}");
    Ok(())
}
