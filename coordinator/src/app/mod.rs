//! Wiring: from a [`Config`] to a running coordinator.
//!
//! [`Bound::open`] does what can fail on a bad configuration before anything is loaded (TLS
//! files, the store, binding the ports) so the binary can report it and exit before it says
//! READY; [`Bound::lead`] takes the lead (at once on SQLite; by election on etcd, answering
//! as a standby meanwhile, [`standby`]) and loads the state and the parts into an [`App`];
//! [`App::run`] serves until the shutdown token fires or the term ends, then stops.
//! [`App::build`] is the two steps in one.
//!
//! Nothing here makes decisions; it starts the parts and connects them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use protocol::Role;
use protocol::transport::{TlsFiles, TlsMaterial};
use tokio_util::sync::CancellationToken;

mod error;
mod inventory;
mod run;
mod standby;

pub use error::AppError;
pub use inventory::{InventoryImport, import_inventory};
pub use run::sweep_period;

use crate::admin::Admin;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::k8s::{Drainer, KubeDrainer, NodeView, NotANode};
use crate::metrics::{Metrics, MetricsSource};
use crate::store::IdentityStore;
use crate::store::{Store, StoreError};

/// A loaded, bound, not yet serving coordinator that leads.
pub struct App {
    /// The configuration.
    pub config: Config,
    /// The database.
    pub store: Store,
    /// The registry.
    pub fleet: Arc<Fleet>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Admin handlers.
    pub admin: Arc<Admin>,
    /// Extra `/metrics` series from other areas.
    pub metrics_sources: Vec<Arc<dyn MetricsSource>>,
    name: String,
    trust_domain: String,
    endpoint: quinn::Endpoint,
    http: Option<tokio::net::TcpListener>,
    /// The node view and its refresh period, with `[kubernetes]`.
    node_view: Option<(NodeView, Duration)>,
    repair_stop: CancellationToken,
    repair_join: Option<tokio::task::JoinHandle<()>>,
    /// The rack gateways, watched while serving ([`crate::gateway::QuicGateways::watch_reach`]).
    gateways: Option<Arc<crate::gateway::QuicGateways>>,
    /// Connected agents' connections, for agent actions.
    links: Arc<crate::agent_link::AgentLinks>,
    tls_reloader: Arc<crate::certs::TlsReloader>,
    /// Automatic remediation and what its loop reads, with `[remediation]`.
    remediation: Option<(
        crate::remediation::Remediation,
        crate::remediation::LoopDeps,
    )>,
    /// Crash-dump notices.
    kdump: Arc<crate::kdump::Kdumps>,
    /// This coordinator's role: always leader with SQLite; elected on etcd.
    pub role: Arc<crate::ha::RoleHandle>,
    /// The election's handles, on etcd.
    elected: Option<Elected>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("quic", &self.endpoint.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl App {
    /// Opens the store, binds the ports, and (on etcd, after winning the election) loads
    /// the state and starts the parts: [`Bound::open`] then [`Bound::lead`]. On etcd this
    /// waits until this coordinator leads.
    pub async fn build(config: Config) -> Result<Self, AppError> {
        Self::build_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`App::build`] with a given clock.
    pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self, AppError> {
        Bound::open(config, clock)
            .await?
            .lead(&CancellationToken::new())
            .await
            .map(|app| app.expect("a campaign without a stop token ends only by leading"))
    }
}

/// A coordinator whose configuration, TLS files and store checked out and whose ports are
/// bound: everything that can fail on a bad configuration has been tried, so the binary can
/// report it and exit before it says READY. Nothing is loaded yet: [`Bound::lead`].
pub struct Bound {
    config: Config,
    clock: Arc<dyn Clock>,
    tls: TlsMaterial,
    me: protocol::Identity,
    name: String,
    store: Store,
    endpoint: quinn::Endpoint,
    http: Option<tokio::net::TcpListener>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("name", &self.name)
            .field("quic", &self.endpoint.local_addr().ok())
            .finish_non_exhaustive()
    }
}

/// The election's handles, for a coordinator that leads by election (etcd).
struct Elected {
    /// Fires when the term ends: the coordinator stops and exits.
    lost: CancellationToken,
    /// Fired by [`App::run`] once every loop has stopped: the lead is given up at once.
    resign: CancellationToken,
    /// The task holding the lead (keep-alives, the watch on the leader key).
    holder: tokio::task::JoinHandle<()>,
}

impl Elected {
    /// Gives the lead up (a start that failed after winning, or a clean stop once every
    /// loop has stopped) and waits until the key is deleted and the lease revoked.
    async fn give_up(self) {
        self.resign.cancel();
        let _ = self.holder.await;
    }
}

/// How [`App::run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The shutdown token fired (a signal): a clean stop.
    Stopped,
    /// Its term as leader ended: it stopped acting at once, and exits with
    /// [`crate::ha::EXIT_DEPOSED`] for systemd to start it again as a standby.
    Deposed,
}

impl Bound {
    /// Loads the TLS material, opens the store (exclusively, on SQLite) and binds the QUIC
    /// and HTTP ports.
    pub async fn open(config: Config, clock: Arc<dyn Clock>) -> Result<Self, AppError> {
        let tls = TlsMaterial::load(&TlsFiles {
            ca: config.tls.ca.clone(),
            cert: config.tls.cert.clone(),
            key: config.tls.key.clone(),
        })?;
        let me = tls.identity().clone();
        if me.role != Role::Coordinator {
            return Err(AppError::WrongRole(me));
        }
        tls.check_own_chain(&config.tls.cert, &config.tls.ca, "tls.ca")?;
        crate::certs::warn_if_expiring(tls.expiry(), &config.tls.cert);
        let name = config.name.clone().unwrap_or_else(|| me.name.clone());
        // Exclusive and writable, or no start at all: a second coordinator on this store,
        // or one that cannot write it, must not say it serves.
        let store = open_store(&config).await?;
        let endpoint = tls.server_endpoint(config.listen)?;
        let http = match config.http.listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| AppError::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Self {
            config,
            clock,
            tls,
            me,
            name,
            store,
            endpoint,
            http,
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// The bound QUIC address.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.endpoint.local_addr().ok()
    }

    /// True when this coordinator must win an election before it acts (etcd).
    pub fn is_elected(&self) -> bool {
        self.store.backend() == crate::store::config::Backend::Etcd
    }

    /// Takes the lead and loads: on SQLite at once (the sole coordinator of its file, with
    /// the next epoch of the file's counter); on etcd it campaigns, answering as a standby
    /// meanwhile, and loads the state from etcd once it wins, every write fenced by its
    /// epoch. `None` when `stop` fired before it led.
    pub async fn lead(self, stop: &CancellationToken) -> Result<Option<App>, AppError> {
        let Some(etcd) = self.store.as_etcd().cloned() else {
            let lease = crate::lease_token::at_start(&self.store).await?;
            return self
                .load(crate::ha::RoleHandle::sole(), lease, None)
                .await
                .map(Some);
        };
        let role = crate::ha::RoleHandle::elected();
        let listen = self.quic_addr().unwrap_or(self.config.listen);
        let candidate = crate::ha::Candidate::new(
            etcd,
            self.name.clone(),
            self.config.ha.advertised(listen),
            self.config.ha.lease_ttl,
            role.clone(),
        );
        let standby = standby::Standby::spawn(standby::StandbyParts {
            endpoint: &self.endpoint,
            http: self.http.as_ref(),
            trust_domain: &self.me.trust_domain,
            role: &role,
            store: &self.store,
            metrics: &self.metrics,
        })
        .map_err(|source| AppError::Bind {
            addr: self.config.http.listen.unwrap_or(listen),
            source,
        })?;
        tracing::info!(name = %self.name, "campaigning for the lead; answering as a standby meanwhile");
        let (lost, resign) = (CancellationToken::new(), CancellationToken::new());
        let won =
            crate::ha::campaign_and_hold(&candidate, stop, resign.clone(), lost.clone()).await;
        standby.stop().await;
        let Some((leadership, holder)) = won else {
            return Ok(None);
        };
        let elected = Elected {
            lost,
            resign,
            holder,
        };
        let store_id = match self.store.identity().await {
            Ok(id) => id,
            Err(e) => {
                elected.give_up().await;
                return Err(e.into());
            }
        };
        let lease = crate::lease_token::LeaseToken::fixed(protocol::fencing::FencingToken {
            store: store_id,
            epoch: u64::try_from(leadership.epoch).unwrap_or(0),
        })
        .bound_to(role.clone());
        let mut bound = self;
        bound.store = Store::Etcd(leadership.store.clone());
        bound.load(role, lease, Some(elected)).await.map(Some)
    }

    /// Loads machines, imports the inventory file, and starts the parts, as `role`, sending
    /// with `lease`.
    async fn load(
        self,
        role: Arc<crate::ha::RoleHandle>,
        lease: crate::lease_token::LeaseToken,
        elected: Option<Elected>,
    ) -> Result<App, AppError> {
        match self.load_parts(role, lease).await {
            Ok(mut app) => {
                app.elected = elected;
                Ok(app)
            }
            Err(e) => {
                if let Some(el) = elected {
                    el.give_up().await;
                }
                Err(e)
            }
        }
    }

    async fn load_parts(
        self,
        role: Arc<crate::ha::RoleHandle>,
        lease: crate::lease_token::LeaseToken,
    ) -> Result<App, AppError> {
        let Bound {
            config,
            clock,
            tls,
            me,
            name,
            store,
            endpoint,
            http,
            metrics,
        } = self;
        let fleet =
            Arc::new(Fleet::open(store.clone(), clock.clone(), config.health.resolved()).await?);
        let mut inventory = None;
        if let Some(path) = &config.inventory {
            let import = import_inventory(&fleet, &store, path).await?;
            tracing::info!(path = %path.display(), machines = import.records.len(), "inventory loaded");
            inventory = Some(import.records);
        }
        let kube = match &config.kubernetes {
            Some(k) => Some((
                Arc::new({
                    // The release judges a kubelet alive by the same rule as the detectors.
                    let rem = config.remediation.clone().unwrap_or_default();
                    let gate = role
                        .is_elected()
                        .then(|| crate::k8s::gate::WriteGate::leading(role.clone()));
                    KubeDrainer::from_config_gated(k, clock.clone(), gate.as_ref())
                        .await
                        .map_err(AppError::Kubernetes)?
                        .with_second_signal(rem.second_signal, rem.lease_stale)
                }),
                k.node_view_refresh,
            )),
            None => None,
        };
        let drainer: Arc<dyn Drainer> = match &kube {
            Some((k, _)) => k.clone(),
            None => Arc::new(NotANode),
        };
        let shared_tls: crate::gateway::SharedTls = Arc::new(std::sync::RwLock::new(tls.clone()));
        let (power, gateways) = power_control(&config, &shared_tls, &name, &fleet, &lease);
        let kdump = Arc::new(
            crate::kdump::Kdumps::open(
                store.clone(),
                clock.clone(),
                fleet.clone(),
                config.kdump.clone(),
            )
            .await?
            .with_events(drainer.clone()),
        );
        let links = crate::agent_link::AgentLinks::new(lease);
        let fence_metrics = Arc::new(crate::fence::metrics::FenceMetrics::default());
        // The engine starts now, so a bad `repair:` file fails the build, but stops with
        // the app: `run` cancels this token when its shutdown token fires.
        let repair_stop = CancellationToken::new();
        let fence_policy = crate::repair::wiring::FencePolicy {
            section: config.fence.clone(),
            gateways: config
                .gateways
                .as_ref()
                .map(|g| g.targets.clone())
                .unwrap_or_default(),
            fleet: fleet.clone(),
        };
        let (repair, repair_join) = match config.repair.as_ref().and_then(|r| r.config.as_deref()) {
            Some(path) => {
                let (q, join) = crate::repair::start_for_app(
                    path,
                    store.clone(),
                    clock.clone(),
                    fleet.clone(),
                    drainer.clone(),
                    power,
                    links.clone(),
                    kube.as_ref()
                        .map(|(k, every)| crate::repair::wiring::FenceWiring {
                            release: k.clone(),
                            liveness: Arc::new(crate::repair::wiring::FleetLiveness {
                                fleet: fleet.clone(),
                                view: Arc::new(k.node_view().clone()),
                                max_age: *every
                                    * crate::remediation::runner::VIEW_MAX_AGE_REFRESHES,
                                config: config.remediation.clone().unwrap_or_default(),
                                clock: clock.clone(),
                            }),
                            kdump: kdump.clone(),
                            policy: fence_policy.clone(),
                            metrics: fence_metrics.clone(),
                        }),
                    fence_policy.clone(),
                    kdump.clone(),
                    repair_stop.clone(),
                )
                .await?;
                (Some(q), Some(join))
            }
            None => (None, None),
        };
        if let Some(q) = &repair {
            for problem in crate::check::fit::unfit(&config, q.config(), inventory.as_deref()) {
                tracing::warn!("{problem} (`coordinator check` says the same)");
            }
        }
        let remediation = match &config.remediation {
            Some(cfg) => {
                let rem = crate::remediation::Remediation::open(
                    store.clone(),
                    clock.clone(),
                    cfg.clone(),
                    kube.is_some(),
                )
                .await?;
                let view = kube.as_ref().map(|(k, every)| {
                    let v: Arc<dyn crate::k8s::NodeViewSource> = Arc::new(k.node_view().clone());
                    (
                        v,
                        *every * crate::remediation::runner::VIEW_MAX_AGE_REFRESHES,
                    )
                });
                let deps = crate::remediation::LoopDeps {
                    fleet: fleet.clone(),
                    view,
                    queue: repair.clone(),
                    events: drainer.clone(),
                    kdump: kdump.clone(),
                    view_changed: kube.as_ref().map(|(k, _)| k.node_view().changes()),
                };
                Some((rem, deps))
            }
            None => None,
        };
        let admin = Arc::new(Admin {
            fleet: fleet.clone(),
            repair: repair.clone(),
            store: store.clone(),
            remediation: remediation.as_ref().map(|(r, _)| r.clone()),
            kdump: Some(kdump.clone()),
            links: links.clone(),
            role: (name.clone(), role.clone()),
        });
        let mut metrics_sources: Vec<Arc<dyn MetricsSource>> = repair
            .iter()
            .map(|q| q.metrics() as Arc<dyn MetricsSource>)
            .collect();
        if let Some((r, _)) = &remediation {
            metrics_sources.push(r.metrics());
        }
        metrics_sources.push(fence_metrics);
        if let Some(g) = &gateways {
            metrics_sources.push(g.clone());
        }
        if let Some((k, _)) = &kube {
            metrics_sources.push(Arc::new(k.node_view().clone()));
        }
        metrics_sources.push(Arc::new(crate::ha::metrics::RoleMetrics(role.clone())));
        let cert_metrics = crate::certs::CertificateMetrics::new(tls.expiry(), fleet.clone());
        metrics_sources.push(cert_metrics.clone());
        let tls_reloader = Arc::new(crate::certs::TlsReloader::new(
            TlsFiles {
                ca: config.tls.ca.clone(),
                cert: config.tls.cert.clone(),
                key: config.tls.key.clone(),
            },
            me.clone(),
            endpoint.clone(),
            shared_tls,
            cert_metrics,
        ));
        Ok(App {
            config,
            store,
            fleet,
            metrics,
            admin,
            metrics_sources,
            name,
            trust_domain: me.trust_domain,
            endpoint,
            http,
            node_view: kube.map(|(k, every)| (k.node_view().clone(), every)),
            repair_stop,
            repair_join,
            gateways,
            links,
            remediation,
            kdump,
            tls_reloader,
            role,
            elected: None,
        })
    }
}

/// Opens the store the configuration names. An etcd that does not answer is waited for
/// (tried every second, said at once and then once a minute): with several coordinators an
/// etcd outage would otherwise make every one of them fail its start again and again until
/// systemd gave up on it, and none would be there when etcd returns.
async fn open_store(config: &Config) -> Result<Store, StoreError> {
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        match Store::open_configured(&config.store, &config.database).await {
            Ok(s) => {
                if said.is_some() {
                    tracing::info!("etcd answers: starting");
                }
                return Ok(s);
            }
            Err(e)
                if config.store.backend == crate::store::config::Backend::Etcd
                    && e.is_retriable() =>
            {
                if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    tracing::error!(error = %e, "cannot start without etcd; trying again every second until it answers");
                    said = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The power path for built-in actions: the configured gateways, routed by the machine's
/// inventory rack, or [`crate::gateway::NoGateway`] (every action "not available") without
/// any; and the gateways themselves, to watch.
fn power_control(
    config: &Config,
    tls: &crate::gateway::SharedTls,
    name: &str,
    fleet: &Arc<Fleet>,
    lease: &crate::lease_token::LeaseToken,
) -> (
    Arc<dyn crate::gateway::PowerControl>,
    Option<Arc<crate::gateway::QuicGateways>>,
) {
    let targets = config
        .gateways
        .as_ref()
        .map(|g| g.targets.clone())
        .unwrap_or_default();
    if targets.is_empty() {
        tracing::info!("no [gateways] configured: built-in power actions are not available");
        return (Arc::new(crate::gateway::NoGateway), None);
    }
    tracing::info!(
        gateways = targets.len(),
        "power actions go through rack gateways"
    );
    let fleet = fleet.clone();
    let rack_of: crate::gateway::RackOf = Arc::new(move |address: &str| {
        fleet
            .machine(address)
            .map(|m| m.record.rack)
            .filter(|rack| !rack.is_empty())
    });
    let gateways = Arc::new(crate::gateway::QuicGateways::new(
        tls.clone(),
        name,
        targets,
        rack_of,
        lease.clone(),
    ));
    (gateways.clone(), Some(gateways))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_period_is_bounded() {
        assert_eq!(
            sweep_period(Duration::from_millis(100)),
            Duration::from_millis(50)
        );
        assert_eq!(
            sweep_period(Duration::from_millis(400)),
            Duration::from_millis(100)
        );
        assert_eq!(
            sweep_period(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
    }

    /// A coordinator certificate issued on a host whose clock is 3 h ahead is not valid yet
    /// here: the start refuses it as `coordinator check` does (it used to start with it, and
    /// refuse every agent certificate issued as recently), in dates and clocks.
    #[tokio::test]
    async fn a_certificate_not_valid_yet_by_this_clock_stops_the_start_naming_the_clocks() {
        use protocol::pki::{Ca, IssueOptions};
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test.local").unwrap();
        let issued = ca
            .issue(
                Role::Coordinator,
                "c1",
                &IssueOptions {
                    clock_offset_secs: 3 * 3600 + 300,
                    ..Default::default()
                },
            )
            .unwrap();
        let (cert, key) = issued.write(dir.path(), false).unwrap();
        let ca_path = dir.path().join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).unwrap();
        let text = format!(
            "listen = \"127.0.0.1:0\"\ndatabase = {:?}\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
            dir.path().join("c.db").display().to_string(),
            ca_path.display().to_string(),
            cert.display().to_string(),
            key.display().to_string()
        );
        let config = Config::parse(&text, std::path::Path::new("c.toml")).unwrap();
        let Err(e) = App::build(config).await else {
            panic!("the start accepted a certificate not valid yet")
        };
        assert!(e.is_config(), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("is not valid yet by the clock of this host")
                && msg.contains("behind the clock of the host that issued it by more than 2 hours"),
            "{msg}"
        );
        assert!(
            !msg.contains("UNIX") && !msg.contains("issue it from this fleet's CA"),
            "{msg}"
        );
        assert!(
            !dir.path().join("c.db").exists(),
            "the store was opened: {msg}"
        );
    }
}
