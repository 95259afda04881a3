//! The coordinator's configuration file (TOML).
//!
//! Unknown keys are an error naming the key, never silently ignored. Durations are strings
//! in jiff's friendly (`"5s"`, `"1m 30s"`) or ISO 8601 (`"PT5S"`) format. Sections other
//! areas own (`[repair]`, `[kubernetes]`, `[gateways]`) are optional and grow additively.
//!
//! This module only parses and validates; it opens no file other than the config itself and
//! binds nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::SignedDuration;
use serde::Deserialize;

/// Where the config is read from when neither `--config` nor `FLEETMEND_COORDINATOR_CONFIG` says.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/fleetmend/coordinator.toml";

pub use crate::health::{DEFAULT_GOODBYE_GRACE, DEFAULT_GRACE_INTERVALS, DEFAULT_REPORT_INTERVAL};

/// How long the coordinator waits for open connections to finish on SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a wrong, missing or unknown key (the message
    /// names it).
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key and position.
        message: String,
    },
    /// A value is present but unusable.
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// Never: a config must be fixed by a person.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// The whole coordinator config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This coordinator's name, for logs and hello replies. Defaults to the name in its
    /// certificate.
    #[serde(default)]
    pub name: Option<String>,
    /// QUIC address agents and coordinatorctl connect to.
    pub listen: SocketAddr,
    /// SQLite database file.
    pub database: PathBuf,
    /// Inventory file (TOML, or YAML when it ends in `.yaml`/`.yml`) loaded at start.
    #[serde(default)]
    pub inventory: Option<PathBuf>,
    /// How long to wait for connections to drain on SIGTERM.
    #[serde(default = "default_shutdown_grace", with = "duration")]
    pub shutdown_grace: Duration,
    /// TLS files.
    pub tls: TlsSection,
    /// The plain-HTTP `/metrics` and `/healthz` listener.
    #[serde(default)]
    pub http: HttpSection,
    /// Health derivation.
    #[serde(default)]
    pub health: HealthSection,
    /// Repair queue (owned by the repair area).
    #[serde(default)]
    pub repair: Option<RepairSection>,
    /// Kubernetes (owned by the Kubernetes area).
    #[serde(default)]
    pub kubernetes: Option<KubernetesSection>,
    /// BMC gateways (owned by the gateway area).
    #[serde(default)]
    pub gateways: Option<GatewaysSection>,
    /// Automatic remediation (owned by the remediation area). Absent: no remediation loop
    /// runs and nothing is enqueued by itself; present (even empty): the loop runs with the
    /// defaults of [`crate::remediation::RemediationConfig`].
    #[serde(default)]
    pub remediation: Option<crate::remediation::RemediationConfig>,
    /// Crash dumps (owned by the kdump area): how long a dump may take, per machine type.
    #[serde(default)]
    pub kdump: crate::kdump::KdumpConfig,
}

/// `[tls]`: the coordinator's certificate, key and the fleet CA.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Fleet CA certificate (PEM).
    pub ca: PathBuf,
    /// The coordinator's certificate (PEM), role `coordinator`.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// `[http]`: metrics and health endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Listen address; unset disables the endpoint.
    #[serde(default = "default_http_listen")]
    pub listen: Option<SocketAddr>,
}

impl Default for HttpSection {
    fn default() -> Self {
        Self {
            listen: default_http_listen(),
        }
    }
}

/// `[health]`: how reports become states.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    /// How often agents report (should match their `report_interval`).
    #[serde(default = "default_report_interval", with = "duration")]
    pub report_interval: Duration,
    /// Silence after which a machine is unreachable; default 3 report intervals.
    #[serde(default, with = "opt_duration")]
    pub unreachable_grace: Option<Duration>,
    /// Silence after a goodbye after which a machine is unreachable after all.
    #[serde(default = "default_goodbye_grace", with = "duration")]
    pub goodbye_grace: Duration,
}

impl Default for HealthSection {
    fn default() -> Self {
        Self {
            report_interval: DEFAULT_REPORT_INTERVAL,
            unreachable_grace: None,
            goodbye_grace: DEFAULT_GOODBYE_GRACE,
        }
    }
}

impl HealthSection {
    /// The effective health settings.
    pub fn resolved(&self) -> crate::health::HealthConfig {
        crate::health::HealthConfig {
            report_interval: self.report_interval,
            unreachable_grace: self
                .unreachable_grace
                .unwrap_or(self.report_interval * DEFAULT_GRACE_INTERVALS),
            goodbye_grace: self.goodbye_grace,
        }
    }
}

/// `[repair]`: the repair queue's own configuration file (CKE `repair:` YAML).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairSection {
    /// Path of the repair configuration file.
    #[serde(default)]
    pub config: Option<PathBuf>,
}

/// `[kubernetes]`: the cluster the coordinator drains through; its keys are documented on
/// [`crate::k8s::KubernetesConfig`] (owned by the Kubernetes area).
pub type KubernetesSection = crate::k8s::KubernetesConfig;

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

fn default_shutdown_grace() -> Duration {
    DEFAULT_SHUTDOWN_GRACE
}
fn default_http_listen() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
}
fn default_report_interval() -> Duration {
    DEFAULT_REPORT_INTERVAL
}
fn default_goodbye_grace() -> Duration {
    DEFAULT_GOODBYE_GRACE
}

/// Serde helpers for durations written as strings (`"5s"`, `"PT5S"`).
pub mod duration {
    use super::*;

    /// Parses a non-negative duration string. A bare number is refused: its unit would be
    /// a guess.
    pub fn parse(s: &str) -> Result<Duration, String> {
        if !s.trim().is_empty() && s.trim().parse::<f64>().is_ok() {
            return Err(bare_number(s.trim()));
        }
        let d: SignedDuration = s
            .parse()
            .map_err(|e| format!("{s:?} is not a duration like \"5s\" or \"1m 30s\": {e}"))?;
        Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
    }

    /// The error for a duration written without a unit.
    pub fn bare_number(n: &str) -> String {
        format!(
            "{n} has no unit: durations are strings with a unit, like \"{n}s\", \"{n}ms\" or \"{n}m\""
        )
    }

    /// A duration as written in a file: a string, or (refused with a clear message) a
    /// number.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Int(i64),
        Float(f64),
    }

    /// Deserializes a duration string; a bare number is an error saying to add a unit.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Written::deserialize(d)? {
            Written::Text(s) => parse(&s).map_err(serde::de::Error::custom),
            Written::Int(n) => Err(serde::de::Error::custom(bare_number(&n.to_string()))),
            Written::Float(n) => Err(serde::de::Error::custom(bare_number(&n.to_string()))),
        }
    }
}

/// Serde helpers for optional duration strings.
pub mod opt_duration {
    use super::*;

    /// Deserializes an optional duration string.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(d).map(Some)
    }
}

impl Config {
    /// Parses a config from TOML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message: message.to_string(),
        };
        if self.health.report_interval.is_zero() {
            return Err(invalid("health.report_interval", "must be greater than 0"));
        }
        let h = self.health.resolved();
        if h.unreachable_grace < h.report_interval {
            return Err(invalid(
                "health.unreachable_grace",
                "must be at least one report interval, or every machine would flap to unreachable",
            ));
        }
        if let Some(r) = &self.remediation {
            r.validate().map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
        if let Some(name) = &self.name {
            protocol::identity::validate_name("name", name)
                .map_err(|e| invalid("name", &e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
listen = "127.0.0.1:7443"
database = "/tmp/c.db"
[tls]
ca = "ca.crt"
cert = "c.crt"
key = "c.key"
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL, Path::new("c.toml")).unwrap();
        let h = c.health.resolved();
        assert_eq!(h.report_interval, Duration::from_secs(5));
        assert_eq!(h.unreachable_grace, Duration::from_secs(15));
        assert_eq!(c.http.listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(c.inventory.is_none());
    }

    #[test]
    fn durations_parse_in_friendly_form() {
        let text = format!(
            "{MINIMAL}\n[health]\nreport_interval = \"250ms\"\nunreachable_grace = \"1s\"\n"
        );
        let c = Config::parse(&text, Path::new("c.toml")).unwrap();
        let h = c.health.resolved();
        assert_eq!(h.report_interval, Duration::from_millis(250));
        assert_eq!(h.unreachable_grace, Duration::from_secs(1));
    }

    #[test]
    fn bare_numbers_are_refused_asking_for_a_unit() {
        for v in ["30", "\"30\"", "1.5"] {
            let text = format!("shutdown_grace = {v}\n{MINIMAL}");
            let e = Config::parse(&text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("has no unit"), "{v}: {e}");
            assert!(e.contains("s\""), "suggests a unit: {e}");
        }
        let text = format!("{MINIMAL}\n[health]\nunreachable_grace = 20\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no unit"), "{e}");
    }

    #[test]
    fn unknown_key_is_named() {
        let text = format!("{MINIMAL}\n[health]\nreport_intervall = \"1s\"\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("report_intervall"), "{e}");
    }

    #[test]
    fn missing_key_is_named() {
        let e = Config::parse("database = \"x\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen"), "{e}");
    }

    #[test]
    fn remediation_section_is_optional_and_validated() {
        let c = Config::parse(MINIMAL, Path::new("c.toml")).unwrap();
        assert!(c.remediation.is_none());
        let text = format!("{MINIMAL}\n[remediation]\ninterval = \"2s\"\n");
        let c = Config::parse(&text, Path::new("c.toml")).unwrap();
        assert_eq!(c.remediation.unwrap().interval, Duration::from_secs(2));
        let text = format!("{MINIMAL}\n[remediation.limits.rate]\nper_hour = 0\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remediation.limits.rate.per_hour"), "{e}");
        let text = format!("{MINIMAL}\n[remediation]\nintervall = \"2s\"\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("intervall"), "{e}");
    }

    #[test]
    fn grace_shorter_than_interval_is_refused() {
        let text =
            format!("{MINIMAL}\n[health]\nreport_interval = \"2s\"\nunreachable_grace = \"1s\"\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("health.unreachable_grace"), "{e}");
    }
}
