//! `coordinator migrate --from-sqlite FILE`: moves a SQLite store into the etcd store the
//! configuration names (`[store] backend = "etcd"`), area by area, and says what it copied.
//!
//! The rules it keeps (`docs/operations.md`, "Moving a store to etcd"):
//! - **The source is only read**, under its exclusive lock: a coordinator running on the
//!   file is refused ([`StoreError::Locked`]), and none can start on it while the copy runs.
//! - **The target must be empty**: a prefix holding anything but a schema version and an
//!   identity is refused, naming what it holds. There is no `--force`: overwriting a store
//!   another coordinator may act on is never what an operator means; delete the prefix
//!   (`etcdctl del --prefix`) or choose another `[store] prefix`.
//! - **A new identity.** Entries and fence flows keep their indexes and ids, so the etcd
//!   store is given a store identity of its own, never the SQLite file's: every power request
//!   id it makes is new to every gateway, and the SQLite file, if ever started again, can
//!   never send an id the etcd store sent (nor the other way round). A power step the
//!   source shows in flight is sent again under the new id, which powering off or on
//!   tolerates, exactly as after `coordinator restore`.
//! - **Nothing half-done is acted on**: a marker key (`<prefix>/migration`) is written before
//!   the first area and deleted after the last; while it is there a coordinator refuses to
//!   start on the prefix ([`schema::refuse_unfinished`]), and a rerun of the same command deletes
//!   what the cut-short copy wrote and copies again from the untouched source.
//!
//! Reads go through each area's trait on the SQLite store where the trait shows everything
//! the area holds, and through SQL where it does not (the write indexes, the step links, a
//! bundle's request id, the journal's stored decisions); writes go through each area's
//! trait on etcd, except for the repair queue and fence flows, whose drivers take them under
//! their own indexes and ids ([`EtcdStore::import_repair_queue`],
//! [`EtcdStore::import_fence_flow`]).
//!
//! Not here: the copy of etcd back to SQLite (never needed to go back: the SQLite file is
//! kept as it was), a live migration (the coordinator is stopped for it).

mod areas;
mod verify;

pub use verify::{Dump, difference, dump};

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::etcd::schema::{
    self, IDENTITY_KEY, IdentityRecord, MARKER_KEY, MarkerRecord, SCHEMA_KEY,
};
use super::etcd::{EtcdError, EtcdSettings, EtcdStore};
use super::{IdentityStore, Sqlite, StoreError};

/// Why a migration was not made, or not finished.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The command line or the configuration is at fault.
    #[error("{0}")]
    BadInput(String),
    /// The target prefix already holds a store.
    #[error(
        "the etcd prefix {prefix} already holds {count} key(s) of a store (e.g. {examples}); \
         `coordinator migrate` only copies into an empty prefix and never overwrites: delete \
         them (`etcdctl del --prefix {prefix}/`) if that store is not wanted, or set another \
         `[store] prefix`"
    )]
    NotEmpty {
        /// The prefix.
        prefix: String,
        /// How many keys besides the schema version and the identity.
        count: usize,
        /// A few of them.
        examples: String,
    },
    /// Copying an area failed; what was written is deleted by a rerun.
    #[error(
        "copying {area} into etcd failed: {source}. The SQLite file was only read and is \
         unchanged; the etcd prefix holds part of a copy, and no coordinator starts on it \
         until `coordinator migrate --from-sqlite {from}` is run again and finishes (the rerun \
         starts the copy over)"
    )]
    Area {
        /// The area.
        area: &'static str,
        /// The SQLite file.
        from: String,
        /// Cause.
        source: Box<StoreError>,
    },
    /// The copy, read back, differs from the source.
    #[error(
        "the copy in etcd differs from {from}: {difference}. The SQLite file is unchanged; \
         no coordinator starts on the etcd prefix until a rerun of `coordinator migrate \
         --from-sqlite {from}` finishes (it starts the copy over)"
    )]
    Differs {
        /// The SQLite file.
        from: String,
        /// The first difference.
        difference: String,
    },
    /// A store failed outside an area's copy.
    #[error(transparent)]
    Store(Box<StoreError>),
}

impl From<StoreError> for MigrateError {
    fn from(e: StoreError) -> Self {
        MigrateError::Store(Box::new(e))
    }
}

impl From<EtcdError> for MigrateError {
    fn from(e: EtcdError) -> Self {
        MigrateError::Store(Box::new(e.into()))
    }
}

impl MigrateError {
    /// True when the operator's input or configuration is at fault (exit 64).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Self::BadInput(_) | Self::NotEmpty { .. } => true,
            Self::Store(e) => e.is_config(),
            Self::Area { .. } | Self::Differs { .. } => false,
        }
    }
}

/// What was copied of one area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Copied {
    /// The area.
    pub area: &'static str,
    /// Its main items (entries, flows, machines, …).
    pub items: u64,
    /// What they are, and what came with them.
    pub detail: String,
}

/// The outcome of [`migrate`].
#[derive(Debug, Clone, Serialize)]
pub struct MigrateReport {
    /// The SQLite file.
    pub from: PathBuf,
    /// Its identity.
    pub source_store_id: String,
    /// The etcd endpoints.
    pub endpoints: String,
    /// The key prefix.
    pub prefix: String,
    /// The identity the etcd store was given (never the source's).
    pub store_id: String,
    /// Whether an unfinished copy was found and started over.
    pub restarted: bool,
    /// Per area, in the order copied.
    pub areas: Vec<Copied>,
    /// How long it took.
    pub seconds: f64,
}

impl std::fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "copied {} (store {}) to etcd {} under {} in {:.1} s{}:",
            self.from.display(),
            self.source_store_id,
            self.endpoints,
            self.prefix,
            self.seconds,
            if self.restarted {
                " (an unfinished copy was deleted and made again)"
            } else {
                ""
            }
        )?;
        let width = self.areas.iter().map(|a| a.area.len()).max().unwrap_or(0);
        for a in &self.areas {
            writeln!(f, "  {:width$}  {}", a.area, a.detail)?;
        }
        write!(
            f,
            "the etcd store's identity is {} (new: power request ids never repeat the SQLite \
             store's); the SQLite file is unchanged: keep it as the way back, and start no \
             coordinator on it while the etcd store is in use",
            self.store_id
        )
    }
}

/// Progress of a long copy: `(area, done, of)`.
pub type Progress<'a> = &'a (dyn Fn(&'static str, u64, u64) + Send + Sync);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Copies the SQLite store at `from` into the (empty) etcd store `target` names; see the
/// module's rules. `progress` is called as long areas are copied.
pub async fn migrate(
    from: &Path,
    target: EtcdSettings,
    progress: Progress<'_>,
) -> Result<MigrateReport, MigrateError> {
    let started = Instant::now();
    if !from.is_file() {
        return Err(MigrateError::BadInput(format!(
            "--from-sqlite {}: no such file (name the `database` file of the SQLite \
             coordinator, e.g. /var/lib/fleetmend/coordinator.db)",
            from.display()
        )));
    }
    let path = from.to_path_buf();
    let source = tokio::task::spawn_blocking(move || Sqlite::open_exclusive(&path))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    let source_store_id = source.identity().await?;
    let etcd = EtcdStore::connect_only(target).await?;
    let restarted = prepare_target(&etcd, from).await?;
    let marker = MarkerRecord {
        from: from.display().to_string(),
        source_store_id: source_store_id.clone(),
        started_ms: now_ms(),
    };
    // The version first: a prefix holding only a marker would read as another program's.
    schema::ensure(&etcd).await?;
    if !restarted {
        etcd.kv_create(MARKER_KEY, &marker).await?;
    }
    // A new identity, whatever the prefix held: see the module's rules.
    let store_id = format!("{:032x}", rand::random::<u128>());
    etcd.txn()
        .put(
            IDENTITY_KEY,
            &IdentityRecord {
                store_id: store_id.clone(),
                created_ms: now_ms(),
            },
        )?
        .commit()
        .await?;
    let from_name = from.display().to_string();
    let areas = areas::copy_all(&source, &etcd, progress)
        .await
        .map_err(|(area, source)| MigrateError::Area {
            area,
            from: from_name.clone(),
            source: Box::new(source),
        })?;
    // Read both back through the same traits before calling it done.
    let empty = areas
        .iter()
        .filter(|a| a.items == 0)
        .map(|a| a.area)
        .collect();
    let want = dump(&super::Store::from(source.clone())).await?;
    let got = dump(&super::Store::from(etcd.clone())).await?;
    if let Some(d) = difference(&want, &got, &empty) {
        return Err(MigrateError::Differs {
            from: from_name,
            difference: d,
        });
    }
    etcd.txn().delete(MARKER_KEY).commit().await?;
    Ok(MigrateReport {
        from: from.to_path_buf(),
        source_store_id,
        endpoints: etcd.endpoints().to_string(),
        prefix: etcd.prefix().to_string(),
        store_id,
        restarted,
        areas,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Makes sure the target can take the copy: empty but for a schema version and an
/// identity, or holding an unfinished copy of the same file (deleted here, so the copy
/// starts over; true then). Anything else is refused.
async fn prepare_target(etcd: &EtcdStore, from: &Path) -> Result<bool, MigrateError> {
    let keys = etcd.kv_keys("").await?;
    let marker = etcd.kv_get::<MarkerRecord>(MARKER_KEY).await?;
    if let Some(m) = &marker
        && m.value.from != from.display().to_string()
    {
        return Err(MigrateError::BadInput(format!(
            "the etcd prefix {} holds an unfinished copy of {}, not of {}: finish that one \
             (`coordinator migrate --from-sqlite {}`), or delete the prefix (`etcdctl del \
             --prefix {}/`) to copy another file",
            etcd.prefix(),
            m.value.from,
            from.display(),
            m.value.from,
            etcd.prefix()
        )));
    }
    let kept = |k: &str| k == SCHEMA_KEY || k == IDENTITY_KEY || k == MARKER_KEY;
    let others: Vec<&String> = keys.iter().filter(|k| !kept(k)).collect();
    if marker.is_none() {
        if others.is_empty() {
            return Ok(false);
        }
        return Err(MigrateError::NotEmpty {
            prefix: etcd.prefix().to_string(),
            count: others.len(),
            examples: others
                .iter()
                .take(3)
                .map(|k| etcd.key(k))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // An unfinished copy of this file: every key but the marker, the schema and the
    // identity was written by it.
    let mut dirs: Vec<&str> = others
        .iter()
        .map(|k| k.split('/').next().unwrap_or(k))
        .collect();
    dirs.dedup();
    for d in dirs {
        etcd.kv_delete_dir(d).await?;
        // A top-level key (not a directory) of that name.
        etcd.txn().delete(d).commit().await?;
    }
    Ok(true)
}

/// The etcd store a `[store]` section names, as the target of a migration: refused unless
/// `backend = "etcd"`, since the configuration the coordinator will start with must name
/// the store being filled.
pub fn target_settings(store: &super::config::StoreConfig) -> Result<EtcdSettings, MigrateError> {
    if store.backend != super::config::Backend::Etcd {
        return Err(MigrateError::BadInput(
            "the configuration's [store] backend is \"sqlite\": set backend = \"etcd\" with \
             its endpoints (and prefix, TLS files) first, as the coordinator will run after \
             the move; `coordinator migrate` copies into the store the configuration names"
                .into(),
        ));
    }
    EtcdSettings::configured(store).map_err(|e| match e {
        EtcdError::Config(why) => MigrateError::BadInput(why),
        other => MigrateError::BadInput(other.to_string()),
    })
}
