//! Campaigning for the leader key: a create-if-absent transaction on `<prefix>/leader`,
//! bound to a lease this candidate was just granted.
//!
//! Not etcd's server-side `Campaign` alone: it can answer "leader" for a lease that already
//! expired (etcd issues #11007, #21128). Here the answer is the transaction itself: it
//! compares the key's create revision with 0 and puts the key with the lease, so it succeeds
//! only if nobody holds the key and the lease is alive at that revision (a put with an
//! expired lease is refused). The **epoch** is the revision that put made: the key's create
//! revision, which only grows, so a later leader always has a higher epoch.
//!
//! The term starts valid until the moment the lease was *asked for* plus its TTL, on the
//! monotonic clock: etcd counts the TTL from when it granted the lease, which is later, so
//! this process stops believing it leads before etcd could let anyone else lead.
//!
//! A candidate that finds the key held stands by ([`RoleHandle::stand_by`], naming the
//! leader) and watches the key until it is deleted (its lease expired or was revoked), then
//! campaigns again; the watch is re-armed every TTL, so a broken watch costs at most one TTL.
//! Not here: keeping the lease alive once leading ([`super::keepalive`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, KeyValue, PutOptions, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio_util::sync::CancellationToken;

use super::role::{LeaderRecord, RoleHandle};
use crate::store::EtcdStore;
use crate::store::etcd::EtcdError;
use crate::store::etcd::fence::Term;

/// The leader key, relative to the store's prefix.
pub const LEADER_KEY: &str = "leader";

/// How long a candidate waits after etcd failed it before trying again: etcd down is
/// reported once per try, and a second is short next to any lease TTL.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A coordinator that campaigns for the lead of one store.
#[derive(Debug, Clone)]
pub struct Candidate {
    store: EtcdStore,
    name: String,
    address: String,
    ttl: Duration,
    role: Arc<RoleHandle>,
}

/// A won election: the epoch, the lease that keeps the key, the term, and the store handle
/// fenced by it (every write through it compares the epoch).
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The leader key's create revision.
    pub epoch: i64,
    /// The lease the key is bound to.
    pub lease: i64,
    /// The lease's TTL as etcd granted it.
    pub ttl: Duration,
    /// The term: until when this process may act, and whether it has ended.
    pub term: Arc<Term>,
    /// The store, fenced by this leadership.
    pub store: EtcdStore,
    /// The unfenced store (for the election's own requests).
    pub(crate) raw: EtcdStore,
    /// What the key says.
    pub record: LeaderRecord,
}

enum Attempt {
    Won(Leadership),
    Held(KeyValue),
}

impl Candidate {
    /// A candidate named `name`, reachable at `address`, for leases of `ttl`, reporting its
    /// role to `role`.
    pub fn new(
        store: EtcdStore,
        name: impl Into<String>,
        address: impl Into<String>,
        ttl: Duration,
        role: Arc<RoleHandle>,
    ) -> Self {
        Self {
            store,
            name: name.into(),
            address: address.into(),
            ttl,
            role,
        }
    }

    /// The role it reports to.
    pub fn role(&self) -> &Arc<RoleHandle> {
        &self.role
    }

    /// Campaigns until it leads (the role becomes [`super::Role::Leader`]) or `stop` fires
    /// (`None`). Meanwhile a standby, naming the leader; etcd failures are logged and retried.
    pub async fn campaign(&self, stop: &CancellationToken) -> Option<Leadership> {
        let mut said_failing = false;
        loop {
            if stop.is_cancelled() {
                return None;
            }
            match self.try_once().await {
                Ok(Attempt::Won(l)) => {
                    tracing::info!(
                        epoch = l.epoch,
                        lease = format_args!("{:x}", l.lease),
                        ttl = ?l.ttl,
                        "this coordinator leads"
                    );
                    self.role.lead(l.term.clone());
                    return Some(l);
                }
                Ok(Attempt::Held(kv)) => {
                    said_failing = false;
                    let leader = serde_json::from_slice::<LeaderRecord>(kv.value()).ok();
                    if leader.is_none() {
                        tracing::warn!(key = %self.store.key(LEADER_KEY), "the leader key holds no leader record this coordinator can read; waiting for it to go");
                    }
                    self.role.stand_by(leader, Some(kv.create_revision()));
                    self.wait_vacant(&kv, stop).await;
                }
                Err(e) => {
                    if !said_failing {
                        tracing::warn!(error = %e, "campaign for the lead failed; trying again every second");
                        said_failing = true;
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(RETRY_AFTER) => {}
                    }
                }
            }
        }
    }

    async fn try_once(&self) -> Result<Attempt, EtcdError> {
        let key = self.store.key(LEADER_KEY);
        let asked = Instant::now();
        let ttl_secs = i64::try_from(self.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let granted = self
            .store
            .bounded("lease grant", &key, |c| {
                let mut leases = c.lease_client();
                async move { leases.grant(ttl_secs, None).await }
            })
            .await?;
        let lease = granted.id();
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
        let record = LeaderRecord {
            name: self.name.clone(),
            address: self.address.clone(),
            since: jiff::Timestamp::now(),
            pid: std::process::id(),
        };
        let value = serde_json::to_vec(&record).map_err(|source| EtcdError::Json {
            key: key.clone(),
            source,
        })?;
        let txn = etcd_client::Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = match self.store.txn_raw(&key, txn).await {
            Ok(r) => r,
            Err(e) => {
                // The put may have landed: revoking the lease deletes the key if it did.
                self.revoke(lease).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let epoch = resp.header().map(|h| h.revision()).unwrap_or(0);
            // The TTL counts from the grant, which etcd made after `asked`.
            let term = Arc::new(Term::new(epoch, asked + ttl));
            return Ok(Attempt::Won(Leadership {
                epoch,
                lease,
                ttl,
                store: self.store.fenced(LEADER_KEY, term.clone()),
                term,
                raw: self.store.clone(),
                record,
            }));
        }
        self.revoke(lease).await;
        let held = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        match held {
            Some(kv) => Ok(Attempt::Held(kv)),
            // Deleted between the compare and the read: campaign again at once.
            None => Err(EtcdError::Conflict { key }),
        }
    }

    async fn revoke(&self, lease: i64) {
        let key = self.store.key(LEADER_KEY);
        if let Err(e) = revoke(&self.store, &key, lease).await {
            tracing::debug!(error = %e, "revoking an unused lease failed; it expires by itself");
        }
    }

    /// Waits until the key `held` is deleted (or replaced), for at most one TTL.
    async fn wait_vacant(&self, held: &KeyValue, stop: &CancellationToken) {
        let key = self.store.key(LEADER_KEY);
        let opts = WatchOptions::new().with_start_revision(held.mod_revision() + 1);
        let mut watches = self.store.client().watch_client();
        let bound = tokio::time::sleep(self.ttl);
        tokio::pin!(bound);
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            _ = &mut bound => return,
            s = watches.watch(key.clone(), Some(opts)) => s,
        };
        let Ok(mut stream) = stream else {
            return;
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                _ = &mut bound => return,
                m = stream.message() => m,
            };
            match msg {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        return;
                    }
                    let gone = resp.events().iter().any(|ev| {
                        ev.event_type() == EventType::Delete
                            || ev
                                .kv()
                                .is_some_and(|kv| kv.create_revision() != held.create_revision())
                    });
                    if gone {
                        return;
                    }
                }
                Ok(None) | Err(_) => return,
            }
        }
    }
}

impl Leadership {
    /// Gives the lead up on a clean stop: deletes the key if it is still this epoch's and
    /// revokes the lease, so a standby takes over at once instead of after the TTL.
    pub async fn resign(&self) {
        self.term.end("it resigned (a clean stop)");
        let key = self.raw.key(LEADER_KEY);
        let txn = etcd_client::Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                self.epoch,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        if let Err(e) = self.raw.txn_raw(&key, txn).await {
            tracing::warn!(error = %e, "could not delete the leader key on resigning; a standby takes over when its lease expires");
        }
        let _ = revoke(&self.raw, &key, self.lease).await;
    }
}

/// Revokes `lease` (deleting the leader key `key` if the lease holds it).
async fn revoke(store: &EtcdStore, key: &str, lease: i64) -> Result<(), EtcdError> {
    store
        .bounded("lease revoke", key, |c| {
            let mut leases = c.lease_client();
            async move { leases.revoke(lease).await }
        })
        .await
        .map(drop)
}
