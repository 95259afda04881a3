//! Kill points: places in the fence runner where a crash test can stop the coordinator,
//! one before and one after each state commit (`before:<state>`, `after:<state>`, with the
//! state names of [`crate::fence::flow::State::kind`]).
//!
//! Compiled in only for unit tests and with the `failpoints` feature; in every other build
//! [`KillPoints::hit`] is an empty inline function and no environment variable is read. With
//! the feature, `FLEETMEND_FENCE_KILL_AT=<point>` makes the process SIGKILL itself at that
//! point (for crash tests with real processes), `FLEETMEND_FENCE_STOP_AT=<point>` makes it
//! SIGSTOP itself there once (a leader paused mid-flow, for the failover tests: it goes on
//! from that point when the test sends SIGCONT), and [`KillPoints::arm`] makes the next hit
//! of a point return [`Killed`] (for in-process tests, which then drop the runner as a crash
//! would).

/// The runner stopped at an armed kill point (in-process tests only).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stopped at kill point {0}")]
pub struct Killed(pub String);

/// The environment variable naming the point where the process kills itself.
pub const KILL_AT_ENV: &str = "FLEETMEND_FENCE_KILL_AT";

/// The environment variable naming the point where the process stops itself (SIGSTOP), once.
pub const STOP_AT_ENV: &str = "FLEETMEND_FENCE_STOP_AT";

/// The kill points of one runner.
#[derive(Debug, Default)]
pub struct KillPoints {
    #[cfg(any(test, feature = "failpoints"))]
    armed: std::sync::Mutex<Option<String>>,
    #[cfg(any(test, feature = "failpoints"))]
    env: Option<String>,
    #[cfg(any(test, feature = "failpoints"))]
    stop: std::sync::Mutex<Option<String>>,
}

impl KillPoints {
    /// Kill points as the environment sets them (none outside test builds).
    pub fn from_env() -> Self {
        #[cfg(any(test, feature = "failpoints"))]
        {
            Self {
                armed: Default::default(),
                env: std::env::var(KILL_AT_ENV).ok().filter(|v| !v.is_empty()),
                stop: std::sync::Mutex::new(
                    std::env::var(STOP_AT_ENV).ok().filter(|v| !v.is_empty()),
                ),
            }
        }
        #[cfg(not(any(test, feature = "failpoints")))]
        {
            Self {}
        }
    }

    /// Makes the next hit of `point` return [`Killed`].
    #[cfg(any(test, feature = "failpoints"))]
    pub fn arm(&self, point: &str) {
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(point.to_string());
    }

    /// Passes the point `point`: kills the process or stops the runner when told to.
    #[cfg(any(test, feature = "failpoints"))]
    pub fn hit(&self, point: &str) -> Result<(), Killed> {
        if self.env.as_deref() == Some(point) {
            tracing::warn!(point, "kill point reached: SIGKILL");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
        let stop_here = {
            let mut stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
            let here = stop.as_deref() == Some(point);
            if here {
                *stop = None;
            }
            here
        };
        if stop_here {
            tracing::warn!(point, "stop point reached: SIGSTOP (goes on at SIGCONT)");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGSTOP);
        }
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        if armed.as_deref() == Some(point) {
            *armed = None;
            return Err(Killed(point.to_string()));
        }
        Ok(())
    }

    /// Passes the point `point` (nothing in builds without kill points).
    #[cfg(not(any(test, feature = "failpoints")))]
    #[inline(always)]
    pub fn hit(&self, _point: &str) -> Result<(), Killed> {
        Ok(())
    }
}
