//! Diagnostics bundles kept with repair entries: the SQLite table of migration 0006, and
//! the [`DiagnosticsShelf`] an `@collect-diagnostics` step stores through.
//!
//! Bundles are bounded by the agent (256 KiB by default); the coordinator keeps the newest
//! [`KEPT_PER_MACHINE`] per machine, so a machine repaired again and again cannot fill
//! the disk. This module does not ask agents for anything ([`crate::agent_link`] does).

use std::sync::Arc;

use protocol::actions::DiagnosticsBundle;
use protocol::admin::diagnostics::{DiagnosticsRecord, DiagnosticsSummary};
use rusqlite::{Connection, OptionalExtension, params};

use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// Bundles kept per machine: enough to compare the last few repairs of a flaky machine,
/// at most ~5 MiB per machine with the agent's default limit.
pub const KEPT_PER_MACHINE: i64 = 20;

/// Where an entry's diagnostics are stored.
#[derive(Clone)]
pub struct DiagnosticsShelf {
    store: Store,
    clock: Arc<dyn Clock>,
    entry: u64,
}

impl std::fmt::Debug for DiagnosticsShelf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiagnosticsShelf")
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl DiagnosticsShelf {
    /// A shelf for entry `entry`.
    pub fn new(store: Store, clock: Arc<dyn Clock>, entry: u64) -> Self {
        Self {
            store,
            clock,
            entry,
        }
    }

    /// Stores `bundle` from the agent of `address` under request `request_id` (replacing
    /// the row of a resend) and returns its id.
    pub async fn keep(
        &self,
        address: &str,
        request_id: &str,
        bundle: &DiagnosticsBundle,
    ) -> Result<u64, StoreError> {
        let row = (
            self.entry,
            address.to_string(),
            request_id.to_string(),
            self.clock.now().as_millisecond(),
            bundle.total_bytes() as i64,
            bundle
                .parts
                .iter()
                .filter(|p| p.truncated)
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            bundle.render(),
        );
        self.store.call(move |c| insert(c, row)).await
    }
}

type Row = (u64, String, String, i64, i64, String, String);

fn insert(c: &mut Connection, r: Row) -> rusqlite::Result<u64> {
    let tx = c.transaction()?;
    let id: i64 = tx.query_row(
        "INSERT INTO repair_diagnostics
             (entry_idx, address, request_id, collected_ms, bytes, truncated_parts, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (request_id) DO UPDATE SET
             collected_ms = excluded.collected_ms, bytes = excluded.bytes,
             truncated_parts = excluded.truncated_parts, content = excluded.content
         RETURNING id",
        params![r.0 as i64, r.1, r.2, r.3, r.4, r.5, r.6],
        |row| row.get(0),
    )?;
    tx.execute(
        "DELETE FROM repair_diagnostics WHERE address = ?1 AND id NOT IN
             (SELECT id FROM repair_diagnostics WHERE address = ?1 ORDER BY id DESC LIMIT ?2)",
        params![r.1, KEPT_PER_MACHINE],
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

/// The bundles of `address`, newest first.
pub fn list(c: &Connection, address: &str) -> rusqlite::Result<Vec<DiagnosticsSummary>> {
    let mut st = c.prepare(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM repair_diagnostics WHERE address = ?1 ORDER BY id DESC"
    ))?;
    st.query_map([address], summary)?.collect()
}

/// The bundles of entry `index`, oldest first.
pub fn for_entry(c: &Connection, index: u64) -> rusqlite::Result<Vec<DiagnosticsSummary>> {
    let mut st = c.prepare(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM repair_diagnostics WHERE entry_idx = ?1 ORDER BY id"
    ))?;
    st.query_map([index as i64], summary)?.collect()
}

/// Bundle `id` of `address`, or the newest of `address`.
pub fn get(
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

#[cfg(test)]
mod tests {
    use protocol::actions::DiagnosticsPart;

    use super::*;
    use crate::clock::SystemClock;

    fn bundle(text: &str, truncated: bool) -> DiagnosticsBundle {
        DiagnosticsBundle {
            parts: vec![DiagnosticsPart {
                name: "journal kubelet".into(),
                content: text.into(),
                truncated,
            }],
            limit_bytes: 1024,
        }
    }

    #[tokio::test]
    async fn kept_listed_replaced_on_resend_and_bounded_per_machine() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let shelf = DiagnosticsShelf::new(store.clone(), Arc::new(SystemClock), 7);
        let a = shelf
            .keep("10.0.0.1", "r1", &bundle("one", true))
            .await
            .unwrap();
        let again = shelf
            .keep("10.0.0.1", "r1", &bundle("uno", false))
            .await
            .unwrap();
        assert_eq!(a, again, "a resend replaces its row");
        let listed = store.with(|c| list(c, "10.0.0.1")).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].entry_index, 7);
        assert_eq!(listed[0].bytes, 3);
        let got = store.with(|c| get(c, "10.0.0.1", None)).unwrap().unwrap();
        assert!(got.content.contains("uno"), "{}", got.content);
        for i in 0..(KEPT_PER_MACHINE + 5) {
            shelf
                .keep("10.0.0.1", &format!("m{i}"), &bundle("x", true))
                .await
                .unwrap();
        }
        let listed = store.with(|c| list(c, "10.0.0.1")).unwrap();
        assert_eq!(listed.len() as i64, KEPT_PER_MACHINE);
        assert_eq!(listed[0].truncated_parts, ["journal kubelet"]);
        assert!(
            store
                .with(|c| get(c, "10.0.0.1", Some(a)))
                .unwrap()
                .is_none()
        );
        assert!(store.with(|c| get(c, "10.0.0.2", None)).unwrap().is_none());
        assert_eq!(
            store.with(|c| for_entry(c, 7)).unwrap().len() as i64,
            KEPT_PER_MACHINE
        );
    }
}
