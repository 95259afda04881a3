//! Remediation's state on etcd: [`RemediationStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `remediation/journal-index`: the next journal line id;
//! - `remediation/journal/<id>`: one line of the decision journal (sequence number, first
//!   and last time, count, machine, domain, outcome, rule, operation, sentence, and the
//!   decision itself as JSON);
//! - `remediation/switches/<key>`: `{"value": …, "set_ms": …}`, an operator switch;
//! - `remediation/cleared/<address>`: `{"address": …, "at_ms": …}`, `machines clear`;
//! - `remediation/outcomes/<index>`: how a finished repair ended (slow start);
//! - `remediation/own/<index>`: a repair entry the loop enqueued itself.
//!
//! A pass's journal writes are one transaction comparing the journal index (and each
//! repeated line's `mod_revision`); a pass writing more lines than etcd's 128 operations
//! per transaction is written in consecutive transactions of whole lines. The journal is
//! bounded as on SQLite by [`RemediationStore::prune_journal`] (age and count); the
//! queries read the whole journal and filter it here, which at the default bound (100,000
//! lines) is tens of megabytes: a fleet on etcd should set `journal_max_rows` lower.

use std::collections::BTreeMap;

use protocol::admin::remediation::{EventsQuery, JournalLine};
use serde::{Deserialize, Serialize};

use super::{RemediationStore, Resume, Switchboard};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::fleet::store::etcd::record_key;
use crate::remediation::decision::{Decision, Outcome, Rule};
use crate::remediation::input::RepairOutcome;
use crate::remediation::journal::{DEFAULT_EVENTS_LIMIT, JournalWrite, LastLine, operation};
use crate::store::StoreError;
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Txn, Versioned, key_level};

const JOURNAL_INDEX: &str = "remediation/journal-index";
const JOURNAL: &str = "remediation/journal";
const SWITCHES: &str = "remediation/switches";
const CLEARED: &str = "remediation/cleared";
const OUTCOMES: &str = "remediation/outcomes";
const OWN: &str = "remediation/own";

/// Writes per transaction: under etcd's default `--max-txn-ops` (128), with room for the
/// index and a leader's guard.
const TXN_OPS: usize = 120;

/// How often a journal write that lost a race on its index is built again.
const ATTEMPTS: u32 = 8;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct LineValue {
    id: i64,
    seq: u64,
    first_ms: i64,
    last_ms: i64,
    count: u64,
    address: String,
    domain: String,
    outcome: String,
    rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operation: Option<String>,
    sentence: String,
    decision: serde_json::Value,
}

impl LineValue {
    fn line(&self) -> JournalLine {
        JournalLine {
            seq: self.seq,
            first_unix_ms: u64::try_from(self.first_ms).unwrap_or(0),
            last_unix_ms: u64::try_from(self.last_ms).unwrap_or(0),
            count: self.count,
            address: self.address.clone(),
            domain: self.domain.clone(),
            outcome: self.outcome.clone(),
            rule: self.rule.clone(),
            operation: self.operation.clone(),
            sentence: self.sentence.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SwitchValue {
    value: String,
    set_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ClearedValue {
    address: String,
    at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OutcomeValue {
    address: String,
    finished_ms: i64,
    succeeded: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OwnValue {
    address: String,
    admitted_ms: i64,
}

fn line_key(id: i64) -> String {
    format!("{JOURNAL}/{}", num_key(u64::try_from(id).unwrap_or(0)))
}

fn decision_json(d: &Decision) -> serde_json::Value {
    serde_json::to_value(d).unwrap_or(serde_json::Value::Null)
}

impl EtcdStore {
    async fn journal(&self) -> Result<Vec<Versioned<LineValue>>, EtcdError> {
        Ok(self
            .kv_list::<LineValue>(JOURNAL)
            .await?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// One transaction's worth of journal writes; the id of each line, in order.
    async fn write_journal_part(&self, writes: &[JournalWrite]) -> Result<Vec<i64>, EtcdError> {
        // The lines repeated, as read now.
        let mut repeated: BTreeMap<i64, Versioned<LineValue>> = BTreeMap::new();
        for w in writes {
            if let JournalWrite::Repeat { id, .. } = w
                && !repeated.contains_key(id)
                && let Some(v) = self.kv_get::<LineValue>(&line_key(*id)).await?
            {
                repeated.insert(*id, v);
            }
        }
        for _ in 0..ATTEMPTS {
            let cur = self.kv_get::<i64>(JOURNAL_INDEX).await?;
            let (mut next, rev) = cur.map(|v| (v.value, v.mod_revision)).unwrap_or((1, 0));
            let mut txn = self.txn().if_mod_revision(JOURNAL_INDEX, rev);
            let mut ids = Vec::with_capacity(writes.len());
            // A line repeated twice in one part is written once, as it ends.
            let mut changed: BTreeMap<i64, LineValue> = BTreeMap::new();
            for w in writes {
                match w {
                    JournalWrite::Insert { seq, decision: d } => {
                        let id = next;
                        next += 1;
                        let at = to_unix_ms(d.at);
                        changed.insert(
                            id,
                            LineValue {
                                id,
                                seq: *seq,
                                first_ms: at,
                                last_ms: at,
                                count: 1,
                                address: d.address.clone(),
                                domain: d.domain.clone(),
                                outcome: d.outcome.as_str().to_string(),
                                rule: d.rule.as_str().to_string(),
                                operation: operation(d).map(str::to_string),
                                sentence: d.sentence.clone(),
                                decision: decision_json(d),
                            },
                        );
                        ids.push(id);
                    }
                    JournalWrite::Repeat {
                        id,
                        seq,
                        decision: d,
                    } => {
                        ids.push(*id);
                        let base = match changed.get(id) {
                            Some(l) => Some(l.clone()),
                            None => repeated.get(id).map(|v| v.value.clone()),
                        };
                        // A line pruned meanwhile is not made again (as SQLite's UPDATE).
                        if let Some(mut l) = base {
                            l.seq = *seq;
                            l.last_ms = to_unix_ms(d.at);
                            l.count += 1;
                            l.sentence = d.sentence.clone();
                            l.decision = decision_json(d);
                            changed.insert(*id, l);
                        }
                    }
                }
            }
            for (id, l) in &changed {
                if let Some(old) = repeated.get(id) {
                    txn = txn.if_mod_revision(&line_key(*id), old.mod_revision);
                }
                txn = txn.put(&line_key(*id), l)?;
            }
            if txn.put(JOURNAL_INDEX, &next)?.commit().await? {
                return Ok(ids);
            }
            // A repeated line written by someone else is a conflict, not a race to rerun.
            for (id, old) in &repeated {
                let now = self.kv_get::<serde_json::Value>(&line_key(*id)).await?;
                if now.map(|v| v.mod_revision) != Some(old.mod_revision) {
                    return Err(EtcdError::Conflict {
                        key: self.key(&line_key(*id)),
                    });
                }
            }
        }
        Err(EtcdError::Contended {
            key: self.key(JOURNAL_INDEX),
            attempts: ATTEMPTS,
        })
    }

    /// Deletes `keys` in transactions of at most [`TXN_OPS`].
    async fn delete_keys(&self, keys: &[String]) -> Result<(), EtcdError> {
        for part in keys.chunks(TXN_OPS) {
            let mut txn: Txn = self.txn();
            for k in part {
                txn = txn.delete(k);
            }
            txn.commit().await?;
        }
        Ok(())
    }
}

impl RemediationStore for EtcdStore {
    async fn switchboard(&self) -> Result<Switchboard, StoreError> {
        let switches = self
            .kv_list::<SwitchValue>(SWITCHES)
            .await?
            .into_iter()
            .map(|(k, v)| {
                let key = k.replace("%2F", "/").replace("%25", "%");
                (key, (v.value.value, v.value.set_ms))
            })
            .collect();
        let cleared = self
            .kv_list::<ClearedValue>(CLEARED)
            .await?
            .into_iter()
            .map(|(_, v)| (v.value.address, from_unix_ms(v.value.at_ms)))
            .collect();
        Ok(Switchboard { switches, cleared })
    }

    async fn set_switch(
        &self,
        key: String,
        value: Option<String>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let k = format!("{SWITCHES}/{}", key_level(&key));
        let txn = match value {
            Some(value) => self.txn().put(
                &k,
                &SwitchValue {
                    value,
                    set_ms: now_ms,
                },
            )?,
            None => self.txn().delete(&k),
        };
        txn.commit().await?;
        Ok(())
    }

    async fn clear_machine(&self, address: String, at_ms: i64) -> Result<Option<bool>, StoreError> {
        for _ in 0..ATTEMPTS {
            let Some(machine) = self
                .kv_get::<serde_json::Value>(&record_key(&address))
                .await?
            else {
                return Ok(None);
            };
            let newest = self
                .journal()
                .await?
                .into_iter()
                .filter(|l| l.value.address == address)
                .max_by_key(|l| l.value.seq);
            let was = newest.is_some_and(|l| {
                l.value.outcome == Outcome::Held.as_str()
                    && l.value.rule == Rule::NeedsHuman.as_str()
            });
            let done = self
                .txn()
                .if_mod_revision(&record_key(&address), machine.mod_revision)
                .put(
                    &format!("{CLEARED}/{}", key_level(&address)),
                    &ClearedValue {
                        address: address.clone(),
                        at_ms,
                    },
                )?
                .commit()
                .await?;
            if done {
                return Ok(Some(was));
            }
        }
        Err(EtcdError::Contended {
            key: self.key(&record_key(&address)),
            attempts: ATTEMPTS,
        }
        .into())
    }

    async fn resume(
        &self,
        admitted_since_ms: i64,
        outcomes_since_ms: i64,
        last_pass_since_ms: i64,
    ) -> Result<Resume, StoreError> {
        let journal = self.journal().await?;
        let max_seq = journal.iter().map(|l| l.value.seq).max().unwrap_or(0);
        // Ordered by id, as SQLite's rowid.
        let admissions = journal
            .iter()
            .filter(|l| {
                l.value.outcome == Outcome::Admitted.as_str()
                    && l.value.first_ms >= admitted_since_ms
            })
            .filter_map(|l| serde_json::from_value::<Decision>(l.value.decision.clone()).ok())
            .collect();
        let latest = journal.iter().map(|l| l.value.last_ms).max();
        let last_pass = match latest {
            Some(latest) if latest >= last_pass_since_ms => journal
                .iter()
                .filter(|l| l.value.last_ms == latest)
                .map(|l| -> LastLine {
                    let l = &l.value;
                    (
                        l.id,
                        l.address.clone(),
                        l.outcome.clone(),
                        l.rule.clone(),
                        l.operation.clone(),
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut outcomes: Vec<(u64, RepairOutcome)> = self
            .kv_list::<OutcomeValue>(OUTCOMES)
            .await?
            .into_iter()
            .filter(|(_, v)| v.value.finished_ms >= outcomes_since_ms)
            .filter_map(|(k, v)| {
                Some((
                    k.parse::<u64>().ok()?,
                    RepairOutcome {
                        address: v.value.address,
                        finished_at: from_unix_ms(v.value.finished_ms),
                        succeeded: v.value.succeeded,
                    },
                ))
            })
            .collect();
        outcomes.sort_by_key(|(_, o)| o.finished_at);
        let own_entries = self
            .kv_keys(OWN)
            .await?
            .into_iter()
            .filter_map(|k| k.parse::<u64>().ok())
            .collect();
        Ok(Resume {
            max_seq,
            admissions,
            outcomes,
            last_pass,
            own_entries,
        })
    }

    async fn write_journal(&self, writes: Vec<JournalWrite>) -> Result<Vec<i64>, StoreError> {
        let mut ids = Vec::with_capacity(writes.len());
        for part in writes.chunks(TXN_OPS) {
            ids.extend(self.write_journal_part(part).await?);
        }
        Ok(ids)
    }

    async fn prune_journal(&self, before_ms: i64, max_rows: u64) -> Result<usize, StoreError> {
        let mut lines: Vec<LineValue> =
            self.journal().await?.into_iter().map(|v| v.value).collect();
        let mut gone: Vec<String> = Vec::new();
        lines.retain(|l| {
            if l.last_ms < before_ms {
                gone.push(line_key(l.id));
                false
            } else {
                true
            }
        });
        lines.sort_by_key(|l| std::cmp::Reverse(l.seq));
        let max = usize::try_from(max_rows).unwrap_or(usize::MAX);
        gone.extend(lines.iter().skip(max).map(|l| line_key(l.id)));
        self.delete_keys(&gone).await?;
        Ok(gone.len())
    }

    async fn events(&self, q: EventsQuery) -> Result<Vec<JournalLine>, StoreError> {
        let limit = if q.limit == 0 {
            DEFAULT_EVENTS_LIMIT
        } else {
            q.limit
        };
        let mut lines: Vec<LineValue> = self
            .journal()
            .await?
            .into_iter()
            .map(|v| v.value)
            .filter(|l| q.machine.as_ref().is_none_or(|m| &l.address == m))
            .filter(|l| {
                q.since_unix_ms
                    .is_none_or(|s| l.last_ms >= i64::try_from(s).unwrap_or(i64::MAX))
            })
            .filter(|l| l.seq > q.after_seq.unwrap_or(0))
            .collect();
        lines.sort_by_key(|l| l.seq);
        let skip = lines
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(lines[skip..].iter().map(LineValue::line).collect())
    }

    async fn add_outcomes(
        &self,
        new: Vec<(u64, RepairOutcome)>,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        let stored = self.kv_list::<OutcomeValue>(OUTCOMES).await?;
        let known: std::collections::HashSet<String> =
            stored.iter().map(|(k, _)| k.clone()).collect();
        let mut puts: Vec<(String, OutcomeValue)> = Vec::new();
        for (idx, o) in &new {
            let k = num_key(*idx);
            if known.contains(&k) || puts.iter().any(|(p, _)| p == &k) {
                continue;
            }
            puts.push((
                k,
                OutcomeValue {
                    address: o.address.clone(),
                    finished_ms: to_unix_ms(o.finished_at),
                    succeeded: o.succeeded,
                },
            ));
        }
        let mut dels: Vec<String> = stored
            .iter()
            .filter(|(_, v)| v.value.finished_ms < before_ms)
            .map(|(k, _)| format!("{OUTCOMES}/{k}"))
            .collect();
        for (k, v) in &puts {
            if v.finished_ms < before_ms {
                continue;
            }
            let mut txn = self.txn().if_absent(&format!("{OUTCOMES}/{k}"));
            txn = txn.put(&format!("{OUTCOMES}/{k}"), v)?;
            txn.commit().await?;
        }
        dels.dedup();
        self.delete_keys(&dels).await?;
        Ok(())
    }

    async fn update_own_entries(
        &self,
        added: Vec<(u64, String)>,
        gone: Vec<u64>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        let mut ops: Vec<(String, Option<OwnValue>)> = Vec::new();
        for (idx, address) in added {
            ops.push((
                format!("{OWN}/{}", num_key(idx)),
                Some(OwnValue {
                    address,
                    admitted_ms: at_ms,
                }),
            ));
        }
        for idx in gone {
            ops.push((format!("{OWN}/{}", num_key(idx)), None));
        }
        for part in ops.chunks(TXN_OPS) {
            let mut txn = self.txn();
            for (k, v) in part {
                txn = match v {
                    // As SQLite's INSERT OR IGNORE: an entry recorded keeps its first time;
                    // each is its own compare, so each goes in its own transaction.
                    Some(v) => {
                        self.txn().if_absent(k).put(k, v)?.commit().await?;
                        txn
                    }
                    None => txn.delete(k),
                };
            }
            if !txn.is_empty() {
                txn.commit().await?;
            }
        }
        Ok(())
    }
}
