//! The process groups of running repair commands as state: [`CommandGroupStore`], so a
//! coordinator killed while a command ran can kill it before the step runs again
//! (invariant 8; the logic is in [`crate::repair::orphans`]).

use std::future::Future;

use jiff::Timestamp;

use super::Write;
use crate::store::{Store, StoreError, dispatch};

/// The record of one running command's process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    /// Process group id (the leader's pid).
    pub pgid: u32,
    /// The repair queue entry whose command it is.
    pub entry: u64,
    /// The leader's start time (ticks after boot).
    pub leader_start: u64,
    /// The leader's session.
    pub session: u32,
    /// The boot it ran in.
    pub boot_id: String,
    /// The command line, for the history.
    pub command: String,
}

/// What the command-group ledger needs of a store.
///
/// A record only has to outlive the coordinator *process*: a crash of the machine kills the
/// commands too and changes the boot id, which the reaper checks. So a backend may write
/// records without waiting for them to reach the disk (SQLite does: two fsyncs per command
/// would cost the queue about two thirds of its throughput).
pub trait CommandGroupStore {
    /// Records group `record.pgid` (replacing a record of the same group), started at `now`.
    fn record_group(
        &self,
        record: GroupRecord,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes the record of group `pgid`. Synchronous: it runs from a command's destructor,
    /// on a blocking thread (never on a runtime worker), so a backend whose client is async
    /// may block on its runtime here.
    fn forget_group(&self, pgid: u32) -> Result<(), StoreError>;

    /// Every recorded group, by pgid.
    fn groups(&self) -> impl Future<Output = Result<Vec<GroupRecord>, StoreError>> + Send;

    /// After a reap: commits `history` (the repair queue's lines saying what was killed) and
    /// removes every group record, in one transaction, so a crash in between neither loses
    /// the lines nor kills a group twice.
    fn reaped(
        &self,
        history: Vec<Write>,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl CommandGroupStore for Store {
    async fn record_group(&self, record: GroupRecord, now: Timestamp) -> Result<(), StoreError> {
        dispatch!(self, b => b.record_group(record, now).await)
    }

    fn forget_group(&self, pgid: u32) -> Result<(), StoreError> {
        dispatch!(self, b => b.forget_group(pgid))
    }

    async fn groups(&self) -> Result<Vec<GroupRecord>, StoreError> {
        dispatch!(self, b => b.groups().await)
    }

    async fn reaped(&self, history: Vec<Write>, now: Timestamp) -> Result<(), StoreError> {
        dispatch!(self, b => b.reaped(history, now).await)
    }
}

/// The store tests every backend of [`CommandGroupStore`] must pass, each on a new, empty
/// store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;
    use crate::repair::entry::{Entry, HistoryEvent};
    use crate::repair::store::RepairQueueStore;

    /// Groups are recorded, replaced, forgotten, and cleared with the reap's history.
    pub async fn groups_are_recorded_forgotten_and_reaped(
        s: &(impl CommandGroupStore + RepairQueueStore),
    ) {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let rec = |pgid: u32, command: &str| GroupRecord {
            pgid,
            entry: 1,
            leader_start: 99,
            session: pgid,
            boot_id: "b".into(),
            command: command.into(),
        };
        s.record_group(rec(20, "a"), now).await.unwrap();
        s.record_group(rec(10, "b"), now).await.unwrap();
        s.record_group(rec(20, "c"), now).await.unwrap();
        assert_eq!(s.groups().await.unwrap(), vec![rec(10, "b"), rec(20, "c")]);
        s.forget_group(10).unwrap();
        s.forget_group(11).unwrap();
        assert_eq!(s.groups().await.unwrap(), vec![rec(20, "c")]);
        let e = Entry::new_queued("10.0.0.1", "", "qemu", "op", now);
        let mut e = e.clone();
        e.index = s
            .commit(
                vec![Write::Insert(e.clone(), HistoryEvent::new("added", ""))],
                now,
            )
            .await
            .unwrap()[0];
        s.reaped(
            vec![Write::History(
                e.clone(),
                HistoryEvent::new("orphan-killed", "k"),
            )],
            now,
        )
        .await
        .unwrap();
        assert!(s.groups().await.unwrap().is_empty());
        let h = s.history(e.index).await.unwrap();
        assert_eq!(h.last().unwrap().event, "orphan-killed");
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::groups_are_recorded_forgotten_and_reaped(&store).await;
    }
}
