//! Remediation's state as an interface: [`RemediationStore`] (the decision journal, the
//! operator switches, cleared machines, repair outcomes and the repair entries the loop
//! enqueued itself), with one implementation per backend ([`sqlite`] here).
//!
//! The journal stays bounded: the loop prunes it by age and count
//! ([`RemediationStore::prune_journal`]), outcomes are dropped past the slow-start lookback.

use std::collections::BTreeMap;
use std::future::Future;

use protocol::admin::remediation::{EventsQuery, JournalLine};

use super::decision::Decision;
use super::input::RepairOutcome;
use super::journal::{JournalWrite, LastLine};
use crate::store::{Store, StoreError, dispatch};

pub mod sqlite;

/// What a restarted loop reads to go on where the last one stopped, in one read.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The largest journal sequence number written so far (0 for an empty journal).
    pub max_seq: u64,
    /// Admissions made since the asked time, as decisions (rate limit and escalation).
    pub admissions: Vec<Decision>,
    /// Repair outcomes finished since the asked time, with their entry index.
    pub outcomes: Vec<(u64, RepairOutcome)>,
    /// The lines of the last pass journalled since the asked time.
    pub last_pass: Vec<LastLine>,
    /// Indexes of the repair queue entries the loop enqueued itself and still knows of.
    pub own_entries: Vec<u64>,
}

/// The operator's switches as stored.
#[derive(Debug, Clone, Default)]
pub struct Switchboard {
    /// Every switch set: key → (value, set at Unix ms).
    pub switches: BTreeMap<String, (String, i64)>,
    /// Every cleared machine and when.
    pub cleared: BTreeMap<String, jiff::Timestamp>,
}

/// What remediation needs of a store.
///
/// Each method is one transaction of the backend. [`clear_machine`](Self::clear_machine)
/// reads the machine's record and newest decision and writes the clearing in one, so its
/// answer and its write agree.
pub trait RemediationStore {
    /// The switches and cleared machines.
    fn switchboard(&self) -> impl Future<Output = Result<Switchboard, StoreError>> + Send;

    /// Sets (`Some`) or removes (`None`) one switch.
    fn set_switch(
        &self,
        key: String,
        value: Option<String>,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// `machines clear`: forgets the machine's remediations before `at_ms` for
    /// `needs-human`. `None` when no machine has this address (nothing written); otherwise
    /// whether the machine's newest decision held it as `needs-human`.
    fn clear_machine(
        &self,
        address: String,
        at_ms: i64,
    ) -> impl Future<Output = Result<Option<bool>, StoreError>> + Send;

    /// What a restarting loop needs: see [`Resume`]. The last pass is the lines last seen
    /// at the journal's latest time, if that is at or after `last_pass_since_ms`.
    fn resume(
        &self,
        admitted_since_ms: i64,
        outcomes_since_ms: i64,
        last_pass_since_ms: i64,
    ) -> impl Future<Output = Result<Resume, StoreError>> + Send;

    /// Commits a pass's journal writes, all or nothing; returns the id of each line written,
    /// in order.
    fn write_journal(
        &self,
        writes: Vec<JournalWrite>,
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send;

    /// Deletes lines last seen before `before_ms`, then all but the newest `max_rows`.
    /// Returns how many went.
    fn prune_journal(
        &self,
        before_ms: i64,
        max_rows: u64,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Lines matching `query`, ordered by sequence number (the newest `limit` of them;
    /// [`super::journal::DEFAULT_EVENTS_LIMIT`] when it sets none).
    fn events(
        &self,
        query: EventsQuery,
    ) -> impl Future<Output = Result<Vec<JournalLine>, StoreError>> + Send;

    /// Records outcomes (an index already recorded is kept as it was) and deletes those
    /// that finished before `before_ms`.
    fn add_outcomes(
        &self,
        new: Vec<(u64, RepairOutcome)>,
        before_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records entries the loop just enqueued (`(index, address)`, at `at_ms`), and forgets
    /// `gone`: entries that have left the queue.
    fn update_own_entries(
        &self,
        added: Vec<(u64, String)>,
        gone: Vec<u64>,
        at_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl RemediationStore for Store {
    async fn switchboard(&self) -> Result<Switchboard, StoreError> {
        dispatch!(self, b => b.switchboard().await)
    }

    async fn set_switch(
        &self,
        key: String,
        value: Option<String>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self, b => b.set_switch(key, value, now_ms).await)
    }

    async fn clear_machine(&self, address: String, at_ms: i64) -> Result<Option<bool>, StoreError> {
        dispatch!(self, b => b.clear_machine(address, at_ms).await)
    }

    async fn resume(
        &self,
        admitted_since_ms: i64,
        outcomes_since_ms: i64,
        last_pass_since_ms: i64,
    ) -> Result<Resume, StoreError> {
        dispatch!(self, b => b.resume(admitted_since_ms, outcomes_since_ms, last_pass_since_ms).await)
    }

    async fn write_journal(&self, writes: Vec<JournalWrite>) -> Result<Vec<i64>, StoreError> {
        dispatch!(self, b => b.write_journal(writes).await)
    }

    async fn prune_journal(&self, before_ms: i64, max_rows: u64) -> Result<usize, StoreError> {
        dispatch!(self, b => b.prune_journal(before_ms, max_rows).await)
    }

    async fn events(&self, query: EventsQuery) -> Result<Vec<JournalLine>, StoreError> {
        dispatch!(self, b => b.events(query).await)
    }

    async fn add_outcomes(
        &self,
        new: Vec<(u64, RepairOutcome)>,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self, b => b.add_outcomes(new, before_ms).await)
    }

    async fn update_own_entries(
        &self,
        added: Vec<(u64, String)>,
        gone: Vec<u64>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self, b => b.update_own_entries(added, gone, at_ms).await)
    }
}

/// The store tests every backend of [`RemediationStore`] must pass, each on a new, empty
/// store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;

    /// Switches are set and removed; outcomes are kept once and pruned by age; own entries
    /// come and go; an empty journal resumes from nothing.
    pub async fn switches_outcomes_and_own_entries(s: &impl RemediationStore) {
        let empty = s.resume(0, 0, 0).await.unwrap();
        assert_eq!(empty.max_seq, 0);
        assert!(empty.admissions.is_empty() && empty.last_pass.is_empty());
        s.set_switch("paused".into(), Some("true".into()), 5)
            .await
            .unwrap();
        s.set_switch("mode".into(), Some("observe".into()), 6)
            .await
            .unwrap();
        s.set_switch("mode".into(), None, 7).await.unwrap();
        let board = s.switchboard().await.unwrap();
        assert_eq!(
            board.switches,
            BTreeMap::from([("paused".to_string(), ("true".to_string(), 5))])
        );
        assert_eq!(s.clear_machine("10.0.0.9".into(), 10).await.unwrap(), None);
        let o = |a: &str, ms: i64, ok: bool| RepairOutcome {
            address: a.into(),
            finished_at: crate::clock::from_unix_ms(ms),
            succeeded: ok,
        };
        s.add_outcomes(
            vec![
                (1, o("10.0.0.1", 1_000, true)),
                (2, o("10.0.0.2", 2_000, false)),
            ],
            0,
        )
        .await
        .unwrap();
        s.add_outcomes(vec![(2, o("10.0.0.2", 2_500, true))], 1_500)
            .await
            .unwrap();
        let r = s.resume(0, 0, 0).await.unwrap();
        assert_eq!(r.outcomes.len(), 1, "1 pruned by age: {:?}", r.outcomes);
        assert_eq!(r.outcomes[0].0, 2);
        assert!(
            !r.outcomes[0].1.succeeded,
            "an index recorded is kept as it was"
        );
        s.update_own_entries(
            vec![(4, "10.0.0.1".into()), (5, "10.0.0.2".into())],
            vec![],
            9,
        )
        .await
        .unwrap();
        s.update_own_entries(vec![], vec![4], 0).await.unwrap();
        assert_eq!(s.resume(0, 0, 0).await.unwrap().own_entries, [5]);
        assert!(s.events(EventsQuery::default()).await.unwrap().is_empty());
        assert_eq!(s.prune_journal(i64::MAX, 10).await.unwrap(), 0);
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::switches_outcomes_and_own_entries(&store).await;
    }
}
