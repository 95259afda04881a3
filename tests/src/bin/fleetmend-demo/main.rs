//! The full-story demo on loopback: Fleetmend repairing a fleet by itself.
//!
//! It starts the fake Kubernetes API server (Nodes and kubelet Leases renewed by simulated
//! kubelets), a coordinator with automatic remediation (`[remediation]`), a repair queue
//! (`[repair]`) and `[kubernetes]`, and eight real node-agents in two racks, each with its own
//! certificate, fixture `/proc`/`/sys` tree and fake kubelet healthz. Then it injects, in turn:
//!
//! 1. a hung kubelet on one machine: detected, enqueued by itself as `unhealthy`, and the
//!    procedure's `@restart-unit kubelet` step makes the agent run its restart command (a
//!    script that fixes the fake kubelet); the machine reports healthy, the entry succeeds;
//! 2. a dead machine (agent killed, its kubelet Lease stops; it runs a StatefulSet pod with a
//!    volume attached): dead by two signals, enqueued as `unreachable`, and the procedure's
//!    `@fence` step runs the fence flow through a real `bmc-gateway` to the machine's BMC, an
//!    OpenIPMI `ipmi_sim` (one per machine, see [`bmc`]): power off, confirmed off, the
//!    workload released (out-of-service taint; pod and VolumeAttachment gone), power on (a
//!    new boot id), the taint removed. Without `ipmi_sim` a stand-in script asks this program's simulated
//!    hardware for the power cycle instead, and the demo says so;
//! 3. a whole rack losing power (all four agents and Leases stop at once): held as a
//!    correlated-failure rack event, nothing enqueued, `remediation status` names the rack;
//!    when the power returns the machines boot and nothing held is replayed.
//!
//! It prints a live timeline (what was injected, what the coordinator decided, what happened)
//! read the way an operator would, with `coordinatorctl`, then a summary table, and exits
//! non-zero when an injected failure did not end as described. Everything it starts is
//! stopped on exit, on Ctrl-C (SIGINT), SIGTERM, SIGHUP and when its output is closed (piped
//! into `head`); `--keep` leaves the fleet running until Ctrl-C. Run it through
//! `scripts/demo.sh`, which builds the binaries first.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use testkit::ctl_json::{JournalLine, MachineDetail};
use testkit::fake_k8s::{BackgroundFake, FakeK8s, NodeSeed, PodSeed};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, bin, start_agent};

mod assets;
mod bmc;
mod ha;
mod stories;
mod timeline;

use assets::{POWER_CYCLE, REMEDIATION, REPAIR_YAML, RESTART_UNIT, dead_machine_steps};
use timeline::{Seen, Snapshot};

/// The fleet: two racks of four, addresses from TEST-NET-1 (RFC 5737), used only as names.
const RACKS: &[(&str, &[(&str, &str)])] = &[
    (
        "rack-1",
        &[
            ("192.0.2.11", "demo-r1-n1"),
            ("192.0.2.12", "demo-r1-n2"),
            ("192.0.2.13", "demo-r1-n3"),
            ("192.0.2.14", "demo-r1-n4"),
        ],
    ),
    (
        "rack-2",
        &[
            ("192.0.2.21", "demo-r2-n1"),
            ("192.0.2.22", "demo-r2-n2"),
            ("192.0.2.23", "demo-r2-n3"),
            ("192.0.2.24", "demo-r2-n4"),
        ],
    ),
];

/// Agents report twice a second and a machine silent for three reports is unreachable:
/// production uses 5 s and 15 s; the demo compresses time so the story fits in a minute.
const REPORT: Duration = Duration::from_millis(500);
/// Simulated kubelets renew their Lease this often (Kubernetes: 10 s) ...
const LEASE_RENEW: Duration = Duration::from_millis(500);
/// ... and a Node silent this long turns Ready Unknown (Kubernetes: 40 s).
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(3);
/// How often the timeline asks the coordinator what changed: often enough to show each
/// remediation pass (500 ms), not so often that `coordinatorctl` crowds a 2-core machine.
const POLL: Duration = Duration::from_millis(500);
/// Bound for each injected failure to end as described (each takes about 5–15 s; the
/// machine running it may be loaded).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);
/// Remediation passes a rack event must stay held for before the demo calls it held.
const HELD_PASSES: u64 = 4;
/// The machine that dies in story 2, and the StatefulSet pod (with a CSI volume attached)
/// it runs: the workload a fence must release before the pod may start elsewhere.
const DEAD_HOST: &str = "demo-r1-n3";
const DEAD_POD: (&str, &str, &str) = ("demo", "db-0", "db");

/// Set by SIGINT, SIGTERM or SIGHUP, or when stdout is closed: every wait stops at once.
static STOP: AtomicBool = AtomicBool::new(false);
/// Set when stdout is closed (`| head`): the demo then stops quietly, and exits as a
/// program killed by SIGPIPE would (141): it did not finish.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// The signal that stopped the demo; it exits with 128 plus it, as the shell reports a
/// program the signal killed (130 for Ctrl-C, 143 for SIGTERM).
static STOP_SIGNAL: AtomicU8 = AtomicU8::new(0);

/// The demo was interrupted; everything it started is stopped on the way out.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

fn stopped() -> anyhow::Result<()> {
    if STOP.load(Ordering::SeqCst) {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// Writes one line; a closed stdout (`| head`) stops the demo instead of panicking.
fn out(line: &str) {
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{line}").and_then(|_| o.flush()).is_err() {
        STDOUT_GONE.store(true, Ordering::SeqCst);
        STOP.store(true, Ordering::SeqCst);
    }
}

/// Catches SIGINT, SIGTERM and SIGHUP on a thread of its own and sets [`STOP`].
fn catch_signals() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Registered here, before anything starts, so no signal falls to the default action.
    let (mut int, mut term, mut hup) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    })?;
    std::thread::spawn(move || {
        let signal = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => 2u8, // SIGINT
                _ = term.recv() => 15, // SIGTERM
                _ = hup.recv() => 1, // SIGHUP
            }
        });
        STOP_SIGNAL.store(signal, Ordering::SeqCst);
        STOP.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// One machine of the demo fleet and the simulated hardware under it.
struct Machine {
    addr: &'static str,
    host: &'static str,
    rack: &'static str,
    fixture: NodeFixture,
    /// Healthz of its kubelet; `ok` in this file means healthy.
    kubelet_state: PathBuf,
    _kubelet: FakeKubelet,
    config: PathBuf,
    log: PathBuf,
    agent: Option<Proc>,
    /// Whether the machine has power (a crashed machine still has).
    powered: bool,
}

/// How one injected failure ended.
struct Outcome {
    injected: String,
    happened: String,
    expected: bool,
}

struct Demo {
    started: Instant,
    dir: PathBuf,
    profile: PathBuf,
    coord: Option<Coordinator>,
    k8s: BackgroundFake,
    machines: Vec<Machine>,
    /// The simulated BMCs and the gateway; `None` without `ipmi_sim` (the stand-in then).
    bmcs: Option<bmc::Bmcs>,
    seen: Seen,
    snap: Snapshot,
    last_poll: Option<Instant>,
    /// With `--etcd` or `--ha`: the etcd (and with `--ha` the standby coordinator).
    ha: Option<ha::Ha>,
}

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_default()
}

impl Demo {
    /// Prints a timeline line: time since start, a kind, the text.
    fn say(&self, kind: &str, text: &str) {
        let t = self.started.elapsed().as_secs_f64();
        let clock = jiff::Timestamp::now().strftime("%H:%M:%S");
        out(&format!("{clock} +{t:5.1}s  {kind:<8} {text}"));
    }

    fn coord(&self) -> &Coordinator {
        self.coord
            .as_ref()
            .expect("coordinator runs until the demo ends")
    }

    fn host_of<'a>(&'a self, addr: &'a str) -> &'a str {
        self.machines
            .iter()
            .find(|m| m.addr == addr)
            .map_or(addr, |m| m.host)
    }

    /// Starts the fleet in `dir`; `stand_in` uses the power-cycle stand-in even when
    /// `ipmi_sim` is installed.
    fn start(dir: &Path, stand_in: bool, store: ha::StoreMode) -> anyhow::Result<Self> {
        let started = Instant::now();
        out(&format!("Fleetmend demo: working in {}", dir.display()));
        let pki = Pki::create(&dir.join("pki"), "demo.fleetmend")?;

        let k8s = FakeK8s::start_background()?;
        let mut inventory = String::new();
        for (rack, machines) in RACKS {
            for (addr, host) in *machines {
                k8s.add_node(NodeSeed::new(host, addr));
                k8s.renew_lease(host);
                k8s.set_kubelet_alive(host, true);
                inventory.push_str(&format!(
                    "[[machines]]\naddress = \"{addr}\"\nhostname = \"{host}\"\nserial = \"{}\"\n\
                     rack = \"{rack}\"\nrole = \"cs\"\nmachine_type = \"demo\"\n\n",
                    serial(host)
                ));
            }
        }
        k8s.run_kubelets(LEASE_RENEW, NODE_MONITOR_GRACE);
        let (ns, pod, set) = DEAD_POD;
        k8s.add_namespace(ns, &[]);
        k8s.add_pod(PodSeed::new(ns, pod, DEAD_HOST).owner("StatefulSet", set));
        k8s.add_volume_attachment(&format!("csi-{set}-data-{pod}"), DEAD_HOST);

        let addrs: Vec<(&'static str, String)> = RACKS
            .iter()
            .flat_map(|(_, list)| list.iter().map(|(a, h)| (*a, serial(h))))
            .collect();
        let bmcs = if stand_in {
            None
        } else {
            bmc::Bmcs::start(dir, &pki, &addrs)?
        };
        let restart = write_script(dir, "fake-systemctl-restart.sh", RESTART_UNIT)?;
        let stand_in_script = match &bmcs {
            Some(_) => None,
            None => {
                let power_dir = dir.join("power");
                std::fs::create_dir_all(&power_dir)?;
                let script = write_script(
                    dir,
                    "fake-power-cycle.sh",
                    &POWER_CYCLE.replace("@POWER@", &power_dir.display().to_string()),
                )?;
                Some(script.display().to_string())
            }
        };
        let repair = dir.join("repair.yaml");
        std::fs::write(
            &repair,
            REPAIR_YAML.replace(
                "@DEAD_MACHINE_STEPS@",
                &dead_machine_steps(stand_in_script.as_deref()),
            ),
        )?;
        let mut extra = format!(
            "[repair]\nconfig = {:?}\n\n[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"1s\"\n\
             request_timeout = \"5s\"\n\n{REMEDIATION}",
            repair.display().to_string(),
            k8s.kubeconfig().display().to_string(),
        );
        if let Some(b) = &bmcs {
            let racks: Vec<&str> = RACKS.iter().map(|(r, _)| *r).collect();
            extra.push_str(&format!(
                "\n[[gateways.targets]]\nname = \"demo-racks\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = {racks:?}\n",
                b.quic
            ));
        }
        let etcd = if store != ha::StoreMode::Sqlite {
            let (etcd, section) = ha::start_etcd()?;
            extra.push_str(&section);
            Some(etcd)
        } else {
            None
        };
        let coord = Coordinator::start(
            &dir.join("coordinator"),
            &pki,
            &CoordinatorOptions {
                report_interval: REPORT,
                unreachable_grace: REPORT * 3,
                inventory: Some(inventory),
                extra,
                health_extra: String::new(),
            },
        )?;
        let ha = match etcd {
            Some(etcd) => Some(ha::Ha {
                standby: match store {
                    ha::StoreMode::Ha => Some(ha::start_standby(dir, &coord)?),
                    _ => None,
                },
                etcd,
                took_over: None,
            }),
            None => None,
        };
        let servers: Vec<String> = std::iter::once(&coord)
            .chain(ha.as_ref().and_then(|h| h.standby.as_ref()))
            .map(|c| c.quic.to_string())
            .collect();
        let profile = dir.join("coordinatorctl.toml");
        std::fs::write(
            &profile,
            format!(
                "server = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
                servers,
                coord.admin.ca.display().to_string(),
                coord.admin.cert.display().to_string(),
                coord.admin.key.display().to_string()
            ),
        )?;

        let mut machines = Vec::new();
        for (rack, list) in RACKS {
            for (addr, host) in *list {
                let fixture = NodeFixture::builder(host)
                    .nic("eth0")
                    .address(addr.parse()?)
                    .build()?;
                let kubelet_state = dir.join(format!("{host}.kubelet"));
                let kubelet = FakeKubelet::start_with_state_file(&kubelet_state)?;
                let tls = pki.issue("node", host, &[])?;
                let config = fixture.write_agent_config(
                    &AgentConfig::new(&servers.join(","), &tls.ca, &tls.cert, &tls.key)
                        .report_interval(REPORT)
                        .kubelet_url(&kubelet.url()),
                )?;
                // `@restart-unit kubelet` runs the stand-in for `systemctl restart kubelet`,
                // which rewrites this machine's kubelet state file; the unit name comes last.
                let mut text = std::fs::read_to_string(&config)?;
                text.push_str(&format!(
                    "\n[actions]\nallowed_units = [\"kubelet\"]\nrestart_command = [{:?}, {:?}, {:?}]\n\
                     state_dir = {:?}\n",
                    restart.display().to_string(),
                    kubelet_state.display().to_string(),
                    dir.join("restarts.log").display().to_string(),
                    dir.join(format!("{host}.state")).display().to_string(),
                ));
                std::fs::write(&config, text)?;
                machines.push(Machine {
                    addr,
                    host,
                    rack,
                    fixture,
                    kubelet_state,
                    _kubelet: kubelet,
                    log: dir.join(format!("{host}.log")),
                    config,
                    agent: None,
                    powered: true,
                });
            }
        }
        let mut demo = Self {
            started,
            dir: dir.to_path_buf(),
            profile,
            coord: Some(coord),
            k8s,
            machines,
            bmcs,
            seen: Seen::default(),
            snap: Snapshot::default(),
            last_poll: None,
            ha,
        };
        demo.say(
            "start",
            &format!(
                "fake Kubernetes API server at {} (8 Nodes, simulated kubelets renewing Leases)",
                demo.k8s.url()
            ),
        );
        demo.say(
            "start",
            &format!(
                "coordinator on {} with [remediation], [repair], [kubernetes]{}; metrics on http://{}/metrics",
                demo.coord().quic,
                if demo.bmcs.is_some() { " and [gateways]" } else { "" },
                demo.coord().http
            ),
        );
        if let Some(h) = &demo.ha {
            let said = match h.standby {
                Some(_) => format!(
                    "--ha: an etcd at {} holds the state; coord-b stands by (lease TTL {})",
                    h.etcd.endpoint(0),
                    ha::TTL
                ),
                None => format!(
                    "--etcd: an etcd at {} holds the state (backend = \"etcd\"), one coordinator",
                    h.etcd.endpoint(0)
                ),
            };
            demo.say("start", &said);
            demo.say_roles();
        }
        for i in 0..demo.machines.len() {
            let m = &mut demo.machines[i];
            m.agent = Some(start_agent(m.host, &m.config, &m.log)?);
        }
        demo.say(
            "start",
            "8 node-agents (rack-1: demo-r1-n1..n4, rack-2: demo-r2-n1..n4), mutual-TLS QUIC",
        );
        let power = match &demo.bmcs {
            Some(b) => format!(
                "power control: a bmc-gateway on {} in front of 8 OpenIPMI ipmi_sim BMCs, one per machine (127.0.0.1 UDP ports {}–{})",
                b.quic,
                b.bmcs.iter().map(|m| m.port).min().unwrap_or(0),
                b.bmcs.iter().map(|m| m.port).max().unwrap_or(0),
            ),
            None => format!(
                "power control: {}, so no BMC and no bmc-gateway: a stand-in script asks simulated hardware in this program for the power cycle",
                if stand_in {
                    "--stand-in"
                } else {
                    "ipmi_sim is NOT installed (scripts/demo.sh installs openipmi when it may)"
                }
            ),
        };
        demo.say("start", &power);
        demo.say(
            "start",
            &format!(
                "{DEAD_HOST} runs {}/{} (StatefulSet {}) with a CSI volume attached",
                DEAD_POD.0, DEAD_POD.1, DEAD_POD.2
            ),
        );
        demo.wait("every machine to report healthy", SCENARIO_TIMEOUT, |d| {
            (d.snap.machines.len() == d.machines.len()
                && d.snap.machines.iter().all(|m| m.state == "healthy"))
            .then_some(())
        })?;
        demo.say("fleet", "all 8 machines healthy; injecting failures");
        Ok(demo)
    }

    /// Plays the hardware under the BMCs (or the stand-in): each power change a BMC applied
    /// stops or boots its machine, and the timeline shows it as the BMC saw it.
    fn serve_power(&mut self) -> anyhow::Result<()> {
        self.serve_stand_in()?;
        let events = match &mut self.bmcs {
            Some(b) => b.power_events(),
            None => return Ok(()),
        };
        if events.is_empty() {
            return Ok(());
        }
        // Show the admission and the running entry before what the hardware does.
        self.last_poll = None;
        let _ = self.poll();
        for e in events {
            let Some(i) = self.machines.iter().position(|m| m.addr == e.machine) else {
                continue;
            };
            let host = self.machines[i].host;
            let port = self
                .bmcs
                .as_ref()
                .and_then(|b| b.bmcs.iter().find(|m| m.machine == e.machine))
                .map_or(0, |m| m.port);
            let bmc = format!(
                "{host}'s BMC (ipmi_sim on 127.0.0.1:{port}) applied `{}` from the bmc-gateway",
                e.what
            );
            let reset = e.what.starts_with("reset");
            let what = match (e.on, self.machines[i].powered) {
                (false, _) => {
                    self.power_off(i);
                    format!("powered off at {}: the machine stays dead", e.at)
                }
                (true, false) => {
                    let boot = self.power_on(i)?;
                    format!(
                        "powered on at {}: boots with a new boot id {}…, agent and kubelet starting",
                        e.at,
                        &boot[..8]
                    )
                }
                (true, true) if reset => {
                    let boot = self.power_on(i)?;
                    format!(
                        "reset at {}: reboots with a new boot id {}…",
                        e.at,
                        &boot[..8]
                    )
                }
                (true, true) => format!("power on at {}: it was on, nothing changes", e.at),
            };
            self.say("power", &format!("{bmc}: {what}"));
        }
        Ok(())
    }

    /// Plays the hardware under the power-cycle stand-in (no `ipmi_sim`): a request file
    /// from the script cuts the machine's power (its agent dies), then powers it on: a new
    /// boot id, the agent and the kubelet start again; the answer file lets the script finish.
    fn serve_stand_in(&mut self) -> anyhow::Result<()> {
        if self.bmcs.is_some() {
            return Ok(());
        }
        let power = self.dir.join("power");
        for i in 0..self.machines.len() {
            let req = power.join(format!("{}.cycle", self.machines[i].addr));
            if !req.exists() {
                continue;
            }
            std::fs::remove_file(&req)?;
            // Show the admission and the running entry before what the hardware does.
            self.last_poll = None;
            let _ = self.poll();
            let boot = self.power_on(i)?;
            let host = self.machines[i].host;
            std::fs::write(
                power.join(format!("{}.on", self.machines[i].addr)),
                format!("{host} powered on with boot id {boot}\n"),
            )?;
            self.say(
                "power",
                &format!(
                    "{host}: simulated power off and on (stand-in for a BMC): new boot id {}…, agent and kubelet starting",
                    &boot[..8]
                ),
            );
        }
        Ok(())
    }

    /// Machine `i` loses power: its agent dies, its kubelet stops renewing its Lease.
    fn power_off(&mut self, i: usize) {
        let m = &mut self.machines[i];
        if let Some(mut a) = m.agent.take() {
            a.sigkill();
        }
        m.powered = false;
        self.k8s.set_kubelet_alive(m.host, false);
    }

    /// Machine `i` boots: whatever ran stops, a new boot id, its agent and kubelet start.
    fn power_on(&mut self, i: usize) -> anyhow::Result<String> {
        let m = &mut self.machines[i];
        if let Some(mut a) = m.agent.take() {
            a.sigkill();
        }
        let boot = m.fixture.new_boot_id()?;
        m.agent = Some(start_agent(m.host, &m.config, &m.log)?);
        m.powered = true;
        self.k8s.set_kubelet_alive(m.host, true);
        Ok(boot)
    }

    /// Polls (printing the timeline) until `f` sees what it waits for in the snapshot.
    fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Self) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last_err = String::new();
        loop {
            stopped()?;
            match self.poll() {
                Ok(()) => {
                    if let Some(v) = f(self) {
                        return Ok(v);
                    }
                }
                Err(e) => last_err = format!("; last error: {e:#}"),
            }
            self.serve_power()?;
            self.watch_dead_node();
            if Instant::now() >= deadline {
                bail!("timed out after {timeout:?} waiting for {what}{last_err}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_decision(
        &mut self,
        addr: &str,
        outcome: &str,
        rule: &str,
        min_count: u64,
    ) -> anyhow::Result<JournalLine> {
        let what = format!("{}: {outcome} [{rule}]", self.host_of(addr));
        self.wait(&what, SCENARIO_TIMEOUT, |d| {
            d.snap
                .events
                .iter()
                .rev()
                .find(|l| {
                    l.address == addr
                        && l.outcome == outcome
                        && l.rule == rule
                        && l.count >= min_count
                })
                .cloned()
        })
    }

    fn entry_for(&self, addr: &str) -> Option<&Value> {
        self.snap
            .entries
            .iter()
            .find(|e| field(e, "address") == addr)
    }

    fn wait_finished(&mut self, addr: &str) -> anyhow::Result<Value> {
        let what = format!("{}'s repair entry to finish", self.host_of(addr));
        self.wait(&what, SCENARIO_TIMEOUT, |d| {
            d.entry_for(addr)
                .filter(|e| matches!(field(e, "status"), "succeeded" | "failed"))
                .cloned()
        })
    }

    fn wait_state(&mut self, addr: &str, state: &str) -> anyhow::Result<()> {
        let what = format!("{} to be {state}", self.host_of(addr));
        self.wait(&what, SCENARIO_TIMEOUT, |d| {
            d.snap
                .machines
                .iter()
                .any(|m| m.spec.address == addr && m.state == state)
                .then_some(())
        })
    }

    fn machine(&mut self, host: &str) -> &mut Machine {
        self.machines
            .iter_mut()
            .find(|m| m.host == host)
            .expect("a machine of the demo fleet")
    }

    fn machine_addr(&self, host: &str) -> &'static str {
        self.machines
            .iter()
            .find(|m| m.host == host)
            .map_or("", |m| m.addr)
    }

    fn boot_id(&self, addr: &str) -> anyhow::Result<String> {
        let d: MachineDetail = self.coord().machine(addr)?;
        d.boot_id.context("no boot id reported")
    }

    /// Runs one scenario; a failure is an outcome, an interruption ends the demo.
    fn scenario(
        &mut self,
        injected: &str,
        f: fn(&mut Self) -> anyhow::Result<String>,
    ) -> anyhow::Result<Outcome> {
        out("");
        match f(self) {
            Ok(happened) => {
                self.say("done", &happened);
                Ok(Outcome {
                    injected: injected.into(),
                    happened,
                    expected: true,
                })
            }
            Err(e) if e.is::<Interrupted>() => Err(e),
            Err(e) => {
                self.say("FAILED", &format!("{e:#}"));
                Ok(Outcome {
                    injected: injected.into(),
                    happened: format!("{e:#}"),
                    expected: false,
                })
            }
        }
    }

    fn look_closer(&self, keep: bool) {
        let ctl = bin("coordinatorctl");
        let cwd = std::env::current_dir().unwrap_or_default();
        let ctl = ctl.strip_prefix(&cwd).unwrap_or(&ctl).display().to_string();
        let p = self.profile.display();
        out("");
        out(if keep {
            "Look closer (the fleet keeps running until Ctrl-C):"
        } else {
            "Look closer (these reach the demo coordinator while it runs: `scripts/demo.sh --keep` keeps it up):"
        });
        let dead = format!("machines show {DEAD_HOST}");
        let commands = [
            "repair-queue list",
            "repair-queue show 2",
            "events",
            "remediation status",
            "machines list",
            dead.as_str(),
            "fence list",
        ];
        for args in commands {
            out(&format!("  {ctl} --profile {p} {args}"));
        }
        let gateway = if self.bmcs.is_some() {
            format!(
                ", {}/gateway.log, {}/bmc-<address>/",
                self.dir.display(),
                self.dir.display()
            )
        } else {
            String::new()
        };
        if let Some(b) = &self.bmcs
            && let Some(m) = b
                .bmcs
                .iter()
                .find(|m| m.machine == self.machine_addr(DEAD_HOST))
        {
            out(&format!(
                "  {DEAD_HOST}'s BMC: ipmitool -I lanplus -C 3 -H 127.0.0.1 -p {} -U {} -P {} chassis power status",
                m.port,
                bmc::BMC_USER,
                bmc::BMC_PASSWORD
            ));
        }
        out(&format!(
            "  logs: {}/coordinator/coordinator-1.log, {}/<host>.log{gateway}{}",
            self.dir.display(),
            self.dir.display(),
            if keep {
                ""
            } else {
                " (removed when the demo ends; --keep keeps them)"
            }
        ));
    }

    /// Stops everything: agents first, then the coordinator cleanly (it kills any repair
    /// command still running), the gateway and the BMC simulators, then the in-process
    /// fakes as the fields drop.
    fn shutdown(&mut self) {
        for m in &mut self.machines {
            if let Some(mut a) = m.agent.take() {
                a.sigkill();
            }
        }
        if let Some(mut c) = self.coord.take()
            && let Some(mut p) = c.proc.take()
        {
            let _ = p.sigterm(Duration::from_secs(5));
        }
        if let Some(mut c) = self.ha.as_mut().and_then(|h| h.standby.take())
            && let Some(mut p) = c.proc.take()
        {
            let _ = p.sigterm(Duration::from_secs(5));
        }
        if let Some(b) = &mut self.bmcs {
            b.stop();
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The serial number of the demo machine `host`, in the inventory and the gateway alike.
fn serial(host: &str) -> String {
    format!("SN-{host}")
}

fn write_script(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

fn run(keep: bool, stand_in: bool, store: ha::StoreMode) -> anyhow::Result<bool> {
    catch_signals()?;
    let work = tempfile::Builder::new()
        .prefix("fleetmend-demo-")
        .tempdir()?;
    let mut demo = Demo::start(work.path(), stand_in, store)?;
    let outcomes = [
        demo.scenario("a kubelet hangs on demo-r1-n2", Demo::kubelet_failure)?,
        demo.scenario("demo-r1-n3 dies", Demo::dead_machine)?,
        demo.scenario("rack-2 loses power", Demo::rack_power_loss)?,
    ];
    out("");
    out("Summary");
    let w = outcomes.iter().map(|o| o.injected.len()).max().unwrap_or(0);
    out(&format!("  {:<w$}  EXPECTED?  WHAT HAPPENED", "INJECTED"));
    for o in &outcomes {
        out(&format!(
            "  {:<w$}  {:<9}  {}",
            o.injected,
            if o.expected { "yes" } else { "no" },
            o.happened
        ));
    }
    let all = outcomes.iter().all(|o| o.expected);
    out("");
    out(if all {
        "All 3 injected failures ended as described."
    } else {
        "Some injected failures did NOT end as described (see the timeline above)."
    });
    out(if demo.bmcs.is_some() {
        "Power: every power action went from the coordinator through a real bmc-gateway to \
         OpenIPMI ipmi_sim BMCs (the machines under them are simulated)."
    } else {
        "Power: the power cycle was a stand-in script and simulated hardware, no BMC and no \
         bmc-gateway (with openipmi installed the demo drives a bmc-gateway and ipmi_sim)."
    });
    demo.look_closer(keep);
    if keep {
        out("--keep: the fleet keeps running; press Ctrl-C to stop it.");
        while stopped().is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    demo.shutdown();
    out(&format!(
        "Stopped everything; demo took {:.0} s.",
        demo.started.elapsed().as_secs_f64()
    ));
    Ok(all)
}

const USAGE: &str = "usage: fleetmend-demo [--keep] [--stand-in] [--etcd | --ha]\n\n\
The full-story Fleetmend demo on loopback (run it through scripts/demo.sh, which builds the\n\
binaries first). --keep leaves the fleet running until Ctrl-C. --stand-in powers machines\n\
with a stand-in script instead of a bmc-gateway and ipmi_sim (the default without ipmi_sim).\n\
--etcd keeps the coordinator's state in an etcd instead of SQLite; --ha runs two coordinators\n\
on an etcd and kills the leader in the middle of the dead-machine story (both need the etcd\n\
scripts/setup-test-deps.sh builds).\n\
Exit 0 when every injected failure ended as described, 1 when one did not, 128 plus the\n\
signal when stopped by one (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), 141 when its output\n\
was closed (`| head`).";

fn main() -> ExitCode {
    let (mut keep, mut stand_in, mut store) = (false, false, ha::StoreMode::Sqlite);
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--keep" => keep = true,
            "--stand-in" => stand_in = true,
            "--etcd" | "--ha" if store != ha::StoreMode::Sqlite => {
                eprintln!("fleetmend-demo: --etcd and --ha are one choice: pass one\n{USAGE}");
                return ExitCode::from(64);
            }
            "--etcd" => store = ha::StoreMode::Etcd,
            "--ha" => store = ha::StoreMode::Ha,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("fleetmend-demo: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(64);
            }
        }
    }
    match run(keep, stand_in, store) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) if e.is::<Interrupted>() && STDOUT_GONE.load(Ordering::SeqCst) => {
            ExitCode::from(128 + 13)
        }
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("fleetmend-demo: interrupted; everything it started is stopped");
            ExitCode::from(128 + STOP_SIGNAL.load(Ordering::SeqCst))
        }
        Err(e) => {
            eprintln!("fleetmend-demo: {e:#}");
            ExitCode::from(1)
        }
    }
}
