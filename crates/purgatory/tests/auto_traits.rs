//! The public types' auto traits, pinned: each assertion fails to compile if the type loses
//! the trait (a field that is not `Send` or `Sync` added to it, say).
//!
//! A builder that is not `Send` cannot be made on one thread and built on another, nor held
//! across an `.await` in a `Send` future; one that is not `Sync` cannot sit in shared
//! configuration. Until 2026-11-26 the purgatory's `Builder` was neither (its clock setter's
//! closure was a plain `Box<dyn FnOnce>`).
#![cfg(not(loom))]
// A real thread: this is not a loom test.
#![allow(clippy::disallowed_methods)]

use purgatory::{
    Builder, DelayedOperation, DynReadyTest, OperationHandle, Purgatory, PurgatoryStats, ReadyHint,
    WatchError, Watched,
};

fn send_and_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

/// `Send` but not `Sync` (a `Cell`): the bound the purgatory asks of an operation.
struct Op(std::cell::Cell<u32>);

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        self.0.get() > 0
    }
    fn on_complete(&mut self) {}
}

#[test]
fn the_purgatory_its_builder_and_handles_are_send_and_sync_for_any_operation() {
    send_and_sync::<Purgatory<String, Op>>();
    send_and_sync::<Builder<String, Op>>();
    // With a ready test of a type of its own (any closure is one), and the default's.
    send_and_sync::<Purgatory<String, Op, fn(&String, u64) -> bool>>();
    send_and_sync::<Builder<String, Op, fn(&String, u64) -> bool>>();
    send_and_sync::<DynReadyTest<String>>();
    send_and_sync::<OperationHandle<Op>>();
    send_and_sync::<Watched<Op>>();
    send_and_sync::<PurgatoryStats>();
    send_and_sync::<ReadyHint>();
}

#[test]
fn a_builder_with_a_clock_moves_to_another_thread_and_builds_there() {
    let clock = system_timer::ManualClock::new(0);
    let builder: Builder<&'static str, Op> = Purgatory::builder().clock(clock).reaper(false);
    let purgatory = std::thread::spawn(move || builder.build())
        .join()
        .expect("the build thread");
    assert_eq!(purgatory.delayed(), 0);
    assert_eq!(purgatory.stats().accepted, 0);
}

#[test]
fn a_refusal_is_send_and_sync_as_its_operation_is() {
    // It holds the operation: `Send` as the operation is (and `Sync` only if it is).
    send::<WatchError<Op>>();
    send_and_sync::<WatchError<u32>>();
    // What `without_op` gives: `Send + Sync` whatever the operation was.
    send_and_sync::<WatchError<()>>();
}
