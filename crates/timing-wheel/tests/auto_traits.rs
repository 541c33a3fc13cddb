//! The public types' auto traits, pinned: each assertion fails to compile if the type loses
//! the trait (a field that is not `Send` or `Sync` added to it, say).
#![cfg(not(loom))]

use std::cell::Cell;

use timing_wheel::{
    AddError, Added, Bucket, ConcurrentWheel, ConfigError, EntryHandle, EntryKey, Fired,
    TimingWheel, WheelCounts, WheelGuard, WheelKey,
};

fn send_and_sync<T: Send + Sync>() {}
fn send<T: Send>() {}
fn sync<T: Sync>() {}

/// `Send` but not `Sync`: the least a value must be.
type Value = Cell<u32>;

#[test]
fn the_concurrent_wheel_and_its_handles_are_send_and_sync_for_values_that_are_only_send() {
    // Every value sits behind its shard's lock: `Sync` without asking it of the values.
    send_and_sync::<ConcurrentWheel<Value>>();
    send_and_sync::<EntryHandle<Value>>();
    send_and_sync::<Added<EntryHandle<Value>>>();
    send_and_sync::<Added<WheelKey>>();
    send_and_sync::<WheelKey>();
}

#[test]
fn the_single_threaded_wheel_and_what_holds_a_value_are_send_and_sync_as_the_value_is() {
    send::<TimingWheel<Value>>();
    send::<Fired<Value>>();
    send::<AddError<Value>>();
    send_and_sync::<TimingWheel<u64>>();
    send_and_sync::<Fired<u64>>();
    send_and_sync::<AddError<u64>>();
    // What `without_value` gives: `Send + Sync` whatever the value was.
    send_and_sync::<AddError<()>>();
}

#[test]
fn keys_counts_buckets_and_config_errors_are_send_and_sync() {
    send_and_sync::<EntryKey>();
    send_and_sync::<WheelCounts>();
    send_and_sync::<Bucket>();
    send_and_sync::<ConfigError>();
}

#[test]
fn a_wheel_guard_is_sync_as_the_values_are_and_stays_on_its_thread() {
    // It gives access to the values, so it is `Sync` only if they are; and its locks are
    // released where they were taken (parking_lot's guards are not `Send`).
    sync::<WheelGuard<'static, u64>>();
}
