//! Machines on etcd: [`MachineStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `machines/records/<address>`: the machine's record, state and last boot id (JSON);
//! - `machines/transition-index/<address>`: the number its next transition gets;
//! - `machines/transitions/<address>/<n>`: one transition (from, to, when, why); the newest
//!   [`KEEP_TRANSITIONS`] are kept: the transaction that appends deletes the range that
//!   falls out in one operation;
//! - `machines/reported/<address>`: present once a transition to a report's state
//!   (healthy, unhealthy) was written: its agent reported at some time.
//!
//! Transitions and the reported mark outlive a deleted record, as SQLite's history rows do.
//!
//! A [`persist`](MachineStore::persist) reads what it changes, then writes each machine's
//! changes in a transaction that compares the `mod_revision`s it read (the record, the
//! transition index), so a batch that lost a race to another writer fails instead of
//! overwriting. etcd caps a transaction at 128 operations (`--max-txn-ops`), so a batch
//! touching many machines (an inventory import) is written as several transactions, each
//! holding whole machines: every machine's record and its transitions land together.

use std::collections::{BTreeMap, HashMap};

use protocol::admin::machines::StateTransition;
use serde::{Deserialize, Serialize};

use super::{KEEP_TRANSITIONS, MachineStore, StoredMachine, Write};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::health::MachineState;
use crate::inventory::{MachineRecord, RecordSource};
use crate::store::StoreError;
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Txn, key_level};

const RECORDS: &str = "machines/records";
const INDEXES: &str = "machines/transition-index";
const TRANSITIONS: &str = "machines/transitions";
const REPORTED: &str = "machines/reported";

/// Operations one transaction may hold: etcd's default `--max-txn-ops` is 128; a few to
/// spare for the compares' keys a future guard (issue 31's leader compare) adds.
const TXN_OPS: usize = 120;

/// Above this many machines in one batch, their records and indexes are read with two
/// directory listings instead of two reads per machine.
const LIST_ABOVE: usize = 32;

/// A machine's record as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RecordValue {
    address: String,
    hostname: String,
    serial: String,
    rack: String,
    role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    machine_type: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    source: String,
    state: String,
    state_since_ms: i64,
    state_reason: String,
    created_ms: i64,
    updated_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
}

/// One transition as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TransitionValue {
    from: String,
    to: String,
    at_ms: i64,
    reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ReportedValue {
    since_ms: i64,
}

/// The key of `address`'s record (relative): `clear_machine` compares it.
pub(crate) fn record_key(address: &str) -> String {
    format!("{RECORDS}/{}", key_level(address))
}

fn index_key(address: &str) -> String {
    format!("{INDEXES}/{}", key_level(address))
}

fn transitions_dir(address: &str) -> String {
    format!("{TRANSITIONS}/{}", key_level(address))
}

fn transition_key(address: &str, n: u64) -> String {
    format!("{}/{}", transitions_dir(address), num_key(n))
}

/// What one machine's part of a batch reads and writes.
#[derive(Debug)]
struct Unit {
    address: String,
    /// The record as read: its value and `mod_revision` (0: absent).
    record: Option<RecordValue>,
    record_rev: i64,
    /// The record after the batch (`None`: deleted), when the batch changes it.
    changed: Option<Option<RecordValue>>,
    /// The next transition number and the index's `mod_revision` as read.
    next: u64,
    index_rev: i64,
    transitions: Vec<TransitionValue>,
    /// The earliest reporting transition of the batch, if any.
    reported: Option<i64>,
}

impl Unit {
    fn current(&self) -> Option<&RecordValue> {
        match &self.changed {
            Some(c) => c.as_ref(),
            None => self.record.as_ref(),
        }
    }

    fn ops(&self) -> usize {
        usize::from(self.changed.is_some())
            + if self.transitions.is_empty() {
                0
            } else {
                // The items, the index, the pruning range.
                self.transitions.len() + 2
            }
            + usize::from(self.reported.is_some())
    }

    /// Adds this machine's compares and writes to `txn`.
    fn add_to(&self, mut txn: Txn) -> Result<Txn, EtcdError> {
        let rkey = record_key(&self.address);
        match &self.changed {
            Some(Some(v)) => {
                txn = txn.if_mod_revision(&rkey, self.record_rev).put(&rkey, v)?;
            }
            Some(None) => {
                txn = txn.if_mod_revision(&rkey, self.record_rev).delete(&rkey);
            }
            None => {}
        }
        if !self.transitions.is_empty() {
            let ikey = index_key(&self.address);
            txn = txn.if_mod_revision(&ikey, self.index_rev);
            let mut n = self.next;
            for t in &self.transitions {
                txn = txn.put(&transition_key(&self.address, n), t)?;
                n += 1;
            }
            txn = txn.put(&ikey, &n)?;
            // Keep items numbered n - KEEP .. n - 1: delete everything below.
            let keep_from = n.saturating_sub(KEEP_TRANSITIONS as u64);
            if keep_from > 1 {
                txn = txn.delete_range(
                    &transition_key(&self.address, 0),
                    &transition_key(&self.address, keep_from),
                );
            }
        }
        if let Some(since_ms) = self.reported {
            txn = txn.put(
                &format!("{REPORTED}/{}", key_level(&self.address)),
                &ReportedValue { since_ms },
            )?;
        }
        Ok(txn)
    }
}

fn value_of(row: &super::Row, old: Option<&RecordValue>) -> RecordValue {
    let r = &row.record;
    RecordValue {
        address: r.address.clone(),
        hostname: r.hostname.clone(),
        serial: r.serial.clone(),
        rack: r.rack.clone(),
        role: r.role.clone(),
        machine_type: r.machine_type.clone(),
        labels: r.labels.clone(),
        source: r.source.as_str().to_string(),
        state: row.state.as_str().to_string(),
        state_since_ms: to_unix_ms(row.since),
        state_reason: row.reason.clone(),
        created_ms: old.map(|o| o.created_ms).unwrap_or(to_unix_ms(row.now)),
        updated_ms: to_unix_ms(row.now),
        // As SQLite's upsert: a row written again keeps the boot id reported before.
        boot_id: old.and_then(|o| o.boot_id.clone()),
    }
}

fn address_of(w: &Write) -> &str {
    match w {
        Write::Row(r) => &r.record.address,
        Write::Delete(a) => a,
        Write::Transition { address, .. } | Write::Boot { address, .. } => address,
    }
}

fn is_report_state(s: MachineState) -> bool {
    matches!(s, MachineState::Healthy | MachineState::Unhealthy)
}

impl EtcdStore {
    /// Reads the record and transition index of each of `addresses`.
    async fn machine_units(&self, addresses: Vec<String>) -> Result<Vec<Unit>, EtcdError> {
        let mut records: HashMap<String, (RecordValue, i64)> = HashMap::new();
        let mut indexes: HashMap<String, (u64, i64)> = HashMap::new();
        if addresses.len() > LIST_ABOVE {
            for (_, v) in self.kv_list::<RecordValue>(RECORDS).await? {
                records.insert(v.value.address.clone(), (v.value, v.mod_revision));
            }
            let by_level: HashMap<String, &String> =
                addresses.iter().map(|a| (key_level(a), a)).collect();
            for (k, v) in self.kv_list::<u64>(INDEXES).await? {
                if let Some(a) = by_level.get(&k) {
                    indexes.insert((*a).clone(), (v.value, v.mod_revision));
                }
            }
        } else {
            for a in &addresses {
                if let Some(v) = self.kv_get::<RecordValue>(&record_key(a)).await? {
                    records.insert(a.clone(), (v.value, v.mod_revision));
                }
                if let Some(v) = self.kv_get::<u64>(&index_key(a)).await? {
                    indexes.insert(a.clone(), (v.value, v.mod_revision));
                }
            }
        }
        Ok(addresses
            .into_iter()
            .map(|address| {
                let (record, record_rev) = match records.remove(&address) {
                    Some((v, rev)) => (Some(v), rev),
                    None => (None, 0),
                };
                let (next, index_rev) = indexes.remove(&address).unwrap_or((1, 0));
                Unit {
                    address,
                    record,
                    record_rev,
                    changed: None,
                    next,
                    index_rev,
                    transitions: Vec::new(),
                    reported: None,
                }
            })
            .collect())
    }

    /// One batch whose machines each fit in a transaction.
    async fn persist_batch(&self, writes: &[Write]) -> Result<(), StoreError> {
        let mut order: Vec<String> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for w in writes {
            let a = address_of(w);
            if !seen.contains_key(a) {
                seen.insert(a, order.len());
                order.push(a.to_string());
            }
        }
        let mut units = self.machine_units(order).await?;
        for w in writes {
            let u = &mut units[seen[address_of(w)]];
            match w {
                Write::Row(row) => {
                    let v = value_of(row, u.current());
                    u.changed = Some(Some(v));
                }
                Write::Delete(_) => u.changed = Some(None),
                Write::Boot { boot_id, .. } => {
                    // As SQLite's UPDATE: nothing when the machine has no record.
                    if let Some(mut v) = u.current().cloned() {
                        v.boot_id = Some(boot_id.clone());
                        u.changed = Some(Some(v));
                    }
                }
                Write::Transition {
                    from,
                    to,
                    at,
                    reason,
                    ..
                } => {
                    u.transitions.push(TransitionValue {
                        from: from.clone(),
                        to: to.as_str().to_string(),
                        at_ms: to_unix_ms(*at),
                        reason: reason.clone(),
                    });
                    if is_report_state(*to) && u.reported.is_none() {
                        u.reported = Some(to_unix_ms(*at));
                    }
                }
            }
        }
        // Whole machines per transaction, in the batch's order.
        let mut txn = self.txn();
        let mut ops = 0;
        for u in &units {
            let n = u.ops();
            if n == 0 {
                continue;
            }
            if ops > 0 && ops + n > TXN_OPS {
                self.commit_machines(std::mem::replace(&mut txn, self.txn()))
                    .await?;
                ops = 0;
            }
            txn = u.add_to(txn)?;
            ops += n;
        }
        if ops > 0 {
            self.commit_machines(txn).await?;
        }
        Ok(())
    }

    async fn commit_machines(&self, txn: Txn) -> Result<(), StoreError> {
        if txn.commit().await? {
            Ok(())
        } else {
            // Someone else wrote a machine this batch read: fail rather than overwrite.
            Err(EtcdError::Conflict {
                key: self.key(RECORDS),
            }
            .into())
        }
    }
}

/// The most transitions of one machine one transaction carries (with its record, index,
/// pruning range and reported mark).
const TRANSITIONS_PER_TXN: usize = TXN_OPS - 4;

impl MachineStore for EtcdStore {
    async fn machines(&self) -> Result<Vec<StoredMachine>, StoreError> {
        let reported: std::collections::HashSet<String> =
            self.kv_keys(REPORTED).await?.into_iter().collect();
        let mut out = Vec::new();
        for (level, v) in self.kv_list::<RecordValue>(RECORDS).await? {
            let r = v.value;
            out.push(StoredMachine {
                reported: reported.contains(&level),
                record: MachineRecord {
                    address: r.address,
                    hostname: r.hostname,
                    serial: r.serial,
                    rack: r.rack,
                    role: r.role,
                    machine_type: r.machine_type,
                    labels: r.labels,
                    source: RecordSource::parse(&r.source),
                },
                // A state this build does not know reads as uninitialized, as on SQLite.
                state: r.state.parse().unwrap_or(MachineState::Uninitialized),
                since: from_unix_ms(r.state_since_ms),
                reason: r.state_reason,
                boot_id: r.boot_id,
            });
        }
        out.sort_by(|a, b| a.record.address.cmp(&b.record.address));
        Ok(out)
    }

    async fn persist(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        // A machine with more transitions in one batch than a transaction holds (never in
        // practice: a sweep writes one per machine) is written in consecutive batches.
        let mut per_machine: HashMap<&str, usize> = HashMap::new();
        for w in &writes {
            if let Write::Transition { address, .. } = w {
                *per_machine.entry(address).or_default() += 1;
            }
        }
        if per_machine.values().all(|n| *n <= TRANSITIONS_PER_TXN) {
            return self.persist_batch(&writes).await;
        }
        for chunk in writes.chunks(TRANSITIONS_PER_TXN) {
            self.persist_batch(chunk).await?;
        }
        Ok(())
    }

    async fn transitions(
        &self,
        address: String,
        limit: i64,
    ) -> Result<Vec<StateTransition>, StoreError> {
        let limit = u32::try_from(limit.max(0)).unwrap_or(u32::MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self
            .kv_list_last::<TransitionValue>(&transitions_dir(&address), limit)
            .await?
            .into_iter()
            .map(|(_, v)| StateTransition {
                from: v.value.from,
                to: v.value.to,
                at_unix_ms: u64::try_from(v.value.at_ms).unwrap_or(0),
                reason: v.value.reason,
            })
            .collect())
    }
}
