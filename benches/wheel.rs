//! Criterion: the wheel's add, cancel and advance at 10^4, 10^5 and 10^6 pending entries, with
//! std `BinaryHeap` (lazy cancel) measured in the same groups.
//!
//! * `add/N`, `cancel/N`: one operation on a structure holding about N pending entries with W1's
//!   deadline mix (about 33 per ms, like BENCHMARKS.md W5). Adds are timed in chunks of at most
//!   N/10 and undone untimed between chunks, so N stays put however many iterations criterion
//!   asks for; cancels likewise. So a timed cancel removes an entry of the chunk just added
//!   (at most N/10 adds before it, in add order: its lines and its neighbours' recently
//!   touched), not an arbitrary one of the N: a recent entry's cancel, not the one W1 and W5
//!   time (entries added up to N adds before).
//! * `advance-1ms-step/N`: one 1 ms step at steady state, N entries pending: every entry that
//!   fires is re-added with a delay uniform in 1..=2R ms (R = N/33 ms, W5's range: mean delay
//!   about R), so each step does ~33 fires and ~33 adds, from the first step on (the entries are
//!   placed as that steady state leaves them; see [`stationary_delay`]).
#![allow(missing_docs, clippy::disallowed_methods)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kafka_timer::churn::{time_chunked, Phase};
use kafka_timer::rng::SplitMix64;
use timing_wheel::{ConcurrentWheel, EntryKey, TimingWheel};

const SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];

/// The ops a bench needs from each structure.
trait Pending {
    type Key;
    fn add(&mut self, deadline: u64, id: u64) -> Self::Key;
    fn cancel(&mut self, key: &Self::Key);
    /// Fires everything due at `now`, calling `f(id)` for each.
    fn advance(&mut self, now: u64, f: &mut dyn FnMut(u64));
    /// Drops what cancels left behind (untimed, between chunks of the churn benches).
    fn tidy(&mut self) {}
}

impl Pending for TimingWheel<u64> {
    type Key = EntryKey;
    fn add(&mut self, deadline: u64, id: u64) -> EntryKey {
        TimingWheel::add(self, deadline, id).expect("future deadline")
    }
    fn cancel(&mut self, key: &EntryKey) {
        black_box(TimingWheel::cancel(self, *key));
    }
    fn advance(&mut self, now: u64, f: &mut dyn FnMut(u64)) {
        TimingWheel::advance(self, now, |e| f(e.value));
    }
}

impl Pending for ConcurrentWheel<u64> {
    type Key = timing_wheel::EntryHandle<u64>;
    fn add(&mut self, deadline: u64, id: u64) -> Self::Key {
        ConcurrentWheel::add(self, deadline, id)
            .expect("future deadline")
            .handle
    }
    fn cancel(&mut self, key: &Self::Key) {
        black_box(key.cancel());
    }
    /// `f` only collects (into the bench's list of due ids, as for the other structures),
    /// which is what the guard's `advance` allows under its locks. It used to collect into a
    /// fresh vector per step first and then hand that on: ~4.5 allocations a step (growing to
    /// ~33 ids) timed for this structure alone (5.5 a step in all, against 0 for
    /// `TimingWheel` and the heap; the guard's own vector of shard locks is the other one).
    fn advance(&mut self, now: u64, f: &mut dyn FnMut(u64)) {
        self.lock().advance(now, |e| f(e.value));
    }
}

/// std `BinaryHeap` with lazy cancel: a flag per id; cancelled entries stay until popped.
#[derive(Default)]
struct LazyHeap {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    cancelled: Vec<bool>,
}

impl Pending for LazyHeap {
    type Key = u64;
    fn add(&mut self, deadline: u64, id: u64) -> u64 {
        self.heap.push(Reverse((deadline, id)));
        if self.cancelled.len() <= id as usize {
            self.cancelled.resize(id as usize + 1, false);
        }
        self.cancelled[id as usize] = false;
        id
    }
    fn cancel(&mut self, key: &u64) {
        self.cancelled[*key as usize] = true;
    }
    /// Without it, every add of `add/binary-heap` left a dead entry behind, and the heap grew
    /// to hundreds of times N within a sample (its reallocations timed with the adds).
    fn tidy(&mut self) {
        let cancelled = &self.cancelled;
        self.heap
            .retain(|Reverse((_, id))| !cancelled[*id as usize]);
    }
    fn advance(&mut self, now: u64, f: &mut dyn FnMut(u64)) {
        while let Some(&Reverse((d, id))) = self.heap.peek() {
            if d > now {
                break;
            }
            self.heap.pop();
            if !std::mem::replace(&mut self.cancelled[id as usize], true) {
                f(id);
            }
        }
    }
}

/// Deadline range (ms) giving ~33 entries per ms at `n` pending.
fn range(n: usize) -> u64 {
    (n as u64 * 3 / 100).max(1)
}

fn filled<P: Pending>(mut p: P, n: usize, rng: &mut SplitMix64) -> (P, Vec<P::Key>) {
    let r = range(n);
    let keys = (0..n as u64)
        .map(|id| p.add(1 + rng.next() % r, id))
        .collect();
    (p, keys)
}

/// `iters` operations of `add/N` or `cancel/N` on `state` (a structure filled with `n`
/// entries, ids `0..n`, and the deadlines' generator), in chunks of at most N/10 that add then
/// cancel (see [`time_chunked`]); the time of the `phase` ones. A chunk's entries take the ids
/// `n..n + chunk`, the same in every chunk: each chunk is cancelled (and tidied) before the
/// next, so none is pending or left in a structure by then. With a fresh id per add, the
/// heap's flag per id grew with the iterations (N + iters flags, resized in the timed adds:
/// 2,513 page faults in a sample of 8.4 million adds at 10^6).
fn churn_chunked<P: Pending>(
    state: &mut (P, SplitMix64),
    n: usize,
    iters: u64,
    phase: Phase,
) -> Duration {
    let r = range(n);
    time_chunked(
        state,
        iters,
        (n / 10).max(1) as u64,
        phase,
        |(p, rng), i| p.add(1 + rng.next() % r, n as u64 + i),
        |(p, _), k| p.cancel(k),
        |(p, _)| p.tidy(),
    )
}

/// `add/N` or `cancel/N`: one timed operation, in chunks that add then cancel (see
/// [`time_chunked`]), on a structure holding about N pending entries.
fn bench_churn<P: Pending>(c: &mut Criterion, phase: Phase, name: &str, make: fn() -> P) {
    let group = if phase == Phase::Add { "add" } else { "cancel" };
    let mut g = c.benchmark_group(group);
    for n in SIZES {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
            // Criterion runs this setup once per sample: each sample has a structure of its own.
            let mut rng = SplitMix64::new(42);
            let (p, _keys) = filled(make(), n, &mut rng);
            let mut state = (p, rng);
            // One chunk added and cancelled, untimed, so that the structure already owns the
            // memory of N + N/10 entries. Without it the first timed chunk of every sample grew
            // the fresh structure, timed as adds: at 10^6 the heap's vector reallocated from
            // 2^20 to 2^21 entries (4,297 page faults, ~10 ms a sample, against ~1.7 ms for
            // a chunk's adds after it) and the wheel's arena took 976 page faults.
            churn_chunked(&mut state, n, (n / 10).max(1) as u64, Phase::Add);
            b.iter_custom(|iters| churn_chunked(&mut state, n, iters, phase));
        });
    }
    g.finish();
}

/// The time left to an entry's deadline in the steady state of `advance-1ms-step`, where every
/// fired entry is re-added with a delay uniform in `1..=span`: P(x) ∝ span − x + 1 (an entry is
/// pending at a given instant in proportion to its delay), which the smaller of two uniform
/// draws gives (to within 1/span). The bench used to fill uniformly in `1..=R` (W5's mix, as
/// the churn benches) and re-add at delays in `1..=R`: ~33 fires a step at first, ~70 within R
/// steps, settling at ~66 (n / mean delay) after a few R. Each sample restarts from the fill, so
/// a sample's cost per step depended on how many steps it ran: samples at 10^4 (R = 300 steps)
/// ran at ~66 fires a step, those at 10^6 (R = 30,000) at ~34, and at 10^5 it rose from 37 to
/// 64 across the samples of one run.
fn stationary_delay(rng: &mut SplitMix64, span: u64) -> u64 {
    (1 + rng.next() % span).min(1 + rng.next() % span)
}

fn bench_advance<P: Pending>(c: &mut Criterion, group: &str, name: &str, make: fn() -> P) {
    let mut g = c.benchmark_group(group);
    for n in SIZES {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
            let mut rng = SplitMix64::new(42);
            // Re-adds at delays of mean ~R = range(n): ~n/R = 33 fires (and adds) per 1 ms step.
            let span = 2 * range(n);
            let mut p = make();
            let _keys: Vec<P::Key> = (0..n as u64)
                .map(|id| p.add(stationary_delay(&mut rng, span), id))
                .collect();
            let mut now = 0u64;
            let mut due = Vec::new();
            b.iter_custom(|iters| {
                let mut fired = 0u64;
                let t0 = Instant::now();
                for _ in 0..iters {
                    now += 1;
                    p.advance(now, &mut |id| due.push(id));
                    // A fired entry's id is free again (reused, the heap's flag per id stays
                    // at N; a fresh id per re-add grew it by ~33 a step, in the timed loop).
                    for id in due.drain(..) {
                        fired += 1;
                        p.add(now + 1 + rng.next() % span, id);
                    }
                }
                let spent = t0.elapsed();
                // Every fire was re-added: the step did the work its name says, whatever the
                // sample's length (a steady ~33 fires, not a ramp).
                let per_step = fired as f64 / iters as f64;
                assert!(
                    iters < 1_000 || (28.0..40.0).contains(&per_step),
                    "{per_step:.1} fires per step over {iters} steps at N = {n}"
                );
                spent
            });
        });
    }
    g.finish();
}

fn wheel_vs_heap(c: &mut Criterion) {
    let wheel = || TimingWheel::<u64>::new(1, 20, 0).expect("config");
    let concurrent = || ConcurrentWheel::<u64>::new(1, 20, 0).expect("config");
    for phase in [Phase::Add, Phase::Cancel] {
        bench_churn(c, phase, "timing-wheel", wheel);
        bench_churn(c, phase, "concurrent-wheel", concurrent);
        bench_churn(c, phase, "binary-heap", LazyHeap::default);
    }
    bench_advance(c, "advance-1ms-step", "timing-wheel", wheel);
    bench_advance(c, "advance-1ms-step", "concurrent-wheel", concurrent);
    // The shard count of a 128-CPU machine (twice the parallelism, at most 256): an advance
    // moves every shard's clock, so its cost grows with the shards.
    let concurrent_256 = || ConcurrentWheel::<u64>::with_shards(1, 20, 0, 256).expect("config");
    bench_advance(
        c,
        "advance-1ms-step",
        "concurrent-wheel-256-shards",
        concurrent_256,
    );
    bench_advance(c, "advance-1ms-step", "binary-heap", LazyHeap::default);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = wheel_vs_heap
}
criterion_main!(benches);
