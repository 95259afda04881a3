//! Fleetmend's bmc-gateway: the rack appliance that powers servers off and on.
//!
//! It keeps the rack's BMC credentials, speaks IPMI over LAN ([`ipmi`]) and Redfish
//! ([`redfish`]) behind one [`power::PowerControl`] trait, gives each action its meaning
//! ([`actions`]), runs one action per BMC at a time and each request id at most once, also
//! across its own restarts ([`gateway`], [`dedup`], [`journal`]), and obeys only coordinator certificates over mutual-TLS QUIC
//! ([`service`]). [`check`] reads every BMC's power state for the person installing it.
//!
//! It deliberately decides nothing about *whether* a machine should be power-cycled: that is
//! the coordinator's job.

pub mod actions;
pub mod config;
pub mod dedup;
pub mod fence_agent;
pub mod gateway;
pub mod ipmi;
pub mod journal;
pub mod levels;
pub mod metrics;
pub mod pace;
pub mod power;
pub mod redfish;
pub mod redfish_tls;
pub mod reload;
pub mod service;
pub mod state_lock;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use protocol::transport::TransportError;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{BmcConfig, BmcProtocol, Config, PduConfig};
use crate::fence_agent::{AgentDevice, AgentPowerControl};
use crate::gateway::{Bmc, Defaults, Gateway};
use crate::ipmi::{IpmiPowerControl, IpmiTarget};
use crate::metrics::Metrics;
use crate::power::{PowerControl, PowerReading, PowerState};
use crate::redfish::{AuthMode, RedfishPowerControl, RedfishTarget, Trust};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The QUIC endpoint.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The TLS files: unreadable, not a gateway's, or not of the configured CA.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// A BMC client could not be built.
    #[error("BMC {machine}: {detail}")]
    Bmc {
        /// The machine.
        machine: String,
        /// What went wrong.
        detail: String,
    },
    /// A PDU did not answer its agent's `monitor` at start: a wrong community or password, a
    /// wrong address, or the agent cannot drive it.
    #[error(
        "{key}: PDU {device} did not answer {agent} monitor: {detail}; fix the PDU's settings \
         (host, port, password_file, secret_option, options) or the PDU; `bmc-gateway check` \
         shows every device"
    )]
    Device {
        /// The configuration key, e.g. `pdu[0]`.
        key: String,
        /// The PDU.
        device: String,
        /// The agent.
        agent: String,
        /// What the agent said.
        detail: String,
    },
    /// The request record in the state directory could not be opened.
    #[error("{0}; check state_dir in the configuration and that the gateway may write there")]
    State(#[from] journal::JournalError),
    /// The HTTP listener could not be bound.
    #[error("cannot bind HTTP {addr}: {source}")]
    Http {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

impl StartError {
    /// True when retrying may succeed (a port in use may be freed); config errors are not.
    pub fn is_retriable(&self) -> bool {
        matches!(self, StartError::Http { .. } | StartError::State(_))
    }
}

/// Reads one BMC's password file.
pub fn password_of(b: &BmcConfig) -> Result<String, StartError> {
    b.read_password().map_err(|e| StartError::Bmc {
        machine: b.machine.clone(),
        detail: format!("password file {}: {e}", b.password_file.display()),
    })
}

/// Builds the power client for one configured BMC with its `password` (logs loudly about weak TLS settings).
pub fn power_for(b: &BmcConfig, password: String) -> Result<Arc<dyn PowerControl>, StartError> {
    match b.protocol {
        BmcProtocol::FenceAgent => {
            let a = b.agent.as_ref().ok_or_else(|| StartError::Bmc {
                machine: b.machine.clone(),
                detail: "missing [bmc.agent]".into(),
            })?;
            let program = fence_agent::find_agent(&a.name).ok_or_else(|| StartError::Bmc {
                machine: b.machine.clone(),
                detail: format!("bmc.agent.name: fence agent {:?} is not installed", a.name),
            })?;
            let device =
                AgentDevice::new(b.describe(), program, b.agent_options(password), a.timeout);
            Ok(Arc::new(AgentPowerControl::new(device, None)))
        }
        BmcProtocol::Ipmi => {
            let s = b.ipmi_settings();
            Ok(Arc::new(IpmiPowerControl::new(IpmiTarget {
                name: b.describe(),
                host: b.host.clone(),
                port: b.port(),
                username: b.username.clone(),
                password,
                reply_timeout: s.reply_timeout,
                attempts: s.attempts,
            })))
        }
        BmcProtocol::Redfish => {
            let r = b.redfish.clone().ok_or_else(|| StartError::Bmc {
                machine: b.machine.clone(),
                detail: "missing [bmc.redfish]".into(),
            })?;
            let trust = if r.scheme == "http" {
                warn!(machine = %b.machine, host = %b.host, "INSECURE: Redfish over plain HTTP; credentials travel in clear text");
                Trust::PlainHttp
            } else if r.insecure {
                warn!(machine = %b.machine, host = %b.host, "INSECURE: Redfish certificate NOT verified (insecure = true); anyone on the path can impersonate this BMC");
                Trust::Insecure
            } else {
                let ca = r.ca_file.as_ref().ok_or_else(|| StartError::Bmc {
                    machine: b.machine.clone(),
                    detail: "no ca_file".into(),
                })?;
                Trust::Ca(
                    protocol::file::read_regular(ca).map_err(|e| StartError::Bmc {
                        machine: b.machine.clone(),
                        detail: format!("ca_file {}: {e}", ca.display()),
                    })?,
                )
            };
            let auth = match r.auth.as_str() {
                "basic" => AuthMode::Basic,
                "session" => AuthMode::Session,
                _ => AuthMode::Auto,
            };
            let p = RedfishPowerControl::new(RedfishTarget {
                name: b.describe(),
                authority: authority(&b.host, b.port()),
                trust,
                username: b.username.clone(),
                password,
                system: r.system.clone(),
                auth,
                request_timeout: r.request_timeout,
            })
            .map_err(|e| StartError::Bmc {
                machine: b.machine.clone(),
                detail: e.to_string(),
            })?;
            Ok(Arc::new(p))
        }
    }
}

/// Builds the agent device of each PDU (reading its secret, recorded in `credentials` for
/// reloads), by name.
pub fn pdu_devices(
    cfg: &Config,
    credentials: &mut reload::Credentials,
) -> Result<std::collections::HashMap<String, Arc<AgentDevice>>, StartError> {
    let mut out = std::collections::HashMap::new();
    for p in &cfg.pdus {
        let (device, secret) = pdu_device(p)?;
        if let Some(s) = &secret {
            credentials.insert_pdu(&p.name, s);
        }
        out.insert(p.name.clone(), device);
    }
    Ok(out)
}

/// The agent device of PDU `p`, and the secret it was made with.
fn pdu_device(p: &PduConfig) -> Result<(Arc<AgentDevice>, Option<String>), StartError> {
    let fail = |detail: String| StartError::Bmc {
        machine: format!("pdu {}", p.name),
        detail,
    };
    let secret = p
        .read_secret()
        .map_err(|e| fail(format!("password_file: {e}")))?;
    let program = fence_agent::find_agent(&p.agent)
        .ok_or_else(|| fail(format!("agent: fence agent {:?} is not installed", p.agent)))?;
    let device = AgentDevice::new(
        p.describe(),
        program,
        p.agent_options(secret.clone()),
        p.timeout,
    );
    Ok((device, secret))
}

/// The lower levels of `b` (level 2 on), each a list of outlets of `pdus`.
pub fn lower_levels(
    b: &BmcConfig,
    pdus: &std::collections::HashMap<String, Arc<AgentDevice>>,
) -> Vec<Vec<levels::Device>> {
    b.levels
        .iter()
        .map(|l| {
            l.parsed()
                .into_iter()
                .filter_map(|o| {
                    let dev = pdus.get(&o.pdu)?.clone();
                    Some(levels::Device {
                        name: format!("{} outlet {}", o.pdu, o.plug),
                        power: Arc::new(AgentPowerControl::new(dev, Some(o.plug))),
                    })
                })
                .collect()
        })
        .collect()
}

/// Wraps a BMC client in its pacing: the BMC's minimum command interval (else the
/// gateway's) and the power-on busy retry window.
pub fn paced(
    b: &BmcConfig,
    limits: &config::Limits,
    power: Arc<dyn PowerControl>,
) -> Arc<dyn PowerControl> {
    let interval = b
        .min_command_interval
        .unwrap_or(limits.min_command_interval);
    Arc::new(pace::Paced::new(
        power,
        interval,
        limits.power_on_busy_retry,
    ))
}

/// Builds the gateway core from the configuration, reading back the request record in its
/// state directory (needs a Tokio runtime). Also returns the BMC passwords and PDU secrets it
/// read, so that a reload can tell when the files no longer hold what the running gateway uses.
pub fn build(
    cfg: &Config,
    metrics: Arc<Metrics>,
) -> Result<(Arc<Gateway>, reload::Credentials), StartError> {
    let mut bmcs = Vec::new();
    let mut credentials = reload::Credentials::default();
    let pdus = pdu_devices(cfg, &mut credentials)?;
    for b in &cfg.bmcs {
        let password = password_of(b)?;
        credentials.insert(&b.machine, &password);
        let bmc = paced(b, &cfg.limits, power_for(b, password)?);
        let power: Arc<dyn PowerControl> = if b.levels.is_empty() {
            bmc
        } else {
            let mut all = vec![vec![levels::Device {
                name: format!("BMC {}", b.describe()),
                power: bmc,
            }]];
            all.extend(lower_levels(b, &pdus));
            Arc::new(levels::Levels::new(
                b.machine.clone(),
                all,
                Some(levels::acting_file(&cfg.state_dir, &b.machine)),
            ))
        };
        bmcs.push(Bmc {
            machine: b.machine.clone(),
            serial: b.serial.clone(),
            protocol: b.protocol.as_str(),
            power,
        });
    }
    let defaults = Defaults {
        action_timeout: cfg.limits.action_timeout,
        fence_timeout: cfg.limits.fence_timeout,
        busy_retry: cfg.limits.power_on_busy_retry,
        poll: actions::FENCE_POLL,
        probe: Some(gateway::PROBE_EVERY),
    };
    let gw = Gateway::durable(bmcs, defaults, metrics, &cfg.state_dir)?;
    Ok((gw, credentials))
}

/// Asks every fence device driven by an agent whether it answers, before the gateway serves.
///
/// A PDU that does not answer `monitor` stops the start (exit 64): it is rack equipment that
/// does not die with a machine, so a failure is a wrong community, password or address, and
/// without it the lower level of every machine it feeds would be gone without a word. A
/// fence-agent BMC that does not answer `status` is logged as an error but does not stop the
/// start: a dead BMC is the very case the lower levels are for, and a gateway that refused to
/// start over it could fence none of the rack.
pub async fn probe_devices(cfg: &Config) -> Result<(), StartError> {
    let mut probes = Vec::new();
    for (i, p) in cfg.pdus.iter().enumerate() {
        let (d, _) = pdu_device(p)?;
        let key = format!("pdu[{i}]");
        probes.push(tokio::spawn(async move {
            let r = d.run("monitor", None).await;
            let detail = match r {
                Ok(run) if run.code == Some(0) => return Ok(()),
                Ok(run) => format!(
                    "exit {}: {}",
                    run.code.map_or("by a signal".into(), |c| c.to_string()),
                    if run.said.is_empty() {
                        "(no output)"
                    } else {
                        run.said.as_str()
                    }
                ),
                Err(e) => e.to_string(),
            };
            Err(StartError::Device {
                key,
                device: d.name.clone(),
                agent: d.agent_name(),
                detail,
            })
        }));
    }
    for (i, b) in cfg.bmcs.iter().enumerate() {
        if b.protocol != BmcProtocol::FenceAgent {
            continue;
        }
        let power = power_for(b, password_of(b)?)?;
        let (machine, key) = (b.machine.clone(), format!("bmc[{i}]"));
        probes.push(tokio::spawn(async move {
            if let Err(e) = power.power_state().await {
                tracing::error!(%machine, %key, error = %e, "fence-agent BMC does not answer status at start; the gateway starts anyway (its lower levels, if any, still serve); check its settings if the BMC is up");
            }
            Ok(())
        }));
    }
    let mut first = Ok(());
    for p in probes {
        if let Ok(Err(e)) = p.await
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

/// Addresses the running gateway is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// QUIC.
    pub quic: SocketAddr,
    /// HTTP, when configured.
    pub http: Option<SocketAddr>,
}

/// Logs a warning when the gateway's certificate or its CA expires within a month (or has
/// expired): past it, coordinators refuse this gateway and power actions stop.
fn warn_if_expiring(expiry: protocol::transport::Expiry, cert: &std::path::Path) {
    if let Some(w) = expiry.warning(protocol::transport::unix_now()) {
        warn!(
            certificate = %cert.display(),
            "{w}: issue a new one (`coordinatorctl pki issue --role gateway`), install it and reload (`systemctl reload bmc-gateway`); past it coordinators refuse this gateway"
        );
    }
}

/// Runs the gateway until `stop` is cancelled; calls `ready` once listening. Each request
/// on `reloads` puts the TLS files in place again ([`reload`]).
pub async fn run(
    cfg: Config,
    stop: CancellationToken,
    reloads: Option<reload::Reloads>,
    ready: impl FnOnce(Bound),
) -> Result<(), StartError> {
    let tls = tls::load_own(&cfg.tls)?;
    let me = tls.identity().clone();
    let metrics = Arc::new(Metrics::new());
    metrics.certificate(tls.expiry());
    warn_if_expiring(tls.expiry(), &cfg.tls.cert);
    probe_devices(&cfg).await?;
    let (gw, credentials) = build(&cfg, metrics.clone())?;
    let endpoint = tls.server_endpoint(cfg.listen)?;
    let quic = endpoint.local_addr().unwrap_or(cfg.listen);
    if let Some(r) = reloads {
        let reloader = reload::Reloader::new(
            r.path,
            cfg.clone(),
            credentials,
            me.clone(),
            endpoint.clone(),
        );
        tokio::spawn(reload::serve(reloader, r.requests, metrics.clone()));
    }
    let http = match cfg.http_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Http { addr, source })?;
            let bound = l.local_addr().unwrap_or(addr);
            let (g, s) = (gw.clone(), stop.clone());
            tokio::spawn(async move {
                if let Err(e) = service::serve_http(l, g, s).await {
                    warn!(error = %e, "HTTP server stopped");
                }
            });
            Some(bound)
        }
        None => None,
    };
    info!(identity = %me, %quic, http = %protocol::telemetry::OrNone(&http), bmcs = cfg.bmcs.len(), "bmc-gateway listening");
    ready(Bound { quic, http });
    service::serve_quic(
        endpoint.clone(),
        gw.clone(),
        me.trust_domain.clone(),
        me.to_string(),
        stop,
    )
    .await;
    // Let in-flight answers go out, then close BMC sessions.
    let _ = tokio::time::timeout(Duration::from_secs(3), endpoint.wait_idle()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), gw.close()).await;
    info!("bmc-gateway stopped");
    Ok(())
}

/// `host:port` for a URL: an IPv6 address is bracketed (`[fd00::1]:443`).
fn authority(host: &str, port: u16) -> String {
    match host.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{host}]:{port}"),
        Err(_) => format!("{host}:{port}"),
    }
}

/// One row of `bmc-gateway check`.
#[derive(Debug, Clone)]
pub struct CheckRow {
    /// The machine.
    pub machine: String,
    /// `ipmi`, `redfish`, or the fence agent (`fence_ipmilan`, `fence_apc_snmp`, …).
    pub protocol: String,
    /// `host:port`, or for an outlet `level N: pdu outlet P (host:port)`.
    pub bmc: String,
    /// Power state (with the BMC's own word when it is not plainly on or off) or the error.
    pub result: Result<PowerReading, String>,
}

/// Reads every configured BMC's power state, concurrently, each within `timeout`.
pub async fn check(cfg: &Config, timeout: Duration) -> Vec<CheckRow> {
    let mut tasks = Vec::new();
    for b in &cfg.bmcs {
        let row = (b.machine.clone(), protocol_of(b), b.address());
        let levels = b.levels.clone();
        let machine = b.machine.clone();
        let b = b.clone();
        tasks.push((
            row,
            tokio::spawn(async move {
                let result = match password_of(&b).and_then(|pw| power_for(&b, pw)) {
                    Err(e) => Err(e.to_string()),
                    Ok(p) => {
                        let r = match tokio::time::timeout(timeout, p.power_reading()).await {
                            Ok(Ok(s)) => Ok(s),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
                        };
                        let _ = tokio::time::timeout(Duration::from_secs(3), p.close()).await;
                        r
                    }
                };
                CheckRow {
                    machine: b.machine.clone(),
                    protocol: protocol_of(&b),
                    bmc: b.address(),
                    result,
                }
            }),
        ));
        // Each outlet of the machine's lower levels, read through its PDU's agent.
        for (l, level) in levels.iter().enumerate() {
            for o in level.parsed() {
                let Some(p) = cfg.pdu(&o.pdu).cloned() else {
                    continue;
                };
                let row = (
                    machine.clone(),
                    p.agent.clone(),
                    format!(
                        "level {}: {} outlet {} ({})",
                        l + 2,
                        p.name,
                        o.plug,
                        pdu_address(&p)
                    ),
                );
                let r = row.clone();
                tasks.push((
                    row,
                    tokio::spawn(async move {
                        let result = match pdu_device(&p) {
                            Err(e) => Err(e.to_string()),
                            // The agent's own limit bounds the read; `timeout` too.
                            Ok((d, _)) => match tokio::time::timeout(timeout, d.status(Some(&o.plug))).await {
                                Ok(Ok(s)) => Ok(PowerReading::plain(s)),
                                Ok(Err(e)) => Err(format!("{e}; check pdu {} (host, password_file, options) and the outlet", p.name)),
                                Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
                            },
                        };
                        CheckRow {
                            machine: r.0,
                            protocol: r.1,
                            bmc: r.2,
                            result,
                        }
                    }),
                ));
            }
        }
    }
    let mut rows = Vec::new();
    for ((machine, protocol, bmc), t) in tasks {
        // A read that panicked left no row: the BMC vanished from the table (exit 0 when it
        // was the only failure) instead of being shown as failed.
        rows.push(t.await.unwrap_or_else(|e| CheckRow {
            machine,
            protocol,
            bmc,
            result: Err(format!("the gateway failed while reading this BMC: {e}")),
        }));
    }
    rows
}

/// What `check` shows as a BMC's protocol: the agent's name for a fence-agent BMC.
fn protocol_of(b: &BmcConfig) -> String {
    match (&b.agent, b.protocol) {
        (Some(a), BmcProtocol::FenceAgent) => a.name.clone(),
        _ => b.protocol.as_str().to_string(),
    }
}

fn pdu_address(p: &PduConfig) -> String {
    match p.port {
        Some(port) => format!("{}:{port}", p.host),
        None => p.host.clone(),
    }
}

/// Renders `check` rows as a table.
pub fn render_check(rows: &[CheckRow]) -> String {
    let mut out = Vec::new();
    out.push(["MACHINE", "PROTOCOL", "BMC", "POWER", "DETAIL"].map(String::from));
    for r in rows {
        let (power, detail) = match &r.result {
            Ok(r) => (
                match r.state {
                    PowerState::On => "on",
                    PowerState::Off => "off",
                    PowerState::Unknown => "unknown",
                }
                .to_string(),
                r.note.clone().unwrap_or_default(),
            ),
            Err(e) => ("ERROR".to_string(), e.clone()),
        };
        out.push([
            r.machine.clone(),
            r.protocol.to_string(),
            r.bmc.clone(),
            power,
            detail,
        ]);
    }
    let mut widths = [0usize; 5];
    for row in &out {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut s = String::new();
    for row in &out {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv6 BMC address made "fd00::1:443", which no URL parser reads as host and port.
    #[test]
    fn an_ipv6_bmc_address_is_bracketed_in_urls() {
        assert_eq!(authority("fd00::1", 443), "[fd00::1]:443");
        assert_eq!(authority("10.0.0.1", 443), "10.0.0.1:443");
        assert_eq!(authority("bmc-1.example", 8443), "bmc-1.example:8443");
    }

    #[test]
    fn check_table_aligns() {
        let t = render_check(&[
            CheckRow {
                machine: "10.0.0.1".into(),
                protocol: "ipmi".into(),
                bmc: "10.1.0.1:623".into(),
                result: Ok(PowerReading::plain(PowerState::On)),
            },
            CheckRow {
                machine: "10.0.0.22".into(),
                protocol: "redfish".into(),
                bmc: "10.1.0.22:443".into(),
                result: Err("refused".into()),
            },
            CheckRow {
                machine: "10.0.0.23".into(),
                protocol: "redfish".into(),
                bmc: "10.1.0.23:443".into(),
                result: Ok(redfish::read_power_state("PoweringOn")),
            },
        ]);
        assert_eq!(
            t,
            "MACHINE    PROTOCOL  BMC            POWER    DETAIL\n\
             10.0.0.1   ipmi      10.1.0.1:623   on\n\
             10.0.0.22  redfish   10.1.0.22:443  ERROR    refused\n\
             10.0.0.23  redfish   10.1.0.23:443  unknown  the BMC says PowerState \"PoweringOn\": \
             a power-on is under way; read again in a few seconds\n"
        );
    }
}
