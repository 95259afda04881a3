//! An APC rack PDU for tests: net-snmp's real `snmpd` on a loopback UDP port, answering for
//! the PDU's MIB through a `pass_persist` script that plays the outlet table, so the real
//! `fence_apc_snmp` (ClusterLabs fence-agents) drives it with real SNMP.
//!
//! The script keeps each outlet's state in `outlet-N` (`1` on, `2` off, as APC's
//! rPDUOutletStatusOutletState), logs every SET to `sets` (`off 1`, `on 2`, with the time in
//! `sets.timed`), refuses a SET on outlet N while `refuse-N` exists (SNMP `notWritable`, as a
//! locked outlet does), and with `lag-N` holding seconds lets outlet N read on that long after
//! an off (a PDU's delayed off): the window in which a crash between two outlets' offs is
//! tested. `sysObjectID` says APC rPDU (`.1.3.6.1.4.1.318.1.3.4.5`), which is how the agent
//! picks its OIDs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use crate::bmc_sim::find_program;
use crate::procs::free_udp_port;

/// The outlet table, as the agent reads it (APC PowerNet-MIB, rPDU).
const PASS_PY: &str = r#"
import os, sys, time
D = sys.argv[1]
N = int(sys.argv[2])
BASE = ".1.3.6.1.4.1.318.1.1.12"
NAME = BASE + ".3.5.1.1.2."    # rPDUOutletStatusOutletName
STATE = BASE + ".3.5.1.1.4."   # rPDUOutletStatusOutletState: 1 on, 2 off
CTRL = BASE + ".3.3.1.1.4."    # rPDUOutletControlOutletCommand: 1 on, 2 off

def path(n):
    return os.path.join(D, n)

def state(i):
    try:
        s = open(path("outlet-%d" % i)).read().strip()
    except OSError:
        s = "1"
    # A delayed off: the outlet reads on until its lag has passed.
    try:
        until = float(open(path("off-at-%d" % i)).read())
        if time.time() < until:
            return "1"
    except (OSError, ValueError):
        pass
    return s

def oids():
    out = []
    for i in range(1, N + 1):
        out.append((NAME + str(i), "string", "outlet%d" % i))
    for i in range(1, N + 1):
        out.append((STATE + str(i), "integer", None, i))
    for i in range(1, N + 1):
        out.append((CTRL + str(i), "integer", None, i))
    return out

def key(o):
    return [int(x) for x in o.strip(".").split(".")]

def value(entry):
    if entry[1] == "string":
        return entry[2]
    i = entry[3]
    return state(i)

def log(line):
    with open(path("sets"), "a") as f:
        f.write(line + "\n")
    with open(path("sets.timed"), "a") as f:
        f.write("%d %s\n" % (time.time_ns(), line))

def reply(*lines):
    sys.stdout.write("".join(l + "\n" for l in lines))
    sys.stdout.flush()

while True:
    cmd = sys.stdin.readline()
    if not cmd:
        break
    cmd = cmd.strip()
    if not cmd:
        # snmpd follows a set's value line with an empty line.
        continue
    if cmd == "PING":
        reply("PONG")
        continue
    oid = sys.stdin.readline().strip()
    table = oids()
    if cmd == "get":
        hit = [e for e in table if e[0] == oid]
        if hit:
            reply(oid, hit[0][1], value(hit[0]))
        else:
            reply("NONE")
    elif cmd == "getnext":
        after = [e for e in table if key(e[0]) > key(oid)]
        after.sort(key=lambda e: key(e[0]))
        if after:
            reply(after[0][0], after[0][1], value(after[0]))
        else:
            reply("NONE")
    elif cmd == "set":
        typed = sys.stdin.readline().strip().split()
        if not oid.startswith(CTRL):
            reply("not-writable")
            continue
        i = int(oid[len(CTRL):])
        if i < 1 or i > N:
            reply("no-creation")
            continue
        if os.path.exists(path("refuse-%d" % i)):
            log("refused %d" % i)
            reply("not-writable")
            continue
        v = typed[-1] if typed else ""
        if v not in ("1", "2"):
            reply("wrong-value")
            continue
        log(("on %d" if v == "1" else "off %d") % i)
        if v == "2":
            try:
                lag = float(open(path("lag-%d" % i)).read())
            except (OSError, ValueError):
                lag = 0
            with open(path("off-at-%d" % i), "w") as f:
                f.write(str(time.time() + lag))
        else:
            try:
                os.unlink(path("off-at-%d" % i))
            except OSError:
                pass
        with open(path("outlet-%d" % i), "w") as f:
            f.write(v + "\n")
        reply("DONE")
    else:
        reply("NONE")
"#;

/// How long snmpd may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A running APC PDU with `outlets` outlets, all on.
pub struct SnmpPdu {
    child: Child,
    dir: tempfile::TempDir,
    /// UDP port.
    pub port: u16,
    /// The read-write community.
    pub community: String,
}

impl SnmpPdu {
    /// Starts snmpd playing the PDU and waits until `snmpget` reads outlet 1.
    pub async fn start(outlets: u32, community: &str) -> Result<Self> {
        let snmpd = find_program("snmpd")?;
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        let port = free_udp_port();
        for i in 1..=outlets {
            std::fs::write(d.join(format!("outlet-{i}")), "1\n")?;
        }
        std::fs::write(d.join("sets"), "")?;
        std::fs::write(d.join("sets.timed"), "")?;
        std::fs::write(d.join("pdu.py"), PASS_PY)?;
        let conf = format!(
            "agentaddress udp:127.0.0.1:{port}\n\
             rwcommunity {community} 127.0.0.1\n\
             sysObjectID .1.3.6.1.4.1.318.1.3.4.5\n\
             sysDescr APC Web/SNMP Management Card (fleetmend test PDU)\n\
             pass_persist .1.3.6.1.4.1.318.1.1.12 /usr/bin/python3 {} {} {outlets}\n",
            d.join("pdu.py").display(),
            d.display()
        );
        std::fs::write(d.join("pdu-snmpd.conf"), conf)?;
        // snmpd writes its persistent data as `snmpd.conf` there: never the config file.
        std::fs::create_dir_all(d.join("persist"))?;
        let log = std::fs::File::create(d.join("snmpd.log"))?;
        let child = Command::new(&snmpd)
            // Foreground, only this file, log to stdout, no SMUX (another snmpd on the
            // machine may hold its TCP port 199).
            .args(["-f", "-C", "-Lo", "-I", "-smux", "-c"])
            .arg(d.join("pdu-snmpd.conf"))
            .env("SNMP_PERSISTENT_DIR", d.join("persist"))
            .env("MIBS", "")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", snmpd.display()))?;
        let me = Self {
            child,
            dir,
            port,
            community: community.to_string(),
        };
        let start = Instant::now();
        loop {
            if me.read_outlet_snmp(1).await.is_ok_and(|s| s == "1") {
                break;
            }
            if start.elapsed() > START_TIMEOUT {
                bail!(
                    "snmpd not answering within {START_TIMEOUT:?}: {}",
                    std::fs::read_to_string(me.dir.path().join("snmpd.log")).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(me)
    }

    /// The simulator's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Reads outlet `n`'s state over SNMP with net-snmp's `snmpget` (`1` on, `2` off).
    pub async fn read_outlet_snmp(&self, n: u32) -> Result<String> {
        let out = Command::new(find_program("snmpget")?)
            .args([
                "-v2c",
                "-c",
                &self.community,
                "-m",
                "",
                "-Oqv",
                "-t",
                "1",
                "-r",
                "0",
            ])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg(format!(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.{n}"))
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            bail!("snmpget: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// True when outlet `n` is on (from the simulator's own file, no SNMP).
    pub fn outlet_on(&self, n: u32) -> bool {
        std::fs::read_to_string(self.dir.path().join(format!("outlet-{n}")))
            .is_ok_and(|s| s.trim() == "1")
    }

    /// Every SET the PDU took, in order: `off 1`, `on 2`, `refused 2`.
    pub fn sets(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("sets"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every SET with when it was taken.
    pub fn timed_sets(&self) -> Vec<(SystemTime, String)> {
        std::fs::read_to_string(self.dir.path().join("sets.timed"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (ns, what) = l.split_once(' ')?;
                let ns: u64 = ns.parse().ok()?;
                Some((
                    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns),
                    what.to_string(),
                ))
            })
            .collect()
    }

    /// Makes outlet `n` refuse every SET (or take them again).
    pub fn refuse(&self, n: u32, refuse: bool) -> Result<()> {
        let f = self.dir.path().join(format!("refuse-{n}"));
        if refuse {
            std::fs::write(f, "")?;
        } else if f.exists() {
            std::fs::remove_file(f)?;
        }
        Ok(())
    }

    /// Makes outlet `n` read on for `secs` after an off.
    pub fn lag(&self, n: u32, secs: f64) -> Result<()> {
        std::fs::write(self.dir.path().join(format!("lag-{n}")), secs.to_string())?;
        Ok(())
    }

    /// The file the agent's password or community would be read from in a gateway config.
    pub fn write_community(&self, dir: &Path, name: &str, community: &str) -> Result<PathBuf> {
        let f = dir.join(name);
        std::fs::write(&f, format!("{community}\n"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))?;
        Ok(f)
    }
}

impl Drop for SnmpPdu {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
