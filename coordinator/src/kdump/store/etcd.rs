//! Kdump notices on etcd: [`KdumpStore`] for [`EtcdStore`].
//!
//! `kdump/notices/<address>` holds each machine's last notice as JSON (phase, when the dump
//! started and ended on the coordinator's clock, the crashed boot id, the node's own time,
//! and when it was saved). A new notice replaces the last one with a plain put: the kdump
//! registry is the only writer of a machine's notice, and the last notice wins, as in
//! SQLite's `INSERT OR REPLACE`.

use std::collections::BTreeMap;

use jiff::Timestamp;
use protocol::messages::KdumpPhase;
use serde::{Deserialize, Serialize};

use super::{KdumpRecord, KdumpStore};
use crate::store::StoreError;
use crate::store::etcd::EtcdStore;

const NOTICES: &str = "kdump/notices";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct NoticeRecord {
    address: String,
    phase: KdumpPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    done: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    node_time: Timestamp,
    saved: Timestamp,
}

/// The address as one key level (`%` and `/` escaped).
fn key(address: &str) -> String {
    format!(
        "{NOTICES}/{}",
        address.replace('%', "%25").replace('/', "%2F")
    )
}

impl KdumpStore for EtcdStore {
    async fn save_notice(
        &self,
        address: String,
        record: KdumpRecord,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let rec = NoticeRecord {
            address: address.clone(),
            phase: record.phase,
            started: record.started,
            done: record.done,
            boot_id: record.boot_id,
            node_time: record.node_time,
            saved: now,
        };
        self.txn().put(&key(&address), &rec)?.commit().await?;
        Ok(())
    }

    async fn notices(&self) -> Result<BTreeMap<String, KdumpRecord>, StoreError> {
        Ok(self
            .kv_list::<NoticeRecord>(NOTICES)
            .await?
            .into_iter()
            .map(|(_, v)| {
                let n = v.value;
                (
                    n.address,
                    KdumpRecord {
                        phase: n.phase,
                        started: n.started,
                        done: n.done,
                        boot_id: n.boot_id,
                        node_time: n.node_time,
                    },
                )
            })
            .collect())
    }
}
