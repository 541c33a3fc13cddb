//! The reaper's alarm on Linux: a timerfd, so that a thread that advanced the wheel for the
//! reaper ([`SystemTimer::advance_if_due`](crate::SystemTimer::advance_if_due)) can move the
//! reaper's wake-up time later **without waking it** (a futex wait's timeout cannot be changed
//! from outside; moving it would take a wake-up, the very cost helping saves).
//!
//! Only [`Parker`](crate::parker::Parker) uses it, under the parker's mutex (see the ground rules
//! there): the alarm holds no state of its own beyond the kernel's timer.
//!
//! A wake-up time is set **absolute** (`TFD_TIMER_ABSTIME`), as a [`Stamp`] of the alarm's clock
//! taken *before* the timer's clock was read to compute the sleep, plus that sleep. A relative
//! setting would count from the moment of the `timerfd_settime` call, so a thread descheduled
//! between its reading and the call (a caller advancing the wheel for the reaper, or the reaper
//! itself) would push the reaper's wake-up later by as long as it was off the CPU. With the stamp
//! taken first, the alarm can only be early (by the few nanoseconds between the two readings, or
//! more if descheduled right there): the reaper then finds nothing due and sleeps again.

use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::time::{
    clock_gettime, timerfd_create, timerfd_settime, ClockId, Itimerspec, TimerfdClockId,
    TimerfdFlags, TimerfdTimerFlags, Timespec,
};

/// A reading of the alarm's clock (`CLOCK_MONOTONIC`): the base of an absolute wake-up time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp(Timespec);

impl Stamp {
    /// The alarm's clock now. Take it before reading the timer's clock for a sleep's length.
    pub(crate) fn now() -> Self {
        Stamp(clock_gettime(ClockId::Monotonic))
    }

    /// This reading plus `d` (saturating far in the future).
    #[allow(clippy::useless_conversion)] // `tv_nsec` is not an `i64` on every target
    fn plus(self, d: Duration) -> Timespec {
        let nanos = i64::from(self.0.tv_nsec) + i64::from(d.subsec_nanos());
        let secs = i64::try_from(d.as_secs())
            .unwrap_or(i64::MAX / 2)
            .min(i64::MAX / 2)
            .saturating_add(self.0.tv_sec)
            .saturating_add(nanos / 1_000_000_000);
        Timespec {
            tv_sec: secs,
            tv_nsec: (nanos % 1_000_000_000) as _,
        }
    }
}

/// A one-shot monotonic kernel timer that one thread blocks on.
#[derive(Debug)]
pub(crate) struct Alarm {
    fd: OwnedFd,
}

impl Alarm {
    /// A disarmed alarm; `None` if the kernel refuses one (the parker then sleeps on its condvar).
    pub(crate) fn new() -> Option<Self> {
        timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)
            .ok()
            .map(|fd| Alarm { fd })
    }

    /// Sets the alarm to fire `after` past `stamp` (at once if that time has passed), or
    /// disarms it (`after` = `None`). Setting it clears a firing not yet waited for. False if
    /// the kernel refused (the caller must then not block on [`wait`](Self::wait)).
    pub(crate) fn set(&self, stamp: Stamp, after: Option<Duration>) -> bool {
        self.set_abs(after.map(|d| stamp.plus(d)))
    }

    /// Makes the alarm fire at once.
    pub(crate) fn fire(&self) -> bool {
        // One nanosecond after the clock's origin: long past (zero would disarm).
        self.set_abs(Some(Timespec {
            tv_sec: 0,
            tv_nsec: 1,
        }))
    }

    /// Sets the alarm to fire at `at` on its clock, or disarms it (`None`).
    fn set_abs(&self, at: Option<Timespec>) -> bool {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: at.unwrap_or(zero),
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::ABSTIME, &spec).is_ok()
    }

    /// Blocks until the alarm fires; returns at once if it fired since it was last set. May
    /// return early (a signal): callers re-check their state.
    pub(crate) fn wait(&self) {
        let mut expirations = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut expirations);
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the hang guard's thread; measuring how long a wait took
mod tests {
    use super::*;
    use std::time::Instant;

    /// Runs `f` (which waits on alarms) on a thread of its own, and fails if it has not
    /// returned within 20 s: an alarm that never fires is a failure, not a hung test run (under
    /// cargo-mutants, 8 mutants of this file only timed out). A panic in `f` fails the test.
    fn within_20s(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(()) => t.join().expect("the test body returned"),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::panic::resume_unwind(t.join().expect_err("the test body panicked"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("an alarm wait hung for 20 s")
            }
        }
    }

    #[test]
    fn fires_once_set_and_can_be_moved_later() {
        within_20s(fires_once_set_and_can_be_moved_later_body);
    }

    fn fires_once_set_and_can_be_moved_later_body() {
        let a = Alarm::new().expect("timerfd");
        assert!(a.fire());
        let t0 = Instant::now();
        a.wait(); // already fired: returns at once
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Moved later before it fires: the wait lasts at least the later time.
        let t0 = Instant::now();
        let stamp = Stamp::now();
        assert!(a.set(stamp, Some(Duration::from_millis(1))));
        assert!(a.set(stamp, Some(Duration::from_millis(30))));
        a.wait();
        assert!(
            t0.elapsed() >= Duration::from_millis(30),
            "{:?}",
            t0.elapsed()
        );
        // Disarming then firing at once; a time already past fires at once too.
        assert!(a.set(stamp, None));
        assert!(a.fire());
        a.wait();
        assert!(a.set(stamp, Some(Duration::from_millis(1))));
        a.wait();
    }

    /// The wake-up counts from the stamp, not from the `set` call: a setter descheduled between
    /// its reading and the call (here it sleeps 3 s) does not delay the alarm by as much.
    #[test]
    fn the_wake_up_counts_from_the_stamp_not_from_the_set_call() {
        within_20s(the_wake_up_counts_from_the_stamp_body);
    }

    fn the_wake_up_counts_from_the_stamp_body() {
        let a = Alarm::new().expect("timerfd");
        let t0 = Instant::now();
        let stamp = Stamp::now();
        std::thread::sleep(Duration::from_secs(3));
        assert!(a.set(stamp, Some(Duration::from_millis(3_100))));
        a.wait();
        let waited = t0.elapsed();
        // Never early (3.1 s); and set relative to the call it would fire 3.1 s after it, at
        // 6.1 s at the earliest. Between the two, 2.9 s is the allowance for a late wake-up (a
        // loaded machine), far more than a scheduler ever takes to run a woken thread.
        assert!(waited >= Duration::from_millis(3_100), "{waited:?}");
        assert!(waited < Duration::from_secs(6), "{waited:?}");
    }

    #[test]
    fn a_stamp_plus_a_duration_carries_the_nanoseconds() {
        let s = Stamp(Timespec {
            tv_sec: 5,
            tv_nsec: 900_000_000,
        });
        let t = s.plus(Duration::new(2, 300_000_000));
        assert_eq!((t.tv_sec, t.tv_nsec), (8, 200_000_000));
        let far = s.plus(Duration::MAX);
        assert!(far.tv_sec >= i64::MAX / 2, "saturates far in the future");
    }
}
