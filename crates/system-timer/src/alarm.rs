//! The reaper's alarm on Linux: a timerfd, so that a thread that advanced the wheel for the
//! reaper ([`SystemTimer::advance_if_due`](crate::SystemTimer::advance_if_due)) can move the
//! reaper's wake-up time later **without waking it** (a futex wait's timeout cannot be changed
//! from outside; moving it would take a wake-up, the very cost helping saves).
//!
//! Only [`Parker`](crate::reaper::Parker) uses it, under the parker's mutex (see the ground rules
//! there): the alarm holds no state of its own beyond the kernel's timer.

use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

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

    /// Sets the alarm to fire `after` from now (`Duration::ZERO`: at once), or disarms it
    /// (`None`). Setting it clears a firing not yet waited for. False if the kernel refused (the
    /// caller must then not block on [`wait`](Self::wait)).
    pub(crate) fn set(&self, after: Option<Duration>) -> bool {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = match after {
            None => zero,
            Some(d) => {
                // A zero value would disarm: "at once" is one nanosecond.
                let d = d.max(Duration::from_nanos(1));
                Timespec {
                    tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2),
                    tv_nsec: d.subsec_nanos().into(),
                }
            }
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec).is_ok()
    }

    /// Blocks until the alarm fires; returns at once if it fired since it was last set. May
    /// return early (a signal): callers re-check their state.
    pub(crate) fn wait(&self) {
        let mut expirations = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut expirations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    #[allow(clippy::disallowed_methods)] // measuring how long a wait took
    fn fires_once_set_and_can_be_moved_later() {
        let a = Alarm::new().expect("timerfd");
        assert!(a.set(Some(Duration::ZERO)));
        let t0 = Instant::now();
        a.wait(); // already fired: returns at once
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Moved later before it fires: the wait lasts at least the later time.
        assert!(a.set(Some(Duration::from_millis(1))));
        assert!(a.set(Some(Duration::from_millis(30))));
        let t0 = Instant::now();
        a.wait();
        assert!(
            t0.elapsed() >= Duration::from_millis(30),
            "{:?}",
            t0.elapsed()
        );
        // Disarming then firing at once.
        assert!(a.set(None));
        assert!(a.set(Some(Duration::ZERO)));
        a.wait();
    }
}
