//! Launchers for the BMC simulators the gateway tests run against, and for the gateway itself.
//!
//! - [`IpmiSim`]: OpenIPMI's `ipmi_sim` with a generated `lan.conf`, an emulator command file
//!   (it must start with `mc_setbmc 0x20` or the simulator dies silently) and a
//!   `chassis_control` script that keeps the power state in a file and logs every change, plus
//!   [`IpmiSim::ipmitool`] to read the same simulator with the reference client.
//! - [`Sushy`]: `sushy-emulator` (PyPI `sushy-tools`) with its fake driver, a bcrypt htpasswd,
//!   HTTPS with a certificate from the test's CA, and a fresh state directory per run. It
//!   applies power changes after a random delay of up to ~11 s, so callers poll.
//! - [`GatewayProc`]: the real `bmc-gateway` binary with a generated config, and
//!   [`GatewayClient`], a QUIC client speaking the coordinator ↔ gateway protocol.
//!
//! Every wait is under a timeout; every child is killed on drop. A missing simulator is an
//! error telling the reader to run `scripts/setup-test-deps.sh`, never a silent skip.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::procs::{free_tcp_port, free_udp_port, workspace_root};
use anyhow::{Context, Result, anyhow, bail};
use protocol::Role;
use protocol::fencing::FencingToken;
use protocol::gateway::{CoordinatorHello, FencedPowerRequest, PowerRequest, PowerResponse};
use protocol::messages::HelloBody;
use protocol::pki::{Ca, IssueOptions};
use protocol::transport::{self, TlsMaterial};
use tokio::process::{Child, Command};

/// How long a simulator may take to start answering. ipmi_sim is ready in milliseconds and
/// sushy-emulator (Python, Flask) in one to three seconds; 30 s absorbs a loaded CI machine.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

fn setup_hint(what: &str) -> anyhow::Error {
    anyhow!(
        "{what} is not installed: run scripts/setup-test-deps.sh (it installs ipmitool, openipmi and the Python venv with sushy-tools)"
    )
}

/// Writes `dir/lan.conf` and `dir/emu.cmd` for one `ipmi_sim` BMC: LAN on 127.0.0.1:`port`
/// with every authentication type, `chassis_control` run as `SCRIPT 0x20 …`, and one admin
/// user (id 2) with `user`/`password`. `ipmi_sim -c dir/lan.conf -f dir/emu.cmd` starts it.
pub fn write_ipmi_sim_config(
    dir: &std::path::Path,
    name: &str,
    port: u16,
    script: &std::path::Path,
    user: &str,
    password: &str,
) -> std::io::Result<()> {
    let lan = format!(
        "name \"{name}\"\n\
         set_working_mc 0x20\n\
         startlan 1\n\
         \x20 addr 127.0.0.1 {port}\n\
         \x20 priv_limit admin\n\
         \x20 allowed_auths_callback none md2 md5 straight\n\
         \x20 allowed_auths_user none md2 md5 straight\n\
         \x20 allowed_auths_operator none md2 md5 straight\n\
         \x20 allowed_auths_admin none md2 md5 straight\n\
         \x20 guid a123456789abcdefa123456789abcdef\n\
         endlan\n\
         chassis_control \"{} 0x20\"\n\
         user 2 true \"{user}\" \"{password}\" admin 10 none md2 md5 straight\n",
        script.display()
    );
    std::fs::write(dir.join("lan.conf"), lan)?;
    // Without mc_setbmc first, ipmi_sim exits silently.
    std::fs::write(
        dir.join("emu.cmd"),
        "mc_setbmc 0x20\n\
         mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n\
         mc_enable 0x20\n",
    )
}

/// The `set …` lines a simulator's chassis control logged to `dir/events`.
fn read_events(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The same lines from `dir/events.timed`, each with when it was received (wall clock,
/// nanoseconds in the file). Written after `events`, so a line here is in both.
fn read_timed_events(dir: &std::path::Path) -> Vec<(std::time::SystemTime, String)> {
    std::fs::read_to_string(dir.join("events.timed"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (ns, what) = l.split_once(' ')?;
            let at = std::time::UNIX_EPOCH + Duration::from_nanos(ns.parse().ok()?);
            Some((at, what.to_string()))
        })
        .collect()
}

/// Finds a program on PATH or in the usual sbin directories.
pub fn find_program(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| setup_hint(name))
}

/// The Python venv made by `scripts/setup-test-deps.sh`.
pub fn venv_bin(name: &str) -> Result<PathBuf> {
    let p = workspace_root().join("build/venv/bin").join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(setup_hint(&format!("{} ({})", name, p.display())))
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let st = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .context("running kill")?;
    if !st.success() {
        bail!("kill -{sig} {pid} failed");
    }
    Ok(())
}

/// Waits until `f` returns `Ok(true)`, polling every `every`, failing after `timeout`.
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let start = Instant::now();
    let mut last;
    loop {
        match f().await {
            Ok(true) => return Ok(()),
            Ok(false) => last = "condition false".into(),
            Err(e) => last = format!("{e:#}"),
        }
        if start.elapsed() > timeout {
            bail!("{what}: not true within {timeout:?} (last: {last})");
        }
        tokio::time::sleep(every).await;
    }
}

const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
# chassis_control for ipmi_sim: "<mc> get power" prints power:0|1; "<mc> set power|reset|shutdown V"
# changes the state file. Every call is logged to ./events. If ./ignore-off exists, power-off
# requests are logged but not applied (a BMC that accepts off and never does it). If
# ./refuse-<0|1> exists, power off (0) or on (1) is refused (ipmi_sim answers 0xFF).
# ./events.timed has the same lines prefixed with the time in nanoseconds. If ./slow-set
# exists, a set first sleeps that many seconds (a BMC slow to carry out and answer).
dir=$(dirname "$0")
state="$dir/power"
[ -f "$state" ] || echo 1 > "$state"
shift
op=$1
shift
case "$op" in
get)
  for p in "$@"; do
    case "$p" in
      power) echo "power:$(cat "$state")" ;;
      boot) echo "boot:default" ;;
    esac
  done
  ;;
set)
  [ -f "$dir/slow-set" ] && sleep "$(cat "$dir/slow-set")"
  while [ $# -gt 0 ]; do
    p=$1; v=$2; shift 2
    echo "set $p $v" >> "$dir/events"
    echo "$(date +%s%N) set $p $v" >> "$dir/events.timed"
    if [ "$p" = power ] && [ -f "$dir/refuse-$v" ]; then
      cat "$dir/refuse-$v"; exit 1
    fi
    case "$p" in
      power)
        if [ "$v" = 0 ] && [ -f "$dir/ignore-off" ]; then :; else echo "$v" > "$state"; fi ;;
      shutdown) [ -f "$dir/ignore-off" ] || echo 0 > "$state" ;;
      reset) ;;
    esac
  done
  ;;
esac
exit 0
"#;

/// A running `ipmi_sim` with one BMC (MC 0x20) on a loopback UDP port.
pub struct IpmiSim {
    child: Child,
    dir: tempfile::TempDir,
    /// UDP port.
    pub port: u16,
    /// Administrator user.
    pub username: String,
    /// Its password.
    pub password: String,
    ipmitool: PathBuf,
}

impl IpmiSim {
    /// Starts a simulator whose machine is powered `on`, and waits until ipmitool can read it.
    pub async fn start(on: bool) -> Result<Self> {
        let sim = find_program("ipmi_sim")?;
        let ipmitool = find_program("ipmitool")?;
        let dir = tempfile::tempdir()?;
        let port = free_udp_port();
        let d = dir.path();
        std::fs::create_dir_all(d.join("state"))?;
        std::fs::write(d.join("power"), if on { "1\n" } else { "0\n" })?;
        std::fs::write(d.join("events"), "")?;
        let script = d.join("chassis_control");
        std::fs::write(&script, CHASSIS_SCRIPT)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        let (username, password) = ("admin".to_string(), "bmc-secret-1".to_string());
        write_ipmi_sim_config(d, "fleetmend-sim", port, &script, &username, &password)?;
        let log = std::fs::File::create(d.join("ipmi_sim.log"))?;
        let child = Command::new(&sim)
            .arg("-c")
            .arg(d.join("lan.conf"))
            .arg("-f")
            .arg(d.join("emu.cmd"))
            .arg("-s")
            .arg(d.join("state"))
            .arg("-n")
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", sim.display()))?;
        let mut me = Self {
            child,
            dir,
            port,
            username,
            password,
            ipmitool,
        };
        let start = Instant::now();
        loop {
            match me.ipmitool_quick().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if start.elapsed() > START_TIMEOUT => {
                    let _ = me.child.start_kill();
                    let log = std::fs::read_to_string(me.dir.path().join("ipmi_sim.log"))
                        .unwrap_or_default();
                    bail!("ipmi_sim not answering within {START_TIMEOUT:?}: {e:#}; its log: {log}");
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(me)
    }

    async fn ipmitool_quick(&mut self) -> Result<bool> {
        if let Some(st) = self.child.try_wait()? {
            bail!("ipmi_sim exited with {st}");
        }
        let out = self
            .ipmitool_args(&["-N", "1", "-R", "1"], &["chassis", "power", "status"])
            .await?;
        Ok(out.contains("Chassis Power is"))
    }

    async fn ipmitool_args(&self, extra: &[&str], cmd: &[&str]) -> Result<String> {
        let port = self.port.to_string();
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            Command::new(&self.ipmitool)
                .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", &port])
                .args(["-U", &self.username, "-P", &self.password])
                .args(extra)
                .args(cmd)
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .context("ipmitool timed out")??;
        if !out.status.success() {
            bail!(
                "ipmitool {cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// Runs `ipmitool -I lanplus -C 3 -H 127.0.0.1 -p PORT -U .. -P .. <cmd>` and returns stdout.
    pub async fn ipmitool(&self, cmd: &[&str]) -> Result<String> {
        self.ipmitool_args(&[], cmd).await
    }

    /// Power state as ipmitool reads it from the simulator.
    pub async fn power_is_on(&self) -> Result<bool> {
        let out = self.ipmitool(&["chassis", "power", "status"]).await?;
        if out.contains("is on") {
            Ok(true)
        } else if out.contains("is off") {
            Ok(false)
        } else {
            bail!("unexpected ipmitool output: {out}")
        }
    }

    /// Every `set` the simulator's chassis control received, e.g. `set power 0`, `set reset 1`.
    pub fn events(&self) -> Vec<String> {
        read_events(self.dir.path())
    }

    /// Every `set` with when the chassis control received it (wall clock), to order it
    /// against other processes' logs.
    pub fn timed_events(&self) -> Vec<(std::time::SystemTime, String)> {
        read_timed_events(self.dir.path())
    }

    /// Makes the simulator refuse power off (`on = false`) or on (`on = true`) requests,
    /// answering IPMI completion code 0xFF (or accept them again with `refuse = false`).
    pub fn refuse_power(&self, on: bool, refuse: bool) -> Result<()> {
        let f = self
            .dir
            .path()
            .join(if on { "refuse-1" } else { "refuse-0" });
        if refuse {
            std::fs::write(f, "chassis control refused by the test\n")?;
        } else if f.exists() {
            std::fs::remove_file(f)?;
        }
        Ok(())
    }

    /// Makes the simulator accept power-off requests without applying them (or undoes it).
    pub fn ignore_off(&self, yes: bool) -> Result<()> {
        let f = self.dir.path().join("ignore-off");
        if yes {
            std::fs::write(f, "")?;
        } else if f.exists() {
            std::fs::remove_file(f)?;
        }
        Ok(())
    }

    /// Makes every chassis control take `secs` seconds before it is carried out and answered
    /// (`None`: at once again). ipmi_sim runs the control script inline, so meanwhile it
    /// answers nothing.
    pub fn slow_set(&self, secs: Option<u32>) -> Result<()> {
        let f = self.dir.path().join("slow-set");
        match secs {
            Some(n) => std::fs::write(f, format!("{n}\n"))?,
            None if f.exists() => std::fs::remove_file(f)?,
            None => {}
        }
        Ok(())
    }

    /// Freezes the simulator (SIGSTOP): it stops answering.
    pub fn freeze(&self) -> Result<()> {
        signal(self.child.id().context("ipmi_sim exited")?, "STOP")
    }

    /// Resumes a frozen simulator (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        signal(self.child.id().context("ipmi_sim exited")?, "CONT")
    }
}

impl Drop for IpmiSim {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = signal(pid, "CONT");
        }
        let _ = self.child.start_kill();
    }
}

const BUSY_BMC_PY: &str = r#"
# A BMC for tests, on pyghmi's IPMI server (RMCP+, cipher suite 3): power on and off change
# ./power and are logged to ./events (and ./events.timed, with nanoseconds). A power-on less
# than ./busy-on-secs seconds after the last power-off is refused with completion code 0xC0
# (node busy), as some BMCs do right after an off (ipmi_sim can only answer 0xFF).
import os, sys, time
import pyghmi.ipmi.bmc as bmc

class BusyBmc(bmc.Bmc):
    def __init__(self, authdata, port, state_dir):
        super().__init__(authdata, port, address='127.0.0.1')
        self.dir = state_dir

    def _p(self, name):
        return os.path.join(self.dir, name)

    def _read(self, name, default):
        try:
            with open(self._p(name)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return default

    def _log(self, what):
        with open(self._p('events'), 'a') as f:
            f.write(what + '\n')
        with open(self._p('events.timed'), 'a') as f:
            f.write('%d %s\n' % (time.time_ns(), what))

    def sessionless_data(self, data, sockaddr):
        # RMCP presence ping (ASF class 6, IANA 4542, type 0x80): answer the pong that real
        # BMCs give and pyghmi does not (RMCP header, IANA, 0x40, tag, 0, 16 bytes: IANA,
        # OEM 0, entities 0x81 = IPMI supported, interactions 0, 6 reserved).
        d = bytearray(data)
        if len(d) >= 12 and d[3] == 6 and d[4:8] == b'\x00\x00\x11\xbe' and d[8] == 0x80:
            pong = bytes([6, 0, 0xff, 6, 0, 0, 0x11, 0xbe, 0x40, d[9], 0, 16,
                          0, 0, 0x11, 0xbe, 0, 0, 0, 0, 0x81, 0, 0, 0, 0, 0, 0, 0])
            self.serversocket.sendto(pong, sockaddr)
            return
        return super().sessionless_data(data, sockaddr)

    def get_power_state(self):
        return self._read('power', 'on')

    def power_off(self):
        self._log('set power 0')
        with open(self._p('power'), 'w') as f:
            f.write('off')
        with open(self._p('off-at'), 'w') as f:
            f.write(str(time.time()))

    def power_on(self):
        busy = float(self._read('busy-on-secs', '0'))
        off_at = float(self._read('off-at', '0'))
        if time.time() - off_at < busy:
            self._log('busy power 1')
            return 0xC0
        self._log('set power 1')
        with open(self._p('power'), 'w') as f:
            f.write('on')

BusyBmc({sys.argv[2]: sys.argv[3]}, int(sys.argv[1]), sys.argv[4]).listen()
"#;

/// A BMC on pyghmi's IPMI server that refuses power-on as busy (0xC0) for a while after a
/// power-off. Same log format as [`IpmiSim`]: `set power 0|1`, plus `busy power 1` for each
/// refused power-on.
pub struct BusyBmc {
    child: Child,
    dir: tempfile::TempDir,
    /// UDP port.
    pub port: u16,
    /// Administrator user.
    pub username: String,
    /// Its password.
    pub password: String,
}

impl BusyBmc {
    /// Starts a BMC whose machine is on and which refuses power-on as busy for `busy`
    /// after each power-off; waits until ipmitool can read it.
    pub async fn start(busy: Duration) -> Result<Self> {
        let python = venv_bin("python3")?;
        let ipmitool = find_program("ipmitool")?;
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        std::fs::write(d.join("busy_bmc.py"), BUSY_BMC_PY)?;
        std::fs::write(d.join("busy-on-secs"), format!("{}\n", busy.as_secs_f64()))?;
        std::fs::write(d.join("events"), "")?;
        let port = free_udp_port();
        let (username, password) = ("admin".to_string(), "bmc-secret-2".to_string());
        let log = std::fs::File::create(d.join("bmc.log"))?;
        let mut child = Command::new(&python)
            .arg(d.join("busy_bmc.py"))
            .arg(port.to_string())
            .arg(&username)
            .arg(&password)
            .arg(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "the pyghmi BMC exited with {st}: {}",
                    std::fs::read_to_string(d.join("bmc.log")).unwrap_or_default()
                );
            }
            let out = Command::new(&ipmitool)
                .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(["-U", &username, "-P", &password, "-N", "1", "-R", "1"])
                .args(["chassis", "power", "status"])
                .stdin(Stdio::null())
                .output()
                .await?;
            if String::from_utf8_lossy(&out.stdout).contains("Chassis Power is") {
                break;
            }
            if start.elapsed() > START_TIMEOUT {
                bail!("the pyghmi BMC not answering within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Self {
            child,
            dir,
            port,
            username,
            password,
        })
    }

    /// Every power request it received, in order (`set power 0|1`, `busy power 1`).
    pub fn events(&self) -> Vec<String> {
        read_events(self.dir.path())
    }

    /// [`BusyBmc::events`] with when each was received (wall clock).
    pub fn timed_events(&self) -> Vec<(std::time::SystemTime, String)> {
        read_timed_events(self.dir.path())
    }

    /// Whether the machine is on, as the BMC holds it.
    pub fn power_is_on(&self) -> bool {
        std::fs::read_to_string(self.dir.path().join("power"))
            .map(|s| s.trim() == "on")
            .unwrap_or(true)
    }
}

impl Drop for BusyBmc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// One fake system in a [`Sushy`] emulator.
#[derive(Debug, Clone)]
pub struct FakeSystem {
    /// Its id (the emulator addresses systems by UUID).
    pub uuid: String,
    /// Its name.
    pub name: String,
    /// Initial power state, `On` or `Off`.
    pub power: String,
}

impl FakeSystem {
    /// A system with a UUID derived from `n`.
    pub fn new(n: u32, name: &str, on: bool) -> Self {
        Self {
            uuid: format!("27946b59-9e44-4fa7-8e91-{n:012x}"),
            name: name.to_string(),
            power: if on { "On" } else { "Off" }.to_string(),
        }
    }
}

/// Reads a URL with Basic auth using the venv's Python (so the tests need no HTTP client).
const PY_GET: &str = r#"
import base64, json, ssl, sys, urllib.request, urllib.error
url, user, pw, ca = sys.argv[1:5]
ctx = ssl.create_default_context(cafile=ca)
tok = base64.b64encode(f"{user}:{pw}".encode()).decode()
req = urllib.request.Request(url, headers={"Authorization": "Basic " + tok})
try:
    r = urllib.request.urlopen(req, context=ctx, timeout=10)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"#;

/// A running `sushy-emulator` with the fake driver over HTTPS.
pub struct Sushy {
    child: Child,
    dir: tempfile::TempDir,
    /// TCP port.
    pub port: u16,
    /// User.
    pub username: String,
    /// Password.
    pub password: String,
    /// CA certificate (PEM file) that signs the emulator's certificate.
    pub ca_file: PathBuf,
    python: PathBuf,
}

impl Sushy {
    /// Starts an emulator with `systems`, serving HTTPS with a certificate for 127.0.0.1 issued
    /// by `ca`, and waits until it answers.
    pub async fn start(ca: &Ca, systems: &[FakeSystem]) -> Result<Self> {
        let exe = venv_bin("sushy-emulator")?;
        let python = venv_bin("python")?;
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        let port = free_tcp_port();
        let (username, password) = ("redfish".to_string(), "rf-secret-2".to_string());
        let cert = ca.issue(
            Role::Gateway,
            "sushy-sim",
            &IssueOptions {
                ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
                ..Default::default()
            },
        )?;
        std::fs::write(d.join("tls.crt"), &cert.cert_pem)?;
        std::fs::write(d.join("tls.key"), &cert.key_pem)?;
        let ca_file = d.join("ca.crt");
        std::fs::write(&ca_file, ca.cert_pem())?;
        // bcrypt with 4 rounds: the emulator checks the hash on every request, and the default
        // 12 rounds would add ~250 ms to each one.
        let out = Command::new(&python)
            .args([
                "-c",
                "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
                &password,
            ])
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "bcrypt hash failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let hash = String::from_utf8(out.stdout)?.trim().to_string();
        std::fs::write(d.join("htpasswd"), format!("{username}:{hash}\n"))?;
        std::fs::create_dir_all(d.join("state"))?;
        let systems_py: Vec<String> = systems
            .iter()
            .map(|s| {
                format!(
                    "{{'uuid': '{}', 'name': '{}', 'power_state': '{}', 'external_notifier': False, 'nics': [{{'mac': '00:5c:52:31:3a:9c', 'ip': '172.22.0.100'}}]}}",
                    s.uuid, s.name, s.power
                )
            })
            .collect();
        // The config file is Python: it also turns on INFO logging so the emulator's log records
        // every reset it is asked for (`System "<id>" power state set to "<type>"`).
        let conf = format!(
            "import logging\n\
             logging.basicConfig(level=logging.INFO)\n\
             SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
             SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n\
             SUSHY_EMULATOR_AUTH_FILE = '{}'\n\
             SUSHY_EMULATOR_STATE_DIR = '{}'\n\
             SUSHY_EMULATOR_SSL_CERT = '{}'\n\
             SUSHY_EMULATOR_SSL_KEY = '{}'\n",
            systems_py.join(", "),
            d.join("htpasswd").display(),
            d.join("state").display(),
            d.join("tls.crt").display(),
            d.join("tls.key").display(),
        );
        std::fs::write(d.join("sushy.conf"), conf)?;
        let log = std::fs::File::create(d.join("sushy.log"))?;
        let child = Command::new(&exe)
            .arg("--config")
            .arg(d.join("sushy.conf"))
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut me = Self {
            child,
            dir,
            port,
            username,
            password,
            ca_file,
            python,
        };
        let start = Instant::now();
        loop {
            if let Some(st) = me.child.try_wait()? {
                bail!("sushy-emulator exited with {st}: {}", me.log());
            }
            if let Ok((200, _)) = me.get("/redfish/v1/").await {
                break;
            }
            if start.elapsed() > START_TIMEOUT {
                let _ = me.child.start_kill();
                bail!(
                    "sushy-emulator did not answer within {START_TIMEOUT:?}: {}",
                    me.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // sushy builds its fake driver on the first request that needs it (memoized without
        // a lock), and building it writes every system's initial state into its store. Two
        // requests racing to be first can write a system's initial state over a power change
        // the other just stored: seen once as a GracefulShutdown lost, the system on for good.
        // One request builds it here, before any test traffic.
        match me.get("/redfish/v1/Systems").await {
            Ok((200, _)) => {}
            other => bail!("sushy-emulator's systems: {other:?}: {}", me.log()),
        }
        Ok(me)
    }

    /// The emulator's log (its own record of every power request).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sushy.log")).unwrap_or_default()
    }

    /// GETs `path` with Basic auth; returns status and body.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let url = format!("https://127.0.0.1:{}{path}", self.port);
        let out = tokio::time::timeout(
            Duration::from_secs(15),
            Command::new(&self.python)
                .args(["-c", PY_GET, &url, &self.username, &self.password])
                .arg(&self.ca_file)
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .context("python GET timed out")??;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (status, body) = text.split_once('\n').unwrap_or((text.as_str(), ""));
        let status: u16 = status.trim().parse().with_context(|| {
            format!("GET {url}: {}", String::from_utf8_lossy(&out.stderr).trim())
        })?;
        Ok((status, body.to_string()))
    }

    /// The system's `PowerState` as the emulator reports it (reading applies due changes).
    pub async fn power_state(&self, uuid: &str) -> Result<String> {
        let (status, body) = self.get(&format!("/redfish/v1/Systems/{uuid}")).await?;
        if status != 200 {
            bail!("GET system {uuid}: HTTP {status}: {body}");
        }
        let v: serde_json::Value = serde_json::from_str(&body)?;
        v.get("PowerState")
            .and_then(|p| p.as_str())
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no PowerState in {body}"))
    }

    /// Polls until the system reads `want` (the emulator applies changes after up to ~11 s).
    pub async fn wait_power(&self, uuid: &str, want: &str, timeout: Duration) -> Result<()> {
        wait_until(
            &format!("sushy system {uuid} power {want}"),
            timeout,
            Duration::from_millis(500),
            || async { Ok(self.power_state(uuid).await? == want) },
        )
        .await
    }

    /// The reset types the emulator has been asked for on `uuid`, from its log.
    pub fn resets(&self, uuid: &str) -> Vec<String> {
        let needle = format!("System \"{uuid}\" power state set to \"");
        self.log()
            .lines()
            .filter_map(|l| l.split_once(&needle).map(|(_, r)| r))
            .filter_map(|r| r.split('"').next().map(str::to_string))
            .collect()
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The `bmc-gateway` binary: [`crate::procs::bin`], so it comes from the same single build
/// of every workspace binary as `coordinator` and `node-agent` (or from `FLEETMEND_BIN_DIR`).
pub fn gateway_binary() -> Result<PathBuf> {
    let p = crate::procs::bin("bmc-gateway");
    if !p.is_file() {
        bail!(
            "{} missing after building the workspace's binaries (is FLEETMEND_BIN_DIR right?)",
            p.display()
        );
    }
    Ok(p)
}

/// Certificates for one test: the CA, the gateway's, and helpers to issue clients'.
pub struct TestPki {
    /// The CA.
    pub ca: Ca,
    /// Directory holding PEM files.
    pub dir: tempfile::TempDir,
}

impl TestPki {
    /// A fresh CA for trust domain `fleet.test`.
    pub fn new() -> Result<Self> {
        Ok(Self {
            ca: Ca::generate("fleet.test")?,
            dir: tempfile::tempdir()?,
        })
    }

    /// Issues `role`/`name` (with IP SAN 127.0.0.1) and writes `name.crt`/`name.key`.
    pub fn issue_files(&self, role: Role, name: &str) -> Result<(PathBuf, PathBuf)> {
        let c = self.ca.issue(
            role,
            name,
            &IssueOptions {
                ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
                ..Default::default()
            },
        )?;
        Ok(c.write(self.dir.path(), true)?)
    }

    /// The CA certificate file.
    pub fn ca_file(&self) -> Result<PathBuf> {
        let p = self.dir.path().join("ca.crt");
        if !p.exists() {
            std::fs::write(&p, self.ca.cert_pem())?;
        }
        Ok(p)
    }

    /// In-memory TLS material for `role`/`name`.
    pub fn material(&self, role: Role, name: &str) -> Result<TlsMaterial> {
        let c = self.ca.issue(role, name, &IssueOptions::default())?;
        Ok(c.tls_material(self.ca.cert_pem().as_bytes())?)
    }
}

/// A running `bmc-gateway` process.
pub struct GatewayProc {
    child: Child,
    /// QUIC address.
    pub quic: SocketAddr,
    /// HTTP address (/metrics, /healthz).
    pub http: SocketAddr,
    /// The state directory (the request record).
    pub state_dir: PathBuf,
    /// The configuration file it runs with (for `bmc-gateway check --config`).
    pub config: PathBuf,
    /// Its certificate and key files (to restart it with the same ones).
    pub tls: (PathBuf, PathBuf),
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// Where a [`GatewayProc`] listens and keeps its state, for a restart "in the same place".
#[derive(Debug, Clone, Default)]
pub struct GatewayOptions {
    /// QUIC address; a free loopback port when `None`.
    pub quic: Option<SocketAddr>,
    /// State directory; one inside the gateway's own temporary directory when `None` (gone
    /// with the process handle).
    pub state_dir: Option<PathBuf>,
    /// Certificate and key files; a new `gateway/rack-1` certificate from the test PKI when
    /// `None`. A gateway restarted by systemd keeps its key, and with it the QUIC
    /// stateless-reset key derived from it, so its peers learn of the restart at once:
    /// pass [`GatewayProc::tls`] of the first run to restart it so.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl GatewayProc {
    /// Writes a config with `bmcs_toml` (the `[[bmc]]` tables) and starts the gateway with a
    /// `gateway/rack-1` certificate from `pki`; waits for `/healthz`.
    pub async fn start(pki: &TestPki, bmcs_toml: &str) -> Result<Self> {
        Self::start_with(pki, bmcs_toml, GatewayOptions::default()).await
    }

    /// As [`GatewayProc::start`], on a given QUIC address and state directory.
    pub async fn start_with(pki: &TestPki, bmcs_toml: &str, opts: GatewayOptions) -> Result<Self> {
        let bin = gateway_binary()?;
        let dir = tempfile::tempdir()?;
        let (cert, key) = match opts.tls {
            Some(files) => files,
            None => pki.issue_files(Role::Gateway, "rack-1")?,
        };
        let quic: SocketAddr = match opts.quic {
            Some(a) => a,
            None => format!("127.0.0.1:{}", free_udp_port()).parse()?,
        };
        let http: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse()?;
        let state_dir = opts.state_dir.unwrap_or_else(|| dir.path().join("state"));
        let cfg = format!(
            "listen = \"{quic}\"\nhttp_listen = \"{http}\"\nstate_dir = \"{}\"\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\n{bmcs_toml}",
            state_dir.display(),
            pki.ca_file()?.display(),
            cert.display(),
            key.display()
        );
        let cfg_path = dir.path().join("gateway.toml");
        std::fs::write(&cfg_path, cfg)?;
        let log = dir.path().join("gateway.log");
        let f = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .arg("--config")
            .arg(&cfg_path)
            .env("FLEETMEND_LOG", "info,bmc_gateway=debug")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut me = Self {
            child,
            quic,
            http,
            state_dir,
            config: cfg_path,
            tls: (cert, key),
            log,
            _dir: dir,
        };
        let start = Instant::now();
        loop {
            if let Some(st) = me.child.try_wait()? {
                bail!("bmc-gateway exited with {st}: {}", me.log());
            }
            if let Ok(body) = http_get(http, "/healthz").await
                && body.contains("ok")
            {
                break;
            }
            if start.elapsed() > START_TIMEOUT {
                bail!(
                    "bmc-gateway not healthy within {START_TIMEOUT:?}: {}",
                    me.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(me)
    }

    /// The gateway's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        http_get(self.http, "/metrics").await
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the gateway with SIGKILL (no chance to flush or close anything) and waits for it;
    /// returns its log.
    pub async fn kill(mut self) -> Result<String> {
        signal(self.child.id().context("already exited")?, "KILL")?;
        tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await??;
        Ok(self.log())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(mut self) -> Result<std::process::ExitStatus> {
        signal(self.child.id().context("already exited")?, "TERM")?;
        Ok(tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await??)
    }
}

/// A minimal HTTP/1.1 GET over TCP (for the gateway's own plain-HTTP endpoints).
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).to_string();
        if !text.starts_with("HTTP/1.1 200") {
            bail!("GET {path}: {}", text.lines().next().unwrap_or(""));
        }
        Ok(text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default())
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .context("HTTP GET timed out")?
}

/// A QUIC client of the gateway, as a coordinator (or, for refusal tests, anyone else).
pub struct GatewayClient {
    /// The client endpoint (kept alive with the connection).
    pub endpoint: quinn::Endpoint,
    /// The hello-accepted session.
    pub session: transport::Session,
}

impl GatewayClient {
    /// Connects with `tls` to the gateway at `addr`, saying `hello`.
    pub async fn connect(
        tls: &TlsMaterial,
        addr: SocketAddr,
        hello: HelloBody,
    ) -> Result<Self, transport::TransportError> {
        let endpoint = tls.client_endpoint(addr)?;
        let session =
            transport::connect(&endpoint, addr, "127.0.0.1", Role::Gateway, hello).await?;
        Ok(Self { endpoint, session })
    }

    /// The hello a coordinator sends.
    pub fn coordinator_hello() -> HelloBody {
        HelloBody::Coordinator(CoordinatorHello {
            coordinator: "test-coordinator".into(),
        })
    }

    /// The token [`GatewayClient::request`] sends with: epoch 1 of a store of its own.
    pub fn test_token() -> FencingToken {
        FencingToken {
            store: "test-store".into(),
            epoch: 1,
        }
    }

    /// Sends one request on its own stream, with [`GatewayClient::test_token`], and waits (up
    /// to `wait`) for the answer.
    pub async fn request(&self, req: PowerRequest, wait: Duration) -> Result<PowerResponse> {
        self.request_fenced(req, Self::test_token(), wait).await
    }

    /// Sends one request with `token` (as a coordinator of this release does: on a connection
    /// of protocol version 1 the request goes without it) and waits (up to `wait`) for the
    /// answer.
    pub async fn request_fenced(
        &self,
        req: PowerRequest,
        token: FencingToken,
        wait: Duration,
    ) -> Result<PowerResponse> {
        let work = async {
            let (mut send, mut recv) = self.session.conn.open_bi().await?;
            let max = protocol::frame::MAX_FRAME_LEN;
            if self.session.version >= protocol::fencing::FENCING_VERSION {
                let fenced = FencedPowerRequest {
                    request: req.clone(),
                    token,
                };
                transport::write_msg(&mut send, &fenced, max).await?;
            } else {
                transport::write_msg(&mut send, &req, max).await?;
            }
            send.finish()?;
            let resp: PowerResponse =
                transport::expect_msg(&mut recv, protocol::frame::MAX_FRAME_LEN).await?;
            anyhow::Ok(resp)
        };
        tokio::time::timeout(wait, work)
            .await
            .with_context(|| format!("no answer to {} within {wait:?}", req.id))?
    }
}
