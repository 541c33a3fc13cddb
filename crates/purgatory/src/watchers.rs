//! The watch lists: for each key, the operations watching it.
//!
//! # Ground rules
//!
//! * A key's list is a copy-on-write `Arc<Vec<Entry>>` (each entry an operation's
//!   `Arc<OpCell>` and its argument to the purgatory's ready test) in a sharded map (DashMap; one
//!   `Mutex<HashMap>` under loom). Every read or write of the map happens under the key's shard
//!   lock, and **no operation's lock is ever taken while a shard lock is held**.
//! * A check takes a *snapshot* (clones the list's outer `Arc`, one atomic increment) under the
//!   shard lock, releases it, and scans the snapshot. Concurrent checks of one key each scan the
//!   same snapshot and each block on every operation's lock in turn (Kafka's semantics: nothing
//!   ready is skipped). An operation appended after a snapshot was taken re-checks itself under
//!   its own lock after it is appended (the double check of `try_complete_else_watch`), so an
//!   event is never lost between the two.
//! * Appends, sweeps and removals copy the list only if a snapshot of it is alive at that moment
//!   (rare: scans are short); otherwise they mutate it in place.
//! * Watch, sweep and remove-if-empty all run under the same shard lock, so an operation can
//!   never be appended to a list that has just been dropped from the map (R5 in LOOM.md).
//! * Keys are hashed with foldhash (a random seed per map; minimally HashDoS-resistant, as
//!   hashbrown's default): the keys are the server's own (partitions, groups), and SipHash cost
//!   a twentieth of W4's generator CPU.
//! * A closed map (shutdown) refuses appends; the flag is read under the shard lock, and the
//!   shutdown drains every shard after setting it, so no append slips past the drain.

use std::hash::Hash;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::operation::{DelayedOperation, OpCell};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::Arc;

/// The map's hasher (see the ground rules).
#[cfg(not(loom))]
type Hasher = foldhash::fast::RandomState;

/// One operation in a key's list: its cell, and the argument it gave the purgatory's ready
/// test ([`DelayedOperation::ready_arg`]), kept here so that a check can rule the operation out
/// without reading its cell. 16 bytes: "no argument" is [`NO_ARG`].
pub(crate) struct Entry<Op> {
    pub(crate) cell: Arc<OpCell<Op>>,
    pub(crate) arg: u64,
}

/// [`Entry::arg`] of an operation the ready test is not asked about (no argument, or
/// `u64::MAX`, which is documented to mean the same: never skipping is always safe).
pub(crate) const NO_ARG: u64 = u64::MAX;

impl<Op> Clone for Entry<Op> {
    fn clone(&self) -> Self {
        Entry {
            cell: Arc::clone(&self.cell),
            arg: self.arg,
        }
    }
}

/// One key's list of watchers.
pub(crate) type List<Op> = Arc<Vec<Entry<Op>>>;

/// A caught panic's payload.
pub(crate) type Panic = Box<dyn std::any::Any + Send + 'static>;

/// Mutable access to a list, copying it first if a snapshot shares it.
///
/// One uniqueness test (`make_mut`: a compare-and-swap and a store) rather than `get_mut`
/// twice (two of each): it runs on every watch, three times per operation in W4.
#[cfg(not(loom))]
#[inline]
fn list_mut<Op>(list: &mut List<Op>) -> &mut Vec<Entry<Op>> {
    Arc::make_mut(list)
}

/// Loom's `Arc` has no `make_mut`: the same with `get_mut`.
#[cfg(loom)]
fn list_mut<Op>(list: &mut List<Op>) -> &mut Vec<Entry<Op>> {
    if Arc::get_mut(list).is_none() {
        *list = Arc::new(list.iter().cloned().collect());
    }
    Arc::get_mut(list).expect("just made unique")
}

/// Drops completed operations from a list; returns how many it dropped.
///
/// Two passes: the first only counts the completed cells, reading every cell's flag (a cache
/// miss per cell of a long list, and plain loads, so the CPU keeps many in flight at once; no
/// early exit, so every line is brought in); the second drops the completed cells' references
/// from lines now in cache. Dropping is an atomic read-modify-write, which on x86 waits for every
/// earlier load: done in the same pass as the first reads, it made each miss wait for the one
/// before (the purge of a long list was a tenth of a W4 run's CPU).
fn sweep<Op: DelayedOperation>(list: &mut List<Op>) -> usize {
    let before = list.len();
    if list.iter().filter(|e| e.cell.is_completed()).count() > 0 {
        list_mut(list).retain(|e| !e.cell.is_completed());
    }
    before - list.len()
}

pub(crate) struct WatchMap<K, Op> {
    #[cfg(not(loom))]
    map: dashmap::DashMap<K, List<Op>, Hasher>,
    #[cfg(loom)]
    map: crate::sync::Mutex<std::collections::HashMap<K, List<Op>>>,
    closed: AtomicBool,
}

impl<K: Hash + Eq + Clone, Op: DelayedOperation> WatchMap<K, Op> {
    pub(crate) fn new(shards: usize) -> Self {
        #[cfg(loom)]
        let _ = shards;
        WatchMap {
            #[cfg(not(loom))]
            map: dashmap::DashMap::with_hasher_and_shard_amount(
                Hasher::default(),
                shards.next_power_of_two().max(2),
            ),
            #[cfg(loom)]
            map: crate::sync::Mutex::new(std::collections::HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Appends `cell` (with its ready argument) to `key`'s list (creating it); false if the map
    /// is closed. The key is cloned only to create its list: a watched key's list is found by
    /// reference (a key that owns memory, a topic name, is not copied per watch).
    pub(crate) fn watch(&self, key: &K, cell: &Arc<OpCell<Op>>, arg: u64) -> bool {
        let entry = Entry {
            cell: Arc::clone(cell),
            arg,
        };
        #[cfg(not(loom))]
        {
            // Both holds of the shard's write lock read `closed` under it.
            if let Some(mut list) = self.map.get_mut(key) {
                if self.closed.load(Ordering::Acquire) {
                    return false;
                }
                list_mut(&mut list).push(entry);
                return true;
            }
            let slot = self.map.entry(key.clone());
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            list_mut(&mut slot.or_default()).push(entry);
            true
        }
        #[cfg(loom)]
        {
            let mut map = self.map.lock();
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            if let Some(list) = map.get_mut(key) {
                list_mut(list).push(entry);
            } else {
                list_mut(map.entry(key.clone()).or_default()).push(entry);
            }
            true
        }
    }

    /// A snapshot of `key`'s list (see the ground rules).
    #[inline]
    pub(crate) fn snapshot(&self, key: &K) -> Option<List<Op>> {
        #[cfg(not(loom))]
        return self.map.get(key).map(|l| Arc::clone(&l));
        #[cfg(loom)]
        return self.map.lock().get(key).cloned();
    }

    /// Drops completed operations from `key`'s list, and the key itself if its list is then
    /// empty (Kafka's `removeKeyIfEmpty`). Returns how many entries it dropped.
    pub(crate) fn sweep_key(&self, key: &K) -> usize {
        #[cfg(not(loom))]
        {
            let mut dropped = 0;
            self.map.remove_if_mut(key, |_, list| {
                dropped = sweep(list);
                list.is_empty()
            });
            dropped
        }
        #[cfg(loom)]
        {
            let mut map = self.map.lock();
            let Some(list) = map.get_mut(key) else {
                return 0;
            };
            let dropped = sweep(list);
            if list.is_empty() {
                map.remove(key);
            }
            dropped
        }
    }

    /// Sweeps every key (the purge). Returns how many entries it dropped.
    pub(crate) fn purge(&self) -> usize {
        let mut dropped = 0;
        #[cfg(not(loom))]
        self.map.retain(|_, list| {
            dropped += sweep(list);
            !list.is_empty()
        });
        #[cfg(loom)]
        self.map.lock().retain(|_, list| {
            dropped += sweep(list);
            !list.is_empty()
        });
        dropped
    }

    /// Removes `key` and returns its list.
    pub(crate) fn take_key(&self, key: &K) -> Option<List<Op>> {
        #[cfg(not(loom))]
        return self.map.remove(key).map(|(_, l)| l);
        #[cfg(loom)]
        return self.map.lock().remove(key);
    }

    /// Total entries in all lists (Kafka's `watched`, completed-but-unswept entries included).
    pub(crate) fn watched(&self) -> usize {
        #[cfg(not(loom))]
        return self.map.iter().map(|e| e.value().len()).sum();
        #[cfg(loom)]
        return self.map.lock().values().map(|l| l.len()).sum();
    }

    /// Keys with a list.
    pub(crate) fn keys(&self) -> usize {
        #[cfg(not(loom))]
        return self.map.len();
        #[cfg(loom)]
        return self.map.lock().len();
    }

    /// Closes the map (later appends fail) and drains it: every cell in any list, once each.
    ///
    /// The drain drops every key (under its shard lock). A key whose drop panics still leaves
    /// the map with its list, whose cells are taken first: the drain goes on with the other
    /// keys, and the first such panic is returned beside the cells, for the caller to resume
    /// once it has dealt with them.
    pub(crate) fn close(&self) -> (Vec<Arc<OpCell<Op>>>, Option<Panic>) {
        self.closed.store(true, Ordering::Release);
        let mut cells = Vec::new();
        let mut first_panic = None;
        // Each panic ends one pass after its key left the map (the map erases an entry before
        // dropping it), so every pass but the last removes at least one key; the bound is a
        // guard only.
        for _ in 0..=self.keys() {
            let pass = catch_unwind(AssertUnwindSafe(|| {
                let mut take = |list: &mut List<Op>| {
                    cells.extend(list.iter().map(|e| Arc::clone(&e.cell)));
                    false
                };
                #[cfg(not(loom))]
                self.map.retain(|_, list| take(list));
                #[cfg(loom)]
                self.map.lock().retain(|_, list| take(list));
            }));
            match pass {
                Ok(()) => break,
                Err(panic) => {
                    first_panic.get_or_insert(panic);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        cells.retain(|c| seen.insert(Arc::as_ptr(c)));
        (cells, first_panic)
    }

    /// Every list's cells (for invariant checks).
    pub(crate) fn lists(&self) -> Vec<(K, List<Op>)> {
        #[cfg(not(loom))]
        return self
            .map
            .iter()
            .map(|e| (e.key().clone(), Arc::clone(e.value())))
            .collect();
        #[cfg(loom)]
        return self
            .map
            .lock()
            .iter()
            .map(|(k, l)| (k.clone(), l.clone()))
            .collect();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::operation::tests::Nothing;
    use crate::operation::{Common, CommonRefs, Purger};
    use system_timer::SystemTimer;

    /// A closed map refuses every append: to a key the close's drain removed and to one that
    /// never had a list (either would create a list after the drain, which nothing drains
    /// again). A key that still has a list was not drained yet: its entries are drained with it.
    #[test]
    fn a_closed_map_refuses_appends_to_drained_and_new_keys() {
        let timer = Arc::new(SystemTimer::builder().reaper(false).inline().build());
        let common = Arc::new(Common::new(timer, 1000, Purger::new(|| 0)));
        let refs = CommonRefs::new(&common);
        let cell = Arc::new(OpCell::new(Nothing, refs.mine()));
        let map: WatchMap<u32, Nothing> = WatchMap::new(4);
        assert!(map.watch(&1, &cell, NO_ARG));
        assert!(
            map.watch(&1, &cell, NO_ARG),
            "a second append to the same list"
        );
        assert_eq!(map.watched(), 2);
        let (cells, panic) = map.close();
        assert!(panic.is_none());
        assert_eq!(cells.len(), 1, "the drain gives each cell once");
        assert!(!map.watch(&1, &cell, NO_ARG), "appended to a drained key");
        assert!(!map.watch(&2, &cell, NO_ARG), "appended to a new key");
        assert_eq!((map.watched(), map.keys()), (0, 0));
    }
}
