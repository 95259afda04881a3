//! The fleet simulator and scale benchmark: N simulated node-agents in one process against a
//! real coordinator process, over real QUIC with real certificates (one node identity each).
//!
//! It makes a fleet PKI with `coordinatorctl pki init`, starts a `coordinator` whose inventory
//! holds the N machines (report interval `--interval`, unreachable grace three intervals, the
//! coordinator's default), issues the N node certificates in process and connects the agents
//! from a few client endpoints (each a UDP socket holding many connections, each connection
//! under its own certificate), at most `--handshakes` at a time. Every agent says hello and
//! reports six checks at the interval with ±5 % jitter, waiting for each ack. Once all report,
//! it measures for `--duration`: acked reports per second, report → ack latency, the
//! coordinator's CPU per report and its RSS per agent (above its RSS before any agent came).
//! Then it kills `--kill-percent` of the agents at once (their tasks stop and their
//! connections close, so their reports stop) and times how long the coordinator takes to
//! count them unreachable on `/metrics`. It prints one table, or JSON with `--json`, and
//! exits non-zero when a connection dropped, the killed agents were not detected, or other
//! machines went unreachable with them.
//!
//! With `--store etcd` the coordinator keeps its state in an etcd the test kit starts (its
//! own member, fsyncing as in production), and the table adds etcd's revision at the start
//! and the end of the window: equal when the reports wrote nothing.
//!
//! The agents share the machine with the coordinator, so on a small machine the figures are
//! an upper bound on the coordinator's costs. Run it through `scripts/fleet-sim.sh`, which
//! builds the binaries and sets `FLEETMEND_BIN_DIR`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use protocol::transport::{SERVER_UDP_RECEIVE_BUFFER, udp_socket};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, inventory_toml};

mod fleet;
mod measure;

use fleet::{Agent, Shared};
use measure::{
    Metrics, Results, cpu_time, quantile_ms, rss_kib, udp_receive_drops, udp_socket_drops,
};

/// Connections per client endpoint. One endpoint's driver task handles every packet of its
/// connections; a few endpoints let the runtime's workers share the agents' packet work.
const CONNECTIONS_PER_ENDPOINT: usize = 2_500;

/// The coordinator's default grace: three missed intervals make a machine unreachable.
const GRACE_INTERVALS: u32 = 3;

const USAGE: &str = "usage: fleet-sim [--agents N] [--interval 1s] [--duration 60s] \
[--kill-percent 1] [--handshakes 64] [--store sqlite|etcd] [--json]";

/// The options that take a value.
const VALUED: &[&str] = &[
    "--agents",
    "--interval",
    "--duration",
    "--kill-percent",
    "--handshakes",
    "--store",
];

/// Command-line options.
#[derive(Debug, Clone)]
struct Args {
    /// `--help`: print the usage and exit 0.
    help: bool,
    agents: usize,
    interval: Duration,
    duration: Duration,
    kill_percent: f64,
    handshakes: usize,
    /// `--store etcd`: the coordinator on an etcd of the test kit.
    etcd: bool,
    json: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            help: false,
            agents: 1000,
            interval: Duration::from_secs(1),
            duration: Duration::from_secs(60),
            kill_percent: 1.0,
            handshakes: 64,
            etcd: false,
            json: false,
        }
    }
}

/// `500ms`, `1s`, `2.5s`, `2m`: a positive duration.
fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let d = protocol::duration::parse(s).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(!d.is_zero(), "{s:?} must be positive");
    Ok(d)
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
    let mut a = Args::default();
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if flag == "--json" {
            a.json = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            a.help = true;
            return Ok(a);
        }
        if !VALUED.contains(&flag.as_str()) {
            bail!("unknown option {flag}\n{USAGE}");
        }
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--agents" => a.agents = value.parse().context("--agents")?,
            "--interval" => a.interval = parse_duration(&value)?,
            "--duration" => a.duration = parse_duration(&value)?,
            "--kill-percent" => a.kill_percent = value.parse().context("--kill-percent")?,
            "--handshakes" => a.handshakes = value.parse().context("--handshakes")?,
            "--store" => {
                a.etcd = match value.as_str() {
                    "sqlite" => false,
                    "etcd" => true,
                    other => bail!("--store is sqlite or etcd, not {other:?}"),
                }
            }
            _ => bail!("unknown option {flag}\n{USAGE}"),
        }
    }
    anyhow::ensure!(a.agents > 0, "--agents must be at least 1");
    anyhow::ensure!(a.handshakes > 0, "--handshakes must be at least 1");
    anyhow::ensure!(
        (0.0..=100.0).contains(&a.kill_percent),
        "--kill-percent is a percentage"
    );
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fleet-sim: {e:#}");
            return ExitCode::from(64);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if std::env::var_os("FLEETMEND_BIN_DIR").is_none() {
        eprintln!(
            "fleet-sim: set FLEETMEND_BIN_DIR to the directory of the coordinator and coordinatorctl \
             binaries (scripts/fleet-sim.sh does)"
        );
        return ExitCode::from(64);
    }
    match run(&args) {
        Ok(r) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("results serialize")
                );
            } else {
                print!("{}", r.table());
            }
            if r.dropped > 0 || r.others_unreachable > 0 || (r.killed > 0 && r.detect_s.is_none()) {
                eprintln!(
                    "fleet-sim: connections dropped, killed agents not detected, or others lost"
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fleet-sim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<Results> {
    let n = args.agents;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test").context("making the fleet PKI")?;
    let hosts: Vec<(String, String)> = (0..n)
        .map(|i| (fleet::address(i).to_string(), fleet::hostname(i)))
        .collect();
    let pairs: Vec<(&str, &str)> = hosts
        .iter()
        .map(|(a, h)| (a.as_str(), h.as_str()))
        .collect();
    let grace = args.interval * GRACE_INTERVALS;
    // Its own etcd member, fsyncing as in production.
    let etcd = if args.etcd {
        Some(testkit::etcd::Etcd::start(
            testkit::etcd::Options::default().durable(),
        )?)
    } else {
        None
    };
    let extra = match &etcd {
        Some(e) => format!(
            "[store]\nbackend = \"etcd\"\nendpoints = [{:?}]\nprefix = \"/fleet-sim/\"\n",
            e.endpoint(0)
        ),
        None => String::new(),
    };
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            report_interval: args.interval,
            unreachable_grace: grace,
            inventory: Some(inventory_toml(&pairs)),
            extra,
            ..Default::default()
        },
    )
    .context("starting the coordinator")?;
    let pid = coord
        .proc
        .as_ref()
        .and_then(|p| p.pid())
        .context("coordinator pid")?
        .to_string();

    let t = Instant::now();
    let materials = fleet::issue_certificates(&pki.ca_dir, n)?;
    let cert_issue = t.elapsed();
    // The coordinator has loaded its inventory and settled; what it holds from here on is
    // for the connections.
    std::thread::sleep(Duration::from_secs(1));
    let rss_base = rss_kib(&pid)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared::default());
    let endpoints = etcd.as_ref().map(|e| e.endpoints()).unwrap_or_default();
    let r = rt.block_on(simulate(
        args,
        &coord,
        &pid,
        materials,
        shared.clone(),
        endpoints,
    ));
    shared.stop.store(true, Ordering::Relaxed);
    rt.shutdown_timeout(Duration::from_secs(2));
    let mut r = r?;
    r.cert_issue_s = cert_issue.as_secs_f64();
    r.coordinator_rss_base_kib = rss_base;
    r.coordinator_rss_per_agent_kib = (r.coordinator_rss_kib as f64 - rss_base as f64) / n as f64;
    r.unreachable_grace_s = grace.as_secs_f64();
    Ok(r)
}

/// Waits on `/metrics` (blocking scrape off the runtime) until `done` holds or `limit` passes.
async fn wait_metrics(
    coord: &Coordinator,
    limit: Duration,
    done: impl Fn(&Metrics) -> bool,
) -> anyhow::Result<Option<Metrics>> {
    let deadline = Instant::now() + limit;
    loop {
        let http = coord.http;
        let m = tokio::task::spawn_blocking(move || Metrics::scrape(http)).await??;
        if done(&m) {
            return Ok(Some(m));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn simulate(
    args: &Args,
    coord: &Coordinator,
    pid: &str,
    materials: Vec<protocol::transport::TlsMaterial>,
    shared: Arc<Shared>,
    etcd: Vec<String>,
) -> anyhow::Result<Results> {
    // etcd's revision, which every write anywhere moves (a count-only read moves nothing).
    let mut client = match etcd.is_empty() {
        true => None,
        false => Some(etcd_client::Client::connect(etcd, None).await?),
    };
    let mut revision = async || -> anyhow::Result<Option<i64>> {
        let Some(c) = client.as_mut() else {
            return Ok(None);
        };
        let r = c
            .get("/", Some(etcd_client::GetOptions::new().with_count_only()))
            .await?;
        Ok(r.header().map(|h| h.revision()))
    };
    let n = args.agents;
    let endpoints = (0..n.div_ceil(CONNECTIONS_PER_ENDPOINT))
        .map(|_| {
            // Thousands of connections share each socket, as at the coordinator.
            let socket = udp_socket(
                "127.0.0.1:0".parse().expect("literal address"),
                SERVER_UDP_RECEIVE_BUFFER,
            )?;
            quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                None,
                socket,
                Arc::new(quinn::TokioRuntime),
            )
            .context("making a client endpoint")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sim_ports = endpoints
        .iter()
        .map(|e| Ok(e.local_addr()?.port()))
        .collect::<anyhow::Result<Vec<u16>>>()?;
    let handshakes = Arc::new(tokio::sync::Semaphore::new(args.handshakes));
    let udp_drops_at_start = udp_receive_drops()?;
    let connect_start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (index, tls) in materials.into_iter().enumerate() {
        let agent = Agent {
            index,
            tls,
            endpoint: endpoints[index % endpoints.len()].clone(),
            coordinator: coord.quic,
            interval: args.interval,
        };
        tasks.push(tokio::spawn(fleet::run(
            agent,
            handshakes.clone(),
            shared.clone(),
        )));
    }
    // Every agent connected (or failed), then every connected one acked at least once.
    let connect_limit = Duration::from_secs(60) + Duration::from_millis(20) * n as u32;
    let deadline = Instant::now() + connect_limit;
    while shared.connected.load(Ordering::Relaxed) + shared.dropped.load(Ordering::Relaxed) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} agents connected within {connect_limit:?}",
            shared.connected.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect = connect_start.elapsed();
    let connected = shared.connected.load(Ordering::Relaxed);
    let deadline = Instant::now() + args.interval * 3 + Duration::from_secs(30);
    while shared.reporting.load(Ordering::Relaxed) + shared.dropped.load(Ordering::Relaxed) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {connected} connected agents had a report acked",
            shared.reporting.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the connect burst's work settle before measuring the steady state.
    tokio::time::sleep(args.interval * 2).await;

    shared.recording.store(true, Ordering::Relaxed);
    let m0 = Metrics::scrape(coord.http)?;
    let rev0 = revision().await?;
    let (c0, s0, w0) = (cpu_time(pid)?, cpu_time("self")?, Instant::now());
    tokio::time::sleep(args.duration).await;
    let (c1, s1, window) = (cpu_time(pid)?, cpu_time("self")?, w0.elapsed());
    let rev1 = revision().await?;
    shared.recording.store(false, Ordering::Relaxed);
    let rss = rss_kib(pid)?;
    let m1 = Metrics::scrape(coord.http)?;
    let mut lat = std::mem::take(&mut *shared.samples.lock().expect("samples lock"));
    lat.sort_unstable();
    let acked = lat.len() as u64;
    let w = window.as_secs_f64();
    let cpu = (c1 - c0).as_secs_f64();

    // Kill 1 % at once (at least one agent unless --kill-percent 0), spread over the fleet,
    // and time the coordinator's detection.
    let killed = kill_count(n, args.kill_percent);
    let step = n.checked_div(killed).unwrap_or(n);
    let victims: Vec<usize> = (0..killed).map(|k| k * step).collect();
    let before = wait_metrics(coord, Duration::ZERO, |_| true)
        .await?
        .unwrap_or_default();
    let kill_at = Instant::now();
    for &v in &victims {
        tasks[v].abort();
    }
    let unreachable_before = before.state("unreachable");
    let limit = args.interval * (GRACE_INTERVALS + 2) + Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let victim_names: std::collections::HashSet<String> =
        victims.iter().map(|&v| fleet::hostname(v)).collect();
    // The cheap gauge first; then, per machine, that it is the killed ones that went
    // unreachable (a loaded coordinator could lose others too).
    let mut detect_s = None;
    let mut others_unreachable = 0;
    let mut healthy_after_kill = 0;
    if killed > 0
        && wait_metrics(coord, limit, |m| {
            m.state("unreachable") >= unreachable_before + killed as u64
        })
        .await?
        .is_some()
    {
        loop {
            let list = tokio::task::block_in_place(|| coord.machines())?;
            let unreachable = |m: &&testkit::ctl_json::MachineSummary| m.state == "unreachable";
            let hit = list
                .iter()
                .filter(unreachable)
                .filter(|m| victim_names.contains(&m.spec.hostname))
                .count();
            if hit == killed {
                detect_s = Some(kill_at.elapsed().as_secs_f64());
                others_unreachable = list.iter().filter(unreachable).count() - hit;
                healthy_after_kill = list.iter().filter(|m| m.state == "healthy").count() as u64;
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let errors = shared.errors.lock().expect("errors lock").clone();
    let end = Metrics::scrape(coord.http)?;
    // After the kill: the unreachable machines' transitions did write (the counter is live).
    let rev2 = revision().await?;
    Ok(Results {
        agents: n,
        interval_s: args.interval.as_secs_f64(),
        window_s: w,
        cert_issue_s: 0.0,
        connect_s: connect.as_secs_f64(),
        concurrent_handshakes: args.handshakes,
        connected,
        reports_acked: acked,
        reports_per_s: acked as f64 / w,
        reports_offered_per_s: n as f64 / args.interval.as_secs_f64(),
        coordinator_reports_per_s: (m1.reports - m0.reports) as f64 / w,
        latency_p50_ms: quantile_ms(&lat, 0.5),
        latency_p99_ms: quantile_ms(&lat, 0.99),
        latency_max_ms: quantile_ms(&lat, 1.0),
        coordinator_cpu_pct: 100.0 * cpu / w,
        coordinator_cpu_us_per_report: cpu * 1e6 / acked.max(1) as f64,
        coordinator_rss_base_kib: 0,
        coordinator_rss_kib: rss,
        coordinator_rss_per_agent_kib: 0.0,
        simulator_cpu_pct: 100.0 * (s1 - s0).as_secs_f64() / w,
        dropped: shared.dropped.load(Ordering::Relaxed),
        errors,
        coordinator_refused: end.refused,
        udp_drops_coordinator: udp_socket_drops(&[coord.quic.port()])?,
        udp_drops_simulator: udp_socket_drops(&sim_ports)?,
        udp_receive_drops: udp_receive_drops()? - udp_drops_at_start,
        healthy_at_window_end: m1.state("healthy"),
        killed,
        unreachable_grace_s: 0.0,
        detect_s,
        others_unreachable,
        healthy_after_kill,
        store: if rev0.is_some() { "etcd" } else { "sqlite" }.into(),
        etcd_revision: rev0.zip(rev1),
        etcd_revision_after_kill: rev2,
    })
}

/// How many of `n` agents `percent` % is: rounded, but at least one for any percentage
/// above zero (1 % of 20 agents would otherwise kill none and measure nothing).
fn kill_count(n: usize, percent: f64) -> usize {
    if percent <= 0.0 {
        return 0;
    }
    ((n as f64 * percent / 100.0).round() as usize).clamp(1, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_fleet_still_loses_one_agent() {
        assert_eq!(kill_count(20, 1.0), 1);
        assert_eq!(kill_count(1000, 1.0), 10);
        assert_eq!(kill_count(1000, 0.0), 0);
        assert_eq!(kill_count(3, 100.0), 3);
    }

    fn args(s: &str) -> anyhow::Result<Args> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_the_documented_options() {
        let a = args("--agents 10000 --interval 5s --duration 2m --json").unwrap();
        assert_eq!(a.agents, 10_000);
        assert_eq!(a.interval, Duration::from_secs(5));
        assert_eq!(a.duration, Duration::from_secs(120));
        assert!(a.json);
        let a = args("--interval 300ms --kill-percent 4").unwrap();
        assert_eq!(a.interval, Duration::from_millis(300));
        assert_eq!(a.kill_percent, 4.0);
        assert_eq!(a.agents, 1000);
    }

    #[test]
    fn refuses_bad_options() {
        assert!(args("--agents 0").is_err());
        assert!(args("--interval 5").is_err());
        assert!(args("--interval 5d").is_err());
        assert!(args("--interval 0s").is_err());
        assert!(args("--kill-percent 101").is_err());
        assert!(args("--agents").is_err());
        let e = args("--bogus").unwrap_err().to_string();
        assert!(e.starts_with("unknown option --bogus"), "{e}");
        assert!(args("--help").unwrap().help);
    }
}
