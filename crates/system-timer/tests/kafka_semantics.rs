//! Timer points of `shared/reference/kafka-semantics.md` (§7 subtle points) that the other
//! suites did not pin down, on the manual clock (deterministic, no sleeps).
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests use std locks freely

use std::sync::{Arc, Mutex};
use std::time::Duration;

use system_timer::{ManualClock, SystemTimer};

const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);

/// §7 item 1 (early firing by less than 1 ms): Kafka computes `delay + floor(now_ms)`, so a task
/// added at 0.9 ms with a 5 ms delay fires once the clock reads 5.0 ms, 4.1 ms after it was
/// added. Here the deadline keeps nanoseconds (5.9 ms) and is rounded *up* to the 1 ms tick:
/// nothing runs at 5.0 ms (Kafka's firing time) nor at 5.9 ms (not a tick), and the task runs at
/// 6.0 ms, never before 0.9 + 5 ms (DESIGN.md: "Never early").
///
/// Catches: a deadline based on the clock truncated to whole milliseconds (Kafka's rule), or
/// rounded down to the tick.
#[test]
fn a_task_added_mid_millisecond_never_fires_before_its_full_delay() {
    let clock = ManualClock::new(0);
    let timer = SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .build();
    let ran_at = Arc::new(Mutex::new(Vec::new()));
    clock.advance(900 * US);
    let added_at = timer.now();
    let (log, c) = (ran_at.clone(), clock.clone());
    let h = timer
        .add(5 * MS, move || log.lock().unwrap().push(c.now_ns()))
        .unwrap();
    assert_eq!(
        h.deadline(),
        added_at + 5 * MS,
        "the deadline keeps the 0.9 ms"
    );
    clock.set_ns(5_000_000); // Kafka fires here: floor(0.9) + 5 = 5 ms
    assert_eq!(timer.advance(), 0, "fired 4.1 ms after a 5 ms delay");
    clock.set_ns(5_900_000); // the exact deadline, between two ticks
    assert_eq!(timer.advance(), 0, "the deadline waits for its tick");
    clock.set_ns(6_000_000);
    assert_eq!(timer.advance(), 1);
    assert!(h.is_fired());
    let ran = ran_at.lock().unwrap().clone();
    assert_eq!(ran, [6_000_000]);
    assert!(Duration::from_nanos(ran[0]) >= added_at + 5 * MS);
}
