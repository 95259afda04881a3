//! `coordinator backup` and `coordinator restore`: a consistent copy of the store, taken
//! while the coordinator runs, and putting one back under a new identity.
//!
//! Why restore changes the identity: power request ids are `<store id>-repair-<index>-…` and
//! `<store id>-fence-<flow>-…`, and a gateway executes each id at most once, answering a
//! repeat with the first result. A backup does not know the entries and fence flows created
//! after it was taken; restored as it was, the store would number new ones from the same
//! indexes again, and a gateway that saw the lost ones would answer "done" for a power-off it
//! never made (for a fence, a workload released while its machine still runs). Under a new
//! identity every request is new to every gateway; a power step the backup shows in flight
//! is sent again, which powering off or on tolerates.
//!
//! Both work on the database file only, without the configuration's other parts, and must
//! run as the database's owner (the service user): SQLite creates `-wal` and `-shm` files
//! beside the database, and files created by root would lock the service out of its store.
//! Nothing is deleted: restore keeps the database it replaces beside it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde::Serialize;

use super::lock::StoreLock;
use super::{Sqlite, StoreError, identity};

/// Why a backup or a restore was not made.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file named on the command line is missing, in the way, or not a store.
    #[error("{0}")]
    BadInput(String),
    /// Run as a user other than the database's owner.
    #[error(
        "{path} belongs to uid {owner}, and this runs as uid {me}: run as its owner (for the package: `runuser -u fleetmend -- coordinator …`), so that SQLite's -wal and -shm files stay the service's"
    )]
    NotOwner {
        /// The database or its directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// The store failed (or is locked by a running coordinator).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl BackupError {
    /// True when the operator's input is at fault (exit 64).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Self::BadInput(_) | Self::NotOwner { .. } => true,
            // A backup of a newer schema, or not a store: the file is wrong, not the host.
            Self::Store(e @ (StoreError::TooNew { .. } | StoreError::NotOurs { .. })) => {
                e.is_config()
            }
            _ => false,
        }
    }
}

/// What a store holds, for the operator to recognise a backup by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreSummary {
    /// The store's identity.
    pub store_id: String,
    /// Its schema version.
    pub schema_version: i64,
    /// Repair queue entries, deleted ones included.
    pub repair_entries: u64,
    /// The newest entry's index.
    pub newest_entry: Option<u64>,
    /// Fence flows.
    pub fence_flows: u64,
}

/// The outcome of [`backup`].
#[derive(Debug, Clone, Serialize)]
pub struct BackupReport {
    /// The copy.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// What it holds.
    pub store: StoreSummary,
}

/// The outcome of [`restore`].
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The database now in place.
    pub database: PathBuf,
    /// The backup it came from.
    pub from: PathBuf,
    /// The identity the backup had.
    pub backup_store_id: String,
    /// What the restored store holds, with its new identity.
    pub store: StoreSummary,
    /// Where the replaced database was kept, if there was one.
    pub replaced_kept_at: Option<PathBuf>,
}

impl std::fmt::Display for StoreSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |n: u64| if n == 1 { "" } else { "s" };
        write!(
            f,
            "store {} (schema {}): {} repair entr{}{}, {} fence flow{}",
            self.store_id,
            self.schema_version,
            self.repair_entries,
            if self.repair_entries == 1 { "y" } else { "ies" },
            self.newest_entry
                .map(|n| format!(" (newest #{n})"))
                .unwrap_or_default(),
            self.fence_flows,
            s(self.fence_flows)
        )
    }
}

impl std::fmt::Display for BackupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "backed up to {} ({} bytes): {}",
            self.path.display(),
            self.bytes,
            self.store
        )
    }
}

impl std::fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "restored {} from {}: {}",
            self.database.display(),
            self.from.display(),
            self.store
        )?;
        writeln!(
            f,
            "new store identity {} (the backup's was {}): gateways take every power request as new; a power step in flight in the backup is sent again",
            self.store.store_id, self.backup_store_id
        )?;
        match &self.replaced_kept_at {
            Some(p) => write!(f, "the database it replaced is kept at {}", p.display()),
            None => write!(f, "there was no database to replace"),
        }
    }
}

fn sqlite(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

/// Moves `database` to `<database>.replaced-<now>` (`-2`, `-3`, … when that exists: a kept
/// store is never overwritten). A hard link then an unlink, so an existing name is refused
/// rather than replaced, as `rename` would.
fn move_aside(database: &Path, now_unix_s: u64) -> Result<PathBuf, BackupError> {
    for n in 1..100 {
        let mut name = database.as_os_str().to_os_string();
        name.push(format!(".replaced-{now_unix_s}"));
        if n > 1 {
            name.push(format!("-{n}"));
        }
        let aside = PathBuf::from(name);
        match std::fs::hard_link(database, &aside) {
            Ok(()) => {
                std::fs::remove_file(database).map_err(|e| {
                    BackupError::BadInput(format!("cannot remove {}: {e}", database.display()))
                })?;
                return Ok(aside);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(BackupError::BadInput(format!(
                    "cannot keep {} as {}: {e}",
                    database.display(),
                    aside.display()
                )));
            }
        }
    }
    Err(BackupError::BadInput(format!(
        "{}: too many kept stores named .replaced-{now_unix_s}",
        database.display()
    )))
}

/// Refuses to run as anyone but the owner of `path`.
fn check_owner(path: &Path) -> Result<(), BackupError> {
    let owner = std::fs::metadata(path)
        .map_err(|e| BackupError::BadInput(format!("{}: {e}", path.display())))?
        .uid();
    let me = nix::unistd::geteuid().as_raw();
    if owner != me {
        return Err(BackupError::NotOwner {
            path: path.to_path_buf(),
            owner,
            me,
        });
    }
    Ok(())
}

fn summary(c: &Connection) -> rusqlite::Result<StoreSummary> {
    let (repair_entries, newest): (i64, Option<i64>) = c.query_row(
        "SELECT count(*), max(idx) FROM repair_queue_entries",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let fence_flows: i64 = c
        .query_row("SELECT count(*) FROM fence_flows", [], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    Ok(StoreSummary {
        store_id: identity::read(c)?,
        schema_version: c.pragma_query_value(None, "user_version", |r| r.get(0))?,
        repair_entries: repair_entries.max(0) as u64,
        newest_entry: newest.map(|n| n.max(0) as u64),
        fence_flows: fence_flows.max(0) as u64,
    })
}

/// Which of the store's companion files (`-wal`, `-shm`, `-journal`, `.lock`) `to` names,
/// comparing whole paths once their directories are resolved.
fn store_companion(database: &Path, to: &Path) -> Option<&'static str> {
    let resolve = |p: &Path| -> Option<PathBuf> {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(dir.canonicalize().ok()?.join(p.file_name()?))
    };
    let (db, to) = (resolve(database)?, resolve(to)?);
    ["-wal", "-shm", "-journal", ".lock"]
        .into_iter()
        .find(|suffix| {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            name == to.as_os_str()
        })
        .map(|suffix| suffix.trim_start_matches(['-', '.']))
}

/// Whether `a` and `b` are one file (the same device and inode), through links or not.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Copies the store at `database` to `to` (a new file), consistently, while a coordinator
/// may be running on it: SQLite's `VACUUM INTO` reads one snapshot (WAL readers do not
/// block the writer, nor it them).
pub fn backup(database: &Path, to: &Path) -> Result<BackupReport, BackupError> {
    if !database.exists() {
        return Err(BackupError::BadInput(format!(
            "no database at {}: check `database` in the configuration",
            database.display()
        )));
    }
    if to.exists() {
        return Err(BackupError::BadInput(format!(
            "{} exists; a backup never overwrites: name a new file",
            to.display()
        )));
    }
    // The store's own companions do not exist while it is closed, but SQLite (the WAL,
    // its index, a rollback journal) and the coordinator (its lock) make them at once:
    // a backup written there would be taken for them, or deleted with them.
    if let Some(companion) = store_companion(database, to) {
        return Err(BackupError::BadInput(format!(
            "{} is the store's {companion} file; name a file outside the store's names",
            to.display()
        )));
    }
    // SQLite would say only "unable to open database" for a missing directory.
    let dir = match to.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(BackupError::BadInput(format!(
            "cannot write the backup {}: no directory {}; create it first",
            to.display(),
            dir.display()
        )));
    }
    check_owner(database)?;
    let err = sqlite(database);
    let c =
        Connection::open_with_flags(database, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(&err)?;
    c.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(&err)?;
    super::sqlite::check_ours(&c, database)?;
    // Written under a name of its own first, then linked to `to` once whole and on disk:
    // a backup killed half-way never leaves a file under the name asked for, only
    // `.<name>.partial-<pid>`, which says what it is.
    let partial = dir.join(format!(
        ".{}.partial-{}",
        to.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let target = partial
        .to_str()
        .ok_or_else(|| BackupError::BadInput(format!("{}: not a UTF-8 path", to.display())))?;
    let _ = std::fs::remove_file(&partial);
    let cannot_write = |e: &dyn std::fmt::Display| {
        BackupError::BadInput(format!("cannot write the backup {}: {e}", to.display()))
    };
    // The target is what failed when VACUUM INTO fails to open it (a read-only place).
    let copied = c
        .execute("VACUUM INTO ?1", [target])
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly) => {
                cannot_write(&e)
            }
            _ => err(e).into(),
        });
    drop(c);
    let finished = copied.and_then(|_| {
        // What the copy holds, read from the copy: the store may have moved on since.
        let copy = Connection::open_with_flags(&partial, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(sqlite(&partial))?;
        let store = summary(&copy).map_err(sqlite(&partial))?;
        drop(copy);
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(|e| cannot_write(&e))?;
        // A link never replaces a file that appeared at `to` meanwhile.
        std::fs::hard_link(&partial, to).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => BackupError::BadInput(format!(
                "{} exists; a backup never overwrites: name a new file",
                to.display()
            )),
            _ => cannot_write(&e),
        })?;
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        Ok(store)
    });
    let _ = std::fs::remove_file(&partial);
    let store = finished?;
    let bytes = std::fs::metadata(to)
        .map_err(|e| BackupError::BadInput(format!("{}: {e}", to.display())))?
        .len();
    Ok(BackupReport {
        path: to.to_path_buf(),
        bytes,
        store,
    })
}

/// Puts the backup `from` in place of the store at `database`, with a new store identity.
/// Refuses while a coordinator holds the store (its lock), a backup that is not a sound
/// Fleetmend store, and a backup from a newer coordinator. The database replaced, if any,
/// is kept as `<database>.replaced-<unix seconds>`.
pub fn restore(
    database: &Path,
    from: &Path,
    now_unix_s: u64,
) -> Result<RestoreReport, BackupError> {
    // The backup first: nothing is touched for a bad one.
    let bad = |m: String| BackupError::BadInput(format!("backup {}: {m}", from.display()));
    if !from.exists() {
        return Err(bad("no such file".into()));
    }
    if !from.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if same_file(from, database) {
        return Err(bad(format!(
            "is the database itself ({}); name a backup",
            database.display()
        )));
    }
    let src = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| bad(e.to_string()))?;
    let check: String = src
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| bad(format!("not a database ({e})")))?;
    if check != "ok" {
        return Err(bad(format!("fails SQLite's integrity check: {check}")));
    }
    let before = summary(&src).map_err(|e| bad(format!("not a Fleetmend store ({e})")))?;
    let known = super::MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if before.schema_version > known {
        return Err(BackupError::Store(StoreError::TooNew {
            path: from.to_path_buf(),
            found: before.schema_version,
            known,
        }));
    }

    let dir = match database.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    check_owner(dir)?;
    // Held until the end: no coordinator starts on a half-restored store.
    let _lock = StoreLock::acquire(database, false)?;
    let mut replaced_kept_at = None;
    if database.exists() {
        // Opened and closed once so that SQLite folds its WAL into the file and removes
        // it: the file kept aside is then the whole of the replaced store.
        drop(Connection::open(database).map_err(sqlite(database))?);
        replaced_kept_at = Some(move_aside(database, now_unix_s)?);
    }
    let target = database.to_str().ok_or_else(|| {
        BackupError::BadInput(format!("{}: not a UTF-8 path", database.display()))
    })?;
    src.execute("VACUUM INTO ?1", [target])
        .map_err(sqlite(database))?;
    drop(src);
    let store = Sqlite::open(database)?;
    let summary_now = store.with(|c| {
        c.execute(
            "UPDATE store_identity SET store_id = lower(hex(randomblob(16))) WHERE id = 1",
            [],
        )?;
        summary(c)
    })?;
    Ok(RestoreReport {
        database: database.to_path_buf(),
        from: from.to_path_buf(),
        backup_store_id: before.store_id,
        store: summary_now,
        replaced_kept_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_entry(s: &Sqlite, address: &str) {
        s.with(|c| {
            c.execute(
                "INSERT INTO repair_queue_entries (address, machine_type, operation, status, \
                 step_status, last_transition_ms, created_ms) \
                 VALUES (?1, 'qemu', 'op', 'queued', 'waiting', 0, 0)",
                [address],
            )
        })
        .unwrap();
    }

    #[test]
    fn a_restored_backup_gets_a_new_identity_and_the_replaced_store_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let live = Sqlite::open(&db).unwrap();
        add_entry(&live, "10.0.0.1");
        let copy = dir.path().join("b.db");
        let b = backup(&db, &copy).unwrap();
        assert_eq!(b.store.newest_entry, Some(1));
        assert!(b.bytes > 0);
        // After the backup: an entry the backup does not know.
        add_entry(&live, "10.0.0.2");
        let live_id = live.with(|c| identity::read(c)).unwrap();
        assert!(backup(&db, &copy).is_err(), "a backup never overwrites");
        let e = backup(&db, &dir.path().join("no/such/dir/b.db")).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        assert!(e.to_string().contains("no directory"), "{e}");

        // A running coordinator's lock refuses the restore.
        let lock = StoreLock::acquire(&db, true).unwrap();
        let e = restore(&db, &copy, 7).unwrap_err();
        assert!(
            matches!(e, BackupError::Store(StoreError::Locked { .. })),
            "{e}"
        );
        drop(lock);
        drop(live);

        let r = restore(&db, &copy, 7).unwrap();
        assert_eq!(r.backup_store_id, live_id);
        assert_ne!(r.store.store_id, live_id, "same identity after a restore");
        assert_eq!(r.store.newest_entry, Some(1));
        let kept = r.replaced_kept_at.expect("the replaced store is kept");
        assert!(kept.ends_with("c.db.replaced-7"), "{}", kept.display());
        let old = Connection::open(&kept).unwrap();
        assert_eq!(summary(&old).unwrap().newest_entry, Some(2), "nothing lost");
        let reopened = Sqlite::open(&db).unwrap();
        assert_eq!(
            reopened.with(|c| identity::read(c)).unwrap(),
            r.store.store_id
        );
        drop(reopened);

        // Again in the same second: the first kept store stays, the second gets its own name.
        let again = restore(&db, &copy, 7).unwrap();
        let kept2 = again.replaced_kept_at.unwrap();
        assert!(kept2.ends_with("c.db.replaced-7-2"), "{}", kept2.display());
        assert_eq!(
            summary(&Connection::open(&kept).unwrap())
                .unwrap()
                .newest_entry,
            Some(2)
        );
    }

    #[test]
    fn a_backup_is_never_written_over_the_stores_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Sqlite::open(&db).unwrap();
        add_entry(&s, "10.0.0.1");
        drop(s);
        // The store is closed: its WAL and index do not exist, so "never overwrites" does
        // not catch them; SQLite would remove the backup with them at close.
        for (name, what) in [
            ("c.db-wal", "wal"),
            ("c.db-shm", "shm"),
            ("c.db-journal", "journal"),
        ] {
            for to in [dir.path().join(name), dir.path().join(".").join(name)] {
                let e = backup(&db, &to).unwrap_err();
                assert!(e.is_bad_input(), "{e}");
                assert!(
                    e.to_string().contains(&format!("the store's {what} file")),
                    "{e}"
                );
            }
        }
        // Relative to the working directory too.
        let cwd = std::env::current_dir().unwrap();
        let rel = Path::new("c.db-wal");
        assert_eq!(
            store_companion(&cwd.join("c.db"), rel),
            Some("wal"),
            "a relative path names the same file"
        );
        assert_eq!(store_companion(&db, &dir.path().join("c.db-wal.bak")), None);
        let b = backup(&db, &dir.path().join("b.db")).unwrap();
        assert!(
            b.to_string()
                .contains(": 1 repair entry (newest #1), 0 fence flows"),
            "{b}"
        );
    }

    #[test]
    fn bad_backups_are_refused_before_anything_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        drop(Sqlite::open(&db).unwrap());
        let e = restore(&db, &db, 1).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("is the database itself"),
            "{e}"
        );
        let e = restore(&db, Path::new("/dev/null"), 1).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("not a regular file"),
            "{e}"
        );
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a database at all, not even close to one").unwrap();
        let e = restore(&db, &junk, 1).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("not a database"),
            "{e}"
        );
        let other = dir.path().join("other.db");
        drop(
            Connection::open(&other)
                .unwrap()
                .execute_batch("CREATE TABLE t (x)"),
        );
        let e = restore(&db, &other, 1).unwrap_err();
        assert!(e.to_string().contains("not a Fleetmend store"), "{e}");
        let e = restore(&db, &dir.path().join("missing.db"), 1).unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
        // A backup of a newer coordinator's schema: bad input too (exit 64).
        let newer = dir.path().join("newer.db");
        drop(Sqlite::open(&newer).unwrap());
        Connection::open(&newer)
            .unwrap()
            .pragma_update(None, "user_version", 999)
            .unwrap();
        let e = restore(&db, &newer, 1).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("newer than this coordinator"),
            "{e}"
        );
        assert!(!dir.path().join("c.db.replaced-1").exists());
    }
}
