//! Diagnostics bundles on SQLite (migration 0006): [`DiagnosticsStore`] for [`Sqlite`].

use protocol::admin::diagnostics::{DiagnosticsRecord, DiagnosticsSummary};
use rusqlite::{Connection, OptionalExtension, params};

use crate::repair::store::diagnostics::{DiagnosticsStore, KEPT_PER_MACHINE, NewBundle};
use crate::store::{Sqlite, StoreError};

impl DiagnosticsStore for Sqlite {
    async fn keep_bundle(&self, bundle: NewBundle) -> Result<u64, StoreError> {
        self.call(move |c| insert(c, bundle)).await
    }

    async fn bundles_of(&self, address: String) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        self.call(move |c| list(c, &address)).await
    }

    async fn bundles_for_entry(&self, index: u64) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        self.call(move |c| for_entry(c, index)).await
    }

    async fn bundle(
        &self,
        address: String,
        id: Option<u64>,
    ) -> Result<Option<DiagnosticsRecord>, StoreError> {
        self.call(move |c| get(c, &address, id)).await
    }
}

fn insert(c: &mut Connection, b: NewBundle) -> rusqlite::Result<u64> {
    let tx = c.transaction()?;
    let id: i64 = tx.query_row(
        "INSERT INTO repair_diagnostics
             (entry_idx, address, request_id, collected_ms, bytes, truncated_parts, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (request_id) DO UPDATE SET
             collected_ms = excluded.collected_ms, bytes = excluded.bytes,
             truncated_parts = excluded.truncated_parts, content = excluded.content
         RETURNING id",
        params![
            b.entry as i64,
            b.address,
            b.request_id,
            b.collected_ms,
            b.bytes,
            b.truncated_parts,
            b.content
        ],
        |row| row.get(0),
    )?;
    tx.execute(
        "DELETE FROM repair_diagnostics WHERE address = ?1 AND id NOT IN
             (SELECT id FROM repair_diagnostics WHERE address = ?1 ORDER BY id DESC LIMIT ?2)",
        params![b.address, KEPT_PER_MACHINE],
    )?;
    tx.commit()?;
    Ok(id as u64)
}

const SUMMARY_COLUMNS: &str = "id, address, entry_idx, collected_ms, bytes, truncated_parts";

fn summary(row: &rusqlite::Row<'_>) -> rusqlite::Result<DiagnosticsSummary> {
    let truncated: String = row.get(5)?;
    Ok(DiagnosticsSummary {
        id: row.get::<_, i64>(0)? as u64,
        address: row.get(1)?,
        entry_index: row.get::<_, i64>(2)? as u64,
        collected_unix_ms: row.get(3)?,
        bytes: row.get::<_, i64>(4)? as u64,
        truncated_parts: truncated
            .split('\n')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

fn list(c: &Connection, address: &str) -> rusqlite::Result<Vec<DiagnosticsSummary>> {
    let mut st = c.prepare(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM repair_diagnostics WHERE address = ?1 ORDER BY id DESC"
    ))?;
    st.query_map([address], summary)?.collect()
}

pub(crate) fn for_entry(c: &Connection, index: u64) -> rusqlite::Result<Vec<DiagnosticsSummary>> {
    let mut st = c.prepare(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM repair_diagnostics WHERE entry_idx = ?1 ORDER BY id"
    ))?;
    st.query_map([index as i64], summary)?.collect()
}

fn get(
    c: &Connection,
    address: &str,
    id: Option<u64>,
) -> rusqlite::Result<Option<DiagnosticsRecord>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, content FROM repair_diagnostics WHERE address = ?1 AND (?2 IS NULL OR id = ?2) ORDER BY id DESC LIMIT 1"
    );
    c.query_row(&sql, params![address, id.map(|i| i as i64)], |row| {
        Ok(DiagnosticsRecord {
            summary: summary(row)?,
            content: row.get(6)?,
        })
    })
    .optional()
}
