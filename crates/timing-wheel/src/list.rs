//! Index-linked circular doubly linked lists with sentinel heads, stored in a paged arena.
//!
//! This module holds every `unsafe` block of the crate. Everything above it (the wheel core, the
//! single-threaded [`TimingWheel`](crate::TimingWheel) and the sharded
//! [`ConcurrentWheel`](crate::ConcurrentWheel)) is safe code.
//!
//! # Ground rules
//!
//! * An [`Arena`] is plain `&mut self` data. It has no interior mutability and no atomics: the
//!   caller provides exclusion (the concurrent wheel keeps each arena inside its shard's mutex).
//! * A node is one of four kinds, recorded in the two low bits of its `stamp`:
//!
//!   | state         | `value`        | linked?                        | on the free list? |
//!   |---------------|----------------|--------------------------------|-------------------|
//!   | `VACANT`      | uninitialised  | no (`prev`, `next` are `NIL`)  | yes, or retired   |
//!   | `PENDING`     | **initialised**| yes, except while in transit   | no                |
//!   | `HANDED_BACK` | uninitialised  | no                             | no (never reused) |
//!   | `SENTINEL`    | uninitialised  | it *is* a list head            | no                |
//!
//!   The one invariant the `unsafe` code relies on: **`value` is initialised if and only if the
//!   state is `PENDING`.** Every transition out of `PENDING` moves the value out exactly once
//!   ([`Arena::release`], [`Arena::hand_back`]) and the `Drop` impl drops exactly the `PENDING`
//!   values.
//! * State machine of an entry node: `VACANT → PENDING` ([`Arena::alloc`]), then
//!   `PENDING → VACANT` (fired or cancelled: [`Arena::release`]) or `PENDING → HANDED_BACK`
//!   (the wheel was closed: [`Arena::hand_back`]). A `VACANT` node bumps its generation when it is
//!   released, so an [`EntryKey`] names one incarnation of a node and never a later one. A node
//!   whose generation would wrap is retired (never reused), so a stale key can never match.
//! * A list is circular and headed by a sentinel node: an empty list is a sentinel whose `prev`
//!   and `next` are itself, so linking and unlinking never branch on "first" or "last".
//! * A `PENDING` node is linked into at most one list. [`Arena::detach`] empties a list in O(1)
//!   and hands back the chain (`NIL`-terminated through `next`); the caller then relinks or
//!   releases every node of the chain before it gives up its exclusive access. Such nodes are
//!   "in transit": still `PENDING`, linked to nothing but their chain successor. No user code
//!   unwinds through a chain in transit: the wheel calls the user's callbacks through
//!   `unwind::Deferred`, which catches a panic and raises it again once every node is placed.
//! * Every node access checks its index against the arena's length with a real check (not only
//!   in debug builds; its panic out of line, so it costs no measurable time), so the `unsafe`
//!   rests on this module's own invariants, never on a caller's index arithmetic: a bad index
//!   panics. [`Arena::unlink`] also checks with a real `assert!` that the node's links are not
//!   `NIL`. A caller that broke the rule above (unlinking a node in the middle of a chain in
//!   transit, whose links are stale but not `NIL`) would corrupt the lists' order, not memory.

use std::fmt;
use std::mem::MaybeUninit;

/// The panic of an index past the arena's nodes (out of line: the check is on every access).
#[cold]
#[inline(never)]
fn out_of_bounds(i: u32, len: u32) -> ! {
    panic!("node index {i} out of bounds ({len})")
}

/// "No node": the end of a detached chain, or the links of an unlinked node.
pub(crate) const NIL: u32 = u32::MAX;

const PAGE_BITS: u32 = 12;
const PAGE_SIZE: usize = 1 << PAGE_BITS;
const PAGE_MASK: u32 = (1 << PAGE_BITS) - 1;

const STATE_MASK: u32 = 0b11;
const VACANT: u32 = 0;
const PENDING: u32 = 1;
const HANDED_BACK: u32 = 2;
const SENTINEL: u32 = 3;
/// One generation step: the generation lives in the 30 high bits of a stamp.
const GENERATION: u32 = 1 << 2;
/// Stamps at or past this generation are never handed out again (the node is retired).
const LAST_GENERATION: u32 = !STATE_MASK;

/// Names one scheduled entry of a wheel: a node index plus the stamp (generation and state)
/// the node had when the entry was added.
///
/// A key stays valid until its entry fires, is cancelled or is handed back; after that it matches
/// nothing, ever (the node's generation moves on, and nodes are retired before it could wrap).
/// A key carries no wheel identity: used with another wheel, it may name (and cancel) an
/// unrelated entry there. Keep keys with the wheel that made them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub(crate) index: u32,
    pub(crate) stamp: u32,
}

impl fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntryKey({}v{})", self.index, self.stamp >> 2)
    }
}

/// What became of the entry a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyState {
    /// Still scheduled.
    Pending,
    /// Taken out by a close of the wheel (handed back to the owner).
    HandedBack,
    /// Fired or cancelled.
    Gone,
}

struct Node<T> {
    prev: u32,
    next: u32,
    stamp: u32,
    deadline: u64,
    value: MaybeUninit<T>,
}

/// A paged arena of list nodes. Pages are never moved or freed before the arena, so growth never
/// copies and indices stay valid for the arena's life.
pub(crate) struct Arena<T> {
    pages: Vec<Vec<Node<T>>>,
    /// Nodes ever created (the next fresh index).
    len: u32,
    /// Head of the free list of `VACANT` nodes, threaded through `next`.
    free: u32,
    /// Number of `PENDING` nodes.
    pending: usize,
    /// Number of nodes retired for good (generation exhausted or handed back).
    retired: usize,
    /// Number of sentinel nodes.
    sentinels: usize,
}

// ===== impl Arena =====

impl<T> Arena<T> {
    pub(crate) const fn new() -> Self {
        Arena {
            pages: Vec::new(),
            len: 0,
            free: NIL,
            pending: 0,
            retired: 0,
            sentinels: 0,
        }
    }

    /// The node at index `i`.
    ///
    /// Every index this module dereferences is `< self.len`: indices come from `push` (fresh),
    /// from the links of nodes (which only ever hold indices of this arena, or `NIL`, and `NIL`
    /// is never followed), or from an [`EntryKey`] that the caller has validated with
    /// [`Arena::is_pending`] (which checks `index < len`). Debug builds assert it on every access.
    #[inline(always)]
    fn node(&self, i: u32) -> &Node<T> {
        // A real check, not a debug one: the `unsafe` below must not rest on every caller's
        // index arithmetic (one compare, always true, so a branch the CPU predicts).
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        let (p, o) = ((i >> PAGE_BITS) as usize, (i & PAGE_MASK) as usize);
        // SAFETY: `i < self.len` (checked above), and nodes `0..len` are exactly the initialised
        // elements of the pages, which fill in order: so page `p = i / PAGE_SIZE` exists.
        let page = unsafe { self.pages.get_unchecked(p) };
        // SAFETY: page `p` holds nodes `p * PAGE_SIZE ..` up to `len` (only the last page is
        // partly filled), so it holds more than `o = i % PAGE_SIZE` nodes.
        unsafe { page.get_unchecked(o) }
    }

    #[inline(always)]
    fn node_mut(&mut self, i: u32) -> &mut Node<T> {
        // A real check: see `node`.
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        let (p, o) = ((i >> PAGE_BITS) as usize, (i & PAGE_MASK) as usize);
        // SAFETY: as in `node`: `i < len` (checked above), so page `p` exists.
        let page = unsafe { self.pages.get_unchecked_mut(p) };
        // SAFETY: as in `node`: page `p` holds more than `o` nodes.
        unsafe { page.get_unchecked_mut(o) }
    }

    /// Appends a fresh node; the arena never holds an index of `NIL` (it stops one page short
    /// of it: at most `u32::MAX + 1 - PAGE_SIZE` nodes).
    #[inline(always)]
    fn push(&mut self, node: Node<T>) -> u32 {
        let i = self.len;
        match self.pages.last_mut() {
            // Within a page the capacity was reserved up front: this push never reallocates, so
            // growth is O(1) and never copies nodes.
            Some(page) if page.len() < PAGE_SIZE => page.push(node),
            _ => self.push_page(node),
        }
        self.len += 1;
        i
    }

    #[cold]
    fn push_page(&mut self, node: Node<T>) {
        // Pages start at multiples of PAGE_SIZE: the page starting here holds indices up to
        // `len + PAGE_SIZE - 1`, which must stay below `NIL`.
        assert!(
            self.len < NIL - (PAGE_SIZE as u32 - 1),
            "timing wheel arena is full ({} nodes)",
            self.len
        );
        let mut page = Vec::with_capacity(PAGE_SIZE);
        page.push(node);
        self.pages.push(page);
    }

    /// Creates `n` consecutive empty lists and returns the index of the first sentinel.
    pub(crate) fn alloc_sentinels(&mut self, n: u32) -> u32 {
        let base = self.len;
        for k in 0..n {
            let i = base + k;
            self.push(Node {
                prev: i,
                next: i,
                stamp: SENTINEL,
                deadline: 0,
                value: MaybeUninit::uninit(),
            });
        }
        self.sentinels += n as usize;
        base
    }

    /// Stores `value` in a new, unlinked `PENDING` node.
    #[inline(always)]
    pub(crate) fn alloc(&mut self, deadline: u64, value: T) -> EntryKey {
        // `pending` is counted once the node is made (a full arena's panic counts nothing).
        let index = self.free;
        if index == NIL {
            let stamp = PENDING;
            let index = self.push(Node {
                prev: NIL,
                next: NIL,
                stamp,
                deadline,
                value: MaybeUninit::new(value),
            });
            self.pending += 1;
            return EntryKey { index, stamp };
        }
        let node = self.node_mut(index);
        debug_assert_eq!(
            node.stamp & STATE_MASK,
            VACANT,
            "free list holds a live node"
        );
        let next_free = node.next;
        let stamp = node.stamp | PENDING;
        node.stamp = stamp;
        node.next = NIL;
        node.deadline = deadline;
        // A VACANT node's value is uninitialised; writing it makes the node PENDING.
        node.value.write(value);
        self.free = next_free;
        self.pending += 1;
        EntryKey { index, stamp }
    }

    /// The state of the entry `key` names.
    #[inline]
    pub(crate) fn key_state(&self, key: EntryKey) -> KeyState {
        if key.index >= self.len {
            return KeyState::Gone;
        }
        let stamp = self.node(key.index).stamp;
        if stamp == key.stamp {
            KeyState::Pending
        } else if stamp == (key.stamp & !STATE_MASK) | HANDED_BACK {
            KeyState::HandedBack
        } else {
            KeyState::Gone
        }
    }

    #[inline(always)]
    pub(crate) fn is_pending(&self, key: EntryKey) -> bool {
        key.index < self.len && self.node(key.index).stamp == key.stamp
    }

    #[inline(always)]
    pub(crate) fn deadline(&self, i: u32) -> u64 {
        self.node(i).deadline
    }

    #[inline(always)]
    pub(crate) fn stamp(&self, i: u32) -> u32 {
        self.node(i).stamp
    }

    #[inline(always)]
    pub(crate) fn next(&self, i: u32) -> u32 {
        self.node(i).next
    }

    #[inline(always)]
    pub(crate) fn prev(&self, i: u32) -> u32 {
        self.node(i).prev
    }

    /// Links the unlinked node `i` at the tail of the list headed by `sentinel`.
    #[inline(always)]
    pub(crate) fn link_back(&mut self, sentinel: u32, i: u32) {
        debug_assert_eq!(
            self.node(sentinel).stamp,
            SENTINEL,
            "link_back onto a non-sentinel"
        );
        debug_assert_eq!(
            self.node(i).stamp & STATE_MASK,
            PENDING,
            "linking a dead node"
        );
        let tail = self.node(sentinel).prev;
        let node = self.node_mut(i);
        node.prev = tail;
        node.next = sentinel;
        self.node_mut(tail).next = i;
        self.node_mut(sentinel).prev = i;
    }

    /// Unlinks the linked node `i` from its list, in O(1).
    #[inline(always)]
    pub(crate) fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = *self.node(i);
        // Not only in debug builds: `node(NIL)` below would be out of bounds (see the rules).
        assert!(prev != NIL && next != NIL, "unlink of an unlinked node {i}");
        debug_assert_eq!(self.node(prev).next, i, "broken next link into {i}");
        debug_assert_eq!(self.node(next).prev, i, "broken prev link into {i}");
        self.node_mut(prev).next = next;
        self.node_mut(next).prev = prev;
        let node = self.node_mut(i);
        node.prev = NIL;
        node.next = NIL;
    }

    /// Empties the list headed by `sentinel` in O(1) and returns the first node of the detached
    /// chain (`NIL` when the list was empty). The chain runs through [`Arena::next`] and ends in
    /// `NIL`; every node of it must then be relinked or released.
    #[inline]
    pub(crate) fn detach(&mut self, sentinel: u32) -> u32 {
        let s = self.node(sentinel);
        debug_assert_eq!(s.stamp, SENTINEL, "detach of a non-sentinel");
        let (first, last) = (s.next, s.prev);
        if first == sentinel {
            return NIL;
        }
        let s = self.node_mut(sentinel);
        s.next = sentinel;
        s.prev = sentinel;
        self.node_mut(last).next = NIL;
        self.node_mut(first).prev = NIL;
        first
    }

    /// [`detach`](Self::detach), returning both ends of the chain: `(first, last)`, or `None` for
    /// an empty list. The chain is doubly linked between them (`first.prev` and `last.next` are
    /// `NIL`), so it can be walked from both ends at once.
    #[inline]
    pub(crate) fn detach_ends(&mut self, sentinel: u32) -> Option<(u32, u32)> {
        let last = self.node(sentinel).prev;
        match self.detach(sentinel) {
            NIL => None,
            first => Some((first, last)),
        }
    }

    /// True if node `i` is on the list headed by `sentinel` (a walk: tests and debugging only).
    pub(crate) fn list_contains(&self, sentinel: u32, i: u32) -> bool {
        let mut cur = self.node(sentinel).next;
        while cur != sentinel {
            if cur == i {
                return true;
            }
            cur = self.node(cur).next;
        }
        false
    }

    #[cfg(test)]
    pub(crate) fn is_empty_list(&self, sentinel: u32) -> bool {
        self.node(sentinel).next == sentinel
    }

    /// Moves the value out of the unlinked `PENDING` node `i` and frees the node.
    #[inline(always)]
    pub(crate) fn release(&mut self, i: u32) -> T {
        let free = self.free;
        let node = self.node_mut(i);
        assert_eq!(
            node.stamp & STATE_MASK,
            PENDING,
            "release of a non-pending node"
        );
        // SAFETY: the state is PENDING, so `value` is initialised (module invariant); the state
        // leaves PENDING just below, so this is the only read of this value.
        let value = unsafe { node.value.assume_init_read() };
        node.prev = NIL;
        let generation = (node.stamp & !STATE_MASK).wrapping_add(GENERATION);
        node.stamp = generation | VACANT;
        if generation == LAST_GENERATION || generation == 0 {
            // Reusing this node could make an old key match again: retire it instead.
            node.next = NIL;
            self.retired += 1;
        } else {
            node.next = free;
            self.free = i;
        }
        // Counted once the node has left PENDING (a refused release counts nothing).
        self.pending -= 1;
        value
    }

    /// Moves the value out of the unlinked `PENDING` node `i` and marks it handed back: its key
    /// now reports [`KeyState::HandedBack`] and the node is never reused.
    pub(crate) fn hand_back(&mut self, i: u32) -> T {
        let node = self.node_mut(i);
        assert_eq!(
            node.stamp & STATE_MASK,
            PENDING,
            "hand_back of a non-pending node"
        );
        // SAFETY: the state is PENDING, so `value` is initialised (module invariant); the state
        // becomes HANDED_BACK just below, so this is the only read of this value.
        let value = unsafe { node.value.assume_init_read() };
        node.stamp = (node.stamp & !STATE_MASK) | HANDED_BACK;
        node.prev = NIL;
        node.next = NIL;
        self.pending -= 1;
        self.retired += 1;
        value
    }

    /// Number of `PENDING` nodes.
    #[inline]
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    /// Bytes of node storage reserved by the arena (all pages, whole).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.pages.len() * PAGE_SIZE * std::mem::size_of::<Node<T>>()
    }

    /// Walks the list headed by `sentinel`, checking every link both ways, and returns the
    /// deadlines of its nodes in list order. Panics on a malformed list.
    pub(crate) fn check_list(&self, sentinel: u32) -> Vec<u64> {
        assert_eq!(
            self.node(sentinel).stamp,
            SENTINEL,
            "list head {sentinel} is not a sentinel"
        );
        let mut out = Vec::new();
        let mut prev = sentinel;
        let mut cur = self.node(sentinel).next;
        while cur != sentinel {
            assert!(
                cur < self.len,
                "list {sentinel}: link to {cur} out of bounds"
            );
            let node = self.node(cur);
            assert_eq!(
                node.stamp & STATE_MASK,
                PENDING,
                "list {sentinel}: dead node {cur}"
            );
            assert_eq!(
                node.prev, prev,
                "list {sentinel}: node {cur} has a wrong prev"
            );
            out.push(node.deadline);
            assert!(out.len() <= self.len as usize, "list {sentinel}: cycle");
            prev = cur;
            cur = node.next;
        }
        assert_eq!(
            self.node(sentinel).prev,
            prev,
            "list {sentinel}: wrong tail"
        );
        out
    }

    /// Checks the arena's bookkeeping: the free list is well formed and every node is counted
    /// exactly once. Panics on a violation.
    pub(crate) fn check_accounting(&self) {
        let mut free = 0usize;
        let mut cur = self.free;
        while cur != NIL {
            let node = self.node(cur);
            assert_eq!(
                node.stamp & STATE_MASK,
                VACANT,
                "free list holds a non-vacant node {cur}"
            );
            free += 1;
            assert!(free <= self.len as usize, "free list cycle");
            cur = node.next;
        }
        let mut counts = [0usize; 4];
        for i in 0..self.len {
            counts[(self.node(i).stamp & STATE_MASK) as usize] += 1;
        }
        assert_eq!(
            counts[PENDING as usize], self.pending,
            "pending count drifted"
        );
        assert_eq!(
            counts[SENTINEL as usize], self.sentinels,
            "sentinel count drifted"
        );
        assert_eq!(
            counts[VACANT as usize] + counts[HANDED_BACK as usize],
            free + self.retired,
            "vacant nodes neither free nor retired"
        );
    }
}

impl<T> Arena<T> {
    /// Drops every pending value (the arena's drop). Each node leaves `PENDING` before its value
    /// is dropped, so a call that follows one a value's panicking drop cut short drops only the
    /// values not dropped yet.
    fn drop_pending(&mut self) {
        for page in &mut self.pages {
            for node in page.iter_mut() {
                if node.stamp & STATE_MASK == PENDING {
                    node.stamp = (node.stamp & !STATE_MASK) | VACANT;
                    self.pending -= 1;
                    // SAFETY: the node was PENDING, so `value` is initialised (module
                    // invariant); it is VACANT from here on, so no later pass drops it again,
                    // and the arena is being dropped, so nothing reads it.
                    unsafe { node.value.assume_init_drop() };
                }
            }
        }
    }
}

impl<T> Drop for Arena<T> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() || self.pending == 0 {
            return;
        }
        // A value whose drop panics must not cost the others theirs (a slice's drop also goes
        // on past a panicking element): while that panic unwinds, the guard drops the rest. A
        // second panic then aborts, as it does for a slice.
        struct Rest<'a, T>(&'a mut Arena<T>);
        impl<T> Drop for Rest<'_, T> {
            fn drop(&mut self) {
                self.0.drop_pending();
            }
        }
        let rest = Rest(self);
        rest.0.drop_pending();
        std::mem::forget(rest);
    }
}

impl<T> fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("nodes", &self.len)
            .field("pending", &self.pending)
            .field("retired", &self.retired)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// splitmix64, as in BENCHMARKS.md.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn contents(arena: &Arena<String>, s: u32) -> Vec<u64> {
        arena.check_list(s)
    }

    /// A value whose drop panics while the arena is dropped does not leak the others: every
    /// pending value is dropped exactly once (heap strings beside the counters, so Miri and
    /// valgrind would also see a leak or a double drop).
    #[test]
    fn a_panicking_value_drop_does_not_leak_the_other_values() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        struct V {
            id: usize,
            _heap: String,
            drops: std::sync::Arc<Vec<AtomicUsize>>,
        }
        impl Drop for V {
            fn drop(&mut self) {
                self.drops[self.id].fetch_add(1, SeqCst);
                assert!(self.id != 2, "value 2's drop panics");
            }
        }
        let drops: std::sync::Arc<Vec<AtomicUsize>> =
            std::sync::Arc::new((0..6).map(|_| AtomicUsize::new(0)).collect());
        let mut a: Arena<V> = Arena::new();
        let s = a.alloc_sentinels(1);
        let mut keys = Vec::new();
        for id in 0..6 {
            let v = V {
                id,
                _heap: format!("v{id}"),
                drops: drops.clone(),
            };
            let key = a.alloc(id as u64, v);
            a.link_back(s, key.index);
            keys.push(key);
        }
        // One released before the drop: dropped once, by its taker, and not again.
        a.unlink(keys[4].index);
        drop(a.release(keys[4].index));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(a)));
        assert!(r.is_err(), "the value's panic reaches the caller");
        let counts: Vec<usize> = drops.iter().map(|d| d.load(SeqCst)).collect();
        assert_eq!(counts, vec![1; 6]);
    }

    #[test]
    fn empty_list_is_a_self_linked_sentinel() {
        let mut a: Arena<u8> = Arena::new();
        let s = a.alloc_sentinels(3);
        for k in 0..3 {
            assert!(a.is_empty_list(s + k));
            assert!(a.check_list(s + k).is_empty());
            assert_eq!(a.detach(s + k), NIL);
        }
        a.check_accounting();
    }

    /// The list against a `VecDeque` model: thousands of seeded random operations on several
    /// lists (push back, unlink from the middle, pop front, detach-and-relink, release), with
    /// the arena's own accounting checked throughout. Values are heap strings, so a double drop
    /// or a leak shows up under valgrind and Miri (both in CI) and as a count mismatch here.
    #[test]
    fn list_matches_vecdeque_model() {
        const LISTS: usize = 4;
        let mut rng = 42u64;
        let mut a: Arena<String> = Arena::new();
        let base = a.alloc_sentinels(LISTS as u32);
        let mut model: Vec<VecDeque<(EntryKey, u64)>> = vec![VecDeque::new(); LISTS];
        let mut released = 0usize;
        // Miri (`cargo +nightly miri test -p timing-wheel --lib list::`) interprets every
        // step: a tenth of the steps there still unlinks, detaches and releases hundreds.
        let (steps, check_every) = if cfg!(miri) {
            (2_000, 61)
        } else {
            (20_000, 257)
        };
        for step in 0..steps {
            let l = (splitmix(&mut rng) % LISTS as u64) as usize;
            match splitmix(&mut rng) % 6 {
                0..=2 => {
                    let key = a.alloc(step, format!("v{step}"));
                    a.link_back(base + l as u32, key.index);
                    model[l].push_back((key, step));
                }
                3 => {
                    // unlink a random element
                    if !model[l].is_empty() {
                        let at = (splitmix(&mut rng) % model[l].len() as u64) as usize;
                        let (key, d) = model[l].remove(at).unwrap();
                        assert!(a.is_pending(key));
                        a.unlink(key.index);
                        let v = a.release(key.index);
                        assert_eq!(v, format!("v{d}"));
                        assert!(!a.is_pending(key), "a released key must never match again");
                        assert_eq!(a.key_state(key), KeyState::Gone);
                        released += 1;
                    }
                }
                4 => {
                    // detach the whole list and relink every node into another list
                    let to = (l + 1) % LISTS;
                    let mut cur = a.detach(base + l as u32);
                    let mut moved = 0;
                    while cur != NIL {
                        let next = a.next(cur);
                        a.link_back(base + to as u32, cur);
                        cur = next;
                        moved += 1;
                    }
                    assert_eq!(moved, model[l].len());
                    let drained: Vec<_> = model[l].drain(..).collect();
                    model[to].extend(drained);
                }
                _ => {
                    // pop front and release
                    if let Some((key, d)) = model[l].pop_front() {
                        a.unlink(key.index);
                        assert_eq!(a.release(key.index), format!("v{d}"));
                        released += 1;
                    }
                }
            }
            if step % check_every == 0 {
                for (l, m) in model.iter().enumerate() {
                    let want: Vec<u64> = m.iter().map(|&(_, d)| d).collect();
                    assert_eq!(
                        contents(&a, base + l as u32),
                        want,
                        "list {l} at step {step}"
                    );
                }
                a.check_accounting();
            }
        }
        let live: usize = model.iter().map(VecDeque::len).sum();
        assert_eq!(a.pending(), live);
        assert!(released > steps as usize / 20);
        a.check_accounting();
        // Remaining strings are dropped by the arena's Drop (valgrind and Miri check no leak).
    }

    #[test]
    fn hand_back_retires_the_node_and_reports_it() {
        let mut a: Arena<Vec<u8>> = Arena::new();
        let s = a.alloc_sentinels(1);
        let k = a.alloc(7, vec![1, 2, 3]);
        a.link_back(s, k.index);
        a.unlink(k.index);
        assert_eq!(a.hand_back(k.index), vec![1, 2, 3]);
        assert_eq!(a.key_state(k), KeyState::HandedBack);
        // The node is not reused.
        let k2 = a.alloc(8, vec![4]);
        assert_ne!(k2.index, k.index);
        a.check_accounting();
    }

    #[test]
    fn freed_nodes_are_reused_with_a_new_generation() {
        let mut a: Arena<u32> = Arena::new();
        let k1 = a.alloc(1, 10);
        assert_eq!(a.release(k1.index), 10);
        let k2 = a.alloc(2, 20);
        assert_eq!(k2.index, k1.index, "LIFO reuse of the freed node");
        assert_ne!(k2.stamp, k1.stamp);
        assert!(!a.is_pending(k1));
        assert!(a.is_pending(k2));
    }

    #[test]
    fn a_node_is_retired_before_its_generation_wraps() {
        let mut a: Arena<u32> = Arena::new();
        let k = a.alloc(1, 1);
        // Jump the node to its last generation (as if reused 2^30 - 1 times).
        a.node_mut(k.index).stamp = (LAST_GENERATION - GENERATION) | PENDING;
        a.release(k.index);
        assert_eq!(a.node(k.index).stamp, LAST_GENERATION | VACANT);
        let k2 = a.alloc(2, 2);
        assert_ne!(
            k2.index, k.index,
            "a node at its last generation must not be reused"
        );
        a.check_accounting();
    }

    /// An index past the arena's nodes panics in every build, on every access path (it used to
    /// be checked by a `debug_assert!` only, so a release build read out of bounds). The index
    /// is inside an allocated page but past `len`, where an unchecked read finds no node.
    #[test]
    fn an_index_past_the_nodes_panics_in_every_build() {
        let mut a: Arena<u32> = Arena::new();
        let k = a.alloc(1, 1);
        let past = k.index + 1;
        type Read = fn(&Arena<u32>, u32);
        let reads: [(&str, Read); 4] = [
            ("next", |a, i| {
                let _ = a.next(i);
            }),
            ("prev", |a, i| {
                let _ = a.prev(i);
            }),
            ("deadline", |a, i| {
                let _ = a.deadline(i);
            }),
            ("stamp", |a, i| {
                let _ = a.stamp(i);
            }),
        ];
        for (name, read) in reads {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&a, past)));
            assert!(r.is_err(), "{name} of an index past the nodes returned");
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.unlink(past)));
        assert!(r.is_err(), "unlink of an index past the nodes returned");
        assert_eq!(a.release(k.index), 1);
    }

    /// A refused release (of a node that is not pending) panics and leaves the counts as they
    /// were: it used to count the release before its check, so `pending()` drifted low.
    #[test]
    fn a_refused_release_counts_nothing() {
        let mut a: Arena<u32> = Arena::new();
        let k = a.alloc(1, 1);
        assert_eq!(a.release(k.index), 1);
        let k2 = a.alloc(2, 2);
        assert_eq!(a.pending(), 1);
        let sentinel = a.alloc_sentinels(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.release(sentinel)));
        assert!(r.is_err(), "a sentinel was released");
        assert_eq!(a.pending(), 1, "the refused release was counted");
        assert_eq!(a.release(k2.index), 2);
        assert_eq!(a.pending(), 0);
        a.check_accounting();
    }

    #[test]
    fn pages_grow_without_moving_nodes() {
        let mut a: Arena<u64> = Arena::new();
        let keys: Vec<_> = (0..(3 * PAGE_SIZE as u64 + 5))
            .map(|i| a.alloc(i, i * 2))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(a.deadline(k.index), i as u64);
        }
        assert_eq!(a.pages.len(), 4);
        for k in keys {
            let d = a.deadline(k.index);
            assert_eq!(a.release(k.index), d * 2);
        }
        a.check_accounting();
    }

    /// `{:?}` of a key shows its index and generation (not the state bits); a reused node's key
    /// shows the next generation.
    #[test]
    fn entry_key_debug_shows_index_and_generation() {
        let mut a: Arena<u32> = Arena::new();
        a.alloc_sentinels(2);
        let k = a.alloc(1, 1);
        assert_eq!(format!("{k:?}"), "EntryKey(2v0)");
        assert_eq!(a.release(k.index), 1);
        let k2 = a.alloc(2, 2);
        assert_eq!(format!("{k2:?}"), "EntryKey(2v1)");
        assert_eq!(a.release(k2.index), 2);
    }

    /// `check_accounting` panics on each broken bookkeeping invariant (it is what every test's
    /// final check relies on: a check that never fires would pass a drifted count). Values are
    /// `u32`, so no corruption below can leak or double-drop.
    #[test]
    fn check_accounting_reports_each_broken_invariant() {
        fn fails_with(a: &Arena<u32>, want: &str) {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.check_accounting()));
            let err = r.expect_err(&format!("check_accounting passed; expected \"{want}\""));
            let msg = err
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| err.downcast_ref::<&str>().copied())
                .unwrap_or("");
            assert!(msg.contains(want), "expected \"{want}\", got: {msg}");
        }
        let mut a: Arena<u32> = Arena::new();
        a.alloc_sentinels(1);
        let live = a.alloc(1, 1);
        let freed = a.alloc(2, 2);
        assert_eq!(a.release(freed.index), 2);
        a.check_accounting();

        a.pending += 1;
        fails_with(&a, "pending count drifted");
        a.pending -= 1;

        a.sentinels += 1;
        fails_with(&a, "sentinel count drifted");
        a.sentinels -= 1;

        a.retired += 1;
        fails_with(&a, "vacant nodes neither free nor retired");
        a.retired -= 1;

        // A pending node on the free list.
        a.node_mut(freed.index).next = live.index;
        fails_with(&a, "free list holds a non-vacant node");
        // A free list that loops back on itself.
        a.node_mut(freed.index).next = freed.index;
        fails_with(&a, "free list cycle");
        a.node_mut(freed.index).next = NIL;

        a.check_accounting();
        assert_eq!(a.release(live.index), 1);
    }

    /// `{:?}` of an arena shows its node, pending and retired counts.
    #[test]
    fn arena_debug_shows_its_counts() {
        let mut a: Arena<u32> = Arena::new();
        a.alloc_sentinels(1);
        let k1 = a.alloc(1, 1);
        let k2 = a.alloc(2, 2);
        assert_eq!(a.hand_back(k1.index), 1);
        assert_eq!(
            format!("{a:?}"),
            "Arena { nodes: 3, pending: 1, retired: 1 }"
        );
        assert_eq!(a.release(k2.index), 2);
    }

    /// A key whose index is at or past the arena's nodes (a key of another, larger wheel) is
    /// not pending and reports `Gone`: the index check comes first, so no node past the end is
    /// read (`<=` there would read node `len` and panic out of bounds).
    #[test]
    fn a_key_past_the_nodes_is_not_pending_and_gone() {
        let mut a: Arena<u32> = Arena::new();
        let k = a.alloc(1, 1);
        for index in [k.index + 1, k.index + 2] {
            let key = EntryKey {
                index,
                stamp: k.stamp,
            };
            assert!(!a.is_pending(key), "key {key:?} past the nodes is pending");
            assert_eq!(a.key_state(key), KeyState::Gone);
        }
        assert!(a.is_pending(k));
        assert_eq!(a.release(k.index), 1);
    }

    /// `list_contains` finds every member of a list, and nothing on another list, after an
    /// unlink, or on an empty list. A member is asked for first, on a non-empty list: a walk that
    /// stops at the first node answers `false` there at once (an empty list would make that walk
    /// spin, and `locate` walks every empty bucket, so without this the wheel's tests only hang).
    #[test]
    fn list_contains_finds_exactly_the_members_of_a_list() {
        let mut a: Arena<u32> = Arena::new();
        let s = a.alloc_sentinels(2);
        let keys: Vec<_> = (0..3).map(|d| a.alloc(d, d as u32)).collect();
        for k in &keys {
            a.link_back(s, k.index);
        }
        for k in &keys {
            assert!(a.list_contains(s, k.index), "{k:?} not found on its list");
        }
        a.unlink(keys[1].index);
        assert!(!a.list_contains(s, keys[1].index), "an unlinked node found");
        a.link_back(s + 1, keys[1].index);
        assert!(a.list_contains(s + 1, keys[1].index));
        assert!(
            !a.list_contains(s + 1, keys[0].index),
            "found on another list"
        );
        a.unlink(keys[1].index);
        assert!(
            !a.list_contains(s + 1, keys[1].index),
            "found on an empty list"
        );
        for (d, k) in keys.iter().enumerate() {
            if d != 1 {
                a.unlink(k.index);
            }
            assert_eq!(a.release(k.index), d as u32);
        }
        a.check_accounting();
    }

    /// `reserved_bytes` counts whole pages in bytes: no page before the first node, then one
    /// page of `PAGE_SIZE` nodes (a `+` or `/` for the last `*` would still grow with the
    /// pages, so only the exact count catches it).
    #[test]
    fn reserved_bytes_counts_whole_pages_of_nodes() {
        let node = std::mem::size_of::<Node<u64>>();
        let mut a: Arena<u64> = Arena::new();
        assert_eq!(a.reserved_bytes(), 0);
        let k = a.alloc(1, 1);
        assert_eq!(a.reserved_bytes(), PAGE_SIZE * node);
        assert_eq!(a.release(k.index), 1);
        assert_eq!(
            a.reserved_bytes(),
            PAGE_SIZE * node,
            "a release frees no page"
        );
    }
}
