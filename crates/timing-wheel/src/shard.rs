//! One wheel's levels, buckets and entries, as plain `&mut self` code.
//!
//! A [`Shard`] is the whole hierarchical wheel minus its expiry queue: an [`Arena`] of nodes, one
//! sentinel-headed list per bucket, the current time and the level windows derived from it. The
//! single-threaded [`TimingWheel`](crate::TimingWheel) owns one; the
//! [`ConcurrentWheel`](crate::ConcurrentWheel) keeps several, each behind its own mutex.
//!
//! # Invariants
//!
//! * `current` is a multiple of the tick and only grows.
//! * Every `PENDING` node is linked into exactly one bucket list, except while a flush holds it
//!   in transit (and a flush relinks or releases every node it detached before returning).
//! * A node in bucket `(k, s)` of expiration `X` has a rounded deadline `e` with
//!   `X <= e < X + tick_k`, and `X > current` (a bucket is flushed once `current` reaches `X`).
//! * Bucket queueing (the markers) is the owner's job: [`Shard::add`] and [`Shard::flush`]
//!   report every placement, and the owner queues a bucket whose marker changes.
//! * Levels are created lazily: level `k`'s lists exist once an entry has needed level `k` (and
//!   then all levels below it exist too, as with Kafka's chain of overflow wheels).

use crate::bucket::{Bucket, Geometry, Place, Windows};
use crate::list::{Arena, EntryKey, KeyState, NIL};
use crate::AddError;

/// An entry taken out of the wheel because its deadline was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired<T> {
    /// The key it was scheduled under. In a [`TimingWheel`](crate::TimingWheel) it named this
    /// entry only, and now matches nothing. A [`ConcurrentWheel`](crate::ConcurrentWheel)'s
    /// keys are unique within a shard only (entries on two shards can have equal keys), and a
    /// `Fired` does not say its shard: there the key does not identify the entry, so tell fired
    /// entries apart by their values.
    pub key: EntryKey,
    /// The deadline it was scheduled for.
    pub deadline: u64,
    /// The value.
    pub value: T,
}

pub(crate) struct Shard<T> {
    arena: Arena<T>,
    geo: Geometry,
    /// The clock and each level's window at it.
    windows: Windows,
    /// First sentinel of each created level; bucket `(k, s)` is headed by `heads[k] + s`.
    heads: Vec<u32>,
    /// Sentinel of the list of entries that are never due (deadline past the last tick).
    never: u32,
    closed: bool,
    counts: WheelCounts,
    /// Scratch for `flush`: the back half of a detached chain, in reverse (kept for its
    /// capacity).
    back_half: Vec<u32>,
}

/// Running totals of what happened to a wheel's entries. Every entry added ends exactly one way,
/// so `added == len + fired + cancelled + handed_back`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WheelCounts {
    /// Entries scheduled.
    pub added: u64,
    /// Entries taken out by an advance because their deadline was reached.
    pub fired: u64,
    /// Entries cancelled.
    pub cancelled: u64,
    /// Entries handed back by a close.
    pub handed_back: u64,
}

impl std::ops::AddAssign for WheelCounts {
    fn add_assign(&mut self, o: Self) {
        self.added += o.added;
        self.fired += o.fired;
        self.cancelled += o.cancelled;
        self.handed_back += o.handed_back;
    }
}

// ===== impl Shard =====

impl<T> Shard<T> {
    pub(crate) fn new(geo: Geometry, start: u64) -> Self {
        let mut arena = Arena::new();
        let never = arena.alloc_sentinels(1);
        Shard {
            arena,
            never,
            windows: Windows::new(&geo, start),
            geo,
            heads: Vec::new(),
            closed: false,
            counts: WheelCounts::default(),
            back_half: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.windows.current()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.arena.pending()
    }

    pub(crate) fn levels(&self) -> usize {
        self.heads.len()
    }

    pub(crate) fn counts(&self) -> WheelCounts {
        self.counts
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub(crate) fn reserved_bytes(&self) -> usize {
        self.arena.reserved_bytes()
    }

    /// Moves the clock to `time` rounded down to the tick, if that is later (Kafka's
    /// `advanceClock`: earlier times are ignored).
    pub(crate) fn advance_clock(&mut self, time: u64) {
        let t = self.geo.round_down(time);
        if t > self.windows.current() {
            self.windows.set(&self.geo, t);
        }
    }

    /// Sentinel of bucket `(level, slot)`, creating the level (and any below it) on first use.
    #[inline(always)]
    fn head(&mut self, b: Bucket) -> u32 {
        let level = b.level();
        while self.heads.len() <= level {
            let base = self.arena.alloc_sentinels(self.geo.size);
            self.heads.push(base);
        }
        self.heads[level] + b.slot() as u32
    }

    /// Schedules `value` at `deadline`. On success returns its key and the bucket it went to
    /// (the owner queues that bucket if its marker changes), or `None` for a deadline that is
    /// never due.
    #[inline(always)]
    pub(crate) fn add(
        &mut self,
        deadline: u64,
        value: T,
    ) -> Result<(EntryKey, Option<Bucket>), AddError<T>> {
        if self.closed {
            return Err(AddError::Closed(value));
        }
        let (head, bucket) = match self.windows.place(&self.geo, self.heads.len(), deadline) {
            Place::In(b) => (self.head(b), Some(b)),
            Place::Expired => return Err(AddError::Expired(value)),
            Place::Never => (self.never, None),
        };
        let key = self.arena.alloc(deadline, value);
        self.arena.link_back(head, key.index);
        self.counts.added += 1;
        Ok((key, bucket))
    }

    /// Unlinks the entry and hands its value back: `None` if the key no longer names a
    /// scheduled entry (fired, cancelled, handed back). A key from another wheel is not
    /// recognised as such: it may name an entry of this one.
    #[inline(always)]
    pub(crate) fn cancel(&mut self, key: EntryKey) -> Option<T> {
        if !self.arena.is_pending(key) {
            return None;
        }
        self.arena.unlink(key.index);
        self.counts.cancelled += 1;
        Some(self.arena.release(key.index))
    }

    pub(crate) fn key_state(&self, key: EntryKey) -> KeyState {
        self.arena.key_state(key)
    }

    pub(crate) fn deadline(&self, key: EntryKey) -> Option<u64> {
        self.arena
            .is_pending(key)
            .then(|| self.arena.deadline(key.index))
    }

    /// Kafka's `bucket.flush(reinsert)`: empties bucket `b` (if this shard has it) and re-places
    /// every entry against the current time. Entries now due are released and handed to
    /// `expired`; the rest cascade to finer buckets, each placement reported to `placed`.
    /// Returns the number of entries handed to `expired`.
    ///
    /// The caller advances the clock to `b`'s expiration first, so nothing in `b` can land in
    /// `b` again (a level-`k` entry re-places at a level below `k`).
    pub(crate) fn flush(
        &mut self,
        b: Bucket,
        expired: &mut impl FnMut(Fired<T>),
        placed: &mut impl FnMut(Bucket),
    ) -> usize {
        let Some(&base) = self.heads.get(b.level()) else {
            return 0;
        };
        debug_assert!(
            self.current() >= b.expiration(),
            "flush of bucket {b:?} before its time (current {})",
            self.current()
        );
        let Some((mut front, mut back)) = self.arena.detach_ends(base + b.slot() as u32) else {
            return 0;
        };
        // The chain is walked from both ends at once: its nodes are scattered over the arena,
        // and two independent pointer chases keep two cache misses in flight instead of one.
        // The front half is re-placed as it is reached; the back half is only collected (its
        // nodes are then in cache) and re-placed afterwards in chain order, so entries leave a
        // bucket in the order they entered it (FIFO within a tick, as Kafka's bucket lists).
        let mut back_half = std::mem::take(&mut self.back_half);
        let mut fired = 0;
        loop {
            if front == back {
                fired += self.replace(front, b, expired, placed);
                break;
            }
            let (next, prev) = (self.arena.next(front), self.arena.prev(back));
            fired += self.replace(front, b, expired, placed);
            back_half.push(back);
            if next == back {
                break;
            }
            front = next;
            back = prev;
        }
        while let Some(i) = back_half.pop() {
            fired += self.replace(i, b, expired, placed);
        }
        self.back_half = back_half;
        self.counts.fired += fired as u64;
        fired
    }

    /// Re-places node `cur`, just detached from bucket `b`: releases it to `expired` if due
    /// (returns 1), else links it into the finer bucket it now belongs to.
    #[inline(always)]
    fn replace(
        &mut self,
        cur: u32,
        b: Bucket,
        expired: &mut impl FnMut(Fired<T>),
        placed: &mut impl FnMut(Bucket),
    ) -> usize {
        let deadline = self.arena.deadline(cur);
        match self.windows.place(&self.geo, self.heads.len(), deadline) {
            Place::Expired => {
                // The key's stamp is read before the release bumps the generation.
                let key = self.key_of(cur);
                let value = self.arena.release(cur);
                expired(Fired {
                    key,
                    deadline,
                    value,
                });
                1
            }
            Place::In(nb) => {
                debug_assert!(nb.level() < b.level(), "entry of {b:?} re-placed at {nb:?}");
                let head = self.head(nb);
                self.arena.link_back(head, cur);
                placed(nb);
                0
            }
            Place::Never => {
                unreachable!("bucketed entry (deadline {deadline}) became never-due")
            }
        }
    }

    /// The bucket the entry is linked into (a walk over every list: tests and debugging only).
    pub(crate) fn locate(&self, key: EntryKey) -> Option<Bucket> {
        if !self.arena.is_pending(key) {
            return None;
        }
        for (level, &base) in self.heads.iter().enumerate() {
            for slot in 0..self.geo.size {
                if self.arena.list_contains(base + slot, key.index) {
                    let t = self.geo.ticks[level];
                    let x = self.geo.round_up(self.arena.deadline(key.index)) / t * t;
                    return Some(self.geo.place_at(level, x));
                }
            }
        }
        None
    }

    fn key_of(&self, index: u32) -> EntryKey {
        EntryKey {
            index,
            stamp: self.arena.stamp(index),
        }
    }

    /// Closes the shard (later adds fail with [`AddError::Closed`], cancels return `None`) and
    /// hands every pending entry to `f`. Their keys then report "handed back".
    pub(crate) fn close(&mut self, f: &mut impl FnMut(EntryKey, u64, T)) {
        self.closed = true;
        let lists = self
            .heads
            .iter()
            .flat_map(|&base| (0..self.geo.size).map(move |slot| base + slot))
            .chain(std::iter::once(self.never))
            .collect::<Vec<_>>();
        for head in lists {
            let mut cur = self.arena.detach(head);
            while cur != NIL {
                let next = self.arena.next(cur);
                let key = self.key_of(cur);
                let deadline = self.arena.deadline(cur);
                self.counts.handed_back += 1;
                f(key, deadline, self.arena.hand_back(cur));
                cur = next;
            }
        }
        debug_assert_eq!(self.arena.pending(), 0);
    }

    /// Checks every list and the accounting; calls `bucket` with each non-empty bucket and its
    /// expiration. Panics on a violation.
    pub(crate) fn check(&self, bucket: &mut impl FnMut(Bucket)) {
        self.arena.check_accounting();
        let current = self.current();
        assert_eq!(current % self.geo.tick, 0, "current time off the tick");
        let never = self.arena.check_list(self.never);
        for &d in &never {
            assert!(
                d > self.geo.max_expiration,
                "deadline {d} on the never-due list"
            );
        }
        let mut linked = never.len();
        for (level, &base) in self.heads.iter().enumerate() {
            let t = self.geo.ticks[level];
            for slot in 0..self.geo.size {
                let deadlines = self.arena.check_list(base + slot);
                let Some(&first) = deadlines.first() else {
                    continue;
                };
                linked += deadlines.len();
                let x = self.geo.round_up(first) / t * t;
                assert!(
                    x > current,
                    "bucket ({level},{slot}) at {x} overdue at {current}"
                );
                for d in deadlines {
                    let e = self.geo.round_up(d);
                    assert!(
                        x <= e && e - x < t,
                        "deadline {d} misplaced in bucket ({level},{slot}) of expiration {x}"
                    );
                    assert_eq!((e / t) % u64::from(self.geo.size), u64::from(slot));
                }
                bucket(self.geo.place_at(level, x));
            }
        }
        assert_eq!(
            linked,
            self.arena.pending(),
            "entries not linked into any bucket"
        );
        let c = self.counts;
        assert_eq!(
            c.added,
            self.len() as u64 + c.fired + c.cancelled + c.handed_back,
            "entry counts do not reconcile: {c:?}"
        );
    }
}

impl<T> std::fmt::Debug for Shard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("current", &self.current())
            .field("len", &self.len())
            .field("levels", &self.levels())
            .field("closed", &self.closed)
            .finish()
    }
}
