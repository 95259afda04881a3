//! Running Fleetmend binaries as real processes: a PKI made by the real
//! `coordinatorctl pki`, coordinator and node-agent processes on loopback, and
//! `coordinatorctl … --json` parsed into the protocol's types.
//!
//! Binaries: integration tests in this crate get no `CARGO_BIN_EXE_*` for other packages,
//! so [`bin`] is the one way every test finds a workspace binary (`coordinator`,
//! `coordinatorctl`, `node-agent`, `bmc-gateway`, …). With `FLEETMEND_BIN_DIR` set it uses the
//! binaries there and runs no cargo at all: `scripts/test.sh` (and so CI) builds every binary
//! once up front with `cargo build --workspace --bins --tests` and sets it. Without it (a
//! developer's plain `cargo test`), the first [`bin`] call of a test process runs that same
//! build, in the same profile and target directory as the running test (found from the test
//! executable's path: `target/<profile>/deps/<test>`), guarded by a `OnceLock`; cargo's own
//! lock serialises concurrent test processes, and after the first one it only checks that
//! everything is fresh.
//!
//! Every child is killed when its handle drops, its stderr goes to a log file the test can
//! search, and every wait has a timeout. Children never inherit the test's `FLEETMEND_*`
//! environment. This module does not decide what a test asserts.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How often [`wait_for`] polls: fast enough that sub-second test intervals are seen
/// promptly, slow enough not to steal CPU from the processes being watched.
pub const POLL: Duration = Duration::from_millis(50);

/// How many of a log's last lines a failed [`Proc::wait_for_log`] shows.
const LOG_TAIL: usize = 30;

/// Generous bound for process start-up on a loaded 2-core CI machine.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `f` until it returns `Some`, or fails after `timeout` naming `what` and the last
/// observation (from `f`'s `Err`).
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// The workspace root (parent of the `tests` crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate sits in the workspace root")
        .to_path_buf()
}

/// The directory holding the workspace's binaries: `FLEETMEND_BIN_DIR`, or the running test's
/// target profile directory after one build (see the module docs).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("FLEETMEND_BIN_DIR") {
            return PathBuf::from(d);
        }
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test-binary>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps")
            .to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        // `--workspace --bins --tests` resolves features exactly as `cargo test --workspace`
        // does (dev-dependencies included), so after a workspace test build this only links
        // the plain binaries instead of rebuilding dependencies with another feature set.
        cmd.current_dir(workspace_root())
            .args(["build", "--workspace", "--bins", "--tests"]);
        if release {
            cmd.arg("--release");
        }
        // The test process carries the variables cargo sets for *this* crate
        // (CARGO_MANIFEST_DIR, CARGO_PKG_*, …). Build scripts such as ring's track some of
        // them, so passing them on would make this build differ from an ordinary one and
        // rebuild half the dependency tree each time the two alternate.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            let set_by_cargo_for_tests = k == "OUT_DIR"
                || (k.starts_with("CARGO_")
                    && !matches!(k.as_str(), "CARGO_HOME" | "CARGO_TARGET_DIR")
                    && !k.starts_with("CARGO_BUILD_")
                    && !k.starts_with("CARGO_REGISTRIES_")
                    && !k.starts_with("CARGO_NET_")
                    && !k.starts_with("CARGO_PROFILE_"));
            if set_by_cargo_for_tests {
                cmd.env_remove(k);
            }
        }
        let status = cmd
            .status()
            .expect("cannot run cargo to build the binaries under test");
        assert!(
            status.success(),
            "building the workspace's binaries failed ({status}); set FLEETMEND_BIN_DIR to use prebuilt binaries"
        );
        profile_dir
    })
}

/// Path of one of the workspace's binaries.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// A command for binary `name` with no `FLEETMEND_*` variables inherited.
pub fn command(name: &str) -> Command {
    let mut cmd = Command::new(bin(name));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FLEETMEND_") {
            cmd.env_remove(k);
        }
    }
    // Plain logs without colour codes, so tests can search them for `key=value`.
    cmd.env("NO_COLOR", "1");
    cmd
}

/// Runs a command to completion; an error (with its stderr) if it fails.
pub fn run_ok(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// A free loopback UDP port (QUIC), for a server a test may stop and start again on it.
pub fn free_udp_port() -> u16 {
    free_port(|p| UdpSocket::bind(("127.0.0.1", p)).is_ok())
}

/// A free loopback TCP port (HTTP).
pub fn free_tcp_port() -> u16 {
    free_port(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// Where test servers' ports come from: below the kernel's ephemeral range (32768–60999 on
/// Linux by default), which is where every client socket (an agent's, coordinatorctl's, a
/// coordinator's gateway client) gets its port. With ports from that range, a server a test
/// stopped and starts again on its port (a gateway outage) could find it taken by some
/// client in between ("Address already in use"); here no client is ever given one.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port of [`TEST_PORTS`] that `free` says is free now and that this process has not
/// handed out before (so two servers of one test binary never share one, even when the
/// first is down for a restart).
fn free_port(free: impl Fn(u16) -> bool) -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    // Start somewhere different in each process (test binaries run one after another, and a
    // developer may run two at once), then walk the range.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let start = (u64::from(std::process::id()) * 7919 + u64::from(nanos)) % span;
    for i in 0..span {
        let port = TEST_PORTS.start + ((start + i * 37) % span) as u16;
        if !given.contains(&port) && free(port) {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {TEST_PORTS:?}");
}

/// A certificate, its key, and the CA that signed it.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// Fleet CA certificate.
    pub ca: PathBuf,
    /// Certificate.
    pub cert: PathBuf,
    /// Key.
    pub key: PathBuf,
}

/// A fleet PKI made with the real `coordinatorctl pki`.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA directory.
    pub ca_dir: PathBuf,
    /// Where issued certificates go.
    pub certs_dir: PathBuf,
}

impl Pki {
    /// `coordinatorctl pki init --out <dir>/ca --trust-domain <td>`.
    pub fn create(dir: &Path, trust_domain: &str) -> anyhow::Result<Self> {
        let ca_dir = dir.join("ca");
        run_ok(command("coordinatorctl").args([
            "pki",
            "init",
            "--out",
            &ca_dir.to_string_lossy(),
            "--trust-domain",
            trust_domain,
        ]))?;
        Ok(Self {
            ca_dir,
            certs_dir: dir.join("certs"),
        })
    }

    /// The CA certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.ca_dir.join("ca.crt")
    }

    /// `coordinatorctl pki issue --ca … --role <role> --name <name> --ip …`.
    pub fn issue(&self, role: &str, name: &str, ips: &[IpAddr]) -> anyhow::Result<CertFiles> {
        let mut cmd = command("coordinatorctl");
        cmd.args([
            "pki",
            "issue",
            "--ca",
            &self.ca_dir.to_string_lossy(),
            "--role",
            role,
            "--name",
            name,
            "--out",
            &self.certs_dir.to_string_lossy(),
        ]);
        for ip in ips {
            cmd.args(["--ip", &ip.to_string()]);
        }
        run_ok(&mut cmd)?;
        Ok(CertFiles {
            ca: self.ca_cert(),
            cert: self.certs_dir.join(format!("{name}.crt")),
            key: self.certs_dir.join(format!("{name}.key")),
        })
    }
}

/// A child process killed on drop, with its stderr in a log file.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    /// The stderr log.
    pub log: PathBuf,
    name: String,
}

impl Proc {
    /// Spawns `cmd` with stdout discarded and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let err = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Self {
            child: Some(child),
            log: log.to_path_buf(),
            name: name.to_string(),
        })
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains every one of `needles` on one line.
    pub fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> anyhow::Result<String> {
        wait_for(
            &format!("{} to log a line with {needles:?}", self.name),
            timeout,
            || {
                let text = self.log_text();
                text.lines()
                    .find(|l| needles.iter().all(|n| l.contains(n)))
                    .map(str::to_string)
                    .ok_or_else(|| {
                        // The log's end, so a timeout in CI says what the process did instead.
                        // Without the DEBUG lines and the admin connections of the test's
                        // own polling, which would fill it.
                        let lines: Vec<&str> = text
                            .lines()
                            .filter(|l| !l.contains(" DEBUG ") && !l.contains("admin connected"))
                            .collect();
                        let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
                        format!("no such line; the log ends:\n{tail}")
                    })
            },
        )
    }

    /// SIGKILL, and reap.
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit code (SIGKILL after that).
    pub fn sigterm(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let Some(mut c) = self.child.take() else {
            return Ok(None);
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let res = wait_for(&format!("{} to exit", self.name), timeout, || {
            match c.try_wait() {
                Ok(Some(s)) => Ok(s.code()),
                Ok(None) => Err("still running".into()),
                Err(e) => Err(e.to_string()),
            }
        });
        if res.is_err() {
            let _ = c.kill();
            let _ = c.wait();
        }
        res
    }

    /// The exit status if the process has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// The value of `series` (a name with its labels as rendered, e.g.
/// `fleetmend_machines{state="healthy"}`) in a Prometheus text scrape.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A minimal HTTP/1.0 GET (the test kit needs no HTTP client for two endpoints).
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status line")?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Starts `node-agent run --config <config>` with its stderr in `log`.
pub fn start_agent(name: &str, config: &Path, log: &Path) -> anyhow::Result<Proc> {
    let mut cmd = command("node-agent");
    cmd.arg("run").arg("--config").arg(config);
    Proc::spawn(name, cmd, log)
}

/// Inventory TOML for `(address, hostname)` pairs, all of type `qemu` in rack `r1`.
pub fn inventory_toml(machines: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (addr, host) in machines {
        s.push_str(&format!(
            "[[machines]]\naddress = \"{addr}\"\nhostname = \"{host}\"\nserial = \"SN-{host}\"\nrack = \"r1\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n\n"
        ));
    }
    s
}
