//! Time. Every read of time in the crate goes through a [`Clock`], so the whole timer, reaper
//! included, runs the same on the monotonic system clock and on a [`ManualClock`] that tests
//! move by hand.
#![allow(clippy::disallowed_methods)] // this module is where `Instant::now` is allowed

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::Arc;
#[cfg(not(loom))]
use crate::sync::{Mutex, Weak};

/// A monotonic source of time, in nanoseconds since the clock's own epoch.
///
/// Implementations must never go backwards. The timer only ever compares readings of one clock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Nanoseconds since this clock's epoch.
    fn now_ns(&self) -> u64;

    /// How long, in real time, a thread should sleep so that this clock reads at least
    /// `deadline_ns` when it wakes; `None` means "no real-time bound: sleep until woken" (a
    /// manual clock, which wakes sleepers through [`subscribe`](Self::subscribe) when moved).
    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration>;

    /// Asks to have `waker` called whenever the clock moves (only clocks that move by hand need
    /// to; the system clock ignores it). The reaper uses this to re-check its deadline.
    #[cfg(not(loom))]
    fn subscribe(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        let _ = waker;
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years), in u64 arithmetic.
#[inline(always)]
pub(crate) fn duration_ns(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// The monotonic system clock (`std::time::Instant`), read in nanoseconds since the clock was
/// created.
///
/// ```
/// use system_timer::{Clock, SystemClock};
/// let c = SystemClock::new();
/// let a = c.now_ns();
/// assert!(c.now_ns() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct SystemClock {
    epoch: Instant,
}

impl SystemClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        SystemClock {
            epoch: Instant::now(),
        }
    }

    /// The reading this clock gives at `instant` (0 for instants before its epoch).
    #[inline]
    pub fn ns_at(&self, instant: Instant) -> u64 {
        duration_ns(instant.saturating_duration_since(self.epoch))
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        Some(Duration::from_nanos(
            deadline_ns.saturating_sub(self.now_ns()),
        ))
    }
}

/// A clock that moves only when told to: for deterministic tests of the timer, reaper included.
/// Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use system_timer::{Clock, ManualClock};
/// let clock = ManualClock::new(100);
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_ms(), 105);
/// assert_eq!(clock.now_ns(), 105_000_000);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    now_ns: AtomicU64,
    #[cfg(not(loom))]
    wakers: Mutex<Vec<Weak<dyn Fn() + Send + Sync>>>,
}

impl ManualClock {
    /// A manual clock reading `start_ms` milliseconds.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                now_ns: AtomicU64::new(start_ms.saturating_mul(1_000_000)),
                #[cfg(not(loom))]
                wakers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The time in whole milliseconds (rounded down).
    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// The time in nanoseconds (as [`Clock::now_ns`]).
    pub fn now_ns(&self) -> u64 {
        self.inner.now_ns.load(Ordering::Acquire)
    }

    /// Moves the clock forward by `d` (saturating) and wakes whoever subscribed.
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .inner
            .now_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(ns))
            });
        self.wake();
    }

    /// Sets the clock to `ms` milliseconds; a time earlier than the current one is ignored (the
    /// clock is monotonic).
    pub fn set_ms(&self, ms: u64) {
        self.set_ns(ms.saturating_mul(1_000_000));
    }

    /// Sets the clock to `ns` nanoseconds; a time earlier than the current one is ignored.
    pub fn set_ns(&self, ns: u64) {
        self.inner.now_ns.fetch_max(ns, Ordering::AcqRel);
        self.wake();
    }

    fn wake(&self) {
        #[cfg(not(loom))]
        {
            let wakers: Vec<_> = {
                let mut w = self.inner.wakers.lock();
                w.retain(|w| w.strong_count() > 0);
                w.iter().filter_map(Weak::upgrade).collect()
            };
            for w in wakers {
                w();
            }
        }
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        ManualClock::now_ns(self)
    }

    fn sleep_for(&self, _deadline_ns: u64) -> Option<Duration> {
        None
    }

    #[cfg(not(loom))]
    fn subscribe(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        self.inner.wakers.lock().push(waker);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_ns", &self.now_ns())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_is_monotonic_and_wakes_subscribers() {
        let c = ManualClock::new(10);
        let hits = Arc::new(AtomicU64::new(0));
        let h2 = hits.clone();
        let waker: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            h2.fetch_add(1, Ordering::Relaxed);
        });
        c.subscribe(Arc::downgrade(&waker));
        c.advance(Duration::from_millis(1));
        c.set_ms(5); // earlier: ignored
        assert_eq!(c.now_ms(), 11);
        assert_eq!(hits.load(Ordering::Relaxed), 2);
        drop(waker);
        c.advance(Duration::from_millis(1));
        assert_eq!(
            hits.load(Ordering::Relaxed),
            2,
            "dropped subscribers are not called"
        );
        assert_eq!(c.sleep_for(u64::MAX), None);
    }

    #[test]
    fn huge_advances_saturate() {
        let c = ManualClock::new(0);
        c.advance(Duration::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
        let s = SystemClock::new();
        assert!(s.sleep_for(0).unwrap().is_zero());
    }
}
