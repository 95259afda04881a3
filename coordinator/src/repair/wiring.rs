//! How the app starts the repair queue: load the `repair:` file, start the engine over the
//! coordinator's store, and connect it to the fleet's live health and to `/metrics`.
//!
//! The app passes the drainer and the power control it has; this module does not choose a
//! Kubernetes client or a gateway. With a cluster ([`FenceWiring`]) it also builds the fence
//! runner (`@fence` and drains of dead nodes run the fence flow) and resumes the flows a
//! previous coordinator left unfinished.

use std::path::Path;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::command::{AgentHealth, AgentHealthView, NoReport};
use super::engine::{RepairDeps, RepairQueue};
use super::fencing::{FenceService, KeepOffOf, NodeLiveness};
use super::load::{RepairConfigError, load_file};
use super::metrics::RepairMetrics;
use crate::agent_link::AgentActions;
use crate::clock::Clock;
use crate::fence::runner::{FenceDeps, FenceError, FenceRunner};
use crate::fleet::Fleet;
use crate::gateway::PowerControl;
use crate::k8s::{Drainer, NodeRelease, NodeViewSource};
use crate::metrics::MetricsSource;
use crate::remediation::RemediationConfig;
use crate::store::{IdentityStore, Store, StoreError};

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

    fn boot_id(&self, address: &str) -> Option<String> {
        self.known_boot_id(address)
    }

    fn is_unreachable(&self, address: &str) -> bool {
        self.machine(address)
            .is_some_and(|m| m.state == crate::health::MachineState::Unreachable)
    }

    /// Reports are kept in memory, but the states they led to are stored: a machine whose
    /// history has none has never reported.
    fn no_report(&self, address: &str) -> NoReport {
        if self.ever_reported(address) {
            NoReport::SinceStart(self.started_at())
        } else {
            NoReport::Never
        }
    }
}

impl MetricsSource for RepairMetrics {
    fn render(&self, out: &mut String) {
        out.push_str(&RepairMetrics::render(self));
    }
}

/// Two-signal death from the fleet's live health and the Kubernetes node view, decided by
/// [`crate::remediation::dead`] with the remediation settings (`lease_stale`).
pub struct FleetLiveness {
    /// The fleet.
    pub fleet: Arc<Fleet>,
    /// The node view and how old it may be.
    pub view: Arc<dyn NodeViewSource>,
    /// Its freshness limit.
    pub max_age: std::time::Duration,
    /// The remediation settings (defaults without `[remediation]`).
    pub config: RemediationConfig,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

impl NodeLiveness for FleetLiveness {
    fn dead(&self, address: &str) -> Option<String> {
        let snapshot = self.view.snapshot();
        let input = crate::remediation::gather::input(
            &self.fleet.snapshot(),
            Some(crate::remediation::gather::ViewFacts {
                snapshot: &snapshot,
                max_age: self.max_age,
            }),
            &[],
            Vec::new(),
            Vec::new(),
            Default::default(),
        );
        crate::remediation::dead(&input, &self.config, address, self.clock.now())
    }
}

/// `[fence]` per machine: its machine type and the gateway its BMC is behind select the
/// overrides ([`crate::config::FenceSection`]).
#[derive(Clone)]
pub struct FencePolicy {
    /// The `[fence]` section.
    pub section: crate::config::FenceSection,
    /// The `[[gateways.targets]]`, to know which gateway serves a machine.
    pub gateways: Vec<crate::gateway::GatewayTarget>,
    /// Machine types and racks.
    pub fleet: Arc<Fleet>,
}

impl FencePolicy {
    /// The machine type and the gateway name of the machine at `address`: the gateway
    /// listing the address, else the one serving its rack (as power requests are routed).
    fn of(&self, address: &str) -> (Option<String>, Option<String>) {
        let record = self.fleet.machine(address).map(|m| m.record);
        let rack = record.as_ref().map(|r| r.rack.as_str());
        let gateway = self
            .gateways
            .iter()
            .find(|g| g.machines.iter().any(|m| m == address))
            .or_else(|| {
                let rack = rack.filter(|r| !r.is_empty())?;
                self.gateways
                    .iter()
                    .find(|g| g.racks.iter().any(|r| r == rack))
            })
            .map(|g| g.name.clone());
        (record.and_then(|r| r.machine_type), gateway)
    }

    /// The time limits of the machine at `address`.
    pub fn timeouts(&self, address: &str) -> crate::fence::flow::FenceTimeouts {
        let (t, g) = self.of(address);
        self.section.timeouts_for(t.as_deref(), g.as_deref())
    }

    /// Whether the machine at `address` stays off after its fence.
    pub fn keep_off(&self, address: &str) -> bool {
        let (t, g) = self.of(address);
        self.section.keep_off_for(t.as_deref(), g.as_deref())
    }
}

/// What fencing needs from a cluster: releasing and restoring Nodes, and which are dead.
pub struct FenceWiring {
    /// Releasing and restoring Nodes.
    pub release: Arc<dyn NodeRelease>,
    /// Which nodes are dead by the two signals.
    pub liveness: Arc<dyn NodeLiveness>,
    /// What the machines' kdump initramfs said: a dumping machine's workload is released
    /// with no power action, and its power cycle waits for "dump done".
    pub kdump: Arc<dyn crate::fence::kdump::KdumpView>,
    /// `[fence]`: time limits per BMC and `keep_off`.
    pub policy: FencePolicy,
    /// Where the flows are counted for `/metrics`.
    pub metrics: Arc<crate::fence::metrics::FenceMetrics>,
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
    fencing: Option<FenceWiring>,
    policy: FencePolicy,
    kdump: Arc<dyn crate::fence::kdump::KdumpView>,
    shutdown: CancellationToken,
) -> Result<(RepairQueue, JoinHandle<()>), RepairStartError> {
    let loaded = load_file(path)?;
    let fence = match fencing {
        Some(w) => {
            let store_id = store.identity().await?;
            let runner = FenceRunner::new(
                store.clone(),
                store_id,
                FenceDeps {
                    power: power.clone(),
                    release: w.release,
                    agents: fleet.clone(),
                    clock: clock.clone(),
                },
            )
            .with_kdump(w.kdump)
            .with_metrics(w.metrics)
            .with_timeouts_of({
                let p = w.policy.clone();
                Arc::new(move |address: &str| p.timeouts(address))
            });
            let keep_off: KeepOffOf = {
                let p = w.policy;
                Arc::new(move |address: &str| p.keep_off(address))
            };
            let service = FenceService::new(
                Arc::new(runner),
                store.clone(),
                clock.clone(),
                drainer.clone(),
                keep_off,
                shutdown.clone(),
            );
            match service.resume_unfinished().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(flows = n, "fence flows resumed"),
                Err(FenceError::Store(e)) => return Err(e.into()),
                Err(e) => tracing::error!(error = %e, "cannot resume fence flows"),
            }
            Some((service, w.liveness))
        }
        None => None,
    };
    let mut deps = RepairDeps::new(store, Arc::new(loaded.config), clock, drainer, power, fleet);
    deps.actions = actions;
    deps.fence = fence;
    deps.keep_off = Some({
        let p = policy.clone();
        Arc::new(move |address: &str| p.keep_off(address))
    });
    deps.fence_timeouts = Some(Arc::new(move |address: &str| policy.timeouts(address)));
    deps.kdump = Some(kdump);
    let (queue, join) = RepairQueue::start(deps, shutdown).await?;
    tracing::info!(file = %path.display(), "repair queue started");
    Ok((queue, join))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::config::{FenceOverride, FenceSection};
    use crate::gateway::GatewayTarget;
    use crate::health::HealthConfig;
    use crate::inventory::{MachineRecord, RecordSource};
    use crate::testing::FakeClock;

    fn gateway(name: &str, racks: &[&str], machines: &[&str]) -> GatewayTarget {
        GatewayTarget {
            name: name.into(),
            address: "127.0.0.1:7444".parse().unwrap(),
            server_name: "gw".into(),
            racks: racks.iter().map(|r| r.to_string()).collect(),
            machines: machines.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[tokio::test]
    async fn a_machines_limits_come_from_its_type_then_the_gateway_that_serves_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let clock = Arc::new(FakeClock::new("2026-01-01T00:00:00Z".parse().unwrap()));
        let fleet = Arc::new(
            Fleet::open(store, clock, HealthConfig::default())
                .await
                .unwrap(),
        );
        let rec = |address: &str, rack: &str, t: &str| MachineRecord {
            address: address.into(),
            hostname: format!("h-{address}"),
            serial: "S".into(),
            rack: rack.into(),
            role: "cs".into(),
            machine_type: Some(t.into()),
            labels: BTreeMap::new(),
            source: RecordSource::Admin,
        };
        fleet
            .upsert(vec![
                rec("10.0.0.1", "r1", "qemu"),
                rec("10.0.0.2", "r1", "big-mem"),
                rec("10.0.0.3", "r1", "qemu"),
                rec("10.0.0.4", "r2", "qemu"),
            ])
            .await
            .unwrap();
        let mut section = FenceSection::default();
        section.gateways.insert(
            "gw-r1".into(),
            FenceOverride {
                off_timeout: secs(90),
                ..Default::default()
            },
        );
        section.gateways.insert(
            "gw-special".into(),
            FenceOverride {
                off_timeout: secs(5),
                ..Default::default()
            },
        );
        section.machine_types.insert(
            "big-mem".into(),
            FenceOverride {
                off_timeout: secs(30),
                on_timeout: secs(300),
                keep_off: Some(true),
                ..Default::default()
            },
        );
        let policy = FencePolicy {
            section,
            gateways: vec![
                gateway("gw-r1", &["r1"], &[]),
                gateway("gw-special", &[], &["10.0.0.3"]),
            ],
            fleet,
        };
        // By rack, by type over the rack's gateway, by address over the rack, no gateway.
        assert_eq!(policy.timeouts("10.0.0.1").off, Duration::from_secs(90));
        assert_eq!(policy.timeouts("10.0.0.1").on, Duration::from_secs(120));
        assert_eq!(policy.timeouts("10.0.0.2").off, Duration::from_secs(30));
        assert_eq!(policy.timeouts("10.0.0.2").on, Duration::from_secs(300));
        assert_eq!(policy.timeouts("10.0.0.3").off, Duration::from_secs(5));
        assert_eq!(policy.timeouts("10.0.0.4").off, Duration::from_secs(60));
        assert_eq!(policy.timeouts("10.9.9.9").off, Duration::from_secs(60));
        assert!(policy.keep_off("10.0.0.2"));
        assert!(!policy.keep_off("10.0.0.1"));
    }

    #[tokio::test]
    async fn an_agent_that_reported_before_a_restart_is_not_said_to_have_never_reported() {
        use protocol::messages::{AgentHello, CheckKind, CheckResult, CheckStatus, HealthReport};
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let clock = Arc::new(FakeClock::new("2026-01-01T00:00:00Z".parse().unwrap()));
        let open = || async {
            Fleet::open(
                Store::open(&db).unwrap(),
                clock.clone(),
                HealthConfig::default(),
            )
            .await
            .unwrap()
        };
        let rec = |address: &str, host: &str| MachineRecord {
            address: address.into(),
            hostname: host.into(),
            serial: "S".into(),
            rack: String::new(),
            role: String::new(),
            machine_type: Some("qemu".into()),
            labels: BTreeMap::new(),
            source: RecordSource::Admin,
        };
        let fleet = open().await;
        fleet
            .upsert(vec![rec("10.0.0.1", "a"), rec("10.0.0.2", "b")])
            .await
            .unwrap();
        let hello = AgentHello {
            hostname: "a".into(),
            serial: "S".into(),
            addresses: vec![],
            agent_version: "0.1".into(),
            boot_id: "b1".into(),
        };
        fleet
            .agent_hello("a", &hello, "10.0.0.1".parse().unwrap())
            .await
            .unwrap();
        let report = HealthReport {
            seq: 1,
            time_unix_ms: 0,
            boot_id: "b1".into(),
            report_interval_ms: 0,
            checks: vec![CheckResult {
                kind: CheckKind::Kubelet,
                subject: "kubelet".into(),
                status: CheckStatus::Ok,
                detail: String::new(),
            }],
        };
        fleet.report("a", report).await.unwrap();
        assert!(fleet.agent_health("10.0.0.1").is_some());
        drop(fleet);

        // Hours later, a new coordinator: reports are memory, the states are not.
        clock.advance(jiff::SignedDuration::from_hours(3));
        let fleet = open().await;
        assert_eq!(fleet.agent_health("10.0.0.1"), None);
        assert_eq!(
            fleet.no_report("10.0.0.1"),
            NoReport::SinceStart(clock.now()),
            "it reported before the restart"
        );
        assert_eq!(
            fleet.no_report("10.0.0.2"),
            NoReport::Never,
            "still uninitialized"
        );
        // Maintenance and back hands it to health checks as `uninitialized`, reports or
        // not: the stored history still says it reported, in this start and the next.
        for state in [Some(crate::health::MachineState::Updating), None] {
            fleet
                .set_admin_state("10.0.0.1", state, "test")
                .await
                .unwrap();
        }
        assert_eq!(
            fleet.machine("10.0.0.1").unwrap().state,
            crate::health::MachineState::Uninitialized
        );
        assert_eq!(
            fleet.no_report("10.0.0.1"),
            NoReport::SinceStart(clock.now())
        );
        drop(fleet);
        clock.advance(jiff::SignedDuration::from_hours(1));
        let fleet = open().await;
        assert_eq!(
            fleet.no_report("10.0.0.1"),
            NoReport::SinceStart(clock.now())
        );
        assert_eq!(fleet.no_report("10.0.0.2"), NoReport::Never);
        assert_eq!(
            fleet.no_report("10.9.9.9"),
            NoReport::Never,
            "no such machine"
        );
    }
}
