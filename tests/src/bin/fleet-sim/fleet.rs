//! The simulated agents: node certificates issued in process, and one tokio task per agent
//! that connects over QUIC with its own identity, says hello as a node-agent would and
//! reports at the interval (with jitter) until it is stopped or killed.
//!
//! What it does not do: run checks, reconnect or answer agent actions. An agent whose
//! connection fails is counted as dropped and stays down, so every drop shows in the figures.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use protocol::Role;
use protocol::frame::MAX_FRAME_LEN;
use protocol::messages::{
    AgentHello, AgentMessage, CheckKind, CheckResult, CheckStatus, CoordinatorReply, HealthReport,
    HelloBody,
};
use protocol::pki::{Ca, IssueOptions};
use protocol::transport::{HELLO_TIMEOUT, TlsMaterial, connect_with, expect_msg, write_msg};
use quinn::Endpoint;
use tokio::sync::Semaphore;

/// The boot id every simulated agent reports (one boot for the whole run).
const BOOT_ID: &str = "fleet-sim-boot";

/// A reporting period varies by up to this fraction either way, as real agents' timers
/// drift apart; it keeps the agents from falling into lockstep after a hiccup.
const JITTER: f64 = 0.05;

/// Inventory address of agent `i`: unique in 10.0.0.0/8 (used as names, never routed).
pub(crate) fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        ((i >> 16) & 0xff) as u8,
        ((i >> 8) & 0xff) as u8,
        (i & 0xff) as u8,
    )
}

/// Hostname (and certificate name) of agent `i`.
pub(crate) fn hostname(i: usize) -> String {
    format!("sim-{i}")
}

/// A deterministic pseudo-random number in `[0, 1)` (splitmix64): the simulator needs
/// spread, not secrecy, and repeatable runs are easier to compare.
pub(crate) fn unit(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Issues one node certificate per agent from the CA in `ca_dir`, in process (ECDSA P-256),
/// spread over the available cores.
pub(crate) fn issue_certificates(ca_dir: &Path, agents: usize) -> anyhow::Result<Vec<TlsMaterial>> {
    let ca = Ca::load(ca_dir).context("loading the fleet CA")?;
    let ca_pem = std::fs::read(ca_dir.join("ca.crt")).context("reading ca.crt")?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = agents.div_ceil(workers).max(1);
    let mut out = Vec::with_capacity(agents);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..agents)
            .step_by(chunk)
            .map(|start| {
                let (ca, ca_pem) = (&ca, &ca_pem);
                s.spawn(move || {
                    (start..(start + chunk).min(agents))
                        .map(|i| {
                            let issued =
                                ca.issue(Role::Node, &hostname(i), &IssueOptions::default())?;
                            anyhow::Ok(issued.tls_material(ca_pem)?)
                        })
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        for h in handles {
            out.extend(h.join().expect("certificate worker panicked")?);
        }
        anyhow::Ok(())
    })?;
    Ok(out)
}

/// What the agents share with the orchestrator: progress counters and the measurement
/// window's samples.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Agents whose hello was accepted.
    pub(crate) connected: AtomicUsize,
    /// Agents whose connection failed (connect or later), killed ones excluded.
    pub(crate) dropped: AtomicUsize,
    /// The first few failures, for the report.
    pub(crate) errors: Mutex<Vec<String>>,
    /// Agents with at least one acked report.
    pub(crate) reporting: AtomicUsize,
    /// While set, acked reports are recorded in `samples`.
    pub(crate) recording: AtomicBool,
    /// Report → ack latencies in the window, in microseconds.
    pub(crate) samples: Mutex<Vec<u32>>,
    /// Set to stop every agent (end of run).
    pub(crate) stop: AtomicBool,
}

impl Shared {
    fn failed(&self, host: &str, e: &anyhow::Error) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock().expect("errors lock");
        if errors.len() < 5 {
            errors.push(format!("{host}: {e:#}"));
        }
    }
}

/// One simulated agent's parameters.
pub(crate) struct Agent {
    /// Index (names and seeds derive from it).
    pub(crate) index: usize,
    /// Its certificate and key.
    pub(crate) tls: TlsMaterial,
    /// The client endpoint it connects from (shared with other agents).
    pub(crate) endpoint: Endpoint,
    /// The coordinator's QUIC address.
    pub(crate) coordinator: SocketAddr,
    /// Report interval.
    pub(crate) interval: Duration,
}

/// Runs one agent until [`Shared::stop`]; failures are counted in `shared`, not returned.
pub(crate) async fn run(agent: Agent, handshakes: Arc<Semaphore>, shared: Arc<Shared>) {
    let host = hostname(agent.index);
    if let Err(e) = session(&agent, &host, &handshakes, &shared).await
        && !shared.stop.load(Ordering::Relaxed)
    {
        shared.failed(&host, &e);
    }
}

async fn session(
    agent: &Agent,
    host: &str,
    handshakes: &Semaphore,
    shared: &Shared,
) -> anyhow::Result<()> {
    let config = agent.tls.quinn_client_config()?;
    let hello = HelloBody::Agent(AgentHello {
        hostname: host.to_string(),
        serial: format!("SN-{host}"),
        addresses: vec![IpAddr::V4(address(agent.index))],
        agent_version: "fleet-sim".into(),
        boot_id: BOOT_ID.into(),
    });
    let mut s = {
        let _permit = handshakes.acquire().await?;
        connect_with(
            &agent.endpoint,
            config,
            agent.coordinator,
            "127.0.0.1",
            Role::Coordinator,
            hello,
            HELLO_TIMEOUT * 3,
        )
        .await
        .context("connect")?
    };
    shared.connected.fetch_add(1, Ordering::Relaxed);
    let seed = agent.index as u64;
    // A random phase within the first interval, as agents started at different times have.
    tokio::time::sleep(agent.interval.mul_f64(unit(seed))).await;
    let mut next = tokio::time::Instant::now();
    let mut seq = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        seq += 1;
        let report = AgentMessage::Report(report(seq, agent.interval));
        let sent = Instant::now();
        write_msg(&mut s.send, &report, MAX_FRAME_LEN)
            .await
            .context("sending a report")?;
        let reply = expect_msg::<CoordinatorReply>(&mut s.recv, MAX_FRAME_LEN)
            .await
            .context("waiting for the ack")?;
        let latency = sent.elapsed();
        anyhow::ensure!(
            reply == CoordinatorReply::Ack { seq },
            "expected the ack of report {seq}, got {reply:?}"
        );
        if seq == 1 {
            shared.reporting.fetch_add(1, Ordering::Relaxed);
        }
        if shared.recording.load(Ordering::Relaxed) {
            let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
            shared.samples.lock().expect("samples lock").push(us);
        }
        let spread = 1.0 + JITTER * (2.0 * unit(seed ^ (seq << 32)) - 1.0);
        next += agent.interval.mul_f64(spread);
        tokio::time::sleep_until(next).await;
    }
    s.conn.close(0u32.into(), b"fleet-sim done");
    Ok(())
}

/// What a node-agent with the default checks reports: kubelet, two NICs, two mounts and
/// kdump, all fine (the coordinator's steady-state path: no transition, no disk write).
fn report(seq: u64, interval: Duration) -> HealthReport {
    let check = |kind, subject: &str, detail: &str| CheckResult {
        kind,
        subject: subject.into(),
        status: CheckStatus::Ok,
        detail: detail.into(),
    };
    HealthReport {
        seq,
        time_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        boot_id: BOOT_ID.into(),
        checks: vec![
            check(CheckKind::Kubelet, "kubelet", "healthz 200 in 2 ms"),
            check(CheckKind::Nic, "eth0", "up, 25000 Mb/s"),
            check(CheckKind::Nic, "eth1", "up, 25000 Mb/s"),
            check(CheckKind::Disk, "/", "41 % used"),
            check(CheckKind::Disk, "/var/lib/kubelet", "12 % used"),
            check(CheckKind::Kdump, "kdump", "crash kernel loaded"),
        ],
        // As a real agent announces its interval.
        report_interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_are_unique() {
        let n = 70_000;
        let addrs: std::collections::HashSet<_> = (0..n).map(address).collect();
        assert_eq!(addrs.len(), n);
    }

    #[test]
    fn unit_is_in_range_and_spread() {
        let xs: Vec<f64> = (0..10_000).map(unit).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
