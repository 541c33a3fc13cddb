//! A storage engine's TTLs on the single-threaded `TimingWheel`, driven by the engine's own loop
//! (no timer thread): each key has at most one pending expiry; overwriting a key cancels its old
//! TTL in O(1); the loop sleeps until the wheel's next bucket is due or a client's request
//! comes, whichever is first. Takes no arguments; panics if an expiry comes out of order, at the
//! wrong time or for the wrong key.
//!
//! ```sh
//! cargo run --release --example ttl
//! ```

use std::collections::HashMap;
use std::process::ExitCode;

use kafka_timer::measure::exit_status;
use kafka_timer::out;
use timing_wheel::{EntryKey, TimingWheel};

/// A key-value store whose entries expire.
struct Store {
    data: HashMap<String, (String, EntryKey)>,
    ttls: TimingWheel<String>,
}

impl Store {
    fn new() -> Self {
        Store {
            data: HashMap::new(),
            ttls: TimingWheel::new(1, 64, 0).expect("valid wheel"),
        }
    }

    /// Sets `key` to `value` at `now_ms` (the engine's time when the request came, which may be
    /// long after the wheel's last advance: the loop sleeps through idle time) for `ttl_ms`,
    /// replacing (and un-scheduling) any previous TTL. A TTL of 0 expires at the next
    /// millisecond (the wheel takes deadlines after its time only); one past the end of time (a
    /// client's `u64::MAX`) saturates to the wheel's "never".
    fn set(&mut self, now_ms: u64, key: &str, value: &str, ttl_ms: u64) {
        let expiry = self
            .ttls
            .add(now_ms.saturating_add(ttl_ms.max(1)), key.to_string())
            .expect("deadline after the wheel's time");
        if let Some((_, old)) = self.data.insert(key.into(), (value.into(), expiry)) {
            self.ttls.cancel(old);
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.data.get(key).map(|(v, _)| v.as_str())
    }

    /// The engine loop's step: move the wheel to `now_ms`, evict what expired.
    fn tick(&mut self, now_ms: u64) -> Vec<String> {
        let mut expired = Vec::new();
        self.ttls.advance(now_ms, |e| expired.push(e.value));
        for k in &expired {
            self.data.remove(k);
        }
        expired
    }
}

/// Its lines go through `out!`: a reader that has gone away (`| head -1`) is reported once and
/// turns into status 2, not a panic; the checks (the assertions) still run.
fn main() -> ExitCode {
    if std::env::args().len() > 1 {
        eprintln!("usage: ttl (no arguments)");
        return ExitCode::from(2);
    }
    // Client requests: (arrival in ms, key, value, TTL in ms).
    let requests = [
        (0, "session:alice", "token-a", 30_000),
        (0, "session:bob", "token-b", 5_000),
        (0, "lock:orders", "holder-7", 250),
        (10, "session:alice", "token-a2", 60_000), // renewed: the 30 s TTL is cancelled
        // While the loop sleeps (nothing is due between 250 ms and the next bucket): the TTL
        // counts from the request's time, not from the wheel's last advance at 250 ms.
        (3_000, "lock:orders", "holder-9", 1_000),
    ];
    let mut store = Store::new();
    let mut requests = requests.into_iter().peekable();
    // The engine sleeps until the wheel's next bucket is due or the next request comes (it
    // never ticks through idle time; a coarse bucket's time moves its keys down a level).
    let mut evicted = Vec::new();
    while let Some(now) = [store.ttls.next_expiration(), requests.peek().map(|r| r.0)]
        .into_iter()
        .flatten()
        .min()
    {
        for key in store.tick(now) {
            out!("t = {now:>6} ms: {key} expired");
            evicted.push((now, key));
        }
        while let Some((_, key, value, ttl)) = requests.next_if(|r| r.0 == now) {
            store.set(now, key, value, ttl);
        }
    }
    // In TTL order, each key at its own TTL (the wheel's tick is 1 ms: never early, never a tick
    // late), the renewed session at its new TTL, not its first one, the lock set during the
    // idle time a TTL after its request. The keys too: with the times alone, a session evicted
    // at the lock's 250 ms (and the lock at the session's 5 s) passed.
    let want = [
        (250, "lock:orders"),
        (4_000, "lock:orders"),
        (5_000, "session:bob"),
        (60_010, "session:alice"),
    ];
    assert!(
        evicted.iter().map(|(t, k)| (*t, k.as_str())).eq(want),
        "{evicted:?}"
    );
    assert_eq!(store.get("session:alice"), None);
    assert!(store.data.is_empty() && store.ttls.is_empty());
    out!("all TTLs expired in order; the renewed key lived for its new TTL");
    exit_status(true)
}
