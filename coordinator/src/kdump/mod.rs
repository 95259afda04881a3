//! The registry of crash dumps: what each machine's kdump initramfs last said
//! (`node-agent kdump-notify`), kept in memory and in the store ([`store::KdumpStore`]), and read by
//! the fence flow and remediation through [`KdumpView`].
//!
//! A notice is recorded with the coordinator's receive time ("dumping since T", "dump done
//! at T"); the node's own time is kept for the record only, since a kdump kernel's clock
//! may be off. "Dumping" is believed only while the machine's agent has not reported
//! since: a dump whose "done" was lost must not make a machine that came back look down
//! for ever. How long a dump may take (`kdump_timeout`) is configured in `[kdump]`, with
//! overrides per machine type (large-memory hosts dump for longer).
//!
//! This module records and answers; who may send a notice (only the machine's own
//! certificate) is checked in [`crate::agent_server`], and what a dump means for a fence
//! flow is decided in [`crate::fence::flow`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use protocol::admin::machines::KdumpDetail;
use protocol::messages::{KdumpNotice, KdumpPhase};
use serde::Deserialize;

use self::store::KdumpStore;
use crate::clock::{Clock, from_unix_ms, to_unix_ms};
use crate::fence::kdump::{DumpSeen, KdumpView};
use crate::fleet::Fleet;
use crate::k8s::Drainer;
use crate::k8s::events::NodeEvent;
use crate::store::{Store, StoreError};

pub mod store;

/// Default `kdump_timeout`: writing a filtered dump of a few hundred GiB to local disk or
/// over the network takes minutes; ten covers the common host without leaving a wedged
/// dump kernel unfenced for long. Large-memory types override it.
pub const DEFAULT_KDUMP_TIMEOUT: Duration = Duration::from_secs(600);

/// `[kdump]` in the coordinator config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KdumpConfig {
    /// How long a dump may run (from its "dumping" notice) before power actions go ahead
    /// without its "dump done".
    #[serde(with = "crate::config::duration")]
    pub timeout: Duration,
    /// `timeout` per machine type, for types whose dumps take longer (or shorter).
    #[serde(deserialize_with = "durations")]
    pub timeout_by_machine_type: BTreeMap<String, Duration>,
}

impl Default for KdumpConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_KDUMP_TIMEOUT,
            timeout_by_machine_type: BTreeMap::new(),
        }
    }
}

fn durations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Duration>, D::Error> {
    let raw = BTreeMap::<String, String>::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            crate::config::duration::parse(&v)
                .map(|d| (k.clone(), d))
                .map_err(|e| serde::de::Error::custom(format!("machine type {k}: {e}")))
        })
        .collect()
}

impl KdumpConfig {
    /// Every limit above zero: a zero limit would let the power-off of a dumping machine go
    /// ahead at once, losing the dump the notice was sent to protect. Says which key.
    pub fn validate(&self) -> Result<(), String> {
        let zero = "must be greater than 0 (a zero limit powers a dumping machine off at once \
                    and loses its dump)";
        if self.timeout.is_zero() {
            return Err(format!("key `kdump.timeout`: {zero}"));
        }
        match self
            .timeout_by_machine_type
            .iter()
            .find(|(_, d)| d.is_zero())
        {
            Some((t, _)) => Err(format!("key `kdump.timeout_by_machine_type.{t}`: {zero}")),
            None => Ok(()),
        }
    }

    /// The dump time limit of a machine of type `machine_type`.
    pub fn timeout_for(&self, machine_type: Option<&str>) -> Duration {
        machine_type
            .and_then(|t| self.timeout_by_machine_type.get(t))
            .copied()
            .unwrap_or(self.timeout)
    }
}

/// Why a notice could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum KdumpError {
    /// No registered machine has the certificate's hostname.
    #[error("no machine with hostname {0}: register it before its kdump initramfs can report")]
    UnknownHost(String),
    /// The store failed; the notice was not recorded.
    #[error("cannot record the kdump notice: {0}")]
    Store(#[from] StoreError),
}

impl KdumpError {
    /// True when sending the notice again may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            KdumpError::UnknownHost(_) => false,
            KdumpError::Store(e) => e.is_retriable(),
        }
    }
}

/// The last notice of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdumpRecord {
    /// The last phase reported.
    pub phase: KdumpPhase,
    /// When the last "dumping" arrived (coordinator clock); kept by a later "done".
    pub started: Option<Timestamp>,
    /// When "dump done" arrived, if it did after the last "dumping".
    pub done: Option<Timestamp>,
    /// The crashed kernel's boot id, if the initramfs knew it.
    pub boot_id: Option<String>,
    /// The node's own time in the last notice.
    pub node_time: Timestamp,
}

/// The registry (see the module doc). Cheap to share behind an `Arc`.
pub struct Kdumps {
    store: Store,
    clock: Arc<dyn Clock>,
    fleet: Arc<Fleet>,
    cfg: KdumpConfig,
    events: Option<Arc<dyn Drainer>>,
    records: Mutex<BTreeMap<String, KdumpRecord>>,
}

impl std::fmt::Debug for Kdumps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kdumps")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Kdumps {
    /// Loads the recorded notices.
    pub async fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        fleet: Arc<Fleet>,
        cfg: KdumpConfig,
    ) -> Result<Self, StoreError> {
        let records = store.notices().await?;
        Ok(Self {
            store,
            clock,
            fleet,
            cfg,
            events: None,
            records: Mutex::new(records),
        })
    }

    /// Posts a Node Event for every notice through `events` (best effort).
    pub fn with_events(mut self, events: Arc<dyn Drainer>) -> Self {
        self.events = Some(events);
        self
    }

    /// Records a notice from the kdump initramfs of `hostname` (the name in its
    /// certificate); returns the machine's address. Durable before it returns.
    pub async fn notice(&self, hostname: &str, n: &KdumpNotice) -> Result<String, KdumpError> {
        let machine = self
            .fleet
            .machine_by_hostname(hostname)
            .ok_or_else(|| KdumpError::UnknownHost(hostname.to_string()))?;
        let address = machine.record.address;
        let now = self.clock.now();
        let before = self.record(&address);
        let rec = KdumpRecord {
            phase: n.phase,
            started: match n.phase {
                KdumpPhase::Start => Some(now),
                KdumpPhase::Done => before.as_ref().and_then(|b| b.started),
            },
            done: (n.phase == KdumpPhase::Done).then_some(now),
            boot_id: n.boot_id.clone(),
            node_time: from_unix_ms(i64::try_from(n.time_unix_ms).unwrap_or(0)),
        };
        self.store
            .save_notice(address.clone(), rec.clone(), now)
            .await?;
        self.lock().insert(address.clone(), rec);
        let (event, line) = match n.phase {
            KdumpPhase::Start => (
                NodeEvent::KdumpStarted,
                format!("kdump: {address} is writing a crash dump (dumping since {now:.0})"),
            ),
            KdumpPhase::Done => (
                NodeEvent::KdumpDone,
                format!("kdump: {address} finished writing its crash dump at {now:.0}"),
            ),
        };
        tracing::warn!(machine = %address, phase = n.phase.as_str(), boot_id = ?n.boot_id, "{line}");
        if let Some(events) = self.events.clone() {
            let addr = address.clone();
            tokio::spawn(async move {
                if let Ok(Some(node)) = events.node_for(&addr).await {
                    events.record_event(&node, event, &line).await;
                }
            });
        }
        Ok(address)
    }

    /// The last notice of the machine at `address`.
    pub fn record(&self, address: &str) -> Option<KdumpRecord> {
        self.lock().get(address).cloned()
    }

    /// What `machines show` prints about the machine's dump.
    pub fn detail(&self, address: &str) -> Option<KdumpDetail> {
        let r = self.record(address)?;
        let ms = |t: Timestamp| u64::try_from(to_unix_ms(t)).unwrap_or(0);
        Some(KdumpDetail {
            phase: r.phase,
            dumping_now: matches!(self.dump(address), DumpSeen::Dumping { .. }),
            dumping_since_unix_ms: r.started.map(ms),
            done_at_unix_ms: r.done.map(ms),
            boot_id: r.boot_id,
            node_time_unix_ms: ms(r.node_time),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KdumpRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl KdumpView for Kdumps {
    fn dump(&self, address: &str) -> DumpSeen {
        let Some(r) = self.record(address) else {
            return DumpSeen::None;
        };
        match (r.phase, r.started, r.done) {
            (KdumpPhase::Done, _, Some(at)) => DumpSeen::Done { at },
            (KdumpPhase::Start, Some(started), _) => {
                let reported_since = self
                    .fleet
                    .live(address)
                    .and_then(|l| l.last_report_at)
                    .is_some_and(|at| at > started);
                if reported_since {
                    return DumpSeen::None;
                }
                let machine_type = self
                    .fleet
                    .machine(address)
                    .and_then(|m| m.record.machine_type);
                DumpSeen::Dumping {
                    started,
                    timeout: self.cfg.timeout_for(machine_type.as_deref()),
                }
            }
            _ => DumpSeen::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_come_from_the_machine_type_or_the_default() {
        let cfg: KdumpConfig =
            toml::from_str("timeout = \"5m\"\n[timeout_by_machine_type]\nbig-mem = \"45m\"\n")
                .unwrap();
        assert_eq!(cfg.timeout_for(Some("big-mem")), Duration::from_secs(2700));
        assert_eq!(cfg.timeout_for(Some("qemu")), Duration::from_secs(300));
        assert_eq!(cfg.timeout_for(None), Duration::from_secs(300));
        assert_eq!(KdumpConfig::default().timeout, DEFAULT_KDUMP_TIMEOUT);
        let e =
            toml::from_str::<KdumpConfig>("[timeout_by_machine_type]\nx = \"soon\"\n").unwrap_err();
        // A zero limit was accepted: every dump then lost to a power-off at once.
        for (text, key) in [
            ("timeout = \"0s\"\n", "`kdump.timeout`"),
            (
                "[timeout_by_machine_type]\nbig-mem = \"0s\"\n",
                "`kdump.timeout_by_machine_type.big-mem`",
            ),
        ] {
            let e = toml::from_str::<KdumpConfig>(text)
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(e.contains(key), "{e}");
        }
        assert_eq!(KdumpConfig::default().validate(), Ok(()));
        assert!(e.to_string().contains("machine type x"), "{e}");
        assert!(toml::from_str::<KdumpConfig>("wait = \"1m\"\n").is_err());
    }

    #[test]
    fn the_coordinator_config_carries_a_kdump_section_with_defaults() {
        let base = "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
        let path = std::path::Path::new("c.toml");
        let c = crate::config::Config::parse(base, path).unwrap();
        assert_eq!(c.kdump, KdumpConfig::default());
        let text = format!(
            "{base}[kdump]\ntimeout = \"20m\"\n[kdump.timeout_by_machine_type]\nbig-mem = \"45m\"\n"
        );
        let c = crate::config::Config::parse(&text, path).unwrap();
        assert_eq!(
            c.kdump.timeout_for(Some("big-mem")),
            Duration::from_secs(2700)
        );
        assert_eq!(c.kdump.timeout_for(Some("qemu")), Duration::from_secs(1200));
        let e = crate::config::Config::parse(&format!("{base}[kdump]\ntimeout = 600\n"), path)
            .unwrap_err();
        assert!(e.to_string().contains("no unit"), "{e}");
    }
}
