//! Whether this coordinator leads, as the QUIC server reads it at every hello.
//!
//! A coordinator that leads serves every client. One that does not (a standby, or one whose
//! term has just ended) answers every hello with "standby; the leader is X"
//! ([`protocol::messages::HelloReply::Standby`]) and serves nothing: agents and
//! `coordinatorctl` go to the leader at once, or to their next coordinator address when no
//! leader is known. [`Leadership`] reads the election's [`RoleHandle`]: with SQLite the role
//! is the sole coordinator's, which always leads.
//!
//! Test builds only (the `failpoints` feature, as for the fence kill points): the
//! environment variable [`TEST_ONLY_STANDBY_ENV`] makes a coordinator answer as a standby of
//! the address it holds (empty: no leader known), so the clients' side can be tested with
//! real processes without an election. Release builds never read it.

use std::sync::Arc;

use crate::ha::{Role, RoleHandle};

/// Test builds only: `host:port` of the leader this coordinator says it stands by for.
pub const TEST_ONLY_STANDBY_ENV: &str = "FLEETMEND_TEST_ONLY_STANDBY_OF";

/// The hello's view of the role: cheap to clone, read at each hello.
#[derive(Debug, Clone)]
pub struct Leadership {
    role: Arc<RoleHandle>,
    /// Test builds: the standby answer [`TEST_ONLY_STANDBY_ENV`] forces.
    forced: Option<Option<String>>,
}

impl Leadership {
    /// The view of `role`, with the test builds' override from the environment.
    pub fn new(role: Arc<RoleHandle>) -> Self {
        #[allow(unused_mut)]
        let mut forced = None;
        #[cfg(any(test, feature = "failpoints"))]
        if let Ok(v) = std::env::var(TEST_ONLY_STANDBY_ENV) {
            tracing::warn!(
                leader = %v,
                "test build: answering every hello as a standby ({TEST_ONLY_STANDBY_ENV})"
            );
            forced = Some((!v.is_empty()).then_some(v));
        }
        Self { role, forced }
    }

    /// `Some(leader address)` while this coordinator does not lead (`Some(None)`: no leader
    /// known, or this one's term has just ended); `None` while it leads.
    pub fn standby_of(&self) -> Option<Option<String>> {
        if let Some(f) = &self.forced {
            return Some(f.clone());
        }
        if self.role.is_leading() {
            return None;
        }
        match self.role.current() {
            Role::Standby { leader, .. } => Some(leader.map(|l| l.address)),
            _ => Some(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::LeaderRecord;
    use crate::store::etcd::fence::Term;
    use std::time::{Duration, Instant};

    #[test]
    fn the_hello_answers_as_the_role_says_and_a_passed_term_names_no_leader() {
        assert_eq!(Leadership::new(RoleHandle::sole()).standby_of(), None);
        let r = RoleHandle::elected();
        let l = Leadership::new(r.clone());
        assert_eq!(l.standby_of(), Some(None), "campaigning: no leader known");
        r.stand_by(
            Some(LeaderRecord {
                name: "c2".into(),
                address: "10.0.0.2:7443".into(),
                since: jiff::Timestamp::now(),
                pid: 1,
            }),
            Some(7),
        );
        assert_eq!(l.standby_of(), Some(Some("10.0.0.2:7443".into())));
        let term = Arc::new(Term::new(9, Instant::now() + Duration::from_secs(60)));
        r.lead(term.clone());
        assert_eq!(l.standby_of(), None);
        term.end("test");
        assert_eq!(
            l.standby_of(),
            Some(None),
            "a leader whose term ended serves nothing"
        );
    }
}
