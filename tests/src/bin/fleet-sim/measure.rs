//! What the simulator reads and prints: a process's CPU time and RSS from `/proc`, the
//! coordinator's `/metrics` series, latency percentiles, and the result as a table or JSON.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

/// Linux reports a process's CPU time in clock ticks of 10 ms (`USER_HZ` = 100 on every
/// architecture the project builds for).
const TICK: Duration = Duration::from_millis(10);

/// `utime + stime` of a process (`"self"` for this one).
pub(crate) fn cpu_time(pid: &str) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("malformed /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<u32>()? + f[12].parse::<u32>()?;
    Ok(TICK * ticks)
}

/// `VmRSS` of a process in KiB.
pub(crate) fn rss_kib(pid: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc status")
}

/// `RcvbufErrors` of `/proc/net/snmp`: UDP datagrams the kernel dropped, machine-wide,
/// because a socket's receive buffer was full.
pub(crate) fn udp_receive_drops() -> anyhow::Result<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp")?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (
        udp.next().context("Udp header")?,
        udp.next().context("Udp values")?,
    );
    let i = names
        .split_whitespace()
        .position(|n| n == "RcvbufErrors")
        .context("no RcvbufErrors")?;
    Ok(values
        .split_whitespace()
        .nth(i)
        .context("short Udp line")?
        .parse()?)
}

/// Datagrams dropped by the UDP sockets bound to `ports` (the `drops` column of
/// `/proc/net/udp`), summed.
pub(crate) fn udp_socket_drops(ports: &[u16]) -> anyhow::Result<u64> {
    let table = std::fs::read_to_string("/proc/net/udp")?;
    Ok(parse_socket_drops(&table, ports))
}

fn parse_socket_drops(table: &str, ports: &[u16]) -> u64 {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            ports
                .contains(&port)
                .then(|| f.last()?.parse::<u64>().ok())?
        })
        .sum()
}

/// The coordinator's gauges and counters the simulator watches.
#[derive(Debug, Default, Clone)]
pub(crate) struct Metrics {
    /// `fleetmend_machines` by state.
    pub(crate) machines: BTreeMap<String, u64>,
    /// `fleetmend_reports_received_total`.
    pub(crate) reports: u64,
    /// `fleetmend_connections_open{kind="agent"}`.
    pub(crate) agent_connections: u64,
    /// `fleetmend_connections_refused_total`, all reasons.
    pub(crate) refused: u64,
}

impl Metrics {
    /// Scrapes the coordinator's `/metrics`.
    pub(crate) fn scrape(http: SocketAddr) -> anyhow::Result<Self> {
        let (code, body) = testkit::procs::http_get(http, "/metrics")?;
        anyhow::ensure!(code == 200, "/metrics answered {code}");
        Ok(Self::parse(&body))
    }

    fn parse(body: &str) -> Self {
        let mut m = Self::default();
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<u64>() else {
                continue;
            };
            if let Some(state) = series
                .strip_prefix("fleetmend_machines{state=\"")
                .and_then(|s| s.strip_suffix("\"}"))
            {
                m.machines.insert(state.to_string(), value);
            } else if series == "fleetmend_reports_received_total" {
                m.reports = value;
            } else if series == "fleetmend_connections_open{kind=\"agent\"}" {
                m.agent_connections = value;
            } else if series.starts_with("fleetmend_connections_refused_total") {
                m.refused += value;
            }
        }
        m
    }

    /// Machines in `state`.
    pub(crate) fn state(&self, state: &str) -> u64 {
        self.machines.get(state).copied().unwrap_or(0)
    }
}

/// The `p`-quantile (0..=1) of sorted samples, in milliseconds.
pub(crate) fn quantile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_us.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted_us[i]) / 1000.0
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub(crate) struct Results {
    /// Simulated agents.
    pub(crate) agents: usize,
    /// Report interval, seconds.
    pub(crate) interval_s: f64,
    /// Measurement window, seconds.
    pub(crate) window_s: f64,
    /// Seconds spent issuing the agents' certificates.
    pub(crate) cert_issue_s: f64,
    /// Seconds from the first connection attempt until every agent's hello was accepted.
    pub(crate) connect_s: f64,
    /// Handshakes allowed at once.
    pub(crate) concurrent_handshakes: usize,
    /// Agents connected at the end of the connect phase.
    pub(crate) connected: usize,
    /// Reports acked in the window.
    pub(crate) reports_acked: u64,
    /// Acked reports per second in the window.
    pub(crate) reports_per_s: f64,
    /// What the agents offer: agents / interval.
    pub(crate) reports_offered_per_s: f64,
    /// Reports the coordinator counted in the window, per second (its own counter).
    pub(crate) coordinator_reports_per_s: f64,
    /// Report → ack latency, client side, milliseconds.
    pub latency_p50_ms: f64,
    /// 99th percentile.
    pub latency_p99_ms: f64,
    /// Largest.
    pub(crate) latency_max_ms: f64,
    /// Coordinator CPU in the window, percent of one core.
    pub(crate) coordinator_cpu_pct: f64,
    /// Coordinator CPU per acked report, microseconds.
    pub(crate) coordinator_cpu_us_per_report: f64,
    /// Coordinator RSS with its inventory loaded, before any agent connected, KiB.
    pub(crate) coordinator_rss_base_kib: u64,
    /// Coordinator RSS at the end of the window, KiB.
    pub(crate) coordinator_rss_kib: u64,
    /// (end − base) / agents, KiB.
    pub(crate) coordinator_rss_per_agent_kib: f64,
    /// This process's CPU in the window, percent of one core (the simulated agents).
    pub(crate) simulator_cpu_pct: f64,
    /// Connections that failed (connect or later), killed agents excluded.
    pub(crate) dropped: usize,
    /// The first few failures.
    pub(crate) errors: Vec<String>,
    /// Connections the coordinator refused or lost before hello, whole run.
    pub(crate) coordinator_refused: u64,
    /// UDP datagrams the kernel dropped for full receive buffers during the run, machine-wide.
    pub(crate) udp_receive_drops: u64,
    /// Of those, dropped at the coordinator's socket (whole run, from its start).
    pub(crate) udp_drops_coordinator: u64,
    /// Of those, dropped at the simulator's sockets.
    pub(crate) udp_drops_simulator: u64,
    /// Machines the coordinator held `healthy` at the end of the window.
    pub(crate) healthy_at_window_end: u64,
    /// Agents killed at once.
    pub(crate) killed: usize,
    /// The coordinator's unreachable grace, seconds.
    pub(crate) unreachable_grace_s: f64,
    /// Seconds from the kill until the coordinator counted every killed machine unreachable
    /// (`None`: not within the time limit).
    pub(crate) detect_s: Option<f64>,
    /// Machines other than the killed ones counted unreachable at that moment (should be 0).
    pub(crate) others_unreachable: usize,
    /// Machines `healthy` once the killed ones were detected (should be agents − killed).
    pub(crate) healthy_after_kill: u64,
    /// The coordinator's store: `sqlite` or `etcd`.
    pub(crate) store: String,
    /// With `--store etcd`: etcd's revision at the start and the end of the window (equal
    /// when reports wrote nothing).
    pub(crate) etcd_revision: Option<(i64, i64)>,
    /// etcd's revision once the killed machines were found unreachable (their transitions
    /// are written): proof that the revision read sees the coordinator's writes.
    pub(crate) etcd_revision_after_kill: Option<i64>,
}

impl Results {
    /// The human-readable table.
    pub(crate) fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![
            (
                "certificates issued (in process)".into(),
                format!("{} in {:.2} s", self.agents, self.cert_issue_s),
            ),
            (
                "fleet connect time".into(),
                format!(
                    "{:.2} s for {} agents ({:.0}/s, {} handshakes at a time)",
                    self.connect_s,
                    self.connected,
                    self.connected as f64 / self.connect_s.max(1e-9),
                    self.concurrent_handshakes
                ),
            ),
            (
                "reports acked per second".into(),
                format!(
                    "{:.1} of {:.1} offered (coordinator counted {:.1}/s)",
                    self.reports_per_s, self.reports_offered_per_s, self.coordinator_reports_per_s
                ),
            ),
            (
                "report → ack latency p50 / p99 / max".into(),
                format!(
                    "{:.2} / {:.2} / {:.2} ms",
                    self.latency_p50_ms, self.latency_p99_ms, self.latency_max_ms
                ),
            ),
            (
                "coordinator CPU".into(),
                format!(
                    "{:.1} % of one core, {:.1} µs per report",
                    self.coordinator_cpu_pct, self.coordinator_cpu_us_per_report
                ),
            ),
            (
                "coordinator RSS".into(),
                format!(
                    "{:.1} MiB ({:.1} MiB before agents), {:.1} KiB per agent",
                    self.coordinator_rss_kib as f64 / 1024.0,
                    self.coordinator_rss_base_kib as f64 / 1024.0,
                    self.coordinator_rss_per_agent_kib
                ),
            ),
            (
                "simulator CPU (the agents)".into(),
                format!("{:.1} % of one core", self.simulator_cpu_pct),
            ),
            (
                "dropped connections".into(),
                format!(
                    "{} (healthy at window end: {}/{}; refused by the coordinator: {})",
                    self.dropped, self.healthy_at_window_end, self.agents, self.coordinator_refused,
                ),
            ),
            (
                "store writes in the window".into(),
                match (self.etcd_revision, self.etcd_revision_after_kill) {
                    (Some((a, b)), after) => format!(
                        "etcd revision {a} → {b} ({:+}: {}); {} after the kill",
                        b - a,
                        if a == b { "no write" } else { "written" },
                        after.map_or("?".into(), |c| format!("{c} ({:+})", c - b)),
                    ),
                    (None, _) => format!("{} (not counted)", self.store),
                },
            ),
            (
                "UDP receive-buffer drops".into(),
                format!(
                    "{} machine-wide: {} at the coordinator, {} at the agents",
                    self.udp_receive_drops, self.udp_drops_coordinator, self.udp_drops_simulator
                ),
            ),
            (
                match self.killed {
                    1 => "detect 1 agent killed".into(),
                    k => format!("detect {k} agents killed at once"),
                },
                match self.detect_s {
                    _ if self.killed == 0 => "none killed (--kill-percent 0)".into(),
                    Some(s) => format!(
                        "{s:.2} s (grace {:.1} s; then healthy: {}, others unreachable: {})",
                        self.unreachable_grace_s, self.healthy_after_kill, self.others_unreachable
                    ),
                    None => "not detected in time".into(),
                },
            ),
        ];
        for e in &self.errors {
            rows.push(("error".into(), e.clone()));
        }
        let w = rows
            .iter()
            .map(|(k, _)| k.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = format!(
            "fleet-sim: {} agents, interval {:.1} s, window {:.0} s\n",
            self.agents, self.interval_s, self.window_s
        );
        for (k, v) in rows {
            let pad = w - k.chars().count();
            out.push_str(&format!("  {k}{}  {v}\n", " ".repeat(pad)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_coordinator_series() {
        let body = "# HELP fleetmend_machines Machines by health state.\n\
                    fleetmend_machines{state=\"healthy\"} 990\n\
                    fleetmend_machines{state=\"unreachable\"} 10\n\
                    fleetmend_reports_received_total 12345\n\
                    fleetmend_connections_open{kind=\"agent\"} 990\n\
                    fleetmend_connections_open{kind=\"admin\"} 1\n\
                    fleetmend_connections_refused_total{reason=\"handshake_failed\"} 2\n\
                    fleetmend_connections_refused_total{reason=\"not_authorized\"} 1\n";
        let m = Metrics::parse(body);
        assert_eq!(m.state("healthy"), 990);
        assert_eq!(m.state("unreachable"), 10);
        assert_eq!(m.state("fenced"), 0);
        assert_eq!(m.reports, 12345);
        assert_eq!(m.agent_connections, 990);
        assert_eq!(m.refused, 3);
    }

    #[test]
    fn sums_the_drops_of_the_named_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
            10206: 0100007F:B6CA 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2148677 2 000000009edf5d58 7\n\
            10207: 0100007F:0050 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2148678 2 000000009edf5d59 5\n\
            10208: 0100007F:0051 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2148679 2 000000009edf5d5a 100\n";
        assert_eq!(parse_socket_drops(table, &[0xB6CA, 80]), 12);
        assert_eq!(parse_socket_drops(table, &[1]), 0);
    }

    #[test]
    fn quantiles_pick_the_nearest_rank() {
        let xs: Vec<u32> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(quantile_ms(&xs, 0.0), 1.0);
        assert_eq!(quantile_ms(&xs, 0.5), 51.0);
        assert_eq!(quantile_ms(&xs, 0.99), 99.0);
        assert_eq!(quantile_ms(&xs, 1.0), 100.0);
        assert!(quantile_ms(&[], 0.5).is_nan());
    }
}
