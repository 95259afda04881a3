//! `--ha`: the demo's coordinator is two, on one etcd (the test kit's, built from its Go
//! module by `scripts/setup-test-deps.sh`), one leading and one standing by, with a lease
//! TTL of 3 s so the takeover fits the story. The dead-machine story then kills the leader
//! (SIGKILL) once its fence flow has started; the standby takes the lead, resumes the flow
//! from etcd and finishes it, and the timeline says who led when.
//!
//! `--etcd`: the same etcd under one coordinator (`backend = "etcd"`), no standby: the three
//! stories as without it, the state in etcd.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::etcd::{Etcd, Options};
use testkit::procs::Coordinator;

use super::Demo;

/// Where the demo's coordinator keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoreMode {
    /// SQLite (the default).
    Sqlite,
    /// `--etcd`: one coordinator on an etcd.
    Etcd,
    /// `--ha`: two coordinators on an etcd.
    Ha,
}

/// The demo's lease TTL: a takeover about 3 s after the leader dies.
pub(super) const TTL: &str = "3s";

/// The second coordinator and the etcd under both.
pub(super) struct Ha {
    pub(super) etcd: Etcd,
    pub(super) standby: Option<Coordinator>,
    /// When the standby took the lead.
    pub(super) took_over: Option<(jiff::Timestamp, Instant)>,
}

/// Starts the etcd; the `[store]` and `[ha]` sections for the coordinators' configuration.
pub(super) fn start_etcd() -> anyhow::Result<(Etcd, String)> {
    let etcd = Etcd::start(Options::default())?;
    let section = format!(
        "\n[store]\nbackend = \"etcd\"\nendpoints = [{:?}]\nprefix = \"/fleetmend-demo/\"\n\n[ha]\nlease_ttl = \"{TTL}\"\n",
        etcd.endpoint(0)
    );
    Ok((etcd, section))
}

/// The standby: the leader's configuration with its own name and ports.
pub(super) fn start_standby(dir: &Path, leader: &Coordinator) -> anyhow::Result<Coordinator> {
    leader.start_peer(&dir.join("coordinator-b"), "coord-b")
}

/// What a coordinator's `/healthz` says of its role, on one line.
fn role_of(c: &Coordinator) -> String {
    match c.http_get("/healthz") {
        Ok((code, body)) => format!("{code} {}", body.trim()),
        Err(e) => format!("no answer ({e})"),
    }
}

impl Demo {
    /// The coordinators' roles, for the timeline.
    pub(super) fn say_roles(&self) {
        self.say(
            "leader",
            &format!("coord ({}): {}", self.coord().quic, role_of(self.coord())),
        );
        if let Some(s) = self.ha.as_ref().and_then(|h| h.standby.as_ref()) {
            self.say("leader", &format!("coord-b ({}): {}", s.quic, role_of(s)));
        }
    }

    /// Kills the leader (SIGKILL) and waits until the standby leads; it is the demo's
    /// coordinator from then on. Nothing without `--ha`.
    pub(super) fn failover(&mut self) -> anyhow::Result<()> {
        let Some(standby) = self.ha.as_mut().and_then(|h| h.standby.take()) else {
            return Ok(());
        };
        let mut old = self
            .coord
            .replace(standby)
            .expect("the demo's coordinator runs");
        if let Some(mut p) = old.proc.take() {
            p.sigkill();
        }
        self.say(
            "inject",
            &format!(
                "the leading coordinator (coord, {}) is killed (SIGKILL) in the middle of the fence flow; its lease runs out within {TTL}",
                old.quic
            ),
        );
        let killed = Instant::now();
        let body = loop {
            super::stopped()?;
            if let Ok((200, body)) = self.coord().http_get("/healthz")
                && body.starts_with("ok: leader")
            {
                break body;
            }
            self.serve_power()?;
            if killed.elapsed() > Duration::from_secs(60) {
                anyhow::bail!(
                    "coord-b did not take the lead within 60 s: {}",
                    role_of(self.coord())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if let Some(h) = self.ha.as_mut() {
            h.took_over = Some((jiff::Timestamp::now(), Instant::now()));
        }
        self.say(
            "leader",
            &format!(
                "coord-b ({}) took the lead {:.1} s after the kill: {}; it resumes the flow from etcd",
                self.coord().quic,
                killed.elapsed().as_secs_f64(),
                body.trim()
            ),
        );
        Ok(())
    }

    /// After a takeover: waits until every agent reports to the new leader, and says when.
    pub(super) fn wait_fleet_back(&mut self) -> anyhow::Result<()> {
        let Some((at, since)) = self.ha.as_ref().and_then(|h| h.took_over) else {
            return Ok(());
        };
        let n = self.machines.len();
        self.wait(
            "every agent to report to the new leader",
            super::SCENARIO_TIMEOUT,
            |d| {
                (d.snap.machines.len() == n
                    && d.snap
                        .machines
                        .iter()
                        .all(|m| m.last_report_at.is_some_and(|t| t > at)))
                .then_some(())
            },
        )?;
        self.say(
            "leader",
            &format!(
                "all {n} agents report to coord-b ({:.1} s after it took the lead); not one machine was judged unreachable by the takeover",
                since.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }
}
