//! The load generator with its standard output or standard error closed (a reader that has
//! gone away: `| head -1`, a pager quit): every workload ends with a message and a status, never
//! a panic.

use std::process::{Command, Stdio};

/// The progress display is best effort: a reader of standard error that has gone away (a
/// pager quit, `2>&1 >report.txt | head -1`) made the first progress line after it panic
/// ("failed printing to stderr"): the run died with status 101 and its table, on a standard
/// output that was fine, was never written. Its standard error here is a pipe whose read end
/// was closed before it started.
#[test]
fn a_closed_stderr_does_not_end_the_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args(SMALL)
        .args(["--num", "3000", "--progress", "0.02"])
        .stderr(closed_pipe())
        .output()
        .expect("the load generator runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    assert!(
        stdout.contains("exactly once (on_complete per request)"),
        "no table: {stdout:?}"
    );
}

/// The write end of a pipe whose read end is closed: every write to it fails (EPIPE), from the
/// first (closing the read end of a child's pipe after it started raced with its first write).
fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    writer.into()
}

/// A small, short run's flags (20,000 requests/s, latencies 5/15 ms, timeout 50 ms).
const SMALL: [&str; 8] = [
    "--rate",
    "20000",
    "--pct50",
    "5",
    "--pct75",
    "15",
    "--timeout",
    "50",
];

/// The load generator on [`SMALL`] and `args`, its standard output closed from the start: the
/// status and its standard error.
fn with_stdout_closed(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args(SMALL)
        .args(args)
        .stdout(closed_pipe())
        .output()
        .expect("the load generator runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A report that cannot be written to standard output (its reader gone: `| head -1`) is an
/// error with status 2 and a message, as a plot that cannot be written is: `println!` panicked
/// (status 101 and a backtrace), and `--find-max-rate`, whose header comes first, ran every
/// probe (minutes at the defaults) before panicking on its result line.
#[test]
fn a_closed_stdout_is_an_error_not_a_panic() {
    let (code, stderr) = with_stdout_closed(&["--num", "2000", "--progress", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("error: cannot write the report") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // The search stops at its header, before its first probe.
    let (code, stderr) = with_stdout_closed(&["--find-max-rate", "--num", "2000"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("error: cannot write the report") && !stderr.contains("  rate "),
        "{stderr}"
    );
}

/// W1, W1x2, W2, W3, W5 and wake-cost with a closed standard output: status 2 and a message.
/// They printed with `println!`, which panicked (status 101 and a backtrace) at the first line.
#[test]
fn every_workload_reports_a_closed_stdout_with_status_2() {
    for args in [
        &["wake-cost", "--count", "1", "--period-us", "1"][..],
        &[
            "w1",
            "--n",
            "2000",
            "--runs",
            "1",
            "--impls",
            "wheel",
            "--no-bytes",
        ],
        &["w5", "--sizes", "2,1000", "--runs", "1", "--impls", "wheel"],
        &[
            "w1x2",
            "--n",
            "2000",
            "--runs",
            "1",
            "--impls",
            "concurrent-wheel",
        ],
        &[
            "w2",
            "--n",
            "100",
            "--range-ms",
            "5",
            "--impls",
            "system-timer",
        ],
        &[
            "w3",
            "--seconds",
            "0.01",
            "--settle-ms",
            "0",
            "--impls",
            "no-timer",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
            .args(args)
            .stdout(closed_pipe())
            .output()
            .expect("the load generator runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("error: cannot write the report") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
}

/// The examples with a closed standard output: status 2 and a message, after their checks ran
/// (the broker's verdict is its last line; a failed check would be status 1). They printed with
/// `println!`, which panicked at the first line: status 101, a backtrace, the checks never run.
/// `cargo test` builds the examples beside the test binaries (`target/<profile>/examples`).
#[test]
fn the_examples_report_a_closed_stdout_with_status_2() {
    let deps = std::env::current_exe().expect("the test binary's path");
    let dir = deps
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .join("examples");
    for name in ["ttl", "broker"] {
        let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        assert!(
            path.exists(),
            "{} not built: run this test through `cargo test`, which builds the examples \
             (`--test closed_output` alone builds only this file)",
            path.display()
        );
        let out = Command::new(&path)
            .stdout(closed_pipe())
            .output()
            .expect("the example runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains("error: cannot write the report") && !stderr.contains("panicked"),
            "{name}: {stderr}"
        );
    }
}
