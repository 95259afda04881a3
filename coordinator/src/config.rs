//! The coordinator's configuration file (TOML).
//!
//! Unknown keys are an error naming the key, never silently ignored. Durations are strings
//! in jiff's friendly (`"5s"`, `"1m 30s"`) or ISO 8601 (`"PT5S"`) format. Sections other
//! areas own (`[repair]`, `[kubernetes]`, `[gateways]`) are optional and grow additively.
//!
//! Each area's section is a type of its own, parsed and checked beside the code that uses it
//! (`fence::config`, `gateway::config`, `health::config`, `k8s::config`, `kdump::config`,
//! `remediation::config`; durations through [`crate::duration`]). This module assembles
//! them into [`Config`] and checks what spans sections (a `[fence.gateways.NAME]` names a
//! configured gateway) and every duration's range; no area imports it.
//!
//! This module only parses and validates; it opens no file other than the config itself and
//! binds nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Where the config is read from when neither `--config` nor `FLEETMEND_COORDINATOR_CONFIG` says.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/fleetmend/coordinator.toml";

mod ranges;

pub use crate::duration;
pub use crate::duration::opt as opt_duration;
pub use crate::fence::config::{FenceOverride, FenceSection};
pub use crate::gateway::config::GatewaysSection;
pub use crate::health::config::HealthSection;
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
    /// SQLite database file (the store when `[store] backend` is `sqlite`, the default).
    #[serde(default)]
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
    /// The fence flow's time limits (per BMC: by machine type or gateway) and `keep_off`.
    #[serde(default)]
    pub fence: FenceSection,
    /// Which backend keeps the state (owned by the store): SQLite (`database`) or etcd.
    #[serde(default)]
    pub store: crate::store::config::StoreConfig,
    /// The leader election among coordinators sharing an etcd store (owned by `ha`).
    #[serde(default)]
    pub ha: crate::ha::HaSection,
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
    /// Listen address (default 127.0.0.1:9464). The file cannot switch the endpoint off: a
    /// key or section left out gives the default.
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

fn default_shutdown_grace() -> Duration {
    DEFAULT_SHUTDOWN_GRACE
}
fn default_http_listen() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
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
        let text =
            protocol::file::read_regular_to_string(path).map_err(|source| ConfigError::Read {
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
        // An empty path would be a temporary SQLite store, lost at every start.
        self.store
            .validate(&self.database)
            .map_err(|(key, message)| invalid(key, &message))?;
        self.ha
            .validate()
            .map_err(|(key, message)| invalid(key, &message))?;
        if self
            .inventory
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(invalid(
                "inventory",
                "must name a file (or leave the key out: no inventory)",
            ));
        }
        if self.health.report_interval.is_zero() {
            return Err(invalid("health.report_interval", "must be greater than 0"));
        }
        if self.health.report_interval > protocol::messages::MAX_REPORT_INTERVAL {
            return Err(invalid(
                "health.report_interval",
                "must be at most 1m, the longest interval an agent accepts",
            ));
        }
        let h = self.health.resolved();
        if h.unreachable_grace < h.report_interval {
            return Err(invalid(
                "health.unreachable_grace",
                "must be at least one report interval, or every machine would flap to unreachable",
            ));
        }
        self.kdump
            .validate()
            .map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?;
        if let Some(r) = &self.remediation {
            r.validate().map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
        let targets = self.gateways.as_ref().map_or(&[][..], |g| &g.targets[..]);
        if let Some(g) = &self.gateways {
            g.validate().map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?;
        }
        self.fence
            .validate(targets)
            .map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?;
        if let Some(name) = &self.name {
            protocol::identity::validate_name("name", name)
                .map_err(|e| invalid("name", &e.to_string()))?;
        }
        ranges::check(self).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
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
    fn a_time_limit_of_zero_is_refused() {
        let e = duration::limit("0s").unwrap_err();
        assert!(e.contains("\"0s\" is no time at all"), "{e}");
        assert!(duration::limit("PT0S").is_err());
        assert_eq!(duration::limit("2s").unwrap(), Duration::from_secs(2));
    }

    #[test]
    fn a_bad_duration_says_what_one_looks_like_and_nothing_of_the_parser() {
        let e = duration::parse("soon").unwrap_err();
        assert_eq!(
            e,
            "\"soon\" is not a duration like \"5s\", \"500ms\" or \"1m 30s\""
        );
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
    fn empty_paths_and_bad_gateway_targets_are_refused_naming_the_key() {
        let parse = |text: String| {
            Config::parse(&text, Path::new("c.toml"))
                .unwrap_err()
                .to_string()
        };
        let e = parse(MINIMAL.replace("database = \"/tmp/c.db\"", "database = \"\""));
        assert!(e.contains("`database`") || e.contains("database"), "{e}");
        assert!(e.contains("must name a file"), "{e}");
        let e = parse(format!("inventory = \"\"\n{MINIMAL}"));
        assert!(
            e.contains("inventory") && e.contains("must name a file"),
            "{e}"
        );
        for (from, to, key) in [
            ("server_name = \"gw\"", "server_name = \"\"", "server_name"),
            (
                "server_name = \"gw\"",
                "server_name = \"bad name!\"",
                "server_name",
            ),
            ("name = \"rack-1\"", "name = \"\"", "name"),
            ("racks = [\"rack-1\"]", "racks = [\"\"]", "racks"),
            (
                "racks = [\"rack-1\"]",
                "machines = [\"not-an-ip\"]",
                "machines",
            ),
        ] {
            let text = format!("{MINIMAL}{}", GATEWAY.replace(from, to));
            let e = parse(text);
            assert!(
                e.contains(&format!("gateways.targets[0].{key}")),
                "{to}: {e}"
            );
        }
        let e = parse(format!("{MINIMAL}{GATEWAY}{GATEWAY}"));
        assert!(e.contains("names two gateways"), "{e}");
        assert!(Config::parse(&format!("{MINIMAL}{GATEWAY}"), Path::new("c.toml")).is_ok());
        let e = parse(format!(
            "{MINIMAL}\n[remediation]\nmaximum_repair_queue_entries = 0\n"
        ));
        assert!(e.contains("maximum_repair_queue_entries"), "{e}");
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

    const GATEWAY: &str = "\n[[gateways.targets]]\nname = \"rack-1\"\naddress = \"127.0.0.1:7444\"\nserver_name = \"gw\"\nracks = [\"rack-1\"]\n";

    #[test]
    fn fence_limits_default_to_the_issue_and_are_overridden_per_bmc() {
        let c = Config::parse(MINIMAL, Path::new("c.toml")).unwrap();
        let t = c.fence.timeouts_for(Some("qemu"), Some("rack-1"));
        assert_eq!(t.off, Duration::from_secs(60));
        assert_eq!(t.on, Duration::from_secs(120));
        assert_eq!(t, crate::fence::flow::FenceTimeouts::default());
        assert!(!c.fence.keep_off_for(None, None));

        let text = format!(
            "{MINIMAL}{GATEWAY}\n[fence]\noff_timeout = \"45s\"\non_timeout = \"3m\"\n\
             [fence.gateways.rack-1]\noff_timeout = \"90s\"\non_timeout = \"4m\"\n\
             [fence.machine_types.big-mem]\non_timeout = \"5m\"\nback_timeout = \"30m\"\nkeep_off = true\n"
        );
        let f = Config::parse(&text, Path::new("c.toml")).unwrap().fence;
        // The section's own values.
        let t = f.timeouts_for(Some("qemu"), Some("rack-2"));
        assert_eq!(
            (t.off, t.on),
            (Duration::from_secs(45), Duration::from_secs(180))
        );
        // The gateway's.
        let t = f.timeouts_for(Some("qemu"), Some("rack-1"));
        assert_eq!(
            (t.off, t.on),
            (Duration::from_secs(90), Duration::from_secs(240))
        );
        // The machine type's beat the gateway's, key by key.
        let t = f.timeouts_for(Some("big-mem"), Some("rack-1"));
        assert_eq!(t.off, Duration::from_secs(90), "off from the gateway");
        assert_eq!(t.on, Duration::from_secs(300), "on from the machine type");
        assert_eq!(t.back, Duration::from_secs(1800));
        assert_eq!(t.release, Duration::from_secs(600));
        assert!(f.keep_off_for(Some("big-mem"), Some("rack-1")));
        assert!(!f.keep_off_for(Some("qemu"), Some("rack-1")));
    }

    #[test]
    fn the_packaged_config_with_every_setting_uncommented_loads() {
        // Commented settings start with `#` and no space; prose comments with `# `.
        let text: String = include_str!("../../packaging/coordinator/coordinator.toml")
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if !rest.starts_with(' ') && !rest.is_empty() => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let c = Config::parse(&text, Path::new("coordinator.toml")).unwrap();
        let t = c.fence.timeouts_for(Some("big-mem"), Some("rack-1"));
        assert_eq!(t.on, Duration::from_secs(300));
        // The machine type's off_timeout (60s) wins over the gateway's (90s).
        assert_eq!(t.off, Duration::from_secs(60));
        assert_eq!(
            c.fence.timeouts_for(None, Some("rack-1")).off,
            Duration::from_secs(90)
        );
        assert!(!c.fence.keep_off_for(Some("big-mem"), Some("rack-1")));
    }

    #[test]
    fn bad_fence_limits_are_refused_naming_the_key() {
        for (extra, want) in [
            ("[fence]\noff_timeout = \"0s\"\n", "fence.off_timeout"),
            ("[fence]\non_timeout = 120\n", "has no unit"),
            (
                "[fence.machine_types.x]\non_timeout = \"0s\"\n",
                "fence.machine_types.x.on_timeout",
            ),
            (
                "[fence.gateways.rack-9]\noff_timeout = \"1m\"\n",
                "no [[gateways.targets]] is named \"rack-9\" (configured: rack-1)",
            ),
            ("[fence]\noff_timout = \"1m\"\n", "off_timout"),
            ("[fence.machine_types.x]\nkeep_of = true\n", "keep_of"),
        ] {
            let text = format!("{MINIMAL}{GATEWAY}\n{extra}");
            let e = Config::parse(&text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn a_report_interval_longer_than_an_agent_accepts_is_refused() {
        let text = format!("{MINIMAL}\n[health]\nreport_interval = \"2m\"\n");
        let e = Config::parse(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("health.report_interval") && e.contains("at most 1m"),
            "{e}"
        );
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
