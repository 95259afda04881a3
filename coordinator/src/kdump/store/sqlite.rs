//! Kdump notices on SQLite: the `kdump_status` table (migration 0009), one row per machine,
//! replaced by each notice; [`KdumpStore`] for [`Sqlite`].

use std::collections::BTreeMap;

use jiff::Timestamp;
use protocol::messages::KdumpPhase;
use rusqlite::{Connection, params};

use super::KdumpStore;
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::kdump::KdumpRecord;
use crate::store::{Sqlite, StoreError};

impl KdumpStore for Sqlite {
    async fn save_notice(
        &self,
        address: String,
        record: KdumpRecord,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.call(move |c| upsert(c, &address, &record, now)).await
    }

    async fn notices(&self) -> Result<BTreeMap<String, KdumpRecord>, StoreError> {
        self.call(load).await
    }
}

fn opt_ms(t: Option<Timestamp>) -> i64 {
    t.map(to_unix_ms).unwrap_or(0)
}

fn ms_opt(ms: i64) -> Option<Timestamp> {
    (ms != 0).then(|| from_unix_ms(ms))
}

/// Replaces the machine's row with `r`.
fn upsert(
    c: &mut Connection,
    address: &str,
    r: &KdumpRecord,
    now: Timestamp,
) -> rusqlite::Result<()> {
    c.execute(
        "INSERT OR REPLACE INTO kdump_status (address, phase, dump_started_ms, dump_done_ms,
             boot_id, node_time_ms, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            address,
            r.phase.as_str(),
            opt_ms(r.started),
            opt_ms(r.done),
            r.boot_id,
            to_unix_ms(r.node_time),
            to_unix_ms(now),
        ],
    )?;
    Ok(())
}

/// Every machine's last notice.
fn load(c: &mut Connection) -> rusqlite::Result<BTreeMap<String, KdumpRecord>> {
    let mut st = c.prepare(
        "SELECT address, phase, dump_started_ms, dump_done_ms, boot_id, node_time_ms
         FROM kdump_status",
    )?;
    let rows = st.query_map([], |row| {
        let phase: String = row.get(1)?;
        let phase = phase.parse::<KdumpPhase>().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, e.into())
        })?;
        Ok((
            row.get::<_, String>(0)?,
            KdumpRecord {
                phase,
                started: ms_opt(row.get(2)?),
                done: ms_opt(row.get(3)?),
                boot_id: row.get(4)?,
                node_time: from_unix_ms(row.get(5)?),
            },
        ))
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn a_notice_survives_a_reopen_and_the_next_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let start = KdumpRecord {
            phase: KdumpPhase::Start,
            started: Some(t),
            done: None,
            boot_id: Some("b1".into()),
            node_time: t,
        };
        Store::open(&db)
            .unwrap()
            .with(|c| upsert(c, "10.0.0.1", &start, t))
            .unwrap();
        let got = Store::open(&db).unwrap().with(load).unwrap();
        assert_eq!(got.get("10.0.0.1"), Some(&start));
        let done = KdumpRecord {
            phase: KdumpPhase::Done,
            done: Some(t),
            boot_id: None,
            ..start
        };
        let s = Store::open(&db).unwrap();
        s.with(|c| upsert(c, "10.0.0.1", &done, t)).unwrap();
        let got = s.with(load).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got.get("10.0.0.1"), Some(&done));
    }
}
