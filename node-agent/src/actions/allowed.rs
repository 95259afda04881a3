//! Whether the actions `[actions]` allows would be carried out, for `node-agent check`. The
//! service runs as the unprivileged dynamic user `node-agent`, so `systemctl restart` and
//! `systemctl reboot` go to systemd over D-Bus and polkit decides: without `polkitd` (a
//! minimal Debian server has none) systemd refuses them all, every `@restart-unit` and
//! `@reboot` step fails, and repair procedures go on to power actions. With it, a rule must
//! name the user and the unit (the package installs one for kubelet and containerd).
//!
//! It reads files under the agent's `root` and asks nobody: a rule file that names the unit
//! is taken as allowing it (polkit's JavaScript is not run here), so an `ok` line says "a
//! rule is there", and a `fail` or `warn` line is certain.

use std::path::{Path, PathBuf};

use protocol::messages::CheckStatus;

use crate::agent::preflight::SetupRow;
use crate::config::Config;

/// Where Debian's `polkitd` (and older `policykit-1`) and other distributions put the daemon.
const POLKITD: [&str; 3] = [
    "usr/lib/polkit-1/polkitd",
    "usr/libexec/polkitd",
    "usr/libexec/polkit-1/polkitd",
];

/// Where polkit reads rules from: local ones, then packaged ones.
const RULE_DIRS: [&str; 2] = ["etc/polkit-1/rules.d", "usr/share/polkit-1/rules.d"];

/// The user the packaged unit runs the agent as (`DynamicUser=yes`, `User=node-agent`).
const SERVICE_USER: &str = "node-agent";

/// The `check` lines about the actions `cfg` allows.
pub fn rows(cfg: &Config) -> Vec<SetupRow> {
    let a = &cfg.actions;
    let polkit = Polkit::read(&cfg.root);
    let mut rows = Vec::new();
    let row = |subject: String, status, detail: String| SetupRow {
        kind: "actions",
        subject,
        status,
        detail,
    };
    if a.allowed_units.is_empty() {
        rows.push(row(
            "restart-unit".into(),
            CheckStatus::Ok,
            "off (allowed_units = [])".into(),
        ));
    }
    for unit in &a.allowed_units {
        let unit_file = if unit.contains('.') {
            unit.clone()
        } else {
            format!("{unit}.service")
        };
        let (status, detail) = verdict(
            &a.restart_command,
            &polkit,
            &format!("\"{unit_file}\""),
            &format!("restart {unit_file}"),
        );
        rows.push(row(format!("restart-unit {unit}"), status, detail));
    }
    if a.reboot {
        let (status, detail) = verdict(
            &a.reboot_command,
            &polkit,
            "org.freedesktop.login1.reboot",
            "reboot",
        );
        rows.push(row("reboot".into(), status, detail));
    } else {
        rows.push(row(
            "reboot".into(),
            CheckStatus::Ok,
            "off (reboot = false)".into(),
        ));
    }
    rows
}

/// What polkit would have to go on: its daemon, and its rule files' text.
struct Polkit {
    daemon: Option<PathBuf>,
    rules: Vec<(PathBuf, String)>,
}

impl Polkit {
    fn read(root: &Path) -> Self {
        let daemon = POLKITD.iter().map(|p| root.join(p)).find(|p| p.is_file());
        let mut rules = Vec::new();
        for dir in RULE_DIRS {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "rules"))
                .collect();
            files.sort();
            for f in files {
                if let Ok(text) = protocol::file::read_regular_to_string(&f) {
                    rules.push((f, text));
                }
            }
        }
        Polkit { daemon, rules }
    }

    /// The first rule file naming the service user and `needle`.
    fn rule_naming(&self, needle: &str) -> Option<&Path> {
        self.rules
            .iter()
            .find(|(_, t)| t.contains(&format!("\"{SERVICE_USER}\"")) && t.contains(needle))
            .map(|(p, _)| p.as_path())
    }
}

/// Whether `command` would be allowed to do `what`, judged from `polkit`: a command other
/// than `systemctl` is the operator's own (polkit is not asked), `systemctl` needs polkitd
/// and a rule naming `needle`.
fn verdict(command: &[String], polkit: &Polkit, needle: &str, what: &str) -> (CheckStatus, String) {
    let program = command.first().map(String::as_str).unwrap_or("");
    if Path::new(program)
        .file_name()
        .is_none_or(|n| n != "systemctl")
    {
        return (
            CheckStatus::Ok,
            format!(
                "by `{}` (not systemctl: polkit is not asked)",
                command.join(" ")
            ),
        );
    }
    let Some(daemon) = &polkit.daemon else {
        return (
            CheckStatus::Fail,
            format!(
                "polkitd is not installed: systemd will not let the agent's user {SERVICE_USER} {what}, so the repair step fails and procedures go on to power actions; install it (`apt install polkitd`)"
            ),
        );
    };
    match polkit.rule_naming(needle) {
        Some(rule) => (
            CheckStatus::Ok,
            format!(
                "polkit ({}) has a rule letting {SERVICE_USER} {what}: {}",
                daemon.display(),
                rule.display()
            ),
        ),
        None => (
            CheckStatus::Fail,
            format!(
                "no polkit rule lets {SERVICE_USER} {what}: the repair step would be refused; add a rule under /etc/polkit-1/rules.d/ (the packaged /usr/share/polkit-1/rules.d/50-fleetmend-node-agent.rules shows the shape)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use crate::testkit_fixture::NodeFixture;

    const PACKAGED_RULE: &str =
        include_str!("../../../packaging/node-agent/50-fleetmend-node-agent.rules");

    fn config(fx: &NodeFixture, actions: &str) -> Config {
        let path = fx.path_of("etc/fleetmend/node-agent.toml");
        fx.write(
            "etc/fleetmend/node-agent.toml",
            &format!(
                "root = {:?}\nhostname = \"n1\"\n[actions]\n{actions}\n",
                fx.root().display().to_string()
            ),
        )
        .unwrap();
        Config::load(&Settings {
            config: Some(path),
            ..Settings::default()
        })
        .unwrap()
    }

    fn status_of<'r>(rows: &'r [SetupRow], subject: &str) -> &'r SetupRow {
        rows.iter()
            .find(|r| r.subject == subject)
            .unwrap_or_else(|| panic!("no {subject} in {rows:?}"))
    }

    #[test]
    fn without_polkitd_every_systemctl_action_is_said_to_be_refused() {
        let fx = NodeFixture::builder("n1").build().unwrap();
        fx.write(
            "usr/share/polkit-1/rules.d/50-fleetmend-node-agent.rules",
            PACKAGED_RULE,
        )
        .unwrap();
        let lines = rows(&config(&fx, "reboot = true"));
        for subject in ["restart-unit kubelet", "restart-unit containerd", "reboot"] {
            let r = status_of(&lines, subject);
            assert_eq!(r.status, CheckStatus::Fail, "{r:?}");
            assert!(r.detail.starts_with("polkitd is not installed"), "{r:?}");
            assert!(r.detail.contains("apt install polkitd"), "{r:?}");
        }
    }

    #[test]
    fn with_polkitd_the_packaged_rule_allows_its_units_and_reboot_only() {
        let fx = NodeFixture::builder("n1").build().unwrap();
        fx.write("usr/lib/polkit-1/polkitd", "").unwrap();
        fx.write(
            "usr/share/polkit-1/rules.d/50-fleetmend-node-agent.rules",
            PACKAGED_RULE,
        )
        .unwrap();
        let lines = rows(&config(
            &fx,
            "allowed_units = [\"kubelet\", \"containerd\", \"crio\"]\nreboot = true",
        ));
        for subject in ["restart-unit kubelet", "restart-unit containerd", "reboot"] {
            let r = status_of(&lines, subject);
            assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
            assert!(r.detail.contains("50-fleetmend-node-agent.rules"), "{r:?}");
        }
        let crio = status_of(&lines, "restart-unit crio");
        assert_eq!(crio.status, CheckStatus::Fail, "{crio:?}");
        assert!(
            crio.detail
                .contains("no polkit rule lets node-agent restart crio.service"),
            "{crio:?}"
        );
        // A local rule naming it fixes that.
        fx.write(
            "etc/polkit-1/rules.d/51-local.rules",
            &PACKAGED_RULE.replace("containerd.service", "crio.service"),
        )
        .unwrap();
        let lines = rows(&config(&fx, "allowed_units = [\"crio\"]"));
        assert_eq!(
            status_of(&lines, "restart-unit crio").status,
            CheckStatus::Ok
        );
        assert_eq!(status_of(&lines, "reboot").detail, "off (reboot = false)");
    }

    #[test]
    fn a_command_of_the_operators_own_is_not_judged_by_polkit() {
        let fx = NodeFixture::builder("n1").build().unwrap();
        let lines = rows(&config(
            &fx,
            "restart_command = [\"/usr/local/bin/restart\"]",
        ));
        let r = status_of(&lines, "restart-unit kubelet");
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        assert!(r.detail.contains("polkit is not asked"), "{r:?}");
    }
}
