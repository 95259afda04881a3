//! `coordinator renew-identity`: a new store identity for an etcd prefix, after an etcd
//! snapshot was restored under it (`docs/operations.md`, "Backup and restore on etcd").
//!
//! A restored snapshot holds the entries and fence flows of its time, and a coordinator on it
//! would number new ones with the indexes used since: under the old identity a gateway would
//! answer a new power request with the result of an old one, and would refuse the new
//! leader's tokens, whose epoch (the leader key's create revision) is lower than the ones it
//! saw after the snapshot. Under a new identity every request and token is new to every
//! gateway, as after `coordinator restore` on SQLite.
//!
//! Never under a leader: the identity is written in one transaction that compares the
//! leader key's absence (a coordinator leading reads the identity once, when it takes the
//! lead, and would go on with the old one). A restored snapshot holds the leader key of its
//! time, bound to a lease that runs out within its TTL once etcd is up: the refusal names the
//! holder and the seconds left, so the operator stops what still runs, or waits, and runs the
//! command again.

use serde::Serialize;

use super::election::LEADER_KEY;
use super::role::LeaderRecord;
use crate::store::etcd::schema::{IDENTITY_KEY, IdentityRecord};
use crate::store::etcd::{EtcdError, EtcdStore};

/// What was renewed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Renewed {
    /// The key prefix.
    pub prefix: String,
    /// The identity before (`None` when the prefix had none).
    pub previous: Option<String>,
    /// The new identity.
    pub store_id: String,
}

impl std::fmt::Display for Renewed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "new store identity {} under {} (it was {}): gateways take every power request and \
             token as new; start the coordinators",
            self.store_id,
            self.prefix,
            self.previous.as_deref().unwrap_or("missing"),
        )
    }
}

/// Why the identity was not renewed.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// A leader key is there: a coordinator leads, or a restored key's lease has not run out.
    #[error(
        "{key} names a leader ({holder}), bound to a lease with {ttl_left} s left: a coordinator \
         leads, or the key came back with the snapshot and its lease has not run out yet. Stop \
         every coordinator of the fleet (standbys too) and run this again once the key is gone \
         (within {ttl_left} s; `etcdctl del {key}` removes it at once when nothing runs)"
    )]
    Led {
        /// The leader key.
        key: String,
        /// Who it names.
        holder: String,
        /// Seconds its lease has left (-1: none, or already gone).
        ttl_left: i64,
    },
    /// etcd failed or answered something unusable.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// Writes a new identity under `store`'s prefix, unless a leader key is there.
pub async fn renew_identity(store: &EtcdStore) -> Result<Renewed, RenewError> {
    let previous = store.kv_get::<IdentityRecord>(IDENTITY_KEY).await?;
    let next = IdentityRecord {
        store_id: format!("{:032x}", rand::random::<u128>()),
        created_ms: jiff::Timestamp::now().as_millisecond(),
    };
    let written = store
        .txn()
        .if_absent(LEADER_KEY)
        .if_mod_revision(
            IDENTITY_KEY,
            previous.as_ref().map_or(0, |v| v.mod_revision),
        )
        .put(IDENTITY_KEY, &next)?
        .commit()
        .await?;
    if written {
        return Ok(Renewed {
            prefix: store.prefix().to_string(),
            previous: previous.map(|v| v.value.store_id),
            store_id: next.store_id,
        });
    }
    let key = store.key(LEADER_KEY);
    let Some(kv) = store.get_raw(&key).await? else {
        // The identity changed under us (another renewal): say so rather than guess.
        return Err(EtcdError::Conflict {
            key: store.key(IDENTITY_KEY),
        }
        .into());
    };
    let holder = match serde_json::from_slice::<LeaderRecord>(kv.value()) {
        Ok(l) => format!(
            "{} at {}, pid {}, since {}",
            l.name, l.address, l.pid, l.since
        ),
        Err(_) => "a record this coordinator cannot read".into(),
    };
    let lease = kv.lease();
    let ttl_left = match store
        .bounded("lease time-to-live", &key, |c| {
            let mut leases = c.lease_client();
            async move { leases.time_to_live(lease, None).await }
        })
        .await
    {
        Ok(t) => t.ttl(),
        Err(_) => -1,
    };
    Err(RenewError::Led {
        key,
        holder,
        ttl_left,
    })
}
