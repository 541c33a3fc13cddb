//! Loom models of `ConcurrentWheel`: one race per test (see `shared/LOOM.md`).
//!
//! Run with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --profile loom -p timing-wheel --test loom_wheel
//! ```
//!
//! Every value scheduled is a loom `Arc` token, so a value the wheel loses (neither fired,
//! cancelled, handed back nor returned in an error) fails the model as "Arc leaked."; counting
//! tokens in the outcomes catches a value that comes out twice.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use timing_wheel::{AddError, ConcurrentWheel, Fired};

/// A scheduled value: an id, tracked by loom's leak check.
type Token = Arc<u32>;

fn token(id: u32) -> Token {
    Arc::new(id)
}

/// Tick 1, 4 buckets per level: level 0 spans 4, level 1 spans 16, level 2 spans 64.
const TICK: u64 = 1;
const SIZE: usize = 4;

/// `(now passed to the advance, deadline, id)` of every entry an advance handed out.
type FiredLog = Vec<(u64, u64, u32)>;

/// `guard.advance(now)`, logging each fired entry with `now`.
fn advance_logged(wheel: &ConcurrentWheel<Token>, now: u64, log: &mut FiredLog) -> usize {
    let mut guard = wheel.lock();
    let n = guard.advance(now, |f: Fired<Token>| log.push((now, f.deadline, *f.value)));
    guard.check_invariants();
    n
}

/// An entry scheduled in level 1 is cancelled while the advancing thread flushes its level-1
/// bucket (cascading it into a level-0 bucket) and then reaches its deadline. Kafka's "this
/// thread sees null and exits the loop, but the other thread inserts the entry to another list
/// later".
#[test]
fn cancel_races_cascading_flush() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());
        // Deadline 6 is beyond level 0's window [0, 4): level 1, bucket [4, 8).
        let added = wheel.add(6, token(1)).unwrap();
        let queued = added.queued.expect("first entry queues its bucket");
        assert_eq!((queued.level(), queued.expiration()), (1, 4));
        let handle = added.handle;

        let advancer = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || {
                let mut log = FiredLog::new();
                // Flush the level-1 bucket: the entry cascades to level-0 bucket 6.
                let a = advance_logged(&wheel, 4, &mut log);
                assert_eq!(a, 0, "nothing is due at 4");
                // Past the deadline: the entry fires, unless cancelled.
                let b = advance_logged(&wheel, 8, &mut log);
                assert_eq!(a + b, log.len());
                log
            })
        };
        let cancelled = handle.cancel();
        let log = advancer.join().unwrap();

        assert_eq!(
            usize::from(cancelled.is_some()) + log.len(),
            1,
            "exactly one of cancel / fire wins (cancelled {cancelled:?}, fired {log:?})"
        );
        if let Some(v) = &cancelled {
            assert_eq!(**v, 1);
        }
        for &(now, deadline, id) in &log {
            assert_eq!((deadline, id), (6, 1));
            assert!(
                now >= deadline,
                "fired at {now}, before its deadline {deadline}"
            );
        }
        assert_eq!(handle.is_cancelled(), cancelled.is_some());
        assert_eq!(handle.is_fired(), log.len() == 1);
        assert!(!handle.is_pending() && !handle.is_handed_back());
        assert!(handle.cancel().is_none(), "a second cancel never wins");
        assert_eq!(wheel.len(), 0);

        let guard = wheel.lock();
        assert_eq!(guard.len(), 0);
        guard.check_invariants();
    });
}

/// An entry in level 0 is cancelled while the advancing thread flushes its bucket and fires it.
#[test]
fn cancel_races_fire() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());
        let added = wheel.add(2, token(1)).unwrap();
        let queued = added.queued.expect("first entry queues its bucket");
        assert_eq!((queued.level(), queued.expiration()), (0, 2));
        let handle = added.handle;

        let advancer = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || {
                let mut log = FiredLog::new();
                let n = advance_logged(&wheel, 2, &mut log);
                assert_eq!(n, log.len());
                log
            })
        };
        let cancelled = handle.cancel();
        let log = advancer.join().unwrap();

        assert_eq!(
            usize::from(cancelled.is_some()) + log.len(),
            1,
            "exactly one of cancel / fire wins (cancelled {cancelled:?}, fired {log:?})"
        );
        if let Some(v) = &cancelled {
            assert_eq!(**v, 1);
        }
        for &(now, deadline, id) in &log {
            assert_eq!((now, deadline, id), (2, 2, 1));
        }
        assert_eq!(handle.is_cancelled(), cancelled.is_some());
        assert_eq!(handle.is_fired(), log.len() == 1);
        assert!(!handle.is_pending() && !handle.is_handed_back());
        assert!(handle.cancel().is_none(), "a second cancel never wins");
        assert_eq!(wheel.len(), 0);

        let guard = wheel.lock();
        assert_eq!(guard.len(), 0);
        assert_eq!(
            guard.queued_buckets(),
            0,
            "the flushed bucket is not queued again"
        );
        guard.check_invariants();
    });
}

/// Two threads add, at once and on the same shard, entries that need overflow levels the shard
/// does not have yet: 6 needs level 1, 20 needs level 2 (and so levels 1 and 2 both).
#[test]
fn adders_race_to_create_overflow_level() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());
        {
            let guard = wheel.lock();
            assert_eq!(guard.levels(), 0, "no level before the first add");
        }

        let adder = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || wheel.add(6, token(1)).unwrap())
        };
        let b = wheel.add(20, token(2)).unwrap();
        let a = adder.join().unwrap();

        // Different levels, so different buckets: each add queued its own.
        let qa = a.queued.expect("level-1 bucket queued by its add");
        let qb = b.queued.expect("level-2 bucket queued by its add");
        assert_eq!((qa.level(), qa.expiration()), (1, 4));
        assert_eq!((qb.level(), qb.expiration()), (2, 16));
        assert!(a.handle.is_pending() && b.handle.is_pending());
        assert_eq!(a.handle.deadline(), Some(6));
        assert_eq!(b.handle.deadline(), Some(20));
        assert_eq!(wheel.len(), 2);
        assert_eq!(wheel.queued_buckets(), 2);

        let mut log = FiredLog::new();
        {
            let mut guard = wheel.lock();
            assert_eq!(guard.levels(), 3, "levels 0, 1 and 2, each once");
            guard.check_invariants();
            // Step from one queued bucket to the next, as a reaper would.
            while let Some(t) = guard.next_expiration() {
                // (No check_invariants here: each one loads every bucket marker, 128 loom
                // branches, and the cascade's four steps would exceed loom's branch limit.)
                guard.advance(t, |f: Fired<Token>| log.push((t, f.deadline, *f.value)));
            }
            assert_eq!(guard.levels(), 3);
            assert_eq!(guard.len(), 0);
        }
        // Each fired exactly once, exactly at its deadline (tick 1).
        assert_eq!(log, [(6, 6, 1), (20, 20, 2)]);
        assert!(a.handle.is_fired() && b.handle.is_fired());
        assert!(!a.handle.is_cancelled() && !b.handle.is_cancelled());
        assert_eq!(wheel.len(), 0);

        wheel.lock().check_invariants();
    });
}

/// An add with deadline `current + 1` races an advance of the clock by 1. Either the add comes
/// first (its bucket is queued, and the racing advance fires the entry) or the advance does (the
/// deadline has been reached: `Expired`, the value handed back). Never lost, never early, never
/// left for a later advance.
#[test]
fn add_races_advance() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());

        let adder = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || wheel.add(1, token(1)))
        };
        let mut log = FiredLog::new();
        // Checks the invariants (every non-empty bucket queued, none overdue) while still
        // holding the guard: an add must not be half done when the write side looks.
        advance_logged(&wheel, 1, &mut log);
        let added = adder.join().unwrap();
        advance_logged(&wheel, 2, &mut log);

        match added {
            Ok(added) => {
                let q = added
                    .queued
                    .expect("the add created its bucket, so it queued it");
                assert_eq!((q.level(), q.expiration()), (0, 1));
                assert!(added.earliest, "the only bucket is the earliest");
                // The add came first, so the racing advance to 1 must have fired it: not
                // before its deadline, and not left behind for the later advance.
                assert_eq!(log, [(1, 1, 1)], "fired exactly once, at 1");
                assert!(added.handle.is_fired() && !added.handle.is_cancelled());
                assert!(added.handle.cancel().is_none());
            }
            Err(AddError::Expired(v)) => {
                assert_eq!(*v, 1);
                assert!(log.is_empty(), "an expired add schedules nothing: {log:?}");
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert_eq!(wheel.len(), 0);

        let guard = wheel.lock();
        assert_eq!(guard.current_time(), 2);
        assert_eq!(guard.queued_buckets(), 0);
        guard.check_invariants();
    });
}

/// Two threads add on different shards, at once, deadlines in the same bucket. The bucket's
/// marker is shared: exactly one add queues the bucket, and flushing it fires both shards'
/// entries.
#[test]
fn adders_on_two_shards_share_a_bucket_marker() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 2).unwrap());
        assert_eq!(wheel.shards(), 2);

        let adder = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || wheel.add_on_shard(0, 2, token(0)).unwrap())
        };
        let b = wheel.add_on_shard(1, 2, token(1)).unwrap();
        let a = adder.join().unwrap();

        assert_eq!(
            usize::from(a.queued.is_some()) + usize::from(b.queued.is_some()),
            1,
            "exactly one add queues the shared bucket (a {:?}, b {:?})",
            a.queued,
            b.queued
        );
        let q = a.queued.or(b.queued).unwrap();
        assert_eq!((q.level(), q.expiration()), (0, 2));
        assert!(
            a.earliest || b.earliest,
            "the queuing add reports the earliest bucket"
        );
        assert!(!(a.earliest && b.earliest));
        assert_eq!(wheel.len(), 2);
        assert_eq!(wheel.queued_buckets(), 1, "queued once");

        let mut log = FiredLog::new();
        {
            let mut guard = wheel.lock();
            guard.check_invariants();
            let n = guard.advance(2, |f: Fired<Token>| log.push((2, f.deadline, *f.value)));
            assert_eq!(n, 2);
            assert_eq!(guard.queued_buckets(), 0);
            guard.check_invariants();
        }
        log.sort_unstable();
        assert_eq!(
            log,
            [(2, 2, 0), (2, 2, 1)],
            "both shards' entries fire once"
        );
        assert!(a.handle.is_fired() && b.handle.is_fired());
        assert_eq!(wheel.len(), 0);

        wheel.lock().check_invariants();
    });
}

/// An add races a close: the value is either handed back by the close, or the add fails with
/// `Closed` and returns it. Never lost, never both.
#[test]
fn close_races_add() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());

        let adder = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || wheel.add(5, token(1)))
        };
        let mut handed_back = Vec::new();
        {
            let mut guard = wheel.lock();
            let n = guard.close(|f: Fired<Token>| handed_back.push((f.deadline, f.value)));
            assert_eq!(n, handed_back.len());
            assert!(guard.is_closed());
            assert_eq!(guard.len(), 0);
            assert_eq!(guard.queued_buckets(), 0, "a closed wheel queues nothing");
            guard.check_invariants();
        }
        let added = adder.join().unwrap();

        match added {
            Ok(added) => {
                assert_eq!(
                    handed_back.len(),
                    1,
                    "scheduled before the close, so handed back"
                );
                let (deadline, v) = handed_back.pop().unwrap();
                assert_eq!((deadline, *v), (5, 1));
                assert!(added.handle.is_handed_back());
                assert!(!added.handle.is_fired() && !added.handle.is_cancelled());
                assert!(!added.handle.is_pending());
                assert!(added.handle.cancel().is_none());
            }
            Err(AddError::Closed(v)) => {
                assert_eq!(*v, 1);
                assert!(
                    handed_back.is_empty(),
                    "returned by add and handed back: {handed_back:?}"
                );
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert_eq!(wheel.len(), 0);
        assert_eq!(wheel.queued_buckets(), 0, "nothing queued after the close");
        assert_eq!(wheel.next_expiration(), None);
        assert!(matches!(wheel.add(6, token(2)), Err(AddError::Closed(_))));

        wheel.lock().check_invariants();
    });
}

/// Another thread asks a handle what became of its entry while the handle's owner cancels it
/// and an advance reaches its deadline. The answers are taken under the shard lock, so they
/// must agree with what happened: an entry the advance did not fire is never reported fired
/// (not even between the cancel's unlink and its marking the handle cancelled), and one it
/// fired is never reported cancelled.
#[test]
fn handle_queries_race_cancel() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap());
        let handle = Arc::new(wheel.add(2, token(1)).unwrap().handle);

        let observer = {
            let (wheel, handle) = (Arc::clone(&wheel), Arc::clone(&handle));
            thread::spawn(move || {
                assert!(
                    !handle.is_fired(),
                    "reported fired before any advance (pending {}, cancelled {})",
                    handle.is_pending(),
                    handle.is_cancelled()
                );
                let mut log = FiredLog::new();
                let n = advance_logged(&wheel, 2, &mut log);
                assert_eq!(n, log.len());
                // Whichever won, it won before this advance released the lock.
                assert_eq!(handle.is_fired(), n == 1, "is_fired after {log:?}");
                assert_eq!(handle.is_cancelled(), n == 0, "is_cancelled after {log:?}");
                assert!(!handle.is_pending());
                n
            })
        };
        let cancelled = handle.cancel();
        let fired = observer.join().unwrap();

        assert_eq!(usize::from(cancelled.is_some()) + fired, 1);
        assert_eq!(handle.is_cancelled(), cancelled.is_some());
        assert_eq!(handle.is_fired(), fired == 1);
        assert_eq!(wheel.len(), 0);
        wheel.lock().check_invariants();
    });
}

/// Two write sides at once on a two-shard wheel: a close races an advance. Each takes every
/// shard lock, so they must take them in one global order (a thread-dependent order deadlocks),
/// and each sees the other's work whole: either the advance fires both shards' entries and the
/// close hands back nothing, or the close hands back both and the advance fires nothing.
#[test]
fn close_races_advance_on_two_shards() {
    loom::model(|| {
        let wheel = Arc::new(ConcurrentWheel::with_shards(TICK, SIZE, 0, 2).unwrap());
        let a = wheel.add_on_shard(0, 2, token(0)).unwrap().handle;
        let b = wheel.add_on_shard(1, 2, token(1)).unwrap().handle;

        let closer = {
            let wheel = Arc::clone(&wheel);
            thread::spawn(move || {
                let mut back = Vec::new();
                let mut guard = wheel.lock();
                let n = guard.close(|f: Fired<Token>| back.push(*f.value));
                assert_eq!(n, back.len());
                guard.check_invariants();
                back
            })
        };
        let mut fired = Vec::new();
        {
            let mut guard = wheel.lock();
            let n = guard.advance(2, |f: Fired<Token>| fired.push(*f.value));
            assert_eq!(n, fired.len());
            guard.check_invariants();
        }
        let mut back = closer.join().unwrap();

        fired.sort_unstable();
        back.sort_unstable();
        assert!(
            (fired == [0, 1] && back.is_empty()) || (fired.is_empty() && back == [0, 1]),
            "fired {fired:?}, handed back {back:?}"
        );
        for h in [&a, &b] {
            assert_eq!(h.is_fired(), !fired.is_empty());
            assert_eq!(h.is_handed_back(), !back.is_empty());
            assert!(!h.is_pending() && !h.is_cancelled());
        }
        assert_eq!(wheel.len(), 0);
        assert_eq!(wheel.queued_buckets(), 0);
        wheel.lock().check_invariants();
    });
}

/// The wheel is dropped while another thread cancels an entry through its handle (which keeps
/// the entry's shard alive). Either the cancel wins and returns the value, or the drop takes it
/// out (the handle then reports it handed back) and drops it; either way the other entry of that
/// shard, which no handle names, is dropped with the wheel, not when the handle goes.
#[test]
fn wheel_drop_races_handle_cancel() {
    loom::model(|| {
        let wheel = ConcurrentWheel::with_shards(TICK, SIZE, 0, 1).unwrap();
        let handle = wheel.add(5, token(1)).unwrap().handle;
        let other = token(2);
        wheel.add(6, Arc::clone(&other)).unwrap();

        let canceller = thread::spawn(move || {
            let cancelled = handle.cancel();
            let handed_back = handle.is_handed_back();
            (cancelled.map(|v| *v), handed_back, handle)
        });
        drop(wheel);
        assert_eq!(
            Arc::strong_count(&other),
            1,
            "the wheel's drop kept a value"
        );
        let (cancelled, handed_back, handle) = canceller.join().unwrap();
        match cancelled {
            Some(id) => assert!(id == 1 && !handed_back),
            None => assert!(handed_back && handle.is_handed_back()),
        }
        assert!(!handle.is_pending() && handle.cancel().is_none());
    });
}
