//! Adversarial review of the wheel's contracts: each test here failed on the code it was
//! written against (see the commit that added it) and pins the fix.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use timing_wheel::{ConcurrentWheel, EntryHandle};

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
