//! Adversarial review of the wheel's contracts: each test here failed on the code it was
//! written against (see the commit that added it) and pins the fix.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

mod common;
use common::with_timeout;

use timing_wheel::{AddError, ConcurrentWheel, EntryHandle, TimingWheel};

/// Counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Dropping a concurrent wheel drops the values of its pending entries even while a handle of
/// one of them is alive. A handle used to keep its whole shard alive, values included: every
/// other pending value of that shard (entries nobody can fire, cancel or take back any more)
/// stayed in memory for as long as that one handle lived. The handle itself stays usable: its
/// entry reports handed back, and a cancel finds nothing.
#[test]
fn dropping_the_wheel_drops_pending_values_while_a_handle_lives() {
    let drops = Arc::new(AtomicUsize::new(0));
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 1).unwrap();
    let kept = cw.add(10, Counted(drops.clone())).unwrap().handle;
    for d in [10, 30, 500, u64::MAX] {
        cw.add(d, Counted(drops.clone())).unwrap();
    }
    drop(cw);
    assert_eq!(
        drops.load(SeqCst),
        5,
        "pending values outlived their wheel because a handle was alive"
    );
    assert!(!kept.is_pending());
    assert!(kept.is_handed_back());
    assert!(!kept.is_fired() && !kept.is_cancelled());
    assert!(kept.cancel().is_none());
    assert_eq!(kept.deadline(), None);
}

/// A value that holds its own entry's handle (a task that wants to cancel or query itself) is
/// dropped with the wheel. It used to be a reference cycle (shard → value → handle → shard):
/// dropping the wheel without a close leaked the shard and every value in it, for good.
#[test]
fn a_value_holding_its_own_handle_does_not_leak_its_shard() {
    struct SelfAware {
        _count: Counted,
        _me: Arc<OnceLock<EntryHandle<SelfAware>>>,
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    for shard in 0..2 {
        let me = Arc::new(OnceLock::new());
        let value = SelfAware {
            _count: Counted(drops.clone()),
            _me: me.clone(),
        };
        let handle = cw.add_on_shard(shard, 100, value).unwrap().handle;
        assert!(me.set(handle).is_ok());
    }
    drop(cw);
    assert_eq!(drops.load(SeqCst), 2, "the shards leaked their values");
}

/// Dropping the wheel drops a pending value whose own `Drop` uses a handle of another entry of
/// the same shard (cancels it, asks about it): the values are dropped after the shard's lock is
/// released, so this neither deadlocks nor finds the sibling still pending.
#[test]
fn a_value_whose_drop_uses_a_sibling_handle_is_dropped_with_the_wheel() {
    struct Watcher {
        sibling: Arc<OnceLock<EntryHandle<Watcher>>>,
        seen: Arc<OnceLock<(bool, bool)>>,
    }
    impl Drop for Watcher {
        fn drop(&mut self) {
            if let Some(h) = self.sibling.get() {
                let cancelled = h.cancel().is_some();
                let _ = self.seen.set((cancelled, h.is_handed_back()));
            }
        }
    }
    let seen = Arc::new(OnceLock::new());
    let seen_in = Arc::clone(&seen);
    with_timeout(Duration::from_secs(20), move || {
        let cw = ConcurrentWheel::with_shards(1, 20, 0, 1).unwrap();
        let slot = Arc::new(OnceLock::new());
        let first = Watcher {
            sibling: Arc::clone(&slot),
            seen: seen_in,
        };
        let kept = cw.add(10, first).unwrap().handle;
        let sibling = Watcher {
            sibling: Arc::new(OnceLock::new()),
            seen: Arc::new(OnceLock::new()),
        };
        assert!(slot.set(cw.add(20, sibling).unwrap().handle).is_ok());
        drop(cw);
        assert!(kept.is_handed_back());
    });
    assert_eq!(
        seen.get(),
        Some(&(false, true)),
        "the value was not dropped with the wheel, or its sibling was still pending"
    );
}

/// A concurrent wheel's entry keys are per shard: the first entries of two shards have the
/// same key, so the key a fired entry reports also names an entry still pending on another
/// shard. The docs said a fired key "no longer matches anything" and pointed at
/// `EntryHandle::key` / `WheelKey::entry_key` as "what `Fired::key` reports", inviting callers
/// to match fired entries to their handles or keys by it; they now say it is unique within a
/// shard only. This test pins the behaviour the docs now describe.
#[test]
fn fired_keys_of_a_concurrent_wheel_are_unique_within_a_shard_only() {
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let a = cw.add_on_shard(0, 5, 'a').unwrap().handle;
    let b = cw.add_on_shard(1, 7, 'b').unwrap().handle;
    assert_eq!(a.key(), b.key(), "two shards' first entries");
    let mut fired = Vec::new();
    cw.lock().advance(5, |f| fired.push((f.key, f.value)));
    assert_eq!(fired, [(a.key(), 'a')]);
    assert!(b.is_pending(), "b has not fired");
    assert_eq!(fired[0].0, b.key(), "the fired key names b too");

    // The same with keys from `add_keyed` on a fresh wheel, from threads until one lands on
    // the other shard (threads get shard hints round-robin).
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let (ka, kb) = std::thread::scope(|s| {
        let add = || {
            s.spawn(|| cw.add_keyed(100, ()).unwrap().handle)
                .join()
                .unwrap()
        };
        let ka = add();
        let kb = (0..64)
            .map(|_| add())
            .find(|k| k.entry_key() == ka.entry_key())
            .expect("no thread landed on the other shard");
        (ka, kb)
    });
    assert_ne!(ka, kb, "the wheel keys differ (they carry the shard)");
    assert!(cw.is_pending(ka) && cw.is_pending(kb));
}

/// At the end of time: a wheel advanced to `u64::MAX` (a tick of 1, or any tick dividing
/// `u64::MAX`, lets its time get there) still accepts a deadline past its last tick, such as
/// `u64::MAX` itself, as never due, although its time has reached that deadline; it is never
/// handed out. The docs of `ConcurrentWheel::add` said only "`Expired` when the deadline is not
/// after the wheel's current time" (so `Expired` here), and `TimingWheel::add`'s said both that
/// and "accepted and means never"; they now say which wins. (`system-timer` checks its clock
/// for such deadlines itself.)
#[test]
fn a_deadline_past_the_last_tick_is_never_due_even_once_the_time_has_reached_it() {
    for tick in [1, 3, 255] {
        let cw = ConcurrentWheel::with_shards(tick, 20, 0, 2).unwrap();
        let mut w = TimingWheel::new(tick, 20, 0).unwrap();
        cw.lock().advance(u64::MAX, |_| unreachable!());
        w.advance(u64::MAX, |_| unreachable!());
        assert_eq!(w.current_time(), u64::MAX, "tick {tick}");
        assert_eq!(cw.lock().current_time(), u64::MAX, "tick {tick}");

        let k = cw.add(u64::MAX, 'c').expect("accepted as never due");
        assert!(k.queued.is_none());
        let kw = w.add(u64::MAX, 'w').expect("accepted as never due");
        assert!(matches!(
            w.add(u64::MAX - tick, 'x'),
            Err(AddError::Expired('x'))
        ));
        assert_eq!(cw.lock().advance(u64::MAX, |_| unreachable!()), 0);
        assert_eq!(w.advance(u64::MAX, |_| unreachable!()), 0);
        assert!(k.handle.is_pending() && w.contains(kw));
        assert_eq!((k.handle.cancel(), w.cancel(kw)), (Some('c'), Some('w')));
    }
}
