//! Adversarial use of the public API: shutdown racing adds, cancels, takes and helpers on many
//! threads (every task must end exactly one way and be dropped exactly once; no thread may
//! outlive the shutdown); tasks whose `Drop` re-enters the timer; a manual clock driven to the
//! end of its range with odd ticks.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{thread_names, wait_for_threads_to_end, within};
use system_timer::{Builder, ManualClock, ScheduleError, SystemTimer, TimerHandle, TimerTask};

/// Per task: how often it ran, how often it was dropped without running, and how often the
/// test saw it end another way (cancel true, take Some, refused, handed back).
struct Book {
    runs: Vec<AtomicU32>,
    drops: Vec<AtomicU32>,
    other: Vec<AtomicU32>,
    made: Vec<AtomicBool>,
    refused: AtomicUsize,
    early: AtomicUsize,
}

impl Book {
    fn new(n: usize) -> Arc<Self> {
        let v = || (0..n).map(|_| AtomicU32::new(0)).collect();
        Arc::new(Book {
            runs: v(),
            drops: v(),
            other: v(),
            made: (0..n).map(|_| AtomicBool::new(false)).collect(),
            refused: AtomicUsize::new(0),
            early: AtomicUsize::new(0),
        })
    }

    fn ended(&self, id: usize) {
        self.other[id].fetch_add(1, SeqCst);
    }

    /// Every id below `n`: exactly one end, and consumed (run or dropped) exactly once.
    fn check(&self, n: usize) {
        let mut bad = Vec::new();
        for id in (0..n).filter(|&id| self.made[id].load(SeqCst)) {
            let (r, d, o) = (
                self.runs[id].load(SeqCst),
                self.drops[id].load(SeqCst),
                self.other[id].load(SeqCst),
            );
            if r + o != 1 || r + d != 1 {
                bad.push((id, r, d, o));
            }
        }
        assert!(
            bad.is_empty(),
            "{} tasks of {n} did not end exactly one way (id, runs, drops, other ends): {:?}",
            bad.len(),
            &bad[..bad.len().min(10)]
        );
        assert_eq!(
            self.early.load(SeqCst),
            0,
            "tasks ran before their deadline"
        );
    }
}

struct Probe {
    id: usize,
    not_before: Instant,
    book: Arc<Book>,
    ran: bool,
}

impl TimerTask for Probe {
    fn run(mut self) {
        self.ran = true;
        if Instant::now() < self.not_before {
            self.book.early.fetch_add(1, SeqCst);
        }
        self.book.runs[self.id].fetch_add(1, SeqCst);
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.ran {
            self.book.drops[self.id].fetch_add(1, SeqCst);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Executors,
    Inline,
    GraceHelpers,
    CappedInline,
    CappedExecutors,
    CallerDriven,
}

fn build(mode: Mode, name: &str) -> SystemTimer<Probe> {
    let b = Builder::<Probe>::new().name(name);
    match mode {
        Mode::Executors => b.executor_threads(2),
        Mode::Inline => b.inline(),
        Mode::GraceHelpers => b.executor_threads(1).reaper_grace(Duration::from_millis(1)),
        Mode::CappedInline => b.inline().max_pending(16),
        Mode::CappedExecutors => b.executor_threads(2).max_pending(16),
        Mode::CallerDriven => b.reaper(false).inline(),
    }
    .build()
}

enum Held {
    Handle(usize, TimerHandle<Probe>),
    Key(usize, system_timer::TimerKey),
}

/// Three threads add (by handle, key or deadline), cancel, take and help; the main thread shuts
/// the timer down in the middle of it. Each task ends exactly one way, is dropped or run exactly
/// once, none runs early, and once `shutdown` has returned, no thread of the timer is left.
fn shutdown_races_everything(mode: Mode, name: &'static str) {
    const THREADS: usize = 3;
    const PER: usize = 100_000;
    within("the test", 60, move || {
        let book = Book::new(THREADS * PER);
        let timer = Arc::new(build(mode, name));
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (timer, book, stop) = (timer.clone(), book.clone(), stop.clone());
                let progress = progress.clone();
                std::thread::spawn(move || {
                    let mut s = 0x1234_5678_9abc_def0u64 ^ (t as u64 + 1).wrapping_mul(0x9E37);
                    let mut rnd = move |n: u64| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s % n
                    };
                    let mut held: Vec<Held> = Vec::new();
                    let mut after_stop = 0;
                    for i in 0..PER {
                        let id = t * PER + i;
                        if stop.load(SeqCst) {
                            after_stop += 1;
                        }
                        let delay = match rnd(8) {
                            0 => Duration::ZERO,
                            1 => Duration::from_secs(10),
                            _ => Duration::from_micros(rnd(3_000)),
                        };
                        book.made[id].store(true, SeqCst);
                        progress.fetch_add(1, SeqCst);
                        let probe = Probe {
                            id,
                            not_before: Instant::now() + delay,
                            book: book.clone(),
                            ran: false,
                        };
                        let r = match rnd(3) {
                            0 => timer.add(delay, probe).map(|h| Held::Handle(id, h)),
                            1 => timer.add_keyed(delay, probe).map(|k| Held::Key(id, k)),
                            _ => {
                                let at = timer.now() + delay;
                                timer.add_at_keyed(at, probe).map(|k| Held::Key(id, k))
                            }
                        };
                        match r {
                            Ok(h) => held.push(h),
                            Err(ScheduleError::Full(p)) => book.ended(p.id),
                            Err(ScheduleError::Shutdown(p)) => {
                                book.refused.fetch_add(1, SeqCst);
                                book.ended(p.id);
                            }
                        }
                        if !held.is_empty() && rnd(3) == 0 {
                            let victim = held.swap_remove(rnd(held.len() as u64) as usize);
                            match (victim, rnd(2)) {
                                (Held::Handle(id, h), 0) => {
                                    if h.cancel() {
                                        book.ended(id);
                                    }
                                }
                                (Held::Handle(_, h), _) => {
                                    if let Some(p) = h.take() {
                                        book.ended(p.id);
                                    }
                                }
                                (Held::Key(id, k), 0) => {
                                    if timer.cancel(k) {
                                        book.ended(id);
                                    }
                                }
                                (Held::Key(_, k), _) => {
                                    if let Some(p) = timer.take(k) {
                                        book.ended(p.id);
                                    }
                                }
                            }
                        }
                        match mode {
                            Mode::GraceHelpers => {
                                timer.advance_if_due();
                            }
                            Mode::CallerDriven if rnd(4) == 0 => {
                                timer.advance();
                            }
                            _ => {}
                        }
                        if after_stop > 200 {
                            break;
                        }
                    }
                    // After the shutdown: cancel and take must find nothing.
                    for h in held {
                        match h {
                            Held::Handle(id, h) => {
                                if stop.load(SeqCst) && timer.is_shutdown() {
                                    assert!(!h.cancel(), "cancel of {id} won after shutdown");
                                }
                            }
                            Held::Key(id, k) => {
                                if stop.load(SeqCst) && timer.is_shutdown() {
                                    assert!(timer.take(k).is_none(), "took {id} after shutdown");
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        // Shut down in the middle: after a few thousand operations, at a random moment.
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let at = 3_000 + seed.map_or(0, |d| d.subsec_nanos() as usize % 20_000);
        while progress.load(SeqCst) < at {
            std::thread::yield_now();
        }
        let back = timer.shutdown();
        stop.store(true, SeqCst);
        // No thread of the timer outlives a shutdown that has returned (a joined thread may
        // stay listed for a moment while the kernel finishes its exit: 2 s of grace).
        let t0 = Instant::now();
        let alive = loop {
            let alive: Vec<_> = thread_names()
                .into_iter()
                .filter(|n| n.starts_with(name))
                .collect();
            if alive.is_empty() || t0.elapsed() > Duration::from_secs(2) {
                break alive;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let handed_back = back.len();
        for p in back {
            book.ended(p.id);
        }
        for w in workers {
            w.join().unwrap();
        }
        timer.check_invariants();
        let s = timer.stats();
        assert_eq!(s.pending, 0, "{s:?}");
        assert_eq!(
            s.scheduled,
            s.fired + s.cancelled + s.handed_back,
            "counters do not reconcile: {s:?}"
        );
        drop(timer);
        book.check(THREADS * PER);
        // The race was run: the shutdown came while tasks were pending and adds went on.
        let refused = book.refused.load(SeqCst);
        assert!(
            refused > 0,
            "no add came after the shutdown ({handed_back} handed back)"
        );
        assert!(
            alive.is_empty(),
            "threads alive after shutdown returned: {alive:?}"
        );
    });
}

#[test]
fn shutdown_races_everything_executors() {
    shutdown_races_everything(Mode::Executors, "advx");
}

#[test]
fn shutdown_races_everything_inline() {
    shutdown_races_everything(Mode::Inline, "advi");
}

#[test]
fn shutdown_races_everything_grace_helpers() {
    shutdown_races_everything(Mode::GraceHelpers, "advg");
}

#[test]
fn shutdown_races_everything_capped_inline() {
    shutdown_races_everything(Mode::CappedInline, "advc");
}

#[test]
fn shutdown_races_everything_capped_executors() {
    shutdown_races_everything(Mode::CappedExecutors, "advC");
}

#[test]
fn shutdown_races_everything_caller_driven() {
    shutdown_races_everything(Mode::CallerDriven, "advd");
}

/// Runs `f` when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A task's drop that re-enters the timer (adds, cancels, reads, advances) when the task is
/// dropped by a cancel, a take's caller, after its run, and in a shutdown's hand-back: no
/// deadlock (no user code under the timer's locks), and the re-entrant adds are accounted.
#[test]
fn a_task_whose_drop_reenters_the_timer_does_not_deadlock() {
    for inline in [false, true] {
        within("the test", 60, move || {
            let clock = ManualClock::new(0);
            let b = SystemTimer::builder().clock(clock.clone()).reaper(false);
            let timer = Arc::new(
                if inline {
                    b.inline()
                } else {
                    b.executor_threads(2)
                }
                .build(),
            );
            let reentries = Arc::new(AtomicUsize::new(0));
            let make = |timer: &Arc<SystemTimer>| {
                let t = Arc::downgrade(timer);
                let reentries = reentries.clone();
                let guard = OnDrop(move || {
                    if let Some(t) = t.upgrade() {
                        let k = t.add_keyed(Duration::from_millis(1), || ());
                        if let Ok(k) = k {
                            assert!(t.cancel(k));
                        }
                        let _ = t.len();
                        let _ = t.stats();
                        let _ = t.next_expiration();
                        t.advance();
                        t.check_invariants();
                        reentries.fetch_add(1, SeqCst);
                    }
                });
                move || drop(guard)
            };
            // Dropped by a cancel (handle and key), and by a take's caller.
            let h = timer.add(Duration::from_millis(5), make(&timer)).unwrap();
            let k = timer
                .add_keyed(Duration::from_millis(5), make(&timer))
                .unwrap();
            let k2 = timer
                .add_keyed(Duration::from_millis(5), make(&timer))
                .unwrap();
            assert!(h.cancel());
            assert!(timer.cancel(k));
            drop(timer.take(k2).unwrap());
            assert_eq!(reentries.load(SeqCst), 3);
            // Dropped after its run (inline: under the caller's advance).
            let _ = timer.add(Duration::from_millis(5), make(&timer)).unwrap();
            clock.advance(Duration::from_millis(10));
            timer.advance();
            let t0 = Instant::now();
            while reentries.load(SeqCst) < 4 {
                assert!(t0.elapsed() < Duration::from_secs(20), "the run never came");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Dropped from a shutdown's hand-back (the timer is shut: adds are refused).
            let _ = timer.add(Duration::from_secs(5), make(&timer)).unwrap();
            let back = timer.shutdown();
            assert_eq!(back.len(), 1);
            drop(back);
            assert_eq!(reentries.load(SeqCst), 5);
            timer.check_invariants();
        });
    }
}

/// A task's drop that shuts the timer down, when a cancel drops it on a user thread and when a
/// task running on an executor cancels it: neither deadlocks, the cancel says it won, and
/// every thread of the timer ends.
#[test]
fn a_cancel_whose_task_drop_shuts_the_timer_down() {
    within("the test", 60, || {
        // On a user thread: the shutdown joins the threads from inside the cancel.
        let timer = Arc::new(SystemTimer::builder().name("advs1").build());
        let t = Arc::downgrade(&timer);
        let guard = OnDrop(move || {
            if let Some(t) = t.upgrade() {
                assert!(t.shutdown().is_empty());
            }
        });
        let h = timer
            .add(Duration::from_secs(30), move || drop(guard))
            .unwrap();
        assert!(h.cancel());
        assert!(timer.is_shutdown());
        drop(timer);
        wait_for_threads_to_end("advs1");

        // From a task on an executor: the cancel's drop shuts down the timer that runs it.
        let timer = Arc::new(SystemTimer::builder().name("advs2").build());
        let t = Arc::downgrade(&timer);
        let guard = OnDrop(move || {
            if let Some(t) = t.upgrade() {
                assert!(t.shutdown().is_empty());
            }
        });
        let victim = timer
            .add(Duration::from_secs(30), move || drop(guard))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        timer
            .add(Duration::from_millis(1), move || {
                tx.send(victim.cancel()).unwrap();
            })
            .unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(20)).unwrap());
        let t0 = Instant::now();
        while !timer.is_shutdown() {
            assert!(t0.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(timer);
        wait_for_threads_to_end("advs2");
    });
}

/// A manual clock driven to the end of its range, with ticks from 1 ns to one past half the
/// range and wheels of 2 and 3 buckets: random deadlines anywhere in the range, random jumps
/// (some to the last nanosecond). No task runs before its deadline or twice, every task whose
/// deadline the clock reached has run after an advance, and nothing panics.
#[test]
fn a_manual_clock_to_the_end_of_its_range_with_odd_ticks() {
    let ticks = [
        1,
        3,
        1_000_000,
        999_999_937,
        u64::MAX / 3,
        u64::MAX / 2 + 1,
        u64::MAX,
    ];
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if n == 0 {
            s
        } else {
            s % n
        }
    };
    let (mut built, mut ran) = (0, 0);
    for &tick in &ticks {
        for size in [2usize, 3, 20] {
            for start in [0u64, u64::MAX / 2, u64::MAX - 1_000_000_000, u64::MAX - 2] {
                let clock = ManualClock::new(0);
                clock.set_ns(start);
                let timer = SystemTimer::builder()
                    .clock(clock.clone())
                    .reaper(false)
                    .inline()
                    .tick(Duration::from_nanos(tick))
                    .wheel_size(size)
                    .try_build();
                // A span past the clock's range is refused at build: documented.
                let Ok(timer) = timer else { continue };
                built += 1;
                let runs = Arc::new(Mutex::new(Vec::<(usize, u64)>::new()));
                let mut tasks = Vec::new();
                for round in 0..6 {
                    for _ in 0..20 {
                        let id = tasks.len();
                        let c = clock.clone();
                        let r = runs.clone();
                        let delay = match rnd(5) {
                            0 => 0,
                            1 => rnd(1_000),
                            2 => rnd(tick.saturating_mul(size as u64).max(1)),
                            3 => rnd(0) >> rnd(64),
                            _ => u64::MAX - rnd(3),
                        };
                        let task = move || r.lock().unwrap().push((id, c.now_ns()));
                        let h = if rnd(2) == 0 {
                            timer.add(Duration::from_nanos(delay), task).unwrap()
                        } else {
                            let at = clock.now_ns().saturating_add(delay);
                            timer.add_at(Duration::from_nanos(at), task).unwrap()
                        };
                        tasks.push(h);
                    }
                    match (round, rnd(3)) {
                        (5, _) | (_, 0) => clock.set_ns(u64::MAX),
                        (_, 1) => clock.advance(Duration::from_nanos(rnd(0) >> rnd(64))),
                        _ => clock.advance(Duration::from_nanos(rnd(tick.max(2)))),
                    }
                    timer.advance();
                    timer.advance();
                    timer.check_invariants();
                    let now = clock.now_ns();
                    let runs = runs.lock().unwrap();
                    let mut seen = vec![0u32; tasks.len()];
                    for &(id, at) in runs.iter() {
                        seen[id] += 1;
                        let d = tasks[id].deadline_ns();
                        assert!(
                            at >= d,
                            "tick {tick} size {size} start {start}: task {id} ran at {at}, before its deadline {d}"
                        );
                    }
                    for (id, h) in tasks.iter().enumerate() {
                        assert!(seen[id] <= 1, "task {id} ran {} times", seen[id]);
                        // Past the wheel's last tick (the last multiple of the tick below
                        // `u64::MAX`): documented never to fire unless due when added.
                        let last_tick = (u64::MAX - 1) / tick * tick;
                        if h.is_pending() && h.deadline_ns() <= now && h.deadline_ns() <= last_tick
                        {
                            // Rounded up to the tick, a deadline may wait for the tick past it,
                            // which the clock can only reach if it exists.
                            let rounded = h.deadline_ns().div_ceil(tick).checked_mul(tick);
                            if rounded.is_some_and(|r| r <= now) {
                                panic!(
                                    "tick {tick} size {size} start {start}: task {id} (deadline {}, rounded {rounded:?}) is still pending at {now}",
                                    h.deadline_ns()
                                );
                            }
                        }
                    }
                }
                ran += runs.lock().unwrap().len();
                drop(timer.shutdown());
            }
        }
    }
    assert!(
        built >= 50 && ran > 1_000,
        "built {built} timers, ran {ran} tasks"
    );
}

/// `shutdown_in_background` "stops the timer (later `add`s fail with
/// [`ScheduleError::Shutdown`]) and returns at once". An add made after it has returned (and
/// `is_shutdown()` says true) must be refused, handing the task back, and a pending task's
/// cancel and take find nothing (the shutdown owns it). Here the reaper of an inline timer is
/// busy running a task when the background shutdown is asked for, so the shutdown thread is
/// still joining the reaper: when that thread closed the wheel only after the join, the add
/// was accepted (`Ok`, a pending handle) and its task then dropped by the shutdown thread,
/// never run and never handed back to anyone, and the cancel won.
#[test]
fn an_add_after_shutdown_in_background_returned_is_refused() {
    within("the test", 60, || {
        let timer = SystemTimer::builder().name("advb").inline().build();
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        timer
            .add(Duration::from_millis(1), move || {
                started_tx.send(()).unwrap();
                let _ = release_rx.recv_timeout(Duration::from_secs(20));
            })
            .unwrap();
        let pending = timer.add(Duration::from_secs(3600), || {}).unwrap();
        let pending_key = timer.add_keyed(Duration::from_secs(3600), || {}).unwrap();
        started_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        timer.shutdown_in_background();
        assert!(timer.is_shutdown());
        assert!(
            !pending.cancel(),
            "a cancel won after shutdown_in_background() returned"
        );
        assert!(
            timer.take(pending_key).is_none(),
            "a take won after shutdown_in_background() returned"
        );
        let ran = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let (r, d) = (ran.clone(), dropped.clone());
        let guard = OnDrop(move || d.store(true, SeqCst));
        let added = timer.add(Duration::from_millis(1), move || {
            r.store(true, SeqCst);
            drop(guard);
        });
        let pending_at_add = added.as_ref().map(|h| h.is_pending()).ok();
        release_tx.send(()).unwrap();
        drop(timer);
        wait_for_threads_to_end("advb");
        match added {
            Err(e) => assert!(e.is_shutdown()),
            Ok(h) => panic!(
                "an add after shutdown_in_background() returned was accepted (pending: \
                 {pending_at_add:?}); afterwards ran: {}, dropped by the timer: {}, handle \
                 handed back: {}",
                ran.load(SeqCst),
                dropped.load(SeqCst),
                h.is_handed_back()
            ),
        }
    });
}

/// The pending cap under contention: three threads add (by handle and key, some already due),
/// cancel and take against a cap of 32 while two executors fire; once every task has ended,
/// no slot is leaked: exactly 32 far-future adds are accepted again, and the 33rd is `Full`.
#[test]
fn the_pending_cap_leaks_no_slot_under_contention() {
    within("the test", 60, || {
        const CAP: usize = 32;
        let timer = Arc::new(
            SystemTimer::builder()
                .executor_threads(2)
                .max_pending(CAP)
                .build(),
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (timer, ran) = (timer.clone(), ran.clone());
                std::thread::spawn(move || {
                    let mut s = 0x0123_4567_89AB_CDEFu64 ^ (t + 7).wrapping_mul(0x9E37_79B9);
                    let mut rnd = move |n: u64| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s % n
                    };
                    let mut handles = Vec::new();
                    let mut keys = Vec::new();
                    let mut accepted = 0usize;
                    for _ in 0..30_000 {
                        let r = ran.clone();
                        let task = move || {
                            r.fetch_add(1, SeqCst);
                        };
                        let delay = Duration::from_micros(match rnd(4) {
                            0 => 0,
                            _ => rnd(2_000),
                        });
                        if rnd(2) == 0 {
                            if let Ok(h) = timer.add(delay, task) {
                                accepted += 1;
                                handles.push(h);
                            }
                        } else if let Ok(k) = timer.add_keyed(delay, task) {
                            accepted += 1;
                            keys.push(k);
                        }
                        match rnd(4) {
                            0 if !handles.is_empty() => {
                                let h = handles.swap_remove(rnd(handles.len() as u64) as usize);
                                if rnd(2) == 0 {
                                    h.cancel();
                                } else {
                                    drop(h.take());
                                }
                            }
                            1 if !keys.is_empty() => {
                                let k = keys.swap_remove(rnd(keys.len() as u64) as usize);
                                if rnd(2) == 0 {
                                    timer.cancel(k);
                                } else {
                                    drop(timer.take(k));
                                }
                            }
                            _ => {}
                        }
                        if handles.len() > 100 {
                            handles.swap_remove(0);
                        }
                    }
                    accepted
                })
            })
            .collect();
        let accepted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(accepted > 1_000, "only {accepted} adds accepted");
        // Wait until every task left has run (none is later than 2 ms).
        let t0 = Instant::now();
        while !timer.is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{:?}",
                timer.stats()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        timer.check_invariants();
        let mut far = Vec::new();
        for i in 0..CAP {
            match timer.add(Duration::from_secs(3600), || ()) {
                Ok(h) => far.push(h),
                Err(e) => panic!(
                    "add {i} of {CAP} refused with nothing pending: {e:?} ({:?})",
                    timer.stats()
                ),
            }
        }
        assert!(timer
            .add(Duration::from_secs(3600), || ())
            .unwrap_err()
            .is_full());
        assert_eq!(timer.shutdown().len(), CAP);
    });
}

/// The same from inside a task: `shutdown()` called there "returns at once, with nothing",
/// and its documentation says "Later `add`s fail with [`ScheduleError::Shutdown`]". An add the
/// same task makes right after it is accepted instead (the shutdown thread closes the wheel
/// only once this task has returned), and its task is dropped without running.
#[test]
fn an_add_after_a_shutdown_from_inside_a_task_is_refused() {
    within("the test", 60, || {
        for inline in [false, true] {
            let b = SystemTimer::builder().name("advq");
            let timer = Arc::new(if inline { b.inline() } else { b }.build());
            let (tx, rx) = mpsc::channel();
            let t = Arc::downgrade(&timer);
            timer
                .add(Duration::from_millis(1), move || {
                    let t = t.upgrade().unwrap();
                    assert!(t.shutdown().is_empty());
                    let ran = Arc::new(AtomicBool::new(false));
                    let r = ran.clone();
                    let added = t.add(Duration::from_millis(1), move || r.store(true, SeqCst));
                    tx.send((
                        added.map(|h| h.is_pending()).map_err(|e| e.is_shutdown()),
                        ran,
                    ))
                    .unwrap();
                })
                .unwrap();
            let (added, ran) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            drop(timer);
            wait_for_threads_to_end("advq");
            assert_eq!(
                added,
                Err(true),
                "inline {inline}: an add after shutdown() returned inside a task was accepted \
                 (Ok(pending)); the task ran: {}",
                ran.load(SeqCst)
            );
        }
    });
}

/// The reaper on a manual clock that jumps (by random amounts, to its last nanosecond) while
/// three threads add tasks with deadlines anywhere in its range and cancel some: no task runs
/// before its deadline or twice, and once the clock is at its end every task that can fire
/// (deadline at or below the wheel's last tick) has run, without any call but the clock's moves.
#[test]
fn the_reaper_follows_a_manual_clock_jumping_to_the_end_of_its_range() {
    within("the test", 60, || {
        let clock = ManualClock::new(0);
        let timer = Arc::new(
            SystemTimer::builder()
                .clock(clock.clone())
                .executor_threads(2)
                .wheel_size(4)
                .tick(Duration::from_nanos(7))
                .name("advm")
                .build(),
        );
        let early = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (timer, clock, early) = (timer.clone(), clock.clone(), early.clone());
                std::thread::spawn(move || {
                    let mut s = 0xA5A5_5A5A_1234_4321u64 ^ (t + 9).wrapping_mul(0x9E37_79B9);
                    let mut rnd = move |n: u64| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        if n == 0 {
                            s
                        } else {
                            s % n
                        }
                    };
                    let mut out = Vec::new();
                    for i in 0..3_000 {
                        let runs = Arc::new(AtomicU32::new(0));
                        let (r, c, e) = (runs.clone(), clock.clone(), early.clone());
                        let deadline = Arc::new(AtomicU64::new(0));
                        let d = deadline.clone();
                        let delay = match rnd(4) {
                            0 => rnd(100),
                            1 => rnd(0) >> rnd(64),
                            2 => u64::MAX - rnd(20),
                            _ => rnd(10_000),
                        };
                        let h = timer.add(Duration::from_nanos(delay), move || {
                            if c.now_ns() < d.load(SeqCst) {
                                e.fetch_add(1, SeqCst);
                            }
                            r.fetch_add(1, SeqCst);
                        });
                        let Ok(h) = h else { break };
                        deadline.store(h.deadline_ns(), SeqCst);
                        if rnd(5) == 0 {
                            h.cancel();
                        }
                        if i % 100 == 0 {
                            std::thread::yield_now();
                        }
                        out.push((h, runs));
                    }
                    out
                })
            })
            .collect();
        let mover = {
            let clock = clock.clone();
            std::thread::spawn(move || {
                let mut s = 77u64;
                for _ in 0..2_000 {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    // Jumps of up to 2^44 ns: the clock stays far from its end until the
                    // test sets it there.
                    match s % 50 {
                        0 => clock.set_ns(clock.now_ns() + (s >> 20)),
                        1..=40 => clock.advance(Duration::from_nanos(s % 64)),
                        _ => clock.advance(Duration::from_nanos(s >> (20 + s % 44))),
                    }
                    if s % 8 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().unwrap());
        }
        mover.join().unwrap();
        clock.set_ns(u64::MAX);
        let last_tick = (u64::MAX - 1) / 7 * 7;
        let t0 = Instant::now();
        loop {
            let waiting = all
                .iter()
                .filter(|(h, _)| h.is_pending() && h.deadline_ns() <= last_tick)
                .count();
            let running = timer.len()
                - all
                    .iter()
                    .filter(|(h, _)| h.is_pending() && h.deadline_ns() > last_tick)
                    .count();
            if waiting == 0 && running == 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{waiting} tasks due at the clock's end still wait in the wheel, {running} not yet run: {:?}",
                timer.stats()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        for (i, (h, runs)) in all.iter().enumerate() {
            let n = runs.load(SeqCst);
            assert!(n <= 1, "task {i} ran {n} times");
            assert_eq!(n == 1, h.is_fired(), "task {i}: ran {n}, handle {h:?}");
        }
        assert_eq!(early.load(SeqCst), 0, "tasks ran before their deadline");
        let never = all.iter().filter(|(h, _)| h.is_pending()).count();
        let fired = all.iter().filter(|(h, _)| h.is_fired()).count();
        let cancelled = all.iter().filter(|(h, _)| h.is_cancelled()).count();
        let small = all
            .iter()
            .filter(|(h, _)| h.deadline_ns() < (1 << 40))
            .count();
        assert!(
            all.len() == 9_000 && fired > 3_000,
            "{} tasks, {fired} fired, {cancelled} cancelled, {never} never, {small} with small deadlines; {:?}",
            all.len(),
            timer.stats()
        );
        assert_eq!(timer.shutdown().len(), never);
        timer.check_invariants();
    });
}

/// Set in the child process of [`a_background_shutdown_survives_tasks_whose_drop_panics`].
const PANIC_DROP_CHILD: &str = "SYSTEM_TIMER_ADVERSARIAL_PANIC_DROP_CHILD";

/// A task whose drop panics.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() || std::env::var_os(PANIC_DROP_CHILD).is_some() {
            panic!("planned: a task's drop panics");
        }
    }
}

/// In the child process: a timer with two pending tasks whose drop panics, dropped `how`
/// ("background": after `shutdown_in_background`; "drop": by dropping the timer); prints
/// SURVIVED once its threads have ended.
fn drop_two_panicking_tasks(how: &str) {
    std::panic::set_hook(Box::new(|_| {}));
    let timer = SystemTimer::builder().name("advp").build();
    for _ in 0..2 {
        let guard = PanicOnDrop;
        timer
            .add(Duration::from_secs(3600), move || drop(guard))
            .unwrap();
    }
    if how == "background" {
        timer.shutdown_in_background();
    }
    drop(timer);
    wait_for_threads_to_end("advp");
    println!("SURVIVED");
}

/// Runs `test` in a child process (an abort would end this test binary) with the child's
/// variable set to `how`, and asserts that it survived.
fn survives_in_a_child(test: &str, how: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(PANIC_DROP_CHILD, how)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SURVIVED"),
        "the process did not survive ({how}) dropping two tasks whose drop panics: {} \
         (stderr: {})",
        out.status,
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.is_empty())
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// `shutdown_in_background` drops the tasks `shutdown` would have returned, on the timer's
/// `<name>-shutdown` thread. Two pending tasks whose drop panics: the second panic came while
/// the first unwound through the vector's drop, and the process aborted. The timer contains a
/// task's panic, and a panic payload's panicking drop, wherever it runs tasks; now also where
/// it drops them (one by one, each panic caught).
#[test]
fn a_background_shutdown_survives_tasks_whose_drop_panics() {
    match std::env::var(PANIC_DROP_CHILD) {
        Ok(how) => drop_two_panicking_tasks(&how),
        Err(_) => survives_in_a_child(
            "a_background_shutdown_survives_tasks_whose_drop_panics",
            "background",
        ),
    }
}

/// The same when the timer is dropped with the tasks pending: its drop shuts it down and drops
/// them on the dropping thread, one by one (it aborted the same way).
#[test]
fn dropping_a_timer_survives_tasks_whose_drop_panics() {
    match std::env::var(PANIC_DROP_CHILD) {
        Ok(how) => drop_two_panicking_tasks(&how),
        Err(_) => survives_in_a_child("dropping_a_timer_survives_tasks_whose_drop_panics", "drop"),
    }
}

/// Liveness of the executors: with 1, 3 and 8 executor threads, three threads add bursts of
/// tasks due now or within 2 ms (some due at add, dispatched from the adding thread, some
/// batched by the reaper) while others cancel. Once the adds stop, every task still pending
/// runs without a shutdown to flush it: no batch is left in the channel with every executor
/// asleep. (`is_empty` says every task has started; the shutdown after it, which joins the
/// executors, hands back nothing, and then every task not cancelled has run, once.)
#[test]
fn every_dispatched_task_runs_without_a_shutdown() {
    for executors in [1, 3, 8] {
        within("the test", 60, move || {
            let timer = Arc::new(
                SystemTimer::builder()
                    .executor_threads(executors)
                    .name("advl")
                    .build(),
            );
            let ran = Arc::new(AtomicUsize::new(0));
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    let (timer, ran) = (timer.clone(), ran.clone());
                    std::thread::spawn(move || {
                        let mut s = 0x5151_7272_9393_B4B4u64 ^ (t + 1).wrapping_mul(0x9E37_79B9);
                        let mut rnd = move |n: u64| {
                            s ^= s << 13;
                            s ^= s >> 7;
                            s ^= s << 17;
                            s % n
                        };
                        let mut accepted = 0;
                        for burst in 0..200 {
                            for _ in 0..rnd(50) {
                                let r = ran.clone();
                                let delay = Duration::from_micros(rnd(2_000) * rnd(2));
                                let h = timer
                                    .add(delay, move || {
                                        r.fetch_add(1, SeqCst);
                                    })
                                    .unwrap();
                                // A task whose cancel loses (already dispatched) must run.
                                if rnd(5) != 0 || !h.cancel() {
                                    accepted += 1;
                                }
                            }
                            if burst % 10 == 0 {
                                std::thread::sleep(Duration::from_micros(rnd(1_500)));
                            }
                        }
                        accepted
                    })
                })
                .collect();
            let accepted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
            let t0 = Instant::now();
            while !timer.is_empty() {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "{executors} executors: tasks left unrun: {:?}",
                    timer.stats()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // Every task has started; the tasks themselves may still be running (the executors
            // count a task as started before they run it): the shutdown joins the executors.
            assert!(timer.shutdown().is_empty(), "nothing was left to hand back");
            let s = timer.stats();
            assert_eq!(ran.load(SeqCst), accepted, "{executors} executors: {s:?}");
            assert_eq!(s.fired as usize, accepted, "{s:?}");
            assert_eq!(s.scheduled, s.fired + s.cancelled, "{s:?}");
        });
    }
}

/// A manual clock that panics when the reaper thread reads it, while `panics_left` is above 0
/// (callers' reads, `add`'s, never panic).
#[derive(Debug)]
struct PanickingOnTheReaper {
    clock: ManualClock,
    panics_left: Arc<AtomicU32>,
}

impl system_timer::Clock for PanickingOnTheReaper {
    fn now_ns(&self) -> u64 {
        let on_reaper = std::thread::current()
            .name()
            .is_some_and(|n| n.ends_with("-reaper"));
        if on_reaper
            && self
                .panics_left
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("the clock failed on the reaper");
        }
        self.clock.now_ns()
    }
    fn deadline_base_ns(&self) -> u64 {
        self.clock.deadline_base_ns()
    }
    fn sleep_for(&self, deadline_ns: u64) -> Option<Duration> {
        self.clock.sleep_for(deadline_ns)
    }
    fn subscribe(&self, waker: std::sync::Weak<dyn Fn() + Send + Sync>) {
        self.clock.subscribe(waker)
    }
}

/// The clock is user code that the reaper runs: a panic there used to end the reaper thread
/// (Kafka's reaper dies on any throwable too), and with it every expiry; the task below never
/// ran. Now the reaper counts the panic, waits a backoff and reads the clock again.
#[test]
fn a_clock_panicking_on_the_reaper_does_not_stop_expiries() {
    let clock = ManualClock::new(0);
    let panics_left = Arc::new(AtomicU32::new(0));
    let timer = SystemTimer::builder()
        .clock(PanickingOnTheReaper {
            clock: clock.clone(),
            panics_left: Arc::clone(&panics_left),
        })
        .build();
    let (tx, rx) = mpsc::channel();
    timer
        .add(Duration::from_millis(5), move || tx.send(()).unwrap())
        .expect("running");
    panics_left.store(3, SeqCst);
    clock.advance(Duration::from_millis(5));
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the task ran after the clock's panics");
    assert_eq!(
        panics_left.load(SeqCst),
        0,
        "the reaper read the clock 3 times"
    );
    let stats = timer.stats();
    assert_eq!(stats.reaper_panics, 3, "{stats:?}");
    assert_eq!(stats.panicked, 0, "no task panicked: {stats:?}");
    assert!(timer.shutdown().is_empty(), "every task ran");
}
