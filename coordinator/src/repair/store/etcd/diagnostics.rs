//! Diagnostics bundles on etcd: [`DiagnosticsStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `diagnostics/write-index`: the next bundle id;
//! - `diagnostics/machines/<address>/<id>`: a bundle's summary (entry, request, time, size,
//!   the parts cut short), what `diagnostics list` reads without the contents;
//! - `diagnostics/entries/<index>/<id>`: the same summary, listed by repair entry;
//! - `diagnostics/content/<id>`: `{"content": …}`, the bundle's text (up to the agent's
//!   256 KiB), kept apart so that no listing reads contents;
//! - `diagnostics/requests/<request id>`: `{"id": …, "address": …}`, so a resend of the
//!   same agent request replaces its bundle.
//!
//! A new bundle and the pruning of the machine's oldest past [`KEPT_PER_MACHINE`] are one
//! transaction, appended with the write index's compare; a replacement compares the
//! request key's `mod_revision`. At 20 bundles of 256 KiB a machine holds about 5 MiB, each
//! value well under etcd's 1.5 MiB request limit ([`crate::store::etcd::kv::MAX_VALUE_BYTES`]).

use protocol::admin::diagnostics::{DiagnosticsRecord, DiagnosticsSummary};
use serde::{Deserialize, Serialize};

use super::err;
use crate::repair::store::diagnostics::{DiagnosticsStore, KEPT_PER_MACHINE, NewBundle};
use crate::store::StoreError;
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Sequence, key_level};

const MACHINES: &str = "diagnostics/machines";
const ENTRIES: &str = "diagnostics/entries";
const CONTENT: &str = "diagnostics/content";
const REQUESTS: &str = "diagnostics/requests";

/// How often a replacement that lost a race on its request key is tried again.
const ATTEMPTS: u32 = 8;

fn ids() -> Sequence {
    Sequence::new("diagnostics/write-index", "diagnostics/ids")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SummaryValue {
    id: u64,
    address: String,
    entry: u64,
    request_id: String,
    collected_ms: i64,
    bytes: u64,
    #[serde(default)]
    truncated_parts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ContentValue {
    content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RequestValue {
    id: u64,
    address: String,
}

fn machine_dir(address: &str) -> String {
    format!("{MACHINES}/{}", key_level(address))
}

fn summary_key(address: &str, id: u64) -> String {
    format!("{}/{}", machine_dir(address), num_key(id))
}

fn entry_key(entry: u64, id: u64) -> String {
    format!("{ENTRIES}/{}/{}", num_key(entry), num_key(id))
}

fn content_key(id: u64) -> String {
    format!("{CONTENT}/{}", num_key(id))
}

fn request_key(request: &str) -> String {
    format!("{REQUESTS}/{}", key_level(request))
}

impl SummaryValue {
    fn of(b: &NewBundle, id: u64) -> Self {
        Self {
            id,
            address: b.address.clone(),
            entry: b.entry,
            request_id: b.request_id.clone(),
            collected_ms: b.collected_ms,
            bytes: u64::try_from(b.bytes).unwrap_or(0),
            truncated_parts: b
                .truncated_parts
                .split('\n')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    fn summary(self) -> DiagnosticsSummary {
        DiagnosticsSummary {
            id: self.id,
            address: self.address,
            entry_index: self.entry,
            collected_unix_ms: self.collected_ms,
            bytes: self.bytes,
            truncated_parts: self.truncated_parts,
        }
    }
}

impl EtcdStore {
    /// Replaces the bundle a resend of its request names; `None` when the request has no
    /// bundle kept (new, or pruned).
    async fn replace_bundle(&self, b: &NewBundle) -> Result<Option<u64>, EtcdError> {
        for _ in 0..ATTEMPTS {
            let Some(req) = self
                .kv_get::<RequestValue>(&request_key(&b.request_id))
                .await?
            else {
                return Ok(None);
            };
            let id = req.value.id;
            let old = self
                .kv_get::<SummaryValue>(&summary_key(&req.value.address, id))
                .await?;
            let Some(old) = old else {
                return Ok(None);
            };
            let mut s = SummaryValue::of(b, id);
            // The bundle stays where it was kept.
            s.address = old.value.address.clone();
            s.entry = old.value.entry;
            let done = self
                .txn()
                .if_mod_revision(&request_key(&b.request_id), req.mod_revision)
                .if_mod_revision(&summary_key(&s.address, id), old.mod_revision)
                .put(&summary_key(&s.address, id), &s)?
                .put(&entry_key(s.entry, id), &s)?
                .put(
                    &content_key(id),
                    &ContentValue {
                        content: b.content.clone(),
                    },
                )?
                .commit()
                .await?;
            if done {
                return Ok(Some(id));
            }
        }
        Err(EtcdError::Contended {
            key: self.key(&request_key(&b.request_id)),
            attempts: ATTEMPTS,
        })
    }
}

impl DiagnosticsStore for EtcdStore {
    async fn keep_bundle(&self, b: NewBundle) -> Result<u64, StoreError> {
        if let Some(id) = self.replace_bundle(&b).await.map_err(err)? {
            return Ok(id);
        }
        let kept = self
            .kv_list::<SummaryValue>(&machine_dir(&b.address))
            .await
            .map_err(err)?;
        // With the new one the machine may hold KEPT_PER_MACHINE: the oldest beyond go.
        let keep = usize::try_from(KEPT_PER_MACHINE).unwrap_or(1).max(1);
        let drop_n = (kept.len() + 1).saturating_sub(keep);
        let content = ContentValue {
            content: b.content.clone(),
        };
        let id = ids()
            .append(self, |id, mut txn| {
                let s = SummaryValue::of(&b, id);
                txn = txn
                    .if_absent(&request_key(&b.request_id))
                    .put(&summary_key(&b.address, id), &s)?
                    .put(&entry_key(b.entry, id), &s)?
                    .put(&content_key(id), &content)?
                    .put(
                        &request_key(&b.request_id),
                        &RequestValue {
                            id,
                            address: b.address.clone(),
                        },
                    )?;
                for (_, old) in kept.iter().take(drop_n) {
                    let o = &old.value;
                    txn = txn
                        .delete(&summary_key(&o.address, o.id))
                        .delete(&entry_key(o.entry, o.id))
                        .delete(&content_key(o.id))
                        .delete(&request_key(&o.request_id));
                }
                Ok(txn)
            })
            .await
            .map_err(err)?;
        Ok(id)
    }

    async fn bundles_of(&self, address: String) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        let mut out: Vec<DiagnosticsSummary> = self
            .kv_list::<SummaryValue>(&machine_dir(&address))
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| v.value.summary())
            .collect();
        out.reverse();
        Ok(out)
    }

    async fn bundles_for_entry(&self, index: u64) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        Ok(self
            .kv_list::<SummaryValue>(&format!("{ENTRIES}/{}", num_key(index)))
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| v.value.summary())
            .collect())
    }

    async fn bundle(
        &self,
        address: String,
        id: Option<u64>,
    ) -> Result<Option<DiagnosticsRecord>, StoreError> {
        let summary = match id {
            Some(id) => self
                .kv_get::<SummaryValue>(&summary_key(&address, id))
                .await
                .map_err(err)?
                .map(|v| v.value),
            None => self
                .kv_list_last::<SummaryValue>(&machine_dir(&address), 1)
                .await
                .map_err(err)?
                .into_iter()
                .next()
                .map(|(_, v)| v.value),
        };
        let Some(summary) = summary else {
            return Ok(None);
        };
        let content = self
            .kv_get::<ContentValue>(&content_key(summary.id))
            .await
            .map_err(err)?
            .map(|v| v.value.content)
            .unwrap_or_default();
        Ok(Some(DiagnosticsRecord {
            summary: summary.summary(),
            content,
        }))
    }
}
