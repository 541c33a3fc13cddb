//! A randomized differential test: a purgatory on a manual clock, driven by hand on one thread,
//! against a reference model of every operation's state and of the keys it watches.
//!
//! Each seed builds a purgatory in one of several configurations (purge interval 1, 3 or the
//! default; with or without `ReadyHint`s; with or without a `ready_test`; its own timer or a
//! shared hand-driven one with another tick), then runs random steps:
//! new operations (some ready at the first try, some at the second, some with an empty key set),
//! operations made ready, checks of watched and never-watched keys, forced completions, takes,
//! `cancel_for_key`, clock moves with and without `advance`, manual purges and dropped handles.
//! After every step it compares what happened (the callbacks each operation logged, return
//! values) with what the model predicts, and the counters with what the documentation promises:
//!
//! * exact: `delayed()`, `stats().{accepted, completed, expired, handed_back, delayed}`, a check's
//!   return value and the operations it completes, `cancel_for_key`'s operations, the
//!   expiries of an `advance` (the timer's rule: a deadline is rounded up to the tick and fires
//!   at the first advance to a clock reading at or past it; so never before the timeout, and at
//!   the first advance at least a tick after it; only `advance` expires anything), `purge()`'s return value and the lists
//!   it leaves, the payload of a completed operation released at once, shutdown's hand-back;
//! * bounds: `watched()` and `stats().keys` lie between the pending entries (which are certainly
//!   listed) and every entry not yet certainly swept; once a check has seen every entry of its
//!   key completed, the key is gone; with a purge interval below 64 (no counting lag), after an
//!   `advance` the empty cells awaiting the purge are at most `max(interval, delayed)` operations',
//!   and the purges that run are exactly those the documented rule makes due;
//! * hints and the ready test are asked only by a check of one of the operation's keys, with
//!   that key.
//!
//! `MODEL_SEED=<n>` runs one seed and prints its steps; `MODEL_SEEDS=<n>` runs seeds `0..n`.
#![cfg(not(loom))]
#![allow(clippy::disallowed_types)] // std's Mutex for the test's event log

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use purgatory::{
    DelayedOperation, OperationHandle, Purgatory, ReadyHint, WatchError, DEFAULT_PURGE_INTERVAL,
};
use system_timer::{ManualClock, SystemTimer};

const TICK_NS: u64 = 1_000_000;
/// Operations watch keys `0..WATCHED_KEYS`; checks and cancels also use `WATCHED_KEYS..ALL_KEYS`,
/// which nothing ever watches.
const WATCHED_KEYS: u64 = 6;
const ALL_KEYS: u64 = 8;
const MAX_KEYS_PER_OP: usize = 4;
const SEEDS: u64 = 320;
const STEPS: usize = 260;
/// Ready flags per seed (one per operation; more than `STEPS`).
const MAX_OPS: usize = 1024;
const NOT_CHECKING: u64 = u64::MAX;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `num / den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.below(from.len() as u64) as usize])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Try,
    Complete,
    Expire,
}

type Log = Arc<Mutex<Vec<(usize, Ev)>>>;

/// The operation under test: ready when its flag (shared with the test, its hint and the ready
/// test) is set; or, if `second_try`, at its second `try_complete`. Logs every call.
struct MOp {
    id: usize,
    flags: Arc<[AtomicBool]>,
    /// Each operation's keys, a bit each (for its hint's own checks).
    masks: Arc<[AtomicU8]>,
    /// The key being checked (`NOT_CHECKING` outside `check_and_complete`).
    checking: Arc<AtomicU64>,
    log: Log,
    tries: u32,
    second_try: bool,
    hint: bool,
    arg: Option<u64>,
    _payload: Arc<()>,
}

impl DelayedOperation for MOp {
    fn try_complete(&mut self) -> bool {
        self.tries += 1;
        self.log.lock().unwrap().push((self.id, Ev::Try));
        self.flags[self.id].load(SeqCst) || (self.second_try && self.tries == 2)
    }
    fn on_complete(&mut self) {
        self.log.lock().unwrap().push((self.id, Ev::Complete));
    }
    fn on_expiration(&mut self) {
        self.log.lock().unwrap().push((self.id, Ev::Expire));
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        if !self.hint {
            return None;
        }
        let (flags, id) = (Arc::clone(&self.flags), self.id);
        let (masks, checking) = (Arc::clone(&self.masks), Arc::clone(&self.checking));
        // The same question as `try_complete` (a second-try operation has no hint). Only a check
        // of one of the operation's keys may ask it.
        Some(ReadyHint::new(move || {
            let key = checking.load(SeqCst);
            assert!(
                key < 8 && masks[id].load(SeqCst) & (1 << key) != 0,
                "the hint of {id} asked outside a check of its keys (checking {key})"
            );
            flags[id].load(SeqCst)
        }))
    }
    fn ready_arg(&self) -> Option<u64> {
        self.arg
    }
}

#[derive(Clone, Copy, Debug)]
struct Config {
    interval: usize,
    hints: bool,
    test: bool,
    shards: usize,
    /// A shared hand-driven timer (tick 2 ms, wheel size 8) instead of the own one (1 ms, 20).
    shared: bool,
}

impl Config {
    fn tick_ns(&self) -> u64 {
        if self.shared {
            2 * TICK_NS
        } else {
            TICK_NS
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending,
    Completed,
    Expired,
    HandedBack,
    /// Refused with `NoKeys`: never accepted.
    Refused,
    /// Pending, but `cancel_for_key` removed it from every key and the test dropped its
    /// handle: unreachable (freed with its cell; not seen by shutdown).
    Lost,
}

/// The model of one accepted operation.
struct Model {
    st: St,
    /// Its entries still in watch lists (a key twice if watched twice on it), while pending:
    /// every key it was watched on, minus those `cancel_for_key` removed.
    keys: Vec<u64>,
    /// Armed in the timer (watched, not completed, not disarmed by `cancel_for_key`).
    armed: bool,
    /// The tick its expiry is due at (its deadline rounded up to the tick); `None`: never.
    due_ns: Option<u64>,
    handle: Option<OperationHandle<MOp>>,
    payload: Arc<()>,
    /// A check skips it without a try while it is not ready (its hint, or the ready test).
    skippable: bool,
    /// The ready test is asked about it (it gave an argument other than `u64::MAX`).
    tested: bool,
}

struct Harness {
    seed: u64,
    cfg: Config,
    step: usize,
    what: String,
    clock: ManualClock,
    p: Purgatory<u64, MOp>,
    shared: Option<Arc<SystemTimer>>,
    flags: Arc<[AtomicBool]>,
    masks: Arc<[AtomicU8]>,
    checking: Arc<AtomicU64>,
    log: Log,
    ops: Vec<Model>,
    /// For each key, the operations that may still have an entry in its list (a superset of the
    /// real list, as a multiset): entries leave only when the model is sure they were swept.
    lists: BTreeMap<u64, Vec<usize>>,
    accepted: u64,
    handed_back: u64,
    purges: u64,
    /// The purge rule (see `garbage`): watched operations completed or handed back since a
    /// purge last became due (or ran by hand).
    garbage: usize,
    /// A key was checked since a purge last became due (or ran by hand).
    checked: bool,
    /// A purge is scheduled and has not run yet.
    scheduled: bool,
    /// Purges that became due (whether or not one was scheduled already) in this step.
    dues: usize,
    verbose: bool,
}

/// What a step allows one operation to log.
#[derive(Debug)]
enum Expect {
    Exactly(Vec<Ev>),
    /// Between `lo` and `hi` tries, nothing else (a check of a pending operation not ready).
    Tries(usize, usize),
}

impl Harness {
    fn new(seed: u64, cfg: Config, verbose: bool) -> Self {
        let clock = ManualClock::new(1_000);
        let flags: Arc<[AtomicBool]> = (0..MAX_OPS).map(|_| AtomicBool::new(false)).collect();
        let masks: Arc<[AtomicU8]> = (0..MAX_OPS).map(|_| AtomicU8::new(0)).collect();
        let checking = Arc::new(AtomicU64::new(NOT_CHECKING));
        let mut b = Purgatory::builder()
            .clock(clock.clone())
            .reaper(false)
            .purge_interval(cfg.interval)
            .shards(cfg.shards);
        if cfg.test {
            let (flags, masks, checking) = (
                Arc::clone(&flags),
                Arc::clone(&masks),
                Arc::clone(&checking),
            );
            // The ready test's contract: false only when `try_complete` would say false. Asked
            // only by a check, with the key checked, about an operation watching it.
            b = b.ready_test(move |&key: &u64, arg| {
                assert_eq!(key, checking.load(SeqCst), "the ready test got another key");
                let id = usize::try_from(arg).expect("an operation's id");
                assert!(
                    id < MAX_OPS && masks[id].load(SeqCst) & (1 << key) != 0,
                    "the ready test asked about {arg}, not watching key {key}"
                );
                flags[id].load(SeqCst)
            });
        }
        let shared = cfg.shared.then(|| {
            Arc::new(
                SystemTimer::builder()
                    .clock(clock.clone())
                    .tick(Duration::from_nanos(cfg.tick_ns()))
                    .wheel_size(8)
                    .reaper(false)
                    .inline()
                    .build(),
            )
        });
        if let Some(timer) = &shared {
            b = b.timer(Arc::clone(timer));
        }
        Harness {
            seed,
            cfg,
            step: 0,
            what: String::new(),
            clock,
            p: b.build(),
            shared,
            flags,
            masks,
            checking,
            log: Log::default(),
            ops: Vec::new(),
            lists: BTreeMap::new(),
            accepted: 0,
            handed_back: 0,
            purges: 0,
            garbage: 0,
            checked: false,
            scheduled: false,
            dues: 0,
            verbose,
        }
    }

    fn ctx(&self) -> String {
        format!(
            "seed {} ({:?}) step {}: {}",
            self.seed, self.cfg, self.step, self.what
        )
    }

    fn ready(&self, id: usize) -> bool {
        self.flags[id].load(SeqCst)
    }

    fn pending(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ops.len()).filter(|&i| self.ops[i].st == St::Pending)
    }

    /// Pending operations with an entry on `key`, once each.
    fn watching(&self, key: u64) -> BTreeSet<usize> {
        self.pending()
            .filter(|&i| self.ops[i].keys.contains(&key))
            .collect()
    }

    /// Entries of pending operations: certainly in the lists.
    fn pending_entries(&self) -> usize {
        self.pending().map(|i| self.ops[i].keys.len()).sum()
    }

    /// Operations armed and pending.
    fn armed(&self) -> usize {
        self.pending().filter(|&i| self.ops[i].armed).count()
    }

    /// The documented purge rule, applied after `n` more watched operations completed or were
    /// handed back (their cells are garbage all the same), or with `n = 0` after
    /// `cancel_for_key` disarmed some: a purge is due once they reach the purge interval and,
    /// unless a key was checked since the last purge, the operations still delayed; the
    /// completion that makes it due schedules it (one at a time), and the next `advance` runs
    /// it. Exact below an interval of 64, where every completion is counted at once (above,
    /// completions are counted in batches of `interval / 32`, rounded down to a power of two).
    fn garbage(&mut self, n: usize) {
        self.garbage += n;
        if self.garbage >= self.cfg.interval && (self.checked || self.garbage >= self.armed()) {
            self.garbage = 0;
            self.checked = false;
            self.scheduled = true;
            self.dues += 1;
        }
    }

    /// Marks pending `id` done (completed, expired or handed back) and counts it as garbage if
    /// it was watched.
    fn finish_op(&mut self, id: usize, st: St, watched: bool) {
        let m = &mut self.ops[id];
        debug_assert_eq!(m.st, St::Pending);
        m.st = st;
        m.armed = false;
        if watched {
            self.garbage(1);
        }
    }

    /// Checks the log of this step against `expect` (operations not in it must log nothing), and
    /// that every `on_expiration` comes right after its operation's `on_complete`.
    fn events(&self, expect: &BTreeMap<usize, Expect>) {
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        for (i, &(id, ev)) in log.iter().enumerate() {
            if ev == Ev::Expire {
                assert!(
                    i > 0 && log[i - 1] == (id, Ev::Complete),
                    "{}: on_expiration of {id} not right after its on_complete: {log:?}",
                    self.ctx()
                );
            }
        }
        let mut got: BTreeMap<usize, Vec<Ev>> = BTreeMap::new();
        for &(id, ev) in &log {
            got.entry(id).or_default().push(ev);
        }
        for (id, evs) in &got {
            match expect.get(id) {
                None => panic!(
                    "{}: operation {id} ({:?}) logged {evs:?}, expected nothing",
                    self.ctx(),
                    self.ops.get(*id).map(|m| m.st)
                ),
                Some(Expect::Exactly(want)) => {
                    assert_eq!(evs, want, "{}: events of operation {id}", self.ctx())
                }
                Some(Expect::Tries(lo, hi)) => assert!(
                    evs.iter().all(|e| *e == Ev::Try) && (*lo..=*hi).contains(&evs.len()),
                    "{}: operation {id} logged {evs:?}, expected {lo}..={hi} tries",
                    self.ctx()
                ),
            }
        }
        for (id, want) in expect {
            let ok = match want {
                Expect::Exactly(w) => w.is_empty(),
                Expect::Tries(lo, _) => *lo == 0,
            };
            assert!(
                ok || got.contains_key(id),
                "{}: operation {id} logged nothing, expected {want:?}",
                self.ctx()
            );
        }
    }

    /// The state checks run after every step.
    fn verify(&self) {
        let ctx = self.ctx();
        let p = &self.p;
        let mut completed = 0;
        let mut expired = 0;
        let mut armed = 0;
        for (id, m) in self.ops.iter().enumerate() {
            let pending = m.st == St::Pending;
            match m.st {
                St::Completed => completed += 1,
                St::Expired => {
                    completed += 1;
                    expired += 1;
                }
                St::Pending => armed += usize::from(m.armed),
                St::HandedBack | St::Refused => {}
                // Freed with its cell, maybe only at the next advance (an expiry task the
                // timer had already dispatched still holds the cell): checked at the end.
                St::Lost => continue,
            }
            assert!(pending || !m.armed, "{ctx}: model: {id} armed, not pending");
            assert_eq!(
                Arc::strong_count(&m.payload),
                1 + usize::from(pending),
                "{ctx}: operation {id} ({:?}): its payload is held by {} (a completed or handed \
                 back operation is dropped at once)",
                m.st,
                Arc::strong_count(&m.payload) - 1
            );
            if let Some(h) = &m.handle {
                assert_eq!(h.is_completed(), !pending, "{ctx}: is_completed of {id}");
                assert_eq!(
                    h.with(|op| op.id),
                    pending.then_some(id),
                    "{ctx}: with() on {id}"
                );
            }
        }
        assert_eq!(p.delayed(), armed, "{ctx}: delayed()");
        let st = p.stats();
        assert_eq!(
            (
                st.accepted,
                st.completed,
                st.expired,
                st.handed_back,
                st.delayed
            ),
            (
                self.accepted,
                completed,
                expired,
                self.handed_back + self.lost_freed(),
                armed as u64
            ),
            "{ctx}: stats (accepted, completed, expired, handed_back, delayed): {st:?}"
        );
        assert_eq!(
            st.purges, self.purges,
            "{ctx}: purges (counted by the model)"
        );
        // watched(): every pending entry is listed; entries of finished operations may be.
        let watched = p.watched();
        let lo = self.pending_entries();
        let hi: usize = self.lists.values().map(Vec::len).sum();
        assert!(
            (lo..=hi).contains(&watched),
            "{ctx}: watched() = {watched}, expected {lo}..={hi}"
        );
        assert_eq!(st.watched, watched as u64, "{ctx}: stats().watched");
        let keys_lo = self
            .lists
            .values()
            .filter(|l| l.iter().any(|&i| self.ops[i].st == St::Pending))
            .count();
        let keys_hi = self.lists.values().filter(|l| !l.is_empty()).count();
        assert!(
            (keys_lo as u64..=keys_hi as u64).contains(&st.keys),
            "{ctx}: stats().keys = {}, expected {keys_lo}..={keys_hi}",
            st.keys
        );
        p.check_invariants();
    }

    fn run_step(&mut self, rng: &mut Rng) {
        let purges_before = self.p.stats().purges;
        let scheduled_before = self.scheduled;
        self.dues = 0;
        let r = rng.below(100);
        let mut may_purge = false;
        let mut advanced = false;
        match r {
            0..=21 => {
                // Now and then a burst, so that lists grow long enough for partial sweeps.
                let n = if rng.chance(1, 6) {
                    2 + rng.below(12)
                } else {
                    1
                };
                let what: Vec<String> = (0..n)
                    .map(|_| {
                        self.new_op(rng);
                        std::mem::take(&mut self.what)
                    })
                    .collect();
                self.what = what.join("; ");
            }
            22..=35 => self.set_ready(rng),
            36..=53 => self.check(rng),
            54..=60 => self.force(rng),
            61..=64 => self.take(rng),
            65..=68 => self.cancel(rng),
            69..=82 => {
                self.advance(rng);
                may_purge = true;
                advanced = true;
            }
            83..=87 => self.clock_only(rng),
            88..=91 => {
                self.purge();
                may_purge = true;
            }
            _ => self.drop_handle(rng),
        }
        let purges_after = self.p.stats().purges;
        if !may_purge {
            assert_eq!(
                purges_after,
                purges_before,
                "{}: a purge ran outside advance and purge",
                self.ctx()
            );
        }
        if advanced {
            // The advance runs the purge scheduled before it and any its expiries made due
            // (one of those may run before the next becomes due: up to one per due).
            let ran = purges_after - purges_before;
            let (lo, hi) = if scheduled_before || self.dues > 0 {
                (1, u64::from(scheduled_before) + self.dues as u64)
            } else {
                (0, 0)
            };
            if self.cfg.interval < 64 {
                assert!(
                    (lo..=hi).contains(&ran),
                    "{}: {ran} purges ran, expected {lo}..={hi} (scheduled before: \
                     {scheduled_before}, due during: {})",
                    self.ctx(),
                    self.dues
                );
            }
            self.scheduled = false;
            self.purges = purges_after;
        }
        if self.verbose {
            eprintln!(
                "step {}: {} -> watched {} delayed {}",
                self.step,
                self.what,
                self.p.watched(),
                self.p.delayed()
            );
        }
        self.verify();
    }

    fn timeout(rng: &mut Rng) -> Duration {
        match rng.below(12) {
            0 | 1 => Duration::ZERO,
            2 | 3 => Duration::from_nanos(1 + rng.below(TICK_NS - 1)),
            4..=6 => Duration::from_nanos(TICK_NS * (1 + rng.below(5)) + rng.below(TICK_NS)),
            7 | 8 => Duration::from_millis(20 + rng.below(480)),
            9 => Duration::from_millis(500 + rng.below(60_000)),
            10 => Duration::from_secs(3_600),
            _ if rng.chance(1, 2) => Duration::MAX,
            _ => Duration::from_millis(1 + rng.below(3)),
        }
    }

    fn new_op(&mut self, rng: &mut Rng) {
        let id = self.ops.len();
        if id == MAX_OPS {
            self.what = "new op: no more ids".into();
            return;
        }
        let keys: Vec<u64> = if rng.chance(1, 40) {
            Vec::new()
        } else {
            (0..1 + rng.below(MAX_KEYS_PER_OP as u64))
                .map(|_| rng.below(WATCHED_KEYS))
                .collect()
        };
        let timeout = Self::timeout(rng);
        let kind = rng.below(10);
        let (ready_first, second_try) = (kind < 2, kind == 2);
        let hint = self.cfg.hints && !second_try && rng.chance(2, 3);
        let arg = match rng.below(3) {
            _ if second_try => None,
            0 => None,
            1 => Some(id as u64),
            _ => Some(u64::MAX), // documented as "no argument"
        };
        let tested = self.cfg.test && arg == Some(id as u64);
        let payload = Arc::new(());
        let op = MOp {
            id,
            flags: Arc::clone(&self.flags),
            masks: Arc::clone(&self.masks),
            checking: Arc::clone(&self.checking),
            log: Arc::clone(&self.log),
            tries: 0,
            second_try,
            hint,
            arg,
            _payload: Arc::clone(&payload),
        };
        if ready_first {
            self.flags[id].store(true, SeqCst);
        }
        let mask = keys.iter().fold(0u8, |m, &k| m | 1 << k);
        self.masks[id].store(mask, SeqCst);
        self.what = format!(
            "new op {id} keys {keys:?} timeout {timeout:?} ready_first {ready_first} \
             second_try {second_try} hint {hint} arg {arg:?} at {} ns",
            self.clock.now_ns()
        );
        let now_ns = self.clock.now_ns();
        let res = self.p.try_complete_else_watch(op, timeout, &keys);
        if keys.is_empty() {
            match res {
                Err(WatchError::NoKeys(op)) => assert_eq!(op.id, id, "{}", self.ctx()),
                other => panic!("{}: expected NoKeys, got {other:?}", self.ctx()),
            }
            assert_eq!(Arc::strong_count(&payload), 1, "{}", self.ctx());
            self.events(&BTreeMap::new());
            // The id is burnt (its flag may be set), never accepted.
            self.ops.push(Model {
                st: St::Refused,
                keys: Vec::new(),
                armed: false,
                due_ns: None,
                handle: None,
                payload,
                skippable: false,
                tested: false,
            });
            return;
        }
        let w = res.unwrap_or_else(|e| panic!("{}: refused: {e:?}", self.ctx()));
        self.accepted += 1;
        let mut m = Model {
            st: St::Pending,
            keys: Vec::new(),
            armed: false,
            due_ns: None,
            handle: Some(w.handle),
            payload,
            skippable: hint || tested,
            tested,
        };
        let evs = if ready_first {
            m.st = St::Completed;
            vec![Ev::Try, Ev::Complete]
        } else {
            // Watched on every key (twice on a key given twice) before the second try.
            for &k in &keys {
                self.lists.entry(k).or_default().push(id);
            }
            if second_try {
                m.st = St::Completed;
                self.ops.push(m);
                self.garbage(1);
                self.events(&BTreeMap::from([(
                    id,
                    Expect::Exactly(vec![Ev::Try, Ev::Try, Ev::Complete]),
                )]));
                return assert!(w.completed, "{}: Watched::completed", self.ctx());
            } else {
                m.keys = keys.clone();
                m.armed = true;
                m.due_ns = u64::try_from(timeout.as_nanos())
                    .ok()
                    .and_then(|t| now_ns.checked_add(t))
                    .map(|d| d.div_ceil(self.cfg.tick_ns()) * self.cfg.tick_ns());
                vec![Ev::Try, Ev::Try]
            }
        };
        assert_eq!(
            w.completed,
            m.st == St::Completed,
            "{}: Watched::completed",
            self.ctx()
        );
        self.ops.push(m);
        self.events(&BTreeMap::from([(id, Expect::Exactly(evs))]));
    }

    fn set_ready(&mut self, rng: &mut Rng) {
        let pending: Vec<usize> = self.pending().collect();
        let id = if rng.chance(4, 5) {
            rng.pick(&pending)
        } else {
            rng.pick(&(0..self.ops.len()).collect::<Vec<_>>())
        };
        let Some(id) = id else {
            self.what = "set ready: no operation".into();
            return self.events(&BTreeMap::new());
        };
        self.what = format!("set ready {id} ({:?})", self.ops[id].st);
        self.flags[id].store(true, SeqCst);
        self.events(&BTreeMap::new());
    }

    fn check(&mut self, rng: &mut Rng) {
        let key = rng.below(ALL_KEYS);
        let watching = self.watching(key);
        let mut expect = BTreeMap::new();
        let mut ready = BTreeSet::new();
        for &i in &watching {
            if self.ready(i) {
                // One try, which completes it; none after.
                expect.insert(i, Expect::Exactly(vec![Ev::Try, Ev::Complete]));
                ready.insert(i);
            } else if self.ops[i].skippable {
                // Its hint or the ready test rules it out: no try.
                expect.insert(i, Expect::Exactly(vec![]));
            } else {
                let mult = self.ops[i].keys.iter().filter(|&&k| k == key).count();
                expect.insert(i, Expect::Tries(1, mult));
            }
        }
        self.what = format!("check {key}: watching {watching:?}, ready {ready:?}");
        self.checking.store(key, SeqCst);
        let n = self.p.check_and_complete(&key);
        self.checking.store(NOT_CHECKING, SeqCst);
        self.events(&expect);
        assert_eq!(n, ready.len(), "{}: check's return", self.ctx());
        self.checked = true;
        // Completed in list order (for the purge rule, which looks at the delayed count).
        let order: Vec<usize> = self.lists.get(&key).cloned().unwrap_or_default();
        for i in order {
            if ready.contains(&i) && self.ops[i].st == St::Pending {
                self.finish_op(i, St::Completed, true);
            }
        }
        // Documented: the key's list is dropped once every operation on it has completed, as
        // far as the scan sees (an entry the ready test rules out is not seen).
        if let Some(list) = self.lists.get(&key) {
            let all_seen_done = list.iter().all(|&i| {
                let m = &self.ops[i];
                m.st != St::Pending && !(self.cfg.test && m.tested && !self.ready(i))
            });
            if all_seen_done {
                self.lists.remove(&key);
            }
        }
    }

    fn with_handle(&self) -> Vec<usize> {
        (0..self.ops.len())
            .filter(|&i| self.ops[i].handle.is_some())
            .collect()
    }

    fn force(&mut self, rng: &mut Rng) {
        let Some(id) = rng.pick(&self.with_handle()) else {
            self.what = "force: no handle".into();
            return self.events(&BTreeMap::new());
        };
        let pending = self.ops[id].st == St::Pending;
        self.what = format!("force {id} ({:?})", self.ops[id].st);
        let r = self.ops[id].handle.as_ref().unwrap().force_complete();
        assert_eq!(r, pending, "{}: force_complete's return", self.ctx());
        let evs = if pending { vec![Ev::Complete] } else { vec![] };
        self.events(&BTreeMap::from([(id, Expect::Exactly(evs))]));
        if pending {
            self.finish_op(id, St::Completed, true);
        }
    }

    fn take(&mut self, rng: &mut Rng) {
        let Some(id) = rng.pick(&self.with_handle()) else {
            self.what = "take: no handle".into();
            return self.events(&BTreeMap::new());
        };
        let pending = self.ops[id].st == St::Pending;
        self.what = format!("take {id} ({:?})", self.ops[id].st);
        let op = self.ops[id].handle.as_ref().unwrap().take();
        assert_eq!(
            op.as_ref().map(|op| op.id),
            pending.then_some(id),
            "{}: take's operation",
            self.ctx()
        );
        drop(op);
        self.events(&BTreeMap::new());
        if pending {
            self.finish_op(id, St::HandedBack, true);
            self.handed_back += 1;
        }
    }

    fn cancel(&mut self, rng: &mut Rng) {
        let key = rng.below(ALL_KEYS);
        let watching = self.watching(key);
        self.what = format!("cancel_for_key {key}: watching {watching:?}");
        let handles = self.p.cancel_for_key(&key);
        self.events(&BTreeMap::new());
        let mut got = BTreeSet::new();
        for h in handles {
            assert!(
                !h.is_completed(),
                "{}: a completed handle returned",
                self.ctx()
            );
            let id = h
                .with(|op| op.id)
                .unwrap_or_else(|| panic!("{}: with() on a returned handle", self.ctx()));
            assert!(got.insert(id), "{}: {id} returned twice", self.ctx());
            // The way back to an operation whose handle the test dropped.
            if self.ops[id].handle.is_none() && rng.chance(1, 2) {
                self.ops[id].handle = Some(h);
            }
        }
        assert_eq!(got, watching, "{}: cancel_for_key's operations", self.ctx());
        for &i in &watching {
            let m = &mut self.ops[i];
            m.armed = false;
            m.keys.retain(|&k| k != key);
            self.mark_lost(i);
        }
        self.lists.remove(&key);
        if !watching.is_empty() {
            self.garbage(0);
        }
    }

    /// Lost operations already dropped with their cells (the model holds the only reference
    /// to their payloads left): the purgatory counts each as handed back when its cell is
    /// dropped, which an expiry task the timer had already dispatched may delay.
    fn lost_freed(&self) -> u64 {
        let freed = |m: &&Model| m.st == St::Lost && Arc::strong_count(&m.payload) == 1;
        self.ops.iter().filter(freed).count() as u64
    }

    /// A pending operation on no key, whose handle the test no longer holds, is unreachable.
    fn mark_lost(&mut self, id: usize) {
        let m = &mut self.ops[id];
        if m.st == St::Pending && m.keys.is_empty() && m.handle.is_none() {
            m.st = St::Lost;
        }
    }

    fn clock_move(&self, rng: &mut Rng) -> Duration {
        match rng.below(10) {
            0 => Duration::ZERO,
            // To the next tick boundary (or the one after): deadlines there are due exactly.
            1 => {
                let tick = self.cfg.tick_ns();
                let to_boundary = tick - self.clock.now_ns() % tick;
                Duration::from_nanos(to_boundary + tick * rng.below(2))
            }
            2 | 3 => Duration::from_nanos(1 + rng.below(TICK_NS)),
            4..=6 => Duration::from_nanos(rng.below(6 * TICK_NS)),
            7 | 8 => Duration::from_millis(rng.below(300)),
            _ if rng.chance(1, 3) => Duration::from_secs(rng.below(4_000)),
            _ => Duration::from_millis(rng.below(30)),
        }
    }

    fn advance(&mut self, rng: &mut Rng) {
        let d = self.clock_move(rng);
        self.clock.advance(d);
        let now = self.clock.now_ns();
        let due: BTreeSet<usize> = self
            .pending()
            .filter(|&i| self.ops[i].armed && self.ops[i].due_ns.is_some_and(|t| t <= now))
            .collect();
        self.what = format!("advance {d:?} to {now} ns: due {due:?}");
        let ran = self.p.advance();
        let expect = due
            .iter()
            .map(|&i| (i, Expect::Exactly(vec![Ev::Complete, Ev::Expire])))
            .collect();
        // An operation whose tick has not come does not expire (never before its timeout);
        // every one whose tick has come does (at most a tick after its timeout).
        self.events(&expect);
        assert!(ran >= due.len(), "{}: advance ran {ran} tasks", self.ctx());
        for &i in &due {
            self.finish_op(i, St::Expired, true);
        }
        if self.cfg.interval < 64 {
            // No counting lag below 64 (one flush per completion): after an advance, which runs
            // any due purge, the operations whose empty cells await the purge are fewer than
            // max(interval, delayed); each has at most MAX_KEYS_PER_OP entries.
            let garbage = self.p.watched() - self.pending_entries();
            let bound = MAX_KEYS_PER_OP * self.cfg.interval.max(self.p.delayed());
            assert!(
                garbage <= bound,
                "{}: {garbage} empty entries after an advance, more than {bound}",
                self.ctx()
            );
        }
    }

    fn clock_only(&mut self, rng: &mut Rng) {
        let d = self.clock_move(rng);
        self.clock.advance(d);
        self.what = format!("clock only {d:?}");
        // Without a reaper (and with no reaper grace) only `advance` expires anything.
        self.events(&BTreeMap::new());
    }

    fn purge(&mut self) {
        let before = self.p.watched();
        let removed = self.p.purge();
        let after = self.p.watched();
        self.purges += 1;
        // It counts as the last purge for the rule (a purge scheduled before it still runs).
        self.garbage = 0;
        self.checked = false;
        self.what = format!("purge: removed {removed}");
        self.events(&BTreeMap::new());
        // Every completed entry is swept: what is left are the pending operations' entries.
        for list in self.lists.values_mut() {
            list.retain(|&i| self.ops[i].st == St::Pending);
        }
        self.lists.retain(|_, l| !l.is_empty());
        assert_eq!(
            after,
            self.pending_entries(),
            "{}: watched after purge",
            self.ctx()
        );
        assert_eq!(removed, before - after, "{}: purge's return", self.ctx());
        assert_eq!(
            self.p.stats().keys as usize,
            self.lists.len(),
            "{}: keys after purge",
            self.ctx()
        );
    }

    fn drop_handle(&mut self, rng: &mut Rng) {
        let Some(id) = rng.pick(&self.with_handle()) else {
            self.what = "drop handle: none".into();
            return self.events(&BTreeMap::new());
        };
        self.what = format!("drop handle {id} ({:?})", self.ops[id].st);
        self.ops[id].handle = None;
        self.mark_lost(id);
        self.events(&BTreeMap::new());
    }

    /// Shutdown hands back exactly the pending operations still watched on some key; those
    /// `cancel_for_key` removed from every key are recovered through their handles; nothing
    /// leaks.
    fn finish(mut self) {
        self.step += 1;
        let still_watched: BTreeSet<usize> = self
            .pending()
            .filter(|&i| !self.ops[i].keys.is_empty())
            .collect();
        let unwatched: Vec<usize> = self
            .pending()
            .filter(|&i| self.ops[i].keys.is_empty())
            .collect();
        self.what = format!("shutdown: still watched {still_watched:?}, unwatched {unwatched:?}");
        let back = self.p.shutdown();
        let ids: BTreeSet<usize> = back.iter().map(|op| op.id).collect();
        assert_eq!(back.len(), ids.len(), "{}: an operation twice", self.ctx());
        assert_eq!(ids, still_watched, "{}: shutdown's operations", self.ctx());
        drop(back);
        self.events(&BTreeMap::new());
        for &i in &still_watched {
            self.ops[i].st = St::HandedBack;
            self.ops[i].armed = false;
            self.handed_back += 1;
        }
        let st = self.p.stats();
        assert_eq!(
            (st.handed_back, st.delayed),
            (self.handed_back + self.lost_freed(), 0),
            "{}: stats after shutdown",
            self.ctx()
        );
        assert!(
            self.p.shutdown().is_empty(),
            "{}: second shutdown",
            self.ctx()
        );
        let refused = self.p.try_complete_else_watch(
            MOp {
                id: 0,
                flags: Arc::clone(&self.flags),
                masks: Arc::clone(&self.masks),
                checking: Arc::clone(&self.checking),
                log: Arc::clone(&self.log),
                tries: 0,
                second_try: false,
                hint: false,
                arg: None,
                _payload: Arc::new(()),
            },
            Duration::ZERO,
            &[0],
        );
        assert!(
            matches!(refused, Err(WatchError::Shutdown(_))),
            "{}: a watch after shutdown",
            self.ctx()
        );
        self.events(&BTreeMap::new());
        for &i in &unwatched {
            if let Some(h) = self.ops[i].handle.take() {
                assert_eq!(h.take().map(|op| op.id), Some(i), "{}: take", self.ctx());
            }
        }
        self.events(&BTreeMap::new());
        if let Some(timer) = self.shared.clone() {
            // A shared timer outlives the purgatory: nothing of it expires any more, and once
            // advanced (due tasks run: purges, expiries dispatched before a disarm) it holds
            // nothing of it.
            self.clock.advance(Duration::from_secs(36_000));
            timer.advance();
            self.events(&BTreeMap::new());
            assert_eq!(
                timer.len(),
                0,
                "{}: tasks left in the shared timer",
                self.ctx()
            );
        }
        let payloads: Vec<Arc<()>> = self.ops.iter().map(|m| Arc::clone(&m.payload)).collect();
        let ctx = self.ctx();
        drop(self);
        for (i, p) in payloads.iter().enumerate() {
            assert_eq!(
                Arc::strong_count(p),
                1,
                "{ctx}: operation {i} leaked after everything was dropped"
            );
        }
    }
}

fn config(seed: u64) -> Config {
    let interval = [1, 3, DEFAULT_PURGE_INTERVAL][(seed % 3) as usize];
    let hints = (seed / 3) % 2 == 1;
    let test = (seed / 6) % 2 == 1;
    // Mostly few shards (watched() walks them all after every step); the default now and then.
    let shards = if seed % 13 == 0 { 512 } else { 4 };
    Config {
        interval,
        hints,
        test,
        shards,
        shared: (seed / 12) % 3 == 2,
    }
}

fn run_seed(seed: u64, verbose: bool) {
    let cfg = config(seed);
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
    let mut h = Harness::new(seed, cfg, verbose);
    h.verify();
    for step in 0..STEPS {
        h.step = step;
        h.run_step(&mut rng);
    }
    h.finish();
}

#[test]
fn purgatory_matches_its_model() {
    if let Some(seed) = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        return run_seed(seed, true);
    }
    // MODEL_SEEDS=<n>: more (or fewer) seeds than the default.
    let seeds = std::env::var("MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(SEEDS);
    for seed in 0..seeds {
        run_seed(seed, false);
    }
}
