//! W4's bytes per pending request with a long timeout, in a test binary of its own: the figure
//! is the process's RSS growth, which tests running beside it in one process would disturb.

use kafka_timer::load::{run_once, Args};

/// The completer's calendar has a bucket per millisecond of the timeout: 4 Mi buckets (about
/// 100 MB) for the longest timeout accepted, an hour. It was built on the completer's thread
/// after the run's baseline RSS was read, so bytes per pending request counted it as memory of
/// the requests (about 250,000 bytes each here, a few hundred pending); a harness table of a
/// fixed size belongs in the baseline, as the others are.
#[test]
fn bytes_per_pending_leaves_out_the_completers_calendar() {
    let a = Args {
        num: 4_000,
        rate: 20_000.0,
        // Every latency 20 ms: nothing expires, a few hundred pending at once.
        pct50: 20.0,
        pct75: 20.0,
        timeout: 3_600_000,
        progress: 0.0,
        ..Args::default()
    };
    let r = run_once(&a);
    assert!(r.exactly_once && r.expired == 0, "{r:?}");
    let b = r.bytes_per_pending.expect("requests were pending");
    assert!(
        b < 5_000.0,
        "{b:.0} bytes per pending request ({} pending at the peak, peak RSS {} bytes)",
        r.peak_pending,
        r.peak_rss
    );
}
