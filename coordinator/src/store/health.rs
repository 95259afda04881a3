//! What the store knows of its own health, and the probe that keeps it current.
//!
//! [`StoreHealth`] counts storage failures and remembers why writes fail, in words an
//! operator can act on ([`explain`]: "the disk holding … is full", not only SQLite's "disk I/O
//! error"). It says so in the log once when writes start failing, once a minute while they
//! keep failing (with the count), and once when they work again; the callers whose writes
//! failed log at debug, so a store that is down does not write one ERROR per agent report.
//!
//! A quiet coordinator writes nothing for minutes, so [`probe_loop`] writes on a timer (a
//! no-op update of the store's identity row): `/healthz` turns 503 within one period of the
//! store becoming unwritable and back to 200 within one period of it being fixed, not at the
//! next write something else happens to make.
//!
//! Not here: what `/healthz` answers (`crate::metrics`), opening and migrating (`super`).

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use std::future::Future;

use super::repeated::RepeatedFailure;
use super::{Sqlite, Store, StoreError, dispatch};

/// How often [`probe_loop`] writes. Kubernetes' and most load balancers' health checks look
/// every 10 s, so 5 s keeps `/healthz` within one of their periods; the cost is one tiny
/// transaction (one fsync) per period.
pub const PROBE_PERIOD: Duration = Duration::from_secs(5);

/// How often a store that keeps failing is said to be failing again (with the count): once
/// a minute reads as "still down" in a log without burying everything else.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// What the store has seen of its own health: failures counted, and whether the last write
/// failed. A failure marks the store failing; only a write that commits clears it, so a
/// read that works while writes do not keeps `/healthz` at 503.
#[derive(Debug)]
pub struct StoreHealth {
    failures: AtomicU64,
    /// etcd only: times requests moved off a member that failed them.
    member_moves: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Why writes fail, `None` while they work.
    failing: Option<String>,
    /// When to log the run of failures again.
    log: RepeatedFailure,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            failures: AtomicU64::new(0),
            member_moves: AtomicU64::new(0),
            state: Mutex::new(State {
                failing: None,
                log: RepeatedFailure::new(REPEAT_EVERY),
            }),
        }
    }
}

impl StoreHealth {
    /// Store failures since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// etcd only: how many times requests moved off a member that failed them.
    pub fn member_moves(&self) -> u64 {
        self.member_moves.load(Ordering::Relaxed)
    }

    /// Counts a move off a failing etcd member.
    pub(super) fn moved_member(&self) {
        self.member_moves.fetch_add(1, Ordering::Relaxed);
    }

    /// Why the store is failing, `None` while writes work.
    pub fn failing(&self) -> Option<String> {
        self.lock().failing.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn failed(&self, why: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut s = self.lock();
        match s.log.failed(&why, tokio::time::Instant::now()) {
            Some(1) => tracing::error!(
                error = %why,
                "database writes are failing; /healthz answers 503 until one succeeds"
            ),
            Some(n) => tracing::error!(
                error = %why,
                failures = n,
                "database writes are still failing; /healthz answers 503 until one succeeds"
            ),
            None => {}
        }
        s.failing = Some(why);
    }

    pub(super) fn wrote(&self) {
        let mut s = self.lock();
        let n = s.log.succeeded();
        if s.failing.take().is_some() {
            tracing::info!(failures = n.unwrap_or(0), "database writes work again");
        }
    }
}

/// `e` in words that say what to do, with SQLite's own words after them. `path` is the
/// database file.
pub fn explain(e: &rusqlite::Error, path: &Path) -> String {
    use rusqlite::ErrorCode as C;
    let p = path.display();
    let Some(f) = e.sqlite_error() else {
        return e.to_string();
    };
    let what = match f.code {
        C::DiskFull => format!("the file system holding {p} is full: free space on it"),
        C::ReadOnly => format!(
            "{p} (or its directory, or its -wal/-shm files) cannot be written: check their \
             owner and mode and whether the file system was remounted read-only (dmesg)"
        ),
        C::SystemIoFailure => format!(
            "the operating system failed a read or write of {p} or its -wal file: a file \
             system remounted read-only after errors, a failing disk or a full one; see \
             the kernel log (dmesg) and `df` for that file system"
        ),
        C::CannotOpen | C::PermissionDenied => format!(
            "{p} or a file beside it can no longer be opened: check that its directory \
             still exists and that the coordinator's user may write it"
        ),
        C::DatabaseCorrupt | C::NotADatabase => format!(
            "{p} is damaged: stop the coordinator and restore a backup \
             (coordinator restore --from FILE)"
        ),
        C::DatabaseBusy | C::DatabaseLocked | C::FileLockingProtocolFailed => format!(
            "another process holds a write lock on {p} (an sqlite3 shell, a backup tool): \
             end it"
        ),
        C::OutOfMemory => "SQLite ran out of memory: check the host's memory".to_string(),
        C::ConstraintViolation => format!("a trigger on {p} refused the write"),
        _ => return e.to_string(),
    };
    format!("{what} ({e})")
}

/// What `/healthz` and the probe loop ask of a backend.
pub trait Probe {
    /// Writes to the store without changing it and commits, which marks the store healthy,
    /// or failing with why.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads something from the store: it answers at all.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl Probe for Sqlite {
    async fn probe(&self) -> Result<(), StoreError> {
        // The identity row updated to itself.
        self.call(|c| c.execute("UPDATE store_identity SET id = id WHERE id = 1", []))
            .await
            .map(drop)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
            .await
            .map(drop)
    }
}

impl Probe for Store {
    async fn probe(&self) -> Result<(), StoreError> {
        dispatch!(self, b => b.probe().await)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, b => b.ping().await)
    }
}

/// Writes to the store every `every` until `shutdown`, so [`StoreHealth`] (and `/healthz`)
/// follows the store even while nothing else writes. A failing probe is counted and logged
/// by the store itself.
pub async fn probe_loop(store: Store, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = store.probe().await {
            tracing::debug!(error = %e, "store probe failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(code: i32, msg: &str) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some(msg.into()))
    }

    #[test]
    fn storage_failures_are_explained_in_words_an_operator_can_act_on() {
        let path = Path::new("/var/lib/fleetmend/c.db");
        let full = explain(
            &sqlite(rusqlite::ffi::SQLITE_FULL, "database or disk is full"),
            path,
        );
        assert!(
            full.starts_with("the file system holding /var/lib/fleetmend/c.db is full")
                && full.ends_with("(database or disk is full)"),
            "{full}"
        );
        let io = explain(
            &sqlite(rusqlite::ffi::SQLITE_IOERR_WRITE, "disk I/O error"),
            path,
        );
        assert!(
            io.contains("remounted read-only")
                && io.contains("dmesg")
                && io.contains("disk I/O error"),
            "{io}"
        );
        let ro = explain(
            &sqlite(
                rusqlite::ffi::SQLITE_READONLY,
                "attempt to write a readonly database",
            ),
            path,
        );
        assert!(ro.contains("owner and mode"), "{ro}");
        let other = explain(&rusqlite::Error::QueryReturnedNoRows, path);
        assert_eq!(other, rusqlite::Error::QueryReturnedNoRows.to_string());
    }

    #[tokio::test]
    async fn the_probe_finds_a_store_turned_unwritable_and_fixed_with_no_other_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let s = Store::open_exclusive(&db).unwrap();
        s.probe().await.unwrap();
        assert_eq!(s.health().failing(), None);
        let other = rusqlite::Connection::open(&db).unwrap();
        other
            .execute_batch(
                "CREATE TRIGGER freeze BEFORE UPDATE ON store_identity
                 BEGIN SELECT RAISE(ABORT, 'frozen'); END;",
            )
            .unwrap();
        assert!(s.probe().await.is_err());
        let why = s.health().failing().unwrap();
        assert!(
            why.contains("refused the write") && why.contains("frozen"),
            "{why}"
        );
        other.execute_batch("DROP TRIGGER freeze").unwrap();
        s.probe().await.unwrap();
        assert_eq!(s.health().failing(), None);
    }

    #[test]
    fn a_failing_store_is_said_once_and_cleared_by_a_write() {
        let h = StoreHealth::default();
        h.failed("full".into());
        h.failed("full".into());
        assert_eq!((h.failures(), h.failing().as_deref()), (2, Some("full")));
        h.wrote();
        assert_eq!(h.failing(), None);
    }
}
