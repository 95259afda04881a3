//! The demo's power control: one OpenIPMI `ipmi_sim` BMC per machine, each on its own
//! loopback UDP port, and a real `bmc-gateway` in front of all eight that the coordinator's
//! `[gateways]` section points at.
//!
//! Each simulator's `chassis_control` script ([`CHASSIS_CONTROL`]) keeps the machine's power
//! state in a file and appends every change to an `events` file with its time; the demo reads
//! those lines ([`Bmcs::power_events`]) and plays the hardware under them: power off stops
//! the machine (its agent and kubelet), power on boots it (a new boot id, the agent and
//! kubelet start). So every power action of the timeline is one the BMC received from the
//! gateway.
//!
//! Without `ipmi_sim` [`Bmcs::start`] returns `None` and the demo falls back to its stand-in
//! script (it says so).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use testkit::bmc_sim::{find_program, write_ipmi_sim_config};
use testkit::procs::{Pki, Proc, command, free_tcp_port, free_udp_port, http_get};

use super::assets::CHASSIS_CONTROL;
use super::write_script;

/// Bound for a simulator or the gateway to start answering: each is ready in milliseconds
/// on an idle machine; a loaded 2-core CI machine may take seconds.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The BMC administrator every simulator knows (the gateway reads the password from a file).
pub(super) const BMC_USER: &str = "admin";
pub(super) const BMC_PASSWORD: &str = "demo-bmc-secret";

/// One simulated BMC.
pub(super) struct Bmc {
    /// The machine's address, as the coordinator and the gateway name it.
    pub(super) machine: &'static str,
    /// The machine's serial, as the inventory has it (the gateway refuses any other).
    serial: String,
    /// UDP port of its IPMI LAN interface on 127.0.0.1.
    pub(super) port: u16,
    dir: PathBuf,
    /// Bytes of `events` already read.
    read: usize,
    proc: Option<Proc>,
}

/// A power change one BMC's chassis control applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PowerEvent {
    /// The machine's address.
    pub(super) machine: &'static str,
    /// `on` (power on, or a reset of a machine that is on) or `off`.
    pub(super) on: bool,
    /// What the BMC was asked for, as its chassis control saw it (`power 0`, `reset 1`, …).
    pub(super) what: String,
    /// When, as `HH:MM:SS.mmm` (local to the chassis control's clock: this machine's).
    pub(super) at: String,
}

/// Every simulated BMC and the gateway in front of them.
pub(super) struct Bmcs {
    pub(super) bmcs: Vec<Bmc>,
    gateway: Option<Proc>,
    /// The gateway's QUIC address, for `[[gateways.targets]]`.
    pub(super) quic: SocketAddr,
    /// Every power event seen so far, in order (the dead-machine story checks them).
    pub(super) seen: Vec<PowerEvent>,
}

impl Bmcs {
    /// Starts one `ipmi_sim` per machine (powered on) and a `bmc-gateway` for all of them
    /// with a `gateway/demo-racks` certificate from `pki`; `None` when `ipmi_sim` is not
    /// installed.
    pub(super) fn start(
        dir: &Path,
        pki: &Pki,
        machines: &[(&'static str, String)],
    ) -> anyhow::Result<Option<Self>> {
        let Ok(sim) = find_program("ipmi_sim") else {
            return Ok(None);
        };
        let pw_file = dir.join("bmc.password");
        std::fs::write(&pw_file, format!("{BMC_PASSWORD}\n"))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&pw_file, std::fs::Permissions::from_mode(0o600))?;
        }
        let mut bmcs = Vec::new();
        for (machine, serial) in machines {
            bmcs.push(start_sim(
                &sim,
                &dir.join(format!("bmc-{machine}")),
                machine,
                serial,
            )?);
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for b in &mut bmcs {
            b.wait_listening(deadline)?;
        }

        let tls = pki.issue("gateway", "demo-racks", &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        let quic: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse()?;
        let http: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse()?;
        let mut cfg = format!(
            "listen = \"{quic}\"\nhttp_listen = \"{http}\"\nstate_dir = {:?}\n\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n\n",
            dir.join("gateway-state").display().to_string(),
            tls.ca.display().to_string(),
            tls.cert.display().to_string(),
            tls.key.display().to_string(),
        );
        for b in &bmcs {
            cfg.push_str(&format!(
                "[[bmc]]\nmachine = \"{}\"\nserial = \"{}\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\n\
                 username = \"{BMC_USER}\"\npassword_file = {:?}\n\n",
                b.machine,
                b.serial,
                b.port,
                pw_file.display().to_string(),
            ));
        }
        let cfg_path = dir.join("gateway.toml");
        std::fs::write(&cfg_path, cfg)?;
        let mut cmd = command("bmc-gateway");
        cmd.arg("--config").arg(&cfg_path);
        let mut gateway = Proc::spawn("bmc-gateway", cmd, &dir.join("gateway.log"))?;
        loop {
            if let Some(st) = gateway.try_exit() {
                bail!(
                    "bmc-gateway exited with {st}: {}",
                    gateway.log_text().trim()
                );
            }
            if matches!(http_get(http, "/healthz"), Ok((200, _))) {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "bmc-gateway not healthy within {START_TIMEOUT:?}: {}",
                    gateway.log_text().trim()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Some(Self {
            bmcs,
            gateway: Some(gateway),
            quic,
            seen: Vec::new(),
        }))
    }

    /// The power changes the BMCs applied since the last call, oldest first.
    pub(super) fn power_events(&mut self) -> Vec<PowerEvent> {
        let mut new = Vec::new();
        for b in &mut self.bmcs {
            let Ok(text) = std::fs::read_to_string(b.dir.join("events")) else {
                continue;
            };
            // Only whole lines: the script may be writing the next one.
            let Some(end) = text.rfind('\n').map(|i| i + 1) else {
                continue;
            };
            if end <= b.read {
                continue;
            }
            for line in text[b.read..end].lines() {
                if let Some(e) = parse_event(b.machine, line) {
                    new.push(e);
                }
            }
            b.read = end;
        }
        self.seen.extend(new.iter().cloned());
        new
    }

    /// Sets what `machine`'s BMC reads as its power state, for a change the BMC did not make
    /// (the rack losing and regaining power).
    pub(super) fn set_power_state(&self, machine: &str, on: bool) -> anyhow::Result<()> {
        let b = self
            .bmcs
            .iter()
            .find(|b| b.machine == machine)
            .with_context(|| format!("no BMC for {machine}"))?;
        std::fs::write(b.dir.join("power"), if on { "1\n" } else { "0\n" })?;
        Ok(())
    }

    /// Stops the gateway, then every simulator.
    pub(super) fn stop(&mut self) {
        if let Some(mut g) = self.gateway.take() {
            let _ = g.sigterm(Duration::from_secs(5));
        }
        for b in &mut self.bmcs {
            if let Some(mut p) = b.proc.take() {
                p.sigkill();
            }
        }
    }
}

impl Drop for Bmcs {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Bmc {
    /// Waits until the simulator's UDP port is bound (read from `/proc/net/udp`, so the demo
    /// needs no IPMI client); fails if it exited.
    fn wait_listening(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let needle = format!("0100007F:{:04X}", self.port);
        loop {
            let proc = self.proc.as_mut().context("simulator stopped")?;
            if let Some(st) = proc.try_exit() {
                bail!(
                    "ipmi_sim for {} exited with {st}: {}",
                    self.machine,
                    proc.log_text().trim()
                );
            }
            let udp = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
            if udp
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(needle.as_str()))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "ipmi_sim for {} not listening on 127.0.0.1:{} within {START_TIMEOUT:?}: {}",
                    self.machine,
                    self.port,
                    proc.log_text().trim()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Writes one simulator's `lan.conf`, emulator commands and chassis control into `dir` and
/// starts it on a free loopback UDP port.
fn start_sim(sim: &Path, dir: &Path, machine: &'static str, serial: &str) -> anyhow::Result<Bmc> {
    std::fs::create_dir_all(dir.join("state"))?;
    std::fs::write(dir.join("power"), "1\n")?;
    std::fs::write(dir.join("events"), "")?;
    let script = write_script(dir, "chassis_control", CHASSIS_CONTROL)?;
    let port = free_udp_port();
    write_ipmi_sim_config(dir, machine, port, &script, BMC_USER, BMC_PASSWORD)?;
    let mut cmd = Command::new(sim);
    cmd.arg("-c")
        .arg(dir.join("lan.conf"))
        .arg("-f")
        .arg(dir.join("emu.cmd"))
        .arg("-s")
        .arg(dir.join("state"))
        .arg("-n")
        .current_dir(dir);
    let proc = Proc::spawn(
        &format!("ipmi_sim {machine}"),
        cmd,
        &dir.join("ipmi_sim.log"),
    )?;
    Ok(Bmc {
        machine,
        serial: serial.to_string(),
        port,
        dir: dir.to_path_buf(),
        read: 0,
        proc: Some(proc),
    })
}

/// Parses one `events` line of [`CHASSIS_CONTROL`]: `<unix seconds.nanos> <param> <value>`.
fn parse_event(machine: &'static str, line: &str) -> Option<PowerEvent> {
    let mut words = line.split_whitespace();
    let (t, param, value) = (words.next()?, words.next()?, words.next()?);
    let on = match (param, value) {
        ("power", "1") | ("reset", _) => true,
        ("power", "0") | ("shutdown", _) => false,
        _ => return None,
    };
    let (secs, nanos) = t.split_once('.').unwrap_or((t, "0"));
    let at = jiff::Timestamp::new(secs.parse().ok()?, nanos.parse().unwrap_or(0))
        .ok()
        .map(|ts| {
            ts.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%H:%M:%S%.3f")
                .to_string()
        })?;
    Some(PowerEvent {
        machine,
        on,
        what: format!("{param} {value}"),
        at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_into_power_changes() {
        let off = parse_event("192.0.2.13", "1790000000.250000000 power 0").expect("parsed");
        assert!(!off.on);
        assert_eq!(off.what, "power 0");
        assert_eq!(off.at.len(), "HH:MM:SS.mmm".len(), "{}", off.at);
        assert!(off.at.ends_with(".250"), "{}", off.at);
        assert!(parse_event("m", "1790000000.0 power 1").expect("on").on);
        assert!(parse_event("m", "1790000000.0 reset 1").expect("reset").on);
        assert_eq!(parse_event("m", "1790000000.0 boot 1"), None);
        assert_eq!(parse_event("m", "garbage"), None);
    }
}
