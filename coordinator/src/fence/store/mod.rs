//! Fence flows as state: [`FenceStore`] (the flows, their history, and which repair step
//! started which flow), with one implementation per backend ([`sqlite`], [`etcd`]).
//!
//! The runner commits a flow's new state and its history line before the new state's action
//! runs, so a coordinator killed at any point resumes the flow from what is committed.
//!
//! Finished flows are kept for `coordinatorctl fence list/show`, the newest
//! [`KEPT_FINISHED_PER_MACHINE`] per machine: a flow that ends prunes its machine's older
//! finished ones (their history goes with them), except a flow a repair entry still in the
//! queue started, which its step may look up again after a restart.

use std::future::Future;

use jiff::Timestamp;

use super::flow::{Flow, State};
use crate::store::{Store, StoreError, dispatch};

pub mod etcd;
pub mod sqlite;

/// One line of a flow's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryLine {
    /// When it was committed.
    pub at: Timestamp,
    /// The state entered (or kept).
    pub state: String,
    /// What happened.
    pub event: String,
}

/// Finished (done or failed) flows kept per machine. A machine fenced again and again would
/// otherwise add a flow and about ten history lines per fence for as long as the store
/// lives; 50 is months of history for a machine that keeps failing, and a few hundred KiB
/// for a whole fleet of them.
pub const KEPT_FINISHED_PER_MACHINE: i64 = 50;

/// What fence flows need of a store.
///
/// Each method is one transaction of the backend. The decisions that must be atomic are
/// inside the method that makes them: [`start`](Self::start) checks that the machine has no
/// unfinished flow and inserts in one, and [`note`](Self::note) checks the flow's state and
/// appends in one, so a backend shared by several coordinators can make each a single
/// compare-and-swap.
pub trait FenceStore {
    /// Records a new flow (its `id` is ignored) with its first history line `event`;
    /// returns its id, or `None` when the machine already has an unfinished flow (nothing
    /// is written then).
    fn start(
        &self,
        flow: Flow,
        event: String,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Rewrites flow `flow.id` and appends `event` to its history. A flow that ends (done or
    /// failed) prunes its machine's older finished flows. Fails for an unknown flow.
    fn update(
        &self,
        flow: Flow,
        event: String,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Appends `event` to flow `id`'s history, the flow unchanged, if it is in state
    /// `only_in` (any state when `None`); returns whether it did. Fails for an unknown flow.
    fn note(
        &self,
        id: u64,
        only_in: Option<State>,
        event: String,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The flow `id`, if it exists.
    fn load(&self, id: u64) -> impl Future<Output = Result<Option<Flow>, StoreError>> + Send;

    /// Every flow not yet done or failed, oldest first: what a restarted coordinator resumes.
    fn unfinished(&self) -> impl Future<Output = Result<Vec<Flow>, StoreError>> + Send;

    /// Every flow, newest first, at most `limit`.
    fn list(&self, limit: u32) -> impl Future<Output = Result<Vec<Flow>, StoreError>> + Send;

    /// The newest flows of the machine at `address`, at most `limit`, newest first.
    fn list_for(
        &self,
        address: String,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Flow>, StoreError>> + Send;

    /// A flow's history, oldest first (empty for an unknown flow).
    fn history(&self, id: u64)
    -> impl Future<Output = Result<Vec<HistoryLine>, StoreError>> + Send;

    /// The flow repair step `key` started, if it recorded one.
    fn flow_of_step(
        &self,
        key: String,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Records that step `key` of entry `entry` runs flow `flow`; a step already linked keeps
    /// its first flow.
    fn link_step(
        &self,
        key: String,
        entry: u64,
        flow: u64,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl FenceStore for Store {
    async fn start(
        &self,
        flow: Flow,
        event: String,
        now: Timestamp,
    ) -> Result<Option<u64>, StoreError> {
        dispatch!(self, b => b.start(flow, event, now).await)
    }

    async fn update(&self, flow: Flow, event: String, now: Timestamp) -> Result<(), StoreError> {
        dispatch!(self, b => b.update(flow, event, now).await)
    }

    async fn note(
        &self,
        id: u64,
        only_in: Option<State>,
        event: String,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        dispatch!(self, b => b.note(id, only_in, event, now).await)
    }

    async fn load(&self, id: u64) -> Result<Option<Flow>, StoreError> {
        dispatch!(self, b => b.load(id).await)
    }

    async fn unfinished(&self) -> Result<Vec<Flow>, StoreError> {
        dispatch!(self, b => b.unfinished().await)
    }

    async fn list(&self, limit: u32) -> Result<Vec<Flow>, StoreError> {
        dispatch!(self, b => b.list(limit).await)
    }

    async fn list_for(&self, address: String, limit: u32) -> Result<Vec<Flow>, StoreError> {
        dispatch!(self, b => b.list_for(address, limit).await)
    }

    async fn history(&self, id: u64) -> Result<Vec<HistoryLine>, StoreError> {
        dispatch!(self, b => b.history(id).await)
    }

    async fn flow_of_step(&self, key: String) -> Result<Option<u64>, StoreError> {
        dispatch!(self, b => b.flow_of_step(key).await)
    }

    async fn link_step(
        &self,
        key: String,
        entry: u64,
        flow: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        dispatch!(self, b => b.link_step(key, entry, flow, now).await)
    }
}

/// The store tests every backend of [`FenceStore`] must pass, each on a new, empty store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;

    /// A flow round-trips with its history; one unfinished flow per machine; notes land
    /// only in the state asked; steps keep their first flow.
    pub async fn a_flow_round_trips_with_its_history(s: &impl FenceStore) {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut f = Flow::new("10.0.0.1", "S", "n1", Some("b".into()), true, now);
        f.id = s
            .start(f.clone(), "started".into(), now)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            s.start(f.clone(), "again".into(), now).await.unwrap(),
            None,
            "one unfinished flow per machine"
        );
        f.state = State::WaitReleased;
        f.confirmed_off = Some(now);
        f.deadline = Some(now);
        f.power_attempt = 3;
        f.failure = Some("why".into());
        s.update(f.clone(), "released".into(), now).await.unwrap();
        assert_eq!(s.load(f.id).await.unwrap(), Some(f.clone()));
        assert_eq!(s.unfinished().await.unwrap(), vec![f.clone()]);
        assert!(
            !s.note(f.id, Some(State::Plan), "not now".into(), now)
                .await
                .unwrap(),
            "a note for another state is not written"
        );
        assert!(
            s.note(f.id, Some(State::WaitReleased), "waiting".into(), now)
                .await
                .unwrap()
        );
        assert!(s.note(f.id + 1000, None, "x".into(), now).await.is_err());
        f.state = State::Failed {
            detail: "bmc said no".into(),
        };
        s.update(f.clone(), "gave up".into(), now).await.unwrap();
        assert_eq!(s.load(f.id).await.unwrap(), Some(f.clone()));
        assert!(s.unfinished().await.unwrap().is_empty());
        let events: Vec<_> = s
            .history(f.id)
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.state, l.event))
            .collect();
        let expect = [
            ("plan", "started"),
            ("wait-released", "released"),
            ("wait-released", "waiting"),
            ("failed", "gave up"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()));
        assert_eq!(events, expect);
        assert_eq!(s.list(10).await.unwrap().len(), 1);
        assert_eq!(s.list_for("10.0.0.1".into(), 10).await.unwrap().len(), 1);
        assert!(s.list_for("10.0.0.2".into(), 10).await.unwrap().is_empty());
        // A finished flow no longer blocks a new one for the machine.
        let next = Flow::new("10.0.0.1", "S", "n1", None, false, now);
        let second = s.start(next, "new".into(), now).await.unwrap().unwrap();
        assert_ne!(second, f.id);
        assert_eq!(s.flow_of_step("k".into()).await.unwrap(), None);
        s.link_step("k".into(), 7, f.id, now).await.unwrap();
        s.link_step("k".into(), 7, second, now).await.unwrap();
        assert_eq!(s.flow_of_step("k".into()).await.unwrap(), Some(f.id));
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::a_flow_round_trips_with_its_history(&store).await;
    }
}
