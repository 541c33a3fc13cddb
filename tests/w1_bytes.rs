//! W1's bytes-per-task column: the peak RSS of a child that adds the tasks, minus that of one
//! that adds none, over the tasks. These run the built binary, as a user does.

use std::process::Command;

/// Each implementation's row ends in a plausible bytes-per-task figure: more than a task's
/// 8-byte deadline, less than a 4 KiB page per task (20,000 tasks take several pages, so the
/// two probes' peak RSS differ).
#[test]
fn each_row_ends_in_the_bytes_a_pending_task_takes() {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args(["w1", "--n", "20000", "--runs", "1"])
        .args(["--impls", "wheel,binary-heap"])
        .output()
        .expect("the load generator runs");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    for name in ["wheel", "binary-heap"] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row in:\n{stdout}"));
        let bytes: f64 = row
            .split_whitespace()
            .last()
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("no bytes/task figure in: {row}"));
        assert!(bytes > 8.0 && bytes < 4096.0, "{row}");
    }
}
