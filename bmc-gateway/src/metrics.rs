//! The gateway's Prometheus metrics, rendered in the text exposition format: actions by
//! protocol, action and result with a duration histogram, refused connections, and per-BMC
//! reachability (with refused credentials told apart). No metrics library: the few series here are cheaper to keep by hand than a
//! dependency. This module does not serve HTTP (see [`crate::http`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket upper bounds in seconds.
///
/// From 10 ms (a warm IPMI status read) to 2 min (a fence waiting out a slow BMC): every action
/// the gateway runs lands in a bucket that tells them apart.
pub const BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 15.0, 60.0, 120.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// What a BMC's last request said about reaching it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The BMC answered (even with an error about the request itself).
    Up,
    /// The BMC did not answer, or could not be reached at all.
    Down,
    /// The BMC answered but refused the gateway's credentials: no action can run on it, so
    /// it counts as not reachable, and `fleetmend_gateway_bmc_credentials_refused` says why.
    CredentialsRefused,
}

#[derive(Debug, Default)]
struct Inner {
    /// (protocol, action, result) → durations.
    actions: BTreeMap<(String, String, String), Histogram>,
    /// machine → (protocol, what its last request said).
    reachable: BTreeMap<String, (String, Reach)>,
    /// Connections refused, by reason.
    refused: BTreeMap<String, u64>,
    /// Power requests refused for an older fencing epoch, by store identity.
    older_epoch: BTreeMap<String, u64>,
    /// When the gateway's certificate and its CA expire, as loaded at start or reload.
    expiry: Option<protocol::transport::Expiry>,
}

/// All gateway metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one finished action.
    pub fn action(&self, protocol: &str, action: &str, ok: bool, took: Duration) {
        let mut g = self.inner.lock().expect("not poisoned");
        let h = g
            .actions
            .entry((
                protocol.to_string(),
                action.to_string(),
                if ok { "ok" } else { "failed" }.to_string(),
            ))
            .or_default();
        let secs = took.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// Records what a BMC's last request said about reaching it; returns what the one before
    /// said (`None` for the first), so a caller can log changes only.
    pub fn reachable(&self, machine: &str, protocol: &str, reach: Reach) -> Option<Reach> {
        self.inner
            .lock()
            .expect("not poisoned")
            .reachable
            .insert(machine.to_string(), (protocol.to_string(), reach))
            .map(|(_, before)| before)
    }

    /// Notes when the certificate in use and its CA expire (at start and at each reload).
    pub fn certificate(&self, expiry: protocol::transport::Expiry) {
        self.inner.lock().expect("not poisoned").expiry = Some(expiry);
    }

    /// Counts a refused connection.
    pub fn refused(&self, reason: &str) {
        *self
            .inner
            .lock()
            .expect("not poisoned")
            .refused
            .entry(reason.to_string())
            .or_default() += 1;
    }

    /// Counts a power request refused because its fencing epoch is older than one seen for
    /// its store.
    pub fn refused_older_epoch(&self, store: &str) {
        *self
            .inner
            .lock()
            .expect("not poisoned")
            .older_epoch
            .entry(store.to_string())
            .or_default() += 1;
    }

    /// Renders the Prometheus text format.
    pub fn render(&self) -> String {
        let g = self.inner.lock().expect("not poisoned");
        let mut out = String::new();
        out.push_str("# HELP fleetmend_gateway_action_duration_seconds Power actions by protocol, action and result.\n");
        out.push_str("# TYPE fleetmend_gateway_action_duration_seconds histogram\n");
        for ((p, a, r), h) in &g.actions {
            let labels = format!("protocol=\"{p}\",action=\"{a}\",result=\"{r}\"");
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "fleetmend_gateway_action_duration_seconds_bucket{{{labels},le=\"{le}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "fleetmend_gateway_action_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "fleetmend_gateway_action_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "fleetmend_gateway_action_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        out.push_str(
            "# HELP fleetmend_gateway_bmc_reachable 1 when the BMC answered its last request and accepted the credentials.\n",
        );
        out.push_str("# TYPE fleetmend_gateway_bmc_reachable gauge\n");
        for (m, (p, reach)) in &g.reachable {
            let _ = writeln!(
                out,
                "fleetmend_gateway_bmc_reachable{{machine=\"{}\",protocol=\"{p}\"}} {}",
                escape(m),
                u8::from(*reach == Reach::Up)
            );
        }
        out.push_str(
            "# HELP fleetmend_gateway_bmc_credentials_refused 1 when the BMC refused the gateway's credentials on its last request.\n",
        );
        out.push_str("# TYPE fleetmend_gateway_bmc_credentials_refused gauge\n");
        for (m, (p, reach)) in &g.reachable {
            let _ = writeln!(
                out,
                "fleetmend_gateway_bmc_credentials_refused{{machine=\"{}\",protocol=\"{p}\"}} {}",
                escape(m),
                u8::from(*reach == Reach::CredentialsRefused)
            );
        }
        out.push_str(
            "# HELP fleetmend_gateway_connections_refused_total Connections refused, by reason.\n",
        );
        out.push_str("# TYPE fleetmend_gateway_connections_refused_total counter\n");
        for (r, n) in &g.refused {
            let _ = writeln!(
                out,
                "fleetmend_gateway_connections_refused_total{{reason=\"{}\"}} {n}",
                escape(r)
            );
        }
        out.push_str(
            "# HELP fleetmend_gateway_requests_refused_older_epoch_total Power requests refused because a newer coordinator of the same store had spoken: their fencing epoch was older than one seen.\n",
        );
        out.push_str("# TYPE fleetmend_gateway_requests_refused_older_epoch_total counter\n");
        for (store, n) in &g.older_epoch {
            let _ = writeln!(
                out,
                "fleetmend_gateway_requests_refused_older_epoch_total{{store=\"{}\"}} {n}",
                escape(store)
            );
        }
        if let Some(e) = g.expiry {
            e.render_metric(
                &mut out,
                "fleetmend_gateway_certificate_expiry_timestamp_seconds",
                "When the gateway's certificate and its fleet CA expire (notAfter).",
                "gateway",
            );
        }
        protocol::process_metrics::render_into(&mut out);
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histogram_and_gauges() {
        let m = Metrics::new();
        m.action("ipmi", "status", true, Duration::from_millis(20));
        m.action("ipmi", "status", true, Duration::from_secs(2));
        assert_eq!(m.reachable("10.0.0.1", "ipmi", Reach::Up), None);
        m.reachable("10.0.0.2", "redfish", Reach::Down);
        m.reachable("10.0.0.3", "ipmi", Reach::Up);
        assert_eq!(
            m.reachable("10.0.0.3", "ipmi", Reach::CredentialsRefused),
            Some(Reach::Up)
        );
        m.refused("not-a-coordinator");
        assert!(
            !m.render().contains("certificate_expiry"),
            "nothing before it is known"
        );
        m.certificate(protocol::transport::Expiry {
            certificate: 1_800_000_000,
            ca: 2_000_000_000,
        });
        let t = m.render();
        assert!(t.contains("fleetmend_gateway_certificate_expiry_timestamp_seconds{certificate=\"gateway\"} 1800000000\n"), "{t}");
        assert!(t.contains("fleetmend_gateway_certificate_expiry_timestamp_seconds{certificate=\"ca\"} 2000000000\n"), "{t}");
        assert!(t.contains("fleetmend_gateway_action_duration_seconds_bucket{protocol=\"ipmi\",action=\"status\",result=\"ok\",le=\"0.025\"} 1\n"), "{t}");
        assert!(t.contains("fleetmend_gateway_action_duration_seconds_bucket{protocol=\"ipmi\",action=\"status\",result=\"ok\",le=\"5\"} 2\n"), "{t}");
        assert!(t.contains("fleetmend_gateway_action_duration_seconds_count{protocol=\"ipmi\",action=\"status\",result=\"ok\"} 2\n"), "{t}");
        assert!(
            t.contains(
                "fleetmend_gateway_bmc_reachable{machine=\"10.0.0.2\",protocol=\"redfish\"} 0\n"
            ),
            "{t}"
        );
        for line in [
            "fleetmend_gateway_bmc_reachable{machine=\"10.0.0.1\",protocol=\"ipmi\"} 1\n",
            "fleetmend_gateway_bmc_credentials_refused{machine=\"10.0.0.1\",protocol=\"ipmi\"} 0\n",
            "fleetmend_gateway_bmc_credentials_refused{machine=\"10.0.0.2\",protocol=\"redfish\"} 0\n",
            "fleetmend_gateway_bmc_reachable{machine=\"10.0.0.3\",protocol=\"ipmi\"} 0\n",
            "fleetmend_gateway_bmc_credentials_refused{machine=\"10.0.0.3\",protocol=\"ipmi\"} 1\n",
        ] {
            assert!(t.contains(line), "no {line} in {t}");
        }
        assert!(
            t.contains(
                "fleetmend_gateway_connections_refused_total{reason=\"not-a-coordinator\"} 1\n"
            ),
            "{t}"
        );
    }
}
