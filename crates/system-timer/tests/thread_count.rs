//! An absurd executor thread count given to the builder. Run in a child process of this test
//! binary whose address space is capped at 512 MiB (`ulimit -v`), so that a build that tries to
//! spawn that many threads runs out after a few hundred, instead of exhausting the machine's
//! threads.
#![cfg(all(unix, not(loom)))]
#![allow(clippy::disallowed_methods)]

use std::process::Command;

use system_timer::{BuildError, SystemTimer, MAX_EXECUTOR_THREADS};

/// Set in the child: build the timer there and print the outcome.
const CHILD: &str = "SYSTEM_TIMER_THREAD_COUNT_CHILD";

/// `Builder::executor_threads(usize::MAX)` (and `purgatory::Builder::expiry_threads`, which
/// passes its count on) must be refused by `try_build` with an error that names the limit,
/// before any thread is spawned, as an absurd shard count is (`ConfigError::BadShardCount`):
/// not attempted thread by thread until the operating system refuses one. The child reports
/// `REFUSED` for an up-front refusal, `FAILED` for another error (a build that spawned threads
/// until a spawn failed), `BUILT` for a timer built.
#[test]
fn an_absurd_executor_thread_count_is_refused_before_any_thread_is_spawned() {
    if std::env::var_os(CHILD).is_some() {
        // The first count past the limit, then the largest: each must be refused with its
        // count; the first that is not (built, or failed otherwise: a spawn) is reported.
        let mut refusal = String::new();
        for n in [MAX_EXECUTOR_THREADS + 1, usize::MAX] {
            let built = SystemTimer::builder()
                .executor_threads(n)
                .reaper(false)
                .try_build();
            match built {
                Err(e) if e == BuildError::TooManyExecutorThreads(n) => refusal = e.to_string(),
                Ok(timer) => {
                    println!("BUILT {n}");
                    drop(timer.shutdown());
                    return;
                }
                Err(e) => {
                    println!("FAILED {n}: {e}");
                    return;
                }
            }
        }
        println!("REFUSED: {refusal}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 524288 && exec "$0" --exact "$1" --nocapture --test-threads=1"#)
        .arg(&exe)
        .arg("an_absurd_executor_thread_count_is_refused_before_any_thread_is_spawned")
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The report follows the harness's "test <name> ... " on its line.
    let outcome = ["BUILT", "FAILED", "REFUSED"]
        .iter()
        .find_map(|p| {
            stdout
                .find(p)
                .map(|i| stdout[i..].lines().next().unwrap_or_default())
        })
        .unwrap_or_else(|| panic!("the child reported nothing ({}): {stdout}", out.status));
    assert!(
        outcome.starts_with("REFUSED")
            && outcome.contains("executor")
            && outcome.contains(&format!("at most {MAX_EXECUTOR_THREADS}")),
        "executor_threads(usize::MAX) was not refused up front: {outcome}"
    );
}
