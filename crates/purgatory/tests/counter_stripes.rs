//! The purgatory's counters stay exact when many threads count at once: the first threads each
//! own a stripe they update without a read-modify-write, the later ones share the rest (see
//! `operation.rs`). A file of its own, so that this test's threads are the process's first to
//! count: some own stripes, most share them. Two threads writing one owned stripe, or an owner
//! writing a shared one, lose updates under this load and the totals come out short.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // std threads in tests

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use purgatory::{DelayedOperation, Purgatory};

struct Op(Arc<AtomicUsize>);

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn counts_from_owned_and_shared_stripes_add_up_exactly() {
    const THREADS: usize = 24;
    const PER_THREAD: usize = 20_000;
    let p: Arc<Purgatory<u32, Op>> = Arc::new(Purgatory::builder().reaper(false).build());
    let done = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (p, done, start) = (Arc::clone(&p), Arc::clone(&done), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for i in 0..PER_THREAD {
                    // Keys shared between threads, so their watches meet too.
                    let key = (t + i) as u32 % 16;
                    let w = p
                        .try_complete_else_watch(Op(done.clone()), Duration::from_secs(60), &[key])
                        .expect("accepted");
                    // Every other one completed by this thread at once, the rest disarmed and
                    // completed by the test's thread below (counted on another stripe).
                    if i % 2 == 0 {
                        assert!(w.handle.force_complete());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a counting thread panicked");
    }
    for key in 0..16u32 {
        for h in p.cancel_for_key(&key) {
            assert!(h.force_complete());
        }
    }
    let total = (THREADS * PER_THREAD) as u64;
    let st = p.stats();
    assert_eq!(done.load(Ordering::Relaxed) as u64, total);
    assert_eq!(st.accepted, total, "{st:?}");
    assert_eq!(st.completed, total, "{st:?}");
    assert_eq!(st.delayed, 0, "{st:?}");
    assert_eq!(st.handed_back, 0, "{st:?}");
}
