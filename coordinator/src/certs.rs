//! When the coordinator's own certificate and the fleet CA expire, and the agents'
//! certificates as they connect ([`crate::fleet::Fleet::agent_certificates`]): said in the log
//! at start and exported on `/metrics` for the "expires soon" alerts.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use protocol::identity::Identity;
use protocol::transport::{EXPIRY_WARNING, Expiry, TlsFiles, TlsMaterial, unix_now};
use tokio_util::sync::CancellationToken;

use crate::fleet::Fleet;
use crate::gateway::SharedTls;
use crate::metrics::MetricsSource;

/// Logs a warning when the coordinator's certificate or the CA expires within
/// [`EXPIRY_WARNING`] (or has expired).
pub fn warn_if_expiring(expiry: Expiry, cert: &std::path::Path) {
    if let Some(w) = expiry.warning(unix_now()) {
        tracing::warn!(
            certificate = %cert.display(),
            "{w}: issue a new one (`coordinatorctl pki issue --role coordinator`), install it and reload the coordinator (`systemctl reload coordinator`); past it agents, gateways and coordinatorctl refuse this coordinator"
        );
    }
}

/// Warns when an agent connects with a certificate that expires within [`EXPIRY_WARNING`]
/// (or has expired), at most once a minute: after a restart or a network blip a whole fleet
/// reconnects at once, and its certificates were often issued together. The lines not
/// written are counted into the next one; the daily list names every machine.
pub fn agent_connected(hostname: &str, address: &str, not_after: i64) {
    static LIMIT: std::sync::Mutex<OncePerMinute> = std::sync::Mutex::new(OncePerMinute {
        last: None,
        held_back: 0,
    });
    let now = unix_now();
    if !protocol::transport::expiry::soon(not_after, now) {
        return;
    }
    let admitted = LIMIT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .admit(std::time::Instant::now());
    let more = match admitted {
        None => return,
        Some(0) => String::new(),
        Some(n) => format!(
            " ({n} more agents connected with certificates that expire soon since the last such line; the daily list and fleetmend_agent_certificates_expiring count them)"
        ),
    };
    tracing::warn!(
        machine = %address,
        expires = %protocol::transport::expiry_date(not_after),
        "the agent's certificate expires {}: issue a new one (`coordinatorctl pki issue --role node --name {hostname}`) and install it on the machine{more}",
        protocol::transport::expiry_distance(not_after, now)
    );
}

/// One line a minute: the others are counted into the next.
struct OncePerMinute {
    last: Option<std::time::Instant>,
    held_back: u64,
}

impl OncePerMinute {
    /// `Some(lines held back since the last one)` when a line may be written at `now`.
    fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

/// How many machines a warning names; the rest are counted.
const NAMED: usize = 20;

/// `n1 in 12 days, n2 3 days ago and 4 more`: the machines of `expiring` (soonest first).
pub fn expiring_line(expiring: &[(String, i64)], now: i64) -> String {
    let mut line = expiring
        .iter()
        .take(NAMED)
        .map(|(h, t)| format!("{h} {}", protocol::transport::expiry_distance(*t, now)))
        .collect::<Vec<_>>()
        .join(", ");
    if expiring.len() > NAMED {
        line.push_str(&format!(" and {} more", expiring.len() - NAMED));
    }
    line
}

/// Names the machines whose agent's certificate expires within [`EXPIRY_WARNING`], a minute
/// after the start (once the agents have reconnected and presented theirs) and then daily:
/// an agent stays connected for months, so the warning at its connection is not enough.
pub async fn watch_agent_certificates(fleet: Arc<Fleet>, shutdown: CancellationToken) {
    let mut wait = Duration::from_secs(60);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = Duration::from_secs(24 * 3600);
        let now = unix_now();
        let expiring = fleet.expiring_agents(now + EXPIRY_WARNING.as_secs() as i64);
        if !expiring.is_empty() {
            tracing::warn!(
                count = expiring.len(),
                machines = %expiring_line(&expiring, now),
                "agent certificates expire within 30 days (or have expired): issue new ones (`coordinatorctl pki issue --role node --name HOSTNAME`), install them and reload the agents (`systemctl reload node-agent`)"
            );
        }
    }
}

/// The certificate series of `/metrics`: the coordinator's own and its CA's expiry, and the
/// agents' certificates as last presented.
pub struct CertificateMetrics {
    own: std::sync::Mutex<Expiry>,
    fleet: Arc<Fleet>,
}

impl CertificateMetrics {
    /// Series for `own` and the agents of `fleet`.
    pub fn new(own: Expiry, fleet: Arc<Fleet>) -> Arc<Self> {
        Arc::new(Self {
            own: std::sync::Mutex::new(own),
            fleet,
        })
    }

    fn own(&self) -> Expiry {
        *self.own.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Puts renewed TLS files in place on SIGHUP, without a restart (which would stop running
/// repair commands): the QUIC endpoint presents the new certificate to connections opened
/// from then on (agents, `coordinatorctl`, kdump notices), and so do new connections to the
/// gateways; open connections keep theirs. Only the files the running configuration names
/// are read again, not the configuration. Files that do not load, a certificate that does
/// not chain to the CA, or one naming another identity are refused, and the running ones
/// stay.
///
/// The endpoint's connection-id and reset keys stay those derived from the key at start
/// ([`protocol::transport::TlsMaterial::server_endpoint`]): after a renewal, the next restart
/// cannot reset the connections of this run at once, and agents find it by their timeout.
pub struct TlsReloader {
    files: TlsFiles,
    identity: Identity,
    endpoint: quinn::Endpoint,
    shared: SharedTls,
    metrics: Arc<CertificateMetrics>,
}

impl TlsReloader {
    /// A reloader of `files` for the coordinator running as `identity` on `endpoint`.
    pub fn new(
        files: TlsFiles,
        identity: Identity,
        endpoint: quinn::Endpoint,
        shared: SharedTls,
        metrics: Arc<CertificateMetrics>,
    ) -> Self {
        Self {
            files,
            identity,
            endpoint,
            shared,
            metrics,
        }
    }

    /// Reads the TLS files again and puts them in place; the error says why they were not.
    pub fn reload(&self) -> Result<Expiry, String> {
        let tls = TlsMaterial::load(&self.files).map_err(|e| e.to_string())?;
        if tls.identity() != &self.identity {
            return Err(format!(
                "{} now names {}, but this coordinator runs as {}; restart it to change its identity",
                self.files.cert.display(),
                tls.identity(),
                self.identity
            ));
        }
        tls.check_own_chain(&self.files.cert, &self.files.ca, "tls.ca")
            .map_err(|e| e.to_string())?;
        let server = tls.quinn_server_config().map_err(|e| e.to_string())?;
        self.endpoint.set_server_config(Some(server));
        let expiry = tls.expiry();
        *self.shared.write().unwrap_or_else(|p| p.into_inner()) = tls;
        *self.metrics.own.lock().unwrap_or_else(|p| p.into_inner()) = expiry;
        warn_if_expiring(expiry, &self.files.cert);
        Ok(expiry)
    }
}

impl MetricsSource for CertificateMetrics {
    fn render(&self, out: &mut String) {
        self.own().render_metric(
            out,
            "fleetmend_certificate_expiry_timestamp_seconds",
            "When the coordinator's certificate and its fleet CA expire (notAfter).",
            "coordinator",
        );
        let soon = unix_now() + EXPIRY_WARNING.as_secs() as i64;
        let agents = self.fleet.agent_certificates(soon);
        let _ = writeln!(
            out,
            "# HELP fleetmend_agent_certificates_expiring Machines (not retired) whose agent's certificate, as last presented, expires within 30 days or has expired.\n\
             # TYPE fleetmend_agent_certificates_expiring gauge\n\
             fleetmend_agent_certificates_expiring {}\n\
             # HELP fleetmend_agent_certificates_known Machines (not retired) whose agent's certificate was presented since the coordinator started.\n\
             # TYPE fleetmend_agent_certificates_known gauge\n\
             fleetmend_agent_certificates_known {}",
            agents.expiring, agents.known
        );
        // Declared always, with a sample once an agent presented its certificate.
        let _ = writeln!(
            out,
            "# HELP fleetmend_agent_certificate_expiry_earliest_timestamp_seconds When the first of the agents' certificates expires (notAfter).\n\
             # TYPE fleetmend_agent_certificate_expiry_earliest_timestamp_seconds gauge"
        );
        if let Some(t) = agents.earliest {
            let _ = writeln!(
                out,
                "fleetmend_agent_certificate_expiry_earliest_timestamp_seconds {t}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_warnings_are_written_once_a_minute_and_count_the_rest() {
        let mut limit = OncePerMinute {
            last: None,
            held_back: 0,
        };
        let t0 = std::time::Instant::now();
        assert_eq!(limit.admit(t0), Some(0));
        assert_eq!(limit.admit(t0 + Duration::from_secs(1)), None);
        assert_eq!(limit.admit(t0 + Duration::from_secs(59)), None);
        assert_eq!(limit.admit(t0 + Duration::from_secs(60)), Some(2));
        assert_eq!(limit.admit(t0 + Duration::from_secs(200)), Some(0));
    }

    #[test]
    fn a_warning_names_the_first_machines_and_counts_the_rest() {
        let now = 1_800_000_000;
        let list: Vec<(String, i64)> = (0..23)
            .map(|i| {
                (
                    format!("n{i}"),
                    now + i64::from(i) * 86_400 * 2 - 86_400 * 4,
                )
            })
            .collect();
        let line = expiring_line(&list, now);
        assert!(
            line.starts_with("n0 4 days ago, n1 2 days ago, n2 in 0 minutes, n3 in 2 days"),
            "{line}"
        );
        assert!(line.ends_with("n19 in 34 days and 3 more"), "{line}");
    }
}
