//! W4's bytes per pending request, in a test binary of its own: the figure is the process's RSS
//! growth, which tests running beside it in one process would disturb.

use kafka_timer::load::{run_once, Args, CompleterWake, Model};

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
        keys: 3,
        key_space: 100,
        model: Model::Kafka,
        tick_ms: 1.0,
        wheel_size: 20,
        reaper_grace_ms: 2.0,
        purge_interval: 1000,
        executors: 1,
        seed: 42,
        completer_tick_us: 1000,
        ready_hint: true,
        completer_wake: CompleterWake::Generator,
        progress: 0.0,
        json: false,
        plot: None,
        find_max_rate: false,
        harness_only: false,
        baseline: false,
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
