//! `[kdump]` in the coordinator configuration: how long a crash dump may take before power
//! actions go ahead without its "dump done", with overrides per machine type.
//!
//! This module parses and validates only; the registry ([`super::Kdumps`]) applies it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// Default `kdump_timeout`: writing a filtered dump of a few hundred GiB to local disk or
/// over the network takes minutes; ten covers the common host without leaving a wedged
/// dump kernel unfenced for long. Large-memory types override it.
pub const DEFAULT_KDUMP_TIMEOUT: Duration = Duration::from_secs(600);

/// `[kdump]` in the coordinator config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KdumpConfig {
    /// How long a dump may run (from its "dumping" notice) before power actions go ahead
    /// without its "dump done".
    #[serde(with = "crate::duration")]
    pub timeout: Duration,
    /// `timeout` per machine type, for types whose dumps take longer (or shorter).
    #[serde(deserialize_with = "durations")]
    pub timeout_by_machine_type: BTreeMap<String, Duration>,
}

impl Default for KdumpConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_KDUMP_TIMEOUT,
            timeout_by_machine_type: BTreeMap::new(),
        }
    }
}

fn durations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Duration>, D::Error> {
    let raw = BTreeMap::<String, String>::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            crate::duration::parse(&v)
                .map(|d| (k.clone(), d))
                .map_err(|e| serde::de::Error::custom(format!("machine type {k}: {e}")))
        })
        .collect()
}

impl KdumpConfig {
    /// Every limit above zero: a zero limit would let the power-off of a dumping machine go
    /// ahead at once, losing the dump the notice was sent to protect. Says which key.
    pub fn validate(&self) -> Result<(), String> {
        let zero = "must be greater than 0 (a zero limit powers a dumping machine off at once \
                    and loses its dump)";
        if self.timeout.is_zero() {
            return Err(format!("key `kdump.timeout`: {zero}"));
        }
        match self
            .timeout_by_machine_type
            .iter()
            .find(|(_, d)| d.is_zero())
        {
            Some((t, _)) => Err(format!("key `kdump.timeout_by_machine_type.{t}`: {zero}")),
            None => Ok(()),
        }
    }

    /// The dump time limit of a machine of type `machine_type`.
    pub fn timeout_for(&self, machine_type: Option<&str>) -> Duration {
        machine_type
            .and_then(|t| self.timeout_by_machine_type.get(t))
            .copied()
            .unwrap_or(self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_come_from_the_machine_type_or_the_default() {
        let cfg: KdumpConfig =
            toml::from_str("timeout = \"5m\"\n[timeout_by_machine_type]\nbig-mem = \"45m\"\n")
                .unwrap();
        assert_eq!(cfg.timeout_for(Some("big-mem")), Duration::from_secs(2700));
        assert_eq!(cfg.timeout_for(Some("qemu")), Duration::from_secs(300));
        assert_eq!(cfg.timeout_for(None), Duration::from_secs(300));
        assert_eq!(KdumpConfig::default().timeout, DEFAULT_KDUMP_TIMEOUT);
        let e =
            toml::from_str::<KdumpConfig>("[timeout_by_machine_type]\nx = \"soon\"\n").unwrap_err();
        // A zero limit was accepted: every dump then lost to a power-off at once.
        for (text, key) in [
            ("timeout = \"0s\"\n", "`kdump.timeout`"),
            (
                "[timeout_by_machine_type]\nbig-mem = \"0s\"\n",
                "`kdump.timeout_by_machine_type.big-mem`",
            ),
        ] {
            let e = toml::from_str::<KdumpConfig>(text)
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(e.contains(key), "{e}");
        }
        assert_eq!(KdumpConfig::default().validate(), Ok(()));
        assert!(e.to_string().contains("machine type x"), "{e}");
        assert!(toml::from_str::<KdumpConfig>("wait = \"1m\"\n").is_err());
    }

    #[test]
    fn the_coordinator_config_carries_a_kdump_section_with_defaults() {
        let base = "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
        let path = std::path::Path::new("c.toml");
        let c = crate::config::Config::parse(base, path).unwrap();
        assert_eq!(c.kdump, KdumpConfig::default());
        let text = format!(
            "{base}[kdump]\ntimeout = \"20m\"\n[kdump.timeout_by_machine_type]\nbig-mem = \"45m\"\n"
        );
        let c = crate::config::Config::parse(&text, path).unwrap();
        assert_eq!(
            c.kdump.timeout_for(Some("big-mem")),
            Duration::from_secs(2700)
        );
        assert_eq!(c.kdump.timeout_for(Some("qemu")), Duration::from_secs(1200));
        let e = crate::config::Config::parse(&format!("{base}[kdump]\ntimeout = 600\n"), path)
            .unwrap_err();
        assert!(e.to_string().contains("no unit"), "{e}");
    }
}
