//! The repair queue on etcd: [`RepairQueueStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `repair/write-index`: the next entry index (CKE's write index), a JSON number;
//! - `repair/entries/<index>`: one entry, JSON with CKE's field names plus the progress
//!   inside the step (`phase`), times in RFC 3339;
//! - `repair/history-index`: the next history number, shared by every entry;
//! - `repair/history/<index>/<n>`: one history line of entry `<index>`;
//! - `repair/enabled`: `{"enabled": false}` when disabled (absent: enabled).
//!
//! A commit is one etcd transaction: it compares both write indexes' `mod_revision` (so two
//! writers never give out one index) and, for each entry it changes or deletes, the entry's
//! `mod_revision` as this store last loaded or wrote it, so a commit that lost a race to
//! another writer fails instead of overwriting (issue 31's deposed leader). A lost race on
//! an index alone is retried from a fresh read; a lost race on an entry is an error.
//!
//! Not here: what a transition means (the engine decides; this only stores).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use protocol::admin::repair::{RepairHistoryRecord, RepairStatus, RepairStepStatus};
use serde::{Deserialize, Serialize};

use super::{RepairQueueStore, Write};

mod diagnostics;
mod groups;
use crate::clock::to_unix_ms;
use crate::repair::entry::{Entry, HistoryEvent, Phase};
use crate::store::StoreError;
use crate::store::etcd::{EtcdError, EtcdStore, kv::num_key};

const WRITE_INDEX: &str = "repair/write-index";
const HISTORY_INDEX: &str = "repair/history-index";
const ENTRIES: &str = "repair/entries";
const HISTORY: &str = "repair/history";
const ENABLED: &str = "repair/enabled";

/// etcd's default `--max-txn-ops`: a transaction with more operations is refused. A commit
/// needs two per changed entry at most (the entry and a history line) plus the two indexes.
pub const MAX_TXN_OPS: usize = 128;

/// How often a commit that lost a race on the write indexes only is built again.
const INDEX_ATTEMPTS: u32 = 8;

/// An entry as stored: CKE's JSON field names, with the progress inside the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EntryRecord {
    index: u64,
    address: String,
    nodename: String,
    serial: String,
    machine_type: String,
    operation: String,
    status: RepairStatus,
    step: u32,
    step_status: RepairStepStatus,
    deleted: bool,
    last_transition_time: Timestamp,
    drain_backoff_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drain_backoff_expire: Option<Timestamp>,
    phase: PhaseRecord,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    boot_id_before: String,
}

/// The progress inside a step, tagged by kind as SQLite's `phase` column names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum PhaseRecord {
    Idle,
    Command { attempt: u32 },
    RetryWait { attempt: u32, until: Timestamp },
    Watching { since: Timestamp },
    SuccessCommand,
}

impl From<&Phase> for PhaseRecord {
    fn from(p: &Phase) -> Self {
        match *p {
            Phase::Idle => PhaseRecord::Idle,
            Phase::Command { attempt } => PhaseRecord::Command { attempt },
            Phase::RetryWait { attempt, until } => PhaseRecord::RetryWait { attempt, until },
            Phase::Watching { since } => PhaseRecord::Watching { since },
            Phase::SuccessCommand => PhaseRecord::SuccessCommand,
        }
    }
}

impl From<PhaseRecord> for Phase {
    fn from(p: PhaseRecord) -> Self {
        match p {
            PhaseRecord::Idle => Phase::Idle,
            PhaseRecord::Command { attempt } => Phase::Command { attempt },
            PhaseRecord::RetryWait { attempt, until } => Phase::RetryWait { attempt, until },
            PhaseRecord::Watching { since } => Phase::Watching { since },
            PhaseRecord::SuccessCommand => Phase::SuccessCommand,
        }
    }
}

impl EntryRecord {
    fn of(e: &Entry) -> Self {
        Self {
            index: e.index,
            address: e.address.clone(),
            nodename: e.nodename.clone(),
            serial: e.serial.clone(),
            machine_type: e.machine_type.clone(),
            operation: e.operation.clone(),
            status: e.status,
            step: e.step,
            step_status: e.step_status,
            deleted: e.deleted,
            last_transition_time: e.last_transition,
            drain_backoff_count: e.drain_backoff_count,
            drain_backoff_expire: e.drain_backoff_expire,
            phase: PhaseRecord::from(&e.phase),
            boot_id_before: e.boot_id_before.clone(),
        }
    }

    fn into_entry(self) -> Entry {
        Entry {
            index: self.index,
            address: self.address,
            nodename: self.nodename,
            serial: self.serial,
            machine_type: self.machine_type,
            operation: self.operation,
            status: self.status,
            step: self.step,
            step_status: self.step_status,
            deleted: self.deleted,
            last_transition: self.last_transition_time,
            drain_backoff_count: self.drain_backoff_count,
            drain_backoff_expire: self.drain_backoff_expire,
            phase: self.phase.into(),
            boot_id_before: self.boot_id_before,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct EnabledRecord {
    enabled: bool,
}

fn entry_key(index: u64) -> String {
    format!("{ENTRIES}/{}", num_key(index))
}

fn history_dir(index: u64) -> String {
    format!("{HISTORY}/{}", num_key(index))
}

fn history_record(e: &Entry, ev: &HistoryEvent, now: Timestamp) -> RepairHistoryRecord {
    RepairHistoryRecord {
        at_unix_ms: u64::try_from(to_unix_ms(now)).unwrap_or(0),
        status: e.status,
        step: e.step,
        step_status: e.step_status,
        event: ev.event.to_string(),
        detail: ev.detail.clone(),
        output: ev.output.clone(),
    }
}

/// The `mod_revision` of each entry as this process last loaded or wrote it: what the next
/// update of that entry compares. Shared by the clones of one [`EtcdStore`].
#[derive(Debug, Default)]
pub(crate) struct Revisions(Mutex<HashMap<u64, i64>>);

impl Revisions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, i64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn revisions(store: &EtcdStore) -> Arc<Revisions> {
    store.area::<Revisions>()
}

fn err(e: EtcdError) -> StoreError {
    StoreError::from(e)
}

impl RepairQueueStore for EtcdStore {
    async fn load(&self) -> Result<(bool, Vec<Entry>), StoreError> {
        let enabled = self
            .kv_get::<EnabledRecord>(ENABLED)
            .await
            .map_err(err)?
            .map(|v| v.value.enabled)
            .unwrap_or(true);
        let listed = self.kv_list::<EntryRecord>(ENTRIES).await.map_err(err)?;
        let revs = revisions(self);
        let mut revs = revs.lock();
        let mut entries = Vec::with_capacity(listed.len());
        for (_, v) in listed {
            revs.insert(v.value.index, v.mod_revision);
            entries.push(v.value.into_entry());
        }
        Ok((enabled, entries))
    }

    async fn commit(&self, writes: Vec<Write>, now: Timestamp) -> Result<Vec<u64>, StoreError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        self.commit_with(writes, now, 0, Ok).await
    }

    async fn history(&self, index: u64) -> Result<Vec<RepairHistoryRecord>, StoreError> {
        Ok(self
            .kv_list::<RepairHistoryRecord>(&history_dir(index))
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| v.value)
            .collect())
    }

    async fn active_addresses(&self) -> Result<HashSet<String>, StoreError> {
        Ok(self
            .kv_list::<EntryRecord>(ENTRIES)
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| v.value)
            .filter(|e| {
                !e.deleted && matches!(e.status, RepairStatus::Queued | RepairStatus::Processing)
            })
            .map(|e| e.address)
            .collect())
    }
}

impl EtcdStore {
    /// Commits `writes` as [`RepairQueueStore::commit`] does, with what `also` adds (at most
    /// `extra_ops` operations) in the same transaction: the command groups' reap clears its
    /// records in the transaction that writes the reap's history.
    pub(crate) async fn commit_with(
        &self,
        writes: Vec<Write>,
        now: Timestamp,
        extra_ops: usize,
        also: impl Fn(crate::store::etcd::Txn) -> Result<crate::store::etcd::Txn, EtcdError>,
    ) -> Result<Vec<u64>, StoreError> {
        let ops: usize = writes
            .iter()
            .map(|w| match w {
                Write::Insert(..) | Write::Delete(_) => 2,
                Write::Update(_, ev) => 1 + usize::from(ev.is_some()),
                Write::History(..) | Write::SetEnabled(_) => 1,
            })
            .sum::<usize>()
            + 2
            + extra_ops;
        if ops > MAX_TXN_OPS {
            return Err(err(EtcdError::Config(format!(
                "one repair-queue commit of {} changes needs {ops} etcd operations, more than \
                 etcd's default --max-txn-ops {MAX_TXN_OPS}; start etcd with a higher \
                 --max-txn-ops",
                writes.len()
            ))));
        }
        let revs = revisions(self);
        for _ in 0..INDEX_ATTEMPTS {
            let wi = self.kv_get::<u64>(WRITE_INDEX).await.map_err(err)?;
            let hi = self.kv_get::<u64>(HISTORY_INDEX).await.map_err(err)?;
            let (mut next, wrev) = wi.map(|v| (v.value, v.mod_revision)).unwrap_or((1, 0));
            let (mut hnext, hrev) = hi.map(|v| (v.value, v.mod_revision)).unwrap_or((1, 0));
            let mut txn = self
                .txn()
                .if_mod_revision(WRITE_INDEX, wrev)
                .if_mod_revision(HISTORY_INDEX, hrev);
            let mut inserted = Vec::new();
            let mut touched = Vec::new();
            {
                let known = revs.lock();
                let guard = |txn: crate::store::etcd::Txn, index: u64| match known.get(&index) {
                    Some(rev) => txn.if_mod_revision(&entry_key(index), *rev),
                    None => txn,
                };
                for w in &writes {
                    let mut add_history =
                        |txn: crate::store::etcd::Txn, e: &Entry, ev: &HistoryEvent| {
                            let key = format!("{}/{}", history_dir(e.index), num_key(hnext));
                            hnext += 1;
                            txn.put(&key, &history_record(e, ev, now))
                        };
                    txn = match w {
                        Write::Insert(e, ev) => {
                            let mut stored = e.clone();
                            stored.index = next;
                            next += 1;
                            inserted.push(stored.index);
                            touched.push(stored.index);
                            let key = entry_key(stored.index);
                            let txn = txn.if_absent(&key).put(&key, &EntryRecord::of(&stored));
                            add_history(txn.map_err(err)?, &stored, ev).map_err(err)?
                        }
                        Write::Update(e, ev) => {
                            touched.push(e.index);
                            let key = entry_key(e.index);
                            let txn = guard(txn, e.index)
                                .if_present(&key)
                                .put(&key, &EntryRecord::of(e))
                                .map_err(err)?;
                            match ev {
                                Some(ev) => add_history(txn, e, ev).map_err(err)?,
                                None => txn,
                            }
                        }
                        Write::History(e, ev) => add_history(txn, e, ev).map_err(err)?,
                        Write::Delete(index) => guard(txn, *index)
                            .delete(&entry_key(*index))
                            .delete_dir(&history_dir(*index)),
                        Write::SetEnabled(on) => txn
                            .put(ENABLED, &EnabledRecord { enabled: *on })
                            .map_err(err)?,
                    };
                }
            }
            let txn = also(txn).map_err(err)?;
            let txn = txn
                .put(WRITE_INDEX, &next)
                .and_then(|t| t.put(HISTORY_INDEX, &hnext))
                .map_err(err)?;
            match txn.commit_at().await.map_err(err)? {
                Some(revision) => {
                    let mut known = revs.lock();
                    for w in &writes {
                        if let Write::Delete(index) = w {
                            known.remove(index);
                        }
                    }
                    for index in touched {
                        if writes
                            .iter()
                            .any(|w| matches!(w, Write::Delete(i) if *i == index))
                        {
                            continue;
                        }
                        known.insert(index, revision);
                    }
                    return Ok(inserted);
                }
                None => {
                    // Which compare failed? An entry changed by someone else is a conflict
                    // to report; the indexes alone moving is a race to run again.
                    self.check_entries_unchanged(&writes, &revs).await?;
                }
            }
        }
        Err(err(EtcdError::Contended {
            key: self.key(WRITE_INDEX),
            attempts: INDEX_ATTEMPTS,
        }))
    }

    /// After a failed commit: an error when an entry the commit changes or deletes was
    /// written (or deleted, or created) by someone else since this store last saw it.
    async fn check_entries_unchanged(
        &self,
        writes: &[Write],
        revs: &Revisions,
    ) -> Result<(), StoreError> {
        for w in writes {
            let index = match w {
                Write::Update(e, _) => e.index,
                Write::Delete(i) => *i,
                _ => continue,
            };
            let now = self
                .kv_get::<serde_json::Value>(&entry_key(index))
                .await
                .map_err(err)?
                .map(|v| v.mod_revision);
            let known = revs.lock().get(&index).copied();
            let changed = match (known, now) {
                (Some(k), Some(n)) => k != n,
                // Deleted by someone else: deleting it again is what was asked; forget the
                // revision so the next attempt does not compare it.
                (Some(_), None) if matches!(w, Write::Delete(_)) => {
                    revs.lock().remove(&index);
                    false
                }
                (Some(_), None) => true,
                (None, None) => matches!(w, Write::Update(..)),
                (None, Some(_)) => false,
            };
            if changed {
                return Err(err(EtcdError::Conflict {
                    key: self.key(&entry_key(index)),
                }));
            }
        }
        Ok(())
    }
}

/// One entry as `coordinator migrate` brings it over: the entry with its own index and its
/// history lines with their own times.
pub(crate) type ImportedEntry = (Entry, Vec<RepairHistoryRecord>);

impl EtcdStore {
    /// `coordinator migrate`: writes `entries` under their own indexes with their history as
    /// it was (times included), then the enabled flag and the write index `next_index`, so
    /// that no index the source gave out is given out again. Each entry is created only if
    /// absent, in transactions of at most [`MAX_TXN_OPS`] operations; the write indexes go
    /// last, so a copy cut short leaves no index that a coordinator would count on.
    /// `progress` hears how many entries are written, before each.
    pub(crate) async fn import_repair_queue(
        &self,
        enabled: bool,
        entries: Vec<ImportedEntry>,
        next_index: u64,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), StoreError> {
        let mut hnext: u64 = 1;
        for (done, (e, history)) in entries.into_iter().enumerate() {
            progress(done as u64);
            let key = entry_key(e.index);
            let mut txn = self
                .txn()
                .if_absent(&key)
                .put(&key, &EntryRecord::of(&e))
                .map_err(err)?;
            for line in history {
                if txn.len() >= MAX_TXN_OPS {
                    if !txn.commit().await.map_err(err)? {
                        return Err(err(EtcdError::Conflict {
                            key: self.key(&key),
                        }));
                    }
                    txn = self.txn();
                }
                let hkey = format!("{}/{}", history_dir(e.index), num_key(hnext));
                hnext += 1;
                txn = txn.put(&hkey, &line).map_err(err)?;
            }
            if !txn.commit().await.map_err(err)? {
                return Err(err(EtcdError::Conflict {
                    key: self.key(&key),
                }));
            }
        }
        let mut txn = self
            .txn()
            .put(WRITE_INDEX, &next_index)
            .and_then(|t| t.put(HISTORY_INDEX, &hnext))
            .map_err(err)?;
        if !enabled {
            txn = txn.put(ENABLED, &EnabledRecord { enabled }).map_err(err)?;
        }
        txn.commit().await.map_err(err)?;
        Ok(())
    }
}
