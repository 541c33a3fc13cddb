//! The W4 completer's queue: requests waiting for their intended completion time, in buckets of
//! one millisecond (a calendar queue, like the timing wheel's lowest level).
//!
//! Insert and take are O(1) per request, where a binary heap cost O(log n) per pop: at 100,000
//! requests/s (5,000 waiting) the heap's sift-downs were 7% of the completer's CPU, which W4
//! counts against the purgatory. The completer wakes at most once per millisecond anyway, so
//! nothing finer than a millisecond bucket is needed to find what is due; within the current
//! millisecond each request is still compared with the clock in nanoseconds, so none is taken
//! before it is due.
//!
//! Invariants: every bucket before `cursor_ms` is empty; the ring holds only requests due before
//! `cursor_ms + span` (later ones wait in `far`, a heap, until the cursor comes close), so the
//! bucket of millisecond `m` holds requests due in `m` only, or (the cursor's bucket) earlier.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

const NS_PER_MS: u64 = 1_000_000;

/// The millisecond whose bucket holds an item due at `due_ns` while the cursor is at
/// `cursor_ms`: its own, or the cursor's if it has passed.
fn bucket_ms(due_ns: u64, cursor_ms: u64) -> u64 {
    (due_ns / NS_PER_MS).max(cursor_ms)
}

/// A request due later than the ring reaches.
struct Far<T> {
    due_ns: u64,
    item: T,
}

impl<T> PartialEq for Far<T> {
    fn eq(&self, other: &Self) -> bool {
        self.due_ns == other.due_ns
    }
}
impl<T> Eq for Far<T> {}
impl<T> PartialOrd for Far<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Far<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.due_ns.cmp(&self.due_ns) // min-heap
    }
}

/// Items keyed by a due time in nanoseconds; see the module documentation.
pub struct CompletionQueue<T> {
    ring: Vec<Vec<(u64, T)>>,
    mask: u64,
    cursor_ms: u64,
    far: BinaryHeap<Far<T>>,
    len: usize,
    /// An empty vector traded with the current bucket when it is partly due (see `pop_due`).
    scratch: Vec<(u64, T)>,
}

impl<T> std::fmt::Debug for CompletionQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("len", &self.len)
            .field("cursor_ms", &self.cursor_ms)
            .field("far", &self.far.len())
            .finish()
    }
}

impl<T> CompletionQueue<T> {
    /// A queue whose ring spans at least `span_ms` milliseconds (requests due later than that
    /// ahead of the cursor are kept in a slower overflow heap until the cursor nears them).
    pub fn new(span_ms: u64) -> Self {
        let size = (span_ms + 2).next_power_of_two();
        CompletionQueue {
            ring: (0..size).map(|_| Vec::new()).collect(),
            mask: size - 1,
            cursor_ms: 0,
            far: BinaryHeap::new(),
            len: 0,
            scratch: Vec::new(),
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn span(&self) -> u64 {
        self.mask + 1
    }

    /// Adds `item`, due at `due_ns`.
    pub fn push(&mut self, due_ns: u64, item: T) {
        self.len += 1;
        let due_ms = bucket_ms(due_ns, self.cursor_ms);
        if due_ms >= self.cursor_ms + self.span() {
            self.far.push(Far { due_ns, item });
        } else {
            self.ring[(due_ms & self.mask) as usize].push((due_ns, item));
        }
    }

    /// Moves every item due at or before `now_ns` to `out`, as `(due_ns, item)`: earlier
    /// milliseconds first (an item pushed after its millisecond had passed counts as the
    /// cursor's); within one millisecond, in the order they entered the ring (pushed, or
    /// brought from the overflow heap in due order).
    pub fn pop_due(&mut self, now_ns: u64, out: &mut Vec<(u64, T)>) {
        let now_ms = now_ns / NS_PER_MS;
        while self.cursor_ms < now_ms && self.len > 0 {
            let b = (self.cursor_ms & self.mask) as usize;
            let taken = self.ring[b].len();
            out.append(&mut self.ring[b]);
            self.len -= taken;
            self.cursor_ms += 1;
            self.pull_far();
        }
        // Skip ahead over a gap (nothing was waiting).
        self.cursor_ms = self.cursor_ms.max(now_ms);
        self.pull_far();
        // The current millisecond's bucket, partly due (at almost every wake-up): its items are
        // moved to `scratch`, whose empty vector (with its capacity) takes the bucket's place
        // for the ones not yet due, so no vector is freed or regrown.
        let bucket = &mut self.ring[(now_ms & self.mask) as usize];
        if bucket.iter().any(|&(due, _)| due <= now_ns) {
            std::mem::swap(bucket, &mut self.scratch);
            for (due, item) in self.scratch.drain(..) {
                if due <= now_ns {
                    out.push((due, item));
                    self.len -= 1;
                } else {
                    bucket.push((due, item));
                }
            }
        }
    }

    /// Brings requests from the overflow heap into the ring once the cursor is near them.
    fn pull_far(&mut self) {
        while let Some(f) = self.far.peek() {
            let due_ms = bucket_ms(f.due_ns, self.cursor_ms);
            if due_ms >= self.cursor_ms + self.span() {
                break;
            }
            let f = self.far.pop().expect("peeked");
            self.ring[(due_ms & self.mask) as usize].push((f.due_ns, f.item));
        }
    }

    /// The earliest due time waiting (ns), if any.
    pub fn next_due_ns(&self) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        for ms in self.cursor_ms..self.cursor_ms + self.span() {
            let bucket = &self.ring[(ms & self.mask) as usize];
            if let Some(min) = bucket.iter().map(|&(due, _)| due).min() {
                return Some(min);
            }
        }
        self.far.peek().map(|f| f.due_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The queue against a sorted list: at random clock steps, exactly the items due are taken,
    /// never one early, none lost, and earlier milliseconds before later ones. With the smallest
    /// ring too (`new(0)`: two buckets, nearly every item in the overflow heap), and ten hours
    /// into a run (due times in ns past 2^64 / 10^6: a long W4 run's, `--num 2147483648`).
    #[test]
    fn takes_exactly_what_is_due_against_a_sorted_model() {
        const HOUR_NS: u64 = 3_600 * 1_000_000_000;
        for (span_ms, start_ns) in [(200, 0), (0, 0), (200, 10 * HOUR_NS)] {
            against_a_sorted_model(CompletionQueue::new(span_ms), start_ns);
        }
    }

    /// The ring, not the overflow heap (O(log n) a request), holds every request due within
    /// `span_ms` of the cursor: at its push, and once the cursor has come that near a later one.
    #[test]
    fn requests_due_within_the_span_stay_out_of_the_overflow_heap() {
        let mut q = CompletionQueue::new(200);
        for ms in 0..=200 {
            q.push(ms * NS_PER_MS + 5, ms as u32);
        }
        assert_eq!(q.far.len(), 0, "due within 200 ms of the cursor");
        q.push(1_000 * NS_PER_MS, 1_000);
        assert_eq!(q.far.len(), 1, "due 1,000 ms ahead, past the ring");
        let mut out = Vec::new();
        q.pop_due(800 * NS_PER_MS, &mut out);
        assert_eq!(out.len(), 201);
        assert_eq!(q.far.len(), 0, "200 ms ahead of the cursor now");
        assert_eq!(q.next_due_ns(), Some(1_000 * NS_PER_MS));
    }

    fn against_a_sorted_model(mut q: CompletionQueue<u32>, start_ns: u64) {
        let mut rng = SplitMix64::new(7);
        let mut model: Vec<(u64, u32)> = Vec::new();
        let mut now = start_ns;
        let mut out = Vec::new();
        q.pop_due(now, &mut out); // the clock starts at `start_ns`: nothing due
        assert!(out.is_empty());
        for id in 0..20_000u32 {
            // Due up to 1 s ahead (beyond the 256 ms ring: exercises the overflow heap), and
            // sometimes already past (a late batch).
            let due = (now + rng.next() % 1_000_000_000).saturating_sub(2_000_000);
            q.push(due, id);
            model.push((due, id));
            if rng.next().is_multiple_of(8) {
                now += rng.next() % 3_000_000;
                out.clear();
                let cursor_ms = q.cursor_ms;
                q.pop_due(now, &mut out);
                // Earlier milliseconds first (one already past at the last take counts as its
                // time: it was pushed late, into the cursor's bucket).
                let ms = |due: u64| bucket_ms(due, cursor_ms);
                assert!(
                    out.windows(2).all(|w| ms(w[0].0) <= ms(w[1].0)),
                    "taken out of order at {now}"
                );
                let mut want: Vec<(u64, u32)> =
                    model.iter().copied().filter(|m| m.0 <= now).collect();
                model.retain(|m| m.0 > now);
                let mut got = out.clone();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "at {now}");
                assert_eq!(q.len(), model.len());
                assert_eq!(q.next_due_ns(), model.iter().map(|m| m.0).min());
            }
        }
        out.clear();
        q.pop_due(u64::MAX / 2, &mut out);
        assert_eq!(out.len(), model.len());
        assert!(q.is_empty() && q.next_due_ns().is_none());
    }
}
