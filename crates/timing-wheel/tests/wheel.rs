//! Behaviour tests of the timing wheels beyond Kafka's examples: configuration errors, the ends
//! of the `u64` time line, very deep wheels, idle catch-up, when values are released, and a
//! multi-threaded stress of the concurrent wheel.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::with_timeout;

use timing_wheel::{
    AddError, ConcurrentWheel, ConfigError, EntryHandle, TimingWheel, WheelCounts, WheelKey,
    MAX_SHARDS, MAX_WHEEL_SIZE,
};

/// splitmix64.
struct Rng(u64);

// ===== impl Rng =====

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

    /// Log-uniform in `1..=max`: every magnitude (so every level) equally often.
    fn log_uniform(&mut self, max: u64) -> u64 {
        let bits = 64 - max.leading_zeros();
        let cap = 1u64
            .checked_shl(1 + self.below(u64::from(bits)) as u32)
            .unwrap_or(u64::MAX);
        1 + self.below(cap.min(max))
    }
}

/// `d` rounded up to the tick: when the wheel hands the entry out (for deadlines below the
/// last representable tick).
fn due(d: u64, tick: u64) -> u64 {
    d.next_multiple_of(tick)
}

/// The last multiple of the tick below `u64::MAX`.
fn max_due(tick: u64) -> u64 {
    (u64::MAX - 1) - (u64::MAX - 1) % tick
}

/// Per-id drop counters shared with [`Tracked`] payloads.
#[derive(Clone)]
struct DropLog(Arc<Vec<AtomicUsize>>);

/// A payload that counts its drops in a [`DropLog`].
struct Tracked {
    id: usize,
    log: DropLog,
}

// ===== impl DropLog =====

impl DropLog {
    fn new(n: usize) -> Self {
        DropLog(Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect()))
    }

    fn track(&self, id: usize) -> Tracked {
        Tracked {
            id,
            log: self.clone(),
        }
    }

    fn drops(&self, id: usize) -> usize {
        self.0[id].load(Ordering::SeqCst)
    }

    fn all(&self) -> Vec<usize> {
        (0..self.0.len()).map(|id| self.drops(id)).collect()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.log.0[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

// ===== configuration =====

/// Every bad configuration is refused with its own error, by both wheels, and the message
/// names the offending numbers.
#[test]
fn bad_configurations_are_rejected() {
    let cases = [
        (0, 20, ConfigError::ZeroTick),
        (0, 0, ConfigError::ZeroTick),
        (1, 0, ConfigError::WheelSizeTooSmall(0)),
        (1, 1, ConfigError::WheelSizeTooSmall(1)),
        (
            1,
            MAX_WHEEL_SIZE + 1,
            ConfigError::WheelSizeTooLarge(MAX_WHEEL_SIZE + 1),
        ),
        (1, usize::MAX, ConfigError::WheelSizeTooLarge(usize::MAX)),
        (
            u64::MAX,
            2,
            ConfigError::SpanOverflow {
                tick: u64::MAX,
                wheel_size: 2,
            },
        ),
        (
            u64::MAX / 2 + 1,
            2,
            ConfigError::SpanOverflow {
                tick: u64::MAX / 2 + 1,
                wheel_size: 2,
            },
        ),
        (
            u64::MAX / 20 + 1,
            20,
            ConfigError::SpanOverflow {
                tick: u64::MAX / 20 + 1,
                wheel_size: 20,
            },
        ),
    ];
    for (tick, size, want) in cases {
        assert_eq!(TimingWheel::<()>::new(tick, size, 0).unwrap_err(), want);
        assert_eq!(
            TimingWheel::<()>::new(tick, size, u64::MAX).unwrap_err(),
            want
        );
        assert_eq!(ConcurrentWheel::<()>::new(tick, size, 0).unwrap_err(), want);
        assert_eq!(
            ConcurrentWheel::<()>::with_shards(tick, size, 0, 4).unwrap_err(),
            want
        );
        let msg = want.to_string();
        match want {
            ConfigError::ZeroTick => assert!(msg.contains("tick"), "{msg}"),
            ConfigError::WheelSizeTooSmall(n) | ConfigError::WheelSizeTooLarge(n) => {
                assert!(msg.contains(&n.to_string()), "{msg}")
            }
            ConfigError::SpanOverflow { tick, wheel_size } => {
                assert!(msg.contains(&tick.to_string()), "{msg}");
                assert!(msg.contains(&wheel_size.to_string()), "{msg}");
            }
            _ => unreachable!(),
        }
    }
    for shards in [0, MAX_SHARDS + 1, usize::MAX] {
        let err = ConcurrentWheel::<()>::with_shards(1, 20, 0, shards).unwrap_err();
        assert_eq!(err, ConfigError::BadShardCount(shards));
        assert!(err.to_string().contains(&shards.to_string()));
    }
}

/// The limits themselves are accepted: size 2 and `MAX_WHEEL_SIZE`, a first span of
/// `u64::MAX - 1` and of exactly `u64::MAX`, 1 and `MAX_SHARDS` shards (other counts rounded up
/// to a power of two).
#[test]
fn boundary_configurations_are_accepted() {
    for (tick, size) in [
        (1, 2),
        (1, MAX_WHEEL_SIZE),
        (u64::MAX / 2, 2),
        (u64::MAX / 3, 3),
    ] {
        let wheel = TimingWheel::<()>::new(tick, size, 0).unwrap();
        assert_eq!((wheel.tick(), wheel.wheel_size()), (tick, size));
        let cw = ConcurrentWheel::<()>::new(tick, size, 0).unwrap();
        assert_eq!((cw.tick(), cw.wheel_size()), (tick, size));
    }
    for (asked, got) in [
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 8),
        (MAX_SHARDS - 1, MAX_SHARDS),
        (MAX_SHARDS, MAX_SHARDS),
    ] {
        let wheel = ConcurrentWheel::<()>::with_shards(1, 20, 0, asked).unwrap();
        assert_eq!(wheel.shards(), got, "asked for {asked}");
    }
    let wheel = ConcurrentWheel::<u32>::new(1, 20, 0).unwrap();
    assert!(wheel.shards().is_power_of_two() && wheel.shards() <= MAX_SHARDS);
}

/// `ConcurrentWheel::new` takes the documented default shard count: twice the machine's
/// parallelism (as the process may use it: `taskset` lowers it), rounded up to a power of two,
/// at most `MAX_SHARDS`.
#[test]
fn default_shard_count_is_twice_the_parallelism_rounded_up() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = (2 * cpus).next_power_of_two().min(MAX_SHARDS);
    let wheel = ConcurrentWheel::<()>::new(1, 20, 0).unwrap();
    assert_eq!(wheel.shards(), want, "{cpus} CPUs");
}

/// A wheel at the size limits schedules and fires on time: size 2, `MAX_WHEEL_SIZE`, and ticks
/// so coarse that the first level's span is `u64::MAX - 1` (two levels) or exactly `u64::MAX`
/// (`tick = u64::MAX / size` for a size dividing `u64::MAX`: a single, unbounded level).
#[test]
fn wheels_at_the_configuration_limits_schedule_and_fire() {
    let configs = [
        (1, 2),
        (1, MAX_WHEEL_SIZE),
        (u64::MAX / 2, 2),
        (u64::MAX / 3, 3),
        (u64::MAX / 5, 5),
        (u64::MAX / 255, 255),
    ];
    for (tick, size) in configs {
        let at = format!("tick {tick} size {size}");
        let mut wheel = TimingWheel::new(tick, size, 0).unwrap();
        let key = wheel.add(5, ()).unwrap();
        let e = due(5, tick);
        assert!(wheel.locate(key).unwrap().expiration() <= e, "{at}");
        assert_eq!(wheel.advance(e - 1, |_| {}), 0, "{at}: fired early");
        assert_eq!(wheel.advance(e, |_| {}), 1, "{at}: not fired on time");
        wheel.add(u64::MAX, ()).unwrap();
        wheel.check_invariants();

        let cw = ConcurrentWheel::with_shards(tick, size, 0, 2).unwrap();
        let h = cw.add(5, ()).unwrap().handle;
        cw.lock().advance(e, |_| {});
        assert!(h.is_fired(), "{at}");
    }
}

/// `{:?}` of a wheel shows its shape and state, each field with its own value (tick, size, time
/// rounded down to the tick, pending entries, levels, queued buckets), for logs and failing
/// assertions: an empty or mislabelled Debug output would hide them.
#[test]
fn debug_output_shows_the_wheel_state() {
    let mut wheel = TimingWheel::new(10, 4, 25).unwrap();
    wheel.add(35, 'a').unwrap(); // level 0, due at 40
    wheel.add(100, 'b').unwrap(); // level 1 (window [0, 160)), bucket [80, 120)
    wheel.add(120, 'c').unwrap(); // level 1, bucket [120, 160)
    assert_eq!(
        format!("{wheel:?}"),
        "TimingWheel { tick: 10, wheel_size: 4, current_time: 20, len: 3, levels: 2, \
         queued_buckets: 3 }"
    );
}

/// The same for the concurrent wheel, its guard and a handle: the wheel shows its shape, shards
/// and pending entries; the guard the time, pending entries and queued buckets; the handle its
/// entry's key.
#[test]
fn concurrent_debug_output_shows_the_wheel_state() {
    let cw = ConcurrentWheel::with_shards(10, 4, 25, 2).unwrap();
    let a = cw.add_on_shard(1, 35, 'a').unwrap().handle; // level 0, due at 40
    cw.add_on_shard(0, 100, 'b').unwrap(); // level 1, bucket [80, 120)
    cw.add_on_shard(0, 120, 'c').unwrap(); // level 1, bucket [120, 160)
    assert_eq!(
        format!("{cw:?}"),
        "ConcurrentWheel { tick: 10, wheel_size: 4, shards: 2, len: 3 }"
    );
    assert_eq!(
        format!("{:?}", cw.lock()),
        "WheelGuard { current_time: 20, len: 3, queued_buckets: 3 }"
    );
    assert_eq!(
        format!("{a:?}"),
        format!("EntryHandle {{ key: {:?} }}", a.key())
    );
}

// ===== the ends of time =====

/// Deadlines up to `u64::MAX` and start times up to the end of the `u64` range never overflow
/// (tests run with overflow checks) and every entry whose deadline is representable is handed
/// out exactly when time reaches it rounded up to the tick, never before; `u64::MAX` lands in
/// the top level (64 levels for a size-2, tick-1 wheel).
#[test]
fn huge_deadlines_never_overflow_and_fire_on_time() {
    let configs = [
        (1, 2),
        (1, 20),
        (3, 3),
        (10, 64),
        (1_000, 20),
        (7, MAX_WHEEL_SIZE),
    ];
    for (tick, size) in configs {
        for start in [
            0,
            12_345,
            u64::MAX / 2 + 12_345,
            u64::MAX - 1_000_000,
            u64::MAX - 5,
        ] {
            let at = format!("tick {tick} size {size} start {start}");
            let mut wheel = TimingWheel::new(tick, size, start).unwrap();
            let current = wheel.current_time();
            assert_eq!(current, start - start % tick, "{at}");
            let top = max_due(tick);
            let candidates = [
                u64::MAX,
                u64::MAX - 1,
                top,
                top - 1,
                top - tick,
                u64::MAX / 2 + 1,
                start.saturating_add(1 << 40),
                start.saturating_add(tick + 1),
                start.saturating_add(1),
            ];
            let mut keys = Vec::new();
            for (i, d) in candidates.into_iter().enumerate() {
                match wheel.add(d, i) {
                    Ok(key) => keys.push((i, key)),
                    Err(e) => {
                        assert!(e.is_expired(), "{at}");
                        assert!(due(d.min(top), tick) <= current, "{at}: add({d}) refused");
                    }
                }
            }
            if start == 0 {
                // The last tick (`top`, candidate 2) goes to the top level; u64::MAX (candidate
                // 0) is past the last tick for every tick: never due, in no bucket.
                let key = keys[2].1;
                let b = wheel.locate(key).unwrap();
                assert_eq!(
                    b.level() + 1,
                    wheel.levels(),
                    "{at}: the last tick not in the top level"
                );
                assert_eq!(wheel.locate(keys[0].1), None, "{at}: u64::MAX is never due");
                if (tick, size) == (1, 2) {
                    assert_eq!(wheel.levels(), 64, "{at}");
                }
            }
            wheel.check_invariants();
            let mut fired = vec![0; candidates.len()];
            let mut hops = 0;
            while let Some(t) = wheel.next_expiration() {
                wheel.advance(t, |f| {
                    let d = candidates[f.value];
                    assert_eq!(f.deadline, d);
                    if d <= top {
                        assert_eq!(t, due(d, tick), "{at}: deadline {d} handed out at {t}");
                    }
                    fired[f.value] += 1;
                });
                assert_eq!(wheel.current_time(), t, "{at}");
                hops += 1;
                assert!(hops <= 64 * candidates.len(), "{at}: too many hops");
            }
            wheel.check_invariants();
            let mut want = vec![0; candidates.len()];
            for (i, key) in keys {
                if candidates[i] > top {
                    // Never due: still pending, and cancellable.
                    assert!(
                        wheel.contains(key),
                        "{at}: never-due {} gone",
                        candidates[i]
                    );
                    assert_eq!(wheel.cancel(key), Some(i), "{at}");
                    continue;
                }
                assert!(
                    !wheel.contains(key),
                    "{at}: deadline {} never fired",
                    candidates[i]
                );
                want[i] = 1;
            }
            assert_eq!(
                fired, want,
                "{at}: fire counts (refused adds must not fire)"
            );
            assert!(wheel.is_empty(), "{at}");
        }
    }
}

/// An entry scheduled at `u64::MAX` must not be handed out before the wheel's time reaches
/// `u64::MAX` (nor one at `u64::MAX - 3` with a tick of 10 before time reaches it): "never
/// before the deadline" holds at the end of the time line too.
#[test]
fn deadline_u64_max_is_never_handed_out_early() {
    for (tick, start, deadlines) in [
        (1, u64::MAX - 10, vec![u64::MAX, u64::MAX - 1]),
        (1, 0, vec![u64::MAX]),
        (
            10,
            u64::MAX - 100,
            vec![u64::MAX, u64::MAX - 3, u64::MAX - 5],
        ),
    ] {
        let mut wheel = TimingWheel::new(tick, 20, start).unwrap();
        for &d in &deadlines {
            wheel.add(d, d).unwrap();
        }
        for now in [u64::MAX - 2, u64::MAX - 1, u64::MAX] {
            let mut fired = Vec::new();
            wheel.advance(now, |f| fired.push(f.deadline));
            let time = wheel.current_time();
            for d in fired {
                assert!(
                    time >= d,
                    "tick {tick}: deadline {d} handed out at time {time} (advance({now}))"
                );
            }
        }
    }
}

/// A deadline past the last representable tick (for a tick of 1, `u64::MAX`; the last tick is
/// `u64::MAX - 1`) is accepted and means "never": it is not expired even at the end of time,
/// never handed out, cancellable, and handed back by a close. Deadlines up to the last tick are
/// handed out on time.
#[test]
fn deadline_past_the_last_tick_is_accepted_and_never_due() {
    let mut wheel = TimingWheel::new(1, 20, u64::MAX - 3).unwrap();
    assert!(wheel.add(u64::MAX - 3, "now").unwrap_err().is_expired());
    let last = wheel.add(u64::MAX - 1, "last tick").unwrap();
    let never = wheel.add(u64::MAX, "never").expect("accepted");
    let cancelled = wheel.add(u64::MAX, "cancelled").expect("accepted");
    assert_eq!(wheel.len(), 3);
    assert_eq!(wheel.cancel(cancelled), Some("cancelled"));
    let mut out = Vec::new();
    wheel.advance(u64::MAX, |f| out.push(f.value));
    assert_eq!(out, ["last tick"]);
    assert!(!wheel.contains(last) && wheel.contains(never));
    wheel.check_invariants();

    let cw = timing_wheel::ConcurrentWheel::with_shards(10, 20, 0, 2).unwrap();
    let h = cw.add(u64::MAX - 3, 'n').unwrap();
    assert!(h.queued.is_none(), "a never-due entry queues no bucket");
    let mut g = cw.lock();
    assert_eq!(
        g.advance(u64::MAX, |_| panic!("never-due entry handed out")),
        0
    );
    let mut back = Vec::new();
    g.close(|f| back.push(f.value));
    assert_eq!(back, ['n']);
    drop(g);
    assert!(h.handle.is_handed_back());
}

// ===== deep wheels =====

/// Forces a wheel of `size` (tick 1 and 3) through 21 levels: an entry at `(size^21 - 1)` ticks
/// starts in level 20 and cascades through every level, one at a time, while hundreds of
/// entries at every magnitude are handed out exactly at their deadline rounded up to the tick.
fn cascade_through_every_level(size: usize) {
    const TOP: u32 = 20;
    for tick in [1u64, 3] {
        let n = size as u64;
        let at = format!("size {size} tick {tick}");
        let mut wheel = TimingWheel::new(tick, size, 0).unwrap();
        // All digits n - 1: after each cascade the rest lies exactly one level lower.
        let probe_deadline = (n.pow(TOP + 1) - 1) * tick;
        let probe = wheel.add(probe_deadline, usize::MAX).unwrap();
        assert_eq!(wheel.locate(probe).unwrap().level(), TOP as usize, "{at}");
        assert!(
            wheel.levels() > TOP as usize,
            "{at}: {} levels",
            wheel.levels()
        );

        let mut rng = Rng(n * 1_000 + tick);
        let deadlines: Vec<u64> = (0..300)
            .map(|_| rng.log_uniform(probe_deadline + tick))
            .collect();
        for (i, &d) in deadlines.iter().enumerate() {
            wheel.add(d, i).unwrap();
        }
        let mut fired = vec![0u32; deadlines.len()];
        let mut probe_fired_at = None;
        let mut levels_seen = vec![TOP as usize];
        let mut hops = 0;
        while let Some(t) = wheel.next_expiration() {
            wheel.advance(t, |f| {
                assert_eq!(
                    t,
                    due(f.deadline, tick),
                    "{at}: deadline {} handed out at {t}",
                    f.deadline
                );
                if f.value == usize::MAX {
                    probe_fired_at = Some(t);
                } else {
                    fired[f.value] += 1;
                }
            });
            if let Some(b) = wheel.locate(probe) {
                let last = *levels_seen.last().unwrap();
                assert!(
                    b.level() <= last,
                    "{at}: probe moved up from {last} to {}",
                    b.level()
                );
                if b.level() < last {
                    levels_seen.push(b.level());
                }
            }
            hops += 1;
            assert!(hops <= 100_000, "{at}: stuck at {t}");
            if hops % 128 == 0 {
                wheel.check_invariants();
            }
        }
        assert_eq!(probe_fired_at, Some(probe_deadline), "{at}");
        let every_level: Vec<usize> = (0..=TOP as usize).rev().collect();
        assert_eq!(levels_seen, every_level, "{at}: the probe skipped a level");
        assert!(fired.iter().all(|&c| c == 1), "{at}: fire counts {fired:?}");
        assert!(wheel.is_empty(), "{at}");
        wheel.check_invariants();
    }
}

/// A size-2 wheel forced through 21 levels cascades through each and fires on time.
#[test]
fn size_2_wheel_cascades_through_every_level() {
    cascade_through_every_level(2);
}

/// A size-3 wheel forced through 21 levels cascades through each and fires on time.
#[test]
fn size_3_wheel_cascades_through_every_level() {
    cascade_through_every_level(3);
}

// ===== idle time =====

/// A wheel left idle and then advanced once to a far time hands out exactly the entries due
/// by then (each once), keeps the rest, and does so without ticking through the empty time
/// (a per-tick catch-up over 2^50 ticks would hang: the time limit only catches that); the
/// queue stays within `levels × size` buckets.
#[test]
fn idle_wheel_catches_up_in_one_advance() {
    with_timeout(Duration::from_secs(120), || {
        for (tick, size) in [(1, 20), (1, 2), (10, 64), (3, 3)] {
            let at = format!("tick {tick} size {size}");
            let mut rng = Rng(size as u64 * 31 + tick);
            let mut wheel = TimingWheel::new(tick, size, 0).unwrap();
            let deadlines: Vec<u64> = (0..2_000).map(|_| rng.log_uniform(1 << 52)).collect();
            for (i, &d) in deadlines.iter().enumerate() {
                wheel.add(d, i).unwrap();
            }
            assert!(wheel.queued_buckets() <= wheel.levels() * size, "{at}");
            let far = (1u64 << 50) + 7;
            let mut fired = vec![0u32; deadlines.len()];
            let n = wheel.advance(far, |f| {
                assert!(
                    due(f.deadline, tick) <= far,
                    "{at}: {} fired early",
                    f.deadline
                );
                fired[f.value] += 1;
            });
            assert_eq!(wheel.current_time(), far - far % tick, "{at}");
            let due_now = deadlines.iter().filter(|&&d| due(d, tick) <= far).count();
            assert_eq!(n, due_now, "{at}");
            assert!(
                due_now > 500 && due_now < deadlines.len(),
                "{at}: test needs both kinds"
            );
            for (i, &d) in deadlines.iter().enumerate() {
                let want = u32::from(due(d, tick) <= far);
                assert_eq!(fired[i], want, "{at}: deadline {d}");
            }
            assert_eq!(wheel.len(), deadlines.len() - due_now, "{at}");
            assert!(wheel.queued_buckets() <= wheel.levels() * size, "{at}");
            wheel.check_invariants();
            wheel.advance(u64::MAX, |f| fired[f.value] += 1);
            assert!(fired.iter().all(|&c| c == 1), "{at}");
        }
    });
}

/// An entry added to an idle wheel is reached in at most one bucket flush per level it starts
/// in: stepping from `next_expiration` to `next_expiration` takes at most `level + 1` steps,
/// however far away the deadline is.
#[test]
fn lone_entry_is_reached_in_one_step_per_level() {
    let mut rng = Rng(99);
    for (tick, size) in [(1, 20), (1, 2), (3, 3), (10, 64)] {
        for _ in 0..200 {
            let start = rng.next() >> rng.below(64);
            let mut wheel = TimingWheel::new(tick, size, start).unwrap();
            let d = start.saturating_add(rng.log_uniform(u64::MAX / 4));
            let Ok(key) = wheel.add(d, ()) else { continue };
            let level = wheel.locate(key).unwrap().level();
            let mut steps = 0;
            while let Some(t) = wheel.next_expiration() {
                wheel.advance(t, |_| {});
                steps += 1;
                assert!(steps <= 64, "stuck at {t}");
            }
            assert!(!wheel.contains(key));
            assert!(
                steps <= level + 1,
                "tick {tick} size {size} start {start} deadline {d}: {steps} steps from level {level}"
            );
        }
    }
}

// ===== releasing values =====

/// Cancel releases the value at once: it is handed back by `cancel` (and dropped when the
/// caller drops it), not kept until its bucket comes due; a later advance drops nothing more and
/// hands out only the entries still scheduled. The same through an `EntryHandle`; dropping a
/// handle does not cancel its entry.
#[test]
fn cancel_releases_the_value_at_once() {
    let log = DropLog::new(6);
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let a = wheel.add(5, log.track(0)).unwrap();
    let b = wheel.add(500, log.track(1)).unwrap(); // level 2: a bucket due at 400
    let _c = wheel.add(5, log.track(2)).unwrap();
    let v = wheel.cancel(b).unwrap();
    assert_eq!(v.id, 1);
    assert_eq!(log.drops(1), 0, "dropped while handed back");
    drop(v);
    assert_eq!(log.all()[..3], [0, 1, 0]);
    wheel.cancel(a);
    assert_eq!(log.all()[..3], [1, 1, 0], "value not released by cancel");
    assert_eq!(wheel.len(), 1);
    let mut out = Vec::new();
    wheel.advance(1_000, |f| out.push(f.value));
    assert_eq!(log.all()[..3], [1, 1, 0], "advance dropped a value");
    assert_eq!(out.iter().map(|t| t.id).collect::<Vec<_>>(), [2]);
    drop(out);
    assert_eq!(log.all()[..3], [1, 1, 1]);

    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let h3 = cw.add(300, log.track(3)).unwrap().handle;
    let h4 = cw.add(300, log.track(4)).unwrap().handle;
    let h5 = cw.add(300, log.track(5)).unwrap().handle;
    h3.cancel();
    assert_eq!(log.drops(3), 1, "value not released by EntryHandle::cancel");
    drop(h4);
    assert_eq!(log.drops(4), 0, "dropping a handle dropped its value");
    assert_eq!(cw.len(), 2, "dropping a handle cancelled its entry");
    let mut out = Vec::new();
    cw.lock().advance(300, |f| out.push(f.value.id));
    assert_eq!(out, [4, 5]);
    assert!(h5.is_fired());
    assert_eq!(log.all(), [1, 1, 1, 1, 1, 1]);
}

/// A cancelled entry's node is reused by later adds: a thousand add-then-cancel rounds never
/// grow the wheel's storage, while keeping the same entries grows it (so the check is live).
#[test]
fn cancelled_entries_free_their_storage() {
    let deadlines = |round: u64| (0..1_000u64).map(move |i| 1 + (i * 7 + round) % 700);
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let mut reserved = None;
    for round in 0..40 {
        let keys: Vec<_> = deadlines(round)
            .map(|d| wheel.add(d, [0u64; 4]).unwrap())
            .collect();
        for k in keys {
            assert!(wheel.cancel(k).is_some());
        }
        assert!(wheel.is_empty());
        let now = wheel.reserved_bytes();
        assert_eq!(
            *reserved.get_or_insert(now),
            now,
            "round {round}: storage grew"
        );
    }
    let mut kept = TimingWheel::new(1, 20, 0).unwrap();
    for round in 0..40 {
        for d in deadlines(round) {
            kept.add(d, [0u64; 4]).unwrap();
        }
    }
    assert!(kept.reserved_bytes() > reserved.unwrap() * 4);

    let cw = ConcurrentWheel::with_shards(1, 20, 0, 1).unwrap();
    let mut reserved = None;
    for round in 0..40 {
        let handles: Vec<_> = deadlines(round)
            .map(|d| cw.add(d, round).unwrap().handle)
            .collect();
        for h in handles {
            assert_eq!(h.cancel(), Some(round));
        }
        let now = cw.lock().reserved_bytes();
        assert_eq!(
            *reserved.get_or_insert(now),
            now,
            "round {round}: storage grew"
        );
    }
}

/// Every value leaves exactly once, whichever way: fired (dropped by the caller), cancelled,
/// refused as expired (handed back by the error), or still pending when the wheel is dropped
/// (dropped by the wheel).
#[test]
fn values_are_dropped_exactly_once_with_the_wheel() {
    const N: usize = 400;
    let log = DropLog::new(N);
    let mut wheel = TimingWheel::new(1, 20, 100).unwrap();
    let mut keys = Vec::new();
    for id in 0..N {
        let d = match id % 4 {
            0 => 50,                       // expired
            1 => 101 + id as u64,          // fires below
            _ => 1_000 + (id as u64) * 37, // cancelled or left pending
        };
        match wheel.add(d, log.track(id)) {
            Ok(k) => keys.push((id, k)),
            Err(e) => {
                assert!(e.is_expired());
                assert_eq!(log.drops(id), 0, "refused value dropped by the wheel");
                assert_eq!(e.into_inner().id, id);
            }
        }
    }
    for &(id, k) in &keys {
        if id % 4 == 2 {
            assert_eq!(wheel.cancel(k).map(|t| t.id), Some(id));
        }
    }
    let mut fired = 0;
    wheel.advance(999, |f| {
        assert_eq!(f.value.id % 4, 1);
        fired += 1;
    });
    assert_eq!(fired, N / 4);
    for id in 0..N {
        let want = usize::from(id % 4 != 3);
        assert_eq!(
            log.drops(id),
            want,
            "entry {id} before the wheel is dropped"
        );
    }
    assert_eq!(wheel.len(), N / 4);
    drop(wheel);
    assert_eq!(
        log.all(),
        vec![1; N],
        "drop counts after the wheel is dropped"
    );
}

/// The concurrent wheel too: values still pending when it is dropped are dropped once
/// (with their handles gone first, or last), handed-back values are the caller's and are not
/// dropped again by the wheel.
#[test]
fn concurrent_values_are_dropped_exactly_once() {
    const N: usize = 300;
    for handles_outlive_the_wheel in [false, true] {
        for close_first in [false, true] {
            let log = DropLog::new(N);
            let wheel = ConcurrentWheel::with_shards(1, 20, 0, 4).unwrap();
            let mut handles = Vec::new();
            for id in 0..N {
                let h = wheel
                    .add_on_shard(id, 10 + (id as u64 % 50) * 13, log.track(id))
                    .unwrap();
                handles.push(h.handle);
            }
            for h in handles.iter().step_by(3) {
                drop(h.cancel().unwrap());
            }
            wheel.lock().advance(200, |f| drop(f.value));
            let mut back = Vec::new();
            if close_first {
                wheel.lock().close(|f| back.push(f.value));
                assert!(back.iter().all(|t| log.drops(t.id) == 0));
            }
            let expected_back = back.len();
            drop(back);
            if !handles_outlive_the_wheel {
                handles.clear();
            }
            drop(wheel);
            drop(handles);
            let counts = log.all();
            assert_eq!(
                counts,
                vec![1; N],
                "close first: {close_first}, handles outlive: {handles_outlive_the_wheel}, \
                 handed back: {expected_back}"
            );
        }
    }
}

/// A concurrent wheel reports itself closed only once `close` has run: before, it is open and
/// takes adds; after, it is closed and refuses them. A guard that always said "closed" would
/// make callers treat a working wheel as shut down.
#[test]
fn concurrent_wheel_is_closed_only_after_close() {
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    assert!(!cw.lock().is_closed(), "a new wheel reported closed");
    cw.add(5, 'a').unwrap();
    assert!(
        !cw.lock().is_closed(),
        "a wheel with entries reported closed"
    );
    let mut back = Vec::new();
    cw.lock().close(|f| back.push(f.value));
    assert_eq!(back, ['a']);
    assert!(cw.lock().is_closed(), "not closed after close");
    assert!(matches!(cw.add(5, 'b'), Err(AddError::Closed('b'))));
}

/// A `WheelKey` reports its entry's state through the wheel, as an `EntryHandle` does: pending
/// with its deadline until the entry ends, then neither pending nor with a deadline, and handed
/// back only if a close took it out (not when it was cancelled or fired). `WheelKey::NONE`
/// names no entry.
#[test]
fn wheel_key_reports_its_entry_state() {
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let add = |d, v| cw.add_keyed(d, v).unwrap().handle;
    let (cancelled, fired, closed) = (add(10, 'c'), add(20, 'f'), add(300, 'h'));
    // (is_pending, deadline, is_handed_back)
    let state = |k| (cw.is_pending(k), cw.deadline(k), cw.is_handed_back(k));
    assert_eq!(state(cancelled), (true, Some(10), false));
    assert_eq!(state(fired), (true, Some(20), false));
    assert_eq!(state(closed), (true, Some(300), false));

    assert_eq!(cw.cancel(cancelled), Some('c'));
    assert_eq!(state(cancelled), (false, None, false), "cancelled");
    let mut out = Vec::new();
    cw.lock().advance(20, |f| out.push((f.key, f.value)));
    assert_eq!(out, [(fired.entry_key(), 'f')]);
    assert_eq!(state(fired), (false, None, false), "fired");
    assert_eq!(state(closed), (true, Some(300), false));
    cw.lock().close(|_| {});
    assert_eq!(state(closed), (false, None, true), "handed back");
    assert_eq!(
        state(cancelled),
        (false, None, false),
        "cancelled, after the close"
    );

    assert_eq!(state(WheelKey::NONE), (false, None, false));
    assert_eq!(cw.cancel(WheelKey::NONE), None);
}

/// A `WheelGuard` reports the whole wheel, summed over its shards: pending entries, buckets
/// queued, storage reserved (each shard's: a new shard already has a page of nodes) and what
/// happened to the entries so far.
#[test]
fn wheel_guard_reports_the_state_of_every_shard() {
    let page = ConcurrentWheel::<char>::with_shards(1, 20, 0, 1)
        .unwrap()
        .lock()
        .reserved_bytes();
    assert!(page > 1, "a one-shard wheel reserves {page} bytes");
    let cw = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    // (len, is_empty, queued_buckets, reserved_bytes)
    let state = || {
        let g = cw.lock();
        let reserved = g.reserved_bytes();
        (g.len(), g.is_empty(), g.queued_buckets(), reserved)
    };
    assert_eq!(state(), (0, true, 0, 2 * page), "new wheel");
    cw.add_on_shard(0, 5, 'a').unwrap();
    assert_eq!(state(), (1, false, 1, 2 * page), "one entry");
    cw.add_on_shard(1, 5, 'b').unwrap();
    cw.add_on_shard(1, 30, 'c').unwrap(); // level 1, a bucket due at 20
    let d = cw.add_on_shard(1, 6, 'd').unwrap().handle;
    assert_eq!(state(), (4, false, 3, 2 * page), "entries on both shards");

    d.cancel().unwrap();
    let mut guard = cw.lock();
    assert_eq!(guard.advance(5, |_| {}), 2);
    let expected = WheelCounts {
        added: 4,
        fired: 2,
        cancelled: 1,
        handed_back: 0,
    };
    assert_eq!(guard.counts(), expected, "after an advance");
    guard.close(|_| {});
    let closed = WheelCounts {
        handed_back: 1,
        ..expected
    };
    assert_eq!(guard.counts(), closed, "after a close");
    drop(guard);
    assert_eq!(state(), (0, true, 0, 2 * page), "closed");
}

// ===== concurrency =====

/// What one adder thread did.
#[derive(Default)]
struct AdderLog {
    /// Ids scheduled (add returned `Ok`).
    added: Vec<u64>,
    /// Ids whose cancel returned the value.
    cancelled: Vec<u64>,
    /// Ids whose cancel returned `None` (the entry had fired).
    lost: Vec<u64>,
    /// Ids refused as expired.
    expired: Vec<u64>,
    /// Handles never cancelled.
    live: Vec<(u64, EntryHandle<u64>)>,
}

/// Decrements a counter when dropped (also when its thread panics).
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The advancer's progress, which the adders wait on now and then so that adds, cancels and
/// fires really interleave (without it the adders can finish before the advancer runs).
struct Progress {
    /// The wheel's time, published after each advance.
    clock: AtomicU64,
    /// Advances done.
    rounds: AtomicU64,
    /// Adders still running.
    adders: AtomicUsize,
    /// False once the advancer has stopped (normally or by a panic).
    advancing: AtomicBool,
}

/// Clears [`Progress::advancing`] when dropped (also when its thread panics).
struct StopAdvancing<'a>(&'a Progress);

impl Drop for StopAdvancing<'_> {
    fn drop(&mut self) {
        self.0.advancing.store(false, Ordering::SeqCst);
    }
}

fn adder(t: u64, ops: u64, wheel: &ConcurrentWheel<u64>, progress: &Progress) -> AdderLog {
    let clock = &progress.clock;
    let mut rng = Rng(t + 1);
    let mut log = AdderLog::default();
    let mut live: Vec<(u64, EntryHandle<u64>)> = Vec::new();
    let mut seen = 0;
    for i in 0..ops {
        if i % 64 == 0 {
            while progress.rounds.load(Ordering::SeqCst) == seen
                && progress.advancing.load(Ordering::SeqCst)
            {
                std::thread::yield_now();
            }
            seen = progress.rounds.load(Ordering::SeqCst);
        }
        if live.is_empty() || rng.below(100) < 55 {
            let id = (t << 32) | i;
            let now = clock.load(Ordering::SeqCst);
            let (d, past) = match rng.below(100) {
                // The last tick (u64::MAX is past it: never due, see wheel.rs's edge tests).
                0 => (u64::MAX - 1, false),
                1 | 2 => (now.saturating_sub(rng.below(10)), true),
                3..=6 => (now + 1 + rng.below(1 << 20), false),
                _ => (now + 1 + rng.below(400), false),
            };
            match wheel.add(d, id) {
                Ok(added) => {
                    assert!(!past, "add({d}) accepted though the clock was at {now}");
                    log.added.push(id);
                    live.push((id, added.handle));
                }
                Err(AddError::Expired(v)) => {
                    assert_eq!(v, id);
                    log.expired.push(id);
                }
                Err(AddError::Closed(_)) => panic!("closed"),
            }
        } else {
            let (id, h) = live.swap_remove(rng.below(live.len() as u64) as usize);
            match h.cancel() {
                Some(v) => {
                    assert_eq!(v, id, "cancel handed back another value");
                    assert!(h.is_cancelled() && !h.is_fired(), "entry {id}");
                    log.cancelled.push(id);
                }
                None => {
                    assert!(
                        h.is_fired() && !h.is_cancelled(),
                        "cancel of live {id} lost"
                    );
                    log.lost.push(id);
                }
            }
        }
    }
    log.live = live;
    log
}

/// Four threads add and cancel 50 000 times each (random deadlines, a few already past, a few
/// huge) while a fifth repeatedly takes `lock()` and advances time; then time is advanced past
/// everything. Every scheduled entry either fired exactly once (never before its deadline) or
/// was cancelled (cancel returned its value), never both and never neither; refused adds never
/// fire; handles agree; the wheel ends empty with its invariants intact.
#[test]
fn concurrent_adds_cancels_and_advances_account_for_every_entry() {
    const ADDERS: u64 = 4;
    const OPS: u64 = 50_000;
    with_timeout(Duration::from_secs(300), || {
        let wheel = ConcurrentWheel::<u64>::with_shards(1, 20, 0, 4).unwrap();
        let progress = Progress {
            clock: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            adders: AtomicUsize::new(ADDERS as usize),
            advancing: AtomicBool::new(true),
        };
        let (logs, mut fired) = std::thread::scope(|s| {
            let adders: Vec<_> = (0..ADDERS)
                .map(|t| {
                    let (wheel, progress) = (&wheel, &progress);
                    s.spawn(move || {
                        let _leaving = Leaving(&progress.adders);
                        adder(t, OPS, wheel, progress)
                    })
                })
                .collect();
            let advancer = s.spawn(|| {
                let _stop = StopAdvancing(&progress);
                let mut rng = Rng(77);
                let mut fired = Vec::new();
                let mut now = 0u64;
                let mut rounds = 0u64;
                while progress.adders.load(Ordering::SeqCst) > 0 {
                    now += rng.below(16);
                    let mut guard = wheel.lock();
                    guard.advance(now, |f| {
                        assert!(f.deadline <= now, "deadline {} fired at {now}", f.deadline);
                        fired.push(f.value);
                    });
                    assert_eq!(guard.current_time(), now);
                    if rounds % 512 == 0 {
                        guard.check_invariants();
                    }
                    progress.clock.store(now, Ordering::SeqCst);
                    drop(guard);
                    rounds += 1;
                    progress.rounds.store(rounds, Ordering::SeqCst);
                    std::thread::yield_now();
                }
                fired
            });
            let logs: Vec<AdderLog> = adders.into_iter().map(|h| h.join().unwrap()).collect();
            (logs, advancer.join().unwrap())
        });

        let fired_live = fired.len();
        let mut guard = wheel.lock();
        guard.check_invariants();
        guard.advance(u64::MAX, |f| fired.push(f.value));
        guard.check_invariants();
        assert!(guard.is_empty());
        drop(guard);
        assert!(wheel.is_empty());

        // Per id: 0 = never scheduled, then counts of fires and cancels.
        let index = |id: u64| ((id >> 32) * OPS + (id & 0xFFFF_FFFF)) as usize;
        let slots = (ADDERS * OPS) as usize;
        let mut scheduled = vec![false; slots];
        let mut fires = vec![0u32; slots];
        let mut cancels = vec![0u32; slots];
        for log in &logs {
            for &id in &log.added {
                scheduled[index(id)] = true;
            }
            for &id in &log.cancelled {
                cancels[index(id)] += 1;
            }
        }
        for &id in &fired {
            assert!(
                scheduled[index(id)],
                "entry {id:#x} fired but was never scheduled"
            );
            fires[index(id)] += 1;
        }
        for i in 0..slots {
            if scheduled[i] {
                assert_eq!(
                    fires[i] + cancels[i],
                    1,
                    "entry {i}: {} fires, {} cancels",
                    fires[i],
                    cancels[i]
                );
            }
        }
        for log in &logs {
            for &id in &log.lost {
                assert_eq!(
                    fires[index(id)],
                    1,
                    "cancel of {id:#x} lost but it never fired"
                );
            }
            for &id in &log.expired {
                assert!(!scheduled[index(id)] && fires[index(id)] == 0);
            }
            for (id, h) in &log.live {
                assert!(
                    h.is_fired() && !h.is_cancelled() && !h.is_handed_back(),
                    "{id:#x}"
                );
                assert_eq!(fires[index(*id)], 1);
            }
        }
        let cancelled: usize = logs.iter().map(|l| l.cancelled.len()).sum();
        let added: usize = logs.iter().map(|l| l.added.len()).sum();
        assert_eq!(fired.len() + cancelled, added);
        let lost: usize = logs.iter().map(|l| l.lost.len()).sum();
        assert!(
            added > 80_000 && cancelled + lost > 50_000,
            "added {added}, cancels {cancelled} + {lost}"
        );
        eprintln!(
            "added {added}, cancelled {cancelled}, cancel lost to a fire {lost}, fired {} \
             ({fired_live} while adders ran)",
            fired.len()
        );
    });
}
