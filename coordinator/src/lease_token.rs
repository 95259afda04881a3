//! The coordinator's fencing token: (store identity, epoch), read at send time by every
//! power request ([`crate::gateway::QuicGateways`]) and agent action
//! ([`crate::agent_link::AgentLinks`]).
//!
//! [`LeaseToken`] is a cheap shared handle: whoever decides the epoch sets it, the senders
//! read it for each request. On SQLite the epoch is the store's counter, bumped durably at
//! each start ([`at_start`]): a second coordinator started on a copy of the file, or an old
//! process that wakes up after a newer one started, sends an older epoch and is refused by
//! every gateway and agent the newer one has spoken to. On etcd the epoch is the leader
//! key's create revision, set when this coordinator wins the election (`crate::app`), and
//! the token is bound to the election's role ([`LeaseToken::bound_to`]): it is there only
//! while the role leads and its term holds by the monotonic clock, read at each send, so a
//! leader paused past its lease sends nothing when it wakes.
//!
//! A handle with no token (cleared, or `coordinator check`, which never acts) makes every
//! send fail before anything leaves: nothing is sent without a token.

use std::sync::{Arc, RwLock};

use protocol::fencing::FencingToken;

use crate::ha::RoleHandle;
use crate::store::{IdentityStore, Store, StoreError};

/// The token the coordinator sends with, shared by every sender.
#[derive(Debug, Clone, Default)]
pub struct LeaseToken {
    inner: Arc<RwLock<Option<FencingToken>>>,
    /// The elected role the token is good for only while it leads.
    role: Option<Arc<RoleHandle>>,
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

    /// The same token, there only while `role` leads ([`RoleHandle::is_leading`]).
    pub fn bound_to(mut self, role: Arc<RoleHandle>) -> Self {
        self.role = Some(role);
        self
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
        if self.role.as_ref().is_some_and(|r| !r.is_leading()) {
            return None;
        }
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

    #[test]
    fn a_token_bound_to_an_elected_role_is_there_only_while_its_term_holds() {
        use crate::store::etcd::fence::Term;
        use std::time::{Duration, Instant};
        let role = RoleHandle::elected();
        let t = LeaseToken::fixed(FencingToken {
            store: "s".into(),
            epoch: 42,
        })
        .bound_to(role.clone());
        assert_eq!(t.current(), None, "not leading yet");
        let term = Arc::new(Term::new(42, Instant::now() + Duration::from_millis(50)));
        role.lead(term);
        assert_eq!(t.current().map(|t| t.epoch), Some(42));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            t.current(),
            None,
            "the term's deadline passed: nothing is sent"
        );
    }
}
