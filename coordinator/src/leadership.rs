//! Whether this coordinator leads, as the QUIC server reads it at every hello.
//!
//! A coordinator that leads serves every client. One that does not (a standby, issue 31)
//! answers every hello with "standby; the leader is X" ([`protocol::messages::HelloReply::Standby`])
//! and serves nothing: agents and `coordinatorctl` go to the leader at once, or to their next
//! coordinator address when no leader is known. [`Leadership`] is the shared handle the
//! election (the `ha` work) drives; until it is merged a coordinator always leads.
//!
//! Test builds only (the `failpoints` feature, as for the fence kill points): the
//! environment variable [`TEST_ONLY_STANDBY_ENV`] makes a coordinator answer as a standby of
//! the address it holds (empty: no leader known), so the clients' side can be tested with real
//! processes before the election exists. Release builds never read it.

use std::sync::{Arc, RwLock};

/// Test builds only: `host:port` of the leader this coordinator says it stands by for.
pub const TEST_ONLY_STANDBY_ENV: &str = "FLEETMEND_TEST_ONLY_STANDBY_OF";

/// This coordinator's part now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// It leads: it serves and acts.
    Leader,
    /// It does not lead; `leader` is the leading coordinator's QUIC address when known.
    Standby {
        /// `host:port`, as clients reach it.
        leader: Option<String>,
    },
}

/// The shared handle: whoever decides sets it, the server reads it at each hello.
#[derive(Debug, Clone)]
pub struct Leadership {
    inner: Arc<RwLock<Role>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Self::leader()
    }
}

impl Leadership {
    /// A coordinator that leads (the only part there is until the election exists).
    pub fn leader() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Role::Leader)),
        }
    }

    /// The part the environment gives: [`TEST_ONLY_STANDBY_ENV`] in test builds, else leader.
    pub fn from_env() -> Self {
        let l = Self::leader();
        #[cfg(any(test, feature = "failpoints"))]
        if let Ok(v) = std::env::var(TEST_ONLY_STANDBY_ENV) {
            tracing::warn!(
                leader = %v,
                "test build: answering every hello as a standby ({TEST_ONLY_STANDBY_ENV})"
            );
            l.set(Role::Standby {
                leader: (!v.is_empty()).then_some(v),
            });
        }
        l
    }

    /// Sets the part from now on.
    pub fn set(&self, role: Role) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = role;
    }

    /// The part now.
    pub fn role(&self) -> Role {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Some(leader)` while this coordinator does not lead.
    pub fn standby_of(&self) -> Option<Option<String>> {
        match self.role() {
            Role::Leader => None,
            Role::Standby { leader } => Some(leader),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coordinator_leads_until_told_otherwise_and_clones_share_the_part() {
        let l = Leadership::default();
        assert_eq!(l.role(), Role::Leader);
        assert_eq!(l.standby_of(), None);
        let shared = l.clone();
        l.set(Role::Standby {
            leader: Some("10.0.0.2:7443".into()),
        });
        assert_eq!(shared.standby_of(), Some(Some("10.0.0.2:7443".into())));
    }
}
