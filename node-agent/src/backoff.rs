//! Reconnect delays: exponential backoff with "equal jitter".
//!
//! Pure: the caller passes the random fraction, so tests pin it. The agent draws it from
//! `rand`. Deliberately knows nothing about why a connection failed.

use std::time::Duration;

/// First reconnect delay. A coordinator restart takes a few seconds; retrying much faster
/// only adds handshakes to a coordinator that is busy starting up.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// Longest reconnect delay. After a long coordinator outage, 10 000 agents retrying at most
/// once a minute (spread by jitter) are ~170 handshakes/s, which one coordinator absorbs,
/// and every node is back within about a minute of the coordinator's return.
/// The coordinator counts on this cap after its own restart (see the constant's doc).
pub const MAX_BACKOFF: Duration = protocol::AGENT_RECONNECT_MAX;

/// Exponential backoff state.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL_BACKOFF, MAX_BACKOFF)
    }
}

impl Backoff {
    /// Backoff doubling from `initial` up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// The delay before the next attempt. `jitter` in `[0, 1)` picks a point in the upper
    /// half of the current step: `step/2 + jitter * step/2`. Equal jitter keeps every wait at
    /// least half a step (no hot loop) while spreading a fleet that lost its coordinator at
    /// the same instant, so they do not all come back in the same millisecond.
    pub fn next(&mut self, jitter: f64) -> Duration {
        let step = self
            .initial
            .checked_mul(1u32 << self.attempt.min(20))
            .unwrap_or(self.max)
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
    }

    /// How many delays were handed out since the last reset, for logs.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Back to the initial delay, after a connection proved healthy.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::default();
        let seq: Vec<u64> = (0..9).map(|_| b.next(1.0).as_millis() as u64).collect();
        assert_eq!(
            seq,
            [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
        );
        assert_eq!(b.attempts(), 9);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let mut b = Backoff::default();
        assert_eq!(b.next(0.0), Duration::from_millis(500));
        assert_eq!(b.next(0.5), Duration::from_millis(1500));
        for _ in 0..30 {
            let d = b.next(0.25);
            assert!(d <= MAX_BACKOFF, "{d:?}");
        }
        let d = b.next(0.25);
        assert_eq!(d, MAX_BACKOFF / 2 + MAX_BACKOFF / 8);
        // Out-of-range jitter is clamped, never panics.
        assert_eq!(b.next(7.0), MAX_BACKOFF);
        assert_eq!(b.next(-1.0), MAX_BACKOFF / 2);
    }

    #[test]
    fn reset_starts_over_and_many_attempts_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        for _ in 0..10_000 {
            b.next(1.0);
        }
        assert_eq!(b.next(1.0), Duration::from_millis(80));
        b.reset();
        assert_eq!(b.next(1.0), Duration::from_millis(10));
    }
}
