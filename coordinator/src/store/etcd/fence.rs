//! The leader's fence on every write: a leading coordinator's etcd handle carries its
//! **epoch** (the create revision of the leader key it holds), and every transaction it
//! commits ([`super::Txn`]) also compares the leader key's create revision with that epoch.
//! A coordinator that lost the key (its lease expired while it was paused, a successor took
//! over) has its first write refused by etcd itself, whatever it still believes.
//!
//! [`Term`] is one leadership term as this process sees it: until when it may act (the last
//! keep-alive *sent* that etcd answered, plus the lease TTL, on the monotonic clock, so a
//! paused process counts its pause), and whether it has been deposed and why. A write is not
//! even sent once the term is over ([`Term::check`]); one sent in time is still fenced by
//! the compare, so neither a slow clock nor a late packet can land a deposed leader's write.
//!
//! Not here: campaigning and keeping the lease alive (`crate::ha`), which extend and end
//! terms.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// One leadership term of this process: valid until a monotonic deadline, or ended.
#[derive(Debug)]
pub struct Term {
    epoch: i64,
    base: Instant,
    /// Nanoseconds after `base` until which the term may act.
    valid_until: AtomicU64,
    ended: CancellationToken,
    why: Mutex<Option<String>>,
}

impl Term {
    /// A term of `epoch` that may act until `valid_until` unless extended.
    pub fn new(epoch: i64, valid_until: Instant) -> Self {
        let base = Instant::now();
        let t = Self {
            epoch,
            base,
            valid_until: AtomicU64::new(0),
            ended: CancellationToken::new(),
            why: Mutex::new(None),
        };
        t.extend(valid_until);
        t
    }

    /// The epoch it holds.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the deadline to `until` (never backwards): a keep-alive sent before `until -
    /// TTL` was answered.
    pub fn extend(&self, until: Instant) {
        self.valid_until
            .fetch_max(self.nanos(until), Ordering::SeqCst);
    }

    /// Until when it may act, if not ended before.
    pub fn valid_until(&self) -> Instant {
        self.base + Duration::from_nanos(self.valid_until.load(Ordering::SeqCst))
    }

    /// Ends the term (the first reason given is kept).
    pub fn end(&self, why: impl Into<String>) {
        {
            let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
            if w.is_none() {
                *w = Some(why.into());
            }
        }
        self.ended.cancel();
    }

    /// Why it ended, once it has.
    pub fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A token cancelled when the term ends ([`Term::end`]; a deadline passing ends it at the
    /// next [`Term::check`], or when the keep-alive loop notices, whichever comes first).
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Whether it may still act now: not ended, and its deadline not passed. A deadline
    /// found passed ends the term.
    pub fn check(&self) -> Result<(), String> {
        if let Some(why) = self.why() {
            return Err(why);
        }
        let now = Instant::now();
        let until = self.valid_until();
        if now >= until {
            let why = format!(
                "no keep-alive of its lease was answered in time: it could act until {:.1} s ago \
                 (a paused process or an unreachable etcd)",
                now.duration_since(until).as_secs_f64()
            );
            self.end(why.clone());
            return Err(why);
        }
        Ok(())
    }

    /// True while [`Term::check`] passes.
    pub fn is_acting(&self) -> bool {
        self.check().is_ok()
    }
}

/// What a leader's etcd handle carries: the leader key, the epoch and the term.
#[derive(Debug, Clone)]
pub struct Fence {
    /// The full leader key.
    pub key: String,
    /// The term (and its epoch).
    pub term: std::sync::Arc<Term>,
}

impl Fence {
    /// The epoch every write compares.
    pub fn epoch(&self) -> i64 {
        self.term.epoch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_past_its_deadline_ends_itself_and_says_why() {
        let t = Term::new(7, Instant::now() + Duration::from_secs(60));
        assert!(t.is_acting());
        t.extend(Instant::now());
        assert!(t.is_acting(), "a deadline never moves backwards");
        let t = Term::new(7, Instant::now());
        let why = t.check().unwrap_err();
        assert!(why.contains("keep-alive"), "{why}");
        assert!(t.ended().is_cancelled());
        t.end("later reason");
        assert_eq!(t.why().unwrap(), why, "the first reason is kept");
    }
}
