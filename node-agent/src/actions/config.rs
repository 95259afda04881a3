//! `[actions]` in the agent's file: which actions the coordinator may ask for and how the
//! agent carries them out. Every action is off unless the file (or the default) enables it:
//! an operator opts in per fleet.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::error::ConfigError;

/// Units that may be restarted when the file does not say: the kubelet and the container
/// runtime are what hangs on a Kubernetes node and what a restart fixes.
pub const DEFAULT_ALLOWED_UNITS: [&str; 2] = ["kubelet", "containerd"];

/// A restart or reboot command that has not finished after this is killed and reported
/// as timed out. `systemctl restart` waits for the unit's stop and start jobs; kubelet and
/// containerd stop within systemd's 90 s default only when something is wrong, and 60 s
/// keeps the repair step (default limit 30 min) moving on to the next step.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Diagnostics size limit: 256 KiB holds a few hundred journal lines per unit, the kernel
/// log tail and the tables, and 10,000 bundles still fit in a few GiB of SQLite.
pub const DEFAULT_DIAGNOSTICS_MAX_BYTES: usize = 256 * 1024;

/// Where the agent keeps the ids of reboots it was asked for (systemd's
/// `StateDirectory=fleetmend-node-agent`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/fleetmend-node-agent";

/// `[actions]` as written in the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionsFile {
    /// Units `restart-unit` may name (default: kubelet, containerd); `[]` disables it.
    pub allowed_units: Option<Vec<String>>,
    /// Whether `reboot` is allowed (default false).
    pub reboot: Option<bool>,
    /// Whether `collect-diagnostics` is allowed (default true).
    pub collect_diagnostics: Option<bool>,
    /// Restart program and arguments; the unit name is appended.
    pub restart_command: Option<Vec<String>>,
    /// Reboot program and arguments.
    pub reboot_command: Option<Vec<String>>,
    /// Time limit of a restart or reboot command (`"60s"`).
    #[serde(default, deserialize_with = "protocol::duration::text")]
    pub command_timeout: Option<String>,
    /// Directory for the record of reboot requests.
    pub state_dir: Option<PathBuf>,
    /// Diagnostics size limit in bytes.
    pub diagnostics_max_bytes: Option<usize>,
    /// Units whose journal goes into diagnostics (default: the allowed units).
    pub journal_units: Option<Vec<String>>,
    /// Journal program and arguments; the unit name is appended.
    pub journal_command: Option<Vec<String>>,
    /// Kernel log program and arguments.
    pub kernel_log_command: Option<Vec<String>>,
}

/// The resolved `[actions]` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionsConfig {
    /// Units `restart-unit` may name.
    pub allowed_units: Vec<String>,
    /// Whether `reboot` is allowed.
    pub reboot: bool,
    /// Whether `collect-diagnostics` is allowed.
    pub collect_diagnostics: bool,
    /// Restart command; the unit is appended.
    pub restart_command: Vec<String>,
    /// Reboot command.
    pub reboot_command: Vec<String>,
    /// Time limit of restart and reboot commands, and of each diagnostics command.
    pub command_timeout: Duration,
    /// Directory for the reboot record.
    pub state_dir: PathBuf,
    /// Diagnostics size limit in bytes of content.
    pub diagnostics_max_bytes: usize,
    /// Units whose journal is collected.
    pub journal_units: Vec<String>,
    /// Journal command; the unit is appended.
    pub journal_command: Vec<String>,
    /// Kernel log command.
    pub kernel_log_command: Vec<String>,
}

fn argv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Default for ActionsConfig {
    fn default() -> Self {
        let units = argv(&DEFAULT_ALLOWED_UNITS);
        Self {
            allowed_units: units.clone(),
            reboot: false,
            collect_diagnostics: true,
            restart_command: argv(&["systemctl", "restart", "--"]),
            reboot_command: argv(&["systemctl", "reboot"]),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            diagnostics_max_bytes: DEFAULT_DIAGNOSTICS_MAX_BYTES,
            journal_units: units,
            journal_command: argv(&["journalctl", "--no-pager", "--lines=400", "--unit"]),
            kernel_log_command: argv(&["journalctl", "--no-pager", "--dmesg", "--lines=400"]),
        }
    }
}

/// True for a name systemd could accept as a unit and no shell or option trick: letters,
/// digits and `-_.@:`, not starting with `-`.
pub fn valid_unit_name(u: &str) -> bool {
    !u.is_empty()
        && u.len() <= 256
        && !u.starts_with('-')
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@:".contains(c))
}

impl ActionsConfig {
    /// Validates the file's section; `invalid` builds the error for a key.
    pub fn resolve(
        file: ActionsFile,
        invalid: impl Fn(&'static str, String) -> ConfigError,
    ) -> Result<Self, ConfigError> {
        let d = Self::default();
        let allowed_units = file.allowed_units.unwrap_or(d.allowed_units);
        for u in &allowed_units {
            if !valid_unit_name(u) {
                return Err(invalid(
                    "actions.allowed_units",
                    format!("{u:?} is not a unit name (letters, digits, -_.@: only)"),
                ));
            }
        }
        let command = |key: &'static str, v: Option<Vec<String>>, default: Vec<String>| {
            let v = v.unwrap_or(default);
            if v.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(invalid(key, "must name a program".into()));
            }
            Ok(v)
        };
        let command_timeout = match file.command_timeout {
            None => d.command_timeout,
            Some(s) => crate::config::ranges::parse("actions.command_timeout", &s)
                .map_err(|e| invalid("actions.command_timeout", e))?,
        };
        let diagnostics_max_bytes = file
            .diagnostics_max_bytes
            .unwrap_or(d.diagnostics_max_bytes);
        if !(1024..=protocol::actions::MAX_DIAGNOSTICS_BYTES).contains(&diagnostics_max_bytes) {
            return Err(invalid(
                "actions.diagnostics_max_bytes",
                format!(
                    "{diagnostics_max_bytes} is outside 1024..={}",
                    protocol::actions::MAX_DIAGNOSTICS_BYTES
                ),
            ));
        }
        let state_dir = file.state_dir.unwrap_or(d.state_dir);
        if !state_dir.is_absolute() {
            return Err(invalid(
                "actions.state_dir",
                format!("{} is not an absolute path", state_dir.display()),
            ));
        }
        Ok(Self {
            journal_units: file.journal_units.unwrap_or_else(|| allowed_units.clone()),
            allowed_units,
            reboot: file.reboot.unwrap_or(d.reboot),
            collect_diagnostics: file.collect_diagnostics.unwrap_or(d.collect_diagnostics),
            restart_command: command(
                "actions.restart_command",
                file.restart_command,
                d.restart_command,
            )?,
            reboot_command: command(
                "actions.reboot_command",
                file.reboot_command,
                d.reboot_command,
            )?,
            command_timeout,
            state_dir,
            diagnostics_max_bytes,
            journal_command: command(
                "actions.journal_command",
                file.journal_command,
                d.journal_command,
            )?,
            kernel_log_command: command(
                "actions.kernel_log_command",
                file.kernel_log_command,
                d.kernel_log_command,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<ActionsConfig, ConfigError> {
        let f: ActionsFile = toml::from_str(text).unwrap();
        ActionsConfig::resolve(f, |key, detail| ConfigError::Invalid {
            key,
            origin: "test".into(),
            detail,
        })
    }

    #[test]
    fn defaults_allow_kubelet_containerd_and_diagnostics_but_not_reboot() {
        let c = resolve("").unwrap();
        assert_eq!(c.allowed_units, ["kubelet", "containerd"]);
        assert!(!c.reboot);
        assert!(c.collect_diagnostics);
        assert_eq!(c.diagnostics_max_bytes, 256 * 1024);
        assert_eq!(c.restart_command, ["systemctl", "restart", "--"]);
    }

    #[test]
    fn bad_units_sizes_and_commands_are_refused() {
        for (text, key) in [
            ("allowed_units = [\"-x\"]", "actions.allowed_units"),
            ("allowed_units = [\"a b\"]", "actions.allowed_units"),
            (
                "diagnostics_max_bytes = 10",
                "actions.diagnostics_max_bytes",
            ),
            ("restart_command = []", "actions.restart_command"),
            ("command_timeout = \"0s\"", "actions.command_timeout"),
            ("state_dir = \"rel\"", "actions.state_dir"),
        ] {
            match resolve(text) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
