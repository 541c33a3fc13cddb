//! Loom models of `Purgatory`: one race per test, named after the race (see `shared/LOOM.md`,
//! §6, races R3, R5, R6 and R7, plus forced completion, shutdown and the purge's scheduling).
//!
//! Run with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --profile loom -p purgatory --test loom_purgatory -- --nocapture
//! ```
//!
//! Every purgatory is built with `.reaper(false)` on a `ManualClock` (its own timer is then
//! inline), and expiry is driven by [`set_clock`] plus `Purgatory::advance`, so an expiry runs
//! on the thread that advanced. Under loom the watch map is one loom `Mutex<HashMap>`: a lock
//! cycle between the map and an operation's lock is reported as a deadlock.
//!
//! Every operation is an [`Op`] holding loom `Arc`s (its ready flag and the shared event log),
//! so an operation the purgatory leaks fails the model as "Arc leaked."; each call the purgatory
//! makes on an operation appends an [`Ev`] to the log (under a loom mutex, so the log's order is
//! the order in which the calls really happened). An operation also asserts, on its own state
//! (which the purgatory guards with the operation's lock), that `try_complete` is never called
//! after completion, and that `on_expiration` follows `on_complete`.
//!
//! Each model returns the name of the outcome its execution reached, and [`model`] fails unless
//! every outcome the race allows was reached in some execution: a model that stops exploring
//! the race fails instead of passing vacuously. With `--nocapture` it prints the number of
//! executions and how often each outcome was reached.
#![cfg(loom)]

use std::collections::BTreeMap;
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use purgatory::{DelayedOperation, OperationHandle, Purgatory, ReadyHint, WatchError};
use system_timer::{ManualClock, SystemTimer};

const MS: Duration = Duration::from_millis(1);
/// A timeout no model reaches: the operation can only complete by a check or by force.
const LONG: Duration = Duration::from_secs(3600);
/// The watch key of the models.
const K: u8 = 1;
/// A second key (R7: an operation watched on two keys).
const K2: u8 = 2;

/// Loom's branch cap for these models. The purgatory's `check_invariants` ends with the timer's,
/// which walks the wheel's bucket markers (a loom atomic each); raising the cap adds no
/// interleavings (the checks run after every thread is joined), it only lets an execution be
/// longer.
const MAX_BRANCHES: usize = 10_000;

/// Runs `f` under loom (settings from the environment, as `loom::model`, but with at least
/// [`MAX_BRANCHES`]) and checks that each of `expected` outcomes was reached by some execution,
/// and no other.
///
/// `loom::model::Builder::check` logs nothing (only `loom::model` installs the `tracing`
/// subscriber that `LOOM_LOG` needs), so this prints the number of executions itself.
// The tally and the timing are the harness's, outside the model: std on purpose.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn model(expected: &'static [&'static str], f: impl Fn() -> &'static str + Sync + Send + 'static) {
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<&str, usize>::new()));
    let mut builder = loom::model::Builder::new();
    builder.max_branches = builder.max_branches.max(MAX_BRANCHES);
    let seen = std::sync::Arc::clone(&outcomes);
    let started = std::time::Instant::now();
    builder.check(move || {
        let outcome = f();
        *seen.lock().unwrap().entry(outcome).or_default() += 1;
    });
    let outcomes = outcomes.lock().unwrap();
    let name = std::thread::current().name().unwrap_or("model").to_owned();
    println!(
        "{name}: completed in {} iterations, {:.2?}; outcomes {outcomes:?}",
        outcomes.values().sum::<usize>(),
        started.elapsed()
    );
    for e in expected {
        assert!(
            outcomes.contains_key(e),
            "{name}: outcome {e:?} never reached (reached: {outcomes:?})"
        );
    }
    for o in outcomes.keys() {
        assert!(expected.contains(o), "{name}: unexpected outcome {o:?}");
    }
}

/// Sets the clock to `ms` (a single `fetch_max`, which loom explores fully; `ManualClock::advance`
/// is a `fetch_update`, whose racing reads loom 0.7.2 does not explore: see `loom_timer.rs`).
fn set_clock(clock: &ManualClock, ms: u64) {
    clock.set_ms(ms);
}

/// A call the purgatory made on an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    /// `try_complete` of operation `id`, and what it answered.
    Try { id: u32, ready: bool },
    /// `on_complete` of operation `id`.
    Complete(u32),
    /// `on_expiration` of operation `id`.
    Expire(u32),
}

/// The calls, in the order they happened.
#[derive(Clone)]
struct Log(Arc<Mutex<Vec<Ev>>>);

impl Log {
    fn new() -> Self {
        Log(Arc::new(Mutex::new(Vec::new())))
    }
    fn push(&self, ev: Ev) {
        self.0.lock().unwrap().push(ev);
    }
    fn events(&self) -> Vec<Ev> {
        self.0.lock().unwrap().clone()
    }
    /// Operation `id`'s events, in order.
    fn of(&self, id: u32) -> Vec<Ev> {
        self.events()
            .into_iter()
            .filter(|e| match *e {
                Ev::Try { id: i, .. } | Ev::Complete(i) | Ev::Expire(i) => i == id,
            })
            .collect()
    }
    /// What operation `id`'s `try_complete` calls answered, in order.
    fn tries(&self, id: u32) -> Vec<bool> {
        self.of(id)
            .into_iter()
            .filter_map(|e| match e {
                Ev::Try { ready, .. } => Some(ready),
                _ => None,
            })
            .collect()
    }
    fn completes(&self, id: u32) -> usize {
        self.of(id)
            .iter()
            .filter(|e| **e == Ev::Complete(id))
            .count()
    }
    fn expires(&self, id: u32) -> usize {
        self.of(id).iter().filter(|e| **e == Ev::Expire(id)).count()
    }
}

/// The test's side of an operation: its id, its ready flag and the log.
#[derive(Clone)]
struct Probe {
    id: u32,
    ready: Arc<AtomicBool>,
    log: Log,
}

impl Probe {
    fn new(id: u32, log: &Log) -> Self {
        Probe {
            id,
            ready: Arc::new(AtomicBool::new(false)),
            log: log.clone(),
        }
    }
    /// A fresh operation for this probe (not ready until [`set_ready`](Self::set_ready)).
    fn op(&self) -> Op {
        Op {
            id: self.id,
            ready: Arc::clone(&self.ready),
            log: self.log.clone(),
            completed: false,
            hinted: false,
            tested: false,
        }
    }
    /// The operation the model asks for: plain, with a [`ReadyHint`] over the same flag, or
    /// with its id as its argument to the purgatory's ready test (see [`purgatory_for`]).
    fn op_for(&self, skip: Skip) -> Op {
        Op {
            hinted: skip == Skip::Hint,
            tested: skip == Skip::Test,
            ..self.op()
        }
    }
    /// The event that makes the operation completable (Release: a real operation publishes its
    /// state this way; the purgatory's locks must make it visible to the next `try_complete`).
    fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }
}

/// A delayed operation: ready once its probe's flag is set; logs every call.
struct Op {
    id: u32,
    ready: Arc<AtomicBool>,
    log: Log,
    /// Set by `on_complete`. Plain state: the purgatory runs every method under the op lock.
    completed: bool,
    /// Offers a `ReadyHint` reading `ready` (Acquire) without the op lock.
    hinted: bool,
    /// Gives its id to the purgatory's ready test, which reads `ready` (Acquire).
    tested: bool,
}

/// How a check may skip an operation without its lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Skip {
    /// It may not: every check locks it and calls `try_complete` (Kafka's check).
    Never,
    /// Its [`ReadyHint`] says not ready.
    Hint,
    /// The purgatory's ready test ([`purgatory::Builder::ready_test`]) says not ready.
    Test,
}

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        assert!(
            !self.completed,
            "op {}: try_complete after completion",
            self.id
        );
        let ready = self.ready.load(Ordering::Acquire);
        self.log.push(Ev::Try { id: self.id, ready });
        ready
    }
    fn on_complete(&mut self) {
        assert!(!self.completed, "op {}: on_complete twice", self.id);
        self.completed = true;
        self.log.push(Ev::Complete(self.id));
    }
    fn on_expiration(&mut self) {
        assert!(
            self.completed,
            "op {}: on_expiration before on_complete",
            self.id
        );
        self.log.push(Ev::Expire(self.id));
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        let ready = Arc::clone(&self.ready);
        self.hinted
            .then(|| ReadyHint::new(move || ready.load(Ordering::Acquire)))
    }
    fn ready_arg(&self) -> Option<u64> {
        self.tested.then_some(u64::from(self.id))
    }
}

/// A thread that makes `probe`'s op ready and then checks `K` (what a producer does after an
/// append); it returns how many operations that check completed.
fn spawn_ready_check(p: &Arc<Purgatory<u8, Op>>, probe: &Probe) -> thread::JoinHandle<usize> {
    let (p, probe) = (Arc::clone(p), probe.clone());
    thread::spawn(move || {
        probe.set_ready();
        p.check_and_complete(&K)
    })
}

/// Op 1 watched on `K`, not ready, with a long timeout; then a thread makes it ready and checks
/// `K` ([`spawn_ready_check`]) while this one runs `act` on its handle. Returns the purgatory,
/// the handle, what `act` returned, and how many operations the check completed.
fn race_a_ready_check<R>(
    log: &Log,
    act: impl FnOnce(&OperationHandle<Op>) -> R,
) -> (Arc<Purgatory<u8, Op>>, OperationHandle<Op>, R, usize) {
    let clock = ManualClock::new(0);
    let p = Arc::new(purgatory(&clock));
    let probe = Probe::new(1, log);
    let w = p.try_complete_else_watch(probe.op(), LONG, &[K]).unwrap();
    assert!(!w.completed);
    let checker = spawn_ready_check(&p, &probe);
    let acted = act(&w.handle);
    let checked = checker.join().unwrap();
    (p, w.handle, acted, checked)
}

/// Nothing is left of a race's one operation: not counted as delayed, no timer entry, and no
/// watch-list entry once purged; the invariants hold.
fn assert_nothing_left(p: &Purgatory<u8, Op>, delayed_why: &str) {
    assert_eq!(p.delayed(), 0, "{delayed_why}");
    assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
    p.purge();
    assert_eq!(p.watched(), 0);
    p.check_invariants();
}

/// A purgatory on a manual clock, without a reaper: its own timer is inline and expiries run in
/// `advance`.
fn purgatory(clock: &ManualClock) -> Purgatory<u8, Op> {
    Purgatory::builder()
        .clock(clock.clone())
        .reaper(false)
        .build()
}

/// The same, with a ready test reading `probe`'s flag when the model asks for [`Skip::Test`].
fn purgatory_for(clock: &ManualClock, skip: Skip, probe: &Probe) -> Purgatory<u8, Op> {
    let b = Purgatory::builder().clock(clock.clone()).reaper(false);
    if skip != Skip::Test {
        return b.build();
    }
    let (ready, id) = (Arc::clone(&probe.ready), u64::from(probe.id));
    b.ready_test(move |_key: &u8, arg| {
        assert_eq!(arg, id, "the test gets the operation's own argument");
        ready.load(Ordering::Acquire)
    })
    .build()
}

/// R3: operation completed by `check_and_complete` and by expiry at once. The op (timeout
/// 10 ms) is watched on `K`; main makes it ready and checks `K`, while the reaper moves the clock
/// to 10 ms and advances (running the expiry inline). `on_complete` runs exactly once;
/// `on_expiration` only if the check did not complete it, and right after `on_complete`; the
/// timer entry is cancelled or its run is a no-op; nothing is left armed, counted or watched.
#[test]
fn check_and_complete_races_expiry() {
    check_and_complete_races_expiry_model(Skip::Never);
}

/// R3 with a [`ReadyHint`]: the check reads the hint with no lock while the expiry completes
/// the op under its lock (the hint may run after completion); still exactly once.
#[test]
fn check_and_complete_with_a_ready_hint_races_expiry() {
    check_and_complete_races_expiry_model(Skip::Hint);
}

/// R3 with the purgatory's ready test: the check asks it with the argument kept in the watch
/// list, reading nothing of the op, while the expiry completes the op; still exactly once.
#[test]
fn check_and_complete_with_a_ready_test_races_expiry() {
    check_and_complete_races_expiry_model(Skip::Test);
}

fn check_and_complete_races_expiry_model(skip: Skip) {
    const OUTCOMES: &[&str] = &[
        "completed by the check, timer entry cancelled",
        "completed by the check, expiry ran and found it completed",
        "expired",
    ];
    model(OUTCOMES, move || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let probe = Probe::new(1, &log);
        let p = Arc::new(purgatory_for(&clock, skip, &probe));
        let w = p
            .try_complete_else_watch(probe.op_for(skip), 10 * MS, &[K])
            .unwrap();
        assert!(!w.completed);
        assert_eq!(p.delayed(), 1);

        let reaper = {
            let (p, clock) = (Arc::clone(&p), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 10);
                p.advance()
            })
        };
        probe.set_ready();
        let checked = p.check_and_complete(&K);
        let ran = reaper.join().unwrap();

        let ev = log.of(1);
        let expired = log.expires(1);
        assert_eq!(log.completes(1), 1, "on_complete exactly once: {ev:?}");
        assert_eq!(
            checked + expired,
            1,
            "exactly one of check / expiry completes it (checked {checked}): {ev:?}"
        );
        if expired == 1 {
            assert_eq!(
                ev[ev.len() - 2..],
                [Ev::Complete(1), Ev::Expire(1)],
                "on_expiration right after on_complete, and last"
            );
            assert_eq!(ran, 1, "the expiry ran in the advance");
        } else {
            assert_eq!(ev.last(), Some(&Ev::Complete(1)));
        }
        assert!(ran <= 1);
        assert!(w.handle.is_completed());
        assert!(!w.handle.force_complete(), "completed once already");
        assert_eq!(p.delayed(), 0, "nothing is armed");
        assert_eq!(p.timer().len(), 0, "the timer holds nothing");
        p.purge();
        assert_eq!(p.watched(), 0, "the watch lists are empty after a purge");
        let st = p.stats();
        assert_eq!(
            (st.accepted, st.completed, st.expired),
            (1, 1, expired as u64)
        );
        p.check_invariants();
        match (expired, ran) {
            (1, _) => OUTCOMES[2],
            (_, 0) => OUTCOMES[0],
            _ => OUTCOMES[1],
        }
    });
}

/// R6: the double check in `try_complete_else_watch`. Main watches the op on `K` while T1 makes
/// it ready and checks `K`. Whenever the event happens (before the first try, between the first
/// try and the watch, or after), the op is completed after join, without waiting for its
/// expiry: by the call itself (first or second try) or by the check, exactly once.
#[test]
fn event_between_first_try_and_watch_is_not_lost() {
    event_between_first_try_and_watch(Skip::Never);
}

/// R6 with a [`ReadyHint`]: the check reads the hint without the op's lock and skips the op
/// when it says not ready; an event between the first try and the watch is still never lost
/// (the watcher's second try, under the lock, follows the append), and the op completes
/// exactly once.
#[test]
fn event_between_first_try_and_watch_is_not_lost_with_a_ready_hint() {
    event_between_first_try_and_watch(Skip::Hint);
}

/// R6 with the purgatory's ready test: the check skips the op by the argument kept beside it
/// in the watch list; an event between the first try and the watch is still never lost.
#[test]
fn event_between_first_try_and_watch_is_not_lost_with_a_ready_test() {
    event_between_first_try_and_watch(Skip::Test);
}

fn event_between_first_try_and_watch(skip: Skip) {
    const OUTCOMES: &[&str] = &[
        "ready at the first try",
        "ready at the second try",
        "completed by the check",
    ];
    model(OUTCOMES, move || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let probe = Probe::new(1, &log);
        let p = Arc::new(purgatory_for(&clock, skip, &probe));

        let checker = spawn_ready_check(&p, &probe);
        let w = p
            .try_complete_else_watch(probe.op_for(skip), LONG, &[K])
            .unwrap();
        let checked = checker.join().unwrap();

        let ev = log.of(1);
        assert!(
            w.handle.is_completed(),
            "lost wakeup: the op is still pending, waiting for its expiry: {ev:?}"
        );
        assert_eq!(
            usize::from(w.completed) + checked,
            1,
            "either the watcher's tries or the check completed it (checked {checked}): {ev:?}"
        );
        assert_eq!(log.completes(1), 1, "{ev:?}");
        assert_eq!(log.expires(1), 0, "{ev:?}");
        let tries = log.tries(1);
        assert_eq!(tries.last(), Some(&true), "the last try saw readiness");
        assert!(
            tries[..tries.len() - 1].iter().all(|r| !r),
            "completed at its first ready try: {ev:?}"
        );
        assert_eq!(
            p.delayed(),
            0,
            "delayed() counts an operation that is no longer pending"
        );
        assert_eq!(p.timer().len(), 0, "the timer entry is gone");
        p.purge();
        assert_eq!(p.watched(), 0);
        p.check_invariants();
        match (checked, tries.len()) {
            (1, _) => OUTCOMES[2],
            (_, 1) => OUTCOMES[0],
            _ => OUTCOMES[1],
        }
    });
}

/// R5: watch races remove-if-empty. op1 is the only watcher of `K`; main watches op2 on `K`
/// while T1 makes op1 ready and checks `K`, which completes op1 and sweeps `K`'s list (dropping
/// the key if the list is then empty). op2 must never land in a list already detached from the
/// map: after join, once op2 is ready, a check of `K` completes it.
#[test]
fn watch_races_remove_if_empty() {
    const OUTCOMES: &[&str] = &["the check saw op2", "the check missed op2"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let (probe1, probe2) = (Probe::new(1, &log), Probe::new(2, &log));
        let w1 = p.try_complete_else_watch(probe1.op(), LONG, &[K]).unwrap();
        assert!(!w1.completed);

        let checker = {
            let (p, probe1) = (Arc::clone(&p), probe1.clone());
            thread::spawn(move || {
                probe1.set_ready();
                p.check_and_complete(&K)
            })
        };
        let w2 = p.try_complete_else_watch(probe2.op(), LONG, &[K]).unwrap();
        let checked = checker.join().unwrap();

        assert!(!w2.completed, "op2 is not ready");
        assert_eq!(checked, 1, "the check completes op1 (the only ready op)");
        assert!(w1.handle.is_completed() && !w2.handle.is_completed());
        // op2's tries: the first and second by its watcher, a third if the check scanned it.
        let saw_op2 = match log.tries(2).len() {
            2 => false,
            3 => true,
            n => panic!("op2 tried {n} times: {:?}", log.events()),
        };
        assert_eq!(p.delayed(), 1, "op2 is armed");
        assert_eq!(
            (p.watched(), p.stats().keys),
            (1, 1),
            "op2 is lost: it was appended to a list already dropped from the map \
             (op1's cell is swept by the check)"
        );
        p.check_invariants();

        probe2.set_ready();
        assert_eq!(
            p.check_and_complete(&K),
            1,
            "op2 is lost: it was appended to a list already dropped from the map: {:?}",
            log.events()
        );
        assert_eq!((log.completes(1), log.completes(2)), (1, 1));
        assert_eq!(log.expires(1) + log.expires(2), 0);
        assert_eq!(
            p.delayed(),
            0,
            "delayed() counts an operation that is no longer pending"
        );
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        assert_eq!(
            (p.watched(), p.stats().keys),
            (0, 0),
            "the last check drops the key"
        );
        p.check_invariants();
        if saw_op2 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// R7: lock order between watching and checking. opA is already watched on `K`; main watches
/// opB on `K` and `K2` (holding opB's lock across both appends, so it takes the map lock twice
/// under it) while T1 makes opA ready and checks `K` (which takes the op locks of `K`'s
/// operations). A check that held the map lock while taking an op lock would deadlock with the
/// watcher (reported by loom). Both operations end consistent: opA completed once by the check,
/// opB pending, armed and watched on both keys until it is forced.
#[test]
fn watch_and_check_lock_order() {
    const OUTCOMES: &[&str] = &["the check saw opB", "the check missed opB"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let (a, b) = (Probe::new(1, &log), Probe::new(2, &log));
        let wa = p.try_complete_else_watch(a.op(), LONG, &[K]).unwrap();
        assert!(!wa.completed);

        let checker = {
            let (p, a) = (Arc::clone(&p), a.clone());
            thread::spawn(move || {
                a.set_ready();
                p.check_and_complete(&K)
            })
        };
        let wb = p.try_complete_else_watch(b.op(), LONG, &[K, K2]).unwrap();
        let checked = checker.join().unwrap();

        assert_eq!(checked, 1, "the check completes opA");
        assert_eq!((log.completes(1), log.expires(1)), (1, 0));
        assert!(wa.handle.is_completed());
        assert!(
            !wb.completed && !wb.handle.is_completed(),
            "opB is not ready"
        );
        assert_eq!(log.completes(2), 0);
        let saw_b = match log.tries(2).len() {
            2 => false,
            3 => true,
            n => panic!("opB tried {n} times: {:?}", log.events()),
        };
        assert_eq!(p.delayed(), 1, "opB is armed");
        assert_eq!(
            p.watched(),
            2,
            "opB on both keys; opA's cell swept by the check"
        );
        p.check_invariants();

        assert!(wb.handle.force_complete());
        assert_eq!((log.completes(2), log.expires(2)), (1, 0));
        assert_eq!(
            p.delayed(),
            0,
            "delayed() counts an operation that is no longer pending"
        );
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        p.purge();
        assert_eq!(p.watched(), 0);
        p.check_invariants();
        if saw_b {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// A forced completion (Kafka's `forceComplete`, through the handle) races a check that finds
/// the op ready: exactly one of them completes it, `on_complete` runs once, and the timer entry
/// is disarmed.
#[test]
fn force_complete_races_check() {
    const OUTCOMES: &[&str] = &["forced", "completed by the check"];
    model(OUTCOMES, || {
        let log = Log::new();
        let (p, handle, forced, checked) = race_a_ready_check(&log, |h| h.force_complete());

        let ev = log.of(1);
        assert_eq!(
            usize::from(forced) + checked,
            1,
            "exactly one of force / check completes it (forced {forced}, checked {checked}): {ev:?}"
        );
        assert_eq!(log.completes(1), 1, "{ev:?}");
        assert_eq!(log.expires(1), 0, "{ev:?}");
        assert_eq!(
            ev.last(),
            Some(&Ev::Complete(1)),
            "no call after completion"
        );
        assert!(handle.is_completed() && !handle.force_complete());
        assert_nothing_left(
            &p,
            "delayed() counts an operation that is no longer pending",
        );
        if forced {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// `shutdown` races `try_complete_else_watch` of an op that is not ready. The op is handed back
/// exactly once: by `shutdown`, or in `Err(WatchError::Shutdown(op))` (refused before it was
/// tried, or mid-watch once the map closed); never both, never neither, and never completed
/// (`on_complete` is not called, then or later: a forced completion and an advance past its
/// timeout find it gone).
#[test]
fn shutdown_races_watch() {
    const OUTCOMES: &[&str] = &[
        "refused before any try",
        "refused mid-watch",
        "handed back by shutdown",
    ];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let probe = Probe::new(1, &log);

        let watcher = {
            let (p, probe) = (Arc::clone(&p), probe.clone());
            thread::spawn(move || p.try_complete_else_watch(probe.op(), 10 * MS, &[K]))
        };
        let returned = p.shutdown();
        let watched = watcher.join().unwrap();

        let tries = log.tries(1).len();
        let outcome = match watched {
            Ok(w) => {
                assert!(!w.completed);
                assert_eq!(returned.len(), 1, "accepted, so shutdown hands it back");
                assert_eq!(returned[0].id, 1);
                assert!(!returned[0].completed, "handed back after on_complete");
                assert!(w.handle.is_completed(), "a handed-back op counts as done");
                assert!(!w.handle.force_complete(), "forced after being handed back");
                assert_eq!(tries, 2, "both tries ran before shutdown took it");
                OUTCOMES[2]
            }
            Err(WatchError::Shutdown(op)) => {
                assert_eq!(op.id, 1);
                assert!(!op.completed, "refused after on_complete");
                assert!(
                    returned.is_empty(),
                    "refused and also handed back by shutdown"
                );
                if tries == 0 {
                    OUTCOMES[0]
                } else {
                    assert_eq!(
                        tries, 1,
                        "refused at the watch, after the first try (two tries: the op was \
                         appended after shutdown drained the map, and only the timer refused it)"
                    );
                    OUTCOMES[1]
                }
            }
            Err(e) => panic!("unexpected {e:?}"),
        };
        drop(returned);
        set_clock(&clock, 20);
        assert_eq!(p.advance(), 0, "an expiry ran after shutdown");
        assert_eq!(log.completes(1), 0, "on_complete of a handed-back op");
        assert_eq!(log.expires(1), 0);
        assert_eq!(
            p.delayed(),
            0,
            "delayed() counts an operation that is no longer pending"
        );
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        assert_eq!(p.watched(), 0, "shutdown drained the watch lists");
        assert!(p.shutdown().is_empty(), "a second shutdown returns nothing");
        let st = p.stats();
        assert_eq!(st.completed, 0);
        assert_eq!(st.handed_back, u64::from(outcome != OUTCOMES[0]));
        p.check_invariants();
        outcome
    });
}

/// The same race as [`shutdown_races_watch`], on a timer shared with other users: the
/// purgatory's shutdown leaves the timer running, so nothing but the watch map's closing keeps
/// an op from slipping in after the drain. The op is handed back exactly once (by `shutdown`,
/// or in the error), its timer entry is disarmed, and an advance of the shared timer past its
/// timeout runs nothing.
#[test]
fn shutdown_races_watch_on_shared_timer() {
    const OUTCOMES: &[&str] = &[
        "refused before any try",
        "refused mid-watch",
        "handed back by shutdown",
    ];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let timer = Arc::new(
            SystemTimer::builder()
                .clock(clock.clone())
                .reaper(false)
                .inline()
                .build(),
        );
        let p: Arc<Purgatory<u8, Op>> =
            Arc::new(Purgatory::builder().timer(Arc::clone(&timer)).build());
        let probe = Probe::new(1, &log);

        let watcher = {
            let (p, probe) = (Arc::clone(&p), probe.clone());
            thread::spawn(move || p.try_complete_else_watch(probe.op(), 10 * MS, &[K]))
        };
        let returned = p.shutdown();
        let watched = watcher.join().unwrap();

        let tries = log.tries(1).len();
        let outcome = match watched {
            Ok(w) => {
                assert!(!w.completed);
                assert_eq!(
                    returned.len(),
                    1,
                    "accepted after shutdown drained the map: the op is lost"
                );
                assert!(!returned[0].completed);
                assert!(!w.handle.force_complete(), "forced after being handed back");
                assert_eq!(tries, 2);
                OUTCOMES[2]
            }
            Err(WatchError::Shutdown(op)) => {
                assert!(!op.completed, "refused after on_complete");
                assert!(
                    returned.is_empty(),
                    "refused and also handed back by shutdown"
                );
                match tries {
                    0 => OUTCOMES[0],
                    1 => OUTCOMES[1],
                    n => panic!("refused after {n} tries"),
                }
            }
            Err(e) => panic!("unexpected {e:?}"),
        };
        drop(returned);
        assert!(
            !timer.is_shutdown(),
            "a shared timer outlives the purgatory"
        );
        assert_eq!(timer.len(), 0, "the handed-back op's entry is disarmed");
        set_clock(&clock, 20);
        assert_eq!(timer.advance(), 0, "an expiry ran after shutdown");
        assert_eq!(log.completes(1) + log.expires(1), 0);
        assert_eq!(p.delayed(), 0, "delayed() counts a handed-back operation");
        assert_eq!(p.watched(), 0, "shutdown drained the watch lists");
        p.check_invariants();
        outcome
    });
}

/// Expiry races the watch itself: main watches an op (timeout 10 ms) while the reaper moves the
/// clock to 10 ms and advances. The add reads the clock before or after it moved (deadline 10
/// or 20 ms); the expiry task takes the op lock, so it never runs before the watch has armed
/// the op and stored its timer handle. After one more advance, past every possible deadline,
/// the op has expired exactly once and nothing is left armed.
#[test]
fn expiry_races_watch() {
    const OUTCOMES: &[&str] = &[
        "expired by the racing advance",
        "expired by the next advance",
    ];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let probe = Probe::new(1, &log);

        let reaper = {
            let (p, clock) = (Arc::clone(&p), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 10);
                p.advance()
            })
        };
        let w = p
            .try_complete_else_watch(probe.op(), 10 * MS, &[K])
            .unwrap();
        assert!(!w.completed);
        let a = reaper.join().unwrap();
        set_clock(&clock, 20);
        let b = p.advance();

        assert_eq!(a + b, 1, "the expiry ran once (a {a}, b {b})");
        assert_eq!(
            log.of(1),
            [
                Ev::Try {
                    id: 1,
                    ready: false
                },
                Ev::Try {
                    id: 1,
                    ready: false
                },
                Ev::Complete(1),
                Ev::Expire(1)
            ]
        );
        assert!(w.handle.is_completed() && !w.handle.force_complete());
        assert_eq!(p.delayed(), 0, "delayed() counts an expired operation");
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        assert_eq!(p.stats().expired, 1);
        assert_eq!(
            p.purge(),
            1,
            "the purge reports the expired operation's cell it dropped"
        );
        assert_eq!(p.watched(), 0);
        p.check_invariants();
        if a == 1 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// Two checks of one key race (Kafka's `testTryCompleteWithMultipleThreads`, at loom scale): T1
/// makes the op ready and checks `K`, main checks `K`. Exactly one check completes it (each
/// blocks on the op's lock and re-evaluates, none skips it); both sweep the key, and it is
/// dropped once.
#[test]
fn concurrent_checks_complete_once() {
    const OUTCOMES: &[&str] = &["completed by main's check", "completed by T1's check"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let probe = Probe::new(1, &log);
        let w = p.try_complete_else_watch(probe.op(), LONG, &[K]).unwrap();
        assert!(!w.completed);

        let checker = spawn_ready_check(&p, &probe);
        let mine = p.check_and_complete(&K);
        let theirs = checker.join().unwrap();

        let ev = log.of(1);
        assert_eq!(mine + theirs, 1, "exactly one check completes it: {ev:?}");
        assert_eq!((log.completes(1), log.expires(1)), (1, 0), "{ev:?}");
        assert!(w.handle.is_completed());
        assert_eq!(p.delayed(), 0, "delayed() counts a completed operation");
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        assert_eq!(
            (p.watched(), p.stats().keys),
            (0, 0),
            "the checks drop the key"
        );
        p.check_invariants();
        if mine == 1 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// `cancel_for_key` races expiry: the op (timeout 10 ms) is watched on `K` only; main cancels
/// `K` while the reaper moves the clock to 10 ms and advances. Either expiry wins (the op
/// completes with `on_complete` + `on_expiration`; `cancel_for_key` finds it completed and
/// returns nothing) or the cancel does (the op is returned pending, its timer disarmed: the
/// documented contract is that it then never expires, and can still be forced).
///
/// The bug this model found (fixed): the reaper's advance takes the expiry task out of the wheel
/// and releases the wheel lock; `cancel_for_key` then takes the op lock, `timer.cancel()`
/// returns false (already dispatched), and it returns the op as pending and disarmed; the
/// advance then ran the task, and `OpCell::expire`, which checked only `completed`, expired it:
/// `on_complete` + `on_expiration` on an op the caller was told is cancelled. The fix: only an
/// armed op expires (`expire` also requires `st.timer.is_some()`; every completion and
/// `cancel_for_key` take the timer key under the op lock, and the watch stores it in the same
/// lock hold as the add, see [`expiry_races_watch`]).
#[test]
fn cancel_for_key_races_expiry() {
    const OUTCOMES: &[&str] = &["expired before the cancel", "cancelled before the expiry"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let probe = Probe::new(1, &log);
        let w = p
            .try_complete_else_watch(probe.op(), 10 * MS, &[K])
            .unwrap();
        assert!(!w.completed);

        let reaper = {
            let (p, clock) = (Arc::clone(&p), clock.clone());
            thread::spawn(move || {
                set_clock(&clock, 10);
                p.advance()
            })
        };
        let cancelled = p.cancel_for_key(&K);
        let ran = reaper.join().unwrap();
        set_clock(&clock, 20);
        let later = p.advance();

        let ev = log.of(1);
        assert_eq!(later, 0, "nothing left to expire");
        assert_eq!(
            (p.watched(), p.stats().keys),
            (0, 0),
            "cancel_for_key removed the key"
        );
        assert_eq!(p.delayed(), 0, "delayed() counts a disarmed operation");
        let outcome = if cancelled.is_empty() {
            assert_eq!(ran, 1);
            assert_eq!((log.completes(1), log.expires(1)), (1, 1), "{ev:?}");
            assert!(w.handle.is_completed());
            OUTCOMES[0]
        } else {
            assert_eq!(cancelled.len(), 1);
            assert_eq!(
                log.completes(1) + log.expires(1),
                0,
                "cancel_for_key returned the op as pending and disarmed, yet it expired \
                 (ran {ran}): {ev:?}"
            );
            assert!(!cancelled[0].is_completed());
            assert!(
                cancelled[0].force_complete(),
                "a cancelled op can be forced"
            );
            assert_eq!((log.completes(1), log.expires(1)), (1, 0), "{ev:?}");
            OUTCOMES[1]
        };
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        p.check_invariants();
        outcome
    });
}

/// The count-triggered purge races a completion and the advance that runs it (purge interval
/// 1: every completion of a watched operation makes a purge due). Two operations on `K`; main
/// forces the first and advances (running the purge scheduled so far) while a thread forces the
/// second. A purge made due is never lost: once the thread is joined, one more advance leaves no
/// empty cell listed. (The `scheduled` flag is cleared before the sweep, so a completion that
/// makes a purge due while one is sweeping schedules another.)
#[test]
fn purge_scheduling_races_a_completion_and_the_sweep() {
    const OUTCOMES: &[&str] = &["swept by the racing advance", "swept by the next advance"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(
            Purgatory::builder()
                .clock(clock.clone())
                .reaper(false)
                .purge_interval(1)
                .build(),
        );
        let (a, b) = (Probe::new(1, &log), Probe::new(2, &log));
        let wa = p.try_complete_else_watch(a.op(), LONG, &[K]).unwrap();
        let wb = p.try_complete_else_watch(b.op(), LONG, &[K]).unwrap();
        let other = {
            let h = wb.handle.clone();
            thread::spawn(move || assert!(h.force_complete()))
        };
        assert!(wa.handle.force_complete());
        p.advance();
        other.join().unwrap();
        let left_by_the_race = p.watched();
        p.advance();
        assert_eq!(
            p.watched(),
            0,
            "a purge made due was lost: empty cells stay listed"
        );
        assert!(p.stats().purges >= 1);
        assert_eq!((log.completes(1), log.completes(2)), (1, 1));
        p.check_invariants();
        if left_by_the_race == 0 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// `shutdown` races a check that completes the op: the op (ready, watched on `K`) is either
/// completed by the check (`on_complete` once; shutdown finds it completed and hands nothing
/// back) or handed back by shutdown (never completed; the check then finds the key drained, or
/// the op handed back). Never both: shutdown's drain must re-check `completed` under the op
/// lock, since the check may complete the op between shutdown's unlocked look and its lock.
#[test]
fn shutdown_races_check() {
    const OUTCOMES: &[&str] = &["completed by the check", "handed back by shutdown"];
    model(OUTCOMES, || {
        let clock = ManualClock::new(0);
        let log = Log::new();
        let p = Arc::new(purgatory(&clock));
        let probe = Probe::new(1, &log);
        let w = p.try_complete_else_watch(probe.op(), LONG, &[K]).unwrap();
        assert!(!w.completed);

        let checker = spawn_ready_check(&p, &probe);
        let returned = p.shutdown();
        let checked = checker.join().unwrap();

        let ev = log.of(1);
        assert_eq!(
            checked + returned.len(),
            1,
            "exactly one of check / shutdown takes the op (checked {checked}, handed back {}): \
             {ev:?}",
            returned.len()
        );
        assert_eq!(log.completes(1), checked, "{ev:?}");
        assert_eq!(log.expires(1), 0, "{ev:?}");
        for op in &returned {
            assert!(!op.completed, "handed back after on_complete");
        }
        assert!(w.handle.is_completed() && !w.handle.force_complete());
        let st = p.stats();
        assert_eq!(
            (st.completed, st.handed_back),
            (checked as u64, returned.len() as u64)
        );
        assert_eq!(p.delayed(), 0, "delayed() counts an operation that is gone");
        assert_eq!(p.timer().len(), 0, "the timer still holds an entry");
        assert_eq!(p.watched(), 0, "shutdown drained the watch lists");
        drop(returned);
        p.check_invariants();
        if checked == 1 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}

/// `OperationHandle::take` (taking the operation back without completing it) races a check that
/// finds it ready: exactly one wins. Either the take returns the operation, never completed
/// (`on_complete` is not called, then or later), or the check completes it once and the take
/// returns `None`. The take's unlocked look at `completed` may be stale by the time it holds the
/// op lock, so it must look again under the lock; without that second look it hands back an
/// operation the check has just completed (the payload is gone: a panic, or with debug
/// assertions on, "completing twice").
///
/// Catches: `take` not re-checking `completed` under the op lock.
#[test]
fn take_races_check() {
    const OUTCOMES: &[&str] = &["taken back", "completed by the check"];
    model(OUTCOMES, || {
        let log = Log::new();
        let (p, handle, taken, checked) = race_a_ready_check(&log, |h| h.take());

        let ev = log.of(1);
        assert_eq!(
            usize::from(taken.is_some()) + checked,
            1,
            "exactly one of take / check wins (taken {}, checked {checked}): {ev:?}",
            taken.is_some()
        );
        assert_eq!(log.completes(1), checked, "{ev:?}");
        assert_eq!(log.expires(1), 0, "{ev:?}");
        if let Some(op) = &taken {
            assert_eq!(op.id, 1);
            assert!(!op.completed, "a completed operation was handed back");
        }
        assert!(handle.is_completed() && handle.take().is_none());
        assert!(
            !handle.force_complete(),
            "forced after it was taken or completed"
        );
        let stats = p.stats();
        assert_eq!(
            (stats.completed, stats.handed_back),
            (checked as u64, u64::from(taken.is_some())),
            "{stats:?}"
        );
        drop(taken);
        assert_nothing_left(&p, "the winner disarmed the timer");
        if checked == 0 {
            OUTCOMES[0]
        } else {
            OUTCOMES[1]
        }
    });
}
