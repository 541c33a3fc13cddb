//! Stress: many threads adding and cancelling while the reaper fires, on the real clock. The
//! counters must reconcile exactly and every task must end exactly one way.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use system_timer::{Builder, SystemTimer, TimerTask};

mod common;
use common::within;

struct Tracked {
    id: usize,
    runs: Arc<Vec<AtomicU8>>,
}

impl TimerTask for Tracked {
    fn run(self) {
        self.runs[self.id].fetch_add(1, SeqCst);
    }
}

/// 4 threads × 250,000 operations: each adds a task (delay 0–40 ms) and cancels about a third of
/// its earlier tasks, while the reaper and two executors fire the rest. Then shutdown. For every
/// task exactly one of: it ran once, its cancel returned true, shutdown handed it back; and
/// `scheduled == fired + cancelled + handed_back`.
#[test]
fn four_threads_quarter_million_ops_each_reconcile_exactly() {
    const THREADS: usize = 4;
    const OPS: usize = 250_000;
    let timer: Arc<SystemTimer<Tracked>> = Arc::new(Builder::new().executor_threads(2).build());
    let runs: Arc<Vec<AtomicU8>> = Arc::new((0..THREADS * OPS).map(|_| AtomicU8::new(0)).collect());
    let t0 = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (timer, runs) = (timer.clone(), runs.clone());
            std::thread::spawn(move || {
                let mut state = 42 + t as u64;
                let mut next = || {
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z ^ (z >> 31)
                };
                let mut handles = Vec::with_capacity(OPS);
                let mut cancelled = Vec::new();
                for i in 0..OPS {
                    let id = t * OPS + i;
                    let delay = Duration::from_micros(next() % 40_000);
                    let h = timer
                        .add(
                            delay,
                            Tracked {
                                id,
                                runs: runs.clone(),
                            },
                        )
                        .unwrap();
                    handles.push(h);
                    if next() % 3 == 0 {
                        let victim = (next() % handles.len() as u64) as usize;
                        if handles[victim].cancel() {
                            cancelled.push(t * OPS + victim);
                        }
                    }
                }
                (handles, cancelled)
            })
        })
        .collect();
    // Joined under a hang guard: a worker stuck in `add` or `cancel` fails the test (in 120 s)
    // instead of hanging it.
    let (handles, all_cancelled) = within("the workers", 120, move || {
        let mut all_cancelled = Vec::new();
        let mut handles = Vec::new();
        for w in workers {
            let (h, c) = w.join().unwrap();
            handles.extend(h);
            all_cancelled.extend(c);
        }
        (handles, all_cancelled)
    });
    assert!(t0.elapsed() < Duration::from_secs(120), "hung");
    // Let some run, then shut down while others are still pending.
    std::thread::sleep(Duration::from_millis(10));
    let t = timer.clone();
    let back = within("the shutdown", 60, move || t.shutdown());
    let mut fate = vec![0u8; THREADS * OPS]; // bit 0 ran, bit 1 cancelled, bit 2 handed back
    for (id, r) in runs.iter().enumerate() {
        match r.load(SeqCst) {
            0 => {}
            1 => fate[id] |= 1,
            n => panic!("task {id} ran {n} times"),
        }
    }
    for &id in &all_cancelled {
        assert_eq!(fate[id] & 2, 0, "task {id} cancelled twice");
        fate[id] |= 2;
    }
    for t in &back {
        assert_eq!(fate[t.id] & 4, 0, "task {} handed back twice", t.id);
        fate[t.id] |= 4;
    }
    for (id, f) in fate.iter().enumerate() {
        assert!(
            matches!(f, 1 | 2 | 4),
            "task {id} ended {f:#b} (bit 0 ran, 1 cancelled, 2 handed back): not exactly one way"
        );
        // The handle agrees with what happened.
        let h = &handles[id];
        assert_eq!(h.is_cancelled(), *f == 2, "task {id}");
        assert_eq!(h.is_handed_back(), *f == 4 && !h.is_fired(), "task {id}");
    }
    let st = timer.stats();
    assert_eq!(st.scheduled, (THREADS * OPS) as u64);
    assert_eq!(st.cancelled, all_cancelled.len() as u64);
    assert_eq!(st.handed_back, back.len() as u64);
    assert_eq!(st.pending, 0);
    assert_eq!(
        st.scheduled,
        st.fired + st.cancelled + st.handed_back,
        "{st:?}"
    );
    timer.check_invariants();
}
