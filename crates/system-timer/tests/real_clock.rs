//! Properties on the real (system) clock: nothing fires early, nothing is lost. No exact
//! timings are asserted; timeouts only catch hangs.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std clock and locks on purpose

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use system_timer::{Clock, SystemClock, SystemTimer};

/// 10,000 tasks with random delays up to 200 ms: each records `Instant::now()` when it runs;
/// none runs before `instant taken just before its add + delay`, measured in nanoseconds, and
/// every one runs exactly once.
#[test]
fn ten_thousand_tasks_none_early_in_nanoseconds() {
    const N: usize = 10_000;
    let timer = SystemTimer::new();
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let mut state = 42u64;
    for i in 0..N {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let delay = Duration::from_nanos(state % 200_000_000);
        let (early, runs) = (early.clone(), runs.clone());
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
    let t0 = Instant::now();
    while runs.iter().any(|r| r.load(SeqCst) == 0) {
        assert!(t0.elapsed() < Duration::from_secs(60), "tasks lost or hung");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20));
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
    assert!(timer.shutdown().is_empty());
}

/// An idle timer does not wake its reaper: with one far task and nothing else, the reaper
/// sleeps (counted wake-ups stay flat over a quiet stretch).
#[test]
fn an_idle_reaper_does_not_wake_up() {
    let timer = SystemTimer::new();
    timer.add(Duration::from_secs(600), || ()).unwrap();
    std::thread::sleep(Duration::from_millis(100)); // let the reaper settle
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
    let timer = SystemTimer::new();
    timer.add(Duration::from_secs(3600), || ()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
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
/// 1 ms bound: the design bound is a few microseconds).
#[test]
fn deadline_base_is_an_upper_bound_of_the_clock() {
    let clock = SystemClock::new();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let clock = clock.clone();
            std::thread::spawn(move || {
                let (mut checks, mut max_ahead) = (0u64, 0u64);
                // Long enough to cross the calibration (10 ms) and many anchor refreshes (1 ms).
                while t0.elapsed() < Duration::from_millis(60) {
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
                }
                (checks, max_ahead)
            })
        })
        .collect();
    for t in threads {
        let (checks, max_ahead) = t.join().unwrap();
        assert!(checks > 1_000, "only {checks} readings");
        eprintln!("{checks} readings, at most {max_ahead} ns ahead of the clock");
    }
    // Where the kernel does not keep time with the cycle counter, the counter is never used.
    assert_eq!(
        SystemClock::counter_calibrated(),
        SystemClock::counter_trusted(),
        "calibrated after 60 ms exactly where the counter is trusted"
    );
}

/// After the counter's calibration, 10,000 tasks added through keys (`add_keyed`, whose
/// deadlines come from the counter-based reading) on two threads: none runs before `instant
/// taken just before its add + delay`, in nanoseconds; every one runs exactly once.
#[test]
fn keyed_tasks_after_calibration_none_early_in_nanoseconds() {
    const N: usize = 10_000;
    let timer = Arc::new(SystemTimer::new());
    std::thread::sleep(Duration::from_millis(20));
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
    std::thread::sleep(Duration::from_millis(20));
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
    assert!(timer.shutdown().is_empty());
}
