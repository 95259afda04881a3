//! The fence flow's release against a real Kubernetes control plane, with real processes: a
//! coordinator, a real bmc-gateway driving OpenIPMI's `ipmi_sim`, a node-agent, and etcd,
//! kube-apiserver and kube-controller-manager 1.37 (`testkit::real_k8s`; the kubelets and
//! the CSI external-attacher are played through the API by the test kit, everything the
//! controllers decide is real).
//!
//! A machine with a StatefulSet pod and its CSI volume dies (agent killed, kubelet silent).
//! The real node lifecycle controller turns its Node Ready Unknown, the coordinator's
//! remediation sees both signals and fences it: power off, confirmed by reading the BMC,
//! out-of-service taint, then the real taint-eviction controller, pod GC (every 20 s) and
//! attach-detach controller remove the pod and the VolumeAttachment, and only then is the
//! machine powered on; it boots, and the taint is removed. A sampler reads the cluster every
//! 100 ms; the test prints the time of each phase and checks the order against the
//! simulator's power log.
//!
//! Needs `ipmi_sim` and `ipmitool`, and the control plane built (scripts/setup-test-deps.sh).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use serde_json::Value;
use testkit::bmc_sim::{GatewayProc, IpmiSim, TestPki};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, start_agent, wait_for};
use testkit::real_k8s::kubelet::{CsiAttacher, Kubelets};
use testkit::real_k8s::workload::{namespace, stateful_pod_with_volume};
use testkit::real_k8s::{Options, RealK8s};

const MACHINE: &str = "10.0.7.1";
const HOST: &str = "f1";
/// A second node, alive throughout: the node lifecycle controller treats a zone whose every
/// node is down as a disruption of its own and stops tainting there.
const OTHER: &str = "f2";
const OTHER_IP: &str = "10.0.7.2";
const RACK: &str = "rack-1";
const DRIVER: &str = "csi.fleetmend.test";
const REPORT: Duration = Duration::from_millis(300);
/// Bound for what the test causes: the pod GC alone may take 20 s, the machine is loaded.
const SETTLE: Duration = Duration::from_secs(180);

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

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// What the sampler saw at one instant.
#[derive(Debug, Clone)]
struct Sample {
    at: SystemTime,
    ready: Option<String>,
    tainted: bool,
    /// None: gone; Some(true): terminating.
    pod: Option<bool>,
    attachments: usize,
}

async fn sample(client: &kube::Client) -> Result<Sample> {
    let node = Api::<Node>::all(client.clone()).get_opt(HOST).await?;
    let ready = node
        .as_ref()
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    let tainted = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == "node.kubernetes.io/out-of-service")
        });
    let pod = Api::<Pod>::namespaced(client.clone(), "db")
        .get_opt("web-0")
        .await?
        .map(|p| p.metadata.deletion_timestamp.is_some());
    let attachments = Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|va| va.spec.node_name == HOST)
        .count();
    Ok(Sample {
        at: SystemTime::now(),
        ready,
        tainted,
        pod,
        attachments,
    })
}

fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// The detection settings of a run.
#[derive(Clone)]
struct Tuning {
    /// Agent report interval (unreachable after three silent ones).
    report: Duration,
    /// The `[remediation]` section's own keys.
    remediation: &'static str,
    /// `kubernetes.node_view_refresh`.
    view_refresh: &'static str,
    /// How often the played kubelets renew their Lease.
    renew: Duration,
    /// The node lifecycle controller's `--node-monitor-grace-period`.
    grace: Duration,
}

/// The functional tests' short settings.
fn quick() -> Tuning {
    Tuning {
        report: REPORT,
        remediation: "interval = \"500ms\"\nlease_stale = \"3s\"\n",
        view_refresh: "1s",
        renew: Duration::from_millis(500),
        grace: Duration::from_secs(5),
    }
}

/// What a run measured, in seconds from the machine's death.
struct Timings {
    rows: Vec<(&'static str, Option<f64>)>,
}

impl Timings {
    fn print(&self, title: &str) {
        eprintln!("{title}: from the machine's death (agent killed, kubelet silent):");
        for (name, t) in &self.rows {
            match t {
                Some(t) => eprintln!("  {name:<58} {t:>6.1} s"),
                None => eprintln!("  {name:<58}  never"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_machines_stateful_pod_is_released_by_the_real_controllers_only_after_the_bmc_reads_off()
-> Result<()> {
    death_to_release(quick()).await?.print("fast settings");
    Ok(())
}

/// Issue 29's and issue 32's figures: death → release against the real control plane, with
/// fast settings, and with production defaults under each rule for the second signal
/// (`lease-and-ready`, the default, and `lease`). Run by name:
/// `cargo test --workspace --test real_k8s_fence -- --ignored --nocapture bench`
/// (`FLEETMEND_BENCH_RUNS=lease` or `=ready,lease` picks runs among `fast`, `ready`, `lease`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints timings; run by name"]
async fn bench_time_from_death_to_release_real() -> Result<()> {
    let fast = Tuning {
        report: Duration::from_secs(1),
        remediation: "interval = \"1s\"\nlease_stale = \"3s\"\n",
        view_refresh: "1s",
        renew: Duration::from_secs(1),
        grace: Duration::from_secs(5),
    };
    // Production defaults: reports every 5 s (unreachable after 15 s), lease_stale 20 s,
    // remediation and node view every 10 s; kubelets renew every 10 s and the node
    // lifecycle controller waits its default 50 s.
    let production = Tuning {
        report: Duration::from_secs(5),
        remediation: "",
        view_refresh: "10s",
        renew: Duration::from_secs(10),
        grace: Duration::from_secs(50),
    };
    let lease = Tuning {
        remediation: "second_signal = \"lease\"\n",
        ..production.clone()
    };
    let runs = std::env::var("FLEETMEND_BENCH_RUNS").unwrap_or("fast,ready,lease".into());
    for (key, name, t) in [
        ("fast", "fast settings", fast),
        (
            "ready",
            "production defaults (second_signal = lease-and-ready)",
            production,
        ),
        (
            "lease",
            "production defaults, second_signal = \"lease\"",
            lease,
        ),
    ] {
        if runs.split(',').any(|r| r.trim() == key) {
            death_to_release(t).await?.print(name);
        }
    }
    Ok(())
}

/// Kills the machine and follows it to its release and back; asserts the order.
async fn death_to_release(tuning: Tuning) -> Result<Timings> {
    let tmp = tempfile::tempdir()?;
    let dir: PathBuf = tmp.path().to_path_buf();
    let sim = IpmiSim::start(true).await?;
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
        "[[bmc]]\nmachine = \"{MACHINE}\"\nserial = \"SN1\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = {:?}\n",
        sim.port,
        sim.username,
        pw_file.to_string_lossy()
    );
    let _gw = GatewayProc::start(&gw_pki, &bmcs).await?;

    let k8s = RealK8s::start(Options {
        node_monitor_grace: tuning.grace,
    })
    .await?;
    let client = k8s.client();
    let kubelets = Kubelets::start(client.clone(), tuning.renew);
    kubelets.register(HOST, MACHINE).await?;
    kubelets.register(OTHER, OTHER_IP).await?;
    let _csi = CsiAttacher::start(client.clone(), DRIVER).await?;
    namespace(&client, "db").await?;
    stateful_pod_with_volume(&client, "db", "web", HOST, DRIVER, 30).await?;
    let t_start = Instant::now();
    loop {
        let s = sample(&client).await?;
        if s.attachments == 1 && s.pod == Some(false) {
            break;
        }
        if t_start.elapsed() > SETTLE {
            bail!(
                "web-0's volume never attached: {s:?}\n{}",
                k8s.logs_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let repair = dir.join("repair.yml");
    std::fs::write(&repair, REPAIR_YML)?;
    // One machine is most of the fleet here, so its death is also "most agents lost at
    // once": self-isolation settles in 1 s. The fixture's crash kernel is loaded, so
    // kdump_wait is 0: this machine simply died.
    let extra = format!(
        "[repair]\nconfig = {:?}\n\n[kubernetes]\nkubeconfig = {:?}\nnode_view_refresh = \"{}\"\nrequest_timeout = \"10s\"\n\n\
         [[gateways.targets]]\nname = \"{RACK}\"\naddress = \"{}\"\nserver_name = \"127.0.0.1\"\nracks = [\"{RACK}\"]\n\n\
         [remediation]\n{}kdump_wait = \"0s\"\n\
         [remediation.limits]\nfleet_cap = {{ count = 10, percent = 100 }}\nself_isolation = {{ settle = \"1s\" }}\n",
        repair.display().to_string(),
        k8s.kubeconfig().display().to_string(),
        tuning.view_refresh,
        _gw.quic,
        tuning.remediation
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
    let local_kubelet = FakeKubelet::start()?;
    let tls = Coordinator::agent_tls(&pki, HOST)?;
    let start_agent_now = |fixture: &NodeFixture, n: usize| -> Result<Proc> {
        let cfg = fixture.write_agent_config(
            &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
                .report_interval(tuning.report)
                .kubelet_url(&local_kubelet.url()),
        )?;
        start_agent(HOST, &cfg, &dir.join(format!("agent-{n}.log")))
    };
    let mut agent = start_agent_now(&fixture, 0)?;
    blocking(|| coord.wait_for_state(HOST, "healthy", SETTLE))?;

    // The sampler: the cluster as seen every 100 ms, until the test ends.
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let sampler = {
        let (samples, client) = (samples.clone(), client.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(s) = sample(&client).await {
                    samples.lock().expect("samples").push(s);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // The machine dies.
    let killed = SystemTime::now();
    agent.sigkill();
    kubelets.set_alive(HOST, false);
    let power = |v: &str| {
        let want = format!("set power {v}");
        sim.timed_events()
            .into_iter()
            .find(|(_, e)| *e == want)
            .map(|(t, _)| t)
    };
    let on = blocking(|| {
        wait_for("the flow to power the machine on", SETTLE, || {
            power("1").ok_or_else(|| format!("power log {:?}", sim.events()))
        })
    })?;
    let off = power("0").context("powered on without an off")?;
    // What the cluster looked like at the power-on, before the machine boots.
    let at_on = sample(&client).await?;

    // The machine boots: new boot id, agent and kubelet back.
    fixture.new_boot_id()?;
    let _agent = start_agent_now(&fixture, 1)?;
    kubelets.set_alive(HOST, true);
    let entry = blocking(|| {
        wait_for("the repair entry to finish", SETTLE, || {
            let list: Vec<Value> = coord
                .ctl_json(&["repair-queue", "list", "--json"])
                .map_err(|e| e.to_string())?;
            let e = list.into_iter().next().ok_or("no entry yet")?;
            match e["status"].as_str() {
                Some("succeeded") | Some("failed") => Ok(e),
                _ => Err(e.to_string()),
            }
        })
    })?;
    // When remediation admitted the machine (its journal line), the end of detection.
    let admitted: Option<SystemTime> =
        blocking(|| coord.ctl_json::<Vec<Value>>(&["events", "--json"]))
            .ok()
            .and_then(|lines| {
                lines
                    .into_iter()
                    .find(|l| l["outcome"] == "admitted")
                    .and_then(|l| l["first_at"].as_str()?.parse::<jiff::Timestamp>().ok())
            })
            .map(|t| {
                SystemTime::UNIX_EPOCH + Duration::from_millis(t.as_millisecond().max(0) as u64)
            });
    let untainted = blocking(|| {
        wait_for("the taint to be removed", SETTLE, || {
            let s = samples.lock().expect("samples");
            match s.last() {
                Some(last) if !last.tainted && last.at > on => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
    });
    sampler.abort();
    let s = samples.lock().expect("samples").clone();
    let first =
        |f: &dyn Fn(&Sample) -> bool| s.iter().find(|x| x.at > killed && f(x)).map(|x| x.at);
    let unready = first(&|x| x.ready.as_deref() != Some("True"));
    let tainted = first(&|x| x.tainted);
    let terminating = first(&|x| x.pod == Some(true));
    let pod_gone = first(&|x| x.pod.is_none());
    let va_gone = first(&|x| x.attachments == 0);
    let since = |t: Option<SystemTime>| t.map(|t| secs_between(killed, t));
    let timings = Timings {
        rows: vec![
            ("node lifecycle controller: Ready not True", since(unready)),
            ("remediation admits (journal)", since(admitted)),
            ("BMC applies power off (ipmi_sim log)", since(Some(off))),
            ("out-of-service taint seen", since(tainted)),
            (
                "taint-eviction controller: pod terminating",
                since(terminating),
            ),
            (
                "pod gone (force-deleted by the coordinator or the pod GC)",
                since(pod_gone),
            ),
            (
                "attach-detach controller: VolumeAttachment gone",
                since(va_gone),
            ),
            ("BMC applies power on (ipmi_sim log)", since(Some(on))),
        ],
    };
    assert_eq!(entry["status"], "succeeded", "{entry:#}");
    untainted?;
    // Nothing released before the BMC applied the off: every sample taken before it shows
    // the Node untainted and the pod in place.
    for x in s.iter().filter(|x| x.at <= off) {
        assert!(
            !x.tainted,
            "the Node was tainted before the power-off: {x:?}"
        );
        assert_eq!(
            x.pod,
            Some(false),
            "web-0 was touched before the power-off: {x:?}"
        );
    }
    // Released before the power-on: the pod and the VolumeAttachment were gone.
    assert!(
        at_on.pod.is_none() || pod_gone.is_some_and(|t| t < on),
        "web-0 still there at the power-on: {at_on:?}"
    );
    assert!(
        va_gone.is_some_and(|t| t < on),
        "the VolumeAttachment still named {HOST} at the power-on"
    );
    assert!(tainted.is_some_and(|t| t > off));
    drop(coord);
    Ok(timings)
}
