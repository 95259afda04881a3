//! Issue 32's end-to-end "must show" for the fence-agent backend and fencing levels, with real
//! processes: a coordinator, a real bmc-gateway running Debian's ClusterLabs fence agents, a
//! node-agent, the fake Kubernetes API server, and as devices OpenIPMI's `ipmi_sim`,
//! `sushy-emulator`, and net-snmp's `snmpd` playing an APC rack PDU:
//! - level 1 `fence_ipmilan` against `ipmi_sim` and `fence_redfish` against
//!   `sushy-emulator`: a dead machine is fenced through the agent, read back off, released and
//!   powered on;
//! - a dual-PSU machine whose BMC dies with it (`ipmi_sim` killed): level 1 cannot reach it,
//!   level 2 (`fence_apc_snmp`) turns both outlets off and reads them off, the workload is
//!   released after both offs, the outlets come back on and the machine returns; the flow's
//!   history and `coordinatorctl fence show` say level 2 acted and why level 1 did not;
//! - one outlet refusing: nothing is released, the flow fails naming the outlet;
//! - the coordinator SIGKILLed between the two outlets' offs resumes with no second action
//!   on either outlet;
//! - a missing agent, a wrong PDU community and an outlet feeding two machines are refused at
//!   start (exit 64) naming the device and the key; `bmc-gateway check` lists every outlet;
//! - `docs/fencing.md`'s dual-PSU example loads in a real gateway, and `check` lists its BMC
//!   and both outlets.
//!
//! Needs `ipmi_sim`, `fence-agents`, `snmpd`/`snmp` and the venv's `sushy-emulator`
//! (scripts/setup-test-deps.sh installs them).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use testkit::bmc_sim::{FakeSystem, GatewayProc, IpmiSim, Sushy, TestPki, gateway_binary};
use testkit::fake_k8s::{BackgroundFake, FakeK8s, NodeSeed, PodSeed};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::pdu_sim::SnmpPdu;
use testkit::procs::{
    CertFiles, Coordinator, CoordinatorOptions, Pki, Proc, start_agent, wait_for,
};

const MACHINE: &str = "10.0.7.1";
const HOST: &str = "f1";
const RACK: &str = "rack-1";
const REPORT: Duration = Duration::from_millis(300);
/// Bound for anything a test causes (the machine is shared and loaded: generous).
const SETTLE: Duration = Duration::from_secs(120);
const COMMUNITY: &str = "pdu-rw-secret";

const REPAIR_YML: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["qemu"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["@fence"]
              command_timeout_seconds: 600
              watch_seconds: 60
          health_check_command: ["@agent-healthy"]
"#;

/// The machine's level 1.
enum Level1 {
    /// `fence_ipmilan` against `ipmi_sim`.
    AgentIpmi,
    /// `fence_redfish` against `sushy-emulator`.
    AgentRedfish,
    /// The gateway's own IPMI client against `ipmi_sim`, with the PDU's two outlets as level 2.
    IpmiThenPdu,
}

struct Rig {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    ipmi: Option<IpmiSim>,
    sushy: Option<(Sushy, String)>,
    pdu: Option<SnmpPdu>,
    gw: GatewayProc,
    _gw_pki: TestPki,
    k8s: BackgroundFake,
    coord: Coordinator,
    pki: Pki,
    fixture: NodeFixture,
    _kubelet: FakeKubelet,
    kubelet_url: String,
    agent: Option<Proc>,
    agent_tls: Option<CertFiles>,
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn write_secret(dir: &Path, name: &str, secret: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let f = dir.join(name);
    std::fs::write(&f, format!("{secret}\n"))?;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// The `[[pdu]]` table of the test PDU, with `community`.
fn pdu_toml(dir: &Path, pdu: &SnmpPdu, name: &str, community: &str) -> Result<String> {
    let f = write_secret(dir, &format!("{name}.community"), community)?;
    Ok(format!(
        "[[pdu]]\nname = \"{name}\"\nagent = \"fence_apc_snmp\"\nhost = \"127.0.0.1\"\nport = {}\npassword_file = {:?}\nsecret_option = \"community\"\ntimeout = \"30s\"\n[pdu.options]\nsnmp_version = \"2c\"\n\n",
        pdu.port,
        f.display().to_string()
    ))
}

impl Rig {
    async fn start(level1: Level1) -> Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let pki = {
            let d = dir.join("pki");
            tokio::task::spawn_blocking(move || Pki::create(&d, "fleet.test")).await??
        };
        let gw_pki = TestPki {
            ca: protocol::pki::Ca::load(&pki.ca_dir)?,
            dir: tempfile::tempdir()?,
        };
        let d = gw_pki.dir.path().to_path_buf();
        let (mut ipmi, mut sushy, mut pdu) = (None, None, None);
        let bmcs = match level1 {
            Level1::AgentIpmi => {
                let sim = IpmiSim::start(true).await?;
                let pw = write_secret(&d, "bmc.pw", &sim.password)?;
                let t = format!(
                    "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN1\"\nprotocol = \"fence-agent\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n[bmc.agent]\nname = \"fence_ipmilan\"\ntimeout = \"60s\"\n[bmc.agent.options]\nlanplus = \"1\"\ncipher = \"3\"\n",
                    sim.port,
                    sim.username,
                    pw.display().to_string()
                );
                ipmi = Some(sim);
                t
            }
            Level1::AgentRedfish => {
                let sys = FakeSystem::new(1, "f1", true);
                let s = Sushy::start(&gw_pki.ca, std::slice::from_ref(&sys)).await?;
                let pw = write_secret(&d, "bmc.pw", &s.password)?;
                let t = format!(
                    "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN1\"\nprotocol = \"fence-agent\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n[bmc.agent]\nname = \"fence_redfish\"\ntimeout = \"60s\"\n[bmc.agent.options]\nssl_insecure = \"1\"\nsystems_uri = \"/redfish/v1/Systems/{}\"\n",
                    s.port,
                    s.username,
                    pw.display().to_string(),
                    sys.uuid
                );
                sushy = Some((s, sys.uuid));
                t
            }
            Level1::IpmiThenPdu => {
                let sim = IpmiSim::start(true).await?;
                let p = SnmpPdu::start(8, COMMUNITY).await?;
                let pw = write_secret(&d, "bmc.pw", &sim.password)?;
                let mut t = pdu_toml(&d, &p, "pdu-a", COMMUNITY)?;
                t += &format!(
                    "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN1\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n[bmc.ipmi]\nreply_timeout = \"500ms\"\nattempts = 2\n[[bmc.level]]\noutlets = [\"pdu-a:3\", \"pdu-a:4\"]\n",
                    sim.port,
                    sim.username,
                    pw.display().to_string()
                );
                ipmi = Some(sim);
                pdu = Some(p);
                t
            }
        };
        let gw = GatewayProc::start(&gw_pki, &bmcs).await?;

        let k8s = tokio::task::spawn_blocking(FakeK8s::start_background).await??;
        k8s.add_namespace("db", &[]);
        k8s.add_node(NodeSeed::new(HOST, MACHINE).label("zone", "a"));
        k8s.add_pod(PodSeed::new("db", "web-0", HOST).owner("StatefulSet", "web"));
        k8s.add_volume_attachment("csi-web-0", HOST);
        k8s.renew_lease(HOST);
        k8s.set_kubelet_alive(HOST, true);
        k8s.run_kubelets(Duration::from_millis(500), Duration::from_secs(3));

        let repair = dir.join("repair.yml");
        std::fs::write(&repair, REPAIR_YML)?;
        let extra = format!(
            "[repair]\nconfig = {:?}\n\n[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"1s\"\nrequest_timeout = \"5s\"\n\n[[gateways.targets]]\nname = \"{RACK}\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = [\"{RACK}\"]\n\n",
            repair.display().to_string(),
            k8s.kubeconfig().display().to_string(),
            gw.quic
        );
        let inventory = format!(
            "[[machines]]\naddress = \"{MACHINE}\"\nhostname = \"{HOST}\"\nserial = \"SN1\"\nrack = \"{RACK}\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n"
        );
        let coord = {
            let (d, pki) = (dir.join("coord"), pki.clone());
            tokio::task::spawn_blocking(move || {
                Coordinator::start(
                    &d,
                    &pki,
                    &CoordinatorOptions {
                        report_interval: REPORT,
                        unreachable_grace: REPORT * 3,
                        inventory: Some(inventory),
                        extra,
                        health_extra: String::new(),
                    },
                )
            })
            .await??
        };
        let fixture = NodeFixture::builder(HOST)
            .address(MACHINE.parse()?)
            .serial("SN1")
            .build()?;
        let kubelet = FakeKubelet::start()?;
        let kubelet_url = kubelet.url();
        let mut rig = Self {
            _tmp: tmp,
            dir,
            ipmi,
            sushy,
            pdu,
            gw,
            _gw_pki: gw_pki,
            k8s,
            coord,
            pki,
            fixture,
            _kubelet: kubelet,
            kubelet_url,
            agent: None,
            agent_tls: None,
        };
        rig.start_agent()?;
        blocking(|| rig.coord.wait_for_state(HOST, "healthy", SETTLE))?;
        Ok(rig)
    }

    fn start_agent(&mut self) -> Result<()> {
        let tls = match &self.agent_tls {
            Some(t) => t.clone(),
            None => {
                let t = Coordinator::agent_tls(&self.pki, HOST)?;
                self.agent_tls = Some(t.clone());
                t
            }
        };
        let cfg = self.fixture.write_agent_config(
            &AgentConfig::new(&self.coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
                .report_interval(REPORT)
                .kubelet_url(&self.kubelet_url),
        )?;
        let n = std::fs::read_dir(&self.dir)?.count();
        self.agent = Some(start_agent(
            HOST,
            &cfg,
            &self.dir.join(format!("agent-{n}.log")),
        )?);
        Ok(())
    }

    /// The machine dies: its agent is killed and its kubelet stops renewing the Lease; with
    /// `bmc_too`, its BMC dies with it (ipmi_sim killed).
    fn kill_machine(&mut self, bmc_too: bool) {
        if let Some(mut a) = self.agent.take() {
            a.sigkill();
        }
        self.k8s.set_kubelet_alive(HOST, false);
        if bmc_too {
            drop(self.ipmi.take());
        }
    }

    fn boot_machine(&mut self) -> Result<()> {
        self.fixture.new_boot_id()?;
        self.start_agent()?;
        self.k8s.set_kubelet_alive(HOST, true);
        Ok(())
    }

    fn enqueue_unreachable(&self) -> Result<()> {
        blocking(|| {
            self.coord
                .ctl(&["repair-queue", "add", "unreachable", "qemu", MACHINE, "SN1"])
        })?;
        Ok(())
    }

    fn entries(&self) -> Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }

    /// Requests that change the Node or delete pods and VolumeAttachments, with when.
    fn release_writes(&self) -> Vec<(SystemTime, String)> {
        self.k8s
            .requests()
            .into_iter()
            .filter(|r| {
                r.method != "GET"
                    && (r.path.contains("/nodes/")
                        || r.path.contains("/pods")
                        || r.path.contains("volumeattachments"))
            })
            .map(|r| (r.at, format!("{} {}", r.method, r.path)))
            .collect()
    }

    fn pdu(&self) -> &SnmpPdu {
        self.pdu.as_ref().expect("a PDU rig")
    }

    /// The one fence flow as `coordinatorctl fence show --json` gives it, and its table.
    fn fence_show(&self) -> Result<(Value, String)> {
        let flows: Vec<Value> = blocking(|| self.coord.ctl_json(&["fence", "list", "--json"]))?;
        let id = flows.first().context("no fence flow")?["id"].to_string();
        let json: Value = blocking(|| self.coord.ctl_json(&["fence", "show", &id, "--json"]))?;
        let table = blocking(|| self.coord.ctl(&["fence", "show", &id]))?;
        Ok((json, String::from_utf8_lossy(&table.stdout).into_owned()))
    }
}

/// Waits until the machine's entry has ended; boots the machine once `powered_on` says so.
async fn finish(rig: &mut Rig, powered_on: impl Fn(&Rig) -> bool) -> Result<Value> {
    let t = Instant::now();
    let mut booted = false;
    loop {
        if !booted && powered_on(rig) {
            booted = true;
            rig.boot_machine()?;
        }
        let list = blocking(|| rig.entries())?;
        if let Some(e) = list.first()
            && matches!(e["status"].as_str(), Some("succeeded" | "failed"))
        {
            return Ok(e.clone());
        }
        if t.elapsed() > SETTLE {
            bail!(
                "entry not finished within {SETTLE:?}: {list:?}\ngateway log:\n{}",
                rig.gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The flow's events, one string.
fn events(show: &Value) -> String {
    show["steps"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|s| s["event"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// `fence_ipmilan` against `ipmi_sim`: fenced through the agent, read back off, released,
/// powered on; the simulator logged one off and one on, and the release came after the off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_ipmilan_fences_a_dead_machine_through_the_agent() -> Result<()> {
    let mut rig = Rig::start(Level1::AgentIpmi).await?;
    rig.kill_machine(false);
    rig.enqueue_unreachable()?;
    let e = finish(&mut rig, |r| {
        r.ipmi
            .as_ref()
            .is_some_and(|s| s.events().iter().any(|e| e == "set power 1"))
    })
    .await?;
    assert_eq!(e["status"], "succeeded", "{e:#}\n{}", rig.gw.log());
    let sim = rig.ipmi.as_ref().unwrap();
    let events_ = sim.events();
    let count = |v: &str| {
        events_
            .iter()
            .filter(|e| *e == &format!("set power {v}"))
            .count()
    };
    assert_eq!((count("0"), count("1")), (1, 1), "{events_:?}");
    assert!(sim.power_is_on().await?, "machine left off");
    let off = sim
        .timed_events()
        .into_iter()
        .find(|(_, e)| e == "set power 0")
        .map(|(t, _)| t)
        .context("no off")?;
    let writes = rig.release_writes();
    assert!(!writes.is_empty());
    for (at, what) in &writes {
        assert!(*at > off, "{what} came before the BMC powered off");
    }
    assert!(rig.k8s.pods_on(HOST).is_empty(), "the pod was not released");
    let log = rig.gw.log();
    assert!(
        !log.contains(&sim.password),
        "the BMC password is in the gateway log"
    );
    Ok(())
}

/// `fence_redfish` against `sushy-emulator`, the same story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_redfish_fences_a_dead_machine_through_the_agent() -> Result<()> {
    let mut rig = Rig::start(Level1::AgentRedfish).await?;
    rig.kill_machine(false);
    rig.enqueue_unreachable()?;
    let uuid = rig.sushy.as_ref().unwrap().1.clone();
    let e = finish(&mut rig, |r| {
        let (s, u) = r.sushy.as_ref().unwrap();
        s.resets(u).iter().any(|x| x == "On" || x == "ForceOn")
    })
    .await?;
    let (s, _) = rig.sushy.as_ref().unwrap();
    assert_eq!(
        e["status"],
        "succeeded",
        "{e:#}\n{}\n{}",
        rig.gw.log(),
        s.log()
    );
    let resets = s.resets(&uuid);
    let offs = resets.iter().filter(|r| r.contains("Off")).count();
    let ons = resets.iter().filter(|r| r.contains("On")).count();
    assert_eq!((offs, ons), (1, 1), "{resets:?}");
    assert_eq!(s.power_state(&uuid).await?, "On");
    assert!(rig.k8s.pods_on(HOST).is_empty(), "the pod was not released");
    Ok(())
}

/// Invariant 12: the BMC dies with its machine; level 2 turns both outlets of the dual-PSU
/// machine off, reads both off, the workload is released after both offs, the outlets come
/// back on and the machine returns. The history says which level acted and why level 1 did
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_bmc_is_fenced_by_both_pdu_outlets_and_the_machine_returns() -> Result<()> {
    let mut rig = Rig::start(Level1::IpmiThenPdu).await?;
    rig.kill_machine(true);
    rig.enqueue_unreachable()?;
    let e = finish(&mut rig, |r| {
        let s = r.pdu().sets();
        s.contains(&"on 3".to_string()) && s.contains(&"on 4".to_string())
    })
    .await?;
    assert_eq!(e["status"], "succeeded", "{e:#}\n{}", rig.gw.log());
    let pdu = rig.pdu();
    assert_eq!(pdu.sets(), ["off 3", "off 4", "on 3", "on 4"]);
    assert!(pdu.outlet_on(3) && pdu.outlet_on(4));
    let last_off = pdu
        .timed_sets()
        .into_iter()
        .filter(|(_, s)| s.starts_with("off"))
        .map(|(t, _)| t)
        .max()
        .context("no off")?;
    let writes = rig.release_writes();
    assert!(!writes.is_empty());
    for (at, what) in &writes {
        assert!(*at > last_off, "{what} came before both outlets were off");
    }
    assert!(rig.k8s.pods_on(HOST).is_empty(), "the pod was not released");
    let (show, table) = rig.fence_show()?;
    let ev = events(&show);
    assert!(
        ev.contains("level 2 (pdu-a outlet 3, pdu-a outlet 4) acted"),
        "{ev}"
    );
    assert!(
        ev.contains("the levels before it did not act: level 1 (BMC"),
        "{ev}"
    );
    assert!(
        table.contains("level 2 (pdu-a outlet 3, pdu-a outlet 4) acted"),
        "{table}"
    );
    assert!(
        !rig.gw.log().contains(COMMUNITY),
        "the community is in the gateway log"
    );
    Ok(())
}

/// One of the two outlets refuses: nothing is released, the flow fails naming the outlet, and
/// the machine is not left off by the other outlet for good (the entry failed: a person
/// decides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_outlet_releases_nothing_and_the_flow_names_it() -> Result<()> {
    let mut rig = Rig::start(Level1::IpmiThenPdu).await?;
    rig.pdu().refuse(4, true)?;
    rig.kill_machine(true);
    rig.enqueue_unreachable()?;
    let e = finish(&mut rig, |_| false).await?;
    assert_eq!(e["status"], "failed", "{e:#}");
    assert!(
        rig.release_writes().is_empty(),
        "{:?}",
        rig.release_writes()
    );
    assert_eq!(rig.k8s.pods_on(HOST).len(), 1, "the pod was released");
    let (show, _) = rig.fence_show()?;
    let failure = show["failure"].as_str().context("no failure")?.to_string();
    assert!(failure.contains("pdu-a outlet 4"), "{failure}");
    assert!(
        failure.contains("fence_apc_snmp off of outlet 4"),
        "{failure}"
    );
    assert!(failure.contains("nothing released"), "{failure}");
    assert!(
        failure.contains("level 1 (BMC"),
        "every level's words: {failure}"
    );
    assert!(rig.pdu().sets().contains(&"refused 4".to_string()));
    Ok(())
}

/// The coordinator is SIGKILLed between the two outlets' offs (outlet 3 reads on for 6 s after
/// its off, so the gateway is still on it): the restarted coordinator resumes the flow, the
/// gateway answers its repeated request from the one run, and each outlet took one off and
/// one on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_between_the_two_outlets_offs_acts_on_neither_again() -> Result<()> {
    let mut rig = Rig::start(Level1::IpmiThenPdu).await?;
    rig.pdu().lag(3, 6.0)?;
    rig.kill_machine(true);
    rig.enqueue_unreachable()?;
    blocking(|| {
        wait_for("outlet 3's off", SETTLE, || {
            rig.pdu()
                .sets()
                .contains(&"off 3".to_string())
                .then_some(())
                .ok_or_else(|| format!("{:?}", rig.pdu().sets()))
        })
    })?;
    assert!(
        !rig.pdu().sets().contains(&"off 4".to_string()),
        "too late: {:?}",
        rig.pdu().sets()
    );
    rig.coord.proc.as_mut().context("coordinator")?.sigkill();
    rig.coord.proc.take();
    // Outlet 4 goes off while no coordinator runs.
    blocking(|| {
        wait_for("outlet 4's off", SETTLE, || {
            rig.pdu()
                .sets()
                .contains(&"off 4".to_string())
                .then_some(())
                .ok_or_else(|| format!("{:?}", rig.pdu().sets()))
        })
    })?;
    blocking(|| rig.coord.restart())?;
    let e = finish(&mut rig, |r| {
        let s = r.pdu().sets();
        s.contains(&"on 3".to_string()) && s.contains(&"on 4".to_string())
    })
    .await?;
    assert_eq!(e["status"], "succeeded", "{e:#}\n{}", rig.gw.log());
    assert_eq!(rig.pdu().sets(), ["off 3", "off 4", "on 3", "on 4"]);
    Ok(())
}

/// Runs `bmc-gateway` (start or `check`) with `config` and returns its exit code and output.
async fn gateway_run(config: &Path, check: bool) -> Result<(Option<i32>, String)> {
    let mut cmd = tokio::process::Command::new(gateway_binary()?);
    if check {
        cmd.arg("check");
    }
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        cmd.arg("--config")
            .arg(config)
            .env("FLEETMEND_LOG", "info")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("bmc-gateway did not end within 60 s")??;
    Ok((
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// A missing agent, a wrong community and an outlet feeding two machines are refused at start
/// with exit 64, naming the device and the key; `check` lists every outlet's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fence_devices_are_refused_at_start_naming_device_and_key() -> Result<()> {
    let pki = TestPki::new()?;
    let pdu = SnmpPdu::start(4, COMMUNITY).await?;
    let d = pki.dir.path();
    let (cert, key) = pki.issue_files(protocol::Role::Gateway, "rack-1")?;
    let pw = write_secret(d, "bmc.pw", "secret")?;
    let head = format!(
        "listen = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\n",
        d.join("state").display(),
        pki.ca_file()?.display(),
        cert.display(),
        key.display()
    );
    let bmc = |m: &str, host: &str, outlets: &str| {
        format!(
            "[[bmc]]\nmachine = \"{m}\"\nprotocol = \"ipmi\"\nhost = \"{host}\"\nusername = \"u\"\npassword_file = {:?}\n[[bmc.level]]\noutlets = [{outlets}]\n",
            pw.display().to_string()
        )
    };
    let write = |name: &str, text: String| -> Result<PathBuf> {
        let f = d.join(name);
        std::fs::write(&f, format!("{head}{text}"))?;
        Ok(f)
    };
    // An outlet shared by two machines.
    let shared = write(
        "shared.toml",
        format!(
            "{}{}{}",
            pdu_toml(d, &pdu, "pdu-a", COMMUNITY)?,
            bmc("10.0.0.1", "192.0.2.1", "\"pdu-a:1\", \"pdu-a:2\""),
            bmc("10.0.0.2", "192.0.2.2", "\"pdu-a:2\"")
        ),
    )?;
    let (code, out) = gateway_run(&shared, false).await?;
    assert_eq!(code, Some(64), "{out}");
    assert!(out.contains("bmc[1].level[0].outlets[0]"), "{out}");
    assert!(
        out.contains("outlet pdu-a:2 also feeds bmc[0]'s machine 10.0.0.1"),
        "{out}"
    );
    // A fence agent that is not installed.
    let missing = write(
        "missing.toml",
        pdu_toml(d, &pdu, "pdu-a", COMMUNITY)?.replace("fence_apc_snmp", "fence_no_such_agent"),
    )?;
    let (code, out) = gateway_run(&missing, false).await?;
    assert_eq!(code, Some(64), "{out}");
    assert!(out.contains("pdu[0].agent"), "{out}");
    assert!(
        out.contains("\"fence_no_such_agent\" is not installed"),
        "{out}"
    );
    let (code, out) = gateway_run(&missing, true).await?;
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("pdu[0].agent"), "{out}");
    // A wrong community: the PDU does not answer monitor; the start is refused naming it.
    let wrong = write(
        "wrong.toml",
        format!(
            "{}{}",
            pdu_toml(d, &pdu, "pdu-a", "not-the-community")?,
            bmc("10.0.0.1", "192.0.2.1", "\"pdu-a:1\"")
        ),
    )?;
    let (code, out) = gateway_run(&wrong, false).await?;
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("pdu[0]: PDU pdu-a (fence_apc_snmp 127.0.0.1:"),
        "{out}"
    );
    assert!(
        out.contains("did not answer fence_apc_snmp monitor"),
        "{out}"
    );
    assert!(
        !out.contains("not-the-community"),
        "the community is in the output: {out}"
    );
    // `check` with the right community lists each outlet's state beside the BMCs.
    pdu.refuse(1, false)?;
    let good = write(
        "good.toml",
        format!(
            "{}{}",
            pdu_toml(d, &pdu, "pdu-a", COMMUNITY)?,
            bmc("10.0.0.1", "192.0.2.1", "\"pdu-a:1\", \"pdu-a:2\"")
        ),
    )?;
    let (_, out) = gateway_run(&good, true).await?;
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("level 2: pdu-a outlet"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows.iter()
            .all(|r| r.contains("fence_apc_snmp") && r.contains(" on")),
        "{out}"
    );
    Ok(())
}

/// `text` with `from` replaced by `to`; an error when `from` is not in it (the example this
/// test swaps addresses in has changed: update the test with it).
fn swap(text: &str, from: &str, to: &str) -> Result<String> {
    if !text.contains(from) {
        bail!("docs/fencing.md's dual-PSU example no longer holds {from:?}:\n{text}");
    }
    Ok(text.replace(from, to))
}

/// `docs/fencing.md`'s dual-PSU example, as written, only its addresses pointed at two
/// `snmpd` PDUs and `ipmi_sim` and its secret files at this test's: a real gateway loads it
/// and `bmc-gateway check` lists the BMC and outlet 11 of both PDUs with their state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dual_psu_example_of_the_fencing_docs_loads_and_check_lists_every_device() -> Result<()>
{
    let doc = std::fs::read_to_string(testkit::procs::workspace_root().join("docs/fencing.md"))?;
    let example = doc
        .split_once("A dual-PSU machine fed by")
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(toml, _)| toml)
        .context("docs/fencing.md: no ```toml block after \"A dual-PSU machine fed by\"")?;
    let (pdu_a, pdu_b) = (
        SnmpPdu::start(11, "community-a").await?,
        SnmpPdu::start(11, "community-b").await?,
    );
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let d = pki.dir.path();
    let (cert, key) = pki.issue_files(protocol::Role::Gateway, RACK)?;
    let mut text = example.to_string();
    for (pdu, name, host) in [
        (&pdu_a, "pdu-a", "10.0.101.250"),
        (&pdu_b, "pdu-b", "10.0.101.251"),
    ] {
        let secret = write_secret(d, &format!("{name}.community"), &pdu.community)?;
        text = swap(
            &text,
            &format!("host = \"{host}\""),
            &format!("host = \"127.0.0.1\"\nport = {}", pdu.port),
        )?;
        text = swap(
            &text,
            &format!("\"/etc/fleetmend/bmc/{name}.community\""),
            &format!("{:?}", secret.display().to_string()),
        )?;
    }
    let pw = write_secret(d, "bmc.pw", &sim.password)?;
    text = swap(
        &text,
        "host = \"10.0.101.11\"",
        &format!("host = \"127.0.0.1\"\nport = {}", sim.port),
    )?;
    text = swap(
        &text,
        "username = \"fleetmend\"",
        &format!("username = {:?}", sim.username),
    )?;
    text = swap(
        &text,
        "\"/etc/fleetmend/bmc/10.0.1.11.pw\"",
        &format!("{:?}", pw.display().to_string()),
    )?;
    let config = d.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\n{text}",
            d.join("state").display(),
            pki.ca_file()?.display(),
            cert.display(),
            key.display()
        ),
    )?;
    let (code, out) = gateway_run(&config, true).await?;
    assert_eq!(code, Some(0), "{out}");
    let row = |what: &str| -> Result<&str> {
        out.lines()
            .find(|l| l.contains(what))
            .with_context(|| format!("no row with {what:?} in:\n{out}"))
    };
    let bmc = row(&format!("127.0.0.1:{}", sim.port))?;
    assert!(bmc.contains("10.0.1.11") && bmc.contains(" on"), "{out}");
    for (pdu, name) in [(&pdu_a, "pdu-a"), (&pdu_b, "pdu-b")] {
        let outlet = row(&format!(
            "level 2: {name} outlet 11 (127.0.0.1:{})",
            pdu.port
        ))?;
        assert!(
            outlet.contains("fence_apc_snmp") && outlet.contains(" on"),
            "{out}"
        );
    }
    // Read, not switched: check never acts on a device.
    assert!(pdu_a.sets().is_empty() && pdu_b.sets().is_empty());
    Ok(())
}
