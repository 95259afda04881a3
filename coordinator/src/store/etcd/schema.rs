//! The schema under a prefix: one key holding its version, and the steps that bring an
//! older store up to this coordinator's version.
//!
//! `<prefix>/schema` holds `{"version": N, "by": "fleetmend-coordinator 0.1.0", "at_ms": …}`.
//! An empty prefix is version 0. Each step ([`MIGRATIONS`]) takes the store from version
//! `n - 1` to `n`; it must be idempotent (creates are create-if-absent), because the version
//! key moves only after the step, with a compare-and-swap on its `mod_revision`: two
//! coordinators migrating at once both run the step and only one moves the version, and a
//! coordinator killed between the step and the version runs the step again. A store newer
//! than this coordinator is refused ([`EtcdError::TooNew`]), and a prefix that holds keys but
//! no version belongs to another program ([`EtcdError::NotOurs`]) and is not written.
//!
//! Version 1 creates the store's identity (`<prefix>/identity`): the random id power request
//! ids start with, as SQLite's migration 0003 does, so that two stores never send a gateway
//! the same request id.
//!
//! Version 2 keys the decision journal by each line's latest sequence number
//! (`remediation/lines/<seq>`) instead of a write index (`remediation/journal/<id>` and
//! `remediation/journal-index`), so that its reads stop at what they need: every old line
//! moves, a page at a time, each page's puts and deletes in one transaction.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{EtcdError, EtcdStore};
use crate::store::{IdentityStore, StoreError};

/// The schema version key (relative to the prefix).
pub const SCHEMA_KEY: &str = "schema";
/// The store identity key (relative to the prefix).
pub const IDENTITY_KEY: &str = "identity";

/// The keys the migration steps write before the version moves (relative to the prefix):
/// found under a prefix without a version, they mean another coordinator is migrating it,
/// not that another program owns it.
const STEP_KEYS: &[&str] = &[IDENTITY_KEY];

/// What the schema key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaRecord {
    /// The schema version.
    pub version: u32,
    /// The program that wrote it (for an operator reading it with `etcdctl`).
    #[serde(default)]
    pub by: String,
    /// When it was written (milliseconds since the Unix epoch).
    #[serde(default)]
    pub at_ms: i64,
}

/// What the identity key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRecord {
    /// 32 lower-case hex digits, made once.
    pub store_id: String,
    /// When it was made (milliseconds since the Unix epoch).
    pub created_ms: i64,
}

/// One step: brings a store from the version before it to its own. Idempotent.
pub type Step = for<'a> fn(&'a EtcdStore) -> BoxFuture<'a, Result<(), EtcdError>>;

/// The steps, in order: `(version, name, step)`. Append only.
pub const MIGRATIONS: &[(u32, &str, Step)] = &[
    (1, "store identity", v1_identity),
    (2, "journal keyed by sequence number", v2_journal_by_seq),
];

/// The newest schema version this coordinator knows.
pub fn known() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn v1_identity(store: &EtcdStore) -> BoxFuture<'_, Result<(), EtcdError>> {
    Box::pin(async move {
        let id = IdentityRecord {
            store_id: format!("{:032x}", rand::random::<u128>()),
            created_ms: now_ms(),
        };
        // Create-if-absent: a step run twice keeps the first identity.
        store.kv_create(IDENTITY_KEY, &id).await.map(drop)
    })
}

/// Version 2's layouts: the old journal directory and index, the new directory.
const V1_JOURNAL: &str = "remediation/journal";
const V1_JOURNAL_INDEX: &str = "remediation/journal-index";
const V2_LINES: &str = "remediation/lines";
const V2_HEAD: &str = "remediation/journal-head";

fn v2_journal_by_seq(store: &EtcdStore) -> BoxFuture<'_, Result<(), EtcdError>> {
    Box::pin(async move {
        // Each round moves the oldest 60 lines left (two operations each, under etcd's 128
        // per transaction); a step cut short and run again moves what is left. The head, the
        // largest sequence number, goes with the last round (a step run again after all
        // moved leaves none: the journal then finds its last key once).
        let mut head = 0;
        loop {
            let page = store
                .scan(V1_JOURNAL, None)
                .next::<serde_json::Value>(60)
                .await?;
            if page.is_empty() {
                break;
            }
            let mut txn = store.txn();
            for (key, v) in &page {
                let old = format!("{V1_JOURNAL}/{key}");
                let seq = v.value["seq"].as_u64().ok_or_else(|| EtcdError::Json {
                    key: store.key(&old),
                    source: <serde_json::Error as serde::de::Error>::custom(
                        "a journal line without its sequence number (\"seq\")",
                    ),
                })?;
                head = head.max(seq);
                txn = txn
                    .delete(&old)
                    .put(&format!("{V2_LINES}/{}", super::kv::num_key(seq)), &v.value)?;
            }
            txn.commit().await?;
        }
        let mut txn = store.txn().delete(V1_JOURNAL_INDEX);
        if head > 0 {
            txn = txn.put(V2_HEAD, &head)?;
        }
        txn.commit().await.map(drop)
    })
}

/// The version the store under the prefix is at (0 when the prefix is empty), and the
/// schema key's `mod_revision` (0 when absent). Refuses a prefix another program uses.
pub async fn version(store: &EtcdStore) -> Result<(u32, i64), EtcdError> {
    match store.kv_get::<SchemaRecord>(SCHEMA_KEY).await? {
        Some(v) => Ok((v.value.version, v.mod_revision)),
        None => {
            // Anything under the prefix without a version is someone else's, except what
            // a migration step writes before the version moves: another coordinator
            // migrating the same empty prefix at this moment (the steps are idempotent).
            if let Some(example) = store
                .kv_keys("")
                .await?
                .into_iter()
                .find(|k| !STEP_KEYS.contains(&k.as_str()))
            {
                return Err(EtcdError::NotOurs {
                    prefix: store.prefix().to_string(),
                    key: store.key(SCHEMA_KEY),
                    example: store.key(&example),
                });
            }
            Ok((0, 0))
        }
    }
}

/// Brings the store to [`known`] with [`MIGRATIONS`]; the version it ends at.
pub async fn ensure(store: &EtcdStore) -> Result<u32, EtcdError> {
    ensure_with(store, MIGRATIONS).await
}

/// Brings the store to the last of `steps`' versions; the version it ends at. Each step
/// runs, then the version moves with a compare-and-swap; a lost swap (another coordinator
/// migrated) reads the version again.
pub async fn ensure_with(store: &EtcdStore, steps: &[(u32, &str, Step)]) -> Result<u32, EtcdError> {
    let target = steps.last().map(|m| m.0).unwrap_or(0);
    // Each round either moves the version one step or finds another coordinator moved it,
    // so `2 × steps + 2` rounds are enough unless someone keeps rewriting the key.
    for _ in 0..(2 * steps.len() + 2) {
        let (found, rev) = version(store).await?;
        if found > target {
            return Err(EtcdError::TooNew {
                prefix: store.prefix().to_string(),
                found,
                known: target,
            });
        }
        if found == target {
            return Ok(found);
        }
        let Some((to, name, step)) = steps.iter().find(|m| m.0 > found) else {
            return Ok(found);
        };
        step(store).await?;
        let rec = SchemaRecord {
            version: *to,
            by: format!("fleetmend-coordinator {}", env!("CARGO_PKG_VERSION")),
            at_ms: now_ms(),
        };
        if store.kv_put_if(SCHEMA_KEY, &rec, rev).await? {
            tracing::info!(
                prefix = store.prefix(),
                from = found,
                to,
                step = name,
                "etcd store migrated"
            );
        }
    }
    Err(EtcdError::Contended {
        key: store.key(SCHEMA_KEY),
        attempts: (2 * steps.len() + 2) as u32,
    })
}

/// The store's identity (32 lower-case hex digits). Fails when it is missing: without it
/// request ids could collide with another store's, so nothing may be sent.
pub async fn identity(store: &EtcdStore) -> Result<String, EtcdError> {
    match store.kv_get::<IdentityRecord>(IDENTITY_KEY).await? {
        Some(v) => Ok(v.value.store_id),
        None => Err(EtcdError::Json {
            key: store.key(IDENTITY_KEY),
            source: <serde_json::Error as serde::de::Error>::custom(
                "the store identity is missing (a store not migrated to version 1)",
            ),
        }),
    }
}

impl IdentityStore for EtcdStore {
    async fn identity(&self) -> Result<String, StoreError> {
        Ok(identity(self).await?)
    }

    /// A placeholder: 0, always. On etcd the epoch is the leader key's create revision,
    /// which the election (issue 31, the `ha` work) yields and feeds into
    /// [`crate::lease_token::LeaseToken::set`]; until then a coordinator on etcd sends its
    /// identity with epoch 0, which every gateway and agent accepts (nothing older exists)
    /// and which any create revision (at least 1) supersedes. Not a counter here: a counter
    /// could grow past the revisions the election will use and get the real leader refused.
    async fn next_epoch(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

/// The marker key (relative to the prefix) of a copy under way.
pub const MARKER_KEY: &str = "migration";

/// What the marker key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerRecord {
    /// The SQLite file being copied.
    pub from: String,
    /// Its store identity.
    pub source_store_id: String,
    /// When the copy started (Unix ms).
    pub started_ms: i64,
}

/// Refuses a store whose migration has not finished ([`EtcdError::MigrationUnfinished`]):
/// called by [`EtcdStore::connect`] (`coordinator migrate` writes the marker, `store/migrate/`), so no coordinator starts on half a copy.
pub async fn refuse_unfinished(store: &EtcdStore) -> Result<(), EtcdError> {
    match store.kv_get::<MarkerRecord>(MARKER_KEY).await? {
        None => Ok(()),
        Some(m) => Err(EtcdError::MigrationUnfinished {
            prefix: store.prefix().to_string(),
            key: store.key(MARKER_KEY),
            from: m.value.from,
        }),
    }
}
