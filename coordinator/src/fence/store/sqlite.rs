//! Fence flows on SQLite (migration 0007; the kdump leg's columns come with migration 0009,
//! the repair steps' links with 0008): [`FenceStore`] for [`Sqlite`].
//!
//! Plain synchronous functions over a `rusqlite::Connection`, run on a blocking thread by
//! [`Sqlite::call`]. A state change and its history line are one transaction.

use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

use super::{FenceStore, HistoryLine, KEPT_FINISHED_PER_MACHINE};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::fence::flow::{Flow, KdumpLeg, State};
use crate::k8s::release::Release;
use crate::store::{Sqlite, StoreError};

impl FenceStore for Sqlite {
    async fn start(
        &self,
        flow: Flow,
        event: String,
        now: Timestamp,
    ) -> Result<Option<u64>, StoreError> {
        self.call(move |c| {
            if unfinished(c)?.iter().any(|x| x.address == flow.address) {
                return Ok(None);
            }
            insert(c, &flow, &event, now).map(Some)
        })
        .await
    }

    async fn update(&self, flow: Flow, event: String, now: Timestamp) -> Result<(), StoreError> {
        self.call(move |c| update(c, &flow, &event, now)).await
    }

    async fn note(
        &self,
        id: u64,
        only_in: Option<State>,
        event: String,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            let Some(f) = load(&tx, id)? else {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            };
            if only_in.is_some_and(|s| s != f.state) {
                return Ok(false);
            }
            history(&tx, id, &f, &event, now)?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    async fn load(&self, id: u64) -> Result<Option<Flow>, StoreError> {
        self.call(move |c| load(c, id)).await
    }

    async fn unfinished(&self) -> Result<Vec<Flow>, StoreError> {
        self.call(|c| unfinished(c)).await
    }

    async fn list(&self, limit: u32) -> Result<Vec<Flow>, StoreError> {
        self.call(move |c| list(c, limit)).await
    }

    async fn list_for(&self, address: String, limit: u32) -> Result<Vec<Flow>, StoreError> {
        self.call(move |c| list_for(c, &address, limit)).await
    }

    async fn history(&self, id: u64) -> Result<Vec<HistoryLine>, StoreError> {
        self.call(move |c| history_of(c, id)).await
    }

    async fn flow_of_step(&self, key: String) -> Result<Option<u64>, StoreError> {
        self.call(move |c| {
            c.query_row(
                "SELECT flow_id FROM repair_fence_flows WHERE step_key = ?1",
                [&key],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|id| id.map(|i| i as u64))
        })
        .await
    }

    async fn link_step(
        &self,
        key: String,
        entry: u64,
        flow: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.call(move |c| {
            c.execute(
                "INSERT OR IGNORE INTO repair_fence_flows (step_key, entry_index, flow_id, created_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                params![key, entry as i64, flow as i64, to_unix_ms(now)],
            )
            .map(drop)
        })
        .await
    }
}

fn opt_ms(t: Option<Timestamp>) -> i64 {
    t.map(to_unix_ms).unwrap_or(0)
}

fn ms_opt(ms: i64) -> Option<Timestamp> {
    (ms != 0).then(|| from_unix_ms(ms))
}

fn conversion(what: &str, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("fence_flows: bad {what}: {e}").into(),
    )
}

fn how_json(f: &Flow) -> rusqlite::Result<Option<String>> {
    f.how
        .as_ref()
        .map(|h| serde_json::to_string(h).map_err(|e| conversion("release plan", e)))
        .transpose()
}

fn detail(f: &Flow) -> &str {
    match &f.state {
        State::Failed { detail } => detail,
        _ => "",
    }
}

fn history(
    tx: &Connection,
    id: u64,
    f: &Flow,
    event: &str,
    now: Timestamp,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO fence_flow_history (flow_id, at_ms, state, event) VALUES (?1, ?2, ?3, ?4)",
        params![id as i64, to_unix_ms(now), f.state.kind(), event],
    )?;
    Ok(())
}

/// Inserts a new flow and its first history line; returns its id. Fails (a constraint
/// error) when the machine already has an unfinished flow.
pub(crate) fn insert(
    conn: &mut Connection,
    f: &Flow,
    event: &str,
    now: Timestamp,
) -> rusqlite::Result<u64> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO fence_flows (address, serial, node, keep_off, boot_id_before, state,
             state_detail, state_since_ms, deadline_ms, power_attempt, how_json, confirmed_off_ms,
             confirm_request, powered_on_ms, failure, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        params![
            f.address,
            f.serial,
            f.node,
            f.keep_off,
            f.boot_id_before,
            f.state.kind(),
            detail(f),
            to_unix_ms(f.state_since),
            opt_ms(f.deadline),
            i64::from(f.power_attempt),
            how_json(f)?,
            opt_ms(f.confirmed_off),
            f.confirm_request,
            opt_ms(f.powered_on),
            f.failure,
            to_unix_ms(now),
        ],
    )?;
    let id = tx.last_insert_rowid() as u64;
    kdump_leg(&tx, id, f)?;
    history(&tx, id, f, event, now)?;
    tx.commit()?;
    Ok(id)
}

/// Rewrites flow `f.id` and appends `event` to its history, in one transaction.
pub(crate) fn update(
    conn: &mut Connection,
    f: &Flow,
    event: &str,
    now: Timestamp,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let n = tx.execute(
        "UPDATE fence_flows SET state = ?2, state_detail = ?3, state_since_ms = ?4,
             deadline_ms = ?5, power_attempt = ?6, how_json = ?7, confirmed_off_ms = ?8,
             confirm_request = ?9, powered_on_ms = ?10, failure = ?11
         WHERE id = ?1",
        params![
            f.id as i64,
            f.state.kind(),
            detail(f),
            to_unix_ms(f.state_since),
            opt_ms(f.deadline),
            i64::from(f.power_attempt),
            how_json(f)?,
            opt_ms(f.confirmed_off),
            f.confirm_request,
            opt_ms(f.powered_on),
            f.failure,
        ],
    )?;
    if n != 1 {
        return Err(rusqlite::Error::QueryReturnedNoRows);
    }
    kdump_leg(&tx, f.id, f)?;
    history(&tx, f.id, f, event, now)?;
    if matches!(f.state, State::Done | State::Failed { .. }) {
        prune_finished(&tx, &f.address)?;
    }
    tx.commit()
}

/// Deletes `address`'s finished flows older than its newest [`KEPT_FINISHED_PER_MACHINE`]
/// finished ones (inside the caller's transaction), with their history. A flow that a repair
/// entry still in the queue started stays; the link of an entry no longer in the queue goes
/// with its flow.
fn prune_finished(tx: &Connection, address: &str) -> rusqlite::Result<()> {
    const OLD: &str = "SELECT id FROM fence_flows WHERE address = ?1
             AND state IN ('done', 'failed') AND id NOT IN
             (SELECT id FROM fence_flows WHERE address = ?1 AND state IN ('done', 'failed')
              ORDER BY id DESC LIMIT ?2)";
    tx.execute(
        &format!(
            "DELETE FROM repair_fence_flows WHERE flow_id IN ({OLD})
             AND entry_index NOT IN (SELECT idx FROM repair_queue_entries)"
        ),
        params![address, KEPT_FINISHED_PER_MACHINE],
    )?;
    tx.execute(
        &format!(
            "DELETE FROM fence_flows WHERE id IN ({OLD})
             AND id NOT IN (SELECT flow_id FROM repair_fence_flows)"
        ),
        params![address, KEPT_FINISHED_PER_MACHINE],
    )?;
    Ok(())
}

const COLUMNS: &str = "id, address, serial, node, keep_off, boot_id_before, state, state_detail,
    state_since_ms, deadline_ms, power_attempt, how_json, confirmed_off_ms, confirm_request,
    powered_on_ms, failure, kdump_started_ms, kdump_deadline_ms, kdump_released";

/// Writes the kdump leg's columns of flow `id` (inside the caller's transaction).
fn kdump_leg(tx: &Connection, id: u64, f: &Flow) -> rusqlite::Result<()> {
    let leg = f.kdump;
    tx.execute(
        "UPDATE fence_flows SET kdump_started_ms = ?2, kdump_deadline_ms = ?3, kdump_released = ?4
         WHERE id = ?1",
        params![
            id as i64,
            opt_ms(leg.map(|l| l.started)),
            opt_ms(leg.map(|l| l.until)),
            leg.is_some_and(|l| l.released),
        ],
    )?;
    Ok(())
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Flow> {
    let kind: String = r.get(6)?;
    let detail: String = r.get(7)?;
    let how: Option<String> = r.get(11)?;
    Ok(Flow {
        id: r.get::<_, i64>(0)? as u64,
        address: r.get(1)?,
        serial: r.get(2)?,
        node: r.get(3)?,
        keep_off: r.get(4)?,
        boot_id_before: r.get(5)?,
        state: State::parse(&kind, &detail).ok_or_else(|| conversion("state", &kind))?,
        state_since: from_unix_ms(r.get(8)?),
        deadline: ms_opt(r.get(9)?),
        power_attempt: u32::try_from(r.get::<_, i64>(10)?).unwrap_or(0),
        how: how
            .map(|h| serde_json::from_str::<Release>(&h).map_err(|e| conversion("release plan", e)))
            .transpose()?,
        confirmed_off: ms_opt(r.get(12)?),
        confirm_request: r.get(13)?,
        powered_on: ms_opt(r.get(14)?),
        failure: r.get(15)?,
        kdump: match (ms_opt(r.get(16)?), ms_opt(r.get(17)?)) {
            (Some(started), Some(until)) => Some(KdumpLeg {
                started,
                until,
                released: r.get(18)?,
            }),
            _ => None,
        },
    })
}

/// The flow `id`, if it exists.
pub(crate) fn load(conn: &Connection, id: u64) -> rusqlite::Result<Option<Flow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM fence_flows WHERE id = ?1"),
        [id as i64],
        row,
    )
    .optional()
}

/// Every flow not yet done or failed, oldest first: what a restarted coordinator resumes.
pub(crate) fn unfinished(conn: &Connection) -> rusqlite::Result<Vec<Flow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM fence_flows WHERE state NOT IN ('done', 'failed') ORDER BY id"
    ))?;
    stmt.query_map([], row)?.collect()
}

/// Every flow, newest first, at most `limit`: for `coordinatorctl fence list`.
pub(crate) fn list(conn: &Connection, limit: u32) -> rusqlite::Result<Vec<Flow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM fence_flows ORDER BY id DESC LIMIT ?1"
    ))?;
    stmt.query_map([i64::from(limit)], row)?.collect()
}

/// The newest flows of the machine at `address`, at most `limit`, newest first.
pub(crate) fn list_for(
    conn: &Connection,
    address: &str,
    limit: u32,
) -> rusqlite::Result<Vec<Flow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM fence_flows WHERE address = ?1 ORDER BY id DESC LIMIT ?2"
    ))?;
    stmt.query_map(rusqlite::params![address, i64::from(limit)], row)?
        .collect()
}

/// A flow's history, oldest first.
pub(crate) fn history_of(conn: &Connection, id: u64) -> rusqlite::Result<Vec<HistoryLine>> {
    let mut stmt = conn.prepare(
        "SELECT at_ms, state, event FROM fence_flow_history WHERE flow_id = ?1 ORDER BY seq",
    )?;
    stmt.query_map([id as i64], |r| {
        Ok(HistoryLine {
            at: from_unix_ms(r.get(0)?),
            state: r.get(1)?,
            event: r.get(2)?,
        })
    })?
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::store::KEPT_FINISHED_PER_MACHINE;
    use crate::k8s::release::SavedNodeMetadata;
    use crate::store::Store;

    #[test]
    fn a_flow_round_trips_with_its_saved_metadata_and_history() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("c.db")).unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut f = Flow::new("10.0.0.1", "S", "n1", Some("b".into()), true, now);
        f.id = s.with(|c| insert(c, &f, "started", now)).unwrap();
        assert!(
            s.with(|c| insert(c, &f, "again", now)).is_err(),
            "one unfinished flow per machine"
        );
        f.state = State::WaitReleased;
        f.how = Some(Release::DeleteNode(SavedNodeMetadata {
            name: "n1".into(),
            internal_ip: Some("10.0.0.1".into()),
            labels: [("zone".to_string(), "a".to_string())].into(),
            annotations: [("x".to_string(), "y".to_string())].into(),
        }));
        f.confirmed_off = Some(now);
        f.deadline = Some(now);
        f.power_attempt = 3;
        f.failure = Some("why".into());
        s.with(|c| update(c, &f, "released", now)).unwrap();
        assert_eq!(s.with(|c| load(c, f.id)).unwrap(), Some(f.clone()));
        assert_eq!(s.with(|c| unfinished(c)).unwrap(), vec![f.clone()]);
        f.state = State::Failed {
            detail: "bmc said no".into(),
        };
        s.with(|c| update(c, &f, "gave up", now)).unwrap();
        assert_eq!(s.with(|c| load(c, f.id)).unwrap(), Some(f.clone()));
        assert!(s.with(|c| unfinished(c)).unwrap().is_empty());
        let h = s.with(|c| history_of(c, f.id)).unwrap();
        let events: Vec<_> = h
            .iter()
            .map(|l| (l.state.as_str(), l.event.as_str()))
            .collect();
        assert_eq!(
            events,
            [
                ("plan", "started"),
                ("wait-released", "released"),
                ("failed", "gave up")
            ]
        );
        assert_eq!(s.with(|c| list(c, 10)).unwrap().len(), 1);
        assert_eq!(s.with(|c| list_for(c, "10.0.0.1", 10)).unwrap().len(), 1);
        assert!(s.with(|c| list_for(c, "10.0.0.2", 10)).unwrap().is_empty());
        // A finished flow no longer blocks a new one for the machine.
        s.with(|c| {
            insert(
                c,
                &Flow::new("10.0.0.1", "S", "n1", None, false, now),
                "new",
                now,
            )
        })
        .unwrap();
    }

    #[test]
    fn finished_flows_are_pruned_to_the_newest_per_machine_but_not_a_queued_entrys() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("c.db")).unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let fence = |addr: &str, state: State| {
            let mut f = Flow::new(addr, "S", "n", None, false, now);
            f.id = s.with(|c| insert(c, &f, "started", now)).unwrap();
            f.state = state;
            s.with(|c| update(c, &f, "ended", now)).unwrap();
            f.id
        };
        let keep = KEPT_FINISHED_PER_MACHINE as u64;
        // The first flow was started by entry 7, still queued; the second by entry 8, gone.
        let first = fence("10.0.0.1", State::Failed { detail: "x".into() });
        let second = fence("10.0.0.1", State::Done);
        s.with(|c| {
            c.execute_batch(&format!(
                "INSERT INTO repair_queue_entries (idx, address, machine_type, operation, status,
                     step_status, last_transition_ms, created_ms)
                 VALUES (7, '10.0.0.1', 't', 'op', 'failed', 'waiting', 0, 0);
                 INSERT INTO repair_fence_flows VALUES ('k7', 7, {first}, 0), ('k8', 8, {second}, 0);"
            ))
        })
        .unwrap();
        let other = fence("10.0.0.2", State::Done);
        for _ in 0..keep + 5 {
            fence("10.0.0.1", State::Done);
        }
        let ids: Vec<u64> = s
            .with(|c| list_for(c, "10.0.0.1", 1000))
            .unwrap()
            .iter()
            .map(|f| f.id)
            .collect();
        assert_eq!(
            ids.len() as u64,
            keep + 1,
            "the newest {keep} and entry 7's"
        );
        assert_eq!(ids.last(), Some(&first));
        assert!(!ids.contains(&second));
        assert!(s.with(|c| history_of(c, second)).unwrap().is_empty());
        let links: i64 = s
            .with(|c| c.query_row("SELECT count(*) FROM repair_fence_flows", [], |r| r.get(0)))
            .unwrap();
        assert_eq!(links, 1, "entry 8's link went with its flow");
        let history: i64 = s
            .with(|c| c.query_row("SELECT count(*) FROM fence_flow_history", [], |r| r.get(0)))
            .unwrap();
        assert_eq!(history as u64, 2 * (keep + 2));
        // Another machine's flows are its own; an unfinished flow is never pruned.
        assert_eq!(
            s.with(|c| load(c, other)).unwrap().map(|f| f.id),
            Some(other)
        );
        let f = Flow::new("10.0.0.1", "S", "n", None, false, now);
        let running = s.with(|c| insert(c, &f, "started", now)).unwrap();
        fence("10.0.0.3", State::Done);
        assert!(s.with(|c| load(c, running)).unwrap().is_some());
    }

    #[test]
    fn the_kdump_leg_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("c.db")).unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut f = Flow::new("10.0.0.1", "S", "n1", None, false, now);
        f.id = s.with(|c| insert(c, &f, "started", now)).unwrap();
        f.state = State::KdumpWait;
        f.kdump = Some(KdumpLeg {
            started: now,
            until: now + jiff::SignedDuration::from_secs(600),
            released: true,
        });
        s.with(|c| update(c, &f, "released on the dump", now))
            .unwrap();
        assert_eq!(s.with(|c| load(c, f.id)).unwrap(), Some(f.clone()));
        drop(s);
        let s = Store::open(&dir.path().join("c.db")).unwrap();
        assert_eq!(s.with(|c| unfinished(c)).unwrap(), vec![f]);
    }
}
