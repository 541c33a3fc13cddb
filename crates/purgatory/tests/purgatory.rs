//! Behaviour of `Purgatory`: completion by checks, by force and by expiry (manual clock),
//! counts, cancel_for_key, memory release, purge, shutdown, and exactly-once under contention.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std threads and locks in tests

mod common;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{DelayedOperation, OperationHandle, Purgatory, ReadyHint, ReadyTest, WatchError};
use system_timer::{ManualClock, SystemTimer};

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(3600);

/// What happened to an operation, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Try,
    /// Logged by a `force_complete_with` closure.
    Forced,
    Complete,
    Expire,
}

/// A test operation: ready when its flag is set; logs every call; panics if `try_complete` is
/// called after completion or if two of its methods ever overlap.
struct Op {
    ready: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Ev>>>,
    inside: Arc<AtomicBool>,
    completed: bool,
    _payload: Option<Payload>,
    /// With a `ReadyHint` over `ready` (or over `hint_flag` if set), counting its calls here.
    hint_calls: Option<Arc<AtomicUsize>>,
    hint_flag: Option<Arc<AtomicBool>>,
}

/// Counts its drops (the "large payload").
struct Payload(Arc<AtomicUsize>, #[allow(dead_code)] Vec<u8>);

impl Drop for Payload {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[derive(Clone, Default)]
struct Probe {
    ready: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Ev>>>,
    inside: Arc<AtomicBool>,
}

impl Probe {
    fn op(&self) -> Op {
        Op {
            ready: self.ready.clone(),
            log: self.log.clone(),
            inside: self.inside.clone(),
            completed: false,
            _payload: None,
            hint_calls: None,
            hint_flag: None,
        }
    }
    /// An operation whose `ReadyHint` reads the same flag as its `try_complete`.
    fn hinted_op(&self, calls: &Arc<AtomicUsize>) -> Op {
        Op {
            hint_calls: Some(calls.clone()),
            ..self.op()
        }
    }
    fn tries(&self) -> usize {
        self.events().iter().filter(|e| **e == Ev::Try).count()
    }
    fn events(&self) -> Vec<Ev> {
        self.log.lock().unwrap().clone()
    }
    fn completions(&self) -> usize {
        self.events().iter().filter(|e| **e == Ev::Complete).count()
    }
    fn set_ready(&self) {
        self.ready.store(true, SeqCst);
    }
}

impl Op {
    fn enter(&self) {
        assert!(
            !self.inside.swap(true, SeqCst),
            "two methods of one operation overlapped"
        );
    }
    fn leave(&self) {
        self.inside.store(false, SeqCst);
    }
}

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        self.enter();
        assert!(!self.completed, "try_complete after completion");
        self.log.lock().unwrap().push(Ev::Try);
        let r = self.ready.load(SeqCst);
        self.leave();
        r
    }
    fn on_complete(&mut self) {
        self.enter();
        assert!(!self.completed, "on_complete twice");
        self.completed = true;
        self.log.lock().unwrap().push(Ev::Complete);
        self.leave();
    }
    fn on_expiration(&mut self) {
        self.enter();
        assert!(self.completed, "on_expiration before on_complete");
        self.log.lock().unwrap().push(Ev::Expire);
        self.leave();
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        let calls = self.hint_calls.clone()?;
        let ready = self.hint_flag.clone().unwrap_or_else(|| self.ready.clone());
        Some(ReadyHint::new(move || {
            calls.fetch_add(1, SeqCst);
            ready.load(SeqCst)
        }))
    }
}

/// A purgatory on a manual clock, driven by hand (expiries and purges run in `advance`).
fn manual(clock: &ManualClock) -> Purgatory<&'static str, Op> {
    Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .build()
}

/// [`manual`] with a purge interval of `n`.
fn manual_purging(clock: &ManualClock, n: usize) -> Purgatory<&'static str, Op> {
    Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .purge_interval(n)
        .build()
}

/// A timer to share between purgatories, on `clock`, driven by hand (no reaper; tasks run in
/// `advance`).
fn hand_driven_timer(clock: &ManualClock) -> system_timer::Builder {
    SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
}

/// Watches every probe's operation on `keys` with `timeout`; returns their handles.
fn watch_all(
    p: &Purgatory<&'static str, Op>,
    probes: &[Probe],
    timeout: Duration,
    keys: &[&'static str],
) -> Vec<OperationHandle<Op>> {
    probes
        .iter()
        .map(|probe| {
            p.try_complete_else_watch(probe.op(), timeout, keys)
                .unwrap()
                .handle
        })
        .collect()
}

/// An operation not ready at watch time completes when it becomes ready and its key is checked;
/// the check drops the emptied key; the timer entry is gone at once.
#[test]
fn completes_on_a_key_check() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probe = Probe::default();
    let w = p.try_complete_else_watch(probe.op(), LONG, &["a"]).unwrap();
    assert!(!w.completed);
    assert_eq!(
        probe.events(),
        [Ev::Try, Ev::Try],
        "first try, then the second under the same lock"
    );
    assert_eq!((p.watched(), p.delayed()), (1, 1));
    assert_eq!(p.check_and_complete(&"a"), 0, "not ready yet");
    probe.set_ready();
    assert_eq!(p.check_and_complete(&"a"), 1);
    assert_eq!(p.check_and_complete(&"a"), 0, "completed once");
    assert_eq!(probe.completions(), 1);
    assert!(w.handle.is_completed());
    assert_eq!(
        (p.watched(), p.delayed()),
        (0, 0),
        "key dropped, timer disarmed"
    );
    assert_eq!(
        p.timer().len(),
        0,
        "the timer entry was cancelled, not left to fire"
    );
    assert_eq!(p.stats().keys, 0);
    p.check_invariants();
}

/// Ready at the first try: completed by the call itself, never watched nor timed.
#[test]
fn ready_at_first_try_is_completed_by_the_call() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probe = Probe::default();
    probe.set_ready();
    let w = p
        .try_complete_else_watch(probe.op(), LONG, &["a", "b"])
        .unwrap();
    assert!(w.completed);
    assert_eq!(probe.events(), [Ev::Try, Ev::Complete]);
    assert_eq!((p.watched(), p.delayed()), (0, 0));
}

/// Not ready: expires once the timeout passes on the manual clock (not a tick before), with
/// `on_complete` then `on_expiration`; a later check does not complete it again.
#[test]
fn expires_after_the_timeout_on_the_manual_clock() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probe = Probe::default();
    let w = p
        .try_complete_else_watch(probe.op(), 100 * MS, &["a"])
        .unwrap();
    clock.advance(99 * MS);
    p.advance();
    assert!(!w.handle.is_completed(), "expired early");
    clock.advance(MS);
    assert_eq!(p.advance(), 1);
    assert!(w.handle.is_completed());
    assert_eq!(probe.events(), [Ev::Try, Ev::Try, Ev::Complete, Ev::Expire]);
    assert_eq!(p.delayed(), 0);
    probe.set_ready();
    assert_eq!(p.check_and_complete(&"a"), 0);
    assert_eq!(probe.completions(), 1);
    let st = p.stats();
    assert_eq!((st.accepted, st.completed, st.expired), (1, 1, 1));
}

/// `watched()` counts entries per key until swept; `delayed()` drops as soon as an operation
/// completes on any of its keys. A check sweeps its key once the completed entries it saw are a
/// sixteenth of the list: 2 of 32.
#[test]
fn watched_and_delayed_as_operations_complete_on_some_keys() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probes: Vec<Probe> = (0..32).map(|_| Probe::default()).collect();
    watch_all(&p, &probes, LONG, &["a", "b"]);
    assert_eq!((p.watched(), p.delayed()), (64, 32));
    probes[0].set_ready();
    assert_eq!(p.check_and_complete(&"a"), 1);
    // One of 32 completed on "a": below the sweep threshold, its cell stays on both keys.
    assert_eq!((p.watched(), p.delayed()), (64, 31));
    probes[1].set_ready();
    assert_eq!(p.check_and_complete(&"b"), 1);
    // Two of 32 on "b" are done: "b" is swept.
    assert_eq!((p.watched(), p.delayed()), (62, 30));
    for probe in &probes[2..] {
        probe.set_ready();
    }
    assert_eq!(p.check_and_complete(&"a"), 30);
    assert_eq!(p.delayed(), 0);
    assert_eq!(
        p.watched(),
        30,
        "'b' still lists 30 empty cells until it is checked or purged"
    );
    assert_eq!(p.purge(), 30);
    assert_eq!((p.watched(), p.stats().keys), (0, 0));
    assert_eq!(probes.iter().map(Probe::completions).sum::<usize>(), 32);
}

/// `cancel_for_key` on an unknown key returns nothing; on a watched key it returns the pending
/// operations without completing them, disarms their timers (they never expire), and leaves them
/// on their other keys, where a check still completes them.
#[test]
fn cancel_for_key_with_and_without_watchers() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    assert!(p.cancel_for_key(&"nobody").is_empty());
    let (x, y) = (Probe::default(), Probe::default());
    p.try_complete_else_watch(x.op(), 10 * MS, &["k", "other"])
        .unwrap();
    p.try_complete_else_watch(y.op(), 10 * MS, &["k"]).unwrap();
    let ops = p.cancel_for_key(&"k");
    assert_eq!(ops.len(), 2);
    assert!(ops.iter().all(|h| !h.is_completed()));
    assert_eq!(p.delayed(), 0);
    assert_eq!(p.watched(), 1, "x is still on 'other'");
    clock.advance(Duration::from_secs(1));
    p.advance();
    assert_eq!(
        x.completions() + y.completions(),
        0,
        "cancelled timers never expire"
    );
    x.set_ready();
    assert_eq!(p.check_and_complete(&"other"), 1);
    assert_eq!(x.completions(), 1);
    assert!(ops[1].force_complete(), "y can still be forced");
    assert_eq!(y.completions(), 1);
}

/// `force_complete_with` runs its closure on the pending operation before `on_complete`, in the
/// same lock hold, and not at all once the operation has completed; a panic in the closure
/// leaves the operation pending (armed, not completed), to complete later exactly once.
#[test]
fn force_complete_with_runs_before_on_complete_and_only_while_pending() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let (probe, other) = (Probe::default(), Probe::default());
    let forced = |op: &mut Op| op.log.lock().unwrap().push(Ev::Forced);
    let w = p.try_complete_else_watch(probe.op(), LONG, &["k"]).unwrap();
    assert!(w.handle.force_complete_with(forced));
    assert_eq!(probe.events(), [Ev::Try, Ev::Try, Ev::Forced, Ev::Complete]);
    assert!(!w
        .handle
        .force_complete_with(|_| panic!("ran on a completed operation")));
    let w = p.try_complete_else_watch(other.op(), LONG, &["k"]).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.handle
            .force_complete_with(|_| panic!("the caller's closure"))
    }));
    assert!(panicked.is_err());
    assert!(
        !w.handle.is_completed() && p.delayed() == 1,
        "not pending after the panic"
    );
    assert_eq!(other.completions(), 0);
    assert!(
        w.handle.force_complete_with(forced),
        "the lock was left held"
    );
    assert_eq!(other.events(), [Ev::Try, Ev::Try, Ev::Forced, Ev::Complete]);
    assert_eq!(p.delayed(), 0);
}

/// An operation `cancel_for_key` removed from its only key is no longer seen by a shutdown: its
/// handle takes it back (no `on_complete`, counted as handed back, never completable after), so
/// every operation the purgatory accepted is accounted for. One still watched on another key
/// is taken back the same way, and its empty cell there leaves at the next sweep.
///
/// Catches: an operation only a handle reaches being silently lost (no way to get it back), a
/// take that completes it, a second take or a force after a take that succeeds.
#[test]
fn a_cancelled_operation_is_taken_back_through_its_handle() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let (x, y, z) = (Probe::default(), Probe::default(), Probe::default());
    p.try_complete_else_watch(x.op(), LONG, &["k"]).unwrap();
    p.try_complete_else_watch(y.op(), LONG, &["k", "other"])
        .unwrap();
    let w = p.try_complete_else_watch(z.op(), LONG, &["z"]).unwrap();
    let hs = p.cancel_for_key(&"k");
    assert_eq!(hs.len(), 2);
    assert!(hs[0].take().is_some(), "x, watched nowhere now, comes back");
    assert!(hs[0].take().is_none() && !hs[0].force_complete());
    assert!(
        hs[1].take().is_some(),
        "y, still on 'other', comes back too"
    );
    assert!(
        w.handle.take().is_some(),
        "an armed operation: taken and disarmed"
    );
    assert_eq!(p.delayed(), 0);
    assert_eq!(x.completions() + y.completions() + z.completions(), 0);
    assert_eq!(p.purge(), 2, "the empty cells of y on 'other' and of z");
    let st = p.stats();
    assert_eq!((st.accepted, st.handed_back, st.completed), (3, 3, 0));
    assert!(p.shutdown().is_empty());
    p.check_invariants();
}

/// The first and second tries of `try_complete_else_watch` run under the operation's lock: a
/// check on the key that arrives meanwhile waits, and never runs `try_complete` concurrently.
#[test]
fn try_complete_runs_under_the_op_lock_during_watch() {
    struct Slow {
        calls: Arc<AtomicUsize>,
        inside: Arc<AtomicBool>,
        overlaps: Arc<AtomicUsize>,
        watching: Arc<AtomicBool>,
    }
    impl DelayedOperation for Slow {
        fn try_complete(&mut self) -> bool {
            if self.inside.swap(true, SeqCst) {
                self.overlaps.fetch_add(1, SeqCst);
            }
            let n = self.calls.fetch_add(1, SeqCst);
            if n == 0 {
                // First try: let the checker run against the (not yet watched) key meanwhile.
                self.watching.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(30));
            } else if n == 1 {
                std::thread::sleep(Duration::from_millis(30));
            }
            self.inside.store(false, SeqCst);
            n >= 2
        }
        fn on_complete(&mut self) {}
    }
    let p: Arc<Purgatory<u8, Slow>> = Arc::new(Purgatory::builder().reaper(false).build());
    let (calls, inside, overlaps, watching) = Default::default();
    let op = Slow {
        calls: Arc::clone(&calls),
        inside: Arc::clone(&inside),
        overlaps: Arc::clone(&overlaps),
        watching: Arc::clone(&watching),
    };
    let p2 = p.clone();
    let w2 = watching.clone();
    let checker = std::thread::spawn(move || {
        while !w2.load(SeqCst) {
            std::thread::yield_now();
        }
        let mut done = 0;
        let t0 = Instant::now();
        while done == 0 && t0.elapsed() < Duration::from_secs(10) {
            done = p2.check_and_complete(&7);
        }
        done
    });
    let w = p.try_complete_else_watch(op, LONG, &[7]).unwrap();
    assert!(!w.completed, "two tries, neither ready");
    assert_eq!(
        checker.join().unwrap(),
        1,
        "the check completed it (third try)"
    );
    assert_eq!(
        overlaps.load(SeqCst),
        0,
        "try_complete ran concurrently with itself"
    );
    assert_eq!(calls.load(SeqCst), 3);
}

/// Kafka's `testTryCompleteWithMultipleThreads`, scaled as the issue asks: 20 threads make 20
/// rounds of attempts on 100 operations (each watched on its own key) at random small delays;
/// the last round makes each operation completable. Every operation completes exactly once,
/// none is lost (the timeout is an hour: nothing expires).
#[test]
fn contention_every_operation_completes_exactly_once() {
    contention(false);
}

/// The same with every operation carrying a `ReadyHint`: checks skip the not-ready ones without
/// their locks, and still none is lost or completed twice.
#[test]
fn contention_with_ready_hints_every_operation_completes_exactly_once() {
    contention(true);
}

fn contention(hinted: bool) {
    const THREADS: usize = 20;
    const OPS: usize = 100;
    const ROUNDS: usize = 20;
    let p: Arc<Purgatory<usize, Op>> = Arc::new(Purgatory::builder().name("contention").build());
    let probes: Arc<Vec<Probe>> = Arc::new((0..OPS).map(|_| Probe::default()).collect());
    let hint_calls = Arc::new(AtomicUsize::new(0));
    for (k, probe) in probes.iter().enumerate() {
        let op = if hinted {
            probe.hinted_op(&hint_calls)
        } else {
            probe.op()
        };
        assert!(!p.try_complete_else_watch(op, LONG, &[k]).unwrap().completed);
    }
    let rounds: Arc<Vec<AtomicUsize>> = Arc::new((0..OPS).map(|_| AtomicUsize::new(0)).collect());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (p, probes, rounds) = (p.clone(), probes.clone(), rounds.clone());
            std::thread::spawn(move || {
                let mut state = t as u64 + 1;
                let mut completed = 0;
                for round in 0..ROUNDS {
                    for k in 0..OPS {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        if (state >> 60) == 0 {
                            std::thread::sleep(Duration::from_micros((state >> 40) % 200));
                        }
                        // The last attempt (of all threads' attempts on this op) makes it ready.
                        if rounds[k].fetch_add(1, SeqCst) == THREADS * ROUNDS - 1 {
                            probes[k].set_ready();
                        }
                        completed += p.check_and_complete(&k);
                    }
                    let _ = round;
                }
                completed
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, OPS, "completions reported by the checks");
    for (k, probe) in probes.iter().enumerate() {
        assert_eq!(probe.completions(), 1, "operation {k}");
        assert!(!probe.events().contains(&Ev::Expire));
    }
    assert_eq!((p.delayed(), p.watched()), (0, 0));
    assert_eq!(
        hint_calls.load(SeqCst) > 0,
        hinted,
        "the checks used the hints"
    );
    if hinted {
        for (k, probe) in probes.iter().enumerate() {
            assert_eq!(
                probe.tries(),
                3,
                "operation {k}: the two first tries, then only the check that found it ready"
            );
        }
    }
    p.check_invariants();
}

/// A check skips an operation whose `ReadyHint` says not ready without calling `try_complete`
/// (nor taking its lock), completes one whose hint and `try_complete` both say ready, and a
/// hint that says ready still defers to `try_complete`. The first tries in
/// `try_complete_else_watch` never consult the hint.
#[test]
fn a_check_skips_operations_whose_ready_hint_says_not_ready() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let (waiting, ready) = (Probe::default(), Probe::default());
    p.try_complete_else_watch(waiting.hinted_op(&calls), LONG, &["k"])
        .unwrap();
    p.try_complete_else_watch(ready.hinted_op(&calls), LONG, &["k"])
        .unwrap();
    assert_eq!(calls.load(SeqCst), 0, "the first tries do not use the hint");
    assert_eq!((waiting.tries(), ready.tries()), (2, 2));

    assert_eq!(p.check_and_complete(&"k"), 0);
    assert_eq!(calls.load(SeqCst), 2, "one hint call per pending watcher");
    assert_eq!(
        (waiting.tries(), ready.tries()),
        (2, 2),
        "try_complete not called on operations the hint ruled out"
    );

    ready.set_ready();
    assert_eq!(p.check_and_complete(&"k"), 1);
    assert_eq!((waiting.tries(), ready.tries()), (2, 3));
    assert_eq!((waiting.completions(), ready.completions()), (0, 1));
    assert_eq!(p.delayed(), 1, "the waiting one is still armed");

    // A hint that says "maybe" is not a completion: try_complete decides.
    let maybe = Probe::default();
    let mut op = maybe.hinted_op(&calls);
    op.hint_flag = Some(Arc::new(AtomicBool::new(true)));
    p.try_complete_else_watch(op, LONG, &["m"]).unwrap();
    assert_eq!(p.check_and_complete(&"m"), 0);
    assert_eq!((maybe.tries(), maybe.completions()), (3, 0));
    p.check_invariants();
}

/// Produces waiting for partitions' high watermarks, each giving its offset to the purgatory's
/// ready test: a check asks the test with the key being checked and each operation's own
/// argument, skips the ones it rules out without calling `try_complete` (nor their
/// `ReadyHint`), and completes exactly the ones past the watermark. Operations without an
/// argument (or with `u64::MAX`) are never skipped by the test.
#[test]
fn a_ready_test_gets_the_key_and_each_operations_argument() {
    struct Produce {
        offset: Option<u64>,
        hw: Arc<AtomicU64>,
        tries: Arc<AtomicUsize>,
        hint_calls: Arc<AtomicUsize>,
        done: Arc<Mutex<Vec<Option<u64>>>>,
    }
    impl DelayedOperation for Produce {
        fn try_complete(&mut self) -> bool {
            self.tries.fetch_add(1, SeqCst);
            self.hw.load(SeqCst) > self.offset.unwrap_or(7)
        }
        fn on_complete(&mut self) {
            self.done.lock().unwrap().push(self.offset);
        }
        fn ready_arg(&self) -> Option<u64> {
            self.offset
        }
        fn ready_hint(&self) -> Option<ReadyHint> {
            let calls = Arc::clone(&self.hint_calls);
            Some(ReadyHint::new(move || {
                calls.fetch_add(1, SeqCst);
                true
            }))
        }
    }
    let clock = ManualClock::new(0);
    let hw = Arc::new(AtomicU64::new(0));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let p: Purgatory<&'static str, Produce> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .ready_test({
            let (hw, asked) = (Arc::clone(&hw), Arc::clone(&asked));
            move |key: &&'static str, offset| {
                asked.lock().unwrap().push((*key, offset));
                hw.load(SeqCst) > offset
            }
        })
        .build();
    let (tries, hint_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = Arc::new(Mutex::new(Vec::new()));
    // Offset 7 without an argument; u64::MAX stands for "no argument" too.
    for offset in [Some(5), Some(1), Some(9), Some(3), None, Some(u64::MAX)] {
        let op = Produce {
            offset,
            hw: Arc::clone(&hw),
            tries: Arc::clone(&tries),
            hint_calls: Arc::clone(&hint_calls),
            done: Arc::clone(&done),
        };
        p.try_complete_else_watch(op, LONG, &["p0"]).unwrap();
    }
    assert_eq!(
        tries.load(SeqCst),
        12,
        "two first tries each, no test asked"
    );
    assert!(asked.lock().unwrap().is_empty());

    hw.store(4, SeqCst); // offsets 1 and 3 are now below the watermark
    assert_eq!(p.check_and_complete(&"p0"), 2);
    let mut seen = asked.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [("p0", 1), ("p0", 3), ("p0", 5), ("p0", 9)],
        "the test got the key and each operation's own argument, and only those with one"
    );
    assert_eq!(
        hint_calls.load(SeqCst),
        4,
        "the hint is asked only past the test: offsets 1, 3 and the two without an argument"
    );
    assert_eq!(
        tries.load(SeqCst),
        16,
        "try_complete only where the test said maybe"
    );
    let mut completed = done.lock().unwrap().clone();
    completed.sort_unstable();
    assert_eq!(completed, [Some(1), Some(3)]);
    assert_eq!(p.delayed(), 4);
    p.check_invariants();
}

/// A ready test of a type of its own (`Builder::with_ready_test`, the purgatory's third type
/// parameter) is asked as a closure is: with the key checked and each operation's argument, and
/// a check skips the operations it rules out. The builder's settings made before it are kept
/// (the name, the manual clock, no reaper: the rest expire when the clock is advanced).
///
/// Catches: `with_ready_test` dropping the test (every operation tried: the tries counted) or
/// the settings before it (a real clock or reaper: nothing expires on the manual advance; the
/// default name), or a check that calls the test without the key.
#[test]
fn a_ready_test_of_its_own_type_rules_out_what_it_says_and_keeps_the_settings() {
    struct Watermark {
        hw: Arc<AtomicU64>,
        asked: Asked,
    }
    impl ReadyTest<&'static str> for Watermark {
        fn maybe_ready(&self, key: &&'static str, offset: u64) -> bool {
            self.asked.lock().unwrap().push((*key, offset));
            self.hw.load(SeqCst) > offset
        }
    }
    a_typed_ready_test_rules_out_what_it_says(|hw, asked| Watermark { hw, asked });
}

/// The same with a closure given to `Builder::with_ready_test` as it is (its own type, no
/// pointer): every `Fn(&K, u64) -> bool` is a `ReadyTest`.
///
/// Catches: the closures' `ReadyTest` impl answering without calling the closure (always
/// maybe: every operation tried; never: nothing completed by the check).
#[test]
fn a_closure_as_a_typed_ready_test_rules_out_what_it_says() {
    a_typed_ready_test_rules_out_what_it_says(|hw, asked| {
        move |key: &&'static str, offset: u64| {
            asked.lock().unwrap().push((*key, offset));
            hw.load(SeqCst) > offset
        }
    });
}

/// What a ready test was asked: the key and the operation's argument, per call.
type Asked = Arc<Mutex<Vec<(&'static str, u64)>>>;

/// The body of the typed ready-test tests: `make` builds the test from the watermark and the
/// log of what it is asked; it must answer "maybe" for an offset under the watermark.
fn a_typed_ready_test_rules_out_what_it_says<T: ReadyTest<&'static str>>(
    make: impl FnOnce(Arc<AtomicU64>, Asked) -> T,
) {
    struct Produce {
        offset: u64,
        hw: Arc<AtomicU64>,
        tries: Arc<AtomicUsize>,
    }
    impl DelayedOperation for Produce {
        fn try_complete(&mut self) -> bool {
            self.tries.fetch_add(1, SeqCst);
            self.hw.load(SeqCst) > self.offset
        }
        fn on_complete(&mut self) {}
        fn ready_arg(&self) -> Option<u64> {
            Some(self.offset)
        }
    }
    let clock = ManualClock::new(0);
    let hw = Arc::new(AtomicU64::new(0));
    let asked: Asked = Arc::new(Mutex::new(Vec::new()));
    let p: Purgatory<&'static str, Produce, T> = Purgatory::builder()
        .name("typed")
        .clock(clock.clone())
        .reaper(false)
        .with_ready_test(make(Arc::clone(&hw), Arc::clone(&asked)))
        .build();
    assert!(
        format!("{p:?}").contains("\"typed\""),
        "the name was lost: {p:?}"
    );
    let tries = Arc::new(AtomicUsize::new(0));
    for offset in [5, 1, 9, 3] {
        let op = Produce {
            offset,
            hw: Arc::clone(&hw),
            tries: Arc::clone(&tries),
        };
        p.try_complete_else_watch(op, 10 * MS, &["p0"]).unwrap();
    }
    assert_eq!(tries.load(SeqCst), 8, "two tries each at entry");
    assert!(asked.lock().unwrap().is_empty(), "asked outside a check");

    hw.store(4, SeqCst); // offsets 1 and 3 are below the watermark
    assert_eq!(p.check_and_complete(&"p0"), 2);
    let mut seen = asked.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, [("p0", 1), ("p0", 3), ("p0", 5), ("p0", 9)]);
    assert_eq!(
        tries.load(SeqCst),
        10,
        "try_complete only where the test said maybe"
    );
    assert_eq!(p.delayed(), 2);

    clock.advance(10 * MS);
    assert_eq!(p.advance(), 2, "the other two expire on the manual clock");
    assert_eq!(p.delayed(), 0);
    p.check_invariants();
}

/// An operation with a large payload, completed through key A while also watched on key B, has
/// its payload dropped at completion, not at the next purge or check of B.
#[test]
fn a_completed_operation_releases_its_payload_at_once() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probe = Probe::default();
    let drops = Arc::new(AtomicUsize::new(0));
    let mut op = probe.op();
    op._payload = Some(Payload(drops.clone(), vec![0u8; 8 << 20]));
    p.try_complete_else_watch(op, LONG, &["A", "B"]).unwrap();
    probe.set_ready();
    assert_eq!(p.check_and_complete(&"A"), 1);
    assert_eq!(
        drops.load(SeqCst),
        1,
        "payload still alive after completion"
    );
    assert_eq!(p.watched(), 1, "B still lists the (now empty) cell");
    assert_eq!(p.stats().purges, 0, "no purge happened");
}

/// Completion by force, by a check and by expiry racing on real threads: `on_complete` exactly
/// once per operation, `on_expiration` only when expiry won and after `on_complete`.
#[test]
fn force_check_and_expiry_race_exactly_once() {
    let p: Arc<Purgatory<u32, Op>> = Arc::new(Purgatory::builder().build());
    for round in 0..300u32 {
        let probe = Probe::default();
        let w = p
            .try_complete_else_watch(
                probe.op(),
                Duration::from_micros(u64::from(round % 7) * 300),
                &[round],
            )
            .unwrap();
        let (p2, pr2) = (p.clone(), probe.clone());
        let checker = std::thread::spawn(move || {
            pr2.set_ready();
            p2.check_and_complete(&round)
        });
        let forced = w.handle.force_complete();
        let checked = checker.join().unwrap();
        // The flag is set before the winner's callbacks run: wait for `on_complete` and, when
        // neither the force nor the check won, for the expiry's `on_expiration` after it.
        let t0 = Instant::now();
        while probe.completions() == 0
            || (!forced && checked == 0 && !probe.events().contains(&Ev::Expire))
        {
            let ev = probe.events();
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "round {round}: hung: {ev:?}"
            );
            std::thread::yield_now();
        }
        // Give an expiry that lost the time to run its task, which must do nothing.
        std::thread::sleep(Duration::from_micros(200));
        let ev = probe.events();
        assert_eq!(probe.completions(), 1, "round {round}: {ev:?}");
        let expired = ev.contains(&Ev::Expire);
        assert_eq!(
            usize::from(forced) + checked + usize::from(expired),
            1,
            "round {round}: {ev:?}"
        );
        if expired {
            assert_eq!(ev.last(), Some(&Ev::Expire));
        }
    }
    let t0 = Instant::now();
    while p.delayed() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}

/// Shutdown hands back exactly the pending operations (never `on_complete`), disarms their
/// timers, and refuses later operations; an empty key set is refused with the operation.
#[test]
fn shutdown_hands_back_pending_operations_and_refuses_new_ones() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probes: Vec<Probe> = (0..5).map(|_| Probe::default()).collect();
    for (i, probe) in probes.iter().enumerate() {
        let keys: &[&str] = if i % 2 == 0 { &["a", "b"] } else { &["b"] };
        p.try_complete_else_watch(probe.op(), 50 * MS, keys)
            .unwrap();
    }
    probes[1].set_ready();
    assert_eq!(p.check_and_complete(&"b"), 1);
    assert!(!p.is_shutdown(), "a running purgatory reads shut down");
    let back = p.shutdown();
    assert!(p.is_shutdown(), "not shut down after shutdown");
    assert_eq!(
        back.len(),
        4,
        "each pending op once, though some are on two keys"
    );
    assert!(probes
        .iter()
        .enumerate()
        .all(|(i, pr)| pr.completions() == usize::from(i == 1)));
    assert_eq!(p.delayed(), 0);
    let fresh = Probe::default();
    assert!(matches!(
        p.try_complete_else_watch(fresh.op(), LONG, &["a"]),
        Err(WatchError::Shutdown(_))
    ));
    assert!(p.shutdown().is_empty(), "idempotent");
    let q = manual(&clock);
    match q.try_complete_else_watch(fresh.op(), LONG, &[]) {
        Err(WatchError::NoKeys(op)) => drop(op),
        other => panic!("expected NoKeys, got {other:?}"),
    }
    assert!(fresh.events().is_empty(), "a refused op is untouched");
}

/// The purge is count-triggered: while keys are checked, once `purge_interval` watched
/// operations have completed (Kafka's rule), a purge runs at the next advance of a hand-driven
/// purgatory and sweeps every empty cell.
#[test]
fn count_triggered_purge_runs_when_a_manual_purgatory_advances() {
    let clock = ManualClock::new(0);
    let p = manual_purging(&clock, 10);
    let probes: Vec<Probe> = (0..40).map(|_| Probe::default()).collect();
    watch_all(&p, &probes, LONG, &["a", "b"]);
    // Complete 12 through "a" one by one (each check completes one, below the sweep ratio on
    // "b", which is never checked).
    for probe in probes.iter().take(12) {
        probe.set_ready();
        assert_eq!(p.check_and_complete(&"a"), 1);
    }
    let before = p.watched();
    assert!(before >= 40 + 28, "b still holds all 40 entries: {before}");
    assert_eq!(p.stats().purges, 0);
    p.advance(); // runs the purge task the crossing of the interval scheduled
    assert_eq!(p.stats().purges, 1);
    assert_eq!(
        p.watched(),
        56,
        "28 pending on each key, all empty cells swept"
    );
    p.check_invariants();
}

/// While no key is checked (operations completed by force, as in Kafka's benchmark), the purge
/// also waits until the completed operations reach the delayed ones: walking every pending
/// entry to drop a few would cost more than the empty cells do.
#[test]
fn without_checks_the_purge_waits_until_the_garbage_reaches_the_delayed_count() {
    let clock = ManualClock::new(0);
    let p = manual_purging(&clock, 10);
    let probes: Vec<Probe> = (0..40).map(|_| Probe::default()).collect();
    let handles = watch_all(&p, &probes, LONG, &["a", "b"]);
    // The completion that makes a purge due schedules it; the next advance runs it.
    let trigger = |p: &Purgatory<&str, Op>| {
        let never = Probe::default();
        p.try_complete_else_watch(never.op(), LONG, &["c"]).unwrap();
        p.advance();
    };
    // 19 forced: past the interval (10), fewer than the 21 still delayed.
    for h in &handles[..19] {
        assert!(h.force_complete());
    }
    trigger(&p); // (one more delayed, on "c")
    assert_eq!(p.stats().purges, 0, "19 completed, 21 delayed: not due");
    assert_eq!(p.watched(), 80 + 1, "every empty cell still listed");
    assert!(handles[19].force_complete());
    trigger(&p);
    assert_eq!(p.stats().purges, 0, "20 completed, 21 delayed: not due");
    assert!(handles[20].force_complete());
    trigger(&p);
    assert_eq!(p.stats().purges, 1, "21 completed, 20 delayed: due");
    assert_eq!(p.watched(), 38 + 3, "19 pending on a and b, 3 on c");
    p.check_invariants();
}

/// `cancel_for_key` disarms operations, so fewer are delayed: when the garbage then reaches the
/// delayed count, the purge is due at once (it used to wait for the next completion).
#[test]
fn cancel_for_key_makes_a_purge_due_when_the_garbage_reaches_the_delayed() {
    let clock = ManualClock::new(0);
    let p = manual_purging(&clock, 10);
    let probes: Vec<Probe> = (0..40).map(|_| Probe::default()).collect();
    let handles = watch_all(&p, &probes, LONG, &["a", "b"]);
    // 12 forced, no check: past the interval (10), fewer than the 28 still delayed.
    for h in &handles[..12] {
        assert!(h.force_complete());
    }
    p.advance();
    assert_eq!(p.stats().purges, 0, "12 completed, 28 delayed: not due");
    assert_eq!(p.cancel_for_key(&"b").len(), 28);
    assert_eq!(p.delayed(), 0);
    p.advance();
    assert_eq!(p.stats().purges, 1, "12 completed, none delayed: due");
    assert_eq!(p.watched(), 28, "the 12 empty cells on a swept");
    p.check_invariants();
}

/// A manual `purge()` is a purge like the count-triggered one: a key checked before it no longer
/// counts afterwards, so while no key is checked again the next purge waits for the garbage to
/// reach the delayed operations (it used to keep the flag, and purged at the interval alone).
#[test]
fn a_manual_purge_forgets_the_checks_before_it() {
    let clock = ManualClock::new(0);
    let p = manual_purging(&clock, 10);
    let probes: Vec<Probe> = (0..40).map(|_| Probe::default()).collect();
    let handles = watch_all(&p, &probes, LONG, &["a", "b"]);
    assert_eq!(p.check_and_complete(&"a"), 0, "nothing is ready");
    assert_eq!(p.purge(), 0, "nothing completed yet");
    assert_eq!(p.stats().purges, 1);
    // 12 forced, no check: past the interval (10), fewer than the 28 still delayed.
    for h in &handles[..12] {
        assert!(h.force_complete());
    }
    p.advance();
    assert_eq!(
        p.stats().purges,
        1,
        "12 completed, 28 delayed, no check since the manual purge: not due"
    );
    assert_eq!(p.watched(), 80, "every empty cell still listed");
    p.check_invariants();
}

/// Operations taken back (`take`, the recovery path after `cancel_for_key`) leave empty cells
/// on their keys, like completed ones: the hand-backs count towards the purge, so the cells and
/// the keys they alone kept are swept, not held for ever.
///
/// Catches: a purge counted only by completions (every cell and key below stays listed).
#[test]
fn taken_back_operations_count_towards_the_purge() {
    let clock = ManualClock::new(0);
    let p: Purgatory<u32, Op> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .purge_interval(10)
        .build();
    let probe = Probe::default();
    for k in 0..1_000u32 {
        let w = p
            .try_complete_else_watch(probe.op(), LONG, &[k, 1_000_000 + k])
            .unwrap();
        assert!(w.handle.take().is_some());
        p.advance(); // runs the purge a hand-back made due, if one did
    }
    // And through cancel_for_key: its handles taken back leave cells on the other key.
    for k in 0..1_000u32 {
        p.try_complete_else_watch(probe.op(), LONG, &[2_000_000 + k, 3_000_000 + k])
            .unwrap();
        for h in p.cancel_for_key(&(2_000_000 + k)) {
            assert!(h.take().is_some());
        }
        p.advance();
    }
    let st = p.stats();
    assert_eq!((st.handed_back, st.delayed, st.completed), (2_000, 0, 0));
    assert!(st.purges >= 150, "{st:?}");
    // At most an interval's worth of operations (2 cells each) not yet swept.
    assert!(st.watched < 20 && st.keys < 20, "{st:?}");
    p.check_invariants();
}

/// A purge made due while a shared timer is at its cap of pending tasks (so the purge task is
/// refused) runs at once on the completing thread instead of being skipped for an interval.
#[test]
fn a_purge_refused_by_a_full_shared_timer_runs_at_once() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(hand_driven_timer(&clock).max_pending(8).build());
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .timer(Arc::clone(&timer))
        .purge_interval(4)
        .build();
    let probe = Probe::default();
    for _ in 0..8 {
        p.try_complete_else_watch(probe.op(), LONG, &["a", "b"])
            .unwrap();
    }
    // Disarmed (their slots freed), still watched on "b"; then the timer is filled by someone
    // else.
    let handles = p.cancel_for_key(&"a");
    assert_eq!(handles.len(), 8);
    for _ in 0..8 {
        timer.add(LONG, || ()).unwrap();
    }
    assert!(timer.add(LONG, || ()).unwrap_err().is_full());
    // Four completions reach the interval (nothing is delayed): the purge is due.
    for h in &handles[..4] {
        assert!(h.force_complete());
    }
    assert_eq!(
        p.stats().purges,
        1,
        "the purge ran although the timer was full"
    );
    assert_eq!(p.watched(), 4, "the four empty cells on b were swept");
    p.check_invariants();
}

/// A shared timer at its cap of pending tasks refuses to arm an operation: the caller gets it
/// back as `Full` (not `Shutdown`: the purgatory still runs), nothing of it stays armed or
/// counted as delayed, and once a slot is free the same operation is taken.
///
/// Catches: a full timer reported as a shutdown (a server would then stop using a live
/// purgatory).
#[test]
fn a_full_shared_timer_refuses_with_full_not_shutdown() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(hand_driven_timer(&clock).max_pending(2).build());
    let p: Purgatory<&'static str, Op> = Purgatory::builder().timer(Arc::clone(&timer)).build();
    let probe = Probe::default();
    let other = timer.add(LONG, || ()).unwrap();
    p.try_complete_else_watch(probe.op(), LONG, &["a"]).unwrap();
    let op = match p.try_complete_else_watch(probe.op(), LONG, &["a"]) {
        Err(e @ WatchError::Full(_)) => {
            assert!(e.to_string().contains("limit"), "{e}");
            e.into_inner()
        }
        other => panic!("expected Full, got {:?}", other.map(|_| ())),
    };
    assert_eq!(p.delayed(), 1);
    assert_eq!(p.stats().handed_back, 1);
    p.check_invariants();
    assert!(other.cancel());
    let w = p.try_complete_else_watch(op, LONG, &["a"]).unwrap();
    assert!(!w.completed);
    assert_eq!(p.delayed(), 2);
    p.check_invariants();
}

/// Operations that only expire make the purge due by themselves: one `advance` of a
/// purgatory driven by hand runs their expiries and then the purge they made due, with no
/// watch or check to trigger it (Kafka checks on its reaper's every step).
///
/// Catches: a purge scheduled only by a later watch or check (the empty cells stay listed).
#[test]
fn expiries_alone_schedule_the_purge_and_one_advance_runs_it() {
    let clock = ManualClock::new(0);
    let p = manual_purging(&clock, 4);
    let probes: Vec<Probe> = (0..10).map(|_| Probe::default()).collect();
    watch_all(&p, &probes, 10 * MS, &["a", "b"]);
    assert_eq!(p.watched(), 20);
    clock.set_ms(20);
    p.advance();
    assert_eq!(p.stats().expired, 10);
    assert!(p.stats().purges >= 1, "no purge ran");
    assert_eq!(
        p.watched(),
        0,
        "the expired operations' cells are still listed"
    );
    p.check_invariants();
}

/// Operations completed only by force (Kafka's benchmark) are purged by the reaper with no
/// other call: every empty cell leaves the lists, on the real clock, with no later watch, check
/// or advance from the caller.
///
/// Catches: a purge that needs a later call to be scheduled; a purge made due while another
/// runs that is dropped (the last completions' cells would stay).
#[test]
fn forced_completions_alone_are_purged_by_the_reaper() {
    let p: Purgatory<&str, Op> = Purgatory::builder().purge_interval(10).build();
    let probes: Vec<Probe> = (0..200).map(|_| Probe::default()).collect();
    let handles: Vec<_> = probes
        .iter()
        .map(|probe| {
            p.try_complete_else_watch(probe.op(), LONG, &["a", "b", "c"])
                .unwrap()
                .handle
        })
        .collect();
    for h in &handles {
        assert!(h.force_complete());
    }
    let t0 = Instant::now();
    while p.watched() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "hung: {} still listed",
            p.watched()
        );
        std::thread::sleep(MS);
    }
    assert!(p.stats().purges >= 1);
    assert_eq!(p.delayed(), 0);
}

/// Two purgatories share one timer: shutting one down hands back its operations and disarms
/// their entries, and leaves the shared timer (and the other purgatory) running.
#[test]
fn a_shared_timer_outlives_a_purgatory_shutdown() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(hand_driven_timer(&clock).build());
    let p1: Purgatory<&str, Op> = Purgatory::builder().timer(timer.clone()).build();
    let p2: Purgatory<&str, Op> = Purgatory::builder().timer(timer.clone()).build();
    let (a, b) = (Probe::default(), Probe::default());
    p1.try_complete_else_watch(a.op(), 10 * MS, &["k"]).unwrap();
    p2.try_complete_else_watch(b.op(), 10 * MS, &["k"]).unwrap();
    assert_eq!(timer.len(), 2);
    assert_eq!(p1.shutdown().len(), 1);
    assert_eq!(timer.len(), 1, "p1's entry was disarmed");
    assert!(!timer.is_shutdown());
    assert!(
        p1.is_shutdown() && !p2.is_shutdown(),
        "one purgatory's shutdown is its own"
    );
    clock.advance(10 * MS);
    timer.advance();
    assert_eq!(
        b.events().last(),
        Some(&Ev::Expire),
        "p2 still expires through the shared timer"
    );
    assert!(a.events().iter().all(|e| *e == Ev::Try));
}

/// Operations point back at the timer they are armed in (to disarm it), and the timer holds the
/// armed operations and scheduled purges: dropping the purgatory must break that loop, leaving a
/// shared timer referenced by its owner alone (no reference cycle, nothing leaked).
#[test]
fn dropping_a_purgatory_leaves_no_reference_to_a_shared_timer() {
    let clock = ManualClock::new(0);
    let timer = Arc::new(hand_driven_timer(&clock).build());
    let p: Purgatory<&str, Op> = Purgatory::builder()
        .timer(timer.clone())
        .purge_interval(1)
        .build();
    let probes: Vec<Probe> = (0..10).map(|_| Probe::default()).collect();
    let handles: Vec<_> = probes
        .iter()
        .map(|probe| {
            p.try_complete_else_watch(probe.op(), 10 * MS, &["a", "b"])
                .unwrap()
                .handle
        })
        .collect();
    for h in &handles[..3] {
        assert!(h.force_complete());
    }
    probes[3].set_ready();
    assert_eq!(p.check_and_complete(&"a"), 1); // schedules a purge (interval 1), not run yet
    assert!(
        timer.len() >= 6,
        "6 armed operations and a purge wait in the timer"
    );
    drop(handles);
    drop(p);
    assert_eq!(
        timer.len(),
        1,
        "only the purge task is left (it holds no operation)"
    );
    assert_eq!(
        Arc::strong_count(&timer),
        1,
        "nothing else refers to the timer"
    );
    timer.advance();
    assert!(timer.is_empty());
}

/// With its own reaper and executor on the real clock, operations expire by themselves, never
/// before their timeout; the threads of a dropped purgatory end (it joins them).
#[test]
fn the_own_reaper_expires_operations_on_the_real_clock() {
    let p: Purgatory<u8, NeverReady> = Purgatory::builder().name("realclock").build();
    let expiry: Expiry = Arc::default();
    // Taken before the call: the timer's deadline is read inside it, so no later than this.
    let due = Instant::now() + 5 * MS;
    p.try_complete_else_watch(NeverReady(expiry.clone()), 5 * MS, &[1])
        .unwrap();
    let t0 = Instant::now();
    let at = loop {
        if let Some((_, _, at)) = *expiry.lock().unwrap() {
            break at;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "never expired");
        std::thread::sleep(MS);
    };
    assert!(at >= due, "expired {:?} early", due - at);
    // Named by now (a thread names itself once it runs): the one that ran the expiry.
    assert!(
        common::threads_named("realclock") > 0,
        "no threads of its own"
    );
    drop(p);
    common::wait_for_threads_to_end("realclock");
}

/// Where and when an operation expired.
type Expiry = Arc<Mutex<Option<(std::thread::ThreadId, String, Instant)>>>;

/// An operation that is never ready; its expiry records the thread (id and name) and the time.
struct NeverReady(Expiry);

impl DelayedOperation for NeverReady {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {}
    fn on_expiration(&mut self) {
        let t = std::thread::current();
        *self.0.lock().unwrap() = Some((t.id(), t.name().unwrap_or("").to_owned(), Instant::now()));
    }
}

/// With a reaper grace no test outlives, a due operation waits for the next new operation: the
/// `try_complete_else_watch` that comes after its timeout expires it, on the calling thread,
/// before it returns (the own timer runs expiries inline), and `delayed()` says so.
///
/// On a loaded machine the reaper may itself be late: woken by A's add (its bucket is the
/// earliest) but descheduled for more than A's 5 ms, it finds A's bucket due when it looks and
/// expires it, as it should (the grace is how long it sleeps, not a promise to leave due buckets
/// alone). About one run in six did so with three busy loops beside the test (the assertion
/// "expired without a caller" failed). So the scenario is tried again, on a new purgatory, until
/// A is still pending after the sleep; a reaper that expires A every time fails the test.
///
/// Catches: `try_complete_else_watch` not calling `advance_if_due` (A is still pending when B's
/// call returns); a purgatory that does not pass its grace to the own timer (the reaper, with
/// the default grace 0, expires A during the sleep, in every try); expiries run on another
/// thread.
#[test]
fn a_new_operation_expires_due_operations_on_its_callers_thread() {
    const TRIES: usize = 20;
    for _ in 0..TRIES {
        let p: Purgatory<u8, NeverReady> = Purgatory::builder()
            .name("helping")
            .reaper_grace(LONG)
            .build();
        let (a, b) = (Expiry::default(), Expiry::default());
        let due = Instant::now() + 5 * MS;
        let wa = p
            .try_complete_else_watch(NeverReady(a.clone()), 5 * MS, &[1])
            .unwrap();
        std::thread::sleep(30 * MS);
        // The reaper waits an hour past A's bucket, and nothing else advances the timer; but a
        // reaper descheduled since A's add may have found A due when it looked (see above).
        if let Some((_, name, at)) = a.lock().unwrap().clone() {
            assert_eq!(name, "helping-reaper", "expired on {name:?}");
            assert!(at >= due, "expired {:?} early", due - at);
            continue;
        }
        assert!(!wa.handle.is_completed());
        assert_eq!(p.delayed(), 1);
        let wb = p
            .try_complete_else_watch(NeverReady(b.clone()), LONG, &[2])
            .unwrap();
        assert!(!wb.completed);
        let (on, _, at) = a
            .lock()
            .unwrap()
            .clone()
            .expect("B's call did not expire A");
        assert_eq!(on, std::thread::current().id(), "expired on another thread");
        assert!(at >= due, "expired {:?} early", due - at);
        assert!(wa.handle.is_completed() && !wb.handle.is_completed());
        assert_eq!(p.delayed(), 1, "only B is delayed");
        assert_eq!(p.stats().expired, 1);
        assert!(p.timer().stats().caller_advances >= 1);
        p.check_invariants();
        return;
    }
    panic!("expired without a caller in each of {TRIES} tries: the reaper ignores the grace");
}

/// With the grace suggested for busy purgatories (two ticks), an operation expires with no
/// other call: the reaper's own alarm, not before its timeout, on the reaper thread.
///
/// Catches: a reaper that waits for callers for ever once it has a grace (alarm disarmed or
/// never set: hang); an expiry before the timeout; an own timer whose threads do not carry the
/// purgatory's name (KAFKA-19386: every reaper thread named after a `null` purgatory).
#[test]
fn with_the_busy_grace_operations_expire_without_new_operations() {
    let p: Purgatory<u8, NeverReady> = Purgatory::builder()
        .name("alone")
        .reaper_grace(purgatory::BUSY_REAPER_GRACE)
        .build();
    let a = Expiry::default();
    let timeout = 10 * MS;
    let due = Instant::now() + timeout;
    let w = p
        .try_complete_else_watch(NeverReady(a.clone()), timeout, &[1])
        .unwrap();
    let t0 = Instant::now();
    while a.lock().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never expired");
        std::thread::sleep(MS);
    }
    let (_, name, at) = a.lock().unwrap().clone().unwrap();
    assert!(at >= due, "expired {:?} early", due - at);
    assert_eq!(name, "alone-reaper", "expired on {name:?}");
    assert!(w.handle.is_completed());
    assert_eq!(p.delayed(), 0);
    assert_eq!(p.timer().stats().caller_advances, 0);
}

/// The purge interval defaults to 1000 (DESIGN.md, Kafka's `purgeInterval`): on a purgatory
/// built with the defaults and driven by hand, operations completed one by one by checks
/// schedule no purge before the 1000th completion, and one by the 1500th (the completions are
/// counted in per-thread batches, documented to lag by less than half the interval); the
/// advance after it runs the purge.
///
/// Catches: another default (a purge before the 1000th completion, or none by the 1500th).
#[test]
fn the_default_purge_interval_is_1000() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let probes: Vec<Probe> = (0..1_600).map(|_| Probe::default()).collect();
    watch_all(&p, &probes, LONG, &["a", "b"]);
    let mut first_purge = None;
    for (i, probe) in probes[..1_500].iter().enumerate() {
        probe.set_ready();
        assert_eq!(p.check_and_complete(&"a"), 1);
        p.advance();
        if p.stats().purges > 0 {
            first_purge = Some(i + 1);
            break;
        }
    }
    let n = first_purge.expect("no purge after 1500 completions");
    assert!(n >= 1_000, "a purge after only {n} completions");
    assert_eq!(
        p.stats().keys,
        2,
        "the purge keeps the keys with pending operations"
    );
    assert_eq!(
        p.watched(),
        2 * (1_600 - n),
        "the sweep left only the pending entries on each key"
    );
    p.check_invariants();
}

/// An empty key set is a programmer error refused with the operation, and it leaves nothing
/// half-registered: no watch entry, no key, no timer entry, no count; the purgatory stays
/// usable and the next operation is watched, armed and completed as usual.
///
/// Catches: a refusal after the timer was armed or the operation counted (a timer entry that
/// later expires an operation the caller got back, or a `delayed()` that never drops).
#[test]
fn an_empty_key_set_registers_nothing_and_leaves_the_purgatory_usable() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let refused = Probe::default();
    for _ in 0..3 {
        match p.try_complete_else_watch(refused.op(), MS, &[]) {
            Err(WatchError::NoKeys(op)) => drop(op),
            other => panic!("expected NoKeys, got {other:?}"),
        }
    }
    assert!(refused.events().is_empty(), "a refused op is untouched");
    let st = p.stats();
    assert_eq!(
        (
            st.accepted,
            st.completed,
            st.handed_back,
            st.delayed,
            st.watched,
            st.keys
        ),
        (0, 0, 0, 0, 0, 0),
        "{st:?}"
    );
    assert_eq!(p.timer().len(), 0, "nothing armed");
    clock.advance(10 * MS);
    assert_eq!(p.advance(), 0, "nothing to expire");
    assert!(refused.events().is_empty());
    let probe = Probe::default();
    let w = p.try_complete_else_watch(probe.op(), LONG, &["a"]).unwrap();
    assert_eq!((p.watched(), p.delayed()), (1, 1));
    probe.set_ready();
    assert_eq!(p.check_and_complete(&"a"), 1);
    assert!(w.handle.is_completed());
    assert_eq!((p.watched(), p.delayed(), p.timer().len()), (0, 0, 0));
    p.check_invariants();
}

/// Completed operations do not pin memory, whichever path completes them: by force, by expiry
/// or by a check of one key, an operation still watched on another key has its payload dropped
/// at completion, though the caller still holds its handle (and no purge ran).
///
/// Catches: a payload kept alive by the handle or by the other key's watch list until a purge
/// (KAFKA-19389), on any of the three paths.
#[test]
fn a_completed_operation_releases_its_payload_at_once_on_every_path() {
    #[derive(Clone, Copy, Debug)]
    enum Path {
        Force,
        Expiry,
        Check,
    }
    for path in [Path::Force, Path::Expiry, Path::Check] {
        let clock = ManualClock::new(0);
        let p = manual(&clock);
        let probe = Probe::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut op = probe.op();
        op._payload = Some(Payload(drops.clone(), vec![0u8; 1 << 20]));
        let w = p.try_complete_else_watch(op, 5 * MS, &["A", "B"]).unwrap();
        assert_eq!(drops.load(SeqCst), 0, "{path:?}");
        match path {
            Path::Force => assert!(w.handle.force_complete()),
            Path::Expiry => {
                clock.advance(5 * MS);
                assert_eq!(p.advance(), 1);
            }
            Path::Check => {
                probe.set_ready();
                assert_eq!(p.check_and_complete(&"A"), 1);
            }
        }
        assert!(w.handle.is_completed(), "{path:?}");
        assert_eq!(
            drops.load(SeqCst),
            1,
            "{path:?}: payload still alive after completion"
        );
        assert!(w.handle.with(|_| ()).is_none(), "{path:?}");
        assert_eq!(p.stats().purges, 0, "{path:?}: no purge happened");
        assert_eq!(p.delayed(), 0, "{path:?}");
    }
}

/// An operation that gives no argument to the ready test (the trait's default `ready_arg`) is
/// never put to it: a purgatory whose test rules every argument out still calls its
/// `try_complete` at a check, and completes it once it is ready.
///
/// Catches: a default `ready_arg` that gives an argument (`Some(0)`, `Some(1)`): the test is then
/// asked, rules the operation out, and the check loses its completion.
#[test]
fn an_operation_without_a_ready_arg_is_never_put_to_the_ready_test() {
    let clock = ManualClock::new(0);
    let asked = Arc::new(AtomicUsize::new(0));
    let p: Purgatory<&'static str, Op> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .ready_test({
            let asked = Arc::clone(&asked);
            move |_: &&'static str, _| {
                asked.fetch_add(1, SeqCst);
                false
            }
        })
        .build();
    let probe = Probe::default();
    let w = p.try_complete_else_watch(probe.op(), LONG, &["k"]).unwrap();
    assert_eq!(p.check_and_complete(&"k"), 0, "not ready yet");
    assert_eq!(probe.tries(), 3, "the check called try_complete");
    probe.set_ready();
    assert_eq!(p.check_and_complete(&"k"), 1);
    assert!(w.handle.is_completed());
    assert_eq!(asked.load(SeqCst), 0, "the ready test was asked");
    p.check_invariants();
}

/// `expiry_threads(n)` runs the expiries on the own timer's executor threads, named after the
/// purgatory (`<name>-executor-<i>`), not on its reaper; the settings given before it are kept.
///
/// Catches: `expiry_threads` ignored (the reaper runs them, inline) or resetting the builder
/// (the name given before it lost: threads named `purgatory-...`).
#[test]
fn expiry_threads_run_expiries_on_executor_threads_named_after_the_purgatory() {
    let p: Purgatory<u8, NeverReady> = Purgatory::builder().name("exec").expiry_threads(2).build();
    let a = Expiry::default();
    let w = p
        .try_complete_else_watch(NeverReady(a.clone()), 5 * MS, &[1])
        .unwrap();
    let t0 = Instant::now();
    while a.lock().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never expired");
        std::thread::sleep(MS);
    }
    let (on, name, _) = a.lock().unwrap().clone().unwrap();
    assert!(name.starts_with("exec-executor-"), "expired on {name:?}");
    assert_ne!(on, std::thread::current().id());
    assert!(w.handle.is_completed());
    assert_eq!(p.stats().expired, 1);
}

/// Without a reaper, expiries run on the thread that advances, even when expiry threads were
/// asked for (`reaper(false)` makes the own timer inline): `advance` returns with the due
/// operation expired, on the caller's thread.
///
/// Catches: a reaperless purgatory that keeps the executor threads (the expiry then runs on
/// one of them, perhaps after `advance` returned).
#[test]
fn without_a_reaper_expiries_run_in_advance_even_with_expiry_threads() {
    let clock = ManualClock::new(0);
    let p: Purgatory<u8, NeverReady> = Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .expiry_threads(2)
        .build();
    let a = Expiry::default();
    let w = p
        .try_complete_else_watch(NeverReady(a.clone()), 5 * MS, &[1])
        .unwrap();
    clock.advance(5 * MS);
    assert_eq!(p.advance(), 1);
    let (on, name, _) = a
        .lock()
        .unwrap()
        .clone()
        .expect("advance returned before the expiry ran");
    assert_eq!(
        on,
        std::thread::current().id(),
        "expired on another thread ({name:?})"
    );
    assert!(w.handle.is_completed());
    assert_eq!((p.delayed(), p.stats().expired), (0, 1));
}

/// The public types' `Debug` output names the type and shows its state: a builder its settings,
/// the purgatory its name and delayed count, `Watched` whether the call completed the operation,
/// a handle whether it has completed since; a hint (an opaque closure) only its type.
///
/// Catches: a `Debug` impl that prints nothing.
#[test]
fn debug_output_names_each_type_and_shows_its_state() {
    let clock = ManualClock::new(0);
    let b = Purgatory::<&'static str, Op>::builder()
        .name("dbg")
        .clock(clock.clone())
        .reaper(false)
        .purge_interval(7);
    let shown = format!("{b:?}");
    assert!(
        shown.starts_with("Builder {")
            && shown.contains("name: \"dbg\"")
            && shown.contains("reaper: false")
            && shown.contains("purge_interval: 7"),
        "{shown}"
    );
    let p = b.build();
    let probe = Probe::default();
    let w = p.try_complete_else_watch(probe.op(), LONG, &["a"]).unwrap();
    assert_eq!(
        format!("{w:?}"),
        "Watched { completed: false, handle: OperationHandle { completed: false } }"
    );
    assert_eq!(format!("{p:?}"), "Purgatory { name: \"dbg\", delayed: 1 }");
    assert!(w.handle.force_complete());
    assert_eq!(
        format!("{:?}", w.handle),
        "OperationHandle { completed: true }"
    );
    assert_eq!(format!("{p:?}"), "Purgatory { name: \"dbg\", delayed: 0 }");
    assert_eq!(format!("{:?}", ReadyHint::new(|| true)), "ReadyHint { .. }");
}

/// A key of the kind a broker watches (a topic name: memory of its own) is cloned only to
/// create its list, not on every watch: a hundred operations on two keys clone each key once,
/// and once more after a check has dropped an emptied list.
#[test]
fn a_watched_key_is_cloned_only_to_create_its_list() {
    /// A key that counts its clones.
    struct Key(&'static str, Arc<AtomicUsize>);
    impl Clone for Key {
        fn clone(&self) -> Self {
            self.1.fetch_add(1, SeqCst);
            Key(self.0, Arc::clone(&self.1))
        }
    }
    impl PartialEq for Key {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for Key {}
    impl std::hash::Hash for Key {
        fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
            self.0.hash(h);
        }
    }
    struct Ready(Arc<AtomicBool>);
    impl DelayedOperation for Ready {
        fn try_complete(&mut self) -> bool {
            self.0.load(SeqCst)
        }
        fn on_complete(&mut self) {}
    }
    let clones = Arc::new(AtomicUsize::new(0));
    let keys = [
        Key("orders-0", clones.clone()),
        Key("orders-1", clones.clone()),
    ];
    let p: Purgatory<Key, Ready> = Purgatory::builder().reaper(false).build();
    let ready = Arc::new(AtomicBool::new(false));
    for _ in 0..100 {
        p.try_complete_else_watch(Ready(ready.clone()), LONG, &keys)
            .unwrap();
    }
    assert_eq!(clones.load(SeqCst), 2, "one clone per key's list");
    assert_eq!(p.watched(), 200);
    ready.store(true, SeqCst);
    assert_eq!(p.check_and_complete(&keys[0]), 100);
    assert_eq!(p.stats().keys, 1, "the emptied list of orders-0 is dropped");
    p.try_complete_else_watch(Ready(Arc::new(AtomicBool::new(false))), LONG, &keys)
        .unwrap();
    assert_eq!(clones.load(SeqCst), 3, "orders-0's list created again");
}
