//! Fence devices beside the BMCs: the settings of a BMC driven by a ClusterLabs fence agent
//! (`protocol = "fence-agent"`, `[bmc.agent]`), the rack's PDUs (`[[pdu]]`) and each
//! machine's lower fencing levels (`[[bmc.level]]`, lists of PDU outlets), with their checks:
//! the agent is installed, no option the gateway sets itself is given again, every outlet is
//! of a known PDU, and no outlet feeds two machines.
//!
//! Nothing here runs an agent; `bmc-gateway check` does ([`crate::check`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{BmcProtocol, Config, ConfigError, duration, loose_mode};
use crate::fence_agent::{DEFAULT_AGENT_TIMEOUT, find_agent};

/// Options the gateway gives an agent itself; refused in `options`.
pub const RESERVED_OPTIONS: &[&str] = &[
    "action",
    "plug",
    "port",
    "ip",
    "ipaddr",
    "ipport",
    "username",
    "login",
    "password",
    "passwd",
    "passwd_script",
    "password_script",
    "community",
];

fn default_agent_timeout() -> Duration {
    DEFAULT_AGENT_TIMEOUT
}

/// `[bmc.agent]`: the fence agent that drives a BMC.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// The agent, e.g. `fence_ipmilan` (looked up in `PATH` and `/usr/sbin`) or a path.
    pub name: String,
    /// More `key=value` options for the agent, e.g. `lanplus = "1"`, `ssl_insecure = "1"`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Limit for one run of the agent (`"40s"`).
    #[serde(default = "default_agent_timeout", with = "duration")]
    pub timeout: Duration,
}

/// `[[pdu]]`: a power distribution unit of the rack, driven by a fence agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PduConfig {
    /// The name outlets are given by in `[[bmc.level]]`, e.g. `pdu-a`.
    pub name: String,
    /// The agent, e.g. `fence_apc_snmp`.
    pub agent: String,
    /// The PDU's host name or address.
    pub host: String,
    /// Its port (default: the agent's own, e.g. 161 for SNMP).
    #[serde(default)]
    pub port: Option<u16>,
    /// User name, when the PDU has users.
    #[serde(default)]
    pub username: String,
    /// File holding the password or SNMP community (trailing newline ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The agent option the secret goes in: `password` (default) or `community` (SNMP v1/v2c).
    #[serde(default = "default_secret_option")]
    pub secret_option: String,
    /// More `key=value` options for the agent, e.g. `snmp_version = "2c"`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Limit for one run of the agent (`"40s"`).
    #[serde(default = "default_agent_timeout", with = "duration")]
    pub timeout: Duration,
}

fn default_secret_option() -> String {
    "password".into()
}

/// `[[bmc.level]]`: one lower fencing level of a machine: the outlets that must all go off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Outlets as `pdu:outlet`, e.g. `["pdu-a:3", "pdu-b:3"]` for two power supplies.
    pub outlets: Vec<String>,
}

/// An outlet named in a level.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Outlet {
    /// The PDU's name.
    pub pdu: String,
    /// The outlet (number or name, as the agent's `plug`).
    pub plug: String,
}

impl LevelConfig {
    /// The outlets, parsed (the configuration was validated).
    pub fn parsed(&self) -> Vec<Outlet> {
        self.outlets
            .iter()
            .filter_map(|o| parse_outlet(o))
            .collect()
    }
}

fn parse_outlet(s: &str) -> Option<Outlet> {
    let (pdu, plug) = s.rsplit_once(':')?;
    (!pdu.is_empty() && !plug.is_empty()).then(|| Outlet {
        pdu: pdu.into(),
        plug: plug.into(),
    })
}

impl PduConfig {
    /// `pdu-a (fence_apc_snmp 10.1.0.50)`.
    pub fn describe(&self) -> String {
        match self.port {
            Some(p) => format!("{} ({} {}:{p})", self.name, self.agent, self.host),
            None => format!("{} ({} {})", self.name, self.agent, self.host),
        }
    }

    /// Reads the secret (trailing newline stripped), when there is a file.
    pub fn read_secret(&self) -> Result<Option<String>, std::io::Error> {
        let Some(f) = &self.password_file else {
            return Ok(None);
        };
        let s = protocol::file::read_regular_to_string(f)?;
        Ok(Some(s.trim_end_matches(['\n', '\r']).to_string()))
    }

    /// The options every run of this PDU's agent gets, the secret included.
    pub fn agent_options(&self, secret: Option<String>) -> BTreeMap<String, String> {
        let mut o = self.options.clone();
        o.insert("ip".into(), self.host.clone());
        if let Some(p) = self.port {
            o.insert("ipport".into(), p.to_string());
        }
        if !self.username.is_empty() {
            o.insert("username".into(), self.username.clone());
        }
        if let Some(s) = secret {
            o.insert(self.secret_option.clone(), s);
        }
        o
    }
}

/// Checks an agent name: installed, naming the key when not.
fn check_agent(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("must name a fence agent, e.g. \"fence_ipmilan\"".into());
    }
    if find_agent(name).is_none() {
        return Err(format!(
            "fence agent {name:?} is not installed (looked along PATH and in /usr/sbin, /sbin, \
             /usr/local/sbin): install Debian's fence-agents package, or correct the name"
        ));
    }
    Ok(())
}

fn check_options(options: &BTreeMap<String, String>) -> Result<(), (String, String)> {
    for (k, v) in options {
        if RESERVED_OPTIONS.contains(&k.as_str()) {
            return Err((
                k.clone(),
                "the gateway sets this option itself (from host, port, username, the password \
                 file or the outlet); remove it here"
                    .into(),
            ));
        }
        if k.is_empty() || k.contains(['=', '\n']) || v.contains('\n') {
            return Err((
                k.clone(),
                "an option is one key=value line: no '=' in the key and no newline".into(),
            ));
        }
    }
    Ok(())
}

impl Config {
    /// Checks `[bmc.agent]`, `[[pdu]]` and `[[bmc.level]]`.
    pub(super) fn validate_devices(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: String, detail: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            detail,
        };
        for (i, b) in self.bmcs.iter().enumerate() {
            match (b.protocol, &b.agent) {
                (BmcProtocol::FenceAgent, None) => {
                    return Err(bad(
                        format!("bmc[{i}].agent"),
                        "a fence-agent BMC needs a [bmc.agent] table with name = \"fence_…\""
                            .into(),
                    ));
                }
                (BmcProtocol::FenceAgent, Some(a)) => {
                    check_agent(&a.name).map_err(|d| bad(format!("bmc[{i}].agent.name"), d))?;
                    check_options(&a.options)
                        .map_err(|(k, d)| bad(format!("bmc[{i}].agent.options.{k}"), d))?;
                    if a.timeout.is_zero() {
                        return Err(bad(
                            format!("bmc[{i}].agent.timeout"),
                            "must be more than 0s".into(),
                        ));
                    }
                }
                (_, Some(_)) => {
                    return Err(bad(
                        format!("bmc[{i}].agent"),
                        format!(
                            "an [bmc.agent] table on a {} BMC; set protocol = \"fence-agent\"",
                            b.protocol.as_str()
                        ),
                    ));
                }
                (_, None) => {}
            }
        }
        let mut pdus: HashMap<&str, usize> = HashMap::new();
        for (i, p) in self.pdus.iter().enumerate() {
            let key = |k: &str| format!("pdu[{i}].{k}");
            if p.name.trim().is_empty() || p.name.contains(':') {
                return Err(bad(
                    key("name"),
                    "a name without ':' (outlets are written pdu:outlet)".into(),
                ));
            }
            if let Some(j) = pdus.insert(p.name.as_str(), i) {
                return Err(bad(
                    key("name"),
                    format!("{:?} is also pdu[{j}]'s name", p.name),
                ));
            }
            check_agent(&p.agent).map_err(|d| bad(key("agent"), d))?;
            if p.host.trim().is_empty() || p.host.contains('/') {
                return Err(bad(
                    key("host"),
                    format!("{:?} is not a host name or address", p.host),
                ));
            }
            if p.port == Some(0) {
                return Err(bad(key("port"), "0 is not a port".into()));
            }
            if !matches!(p.secret_option.as_str(), "password" | "community") {
                return Err(bad(
                    key("secret_option"),
                    format!("{:?} is not password or community", p.secret_option),
                ));
            }
            check_options(&p.options).map_err(|(k, d)| bad(key(&format!("options.{k}")), d))?;
            if p.timeout.is_zero() {
                return Err(bad(key("timeout"), "must be more than 0s".into()));
            }
            match p.read_secret() {
                Err(e) => {
                    let f = p.password_file.as_deref().unwrap_or(Path::new(""));
                    return Err(bad(
                        key("password_file"),
                        format!("cannot read {}: {e}", f.display()),
                    ));
                }
                Ok(Some(s)) if s.is_empty() => {
                    let f = p.password_file.as_deref().unwrap_or(Path::new(""));
                    return Err(bad(
                        key("password_file"),
                        format!(
                            "{} is empty: write the PDU's {} into it",
                            f.display(),
                            p.secret_option
                        ),
                    ));
                }
                _ => {}
            }
            if let Some(mode) = p.password_file.as_deref().and_then(loose_mode) {
                tracing::warn!(pdu = %p.name, mode = %format!("{mode:04o}"), "PDU password file is readable or writable by others: chmod 600 it");
            }
        }
        // Which machine each outlet feeds: an outlet shared by two machines would power off
        // the other one, which its read-back would then confirm off.
        let mut fed: HashMap<Outlet, (usize, &str)> = HashMap::new();
        for (i, b) in self.bmcs.iter().enumerate() {
            for (l, level) in b.levels.iter().enumerate() {
                let mut mine: HashSet<Outlet> = HashSet::new();
                if level.outlets.is_empty() {
                    return Err(bad(
                        format!("bmc[{i}].level[{l}].outlets"),
                        "a level needs at least one outlet".into(),
                    ));
                }
                for (o, text) in level.outlets.iter().enumerate() {
                    let key = format!("bmc[{i}].level[{l}].outlets[{o}]");
                    let Some(outlet) = parse_outlet(text) else {
                        return Err(bad(
                            key,
                            format!("{text:?} is not pdu:outlet, e.g. \"pdu-a:3\""),
                        ));
                    };
                    if !pdus.contains_key(outlet.pdu.as_str()) {
                        return Err(bad(key, format!("no [[pdu]] is named {:?}", outlet.pdu)));
                    }
                    if let Some((j, other)) = fed.get(&outlet).filter(|(j, _)| *j != i) {
                        return Err(bad(
                            key,
                            format!(
                                "outlet {text} also feeds bmc[{j}]'s machine {other}: one outlet feeds one \
                                 machine, and fencing {} through it would power off {other}; fix the outlet",
                                b.machine
                            ),
                        ));
                    }
                    if !mine.insert(outlet.clone()) {
                        return Err(bad(
                            key,
                            format!("outlet {text} is named twice in this level"),
                        ));
                    }
                    fed.insert(outlet, (i, b.machine.as_str()));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Config, ConfigError};

    fn parse(dir: &Path, body: &str) -> Result<Config, ConfigError> {
        use std::os::unix::fs::PermissionsExt;
        let pw = dir.join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        // `true` stands for an installed agent: any program found along PATH is one here.
        let text = format!(
            "listen = \"127.0.0.1:7443\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n\
             [[pdu]]\nname = \"pdu-a\"\nagent = \"true\"\nhost = \"10.1.0.50\"\npassword_file = \"{pw}\"\nsecret_option = \"community\"\n\
             {body}",
            pw = pw.display()
        );
        Config::parse(
            Path::new("gw.toml"),
            &text.replace("@PW@", &pw.display().to_string()),
        )
    }

    fn bmc(m: &str, host: &str, outlets: &str) -> String {
        format!(
            "[[bmc]]\nmachine = \"{m}\"\nprotocol = \"ipmi\"\nhost = \"{host}\"\nusername = \"u\"\npassword_file = \"@PW@\"\n[[bmc.level]]\noutlets = [{outlets}]\n"
        )
    }

    fn key_of(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid { key, detail, .. } => format!("{key}: {detail}"),
            other => panic!("expected Invalid, got {other}"),
        }
    }

    #[test]
    fn levels_parse_with_their_outlets() {
        let d = tempfile::tempdir().unwrap();
        let cfg = parse(d.path(), &bmc("a", "h1", "\"pdu-a:1\", \"pdu-a:2\"")).unwrap();
        let outlets = cfg.bmcs[0].levels[0].parsed();
        assert_eq!(outlets.len(), 2);
        assert_eq!(
            (outlets[1].pdu.as_str(), outlets[1].plug.as_str()),
            ("pdu-a", "2")
        );
        let o = cfg.pdus[0].agent_options(Some("c0mm".into()));
        assert_eq!(o.get("community").map(String::as_str), Some("c0mm"));
        assert_eq!(o.get("ip").map(String::as_str), Some("10.1.0.50"));
    }

    /// Issue 32, item 3: one outlet feeding two machines would power off the other one.
    #[test]
    fn an_outlet_feeding_two_machines_is_refused_naming_both() {
        let d = tempfile::tempdir().unwrap();
        let e = parse(
            d.path(),
            &format!(
                "{}{}",
                bmc("a", "h1", "\"pdu-a:1\""),
                bmc("b", "h2", "\"pdu-a:3\", \"pdu-a:1\"")
            ),
        )
        .unwrap_err();
        let k = key_of(e);
        assert!(
            k.starts_with(
                "bmc[1].level[0].outlets[1]: outlet pdu-a:1 also feeds bmc[0]'s machine a"
            ),
            "{k}"
        );
        let e = parse(d.path(), &bmc("a", "h1", "\"pdu-a:1\", \"pdu-a:1\"")).unwrap_err();
        assert!(key_of(e).contains("named twice"));
    }

    #[test]
    fn bad_devices_are_refused_naming_the_key() {
        let d = tempfile::tempdir().unwrap();
        for (body, want) in [
            (bmc("a", "h1", "\"pdu-z:1\""), "bmc[0].level[0].outlets[0]: no [[pdu]] is named \"pdu-z\""),
            (bmc("a", "h1", "\"pdu-a\""), "bmc[0].level[0].outlets[0]: \"pdu-a\" is not pdu:outlet"),
            (bmc("a", "h1", ""), "bmc[0].level[0].outlets: a level needs at least one outlet"),
            (
                "[[bmc]]\nmachine = \"a\"\nprotocol = \"fence-agent\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n[bmc.agent]\nname = \"fence_no_such_agent\"\n".into(),
                "bmc[0].agent.name: fence agent \"fence_no_such_agent\" is not installed",
            ),
            (
                "[[bmc]]\nmachine = \"a\"\nprotocol = \"fence-agent\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n[bmc.agent]\nname = \"true\"\n[bmc.agent.options]\npassword = \"inline\"\n".into(),
                "bmc[0].agent.options.password: the gateway sets this option itself",
            ),
            (
                "[[bmc]]\nmachine = \"a\"\nprotocol = \"fence-agent\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n".into(),
                "bmc[0].agent: a fence-agent BMC needs a [bmc.agent] table",
            ),
        ] {
            let k = key_of(parse(d.path(), &body).unwrap_err());
            assert!(k.starts_with(want), "{body}\n{k}");
        }
    }
}
