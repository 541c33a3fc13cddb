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
/// `REFUSED` for an up-front refusal, `SPAWN FAILED` for a build that spawned threads until a
/// spawn failed.
#[test]
fn an_absurd_executor_thread_count_is_refused_before_any_thread_is_spawned() {
    if std::env::var_os(CHILD).is_some() {
        // The first count past the limit, then the largest; the second is reported only if
        // the first was refused with the count.
        for n in [MAX_EXECUTOR_THREADS + 1, usize::MAX] {
            let built = SystemTimer::builder()
                .executor_threads(n)
                .reaper(false)
                .try_build();
            match built {
                Ok(timer) => {
                    println!("BUILT {n}");
                    drop(timer.shutdown());
                    return;
                }
                Err(e @ BuildError::Spawn(_)) => {
                    println!("SPAWN FAILED {n}: {e}");
                    return;
                }
                Err(e) if e == BuildError::TooManyExecutorThreads(n) && n == usize::MAX => {
                    println!("REFUSED: {e}");
                }
                Err(e) if e == BuildError::TooManyExecutorThreads(n) => {}
                Err(e) => {
                    println!("OTHER ERROR {n}: {e}");
                    return;
                }
            }
        }
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
    let outcome = ["BUILT", "SPAWN FAILED", "OTHER ERROR", "REFUSED"]
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
