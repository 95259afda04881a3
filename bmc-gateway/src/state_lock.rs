//! The gateway's exclusive hold on its state directory.
//!
//! `requests.log` in `state_dir` is the record behind "each request id runs at most once"
//! ([`crate::journal`]). Two gateways on one directory would each read it at start, append
//! to it and rewrite it under the other, and a request id one of them ran could run again on
//! the other. So the gateway holds `flock(LOCK_EX)` on `state_dir/bmc-gateway.lock` for as
//! long as its record is open, as the coordinator holds its database's lock: the kernel
//! drops it when the process dies, however it dies, so a stale lock never needs clearing.
//! The holder's pid is written inside, so a refused second gateway can name it.
//!
//! [`holder`] tells `bmc-gateway check` who holds the directory without taking the lock (a
//! running gateway is not disturbed, and nothing is created): it reads `/proc/locks`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::journal::error::{JournalError, io};

/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "bmc-gateway.lock";

/// The exclusive hold on a state directory, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock of the state directory `dir` (which must exist), or says which
    /// process holds it ([`JournalError::Locked`]).
    pub fn acquire(dir: &Path) -> Result<Self, JournalError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(JournalError::Locked {
                    dir: dir.to_path_buf(),
                    lock: path,
                    holder: text.trim().parse().ok(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        // Ours now: replace whatever pid a dead holder left.
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all())
            .map_err(io(&path))?;
        Ok(Self { _file: file })
    }
}

/// Who holds the state directory `dir` now: `Ok(Some(pid))` for a running gateway,
/// `Ok(None)` when nobody does (or the directory or its lock file does not exist yet), and
/// an error when the lock file cannot be looked at. Takes no lock and creates nothing.
pub fn holder(dir: &Path) -> Result<Option<u32>, String> {
    let path: PathBuf = dir.join(LOCK_FILE);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot look at {}: {e}", path.display())),
    };
    let locks = std::fs::read_to_string("/proc/locks").map_err(|e| {
        format!(
            "cannot read /proc/locks to find who holds {}: {e}",
            path.display()
        )
    })?;
    Ok(protocol::file::flock_holder(&locks, meta.dev(), meta.ino()))
}

/// `check`'s line about the state directory, for a person: `state  ok  …` when no gateway
/// holds it, `state  held  …` naming the pid that does (informational: `check` usually runs
/// beside the gateway; a second one on the directory would refuse to start), `state  FAIL  …`
/// when it cannot be told.
pub fn render_check(dir: &Path, holder: &Result<Option<u32>, String>) -> String {
    let dir = dir.display();
    match holder {
        Ok(None) => format!("state  ok    {dir}: no gateway holds it\n"),
        Ok(Some(pid)) => format!(
            "state  held  {dir}: held by the gateway with pid {pid}; another gateway on this \
             state_dir refuses to start\n"
        ),
        Err(e) => format!("state  FAIL  {dir}: {e}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_hold_is_refused_naming_the_holder_and_freed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(holder(dir.path()), Ok(None), "no lock file yet");
        let first = StateLock::acquire(dir.path()).unwrap();
        // Another open of the same file, as a second gateway would make.
        let e = StateLock::acquire(dir.path()).unwrap_err();
        match &e {
            JournalError::Locked { holder, lock, .. } => {
                assert_eq!(*holder, Some(std::process::id()));
                assert_eq!(lock, &dir.path().join(LOCK_FILE));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id()))
                && msg.contains(&dir.path().display().to_string()),
            "{msg}"
        );
        assert_eq!(holder(dir.path()), Ok(Some(std::process::id())));
        drop(first);
        assert_eq!(holder(dir.path()), Ok(None));
        StateLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn the_check_line_says_who_holds_the_directory() {
        let d = Path::new("/var/lib/fleetmend-gateway");
        assert_eq!(
            render_check(d, &Ok(Some(42))),
            "state  held  /var/lib/fleetmend-gateway: held by the gateway with pid 42; another \
             gateway on this state_dir refuses to start\n"
        );
        assert!(render_check(d, &Ok(None)).starts_with("state  ok    "));
        assert!(render_check(d, &Err("x".into())).starts_with("state  FAIL  "));
    }
}
