//! What an admin request means: a pure function of (entries, enabled flag, requests, now)
//! → the writes to commit and the reply to each request.
//!
//! The engine batches admin requests (group commit) and calls [`plan`] on the batch;
//! requests later in a batch see what earlier ones changed (an entry deleted twice in one
//! batch counts once). The engine then commits [`AdminPlan::writes`] in one transaction,
//! and only after that applies [`AdminPlan::staged`] to its entries and sends the replies
//! ([`Reply`]); the two replies that need the commit's result ([`Reply::Added`] needs the
//! index SQLite assigned, [`Reply::Show`] reads the history) are finished by the engine.
//!
//! This module does no I/O and reads no clock.

use std::collections::BTreeMap;
use std::net::IpAddr;

use jiff::Timestamp;
use protocol::admin::repair::{
    AddRepairEntry, RepairQueueCounts, RepairQueueRequest, RepairQueueResponse, RepairStatus,
};
use protocol::messages::{Refusal, RefusalCode};

use super::config::RepairConfig;
use super::entry::{Entry, HistoryEvent};
use super::store::Write;
use crate::store::StoreError;

/// Why a repair queue request failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairQueueError {
    /// The request is invalid; the message says why.
    #[error("{0}")]
    BadRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The engine has stopped (coordinator shutting down).
    #[error("the repair queue is not running (coordinator shutting down?)")]
    Stopped,
}

impl RepairQueueError {
    /// True when the same request may succeed later.
    pub fn is_retriable(&self) -> bool {
        match self {
            RepairQueueError::BadRequest(_) => false,
            RepairQueueError::Store(e) => e.is_retriable(),
            RepairQueueError::Stopped => true,
        }
    }

    /// As an admin API refusal.
    pub fn to_refusal(&self) -> Refusal {
        let code = match self {
            RepairQueueError::BadRequest(_) => RefusalCode::BadRequest,
            RepairQueueError::Stopped => RefusalCode::ShuttingDown,
            RepairQueueError::Store(_) => RefusalCode::Internal,
        };
        Refusal::new(code, self.to_string())
    }
}

/// The reply to one request, as far as it is known before the commit.
#[derive(Debug)]
pub enum Reply {
    /// Known now (a listing, a count, a refusal, …).
    Now(Result<RepairQueueResponse, RepairQueueError>),
    /// The entry at this position of [`AdminPlan::inserts`], once SQLite gave it an index.
    Added(usize),
    /// The entry with this index and its history, read after the commit.
    Show(u64),
}

impl Reply {
    /// The reply when the batch's writes could not be committed: a listing still answers
    /// (it changed nothing), a refusal stays a refusal, everything else failed.
    pub fn uncommitted(self, error: &StoreError) -> Result<RepairQueueResponse, RepairQueueError> {
        match self {
            Reply::Now(Ok(RepairQueueResponse::List(l))) => Ok(RepairQueueResponse::List(l)),
            Reply::Now(Err(err)) => Err(err),
            _ => Err(RepairQueueError::Store(StoreError::Task(error.to_string()))),
        }
    }
}

/// What a batch of admin requests does.
#[derive(Debug)]
pub struct AdminPlan {
    /// To commit, in order, in one transaction.
    pub writes: Vec<Write>,
    /// Existing entries as they are after the batch, to apply once committed.
    pub staged: BTreeMap<u64, Entry>,
    /// New entries (index 0 until committed), in the order of their `Insert` writes.
    pub inserts: Vec<Entry>,
    /// The enabled flag after the batch.
    pub enabled: bool,
    /// One reply per request, in request order.
    pub replies: Vec<Reply>,
}

/// The queue's counts over `entries`.
pub fn counts<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    enabled: bool,
) -> RepairQueueCounts {
    let mut c = RepairQueueCounts {
        enabled,
        ..Default::default()
    };
    for e in entries {
        if e.deleted {
            c.deleting += 1;
        }
        match e.status {
            RepairStatus::Queued => c.queued += 1,
            RepairStatus::Processing => c.processing += 1,
            RepairStatus::Succeeded => c.succeeded += 1,
            RepairStatus::Failed => c.failed += 1,
        }
    }
    c
}

/// Refuses an `add` whose address is not an IP address, whose serial is longer than an
/// inventory serial may be, or whose machine type and operation match no repair procedure.
pub fn validate_add(config: &RepairConfig, add: &AddRepairEntry) -> Result<(), RepairQueueError> {
    if add.address.parse::<IpAddr>().is_err() {
        return Err(RepairQueueError::BadRequest(format!(
            "`{}` is not an IP address; the repair queue is keyed by machine address",
            add.address
        )));
    }
    // A serial typed for a machine whose record has none (or for an unknown address) is
    // kept as typed: the same limit as the inventory's.
    let n = add.serial.chars().count();
    if n > crate::inventory::MAX_SERIAL_CHARS {
        return Err(RepairQueueError::BadRequest(format!(
            "serial is {n} characters long; the limit is {}",
            crate::inventory::MAX_SERIAL_CHARS
        )));
    }
    config
        .operation_for(&add.machine_type, &add.operation)
        .map_err(|no| {
            RepairQueueError::BadRequest(format!("{no}; check the repair configuration"))
        })?;
    Ok(())
}

/// Who asked the repair queue for something: named in the history of the entries the
/// request added or deleted, so that `repair-queue show` says whether a person or the
/// coordinator's own remediation did it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester(String);

impl Requester {
    /// An operator, by the name in their admin certificate.
    pub fn admin(name: &str) -> Self {
        Self(format!("admin {name}"))
    }

    /// Automatic remediation, with the rule or setting it acted on.
    pub fn remediation(why: &str) -> Self {
        Self(format!("remediation ({why})"))
    }

    /// The coordinator itself, for the rare internal request.
    pub fn coordinator() -> Self {
        Self("the coordinator".to_string())
    }
}

impl std::fmt::Display for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `requests` (each with who asked) do to `entries` (every entry the engine holds, by
/// index) and the `enabled` flag at `now`.
pub fn plan(
    entries: &BTreeMap<u64, Entry>,
    enabled: bool,
    config: &RepairConfig,
    requests: impl IntoIterator<Item = (RepairQueueRequest, Requester)>,
    now: Timestamp,
) -> AdminPlan {
    let mut p = AdminPlan {
        writes: Vec::new(),
        staged: BTreeMap::new(),
        inserts: Vec::new(),
        enabled,
        replies: Vec::new(),
    };
    for (req, by) in requests {
        let reply = p.apply(entries, config, req, &by, now);
        p.replies.push(reply);
    }
    p
}

fn no_entry(index: u64) -> Reply {
    Reply::Now(Err(RepairQueueError::BadRequest(format!(
        "no repair queue entry {index}"
    ))))
}

impl AdminPlan {
    /// `e` as earlier requests of this batch left it.
    fn current<'a>(&'a self, e: &'a Entry) -> &'a Entry {
        self.staged.get(&e.index).unwrap_or(e)
    }

    fn stage(&mut self, e: Entry, ev: HistoryEvent) {
        self.writes.push(Write::Update(e.clone(), Some(ev)));
        self.staged.insert(e.index, e);
    }

    fn apply(
        &mut self,
        entries: &BTreeMap<u64, Entry>,
        config: &RepairConfig,
        req: RepairQueueRequest,
        by: &Requester,
        now: Timestamp,
    ) -> Reply {
        match req {
            // `AddChecked` was checked against the inventory by `crate::admin` already.
            RepairQueueRequest::Add(add) | RepairQueueRequest::AddChecked { entry: add, .. } => {
                match validate_add(config, &add) {
                    Err(e) => Reply::Now(Err(e)),
                    Ok(()) => {
                        let e = Entry::new_queued(
                            &add.address,
                            &add.serial,
                            &add.machine_type,
                            &add.operation,
                            now,
                        );
                        self.writes.push(Write::Insert(
                            e.clone(),
                            HistoryEvent::new(
                                "added",
                                format!(
                                    "{} {} {}, by {by}",
                                    add.operation, add.machine_type, add.address
                                ),
                            ),
                        ));
                        self.inserts.push(e);
                        Reply::Added(self.inserts.len() - 1)
                    }
                }
            }
            RepairQueueRequest::List => {
                let list = entries
                    .values()
                    .map(|e| self.current(e).to_wire())
                    .collect();
                Reply::Now(Ok(RepairQueueResponse::List(list)))
            }
            RepairQueueRequest::Show { index } => {
                if entries.contains_key(&index) {
                    Reply::Show(index)
                } else {
                    no_entry(index)
                }
            }
            RepairQueueRequest::Delete { index } => {
                let Some(e) = entries.get(&index) else {
                    return no_entry(index);
                };
                let mut e = self.current(e).clone();
                let count = u64::from(!e.deleted);
                if !e.deleted {
                    e.deleted = true;
                    self.stage(
                        e,
                        HistoryEvent::new(
                            "delete-requested",
                            format!("repair-queue delete, by {by}"),
                        ),
                    );
                }
                Reply::Now(Ok(RepairQueueResponse::Deleted { count }))
            }
            RepairQueueRequest::DeleteFinished | RepairQueueRequest::DeleteUnfinished => {
                let finished = matches!(req, RepairQueueRequest::DeleteFinished);
                let why = if finished {
                    "repair-queue delete-finished"
                } else {
                    "repair-queue delete-unfinished"
                };
                let mut count = 0;
                for e in entries.values() {
                    let e = self.current(e);
                    if !e.deleted && e.status.is_finished() == finished {
                        let mut e = e.clone();
                        e.deleted = true;
                        self.stage(
                            e,
                            HistoryEvent::new("delete-requested", format!("{why}, by {by}")),
                        );
                        count += 1;
                    }
                }
                Reply::Now(Ok(RepairQueueResponse::Deleted { count }))
            }
            RepairQueueRequest::Enable | RepairQueueRequest::Disable => {
                self.enabled = matches!(req, RepairQueueRequest::Enable);
                self.writes.push(Write::SetEnabled(self.enabled));
                Reply::Now(Ok(RepairQueueResponse::Enabled(self.enabled)))
            }
            RepairQueueRequest::IsEnabled => {
                Reply::Now(Ok(RepairQueueResponse::Enabled(self.enabled)))
            }
            RepairQueueRequest::ResetBackoff => {
                let mut count = 0;
                for e in entries.values() {
                    let e = self.current(e);
                    if e.drain_backoff_count != 0 || e.drain_backoff_expire.is_some() {
                        let mut e = e.clone();
                        e.drain_backoff_count = 0;
                        e.drain_backoff_expire = None;
                        self.stage(
                            e,
                            HistoryEvent::new(
                                "backoff-reset",
                                format!("repair-queue reset-backoff, by {by}"),
                            ),
                        );
                        count += 1;
                    }
                }
                Reply::Now(Ok(RepairQueueResponse::BackoffReset { count }))
            }
            RepairQueueRequest::Counts => Reply::Now(Ok(RepairQueueResponse::Counts(counts(
                entries.values(),
                self.enabled,
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use jiff::SignedDuration;

    use super::*;
    use crate::repair::load::load_str;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn config() -> RepairConfig {
        load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: op\n      repair_steps:\n      - repair_command: ['true']\n      health_check_command: [sh, -c, 'echo true']\n",
            Path::new("test.yml"),
        )
        .unwrap()
        .config
    }

    /// Fixture builder: a queue with entries in given states.
    struct Queue {
        entries: BTreeMap<u64, Entry>,
        enabled: bool,
    }

    fn queue() -> Queue {
        Queue {
            entries: BTreeMap::new(),
            enabled: true,
        }
    }

    impl Queue {
        fn entry(mut self, status: RepairStatus) -> Self {
            let mut e = Entry::new_queued("10.0.0.1", "", "t", "op", t0());
            e.index = self.entries.len() as u64 + 1;
            e.status = status;
            self.entries.insert(e.index, e);
            self
        }
        fn e(mut self, f: impl FnOnce(&mut Entry)) -> Self {
            let (_, e) = self.entries.last_key_value().expect("an entry");
            let mut e = e.clone();
            f(&mut e);
            self.entries.insert(e.index, e);
            self
        }
        fn disabled(mut self) -> Self {
            self.enabled = false;
            self
        }
        fn plan(&self, reqs: Vec<RepairQueueRequest>) -> AdminPlan {
            let by = Requester::admin("test");
            let reqs = reqs.into_iter().map(|r| (r, by.clone()));
            plan(&self.entries, self.enabled, &config(), reqs, t0())
        }
    }

    fn add(op: &str, address: &str) -> RepairQueueRequest {
        RepairQueueRequest::Add(AddRepairEntry {
            operation: op.into(),
            machine_type: "t".into(),
            address: address.into(),
            serial: String::new(),
        })
    }

    fn events(p: &AdminPlan) -> Vec<&str> {
        p.writes
            .iter()
            .map(|w| match w {
                Write::Insert(_, ev) | Write::History(_, ev) => ev.event,
                Write::Update(_, ev) => ev.as_ref().map_or("update", |e| e.event),
                Write::Delete(_) => "delete",
                Write::SetEnabled(true) => "enable",
                Write::SetEnabled(false) => "disable",
            })
            .collect()
    }

    fn now(r: &Reply) -> &RepairQueueResponse {
        match r {
            Reply::Now(Ok(r)) => r,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn add_inserts_a_queued_entry_and_answers_after_the_commit() {
        let p = queue().plan(vec![add("op", "10.0.0.7"), add("op", "10.0.0.8")]);
        assert_eq!(events(&p), ["added", "added"]);
        assert!(matches!(p.replies[..], [Reply::Added(0), Reply::Added(1)]));
        assert_eq!(p.inserts[1].address, "10.0.0.8");
        assert_eq!(p.inserts[1].status, RepairStatus::Queued);
        assert_eq!(p.inserts[1].last_transition, t0());
    }

    #[test]
    fn history_names_who_added_and_who_deleted() {
        let q = queue().entry(RepairStatus::Succeeded);
        let p = plan(
            &q.entries,
            q.enabled,
            &config(),
            [
                (add("op", "10.0.0.7"), Requester::remediation("unhealthy")),
                (
                    RepairQueueRequest::Delete { index: 1 },
                    Requester::admin("alice"),
                ),
            ],
            t0(),
        );
        let details: Vec<&str> = p
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Insert(_, ev) | Write::Update(_, Some(ev)) => Some(ev.detail.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            details,
            [
                "op t 10.0.0.7, by remediation (unhealthy)",
                "repair-queue delete, by admin alice"
            ]
        );
    }

    #[test]
    fn add_refuses_a_bad_address_a_long_serial_or_an_unknown_operation_and_writes_nothing() {
        let long_serial = RepairQueueRequest::Add(AddRepairEntry {
            operation: "op".into(),
            machine_type: "t".into(),
            address: "10.0.0.2".into(),
            serial: "s".repeat(crate::inventory::MAX_SERIAL_CHARS + 1),
        });
        let p = queue().plan(vec![
            add("op", "node-1"),
            add("nope", "10.0.0.1"),
            long_serial,
        ]);
        assert!(p.writes.is_empty());
        assert_eq!(p.replies.len(), 3);
        for (r, want) in p.replies.iter().zip([
            "not an IP address",
            "no operation `nope`",
            "serial is 254 characters long; the limit is 253",
        ]) {
            match r {
                Reply::Now(Err(RepairQueueError::BadRequest(m))) => {
                    assert!(m.contains(want), "{m}")
                }
                r => panic!("{r:?}"),
            }
        }
    }

    #[test]
    fn delete_twice_in_one_batch_counts_once_and_list_sees_it() {
        let q = queue().entry(RepairStatus::Processing);
        let p = q.plan(vec![
            RepairQueueRequest::Delete { index: 1 },
            RepairQueueRequest::Delete { index: 1 },
            RepairQueueRequest::List,
            RepairQueueRequest::Delete { index: 9 },
        ]);
        assert_eq!(events(&p), ["delete-requested"]);
        assert!(matches!(
            now(&p.replies[0]),
            RepairQueueResponse::Deleted { count: 1 }
        ));
        assert!(matches!(
            now(&p.replies[1]),
            RepairQueueResponse::Deleted { count: 0 }
        ));
        match now(&p.replies[2]) {
            RepairQueueResponse::List(l) => assert!(l[0].deleted),
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            p.replies[3],
            Reply::Now(Err(RepairQueueError::BadRequest(_)))
        ));
        assert!(p.staged[&1].deleted);
        assert!(!q.entries[&1].deleted, "the engine's entries are untouched");
    }

    #[test]
    fn delete_finished_and_unfinished_pick_by_status() {
        let q = queue()
            .entry(RepairStatus::Succeeded)
            .entry(RepairStatus::Failed)
            .entry(RepairStatus::Queued)
            .entry(RepairStatus::Processing)
            .entry(RepairStatus::Failed)
            .e(|e| e.deleted = true);
        let p = q.plan(vec![RepairQueueRequest::DeleteFinished]);
        assert!(matches!(
            now(&p.replies[0]),
            RepairQueueResponse::Deleted { count: 2 }
        ));
        assert_eq!(p.staged.keys().copied().collect::<Vec<_>>(), [1, 2]);
        let p = q.plan(vec![RepairQueueRequest::DeleteUnfinished]);
        assert_eq!(p.staged.keys().copied().collect::<Vec<_>>(), [3, 4]);
    }

    #[test]
    fn enable_disable_is_durable_and_seen_by_later_requests() {
        let p = queue().disabled().plan(vec![
            RepairQueueRequest::IsEnabled,
            RepairQueueRequest::Enable,
            RepairQueueRequest::IsEnabled,
            RepairQueueRequest::Counts,
        ]);
        assert_eq!(events(&p), ["enable"]);
        assert!(p.enabled);
        assert!(matches!(
            now(&p.replies[0]),
            RepairQueueResponse::Enabled(false)
        ));
        assert!(matches!(
            now(&p.replies[2]),
            RepairQueueResponse::Enabled(true)
        ));
        match now(&p.replies[3]) {
            RepairQueueResponse::Counts(c) => assert!(c.enabled),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn reset_backoff_clears_only_entries_with_a_backoff() {
        let q = queue()
            .entry(RepairStatus::Processing)
            .e(|e| {
                e.drain_backoff_count = 2;
                e.drain_backoff_expire = Some(t0() + SignedDuration::from_secs(300));
            })
            .entry(RepairStatus::Processing);
        let p = q.plan(vec![RepairQueueRequest::ResetBackoff]);
        assert_eq!(events(&p), ["backoff-reset"]);
        assert!(matches!(
            now(&p.replies[0]),
            RepairQueueResponse::BackoffReset { count: 1 }
        ));
        assert_eq!(p.staged[&1].drain_backoff_count, 0);
        assert_eq!(p.staged[&1].drain_backoff_expire, None);
    }

    #[test]
    fn counts_and_show() {
        let q = queue()
            .entry(RepairStatus::Queued)
            .entry(RepairStatus::Failed)
            .e(|e| e.deleted = true);
        let p = q.plan(vec![
            RepairQueueRequest::Counts,
            RepairQueueRequest::Show { index: 2 },
            RepairQueueRequest::Show { index: 3 },
        ]);
        match now(&p.replies[0]) {
            RepairQueueResponse::Counts(c) => {
                assert_eq!((c.queued, c.failed, c.deleting), (1, 1, 1))
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(p.replies[1], Reply::Show(2)));
        assert!(matches!(
            p.replies[2],
            Reply::Now(Err(RepairQueueError::BadRequest(_)))
        ));
    }

    #[test]
    fn a_failed_commit_still_answers_listings_and_refusals() {
        let q = queue().entry(RepairStatus::Queued);
        let err = StoreError::Task("disk full".into());
        let p = q.plan(vec![
            RepairQueueRequest::List,
            add("op", "bad"),
            add("op", "10.0.0.2"),
        ]);
        let mut r = p.replies.into_iter().map(|r| r.uncommitted(&err));
        assert!(matches!(r.next(), Some(Ok(RepairQueueResponse::List(_)))));
        assert!(matches!(
            r.next(),
            Some(Err(RepairQueueError::BadRequest(_)))
        ));
        assert!(matches!(r.next(), Some(Err(RepairQueueError::Store(_)))));
    }
}
