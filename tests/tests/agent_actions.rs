//! Issue 12's end-to-end "must show": agent-side actions as repair steps, with real
//! node-agent processes and a real coordinator process over mutual-TLS QUIC on loopback.
//! The agents' `[actions]` commands are small shell scripts writing into the test directory
//! (and, for a "reboot", a new boot id into the agent's fixture root), so what ran and how
//! often is counted from files:
//! - `@restart-unit kubelet` runs the configured command once, even when the coordinator is
//!   SIGKILLed mid-step and the restarted one resends the request,
//! - `@collect-diagnostics` then `@reboot`: the diagnostics are stored, bounded, listed in
//!   `repair-queue show` and by `coordinatorctl diagnostics`; the agent says goodbye with
//!   reason reboot, comes back with a new boot id, the entry succeeds and the machine never
//!   turns unreachable,
//! - an action the agent's config does not allow is refused with that reason and the step
//!   fails, so the procedure escalates to its next step,
//! - a node certificate cannot ask another agent for anything,
//! - a whole `unhealthy` procedure on a machine whose kubelet stays broken walks
//!   `@restart-unit kubelet` → `@reboot` → `@power-cycle`, the last through a real bmc-gateway
//!   process driving OpenIPMI's `ipmi_sim` (needs `ipmi_sim` and `ipmitool`),
//! - a restart the agent was SIGKILLed in is not run again under its id: the agent answers
//!   "outcome unknown" from its restart record and the coordinator asks once more under a new
//!   id; and (with `setpriv`) the killed agent's command does not run on,
//! - a retry of a restart step that gave up before the agent's command ended shares the
//!   restart still running instead of starting a second one,
//! - SIGTERM while the reboot command runs stops the agent at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    Coordinator, CoordinatorOptions, Pki, Proc, inventory_toml, start_agent, wait_for,
};

/// Bound for anything the test causes (commands are instant or sleep a few seconds).
const SETTLE: Duration = Duration::from_secs(60);

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pki: Pki,
    coord: Coordinator,
}

impl Env {
    /// A coordinator with `yaml` (`@D@` = the test directory) and machines
    /// `(address, hostname)`.
    fn start(yaml: &str, machines: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_with(yaml, machines, |_| Ok(String::new()))
    }

    /// As [`Env::start`], with more coordinator config from `extra` (given the fleet PKI).
    fn start_with(
        yaml: &str,
        machines: &[(&str, &str)],
        extra: impl FnOnce(&Pki) -> anyhow::Result<String>,
    ) -> anyhow::Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
        let cluster = dir.join("repair.yml");
        std::fs::write(&cluster, yaml.replace("@D@", &dir.display().to_string()))?;
        let opts = CoordinatorOptions {
            extra: format!(
                "[repair]\nconfig = {:?}\n{}",
                cluster.display().to_string(),
                extra(&pki)?
            ),
            inventory: Some(inventory_toml(machines)),
            ..Default::default()
        };
        let coord = Coordinator::start(&dir.join("coord"), &pki, &opts)?;
        Ok(Self {
            _tmp: tmp,
            dir,
            pki,
            coord,
        })
    }

    /// Starts the agent of `host` at `address` with `[actions]` text appended to its
    /// config (`@D@` = the test directory, `@ROOT@` = the agent's fixture root).
    fn agent(
        &self,
        host: &str,
        address: &str,
        actions: &str,
        fixture: impl FnOnce(
            testkit::fixture::NodeFixtureBuilder,
        ) -> testkit::fixture::NodeFixtureBuilder,
    ) -> anyhow::Result<(NodeFixture, Proc)> {
        let fx = fixture(NodeFixture::builder(host).address(address.parse()?)).build()?;
        let tls = Coordinator::agent_tls(&self.pki, host)?;
        let cfg = fx.write_agent_config(
            &AgentConfig::new(&self.coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
                .report_interval(Duration::from_millis(300)),
        )?;
        let mut text = std::fs::read_to_string(&cfg)?;
        text.push_str("\n[actions]\n");
        if !actions.contains("state_dir") {
            // Never the packaged /var/lib default: restart ids are recorded there.
            text.push_str(&format!(
                "state_dir = {:?}\n",
                self.dir.join(format!("state-{host}"))
            ));
        }
        text.push_str(
            &actions
                .replace("@D@", &self.dir.display().to_string())
                .replace("@ROOT@", &fx.root().display().to_string()),
        );
        std::fs::write(&cfg, text)?;
        let agent = start_agent(host, &cfg, &self.dir.join(format!("{host}.log")))?;
        Ok((fx, agent))
    }

    fn add(&self, op: &str, address: &str) -> anyhow::Result<String> {
        let out = self
            .coord
            .ctl(&["repair-queue", "add", op, "qemu", address])?;
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    fn show(&self, index: &str) -> anyhow::Result<Value> {
        self.coord
            .ctl_json(&["repair-queue", "show", index, "--json"])
    }

    fn history(&self, index: &str) -> anyhow::Result<Vec<(String, String)>> {
        Ok(self.show(index)?["history"]
            .as_array()
            .context("history")?
            .iter()
            .map(|h| {
                (
                    h["event"].as_str().unwrap_or("").to_string(),
                    h["detail"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect())
    }

    /// Waits until entry `index` is finished; returns its `show --json`.
    fn finished(&self, index: &str) -> anyhow::Result<Value> {
        wait_for(&format!("entry {index} to finish"), SETTLE, || {
            let v = self.show(index).map_err(|e| e.to_string())?;
            match v["status"].as_str() {
                Some("succeeded") | Some("failed") => Ok(v),
                _ => Err(format!("{v}")),
            }
        })
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Waits until a test command has written its first line to `path`: the agent logs an
/// action before its command runs, so its log line alone does not say the command started.
fn wait_for_first_line(what: &str, path: &Path) -> anyhow::Result<()> {
    wait_for(what, SETTLE, || {
        (lines(path) > 0).then_some(()).ok_or("not yet".to_string())
    })?;
    Ok(())
}

#[test]
fn restart_unit_runs_once_even_when_the_coordinator_resends_it() -> anyhow::Result<()> {
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@restart-unit\", \"kubelet\"]\n              command_timeout_seconds: 120\n              watch_seconds: 30\n          health_check_command: [\"@agent-healthy\"]\n";
    let mut env = Env::start(yaml, &[("10.12.0.1", "node-a")])?;
    // The restart takes 4 s: long enough to kill the coordinator while it runs.
    let (_fx, agent) = env.agent(
        "node-a",
        "10.12.0.1",
        "restart_command = [\"sh\", \"-c\", \"echo \\\"$0\\\" >> @D@/restarts; sleep 4\"]\n",
        |b| b,
    )?;
    env.coord.wait_for_state("node-a", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.1")?;
    let restarts = env.dir.join("restarts");
    wait_for_first_line("the restart command to start", &restarts)?;
    // The coordinator dies mid-step; the next one resumes the step and asks again with the
    // same request id.
    env.coord.proc.take().context("coordinator")?.sigkill();
    env.coord.restart()?;
    let v = env.finished(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(
        std::fs::read_to_string(&restarts)?,
        "kubelet\n",
        "the restart command ran more than once"
    );
    agent.wait_for_log(&["request seen before"], SETTLE)?;
    let history = env.history(&i)?;
    assert!(
        history
            .iter()
            .any(|(ev, d)| ev == "command-succeeded" && d.contains("restart-unit kubelet")),
        "{history:?}"
    );
    Ok(())
}

#[test]
fn diagnostics_then_reboot_say_goodbye_and_succeed_on_a_new_boot_id() -> anyhow::Result<()> {
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@collect-diagnostics\"]\n              watch_seconds: 1\n            - repair_command: [\"@reboot\"]\n              command_timeout_seconds: 60\n              watch_seconds: 30\n          health_check_command: [\"@agent-healthy\"]\n";
    let env = Env::start(yaml, &[("10.12.0.2", "node-b")])?;
    // The "reboot": the link comes back and the kernel has a new boot id.
    let reboot = "echo x >> @D@/reboots; echo up > @ROOT@/sys/class/net/eth0/operstate; echo 1 > @ROOT@/sys/class/net/eth0/carrier; echo 0a0b0c0d-1111-2222-3333-444455556666 > @ROOT@/proc/sys/kernel/random/boot_id";
    let actions = format!(
        "reboot = true\nreboot_command = [\"sh\", \"-c\", {reboot:?}]\nstate_dir = \"@D@/state-b\"\ndiagnostics_max_bytes = 8192\njournal_command = [\"sh\", \"-c\", \"seq 1 200000; echo newest-line-of-$0\"]\nkernel_log_command = [\"sh\", \"-c\", \"echo kernel: eth0 link down\"]\n"
    );
    let (fx, agent) = env.agent("node-b", "10.12.0.2", &actions, |b| b.nic("eth0"))?;
    let boot_before = fx.boot_id();
    env.coord.wait_for_state("node-b", "healthy", SETTLE)?;
    fx.set_carrier("eth0", false)?;
    env.coord.wait_for_state("node-b", "unhealthy", SETTLE)?;

    let i = env.add("unhealthy", "10.12.0.2")?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}\n{history:?}");
    assert_eq!(v["step"], 1, "{v}");
    assert_eq!(lines(&env.dir.join("reboots")), 1, "rebooted once");
    assert_ne!(fx.boot_id(), boot_before);
    assert!(
        history
            .iter()
            .any(|(ev, d)| ev == "command-succeeded" && d.contains("new boot")),
        "{history:?}"
    );

    // The goodbye said reboot, and no detector took the machine for crashed.
    agent.wait_for_log(&["saying goodbye", "Reboot"], SETTLE)?;
    env.coord
        .wait_for_log(&["agent said goodbye", "Reboot"], SETTLE)?;
    // Goodbye first, then the reboot: the new boot connects after the goodbye was taken.
    let log = env.coord.log_text();
    let bye = log
        .find("agent said goodbye")
        .context("no goodbye in the coordinator log")?;
    let back = log
        .find("boot_id=0a0b0c0d-1111-2222-3333-444455556666")
        .context("the agent never came back from the new boot")?;
    assert!(bye < back, "the new boot connected before the goodbye");
    let m = env.coord.machine("10.12.0.2")?;
    assert!(
        m.transitions.iter().all(|t| t.to != "unreachable"),
        "the reboot was taken for a crash: {:?}",
        m.transitions
    );
    assert_eq!(
        m.boot_id.as_deref(),
        Some("0a0b0c0d-1111-2222-3333-444455556666")
    );

    // Diagnostics: kept with the entry, bounded, each part named, the newest journal lines
    // kept, the failing check's detail included.
    let diags = v["diagnostics"].as_array().context("diagnostics in show")?;
    assert_eq!(diags.len(), 1, "{v}");
    assert!(
        diags[0]["bytes"].as_u64().unwrap_or(u64::MAX) <= 8192,
        "{v}"
    );
    assert_eq!(diags[0]["truncated_parts"][0], "journal kubelet", "{v}");
    let listed: Vec<Value> = env
        .coord
        .ctl_json(&["diagnostics", "list", "10.12.0.2", "--json"])?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["entry_index"].to_string(), i);
    let got: Value = env
        .coord
        .ctl_json(&["diagnostics", "get", "10.12.0.2", "--json"])?;
    let content = got["content"].as_str().context("content")?;
    for part in [
        "===== journal kubelet (truncated) =====",
        "[… truncated by node-agent]",
        "newest-line-of-kubelet",
        "===== journal containerd (truncated) =====",
        "===== kernel log =====",
        "kernel: eth0 link down",
        "===== failing checks =====",
        "nic eth0 fail",
        "===== mounts =====",
        "===== nic counters =====",
    ] {
        assert!(content.contains(part), "{part:?} missing from:\n{content}");
    }
    assert!(content.len() < 8192 + 1024, "{} bytes", content.len());
    let text = String::from_utf8(env.coord.ctl(&["repair-queue", "show", &i])?.stdout)?;
    assert!(text.contains("diagnostics:"), "{text}");
    Ok(())
}

#[test]
fn disallowed_actions_are_refused_and_the_procedure_escalates() -> anyhow::Result<()> {
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@restart-unit\", \"docker\"]\n            - repair_command: [\"@reboot\"]\n            - repair_command: [\"sh\", \"-c\", \"touch @D@/power-cycled-$1\", \"power\"]\n              watch_seconds: 30\n          health_check_command: [\"sh\", \"-c\", \"test -f @D@/power-cycled-$1 && echo true || echo false\", \"check\"]\n";
    let env = Env::start(yaml, &[("10.12.0.3", "node-c")])?;
    // Defaults: kubelet and containerd may be restarted, reboot is off.
    let (_fx, agent) = env.agent(
        "node-c",
        "10.12.0.3",
        "restart_command = [\"sh\", \"-c\", \"echo \\\"$0\\\" >> @D@/restarts\"]\nreboot_command = [\"sh\", \"-c\", \"echo x >> @D@/reboots\"]\nstate_dir = \"@D@/state-c\"\n",
        |b| b,
    )?;
    env.coord.wait_for_state("node-c", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.3")?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}\n{history:?}");
    assert_eq!(v["step"], 2, "{v}");
    let escalated: Vec<&String> = history
        .iter()
        .filter(|(ev, _)| ev == "escalated")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(escalated.len(), 2, "{history:?}");
    assert!(
        escalated[0].contains("not-allowed") && escalated[0].contains("allowed_units"),
        "{}",
        escalated[0]
    );
    assert!(
        escalated[1].contains("not-allowed") && escalated[1].contains("reboot = true"),
        "{}",
        escalated[1]
    );
    assert_eq!(lines(&env.dir.join("restarts")), 0, "a refused restart ran");
    assert_eq!(lines(&env.dir.join("reboots")), 0, "a refused reboot ran");
    agent.wait_for_log(&["action refused"], SETTLE)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_cannot_ask_another_agent_for_anything() -> anyhow::Result<()> {
    use protocol::Role;
    use protocol::actions::{ActionRequest, AgentAction, MAX_ACTION_FRAME_LEN};
    use protocol::messages::{AdminHello, AgentHello, HelloBody};
    use protocol::transport::{self, TlsFiles, TlsMaterial, TransportError};

    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"true\"]\n          health_check_command: [\"@agent-healthy\"]\n";
    let env = tokio::task::spawn_blocking(move || {
        Env::start(yaml, &[("10.12.0.4", "node-d"), ("10.12.0.5", "node-e")])
    })
    .await??;
    let env = std::sync::Arc::new(env);
    let (_fx, _agent) = env.agent(
        "node-d",
        "10.12.0.4",
        "restart_command = [\"sh\", \"-c\", \"echo \\\"$0\\\" >> @D@/restarts-d\"]\n",
        |b| b,
    )?;
    {
        let env = env.clone();
        tokio::task::spawn_blocking(move || env.coord.wait_for_state("node-d", "healthy", SETTLE))
            .await??;
    }

    // node-e's certificate, used by a hand-made client instead of an agent.
    let tls = Coordinator::agent_tls(&env.pki, "node-e")?;
    let material = TlsMaterial::load(&TlsFiles {
        ca: tls.ca.clone(),
        cert: tls.cert.clone(),
        key: tls.key.clone(),
    })?;
    let addr = env.coord.quic;
    let ask = ActionRequest {
        id: "rogue-1".into(),
        action: AgentAction::RestartUnit {
            unit: "kubelet".into(),
        },
    };

    // 1. Through its own agent session: the coordinator accepts no stream an agent opens,
    //    so the request goes nowhere and is never answered.
    let endpoint = material.client_endpoint(addr)?;
    let hello = AgentHello {
        hostname: "node-e".into(),
        serial: String::new(),
        addresses: vec!["10.12.0.5".parse()?],
        agent_version: "rogue".into(),
        boot_id: "b".into(),
    };
    let session = transport::connect(
        &endpoint,
        addr,
        "127.0.0.1",
        Role::Coordinator,
        HelloBody::Agent(hello),
    )
    .await?;
    let (mut send, mut recv) = session.conn.open_bi().await?;
    transport::write_msg(&mut send, &ask, MAX_ACTION_FRAME_LEN).await?;
    let _ = send.finish();
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        transport::read_payload(&mut recv, MAX_ACTION_FRAME_LEN),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(Some(_)))),
        "the coordinator answered an action stream opened by a node: {answer:?}"
    );
    session.conn.close(0u32.into(), b"done");

    // 2. Through the admin API (which could start repairs or read diagnostics): refused.
    let endpoint = material.client_endpoint(addr)?;
    match transport::connect(
        &endpoint,
        addr,
        "127.0.0.1",
        Role::Coordinator,
        HelloBody::Admin(AdminHello {
            client: "rogue".into(),
        }),
    )
    .await
    {
        Err(TransportError::Refused(r)) => {
            assert_eq!(
                r.code,
                protocol::messages::RefusalCode::NotAuthorized,
                "{r}"
            )
        }
        Err(e) => bail!("expected a not-authorized refusal, got {e}"),
        Ok(_) => bail!("a node certificate opened an admin session"),
    }

    // 3. As node-d (another machine): the hello is refused, the certificate says node-e.
    let endpoint = material.client_endpoint(addr)?;
    let hello = AgentHello {
        hostname: "node-d".into(),
        serial: String::new(),
        addresses: vec![],
        agent_version: "rogue".into(),
        boot_id: "b".into(),
    };
    match transport::connect(
        &endpoint,
        addr,
        "127.0.0.1",
        Role::Coordinator,
        HelloBody::Agent(hello),
    )
    .await
    {
        Err(TransportError::Refused(r)) => {
            assert_eq!(
                r.code,
                protocol::messages::RefusalCode::IdentityMismatch,
                "{r}"
            )
        }
        Err(e) => bail!("expected an identity refusal, got {e}"),
        Ok(_) => bail!("node-e's certificate spoke for node-d"),
    }

    // node-d's agent never restarted anything.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(lines(&env.dir.join("restarts-d")), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_kubelet_escalates_restart_then_reboot_then_power_cycle() -> anyhow::Result<()> {
    use testkit::bmc_sim::{GatewayProc, IpmiSim, TestPki};
    use testkit::fixture::FakeKubelet;

    const ADDR: &str = "10.12.0.7";
    const HOST: &str = "esc-1";
    let sim = IpmiSim::start(true).await?;
    let gw_pki = std::sync::Arc::new(std::sync::Mutex::new(None::<TestPki>));
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@restart-unit\", \"kubelet\"]\n              command_timeout_seconds: 30\n              watch_seconds: 2\n            - repair_command: [\"@reboot\"]\n              command_timeout_seconds: 60\n              watch_seconds: 2\n            - repair_command: [\"@power-cycle\"]\n              command_timeout_seconds: 90\n              watch_seconds: 60\n          health_check_command: [\"@agent-healthy\"]\n";
    // The gateway needs the fleet PKI, which Env creates: start it from inside.
    let (sim_port, sim_user, sim_pass) = (sim.port, sim.username.clone(), sim.password.clone());
    let gw_slot = gw_pki.clone();
    let rt = tokio::runtime::Handle::current();
    let (env, gw) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut gw = None;
        let env = Env::start_with(yaml, &[(ADDR, HOST)], |pki| {
            let tp = TestPki {
                ca: protocol::pki::Ca::load(&pki.ca_dir)?,
                dir: tempfile::tempdir()?,
            };
            let pw = tp.dir.path().join("bmc.pw");
            std::fs::write(&pw, format!("{sim_pass}\n"))?;
            let bmcs = format!(
                "[[bmc]]\nmachine = \"{ADDR}\"\nserial = \"SN-{HOST}\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {sim_port}\nusername = \"{sim_user}\"\npassword_file = {:?}\n",
                pw.to_string_lossy()
            );
            let g = rt.block_on(GatewayProc::start(&tp, &bmcs))?;
            let extra = format!(
                "\n[[gateways.targets]]\nname = \"r1\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = [\"r1\"]\n",
                g.quic
            );
            *gw_slot.lock().unwrap() = Some(tp);
            gw = Some(g);
            Ok(extra)
        })?;
        Ok((env, gw.context("gateway")?))
    })
    .await??;
    let env = std::sync::Arc::new(env);

    // The kubelet answers 500 whatever the agent restarts, and after the "reboot" too.
    let kubelet = FakeKubelet::start()?;
    kubelet.set_healthy(false);
    let fx = NodeFixture::builder(HOST).address(ADDR.parse()?).build()?;
    let tls = Coordinator::agent_tls(&env.pki, HOST)?;
    let cfg = fx.write_agent_config(
        &AgentConfig::new(&env.coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_millis(300))
            .kubelet_url(&kubelet.url()),
    )?;
    let d = env.dir.display().to_string();
    let root = fx.root().display().to_string();
    let mut text = std::fs::read_to_string(&cfg)?;
    text.push_str(&format!(
        "\n[actions]\nreboot = true\nstate_dir = \"{d}/state-esc\"\nrestart_command = [\"sh\", \"-c\", \"echo \\\"$0\\\" >> {d}/restarts\"]\nreboot_command = [\"sh\", \"-c\", \"echo x >> {d}/reboots; echo 1b1b1b1b-0000-0000-0000-000000000001 > {root}/proc/sys/kernel/random/boot_id\"]\n"
    ));
    std::fs::write(&cfg, text)?;
    let _agent = start_agent(HOST, &cfg, &env.dir.join(format!("{HOST}.log")))?;
    {
        let env = env.clone();
        tokio::task::spawn_blocking(move || env.coord.wait_for_state(HOST, "unhealthy", SETTLE))
            .await??;
    }
    let i = {
        let env = env.clone();
        tokio::task::spawn_blocking(move || env.add("unhealthy", ADDR)).await??
    };

    // The machine "boots" once its BMC power-cycled it: new boot id, a working kubelet.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(150);
    while !sim
        .events()
        .iter()
        .any(|e| e.starts_with("set power") || e.starts_with("set reset"))
    {
        if tokio::time::Instant::now() > deadline {
            let h = env.history(&i)?;
            bail!(
                "no power action reached the BMC: {h:?}\ngateway log:\n{}",
                gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fx.new_boot_id()?;
    kubelet.set_healthy(true);

    let v = {
        let env = env.clone();
        let i = i.clone();
        tokio::task::spawn_blocking(move || env.finished(&i)).await??
    };
    let history = env.history(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}\n{history:?}");
    assert_eq!(v["step"], 2, "{history:?}");
    let events: Vec<&str> = history.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        events.iter().filter(|e| **e == "next-step").count(),
        2,
        "restart and reboot each watched, then escalated: {history:?}"
    );
    assert_eq!(lines(&env.dir.join("restarts")), 1, "{history:?}");
    assert_eq!(lines(&env.dir.join("reboots")), 1, "{history:?}");
    assert!(
        history
            .iter()
            .any(|(e, d)| e == "command-succeeded" && d.contains("@power-cycle")),
        "{history:?}"
    );
    // The entry can succeed (new boot id, healthy) before ipmi_sim has applied the "on" half
    // of its chassis cycle; the machine must end powered on, so wait for it a while.
    let on_by = tokio::time::Instant::now() + Duration::from_secs(20);
    while !sim.power_is_on().await? {
        assert!(
            tokio::time::Instant::now() < on_by,
            "machine left off; the BMC saw {:?}\ngateway log:\n{}",
            sim.events(),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agent was still there before the power cycle: its diagnostics were kept first.
    assert!(
        history
            .iter()
            .any(|(e, d)| e == "command-succeeded" && d.contains("kept first")),
        "{history:?}"
    );
    assert_eq!(v["diagnostics"].as_array().map(Vec::len), Some(1), "{v}");
    drop(gw_pki);
    Ok(())
}

/// A restart step on `node` with `timeout` s and `retries`; `@agent-healthy` checks it.
fn restart_yaml(timeout: u64, retries: u32) -> String {
    format!(
        "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@restart-unit\", \"kubelet\"]\n              command_timeout_seconds: {timeout}\n              command_retries: {retries}\n              watch_seconds: 30\n          health_check_command: [\"@agent-healthy\"]\n"
    )
}

/// A restart command that logs its start to `restarts` and, 3 s later, its end to `ends`,
/// and notes in `overlaps` a start while another run is still going.
const SLOW_RESTART: &str = "restart_command = [\"sh\", \"-c\", \"test -e @D@/running && echo x >> @D@/overlaps; touch @D@/running; echo \\\"$0\\\" >> @D@/restarts; sleep 3; rm -f @D@/running; echo x >> @D@/ends\"]\n";

#[test]
fn a_restart_the_agent_was_killed_in_is_not_run_again_under_its_id() -> anyhow::Result<()> {
    let env = Env::start(&restart_yaml(120, 0), &[("10.12.0.8", "node-k")])?;
    let (fx, mut agent) = env.agent("node-k", "10.12.0.8", SLOW_RESTART, |b| b)?;
    env.coord.wait_for_state("node-k", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.8")?;
    let restarts = env.dir.join("restarts");
    wait_for_first_line("the restart command to start", &restarts)?;
    // Killed mid-command and started again: the coordinator resends the same id.
    agent.sigkill();
    let cfg = fx.path_of("etc/fleetmend/node-agent.toml");
    let again = start_agent("node-k", &cfg, &env.dir.join("node-k-2.log"))?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}\n{history:?}");
    again.wait_for_log(&["request seen before"], SETTLE)?;
    assert!(
        history.iter().any(|(ev, d)| ev == "command-succeeded"
            && d.contains("sent again as")
            && d.contains("-resend1: the agent stopped while it ran the first")),
        "{history:?}"
    );
    // Once for the id the agent was killed in, once for the resend: never twice per id.
    assert_eq!(lines(&restarts), 2, "restarts: {}", lines(&restarts));
    if protocol::process_tree::pdeathsig_helper().is_some()
        && std::env::var_os("INVOCATION_ID").is_none()
    {
        // The kernel killed the first command with the agent: only the resend's run ended.
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(
            lines(&env.dir.join("ends")),
            1,
            "the killed agent's command ran on"
        );
    }
    Ok(())
}

#[test]
fn a_retried_restart_step_shares_the_restart_still_running() -> anyhow::Result<()> {
    // Each attempt gives up after 2 s; a retry comes while the agent's 3 s command runs.
    let env = Env::start(&restart_yaml(2, 2), &[("10.12.0.9", "node-l")])?;
    let (_fx, agent) = env.agent("node-l", "10.12.0.9", SLOW_RESTART, |b| b)?;
    env.coord.wait_for_state("node-l", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.9")?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}\n{history:?}");
    agent.wait_for_log(&["sharing its outcome instead of restarting again"], SETTLE)?;
    assert!(
        history
            .iter()
            .any(|(ev, d)| ev == "command-succeeded" && d.contains("one run shared with request")),
        "{history:?}"
    );
    assert!(
        history.iter().any(|(ev, d)| ev == "command-failed"
            && d.contains("accepted restart-unit kubelet but its command was still running")),
        "{history:?}"
    );
    assert_eq!(lines(&env.dir.join("restarts")), 1, "restarted twice");
    assert_eq!(
        lines(&env.dir.join("overlaps")),
        0,
        "two restarts ran at once"
    );
    Ok(())
}

#[test]
fn sigterm_while_the_reboot_command_runs_stops_the_agent_at_once() -> anyhow::Result<()> {
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@reboot\"]\n              command_timeout_seconds: 60\n          health_check_command: [\"@agent-healthy\"]\n";
    let env = Env::start(yaml, &[("10.12.0.10", "node-m")])?;
    // A reboot that takes its time (as a real shutdown does while it stops the agent).
    let actions =
        "reboot = true\nreboot_command = [\"sh\", \"-c\", \"echo x >> @D@/reboots; sleep 30\"]\n";
    let (fx, mut agent) = env.agent("node-m", "10.12.0.10", actions, |b| b)?;
    env.coord.wait_for_state("node-m", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.10")?;
    agent.wait_for_log(&["rebooting as the coordinator asked"], SETTLE)?;
    // The log line comes before the command runs: wait until it has (a SIGTERM in between
    // would kill the shell before its first line, and the count below would be 0).
    let reboots = env.dir.join("reboots");
    wait_for_first_line("the reboot command to start", &reboots)?;
    let started = std::time::Instant::now();
    let code = agent.sigterm(Duration::from_secs(10))?;
    assert_eq!(code, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The id stays recorded for a resend.
    let record = std::fs::read_to_string(env.dir.join("state-node-m/reboot-requests"))?;
    assert!(
        record.contains("the agent was stopped while the reboot command ran"),
        "{record}"
    );
    // Started again in the same boot: the machine did not reboot, and the step learns it
    // from the agent's answer at once, not at the end of its 60 s.
    let cfg = fx.path_of("etc/fleetmend/node-agent.toml");
    let _again = start_agent("node-m", &cfg, &env.dir.join("node-m-2.log"))?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        history
            .iter()
            .any(|(_, d)| d.contains("outcome unknown") && d.contains("did not reboot")),
        "{history:?}"
    );
    assert_eq!(lines(&reboots), 1, "rebooted again");
    Ok(())
}

/// Issue 31, fencing tokens at the agent: a copy of the coordinator's database taken while
/// the store was at epoch 1, started after the live store's coordinator has acted at epoch 3
/// (and after the agent restarted), starts at epoch 2: the agent refuses its restart before
/// running anything, with the gateways' words, the refusal is the step's answer in the
/// entry's history, and the coordinator says it no longer leads.
#[test]
fn an_agent_refuses_the_actions_of_an_older_epoch_also_after_its_restart() -> anyhow::Result<()> {
    let yaml = "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"@restart-unit\", \"kubelet\"]\n              watch_seconds: 30\n          health_check_command: [\"@agent-healthy\"]\n";
    let mut env = Env::start(yaml, &[("10.12.0.9", "node-f")])?;
    let db = env.coord.dir.join("coordinator.db");
    // The live store: epoch 1 now. Stopped cleanly, copied (file and WAL), started twice more.
    let code = env
        .coord
        .proc
        .take()
        .context("coordinator")?
        .sigterm(SETTLE)?;
    assert_eq!(code, Some(0));
    let stale = env.dir.join("stale.db");
    std::fs::copy(&db, &stale)?;
    for ext in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{ext}", db.display()));
        if side.exists() {
            std::fs::copy(&side, format!("{}{ext}", stale.display()))?;
        }
    }
    env.coord.restart()?;
    env.coord.restart()?;
    env.coord
        .wait_for_log(&["fencing epoch of this start", "epoch=3"], SETTLE)?;
    let (fx, agent) = env.agent(
        "node-f",
        "10.12.0.9",
        "restart_command = [\"sh\", \"-c\", \"echo \\\"$0\\\" >> @D@/restarts\"]\n",
        |b| b,
    )?;
    env.coord.wait_for_state("node-f", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.9")?;
    let v = env.finished(&i)?;
    assert_eq!(v["status"], "succeeded", "{v}");
    let restarts = env.dir.join("restarts");
    assert_eq!(lines(&restarts), 1);

    // The agent restarts (its record is on disk), and the stale copy takes over the port.
    let mut agent = agent;
    agent.sigterm(SETTLE)?;
    let code = env
        .coord
        .proc
        .take()
        .context("coordinator")?
        .sigterm(SETTLE)?;
    assert_eq!(code, Some(0));
    let config = std::fs::read_to_string(&env.coord.config)?;
    std::fs::write(
        &env.coord.config,
        config.replace(
            &format!("{:?}", db.display().to_string()),
            &format!("{:?}", stale.display().to_string()),
        ),
    )?;
    env.coord.restart()?;
    env.coord
        .wait_for_log(&["fencing epoch of this start", "epoch=2"], SETTLE)?;
    let agent = testkit::procs::start_agent(
        "node-f",
        &fx.root().join("etc/fleetmend/node-agent.toml"),
        &env.dir.join("node-f-2.log"),
    )?;
    env.coord.wait_for_state("node-f", "healthy", SETTLE)?;
    let i = env.add("unhealthy", "10.12.0.9")?;
    let v = env.finished(&i)?;
    let history = env.history(&i)?;
    assert_eq!(v["status"], "failed", "{v}\n{history:?}");
    assert!(
        history.iter().any(|(_, d)| d.contains("older-epoch")
            && d.contains("refused: epoch 2 is older than 3 for store")
            && d.contains("a newer coordinator leads")),
        "{history:?}"
    );
    assert_eq!(lines(&restarts), 1, "the stale coordinator's restart ran");
    agent.wait_for_log(&["action refused", "epoch=2"], SETTLE)?;
    env.coord
        .wait_for_log(&["the agent refused this coordinator's action"], SETTLE)?;
    Ok(())
}
