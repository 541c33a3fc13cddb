//! Criterion: one operation's life in a purgatory, `try_complete_else_watch` followed by
//! `check_and_complete` on each of its keys (the check completes it), at 1, 3 and 10 keys per
//! operation out of 100, with 1,000 other operations pending on the same keys. Against, in the
//! same groups, the shape Rust users hand-roll today: a `DashMap` of per-key `Vec`s of
//! operations plus a tokio-util `DelayQueue` (behind a mutex) for the timeouts.
//!
//! `check-not-ready`: one `check_and_complete` of a key watched by N operations none of which
//! is ready, with and without `ReadyHint`s (the cost of a visit: the lock taken and released
//! to call `try_complete`, or the hint read without it), and with the purgatory's ready test
//! (`Builder::ready_test`: the operation's argument read from the watch list, the operation
//! itself not at all), as a closure behind a pointer and as a type of its own
//! (`Builder::with_ready_test`: called directly). Every watcher is in cache here: the best case
//! for all of them.
//!
//! `concurrent-adders`: the life of an operation as Kafka's own benchmark drives it (watched on 3
//! keys, armed, force-completed, later purged by the reaper), on 1 and on 2 threads at once,
//! each thread on keys of its own: time per operation per thread. With no shared state between
//! the threads' operations but the purgatory's own, 2 threads should take about as long per
//! operation as 1; what they share shows up as the difference.
//!
//! `lifecycle`: the same life on one thread, timed by phase (rounds of 1,000 operations: added,
//! then force-completed, then the timer advanced by hand, which runs the purge when one is due):
//! `add` per operation at 1 and 3 keys (the difference is one watch), `complete` and `purge`
//! (amortised over the rounds) per operation at 3 keys. Everything in cache.
//!
//! `w4-replay`: W4's `kafka` model at the low-timeout point (BENCHMARKS.md), replayed on one
//! thread and a manual clock: each virtual millisecond, 100 requests (100,000/s) watched on the
//! same 3 keys of 100 with a 200 ms timeout and W4's log-normal latencies (p50/p75 = 20/60 ms,
//! seed 42); each request whose latency is under the timeout is force-completed in the
//! millisecond its latency ends (as W4's completer does), the rest expire; then the clock moves
//! on 1 ms and the purgatory advances (expiries, purges). Timed per request in the steady state
//! (about 5,000 pending, the garbage and purges of W4). No second thread, no sleeps and no
//! wake-ups: the purgatory's own work on W4's shape and working set, with a few percent of
//! noise where a W4 run's CPU figure varies by tens of percent on a shared VM. For A/B of
//! hot-path changes; W4 itself decides.
#![allow(missing_docs, clippy::disallowed_methods, clippy::disallowed_types)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use kafka_timer::rng::SplitMix64;
use purgatory::system_timer::ManualClock;
use purgatory::{DelayedOperation, OperationHandle, Purgatory, ReadyHint, ReadyTest};
use tokio_util::time::{delay_queue, DelayQueue};

const KEY_SPACE: u64 = 100;
const BACKGROUND: usize = 1_000;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Ready when its flag is set; with `HINT`, it also offers a `ReadyHint` over the same flag.
struct BenchOp<const HINT: bool = false>(Arc<AtomicBool>);

impl<const HINT: bool> DelayedOperation for BenchOp<HINT> {
    fn try_complete(&mut self) -> bool {
        self.0.load(Relaxed)
    }
    fn on_complete(&mut self) {
        black_box(&self.0);
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        let flag = Arc::clone(&self.0);
        HINT.then(|| ReadyHint::new(move || flag.load(Relaxed)))
    }
}

/// A produce waiting for a partition's high watermark to pass its offset: its argument to the
/// purgatory's ready test.
struct Produce {
    offset: u64,
    hw: Arc<AtomicU64>,
}

impl DelayedOperation for Produce {
    fn try_complete(&mut self) -> bool {
        self.hw.load(Relaxed) > self.offset
    }
    fn on_complete(&mut self) {}
    fn ready_arg(&self) -> Option<u64> {
        Some(self.offset)
    }
}

fn keys(rng: &mut SplitMix64, k: usize) -> Vec<u32> {
    (0..k).map(|_| (rng.next() % KEY_SPACE) as u32).collect()
}

fn ours(c: &mut Criterion) {
    let mut g = c.benchmark_group("watch-then-check");
    g.throughput(Throughput::Elements(1));
    for k in [1usize, 3, 10] {
        g.bench_with_input(BenchmarkId::new("purgatory", k), &k, |b, &k| {
            let p: Purgatory<u32, BenchOp> = Purgatory::builder().name("bench").build();
            let mut rng = SplitMix64::new(42);
            let never = Arc::new(AtomicBool::new(false));
            for _ in 0..BACKGROUND {
                let ks = keys(&mut rng, 3);
                p.try_complete_else_watch(BenchOp(never.clone()), TIMEOUT, &ks)
                    .unwrap();
            }
            b.iter(|| {
                let ks = keys(&mut rng, k);
                let ready = Arc::new(AtomicBool::new(false));
                p.try_complete_else_watch(BenchOp(ready.clone()), TIMEOUT, &ks)
                    .unwrap();
                ready.store(true, Relaxed);
                let mut done = 0;
                for key in &ks {
                    done += p.check_and_complete(key);
                }
                assert_eq!(done, 1);
            });
        });
    }
    g.finish();
}

/// A partition's high watermark as a ready test: an offset may be ready once it is below it.
fn high_watermark(hw: &Arc<AtomicU64>) -> impl Fn(&u32, u64) -> bool + Send + Sync + 'static {
    let hw = Arc::clone(hw);
    move |_partition: &u32, offset| hw.load(Relaxed) > offset
}

/// A produce waiting for `hw` to pass `offset`.
fn produce(hw: &Arc<AtomicU64>, offset: u64) -> Produce {
    Produce {
        offset,
        hw: Arc::clone(hw),
    }
}

/// One check of a key that `n` operations watch, none ready.
fn check_not_ready(c: &mut Criterion) {
    /// Watches the `n` operations `make(i)` on key 7 of `p` and times one check of it.
    fn run<Op: DelayedOperation, T: ReadyTest<u32>>(
        b: &mut criterion::Bencher<'_>,
        p: Purgatory<u32, Op, T>,
        n: usize,
        make: impl Fn(u64) -> Op,
    ) {
        for i in 0..n as u64 {
            p.try_complete_else_watch(make(i), TIMEOUT, &[7]).unwrap();
        }
        b.iter(|| assert_eq!(p.check_and_complete(black_box(&7)), 0));
    }
    // A flag per operation, as a request's own state.
    let flag = || Arc::new(AtomicBool::new(false));
    let mut g = c.benchmark_group("check-not-ready");
    for n in [100usize, 1_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("lock-every-watcher", n), &n, |b, &n| {
            run(b, Purgatory::builder().name("bench").build(), n, |_| {
                BenchOp::<false>(flag())
            })
        });
        g.bench_with_input(BenchmarkId::new("ready-hint", n), &n, |b, &n| {
            run(b, Purgatory::builder().name("bench").build(), n, |_| {
                BenchOp::<true>(flag())
            })
        });
        // The same test behind a closure's pointer (`ready_test`), and as a type of its own
        // (`with_ready_test`: called directly, inlined into the scan).
        g.bench_with_input(BenchmarkId::new("ready-test", n), &n, |b, &n| {
            let hw = Arc::new(AtomicU64::new(0));
            let test = Purgatory::builder().ready_test(high_watermark(&hw));
            run(b, test.name("bench").build(), n, |offset| {
                produce(&hw, offset)
            })
        });
        g.bench_with_input(BenchmarkId::new("typed-ready-test", n), &n, |b, &n| {
            let hw = Arc::new(AtomicU64::new(0));
            let test = Purgatory::builder().with_ready_test(high_watermark(&hw));
            run(b, test.name("bench").build(), n, |offset| {
                produce(&hw, offset)
            })
        });
    }
    g.finish();
}

/// The hand-rolled baseline's operation: a lock around its timer key, and a completed flag
/// written under that lock and read without it (as the purgatory's cells do), so that dropping
/// completed operations from a watch list takes no operation's lock.
struct HandOp {
    ready: AtomicBool,
    completed: AtomicBool,
    state: Mutex<Option<delay_queue::Key>>,
}

impl HandOp {
    fn new() -> Arc<Self> {
        Arc::new(HandOp {
            ready: AtomicBool::new(false),
            completed: AtomicBool::new(false),
            state: Mutex::new(None),
        })
    }
}

struct HandRolled {
    watchers: DashMap<u32, Vec<Arc<HandOp>>>,
    timeouts: Mutex<DelayQueue<Arc<HandOp>>>,
    _rt: tokio::runtime::Runtime,
}

impl HandRolled {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let timeouts = {
            let _g = rt.enter();
            Mutex::new(DelayQueue::new())
        };
        HandRolled {
            watchers: DashMap::new(),
            timeouts,
            _rt: rt,
        }
    }

    /// Completes `op`, whose lock the caller holds (`st`).
    fn complete(&self, op: &HandOp, st: &mut Option<delay_queue::Key>) {
        op.completed.store(true, Relaxed);
        if let Some(key) = st.take() {
            self.timeouts.lock().unwrap().try_remove(&key);
        }
    }

    fn try_complete_else_watch(&self, op: Arc<HandOp>, keys: &[u32]) -> bool {
        let mut st = op.state.lock().unwrap();
        if op.ready.load(Relaxed) {
            self.complete(&op, &mut st);
            return true;
        }
        for k in keys {
            self.watchers.entry(*k).or_default().push(op.clone());
        }
        if op.ready.load(Relaxed) {
            self.complete(&op, &mut st);
            return true;
        }
        let mut timeouts = self.timeouts.lock().unwrap();
        // A DelayQueue user runs inside its runtime, where the context costs nothing per insert.
        // The queue needs it only to create its `Sleep`, on an insert into an empty queue (a
        // removal resets the `Sleep` it has; here the background operations keep it non-empty).
        // Entering on every insert (a handle clone and a thread-local swap, ~12 ns in W1) was
        // harness cost charged to this baseline alone, as W1's was until 2026-11-25.
        let _g = timeouts.is_empty().then(|| self._rt.enter());
        *st = Some(timeouts.insert(op.clone(), TIMEOUT));
        false
    }

    fn check_and_complete(&self, key: u32) -> usize {
        // Copy the list out (no user code under the map lock), then check each operation.
        let Some(list) = self.watchers.get(&key).map(|l| l.clone()) else {
            return 0;
        };
        let mut done = 0;
        for op in &list {
            let mut st = op.state.lock().unwrap();
            if !op.completed.load(Relaxed) && op.ready.load(Relaxed) {
                self.complete(op, &mut st);
                done += 1;
            }
        }
        // Each operation's lock was taken once, above; the sweep reads the flag alone (it used
        // to take every watcher's lock a second time, which the purgatory's sweep does not).
        self.watchers.remove_if_mut(&key, |_, l| {
            l.retain(|op| !op.completed.load(Relaxed));
            l.is_empty()
        });
        done
    }
}

fn hand_rolled(c: &mut Criterion) {
    let mut g = c.benchmark_group("watch-then-check");
    g.throughput(Throughput::Elements(1));
    for k in [1usize, 3, 10] {
        g.bench_with_input(BenchmarkId::new("dashmap+delayqueue", k), &k, |b, &k| {
            let h = HandRolled::new();
            let mut rng = SplitMix64::new(42);
            for _ in 0..BACKGROUND {
                let ks = keys(&mut rng, 3);
                h.try_complete_else_watch(HandOp::new(), &ks);
            }
            b.iter(|| {
                let ks = keys(&mut rng, k);
                let op = HandOp::new();
                h.try_complete_else_watch(op.clone(), &ks);
                op.ready.store(true, Relaxed);
                let mut done = 0;
                for key in &ks {
                    done += h.check_and_complete(*key);
                }
                assert_eq!(done, 1);
            });
        });
    }
    g.finish();
}

/// Never ready: completed by force, as in Kafka's TestPurgatoryPerformance.
struct Forced;

impl DelayedOperation for Forced {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {}
}

/// Operations per round of `concurrent-adders` and `lifecycle`: added, then force-completed.
const BATCH: u64 = 1_000;

/// A round's first half: `BATCH` operations watched on `ks`, their handles kept.
fn add_round(p: &Purgatory<u32, Forced>, ks: &[u32], handles: &mut Vec<OperationHandle<Forced>>) {
    for _ in 0..BATCH {
        handles.push(
            p.try_complete_else_watch(Forced, TIMEOUT, ks)
                .unwrap()
                .handle,
        );
    }
}

/// A round's second half: each operation completed by force.
fn complete_round(handles: &mut Vec<OperationHandle<Forced>>) {
    for h in handles.drain(..) {
        assert!(h.force_complete());
    }
}

/// Time measured over `rounds` whole rounds, scaled to the `iters` operations asked for.
fn per_iters(spent: Duration, iters: u64, rounds: u64) -> Duration {
    spent.mul_f64(iters as f64 / (rounds * BATCH) as f64)
}

fn concurrent_adders(c: &mut Criterion) {
    let mut g = c.benchmark_group("concurrent-adders");
    g.throughput(Throughput::Elements(1));
    for threads in [1usize, 2] {
        g.bench_with_input(
            BenchmarkId::new("purgatory", threads),
            &threads,
            |b, &threads| {
                let p: Arc<Purgatory<u32, Forced>> =
                    Arc::new(Purgatory::builder().name("bench").build());
                // Each sample: every thread adds `iters` operations (rounded up to whole batches),
                // force-completing each batch of 1,000 once it is added. Wall time of the slowest.
                b.iter_custom(|iters| {
                    let batches = iters.div_ceil(BATCH);
                    let start = std::time::Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..threads {
                            let p = &p;
                            s.spawn(move || {
                                let ks: Vec<u32> = (0..3).map(|k| (t * 3 + k) as u32).collect();
                                let mut handles = Vec::with_capacity(BATCH as usize);
                                for _ in 0..batches {
                                    add_round(p, &ks, &mut handles);
                                    complete_round(&mut handles);
                                }
                            });
                        }
                    });
                    per_iters(start.elapsed(), iters, batches)
                });
            },
        );
    }
    g.finish();
}

fn lifecycle(c: &mut Criterion) {
    #[derive(Clone, Copy)]
    enum Phase {
        Add,
        Complete,
        Purge,
    }
    let mut g = c.benchmark_group("lifecycle");
    g.throughput(Throughput::Elements(1));
    let cases = [
        ("add", 1usize, Phase::Add),
        ("add", 3, Phase::Add),
        ("complete", 3, Phase::Complete),
        ("purge", 3, Phase::Purge),
    ];
    for (name, k, phase) in cases {
        g.bench_with_input(BenchmarkId::new(name, k), &k, |b, &k| {
            let p: Purgatory<u32, Forced> =
                Purgatory::builder().name("bench").reaper(false).build();
            let ks: Vec<u32> = (0..k as u32).collect();
            let mut handles = Vec::with_capacity(BATCH as usize);
            b.iter_custom(|iters| {
                let rounds = iters.div_ceil(BATCH);
                let mut spent = Duration::ZERO;
                for _ in 0..rounds {
                    let t0 = std::time::Instant::now();
                    add_round(&p, &ks, &mut handles);
                    let t1 = std::time::Instant::now();
                    complete_round(&mut handles);
                    let t2 = std::time::Instant::now();
                    p.advance();
                    let t3 = std::time::Instant::now();
                    spent += match phase {
                        Phase::Add => t1 - t0,
                        Phase::Complete => t2 - t1,
                        Phase::Purge => t3 - t2,
                    };
                }
                // A purge becomes due during a round's completions (the one that makes it due
                // schedules it) and runs in the round's advance, the purge phase.
                assert!(rounds < 4 || p.stats().purges > 0, "no purge ran");
                per_iters(spent, iters, rounds)
            });
        });
    }
    g.finish();
}

fn w4_replay(c: &mut Criterion) {
    /// Requests per virtual millisecond (W4's default rate, 100,000/s).
    const PER_MS: usize = 100;
    /// W4's timeout.
    const TIMEOUT_MS: u64 = 200;
    /// Latencies drawn (cycled through): far more than the steady state's 5,000 pending.
    const DRAWS: usize = 1 << 20;
    let mut g = c.benchmark_group("w4-replay");
    g.throughput(Throughput::Elements(1));
    g.bench_function("kafka-low-timeout", |b| {
        // W4's draws at its defaults: the latencies first, then (after the gaps, which the
        // replay does not need: its arrivals are evenly spread) the 3 keys of the `kafka`
        // model, the same for every request.
        let mut rng = SplitMix64::new(42);
        let latency_ms: Vec<u64> = kafka_timer::load::latencies_ns(&mut rng, DRAWS, 20.0, 60.0)
            .into_iter()
            .map(|ns| ns / 1_000_000)
            .collect();
        let keys: Vec<u32> = (0..3).map(|_| (rng.next() % KEY_SPACE) as u32).collect();
        let clock = ManualClock::new(0);
        let p: Purgatory<u32, Forced> = Purgatory::builder()
            .name("bench")
            .clock(clock.clone())
            .reaper(false)
            .build();
        // The completer's calendar: the handles due in each millisecond, a slot per millisecond
        // of the timeout (a latency under it is due within it).
        let mut calendar: Vec<Vec<OperationHandle<Forced>>> =
            (0..=TIMEOUT_MS).map(|_| Vec::new()).collect();
        let slot = |ms: u64| (ms % (TIMEOUT_MS + 1)) as usize;
        let (mut now_ms, mut next) = (0u64, 0usize);
        let mut step = || {
            for _ in 0..PER_MS {
                let latency = latency_ms[next % DRAWS];
                next += 1;
                let w = p
                    .try_complete_else_watch(Forced, Duration::from_millis(TIMEOUT_MS), &keys)
                    .unwrap();
                if latency < TIMEOUT_MS {
                    calendar[slot(now_ms + latency)].push(w.handle);
                }
            }
            for h in calendar[slot(now_ms)].drain(..) {
                assert!(h.force_complete(), "completed before its latency");
            }
            now_ms += 1;
            clock.advance(Duration::from_millis(1));
            p.advance();
        };
        // The steady state: a second of virtual time (five timeouts) before timing.
        for _ in 0..1_000 {
            step();
        }
        b.iter_custom(|iters| {
            let steps = iters.div_ceil(PER_MS as u64);
            let start = std::time::Instant::now();
            for _ in 0..steps {
                step();
            }
            start
                .elapsed()
                .mul_f64(iters as f64 / (steps * PER_MS as u64) as f64)
        });
        let st = p.stats();
        assert!(
            st.expired > 0 && st.purges > 0,
            "no expiry or no purge: {st:?}"
        );
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = ours, hand_rolled, check_not_ready, concurrent_adders, lifecycle, w4_replay
}
criterion_main!(benches);
