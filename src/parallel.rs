//! W1x2 from BENCHMARKS.md: two threads, each adding N/2 tasks and then cancelling its own 90%,
//! concurrently on one shared structure; wall ns per operation over both threads, next to the
//! same implementation's single-thread W1 figure measured in the same run.
//!
//! Task `i` (delay `1 + rand_i % range` ms, splitmix64 seed 42, as in W1) goes to thread `i % 2`
//! (`--split interleaved`, the default) or to thread `i / ceil(N/2)` (`--split halves`); the
//! cancel rule is W1's, on the global index: `i % 10 != 0`. The threads start each phase together
//! (a barrier) and stamp their own clocks, so a phase's wall time runs from the first thread's
//! start to the last thread's end, with no barrier wake-up latency in it. W1 and W1x2 runs
//! alternate, on fresh structures, and the table shows medians.
#![allow(clippy::disallowed_methods)] // benchmark code: std threads and clocks on purpose
#![allow(clippy::disallowed_types)] // the Mutex baselines are std's, on purpose

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::churn::{
    self, ChurnFigures, ChurnTarget, ConcurrentWheelTarget, DelayQueueTarget, FromId, HeapTarget,
    IdTask, KeyedTimerTarget, TimerTarget, TypedTimerTarget,
};
use crate::measure::{
    at_least, exit_status, machine_line, median, process_cpu_ns, while_stdout_taken,
};
use crate::{note, out};

/// The implementations W1x2 knows, by name.
pub const IMPLS: &[&str] = &[
    "system-timer",
    "system-timer-typed",
    "system-timer-keyed",
    "concurrent-wheel",
    "delay-queue",
    "binary-heap",
];

/// How the N tasks are split between the two threads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Thread `i % 2` takes task `i`.
    Interleaved,
    /// Thread 0 takes the first half of the tasks, thread 1 the second.
    Halves,
}

/// Flags of `w1x2`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Tasks to add over both threads (N/2 each; at least 2: the cancel phase needs a task to
    /// cancel; at most 10^8).
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::measure::task_count(2))]
    pub n: usize,
    /// Delay range in ms (delay = 1 + rand % range), at most 10^10.
    #[arg(long, default_value_t = 30_000, value_parser = churn::range_ms())]
    pub range_ms: u64,
    /// Runs per implementation, each a W1 run and a W1x2 run (the table shows medians).
    #[arg(long, default_value_t = 3, value_parser = at_least(1))]
    pub runs: usize,
    /// Which tasks each thread takes.
    #[arg(long, value_enum, default_value_t = Split::Interleaved)]
    pub split: Split,
    /// Implementations, comma separated.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(IMPLS),
          default_values_t = IMPLS.iter().map(|s| s.to_string()))]
    pub impls: Vec<String>,
    /// Internal: measure the one implementation of `--impls` in this process and print its
    /// row's figures as numbers (the parent runs each implementation so, in a process of its
    /// own).
    #[arg(long, hide = true)]
    pub child_row: bool,
}

/// Something two threads can add to and cancel from at once, through a shared reference.
pub trait SharedTarget: Sync {
    /// What `add` returns and `cancel` takes.
    type Handle;
    /// As [`ChurnTarget::EXACT`]: false for targets on a real clock, where a short task may fire
    /// before its cancel.
    const EXACT: bool = true;
    /// Schedules task `id` to fire `delay_ms` from now.
    fn add(&self, delay_ms: u64, id: u64) -> Self::Handle;
    /// Cancels a task; true if it was pending.
    fn cancel(&self, handle: &Self::Handle) -> bool;
    /// Pending tasks.
    fn len(&self) -> usize;
    /// True when nothing is pending.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: FromId> SharedTarget for system_timer::SystemTimer<T> {
    type Handle = system_timer::TimerHandle<T>;
    const EXACT: bool = false;
    #[inline]
    fn add(&self, delay_ms: u64, id: u64) -> Self::Handle {
        system_timer::SystemTimer::add(self, Duration::from_millis(delay_ms), T::from_id(id))
            .expect("timer running")
    }
    #[inline]
    fn cancel(&self, h: &Self::Handle) -> bool {
        h.cancel()
    }
    fn len(&self) -> usize {
        system_timer::SystemTimer::len(self)
    }
}

impl SharedTarget for KeyedTimerTarget {
    type Handle = system_timer::TimerKey;
    const EXACT: bool = false;
    #[inline]
    fn add(&self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0
            .add_keyed(Duration::from_millis(delay_ms), IdTask(id))
            .expect("timer running")
    }
    #[inline]
    fn cancel(&self, h: &Self::Handle) -> bool {
        self.0.cancel(*h)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl SharedTarget for ConcurrentWheelTarget {
    type Handle = timing_wheel::EntryHandle<u64>;
    #[inline]
    fn add(&self, delay_ms: u64, id: u64) -> Self::Handle {
        self.0.add(delay_ms, id).expect("future deadline").handle
    }
    #[inline]
    fn cancel(&self, h: &Self::Handle) -> bool {
        h.cancel().is_some()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A single-threaded W1 target behind one `std::sync::Mutex`: the baselines' way to share.
impl<C: ChurnTarget + Send> SharedTarget for Mutex<C> {
    type Handle = C::Handle;
    const EXACT: bool = C::EXACT;
    #[inline]
    fn add(&self, delay_ms: u64, id: u64) -> Self::Handle {
        self.lock().expect("not poisoned").add(delay_ms, id)
    }
    #[inline]
    fn cancel(&self, h: &Self::Handle) -> bool {
        self.lock().expect("not poisoned").cancel(h)
    }
    fn len(&self) -> usize {
        self.lock().expect("not poisoned").len()
    }
}

/// Figures of one W1x2 run: phase wall times over both threads, and process CPU over the run.
#[derive(Clone, Copy, Debug, Default)]
pub struct ParallelFigures {
    /// Wall ns per add (add phase wall / N).
    pub add_ns: f64,
    /// Wall ns per cancel (cancel phase wall / cancels).
    pub cancel_ns: f64,
    /// Wall ns per operation over both phases: (add wall + cancel wall) / (adds + cancels).
    pub all_ns: f64,
    /// Process CPU ns per operation over both phases (all threads, background ones included).
    pub cpu_ns: f64,
    /// Process CPU over the run / wall of the two phases: the cores the run really got (up to
    /// 2 for the workers, plus whatever background threads used; the barriers' waits are in the
    /// CPU reading's stretch but not in the phases' wall).
    pub cores: f64,
}

/// One thread's clock stamps: add phase start and end, cancel phase start and end.
type Stamps = [Instant; 4];

/// A barrier that a panicking party breaks: the others' [`wait`](Gate::wait) then panics too,
/// instead of waiting for ever for a thread that is gone (std's `Barrier` hangs then). So a
/// worker's panic (a target refusing an add, a failed check) ends the run with that panic.
struct Gate {
    parties: usize,
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    generation: u64,
    broken: bool,
}

impl Gate {
    fn new(parties: usize) -> Self {
        Gate {
            parties,
            state: Mutex::default(),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Nothing panics while holding it; a poisoned lock still holds a valid state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every party has arrived. Panics if the gate is broken (before or while
    /// waiting).
    fn wait(&self) {
        let mut g = self.lock();
        let generation = g.generation;
        if !g.broken {
            g.arrived += 1;
            if g.arrived == self.parties {
                g.arrived = 0;
                g.generation += 1;
                self.cv.notify_all();
                return;
            }
            while g.generation == generation && !g.broken {
                g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        if g.generation == generation {
            drop(g);
            panic!("another thread of the run panicked");
        }
    }

    /// Breaks the gate: every waiter, and every later `wait`, panics.
    fn break_it(&self) {
        self.lock().broken = true;
        self.cv.notify_all();
    }
}

/// Breaks its gates when dropped by a panicking thread.
struct BreakOnPanic<'a>(&'a [&'a Gate]);

impl Drop for BreakOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.iter().for_each(|g| g.break_it());
        }
    }
}

/// Runs W1x2 once on `target`: two threads, each adding its share of `delays` and then
/// cancelling its own with `i % 10 != 0`.
pub fn run_once<S: SharedTarget>(target: &S, delays: &[u64], split: Split) -> ParallelFigures {
    let n = delays.len();
    let half = n.div_ceil(2);
    // Thread t's task indices: start, start + step, ... below end.
    let share = move |t: usize| match split {
        Split::Interleaved => (t, n, 2),
        Split::Halves => (t * half, n.min((t + 1) * half), 1),
    };
    let phase = Gate::new(2);
    // The workers and this thread: this thread reads the CPU clock while the workers are alive
    // (the first reading is taken before they start, so all of their CPU counts).
    let done = Gate::new(3);
    let gates = [&phase, &done];
    // None on a fresh or warmed-up target, except on a real clock a warm-up's task that fell due
    // and still waits for an executor (counted until it starts).
    let before = target.len();
    let cpu0 = process_cpu_ns();
    let (cpu, stamps, cancelled, failed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (phase, done, gates) = (&phase, &done, &gates);
                s.spawn(move || {
                    // A panic here (the target's, or a gate broken by the other worker) breaks
                    // the gates, so neither the other worker nor this thread waits for ever.
                    let _break = BreakOnPanic(gates);
                    let (start, end, step) = share(t);
                    let mut handles = Vec::with_capacity(half);
                    phase.wait();
                    let t0 = Instant::now();
                    for i in (start..end).step_by(step) {
                        handles.push(target.add(delays[i], i as u64));
                    }
                    let t1 = Instant::now();
                    // As in W1: the 10% kept are moved aside (room reserved now), and a
                    // cancelled handle is dropped in the cancel phase, as a caller would right
                    // after cancelling (a counted handle costs its release). Room for every kept
                    // task: with the interleaved split, thread 0 holds them all.
                    let mut kept = Vec::with_capacity(n.div_ceil(10));
                    phase.wait();
                    let t2 = Instant::now();
                    let mut cancelled = 0usize;
                    // As in W1: the tasks whose cancel failed, to check each one.
                    let mut failed = Vec::new();
                    for (k, h) in handles.drain(..).enumerate() {
                        let i = start + k * step;
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
                    let t3 = Instant::now();
                    done.wait(); // the CPU reading
                    done.wait();
                    ([t0, t1, t2, t3], cancelled, failed)
                })
            })
            .collect();
        // This thread's wait panics if a worker did; the scope then joins both workers (each
        // woken by the broken gates) and the run ends with the panic.
        done.wait();
        let cpu = process_cpu_ns().saturating_sub(cpu0);
        done.wait();
        let results: Vec<(Stamps, usize, Vec<usize>)> = workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect();
        let cancelled: usize = results.iter().map(|r| r.1).sum();
        let failed: Vec<usize> = results.iter().flat_map(|r| r.2.iter().copied()).collect();
        (
            cpu,
            results.into_iter().map(|r| r.0).collect::<Vec<_>>(),
            cancelled,
            failed,
        )
    });
    let first_add = stamps.iter().map(|s| s[0]).min().expect("two threads");
    let expected = churn::check_cancel_phase(
        S::EXACT,
        delays,
        cancelled,
        &failed,
        before,
        || target.len(),
        first_add,
    );
    // A phase runs from the first thread's start to the last thread's end.
    let span = |a: usize, b: usize| {
        let start = stamps.iter().map(|s| s[a]).min().expect("two threads");
        let end = stamps.iter().map(|s| s[b]).max().expect("two threads");
        end.duration_since(start).as_nanos() as f64
    };
    figures(n, expected, span(0, 1), span(2, 3), cpu)
}

/// W1x2's figures from a run's readings: `n` adds and `cancels` cancels, the phases' wall
/// times (ns, first start to last end) and the process CPU over the run (ns).
fn figures(n: usize, cancels: usize, add_wall: f64, cancel_wall: f64, cpu: u64) -> ParallelFigures {
    let ops = (n + cancels).max(1) as f64;
    ParallelFigures {
        add_ns: add_wall / n.max(1) as f64,
        cancel_ns: cancel_wall / cancels.max(1) as f64,
        all_ns: (add_wall + cancel_wall) / ops,
        cpu_ns: cpu as f64 / ops,
        cores: cpu as f64 / (add_wall + cancel_wall).max(1.0),
    }
}

/// Medians of W1 (single thread) and W1x2 on one implementation, runs alternating.
fn measure<C, S>(
    runs: usize,
    delays: &[u64],
    split: Split,
    mut single: impl FnMut() -> C,
    mut shared: impl FnMut() -> S,
) -> (ChurnFigures, ParallelFigures)
where
    C: ChurnTarget,
    S: SharedTarget,
{
    let mut w1 = Vec::new();
    let mut x2 = Vec::new();
    for _ in 0..runs.max(1) {
        w1.push(churn::run_median(1, delays, false, &mut single));
        let target = shared();
        churn::settle();
        x2.push(run_once(&target, delays, split));
        drop(target);
    }
    let m2 = |g: fn(&ParallelFigures) -> f64| median(&x2.iter().map(g).collect::<Vec<_>>());
    (
        ChurnFigures::median(&w1),
        ParallelFigures {
            add_ns: m2(|f| f.add_ns),
            cancel_ns: m2(|f| f.cancel_ns),
            all_ns: m2(|f| f.all_ns),
            cpu_ns: m2(|f| f.cpu_ns),
            cores: m2(|f| f.cores),
        },
    )
}

/// W1's wall ns per operation over both phases, from its per-phase figures at `n` tasks: what
/// W1x2's `all` is, (add wall + cancel wall) / (adds + cancels).
fn w1_all_ns(w1: &ChurnFigures, n: usize) -> f64 {
    let n_cancel = n - n.div_ceil(10);
    let ops = (n + n_cancel).max(1) as f64;
    (w1.add_ns * n as f64 + w1.cancel_ns * n_cancel as f64) / ops
}

/// Runs the workload and prints its table; returns the process exit code. Each implementation's
/// row is measured in a child process of its own (`--child-row`), as W1's are: in one process,
/// an implementation's runs found the memory the allocator had kept from the rows before it.
pub fn run(args: &Args) -> ExitCode {
    if args.child_row {
        return child_row(args);
    }
    run_with(args, |name, _, _, _| row_in_child(args, name))
}

/// `--child-row`: measures the one implementation `args` names, in this process, and prints its
/// figures as [`to_wire`] writes them (status 1 if a check fails).
fn child_row(args: &Args) -> ExitCode {
    let [name] = args.impls.as_slice() else {
        note!(
            "error: --child-row measures one implementation, not {:?}",
            args.impls
        );
        return exit_status(false);
    };
    let delays = churn::delays(args.n, args.range_ms);
    match in_process(name, args.runs, &delays, args.split) {
        Ok(row) => {
            out!("{}", to_wire(&row));
            exit_status(true)
        }
        Err(e) => {
            note!("error: {e}");
            exit_status(false)
        }
    }
}

/// Measures implementation `name` in this process (W1 and W1x2 runs alternating); an error if
/// a check fails (its panic's message is printed above it by the panic hook).
fn in_process(
    name: &str,
    runs: usize,
    d: &[u64],
    s: Split,
) -> Result<(ChurnFigures, ParallelFigures), String> {
    checked(name, || match name {
        "system-timer" => measure(runs, d, s, TimerTarget::new, system_timer::SystemTimer::new),
        "system-timer-typed" => measure(runs, d, s, TypedTimerTarget::new, || {
            system_timer::Builder::<IdTask>::new().build()
        }),
        "system-timer-keyed" => measure(runs, d, s, KeyedTimerTarget::new, KeyedTimerTarget::new),
        "concurrent-wheel" => measure(
            runs,
            d,
            s,
            ConcurrentWheelTarget::new,
            ConcurrentWheelTarget::new,
        ),
        "delay-queue" => measure(runs, d, s, DelayQueueTarget::new, || {
            Mutex::new(DelayQueueTarget::new())
        }),
        "binary-heap" => measure(runs, d, s, HeapTarget::default, || {
            Mutex::new(HeapTarget::default())
        }),
        other => panic!("unknown implementation {other}; known: {IMPLS:?}"),
    })
}

/// Runs a row's measurement; a panic (a failed check) becomes an error naming `name`.
fn checked(
    name: &str,
    row: impl FnOnce() -> (ChurnFigures, ParallelFigures),
) -> Result<(ChurnFigures, ParallelFigures), String> {
    std::panic::catch_unwind(AssertUnwindSafe(row))
        .map_err(|_| format!("{name} failed a check (above)"))
}

/// Implementation `name`'s row measured by this program in a child process (`--child-row`).
fn row_in_child(a: &Args, name: &str) -> Result<(ChurnFigures, ParallelFigures), String> {
    let split = clap::ValueEnum::to_possible_value(&a.split).expect("no skipped values");
    let mut cmd = std::process::Command::new(crate::measure::this_program()?);
    cmd.args([
        "w1x2",
        "--n",
        &a.n.to_string(),
        "--range-ms",
        &a.range_ms.to_string(),
    ])
    .args(["--runs", &a.runs.to_string(), "--split", split.get_name()])
    .args(["--impls", name, "--child-row"]);
    crate::measure::run_child(&mut cmd, &format!("w1x2 on {name}"), from_wire)
}

/// A row's figures as one line of nine numbers, each in full precision (`{:?}` of an `f64`
/// reads back to the same value): W1's add, cancel, add CPU and cancel CPU ns, then W1x2's
/// add, cancel, all and CPU ns and its cores.
fn to_wire((w1, x2): &(ChurnFigures, ParallelFigures)) -> String {
    [
        w1.add_ns,
        w1.cancel_ns,
        w1.add_cpu_ns,
        w1.cancel_cpu_ns,
        x2.add_ns,
        x2.cancel_ns,
        x2.all_ns,
        x2.cpu_ns,
        x2.cores,
    ]
    .map(|v| format!("{v:?}"))
    .join(" ")
}

/// [`to_wire`]'s line read back: exactly nine numbers, or `None` (a stray line, a missing
/// figure: a failed child).
fn from_wire(text: &str) -> Option<(ChurnFigures, ParallelFigures)> {
    let [a, b, c, d, e, f, g, h, i] = crate::measure::numbers(text)?;
    Some((
        ChurnFigures {
            add_ns: a,
            cancel_ns: b,
            add_cpu_ns: c,
            cancel_cpu_ns: d,
        },
        ParallelFigures {
            add_ns: e,
            cancel_ns: f,
            all_ns: g,
            cpu_ns: h,
            cores: i,
        },
    ))
}

/// [`run`], each implementation measured by `row` (its name, the runs, the delays, the split).
fn run_with(
    args: &Args,
    row: impl Fn(&str, usize, &[u64], Split) -> Result<(ChurnFigures, ParallelFigures), String>,
) -> ExitCode {
    let a = args;
    out!(
        "W1x2 churn on 2 threads: N = {} ({} per thread, split {}), delay 1..={} ms, \
         cancel 90%, medians of {} runs (each: W1 on 1 thread, then W1x2)",
        a.n,
        a.n.div_ceil(2),
        format!("{:?}", a.split).to_lowercase(),
        a.range_ms,
        a.runs
    );
    out!("machine: {}", machine_line());
    out!(
        "{:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>6}",
        "impl",
        "x2 add",
        "x2 cancel",
        "x2 all",
        "x1 add",
        "x1 cancel",
        "x1 all",
        "x2/x1",
        "x2 cpu",
        "cores"
    );
    let delays = churn::delays(a.n, a.range_ms);
    for name in while_stdout_taken(&a.impls) {
        // A failed check (or child) ends the run with status 1, as W1's failed child and W2's
        // failed check do (a check's panic said 101, and nothing after it ran).
        let (w1, x2) = match row(name, a.runs, &delays, a.split) {
            Ok(row) => row,
            Err(e) => {
                note!("error: {e}; the run stops");
                return exit_status(false);
            }
        };
        let w1_all = w1_all_ns(&w1, a.n);
        out!(
            "{:<18} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>9.1} {:>6.2}",
            name,
            x2.add_ns,
            x2.cancel_ns,
            x2.all_ns,
            w1.add_ns,
            w1.cancel_ns,
            w1_all,
            x2.all_ns / w1_all,
            x2.cpu_ns,
            x2.cores
        );
    }
    out!("wall ns per op; all = (add wall + cancel wall) / (adds + cancels); x2/x1 < 1: two");
    out!("threads beat one; x2 cpu: process CPU ns per op (all threads); cores: that CPU over");
    out!("the phases' wall (below 2: the workers did not really run at once)");
    exit_status(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// A handle whose drop takes 200 µs: a stand-in for a counted handle (an `Arc` to release).
    struct SlowDrop;

    impl Drop for SlowDrop {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[derive(Default)]
    struct SlowDropTarget(AtomicUsize);

    impl SharedTarget for SlowDropTarget {
        type Handle = SlowDrop;
        fn add(&self, _delay_ms: u64, _id: u64) -> SlowDrop {
            self.0.fetch_add(1, Ordering::Relaxed);
            SlowDrop
        }
        fn cancel(&self, _h: &SlowDrop) -> bool {
            self.0.fetch_sub(1, Ordering::Relaxed);
            true
        }
        fn len(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// An exact target that records the tasks it was asked to cancel.
    #[derive(Default)]
    struct RecordsCancels {
        cancelled: Mutex<Vec<u64>>,
        len: AtomicUsize,
    }

    impl SharedTarget for RecordsCancels {
        type Handle = u64;
        fn add(&self, _delay_ms: u64, id: u64) -> u64 {
            self.len.fetch_add(1, Ordering::Relaxed);
            id
        }
        fn cancel(&self, h: &u64) -> bool {
            self.cancelled.lock().expect("not poisoned").push(*h);
            self.len.fetch_sub(1, Ordering::Relaxed);
            true
        }
        fn len(&self) -> usize {
            self.len.load(Ordering::Relaxed)
        }
    }

    /// W1x2 cancels W1's tasks, those with `i % 10 != 0` by their global index, on either
    /// split (with 100 tasks, cancelling `i >= 10` instead has the same count, which is all
    /// the checks compare).
    #[test]
    fn w1x2_cancels_the_tasks_w1_cancels_on_either_split() {
        let d = churn::delays(100, 30_000);
        let want: Vec<u64> = (0..100).filter(|i| i % 10 != 0).collect();
        for split in [Split::Interleaved, Split::Halves] {
            let t = RecordsCancels::default();
            run_once(&t, &d, split);
            let mut got = t.cancelled.into_inner().expect("not poisoned");
            got.sort_unstable();
            assert_eq!(got, want, "{split:?}");
        }
    }

    /// A target that panics on its 30th add.
    #[derive(Default)]
    struct PanicsOnAdd(AtomicUsize);

    impl SharedTarget for PanicsOnAdd {
        type Handle = ();
        fn add(&self, _delay_ms: u64, _id: u64) {
            if self.0.fetch_add(1, Ordering::Relaxed) == 30 {
                panic!("target refused an add");
            }
        }
        fn cancel(&self, _h: &()) -> bool {
            true
        }
        fn len(&self) -> usize {
            0
        }
    }

    /// A target on a real clock, modelled exactly (as W1's test target): a cancel loses only
    /// to a task whose deadline has passed, except that every `lose_every`-th cancel loses
    /// anyway (a lost task); the first cancel holds both threads back `stall` (a busy machine),
    /// so that the short tasks fall due first.
    struct Clocked {
        base: Instant,
        due_ns: Vec<AtomicU64>,
        lose_every: usize,
        stall: Duration,
        stalled: std::sync::Once,
        cancels: AtomicUsize,
        len: AtomicUsize,
    }

    impl Clocked {
        fn new(n: usize, lose_every: usize, stall: Duration) -> Self {
            Clocked {
                base: Instant::now(),
                due_ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
                lose_every,
                stall,
                stalled: std::sync::Once::new(),
                cancels: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
            }
        }
    }

    impl SharedTarget for Clocked {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&self, delay_ms: u64, id: u64) -> usize {
            let due = self.base.elapsed() + Duration::from_millis(delay_ms);
            self.due_ns[id as usize].store(due.as_nanos() as u64, Ordering::Relaxed);
            self.len.fetch_add(1, Ordering::Relaxed);
            id as usize
        }
        fn cancel(&self, h: &usize) -> bool {
            self.stalled.call_once(|| std::thread::sleep(self.stall));
            let k = self.cancels.fetch_add(1, Ordering::Relaxed) + 1;
            let lost = self.lose_every > 0 && k.is_multiple_of(self.lose_every);
            let now = self.base.elapsed().as_nanos() as u64;
            let won = !lost && now < self.due_ns[*h].load(Ordering::Relaxed);
            if won {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            won
        }
        fn len(&self) -> usize {
            self.len.load(Ordering::Relaxed)
        }
    }

    /// As in W1: a cancel that fails on a task whose delay has not run out is a lost task,
    /// however few (the check let through up to 2% of the cancels failing, here 1%).
    #[test]
    fn a_lost_cancel_fails_w1x2_on_a_real_clock_target() {
        let d = churn::delays(10_000, 30_000);
        let run = std::panic::catch_unwind(|| {
            run_once(
                &Clocked::new(d.len(), 100, Duration::ZERO),
                &d,
                Split::Interleaved,
            )
        });
        assert!(run.is_err(), "90 lost cancels of 9000 passed");
    }

    /// A row's figures cross from the child process unchanged, to the last bit; anything but
    /// nine numbers is a failed child, not a row.
    #[test]
    fn a_row_survives_the_wire_exactly() {
        let row = (
            ChurnFigures {
                add_ns: 0.1 + 0.2,
                cancel_ns: 1.0 / 3.0,
                add_cpu_ns: 123.456789012345,
                cancel_cpu_ns: 7.0,
            },
            ParallelFigures {
                add_ns: f64::MIN_POSITIVE,
                cancel_ns: 1e300,
                all_ns: 2.5,
                cpu_ns: 99.99,
                cores: 1.9999999999999998,
            },
        );
        let (w1, x2) = from_wire(&to_wire(&row)).expect("nine numbers");
        let bits = |(w, x): (&ChurnFigures, &ParallelFigures)| {
            [
                w.add_ns,
                w.cancel_ns,
                w.add_cpu_ns,
                w.cancel_cpu_ns,
                x.add_ns,
                x.cancel_ns,
                x.all_ns,
                x.cpu_ns,
                x.cores,
            ]
            .map(f64::to_bits)
        };
        assert_eq!(bits((&w1, &x2)), bits((&row.0, &row.1)));
        for bad in [
            "1 2 3 4 5 6 7 8",
            "1 2 3 4 5 6 7 8 9 10",
            "1 2 3 4 x 6 7 8 9",
            "",
        ] {
            assert!(from_wire(bad).is_none(), "{bad:?}");
        }
    }

    /// A failed check ends W1x2 with status 1 at the row that failed it: the check's panic
    /// ended the process with status 101.
    #[test]
    fn a_failed_check_is_status_1_and_stops_the_run() {
        let args = Args {
            n: 10_000,
            range_ms: 30_000,
            runs: 1,
            split: Split::Interleaved,
            impls: vec!["concurrent-wheel".into(), "binary-heap".into()],
            child_row: false,
        };
        let rows = AtomicUsize::new(0);
        let status = run_with(&args, |name, runs, d, s| {
            rows.fetch_add(1, Ordering::Relaxed);
            checked(name, || {
                measure(runs, d, s, ConcurrentWheelTarget::new, || {
                    Clocked::new(d.len(), 100, Duration::ZERO)
                })
            })
        });
        assert!(status == ExitCode::FAILURE, "{status:?}");
        assert_eq!(rows.load(Ordering::Relaxed), 1, "the run went on");
    }

    /// As W1's: a few long tasks (due in 100 s) whose cancels fail, in a run where thousands of
    /// short ones (due in 1 ms) could have fired first but did not. The count check let them
    /// through under the short tasks' allowance.
    struct LosesLong {
        delay: Vec<AtomicU64>,
        stalled: std::sync::Once,
        len: AtomicUsize,
    }

    impl SharedTarget for LosesLong {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&self, delay_ms: u64, id: u64) -> usize {
            self.delay[id as usize].store(delay_ms, Ordering::Relaxed);
            self.len.fetch_add(1, Ordering::Relaxed);
            id as usize
        }
        fn cancel(&self, h: &usize) -> bool {
            self.stalled
                .call_once(|| std::thread::sleep(Duration::from_millis(20)));
            let long = self.delay[*h].load(Ordering::Relaxed) >= 100_000;
            let won = !(long && *h % 1000 == 1);
            if won {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            won
        }
        fn len(&self) -> usize {
            self.len.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn a_lost_cancel_of_a_task_not_yet_due_fails_w1x2_whatever_else_fell_due() {
        let d: Vec<u64> = (0..10_000)
            .map(|i| if i % 2 == 0 { 1 } else { 100_000 })
            .collect();
        for split in [Split::Interleaved, Split::Halves] {
            let run = std::panic::catch_unwind(|| {
                let t = LosesLong {
                    delay: (0..d.len()).map(|_| AtomicU64::new(0)).collect(),
                    stalled: std::sync::Once::new(),
                    len: AtomicUsize::new(0),
                };
                run_once(&t, &d, split)
            });
            assert!(
                run.is_err(),
                "{split:?}: 10 lost cancels of tasks due in 100 s passed"
            );
        }
    }

    /// Cancels lost to tasks that fell due before them are what a real clock does: the check
    /// failed the run once they were more than 2% of the cancels.
    #[test]
    fn cancels_lost_to_tasks_already_due_pass_w1x2() {
        let d = churn::delays(2_000, 5);
        for split in [Split::Interleaved, Split::Halves] {
            let t = Clocked::new(d.len(), 0, Duration::from_millis(20));
            run_once(&t, &d, split);
        }
    }

    /// A real-clock target whose count lies in one of two ways: every 100th cancel says it won
    /// but leaves its task pending (`lie`), or the kept tasks vanish (`!lie`). All delays are
    /// 100 s, so no task can have fired: W1x2 checked only the failed cancels there, and both
    /// passed.
    struct MiscountsOnAClock {
        lie: bool,
        cancels: AtomicUsize,
        len: AtomicUsize,
    }

    impl SharedTarget for MiscountsOnAClock {
        type Handle = usize;
        const EXACT: bool = false;
        fn add(&self, _delay_ms: u64, id: u64) -> usize {
            // Without `lie`, the kept tasks (i % 10 == 0) are lost at once.
            if self.lie || !id.is_multiple_of(10) {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            id as usize
        }
        fn cancel(&self, _h: &usize) -> bool {
            let k = self.cancels.fetch_add(1, Ordering::Relaxed) + 1;
            if !(self.lie && k.is_multiple_of(100)) {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            true
        }
        fn len(&self) -> usize {
            self.len.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn a_miscounting_real_clock_target_fails_w1x2() {
        let d = vec![100_000; 10_000];
        for lie in [true, false] {
            for split in [Split::Interleaved, Split::Halves] {
                let run = std::panic::catch_unwind(|| {
                    let t = MiscountsOnAClock {
                        lie,
                        cancels: AtomicUsize::new(0),
                        len: AtomicUsize::new(0),
                    };
                    run_once(&t, &d, split)
                });
                let what = if lie {
                    "90 cancels that left their tasks pending"
                } else {
                    "1,000 kept tasks lost"
                };
                assert!(run.is_err(), "{split:?}: {what} passed");
            }
        }
    }

    #[test]
    fn a_worker_panic_ends_the_run_with_a_panic_instead_of_a_hang() {
        // std's Barrier left the other worker and the measuring thread waiting for ever.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let delays = churn::delays(1_000, 30_000);
            let out = std::panic::catch_unwind(|| {
                run_once(&PanicsOnAdd::default(), &delays, Split::Halves)
            });
            let _ = tx.send(out.is_err());
        });
        let panicked = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("run_once hung after a worker panicked");
        assert!(
            panicked,
            "run_once returned figures after a worker panicked"
        );
    }

    /// W1x2's figures: each phase's wall over its own operations, both phases' over all of
    /// them, and the run's CPU per operation and over the phases' wall (the cores it got).
    #[test]
    fn w1x2s_figures_are_the_phases_time_over_their_operations() {
        let f = figures(4, 2, 400.0, 200.0, 1_200);
        assert_eq!(
            (f.add_ns, f.cancel_ns, f.all_ns, f.cpu_ns, f.cores),
            (100.0, 100.0, 100.0, 200.0, 2.0)
        );
    }

    /// The x1 column of W1x2's table: W1's phases over all of its operations, as x2's `all`
    /// (10 adds at 10 ns and 9 cancels at 20 ns: 280 ns over 19 operations).
    #[test]
    fn w1s_all_is_both_phases_wall_over_all_operations() {
        let w1 = ChurnFigures {
            add_ns: 10.0,
            cancel_ns: 20.0,
            ..ChurnFigures::default()
        };
        assert_eq!(w1_all_ns(&w1, 10), 280.0 / 19.0);
    }

    /// Every implementation W1x2 runs, on both splits: its adds, cancels and count pass the
    /// checks (exact ones on a manual clock: a cancel that removed nothing, or a count stuck
    /// at 0 or 1, fails them; on a real clock the kept tasks, due in up to 30 s, bound the
    /// count).
    #[test]
    fn every_implementation_passes_w1x2s_checks() {
        let d = churn::delays(100, 30_000);
        fn check<S: SharedTarget>(make: impl Fn() -> S, d: &[u64]) {
            for split in [Split::Interleaved, Split::Halves] {
                let t = make();
                run_once(&t, d, split);
                let before = t.len();
                let h = t.add(60_000, 1_000);
                assert_eq!(t.len(), before + 1);
                assert!(t.cancel(&h), "a pending task's cancel wins");
                assert!(!t.cancel(&h), "a cancelled task's cancel loses");
                assert_eq!(t.len(), before);
            }
        }
        check(system_timer::SystemTimer::<system_timer::Task>::new, &d);
        check(|| system_timer::Builder::<IdTask>::new().build(), &d);
        check(KeyedTimerTarget::new, &d);
        check(ConcurrentWheelTarget::new, &d);
        check(|| Mutex::new(DelayQueueTarget::new()), &d);
        check(|| Mutex::new(HeapTarget::default()), &d);
    }

    /// Each of W1x2's runs is a W1 run and a W1x2 run, each on a fresh structure.
    #[test]
    fn measure_runs_w1_and_w1x2_on_a_fresh_structure_each_run() {
        let d = churn::delays(100, 30_000);
        let (singles, shareds) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        measure(
            3,
            &d,
            Split::Halves,
            || {
                singles.set(singles.get() + 1);
                HeapTarget::default()
            },
            || {
                shareds.set(shareds.get() + 1);
                Mutex::new(HeapTarget::default())
            },
        );
        assert_eq!((singles.get(), shareds.get()), (3, 3));
    }

    /// A gate releases every party each round, and none before all have arrived (W1x2's phases
    /// start together, and its CPU reading waits for both workers); here the measuring party
    /// arrives 1 ms late, every round.
    #[test]
    fn a_gate_releases_every_party_each_round() {
        let gate = Gate::new(3);
        let (rounds, arrived) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let wait = |round: usize| {
            arrived.fetch_add(1, Ordering::SeqCst);
            gate.wait();
            let all = arrived.load(Ordering::SeqCst);
            assert!(all >= 3 * (round + 1), "released after {all} arrivals");
        };
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for round in 0..100 {
                        wait(round);
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            for round in 0..100 {
                std::thread::sleep(Duration::from_millis(1));
                wait(round);
            }
        });
        assert_eq!(rounds.load(Ordering::Relaxed), 200);
    }

    #[test]
    fn a_cancelled_handle_is_dropped_inside_the_cancel_phase_as_in_w1() {
        // W1 drops each cancelled handle in its cancel phase (what a caller does right after
        // cancelling); W1x2 must too, or its cancels skip that cost and x2/x1 flatters x2.
        let delays = churn::delays(100, 30_000);
        for split in [Split::Interleaved, Split::Halves] {
            let f = run_once(&SlowDropTarget::default(), &delays, split);
            // 90 cancelled handles, 45 per thread, 200 µs each: at least 9 ms of cancel-phase
            // wall, at least 100 µs per cancel.
            assert!(f.cancel_ns >= 90_000.0, "{split:?}: {f:?}");
        }
        // W1 (the same harness on one thread) already counts the drops.
        struct One(SlowDropTarget);
        impl ChurnTarget for One {
            type Handle = SlowDrop;
            fn add(&mut self, d: u64, id: u64) -> SlowDrop {
                self.0.add(d, id)
            }
            fn cancel(&mut self, h: &SlowDrop) -> bool {
                self.0.cancel(h)
            }
            fn len(&self) -> usize {
                self.0.len()
            }
        }
        let f = churn::run_once(&mut One(SlowDropTarget::default()), &delays);
        assert!(f.cancel_ns >= 180_000.0, "{f:?}");
    }
}
