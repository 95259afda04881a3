//! A coordinator as a real process for tests ([`Coordinator`]): its configuration and
//! certificates written, started and restarted (after a clean stop, a crash, or an exit of
//! its own, as systemd would), other coordinators of the same store started beside it
//! ([`Coordinator::start_peer`]), and `coordinatorctl` pointed at it. Re-exported from
//! [`crate::procs`]; the process plumbing it builds on is [`crate::process`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;

use crate::process::{
    CertFiles, Pki, Proc, START_TIMEOUT, command, free_tcp_port, free_udp_port, http_get, run_ok,
    wait_for,
};

/// Settings for a test coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    /// `health.report_interval`.
    pub report_interval: Duration,
    /// `health.unreachable_grace`.
    pub unreachable_grace: Duration,
    /// Inventory file contents (TOML), if any.
    pub inventory: Option<String>,
    /// Extra TOML appended to the config.
    pub extra: String,
    /// Extra keys of the `[health]` section (e.g. `goodbye_grace = "2s"`).
    pub health_extra: String,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        Self {
            report_interval: Duration::from_millis(300),
            unreachable_grace: Duration::from_millis(900),
            inventory: None,
            extra: String::new(),
            health_extra: String::new(),
        }
    }
}

/// A coordinator process with its config, ports, and an admin certificate to talk to it.
#[derive(Debug)]
pub struct Coordinator {
    /// The running process (None while stopped).
    pub proc: Option<Proc>,
    /// QUIC address.
    pub quic: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    /// Its working directory (config, database, logs).
    pub dir: PathBuf,
    /// Config file.
    pub config: PathBuf,
    /// Admin certificate used by [`Coordinator::ctl`].
    pub admin: CertFiles,
    /// Extra environment of the next starts (e.g. `FLEETMEND_FENCE_KILL_AT`).
    pub env: Vec<(String, String)>,
    starts: u32,
}

impl Coordinator {
    /// Issues a coordinator certificate (for 127.0.0.1) and an admin one, writes the config
    /// into `dir`, starts the process and waits until `/healthz` answers.
    pub fn start(dir: &Path, pki: &Pki, opts: &CoordinatorOptions) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let tls = pki.issue("coordinator", "coord", &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        let admin = pki.issue("admin", "tester", &[])?;
        let quic = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()));
        let q = |p: &Path| format!("{:?}", p.to_string_lossy());
        let mut cfg = format!(
            "name = \"coord\"\nlisten = \"{quic}\"\ndatabase = {}\nshutdown_grace = \"3s\"\n",
            q(&dir.join("coordinator.db"))
        );
        if let Some(inv) = &opts.inventory {
            let p = dir.join("inventory.toml");
            std::fs::write(&p, inv)?;
            cfg.push_str(&format!("inventory = {}\n", q(&p)));
        }
        cfg.push_str(&format!(
            "{}\n[tls]\nca = {}\ncert = {}\nkey = {}\n\n[http]\nlisten = \"{http}\"\n\n[health]\nreport_interval = \"{}ms\"\nunreachable_grace = \"{}ms\"\n{}\n",
            opts.extra,
            q(&tls.ca),
            q(&tls.cert),
            q(&tls.key),
            opts.report_interval.as_millis(),
            opts.unreachable_grace.as_millis(),
            opts.health_extra
        ));
        let config = dir.join("coordinator.toml");
        std::fs::write(&config, cfg)?;
        let mut c = Self {
            proc: None,
            quic,
            http,
            dir: dir.to_path_buf(),
            config,
            admin,
            env: Vec::new(),
            starts: 0,
        };
        c.restart()?;
        Ok(c)
    }

    /// Another coordinator of the same store (etcd) and fleet: this one's configuration with
    /// `name`, its own ports and `dir` (its database path too, unused on etcd). Started; a
    /// standby's `/healthz` answers 200 as a leader's does.
    pub fn start_peer(&self, dir: &Path, name: &str) -> anyhow::Result<Self> {
        self.start_peer_edited(dir, name, |t| t)
    }

    /// [`Coordinator::start_peer`], its configuration text passed through `edit` last (an
    /// etcd endpoint of its own, say).
    pub fn start_peer_edited(
        &self,
        dir: &Path,
        name: &str,
        edit: impl FnOnce(String) -> String,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let quic = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()));
        let text = std::fs::read_to_string(&self.config)?;
        let replace = |text: String, from: &str, to: &str| -> anyhow::Result<String> {
            if !text.contains(from) {
                bail!("{} has no {from:?}", self.config.display());
            }
            Ok(text.replacen(from, to, 1))
        };
        let text = replace(text, "name = \"coord\"", &format!("name = {name:?}"))?;
        let text = replace(
            text,
            &format!("listen = \"{}\"", self.quic),
            &format!("listen = \"{quic}\""),
        )?;
        let text = replace(
            text,
            &format!("listen = \"{}\"", self.http),
            &format!("listen = \"{http}\""),
        )?;
        let text = replace(
            text,
            &format!("{:?}", self.dir.join("coordinator.db").to_string_lossy()),
            &format!("{:?}", dir.join("coordinator.db").to_string_lossy()),
        )?;
        let config = dir.join("coordinator.toml");
        std::fs::write(&config, edit(text))?;
        let mut c = Self {
            proc: None,
            quic,
            http,
            dir: dir.to_path_buf(),
            config,
            admin: self.admin.clone(),
            env: Vec::new(),
            starts: 0,
        };
        c.restart()?;
        Ok(c)
    }

    /// Starts the process again after it exited by itself (as systemd's `Restart=` does
    /// for a deposed leader's exit 75), without waiting for it to serve (its etcd may be
    /// down); returns the exit status it had.
    pub fn respawn_after_exit(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let status = match self.proc.as_mut() {
            Some(p) => p
                .try_exit()
                .context("the coordinator is still running: nothing to restart")?,
            None => bail!("the coordinator was not started"),
        };
        self.proc = None;
        self.proc = Some(self.spawn()?);
        Ok(status)
    }

    /// Waits until its `/healthz` says it leads (`ok` alone for the sole coordinator of a
    /// SQLite store, `ok: leader …` when elected); the body.
    pub fn wait_leading(&self, timeout: Duration) -> anyhow::Result<String> {
        wait_for("the coordinator to lead", timeout, || {
            match http_get(self.http, "/healthz") {
                Ok((200, body)) if body == "ok\n" || body.starts_with("ok: leader") => Ok(body),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn spawn(&mut self) -> anyhow::Result<Proc> {
        self.starts += 1;
        let mut cmd = command("coordinator");
        cmd.arg("--config")
            .arg(&self.config)
            .env("FLEETMEND_LOG", "info,coordinator=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let log = self.dir.join(format!("coordinator-{}.log", self.starts));
        Proc::spawn("coordinator", cmd, &log)
    }

    /// Starts the process (again) with the same config and waits until it serves.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.proc.take() {
            // A clean drain ends with exit code 0.
            let code = p.sigterm(Duration::from_secs(10))?;
            if code != Some(0) {
                bail!(
                    "coordinator exited with {code:?} on SIGTERM:\n{}",
                    p.log_text()
                );
            }
        }
        let mut proc = self.spawn()?;
        let http = self.http;
        wait_for("coordinator /healthz", START_TIMEOUT, || {
            if let Some(s) = proc.try_exit() {
                return Ok(Err(format!(
                    "coordinator exited ({s}) during start:\n{}",
                    proc.log_text()
                )));
            }
            match http_get(http, "/healthz") {
                Ok((200, _)) => Ok(Ok(())),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            }
        })?
        .map_err(anyhow::Error::msg)?;
        self.proc = Some(proc);
        Ok(())
    }

    /// A crash and a restart: SIGKILL (no connection closed, nothing flushed beyond what
    /// the store had made durable), then the process again with the same config, waiting
    /// until it serves.
    pub fn crash_restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.proc.take() {
            p.sigkill();
        }
        self.restart()
    }

    /// The current process's log.
    pub fn log_text(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// Waits until the current process's log has a line containing all of `needles`.
    pub fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> anyhow::Result<String> {
        self.proc
            .as_ref()
            .context("coordinator is not running")?
            .wait_for_log(needles, timeout)
    }

    /// Certificate files for an agent called `hostname` (issued on demand).
    pub fn agent_tls(pki: &Pki, hostname: &str) -> anyhow::Result<CertFiles> {
        pki.issue("node", hostname, &[])
    }

    /// `coordinatorctl --server … --ca … --cert … --key … <args>`, not started: for a test
    /// that drives the process itself (a `--follow` read a line at a time, say).
    pub fn ctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = command("coordinatorctl");
        cmd.arg("--server")
            .arg(self.quic.to_string())
            .arg("--ca")
            .arg(&self.admin.ca)
            .arg("--cert")
            .arg(&self.admin.cert)
            .arg("--key")
            .arg(&self.admin.key)
            .args(args);
        cmd
    }

    /// Runs `coordinatorctl --server … --ca … --cert … --key … <args>`.
    pub fn ctl(&self, args: &[&str]) -> anyhow::Result<Output> {
        run_ok(&mut self.ctl_command(args))
    }

    /// Runs `coordinatorctl <args>` (which must include `--json`) and parses stdout.
    pub fn ctl_json<T: DeserializeOwned>(&self, args: &[&str]) -> anyhow::Result<T> {
        let out = self.ctl(args)?;
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "coordinatorctl {args:?} printed no valid JSON: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `machines list --json`.
    pub fn machines(&self) -> anyhow::Result<Vec<crate::ctl_json::MachineSummary>> {
        self.ctl_json(&["machines", "list", "--json"])
    }

    /// `machines show ADDRESS --json`.
    pub fn machine(&self, address: &str) -> anyhow::Result<crate::ctl_json::MachineDetail> {
        self.ctl_json(&["machines", "show", address, "--json"])
    }

    /// Waits until the machine `hostname` is listed in `state`; returns its summary.
    pub fn wait_for_state(
        &self,
        hostname: &str,
        state: &str,
        timeout: Duration,
    ) -> anyhow::Result<crate::ctl_json::MachineSummary> {
        wait_for(&format!("{hostname} to be {state}"), timeout, || {
            let list = self.machines().map_err(|e| e.to_string())?;
            let m = list
                .into_iter()
                .find(|m| m.spec.hostname == hostname)
                .ok_or_else(|| format!("{hostname} not listed"))?;
            if m.state == state {
                Ok(m)
            } else {
                Err(format!("{} ({})", m.state, m.reason))
            }
        })
    }

    /// GET on the HTTP endpoint: (status, body).
    pub fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.http, path)
    }

    /// One scrape of `/metrics` (an error unless it answers 200).
    pub fn scrape(&self) -> anyhow::Result<String> {
        let (code, body) = self.http_get("/metrics")?;
        anyhow::ensure!(code == 200, "/metrics answered {code}: {body}");
        Ok(body)
    }
}
