//! `--baseline`'s harness-alone run measures memory as a run of its own does: it runs in a new
//! process. It used to run after the main run in the same process, on the memory the allocator
//! had kept from it: its RSS growth, "bytes per pending request", came out at a few bytes
//! (4 to 12 at 100,000 requests) against about 370 for `--harness-only` run on its own.

use std::process::Command;

/// Runs the load generator with `flags` (and `--json`, no progress) and returns its JSON line.
fn json_run(flags: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args([
            "--num",
            "50000",
            "--rate",
            "50000",
            "--progress",
            "0",
            "--json",
        ])
        .args(flags)
        .output()
        .expect("the load generator runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The number after `"name":` in `json` (the first one after `from`).
fn number(json: &str, from: usize, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = json[from..].find(&key).map(|i| from + i + key.len());
    let at = at.unwrap_or_else(|| panic!("no {name} in {json}"));
    let end = json[at..].find([',', '}']).map_or(json.len(), |i| at + i);
    json[at..end]
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {:?} is not a number", &json[at..end]))
}

#[test]
fn the_baseline_measures_the_harness_memory_as_a_run_of_its_own() {
    let with_baseline = json_run(&["--baseline"]);
    let baseline_at = with_baseline
        .find("\"baseline\":{")
        .expect("a baseline object");
    let in_baseline = number(&with_baseline, baseline_at, "bytes_per_pending");
    let alone = json_run(&["--harness-only"]);
    let on_its_own = number(&alone, 0, "bytes_per_pending");
    // Both runs' tables grow by the same pages; the RSS figures of a shared machine differ a
    // little from run to run, not by the factor of 30 or more that memory reused from the
    // earlier run made.
    assert!(
        on_its_own > 50.0 && in_baseline > on_its_own / 2.0 && in_baseline < on_its_own * 2.0,
        "harness alone: {in_baseline:.1} bytes per pending request as --baseline, \
         {on_its_own:.1} run on its own"
    );
}
