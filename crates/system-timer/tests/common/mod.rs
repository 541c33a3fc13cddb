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

/// Runs `f` on a thread of its own and fails the test if it has not returned within `secs`
/// seconds (a hang: the thread is leaked, the test process ends anyway). A panic in `f` is
/// raised again here.
#[allow(dead_code, clippy::disallowed_methods)] // as above; a test's thread and clock
pub(crate) fn within<R: Send + 'static>(
    what: &str,
    secs: u64,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    use std::sync::mpsc;
    use std::time::Duration;
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => {
            t.join().unwrap();
            r
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match t.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the thread sent nothing and did not panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for {secs} s"),
    }
}

/// The scheduler state (`R`, `S`, `D`, ...: the third field of `/proc/self/task/<tid>/stat`)
/// of this process's thread named `name` (at most 15 bytes, the kernel's limit), if there is
/// one (Linux only). A thread blocked on a lock or a condition variable sleeps in a futex: `S`.
#[allow(dead_code)] // not every test file that includes this module uses it
pub(crate) fn thread_state(name: &str) -> Option<char> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .find_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // `tid (comm) S ...`: the name may hold spaces and parentheses, the state follows
            // the last `)`.
            stat[stat.rfind(')')? + 1..].trim_start().chars().next()
        })
}
