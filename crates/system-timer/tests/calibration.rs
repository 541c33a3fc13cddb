//! The cycle counter's calibration, from the start of a process: alone in its test binary,
//! because every other `SystemClock` test drives the process-wide calibration.
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods)] // std clock on purpose

use std::time::{Duration, Instant};

use system_timer::{Clock, SystemClock};

/// The calibration is not done before any deadline reading; deadline readings complete it
/// (about 10 ms after the first clock) exactly where the counter is trusted, and elsewhere it
/// never is.
#[test]
fn deadline_readings_calibrate_the_counter_exactly_where_it_is_trusted() {
    let clock = SystemClock::new();
    assert!(
        !SystemClock::counter_calibrated(),
        "calibrated before any deadline reading"
    );
    let t0 = Instant::now();
    let trusted = SystemClock::counter_trusted();
    // Where trusted, within a generous 10 s; elsewhere, still not after 50 ms of readings.
    let limit = if trusted {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(50)
    };
    while !SystemClock::counter_calibrated() && t0.elapsed() < limit {
        clock.deadline_base_ns();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(SystemClock::counter_calibrated(), trusted);
}
