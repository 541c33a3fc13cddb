//! Tests ported from Apache Kafka's `DelayedOperationTest` and rewritten for the `purgatory`
//! crate (with `system-timer`'s `ManualClock` for everything timing-related).
//!
//! Source:
//!   - ported from Apache Kafka's DelayedOperationTest (server-common, trunk 2025):
//!     `server-common/src/test/java/org/apache/kafka/server/purgatory/DelayedOperationTest.java`
//!     in <https://github.com/apache/kafka>
//!   - the semantics they rely on: `shared/reference/kafka-semantics.md` §2 and §7 items 12–18
//!
//! Copyright & License:
//!   - Copyright The Apache Software Foundation
//!   - Apache License, Version 2.0: <https://www.apache.org/licenses/LICENSE-2.0>
//!
//! Ported (Kafka test → test here):
//!   - `testRequestSatisfaction` → [`request_satisfaction`]
//!   - `testRequestExpiry` → [`request_expiry`] (on a manual clock: expires at the timeout, not a
//!     millisecond before; the other request does not)
//!   - `testRequestPurge` → [`request_purge`] (the Kafka sequence: completed by force, then each
//!     key's check sweeps its list) and [`purge_sweeps_completed_operations_from_every_key`]
//!     (the reaper's purge, called directly)
//!   - `shouldCancelForKeyReturningCancelledOperations` →
//!     [`cancel_for_key_returns_the_cancelled_operations`]
//!   - `shouldReturnNilOperationsOnCancelForKeyWhenKeyDoesntExist` →
//!     [`cancel_for_key_of_an_unknown_key_returns_nothing`]
//!   - `testTryCompleteWithMultipleThreads` → [`try_complete_with_multiple_threads`]
//!   - `testSafeTryCompleteOrElse` → [`try_complete_else_watch_is_safe_try_complete_or_else`]
//!   - `testLockInTryCompleteElseWatch` → [`second_try_runs_under_the_same_lock_hold`] and
//!     [`a_check_during_the_watch_waits_for_the_second_try`] (the lock is held across the watch)
//!   - the deleted `testTryCompleteLockContention`, with the semantics Kafka has had since
//!     KAFKA-8334 (a check *blocks* on the operation's lock and re-evaluates; it never skips a
//!     locked operation) → [`check_blocks_on_the_op_lock_and_re_evaluates`]
//!   - "tryComplete is not called after completion" and "onComplete never runs concurrently with
//!     tryComplete" (KAFKA-17848 / KAFKA-17948 / KAFKA-18022 / KAFKA-19312) →
//!     [`try_complete_is_not_called_after_completion`] and
//!     [`completion_never_overlaps_try_complete_under_contention`]
//!
//! Not ported: the tryLock-era tests Kafka deleted (`testDelayedOperationLock*`,
//! `testTryCompleteLockContention` as written: they expect a contended check to skip the
//! operation, kafka-semantics.md §7 item 18); `DelayedFuturePurgatoryTest` (out of scope); the
//! `safeTryComplete` override of `testLockInTryCompleteElseWatch` (this crate has no user-callable
//! `safeTryComplete` to bypass).
//!
//! API mapping (Kafka → here):
//!   - `new DelayedOperationPurgatory<>("mock", 0)` → `Purgatory::builder().clock(manual clock)
//!     .reaper(false).build()`, driven by `Purgatory::advance` after moving the clock (Kafka's
//!     reaper calls `advanceClock`); real threads and the own reaper only in the contention tests
//!   - `MockKey("test1")` → `&'static str` / `String` keys
//!   - `new MockDelayedOperation(delayMs)` → [`MockOp`], with the timeout given to
//!     `try_complete_else_watch(op, timeout, keys)` instead of the operation's constructor
//!   - `tryComplete() { if (completable) return forceComplete(); ... }` → `try_complete()`
//!     returns whether it is completable; the purgatory completes it (and calls `on_complete`)
//!   - test code calling `op.tryComplete()` / `op.forceComplete()` directly →
//!     `OperationHandle::force_complete()`; `op.isCompleted()` → `OperationHandle::is_completed()`
//!   - `tryCompleteElseWatch(op, keys): boolean` → `try_complete_else_watch(..)?.completed`
//!   - `checkAndComplete`, `cancelForKey`, `watched()`, `numDelayed()` → `check_and_complete`,
//!     `cancel_for_key` (handles, not the operations), `watched()`, `delayed()`
//!   - `safeTryCompleteOrElse(f)` → not public: `try_complete_else_watch` is it, with `f` =
//!     "watch on every key"; observed through the tries and the watch counts
//!   - the `ScheduledExecutorService` of 20 threads and `Future.get()` → 20 std threads taking
//!     the scheduled attempts from a shared queue, joined with a hang watchdog
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std threads and time in tests

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kafka_timer::rng::SplitMix64;
use purgatory::{DelayedOperation, OperationHandle, Purgatory, Watched};
use system_timer::ManualClock;

const MS: Duration = Duration::from_millis(1);
/// How long a contention test may take before it counts as hung (they take well under a
/// second; a lost completion or a deadlock makes them wait forever).
const HANG: Duration = Duration::from_secs(60);

/// What a [`MockOp`] saw: counts of each call, and any broken rule.
#[derive(Debug, Default)]
struct Calls {
    tries: AtomicUsize,
    completes: AtomicUsize,
    expirations: AtomicUsize,
    /// `try_complete` after `on_complete`, two methods overlapping, `on_expiration` without
    /// `on_complete` first: counted, not panicked (the timer catches a panic on its thread; the
    /// contention test checks its count).
    violations: AtomicUsize,
    inside: AtomicBool,
    completed: AtomicBool,
}

/// The test's side of a [`MockOp`] (Kafka's `MockDelayedOperation`, which the test holds
/// itself): the `completable` flag and the call counts.
#[derive(Clone, Debug, Default)]
struct Mock {
    completable: Arc<AtomicBool>,
    calls: Arc<Calls>,
}

/// A hook run inside `try_complete` (after `completable` was read), with the call's number.
type Hook = Box<dyn FnMut(usize) + Send>;

/// Kafka's `MockDelayedOperation`: completable once the flag is set. Every call is counted and
/// checked against the purgatory's rules.
struct MockOp {
    mock: Mock,
    hook: Option<Hook>,
}

impl Mock {
    fn op(&self) -> MockOp {
        MockOp {
            mock: self.clone(),
            hook: None,
        }
    }
    /// An operation whose `try_complete` runs `hook(call number)` after reading the flag (as
    /// Kafka's `TestDelayOperation` reads `completable`, then sleeps, then answers).
    fn op_with(&self, hook: impl FnMut(usize) + Send + 'static) -> MockOp {
        MockOp {
            mock: self.clone(),
            hook: Some(Box::new(hook)),
        }
    }
    fn set_completable(&self) {
        self.completable.store(true, SeqCst);
    }
    fn tries(&self) -> usize {
        self.calls.tries.load(SeqCst)
    }
    fn completes(&self) -> usize {
        self.calls.completes.load(SeqCst)
    }
    fn expirations(&self) -> usize {
        self.calls.expirations.load(SeqCst)
    }
    fn violations(&self) -> usize {
        self.calls.violations.load(SeqCst)
    }
}

impl MockOp {
    fn enter(&self) {
        if self.mock.calls.inside.swap(true, SeqCst) {
            self.mock.calls.violations.fetch_add(1, SeqCst);
        }
    }
    fn leave(&self) {
        self.mock.calls.inside.store(false, SeqCst);
    }
}

impl DelayedOperation for MockOp {
    fn try_complete(&mut self) -> bool {
        self.enter();
        let calls = &self.mock.calls;
        if calls.completed.load(SeqCst) {
            calls.violations.fetch_add(1, SeqCst); // KAFKA-17848: tried after completion
        }
        let n = calls.tries.fetch_add(1, SeqCst);
        let completable = self.mock.completable.load(SeqCst);
        if let Some(hook) = &mut self.hook {
            hook(n);
        }
        self.leave();
        completable
    }
    fn on_complete(&mut self) {
        self.enter();
        let calls = &self.mock.calls;
        if calls.completed.swap(true, SeqCst) {
            calls.violations.fetch_add(1, SeqCst);
        }
        calls.completes.fetch_add(1, SeqCst);
        self.leave();
    }
    fn on_expiration(&mut self) {
        self.enter();
        let calls = &self.mock.calls;
        if !calls.completed.load(SeqCst) {
            calls.violations.fetch_add(1, SeqCst);
        }
        calls.expirations.fetch_add(1, SeqCst);
        self.leave();
    }
}

/// Kafka's `setUp`, made deterministic: a purgatory whose own timer runs on `clock` and is
/// driven by `advance`.
fn purgatory<K>(clock: &ManualClock) -> Purgatory<K, MockOp>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    Purgatory::builder()
        .name("mock")
        .clock(clock.clone())
        .reaper(false)
        .build()
}

/// `tryCompleteElseWatch`, which must accept the operation.
fn watch<K>(p: &Purgatory<K, MockOp>, op: MockOp, timeout: Duration, keys: &[K]) -> Watched<MockOp>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    p.try_complete_else_watch(op, timeout, keys)
        .expect("the purgatory accepts the operation")
}

/// Kafka's `numDelayed()`, which is its timer's size: the purgatory's count of armed operations,
/// checked against the entries its timer still holds (a completion must remove its entry, not
/// only the count).
fn num_delayed<K>(p: &Purgatory<K, MockOp>) -> usize
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let delayed = p.delayed();
    assert_eq!(
        delayed,
        p.timer().len(),
        "delayed() disagrees with the timer's entries"
    );
    delayed
}

/// Spawns `f` and returns once its thread has gone to sleep (Linux: its `/proc` state is `S` or
/// `D`: blocked, here on a lock it must wait for) or has ended, so that a test's "it is still
/// waiting" is checked while the thread really waits, not before it has started (a fixed sleep
/// let a thread scheduled late pass such a check without reaching the wait).
fn spawn_until_blocked<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        tx.send(std::fs::read_link("/proc/thread-self").ok())
            .unwrap();
        f()
    });
    let me = rx.recv_timeout(HANG).expect("the thread never started");
    let t0 = Instant::now();
    while let Some(stat) = me
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p.join("stat")).ok())
    {
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
        if matches!(state, Some("S" | "D")) || t.is_finished() {
            break;
        }
        assert!(t0.elapsed() < HANG, "the thread never blocked");
        thread::sleep(Duration::from_millis(1));
    }
    t
}

/// Joins `threads`, failing (instead of hanging the suite) if they have not all finished
/// within [`HANG`].
fn join_all<T>(threads: Vec<JoinHandle<T>>, what: &str) -> Vec<T> {
    let t0 = Instant::now();
    while !threads.iter().all(JoinHandle::is_finished) {
        assert!(t0.elapsed() < HANG, "{what}: hung for {HANG:?}");
        thread::sleep(MS);
    }
    threads
        .into_iter()
        .map(|t| t.join().expect("thread panicked"))
        .collect()
}

/// Waits until `cond` holds, failing after [`HANG`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < HANG, "hung waiting for {what}");
        thread::sleep(Duration::from_micros(100));
    }
}

/// `testRequestSatisfaction`: a check completes only the operations that are completable, once.
#[test]
fn request_satisfaction() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let (r1, r2) = (Mock::default(), Mock::default());
    assert_eq!(
        p.check_and_complete(&"test1"),
        0,
        "With no waiting requests, nothing should be satisfied"
    );
    let w1 = watch(&p, r1.op(), 100_000 * MS, &["test1"]);
    assert!(!w1.completed, "r1 not satisfied and hence watched");
    assert_eq!(p.check_and_complete(&"test1"), 0, "Still nothing satisfied");
    let w2 = watch(&p, r2.op(), 100_000 * MS, &["test2"]);
    assert!(!w2.completed, "r2 not satisfied and hence watched");
    assert_eq!(p.check_and_complete(&"test2"), 0, "Still nothing satisfied");
    r1.set_completable();
    assert_eq!(p.check_and_complete(&"test1"), 1, "r1 satisfied");
    assert_eq!(p.check_and_complete(&"test1"), 0, "Nothing satisfied");
    r2.set_completable();
    assert_eq!(p.check_and_complete(&"test2"), 1, "r2 satisfied");
    assert_eq!(p.check_and_complete(&"test2"), 0, "Nothing satisfied");

    assert!(w1.handle.is_completed() && w2.handle.is_completed());
    for r in [&r1, &r2] {
        assert_eq!((r.completes(), r.expirations(), r.violations()), (1, 0, 0));
    }
    assert_eq!((p.delayed(), p.watched()), (0, 0));
    p.check_invariants();
}

/// `testRequestExpiry`, on the manual clock: r1 (timeout 20 ms) expires once the clock reaches
/// 20 ms and not before, with `on_complete` then `on_expiration`; r2 (200 000 ms) does not.
#[test]
fn request_expiry() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let expiration = 20;
    let (r1, r2) = (Mock::default(), Mock::default());
    let w1 = watch(&p, r1.op(), expiration * MS, &["test1"]);
    assert!(!w1.completed, "r1 not satisfied and hence watched");
    let w2 = watch(&p, r2.op(), 200_000 * MS, &["test2"]);
    assert!(!w2.completed, "r2 not satisfied and hence watched");
    assert_eq!(p.delayed(), 2);

    for t in [1, 10, 19] {
        clock.set_ms(t);
        assert_eq!(p.advance(), 0, "something expired at {t} ms");
        assert!(!w1.handle.is_completed(), "r1 expired early, at {t} ms");
    }
    clock.set_ms(20);
    assert_eq!(p.advance(), 1);
    assert!(w1.handle.is_completed(), "r1 completed due to expiration");
    assert!(!w2.handle.is_completed(), "r2 hasn't completed");
    assert_eq!(
        (r1.completes(), r1.expirations(), r1.violations()),
        (1, 1, 0)
    );
    assert_eq!((r2.completes(), r2.expirations()), (0, 0));
    assert_eq!(p.delayed(), 1);
    assert_eq!(p.stats().expired, 1);

    // A check after the expiry neither completes r1 again nor asks it whether it is ready.
    r1.set_completable();
    let tries = r1.tries();
    assert_eq!(p.check_and_complete(&"test1"), 0);
    assert_eq!((r1.tries(), r1.completes()), (tries, 1));
    p.check_invariants();
}

/// `testRequestPurge`: three operations watched on one, two and three keys; two are completed
/// directly (Kafka's `r.tryComplete()` → `forceComplete`), which removes their timer entries at
/// once; each key's check then drops the completed entries from that key's list only.
#[test]
fn request_purge() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let (r1, r2, r3) = (Mock::default(), Mock::default(), Mock::default());
    let _w1 = watch(&p, r1.op(), 100_000 * MS, &["test1"]);
    let w2 = watch(&p, r2.op(), 100_000 * MS, &["test1", "test2"]);
    let w3 = watch(&p, r3.op(), 100_000 * MS, &["test1", "test2", "test3"]);

    assert_eq!(
        num_delayed(&p),
        3,
        "Purgatory should have 3 total delayed operations"
    );
    assert_eq!(p.watched(), 6, "Purgatory should have 6 watched elements");

    // Complete the operations: they leave the timer immediately.
    r2.set_completable();
    assert!(w2.handle.force_complete());
    assert_eq!(
        num_delayed(&p),
        2,
        "Purgatory should have 2 total delayed operations"
    );
    r3.set_completable();
    assert!(w3.handle.force_complete());
    assert_eq!(
        num_delayed(&p),
        1,
        "Purgatory should have 1 total delayed operations"
    );
    assert_eq!(p.watched(), 6, "completed entries stay until swept");

    // Checking a watch should purge the watch list.
    assert_eq!(p.check_and_complete(&"test1"), 0, "already completed");
    assert_eq!(p.watched(), 4, "Purgatory should have 4 watched elements");
    assert_eq!(p.check_and_complete(&"test2"), 0);
    assert_eq!(p.watched(), 2, "Purgatory should have 2 watched elements");
    assert_eq!(p.check_and_complete(&"test3"), 0);
    assert_eq!(p.watched(), 1, "Purgatory should have 1 watched elements");

    assert_eq!(r1.completes() + r2.completes() + r3.completes(), 2);
    assert_eq!(
        r2.tries() + r3.tries(),
        4,
        "never asked again once completed"
    );
    assert_eq!(p.stats().keys, 1, "emptied keys are dropped");
    p.check_invariants();
}

/// Kafka's reaper purge (`purgeCompleted` on every key), called directly: completed entries
/// leave every key's list, pending ones stay, emptied keys are dropped.
#[test]
fn purge_sweeps_completed_operations_from_every_key() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let (r1, r2, r3) = (Mock::default(), Mock::default(), Mock::default());
    let w1 = watch(&p, r1.op(), 100_000 * MS, &["test1"]);
    let w2 = watch(&p, r2.op(), 100_000 * MS, &["test1", "test2"]);
    let w3 = watch(&p, r3.op(), 100_000 * MS, &["test1", "test2", "test3"]);
    assert!(w2.handle.force_complete() && w3.handle.force_complete());
    assert_eq!((p.watched(), p.stats().keys), (6, 3));

    assert_eq!(p.purge(), 5, "r2's two entries and r3's three");
    assert_eq!((p.watched(), p.stats().keys), (1, 1), "r1 on test1 only");
    assert_eq!(p.delayed(), 1);
    assert!(!w1.handle.is_completed());
    r1.set_completable();
    assert_eq!(p.check_and_complete(&"test1"), 1);
    assert_eq!((p.watched(), p.stats().keys, p.delayed()), (0, 0, 0));
    p.check_invariants();
}

/// `shouldCancelForKeyReturningCancelledOperations`: two operations on test1, one on test2;
/// cancelling test1 returns the two (not completed), disarms their timers (they never expire)
/// and leaves test2's.
#[test]
fn cancel_for_key_returns_the_cancelled_operations() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let mocks: Vec<Mock> = (0..3).map(|_| Mock::default()).collect();
    watch(&p, mocks[0].op(), 10_000 * MS, &["test1"]);
    watch(&p, mocks[1].op(), 10_000 * MS, &["test1"]);
    let w = watch(&p, mocks[2].op(), 10_000 * MS, &["test2"]);

    let cancelled: Vec<OperationHandle<MockOp>> = p.cancel_for_key(&"test1");
    assert_eq!(cancelled.len(), 2);
    assert_eq!(num_delayed(&p), 1);
    assert_eq!(p.watched(), 1);
    assert!(
        cancelled.iter().all(|h| !h.is_completed()),
        "cancelled, not completed"
    );

    clock.set_ms(20_000);
    assert_eq!(p.advance(), 1, "only test2's operation expires");
    assert!(w.handle.is_completed());
    assert_eq!(
        mocks[0].completes() + mocks[1].completes(),
        0,
        "a cancelled operation expired"
    );
    assert_eq!(mocks[2].expirations(), 1);
    p.check_invariants();
}

/// `shouldReturnNilOperationsOnCancelForKeyWhenKeyDoesntExist`.
#[test]
fn cancel_for_key_of_an_unknown_key_returns_nothing() {
    let clock = ManualClock::new(0);
    let p = purgatory::<&str>(&clock);
    assert!(p.cancel_for_key(&"test1").is_empty());
}

/// `testTryCompleteWithMultipleThreads`: 100 operations, each watched on its own key, and 20
/// completion attempts per operation run on 20 threads in random order after random delays.
/// The last attempt on each operation makes it completable, then checks its key; `try_complete`
/// reads the flag first and then sleeps (so it often answers "no" just as another thread makes
/// the operation completable). Every operation is completed, exactly once, by a check; none is
/// lost (the timeout is never reached: the clock does not move).
#[test]
fn try_complete_with_multiple_threads() {
    const THREADS: usize = 20;
    const OPS: usize = 100;
    const ATTEMPTS: usize = 20;
    const MAX_DELAY_US: u64 = 2_000;

    let clock = ManualClock::new(0);
    let p: Arc<Purgatory<String, MockOp>> = Arc::new(purgatory(&clock));
    let keys: Vec<String> = (0..OPS).map(|i| format!("key{i}")).collect();
    let mocks: Vec<Mock> = (0..OPS).map(|_| Mock::default()).collect();
    let mut handles = Vec::new();
    for (i, (mock, key)) in mocks.iter().zip(&keys).enumerate() {
        let mut rng = SplitMix64::new(i as u64);
        let op = mock.op_with(move |_| {
            thread::sleep(Duration::from_micros(rng.next() % MAX_DELAY_US));
        });
        let w = watch(&p, op, 10_000 * MS, std::slice::from_ref(key));
        assert!(!w.completed);
        handles.push(w.handle);
    }

    // The "scheduled executor": every (operation, delay) attempt, shuffled.
    let mut rng = SplitMix64::new(42);
    let mut attempts: Vec<(usize, u64)> = (0..ATTEMPTS)
        .flat_map(|_| 0..OPS)
        .map(|i| (i, rng.next() % MAX_DELAY_US))
        .collect();
    for i in (1..attempts.len()).rev() {
        attempts.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let attempts = Arc::new(attempts);
    let next = Arc::new(AtomicUsize::new(0));
    let remaining: Arc<Vec<AtomicUsize>> =
        Arc::new((0..OPS).map(|_| AtomicUsize::new(ATTEMPTS)).collect());
    let mocks = Arc::new(mocks);
    let keys = Arc::new(keys);
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (p, attempts, next, remaining, mocks, keys) = (
                p.clone(),
                attempts.clone(),
                next.clone(),
                remaining.clone(),
                mocks.clone(),
                keys.clone(),
            );
            thread::spawn(move || {
                let mut completed = 0;
                loop {
                    let j = next.fetch_add(1, SeqCst);
                    let Some(&(i, delay_us)) = attempts.get(j) else {
                        return completed;
                    };
                    thread::sleep(Duration::from_micros(delay_us));
                    if remaining[i].fetch_sub(1, SeqCst) == 1 {
                        mocks[i].set_completable();
                    }
                    completed += p.check_and_complete(&keys[i]);
                }
            })
        })
        .collect();
    let completed: usize = join_all(threads, "completion attempts").into_iter().sum();

    for (i, (mock, handle)) in mocks.iter().zip(&handles).enumerate() {
        assert!(
            handle.is_completed(),
            "Operation key{i} should have completed"
        );
        assert_eq!(mock.completes(), 1, "key{i}: on_complete exactly once");
        assert_eq!(mock.expirations(), 0, "key{i}");
        assert_eq!(mock.violations(), 0, "key{i}");
    }
    assert_eq!(completed, OPS, "the checks report each completion once");
    assert_eq!((p.delayed(), p.watched()), (0, 0));
    p.check_invariants();
}

/// The deleted `testTryCompleteLockContention`, with today's semantics (KAFKA-8334): thread A's
/// check is inside `try_complete` (holding the operation's lock; it read "not completable")
/// when the operation becomes completable and thread B checks the key. B must block on the
/// lock, not skip the operation (a skip loses the completion: KAFKA-6653), and re-evaluate once
/// A releases it: B completes the operation, A does not.
#[test]
fn check_blocks_on_the_op_lock_and_re_evaluates() {
    let clock = ManualClock::new(0);
    let p: Arc<Purgatory<&str, MockOp>> = Arc::new(purgatory(&clock));
    let mock = Mock::default();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    // Tries 0 and 1 are try_complete_else_watch's; try 2 is A's, which holds the lock until
    // released.
    let op = mock.op_with(move |n| {
        if n == 2 {
            entered_tx.send(()).unwrap();
            release_rx.recv_timeout(HANG).expect("never released");
        }
    });
    let w = watch(&p, op, 10_000 * MS, &["key"]);
    assert!(!w.completed);

    let a = {
        let p = p.clone();
        thread::spawn(move || p.check_and_complete(&"key"))
    };
    entered_rx
        .recv_timeout(HANG)
        .expect("A never reached try_complete");
    mock.set_completable();
    let b = {
        let p = p.clone();
        spawn_until_blocked(move || p.check_and_complete(&"key"))
    };
    assert!(
        !b.is_finished(),
        "B returned while A held the operation's lock: it skipped the operation"
    );
    assert_eq!(mock.tries(), 3, "B ran try_complete while A held the lock");
    release_tx.send(()).unwrap();
    let results = join_all(vec![a, b], "checks");

    assert_eq!(
        results,
        [0, 1],
        "A read 'not completable'; B re-evaluated and completed"
    );
    assert_eq!(mock.tries(), 4);
    assert!(w.handle.is_completed());
    assert_eq!((mock.completes(), mock.violations()), (1, 0));
    assert_eq!((p.delayed(), p.watched()), (0, 0));
    p.check_invariants();
}

/// `testSafeTryCompleteOrElse`: `try_complete_else_watch` is `safeTryCompleteOrElse(watch)`.
/// Not completable: tried, watched ("or else" ran), tried again, armed. Completable at the first
/// try: completed there, never watched nor armed ("or else" did not run). Completable only at
/// the second try: completed by it, watched (the entry is swept later) but never armed.
#[test]
fn try_complete_else_watch_is_safe_try_complete_or_else() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);

    let never = Mock::default();
    let w = watch(&p, never.op(), 100_000 * MS, &["a"]);
    assert!(!w.completed && !w.handle.is_completed());
    assert_eq!(never.tries(), 2, "first try, watch, second try");
    assert_eq!((p.watched(), p.delayed()), (1, 1), "watched and armed");

    let at_once = Mock::default();
    at_once.set_completable();
    let w = watch(&p, at_once.op(), 100_000 * MS, &["b"]);
    assert!(w.completed && w.handle.is_completed());
    assert_eq!((at_once.tries(), at_once.completes()), (1, 1));
    assert_eq!(
        (p.watched(), p.delayed()),
        (1, 1),
        "'or else' (the watch) did not run"
    );

    let second = Mock::default();
    let flag = second.completable.clone();
    // Becomes completable while it is being watched (between the two tries).
    let op = second.op_with(move |n| {
        if n == 0 {
            flag.store(true, SeqCst);
        }
    });
    let w = watch(&p, op, 100_000 * MS, &["c"]);
    assert!(
        w.completed,
        "the second try, under the same lock hold, completed it"
    );
    assert_eq!((second.tries(), second.completes()), (2, 1));
    assert_eq!(p.delayed(), 1, "never armed");
    assert_eq!(p.watched(), 2, "watched before the second try");
    assert_eq!(p.check_and_complete(&"c"), 0);
    assert_eq!(second.tries(), 2, "not asked again after completion");
    assert_eq!(p.watched(), 1);
    for m in [&never, &at_once, &second] {
        assert_eq!(m.violations(), 0);
    }
    p.check_invariants();
}

/// `testLockInTryCompleteElseWatch`: the second try of `try_complete_else_watch` runs under the
/// operation's lock. A check of the key that arrives during the second try (the operation is
/// watched by then) finds it, and blocks until the second try is done; it then re-evaluates
/// and completes it. `try_complete` never runs twice at once. (That the lock is also held
/// across the watch: [`a_check_during_the_watch_waits_for_the_second_try`].)
#[test]
fn second_try_runs_under_the_same_lock_hold() {
    let clock = ManualClock::new(0);
    let p: Arc<Purgatory<&str, MockOp>> = Arc::new(purgatory(&clock));
    let mock = Mock::default();
    let (in_second_tx, in_second_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let flag = mock.completable.clone();
    let op = mock.op_with(move |n| {
        if n == 1 {
            // The second try (the op is watched by now): make it completable from here on,
            // but answer with what was read before (not completable).
            flag.store(true, SeqCst);
            in_second_tx.send(()).unwrap();
            release_rx.recv_timeout(HANG).expect("never released");
        }
    });
    let watcher = {
        let p = p.clone();
        thread::spawn(move || {
            let w = watch(&p, op, 100_000 * MS, &["key"]);
            (w.completed, w.handle)
        })
    };
    in_second_rx
        .recv_timeout(HANG)
        .expect("never reached the second try");
    let checker = {
        let p = p.clone();
        spawn_until_blocked(move || p.check_and_complete(&"key"))
    };
    assert!(
        !checker.is_finished(),
        "the check did not wait for the second try"
    );
    assert_eq!(mock.tries(), 2, "try_complete ran during the second try");
    release_tx.send(()).unwrap();
    let (completed, handle) = join_all(vec![watcher], "watcher").pop().unwrap();
    let checked = join_all(vec![checker], "checker").pop().unwrap();

    assert!(!completed, "the second try read 'not completable'");
    assert_eq!(
        checked, 1,
        "the check re-evaluated after the watch released the lock"
    );
    assert!(handle.is_completed());
    assert_eq!(
        (mock.tries(), mock.completes(), mock.violations()),
        (3, 1, 0)
    );
    assert_eq!(p.delayed(), 0);
    p.check_invariants();
}

/// A key the test can stop in the middle of a watch: `try_complete_else_watch` clones each key
/// as it appends the operation to that key's list, and the first clone of a pausing key
/// signals `paused` and waits for `resume`. Equal and hashed by name only.
#[derive(Debug)]
struct PausingKey {
    name: &'static str,
    pause: Option<Arc<Pause>>,
}

#[derive(Debug)]
struct Pause {
    armed: AtomicBool,
    paused: std::sync::Mutex<mpsc::Sender<()>>,
    resume: std::sync::Mutex<mpsc::Receiver<()>>,
}

impl PausingKey {
    fn plain(name: &'static str) -> Self {
        PausingKey { name, pause: None }
    }
    /// A key whose first clone pauses; with the receiver of its `paused` signal and the sender
    /// that resumes it.
    fn pausing(name: &'static str) -> (Self, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (paused_tx, paused_rx) = mpsc::channel();
        let (resume_tx, resume_rx) = mpsc::channel();
        let pause = Pause {
            armed: AtomicBool::new(true),
            paused: std::sync::Mutex::new(paused_tx),
            resume: std::sync::Mutex::new(resume_rx),
        };
        let key = PausingKey {
            name,
            pause: Some(Arc::new(pause)),
        };
        (key, paused_rx, resume_tx)
    }
}

impl Clone for PausingKey {
    fn clone(&self) -> Self {
        if let Some(pause) = &self.pause {
            if pause.armed.swap(false, SeqCst) {
                pause.paused.lock().unwrap().send(()).unwrap();
                pause
                    .resume
                    .lock()
                    .unwrap()
                    .recv_timeout(HANG)
                    .expect("never resumed");
            }
        }
        PausingKey {
            name: self.name,
            pause: self.pause.clone(),
        }
    }
}

impl PartialEq for PausingKey {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for PausingKey {}

impl std::hash::Hash for PausingKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

/// `testLockInTryCompleteElseWatch`, the watch itself (`safeTryCompleteOrElse` holds the lock
/// from the first try through the watch to the second try): the watch is stopped once the
/// operation is on k1's list and before it is on k2's; the operation becomes completable and
/// k1 is checked. The check finds it on k1's list but must wait for the lock, without calling
/// `try_complete`; once the watch goes on, the second try completes it, and the check then
/// finds it completed.
#[test]
fn a_check_during_the_watch_waits_for_the_second_try() {
    let clock = ManualClock::new(0);
    let p: Arc<Purgatory<PausingKey, MockOp>> = Arc::new(purgatory(&clock));
    let mock = Mock::default();
    let (k2, paused_rx, resume_tx) = PausingKey::pausing("k2");
    let watcher = {
        let (p, op) = (p.clone(), mock.op());
        let keys = [PausingKey::plain("k1"), k2];
        thread::spawn(move || {
            let w = watch(&p, op, 100_000 * MS, &keys);
            (w.completed, w.handle)
        })
    };
    paused_rx
        .recv_timeout(HANG)
        .expect("the watch never reached k2");
    assert_eq!(mock.tries(), 1, "only the first try so far");
    assert_eq!(p.watched(), 1, "watched on k1, not yet on k2");
    mock.set_completable();
    let checker = {
        let p = p.clone();
        spawn_until_blocked(move || p.check_and_complete(&PausingKey::plain("k1")))
    };
    assert!(
        !checker.is_finished(),
        "the check did not wait for the operation's lock: it was released during the watch"
    );
    assert_eq!(
        mock.tries(),
        1,
        "try_complete ran in the middle of the watch"
    );
    resume_tx.send(()).unwrap();
    let (completed, handle) = join_all(vec![watcher], "watcher").pop().unwrap();
    let checked = join_all(vec![checker], "checker").pop().unwrap();

    assert!(
        completed,
        "the second try (completable by then) completed it"
    );
    assert_eq!(checked, 0, "the check found it completed");
    assert!(handle.is_completed());
    assert_eq!(
        (mock.tries(), mock.completes(), mock.violations()),
        (2, 1, 0)
    );
    assert_eq!(
        (p.delayed(), p.watched()),
        (0, 1),
        "never armed; k2's entry unswept"
    );
    p.check_invariants();
}

/// KAFKA-17848 family: once an operation has completed (by expiry, by force, or by a check of
/// another of its keys), no later check calls its `try_complete`, and none completes it again.
#[test]
fn try_complete_is_not_called_after_completion() {
    let clock = ManualClock::new(0);
    let p = purgatory(&clock);
    let (expired, forced, checked) = (Mock::default(), Mock::default(), Mock::default());
    let we = watch(&p, expired.op(), 10 * MS, &["a", "b"]);
    let wf = watch(&p, forced.op(), 100_000 * MS, &["a", "b"]);
    let wc = watch(&p, checked.op(), 100_000 * MS, &["a", "b"]);

    clock.set_ms(10);
    assert_eq!(p.advance(), 1);
    assert!(we.handle.is_completed());
    assert!(wf.handle.force_complete());
    checked.set_completable();
    assert_eq!(p.check_and_complete(&"a"), 1, "only `checked` completes");
    assert!(wc.handle.is_completed());
    let tries = [expired.tries(), forced.tries(), checked.tries()];
    assert_eq!(tries, [2, 2, 3]);

    // Every operation is completable now, and every key is checked again.
    expired.set_completable();
    forced.set_completable();
    assert_eq!(p.check_and_complete(&"b"), 0);
    assert_eq!(p.check_and_complete(&"a"), 0);
    assert_eq!(
        [expired.tries(), forced.tries(), checked.tries()],
        tries,
        "try_complete called after completion"
    );
    for m in [&expired, &forced, &checked] {
        assert_eq!((m.completes(), m.violations()), (1, 0));
    }
    assert_eq!(expired.expirations(), 1);
    assert!(!wf.handle.force_complete() && !we.handle.force_complete());
    assert_eq!((p.delayed(), p.watched()), (0, 0));
    p.check_invariants();
}

/// KAFKA-17848 / KAFKA-19312 under contention, on real threads with the purgatory's own reaper:
/// operations with timeouts of 2–32 ms, watched on two of eight keys, are checked by four threads
/// (while a fifth makes some completable and force-completes others) until all have completed.
/// Each completes exactly once (by a check, by force or by expiry: the three counts add up),
/// `on_expiration` only after `on_complete`, and `try_complete` never runs after completion nor
/// concurrently with another method of the same operation (expiry takes the operation's lock).
#[test]
fn completion_never_overlaps_try_complete_under_contention() {
    const OPS: usize = 300;
    const KEYS: usize = 8;
    const CHECKERS: usize = 4;

    let p: Arc<Purgatory<usize, MockOp>> = Arc::new(Purgatory::builder().name("contended").build());
    let mocks: Arc<Vec<Mock>> = Arc::new((0..OPS).map(|_| Mock::default()).collect());
    let mut handles = Vec::new();
    for (i, mock) in mocks.iter().enumerate() {
        // Widen the windows: each try after the watch takes a little while.
        let op = mock.op_with(|n| {
            if n >= 2 {
                thread::sleep(Duration::from_micros(20));
            }
        });
        let timeout = Duration::from_millis(2 + 2 * (i % 16) as u64);
        let w = watch(&p, op, timeout, &[i % KEYS, (i + 1) % KEYS]);
        assert!(!w.completed);
        handles.push(w.handle);
    }
    let handles = Arc::new(handles);
    let all_done = {
        let handles = handles.clone();
        move || handles.iter().all(OperationHandle::is_completed)
    };

    let checkers: Vec<_> = (0..CHECKERS)
        .map(|t| {
            let (p, done) = (p.clone(), all_done.clone());
            thread::spawn(move || {
                let mut rng = SplitMix64::new(t as u64);
                let mut completed = 0;
                while !done() {
                    completed += p.check_and_complete(&((rng.next() % KEYS as u64) as usize));
                }
                completed
            })
        })
        .collect();
    let forcer = {
        let (mocks, handles) = (mocks.clone(), handles.clone());
        thread::spawn(move || {
            let mut rng = SplitMix64::new(99);
            let mut forced = 0;
            for i in 0..OPS {
                match rng.next() % 3 {
                    0 => mocks[i].set_completable(),
                    1 => forced += usize::from(handles[i].force_complete()),
                    _ => {} // left to expire (or to a check, if another thread made it ready)
                }
                if i % 10 == 0 {
                    thread::sleep(MS);
                }
            }
            forced
        })
    };
    let forced = join_all(vec![forcer], "forcer").pop().unwrap();
    let checked: usize = join_all(checkers, "checkers").into_iter().sum();
    // An expiry's on_complete runs (under the op lock) just after the completed flag is set,
    // and its on_expiration after that: wait for the callbacks and the counts to settle (a
    // completer too many would show as a sum past OPS, asserted below).
    wait_until("every on_complete, on_expiration and count", || {
        let expired: usize = mocks.iter().map(Mock::expirations).sum();
        mocks.iter().all(|m| m.completes() == 1)
            && checked + forced + expired >= OPS
            && p.stats().completed >= OPS as u64
    });

    let expired: usize = mocks.iter().map(Mock::expirations).sum();
    println!("completed by checks {checked}, by force {forced}, by expiry {expired}");
    assert!(
        checked > 0 && forced > 0 && expired > 0,
        "the three completers never all raced (checked {checked}, forced {forced}, expired {expired})"
    );
    for (i, m) in mocks.iter().enumerate() {
        assert_eq!(m.completes(), 1, "op {i}: on_complete exactly once");
        assert!(m.expirations() <= 1, "op {i}");
        assert_eq!(
            m.violations(),
            0,
            "op {i}: try_complete after completion, or overlapping methods"
        );
    }
    assert_eq!(
        checked + forced + expired,
        OPS,
        "each operation has exactly one completer (checked {checked}, forced {forced}, expired {expired})"
    );
    assert_eq!(p.stats().completed, OPS as u64);
    assert_eq!(p.stats().expired, expired as u64);
    // The timer catches and counts a panic of an expiry (the purgatory's own assertions
    // included, such as an expiry completing an operation a check completed first).
    assert_eq!(p.timer().stats().panicked, 0, "an expiry panicked");
    wait_until("delayed() to reach 0", || p.delayed() == 0);
    p.purge();
    assert_eq!(p.watched(), 0);
    p.check_invariants();
}
