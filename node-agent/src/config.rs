//! node-agent configuration: the TOML file, environment and flags, merged in that order
//! (file < env < flags), then validated into a [`Config`].
//!
//! The file is optional only when it was not named explicitly: a missing
//! `/etc/fleetmend/node-agent.toml` is fine when everything comes from flags, a missing
//! `--config` file is an error. Unknown keys are errors naming the key and the file.
//! This module reads files and nothing else; it does not check that certificate files
//! exist (the transport does that, with the path in its error).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

mod command;
pub(crate) mod error;
pub(crate) mod ranges;

pub use command::{Cli, Command};
pub use error::ConfigError;

/// Where the configuration file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/fleetmend/node-agent.toml";

/// Default report interval: the coordinator declares a machine unreachable after three
/// missed intervals, so 5 s means a dead machine is noticed within ~15-20 s while the
/// coordinator handles a 10 000-node fleet at 2 000 small reports per second.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// The longest `report_interval` accepted (one minute): see the constant's reasons.
pub use protocol::messages::MAX_REPORT_INTERVAL;

/// kubelet's default healthz endpoint (`--healthz-port=10248`, loopback only).
pub const DEFAULT_KUBELET_URL: &str = "http://127.0.0.1:10248/healthz";

/// kubelet healthz timeout: the endpoint answers from memory in microseconds, so 2 s of
/// silence means the kubelet is wedged; it must also stay well under the report interval.
pub const DEFAULT_KUBELET_TIMEOUT: Duration = Duration::from_secs(2);

/// Below this share of free blocks a mount warns: enough headroom for an operator to act
/// before kubelet's own image GC / eviction thresholds (10-15 %) start killing pods.
pub const DEFAULT_WARN_FREE_PERCENT: f64 = 10.0;
/// Below this share of free blocks a mount fails: writes are about to fail for everyone.
pub const DEFAULT_FAIL_FREE_PERCENT: f64 = 5.0;
/// Inode thresholds mirror the space thresholds: inode exhaustion breaks writes just as
/// surely and is harder to see.
pub const DEFAULT_WARN_FREE_INODES_PERCENT: f64 = 10.0;
/// See [`DEFAULT_WARN_FREE_INODES_PERCENT`].
pub const DEFAULT_FAIL_FREE_INODES_PERCENT: f64 = 5.0;

/// Where a setting given on the command line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A flag.
    Flag,
    /// Its environment variable.
    Env,
}

/// The settings a flag (and an environment variable) can give: the key as in the file,
/// and the flag's name.
const FLAG_KEYS: [(&str, &str); 10] = [
    ("coordinator", "coordinator"),
    ("server_name", "server-name"),
    ("ca", "ca"),
    ("cert", "cert"),
    ("key", "key"),
    ("report_interval", "report-interval"),
    ("root", "root"),
    ("hostname", "hostname"),
    ("nics", "nic"),
    ("kubelet.url", "kubelet-url"),
];

/// The environment variable of a file key (`kubelet.url` → `FLEETMEND_AGENT_KUBELET_URL`).
fn env_name(key: &str) -> String {
    format!(
        "{}{}",
        protocol::env_var!(AGENT, ""),
        key.replace('.', "_").to_uppercase()
    )
}

/// Says where the value of `key` came from, for an error about it: the flag or the
/// environment variable when one gave it, else the file; for a missing value, every place
/// it could have been set.
fn origin_of(key: &str, flags: &Settings, in_file: &[&str], file: Option<&Path>) -> String {
    let flag = FLAG_KEYS.iter().find(|(k, _)| *k == key).map(|(_, f)| *f);
    if let Some(flag) = flag
        && flags.is_set(key)
    {
        return match flags.origins.get(key) {
            Some(Origin::Env) => format!("env {}", env_name(key)),
            Some(Origin::Flag) => format!("flag --{flag}"),
            None => format!("flag --{flag} or env {}", env_name(key)),
        };
    }
    let file_note = match file {
        Some(p) => format!("file {}", p.display()),
        None => "no config file".to_string(),
    };
    match flag {
        Some(flag) if !in_file.contains(&key) => format!(
            "not set: {file_note}, env {} or flag --{flag}",
            env_name(key)
        ),
        _ => file_note,
    }
}

/// Flags (and their environment variables) that override the file.
#[derive(Debug, Clone, Default, Args)]
pub struct Settings {
    /// Configuration file [default: /etc/fleetmend/node-agent.toml, if present].
    #[arg(long, env = protocol::env_var!(AGENT, "CONFIG"), global = true)]
    pub config: Option<PathBuf>,
    /// Coordinator address, host:port.
    #[arg(long, env = protocol::env_var!(AGENT, "COORDINATOR"), global = true)]
    pub coordinator: Option<String>,
    /// TLS server name of the coordinator [default: host part of --coordinator].
    #[arg(long, env = protocol::env_var!(AGENT, "SERVER_NAME"), global = true)]
    pub server_name: Option<String>,
    /// Fleet CA certificate (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "CA"), global = true)]
    pub ca: Option<PathBuf>,
    /// This node's certificate (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "CERT"), global = true)]
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = protocol::env_var!(AGENT, "KEY"), global = true)]
    pub key: Option<PathBuf>,
    /// Report interval, e.g. 5s, 500ms, 1m [default: 5s].
    #[arg(long, env = protocol::env_var!(AGENT, "REPORT_INTERVAL"), global = true)]
    pub report_interval: Option<String>,
    /// Directory under which /sys, /proc and /run are read [default: /].
    #[arg(long, env = protocol::env_var!(AGENT, "ROOT"), global = true)]
    pub root: Option<PathBuf>,
    /// Hostname to report [default: the kernel hostname under the root].
    #[arg(long, env = protocol::env_var!(AGENT, "HOSTNAME"), global = true)]
    pub hostname: Option<String>,
    /// Required network interface (repeatable; replaces the file's list).
    #[arg(
        long = "nic",
        env = protocol::env_var!(AGENT, "NICS"),
        value_delimiter = ',',
        global = true
    )]
    pub nics: Vec<String>,
    /// kubelet healthz URL (plain http).
    #[arg(long, env = protocol::env_var!(AGENT, "KUBELET_URL"), global = true)]
    pub kubelet_url: Option<String>,
    /// Which of the above came from a flag and which from the environment (keyed as in the
    /// file), so an error names the one to fix. Filled by [`Settings::note_origins`].
    #[arg(skip)]
    pub origins: std::collections::BTreeMap<&'static str, Origin>,
}

impl Settings {
    /// Records, from clap's matches, which settings a flag gave and which an environment
    /// variable gave.
    pub fn note_origins(&mut self, matches: &clap::ArgMatches) {
        let sub = matches.subcommand().map(|(_, m)| m);
        for (key, _) in FLAG_KEYS {
            // clap's argument ids are the field names.
            let id = key.replace('.', "_");
            let source = sub
                .and_then(|m| m.value_source(&id))
                .or_else(|| matches.value_source(&id));
            let origin = match source {
                Some(clap::parser::ValueSource::CommandLine) => Origin::Flag,
                Some(clap::parser::ValueSource::EnvVariable) => Origin::Env,
                _ => continue,
            };
            self.origins.insert(key, origin);
        }
    }

    /// Whether a flag or the environment gave `key`.
    fn is_set(&self, key: &str) -> bool {
        match key {
            "coordinator" => self.coordinator.is_some(),
            "server_name" => self.server_name.is_some(),
            "ca" => self.ca.is_some(),
            "cert" => self.cert.is_some(),
            "key" => self.key.is_some(),
            "report_interval" => self.report_interval.is_some(),
            "root" => self.root.is_some(),
            "hostname" => self.hostname.is_some(),
            "nics" => !self.nics.is_empty(),
            "kubelet.url" => self.kubelet_url.is_some(),
            _ => false,
        }
    }
}

/// The file's layout. Every key is optional here; [`Config::resolve`] decides what is
/// required.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Coordinator `host:port`.
    pub coordinator: Option<String>,
    /// TLS server name of the coordinator.
    pub server_name: Option<String>,
    /// Fleet CA certificate.
    pub ca: Option<PathBuf>,
    /// Node certificate.
    pub cert: Option<PathBuf>,
    /// Node key.
    pub key: Option<PathBuf>,
    /// Report interval (`"5s"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub report_interval: Option<String>,
    /// Root for /sys, /proc, /run.
    pub root: Option<PathBuf>,
    /// Hostname override.
    pub hostname: Option<String>,
    /// Required NICs.
    #[serde(default)]
    pub nics: Vec<String>,
    /// Required mounts.
    #[serde(default)]
    pub mounts: Vec<MountConfig>,
    /// kubelet check.
    #[serde(default)]
    pub kubelet: KubeletFile,
    /// kdump check.
    #[serde(default)]
    pub kdump: KdumpConfig,
    /// Actions the coordinator may ask for.
    #[serde(default)]
    pub actions: crate::actions::config::ActionsFile,
    /// Plugin, GPU and memory checks.
    #[serde(default)]
    pub checks: crate::checks::config::ChecksFile,
}

/// `[kubelet]` in the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeletFile {
    /// Whether to check kubelet at all (default true).
    pub enabled: Option<bool>,
    /// healthz URL.
    pub url: Option<String>,
    /// Request timeout (`"2s"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub timeout: Option<String>,
}

/// `[kdump]` in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdumpConfig {
    /// Whether to check that a crash kernel is loaded (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for KdumpConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

fn yes() -> bool {
    true
}

/// One `[[mounts]]` entry: a filesystem that must be mounted, with thresholds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    /// Mount point as seen by the node, e.g. `/var`.
    pub path: String,
    /// Whether it must be mounted read-write (default true).
    #[serde(default = "yes")]
    pub read_write: bool,
    /// Warn below this percentage of free blocks.
    #[serde(default = "warn_free")]
    pub warn_free_percent: f64,
    /// Fail below this percentage of free blocks.
    #[serde(default = "fail_free")]
    pub fail_free_percent: f64,
    /// Warn below this percentage of free inodes.
    #[serde(default = "warn_inodes")]
    pub warn_free_inodes_percent: f64,
    /// Fail below this percentage of free inodes.
    #[serde(default = "fail_inodes")]
    pub fail_free_inodes_percent: f64,
}

fn warn_free() -> f64 {
    DEFAULT_WARN_FREE_PERCENT
}
fn fail_free() -> f64 {
    DEFAULT_FAIL_FREE_PERCENT
}
fn warn_inodes() -> f64 {
    DEFAULT_WARN_FREE_INODES_PERCENT
}
fn fail_inodes() -> f64 {
    DEFAULT_FAIL_FREE_INODES_PERCENT
}

impl MountConfig {
    /// A read-write mount with default thresholds.
    pub fn new(path: &str) -> Self {
        Self {
            path: path.to_string(),
            read_write: true,
            warn_free_percent: DEFAULT_WARN_FREE_PERCENT,
            fail_free_percent: DEFAULT_FAIL_FREE_PERCENT,
            warn_free_inodes_percent: DEFAULT_WARN_FREE_INODES_PERCENT,
            fail_free_inodes_percent: DEFAULT_FAIL_FREE_INODES_PERCENT,
        }
    }
}

/// The coordinator and the TLS files: needed by `run`, not by `check`.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinatorConfig {
    /// `host:port`, or several separated by commas: the coordinators that may lead, tried
    /// in turn (a standby names the leader and the agent goes there at once).
    pub address: String,
    /// TLS server name (default: host part of `address`, of its first for several).
    pub server_name: String,
    /// Each coordinator of `address` with its TLS server name (`server_name` when set,
    /// else the host part of that address).
    pub targets: Vec<(String, String)>,
    /// `server_name` as configured, if it was: the name of a leader a standby names too.
    pub server_name_set: Option<String>,
    /// Fleet CA.
    pub ca: PathBuf,
    /// Node certificate.
    pub cert: PathBuf,
    /// Node key.
    pub key: PathBuf,
}

/// The kubelet check's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletConfig {
    /// healthz URL; `None` disables the check.
    pub url: Option<String>,
    /// Request timeout.
    pub timeout: Duration,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Coordinator settings; `None` when neither file nor flags name a coordinator (only
    /// `check` can run then).
    pub coordinator: Option<CoordinatorConfig>,
    /// Report interval.
    pub report_interval: Duration,
    /// Root directory for /sys, /proc, /run.
    pub root: PathBuf,
    /// Hostname override.
    pub hostname: Option<String>,
    /// Required NICs.
    pub nics: Vec<String>,
    /// Required mounts.
    pub mounts: Vec<MountConfig>,
    /// kubelet check.
    pub kubelet: KubeletConfig,
    /// Whether to check kdump.
    pub kdump: bool,
    /// Actions the coordinator may ask for.
    pub actions: crate::actions::config::ActionsConfig,
    /// Plugin, GPU and memory checks.
    pub checks: crate::checks::config::ChecksConfig,
    /// The file that was read, if any (for messages).
    pub source: Option<PathBuf>,
}

/// Parses `500ms`, `5s`, `2m` (the fleet's one duration syntax). A bare number is refused:
/// its unit would be a guess.
pub use protocol::duration::parse as parse_duration;

/// Splits `host:port` (IPv6 in brackets) into host and port.
pub fn split_host_port(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("{addr:?} has no port; write host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{addr:?}: {port:?} is not a port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{addr:?} has no host"));
    }
    Ok((host.to_string(), port))
}

impl FileConfig {
    /// Parses TOML text; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            detail: e.to_string().trim_end().to_string(),
        })
    }

    /// Reads the file named by `explicit`, or the default path if it exists.
    pub fn load(explicit: Option<&Path>) -> Result<(Self, Option<PathBuf>), ConfigError> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                let p = PathBuf::from(DEFAULT_CONFIG_PATH);
                if !p.exists() {
                    return Ok((Self::default(), None));
                }
                p
            }
        };
        let text =
            protocol::file::read_regular_to_string(&path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
        Ok((Self::parse(&text, &path)?, Some(path)))
    }
}

impl Config {
    /// Reads the file (per `settings.config`) and merges `settings` over it.
    pub fn load(settings: &Settings) -> Result<Self, ConfigError> {
        let (file, path) = FileConfig::load(settings.config.as_deref())?;
        Self::resolve(file, settings, path)
    }

    /// Merges flags/env over the file and validates the result.
    pub fn resolve(
        file: FileConfig,
        flags: &Settings,
        source: Option<PathBuf>,
    ) -> Result<Self, ConfigError> {
        let in_file: Vec<&str> = [
            ("coordinator", file.coordinator.is_some()),
            ("server_name", file.server_name.is_some()),
            ("ca", file.ca.is_some()),
            ("cert", file.cert.is_some()),
            ("key", file.key.is_some()),
            ("report_interval", file.report_interval.is_some()),
            ("root", file.root.is_some()),
            ("hostname", file.hostname.is_some()),
            ("nics", !file.nics.is_empty()),
            ("kubelet.url", file.kubelet.url.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        let invalid = |key, detail: String| ConfigError::Invalid {
            key,
            origin: origin_of(key, flags, &in_file, source.as_deref()),
            detail,
        };
        let address = flags.coordinator.clone().or(file.coordinator);
        let server_name = flags.server_name.clone().or(file.server_name);
        let ca = flags.ca.clone().or(file.ca);
        let cert = flags.cert.clone().or(file.cert);
        let key = flags.key.clone().or(file.key);
        let coordinator = match address {
            None => {
                if ca.is_some() || cert.is_some() || key.is_some() {
                    return Err(invalid(
                        "coordinator",
                        "TLS files are set but no coordinator address; set coordinator = \"host:port\"".into(),
                    ));
                }
                None
            }
            Some(address) => {
                let mut targets = Vec::new();
                for one in address.split(',').map(str::trim) {
                    let (host, _) = split_host_port(one).map_err(|e| invalid("coordinator", e))?;
                    let name = server_name.clone().unwrap_or(host);
                    targets.push((one.to_string(), name));
                }
                let host = targets[0].1.clone();
                let need = |k: &'static str, v: Option<PathBuf>| {
                    v.ok_or_else(|| {
                        invalid(
                            k,
                            format!("missing; a coordinator is configured, so `{k}` (a PEM file path) is required"),
                        )
                    })
                };
                Some(CoordinatorConfig {
                    server_name_set: server_name.clone(),
                    server_name: server_name.unwrap_or(host),
                    targets,
                    ca: need("ca", ca)?,
                    cert: need("cert", cert)?,
                    key: need("key", key)?,
                    address,
                })
            }
        };
        let report_interval = match flags.report_interval.clone().or(file.report_interval) {
            None => DEFAULT_REPORT_INTERVAL,
            Some(s) => {
                ranges::parse("report_interval", &s).map_err(|e| invalid("report_interval", e))?
            }
        };
        let root = flags
            .root
            .clone()
            .or(file.root)
            .unwrap_or_else(|| PathBuf::from("/"));
        if !root.is_absolute() {
            return Err(invalid(
                "root",
                format!("{} is not an absolute path", root.display()),
            ));
        }
        if let Err(e) = std::fs::read_dir(&root) {
            return Err(invalid(
                "root",
                format!(
                    "{} is not a directory this agent can read: {e}",
                    root.display()
                ),
            ));
        }
        let hostname = flags.hostname.clone().or(file.hostname);
        if let Some(h) = &hostname
            && protocol::identity::validate_name("hostname", h).is_err()
        {
            return Err(invalid(
                "hostname",
                format!("{h:?} is not a valid host name"),
            ));
        }
        let nics = if flags.nics.is_empty() {
            file.nics
        } else {
            flags.nics.clone()
        };
        for n in &nics {
            if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                return Err(invalid("nics", format!("{n:?} is not an interface name")));
            }
        }
        let mut mounts = file.mounts;
        for m in &mut mounts {
            // `/var/` and `/var` name the same mount; the mount table says `/var`.
            if m.path.len() > 1 {
                m.path = m.path.trim_end_matches('/').to_string();
                if m.path.is_empty() {
                    m.path = "/".into();
                }
            }
            if !m.path.starts_with('/') {
                return Err(invalid(
                    "mounts.path",
                    format!("{:?} is not an absolute mount point", m.path),
                ));
            }
            for (k, v) in [
                ("mounts.warn_free_percent", m.warn_free_percent),
                ("mounts.fail_free_percent", m.fail_free_percent),
                (
                    "mounts.warn_free_inodes_percent",
                    m.warn_free_inodes_percent,
                ),
                (
                    "mounts.fail_free_inodes_percent",
                    m.fail_free_inodes_percent,
                ),
            ] {
                if !(0.0..=100.0).contains(&v) {
                    return Err(invalid(
                        k,
                        format!("{v} for {} is not a percentage between 0 and 100", m.path),
                    ));
                }
            }
        }
        let enabled = file.kubelet.enabled.unwrap_or(true);
        let url = flags
            .kubelet_url
            .clone()
            .or(file.kubelet.url)
            .unwrap_or_else(|| DEFAULT_KUBELET_URL.to_string());
        if enabled {
            crate::checks::kubelet::HttpUrl::parse(&url).map_err(|e| invalid("kubelet.url", e))?;
        }
        let timeout = match file.kubelet.timeout {
            None => DEFAULT_KUBELET_TIMEOUT,
            Some(s) => {
                ranges::parse("kubelet.timeout", &s).map_err(|e| invalid("kubelet.timeout", e))?
            }
        };
        let actions = crate::actions::config::ActionsConfig::resolve(file.actions, invalid)?;
        let checks = crate::checks::config::ChecksConfig::resolve(file.checks, invalid)?;
        Ok(Config {
            actions,
            checks,
            coordinator,
            report_interval,
            root,
            hostname,
            nics,
            mounts,
            kubelet: KubeletConfig {
                url: enabled.then_some(url),
                timeout,
            },
            kdump: file.kdump.enabled,
            source,
        })
    }

    /// The coordinator settings, or an error saying they are needed.
    pub fn require_coordinator(&self) -> Result<&CoordinatorConfig, ConfigError> {
        self.coordinator.as_ref().ok_or_else(|| ConfigError::Invalid {
            key: "coordinator",
            origin: origin_of("coordinator", &Settings::default(), &[], self.source.as_deref()),
            detail: format!(
                "missing; `run` needs coordinator = \"host:port\" and ca/cert/key (in {DEFAULT_CONFIG_PATH} or --config)"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let path = PathBuf::from("/etc/fleetmend/node-agent.toml");
        let file = FileConfig::parse(text, &path)?;
        Config::resolve(file, &Settings::default(), Some(path))
    }

    const FULL: &str = r#"
coordinator = "coord.example.net:7443"
ca = "/etc/fleetmend/tls/ca.crt"
cert = "/etc/fleetmend/tls/node.crt"
key = "/etc/fleetmend/tls/node.key"
report_interval = "2s"
nics = ["eth0", "eth1"]

[kubelet]
timeout = "500ms"

[[mounts]]
path = "/var"
fail_free_percent = 2.5

[[mounts]]
path = "/boot/"
read_write = false

[[mounts]]
path = "//"
"#;

    #[test]
    fn full_file_parses_with_defaults_filled_in() {
        let c = parse(FULL).unwrap();
        let co = c.coordinator.as_ref().unwrap();
        assert_eq!(co.server_name, "coord.example.net");
        assert_eq!(c.report_interval, Duration::from_secs(2));
        assert_eq!(c.root, PathBuf::from("/"));
        assert_eq!(c.nics, ["eth0", "eth1"]);
        assert_eq!(c.kubelet.url.as_deref(), Some(DEFAULT_KUBELET_URL));
        assert_eq!(c.kubelet.timeout, Duration::from_millis(500));
        assert_eq!(c.mounts[0].fail_free_percent, 2.5);
        assert_eq!(c.mounts[0].warn_free_percent, DEFAULT_WARN_FREE_PERCENT);
        assert!(!c.mounts[1].read_write);
        assert_eq!(c.mounts[1].path, "/boot");
        assert_eq!(c.mounts[2].path, "/");
        assert!(c.kdump);
    }

    #[test]
    fn empty_file_means_defaults_and_no_coordinator() {
        let c = parse("").unwrap();
        assert!(c.coordinator.is_none());
        assert_eq!(c.report_interval, DEFAULT_REPORT_INTERVAL);
        assert!(c.require_coordinator().is_err());
    }

    #[test]
    fn unknown_keys_are_errors_naming_key_and_file() {
        let e = parse("coordinator = \"a:1\"\nreport_intervall = \"5s\"\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("report_intervall"), "{msg}");
        assert!(msg.contains("/etc/fleetmend/node-agent.toml"), "{msg}");
        let e = parse("[[mounts]]\npath = \"/var\"\nfree = 3\n").unwrap_err();
        assert!(e.to_string().contains("free"), "{e}");
        let e = parse("[kubelet]\nurll = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("urll"), "{e}");
    }

    #[test]
    fn a_report_interval_over_a_minute_is_refused_naming_the_key_and_the_limit() {
        let e = parse("report_interval = \"1h\"").unwrap_err().to_string();
        assert!(
            e.contains("invalid setting `report_interval` (file /etc/fleetmend/node-agent.toml)")
                && e.contains("1h is above the longest this setting takes (1m)"),
            "{e}"
        );
        assert_eq!(
            parse("report_interval = \"1m\"").unwrap().report_interval,
            MAX_REPORT_INTERVAL
        );
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases = [
            ("coordinator = \"nohost\"", "coordinator"),
            ("coordinator = \"h:1\"\nca = \"/ca\"", "cert"),
            ("report_interval = \"5 parsecs\"", "report_interval"),
            ("report_interval = \"1ms\"", "report_interval"),
            ("report_interval = \"1h\"", "report_interval"),
            ("report_interval = \"1m 1s\"", "report_interval"),
            ("root = \"relative\"", "root"),
            ("root = \"/nonexistent-fleetmend-root\"", "root"),
            ("nics = [\"../etc\"]", "nics"),
            ("[[mounts]]\npath = \"var\"", "mounts.path"),
            (
                "[[mounts]]\npath = \"/var\"\nwarn_free_percent = 120.0",
                "mounts.warn_free_percent",
            ),
            (
                "[kubelet]\nurl = \"https://127.0.0.1:10250/healthz\"",
                "kubelet.url",
            ),
            ("[kubelet]\ntimeout = \"0s\"", "kubelet.timeout"),
            ("ca = \"/ca\"", "coordinator"),
            ("hostname = \"bad host\"", "hostname"),
        ];
        for (text, key) in cases {
            match parse(text) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: expected invalid {key}, got {other:?}"),
            }
        }
        // A number is said to need a unit, not "invalid type: integer".
        for text in [
            "report_interval = 5",
            "[kubelet]\ntimeout = 5",
            "[actions]\ncommand_timeout = 5",
        ] {
            let e = parse(text).unwrap_err();
            assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains("5 has no unit") && msg.contains("\"5s\""),
                "{msg}"
            );
        }
    }

    #[test]
    fn an_invalid_setting_names_the_flag_env_or_file_it_came_from() {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let file = path.display().to_string();
        let err = |args: &[&str]| {
            let m = Cli::command()
                .try_get_matches_from(["node-agent", "--config", &file].iter().chain(args))
                .unwrap();
            let mut cli = Cli::from_arg_matches(&m).unwrap();
            cli.settings.note_origins(&m);
            Config::load(&cli.settings).unwrap_err().to_string()
        };
        std::fs::write(&path, "coordinator = \"c:1\"\nreport_interval = \"abc\"\n").unwrap();
        let e = err(&["check"]);
        assert!(
            e.contains(&format!(
                "`ca` (not set: file {file}, env FLEETMEND_AGENT_CA or flag --ca)"
            )),
            "{e}"
        );
        let e = err(&["--ca", "/a", "--cert", "/b", "--key", "/c", "check"]);
        assert!(
            e.contains(&format!("`report_interval` (file {file}): \"abc\"")),
            "{e}"
        );
        // After the subcommand too: the flags are global.
        let e = err(&[
            "--ca",
            "/a",
            "--cert",
            "/b",
            "--key",
            "/c",
            "check",
            "--report-interval",
            "0s",
        ]);
        assert!(
            e.contains("`report_interval` (flag --report-interval): 0s is below the shortest"),
            "{e}"
        );
        // As the environment gives it (clap's env handling is tested by clap; the
        // environment is process-wide, so the origin is set as note_origins would).
        let (f, _) = FileConfig::load(Some(&path)).unwrap();
        let mut flags = Settings {
            ca: Some("/a".into()),
            cert: Some("/b".into()),
            key: Some("/c".into()),
            report_interval: Some("xyz".into()),
            ..Settings::default()
        };
        flags.origins.insert("report_interval", Origin::Env);
        let e = Config::resolve(f, &flags, Some(path.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(env FLEETMEND_AGENT_REPORT_INTERVAL): \"xyz\""),
            "{e}"
        );
    }

    #[test]
    fn several_coordinators_are_tried_each_under_its_own_name_unless_one_is_set() {
        let c = parse(
            "coordinator = \"c1.example:7443, [::1]:7443,c3:1\"\nca = \"/ca\"\ncert = \"/c\"\nkey = \"/k\"\n",
        )
        .unwrap();
        let co = c.coordinator.unwrap();
        assert_eq!(
            co.targets,
            vec![
                ("c1.example:7443".to_string(), "c1.example".to_string()),
                ("[::1]:7443".to_string(), "::1".to_string()),
                ("c3:1".to_string(), "c3".to_string()),
            ]
        );
        assert_eq!(co.server_name, "c1.example");
        let c = parse(
            "coordinator = \"a:1,b:2\"\nserver_name = \"coord\"\nca = \"/ca\"\ncert = \"/c\"\nkey = \"/k\"\n",
        )
        .unwrap();
        assert!(
            c.coordinator
                .unwrap()
                .targets
                .iter()
                .all(|(_, n)| n == "coord")
        );
        let e = parse("coordinator = \"a:1,nohost\"\nca = \"/ca\"\ncert = \"/c\"\nkey = \"/k\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"nohost\" has no port"), "{e}");
    }

    #[test]
    fn flags_override_the_file() {
        let path = PathBuf::from("/x.toml");
        let file = FileConfig::parse(FULL, &path).unwrap();
        let fixture = std::env::temp_dir();
        let flags = Settings {
            coordinator: Some("[::1]:9000".into()),
            report_interval: Some("250ms".into()),
            root: Some(fixture.clone()),
            nics: vec!["bond0".into()],
            hostname: Some("node-7".into()),
            kubelet_url: Some("http://127.0.0.1:1/healthz".into()),
            ..Settings::default()
        };
        let c = Config::resolve(file, &flags, Some(path)).unwrap();
        let co = c.coordinator.unwrap();
        assert_eq!(co.address, "[::1]:9000");
        assert_eq!(co.server_name, "::1");
        assert_eq!(co.ca, PathBuf::from("/etc/fleetmend/tls/ca.crt"));
        assert_eq!(c.report_interval, Duration::from_millis(250));
        assert_eq!(c.root, fixture);
        assert_eq!(c.nics, ["bond0"]);
        assert_eq!(c.hostname.as_deref(), Some("node-7"));
        assert_eq!(c.kubelet.url.as_deref(), Some("http://127.0.0.1:1/healthz"));
    }

    #[test]
    fn cli_parses_subcommands_and_defaults_to_run() {
        let cli = Cli::try_parse_from(["node-agent", "--config", "/a.toml"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.settings.config, Some(PathBuf::from("/a.toml")));
        let cli =
            Cli::try_parse_from(["node-agent", "check", "--json", "--nic", "eth0,eth1"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Check { json: true })));
        assert_eq!(cli.settings.nics, ["eth0", "eth1"]);
        let cli = Cli::try_parse_from(["node-agent", "run", "--root", "/r"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Run)));
        assert_eq!(cli.settings.root, Some(PathBuf::from("/r")));
    }

    #[test]
    fn missing_explicit_file_is_an_error_but_missing_default_is_not() {
        let e = FileConfig::load(Some(Path::new("/nonexistent/fleetmend.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/fleetmend.toml"), "{e}");
    }

    #[test]
    fn durations_and_addresses() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        let e = parse_duration("7").unwrap_err();
        assert!(e.contains("has no unit"), "{e}");
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(
            split_host_port("c.example:7443").unwrap(),
            ("c.example".into(), 7443)
        );
        assert!(split_host_port("c.example").is_err());
        assert!(split_host_port(":1").is_err());
        assert!(split_host_port("h:99999").is_err());
    }
}
