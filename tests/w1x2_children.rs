//! W1x2 measures each implementation's row in a child process of its own (`--child-row`), as
//! W1 does: in one process, a row found the memory the allocator had kept from the rows before
//! it. These run the built binary, as a user does.

use std::process::Command;

fn w1x2(flags: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kafka-timer"))
        .args(["w1x2", "--n", "4000", "--runs", "1"])
        .args(flags)
        .output()
        .expect("the load generator runs")
}

/// The table has a row of figures for each implementation (each measured by a child: the
/// parent has only the child's numbers to print).
#[test]
fn the_table_has_a_row_of_figures_for_each_implementation() {
    let out = w1x2(&["--impls", "concurrent-wheel,binary-heap"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    for name in ["concurrent-wheel", "binary-heap"] {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {text}"));
        let figures: Vec<f64> = row
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().expect("a number"))
            .collect();
        assert_eq!(figures.len(), 9, "{row}");
        assert!(figures.iter().all(|v| v.is_finite() && *v > 0.0), "{row}");
    }
}

/// A child row prints nine numbers and nothing else; asked for two implementations it refuses
/// with status 1 instead of measuring one of them.
#[test]
fn a_child_row_prints_nine_numbers_and_measures_one_implementation() {
    let out = w1x2(&["--impls", "concurrent-wheel", "--child-row"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let numbers: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().expect("only numbers"))
        .collect();
    assert_eq!(numbers.len(), 9, "{text}");

    let two = w1x2(&["--impls", "concurrent-wheel,binary-heap", "--child-row"]);
    assert_eq!(two.status.code(), Some(1), "{two:?}");
    assert!(two.stdout.is_empty(), "{two:?}");
}
