//! Fake sysfs/procfs trees for node-agents, and a fake kubelet healthz endpoint.
//!
//! A [`NodeFixture`] is a temporary directory laid out like the parts of `/` that
//! node-agent reads (its `root` setting points at it), so a test can run real
//! `node-agent` processes side by side on one machine, each believing it is a different
//! server, and break them on purpose:
//!
//! ```text
//! <root>/proc/sys/kernel/hostname               hostname
//! <root>/proc/sys/kernel/random/boot_id         boot id (changed by new_boot_id)
//! <root>/proc/mounts, proc/self/mountinfo       one line per mount (set_read_only, set_mounted)
//! <root>/proc/net/fib_trie, if_inet6            the node's addresses
//! <root>/sys/class/net/<if>/{operstate,carrier,carrier_changes}
//! <root>/sys/class/dmi/id/product_serial        serial
//! <root>/sys/kernel/kexec_crash_{loaded,size}   kdump readiness
//! <root>/<mountpoint>/                          a directory per mount (statvfs target)
//! <root>/run/systemd/shutdown/scheduled         present after schedule_shutdown(true)
//! <root>/etc/fleetmend/node-agent.toml          written by write_agent_config
//! ```
//!
//! Typical use in an end-to-end test:
//!
//! ```no_run
//! use testkit::fixture::{AgentConfig, NodeFixture};
//! # fn main() -> std::io::Result<()> {
//! let node = NodeFixture::builder("node-1").nic("eth0").mount("/var").address("10.0.0.1".parse().unwrap()).build()?;
//! let config = node.write_agent_config(&AgentConfig::new("127.0.0.1:7443", "/pki/ca.crt", "/pki/node-1.crt", "/pki/node-1.key"))?;
//! // spawn `node-agent run --config <config>` …, then break the node:
//! node.set_carrier("eth0", false)?;
//! # Ok(()) }
//! ```
//!
//! Every change is written to a temporary file and renamed into place, so an agent reading
//! concurrently sees the old or the new content, never a half-written file.
//!
//! This module deliberately depends on nothing but `std` and `tempfile` (it writes the
//! agent's TOML as text): node-agent's own tests and benchmark include this same file by
//! path, so it must not depend on the test kit or on node-agent's types. Free space and
//! inode counts are those of the real filesystem holding the temporary directory; a test
//! that needs "disk full" uses node-agent's `FsStats` fake instead.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Builder for a [`NodeFixture`]; every setting has a healthy default.
#[derive(Debug, Clone)]
pub struct NodeFixtureBuilder {
    hostname: String,
    serial: Option<String>,
    nics: Vec<String>,
    mounts: Vec<String>,
    addresses: Vec<IpAddr>,
    kdump_loaded: bool,
    crash_size: u64,
}

impl NodeFixtureBuilder {
    /// Sets the DMI serial (default `SN-<hostname>`).
    pub fn serial(mut self, serial: &str) -> Self {
        self.serial = Some(serial.to_string());
        self
    }

    /// Adds a network interface, up with carrier and zero carrier changes.
    pub fn nic(mut self, name: &str) -> Self {
        self.nics.push(name.to_string());
        self
    }

    /// Adds a read-write mount at `mountpoint` (absolute, as seen by the node).
    pub fn mount(mut self, mountpoint: &str) -> Self {
        self.mounts.push(mountpoint.to_string());
        self
    }

    /// Adds a local address (IPv4 goes to `fib_trie`, IPv6 to `if_inet6`).
    pub fn address(mut self, addr: IpAddr) -> Self {
        self.addresses.push(addr);
        self
    }

    /// Whether the crash kernel starts out loaded (default true, with 256 MiB reserved).
    pub fn kdump_loaded(mut self, loaded: bool) -> Self {
        self.kdump_loaded = loaded;
        self
    }

    /// Creates the tree in a new temporary directory.
    pub fn build(self) -> io::Result<NodeFixture> {
        let dir = tempfile::Builder::new()
            .prefix("fleetmend-node-")
            .tempdir()?;
        let fx = NodeFixture {
            dir,
            hostname: self.hostname.clone(),
            nics: Mutex::new(self.nics.clone()),
            mounts: Mutex::new(
                self.mounts
                    .iter()
                    .map(|m| MountState {
                        mountpoint: m.clone(),
                        read_only: false,
                        mounted: true,
                    })
                    .collect(),
            ),
        };
        fx.write("proc/sys/kernel/hostname", &format!("{}\n", self.hostname))?;
        fx.new_boot_id()?;
        let serial = self
            .serial
            .unwrap_or_else(|| format!("SN-{}", self.hostname));
        fx.write("sys/class/dmi/id/product_serial", &format!("{serial}\n"))?;
        for nic in &self.nics {
            fx.write(&format!("sys/class/net/{nic}/operstate"), "up\n")?;
            fx.write(&format!("sys/class/net/{nic}/carrier"), "1\n")?;
            fx.write(&format!("sys/class/net/{nic}/carrier_changes"), "1\n")?;
        }
        // The loopback interface exists on every node; agents must not report it.
        fx.write("sys/class/net/lo/operstate", "unknown\n")?;
        fx.write("sys/class/net/lo/carrier", "1\n")?;
        fx.write("sys/class/net/lo/carrier_changes", "0\n")?;
        for m in &self.mounts {
            std::fs::create_dir_all(fx.path_of(m))?;
        }
        fx.write_mounts()?;
        fx.write_addresses(&self.addresses)?;
        fx.set_kdump_loaded(self.kdump_loaded)?;
        fx.write(
            "sys/kernel/kexec_crash_size",
            &format!("{}\n", self.crash_size),
        )?;
        std::fs::create_dir_all(fx.path_of("/run/systemd"))?;
        Ok(fx)
    }
}

#[derive(Debug, Clone)]
struct MountState {
    mountpoint: String,
    read_only: bool,
    mounted: bool,
}

/// A fake node root directory; removed when dropped.
#[derive(Debug)]
pub struct NodeFixture {
    dir: tempfile::TempDir,
    hostname: String,
    nics: Mutex<Vec<String>>,
    mounts: Mutex<Vec<MountState>>,
}

/// What [`NodeFixture::write_agent_config`] puts in the agent's configuration besides the
/// fixture's own root, NICs and mounts.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Coordinator address, `host:port`.
    pub coordinator: String,
    /// TLS server name to expect (default: the host part of `coordinator`).
    pub server_name: Option<String>,
    /// Fleet CA certificate.
    pub ca: PathBuf,
    /// The node's certificate.
    pub cert: PathBuf,
    /// The node's key.
    pub key: PathBuf,
    /// Report interval (default 1 s: fast tests).
    pub report_interval: Duration,
    /// kubelet healthz URL; `None` disables the kubelet check (there is no kubelet in
    /// tests unless a [`FakeKubelet`] is started).
    pub kubelet_url: Option<String>,
    /// Whether to check kdump (default true; the fixture's crash kernel starts loaded).
    pub kdump: bool,
}

impl AgentConfig {
    /// Settings for an agent talking to `coordinator` with the given TLS files.
    pub fn new(
        coordinator: &str,
        ca: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        Self {
            coordinator: coordinator.to_string(),
            server_name: None,
            ca: ca.into(),
            cert: cert.into(),
            key: key.into(),
            report_interval: Duration::from_secs(1),
            kubelet_url: None,
            kdump: true,
        }
    }

    /// Sets the report interval.
    pub fn report_interval(mut self, d: Duration) -> Self {
        self.report_interval = d;
        self
    }

    /// Enables the kubelet check against `url` (e.g. [`FakeKubelet::url`]).
    pub fn kubelet_url(mut self, url: &str) -> Self {
        self.kubelet_url = Some(url.to_string());
        self
    }

    /// Sets the TLS server name.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = Some(name.to_string());
        self
    }
}

/// TOML basic string with escapes.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Random-enough hex for boot ids: std's `RandomState` is seeded per instance from the OS.
fn random_hex(n: usize) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::new();
    while out.len() < n {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let _ = write!(out, "{:016x}", h.finish());
    }
    out.truncate(n);
    out
}

impl NodeFixture {
    /// Starts a builder for a node called `hostname`, with no NICs, no mounts, no
    /// addresses and a loaded crash kernel.
    pub fn builder(hostname: &str) -> NodeFixtureBuilder {
        NodeFixtureBuilder {
            hostname: hostname.to_string(),
            serial: None,
            nics: Vec::new(),
            mounts: Vec::new(),
            addresses: Vec::new(),
            kdump_loaded: true,
            crash_size: 256 << 20,
        }
    }

    /// The fake root directory (node-agent's `root` setting).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The node's hostname.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// `<root>/<path>` for a path as seen by the node (leading `/` optional).
    pub fn path_of(&self, node_path: &str) -> PathBuf {
        self.dir.path().join(node_path.trim_start_matches('/'))
    }

    /// Writes `contents` to the node path atomically (temporary file + rename), creating
    /// parent directories.
    pub fn write(&self, node_path: &str, contents: &str) -> io::Result<()> {
        let path = self.path_of(node_path);
        let parent = path.parent().expect("node paths have a parent");
        std::fs::create_dir_all(parent)?;
        let tmp = parent.join(format!(
            ".{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("f")
        ));
        std::fs::write(&tmp, contents)?;
        std::fs::rename(&tmp, &path)
    }

    /// Reads a node path as a trimmed string.
    pub fn read(&self, node_path: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.path_of(node_path))?
            .trim()
            .to_string())
    }

    /// The current boot id.
    pub fn boot_id(&self) -> String {
        self.read("proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
    }

    /// Writes a fresh random boot id (as after a reboot) and returns it.
    pub fn new_boot_id(&self) -> io::Result<String> {
        let h = random_hex(32);
        let id = format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        );
        self.write("proc/sys/kernel/random/boot_id", &format!("{id}\n"))?;
        Ok(id)
    }

    /// Sets an interface's link: up = operstate `up` + carrier 1, down = operstate `down`
    /// + carrier 0. A change of carrier counts one carrier change, as the kernel does.
    pub fn set_carrier(&self, nic: &str, up: bool) -> io::Result<()> {
        self.ensure_nic(nic)?;
        let was_up = self.read(&format!("sys/class/net/{nic}/carrier"))? == "1";
        if was_up != up {
            self.add_carrier_changes(nic, 1)?;
        }
        self.write(
            &format!("sys/class/net/{nic}/operstate"),
            if up { "up\n" } else { "down\n" },
        )?;
        self.write(
            &format!("sys/class/net/{nic}/carrier"),
            if up { "1\n" } else { "0\n" },
        )
    }

    /// Records `n` carrier flaps (down and up again) on an interface that stays up: the
    /// carrier change counter grows by `2 * n`.
    pub fn flap(&self, nic: &str, n: u64) -> io::Result<()> {
        self.ensure_nic(nic)?;
        self.add_carrier_changes(nic, 2 * n)
    }

    /// The interface's carrier change counter.
    pub fn carrier_changes(&self, nic: &str) -> io::Result<u64> {
        self.read(&format!("sys/class/net/{nic}/carrier_changes"))?
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn add_carrier_changes(&self, nic: &str, n: u64) -> io::Result<()> {
        let now = self.carrier_changes(nic)?;
        self.write(
            &format!("sys/class/net/{nic}/carrier_changes"),
            &format!("{}\n", now + n),
        )
    }

    fn ensure_nic(&self, nic: &str) -> io::Result<()> {
        if self
            .nics
            .lock()
            .expect("fixture lock")
            .iter()
            .any(|n| n == nic)
        {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("fixture has no interface {nic}"),
            ))
        }
    }

    /// Removes an interface's sysfs directory (the NIC disappeared).
    pub fn remove_nic(&self, nic: &str) -> io::Result<()> {
        self.ensure_nic(nic)?;
        self.nics.lock().expect("fixture lock").retain(|n| n != nic);
        std::fs::remove_dir_all(self.path_of(&format!("sys/class/net/{nic}")))
    }

    /// Remounts a fixture mount read-only (`true`) or read-write (`false`) in `proc/mounts`.
    pub fn set_read_only(&self, mountpoint: &str, read_only: bool) -> io::Result<()> {
        self.update_mount(mountpoint, |m| m.read_only = read_only)
    }

    /// Removes (`false`) or restores (`true`) a mount's line in `proc/mounts`.
    pub fn set_mounted(&self, mountpoint: &str, mounted: bool) -> io::Result<()> {
        self.update_mount(mountpoint, |m| m.mounted = mounted)
    }

    fn update_mount(&self, mountpoint: &str, f: impl FnOnce(&mut MountState)) -> io::Result<()> {
        {
            let mut mounts = self.mounts.lock().expect("fixture lock");
            let m = mounts
                .iter_mut()
                .find(|m| m.mountpoint == mountpoint)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("fixture has no mount {mountpoint}"),
                    )
                })?;
            f(m);
        }
        self.write_mounts()
    }

    fn write_mounts(&self) -> io::Result<()> {
        let mut text = String::new();
        text.push_str("proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n");
        text.push_str("sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n");
        let mut info = String::new();
        info.push_str(
            "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n",
        );
        info.push_str(
            "23 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw\n",
        );
        for (i, m) in self.mounts.lock().expect("fixture lock").iter().enumerate() {
            if !m.mounted {
                continue;
            }
            let opts = if m.read_only {
                "ro,relatime"
            } else {
                "rw,relatime"
            };
            // Spaces in mount points are octal-escaped, as the kernel does.
            let mp = m.mountpoint.replace(' ', "\\040");
            let dev = format!("/dev/vd{}", (b'a' + i as u8) as char);
            let _ = writeln!(text, "{dev} {mp} ext4 {opts} 0 0");
            // The super block options carry `ro` when a filesystem is remounted read-only.
            let _ = writeln!(
                info,
                "{} 1 254:{i} / {mp} {opts} shared:{} - ext4 {dev} {},errors=remount-ro",
                40 + i,
                40 + i,
                if m.read_only { "ro" } else { "rw" }
            );
        }
        self.write("proc/self/mountinfo", &info)?;
        self.write("proc/mounts", &text)
    }

    /// Loads (`true`) or unloads the crash kernel.
    pub fn set_kdump_loaded(&self, loaded: bool) -> io::Result<()> {
        self.write(
            "sys/kernel/kexec_crash_loaded",
            if loaded { "1\n" } else { "0\n" },
        )
    }

    /// Creates (`true`) or removes systemd's "shutdown scheduled" marker, which node-agent
    /// reads to say goodbye with reason `shutdown` rather than `restart`.
    pub fn schedule_shutdown(&self, scheduled: bool) -> io::Result<()> {
        let p = "run/systemd/shutdown/scheduled";
        if scheduled {
            self.write(p, "USEC=0\nWARN_WALL=1\nMODE=reboot\n")
        } else {
            match std::fs::remove_file(self.path_of(p)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    fn write_addresses(&self, addrs: &[IpAddr]) -> io::Result<()> {
        // Only the lines node-agent reads matter; the trie shape is kept realistic anyway.
        let mut v4 = vec![Ipv4Addr::LOCALHOST];
        let mut v6 = vec![std::net::Ipv6Addr::LOCALHOST];
        for a in addrs {
            match a {
                IpAddr::V4(a) => v4.push(*a),
                IpAddr::V6(a) => v6.push(*a),
            }
        }
        let mut trie = String::new();
        for table in ["Main", "Local"] {
            let _ = writeln!(trie, "{table}:\n  +-- 0.0.0.0/0 3 0 5");
            let _ = writeln!(trie, "     |-- 0.0.0.0\n        /0 universe UNICAST");
            for a in &v4 {
                let o = a.octets();
                let _ = writeln!(
                    trie,
                    "     +-- {}.{}.{}.0/24 2 0 2\n        |-- {a}\n           /32 host LOCAL",
                    o[0], o[1], o[2]
                );
                let _ = writeln!(
                    trie,
                    "        |-- {}.{}.{}.255\n           /32 link BROADCAST",
                    o[0], o[1], o[2]
                );
            }
        }
        self.write("proc/net/fib_trie", &trie)?;
        let mut inet6 = String::new();
        for (i, a) in v6.iter().enumerate() {
            let hex: String = a.octets().iter().map(|b| format!("{b:02x}")).collect();
            let (idx, scope, name) = if a.is_loopback() {
                (1, 0x10, "lo")
            } else {
                (2 + i, 0, "eth0")
            };
            let _ = writeln!(inet6, "{hex} {idx:02x} 40 {scope:02x} 80 {name:>8}");
        }
        self.write("proc/net/if_inet6", &inet6)
    }

    /// Writes `<root>/etc/fleetmend/node-agent.toml` for this node and returns its path.
    /// The agent reads this fixture's root, requires every NIC and mount the fixture was
    /// built with, and takes its hostname from the fixture.
    pub fn write_agent_config(&self, cfg: &AgentConfig) -> io::Result<PathBuf> {
        let mut t = String::new();
        let _ = writeln!(t, "# written by testkit::fixture::NodeFixture");
        let _ = writeln!(t, "coordinator = {}", toml_str(&cfg.coordinator));
        if let Some(s) = &cfg.server_name {
            let _ = writeln!(t, "server_name = {}", toml_str(s));
        }
        for (k, p) in [("ca", &cfg.ca), ("cert", &cfg.cert), ("key", &cfg.key)] {
            let _ = writeln!(t, "{k} = {}", toml_str(&p.to_string_lossy()));
        }
        let _ = writeln!(
            t,
            "report_interval = \"{}ms\"",
            cfg.report_interval.as_millis()
        );
        let _ = writeln!(t, "root = {}", toml_str(&self.root().to_string_lossy()));
        let nics = self.nics.lock().expect("fixture lock").clone();
        let nics: Vec<String> = nics.iter().map(|n| toml_str(n)).collect();
        let _ = writeln!(t, "nics = [{}]", nics.join(", "));
        let _ = writeln!(t, "\n[kubelet]");
        match &cfg.kubelet_url {
            Some(u) => {
                let _ = writeln!(t, "enabled = true\nurl = {}", toml_str(u));
            }
            None => {
                let _ = writeln!(t, "enabled = false");
            }
        }
        let _ = writeln!(t, "\n[kdump]\nenabled = {}", cfg.kdump);
        for m in self.mounts.lock().expect("fixture lock").iter() {
            let _ = writeln!(t, "\n[[mounts]]\npath = {}", toml_str(&m.mountpoint));
        }
        let path = self.path_of("etc/fleetmend/node-agent.toml");
        self.write("etc/fleetmend/node-agent.toml", &t)?;
        Ok(path)
    }
}

/// A fake kubelet healthz endpoint on loopback: answers `GET` with `200 ok` while healthy
/// and `500 unhealthy` otherwise. Like the real kubelet (Go `net/http`), it answers
/// HTTP/1.1 with a `Content-Length` and keeps the connection open for the next request
/// unless the client asks `Connection: close`, so an agent under test (and the footprint
/// benchmark) reuses one connection as it does in production. Runs on plain threads (one
/// per connection) so it works with or without an async runtime; stopped, with every open
/// connection, when dropped.
#[derive(Debug)]
pub struct FakeKubelet {
    addr: SocketAddr,
    healthy: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a kept connection may stay silent before the fake kubelet closes it: longer
/// than any agent's report interval in the tests, as kubelet's own idle timeout is.
const KUBELET_IDLE: Duration = Duration::from_secs(120);

/// What the fake kubelet's connection threads share.
#[derive(Debug, Clone)]
struct KubeletShared {
    healthy: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    state: Option<PathBuf>,
}

impl KubeletShared {
    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
            && self
                .state
                .as_deref()
                .is_none_or(|p| std::fs::read_to_string(p).is_ok_and(|t| t.trim() == "ok"))
    }
}

impl FakeKubelet {
    /// Binds an ephemeral loopback port and starts serving, healthy.
    pub fn start() -> io::Result<Self> {
        Self::serve(None)
    }

    /// As [`FakeKubelet::start`], and healthy only while the file `state` holds `ok` (read on
    /// every request; written `ok` now). A separate process (a node-agent's restart command
    /// standing in for `systemctl restart kubelet`) can then break or fix this kubelet.
    pub fn start_with_state_file(state: &Path) -> io::Result<Self> {
        std::fs::write(state, "ok\n")?;
        Self::serve(Some(state.to_path_buf()))
    }

    fn serve(state: Option<PathBuf>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let healthy = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let shared = KubeletShared {
            healthy: healthy.clone(),
            requests: requests.clone(),
            state,
        };
        let (s, c, o) = (stop.clone(), connections.clone(), open.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                if let Ok(kept) = conn.try_clone() {
                    o.lock().expect("fake kubelet lock").push(kept);
                }
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve_connection(conn, &shared);
                });
            }
        });
        Ok(Self {
            addr,
            healthy,
            stop,
            requests,
            connections,
            open,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>/healthz`.
    pub fn url(&self) -> String {
        format!("http://{}/healthz", self.addr)
    }

    /// Switches the answer between `200 ok` and `500`.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (fewer than requests while clients keep them open).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Answers requests on one connection until the client closes it, asks `Connection: close`,
/// or stays silent for [`KUBELET_IDLE`].
fn serve_connection(conn: TcpStream, shared: &KubeletShared) -> io::Result<()> {
    conn.set_read_timeout(Some(KUBELET_IDLE))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    let mut line = String::new();
    loop {
        // Request line and headers, up to the blank line; the end of the stream before a
        // request is the client closing a kept connection.
        let mut close = false;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.trim().eq_ignore_ascii_case("connection")
                && value.trim().eq_ignore_ascii_case("close")
            {
                close = true;
            }
        }
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let (status, body) = if shared.healthy() {
            ("200 OK", "ok")
        } else {
            (
                "500 Internal Server Error",
                "[-]ping failed\nhealthz check failed",
            )
        };
        write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" },
        )?;
        conn.flush()?;
        if close {
            let _ = conn.shutdown(std::net::Shutdown::Write);
            // Drain so the client's close does not turn into a reset before it read the
            // answer.
            let _ = reader.read(&mut [0u8; 64]);
            return Ok(());
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A stopped kubelet's kept connections end too (their threads see the end of the
        // stream).
        for c in self.open.lock().expect("fake kubelet lock").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_tree_and_flips_it() {
        let fx = NodeFixture::builder("node-a")
            .nic("eth0")
            .mount("/var")
            .address("10.1.2.3".parse().unwrap())
            .build()
            .unwrap();
        assert_eq!(fx.read("proc/sys/kernel/hostname").unwrap(), "node-a");
        assert_eq!(fx.read("sys/class/net/eth0/carrier").unwrap(), "1");
        assert!(fx.path_of("/var").is_dir());
        let id = fx.boot_id();
        assert_eq!(id.len(), 36);
        assert_ne!(fx.new_boot_id().unwrap(), id);

        fx.set_carrier("eth0", false).unwrap();
        assert_eq!(fx.read("sys/class/net/eth0/operstate").unwrap(), "down");
        assert_eq!(fx.carrier_changes("eth0").unwrap(), 2);
        fx.flap("eth0", 2).unwrap();
        assert_eq!(fx.carrier_changes("eth0").unwrap(), 6);
        assert!(fx.set_carrier("eth9", false).is_err());

        fx.set_read_only("/var", true).unwrap();
        assert!(fx.read("proc/mounts").unwrap().contains(" /var ext4 ro,"));
        assert!(
            fx.read("proc/self/mountinfo")
                .unwrap()
                .contains("/dev/vda ro,errors")
        );
        fx.set_mounted("/var", false).unwrap();
        assert!(!fx.read("proc/mounts").unwrap().contains(" /var "));
        assert!(fx.read("proc/net/fib_trie").unwrap().contains("10.1.2.3"));
    }

    #[test]
    fn fake_kubelet_answers_and_can_turn_unhealthy() {
        let k = FakeKubelet::start().unwrap();
        let get = |addr: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let addr = k
            .url()
            .trim_start_matches("http://")
            .replace("/healthz", "");
        let a = get(&addr);
        assert!(
            a.starts_with("HTTP/1.1 200") && a.ends_with("\r\n\r\nok"),
            "{a}"
        );
        k.set_healthy(false);
        assert!(get(&addr).starts_with("HTTP/1.1 500"));
        assert_eq!((k.requests(), k.connections()), (2, 2));

        // Without `Connection: close` the connection stays open for the next request.
        k.set_healthy(true);
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        for _ in 0..3 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut head = String::new();
            while !head.ends_with("\r\n\r\n") {
                assert!(r.read_line(&mut head).unwrap() > 0, "closed: {head}");
            }
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            assert!(!head.to_ascii_lowercase().contains("connection: close"));
            let mut body = [0u8; 2];
            r.read_exact(&mut body).unwrap();
            assert_eq!(&body, b"ok");
        }
        assert_eq!((k.requests(), k.connections()), (5, 3));
        // Stopping the kubelet ends the kept connection.
        drop(k);
        let mut rest = Vec::new();
        assert_eq!(r.read_to_end(&mut rest).unwrap_or(0), 0);

        // Healthy only while its state file says `ok`, as another process writes it.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("kubelet");
        let k = FakeKubelet::start_with_state_file(&state).unwrap();
        let addr = k
            .url()
            .trim_start_matches("http://")
            .replace("/healthz", "");
        assert!(get(&addr).starts_with("HTTP/1.1 200"));
        std::fs::write(&state, "hung\n").unwrap();
        assert!(get(&addr).starts_with("HTTP/1.1 500"));
        std::fs::write(&state, "ok\n").unwrap();
        assert!(get(&addr).starts_with("HTTP/1.1 200"));
    }
}
