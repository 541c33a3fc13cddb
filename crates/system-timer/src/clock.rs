//! Time. Every read of time in the crate goes through a [`Clock`], so the whole timer, reaper
//! included, runs the same on the monotonic system clock and on a [`ManualClock`] that tests
//! move by hand.
#![allow(clippy::disallowed_methods)] // this module is where `Instant::now` is allowed

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::Arc;
#[cfg(not(loom))]
use crate::sync::{Mutex, Weak};

/// A monotonic source of time, in nanoseconds since the clock's own epoch.
///
/// Implementations must never go backwards, and should not panic. A panic reading the clock in
/// a caller's call (`add`, `advance`) reaches that caller; on the reaper thread it is caught and
/// counted ([`TimerStats::reaper_panics`](crate::TimerStats::reaper_panics)), and the reaper
/// tries again [`REAPER_PANIC_BACKOFF`](crate::REAPER_PANIC_BACKOFF) later: due tasks wait
/// until the clock reads again. The timer only ever compares readings of one clock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Nanoseconds since this clock's epoch.
    fn now_ns(&self) -> u64;

    /// A reading **at or after** [`now_ns`](Self::now_ns) at the moment of the call, possibly
    /// ahead by a few microseconds: the base of the deadline of a task added with a delay
    /// (`deadline = deadline_base_ns() + delay`). Any value at or after the true time keeps the
    /// timer's promise (never early); a cheaper, slightly late one makes `add` faster. The
    /// default is `now_ns()`. Never used to decide what is due: the timer compares deadlines
    /// with `now_ns()` readings only.
    #[inline]
    fn deadline_base_ns(&self) -> u64 {
        self.now_ns()
    }

    /// How long, in real time, a thread should sleep so that this clock reads at least
    /// `deadline_ns` when it wakes; `None` means "no real-time bound: sleep until woken" (a
    /// manual clock, which wakes sleepers through [`subscribe`](Self::subscribe) when moved).
    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration>;

    /// Asks to have `waker` called whenever the clock moves (only clocks that move by hand need
    /// to; the system clock ignores it). The reaper uses this to re-check its deadline.
    #[cfg(not(loom))]
    fn subscribe(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        let _ = waker;
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years), in u64 arithmetic.
#[inline(always)]
pub(crate) fn duration_ns(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// The deadline `d` after the clock's epoch, in nanoseconds; `None` past the end of the clock's
/// range (`u64::MAX` ns), which no reading reaches: `Duration::MAX`, say.
#[inline(always)]
pub(crate) fn deadline_at(d: Duration) -> Option<u64> {
    match duration_ns(d) {
        u64::MAX => u64::try_from(d.as_nanos()).ok(),
        ns => Some(ns),
    }
}

/// The deadline `delay` after the reading `base`, in nanoseconds; `None` past the end of the
/// clock's range, which no reading reaches (`Duration::MAX`, or any delay the sum overflows with).
#[inline(always)]
pub(crate) fn deadline_after(base: u64, delay: Duration) -> Option<u64> {
    deadline_at(delay).and_then(|ns| base.checked_add(ns))
}

/// The monotonic system clock (`std::time::Instant`), read in nanoseconds since the clock was
/// created.
///
/// [`now_ns`](Clock::now_ns) reads `Instant::now()` (about 26 ns on a KVM guest). For deadlines,
/// [`deadline_base_ns`](Clock::deadline_base_ns) gives a guaranteed upper bound of that reading
/// from the CPU's cycle counter instead (about 13 ns): each thread keeps an anchor (a counter
/// value read just before an `Instant::now()`), refreshed from the real clock every 32 µs (of
/// counter time by the bound; about 20 µs in truth), and adds the cycles since the anchor times
/// an *upper bound* of the nanoseconds per cycle, plus 1 µs for instruction reordering. The bound
/// comes from a calibration against the monotonic clock over the process's first 10 ms (readings
/// bracketed by counter reads, so that their errors can only raise it; an interval the system
/// was suspended in, when the counter may run on while the monotonic clock stops, is thrown
/// away and the calibration starts again), widened by 60%: the
/// monotonic clock is slewed (NTP, chrony), and the kernel lets it run up to about 23% fast or
/// slow (tick ±10%, frequency ±500 ppm, phase-lock correction up to 12.5%), so a calibration
/// taken while it ran slowest can later be 1.6 times too low. The reading is then at most about
/// 13 µs late (20 µs × 60%, plus the 1 µs; about 20 µs if the clock is slewed slowest after a
/// calibration taken while it ran fastest), and never early whatever the slewing. Until the
/// calibration is done, where the counter is stale or not monotonic on this thread, and where the
/// kernel does not keep time with the counter itself (so it is not known to be synchronised
/// across CPUs), the real clock is read; the kernel's clock source is read again about once a
/// second, and if the kernel has switched away from the counter (its watchdog found it
/// unstable), the counter is withdrawn for good. Deadlines are therefore at most about 13 µs
/// late, never early. [`SystemClock::exact`] opts out of the counter.
///
/// ```
/// use system_timer::{Clock, SystemClock};
/// let c = SystemClock::new();
/// let a = c.now_ns();
/// assert!(c.now_ns() >= a);
/// assert!(c.deadline_base_ns() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct SystemClock {
    epoch: Instant,
    /// `epoch` in nanoseconds after the process-wide counter base (see `fast`).
    #[cfg(not(loom))]
    offset_ns: u64,
    /// Whether deadlines use the counter-based reading (false: `exact()`).
    #[cfg(not(loom))]
    counter: bool,
}

impl SystemClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        #[cfg(not(loom))]
        let base = fast::base();
        let epoch = Instant::now();
        SystemClock {
            epoch,
            #[cfg(not(loom))]
            offset_ns: duration_ns(epoch.saturating_duration_since(base)),
            #[cfg(not(loom))]
            counter: true,
        }
    }

    /// A clock whose epoch is now and whose deadlines come from `Instant::now()` itself (no
    /// cycle counter): for those who would rather pay 13 ns more per add than rely on the
    /// counter's calibration.
    ///
    /// ```
    /// use system_timer::{Clock, SystemClock, SystemTimer};
    /// let timer = SystemTimer::builder().clock(SystemClock::exact()).build();
    /// # drop(timer);
    /// let c = SystemClock::exact();
    /// let a = c.deadline_base_ns();
    /// assert!(c.now_ns() >= a);
    /// ```
    pub fn exact() -> Self {
        SystemClock {
            #[cfg(not(loom))]
            counter: false,
            ..Self::new()
        }
    }

    /// True where deadlines can come from the CPU's cycle counter: the kernel keeps time with it
    /// itself (Linux with the `tsc` or `arch_sys_counter` clock source).
    #[doc(hidden)]
    pub fn counter_trusted() -> bool {
        #[cfg(not(loom))]
        return fast::counter_trusted();
        #[cfg(loom)]
        false
    }

    /// True once the cycle-counter calibration behind
    /// [`deadline_base_ns`](Clock::deadline_base_ns) is done (about 10 ms after the first
    /// `SystemClock` of the process): from then on most deadline readings skip the system call.
    #[doc(hidden)]
    pub fn counter_calibrated() -> bool {
        #[cfg(not(loom))]
        return fast::calibrated();
        #[cfg(loom)]
        false
    }

    /// The reading this clock gives at `instant` (0 for instants before its epoch).
    #[inline]
    pub fn ns_at(&self, instant: Instant) -> u64 {
        duration_ns(instant.saturating_duration_since(self.epoch))
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    #[cfg(not(loom))]
    #[inline]
    fn deadline_base_ns(&self) -> u64 {
        if !self.counter {
            return self.now_ns();
        }
        fast::upper_ns().saturating_sub(self.offset_ns)
    }

    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        Some(Duration::from_nanos(
            deadline_ns.saturating_sub(self.now_ns()),
        ))
    }
}

/// A timer's clock: the default system clock called directly, so that the add path inlines its
/// cheap deadline reading, or any other through dynamic dispatch.
#[derive(Debug)]
pub(crate) enum TimerClock {
    System(SystemClock),
    Other(Box<dyn Clock>),
}

impl Clock for TimerClock {
    #[inline(always)]
    fn now_ns(&self) -> u64 {
        match self {
            TimerClock::System(c) => c.now_ns(),
            TimerClock::Other(c) => c.now_ns(),
        }
    }

    #[inline(always)]
    fn deadline_base_ns(&self) -> u64 {
        match self {
            TimerClock::System(c) => c.deadline_base_ns(),
            TimerClock::Other(c) => c.deadline_base_ns(),
        }
    }

    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        match self {
            TimerClock::System(c) => c.sleep_for(deadline_ns),
            TimerClock::Other(c) => c.sleep_for(deadline_ns),
        }
    }

    #[cfg(not(loom))]
    fn subscribe(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        match self {
            TimerClock::System(c) => c.subscribe(waker),
            TimerClock::Other(c) => c.subscribe(waker),
        }
    }
}

/// Upper bounds of the monotonic clock from the CPU's cycle counter (see [`SystemClock`]).
///
/// Ground rules: every reading is in nanoseconds after `BASE.base`. A thread's anchor `(c, m)`
/// holds a counter value `c` read *before* an `Instant::now()` whose reading is `m`, so at any
/// later counter value `c'` of a counter that ticks at a constant rate, synchronised across CPUs,
/// the monotonic clock reads at most `m + (c' − c) × ns_per_cycle`. `mult` is an upper bound of
/// `ns_per_cycle` (32.32 fixed point): the calibration divides a clock interval by a cycle count
/// that can only be too small (the counter is read after the first clock reading and before the
/// second), then widens the result by `MARGIN_PPM`. `SLACK_NS` covers the few cycles by which an
/// unfenced counter read may run ahead of the instructions before it.
#[cfg(not(loom))]
mod fast {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Instant;

    use super::duration_ns;
    #[cfg(test)]
    use super::tests;
    use crate::sync::Mutex;

    /// Refresh an anchor from the real clock when it is older than this, by the upper bound
    /// (so at most this old in truth; `1 + MARGIN_PPM / 10^6` times younger without slewing).
    /// It bounds the reading's error: without slewing, at most `MAX_AGE_NS × MARGIN_PPM /
    /// (10^6 + MARGIN_PPM)` late (about 12 µs), plus `SLACK_NS`. A refresh (two counter reads and an `Instant::now()`, about 45 ns) per 20 µs of a
    /// thread adding without pause is 0.2% of its time.
    pub(super) const MAX_AGE_NS: u64 = 32_000;
    /// Calibrate once the first reading is this old.
    const CALIBRATION_NS: u64 = 10_000_000;
    /// Widening of the calibrated ns per cycle. Linux lets an NTP daemon make the monotonic
    /// clock run fast or slow by the tick (±10%, `ADJ_TICK`; chrony slews at up to 8.3% this
    /// way), the frequency (±500 ppm) and the phase-lock loop's offset correction (a quarter of
    /// an offset of up to 0.5 s per second: 12.5%). Fastest over slowest: 1.2256 / 0.7745 =
    /// 1.58, since the calibration may have run at the slowest rate.
    pub(super) const MARGIN_PPM: u64 = 600_000;
    /// Added to every counter-based reading.
    pub(super) const SLACK_NS: u64 = 1_000;
    /// A bracketing pair of counter reads wider than this is retried (the thread was preempted
    /// between them).
    const BRACKET_CYCLES: u64 = 20_000;

    /// A boot-clock offset read over a longer real interval than this is read again (see
    /// `boot_ahead`).
    const BOOT_READ_NS: u64 = 5_000;

    /// A boot-clock offset that moved by more than this between the calibration's points means
    /// the system was suspended in between (the offset moves at no other time; two readings of
    /// it differ by at most `BOOT_READ_NS` otherwise). A shorter suspend that slipped through
    /// would add at most this much counter time (plus `BOOT_READ_NS`) to the 10 ms interval:
    /// 0.15%, within the 1.2% that `MARGIN_PPM` keeps above the slewing.
    const SUSPEND_NS: u64 = 2 * BOOT_READ_NS;

    /// How often (by the real clock, at a refresh) the kernel's clock source is read again.
    const RECHECK_NS: u64 = 1_000_000_000;

    struct Source {
        base: Instant,
        /// `None` where the counter is not trusted (see `counter_trusted`): always the real clock.
        counter: Option<quanta::Clock>,
        /// Set for good once the kernel stops keeping time with the counter after start (it
        /// switches clock source when its watchdog finds the counter unstable): from then on
        /// every reading is the real clock's.
        withdrawn: AtomicBool,
        /// When (ns after `base`) a refresh next reads the kernel's clock source again.
        next_check_ns: AtomicU64,
        /// The calibration's first point (counter after its reading), until calibrated.
        start: Mutex<Option<Point>>,
        /// Upper bound of ns per counter unit, 32.32 fixed point; 0 until calibrated.
        mult: AtomicU64,
        /// Counter units in `MAX_AGE_NS` by the upper bound (so at most that long in truth).
        max_age: AtomicU64,
    }

    static SOURCE: OnceLock<Source> = OnceLock::new();

    thread_local! {
        /// This thread's anchor: (counter before the reading, reading). (0, 0) = none yet: the
        /// counter has moved on far beyond `max_age` from 0, so it forces a real reading.
        static ANCHOR: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }

    fn source() -> &'static Source {
        SOURCE.get_or_init(|| {
            let base = Instant::now();
            let counter = counter_trusted().then(quanta::Clock::new);
            let start = counter.as_ref().and_then(|c| {
                let boot_ahead = boot_ahead(base)?;
                let (_, m, after) = bracket(c, base)?;
                Some(Point {
                    counter: after,
                    m,
                    boot_ahead,
                })
            });
            Source {
                base,
                counter,
                withdrawn: AtomicBool::new(false),
                next_check_ns: AtomicU64::new(RECHECK_NS),
                start: Mutex::new(start),
                mult: AtomicU64::new(0),
                max_age: AtomicU64::new(0),
            }
        })
    }

    /// True where the kernel itself keeps time with the CPU's counter: it does so only once it
    /// has found the counter invariant and synchronised across CPUs (Linux's `tsc` on x86, the
    /// architected `arch_sys_counter` on ARM). Elsewhere (another clock source, another OS) the
    /// counter is not used and every reading is `Instant::now()`.
    pub(super) fn counter_trusted() -> bool {
        #[cfg(test)]
        if tests::KERNEL_DROPPED_COUNTER.load(Ordering::Relaxed) {
            return false;
        }
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| matches!(s.trim(), "tsc" | "arch_sys_counter"))
    }

    /// True once the counter was withdrawn (see `Source::withdrawn`).
    #[cfg(test)]
    pub(super) fn withdrawn() -> bool {
        source().withdrawn.load(Ordering::Acquire)
    }

    /// At most once per `RECHECK_NS` (whichever refreshing thread wins), reads the kernel's
    /// clock source again; if the kernel no longer keeps time with the counter, withdraws it:
    /// `max_age` 0 sends every reading to `refresh`, which then reads the real clock.
    fn recheck(src: &Source, now: u64) {
        let due = src.next_check_ns.load(Ordering::Relaxed);
        if now < due
            || src
                .next_check_ns
                .compare_exchange(
                    due,
                    now.saturating_add(RECHECK_NS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        if !counter_trusted() {
            // SeqCst, with the calibration's store of `max_age` and load of `withdrawn`: a
            // store followed by a load of another variable on each side, which weaker orders
            // (and x86's store buffer) let both sides miss, leaving a withdrawn counter in use.
            src.withdrawn.store(true, Ordering::SeqCst);
            src.max_age.store(0, Ordering::SeqCst);
        }
    }

    pub(super) fn calibrated() -> bool {
        source().max_age.load(Ordering::Acquire) != 0
    }

    /// The process-wide base instant (set up on first use).
    pub(super) fn base() -> Instant {
        source().base
    }

    /// A real reading tightly bracketed by counter reads: (counter before, reading, counter
    /// after), `after − before ≤ BRACKET_CYCLES`; `None` if eight tries were all preempted (or the
    /// counter went back), and the caller then uses the plain reading.
    fn bracket(counter: &quanta::Clock, base: Instant) -> Option<(u64, u64, u64)> {
        bracket_reads(|| counter.raw(), base)
    }

    /// [`bracket`] with the counter read by `read` (in tests, a scripted counter).
    #[inline(always)]
    fn bracket_reads(mut read: impl FnMut() -> u64, base: Instant) -> Option<(u64, u64, u64)> {
        (0..8).find_map(|_| {
            let before = read();
            let m = real(base);
            let after = read();
            (after >= before && after - before <= BRACKET_CYCLES).then_some((before, m, after))
        })
    }

    /// `Instant::now()`, in ns after `base`.
    #[inline]
    fn real(base: Instant) -> u64 {
        #[allow(clippy::disallowed_methods)] // the clock module reads time
        duration_ns(Instant::now().saturating_duration_since(base))
    }

    /// How far `CLOCK_BOOTTIME` is ahead of the monotonic clock (ns after `base`), to within
    /// `BOOT_READ_NS` above: a constant until the system resumes from a suspend, when it grows
    /// by the time suspended. `None` if every try was preempted or the clock cannot be read
    /// (then no calibration: the real clock is read).
    fn boot_ahead(base: Instant) -> Option<u64> {
        (0..8).find_map(|_| {
            let m = real(base);
            let boot = boot_ns()?;
            (real(base).saturating_sub(m) <= BOOT_READ_NS).then(|| boot.saturating_sub(m))
        })
    }

    /// `CLOCK_BOOTTIME` in ns (the monotonic clock plus the time spent suspended).
    #[cfg(target_os = "linux")]
    fn boot_ns() -> Option<u64> {
        let t = rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Boottime).ok()?;
        let secs = u64::try_from(t.tv_sec).ok()?;
        let nanos = u64::try_from(t.tv_nsec).ok()?;
        Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
    }

    /// No boot clock here (nor a trusted counter: see `counter_trusted`).
    #[cfg(not(target_os = "linux"))]
    fn boot_ns() -> Option<u64> {
        None
    }

    /// An upper bound of the monotonic clock now, in ns after the base.
    #[inline(always)]
    pub(super) fn upper_ns() -> u64 {
        let src = source();
        // `max_age` is 0 until calibrated: then every call takes the slow path.
        let max_age = src.max_age.load(Ordering::Acquire);
        let mult = src.mult.load(Ordering::Relaxed);
        let Some(counter) = &src.counter else {
            return refresh(src);
        };
        let (c, m) = ANCHOR.get();
        let age = counter.raw().wrapping_sub(c);
        if age < max_age {
            // age < max_age keeps the product in range (max_age * mult ~ MAX_AGE_NS << 32).
            return m + ((age * mult) >> 32) + SLACK_NS;
        }
        refresh(src)
    }

    /// Reads the real clock, renews this thread's anchor, calibrates if it is time.
    #[cold]
    fn refresh(src: &Source) -> u64 {
        let Some(counter) = &src.counter else {
            return real(src.base);
        };
        if src.withdrawn.load(Ordering::Acquire) {
            return real(src.base);
        }
        // While calibrating, the boot clock's offset is read on both sides of the reading, so
        // that a suspend on either side of it shows.
        let boot_before = if src.mult.load(Ordering::Relaxed) == 0 {
            boot_ahead(src.base)
        } else {
            None
        };
        let Some((before, m, after)) = bracket(counter, src.base) else {
            return real(src.base);
        };
        recheck(src, m);
        ANCHOR.set((before, m));
        if let Some(boot_before) = boot_before {
            calibrate(src, boot_before, (before, m, after));
        }
        m
    }

    /// A calibration point: a real reading `m`, a counter value read on the right side of it
    /// (after it for the first point, before it for the last), and how far `CLOCK_BOOTTIME` was
    /// ahead of the monotonic clock then.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Point {
        pub(super) counter: u64,
        pub(super) m: u64,
        pub(super) boot_ahead: u64,
    }

    /// What a calibration makes of its first point and a later one.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Calibration {
        /// Not yet (too close together, or no usable interval): keep the first point.
        Wait,
        /// The interval cannot be trusted: start again from the later point.
        Restart,
        /// An upper bound of the ns per counter unit, 32.32 fixed point.
        Bound(u64),
    }

    /// The calibration from the first point `start` (counter read after its reading) and the
    /// later point `end` (counter read before its reading), once they are `CALIBRATION_NS`
    /// apart: the clock interval over the counter interval, rounded up and widened by
    /// `MARGIN_PPM`. An interval with a suspend in it (the boot clock got further ahead) is
    /// thrown away: the counter may run on while the monotonic clock stands still, so the
    /// quotient would be far below the clock's rate.
    pub(super) fn calibration(start: Point, end: Point) -> Calibration {
        if end.boot_ahead.abs_diff(start.boot_ahead) > SUSPEND_NS {
            return Calibration::Restart;
        }
        let elapsed = end.m.saturating_sub(start.m);
        if elapsed < CALIBRATION_NS || end.counter <= start.counter {
            return Calibration::Wait;
        }
        let cycles = u128::from(end.counter - start.counter);
        // ns per cycle, rounded up, widened by the margin: an upper bound.
        let mult = ((u128::from(elapsed) << 32).div_ceil(cycles)
            * u128::from(1_000_000 + MARGIN_PPM))
        .div_ceil(1_000_000);
        match u64::try_from(mult) {
            Ok(mult) if mult > 0 => Calibration::Bound(mult),
            // a counter slower than 1 tick per 4 s: keep reading the real clock
            _ => Calibration::Wait,
        }
    }

    /// Sets `mult` and `max_age` from the first point and this reading (counter `before` it,
    /// the reading `m`, counter `after` it; the boot clock's offset `boot_before` read before
    /// them) once `calibration` gives a bound; makes this reading the first point if there is
    /// none yet or the interval is not to be trusted. A reading with a suspend next to it (the
    /// offset moved) is not used.
    fn calibrate(src: &Source, boot_before: u64, (before, m, after): (u64, u64, u64)) {
        let Some(boot_after) = boot_ahead(src.base) else {
            return;
        };
        if boot_after.abs_diff(boot_before) > SUSPEND_NS {
            return;
        }
        // As the last point, the offset after; as the first, the offset before.
        let here = Point {
            counter: before,
            m,
            boot_ahead: boot_after,
        };
        let mut start = src.start.lock();
        let decision = match *start {
            Some(first) => calibration(first, here),
            None => Calibration::Restart,
        };
        let mult = match decision {
            Calibration::Wait => return,
            Calibration::Restart => {
                *start = Some(Point {
                    counter: after,
                    m,
                    boot_ahead: boot_before,
                });
                return;
            }
            Calibration::Bound(mult) => mult,
        };
        drop(start);
        let max_age =
            u64::try_from((u128::from(MAX_AGE_NS) << 32) / u128::from(mult)).unwrap_or(u64::MAX);
        // The first calibration wins; `max_age` is published after `mult` (Release), and readers
        // load it first (Acquire), so whoever sees a non-zero `max_age` sees `mult`.
        if src
            .mult
            .compare_exchange(0, mult, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            // A withdrawal that raced this calibration wins (SeqCst: see `recheck`).
            src.max_age.store(max_age, Ordering::SeqCst);
            if src.withdrawn.load(Ordering::SeqCst) {
                src.max_age.store(0, Ordering::SeqCst);
            }
        }
    }

    /// The counter-based reading's parts, driven directly (the process's own source is shared by
    /// every test of the binary, so those that steer it use a source of their own).
    #[cfg(test)]
    mod fast_tests {
        use std::time::Duration;

        use super::*;

        /// A source of its own, with the counter and nothing calibrated yet, whose clock source
        /// is next read again at `next_check_ns`.
        fn own_source(next_check_ns: u64) -> Source {
            Source {
                base: Instant::now(),
                counter: Some(quanta::Clock::new()),
                withdrawn: AtomicBool::new(false),
                next_check_ns: AtomicU64::new(next_check_ns),
                start: Mutex::new(None),
                mult: AtomicU64::new(0),
                max_age: AtomicU64::new(0),
            }
        }

        /// `real` reads the monotonic clock in nanoseconds after `base`.
        #[test]
        fn real_reads_the_nanoseconds_since_base() {
            let base = Instant::now();
            std::thread::sleep(Duration::from_millis(2));
            let r = real(base);
            let elapsed = base.elapsed();
            assert!(r >= 2_000_000, "{r} ns after a 2 ms sleep");
            assert!(u128::from(r) <= elapsed.as_nanos(), "{r} ns > {elapsed:?}");
        }

        /// A bracket is a real reading taken between two counter reads, the counter not going
        /// back and the two at most `BRACKET_CYCLES` apart; most brackets are not preempted.
        #[test]
        fn a_bracket_is_a_real_reading_between_two_close_counter_reads() {
            let counter = quanta::Clock::new();
            let base = Instant::now();
            std::thread::sleep(Duration::from_millis(2));
            let mut brackets = 0;
            for _ in 0..100 {
                let lo = real(base);
                let Some((before, m, after)) = bracket(&counter, base) else {
                    continue;
                };
                let hi = real(base);
                assert!(before <= after, "the counter went back: {before} > {after}");
                assert!(
                    after - before <= BRACKET_CYCLES,
                    "{before}..{after} too wide"
                );
                assert!((lo..=hi).contains(&m), "reading {m} outside {lo}..={hi}");
                brackets += 1;
            }
            assert!(
                brackets > 0,
                "a hundred brackets, each preempted eight times"
            );
        }

        /// A bracket whose counter reads are more than `BRACKET_CYCLES` apart (the thread was
        /// preempted between them) or went back is read again, up to eight times in all; one
        /// exactly `BRACKET_CYCLES` wide is kept.
        ///
        /// Catches: the width test dropped (`&&` turned into `||`, or `after / before` for the
        /// width): a preempted bracket then becomes an anchor or a calibration point, and the
        /// readings from it are late by the preemption (the bound no longer about 13 µs).
        #[test]
        fn a_wide_or_backward_bracket_is_read_again() {
            let base = Instant::now();
            let mut reads = [
                1_000,
                1_000 + BRACKET_CYCLES + 1, // too wide
                5_000,
                4_999, // backwards
                7_000,
                7_000 + BRACKET_CYCLES, // just narrow enough
            ]
            .into_iter();
            let (before, _, after) = bracket_reads(|| reads.next().unwrap(), base)
                .expect("the third bracket is narrow enough");
            assert_eq!((before, after), (7_000, 7_000 + BRACKET_CYCLES));
            assert_eq!(reads.next(), None, "read on past a good bracket");

            // Every bracket too wide: eight tries, then none.
            let (mut counter, mut count) = (1_000_000u64, 0);
            let wide = bracket_reads(
                || {
                    counter += BRACKET_CYCLES + 1;
                    count += 1;
                    counter
                },
                base,
            );
            assert_eq!((wide, count), (None, 16));
        }

        /// `CLOCK_BOOTTIME` (the monotonic clock plus the time suspended) never reads behind
        /// `CLOCK_MONOTONIC` read before it.
        #[cfg(target_os = "linux")]
        #[test]
        fn the_boot_clock_reads_at_or_after_the_monotonic_clock() {
            use rustix::time::{clock_gettime, ClockId};
            let mono = clock_gettime(ClockId::Monotonic);
            let boot = boot_ns().expect("CLOCK_BOOTTIME unreadable");
            let mono_ns = u64::try_from(mono.tv_sec).unwrap() * 1_000_000_000
                + u64::try_from(mono.tv_nsec).unwrap();
            assert!(boot >= mono_ns, "boot clock {boot} < monotonic {mono_ns}");
        }

        /// `boot_ahead` is how far the boot clock is ahead of `real(base)`, to within
        /// `BOOT_READ_NS` above, and is read whenever the thread is not preempted throughout.
        #[cfg(target_os = "linux")]
        #[test]
        fn boot_ahead_is_the_boot_clocks_lead_over_the_real_clock() {
            let base = Instant::now();
            for _ in 0..10 {
                let m1 = real(base);
                let boot = boot_ns().unwrap();
                let ahead = boot_ahead(base).expect("eight reads in a row preempted");
                let m2 = real(base);
                // The true lead is within [boot − m2, boot − m1].
                assert!(
                    ahead >= boot - m2 && ahead <= boot - m1 + BOOT_READ_NS,
                    "lead {ahead} outside {}..={}",
                    boot - m2,
                    boot - m1 + BOOT_READ_NS
                );
            }
        }

        /// A refresh reads the kernel's clock source again only once the next check is due,
        /// and then schedules the next one `RECHECK_NS` after its own reading: at most once a
        /// second.
        #[test]
        fn the_clock_source_is_read_again_only_when_due_then_a_second_later() {
            let next = |src: &Source| src.next_check_ns.load(Ordering::Relaxed);
            let src = own_source(5 * RECHECK_NS);
            recheck(&src, 5 * RECHECK_NS - 1);
            assert_eq!(next(&src), 5 * RECHECK_NS, "checked before it was due");
            recheck(&src, 5 * RECHECK_NS);
            assert_eq!(next(&src), 6 * RECHECK_NS, "not checked when due");
            recheck(&src, 6 * RECHECK_NS + 7);
            assert_eq!(next(&src), 7 * RECHECK_NS + 7, "not checked when overdue");
        }

        /// A calibration reading with a suspend next to it (the boot clock's lead moved by
        /// more than `SUSPEND_NS` since `boot_before`) is not used, not even as the first point;
        /// a clean one becomes the first point (the counter after it, the lead before it); a
        /// clean one 10 ms later sets the bound from the two, and `max_age` to the counter
        /// units in `MAX_AGE_NS` by that bound (rounded down).
        #[cfg(target_os = "linux")]
        #[test]
        fn calibrate_keeps_clean_readings_and_sets_the_bound_and_max_age() {
            let src = own_source(RECHECK_NS);
            let lead = boot_ahead(src.base).expect("eight reads in a row preempted");
            let hour_ns = 3_600_000_000_000;
            calibrate(&src, lead + hour_ns, (1_000, 5_000_000, 1_100));
            assert!(
                src.start.lock().is_none(),
                "a reading next to a suspend was used"
            );

            calibrate(&src, lead, (1_000, 5_000_000, 1_100));
            let first = src.start.lock().expect("a clean reading was not kept");
            assert_eq!(
                (first.counter, first.m, first.boot_ahead),
                (1_100, 5_000_000, lead)
            );
            assert_eq!(
                src.mult.load(Ordering::Relaxed),
                0,
                "calibrated from one point"
            );

            let last = (31_000_000, 15_000_000, 31_000_100);
            calibrate(&src, lead, last);
            let Calibration::Bound(bound) = calibration(
                first,
                Point {
                    counter: last.0,
                    m: last.1,
                    boot_ahead: lead,
                },
            ) else {
                panic!("no bound from a clean 10 ms interval");
            };
            let (mult, max_age) = (
                src.mult.load(Ordering::Relaxed),
                src.max_age.load(Ordering::Relaxed),
            );
            assert_eq!(mult, bound);
            let age_ns = u128::from(MAX_AGE_NS) << 32;
            assert!(
                u128::from(max_age) * u128::from(mult) <= age_ns
                    && u128::from(max_age + 1) * u128::from(mult) > age_ns,
                "max_age {max_age} is not MAX_AGE_NS by the bound {mult}"
            );
        }
    }
}

/// A clock that moves only when told to: for deterministic tests of the timer, reaper included.
/// Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use system_timer::{Clock, ManualClock};
/// let clock = ManualClock::new(100);
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_ms(), 105);
/// assert_eq!(clock.now_ns(), 105_000_000);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    now_ns: AtomicU64,
    #[cfg(not(loom))]
    wakers: Mutex<Vec<Weak<dyn Fn() + Send + Sync>>>,
}

impl ManualClock {
    /// A manual clock reading `start_ms` milliseconds, or its last nanosecond, `u64::MAX`,
    /// for a start past it (18,446,744,073,709 ms, about 584 years: the clock counts
    /// nanoseconds in a `u64`).
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                now_ns: AtomicU64::new(start_ms.saturating_mul(1_000_000)),
                #[cfg(not(loom))]
                wakers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The time in whole milliseconds (rounded down).
    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// The time in nanoseconds (as [`Clock::now_ns`]).
    pub fn now_ns(&self) -> u64 {
        self.inner.now_ns.load(Ordering::Acquire)
    }

    /// Moves the clock forward by `d` (saturating) and wakes whoever subscribed.
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .inner
            .now_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(ns))
            });
        self.wake();
    }

    /// Sets the clock to `ms` milliseconds (saturating at `u64::MAX` nanoseconds, as
    /// [`new`](Self::new)); a time earlier than the current one is ignored (the clock is
    /// monotonic).
    pub fn set_ms(&self, ms: u64) {
        self.set_ns(ms.saturating_mul(1_000_000));
    }

    /// Sets the clock to `ns` nanoseconds; a time earlier than the current one is ignored.
    pub fn set_ns(&self, ns: u64) {
        self.inner.now_ns.fetch_max(ns, Ordering::AcqRel);
        self.wake();
    }

    fn wake(&self) {
        #[cfg(not(loom))]
        {
            let wakers: Vec<_> = {
                let mut w = self.inner.wakers.lock();
                w.retain(|w| w.strong_count() > 0);
                w.iter().filter_map(Weak::upgrade).collect()
            };
            for w in wakers {
                w();
            }
        }
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        ManualClock::now_ns(self)
    }

    fn sleep_for(&self, _deadline_ns: u64) -> Option<Duration> {
        None
    }

    /// Drops the subscribers that are gone first: a clock shared by many short-lived timers
    /// and never moved would otherwise keep one dead entry per timer.
    #[cfg(not(loom))]
    fn subscribe(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        let mut wakers = self.inner.wakers.lock();
        wakers.retain(|w| w.strong_count() > 0);
        wakers.push(waker);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_ns", &self.now_ns())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Set by a test: the kernel's clock source reads as one that is not the counter.
    #[cfg(not(loom))]
    pub(super) static KERNEL_DROPPED_COUNTER: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// The kernel switches clock source after start (its watchdog found the counter unstable):
    /// within about a second of a refresh, deadline readings stop using the counter, for good.
    ///
    /// Catches: a counter trusted for ever on the strength of the clock source read once at
    /// start (readings could then be early by the counters' skew); `SystemClock::counter_trusted`
    /// or `counter_calibrated` answering true whatever the state.
    #[cfg(not(loom))]
    #[test]
    fn a_counter_the_kernel_stops_trusting_is_withdrawn() {
        if !fast::counter_trusted() {
            return; // the counter is never used here: nothing to withdraw
        }
        let c = SystemClock::new();
        let give_up = Instant::now() + Duration::from_secs(20);
        while !fast::calibrated() {
            assert!(Instant::now() < give_up, "the counter never calibrated");
            c.deadline_base_ns();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!fast::withdrawn());
        KERNEL_DROPPED_COUNTER.store(true, std::sync::atomic::Ordering::Relaxed);
        while !fast::withdrawn() {
            assert!(Instant::now() < give_up, "the counter was never withdrawn");
            c.deadline_base_ns();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !SystemClock::counter_calibrated(),
            "every reading takes the real clock's path"
        );
        assert!(
            !SystemClock::counter_trusted(),
            "the counter is still reported trusted after the kernel dropped it"
        );
        let before = c.now_ns();
        assert!(c.deadline_base_ns() >= before);
    }

    /// A waker that counts its calls, and the count.
    fn counting_waker() -> (Arc<dyn Fn() + Send + Sync>, Arc<AtomicU64>) {
        let hits = Arc::new(AtomicU64::new(0));
        let h = hits.clone();
        let waker: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            h.fetch_add(1, Ordering::Relaxed);
        });
        (waker, hits)
    }

    #[test]
    fn manual_clock_is_monotonic_and_wakes_subscribers() {
        let c = ManualClock::new(10);
        let (waker, hits) = counting_waker();
        c.subscribe(Arc::downgrade(&waker));
        c.advance(Duration::from_millis(1));
        c.set_ms(5); // earlier: ignored
        assert_eq!(c.now_ms(), 11);
        assert_eq!(hits.load(Ordering::Relaxed), 2);
        drop(waker);
        c.advance(Duration::from_millis(1));
        assert_eq!(
            hits.load(Ordering::Relaxed),
            2,
            "dropped subscribers are not called"
        );
        assert_eq!(c.sleep_for(u64::MAX), None);
    }

    #[test]
    fn a_manual_clock_never_moved_keeps_only_live_subscribers() {
        let c = ManualClock::new(0);
        let live: Arc<dyn Fn() + Send + Sync> = Arc::new(|| ());
        c.subscribe(Arc::downgrade(&live));
        for _ in 0..1_000 {
            let gone: Arc<dyn Fn() + Send + Sync> = Arc::new(|| ());
            c.subscribe(Arc::downgrade(&gone));
        }
        // The last one subscribed is dropped but not yet pruned.
        assert_eq!(c.inner.wakers.lock().len(), 2);
    }

    /// The widening covers the fastest rate the kernel can give the monotonic clock over the
    /// slowest (see `MARGIN_PPM`), and the refresh age keeps the error within the reaper's help
    /// margin: a caller's reading never claims a bucket before it is due.
    #[test]
    fn the_counter_bound_covers_the_kernels_full_slewing_range() {
        let (tick, freq, pll) = (0.10, 0.000_5, 0.125);
        let fastest = (1.0 + tick) * (1.0 + freq) + pll;
        let slowest = (1.0 - tick) * (1.0 - freq) - pll;
        let margin = fast::MARGIN_PPM as f64 / 1e6;
        assert!(
            1.0 + margin >= fastest / slowest,
            "{margin} < {}",
            fastest / slowest
        );
        // The bound over the true rate: the widening, times the slewing's swing when the
        // calibration ran at the fastest rate and the reading at the slowest.
        let worst_ratio = (1.0 + margin) * fastest / slowest;
        let worst_late_ns =
            fast::MAX_AGE_NS as f64 * (1.0 - 1.0 / worst_ratio) + fast::SLACK_NS as f64;
        assert!(
            worst_late_ns < crate::parker::HELP_MARGIN_NS as f64,
            "{worst_late_ns}"
        );
    }

    /// The system suspends between the calibration's two points: the counter runs on (an
    /// invariant TSC), the monotonic clock stops, and `CLOCK_BOOTTIME` takes the time slept.
    /// The interval is thrown away, not turned into a bound.
    ///
    /// Catches: a calibration that divided 10 ms of monotonic time by an hour of cycles, a bound
    /// 360,000 times too low: anchors then lived for up to seconds of counter time instead of
    /// 32 µs, and deadline bases came out early by nearly that much.
    #[test]
    fn a_calibration_across_a_suspend_is_restarted() {
        use fast::{calibration, Calibration, Point};
        const GHZ: u64 = 3; // counter units per ns
        let hour_ns = 3_600_000_000_000;
        let start = Point {
            counter: 1_000,
            m: 5_000_000,
            boot_ahead: 7,
        };
        // 10 ms of monotonic time, an hour asleep in the middle.
        let end = Point {
            counter: start.counter + (10_000_000 + hour_ns) * GHZ,
            m: start.m + 10_000_000,
            boot_ahead: start.boot_ahead + hour_ns,
        };
        assert_eq!(calibration(start, end), Calibration::Restart);
        // Without the suspend: a bound of at least the true ns per unit (1/3), widened.
        let awake = Point {
            counter: start.counter + 10_000_000 * GHZ,
            boot_ahead: start.boot_ahead,
            ..end
        };
        let Calibration::Bound(mult) = calibration(start, awake) else {
            panic!("no bound from a clean interval");
        };
        assert!(
            u128::from(mult) * u128::from(GHZ)
                >= (u128::from(1_000_000 + fast::MARGIN_PPM) << 32) / 1_000_000
        );
    }

    /// A first and a later calibration point, `elapsed_ns` of monotonic time and `cycles`
    /// counter units apart, the boot clock's lead moved by `boot_moved_ns` between them.
    fn calibration_points(
        elapsed_ns: u64,
        cycles: u64,
        boot_moved_ns: u64,
    ) -> (fast::Point, fast::Point) {
        let start = fast::Point {
            counter: 7_000_000_000,
            m: 5_000_000,
            boot_ahead: 1_000_000,
        };
        let end = fast::Point {
            counter: start.counter + cycles,
            m: start.m + elapsed_ns,
            boot_ahead: start.boot_ahead + boot_moved_ns,
        };
        (start, end)
    }

    /// The boot clock's lead may move by up to `SUSPEND_NS` (10 µs: twice the error of a
    /// reading of it) between the calibration's points and the interval is still used; one
    /// nanosecond more and it is thrown away as a suspend.
    #[test]
    fn a_calibration_restarts_only_when_the_boot_lead_moved_more_than_10_us() {
        use fast::{calibration, Calibration};
        let bound = |moved| {
            let (start, end) = calibration_points(10_000_000, 30_000_000, moved);
            match calibration(start, end) {
                Calibration::Bound(_) => true,
                Calibration::Restart => false,
                Calibration::Wait => panic!("a clean 10 ms interval waits"),
            }
        };
        assert!(
            bound(10_000),
            "a 10 µs move of the lead is taken for a suspend"
        );
        assert!(
            !bound(10_001),
            "a move past 10 µs is not taken for a suspend"
        );
    }

    /// A calibration waits until its points are 10 ms of monotonic time apart, and while the
    /// counter has not moved forward between them.
    #[test]
    fn a_calibration_waits_for_10_ms_and_a_counter_that_moved_forward() {
        use fast::{calibration, Calibration};
        let decide = |elapsed, cycles| {
            let (start, end) = calibration_points(elapsed, cycles, 0);
            calibration(start, end)
        };
        assert_eq!(decide(9_999_999, 30_000_000), Calibration::Wait);
        assert!(matches!(
            decide(10_000_000, 30_000_000),
            Calibration::Bound(_)
        ));
        assert_eq!(decide(20_000_000, 0), Calibration::Wait);
    }

    /// The bound is the interval's ns per counter unit widened by `MARGIN_PPM`, rounded up: at
    /// or above it, and above it by no more than the rounding.
    #[test]
    fn the_calibrated_bound_is_the_widened_rate_rounded_up() {
        let (start, end) = calibration_points(10_000_000, 33_333_333, 0);
        let fast::Calibration::Bound(mult) = fast::calibration(start, end) else {
            panic!("no bound from a clean interval");
        };
        // mult / 2^32 ≥ 10 ms × (1 + margin) / cycles, by less than 3 units of the last place
        // (two roundings up).
        let widened = (u128::from(10_000_000u64) << 32) * u128::from(1_000_000 + fast::MARGIN_PPM);
        let cycles_ppm = u128::from(33_333_333u64) * 1_000_000;
        let mult = u128::from(mult);
        assert!(
            mult * cycles_ppm >= widened,
            "{mult} below the widened rate"
        );
        assert!(
            (mult - 3) * cycles_ppm < widened,
            "{mult} above the widened rate"
        );
    }

    /// Moving a manual clock drops the subscribers that are gone.
    #[test]
    fn moving_a_manual_clock_drops_its_dead_subscribers() {
        let c = ManualClock::new(0);
        let live: Arc<dyn Fn() + Send + Sync> = Arc::new(|| ());
        let gone: Arc<dyn Fn() + Send + Sync> = Arc::new(|| ());
        c.subscribe(Arc::downgrade(&live));
        c.subscribe(Arc::downgrade(&gone));
        drop(gone);
        c.advance(Duration::from_millis(1));
        assert_eq!(c.inner.wakers.lock().len(), 1);
    }

    /// A manual clock's `Debug` shows its time.
    #[test]
    fn a_manual_clocks_debug_shows_its_time() {
        let c = ManualClock::new(3);
        assert_eq!(format!("{c:?}"), "ManualClock { now_ns: 3000000 }");
    }

    /// A system clock reads the nanoseconds since its creation: at least a 2 ms sleep taken
    /// after it, at most the time measured around it; an instant before it reads 0.
    ///
    /// Catches: `SystemClock::now_ns` or `ns_at` answering a constant (the other clock tests
    /// compare readings with readings, which a constant passes).
    #[test]
    fn a_system_clock_reads_the_time_since_its_creation() {
        let t0 = Instant::now();
        let c = SystemClock::new();
        std::thread::sleep(Duration::from_millis(2));
        let now = c.now_ns();
        let elapsed = t0.elapsed();
        assert!(now >= 2_000_000, "{now} ns after a 2 ms sleep");
        assert!(
            u128::from(now) <= elapsed.as_nanos(),
            "{now} ns > {elapsed:?}"
        );
        assert!(c.ns_at(Instant::now()) >= now);
        assert_eq!(c.ns_at(t0), 0, "an instant before the epoch");
    }

    /// A system clock's sleep for a deadline is the deadline minus its own reading at the call:
    /// between the deadline less a reading after and the deadline less a reading before.
    #[test]
    fn a_system_clock_sleeps_for_the_time_left_to_the_deadline() {
        let c = SystemClock::new();
        let deadline = c.now_ns() + 1_000_000_000;
        let before = c.now_ns();
        let sleep = duration_ns(c.sleep_for(deadline).expect("no real-time bound"));
        let after = c.now_ns();
        assert!(
            (deadline - after..=deadline - before).contains(&sleep),
            "{sleep} ns outside {}..={}",
            deadline - after,
            deadline - before
        );
    }

    /// A timer's clock forwards every call to the clock it wraps: readings, sleeps and
    /// subscriptions, whether the system clock or another.
    #[test]
    fn a_timer_clock_forwards_every_call_to_its_clock() {
        let manual = ManualClock::new(7);
        let other = TimerClock::Other(Box::new(manual.clone()));
        assert_eq!(
            (other.now_ns(), other.deadline_base_ns()),
            (7_000_000, 7_000_000)
        );
        assert_eq!(other.sleep_for(u64::MAX), None);
        let (waker, hits) = counting_waker();
        other.subscribe(Arc::downgrade(&waker));
        manual.advance(Duration::from_millis(1));
        assert_eq!(
            hits.load(Ordering::Relaxed),
            1,
            "the subscriber was not woken"
        );

        let system = SystemClock::new();
        let timer_clock = TimerClock::System(system.clone());
        std::thread::sleep(Duration::from_millis(2));
        let before = system.now_ns();
        let (now, base) = (timer_clock.now_ns(), timer_clock.deadline_base_ns());
        let after = system.now_ns();
        assert!(
            (before..=after).contains(&now),
            "{now} outside {before}..={after}"
        );
        assert!(base >= now, "deadline base {base} below the reading {now}");
        let sleep = timer_clock
            .sleep_for(after + 1_000_000_000)
            .map(duration_ns);
        assert!(
            sleep.is_some_and(|s| s > 0 && s <= 1_000_000_000),
            "{sleep:?} for a deadline a second away"
        );
    }

    #[test]
    fn huge_advances_saturate() {
        let c = ManualClock::new(0);
        c.advance(Duration::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
        let s = SystemClock::new();
        assert!(s.sleep_for(0).unwrap().is_zero());
    }
}
