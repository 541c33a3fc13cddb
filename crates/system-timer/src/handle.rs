//! [`TimerHandle`]: cancel a scheduled task, or ask what became of it.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use timing_wheel::{EntryHandle, WheelKey};

use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use crate::timer::Cap;

/// The handle of a scheduled task. Cancel it in O(1) from any thread; dropping the handle does
/// **not** cancel the task (fire-and-forget is the common case).
///
/// The task leaves the wheel exactly one way, and the handle tells which: [`is_cancelled`]
/// (this handle's [`cancel`] or [`take`] won: the timer never runs the task), [`is_fired`]
/// (the timer took it out to run), [`is_handed_back`] (a shutdown returned it from the wheel).
/// A fired task queued for an executor and not yet started when a shutdown comes is handed
/// back too, but its handle still says fired: it left the wheel that way.
///
/// [`cancel`]: TimerHandle::cancel
/// [`take`]: TimerHandle::take
/// [`is_cancelled`]: TimerHandle::is_cancelled
/// [`is_fired`]: TimerHandle::is_fired
/// [`is_handed_back`]: TimerHandle::is_handed_back
pub struct TimerHandle<T> {
    /// `None` for a task that was already due when added (dispatched at once).
    entry: Option<EntryHandle<T>>,
    deadline_ns: u64,
    cap: Option<Arc<Cap>>,
}

impl<T> TimerHandle<T> {
    #[inline(always)]
    pub(crate) fn new(
        entry: Option<EntryHandle<T>>,
        deadline_ns: u64,
        cap: Option<Arc<Cap>>,
    ) -> Self {
        TimerHandle {
            entry,
            deadline_ns,
            cap,
        }
    }

    /// Cancels the task: O(1), from any thread. Returns true if this call won: the task was
    /// pending, is removed from the timer at once (its memory released) and will never run.
    /// False if it already started or was dispatched to run, was cancelled before, or was
    /// handed back by a shutdown.
    ///
    /// # Panics
    ///
    /// If the task's drop panics (it is dropped on this thread), once the cancel has won: the
    /// task is out of the timer and its [`max_pending`](crate::Builder::max_pending) slot free.
    ///
    /// ```
    /// use std::time::Duration;
    /// let timer = system_timer::SystemTimer::new();
    /// let h = timer.add(Duration::from_secs(60), || unreachable!())?;
    /// assert!(h.cancel());
    /// assert!(!h.cancel());
    /// assert!(h.is_cancelled() && timer.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn cancel(&self) -> bool {
        // Dropped here, after the wheel's lock was released (and the cap's slot given back:
        // a panic in the drop, the task's own code, must not keep the slot for ever).
        self.take().map(drop).is_some()
    }

    /// Cancels the task and hands it back instead of dropping it: `Some(task)` if this call
    /// won (when [`cancel`](Self::cancel) would return true), `None` otherwise. The timer no
    /// longer holds it (its [`max_pending`](crate::Builder::max_pending) slot is free) and will
    /// never run it; add it again with a new delay (a renewed lease keeps its task, no new
    /// closure), run it, or drop it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let timer = system_timer::SystemTimer::new();
    /// let lease = timer.add(Duration::from_secs(10), || println!("lease lost"))?;
    /// // Renewed: the same task, ten seconds from now.
    /// let task = lease.take().expect("still pending");
    /// let lease = timer.add(Duration::from_secs(10), task)?;
    /// assert!(lease.is_pending() && timer.len() == 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    #[must_use = "the task is handed back, not dropped: add it again, run it, or use cancel"]
    pub fn take(&self) -> Option<T> {
        let task = self.entry.as_ref()?.cancel()?;
        if let Some(cap) = &self.cap {
            cap.used.fetch_sub(1, Ordering::AcqRel);
        }
        Some(task)
    }

    /// True once this handle's [`cancel`](Self::cancel) (or [`take`](Self::take)) has won.
    pub fn is_cancelled(&self) -> bool {
        self.entry.as_ref().is_some_and(EntryHandle::is_cancelled)
    }

    /// True once the timer took the task out to run (it has run, is running, or is queued for an
    /// executor or, in inline mode, for the next advance; a shutdown may still hand back a
    /// queued one).
    pub fn is_fired(&self) -> bool {
        self.entry.as_ref().is_none_or(EntryHandle::is_fired)
    }

    /// True if a shutdown handed the task back before it was due.
    pub fn is_handed_back(&self) -> bool {
        self.entry.as_ref().is_some_and(EntryHandle::is_handed_back)
    }

    /// True while the task waits in the timer for its deadline.
    pub fn is_pending(&self) -> bool {
        self.entry.as_ref().is_some_and(EntryHandle::is_pending)
    }

    /// The deadline, as time since the timer's clock epoch (exact, before rounding to the tick).
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns)
    }

    /// The deadline in nanoseconds on the timer's clock.
    pub fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }

    /// The deadline in whole milliseconds on the timer's clock, rounded up. The task never runs
    /// before [`deadline_ns`](Self::deadline_ns); with a tick of a whole number of milliseconds
    /// (Kafka's 1 ms by default), deadlines round up to the tick, so it also never runs while
    /// the clock's `now_ms()` is below this. With a finer tick it may run in the millisecond
    /// before this one.
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ns.div_ceil(1_000_000)
    }
}

impl<T> fmt::Debug for TimerHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerHandle")
            .field("deadline_ns", &self.deadline_ns)
            .field("pending", &self.is_pending())
            .finish()
    }
}

/// The key of a scheduled task, from [`SystemTimer::add_keyed`](crate::SystemTimer::add_keyed):
/// the cheap alternative to a [`TimerHandle`]. `Copy`, 20 bytes, no reference count and nothing
/// to drop; cancel it with [`SystemTimer::cancel`](crate::SystemTimer::cancel) (O(1), from any
/// thread, `true` when that call won and the task will never run).
///
/// A key names one task of the timer that issued it, and never a later one: after the task ran,
/// was cancelled or handed back, the key matches nothing. Given to another timer, it matches
/// nothing either (each timer has its own id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey {
    pub(crate) key: WheelKey,
    pub(crate) timer: TimerId,
}

/// A timer's id, unique in the process: a 64-bit count from 1, which a process cannot exhaust (a
/// build a nanosecond would take 584 years). It tells a timer's keys from another timer's, and
/// its threads (and the threads running its tasks inline) from others. Before, a 32-bit count
/// wrapped after 2³² builds: the timer that then got id 0 ("no timer") took every thread for
/// its own (its `shutdown` handed back nothing), and keys of timers 2³² builds apart matched
/// each other.
///
/// Two halves, so that a [`TimerKey`] stays 4-aligned (20 bytes, not 24), and the low one never
/// 0 (counts whose low half is 0 are skipped), so that an `Option<TimerKey>` (in every
/// purgatory operation's cell) is no larger.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TimerId {
    low: NonZeroU32,
    high: u32,
}

/// The next [`TimerId`]'s count. A plain std atomic: an id source, not a synchronisation point
/// loom needs to see.
pub(crate) static NEXT_TIMER_ID: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1);

impl TimerId {
    /// A new id, never handed out before in this process.
    pub(crate) fn next() -> TimerId {
        loop {
            let count = NEXT_TIMER_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(id) = TimerId::from_u64(count) {
                return id;
            }
        }
    }

    /// The id of `count`, unless its low half is 0.
    fn from_u64(count: u64) -> Option<TimerId> {
        Some(TimerId {
            low: NonZeroU32::new(count as u32)?,
            high: (count >> 32) as u32,
        })
    }

    fn get(self) -> u64 {
        u64::from(self.low.get()) | (u64::from(self.high) << 32)
    }
}

impl fmt::Debug for TimerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_ids_keep_all_64_bits_and_keys_stay_20_bytes() {
        for count in [1, u64::from(u32::MAX), (1 << 32) + 1, u64::MAX] {
            assert_eq!(TimerId::from_u64(count).map(TimerId::get), Some(count));
        }
        // The counts a 32-bit id would have wrapped to 0 are skipped.
        assert_eq!(TimerId::from_u64(0), None);
        assert_eq!(TimerId::from_u64(1 << 32), None);
        // Ids a 32-bit count would have confused: 1 and 2³² + 1.
        assert_ne!(TimerId::from_u64((1 << 32) + 1), TimerId::from_u64(1));
        assert_eq!(
            format!("{:?}", TimerId::from_u64((1 << 32) + 1).unwrap()),
            "4294967297"
        );
        assert_eq!(std::mem::size_of::<TimerKey>(), 20);
        assert_eq!(std::mem::size_of::<Option<TimerKey>>(), 20);
    }
}
