//! A storage engine's TTLs on the single-threaded `TimingWheel`, driven by the engine's own loop
//! (no timer thread): each key has at most one pending expiry; overwriting a key cancels its old
//! TTL in O(1); the loop asks the wheel when it next has work. Takes no arguments; panics if
//! an expiry comes out of order, at the wrong time or for the wrong key.
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
    now_ms: u64,
}

impl Store {
    fn new() -> Self {
        Store {
            data: HashMap::new(),
            ttls: TimingWheel::new(1, 64, 0).expect("valid wheel"),
            now_ms: 0,
        }
    }

    /// Sets `key` to `value` for `ttl_ms`, replacing (and un-scheduling) any previous TTL. A TTL
    /// past the end of time (a client's `u64::MAX`) saturates to the wheel's "never".
    fn set(&mut self, key: &str, value: &str, ttl_ms: u64) {
        let expiry = self
            .ttls
            .add(self.now_ms.saturating_add(ttl_ms.max(1)), key.to_string())
            .expect("deadline after now");
        if let Some((_, old)) = self.data.insert(key.into(), (value.into(), expiry)) {
            self.ttls.cancel(old);
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.data.get(key).map(|(v, _)| v.as_str())
    }

    /// The engine loop's step: move time, evict what expired.
    fn tick(&mut self, now_ms: u64) -> Vec<String> {
        self.now_ms = now_ms;
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
    let mut store = Store::new();
    store.set("session:alice", "token-a", 30_000);
    store.set("session:bob", "token-b", 5_000);
    store.set("lock:orders", "holder-7", 250);
    store.set("session:alice", "token-a2", 60_000); // renewed: the 30 s TTL is cancelled
    assert_eq!(store.ttls.len(), 3);

    // The engine sleeps until the wheel's next expiration (it never ticks through idle time).
    let mut evicted = Vec::new();
    while let Some(t) = store.ttls.next_expiration() {
        for key in store.tick(t) {
            out!("t = {:>6} ms: {key} expired", store.now_ms);
            evicted.push((store.now_ms, key));
        }
    }
    // In TTL order, each key at its own TTL (the wheel's tick is 1 ms: never early, never a tick
    // late), the renewed session at its new TTL, not its first one. The keys too: with the times
    // alone, a session evicted at the lock's 250 ms (and the lock at the session's 5 s) passed.
    let want = [
        (250, "lock:orders"),
        (5_000, "session:bob"),
        (60_000, "session:alice"),
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
