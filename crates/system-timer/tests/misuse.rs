//! Call sequences a user could plausibly write that once hung, lost work or returned too early:
//! calls into a timer from inside one of its own tasks, on a thread that is not one of the
//! timer's, and shutdowns that overlap.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use system_timer::{ManualClock, SystemTimer};

mod common;
use common::{thread_state, wait_for_threads_to_end, within};

/// A task run inline by a caller's `advance()` (a timer driven by hand, no reaper) shuts its
/// own timer down. The shutdown cannot wait for the advance it runs in (the task is part of
/// it). Before, it waited for that advance to finish, for ever: a hang on the caller's thread.
#[test]
fn shutdown_from_an_inline_task_run_by_a_callers_advance_does_not_hang() {
    let result = within("shutdown inside advance", 20, || {
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
    one_executor_named(clock, "timer")
}

/// [`one_executor`], its threads named after `name`.
fn one_executor_named(clock: &ManualClock, name: &str) -> Arc<SystemTimer> {
    Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .name(name)
            .reaper(false)
            .executor_threads(1)
            .build(),
    )
}

/// Sets its flag when dropped: kept in a thread-local of a timer's thread, when that thread
/// exits (thread-locals are destroyed before the thread ends, so before a join of it returns).
struct SetOnThreadExit(Arc<AtomicBool>);

impl Drop for SetOnThreadExit {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

thread_local! {
    static ON_EXIT: std::cell::RefCell<Option<SetOnThreadExit>> =
        const { std::cell::RefCell::new(None) };
}

/// A timer on the manual clock with one executor (threads named after `name`), and a task
/// already running on it that spins until `release` is set, then sets `finished`. Returns the
/// timer and a flag that is set when the executor thread exits.
fn timer_with_a_running_task(
    name: &str,
    release: &Arc<AtomicBool>,
    finished: &Arc<AtomicBool>,
) -> (Arc<SystemTimer>, Arc<AtomicBool>) {
    let clock = ManualClock::new(0);
    let timer = one_executor_named(&clock, name);
    let running = Arc::new(AtomicBool::new(false));
    let exited = Arc::new(AtomicBool::new(false));
    let (r, rel, fin, ex) = (
        running.clone(),
        release.clone(),
        finished.clone(),
        exited.clone(),
    );
    timer
        .add(Duration::from_millis(1), move || {
            ON_EXIT.with(|e| *e.borrow_mut() = Some(SetOnThreadExit(ex)));
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
    (timer, exited)
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

/// Calls `shutdown` on a thread named `name` (at most 15 bytes) and returns once that call
/// waits (its thread sleeps: the only place it can, once inside the call, is the wait for the
/// shutdown under way), or has returned; with a hang guard. The thread returns what the call
/// returned and whether `finished` and `exited` were set when it returned.
fn shutdown_on_a_waiting_thread(
    name: &str,
    timer: &Arc<SystemTimer>,
    finished: &Arc<AtomicBool>,
    exited: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, bool, bool)> {
    let entering = Arc::new(AtomicBool::new(false));
    let (timer, finished, exited, e) = (
        timer.clone(),
        finished.clone(),
        exited.clone(),
        entering.clone(),
    );
    let t = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            e.store(true, SeqCst);
            let back = timer.shutdown();
            (back.len(), finished.load(SeqCst), exited.load(SeqCst))
        })
        .unwrap();
    // Without /proc (not Linux), the release below may come before the call waits: the test
    // then checks less, but still passes only if the call returned after the task.
    let proc_fs = std::path::Path::new("/proc/self/task").exists();
    let t0 = Instant::now();
    while proc_fs && !t.is_finished() && !(entering.load(SeqCst) && thread_state(name) == Some('S'))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the shutdown call never waited"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    t
}

/// Joins `t`, failing (not hanging) if it has not finished within 20 s.
fn join_within_20s<R>(what: &str, t: std::thread::JoinHandle<R>) -> R {
    let t0 = Instant::now();
    while !t.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: hung");
        std::thread::sleep(Duration::from_millis(1));
    }
    t.join().unwrap()
}

/// A shutdown called while another is under way (that one waiting for the executor, busy with a
/// task) returns nothing, and only once the first has joined the timer's threads: the executor
/// thread has exited by then (it sets a flag as it exits), and no thread of the timer remains
/// (waited for: a joined thread's /proc entry may linger a moment).
#[test]
fn a_second_shutdown_returns_only_once_the_first_has_joined_the_threads() {
    let (release, finished) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let (timer, exited) = timer_with_a_running_task("misuse2nd", &release, &finished);
    // The first shutdown waits for the executor, busy with the task.
    let first = {
        let timer = timer.clone();
        std::thread::spawn(move || timer.shutdown().len())
    };
    let t0 = Instant::now();
    while !timer.is_shutdown() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the first shutdown never began"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let second = shutdown_on_a_waiting_thread("misuse2nd-call", &timer, &finished, &exited);
    assert!(!second.is_finished(), "the second call did not wait");
    release.store(true, SeqCst);
    let second = join_within_20s("the second shutdown", second);
    assert_eq!(
        second,
        (0, true, true),
        "the second call returns nothing (.0), after the task has finished (.1) and the \
         executor thread has exited (.2)"
    );
    assert_eq!(join_within_20s("the first shutdown", first), 0);
    wait_for_threads_to_end("misuse2nd-exec");
}

#[test]
fn a_shutdown_after_one_finishing_in_the_background_waits_for_it() {
    let (release, finished) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let (timer, exited) = timer_with_a_running_task("misusebg", &release, &finished);
    // A shutdown that returns at once and finishes on a thread of its own, once the task has
    // returned (as one called from inside a task does).
    timer.shutdown_in_background();
    assert!(timer.is_shutdown());
    let waiting = shutdown_on_a_waiting_thread("misusebg-call", &timer, &finished, &exited);
    assert!(!waiting.is_finished(), "the shutdown did not wait");
    release.store(true, SeqCst);
    let (back, done, gone) = join_within_20s("shutdown", waiting);
    assert_eq!(back, 0);
    assert!(
        done,
        "shutdown returned while a task of the timer still ran"
    );
    assert!(gone, "shutdown returned before the executor thread exited");
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
    within("the first shutdown", 20, move || drop(t.shutdown()));
    assert!(
        returned.load(SeqCst),
        "the task's own shutdown call returned"
    );
}
