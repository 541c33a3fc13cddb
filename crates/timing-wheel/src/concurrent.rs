//! The concurrent wheel: adds and cancels from any thread through `&self`, advancing by one party
//! holding every lock.
//!
//! # Ground rules
//!
//! * The wheel is split into shards. A shard is a whole wheel core ([`Shard`]: arena, bucket
//!   lists, clock) behind **its own mutex**; a thread adds to the shard its thread number picks,
//!   so threads adding at once touch disjoint memory and locks. Every bucket list, link and
//!   payload of a shard is read and written only under that shard's mutex.
//! * The shard mutexes together are the wheel's reader–writer lock, sharded: an add or a cancel
//!   takes one shard's mutex (the "read side", split so that two adders on two threads share no
//!   cache line), and [`ConcurrentWheel::lock`] takes all of them in index order (the "write
//!   side") to advance the clock and flush. Kafka's `SystemTimer` uses one
//!   `ReentrantReadWriteLock` for the same exclusion; a single lock word would make every add on
//!   every thread write the same cache line.
//! * Bucket markers (`markers[level][slot]`: the expiration a bucket is queued under, or
//!   `NOT_QUEUED`) are atomics shared by all shards, because one bucket position `(level, slot)`
//!   stands for the same time range in every shard (all shards share one clock). An adder sets a
//!   marker with a swap; exactly one adder wins each change and pushes the bucket into the
//!   expiry queue, **while still holding its shard mutex**, so a holder of the write side never
//!   sees a set marker whose bucket is not yet queued. Only the write side resets a marker, when
//!   it pops the bucket.
//! * Lock order: shard mutexes in index order, then the queue mutex. Adders take one shard then
//!   (rarely) the queue; the write side takes all shards then the queue.
//! * No user code runs under any of these locks: values leave the wheel by return value
//!   (cancel) or through the caller's `expired` callback (advance); the caller drops or runs them
//!   after releasing the guard.
//!
//! # State of an entry
//!
//! `PENDING → FIRED` (taken out by [`WheelGuard::advance`]), `PENDING → CANCELLED`
//! ([`EntryHandle::cancel`], or [`ConcurrentWheel::cancel`] with a [`WheelKey`]),
//! `PENDING → HANDED_BACK` ([`WheelGuard::close`], or dropping the wheel while a handle keeps the
//! entry's shard alive: the value is then dropped). Each transition
//! happens under the entry's shard mutex and moves the value out exactly once, so exactly one of
//! them happens to each entry.

use std::fmt;

use crate::bucket::{Bucket, ExpiryQueue, Geometry, NOT_QUEUED};
use crate::list::{EntryKey, KeyState};
use crate::shard::{Fired, Shard, WheelCounts};
use crate::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread_hint, Arc, Mutex, MutexGuard};
use crate::unwind::Deferred;
use crate::{AddError, ConfigError};

/// The largest number of shards a [`ConcurrentWheel`] accepts.
pub const MAX_SHARDS: usize = 256;

/// One shard, padded to its own cache lines.
#[repr(align(128))]
struct ShardCell<T> {
    shard: Mutex<Shard<T>>,
    /// Mirror of `shard.len()`, stored under the mutex, read without it.
    len: AtomicUsize,
}

/// A hierarchical timing wheel shared by threads: [`add`](Self::add) and
/// [`EntryHandle::cancel`] work through shared references from any thread, each taking one
/// shard's lock; [`lock`](Self::lock) gives one party exclusive access to advance it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use timing_wheel::ConcurrentWheel;
///
/// let wheel = Arc::new(ConcurrentWheel::new(1, 20, 0)?);
/// let handles: Vec<_> = (0..4u64)
///     .map(|t| {
///         let wheel = Arc::clone(&wheel);
///         std::thread::spawn(move || {
///             (0..100).map(|i| wheel.add(1 + i + t, (t, i)).unwrap().handle).collect::<Vec<_>>()
///         })
///     })
///     .collect();
/// let handles: Vec<_> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
/// assert_eq!(wheel.len(), 400);
/// assert!(handles[0].cancel().is_some());
///
/// let mut fired = 0;
/// wheel.lock().advance(1_000, |_| fired += 1);
/// assert_eq!(fired, 399);
/// # Ok::<(), timing_wheel::ConfigError>(())
/// ```
pub struct ConcurrentWheel<T> {
    shards: Box<[Arc<ShardCell<T>>]>,
    /// Per bucket position: the expiration it is queued under, or `NOT_QUEUED`.
    markers: Box<[AtomicU64]>,
    queue: Mutex<ExpiryQueue>,
    geo: Geometry,
}

/// The handle of one scheduled entry of a [`ConcurrentWheel`]: cancel it or ask about it from
/// any thread. Dropping the handle does not cancel the entry.
///
/// The entry ends exactly one way, and the handle tells which: [`is_cancelled`] (a
/// [`cancel`](Self::cancel) through this handle won), [`is_fired`] (an advance took it out) or
/// [`is_handed_back`] (a close, or dropping the wheel, took it out). All three are false while it
/// is pending. One misuse defeats this: a [`WheelKey`] from another wheel, given to this one's
/// [`ConcurrentWheel::cancel`], may name (and take out) an unrelated handle-kept entry here,
/// whose handle then reads fired (keep keys with their wheel, as [`WheelKey`] says).
///
/// [`is_cancelled`]: Self::is_cancelled
/// [`is_fired`]: Self::is_fired
/// [`is_handed_back`]: Self::is_handed_back
pub struct EntryHandle<T> {
    cell: Arc<ShardCell<T>>,
    index: u32,
    /// The key's stamp, plus [`CANCELLED_BIT`]: set, under the shard lock, by the cancel that
    /// wins. The handle is the only way to cancel the entry (a key of this wheel never names
    /// it; only another wheel's key, a misuse, may), so "gone and not cancelled by this handle"
    /// means "fired". (A key's stamp always has state `PENDING` = `0b01` in its low
    /// bits, so bit 1 is free.)
    stamp: AtomicU32,
}

/// Marks a handle whose cancel won (see [`EntryHandle`]).
const CANCELLED_BIT: u32 = 0b10;

/// The result of a successful [`ConcurrentWheel::add`] (`H` = [`EntryHandle`]) or
/// [`ConcurrentWheel::add_keyed`] (`H` = [`WheelKey`]).
#[derive(Debug)]
pub struct Added<H> {
    /// The entry's handle or key.
    pub handle: H,
    /// The bucket this add queued, if its expiration changed (Kafka's `setExpiration` returning
    /// true). `None` when the bucket was already queued under this expiration.
    pub queued: Option<Bucket>,
    /// True when the queued bucket became the earliest in the queue: whoever waits for the next
    /// expiration must wake up and look again.
    pub earliest: bool,
}

/// Names one entry of a [`ConcurrentWheel`] (its shard and its [`EntryKey`] there): the
/// allocation-free, reference-count-free alternative to an [`EntryHandle`]. `Copy`, 12 bytes.
/// Cancel with [`ConcurrentWheel::cancel`]. A key names one entry of the wheel that issued it and
/// never a later one. It does not say which wheel issued it: given to another wheel, it may name
/// an unrelated entry there, so keep keys with their wheel (`system-timer`'s `TimerKey` adds its
/// timer's id and checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WheelKey {
    shard: u32,
    key: EntryKey,
}

impl WheelKey {
    /// A key that names no entry of any wheel (cancelling it returns `None`).
    pub const NONE: WheelKey = WheelKey {
        shard: 0,
        key: EntryKey {
            index: crate::list::NIL,
            stamp: 0,
        },
    };

    /// The entry's key within its shard (what [`Fired::key`] reports when it fires). Unique
    /// within the shard only: an entry on another shard may have the same one (see
    /// [`Fired::key`]).
    pub fn entry_key(&self) -> EntryKey {
        self.key
    }
}

/// Exclusive access to a [`ConcurrentWheel`] (all shard locks and the queue lock), from
/// [`ConcurrentWheel::lock`]. Adds and cancels on other threads wait until it is dropped; on
/// the thread holding it they deadlock, as do the wheel's locking queries (see
/// [`ConcurrentWheel::lock`]).
#[must_use = "the wheel is unlocked as soon as the guard is dropped"]
pub struct WheelGuard<'a, T> {
    wheel: &'a ConcurrentWheel<T>,
    shards: Vec<MutexGuard<'a, Shard<T>>>,
    queue: MutexGuard<'a, ExpiryQueue>,
}

// ===== impl ConcurrentWheel =====

impl<T> ConcurrentWheel<T> {
    /// A wheel like [`TimingWheel::new`](crate::TimingWheel::new) with the default number of
    /// shards: twice the machine's parallelism, rounded up to a power of two, and kept between 2
    /// and [`MAX_SHARDS`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a bad tick or wheel size, as [`TimingWheel::new`](crate::TimingWheel::new).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::<u32>::new(1, 20, 0)?;
    /// assert!(wheel.shards() >= 2);
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    pub fn new(tick: u64, wheel_size: usize, start: u64) -> Result<Self, ConfigError> {
        Self::with_shards(tick, wheel_size, start, default_shards())
    }

    /// A wheel with `shards` shards (rounded up to a power of two). One shard serialises all
    /// adds on one lock; more shards let more threads add at once.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadShardCount`] unless `1 <= shards <= MAX_SHARDS`, and the errors of
    /// [`new`](Self::new).
    ///
    /// ```
    /// use timing_wheel::{ConcurrentWheel, ConfigError};
    /// assert_eq!(ConcurrentWheel::<()>::with_shards(1, 20, 0, 3)?.shards(), 4);
    /// assert_eq!(
    ///     ConcurrentWheel::<()>::with_shards(1, 20, 0, 0).unwrap_err(),
    ///     ConfigError::BadShardCount(0)
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn with_shards(
        tick: u64,
        wheel_size: usize,
        start: u64,
        shards: usize,
    ) -> Result<Self, ConfigError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(ConfigError::BadShardCount(shards));
        }
        let geo = Geometry::new(tick, wheel_size)?;
        let shards = (0..shards.next_power_of_two())
            .map(|_| {
                Arc::new(ShardCell {
                    shard: Mutex::new(Shard::new(geo.clone(), start)),
                    len: AtomicUsize::new(0),
                })
            })
            .collect();
        let markers = (0..geo.max_levels() * wheel_size)
            .map(|_| AtomicU64::new(NOT_QUEUED))
            .collect();
        Ok(ConcurrentWheel {
            shards,
            markers,
            queue: Mutex::new(ExpiryQueue::default()),
            geo,
        })
    }

    /// Schedules `value` at `deadline` on the calling thread's shard. O(1); takes that shard's
    /// lock, and the queue's lock only when a bucket is queued.
    ///
    /// # Errors
    ///
    /// [`AddError::Expired`] when the deadline (rounded up to the tick) is not after the wheel's
    /// current time; [`AddError::Closed`] after [`WheelGuard::close`]. Both hand the value back.
    /// A deadline past the last representable tick is accepted as never due, even once the
    /// wheel's time has reached it, as with [`TimingWheel::add`](crate::TimingWheel::add).
    ///
    /// ```
    /// use timing_wheel::{AddError, ConcurrentWheel};
    /// let wheel = ConcurrentWheel::new(1, 20, 50)?;
    /// let added = wheel.add(60, "x").unwrap();
    /// assert!(added.queued.is_some() && added.earliest);
    /// assert!(wheel.add(60, "y").unwrap().queued.is_none(), "same bucket, already queued");
    /// assert!(matches!(wheel.add(50, "z"), Err(AddError::Expired("z"))));
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn add(&self, deadline: u64, value: T) -> Result<Added<EntryHandle<T>>, AddError<T>> {
        self.add_on_shard(thread_hint(), deadline, value)
    }

    /// [`add`](Self::add) on shard `hint % shards()` instead of the calling thread's: for callers
    /// that manage their own thread affinity (one shard per worker, say).
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::with_shards(1, 20, 0, 2)?;
    /// wheel.add_on_shard(1, 10, ()).unwrap();
    /// assert_eq!(wheel.len(), 1);
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn add_on_shard(
        &self,
        hint: usize,
        deadline: u64,
        value: T,
    ) -> Result<Added<EntryHandle<T>>, AddError<T>> {
        let shard = hint & (self.shards.len() - 1);
        let (key, queued, earliest) = self.add_raw(shard, deadline, value)?;
        Ok(Added {
            handle: EntryHandle {
                cell: Arc::clone(&self.shards[shard]),
                index: key.index,
                stamp: AtomicU32::new(key.stamp),
            },
            queued,
            earliest,
        })
    }

    /// [`add`](Self::add), returning a [`WheelKey`] instead of a handle: no reference count is
    /// taken, so this is the cheapest way to schedule. Cancel with [`cancel`](Self::cancel).
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// let key = wheel.add_keyed(10, "lease").unwrap().handle;
    /// assert!(wheel.is_pending(key));
    /// assert_eq!(wheel.cancel(key), Some("lease"));
    /// assert_eq!(wheel.cancel(key), None);
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn add_keyed(&self, deadline: u64, value: T) -> Result<Added<WheelKey>, AddError<T>> {
        let shard = thread_hint() & (self.shards.len() - 1);
        let (key, queued, earliest) = self.add_raw(shard, deadline, value)?;
        Ok(Added {
            handle: WheelKey {
                shard: shard as u32,
                key,
            },
            queued,
            earliest,
        })
    }

    /// The add itself, on shard `shard` (an index below `shards()`).
    #[inline(always)]
    fn add_raw(
        &self,
        shard: usize,
        deadline: u64,
        value: T,
    ) -> Result<(EntryKey, Option<Bucket>, bool), AddError<T>> {
        let cell = &self.shards[shard];
        let mut guard = cell.shard.lock();
        let (key, bucket) = guard.add(deadline, value)?;
        cell.len.store(guard.len(), Ordering::Relaxed);
        let (queued, earliest) = match bucket {
            Some(b) if mark(&self.markers, self.geo.size as usize, b) => {
                // Pushed under the shard lock: see the ground rules.
                (Some(b), self.queue.lock().push(b))
            }
            _ => (None, false),
        };
        drop(guard);
        Ok((key, queued, earliest))
    }

    /// Cancels the entry `key` names: unlinks it at once (O(1), under its shard's lock) and
    /// returns its value; `None` if the entry is no longer pending (fired, cancelled, handed back)
    /// or the key is [`WheelKey::NONE`].
    #[inline(always)]
    pub fn cancel(&self, key: WheelKey) -> Option<T> {
        let cell = self.shards.get(key.shard as usize)?;
        let mut shard = cell.shard.lock();
        let value = shard.cancel(key.key);
        if value.is_some() {
            cell.len.store(shard.len(), Ordering::Relaxed);
        }
        value
    }

    /// True while the entry `key` names is scheduled.
    pub fn is_pending(&self, key: WheelKey) -> bool {
        self.shards
            .get(key.shard as usize)
            .is_some_and(|c| c.shard.lock().key_state(key.key) == KeyState::Pending)
    }

    /// True if a close of the wheel took the entry `key` names out before it fired or was
    /// cancelled.
    pub fn is_handed_back(&self, key: WheelKey) -> bool {
        self.shards
            .get(key.shard as usize)
            .is_some_and(|c| c.shard.lock().key_state(key.key) == KeyState::HandedBack)
    }

    /// The deadline of the entry `key` names, while it is pending.
    pub fn deadline(&self, key: WheelKey) -> Option<u64> {
        self.shards
            .get(key.shard as usize)
            .and_then(|c| c.shard.lock().deadline(key.key))
    }

    /// Takes every shard lock (in index order) and the queue lock: exclusive access to advance
    /// the clock, flush due buckets, or close the wheel.
    ///
    /// The locks are not reentrant. While a [`WheelGuard`] of this wheel is alive, the thread
    /// holding it (in the guard's callbacks or not) must not call this again, nor any method
    /// of the wheel or of its [`EntryHandle`]s that takes a lock: adds, cancels, and the
    /// queries [`next_expiration`](Self::next_expiration), [`counts`](Self::counts),
    /// [`queued_buckets`](Self::queued_buckets), [`is_pending`](Self::is_pending),
    /// [`is_handed_back`](Self::is_handed_back), [`deadline`](Self::deadline) and the
    /// handles' `is_*` and `deadline`. Each deadlocks; ask the guard instead
    /// ([`WheelGuard::next_expiration`], [`WheelGuard::counts`], ...). Only
    /// [`len`](Self::len), [`is_empty`](Self::is_empty), [`shards`](Self::shards),
    /// [`tick`](Self::tick) and [`wheel_size`](Self::wheel_size) take no lock.
    pub fn lock(&self) -> WheelGuard<'_, T> {
        let shards = self.shards.iter().map(|c| c.shard.lock()).collect();
        let queue = self.queue.lock();
        WheelGuard {
            wheel: self,
            shards,
            queue,
        }
    }

    /// The expiration of the earliest queued bucket (see
    /// [`TimingWheel::next_expiration`](crate::TimingWheel::next_expiration)). Takes the queue
    /// lock only.
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// wheel.add(450, ()).unwrap();
    /// assert_eq!(wheel.next_expiration(), Some(400));
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    pub fn next_expiration(&self) -> Option<u64> {
        self.queue.lock().peek().map(|b| b.expiration())
    }

    /// Number of pending entries: the sum of the shards' exact counts (each read without a lock,
    /// so a sum taken while other threads add or cancel is a moment's snapshot per shard).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// let h = wheel.add(5, ()).unwrap().handle;
    /// assert_eq!(wheel.len(), 1);
    /// h.cancel();
    /// assert_eq!(wheel.len(), 0);
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[doc(alias = "size")]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|c| c.len.load(Ordering::Relaxed))
            .sum()
    }

    /// True when no entry is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What happened to the wheel's entries so far, summed over the shards (each shard's lock is
    /// taken in turn, briefly; not a consistent cut across shards while others add).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// let h = wheel.add(5, ()).unwrap().handle;
    /// wheel.add(6, ()).unwrap();
    /// h.cancel();
    /// wheel.lock().advance(10, |_| {});
    /// let c = wheel.counts();
    /// assert_eq!((c.added, c.cancelled, c.fired, c.handed_back), (2, 1, 1, 0));
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    pub fn counts(&self) -> WheelCounts {
        let mut total = WheelCounts::default();
        for cell in self.shards.iter() {
            total += cell.shard.lock().counts();
        }
        total
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Width of a level-0 bucket.
    pub fn tick(&self) -> u64 {
        self.geo.tick
    }

    /// Buckets per level.
    pub fn wheel_size(&self) -> usize {
        self.geo.size as usize
    }

    /// Buckets in the expiry queue (takes the queue lock).
    pub fn queued_buckets(&self) -> usize {
        self.queue.lock().len()
    }
}

/// Sets bucket `b`'s marker to its expiration; true if this call changed it (and so must queue
/// the bucket). Runs under the caller's shard lock or the write side.
#[inline]
fn mark(markers: &[AtomicU64], size: usize, b: Bucket) -> bool {
    let m = &markers[b.level() * size + b.slot()];
    // Read first: the common case (bucket already queued) then leaves the shared line shared.
    if m.load(Ordering::Relaxed) == b.expiration() {
        return false;
    }
    let prev = m.swap(b.expiration(), Ordering::AcqRel);
    debug_assert!(
        prev == NOT_QUEUED || prev == b.expiration(),
        "queued bucket {b:?} changed expiration (was {prev})"
    );
    prev != b.expiration()
}

fn default_shards() -> usize {
    if cfg!(loom) {
        return 1;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cpus).next_power_of_two().clamp(2, MAX_SHARDS)
}

// ===== impl WheelGuard =====

impl<T> WheelGuard<'_, T> {
    /// The wheel's time.
    pub fn current_time(&self) -> u64 {
        self.shards[0].current()
    }

    /// The expiration of the earliest queued bucket.
    pub fn next_expiration(&self) -> Option<u64> {
        self.queue.peek().map(|b| b.expiration())
    }

    /// Moves time forward to `now`, flushing every due bucket in expiration order in every shard
    /// and cascading entries down; each entry whose deadline has been reached is handed to
    /// `expired` (under the locks: collect, do not run user code there). Returns how many.
    ///
    /// # Panics
    ///
    /// If `expired` panics, the advance still completes (every other due entry is handed to
    /// it, each call's panic caught) and leaves the wheel consistent, then raises the first
    /// panic again. The entry whose call panicked is gone (its value was moved into `expired`).
    pub fn advance(&mut self, now: u64, mut expired: impl FnMut(Fired<T>)) -> usize {
        let WheelGuard {
            wheel,
            shards,
            queue,
        } = self;
        let size = wheel.geo.size as usize;
        let mut fired = 0;
        let mut panicked = Deferred::default();
        let mut expired = |e| panicked.call(&mut expired, e);
        while let Some(b) = queue.pop_due(now) {
            let prev =
                wheel.markers[b.level() * size + b.slot()].swap(NOT_QUEUED, Ordering::AcqRel);
            debug_assert_eq!(
                prev,
                b.expiration(),
                "popped bucket {b:?} had marker {prev}"
            );
            for shard in shards.iter_mut() {
                shard.advance_clock(b.expiration());
            }
            for (shard, cell) in shards.iter_mut().zip(wheel.shards.iter()) {
                let n = shard.flush(b, &mut expired, &mut |nb| {
                    if mark(&wheel.markers, size, nb) {
                        queue.push(nb);
                    }
                });
                if n > 0 {
                    cell.len.store(shard.len(), Ordering::Relaxed);
                }
                fired += n;
            }
        }
        for shard in shards.iter_mut() {
            shard.advance_clock(now);
        }
        panicked.resume();
        fired
    }

    /// Closes the wheel: later adds fail with [`AddError::Closed`], cancels return `None`, and
    /// every pending entry is handed to `f` (its handle then reports
    /// [`is_handed_back`](EntryHandle::is_handed_back)). Returns how many.
    ///
    /// # Panics
    ///
    /// If `f` panics, the close still hands every other entry to it (each call's panic caught)
    /// and completes, then raises the first panic again.
    pub fn close(&mut self, mut f: impl FnMut(Fired<T>)) -> usize {
        let mut n = 0;
        let mut panicked = Deferred::default();
        for (shard, cell) in self.shards.iter_mut().zip(self.wheel.shards.iter()) {
            shard.close(&mut |key, deadline, value| {
                n += 1;
                let fired = Fired {
                    key,
                    deadline,
                    value,
                };
                panicked.call(&mut f, fired);
            });
            cell.len.store(0, Ordering::Relaxed);
        }
        while let Some(b) = self.queue.pop_due(u64::MAX) {
            self.wheel.markers[self.wheel.geo.marker_index(b.level(), b.slot())]
                .store(NOT_QUEUED, Ordering::Relaxed);
        }
        panicked.resume();
        n
    }

    /// True once [`close`](Self::close) has run.
    pub fn is_closed(&self) -> bool {
        self.shards[0].is_closed()
    }

    /// Pending entries (exact: computed under the locks).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    /// True when no entry is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What happened to the wheel's entries so far (exact: computed under the locks).
    pub fn counts(&self) -> WheelCounts {
        let mut total = WheelCounts::default();
        for s in &self.shards {
            total += s.counts();
        }
        total
    }

    /// Levels created so far (the most any shard has).
    pub fn levels(&self) -> usize {
        self.shards.iter().map(|s| s.levels()).max().unwrap_or(0)
    }

    /// Buckets in the expiry queue.
    pub fn queued_buckets(&self) -> usize {
        self.queue.len()
    }

    /// Bytes reserved for entry storage in all shards.
    pub fn reserved_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.reserved_bytes()).sum()
    }

    /// Panics if an invariant is broken: every list well formed, every entry in the right
    /// bucket, every non-empty bucket (in any shard) queued exactly once under its expiration,
    /// markers and queue agreeing, the lock-free length mirrors exact, all shards on one clock.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let current = self.current_time();
        let mut nonempty = Vec::new();
        for (shard, cell) in self.shards.iter().zip(self.wheel.shards.iter()) {
            assert_eq!(shard.current(), current, "shards disagree on the time");
            assert_eq!(
                cell.len.load(Ordering::Relaxed),
                shard.len(),
                "len mirror drifted"
            );
            shard.check(&mut |b| nonempty.push(b));
        }
        crate::wheel::check_queue(&self.wheel.geo, self.queue.iter(), &nonempty, |i| {
            self.wheel.markers[i].load(Ordering::Relaxed)
        });
    }
}

// ===== impl EntryHandle =====

impl<T> EntryHandle<T> {
    /// Cancels the entry: unlinks it at once (O(1), under its shard's lock) and returns its
    /// value. `None` means the entry is no longer pending (it fired, was cancelled, or was handed
    /// back by a close): this call did not win. A handle stays usable after the wheel itself is
    /// dropped; dropping the wheel drops the values still pending, and their entries then
    /// report [`is_handed_back`](Self::is_handed_back).
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// let h = wheel.add(10, vec![0u8; 1024]).unwrap().handle;
    /// assert_eq!(h.cancel().map(|v| v.len()), Some(1024)); // the memory is released here
    /// assert_eq!(h.cancel(), None);
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    #[doc(alias = "remove")]
    #[inline(always)]
    pub fn cancel(&self) -> Option<T> {
        let mut shard = self.cell.shard.lock();
        let value = shard.cancel(self.key());
        if value.is_some() {
            self.cell.len.store(shard.len(), Ordering::Relaxed);
            // Under the shard lock, which every writer of `stamp` holds: no RMW needed.
            let stamp = self.stamp.load(Ordering::Relaxed);
            self.stamp.store(stamp | CANCELLED_BIT, Ordering::Relaxed);
        }
        value
    }

    /// True while the entry is scheduled.
    pub fn is_pending(&self) -> bool {
        self.cell.shard.lock().key_state(self.key()) == KeyState::Pending
    }

    /// True once a [`cancel`](Self::cancel) through this handle has won.
    pub fn is_cancelled(&self) -> bool {
        let _shard = self.cell.shard.lock();
        self.stamp.load(Ordering::Relaxed) & CANCELLED_BIT != 0
    }

    /// True once an advance has taken the entry out because its deadline was reached.
    ///
    /// ```
    /// let wheel = timing_wheel::ConcurrentWheel::new(1, 20, 0)?;
    /// let (a, b) = (wheel.add(5, 'a').unwrap().handle, wheel.add(5, 'b').unwrap().handle);
    /// b.cancel();
    /// wheel.lock().advance(5, |_| {});
    /// assert!(a.is_fired() && !a.is_cancelled());
    /// assert!(!b.is_fired() && b.is_cancelled());
    /// # Ok::<(), timing_wheel::ConfigError>(())
    /// ```
    pub fn is_fired(&self) -> bool {
        let shard = self.cell.shard.lock();
        shard.key_state(self.key()) == KeyState::Gone
            && self.stamp.load(Ordering::Relaxed) & CANCELLED_BIT == 0
    }

    /// True if a close of the wheel (or dropping the wheel) took the entry out before it fired
    /// or was cancelled.
    pub fn is_handed_back(&self) -> bool {
        self.cell.shard.lock().key_state(self.key()) == KeyState::HandedBack
    }

    /// The entry's deadline, while it is pending.
    pub fn deadline(&self) -> Option<u64> {
        self.cell.shard.lock().deadline(self.key())
    }

    /// The entry's key within its shard (what [`Fired::key`] reports when it fires). Unique
    /// within the shard only: an entry on another shard may have the same one (see
    /// [`Fired::key`]).
    #[inline(always)]
    pub fn key(&self) -> EntryKey {
        EntryKey {
            index: self.index,
            stamp: self.stamp.load(Ordering::Relaxed) & !CANCELLED_BIT,
        }
    }
}

impl<T> fmt::Debug for EntryHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntryHandle")
            .field("key", &self.key())
            .finish()
    }
}

impl<T> Drop for ConcurrentWheel<T> {
    /// Drops the values of the entries still pending. A shard no handle refers to goes with the
    /// wheel (its arena drops them); a shard that some [`EntryHandle`] keeps alive is closed
    /// first, so that handle does not keep every other pending value of its shard in memory
    /// (nor, when a value holds a handle of its own shard, leak the shard in a cycle). Its
    /// entries then report handed back. The values are dropped after the shard's lock is
    /// released, so a value's `Drop` may use handles of the same wheel; and after every such
    /// shard is closed, each drop on its own, so that one that panics costs no other value its
    /// drop (the first panic is raised once all are done). Before, a panicking drop in one
    /// shard left the later shards unclosed: their values leaked with a handle's cycle.
    fn drop(&mut self) {
        let mut values = Vec::new();
        for cell in self.shards.iter_mut() {
            if Arc::get_mut(cell).is_some() {
                continue;
            }
            let mut shard = cell.shard.lock();
            shard.close(&mut |_, _, value| values.push(value));
            cell.len.store(0, Ordering::Relaxed);
        }
        let mut panic = crate::unwind::Deferred::default();
        for value in values {
            panic.call(&mut drop, value);
        }
        panic.resume();
    }
}

impl<T> fmt::Debug for ConcurrentWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrentWheel")
            .field("tick", &self.geo.tick)
            .field("wheel_size", &self.geo.size)
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .finish()
    }
}

impl<T> fmt::Debug for WheelGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WheelGuard")
            .field("current_time", &self.current_time())
            .field("len", &self.len())
            .field("queued_buckets", &self.queued_buckets())
            .finish()
    }
}

// Not under loom (threads and locks outside a model). Two attributes, not `cfg(all(..))`:
// cargo-mutants recognises only a plain `#[cfg(test)]` as test code.
#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;

    /// `add_keyed` schedules on the calling thread's shard, the one `add` uses from the same
    /// thread. Checked on fresh threads until one has a hint with bit 1 set (so past a 2-shard
    /// wheel's count): there a mask other than `hint & (shards - 1)` picks the other shard or one
    /// that does not exist.
    #[test]
    fn add_keyed_uses_the_shard_add_uses_on_the_same_thread() {
        let wheel = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
        let reached = std::thread::scope(|s| {
            (0..1_000).any(|_| {
                s.spawn(|| {
                    let handle = wheel.add(10, ()).unwrap().handle;
                    let key = wheel.add_keyed(10, ()).unwrap().handle;
                    assert!(
                        Arc::ptr_eq(&handle.cell, &wheel.shards[key.shard as usize]),
                        "thread hint {}: add_keyed used shard {}, add another",
                        thread_hint(),
                        key.shard
                    );
                    thread_hint() & 2 != 0
                })
                .join()
                .unwrap()
            })
        });
        assert!(reached, "no thread got a hint with bit 1 set");
    }

    /// A consistent wheel (checked) of two shards, tick 1, size 20: shard 0 has an entry at 450
    /// (level 2, a bucket due at 400), shard 1 one at 5 (level 0, a bucket due at 5).
    fn two_shards() -> ConcurrentWheel<()> {
        let wheel = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
        wheel.add_on_shard(0, 450, ()).unwrap();
        wheel.add_on_shard(1, 5, ()).unwrap();
        wheel.lock().check_invariants();
        wheel
    }

    // The tests below break one invariant of the sharded wheel each behind its back:
    // `check_invariants` must notice. If it checked nothing, every test that leans on it as its
    // oracle would pass whatever the wheel did.

    /// A shard whose clock has moved without the others is reported.
    #[test]
    #[should_panic(expected = "shards disagree on the time")]
    fn check_invariants_reports_shards_on_different_times() {
        let wheel = two_shards();
        let mut guard = wheel.lock();
        guard.shards[1].advance_clock(3);
        guard.check_invariants();
    }

    /// A lock-free length mirror that differs from its shard's count is reported: `len()` would
    /// be wrong.
    #[test]
    #[should_panic(expected = "len mirror drifted")]
    fn check_invariants_reports_a_drifted_len_mirror() {
        let wheel = two_shards();
        wheel.shards[1].len.store(2, Ordering::Relaxed);
        wheel.lock().check_invariants();
    }

    /// A non-empty bucket of a shard other than the first missing from the shared queue is
    /// reported: every shard's buckets are checked against it.
    #[test]
    #[should_panic(expected = "is not queued")]
    fn check_invariants_reports_a_bucket_of_the_second_shard_not_queued() {
        let wheel = two_shards();
        let mut guard = wheel.lock();
        assert_eq!(guard.queue.pop_due(5).map(|b| b.expiration()), Some(5));
        guard.check_invariants();
    }

    /// A shared marker left set for a bucket that is not queued is reported: the next add to
    /// that bucket, on any shard, would not queue it.
    #[test]
    #[should_panic(expected = "marked 7 but not queued")]
    fn check_invariants_reports_a_stray_marker() {
        let wheel = two_shards();
        wheel.markers[wheel.geo.marker_index(0, 7)].store(7, Ordering::Relaxed);
        wheel.lock().check_invariants();
    }
}
