//! Diagnostics bundles kept with repair entries, as state: [`DiagnosticsStore`].
//!
//! Bundles are bounded by the agent (256 KiB by default); a store keeps the newest
//! [`KEPT_PER_MACHINE`] per machine, so a machine repaired again and again cannot fill it.

use std::future::Future;

use protocol::admin::diagnostics::{DiagnosticsRecord, DiagnosticsSummary};

use crate::store::{Store, StoreError, dispatch};

/// Bundles kept per machine: enough to compare the last few repairs of a flaky machine,
/// at most ~5 MiB per machine with the agent's default limit.
pub const KEPT_PER_MACHINE: i64 = 20;

/// One bundle to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBundle {
    /// The repair entry whose step collected it.
    pub entry: u64,
    /// The machine.
    pub address: String,
    /// The agent request that brought it: a resend of the same request replaces it.
    pub request_id: String,
    /// When it arrived (Unix ms).
    pub collected_ms: i64,
    /// Its size as the agent counted it.
    pub bytes: i64,
    /// The parts the agent cut short, one per line.
    pub truncated_parts: String,
    /// The rendered text.
    pub content: String,
}

/// What diagnostics bundles need of a store.
pub trait DiagnosticsStore {
    /// Keeps `bundle` (replacing the one of the same request) and drops the machine's
    /// bundles past the newest [`KEPT_PER_MACHINE`], in one transaction; returns its id.
    fn keep_bundle(
        &self,
        bundle: NewBundle,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The bundles of `address`, newest first.
    fn bundles_of(
        &self,
        address: String,
    ) -> impl Future<Output = Result<Vec<DiagnosticsSummary>, StoreError>> + Send;

    /// The bundles of entry `index`, oldest first.
    fn bundles_for_entry(
        &self,
        index: u64,
    ) -> impl Future<Output = Result<Vec<DiagnosticsSummary>, StoreError>> + Send;

    /// Bundle `id` of `address`, or the newest of `address`.
    fn bundle(
        &self,
        address: String,
        id: Option<u64>,
    ) -> impl Future<Output = Result<Option<DiagnosticsRecord>, StoreError>> + Send;
}

impl DiagnosticsStore for Store {
    async fn keep_bundle(&self, bundle: NewBundle) -> Result<u64, StoreError> {
        dispatch!(self, b => b.keep_bundle(bundle).await)
    }

    async fn bundles_of(&self, address: String) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        dispatch!(self, b => b.bundles_of(address).await)
    }

    async fn bundles_for_entry(&self, index: u64) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        dispatch!(self, b => b.bundles_for_entry(index).await)
    }

    async fn bundle(
        &self,
        address: String,
        id: Option<u64>,
    ) -> Result<Option<DiagnosticsRecord>, StoreError> {
        dispatch!(self, b => b.bundle(address, id).await)
    }
}

/// The store tests every backend of [`DiagnosticsStore`] must pass, each on a new, empty
/// store.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;

    fn new(entry: u64, address: &str, request: &str, content: &str, truncated: &str) -> NewBundle {
        NewBundle {
            entry,
            address: address.into(),
            request_id: request.into(),
            collected_ms: 5,
            bytes: content.len() as i64,
            truncated_parts: truncated.into(),
            content: content.into(),
        }
    }

    /// Bundles are kept, replaced on a resend, listed and bounded per machine.
    pub async fn kept_listed_replaced_on_resend_and_bounded_per_machine(s: &impl DiagnosticsStore) {
        let a = s
            .keep_bundle(new(7, "10.0.0.1", "r1", "one", "p"))
            .await
            .unwrap();
        let again = s
            .keep_bundle(new(7, "10.0.0.1", "r1", "uno", ""))
            .await
            .unwrap();
        assert_eq!(a, again, "a resend replaces its bundle");
        let listed = s.bundles_of("10.0.0.1".into()).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].entry_index, listed[0].bytes), (7, 3));
        let got = s.bundle("10.0.0.1".into(), None).await.unwrap().unwrap();
        assert_eq!(got.content, "uno");
        for i in 0..(KEPT_PER_MACHINE + 5) {
            s.keep_bundle(new(7, "10.0.0.1", &format!("m{i}"), "x", "journal kubelet"))
                .await
                .unwrap();
        }
        let listed = s.bundles_of("10.0.0.1".into()).await.unwrap();
        assert_eq!(listed.len() as i64, KEPT_PER_MACHINE);
        assert_eq!(listed[0].truncated_parts, ["journal kubelet"]);
        assert!(listed[0].id > listed[1].id, "newest first");
        assert!(
            s.bundle("10.0.0.1".into(), Some(a))
                .await
                .unwrap()
                .is_none()
        );
        assert!(s.bundle("10.0.0.2".into(), None).await.unwrap().is_none());
        let of_entry = s.bundles_for_entry(7).await.unwrap();
        assert_eq!(of_entry.len() as i64, KEPT_PER_MACHINE);
        assert!(of_entry[0].id < of_entry[1].id, "oldest first");
    }

    /// Bundles at the agent's size limit (256 KiB, journal text with its newlines and
    /// tabs), twenty of them for one machine, are kept and read back whole.
    pub async fn bundles_at_the_agents_limit_are_kept_whole(s: &impl DiagnosticsStore) {
        let line = "Nov 28 04:06:42 n1 kubelet[812]:\tE1128 \"PLEG is not healthy\" pleg=x\n";
        let content: String = line.repeat(256 * 1024 / line.len());
        let mut last = 0;
        for i in 0..KEPT_PER_MACHINE {
            last = s
                .keep_bundle(new(9, "10.0.0.3", &format!("big{i}"), &content, ""))
                .await
                .unwrap();
        }
        let got = s
            .bundle("10.0.0.3".into(), Some(last))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.content.len(), content.len());
        assert!(got.content == content, "read back as written");
        assert_eq!(
            s.bundles_of("10.0.0.3".into()).await.unwrap().len() as i64,
            KEPT_PER_MACHINE
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::kept_listed_replaced_on_resend_and_bounded_per_machine(&store).await;
        super::conformance::bundles_at_the_agents_limit_are_kept_whole(&store).await;
    }
}
