//! What the remediation loop ([`super::runner`]), the admin API's door ([`super::admin`])
//! and the sabakan poller share: the handle ([`Remediation`]), the state behind it
//! ([`Shared`]: the store, the clock, the configuration, the operator switches and the last
//! pass's status) and what the loop reads and acts through ([`LoopDeps`]).
//!
//! It holds data only: the loop, the admin requests and the poller each live in their own
//! file and import this one, never each other's.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::admin::remediation::RemediationStatus;
use tokio::sync::{Notify, watch};

use super::config::RemediationConfig;
use super::metrics::RemediationMetrics;
use super::switches::Switches;
use crate::clock::Clock;
use crate::fleet::Fleet;
use crate::k8s::{Drainer, NodeViewSource};
use crate::repair::RepairQueue;
use crate::store::Store;

/// State shared by the loop and the admin handler.
pub(super) struct Shared {
    pub(super) store: Store,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) base: RemediationConfig,
    pub(super) switches: Mutex<Switches>,
    pub(super) last: Mutex<RemediationStatus>,
    pub(super) wake: Notify,
    /// Counts the operator's switch changes; a pass notes the count it started from.
    pub(super) switched: AtomicU64,
    /// The switch count the last finished pass had seen; `None` while the loop does not run.
    pub(super) passed: watch::Sender<Option<u64>>,
    pub(super) metrics: Arc<RemediationMetrics>,
    pub(super) kubernetes: bool,
}

impl Shared {
    pub(super) fn switches(&self) -> std::sync::MutexGuard<'_, Switches> {
        self.switches.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn last(&self) -> std::sync::MutexGuard<'_, RemediationStatus> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Handle to automatic remediation: the admin API's door and the loop's starter. Cheap to
/// clone.
#[derive(Clone)]
pub struct Remediation {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Remediation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remediation").finish_non_exhaustive()
    }
}

/// What the loop reads and acts through.
pub struct LoopDeps {
    /// The registry.
    pub fleet: Arc<Fleet>,
    /// The Kubernetes node view and its freshness limit, with `[kubernetes]`.
    pub view: Option<(Arc<dyn NodeViewSource>, Duration)>,
    /// The repair queue, with `[repair]`; without it every admission is refused.
    pub queue: Option<RepairQueue>,
    /// Where Node Events go ([`crate::k8s::NotANode`] posts none).
    pub events: Arc<dyn Drainer>,
    /// Crash dumps reported by kdump initramfs ([`crate::fence::kdump::NoKdump`]: none).
    pub kdump: Arc<dyn crate::fence::kdump::KdumpView>,
    /// Notified when the node view saw a Node's Ready change ([`crate::k8s::NodeView::changes`]):
    /// a pass then runs [`super::runner::VIEW_CHANGE_DEBOUNCE`] later instead of at the next interval.
    pub view_changed: Option<Arc<Notify>>,
}
