//! The live fleet registry: every machine's record, its live health (in memory) and its
//! derived state (in memory and in the store).
//!
//! All mutations (hellos, reports, goodbyes, registrations, the timer sweep) are serialised
//! by one async gate; a state transition is written to the store (machines row + a
//! `machine_transitions` row, in one transaction) *before* it becomes visible in memory, so
//! nothing reported as done is lost in a crash. Heartbeats and reports stay in memory only.
//! Reads take a short synchronous lock and never wait for the store, except
//! [`Fleet::transitions`] and [`Fleet::detail`], which read the history.
//!
//! Read API for other areas (repair queue, detectors), in domain types ([`snapshot`]):
//! - [`Fleet::snapshot`]: every machine's record, state and live health under one lock;
//! - [`Fleet::machine`] / [`Fleet::machine_by_hostname`]: record, state, since, reason;
//! - [`Fleet::live`]: last report time, boot id, connection, start of the healthy run;
//! - [`Fleet::healthy_since`] and [`Fleet::ok_continuously_since`]: for `agent-healthy`.
//!
//! This module decides nothing itself: states come from [`crate::health::derive`]. Its state
//! is kept through [`store::MachineStore`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use jiff::Timestamp;
use protocol::admin::machines::{MachineDetail, MachineSummary, StateTransition};
use protocol::messages::{CheckKind, CheckStatus};

use crate::clock::{Clock, to_unix_ms};
use crate::health::{Current, Derived, HealthConfig, MachineState, Observation, derive};
use crate::inventory::{InventoryError, MachineRecord, RecordSource, check_unique};
use crate::store::{Store, StoreError};

mod agents;
mod certs;
mod changes;
mod index;
pub mod lifecycle;
pub mod snapshot;
pub mod store;
mod sweep;

pub use certs::AgentCertificates;
use index::{Entry, Inner, Live, row};
pub use lifecycle::Released;
pub use snapshot::{FleetSnapshot, LiveHealth, MachineSnapshot, MachineView};
use store::{MachineStore, Write};

/// How many transitions `machines show` returns: enough for weeks of a flapping machine,
/// bounded so one answer stays small.
pub const SHOW_TRANSITIONS: usize = 200;

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The database failed; nothing was changed in memory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record was invalid.
    #[error(transparent)]
    Invalid(#[from] InventoryError),
    /// The hostname is already registered at another address.
    #[error("hostname {hostname:?} is already registered at {address}; change that machine first")]
    HostnameTaken {
        /// The hostname.
        hostname: String,
        /// Where it is registered.
        address: String,
    },
    /// No machine has that address.
    #[error("no machine with address or hostname {0}; `coordinatorctl machines list` lists them")]
    UnknownMachine(String),
    /// No machine has that hostname.
    #[error("no machine with hostname {0}")]
    UnknownHost(String),
    /// The machine is listed in the inventory file, which is the source of truth for it.
    #[error(
        "machine {address} is listed in the inventory file, which is the source of truth for the machines it lists, so it cannot be {what} here: change the file and restart the coordinator"
    )]
    InventoryOwned {
        /// The machine.
        address: String,
        /// What was refused (`changed`, `deleted`).
        what: String,
    },
    /// `set-state` was given a state only health derivation sets.
    #[error(
        "{0} is not an admin state: use updating, retiring or retired (or `auto` to hand the machine back to health checks)"
    )]
    NotAdminState(String),
}

impl FleetError {
    /// True when a retry may succeed (busy database).
    pub fn is_retriable(&self) -> bool {
        match self {
            FleetError::Store(e) => e.is_retriable(),
            _ => false,
        }
    }

    /// True when the store failed: the store's health logs that once, then counts it.
    pub fn is_storage_failure(&self) -> bool {
        matches!(self, FleetError::Store(e) if e.is_storage_failure())
    }
}

/// The registry. Cheap to share behind an `Arc`.
pub struct Fleet {
    store: Store,
    clock: Arc<dyn Clock>,
    cfg: HealthConfig,
    started_at: Timestamp,
    gate: tokio::sync::Mutex<()>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("cfg", &self.cfg)
            .field("started_at", &self.started_at)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Loads every machine and its last state from the store.
    pub async fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        cfg: HealthConfig,
    ) -> Result<Self, FleetError> {
        let stored = store.machines().await?;
        let mut inner = Inner::default();
        for m in stored {
            inner.insert(Entry {
                record: m.record,
                state: m.state,
                since: m.since,
                reason: m.reason,
                live: Live {
                    stored_boot_id: m.boot_id,
                    reported_before_start: m.reported,
                    ..Live::default()
                },
            });
        }
        let started_at = clock.now();
        Ok(Self {
            store,
            clock,
            cfg,
            started_at,
            gate: tokio::sync::Mutex::new(()),
            inner: Mutex::new(inner),
        })
    }

    /// The health settings in force.
    pub fn config(&self) -> &HealthConfig {
        &self.cfg
    }

    /// When this registry was opened: reports before it are not known (they are kept in
    /// memory only).
    pub fn started_at(&self) -> Timestamp {
        self.started_at
    }

    /// Whether `address`'s agent has ever reported: since this registry was opened, or
    /// before (its stored history has a healthy or unhealthy state). False for an unknown
    /// address.
    pub fn ever_reported(&self, address: &str) -> bool {
        self.lock().machines.get(address).is_some_and(|e| {
            e.live.last_report_at.is_some()
                || e.live.reported_before_start
                || matches!(e.state, MachineState::Healthy | MachineState::Unhealthy)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn evaluate(&self, e: &Entry, now: Timestamp) -> Option<Derived> {
        let obs = Observation {
            registered: e.record.machine_type.is_some(),
            last_report: e.live.last_report_at.zip(e.live.last_report.as_ref()),
            goodbye: e.live.goodbye,
            watching_since: self.started_at,
            heard_since_report: e.live.heard_since_report(),
        };
        derive(
            Current {
                state: e.state,
                since: e.since,
            },
            &obs,
            now,
            &self.cfg,
        )
    }

    /// Re-derives `e`'s state after a live update: if it changes, a copy of `e` with the
    /// transition applied (for [`Self::commit`]) and its writes queued; otherwise nothing.
    fn changed_copy(&self, e: &Entry, now: Timestamp, writes: &mut Vec<Write>) -> Vec<Entry> {
        match self.evaluate(e, now) {
            Some(d) => {
                let mut e = e.clone();
                Self::transition(&mut e, d, now, writes);
                vec![e]
            }
            None => Vec::new(),
        }
    }

    /// Applies `d` to `e` and queues the writes recording it.
    /// Records a state change in `e` and `writes`; it is logged once [`Fleet::commit`] has
    /// stored it (a change that cannot be stored is decided again at the next sweep, and
    /// would otherwise be logged at every one while the disk is full).
    fn transition(e: &mut Entry, d: Derived, now: Timestamp, writes: &mut Vec<Write>) {
        writes.push(Write::Transition {
            address: e.record.address.clone(),
            from: e.state.as_str().to_string(),
            to: d.state,
            at: now,
            reason: d.reason.clone(),
        });
        e.state = d.state;
        e.since = now;
        e.reason = d.reason;
        writes.push(Write::Row(row(e, now)));
    }

    /// Persists `writes`, then makes `changed` visible and drops `removed`.
    async fn commit(
        &self,
        writes: Vec<Write>,
        changed: Vec<Entry>,
        removed: Vec<String>,
    ) -> Result<(), FleetError> {
        if !writes.is_empty() {
            let changes = changes::StateChanges::of(&writes);
            self.store.persist(writes).await?;
            changes.log(&changed);
        }
        let mut inner = self.lock();
        for a in removed {
            inner.remove(&a);
        }
        for e in changed {
            inner.insert(e);
        }
        Ok(())
    }

    /// Registers or updates machines (inventory file, `machines add/import`), all or
    /// nothing. A record whose hostname is held by a machine awaiting registration takes
    /// over that machine's live health; one held by a registered machine is refused.
    pub async fn upsert(
        &self,
        records: Vec<MachineRecord>,
    ) -> Result<Vec<MachineSummary>, FleetError> {
        check_unique(&records)?;
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let mut changed = Vec::new();
        let mut removed = Vec::new();
        {
            let inner = self.lock();
            for rec in &records {
                let mut live = Live::default();
                if let Some(other) = inner.by_hostname.get(&rec.hostname)
                    && *other != rec.address
                {
                    let o = &inner.machines[other];
                    if o.record.machine_type.is_some() {
                        return Err(FleetError::HostnameTaken {
                            hostname: rec.hostname.clone(),
                            address: other.clone(),
                        });
                    }
                    live = o.live.clone();
                    writes.push(Write::Delete(other.clone()));
                    removed.push(other.clone());
                }
                if rec.source == RecordSource::Admin
                    && let Some(old) = inner.machines.get(&rec.address)
                {
                    Self::refuse_inventory_edit(old, "changed")?;
                }
                let mut e = match inner.machines.get(&rec.address) {
                    Some(old) if old.record == *rec => continue,
                    Some(old) => {
                        let mut e = old.clone();
                        if old.record.hostname != rec.hostname {
                            // Another host now: what we knew about the old one is moot.
                            e.live = live;
                        }
                        e.record = rec.clone();
                        e
                    }
                    None => {
                        let e = Entry {
                            record: rec.clone(),
                            state: MachineState::Uninitialized,
                            since: now,
                            reason: format!("registered from {}", rec.source),
                            live,
                        };
                        writes.push(Write::Transition {
                            address: rec.address.clone(),
                            from: String::new(),
                            to: e.state,
                            at: now,
                            reason: e.reason.clone(),
                        });
                        e
                    }
                };
                writes.push(Write::Row(row(&e, now)));
                if let Some(d) = self.evaluate(&e, now) {
                    Self::transition(&mut e, d, now, &mut writes);
                }
                changed.push(e);
            }
        }
        self.commit(writes, changed, removed).await?;
        let inner = self.lock();
        // Unchanged records are answered too, in input order.
        let out: Vec<MachineSummary> = records
            .iter()
            .filter_map(|r| inner.machines.get(&r.address).map(|e| self.summary(e)))
            .collect();
        Ok(out)
    }

    fn summary(&self, e: &Entry) -> MachineSummary {
        MachineSummary {
            spec: e.record.to_spec(),
            state: e.state.as_str().to_string(),
            state_since_unix_ms: ms(e.since),
            failing: e.live.failing_since.keys().cloned().collect(),
            reason: e.reason.clone(),
            last_report_unix_ms: e.live.last_report_at.map(ms),
            connected: e.live.connections > 0,
        }
    }

    /// Every machine with its state and live health, under one lock: what detectors read.
    pub fn snapshot(&self) -> FleetSnapshot {
        let taken_at = self.clock.now();
        let machines = self
            .lock()
            .machines
            .values()
            .map(|e| MachineSnapshot {
                record: e.record.clone(),
                state: e.state,
                since: e.since,
                reason: e.reason.clone(),
                last_report_at: e.live.last_report_at,
                boot_id: e.live.boot_id.clone(),
                boot_seen_at: e.live.boot_seen_at,
                last_silence: e.live.last_silence,
                kdump_loaded: e.live.last_report.as_ref().is_some_and(|r| {
                    r.checks
                        .iter()
                        .any(|c| c.kind == CheckKind::Kdump && c.status == CheckStatus::Ok)
                }),
                failing: e.live.failing_since.clone(),
                failing_kinds: e.live.failing_kinds_since.clone(),
                goodbye: e.live.goodbye,
                connected: e.live.connections > 0,
            })
            .collect();
        FleetSnapshot {
            taken_at: Some(taken_at),
            machines,
        }
    }

    /// Every machine, ordered by address.
    pub fn list(&self) -> Vec<MachineSummary> {
        self.lock()
            .machines
            .values()
            .map(|e| self.summary(e))
            .collect()
    }

    /// Number of machines in each state (every state present, possibly 0).
    pub fn counts_by_state(&self) -> BTreeMap<MachineState, usize> {
        let mut out: BTreeMap<MachineState, usize> =
            MachineState::ALL.into_iter().map(|s| (s, 0)).collect();
        for e in self.lock().machines.values() {
            *out.entry(e.state).or_default() += 1;
        }
        out
    }

    /// A machine's record and state.
    pub fn machine(&self, address: &str) -> Option<MachineView> {
        self.lock().machines.get(address).map(Entry::view)
    }

    /// The key of the machine `name` names, for commands that take an address or a
    /// hostname (operators know machines by hostname): `name` itself when a machine has
    /// that address, the canonical form of an IP address, else the address of the machine
    /// with that hostname. A name nothing matches comes back as given, so the caller's "no
    /// machine" answer (or a lookup of a deleted machine's history) sees what was asked.
    pub fn resolve(&self, name: &str) -> String {
        let inner = self.lock();
        if inner.machines.contains_key(name) {
            return name.to_string();
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            return ip.to_canonical().to_string();
        }
        inner
            .by_hostname
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_string())
    }

    /// A machine's record and state, found by hostname.
    pub fn machine_by_hostname(&self, hostname: &str) -> Option<MachineView> {
        let inner = self.lock();
        let addr = inner.by_hostname.get(hostname)?;
        inner.machines.get(addr).map(Entry::view)
    }

    /// A machine's live health.
    pub fn live(&self, address: &str) -> Option<LiveHealth> {
        self.lock().machines.get(address).map(|e| LiveHealth {
            last_report_at: e.live.last_report_at,
            boot_id: e.live.boot_id.clone(),
            healthy_since: self.fresh(e).then_some(e.live.healthy_since).flatten(),
            connected: e.live.connections > 0,
            goodbye: e.live.goodbye,
        })
    }

    /// The boot id the machine's agent last reported, to this run or, before it reconnected
    /// after a restart, to an earlier one (stored).
    pub fn known_boot_id(&self, address: &str) -> Option<String> {
        let inner = self.lock();
        inner
            .machines
            .get(address)?
            .live
            .known_boot_id()
            .map(String::from)
    }

    /// True when the last report arrived within the machine's unreachable grace.
    fn fresh(&self, e: &Entry) -> bool {
        let now = self.clock.now();
        let grace = self.cfg.grace_for(e.live.last_report.as_ref());
        e.live.last_report_at.is_some_and(|at| {
            now.as_millisecond() - at.as_millisecond()
                <= i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
        })
    }

    /// Start of the current unbroken run of reports in which no check failed, if the
    /// machine is reporting now (its last report is within the grace). Used by
    /// `agent-healthy`: "healthy for at least W after power-on at T" is
    /// `healthy_since(a).is_some_and(|s| s >= T && now - s >= W)`.
    pub fn healthy_since(&self, address: &str) -> Option<Timestamp> {
        let inner = self.lock();
        let e = inner.machines.get(address)?;
        if !self.fresh(e) {
            return None;
        }
        e.live.healthy_since
    }

    /// True when every report received since `since` (and the one in force at `since`)
    /// had no failing check, with no gap longer than the grace, no goodbye and no reboot,
    /// and the machine is reporting now.
    pub fn ok_continuously_since(&self, address: &str, since: Timestamp) -> bool {
        self.healthy_since(address).is_some_and(|s| s <= since)
    }

    /// Transitions of a machine, oldest first, at most `limit` (the most recent ones).
    pub async fn transitions(
        &self,
        address: &str,
        limit: usize,
    ) -> Result<Vec<StateTransition>, FleetError> {
        let address = address.to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = self.store.transitions(address, limit).await?;
        rows.reverse();
        Ok(rows)
    }

    /// Everything known about one machine, for `machines show`.
    pub async fn detail(&self, address: &str) -> Result<Option<MachineDetail>, FleetError> {
        let snapshot = {
            let inner = self.lock();
            inner.machines.get(address).map(|e| {
                (
                    self.summary(e),
                    e.live.clone(),
                    self.fresh(e).then_some(e.live.healthy_since).flatten(),
                )
            })
        };
        let Some((summary, live, healthy_since)) = snapshot else {
            return Ok(None);
        };
        let transitions = self.transitions(address, SHOW_TRANSITIONS).await?;
        Ok(Some(MachineDetail {
            summary,
            last_report: live.last_report,
            last_report_unix_ms: live.last_report_at.map(ms),
            transitions,
            boot_id: live.boot_id,
            agent_version: live.agent_version,
            healthy_since_unix_ms: healthy_since.map(ms),
            failing_since: live
                .failing_since
                .into_iter()
                .map(|(k, t)| (k, ms(t)))
                .collect(),
            kdump: None,
        }))
    }
}

fn ms(t: Timestamp) -> u64 {
    u64::try_from(to_unix_ms(t)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeClock;
    use jiff::SignedDuration;
    use protocol::messages::{
        AgentHello, CheckKind, CheckResult, CheckStatus, GoodbyeReason, HealthReport,
    };
    use std::time::Duration;

    struct Fx {
        _dir: tempfile::TempDir,
        db: std::path::PathBuf,
        clock: Arc<FakeClock>,
    }

    impl Fx {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let db = dir.path().join("c.db");
            Self {
                _dir: dir,
                db,
                clock: Arc::new(FakeClock::new("2026-01-01T00:00:00Z".parse().unwrap())),
            }
        }
        async fn fleet(&self) -> Fleet {
            let cfg = HealthConfig {
                report_interval: Duration::from_secs(1),
                unreachable_grace: Duration::from_secs(3),
                goodbye_grace: Duration::from_secs(60),
            };
            Fleet::open(Store::open(&self.db).unwrap(), self.clock.clone(), cfg)
                .await
                .unwrap()
        }
        fn tick(&self, secs: i64) {
            self.clock.advance(SignedDuration::from_secs(secs));
        }
    }

    fn rec(addr: &str, host: &str) -> MachineRecord {
        MachineRecord {
            address: addr.into(),
            hostname: host.into(),
            serial: "S".into(),
            rack: "r1".into(),
            role: "cs".into(),
            machine_type: Some("qemu".into()),
            labels: BTreeMap::new(),
            source: RecordSource::Admin,
        }
    }

    fn hello(host: &str, boot: &str) -> AgentHello {
        AgentHello {
            hostname: host.into(),
            serial: "S".into(),
            addresses: vec![],
            agent_version: "0.1".into(),
            boot_id: boot.into(),
        }
    }

    fn report(boot: &str, nic_ok: bool) -> HealthReport {
        HealthReport {
            seq: 1,
            time_unix_ms: 0,
            boot_id: boot.into(),
            checks: vec![CheckResult {
                kind: CheckKind::Nic,
                subject: "eth0".into(),
                status: if nic_ok {
                    CheckStatus::Ok
                } else {
                    CheckStatus::Fail
                },
                detail: "carrier".into(),
            }],
            report_interval_ms: 0,
        }
    }

    fn state(f: &Fleet, a: &str) -> MachineState {
        f.machine(a).unwrap().state
    }

    #[tokio::test]
    async fn the_last_boot_id_is_known_after_a_restart_before_the_agent_reconnects() {
        // Trap: a power step started after a restart, before the agent reported again,
        // took no boot id, and `@agent-healthy` passed without a reboot.
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![rec("10.0.0.1", "web-1")]).await.unwrap();
        assert_eq!(f.known_boot_id("10.0.0.1"), None);
        f.agent_hello("web-1", &hello("web-1", "b1"), "10.0.0.1".parse().unwrap())
            .await
            .unwrap();
        f.report("web-1", report("b1", true)).await.unwrap();
        drop(f);
        let f = fx.fleet().await;
        assert_eq!(f.known_boot_id("10.0.0.1").as_deref(), Some("b1"));
        assert!(
            f.live("10.0.0.1").unwrap().boot_id.is_none(),
            "live is this run's"
        );
        // A reboot is stored too.
        f.report("web-1", report("b2", true)).await.unwrap();
        drop(f);
        let f = fx.fleet().await;
        assert_eq!(f.known_boot_id("10.0.0.1").as_deref(), Some("b2"));
    }

    #[tokio::test]
    async fn a_name_resolves_to_an_address_a_hostname_or_itself() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![rec("10.0.0.1", "web-1"), rec("::1", "web-2")])
            .await
            .unwrap();
        assert_eq!(f.resolve("10.0.0.1"), "10.0.0.1");
        assert_eq!(f.resolve("web-1"), "10.0.0.1");
        // An IP address in another spelling is the machine's canonical one.
        assert_eq!(f.resolve("::0001"), "::1");
        assert_eq!(f.resolve("web-2"), "::1");
        // What matches nothing comes back as asked, for the caller to refuse or look up.
        assert_eq!(f.resolve("10.9.9.9"), "10.9.9.9");
        assert_eq!(f.resolve("nope"), "nope");
        // A host awaiting registration is keyed by what it reported; that key still works.
        f.agent_hello("stray", &hello("stray", "b1"), "192.0.2.7".parse().unwrap())
            .await
            .unwrap();
        let stray = f.machine_by_hostname("stray").unwrap().record.address;
        assert_eq!(f.resolve("stray"), stray);
        assert_eq!(f.resolve(&stray), stray);
    }

    #[tokio::test]
    async fn lifecycle_is_derived_persisted_and_reloaded() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![rec("10.0.0.1", "a")]).await.unwrap();
        assert_eq!(state(&f, "10.0.0.1"), MachineState::Uninitialized);
        let addr = f
            .agent_hello("a", &hello("a", "b1"), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(addr, "10.0.0.1");
        f.report("a", report("b1", true)).await.unwrap();
        assert_eq!(state(&f, &addr), MachineState::Healthy);
        let t0 = fx.clock.now();
        fx.tick(1);
        assert!(f.ok_continuously_since(&addr, t0));
        f.report("a", report("b1", false)).await.unwrap();
        assert_eq!(state(&f, &addr), MachineState::Unhealthy);
        assert_eq!(f.list()[0].failing, vec!["nic:eth0".to_string()]);
        assert!(!f.ok_continuously_since(&addr, t0));
        // Silence: only the sweep notices.
        fx.tick(3);
        assert!(f.sweep().await.unwrap().is_empty(), "grace not yet past");
        fx.tick(1);
        let made = f.sweep().await.unwrap();
        assert_eq!(made.len(), 1);
        assert_eq!(state(&f, &addr), MachineState::Unreachable);
        assert_eq!(f.healthy_since(&addr), None);
        drop(f);

        let f = fx.fleet().await;
        assert_eq!(state(&f, "10.0.0.1"), MachineState::Unreachable);
        let hist: Vec<String> = f
            .transitions("10.0.0.1", 100)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.to)
            .collect();
        assert_eq!(
            hist,
            ["uninitialized", "healthy", "unhealthy", "unreachable"]
        );
    }

    #[tokio::test]
    async fn a_silent_agent_that_quic_still_hears_is_told_apart_from_a_dead_machine() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![
            rec("10.0.0.1", "dead"),
            rec("10.0.0.2", "slow"),
            rec("10.0.0.3", "gone"),
        ])
        .await
        .unwrap();
        for h in ["dead", "slow", "gone"] {
            f.agent_hello(h, &hello(h, "b1"), "127.0.0.1".parse().unwrap())
                .await
                .unwrap();
            f.report(h, report("b1", true)).await.unwrap();
        }
        f.disconnected("gone").await;
        // Nothing is sampled while the agents are on time (interval 1 s): no connection is
        // read in a fleet that reports.
        assert!(f.silent_connected().is_empty());
        fx.tick(1);
        assert!(f.silent_connected().is_empty());
        // Late by half an interval: the connected ones are sampled, and their counts include
        // the acknowledgement of the last reply.
        fx.tick(1);
        let mut silent = f.silent_connected();
        silent.sort();
        assert_eq!(silent, ["10.0.0.1", "10.0.0.2"], "`gone` has no connection");
        let mut counts = std::collections::HashMap::from([
            ("10.0.0.1".to_string(), 10u64),
            ("10.0.0.2".into(), 20),
        ]);
        assert!(f.sweep_heard(&counts).await.unwrap().is_empty());
        // Then only `slow` is heard from again (its keep-alives).
        *counts.get_mut("10.0.0.2").unwrap() += 2;
        fx.tick(2);
        let made: BTreeMap<_, _> = f.sweep_heard(&counts).await.unwrap().into_iter().collect();
        assert_eq!(made.len(), 3, "{made:?}");
        let alive = "the agent runs but does not report";
        for (a, expect) in [("10.0.0.1", false), ("10.0.0.2", true), ("10.0.0.3", false)] {
            let d = &made[a];
            assert_eq!(d.state, MachineState::Unreachable);
            assert_eq!(d.reason.contains(alive), expect, "{a}: {}", d.reason);
        }
        // A report clears what was heard: the next silence starts from nothing.
        f.report("slow", report("b1", true)).await.unwrap();
        fx.tick(2);
        f.sweep_heard(&counts).await.unwrap();
        fx.tick(2);
        let made = f.sweep_heard(&counts).await.unwrap();
        assert_eq!(made.len(), 1, "{made:?}");
        assert!(!made[0].1.reason.contains(alive), "{}", made[0].1.reason);
    }

    #[tokio::test]
    async fn snapshot_has_what_detectors_read_in_domain_types() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        let mut r = rec("10.0.0.2", "b");
        r.labels.insert("zone".into(), "z1".into());
        f.upsert(vec![rec("10.0.0.1", "a"), r]).await.unwrap();
        f.agent_hello("a", &hello("a", "b1"), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        f.report("a", report("b1", false)).await.unwrap();
        let failed_at = fx.clock.now();
        fx.tick(1);
        f.agent_hello("b", &hello("b", "b7"), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        f.report("b", report("b7", true)).await.unwrap();
        f.goodbye("b", GoodbyeReason::Shutdown).await.unwrap();
        let snap = f.snapshot();
        assert_eq!(snap.taken_at, Some(fx.clock.now()));
        assert_eq!(snap.machines.len(), 2);
        let a = snap.machine("10.0.0.1").unwrap();
        assert_eq!(
            (a.record.rack.as_str(), a.record.role.as_str()),
            ("r1", "cs")
        );
        assert_eq!(a.record.machine_type.as_deref(), Some("qemu"));
        assert_eq!(a.state, MachineState::Unhealthy);
        assert_eq!(a.since, failed_at);
        assert_eq!(a.last_report_at, Some(failed_at));
        assert_eq!(a.boot_id.as_deref(), Some("b1"));
        assert_eq!(
            a.failing.iter().collect::<Vec<_>>(),
            [(&"nic:eth0".to_string(), &failed_at)]
        );
        assert_eq!(a.goodbye, None);
        let b = snap.machine("10.0.0.2").unwrap();
        assert_eq!(b.record.labels["zone"], "z1");
        assert!(b.failing.is_empty());
        assert_eq!(b.goodbye.map(|(why, _)| why), Some(GoodbyeReason::Shutdown));
        assert!(snap.machine("10.0.0.3").is_none());
    }

    #[tokio::test]
    async fn unknown_host_awaits_registration_and_registration_adopts_it() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        let addr = f
            .agent_hello("stray", &hello("stray", "b1"), "127.0.0.9".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(addr, "127.0.0.9");
        f.report("stray", report("b1", true)).await.unwrap();
        let v = f.machine(&addr).unwrap();
        assert_eq!(v.state, MachineState::AwaitingRegistration);
        assert_eq!(v.record.machine_type, None);
        // Registering the hostname at its real address takes over its live health.
        let out = f.upsert(vec![rec("10.0.0.9", "stray")]).await.unwrap();
        assert_eq!(out[0].state, "healthy");
        assert!(f.machine("127.0.0.9").is_none());
        assert_eq!(
            f.machine_by_hostname("stray").unwrap().record.address,
            "10.0.0.9"
        );
    }

    #[tokio::test]
    async fn unknown_host_is_recorded_under_the_address_it_reports() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        let mut h = hello("stray", "b1");
        h.addresses = vec!["10.0.0.9".parse().unwrap()];
        let addr = f
            .agent_hello("stray", &h, "127.0.0.9".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(addr, "10.0.0.9", "not the UDP source");
    }

    #[tokio::test]
    async fn hostname_of_registered_machine_cannot_be_taken() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![rec("10.0.0.1", "a")]).await.unwrap();
        let e = f.upsert(vec![rec("10.0.0.2", "a")]).await.unwrap_err();
        assert!(matches!(e, FleetError::HostnameTaken { .. }), "{e}");
        // Unchanged re-import writes nothing new.
        f.upsert(vec![rec("10.0.0.1", "a")]).await.unwrap();
        assert_eq!(f.transitions("10.0.0.1", 10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_hostname_moves_in_the_file_unless_its_old_machine_is_being_repaired() {
        let file = std::path::Path::new("/etc/fleetmend/machines.toml");
        let inv = |addr: &str, host: &str| MachineRecord {
            source: RecordSource::Inventory,
            ..rec(addr, host)
        };
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![inv("10.0.0.1", "a"), inv("10.0.0.2", "b")])
            .await
            .unwrap();
        // `a` moves to 10.0.0.3 while 10.0.0.1 is being repaired: its record stays, and the
        // new address waits (the start goes on without it; the upsert alone would refuse).
        let file_now = vec![inv("10.0.0.3", "a"), inv("10.0.0.2", "b")];
        let busy = ["10.0.0.1".to_string()].into_iter().collect();
        let r = f.release_unlisted(&file_now, file, &busy).await.unwrap();
        assert_eq!(
            r,
            Released {
                released: vec!["10.0.0.1".into()],
                moved: vec![],
                deferred: vec!["10.0.0.3".into()],
            }
        );
        let e = f.upsert(file_now.clone()).await.unwrap_err();
        assert!(matches!(e, FleetError::HostnameTaken { .. }), "{e}");
        let old = f.machine("10.0.0.1").unwrap();
        assert_eq!(old.state, MachineState::Retired);
        assert_eq!(
            old.record.source,
            RecordSource::Admin,
            "released to the operator"
        );
        // Once the repair is over, the next start hands the hostname over.
        let r = f
            .release_unlisted(&file_now, file, &Default::default())
            .await
            .unwrap();
        assert_eq!(
            (r.released, r.moved),
            (vec![], vec!["10.0.0.1".to_string()])
        );
        f.upsert(file_now).await.unwrap();
        assert!(f.machine("10.0.0.1").is_none());
        assert_eq!(
            f.machine_by_hostname("a").unwrap().record.address,
            "10.0.0.3"
        );
        // A machine the file lists is never touched, nor one added by hand.
        f.upsert(vec![rec("10.0.0.7", "h")]).await.unwrap();
        let r = f
            .release_unlisted(&[inv("10.0.0.3", "a")], file, &Default::default())
            .await
            .unwrap();
        assert_eq!(
            (r.released, r.moved),
            (vec!["10.0.0.2".to_string()], vec![])
        );
        assert_eq!(
            f.machine("10.0.0.7").unwrap().record.source,
            RecordSource::Admin
        );
        assert_ne!(f.machine("10.0.0.3").unwrap().state, MachineState::Retired);
    }

    #[tokio::test]
    async fn goodbye_stops_without_unreachable_and_reboot_resets_healthy_run() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![rec("10.0.0.1", "a")]).await.unwrap();
        let a = "10.0.0.1";
        f.agent_hello("a", &hello("a", "b1"), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        f.report("a", report("b1", true)).await.unwrap();
        let t0 = fx.clock.now();
        f.goodbye("a", GoodbyeReason::Shutdown).await.unwrap();
        assert_eq!(state(&f, a), MachineState::Stopped);
        fx.tick(30);
        f.sweep().await.unwrap();
        assert_eq!(state(&f, a), MachineState::Stopped);
        f.agent_hello("a", &hello("a", "b2"), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        f.report("a", report("b2", true)).await.unwrap();
        assert_eq!(state(&f, a), MachineState::Healthy);
        assert!(!f.ok_continuously_since(a, t0));
        assert_eq!(f.live(a).unwrap().boot_id.as_deref(), Some("b2"));
    }

    #[tokio::test]
    async fn agent_certificates_are_counted_per_machine_not_retired() {
        let fx = Fx::new();
        let f = fx.fleet().await;
        f.upsert(vec![
            rec("10.0.0.1", "a"),
            rec("10.0.0.2", "b"),
            rec("10.0.0.3", "c"),
            rec("10.0.0.4", "d"),
        ])
        .await
        .unwrap();
        assert_eq!(f.agent_certificates(0), AgentCertificates::default());
        for (h, t) in [("a", 500), ("b", 100), ("c", 2000), ("d", 50)] {
            f.agent_hello(h, &hello(h, "b1"), "127.0.0.1".parse().unwrap())
                .await
                .unwrap();
            f.note_certificate(h, t);
        }
        // A renewed certificate replaces the one noted before; a stranger is ignored.
        f.note_certificate("b", 200);
        f.note_certificate("nobody", 1);
        f.set_admin_state("10.0.0.4", Some(MachineState::Retired), "gone")
            .await
            .unwrap();
        assert_eq!(
            f.agent_certificates(600),
            AgentCertificates {
                known: 3,
                earliest: Some(200),
                expiring: 2,
            }
        );
        assert_eq!(
            f.expiring_agents(600),
            [("b".to_string(), 200), ("a".to_string(), 500)]
        );
    }
}
