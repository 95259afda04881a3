//! The operator's experience, with real processes on loopback: per-program environment
//! variables (a bad one named as the variable, not its flag), `coordinatorctl`'s profile,
//! client-side error messages, the machine lifecycle against the repair queue,
//! `repair-queue add` checked against the inventory (address, serial, machine type),
//! inventory field limits, `--version`, and writing into a closed pipe.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    Coordinator, CoordinatorOptions, Pki, Proc, command, inventory_toml, run_ok, wait_for,
};

/// Generous on a loaded 2-core machine: a state change needs a report or two.
const SETTLE: Duration = Duration::from_secs(30);

fn ctl_fails(coord: &Coordinator, args: &[&str]) -> anyhow::Result<String> {
    match coord.ctl(args) {
        Ok(out) => anyhow::bail!(
            "coordinatorctl {args:?} succeeded but should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        ),
        Err(e) => Ok(format!("{e:#}")),
    }
}

/// Starts `node-agent run` for `fixture` with extra environment variables.
fn agent_with_env(
    dir: &Path,
    fixture: &NodeFixture,
    cfg: &AgentConfig,
    env: &[(&str, &Path)],
) -> anyhow::Result<Proc> {
    let config = fixture.write_agent_config(cfg)?;
    let mut cmd = command("node-agent");
    cmd.arg("run").arg("--config").arg(&config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn("node-agent", cmd, &dir.join("node-agent.log"))
}

#[test]
fn ctl_variables_do_not_change_the_agent_but_agent_variables_do() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key);

    // An operator's shell with coordinatorctl's admin certificate exported: the agent
    // started from it keeps its own certificate and reports.
    let mut agent = agent_with_env(
        tmp.path(),
        &fixture,
        &cfg,
        &[
            ("FLEETMEND_CTL_CERT", &coord.admin.cert),
            ("FLEETMEND_CTL_KEY", &coord.admin.key),
        ],
    )?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    agent.sigterm(Duration::from_secs(10))?;

    // The agent's own variable does change what it uses (so the check above could fail):
    // the admin certificate does not name this node and the agent refuses to start.
    let dir2 = tmp.path().join("second");
    std::fs::create_dir_all(&dir2)?;
    let mut agent = agent_with_env(
        &dir2,
        &fixture,
        &cfg,
        &[
            ("FLEETMEND_AGENT_CERT", &coord.admin.cert),
            ("FLEETMEND_AGENT_KEY", &coord.admin.key),
        ],
    )?;
    let status = wait_for("the agent to refuse the admin certificate", SETTLE, || {
        agent.try_exit().ok_or_else(|| "still running".to_string())
    })?;
    assert_eq!(status.code(), Some(64), "{}", agent.log_text());
    assert!(
        agent.log_text().contains("admin/tester"),
        "names the certificate it was given: {}",
        agent.log_text()
    );
    Ok(())
}

#[test]
fn a_bad_connection_setting_from_the_environment_names_the_variable() -> anyhow::Result<()> {
    let out = command("coordinatorctl")
        .env("FLEETMEND_CTL_TIMEOUT", "5")
        .args(["machines", "list"])
        .stdin(Stdio::null())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
    assert!(
        err.contains("invalid value '5' in the environment variable FLEETMEND_CTL_TIMEOUT")
            && err.contains("has no unit")
            && !err.contains("'--timeout <TIMEOUT>'"),
        "{err}"
    );
    // A flag given beside the variable is what was read, and what is named.
    let out = command("coordinatorctl")
        .env("FLEETMEND_CTL_TIMEOUT", "30s")
        .args(["--timeout", "0s", "machines", "list"])
        .stdin(Stdio::null())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value '0s' for '--timeout <TIMEOUT>'")
            && !err.contains("FLEETMEND_CTL_TIMEOUT"),
        "{err}"
    );
    Ok(())
}

#[test]
fn certificates_from_another_ca_are_explained_on_the_client_side() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let foreign = Pki::create(&tmp.path().join("foreign"), "op.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let stranger = foreign.issue("admin", "stranger", &[])?;

    // coordinatorctl trusts the right CA but holds a certificate of another one.
    let mut cmd = command("coordinatorctl");
    cmd.arg("--server")
        .arg(coord.quic.to_string())
        .arg("--ca")
        .arg(&coord.admin.ca)
        .arg("--cert")
        .arg(&stranger.cert)
        .arg("--key")
        .arg(&stranger.key)
        .args(["--timeout", "20s", "machines", "list"]);
    let out = cmd.stdin(Stdio::null()).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the coordinator rejected this certificate"),
        "client-side message: {err}"
    );
    assert!(
        !err.contains("connection lost"),
        "not a bare transport error: {err}"
    );

    // The other way round: a good certificate, but the CA file of another fleet, so the
    // coordinator's certificate does not verify here. The message says so and names the CA
    // file, instead of blaming the coordinator.
    let out = command("coordinatorctl")
        .arg("--server")
        .arg(coord.quic.to_string())
        .arg("--ca")
        .arg(&stranger.ca)
        .arg("--cert")
        .arg(&coord.admin.cert)
        .arg("--key")
        .arg(&coord.admin.key)
        .args(["--timeout", "20s", "machines", "list"])
        .stdin(Stdio::null())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the coordinator's certificate was not accepted here")
            && err.contains(&format!("the CA is {}", stranger.ca.display()))
            && !err.contains("rejected this certificate"),
        "client-side message: {err}"
    );

    // The agent finds the same mistake at start, naming both files.
    let fixture = NodeFixture::builder("node-1").build()?;
    let node = foreign.issue("node", "node-1", &[])?;
    let cfg = AgentConfig::new(
        &coord.quic.to_string(),
        &coord.admin.ca,
        &node.cert,
        &node.key,
    );
    let mut agent = agent_with_env(tmp.path(), &fixture, &cfg, &[])?;
    let status = wait_for("the agent to refuse a foreign certificate", SETTLE, || {
        agent.try_exit().ok_or_else(|| "still running".to_string())
    })?;
    assert_eq!(status.code(), Some(64), "{}", agent.log_text());
    assert!(
        agent.log_text().contains("is not valid under the CA"),
        "{}",
        agent.log_text()
    );

    let ctl = |server: String, timeout: &str| -> anyhow::Result<(String, Duration)> {
        let started = std::time::Instant::now();
        let out = command("coordinatorctl")
            .arg("--server")
            .arg(server)
            .arg("--ca")
            .arg(&coord.admin.ca)
            .arg("--cert")
            .arg(&coord.admin.cert)
            .arg("--key")
            .arg(&coord.admin.key)
            .args(["--timeout", timeout, "machines", "list"])
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        Ok((
            String::from_utf8_lossy(&out.stderr).to_string(),
            started.elapsed(),
        ))
    };
    // A port nothing listens on (a stopped coordinator, a wrong port): the host says so
    // with ICMP, and coordinatorctl says so at once instead of after its whole --timeout.
    let closed = format!("127.0.0.1:{}", testkit::procs::free_udp_port());
    let (err, took) = ctl(closed.clone(), "30s")?;
    assert!(
        err.contains(&format!("nothing listens on {closed} (UDP)")),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}, not the 30 s timeout"
    );
    // A port where something holds the socket but never answers (or a filter that drops
    // silently): nothing answers, and the message says so within the time limit.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let (err, _) = ctl(silent.local_addr()?.to_string(), "2s")?;
    assert!(err.contains("nothing answered at 127.0.0.1:"), "{err}");
    Ok(())
}

const SLOW_REPAIR: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["slow"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "sleep 300", "slow"]
              command_timeout_seconds: 0
          health_check_command: ["sh", "-c", "echo false"]
"#;

#[test]
fn machine_lifecycle_respects_repairs_and_the_inventory_file() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let cluster = tmp.path().join("cluster.yml");
    std::fs::write(&cluster, SLOW_REPAIR)?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            extra: format!("[repair]\nconfig = {:?}\n", cluster.display().to_string()),
            ..Default::default()
        },
    )?;

    // repair-queue add checks the machine.
    let err = ctl_fails(
        &coord,
        &["repair-queue", "add", "unreachable", "slow", "10.9.9.9"],
    )?;
    assert!(err.contains("no machine with address 10.9.9.9"), "{err}");
    // A hostname is not an address, even with --force; the refusal gives the address.
    for force in [false, true] {
        let mut args = vec!["repair-queue", "add"];
        if force {
            args.push("--force");
        }
        args.extend(["unreachable", "slow", "node-1"]);
        let err = ctl_fails(&coord, &args)?;
        assert!(
            err.contains(
                "`node-1` is not an IP address; the repair queue is keyed by machine address; \
                 node-1 is the hostname of 10.0.0.1: queue the entry for 10.0.0.1"
            ),
            "{err}"
        );
    }
    let err = ctl_fails(
        &coord,
        &[
            "repair-queue",
            "add",
            "unreachable",
            "qemu",
            "10.0.0.1",
            "WRONG",
        ],
    )?;
    assert!(err.contains("contradicts the inventory"), "{err}");
    // The type left out and the serial given: an IP address is never read as a machine
    // type, so this is the address and its (wrong) serial, not type `10.0.0.1` at `WRONG`.
    let err = ctl_fails(
        &coord,
        &["repair-queue", "add", "unreachable", "10.0.0.1", "WRONG"],
    )?;
    assert!(
        err.contains("contradicts the inventory") && err.contains("WRONG"),
        "{err}"
    );
    assert!(!err.contains("not an IP address"), "{err}");
    let err = ctl_fails(
        &coord,
        &[
            "repair-queue",
            "add",
            "unreachable",
            "10.0.0.1",
            "qemu",
            "S1",
        ],
    )?;
    assert!(
        err.contains("10.0.0.1 is an IP address, so it is not a machine type"),
        "{err}"
    );
    // So is a machine type: `slow`'s procedure is for other hardware than 10.0.0.1's `qemu`,
    // and --force, as for the serial, does not change that.
    for force in [false, true] {
        let mut args = vec!["repair-queue", "add"];
        if force {
            args.push("--force");
        }
        args.extend(["unreachable", "slow", "10.0.0.1"]);
        let err = ctl_fails(&coord, &args)?;
        assert!(
            err.contains(
                "machine type \"slow\" contradicts the inventory: machine 10.0.0.1 has type \"qemu\""
            ),
            "{err}"
        );
        assert!(!err.contains("warning"), "nothing was queued: {err}");
    }
    let queued: Vec<serde_json::Value> = coord.ctl_json(&["repair-queue", "list", "--json"])?;
    assert!(queued.is_empty(), "{queued:?}");
    // A malformed address is refused before --force warns of anything.
    let out = coord
        .ctl_command(&[
            "repair-queue",
            "add",
            "--force",
            "unreachable",
            "slow",
            "010.000.001.011",
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("`010.000.001.011` is not an IP address"),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");

    // Inventory fields have limits: an over-long type is refused by the coordinator, and
    // the listing stays printable.
    let long_type = "t".repeat(100_000);
    let err = ctl_fails(
        &coord,
        &[
            "machines",
            "add",
            "10.0.2.1",
            "--hostname",
            "ok-1",
            "--type",
            &long_type,
        ],
    )?;
    assert!(
        err.contains(
            "machine type \"tttttttttttttttttttt…\" is 100000 characters long; the limit is 253"
        ),
        "{}",
        &err[..err.len().min(500)]
    );
    let listed = coord.ctl(&["machines", "list"])?;
    assert!(String::from_utf8_lossy(&listed.stdout).starts_with("ADDRESS"));

    // An admin-added machine under repair cannot be deleted without --force.
    coord.ctl(&[
        "machines",
        "add",
        "10.0.0.9",
        "--hostname",
        "h9",
        "--serial",
        "S9",
        "--type",
        "slow",
    ])?;
    let added = coord.ctl(&[
        "repair-queue",
        "add",
        "--force",
        "unreachable",
        "10.0.0.9",
        "S9",
        "--json",
    ])?;
    let warned = String::from_utf8_lossy(&added.stderr);
    assert!(
        warned.contains("warning: queued with --force: 10.0.0.9"),
        "the warning follows the entry: {warned}"
    );
    let added: serde_json::Value = serde_json::from_slice(&added.stdout)?;
    assert_eq!(
        added["machine_type"], "slow",
        "type from the inventory: {added}"
    );
    assert_eq!(added["serial"], "S9", "serial from the inventory: {added}");
    let index = added["index"].as_str().context("index")?.to_string();
    wait_for("the repair to run", SETTLE, || {
        let list: Vec<serde_json::Value> = coord
            .ctl_json(&["repair-queue", "list", "--json"])
            .map_err(|e| e.to_string())?;
        match list.iter().find(|e| e["index"] == index.as_str()) {
            Some(e) if e["status"] == "processing" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    // `coordinator check` says whether the active entries keep their procedures: an edited
    // repair file without this one would fail the entry at the next start.
    let (code, out) = check(&coord)?;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("the one queued or processing entry has its procedure"),
        "{out}"
    );
    std::fs::write(&cluster, SLOW_REPAIR.replace("\"slow\"", "\"other\""))?;
    let (code, out) = check(&coord)?;
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains(&format!(
            "entry #{index} (unreachable slow 10.0.0.9, processing) has no procedure in this file"
        )),
        "{out}"
    );
    std::fs::write(&cluster, SLOW_REPAIR)?;
    let err = ctl_fails(&coord, &["machines", "delete", "10.0.0.9"])?;
    assert!(err.contains("has an active repair"), "{err}");
    assert!(
        coord
            .machines()?
            .iter()
            .any(|m| m.spec.address == "10.0.0.9")
    );
    let out = coord.ctl(&["machines", "delete", "10.0.0.9", "--force"])?;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("cancelled repair entries {index}")),
        "{said}"
    );
    assert!(
        !coord
            .machines()?
            .iter()
            .any(|m| m.spec.address == "10.0.0.9")
    );

    // The inventory file is the source of truth for its machines.
    let err = ctl_fails(&coord, &["machines", "delete", "10.0.0.1"])?;
    assert!(err.contains("listed in the inventory file"), "{err}");
    let err = ctl_fails(
        &coord,
        &[
            "machines",
            "add",
            "10.0.0.1",
            "--hostname",
            "node-1",
            "--type",
            "other",
        ],
    )?;
    assert!(err.contains("listed in the inventory file"), "{err}");

    // Admin states: maintenance and retirement, and back.
    let m: serde_json::Value =
        coord.ctl_json(&["machines", "set-state", "10.0.0.1", "updating", "--json"])?;
    assert_eq!(m["state"], "updating", "{m}");
    coord.ctl(&["machines", "retire", "10.0.0.1"])?;
    let err = ctl_fails(&coord, &["repair-queue", "add", "unreachable", "10.0.0.1"])?;
    assert!(err.contains("never repaired"), "{err}");
    let m: serde_json::Value = coord.ctl_json(&["machines", "unretire", "10.0.0.1", "--json"])?;
    assert!(
        m["state"] == "uninitialized" || m["state"] == "unreachable",
        "handed back to health checks: {m}"
    );
    Ok(())
}

/// `coordinator check` of `coord`'s configuration: its exit code and output.
fn check(coord: &Coordinator) -> anyhow::Result<(Option<i32>, String)> {
    let out = testkit::procs::command("coordinator")
        .arg("check")
        .arg("--config")
        .arg(&coord.config)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code(), text))
}

/// Issue 34 item 12: `machines delete` of a machine whose agent is connected ends that
/// agent's session, so it reconnects and shows up as awaiting registration at once, instead
/// of reporting about a machine the coordinator no longer has (an ERROR at every report, the
/// machine hidden until the agent happened to reconnect).
#[test]
fn deleting_a_connected_machine_shows_it_awaiting_registration_at_once() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            report_interval: Duration::from_millis(300),
            unreachable_grace: Duration::from_secs(3),
            ..Default::default()
        },
    )?;
    coord.ctl(&[
        "machines",
        "add",
        "10.0.0.7",
        "--hostname",
        "node-7",
        "--type",
        "qemu",
    ])?;
    let fixture = NodeFixture::builder("node-7")
        .address("10.0.0.7".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-7", &[])?;
    let cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
        .report_interval(Duration::from_millis(300));
    let _agent = agent_with_env(tmp.path(), &fixture, &cfg, &[])?;
    coord.wait_for_state("node-7", "healthy", SETTLE)?;
    coord.ctl(&["machines", "delete", "10.0.0.7"])?;
    wait_for("the agent to register again", SETTLE, || {
        let list = coord.machines().map_err(|e| e.to_string())?;
        match list.iter().find(|m| m.spec.hostname == "node-7") {
            Some(m) if m.state == "awaiting-registration" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    // Reports went on meanwhile; none was logged as an error.
    std::thread::sleep(Duration::from_secs(1));
    let log = coord.log_text();
    assert!(!log.contains("cannot record state transition"), "{log}");
    assert!(log.contains("agent_connected=true"), "{log}");
    Ok(())
}

#[test]
fn a_machine_dropped_from_the_inventory_file_is_retired() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let mut coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[
                ("10.0.0.1", "node-1"),
                ("10.0.0.2", "node-2"),
            ])),
            ..Default::default()
        },
    )?;
    std::fs::write(
        coord.dir.join("inventory.toml"),
        inventory_toml(&[("10.0.0.1", "node-1")]),
    )?;
    // `coordinator check`, beside the running coordinator, says what a start would change
    // and changes nothing.
    let (code, out) = check(&coord)?;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "no longer listed, to be retired and left to `coordinatorctl machines delete`: 10.0.0.2"
        ),
        "{out}"
    );
    assert!(
        coord.machines()?.iter().all(|m| m.state != "retired"),
        "the check changed the store"
    );
    coord.restart()?;
    let (code, out) = check(&coord)?;
    assert!(
        code == Some(0) && out.contains("no change to the machines"),
        "{out}"
    );
    let list = coord.machines()?;
    let two = list
        .iter()
        .find(|m| m.spec.address == "10.0.0.2")
        .context("kept, not dropped")?;
    assert_eq!(two.state, "retired", "{two:?}");
    assert!(two.reason.contains("no longer listed"), "{two:?}");
    let one = list
        .iter()
        .find(|m| m.spec.address == "10.0.0.1")
        .context("listed")?;
    assert_ne!(one.state, "retired", "{one:?}");
    // The file no longer speaks for it: its record is the operator's to delete.
    coord.ctl(&["machines", "delete", "10.0.0.2"])?;
    assert!(
        coord
            .machines()?
            .iter()
            .all(|m| m.spec.address != "10.0.0.2"),
        "deleted"
    );
    // A hostname moved to a new address with one edit of the file: the start used to stop
    // on "hostname node-1 is already registered at 10.0.0.1".
    std::fs::write(
        coord.dir.join("inventory.toml"),
        inventory_toml(&[("10.0.0.9", "node-1")]),
    )?;
    let (_, out) = check(&coord)?;
    assert!(
        out.contains("node-1 moves from 10.0.0.1 to 10.0.0.9"),
        "{out}"
    );
    coord.restart()?;
    let list = coord.machines()?;
    let addrs: Vec<(&str, &str)> = list
        .iter()
        .map(|m| (m.spec.address.as_str(), m.spec.hostname.as_str()))
        .collect();
    assert_eq!(addrs, [("10.0.0.9", "node-1")], "{list:#?}");
    // A hostname a machine added by hand holds cannot be taken by the file: the start stops
    // (exit 64) and says how to free it, since coordinatorctl needs a running coordinator.
    coord.ctl(&[
        "machines",
        "add",
        "10.0.0.5",
        "--hostname",
        "node-5",
        "--type",
        "qemu",
    ])?;
    std::fs::write(
        coord.dir.join("inventory.toml"),
        inventory_toml(&[("10.0.0.9", "node-1"), ("10.0.0.6", "node-5")]),
    )?;
    let (code, out) = check(&coord)?;
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("the coordinator would not start")
            && out.contains("coordinatorctl machines delete 10.0.0.5"),
        "{out}"
    );
    if let Some(mut p) = coord.proc.take() {
        p.sigterm(std::time::Duration::from_secs(10))?;
    }
    let out = testkit::procs::command("coordinator")
        .arg("--config")
        .arg(&coord.config)
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hostname \"node-5\" is registered at 10.0.0.5")
            && err.contains("cannot give it to 10.0.0.6")
            && err.contains("coordinatorctl machines delete 10.0.0.5"),
        "{err}"
    );
    Ok(())
}

#[test]
fn every_binary_prints_the_same_version_line() -> anyhow::Result<()> {
    let mut tails = Vec::new();
    for bin in ["coordinator", "coordinatorctl", "node-agent", "bmc-gateway"] {
        let out = run_ok(command(bin).arg("--version"))?;
        let line = String::from_utf8(out.stdout)?;
        let tail = line
            .trim()
            .strip_prefix(&format!("{bin} "))
            .with_context(|| format!("{bin} --version starts with its name: {line}"))?
            .to_string();
        assert!(tail.contains("(fleetmend, commit "), "{bin}: {line}");
        tails.push(tail);
    }
    assert!(tails.windows(2).all(|w| w[0] == w[1]), "{tails:?}");
    Ok(())
}

/// Runs `cmd` with its stdout a pipe whose reading end is already closed, as in
/// `… | head` once head has exited: the first write fails with EPIPE.
fn into_closed_pipe(mut cmd: Command) -> anyhow::Result<std::process::Output> {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let out = cmd
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()?;
    Ok(out)
}

#[test]
fn writing_into_a_closed_pipe_exits_quietly() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let mut cases = Vec::new();
    let mut ctl = command("coordinatorctl");
    ctl.args(["pki", "init", "--out"])
        .arg(tmp.path().join("ca"));
    cases.push(("coordinatorctl", ctl));
    let mut coord = command("coordinator");
    coord
        .args(["check", "--config"])
        .arg(tmp.path().join("none.toml"));
    cases.push(("coordinator", coord));
    let fixture = NodeFixture::builder("node-1").build()?;
    let mut agent = command("node-agent");
    agent
        .args(["check", "--root"])
        .arg(fixture.root())
        .args(["--hostname", "node-1"]);
    cases.push(("node-agent", agent));
    let gw_config = tmp.path().join("gw.toml");
    std::fs::write(
        &gw_config,
        format!(
            "listen = \"127.0.0.1:1\"\nstate_dir = {:?}\n[tls]\nca = \"/x\"\ncert = \"/x\"\nkey = \"/x\"\n",
            tmp.path().join("gw").display().to_string()
        ),
    )?;
    let mut gw = command("bmc-gateway");
    gw.arg("--config").arg(&gw_config).arg("check");
    cases.push(("bmc-gateway", gw));
    for (name, cmd) in cases {
        let out = into_closed_pipe(cmd)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(!err.contains("Broken pipe"), "{name}: {err}");
    }
    Ok(())
}

/// `machines import` of a fleet-sized file: one request larger than an agent's frame limit
/// (64 KiB; 5,000 machines are about 190 KB), imported whole.
#[test]
fn a_fleet_sized_inventory_imports_in_one_request() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let addresses: Vec<(String, String)> = (0..5000)
        .map(|i| {
            (
                format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256),
                format!("bulk-{i}"),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = addresses
        .iter()
        .map(|(a, h)| (a.as_str(), h.as_str()))
        .collect();
    let file = tmp.path().join("bulk.toml");
    std::fs::write(&file, inventory_toml(&pairs))?;
    assert!(std::fs::metadata(&file)?.len() > 64 * 1024);
    let out = coord.ctl(&["machines", "import", &file.display().to_string(), "--json"])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let imported: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(imported.as_array().map(Vec::len), Some(5000), "{err}");
    assert_eq!(coord.machines()?.len(), 5000);
    Ok(())
}

/// Runs `cmd` to its end within 20 s, failing (and killing it) if it hangs: its exit code
/// and its stdout and stderr together.
fn output_within(mut cmd: Command) -> anyhow::Result<(Option<i32>, String)> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let waited = wait_for("the command to end", Duration::from_secs(20), || {
        child
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "still running".to_string())
    });
    if waited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        anyhow::bail!("{cmd:?} hung: {waited:?}");
    }
    let out = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code(), text))
}

/// A FIFO named as a CA, a key or a password file (a slip of `mkfifo`, a process
/// substitution) is refused at once, naming it, instead of hanging the program on an open
/// that waits for a writer: `coordinator check`, `bmc-gateway check` and `node-agent run`.
#[test]
fn a_fifo_named_as_a_certificate_or_password_file_is_refused_not_waited_on() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let fifo = tmp.path().join("fifo.pem");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let said = |text: &str| text.contains(&fifo.display().to_string()) && text.contains("FIFO");

    let coord = pki.issue("coordinator", "coord", &[])?;
    let config = tmp.path().join("coordinator.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"coord\"\nlisten = \"127.0.0.1:1\"\ndatabase = {:?}\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
            tmp.path().join("c.db").display().to_string(),
            fifo.display().to_string(),
            coord.cert.display().to_string(),
            coord.key.display().to_string()
        ),
    )?;
    let mut cmd = command("coordinator");
    cmd.arg("check").arg("--config").arg(&config);
    let (code, text) = output_within(cmd)?;
    assert_eq!(code, Some(64), "{text}");
    assert!(said(&text), "{text}");

    let gw = tmp.path().join("gw.toml");
    let base = format!(
        "listen = \"127.0.0.1:1\"\nstate_dir = {:?}\n",
        tmp.path().join("gw").display().to_string()
    );
    std::fs::write(
        &gw,
        format!(
            "{base}[tls]\nca = {:?}\ncert = \"/x\"\nkey = \"/x\"\n",
            fifo.display().to_string()
        ),
    )?;
    let mut cmd = command("bmc-gateway");
    cmd.arg("--config").arg(&gw).arg("check");
    let (code, text) = output_within(cmd)?;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("tls  FAIL") && said(&text), "{text}");
    std::fs::write(
        &gw,
        format!(
            "{base}[tls]\nca = \"/x\"\ncert = \"/x\"\nkey = \"/x\"\n[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = {:?}\n",
            fifo.display().to_string()
        ),
    )?;
    let mut cmd = command("bmc-gateway");
    cmd.arg("--config").arg(&gw).arg("check");
    let (code, text) = output_within(cmd)?;
    assert_eq!(code, Some(64), "{text}");
    assert!(
        text.contains("bmc[0].password_file") && said(&text),
        "{text}"
    );

    let fixture = NodeFixture::builder("node-1").build()?;
    let node = pki.issue("node", "node-1", &[])?;
    let config = fixture.write_agent_config(&AgentConfig::new(
        "127.0.0.1:1",
        &fifo,
        &node.cert,
        &node.key,
    ))?;
    let mut cmd = command("node-agent");
    cmd.arg("run").arg("--config").arg(&config);
    let (code, text) = output_within(cmd)?;
    assert!(code.is_some_and(|c| c != 0), "{code:?}: {text}");
    assert!(said(&text), "{text}");
    Ok(())
}

/// The daemons' own files (the coordinator's configuration, inventory and repair file, the
/// agent's configuration) named as a FIFO or a device by mistake are refused at once with
/// what they are, instead of hanging the start or the `check` on a read that never ends.
#[test]
fn a_fifo_or_device_named_as_a_daemons_own_file_is_refused_not_waited_on() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let fifo = tmp.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let said = |text: &str, path: &str, what: &str| text.contains(path) && text.contains(what);
    let fifo_s = fifo.display().to_string();

    for config in [fifo_s.as_str(), "/dev/zero"] {
        let mut cmd = command("coordinator");
        cmd.arg("check").arg("--config").arg(config);
        let (code, text) = output_within(cmd)?;
        assert_eq!(code, Some(64), "{config}: {text}");
        assert!(said(&text, config, "not a regular file"), "{text}");
    }

    let coord = pki.issue("coordinator", "coord", &[])?;
    let base = format!(
        "name = \"coord\"\nlisten = \"127.0.0.1:1\"\ndatabase = {:?}\n",
        tmp.path().join("c.db").display().to_string()
    );
    let tls = format!(
        "[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
        pki.ca_cert().display().to_string(),
        coord.cert.display().to_string(),
        coord.key.display().to_string()
    );
    let config = tmp.path().join("coordinator.toml");
    for (extra, key) in [
        (format!("inventory = {fifo_s:?}\n"), "inventory"),
        (format!("[repair]\nconfig = {fifo_s:?}\n"), "repair"),
    ] {
        let text = if key == "inventory" {
            format!("{base}{extra}{tls}")
        } else {
            format!("{base}{tls}{extra}")
        };
        std::fs::write(&config, text)?;
        let mut cmd = command("coordinator");
        cmd.arg("check").arg("--config").arg(&config);
        let (code, text) = output_within(cmd)?;
        assert_eq!(code, Some(64), "{key}: {text}");
        assert!(said(&text, &fifo_s, "FIFO"), "{key}: {text}");
        let mut cmd = command("coordinator");
        cmd.arg("run").arg("--config").arg(&config);
        let (code, text) = output_within(cmd)?;
        assert_eq!(code, Some(64), "{key}: {text}");
        assert!(said(&text, &fifo_s, "FIFO"), "{key}: {text}");
    }

    for config in [fifo_s.as_str(), "/dev/zero"] {
        let mut cmd = command("node-agent");
        cmd.arg("check").arg("--config").arg(config);
        let (code, text) = output_within(cmd)?;
        assert_eq!(code, Some(64), "{config}: {text}");
        assert!(said(&text, config, "not a regular file"), "{text}");
    }
    Ok(())
}

/// `node-agent check` refuses what `run` refuses, with `run`'s exit code, before any
/// coordinator is involved: a certificate from another fleet's CA exits 64 from both (check
/// used to print its health table and exit 0, and a rollout loop went on to start an agent
/// that exited 64). With the fleet's own certificate the `tls` line is ok, and without a
/// polkitd under the agent's root its `actions` lines say the restarts would be refused.
#[test]
fn node_agent_check_exits_as_run_would_on_a_certificate_run_refuses() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let fleet = Pki::create(&tmp.path().join("fleet"), "op.test")?;
    let other = Pki::create(&tmp.path().join("other"), "op.test")?;
    let fx = NodeFixture::builder("node-1").build()?;
    let theirs = other.issue("node", "node-1", &[])?;
    let config = fx.write_agent_config(&AgentConfig::new(
        "127.0.0.1:1",
        fleet.ca_cert(),
        &theirs.cert,
        &theirs.key,
    ))?;
    for sub in ["check", "run"] {
        let mut cmd = command("node-agent");
        cmd.arg(sub).arg("--config").arg(&config);
        let (code, text) = output_within(cmd)?;
        assert_eq!(code, Some(64), "{sub}: {text}");
        assert!(text.contains("is not valid under the CA"), "{sub}: {text}");
    }
    let mine = fleet.issue("node", "node-1", &[])?;
    let config = fx.write_agent_config(&AgentConfig::new(
        "127.0.0.1:1",
        fleet.ca_cert(),
        &mine.cert,
        &mine.key,
    ))?;
    let mut cmd = command("node-agent");
    cmd.arg("check").arg("--config").arg(&config);
    let (code, text) = output_within(cmd)?;
    assert_eq!(code, Some(0), "{text}");
    let line = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} line in:\n{text}"))
            .to_string()
    };
    assert!(
        line("tls ").contains(" ok ") && line("tls ").contains("node/node-1"),
        "{text}"
    );
    let restart = line("actions  restart-unit kubelet");
    assert!(
        restart.contains(" fail ") && restart.contains("polkitd is not installed"),
        "{text}"
    );
    Ok(())
}

/// Issue 34 item 16: several coordinators in `--server` (and the profile's `server` list)
/// are tried in order; the first that answers serves, and the others are named on stderr.
#[test]
fn several_servers_are_tried_in_order_until_one_answers() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "op.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let gone = format!("127.0.0.1:{}", testkit::procs::free_udp_port());
    let ctl = |servers: &str| {
        command("coordinatorctl")
            .args(["--server", servers, "--timeout", "5s"])
            .arg("--ca")
            .arg(&coord.admin.ca)
            .arg("--cert")
            .arg(&coord.admin.cert)
            .arg("--key")
            .arg(&coord.admin.key)
            .args(["machines", "list"])
            .output()
    };
    let out = ctl(&format!("{gone},{}", coord.quic))?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("ADDRESS"),
        "{out:?}"
    );
    assert!(
        err.contains(&format!("{gone} did not answer")) && err.contains("using"),
        "{err}"
    );
    let out = ctl(&format!("{gone},{gone}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no coordinator answered; tried in order"),
        "{err}"
    );
    Ok(())
}
