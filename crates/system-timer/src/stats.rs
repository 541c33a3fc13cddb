//! Counters and the lateness distribution, readable at any time.

use std::fmt;

use crate::sync::atomic::{AtomicU64, Ordering};

/// Sub-buckets per power of two in the lateness histogram (3 bits: at most 12.5 % error).
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: exact values below `SUB`, then `SUB` per power of two up to 2^64.
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// A log-linear histogram of nanosecond values with atomic buckets: recording is one relaxed
/// `fetch_add` on a bucket (plus the sum, and the max when it grows), and any thread can read
/// it. The count is the buckets' sum.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    /// The low 64 bits of the sum of the values recorded.
    sum: AtomicU64,
    /// The carries out of `sum` (its high 64 bits): a sum of nanoseconds passes `u64::MAX` in
    /// hours on a busy timer whose tasks run seconds late.
    sum_hi: AtomicU64,
    max: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            sum_hi: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // floor(log2 v) >= SUB_BITS
        let sub = (v >> (e - SUB_BITS)) as usize - SUB;
        SUB + (e - SUB_BITS) as usize * SUB + sub
    }

    /// The largest value that falls in bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let e = (i - SUB) / SUB + SUB_BITS as usize;
        let sub = ((i - SUB) % SUB + SUB) as u64;
        // Values v with v >> (e - SUB_BITS) == sub, i.e. [sub << s, ((sub + 1) << s) - 1].
        let s = e as u32 - SUB_BITS;
        ((sub + 1) << s).wrapping_sub(1).max(sub << s)
    }

    #[inline]
    pub(crate) fn record(&self, v: u64) {
        self.buckets[Self::index(v)].fetch_add(1, Ordering::Relaxed);
        if self
            .sum
            .fetch_add(v, Ordering::Relaxed)
            .checked_add(v)
            .is_none()
        {
            self.sum_hi.fetch_add(1, Ordering::Relaxed);
        }
        // The max only grows: a value at or below a reading of it needs no read-modify-write.
        if v > self.max.load(Ordering::Relaxed) {
            self.max.fetch_max(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> Lateness {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let max = self.max.load(Ordering::Relaxed);
        let q = |q: f64| -> u64 {
            if total == 0 {
                return 0;
            }
            let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Self::upper(i).min(max);
                }
            }
            max
        };
        // A read between a wrap of `sum` and its carry may be low by 2^64 for that moment.
        let sum = u128::from(self.sum_hi.load(Ordering::Relaxed)) << 64
            | u128::from(self.sum.load(Ordering::Relaxed));
        Lateness {
            count: total,
            mean_ns: sum
                .checked_div(u128::from(total))
                .map_or(0, |m| u64::try_from(m).unwrap_or(u64::MAX)),
            p50_ns: q(0.50),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns: max,
        }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// How late tasks started, measured from their exact deadline to the moment a runner picked
/// them up, read with the timer's clock's [`deadline_base_ns`](crate::Clock::deadline_base_ns)
/// (on the [`SystemClock`](crate::SystemClock), an upper bound up to about 13 µs above the true
/// time, so a small lateness may be overstated by that much). Percentiles are upper bounds of
/// log-linear buckets (within 12.5 %), never above the largest value recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lateness {
    /// Tasks measured.
    pub count: u64,
    /// Mean, ns.
    pub mean_ns: u64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// 99.9th percentile, ns.
    pub p999_ns: u64,
    /// Maximum, ns.
    pub max_ns: u64,
}

/// A snapshot of a timer's counters ([`SystemTimer::stats`](crate::SystemTimer::stats)).
///
/// Every scheduled task ends exactly one way, so once the timer is quiet:
/// `scheduled == fired + cancelled + handed_back + pending`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerStats {
    /// Tasks accepted by `add` / `add_at`.
    pub scheduled: u64,
    /// Tasks that started running.
    pub fired: u64,
    /// Tasks whose `cancel` (or `take`, which hands the task back) won; a task taken and
    /// added again counts as scheduled once more.
    pub cancelled: u64,
    /// Tasks that panicked (counted in `fired` too).
    pub panicked: u64,
    /// Tasks handed back by `shutdown` without running.
    pub handed_back: u64,
    /// Tasks scheduled and not yet started, cancelled or handed back (what `len()` says).
    pub pending: u64,
    /// Buckets in the expiry queue.
    pub queued_buckets: usize,
    /// Wheel levels created so far.
    pub levels: usize,
    /// Times the reaper thread woke from a sleep.
    pub reaper_wakeups: u64,
    /// Panics the reaper thread caught in its own turn, outside any task: a [`Clock`] that
    /// panicked, or a bug of the timer's own (the reaper survives it, and tries again
    /// [`REAPER_PANIC_BACKOFF`](crate::REAPER_PANIC_BACKOFF) later). Task panics are in
    /// `panicked`.
    ///
    /// [`Clock`]: crate::Clock
    pub reaper_panics: u64,
    /// Advances done for the reaper by callers of
    /// [`advance_if_due`](crate::SystemTimer::advance_if_due) while it waited out its grace
    /// ([`Builder::reaper_grace`](crate::Builder::reaper_grace)): wake-ups it was spared.
    pub caller_advances: u64,
    /// How late tasks started.
    pub lateness: Lateness,
}

/// The timer's own counters (the wheel counts adds, cancels and fires itself).
#[derive(Debug)]
pub(crate) struct Counters {
    /// Tasks already due when added, sent to run at once.
    pub(crate) immediate: AtomicU64,
    /// Tasks handed to a runner (executor channel or inline list), from the wheel or immediate.
    pub(crate) dispatched: AtomicU64,
    /// Tasks that started running.
    pub(crate) started: AtomicU64,
    pub(crate) panicked: AtomicU64,
    /// Dispatched tasks handed back at shutdown instead of running.
    pub(crate) returned: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    /// Panics the reaper caught outside tasks (a panicking clock, a bug of ours).
    pub(crate) reaper_panics: AtomicU64,
    /// Advances done by callers for the reaper (`Inner::help`).
    pub(crate) helps: AtomicU64,
    pub(crate) lateness: Histogram,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            immediate: AtomicU64::new(0),
            dispatched: AtomicU64::new(0),
            started: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            reaper_panics: AtomicU64::new(0),
            helps: AtomicU64::new(0),
            lateness: Histogram::new(),
        }
    }

    /// Dispatched but neither started nor handed back. `started` and `returned` are read
    /// before `dispatched`: a job's dispatch is counted (Release) before its start or hand-back,
    /// which are counted with Release too, so every start or hand-back seen here (Acquire) has
    /// its dispatch seen too, and a job dispatched and not started is never missed.
    pub(crate) fn in_flight(&self) -> u64 {
        let s = self.started.load(Ordering::Acquire);
        let r = self.returned.load(Ordering::Acquire);
        let d = self.dispatched.load(Ordering::Acquire);
        d.saturating_sub(s + r)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_and_bound_it() {
        let mut prev_upper = None;
        for i in 0..BUCKETS {
            let up = Histogram::upper(i);
            if let Some(p) = prev_upper {
                assert!(up > p, "bucket {i} upper {up} not above {p}");
            }
            prev_upper = Some(up);
        }
        for v in [
            0,
            1,
            7,
            8,
            9,
            15,
            16,
            1000,
            1 << 20,
            123_456_789,
            u64::MAX / 3,
            u64::MAX,
        ] {
            let i = Histogram::index(v);
            assert!(v <= Histogram::upper(i), "{v} above its bucket {i}");
            if i > 0 {
                assert!(
                    v > Histogram::upper(i - 1),
                    "{v} belongs to an earlier bucket"
                );
            }
            assert!(Histogram::upper(i) - v <= v / 8 + 1, "{v}: bucket too wide");
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 1000);
        assert_eq!(s.max_ns, 1_000_000);
        assert!((500_000..=563_000).contains(&s.p50_ns), "p50 {}", s.p50_ns);
        assert!(
            (990_000..=1_000_000).contains(&s.p99_ns),
            "p99 {}",
            s.p99_ns
        );
        assert_eq!(s.mean_ns, 500_500);
        assert_eq!(Histogram::new().snapshot(), Lateness::default());
    }

    /// The sum behind the mean carries past `u64::MAX` ns (584 years of lateness in total:
    /// reached by a busy timer whose executors fall behind, e.g. 100 000 tasks a second each
    /// 10 s late fill it in about 5 hours). It used to wrap, and the mean then read as garbage
    /// (here 0 instead of 2^63).
    #[test]
    fn the_mean_survives_a_sum_past_u64_max() {
        let h = Histogram::new();
        h.record(1 << 63);
        h.record(1 << 63);
        h.record(u64::MAX);
        h.record(u64::MAX);
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.mean_ns, (1 << 63) + (1 << 62) - 1, "{s:?}");
        assert_eq!(s.max_ns, u64::MAX);
    }

    /// A histogram's `Debug` is that of its snapshot (what `SystemTimer::stats` reports).
    #[test]
    fn histogram_debug_shows_its_snapshot() {
        let h = Histogram::new();
        h.record(5);
        h.record(7);
        let snapshot = h.snapshot();
        assert_eq!(snapshot.count, 2, "{snapshot:?}");
        assert_eq!(format!("{h:?}"), format!("{snapshot:?}"));
    }
}
