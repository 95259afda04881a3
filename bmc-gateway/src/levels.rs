//! Fencing levels, as in Pacemaker's fencing topology: a machine's ordered levels, each a set
//! of devices that must all succeed. Level 1 is the machine's BMC; the next levels are the PDU
//! outlets that feed it (both outlets of a machine with two power supplies).
//!
//! [`Levels`] is itself a [`PowerControl`], so a fence keeps its meaning from
//! [`crate::actions`] (power off, then read the state back until it reads off) and its
//! at-most-once record and one-action-per-machine queue from [`crate::gateway`]. A power off
//! tries level 1; when a device of a level cannot be reached or refuses, it tries the next.
//! The level that acted is remembered (on disk, in the state directory, before its first
//! device is switched), and the read-back and the power-on after the release go through that
//! level: "off" means every device of the acting level reads off. A soft off, a cycle and a
//! reset only ever go to level 1: cutting an outlet is a fence, not a repair.
//!
//! This module opens no connection itself; the devices are [`PowerControl`]s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tracing::{info, warn};

use crate::power::{BmcError, ChassisOp, PowerControl, PowerReading, PowerState};

/// One device of a level and its name for messages (`BMC ipmi 10.1.0.1:623`,
/// `pdu-a outlet 3`).
pub struct Device {
    /// For messages.
    pub name: String,
    /// Its power.
    pub power: Arc<dyn PowerControl>,
}

/// A machine's levels, in order; level 1 first.
pub struct Levels {
    machine: String,
    levels: Vec<Vec<Device>>,
    /// The level (0-based) that acted last, when it is not level 1.
    acting: Mutex<Option<usize>>,
    /// Where the acting level is kept across restarts (`None`: memory only).
    file: Option<PathBuf>,
}

/// The file in `state_dir` that keeps which level of `machine` acted last.
pub fn acting_file(state_dir: &Path, machine: &str) -> PathBuf {
    let safe: String = machine
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    state_dir.join("levels").join(format!("{safe}.level"))
}

impl Levels {
    /// `levels` of `machine` (level 1 first, each non-empty); the acting level is read from
    /// and written to `file` when given.
    pub fn new(machine: String, levels: Vec<Vec<Device>>, file: Option<PathBuf>) -> Self {
        let acting = file
            .as_deref()
            .and_then(read_acting)
            .filter(|l| *l < levels.len());
        if let Some(l) = acting {
            info!(%machine, level = l + 1, "fencing level: the last power-off of this machine acted at this level; the power-on goes through it");
        }
        Self {
            machine,
            levels,
            acting: Mutex::new(acting),
            file,
        }
    }

    /// How many levels.
    pub fn len(&self) -> usize {
        self.levels.len()
    }

    /// Never true: level 1 is always there.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// The names of the devices of level `i` (0-based), joined.
    fn names(&self, i: usize) -> String {
        self.levels[i]
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn acting(&self) -> usize {
        self.acting.lock().expect("not poisoned").unwrap_or(0)
    }

    /// Remembers level `i` as the one that acts, on disk first.
    fn set_acting(&self, i: usize) -> Result<(), BmcError> {
        if let Some(f) = &self.file {
            write_acting(f, i).map_err(|e| BmcError::Refused {
                bmc: self.machine.clone(),
                what: format!("power off at level {}", i + 1),
                detail: format!(
                    "cannot record the acting level in {}: {e}; nothing was switched at this level",
                    f.display()
                ),
            })?;
        }
        *self.acting.lock().expect("not poisoned") = (i > 0).then_some(i);
        Ok(())
    }

    /// Switches every device of level `i`; the first failure ends the level.
    async fn switch_level(&self, i: usize, op: ChassisOp) -> Result<String, BmcError> {
        let mut said = Vec::new();
        for d in &self.levels[i] {
            let s = d.power.chassis(op).await?;
            said.push(format!("{}: {s}", d.name));
        }
        Ok(said.join("; "))
    }

    /// Power off: level by level until one acts.
    async fn off(&self) -> Result<String, BmcError> {
        let mut failed: Vec<String> = Vec::new();
        let mut last: Option<BmcError> = None;
        for i in 0..self.levels.len() {
            if let Err(e) = self.set_acting(i) {
                failed.push(format!("level {} ({}): {e}", i + 1, self.names(i)));
                last = Some(e);
                continue;
            }
            match self.switch_level(i, ChassisOp::Off).await {
                Ok(s) => {
                    let before = if failed.is_empty() {
                        String::new()
                    } else {
                        format!("; the levels before it did not act: {}", failed.join("; "))
                    };
                    if i > 0 {
                        warn!(machine = %self.machine, level = i + 1, devices = %self.names(i), "power off through a lower fencing level: {}", failed.join("; "));
                    }
                    return Ok(format!(
                        "level {} ({}) acted: {s}{before}",
                        i + 1,
                        self.names(i)
                    ));
                }
                Err(e) => {
                    failed.push(format!("level {} ({}): {e}", i + 1, self.names(i)));
                    last = Some(e);
                }
            }
        }
        // No level acted: level 1 reads the state again, and the words of every level go back.
        let _ = self.set_acting(0);
        Err(self.all_failed("power off", failed, last))
    }

    /// Power on through the acting level first, then the others in order: a power-on is
    /// recovery, never held back.
    async fn on(&self) -> Result<String, BmcError> {
        let first = self.acting();
        let order = std::iter::once(first).chain((0..self.levels.len()).filter(|i| *i != first));
        let mut failed = Vec::new();
        let mut last = None;
        for i in order {
            match self.switch_level(i, ChassisOp::On).await {
                Ok(s) => {
                    // The read after the on, and the idle probes, read the level that acted;
                    // the next fence starts from level 1 all the same.
                    if let Err(e) = self.set_acting(i) {
                        warn!(machine = %self.machine, error = %e, "cannot record the level that powered the machine on");
                    }
                    let before = if failed.is_empty() {
                        String::new()
                    } else {
                        format!("; before it: {}", failed.join("; "))
                    };
                    return Ok(format!(
                        "level {} ({}) acted: {s}{before}",
                        i + 1,
                        self.names(i)
                    ));
                }
                Err(e) => {
                    failed.push(format!("level {} ({}): {e}", i + 1, self.names(i)));
                    last = Some(e);
                }
            }
        }
        Err(self.all_failed("power on", failed, last))
    }

    /// One error with every level's words; retriable as the last level's error is (a refusal
    /// at the last level ends a fence at once).
    fn all_failed(&self, what: &str, failed: Vec<String>, last: Option<BmcError>) -> BmcError {
        let detail = format!("no fencing level could act: {}", failed.join("; "));
        match last {
            Some(e) if e.is_retriable() => BmcError::Unreachable {
                bmc: self.machine.clone(),
                detail,
            },
            _ => BmcError::Refused {
                bmc: self.machine.clone(),
                what: what.into(),
                detail,
            },
        }
    }

    /// Reads the acting level: off only when every device reads off; on when any reads on.
    async fn reading(&self) -> Result<PowerReading, BmcError> {
        let i = self.acting();
        if self.levels[i].len() == 1 && i == 0 {
            return self.levels[0][0].power.power_reading().await;
        }
        let mut states = Vec::new();
        for d in &self.levels[i] {
            let r = d
                .power
                .power_reading()
                .await
                .map_err(|e| BmcError::Unreachable {
                    bmc: self.machine.clone(),
                    detail: format!("level {} device {}: {e}", i + 1, d.name),
                })?;
            states.push(format!("{} {}", d.name, r.describe()));
            if r.state != PowerState::Off {
                return Ok(PowerReading {
                    state: r.state,
                    note: Some(format!("level {}: {}", i + 1, states.join(", "))),
                });
            }
        }
        Ok(PowerReading {
            state: PowerState::Off,
            note: Some(format!("level {}: {} (all off)", i + 1, states.join(", "))),
        })
    }
}

fn read_acting(f: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(f).ok()?;
    let level: usize = text.trim().parse().ok()?;
    level.checked_sub(1)
}

/// Writes `level i + 1` to `f` durably (a temporary file renamed over it, both synced).
fn write_acting(f: &Path, i: usize) -> std::io::Result<()> {
    use std::io::Write;
    let dir = f.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = f.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{}", i + 1)?;
    file.sync_all()?;
    std::fs::rename(&tmp, f)?;
    std::fs::File::open(dir)?.sync_all()
}

impl PowerControl for Levels {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        Box::pin(async move { self.reading().await.map(|r| r.state) })
    }

    fn power_reading(&self) -> BoxFuture<'_, Result<PowerReading, BmcError>> {
        Box::pin(self.reading())
    }

    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            match op {
                ChassisOp::Off => self.off().await,
                ChassisOp::On => self.on().await,
                // Repairs, not fences: level 1 only.
                other => {
                    if self.acting() != 0 {
                        return Err(BmcError::Refused {
                            bmc: self.machine.clone(),
                            what: other.as_str().into(),
                            detail: format!(
                                "the machine was last powered off at level {} ({}); power it on first",
                                self.acting() + 1,
                                self.names(self.acting())
                            ),
                        });
                    }
                    self.levels[0][0].power.chassis(other).await
                }
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for level in &self.levels {
                for d in level {
                    d.power.close().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::fake::FakePower;

    fn dev(name: &str, p: &Arc<FakePower>) -> Device {
        Device {
            name: name.into(),
            power: p.clone(),
        }
    }

    fn unreachable() -> BmcError {
        BmcError::Unreachable {
            bmc: "bmc".into(),
            detail: "no answer".into(),
        }
    }

    struct Rig {
        bmc: Arc<FakePower>,
        a: Arc<FakePower>,
        b: Arc<FakePower>,
        dir: tempfile::TempDir,
    }

    impl Rig {
        fn new() -> Self {
            Self {
                bmc: Arc::new(FakePower::new(PowerState::On)),
                a: Arc::new(FakePower::new(PowerState::On)),
                b: Arc::new(FakePower::new(PowerState::On)),
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn levels(&self) -> Levels {
            Levels::new(
                "m1".into(),
                vec![
                    vec![dev("BMC", &self.bmc)],
                    vec![
                        dev("pdu-a outlet 1", &self.a),
                        dev("pdu-b outlet 1", &self.b),
                    ],
                ],
                Some(acting_file(self.dir.path(), "m1")),
            )
        }
    }

    #[tokio::test]
    async fn level_one_acts_when_the_bmc_answers() {
        let r = Rig::new();
        let l = r.levels();
        let s = l.chassis(ChassisOp::Off).await.unwrap();
        assert!(s.starts_with("level 1 (BMC) acted"), "{s}");
        assert_eq!(l.power_state().await.unwrap(), PowerState::Off);
        assert!(r.a.calls().is_empty() && r.b.calls().is_empty());
    }

    /// Invariant 12: a machine whose BMC is dead is fenced by its outlets, and "off" means
    /// both outlets read off.
    #[tokio::test]
    async fn a_dead_bmc_falls_to_the_outlets_and_off_needs_both() {
        let r = Rig::new();
        let l = r.levels();
        r.bmc.fail_next(unreachable());
        let s = l.chassis(ChassisOp::Off).await.unwrap();
        assert!(
            s.starts_with("level 2 (pdu-a outlet 1, pdu-b outlet 1) acted"),
            "{s}"
        );
        assert!(
            s.contains(
                "the levels before it did not act: level 1 (BMC): BMC bmc unreachable: no answer"
            ),
            "{s}"
        );
        assert_eq!(r.a.calls(), ["off"]);
        assert_eq!(r.b.calls(), ["off"]);
        // One outlet back on: the machine is not off.
        r.b.chassis(ChassisOp::On).await.unwrap();
        assert_eq!(l.power_state().await.unwrap(), PowerState::On);
        r.b.chassis(ChassisOp::Off).await.unwrap();
        let read = l.power_reading().await.unwrap();
        assert_eq!(read.state, PowerState::Off);
        assert!(read.note.unwrap().contains("(all off)"));
        // The acting level survives a restart; the power-on goes through it.
        drop(l);
        let l = r.levels();
        let s = l.chassis(ChassisOp::On).await.unwrap();
        assert!(s.starts_with("level 2"), "{s}");
        assert_eq!(r.a.power(), PowerState::On);
        assert_eq!(r.b.power(), PowerState::On);
        assert!(
            !r.bmc.calls().contains(&"on".to_string()),
            "{:?}",
            r.bmc.calls()
        );
        // The state is read from the level that powered it on, also after a restart.
        assert_eq!(l.power_state().await.unwrap(), PowerState::On);
        assert_eq!(r.levels().acting(), 1);
        // The next fence starts from level 1 again.
        let s = l.chassis(ChassisOp::Off).await.unwrap();
        assert!(s.starts_with("level 1 (BMC) acted"), "{s}");
        assert_eq!(r.levels().acting(), 0);
    }

    /// Issue 32, item 3: an outlet that refuses leaves the machine unconfirmed and names it;
    /// with every level failed the error carries every level's words.
    #[tokio::test]
    async fn a_refusing_outlet_at_the_last_level_ends_with_every_levels_words() {
        let r = Rig::new();
        let l = r.levels();
        r.bmc.fail_next(unreachable());
        r.b.fail_next(BmcError::Refused {
            bmc: "pdu-b".into(),
            what: "off of outlet 1".into(),
            detail: "exit 1: not writable".into(),
        });
        let e = l.chassis(ChassisOp::Off).await.unwrap_err();
        assert!(!e.is_retriable(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("level 1 (BMC): BMC bmc unreachable"), "{msg}");
        assert!(
            msg.contains(
                "level 2 (pdu-a outlet 1, pdu-b outlet 1): BMC pdu-b refused off of outlet 1"
            ),
            "{msg}"
        );
        assert_eq!(l.acting(), 0);
    }

    #[tokio::test]
    async fn a_cycle_never_goes_to_the_outlets() {
        let r = Rig::new();
        let l = r.levels();
        r.bmc.fail_next(unreachable());
        l.chassis(ChassisOp::Off).await.unwrap();
        let e = l.chassis(ChassisOp::Cycle).await.unwrap_err();
        assert!(e.to_string().contains("power it on first"), "{e}");
        assert!(r.a.calls().iter().all(|c| c != "cycle"));
    }
}
