//! The coordinator's fencing token: (store identity, epoch), read at send time by every
//! power request ([`crate::gateway::QuicGateways`]) and agent action
//! ([`crate::agent_link::AgentLinks`]).
//!
//! [`LeaseToken`] is a cheap shared handle: whoever decides the epoch sets it, the senders
//! read it for each request. On SQLite the epoch is the store's counter, bumped durably at
//! each start ([`at_start`]): a second coordinator started on a copy of the file, or an old
//! process that wakes up after a newer one started, sends an older epoch and is refused by
//! every gateway and agent the newer one has spoken to. On etcd the epoch is a placeholder
//! (0) until the election (issue 31, the `ha` work) sets the leader key's create revision
//! here with [`LeaseToken::set`] when it wins, and [`LeaseToken::clear`] when it loses.
//!
//! A handle with no token (cleared, or `coordinator check`, which never acts) makes every
//! send fail before anything leaves: nothing is sent without a token.

use std::sync::{Arc, RwLock};

use protocol::fencing::FencingToken;

use crate::store::{IdentityStore, Store, StoreError};

/// The token the coordinator sends with, shared by every sender.
#[derive(Debug, Clone, Default)]
pub struct LeaseToken {
    inner: Arc<RwLock<Option<FencingToken>>>,
}

impl LeaseToken {
    /// A handle with no token: nothing can be sent until [`LeaseToken::set`].
    pub fn unset() -> Self {
        Self::default()
    }

    /// A handle holding `token`.
    pub fn fixed(token: FencingToken) -> Self {
        let t = Self::default();
        t.set(token);
        t
    }

    /// Sends with `token` from now on (a start, a won election).
    pub fn set(&self, token: FencingToken) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
    }

    /// Sends nothing from now on (a lost election).
    pub fn clear(&self) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The token to send with now, if any.
    pub fn current(&self) -> Option<FencingToken> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The token of a coordinator starting on `store`: its identity and a new epoch (SQLite: the
/// counter bumped by one and on disk before this returns; etcd: the placeholder, see the
/// module's words).
pub async fn at_start(store: &Store) -> Result<LeaseToken, StoreError> {
    let store_id = store.identity().await?;
    let epoch = store.next_epoch().await?;
    tracing::info!(store = %store_id, epoch, "fencing epoch of this start: gateways and agents refuse requests of older epochs of this store from now on");
    Ok(LeaseToken::fixed(FencingToken {
        store: store_id,
        epoch,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_start_on_a_store_sends_a_newer_epoch_of_its_identity() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let first = at_start(&store).await.unwrap().current().unwrap();
        let second = at_start(&store).await.unwrap();
        let t = second.current().unwrap();
        assert_eq!(t.store, first.store);
        assert_eq!(t.epoch, first.epoch + 1);
        // A clone reads what the one that decides sets.
        let shared = second.clone();
        second.clear();
        assert_eq!(shared.current(), None);
        shared.set(first.clone());
        assert_eq!(second.current(), Some(first));
        assert_eq!(LeaseToken::unset().current(), None);
    }
}
