//! Operation handles as values a caller keeps: the same operation reached through two calls
//! must be recognisable as the same one. (Failed to compile while `OperationHandle` had no
//! `PartialEq`, `Eq` and `Hash`.)
#![cfg(not(loom))]

use std::collections::HashSet;
use std::time::Duration;

use purgatory::{DelayedOperation, OperationHandle, Purgatory};
use system_timer::ManualClock;

/// An operation that never becomes ready by itself.
struct Never;

impl DelayedOperation for Never {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {}
}

/// An operation watched on two keys is returned by `cancel_for_key` of each (it is still
/// watched, and pending, on the other one). A caller cancelling both keys collects the handles
/// in a `HashSet` to act once per operation: the set must hold one handle for that operation
/// and one for an operation watched on one key only, and handles to one operation (a clone
/// included) must compare equal while those to different operations do not.
#[test]
fn handles_from_two_cancels_of_one_operation_dedupe_in_a_hash_set() {
    let clock = ManualClock::new(0);
    let p: Purgatory<&str, Never> = Purgatory::builder().clock(clock).reaper(false).build();
    let both = p
        .try_complete_else_watch(Never, Duration::from_secs(30), &["a", "b"])
        .unwrap()
        .handle;
    let only_a = p
        .try_complete_else_watch(Never, Duration::from_secs(30), &["a"])
        .unwrap()
        .handle;

    let mut ops: HashSet<OperationHandle<Never>> = HashSet::new();
    ops.extend(p.cancel_for_key(&"a"));
    ops.extend(p.cancel_for_key(&"b"));
    assert_eq!(ops.len(), 2, "one entry per operation");
    assert!(ops.contains(&both) && ops.contains(&only_a));
    assert_eq!(both, both.clone());
    assert_ne!(both, only_a);
    // The hash follows the operation too (a constant one would still dedupe, slowly).
    let state = std::hash::RandomState::new();
    let hash_with = |h: &OperationHandle<Never>| {
        use std::hash::BuildHasher;
        state.hash_one(h)
    };
    assert_eq!(hash_with(&both), hash_with(&both.clone()));
    assert_ne!(hash_with(&both), hash_with(&only_a));
}
