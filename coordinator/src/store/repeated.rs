//! Logging a failure that repeats at every tick (a full disk fails every health sweep and
//! every repair queue tick, several a second) without flooding the log: when it starts,
//! when its error changes, once per `every` while it lasts, and when it ends.

use std::time::Duration;

use tokio::time::Instant;

/// One loop's run of failures. The caller logs; this says when.
#[derive(Debug)]
pub struct RepeatedFailure {
    every: Duration,
    /// The error last logged, when, and the failures since the run began.
    run: Option<(String, Instant, u64)>,
}

impl RepeatedFailure {
    /// Logs again at most once per `every` while the error stays the same.
    pub const fn new(every: Duration) -> Self {
        Self { every, run: None }
    }

    /// Records a failure at `now`; `Some(failures so far in this run)` when it is to be
    /// logged (the first, a changed error, or `every` since the last one logged).
    pub fn failed(&mut self, error: &str, now: Instant) -> Option<u64> {
        match &mut self.run {
            Some((last, at, n)) if last == error && now.duration_since(*at) < self.every => {
                *n += 1;
                None
            }
            run => {
                let n = run.as_ref().map_or(1, |r| r.2 + 1);
                *run = Some((error.to_string(), now, n));
                Some(n)
            }
        }
    }

    /// Records a success; `Some(failures in the run)` when it ends one.
    pub fn succeeded(&mut self) -> Option<u64> {
        self.run.take().map(|(_, _, n)| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_start_a_change_once_a_minute_and_the_end() {
        let mut r = RepeatedFailure::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(r.succeeded(), None, "no run to end");
        assert_eq!(r.failed("disk full", at(0)), Some(1));
        assert_eq!(r.failed("disk full", at(1)), None);
        assert_eq!(r.failed("disk full", at(59)), None);
        assert_eq!(r.failed("disk full", at(60)), Some(4), "a minute on");
        assert_eq!(r.failed("I/O error", at(61)), Some(5), "another error");
        assert_eq!(r.succeeded(), Some(5));
        assert_eq!(r.failed("disk full", at(62)), Some(1), "a new run");
    }
}
