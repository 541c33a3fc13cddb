//! Loom models of `SystemTimer`: one race per test (see `shared/LOOM.md`, §6).
//!
//! Run with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --profile loom -p system-timer --test loom_timer
//! ```
//!
//! Every timer is built with `.reaper(false).inline()` on a `ManualClock` and driven by explicit
//! `advance_to` calls, so a task runs inline on the thread that advanced the timer. Every task is
//! a [`Probe`] holding loom `Arc`s (the clock and the run log), so a task the timer loses by
//! leaking it fails the model as "Arc leaked."; each task that runs appends a [`Run`] to the log
//! (under a loom mutex, so the log's order is the order in which the tasks really ran), and the
//! models account for every task exactly once: ran, cancelled, handed back by `shutdown`, or
//! returned in an error.
#![cfg(loom)]

use std::fmt;
use std::time::Duration;

use loom::sync::{Arc, Mutex};
use loom::thread;
use system_timer::{Builder, ManualClock, ScheduleError, SystemTimer, TimerHandle, TimerTask};

const MS: Duration = Duration::from_millis(1);

/// One run of a task: its id and the clock's reading (ms) when it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    id: u32,
    now_ms: u64,
}

/// The runs, in the order they happened.
type Log = Arc<Mutex<Vec<Run>>>;

/// A task that logs its run, with the time it ran at.
struct Probe {
    id: u32,
    clock: ManualClock,
    log: Log,
}

impl TimerTask for Probe {
    fn run(self) {
        let now_ms = self.clock.now_ms();
        self.log.lock().unwrap().push(Run {
            id: self.id,
            now_ms,
        });
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Probe({})", self.id)
    }
}

fn new_log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

fn probe(id: u32, clock: &ManualClock, log: &Log) -> Probe {
    Probe {
        id,
        clock: clock.clone(),
        log: Arc::clone(log),
    }
}

fn runs(log: &Log) -> Vec<Run> {
    log.lock().unwrap().clone()
}

/// Tick 1 ms, one shard, inline, no reaper: level 0 spans `wheel_size` ms.
fn timer(clock: &ManualClock, wheel_size: usize) -> SystemTimer<Probe> {
    Builder::<Probe>::new()
        .tick(MS)
        .wheel_size(wheel_size)
        .clock(clock.clone())
        .shards(1)
        .reaper(false)
        .inline()
        .build()
}

/// The handle agrees with what happened to the task (ran, cancelled, handed back).
fn assert_handle(h: &TimerHandle<Probe>, ran: bool, cancelled: bool, handed_back: bool) {
    assert_eq!(h.is_fired(), ran, "is_fired");
    assert_eq!(h.is_cancelled(), cancelled, "is_cancelled");
    assert_eq!(h.is_handed_back(), handed_back, "is_handed_back");
    assert!(!h.is_pending(), "nothing is pending at the end");
    assert!(!h.cancel(), "a late cancel never wins");
}

/// R1 + R2: a user cancels a 6 ms task (wheel size 4: it starts in the overflow level) while the
/// reaper flushes the overflow bucket at 4 ms (re-adding the entry at level 0) and then passes
/// the deadline at 8 ms. Kafka's "this thread sees null and exits the loop, but the other thread
/// inserts the entry to another list later".
#[test]
fn cancel_races_overflow_flush_and_expiry() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let handle = timer.add(6 * MS, probe(1, &clock, &log)).unwrap();

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                clock.advance(4 * MS);
                let a = timer.advance_to(clock.now_ms()); // flush the overflow bucket
                clock.advance(4 * MS);
                let b = timer.advance_to(clock.now_ms()); // past the deadline
                (a, b)
            })
        };
        let cancelled = handle.cancel();
        let (a, b) = reaper.join().unwrap();

        let runs = runs(&log);
        assert!(runs.len() <= 1, "ran more than once: {runs:?}");
        assert_eq!(
            usize::from(cancelled) + runs.len(),
            1,
            "exactly one of cancel / run wins (cancelled {cancelled}, runs {runs:?})"
        );
        assert_eq!(a, 0, "nothing is due at 4 ms");
        assert_eq!(a + b, runs.len(), "advance_to counts the runs");
        for r in &runs {
            assert_eq!(r.id, 1);
            assert!(r.now_ms >= handle.deadline_ms(), "early: {r:?}");
        }
        assert_handle(&handle, runs.len() == 1, cancelled, false);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// R1 at level 0: a user cancels a 2 ms task while the reaper flushes its bucket and runs it.
#[test]
fn cancel_races_fire() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let handle = timer.add(2 * MS, probe(1, &clock, &log)).unwrap();

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                clock.advance(2 * MS);
                timer.advance_to(clock.now_ms())
            })
        };
        let cancelled = handle.cancel();
        let n = reaper.join().unwrap();

        let runs = runs(&log);
        assert_eq!(
            usize::from(cancelled) + runs.len(),
            1,
            "exactly one of cancel / run wins (cancelled {cancelled}, runs {runs:?})"
        );
        assert_eq!(n, runs.len(), "advance_to counts the runs");
        for r in &runs {
            assert_eq!(*r, Run { id: 1, now_ms: 2 });
        }
        assert_handle(&handle, runs.len() == 1, cancelled, false);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// R4: `add(1 ms)` (one shard lock) races the reaper moving the clock by 1 ms and advancing
/// (every shard lock). The add may read the clock before or after it moved, and reach the wheel
/// before or after the advance. After one more advance past every possible deadline the task
/// has run exactly once, and never before its deadline.
#[test]
fn add_races_advance() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                clock.advance(MS);
                timer.advance_to(clock.now_ms())
            })
        };
        let handle = timer.add(MS, probe(1, &clock, &log)).unwrap();
        let a = reaper.join().unwrap();
        // The deadline is 1 or 2 ms (the add read the clock at 0 or 1 ms): 2 ms is past both.
        clock.advance(MS);
        let b = timer.advance_to(clock.now_ms());

        let runs = runs(&log);
        assert_eq!(runs.len(), 1, "ran exactly once: {runs:?}");
        assert_eq!(a + b, 1, "advance_to counts the runs (a {a}, b {b})");
        assert_eq!(runs[0].id, 1);
        assert!(
            runs[0].now_ms >= handle.deadline_ms(),
            "ran at {} ms, before its deadline {} ms",
            runs[0].now_ms,
            handle.deadline_ms()
        );
        assert_handle(&handle, true, false, false);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// R8: an `add` of a task not yet due races `shutdown`. The task is either refused (handed back
/// in `ScheduleError::Shutdown`) or handed back by shutdown; never both, never lost, never run.
#[test]
fn shutdown_races_add() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let adder = {
            let (timer, clock, log) = (Arc::clone(&timer), clock.clone(), Arc::clone(&log));
            thread::spawn(move || timer.add(MS, probe(1, &clock, &log)))
        };
        let returned = timer.shutdown();
        let added = adder.join().unwrap();
        // Nothing runs after shutdown, even past the deadline.
        clock.advance(2 * MS);
        assert_eq!(timer.advance_to(clock.now_ms()), 0);

        let runs = runs(&log);
        assert!(runs.is_empty(), "never due while the timer ran: {runs:?}");
        match added {
            Ok(h) => {
                let ids: Vec<u32> = returned.iter().map(|p| p.id).collect();
                assert_eq!(ids, [1], "accepted before the close, so handed back");
                assert_handle(&h, false, false, true);
            }
            Err(ScheduleError::Shutdown(p)) => {
                assert_eq!(p.id, 1);
                assert!(returned.is_empty(), "refused and handed back: {returned:?}");
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert!(timer.is_shutdown());
        assert!(
            timer.shutdown().is_empty(),
            "a second shutdown returns nothing"
        );
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// R8 for a task already due: `add(ZERO)` (dispatched at once into the inline ready list) and
/// an `advance_to` on the adding thread race `shutdown`. The task is refused, handed back by
/// shutdown, or ran before shutdown returned: exactly one of these, and nothing runs after
/// shutdown returns.
#[test]
fn shutdown_races_due_add() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let adder = {
            let (timer, clock, log) = (Arc::clone(&timer), clock.clone(), Arc::clone(&log));
            thread::spawn(move || {
                let added = timer.add(Duration::ZERO, probe(1, &clock, &log));
                let n = timer.advance_to(clock.now_ms());
                (added, n)
            })
        };
        let returned = timer.shutdown();
        let runs_at_shutdown = runs(&log);
        let (added, n) = adder.join().unwrap();

        let runs = runs(&log);
        assert_eq!(runs, runs_at_shutdown, "a task ran after shutdown returned");
        assert_eq!(n, runs.len(), "advance_to counts the runs");
        let ids: Vec<u32> = returned.iter().map(|p| p.id).collect();
        match added {
            Ok(h) => {
                assert_eq!(
                    runs.len() + ids.len(),
                    1,
                    "accepted: ran or handed back, once (runs {runs:?}, returned {ids:?})"
                );
                assert!(runs.iter().all(|r| r.id == 1) && ids.iter().all(|&id| id == 1));
                // Dispatched at once: the handle reports it fired, whoever ends up with it.
                assert!(h.is_fired() && !h.is_cancelled() && !h.is_pending());
                assert!(!h.cancel());
            }
            Err(ScheduleError::Shutdown(p)) => {
                assert_eq!(p.id, 1);
                assert!(
                    runs.is_empty() && ids.is_empty(),
                    "refused, yet ran {runs:?} or handed back {ids:?}"
                );
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// Shutdown races an `advance_to` that has a due task to run: the task either ran (before
/// shutdown returned) or was handed back by shutdown; never both, never neither.
#[test]
fn shutdown_races_advance() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let handle = timer.add(MS, probe(1, &clock, &log)).unwrap();
        clock.advance(MS);

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || timer.advance_to(clock.now_ms()))
        };
        let returned = timer.shutdown();
        let runs_at_shutdown = runs(&log);
        let n = reaper.join().unwrap();

        let runs = runs(&log);
        assert_eq!(runs, runs_at_shutdown, "a task ran after shutdown returned");
        let ids: Vec<u32> = returned.iter().map(|p| p.id).collect();
        assert_eq!(
            runs.len() + ids.len(),
            1,
            "ran or handed back, exactly once (runs {runs:?}, returned {ids:?})"
        );
        assert_eq!(n, runs.len(), "advance_to counts the runs");
        for r in &runs {
            assert_eq!(*r, Run { id: 1, now_ms: 1 });
        }
        assert_eq!(ids.iter().filter(|&&id| id == 1).count(), ids.len());
        assert_handle(&handle, runs.len() == 1, false, ids.len() == 1);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}

/// An `add(ZERO)` (already due: dispatched at once into the inline ready list, not the wheel)
/// races an `advance_to`. The task runs exactly once: in that advance, or in the next one.
#[test]
fn zero_delay_add_races_advance() {
    loom::model(|| {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || timer.advance_to(clock.now_ms()))
        };
        let handle = timer.add(Duration::ZERO, probe(1, &clock, &log)).unwrap();
        let a = reaper.join().unwrap();
        let b = timer.advance_to(clock.now_ms());

        let runs = runs(&log);
        assert_eq!(runs, [Run { id: 1, now_ms: 0 }], "ran exactly once");
        assert_eq!(a + b, 1, "one of the two advances ran it (a {a}, b {b})");
        assert!(handle.is_fired() && !handle.is_cancelled() && !handle.is_pending());
        assert!(!handle.cancel());
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
    });
}
