//! A broker-like simulation: partitions with a leader log and a high watermark, followers
//! fetching, producers with acks=all (delayed produce), consumers with min bytes (delayed fetch),
//! all through two purgatories. Prints live stats, then checks (`Report::check`) every request
//! was answered exactly once with the right status, none expired before its timeout (nor more
//! than a second after it), none found ready later than the check following the high-watermark
//! move that made it ready (a lost wake-up, even one a later check healed, or a move no check
//! followed), every consumer read exactly the bytes its responses carried, and the checks
//! completed something (some produces acknowledged and fetches satisfied, some of each by a
//! check after they were watched). Exits non-zero on any problem. Takes no arguments (the
//! configuration is `kafka_timer::broker::Config::default()`).
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
        "produce: {} issued, {} acked ({} woken by a check), {} timed out ({} partly acked) | fetch: {} issued, {} satisfied ({} woken by a check), {} expired | latest expiry {:?} past its timeout | {:.2} s",
        r.produces,
        r.produces_acked,
        r.produces_woken,
        r.produces_timed_out,
        r.produces_partly_acked,
        r.fetches,
        r.fetches_satisfied,
        r.fetches_woken,
        r.fetches_expired,
        r.max_expiry_lateness,
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
