//! Behaviour of Kafka's hierarchical timing wheel, ported to this crate.
//!
//! Provenance: ports the behaviour of Apache Kafka's `TimingWheel` and `TimerTaskList`
//! (`server-common/src/main/java/org/apache/kafka/server/util/timer/`, formerly
//! `core/src/main/scala/kafka/utils/timer/`), as described in `TimingWheel`'s javadoc (the
//! `u = 1, n = 3` bucket tables), in its `add` / `advanceClock` code (the "already expired"
//! test, the absolute virtual id, `setExpiration` queueing a bucket once per incarnation) and
//! in the cascade walk-throughs for Kafka's defaults (tick 1 ms, wheel size 20): a 28 ms task
//! and a 450 ms task cascading down the overflow wheels. `TimerTaskListTest.testAll`'s "a
//! re-added task is scheduled once" becomes cancel-and-add here (this crate has no task ↔ entry
//! back-pointer). See also `shared/reference/kafka-semantics.md` §1.2–1.5 and §7.
//!
//! Kafka numbers the wheels from 1 (level 1 is the finest); this crate numbers levels from 0,
//! so Kafka's "level 2" is `Bucket::level() == 1` here.
#![cfg(not(loom))]

use timing_wheel::{AddError, ConcurrentWheel, EntryKey, TimingWheel};

/// `(level, slot, expiration)` of the bucket holding `key`. `locate` finds the level by walking
/// the lists but derives slot and expiration from the deadline, so this also runs the invariant
/// check, which verifies the slot of the list the entry is really in.
fn bucket_of<T>(wheel: &TimingWheel<T>, key: EntryKey) -> (usize, usize, u64) {
    wheel.check_invariants();
    let b = wheel
        .locate(key)
        .unwrap_or_else(|| panic!("{key:?} is not in any bucket"));
    (b.level(), b.slot(), b.expiration())
}

/// Advances to `now` and returns the values handed out, asserting the wheel's time afterwards.
fn advance<T>(wheel: &mut TimingWheel<T>, now: u64) -> Vec<T> {
    let mut out = Vec::new();
    let n = wheel.advance(now, |f| out.push(f.value));
    assert_eq!(n, out.len(), "advance({now}) miscounted what it handed out");
    assert_eq!(wheel.current_time(), now, "wheel time after advance({now})");
    out
}

/// Kafka's 28 ms example (tick 1 ms, 20 buckets): added at time 0 the task overflows into
/// level 1 (Kafka's level 2) slot 1, whose bucket expires at 20; at 20 it is re-inserted into
/// level 0 slot 8 (expiration 28), and it fires at 28, not a millisecond earlier.
#[test]
fn task_28ms_cascades_from_level_1_to_level_0() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let key = wheel.add(28, "28 ms").unwrap();
    assert_eq!(bucket_of(&wheel, key), (1, 1, 20));
    assert_eq!(wheel.levels(), 2);
    assert_eq!(wheel.next_expiration(), Some(20));

    assert!(advance(&mut wheel, 19).is_empty());
    assert_eq!(
        bucket_of(&wheel, key),
        (1, 1, 20),
        "moved before its bucket was due"
    );
    assert_eq!(wheel.next_expiration(), Some(20));

    assert!(advance(&mut wheel, 20).is_empty(), "fired 8 ms early");
    assert_eq!(
        bucket_of(&wheel, key),
        (0, 8, 28),
        "not re-inserted into level 0"
    );
    assert_eq!(wheel.next_expiration(), Some(28));
    assert_eq!(wheel.len(), 1);

    assert!(advance(&mut wheel, 27).is_empty());
    assert_eq!(bucket_of(&wheel, key), (0, 8, 28));

    assert_eq!(advance(&mut wheel, 28), ["28 ms"]);
    assert!(wheel.locate(key).is_none());
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
    wheel.check_invariants();
}

/// Kafka's 450 ms example: level 2 slot 1 (expiration 400) → at 400 into level 1 slot 2
/// (expiration 440) → at 440 into level 0 slot 10 (expiration 450) → fires at 450.
#[test]
fn task_450ms_cascades_through_three_levels() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let key = wheel.add(450, "450 ms").unwrap();
    assert_eq!(bucket_of(&wheel, key), (2, 1, 400));
    assert_eq!(wheel.levels(), 3, "overflow levels are created on demand");
    assert_eq!(wheel.next_expiration(), Some(400));

    let steps = [
        // (advance to, bucket afterwards, next expiration)
        (399, (2, 1, 400)),
        (400, (1, 2, 440)),
        (439, (1, 2, 440)),
        (440, (0, 10, 450)),
        (449, (0, 10, 450)),
    ];
    for (now, bucket) in steps {
        assert!(advance(&mut wheel, now).is_empty(), "fired early at {now}");
        assert_eq!(bucket_of(&wheel, key), bucket, "bucket at time {now}");
        assert_eq!(
            wheel.next_expiration(),
            Some(bucket.2),
            "next expiration at {now}"
        );
        wheel.check_invariants();
    }
    assert_eq!(advance(&mut wheel, 450), ["450 ms"]);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
}

/// The same two walk-throughs on the concurrent wheel: `Added::queued` reports the bucket
/// Kafka's `add` would queue, and `next_expiration` follows the cascade.
#[test]
fn concurrent_wheel_cascades_like_kafka() {
    let wheel = ConcurrentWheel::with_shards(1, 20, 0, 2).unwrap();
    let a = wheel.add_on_shard(0, 28, 28u64).unwrap();
    let b = wheel.add_on_shard(1, 450, 450u64).unwrap();
    let qa = a.queued.expect("first entry of a bucket queues it");
    assert_eq!((qa.level(), qa.slot(), qa.expiration()), (1, 1, 20));
    let qb = b.queued.expect("first entry of a bucket queues it");
    assert_eq!((qb.level(), qb.slot(), qb.expiration()), (2, 1, 400));
    assert!(a.earliest, "the only bucket is the earliest");
    assert!(!b.earliest, "400 is after 20");

    // (advance to, expected next expiration afterwards, values fired)
    let steps: [(u64, Option<u64>, &[u64]); 9] = [
        (19, Some(20), &[]),
        (20, Some(28), &[]),
        (27, Some(28), &[]),
        (28, Some(400), &[28]),
        (399, Some(400), &[]),
        (400, Some(440), &[]),
        (440, Some(450), &[]),
        (449, Some(450), &[]),
        (450, None, &[450]),
    ];
    for (now, next, values) in steps {
        let mut guard = wheel.lock();
        let mut out = Vec::new();
        guard.advance(now, |f| out.push(f.value));
        assert_eq!(out, values, "fired at {now}");
        assert_eq!(guard.current_time(), now);
        assert_eq!(guard.next_expiration(), next, "next expiration at {now}");
        guard.check_invariants();
    }
    assert!(a.handle.is_fired() && b.handle.is_fired());
    assert!(wheel.is_empty());
}

/// One of the javadoc's tables: per Kafka level (1, 2, 3), its three bucket ranges
/// `[lo, hi]`, relative to the start time `c`.
type Levels = [[(u64, u64); 3]; 3];

/// The javadoc's example, `u = 1`, `n = 3`, start `c`: at each of the times `c .. c+3` an
/// entry goes to the first level whose buckets cover its deadline, in the bucket whose range
/// holds it, and that bucket's expiration is the range's start (levels 2 and 3 keep their
/// clocks at `c` until time has moved a whole coarse tick).
#[test]
fn javadoc_example_u1_n3_bucket_ranges() {
    // Kafka's tables, relative to c: per time, per Kafka level, the bucket ranges [lo, hi].
    let tables: [(u64, Levels); 4] = [
        (
            0,
            [
                [(0, 0), (1, 1), (2, 2)],
                [(0, 2), (3, 5), (6, 8)],
                [(0, 8), (9, 17), (18, 26)],
            ],
        ),
        (
            1,
            [
                [(1, 1), (2, 2), (3, 3)],
                [(0, 2), (3, 5), (6, 8)],
                [(0, 8), (9, 17), (18, 26)],
            ],
        ),
        (
            2,
            [
                [(2, 2), (3, 3), (4, 4)],
                [(0, 2), (3, 5), (6, 8)],
                [(0, 8), (9, 17), (18, 26)],
            ],
        ),
        (
            3,
            [
                [(3, 3), (4, 4), (5, 5)],
                [(3, 5), (6, 8), (9, 11)],
                [(0, 8), (9, 17), (18, 26)],
            ],
        ),
    ];
    // c must be a multiple of 27 for the tables (which start every level's slots at c).
    for c in [0u64, 27, 27 * 1_000_003] {
        for (dt, levels) in tables {
            let now = c + dt;
            for rel in dt + 1..=26 {
                let deadline = c + rel;
                // Kafka: the first level whose buckets cover the deadline, and its bucket.
                let (kafka_level, lo) = levels
                    .iter()
                    .enumerate()
                    .find_map(|(l, ranges)| {
                        let &(lo, _) = ranges.iter().find(|&&(lo, hi)| lo <= rel && rel <= hi)?;
                        Some((l + 1, lo))
                    })
                    .unwrap();
                let mut wheel = TimingWheel::new(1, 3, c).unwrap();
                assert!(advance(&mut wheel, now).is_empty());
                let key = wheel.add(deadline, ()).unwrap();
                let (level, slot, expiration) = bucket_of(&wheel, key);
                assert_eq!(
                    (level + 1, expiration),
                    (kafka_level, c + lo),
                    "c = {c}, time c+{dt}, deadline c+{rel}"
                );
                let width = 3u64.pow(level as u32);
                assert_eq!(slot as u64, (expiration / width) % 3);
                // `locate` derives the slot from the deadline; the invariant check verifies the
                // list the entry is really linked into.
                wheel.check_invariants();
            }
        }
    }
}

/// Kafka's "already expired" rule with a 1 ms tick: a deadline equal to the current time (or
/// before it) is refused as expired and the value handed back; `current + 1` gets a bucket
/// (level 0, its own slot, expiring at the deadline).
#[test]
fn deadline_equal_to_current_time_is_expired() {
    for start in [0u64, 100, 1 << 40] {
        let mut wheel = TimingWheel::new(1, 20, start).unwrap();
        let err = wheel.add(start, "now").unwrap_err();
        assert!(err.is_expired());
        assert_eq!(err.into_inner(), "now");
        if start > 0 {
            assert!(matches!(
                wheel.add(start - 1, "past"),
                Err(AddError::Expired("past"))
            ));
            assert!(matches!(
                wheel.add(0, "zero"),
                Err(AddError::Expired("zero"))
            ));
        }
        assert!(wheel.is_empty());
        assert_eq!(
            wheel.queued_buckets(),
            0,
            "an expired add must not queue a bucket"
        );

        let key = wheel.add(start + 1, "next").unwrap();
        let slot = ((start + 1) % 20) as usize;
        assert_eq!(bucket_of(&wheel, key), (0, slot, start + 1));
        // The last deadline level 0 takes, and the first one it does not.
        let last = wheel.add(start + 19, "last").unwrap();
        assert_eq!(bucket_of(&wheel, last).0, 0);
        let over = wheel.add(start + 20, "over").unwrap();
        assert_eq!(bucket_of(&wheel, over).0, 1);
        wheel.check_invariants();

        // After time moves, the same rule applies at the new time.
        assert_eq!(advance(&mut wheel, start + 1), ["next"]);
        assert!(wheel.add(start + 1, "again").unwrap_err().is_expired());
        assert!(wheel.add(start + 2, "again").is_ok());
    }
}

/// With a coarser tick this crate rounds deadlines up to the tick instead of using Kafka's
/// `expiration < current + tick` test: whole-tick deadlines behave exactly as in Kafka, and a
/// deadline inside the current tick is scheduled for the next tick rather than run early.
#[test]
fn coarse_tick_rounds_deadlines_up_instead_of_expiring_early() {
    let mut wheel = TimingWheel::new(10, 4, 25).unwrap();
    assert_eq!(
        wheel.current_time(),
        20,
        "start rounded down to the tick (Kafka's startMs)"
    );
    // Whole ticks: Kafka's rule.
    assert!(wheel.add(20, 'a').unwrap_err().is_expired());
    assert!(wheel.add(10, 'a').unwrap_err().is_expired());
    let k30 = wheel.add(30, 'b').unwrap();
    assert_eq!(bucket_of(&wheel, k30), (0, 3, 30));
    // Kafka would call 21 and 29 expired (< 20 + 10) and run them at 20; here they wait for 30.
    let k21 = wheel.add(21, 'c').unwrap();
    let k29 = wheel.add(29, 'd').unwrap();
    assert_eq!(bucket_of(&wheel, k21), (0, 3, 30));
    assert_eq!(bucket_of(&wheel, k29), (0, 3, 30));
    assert_eq!(
        wheel.deadline(k21),
        Some(21),
        "the deadline itself is kept, unrounded"
    );

    let mut out = Vec::new();
    wheel.advance(29, |f| out.push(f.value));
    assert!(out.is_empty(), "handed out before the deadline: {out:?}");
    assert_eq!(wheel.current_time(), 20);
    wheel.advance(30, |f| out.push(f.value));
    assert_eq!(out, ['b', 'c', 'd']);
    assert_eq!(wheel.current_time(), 30);
}

/// Kafka's `advanceClock` ignores a time that is not at least a tick ahead, and the wheel's
/// time is always rounded down to the tick and never goes back.
#[test]
fn advance_to_an_earlier_time_is_ignored() {
    let mut wheel = TimingWheel::new(10, 20, 1_000).unwrap();
    let key = wheel.add(1_050, ()).unwrap();
    assert_eq!(wheel.advance(1_009, |_| {}), 0);
    assert_eq!(wheel.current_time(), 1_000);
    assert_eq!(wheel.advance(1_047, |_| {}), 0);
    assert_eq!(wheel.current_time(), 1_040);
    assert_eq!(wheel.advance(500, |_| {}), 0);
    assert_eq!(wheel.current_time(), 1_040, "time went back");
    assert_eq!(wheel.advance(0, |_| {}), 0);
    assert_eq!(wheel.current_time(), 1_040, "time went back");
    assert!(wheel.contains(key));
    assert_eq!(wheel.advance(1_050, |_| {}), 1);
    assert_eq!(wheel.current_time(), 1_050);
}

/// Kafka picks the bucket by the **absolute** virtual id, `⌊deadline / tick_k⌋ mod n`, not by
/// the offset from the current time, and the bucket expires at `⌊deadline / tick_k⌋ · tick_k`.
#[test]
fn slot_is_the_absolute_virtual_id() {
    // Start 7 (level 0's window is [7, 27)): deadline 8 is slot 8, not slot 1.
    let mut wheel = TimingWheel::new(1, 20, 7).unwrap();
    let k8 = wheel.add(8, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k8), (0, 8, 8));
    let k25 = wheel.add(25, ()).unwrap();
    assert_eq!(
        bucket_of(&wheel, k25),
        (0, 5, 25),
        "wraps to slot 25 mod 20"
    );
    let k26 = wheel.add(26, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k26), (0, 6, 26));
    let k27 = wheel.add(27, ()).unwrap();
    assert_eq!(
        bucket_of(&wheel, k27),
        (1, 1, 20),
        "first deadline past level 0's window"
    );

    // Start 1_000_063: level 1's window starts at 1_000_060 (its slot 3); deadline 1_000_130
    // is virtual id 50_006 → slot 6, expiration 1_000_120 (an offset-based slot would be 3).
    let mut wheel = TimingWheel::new(1, 20, 1_000_063).unwrap();
    let k = wheel.add(1_000_130, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k), (1, 6, 1_000_120));
    let k = wheel.add(1_000_070, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k), (0, 10, 1_000_070));
    // Level 2 (ticks of 400): 1_000_500 → id 2_501 → slot 1, expiration 1_000_400.
    let k = wheel.add(1_000_500, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k), (2, 1, 1_000_400));
    wheel.check_invariants();

    // Tick 10: virtual ids count ticks, so 1_230 is id 123 → slot 3 of 20.
    let mut wheel = TimingWheel::new(10, 20, 1_100).unwrap();
    let k = wheel.add(1_230, ()).unwrap();
    assert_eq!(bucket_of(&wheel, k), (0, 3, 1_230));
}

/// Kafka queues a bucket only when `setExpiration` changes it: a second entry joining a queued
/// bucket does not queue it again, a different bucket does, and once the bucket has been
/// flushed the slot's next incarnation (a new expiration) is queued afresh.
#[test]
fn bucket_is_queued_once_per_incarnation() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    assert_eq!(wheel.queued_buckets(), 0);
    wheel.add(10, 'a').unwrap();
    assert_eq!(wheel.queued_buckets(), 1);
    wheel.add(10, 'b').unwrap();
    assert_eq!(wheel.queued_buckets(), 1, "same bucket queued twice");
    wheel.add(11, 'c').unwrap();
    assert_eq!(wheel.queued_buckets(), 2);
    wheel.add(30, 'd').unwrap(); // level 1 slot 1, expiration 20
    wheel.add(35, 'e').unwrap(); // the same level-1 bucket
    wheel.add(39, 'f').unwrap(); // the same level-1 bucket
    assert_eq!(
        wheel.queued_buckets(),
        3,
        "a level-1 bucket queued more than once"
    );
    wheel.check_invariants();

    // At 20: buckets 10, 11 and the level-1 bucket are flushed; 30 and 35, 39 cascade into level 0
    // slots 10 (a new incarnation: expiration 30), 15 and 19.
    let mut out = Vec::new();
    wheel.advance(20, |f| out.push(f.value));
    assert_eq!(out, ['a', 'b', 'c']);
    assert_eq!(wheel.queued_buckets(), 3);
    assert_eq!(wheel.next_expiration(), Some(30));
    wheel.add(30, 'g').unwrap();
    assert_eq!(
        wheel.queued_buckets(),
        3,
        "joined the cascaded bucket 30: no new queue item"
    );
    let h = wheel.add(50, 'h').unwrap(); // level 1 is now [20, 420): slot 2, expiration 40
    assert_eq!(bucket_of(&wheel, h), (1, 2, 40));
    assert_eq!(wheel.queued_buckets(), 4);
    wheel.check_invariants();

    wheel.advance(40, |f| out.push(f.value));
    assert_eq!(out, ['a', 'b', 'c', 'd', 'g', 'e', 'f']);
    // 'h' cascaded at 40 into level-0 slot 10 again: that slot's next incarnation (expiration
    // 50, after 30), queued afresh.
    assert_eq!(bucket_of(&wheel, h), (0, 10, 50));
    assert_eq!(wheel.queued_buckets(), 1);
    assert_eq!(wheel.next_expiration(), Some(50));
    wheel.check_invariants();
}

/// On the concurrent wheel `Added::queued` is `Some` exactly for the add that queued the
/// bucket, whichever shard the later entries land on; `earliest` says whether it became the
/// queue's head; after the bucket has been flushed the slot is queued again.
#[test]
fn concurrent_add_reports_queued_only_for_the_first_entry_of_a_bucket() {
    let wheel = ConcurrentWheel::with_shards(1, 20, 0, 4).unwrap();
    let first = wheel.add_on_shard(0, 10, 'a').unwrap();
    let b = first.queued.expect("first entry queues its bucket");
    assert_eq!((b.level(), b.slot(), b.expiration()), (0, 10, 10));
    assert!(first.earliest);
    for shard in 0..4 {
        let again = wheel.add_on_shard(shard, 10, 'b').unwrap();
        assert!(
            again.queued.is_none(),
            "bucket queued again by shard {shard}"
        );
        assert!(!again.earliest);
    }
    assert_eq!(wheel.queued_buckets(), 1);

    let later = wheel.add_on_shard(1, 15, 'c').unwrap();
    assert!(
        later.queued.is_some() && !later.earliest,
        "15 is after the head 10"
    );
    let sooner = wheel.add_on_shard(2, 5, 'd').unwrap();
    assert!(
        sooner.queued.is_some() && sooner.earliest,
        "5 is the new head"
    );
    assert_eq!(wheel.queued_buckets(), 3);
    assert_eq!(wheel.next_expiration(), Some(5));

    // Two entries of one level-1 bucket on two shards: one queue item.
    let x = wheel.add_on_shard(0, 30, 'e').unwrap();
    let y = wheel.add_on_shard(3, 39, 'f').unwrap();
    assert!(x.queued.is_some() && y.queued.is_none());
    assert_eq!(wheel.queued_buckets(), 4);
    wheel.lock().check_invariants();

    let mut fired = 0;
    wheel.lock().advance(10, |_| fired += 1);
    assert_eq!(fired, 6);
    // A bucket that is not queued yet is queued by the add that creates it.
    let again = wheel.add_on_shard(2, 50, 'g').unwrap();
    let b = again.queued.expect("level-1 slot 2 not queued yet");
    assert_eq!((b.level(), b.slot(), b.expiration()), (1, 2, 40));
    // At 20 the level-1 bucket cascades 'e' into level-0 slot 10, whose previous incarnation
    // (expiration 10) was flushed: the cascade queues it under 30, so an add joining it does
    // not, while an add to a fresh slot does.
    wheel.lock().advance(20, |_| fired += 1);
    assert_eq!(fired, 7);
    let z = wheel.add_on_shard(1, 30, 'h').unwrap();
    assert!(
        z.queued.is_none(),
        "the cascade of 'e' already queued bucket 30"
    );
    let w = wheel.add_on_shard(1, 31, 'i').unwrap();
    assert!(w.queued.is_some());
    wheel.lock().check_invariants();
}

/// Kafka flushes a bucket whose tasks were all cancelled (its expiration stays queued): the
/// bucket keeps its place in the queue, `next_expiration` still reports it, flushing it hands
/// out nothing, and the slot can be queued again afterwards.
#[test]
fn bucket_emptied_by_cancels_stays_queued_until_due() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let keys: Vec<_> = (0..3).map(|i| wheel.add(28, i).unwrap()).collect();
    let other = wheel.add(100, 9).unwrap();
    assert_eq!(wheel.queued_buckets(), 2);
    for &k in &keys {
        assert!(wheel.cancel(k).is_some());
    }
    assert_eq!(wheel.len(), 1);
    assert_eq!(
        wheel.queued_buckets(),
        2,
        "emptied bucket left the queue early"
    );
    assert_eq!(wheel.next_expiration(), Some(20));
    wheel.check_invariants();

    assert_eq!(wheel.advance(20, |_| panic!("a cancelled entry fired")), 0);
    assert_eq!(wheel.queued_buckets(), 1);
    assert_eq!(wheel.next_expiration(), Some(100));
    wheel.check_invariants();
    let k = wheel.add(28, 7).unwrap();
    assert_eq!(bucket_of(&wheel, k), (0, 8, 28));
    assert_eq!(wheel.queued_buckets(), 2);
    assert!(wheel.contains(other));
}

/// Entries cascade down several levels (Kafka's re-insertion on flush) and each is handed out
/// exactly once, at exactly its deadline (tick 1), with its own key and deadline.
#[test]
fn cascaded_entry_fires_exactly_once() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    // Deadlines at every level up to 3, several per bucket, and duplicates.
    let mut deadlines: Vec<u64> = (1..=60).map(|i| i * i * i + i).collect();
    deadlines.extend([28, 28, 450, 450, 8_000, 8_001, 159_999, 160_000]);
    let keys: Vec<_> = deadlines
        .iter()
        .enumerate()
        .map(|(i, &d)| wheel.add(d, i).unwrap())
        .collect();
    assert!(wheel.levels() >= 4);
    let mut fired = vec![0u32; deadlines.len()];
    let mut hops = 0;
    while let Some(t) = wheel.next_expiration() {
        hops += 1;
        assert!(
            hops < 400,
            "{hops} steps: the wheel ticks through empty time or is stuck"
        );
        wheel.advance(t, |f| {
            assert_eq!(f.deadline, t, "handed out at {t}, not at its deadline");
            assert_eq!(f.deadline, deadlines[f.value]);
            assert_eq!(f.key, keys[f.value]);
            fired[f.value] += 1;
        });
        wheel.check_invariants();
    }
    assert!(fired.iter().all(|&n| n == 1), "fire counts {fired:?}");
    assert!(wheel.is_empty());
    for k in keys {
        assert!(!wheel.contains(k));
        assert_eq!(wheel.cancel(k), None, "a fired key still cancels");
    }
}

/// `TimerTaskListTest.testAll`: moving a task to another list leaves the count unchanged and
/// the task is scheduled once. Here the move is cancel + add: the count is exact at every step,
/// the old key is dead, and the entry fires once, at its new deadline only.
#[test]
fn rescheduled_entry_fires_once_at_its_new_deadline() {
    let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
    let mut keys: Vec<_> = (0..10u32).map(|i| wheel.add(10, i).unwrap()).collect();
    assert_eq!(wheel.len(), 10);
    for (i, key) in keys.iter_mut().enumerate().take(4) {
        let v = wheel.cancel(*key).unwrap();
        let new = wheel.add(30, v).unwrap();
        assert!(!wheel.contains(*key));
        assert_eq!(wheel.cancel(*key), None);
        *key = new;
        assert_eq!(wheel.len(), 10, "reschedule {i} changed the count");
    }
    for key in &keys[4..7] {
        assert!(wheel.cancel(*key).is_some());
    }
    assert_eq!(wheel.len(), 7);

    let mut at10 = Vec::new();
    wheel.advance(10, |f| at10.push(f.value));
    at10.sort_unstable();
    assert_eq!(at10, [7, 8, 9]);
    let mut at30 = Vec::new();
    wheel.advance(1_000, |f| at30.push((f.deadline, f.value)));
    at30.sort_unstable();
    assert_eq!(at30, [(30, 0), (30, 1), (30, 2), (30, 3)]);
    assert!(wheel.is_empty());
}

/// Kafka's `TimerTaskList.flush` hands entries on in list order (append order), and a cascade
/// re-appends them to the finer bucket in that order: entries due in the same tick leave in
/// the order they were added, whether they were placed at level 0 directly or cascaded down
/// one or two levels, and entries cascaded into a bucket come before those added to it later.
/// The flush walks a bucket from both ends at once; lists of 1 to 100 entries cover the odd
/// and even halves of that walk.
///
/// Catches: a flush that re-places the back half of a bucket's chain out of chain order (the
/// hand-out order of a tick, and the order of a cascaded bucket, would change).
#[test]
fn entries_due_in_one_tick_leave_in_the_order_they_were_added() {
    for n in [1usize, 2, 3, 4, 5, 8, 9, 100] {
        let mut wheel = TimingWheel::new(1, 20, 0).unwrap();
        // Level 0 (5), level 1 (28: bucket 20), level 2 (450: bucket 400, then 440).
        for d in [5u64, 28, 450] {
            for i in 0..n {
                wheel.add(d, (d, i)).unwrap();
            }
        }
        let group = |d: u64| (0..n).map(|i| (d, i)).collect::<Vec<_>>();
        assert_eq!(advance(&mut wheel, 5), group(5), "level 0, n = {n}");
        assert!(advance(&mut wheel, 20).is_empty());
        // The 28 ms entries now sit in level 0 slot 8; later adds there come after them.
        for i in n..2 * n {
            wheel.add(28, (28, i)).unwrap();
        }
        let late: Vec<_> = (0..2 * n).map(|i| (28, i)).collect();
        assert_eq!(
            advance(&mut wheel, 28),
            late,
            "cascaded, then added, n = {n}"
        );
        assert_eq!(
            advance(&mut wheel, 450),
            group(450),
            "two cascades, n = {n}"
        );
        assert!(wheel.is_empty());
        wheel.check_invariants();
    }
}
