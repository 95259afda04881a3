//! Time as a dependency: decisions take `now` from a [`Clock`] so tests can fake it.

use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct FakeClock(Mutex<Timestamp>);

impl FakeClock {
    /// A fake clock starting at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Mutex::new(start))
    }

    /// Moves the clock forward (or back, with a negative duration).
    pub fn advance(&self, by: SignedDuration) {
        let mut t = self.0.lock().expect("fake clock poisoned");
        *t = t.checked_add(by).expect("fake clock overflow");
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        *self.0.lock().expect("fake clock poisoned") = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().expect("fake clock poisoned")
    }
}

/// Milliseconds since the Unix epoch, the form times take in SQLite and on the wire.
pub fn to_unix_ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

/// The inverse of [`to_unix_ms`]; out-of-range values clamp to the epoch.
pub fn from_unix_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}
