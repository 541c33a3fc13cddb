//! Shared by the test files that include it (`mod common;`).

use std::time::{Duration, Instant};

/// Names of this process's live threads (Linux: /proc/self/task/*/comm).
pub(crate) fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 20 s, then fails) until no live thread's name starts with `prefix`.
#[allow(dead_code)] // not every test file that includes this module uses it
pub(crate) fn wait_for_threads_to_end(prefix: &str) {
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

/// How many of this process's live threads have a name starting with `prefix`.
#[allow(dead_code)] // not every test file that includes this module uses it
pub(crate) fn threads_named(prefix: &str) -> usize {
    thread_names()
        .iter()
        .filter(|n| n.starts_with(prefix))
        .count()
}
