//! `[gateways]` in the coordinator configuration: the rack BMC gateways that carry out power
//! actions, and the rules their `[[gateways.targets]]` entries must follow.
//!
//! This module parses and validates only; [`super::QuicGateways`] connects to them.

use serde::Deserialize;

/// `[gateways]`: the rack BMC gateways that carry out power actions, each as a
/// `[[gateways.targets]]` table (name, address, server_name, racks, machines). A machine is
/// routed to the gateway listing its address, else to the one serving its inventory rack.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaysSection {
    /// The gateways.
    #[serde(default)]
    pub targets: Vec<crate::gateway::GatewayTarget>,
}

impl GatewaysSection {
    /// Every target has a unique, non-empty name, a server name its certificate can match,
    /// IP addresses for machines and no empty rack. The error names the key
    /// (`gateways.targets[N].KEY`).
    pub(crate) fn validate(&self) -> Result<(), String> {
        let targets = &self.targets[..];
        for (i, t) in targets.iter().enumerate() {
            let key = |k: &str| format!("gateways.targets[{i}].{k}");
            let bad = |k: &str, message: String| format!("key `{}`: {message}", key(k));
            if t.name.trim().is_empty() {
                return Err(bad(
                    "name",
                    "must not be empty (it names the gateway in logs and in [fence.gateways])"
                        .into(),
                ));
            }
            if targets[..i].iter().any(|o| o.name == t.name) {
                return Err(bad("name", format!("{:?} names two gateways", t.name)));
            }
            if rustls::pki_types::ServerName::try_from(t.server_name.as_str()).is_err() {
                return Err(bad(
                    "server_name",
                    format!(
                        "{:?} is not a DNS name or IP address (it must match a name in the gateway's certificate)",
                        t.server_name
                    ),
                ));
            }
            if let Some(m) = t
                .machines
                .iter()
                .find(|m| m.parse::<std::net::IpAddr>().is_err())
            {
                return Err(bad("machines", format!("{m:?} is not an IP address")));
            }
            if t.racks.iter().any(|r| r.trim().is_empty()) {
                return Err(bad("racks", "a rack name must not be empty".into()));
            }
        }
        Ok(())
    }
}
