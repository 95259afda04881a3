//! The wait between reports on a `timerfd`: one wakeup when it ends.
//!
//! tokio's timer wheel fires a sleep of a few seconds in steps. A timer more than 64 ms
//! away sits in a coarser level of the wheel and is moved down a level at the start of its
//! slot (slots of 64 ms and of 4.096 s), each move a wakeup of the process: a 5 s wait
//! between reports cost three wakeups, a 1 s wait two (`strace -tt -p` of the agent). A
//! timerfd armed for the wait wakes the process once, when the kernel's timer expires.
//!
//! Only the agent's own waits use it (between reports, before a reconnect); the timeouts
//! inside a round and quinn's timers stay on tokio. Where no timerfd can be made the wait
//! falls back to tokio's sleep.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;
use tracing::debug;

/// A one-shot timer, made on first use (it needs the runtime).
#[derive(Debug, Default)]
pub(super) struct Alarm {
    fd: Option<Result<AsyncFd<OwnedFd>, ()>>,
}

/// A monotonic timerfd registered with the runtime.
fn make() -> io::Result<AsyncFd<OwnedFd>> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    // `AsyncFd::new` is deprecated because an arbitrary `AsRawFd` may close or swap its
    // descriptor while registered; an `OwnedFd` that is never replaced (nothing here takes
    // `get_mut`) keeps it for the `AsyncFd`'s whole life, and the replacement, `register`,
    // is `unsafe`, which this workspace forbids.
    #[allow(deprecated)]
    AsyncFd::new(fd)
}

/// `d` as a timespec; saturates (a wait of centuries is a wait forever here).
fn timespec(d: Duration) -> Timespec {
    Timespec::try_from(d).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    })
}

impl Alarm {
    /// Waits `d`. Cancel-safe: a wait dropped before it ends leaves the timer armed, and the
    /// next wait re-arms it, which also clears an expiry nobody read.
    pub(super) async fn sleep(&mut self, d: Duration) {
        let until = Instant::now() + d;
        let fd = self.fd.get_or_insert_with(|| {
            make().map_err(|e| debug!(error = %e, "no timerfd; waiting on tokio's timer wheel"))
        });
        let Ok(fd) = fd else {
            return tokio::time::sleep_until(until).await;
        };
        if d.is_zero() {
            // A zero it_value would disarm the timer instead of firing it.
            return;
        }
        let spec = Itimerspec {
            it_interval: timespec(Duration::ZERO),
            it_value: timespec(d),
        };
        if let Err(e) = timerfd_settime(fd.get_ref(), TimerfdTimerFlags::empty(), &spec) {
            debug!(error = %e, "timerfd_settime failed; waiting on tokio's timer wheel");
            return tokio::time::sleep_until(until).await;
        }
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return tokio::time::sleep_until(until).await;
            };
            let mut count = [0u8; 8];
            match ready.try_io(|f| Ok(rustix::io::read(f.get_ref(), &mut count)?)) {
                Ok(Ok(_)) => {
                    // The expiry is read: the next wait goes straight to epoll instead of
                    // first reading the timer again to learn it has not fired.
                    ready.clear_ready();
                    return;
                }
                Ok(Err(e)) => {
                    debug!(error = %e, "reading the timerfd failed; waiting on tokio's timer wheel");
                    return tokio::time::sleep_until(until).await;
                }
                // Readiness left over from an expiry a re-arm cleared: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_as_long_as_asked_and_survives_a_cancelled_wait() {
        let mut a = Alarm::default();
        let t = Instant::now();
        a.sleep(Duration::from_millis(30)).await;
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(30), "{took:?}");
        assert!(
            a.fd.as_ref().is_some_and(|f| f.is_ok()),
            "a timerfd is used"
        );
        a.sleep(Duration::ZERO).await;

        // A wait cancelled before its end, whose expiry is then left unread: the next wait
        // is not ended early by it.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(5), a.sleep(Duration::from_millis(20)));
        assert!(cancelled.await.is_err());
        tokio::time::sleep(Duration::from_millis(40)).await;
        let t = Instant::now();
        a.sleep(Duration::from_millis(50)).await;
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
    }
}
