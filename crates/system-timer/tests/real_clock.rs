//! Properties on the real (system) clock: nothing fires early, nothing is lost. No exact
//! timings are asserted; timeouts only catch hangs.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std clock and locks on purpose

mod common;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use system_timer::{Builder, Clock, ScheduleError, SystemClock, SystemTimer, TimerTask};

const MS: Duration = Duration::from_millis(1);
/// A reaper grace no test outlives: only callers of `advance_if_due` can run due tasks in time.
const HOUR: Duration = Duration::from_secs(3600);
/// How long a test waits for something that must happen before it calls it a hang.
const HANG: Duration = Duration::from_secs(10);

/// Waits (polling every millisecond) until `done`; panics with `what` after [`HANG`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < HANG, "hung: {what}");
        thread::sleep(MS);
    }
}

/// The current thread's name ("" if unnamed).
fn thread_name() -> String {
    thread::current().name().unwrap_or("").to_owned()
}

/// Runs per task, and the tasks that ran early (by how much).
type Counts = (Arc<Vec<AtomicUsize>>, Arc<Mutex<Vec<(usize, Duration)>>>);

/// Adds task `i`, due `delay` from now: it counts its run in `runs[i]` and notes itself in
/// `early` if it runs before its due instant (nanosecond resolution).
fn add_counted(timer: &SystemTimer, delay: Duration, i: usize, (runs, early): &Counts) {
    let (runs, early) = (runs.clone(), early.clone());
    let due = Instant::now() + delay;
    timer
        .add(delay, move || {
            let now = Instant::now();
            if now < due {
                early.lock().unwrap().push((i, due - now));
            }
            runs[i].fetch_add(1, SeqCst);
        })
        .unwrap();
}

/// What [`add_recorder`]'s task records: the name of the thread it ran on, and when.
type Record = Arc<Mutex<Option<(String, Instant)>>>;

/// Adds a task due `delay` from now that records where and when it ran; returns the record
/// (empty until it runs) and the instant before which it must not run.
fn add_recorder(timer: &SystemTimer, delay: Duration) -> (Record, Instant) {
    let ran: Record = Arc::default();
    let r = ran.clone();
    let due = Instant::now() + delay;
    timer
        .add(delay, move || {
            *r.lock().unwrap() = Some((thread_name(), Instant::now()));
        })
        .unwrap();
    (ran, due)
}

/// 10,000 tasks with random delays up to 200 ms: each records `Instant::now()` when it runs;
/// none runs before `instant taken just before its add + delay`, measured in nanoseconds, and
/// every one runs exactly once.
#[test]
fn ten_thousand_tasks_none_early_in_nanoseconds() {
    const N: usize = 10_000;
    let timer = SystemTimer::new();
    let counts: Counts = (
        Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect()),
        Arc::default(),
    );
    let (runs, early) = &counts;
    let mut state = 42u64;
    for i in 0..N {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        add_counted(
            &timer,
            Duration::from_nanos(state % 200_000_000),
            i,
            &counts,
        );
    }
    let t0 = Instant::now();
    while runs.iter().any(|r| r.load(SeqCst) == 0) {
        assert!(t0.elapsed() < Duration::from_secs(60), "tasks lost or hung");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The shutdown joins the executor: a task that was to run a second time has run by then,
    // or comes back pending.
    assert!(timer.shutdown().is_empty(), "a task still pending");
    assert!(
        early.lock().unwrap().is_empty(),
        "early fires: {:?}",
        early.lock().unwrap()
    );
    assert!(runs.iter().all(|r| r.load(SeqCst) == 1), "a task ran twice");
    let st = timer.stats();
    assert_eq!(
        (st.scheduled, st.fired, st.pending),
        (N as u64, N as u64, 0)
    );
    assert_eq!(st.lateness.count, N as u64);
}

/// An idle timer does not wake its reaper: with one far task and nothing else, the reaper
/// sleeps (counted wake-ups stay flat over a quiet stretch).
///
/// The quiet stretch starts once a 5 ms task added after the far one has run: the reaper
/// counts a wake-up before the turn in which it advances, so every wake-up the adds and that
/// task cause is counted before the task runs, however late the reaper gets the CPU.
#[test]
fn an_idle_reaper_does_not_wake_up() {
    let timer = SystemTimer::new();
    timer.add(Duration::from_secs(600), || ()).unwrap();
    let (tx, rx) = mpsc::channel();
    timer.add(5 * MS, move || tx.send(()).unwrap()).unwrap();
    rx.recv_timeout(HANG)
        .expect("hung: the 5 ms task never ran");
    let before = timer.stats().reaper_wakeups;
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        timer.stats().reaper_wakeups,
        before,
        "the reaper woke while idle"
    );
}

/// Shutdown is prompt even when the reaper is asleep for a long time.
#[test]
fn shutdown_is_prompt() {
    let timer = SystemTimer::new();
    let fired = Arc::new(AtomicUsize::new(0));
    let f = fired.clone();
    timer
        .add(Duration::from_secs(3600), move || {
            f.fetch_add(1, SeqCst);
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let back = timer.shutdown();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown waited: {:?}",
        t0.elapsed()
    );
    assert_eq!(back.len(), 1);
    assert_eq!(fired.load(SeqCst), 0);
}

/// An add that creates an earlier bucket wakes the sleeping reaper: a 5 ms task added while the
/// reaper sleeps towards a one-hour deadline still runs promptly.
#[test]
fn an_earlier_add_wakes_the_reaper() {
    let timer = SystemTimer::builder().name("earlier").build();
    timer.add(Duration::from_secs(3600), || ()).unwrap();
    // The reaper asleep towards the hour (`S` in /proc). The add above created the earliest
    // bucket, so it woke the reaper if it slept (a futex wake: runnable before the add
    // returned); asleep again now, it has seen that bucket. Without /proc, a pause instead.
    if std::path::Path::new("/proc/self/task").exists() {
        wait_until("the reaper never went to sleep", || {
            common::thread_state("earlier-reaper") == Some('S')
        });
    } else {
        thread::sleep(Duration::from_millis(50));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    timer
        .add(Duration::from_millis(5), move || tx.send(()).unwrap())
        .unwrap();
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the reaper slept through an earlier task");
}

/// `SystemClock::deadline_base_ns` (the counter-based reading every `add` uses) is never below
/// the real clock read just before it, on two threads at once, before and after the counter's
/// calibration; and it is only a little above the real clock read just after it (a generous
/// 1 ms bound: the design bound is about 13 µs).
///
/// Each thread reads for at least 60 ms from its own start (a thread first scheduled late still
/// reads for that long), and until it has made 1,000 readings with the counter calibrated (where
/// it is trusted); a calibration that never comes is a hang ([`HANG`]).
#[test]
fn deadline_base_is_an_upper_bound_of_the_clock() {
    let clock = SystemClock::new();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let clock = clock.clone();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let (mut checks, mut calibrated_checks, mut max_ahead) = (0u64, 0u64, 0u64);
                // Long enough to cross the calibration (10 ms) and many anchor refreshes (1 ms).
                while t0.elapsed() < Duration::from_millis(60) || calibrated_checks <= 1_000 {
                    assert!(
                        t0.elapsed() < HANG,
                        "hung: {checks} readings, {calibrated_checks} of them calibrated where \
                         the counter is trusted"
                    );
                    let calibrated =
                        SystemClock::counter_calibrated() == SystemClock::counter_trusted();
                    let before = clock.now_ns();
                    let base = clock.deadline_base_ns();
                    let after = clock.now_ns();
                    assert!(
                        base >= before,
                        "deadline base {base} below the clock {before}"
                    );
                    assert!(
                        base <= after + 1_000_000,
                        "deadline base {base} far ahead of the clock {after}"
                    );
                    max_ahead = max_ahead.max(base.saturating_sub(after));
                    checks += 1;
                    calibrated_checks += u64::from(calibrated);
                }
                (checks, calibrated_checks, max_ahead)
            })
        })
        .collect();
    for t in threads {
        let (checks, calibrated_checks, max_ahead) = t.join().unwrap();
        eprintln!(
            "{checks} readings ({calibrated_checks} calibrated), at most {max_ahead} ns ahead of \
             the clock"
        );
    }
    // Where the kernel does not keep time with the cycle counter, the counter is never used.
    assert_eq!(
        SystemClock::counter_calibrated(),
        SystemClock::counter_trusted(),
        "calibrated exactly where the counter is trusted"
    );
}

/// Waits (reading deadlines, which drive the calibration) until the cycle counter is
/// calibrated; false at once where the kernel does not keep time with the counter.
fn counter_calibrated() -> bool {
    if !SystemClock::counter_trusted() {
        return false;
    }
    let clock = SystemClock::new();
    wait_until("the counter's calibration", || {
        clock.deadline_base_ns();
        SystemClock::counter_calibrated()
    });
    true
}

/// The counter is trusted exactly where the kernel keeps time with it itself: Linux with the
/// `tsc` or `arch_sys_counter` clock source.
#[test]
fn the_counter_is_trusted_exactly_where_the_kernel_keeps_time_with_it() {
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    assert_eq!(
        SystemClock::counter_trusted(),
        matches!(source.trim(), "tsc" | "arch_sys_counter"),
        "clock source {source:?}"
    );
}

/// `SystemClock::exact` takes its deadline bases from the real clock, even once the counter
/// is calibrated: a base is never ahead of the clock read just after it.
#[test]
fn an_exact_clock_takes_deadline_bases_from_the_real_clock() {
    counter_calibrated();
    let clock = SystemClock::exact();
    for _ in 0..10_000 {
        let base = clock.deadline_base_ns();
        let after = clock.now_ns();
        assert!(
            base <= after,
            "deadline base {base} ahead of the clock {after}"
        );
    }
}

/// Once the counter is calibrated, most deadline bases of a `SystemClock::new` come from it:
/// they are ahead of the clock read just after them (by the 1 µs slack at least), where a real
/// reading never is. (A generous tenth: refreshes and preemptions take the rest.)
#[test]
fn a_calibrated_counter_gives_most_deadline_bases() {
    if !counter_calibrated() {
        return; // the counter is never used here
    }
    let clock = SystemClock::new();
    let ahead = (0..10_000)
        .filter(|_| {
            let base = clock.deadline_base_ns();
            base > clock.now_ns()
        })
        .count();
    assert!(
        ahead >= 1_000,
        "only {ahead} of 10,000 deadline bases from the counter"
    );
}

/// After the counter's calibration, 10,000 tasks added through keys (`add_keyed`, whose
/// deadlines come from the counter-based reading) on two threads: none runs before `instant
/// taken just before its add + delay`, in nanoseconds; every one runs exactly once.
#[test]
fn keyed_tasks_after_calibration_none_early_in_nanoseconds() {
    const N: usize = 10_000;
    let timer = Arc::new(SystemTimer::new());
    // Where the counter is trusted, wait (bounded by `HANG`) until it is calibrated, so that the
    // adds take their deadlines from it; elsewhere they take them from the real clock.
    counter_calibrated();
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let adders: Vec<_> = (0..2)
        .map(|t| {
            let (timer, early, runs) = (timer.clone(), early.clone(), runs.clone());
            std::thread::spawn(move || {
                let mut state = 7u64 + t as u64;
                for i in (t..N).step_by(2) {
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    // Sub-millisecond delays too: they cross tick boundaries at any phase.
                    let delay = Duration::from_nanos(state % 50_000_000);
                    let (early, runs) = (early.clone(), runs.clone());
                    let due = Instant::now() + delay;
                    timer
                        .add_keyed(delay, move || {
                            let now = Instant::now();
                            if now < due {
                                early.lock().unwrap().push((i, due - now));
                            }
                            runs[i].fetch_add(1, SeqCst);
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for a in adders {
        a.join().unwrap();
    }
    let t0 = Instant::now();
    while runs.iter().any(|r| r.load(SeqCst) == 0) {
        assert!(t0.elapsed() < Duration::from_secs(60), "tasks lost or hung");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The shutdown joins the executor: a task that was to run a second time has run by then,
    // or comes back pending.
    assert!(timer.shutdown().is_empty(), "a task still pending");
    assert_eq!(
        SystemClock::counter_calibrated(),
        SystemClock::counter_trusted()
    );
    assert!(
        early.lock().unwrap().is_empty(),
        "early fires: {:?}",
        early.lock().unwrap()
    );
    assert!(runs.iter().all(|r| r.load(SeqCst) == 1), "a task ran twice");
}

// ===== reaper grace: callers of `advance_if_due` advance the wheel for the reaper =====

/// With a grace no test outlives, a due task can only run in time if a caller advances the
/// wheel: the first `advance_if_due` after its bucket is due does, and (inline) runs it on the
/// calling thread, not before its deadline, counted as a caller advance.
///
/// Catches: `advance_if_due` doing nothing, or the reaper not publishing `help_at` before it
/// sleeps (hang); a helped advance that runs its tasks on another thread (thread check); one
/// that advances the wheel past the clock (early); a help that is not counted.
#[test]
fn a_caller_advances_a_due_bucket_for_a_reaper_with_a_grace() {
    let timer = SystemTimer::builder()
        .inline()
        .name("helped")
        .reaper_grace(HOUR)
        .build();
    let (ran, due) = add_recorder(&timer, 10 * MS);
    let t0 = Instant::now();
    let mut dispatched = 0;
    let (on, at) = loop {
        if let Some(x) = ran.lock().unwrap().clone() {
            break x;
        }
        assert!(t0.elapsed() < HANG, "no caller advanced the due bucket");
        thread::sleep(MS);
        dispatched += timer.advance_if_due();
    };
    assert_eq!(on, thread_name(), "ran on another thread");
    assert!(at >= due, "ran {:?} early", due - at);
    assert_eq!(dispatched, 1, "advance_if_due reports the task it ran");
    assert!(timer.stats().caller_advances >= 1);
    assert!(timer.shutdown().is_empty());
}

/// `advance_if_due_at` judges by the reading it is given: one from before the bucket was due
/// does nothing, however late the call; one far ahead of the clock advances only to the clock
/// (nothing early) and leaves the help to the next caller; the timer's own `deadline_base`
/// reading, once the bucket is due, runs the task on the calling thread.
///
/// Catches: the given reading ignored (the stale call runs the task); a reading ahead of the
/// clock taken as the time to advance to (early); a claim that is not handed on (hang).
///
/// The task is due 2 s after its add (well within [`HANG`]), so that "nothing is due yet" holds
/// however long this thread is kept off the CPU on a loaded machine.
#[test]
fn advance_if_due_at_judges_by_the_callers_reading() {
    let delay = Duration::from_secs(2);
    let timer = SystemTimer::builder().inline().reaper_grace(HOUR).build();
    let before = timer.deadline_base();
    let (ran, due) = add_recorder(&timer, delay);
    // The reaper, woken by the add, publishes the bucket for callers; then the reading far ahead
    // of the clock claims the help (counted) and advances only to the clock: nothing runs.
    let t0 = Instant::now();
    while timer.stats().caller_advances == 0 {
        assert!(
            t0.elapsed() < HANG,
            "hung: the reading ahead never claimed the help"
        );
        assert_eq!(
            timer.advance_if_due_at(before + HOUR),
            0,
            "nothing is due yet"
        );
        assert!(ran.lock().unwrap().is_none(), "ran early");
        thread::sleep(MS);
    }
    wait_until("the bucket is due", || Instant::now() >= due + 5 * MS);
    assert_eq!(
        timer.advance_if_due_at(before),
        0,
        "a stale reading must not advance"
    );
    assert!(ran.lock().unwrap().is_none());
    let t0 = Instant::now();
    let mut dispatched = 0;
    while ran.lock().unwrap().is_none() {
        assert!(t0.elapsed() < HANG, "no caller advanced the due bucket");
        dispatched += timer.advance_if_due_at(timer.deadline_base());
        thread::sleep(MS);
    }
    let (on, at) = ran.lock().unwrap().clone().unwrap();
    assert_eq!(on, thread_name(), "ran on another thread");
    assert!(at >= due, "ran {:?} early", due - at);
    assert_eq!(dispatched, 1);
    assert!(timer.shutdown().is_empty());
}

/// With a grace and no caller of `advance_if_due`, the reaper still runs a due task on its own
/// alarm, `grace` after the task's bucket: on the reaper thread, not before `deadline + grace -
/// one tick` (a bucket's time is at most a tick before its tasks' deadlines).
///
/// Catches: a reaper that waits for callers for ever (its alarm disarmed or never set: hang);
/// one that ignores the grace and wakes at the bucket (the lower bound); a caller advance
/// counted without a caller.
#[test]
fn without_callers_the_reaper_runs_due_tasks_after_its_grace() {
    let grace = 50 * MS;
    let timer = SystemTimer::builder()
        .inline()
        .name("graced")
        .reaper_grace(grace)
        .build();
    let (ran, due) = add_recorder(&timer, 5 * MS);
    wait_until("the reaper never ran the due task", || {
        ran.lock().unwrap().is_some()
    });
    let (name, at) = ran.lock().unwrap().clone().unwrap();
    assert!(name.ends_with("-reaper"), "ran on {name:?}");
    let earliest = due + grace - timer.tick();
    assert!(
        at >= earliest,
        "the reaper ran it {:?} before its grace was out",
        earliest - at
    );
    assert_eq!(timer.stats().caller_advances, 0);
    assert!(timer.shutdown().is_empty());
}

/// A thread that adds a task every millisecond (constant delay, so no add queues a new earliest
/// bucket) and calls `advance_if_due` after each keeps the wheel's time: the reaper, whose alarm
/// each caller advance moves past the next bucket, sleeps through. Every task still runs exactly
/// once and never early.
///
/// No rate is asserted (the real clock on a loaded machine stalls the caller at will): the
/// reaper may wake only around the caller's stalls, counted as the gaps between consecutive calls
/// of `advance_if_due` longer than `delay - tick` (4 ms). While every gap is shorter, each call
/// leaves its own task (due `delay` after its add, its bucket at most a tick earlier) in the
/// wheel, so no add finds the wheel empty (and queues the earliest bucket); and a caller claims
/// a bucket at least every 10 ms (each call queues one within 5 ms, and the first call past it
/// claims it) and moves the alarm to at least `grace` (25 ms) past the claim, so the alarm never
/// fires. A longer gap may leave the wheel empty (the next add wakes the reaper), or let the
/// alarm fire (the reaper runs what is due, and the next add wakes it again): three wake-ups per
/// long gap is generous. Two more: the warm-up's wake-up counted late, and slack.
///
/// Catches: a reaper that wakes at every bucket (the grace ignored: hundreds of wake-ups, and
/// no caller advances); a `rearm` that does not move the alarm, or a reaper that sleeps on its
/// condvar instead of the timerfd, so that it wakes once per grace while callers keep time (about
/// 24 wake-ups in 600 ms without long gaps); callers that never help (`caller_advances`); a
/// helped advance that runs a task twice or early.
#[cfg(target_os = "linux")]
#[test]
fn callers_keep_the_reaper_asleep() {
    const MAX: usize = 20_000;
    let grace = 25 * MS;
    let busy = Duration::from_millis(600);
    let timer = SystemTimer::builder()
        .inline()
        .name("asleep")
        .reaper_grace(grace)
        .build();
    let counts: Counts = (
        Arc::new((0..MAX).map(|_| AtomicUsize::new(0)).collect()),
        Arc::default(),
    );
    let (runs, early) = &counts;
    let delay = 5 * MS;
    let long = delay - timer.tick();
    let add = |i: usize| add_counted(&timer, delay, i, &counts);
    // Warm-up: the first add queues the earliest bucket and wakes the reaper.
    add(0);
    let mut last_call = Instant::now();
    timer.advance_if_due();
    let mut n = 1;
    thread::sleep(MS);
    let wakeups0 = timer.stats().reaper_wakeups;
    // The gaps between consecutive calls of `advance_if_due` (and from the last one to the
    // reading of the wake-ups) longer than `long`.
    let (mut long_gaps, mut longest) = (0u64, Duration::ZERO);
    let mut gap_since = |last: &mut Instant| {
        let now = Instant::now();
        let gap = now - *last;
        *last = now;
        longest = longest.max(gap);
        long_gaps += u64::from(gap > long);
    };
    let t0 = Instant::now();
    while t0.elapsed() < busy && n < MAX {
        add(n);
        n += 1;
        gap_since(&mut last_call);
        timer.advance_if_due();
        thread::sleep(MS);
    }
    gap_since(&mut last_call);
    let st = timer.stats();
    let wakeups = st.reaper_wakeups - wakeups0;
    wait_until("tasks lost or hung", || {
        runs[..n].iter().all(|r| r.load(SeqCst) > 0)
    });
    assert!(runs[..n].iter().all(|r| r.load(SeqCst) == 1), "ran twice");
    assert!(
        early.lock().unwrap().is_empty(),
        "early: {:?}",
        early.lock().unwrap()
    );
    eprintln!(
        "{n} tasks, {wakeups} reaper wake-ups, {long_gaps} gaps between calls over {long:?} \
         (longest {longest:?}), {} caller advances",
        st.caller_advances
    );
    assert!(st.caller_advances > 0, "no caller advanced the wheel");
    assert!(
        wakeups <= 2 + 3 * long_gaps,
        "the reaper woke {wakeups} times, with {long_gaps} gaps between calls over {long:?}: \
         callers do not keep it asleep"
    );
    assert!(timer.shutdown().is_empty());
}

/// In executor mode a caller's advance dispatches, and an executor runs the task (never the
/// caller).
///
/// Catches: a helped advance that runs tasks on the calling thread whatever the mode (thread
/// name); one that takes tasks out of the wheel and loses them (hang); `advance_if_due` doing
/// nothing (hang: the grace outlives the test).
#[test]
fn helped_advances_in_executor_mode_still_run_tasks_on_the_executors() {
    let timer = SystemTimer::builder()
        .executor_threads(1)
        .name("helpedx")
        .reaper_grace(HOUR)
        .build();
    let (tx, rx) = mpsc::channel();
    timer
        .add(5 * MS, move || tx.send(thread_name()).unwrap())
        .unwrap();
    let t0 = Instant::now();
    let mut dispatched = 0;
    let name = loop {
        if let Ok(name) = rx.try_recv() {
            break name;
        }
        assert!(t0.elapsed() < HANG, "no caller advanced the due bucket");
        thread::sleep(MS);
        dispatched += timer.advance_if_due();
    };
    assert!(name.contains("-executor-"), "ran on {name:?}");
    assert_eq!(dispatched, 1);
    assert!(timer.stats().caller_advances >= 1);
    assert!(timer.shutdown().is_empty());
}

/// Without a grace (the default), `advance_if_due` never advances, even with a bucket due and
/// the reaper busy: a task blocks the reaper (inline) while a second task's bucket comes due;
/// calls of `advance_if_due` return 0 and run nothing; the reaper runs it once freed.
///
/// Catches: a reaper that publishes `help_at` without a grace (the caller would claim the
/// first bucket's stale time and run the second task here); a `help` that advances without a
/// publication (`u64::MAX` not checked).
#[test]
fn advance_if_due_without_a_grace_does_nothing() {
    let timer = SystemTimer::builder().inline().name("nograce").build();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    timer
        .add(MS, move || {
            started_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(HANG);
        })
        .unwrap();
    started_rx
        .recv_timeout(HANG)
        .expect("the reaper never ran the first task");
    let ran = Arc::new(Mutex::new(None));
    let r = ran.clone();
    timer
        .add(2 * MS, move || *r.lock().unwrap() = Some(thread_name()))
        .unwrap();
    // The second task's bucket is due (its deadline is less than a tick after the bucket).
    let bucket = timer.next_expiration().expect("the second task is queued");
    wait_until("the clock never passed the bucket", || {
        timer.now() >= bucket + 2 * timer.tick()
    });
    for _ in 0..100 {
        assert_eq!(timer.advance_if_due(), 0);
    }
    assert!(ran.lock().unwrap().is_none(), "a caller ran it");
    assert_eq!(timer.stats().caller_advances, 0);
    release_tx.send(()).unwrap();
    wait_until("the reaper never ran the second task", || {
        ran.lock().unwrap().is_some()
    });
    let name = ran.lock().unwrap().clone().unwrap();
    assert!(name.ends_with("-reaper"), "ran on {name:?}");
    assert_eq!(timer.stats().caller_advances, 0);
    assert!(timer.shutdown().is_empty());
}

/// A task that counts its runs by id (its hand-back is counted from the shutdown's list), and
/// starts after its timer's shutdown returned; it takes a little while (50 µs, counted in
/// `busy`), so that the shutdown can come while an advance is running or dispatching a batch.
struct Tracked {
    id: usize,
    runs: Arc<Vec<AtomicUsize>>,
    shut: Arc<AtomicBool>,
    late: Arc<AtomicUsize>,
    busy: Arc<AtomicUsize>,
}

impl TimerTask for Tracked {
    fn run(self) {
        if self.shut.load(SeqCst) {
            self.late.fetch_add(1, SeqCst);
        }
        self.busy.fetch_add(1, SeqCst);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
        }
        self.runs[self.id].fetch_add(1, SeqCst);
        self.busy.fetch_sub(1, SeqCst);
    }
}

/// Three threads add tasks (delays 1..20 ms) and call `advance_if_due` after each, while the
/// reaper (a 2 ms grace) runs what they leave; the timer is shut down mid-way. Every accepted
/// task is run exactly once or handed back exactly once; refused ones (added after the
/// shutdown) neither; no task starts after `shutdown` returned. Inline and with two executors.
///
/// Catches: a shutdown that does not wait for the advances under way (a helper, or the reaper,
/// running its batch after `shutdown` returned, or handing it back too late to be returned:
/// the shutdown comes while a task of a batch runs); a helped advance that
/// loses its batch or runs a task also handed back.
#[test]
fn shutdown_while_callers_help_hands_back_or_runs_every_task_once() {
    // A few rounds: the shutdown lands at a different point of a batch each time.
    for _ in 0..3 {
        for executors in [0, 2] {
            shutdown_while_helping(executors);
        }
    }
}

fn shutdown_while_helping(executors: usize) {
    const THREADS: usize = 3;
    const PER: usize = 100_000;
    let b = Builder::<Tracked>::new()
        .name("helpers")
        .reaper_grace(2 * MS);
    let b = match executors {
        0 => b.inline(),
        n => b.executor_threads(n),
    };
    let timer = Arc::new(b.build());
    let runs = Arc::new(
        (0..THREADS * PER)
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let shut = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new(AtomicUsize::new(0));
    let adders: Vec<_> = (0..THREADS)
        .map(|t| {
            let (timer, runs) = (timer.clone(), runs.clone());
            let (shut, late, busy) = (shut.clone(), late.clone(), busy.clone());
            thread::spawn(move || {
                let mut state = 11u64 + t as u64;
                let mut refused = Vec::new();
                for i in 0..PER {
                    let id = t * PER + i;
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let delay = Duration::from_micros(1_000 + (state >> 33) % 19_000);
                    let task = Tracked {
                        id,
                        runs: runs.clone(),
                        shut: shut.clone(),
                        late: late.clone(),
                        busy: busy.clone(),
                    };
                    match timer.add(delay, task) {
                        Ok(_) => {}
                        Err(ScheduleError::Shutdown(task)) => {
                            refused.push(task.id);
                            break;
                        }
                        Err(e) => panic!("{e}"),
                    }
                    timer.advance_if_due();
                    thread::sleep(Duration::from_micros(100));
                }
                refused
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(60));
    // Mid-way, and mid-batch: while a task runs, its advance is under way.
    wait_until("no task ever ran", || busy.load(SeqCst) > 0);
    let back = timer.shutdown();
    shut.store(true, SeqCst);
    let refused: Vec<usize> = adders.into_iter().flat_map(|a| a.join().unwrap()).collect();
    assert_eq!(refused.len(), THREADS, "every adder ran into the shutdown");
    assert_eq!(
        late.load(SeqCst),
        0,
        "tasks started after shutdown returned"
    );
    let mut handed = vec![0usize; THREADS * PER];
    for task in &back {
        handed[task.id] += 1;
    }
    let mut accepted = 0;
    for id in 0..THREADS * PER {
        let (r, h) = (runs[id].load(SeqCst), handed[id]);
        let (t, i) = (id / PER, id % PER);
        let refused_at = refused.iter().find(|&&x| x / PER == t).unwrap() % PER;
        if i < refused_at {
            accepted += 1;
            assert_eq!(r + h, 1, "task {id}: ran {r} times, handed back {h} times");
        } else {
            assert_eq!((r, h), (0, 0), "task {id} was refused");
        }
    }
    let st = timer.stats();
    eprintln!(
        "executors {executors}: {accepted} accepted, {} ran, {} handed back, {} caller advances",
        st.fired,
        back.len(),
        st.caller_advances
    );
    assert!(st.caller_advances > 0, "no caller advanced: nothing tested");
    assert!(st.fired > 0 && !back.is_empty(), "shutdown was not mid-way");
    assert_eq!(st.scheduled, accepted as u64);
    assert_eq!(st.scheduled, st.fired + st.handed_back + st.cancelled);
    assert_eq!(st.pending, 0);
}

/// Wraps the system clock; stalls one chosen thread inside a `sleep_for` for a far deadline
/// (the hour-away bucket's) until released (the helper's `sleep_for` call sits between its read
/// of the next bucket and its `rearm`); holds
/// the reaper inside a `sleep_for` for a near deadline (not the hour-away one) while
/// `hold_reaper` is set (bounded by [`HANG`]); and records the deadline of each of the reaper's
/// calls (one per sleep it prepares).
#[cfg(target_os = "linux")]
#[derive(Clone, Debug)]
struct StallingClock {
    clock: SystemClock,
    gate: Arc<(Mutex<Gate>, std::sync::Condvar)>,
}

#[cfg(target_os = "linux")]
#[derive(Debug, Default)]
struct Gate {
    stall: Option<thread::ThreadId>,
    stalled: bool,
    released: bool,
    /// When the stalled thread left its stall (on its way to its `rearm`).
    resumed_at: Option<Instant>,
    hold_reaper: bool,
    reaper_held: bool,
    /// The deadline (ns on the clock) of each of the reaper's `sleep_for` calls.
    reaper_sleeps: Vec<u64>,
}

/// Deadlines this far ahead of the clock are the hour-away bucket's; nearer ones, a near one's.
#[cfg(target_os = "linux")]
const NEAR: Duration = Duration::from_secs(60);

#[cfg(target_os = "linux")]
impl StallingClock {
    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.0.lock().unwrap()
    }
    /// Waits until `done` holds for the gate.
    fn wait(&self, what: &str, done: impl Fn(&Gate) -> bool) {
        let (lock, cv) = &*self.gate;
        let (g, timeout) = cv
            .wait_timeout_while(lock.lock().unwrap(), HANG, |g| !done(g))
            .unwrap();
        drop(g); // before a failure, so that the other threads do not find the lock poisoned
        assert!(!timeout.timed_out(), "hung: {what}");
    }
    fn release(&self) {
        self.gate().released = true;
        self.gate.1.notify_all();
    }
    fn release_reaper(&self) {
        self.gate().hold_reaper = false;
        self.gate.1.notify_all();
    }
}

#[cfg(target_os = "linux")]
impl Clock for StallingClock {
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
    fn deadline_base_ns(&self) -> u64 {
        self.clock.deadline_base_ns()
    }
    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        let (lock, cv) = &*self.gate;
        let mut g = lock.lock().unwrap();
        let near = deadline_ns < self.clock.now_ns() + NEAR.as_nanos() as u64;
        if thread_name().ends_with("-reaper") {
            g.reaper_sleeps.push(deadline_ns);
            cv.notify_all();
            if g.hold_reaper && near {
                g.reaper_held = true;
                cv.notify_all();
                g = cv.wait_timeout_while(g, HANG, |g| g.hold_reaper).unwrap().0;
            }
        }
        if g.stall == Some(thread::current().id()) && !g.released && !near {
            g.stalled = true;
            cv.notify_all();
            while !g.released {
                g = cv.wait(g).unwrap();
            }
            g.resumed_at = Some(Instant::now());
        }
        drop(g);
        self.clock.sleep_for(deadline_ns)
    }
}

/// A caller's advance that was slow to move the reaper's alarm must not move it past a bucket
/// queued meanwhile. The caller advances the only due bucket and reads the next one (an hour
/// away), then stalls before its `rearm`; meanwhile a 5 ms task is added (the new earliest
/// bucket: the reaper is woken, and sets its alarm `grace` past that bucket). When the caller
/// resumes, its `rearm` must not push that alarm back to an hour: with no more callers, the
/// reaper must still run the new task, on its own, after its grace.
///
/// Catches: `help_claimed` moving the alarm from a reading of the next bucket taken before the
/// reaper's latest wake-up (the task would wait for the hour-away bucket: hang).
///
/// No step depends on timing. The reaper is held (in the clock's `sleep_for`) while it prepares
/// its sleep for the first due bucket until the caller has claimed that bucket and stalled, so
/// its grace cannot run out first. The caller is released only once the reaper has prepared its
/// sleep for the new bucket and blocks on its alarm (its thread's state), so that the caller's
/// `rearm` comes after the reaper set its alarm (the other order only hides the bug). Should the
/// reaper be so late that it finds the first bucket due at its first look (it then runs it
/// itself: nothing for the caller to claim), or the new task run before the caller resumed
/// (nothing exercised), the scenario is played again, a few times at most.
#[cfg(target_os = "linux")]
#[test]
fn a_slow_caller_does_not_move_the_reapers_alarm_past_a_newer_earliest_bucket() {
    for attempt in 1..=5 {
        match slow_caller_scenario() {
            Ok(()) => return,
            Err(why) => eprintln!("attempt {attempt}: {why}; again"),
        }
    }
    panic!("the scenario could not be set up in 5 attempts");
}

/// One play of [`a_slow_caller_does_not_move_the_reapers_alarm_past_a_newer_earliest_bucket`];
/// `Err` if it could not be set up (a reaper too late), and should be played again.
#[cfg(target_os = "linux")]
fn slow_caller_scenario() -> Result<(), &'static str> {
    // Long, so that the reaper is still asleep on its alarm (for the new bucket) when this
    // thread, which polls its state, releases the caller; the new task runs a grace after its
    // add, well within `HANG`.
    let grace = Duration::from_secs(1);
    let clock = StallingClock {
        clock: SystemClock::new(),
        gate: Arc::default(),
    };
    clock.gate().hold_reaper = true;
    let timer = Arc::new(
        SystemTimer::builder()
            .inline()
            .name("stall")
            .clock(clock.clone())
            .reaper_grace(grace)
            .build(),
    );
    let helper = {
        let (timer, clock) = (timer.clone(), clock.clone());
        thread::spawn(move || {
            clock.gate().stall = Some(thread::current().id());
            let t0 = Instant::now();
            // One claim only: it stalls inside until released, then this thread stops helping.
            while !clock.gate().released {
                assert!(t0.elapsed() < HANG, "never claimed the due bucket");
                thread::sleep(MS);
                timer.advance_if_due();
            }
        })
    };
    // The reaper, woken by the first add, prepares its sleep for the hour-away bucket; only then
    // the second add: its wake-up (the permit) is then taken before the reaper looks at the
    // wheel again, not left pending while it is held (a pending permit would make the caller's
    // `rearm`s, all but the last of which must publish, give up: nobody would advance).
    let near = clock.clock.now_ns() + NEAR.as_nanos() as u64;
    timer.add(HOUR, || ()).unwrap();
    clock.wait(
        "the reaper never prepared its sleep for the hour-away bucket",
        |g| g.reaper_sleeps.iter().any(|&d| d >= near),
    );
    let (first, _) = add_recorder(&timer, 20 * MS);
    let by_reaper = || {
        first
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|(name, _)| name.ends_with("-reaper"))
    };
    wait_until("the caller never claimed the due bucket", || {
        let g = clock.gate();
        (g.stalled && g.reaper_held) || by_reaper()
    });
    if by_reaper() {
        clock.release_reaper();
        clock.release();
        helper.join().unwrap();
        assert_eq!(timer.shutdown().len(), 1, "the hour-away task");
        return Err("the reaper found the first bucket due at its first look");
    }
    assert!(
        timer.next_expiration().unwrap() > timer.now() + NEAR,
        "the stalled caller has advanced the due bucket: only the hour-away one is left"
    );
    // Every sleep the reaper prepares from now on is for the hour-away bucket, or (once the
    // add below has queued it) for the new one.
    clock.release_reaper();
    let sleeps = clock.gate().reaper_sleeps.len();
    let near = clock.clock.now_ns() + NEAR.as_nanos() as u64;
    let (ran, due) = add_recorder(&timer, 5 * MS);
    // The add queued the earliest bucket: the reaper wakes and prepares its sleep for it; let it
    // set its alarm and block on it before the caller resumes.
    clock.wait("the reaper never woke for the earliest bucket", |g| {
        g.reaper_sleeps[sleeps..].iter().any(|&d| d < near)
    });
    wait_until("the reaper never blocked on its alarm", || {
        common::thread_state("stall-reaper") == Some('S')
    });
    clock.release();
    helper.join().unwrap();
    wait_until(
        "the new task never ran: the caller's rearm moved the reaper's alarm past it",
        || ran.lock().unwrap().is_some(),
    );
    let (name, at) = ran.lock().unwrap().clone().unwrap();
    assert!(name.ends_with("-reaper"), "ran on {name:?}");
    assert!(at >= due, "ran {:?} early", due - at);
    assert_eq!(timer.shutdown().len(), 1, "the hour-away task");
    if at < clock.gate().resumed_at.expect("the caller resumed") {
        return Err("the new task ran before the caller resumed");
    }
    Ok(())
}

// ===== idle threads sleep =====

/// The CPU time (user + system, in clock ticks of 10 ms) a thread has used so far, from the
/// `stat` file of `/proc/self/task/<tid>` or `/proc/thread-self`.
#[cfg(target_os = "linux")]
fn cpu_ticks(stat: &std::path::Path) -> u64 {
    let s = std::fs::read_to_string(stat).unwrap();
    // After the command name (which may hold spaces, hence the last ')'): the state is field 3,
    // utime field 14 and stime field 15.
    let fields: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The CPU time used so far by each thread whose name starts with `prefix`.
#[cfg(target_os = "linux")]
fn cpu_ticks_of_threads(prefix: &str) -> Vec<u64> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .map(|t| cpu_ticks(&t.path().join("stat")))
        .collect()
}

/// Half a second of wall time: a thread that spins through it uses about 50 ticks of CPU (at
/// least several times the bound below even on a loaded machine); one that sleeps, none.
#[cfg(target_os = "linux")]
const IDLE_SPAN: Duration = Duration::from_millis(500);
/// The CPU (in 10 ms ticks) a sleeping thread may be charged over [`IDLE_SPAN`]: generous.
#[cfg(target_os = "linux")]
const IDLE_MAX_TICKS: u64 = 10;

/// The executors of an idle timer sleep: with nothing due (one far task), its two executor
/// threads use (next to) no CPU over half a second, after running a batch each.
///
/// Catches: an idle executor that spins instead of sleeping on the semaphore (`acquire` that
/// never takes its permit or never waits: `-=` turned into `+=` or `/=`, or emptied).
#[cfg(target_os = "linux")]
#[test]
fn idle_executors_use_no_cpu() {
    let timer = SystemTimer::builder()
        .name("idlecpu")
        .executor_threads(2)
        .build();
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let r = ran.clone();
        timer
            .add(MS, move || {
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
    }
    timer.add(HOUR, || ()).unwrap();
    wait_until("the tasks never ran", || ran.load(SeqCst) == 2);
    // Let them go back to sleep. Thread names are cut to 15 bytes in `comm`: "idlecpu-executo".
    thread::sleep(Duration::from_millis(20));
    let before = cpu_ticks_of_threads("idlecpu-exec");
    assert_eq!(before.len(), 2);
    thread::sleep(IDLE_SPAN);
    let after = cpu_ticks_of_threads("idlecpu-exec");
    let used: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert!(
        used <= IDLE_MAX_TICKS,
        "idle executors used {used} ticks of CPU in {IDLE_SPAN:?}"
    );
    assert!(timer.shutdown().len() == 1);
}

/// `advance_clock` sleeps while it waits: on the system clock for its timeout with nothing
/// queued, and on a manual clock until the clock is moved, the waiting thread uses (next to)
/// no CPU.
///
/// Catches: a wait that spins instead of sleeping (`park_since` emptied, its epoch test
/// inverted, or its timed wait skipped: the `d.is_zero()` guard made always true).
#[cfg(target_os = "linux")]
#[test]
fn a_waiting_advance_clock_uses_no_cpu() {
    let own = std::path::Path::new("/proc/thread-self/stat");
    // The system clock: nothing queued, waits out its timeout.
    let timer = SystemTimer::builder().reaper(false).inline().build();
    let before = cpu_ticks(own);
    assert!(!timer.advance_clock(IDLE_SPAN));
    let used = cpu_ticks(own) - before;
    assert!(
        used <= IDLE_MAX_TICKS,
        "advance_clock used {used} ticks of CPU waiting {IDLE_SPAN:?}"
    );
    // A manual clock: waits until another thread moves the clock past the limit.
    let clock = system_timer::ManualClock::new(0);
    let timer = Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .inline()
            .build(),
    );
    let t = timer.clone();
    let waiter = thread::spawn(move || {
        let own = std::path::Path::new("/proc/thread-self/stat");
        let before = cpu_ticks(own);
        let dispatched = t.advance_clock(MS);
        (dispatched, cpu_ticks(own) - before)
    });
    thread::sleep(IDLE_SPAN);
    clock.advance(2 * MS);
    let t0 = Instant::now();
    while !waiter.is_finished() {
        assert!(
            t0.elapsed() < HANG,
            "hung: advance_clock after the clock moved"
        );
        thread::sleep(MS);
    }
    let (dispatched, used) = waiter.join().unwrap();
    assert!(!dispatched);
    assert!(
        used <= IDLE_MAX_TICKS,
        "advance_clock used {used} ticks of CPU waiting for the manual clock"
    );
}
