//! The repair queue's state as an interface: [`RepairQueueStore`] (entries, the enabled
//! flag and each entry's history), with one implementation per backend ([`sqlite`],
//! [`etcd`]).
//!
//! The repair area's other state has its own interfaces beside it:
//! [`groups::CommandGroupStore`] (running commands' process groups) and
//! [`diagnostics::DiagnosticsStore`] (bundles collected by `@collect-diagnostics`).
//!
//! The engine keeps the queue in memory and commits every transition of a decision pass in
//! one [`RepairQueueStore::commit`] before it acts on any of them (invariant 6).

use std::collections::HashSet;
use std::future::Future;

use jiff::Timestamp;
use protocol::admin::repair::RepairHistoryRecord;

use super::entry::{Entry, HistoryEvent};
use crate::store::{Store, StoreError, dispatch};

pub mod diagnostics;
pub mod etcd;
pub mod groups;
pub mod sqlite;

/// One durable change.
#[derive(Debug, Clone)]
pub enum Write {
    /// A new entry (its index is assigned by SQLite and returned by [`commit`]).
    Insert(Entry, HistoryEvent),
    /// An entry changed; the event, if any, is appended to its history.
    Update(Entry, Option<HistoryEvent>),
    /// A history line without a change of the entry.
    History(Entry, HistoryEvent),
    /// The entry and its history are removed.
    Delete(u64),
    /// The queue's enabled flag.
    SetEnabled(bool),
}

/// What the repair queue needs of a store.
///
/// Every method is one transaction of the backend: a batch given to [`commit`](Self::commit)
/// lands whole or not at all, and a reader never sees half of one. The engine is the only
/// writer of entries (one coordinator acts on a store at a time), so it decides from its own
/// copy and commits the result; a backend shared by several coordinators makes each commit
/// conditional (an entry's update on the revision it was loaded or last written at, an
/// insert on the index it is given), so a commit that lost a race fails instead of
/// overwriting.
pub trait RepairQueueStore {
    /// The enabled flag (true when never set) and every entry, by index.
    fn load(&self) -> impl Future<Output = Result<(bool, Vec<Entry>), StoreError>> + Send;

    /// Commits `writes` in order, all or nothing, each history line stamped `now`; returns
    /// the indexes given to the inserted entries, in order. Indexes are never reused, even
    /// after their entry is deleted. Deleting an entry deletes its history.
    fn commit(
        &self,
        writes: Vec<Write>,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// An entry's history, oldest first (empty for an unknown or deleted entry).
    fn history(
        &self,
        index: u64,
    ) -> impl Future<Output = Result<Vec<RepairHistoryRecord>, StoreError>> + Send;

    /// Addresses with a queued or processing entry not marked for deletion.
    fn active_addresses(&self) -> impl Future<Output = Result<HashSet<String>, StoreError>> + Send;
}

impl RepairQueueStore for Store {
    async fn load(&self) -> Result<(bool, Vec<Entry>), StoreError> {
        dispatch!(self, b => b.load().await)
    }

    async fn commit(&self, writes: Vec<Write>, now: Timestamp) -> Result<Vec<u64>, StoreError> {
        dispatch!(self, b => b.commit(writes, now).await)
    }

    async fn history(&self, index: u64) -> Result<Vec<RepairHistoryRecord>, StoreError> {
        dispatch!(self, b => b.history(index).await)
    }

    async fn active_addresses(&self) -> Result<HashSet<String>, StoreError> {
        dispatch!(self, b => b.active_addresses().await)
    }
}

/// The store tests every backend of [`RepairQueueStore`] must pass, each on a new, empty
/// store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;
    use crate::repair::entry::Phase;
    use protocol::admin::repair::{RepairStatus, RepairStepStatus};

    /// Entries round-trip, a batch applies in order, history follows its entry, indexes
    /// are never reused.
    pub async fn entries_round_trip_and_indexes_are_never_reused(store: &impl RepairQueueStore) {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let e = Entry::new_queued("10.0.0.1", "S1", "qemu", "op", now);
        let ids = store
            .commit(
                vec![
                    Write::Insert(e.clone(), HistoryEvent::new("added", "test")),
                    Write::Insert(e.clone(), HistoryEvent::new("added", "test")),
                ],
                now,
            )
            .await
            .unwrap();
        assert_eq!(ids, [1, 2]);
        let mut changed = e.clone();
        changed.index = 2;
        changed.status = RepairStatus::Processing;
        changed.step = 1;
        changed.step_status = RepairStepStatus::Watching;
        changed.phase = Phase::Watching { since: now };
        changed.drain_backoff_count = 2;
        changed.drain_backoff_expire = Some(now);
        changed.boot_id_before = "b1".into();
        store
            .commit(
                vec![
                    Write::Delete(1),
                    Write::Update(
                        changed.clone(),
                        Some(HistoryEvent::new("x", "y").with_output("out")),
                    ),
                    Write::SetEnabled(false),
                ],
                now,
            )
            .await
            .unwrap();
        let (enabled, all) = store.load().await.unwrap();
        assert!(!enabled);
        assert_eq!(all, vec![changed.clone()]);
        let h = store.history(2).await.unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(
            (h[1].event.as_str(), h[1].output.as_str(), h[1].step),
            ("x", "out", 1)
        );
        assert!(
            store.history(1).await.unwrap().is_empty(),
            "history deleted with its entry"
        );
        let ids = store
            .commit(
                vec![Write::Insert(e.clone(), HistoryEvent::new("added", ""))],
                now,
            )
            .await
            .unwrap();
        assert_eq!(
            store.active_addresses().await.unwrap(),
            HashSet::from(["10.0.0.1".to_string()])
        );
        assert_eq!(ids, [3], "index 1 is not reused");
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::entries_round_trip_and_indexes_are_never_reused(&store).await;
    }
}
