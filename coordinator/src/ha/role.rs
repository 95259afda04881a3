//! The role this coordinator plays, shared with every part that must know it: the acting
//! loops (they run only while it leads), `/healthz` and `/metrics`, the hello answer to
//! agents and `coordinatorctl` (a standby names the leader), and the fencing tokens of power
//! requests and agent actions (store identity and epoch).
//!
//! [`RoleHandle`] holds the [`Role`] in a watch channel, so a part can wait for a change,
//! and the current leadership [`Term`], so "may I act now?" ([`RoleHandle::is_leading`]) is
//! answered from the monotonic clock at the moment of asking: a process that was paused
//! past its lease learns it has lost before its next action, not when its keep-alive loop
//! next runs. With SQLite there is no election: [`RoleHandle::sole`] always leads, epoch 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::store::etcd::fence::Term;

/// What the leader key holds (JSON, readable with `etcdctl get`): who leads and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The coordinator's name.
    pub name: String,
    /// Where agents and coordinatorctl reach it (`host:port`).
    pub address: String,
    /// When it took the lead.
    pub since: Timestamp,
    /// Its process id on its host (for an operator reading the key).
    pub pid: u32,
}

/// This coordinator's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Started, not yet leading nor knowing who leads (campaigning, or etcd not answering).
    Starting,
    /// Leading: acting, every write fenced by `epoch`.
    Leader {
        /// The leader key's create revision.
        epoch: i64,
        /// When this coordinator took the lead.
        since: Timestamp,
    },
    /// Waiting: another coordinator leads (or did when last seen).
    Standby {
        /// The leader as its key says, when one was seen.
        leader: Option<LeaderRecord>,
        /// The leader's epoch, when one was seen.
        epoch: Option<i64>,
        /// When this coordinator became a standby.
        since: Timestamp,
    },
    /// Was leading and lost it; acts no more and is about to exit or stand by.
    Deposed {
        /// The epoch it held.
        epoch: i64,
        /// Why the term ended.
        why: String,
        /// When.
        since: Timestamp,
    },
}

impl Role {
    /// `leader`, `standby`, `starting` or `deposed`.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Leader { .. } => "leader",
            Role::Standby { .. } => "standby",
            Role::Deposed { .. } => "deposed",
        }
    }

    /// The epoch of the leadership this role knows of (its own, or the leader's).
    pub fn epoch(&self) -> Option<i64> {
        match self {
            Role::Starting => None,
            Role::Leader { epoch, .. } | Role::Deposed { epoch, .. } => Some(*epoch),
            Role::Standby { epoch, .. } => *epoch,
        }
    }

    /// Since when it has played this role.
    pub fn since(&self) -> Option<Timestamp> {
        match self {
            Role::Starting => None,
            Role::Leader { since, .. }
            | Role::Standby { since, .. }
            | Role::Deposed { since, .. } => Some(*since),
        }
    }
}

/// The shared role: the current [`Role`], the current term, and how often leadership changed.
#[derive(Debug)]
pub struct RoleHandle {
    tx: watch::Sender<Role>,
    term: Mutex<Option<Arc<Term>>>,
    changes: AtomicU64,
    elected: bool,
}

impl RoleHandle {
    /// A coordinator that campaigns: [`Role::Starting`] until it leads or sees a leader.
    pub fn elected() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(Role::Starting),
            term: Mutex::new(None),
            changes: AtomicU64::new(0),
            elected: true,
        })
    }

    /// The only coordinator of its store (SQLite): leads from the start, epoch 0, forever.
    pub fn sole() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(Role::Leader {
                epoch: 0,
                since: Timestamp::now(),
            }),
            term: Mutex::new(None),
            changes: AtomicU64::new(0),
            elected: false,
        })
    }

    /// True when its role comes from an election (etcd), false for the sole coordinator.
    pub fn is_elected(&self) -> bool {
        self.elected
    }

    /// The role now.
    pub fn current(&self) -> Role {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every change of role.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.tx.subscribe()
    }

    /// The term it leads in, while it leads by election.
    pub fn term(&self) -> Option<Arc<Term>> {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// May it act now: it leads, and its term (if elected) has not ended nor passed its
    /// deadline on the monotonic clock.
    pub fn is_leading(&self) -> bool {
        if !matches!(*self.tx.borrow(), Role::Leader { .. }) {
            return false;
        }
        match self.term() {
            Some(t) => t.is_acting(),
            None => !self.elected,
        }
    }

    /// The epoch it leads with, while [`RoleHandle::is_leading`].
    pub fn leading_epoch(&self) -> Option<i64> {
        if !self.is_leading() {
            return None;
        }
        self.current().epoch()
    }

    /// How many times it took or lost the lead.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// It leads in `term` from now.
    pub fn lead(&self, term: Arc<Term>) {
        let epoch = term.epoch();
        *self.term.lock().unwrap_or_else(|p| p.into_inner()) = Some(term);
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.tx.send_replace(Role::Leader {
            epoch,
            since: Timestamp::now(),
        });
    }

    /// Another coordinator leads (`leader` and its epoch, when known).
    pub fn stand_by(&self, leader: Option<LeaderRecord>, epoch: Option<i64>) {
        self.tx.send_if_modified(|r| {
            let since = match r {
                Role::Standby { since, .. } => *since,
                _ => Timestamp::now(),
            };
            let new = Role::Standby {
                leader,
                epoch,
                since,
            };
            let changed = *r != new;
            *r = new;
            changed
        });
    }

    /// Its term ended (`why`): it acts no more.
    pub fn deposed(&self, why: &str) {
        let term = self.term.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(term) = term else { return };
        term.end(why);
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.tx.send_replace(Role::Deposed {
            epoch: term.epoch(),
            why: term.why().unwrap_or_else(|| why.to_string()),
            since: Timestamp::now(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn an_elected_role_leads_only_while_its_term_holds() {
        let r = RoleHandle::elected();
        assert!(!r.is_leading() && r.current() == Role::Starting);
        let term = Arc::new(Term::new(42, Instant::now() + Duration::from_secs(60)));
        r.lead(term.clone());
        assert_eq!(r.leading_epoch(), Some(42));
        term.end("test");
        assert!(!r.is_leading(), "an ended term stops acting at once");
        r.deposed("test");
        assert_eq!(r.current().name(), "deposed");
        assert_eq!(r.changes(), 2);
        let s = RoleHandle::sole();
        assert_eq!(s.leading_epoch(), Some(0));
    }
}
