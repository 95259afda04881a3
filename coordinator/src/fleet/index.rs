//! The registry's in-memory index: every machine's record, state and live health by
//! address, with a hostname index. Plain data and its bookkeeping; [`super::Fleet`] holds
//! it under one lock and decides when to change it.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use protocol::messages::{GoodbyeReason, HealthReport};

use super::snapshot::MachineView;
use super::store::Row;
use crate::health::MachineState;
use crate::inventory::MachineRecord;

/// What is known of a machine's agent (memory only).
#[derive(Debug, Clone, Default)]
pub(super) struct Live {
    pub(super) last_report: Option<HealthReport>,
    pub(super) last_report_at: Option<Timestamp>,
    pub(super) boot_id: Option<String>,
    /// The boot id in the store: the last one reported to this run or an earlier one.
    pub(super) stored_boot_id: Option<String>,
    /// When the current boot id was first seen (coordinator clock).
    pub(super) boot_seen_at: Option<Timestamp>,
    /// The last silence that ended: (last report before it, first report after it).
    pub(super) last_silence: Option<(Timestamp, Timestamp)>,
    pub(super) agent_version: Option<String>,
    pub(super) failing_since: BTreeMap<String, Timestamp>,
    /// For each check kind (`nic`, `gpu`, `plugin`), since when at least one check of that
    /// kind has failed in every report: the timer of a health check naming the kind alone,
    /// which must not restart when the failing subjects or messages change (two GPUs
    /// failing in turn are one failure of the machine's GPUs, not two short ones).
    pub(super) failing_kinds_since: BTreeMap<String, Timestamp>,
    pub(super) healthy_since: Option<Timestamp>,
    pub(super) goodbye: Option<(GoodbyeReason, Timestamp)>,
    pub(super) connections: u32,
    /// What the health sweep saw of the agent connection's datagrams since the agent went
    /// silent; cleared by every report and every new connection.
    pub(super) heard: Option<Heard>,
    /// When the certificate the agent last connected with expires (seconds since the Unix
    /// epoch).
    pub(super) cert_not_after: Option<i64>,
    /// The stored history says the agent reported before this coordinator started.
    pub(super) reported_before_start: bool,
}

/// The received-datagram count of a late agent's connection: when first sampled (once the
/// agent is late, so the acknowledgement of its last reply is in it) and whether it grew
/// since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Heard {
    baseline: u64,
    grew: bool,
}

impl Live {
    /// Whether QUIC heard from the agent's connection after it went silent: the agent is
    /// alive (it answers keep-alives) but not reporting. A machine that died right after
    /// reporting is never taken for alive: nothing arrives after the baseline.
    pub(super) fn heard_since_report(&self) -> bool {
        self.connections > 0 && self.heard.is_some_and(|h| h.grew)
    }

    /// Notes the received-datagram count `n` of the silent agent's connection.
    pub(super) fn note_received(&mut self, n: u64) {
        self.heard = Some(match self.heard {
            None => Heard {
                baseline: n,
                grew: false,
            },
            Some(h) => Heard {
                grew: h.grew || n != h.baseline,
                ..h
            },
        });
    }

    /// The write that stores the boot id when it is not the stored one.
    pub(super) fn boot_write(&mut self, address: &str) -> Option<super::store::Write> {
        let id = self.boot_id.clone()?;
        if self.stored_boot_id.as_ref() == Some(&id) {
            return None;
        }
        self.stored_boot_id = Some(id.clone());
        Some(super::store::Write::Boot {
            address: address.to_string(),
            boot_id: id,
        })
    }

    /// The boot id last reported, to this run or (before the agent reconnected) an
    /// earlier one.
    pub(super) fn known_boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref().or(self.stored_boot_id.as_deref())
    }

    /// Records the boot id of a hello or report seen at `now`; true when it is a new boot.
    pub(super) fn new_boot(&mut self, boot_id: &str, now: Timestamp) -> bool {
        let changed = self.boot_id.as_deref().is_some_and(|b| b != boot_id);
        if changed || self.boot_id.is_none() {
            self.boot_seen_at = Some(now);
        }
        if changed {
            // Nothing observed before a reboot says anything about the new boot.
            self.healthy_since = None;
            self.failing_since.clear();
            self.failing_kinds_since.clear();
        }
        self.boot_id = Some(boot_id.to_string());
        changed
    }
}

/// One machine.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) record: MachineRecord,
    pub(super) state: MachineState,
    pub(super) since: Timestamp,
    pub(super) reason: String,
    pub(super) live: Live,
}

/// The row `e` is stored as at `now`.
pub(super) fn row(e: &Entry, now: Timestamp) -> Row {
    Row {
        record: e.record.clone(),
        state: e.state,
        since: e.since,
        reason: e.reason.clone(),
        now,
    }
}

impl Entry {
    /// The record and state, for other areas.
    pub(super) fn view(&self) -> MachineView {
        MachineView {
            record: self.record.clone(),
            state: self.state,
            since: self.since,
            reason: self.reason.clone(),
        }
    }
}

/// Every machine, by address and by hostname.
#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) machines: BTreeMap<String, Entry>,
    pub(super) by_hostname: HashMap<String, String>,
}

impl Inner {
    /// Adds or replaces a machine, keeping the hostname index right.
    pub(super) fn insert(&mut self, e: Entry) {
        if let Some(old) = self.machines.get(&e.record.address)
            && old.record.hostname != e.record.hostname
        {
            self.by_hostname.remove(&old.record.hostname);
        }
        self.by_hostname
            .insert(e.record.hostname.clone(), e.record.address.clone());
        self.machines.insert(e.record.address.clone(), e);
    }

    /// The machine whose agent has `hostname`.
    pub(super) fn by_hostname_mut(&mut self, hostname: &str) -> Option<&mut Entry> {
        self.by_hostname
            .get(hostname)
            .and_then(|a| self.machines.get_mut(a))
    }

    /// Removes a machine and its hostname index entry.
    pub(super) fn remove(&mut self, address: &str) {
        if let Some(old) = self.machines.remove(address)
            && self
                .by_hostname
                .get(&old.record.hostname)
                .map(String::as_str)
                == Some(address)
        {
            self.by_hostname.remove(&old.record.hostname);
        }
    }
}
