//! The broker-like simulation of `examples/broker.rs`, as a test: every delayed produce and
//! delayed fetch is answered exactly once, with a status consistent with the high watermark and
//! with how it completed; both outcomes (acknowledged and timed out) occur; a run that stops
//! making progress ends with a problem.

#![allow(clippy::disallowed_methods)] // watchdog threads (std::thread::spawn), as the simulation uses

use std::time::Duration;

use kafka_timer::broker::{run, Config, Report};

/// `run(cfg)` on a thread of its own, failing the test if it has not ended within `secs` (a
/// hang: runs have hung before; the thread is left behind, the test process ends anyway).
fn run_within(secs: u64, what: &str, cfg: Config) -> Report {
    let (tx, rx) = std::sync::mpsc::channel();
    // The send fails only once the guard has given up (and dropped the receiver).
    std::thread::spawn(move || {
        let _ = tx.send(run(&cfg));
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: still running after {secs} s"))
}

#[test]
fn every_produce_and_fetch_is_answered_exactly_once_with_the_right_status() {
    let cfg = Config {
        produces_each: 1_500,
        stats_every: None,
        produce_timeout: Duration::from_millis(60),
        ..Config::default()
    };
    let r = run_within(120, "the run", cfg);
    if let Err(p) = r.check() {
        panic!("{p}");
    }
    assert_eq!(r.produces, 6_000);
    assert_eq!(r.produces_acked + r.produces_timed_out, r.produces);
    assert!(r.produces_acked > 0, "no produce was acknowledged: {r:?}");
    assert!(
        r.produces_timed_out > 0,
        "the follower stalls must time some produces out: {r:?}"
    );
    assert!(r.fetches > 0 && r.fetches_satisfied > 0, "{r:?}");
    assert!(r.produces_woken > 0 && r.fetches_woken > 0, "{r:?}");
}

#[test]
fn a_full_fetch_log_is_reported_not_passed() {
    // Too small a fetch log for the run: the consumers stop before reading everything, which
    // must be a problem, not a silent pass.
    let cfg = Config {
        produces_each: 200,
        stats_every: None,
        max_fetches: 4,
        ..Config::default()
    };
    let r = run_within(120, "a run with a small fetch log", cfg);
    let problems = r.check().expect_err("a consumer stopped early");
    assert!(
        problems.contains("stopped before catching up"),
        "{problems}"
    );
    assert_eq!(r.fetches, 4, "{r:?}");
}

fn small() -> Config {
    Config {
        produces_each: 200,
        stats_every: None,
        ..Config::default()
    }
}

/// The live-stats thread stops when the run does, not at the end of its sleep: with stats
/// every hour, a run of a fraction of a second returns well within the hang guard (before the
/// fix it waited out the hour).
#[test]
fn live_stats_do_not_delay_the_end_of_the_run() {
    let cfg = Config {
        stats_every: Some(Duration::from_secs(3600)),
        ..small()
    };
    let r = run_within(120, "a run with stats every hour", cfg);
    assert!(r.check().is_ok(), "{r:?}");
}

#[test]
fn no_partitions_is_a_problem_not_a_panic() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| {
            run(&Config {
                partitions: 0,
                ..small()
            })
        });
        let _ = tx.send(r.ok());
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a run with no partitions still running after 20 s")
        .expect("run panicked");
    assert!(r.check().is_err(), "{r:?}");
}

#[test]
fn no_followers_ends() {
    let cfg = Config {
        followers: 0,
        ..small()
    };
    let r = run_within(20, "a run with no followers", cfg);
    assert!(r.check().is_err(), "{r:?}");
}

/// A follower that dies (here an injected panic; in earnest, a panic a check re-raised) stops
/// the high watermark: the consumers used to fetch until the fetch log was full, 50 ms a
/// fetch, hours with the default log, and the run neither ended nor failed. Now they stop, and
/// the run reports the dead follower.
#[test]
fn a_dead_follower_ends_the_run_with_a_problem() {
    let cfg = Config {
        follower_panics_in_round: Some(3),
        ..small()
    };
    let r = run_within(120, "a run with a dead follower", cfg);
    let problems = r.check().expect_err("a follower died");
    assert!(problems.contains("follower 0 panicked"), "{problems}");
    assert!(problems.contains("a follower died"), "{problems}");
}

/// A follower that gets stuck without a panic also stops the high watermark: the consumers
/// used to fetch until the fetch log was full (hours). Now the run notices that nothing has
/// moved for far longer than any stall the configuration makes, stops, and reports it.
#[test]
fn a_stuck_follower_ends_the_run_with_a_problem() {
    let cfg = Config {
        follower_stalls_in_round: Some(3),
        // Raised to 20 times the longest configured pause (2 x 100 ms stalls): 4 s.
        progress_timeout: Duration::from_secs(1),
        ..small()
    };
    let r = run_within(60, "a run with a stuck follower", cfg);
    let problems = r.check().expect_err("a follower got stuck");
    assert!(problems.contains("no progress"), "{problems}");
    assert!(!problems.contains("panicked"), "{problems}");
}
