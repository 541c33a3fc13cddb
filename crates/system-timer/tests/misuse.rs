//! Call sequences a user could plausibly write that once hung, lost work or returned too early:
//! calls into a timer from inside one of its own tasks, on a thread that is not one of the
//! timer's, and shutdowns that overlap.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use system_timer::{ManualClock, SystemTimer};

/// Runs `f` on a thread of its own and fails if it has not returned within 20 s (a hang: the
/// thread is leaked, the test process ends anyway).
fn within_20s<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: hung"))
}

/// A task run inline by a caller's `advance()` (a timer driven by hand, no reaper) shuts its
/// own timer down. The shutdown cannot wait for the advance it runs in (the task is part of
/// it). Before, it waited for that advance to finish, for ever: a hang on the caller's thread.
#[test]
fn shutdown_from_an_inline_task_run_by_a_callers_advance_does_not_hang() {
    let result = within_20s("shutdown inside advance", || {
        let clock = ManualClock::new(0);
        let timer = Arc::new(
            SystemTimer::builder()
                .clock(clock.clone())
                .reaper(false)
                .inline()
                .build(),
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let returned = Arc::new(Mutex::new(None));
        {
            let (t, r) = (Arc::clone(&timer), Arc::clone(&returned));
            timer
                .add(Duration::from_millis(1), move || {
                    *r.lock().unwrap() = Some(t.shutdown().len());
                })
                .unwrap();
        }
        // Due in the same advance, after the shutting-down task (FIFO within a tick).
        let r = Arc::clone(&ran);
        timer
            .add(Duration::from_millis(1), move || {
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        // Pending, not due: the shutdown ends it.
        timer.add(Duration::from_secs(60), || ()).unwrap();
        clock.advance(Duration::from_millis(1));
        let n = timer.advance();
        let returned = returned.lock().unwrap().take();
        (n, ran.load(SeqCst), returned, timer)
    });
    let (n, ran, returned, timer) = result;
    assert_eq!(n, 2, "both due tasks were dispatched by the advance");
    assert_eq!(ran, 1, "the rest of the batch still runs");
    assert_eq!(
        returned,
        Some(0),
        "a shutdown from inside a task returns nothing"
    );
    assert!(timer.is_shutdown());
    // The deferred shutdown finishes once the advance has returned: the pending task is gone.
    for _ in 0..2000 {
        if timer.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        timer.is_empty(),
        "the deferred shutdown took the pending task out"
    );
    assert!(timer.add(Duration::ZERO, || ()).unwrap_err().is_shutdown());
    assert!(
        timer.shutdown().is_empty(),
        "a second shutdown returns nothing"
    );
}

/// A task whose drop panics (user code: the timer drops a cancelled task on the cancelling
/// thread).
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("task dropped");
    }
}

/// Cancelling a task whose drop panics: the panic goes on to the canceller (the task's own
/// code), but the task's slot under `max_pending` is given back. Before, the slot was given
/// back after the drop, so the panic skipped it: each such cancel shrank the cap for good, and
/// a full timer refused every task with `Full` for ever, though nothing was pending.
#[test]
fn a_cancel_whose_task_panics_on_drop_gives_its_pending_slot_back() {
    let timer: SystemTimer = SystemTimer::builder()
        .clock(ManualClock::new(0))
        .reaper(false)
        .inline()
        .max_pending(2)
        .build();
    let task = |guard: PanicsOnDrop| {
        move || {
            let _guard = guard;
        }
    };
    let h = timer
        .add(Duration::from_secs(60), task(PanicsOnDrop))
        .unwrap();
    let k = timer
        .add_keyed(Duration::from_secs(60), task(PanicsOnDrop))
        .unwrap();
    let cancel = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.cancel()));
    assert!(cancel.is_err(), "the drop's panic reaches the canceller");
    let cancel = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer.cancel(k)));
    assert!(cancel.is_err(), "the drop's panic reaches the canceller");
    assert!(timer.is_empty());
    for _ in 0..2 {
        let added = timer.add(Duration::from_secs(60), || ());
        assert!(
            added.is_ok(),
            "both slots are free again: got {:?}",
            added.err()
        );
    }
}

/// A name with a NUL byte cannot name a thread: `try_build` says so with an error. Before, the
/// standard library's thread spawn panicked inside `try_build` (documented to return errors).
#[test]
fn a_name_with_a_nul_byte_is_a_build_error_not_a_panic() {
    let built = std::panic::catch_unwind(|| {
        SystemTimer::builder()
            .name("leases\0")
            .try_build()
            .map(drop)
    });
    let err = built
        .expect("try_build does not panic")
        .expect_err("a NUL byte in the name is refused");
    assert!(matches!(err, system_timer::BuildError::Spawn(_)), "{err:?}");
    assert!(err.to_string().contains("NUL"), "{err}");
}

/// A timer on the manual clock with one executor and no reaper.
fn one_executor(clock: &ManualClock) -> Arc<SystemTimer> {
    Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .executor_threads(1)
            .build(),
    )
}

/// A timer on the manual clock with one executor, and a task already running on it that spins
/// until `release` is set, then sets `finished`.
fn timer_with_a_running_task(
    release: &Arc<AtomicBool>,
    finished: &Arc<AtomicBool>,
) -> Arc<SystemTimer> {
    let clock = ManualClock::new(0);
    let timer = one_executor(&clock);
    let running = Arc::new(AtomicBool::new(false));
    let (r, rel, fin) = (running.clone(), release.clone(), finished.clone());
    timer
        .add(Duration::from_millis(1), move || {
            r.store(true, SeqCst);
            while !rel.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            fin.store(true, SeqCst);
        })
        .unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(timer.advance(), 1);
    wait_until_started(&running);
    timer
}

/// Waits (generously, only to catch a hang) until a task has set `started`.
fn wait_until_started(started: &AtomicBool) {
    let t0 = Instant::now();
    while !started.load(SeqCst) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the task never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sets `flag` from another thread after `after`.
fn set_later(flag: &Arc<AtomicBool>, after: Duration) {
    let flag = flag.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        flag.store(true, SeqCst);
    });
}

#[test]
fn a_second_shutdown_returns_only_once_the_first_has_joined_the_threads() {
    let (release, finished) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let timer = timer_with_a_running_task(&release, &finished);
    // The first shutdown waits for the executor, busy with the task.
    let first = {
        let timer = timer.clone();
        std::thread::spawn(move || timer.shutdown().len())
    };
    while !timer.is_shutdown() {
        std::thread::sleep(Duration::from_millis(1));
    }
    set_later(&release, Duration::from_millis(50));
    let second = {
        let (timer, finished) = (timer.clone(), finished.clone());
        within_20s("the second shutdown", move || {
            let back = timer.shutdown();
            (back.len(), finished.load(SeqCst))
        })
    };
    assert_eq!(
        second,
        (0, true),
        "the second call returns nothing, after the task has finished"
    );
    assert_eq!(first.join().unwrap(), 0);
}

#[test]
fn a_shutdown_after_one_finishing_in_the_background_waits_for_it() {
    let (release, finished) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let timer = timer_with_a_running_task(&release, &finished);
    // A shutdown that returns at once and finishes on a thread of its own, once the task has
    // returned (as one called from inside a task does).
    timer.shutdown_in_background();
    assert!(timer.is_shutdown());
    set_later(&release, Duration::from_millis(50));
    let t = timer.clone();
    let fin = finished.clone();
    let done = within_20s("shutdown", move || {
        drop(t.shutdown());
        fin.load(SeqCst)
    });
    assert!(
        done,
        "shutdown returned while a task of the timer still ran"
    );
}

#[test]
fn a_task_calling_shutdown_while_another_is_under_way_does_not_wait_for_itself() {
    let clock = ManualClock::new(0);
    let timer = one_executor(&clock);
    let (started, returned) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (weak, st, ret) = (Arc::downgrade(&timer), started.clone(), returned.clone());
    timer
        .add(Duration::from_millis(1), move || {
            st.store(true, SeqCst);
            let Some(timer) = weak.upgrade() else { return };
            // Wait until the first shutdown (which waits for this task) has begun.
            while !timer.is_shutdown() {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(timer.shutdown());
            ret.store(true, SeqCst);
        })
        .unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(timer.advance(), 1);
    // Only once the task runs: a shutdown before an executor has taken it hands it back unrun.
    wait_until_started(&started);
    let t = timer.clone();
    within_20s("the first shutdown", move || drop(t.shutdown()));
    assert!(
        returned.load(SeqCst),
        "the task's own shutdown call returned"
    );
}
