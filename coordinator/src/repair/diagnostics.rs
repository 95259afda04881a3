//! Diagnostics bundles kept with repair entries: the [`DiagnosticsShelf`] an
//! `@collect-diagnostics` step stores through ([`DiagnosticsStore`] underneath).
//!
//! Bundles are bounded by the agent (256 KiB by default); the store keeps the newest
//! [`KEPT_PER_MACHINE`] per machine, so a machine repaired again and again cannot fill
//! the disk. This module does not ask agents for anything ([`crate::agent_link`] does).

use std::sync::Arc;

use protocol::actions::DiagnosticsBundle;

pub use super::store::diagnostics::KEPT_PER_MACHINE;
use super::store::diagnostics::{DiagnosticsStore, NewBundle};
use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// Where an entry's diagnostics are stored.
#[derive(Clone)]
pub struct DiagnosticsShelf {
    store: Store,
    clock: Arc<dyn Clock>,
    entry: u64,
}

impl std::fmt::Debug for DiagnosticsShelf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiagnosticsShelf")
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl DiagnosticsShelf {
    /// A shelf for entry `entry`.
    pub fn new(store: Store, clock: Arc<dyn Clock>, entry: u64) -> Self {
        Self {
            store,
            clock,
            entry,
        }
    }

    /// Stores `bundle` from the agent of `address` under request `request_id` (replacing
    /// the row of a resend) and returns its id.
    pub async fn keep(
        &self,
        address: &str,
        request_id: &str,
        bundle: &DiagnosticsBundle,
    ) -> Result<u64, StoreError> {
        let row = NewBundle {
            entry: self.entry,
            address: address.to_string(),
            request_id: request_id.to_string(),
            collected_ms: self.clock.now().as_millisecond(),
            bytes: bundle.total_bytes() as i64,
            truncated_parts: bundle
                .parts
                .iter()
                .filter(|p| p.truncated)
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            content: bundle.render(),
        };
        self.store.keep_bundle(row).await
    }
}

#[cfg(test)]
mod tests {
    use protocol::actions::DiagnosticsPart;

    use super::*;
    use crate::clock::SystemClock;

    fn bundle(text: &str, truncated: bool) -> DiagnosticsBundle {
        DiagnosticsBundle {
            parts: vec![DiagnosticsPart {
                name: "journal kubelet".into(),
                content: text.into(),
                truncated,
            }],
            limit_bytes: 1024,
        }
    }

    #[tokio::test]
    async fn kept_listed_replaced_on_resend_and_bounded_per_machine() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let shelf = DiagnosticsShelf::new(store.clone(), Arc::new(SystemClock), 7);
        let a = shelf
            .keep("10.0.0.1", "r1", &bundle("one", true))
            .await
            .unwrap();
        let again = shelf
            .keep("10.0.0.1", "r1", &bundle("uno", false))
            .await
            .unwrap();
        assert_eq!(a, again, "a resend replaces its row");
        let listed = store.bundles_of("10.0.0.1".into()).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].entry_index, 7);
        assert_eq!(listed[0].bytes, 3);
        let got = store
            .bundle("10.0.0.1".into(), None)
            .await
            .unwrap()
            .unwrap();
        assert!(got.content.contains("uno"), "{}", got.content);
        for i in 0..(KEPT_PER_MACHINE + 5) {
            shelf
                .keep("10.0.0.1", &format!("m{i}"), &bundle("x", true))
                .await
                .unwrap();
        }
        let listed = store.bundles_of("10.0.0.1".into()).await.unwrap();
        assert_eq!(listed.len() as i64, KEPT_PER_MACHINE);
        assert_eq!(listed[0].truncated_parts, ["journal kubelet"]);
        assert!(
            store
                .bundle("10.0.0.1".into(), Some(a))
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .bundle("10.0.0.2".into(), None)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            store.bundles_for_entry(7).await.unwrap().len() as i64,
            KEPT_PER_MACHINE
        );
    }
}
