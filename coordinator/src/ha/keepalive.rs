//! Holding the lead: the leader keeps its lease alive and watches its own key, and ends its
//! term the moment it cannot be sure it still leads.
//!
//! A keep-alive goes out every third of the TTL. Each one etcd answers moves the term's
//! deadline to the moment it was *sent* plus the TTL etcd answered with (etcd restarts the
//! lease's countdown when it receives it, which is later), on the monotonic clock. The term
//! ends ([`Term::end`]) when:
//! - the deadline passes without an answered keep-alive (etcd unreachable, quorum lost, or
//!   this process paused: its clock counts the pause, so the first thing it does on waking
//!   is find its term over);
//! - etcd answers that the lease has expired (TTL 0);
//! - the watch on the leader key shows it deleted or created anew (another epoch);
//! - a fenced write was refused by the leader key's compare (the store ends the term).
//!
//! A keep-alive not answered before the next is due is taken as its etcd member hung: the
//! next stream is opened on another member (`EtcdStore::avoid_member`), so one member
//! frozen under the leader costs a keep-alive, not the lead.
//!
//! [`hold`] returns why; the caller stops acting (the acting loops observe the role and the
//! term's token) and steps down.

use std::time::{Duration, Instant};

use etcd_client::{EventType, LeaseKeepAliveStream, LeaseKeeper, WatchOptions, WatchStream};
use tokio_util::sync::CancellationToken;

use super::election::{LEADER_KEY, Leadership};

/// How many keep-alives per TTL: three, so one lost answer (or one slow etcd election)
/// still leaves a third of the TTL for the next.
const KEEPALIVES_PER_TTL: u32 = 3;

/// Keeps `l`'s lease alive and watches its key until the term ends (returns why) or `stop`
/// fires (returns `None`; the lease is left to the caller, who may resign).
pub async fn hold(l: &Leadership, stop: &CancellationToken) -> Option<String> {
    let key = l.raw.key(LEADER_KEY);
    let every = l.ttl / KEEPALIVES_PER_TTL;
    let ended = l.term.ended();
    let mut keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    // The etcd member the keep-alive stream was opened on: moved off when it goes silent.
    let mut kept_on = 0;
    let mut watch: Option<WatchStream> = None;
    loop {
        if let Err(why) = l.term.check() {
            return Some(why);
        }
        // Opening a stream waits for etcd (through an election, up to the request timeout),
        // but never past the term: then the loop's check above says why it ended.
        let term_left = || tokio::time::Instant::from_std(l.term.valid_until());
        if keeper.is_none() {
            let open = |c: &etcd_client::Client| {
                let mut leases = c.lease_client();
                async move { leases.keep_alive(l.lease).await }
            };
            let opened = l.raw.bounded("lease keep-alive", &key, open);
            match tokio::time::timeout_at(term_left(), opened).await {
                Err(_) => continue,
                Ok(Ok(k)) => {
                    keeper = Some(k);
                    kept_on = l.raw.current_member();
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot open the lease keep-alive stream"),
            }
        }
        if watch.is_none() {
            let opts = WatchOptions::new().with_start_revision(l.epoch);
            let open = |c: &etcd_client::Client| {
                let (mut watches, opts, key) = (c.watch_client(), opts.clone(), key.clone());
                async move { watches.watch(key, Some(opts)).await }
            };
            let opened = l.raw.bounded("watch", &key, open);
            match tokio::time::timeout_at(term_left(), opened).await {
                Err(_) => continue,
                Ok(Ok(w)) => watch = Some(w),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot watch the leader key"),
            }
        }
        let sent = Instant::now();
        if let Some((k, s)) = keeper.as_mut() {
            // Until the next keep-alive is due at most: one unanswered by then is taken as
            // its member hung, and the next goes on a stream opened on another, while a
            // third of the TTL is left for it.
            let left = l
                .term
                .valid_until()
                .saturating_duration_since(sent)
                .min(l.raw.settings().request_timeout)
                .min(every);
            let answer = async {
                k.keep_alive().await?;
                s.message().await
            };
            match tokio::time::timeout(left, answer).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    let ttl = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0));
                    l.term.extend(sent + ttl);
                }
                Ok(Ok(Some(_))) => {
                    let why = format!("etcd says its lease {:x} has expired", l.lease);
                    l.term.end(why.clone());
                    return Some(why);
                }
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    tracing::warn!(
                        "a lease keep-alive was not answered; the lead holds until {:.1} s from now unless one is",
                        l.term
                            .valid_until()
                            .saturating_duration_since(Instant::now())
                            .as_secs_f64()
                    );
                    keeper = None;
                    // Open the next stream on another member: this one may be hung.
                    l.raw
                        .avoid_member(kept_on, &"a lease keep-alive went unanswered");
                }
            }
        }
        let next = tokio::time::Instant::from_std(sent + every);
        loop {
            let deadline = tokio::time::Instant::from_std(l.term.valid_until());
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = ended.cancelled() => return l.term.why(),
                _ = tokio::time::sleep_until(deadline) => {
                    if let Err(why) = l.term.check() {
                        return Some(why);
                    }
                }
                msg = next_watch(&mut watch, l.epoch) => match msg {
                    Some(gone) => {
                        if let Some(why) = gone {
                            l.term.end(why.clone());
                            return Some(why);
                        }
                    }
                    None => watch = None,
                },
                _ = tokio::time::sleep_until(next) => break,
            }
        }
    }
}

/// The next word of the watch on the leader key: `Some(Some(why))` when it shows the key
/// gone or another epoch's, `Some(None)` for anything else, `None` when the watch broke
/// (it is opened again). Never returns without a watch.
async fn next_watch_inner(w: &mut WatchStream, epoch: i64) -> Option<Option<String>> {
    match w.message().await {
        Ok(Some(resp)) if resp.canceled() => None,
        Ok(Some(resp)) => {
            for ev in resp.events() {
                if ev.event_type() == EventType::Delete {
                    return Some(Some(
                        "the leader key was deleted (its lease expired or was revoked)".into(),
                    ));
                }
                if let Some(kv) = ev.kv()
                    && kv.create_revision() != epoch
                {
                    return Some(Some(format!(
                        "the leader key was created anew with epoch {}",
                        kv.create_revision()
                    )));
                }
            }
            Some(None)
        }
        Ok(None) | Err(_) => None,
    }
}

async fn next_watch(w: &mut Option<WatchStream>, epoch: i64) -> Option<Option<String>> {
    match w.as_mut() {
        Some(s) => next_watch_inner(s, epoch).await,
        None => std::future::pending().await,
    }
}
