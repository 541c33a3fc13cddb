//! Points of `shared/reference/kafka-semantics.md` (§6 bug history, §7 subtle points) that the
//! other suites did not pin down, each checked deterministically (a manual clock wherever time
//! matters). Each test names the point it guards.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std threads and locks in tests

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{threads_named, wait_for_threads_to_end};

use purgatory::{DelayedOperation, OperationHandle, Purgatory};
use system_timer::{ManualClock, SystemTimer};

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(3600);

/// Ready once its flag is set; records the name of the thread its expiry ran on.
struct Op {
    ready: Arc<AtomicBool>,
    expired_on: Arc<Mutex<Option<String>>>,
    /// Panics in `on_expiration` (after recording the thread).
    panic_on_expiry: bool,
}

impl Op {
    fn new() -> Self {
        Op {
            ready: Arc::default(),
            expired_on: Arc::default(),
            panic_on_expiry: false,
        }
    }
}

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        self.ready.load(SeqCst)
    }
    fn on_complete(&mut self) {}
    fn on_expiration(&mut self) {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        *self.expired_on.lock().unwrap() = Some(name);
        assert!(
            !self.panic_on_expiry,
            "on_expiration panics (as the test asks)"
        );
    }
}

/// Watches `n` never-ready operations on `keys`; returns their handles and ready flags.
fn watch(
    p: &Purgatory<&'static str, Op>,
    n: usize,
    keys: &[&'static str],
) -> Vec<(OperationHandle<Op>, Arc<AtomicBool>)> {
    (0..n)
        .map(|_| {
            let op = Op::new();
            let ready = op.ready.clone();
            let w = p.try_complete_else_watch(op, LONG, keys).unwrap();
            assert!(!w.completed);
            (w.handle, ready)
        })
        .collect()
}

/// §7 item 14 (purge trigger): Kafka's trigger is `estimated − numDelayed > purgeInterval` with
/// `numDelayed` the *timer's* size, so a purgatory sharing its timer with unrelated tasks (or
/// with another purgatory) sees a skewed trigger: the unrelated tasks count as "delayed" and the
/// purge waits for ever. Here `delayed()` and the purge trigger count only this purgatory's
/// armed operations.
///
/// Catches: the trigger (or `delayed()`) reading the shared timer's `len()`: the purge below
/// never becomes due (1,000 unrelated tasks plus the other purgatory's 50 outnumber the garbage).
#[test]
fn a_shared_timer_with_unrelated_tasks_does_not_skew_delayed_or_the_purge_trigger() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(
        SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .inline()
            .build(),
    );
    for _ in 0..1_000 {
        timer.add(LONG, || ()).unwrap();
    }
    let other: Purgatory<&'static str, Op> = Purgatory::builder()
        .timer(Arc::clone(&timer))
        .purge_interval(10)
        .build();
    let _others = watch(&other, 50, &["x"]);
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .timer(Arc::clone(&timer))
        .purge_interval(10)
        .build();
    let ops = watch(&p, 20, &["a", "b"]);
    assert_eq!(p.delayed(), 20, "only this purgatory's armed operations");
    assert_eq!(other.delayed(), 50);
    assert_eq!(timer.len(), 1_070);
    // No key checked: the purge is due once the garbage reaches the interval (10) and the
    // operations still delayed. 12 forced: 12 ≥ 10 and 12 ≥ 8 delayed.
    for (h, _) in &ops[..12] {
        assert!(h.force_complete());
    }
    assert_eq!(p.delayed(), 8);
    timer.advance(); // runs the purge task the 12th completion scheduled
    assert_eq!(
        p.stats().purges,
        1,
        "the unrelated tasks held the purge back"
    );
    assert_eq!(
        p.watched(),
        16,
        "8 pending on a and b; the 24 empty cells swept"
    );
    assert_eq!(other.stats().purges, 0);
    p.check_invariants();
    other.check_invariants();
}

/// §7 item 12 ("count the op once in `estimatedTotalOperations`", not once per key) and §7
/// item 14 (the interval): an operation watched on three keys counts once towards the purge,
/// so with an interval of 10 the purge becomes due at the 10th completed operation (our rule is
/// "completed watched operations since the last purge reach the interval", documented on
/// `Builder::purge_interval`; Kafka's is `estimated − numDelayed > interval`, one later), and
/// not at the 4th, as counting per key would make it.
///
/// Catches: garbage counted per watch-list entry (per key) instead of per operation.
#[test]
fn the_purge_counts_an_operation_once_however_many_keys_it_watches() {
    let clock = ManualClock::new(0);
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .purge_interval(10)
        .build();
    let ops = watch(&p, 40, &["a", "b", "c"]);
    assert_eq!(p.watched(), 120);
    // Completed one at a time through checks of "a" (so keys are being checked: the interval
    // alone decides).
    for (i, (_, ready)) in ops[..9].iter().enumerate() {
        ready.store(true, SeqCst);
        assert_eq!(p.check_and_complete(&"a"), 1);
        p.advance();
        assert_eq!(
            p.stats().purges,
            0,
            "purged after only {} operations",
            i + 1
        );
    }
    ops[9].1.store(true, SeqCst);
    assert_eq!(p.check_and_complete(&"a"), 1);
    p.advance();
    assert_eq!(
        p.stats().purges,
        1,
        "10 completed operations: the purge is due"
    );
    assert_eq!(
        p.watched(),
        90,
        "30 pending on each key, every empty cell swept"
    );
    p.check_invariants();
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(MS);
    }
}

/// §6 KAFKA-19386 (a regression gave every reaper thread a `null` purgatory name) and
/// KAFKA-16477 (a reaper thread leaked because its timer was never closed): a purgatory's own
/// reaper thread is named after the purgatory, it runs the expiries (default: no expiry
/// threads), and dropping the purgatory joins it. The reaper follows a manual clock, so the
/// expiry happens exactly when the test moves the clock.
///
/// Catches: a reaper named after anything but the purgatory (e.g. the builder's default name);
/// a purgatory whose drop does not shut its own timer down (the thread outlives it).
#[test]
fn the_own_reaper_is_named_after_the_purgatory_and_joined_when_it_is_dropped() {
    let clock = ManualClock::new(0);
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .name("pgjoin")
        .clock(clock.clone())
        .build();
    wait_until("the reaper names itself", || threads_named("pgjoin-") == 1);
    let op = Op::new();
    let expired_on = op.expired_on.clone();
    let w = p.try_complete_else_watch(op, 10 * MS, &["k"]).unwrap();
    clock.advance(9 * MS);
    std::thread::sleep(20 * MS);
    assert!(!w.handle.is_completed(), "expired before its timeout");
    clock.advance(MS);
    wait_until("the expiry", || expired_on.lock().unwrap().is_some());
    assert_eq!(
        expired_on.lock().unwrap().as_deref(),
        Some("pgjoin-reaper"),
        "the expiry ran on the purgatory's own reaper"
    );
    drop(p);
    // A joined thread's /proc entry may linger a moment; one that outlived the purgatory stays.
    wait_for_threads_to_end("pgjoin-");
}

/// §7 item 9 ("task panics must not kill the timer, and the reaper loop must survive errors;
/// Kafka's does not") and §6's structural limit "a reaper that dies on a throwable stops all
/// expiry silently", through the purgatory: by default its own reaper runs the expiries itself
/// (no expiry threads), so an operation whose `on_expiration` panics panics on the reaper. The
/// panic is caught and counted, the operation counts as completed and expired once, and later
/// operations still expire, on the same reaper.
///
/// Catches: a task run without catching its panic (the reaper thread dies: the second
/// operation never expires).
#[test]
fn an_expiry_that_panics_on_the_own_reaper_does_not_stop_later_expiries() {
    let clock = ManualClock::new(0);
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .name("pgpanic")
        .clock(clock.clone())
        .build();
    let faulty = Op {
        panic_on_expiry: true,
        ..Op::new()
    };
    let faulty_on = faulty.expired_on.clone();
    let a = p.try_complete_else_watch(faulty, 5 * MS, &["k"]).unwrap();
    let later = Op::new();
    let later_on = later.expired_on.clone();
    let b = p.try_complete_else_watch(later, 10 * MS, &["k"]).unwrap();
    clock.advance(5 * MS);
    wait_until("the panicking expiry", || {
        faulty_on.lock().unwrap().is_some()
    });
    assert!(a.handle.is_completed() && !b.handle.is_completed());
    assert_eq!(faulty_on.lock().unwrap().as_deref(), Some("pgpanic-reaper"));
    clock.advance(5 * MS);
    let t0 = Instant::now();
    while later_on.lock().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            // A dead reaper leaves the timer mid-advance: its shutdown (the purgatory's drop)
            // would wait for ever. Leak it, so that the test fails instead of hanging.
            std::mem::forget(p);
            panic!("the later operation never expired: the reaper died with the panic");
        }
        std::thread::sleep(MS);
    }
    assert_eq!(later_on.lock().unwrap().as_deref(), Some("pgpanic-reaper"));
    assert!(b.handle.is_completed());
    let st = p.stats();
    assert_eq!((st.completed, st.expired, st.delayed), (2, 2, 0));
    let panicked = p.timer().stats().panicked;
    if panicked != 1 {
        // An uncaught task panic that something further out stopped (the reaper's own guard)
        // leaves the advance it escaped from unfinished: the shutdown would wait for ever.
        std::mem::forget(p);
        panic!("the expiry's panic was not caught and counted (panicked = {panicked})");
    }
    p.check_invariants();
}

/// §6 structural limit / §7 item 5 ("`Long.MAX_VALUE` delays overflow and fire at once"; Netty
/// #7760, Akka #867): an operation given `Duration::MAX` as its timeout, added when the clock
/// is well past zero (so `now + timeout` overflows), saturates to "never": it stays delayed
/// however far the clock moves and completes only by a check, never by expiry.
///
/// Catches: a deadline that overflows to a past time (Kafka's `delayMs + now` wrapping
/// negative), which expires the operation at the first advance.
#[test]
fn a_duration_max_timeout_never_expires() {
    let clock = ManualClock::new(1_000);
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .build();
    let op = Op::new();
    let (ready, expired_on) = (op.ready.clone(), op.expired_on.clone());
    let w = p
        .try_complete_else_watch(op, Duration::MAX, &["k"])
        .unwrap();
    p.advance();
    clock.advance(Duration::from_secs(365 * 24 * 3600));
    p.advance();
    assert!(!w.handle.is_completed(), "a Duration::MAX timeout expired");
    assert_eq!((p.delayed(), p.stats().expired), (1, 0));
    ready.store(true, SeqCst);
    assert_eq!(p.check_and_complete(&"k"), 1);
    assert!(expired_on.lock().unwrap().is_none());
    assert_eq!(p.delayed(), 0);
    p.check_invariants();
}
