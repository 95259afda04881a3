//! The coordinator's only store: SQLite (bundled) in WAL mode, with versioned migrations.
//!
//! One connection, owned by the [`Store`] behind a mutex, used from blocking threads through
//! [`Store::call`]. SQLite serialises writers anyway and the coordinator's write rate is a few
//! hundred transactions a second at most, so one connection is simpler than a pool and never
//! sees `SQLITE_BUSY` from itself. Nothing here assumes the file is shared with another
//! process; a second coordinator on the same file is refused by an exclusive lock.
//!
//! Each area of the coordinator owns its tables and its migration file; this module only
//! opens, migrates and hands out the connection.

pub mod identity;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

/// Ordered migrations: `(version, name, sql)`. Append only; a released migration is never
/// edited. Versions are 1-based and contiguous.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "inventory",
        include_str!("migrations/0001_inventory.sql"),
    ),
    (
        2,
        "repair_queue",
        include_str!("migrations/0002_repair_queue.sql"),
    ),
    (
        3,
        "store_identity",
        include_str!("migrations/0003_store_identity.sql"),
    ),
];

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// Cause.
        source: rusqlite::Error,
    },
    /// The database was written by a newer coordinator.
    #[error(
        "database {path} is at schema version {found}, newer than this coordinator's {known}; upgrade the coordinator"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Version found.
        found: i64,
        /// Newest version known here.
        known: i64,
    },
    /// A blocking task panicked or was cancelled.
    #[error("database task failed: {0}")]
    Task(String),
}

impl StoreError {
    /// True for transient conditions (busy/locked database); false for corruption, schema
    /// and programming errors.
    pub fn is_retriable(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }
}

/// Handle to the database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    path: Arc<PathBuf>,
}

impl Store {
    /// Opens (creating if needed) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        // WAL: readers never block the writer and a crash loses no committed transaction.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        // FULL: every commit is fsynced before we act on it (invariant 6: transaction
        // before action), at a cost of one fsync per transaction.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        migrate(&mut conn, path)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::new(path.to_path_buf()),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the connection on the current thread. For use inside blocking code only.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Task("database mutex poisoned".into()))?;
        f(&mut conn).map_err(|source| StoreError::Sqlite {
            path: self.path.to_path_buf(),
            source,
        })
    }

    /// Runs `f` with the connection on a blocking thread.
    pub async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.with(f))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let err = |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let current: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(err)?;
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if current > known {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: current,
            known,
        });
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let tx = conn.transaction().map_err(err)?;
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(err)?;
        tx.commit().map_err(err)?;
        tracing::info!(version, name, "applied database migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_once_and_refuses_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Store::open(&db).unwrap();
        let v: i64 = s
            .with(|c| c.pragma_query_value(None, "user_version", |r| r.get(0)))
            .unwrap();
        assert_eq!(v, MIGRATIONS.last().unwrap().0);
        let mode: String = s
            .with(|c| c.pragma_query_value(None, "journal_mode", |r| r.get(0)))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(s);
        Store::open(&db).unwrap();
        let c = Connection::open(&db).unwrap();
        c.pragma_update(None, "user_version", 999).unwrap();
        drop(c);
        assert!(matches!(Store::open(&db), Err(StoreError::TooNew { .. })));
    }
}
