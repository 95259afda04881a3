//! The registry of crash dumps: what each machine's kdump initramfs last said
//! (`node-agent kdump-notify`), kept in memory and in the store ([`store::KdumpStore`]), and read by
//! the fence flow and remediation through [`KdumpView`].
//!
//! A notice is recorded with the coordinator's receive time ("dumping since T", "dump done
//! at T"); the node's own time is kept for the record only, since a kdump kernel's clock
//! may be off. "Dumping" is believed only while the machine's agent has not reported
//! since: a dump whose "done" was lost must not make a machine that came back look down
//! for ever. How long a dump may take (`kdump_timeout`) is configured in `[kdump]`
//! ([`config`]), with overrides per machine type (large-memory hosts dump for longer).
//!
//! This module records and answers; who may send a notice (only the machine's own
//! certificate) is checked in [`crate::agent_server`], and what a dump means for a fence
//! flow is decided in [`crate::fence::flow`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use protocol::admin::machines::KdumpDetail;
use protocol::messages::{KdumpNotice, KdumpPhase};

use self::store::KdumpStore;
use crate::clock::{Clock, from_unix_ms, to_unix_ms};
use crate::fence::kdump::{DumpSeen, KdumpView};
use crate::fleet::Fleet;
use crate::k8s::Drainer;
use crate::k8s::events::NodeEvent;
use crate::store::{Store, StoreError};

pub mod config;
pub mod store;

pub use config::{DEFAULT_KDUMP_TIMEOUT, KdumpConfig};

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
