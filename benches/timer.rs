//! Criterion: `SystemTimer` add, cancel and add-then-cancel (reaper and executor running on the
//! system clock), against tokio-util's `DelayQueue` in the same groups, at about 10^5 pending
//! tasks with W1's delays (1..=30000 ms). Adds and cancels are timed in chunks of 10^4 that add
//! then cancel (see `time_chunked`): a timed cancel removes a task added at most 10^4 adds
//! before it, in add order (a recent task's cancel, not an arbitrary pending one's).
#![allow(missing_docs, clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kafka_timer::churn::{
    time_chunked, ChurnTarget, DelayQueueTarget, KeyedTimerTarget, Phase, TimerTarget,
    TypedTimerTarget,
};
use kafka_timer::rng::SplitMix64;

const PENDING: usize = 100_000;
const CHUNK: u64 = 10_000;

fn prefill<C: ChurnTarget>(t: &mut C, rng: &mut SplitMix64) -> Vec<C::Handle> {
    (0..PENDING as u64)
        .map(|i| t.add(1 + rng.next() % 30_000, i))
        .collect()
}

/// `timer-add` or `timer-cancel`: one timed operation, in chunks that add then cancel (see
/// [`time_chunked`]), with about 10^5 tasks pending.
fn churn<C: ChurnTarget>(c: &mut Criterion, phase: Phase, name: &str, make: fn() -> C) {
    let group = if phase == Phase::Add {
        "timer-add"
    } else {
        "timer-cancel"
    };
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |b| {
        let mut rng = SplitMix64::new(42);
        let mut t = make();
        let _keep = prefill(&mut t, &mut rng);
        let mut state = (t, rng);
        b.iter_custom(|iters| {
            time_chunked(
                &mut state,
                iters,
                CHUNK,
                phase,
                |(t, rng), i| t.add(1 + rng.next() % 30_000, i),
                |(t, _), h| {
                    black_box(t.cancel(h));
                },
                |_| {},
            )
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
    for phase in [Phase::Add, Phase::Cancel] {
        churn(c, phase, "system-timer", TimerTarget::new);
        churn(c, phase, "system-timer-typed", TypedTimerTarget::new);
        churn(c, phase, "system-timer-keyed", KeyedTimerTarget::new);
        churn(c, phase, "delay-queue", DelayQueueTarget::new);
    }
    add_then_cancel(c, "system-timer", TimerTarget::new);
    add_then_cancel(c, "system-timer-typed", TypedTimerTarget::new);
    add_then_cancel(c, "system-timer-keyed", KeyedTimerTarget::new);
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
