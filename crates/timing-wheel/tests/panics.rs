//! A panic in the user's callback (`advance`, `close`) never leaves the wheel inconsistent: the
//! pass completes, every other entry is handed out, the invariants hold, and only then does the
//! panic reach the caller. Before, the rest of the bucket being flushed was left in no list with
//! stale links: entries that never fired, and a cancel of one of them that wrote out of bounds
//! (a segfault from safe code in a release build). A value whose drop panics while the wheel is
//! dropped does not leak the others. CI runs this file under valgrind too.
#![cfg(not(loom))]

use std::panic::{catch_unwind, AssertUnwindSafe};

use timing_wheel::{ConcurrentWheel, TimingWheel};

/// Four entries in one level-0 bucket and four in a level-1 bucket (cascaded, then due); the
/// callback panics at its first call. Every entry is still handed out, the keys are dead, and
/// the wheel goes on working.
#[test]
fn a_panic_in_advance_hands_out_the_rest_and_leaves_the_wheel_consistent() {
    let mut w = TimingWheel::new(1, 20, 0).unwrap();
    let keys: Vec<_> = (0..8u64)
        .map(|i| {
            let deadline = if i < 4 { 5 } else { 25 };
            w.add(deadline, format!("v{i}")).unwrap()
        })
        .collect();
    let mut out = Vec::new();
    let mut calls = 0;
    let r = catch_unwind(AssertUnwindSafe(|| {
        w.advance(30, |f| {
            calls += 1;
            if calls == 1 {
                panic!("the callback panics");
            }
            out.push(f.value);
        })
    }));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(calls, 8, "every due entry was handed to the callback");
    assert_eq!(out.len(), 7);
    assert_eq!((w.len(), w.next_expiration()), (0, None));
    w.check_invariants();
    for k in keys {
        assert_eq!(w.cancel(k), None, "a fired key names nothing");
    }
    // Nodes freed by the panicking pass are reused soundly.
    let again: Vec<_> = (0..8u64)
        .map(|i| w.add(40 + i, format!("w{i}")).unwrap())
        .collect();
    w.check_invariants();
    assert_eq!(w.cancel(again[3]).as_deref(), Some("w3"));
    let mut fired = Vec::new();
    assert_eq!(w.advance(100, |f| fired.push(f.value)), 7);
    assert_eq!(fired, ["w0", "w1", "w2", "w4", "w5", "w6", "w7"]);
    w.check_invariants();
}

/// The same through the concurrent wheel's guard, over several shards, with a panic at every
/// third call: the advance completes and the first panic's payload is the one raised.
#[test]
fn a_panic_in_a_concurrent_advance_hands_out_the_rest() {
    let w = ConcurrentWheel::with_shards(1, 20, 0, 4).unwrap();
    let handles: Vec<_> = (0..30u64)
        .map(|i| w.add(1 + i % 25, i).unwrap().handle)
        .collect();
    let mut seen = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        w.lock().advance(30, |f| {
            seen.push(f.value);
            if seen.len() % 3 == 1 {
                panic!("panic {}", seen.len());
            }
        })
    }));
    let payload = r.expect_err("the panic reaches the caller");
    assert_eq!(
        payload.downcast_ref::<String>().map(String::as_str),
        Some("panic 1")
    );
    seen.sort_unstable();
    assert_eq!(seen, (0..30).collect::<Vec<_>>());
    assert_eq!(w.len(), 0);
    w.lock().check_invariants();
    assert!(
        handles.iter().all(|h| h.cancel().is_none()),
        "fired entries cannot be cancelled"
    );
    let h = w.add(40, 99).unwrap().handle;
    assert_eq!(h.cancel(), Some(99));
    w.lock().check_invariants();
}

/// A panic in `close`'s callback: every entry is still handed back, then the panic is raised.
#[test]
fn a_panic_in_close_hands_back_every_entry() {
    let w = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let handles: Vec<_> = (0..10u64)
        .map(|i| w.add(5 + i * 100, i).unwrap().handle)
        .collect();
    let mut back = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        w.lock().close(|f| {
            back.push(f.value);
            assert!(back.len() != 2, "the callback panics");
        })
    }));
    assert!(r.is_err(), "the panic reaches the caller");
    back.sort_unstable();
    assert_eq!(back, (0..10).collect::<Vec<_>>());
    assert_eq!(w.len(), 0);
    assert!(handles
        .iter()
        .all(|h| h.is_handed_back() && h.cancel().is_none()));
}

/// Counts its drops; the one with `panics` set panics in its drop.
struct Dropped {
    panics: bool,
    drops: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Dropped {
    fn drop(&mut self) {
        self.drops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert!(!self.panics, "a value's drop panics");
    }
}

#[test]
fn a_panicking_value_drop_while_the_wheel_is_dropped_drops_every_other_value() {
    let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let value = |i: u64| Dropped {
        panics: i == 0,
        drops: drops.clone(),
    };
    let mut w = TimingWheel::new(1, 20, 0).unwrap();
    for i in 0..5u64 {
        w.add(10 + i * 100, value(i)).unwrap();
    }
    let r = catch_unwind(AssertUnwindSafe(move || drop(w)));
    assert!(r.is_err(), "the value's panic reaches the caller");
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 5);

    // The concurrent wheel, each shard an arena of its own: the same.
    drops.store(0, std::sync::atomic::Ordering::SeqCst);
    let w = ConcurrentWheel::new(1, 20, 0).unwrap();
    let handles: Vec<_> = (0..5u64)
        .map(|i| w.add(10 + i * 100, value(i)).unwrap().handle)
        .collect();
    drop(handles);
    let r = catch_unwind(AssertUnwindSafe(move || drop(w)));
    assert!(r.is_err(), "the value's panic reaches the caller");
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 5);
}

/// The concurrent wheel with handles alive (each such shard closed by the wheel's drop, not
/// dropped with it): values whose drops panic, in two shards, cost no other value its drop, and
/// a value that holds its own handle in a later shard is not leaked. Before, the first panic
/// left the later shards unclosed: the self-holding value leaked with its shard.
#[test]
fn panicking_value_drops_in_shards_kept_by_handles_leak_no_other_shard() {
    use std::sync::{Arc, OnceLock};
    use timing_wheel::EntryHandle;
    struct SelfAware {
        _value: Dropped,
        _me: Arc<OnceLock<EntryHandle<SelfAware>>>,
    }
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = ConcurrentWheel::with_shards(1, 20, 0, 3).unwrap();
    let mut kept = Vec::new();
    // Shards 0 and 1: a value whose drop panics, its handle kept by the caller.
    for shard in 0..2 {
        let value = SelfAware {
            _value: Dropped {
                panics: true,
                drops: drops.clone(),
            },
            _me: Arc::new(OnceLock::new()),
        };
        kept.push(w.add_on_shard(shard, 10, value).unwrap().handle);
    }
    // Shard 2: a value that holds its own handle (only it keeps the shard alive).
    let me = Arc::new(OnceLock::new());
    let value = SelfAware {
        _value: Dropped {
            panics: false,
            drops: drops.clone(),
        },
        _me: me.clone(),
    };
    assert!(me.set(w.add_on_shard(2, 10, value).unwrap().handle).is_ok());
    drop(me);
    let r = catch_unwind(AssertUnwindSafe(move || drop(w)));
    assert!(r.is_err(), "the first panic reaches the caller");
    assert_eq!(
        drops.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "every value dropped once"
    );
    assert!(kept.iter().all(|h| h.is_handed_back()));
}
