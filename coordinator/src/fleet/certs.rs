//! The agents' certificates as presented at their hellos: when each expires, for the
//! metrics that the "agent certificates expire soon" alert reads. Memory only: after a
//! restart every agent presents its certificate again as it reconnects.

use crate::health::MachineState;

use super::Fleet;

/// The agents' certificates, as last presented, of machines not retired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentCertificates {
    /// Machines whose agent's certificate is known.
    pub known: usize,
    /// The first of them to expire, seconds since the Unix epoch.
    pub earliest: Option<i64>,
    /// How many expire before the given time (or have expired).
    pub expiring: usize,
}

impl Fleet {
    /// Notes when the certificate the agent of `hostname` connected with expires.
    pub fn note_certificate(&self, hostname: &str, not_after: i64) {
        if let Some(e) = self.lock().by_hostname_mut(hostname) {
            e.live.cert_not_after = Some(not_after);
        }
    }

    /// The machines not retired whose agent's certificate expires before `before` (seconds
    /// since the Unix epoch): hostname and `notAfter`, soonest first.
    pub fn expiring_agents(&self, before: i64) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = self
            .lock()
            .machines
            .values()
            .filter(|e| e.state != MachineState::Retired)
            .filter_map(|e| {
                let t = e.live.cert_not_after?;
                (t < before).then(|| (e.record.hostname.clone(), t))
            })
            .collect();
        out.sort_by_key(|(h, t)| (*t, h.clone()));
        out
    }

    /// The agents' certificates of machines not retired; `expiring` counts those whose
    /// `notAfter` is before `before` (seconds since the Unix epoch).
    pub fn agent_certificates(&self, before: i64) -> AgentCertificates {
        let mut out = AgentCertificates::default();
        for e in self.lock().machines.values() {
            let Some(t) = e.live.cert_not_after else {
                continue;
            };
            if e.state == MachineState::Retired {
                continue;
            }
            out.known += 1;
            out.earliest = Some(out.earliest.map_or(t, |x| x.min(t)));
            out.expiring += usize::from(t < before);
        }
        out
    }
}
