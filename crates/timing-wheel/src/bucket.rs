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
//!   unbounded, so every deadline has a level and nothing overflows.

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

/// Tick, size, and the precomputed tick and span of every level a wheel can ever have.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub(crate) tick: u64,
    pub(crate) size: u32,
    /// `tick · size^k` for every level.
    pub(crate) ticks: Box<[u64]>,
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
    #[inline]
    pub(crate) fn round_up(&self, d: u64) -> u64 {
        if self.tick == 1 {
            return d.min(self.max_expiration);
        }
        match d.checked_next_multiple_of(self.tick) {
            Some(e) => e.min(self.max_expiration),
            None => self.max_expiration,
        }
    }

    /// Fills `ends[k]` with the end of level `k`'s window at time `current`.
    pub(crate) fn windows(&self, current: u64, ends: &mut Vec<u64>) {
        ends.clear();
        for (&t, &span) in self.ticks.iter().zip(self.spans.iter()) {
            ends.push((current - current % t).saturating_add(span));
        }
    }

    /// Where an entry with this deadline goes at time `current` (whose windows are `ends`), or
    /// `None` when it is already expired.
    #[inline]
    pub(crate) fn place(&self, ends: &[u64], current: u64, deadline: u64) -> Option<Bucket> {
        let e = self.round_up(deadline);
        if e <= current {
            return None;
        }
        let top = self.ticks.len() - 1;
        let mut k = 0;
        while k < top && e >= ends[k] {
            k += 1;
        }
        let t = self.ticks[k];
        let v = e / t;
        Some(Bucket {
            expiration: v * t,
            level: k as u8,
            slot: (v % u64::from(self.size)) as u16,
        })
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
        assert_eq!(Geometry::new(1, 1).unwrap_err(), ConfigError::WheelSizeTooSmall(1));
        assert_eq!(Geometry::new(1, 0).unwrap_err(), ConfigError::WheelSizeTooSmall(0));
        assert_eq!(
            Geometry::new(1, MAX_WHEEL_SIZE + 1).unwrap_err(),
            ConfigError::WheelSizeTooLarge(MAX_WHEEL_SIZE + 1)
        );
        assert_eq!(
            Geometry::new(u64::MAX / 2, 3).unwrap_err(),
            ConfigError::SpanOverflow { tick: u64::MAX / 2, wheel_size: 3 }
        );
        assert!(Geometry::new(u64::MAX / 3, 3).is_ok());
    }

    #[test]
    fn placement_follows_kafka_at_one_ms() {
        let g = Geometry::new(1, 20).unwrap();
        let mut ends = Vec::new();
        g.windows(0, &mut ends);
        assert_eq!(g.place(&ends, 0, 0), None, "deadline == current is expired");
        let b = g.place(&ends, 0, 1).unwrap();
        assert_eq!((b.level(), b.slot(), b.expiration()), (0, 1, 1));
        let b = g.place(&ends, 0, 19).unwrap();
        assert_eq!((b.level(), b.slot(), b.expiration()), (0, 19, 19));
        let b = g.place(&ends, 0, 28).unwrap();
        assert_eq!((b.level(), b.slot(), b.expiration()), (1, 1, 20));
        let b = g.place(&ends, 0, 450).unwrap();
        assert_eq!((b.level(), b.slot(), b.expiration()), (2, 1, 400));
    }

    #[test]
    fn coarse_ticks_round_deadlines_up() {
        let g = Geometry::new(10, 4).unwrap();
        let mut ends = Vec::new();
        g.windows(20, &mut ends);
        // 21 rounds up to 30: due at 30, never at 20.
        let b = g.place(&ends, 20, 21).unwrap();
        assert_eq!((b.level(), b.expiration()), (0, 30));
        assert_eq!(g.place(&ends, 20, 20), None);
        assert_eq!(g.place(&ends, 20, 11), None);
    }

    #[test]
    fn huge_deadlines_saturate_in_the_top_level() {
        for (tick, size) in [(1, 2), (1, 20), (7, 3), (1_000_000, 20), (1, MAX_WHEEL_SIZE)] {
            let g = Geometry::new(tick, size).unwrap();
            let mut ends = Vec::new();
            g.windows(0, &mut ends);
            let b = g.place(&ends, 0, u64::MAX).unwrap();
            assert_eq!(b.level(), g.max_levels() - 1, "tick {tick} size {size}");
            assert!(b.expiration() <= g.max_expiration);
            assert!(b.expiration() < NOT_QUEUED);
            // Near the end of time the windows still do not overflow.
            let late = g.round_down(u64::MAX - 5);
            g.windows(late, &mut ends);
            assert!(g.place(&ends, late, u64::MAX).is_none_or(|b| b.expiration() > late));
        }
    }

    #[test]
    fn queue_reports_new_earliest() {
        let g = Geometry::new(1, 20).unwrap();
        let mut ends = Vec::new();
        g.windows(0, &mut ends);
        let mut q = ExpiryQueue::default();
        assert!(q.push(g.place(&ends, 0, 10).unwrap()));
        assert!(!q.push(g.place(&ends, 0, 15).unwrap()));
        assert!(q.push(g.place(&ends, 0, 5).unwrap()));
        assert_eq!(q.pop_due(4), None);
        assert_eq!(q.pop_due(5).unwrap().expiration(), 5);
        assert_eq!(q.len(), 2);
    }
}
