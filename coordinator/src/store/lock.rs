//! The coordinator's exclusive hold on its database, and the checks that the database can
//! be written before anything is served.
//!
//! The lock is `flock(LOCK_EX)` on `<database>.lock`, held by an open file for the life of
//! the process: the kernel releases it when the process dies however it dies (SIGKILL
//! included), so a stale lock never needs clearing by hand. The holder's pid is written
//! inside so a refused second coordinator can name it. A second coordinator on the same
//! store would declare the first one's running command interrupted and run every step
//! again beside it (invariant 8): it is refused before it opens the database.
//!
//! The lock file sits next to the database, so creating it is also the check that the
//! database's directory is writable (SQLite needs it for the `-wal` and `-shm` files).
//! This module does not open the database; [`super::Store::open_exclusive`] does, after it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::StoreError;

/// An exclusive lock on a database, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct StoreLock {
    _file: Flock<File>,
    /// The database file itself, locked too: the lock file is found by name, and a symlink
    /// or hard link to the same database is another name (SQLite's own locks do not keep a
    /// second coordinator out; they only order its writes).
    _database: Option<Flock<File>>,
    path: PathBuf,
}

/// The lock file of `database`: `<database>.lock` beside it.
pub fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

/// The directory holding `database` (`.` for a bare file name).
fn directory_of(database: &Path) -> &Path {
    match database.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

impl StoreLock {
    /// Takes the lock of `database`, or says who holds it. Fails with
    /// [`StoreError::DirectoryMissing`] or [`StoreError::NotWritable`] when the database's
    /// directory cannot hold the lock file.
    /// The database file is locked too when it exists, or, with `create`, once created
    /// empty (as SQLite would create it): a coordinator's store is then held under every
    /// name it has.
    pub fn acquire(database: &Path, create: bool) -> Result<Self, StoreError> {
        let dir = directory_of(database);
        if !dir.is_dir() {
            return Err(StoreError::DirectoryMissing {
                database: database.to_path_buf(),
                directory: dir.to_path_buf(),
            });
        }
        let path = lock_path(database);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::NotWritable {
                path: dir.to_path_buf(),
                reason: format!("cannot create the lock file {}: {e}", path.display()),
            })?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(StoreError::Locked {
                    database: database.to_path_buf(),
                    lock: path,
                    holder: holder_pid(&text),
                });
            }
            Err((_, errno)) => {
                return Err(StoreError::NotWritable {
                    path: path.clone(),
                    reason: format!("cannot lock {}: {errno}", path.display()),
                });
            }
        };
        // Ours now: replace whatever pid a dead holder left.
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all());
        if let Err(e) = written {
            return Err(StoreError::NotWritable {
                path: path.clone(),
                reason: format!("cannot write the lock file {}: {e}", path.display()),
            });
        }
        let database_lock = lock_database(database, create)?;
        Ok(Self {
            _file: file,
            _database: database_lock,
            path,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `flock(LOCK_EX)` on the database file itself (created empty first with `create`), or
/// `None` when it does not exist and is not to be created.
fn lock_database(database: &Path, create: bool) -> Result<Option<Flock<File>>, StoreError> {
    let opened = File::options()
        .read(true)
        .write(create)
        .create(create)
        .truncate(false)
        .open(database);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
        Err(e) => {
            return Err(StoreError::NotWritable {
                path: database.to_path_buf(),
                reason: format!("cannot open it: {e}"),
            });
        }
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(f) => Ok(Some(f)),
        Err((file, Errno::EWOULDBLOCK)) => Err(StoreError::HeldUnderAnotherName {
            database: database.to_path_buf(),
            holder: file
                .metadata()
                .ok()
                .and_then(|m| protocol::file::flock_holder_now(m.dev(), m.ino())),
        }),
        Err((_, errno)) => Err(StoreError::NotWritable {
            path: database.to_path_buf(),
            reason: format!("cannot lock it: {errno}"),
        }),
    }
}

/// The refusal [`StoreLock::acquire`] would give because another process holds `database`
/// under another name (a symlink or a hard link to it), found without taking any lock:
/// for `coordinator check`, which must not lock a running coordinator's store. A database
/// held under this very name (the coordinator a check is usually run beside) is no refusal
/// here: its lock file `<database>.lock` is held by the same process.
pub fn held_under_another_name(database: &Path) -> Result<(), StoreError> {
    let Ok(db) = std::fs::metadata(database) else {
        return Ok(());
    };
    let Some(holder) = protocol::file::flock_holder_now(db.dev(), db.ino()) else {
        return Ok(());
    };
    let this_name = std::fs::metadata(lock_path(database))
        .ok()
        .and_then(|m| protocol::file::flock_holder_now(m.dev(), m.ino()));
    if this_name == Some(holder) {
        return Ok(());
    }
    Err(StoreError::HeldUnderAnotherName {
        database: database.to_path_buf(),
        holder: Some(holder),
    })
}

/// The pid a lock file names, if it holds one.
pub fn holder_pid(text: &str) -> Option<u32> {
    text.trim().parse().ok()
}

/// Fails unless the database file (when it exists) and its `-wal` and `-shm` files can be
/// opened for writing. SQLite would otherwise open a write-protected file read-only without
/// a word, and the coordinator would serve while every write fails.
pub fn check_writable(database: &Path) -> Result<(), StoreError> {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = database.as_os_str().to_os_string();
        name.push(suffix);
        let path = PathBuf::from(name);
        if !path.exists() {
            continue;
        }
        if let Err(e) = File::options().write(true).open(&path) {
            return Err(StoreError::NotWritable {
                path,
                reason: format!("cannot open it for writing: {e}"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_naming_the_file_and_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let held = StoreLock::acquire(&db, true).unwrap();
        assert_eq!(held.path(), dir.path().join("c.db.lock"));
        let err = StoreLock::acquire(&db, true).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, StoreError::Locked { holder: Some(pid), .. } if pid == std::process::id()),
            "{err:?}"
        );
        assert!(msg.contains(&held.path().display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(held);
        StoreLock::acquire(&db, true).expect("free again once the holder is gone");
    }

    #[test]
    fn refusal_message_without_a_readable_pid() {
        let err = StoreError::Locked {
            database: "/var/lib/fleetmend/c.db".into(),
            lock: "/var/lib/fleetmend/c.db.lock".into(),
            holder: holder_pid("garbage"),
        };
        let msg = err.to_string();
        assert!(msg.contains("/var/lib/fleetmend/c.db.lock"), "{msg}");
        assert!(msg.contains("pid unknown"), "{msg}");
        assert_eq!(holder_pid(" 4242\n"), Some(4242));
    }

    #[test]
    fn missing_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("nowhere").join("c.db");
        let err = StoreLock::acquire(&db, true).unwrap_err();
        assert!(
            matches!(err, StoreError::DirectoryMissing { .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("is missing"), "{msg}");
        assert!(msg.contains(&dir.path().join("nowhere").display().to_string()));
    }

    #[test]
    fn directory_that_refuses_files_is_not_writable() {
        // procfs refuses new files even to root, unlike a mode-0555 directory.
        let err = StoreLock::acquire(Path::new("/proc/fleetmend-test.db"), true).unwrap_err();
        assert!(matches!(err, StoreError::NotWritable { .. }), "{err:?}");
        assert!(err.to_string().contains("/proc"), "{err}");
    }

    #[test]
    fn the_same_database_under_another_name_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let held = StoreLock::acquire(&db, true).unwrap();
        assert!(db.is_file(), "the database is created to be locked");
        let symlink = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &symlink).unwrap();
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(&db, &hard).unwrap();
        for other in [&symlink, &hard] {
            for create in [true, false] {
                let err = StoreLock::acquire(other, create).unwrap_err();
                assert!(
                    matches!(&err, StoreError::HeldUnderAnotherName { holder: Some(pid), .. } if *pid == std::process::id()),
                    "{}: {err:?}",
                    other.display()
                );
                let msg = err.to_string();
                assert!(msg.contains(&other.display().to_string()), "{msg}");
                assert!(msg.contains("symlink or hard link"), "{msg}");
            }
        }
        // Seen without locking (for `coordinator check`): under the other names only.
        assert!(
            held_under_another_name(&db).is_ok(),
            "the holder's own name"
        );
        for other in [&symlink, &hard] {
            let err = held_under_another_name(other).unwrap_err();
            assert!(
                matches!(&err, StoreError::HeldUnderAnotherName { holder: Some(pid), .. } if *pid == std::process::id()),
                "{}: {err:?}",
                other.display()
            );
        }
        drop(held);
        assert!(held_under_another_name(&hard).is_ok(), "nobody holds it");
        StoreLock::acquire(&hard, true).expect("free again once the holder is gone");
    }

    #[test]
    fn a_missing_database_is_not_created_without_create() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let _held = StoreLock::acquire(&db, false).unwrap();
        assert!(!db.exists());
    }
}
