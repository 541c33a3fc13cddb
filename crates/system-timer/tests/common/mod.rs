//! Shared by the test files that include it (`mod common;`).

/// splitmix64 (BENCHMARKS.md): advances `state` and returns the next output.
#[allow(dead_code)] // not every test file that includes this module uses it
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Names of this process's live threads (Linux: /proc/self/task/*/comm).
#[allow(dead_code)] // not every test file that includes this module uses it
pub(crate) fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (generously: a hang guard) until no thread's name starts with `prefix`.
#[allow(dead_code, clippy::disallowed_methods)] // as above; a test's sleep and clock
pub(crate) fn wait_for_threads_to_end(prefix: &str) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(20);
    while thread_names().iter().any(|n| n.starts_with(prefix)) {
        assert!(
            Instant::now() < deadline,
            "threads of {prefix} still alive: {:?}",
            thread_names()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
