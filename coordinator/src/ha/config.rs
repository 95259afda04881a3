//! `[ha]`: the leader election's settings, used when `[store] backend = "etcd"` lets several
//! coordinators share one store (with SQLite there is one coordinator and no election).
//!
//! - `lease_ttl`: how long the leader key outlives its holder's last answered keep-alive
//!   (default [`DEFAULT_LEASE_TTL`]).
//! - `advertise`: the address agents and `coordinatorctl` reach this coordinator at, written
//!   into the leader key so a standby can name the leader (default: the `listen` address
//!   when it names a host, else this host's name with its port).

use std::time::Duration;

use serde::Deserialize;

/// The default lease TTL: failover time against false step-downs. A dead leader is replaced
/// about one TTL after its last keep-alive, so shorter is faster; but the leader sends a
/// keep-alive every third of the TTL and steps down when none was answered for a whole TTL,
/// so the TTL must ride out what a healthy etcd does: an election among its members (1 s
/// election timeout by default, a few seconds when a member is slow), a slow fsync of a
/// loaded disk (seconds), and one request timeout (5 s by default). 10 s tolerates about
/// 6.6 s without an answer (two keep-alives lost) and gives a failover within about 12 s,
/// as Kubernetes' own leader election (15 s lease, 10 s renew deadline) sits in the same range.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The shortest TTL accepted: etcd raises shorter leases to its own minimum (1.5 times its
/// election timeout, 1.5 s by default), and a keep-alive every third of it must still fit
/// a round trip on a loaded host.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The longest TTL accepted: past two minutes a dead leader would stall repairs for longer
/// than an operator waits before acting by hand.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(120);

/// The `[ha]` section as written.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HaSection {
    /// The leader key's lease TTL.
    #[serde(default = "default_lease_ttl", with = "crate::duration")]
    pub lease_ttl: Duration,
    /// The address (`host:port`) agents and coordinatorctl reach this coordinator at.
    #[serde(default)]
    pub advertise: Option<String>,
}

impl Default for HaSection {
    fn default() -> Self {
        Self {
            lease_ttl: DEFAULT_LEASE_TTL,
            advertise: None,
        }
    }
}

fn default_lease_ttl() -> Duration {
    DEFAULT_LEASE_TTL
}

impl HaSection {
    /// What is wrong with the section, as (dotted key, message).
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.lease_ttl < MIN_LEASE_TTL || self.lease_ttl > MAX_LEASE_TTL {
            return Err((
                "ha.lease_ttl",
                format!(
                    "{:?} is outside {:?}..={:?}; the default is {:?}",
                    self.lease_ttl, MIN_LEASE_TTL, MAX_LEASE_TTL, DEFAULT_LEASE_TTL
                ),
            ));
        }
        if let Some(a) = &self.advertise {
            let ok = a
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err((
                    "ha.advertise",
                    format!("{a:?} is not HOST:PORT (e.g. \"coord1.example.net:7400\")"),
                ));
            }
        }
        Ok(())
    }

    /// The address to advertise: `advertise`, else `listen` when it names a host, else this
    /// host's name with `listen`'s port.
    pub fn advertised(&self, listen: std::net::SocketAddr) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        if !listen.ip().is_unspecified() {
            return listen.to_string();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        format!("{host}:{}", listen.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_out_of_range_or_a_bad_address_is_refused_naming_the_key() {
        let ok = HaSection::default();
        ok.validate().unwrap();
        let short = HaSection {
            lease_ttl: Duration::from_secs(1),
            ..ok.clone()
        };
        let (key, msg) = short.validate().unwrap_err();
        assert_eq!(key, "ha.lease_ttl");
        assert!(msg.contains("10s"), "{msg}");
        let bad = HaSection {
            advertise: Some("coord1".into()),
            ..ok.clone()
        };
        assert_eq!(bad.validate().unwrap_err().0, "ha.advertise");
        let listen: std::net::SocketAddr = "10.0.0.5:7400".parse().unwrap();
        assert_eq!(ok.advertised(listen), "10.0.0.5:7400");
        let any: std::net::SocketAddr = "0.0.0.0:7400".parse().unwrap();
        assert!(ok.advertised(any).ends_with(":7400"));
    }
}
