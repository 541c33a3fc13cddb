//! W4's progress lines, read from the load generator's standard error.

use std::process::Command;

/// The progress line's expired count of a `--harness-only` run: every request here expires
/// (latency 1 s, timeout 5 ms), which the completer logs as it does in a real run's place; the
/// line counted them as completed and showed "expired 0" throughout.
#[test]
fn harness_only_progress_counts_the_expiries() {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args([
            "--harness-only",
            "--num",
            "3000",
            "--rate",
            "2000",
            "--pct50",
            "1000",
            "--pct75",
            "1000",
            "--timeout",
            "5",
            "--progress",
            "0.5",
        ])
        .output()
        .expect("the load generator runs");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rfind(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no progress line in {stderr:?}"));
    let number_after = |word: &str| -> u64 {
        let mut it = last.split_whitespace();
        it.find(|w| *w == word);
        it.next().and_then(|v| v.parse().ok()).expect(word)
    };
    let (completed, expired) = (number_after("completed"), number_after("expired"));
    assert!(
        completed > 0 && expired == completed,
        "every request done so far expired: {last}"
    );
}
