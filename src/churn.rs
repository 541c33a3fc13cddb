//! W1 (churn), W1x2 and W5 (scale) from BENCHMARKS.md: the cost of add and cancel with no
//! waiting, for every implementation in the same process.
//!
//! One thread adds `n` tasks with `delay_i = 1 + (rand_i % range)` ms (splitmix64, seed 42),
//! keeping the handles, then cancels the 90% with `i % 10 != 0`. Reported per phase: wall and
//! process-CPU nanoseconds per operation. Bytes per pending task come from [`rss_probe`], run in
//! a child process with `n` and with `0` tasks.
#![allow(clippy::disallowed_methods)] // the benchmark measures wall time

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::measure::{median, process_cpu_ns};
use crate::rng::SplitMix64;

/// Something W1 can add to and cancel from.
pub trait ChurnTarget {
    /// What `add` returns and `cancel` takes.
    type Handle;
    /// Schedules task `id` to fire `delay_ms` from now.
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle;
    /// Cancels a task; true if it was pending.
    fn cancel(&mut self, handle: &Self::Handle) -> bool;
    /// Pending tasks (to check the run did what it claims).
    fn len(&self) -> usize;
    /// True when nothing is pending.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Brings the structure to the state of a long-lived one: fills it with `delays` and empties
    /// it again, so the measured run reuses memory the structure already owns (no first-touch
    /// page faults). Default: add everything, cancel everything.
    fn warm_up(&mut self, delays: &[u64]) {
        let hs: Vec<Self::Handle> = delays
            .iter()
            .enumerate()
            .map(|(i, &d)| self.add(d, i as u64))
            .collect();
        for h in &hs {
            self.cancel(h);
        }
    }
    /// False for targets on a real clock, where a task with a short delay may fire during the
    /// run (so a few cancels lose: only tasks whose delay ran out may, see [`not_yet_due`]).
    const EXACT: bool = true;
}

/// The implementations W1 knows, by name.
pub const IMPLS: &[&str] = &[
    "wheel",
    "concurrent-wheel",
    "system-timer",
    "system-timer-typed",
    "system-timer-keyed",
    "delay-queue",
    "binary-heap",
];

/// Per-phase figures of one W1 run.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChurnFigures {
    /// Wall ns per add.
    pub add_ns: f64,
    /// Wall ns per cancel.
    pub cancel_ns: f64,
    /// Process CPU ns per add (all threads).
    pub add_cpu_ns: f64,
    /// Process CPU ns per cancel (all threads).
    pub cancel_cpu_ns: f64,
}

impl ChurnFigures {
    /// Per-field medians of several runs.
    pub fn median(runs: &[ChurnFigures]) -> ChurnFigures {
        let m = |g: fn(&ChurnFigures) -> f64| median(&runs.iter().map(g).collect::<Vec<_>>());
        ChurnFigures {
            add_ns: m(|f| f.add_ns),
            cancel_ns: m(|f| f.cancel_ns),
            add_cpu_ns: m(|f| f.add_cpu_ns),
            cancel_cpu_ns: m(|f| f.cancel_cpu_ns),
        }
    }
}

/// Which phase [`time_chunked`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Time the adds (the cancels that undo them are untimed).
    Add,
    /// Time the cancels (the adds that feed them are untimed).
    Cancel,
}

/// For benches: performs `iters` operations on `state` in chunks of at most `chunk`, each chunk
/// adding then cancelling what it added (so the structure's size stays put however many
/// iterations criterion asks for), and returns the time spent in the `timed` phase only. A
/// cancelled key (a handle, for some structures) is dropped inside the cancel phase, as a
/// caller would right after cancelling. `tidy` runs after each chunk, untimed: for structures
/// whose cancel leaves garbage behind (a lazily cancelled heap), so that the size stays put
/// for them too.
pub fn time_chunked<S, K>(
    state: &mut S,
    iters: u64,
    chunk: u64,
    timed: Phase,
    add: impl FnMut(&mut S, u64) -> K,
    cancel: impl FnMut(&mut S, &K),
    tidy: impl FnMut(&mut S),
) -> Duration {
    time_chunked_on(Instant::now, state, iters, chunk, timed, add, cancel, tidy)
}

/// [`time_chunked`] on the clock `now` (a test's scripted one).
#[allow(clippy::too_many_arguments)]
fn time_chunked_on<S, K>(
    mut now: impl FnMut() -> Instant,
    state: &mut S,
    iters: u64,
    chunk: u64,
    timed: Phase,
    mut add: impl FnMut(&mut S, u64) -> K,
    mut cancel: impl FnMut(&mut S, &K),
    mut tidy: impl FnMut(&mut S),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(chunk.max(1));
        let t0 = now();
        let keys: Vec<K> = (0..n).map(|i| add(state, i)).collect();
        if timed == Phase::Add {
            total += now() - t0;
        }
        let t1 = now();
        for k in keys {
            cancel(state, &k);
        }
        if timed == Phase::Cancel {
            total += now() - t1;
        }
        tidy(state);
        left -= n;
    }
    total
}

/// The longest delay range the workloads accept, ms (about 116 days): tokio-util's
/// `DelayQueue`, a baseline everywhere, refuses (panics on) a deadline 2^36 ms or more after
/// its creation.
pub const MAX_RANGE_MS: u64 = 10_000_000_000;

/// The parser of `--range-ms`: 1 to [`MAX_RANGE_MS`].
pub fn range_ms() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::new().range(1..=MAX_RANGE_MS)
}

/// The delays of W1/W5: `1 + (rand_i % range_ms)`.
pub fn delays(n: usize, range_ms: u64) -> Vec<u64> {
    let mut rng = SplitMix64::new(42);
    (0..n).map(|_| 1 + rng.next() % range_ms).collect()
}

/// The header of W5's last column: the cost at the last size over the cost at the first (a power
/// of ten written `10^k`).
pub fn scale_ratio_label(sizes: &[usize]) -> String {
    let name = |n: usize| {
        let k = n.checked_ilog10().unwrap_or(0);
        if 10usize.pow(k) == n {
            format!("10^{k}")
        } else {
            n.to_string()
        }
    };
    match (sizes.first(), sizes.last()) {
        (Some(&first), Some(&last)) => format!("{}/{}", name(last), name(first)),
        _ => "-".into(),
    }
}

/// Runs W1 once on `target`: the add phase, then the cancel phase.
pub fn run_once<C: ChurnTarget>(target: &mut C, delays: &[u64]) -> ChurnFigures {
    let n = delays.len();
    let mut handles = Vec::with_capacity(n);
    // None on a fresh or warmed-up target, except on a real clock a warm-up's task that fell due
    // and still waits for an executor (counted until it starts).
    let before = target.len();
    let cpu0 = process_cpu_ns();
    let t0 = Instant::now();
    for (i, &d) in delays.iter().enumerate() {
        handles.push(target.add(d, i as u64));
    }
    let add_wall = t0.elapsed();
    let cpu1 = process_cpu_ns();
    if C::EXACT {
        assert_eq!(target.len(), n, "add phase lost tasks");
    }
    // The 10% kept, moved aside (into room reserved now); a cancelled handle is dropped in the
    // cancel phase, as a caller would right after cancelling (a `Copy` key costs nothing to
    // drop, a counted handle does).
    let mut kept = Vec::with_capacity(n.div_ceil(10));
    let t1 = Instant::now();
    let mut cancelled = 0usize;
    // The tasks whose cancel failed (none on an exact target; on a real clock, the few that
    // fell due first): no allocation unless one does.
    let mut failed = Vec::new();
    // `drain`, not `into_iter`: the vector's buffer (megabytes) is freed after the phase.
    for (i, h) in handles.drain(..).enumerate() {
        if i % 10 != 0 {
            if target.cancel(&h) {
                cancelled += 1;
            } else {
                failed.push(i);
            }
        } else {
            kept.push(h);
        }
    }
    let cancel_wall = t1.elapsed();
    let cpu2 = process_cpu_ns();
    let expected = check_cancel_phase(
        C::EXACT,
        delays,
        cancelled,
        &failed,
        before,
        || target.len(),
        t0,
    );
    figures(n, expected, add_wall, cancel_wall, [cpu0, cpu1, cpu2])
}

/// W1's figures from a run's readings: `n` adds and `cancels` cancels, the phases' wall times,
/// and the process CPU clock before the adds, between the phases and after the cancels.
fn figures(
    n: usize,
    cancels: usize,
    add_wall: Duration,
    cancel_wall: Duration,
    [cpu0, cpu1, cpu2]: [u64; 3],
) -> ChurnFigures {
    let n_cancel = cancels.max(1) as f64;
    let n = n.max(1) as f64;
    ChurnFigures {
        add_ns: add_wall.as_nanos() as f64 / n,
        cancel_ns: cancel_wall.as_nanos() as f64 / n_cancel,
        add_cpu_ns: (cpu1 - cpu0) as f64 / n,
        cancel_cpu_ns: (cpu2 - cpu1) as f64 / n_cancel,
    }
}

/// The checks after W1's and W1x2's cancel phase (`cancelled` of the cancels won, those of
/// the tasks in `failed` did not, `before` tasks were pending before the first add at
/// `first_add`, `len` reads the structure's count); returns the cancels expected to win.
///
/// On an exact target (a manual clock: nothing fires) every cancel must win and the count
/// must be the kept tasks: a cancel that said it won but left its task pending passed on its
/// return values alone. On a real clock only a task whose delay ran out may beat its cancel
/// (see [`not_yet_due`]), and the count is bounded as the clock allows: kept tasks may have
/// fired, but none not yet due, and none whose cancel won (unchecked, a cancel that said it
/// won but left its task pending passed, and so did kept tasks lost).
pub(crate) fn check_cancel_phase(
    exact: bool,
    delays: &[u64],
    cancelled: usize,
    failed: &[usize],
    before: usize,
    len: impl FnOnce() -> usize,
    first_add: Instant,
) -> usize {
    let n = delays.len();
    let expected = n - n.div_ceil(10);
    if exact {
        assert_eq!(cancelled, expected, "cancel phase missed tasks");
        assert_eq!(len(), n - expected, "tasks lost or left over");
        return expected;
    }
    // Read before `ran`: a task not yet due when `ran` was taken was not due here either.
    let pending = len();
    let ran = first_add.elapsed();
    let lost = not_yet_due(delays, failed, ran);
    assert!(
        lost == 0,
        "cancel phase missed tasks: {lost} of the {} failed cancels (of {expected}) were of \
         tasks not yet due",
        failed.len()
    );
    assert!(
        pending <= before + n - cancelled,
        "tasks left over: {pending} pending after {cancelled} of {n} cancels won ({before} \
         pending before the run)"
    );
    let kept_not_due = count_not_yet_due(delays, (0..n).step_by(10), ran);
    assert!(
        pending >= kept_not_due,
        "tasks lost: {pending} pending, but {kept_not_due} kept tasks were not yet due"
    );
    expected
}

/// How many of the tasks in `failed` (indices into `delays`, tasks W1 cancelled and whose cancel
/// failed) could not have fired before their cancel on a target on a real clock, `ran` after
/// the first add: those whose delay had not run out within `ran`, plus a tick (1 ms) for a
/// clock counted in ticks. Each is a lost task. (Comparing counts, failed cancels against the
/// tasks that could have fallen due, let a lost task through whenever a short task's cancel
/// had won: a timer fires late, so most do.)
pub fn not_yet_due(delays: &[u64], failed: &[usize], ran: Duration) -> usize {
    count_not_yet_due(delays, failed.iter().copied(), ran)
}

/// How many of `tasks` (indices into `delays`) had not yet fallen due `ran` after the first add,
/// plus a tick, as in [`not_yet_due`]: none of them can have fired.
fn count_not_yet_due(
    delays: &[u64],
    tasks: impl IntoIterator<Item = usize>,
    ran: Duration,
) -> usize {
    let ran = ran + Duration::from_millis(1);
    tasks
        .into_iter()
        .filter(|&i| Duration::from_millis(delays[i]) > ran)
        .count()
}

/// How long a new target is left before its run is timed (see [`settle`]).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Spins for `SETTLE` (20 ms), between building a target and timing it. The threads a timer
/// starts (its reaper, its executors) start up then, not inside the clocks: their start-up CPU
/// was counted in the add phase, a fixed cost that at W5's 10^4 tasks made the timers' add two
/// to three times dearer than at 10^5. A spin, not a sleep, so that the timing starts on a busy
/// core, as it did before.
pub fn settle() {
    let start = Instant::now();
    while start.elapsed() < SETTLE {
        std::hint::spin_loop();
    }
}

/// Runs W1 `runs` times on fresh targets from `make` (warmed up first if `warm`) and returns
/// the per-field medians.
pub fn run_median<C: ChurnTarget>(
    runs: usize,
    delays: &[u64],
    warm: bool,
    mut make: impl FnMut() -> C,
) -> ChurnFigures {
    let all: Vec<ChurnFigures> = (0..runs.max(1))
        .map(|_| {
            let mut t = make();
            if warm {
                t.warm_up(delays);
            }
            settle();
            let f = run_once(&mut t, delays);
            drop(t);
            f
        })
        .collect();
    ChurnFigures::median(&all)
}

// ===== targets =====

/// The single-threaded `TimingWheel` at time 0 (tick 1 ms, size 20), payload = task id.
#[derive(Debug)]
pub struct WheelTarget(pub timing_wheel::TimingWheel<u64>);

impl WheelTarget {
    /// Kafka's configuration: tick 1 ms, wheel size 20.
    pub fn new() -> Self {
        WheelTarget(timing_wheel::TimingWheel::new(1, 20, 0).expect("valid config"))
    }
}

impl Default for WheelTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl ChurnTarget for WheelTarget {
    type Handle = timing_wheel::EntryKey;
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0.add(delay_ms, id).expect("future deadline")
    }
    #[inline]
    fn cancel(&mut self, h: &Self::Handle) -> bool {
        self.0.cancel(*h).is_some()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The sharded `ConcurrentWheel` used through `&self` (locks taken), payload = task id.
#[derive(Debug)]
pub struct ConcurrentWheelTarget(pub timing_wheel::ConcurrentWheel<u64>);

impl ConcurrentWheelTarget {
    /// Kafka's configuration: tick 1 ms, wheel size 20, default shards.
    pub fn new() -> Self {
        ConcurrentWheelTarget(timing_wheel::ConcurrentWheel::new(1, 20, 0).expect("valid config"))
    }
}

impl Default for ConcurrentWheelTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl ChurnTarget for ConcurrentWheelTarget {
    type Handle = timing_wheel::EntryHandle<u64>;
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0.add(delay_ms, id).expect("future deadline").handle
    }
    #[inline]
    fn cancel(&mut self, h: &Self::Handle) -> bool {
        h.cancel().is_some()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The baseline: std `BinaryHeap` of `(deadline, id)` with lazy cancel (a flag per id; the heap
/// keeps cancelled entries until they would be popped).
#[derive(Debug, Default)]
pub struct HeapTarget {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    cancelled: Vec<bool>,
}

impl ChurnTarget for HeapTarget {
    type Handle = u64;
    fn warm_up(&mut self, delays: &[u64]) {
        for (i, &d) in delays.iter().enumerate() {
            self.add(d, i as u64);
        }
        // Lazy cancel would leave the entries in the heap: empty it, keeping the capacity.
        self.heap.clear();
        self.cancelled.iter_mut().for_each(|c| *c = false);
    }
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> u64 {
        self.heap.push(Reverse((delay_ms, id)));
        if self.cancelled.len() <= id as usize {
            self.cancelled.resize(id as usize + 1, false);
        }
        id
    }
    #[inline]
    fn cancel(&mut self, h: &u64) -> bool {
        let c = &mut self.cancelled[*h as usize];
        let won = !*c;
        *c = true;
        won
    }
    /// The heap's entries not flagged cancelled, counted (a scan: only the untimed checks call
    /// it; a counter kept from `cancel`'s answers would only repeat what the check already
    /// asserted of them).
    fn len(&self) -> usize {
        self.heap
            .iter()
            .filter(|Reverse((_, id))| !self.cancelled[*id as usize])
            .count()
    }
}

/// A task W1 can schedule: built from the task id.
pub trait FromId: system_timer::TimerTask {
    /// The task for task `id`.
    fn from_id(id: u64) -> Self;
}

impl FromId for system_timer::Task {
    fn from_id(id: u64) -> Self {
        system_timer::Task::new(move || {
            std::hint::black_box(id);
        })
    }
}

/// A task that is just an id: what `system-timer-typed` schedules (no boxing).
#[derive(Debug)]
pub struct IdTask(pub u64);

impl system_timer::TimerTask for IdTask {
    fn run(self) {
        std::hint::black_box(self.0);
    }
}

impl FromId for IdTask {
    fn from_id(id: u64) -> Self {
        IdTask(id)
    }
}

/// The `SystemTimer` with its defaults (tick 1 ms, wheel 20, reaper and one executor thread on
/// the system clock), scheduling tasks of type `T`.
#[derive(Debug)]
pub struct SystemTimerTarget<T: system_timer::TimerTask>(pub system_timer::SystemTimer<T>);

/// `system-timer`: boxed closures that capture the task id (the default task type).
pub type TimerTarget = SystemTimerTarget<system_timer::Task>;
/// `system-timer-typed`: a task type of its own ([`IdTask`]), no box per task.
pub type TypedTimerTarget = SystemTimerTarget<IdTask>;

impl<T: FromId> SystemTimerTarget<T> {
    /// Kafka's configuration.
    pub fn new() -> Self {
        SystemTimerTarget(system_timer::Builder::new().build())
    }
}

impl<T: FromId> Default for SystemTimerTarget<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: FromId> ChurnTarget for SystemTimerTarget<T> {
    type Handle = system_timer::TimerHandle<T>;
    const EXACT: bool = false;
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0
            .add(Duration::from_millis(delay_ms), T::from_id(id))
            .expect("timer running")
    }
    #[inline]
    fn cancel(&mut self, h: &Self::Handle) -> bool {
        h.cancel()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// `system-timer-keyed`: the typed timer through its key API ([`system_timer::TimerKey`]: no
/// reference count per task, nothing to drop), the counterpart of `DelayQueue`'s keys.
#[derive(Debug)]
pub struct KeyedTimerTarget(pub system_timer::SystemTimer<IdTask>);

impl KeyedTimerTarget {
    /// Kafka's configuration.
    pub fn new() -> Self {
        KeyedTimerTarget(system_timer::Builder::new().build())
    }
}

impl Default for KeyedTimerTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl ChurnTarget for KeyedTimerTarget {
    type Handle = system_timer::TimerKey;
    const EXACT: bool = false;
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0
            .add_keyed(Duration::from_millis(delay_ms), IdTask(id))
            .expect("timer running")
    }
    #[inline]
    fn cancel(&mut self, h: &Self::Handle) -> bool {
        self.0.cancel(*h)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// tokio-util's `DelayQueue<u64>` (insert with a timeout, remove by key), inside a current-thread
/// tokio runtime context (its timer needs one). The peer BENCHMARKS.md measures.
#[derive(Debug)]
pub struct DelayQueueTarget {
    queue: tokio_util::time::DelayQueue<u64>,
    _guard_rt: Box<tokio::runtime::Runtime>,
    /// Times an operation entered the runtime's context.
    enters: u64,
}

impl DelayQueueTarget {
    /// An empty queue in a fresh runtime.
    pub fn new() -> Self {
        let rt = Box::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("tokio runtime"),
        );
        let queue = {
            let _g = rt.enter();
            tokio_util::time::DelayQueue::new()
        };
        DelayQueueTarget {
            queue,
            _guard_rt: rt,
            enters: 0,
        }
    }
}

impl Default for DelayQueueTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl ChurnTarget for DelayQueueTarget {
    type Handle = tokio_util::time::delay_queue::Key;
    #[inline]
    fn add(&mut self, delay_ms: u64, id: u64) -> Self::Handle {
        // A DelayQueue user runs inside its runtime, where the context costs nothing per insert.
        // The queue needs the context only to create its `Sleep`, which (with no polling, as
        // here) it does on an insert into an empty queue; an earlier deadline resets the `Sleep`
        // it has (its driver handle is stored in it), and a cancel never creates one. Entering
        // on every insert (a handle clone and a thread-local swap) was harness cost charged to
        // this baseline alone.
        let _g = self.queue.is_empty().then(|| {
            self.enters += 1;
            self._guard_rt.enter()
        });
        self.queue.insert(id, Duration::from_millis(delay_ms))
    }
    #[inline]
    fn cancel(&mut self, h: &Self::Handle) -> bool {
        // `try_remove` returns None for a key already expired or removed (no panic).
        self.queue.try_remove(h).is_some()
    }
    /// The queue's own count (nothing is polled in W1, so nothing expires out of it).
    fn len(&self) -> usize {
        self.queue.len()
    }
}

/// Adds `n` tasks to implementation `name` and returns the peak RSS: what the parent compares
/// against the same probe with `n = 0` for bytes per pending task (handles included).
pub fn rss_probe(name: &str, n: usize, range_ms: u64) -> u64 {
    // Delays are drawn on the fly: only the structure and its handles may count.
    fn fill<C: ChurnTarget>(mut t: C, n: usize, range_ms: u64) -> u64 {
        let mut rng = SplitMix64::new(42);
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            handles.push(t.add(1 + rng.next() % range_ms, i as u64));
        }
        let peak = crate::measure::peak_rss_bytes();
        std::hint::black_box((&handles, &t));
        peak
    }
    match name {
        "wheel" => fill(WheelTarget::new(), n, range_ms),
        "concurrent-wheel" => fill(ConcurrentWheelTarget::new(), n, range_ms),
        "binary-heap" => fill(HeapTarget::default(), n, range_ms),
        "system-timer" => fill(TimerTarget::new(), n, range_ms),
        "system-timer-typed" => fill(TypedTimerTarget::new(), n, range_ms),
        "system-timer-keyed" => fill(KeyedTimerTarget::new(), n, range_ms),
        "delay-queue" => fill(DelayQueueTarget::new(), n, range_ms),
        other => panic!("unknown implementation {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_ratio_is_labelled_with_the_sizes_it_divides() {
        // W5 prints last / first: the header must name those sizes, not the default ones.
        assert_eq!(
            scale_ratio_label(&[10_000, 100_000, 1_000_000, 10_000_000]),
            "10^7/10^4"
        );
        assert_eq!(scale_ratio_label(&[10_000, 20_000]), "20000/10^4");
        assert_eq!(scale_ratio_label(&[1_000_000, 1000]), "10^3/10^6");
    }

    /// The benches' chunks: `iters` operations in chunks of at most `chunk`, each adding then
    /// cancelling its own keys, tidied after; the time is the timed phase's alone (here on a
    /// scripted clock: an add takes 1 s, a cancel 1 ms).
    #[test]
    fn time_chunked_adds_and_cancels_in_chunks_and_times_one_phase() {
        let clock = std::cell::Cell::new(Instant::now());
        let tick = |d: Duration| clock.set(clock.get() + d);
        for (timed, want) in [
            (Phase::Add, Duration::from_secs(25)),
            (Phase::Cancel, Duration::from_millis(25)),
        ] {
            // Each chunk's log: the keys added, then those cancelled, then a tidy (None).
            let mut log: Vec<Option<u64>> = Vec::new();
            let total = time_chunked_on(
                || clock.get(),
                &mut log,
                25,
                10,
                timed,
                |log, i| {
                    tick(Duration::from_secs(1));
                    log.push(Some(i));
                    i
                },
                |log, &k| {
                    tick(Duration::from_millis(1));
                    log.push(Some(100 + k));
                },
                |log| {
                    assert!(log.len() < 100, "more chunks than the 3 asked for");
                    log.push(None)
                },
            );
            assert_eq!(total, want, "{timed:?}");
            let chunk = |n: u64| {
                (0..n)
                    .map(Some)
                    .chain((100..100 + n).map(Some))
                    .chain([None])
            };
            let want_log: Vec<_> = chunk(10).chain(chunk(10)).chain(chunk(5)).collect();
            assert_eq!(log, want_log, "{timed:?}");
        }
    }

    /// W1's figures: each phase's wall and CPU time over its own operations (the adds, and
    /// the cancels expected to win).
    #[test]
    fn w1s_figures_are_each_phases_time_over_its_operations() {
        let f = figures(
            4,
            2,
            Duration::from_nanos(400),
            Duration::from_nanos(100),
            [1_000, 1_800, 2_000],
        );
        assert_eq!(
            (f.add_ns, f.cancel_ns, f.add_cpu_ns, f.cancel_cpu_ns),
            (100.0, 50.0, 200.0, 100.0)
        );
    }

    /// The longest delay the workloads accept is one every target takes, warmed up too (the
    /// delay queue counts a deadline from its creation). And every target's count is its
    /// pending tasks, a cancel taking out its own task once: W1's checks read both (on a real
    /// clock only as bounds, which a count stuck at 1 passed in this 3-task run).
    #[test]
    fn every_target_takes_the_longest_delay_and_counts_its_tasks() {
        let d = [MAX_RANGE_MS, 1, MAX_RANGE_MS];
        fn check<C: ChurnTarget>(mut t: C, d: &[u64]) {
            let hs: Vec<C::Handle> = (0..3).map(|i| t.add(60_000, i)).collect();
            assert_eq!(t.len(), 3);
            assert!(t.cancel(&hs[1]), "a pending task's cancel wins");
            assert_eq!(t.len(), 2);
            assert!(!t.cancel(&hs[1]), "a cancelled task's cancel loses");
            assert_eq!(t.len(), 2);
            assert!(t.cancel(&hs[0]) && t.cancel(&hs[2]));
            assert_eq!(t.len(), 0);
            t.warm_up(d);
            run_once(&mut t, d);
        }
        check(WheelTarget::new(), &d);
        check(ConcurrentWheelTarget::new(), &d);
        check(HeapTarget::default(), &d);
        check(TimerTarget::new(), &d);
        check(TypedTimerTarget::new(), &d);
        check(KeyedTimerTarget::new(), &d);
        check(DelayQueueTarget::new(), &d);
    }

    /// W1's and W5's delays are BENCHMARKS.md's: `1 + (rand_i % range)`, splitmix64 seeded
    /// with 42 (its outputs 0xBDD732262FEB6E95, 0x28EFE333B266F103, 0x47526757130F9F52,
    /// 0x581CE1FF0E4AE394, modulo 30,000, plus one).
    #[test]
    fn the_delays_are_the_benchmarks() {
        assert_eq!(delays(4, 30_000), [5414, 22292, 3859, 25765]);
        assert_eq!(delays(2, 1), [1, 1]);
    }

    /// A task counted in ticks may fire up to a tick (1 ms) before its delay has run out: a
    /// failed cancel of a task due within the run plus a tick is the clock's doing, one due
    /// later a lost task.
    #[test]
    fn only_a_task_due_after_the_run_and_a_tick_counts_as_not_yet_due() {
        let d = [5, 5, 6];
        let ran = Duration::from_millis(4);
        assert_eq!(
            not_yet_due(&d, &[0, 1], ran),
            0,
            "due at 5 ms, within 4 ms and a tick"
        );
        assert_eq!(not_yet_due(&d, &[0, 2], ran), 1, "due at 6 ms");
        let just_before = ran - Duration::from_nanos(1);
        assert_eq!(not_yet_due(&d, &[0, 1, 2], just_before), 3);
    }

    #[test]
    fn the_median_figures_are_each_fields_median() {
        let f = |add_ns, cancel_ns, add_cpu_ns, cancel_cpu_ns| ChurnFigures {
            add_ns,
            cancel_ns,
            add_cpu_ns,
            cancel_cpu_ns,
        };
        let runs = [
            f(1.0, 40.0, 300.0, 2000.0),
            f(3.0, 10.0, 100.0, 3000.0),
            f(2.0, 20.0, 200.0, 1000.0),
        ];
        let m = ChurnFigures::median(&runs);
        assert_eq!(
            (m.add_ns, m.cancel_ns, m.add_cpu_ns, m.cancel_cpu_ns),
            (2.0, 20.0, 200.0, 2000.0)
        );
    }

    /// An exact target that counts its warm-ups in `warmed` (and does nothing else for them).
    struct CountsWarmUps<'a> {
        len: usize,
        warmed: &'a std::cell::Cell<usize>,
    }

    impl ChurnTarget for CountsWarmUps<'_> {
        type Handle = ();
        fn add(&mut self, _delay_ms: u64, _id: u64) {
            self.len += 1;
        }
        fn cancel(&mut self, _h: &()) -> bool {
            self.len -= 1;
            true
        }
        fn len(&self) -> usize {
            self.len
        }
        fn warm_up(&mut self, _delays: &[u64]) {
            self.warmed.set(self.warmed.get() + 1);
        }
    }

    /// W1's figures are medians of `runs` runs (at least one), each on a fresh target, warmed
    /// up first only when asked.
    #[test]
    fn run_median_runs_each_run_on_a_fresh_target_warmed_up_when_asked() {
        let d = delays(100, 30_000);
        for (runs, warm, targets, warm_ups) in [(3, true, 3, 3), (2, false, 2, 0), (0, true, 1, 1)]
        {
            let (made, warmed) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
            let f = run_median(runs, &d, warm, || {
                made.set(made.get() + 1);
                CountsWarmUps {
                    len: 0,
                    warmed: &warmed,
                }
            });
            assert_eq!(
                (made.get(), warmed.get()),
                (targets, warm_ups),
                "{runs} {warm}"
            );
            assert!(f.add_ns.is_finite() && f.cancel_ns.is_finite());
        }
    }

    /// The heap's warm-up leaves it empty but owning the room of the run (its lazy cancel
    /// would leave the entries in: the default warm-up does not empty it).
    #[test]
    fn a_warmed_up_heap_is_empty_and_owns_the_runs_memory() {
        let d = delays(1_000, 30_000);
        let mut t = HeapTarget::default();
        t.warm_up(&d);
        assert_eq!((t.len(), t.heap.len()), (0, 0));
        assert!(t.heap.capacity() >= d.len() && t.cancelled.len() >= d.len());
        assert!(t.cancelled.iter().all(|c| !c), "no task flagged cancelled");
        run_once(&mut t, &d);
    }

    /// The RSS probe fills a target with W1's delays (the wheel refuses a delay of 0, the
    /// delay queue one of 2^36 ms or more) and returns the process's peak RSS (megabytes).
    #[test]
    fn the_rss_probe_adds_w1s_delays_and_returns_the_peak_rss() {
        for name in ["wheel", "delay-queue"] {
            let peak = rss_probe(name, 1_000, 5);
            assert!(peak >= 1 << 20, "{name}: {peak} bytes");
        }
    }

    #[test]
    fn the_delay_queue_enters_its_runtime_only_to_create_its_sleep() {
        // A DelayQueue user runs inside the runtime: its context costs nothing per insert. The
        // queue needs it only to create its `Sleep` (an insert into an empty queue); entering on
        // every insert is harness work the other targets do not pay.
        let d = delays(1000, 30_000);
        let mut t = DelayQueueTarget::new();
        let f = run_once(&mut t, &d);
        assert!(f.add_ns > 0.0);
        assert_eq!(t.enters, 1, "one Sleep created for 1000 inserts");
        // Warmed up (filled and emptied: no Sleep left), the next insert enters again, once.
        let mut t = DelayQueueTarget::new();
        t.warm_up(&d);
        assert_eq!(t.enters, 1);
        run_once(&mut t, &d);
        assert_eq!(t.enters, 2);
    }

    /// A target on a real clock (as the system timers), modelled exactly: a task fires (leaves
    /// the count) once its deadline (the instant of its add plus its delay) has passed, and a
    /// cancel loses only to such a task, except that every `lose_every`-th cancel loses anyway
    /// (a lost task); the first cancel waits `stall` (a busy machine), so that the short tasks
    /// fall due first.
    struct Clocked {
        due: Vec<Instant>,
        /// Per task: its cancel won.
        cancelled: Vec<bool>,
        lose_every: usize,
        stall: Duration,
        cancels: usize,
    }

    impl Clocked {
        fn new(lose_every: usize, stall: Duration) -> Self {
            Clocked {
                due: Vec::new(),
                cancelled: Vec::new(),
                lose_every,
                stall,
                cancels: 0,
            }
        }
    }

    impl ChurnTarget for Clocked {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&mut self, delay_ms: u64, id: u64) -> usize {
            self.due
                .push(Instant::now() + Duration::from_millis(delay_ms));
            self.cancelled.push(false);
            id as usize
        }
        fn cancel(&mut self, h: &usize) -> bool {
            if self.cancels == 0 {
                std::thread::sleep(self.stall);
            }
            self.cancels += 1;
            let lost = self.lose_every > 0 && self.cancels.is_multiple_of(self.lose_every);
            let won = !lost && Instant::now() < self.due[*h];
            self.cancelled[*h] |= won;
            won
        }
        fn len(&self) -> usize {
            let now = Instant::now();
            (0..self.due.len())
                .filter(|&i| !self.cancelled[i] && self.due[i] > now)
                .count()
        }
    }

    /// A cancel that fails on a task whose delay has not run out is a lost task, however few:
    /// the check let through up to 2% of the cancels failing whatever their delays (here 1%,
    /// of tasks due in up to 30 s, in a run of milliseconds).
    #[test]
    fn a_lost_cancel_fails_w1_on_a_real_clock_target() {
        let d = delays(10_000, 30_000);
        let run = std::panic::catch_unwind(|| run_once(&mut Clocked::new(100, Duration::ZERO), &d));
        assert!(run.is_err(), "90 lost cancels of 9000 passed");
    }

    /// A target whose cancel says it won but leaves the task pending (its count shows it).
    #[derive(Default)]
    struct KeepsCancelled {
        len: usize,
    }

    impl ChurnTarget for KeepsCancelled {
        type Handle = ();
        fn add(&mut self, _delay_ms: u64, _id: u64) {
            self.len += 1;
        }
        fn cancel(&mut self, _h: &()) -> bool {
            true
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    /// W1 checked a cancel only by what it returned; W1x2 also checks the structure's count
    /// after the phase. A cancel that left every task pending passed W1.
    #[test]
    fn a_cancel_that_leaves_its_task_pending_fails_w1() {
        let d = delays(1_000, 30_000);
        let run = std::panic::catch_unwind(|| run_once(&mut KeepsCancelled::default(), &d));
        assert!(run.is_err(), "900 cancels that removed nothing passed");
    }

    /// A real-clock target whose cancels of a few long tasks (due in 100 s) fail, in a run
    /// where many short tasks (due in 1 ms) could have fired first but did not (a timer fires
    /// late: their cancels won). The check compared counts, lost cancels against tasks that
    /// could have fired, so the 10 lost tasks passed under the 4,000 short ones' allowance.
    struct LosesLong {
        delay: Vec<u64>,
        stalled: bool,
        len: usize,
    }

    impl ChurnTarget for LosesLong {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&mut self, delay_ms: u64, id: u64) -> usize {
            self.delay.push(delay_ms);
            self.len += 1;
            id as usize
        }
        fn cancel(&mut self, h: &usize) -> bool {
            if !self.stalled {
                // Long enough for the short tasks to fall due.
                std::thread::sleep(Duration::from_millis(20));
                self.stalled = true;
            }
            let won = !(self.delay[*h] >= 100_000 && *h % 1000 == 1);
            self.len -= usize::from(won);
            won
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn a_lost_cancel_of_a_task_not_yet_due_fails_w1_whatever_else_fell_due() {
        // Even tasks due in 1 ms, odd ones in 100 s.
        let d: Vec<u64> = (0..10_000)
            .map(|i| if i % 2 == 0 { 1 } else { 100_000 })
            .collect();
        let run = std::panic::catch_unwind(|| {
            run_once(
                &mut LosesLong {
                    delay: Vec::new(),
                    stalled: false,
                    len: 0,
                },
                &d,
            )
        });
        assert!(run.is_err(), "10 lost cancels of tasks due in 100 s passed");
    }

    /// Cancels lost to tasks that fell due before them are what a real clock does: the check
    /// failed the run (a panic in the child: `w1 --range-ms 10` on a system timer) once they
    /// were more than 2% of the cancels.
    #[test]
    fn cancels_lost_to_tasks_already_due_pass_w1() {
        let d = delays(2_000, 5);
        let f = run_once(&mut Clocked::new(0, Duration::from_millis(20)), &d);
        assert!(f.cancel_ns > 0.0);
    }

    /// [`KeepsCancelled`] on a real clock, where W1 skipped the structure's count (a task may
    /// fire during the run): its 900 cancels that removed nothing passed, as they would on the
    /// system timers, W5's subjects.
    #[derive(Default)]
    struct KeepsCancelledOnAClock(KeepsCancelled);

    impl ChurnTarget for KeepsCancelledOnAClock {
        type Handle = ();
        const EXACT: bool = false;
        fn add(&mut self, delay_ms: u64, id: u64) {
            self.0.add(delay_ms, id);
        }
        fn cancel(&mut self, h: &()) -> bool {
            self.0.cancel(h)
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn a_cancel_that_leaves_its_task_pending_fails_w1_on_a_real_clock_target() {
        let d = delays(1_000, 30_000);
        let run = std::panic::catch_unwind(|| run_once(&mut KeepsCancelledOnAClock::default(), &d));
        assert!(run.is_err(), "900 cancels that removed nothing passed");
    }

    /// A real-clock target whose cancels win, each taking the kept task before it (`i - 1`,
    /// with `i % 10 == 1`) out with its own: the 100 kept tasks, due in up to 30 s, are lost
    /// (its count shows it), yet every cancel said what it should.
    #[derive(Default)]
    struct CancelTakesKept {
        len: usize,
    }

    impl ChurnTarget for CancelTakesKept {
        type Handle = u64;
        const EXACT: bool = false;
        fn add(&mut self, _delay_ms: u64, id: u64) -> u64 {
            self.len += 1;
            id
        }
        fn cancel(&mut self, h: &u64) -> bool {
            self.len -= 1 + usize::from(h % 10 == 1);
            true
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn kept_tasks_lost_before_they_were_due_fail_w1_on_a_real_clock_target() {
        let d = delays(1_000, 30_000);
        let run = std::panic::catch_unwind(|| run_once(&mut CancelTakesKept::default(), &d));
        assert!(run.is_err(), "100 kept tasks lost passed");
    }

    /// A real-clock target with tasks of an earlier run still counted (a warm-up's, fallen due
    /// and waiting for an executor): they are not the run's, and do not fail it.
    struct Leftovers(Clocked, usize);

    impl ChurnTarget for Leftovers {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&mut self, delay_ms: u64, id: u64) -> usize {
            self.0.add(delay_ms, id)
        }
        fn cancel(&mut self, h: &usize) -> bool {
            self.0.cancel(h)
        }
        fn len(&self) -> usize {
            self.0.len() + self.1
        }
    }

    #[test]
    fn tasks_pending_before_the_run_pass_w1_on_a_real_clock_target() {
        let d = vec![100_000; 1_000];
        run_once(&mut Leftovers(Clocked::new(0, Duration::ZERO), 5), &d);
    }

    /// On a real clock the kept tasks that fell due have fired: fewer pending than kept is
    /// what the clock does, not a loss (the kept tasks due in 1 ms fire during the stall; those
    /// due in 100 s stay).
    #[test]
    fn kept_tasks_that_fell_due_pass_w1_on_a_real_clock_target() {
        let d: Vec<u64> = (0..2_000)
            .map(|i| if i % 20 == 0 { 1 } else { 100_000 })
            .collect();
        let mut t = Clocked::new(0, Duration::from_millis(20));
        run_once(&mut t, &d);
        assert_eq!(t.len(), 100, "the kept tasks due in 100 s");
    }
}
