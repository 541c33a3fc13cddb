//! Adversarial use of the public API: many threads watching, checking, forcing, taking and
//! cancelling keys while expiries run and callbacks re-enter the purgatory, with a shutdown in
//! the middle; on the own timer (inline and executor expiries, with a busy grace), on a shared
//! timer at its cap of pending tasks, and driven by hand. Every operation must end exactly one
//! way (completed once, taken, refused, or handed back) and be dropped exactly once;
//! `try_complete` never overlaps itself or `on_complete`, nor runs after completion;
//! `on_expiration` only after `on_complete`; nothing deadlocks; no thread outlives the timer.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

mod common;
use common::wait_for_threads_to_end;

use purgatory::{DelayedOperation, OperationHandle, Purgatory};
use system_timer::{ManualClock, SystemTimer};

const KEYS: u32 = 16;
const MAX_OPS: usize = 400_000;

/// Runs `f` on a thread of its own; fails the test if it does not return within `secs`.
fn within<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => {
            t.join().unwrap();
            r
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match t.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!(),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung for {secs} s"),
    }
}

type P = Purgatory<u32, Op>;

/// Per operation: what happened to it.
struct Book {
    made: Vec<AtomicBool>,
    completes: Vec<AtomicU32>,
    expirations: Vec<AtomicU32>,
    drops: Vec<AtomicU32>,
    /// Taken through a handle, refused by `try_complete_else_watch`, or handed back.
    other: Vec<AtomicU32>,
    inside: Vec<AtomicBool>,
    violations: Mutex<Vec<String>>,
    next_id: AtomicUsize,
    /// Per key: a level; an operation is ready when its key's level passes its threshold.
    levels: Vec<AtomicU64>,
    purgatory: OnceLock<Weak<P>>,
    reentries: AtomicUsize,
    refused_after_shutdown: AtomicUsize,
    /// Handles from `cancel_for_key` inside callbacks, resolved at the end.
    parked: Mutex<Vec<OperationHandle<Op>>>,
}

impl Book {
    fn new() -> Arc<Self> {
        let u = || (0..MAX_OPS).map(|_| AtomicU32::new(0)).collect();
        let b = || (0..MAX_OPS).map(|_| AtomicBool::new(false)).collect();
        Arc::new(Book {
            made: b(),
            completes: u(),
            expirations: u(),
            drops: u(),
            other: u(),
            inside: b(),
            violations: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            levels: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            purgatory: OnceLock::new(),
            reentries: AtomicUsize::new(0),
            refused_after_shutdown: AtomicUsize::new(0),
            parked: Mutex::new(Vec::new()),
        })
    }

    fn violation(&self, s: String) {
        self.violations.lock().unwrap().push(s);
    }

    /// A new operation (None when the id space is used up).
    fn op(self: &Arc<Self>, rnd: &mut impl FnMut(u64) -> u64) -> Option<(Op, Vec<u32>)> {
        let id = self.next_id.fetch_add(1, SeqCst);
        if id >= MAX_OPS {
            return None;
        }
        self.made[id].store(true, SeqCst);
        let nkeys = 1 + rnd(3) as usize;
        let mut keys: Vec<u32> = (0..nkeys).map(|_| rnd(u64::from(KEYS)) as u32).collect();
        if rnd(10) == 0 {
            keys.push(keys[0]); // a duplicate key
        }
        let key = keys[0];
        let threshold = self.levels[key as usize].load(SeqCst) + rnd(4);
        Some((
            Op {
                id,
                key,
                threshold,
                book: self.clone(),
                reenter: rnd(3) == 0,
                done: false,
            },
            keys,
        ))
    }

    fn enter(&self, id: usize, what: &str) {
        if self.inside[id].swap(true, SeqCst) {
            self.violation(format!("{what} of {id} overlaps another call"));
        }
        if self.completes[id].load(SeqCst) > 0 && what == "try_complete" {
            self.violation(format!("try_complete of {id} after completion"));
        }
    }

    fn leave(&self, id: usize) {
        self.inside[id].store(false, SeqCst);
    }

    fn ended(&self, id: usize) {
        self.other[id].fetch_add(1, SeqCst);
    }

    fn check(&self) -> usize {
        let v = self.violations.lock().unwrap();
        assert!(
            v.is_empty(),
            "{} violations: {:?}",
            v.len(),
            &v[..v.len().min(10)]
        );
        let mut bad = Vec::new();
        let mut n = 0;
        for id in (0..MAX_OPS).filter(|&i| self.made[i].load(SeqCst)) {
            n += 1;
            let (c, e, d, o) = (
                self.completes[id].load(SeqCst),
                self.expirations[id].load(SeqCst),
                self.drops[id].load(SeqCst),
                self.other[id].load(SeqCst),
            );
            if c + o != 1 || d != 1 || e > c {
                bad.push((id, c, e, d, o));
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {n} operations did not end exactly one way (id, completes, expirations, drops, other ends): {:?}",
            bad.len(),
            &bad[..bad.len().min(10)]
        );
        n
    }
}

struct Op {
    id: usize,
    key: u32,
    threshold: u64,
    book: Arc<Book>,
    reenter: bool,
    done: bool,
}

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        self.book.enter(self.id, "try_complete");
        let ready = self.book.levels[self.key as usize].load(SeqCst) > self.threshold;
        self.book.leave(self.id);
        ready
    }

    fn on_complete(&mut self) {
        let b = self.book.clone();
        b.enter(self.id, "on_complete");
        if self.done {
            b.violation(format!("on_complete of {} twice", self.id));
        }
        self.done = true;
        b.completes[self.id].fetch_add(1, SeqCst);
        b.leave(self.id);
        if self.reenter {
            self.reenter_purgatory();
        }
    }

    fn on_expiration(&mut self) {
        let b = &self.book;
        if b.completes[self.id].load(SeqCst) != 1 {
            b.violation(format!("on_expiration of {} before on_complete", self.id));
        }
        b.expirations[self.id].fetch_add(1, SeqCst);
    }
}

impl Op {
    /// From `on_complete`: a new operation, a check, a key's cancel (forcing or taking what it
    /// returns), on the purgatory the operation lives in.
    fn reenter_purgatory(&mut self) {
        let b = self.book.clone();
        let Some(p) = b.purgatory.get().and_then(Weak::upgrade) else {
            return;
        };
        b.reentries.fetch_add(1, SeqCst);
        let mut s = (self.id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = move |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        match rnd(4) {
            0 => {
                if let Some((op, keys)) = b.op(&mut rnd) {
                    watch(&p, &b, op, Duration::from_millis(rnd(5)), &keys);
                }
            }
            1 => {
                let k = rnd(u64::from(KEYS)) as u32;
                b.levels[k as usize].fetch_add(1, SeqCst);
                p.check_and_complete(&k);
            }
            2 => {
                let k = rnd(u64::from(KEYS)) as u32;
                for h in p.cancel_for_key(&k) {
                    match rnd(3) {
                        0 => {
                            h.force_complete_with(|op| op.threshold = 0);
                        }
                        1 => {
                            if let Some(op) = h.take() {
                                b.ended(op.id);
                            }
                        }
                        _ => b.parked.lock().unwrap().push(h),
                    }
                }
            }
            _ => {
                p.check_and_complete(&self.key);
            }
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        self.book.drops[self.id].fetch_add(1, SeqCst);
    }
}

/// `try_complete_else_watch`, recording a refusal as the operation's end.
fn watch(p: &P, b: &Book, op: Op, timeout: Duration, keys: &[u32]) -> Option<OperationHandle<Op>> {
    match p.try_complete_else_watch(op, timeout, keys) {
        Ok(w) => Some(w.handle),
        Err(e) => {
            let shut = e.is_shutdown();
            let op = e.into_inner();
            if shut {
                b.refused_after_shutdown.fetch_add(1, SeqCst);
            }
            b.ended(op.id);
            None
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    InlineExpiry,
    ExpiryThreads,
    BusyGrace,
    SharedCappedTimer,
    HandDriven,
}

fn contention_with_a_shutdown_in_the_middle(mode: Mode, name: &'static str) {
    within(60, move || {
        let book = Book::new();
        let clock = ManualClock::new(0);
        let shared = matches!(mode, Mode::SharedCappedTimer).then(|| {
            Arc::new(
                SystemTimer::builder()
                    .name(&format!("{name}t"))
                    .executor_threads(2)
                    .max_pending(24)
                    .build(),
            )
        });
        let b = Purgatory::<u32, Op>::builder()
            .name(name)
            .purge_interval(64);
        let b = match mode {
            Mode::InlineExpiry => b,
            Mode::ExpiryThreads => b.expiry_threads(2),
            Mode::BusyGrace => b.reaper_grace(purgatory::BUSY_REAPER_GRACE),
            Mode::SharedCappedTimer => b.timer(shared.clone().unwrap()),
            Mode::HandDriven => b.clock(clock.clone()).reaper(false),
        };
        let p: Arc<P> = Arc::new(b.build());
        book.purgatory.set(Arc::downgrade(&p)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (p, book, stop, progress) =
                    (p.clone(), book.clone(), stop.clone(), progress.clone());
                let clock = clock.clone();
                std::thread::spawn(move || {
                    let mut s = 0xDEAD_BEEF_1234_5678u64 ^ (t + 1).wrapping_mul(0x9E37_79B9);
                    let mut rnd = move |n: u64| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s % n
                    };
                    let mut held: Vec<OperationHandle<Op>> = Vec::new();
                    let mut cancelled: Vec<OperationHandle<Op>> = Vec::new();
                    let mut after_stop = 0;
                    while after_stop < 300 {
                        if stop.load(SeqCst) {
                            after_stop += 1;
                        }
                        progress.fetch_add(1, SeqCst);
                        let Some((op, keys)) = book.op(&mut rnd) else {
                            break;
                        };
                        let timeout = Duration::from_micros(match rnd(4) {
                            0 => 0,
                            1 => rnd(200),
                            _ => rnd(5_000),
                        });
                        if let Some(h) = watch(&p, &book, op, timeout, &keys) {
                            held.push(h);
                        }
                        let k = rnd(u64::from(KEYS)) as u32;
                        match rnd(10) {
                            0..=2 => {
                                book.levels[k as usize].fetch_add(1, SeqCst);
                                p.check_and_complete(&k);
                            }
                            3 if !held.is_empty() => {
                                let h = held.swap_remove(rnd(held.len() as u64) as usize);
                                h.force_complete();
                            }
                            4 if !held.is_empty() => {
                                let h = held.swap_remove(rnd(held.len() as u64) as usize);
                                h.force_complete_with(|op| op.threshold = 0);
                            }
                            5 if !held.is_empty() => {
                                let h = held.swap_remove(rnd(held.len() as u64) as usize);
                                if let Some(op) = h.take() {
                                    book.ended(op.id);
                                }
                            }
                            6 => cancelled.extend(p.cancel_for_key(&k)),
                            7 if rnd(8) == 0 => {
                                p.purge();
                            }
                            _ => {}
                        }
                        if let Mode::HandDriven = mode {
                            clock.advance(Duration::from_micros(rnd(300)));
                            p.advance();
                        }
                        if held.len() > 64 {
                            held.swap_remove(0); // dropping a handle completes nothing
                        }
                    }
                    cancelled
                })
            })
            .collect();
        // The shutdown, in the middle of it.
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let at = 20_000 + seed.map_or(0, |d| d.subsec_nanos() as usize % 60_000);
        while progress.load(SeqCst) < at {
            std::thread::yield_now();
        }
        let back = p.shutdown();
        stop.store(true, SeqCst);
        for op in back {
            book.ended(op.id);
        }
        let mut cancelled = Vec::new();
        for w in workers {
            cancelled.extend(w.join().unwrap());
        }
        cancelled.extend(std::mem::take(&mut *book.parked.lock().unwrap()));
        // Operations a key's cancel returned and no other key watches: only their handles
        // reach them (documented): take them back.
        for h in cancelled {
            if let Some(op) = h.take() {
                book.ended(op.id);
            }
        }
        let stats = p.stats();
        drop(p);
        if let Some(t) = shared {
            drop(t.shutdown());
            t.check_invariants();
        }
        wait_for_threads_to_end(name);
        let n = book.check();
        let sum = |v: &Vec<AtomicU32>| v.iter().map(|x| x.load(SeqCst) as usize).sum::<usize>();
        eprintln!(
            "{mode:?}: {n} operations: {} completed, {} expired, {} other ends, {} re-entries, {} refused after shutdown; {stats:?}",
            sum(&book.completes),
            sum(&book.expirations),
            sum(&book.other),
            book.reentries.load(SeqCst),
            book.refused_after_shutdown.load(SeqCst)
        );
        assert!(
            book.refused_after_shutdown.load(SeqCst) > 0,
            "no operation came after the shutdown"
        );
        assert!(n > 1_000, "only {n} operations");
        assert_eq!(
            stats.accepted,
            stats.completed + stats.handed_back,
            "accepted operations do not reconcile: {stats:?}"
        );
    });
}

#[test]
fn contention_with_a_shutdown_in_the_middle_inline_expiry() {
    contention_with_a_shutdown_in_the_middle(Mode::InlineExpiry, "padi");
}

#[test]
fn contention_with_a_shutdown_in_the_middle_expiry_threads() {
    contention_with_a_shutdown_in_the_middle(Mode::ExpiryThreads, "padx");
}

#[test]
fn contention_with_a_shutdown_in_the_middle_busy_grace() {
    contention_with_a_shutdown_in_the_middle(Mode::BusyGrace, "padg");
}

#[test]
fn contention_with_a_shutdown_in_the_middle_shared_capped_timer() {
    contention_with_a_shutdown_in_the_middle(Mode::SharedCappedTimer, "pads");
}

#[test]
fn contention_with_a_shutdown_in_the_middle_hand_driven() {
    contention_with_a_shutdown_in_the_middle(Mode::HandDriven, "padh");
}

/// A key whose `Hash` panics (values 100 and up), whose `Eq` panics when it finds its equal
/// (values 50 to 59: the first watch inserts without comparing, later ones panic), or whose
/// `Clone` panics (values 70 to 79).
#[derive(Debug, PartialEq)]
struct BadKey(u32);

impl Eq for BadKey {}

impl std::hash::Hash for BadKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(self.0 < 100, "planned: hash of {}", self.0);
        self.0.hash(state);
    }
}

impl Clone for BadKey {
    fn clone(&self) -> Self {
        assert!(!(70..80).contains(&self.0), "planned: clone of {}", self.0);
        BadKey(self.0)
    }
}

impl PartialEq<u32> for BadKey {
    fn eq(&self, other: &u32) -> bool {
        self.0 == *other
    }
}

/// An operation for [`BadKey`]s: ready when its flag is set.
struct Plain {
    id: usize,
    ready: Arc<AtomicBool>,
    book: Arc<Book>,
}

impl DelayedOperation for Plain {
    fn try_complete(&mut self) -> bool {
        self.book.enter(self.id, "try_complete");
        let r = self.ready.load(SeqCst);
        self.book.leave(self.id);
        r
    }
    fn on_complete(&mut self) {
        self.book.enter(self.id, "on_complete");
        self.book.completes[self.id].fetch_add(1, SeqCst);
        self.book.leave(self.id);
    }
    fn on_expiration(&mut self) {
        if self.book.completes[self.id].load(SeqCst) != 1 {
            self.book
                .violation(format!("on_expiration of {} before on_complete", self.id));
        }
        self.book.expirations[self.id].fetch_add(1, SeqCst);
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        self.book.drops[self.id].fetch_add(1, SeqCst);
    }
}

/// Keys whose `Hash`, `Eq` or `Clone` panic, used by three threads that watch, check and cancel
/// them while the reaper expires operations: every panic reaches its caller, an operation
/// whose watch panicked is dropped without `on_complete` (and is never completed later), every
/// other one ends exactly once, and the purgatory goes on working and shuts down cleanly.
#[test]
fn keys_whose_hash_eq_or_clone_panic_under_contention() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planned = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|s| s.starts_with("planned"));
        if !planned {
            hook(info);
        }
    }));
    within(60, || {
        let book = Book::new();
        let p: Arc<Purgatory<BadKey, Plain>> =
            Arc::new(Purgatory::builder().name("padk").purge_interval(32).build());
        let panicked_watch = Arc::new(Mutex::new(Vec::<usize>::new()));
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (p, book, pw) = (p.clone(), book.clone(), panicked_watch.clone());
                std::thread::spawn(move || {
                    let mut s = 0xFEED_FACE_0BAD_F00Du64 ^ (t + 3).wrapping_mul(0x9E37_79B9);
                    let mut rnd = move |n: u64| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s % n
                    };
                    let key = |r: u64| {
                        BadKey(match r % 10 {
                            0 => 100 + (r % 3) as u32,
                            1 => 50 + (r % 10) as u32,
                            2 => 70 + (r % 10) as u32,
                            _ => (r % 16) as u32,
                        })
                    };
                    let mut flags = Vec::new();
                    for _ in 0..4_000 {
                        let id = book.next_id.fetch_add(1, SeqCst);
                        book.made[id].store(true, SeqCst);
                        let ready = Arc::new(AtomicBool::new(false));
                        let op = Plain {
                            id,
                            ready: ready.clone(),
                            book: book.clone(),
                        };
                        let keys: Vec<BadKey> =
                            (0..1 + rnd(3)).map(|_| key(rnd(1 << 20))).collect();
                        let timeout = Duration::from_micros(rnd(3_000));
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            p.try_complete_else_watch(op, timeout, &keys)
                        }));
                        match r {
                            Ok(Ok(_)) => flags.push(ready),
                            Ok(Err(e)) => book.ended(e.into_inner().id),
                            Err(_) => {
                                pw.lock().unwrap().push(id);
                                book.ended(id);
                            }
                        }
                        let k = key(rnd(1 << 20));
                        let _ =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                match rnd(6) {
                                    0 => {
                                        for h in p.cancel_for_key(&k) {
                                            h.force_complete();
                                        }
                                    }
                                    1 | 2 if !flags.is_empty() => {
                                        let f = flags.swap_remove(rnd(flags.len() as u64) as usize);
                                        f.store(true, SeqCst);
                                        p.check_and_complete(&k);
                                    }
                                    _ => {
                                        p.check_and_complete(&k);
                                    }
                                }
                            }));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let back = p.shutdown();
        for op in back {
            book.ended(op.id);
        }
        p.check_invariants();
        drop(p);
        wait_for_threads_to_end("padk");
        // An operation whose watch panicked was dropped without completing.
        for &id in panicked_watch.lock().unwrap().iter() {
            assert_eq!(
                book.completes[id].load(SeqCst),
                0,
                "{id} completed after its watch panicked"
            );
        }
        let n = book.check();
        assert!(n >= 12_000 && !panicked_watch.lock().unwrap().is_empty());
    });
}

/// A hand-driven purgatory whose clock is at (or one tick before) the end of its range:
/// operations with zero, tiny and `Duration::MAX` timeouts. Those whose deadline the clock has
/// reached expire at the next advance, exactly once; those past the end never do and are
/// handed back by the shutdown; checks and forced completions still complete exactly once.
#[test]
fn a_purgatory_at_the_end_of_its_clock() {
    for start in [u64::MAX, u64::MAX - 1_000_000, u64::MAX - 1] {
        let book = Book::new();
        let clock = ManualClock::new(0);
        clock.set_ns(start);
        let p: Arc<P> = Arc::new(
            Purgatory::builder()
                .clock(clock.clone())
                .reaper(false)
                .purge_interval(4)
                .build(),
        );
        let mut s = 99u64;
        let mut rnd = move |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        let mut handles = Vec::new();
        for i in 0..300 {
            let (op, keys) = book.op(&mut rnd).unwrap();
            let timeout = match i % 4 {
                0 => Duration::ZERO,
                1 => Duration::from_nanos(rnd(3)),
                2 => Duration::from_nanos(rnd(2_000_000)),
                _ => Duration::MAX,
            };
            if let Some(h) = watch(&p, &book, op, timeout, &keys) {
                handles.push(h);
            }
            match rnd(5) {
                0 => {
                    let k = rnd(u64::from(KEYS)) as u32;
                    book.levels[k as usize].fetch_add(1, SeqCst);
                    p.check_and_complete(&k);
                }
                1 if !handles.is_empty() => {
                    handles.swap_remove(0).force_complete();
                }
                2 => clock.advance(Duration::from_nanos(rnd(1_000_000))),
                _ => {}
            }
            p.advance();
        }
        clock.set_ns(u64::MAX);
        p.advance();
        p.advance();
        p.check_invariants();
        for op in p.shutdown() {
            book.ended(op.id);
        }
        for h in handles {
            if let Some(op) = h.take() {
                book.ended(op.id);
            }
        }
        drop(p);
        book.check();
        let expired: u32 = book.expirations.iter().map(|e| e.load(SeqCst)).sum();
        assert!(expired > 0, "start {start}: nothing expired");
    }
}

/// Liveness: with the own reaper (inline expiries, expiry threads, the busy grace), three
/// threads add operations with timeouts up to 5 ms while checking, forcing and re-entering;
/// once they stop, every operation completes (most of the rest by expiry) without a shutdown
/// to hand it back: no expiry is lost, and `delayed()` drops to zero.
#[test]
fn every_operation_completes_without_a_shutdown() {
    for mode in [Mode::InlineExpiry, Mode::ExpiryThreads, Mode::BusyGrace] {
        within(60, move || {
            let book = Book::new();
            let b = Purgatory::<u32, Op>::builder()
                .name("padl")
                .purge_interval(64);
            let b = match mode {
                Mode::ExpiryThreads => b.expiry_threads(2),
                Mode::BusyGrace => b.reaper_grace(purgatory::BUSY_REAPER_GRACE),
                _ => b,
            };
            let p: Arc<P> = Arc::new(b.build());
            book.purgatory.set(Arc::downgrade(&p)).unwrap();
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    let (p, book) = (p.clone(), book.clone());
                    std::thread::spawn(move || {
                        let mut s = 0x0F0F_1E1E_2D2D_3C3Cu64 ^ (t + 5).wrapping_mul(0x9E37_79B9);
                        let mut rnd = move |n: u64| {
                            s ^= s << 13;
                            s ^= s >> 7;
                            s ^= s << 17;
                            s % n
                        };
                        let mut held = Vec::new();
                        for i in 0..5_000 {
                            let Some((op, keys)) = book.op(&mut rnd) else {
                                break;
                            };
                            let timeout = Duration::from_micros(rnd(5_000));
                            if let Some(h) = watch(&p, &book, op, timeout, &keys) {
                                held.push(h);
                            }
                            let k = rnd(u64::from(KEYS)) as u32;
                            match rnd(8) {
                                0 | 1 => {
                                    book.levels[k as usize].fetch_add(1, SeqCst);
                                    p.check_and_complete(&k);
                                }
                                2 if !held.is_empty() => {
                                    let h = held.swap_remove(rnd(held.len() as u64) as usize);
                                    h.force_complete();
                                }
                                _ => {}
                            }
                            if held.len() > 32 {
                                held.swap_remove(0);
                            }
                            if i % 500 == 0 {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            let made = || book.made.iter().filter(|m| m.load(SeqCst)).count();
            let done = || {
                book.completes
                    .iter()
                    .map(|c| c.load(SeqCst) as usize)
                    .sum::<usize>()
                    + book
                        .other
                        .iter()
                        .map(|c| c.load(SeqCst) as usize)
                        .sum::<usize>()
            };
            let t0 = Instant::now();
            loop {
                // Operations a callback's `cancel_for_key` disarmed (documented: reachable
                // only through their handles once no other key watches them): forced here.
                let parked = std::mem::take(&mut *book.parked.lock().unwrap());
                for h in parked {
                    h.force_complete();
                }
                if done() >= made() && p.delayed() == 0 {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "{mode:?}: {} of {} operations never completed; {:?}",
                    made() - done(),
                    made(),
                    p.stats()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(
                p.shutdown().is_empty(),
                "{mode:?}: pending operations at shutdown"
            );
            drop(p);
            book.check();
        });
    }
}
