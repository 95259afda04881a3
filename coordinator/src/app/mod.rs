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
use protocol::transport::{TlsFiles, TlsMaterial, TransportError};
use tokio_util::sync::CancellationToken;

mod inventory;
mod standby;

pub use inventory::{InventoryImport, import_inventory};

use crate::admin::Admin;
use crate::agent_server::{self, ServerCtx};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::fleet::{Fleet, FleetError};
use crate::inventory::InventoryError;
use crate::k8s::{Drainer, KubeDrainer, NodeView, NotANode};
use crate::metrics::{HttpState, Metrics, MetricsSource};
use crate::store::IdentityStore;
use crate::store::{Store, StoreError};

/// Bounds of the sweep period. The sweep turns silent machines unreachable; running it four
/// times per report interval keeps the detection delay under a quarter interval, and the
/// bounds keep it from spinning with tiny test intervals or dawdling with huge ones.
const SWEEP_MIN: Duration = Duration::from_millis(50);
const SWEEP_MAX: Duration = Duration::from_secs(1);

/// Why the coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The TLS files are unusable, or the QUIC port cannot be bound (the transport's own
    /// message says which).
    #[error(transparent)]
    Tls(#[from] TransportError),
    /// Our certificate is not a coordinator certificate.
    #[error(
        "certificate names {0}, not a coordinator; issue one with `coordinatorctl pki issue --role coordinator`"
    )]
    WrongRole(protocol::Identity),
    /// Our certificate does not chain to the CA, or is not valid by this host's clock: every
    /// agent's certificate issued as recently would be refused too. Refused as `coordinator
    /// check` refuses it.
    #[error(transparent)]
    OwnCertificate(#[from] protocol::transport::ForeignCertificate),
    /// The database cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The registry failed.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The inventory file is unusable.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The inventory file gives a hostname that a machine in service holds at another
    /// address (one added with `coordinatorctl`, or retired by hand with a repair active).
    #[error(
        "inventory file {file}: hostname {hostname:?} is registered at {holder}, which the file does not list; the file cannot give it to {address} while that record holds it. Start with the file as it was, free the hostname (`coordinatorctl machines delete {holder}`, or `coordinatorctl machines add {holder} --hostname OTHER`), then restart with this file"
    )]
    InventoryHostnameTaken {
        /// The inventory file.
        file: std::path::PathBuf,
        /// The hostname.
        hostname: String,
        /// The address holding it.
        holder: String,
        /// The address the file gives it to.
        address: String,
    },
    /// The repair queue could not start.
    #[error(transparent)]
    Repair(#[from] crate::repair::RepairStartError),
    /// The `[kubernetes]` section is unusable (kubeconfig missing or invalid).
    #[error("kubernetes: {0}")]
    Kubernetes(crate::k8s::KubeError),
    /// A port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

impl AppError {
    /// True when the configuration (or a file it names) must be fixed: exit code 64.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            AppError::Tls(_)
                | AppError::WrongRole(_)
                | AppError::OwnCertificate(_)
                | AppError::Inventory(_)
                | AppError::InventoryHostnameTaken { .. }
                | AppError::Kubernetes(_)
        ) || matches!(self, AppError::Fleet(FleetError::Invalid(_)))
            || matches!(self, AppError::Repair(e) if e.is_config())
            || matches!(self, AppError::Fleet(FleetError::HostnameTaken { .. }))
            || matches!(self, AppError::Store(e) if e.is_config())
    }

    /// True when starting again later may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            AppError::Store(e) => e.is_retriable(),
            AppError::Fleet(e) => e.is_retriable(),
            AppError::Bind { .. } => true,
            _ => false,
        }
    }
}

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
        self.store.as_etcd().is_some()
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
                elected.resign.cancel();
                let _ = elected.holder.await;
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
                    el.resign.cancel();
                    let _ = el.holder.await;
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

impl App {
    /// What puts renewed TLS files in place (on SIGHUP).
    pub fn tls_reloader(&self) -> Arc<crate::certs::TlsReloader> {
        self.tls_reloader.clone()
    }

    /// The bound QUIC address.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.endpoint.local_addr().ok()
    }

    /// The bound HTTP address, if enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` fires, then drains open connections within the configured
    /// grace and returns [`Ended::Stopped`]; a coordinator that leads by election gives the
    /// lead up then. When its term ends first, every part stops at once (its connections
    /// are closed, not drained: its clients go to the new leader) and it returns
    /// [`Ended::Deposed`].
    pub async fn run(mut self, shutdown: CancellationToken) -> Ended {
        let grace = self.config.shutdown_grace;
        let elected = self.elected.take();
        let lost = elected.as_ref().map(|e| e.lost.clone());
        // Every part stops on `stop`: the shutdown, or the end of the term.
        let stop = CancellationToken::new();
        tokio::spawn({
            let (stop, shutdown, lost) = (stop.clone(), shutdown.clone(), lost.clone());
            async move {
                match lost {
                    Some(lost) => tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = lost.cancelled() => {}
                    },
                    None => shutdown.cancelled().await,
                }
                stop.cancel();
            }
        });
        let shutdown = stop;
        let ctx = Arc::new(ServerCtx {
            name: self.name.clone(),
            trust_domain: self.trust_domain.clone(),
            fleet: self.fleet.clone(),
            metrics: self.metrics.clone(),
            admin: self.admin.clone(),
            links: self.links.clone(),
            kdump: Some(self.kdump.clone()),
            leadership: crate::leadership::Leadership::new(self.role.clone()),
        });
        tracing::info!(
            name = %self.name,
            quic = %protocol::telemetry::OrNone(&self.quic_addr()),
            http = %protocol::telemetry::OrNone(&self.http_addr()),
            machines = self.fleet.list().len(),
            role = self.role.current().name(),
            epoch = self.role.current().epoch().unwrap_or(0),
            "coordinator serving"
        );
        let server = tokio::spawn(agent_server::serve(
            self.endpoint.clone(),
            ctx,
            shutdown.clone(),
            grace,
        ));
        let sweeper = tokio::spawn(sweep_loop(
            self.fleet.clone(),
            self.links.clone(),
            shutdown.clone(),
        ));
        let certificates = tokio::spawn(crate::certs::watch_agent_certificates(
            self.fleet.clone(),
            shutdown.clone(),
        ));
        let gateways = self
            .gateways
            .clone()
            .map(|g| tokio::spawn(g.watch_reach(shutdown.clone())));
        let probe = tokio::spawn(crate::store::health::probe_loop(
            self.store.clone(),
            crate::store::health::PROBE_PERIOD,
            shutdown.clone(),
        ));
        let node_view = self.node_view.as_ref().map(|(view, every)| {
            (
                view.spawn_poller(*every, shutdown.clone()),
                view.spawn_watcher(shutdown.clone()),
            )
        });
        let remediation = self
            .remediation
            .map(|(rem, deps)| rem.spawn(deps, shutdown.clone()));
        let http = self.http.take().map(|listener| {
            let state = HttpState {
                fleet: Some(self.fleet.clone()),
                metrics: self.metrics.clone(),
                store: self.store.clone(),
                sources: self.metrics_sources.clone(),
                role: self.role.clone(),
            };
            tokio::spawn(crate::metrics::serve(listener, state, shutdown.clone()))
        });
        shutdown.cancelled().await;
        self.metrics.set_shutting_down();
        let deposed = lost.as_ref().is_some_and(CancellationToken::is_cancelled);
        if deposed {
            // Its sessions belong to the new leader now: closed at once, not drained.
            self.endpoint.close(
                agent_server::CLOSE_DEPOSED.into(),
                b"this coordinator no longer leads",
            );
            tracing::warn!("deposed: every part stops now");
        } else {
            tracing::info!(grace = ?grace, "shutting down");
        }
        self.repair_stop.cancel();
        let _ = server.await;
        let _ = sweeper.await;
        let _ = certificates.await;
        if let Some(h) = gateways {
            let _ = h.await;
        }
        let _ = probe.await;
        if let Some(h) = remediation {
            let _ = h.await;
        }
        if let Some((poller, watcher)) = node_view {
            let _ = poller.await;
            let _ = watcher.await;
        }
        if let Some(h) = self.repair_join.take()
            && tokio::time::timeout(grace, h).await.is_err()
        {
            tracing::warn!("repair queue did not stop within the grace");
        }
        if let Some(h) = http {
            match tokio::time::timeout(grace, h).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP endpoint failed"),
                _ => tracing::warn!("HTTP endpoint did not stop within the grace"),
            }
        }
        match elected {
            Some(e) if !deposed => {
                // Every loop has stopped: a standby may take over now, at once.
                e.resign.cancel();
                let _ = e.holder.await;
                tracing::info!("coordinator stopped; the lead was given up");
                Ended::Stopped
            }
            Some(e) => {
                let _ = e.holder.await;
                tracing::warn!(
                    exit = crate::ha::EXIT_DEPOSED,
                    "coordinator stopped: it no longer leads"
                );
                Ended::Deposed
            }
            None => {
                tracing::info!("coordinator stopped");
                Ended::Stopped
            }
        }
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

/// The sweep period for a report interval.
pub fn sweep_period(report_interval: Duration) -> Duration {
    (report_interval / 4).clamp(SWEEP_MIN, SWEEP_MAX)
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

async fn sweep_loop(
    fleet: Arc<Fleet>,
    links: Arc<crate::agent_link::AgentLinks>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(sweep_period(fleet.config().report_interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A store that keeps failing (a full disk) fails every sweep: said when it starts, when
    // its error changes, once a minute while it lasts, and when it ends, not every tick.
    let mut failing = crate::store::repeated::RepeatedFailure::new(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let received = links.received(&fleet.silent_connected());
        match fleet.sweep_heard(&received).await {
            Ok(_) => {
                if let Some(n) = failing.succeeded() {
                    tracing::info!(failed_sweeps = n, "health sweep works again");
                }
            }
            Err(e) => {
                let e = e.to_string();
                if let Some(n) = failing.failed(&e, tokio::time::Instant::now()) {
                    tracing::error!(error = %e, failed_sweeps = n, "health sweep failed; retrying every tick");
                }
            }
        }
    }
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
