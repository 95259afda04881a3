//! Built-in power actions of the repair queue, end to end: a real coordinator configured with
//! `[[gateways.targets]]` runs a repair whose steps are `@power-off` and `@power-on`; the
//! actions travel over mutual-TLS QUIC to a real bmc-gateway process, which drives
//! OpenIPMI's `ipmi_sim`. The simulator's own record of chassis commands and ipmitool's reading
//! of its power state confirm what happened, and in which order.
//!
//! Needs `ipmi_sim` and `ipmitool` (scripts/setup-test-deps.sh installs them).

use std::time::Duration;

use anyhow::{Context, Result};
use testkit::bmc_sim::{GatewayOptions, GatewayProc, IpmiSim, TestPki, find_program, wait_until};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, START_TIMEOUT, metric, wait_for};

const MACHINE: &str = "192.0.2.31";
const RACK: &str = "rack-7";

/// A health check that prints `true` only when ipmitool reads the simulator's power as on.
fn power_on_check(dir: &std::path::Path, sim: &IpmiSim) -> Result<std::path::PathBuf> {
    let ipmitool = find_program("ipmitool")?;
    let script = format!(
        "#!/bin/sh\n# Health check: the machine ($1) is powered on, as its BMC says.\nif {:?} -I lanplus -H 127.0.0.1 -p {} -U {} -P {} -C 3 -N 1 -R 2 chassis power status 2>/dev/null | grep -q 'is on'; then echo true; else echo false; fi\n",
        ipmitool.to_string_lossy(),
        sim.port,
        sim.username,
        sim.password
    );
    let path = dir.join("power-is-on.sh");
    std::fs::write(&path, script)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_steps_power_off_then_on_through_the_gateway() -> Result<()> {
    let work = tempfile::tempdir()?;
    let dir = work.path().to_path_buf();
    let sim = IpmiSim::start(true).await?;

    // One fleet CA, made by `coordinatorctl pki`, for the coordinator and the gateway alike.
    let pki = {
        let d = dir.join("pki");
        tokio::task::spawn_blocking(move || Pki::create(&d, "fleet.test")).await??
    };
    let gw_pki = TestPki {
        ca: protocol::pki::Ca::load(&pki.ca_dir)?,
        dir: tempfile::tempdir()?,
    };
    let pw_file = gw_pki.dir.path().join("bmc.pw");
    std::fs::write(&pw_file, format!("{}\n", sim.password))?;
    let bmcs = format!(
        "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN-{MACHINE}\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n",
        sim.port,
        sim.username,
        pw_file.to_string_lossy()
    );
    let gw = GatewayProc::start(&gw_pki, &bmcs).await?;

    let check = power_on_check(&dir, &sim)?;
    let repair_yaml = dir.join("repair.yaml");
    std::fs::write(
        &repair_yaml,
        format!(
            "repair:\n  repair_procedures:\n    - machine_types: [\"qemu\"]\n      repair_operations:\n        - operation: \"unreachable\"\n          repair_steps:\n            - repair_command: [\"@power-off\"]\n              command_timeout_seconds: 60\n              watch_seconds: 2\n            - repair_command: [\"@power-on\"]\n              command_timeout_seconds: 60\n              watch_seconds: 60\n          health_check_command: [{:?}]\n          command_timeout_seconds: 20\n",
            check.to_string_lossy()
        ),
    )?;
    let inventory = format!(
        "[[machines]]\naddress = \"{MACHINE}\"\nhostname = \"pw-1\"\nserial = \"SN-{MACHINE}\"\nrack = \"{RACK}\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n"
    );
    let extra = format!(
        "\n[repair]\nconfig = {:?}\n\n[[gateways.targets]]\nname = \"{RACK}\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = [\"{RACK}\"]\n",
        repair_yaml.to_string_lossy(),
        gw.quic
    );
    let coord = {
        let d = dir.join("coordinator");
        let opts = CoordinatorOptions {
            inventory: Some(inventory),
            extra,
            ..Default::default()
        };
        tokio::task::spawn_blocking(move || Coordinator::start(&d, &pki, &opts)).await??
    };

    let coord = std::sync::Arc::new(coord);
    let c = coord.clone();
    let entry: serde_json::Value = tokio::task::spawn_blocking(move || -> Result<_> {
        c.ctl(&[
            "repair-queue",
            "add",
            "unreachable",
            "qemu",
            MACHINE,
            &format!("SN-{MACHINE}"),
        ])?;
        // Step 0 powers off, its watch expires (the health check says off), step 1 powers on
        // and the health check passes.
        wait_for(
            "the repair entry to finish",
            Duration::from_secs(120),
            || {
                let list: Vec<serde_json::Value> = c
                    .ctl_json(&["repair-queue", "list", "--json"])
                    .map_err(|e| e.to_string())?;
                let e = list.first().cloned().ok_or("no entry")?;
                match e["status"].as_str() {
                    Some("succeeded") | Some("failed") => Ok(e),
                    other => Err(format!("{other:?} at step {}", e["step"])),
                }
            },
        )
    })
    .await??;
    let history = {
        let c = coord.clone();
        let index = entry["index"].as_str().unwrap_or("1").to_string();
        tokio::task::spawn_blocking(move || c.ctl(&["repair-queue", "show", &index])).await??
    };
    let history = String::from_utf8_lossy(&history.stdout).to_string();
    eprintln!("{history}");
    assert_eq!(
        entry["status"],
        "succeeded",
        "entry did not succeed: {entry}\n{history}\ngateway log:\n{}",
        gw.log()
    );
    assert_eq!(entry["step"], 1, "finished on the wrong step: {entry}");

    // The BMC saw an off, then an on, and nothing else that changes power.
    let events: Vec<String> = sim
        .events()
        .into_iter()
        .filter(|e| e.starts_with("set power"))
        .collect();
    assert_eq!(
        events,
        vec!["set power 0".to_string(), "set power 1".to_string()],
        "history:\n{history}"
    );
    assert!(
        sim.power_is_on().await?,
        "machine left off after the repair"
    );
    assert!(
        history.contains("@power-off") || history.contains("power-off"),
        "history does not name the built-in:\n{history}"
    );
    let metrics = gw.metrics().await.context("gateway metrics")?;
    assert!(
        metrics.contains("fleetmend_gateway_action_duration_seconds"),
        "{metrics}"
    );

    // `coordinator check` reaches the gateway as a power request would, sending none: ok
    // with the gateway running; a port nobody listens on and a `server_name` the gateway's
    // certificate does not carry each fail the `gateway` line (exit 64), naming the gateway.
    let config = std::fs::read_to_string(&coord.config)?;
    let before = sim.events().len();
    let variants = [
        ("as configured", config.clone(), None),
        (
            "nothing listening",
            config.replace(
                &gw.quic.to_string(),
                &format!("127.0.0.1:{}", testkit::procs::free_udp_port()),
            ),
            Some("nothing listens on"),
        ),
        (
            "another server_name",
            config.replace(
                "server_name = \"127.0.0.1\"",
                "server_name = \"gw.elsewhere.test\"",
            ),
            Some("gw.elsewhere.test"),
        ),
    ];
    for (what, text, failure) in variants {
        let path = dir.join(format!("check-{}.toml", what.replace(' ', "-")));
        std::fs::write(&path, text)?;
        let out = testkit::procs::command("coordinator")
            .arg("check")
            .arg("--config")
            .arg(&path)
            .output()?;
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        let line = said
            .lines()
            .find(|l| l.starts_with("gateway "))
            .with_context(|| format!("{what}: no gateway line in\n{said}"))?
            .to_string();
        match failure {
            None => {
                assert_eq!(out.status.code(), Some(0), "{what}:\n{said}");
                assert!(
                    line.contains("ok") && line.contains(&format!("{RACK} at {}", gw.quic)),
                    "{what}: {line}"
                );
            }
            Some(words) => {
                assert_eq!(out.status.code(), Some(64), "{what}:\n{said}");
                assert!(
                    line.contains("FAIL") && line.contains(RACK) && line.contains(words),
                    "{what}: {line}"
                );
            }
        }
    }
    // A machine of the rack whose gateway has no [[bmc]] for it: the routing says "rack-…
    // has a gateway", but the gateway, asked which machines it serves, does not list it, so
    // a `power` line names it (its first power step would fail at once).
    let inventory = config
        .lines()
        .find_map(|l| l.strip_prefix("inventory = "))
        .context("the coordinator's config names no inventory")?
        .trim_matches('"')
        .to_string();
    let more = dir.join("inventory-unserved.toml");
    std::fs::write(
        &more,
        format!(
            "{}\n[[machines]]\naddress = \"10.9.9.9\"\nhostname = \"pw-2\"\nrack = \"{RACK}\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n",
            std::fs::read_to_string(&inventory)?
        ),
    )?;
    let path = dir.join("check-unserved.toml");
    std::fs::write(&path, config.replace(&inventory, &more.to_string_lossy()))?;
    let out = testkit::procs::command("coordinator")
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.lines().any(|l| l.starts_with("gateway ")
            && l.contains("ok")
            && l.contains("it has a BMC for 1 machine")),
        "{said}"
    );
    assert!(
        said.lines().any(|l| l.starts_with("power ")
            && l.contains("FAIL")
            && l.contains(&format!("gateway {RACK} has no [[bmc]] for 10.9.9.9"))),
        "{said}"
    );
    assert_eq!(sim.events().len(), before, "the check touched the BMC");
    Ok(())
}

/// What the tests below share: an ipmi_sim machine, one fleet PKI, a gateway configuration
/// for the machine, and the health check.
struct Rig {
    dir: tempfile::TempDir,
    sim: IpmiSim,
    pki: Pki,
    gw_pki: TestPki,
    bmcs: String,
    check: std::path::PathBuf,
}

impl Rig {
    async fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let sim = IpmiSim::start(true).await?;
        let pki = {
            let d = dir.path().join("pki");
            tokio::task::spawn_blocking(move || Pki::create(&d, "fleet.test")).await??
        };
        let gw_pki = TestPki {
            ca: protocol::pki::Ca::load(&pki.ca_dir)?,
            dir: tempfile::tempdir()?,
        };
        let pw_file = gw_pki.dir.path().join("bmc.pw");
        std::fs::write(&pw_file, format!("{}\n", sim.password))?;
        let bmcs = format!(
            "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN-{MACHINE}\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n",
            sim.port,
            sim.username,
            pw_file.to_string_lossy()
        );
        let check = power_on_check(dir.path(), &sim)?;
        Ok(Self {
            dir,
            sim,
            pki,
            gw_pki,
            bmcs,
            check,
        })
    }

    async fn gateway(&self, opts: GatewayOptions) -> Result<GatewayProc> {
        GatewayProc::start_with(&self.gw_pki, &self.bmcs, opts).await
    }

    /// A coordinator with its own database in `name`, whose repair is one `@power-cycle`
    /// step through the gateway at `gw`.
    async fn coordinator(
        &self,
        name: &str,
        gw: std::net::SocketAddr,
    ) -> Result<std::sync::Arc<Coordinator>> {
        self.coordinator_with(name, gw, "@power-cycle").await
    }

    /// As [`Rig::coordinator`], with `builtin` as the repair's one step.
    async fn coordinator_with(
        &self,
        name: &str,
        gw: std::net::SocketAddr,
        builtin: &str,
    ) -> Result<std::sync::Arc<Coordinator>> {
        self.coordinator_steps(name, gw, &format!("[\"{builtin}\"]"), "")
            .await
    }

    /// As [`Rig::coordinator`], with `command` (YAML) as the repair's one step, and `more`
    /// (YAML lines of the step, each `\n`-ended, indented by 14) for its other keys.
    async fn coordinator_steps(
        &self,
        name: &str,
        gw: std::net::SocketAddr,
        command: &str,
        more: &str,
    ) -> Result<std::sync::Arc<Coordinator>> {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let repair_yaml = dir.join("repair.yaml");
        std::fs::write(
            &repair_yaml,
            format!(
                "repair:\n  repair_procedures:\n    - machine_types: [\"qemu\"]\n      repair_operations:\n        - operation: \"unreachable\"\n          repair_steps:\n            - repair_command: {command}\n              command_timeout_seconds: 150\n              watch_seconds: 60\n{more}          health_check_command: [{:?}]\n          command_timeout_seconds: 20\n",
                self.check.to_string_lossy()
            ),
        )?;
        let inventory = format!(
            "[[machines]]\naddress = \"{MACHINE}\"\nhostname = \"pw-1\"\nserial = \"SN-{MACHINE}\"\nrack = \"{RACK}\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n"
        );
        let extra = format!(
            "\n[repair]\nconfig = {:?}\n\n[[gateways.targets]]\nname = \"{RACK}\"\naddress = \"{gw}\"\nserver_name = \"127.0.0.1\"\nracks = [\"{RACK}\"]\n",
            repair_yaml.to_string_lossy(),
        );
        let opts = CoordinatorOptions {
            inventory: Some(inventory),
            extra,
            ..Default::default()
        };
        // Same fleet CA, but certificates of its own (coordinatorctl never overwrites one).
        let certs_dir = dir.join("certs");
        std::fs::create_dir_all(&certs_dir)?;
        let pki = Pki {
            ca_dir: self.pki.ca_dir.clone(),
            certs_dir,
        };
        let c =
            tokio::task::spawn_blocking(move || Coordinator::start(&dir.join("c"), &pki, &opts))
                .await??;
        Ok(std::sync::Arc::new(c))
    }

    /// How many power cycles ipmi_sim carried out (each is a `set power 0`).
    fn cycles(&self) -> usize {
        self.sim
            .events()
            .iter()
            .filter(|e| *e == "set power 0")
            .count()
    }
}

/// Adds the repair entry and returns the entry once finished, with its history.
async fn repair(
    c: std::sync::Arc<Coordinator>,
    timeout: Duration,
) -> Result<(serde_json::Value, String)> {
    tokio::task::spawn_blocking(move || -> Result<_> {
        c.ctl(&[
            "repair-queue",
            "add",
            "unreachable",
            "qemu",
            MACHINE,
            &format!("SN-{MACHINE}"),
        ])?;
        let entry = wait_for("the repair entry to finish", timeout, || {
            let list: Vec<serde_json::Value> = c
                .ctl_json(&["repair-queue", "list", "--json"])
                .map_err(|e| e.to_string())?;
            let e = list.first().cloned().ok_or("no entry")?;
            match e["status"].as_str() {
                Some("succeeded") | Some("failed") => Ok(e),
                other => Err(format!("{other:?} at step {}", e["step"])),
            }
        })?;
        let index = match &entry["index"] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let out = c.ctl(&["repair-queue", "show", &index])?;
        Ok((entry, String::from_utf8_lossy(&out.stdout).to_string()))
    })
    .await?
}

/// Issue 8: a second database (re-created, restored elsewhere, a test install) numbers its
/// entries from 1 again. Its power request for entry 1, step 0, attempt 0 must not be taken
/// for the first database's: the gateway must really power-cycle the machine a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_database_with_the_same_entry_number_really_power_cycles() -> Result<()> {
    let rig = Rig::new().await?;
    let gw = rig.gateway(GatewayOptions::default()).await?;
    let first = rig.coordinator("first", gw.quic).await?;
    let (e1, h1) = repair(first.clone(), Duration::from_secs(150)).await?;
    assert_eq!(e1["status"], "succeeded", "{e1}\n{h1}\n{}", gw.log());
    wait_until(
        "the first cycle to show in ipmi_sim",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok(rig.cycles() == 1) },
    )
    .await?;
    drop(first);

    let second = rig.coordinator("second", gw.quic).await?;
    let (e2, h2) = repair(second.clone(), Duration::from_secs(150)).await?;
    assert_eq!(e2["status"], "succeeded", "{e2}\n{h2}\n{}", gw.log());
    assert_eq!(
        e1["index"], e2["index"],
        "the test needs both databases to use the same entry number"
    );
    wait_until(
        "the second cycle to show in ipmi_sim",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok(rig.cycles() == 2) },
    )
    .await
    .with_context(|| {
        format!(
            "events {:?}\nhistory:\n{h2}\ngateway log:\n{}",
            rig.sim.events(),
            gw.log()
        )
    })?;
    assert!(
        !gw.log().contains("repeated request id"),
        "the gateway took the second database's request for a repeat:\n{}",
        gw.log()
    );
    Ok(())
}

/// `@fence` of a machine with nothing to release (no `[kubernetes]` here): powered off and
/// confirmed off, then powered on again as a fence flow would (`[fence] keep_off` is off by
/// default). It used to leave the machine off, and the entry failed when its watch ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_with_nothing_to_release_powers_the_machine_on_again() -> Result<()> {
    let rig = Rig::new().await?;
    let gw = rig.gateway(GatewayOptions::default()).await?;
    let coord = rig.coordinator_with("fence", gw.quic, "@fence").await?;
    let (e, h) = repair(coord.clone(), Duration::from_secs(150)).await?;
    assert_eq!(e["status"], "succeeded", "{e}\n{h}\n{}", gw.log());
    assert!(h.contains("nothing to release"), "{h}");
    wait_until(
        "ipmi_sim to see the off, then the on",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            let ev = rig.sim.events();
            let off = ev.iter().position(|e| e == "set power 0");
            let on = ev.iter().rposition(|e| e == "set power 1");
            Ok(matches!((off, on), (Some(a), Some(b)) if a < b))
        },
    )
    .await
    .with_context(|| format!("events {:?}\nhistory:\n{h}", rig.sim.events()))?;
    Ok(())
}

/// Issue 8: the gateway is down for 20 s while a power step runs. The entry holds (it does
/// not fail), and succeeds once a new gateway process is back on the same port and state
/// directory; the history says it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_outage_holds_the_power_step_until_it_is_back() -> Result<()> {
    let rig = Rig::new().await?;
    let state = tempfile::tempdir()?;
    let opts = GatewayOptions {
        quic: None,
        state_dir: Some(state.path().to_path_buf()),
        ..Default::default()
    };
    let gw = rig.gateway(opts.clone()).await?;
    let quic = gw.quic;
    let c = rig.coordinator("c", quic).await?;
    // The coordinator connects to the gateway at start (its reach watch): kill the gateway
    // only once that connection is up, so the power request goes out on it and finds it
    // dead. (Killed before, the request found nothing to connect to: another path.)
    {
        let c = c.clone();
        tokio::task::spawn_blocking(move || {
            wait_for(
                "the coordinator to reach the gateway",
                START_TIMEOUT,
                || {
                    let (_, scrape) = c.http_get("/metrics").map_err(|e| e.to_string())?;
                    match metric(
                        &scrape,
                        &format!("fleetmend_power_gateway_reachable{{gateway=\"{RACK}\"}}"),
                    ) {
                        Some(1.0) => Ok(()),
                        other => Err(format!("reachable = {other:?}")),
                    }
                },
            )
        })
        .await??;
    }
    gw.kill().await?;
    let down_at = std::time::Instant::now();

    let job = tokio::spawn(repair(c.clone(), Duration::from_secs(200)));
    // While the gateway is away the entry is held: still processing, never failed. The
    // request went out on a connection whose peer is dead: the gateway connection's idle
    // timeout (5 s) says so, where the transport's default (30 s) left the step silent.
    {
        let c = c.clone();
        tokio::task::spawn_blocking(move || {
            c.wait_for_log(&["holding the step"], Duration::from_secs(20))
        })
        .await??;
    }
    while down_at.elapsed() < Duration::from_secs(20) {
        let c2 = c.clone();
        let list: Vec<serde_json::Value> =
            tokio::task::spawn_blocking(move || c2.ctl_json(&["repair-queue", "list", "--json"]))
                .await??;
        let e = list.first().context("no entry")?;
        assert_eq!(
            e["status"], "processing",
            "not held while the gateway is down: {e}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(
        rig.cycles(),
        0,
        "nothing reached the BMC while the gateway was down"
    );
    let gw = rig
        .gateway(GatewayOptions {
            quic: Some(quic),
            ..opts
        })
        .await?;
    let (entry, history) = job.await??;
    eprintln!("{history}");
    assert_eq!(
        entry["status"],
        "succeeded",
        "{entry}\n{history}\ngateway log:\n{}",
        gw.log()
    );
    assert!(
        history.contains("held") && history.contains("attempts"),
        "the history does not say the step held:\n{history}"
    );
    wait_until(
        "the cycle to show in ipmi_sim",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok(rig.cycles() == 1) },
    )
    .await?;
    Ok(())
}

/// Issue 34, items 1 and 5: the gateway is killed while the BMC carries out a `@power-cycle`
/// (the cycle went out; its answer never came back) and restarted on its port and state
/// directory. The coordinator notices the lost answer within about a second of the restart
/// (it used to wait for a 10 s keep-alive), resends the same id, and the history says the
/// answer was lost. The gateway answers "outcome unknown"; with `command_retries: 1` the step
/// used to be retried under a new id and the BMC cycled the machine a second time. Now, with
/// no report from the machine's agent showing the first did not happen, it is not retried:
/// the entry fails, saying why, and the BMC saw one cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_whose_outcome_is_unknown_is_not_retried_blind() -> Result<()> {
    let rig = Rig::new().await?;
    let state = tempfile::tempdir()?;
    let opts = GatewayOptions {
        quic: None,
        state_dir: Some(state.path().to_path_buf()),
        ..Default::default()
    };
    let gw = rig.gateway(opts.clone()).await?;
    let quic = gw.quic;
    let c = rig
        .coordinator_steps(
            "c",
            quic,
            "[\"@power-cycle\"]",
            "              command_retries: 1\n              command_interval: 1\n",
        )
        .await?;
    // The BMC takes 3 s to carry out and answer each chassis control, so the gateway can be
    // killed after the cycle went out and before its answer came back.
    rig.sim.slow_set(Some(3))?;
    let job = tokio::spawn(repair(c.clone(), Duration::from_secs(200)));
    wait_until(
        "the gateway to start the cycle",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async { Ok(gw.log().contains("power action started")) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Restarted as systemd would: same port, state directory, certificate and key.
    let tls = gw.tls.clone();
    let first_log = gw.kill().await?;
    let gw = rig
        .gateway(GatewayOptions {
            quic: Some(quic),
            tls: Some(tls),
            ..opts
        })
        .await?;
    let back = std::time::Instant::now();
    // The resend reaches the restarted gateway, which answers it from its record.
    wait_until(
        "the coordinator's resend to reach the restarted gateway",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { Ok(gw.log().contains("repeated request id")) },
    )
    .await
    .with_context(|| format!("first gateway:\n{first_log}\nsecond:\n{}", gw.log()))?;
    let noticed = back.elapsed();
    let (entry, history) = job.await??;
    eprintln!("{history}");
    assert!(
        noticed < Duration::from_secs(4),
        "the lost answer was noticed {noticed:?} after the gateway was back"
    );
    assert_eq!(
        entry["status"],
        "failed",
        "{entry}\n{history}\ngateway log:\n{}",
        gw.log()
    );
    assert!(
        history.contains("outcome unknown") && history.contains("not retried"),
        "the history does not say why the cycle was not retried:\n{history}"
    );
    assert!(
        history.contains("answer was lost"),
        "the history does not say the gateway's answer was lost:\n{history}"
    );
    assert!(
        !gw.log().contains("attempt1"),
        "a retry reached the gateway:\n{}",
        gw.log()
    );
    rig.sim.slow_set(None)?;
    wait_until(
        "the machine to be on again after its one cycle",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { rig.sim.power_is_on().await },
    )
    .await
    .with_context(|| format!("events {:?}", rig.sim.events()))?;
    assert_eq!(rig.cycles(), 1, "events {:?}", rig.sim.events());
    Ok(())
}
