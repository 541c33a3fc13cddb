//! Behaviour of `SystemTimer` on the manual clock: deterministic, no sleeps. Real-clock
//! properties live in `real_clock.rs`; the multi-threaded stress in `stress.rs`.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests use std threads and locks freely

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use system_timer::{Builder, ManualClock, ScheduleError, SystemTimer, TimerTask};

const MS: Duration = Duration::from_millis(1);

mod common;
use common::splitmix;

/// A timer on a manual clock, driven by hand, running tasks inline.
fn manual(clock: &ManualClock, wheel_size: usize) -> SystemTimer {
    SystemTimer::builder()
        .clock(clock.clone())
        .wheel_size(wheel_size)
        .reaper(false)
        .inline()
        .build()
}

/// A hand-driven timer (as [`manual`], Kafka's 20 buckets) that holds at most `max` tasks.
fn capped(clock: &ManualClock, max: usize) -> SystemTimer {
    SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .max_pending(max)
        .build()
}

/// Records, per task id, the clock readings (ns) at which it ran.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<HashMap<u64, Vec<u64>>>>);

impl Log {
    fn task(&self, clock: &ManualClock, id: u64) -> impl FnOnce() + Send + 'static {
        let (log, clock) = (self.clone(), clock.clone());
        move || {
            log.0
                .lock()
                .unwrap()
                .entry(id)
                .or_default()
                .push(clock.now_ns())
        }
    }
    fn runs(&self, id: u64) -> Vec<u64> {
        self.0.lock().unwrap().get(&id).cloned().unwrap_or_default()
    }
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

/// Hundreds of tasks across six levels of a small wheel (tick 1 ms, 4 buckets: levels span 4,
/// 16, 64, 256, 1024 and 4096 ms), the clock moved in random steps: every task runs exactly
/// once, never before its deadline, and no later than the first advance at or past it (rounded
/// up to the tick).
#[test]
fn every_task_runs_once_never_early_across_six_levels() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 4);
    let log = Log::default();
    let mut rng = 42;
    let mut deadlines = HashMap::new();
    for id in 0..600u64 {
        let delay = Duration::from_micros(splitmix(&mut rng) % 4_000_000);
        let h = timer.add(delay, log.task(&clock, id)).unwrap();
        deadlines.insert(id, h.deadline_ns());
    }
    assert!(
        timer.stats().levels >= 6,
        "levels: {}",
        timer.stats().levels
    );
    while log.total() < 600 {
        let before = clock.now_ns();
        clock.advance(Duration::from_micros(1 + splitmix(&mut rng) % 3_000));
        timer.advance();
        let now = clock.now_ns();
        for (&id, &d) in &deadlines {
            let runs = log.runs(id);
            // The wheel's time is the clock rounded down to the 1 ms tick.
            let wheel_now = now - now % 1_000_000;
            if d <= wheel_now {
                assert_eq!(
                    runs.len(),
                    1,
                    "task {id} (deadline {d}) should have run by {now}"
                );
                assert!(runs[0] >= d, "task {id} ran early: {} < {d}", runs[0]);
                assert!(runs[0] > before || runs[0] >= d, "ran at a stale time");
            } else {
                assert!(
                    runs.is_empty(),
                    "task {id} (deadline {d}) ran early at {now}"
                );
            }
        }
        assert!(clock.now_ms() < 10_000, "not all tasks ran");
    }
    assert_eq!(timer.len(), 0);
    let st = timer.stats();
    assert_eq!((st.scheduled, st.fired, st.cancelled), (600, 600, 0));
    timer.check_invariants();
}

/// A zero delay, or a deadline already passed, dispatches the task at the next advance (inline
/// mode) without waiting for a tick.
#[test]
fn already_expired_and_zero_delay_tasks_run_promptly() {
    let clock = ManualClock::new(1_000);
    let timer = manual(&clock, 20);
    let log = Log::default();
    let h0 = timer.add(Duration::ZERO, log.task(&clock, 0)).unwrap();
    let h1 = timer
        .add_at(Duration::from_millis(10), log.task(&clock, 1))
        .unwrap();
    assert!(
        h0.is_fired() && h1.is_fired(),
        "due at add time: dispatched at once"
    );
    assert!(!h0.cancel(), "a dispatched task cannot be cancelled");
    assert_eq!(
        timer.advance(),
        2,
        "both run at the next advance, no clock move needed"
    );
    assert_eq!(log.runs(0), vec![1_000_000_000]);
    assert_eq!(log.runs(1), vec![1_000_000_000]);
}

/// A zero delay added between ticks is rounded up to the next tick like every deadline: it is
/// pending until then (never early), and runs at the advance that reaches that tick.
#[test]
fn a_zero_delay_between_ticks_runs_at_the_next_tick() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    clock.advance(Duration::from_micros(500));
    let h = timer.add(Duration::ZERO, log.task(&clock, 0)).unwrap();
    assert!(h.is_pending(), "in the wheel until its tick");
    assert_eq!(h.deadline(), Duration::from_micros(500));
    assert_eq!(timer.advance(), 0, "the tick has not come");
    clock.advance(Duration::from_micros(500));
    assert_eq!(timer.advance(), 1);
    assert!(h.is_fired());
    assert_eq!(log.runs(0), vec![1_000_000]);
}

/// Cancel before the deadline wins (true) and the task never runs; cancel after it ran loses.
#[test]
fn cancel_before_firing_wins_and_after_firing_loses() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    let a = timer.add(5 * MS, log.task(&clock, 1)).unwrap();
    let b = timer.add(5 * MS, log.task(&clock, 2)).unwrap();
    assert!(a.is_pending());
    assert!(a.cancel(), "pending task: cancel wins");
    assert!(!a.cancel(), "second cancel loses");
    assert!(a.is_cancelled() && !a.is_fired() && !a.is_pending());
    assert_eq!(timer.len(), 1, "cancelled task leaves at once");
    clock.advance(5 * MS);
    assert_eq!(timer.advance(), 1);
    assert!(log.runs(1).is_empty(), "cancelled task ran");
    assert_eq!(log.runs(2).len(), 1);
    assert!(!b.cancel(), "cancel after firing loses");
    assert!(b.is_fired() && !b.is_cancelled());
    let st = timer.stats();
    assert_eq!(
        (st.scheduled, st.fired, st.cancelled, st.pending),
        (2, 1, 1, 0)
    );
}

/// `take` wins as `cancel` does (the task leaves at once and never runs from its first
/// deadline) but hands the task back: added again, it runs once, at its new deadline and not
/// before. A second take, a take after firing and another timer's key all get `None`.
#[test]
fn take_hands_the_task_back_and_a_re_add_runs_it_at_the_new_deadline() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    let key = timer.add_keyed(5 * MS, log.task(&clock, 1)).unwrap();
    let handle = timer.add(5 * MS, log.task(&clock, 2)).unwrap();
    let task = timer.take(key).expect("a pending task is taken");
    assert!(timer.take(key).is_none(), "taken twice");
    assert!(!timer.cancel(key), "cancelled after it was taken");
    let task2 = handle.take().expect("a pending task is taken");
    assert!(handle.take().is_none() && handle.is_cancelled());
    assert!(timer.is_empty(), "taken tasks left at once");
    clock.advance(5 * MS);
    assert_eq!(timer.advance(), 0, "a taken task ran at its first deadline");
    // Renewed: both again, 10 ms from now (15 ms).
    let key = timer.add_keyed(10 * MS, task).unwrap();
    let handle = timer.add(10 * MS, task2).unwrap();
    clock.advance(9 * MS);
    assert_eq!(timer.advance(), 0, "a re-added task ran early");
    clock.advance(MS);
    assert_eq!(timer.advance(), 2);
    assert_eq!(
        (log.runs(1), log.runs(2)),
        (vec![15_000_000], vec![15_000_000])
    );
    assert!(
        timer.take(key).is_none() && handle.take().is_none(),
        "taken after firing"
    );
    let other = manual(&clock, 20);
    let foreign = other.add_keyed(5 * MS, || ()).unwrap();
    assert!(timer.take(foreign).is_none(), "took another timer's task");
    assert!(other.is_pending(foreign));
    let st = timer.stats();
    assert_eq!(
        (st.scheduled, st.fired, st.cancelled, st.pending),
        (4, 2, 2, 0)
    );
}

/// A taken task gives its `max_pending` slot back, as a cancelled one does, and is not dropped
/// by the timer (what it owns lives on in the caller's hands).
#[test]
fn take_frees_the_pending_slot_and_keeps_the_task_alive() {
    let clock = ManualClock::new(0);
    let timer = capped(&clock, 1);
    let owned = Arc::new(());
    let held = Arc::clone(&owned);
    let key = timer
        .add_keyed(Duration::from_secs(3600), move || drop(held))
        .unwrap();
    assert!(timer.add(MS, || ()).unwrap_err().is_full());
    let task = timer.take(key).expect("pending");
    assert_eq!(
        Arc::strong_count(&owned),
        2,
        "the timer dropped the taken task"
    );
    let h = timer.add(MS, || ()).expect("the taken task's slot is free");
    assert!(h.take().is_some());
    assert!(
        timer.add(MS, || ()).is_ok(),
        "a handle's take frees the slot too"
    );
    task.run();
    assert_eq!(
        Arc::strong_count(&owned),
        1,
        "the task ran in the caller's hands"
    );
}

/// The cancelled task's memory is released by cancel itself, not at its deadline.
#[test]
fn cancel_drops_the_task_at_once() {
    struct DropCount(Arc<AtomicUsize>);
    impl Drop for DropCount {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let drops = Arc::new(AtomicUsize::new(0));
    let payload = DropCount(drops.clone());
    let h = timer
        .add(Duration::from_secs(3600), move || drop(payload))
        .unwrap();
    assert_eq!(drops.load(SeqCst), 0);
    assert!(h.cancel());
    assert_eq!(
        drops.load(SeqCst),
        1,
        "the task (and what it owns) is dropped by cancel"
    );
}

/// A panicking task is caught and counted; the other tasks still run, in the same advance and
/// later ones.
#[test]
fn a_panicking_task_is_counted_and_the_timer_keeps_firing() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    timer.add(MS, log.task(&clock, 1)).unwrap();
    timer.add(MS, || panic!("task panics on purpose")).unwrap();
    timer.add(MS, log.task(&clock, 2)).unwrap();
    timer.add(2 * MS, log.task(&clock, 3)).unwrap();
    clock.advance(MS);
    assert_eq!(timer.advance(), 3);
    clock.advance(MS);
    assert_eq!(timer.advance(), 1);
    assert_eq!(log.total(), 3);
    let st = timer.stats();
    assert_eq!((st.fired, st.panicked), (4, 1));
}

/// A panic payload whose own `Drop` panics.
struct DropBomb;

impl Drop for DropBomb {
    fn drop(&mut self) {
        panic!("the payload's drop panics too");
    }
}

/// A task that panics with a payload whose drop panics again: the second panic is contained as
/// well. The rest of the batch runs, the advance returns normally, and shutdown does not wait
/// for ever.
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_escape() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(manual(&clock, 20));
    // Leaked on purpose: if the panic escaped, dropping the timer (unwinding from a failed
    // assertion) would wait for ever, and the test would hang instead of failing.
    std::mem::forget(Arc::clone(&timer));
    let log = Log::default();
    timer.add(MS, || std::panic::panic_any(DropBomb)).unwrap();
    timer.add(MS, log.task(&clock, 1)).unwrap();
    clock.advance(MS);
    let advanced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer.advance()));
    assert_eq!(
        advanced.ok(),
        Some(2),
        "the advance returns, both tasks dispatched"
    );
    assert_eq!(
        log.runs(1),
        vec![1_000_000],
        "the other task of the batch ran"
    );
    let st = timer.stats();
    assert_eq!((st.fired, st.panicked, st.pending), (2, 1, 0));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let left = timer.shutdown();
        tx.send(left.len()).unwrap();
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok(0),
        "shutdown returns"
    );
}

/// The same with the reaper thread and an executor thread on the manual clock: moving the clock
/// wakes the reaper, a panicking task does not kill the executor.
#[test]
fn reaper_and_executor_survive_panics_on_the_manual_clock() {
    let clock = ManualClock::new(0);
    let timer = SystemTimer::builder().clock(clock.clone()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    for i in 0..10 {
        let r = runs.clone();
        timer
            .add((i + 1) * MS, move || {
                if i % 3 == 0 {
                    panic!("boom {i}");
                }
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
    }
    clock.advance(20 * MS);
    // `fired` counts a task when it starts and `panicked` once its panic is caught: wait for
    // the last task (a panicking one) to have finished, not only started.
    wait_until(|| {
        let st = timer.stats();
        st.fired == 10 && st.panicked >= 4
    });
    assert_eq!(runs.load(SeqCst), 6);
    assert_eq!(timer.stats().panicked, 4);
    // Still alive: a later task runs too.
    let r = runs.clone();
    timer
        .add(MS, move || {
            r.fetch_add(1, SeqCst);
        })
        .unwrap();
    clock.advance(MS);
    wait_until(|| runs.load(SeqCst) == 7);
}

/// Shutdown hands back exactly the tasks that neither ran nor were cancelled, and the handles
/// say so; adds after shutdown hand the task back.
#[test]
fn shutdown_returns_exactly_the_tasks_that_never_ran() {
    struct Tagged(u64, Arc<AtomicUsize>);
    impl TimerTask for Tagged {
        fn run(self) {
            self.1.fetch_add(1, SeqCst);
        }
    }
    let clock = ManualClock::new(0);
    let timer: SystemTimer<Tagged> = Builder::new()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .build();
    let ran = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..100u64)
        .map(|i| {
            timer
                .add(MS * (i as u32 + 1), Tagged(i, ran.clone()))
                .unwrap()
        })
        .collect();
    for h in handles.iter().skip(50).step_by(5) {
        assert!(h.cancel());
    }
    clock.advance(30 * MS);
    assert_eq!(timer.advance(), 30);
    let back = timer.shutdown();
    let mut ids: Vec<u64> = back.iter().map(|t| t.0).collect();
    ids.sort_unstable();
    let expected: Vec<u64> = (30..100)
        .filter(|i| !(i >= &50 && (i - 50) % 5 == 0))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(ran.load(SeqCst), 30);
    assert!(handles[60].is_cancelled() && !handles[60].is_handed_back());
    assert!(handles[61].is_handed_back() && !handles[61].is_fired());
    assert!(!handles[61].cancel(), "cancel after shutdown returns false");
    assert!(handles[0].is_fired());
    let st = timer.stats();
    assert_eq!(
        (
            st.scheduled,
            st.fired,
            st.cancelled,
            st.handed_back,
            st.pending
        ),
        (100, 30, 10, 60, 0)
    );
    match timer.add(MS, Tagged(999, ran.clone())) {
        Err(ScheduleError::Shutdown(t)) => assert_eq!(t.0, 999),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    assert!(
        timer.shutdown().is_empty(),
        "second shutdown returns nothing"
    );
}

/// Tasks already dispatched to the executor but not yet started are handed back by shutdown
/// too (each task ends exactly one way). The five go to the one executor in one batch; it is
/// stuck in the first until the shutdown has begun (`is_shutdown`: `stopping` is set, which the
/// executor checks before each job it takes), so the other four are dispatched and unstarted
/// when the shutdown comes, whatever the scheduling.
#[test]
fn shutdown_hands_back_dispatched_tasks_that_have_not_started() {
    let clock = ManualClock::new(0);
    let timer = SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .build();
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    for _ in 0..5 {
        let (g, s) = (release.clone(), started.clone());
        timer
            .add(MS, move || {
                s.fetch_add(1, SeqCst);
                while !g.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
            .unwrap();
    }
    clock.advance(MS);
    assert_eq!(timer.advance(), 5, "all five dispatched to the executor");
    wait_until(|| started.load(SeqCst) == 1); // the executor is stuck in the first task
    let back = std::thread::scope(|scope| {
        // Releases the stuck task once the shutdown has begun (or after a hang guard: the
        // shutdown waits for the task, so it must be released in any case).
        let helper = scope.spawn(|| {
            let t0 = Instant::now();
            while !timer.is_shutdown() && t0.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let began = timer.is_shutdown();
            release.store(true, SeqCst);
            began
        });
        let back = timer.shutdown();
        assert!(
            helper.join().unwrap(),
            "hung: the shutdown never began (is_shutdown stayed false)"
        );
        back
    });
    assert_eq!(back.len(), 4, "the four queued tasks come back");
    assert_eq!(started.load(SeqCst), 1);
    let st = timer.stats();
    assert_eq!(
        (st.scheduled, st.fired, st.handed_back, st.pending),
        (5, 1, 4, 0)
    );
}

/// Kafka submits a task already due at `add` to its executor from the adding thread, to run
/// asynchronously: user code never runs on the caller (reference §1.5, §7.9). In executor mode
/// a task due at add time is dispatched at once (fired, out of `len`) and runs on an executor
/// thread, not on the thread that added it.
///
/// Catches: a due-at-add task run inline on the adding thread (its user code would then run
/// under whatever locks the caller holds).
#[test]
fn a_task_due_at_add_runs_on_an_executor_not_the_adding_thread() {
    let clock = ManualClock::new(0);
    let timer: SystemTimer = SystemTimer::builder()
        .clock(clock.clone())
        .name("dueadd")
        .reaper(false)
        .executor_threads(1)
        .build();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = timer
        .add(Duration::ZERO, move || {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            tx.send(name).unwrap();
        })
        .unwrap();
    assert!(h.is_fired(), "due at add time: dispatched at once");
    let ran_on = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the task never ran");
    assert!(
        ran_on.starts_with("dueadd-executor-"),
        "ran on {ran_on:?}, not an executor"
    );
    assert_eq!(timer.len(), 0);
    assert!(timer.shutdown().is_empty());
    assert_eq!(timer.stats().fired, 1);
}

/// With a cap, the add past it hands the task back; a cancel frees a slot.
#[test]
fn the_pending_cap_hands_the_task_back() {
    let clock = ManualClock::new(0);
    let timer = capped(&clock, 3);
    let hs: Vec<_> = (0..3).map(|_| timer.add(MS, || ()).unwrap()).collect();
    let e = timer.add(MS, || ()).unwrap_err();
    assert!(e.is_full());
    e.into_inner().run(); // the task came back and can still be run
    assert!(hs[0].cancel());
    let h = timer.add(MS, || ()).unwrap();
    assert!(timer.add(MS, || ()).unwrap_err().is_full());
    clock.advance(MS);
    assert_eq!(timer.advance(), 3);
    assert!(h.is_fired());
    assert!(timer.add(MS, || ()).is_ok(), "fired tasks free their slots");
}

/// A full timer that is shut down says `Shutdown`, not `Full` (which invites a retry for
/// ever), and the shutdown gives the cap's slots back with the tasks it returns.
#[test]
fn a_full_timer_after_shutdown_refuses_with_shutdown() {
    let timer = capped(&ManualClock::new(0), 2);
    for _ in 0..2 {
        timer.add(60 * MS, || ()).unwrap();
    }
    assert!(timer.add(MS, || ()).unwrap_err().is_full());
    assert_eq!(timer.shutdown().len(), 2);
    let e = timer.add(MS, || ()).unwrap_err();
    assert!(e.is_shutdown(), "got {e:?}");
    assert_eq!(timer.stats().pending, 0);
}

/// `Duration::MAX` saturates to "never": the task does not fire, even after a long time.
#[test]
fn a_huge_delay_never_fires() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    let h = timer.add(Duration::MAX, log.task(&clock, 1)).unwrap();
    let h2 = timer
        .add(Duration::from_secs(u64::MAX / 2), log.task(&clock, 2))
        .unwrap();
    assert_eq!(h.deadline_ns(), u64::MAX);
    for _ in 0..50 {
        clock.advance(Duration::from_secs(365 * 24 * 3600));
        timer.advance();
    }
    assert_eq!(log.total(), 0);
    assert!(h.is_pending() && h2.is_pending());
    assert_eq!(timer.len(), 2);
}

/// `Duration::MAX` never fires, nor does any delay that reaches past the end of the clock's range,
/// even on a clock already at that end (a manual clock saturated at `u64::MAX` ns): the task stays
/// pending and shutdown hands it back. Before, the saturated deadline (`u64::MAX`) compared as
/// reached on such a clock, and the task ran at once.
#[test]
fn a_delay_past_the_end_of_the_clock_never_fires_even_there() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    clock.advance(Duration::MAX);
    timer.advance();
    let log = Log::default();
    let h = timer.add(Duration::MAX, log.task(&clock, 1)).unwrap();
    let k = timer
        .add_keyed(Duration::from_nanos(1), log.task(&clock, 2))
        .unwrap();
    timer.advance();
    assert_eq!(log.total(), 0, "a delay past the end of time ran");
    assert!(h.is_pending() && timer.is_pending(k));
    assert_eq!(timer.len(), 2);
    assert_eq!(timer.shutdown().len(), 2);
    timer.check_invariants();
}

/// A clock at the end of its range (a manual clock saturated at `u64::MAX` ns): a task due now
/// (zero delay, or a deadline the clock has passed) still runs at the next advance. Before, every
/// deadline past the wheel's last tick was filed as "never", due ones included.
#[test]
fn at_the_end_of_the_clock_due_tasks_still_run() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    clock.advance(Duration::MAX);
    timer.advance();
    let log = Log::default();
    timer.add(Duration::ZERO, log.task(&clock, 1)).unwrap();
    timer
        .add_at(Duration::from_nanos(u64::MAX - 1), log.task(&clock, 2))
        .unwrap();
    timer.advance();
    assert_eq!((log.runs(1).len(), log.runs(2).len()), (1, 1));
    assert_eq!(timer.len(), 0);
    timer.check_invariants();
}

/// Advancing to a time ahead of the clock is clamped to the clock: `advance_to` never runs a
/// task before the clock reaches its deadline.
#[test]
fn advance_to_beyond_the_clock_is_clamped() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    timer.add(10 * MS, log.task(&clock, 1)).unwrap();
    assert_eq!(timer.advance_to(1_000), 0);
    clock.advance(10 * MS);
    assert_eq!(timer.advance_to(clock.now_ms()), 1);
}

/// A manual clock that records the calls of [`Clock::sleep_for`](system_timer::Clock::sleep_for):
/// a thread in `advance_clock` calls it once per wait, after it has read the clock (so its limit
/// is set) and right before it sleeps (a clock move from then on wakes it: the move's unpark
/// comes after the wait's epoch reading). The sign a test waits for before it moves the clock.
#[derive(Clone, Debug)]
struct SleepCountingClock {
    clock: ManualClock,
    /// Calls of `sleep_for` so far.
    sleeps: Arc<AtomicUsize>,
    /// The threads that have called `sleep_for` (since the last `clear_sleepers`).
    sleepers: Arc<Mutex<std::collections::HashSet<std::thread::ThreadId>>>,
}

impl SleepCountingClock {
    /// At 0.
    fn new() -> Self {
        SleepCountingClock {
            clock: ManualClock::new(0),
            sleeps: Arc::default(),
            sleepers: Arc::default(),
        }
    }
    fn sleeps(&self) -> usize {
        self.sleeps.load(SeqCst)
    }
    fn sleepers(&self) -> usize {
        self.sleepers.lock().unwrap().len()
    }
    fn clear_sleepers(&self) {
        self.sleepers.lock().unwrap().clear();
    }
}

impl system_timer::Clock for SleepCountingClock {
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        self.sleepers
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
        self.sleeps.fetch_add(1, SeqCst);
        system_timer::Clock::sleep_for(&self.clock, deadline_ns)
    }
    fn subscribe(&self, waker: std::sync::Weak<dyn Fn() + Send + Sync>) {
        system_timer::Clock::subscribe(&self.clock, waker)
    }
}

/// A hand-driven inline timer (Kafka's 20 buckets) on `clock`.
fn manual_counting(clock: &SleepCountingClock) -> SystemTimer {
    SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .build()
}

/// Waits (20 s at most: a hang guard) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "hung: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Kafka's blocking `advanceClock(timeout)`: returns true once a task became due (each manual
/// clock move wakes the wait; a move that makes nothing due sends it back to sleep), and false
/// after waiting out the timeout with nothing due. The clock is moved only once the waiter
/// sleeps (it has read its limit): a move before that would push the limit out of reach of a
/// clock that never moves again. Every wait is under a hang guard.
#[test]
fn advance_clock_waits_for_the_next_bucket() {
    let clock = SleepCountingClock::new();
    let timer = Arc::new(manual_counting(&clock));
    let log = Log::default();
    timer.add(5 * MS, log.task(&clock.clock, 1)).unwrap();
    let base = clock.sleeps();
    let t = timer.clone();
    let waiter = std::thread::spawn(move || t.advance_clock(Duration::from_secs(30)));
    // 2, 4, 6 ms: the task is due at 5 ms, so the waiter sleeps again after the first two moves.
    for k in 1..=3 {
        wait_for("the waiter never slept", || {
            clock.sleeps() >= base + k || waiter.is_finished()
        });
        assert!(
            !waiter.is_finished(),
            "advance_clock returned before its task was due ({} ms)",
            clock.clock.now_ms()
        );
        clock.clock.advance(2 * MS);
    }
    assert!(
        join_all_within(vec![waiter])[0],
        "the due task was dispatched"
    );
    assert_eq!(log.runs(1), vec![6_000_000], "run at the third move");
    // Nothing queued: waits out a (manual-clock) timeout of 1 ms, until the clock moves past it.
    let base = clock.sleeps();
    let start = clock.clock.now_ns();
    let (t, c) = (timer.clone(), clock.clock.clone());
    let waiter = std::thread::spawn(move || {
        let r = t.advance_clock(MS);
        (r, c.now_ns())
    });
    wait_for("the waiter never slept", || {
        clock.sleeps() > base || waiter.is_finished()
    });
    assert!(
        !waiter.is_finished(),
        "advance_clock returned before its timeout had passed on the clock"
    );
    clock.clock.advance(5 * MS);
    let (r, returned_at) = join_all_within(vec![waiter]).pop().unwrap();
    assert!(!r, "nothing was due");
    assert!(returned_at >= start + 5_000_000, "returned before the move");
}

/// Kafka's `advanceClock` returns true for any bucket it flushed, even one emptied by cancels
/// or one whose tasks only cascade to a finer level (reference §7.8); this timer's returns true
/// only once a task was dispatched. A due bucket emptied by a cancel and a level-1 bucket whose
/// task cascades to level 0 are flushed, and `advance_clock(0)` still says false; once the
/// cascaded task is due it says true and the task has run.
///
/// Catches: an `advance_clock` that reports any flush (or any due bucket) as true.
#[test]
fn advance_clock_is_false_after_flushing_only_empty_or_cascading_buckets() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 4); // level 0 spans 4 ms, level 1 16 ms
    let log = Log::default();
    let cancelled = timer.add(2 * MS, log.task(&clock, 1)).unwrap();
    let a = timer.add(11 * MS, log.task(&clock, 2)).unwrap(); // level 1, bucket [8, 12)
    assert!(cancelled.cancel());
    assert_eq!(timer.stats().levels, 2);
    clock.set_ms(9);
    assert!(
        !timer.advance_clock(Duration::ZERO),
        "flushed an empty and a cascading bucket, dispatched nothing"
    );
    assert!(a.is_pending(), "the cascaded task is still pending");
    assert_eq!(
        timer.next_expiration(),
        Some(11 * MS),
        "cascaded to level 0"
    );
    assert_eq!(log.total(), 0);
    clock.set_ms(11);
    assert!(timer.advance_clock(Duration::ZERO));
    assert!(a.is_fired());
    assert_eq!(log.runs(2), vec![11_000_000]);
    assert_eq!(timer.len(), 0);
    timer.check_invariants();
}

/// Several threads blocked in `advance_clock` on a manual clock: a clock move wakes every one
/// of them (not one), and a shutdown ends every wait. Before, the parker woke one sleeper per
/// unpark, and a waiter could sleep on for good after the shutdown (the clock's waker gone).
/// The clock moves (and the shutdown comes) only once each waiter sleeps, its limit read.
#[test]
fn every_advance_clock_waiter_wakes_on_a_move_and_at_shutdown() {
    let clock = SleepCountingClock::new();
    let timer = Arc::new(manual_counting(&clock));
    let returned = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (timer, returned) = (timer.clone(), returned.clone());
            std::thread::spawn(move || {
                // A limit of 10 ms: each returns false once the clock has moved past it.
                let r = timer.advance_clock(10 * MS);
                returned.fetch_add(1, SeqCst);
                r
            })
        })
        .collect();
    wait_for("a waiter never slept", || {
        clock.sleepers() == 3 || returned.load(SeqCst) > 0
    });
    assert_eq!(returned.load(SeqCst), 0, "nothing moved yet");
    clock.clock.advance(20 * MS);
    assert_eq!(join_all_within(waiters), [false; 3]);
    // Waiting for ever (nothing due, an hour's limit): the shutdown ends every wait.
    clock.clear_sleepers();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let timer = timer.clone();
            std::thread::spawn(move || timer.advance_clock(Duration::from_secs(3600)))
        })
        .collect();
    wait_for("a waiter never slept", || {
        clock.sleepers() == 3 || waiters.iter().any(|w| w.is_finished())
    });
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a wait ended before the shutdown"
    );
    assert!(timer.shutdown().is_empty(), "no task was added");
    assert_eq!(join_all_within(waiters), [false; 3]);
}

/// Joins the threads, failing (not hanging) if one has not finished within a generous 20 s.
fn join_all_within<R>(threads: Vec<std::thread::JoinHandle<R>>) -> Vec<R> {
    let deadline = Instant::now() + Duration::from_secs(20);
    threads
        .into_iter()
        .map(|t| {
            while !t.is_finished() {
                assert!(Instant::now() < deadline, "a waiter hung");
                std::thread::sleep(Duration::from_millis(5));
            }
            t.join().unwrap()
        })
        .collect()
}

/// Scheduling from many threads onto a reaper-driven timer on the manual clock: all run once.
#[test]
fn concurrent_adds_with_the_reaper_on_the_manual_clock() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .wheel_size(8)
            .build(),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (timer, runs) = (timer.clone(), runs.clone());
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let r = runs.clone();
                    timer
                        .add(Duration::from_millis(1 + (i * 7 + t) % 300), move || {
                            r.fetch_add(1, SeqCst);
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for _ in 0..40 {
        clock.advance(10 * MS);
    }
    wait_until(|| runs.load(SeqCst) == 2000);
    wait_until(|| timer.is_empty());
    timer.check_invariants();
}

/// After the timer is dropped, none of its threads remains.
#[test]
fn dropping_the_timer_joins_its_threads() {
    fn timer_threads(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .map(|c| c.starts_with(prefix))
                    .unwrap_or(false)
            })
            .count()
    }
    let timer = SystemTimer::builder()
        .name("tjoin")
        .executor_threads(3)
        .build();
    timer.add(Duration::from_secs(60), || ()).unwrap();
    // Threads name themselves once they start.
    wait_until(|| timer_threads("tjoin-") == 4);
    let t0 = Instant::now();
    drop(timer);
    assert!(t0.elapsed() < Duration::from_secs(5), "shutdown is prompt");
    // Joined threads have exited; the kernel may take a moment to remove their /proc entries
    // (pthread_join returns when the thread id is cleared, slightly before that). A thread that
    // really outlived the timer keeps its entry, and this times out.
    wait_until(|| timer_threads("tjoin-") == 0);
}

/// Bad configurations are errors with a message, not hangs or later panics.
#[test]
fn bad_configurations_are_rejected() {
    use system_timer::BuildError;
    let e = SystemTimer::builder()
        .tick(Duration::ZERO)
        .try_build()
        .unwrap_err();
    assert_eq!(e, BuildError::ZeroTick);
    assert!(matches!(
        SystemTimer::builder()
            .wheel_size(1)
            .try_build()
            .unwrap_err(),
        BuildError::Wheel(_)
    ));
    assert_eq!(
        SystemTimer::builder()
            .executor_threads(0)
            .try_build()
            .unwrap_err(),
        BuildError::NoExecutorThreads
    );
    assert!(e.to_string().contains("tick"));
    let r = std::panic::catch_unwind(|| SystemTimer::builder().wheel_size(0).build());
    assert!(r.is_err(), "build() panics with the message");
}

/// Two idle executors and two batches due together (one per executor, one permit each): both
/// executors run at once. Each task waits for the other to start, so the test hangs (and fails
/// on the hang timeout) if one executor took both permits and the other stayed asleep.
#[test]
fn two_idle_executors_wake_for_two_batches() {
    for _ in 0..20 {
        let clock = ManualClock::new(0);
        let timer = SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .executor_threads(2)
            .name("two") // threads `two-executor-<i>`: within the kernel's 15 bytes
            .build();
        // Both executors asleep waiting for work (`S` in /proc: blocked in a futex). Were one
        // still starting, the batches would find it awake and the test would pass without
        // exercising the wake-up. Without /proc, a pause instead.
        if std::path::Path::new("/proc/self/task").exists() {
            wait_until(|| {
                (0..2).all(|i| common::thread_state(&format!("two-executor-{i}")) == Some('S'))
            });
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        let started = Arc::new(AtomicUsize::new(0));
        let met = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let (started, met) = (started.clone(), met.clone());
            timer
                .add(MS, move || {
                    started.fetch_add(1, SeqCst);
                    let t0 = Instant::now();
                    while started.load(SeqCst) < 2 {
                        if t0.elapsed() > Duration::from_secs(10) {
                            return; // the other never started while this one ran
                        }
                        std::thread::yield_now();
                    }
                    met.fetch_add(1, SeqCst);
                })
                .unwrap();
        }
        clock.advance(MS);
        assert_eq!(timer.advance(), 2);
        wait_until(|| timer.stats().fired == 2 && timer.is_empty());
        wait_until(|| met.load(SeqCst) + (2 - started.load(SeqCst)) >= 2);
        drop(timer); // joins the executors: both tasks have returned
        assert_eq!(met.load(SeqCst), 2, "the two batches ran at the same time");
    }
}

/// `len()` never misses a task on its way from the wheel to the executors: read by another
/// thread while advances move batches, `len() + fired` (fired read after) never falls below
/// the number scheduled.
///
/// The poller must really read while the advances run: the advancing thread waits for it to
/// finish reads at nine points of its loop (each such read falls between two advances, with
/// `0 < fired < n`), and the reads during which an advance completed (the ones that can catch a
/// batch in flight) are counted: over all rounds there must be some (per round there may be
/// none on a loaded machine).
#[test]
fn len_never_undercounts_while_advances_dispatch() {
    // A few rounds: the window a broken len() would fall into is nanoseconds wide.
    let mut straddling = 0;
    for _ in 0..4 {
        straddling += len_round();
    }
    assert!(
        straddling > 0,
        "in no round did an advance complete during a read of len()"
    );
}

/// One round of [`len_never_undercounts_while_advances_dispatch`]: returns how many of the
/// poller's reads an advance completed during.
fn len_round() -> u64 {
    const ADVANCES: usize = 2_000;
    let clock = ManualClock::new(0);
    let timer = Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .executor_threads(2)
            .build(),
    );
    let n = 200_000u64;
    for i in 0..n {
        timer.add(MS * (1 + (i % 2_000) as u32), || ()).unwrap();
    }
    let stop = Arc::new(AtomicUsize::new(0));
    // Advances completed so far, and the poller's completed reads.
    let advanced = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let (t2, s2, a2, r2) = (timer.clone(), stop.clone(), advanced.clone(), reads.clone());
    let poller = std::thread::spawn(move || {
        let mut worst = 0i64;
        // Reads taken with the advances under way and tasks both run and not yet run, and
        // those of them during which an advance completed.
        let (mut amid, mut straddling) = (0u64, 0u64);
        while s2.load(SeqCst) == 0 {
            let before = a2.load(SeqCst);
            let len = t2.len() as i64;
            let fired = t2.stats().fired as i64;
            let after = a2.load(SeqCst);
            worst = worst.max(n as i64 - (len + fired));
            if 0 < before && after < ADVANCES && 0 < fired && fired < n as i64 {
                amid += 1;
            }
            if after > before {
                straddling += 1;
            }
            r2.fetch_add(1, SeqCst);
        }
        (worst, amid, straddling)
    });
    for i in 1..=ADVANCES {
        clock.advance(MS);
        timer.advance();
        advanced.store(i, SeqCst);
        if i % (ADVANCES / 10) == 0 && i < ADVANCES {
            // A read that starts after this (some task has run, at most `i` ms of the 2,000
            // are dispatched) and ends before the next advance.
            wait_until(|| timer.stats().fired > 0);
            let r = reads.load(SeqCst);
            wait_until(|| reads.load(SeqCst) >= r + 2);
        }
    }
    wait_until(|| timer.stats().fired == n);
    stop.store(1, SeqCst);
    let (worst, amid, straddling) = join_all_within(vec![poller]).pop().unwrap();
    assert!(amid >= 9, "only {amid} reads amid the advances");
    assert_eq!(
        worst, 0,
        "len() + fired fell {worst} below the scheduled count"
    );
    assert!(timer.is_empty());
    straddling
}

/// Waits (up to a generous hang timeout) for a condition driven by the timer's threads.
fn wait_until(cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting (hang)"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Without a grace (the default) the reaper never calls for help: after it has slept with a
/// bucket queued, a caller of `advance_if_due_at`, even with a reading past that bucket, finds
/// nothing to claim and counts no caller advance. On the manual clock, so that the reaper surely
/// sleeps with the bucket queued (on the real clock it may find the bucket due first, and
/// `advance_if_due_without_a_grace_does_nothing` then cannot tell).
///
/// Catches: the reaper publishing its bucket's time (`help_at`) without a grace (its
/// `grace_ns > 0` guard mutated to `true` or to `>=`).
#[test]
fn a_reaper_without_a_grace_never_calls_for_help() {
    let clock = ManualClock::new(0);
    let timer = SystemTimer::builder().clock(clock.clone()).inline().build();
    let hour = Duration::from_secs(3600);
    timer.add(hour, || ()).unwrap();
    // At most one wake-up counted from here ends a sleep begun before the add (with nothing
    // queued); the sleep the second one ends began after a look that found the bucket queued,
    // which is when the reaper would publish. Each small move wakes it; nothing comes due.
    let wakeups = timer.stats().reaper_wakeups;
    wait_until(|| {
        clock.advance(Duration::from_micros(1));
        timer.stats().reaper_wakeups >= wakeups + 2
    });
    assert_eq!(timer.advance_if_due_at(2 * hour), 0);
    assert_eq!(
        timer.stats().caller_advances,
        0,
        "a caller advanced for a reaper without a grace"
    );
}

/// The key API: a key cancels its pending task exactly once (true, the task never runs, the
/// memory and the cap slot are given back); after the task ran, or was handed back, a cancel
/// through the key loses; a key of another timer, or of a task already due when added, matches
/// nothing; `is_pending` and `deadline` follow the task.
#[test]
fn keys_cancel_exactly_once_and_match_only_their_task() {
    let clock = ManualClock::new(0);
    let timer = capped(&clock, 2);
    let other = manual(&clock, 20);
    let log = Log::default();
    let a = timer.add_keyed(5 * MS, log.task(&clock, 1)).unwrap();
    let b = timer.add_keyed(7 * MS, log.task(&clock, 2)).unwrap();
    assert!(timer.is_pending(a) && timer.is_pending(b));
    assert_eq!(timer.deadline(a), Some(5 * MS));
    // The cap counts keyed tasks.
    assert!(matches!(
        timer.add_keyed(MS, log.task(&clock, 3)),
        Err(ScheduleError::Full(_))
    ));
    // Another timer's key space is separate, even where indices coincide.
    let o = other.add_keyed(5 * MS, log.task(&clock, 4)).unwrap();
    assert!(!timer.cancel(o) && !timer.is_pending(o) && timer.deadline(o).is_none());
    assert!(other.is_pending(o));
    // Cancel wins once, and gives the cap slot back.
    assert!(timer.cancel(a));
    assert!(!timer.cancel(a));
    assert!(!timer.is_pending(a) && timer.deadline(a).is_none());
    assert_eq!(timer.len(), 1);
    let c = timer.add_keyed(9 * MS, log.task(&clock, 5)).unwrap();
    // After firing, the key loses.
    clock.advance(7 * MS);
    assert_eq!(timer.advance(), 1);
    assert_eq!(log.runs(2), vec![7_000_000]);
    assert!(!timer.cancel(b) && !timer.is_pending(b));
    // A task already due when added runs at the next advance; its key matches nothing.
    let d = timer
        .add_keyed(Duration::ZERO, log.task(&clock, 6))
        .unwrap();
    assert!(!timer.is_pending(d) && !timer.cancel(d));
    assert_eq!(timer.advance(), 1);
    assert_eq!(log.runs(6).len(), 1);
    // Shutdown hands back the keyed task still pending; its key then loses.
    let left = timer.shutdown();
    assert_eq!(left.len(), 1);
    assert!(!timer.cancel(c) && !timer.is_pending(c));
    assert!(log.runs(1).is_empty() && log.runs(5).is_empty());
    assert_eq!(log.total(), 2);
    let st = timer.stats();
    assert_eq!(
        (
            st.scheduled,
            st.fired,
            st.cancelled,
            st.handed_back,
            st.pending
        ),
        (4, 2, 1, 1, 0)
    );
}

/// Many threads cancelling by key while the timer fires on another: for each task exactly one
/// of "it ran" or "a cancel returned true", and the counters reconcile.
#[test]
fn keyed_cancels_racing_fires_have_one_outcome_each() {
    const N: u64 = 4_000;
    let clock = ManualClock::new(0);
    let timer = Arc::new(manual(&clock, 8));
    let ran: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
    let keys: Vec<_> = (0..N)
        .map(|i| {
            let ran = ran.clone();
            timer
                .add_keyed(Duration::from_millis(1 + i % 200), move || {
                    ran[i as usize].fetch_add(1, SeqCst);
                })
                .unwrap()
        })
        .collect();
    let keys = Arc::new(keys);
    let won: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
    let cancellers: Vec<_> = (0..3)
        .map(|t| {
            let (timer, keys, won) = (timer.clone(), keys.clone(), won.clone());
            std::thread::spawn(move || {
                for i in (t..N as usize).step_by(3) {
                    if timer.cancel(keys[i]) {
                        won[i].fetch_add(1, SeqCst);
                    }
                }
            })
        })
        .collect();
    for _ in 0..250 {
        clock.advance(MS);
        timer.advance();
    }
    for c in cancellers {
        c.join().unwrap();
    }
    for i in 0..N as usize {
        let (r, w) = (ran[i].load(SeqCst), won[i].load(SeqCst));
        assert_eq!(r + w, 1, "task {i}: ran {r} times, cancel won {w} times");
    }
    timer.check_invariants();
    assert!(timer.is_empty());
}

/// Dropping a handle does not cancel its task (fire-and-forget): the task stays pending, is
/// counted by `len()`, and runs when due.
///
/// Catches: a `Drop` on `TimerHandle` that cancels (the task would never run, `len()` would
/// drop to 0 at once and `cancelled` would count it).
#[test]
fn dropping_a_handle_does_not_cancel_its_task() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    let h = timer.add(5 * MS, log.task(&clock, 1)).unwrap();
    drop(h);
    assert_eq!(timer.len(), 1, "still pending after its handle was dropped");
    clock.advance(5 * MS);
    assert_eq!(timer.advance(), 1);
    assert_eq!(log.runs(1), [5_000_000]);
    let st = timer.stats();
    assert_eq!(
        (st.scheduled, st.fired, st.cancelled, st.pending),
        (1, 1, 0, 0)
    );
}

/// A handle's `Debug` shows its deadline (ns) and whether the task is still pending.
///
/// Catches: `Debug for TimerHandle` emptied (writing nothing).
#[test]
fn a_handles_debug_shows_its_deadline_and_whether_it_is_pending() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let h = timer.add(5 * MS, || ()).unwrap();
    assert_eq!(
        format!("{h:?}"),
        "TimerHandle { deadline_ns: 5000000, pending: true }"
    );
    assert!(h.cancel());
    assert_eq!(
        format!("{h:?}"),
        "TimerHandle { deadline_ns: 5000000, pending: false }"
    );
}

/// A builder's `Debug` shows every setting, the shard count and the clock included (they were
/// left out until 2026-11-26).
#[test]
fn a_builders_debug_shows_every_setting() {
    let b = SystemTimer::builder()
        .clock(ManualClock::new(7))
        .shards(4)
        .name("leases");
    let text = format!("{b:?}");
    for field in [
        "tick: 1ms",
        "wheel_size: 20",
        "executor_threads: 1",
        "inline: false",
        "max_pending: None",
        "name: \"leases\"",
        "reaper: true",
        "reaper_grace: 0ns",
        "shards: Some(4)",
        "clock: Some(ManualClock",
    ] {
        assert!(text.contains(field), "{field} missing from {text}");
    }
}

/// The counters a user reads: scheduled, fired, cancelled, pending, the buckets in the expiry
/// queue, the levels, and the lateness distribution, all exact on the manual clock. A task due
/// at 10 ms that a runner picks up at 13 ms is 3 ms late.
///
/// Catches: `queued_buckets` or the lateness not reported (zero), lateness measured from the
/// bucket's or the advance's time rather than from the task's own deadline.
#[test]
fn stats_report_queued_buckets_levels_and_lateness_on_the_manual_clock() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let log = Log::default();
    timer.add(10 * MS, log.task(&clock, 1)).unwrap();
    timer.add(10 * MS, log.task(&clock, 2)).unwrap();
    timer.add(12 * MS, log.task(&clock, 3)).unwrap();
    let c = timer.add(15 * MS, log.task(&clock, 4)).unwrap();
    timer.add(100 * MS, log.task(&clock, 5)).unwrap(); // level 1 (span 20 ms)
    let st = timer.stats();
    assert_eq!(st.queued_buckets, 4, "10, 12, 15 ms and one level-1 bucket");
    assert_eq!(st.levels, 2);
    assert_eq!((st.scheduled, st.pending, st.lateness.count), (5, 5, 0));
    assert!(c.cancel());
    assert_eq!(
        timer.stats().queued_buckets,
        4,
        "an emptied bucket stays queued"
    );
    clock.advance(13 * MS);
    assert_eq!(timer.advance(), 3);
    let st = timer.stats();
    assert_eq!(
        (st.fired, st.cancelled, st.pending, st.queued_buckets),
        (3, 1, 1, 2),
        "{st:?}"
    );
    let l = st.lateness;
    assert_eq!(l.count, 3);
    assert_eq!(l.max_ns, 3_000_000, "{l:?}");
    assert_eq!(l.mean_ns, (3_000_000 + 3_000_000 + 1_000_000) / 3, "{l:?}");
    // Percentiles are bucket upper bounds within 12.5 %, never above the maximum.
    assert!((2_625_000..=3_000_000).contains(&l.p50_ns), "{l:?}");
    assert!((2_625_000..=3_000_000).contains(&l.p99_ns), "{l:?}");
}

/// The executor runs on one thread by default (`executor_threads` defaults to 1): a default
/// timer starts exactly one `<name>-executor-<i>` thread. Linux only (reads `/proc`).
#[cfg(target_os = "linux")]
#[test]
fn the_default_executor_is_one_thread() {
    let executors = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.starts_with("dflt1x-executor"))
            .count()
    };
    let timer: SystemTimer = SystemTimer::builder()
        .clock(ManualClock::new(0))
        .name("dflt1x")
        .reaper(false)
        .build();
    let (tx, rx) = std::sync::mpsc::channel();
    timer
        .add(Duration::ZERO, move || {
            tx.send(std::thread::current().name().map(str::to_owned))
                .unwrap();
        })
        .unwrap();
    let ran_on = rx.recv_timeout(Duration::from_secs(20)).expect("never ran");
    assert_eq!(ran_on.as_deref(), Some("dflt1x-executor-0"));
    assert_eq!(executors(), 1);
    // The drop joins the executor (under a hang guard). Joined threads have exited, but the
    // kernel may take a moment to remove their /proc entries (as in
    // `dropping_the_timer_joins_its_threads`): wait for that, within a hang guard. A thread
    // that really outlived the timer keeps its entry, and this fails.
    common::within("the drop", 20, move || drop(timer));
    common::wait_for_threads_to_end("dflt1x-executor");
}

#[test]
fn next_expiration_reports_a_due_task_waiting_for_the_next_inline_advance() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    clock.advance(10 * MS);
    timer.advance(); // the wheel's time is 10 ms: a deadline at 5 ms is due when added
    assert_eq!(timer.next_expiration(), None, "nothing pending");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let h = timer
        .add_at(Duration::from_millis(5), move || {
            r.fetch_add(1, SeqCst);
        })
        .unwrap();
    assert!(h.is_fired(), "due when added: out of the wheel at once");
    assert_eq!(
        (timer.len(), ran.load(SeqCst)),
        (1, 0),
        "waits for an advance"
    );
    // A hand-driven loop sleeps until `next_expiration` and then advances: it must see work now.
    assert_eq!(timer.next_expiration(), Some(timer.now()));
    // Also with a bucket queued later than it.
    timer.add(Duration::from_millis(50), || ()).unwrap();
    assert_eq!(timer.next_expiration(), Some(timer.now()));
    assert_eq!(timer.advance(), 1);
    assert_eq!(ran.load(SeqCst), 1);
    assert_eq!(timer.next_expiration(), Some(Duration::from_millis(60)));
}

/// The reaper's alarm (a timerfd) exists only for a timer with both a reaper and a grace: a
/// reaper without a grace sleeps on its condvar, and a grace without a reaper has no one to
/// wake, so neither holds a kernel timer. Counts the process's timerfds, which only a graced
/// timer makes (no other test in this file builds one). Linux only (reads `/proc`).
///
/// Catches: `self.reaper && self.reaper_grace > Duration::ZERO` in `try_build` mutated to
/// `||` (a graced timer without a reaper holds one) or to `>=` (every timer with a reaper
/// holds one).
#[cfg(target_os = "linux")]
#[test]
fn only_a_reaper_with_a_grace_holds_a_timerfd() {
    let timerfds = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("timerfd"))
            .count()
    };
    let build = |reaper: bool, grace: Duration| {
        SystemTimer::builder()
            .clock(ManualClock::new(0))
            .reaper(reaper)
            .reaper_grace(grace)
            .inline()
            .build()
    };
    let plain = build(true, Duration::ZERO);
    assert_eq!(timerfds(), 0, "a reaper without a grace holds a timerfd");
    let unreaped = build(false, 2 * MS);
    assert_eq!(timerfds(), 0, "a grace without a reaper holds a timerfd");
    let graced = build(true, 2 * MS);
    assert_eq!(timerfds(), 1, "a reaper with a grace sleeps on its timerfd");
    drop(graced);
    assert_eq!(timerfds(), 0, "the timerfd is closed with its timer");
    drop((plain, unreaped));
}

/// `is_shutdown` says false for a live timer, however it is used, and true from the shutdown
/// on.
///
/// Catches: `is_shutdown` always true (the other tests only ask it after a shutdown).
#[test]
fn is_shutdown_is_false_until_the_timer_is_shut_down() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    assert!(!timer.is_shutdown(), "a new timer");
    let log = Log::default();
    timer.add(MS, log.task(&clock, 1)).unwrap();
    timer.add(10 * MS, log.task(&clock, 2)).unwrap();
    clock.advance(MS);
    assert_eq!(timer.advance(), 1);
    assert!(!timer.is_shutdown(), "a timer that ran a task");
    assert_eq!(timer.shutdown().len(), 1);
    assert!(timer.is_shutdown());
}

/// A deadline exactly one tick below the end of the clock's range is one the wheel can hold
/// (it rounds up to the wheel's last tick): added on a clock already past it, with the wheel's
/// time still behind it, it waits in the wheel like any other passed deadline and runs at the
/// next advance. Only deadlines beyond it are "past the wheel's last tick" and dispatched at
/// once on such a clock.
///
/// Catches: the "past the wheel's last tick" test of `schedule_with` (`deadline_ns > u64::MAX
/// - tick_ns`) widened to `>=` (the task would be dispatched at add time).
#[test]
fn a_deadline_one_tick_below_the_end_of_the_clock_waits_for_an_advance() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    clock.advance(Duration::MAX);
    let log = Log::default();
    let at = u64::MAX - timer.tick().as_nanos() as u64;
    let h = timer
        .add_at(Duration::from_nanos(at), log.task(&clock, 1))
        .unwrap();
    assert!(h.is_pending(), "in the wheel until an advance reaches it");
    assert_eq!(h.deadline_ns(), at);
    assert_eq!(timer.advance(), 1);
    assert!(h.is_fired());
    assert_eq!(log.runs(1), [u64::MAX]);
    timer.check_invariants();
}

/// `SystemTimer::next_expiration` once promised "`None` when nothing is pending", but a bucket
/// emptied by cancels stays queued until its time, and is reported: the documentation now says
/// so. After the only task is cancelled (by handle, then by key) the timer is empty and still
/// names the bucket's time, no later than the task's deadline; once the clock passes it and the
/// timer advances, nothing is queued: `None`.
#[test]
fn next_expiration_names_an_emptied_bucket_until_it_is_advanced_past() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock, 20);
    let handle = timer.add(Duration::from_millis(30), || ()).unwrap();
    assert!(handle.cancel());
    let key = timer.add_keyed(Duration::from_millis(40), || ()).unwrap();
    assert!(timer.cancel(key));
    assert!(timer.is_empty());
    let next = timer
        .next_expiration()
        .expect("the emptied buckets stay queued");
    assert!(next <= Duration::from_millis(30), "{next:?}");
    clock.advance(Duration::from_millis(50));
    assert_eq!(timer.advance(), 0, "nothing to run");
    assert_eq!(timer.next_expiration(), None);
}

/// `ManualClock::new(start_ms)` reads `start_ms` up to the last millisecond a `u64` of
/// nanoseconds holds (18,446,744,073,709 ms, about 584 years), and its last nanosecond for any
/// start past it, as documented (its documentation once promised `start_ms` for every start);
/// `set_ms` saturates the same way.
#[test]
fn a_manual_clock_started_past_its_last_nanosecond_reads_that_nanosecond() {
    let last_ms = u64::MAX / 1_000_000;
    assert_eq!(ManualClock::new(last_ms).now_ms(), last_ms);
    assert_eq!(ManualClock::new(last_ms).now_ns(), last_ms * 1_000_000);
    for start_ms in [last_ms + 1, u64::MAX] {
        assert_eq!(
            ManualClock::new(start_ms).now_ns(),
            u64::MAX,
            "start {start_ms} ms"
        );
    }
    let clock = ManualClock::new(0);
    clock.set_ms(u64::MAX);
    assert_eq!(clock.now_ns(), u64::MAX);
}
