//! Bucket identities, the level geometry (all placement arithmetic) and the expiry queue.
//!
//! This is the only module that turns deadlines into levels and slots, so the rounding rules live
//! in one place:
//!
//! * a deadline `d` is first rounded **up** to the tick, `e = ⌈d / tick⌉ · tick`, so an entry
//!   never becomes due before its deadline, whatever the tick (with Kafka's 1 ms tick and whole
//!   ms deadlines this is the identity, and the rules below are exactly Kafka's);
//! * `e` is already expired when `e < current + tick`, i.e. `e <= current`;
//! * otherwise it goes to the lowest level `k` with `e < current_k + span_k`, where
//!   `current_k = ⌊current / tick_k⌋ · tick_k`, in slot `⌊e / tick_k⌋ mod n` (the absolute
//!   virtual id), and that bucket's expiration is the slot's start `⌊e / tick_k⌋ · tick_k`;
//! * the top level is the first whose span `tick_k · n` does not fit in a `u64`: its window is
//!   unbounded, so every deadline has a level and nothing overflows;
//! * a deadline past the last representable tick (`max_expiration`, the last multiple of the
//!   tick below `u64::MAX`) means **never**: it is kept (cancellable, handed back by a close) but
//!   never queued and never handed out, so it can never fire early by being rounded down.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::ConfigError;

/// The largest wheel size (buckets per level) accepted.
pub const MAX_WHEEL_SIZE: usize = 1 << 16;

/// One incarnation of a bucket: a level, a slot in it, and the expiration (start of the slot's
/// time range) the bucket has while it is queued. Ordered by expiration first.
///
/// Kafka's `TimerTaskList` is both the list and its `Delayed` expiration; here the list lives in
/// the wheel and a `Bucket` is the value the expiry queue holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    expiration: u64,
    level: u8,
    slot: u16,
}

impl Bucket {
    /// When this bucket is due: the start of its slot's time range.
    pub fn expiration(&self) -> u64 {
        self.expiration
    }

    /// The level (0 is the finest).
    pub fn level(&self) -> usize {
        self.level as usize
    }

    /// The slot in the level, `⌊expiration / tick_level⌋ mod wheel_size`.
    pub fn slot(&self) -> usize {
        self.slot as usize
    }
}

/// Division by a fixed `u64` divisor with one multiply and two shifts (Granlund & Montgomery,
/// "Division by invariant integers using multiplication", 1994, fig. 4.1): exact for every
/// dividend. Placement divides by the tick and by each level's width on every add; a hardware
/// 64-bit division there costs more than the rest of the add.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Divider {
    m: u64,
    s1: u32,
    s2: u32,
}

impl Divider {
    pub(crate) fn new(d: u64) -> Self {
        assert!(d > 0, "division by zero");
        // l = ceil(log2 d); m = floor(2^64 (2^l - d) / d) + 1, which fits in 64 bits because
        // 2^(l-1) < d. The product fits in u128: (2^l - d) < 2^63 whenever l = 64.
        let l = 64 - (d - 1).leading_zeros();
        let m = ((1u128 << 64) * ((1u128 << l) - u128::from(d)) / u128::from(d) + 1) as u64;
        Divider {
            m,
            s1: l.min(1),
            s2: l.saturating_sub(1),
        }
    }

    /// `x / d`.
    #[inline(always)]
    pub(crate) fn div(&self, x: u64) -> u64 {
        let t = ((u128::from(x) * u128::from(self.m)) >> 64) as u64;
        (t + ((x - t) >> self.s1)) >> self.s2
    }
}

/// Tick, size, and the precomputed tick and span of every level a wheel can ever have.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub(crate) tick: u64,
    pub(crate) size: u32,
    /// `tick · size^k` for every level.
    pub(crate) ticks: Box<[u64]>,
    /// Dividers by each level's tick (`dividers[0]` divides by the tick).
    pub(crate) dividers: Box<[Divider]>,
    /// `tick_k · size`, or `u64::MAX` (unbounded) for the top level.
    pub(crate) spans: Box<[u64]>,
    /// The largest expiration an entry can have: the last multiple of the tick below `u64::MAX`.
    pub(crate) max_expiration: u64,
}

impl Geometry {
    pub(crate) fn new(tick: u64, wheel_size: usize) -> Result<Self, ConfigError> {
        if tick == 0 {
            return Err(ConfigError::ZeroTick);
        }
        if wheel_size < 2 {
            return Err(ConfigError::WheelSizeTooSmall(wheel_size));
        }
        if wheel_size > MAX_WHEEL_SIZE {
            return Err(ConfigError::WheelSizeTooLarge(wheel_size));
        }
        let size = wheel_size as u64;
        if tick.checked_mul(size).is_none() {
            return Err(ConfigError::SpanOverflow { tick, wheel_size });
        }
        let mut ticks = Vec::new();
        let mut spans = Vec::new();
        let mut t = tick;
        loop {
            ticks.push(t);
            match t.checked_mul(size) {
                Some(span) if span < u64::MAX => {
                    spans.push(span);
                    t = span;
                }
                _ => {
                    spans.push(u64::MAX);
                    break;
                }
            }
        }
        Ok(Geometry {
            tick,
            size: wheel_size as u32,
            dividers: ticks.iter().map(|&t| Divider::new(t)).collect(),
            ticks: ticks.into_boxed_slice(),
            spans: spans.into_boxed_slice(),
            max_expiration: (u64::MAX - 1) - (u64::MAX - 1) % tick,
        })
    }

    /// Number of levels the wheel can grow to.
    pub(crate) fn max_levels(&self) -> usize {
        self.ticks.len()
    }

    #[inline]
    pub(crate) fn round_down(&self, t: u64) -> u64 {
        t - t % self.tick
    }

    /// `⌈d / tick⌉ · tick`, saturating at the largest representable expiration.
    #[inline(always)]
    pub(crate) fn round_up(&self, d: u64) -> u64 {
        if self.tick == 1 || d >= self.max_expiration {
            return d.min(self.max_expiration);
        }
        // d < max_expiration, so the next multiple of the tick is at most max_expiration.
        let down = self.dividers[0].div(d) * self.tick;
        if down == d {
            d
        } else {
            down + self.tick
        }
    }

    /// The bucket of level `level` whose slot starts at `expiration`.
    pub(crate) fn place_at(&self, level: usize, expiration: u64) -> Bucket {
        let t = self.ticks[level];
        debug_assert_eq!(expiration % t, 0);
        Bucket {
            expiration,
            level: level as u8,
            slot: ((expiration / t) % u64::from(self.size)) as u16,
        }
    }

    /// Index of a bucket's marker in a `max_levels × size` table.
    #[inline]
    pub(crate) fn marker_index(&self, level: usize, slot: usize) -> usize {
        level * self.size as usize + slot
    }
}

/// Where each level's window stands at one `current` time: recomputed when the clock moves, so
/// that placing an entry costs at most one division (none at level 0 with a tick of 1).
#[derive(Clone, Debug)]
pub(crate) struct Windows {
    current: u64,
    /// Per level: the window's start `current_k`.
    starts: Box<[u64]>,
    /// Per level: the window's end `current_k + span_k` (saturating); strictly increasing in `k`
    /// until it saturates, so the levels whose end is `<= e` are a prefix.
    ends: Box<[u64]>,
    /// Per level: the slot of `current_k`, `(current_k / tick_k) mod n`.
    base_slots: Box<[u32]>,
}

impl Windows {
    pub(crate) fn new(geo: &Geometry, start: u64) -> Self {
        let levels = geo.max_levels();
        let mut w = Windows {
            current: 0,
            starts: vec![0; levels].into_boxed_slice(),
            ends: vec![0; levels].into_boxed_slice(),
            base_slots: vec![0; levels].into_boxed_slice(),
        };
        w.compute(geo, geo.round_down(start), false);
        w
    }

    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.current
    }

    /// Moves forward to `current` (a multiple of the tick, after the current time).
    ///
    /// Only the levels whose window moved are recomputed: each level's tick is a multiple of
    /// the one below, so once a level's window start stays where it was, every level above it
    /// stays too (time only moves forward). A 1 ms step moves level 0's window, level 1's one
    /// step in `size`, and so on: about one level per step instead of every level (15 at a
    /// tick of 1 and 20 slots, three divisions each). An advance of a
    /// [`ConcurrentWheel`](crate::ConcurrentWheel) moves every shard's windows for each bucket it
    /// flushes, so this is most of its cost with many shards.
    pub(crate) fn set(&mut self, geo: &Geometry, current: u64) {
        debug_assert!(
            current > self.current,
            "windows moved backwards or not at all"
        );
        self.compute(geo, current, true);
    }

    /// Sets `current` and recomputes the windows from level 0 up, every one, or (`moved`: every
    /// window is valid for an earlier time) up to the first whose start did not move.
    fn compute(&mut self, geo: &Geometry, current: u64, moved: bool) {
        debug_assert_eq!(current % geo.tick, 0);
        self.current = current;
        for k in 0..geo.max_levels() {
            let t = geo.ticks[k];
            let start = current - current % t;
            if moved && start == self.starts[k] {
                break;
            }
            self.starts[k] = start;
            self.ends[k] = start.saturating_add(geo.spans[k]);
            self.base_slots[k] = ((start / t) % u64::from(geo.size)) as u32;
        }
    }

    /// Where an entry with this deadline goes now. `created` is the number of levels that exist
    /// (a hint: the search is branch-free over them, and only walks further for a deadline
    /// beyond every existing level).
    #[inline(always)]
    pub(crate) fn place(&self, geo: &Geometry, created: usize, deadline: u64) -> Place {
        if deadline > geo.max_expiration {
            return Place::Never;
        }
        let e = geo.round_up(deadline);
        if e <= self.current {
            return Place::Expired;
        }
        let top = self.ends.len() - 1;
        let scan = created.min(top);
        // Branch-free: W1's random deadlines land on different levels, and a data-dependent
        // loop exit mispredicts on a good share of adds.
        let mut k = 0;
        for &end in &self.ends[..scan] {
            k += usize::from(e >= end);
        }
        if k == scan {
            while k < top && e >= self.ends[k] {
                k += 1;
            }
        }
        let t = geo.ticks[k];
        let start = self.starts[k];
        let offset = e - start;
        let q = if t == 1 {
            offset
        } else {
            geo.dividers[k].div(offset)
        };
        debug_assert!(
            q < u64::from(geo.size),
            "deadline {e} outside level {k}'s window"
        );
        let mut slot = self.base_slots[k] + q as u32;
        if slot >= geo.size {
            slot -= geo.size;
        }
        Place::In(Bucket {
            expiration: start + q * t,
            level: k as u8,
            slot: slot as u16,
        })
    }
}

/// Where an entry goes (see [`Windows::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Already due: hand it back to the caller.
    Expired,
    /// Into this bucket.
    In(Bucket),
    /// Past the last representable tick: kept, never due.
    Never,
}

/// A bucket marker value meaning "not queued".
pub(crate) const NOT_QUEUED: u64 = u64::MAX;

/// Kafka's `DelayQueue<TimerTaskList>`: a min-heap of bucket expirations. It holds buckets, not
/// entries; the wheel pushes a bucket only when the bucket's marker changes (once per
/// incarnation), so it holds at most `levels × wheel_size` buckets and never one twice.
#[derive(Debug, Default)]
pub(crate) struct ExpiryQueue {
    heap: BinaryHeap<Reverse<Bucket>>,
}

impl ExpiryQueue {
    /// Queues a bucket; true if it is now the earliest one.
    pub(crate) fn push(&mut self, b: Bucket) -> bool {
        let earliest = self.heap.peek().is_none_or(|Reverse(top)| b < *top);
        self.heap.push(Reverse(b));
        earliest
    }

    pub(crate) fn peek(&self) -> Option<Bucket> {
        self.heap.peek().map(|r| r.0)
    }

    /// Pops the earliest bucket if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Bucket> {
        match self.heap.peek() {
            Some(Reverse(b)) if b.expiration <= now => self.heap.pop().map(|r| r.0),
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.heap.iter().map(|r| r.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64 (BENCHMARKS.md) from `seed`: each call returns the next output.
    fn splitmix(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    #[test]
    fn divider_is_exact() {
        let mut next = splitmix(99);
        let mut divisors = vec![
            1,
            2,
            3,
            7,
            10,
            20,
            400,
            1_000_000,
            20_000_000,
            u64::MAX,
            u64::MAX - 1,
        ];
        divisors.extend((1..64).map(|b| 1u64 << b));
        divisors.extend((1..64).map(|b| (1u64 << b) + 1));
        divisors.extend((1..64).map(|b| (1u64 << b) - 1));
        for _ in 0..200 {
            divisors.push(next() >> (next() % 64));
        }
        for d in divisors.into_iter().filter(|&d| d > 0) {
            let div = Divider::new(d);
            let mut xs = vec![
                0,
                1,
                d - 1,
                d,
                d.wrapping_add(1),
                u64::MAX,
                u64::MAX - 1,
                u64::MAX / 2,
            ];
            xs.extend((0..300).map(|_| next() >> (next() % 64)));
            for x in xs {
                assert_eq!(div.div(x), x / d, "{x} / {d}");
            }
        }
    }

    #[test]
    fn kafka_default_levels() {
        let g = Geometry::new(1, 20).unwrap();
        assert_eq!(&g.ticks[..5], &[1, 20, 400, 8000, 160_000]);
        assert_eq!(&g.spans[..4], &[20, 400, 8000, 160_000]);
        assert_eq!(*g.spans.last().unwrap(), u64::MAX, "top level is unbounded");
        // 20^14 < 2^64 / 20 <= 20^15: levels 0..=14.
        assert_eq!(g.max_levels(), 15);
    }

    #[test]
    fn bad_configurations_are_rejected() {
        assert_eq!(Geometry::new(0, 20).unwrap_err(), ConfigError::ZeroTick);
        assert_eq!(
            Geometry::new(1, 1).unwrap_err(),
            ConfigError::WheelSizeTooSmall(1)
        );
        assert_eq!(
            Geometry::new(1, 0).unwrap_err(),
            ConfigError::WheelSizeTooSmall(0)
        );
        assert_eq!(
            Geometry::new(1, MAX_WHEEL_SIZE + 1).unwrap_err(),
            ConfigError::WheelSizeTooLarge(MAX_WHEEL_SIZE + 1)
        );
        assert_eq!(
            Geometry::new(u64::MAX / 2, 3).unwrap_err(),
            ConfigError::SpanOverflow {
                tick: u64::MAX / 2,
                wheel_size: 3
            }
        );
        assert!(Geometry::new(u64::MAX / 3, 3).is_ok());
    }

    /// The reference rule, written the slow way: the lowest level whose window holds `e`,
    /// slot by absolute virtual id.
    fn reference_place(g: &Geometry, current: u64, deadline: u64) -> Option<(usize, usize, u64)> {
        if deadline > g.max_expiration {
            return Some((usize::MAX, usize::MAX, u64::MAX));
        }
        let e = g.round_up(deadline);
        if e <= current {
            return None;
        }
        for k in 0..g.max_levels() {
            let t = g.ticks[k];
            let start = current - current % t;
            if k == g.max_levels() - 1 || e < start.saturating_add(g.spans[k]) {
                let v = e / t;
                return Some((k, (v % u64::from(g.size)) as usize, v * t));
            }
        }
        unreachable!()
    }

    fn place(
        g: &Geometry,
        current: u64,
        deadline: u64,
        created: usize,
    ) -> Option<(usize, usize, u64)> {
        let w = Windows::new(g, current);
        match w.place(g, created, deadline) {
            Place::In(b) => Some((b.level(), b.slot(), b.expiration())),
            Place::Expired => None,
            Place::Never => Some((usize::MAX, usize::MAX, u64::MAX)),
        }
    }

    #[test]
    fn placement_follows_kafka_at_one_ms() {
        let g = Geometry::new(1, 20).unwrap();
        assert_eq!(place(&g, 0, 0, 1), None, "deadline == current is expired");
        assert_eq!(place(&g, 0, 1, 1), Some((0, 1, 1)));
        assert_eq!(place(&g, 0, 19, 1), Some((0, 19, 19)));
        assert_eq!(place(&g, 0, 28, 1), Some((1, 1, 20)));
        assert_eq!(place(&g, 0, 450, 2), Some((2, 1, 400)));
        assert_eq!(place(&g, 20, 28, 2), Some((0, 8, 28)));
        assert_eq!(place(&g, 400, 450, 3), Some((1, 2, 440)));
    }

    #[test]
    fn fast_placement_agrees_with_the_reference_rule() {
        let mut next = splitmix(7);
        for (tick, size) in [
            (1, 20),
            (1, 2),
            (3, 3),
            (10, 4),
            (1000, 20),
            (1, 64),
            (7, 65536),
        ] {
            let g = Geometry::new(tick, size).unwrap();
            for _ in 0..20_000 {
                let current = g.round_down(next() >> (next() % 64));
                let d = current.saturating_add(next() >> (next() % 64));
                let created = (next() % (g.max_levels() as u64 + 1)) as usize;
                assert_eq!(
                    place(&g, current, d, created),
                    reference_place(&g, current, d),
                    "tick {tick} size {size} current {current} deadline {d} created {created}"
                );
            }
        }
    }

    /// `round_up` saturates at `max_expiration` for a deadline past the last representable tick,
    /// whatever the tick (with a tick dividing `u64::MAX`, such as 3, plain rounding would give
    /// `u64::MAX`, the queue's `NOT_QUEUED` marker; with 10 it would overflow). Placement answers
    /// `Never` before it rounds such a deadline, so only this test holds the function to its
    /// contract: a fast path taken for a tick of 1 only would break it.
    #[test]
    fn round_up_saturates_past_the_last_tick() {
        for (tick, size) in [(1, 20), (3, 3), (10, 4), (1000, 20)] {
            let g = Geometry::new(tick, size).unwrap();
            let max = g.max_expiration;
            for d in [max, max + 1, u64::MAX - 1, u64::MAX] {
                assert_eq!(g.round_up(d), max, "tick {tick} deadline {d}");
            }
            assert_eq!(
                g.round_up(max - tick + 1),
                max,
                "tick {tick}: up to the last tick"
            );
        }
    }

    #[test]
    fn coarse_ticks_round_deadlines_up() {
        let g = Geometry::new(10, 4).unwrap();
        // 21 rounds up to 30: due at 30, never at 20.
        assert_eq!(place(&g, 20, 21, 1).map(|p| (p.0, p.2)), Some((0, 30)));
        assert_eq!(place(&g, 20, 20, 1), None);
        assert_eq!(place(&g, 20, 11, 1), None);
    }

    #[test]
    fn huge_deadlines_saturate_in_the_top_level() {
        for (tick, size) in [
            (1, 2),
            (1, 20),
            (7, 3),
            (1_000_000, 20),
            (1, MAX_WHEEL_SIZE),
        ] {
            let g = Geometry::new(tick, size).unwrap();
            assert_eq!(
                place(&g, 0, u64::MAX, 1),
                Some((usize::MAX, usize::MAX, u64::MAX)),
                "never"
            );
            let (level, _, expiration) = place(&g, 0, g.max_expiration, 1).unwrap();
            assert_eq!(level, g.max_levels() - 1, "tick {tick} size {size}");
            assert_eq!(expiration % g.ticks[level], 0);
            assert!(expiration <= g.max_expiration && expiration < NOT_QUEUED);
            // Near the end of time the windows still do not overflow.
            let late = g.round_down(u64::MAX - 5);
            assert!(place(&g, late, u64::MAX, 3).is_none_or(|p| p.2 > late));
        }
    }

    /// Windows moved forward step by step (recomputing only the levels whose window moved) equal
    /// windows computed afresh at each time: small steps, steps across level boundaries, huge
    /// jumps and the end of time, for ticks and sizes whose tick products do and do not reach
    /// `u64::MAX` exactly.
    #[test]
    fn windows_moved_forward_equal_fresh_ones() {
        let mut next = splitmix(7);
        for (tick, size) in [
            (1, 20),
            (1, 2),
            (3, 7),
            (1_000_000, 20),
            (1, 256),
            (255, 16),
        ] {
            let g = Geometry::new(tick, size).unwrap();
            let mut w = Windows::new(&g, 0);
            let mut moves = 0;
            while w.current() < g.max_expiration && moves < 20_000 {
                let step = match next() % 8 {
                    0..=3 => 1,
                    4 => next() % (size as u64 * 3),
                    5 => next() % 100_000,
                    6 => next() >> (next() % 64),
                    _ => u64::MAX,
                };
                let to = g.round_down(w.current().saturating_add(step.saturating_mul(tick)));
                let to = to.min(g.max_expiration);
                if to <= w.current() {
                    continue;
                }
                w.set(&g, to);
                let fresh = Windows::new(&g, to);
                assert_eq!(
                    (&w.starts, &w.ends, &w.base_slots),
                    (&fresh.starts, &fresh.ends, &fresh.base_slots),
                    "tick {tick} size {size} at {to}"
                );
                moves += 1;
            }
        }
    }

    #[test]
    fn queue_reports_new_earliest() {
        let g = Geometry::new(1, 20).unwrap();
        let w = Windows::new(&g, 0);
        let b = |d| match w.place(&g, 1, d) {
            Place::In(b) => b,
            other => panic!("{other:?}"),
        };
        let mut q = ExpiryQueue::default();
        assert!(q.push(b(10)));
        assert!(!q.push(b(15)));
        assert!(q.push(b(5)));
        assert_eq!(q.pop_due(4), None);
        assert_eq!(q.pop_due(5).unwrap().expiration(), 5);
        assert_eq!(q.len(), 2);
    }
}
