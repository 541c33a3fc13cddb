//! Call sequences a user could plausibly write that once hung or lost work: calls into a timer
//! from inside one of its own tasks, on a thread that is not one of the timer's.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

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
