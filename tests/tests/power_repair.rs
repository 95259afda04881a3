//! Built-in power actions of the repair queue, end to end: a real coordinator configured with
//! `[[gateways.targets]]` runs a repair whose steps are `@power-off` and `@power-on`; the
//! actions travel over mutual-TLS QUIC to a real bmc-gateway process, which drives
//! OpenIPMI's `ipmi_sim`. The simulator's own record of chassis commands and ipmitool's reading
//! of its power state confirm what happened, and in which order.
//!
//! Needs `ipmi_sim` and `ipmitool` (scripts/setup-test-deps.sh installs them).

use std::time::Duration;

use anyhow::{Context, Result};
use testkit::bmc_sim::{GatewayProc, IpmiSim, TestPki, find_program};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, wait_for};

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
        metrics.contains("bmc_gateway_action_duration_seconds"),
        "{metrics}"
    );
    Ok(())
}
