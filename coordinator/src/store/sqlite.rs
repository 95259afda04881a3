//! The SQLite backend: one connection in WAL mode, with versioned migrations.
//!
//! One connection, owned by the [`Sqlite`] handle behind a mutex, used from blocking threads
//! through [`Sqlite::call`]. SQLite serialises writers anyway and the coordinator's write
//! rate is a few hundred transactions a second at most, so one connection is simpler than a
//! pool and never sees `SQLITE_BUSY` from itself. Nothing here assumes the file is shared
//! with another process; a second coordinator on the same file is refused by an exclusive
//! lock ([`super::lock`]).
//!
//! This module only opens, migrates and hands out the connection, and keeps count of the
//! store's own failures ([`StoreHealth`]). Each area of the coordinator owns its tables, its
//! SQL (in the area's `store/sqlite.rs` or `sql.rs`) and its migration file here.
//!
//! [`Sqlite::open_exclusive`] is how a coordinator opens its store: the exclusive lock
//! first, then proof that the files can be written, then the database. [`Sqlite::open`]
//! alone takes no lock (tests, tools reading a copy).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use super::lock::{self, StoreLock};
use super::{StoreError, StoreHealth};

/// Ordered migrations: `(version, name, sql)`. Append only; a released migration is never
/// edited. Versions are 1-based and ascending (areas reserve their numbers).
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
    (
        4,
        "command_groups",
        include_str!("migrations/0004_command_groups.sql"),
    ),
    (
        5,
        "remediation",
        include_str!("migrations/0005_remediation.sql"),
    ),
    (
        6,
        "diagnostics",
        include_str!("migrations/0006_diagnostics.sql"),
    ),
    (
        7,
        "fence_flows",
        include_str!("migrations/0007_fence_flows.sql"),
    ),
    (
        8,
        "repair_fence_flows",
        include_str!("migrations/0008_repair_fence_flows.sql"),
    ),
    (9, "kdump", include_str!("migrations/0009_kdump.sql")),
    (
        10,
        "remediation_entries",
        include_str!("migrations/0010_remediation_entries.sql"),
    ),
    (11, "boot_ids", include_str!("migrations/0011_boot_ids.sql")),
    (
        12,
        "store_epoch",
        include_str!("migrations/0012_store_epoch.sql"),
    ),
];

/// True when `e` says the store itself failed (cannot write, disk full, I/O error, locked,
/// corrupt) rather than a statement being wrong. A trigger that aborts a write counts too:
/// the coordinator's schema has none, so one that fires is someone freezing the store.
pub fn is_storage_failure(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    let Some(f) = e.sqlite_error() else {
        return false;
    };
    match f.code {
        C::ReadOnly
        | C::DiskFull
        | C::SystemIoFailure
        | C::CannotOpen
        | C::DatabaseCorrupt
        | C::NotADatabase
        | C::PermissionDenied
        | C::DatabaseBusy
        | C::DatabaseLocked
        | C::FileLockingProtocolFailed
        | C::OutOfMemory => true,
        C::ConstraintViolation => f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_TRIGGER,
        _ => false,
    }
}

/// The size (bytes) the -wal file is cut back to after a checkpoint. SQLite checkpoints at
/// 1000 pages (4 MiB), so the steady file stays near that; 8 MiB leaves room for a burst.
const WAL_SIZE_LIMIT: i64 = 8 * 1024 * 1024;

/// Handle to the SQLite database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sqlite {
    conn: Arc<Mutex<Connection>>,
    path: Arc<PathBuf>,
    health: Arc<StoreHealth>,
    /// Held for as long as any handle lives (the process, for a coordinator).
    _lock: Option<Arc<StoreLock>>,
}

impl Sqlite {
    /// How a coordinator opens its store: takes the exclusive lock, checks that the
    /// database and its directory can be written, then opens and migrates it. Refuses a
    /// store another process holds, a missing directory and anything read-only.
    pub fn open_exclusive(path: &Path) -> Result<Self, StoreError> {
        let lock = StoreLock::acquire(path, true)?;
        lock::check_writable(path)?;
        let mut store = Self::open(path)?;
        let readonly = store.with(|c| c.is_readonly(rusqlite::MAIN_DB))?;
        if readonly {
            return Err(StoreError::NotWritable {
                path: path.to_path_buf(),
                reason: "SQLite could only open it read-only".into(),
            });
        }
        store._lock = Some(Arc::new(lock));
        Ok(store)
    }

    /// The store's failure count and state.
    pub fn health(&self) -> &StoreHealth {
        &self.health
    }

    /// Opens (creating if needed) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        // Before anything is written (WAL mode changes the file's header).
        let version = check_ours(&conn, path)?;
        // WAL: readers never block the writer and a crash loses no committed transaction.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        // FULL: every commit is fsynced before we act on it (invariant 6: transaction
        // before action), at a cost of one fsync per transaction.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        // A checkpoint leaves the -wal file at its largest size so far; one large
        // transaction (a migration, a prune of many rows, a restored backup's first writes)
        // would keep that much disk until the coordinator stops. With a limit, the file is
        // cut back to it when the log next restarts from its beginning.
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)
            .map_err(err)?;
        migrate(&mut conn, path, version)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::new(path.to_path_buf()),
            health: Arc::default(),
            _lock: None,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the connection on the current thread. For use inside blocking code only.
    /// Storage failures are counted in [`Sqlite::health`]; a call that commits a change
    /// marks the store healthy again.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Task("database mutex poisoned".into()))?;
        let before = conn.total_changes();
        match f(&mut conn) {
            Ok(v) => {
                if conn.total_changes() != before && conn.is_autocommit() {
                    self.health.wrote();
                }
                Ok(v)
            }
            Err(source) => {
                if is_storage_failure(&source) {
                    self.health
                        .failed(super::health::explain(&source, &self.path));
                }
                Err(StoreError::Sqlite {
                    path: self.path.to_path_buf(),
                    source,
                })
            }
        }
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

/// Refuses a file that is not a Fleetmend store this coordinator can open: one that is not
/// SQLite at all, one with another program's tables (no schema version, yet objects), or
/// one of a newer schema. A new, empty file is ours. Returns its schema version.
pub(crate) fn check_ours(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let err = |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(err)?;
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if version > known {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: version,
            known,
        });
    }
    if version == 0 {
        let objects: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(err)?;
        if objects > 0 {
            return Err(StoreError::NotOurs {
                path: path.to_path_buf(),
                objects,
            });
        }
    }
    Ok(version)
}

/// Applies the migrations past `current`, the version [`check_ours`] read.
fn migrate(conn: &mut Connection, path: &Path, current: i64) -> Result<(), StoreError> {
    let err = |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
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
    fn the_wal_is_cut_back_after_a_large_transaction_is_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Sqlite::open(&db).unwrap();
        let wal = || {
            std::fs::metadata(dir.path().join("c.db-wal"))
                .unwrap()
                .len()
        };
        s.with(|c| {
            c.execute_batch(
                "CREATE TABLE big (b BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 6000)
                 INSERT INTO big SELECT randomblob(2000) FROM n;",
            )
        })
        .unwrap();
        assert!(wal() > WAL_SIZE_LIMIT as u64, "{}", wal());
        s.with(|c| {
            c.execute_batch("PRAGMA wal_checkpoint(PASSIVE); DELETE FROM big WHERE rowid = 1;")
        })
        .unwrap();
        assert!(
            wal() <= WAL_SIZE_LIMIT as u64,
            "-wal kept at {} bytes",
            wal()
        );
    }

    #[test]
    fn migrates_once_and_refuses_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Sqlite::open(&db).unwrap();
        let v: i64 = s
            .with(|c| c.pragma_query_value(None, "user_version", |r| r.get(0)))
            .unwrap();
        assert_eq!(v, MIGRATIONS.last().unwrap().0);
        let mode: String = s
            .with(|c| c.pragma_query_value(None, "journal_mode", |r| r.get(0)))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(s);
        Sqlite::open(&db).unwrap();
        let c = Connection::open(&db).unwrap();
        c.pragma_update(None, "user_version", 999).unwrap();
        drop(c);
        assert!(matches!(Sqlite::open(&db), Err(StoreError::TooNew { .. })));
    }

    /// A store an older coordinator wrote (schema 9, before remediation_entries and boot
    /// ids) opens in this one: its rows are kept and the new migrations fill what they can.
    #[test]
    fn a_store_of_an_older_coordinator_is_migrated_with_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("old.db");
        let mut c = Connection::open(&db).unwrap();
        let old = MIGRATIONS.iter().position(|m| m.0 == 9).unwrap();
        for (version, _, sql) in &MIGRATIONS[..=old] {
            let tx = c.transaction().unwrap();
            tx.execute_batch(sql).unwrap();
            tx.pragma_update(None, "user_version", version).unwrap();
            tx.commit().unwrap();
        }
        c.execute_batch(
            "INSERT INTO machines (address, hostname, machine_type, source, state,
                 state_since_ms, created_ms, updated_ms)
             VALUES ('10.0.1.11', 'lab-1', 'lab', 'inventory', 'healthy', 1, 1, 1);
             INSERT INTO remediation_journal (seq, first_ms, last_ms, count, address, domain,
                 outcome, rule, sentence, decision)
             VALUES (1, 5, 5, 1, '10.0.1.11', 'machine', 'admitted', 'r',
                 'power-cycle admitted (repair queue entry 7)', '{}');",
        )
        .unwrap();
        drop(c);
        let s = Sqlite::open(&db).unwrap();
        let (v, host, boot, entry): (i64, String, Option<String>, i64) = s
            .with(|c| {
                c.query_row(
                    "SELECT (SELECT user_version FROM pragma_user_version), hostname, boot_id,
                        (SELECT entry_idx FROM remediation_entries)
                     FROM machines",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
            })
            .unwrap();
        assert_eq!(v, MIGRATIONS.last().unwrap().0);
        assert_eq!((host.as_str(), boot, entry), ("lab-1", None, 7));
    }

    #[test]
    fn another_programs_database_or_garbage_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.db");
        let c = Connection::open(&other).unwrap();
        c.execute_batch("CREATE TABLE users(id INTEGER)").unwrap();
        drop(c);
        let before = std::fs::read(&other).unwrap();
        let err = Sqlite::open_exclusive(&other).unwrap_err();
        assert!(
            matches!(err, StoreError::NotOurs { objects: 1, .. }),
            "{err:?}"
        );
        assert!(err.is_config(), "a person must fix the path: exit 64");
        assert!(err.to_string().contains("not a Fleetmend store"), "{err}");
        assert_eq!(std::fs::read(&other).unwrap(), before, "nothing written");
        assert!(!dir.path().join("other.db-wal").exists());

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a; 5000]).unwrap();
        let err = Sqlite::open_exclusive(&garbage).unwrap_err();
        assert!(err.is_config(), "{err:?}");
        assert!(err.to_string().contains("not a database"), "{err}");

        let newer = dir.path().join("newer.db");
        drop(Sqlite::open(&newer).unwrap());
        let c = Connection::open(&newer).unwrap();
        c.pragma_update(None, "user_version", 999).unwrap();
        drop(c);
        let err = Sqlite::open_exclusive(&newer).unwrap_err();
        assert!(
            matches!(err, StoreError::TooNew { found: 999, .. }),
            "{err:?}"
        );
        assert!(err.is_config(), "{err:?}");
        // And a new file is created as a store.
        Sqlite::open_exclusive(&dir.path().join("new.db")).unwrap();
    }

    #[test]
    fn failing_writes_mark_the_store_failing_until_a_write_commits() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Sqlite::open_exclusive(&db).unwrap();
        let write = |s: &Sqlite| {
            s.with(|c| {
                c.execute(
                    "INSERT INTO repair_queue_settings (key, value) VALUES ('probe', '1')
                     ON CONFLICT (key) DO UPDATE SET value = value + 1",
                    [],
                )
            })
        };
        write(&s).unwrap();
        assert_eq!((s.health().failures(), s.health().failing()), (0, None));
        // Another process freezes the store: its writes abort from now on.
        let other = Connection::open(&db).unwrap();
        other
            .execute_batch(
                "CREATE TRIGGER freeze BEFORE UPDATE ON repair_queue_settings
                 BEGIN SELECT RAISE(ABORT, 'frozen'); END;",
            )
            .unwrap();
        assert!(write(&s).is_err());
        assert_eq!(s.health().failures(), 1);
        assert!(s.health().failing().unwrap().contains("frozen"));
        // A read that works says nothing about writes.
        s.with(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
            .unwrap();
        assert!(s.health().failing().is_some());
        // A statement that is merely wrong is not a store failure.
        assert!(
            s.with(|c| c.execute("INSERT INTO nowhere VALUES (1)", []))
                .is_err()
        );
        assert_eq!(s.health().failures(), 1);
        other.execute_batch("DROP TRIGGER freeze").unwrap();
        write(&s).unwrap();
        assert_eq!(s.health().failing(), None);
    }

    #[test]
    fn exclusive_open_refuses_a_second_holder_and_read_only_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Sqlite::open_exclusive(&db).unwrap();
        let err = Sqlite::open_exclusive(&db).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(err.is_retriable() && !err.is_config());
        drop(s);
        let err = Sqlite::open_exclusive(Path::new("/proc/fleetmend.db")).unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("/proc"), "{err}");
    }
}
