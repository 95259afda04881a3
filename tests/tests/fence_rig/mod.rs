//! The fencing rig the end-to-end fence tests share (`fencing.rs` on SQLite, `etcd_fencing.rs`
//! on etcd): one machine with its `ipmi_sim` BMC behind a real bmc-gateway, its Node, Lease,
//! StatefulSet pod and VolumeAttachment on the fake API server, its node-agent and kubelet,
//! and a coordinator whose store is SQLite or, with [`Tuning::store`], an etcd.
//!
//! Not a test file of its own: each test file includes it with `mod fence_rig;`, so items one
//! file does not use are allowed to stay unused there.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use testkit::bmc_sim::{BusyBmc, GatewayProc, IpmiSim, TestPki};
use testkit::fake_k8s::{BackgroundFake, FakeK8s, NodeSeed, PodSeed};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{
    CertFiles, Coordinator, CoordinatorOptions, Pki, Proc, metric, start_agent, wait_for,
};

pub(crate) const MACHINE: &str = "10.0.7.1";
pub(crate) const HOST: &str = "f1";
pub(crate) const RACK: &str = "rack-1";
pub(crate) const REPORT: Duration = Duration::from_millis(300);
/// Bound for anything a test causes (the machine is shared and loaded: generous).
pub(crate) const SETTLE: Duration = Duration::from_secs(90);

/// `@fence`, then the agent must be back and healthy.
pub(crate) const REPAIR_YML: &str = r#"
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

/// The detection settings of a rig.
#[derive(Clone)]
pub(crate) struct Tuning {
    /// Agent report interval (unreachable after three silent ones).
    pub(crate) report: Duration,
    /// The `[remediation]` section, empty for none.
    pub(crate) remediation: String,
    /// `kubernetes.node_view_refresh`.
    pub(crate) view_refresh: &'static str,
    /// How often live kubelets renew their Lease, and after how long without a renewal the
    /// node lifecycle controller turns Ready Unknown.
    pub(crate) kubelet: (Duration, Duration),
    /// The coordinator's `[store]` section, empty for SQLite (the default).
    pub(crate) store: String,
}

impl Tuning {
    /// Short everything, as the functional tests use. The fixture's crash kernel is loaded,
    /// so `kdump_wait` is 0: these machines die without a dump (the kdump test sets it).
    pub(crate) fn quick(remediation: bool) -> Self {
        Self {
            report: REPORT,
            remediation: if remediation {
                "[remediation]\ninterval = \"500ms\"\nlease_stale = \"3s\"\nkdump_wait = \"0s\"\n\
                 [remediation.limits]\nfleet_cap = { count = 10, percent = 100 }\n\
                 self_isolation = { settle = \"1s\" }\n"
                    .into()
            } else {
                String::new()
            },
            view_refresh: "1s",
            // Kubelets renew every 500 ms; a Node silent for 3 s turns Ready Unknown.
            kubelet: (Duration::from_millis(500), Duration::from_secs(3)),
            store: String::new(),
        }
    }

    /// With the coordinator's state in the etcd at `endpoints`, under `prefix` (one per
    /// test, so tests sharing an etcd never see each other's keys).
    pub(crate) fn on_etcd(mut self, endpoints: &[String], prefix: &str) -> Self {
        let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
        self.store = format!(
            "[store]\nbackend = \"etcd\"\nendpoints = [{}]\nprefix = \"{prefix}/\"\ntimeout = \"2s\"\n\n",
            list.join(", ")
        );
        self
    }

    /// With `[ha] lease_ttl = ttl`: several coordinators of the store elect a leader.
    pub(crate) fn with_lease_ttl(mut self, ttl: &str) -> Self {
        self.store
            .push_str(&format!("[ha]\nlease_ttl = \"{ttl}\"\n\n"));
        self
    }
}

/// How a crash test brings the fence flow back after the coordinator died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// The same coordinator is started again (systemd's restart).
    Restart,
    /// A standby started before the crash takes the lead (etcd with `[ha]`).
    Failover,
}

/// The machine's BMC: OpenIPMI's simulator, or a pyghmi BMC that is busy after an off.
pub(crate) enum Sim {
    Ipmi(IpmiSim),
    Busy(BusyBmc),
}

impl Sim {
    pub(crate) fn login(&self) -> (u16, &str, &str) {
        match self {
            Sim::Ipmi(s) => (s.port, &s.username, &s.password),
            Sim::Busy(s) => (s.port, &s.username, &s.password),
        }
    }

    pub(crate) fn events(&self) -> Vec<String> {
        match self {
            Sim::Ipmi(s) => s.events(),
            Sim::Busy(s) => s.events(),
        }
    }

    pub(crate) fn timed_events(&self) -> Vec<(SystemTime, String)> {
        match self {
            Sim::Ipmi(s) => s.timed_events(),
            Sim::Busy(s) => s.timed_events(),
        }
    }

    pub(crate) fn ipmi(&self) -> &IpmiSim {
        match self {
            Sim::Ipmi(s) => s,
            Sim::Busy(_) => panic!("not ipmi_sim"),
        }
    }
}

/// One machine with its BMC, gateway, Node, agent and kubelet, and a coordinator.
pub(crate) struct Rig {
    pub(crate) _tmp: tempfile::TempDir,
    pub(crate) dir: PathBuf,
    pub(crate) sim: Sim,
    pub(crate) _gw: GatewayProc,
    pub(crate) k8s: BackgroundFake,
    pub(crate) coord: Coordinator,
    /// Other coordinators of the same store (standbys), which the agent knows too.
    pub(crate) peers: Vec<Coordinator>,
    pub(crate) pki: Pki,
    pub(crate) fixture: NodeFixture,
    pub(crate) kubelet: FakeKubelet,
    pub(crate) agent: Option<Proc>,
    pub(crate) agent_tls: Option<CertFiles>,
    pub(crate) report: Duration,
}

impl Rig {
    /// Everything up and healthy; with `remediation`, automatic remediation finds dead
    /// machines (else entries are added by hand).
    pub(crate) async fn start(remediation: bool) -> Result<Self> {
        Self::start_with(remediation, REPAIR_YML, None).await
    }

    /// As [`Rig::start_tuned`] with short settings.
    pub(crate) async fn start_with(
        remediation: bool,
        repair_yml: &str,
        busy_on: Option<Duration>,
    ) -> Result<Self> {
        Self::start_tuned(Tuning::quick(remediation), repair_yml, busy_on).await
    }

    /// As [`Rig::start`], with `tuning`, the `repair:` file `repair_yml`, and with a BMC
    /// that refuses power-on as busy for `busy_on` after an off (pyghmi's) instead of
    /// `ipmi_sim`.
    pub(crate) async fn start_tuned(
        tuning: Tuning,
        repair_yml: &str,
        busy_on: Option<Duration>,
    ) -> Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let sim = match busy_on {
            None => Sim::Ipmi(IpmiSim::start(true).await?),
            Some(d) => Sim::Busy(BusyBmc::start(d).await?),
        };
        let (port, username, password) = sim.login();
        let pki = {
            let d = dir.join("pki");
            tokio::task::spawn_blocking(move || Pki::create(&d, "fleet.test")).await??
        };
        let gw_pki = TestPki {
            ca: protocol::pki::Ca::load(&pki.ca_dir)?,
            dir: tempfile::tempdir()?,
        };
        let pw_file = gw_pki.dir.path().join("bmc.pw");
        std::fs::write(&pw_file, format!("{password}\n"))?;
        let bmcs = format!(
            "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN1\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {port}\nusername = \"{username}\"\npassword_file = {:?}\n",
            pw_file.to_string_lossy()
        );
        let gw = GatewayProc::start(&gw_pki, &bmcs).await?;

        let k8s = tokio::task::spawn_blocking(FakeK8s::start_background).await??;
        k8s.add_namespace("db", &[]);
        k8s.add_node(NodeSeed::new(HOST, MACHINE).label("zone", "a"));
        k8s.add_pod(PodSeed::new("db", "web-0", HOST).owner("StatefulSet", "web"));
        k8s.add_volume_attachment("csi-web-0", HOST);
        k8s.renew_lease(HOST);
        k8s.set_kubelet_alive(HOST, true);
        k8s.run_kubelets(tuning.kubelet.0, tuning.kubelet.1);

        let repair = dir.join("repair.yml");
        std::fs::write(&repair, repair_yml)?;
        let mut extra = format!(
            "[repair]\nconfig = {:?}\n\n[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"{}\"\nrequest_timeout = \"5s\"\n\n[[gateways.targets]]\nname = \"{RACK}\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = [\"{RACK}\"]\n\n",
            repair.display().to_string(),
            k8s.kubeconfig().display().to_string(),
            tuning.view_refresh,
            gw.quic
        );
        extra.push_str(&tuning.remediation);
        extra.push_str(&tuning.store);
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
                        report_interval: tuning.report,
                        unreachable_grace: tuning.report * 3,
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
        let mut rig = Self {
            report: tuning.report,
            _tmp: tmp,
            dir,
            sim,
            _gw: gw,
            k8s,
            coord,
            peers: Vec::new(),
            pki,
            fixture,
            kubelet,
            agent: None,
            agent_tls: None,
        };
        rig.start_agent()?;
        blocking(|| rig.coord.wait_for_state(HOST, "healthy", SETTLE))?;
        Ok(rig)
    }

    pub(crate) fn start_agent(&mut self) -> Result<()> {
        let tls = match &self.agent_tls {
            Some(t) => t.clone(),
            None => {
                let t = Coordinator::agent_tls(&self.pki, HOST)?;
                self.agent_tls = Some(t.clone());
                t
            }
        };
        let addresses: Vec<String> = std::iter::once(&self.coord)
            .chain(&self.peers)
            .map(|c| c.quic.to_string())
            .collect();
        let cfg = self.fixture.write_agent_config(
            &AgentConfig::new(&addresses.join(","), &tls.ca, &tls.cert, &tls.key)
                .report_interval(self.report)
                .kubelet_url(&self.kubelet.url()),
        )?;
        let n = std::fs::read_dir(&self.dir)?.count();
        self.agent = Some(start_agent(
            HOST,
            &cfg,
            &self.dir.join(format!("agent-{n}.log")),
        )?);
        Ok(())
    }

    /// The machine dies: its agent is killed and its kubelet stops renewing the Lease.
    pub(crate) fn kill_machine(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.sigkill();
        }
        self.k8s.set_kubelet_alive(HOST, false);
    }

    /// The machine boots again: a new boot id, the agent and the kubelet start.
    pub(crate) fn boot_machine(&mut self) -> Result<()> {
        self.fixture.new_boot_id()?;
        self.start_agent()?;
        self.k8s.set_kubelet_alive(HOST, true);
        Ok(())
    }

    pub(crate) fn entries(&self) -> Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }

    pub(crate) fn show(&self, index: &str) -> Result<Value> {
        self.coord
            .ctl_json(&["repair-queue", "show", index, "--json"])
    }

    /// When the simulator first applied power `v` (`0` off, `1` on).
    pub(crate) fn first_power(&self, v: &str) -> Option<SystemTime> {
        let want = format!("set power {v}");
        self.sim
            .timed_events()
            .into_iter()
            .find(|(_, e)| *e == want)
            .map(|(t, _)| t)
    }

    /// How many `set power V` the simulator logged. Read from the timed log, which the
    /// chassis script writes after the plain one, so once this counts a line both logs hold
    /// it (waiting on the plain log and then reading the timed one raced).
    pub(crate) fn count_power(&self, v: &str) -> usize {
        let want = format!("set power {v}");
        self.sim
            .timed_events()
            .iter()
            .filter(|(_, e)| *e == want)
            .count()
    }

    /// The simulator saw exactly one power-off and one power-on: nothing repeated.
    pub(crate) fn assert_one_off_one_on(&self) {
        for v in ["0", "1"] {
            assert_eq!(
                self.count_power(v),
                1,
                "not exactly one `set power {v}`: {:?}",
                self.sim.events()
            );
        }
    }

    /// Requests that change the Node (taint, delete, restore), with when they came.
    /// Queues the machine as `unreachable` by hand (`coordinatorctl repair-queue add`).
    pub(crate) fn enqueue_unreachable(&self) -> Result<()> {
        blocking(|| {
            self.coord
                .ctl(&["repair-queue", "add", "unreachable", "qemu", MACHINE, "SN1"])
        })?;
        Ok(())
    }

    /// Waits until the simulator has applied a power-on.
    pub(crate) fn wait_powered_on(&self) -> Result<()> {
        blocking(|| {
            wait_for("the simulator to power the machine on", SETTLE, || {
                (self.count_power("1") > 0)
                    .then_some(())
                    .ok_or_else(|| format!("power log {:?}", self.sim.events()))
            })
        })
    }

    /// The machine as a finished flow leaves it: one off and one on, powered on, and its
    /// Node without the out-of-service taint.
    pub(crate) fn assert_back(&self) -> Result<()> {
        self.assert_one_off_one_on();
        assert!(blocking(|| self.sim_power_is_on())?, "machine left off");
        assert!(
            !self.has_out_of_service_taint(),
            "the Node was not restored: {:?}",
            self.k8s.node(HOST)
        );
        Ok(())
    }

    pub(crate) fn node_writes(&self) -> Vec<(SystemTime, String)> {
        let path = format!("/api/v1/nodes/{HOST}");
        self.k8s
            .requests()
            .into_iter()
            .filter(|r| r.method != "GET" && r.path == path)
            .map(|r| (r.at, format!("{} {}", r.method, r.path)))
            .collect()
    }

    /// Whether the simulator's chassis is on (asked over IPMI, or the busy BMC's state).
    pub(crate) fn sim_power_is_on(&self) -> Result<bool> {
        match &self.sim {
            Sim::Ipmi(s) => tokio::runtime::Handle::current().block_on(s.power_is_on()),
            Sim::Busy(s) => Ok(s.power_is_on()),
        }
    }

    /// The end of a fence flow under way: once the BMC powers the machine on it boots, its
    /// entry must succeed and the machine be back ([`Rig::assert_back`]); the entry.
    pub(crate) fn fence_completes(&mut self) -> Result<Value> {
        self.wait_powered_on()?;
        self.boot_machine()?;
        let v = blocking(|| finished(self, SETTLE))?;
        assert_eq!(v["status"], "succeeded", "{v:#}");
        self.assert_back()?;
        Ok(v)
    }

    /// The BMC saw no power request.
    pub(crate) fn assert_no_power(&self) {
        let sent: Vec<String> = self
            .sim
            .events()
            .into_iter()
            .filter(|e| e.starts_with("set power"))
            .collect();
        assert!(sent.is_empty(), "a power request reached the BMC: {sent:?}");
    }

    pub(crate) fn has_out_of_service_taint(&self) -> bool {
        self.k8s.node(HOST).is_some_and(|n| {
            n["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "node.kubernetes.io/out-of-service")
            })
        })
    }
}

/// Runs a blocking wait on this multi-threaded runtime.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

pub(crate) fn index_of(e: &Value) -> String {
    match &e["index"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Waits until the machine's entry has ended; returns it with its history.
pub(crate) fn finished(rig: &Rig, timeout: Duration) -> Result<Value> {
    let e = wait_for("a repair entry", timeout, || {
        rig.entries()
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or_else(|| "no entry yet".to_string())
    })?;
    let index = index_of(&e);
    wait_for(&format!("entry {index} to finish"), timeout, || {
        let v = rig.show(&index).map_err(|e| e.to_string())?;
        match v["status"].as_str() {
            Some("succeeded") | Some("failed") => Ok(v),
            _ => Err(v.to_string()),
        }
    })
}

/// The kill points of the crash test: after each state's commit (the action not yet taken)
/// and before some (the action taken, its result not yet committed). Names as in
/// `coordinator/src/fence/killpoint.rs`.
pub(crate) const KILL_POINTS: &[&str] = &[
    "after:plan",
    "after:power-off",
    "before:confirm-off",
    "after:confirm-off",
    "after:release",
    "after:wait-released",
    "after:power-on",
    "before:wait-back",
    "after:wait-back",
    "after:restore",
    "before:done",
];

/// Runs `run` at each of [`KILL_POINTS`] (those of `FENCE_KILL_POINTS`, comma-separated, when
/// set), printing the table of outcomes; fails if one failed or fewer than 8 ran.
pub(crate) async fn kill_point_table<F, Fut>(mut run: F) -> Result<()>
where
    F: FnMut(&'static str) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let only = std::env::var("FENCE_KILL_POINTS").ok();
    let mut table = Vec::new();
    let mut failed = 0;
    for point in KILL_POINTS {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|p| p == *point))
        {
            continue;
        }
        let outcome = match run(point).await {
            Ok(o) => format!("ok: {o}"),
            Err(e) => {
                failed += 1;
                format!("FAILED: {e:#}")
            }
        };
        eprintln!("{point:<22} {outcome}");
        table.push((point, outcome));
    }
    eprintln!("\nkill point             outcome");
    for (p, o) in &table {
        eprintln!("{p:<22} {}", o.lines().next().unwrap_or(""));
    }
    assert!(table.len() >= 8 || only.is_some(), "too few kill points");
    assert_eq!(failed, 0, "see the table above");
    Ok(())
}

/// One crash run: the coordinator kills itself at `point` during the flow of an `@fence`
/// entry, is started again, and the flow must complete with one off and one on, the
/// machine on, and no Node write before the off. Returns the outcome for the table.
pub(crate) async fn crash_at(point: &str) -> Result<String> {
    crash_at_with(Tuning::quick(false), point).await
}

/// [`crash_at`] with `tuning` (its store among them).
pub(crate) async fn crash_at_with(tuning: Tuning, point: &str) -> Result<String> {
    crash_and_recover(tuning, point, Recovery::Restart).await
}

/// [`crash_at_with`], the flow brought back by `recovery`: with [`Recovery::Failover`] a
/// second coordinator of the same etcd store stands by before the crash and takes the lead
/// after it (`tuning` must be on etcd with a short lease).
pub(crate) async fn crash_and_recover(
    tuning: Tuning,
    point: &str,
    recovery: Recovery,
) -> Result<String> {
    let mut rig = Rig::start_tuned(tuning, REPAIR_YML, None).await?;
    rig.coord.env = vec![("FLEETMEND_FENCE_KILL_AT".into(), point.into())];
    blocking(|| rig.coord.restart())?;
    if recovery == Recovery::Failover {
        let dir = rig.dir.join("coord-b");
        let peer = blocking(|| rig.coord.start_peer(&dir, "coord-b"))?;
        let (_, says) = blocking(|| peer.http_get("/healthz"))?;
        if !says.contains("standby") {
            bail!("the second coordinator does not stand by: {says}");
        }
        rig.peers.push(peer);
    }
    rig.kill_machine();
    let t0 = Instant::now();
    rig.enqueue_unreachable()?;
    // The machine boots once its BMC powers it on, whichever coordinator asked.
    let mut booted = false;
    let mut boot_if_on = |rig: &mut Rig| -> Result<()> {
        if !booted && rig.count_power("1") > 0 {
            booted = true;
            rig.boot_machine()?;
        }
        Ok(())
    };
    let killed_after = loop {
        boot_if_on(&mut rig)?;
        let proc = rig.coord.proc.as_mut().context("coordinator")?;
        if let Some(st) = proc.try_exit() {
            use std::os::unix::process::ExitStatusExt;
            if st.signal() != Some(9) {
                bail!(
                    "coordinator exited with {st}, not SIGKILL:\n{}",
                    proc.log_text()
                );
            }
            break t0.elapsed();
        }
        if t0.elapsed() > SETTLE {
            bail!(
                "kill point {point} never reached:\n{}",
                rig.coord.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t1 = Instant::now();
    match recovery {
        Recovery::Restart => {
            rig.coord.proc.take();
            rig.coord.env.clear();
            blocking(|| rig.coord.restart())?;
            // On etcd the new process leads once its predecessor's lease has expired.
            blocking(|| rig.coord.wait_leading(SETTLE))?;
        }
        Recovery::Failover => {
            // The standby leads from now on: the rig's coordinator is that one.
            std::mem::swap(&mut rig.coord, &mut rig.peers[0]);
            blocking(|| rig.coord.wait_leading(SETTLE))?;
        }
    }
    let took_over = t1.elapsed();
    blocking(|| rig.coord.wait_for_log(&["resuming fence flow"], SETTLE))?;
    let resumed = t1.elapsed();
    let entry = loop {
        boot_if_on(&mut rig)?;
        let list = blocking(|| rig.entries())?;
        if let Some(e) = list.first()
            && matches!(e["status"].as_str(), Some("succeeded" | "failed"))
        {
            break e.clone();
        }
        if t1.elapsed() > SETTLE {
            bail!("{point}: entry not finished after the restart: {list:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    let resumed_events = rig
        .k8s
        .node_events(HOST)
        .iter()
        .filter(|e| e["reason"] == "FleetmendFenceResumed")
        .count();
    if resumed_events != 1 {
        bail!(
            "{point}: {resumed_events} FleetmendFenceResumed Events on the Node, not one: {:?}",
            rig.k8s.node_events(HOST)
        );
    }
    let (offs, ons) = (rig.count_power("0"), rig.count_power("1"));
    let on = blocking(|| rig.sim_power_is_on())?;
    let off_at = rig.first_power("0");
    let early: Vec<_> = rig
        .node_writes()
        .into_iter()
        .filter(|(at, _)| off_at.is_none_or(|off| *at <= off))
        .collect();
    let outcome = format!(
        "killed after {:.1} s; {} in {:.1} s, flow resumed in {:.1} s; entry {} {:.1} s after the crash; flows {:?}; off x{offs}, on x{ons}; machine {}",
        killed_after.as_secs_f64(),
        match recovery {
            Recovery::Restart => "restarted",
            Recovery::Failover => "standby leading",
        },
        took_over.as_secs_f64(),
        resumed.as_secs_f64(),
        entry["status"].as_str().unwrap_or("?"),
        t1.elapsed().as_secs_f64(),
        flows
            .iter()
            .map(|f| f["state"].as_str().unwrap_or("?"))
            .collect::<Vec<_>>(),
        if on { "on" } else { "OFF" },
    );
    let ok = entry["status"] == "succeeded"
        && flows.len() == 1
        && flows[0]["state"] == "done"
        && offs == 1
        && ons == 1
        && on
        && early.is_empty();
    if !ok {
        bail!(
            "{point}: {outcome}; Node writes before the off: {early:?}; power log {:?}",
            rig.sim.events()
        );
    }
    Ok(outcome)
}

/// The dead-machine story: a machine whose agent and kubelet Lease die is found dead by
/// automatic remediation (`tuning` must have it) and fenced by `@fence`: powered off,
/// released only after the simulator reads off, powered on, its Node restored; `fence list`
/// and `show` and `/metrics` tell the same story.
pub(crate) async fn dead_machine_story(tuning: Tuning) -> Result<()> {
    let mut rig = Rig::start_tuned(tuning, REPAIR_YML, None).await?;
    let t0 = Instant::now();
    rig.kill_machine();
    // The flow powers off, confirms, releases, and powers on; the machine then boots.
    rig.wait_powered_on()?;
    let on_after = t0.elapsed();
    let pods_gone = rig.k8s.pods_on(HOST).is_empty();
    let vas_gone = rig.k8s.volume_attachments_on(HOST).is_empty();
    rig.boot_machine()?;
    let v = blocking(|| finished(&rig, SETTLE))?;
    let history = v["history"].to_string();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert!(history.contains("fence flow"), "{history}");
    assert!(
        pods_gone,
        "the StatefulSet pod was not released before the power-on"
    );
    assert!(
        vas_gone,
        "the VolumeAttachment was not released before the power-on"
    );

    // Order: the simulator applied the off before any write to the Node.
    let off = rig
        .first_power("0")
        .context("the simulator never powered off")?;
    let writes = rig.node_writes();
    assert!(!writes.is_empty(), "the Node was never tainted or restored");
    for (at, what) in &writes {
        assert!(*at > off, "{what} came before the simulator powered off");
    }
    rig.assert_back()?;
    // `coordinatorctl fence list|show` tell the same story, with RFC 3339 times.
    let flows: Vec<Value> = blocking(|| rig.coord.ctl_json(&["fence", "list", "--json"]))?;
    assert_eq!(flows.len(), 1, "{flows:#?}");
    assert_eq!(flows[0]["state"], "done", "{flows:#?}");
    assert_eq!(flows[0]["node"], HOST);
    assert_eq!(flows[0]["failure"], Value::Null, "no failure: {flows:#?}");
    // One machine's flows, named by hostname; an address no machine has is refused (a
    // typo), not answered with an empty list.
    let mine: Vec<Value> = blocking(|| {
        rig.coord
            .ctl_json(&["fence", "list", "--machine", HOST, "--json"])
    })?;
    assert_eq!(mine, flows);
    let e = blocking(|| {
        rig.coord
            .ctl(&["fence", "list", "--machine", "192.0.2.250", "--json"])
    })
    .expect_err("an unknown machine is refused");
    assert!(
        format!("{e:#}").contains("no machine with address or hostname 192.0.2.250"),
        "{e:#}"
    );
    let id = flows[0]["id"].to_string();
    let shown: Value = blocking(|| rig.coord.ctl_json(&["fence", "show", &id, "--json"]))?;
    assert_eq!(shown["failure"], Value::Null, "{shown:#}");
    let confirmed = shown["confirmed_off"].as_str().context("confirmed_off")?;
    assert!(confirmed.parse::<jiff::Timestamp>().is_ok(), "{confirmed}");
    let states: Vec<&str> = shown["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .filter_map(|s| s["state"].as_str())
        .collect();
    for want in [
        "plan",
        "power-off",
        "confirm-off",
        "release",
        "power-on",
        "restore",
        "done",
    ] {
        assert!(states.contains(&want), "{want} missing from {states:?}");
    }
    let table = blocking(|| rig.coord.ctl(&["fence", "show", &id]))?;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("EVENT") && table.contains("done"), "{table}");
    // `/metrics` counted the flow once, as done, and holds none running.
    let scrape = blocking(|| rig.coord.scrape())?;
    assert_fence_metrics(&scrape, 1, "done");
    eprintln!(
        "fenced and powered on {:.1} s after the machine died; entry done {:.1} s after",
        on_after.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `/metrics` shows `started` flows started, all of them finished with `outcome` (and none
/// with the other), and no flow running in any state.
pub(crate) fn assert_fence_metrics(scrape: &str, started: u64, outcome: &str) {
    let value = |series: &str| {
        metric(scrape, series).unwrap_or_else(|| panic!("no {series} in:\n{scrape}"))
    };
    assert_eq!(value("fleetmend_fence_flows_started_total"), started as f64);
    for o in ["done", "failed"] {
        let want = if o == outcome { started as f64 } else { 0.0 };
        let series = format!("fleetmend_fence_flows_finished_total{{outcome=\"{o}\"}}");
        assert_eq!(value(&series), want, "{series}");
    }
    let running: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("fleetmend_fence_flows_running{"))
        .collect();
    assert_eq!(running.len(), 11, "{running:?}");
    assert!(running.iter().all(|l| l.ends_with(" 0")), "{running:?}");
}
