//! `[checks]` in the agent's file: plugin checks (`[[checks.exec]]`, node-problem-detector's
//! custom plugin contract), the GPU Xid check (`[checks.gpu]`) and the memory ECC check
//! (`[checks.memory]`). The built-in kubelet, NIC, disk and kdump checks keep their own
//! tables; this module only reads and validates, it runs nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::xid::{XidAction, XidTable};
use protocol::duration::parse as parse_duration;

use crate::config::error::ConfigError;

/// node-problem-detector's default `invoke_interval` for custom plugins: a plugin written
/// for it expects to run about this often.
pub const DEFAULT_PLUGIN_INTERVAL: Duration = Duration::from_secs(30);

/// node-problem-detector's default plugin `timeout`.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many plugin processes at once by default (node-problem-detector's default
/// `concurrency` is 3): a node with many checks never forks them all in one instant.
pub const DEFAULT_MAX_CONCURRENT: usize = 3;

/// Correctable ECC errors in [`DEFAULT_CORRECTABLE_WINDOW`] above which the memory check
/// warns. A healthy DIMM sees a handful a month (a particle strike); hundreds an hour is
/// a cell or a row going bad, the pattern field studies found to come before uncorrectable
/// errors, while the machine is still worth draining on its own terms.
pub const DEFAULT_CORRECTABLE_PER_WINDOW: u64 = 100;

/// The window of [`DEFAULT_CORRECTABLE_PER_WINDOW`].
pub const DEFAULT_CORRECTABLE_WINDOW: Duration = Duration::from_secs(3600);

/// Whether a built-in check runs: `auto` runs it where its hardware is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enabled {
    /// On where the hardware is present (an NVIDIA GPU; an EDAC memory controller).
    #[default]
    Auto,
    /// Always on: its absence is reported.
    On,
    /// Off.
    Off,
}

/// What a plugin's exit 1 means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The machine is unhealthy (`fail`): node-problem-detector's permanent problem.
    #[default]
    Problem,
    /// Worth seeing, not a failure (`warn`): node-problem-detector's temporary problem.
    Warning,
}

/// `[checks]` as written in the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChecksFile {
    /// At most this many plugin processes at once.
    pub max_concurrent: Option<usize>,
    /// Plugin checks.
    #[serde(default)]
    pub exec: Vec<ExecFile>,
    /// The GPU Xid check.
    #[serde(default)]
    pub gpu: GpuFile,
    /// The memory ECC check.
    #[serde(default)]
    pub memory: MemoryFile,
}

/// One `[[checks.exec]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecFile {
    /// The check's name: its subject in reports, what health checks name (`plugin:NAME`).
    pub name: String,
    /// The program (absolute path); no shell runs it unless it is one.
    pub path: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// How often it runs (`"30s"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub interval: Option<String>,
    /// Time limit of one run (`"5s"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub timeout: Option<String>,
    /// `problem` (default) or `warning`.
    #[serde(default)]
    pub severity: Severity,
}

/// `[checks.gpu]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    /// `auto` (default), `on` or `off`.
    #[serde(default)]
    pub enabled: Enabled,
    /// The kernel log to read, under the root (default `/dev/kmsg`).
    pub kmsg: Option<String>,
    /// Xid code → action, over the defaults (`"79" = "reboot"`).
    #[serde(default)]
    pub xid: BTreeMap<String, XidAction>,
    /// What an Xid the table does not name asks for (default `warn`).
    pub unknown_xid: Option<XidAction>,
}

/// `[checks.memory]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryFile {
    /// `auto` (default), `on` or `off`.
    #[serde(default)]
    pub enabled: Enabled,
    /// Warn above this many correctable errors within `correctable_window`.
    pub correctable_per_window: Option<u64>,
    /// The window (`"1h"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub correctable_window: Option<String>,
}

/// One validated plugin check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCheck {
    /// Name.
    pub name: String,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Run interval.
    pub interval: Duration,
    /// Time limit.
    pub timeout: Duration,
    /// What exit 1 means.
    pub severity: Severity,
}

/// The GPU check's settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuConfig {
    /// Whether it runs.
    pub enabled: Enabled,
    /// The kernel log, as a node path.
    pub kmsg: String,
    /// How each Xid is classified.
    pub table: XidTable,
}

/// The memory check's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Whether it runs.
    pub enabled: Enabled,
    /// Correctable errors within the window above which it warns.
    pub correctable_per_window: u64,
    /// The window.
    pub correctable_window: Duration,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: Enabled::Auto,
            correctable_per_window: DEFAULT_CORRECTABLE_PER_WINDOW,
            correctable_window: DEFAULT_CORRECTABLE_WINDOW,
        }
    }
}

/// The validated `[checks]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChecksConfig {
    /// At most this many plugin processes at once.
    pub max_concurrent: usize,
    /// Plugin checks, in file order.
    pub exec: Vec<ExecCheck>,
    /// GPU Xid check.
    pub gpu: GpuConfig,
    /// Memory ECC check.
    pub memory: MemoryConfig,
}

impl Default for ChecksConfig {
    fn default() -> Self {
        Self {
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            exec: Vec::new(),
            gpu: GpuConfig {
                kmsg: "/dev/kmsg".into(),
                ..GpuConfig::default()
            },
            memory: MemoryConfig::default(),
        }
    }
}

/// The longest plugin check name: it travels in every report and names a health check.
const MAX_NAME_LEN: usize = 63;

impl ChecksConfig {
    /// Validates the file's section; `invalid` builds the error for a key.
    pub fn resolve(
        file: ChecksFile,
        invalid: impl Fn(&'static str, String) -> ConfigError,
    ) -> Result<Self, ConfigError> {
        let d = Self::default();
        let max_concurrent = file.max_concurrent.unwrap_or(d.max_concurrent);
        if max_concurrent == 0 {
            return Err(invalid(
                "checks.max_concurrent",
                "must be at least 1".into(),
            ));
        }
        let mut exec: Vec<ExecCheck> = Vec::with_capacity(file.exec.len());
        for e in file.exec {
            let name_ok = !e.name.is_empty()
                && e.name.len() <= MAX_NAME_LEN
                && e.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !name_ok {
                return Err(invalid(
                    "checks.exec.name",
                    format!(
                        "{:?} is not a check name (1 to {MAX_NAME_LEN} letters, digits and -_.)",
                        e.name
                    ),
                ));
            }
            if exec.iter().any(|x| x.name == e.name) {
                return Err(invalid(
                    "checks.exec.name",
                    format!(
                        "{:?} is used by two checks; each needs its own name",
                        e.name
                    ),
                ));
            }
            if !e.path.is_absolute() {
                return Err(invalid(
                    "checks.exec.path",
                    format!(
                        "{} (check {}) is not an absolute path",
                        e.path.display(),
                        e.name
                    ),
                ));
            }
            let dur = |key: &'static str, v: Option<String>, default: Duration| match v {
                None => Ok(default),
                Some(s) => {
                    let d = parse_duration(&s)
                        .map_err(|m| invalid(key, format!("check {}: {m}", e.name)))?;
                    if d.is_zero() {
                        return Err(invalid(
                            key,
                            format!("check {}: must be more than 0", e.name),
                        ));
                    }
                    Ok(d)
                }
            };
            let interval = dur("checks.exec.interval", e.interval, DEFAULT_PLUGIN_INTERVAL)?;
            let timeout = dur("checks.exec.timeout", e.timeout, DEFAULT_PLUGIN_TIMEOUT)?;
            if timeout > interval {
                return Err(invalid(
                    "checks.exec.timeout",
                    format!(
                        "check {}: {} is longer than its interval {}; one run at a time, so \
                         a run that long would be late for the next",
                        e.name,
                        protocol::duration::display(timeout),
                        protocol::duration::display(interval)
                    ),
                ));
            }
            let mut argv = vec![e.path.to_string_lossy().into_owned()];
            argv.extend(e.args);
            exec.push(ExecCheck {
                name: e.name,
                argv,
                interval,
                timeout,
                severity: e.severity,
            });
        }
        let kmsg = file.gpu.kmsg.unwrap_or(d.gpu.kmsg);
        if !kmsg.starts_with('/') {
            return Err(invalid(
                "checks.gpu.kmsg",
                format!("{kmsg:?} is not an absolute path"),
            ));
        }
        let mut table = XidTable::default();
        for (code, action) in file.gpu.xid {
            let n: u32 = code.parse().map_err(|_| {
                invalid(
                    "checks.gpu.xid",
                    format!("{code:?} is not an Xid number (write \"79\" = \"reboot\")"),
                )
            })?;
            table.set(n, action);
        }
        if let Some(a) = file.gpu.unknown_xid {
            table.unknown = a;
        }
        let window = match file.memory.correctable_window {
            None => d.memory.correctable_window,
            Some(s) => {
                parse_duration(&s).map_err(|m| invalid("checks.memory.correctable_window", m))?
            }
        };
        if window < Duration::from_secs(60) {
            return Err(invalid(
                "checks.memory.correctable_window",
                "must be at least 1m (a rate over seconds is noise)".into(),
            ));
        }
        Ok(Self {
            max_concurrent,
            exec,
            gpu: GpuConfig {
                enabled: file.gpu.enabled,
                kmsg,
                table,
            },
            memory: MemoryConfig {
                enabled: file.memory.enabled,
                correctable_per_window: file
                    .memory
                    .correctable_per_window
                    .unwrap_or(d.memory.correctable_per_window),
                correctable_window: window,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<ChecksConfig, String> {
        let file: ChecksFile = toml::from_str(text).map_err(|e| e.to_string())?;
        ChecksConfig::resolve(file, |key, detail| ConfigError::Invalid {
            key,
            origin: "file t.toml".into(),
            detail,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn plugin_checks_take_npd_defaults_and_bad_values_name_their_key() {
        let c = resolve(
            "[[exec]]\nname = \"ntp\"\npath = \"/usr/lib/npd/check_ntp.sh\"\nargs = [\"-q\"]\n",
        )
        .unwrap();
        assert_eq!(c.exec[0].argv, ["/usr/lib/npd/check_ntp.sh", "-q"]);
        assert_eq!(c.exec[0].interval, DEFAULT_PLUGIN_INTERVAL);
        assert_eq!(c.exec[0].timeout, DEFAULT_PLUGIN_TIMEOUT);
        assert_eq!(c.exec[0].severity, Severity::Problem);
        assert_eq!(c.max_concurrent, 3);
        for (text, needle) in [
            (
                "[[exec]]\nname = \"a b\"\npath = \"/x\"",
                "checks.exec.name",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"x.sh\"",
                "not an absolute path",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"/x\"\n[[exec]]\nname = \"a\"\npath = \"/y\"",
                "used by two checks",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"/x\"\ninterval = \"5s\"\ntimeout = \"10s\"",
                "longer than its interval",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"/x\"\ntimeout = \"0s\"",
                "more than 0",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"/x\"\nshell = true",
                "unknown field",
            ),
            (
                "[[exec]]\nname = \"a\"\npath = \"/x\"\nseverity = \"fatal\"",
                "unknown variant",
            ),
            ("max_concurrent = 0", "checks.max_concurrent"),
            ("[gpu.xid]\nabc = \"reboot\"", "not an Xid number"),
            ("[gpu.xid]\n79 = \"explode\"", "unknown variant"),
            ("[memory]\ncorrectable_window = \"10s\"", "at least 1m"),
        ] {
            let e = resolve(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn the_xid_table_is_overridden_per_code() {
        let c = resolve(
            "[gpu]\nenabled = \"on\"\nunknown_xid = \"ignore\"\n[gpu.xid]\n13 = \"reboot\"\n",
        )
        .unwrap();
        assert_eq!(c.gpu.enabled, Enabled::On);
        assert_eq!(c.gpu.table.action(13), XidAction::Reboot);
        assert_eq!(c.gpu.table.action(79), XidAction::Reboot);
        assert_eq!(c.gpu.table.action(31), XidAction::Ignore);
        assert_eq!(c.gpu.table.action(99_999), XidAction::Ignore);
    }
}
