//! Loom models of `SystemTimer`: one race per test (see `shared/LOOM.md`, §6).
//!
//! Run with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --profile loom -p system-timer --test loom_timer -- --nocapture
//! ```
//!
//! Every timer is built with `.reaper(false).inline()` on a `ManualClock` and driven by explicit
//! `advance_to` calls, or, in the models of the reaper's sleep/wake handshake, by a thread that
//! plays the reaper with `reaper_step` (one turn of the reaper thread's loop: the same code, its
//! sleep on the modelled `Parker`); either way a task runs inline on the thread that advanced
//! the timer. The models of the grace path (a timer with a reaper grace, whose reaper publishes
//! help for callers of `advance_if_due` and sleeps on an alarm that their advances move) read
//! the alarm as the parker records it under loom (`sleeping_reaper`). The models of the
//! executors build their timer in executor mode instead (`model_executors`, hidden: its
//! executor threads are loom threads, which its shutdown joins): due tasks go over the channel
//! to them, and idle ones sleep on the semaphore. Every task is
//! a [`Probe`] holding loom `Arc`s (the clock and the run log), so a task the timer leaks fails
//! the model as "Arc leaked."; each task that runs appends a [`Run`] to the log (under a loom
//! mutex, so the log's order is the order in which the tasks really ran), and the models account
//! for every task exactly once: ran, cancelled, handed back by `shutdown`, or returned in an
//! error.
//!
//! Each model returns the name of the outcome its execution reached, and [`model`] fails unless
//! every outcome the race allows was reached in some execution: a model that stops exploring
//! the race (see [`set_clock`]) fails instead of passing vacuously. With `--nocapture` it prints
//! the number of executions and how often each outcome was reached.
#![cfg(loom)]

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::{Arc, Mutex};
use loom::thread;
use system_timer::{
    Builder, ManualClock, ScheduleError, SystemTimer, Task, TimerHandle, TimerKey, TimerTask,
};

const MS: Duration = Duration::from_millis(1);

/// Loom's branch cap for these models. `check_invariants` reads `stats()`, whose lateness
/// histogram is about 500 loom atomics, so one `check_invariants` alone takes about 500
/// branches and loom's default cap of 1000 is too small for a model that also does some work.
/// Raising it adds no interleavings (the check runs after every thread is joined); it only lets
/// an execution be longer.
const MAX_BRANCHES: usize = 10_000;

/// Runs `f` under loom (settings from the environment, as `loom::model`, but with at least
/// [`MAX_BRANCHES`]) and checks that each of `expected` outcomes was reached by some execution.
///
/// `loom::model::Builder::check` logs nothing (only `loom::model` installs the `tracing`
/// subscriber that `LOOM_LOG` needs), so this prints the number of executions itself.
fn model(expected: &'static [&'static str], f: impl Fn() -> &'static str + Sync + Send + 'static) {
    model_bounded(None, expected, f);
}

/// [`model`] with at most `bound` preemptions per execution (`LOOM_MAX_PREEMPTIONS` may lower
/// it further): for a model whose state space at CI's bound outgrows its time budget (about
/// 10 s).
// The tally and the timing are the harness's, outside the model: std on purpose.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn model_bounded(
    bound: Option<usize>,
    expected: &'static [&'static str],
    f: impl Fn() -> &'static str + Sync + Send + 'static,
) {
    // Outside the model (std, not loom): only counts executions and outcomes.
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<&str, usize>::new()));
    let mut builder = loom::model::Builder::new();
    builder.max_branches = builder.max_branches.max(MAX_BRANCHES);
    if let Some(bound) = bound {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(bound, |b| b.min(bound)));
    }
    let seen = std::sync::Arc::clone(&outcomes);
    let started = std::time::Instant::now();
    builder.check(move || {
        let outcome = f();
        *seen.lock().unwrap().entry(outcome).or_default() += 1;
    });
    let outcomes = outcomes.lock().unwrap();
    let name = std::thread::current().name().unwrap_or("model").to_owned();
    println!(
        "{name}: completed in {} iterations, {:.2?}; outcomes {outcomes:?}",
        outcomes.values().sum::<usize>(),
        started.elapsed()
    );
    for e in expected {
        assert!(
            outcomes.contains_key(e),
            "{name}: outcome {e:?} never reached (reached: {outcomes:?})"
        );
    }
    for o in outcomes.keys() {
        assert!(expected.contains(o), "{name}: unexpected outcome {o:?}");
    }
}

/// Sets the clock to `ms`. Loom 0.7.2 does not explore a read on another thread landing after
/// `ManualClock::advance`: that is a `fetch_update`, which loom runs as a load followed by a
/// compare-exchange, and its exploration never schedules the other thread's read between the
/// two (a minimal model, `advance` on a spawned thread against `now_ms` on the main thread, only
/// ever reads the old time). `set_ms` is a single `fetch_max`, which loom explores fully; with
/// one thread moving the clock, setting it to the current time plus `d` is advancing it by `d`.
fn set_clock(clock: &ManualClock, ms: u64) {
    clock.set_ms(ms);
}

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

fn ids(tasks: &[Probe]) -> Vec<u32> {
    tasks.iter().map(|p| p.id).collect()
}

/// The name of a cancel-versus-fire outcome.
fn cancel_or_run(cancelled: bool) -> &'static str {
    if cancelled {
        "cancelled"
    } else {
        "ran"
    }
}

/// Tick 1 ms, one shard, inline, no reaper: level 0 spans `wheel_size` ms.
fn timer(clock: &ManualClock, wheel_size: usize) -> SystemTimer<Probe> {
    builder(clock, wheel_size).build()
}

/// What [`timer`] builds, before `build` (for tasks of any type).
fn builder<T: TimerTask>(clock: &ManualClock, wheel_size: usize) -> Builder<T> {
    Builder::<T>::new()
        .tick(MS)
        .wheel_size(wheel_size)
        .clock(clock.clone())
        .shards(1)
        .reaper(false)
        .inline()
}

/// The handle agrees with what happened to the task (ran, cancelled, handed back).
fn assert_handle(h: &TimerHandle<Probe>, ran: bool, cancelled: bool, handed_back: bool) {
    assert_eq!(h.is_fired(), ran, "is_fired");
    assert_eq!(h.is_cancelled(), cancelled, "is_cancelled");
    assert_eq!(h.is_handed_back(), handed_back, "is_handed_back");
    assert!(!h.is_pending(), "nothing is pending at the end");
    assert!(!h.cancel(), "a late cancel never wins");
}

/// How a model schedules its task and cancels it: through a [`TimerHandle`] or a
/// [`TimerKey`].
#[derive(Clone, Copy)]
enum Via {
    Handle,
    Key,
}

/// What `add` or `add_keyed` returned.
enum Scheduled {
    Handle(TimerHandle<Probe>),
    Key(TimerKey),
}

/// R1 + R2: a user cancels a 6 ms task (wheel size 4: it starts in the overflow level) while the
/// reaper moves the clock to 4 ms and flushes the overflow bucket (re-adding the entry at level
/// 0), then moves it to 8 ms, past the deadline. Kafka's "this thread sees null and exits the
/// loop, but the other thread inserts the entry to another list later".
#[test]
fn cancel_races_overflow_flush_and_expiry() {
    overflow_flush_race(Via::Handle);
}

/// The same race through the key API (no handle, no reference count).
#[test]
fn keyed_cancel_races_overflow_flush_and_expiry() {
    overflow_flush_race(Via::Key);
}

fn overflow_flush_race(via: Via) {
    model(&["cancelled", "ran"], move || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let task = probe(1, &clock, &log);
        let scheduled = match via {
            Via::Handle => Scheduled::Handle(timer.add(6 * MS, task).unwrap()),
            Via::Key => Scheduled::Key(timer.add_keyed(6 * MS, task).unwrap()),
        };

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 4);
                let a = timer.advance_to(clock.now_ms()); // flush the overflow bucket
                set_clock(&clock, 8);
                let b = timer.advance_to(clock.now_ms()); // past the deadline
                (a, b)
            })
        };
        let cancelled = match &scheduled {
            Scheduled::Handle(h) => h.cancel(),
            Scheduled::Key(k) => timer.cancel(*k),
        };
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
            assert_eq!(
                *r,
                Run { id: 1, now_ms: 8 },
                "run at the deadline's tick, never early"
            );
        }
        match &scheduled {
            Scheduled::Handle(h) => assert_handle(h, runs.len() == 1, cancelled, false),
            Scheduled::Key(k) => assert!(
                !timer.is_pending(*k) && !timer.cancel(*k),
                "a late cancel never wins"
            ),
        }
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        cancel_or_run(cancelled)
    });
}

/// R1 at level 0: a user cancels a 2 ms task while the reaper moves the clock to 2 ms, flushes
/// the task's bucket and runs it.
#[test]
fn cancel_races_fire() {
    model(&["cancelled", "ran"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let handle = timer.add(2 * MS, probe(1, &clock, &log)).unwrap();

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 2);
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
        cancel_or_run(cancelled)
    });
}

/// R4: `add(1 ms)` (one shard lock) races the reaper moving the clock to 1 ms and advancing
/// (every shard lock). The add reads the clock before or after it moved (deadline 1 or 2 ms) and
/// reaches the wheel before or after the advance (in the wheel, or already due and dispatched at
/// once). After one more advance, to 2 ms, past every possible deadline, the task has run
/// exactly once, and never before its deadline.
#[test]
fn add_races_advance() {
    const OUTCOMES: &[&str] = &[
        "deadline 1 ms, run by the racing advance",
        "deadline 1 ms, already due at add, run by the next advance",
        "deadline 2 ms, run by the next advance",
    ];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 1);
                timer.advance_to(clock.now_ms())
            })
        };
        let handle = timer.add(MS, probe(1, &clock, &log)).unwrap();
        let a = reaper.join().unwrap();
        // Nothing overdue is left behind: an entry linked before the racing advance took the
        // locks was fired by it; one linked after it is in a later bucket, or was due at once
        // (out of the wheel, waiting for the next advance: `next_expiration` then says now).
        let next = timer.next_expiration();
        let waits_to_run = handle.is_fired() && runs(&log).is_empty();
        if waits_to_run {
            assert_eq!(next, Some(timer.now()), "a task due at add waits to run");
        } else {
            assert!(
                next.is_none_or(|t| t > timer.now()),
                "bucket at {next:?} overdue at {:?}",
                timer.now()
            );
        }
        timer.check_invariants();
        set_clock(&clock, 2);
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
        assert!(!handle.is_pending() && !handle.is_cancelled() && !handle.is_handed_back());
        assert!(handle.is_fired());
        assert!(!handle.cancel());
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        match (handle.deadline_ms(), a) {
            (1, 1) => OUTCOMES[0],
            (1, _) => OUTCOMES[1],
            (2, _) => OUTCOMES[2],
            (d, _) => panic!("deadline {d} ms"),
        }
    });
}

/// R8: an `add` of a task not yet due races `shutdown`. The task is either refused (handed back
/// in `ScheduleError::Shutdown`) or handed back by shutdown; never both, never lost, never run,
/// not even by an advance past its deadline after shutdown.
#[test]
fn shutdown_races_add() {
    model(&["refused", "handed back"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));

        let adder = {
            let (timer, clock, log) = (Arc::clone(&timer), clock.clone(), Arc::clone(&log));
            thread::spawn(move || timer.add(MS, probe(1, &clock, &log)))
        };
        let returned = timer.shutdown();
        let added = adder.join().unwrap();
        set_clock(&clock, 2);
        assert_eq!(
            timer.advance_to(clock.now_ms()),
            0,
            "advanced after shutdown"
        );

        let runs = runs(&log);
        assert!(runs.is_empty(), "ran: {runs:?}");
        let outcome = match added {
            Ok(h) => {
                assert_eq!(ids(&returned), [1], "accepted, so handed back");
                assert_handle(&h, false, false, true);
                "handed back"
            }
            Err(ScheduleError::Shutdown(p)) => {
                assert_eq!(p.id, 1);
                assert!(returned.is_empty(), "refused and handed back: {returned:?}");
                "refused"
            }
            Err(e) => panic!("unexpected {e:?}"),
        };
        assert!(timer.is_shutdown());
        assert!(
            timer.shutdown().is_empty(),
            "a second shutdown returns nothing"
        );
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        outcome
    });
}

/// R8 for a task already due: `add(ZERO)` (dispatched at once into the inline ready list), then
/// an `advance_to` on the same thread, race `shutdown`. The task is refused, handed back by
/// shutdown, or ran before shutdown returned: exactly one of these; nothing runs after shutdown
/// returns.
#[test]
fn shutdown_races_due_add() {
    model(&["refused", "handed back", "ran"], || {
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
        let returned = ids(&returned);
        let outcome = match added {
            Ok(h) => {
                assert_eq!(
                    runs.len() + returned.len(),
                    1,
                    "accepted: ran or handed back, once (runs {runs:?}, returned {returned:?})"
                );
                assert!(runs.iter().all(|r| *r == Run { id: 1, now_ms: 0 }));
                assert!(returned.iter().all(|&id| id == 1));
                // Dispatched at once: the handle reports it fired, whoever ends up with it.
                assert!(h.is_fired() && !h.is_cancelled() && !h.is_pending());
                assert!(!h.cancel());
                if runs.is_empty() {
                    "handed back"
                } else {
                    "ran"
                }
            }
            Err(ScheduleError::Shutdown(p)) => {
                assert_eq!(p.id, 1);
                assert!(
                    runs.is_empty() && returned.is_empty(),
                    "refused, yet ran {runs:?} or handed back {returned:?}"
                );
                "refused"
            }
            Err(e) => panic!("unexpected {e:?}"),
        };
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        outcome
    });
}

/// `shutdown` races an `advance_to` that has due tasks to run: task 1 due in the wheel, task 2
/// added when already due (so waiting in the inline ready list). Each task either ran (before
/// shutdown returned) or was handed back by shutdown; never both, never neither; nothing runs
/// after shutdown returns.
#[test]
fn shutdown_races_advance() {
    model(&["ran", "handed back"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let ready = timer.add(Duration::ZERO, probe(2, &clock, &log)).unwrap();
        let handle = timer.add(MS, probe(1, &clock, &log)).unwrap();
        set_clock(&clock, 1);

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || timer.advance_to(clock.now_ms()))
        };
        let returned = timer.shutdown();
        let runs_at_shutdown = runs(&log);
        let n = reaper.join().unwrap();

        let runs = runs(&log);
        assert_eq!(runs, runs_at_shutdown, "a task ran after shutdown returned");
        assert_eq!(n, runs.len(), "advance_to counts the runs");
        assert!(runs.iter().all(|r| r.now_ms == 1), "{runs:?}");
        let returned = ids(&returned);
        let mut all: Vec<u32> = runs
            .iter()
            .map(|r| r.id)
            .chain(returned.iter().copied())
            .collect();
        all.sort_unstable();
        assert_eq!(
            all,
            [1, 2],
            "each task ran or was handed back, exactly once (runs {runs:?}, returned {returned:?})"
        );
        let ran1 = runs.iter().any(|r| r.id == 1);
        assert_handle(&handle, ran1, false, !ran1);
        assert!(ready.is_fired() && !ready.is_pending() && !ready.cancel());
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        if ran1 {
            "ran"
        } else {
            "handed back"
        }
    });
}

/// An `add(ZERO)` (already due: dispatched at once into the inline ready list, not the wheel)
/// races an `advance_to`. The task runs exactly once: in that advance, or in the next one.
#[test]
fn zero_delay_add_races_advance() {
    model(
        &["run by the racing advance", "run by the next advance"],
        || {
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
            if a == 1 {
                "run by the racing advance"
            } else {
                "run by the next advance"
            }
        },
    );
}

/// `len()` races an advance moving a task from the wheel to its runner: it reads 1 (not yet
/// started) or 0 (started), and never 0 while the task has not started, so `len() + fired`
/// (fired read after) is at least 1. A `len()` that summed the wheel's count and the dispatched
/// count without the `moving` seqlock could fall between the two and read 0 too early.
#[test]
fn len_races_advance() {
    model(&["pending", "started"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        timer.add(MS, probe(1, &clock, &log)).unwrap();

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 1);
                timer.advance_to(clock.now_ms())
            })
        };
        let len = timer.len();
        let fired = timer.stats().fired;
        assert!(len <= 1, "len {len}");
        assert!(
            len as u64 + fired >= 1,
            "len() read 0 before the task started (fired {fired})"
        );
        assert_eq!(reaper.join().unwrap(), 1);
        assert_eq!(runs(&log), [Run { id: 1, now_ms: 1 }]);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        if len == 1 {
            "pending"
        } else {
            "started"
        }
    });
}

/// A timer with a cap of `max` pending tasks, on two shards (so two adds take different shard
/// locks and race only on the cap's counter).
fn capped(clock: &ManualClock, max: usize) -> SystemTimer<Probe> {
    Builder::<Probe>::new()
        .tick(MS)
        .wheel_size(4)
        .clock(clock.clone())
        .shards(2)
        .reaper(false)
        .inline()
        .max_pending(max)
        .build()
}

/// Two adds race for a cap's last slot: exactly one gets it, whichever.
///
/// Catches: a cap tested and then taken in two steps (both adds admitted).
#[test]
fn adds_race_for_the_last_cap_slot() {
    model(&["main won", "thread won"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(capped(&clock, 1));
        let other = {
            let (timer, clock, log) = (Arc::clone(&timer), clock.clone(), Arc::clone(&log));
            thread::spawn(move || timer.add_keyed(2 * MS, probe(2, &clock, &log)).is_ok())
        };
        let mine = timer.add_keyed(2 * MS, probe(1, &clock, &log)).is_ok();
        let theirs = other.join().unwrap();
        assert!(
            mine != theirs,
            "a cap of 1 admitted {} tasks",
            usize::from(mine) + usize::from(theirs)
        );
        assert_eq!(timer.len(), 1);
        timer.check_invariants();
        drop(timer.shutdown());
        if mine {
            "main won"
        } else {
            "thread won"
        }
    });
}

/// How a cap model's add (of probe 2), raced against a task leaving a full timer of one slot,
/// came out ("add fitted", or "add was refused" with the task handed back); then checks that
/// the slots in use are exactly the tasks pending (one more add fits exactly when none is), and
/// shuts the timer down.
fn cap_race_outcome(
    timer: &SystemTimer<Probe>,
    raced: Result<TimerKey, ScheduleError<Probe>>,
    clock: &ManualClock,
    log: &Log,
) -> &'static str {
    let outcome = match raced {
        Ok(_) => "add fitted",
        Err(ScheduleError::Full(p)) => {
            assert_eq!(p.id, 2);
            "add was refused"
        }
        Err(e) => panic!("{e:?}"),
    };
    let free = timer.is_empty();
    let more = timer.add_keyed(5 * MS, probe(3, clock, log));
    assert_eq!(more.is_ok(), free, "a slot leaked or was given twice");
    drop(more);
    timer.check_invariants();
    drop(timer.shutdown());
    outcome
}

/// A keyed cancel races an add on a full timer: the add fits exactly when the cancel's slot was
/// given back first, and afterwards the slots in use are exactly the tasks pending.
///
/// Catches: a cancel that does not give its slot back.
#[test]
fn keyed_cancel_gives_its_cap_slot_to_a_racing_add() {
    model(&["add fitted", "add was refused"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(capped(&clock, 1));
        let k = timer.add_keyed(2 * MS, probe(1, &clock, &log)).unwrap();
        let canceller = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.cancel(k))
        };
        let raced = timer.add_keyed(2 * MS, probe(2, &clock, &log));
        assert!(canceller.join().unwrap(), "nothing else removes the task");
        cap_race_outcome(&timer, raced, &clock, &log)
    });
}

/// The same race as [`keyed_cancel_gives_its_cap_slot_to_a_racing_add`], through a
/// [`TimerHandle`]: the handle's cancel (`TimerHandle::take`) gives the slot back on its own
/// path, not the keyed one's.
///
/// Catches: a winning handle cancel that does not give its slot back.
#[test]
fn handle_cancel_gives_its_cap_slot_to_a_racing_add() {
    model(&["add fitted", "add was refused"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(capped(&clock, 1));
        let h = timer.add(2 * MS, probe(1, &clock, &log)).unwrap();
        let canceller = thread::spawn(move || h.cancel());
        let raced = timer.add_keyed(2 * MS, probe(2, &clock, &log));
        assert!(canceller.join().unwrap(), "nothing else removes the task");
        cap_race_outcome(&timer, raced, &clock, &log)
    });
}

/// An advance that fires the only task of a full timer races an add. The fired task's slot is
/// given back after the wheel's locks are released (before the task runs), so the add fits or
/// is refused depending on whether it came before that; afterwards the slots in use are exactly
/// the tasks pending, and the task ran once.
///
/// Catches: an advance that does not give the slots of the tasks it took out back.
#[test]
fn a_fired_task_gives_its_cap_slot_to_a_racing_add() {
    model(&["add fitted", "add was refused"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(capped(&clock, 1));
        timer.add_keyed(MS, probe(1, &clock, &log)).unwrap();
        set_clock(&clock, 1);
        let advancer = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance())
        };
        let raced = timer.add_keyed(5 * MS, probe(2, &clock, &log));
        assert_eq!(advancer.join().unwrap(), 1, "the due task was dispatched");
        assert_eq!(runs(&log), [Run { id: 1, now_ms: 1 }]);
        cap_race_outcome(&timer, raced, &clock, &log)
    });
}

/// LOOM.md §8's skeleton, verbatim against the real API (only `.reaper(false)`: a loom build
/// runs tasks inline by itself): a user cancels while the reaper flushes the overflow bucket
/// (re-adding the entry one level down) and then reaches the entry's deadline.
#[test]
fn loom_md_skeleton_cancel_races_overflow_flush_and_expiry() {
    use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    loom::model(|| {
        let clock = ManualClock::new(0);
        let timer = Arc::new(
            SystemTimer::builder()
                .tick(Duration::from_millis(1))
                .wheel_size(4) // level 0 spans 4 ms: a 6 ms task starts in the overflow wheel
                .clock(clock.clone())
                .reaper(false) // the model drives time itself
                .build(),
        );
        let runs = Arc::new(AtomicUsize::new(0));
        let handle = {
            let runs = runs.clone();
            let task = move || {
                runs.fetch_add(1, SeqCst);
            };
            timer.add(Duration::from_millis(6), task).unwrap()
        };

        let reaper = {
            let (timer, clock) = (timer.clone(), clock.clone());
            thread::spawn(move || {
                clock.advance(Duration::from_millis(4));
                let a = timer.advance_to(clock.now_ms()); // flush overflow bucket, re-add at level 0
                clock.advance(Duration::from_millis(4));
                a + timer.advance_to(clock.now_ms()) // deadline passed: run, or skip if cancelled
            })
        };
        let cancelled = handle.cancel();
        let fired = reaper.join().unwrap();

        let ran = runs.load(SeqCst);
        assert_eq!(
            cancelled as usize + ran,
            1,
            "exactly one of cancel / run wins"
        );
        assert_eq!(fired, ran);
        assert_eq!(timer.len(), 0, "no entry left in any bucket");
        timer.check_invariants();
    });
}

/// A task run by an advance calls back into its timer (it cancels task B by key) while main
/// cancels B too. Exactly one cancel wins and B never runs. Tasks run with none of the wheel's
/// locks held (the ground rules of `timer.rs`): an advance that ran its tasks before releasing
/// the wheel's locks would deadlock here (the task's cancel takes B's shard lock, which the
/// advance holds), and loom reports it.
#[test]
fn a_running_task_cancels_another_racing_a_cancel() {
    const OUTCOMES: &[&str] = &["the running task's cancel won", "main's cancel won"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let timer: Arc<SystemTimer> = Arc::new(
            Builder::<Task>::new()
                .tick(MS)
                .wheel_size(4)
                .clock(clock.clone())
                .shards(1)
                .reaper(false)
                .inline()
                .build(),
        );
        let b_runs = Arc::new(AtomicUsize::new(0));
        let b = {
            let b_runs = Arc::clone(&b_runs);
            timer
                .add_keyed(10 * MS, move || {
                    b_runs.fetch_add(1, SeqCst);
                })
                .unwrap()
        };
        let task_won = Arc::new(AtomicBool::new(false));
        let a = {
            let (t, won) = (Arc::clone(&timer), Arc::clone(&task_won));
            timer
                .add(2 * MS, move || won.store(t.cancel(b), SeqCst))
                .unwrap()
        };

        let reaper = {
            let (timer, clock) = (Arc::clone(&timer), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 2);
                timer.advance_to(clock.now_ms())
            })
        };
        let main_won = timer.cancel(b);
        let ran = reaper.join().unwrap();

        let task_won = task_won.load(SeqCst);
        assert_eq!(ran, 1, "the advance ran task A");
        assert!(a.is_fired());
        assert_eq!(
            usize::from(task_won) + usize::from(main_won),
            1,
            "exactly one cancel wins (task {task_won}, main {main_won})"
        );
        set_clock(&clock, 20);
        assert_eq!(
            timer.advance_to(clock.now_ms()),
            0,
            "B ran after a cancel won"
        );
        assert_eq!(b_runs.load(SeqCst), 0);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        if task_won {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// The reaper's sleep/wake handshake (`parker.rs`) with an add. The clock is at 5 ms but the
/// wheel was never advanced, so a task with deadline 3 ms goes into a bucket that is due
/// already, and the add unparks the reaper (the bucket is the earliest). The reaper's turn
/// (`reaper_step`, the body of its loop) either finds the bucket at its look and runs the task,
/// or finds nothing queued and sleeps with no timeout: the add's unpark must then end that sleep
/// (an unpark between the look and the sleep leaves the permit, which makes the sleep return at
/// once), and the next turn runs the task. A lost wake-up leaves the reaper asleep for ever,
/// which loom reports as a deadlock.
#[test]
fn add_wakes_the_sleeping_reaper() {
    model(&["found at its look", "woken by the add"], || {
        reaper_woken_by_an_add(5, |timer, task| timer.add_at(3 * MS, task).unwrap())
    });
}

/// The body of the models of an add waking the sleeping reaper: with the clock at `now_ms`, a
/// reaper thread takes its turns (`reaper_step`) while this thread adds task 1 with `add`; the
/// reaper runs the task at its first turn ("found at its look") or at its second, after the
/// add's unpark ended its sleep ("woken by the add"). Checks that the task ran once, at
/// `now_ms`, and that nothing is left.
fn reaper_woken_by_an_add(
    now_ms: u64,
    add: impl FnOnce(&SystemTimer<Probe>, Probe) -> TimerHandle<Probe>,
) -> &'static str {
    let clock = ManualClock::new(0);
    let log = new_log();
    let timer = Arc::new(timer(&clock, 4));
    set_clock(&clock, now_ms);

    let reaper = {
        let timer = Arc::clone(&timer);
        thread::spawn(move || {
            if timer.reaper_step() == Some(1) {
                return "found at its look";
            }
            assert_eq!(timer.reaper_step(), Some(1), "woken: the next turn runs it");
            "woken by the add"
        })
    };
    let h = add(&timer, probe(1, &clock, &log));
    let outcome = reaper.join().unwrap();

    assert_eq!(runs(&log), [Run { id: 1, now_ms }]);
    assert_handle(&h, true, false, false);
    assert_eq!(timer.len(), 0);
    timer.check_invariants();
    outcome
}

/// The reaper's sleep/wake handshake with a task already due when added: the clock and the
/// wheel's time are both at 0 ms, so the wheel refuses `add(ZERO)` (its time has come) and the
/// task goes straight to the inline ready list (`dispatch_now`), with nothing queued in the
/// wheel; only the add's own `unpark` tells the reaper. The reaper's turn (`reaper_step`) either
/// finds the task waiting at its look (`has_ready`) and runs it, or finds nothing and sleeps
/// with no timeout: the add's unpark must end that sleep (an unpark between the look and the
/// sleep leaves the permit, which makes the sleep return at once), and the next turn runs the
/// task. A lost wake-up leaves the reaper asleep for ever with the task waiting, which loom
/// reports as a deadlock. ([`add_wakes_the_sleeping_reaper`] is the same handshake for a task
/// that goes into a due bucket: the wheel's `earliest` unpark, not this one.)
///
/// Catches: `dispatch_now` (inline) queueing the task without unparking the reaper.
#[test]
fn a_task_due_at_add_wakes_the_sleeping_reaper() {
    model(&["found at its look", "woken by the add"], || {
        reaper_woken_by_an_add(0, |timer, task| timer.add(Duration::ZERO, task).unwrap())
    });
}

/// The reaper's shutdown handshake: the reaper runs its loop (`reaper_step` until it returns
/// `None`) with nothing queued, so it sleeps with no timeout, while `shutdown` sets `stopping`
/// and wakes it. The reaper either sees `stopping` at its first look, or sleeps (or is about to)
/// and the shutdown's unpark ends that sleep, and its next turn sees `stopping`. A lost wake-up
/// leaves the reaper asleep for ever (a real shutdown would then wait for ever to join it),
/// which loom reports as a deadlock.
#[test]
fn shutdown_wakes_the_sleeping_reaper() {
    model(
        &["stopped at its first look", "woken by the shutdown"],
        || {
            let clock = ManualClock::new(0);
            let timer = Arc::new(timer(&clock, 4));

            let reaper = {
                let timer = Arc::clone(&timer);
                thread::spawn(move || {
                    let mut turns = 0;
                    while timer.reaper_step().is_some() {
                        turns += 1;
                    }
                    turns
                })
            };
            let returned = timer.shutdown();
            let turns = reaper.join().unwrap();

            assert!(returned.is_empty(), "nothing was scheduled: {returned:?}");
            assert!(timer.is_shutdown());
            assert_eq!(timer.reaper_step(), None, "stopped for good");
            timer.check_invariants();
            if turns == 0 {
                "stopped at its first look"
            } else {
                "woken by the shutdown"
            }
        },
    );
}

/// Shutdown's wait for the advances in flight (`wait_idle`) and the wake-up that ends it. An
/// inline advance has taken task 1 out of the wheel and runs it, so `running` stays raised
/// until the task returns; the task ([`Meet`]) blocks until main, about to shut down, marks "0"
/// on the board. Then the advance ends while `shutdown` closes the wheel and waits for
/// `running` to drop to zero. Its look at `running` finds 0 (the advance has ended), or finds
/// the advance in flight and parks: the advance that brings `running` to zero must then see
/// `stopping` and unpark it, and an unpark that lands between the look and the park must leave
/// a permit that makes the park return at once. The decrement and the `stopping` swap are
/// stores to different atomics, each followed by a load of the other's: without a SeqCst fence
/// on both sides, both loads may read the old values (store buffering), the advance skips its
/// unpark and shutdown parks. Loom explores those stale reads; it orders SeqCst fences (each
/// happens after every earlier one), so with both fences one load sees the other's store. A
/// lost wake-up leaves shutdown asleep for ever (under loom its timed park is a plain wait),
/// which loom reports as a deadlock. Which way shutdown's look went is not visible from outside,
/// hence the one outcome; each mutation below makes it deadlock.
///
/// Catches: the last advance in flight not unparking (the `unpark` after `fence(SeqCst)` at the
/// end of `advance_to_ns_then`); `wait_idle`'s `fence(SeqCst)` removed; `Parker::park`
/// sleeping although a permit is pending (the unpark before the park is lost).
#[test]
fn the_last_advance_in_flight_wakes_shutdowns_wait() {
    model(&["ran"], || {
        let clock = ManualClock::new(0);
        let board = Arc::new(Board::default());
        let timer = Arc::new(builder::<Meet>(&clock, 4).build());
        let task = Meet {
            id: 1,
            after: Some(0),
            board: Arc::clone(&board),
        };
        timer.add(MS, task).unwrap();
        set_clock(&clock, 1);

        let advancer = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance())
        };
        // Task 1 has started: the advance is in flight. Let it return, and shut down.
        assert_eq!(board.wait_for(1), [1]);
        {
            let mut started = board.started.lock().unwrap();
            started.push(0);
            board.cv.notify_all();
        }
        let returned = timer.shutdown();
        let n = advancer.join().unwrap();

        assert!(returned.is_empty(), "task 1 ran: {returned:?}");
        assert_eq!(n, 1, "the advance ran task 1");
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        "ran"
    });
}

/// Two shutdowns race (an explicit one and the drop of a last reference, say). The timer holds
/// a task in the wheel (not due) and one that was due when added (waiting in the inline ready
/// list). The call that sets `stopping` first (a swap) does the whole shutdown and hands both
/// back; the other returns nothing. Each task comes back exactly once, and both from the same
/// call: a shutdown that split the `stopping` swap into a load and a store would let both calls
/// run the shutdown, one closing the wheel and the other the ready list.
#[test]
fn concurrent_shutdowns_hand_back_once() {
    model(&["main's shutdown", "thread's shutdown"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        let ready = timer.add(Duration::ZERO, probe(1, &clock, &log)).unwrap();
        let pending = timer.add(2 * MS, probe(2, &clock, &log)).unwrap();

        let other = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || ids(&timer.shutdown()))
        };
        let mine = ids(&timer.shutdown());
        let theirs = other.join().unwrap();

        assert!(
            mine.is_empty() || theirs.is_empty(),
            "both shutdowns handed tasks back: main {mine:?}, thread {theirs:?}"
        );
        let mut all = [mine.as_slice(), theirs.as_slice()].concat();
        all.sort_unstable();
        assert_eq!(all, [1, 2], "main {mine:?}, thread {theirs:?}");
        assert!(runs(&log).is_empty());
        assert_handle(&pending, false, false, true);
        assert!(ready.is_fired() && !ready.is_pending() && !ready.cancel());
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        if mine.is_empty() {
            "thread's shutdown"
        } else {
            "main's shutdown"
        }
    });
}

// ===== The grace path: callers of `advance_if_due` advance for a sleeping reaper =====

/// The grace of [`grace_timer`]: the reaper's alarm is set this long past the earliest bucket.
const GRACE: Duration = Duration::from_millis(2);

/// How long past a bucket's expiration its help is published (the crate's `HELP_MARGIN_NS`).
const HELP_MARGIN: Duration = Duration::from_micros(25);

/// [`timer`] with a reaper grace of [`GRACE`] (wheel size 8): a thread playing the reaper with
/// `reaper_step` publishes the earliest bucket's time for callers of `advance_if_due`
/// (`help_at_ns`) and sleeps on its alarm until `GRACE` past it (under loom, the parker records
/// the alarm instead of arming a timerfd, and the reaper sleeps until an `unpark` fires it).
fn grace_timer(clock: &ManualClock) -> SystemTimer<Probe> {
    builder(clock, 8).reaper_grace(GRACE).build()
}

/// The reaper sleeps for nothing later than the earliest queued bucket (or a task waiting in
/// the inline ready list: `next_expiration` is then the clock's time) plus the grace, and
/// publishes that bucket's time for helpers, not later (nor an earlier time, already due, that
/// would make the next caller of `advance_if_due` claim an empty advance).
fn assert_sleeps_for_the_earliest(timer: &SystemTimer<Probe>) {
    let s = timer.sleeping_reaper();
    let next = timer.next_expiration().expect("a bucket is queued");
    let alarm = s.alarm.expect("a bucket is queued: the alarm is set");
    assert!(
        alarm <= next + GRACE,
        "the reaper sleeps through the bucket at {next:?}: alarm at {alarm:?}"
    );
    let help_at = s.help_at.expect("a bucket is queued: help is wanted");
    assert!(
        help_at <= next + HELP_MARGIN,
        "help for the bucket at {next:?} published for {help_at:?}"
    );
    assert!(
        help_at > timer.now(),
        "a due help time is published ({help_at:?} at {:?}): the next caller claims an empty advance",
        timer.now()
    );
}

/// Sets up a reaper asleep on its alarm: tasks 1 (deadline 1 ms) and 2 (6 ms) queued at 0 ms,
/// the reaper (a spawned thread running `reaper_step` until shutdown) sleeps until 1 ms + grace
/// with help published from 1 ms + margin; then the clock moves to 2 ms without waking it (the
/// system clock does not wake the reaper; under loom the manual clock does not either). Returns
/// the reaper thread (it returns how many tasks it ran) and the two handles.
fn reaper_asleep_past_a_due_bucket(
    clock: &ManualClock,
    log: &Log,
    timer: &Arc<SystemTimer<Probe>>,
) -> (
    thread::JoinHandle<usize>,
    TimerHandle<Probe>,
    TimerHandle<Probe>,
) {
    let a = timer.add_at(MS, probe(1, clock, log)).unwrap();
    let b = timer.add_at(6 * MS, probe(2, clock, log)).unwrap();
    let reaper = {
        let timer = Arc::clone(timer);
        thread::spawn(move || {
            let mut ran = 0;
            while let Some(n) = timer.reaper_step() {
                ran += n;
            }
            ran
        })
    };
    let s = timer.sleeping_reaper();
    assert_eq!(s.alarm, Some(MS + GRACE), "{s:?}");
    assert_eq!(s.help_at, Some(MS + HELP_MARGIN), "{s:?}");
    set_clock(clock, 2);
    (reaper, a, b)
}

/// An add that queues a bucket earlier than every other races a helper's advance and rearm. The
/// reaper sleeps until 1 ms + grace, help published from 1 ms; at 2 ms a caller of
/// `advance_if_due` claims it, advances (running task 1), reads the next bucket (6 ms) and moves
/// the reaper's alarm to 6 ms + grace, while main adds task 3 at 3 ms. If the add lands after
/// the helper's advance, its bucket is the earliest and the add unparks the reaper, which
/// publishes and sets its alarm from a fresh reading; a rearm from the helper's older reading
/// must then not move them past 3 ms (`Parker::rearm`'s epoch check). Once all is quiet and the
/// reaper sleeps, its alarm is at most 3 ms + grace and help is published from at most 3 ms +
/// margin: task 3 is never slept through.
///
/// Catches: the epoch check removed from `rearm`; the helper's epoch read moved after its
/// reading of the wheel; the helper's publication of `help_at_ns` moved out of `rearm` (after
/// it, unconditionally).
#[test]
fn an_earlier_bucket_added_races_a_helpers_rearm() {
    model(
        &["added before the helper's advance", "unparked the reaper"],
        || {
            let clock = ManualClock::new(0);
            let log = new_log();
            let timer = Arc::new(grace_timer(&clock));
            let (reaper, a, b) = reaper_asleep_past_a_due_bucket(&clock, &log, &timer);

            let helper = {
                let timer = Arc::clone(&timer);
                thread::spawn(move || timer.advance_if_due())
            };
            let c = timer.add_at(3 * MS, probe(3, &clock, &log)).unwrap();
            assert_eq!(
                helper.join().unwrap(),
                1,
                "the helper claims and runs task 1"
            );

            assert_sleeps_for_the_earliest(&timer);
            assert_eq!(timer.next_expiration(), Some(3 * MS));
            let stats = timer.stats();
            assert_eq!(stats.caller_advances, 1);
            let outcome = if stats.reaper_wakeups == 0 {
                "added before the helper's advance"
            } else {
                "unparked the reaper"
            };

            let mut returned = ids(&timer.shutdown());
            returned.sort_unstable();
            assert_eq!(returned, [2, 3]);
            assert_eq!(reaper.join().unwrap(), 0, "the helper ran task 1");
            assert_eq!(runs(&log), [Run { id: 1, now_ms: 2 }]);
            assert_handle(&a, true, false, false);
            assert_handle(&b, false, false, true);
            assert_handle(&c, false, false, true);
            timer.check_invariants();
            outcome
        },
    );
}

/// An add of a task already due (deadline 2 ms, the clock's time) races a helper's advance and
/// rearm. The reaper sleeps until 1 ms + grace; at 2 ms a caller of `advance_if_due` claims the
/// help, advances (running task 1), reads the next bucket (6 ms) and moves the alarm to 6 ms +
/// grace. If the add lands before that advance, the task goes into the 2 ms bucket and the
/// helper runs it too; after it, the wheel refuses it (its time has passed) and it waits in the
/// inline ready list, and the add unparks the reaper to run it. That `unpark` leaves nothing in
/// the wheel for the helper's reading to see: a rearm after it, while its permit is pending,
/// would move the alarm the `unpark` fired back to 6 ms + grace and the reaper would sleep with
/// the task waiting (`Parker::rearm`'s permit check). Once all is quiet and the reaper sleeps,
/// both tasks have run, each once, and the reaper sleeps for the 6 ms bucket.
///
/// Catches: the pending-permit check (`*n`) removed from `rearm`.
#[test]
fn a_due_add_races_a_helpers_rearm() {
    model(&["run by the helper", "run by the woken reaper"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(grace_timer(&clock));
        let (reaper, a, b) = reaper_asleep_past_a_due_bucket(&clock, &log, &timer);

        let helper = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_if_due())
        };
        let d = timer.add(Duration::ZERO, probe(3, &clock, &log)).unwrap();
        let helped = helper.join().unwrap();

        assert_sleeps_for_the_earliest(&timer);
        assert_eq!(timer.next_expiration(), Some(6 * MS));
        let mut ran = runs(&log);
        ran.sort_unstable_by_key(|r| r.id);
        assert_eq!(
            ran,
            [Run { id: 1, now_ms: 2 }, Run { id: 3, now_ms: 2 }],
            "every due task ran once before the reaper slept"
        );
        assert_eq!(timer.stats().caller_advances, 1);

        assert_eq!(ids(&timer.shutdown()), [2]);
        let reaped = reaper.join().unwrap();
        assert_eq!(helped + reaped, 2, "helper {helped}, reaper {reaped}");
        assert_handle(&a, true, false, false);
        assert_handle(&b, false, false, true);
        assert!(d.is_fired() && !d.is_pending() && !d.cancel());
        timer.check_invariants();
        if helped == 2 {
            "run by the helper"
        } else {
            "run by the woken reaper"
        }
    });
}

/// Sets up help due at 2 ms with no reaper thread: tasks 1 (deadline 1 ms) and 2 (6 ms) queued
/// at 0 ms, one turn of the reaper on this thread publishes help from 1 ms + margin (the add's
/// wake-up pending, it does not sleep), then the clock moves to 2 ms. Returns the two handles.
fn help_due_at_2ms(
    clock: &ManualClock,
    log: &Log,
    timer: &SystemTimer<Probe>,
) -> (TimerHandle<Probe>, TimerHandle<Probe>) {
    let a = timer.add_at(MS, probe(1, clock, log)).unwrap();
    let b = timer.add_at(6 * MS, probe(2, clock, log)).unwrap();
    assert_eq!(timer.reaper_step(), Some(0), "published, and did not sleep");
    set_clock(clock, 2);
    (a, b)
}

/// Two callers of `advance_if_due` race for one publication of help (the reaper's, for the 1 ms
/// bucket, due at 2 ms). Exactly one claims it (the compare-and-swap) and advances, running task
/// 1 once; the other returns 0 without advancing. The winner publishes the next bucket's time
/// (6 ms + margin): a call at 2 ms finds nothing to claim, and one at 7 ms claims it and runs
/// task 2, once.
///
/// Catches: the claim's compare-and-swap split into a load and a store (both callers advance).
#[test]
fn helpers_race_for_one_claim() {
    model(&["main claimed", "thread claimed"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(grace_timer(&clock));
        let (a, b) = help_due_at_2ms(&clock, &log, &timer);

        let other = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_if_due())
        };
        let mine = timer.advance_if_due();
        let theirs = other.join().unwrap();

        assert_eq!(mine + theirs, 1, "main {mine}, thread {theirs}");
        assert_eq!(timer.stats().caller_advances, 1, "one advance per claim");
        assert_eq!(runs(&log), [Run { id: 1, now_ms: 2 }]);
        assert_eq!(timer.advance_if_due(), 0, "no help due before 6 ms");
        set_clock(&clock, 7);
        assert_eq!(timer.advance_if_due(), 1, "help for 6 ms was published");
        assert_eq!(timer.stats().caller_advances, 2);
        assert_eq!(
            runs(&log),
            [Run { id: 1, now_ms: 2 }, Run { id: 2, now_ms: 7 }]
        );
        assert_handle(&a, true, false, false);
        assert_handle(&b, true, false, false);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        if mine == 1 {
            "main claimed"
        } else {
            "thread claimed"
        }
    });
}

/// A caller of `advance_if_due` races the reaper's own turn (its alarm fired, say) over a due
/// bucket: help is published for the 1 ms bucket, the clock is at 2 ms, and the reaper (a
/// thread running `reaper_step` until shutdown) and a helper both advance. Task 1 runs exactly
/// once, by either; the helper claims at most once. Once all is quiet and the reaper sleeps, it
/// sleeps for the 6 ms bucket (alarm at most 6 ms + grace, help published from at most 6 ms +
/// margin and not from a time already due, which the next caller would claim for nothing).
///
/// Catches: the helper reading the next bucket before its advance (it republishes help for
/// the bucket just advanced, already due).
#[test]
fn a_helper_races_the_reapers_own_turn() {
    model(&["the helper ran it", "the reaper ran it"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(grace_timer(&clock));
        let (a, b) = help_due_at_2ms(&clock, &log, &timer);

        let reaper = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || {
                let mut ran = 0;
                while let Some(n) = timer.reaper_step() {
                    ran += n;
                }
                ran
            })
        };
        let helper = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_if_due())
        };
        let helped = helper.join().unwrap();

        assert_sleeps_for_the_earliest(&timer);
        assert_eq!(timer.next_expiration(), Some(6 * MS));
        assert_eq!(runs(&log), [Run { id: 1, now_ms: 2 }]);
        assert!(timer.stats().caller_advances <= 1);

        assert_eq!(ids(&timer.shutdown()), [2]);
        let reaped = reaper.join().unwrap();
        assert_eq!(helped + reaped, 1, "helper {helped}, reaper {reaped}");
        assert_handle(&a, true, false, false);
        assert_handle(&b, false, false, true);
        timer.check_invariants();
        if helped == 1 {
            "the helper ran it"
        } else {
            "the reaper ran it"
        }
    });
}

// ===== The executors: batches over the channel, idle executors asleep on the semaphore =====

/// What the executor models' tasks ([`Meet`]) write: the ids of the tasks that started, in the
/// order they started, and a condvar to wait for one.
#[derive(Default)]
struct Board {
    started: Mutex<Vec<u32>>,
    cv: loom::sync::Condvar,
}

impl Board {
    /// Waits until `n` tasks have started; returns their ids in the order they started. Blocks
    /// on a loom condvar: if no executor will ever run them, loom reports a deadlock.
    fn wait_for(&self, n: usize) -> Vec<u32> {
        let mut s = self.started.lock().unwrap();
        while s.len() < n {
            s = self.cv.wait(s).unwrap();
        }
        s.clone()
    }
}

/// A task of the executor models: notes its start on the [`Board`], then, with `after`, blocks
/// its executor until task `after` has started (so that only another executor can run it).
struct Meet {
    id: u32,
    after: Option<u32>,
    board: Arc<Board>,
}

impl TimerTask for Meet {
    fn run(self) {
        let mut s = self.board.started.lock().unwrap();
        s.push(self.id);
        self.board.cv.notify_all();
        if let Some(other) = self.after {
            while !s.contains(&other) {
                s = self.board.cv.wait(s).unwrap();
            }
        }
    }
}

impl fmt::Debug for Meet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Meet({})", self.id)
    }
}

/// A timer in executor mode (tick 1 ms, wheel size 8, one shard, no reaper): due tasks go over
/// the channel to `executors` executor threads, started by `build` as loom threads (the hidden
/// `model_executors`), which the timer's shutdown wakes and joins.
fn executor_timer<T: TimerTask>(clock: &ManualClock, executors: usize) -> SystemTimer<T> {
    Builder::<T>::new()
        .tick(MS)
        .wheel_size(8)
        .clock(clock.clone())
        .shards(1)
        .reaper(false)
        .executor_threads(executors)
        .model_executors()
        .build()
}

/// The dispatcher's hand-off to idle executors (`reaper.rs`: the semaphore, `executor_loop`):
/// two tasks due in one advance go out as two batches to two executors, each batch followed by
/// a permit. Each task blocks its executor until the other has started, so both must run at
/// once (whichever batch an executor takes first):
/// each batch must wake an idle executor, and an executor that took a batch must not also take
/// the permit sent with the other (which would leave the other executor asleep while a batch
/// waits). A permit released between an executor's empty look at the channel and its sleep must
/// end that sleep. Any of these lost leaves an executor asleep with a batch waiting, and loom
/// reports a deadlock. Then a shutdown with both executors idle (asleep or about to be) wakes
/// and joins them, and hands back nothing.
///
/// Catches: the permits released before the batches are sent; an executor that received a
/// batch taking a permit although it holds the one it slept for; `release(n)` waking one
/// sleeper instead of `n`; `acquire` rechecking the count with `if` instead of `while` (a
/// permit taken by another executor in between: the count underflows); shutdown joining the
/// executors without waking them.
#[test]
fn each_batch_wakes_an_idle_executor() {
    // Three executors' worth of threads: at 4 preemptions, 130 000 executions (about 30 s).
    model_bounded(Some(3), &["1 started first", "2 started first"], || {
        let clock = ManualClock::new(0);
        let board = Arc::new(Board::default());
        let timer = executor_timer::<Meet>(&clock, 2);
        for (id, after) in [(1, Some(2)), (2, Some(1))] {
            let board = Arc::clone(&board);
            timer.add(MS, Meet { id, after, board }).unwrap();
        }
        set_clock(&clock, 1);
        assert_eq!(timer.advance(), 2);

        let started = board.wait_for(2);
        // The shutdown's interleavings are not explored (`shutdown_races_executor_dispatch`
        // models them): with both tasks started, every execution ends the same way. (Not the
        // setup's: an executor asleep before the advance is the state that matters.)
        loom::stop_exploring();
        assert!(timer.shutdown().is_empty());
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        assert_eq!(timer.stats().fired, 2);
        if started == [1, 2] {
            "1 started first"
        } else {
            "2 started first"
        }
    });
}

/// A task already due when added is sent to the executors at once, from the adding thread, with
/// a permit (`dispatch_now`), while the only executor looks at the channel and goes to sleep:
/// the task runs, without any advance. A permit lost, or released before the task is sent, leaves
/// the executor asleep with the task waiting, and loom reports a deadlock.
///
/// Catches: `dispatch_now` not releasing a permit, or releasing it before the send.
#[test]
fn a_due_add_wakes_an_idle_executor() {
    model(&["ran"], || {
        let clock = ManualClock::new(0);
        let board = Arc::new(Board::default());
        let timer = executor_timer::<Meet>(&clock, 1);
        let board2 = Arc::clone(&board);
        timer
            .add(
                Duration::ZERO,
                Meet {
                    id: 1,
                    after: None,
                    board: board2,
                },
            )
            .unwrap();
        assert_eq!(board.wait_for(1), [1]);
        assert!(timer.shutdown().is_empty());
        timer.check_invariants();
        "ran"
    });
}

/// What became of a task in [`shutdown_races_executor_dispatch`].
fn fate(id: u32, ran: &[Run], returned: &[u32], refused: &[u32]) -> &'static str {
    let ran = ran.iter().filter(|r| r.id == id).count();
    let returned = returned.iter().filter(|&&r| r == id).count();
    let refused = refused.iter().filter(|&&r| r == id).count();
    match (ran, returned, refused) {
        (1, 0, 0) => "ran",
        (0, 1, 0) => "handed back",
        (0, 0, 1) => "refused",
        _ => panic!("task {id}: ran {ran}, handed back {returned}, refused {refused} times"),
    }
}

/// `shutdown` races the executor path. `due_add` false: main advances the wheel past task 1,
/// which goes to the one executor as a batch; true: main adds task 1 already due, which goes to
/// it at once (`dispatch_now`). Meanwhile a thread shuts the timer down: it closes the wheel and
/// the dispatch, then wakes the executor, which hands back every job it receives once
/// `stopping` is set, drains the channel and is joined. The task ends exactly one way: ran
/// (before `shutdown` returned), handed back by `shutdown` (from the wheel, or by the
/// executor), or refused by its `add`. Nothing runs after `shutdown` returns, and the shutdown
/// returns (the executor is woken, never left asleep).
fn shutdown_races_executor_dispatch(
    due_add: bool,
    bound: Option<usize>,
    expected: &'static [&'static str],
) {
    model_bounded(bound, expected, move || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(executor_timer::<Probe>(&clock, 1));
        if !due_add {
            timer.add(MS, probe(1, &clock, &log)).unwrap();
            set_clock(&clock, 1);
        }

        let stopper = {
            let (timer, log) = (Arc::clone(&timer), Arc::clone(&log));
            thread::spawn(move || {
                let returned = ids(&timer.shutdown());
                (returned, runs(&log).len())
            })
        };
        let mut refused = vec![];
        if due_add {
            match timer.add(Duration::ZERO, probe(1, &clock, &log)) {
                Ok(_) => {}
                Err(ScheduleError::Shutdown(task)) => refused.push(task.id),
                Err(e) => panic!("{e:?}"),
            }
        } else {
            timer.advance();
        }
        let (returned, ran_by_return) = stopper.join().unwrap();

        let ran = runs(&log);
        assert_eq!(
            ran.len(),
            ran_by_return,
            "a task ran after shutdown returned"
        );
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        fate(1, &ran, &returned, &refused)
    });
}

/// [`shutdown_races_executor_dispatch`] for a task the advance sends to the executor.
///
/// Catches: the executors joined without a permit each (asleep for ever: a deadlock); the
/// executors joined before the dispatch is closed (they never see the channel disconnected: a
/// deadlock); the executors' hand-backs collected before the executors are joined (a task
/// handed back after is lost).
#[test]
fn shutdown_races_an_advance_to_the_executors() {
    // At 4 preemptions, 164 000 executions (about 30 s).
    shutdown_races_executor_dispatch(false, Some(3), &["handed back", "ran"]);
}

/// [`shutdown_races_executor_dispatch`] for a task already due when added, sent to the
/// executor at once.
///
/// Catches: as [`shutdown_races_an_advance_to_the_executors`]; and an executor that runs the
/// jobs it receives once `stopping` is set instead of handing them back (here only the
/// executor can hand the task back: "handed back" is never reached).
#[test]
fn shutdown_races_a_due_add_to_the_executors() {
    shutdown_races_executor_dispatch(true, None, &["handed back", "ran", "refused"]);
}

/// Two shutdowns race while the one executor holds a due task (the advance before them sent
/// it). The call that loses the `stopping` swap returns nothing, but only once the winner has
/// finished (`Finished`: the executor joined): the task has run, or been handed back by the
/// winner, before either call returns, and nothing runs after.
///
/// Catches: the losing call returning at once (the task then runs after it returned); the
/// winner's `Finished::set` left out (the loser waits for ever: a deadlock).
#[test]
fn a_losing_shutdown_waits_for_the_winner() {
    model(&["ran", "handed back"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(executor_timer::<Probe>(&clock, 1));
        timer.add(MS, probe(1, &clock, &log)).unwrap();
        set_clock(&clock, 1);
        timer.advance();

        let shut =
            |timer: &SystemTimer<Probe>, log: &Log| (ids(&timer.shutdown()), runs(log).len());
        let other = {
            let (timer, log) = (Arc::clone(&timer), Arc::clone(&log));
            thread::spawn(move || shut(&timer, &log))
        };
        let (mine, mine_ran) = shut(&timer, &log);
        let (theirs, theirs_ran) = other.join().unwrap();

        let ran = runs(&log);
        assert_eq!(
            (mine_ran, theirs_ran),
            (ran.len(), ran.len()),
            "a task ran after a shutdown returned"
        );
        assert!(mine.is_empty() || theirs.is_empty(), "both handed back");
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        fate(1, &ran, &[mine, theirs].concat(), &[])
    });
}

/// A [`Probe`] that counts itself gone when dropped: after its run, or unrun (handed back and
/// dropped by a background shutdown).
struct Counted {
    probe: Option<Probe>,
    gone: Arc<AtomicUsize>,
}

impl TimerTask for Counted {
    fn run(mut self) {
        if let Some(p) = self.probe.take() {
            p.run();
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.gone.fetch_add(1, SeqCst);
    }
}

impl fmt::Debug for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counted({:?})", self.probe)
    }
}

/// `shutdown_in_background` races an advance that sends task 1 to the one executor; task 2
/// waits in the wheel. The call closes the wheel before it returns (an add after it is refused)
/// and a thread of its own finishes the shutdown: joins the executor once its task has returned
/// and drops the tasks that never ran. A `shutdown` after it returns once that thread has
/// finished, and no task runs after. Each task is gone exactly once: task 1 ran or was dropped
/// unrun, task 2 dropped unrun; none is kept (main waits for both to be gone: a lost one hangs
/// it, which loom reports).
///
/// Catches: the wheel closed by the background thread instead of before the call returns (the
/// add after it is accepted); the tasks the shutdown took never dropped (main waits for ever);
/// the background thread not setting `Finished` (the later `shutdown` waits for ever); a task
/// run after the later `shutdown` returned.
#[test]
fn a_background_shutdown_races_an_advance_to_the_executors() {
    model_bounded(Some(3), &["ran", "dropped unrun"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let gone = Arc::new(AtomicUsize::new(0));
        let counted = |id| Counted {
            probe: Some(probe(id, &clock, &log)),
            gone: Arc::clone(&gone),
        };
        let timer = Arc::new(executor_timer::<Counted>(&clock, 1));
        timer.add(MS, counted(1)).unwrap();
        timer.add(5 * MS, counted(2)).unwrap();
        set_clock(&clock, 1);

        let advancer = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance())
        };
        timer.shutdown_in_background();
        match timer.add(5 * MS, counted(3)) {
            Err(ScheduleError::Shutdown(_)) => {}
            other => panic!("an add after shutdown_in_background returned: {other:?}"),
        }
        assert!(
            timer.shutdown().is_empty(),
            "the background shutdown took them"
        );
        let ran_by_return = runs(&log);
        advancer.join().unwrap();
        // Tasks 1 and 2, and the refused task 3.
        while gone.load(SeqCst) < 3 {
            thread::yield_now();
        }

        let ran = runs(&log);
        assert_eq!(ran, ran_by_return, "a task ran after shutdown returned");
        assert!(ran.iter().all(|r| r.id == 1), "{ran:?}");
        match ran.len() {
            0 => "dropped unrun",
            1 => "ran",
            n => panic!("task 1 ran {n} times"),
        }
    });
}

// ===== `advance_clock`: callers who run no reaper sleep on the parker's epoch =====

/// `advance_clock` (Kafka's `advanceClock(timeout)`) reads the parker's epoch before it looks at
/// the wheel, and sleeps (`Parker::park_since`) only while no `unpark` came since. The clock is
/// at 5 ms and the wheel was never advanced, so a task with deadline 3 ms goes into a bucket
/// that is due already, and the add unparks (the bucket is the earliest). A thread in
/// `advance_clock(100 ms)` either finds the bucket at a look and runs it, or sleeps and the
/// add's unpark ends that sleep: either way it returns true, the task having run once. A
/// wake-up lost between its reading of the epoch and its sleep leaves it asleep for ever (under
/// loom a timed wait is a plain wait; the manual clock does not move), which loom reports as a
/// deadlock.
///
/// Catches: the epoch read after the look at the wheel; `park_since` sleeping without
/// comparing the epoch; `unpark` not bumping the epoch.
#[test]
fn a_due_add_wakes_advance_clock() {
    model(&["ran"], || {
        let clock = ManualClock::new(0);
        let log = new_log();
        let timer = Arc::new(timer(&clock, 4));
        set_clock(&clock, 5);

        let caller = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(100 * MS))
        };
        let h = timer.add_at(3 * MS, probe(1, &clock, &log)).unwrap();
        assert!(caller.join().unwrap(), "advance_clock ran the task");

        assert_eq!(runs(&log), [Run { id: 1, now_ms: 5 }]);
        assert_handle(&h, true, false, false);
        assert_eq!(timer.len(), 0);
        timer.check_invariants();
        "ran"
    });
}

/// Two threads in `advance_clock` with nothing queued (each asleep in `park_since`, or about to
/// be) while `shutdown` sets `stopping` and unparks: both return false. The unpark must wake
/// every sleeper (`notify_all`: any number of `advance_clock` callers, and the reaper, share the
/// condvar), and a caller that read the epoch before the unpark and looks at `stopping` after
/// it must not sleep. A caller left asleep is reported by loom as a deadlock.
///
/// Catches: `unpark` waking one sleeper (`notify_one`); `advance_clock` reading the epoch
/// after its look at `stopping`; `park_since` sleeping without comparing the epoch.
#[test]
fn shutdown_wakes_every_advance_clock_caller() {
    model(&["stopped"], || {
        let clock = ManualClock::new(0);
        let timer = Arc::new(timer(&clock, 4));

        let callers: Vec<_> = (0..2)
            .map(|_| {
                let timer = Arc::clone(&timer);
                thread::spawn(move || timer.advance_clock(100 * MS))
            })
            .collect();
        assert!(timer.shutdown().is_empty());
        for c in callers {
            assert!(!c.join().unwrap(), "nothing ran");
        }
        assert!(!timer.advance_clock(100 * MS), "stopped for good");
        timer.check_invariants();
        "stopped"
    });
}
