//! The coordinator's store: the seam between the areas that keep state and the backend that
//! keeps it.
//!
//! Each area owns its state and says what it needs of a store in one trait of its own,
//! with async methods: the repair queue and its history
//! ([`crate::repair::store::RepairQueueStore`]), command process groups
//! ([`crate::repair::store::CommandGroupStore`]), diagnostics bundles
//! ([`crate::repair::store::DiagnosticsStore`]), fence flows ([`crate::fence::store::FenceStore`]),
//! machine records ([`crate::fleet::store::MachineStore`]), the remediation journal, switches
//! and outcomes ([`crate::remediation::store::RemediationStore`]), kdump notices
//! ([`crate::kdump::store::KdumpStore`]) and the store's identity ([`IdentityStore`]). The
//! rest of the coordinator holds a [`Store`] and calls those traits; which backend is
//! underneath is one `match` in each area's `impl … for Store` (written with [`dispatch!`]).
//!
//! The backends: [`Sqlite`] (bundled SQLite in WAL mode, the default, one coordinator per
//! file); etcd is the second ([`EtcdStore`], `store/etcd/`: its variant of [`Store`] and its
//! arm of [`dispatch!`]). Each backend keeps its code for an area with the area
//! (`repair/store/sqlite.rs`, `fence/store/sqlite.rs`, …), so the SQL of a table sits next to
//! the code that owns the table; the migrations stay here, in one ordered list.
//!
//! Rules every area trait keeps (see `docs/design.md`, "The store seam"):
//! - every read-modify-write whose decision must be atomic is *one* method, so a backend
//!   can make it one transaction (SQLite) or one compare-and-swap (etcd);
//! - a method that writes returns only after the write is durable (invariant 6);
//! - the fencing condition of a leader (issue 31) is carried by the backend handle itself, not
//!   by the methods' arguments: an etcd [`Store`] that leads holds its epoch and compares it
//!   in each write it makes, so no trait changes when it comes.

pub mod backup;
pub mod config;
pub mod etcd;
pub mod health;
pub mod lock;
pub mod migrate;
pub mod repeated;
pub mod sqlite;

pub mod identity;

use std::path::{Path, PathBuf};

pub use etcd::EtcdStore;
pub use health::{Probe, StoreHealth};
pub use identity::IdentityStore;
pub use lock::StoreLock;
pub use sqlite::{MIGRATIONS, Sqlite, is_storage_failure};

/// The coordinator's store: one backend, chosen by the configuration (`[store] backend`).
/// Cheap to clone. The areas reach it only through their traits.
#[derive(Debug, Clone)]
pub enum Store {
    /// SQLite on a local file.
    Sqlite(Sqlite),
    /// etcd, under a key prefix ([`etcd`]).
    Etcd(EtcdStore),
}

/// Runs `$body` with `$backend` bound to the backend inside a [`Store`]: the one place each
/// area's `impl AreaStore for Store` names the backends. A new backend adds its arm here,
/// and the compiler then asks each area for its implementation.
macro_rules! dispatch {
    ($store:expr, $backend:ident => $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite($backend) => $body,
            $crate::store::Store::Etcd($backend) => $body,
        }
    };
}
pub(crate) use dispatch;

impl Store {
    /// Opens (creating if needed) and migrates the SQLite database at `path`, without the
    /// exclusive lock (tests, tools reading a copy).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Sqlite::open(path).map(Store::Sqlite)
    }

    /// How a coordinator opens the store its configuration names (`[store]`): for SQLite,
    /// [`Store::open_exclusive`] on `database`; for etcd, [`EtcdStore::connect`] (etcd
    /// unreachable is an error naming the endpoints; the schema is checked and migrated).
    pub async fn open_configured(
        store: &config::StoreConfig,
        database: &Path,
    ) -> Result<Self, StoreError> {
        match store.backend {
            config::Backend::Sqlite => Self::open_exclusive(database),
            config::Backend::Etcd => {
                let settings = etcd::EtcdSettings::configured(store)?;
                Ok(Store::Etcd(EtcdStore::connect(settings).await?))
            }
        }
    }

    /// How a coordinator opens a SQLite store: the exclusive lock, then proof that the files
    /// can be written, then the database ([`Sqlite::open_exclusive`]).
    pub fn open_exclusive(path: &Path) -> Result<Self, StoreError> {
        Sqlite::open_exclusive(path).map(Store::Sqlite)
    }

    /// The store's failure count and state.
    pub fn health(&self) -> &StoreHealth {
        dispatch!(self, b => b.health())
    }

    /// Which backend this is.
    pub fn backend(&self) -> config::Backend {
        match self {
            Store::Sqlite(_) => config::Backend::Sqlite,
            Store::Etcd(_) => config::Backend::Etcd,
        }
    }

    /// The etcd handle, when the store is etcd.
    pub fn as_etcd(&self) -> Option<&EtcdStore> {
        match self {
            Store::Etcd(s) => Some(s),
            Store::Sqlite(_) => None,
        }
    }

    /// The SQLite handle, when the store is SQLite: for what only SQLite has (a backup of
    /// the file, raw SQL in tests).
    pub fn as_sqlite(&self) -> Option<&Sqlite> {
        match self {
            Store::Sqlite(s) => Some(s),
            Store::Etcd(_) => None,
        }
    }

    /// Test only: runs `f` with the SQLite connection (fault injection, fixtures).
    #[cfg(test)]
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.as_sqlite().expect("a SQLite store").with(f)
    }

    /// Test only: runs `f` with the SQLite connection on a blocking thread.
    #[cfg(test)]
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.as_sqlite().expect("a SQLite store").call(f).await
    }
}

impl From<EtcdStore> for Store {
    fn from(s: EtcdStore) -> Self {
        Store::Etcd(s)
    }
}

impl From<Sqlite> for Store {
    fn from(s: Sqlite) -> Self {
        Store::Sqlite(s)
    }
}

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
        "database {path} is at schema version {found}, newer than this coordinator's {known}; upgrade the coordinator, or to go back to this release restore a backup taken before the upgrade (`coordinator restore --from FILE`)"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Version found.
        found: i64,
        /// Newest version known here.
        known: i64,
    },
    /// The file holds another program's tables: a `database` path pointing at the wrong
    /// file. Nothing is written to it.
    #[error(
        "database {path} is not a Fleetmend store: it holds another program's tables ({objects} schema objects) and no Fleetmend schema version; point `database` at a new file or a Fleetmend store"
    )]
    NotOurs {
        /// The database file.
        path: PathBuf,
        /// How many schema objects it holds.
        objects: i64,
    },
    /// etcd failed, or holds what this coordinator cannot use.
    #[error(transparent)]
    Etcd(#[from] etcd::EtcdError),
    /// A blocking task panicked or was cancelled.
    #[error("database task failed: {0}")]
    Task(String),
    /// Another process holds the database's lock.
    #[error(
        "database {database} is in use by another coordinator (pid {}, holding the lock {lock}); stop it first: two coordinators on one store would both run every repair step",
        holder.map(|p| p.to_string()).unwrap_or_else(|| "unknown".into())
    )]
    Locked {
        /// The database file.
        database: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The holder's pid, as written in the lock file.
        holder: Option<u32>,
    },
    /// The database file is locked by another process that reached it under another name
    /// (a symlink or a hard link: the lock file beside each name is a different one).
    #[error(
        "database {database} is in use by another coordinator (pid {}) that opened the same file under another name (a symlink or hard link to it); stop it first, and give every coordinator the same path: two coordinators on one store would both run every repair step",
        holder.map(|p| p.to_string()).unwrap_or_else(|| "unknown".into())
    )]
    HeldUnderAnotherName {
        /// The database file, as configured here.
        database: PathBuf,
        /// The holder's pid, from `/proc/locks`.
        holder: Option<u32>,
    },
    /// The directory meant to hold the database does not exist.
    #[error(
        "database {database}: the directory {directory} is missing; create it (owned by the coordinator's user) or fix `database`"
    )]
    DirectoryMissing {
        /// The database file.
        database: PathBuf,
        /// Its missing directory.
        directory: PathBuf,
    },
    /// The database, one of its files or its directory cannot be written.
    #[error(
        "{path} is not writable ({reason}); the coordinator must be able to write its database, the database's -wal and -shm files and its lock file"
    )]
    NotWritable {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

impl StoreError {
    /// True when the store itself failed ([`is_storage_failure`]): [`StoreHealth`] has
    /// counted it and says so in the log, so a caller need not log it again.
    pub fn is_storage_failure(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => is_storage_failure(source),
            StoreError::Etcd(e) => e.is_storage_failure(),
            _ => false,
        }
    }

    /// True for transient conditions (busy/locked database); false for corruption, schema
    /// and programming errors.
    pub fn is_retriable(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            StoreError::Locked { .. } | StoreError::HeldUnderAnotherName { .. } => true,
            StoreError::Etcd(e) => e.is_retriable(),
            _ => false,
        }
    }

    /// True when an operator must fix the path, its permissions or the file it names (exit
    /// code 64): starting again as it is cannot help.
    pub fn is_config(&self) -> bool {
        match self {
            StoreError::DirectoryMissing { .. }
            | StoreError::NotWritable { .. }
            | StoreError::NotOurs { .. }
            | StoreError::TooNew { .. } => true,
            StoreError::Sqlite { source, .. } => {
                source.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase)
            }
            StoreError::Etcd(e) => e.is_config(),
            _ => false,
        }
    }
}
