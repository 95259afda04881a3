//! Finding the coordinator that leads, among the configured ones: each round tries them in
//! an order that learns from the last rounds ([`Route`]), follows a standby's pointer to the
//! leader, and tells the caller when only standbys answered, so it tries again soon
//! ([`STANDBY_RETRY`]) instead of backing off: a standby answering means a takeover is under
//! way and will be over within a lease TTL.
//!
//! Why the order matters: a leader whose host died does not answer at all, so each attempt
//! to it costs the whole handshake timeout ([`protocol::transport::HELLO_TIMEOUT`]), and a
//! standby names that dead leader until its lease expires. So the target that answered last
//! is tried first, one that failed in the last round is tried last, and a standby's pointer
//! to a target that failed in this round or the last is not followed.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use protocol::identity::Role;
use protocol::messages::HelloBody;
use protocol::transport::{self, TransportError};
use tracing::{Instrument, debug, info, info_span};

use super::error::RoundError;
use super::{Agent, Link};
use crate::{actions, node};

/// The step of the retry while only standbys answer: waits of 1 to 2 s (equal jitter). A
/// fleet's agents then ask a standby about once per 1.5 s each until it leads: 10,000
/// agents make about 6,700 handshakes a second for the few seconds of a takeover, which a
/// standby that serves nothing else absorbs, and each agent reports to the new leader
/// within about 2 s of its taking over.
pub(crate) const STANDBY_RETRY: Duration = Duration::from_secs(2);

/// How many rounds in a row that only standbys answer are retried at [`STANDBY_RETRY`]:
/// about 30 s, three default lease TTLs. Past that no takeover is under way (etcd down under
/// every coordinator, say) and the usual backoff applies.
pub(crate) const STANDBY_FAST_ROUNDS: u32 = 20;

/// What the rounds have learnt about the targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Route {
    /// The target that answered last (accepted us, or said it stands by).
    answered: Option<String>,
    /// The targets whose attempt failed in the last round (no answer, refused connection).
    failed: HashSet<String>,
    /// Rounds in a row in which only standbys answered.
    standby_rounds: u32,
}

impl Route {
    /// One round's order of `targets`: the one that answered last first, then the rest in the
    /// configured order, those that failed in the last round at the end.
    pub(crate) fn order(&self, targets: &[(String, String)]) -> Vec<(String, String)> {
        let rank = |t: &str| {
            if self.answered.as_deref() == Some(t) {
                0
            } else if self.failed.contains(t) {
                2
            } else {
                1
            }
        };
        let mut out = targets.to_vec();
        // Stable: the configured order holds within each rank.
        out.sort_by_key(|(t, _)| rank(t));
        out
    }

    /// Whether a standby's pointer to `leader` is worth following in this round: not to a
    /// target that failed in this round (`failed_now`) or the last.
    pub(crate) fn may_follow(&self, leader: &str, failed_now: &HashSet<String>) -> bool {
        !failed_now.contains(leader) && !self.failed.contains(leader)
    }

    /// Records a round: the target that answered last, those that failed, and whether only
    /// standbys answered.
    pub(crate) fn finish(
        &mut self,
        answered: Option<String>,
        failed_now: HashSet<String>,
        only_standbys: bool,
    ) {
        if answered.is_some() {
            self.answered = answered;
        }
        self.failed = failed_now;
        self.standby_rounds = if only_standbys {
            self.standby_rounds.saturating_add(1)
        } else {
            0
        };
    }

    /// The connection to `target` failed (a report unanswered, the connection lost): the
    /// next round tries it last.
    pub(crate) fn lost(&mut self, target: &str) {
        if self.answered.as_deref() == Some(target) {
            self.answered = None;
        }
        self.failed.insert(target.to_string());
    }

    /// The wait before the next round when only standbys answered, while a takeover may be
    /// under way (`None`: back off as usual). `jitter` in `[0, 1)`.
    pub(crate) fn standby_wait(&self, jitter: f64) -> Option<Duration> {
        (self.standby_rounds > 0 && self.standby_rounds <= STANDBY_FAST_ROUNDS).then(|| {
            let half = STANDBY_RETRY / 2;
            half + half.mul_f64(jitter.clamp(0.0, 1.0))
        })
    }
}

impl Agent {
    pub(super) async fn resolve(&self, addr: &str) -> Result<Vec<SocketAddr>, RoundError> {
        let addr = &addr.to_string();
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr.as_str())
            .await
            .map_err(|e| RoundError::Resolve {
                addr: addr.clone(),
                detail: e.to_string(),
            })?
            .collect();
        if resolved.is_empty() {
            return Err(RoundError::Resolve {
                addr: addr.clone(),
                detail: "no addresses".into(),
            });
        }
        Ok(resolved)
    }

    /// One round: resolves each configured coordinator in the [`Route`]'s order and connects
    /// to its addresses. A coordinator that does not lead names the leader, and the agent
    /// goes there at once (once per round, so two standbys naming each other cannot keep
    /// it; not to one that just failed), or on to the next coordinator. When no coordinator
    /// leads but one stood by, the round fails with [`RoundError::Standby`].
    pub(super) async fn connect(&self) -> Result<Link, RoundError> {
        let hello = node::hello(&self.cfg.root, self.cfg.hostname.as_deref())?;
        let route = self.route.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut last: Option<RoundError> = None;
        let mut standby: Option<String> = None;
        let mut answered: Option<String> = None;
        let mut failed_now = HashSet::new();
        let mut queue: std::collections::VecDeque<(String, String)> =
            route.order(&self.coordinator.targets).into();
        let mut redirected = false;
        let mut outcome = None;
        'targets: while let Some((target, server_name)) = queue.pop_front() {
            let resolved = match self.resolve(&target).await {
                Ok(r) => r,
                Err(e) => {
                    debug!(coordinator = %target, error = %e, "cannot resolve");
                    failed_now.insert(target);
                    last = Some(e);
                    continue;
                }
            };
            for addr in resolved {
                match self.connect_one(addr, &server_name, &hello).await {
                    Ok(mut link) => {
                        link.target = target.clone();
                        answered = Some(target);
                        outcome = Some(Ok(link));
                        break 'targets;
                    }
                    Err(TransportError::Standby { leader, reason, .. }) => {
                        info!(coordinator = %addr, %reason, "this coordinator does not lead; trying the leader or the next coordinator");
                        answered = Some(target.clone());
                        if let Some(leader) =
                            leader.filter(|l| !redirected && route.may_follow(l, &failed_now))
                        {
                            redirected = true;
                            let name = match &self.coordinator.server_name_set {
                                Some(n) => n.clone(),
                                None => crate::config::split_host_port(&leader)
                                    .map(|(h, _)| h)
                                    .unwrap_or_else(|_| leader.clone()),
                            };
                            queue.retain(|(t, _)| *t != leader);
                            queue.push_front((leader, name));
                        }
                        standby = Some(reason);
                        continue 'targets;
                    }
                    Err(TransportError::Refused(r)) => {
                        answered = Some(target);
                        outcome = Some(Err(RoundError::Refused(r)));
                        break 'targets;
                    }
                    Err(e) => {
                        debug!(coordinator = %addr, error = %e, "connect attempt failed");
                        failed_now.insert(target.clone());
                        last = Some(e.into());
                    }
                }
            }
        }
        let outcome = outcome.unwrap_or_else(|| {
            Err(match standby.clone() {
                Some(reason) => RoundError::Standby(reason),
                None => {
                    last.unwrap_or_else(|| RoundError::Standby("no coordinator address".into()))
                }
            })
        });
        let only_standbys = outcome.is_err() && standby.is_some();
        self.route.lock().unwrap_or_else(|p| p.into_inner()).finish(
            answered,
            failed_now,
            only_standbys,
        );
        outcome
    }

    /// The wait before the next round after one in which only standbys answered, while a
    /// takeover may be under way (`None`: back off as usual).
    pub(super) fn standby_wait(&self, jitter: f64) -> Option<Duration> {
        self.route
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .standby_wait(jitter)
    }

    /// One connection attempt to the coordinator at `addr`.
    pub(super) async fn connect_one(
        &self,
        addr: SocketAddr,
        server_name: &str,
        hello: &protocol::messages::AgentHello,
    ) -> Result<Link, TransportError> {
        let endpoint = self.client_endpoint(addr)?;
        {
            match transport::connect(
                &endpoint,
                addr,
                server_name,
                Role::Coordinator,
                HelloBody::Agent(hello.clone()),
            )
            .await
            {
                Ok(session) => {
                    info!(coordinator = %addr, peer = %session.peer, "connected");
                    let span = info_span!("connection", coordinator = %addr);
                    tokio::spawn(
                        actions::serve(session.conn.clone(), self.actions.clone(), session.version)
                            .instrument(span.clone()),
                    );
                    Ok(Link {
                        endpoint,
                        session,
                        span,
                        target: String::new(),
                    })
                }
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(list: &[&str]) -> Vec<(String, String)> {
        list.iter()
            .map(|t| (t.to_string(), "n".to_string()))
            .collect()
    }

    fn names(order: Vec<(String, String)>) -> Vec<String> {
        order.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn the_target_that_answered_goes_first_and_one_that_failed_last() {
        let t = targets(&["a:1", "b:1", "c:1"]);
        let mut r = Route::default();
        assert_eq!(names(r.order(&t)), ["a:1", "b:1", "c:1"]);
        // The leader a died: it failed, b answered as a standby (naming a).
        r.finish(Some("b:1".into()), HashSet::from(["a:1".to_string()]), true);
        assert_eq!(names(r.order(&t)), ["b:1", "c:1", "a:1"]);
        assert!(!r.may_follow("a:1", &HashSet::new()), "a failed last round");
        assert!(r.may_follow("c:1", &HashSet::new()));
        assert!(!r.may_follow("c:1", &HashSet::from(["c:1".to_string()])));
        // b leads now.
        r.finish(Some("b:1".into()), HashSet::new(), false);
        assert_eq!(names(r.order(&t)), ["b:1", "a:1", "c:1"]);
        // Its connection is lost (a report unanswered): it goes last.
        r.lost("b:1");
        assert_eq!(names(r.order(&t)), ["a:1", "c:1", "b:1"]);
    }

    #[test]
    fn rounds_of_standbys_retry_soon_for_a_while_then_back_off() {
        let mut r = Route::default();
        assert_eq!(r.standby_wait(0.5), None, "no standby seen");
        r.finish(Some("b:1".into()), HashSet::new(), true);
        let w = r.standby_wait(0.0).unwrap();
        assert_eq!(w, STANDBY_RETRY / 2);
        assert_eq!(r.standby_wait(1.0).unwrap(), STANDBY_RETRY);
        for _ in 1..STANDBY_FAST_ROUNDS {
            r.finish(Some("b:1".into()), HashSet::new(), true);
        }
        assert!(r.standby_wait(0.5).is_some());
        r.finish(Some("b:1".into()), HashSet::new(), true);
        assert_eq!(r.standby_wait(0.5), None, "no takeover lasts this long");
        r.finish(Some("b:1".into()), HashSet::new(), false);
        assert_eq!(r.standby_wait(0.5), None);
        r.finish(Some("b:1".into()), HashSet::new(), true);
        assert!(r.standby_wait(0.5).is_some(), "a new takeover");
    }
}
