//! A timer whose last reference is dropped inside one of its own tasks (a task that owned it,
//! or an operation of a purgatory whose expiry was in flight): the shutdown that the drop runs
//! cannot join the thread it runs on, nor wait for the task it runs in. It must neither panic
//! nor hang, and every thread of the timer must still end. Before, the drop joined the reaper
//! from the reaper itself ("Resource deadlock avoided", a panic inside the task; fatal under
//! `panic = "abort"`). One test in this file: it installs a panic hook for the whole process.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::Duration;

mod common;
use common::wait_for_threads_to_end;
use system_timer::{ManualClock, SystemTimer};

#[test]
fn dropping_the_last_reference_inside_a_task_neither_panics_nor_leaks_a_thread() {
    let panics = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&panics);
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("panic: {info}");
        seen.fetch_add(1, SeqCst);
    }));
    // On the reaper (inline), then on an executor. Thread names are at most 15 bytes on Linux.
    for (name, executors) in [("sd-inline", 0), ("sd-exec", 1)] {
        let builder = SystemTimer::builder().name(name).clock(ManualClock::new(0));
        let builder = if executors == 0 {
            builder.inline()
        } else {
            builder.executor_threads(executors)
        };
        let timer: Arc<SystemTimer> = Arc::new(builder.build());
        let (started_tx, started) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel();
        let last = Arc::clone(&timer);
        timer
            .add(Duration::ZERO, move || {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                drop(last); // the last reference: the timer's drop runs here
                done_tx.send(()).unwrap();
            })
            .unwrap();
        // A task pending in the wheel, dropped by the deferred shutdown.
        timer.add(Duration::from_secs(60), || ()).unwrap();
        started
            .recv_timeout(Duration::from_secs(20))
            .expect("task started");
        drop(timer);
        go.send(()).unwrap();
        done.recv_timeout(Duration::from_secs(20))
            .expect("the drop inside the task returned");
        wait_for_threads_to_end(name);
    }
    let _ = std::panic::take_hook();
    assert_eq!(panics.load(SeqCst), 0, "a panic was raised");
}
