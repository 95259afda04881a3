//! The checks against the database: whether it is writable and a store this coordinator can
//! open, and what the inventory and repair files would change in it, found on a copy taken as
//! `coordinator backup` takes one (the database itself is neither changed nor locked).

use std::path::Path;

use crate::config::Config;

/// A copy of the database for the comparisons, taken once per check as `coordinator backup`
/// takes one (the database itself is neither changed nor locked).
/// The name of the directories the copies are taken into start with this.
const COPY_PREFIX: &str = "fleetmend-check-";

/// A check killed before it could remove its copy (`kill -9`, a crash) leaves it behind;
/// the next check removes such copies once they are an hour old (a check takes seconds).
fn remove_stale_copies(tmp: &Path, now: std::time::SystemTime) {
    let Ok(dir) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in dir.flatten() {
        let stale = e.file_name().to_string_lossy().starts_with(COPY_PREFIX)
            && e.metadata().is_ok_and(|m| {
                m.is_dir()
                    && m.modified().is_ok_and(|t| {
                        now.duration_since(t)
                            .is_ok_and(|age| age > std::time::Duration::from_secs(3600))
                    })
            });
        if stale {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub(super) enum DbCopy {
    /// No database yet: nothing to compare with.
    None,
    /// The copy, removed with its directory when dropped.
    Taken(tempfile::TempDir),
    /// Not taken because this user does not own the database: no fault of the files, so the
    /// comparisons say how to make them and do not fail.
    NotOwner(String),
    /// Not taken: the comparisons fail with this.
    Failed(String),
}

impl DbCopy {
    pub(super) fn take(db: &Path) -> Self {
        // A coordinator that holds this file under another name (a hard link or symlink)
        // keeps its newest writes in that name's `-wal`, which a copy through this name
        // does not read ("no such table"): say what the coordinator would say at start.
        if let Err(e) = crate::store::lock::held_under_another_name(db) {
            return Self::Failed(e.to_string());
        }
        // An empty file is a store not yet initialised (created, then migrated at start).
        if std::fs::metadata(db).map_or(true, |m| m.len() == 0) {
            return Self::None;
        }
        let tmp = std::env::temp_dir();
        remove_stale_copies(&tmp, std::time::SystemTime::now());
        let dir = match tempfile::Builder::new()
            .prefix(COPY_PREFIX)
            .tempdir_in(&tmp)
        {
            Ok(d) => d,
            Err(e) => return Self::Failed(e.to_string()),
        };
        match crate::store::backup::backup(db, &dir.path().join("copy.db")) {
            Ok(_) => Self::Taken(dir),
            Err(e @ crate::store::backup::BackupError::NotOwner { .. }) => {
                Self::NotOwner(e.to_string())
            }
            Err(e) => Self::Failed(e.to_string()),
        }
    }

    /// The copy's path, or the line to print instead of comparing with `what`; `None` when
    /// there is no database.
    fn path(&self, what: &str) -> Option<Result<std::path::PathBuf, Result<String, String>>> {
        match self {
            Self::None => None,
            Self::Taken(dir) => Some(Ok(dir.path().join("copy.db"))),
            Self::NotOwner(e) => Some(Err(Ok(format!("not compared with {what}: {e}")))),
            Self::Failed(e) => Some(Err(Err(format!("cannot compare with {what}: {e}")))),
        }
    }
}

/// Whether every queued or processing repair queue entry in the database still has its
/// procedure in the repair file: at start, one that has none fails. `None` when no entry is
/// active. Read from a copy of the database, as for the inventory.
pub(super) fn repair_against_store(
    db: &Path,
    copy: &DbCopy,
    procedures: &crate::repair::RepairConfig,
) -> Option<Result<String, String>> {
    let copy = match copy.path("the repair queue")? {
        Ok(p) => p,
        Err(line) => return Some(line),
    };
    // A copy of the SQLite file: read with the SQLite backend's own functions.
    let loaded = crate::store::Sqlite::open(&copy)
        .and_then(|s| s.with(|c| crate::repair::store::sqlite::load(c)));
    let entries = match loaded {
        Ok((_, entries)) => entries,
        Err(e) => {
            return Some(Err(format!(
                "cannot compare the file with the repair queue's entries: {e}"
            )));
        }
    };
    let active: Vec<_> = entries
        .iter()
        .filter(|e| e.is_active() && !e.deleted)
        .collect();
    if active.is_empty() {
        return None;
    }
    let orphans: Vec<String> = active
        .iter()
        .filter(|e| {
            procedures
                .operation_for(&e.machine_type, &e.operation)
                .is_err()
        })
        .map(|e| {
            format!(
                "#{} ({} {} {}, {})",
                e.index,
                e.operation,
                e.machine_type,
                e.address,
                e.status.as_str()
            )
        })
        .collect();
    let db = db.display();
    Some(match (orphans.len(), active.len()) {
        (0, 1) => Ok(format!(
            "against {db}: the one queued or processing entry has its procedure in this file"
        )),
        (0, n) => Ok(format!(
            "against {db}: the {n} queued or processing entries have their procedures in this file"
        )),
        (n, _) => Err(format!(
            "against {db}: {} {} no procedure in this file and would fail at the start; keep \
             the procedure until it finishes (`coordinatorctl repair-queue wait`), or delete the \
             entry first (`coordinatorctl repair-queue delete INDEX`)",
            if n == 1 { "entry" } else { "entries" },
            orphans.join(", ") + if n == 1 { " has" } else { " have" },
        )),
    })
}

/// What importing the inventory file would change in the database, found on a copy of it.
pub(super) fn inventory_against_store(
    config: &Config,
    copy: &DbCopy,
    path: &Path,
) -> Option<Result<String, String>> {
    let copy = match copy.path("the database")? {
        Ok(p) => p,
        Err(line) => return Some(line),
    };
    Some(import_into_copy(config, &copy, path))
}

/// Imports the inventory file at `path` into the database copy at `copy`.
fn import_into_copy(config: &Config, copy: &Path, path: &Path) -> Result<String, String> {
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot compare the file with the database: {e}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| cannot(&e))?;
    let import = rt.block_on(async {
        let store = crate::store::Store::open(copy).map_err(|e| cannot(&e))?;
        let fleet = crate::fleet::Fleet::open(
            store.clone(),
            std::sync::Arc::new(crate::clock::SystemClock),
            config.health.resolved(),
        )
        .await
        .map_err(|e| cannot(&e))?;
        crate::app::import_inventory(&fleet, &store, path)
            .await
            .map_err(|e| format!("the coordinator would not start: {e}"))
    })?;
    Ok(describe_import(&config.database, &import))
}

/// `import` as one line: what a start with this file would change.
fn describe_import(db: &Path, import: &crate::app::InventoryImport) -> String {
    let list = |v: &[String]| v.join(", ");
    let mut parts = Vec::new();
    let new: Vec<String> = import
        .new
        .iter()
        .filter(|a| !import.moved.iter().any(|(_, _, to)| to == *a))
        .cloned()
        .collect();
    if !new.is_empty() {
        parts.push(format!("new: {}", list(&new)));
    }
    for (hostname, from, to) in &import.moved {
        parts.push(format!(
            "{hostname} moves from {from} to {to} (the retired record at {from} is deleted, its history kept)"
        ));
    }
    if !import.released.is_empty() {
        parts.push(format!(
            "no longer listed, to be retired and left to `coordinatorctl machines delete`: {}",
            list(&import.released)
        ));
    }
    if !import.deferred.is_empty() {
        parts.push(format!(
            "left out of the start while the machine holding their hostname is under repair: {}",
            list(&import.deferred)
        ));
    }
    if parts.is_empty() {
        format!("against {}: no change to the machines", db.display())
    } else {
        format!("against {}: {}", db.display(), parts.join("; "))
    }
}

/// Writable without opening SQLite: an existing file opened for writing, or a new file
/// creatable in its directory (created and removed again).
pub(super) fn check_database(db: &Path, copy: &DbCopy) -> Result<String, String> {
    if db.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(db)
            .map_err(|e| format!("{}: not writable: {e}", db.display()))?;
        // The copy failed on what the file holds (not SQLite, another program's, newer), or
        // could not be taken as this user (then only writability is known).
        match copy {
            DbCopy::Failed(e) => Err(e.clone()),
            DbCopy::NotOwner(_) => Ok(format!(
                "{}: exists, writable (contents not read: not its owner)",
                db.display()
            )),
            DbCopy::Taken(_) | DbCopy::None => Ok(format!("{}: exists, writable", db.display())),
        }
    } else {
        let dir = match db.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let probe = dir.join(format!(".fleetmend-check-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map(|_| {
                let _ = std::fs::remove_file(&probe);
                format!("{}: will be created (directory writable)", db.display())
            })
            .map_err(|e| {
                format!(
                    "{}: cannot be created in {}: {e}",
                    db.display(),
                    dir.display()
                )
            })
    }
}

/// The `database` line of an etcd store: connects (read only) and reads the schema under
/// the prefix: its version against this coordinator's, or that the start will create it.
/// Writes nothing. Runs on a runtime of its own on its own thread, so it can be called from
/// anywhere.
pub(super) fn check_etcd(store: &crate::store::config::StoreConfig) -> Result<String, String> {
    use crate::store::etcd::{EtcdSettings, EtcdStore, schema};
    let settings = EtcdSettings::configured(store).map_err(|e| e.to_string())?;
    let work = move || -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime to reach etcd: {e}"))?;
        rt.block_on(async move {
            let store = EtcdStore::connect_only(settings)
                .await
                .map_err(|e| e.to_string())?;
            let known = schema::known();
            let at = format!("etcd {} under {}", store.endpoints(), store.prefix());
            let (found, _) = schema::version(&store).await.map_err(|e| e.to_string())?;
            if found > known {
                return Err(crate::store::etcd::EtcdError::TooNew {
                    prefix: store.prefix().to_string(),
                    found,
                    known,
                }
                .to_string());
            }
            Ok(match found {
                0 => format!(
                    "{at}: reachable, nothing stored yet; the first start creates schema \
                     version {known}"
                ),
                v if v == known => format!("{at}: reachable, schema version {v} (current)"),
                v => {
                    format!("{at}: reachable, schema version {v}; the start migrates it to {known}")
                }
            })
        })
    };
    std::thread::spawn(work)
        .join()
        .unwrap_or_else(|_| Err("the etcd check panicked".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_left_by_a_killed_check_are_removed_once_old() {
        let tmp = tempfile::tempdir().unwrap();
        let left = tmp.path().join(format!("{COPY_PREFIX}abc"));
        let other = tmp.path().join("someone-else");
        for d in [&left, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("copy.db"), b"x").unwrap();
        }
        let now = std::time::SystemTime::now();
        remove_stale_copies(tmp.path(), now);
        assert!(
            left.exists(),
            "a copy of a check that may still run is kept"
        );
        remove_stale_copies(tmp.path(), now + std::time::Duration::from_secs(3601));
        assert!(!left.exists(), "an hour-old copy is removed");
        assert!(other.exists(), "only the check's own copies are touched");
    }

    #[test]
    fn an_import_is_described_without_repeating_a_move_as_new_or_retired() {
        let db = Path::new("/var/lib/c.db");
        let none = crate::app::InventoryImport::default();
        assert_eq!(
            describe_import(db, &none),
            "against /var/lib/c.db: no change to the machines"
        );
        let import = crate::app::InventoryImport {
            new: vec!["10.0.0.3".into(), "10.0.0.9".into()],
            released: vec!["10.0.0.2".into()],
            moved: vec![("web-1".into(), "10.0.0.1".into(), "10.0.0.9".into())],
            deferred: vec![],
            records: vec![],
        };
        assert_eq!(
            describe_import(db, &import),
            "against /var/lib/c.db: new: 10.0.0.3; web-1 moves from 10.0.0.1 to 10.0.0.9 (the \
             retired record at 10.0.0.1 is deleted, its history kept); no longer listed, to be \
             retired and left to `coordinatorctl machines delete`: 10.0.0.2"
        );
    }

    #[test]
    fn a_database_a_coordinator_holds_under_another_name_is_named_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        drop(crate::store::Store::open(&db).unwrap());
        // As a running coordinator holds it (here: this process).
        let _held = crate::store::lock::StoreLock::acquire(&db, false).unwrap();
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(&db, &hard).unwrap();
        let copy = DbCopy::take(&hard);
        let e = check_database(&hard, &copy).unwrap_err();
        assert!(
            e.contains(&format!(
                "is in use by another coordinator (pid {}) that opened the same file under another name",
                std::process::id()
            )),
            "{e}"
        );
        let procedures = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"true\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let e = repair_against_store(&hard, &copy, &procedures)
            .expect("a line")
            .unwrap_err();
        assert!(
            e.contains("under another name") && !e.contains("no such table"),
            "{e}"
        );
        // Under the holder's own name the check reads its copy as ever.
        let copy = DbCopy::take(&db);
        assert!(check_database(&db, &copy).unwrap().contains("writable"));
    }

    #[test]
    fn database_checks_tell_writable_from_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let check = |p: &Path| check_database(p, &DbCopy::take(p));
        assert!(check(&db).unwrap().contains("will be created"));
        std::fs::write(&db, b"").unwrap();
        assert!(check(&db).unwrap().contains("writable"));
        drop(crate::store::Store::open(&db).unwrap());
        assert!(check(&db).unwrap().contains("writable"));
        assert!(check(Path::new("/nonexistent/dir/c.db")).is_err());
        // What the start would refuse, check refuses: not SQLite, another program's
        // tables, a newer schema.
        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a; 5000]).unwrap();
        let e = check(&garbage).unwrap_err();
        assert!(e.contains("not a database"), "{e}");
        let other = dir.path().join("other.db");
        rusqlite::Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE users(id INTEGER)")
            .unwrap();
        let e = check(&other).unwrap_err();
        assert!(e.contains("not a Fleetmend store"), "{e}");
        rusqlite::Connection::open(&db)
            .unwrap()
            .pragma_update(None, "user_version", 999)
            .unwrap();
        let e = check(&db).unwrap_err();
        assert!(e.contains("newer than this coordinator"), "{e}");
        assert!(e.contains("coordinator restore --from"), "{e}");
    }
}
