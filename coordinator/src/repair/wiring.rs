//! How the app starts the repair queue: load the `repair:` file, start the engine over the
//! coordinator's store, and connect it to the fleet's live health and to `/metrics`.
//!
//! The app passes the drainer and the power control it has; this module does not choose a
//! Kubernetes client or a gateway.

use std::path::Path;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::command::{AgentHealth, AgentHealthView};
use super::engine::{RepairDeps, RepairQueue};
use super::load::{RepairConfigError, load_file};
use super::metrics::RepairMetrics;
use crate::agent_link::AgentActions;
use crate::clock::Clock;
use crate::fleet::Fleet;
use crate::gateway::PowerControl;
use crate::k8s::Drainer;
use crate::metrics::MetricsSource;
use crate::store::{Store, StoreError};

/// Why the repair queue could not start.
#[derive(Debug, thiserror::Error)]
pub enum RepairStartError {
    /// The `repair:` file is unusable (exit code 64).
    #[error(transparent)]
    Config(#[from] RepairConfigError),
    /// The queue could not be loaded from the database.
    #[error("repair queue: {0}")]
    Store(#[from] StoreError),
}

impl RepairStartError {
    /// True when the configuration must be fixed.
    pub fn is_config(&self) -> bool {
        matches!(self, RepairStartError::Config(_))
    }

    /// True when starting again later may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            RepairStartError::Config(_) => false,
            RepairStartError::Store(e) => e.is_retriable(),
        }
    }
}

/// `@agent-healthy` reads the fleet's live health: the current unbroken run of all-ok
/// reports (reset by a reboot or a goodbye) and the boot id.
impl AgentHealthView for Fleet {
    fn agent_health(&self, address: &str) -> Option<AgentHealth> {
        let live = self.live(address)?;
        Some(AgentHealth {
            boot_id: live.boot_id.unwrap_or_default(),
            last_report: live.last_report_at?,
            ok_since: live.healthy_since,
        })
    }
}

impl MetricsSource for RepairMetrics {
    fn render(&self, out: &mut String) {
        out.push_str(&RepairMetrics::render(self));
    }
}

/// Loads the repair configuration at `path` and starts the engine. The engine stops when
/// `shutdown` is cancelled (or the last [`RepairQueue`] handle is dropped); a command still
/// running then is killed and runs again after a restart. Join the returned handle to know
/// it has stopped.
#[allow(clippy::too_many_arguments)]
pub async fn start_for_app(
    path: &Path,
    store: Store,
    clock: Arc<dyn Clock>,
    fleet: Arc<Fleet>,
    drainer: Arc<dyn Drainer>,
    power: Arc<dyn PowerControl>,
    actions: Arc<dyn AgentActions>,
    shutdown: CancellationToken,
) -> Result<(RepairQueue, JoinHandle<()>), RepairStartError> {
    let loaded = load_file(path)?;
    let mut deps = RepairDeps::new(store, Arc::new(loaded.config), clock, drainer, power, fleet);
    deps.actions = actions;
    let (queue, join) = RepairQueue::start(deps, shutdown).await?;
    tracing::info!(file = %path.display(), "repair queue started");
    Ok((queue, join))
}
