//! Public API claims checked at their edges: what the documentation of a public function says,
//! held against what it does (from an API review of 2026-11-26).
#![cfg(not(loom))]

use std::time::Duration;

use system_timer::{ManualClock, SystemTimer};

/// A timer driven by hand on `clock`: no threads, tasks run inline by `advance`.
fn manual(clock: &ManualClock) -> SystemTimer {
    SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .build()
}

/// `SystemTimer::next_expiration` once promised "`None` when nothing is pending", but a bucket
/// emptied by cancels stays queued until its time, and is reported: the documentation now says
/// so. After the only task is cancelled (by handle, then by key) the timer is empty and still
/// names the bucket's time, no later than the task's deadline; once the clock passes it and the
/// timer advances, nothing is queued: `None`.
#[test]
fn next_expiration_names_an_emptied_bucket_until_it_is_advanced_past() {
    let clock = ManualClock::new(0);
    let timer = manual(&clock);
    let handle = timer.add(Duration::from_millis(30), || ()).unwrap();
    assert!(handle.cancel());
    let key = timer.add_keyed(Duration::from_millis(40), || ()).unwrap();
    assert!(timer.cancel(key));
    assert!(timer.is_empty());
    let next = timer
        .next_expiration()
        .expect("the emptied buckets stay queued");
    assert!(next <= Duration::from_millis(30), "{next:?}");
    clock.advance(Duration::from_millis(50));
    assert_eq!(timer.advance(), 0, "nothing to run");
    assert_eq!(timer.next_expiration(), None);
}

/// `ManualClock::new(start_ms)` reads `start_ms` up to the last millisecond a `u64` of
/// nanoseconds holds (18,446,744,073,709 ms, about 584 years), and its last nanosecond for any
/// start past it, as documented (its documentation once promised `start_ms` for every start);
/// `set_ms` saturates the same way.
#[test]
fn a_manual_clock_started_past_its_last_nanosecond_reads_that_nanosecond() {
    let last_ms = u64::MAX / 1_000_000;
    assert_eq!(ManualClock::new(last_ms).now_ms(), last_ms);
    assert_eq!(ManualClock::new(last_ms).now_ns(), last_ms * 1_000_000);
    for start_ms in [last_ms + 1, u64::MAX] {
        assert_eq!(
            ManualClock::new(start_ms).now_ns(),
            u64::MAX,
            "start {start_ms} ms"
        );
    }
    let clock = ManualClock::new(0);
    clock.set_ms(u64::MAX);
    assert_eq!(clock.now_ns(), u64::MAX);
}
