//! A local demo fleet on loopback: a coordinator and several real node-agents with
//! certificates made on the fly, each agent watching a fake sysfs/procfs tree.
//!
//! The demo prints the fleet table as machines report, breaks one server's NIC, queues a
//! repair for it with `coordinatorctl repair-queue add` (the repair command stands in for a
//! BMC power cycle: it brings the link back and gives the server a new boot id), waits for
//! the repair queue to finish the entry once the agent reports healthy after "reboot", and
//! finally kills one agent outright so the coordinator marks it unreachable.
//!
//! Everything it starts is a real process talking mutual-TLS QUIC; nothing leaves loopback.
//! Run it through `scripts/demo.sh`, which builds the binaries first.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, start_agent, wait_for};

/// Machines of the demo fleet: addresses from TEST-NET-1 (RFC 5737), used only as names.
const FLEET: &[(&str, &str)] = &[
    ("192.0.2.11", "demo-node-1"),
    ("192.0.2.12", "demo-node-2"),
    ("192.0.2.13", "demo-node-3"),
    ("192.0.2.14", "demo-node-4"),
];

/// Agents report every second: fast enough to watch, slow enough to read.
const INTERVAL: Duration = Duration::from_secs(1);

fn step(text: &str) {
    println!("\n==> {text}");
}

fn show_fleet(c: &Coordinator) -> anyhow::Result<()> {
    let out = c.ctl(&["machines", "list"])?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    Ok(())
}

fn show_queue(c: &Coordinator) -> anyhow::Result<()> {
    let out = c.ctl(&["repair-queue", "list"])?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    Ok(())
}

/// The stand-in for a BMC power cycle: link up, new boot id. Receives the machine's
/// address as its last argument, as every repair command does.
fn write_fake_power_cycle(
    dir: &Path,
    roots: &[(&str, &Path)],
) -> anyhow::Result<std::path::PathBuf> {
    let mut cases = String::new();
    for (addr, root) in roots {
        cases.push_str(&format!("  {addr}) root={:?} ;;\n", root.to_string_lossy()));
    }
    let script = format!(
        "#!/bin/sh\n# Demo stand-in for a BMC power cycle of the machine at $1.\nset -eu\ncase \"$1\" in\n{cases}  *) echo \"unknown machine $1\" >&2; exit 2 ;;\nesac\necho \"power cycling $1\"\nsleep 1\nprintf 'up\\n' > \"$root/sys/class/net/eth0/operstate\"\nprintf '1\\n' > \"$root/sys/class/net/eth0/carrier\"\ncat /proc/sys/kernel/random/uuid > \"$root/proc/sys/kernel/random/boot_id\"\necho \"$1 is back with a new boot id\"\n"
    );
    let path = dir.join("fake-power-cycle.sh");
    std::fs::write(&path, script)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    let keep = std::env::args().any(|a| a == "--keep");
    let work = tempfile::Builder::new()
        .prefix("fleetmend-demo-")
        .tempdir()?;
    let dir = work.path();
    println!("Fleetmend demo: working in {}", dir.display());

    step("Creating the fleet CA and certificates with `coordinatorctl pki`");
    let pki = Pki::create(&dir.join("pki"), "demo.fleetmend")?;

    let mut fixtures = Vec::new();
    let mut kubelets = Vec::new();
    for (addr, host) in FLEET {
        let ip: IpAddr = addr.parse()?;
        fixtures.push(
            NodeFixture::builder(host)
                .nic("eth0")
                .mount("/var")
                .address(ip)
                .build()?,
        );
        kubelets.push(FakeKubelet::start()?);
    }
    let roots: Vec<(&str, &Path)> = FLEET
        .iter()
        .zip(&fixtures)
        .map(|((a, _), f)| (*a, f.root()))
        .collect();
    let cycle = write_fake_power_cycle(dir, &roots)?;
    let repair_yaml = dir.join("repair.yaml");
    std::fs::write(
        &repair_yaml,
        format!(
            "repair:\n  repair_procedures:\n    - machine_types: [\"demo\"]\n      repair_operations:\n        - operation: \"unhealthy\"\n          repair_steps:\n            - repair_command: [{:?}]\n              command_timeout_seconds: 30\n              watch_seconds: 60\n          health_check_command: [\"@agent-healthy\"]\n          command_timeout_seconds: 10\n  max_concurrent_repairs: 2\n",
            cycle.to_string_lossy()
        ),
    )?;
    let mut inventory = String::new();
    for (addr, host) in FLEET {
        inventory.push_str(&format!(
            "[[machines]]\naddress = \"{addr}\"\nhostname = \"{host}\"\nserial = \"SN-{host}\"\nrack = \"rack-1\"\nrole = \"cs\"\nmachine_type = \"demo\"\n\n"
        ));
    }

    step("Starting the coordinator (QUIC on loopback, SQLite on disk)");
    let opts = CoordinatorOptions {
        report_interval: INTERVAL,
        unreachable_grace: INTERVAL * 3,
        inventory: Some(inventory),
        extra: format!("\n[repair]\nconfig = {:?}\n", repair_yaml.to_string_lossy()),
        ..Default::default()
    };
    let coord = Coordinator::start(&dir.join("coordinator"), &pki, &opts)?;
    println!(
        "coordinator serving on {} (metrics on http://{}/metrics)",
        coord.quic, coord.http
    );
    show_fleet(&coord)?;

    step("Starting four node-agents, each with its own certificate");
    let mut agents: Vec<Proc> = Vec::new();
    for (((_, host), fx), kubelet) in FLEET.iter().zip(&fixtures).zip(&kubelets) {
        let tls = pki.issue("node", host, &[])?;
        let cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(INTERVAL)
            .kubelet_url(&kubelet.url());
        let path = fx.write_agent_config(&cfg)?;
        agents.push(start_agent(host, &path, &dir.join(format!("{host}.log")))?);
    }
    for (_, host) in FLEET {
        coord.wait_for_state(host, "healthy", Duration::from_secs(30))?;
    }
    show_fleet(&coord)?;

    let (broken_addr, broken_host) = FLEET[2];
    step(&format!(
        "Pulling the cable: {broken_host}'s eth0 loses carrier"
    ));
    fixtures[2].set_carrier("eth0", false)?;
    coord.wait_for_state(broken_host, "unhealthy", Duration::from_secs(15))?;
    show_fleet(&coord)?;

    step(&format!(
        "Queueing a repair: coordinatorctl repair-queue add unhealthy demo {broken_addr}"
    ));
    coord.ctl(&["repair-queue", "add", "unhealthy", "demo", broken_addr])?;
    show_queue(&coord)?;
    step(
        "Waiting for the repair: power cycle, then the agent must report healthy with a new boot id",
    );
    coord.ctl(&[
        "repair-queue",
        "wait",
        "--timeout-seconds",
        "90",
        "--interval-seconds",
        "1",
    ])?;
    show_queue(&coord)?;
    let list: Vec<serde_json::Value> = coord.ctl_json(&["repair-queue", "list", "--json"])?;
    let entry = list.first().cloned().unwrap_or_default();
    let status = entry["status"].as_str().unwrap_or("missing").to_string();
    // CKE's JSON shape carries the index as a string.
    let index = match &entry["index"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    coord.wait_for_state(broken_host, "healthy", Duration::from_secs(15))?;
    show_fleet(&coord)?;
    step(&format!(
        "The entry's history: coordinatorctl repair-queue show {index}"
    ));
    let out = coord.ctl(&["repair-queue", "show", &index])?;
    print!("{}", String::from_utf8_lossy(&out.stdout));

    let (_, lost_host) = FLEET[3];
    step(&format!(
        "Killing {lost_host}'s agent with SIGKILL: it goes silent"
    ));
    agents[3].sigkill();
    coord.wait_for_state(lost_host, "unreachable", Duration::from_secs(15))?;
    show_fleet(&coord)?;

    if keep {
        step("--keep: leaving the fleet running; press Ctrl-C to stop");
        wait_for("Ctrl-C", Duration::from_secs(24 * 3600), || {
            Err::<(), _>("running".to_string())
        })
        .ok();
    }
    drop(agents);
    drop(coord);
    anyhow::ensure!(
        status == "succeeded",
        "the repair entry ended as {status:?}, not succeeded"
    );
    println!("\nDemo complete: the broken server was repaired and the silent one was caught.");
    Ok(())
}
