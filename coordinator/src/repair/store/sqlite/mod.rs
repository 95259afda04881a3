//! The repair queue on SQLite (migration 0002): [`RepairQueueStore`] for [`Sqlite`].
//!
//! Plain synchronous functions over a `rusqlite::Connection`, run on a blocking thread by
//! [`Sqlite::call`]. A batch of writes is one transaction.
//!
//! The repair area's other tables: [`groups`] (migration 0004) and [`diagnostics`] (0006).

pub(crate) mod diagnostics;
mod groups;

use std::collections::HashSet;

use jiff::Timestamp;
use protocol::admin::repair::{RepairHistoryRecord, RepairStatus, RepairStepStatus};
use rusqlite::{Connection, OptionalExtension, params};

use super::{RepairQueueStore, Write};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::repair::entry::{Entry, Phase};
use crate::store::{Sqlite, StoreError};

impl RepairQueueStore for Sqlite {
    async fn load(&self) -> Result<(bool, Vec<Entry>), StoreError> {
        self.call(|c| load(c)).await
    }

    async fn commit(&self, writes: Vec<Write>, now: Timestamp) -> Result<Vec<u64>, StoreError> {
        self.call(move |c| commit(c, &writes, now)).await
    }

    async fn history(&self, index: u64) -> Result<Vec<RepairHistoryRecord>, StoreError> {
        self.call(move |c| history(c, index)).await
    }

    async fn active_addresses(&self) -> Result<HashSet<String>, StoreError> {
        self.call(|c| active_addresses(c)).await
    }
}

fn ms(t: Timestamp) -> i64 {
    to_unix_ms(t)
}

fn opt_ms(t: Option<Timestamp>) -> i64 {
    t.map(ms).unwrap_or(0)
}

fn phase_cols(p: &Phase) -> (&'static str, i64, i64) {
    match p {
        Phase::Idle | Phase::SuccessCommand => (p.kind(), 0, 0),
        Phase::Command { attempt } => (p.kind(), i64::from(*attempt), 0),
        Phase::RetryWait { attempt, until } => (p.kind(), i64::from(*attempt), ms(*until)),
        Phase::Watching { since } => (p.kind(), 0, ms(*since)),
    }
}

fn phase_from(kind: &str, attempt: i64, time: i64) -> Phase {
    let attempt = u32::try_from(attempt).unwrap_or(0);
    match kind {
        "command" => Phase::Command { attempt },
        "retry-wait" => Phase::RetryWait {
            attempt,
            until: from_unix_ms(time),
        },
        "watching" => Phase::Watching {
            since: from_unix_ms(time),
        },
        "success-command" => Phase::SuccessCommand,
        _ => Phase::Idle,
    }
}

fn bad(what: &str, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("unknown {what} `{value}` in repair_queue_entries").into(),
    )
}

/// Addresses with a queued or processing entry not marked for deletion.
pub(crate) fn active_addresses(conn: &Connection) -> rusqlite::Result<HashSet<String>> {
    let mut st = conn.prepare(
        "SELECT DISTINCT address FROM repair_queue_entries \
         WHERE deleted = 0 AND status IN ('queued', 'processing')",
    )?;
    let rows = st.query_map([], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// Loads the enabled flag and every entry, by index.
pub(crate) fn load(conn: &Connection) -> rusqlite::Result<(bool, Vec<Entry>)> {
    let enabled: Option<String> = conn
        .query_row(
            "SELECT value FROM repair_queue_settings WHERE key = 'enabled'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let enabled = enabled.as_deref() != Some("0");
    let mut stmt = conn.prepare(
        "SELECT idx, address, nodename, serial, machine_type, operation, status, step, step_status,
                deleted, last_transition_ms, drain_backoff_count, drain_backoff_expire_ms,
                phase, phase_attempt, phase_time_ms, boot_id_before
         FROM repair_queue_entries ORDER BY idx",
    )?;
    let rows = stmt.query_map([], |r| {
        let status: String = r.get(6)?;
        let step_status: String = r.get(8)?;
        let phase: String = r.get(13)?;
        let expire: i64 = r.get(12)?;
        Ok(Entry {
            index: r.get::<_, i64>(0)? as u64,
            address: r.get(1)?,
            nodename: r.get(2)?,
            serial: r.get(3)?,
            machine_type: r.get(4)?,
            operation: r.get(5)?,
            status: RepairStatus::parse(&status).ok_or_else(|| bad("status", &status))?,
            step: r.get(7)?,
            step_status: RepairStepStatus::parse(&step_status)
                .ok_or_else(|| bad("step_status", &step_status))?,
            deleted: r.get(9)?,
            last_transition: from_unix_ms(r.get(10)?),
            drain_backoff_count: r.get(11)?,
            drain_backoff_expire: (expire != 0).then(|| from_unix_ms(expire)),
            phase: phase_from(&phase, r.get(14)?, r.get(15)?),
            boot_id_before: r.get(16)?,
        })
    })?;
    let entries = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((enabled, entries))
}

/// Commits `writes` in one transaction; returns the indexes of inserted entries, in order.
pub(crate) fn commit(
    conn: &mut Connection,
    writes: &[Write],
    now: Timestamp,
) -> rusqlite::Result<Vec<u64>> {
    let tx = conn.transaction()?;
    let inserted = commit_in(&tx, writes, now)?;
    tx.commit()?;
    Ok(inserted)
}

/// [`commit`]'s writes, inside the caller's transaction `tx`.
fn commit_in(tx: &Connection, writes: &[Write], now: Timestamp) -> rusqlite::Result<Vec<u64>> {
    let mut inserted = Vec::new();
    {
        let mut history = tx.prepare_cached(
            "INSERT INTO repair_queue_history
                 (entry_idx, at_ms, status, step, step_status, event, detail, output)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut add_history = |e: &Entry, ev: &crate::repair::entry::HistoryEvent| {
            history.execute(params![
                e.index as i64,
                ms(now),
                e.status.as_str(),
                e.step,
                e.step_status.as_str(),
                ev.event,
                ev.detail,
                ev.output
            ])
        };
        for w in writes {
            match w {
                Write::Insert(e, ev) => {
                    let (pk, pa, pt) = phase_cols(&e.phase);
                    tx.prepare_cached(
                        "INSERT INTO repair_queue_entries
                             (address, nodename, serial, machine_type, operation, status, step,
                              step_status, deleted, last_transition_ms, drain_backoff_count,
                              drain_backoff_expire_ms, phase, phase_attempt, phase_time_ms,
                              boot_id_before, created_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                    )?
                    .execute(params![
                        e.address,
                        e.nodename,
                        e.serial,
                        e.machine_type,
                        e.operation,
                        e.status.as_str(),
                        e.step,
                        e.step_status.as_str(),
                        e.deleted,
                        ms(e.last_transition),
                        e.drain_backoff_count,
                        opt_ms(e.drain_backoff_expire),
                        pk,
                        pa,
                        pt,
                        e.boot_id_before,
                        ms(now)
                    ])?;
                    let index = tx.last_insert_rowid() as u64;
                    let mut stored = e.clone();
                    stored.index = index;
                    add_history(&stored, ev)?;
                    inserted.push(index);
                }
                Write::Update(e, ev) => {
                    let (pk, pa, pt) = phase_cols(&e.phase);
                    tx.prepare_cached(
                        "UPDATE repair_queue_entries SET
                             nodename = ?2, status = ?3, step = ?4, step_status = ?5, deleted = ?6,
                             last_transition_ms = ?7, drain_backoff_count = ?8,
                             drain_backoff_expire_ms = ?9, phase = ?10, phase_attempt = ?11,
                             phase_time_ms = ?12, boot_id_before = ?13
                         WHERE idx = ?1",
                    )?
                    .execute(params![
                        e.index as i64,
                        e.nodename,
                        e.status.as_str(),
                        e.step,
                        e.step_status.as_str(),
                        e.deleted,
                        ms(e.last_transition),
                        e.drain_backoff_count,
                        opt_ms(e.drain_backoff_expire),
                        pk,
                        pa,
                        pt,
                        e.boot_id_before
                    ])?;
                    if let Some(ev) = ev {
                        add_history(e, ev)?;
                    }
                }
                Write::History(e, ev) => {
                    add_history(e, ev)?;
                }
                Write::Delete(index) => {
                    tx.prepare_cached("DELETE FROM repair_queue_entries WHERE idx = ?1")?
                        .execute(params![*index as i64])?;
                }
                Write::SetEnabled(on) => {
                    tx.prepare_cached(
                        "INSERT INTO repair_queue_settings (key, value) VALUES ('enabled', ?1)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    )?
                    .execute(params![if *on { "1" } else { "0" }])?;
                }
            }
        }
    }
    Ok(inserted)
}

/// An entry's history, oldest first.
pub(crate) fn history(conn: &Connection, index: u64) -> rusqlite::Result<Vec<RepairHistoryRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT at_ms, status, step, step_status, event, detail, output
         FROM repair_queue_history WHERE entry_idx = ?1 ORDER BY id",
    )?;
    let rows = stmt.query_map(params![index as i64], |r| {
        let status: String = r.get(1)?;
        let step_status: String = r.get(3)?;
        Ok(RepairHistoryRecord {
            at_unix_ms: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
            status: RepairStatus::parse(&status).ok_or_else(|| bad("status", &status))?,
            step: r.get(2)?,
            step_status: RepairStepStatus::parse(&step_status)
                .ok_or_else(|| bad("step_status", &step_status))?,
            event: r.get(4)?,
            detail: r.get(5)?,
            output: r.get(6)?,
        })
    })?;
    rows.collect()
}
