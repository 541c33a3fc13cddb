//! Criterion: `SystemTimer` add, cancel and add-then-cancel (reaper and executor running on the
//! system clock), against tokio-util's `DelayQueue` in the same groups, at about 10^5 pending
//! tasks with W1's delays (1..=30000 ms).
#![allow(missing_docs, clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kafka_timer::churn::{ChurnTarget, DelayQueueTarget, TimerTarget, TypedTimerTarget};
use kafka_timer::rng::SplitMix64;

const PENDING: usize = 100_000;
const CHUNK: u64 = 10_000;

fn prefill<C: ChurnTarget>(t: &mut C, rng: &mut SplitMix64) -> Vec<C::Handle> {
    (0..PENDING as u64)
        .map(|i| t.add(1 + rng.next() % 30_000, i))
        .collect()
}

fn add<C: ChurnTarget>(c: &mut Criterion, name: &str, make: fn() -> C) {
    let mut g = c.benchmark_group("timer-add");
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |b| {
        let mut rng = SplitMix64::new(42);
        let mut t = make();
        let _keep = prefill(&mut t, &mut rng);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let chunk = left.min(CHUNK);
                let mut hs = Vec::with_capacity(chunk as usize);
                let t0 = Instant::now();
                for i in 0..chunk {
                    hs.push(t.add(1 + rng.next() % 30_000, i));
                }
                total += t0.elapsed();
                for h in &hs {
                    t.cancel(h);
                }
                left -= chunk;
            }
            total
        });
    });
    g.finish();
}

fn cancel<C: ChurnTarget>(c: &mut Criterion, name: &str, make: fn() -> C) {
    let mut g = c.benchmark_group("timer-cancel");
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |b| {
        let mut rng = SplitMix64::new(42);
        let mut t = make();
        let _keep = prefill(&mut t, &mut rng);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let chunk = left.min(CHUNK);
                let hs: Vec<_> = (0..chunk)
                    .map(|i| t.add(1 + rng.next() % 30_000, i))
                    .collect();
                let t0 = Instant::now();
                for h in &hs {
                    black_box(t.cancel(h));
                }
                total += t0.elapsed();
                left -= chunk;
            }
            total
        });
    });
    g.finish();
}

fn add_then_cancel<C: ChurnTarget>(c: &mut Criterion, name: &str, make: fn() -> C) {
    let mut g = c.benchmark_group("timer-add-then-cancel");
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |b| {
        let mut rng = SplitMix64::new(42);
        let mut t = make();
        let _keep = prefill(&mut t, &mut rng);
        let mut i = 0;
        b.iter(|| {
            i += 1;
            let h = t.add(1 + rng.next() % 30_000, i);
            black_box(t.cancel(&h))
        });
    });
    g.finish();
}

fn timers(c: &mut Criterion) {
    add(c, "system-timer", TimerTarget::new);
    add(c, "system-timer-typed", TypedTimerTarget::new);
    add(c, "delay-queue", DelayQueueTarget::new);
    cancel(c, "system-timer", TimerTarget::new);
    cancel(c, "system-timer-typed", TypedTimerTarget::new);
    cancel(c, "delay-queue", DelayQueueTarget::new);
    add_then_cancel(c, "system-timer", TimerTarget::new);
    add_then_cancel(c, "system-timer-typed", TypedTimerTarget::new);
    add_then_cancel(c, "delay-queue", DelayQueueTarget::new);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = timers
}
criterion_main!(benches);
