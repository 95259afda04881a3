//! Command process groups on SQLite (migration 0004): [`CommandGroupStore`] for [`Sqlite`].

use jiff::Timestamp;
use rusqlite::params;

use crate::clock::to_unix_ms;
use crate::repair::store::Write;
use crate::repair::store::groups::{CommandGroupStore, GroupRecord};
use crate::store::{Sqlite, StoreError};

impl CommandGroupStore for Sqlite {
    async fn record_group(&self, rec: GroupRecord, now: Timestamp) -> Result<(), StoreError> {
        let now = to_unix_ms(now);
        self.call(move |c| {
            without_fsync(c, |c| {
                c.execute(
                    "INSERT OR REPLACE INTO repair_command_groups
                     (pgid, entry_idx, leader_start, session_id, boot_id, command, started_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        rec.pgid,
                        rec.entry as i64,
                        rec.leader_start as i64,
                        rec.session,
                        rec.boot_id,
                        rec.command,
                        now
                    ],
                )
            })
        })
        .await
        .map(drop)
    }

    fn forget_group(&self, pgid: u32) -> Result<(), StoreError> {
        self.with(|c| {
            without_fsync(c, |c| {
                c.execute(
                    "DELETE FROM repair_command_groups WHERE pgid = ?1",
                    params![pgid],
                )
            })
        })
        .map(drop)
    }

    async fn groups(&self) -> Result<Vec<GroupRecord>, StoreError> {
        self.call(|c| load(c)).await
    }

    async fn reaped(&self, history: Vec<Write>, now: Timestamp) -> Result<(), StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            super::commit_in(&tx, &history, now)?;
            tx.execute("DELETE FROM repair_command_groups", [])?;
            tx.commit()
        })
        .await
    }
}

/// Runs `f` (one autocommit statement) with `synchronous = NORMAL`, then restores the
/// store's `FULL`.
///
/// Why: a group record only has to outlive the coordinator *process* (SIGKILL, panic), and in
/// WAL mode a commit without fsync already does; a crash of the *machine* kills the commands as
/// well and changes the boot id, which the reaper checks, so a record lost with it is never
/// needed. Two fsyncs per command (record and forget) would otherwise cost the queue about
/// two thirds of its throughput when many short commands run (see docs/benchmarks.md).
fn without_fsync<T>(
    c: &rusqlite::Connection,
    f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    c.pragma_update(None, "synchronous", "NORMAL")?;
    let r = f(c);
    let restored = c.pragma_update(None, "synchronous", "FULL");
    let v = r?;
    restored?;
    Ok(v)
}

fn load(c: &rusqlite::Connection) -> rusqlite::Result<Vec<GroupRecord>> {
    let mut stmt = c.prepare(
        "SELECT pgid, entry_idx, leader_start, session_id, boot_id, command
         FROM repair_command_groups ORDER BY pgid",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(GroupRecord {
            pgid: r.get(0)?,
            entry: r.get::<_, i64>(1)? as u64,
            leader_start: r.get::<_, i64>(2)? as u64,
            session: r.get(3)?,
            boot_id: r.get(4)?,
            command: r.get(5)?,
        })
    })?;
    rows.collect()
}
