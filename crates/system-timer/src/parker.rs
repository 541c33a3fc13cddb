//! The reaper's [`Parker`]: the sleep/wake handshake between the reaper (and `advance_clock`
//! callers) and the threads that wake it (an add that queued the earliest bucket, a task due at
//! add time in inline mode, a shutdown, a moved manual clock). Compiled under loom too, so that
//! models can check the handshake (see `tests/loom_timer.rs`): there the timerfd is replaced by
//! the alarm's recorded state (`alarm_at`), which `rearm` moves and `unpark` fires, and on which
//! the reaper sleeps.

use std::time::Duration;

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Condvar, Mutex};

/// A permit-based parker: `unpark` before `park` makes `park` return at once.
///
/// Ground rules: `notified` is the permit, read and written under its mutex only. Sleepers on
/// the condvar are any thread (`park`: the reaper without an alarm, and shutdown's bounded
/// wait; `park_since`: `advance_clock` callers, which wait for an epoch change and never take
/// the permit); `unpark` wakes them all. The alarm has one sleeper, the reaper
/// (`park_reaper`). The alarm is set only under the mutex: by the reaper before it blocks
/// (after seeing no permit), by `unpark` to "at once" (after granting the permit), and by
/// `rearm` only while no permit is pending and no `unpark` came since its caller read the
/// wheel (`epoch`). So an `unpark` is never lost: it lands either before the reaper's look at
/// the permit (which it then consumes) or after the reaper set its alarm (which it then
/// fires), and no `rearm` can move the alarm past it, nor past a bucket the reaper was
/// unparked for after the rearming caller's look at the wheel.
#[derive(Debug, Default)]
pub(crate) struct Parker {
    notified: Mutex<bool>,
    cv: Condvar,
    /// Bumped by every `unpark` (under `notified`'s mutex): a `rearm` computed from a reading of
    /// the wheel taken before an `unpark` (an add that queued an earlier bucket) is stale.
    epoch: AtomicU64,
    /// The reaper's alarm, when the timer has a grace (Linux): lets a thread that advanced the
    /// wheel move the reaper's wake-up later without waking it.
    #[cfg(all(target_os = "linux", not(loom)))]
    alarm: Option<crate::alarm::Alarm>,
    /// Under loom, the alarm as the parker would set it (there is no timerfd): read and written
    /// under `notified`'s mutex only, as the alarm is. [`ALARM_FIRED`] (`unpark`), a deadline on
    /// the timer's clock in ns (the reaper's sleep, or a `rearm`), or [`ALARM_NEVER`] (until
    /// unparked). The reaper's `park_reaper` sleeps until it fires, as on the timerfd: a `rearm`
    /// that moved it after an `unpark` fired it keeps the reaper asleep. See
    /// [`sleeping_reaper`](Self::sleeping_reaper).
    #[cfg(loom)]
    alarm_at: AtomicU64,
    /// Under loom: the reaper sleeps in `park_reaper` (under `notified`'s mutex, as `alarm_at`).
    #[cfg(loom)]
    asleep: crate::sync::atomic::AtomicBool,
}

/// Under loom: `Parker::alarm_at` once an `unpark` fired the alarm.
#[cfg(loom)]
pub(crate) const ALARM_FIRED: u64 = 0;
/// Under loom: `Parker::alarm_at` of an alarm that fires only when unparked.
#[cfg(loom)]
pub(crate) const ALARM_NEVER: u64 = u64::MAX;

impl Parker {
    /// A parker; with `alarm` (and on Linux), the reaper sleeps on a timerfd that
    /// [`rearm`](Self::rearm) can move.
    pub(crate) fn new(alarm: bool) -> Self {
        #[cfg(not(all(target_os = "linux", not(loom))))]
        let _ = alarm;
        Parker {
            notified: Mutex::new(false),
            cv: Condvar::new(),
            epoch: AtomicU64::new(0),
            #[cfg(all(target_os = "linux", not(loom)))]
            alarm: if alarm {
                crate::alarm::Alarm::new()
            } else {
                None
            },
            #[cfg(loom)]
            alarm_at: AtomicU64::new(ALARM_NEVER),
            #[cfg(loom)]
            asleep: crate::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Sleeps until unparked, or for at most `timeout` if given; consumes the permit. True if
    /// it slept (false: a permit was waiting, or the timeout was zero).
    pub(crate) fn park(&self, timeout: Option<Duration>) -> bool {
        let mut n = self.notified.lock();
        let slept = !*n && timeout.is_none_or(|d| !d.is_zero());
        if slept {
            n = match timeout {
                Some(d) => self.cv.wait_for(n, d),
                None => self.cv.wait(n),
            };
        }
        *n = false;
        slept
    }

    /// Sleeps until an `unpark` that came after `epoch` was read ([`epoch`](Self::epoch), taken
    /// before the caller looked at the state it waits on; at once if one came already), or for
    /// at most `timeout`; may return early (spuriously). Leaves the permit alone, which is the
    /// reaper's: for any number of other sleepers (`advance_clock`), none of which can then
    /// take a wake-up meant for another, or one meant for the reaper.
    pub(crate) fn park_since(&self, epoch: u64, timeout: Option<Duration>) {
        let n = self.notified.lock();
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        match timeout {
            Some(d) if d.is_zero() => {}
            Some(d) => drop(self.cv.wait_for(n, d)),
            None => drop(self.cv.wait(n)),
        }
    }

    /// A reading of the alarm's clock (when there is an alarm), to take **before** reading the
    /// timer's clock for the length of a sleep that [`park_reaper`](Self::park_reaper) or
    /// [`rearm`](Self::rearm) then sets: the alarm counts that length from this stamp, so a
    /// thread descheduled in between does not push the wake-up later (see `alarm.rs`).
    pub(crate) fn stamp(&self) -> Stamp {
        #[cfg(all(target_os = "linux", not(loom)))]
        return Stamp(self.alarm.as_ref().map(|_| crate::alarm::Stamp::now()));
        #[cfg(all(not(target_os = "linux"), not(loom)))]
        return Stamp(());
        #[cfg(loom)]
        Stamp(None)
    }

    /// The reaper's sleep: [`park`](Self::park), but on the alarm when there is one, so that
    /// [`rearm`](Self::rearm) can move the wake-up time; `timeout` counts from `stamp`
    /// ([`stamp`](Self::stamp)). Only the reaper calls it. True if it slept, as `park`.
    // Under loom its last block ends in a `return` that the non-loom tail makes necessary.
    #[cfg_attr(loom, allow(clippy::needless_return))]
    pub(crate) fn park_reaper(&self, stamp: Stamp, timeout: Option<Duration>) -> bool {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let (Some(alarm), Some(stamp)) = (&self.alarm, stamp.0) {
            {
                let mut n = self.notified.lock();
                if *n || timeout.is_some_and(|d| d.is_zero()) {
                    *n = false;
                    return false;
                }
                if !alarm.set(stamp, timeout) {
                    drop(n);
                    return self.park(timeout);
                }
            }
            alarm.wait();
            // Consumes a permit granted while it slept (the unpark also fired the alarm). One
            // granted after the wait returned is dropped too: the reaper is awake and re-reads
            // the timer's state before it sleeps again.
            *self.notified.lock() = false;
            return true;
        }
        #[cfg(loom)]
        {
            // The alarm's path above, with `alarm_at` for the timerfd: set under the mutex after
            // seeing no permit, then a sleep until it fires (an `unpark`; loom has no time).
            let mut n = self.notified.lock();
            if *n || timeout.is_some_and(|d| d.is_zero()) {
                *n = false;
                return false;
            }
            self.alarm_at
                .store(stamp.0.unwrap_or(ALARM_NEVER), Ordering::Relaxed);
            self.asleep.store(true, Ordering::Relaxed);
            self.cv.notify_all(); // a model waiting in `sleeping_reaper`
            while self.alarm_at.load(Ordering::Relaxed) != ALARM_FIRED {
                n = self.cv.wait(n);
            }
            self.asleep.store(false, Ordering::Relaxed);
            *n = false;
            return true;
        }
        #[cfg(not(loom))]
        {
            let _ = stamp;
            self.park(timeout)
        }
    }

    /// Under loom, for models: waits until the reaper sleeps in `park_reaper`, and returns its
    /// alarm: `Some(deadline)` (ns on the timer's clock) or `None` (until unparked). Never
    /// "fired": a fired alarm wakes the reaper, so this waits for its next sleep.
    #[cfg(loom)]
    pub(crate) fn sleeping_reaper(&self) -> Option<u64> {
        let mut n = self.notified.lock();
        // Asleep on a fired alarm: woken, about to run (and, once it sleeps again, notify).
        while !self.asleep.load(Ordering::Relaxed)
            || self.alarm_at.load(Ordering::Relaxed) == ALARM_FIRED
        {
            n = self.cv.wait(n);
        }
        let at = self.alarm_at.load(Ordering::Relaxed);
        drop(n);
        (at != ALARM_NEVER).then_some(at)
    }

    /// Grants the permit, bumps the epoch and wakes **every** sleeper on the condvar (the
    /// reaper, and any number of [`park_since`](Self::park_since) callers: with `notify_one`,
    /// one of two `advance_clock` callers slept on after the clock moved or a shutdown).
    pub(crate) fn unpark(&self) {
        let mut n = self.notified.lock();
        *n = true;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cv.notify_all();
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(alarm) = &self.alarm {
            alarm.fire();
        }
        #[cfg(loom)]
        self.alarm_at.store(ALARM_FIRED, Ordering::Relaxed);
    }

    /// The count of unparks so far: read it before reading the wheel for a [`rearm`](Self::rearm).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Calls `publish` and moves the reaper's alarm to `timeout` past `stamp` (taken before the
    /// reading `timeout` was computed from; `None`: until unparked), unless an unpark is pending
    /// or came since `epoch` was read (an add may have queued an earlier bucket than the one
    /// `timeout` was computed from: the unparked reaper publishes and sets its alarm from a
    /// fresh reading). No alarm move without an alarm: the
    /// reaper then wakes at the time it chose, finds nothing due and sleeps again.
    pub(crate) fn rearm(
        &self,
        epoch: u64,
        stamp: Stamp,
        timeout: Option<Duration>,
        publish: impl FnOnce(),
    ) {
        let n = self.notified.lock();
        if *n || self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        publish();
        #[cfg(all(target_os = "linux", not(loom)))]
        if let (Some(alarm), Some(stamp)) = (&self.alarm, stamp.0) {
            alarm.set(stamp, timeout);
        }
        #[cfg(all(not(target_os = "linux"), not(loom)))]
        let _ = (stamp, timeout);
        #[cfg(loom)]
        {
            let _ = timeout;
            self.alarm_at
                .store(stamp.0.unwrap_or(ALARM_NEVER), Ordering::Relaxed);
        }
        drop(n);
    }
}

/// A [`Parker::stamp`]: a reading of the alarm's clock, or nothing without an alarm. Under
/// loom, the deadline (ns on the timer's clock, `None`: until unparked) the sleep or rearm it
/// goes with is for: see `Stamp::at` (under loom only).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp(
    #[cfg(all(target_os = "linux", not(loom)))] Option<crate::alarm::Stamp>,
    #[cfg(all(not(target_os = "linux"), not(loom)))] (),
    #[cfg(loom)] Option<u64>,
);

#[cfg(loom)]
impl Stamp {
    /// Under loom: this stamp, for a sleep (or a rearm) until `deadline` on the timer's clock
    /// (`None`: until unparked), which the parker records as its alarm.
    pub(crate) fn at(self, deadline: Option<u64>) -> Self {
        Stamp(deadline)
    }
}

/// How long after a bucket's expiration callers start advancing the wheel for the reaper: a
/// caller compares its cheap clock reading (`Clock::deadline_base_ns`, at most a few
/// microseconds above the clock: about 13 µs at most, about 20 µs under the worst slewing) with
/// the expiration, and an advance before the bucket is really due would find nothing to do. Far
/// below a tick, so it does not change when tasks run.
pub(crate) const HELP_MARGIN_NS: u64 = 25_000;
