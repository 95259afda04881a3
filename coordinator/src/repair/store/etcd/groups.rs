//! Command process groups on etcd: [`CommandGroupStore`] for [`EtcdStore`].
//!
//! `repair/groups/<pgid>` holds one running command's group (JSON: pgid, entry, leader
//! start, session, boot id, command, started). A reap writes its history lines and deletes
//! the whole directory in one transaction with the repair queue's own commit
//! ([`EtcdStore::commit_with`]).
//!
//! [`CommandGroupStore::forget_group`] is synchronous (it runs from a command's destructor)
//! while the etcd client is async, and may be called on a runtime's own thread: so it marks
//! the record forgotten in memory at once (its `pgid` and the `mod_revision` it was written
//! at) and deletes it in a task, comparing that revision, so a group recorded again under the
//! same pgid in between is not deleted. [`CommandGroupStore::groups`] leaves out records
//! marked forgotten whose delete has not landed yet. A record whose delete never lands (the
//! coordinator died first) is what the trait allows: the reaper checks each record's leader
//! start time and boot id before it kills anything.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::err;
use crate::clock::to_unix_ms;
use crate::repair::store::Write;
use crate::repair::store::groups::{CommandGroupStore, GroupRecord};
use crate::store::StoreError;
use crate::store::etcd::EtcdStore;
use crate::store::etcd::kv::num_key;

const GROUPS: &str = "repair/groups";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GroupValue {
    pgid: u32,
    entry: u64,
    leader_start: u64,
    session: u32,
    boot_id: String,
    command: String,
    started_ms: i64,
}

fn key(pgid: u32) -> String {
    format!("{GROUPS}/{}", num_key(u64::from(pgid)))
}

/// What this process knows of its records: the revision each was written at, and those
/// forgotten whose delete is in flight.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    inner: Mutex<LedgerInner>,
}

#[derive(Debug, Default)]
struct LedgerInner {
    written: HashMap<u32, i64>,
    forgetting: HashSet<(u32, i64)>,
    runtime: Option<tokio::runtime::Handle>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CommandGroupStore for EtcdStore {
    async fn record_group(&self, rec: GroupRecord, now: Timestamp) -> Result<(), StoreError> {
        let value = GroupValue {
            pgid: rec.pgid,
            entry: rec.entry,
            leader_start: rec.leader_start,
            session: rec.session,
            boot_id: rec.boot_id,
            command: rec.command,
            started_ms: to_unix_ms(now),
        };
        let rev = self
            .txn()
            .put(&key(rec.pgid), &value)
            .map_err(err)?
            .commit_at()
            .await
            .map_err(err)?
            .unwrap_or(0);
        let ledger = self.area::<Ledger>();
        let mut l = ledger.lock();
        l.written.insert(rec.pgid, rev);
        l.runtime
            .get_or_insert_with(tokio::runtime::Handle::current);
        Ok(())
    }

    fn forget_group(&self, pgid: u32) -> Result<(), StoreError> {
        let ledger = self.area::<Ledger>();
        let (rev, runtime) = {
            let mut l = ledger.lock();
            let rev = l.written.remove(&pgid);
            if let Some(rev) = rev {
                l.forgetting.insert((pgid, rev));
            }
            let runtime = l
                .runtime
                .clone()
                .or_else(|| tokio::runtime::Handle::try_current().ok());
            (rev, runtime)
        };
        let Some(runtime) = runtime else {
            // Never recorded by this process and no runtime: nothing of ours to delete.
            return Ok(());
        };
        let store = self.clone();
        runtime.spawn(async move {
            let txn = match rev {
                Some(rev) => store.txn().if_mod_revision(&key(pgid), rev),
                None => store.txn(),
            };
            let done = txn.delete(&key(pgid)).commit().await;
            if let Err(error) = &done {
                tracing::warn!(%error, pgid, "the record of a finished command's process group could not be deleted from etcd; the next start's reaper checks it before acting");
            }
            if let Some(rev) = rev {
                store.area::<Ledger>().lock().forgetting.remove(&(pgid, rev));
            }
        });
        Ok(())
    }

    async fn groups(&self) -> Result<Vec<GroupRecord>, StoreError> {
        let ledger = self.area::<Ledger>();
        // A delete that lands while the listing is read may have landed after it: what was
        // being forgotten when the read began stays left out, with what still is.
        let mut forgetting = ledger.lock().forgetting.clone();
        let listed = self.kv_list::<GroupValue>(GROUPS).await.map_err(err)?;
        forgetting.extend(ledger.lock().forgetting.iter().copied());
        Ok(listed
            .into_iter()
            .filter(|(_, v)| !forgetting.contains(&(v.value.pgid, v.mod_revision)))
            .map(|(_, v)| GroupRecord {
                pgid: v.value.pgid,
                entry: v.value.entry,
                leader_start: v.value.leader_start,
                session: v.value.session,
                boot_id: v.value.boot_id,
                command: v.value.command,
            })
            .collect())
    }

    async fn reaped(&self, history: Vec<Write>, now: Timestamp) -> Result<(), StoreError> {
        if history.is_empty() {
            self.txn().delete_dir(GROUPS).commit().await.map_err(err)?;
        } else {
            self.commit_with(history, now, 1, |txn| Ok(txn.delete_dir(GROUPS)))
                .await?;
        }
        self.area::<Ledger>().lock().written.clear();
        Ok(())
    }
}
