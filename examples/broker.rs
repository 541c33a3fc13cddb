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

fn main() -> ExitCode {
    if std::env::args().len() > 1 {
        eprintln!("usage: broker (no arguments; the configuration is Config::default())");
        return ExitCode::from(2);
    }
    let cfg = Config::default();
    println!("{cfg:?}");
    let r = run(&cfg);
    println!(
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
            println!("every produce and fetch answered exactly once, with the right status");
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("PROBLEMS:\n{problems}");
            ExitCode::FAILURE
        }
    }
}
