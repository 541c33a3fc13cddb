//! A broker-like simulation: partitions with a leader log and a high watermark, followers
//! fetching, producers with acks=all (delayed produce), consumers with min bytes (delayed fetch),
//! all through two purgatories. Prints live stats, then checks every request was answered
//! exactly once with the right status, none expired before its timeout, none found ready later
//! than the check that made it ready (a lost wake-up, even one a later check healed), and every
//! consumer read exactly the bytes its responses carried. Exits non-zero on any problem. Takes no
//! arguments (the configuration is `kafka_timer::broker::Config::default()`).
//!
//! ```sh
//! cargo run --release --example broker
//! ```

use std::process::ExitCode;

use kafka_timer::broker::{run, Config};
use kafka_timer::measure::exit_status;
use kafka_timer::out;

fn main() -> ExitCode {
    if std::env::args().len() > 1 {
        eprintln!("usage: broker (no arguments; the configuration is Config::default())");
        return ExitCode::from(2);
    }
    let cfg = Config::default();
    // Through `out!`: a reader that has gone away (`| head -1`) is reported once and turns into
    // status 2, not a panic (status 101, the checks' verdict lost); the checks still run.
    out!("{cfg:?}");
    let r = run(&cfg);
    out!(
        "produce: {} issued, {} acked, {} timed out | fetch: {} issued, {} satisfied, {} expired | {:.2} s",
        r.produces,
        r.produces_acked,
        r.produces_timed_out,
        r.fetches,
        r.fetches_satisfied,
        r.fetches_expired,
        r.elapsed.as_secs_f64()
    );
    match r.check() {
        Ok(()) => {
            out!("every produce and fetch answered exactly once, with the right status");
            exit_status(true)
        }
        Err(problems) => {
            eprintln!("PROBLEMS:\n{problems}");
            ExitCode::FAILURE
        }
    }
}
