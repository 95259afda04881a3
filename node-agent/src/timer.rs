//! Timers on a `timerfd`: one wakeup when they end, for the agent's wait between reports and
//! for quinn's connection timers.
//!
//! tokio's timer wheel fires a timer in steps. A timer is filed in the level of the wheel
//! given by the highest bit in which its deadline and the present differ (in ms), and is moved
//! down a level at the start of its slot (slots of 64 ms, 4.096 s, …), each move a wakeup of
//! the process: a 5 s wait between reports cost three wakeups and a 1 s wait two, and a
//! 25 ms timer that crosses a 64 ms boundary (quinn's delayed ACK, its loss detection) two
//! (`strace -tt -p` of the agent). Registering a tokio timer that ends before every other
//! one also writes the runtime's eventfd (it wakes a parked driver on another thread, which
//! the agent's single thread never has) and costs one more turn of the event loop. A
//! timerfd armed for the deadline wakes the process once, when the kernel's timer expires,
//! for one `timerfd_settime` per re-arm.
//!
//! [`Alarm`] is the agent's own wait; [`TimerfdRuntime`] is tokio's quinn runtime with
//! quinn's timers on timerfds. Where a timerfd cannot be made or armed, both fall back to
//! tokio's timers. The short timeouts inside a report round stay on tokio: they are
//! cancelled long before they end, so they cost no wakeup.

use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use quinn::Runtime;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::io::unix::AsyncFd;
use tracing::debug;

/// A monotonic one-shot timerfd registered with the runtime.
struct TimerFd {
    fd: AsyncFd<OwnedFd>,
}

impl fmt::Debug for TimerFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerFd").finish_non_exhaustive()
    }
}

impl TimerFd {
    fn new() -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // `AsyncFd::new` is deprecated because an arbitrary `AsRawFd` may close or swap its
        // descriptor while registered; an `OwnedFd` that is never replaced (nothing here
        // takes `get_mut`) keeps it for the `AsyncFd`'s whole life, and the replacement,
        // `register`, is `unsafe`, which this workspace forbids.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self { fd })
    }

    /// Arms the timer to expire in `d` (which must not be zero: that disarms it). Clears an
    /// expiry nobody read.
    fn arm(&self, d: Duration) -> io::Result<()> {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = Timespec::try_from(d).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Ready once the armed timer expired (and the expiry was read).
    fn poll_expired(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.fd.poll_read_ready(cx))?;
            let mut count = [0u8; 8];
            match ready.try_io(|f| Ok(rustix::io::read(f.get_ref(), &mut count)?)) {
                Ok(r) => {
                    // Read: the next wait goes straight to epoll instead of first reading
                    // the timer again to learn it has not fired.
                    ready.clear_ready();
                    return Poll::Ready(r.map(drop));
                }
                // Readiness left over from an expiry a re-arm cleared: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

/// The agent's own wait, made on first use (it needs the runtime).
#[derive(Debug, Default)]
pub struct Alarm {
    fd: Option<Result<TimerFd, ()>>,
}

impl Alarm {
    /// Waits `d`. Cancel-safe: a wait dropped before it ends leaves the timer armed, and the
    /// next wait re-arms it, which also clears an expiry nobody read.
    pub async fn sleep(&mut self, d: Duration) {
        let until = tokio::time::Instant::now() + d;
        let fd = self.fd.get_or_insert_with(|| {
            TimerFd::new()
                .map_err(|e| debug!(error = %e, "no timerfd; waiting on tokio's timer wheel"))
        });
        let Ok(fd) = fd else {
            return tokio::time::sleep_until(until).await;
        };
        if d.is_zero() {
            return;
        }
        let waited = match fd.arm(d) {
            Ok(()) => std::future::poll_fn(|cx| fd.poll_expired(cx)).await,
            Err(e) => Err(e),
        };
        if let Err(e) = waited {
            debug!(error = %e, "timerfd failed; waiting on tokio's timer wheel");
            tokio::time::sleep_until(until).await;
        }
    }
}

/// quinn's tokio runtime, with its connection timers on timerfds.
#[derive(Debug)]
pub struct TimerfdRuntime;

impl Runtime for TimerfdRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn quinn::AsyncTimer>> {
        match TimerFd::new() {
            Ok(fd) => {
                let mut t = QuinnTimer {
                    fd,
                    state: TimerState::Expired,
                };
                t.set(at);
                Box::pin(t)
            }
            Err(e) => {
                debug!(error = %e, "no timerfd for quinn; its timers use tokio's");
                quinn::TokioRuntime.new_timer(at)
            }
        }
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        quinn::TokioRuntime.spawn(future)
    }

    fn wrap_udp_socket(
        &self,
        socket: std::net::UdpSocket,
    ) -> io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        quinn::TokioRuntime.wrap_udp_socket(socket)
    }

    fn now(&self) -> Instant {
        quinn::TokioRuntime.now()
    }
}

/// Where a quinn timer stands.
enum TimerState {
    /// Armed on the timerfd.
    Armed,
    /// The deadline passed (read from the timerfd, or already past when set): polls are
    /// ready until the next reset, as a tokio `Sleep`'s are.
    Expired,
    /// The timerfd failed: a tokio sleep stands in.
    Fallback(Pin<Box<tokio::time::Sleep>>),
}

/// One quinn connection's timer.
struct QuinnTimer {
    fd: TimerFd,
    state: TimerState,
}

impl fmt::Debug for QuinnTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuinnTimer").finish_non_exhaustive()
    }
}

impl QuinnTimer {
    fn set(&mut self, at: Instant) {
        if let TimerState::Fallback(sleep) = &mut self.state {
            sleep.as_mut().reset(at.into());
            return;
        }
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // Already due: no system call (an earlier arming that still fires later only
            // wakes the connection once for nothing).
            self.state = TimerState::Expired;
            return;
        }
        self.state = match self.fd.arm(left) {
            Ok(()) => TimerState::Armed,
            Err(e) => {
                debug!(error = %e, "timerfd_settime failed; quinn's timer uses tokio's");
                TimerState::Fallback(Box::pin(tokio::time::sleep_until(at.into())))
            }
        };
    }
}

impl quinn::AsyncTimer for QuinnTimer {
    fn reset(self: Pin<&mut Self>, at: Instant) {
        self.get_mut().set(at);
    }

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        match &mut this.state {
            TimerState::Expired => Poll::Ready(()),
            TimerState::Fallback(sleep) => Future::poll(sleep.as_mut(), cx),
            TimerState::Armed => match ready!(this.fd.poll_expired(cx)) {
                Ok(()) => {
                    this.state = TimerState::Expired;
                    Poll::Ready(())
                }
                Err(e) => {
                    // The deadline is unknown here; firing now makes quinn look at its
                    // timers and set the next one, which then falls back if this repeats.
                    debug!(error = %e, "reading quinn's timerfd failed");
                    this.state = TimerState::Expired;
                    Poll::Ready(())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn alarm_waits_as_long_as_asked_and_survives_a_cancelled_wait() {
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

    #[tokio::test]
    async fn quinn_timer_fires_at_its_deadline_and_follows_resets() {
        let poll_once = |t: &mut Pin<Box<dyn quinn::AsyncTimer>>| {
            let waker = std::task::Waker::noop();
            t.as_mut().poll(&mut Context::from_waker(waker))
        };
        let start = Instant::now();
        let mut t = TimerfdRuntime.new_timer(start + Duration::from_millis(200));
        assert!(poll_once(&mut t).is_pending());
        // Brought forward: fires at the new deadline, not the old one.
        t.as_mut().reset(start + Duration::from_millis(20));
        std::future::poll_fn(|cx| t.as_mut().poll(cx)).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(20) && took < Duration::from_millis(200),
            "{took:?}"
        );
        // Expired stays ready until reset, as a tokio Sleep does.
        assert!(poll_once(&mut t).is_ready());
        // Pushed back after expiring: pending again, then fires.
        let at = Instant::now() + Duration::from_millis(30);
        t.as_mut().reset(at);
        assert!(poll_once(&mut t).is_pending());
        std::future::poll_fn(|cx| t.as_mut().poll(cx)).await;
        assert!(Instant::now() >= at);
        // A deadline already past is ready at once.
        t.as_mut().reset(Instant::now() - Duration::from_millis(1));
        assert!(poll_once(&mut t).is_ready());
        // Re-armed far ahead, then brought back: the far expiry does not linger.
        t.as_mut().reset(Instant::now() + Duration::from_secs(3600));
        let at = Instant::now() + Duration::from_millis(10);
        t.as_mut().reset(at);
        std::future::poll_fn(|cx| t.as_mut().poll(cx)).await;
        assert!(Instant::now() >= at);
    }
}
