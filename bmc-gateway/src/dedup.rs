//! At-most-once execution of power requests by id.
//!
//! The coordinator may send the same request twice (a lost answer, a reconnect, a coordinator
//! restarted mid-flow); a repeated id must return the first result without acting again. This
//! module remembers ids and their results, lets a repeat of an id that is still running wait for
//! the first execution, and forgets the oldest finished ids beyond a fixed bound. It does not run
//! anything itself, and it lives in memory: [`crate::journal`] keeps the same record on disk so
//! that it survives a restart.

use std::collections::{HashMap, VecDeque};

use protocol::gateway::{PowerOutcome, PowerRequest};
use tokio::sync::watch;

/// How many finished request ids are remembered.
///
/// Memory must stay bounded on an appliance that runs for months, and a repeat only matters
/// within the coordinator's retry window (minutes). A rack of ~40 machines sees at most a few
/// hundred actions an hour, so 10 000 ids cover days of history for well under 10 MB.
pub const REMEMBERED_IDS: usize = 10_000;

/// What a request id maps to.
#[derive(Debug)]
enum Entry {
    /// Still running; the receiver yields the result once set.
    Running {
        fingerprint: String,
        rx: watch::Receiver<Option<PowerOutcome>>,
    },
    /// Finished.
    Done {
        fingerprint: String,
        outcome: PowerOutcome,
    },
}

/// What the caller should do with a request.
#[derive(Debug)]
pub enum Admission {
    /// A new id: execute, then call [`RequestLog::finish`] (the sender is for waiters).
    Execute(watch::Sender<Option<PowerOutcome>>),
    /// Seen and finished: answer with this.
    Answer(PowerOutcome),
    /// Seen and still running: wait on this for the first execution's result.
    Wait(watch::Receiver<Option<PowerOutcome>>),
}

/// Remembered request ids and their results.
#[derive(Debug, Default)]
pub struct RequestLog {
    entries: HashMap<String, Entry>,
    /// Finished ids, oldest first, for eviction.
    order: VecDeque<String>,
    capacity: usize,
}

/// What identifies "the same request" beyond its id: the machine and the action. An id reused
/// for something else is refused rather than answered with an unrelated result.
pub fn fingerprint(req: &PowerRequest) -> String {
    format!("{}|{:?}", req.address, req.action)
}

impl RequestLog {
    /// A log remembering [`REMEMBERED_IDS`] finished ids.
    pub fn new() -> Self {
        Self::with_capacity(REMEMBERED_IDS)
    }

    /// A log remembering `capacity` finished ids.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Decides what to do with `req`.
    pub fn admit(&mut self, req: &PowerRequest) -> Admission {
        let fp = fingerprint(req);
        match self.entries.get(&req.id) {
            Some(Entry::Done {
                fingerprint,
                outcome,
            }) => {
                if *fingerprint == fp {
                    Admission::Answer(outcome.clone())
                } else {
                    Admission::Answer(reused(&req.id, fingerprint))
                }
            }
            Some(Entry::Running { fingerprint, rx }) => {
                if *fingerprint == fp {
                    Admission::Wait(rx.clone())
                } else {
                    Admission::Answer(reused(&req.id, fingerprint))
                }
            }
            None => {
                let (tx, rx) = watch::channel(None);
                self.entries.insert(
                    req.id.clone(),
                    Entry::Running {
                        fingerprint: fp,
                        rx,
                    },
                );
                Admission::Execute(tx)
            }
        }
    }

    /// Records the result of an executed id and evicts the oldest beyond capacity.
    pub fn finish(&mut self, id: &str, outcome: PowerOutcome) {
        let fingerprint = match self.entries.remove(id) {
            Some(Entry::Running { fingerprint, .. }) | Some(Entry::Done { fingerprint, .. }) => {
                fingerprint
            }
            None => String::new(),
        };
        self.entries.insert(
            id.to_string(),
            Entry::Done {
                fingerprint,
                outcome,
            },
        );
        self.order.push_back(id.to_string());
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    /// Remembers an id finished before a restart (read back from [`crate::journal`]).
    pub fn remember(&mut self, id: &str, fingerprint: &str, outcome: PowerOutcome) {
        self.entries.insert(
            id.to_string(),
            Entry::Running {
                fingerprint: fingerprint.to_string(),
                rx: watch::channel(None).1,
            },
        );
        self.finish(id, outcome);
    }

    /// Forgets a running id that was not executed after all (it could not be recorded), so
    /// that a resend may execute it.
    pub fn forget(&mut self, id: &str) {
        if matches!(self.entries.get(id), Some(Entry::Running { .. })) {
            self.entries.remove(id);
        }
    }

    /// Number of remembered ids (running and finished).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn reused(id: &str, first: &str) -> PowerOutcome {
    PowerOutcome::Failed {
        detail: format!(
            "request id {id} was already used for {first}; not executed. Use a new id per request"
        ),
        retriable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::gateway::{PowerAction, PowerState};

    fn req(id: &str, addr: &str, action: PowerAction) -> PowerRequest {
        PowerRequest {
            id: id.into(),
            address: addr.into(),
            serial: String::new(),
            action,
            timeout_ms: 0,
        }
    }

    fn done(detail: &str) -> PowerOutcome {
        PowerOutcome::Done {
            state: PowerState::Off,
            confirmed_off_unix_ms: None,
            detail: detail.into(),
        }
    }

    #[test]
    fn repeated_id_gets_first_result() {
        let mut log = RequestLog::new();
        let r = req("a", "m1", PowerAction::Off);
        assert!(matches!(log.admit(&r), Admission::Execute(_)));
        log.finish("a", done("first"));
        match log.admit(&r) {
            Admission::Answer(o) => assert_eq!(o, done("first")),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn repeat_while_running_waits_for_the_first() {
        let mut log = RequestLog::new();
        let r = req("a", "m1", PowerAction::Off);
        let Admission::Execute(tx) = log.admit(&r) else {
            panic!()
        };
        let Admission::Wait(mut rx) = log.admit(&r) else {
            panic!()
        };
        tx.send_replace(Some(done("first")));
        log.finish("a", done("first"));
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            rx.wait_for(|v| v.is_some()),
        )
        .await
        .unwrap()
        .unwrap()
        .clone();
        assert_eq!(got, Some(done("first")));
    }

    #[test]
    fn reused_id_for_another_request_is_refused() {
        let mut log = RequestLog::new();
        assert!(matches!(
            log.admit(&req("a", "m1", PowerAction::Off)),
            Admission::Execute(_)
        ));
        match log.admit(&req("a", "m2", PowerAction::Off)) {
            Admission::Answer(PowerOutcome::Failed { detail, retriable }) => {
                assert!(!retriable);
                assert!(detail.contains("already used"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn memory_is_bounded() {
        let mut log = RequestLog::with_capacity(3);
        for i in 0..10 {
            let id = format!("id{i}");
            assert!(matches!(
                log.admit(&req(&id, "m", PowerAction::Status)),
                Admission::Execute(_)
            ));
            log.finish(&id, done(&id));
        }
        assert_eq!(log.len(), 3);
        assert!(matches!(
            log.admit(&req("id9", "m", PowerAction::Status)),
            Admission::Answer(_)
        ));
        assert!(matches!(
            log.admit(&req("id0", "m", PowerAction::Status)),
            Admission::Execute(_)
        ));
    }
}
