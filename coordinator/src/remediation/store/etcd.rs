//! Remediation's state on etcd: [`RemediationStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `remediation/lines/<seq>`: one line of the decision journal, at its latest sequence
//!   number ([`super::etcd_journal`]);
//! - `remediation/switches/<key>`: `{"value": …, "set_ms": …}`, an operator switch;
//! - `remediation/cleared/<address>`: `{"address": …, "at_ms": …}`, `machines clear`;
//! - `remediation/outcomes/<index>`: how a finished repair ended (slow start);
//! - `remediation/own/<index>`: a repair entry the loop enqueued itself.

use protocol::admin::remediation::{EventsQuery, JournalLine};
use serde::{Deserialize, Serialize};

use super::{RemediationStore, Resume, Switchboard};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::fleet::store::etcd::record_key;
use crate::remediation::decision::{Outcome, Rule};
use crate::remediation::input::RepairOutcome;
use crate::remediation::journal::JournalWrite;
use crate::store::StoreError;
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Txn, key_level};

const SWITCHES: &str = "remediation/switches";
const CLEARED: &str = "remediation/cleared";
const OUTCOMES: &str = "remediation/outcomes";
const OWN: &str = "remediation/own";

/// Writes per transaction: under etcd's default `--max-txn-ops` (128), with room for a
/// leader's guard.
const TXN_OPS: usize = 120;

/// How often clearing a machine whose record changed meanwhile is tried again.
const ATTEMPTS: u32 = 8;

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

impl EtcdStore {
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
            let newest = self.journal_newest_of(&address).await?;
            let was = newest.is_some_and(|l| {
                l.outcome == Outcome::Held.as_str() && l.rule == Rule::NeedsHuman.as_str()
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
        let mut resume = Resume::default();
        self.journal_resume(admitted_since_ms, last_pass_since_ms, &mut resume)
            .await?;
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
        resume.outcomes = outcomes;
        resume.own_entries = own_entries;
        Ok(resume)
    }

    async fn write_journal(&self, writes: Vec<JournalWrite>) -> Result<Vec<i64>, StoreError> {
        Ok(self.journal_write(writes).await?)
    }

    async fn prune_journal(&self, before_ms: i64, max_rows: u64) -> Result<usize, StoreError> {
        Ok(self.journal_prune(before_ms, max_rows).await?)
    }

    async fn events(&self, q: EventsQuery) -> Result<Vec<JournalLine>, StoreError> {
        Ok(self.journal_events(&q).await?)
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
