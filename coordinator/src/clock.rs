//! Time as a dependency: decisions take `now` from a [`Clock`] so tests can fake it (the
//! fake is `crate::testing::FakeClock`).

use jiff::Timestamp;

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

/// Milliseconds since the Unix epoch, the form times take in SQLite and on the wire.
pub fn to_unix_ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

/// The inverse of [`to_unix_ms`]; out-of-range values clamp to the epoch.
pub fn from_unix_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}
