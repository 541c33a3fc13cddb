//! The single-threaded wheel: `&mut self`, no locks, no atomics, time supplied by the caller.

use std::fmt;

use crate::bucket::{Bucket, ExpiryQueue, Geometry, NOT_QUEUED};
use crate::list::{EntryKey, KeyState};
use crate::shard::{Fired, Shard, WheelCounts};
use crate::unwind::Deferred;
use crate::{AddError, ConfigError};

/// A hierarchical timing wheel for one thread, driven by a caller-supplied `now` (an engine's own
/// event loop, a simulation, a test).
///
/// Time is any `u64` unit (Kafka uses milliseconds); `tick` is the width of a level-0 bucket.
/// Entries are scheduled at an absolute deadline and handed back by [`advance`] once the wheel's
/// time reaches the deadline rounded up to the tick: never before the deadline, at most one tick
/// after it.
///
/// # Invariants
///
/// * Every pending entry is linked into exactly one bucket, and every non-empty bucket is in the
///   expiry queue exactly once, under its current expiration (checked by
///   [`check_invariants`](Self::check_invariants)).
/// * A queued bucket's expiration does not change until the bucket has been flushed.
/// * The queue holds buckets, not entries: at most `levels × wheel_size` items.
///
/// # Examples
///
/// ```
/// use timing_wheel::TimingWheel;
///
/// // Kafka's defaults: 1 ms tick, 20 buckets per level, starting at time 0.
/// let mut wheel = TimingWheel::new(1, 20, 0)?;
/// let a = wheel.add(5, "five")?;
/// let _b = wheel.add(450, "four hundred fifty")?;
/// assert_eq!(wheel.cancel(a), Some("five"));
///
/// let mut fired = Vec::new();
/// while let Some(t) = wheel.next_expiration() {
///     wheel.advance(t, |e| fired.push((e.deadline, e.value)));
/// }
/// assert_eq!(fired, [(450, "four hundred fifty")]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`advance`]: TimingWheel::advance
#[doc(alias = "HashedWheelTimer")]
pub struct TimingWheel<T> {
    shard: Shard<T>,
    /// Per bucket: the expiration it is queued under, or `NOT_QUEUED`.
    markers: Vec<u64>,
    queue: ExpiryQueue,
}

// ===== impl TimingWheel =====

impl<T> TimingWheel<T> {
    /// A wheel with level-0 buckets `tick` wide, `wheel_size` buckets per level, whose clock
    /// starts at `start` (rounded down to the tick). Overflow levels are created when first
    /// needed.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if `tick` is 0, `wheel_size` is below 2 or above
    /// [`MAX_WHEEL_SIZE`](crate::MAX_WHEEL_SIZE), or `tick × wheel_size` overflows.
    ///
    /// ```
    /// use timing_wheel::{ConfigError, TimingWheel};
    /// assert_eq!(TimingWheel::<()>::new(0, 20, 0).unwrap_err(), ConfigError::ZeroTick);
    /// assert_eq!(TimingWheel::<()>::new(1, 1, 0).unwrap_err(), ConfigError::WheelSizeTooSmall(1));
    /// ```
    pub fn new(tick: u64, wheel_size: usize, start: u64) -> Result<Self, ConfigError> {
        let geo = Geometry::new(tick, wheel_size)?;
        let markers = vec![NOT_QUEUED; geo.max_levels() * wheel_size];
        Ok(TimingWheel {
            shard: Shard::new(geo, start),
            markers,
            queue: ExpiryQueue::default(),
        })
    }

    /// Schedules `value` at the absolute time `deadline`. O(1).
    ///
    /// # Errors
    ///
    /// [`AddError::Expired`] with the value when the deadline (rounded up to the tick) is not
    /// after the wheel's current time: the entry is already due and the caller should act on it
    /// now. A deadline past the last representable tick (the last multiple of the tick below
    /// `u64::MAX`) is accepted and means "never": it is never handed out, but can be cancelled.
    /// This holds even once the wheel's time has reached such a deadline (with a tick of 1, or
    /// one dividing `u64::MAX`, an advance to `u64::MAX` takes the time there): it is still
    /// accepted as never due, not refused as `Expired`. A caller whose clock can reach the end
    /// of the range must check such deadlines against it itself.
    ///
    /// ```
    /// use timing_wheel::{AddError, TimingWheel};
    /// let mut wheel = TimingWheel::new(1, 20, 100)?;
    /// assert!(matches!(wheel.add(100, 'x'), Err(AddError::Expired('x'))));
    /// assert!(wheel.add(101, 'y').is_ok());
    /// assert!(wheel.add(u64::MAX, 'z').is_ok());
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[doc(alias = "insert")]
    #[inline(always)]
    pub fn add(&mut self, deadline: u64, value: T) -> Result<EntryKey, AddError<T>> {
        let (key, bucket) = self.shard.add(deadline, value)?;
        if let Some(b) = bucket {
            let size = self.shard.geometry().size as usize;
            queue_bucket(size, &mut self.markers, &mut self.queue, b);
        }
        Ok(key)
    }

    /// Cancels the entry: unlinks it at once (O(1)) and returns its value, or `None` if the key
    /// does not name a pending entry (it fired or was cancelled already).
    ///
    /// ```
    /// let mut wheel = timing_wheel::TimingWheel::new(1, 20, 0)?;
    /// let k = wheel.add(10, String::from("payload"))?;
    /// assert_eq!(wheel.cancel(k).as_deref(), Some("payload"));
    /// assert_eq!(wheel.cancel(k), None);
    /// assert!(wheel.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "remove")]
    #[inline(always)]
    pub fn cancel(&mut self, key: EntryKey) -> Option<T> {
        self.shard.cancel(key)
    }

    /// True while `key` names a pending entry.
    ///
    /// ```
    /// let mut wheel = timing_wheel::TimingWheel::new(1, 20, 0)?;
    /// let k = wheel.add(3, ())?;
    /// assert!(wheel.contains(k));
    /// wheel.advance(3, |_| {});
    /// assert!(!wheel.contains(k));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn contains(&self, key: EntryKey) -> bool {
        self.shard.key_state(key) == KeyState::Pending
    }

    /// The deadline of a pending entry.
    ///
    /// ```
    /// let mut wheel = timing_wheel::TimingWheel::new(1, 20, 0)?;
    /// let k = wheel.add(42, ())?;
    /// assert_eq!(wheel.deadline(k), Some(42));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deadline(&self, key: EntryKey) -> Option<u64> {
        self.shard.deadline(key)
    }

    /// Moves time forward to `now`: flushes every bucket due by then, in expiration order,
    /// cascading entries down the levels, and hands each entry whose deadline has been reached to
    /// `f` (Kafka's `advanceClock` loop plus `flush`). Returns the number of entries handed out.
    /// An earlier `now` than the wheel's time does nothing.
    ///
    /// `f` may not touch the wheel (it is borrowed); collect what you need and act afterwards.
    ///
    /// # Panics
    ///
    /// If `f` panics, the advance still completes (every other due entry is handed to `f`, each
    /// call's panic caught) and leaves the wheel consistent, then raises the first panic again.
    /// The entry whose call panicked is gone (its value was moved into `f`).
    ///
    /// ```
    /// let mut wheel = timing_wheel::TimingWheel::new(1, 20, 0)?;
    /// wheel.add(28, "a")?;
    /// wheel.add(30, "b")?;
    /// let mut out = vec![];
    /// assert_eq!(wheel.advance(29, |e| out.push(e.value)), 1);
    /// assert_eq!(out, ["a"]);
    /// assert_eq!(wheel.current_time(), 29);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "advanceClock")]
    #[doc(alias = "poll")]
    pub fn advance(&mut self, now: u64, mut f: impl FnMut(Fired<T>)) -> usize {
        let TimingWheel {
            shard,
            markers,
            queue,
        } = self;
        let size = shard.geometry().size as usize;
        let mut fired = 0;
        let mut panicked = Deferred::default();
        let mut f = |e| panicked.call(&mut f, e);
        while let Some(b) = queue.pop_due(now) {
            markers[b.level() * size + b.slot()] = NOT_QUEUED;
            shard.advance_clock(b.expiration());
            // Re-placed entries go to finer buckets and are queued (they may be due in this loop).
            fired += shard.flush(b, &mut f, &mut |nb| queue_bucket(size, markers, queue, nb));
        }
        shard.advance_clock(now);
        panicked.resume();
        fired
    }

    /// The earliest time at which [`advance`](Self::advance) has work: the expiration of the
    /// earliest queued bucket. It is never after the earliest pending deadline (rounded up to the
    /// tick), and may be before it (a coarse bucket is due at its slot's start, to cascade; a
    /// bucket whose entries were all cancelled stays queued until then). `None` when nothing is
    /// queued.
    ///
    /// ```
    /// let mut wheel = timing_wheel::TimingWheel::new(1, 20, 0)?;
    /// assert_eq!(wheel.next_expiration(), None);
    /// wheel.add(450, ())?;
    /// assert_eq!(wheel.next_expiration(), Some(400)); // level-2 bucket [400, 800)
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_expiration(&self) -> Option<u64> {
        self.queue.peek().map(|b| b.expiration())
    }

    /// Number of pending entries. Exact: cancelled entries are gone at once.
    #[doc(alias = "size")]
    pub fn len(&self) -> usize {
        self.shard.len()
    }

    /// True when no entry is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The wheel's time: the last `now` (or bucket expiration) it advanced to, rounded down to
    /// the tick.
    pub fn current_time(&self) -> u64 {
        self.shard.current()
    }

    /// Width of a level-0 bucket.
    pub fn tick(&self) -> u64 {
        self.shard.geometry().tick
    }

    /// Buckets per level.
    pub fn wheel_size(&self) -> usize {
        self.shard.geometry().size as usize
    }

    /// Levels created so far (overflow levels appear on first use).
    pub fn levels(&self) -> usize {
        self.shard.levels()
    }

    /// Buckets in the expiry queue.
    pub fn queued_buckets(&self) -> usize {
        self.queue.len()
    }

    /// What happened to the wheel's entries so far.
    pub fn counts(&self) -> WheelCounts {
        self.shard.counts()
    }

    /// Bytes reserved for entry storage (whole arena pages). Freed entries are reused before
    /// the arena grows.
    pub fn reserved_bytes(&self) -> usize {
        self.shard.reserved_bytes()
    }

    /// The bucket the entry is linked into right now. O(pending): for tests and debugging.
    #[doc(hidden)]
    pub fn locate(&self, key: EntryKey) -> Option<Bucket> {
        self.shard.locate(key)
    }

    /// Walks every bucket and the queue and panics if an invariant is broken: lists well formed,
    /// every pending entry in the right bucket, every non-empty bucket queued once under its
    /// expiration, counts adding up.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let geo = self.shard.geometry();
        let mut nonempty = Vec::new();
        self.shard.check(&mut |b| nonempty.push(b));
        check_queue(geo, self.queue.iter(), &nonempty, |i| self.markers[i]);
    }
}

/// Queues `b` if its marker changes (Kafka: `if (bucket.setExpiration(..)) queue.offer(bucket)`).
#[inline(always)]
fn queue_bucket(size: usize, markers: &mut [u64], queue: &mut ExpiryQueue, b: Bucket) {
    let m = &mut markers[b.level() * size + b.slot()];
    if *m != b.expiration() {
        debug_assert_eq!(*m, NOT_QUEUED, "queued bucket {b:?} changed expiration");
        *m = b.expiration();
        queue.push(b);
    }
}

/// Checks the queue against the markers and the non-empty buckets found by a shard walk.
pub(crate) fn check_queue(
    geo: &Geometry,
    queued: impl Iterator<Item = Bucket>,
    nonempty: &[Bucket],
    marker: impl Fn(usize) -> u64,
) {
    let mut seen = std::collections::HashSet::new();
    for b in queued {
        assert!(
            seen.insert((b.level(), b.slot())),
            "bucket {b:?} queued twice"
        );
        assert_eq!(
            marker(geo.marker_index(b.level(), b.slot())),
            b.expiration(),
            "queued bucket {b:?} has a different marker"
        );
    }
    assert!(seen.len() <= geo.max_levels() * geo.size as usize);
    for b in nonempty {
        assert!(
            seen.contains(&(b.level(), b.slot())),
            "non-empty bucket {b:?} is not queued"
        );
        assert_eq!(
            marker(geo.marker_index(b.level(), b.slot())),
            b.expiration(),
            "non-empty bucket {b:?} queued under another expiration"
        );
    }
    for level in 0..geo.max_levels() {
        for slot in 0..geo.size as usize {
            let m = marker(geo.marker_index(level, slot));
            assert!(
                m == NOT_QUEUED || seen.contains(&(level, slot)),
                "bucket ({level},{slot}) marked {m} but not queued"
            );
        }
    }
}

impl<T> fmt::Debug for TimingWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimingWheel")
            .field("tick", &self.tick())
            .field("wheel_size", &self.wheel_size())
            .field("current_time", &self.current_time())
            .field("len", &self.len())
            .field("levels", &self.levels())
            .field("queued_buckets", &self.queued_buckets())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consistent wheel (checked) with entries in a level-0 bucket (expiration 5) and a level-1
    /// bucket (slot 1, expiration 20); tick 1, size 20.
    fn wheel() -> TimingWheel<()> {
        let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
        wheel.add(5, ()).unwrap();
        wheel.add(30, ()).unwrap();
        wheel.check_invariants();
        wheel
    }

    /// The marker index of the queued bucket due at `expiration`.
    fn marker_of(wheel: &TimingWheel<()>, expiration: u64) -> usize {
        let b = wheel
            .queue
            .iter()
            .find(|b| b.expiration() == expiration)
            .unwrap();
        wheel.shard.geometry().marker_index(b.level(), b.slot())
    }

    // The tests below break one invariant each behind the wheel's back: `check_invariants` must
    // notice. If it (or `check_queue`) checked nothing, every test that leans on it as its
    // oracle would pass whatever the wheel did.

    /// A bucket pushed onto the expiry queue a second time is reported.
    #[test]
    #[should_panic(expected = "queued twice")]
    fn check_invariants_reports_a_bucket_queued_twice() {
        let mut wheel = wheel();
        let b = wheel.queue.peek().unwrap();
        wheel.queue.push(b);
        wheel.check_invariants();
    }

    /// A queued bucket whose marker says another expiration is reported.
    #[test]
    #[should_panic(expected = "has a different marker")]
    fn check_invariants_reports_a_queued_bucket_with_another_marker() {
        let mut wheel = wheel();
        let i = marker_of(&wheel, 20);
        wheel.markers[i] = 40;
        wheel.check_invariants();
    }

    /// A non-empty bucket missing from the queue (its marker still set) is reported: its entries
    /// would never fire.
    #[test]
    #[should_panic(expected = "is not queued")]
    fn check_invariants_reports_a_non_empty_bucket_not_queued() {
        let mut wheel = wheel();
        assert_eq!(wheel.queue.pop_due(5).map(|b| b.expiration()), Some(5));
        wheel.check_invariants();
    }

    /// A non-empty bucket queued (and marked) under another incarnation's expiration is
    /// reported: it would be flushed at the wrong time.
    #[test]
    #[should_panic(expected = "queued under another expiration")]
    fn check_invariants_reports_a_bucket_queued_under_another_expiration() {
        let mut wheel = wheel();
        let i = marker_of(&wheel, 5);
        assert_eq!(wheel.queue.pop_due(5).map(|b| b.expiration()), Some(5));
        // The same slot's next incarnation: level 0, slot 5, expiration 25.
        let later = wheel.shard.geometry().place_at(0, 25);
        wheel.queue.push(later);
        wheel.markers[i] = 25;
        wheel.check_invariants();
    }

    /// A marker left set for a bucket that is not in the queue is reported: the next add to that
    /// bucket would not queue it.
    #[test]
    #[should_panic(expected = "marked 7 but not queued")]
    fn check_invariants_reports_a_stray_marker() {
        let mut wheel = wheel();
        let i = wheel.shard.geometry().marker_index(0, 7);
        wheel.markers[i] = 7;
        wheel.check_invariants();
    }
}
