//! A panic in an operation's code (`try_complete`, `on_complete`), a key's code or the clock
//! never leaves the purgatory inconsistent, never costs other operations their completion and
//! never loses an operation (manual clock).
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std atomics in tests

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{DelayedOperation, Purgatory};
use system_timer::ManualClock;

const TIMEOUT: Duration = Duration::from_millis(100);

/// What the test can see of one operation.
#[derive(Default)]
struct Seen {
    ready: AtomicBool,
    /// `try_complete` calls so far.
    tries: AtomicUsize,
    /// `try_complete` panics at this call (1-based); 0: never.
    panic_at_try: AtomicUsize,
    /// `on_complete` panics.
    panic_on_complete: AtomicBool,
    completions: AtomicUsize,
    expirations: AtomicUsize,
    drops: AtomicUsize,
}

struct Faulty(Arc<Seen>);

impl DelayedOperation for Faulty {
    fn try_complete(&mut self) -> bool {
        let n = self.0.tries.fetch_add(1, SeqCst) + 1;
        if n == self.0.panic_at_try.load(SeqCst) {
            panic!("try_complete panics at try {n}");
        }
        self.0.ready.load(SeqCst)
    }
    fn on_complete(&mut self) {
        self.0.completions.fetch_add(1, SeqCst);
        if self.0.panic_on_complete.load(SeqCst) {
            panic!("on_complete panics");
        }
    }
    fn on_expiration(&mut self) {
        self.0.expirations.fetch_add(1, SeqCst);
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        self.0.drops.fetch_add(1, SeqCst);
    }
}

fn manual(clock: &ManualClock) -> Purgatory<&'static str, Faulty> {
    Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .build()
}

fn seen(panic_at_try: usize) -> Arc<Seen> {
    let s = Arc::new(Seen::default());
    s.panic_at_try.store(panic_at_try, SeqCst);
    s
}

/// Watches a `Faulty` over `seen` on `keys`; Err if the call panicked.
fn watch(
    p: &Purgatory<&'static str, Faulty>,
    seen: &Arc<Seen>,
    keys: &[&'static str],
) -> Result<purgatory::OperationHandle<Faulty>, ()> {
    catch_unwind(AssertUnwindSafe(|| {
        p.try_complete_else_watch(Faulty(seen.clone()), TIMEOUT, keys)
            .map(|w| w.handle)
            .map_err(|_| ())
    }))
    .map_err(|_| ())?
}

#[test]
fn a_panic_in_the_first_try_drops_the_operation_and_counts_it_handed_back() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let s = seen(1);
    assert!(
        watch(&p, &s, &["k"]).is_err(),
        "the panic reaches the caller"
    );
    assert_eq!(s.drops.load(SeqCst), 1, "the operation was dropped");
    assert_eq!(s.completions.load(SeqCst), 0);
    let st = p.stats();
    assert_eq!((st.accepted, st.handed_back, st.delayed), (1, 1, 0));
    assert_eq!(p.watched(), 0);
    p.check_invariants();
}

#[test]
fn a_panic_in_the_second_try_leaves_nothing_watched_without_a_timer() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let s = seen(2);
    assert!(
        watch(&p, &s, &["a", "b"]).is_err(),
        "the panic reaches the caller"
    );
    assert_eq!(
        s.drops.load(SeqCst),
        1,
        "the operation was dropped, not left watched"
    );
    let st = p.stats();
    assert_eq!((st.accepted, st.handed_back, st.delayed), (1, 1, 0));
    p.check_invariants();
    // What the watch appended are empty cells: a shutdown finds nothing to hand back, a check
    // calls no code of the operation, and the timeout passes without an expiry.
    s.ready.store(true, SeqCst);
    assert_eq!(p.check_and_complete(&"a"), 0);
    clock.advance(TIMEOUT * 2);
    p.advance();
    assert_eq!(s.tries.load(SeqCst), 2);
    assert_eq!(s.completions.load(SeqCst), 0);
    assert_eq!(s.expirations.load(SeqCst), 0);
    assert!(p.shutdown().is_empty());
}

/// A key whose `Clone` panics once [`KEY_CLONE_PANICS`] is set (which the panic clears).
#[derive(Hash, PartialEq, Eq, Debug)]
struct Key(u32);

/// Makes the next [`Key`] clone panic (only one test sets it).
static KEY_CLONE_PANICS: AtomicBool = AtomicBool::new(false);

impl Clone for Key {
    fn clone(&self) -> Self {
        if self.0 == 2 && KEY_CLONE_PANICS.swap(false, SeqCst) {
            panic!("Key::clone panics");
        }
        Key(self.0)
    }
}

/// A panic while the operation is being watched (here a key's `Clone`, between two watches)
/// takes it back out like a panic in `try_complete` does: dropped, counted handed back, its
/// first key's cell an empty one. Before, it stayed watched on the first key with no timer:
/// it never expired, and a later check completed an operation whose caller had seen a panic.
#[test]
fn a_panic_between_two_watches_hands_the_operation_back() {
    let clock = ManualClock::new(0);
    let p: Purgatory<Key, Faulty> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .build();
    let s = seen(0);
    KEY_CLONE_PANICS.store(true, SeqCst);
    let keys = [Key(1), Key(2)];
    let r = catch_unwind(AssertUnwindSafe(|| {
        p.try_complete_else_watch(Faulty(s.clone()), TIMEOUT, &keys)
    }));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(s.drops.load(SeqCst), 1, "the operation was dropped");
    let st = p.stats();
    assert_eq!((st.accepted, st.handed_back, st.delayed), (1, 1, 0));
    s.ready.store(true, SeqCst);
    assert_eq!(p.check_and_complete(&Key(1)), 0, "nothing left to complete");
    clock.advance(TIMEOUT * 2);
    p.advance();
    assert_eq!(s.completions.load(SeqCst), 0);
    assert_eq!(s.expirations.load(SeqCst), 0);
    assert!(p.shutdown().is_empty());
}

/// Whose `ready_arg` or `ready_hint` panics (`which`: 0 or 1).
struct PanicsEntering(u8);

impl DelayedOperation for PanicsEntering {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {}
    fn ready_arg(&self) -> Option<u64> {
        assert!(self.0 != 0, "ready_arg panics");
        Some(1)
    }
    fn ready_hint(&self) -> Option<purgatory::ReadyHint> {
        assert!(self.0 != 1, "ready_hint panics");
        None
    }
}

/// A panic in `ready_arg` or `ready_hint` (asked as the operation enters) registers nothing:
/// not even `accepted`, so `accepted = completed + handed_back + delayed` still holds.
#[test]
fn a_panic_in_ready_arg_or_ready_hint_registers_nothing() {
    let p: Purgatory<u32, PanicsEntering> = Purgatory::builder()
        .reaper(false)
        .ready_test(|_, _| true)
        .build();
    for which in [0, 1] {
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.try_complete_else_watch(PanicsEntering(which), TIMEOUT, &[7])
        }));
        assert!(r.is_err(), "the panic reaches the caller");
    }
    let st = p.stats();
    assert_eq!(
        (
            st.accepted,
            st.completed,
            st.handed_back,
            st.delayed,
            st.watched
        ),
        (0, 0, 0, 0, 0)
    );
}

#[test]
fn a_panic_in_one_try_complete_does_not_cost_the_others_their_check() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    // The faulty operation first in the key's list (its two tries in the watch pass, the
    // check's panics), then two that the check finds ready.
    let faulty = seen(3);
    let others = [seen(0), seen(0)];
    let h = watch(&p, &faulty, &["k"]).unwrap();
    for s in &others {
        watch(&p, s, &["k"]).unwrap();
    }
    for s in &others {
        s.ready.store(true, SeqCst);
    }
    let checked = catch_unwind(AssertUnwindSafe(|| p.check_and_complete(&"k")));
    assert!(checked.is_err(), "the panic is raised again after the scan");
    for s in &others {
        assert_eq!(s.completions.load(SeqCst), 1, "completed despite the panic");
    }
    // The faulty one stays pending, watched and armed: a later check tries it again, and
    // without one it expires.
    assert!(!h.is_completed());
    assert_eq!(p.delayed(), 1);
    p.check_invariants();
    assert_eq!(p.check_and_complete(&"k"), 0);
    assert_eq!(faulty.tries.load(SeqCst), 4);
    clock.advance(TIMEOUT);
    p.advance();
    assert_eq!(faulty.completions.load(SeqCst), 1);
    assert_eq!(faulty.expirations.load(SeqCst), 1);
    assert_eq!(p.delayed(), 0);
    p.check_invariants();
}

#[test]
fn a_panic_in_one_on_complete_completes_it_and_the_check_goes_on() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let faulty = seen(0);
    faulty.panic_on_complete.store(true, SeqCst);
    let other = seen(0);
    let h = watch(&p, &faulty, &["k"]).unwrap();
    watch(&p, &other, &["k"]).unwrap();
    faulty.ready.store(true, SeqCst);
    other.ready.store(true, SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| p.check_and_complete(&"k"))).is_err());
    assert!(h.is_completed(), "on_complete ran: the operation completed");
    assert_eq!(faulty.completions.load(SeqCst), 1);
    assert_eq!(faulty.drops.load(SeqCst), 1, "and was dropped");
    assert_eq!(other.completions.load(SeqCst), 1);
    let st = p.stats();
    assert_eq!((st.completed, st.delayed, st.handed_back), (2, 0, 0));
    // Every entry of the list completed: the check swept the key despite the panic.
    assert_eq!(p.watched(), 0);
    clock.advance(TIMEOUT * 2);
    p.advance();
    assert_eq!(faulty.completions.load(SeqCst), 1, "never completed twice");
    assert_eq!(faulty.expirations.load(SeqCst), 0);
    p.check_invariants();
}

/// Watchers, a checker and expiry at once, with operations that panic at their first, second
/// or third try: every operation whose watch did not panic completes exactly once, every one is
/// dropped exactly once, and the counters balance.
#[test]
fn panicking_operations_under_contention_keep_exactly_once_and_the_counts() {
    const N: usize = 2_000;
    const KEYS: u32 = 8;
    let clock = ManualClock::new(0);
    let p = Arc::new(
        Purgatory::<u32, Faulty>::builder()
            .clock(clock.clone())
            .reaper(false)
            .purge_interval(16)
            .build(),
    );
    // Operation i panics at try 1 or 2 (in its watch) or 3 (its first check, or its watch's
    // second try if it is already ready), one in seven; the even ones are made ready.
    let seen: Arc<Vec<Arc<Seen>>> = Arc::new(
        (0..N)
            .map(|i| seen(if i % 7 == 0 { 1 + i % 3 } else { 0 }))
            .collect(),
    );
    let keys = |i: usize| [i as u32 % KEYS, (i as u32 + 1) % KEYS];
    let watch_panicked: Arc<Vec<AtomicBool>> =
        Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
    let watchers: Vec<_> = (0..2)
        .map(|t| {
            let (p, seen, panicked) = (p.clone(), seen.clone(), watch_panicked.clone());
            std::thread::spawn(move || {
                for i in (t..N).step_by(2) {
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        p.try_complete_else_watch(Faulty(seen[i].clone()), TIMEOUT, &keys(i))
                    }));
                    match r {
                        Ok(w) => assert!(w.is_ok()),
                        Err(_) => panicked[i].store(true, SeqCst),
                    }
                }
            })
        })
        .collect();
    let checker = {
        let (p, seen) = (p.clone(), seen.clone());
        std::thread::spawn(move || {
            for round in 0..40 {
                for i in (0..N).filter(|i| i % 2 == 0 && i % 40 == round) {
                    seen[i].ready.store(true, SeqCst);
                }
                for k in 0..KEYS {
                    let _ = catch_unwind(AssertUnwindSafe(|| p.check_and_complete(&k)));
                }
            }
        })
    };
    for t in watchers {
        t.join().unwrap();
    }
    checker.join().unwrap();
    // Whatever is left pending expires.
    clock.advance(TIMEOUT * 2);
    p.advance();
    p.check_invariants();
    assert!(p.shutdown().is_empty(), "nothing left pending");
    let st = p.stats();
    let panicked = watch_panicked.iter().filter(|b| b.load(SeqCst)).count();
    assert!(panicked > 0);
    assert_eq!(st.accepted, N as u64);
    assert_eq!(st.handed_back, panicked as u64);
    assert_eq!(st.completed + st.handed_back, N as u64);
    assert_eq!(st.delayed, 0);
    for (i, s) in seen.iter().enumerate() {
        let expected = usize::from(!watch_panicked[i].load(SeqCst));
        assert_eq!(s.completions.load(SeqCst), expected, "operation {i}");
        assert_eq!(s.drops.load(SeqCst), 1, "operation {i} dropped once");
    }
}

/// A manual clock that panics while `broken` is set (clocks must not panic; the purgatory still
/// promises what such a panic does).
#[derive(Debug, Clone)]
struct BreakableClock {
    inner: ManualClock,
    broken: Arc<AtomicBool>,
}

impl system_timer::Clock for BreakableClock {
    fn now_ns(&self) -> u64 {
        assert!(!self.broken.load(SeqCst), "the clock panics");
        self.inner.now_ns()
    }
    fn sleep_for(&self, _deadline_ns: u64) -> Option<Duration> {
        None
    }
}

#[test]
fn a_clock_panic_while_a_completion_schedules_its_purge_comes_after_on_complete() {
    let broken = Arc::new(AtomicBool::new(false));
    let clock = BreakableClock {
        inner: ManualClock::new(0),
        broken: broken.clone(),
    };
    // Every completion of a watched operation makes a purge due, which is scheduled on the timer
    // (an add, which reads the clock).
    let p: Purgatory<&'static str, Faulty> = Purgatory::builder()
        .clock(clock)
        .reaper(false)
        .purge_interval(1)
        .build();
    let first = seen(0);
    let _h = watch(&p, &first, &["k"]).expect("watched");
    first.ready.store(true, SeqCst);
    broken.store(true, SeqCst);
    let checked = catch_unwind(AssertUnwindSafe(|| p.check_and_complete(&"k")));
    broken.store(false, SeqCst);
    assert!(checked.is_err(), "the clock's panic goes on to the caller");
    // The operation completed: `on_complete` ran once, and the payload is gone.
    assert_eq!(first.completions.load(SeqCst), 1);
    assert_eq!(first.drops.load(SeqCst), 1);
    let st = p.stats();
    assert_eq!(
        (st.completed, st.handed_back, st.delayed),
        (1, 0, 0),
        "{st:?}"
    );

    // The failed scheduling left no purge marked scheduled with no task behind it (which a
    // reaper would never run): the next completion adds the purge's task to the timer, and the
    // next advance runs it and sweeps both cells.
    let second = seen(0);
    let _h2 = watch(&p, &second, &["k"]).expect("watched");
    second.ready.store(true, SeqCst);
    let scheduled = p.timer().stats().scheduled;
    assert_eq!(p.check_and_complete(&"k"), 1);
    assert_eq!(
        p.timer().stats().scheduled,
        scheduled + 1,
        "the purge's task"
    );
    p.advance();
    let st = p.stats();
    assert_eq!((st.completed, st.purges, st.watched), (2, 1, 0), "{st:?}");
}

/// A key whose drop panics once `bomb` is set (the first drop after that only).
#[derive(Clone, Debug)]
struct BombKey {
    id: u32,
    bomb: Arc<AtomicBool>,
}

impl PartialEq for BombKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for BombKey {}

impl std::hash::Hash for BombKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}

impl Drop for BombKey {
    fn drop(&mut self) {
        if self.bomb.swap(false, SeqCst) {
            panic!("a key's drop panics");
        }
    }
}

#[test]
fn a_panic_in_a_key_drop_during_shutdown_still_hands_every_operation_back() {
    let clock = ManualClock::new(0);
    let p: Purgatory<BombKey, Faulty> = Purgatory::builder()
        .clock(clock)
        .reaper(false)
        .shards(2)
        .build();
    let bomb = Arc::new(AtomicBool::new(false));
    let all: Vec<Arc<Seen>> = (0..8).map(|_| seen(0)).collect();
    for (id, s) in (0..).zip(&all) {
        let key = BombKey {
            id,
            bomb: bomb.clone(),
        };
        let w = p.try_complete_else_watch(Faulty(s.clone()), TIMEOUT, &[key]);
        assert!(!w.expect("watched").completed);
    }
    bomb.store(true, SeqCst);
    let first = catch_unwind(AssertUnwindSafe(|| p.shutdown().len()));
    assert!(first.is_err(), "the key's panic goes on to the caller");
    assert!(
        !bomb.load(SeqCst),
        "a key was dropped after the bomb was set"
    );
    // Every operation was handed back (and dropped with the panic), none completed, and the
    // own timer is shut down.
    let st = p.stats();
    assert_eq!(
        (
            st.handed_back,
            st.completed,
            st.delayed,
            st.keys,
            st.watched
        ),
        (8, 0, 0, 0, 0),
        "{st:?}"
    );
    for s in &all {
        assert_eq!(s.completions.load(SeqCst), 0);
        assert_eq!(s.drops.load(SeqCst), 1);
    }
    assert!(p.timer().is_shutdown());
    assert!(p.shutdown().is_empty(), "idempotent");
}
