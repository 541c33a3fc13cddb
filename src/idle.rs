//! W3 idle cost from BENCHMARKS.md: start an implementation, add one task due in 60 s, let it
//! settle, then stay idle; report the process CPU over the idle stretch (all threads:
//! `CLOCK_PROCESS_CPUTIME_ID`, see `measure::process_cpu_ns`), the CPU of the threads other
//! than the measuring one (their `schedstat` sum), and how often the implementation's thread
//! woke up. Each implementation is shut down before the next starts.
#![allow(clippy::disallowed_methods)] // benchmark code: std threads and clocks on purpose
#![allow(clippy::disallowed_types)] // a std Mutex holds the delay queue's stop waker

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use system_timer::SystemTimer;
use tokio_util::time::DelayQueue;

use crate::measure::{
    exit_status, machine_line, other_threads_cpu_ns, process_cpu_ns, threads_asleep, threads_named,
    while_stdout_taken, ThreadUse,
};
use crate::precision::{current_thread_runtime, HeapTimer};
use crate::{note, out};

/// The implementations W3 knows, by name.
pub const IMPLS: &[&str] = &[
    "system-timer",
    "delay-queue",
    "binary-heap-condvar",
    "polling-reaper-200ms",
    "no-timer",
];

/// Flags of `w3`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Length of the idle stretch, in seconds (at least 0.001, at most 10^6).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Delay of the one task (seconds, at most 10^7); it must not fall due during the run, nor
    /// must the start of the timer's wheel bucket that holds it (checked: an error).
    #[arg(long, default_value_t = 60)]
    pub delay_s: u64,
    /// Time to settle between the add and the idle stretch (ms, at most an hour).
    #[arg(long, default_value_t = 200, value_parser = crate::measure::wait_ms())]
    pub settle_ms: u64,
    /// Implementations, comma separated (`no-timer`: the process alone, the baseline).
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(IMPLS),
          default_values_t = IMPLS.iter().map(|s| s.to_string()))]
    pub impls: Vec<String>,
}

/// One implementation under W3, started with its one task.
trait Target {
    /// Wake-ups of the implementation's thread so far (None: it has no thread to count).
    fn wakeups(&self) -> Option<u64>;
    /// Stops and joins the implementation's threads.
    fn shutdown(self);
}

impl Target for SystemTimer {
    fn wakeups(&self) -> Option<u64> {
        Some(self.stats().reaper_wakeups)
    }
    fn shutdown(self) {
        // The idle task (due in 60 s) is handed back unrun: W3 measures only the wait.
        drop(SystemTimer::shutdown(&self));
    }
}

impl Target for HeapTimer {
    fn wakeups(&self) -> Option<u64> {
        Some(HeapTimer::wakeups(self))
    }
    fn shutdown(self) {
        HeapTimer::shutdown(self);
    }
}

/// Nothing at all: the baseline.
struct NoTimer;

impl Target for NoTimer {
    fn wakeups(&self) -> Option<u64> {
        None
    }
    fn shutdown(self) {}
}

/// A stop flag a future can wait for: set it, and the waker of the last poll is woken.
#[derive(Debug, Default)]
struct Stop {
    flag: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Stop {
    /// True once stopped; otherwise registers the task to be woken by [`stop`](Self::stop).
    fn poll(&self, cx: &Context<'_>) -> bool {
        if self.flag.load(Ordering::Acquire) {
            return true;
        }
        *self.waker.lock().expect("not poisoned") = Some(cx.waker().clone());
        self.flag.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().expect("not poisoned").take() {
            w.wake();
        }
    }
}

/// tokio-util's `DelayQueue` on a thread of its own: a current-thread runtime awaiting the
/// queue's next expiry (or the stop signal). Wake-ups are polls of that future.
struct DelayQueueThread {
    stop: Arc<Stop>,
    polls: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

impl DelayQueueThread {
    fn start(delay: Duration) -> Self {
        let stop = Arc::new(Stop::default());
        let polls = Arc::new(AtomicU64::new(0));
        let (s, p) = (Arc::clone(&stop), Arc::clone(&polls));
        let thread = std::thread::Builder::new()
            .name("delay-queue".into())
            .spawn(move || {
                let rt = current_thread_runtime();
                rt.block_on(async {
                    let mut queue = DelayQueue::new();
                    queue.insert((), delay);
                    std::future::poll_fn(|cx| {
                        p.fetch_add(1, Ordering::Relaxed);
                        if s.poll(cx) {
                            return Poll::Ready(());
                        }
                        // An expiry (not expected during the run) is simply taken out.
                        while let Poll::Ready(Some(_)) = queue.poll_expired(cx) {}
                        Poll::Pending
                    })
                    .await;
                });
            })
            .expect("spawn the delay queue's thread");
        DelayQueueThread {
            stop,
            polls,
            thread,
        }
    }
}

impl Target for DelayQueueThread {
    fn wakeups(&self) -> Option<u64> {
        Some(self.polls.load(Ordering::Relaxed))
    }
    fn shutdown(self) {
        self.stop.stop();
        self.thread.join().expect("delay queue thread panicked");
    }
}

/// What one implementation's idle stretch cost.
struct Row {
    cpu_ns: u64,
    /// CPU of the threads other than the measuring one (the implementation's own).
    others_ns: u64,
    wall: Duration,
    wakeups: Option<u64>,
    /// What the threads named by `measure`'s prefix used in the stretch (CPU and sleeps, read
    /// from /proc: the implementation's own counter of wake-ups counts only the sleeps it knows
    /// of, and nothing of a thread that spins without sleeping).
    named: Option<ThreadUse>,
}

/// The system timer's name in W3: its threads are `w3-reaper` and `w3-executor-<i>`.
const TIMER_NAME: &str = "w3";

/// The most CPU the system timer's threads may use in the idle stretch, as a fraction of it:
/// asleep, they use none (their `schedstat` does not move); one that spins uses the stretch.
const MAX_IDLE_CPU_SHARE: f64 = 0.1;

/// Settles, measures the idle stretch, shuts `t` down; also measures the threads whose names
/// start with `threads`, if given.
fn measure(t: impl Target, a: &Args, threads: Option<&str>) -> Row {
    std::thread::sleep(Duration::from_millis(a.settle_ms));
    // And until the named threads are asleep (a thread still starting on a loaded machine
    // would go to sleep in the stretch: a sleep counted against it), for at most 5 s more (one
    // that never sleeps is then measured, and fails).
    if let Some(prefix) = threads {
        let give_up = Instant::now() + Duration::from_secs(5);
        while !threads_asleep(prefix) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let w0 = t.wakeups();
    let named0 = threads.map(threads_named);
    let others0 = other_threads_cpu_ns();
    let cpu0 = process_cpu_ns();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let cpu = process_cpu_ns().saturating_sub(cpu0);
    let wall = t0.elapsed();
    let others = other_threads_cpu_ns().saturating_sub(others0);
    let named = threads
        .map(threads_named)
        .zip(named0)
        .map(|(b, a)| ThreadUse {
            cpu_ns: b.cpu_ns.saturating_sub(a.cpu_ns),
            sleeps: b.sleeps.saturating_sub(a.sleeps),
        });
    let wakeups = t.wakeups().zip(w0).map(|(b, a)| b - a);
    t.shutdown();
    Row {
        cpu_ns: cpu,
        others_ns: others,
        wall,
        wakeups,
        named,
    }
}

/// Why a system timer's row fails W3 (zero CPU, zero wake-ups while idle), if it does: its
/// reaper counted a wake-up, or its threads slept (each sleep in the stretch follows a wake-up
/// in it), or used more than [`MAX_IDLE_CPU_SHARE`] of the stretch (a thread spinning without
/// sleeping counts no wake-up anywhere).
fn idle_failure(row: &Row) -> Option<String> {
    if row.wakeups != Some(0) {
        return Some(format!("its reaper woke up {:?} times", row.wakeups));
    }
    let Some(named) = row.named else {
        return Some("its threads were not measured".into());
    };
    let cpu_bound = row.wall.as_nanos() as f64 * MAX_IDLE_CPU_SHARE;
    if named.sleeps != 0 || named.cpu_ns as f64 > cpu_bound {
        return Some(format!(
            "its threads slept {} times and used {:.1} µs of CPU (at most {:.1})",
            named.sleeps,
            named.cpu_ns as f64 / 1e3,
            cpu_bound / 1e3
        ));
    }
    None
}

/// The shortest idle stretch, s: a shorter one measures little but the CPU readings around it
/// (a few µs), which the table then reports per second of the stretch.
const MIN_IDLE_S: f64 = 0.001;

/// The flags' bounds: an idle stretch of some length (its CPU is reported per second of it),
/// over before the one task falls due (a task that fires would count as a wake-up).
fn validate(a: &Args) -> Result<(), String> {
    // Any positive length was taken: `--seconds 1e-300` slept 0 ns, printed "CPU µs/s"
    // above 2,000,000 (more than the machine's two cores) and passed the zero-wake-up check
    // on a stretch of no time.
    if !(a.seconds >= MIN_IDLE_S && a.seconds <= 1e6) {
        return Err(format!("need {MIN_IDLE_S} <= --seconds <= 1000000"));
    }
    let longest_s = crate::churn::MAX_RANGE_MS / 1000;
    if a.delay_s > longest_s {
        return Err(format!("need --delay-s <= {longest_s}"));
    }
    let busy_s = a.seconds + a.settle_ms as f64 / 1000.0;
    if a.delay_s as f64 <= busy_s {
        return Err(format!(
            "--delay-s ({}) must exceed the settle time and the idle stretch ({busy_s} s)",
            a.delay_s
        ));
    }
    Ok(())
}

/// The heap timer's poll interval in row `name`: Kafka's reaper wakes every 200 ms; the plain
/// heap sleeps until its task.
fn heap_poll(name: &str) -> Option<Duration> {
    (name == "polling-reaper-200ms").then_some(Duration::from_millis(200))
}

/// Runs the workload and prints its table; returns the process exit code.
pub fn run(args: &Args) -> ExitCode {
    let a = args;
    if let Err(e) = validate(a) {
        note!("error: {e}");
        return ExitCode::from(2);
    }
    let delay = Duration::from_secs(a.delay_s);
    out!(
        "W3 idle: one task due in {} s, settle {} ms, then {} s idle; process CPU over the idle \
         stretch (all threads) and wake-ups",
        a.delay_s,
        a.settle_ms,
        a.seconds
    );
    out!("machine: {}", machine_line());
    out!(
        "{:<22} {:>10} {:>10} {:>16} {:>9}",
        "impl",
        "CPU s",
        "CPU µs/s",
        "its threads µs",
        "wake-ups"
    );
    let mut failed = false;
    for name in while_stdout_taken(&a.impls) {
        let row = match name.as_str() {
            "system-timer" => {
                let timer = SystemTimer::builder().name(TIMER_NAME).build();
                timer.add(delay, || ()).expect("timer running");
                // The reaper wakes at the start of the wheel bucket that holds the task, which
                // can be well before its delay (a level's bucket spans tick × wheel size ^
                // level): one inside the stretch is a wake-up W3 would report as a failure.
                let busy = Duration::from_millis(a.settle_ms) + Duration::from_secs_f64(a.seconds);
                let wakes_in = timer
                    .next_expiration()
                    .map(|x| x.saturating_sub(timer.now()));
                if let Some(w) = wakes_in.filter(|&w| w <= busy) {
                    note!(
                        "error: --delay-s {}: the timer's bucket holding the task starts in {:.1} s, \
                         within the settle time and idle stretch ({:.1} s): its reaper will wake \
                         then; use a longer --delay-s",
                        a.delay_s,
                        w.as_secs_f64(),
                        busy.as_secs_f64()
                    );
                    return ExitCode::from(2);
                }
                measure(timer, a, Some(&format!("{TIMER_NAME}-")))
            }
            "delay-queue" => measure(DelayQueueThread::start(delay), a, None),
            "binary-heap-condvar" | "polling-reaper-200ms" => {
                let heap = HeapTimer::start(heap_poll(name), |_, _| ());
                heap.add(Instant::now() + delay, 0);
                measure(heap, a, None)
            }
            "no-timer" => measure(NoTimer, a, None),
            other => unreachable!("clap checked the name: {other}"),
        };
        let failure = (name == "system-timer")
            .then(|| idle_failure(&row))
            .flatten();
        out!(
            "{:<22} {:>10.6} {:>10.1} {:>16.1} {:>9}",
            name,
            row.cpu_ns as f64 / 1e9,
            row.cpu_ns as f64 / 1e3 / row.wall.as_secs_f64(),
            row.others_ns as f64 / 1e3,
            row.wakeups.map_or("-".into(), |w| w.to_string())
        );
        if let Some(why) = failure {
            out!("FAILED: system-timer was not idle: {why}");
            failed = true;
        }
    }
    out!("CPU s: all threads, the measuring one too (its /proc reads are the floor: see no-timer)");
    out!("its threads: all threads but the measuring one");
    out!(
        "wake-ups: system-timer's reaper_wakeups; the heap worker's returns from its condvar wait; \
         delay-queue: polls of the future awaiting the queue"
    );
    out!(
        "system-timer fails if its reaper counts a wake-up, or its threads sleep (each sleep \
         follows a wake-up) or use more than {}% of the stretch's CPU (/proc)",
        MAX_IDLE_CPU_SHARE * 100.0
    );
    exit_status(!failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own and fails if it has not returned within 20 s (a
    /// shutdown that never returns fails instead of hanging the test run).
    fn within_20_s(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("returned within 20 s");
    }

    /// Waits until `done`, failing after 20 s.
    fn wait_until(mut done: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < give_up, "not done within 20 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A target whose wake-up count grows by 10 per reading, and that records its shutdown.
    struct Counts<'a> {
        readings: &'a std::cell::Cell<u64>,
        shut_down: &'a std::cell::Cell<bool>,
    }

    impl Target for Counts<'_> {
        fn wakeups(&self) -> Option<u64> {
            self.readings.set(self.readings.get() + 1);
            Some(10 * self.readings.get())
        }
        fn shutdown(self) {
            self.shut_down.set(true);
        }
    }

    /// A row's wake-ups are those between the readings around the idle stretch, and the
    /// implementation is shut down after it.
    #[test]
    fn a_rows_wake_ups_are_the_idle_stretchs_own() {
        let (readings, shut_down) = (std::cell::Cell::new(0), std::cell::Cell::new(false));
        let a = Args {
            seconds: MIN_IDLE_S,
            delay_s: 60,
            settle_ms: 0,
            impls: Vec::new(),
        };
        let t = Counts {
            readings: &readings,
            shut_down: &shut_down,
        };
        let row = measure(t, &a, None);
        assert_eq!(
            row.wakeups,
            Some(10),
            "20 read after the stretch, 10 before"
        );
        assert!(shut_down.get());
        assert_eq!(
            measure(NoTimer, &a, None).wakeups,
            None,
            "no thread: no count"
        );
    }

    /// The timer's row counts its reaper's wake-ups (W3 fails on any): here two or more, from
    /// tasks due in 1 ms.
    #[test]
    fn the_system_timers_wake_ups_are_its_reapers() {
        let timer = SystemTimer::new();
        wait_until(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            timer
                .add(Duration::from_millis(1), move || {
                    let _ = tx.send(());
                })
                .expect("timer running");
            rx.recv_timeout(Duration::from_secs(20)).expect("fired");
            timer.stats().reaper_wakeups >= 2
        });
        let w = Target::wakeups(&timer).expect("counted");
        assert!(w >= 2 && w <= timer.stats().reaper_wakeups, "{w}");
        Target::shutdown(timer);
    }

    /// The heap rows count their worker's wake-ups (here polling every millisecond: W3's
    /// `polling-reaper-200ms` polls every 200 ms).
    #[test]
    fn the_heap_timers_wake_ups_are_its_workers() {
        let heap = HeapTimer::start(Some(Duration::from_millis(1)), |_, _| ());
        wait_until(|| heap.wakeups() >= 2);
        let w = Target::wakeups(&heap).expect("counted");
        assert!(w >= 2 && w <= heap.wakeups(), "{w}");
        Target::shutdown(heap);
    }

    /// A row fails W3 on a counted wake-up, on its named threads' sleeps, or on their CPU
    /// above a tenth of the stretch (a spinning thread counts no wake-up), and when its threads
    /// were not measured; it passes with none of these.
    #[test]
    fn an_idle_row_fails_on_wake_ups_sleeps_or_cpu() {
        let row = |wakeups, named| Row {
            cpu_ns: 0,
            others_ns: 0,
            wall: Duration::from_millis(100),
            wakeups,
            named,
        };
        let used = |cpu_ns, sleeps| Some(ThreadUse { cpu_ns, sleeps });
        assert_eq!(idle_failure(&row(Some(0), used(0, 0))), None);
        assert_eq!(idle_failure(&row(Some(0), used(10_000_000, 0))), None);
        for bad in [
            row(Some(1), used(0, 0)),
            row(None, used(0, 0)),
            row(Some(0), None),
            row(Some(0), used(0, 1)),
            row(Some(0), used(10_000_001, 0)),
        ] {
            assert!(
                idle_failure(&bad).is_some(),
                "{:?} {:?}",
                bad.wakeups,
                bad.named
            );
        }
    }

    /// `measure` reads the named threads' use from /proc over the stretch: none for a thread
    /// blocked throughout, sleeps (and a failure) for one that wakes every millisecond.
    #[test]
    fn the_named_threads_use_is_measured_over_the_stretch() {
        let a = Args {
            seconds: 0.2,
            delay_s: 60,
            settle_ms: 50,
            impls: Vec::new(),
        };
        // Blocked on a channel for the whole stretch.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::Builder::new()
            .name("w3test-blocked".into())
            .spawn(move || rx.recv())
            .unwrap();
        let row = measure(FixedCount(0), &a, Some("w3test-blocked"));
        drop(tx);
        blocked.join().unwrap().unwrap_err();
        assert_eq!(
            row.named,
            Some(ThreadUse::default()),
            "asleep: nothing moved"
        );
        assert_eq!(idle_failure(&row), None);
        // Waking every millisecond, its counter (as a spinning reaper's) saying nothing.
        let stop = Arc::new(AtomicBool::new(false));
        let ticking = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("w3test-ticking".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
                .unwrap()
        };
        let row = measure(FixedCount(0), &a, Some("w3test-ticking"));
        stop.store(true, Ordering::Relaxed);
        ticking.join().unwrap();
        assert!(row.named.is_some_and(|u| u.sleeps > 0), "{:?}", row.named);
        assert!(idle_failure(&row).is_some());
    }

    /// A target with no thread of its own whose counter reads a fixed number.
    struct FixedCount(u64);

    impl Target for FixedCount {
        fn wakeups(&self) -> Option<u64> {
            Some(self.0)
        }
        fn shutdown(self) {}
    }

    /// Kafka's reaper polls every 200 ms; the plain heap does not poll.
    #[test]
    fn only_the_polling_reaper_polls() {
        assert_eq!(
            heap_poll("polling-reaper-200ms"),
            Some(Duration::from_millis(200))
        );
        assert_eq!(heap_poll("binary-heap-condvar"), None);
    }

    /// The delay queue's thread awaits its queue until stopped, counting its polls (here its
    /// task due in 1 ms expires: two polls at least); shut down, it has stopped and returned.
    #[test]
    fn the_delay_queue_thread_counts_its_polls_and_stops_when_shut_down() {
        within_20_s(|| {
            let t = DelayQueueThread::start(Duration::from_millis(1));
            let polls = Arc::clone(&t.polls);
            wait_until(|| polls.load(Ordering::Relaxed) >= 2);
            let w = t.wakeups().expect("counted");
            assert!(w >= 2 && w <= polls.load(Ordering::Relaxed), "{w}");
            std::thread::sleep(Duration::from_millis(50));
            assert!(!t.thread.is_finished(), "awaits its queue until stopped");
            t.shutdown();
            assert_eq!(Arc::strong_count(&polls), 1, "the thread has returned");
        });
    }

    /// W3 fails only on the system timer's use in the idle stretch: it passes the timer idle,
    /// and a baseline's row (the process alone: no count) is not checked. The stretch is long
    /// enough (100 ms) for a reaper that spins to show in its thread's /proc CPU (a running
    /// thread's lags by up to a scheduler tick).
    #[test]
    fn w3_passes_an_idle_system_timer_next_to_a_baseline() {
        let a = Args {
            seconds: 0.1,
            delay_s: 60,
            settle_ms: 100,
            impls: vec!["system-timer".into(), "no-timer".into()],
        };
        assert_eq!(format!("{:?}", run(&a)), format!("{:?}", ExitCode::SUCCESS));
        // And refuses bad flags (an idle stretch of no time) with status 2, running nothing.
        let bad = Args { seconds: 0.0, ..a };
        assert_eq!(
            format!("{:?}", run(&bad)),
            format!("{:?}", ExitCode::from(2))
        );
    }

    /// A delay past the stretch whose wheel bucket starts inside it (12 s: a bucket of 8 s from
    /// 8 s, at the default tick and wheel size) is refused before any measuring; it used to be
    /// measured, and reported as a failure of the timer ("reaper woke up while idle").
    #[test]
    fn a_delay_whose_bucket_starts_within_the_stretch_is_refused() {
        let a = Args {
            seconds: 10.0,
            delay_s: 12,
            settle_ms: 200,
            impls: vec!["system-timer".into()],
        };
        assert!(validate(&a).is_ok(), "the delay itself is past the stretch");
        let t0 = Instant::now();
        assert_eq!(run(&a), ExitCode::from(2));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "refused before the stretch"
        );
    }

    #[test]
    fn bad_flags_are_rejected() {
        let ok = Args {
            seconds: 10.0,
            delay_s: 60,
            settle_ms: 200,
            impls: Vec::new(),
        };
        assert!(validate(&ok).is_ok());
        for seconds in [0.0, -1.0, f64::NAN, 2e6, 1e-300, MIN_IDLE_S / 2.0] {
            assert!(
                validate(&Args {
                    seconds,
                    ..ok.clone()
                })
                .is_err(),
                "{seconds}"
            );
        }
        assert!(validate(&Args {
            seconds: MIN_IDLE_S,
            ..ok.clone()
        })
        .is_ok());
        // Beyond what the implementations take: the heap's deadline overflowed `Instant` and
        // the delay queue refused it, both with a panic.
        assert!(validate(&Args {
            delay_s: u64::MAX,
            ..ok.clone()
        })
        .is_err());
        assert!(validate(&Args {
            delay_s: crate::churn::MAX_RANGE_MS / 1000,
            ..ok.clone()
        })
        .is_ok());
        assert!(validate(&Args {
            delay_s: crate::churn::MAX_RANGE_MS / 1000 + 1,
            ..ok.clone()
        })
        .is_err());
        // The task would fall due during the idle stretch.
        assert!(validate(&Args {
            delay_s: 10,
            ..ok.clone()
        })
        .is_err());
    }
}
