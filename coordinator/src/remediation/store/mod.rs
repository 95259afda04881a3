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

pub mod etcd;
mod etcd_journal;
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
    /// in order: what a later [`JournalWrite::Repeat`] of the line names (SQLite keeps a
    /// line's id; etcd keys a line by its latest sequence number, so a repeat moves it).
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
    /// The journal: lines inserted and repeated (a repeat moves the line to its new
    /// sequence number and counts), queried by machine, time and sequence, resumed (the
    /// largest sequence number, admissions, the last pass), pruned by age then by count;
    /// clearing a machine says whether its newest decision needed a human.
    pub async fn journal_lines_repeat_query_resume_and_prune(s: &Store) {
        use crate::clock::from_unix_ms;
        use crate::fleet::store::{MachineStore, Row, Write as MachineWrite};
        use crate::health::MachineState;
        use crate::inventory::{MachineRecord, RecordSource};
        use crate::remediation::decision::{Outcome, Proposal, Rule};

        let d = |ms: i64, address: &str, outcome: Outcome, rule: Rule, sentence: &str| Decision {
            at: from_unix_ms(ms),
            address: address.into(),
            domain: "rack-1".into(),
            outcome,
            rule,
            proposal: (outcome == Outcome::Admitted).then(|| Proposal {
                operation: "unhealthy".into(),
                machine_type: "qemu".into(),
                serial: "S".into(),
                source: "auto-repair".into(),
                reason: "r".into(),
            }),
            sentence: sentence.into(),
        };
        let ids = s
            .write_journal(vec![
                JournalWrite::Insert {
                    seq: 1,
                    decision: d(1_000, "10.0.0.1", Outcome::Admitted, Rule::AutoRepair, "a1"),
                },
                JournalWrite::Insert {
                    seq: 2,
                    decision: d(1_000, "10.0.0.2", Outcome::Held, Rule::NeedsHuman, "h1"),
                },
            ])
            .await
            .unwrap();
        assert_eq!(ids.len(), 2);
        assert_ne!(ids[0], ids[1]);
        let again = s
            .write_journal(vec![
                JournalWrite::Repeat {
                    id: ids[1],
                    seq: 3,
                    decision: d(2_000, "10.0.0.2", Outcome::Held, Rule::NeedsHuman, "h2"),
                },
                JournalWrite::Insert {
                    seq: 4,
                    decision: d(2_000, "10.0.0.3", Outcome::Held, Rule::Paused, "p1"),
                },
            ])
            .await
            .unwrap();
        // The id a write returns is what the next repeat names (SQLite keeps a line's row;
        // etcd moves the line to its new sequence number).
        assert_eq!(again.len(), 2);
        assert_ne!(again[0], again[1]);
        let all = s.events(EventsQuery::default()).await.unwrap();
        assert_eq!(
            all.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [1, 3, 4],
            "ordered by sequence number"
        );
        let repeated = &all[1];
        assert_eq!(
            (
                repeated.count,
                repeated.first_unix_ms,
                repeated.last_unix_ms,
                repeated.sentence.as_str()
            ),
            (2, 1_000, 2_000, "h2")
        );
        assert_eq!(all[0].operation.as_deref(), Some("unhealthy"));
        let q = |machine: Option<&str>, since: Option<u64>, after: Option<u64>, limit: u32| {
            EventsQuery {
                machine: machine.map(str::to_string),
                since_unix_ms: since,
                after_seq: after,
                limit,
            }
        };
        assert_eq!(
            s.events(q(Some("10.0.0.2"), None, None, 0))
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            s.events(q(None, Some(1_500), None, 0)).await.unwrap().len(),
            2
        );
        assert_eq!(s.events(q(None, None, Some(3), 0)).await.unwrap()[0].seq, 4);
        let newest = s.events(q(None, None, None, 2)).await.unwrap();
        assert_eq!(newest.iter().map(|l| l.seq).collect::<Vec<_>>(), [3, 4]);

        let r = s.resume(0, 0, 1_500).await.unwrap();
        assert_eq!(r.max_seq, 4);
        assert_eq!(r.admissions.len(), 1);
        assert_eq!(r.admissions[0].sentence, "a1");
        let mut last: Vec<String> = r.last_pass.iter().map(|l| l.1.clone()).collect();
        last.sort();
        assert_eq!(last, ["10.0.0.2", "10.0.0.3"], "the lines last seen at 2 s");
        assert!(
            s.resume(1_001, 0, 2_001)
                .await
                .unwrap()
                .admissions
                .is_empty()
        );
        assert!(s.resume(0, 0, 2_001).await.unwrap().last_pass.is_empty());

        // Clearing: only a known machine; whether its newest line needed a human.
        let record = |address: &str| MachineRecord {
            address: address.into(),
            hostname: address.into(),
            serial: "S".into(),
            rack: "r1".into(),
            role: "worker".into(),
            machine_type: Some("qemu".into()),
            labels: Default::default(),
            source: RecordSource::Inventory,
        };
        let row = |address: &str| {
            MachineWrite::Row(Row {
                record: record(address),
                state: MachineState::Healthy,
                since: from_unix_ms(0),
                reason: String::new(),
                now: from_unix_ms(0),
            })
        };
        s.persist(vec![row("10.0.0.2"), row("10.0.0.3")])
            .await
            .unwrap();
        assert_eq!(
            s.clear_machine("10.0.0.2".into(), 5).await.unwrap(),
            Some(true)
        );
        assert_eq!(
            s.clear_machine("10.0.0.3".into(), 5).await.unwrap(),
            Some(false)
        );
        assert_eq!(s.clear_machine("10.0.0.9".into(), 5).await.unwrap(), None);
        let board = s.switchboard().await.unwrap();
        assert_eq!(board.cleared.len(), 2, "{:?}", board.cleared);
        assert_eq!(board.cleared["10.0.0.2"], from_unix_ms(5));

        // Pruned by age (last seen before 1.5 s), then to the newest one.
        assert_eq!(s.prune_journal(1_500, 10).await.unwrap(), 1);
        assert_eq!(s.prune_journal(0, 1).await.unwrap(), 1);
        let left = s.events(EventsQuery::default()).await.unwrap();
        assert_eq!(left.iter().map(|l| l.seq).collect::<Vec<_>>(), [4]);
        assert_eq!(s.resume(0, 0, 0).await.unwrap().max_seq, 4);
        // The line left, repeated by the id its write returned: one line, counted twice.
        let last = s
            .write_journal(vec![JournalWrite::Repeat {
                id: again[1],
                seq: 5,
                decision: d(3_000, "10.0.0.3", Outcome::Held, Rule::Paused, "p2"),
            }])
            .await
            .unwrap();
        let left = s.events(EventsQuery::default()).await.unwrap();
        assert_eq!(
            left.iter()
                .map(|l| (l.seq, l.count, l.sentence.as_str()))
                .collect::<Vec<_>>(),
            [(5, 2, "p2")]
        );
        // And again by the id the repeat returned.
        s.write_journal(vec![JournalWrite::Repeat {
            id: last[0],
            seq: 6,
            decision: d(4_000, "10.0.0.3", Outcome::Held, Rule::Paused, "p3"),
        }])
        .await
        .unwrap();
        let left = s.events(EventsQuery::default()).await.unwrap();
        assert_eq!(
            left.iter().map(|l| (l.seq, l.count)).collect::<Vec<_>>(),
            [(6, 3)]
        );
        let r = s.resume(0, 0, 0).await.unwrap();
        assert_eq!(r.last_pass.len(), 1);
        assert_eq!(r.max_seq, 6);
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
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::journal_lines_repeat_query_resume_and_prune(&store).await;
    }
}
