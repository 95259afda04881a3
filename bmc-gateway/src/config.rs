//! The gateway's configuration file (TOML): where it listens, its certificates, and the rack's
//! BMCs with how to reach each one.
//!
//! Loading validates everything that can be checked without talking to a BMC: unknown keys,
//! duplicate machines, unsupported IPMI cipher suites, Redfish TLS trust, and that every
//! password file is readable. Passwords are only ever read from files, never written inline.
//! This module does not open any connection. The checks themselves are in
//! `config/validate.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod devices;
mod validate;

pub use devices::{AgentSettings, LevelConfig, Outlet, PduConfig, RESERVED_OPTIONS};

/// Default time a fence waits for the power state to read off.
///
/// 60 s: a hard power-off is immediate on real BMCs but the state they report can lag by tens of
/// seconds (and Redfish emulators apply it after up to ~11 s); past a minute something is wrong.
pub const DEFAULT_FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default overall limit for a non-fence action.
///
/// 30 s: long enough for a session set-up plus a few retransmissions and a Redfish task, short
/// enough that the repair queue learns of a dead BMC quickly.
pub const DEFAULT_ACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// UDP address the QUIC service listens on, e.g. `0.0.0.0:7444`.
    pub listen: SocketAddr,
    /// Plain-HTTP address for `/metrics` and `/healthz`; omitted = no HTTP listener.
    #[serde(default)]
    pub http_listen: Option<SocketAddr>,
    /// The gateway's certificate, key and the fleet CA.
    pub tls: TlsConfig,
    /// Directory for the gateway's own state: the record of executed request ids
    /// (`requests.log`), which makes "at most once per id" hold across restarts.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Default and per-action limits.
    #[serde(default)]
    pub limits: Limits,
    /// The rack's BMCs.
    #[serde(default, rename = "bmc")]
    pub bmcs: Vec<BmcConfig>,
    /// The rack's PDUs, whose outlets make the machines' lower fencing levels.
    #[serde(default, rename = "pdu")]
    pub pdus: Vec<PduConfig>,
}

/// The gateway's TLS files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Fleet CA certificate (PEM).
    pub ca: PathBuf,
    /// The gateway's certificate (PEM), naming `spiffe://<domain>/gateway/<rack>`.
    pub cert: PathBuf,
    /// The gateway's private key (PEM).
    pub key: PathBuf,
}

/// Time limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Overall limit for an action when the request does not give one (`"30s"`).
    #[serde(default = "default_action", with = "duration")]
    pub action_timeout: Duration,
    /// How long a fence waits for the power state to read off (`"60s"`).
    #[serde(default = "default_fence", with = "duration")]
    pub fence_timeout: Duration,
    /// How long a power-on refused as busy (IPMI 0xC0, Redfish 409) is asked again; `"0s"` =
    /// never. Also added to the default limit of `on` and `cycle` requests.
    #[serde(default = "default_busy_retry", with = "duration")]
    pub power_on_busy_retry: Duration,
    /// Minimum interval between two commands to one BMC (`"300ms"`; a BMC may set its own in
    /// `[[bmc]]`).
    #[serde(default = "default_min_interval", with = "duration")]
    pub min_command_interval: Duration,
}

/// `/var/lib/fleetmend-gateway`: the systemd unit's `StateDirectory=`, writable by the
/// unit's dynamic user and kept across restarts and upgrades.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/fleetmend-gateway";

fn default_state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}

fn default_action() -> Duration {
    DEFAULT_ACTION_TIMEOUT
}
fn default_fence() -> Duration {
    DEFAULT_FENCE_TIMEOUT
}
fn default_busy_retry() -> Duration {
    crate::pace::DEFAULT_BUSY_RETRY
}
fn default_min_interval() -> Duration {
    crate::pace::DEFAULT_MIN_INTERVAL
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            action_timeout: default_action(),
            fence_timeout: default_fence(),
            power_on_busy_retry: default_busy_retry(),
            min_command_interval: default_min_interval(),
        }
    }
}

/// Which protocol a BMC speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BmcProtocol {
    /// IPMI 2.0 over LAN (RMCP+).
    Ipmi,
    /// Redfish over HTTPS.
    Redfish,
    /// A ClusterLabs fence agent (`[bmc.agent]`), e.g. `fence_ipmilan` or `fence_redfish`.
    FenceAgent,
}

impl BmcProtocol {
    /// Lower-case name, as used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            BmcProtocol::Ipmi => "ipmi",
            BmcProtocol::Redfish => "redfish",
            BmcProtocol::FenceAgent => "fence-agent",
        }
    }
}

/// One BMC and the machine it belongs to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcConfig {
    /// The machine's address (as the coordinator names it).
    pub machine: String,
    /// The machine's serial; a request naming another serial is refused. Empty = not checked.
    #[serde(default)]
    pub serial: String,
    /// `ipmi`, `redfish` or `fence-agent`.
    pub protocol: BmcProtocol,
    /// BMC host name or address.
    pub host: String,
    /// BMC port (default 623 for IPMI, 443 for Redfish).
    #[serde(default)]
    pub port: Option<u16>,
    /// BMC user name.
    pub username: String,
    /// File holding the BMC password (trailing newline ignored).
    pub password_file: PathBuf,
    /// IPMI settings.
    #[serde(default)]
    pub ipmi: Option<IpmiSettings>,
    /// Redfish settings.
    #[serde(default)]
    pub redfish: Option<RedfishSettings>,
    /// The fence agent, for `protocol = "fence-agent"`.
    #[serde(default)]
    pub agent: Option<AgentSettings>,
    /// Lower fencing levels (`[[bmc.level]]`), tried in order when the BMC (level 1) cannot
    /// be reached or refuses.
    #[serde(default, rename = "level")]
    pub levels: Vec<LevelConfig>,
    /// Minimum interval between two commands to this BMC (default:
    /// `limits.min_command_interval`); some BMCs need seconds.
    #[serde(default, with = "opt_duration")]
    pub min_command_interval: Option<Duration>,
}

/// IPMI-specific settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpmiSettings {
    /// RMCP+ cipher suite. Only 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128) is supported.
    #[serde(default = "default_cipher_suite")]
    pub cipher_suite: u8,
    /// Time to wait for one reply datagram (`"1s"`).
    #[serde(default = "default_ipmi_reply", with = "duration")]
    pub reply_timeout: Duration,
    /// How many times a request is sent before the BMC is declared unresponsive.
    #[serde(default = "default_ipmi_attempts")]
    pub attempts: u32,
}

fn default_cipher_suite() -> u8 {
    3
}
/// 1 s: a BMC on the rack network answers in milliseconds; a datagram not answered within a
/// second is lost, and waiting longer only delays the retransmission.
fn default_ipmi_reply() -> Duration {
    Duration::from_secs(1)
}
/// 3 attempts: ipmitool's default retry count; more only hides a dead BMC for longer.
fn default_ipmi_attempts() -> u32 {
    3
}

impl Default for IpmiSettings {
    fn default() -> Self {
        Self {
            cipher_suite: default_cipher_suite(),
            reply_timeout: default_ipmi_reply(),
            attempts: default_ipmi_attempts(),
        }
    }
}

/// Redfish-specific settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishSettings {
    /// The ComputerSystem id under `/redfish/v1/Systems/`, or `discover` to use the only one.
    #[serde(default = "default_system")]
    pub system: String,
    /// `https` (default) or `http` (labs only; logged loudly).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// CA certificate (PEM) that the BMC's certificate must chain to.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate. Must be set explicitly; logged loudly at start.
    #[serde(default)]
    pub insecure: bool,
    /// `basic` (default), `session` (SessionService login), or `auto` (session when offered).
    #[serde(default = "default_auth")]
    pub auth: String,
    /// Per HTTP request timeout (`"10s"`).
    #[serde(default = "default_http", with = "duration")]
    pub request_timeout: Duration,
}

fn default_system() -> String {
    "discover".into()
}
fn default_scheme() -> String {
    "https".into()
}
fn default_auth() -> String {
    "auto".into()
}
/// 10 s: BMC web servers are slow (hundreds of ms is common, seconds under load) but a request
/// pending longer than this is not going to complete.
fn default_http() -> Duration {
    Duration::from_secs(10)
}

/// Serde helpers for duration strings (`"30s"`, `"250ms"`, `"1m 30s"`), written like the
/// coordinator's: a bare number is refused with a message that says to add a unit.
mod duration;

/// Serde helpers for optional duration strings (absent = `None`).
mod opt_duration {
    use std::time::Duration;

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(d).map(Some)
    }
}

/// A configuration problem, naming the key at fault.
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
    /// The TOML is malformed or has unknown/missing keys.
    #[error("config {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said (it names the key and line).
        detail: String,
    },
    /// A value is not acceptable.
    #[error("config {path}: {key}: {detail}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `bmc[2].ipmi.cipher_suite`.
        key: String,
        /// What is wrong and what to do.
        detail: String,
    },
}

impl ConfigError {
    /// Never retriable: the file must be fixed.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

impl BmcConfig {
    /// The port, with the protocol's default (0 for a fence agent: the agent's own).
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(match self.protocol {
            BmcProtocol::Ipmi => 623,
            BmcProtocol::Redfish => 443,
            BmcProtocol::FenceAgent => 0,
        })
    }

    /// `host:port`, or the host alone when a fence agent uses its default port.
    pub fn address(&self) -> String {
        match self.port() {
            0 => self.host.clone(),
            p => format!("{}:{p}", self.host),
        }
    }

    /// The options every run of this BMC's fence agent gets, the password included.
    pub fn agent_options(&self, password: String) -> std::collections::BTreeMap<String, String> {
        let mut o = self
            .agent
            .as_ref()
            .map(|a| a.options.clone())
            .unwrap_or_default();
        o.insert("ip".into(), self.host.clone());
        if let Some(p) = self.port {
            o.insert("ipport".into(), p.to_string());
        }
        o.insert("username".into(), self.username.clone());
        o.insert("password".into(), password);
        o
    }

    /// IPMI settings with defaults.
    pub fn ipmi_settings(&self) -> IpmiSettings {
        self.ipmi.clone().unwrap_or_default()
    }

    /// A short name for logs and metrics: `machine (protocol host:port)`.
    pub fn describe(&self) -> String {
        match &self.agent {
            Some(a) if self.protocol == BmcProtocol::FenceAgent => {
                format!("{} ({} {})", self.machine, a.name, self.address())
            }
            _ => format!(
                "{} ({} {})",
                self.machine,
                self.protocol.as_str(),
                self.address()
            ),
        }
    }

    /// Reads the password file (trailing newline stripped); a FIFO or a device is refused,
    /// not waited on.
    pub fn read_password(&self) -> Result<String, std::io::Error> {
        let s = protocol::file::read_regular_to_string(&self.password_file)?;
        Ok(s.trim_end_matches(['\n', '\r']).to_string())
    }
}

/// The permission bits of `path` when group or others may read or write it (a BMC password
/// file should be the gateway's alone), else `None`.
pub fn loose_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o066 != 0).then_some(mode)
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        // Not std::fs::read_to_string: `--config` naming a FIFO waited for a writer forever,
        // and /dev/zero was read until the kernel killed the process for memory.
        let text =
            protocol::file::read_regular_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        Self::parse(path, &text)
    }

    /// Parses and validates configuration text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        cfg.validate(path)?;
        cfg.validate_devices(path)?;
        Ok(cfg)
    }

    /// The BMC serving `machine`, if any.
    pub fn bmc(&self, machine: &str) -> Option<&BmcConfig> {
        self.bmcs.iter().find(|b| b.machine == machine)
    }

    /// The PDU named `name`, if any.
    pub fn pdu(&self, name: &str) -> Option<&PduConfig> {
        self.pdus.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("pw"), "secret\n").unwrap();
            let ca = protocol::pki::Ca::generate("bmc.test").unwrap();
            std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
            Self { dir }
        }
        fn parse(&self, bmcs: &str) -> Result<Config, ConfigError> {
            let text = format!(
                "listen = \"127.0.0.1:7443\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n{}",
                bmcs.replace("@PW@", &self.dir.path().join("pw").display().to_string())
                    .replace(
                        "@CA@",
                        &self.dir.path().join("ca.pem").display().to_string()
                    )
            );
            Config::parse(Path::new("gw.toml"), &text)
        }
    }

    fn key_of(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid { key, .. } => key,
            other => panic!("expected Invalid, got {other}"),
        }
    }

    #[test]
    fn accepts_ipmi_and_redfish() {
        let f = Fixture::new();
        let cfg = f
            .parse(
                r#"
[[bmc]]
machine = "10.0.0.1"
serial = "S1"
protocol = "ipmi"
host = "10.1.0.1"
username = "admin"
password_file = "@PW@"

[[bmc]]
machine = "10.0.0.2"
protocol = "redfish"
host = "10.1.0.2"
username = "admin"
password_file = "@PW@"
[bmc.redfish]
ca_file = "@CA@"
"#,
            )
            .unwrap();
        assert_eq!(cfg.bmcs.len(), 2);
        assert_eq!(cfg.bmcs[0].port(), 623);
        assert_eq!(cfg.bmcs[1].port(), 443);
        assert_eq!(cfg.bmcs[0].read_password().unwrap(), "secret");
        assert_eq!(cfg.bmcs[1].redfish.as_ref().unwrap().system, "discover");
        assert_eq!(cfg.limits.fence_timeout, Duration::from_secs(60));
        assert_eq!(cfg.limits.power_on_busy_retry, Duration::from_secs(90));
        assert_eq!(cfg.limits.min_command_interval, Duration::from_millis(300));
        assert_eq!(cfg.bmcs[0].min_command_interval, None);
    }

    #[test]
    fn an_empty_password_file_is_refused_naming_it() {
        let f = Fixture::new();
        let bmc = "[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n";
        for empty in ["", "\n"] {
            std::fs::write(f.dir.path().join("pw"), empty).unwrap();
            let e = f.parse(bmc).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("pw is empty: write the BMC user's password"),
                "{msg}"
            );
            assert_eq!(key_of(e), "bmc[0].password_file");
        }
    }

    #[test]
    fn durations_are_strings_with_units_and_bare_numbers_are_refused() {
        let f = Fixture::new();
        let bmc = "[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n";
        let cfg = f
            .parse(&format!(
                "[limits]\naction_timeout = \"45s\"\nfence_timeout = \"2m\"\npower_on_busy_retry = \"0s\"\nmin_command_interval = \"250ms\"\n{bmc}min_command_interval = \"2s\"\n[bmc.ipmi]\nreply_timeout = \"500ms\"\n"
            ))
            .unwrap();
        assert_eq!(cfg.limits.action_timeout, Duration::from_secs(45));
        assert_eq!(cfg.limits.fence_timeout, Duration::from_secs(120));
        assert_eq!(cfg.limits.power_on_busy_retry, Duration::ZERO);
        assert_eq!(cfg.limits.min_command_interval, Duration::from_millis(250));
        assert_eq!(
            cfg.bmcs[0].min_command_interval,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            cfg.bmcs[0].ipmi_settings().reply_timeout,
            Duration::from_millis(500)
        );
        for text in [
            "[limits]\naction_timeout = 30\n".to_string(),
            format!("{bmc}min_command_interval = 30\n"),
            format!("{bmc}[bmc.ipmi]\nreply_timeout = 30\n"),
        ] {
            let msg = f.parse(&text).unwrap_err().to_string();
            assert!(
                msg.contains("30 has no unit") && msg.contains("\"30s\""),
                "{text}: {msg}"
            );
        }
        let msg = f
            .parse("[limits]\nfence_timeout = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is not a duration like"), "{msg}");
        let e = f.parse("[limits]\nfence_timeout = \"0s\"\n").unwrap_err();
        assert_eq!(key_of(e), "limits.fence_timeout");
    }

    #[test]
    fn refuses_unknown_key_naming_it() {
        let f = Fixture::new();
        let e = f
            .parse("[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\npassword = \"inline\"\n")
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("password"), "{msg}");
        assert!(msg.contains("unknown field"), "{msg}");
    }

    #[test]
    fn refuses_other_cipher_suites() {
        let f = Fixture::new();
        let e = f
            .parse("[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n[bmc.ipmi]\ncipher_suite = 17\n")
            .unwrap_err();
        assert!(e.to_string().contains("only cipher suite 3"), "{e}");
        assert_eq!(key_of(e), "bmc[0].ipmi.cipher_suite");
    }

    #[test]
    fn redfish_needs_explicit_trust() {
        let f = Fixture::new();
        let base = "[[bmc]]\nmachine = \"m\"\nprotocol = \"redfish\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n";
        assert_eq!(
            key_of(f.parse(&format!("{base}[bmc.redfish]\n")).unwrap_err()),
            "bmc[0].redfish.ca_file"
        );
        assert_eq!(key_of(f.parse(base).unwrap_err()), "bmc[0].redfish");
        assert!(
            f.parse(&format!("{base}[bmc.redfish]\ninsecure = true\n"))
                .is_ok()
        );
        assert_eq!(
            key_of(
                f.parse(&format!(
                    "{base}[bmc.redfish]\ninsecure = true\nca_file = \"@CA@\"\n"
                ))
                .unwrap_err()
            ),
            "bmc[0].redfish.insecure"
        );
        // A CA file that holds no certificate was found only when the client was built, as
        // "BMC … sent an unexpected answer to TLS configuration".
        assert!(
            f.parse(&format!("{base}[bmc.redfish]\nca_file = \"@CA@\"\n"))
                .is_ok()
        );
        let e = f
            .parse(&format!("{base}[bmc.redfish]\nca_file = \"@PW@\"\n"))
            .unwrap_err();
        assert!(e.to_string().contains("holds no certificate"), "{e}");
        assert_eq!(key_of(e), "bmc[0].redfish.ca_file");
        // A URL or host:port as host, and port 0: refused, naming the key.
        for (line, k) in [
            ("host = \"https://h\"", "bmc[0].host"),
            ("host = \"h:443\"", "bmc[0].host"),
            ("host = \"h\"\nport = 0", "bmc[0].port"),
        ] {
            let b = base.replace("host = \"h\"", line);
            let text = format!("{b}[bmc.redfish]\ninsecure = true\n");
            assert_eq!(key_of(f.parse(&text).unwrap_err()), k, "{line}");
        }
        let b = base.replace("host = \"h\"", "host = \"fd00::1\"");
        assert!(
            f.parse(&format!("{b}[bmc.redfish]\ninsecure = true\n"))
                .is_ok()
        );
        // scheme = "http" with TLS settings: a mistake, refused rather than sent in clear.
        for tls in ["insecure = true\n", "ca_file = \"@CA@\"\n"] {
            assert_eq!(
                key_of(
                    f.parse(&format!("{base}[bmc.redfish]\nscheme = \"http\"\n{tls}"))
                        .unwrap_err()
                ),
                "bmc[0].redfish.scheme",
                "{tls}"
            );
        }
        assert!(
            f.parse(&format!("{base}[bmc.redfish]\nscheme = \"http\"\n"))
                .is_ok()
        );
    }

    #[test]
    fn packaged_default_config_parses() {
        let text = include_str!("../../packaging/bmc-gateway/bmc-gateway.toml");
        let cfg = Config::parse(Path::new("bmc-gateway.toml"), text).unwrap();
        assert!(cfg.bmcs.is_empty());
        assert_eq!(cfg.limits.fence_timeout, Duration::from_secs(60));
        assert_eq!(cfg.limits.action_timeout, Duration::from_secs(30));
        assert_eq!(cfg.state_dir, Path::new(DEFAULT_STATE_DIR));
    }

    #[test]
    fn password_files_open_to_others_are_noticed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(loose_mode(&pw), Some(0o644));
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(loose_mode(&pw), None);
    }

    /// `--config` naming a FIFO hung `check` and the start with no word (and `/dev/zero` was
    /// read until the process was killed for memory): anything but a regular file is refused.
    #[test]
    fn a_config_that_is_not_a_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("gateway.toml");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(Config::load(&fifo).map(|_| ())));
        let e = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("loading a FIFO hangs")
            .unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = Config::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
    }

    #[test]
    fn refuses_missing_password_file_and_duplicates() {
        let f = Fixture::new();
        let e = f
            .parse("[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"/nonexistent/pw\"\n")
            .unwrap_err();
        assert_eq!(key_of(e), "bmc[0].password_file");
        let one = "[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n";
        let e = f.parse(&format!("{one}{one}")).unwrap_err();
        assert_eq!(key_of(e), "bmc[1].machine");
    }

    /// A copied [[bmc]] table with only `machine` changed: fencing one machine powered off
    /// the other and confirmed it off, so the first, still running, would be released.
    #[test]
    fn two_machines_on_one_bmc_are_refused() {
        let f = Fixture::new();
        let ipmi = |m: &str, host: &str| {
            format!(
                "[[bmc]]\nmachine = \"{m}\"\nprotocol = \"ipmi\"\nhost = \"{host}\"\nusername = \"u\"\npassword_file = \"@PW@\"\n"
            )
        };
        let e = f
            .parse(&format!("{}{}", ipmi("a", "bmc-1"), ipmi("b", "BMC-1")))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("BMC-1:623 is also bmc[0]'s (machine a)"),
            "{e}"
        );
        assert_eq!(key_of(e), "bmc[1].host");
        assert!(
            f.parse(&format!("{}{}", ipmi("a", "bmc-1"), ipmi("b", "bmc-2")))
                .is_ok()
        );
        // One Redfish service with several systems serves several machines, one system each.
        let rf = |m: &str, sys: &str| {
            format!(
                "[[bmc]]\nmachine = \"{m}\"\nprotocol = \"redfish\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"@PW@\"\n[bmc.redfish]\ninsecure = true\nsystem = \"{sys}\"\n"
            )
        };
        assert!(
            f.parse(&format!("{}{}", rf("a", "1"), rf("b", "2")))
                .is_ok()
        );
        let e = f
            .parse(&format!("{}{}", rf("a", "1"), rf("b", "1")))
            .unwrap_err();
        assert_eq!(key_of(e), "bmc[1].host");
    }
}
