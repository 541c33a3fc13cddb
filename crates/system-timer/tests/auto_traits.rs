//! The public types' auto traits, pinned: each assertion fails to compile if the type loses
//! the trait (a field that is not `Send` or `Sync` added to it, say).
#![cfg(not(loom))]

use std::cell::Cell;

use system_timer::{
    BuildError, Builder, Lateness, ManualClock, ScheduleError, SystemClock, SystemTimer, Task,
    TimerHandle, TimerKey, TimerStats,
};

fn send_and_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

/// A task type that is `Send` but not `Sync`: the least a task must be.
struct Job(Cell<u32>);

impl system_timer::TimerTask for Job {
    fn run(self) {
        self.0.set(1);
    }
}

#[test]
fn the_timer_its_builder_and_handles_are_send_and_sync_for_any_task_type() {
    // Every task sits behind the wheel's locks: `Sync` without asking it of the tasks.
    send_and_sync::<SystemTimer>();
    send_and_sync::<SystemTimer<Job>>();
    send_and_sync::<Builder>();
    send_and_sync::<Builder<Job>>();
    send_and_sync::<TimerHandle<Task>>();
    send_and_sync::<TimerHandle<Job>>();
    send_and_sync::<TimerKey>();
}

#[test]
fn clocks_stats_and_build_errors_are_send_and_sync() {
    send_and_sync::<ManualClock>();
    send_and_sync::<SystemClock>();
    send_and_sync::<TimerStats>();
    send_and_sync::<Lateness>();
    send_and_sync::<BuildError>();
}

#[test]
fn a_task_and_a_refusal_that_holds_one_are_send() {
    // A boxed closure need only be `Send`, so a `Task` is not `Sync`, nor is a refusal that
    // hands one back (as `std::sync::mpsc::SendError<T>`).
    send::<Task>();
    send::<ScheduleError<Task>>();
    send_and_sync::<ScheduleError<u64>>();
    // What `without_task` gives: `Send + Sync` whatever the task was.
    send_and_sync::<ScheduleError<()>>();
}
