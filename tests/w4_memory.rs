//! W4's bytes per pending request, in a test binary of its own: the figure is the process's RSS
//! growth, which tests running beside it in one process would disturb.

use kafka_timer::load::{run_once, Args};

/// Bytes per pending request is the RSS growth over the peak number pending: it must not grow
/// with the number of requests a run completes. Every request here expires (on the timer's
/// executor thread) while only a couple of hundred are pending at once; the completion log of a
/// thread that had none installed grew with every expiry (16 bytes each, 2 MB here), counted
/// as memory of the pending requests: several thousand bytes each instead of a few hundred.
#[test]
fn bytes_per_pending_does_not_grow_with_the_requests_completed() {
    let a = Args {
        num: 120_000,
        rate: 40_000.0,
        pct50: 1_000.0,
        pct75: 1_000.0,
        timeout: 5,
        executors: 1,
        progress: 0.0,
        ..Args::default()
    };
    let r = run_once(&a);
    assert!(r.exactly_once && r.expired == a.num, "{r:?}");
    let b = r.bytes_per_pending.expect("requests were pending");
    assert!(
        b < 2_500.0,
        "{b:.0} bytes per pending request ({} pending at the peak, peak RSS {} bytes)",
        r.peak_pending,
        r.peak_rss
    );
}
