//! Kdump notices as state: [`KdumpStore`], each machine's last notice from its kdump
//! initramfs, with one implementation per backend ([`sqlite`], [`etcd`]).

use std::collections::BTreeMap;
use std::future::Future;

use jiff::Timestamp;

use super::KdumpRecord;
use crate::store::{Store, StoreError, dispatch};

pub mod etcd;
pub mod sqlite;

/// What kdump notices need of a store.
///
/// The coordinator keeps every machine's last notice in memory and decides the next record
/// from it (a "done" keeps the "start"'s time); the store only keeps the result, durable
/// before the notice is answered.
pub trait KdumpStore {
    /// Replaces `address`'s notice with `record`, written at `now`.
    fn save_notice(
        &self,
        address: String,
        record: KdumpRecord,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every machine's last notice.
    fn notices(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, KdumpRecord>, StoreError>> + Send;
}

impl KdumpStore for Store {
    async fn save_notice(
        &self,
        address: String,
        record: KdumpRecord,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        dispatch!(self, b => b.save_notice(address, record, now).await)
    }

    async fn notices(&self) -> Result<BTreeMap<String, KdumpRecord>, StoreError> {
        dispatch!(self, b => b.notices().await)
    }
}

/// The store tests every backend of [`KdumpStore`] must pass, each on a new, empty store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;
    use protocol::messages::KdumpPhase;

    /// A notice is kept per machine and the next one replaces it.
    pub async fn the_next_notice_replaces_the_last(s: &impl KdumpStore) {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let start = KdumpRecord {
            phase: KdumpPhase::Start,
            started: Some(t),
            done: None,
            boot_id: Some("b1".into()),
            node_time: t,
        };
        s.save_notice("10.0.0.1".into(), start.clone(), t)
            .await
            .unwrap();
        s.save_notice("10.0.0.2".into(), start.clone(), t)
            .await
            .unwrap();
        let done = KdumpRecord {
            phase: KdumpPhase::Done,
            done: Some(t),
            boot_id: None,
            ..start.clone()
        };
        s.save_notice("10.0.0.1".into(), done.clone(), t)
            .await
            .unwrap();
        let got = s.notices().await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got.get("10.0.0.1"), Some(&done));
        assert_eq!(got.get("10.0.0.2"), Some(&start));
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::the_next_notice_replaces_the_last(&store).await;
    }
}
