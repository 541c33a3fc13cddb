//! W2 expiry precision from BENCHMARKS.md: one thread adds N tasks (`delay_i = 1 + rand_i % 2000`
//! ms, splitmix64 seed 42) as fast as it can; each task records, when it runs,
//! `fire instant − (Instant::now() taken just before its add + delay)` in signed nanoseconds
//! (negative = early), and bumps a per-task counter (missing and duplicate fires).
//!
//! Reported per implementation: lateness p50 / p99 / p99.9 / max (exact, from the sorted
//! samples), early, missing and duplicate fires, and the process CPU from the first add until the
//! last fire (all threads, exited ones included: `CLOCK_PROCESS_CPUTIME_ID`, see
//! `measure::process_cpu_ns`). Implementations run one after another in one process.
//!
//! Also home of [`HeapTimer`], the `binary-heap-condvar` baseline W3 uses too.
#![allow(clippy::disallowed_methods)] // benchmark code: std threads and clocks on purpose
#![allow(clippy::disallowed_types)] // the baselines use std's Mutex and Condvar, on purpose

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use system_timer::{Builder, SystemTimer, Task, TimerTask};
use tokio_util::time::DelayQueue;

use crate::measure::{exit_status, machine_line, process_cpu_ns, while_stdout_taken};
use crate::out;

/// The implementations W2 knows, by name.
pub const IMPLS: &[&str] = &[
    "system-timer",
    "system-timer-inline",
    "system-timer-typed",
    "system-timer-typed-inline",
    "delay-queue",
    "binary-heap-condvar",
];

/// Flags of `w2`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Tasks to add (at most 10^8).
    #[arg(long, default_value_t = 100_000, value_parser = crate::measure::task_count(1))]
    pub n: usize,
    /// Delay range in ms (delay = 1 + rand % range), at least 1, at most an hour (the run
    /// waits for every task to fire).
    #[arg(long, default_value_t = 2_000,
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new()
              .range(1..=crate::measure::MAX_WAIT_MS))]
    pub range_ms: u64,
    /// After the last fire, wait this long for duplicate fires before shutting down (ms, at
    /// most an hour).
    #[arg(long, default_value_t = 200, value_parser = crate::measure::wait_ms())]
    pub grace_ms: u64,
    /// Give up waiting for missing fires this long after the longest delay has passed (ms, at
    /// most an hour).
    #[arg(long, default_value_t = 10_000, value_parser = crate::measure::wait_ms())]
    pub timeout_ms: u64,
    /// Implementations, comma separated.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(IMPLS),
          default_values_t = IMPLS.iter().map(|s| s.to_string()))]
    pub impls: Vec<String>,
}

// ===== the recorder =====

/// `a − b` in signed nanoseconds.
fn signed_ns(a: Instant, b: Instant) -> i64 {
    match a.checked_duration_since(b) {
        Some(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        None => -i64::try_from(b.duration_since(a).as_nanos()).unwrap_or(i64::MAX),
    }
}

/// What the tasks of one run record: fires per task, the first fire's lateness, and a wake-up
/// for the thread waiting for the last first fire.
#[derive(Debug)]
pub struct Recorder {
    fires: Box<[AtomicU32]>,
    late_ns: Box<[AtomicI64]>,
    /// Tasks that fired at least once.
    fired: AtomicUsize,
    waiter: Thread,
}

impl Recorder {
    /// A recorder for `n` tasks; the calling thread is the one [`wait_all`](Self::wait_all)
    /// wakes.
    pub fn new(n: usize) -> Self {
        Recorder {
            fires: (0..n).map(|_| AtomicU32::new(0)).collect(),
            late_ns: (0..n).map(|_| AtomicI64::new(0)).collect(),
            fired: AtomicUsize::new(0),
            waiter: std::thread::current(),
        }
    }

    /// Back to the state of a new recorder (no task fired), for the next implementation's run:
    /// call it only once nothing holds a task of the previous run (its implementation shut
    /// down: threads joined, pending tasks dropped).
    pub fn reset(&self) {
        for (f, l) in self.fires.iter().zip(self.late_ns.iter()) {
            f.store(0, Ordering::Relaxed);
            l.store(0, Ordering::Relaxed);
        }
        self.fired.store(0, Ordering::Release);
    }

    /// Task `id`, due at `due`, runs now.
    #[inline]
    pub fn fire(&self, id: usize, due: Instant) {
        let late = signed_ns(Instant::now(), due);
        if self.fires[id].fetch_add(1, Ordering::Relaxed) == 0 {
            self.late_ns[id].store(late, Ordering::Relaxed);
            // Release: whoever sees the count sees the lateness stored before it.
            if self.fired.fetch_add(1, Ordering::AcqRel) + 1 == self.fires.len() {
                self.waiter.unpark();
            }
        }
    }

    /// True once every task fired at least once.
    pub fn all_fired(&self) -> bool {
        self.fired.load(Ordering::Acquire) == self.fires.len()
    }

    /// Parks until every task fired at least once (true) or `deadline` passes (false).
    pub fn wait_all(&self, deadline: Instant) -> bool {
        while !self.all_fired() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
        true
    }

    /// The figures, once the runners are stopped.
    pub fn summary(&self) -> Precision {
        let mut late: Vec<i64> = Vec::with_capacity(self.fires.len());
        let (mut missing, mut duplicates) = (0u64, 0u64);
        for (f, l) in self.fires.iter().zip(self.late_ns.iter()) {
            match f.load(Ordering::Acquire) {
                0 => missing += 1,
                k => {
                    duplicates += u64::from(k - 1);
                    late.push(l.load(Ordering::Relaxed));
                }
            }
        }
        Precision::of(late, missing, duplicates)
    }
}

/// Lateness percentiles (nearest rank, exact) and fire counts of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Precision {
    /// Median lateness, ns.
    pub p50_ns: i64,
    /// 99th percentile, ns.
    pub p99_ns: i64,
    /// 99.9th percentile, ns.
    pub p999_ns: i64,
    /// Smallest lateness (negative: the earliest fire), ns.
    pub min_ns: i64,
    /// Largest lateness, ns.
    pub max_ns: i64,
    /// Tasks whose first fire came before their deadline.
    pub early: u64,
    /// Tasks that never fired.
    pub missing: u64,
    /// Fires beyond each task's first.
    pub duplicates: u64,
}

impl Precision {
    /// The figures of a run whose fired tasks were late by `late` (ns, each task's first
    /// fire), with `missing` tasks that never fired and `duplicates` fires beyond the first.
    fn of(mut late: Vec<i64>, missing: u64, duplicates: u64) -> Precision {
        late.sort_unstable();
        let q = |q: f64| -> i64 {
            if late.is_empty() {
                return 0;
            }
            let rank = ((q * late.len() as f64).ceil() as usize).clamp(1, late.len());
            late[rank - 1]
        };
        Precision {
            p50_ns: q(0.50),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            min_ns: late.first().copied().unwrap_or(0),
            max_ns: late.last().copied().unwrap_or(0),
            early: late.iter().take_while(|&&l| l < 0).count() as u64,
            missing,
            duplicates,
        }
    }

    /// Early, missing or duplicate fires.
    pub fn failed(&self) -> bool {
        self.early + self.missing + self.duplicates > 0
    }
}

// ===== the baseline heap timer (W2 and W3) =====

/// The `binary-heap-condvar` baseline: a std `BinaryHeap` of `(deadline, id)` behind a `Mutex`,
/// and one worker thread that waits on a `Condvar` until the earliest deadline (or, with a poll
/// interval, at most that long: Kafka's reaper), pops what is due and runs `on_fire(id, due)`
/// for it outside the lock. An add notifies the worker only when it pushes a new earliest.
#[derive(Debug)]
pub struct HeapTimer {
    shared: Arc<HeapShared>,
    worker: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct HeapShared {
    state: Mutex<HeapState>,
    cv: Condvar,
    /// Returns of the worker from a wait.
    wakeups: AtomicU64,
}

#[derive(Debug, Default)]
struct HeapState {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    stop: bool,
}

impl HeapTimer {
    /// Starts the worker. `poll`: wake at least this often even with nothing due (None: sleep
    /// until the earliest deadline, or until woken when the heap is empty).
    pub fn start(
        poll: Option<Duration>,
        on_fire: impl FnMut(u64, Instant) + Send + 'static,
    ) -> Self {
        let shared = Arc::new(HeapShared::default());
        let s = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("heap-timer".into())
            .spawn(move || s.work(poll, on_fire))
            .expect("spawn the heap timer's worker");
        HeapTimer {
            shared,
            worker: Some(worker),
        }
    }

    /// Schedules `id` at `due`.
    pub fn add(&self, due: Instant, id: u64) {
        let mut g = self.shared.state.lock().expect("not poisoned");
        let earliest = g.heap.peek().is_none_or(|Reverse((d, _))| due < *d);
        g.heap.push(Reverse((due, id)));
        drop(g);
        if earliest {
            self.shared.cv.notify_one();
        }
    }

    /// How many times the worker returned from a wait so far.
    pub fn wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::Relaxed)
    }

    /// Stops and joins the worker (entries still in the heap are dropped).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(w) = self.worker.take() {
            self.shared.state.lock().expect("not poisoned").stop = true;
            self.shared.cv.notify_one();
            w.join().expect("heap timer worker panicked");
        }
    }
}

impl Drop for HeapTimer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl HeapShared {
    fn work(&self, poll: Option<Duration>, mut on_fire: impl FnMut(u64, Instant)) {
        let mut due = Vec::new();
        let mut g = self.state.lock().expect("not poisoned");
        loop {
            if g.stop {
                return;
            }
            let now = Instant::now();
            while let Some(&Reverse((d, id))) = g.heap.peek() {
                if d > now {
                    break;
                }
                g.heap.pop();
                due.push((id, d));
            }
            if !due.is_empty() {
                drop(g);
                for (id, d) in due.drain(..) {
                    on_fire(id, d);
                }
                g = self.state.lock().expect("not poisoned");
                continue;
            }
            let until_next = g.heap.peek().map(|Reverse((d, _))| *d - now);
            let wait = match (until_next, poll) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            g = match wait {
                Some(w) => self.cv.wait_timeout(g, w).expect("not poisoned").0,
                None => self.cv.wait(g).expect("not poisoned"),
            };
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A current-thread tokio runtime with the time driver: where the `delay-queue` baselines live.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime")
}

// ===== the implementations =====

/// One implementation under W2: the harness adds every task, then waits for the fires.
trait Target {
    /// Schedules task `id` to run `delay` from now; `due` is the instant taken just before the
    /// call plus `delay`, for the task to record its lateness against.
    fn add(&mut self, id: u32, delay: Duration, due: Instant);
    /// Returns once every task fired (true) or `deadline` passed (false).
    fn wait(&mut self, rec: &Recorder, deadline: Instant) -> bool {
        rec.wait_all(deadline)
    }
    /// Anything worth a line under the table (before shutdown).
    fn note(&self) -> Option<String> {
        None
    }
    /// Stops the implementation's threads.
    fn shutdown(self);
}

/// The timer under W2, scheduling `T`: boxed closures through `add` (the default API), or
/// [`Fire`] tasks through `add_keyed` (a task type of its own: no box, no handle).
struct TimerRun<T: TimerTask> {
    timer: SystemTimer<T>,
    rec: &'static Recorder,
}

/// W2's task as a type of its own: what `DelayQueue` stores per entry, too.
struct Fire {
    id: u32,
    due: Instant,
    rec: &'static Recorder,
}

impl TimerTask for Fire {
    #[inline]
    fn run(self) {
        self.rec.fire(self.id as usize, self.due);
    }
}

/// How W2 schedules a task of each type on the timer.
trait W2Task: TimerTask + Sized {
    fn schedule(
        timer: &SystemTimer<Self>,
        rec: &'static Recorder,
        id: u32,
        delay: Duration,
        due: Instant,
    );
}

impl W2Task for Task {
    #[inline]
    fn schedule(
        timer: &SystemTimer<Self>,
        rec: &'static Recorder,
        id: u32,
        delay: Duration,
        due: Instant,
    ) {
        timer
            .add(delay, move || rec.fire(id as usize, due))
            .expect("timer running");
    }
}

impl W2Task for Fire {
    #[inline]
    fn schedule(
        timer: &SystemTimer<Self>,
        rec: &'static Recorder,
        id: u32,
        delay: Duration,
        due: Instant,
    ) {
        timer
            .add_keyed(delay, Fire { id, due, rec })
            .expect("timer running");
    }
}

impl<T: W2Task> Target for TimerRun<T> {
    #[inline]
    fn add(&mut self, id: u32, delay: Duration, due: Instant) {
        T::schedule(&self.timer, self.rec, id, delay, due);
    }
    fn note(&self) -> Option<String> {
        timer_note(&self.timer)
    }
    fn shutdown(self) {
        // Tasks handed back here never fired: the recorder counts them as missing (and the
        // run fails), so they are only dropped.
        drop(self.timer.shutdown());
    }
}

/// The timer's own view of the run: its lateness histogram and reaper wake-ups.
fn timer_note<T: TimerTask>(timer: &SystemTimer<T>) -> Option<String> {
    let s = timer.stats();
    let l = s.lateness;
    Some(format!(
        "its own stats: lateness (deadline to start) p50 {} p99 {} p99.9 {} max {} ms over {} \
         tasks, {} reaper wake-ups",
        ms(l.p50_ns as i64),
        ms(l.p99_ns as i64),
        ms(l.p999_ns as i64),
        ms(l.max_ns as i64),
        l.count,
        s.reaper_wakeups
    ))
}

struct DelayQueueRun {
    rt: tokio::runtime::Runtime,
    queue: DelayQueue<(u32, Instant)>,
    /// Times an add entered the runtime's context.
    enters: u64,
}

impl DelayQueueRun {
    fn new() -> Self {
        let rt = current_thread_runtime();
        let queue = {
            let _g = rt.enter();
            DelayQueue::new()
        };
        DelayQueueRun {
            rt,
            queue,
            enters: 0,
        }
    }
}

impl Target for DelayQueueRun {
    #[inline]
    fn add(&mut self, id: u32, delay: Duration, due: Instant) {
        // As in W1's `DelayQueueTarget`: the context is needed only for the queue to create its
        // `Sleep`, on an insert into an empty queue (it is polled only after the adds).
        let _g = self.queue.is_empty().then(|| {
            self.enters += 1;
            self.rt.enter()
        });
        self.queue.insert((id, due), delay);
    }
    fn wait(&mut self, rec: &Recorder, deadline: Instant) -> bool {
        let queue = &mut self.queue;
        let drain = async {
            while let Some(e) = std::future::poll_fn(|cx| queue.poll_expired(cx)).await {
                let (id, due) = e.into_inner();
                rec.fire(id as usize, due);
            }
        };
        let limit = deadline.saturating_duration_since(Instant::now());
        let _ = self
            .rt
            .block_on(async { tokio::time::timeout(limit, drain).await });
        rec.all_fired()
    }
    fn shutdown(self) {}
}

struct HeapRun {
    heap: HeapTimer,
}

impl Target for HeapRun {
    #[inline]
    fn add(&mut self, id: u32, _delay: Duration, due: Instant) {
        self.heap.add(due, u64::from(id));
    }
    fn shutdown(self) {
        self.heap.shutdown();
    }
}

/// Nanoseconds as milliseconds with 3 decimals.
fn ms(ns: i64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// What one implementation's run produced.
struct Row {
    p: Precision,
    cpu_s: f64,
    add_ns: f64,
    note: Option<String>,
}

/// Adds every task to `t`, waits for the fires (or the timeout), shuts `t` down after the grace
/// period, and summarises.
fn measure(mut t: impl Target, rec: &Recorder, delays: &[u64], a: &Args) -> Row {
    let cpu0 = process_cpu_ns();
    let t0 = Instant::now();
    for (i, &d) in delays.iter().enumerate() {
        let delay = Duration::from_millis(d);
        let due = Instant::now() + delay;
        t.add(i as u32, delay, due);
    }
    let add_wall = t0.elapsed();
    t.wait(rec, give_up_at(t0, add_wall, delays, a.timeout_ms));
    let cpu = process_cpu_ns().saturating_sub(cpu0);
    std::thread::sleep(Duration::from_millis(a.grace_ms));
    let note = t.note();
    t.shutdown();
    let (cpu_s, add_ns) = per_run(cpu, add_wall, delays.len());
    Row {
        p: rec.summary(),
        cpu_s,
        add_ns,
        note,
    }
}

/// When W2 stops waiting for missing fires: `timeout_ms` after the longest of `delays` has
/// passed since the end of the adds (begun at `t0`, `add_wall` long).
fn give_up_at(t0: Instant, add_wall: Duration, delays: &[u64], timeout_ms: u64) -> Instant {
    let longest = Duration::from_millis(delays.iter().copied().max().unwrap_or(0));
    t0 + add_wall + longest + Duration::from_millis(timeout_ms)
}

/// A run's CPU seconds (from its CPU nanoseconds) and wall ns per add (`n` adds in `add_wall`).
fn per_run(cpu_ns: u64, add_wall: Duration, n: usize) -> (f64, f64) {
    (
        cpu_ns as f64 / 1e9,
        add_wall.as_nanos() as f64 / n.max(1) as f64,
    )
}

/// W2's verdict: failed if any implementation had early, missing or duplicate fires.
fn any_failed(results: &[Precision]) -> bool {
    results.iter().any(Precision::failed)
}

/// The note under the table for implementation `name` with early fires: how early the earliest.
fn early_note(name: &str, p: &Precision) -> Option<String> {
    (p.early > 0).then(|| format!("{name}: earliest fire {} ms early", ms(-p.min_ns)))
}

/// Runs the workload and prints its table; returns the process exit code.
pub fn run(args: &Args) -> ExitCode {
    let a = args;
    out!(
        "W2 precision: N = {}, delay 1..={} ms (splitmix64 seed 42), added from one thread as \
         fast as it can; lateness = fire − (instant before add + delay)",
        a.n,
        a.range_ms
    );
    out!("machine: {}", machine_line());
    out!(
        "{:<25} {:>8} {:>8} {:>9} {:>8} {:>7} {:>8} {:>5} {:>7} {:>9}",
        "impl",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "early",
        "missing",
        "dup",
        "CPU s",
        "add ns/op"
    );
    let delays = crate::churn::delays(a.n, a.range_ms);
    let mut results = Vec::new();
    let mut notes = Vec::new();
    // Leaked (12 bytes per task), so that a task holds a plain reference rather than an `Arc`
    // whose count the adder and the runner would both write for every task. One for the whole
    // run, reset before each implementation (the previous one is shut down by then: no task
    // of it is left): a recorder leaked per implementation kept 12 bytes per task of every
    // implementation run before (1.2 GB each at the largest --n).
    let rec: &'static Recorder = Box::leak(Box::new(Recorder::new(a.n)));
    for name in while_stdout_taken(&a.impls) {
        rec.reset();
        let row = match name.as_str() {
            "system-timer" => {
                let timer = SystemTimer::new();
                measure(TimerRun { timer, rec }, rec, &delays, a)
            }
            "system-timer-inline" => {
                let timer = SystemTimer::builder().inline().build();
                measure(TimerRun { timer, rec }, rec, &delays, a)
            }
            "system-timer-typed" => {
                let timer = Builder::<Fire>::new().build();
                measure(TimerRun { timer, rec }, rec, &delays, a)
            }
            "system-timer-typed-inline" => {
                let timer = Builder::<Fire>::new().inline().build();
                measure(TimerRun { timer, rec }, rec, &delays, a)
            }
            "delay-queue" => measure(DelayQueueRun::new(), rec, &delays, a),
            "binary-heap-condvar" => {
                let heap = HeapTimer::start(None, move |id, due| rec.fire(id as usize, due));
                measure(HeapRun { heap }, rec, &delays, a)
            }
            other => unreachable!("clap checked the name: {other}"),
        };
        let p = row.p;
        results.push(p);
        out!(
            "{:<25} {:>8} {:>8} {:>9} {:>8} {:>7} {:>8} {:>5} {:>7.3} {:>9.1}",
            name,
            ms(p.p50_ns),
            ms(p.p99_ns),
            ms(p.p999_ns),
            ms(p.max_ns),
            p.early,
            p.missing,
            p.duplicates,
            row.cpu_s,
            row.add_ns
        );
        notes.extend(early_note(name, &p));
        if let Some(n) = row.note {
            notes.push(format!("{name}: {n}"));
        }
    }
    for n in notes {
        out!("{n}");
    }
    let failed = any_failed(&results);
    if failed {
        out!("FAILED: early, missing or duplicate fires");
    }
    exit_status(!failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_counts_early_missing_and_duplicate_fires() {
        let rec = Recorder::new(4);
        let now = Instant::now();
        rec.fire(0, now - Duration::from_millis(1)); // late
        rec.fire(0, now - Duration::from_millis(1)); // and again: a duplicate
        rec.fire(1, now + Duration::from_secs(60)); // early
        rec.fire(3, now); // on time; task 2 never fires
        assert!(!rec.all_fired());
        let p = rec.summary();
        assert_eq!((p.early, p.missing, p.duplicates), (1, 1, 1), "{p:?}");
        assert!(p.failed());
        assert!(p.min_ns < 0 && p.max_ns >= 1_000_000, "{p:?}");
    }

    /// One recorder serves every implementation of a run: reset, it is a new one (W2 used to
    /// leak one per implementation).
    #[test]
    fn a_reset_recorder_is_a_new_one() {
        let rec = Recorder::new(3);
        let now = Instant::now();
        for id in 0..3 {
            rec.fire(id, now - Duration::from_millis(1));
        }
        rec.fire(1, now + Duration::from_secs(60));
        assert!(rec.all_fired());
        rec.reset();
        assert!(!rec.all_fired());
        let p = rec.summary();
        assert_eq!((p.early, p.missing, p.duplicates), (0, 3, 0), "{p:?}");
        rec.fire(0, now + Duration::from_secs(60)); // early, and the first fire again
        rec.fire(1, now);
        rec.fire(2, now);
        assert!(rec.all_fired(), "every task counted once again");
        let p = rec.summary();
        assert_eq!((p.early, p.missing, p.duplicates), (1, 0, 0), "{p:?}");
    }

    /// A target that never schedules task 0: W2's table must show it as missing.
    struct Drops0(HeapRun);

    impl Target for Drops0 {
        fn add(&mut self, id: u32, delay: Duration, due: Instant) {
            if id != 0 {
                self.0.add(id, delay, due);
            }
        }
        fn shutdown(self) {
            self.0.shutdown();
        }
    }

    /// A small run's flags: 3 tasks, no grace period, giving up 50 ms after the longest delay.
    fn small_args() -> Args {
        Args {
            n: 3,
            range_ms: 1,
            grace_ms: 0,
            timeout_ms: 50,
            impls: Vec::new(),
        }
    }

    #[test]
    fn a_task_that_never_fires_is_counted_missing() {
        let rec: &'static Recorder = Box::leak(Box::new(Recorder::new(3)));
        let heap = HeapTimer::start(None, move |id, due| rec.fire(id as usize, due));
        let row = measure(Drops0(HeapRun { heap }), rec, &[1, 1, 1], &small_args());
        assert_eq!((row.p.missing, row.p.early, row.p.duplicates), (1, 0, 0));
        assert!(row.p.failed());
    }

    /// W2 on the timer, both task types: every task fires once and none early, and the row's
    /// note is the timer's own view of the run (its lateness over the run's tasks).
    #[test]
    fn w2_on_the_timer_fires_every_task_once_and_notes_the_timers_stats() {
        fn check<T: W2Task>(timer: SystemTimer<T>) {
            let rec: &'static Recorder = Box::leak(Box::new(Recorder::new(20)));
            let d = crate::churn::delays(20, 5);
            let a = Args {
                timeout_ms: 10_000,
                ..small_args()
            };
            let row = measure(TimerRun { timer, rec }, rec, &d, &a);
            assert!(!row.p.failed(), "{:?}", row.p);
            let note = row.note.expect("the timer's note");
            assert!(note.contains(" over 20 tasks, "), "{note}");
        }
        check(SystemTimer::new());
        check(Builder::<Fire>::new().build());
    }

    /// The table's milliseconds: nanoseconds over 10^6, three decimals.
    #[test]
    fn ms_shows_nanoseconds_as_milliseconds_with_three_decimals() {
        assert_eq!(ms(1_234_567), "1.235");
        assert_eq!(ms(-500_000), "-0.500");
    }

    /// A target that records, per add, the delay, the due instant it was given and the instant
    /// of the add; it never fires anything.
    struct RecordsDue<'a>(&'a std::cell::RefCell<Vec<(Duration, Instant, Instant)>>);

    impl Target for RecordsDue<'_> {
        fn add(&mut self, _id: u32, delay: Duration, due: Instant) {
            self.0.borrow_mut().push((delay, due, Instant::now()));
        }
        fn wait(&mut self, _rec: &Recorder, _deadline: Instant) -> bool {
            false
        }
        fn shutdown(self) {}
    }

    /// Lateness is measured from the instant taken just before a task's add plus its delay: the
    /// due instant W2 hands each add (delays of 1 and 2 s: a due instant that is not this one
    /// is seconds away from it).
    #[test]
    fn a_tasks_due_instant_is_the_instant_before_its_add_plus_its_delay() {
        let rec = Recorder::new(2);
        let adds = std::cell::RefCell::new(Vec::new());
        let before = Instant::now();
        measure(RecordsDue(&adds), &rec, &[1_000, 2_000], &small_args());
        let adds = adds.into_inner();
        assert_eq!(adds.len(), 2);
        for (delay, due, at_add) in adds {
            let taken = due - delay;
            assert!(before <= taken && taken <= at_add, "{delay:?}");
        }
    }

    /// W2 gives up on missing fires its timeout after the longest delay has passed since the
    /// end of the adds.
    #[test]
    fn w2_gives_up_its_timeout_after_the_longest_delay_past_the_adds() {
        let t0 = Instant::now();
        let add_wall = Duration::from_millis(7);
        assert_eq!(
            give_up_at(t0, add_wall, &[5, 300, 2], 100),
            t0 + Duration::from_millis(407)
        );
        assert_eq!(
            give_up_at(t0, add_wall, &[], 100),
            t0 + Duration::from_millis(107)
        );
    }

    /// The CPU column is seconds, the add column wall ns per add.
    #[test]
    fn w2s_cpu_is_in_seconds_and_its_add_cost_per_add() {
        assert_eq!(
            per_run(2_500_000_000, Duration::from_nanos(300), 3),
            (2.5, 100.0)
        );
    }

    /// Nearest-rank percentiles over the fired tasks' lateness (1,000 samples from -2 to 997
    /// ns, given in reverse), the extremes, and as early only the negative ones (a fire on
    /// time, 0 ns late, is not early).
    #[test]
    fn the_percentiles_are_nearest_ranks_and_only_negative_lateness_is_early() {
        let late: Vec<i64> = (-2..998).rev().collect();
        let p = Precision::of(late, 4, 5);
        assert_eq!(
            (p.p50_ns, p.p99_ns, p.p999_ns, p.min_ns, p.max_ns),
            (497, 987, 996, -2, 997)
        );
        assert_eq!((p.early, p.missing, p.duplicates), (2, 4, 5));
        let none = Precision::of(Vec::new(), 1, 0);
        assert_eq!((none.p50_ns, none.max_ns, none.early), (0, 0, 0));
    }

    /// W2 fails if any implementation failed, whichever; its note tells how early the
    /// earliest fire of an implementation with early fires was, and nothing for the others.
    #[test]
    fn w2_fails_if_any_implementation_failed_and_notes_the_earliest_fire() {
        let ok = Precision::default();
        let early = Precision {
            early: 1,
            min_ns: -2_500_000,
            ..Precision::default()
        };
        assert!(!any_failed(&[ok, ok]));
        assert!(any_failed(&[ok, early]) && any_failed(&[early, ok]));
        assert_eq!(
            early_note("heap", &early).as_deref(),
            Some("heap: earliest fire 2.500 ms early")
        );
        assert_eq!(early_note("heap", &ok), None);
        // The implementations with no note of their own add none.
        assert_eq!(DelayQueueRun::new().note(), None);
    }

    /// Any one early, missing or duplicate fire fails the run; none passes it.
    #[test]
    fn any_early_missing_or_duplicate_fire_fails_w2() {
        let p = |early, missing, duplicates| Precision {
            early,
            missing,
            duplicates,
            ..Precision::default()
        };
        assert!(!p(0, 0, 0).failed());
        for (e, m, d) in [(1, 0, 0), (0, 1, 0), (0, 0, 1)] {
            assert!(
                p(e, m, d).failed(),
                "early {e}, missing {m}, duplicates {d}"
            );
        }
    }

    /// The last task's first fire wakes the thread waiting for all of them: W2 reads the CPU
    /// clock and moves on then, not at its timeout. (Not woken, the wait here lasts its 20 s
    /// deadline: the 50 ms sleeps only let it park before each fire. The firing thread is a
    /// plain one that outlives the wait: a scoped thread's exit wakes the scope's thread too.)
    #[test]
    fn the_last_first_fire_wakes_the_waiting_thread() {
        let rec: &'static Recorder = Box::leak(Box::new(Recorder::new(2)));
        let deadline = Instant::now() + Duration::from_secs(20);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let firing = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            rec.fire(0, Instant::now());
            std::thread::sleep(Duration::from_millis(50));
            rec.fire(1, Instant::now());
            let _ = done_rx.recv();
        });
        assert!(rec.wait_all(deadline));
        assert!(
            Instant::now() < deadline,
            "the last fire did not wake the waiting thread"
        );
        drop(done_tx);
        firing.join().expect("the firing thread");
    }

    /// The heap timer's add wakes its worker for a task due before every pending one (else the
    /// worker sleeps on to the earliest it knew, here 60 s); shut down or dropped, the worker
    /// has returned (its callback, holding the channel's sender, is gone).
    #[test]
    fn the_heap_timer_wakes_for_an_earlier_task_and_stops_its_worker() {
        use std::sync::mpsc::{channel, TryRecvError};
        let (tx, rx) = channel();
        let heap = HeapTimer::start(None, move |id, _| {
            let _ = tx.send(id);
        });
        heap.add(Instant::now() + Duration::from_secs(60), 1);
        // Time for the worker to go to sleep until the 60 s task.
        std::thread::sleep(Duration::from_millis(50));
        heap.add(Instant::now() + Duration::from_millis(1), 2);
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(2));
        heap.shutdown();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        let (tx, rx) = channel::<u64>();
        drop(HeapTimer::start(None, move |id, _| {
            let _ = tx.send(id);
        }));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[test]
    fn the_delay_queue_enters_its_runtime_only_to_create_its_sleep() {
        // As in W1 (churn.rs): entering the runtime on every add is harness cost the other
        // implementations do not pay, and it lengthens the add phase during which the delay
        // queue (polled only afterwards) cannot fire anything.
        let rec: &'static Recorder = Box::leak(Box::new(Recorder::new(100)));
        let mut t = DelayQueueRun::new();
        for i in 0..100u32 {
            let delay = Duration::from_millis(1 + u64::from(i % 7));
            t.add(i, delay, Instant::now() + delay);
        }
        assert_eq!(t.enters, 1);
        assert!(t.wait(rec, Instant::now() + Duration::from_secs(10)));
        let p = rec.summary();
        assert!(!p.failed(), "{p:?}");
    }
}
