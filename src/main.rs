//! The main job: `cargo run --release` runs the workloads of BENCHMARKS.md and prints tables.
#![allow(clippy::disallowed_methods)] // a benchmark driver spawns threads and reads the wall clock

use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};
use kafka_timer::churn::{
    self, ChurnFigures, ConcurrentWheelTarget, DelayQueueTarget, HeapTarget, KeyedTimerTarget,
    TimerTarget, TypedTimerTarget, WheelTarget,
};
use kafka_timer::measure::{at_least, exit_status, machine_line, to_stdout, while_stdout_taken};
use kafka_timer::{note, out};

/// jemalloc instead of the system allocator with feature `jemalloc` (off by default): why, and
/// what it changes, in the dependency's comment in Cargo.toml.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// With no subcommand: W4, the purgatory load generator (Kafka's TestPurgatoryPerformance shape),
/// at the low-timeout operating point and 100,000 requests/s unless flags say otherwise.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Kafka-style timer and purgatory: the workloads of BENCHMARKS.md",
    args_conflicts_with_subcommands = true,
    // `--rate -5` said "unexpected argument '-5'": a negative number is taken as the flag's
    // value, and the flag's own check says what is wrong with it (here and in each subcommand).
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    w4: kafka_timer::load::Args,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// W1 churn: add N tasks (1..=30000 ms), cancel 90%; ns/op per phase and bytes per task.
    #[command(allow_negative_numbers = true)]
    W1(W1Args),
    /// W1x2: two threads add and cancel concurrently on one timer; wall ns per op.
    #[command(allow_negative_numbers = true)]
    W1x2(kafka_timer::parallel::Args),
    /// W2 expiry precision: lateness percentiles, early / missing / duplicate fires, CPU.
    #[command(allow_negative_numbers = true)]
    W2(kafka_timer::precision::Args),
    /// W3 idle cost: CPU and reaper wake-ups over 10 s idle.
    #[command(allow_negative_numbers = true)]
    W3(kafka_timer::idle::Args),
    /// W4 purgatory load generator (the default command; same flags).
    #[command(allow_negative_numbers = true)]
    W4(kafka_timer::load::Args),
    /// W5 scale: W1's add and cancel ns/op at N = 10^4 .. 10^7 pending (delay range N × 0.03 ms).
    #[command(allow_negative_numbers = true)]
    W5(W5Args),
    /// The CPU time one thread sleep-and-wake costs on this machine (the floor under every
    /// workload whose threads wake once per tick).
    #[command(allow_negative_numbers = true)]
    WakeCost {
        /// Sleep length, µs (at most a second).
        #[arg(long, default_value_t = 1000,
              value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        period_us: u64,
        /// Sleeps.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// The time of one load from memory here, by ring size (32 KiB to 256 MiB): what each of
    /// the workloads' cache misses costs this hour (the machine's neighbours move it).
    MemLatency {
        /// Dependent loads timed per size.
        #[arg(long, default_value_t = 10_000_000,
              value_parser = clap::value_parser!(u64).range(1..=10_000_000_000))]
        loads: u64,
    },
    /// Internal: W1 on one implementation, in a process of its own; prints the median figures.
    #[command(hide = true)]
    ChurnProbe {
        #[command(flatten)]
        probe: Probe,
        #[arg(long)]
        runs: usize,
        #[arg(long)]
        warm: bool,
    },
    /// Internal: add N tasks to one implementation and print the peak RSS (bytes).
    #[command(hide = true)]
    RssProbe {
        #[command(flatten)]
        probe: Probe,
    },
}

/// What a probe subcommand (run in a child process of its own) measures: one implementation,
/// N tasks, the delay range.
#[derive(clap::Args, Debug)]
struct Probe {
    #[arg(long)]
    r#impl: String,
    #[arg(long)]
    n: usize,
    #[arg(long, value_parser = churn::range_ms())]
    range_ms: u64,
}

impl Probe {
    /// This binary, running the probe subcommand `sub` with these flags.
    fn command(&self, sub: &str) -> Result<Command, String> {
        let exe = kafka_timer::measure::this_program().map_err(|e| format!("{sub}: {e}"))?;
        Ok(self.command_of(exe, sub))
    }

    /// `program`, given the probe subcommand `sub` and these flags.
    fn command_of(&self, program: impl AsRef<std::ffi::OsStr>, sub: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.args([
            sub,
            "--impl",
            &self.r#impl,
            "--n",
            &self.n.to_string(),
            "--range-ms",
            &self.range_ms.to_string(),
        ]);
        cmd
    }
}

#[derive(clap::Args, Debug, Clone)]
struct W1Args {
    /// Tasks to add (at least 2: the cancel phase needs a task to cancel; at most 10^8).
    #[arg(long, default_value_t = 1_000_000, value_parser = kafka_timer::measure::task_count(2))]
    n: usize,
    /// Delay range in ms (delay = 1 + rand % range), at most 10^10.
    #[arg(long, default_value_t = 30_000, value_parser = churn::range_ms())]
    range_ms: u64,
    /// Runs per implementation (the table shows medians).
    #[arg(long, default_value_t = 3, value_parser = at_least(1))]
    runs: usize,
    /// Implementations, comma separated.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(churn::IMPLS),
          default_values_t = churn::IMPLS.iter().map(|s| s.to_string()))]
    impls: Vec<String>,
    /// Skip the bytes-per-task probes (two child processes per implementation).
    #[arg(long)]
    no_bytes: bool,
    /// Measure a warmed-up structure (filled and emptied once first): the steady state of a
    /// long-lived timer, without first-touch page faults. Default: a fresh structure per run.
    #[arg(long)]
    warm: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct W5Args {
    /// Pending counts to measure (each at least 2: the cancel phase needs a task to cancel; at
    /// most 10^8).
    #[arg(long, value_delimiter = ',', value_parser = kafka_timer::measure::task_count(2),
          default_values_t = vec![10_000, 100_000, 1_000_000, 10_000_000])]
    sizes: Vec<usize>,
    /// Runs per point (medians).
    #[arg(long, default_value_t = 3, value_parser = at_least(1))]
    runs: usize,
    /// Implementations, comma separated.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(churn::IMPLS),
          default_values_t = churn::IMPLS.iter().map(|s| s.to_string()))]
    impls: Vec<String>,
    /// Measure warmed-up structures (see `w1 --warm`).
    #[arg(long)]
    warm: bool,
}

fn main() -> ExitCode {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    kafka_timer::measure::set_allocator("jemalloc");
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::W1(a)) => w1(&a),
        Some(Cmd::W1x2(a)) => return kafka_timer::parallel::run(&a),
        Some(Cmd::W2(a)) => return kafka_timer::precision::run(&a),
        Some(Cmd::W3(a)) => return kafka_timer::idle::run(&a),
        Some(Cmd::W4(a)) => return kafka_timer::load::run(&a),
        Some(Cmd::W5(a)) => w5(&a),
        Some(Cmd::WakeCost { period_us, count }) => {
            let (cpu_ns, wall) =
                kafka_timer::measure::wake_cost(std::time::Duration::from_micros(period_us), count);
            out!("machine: {}", machine_line());
            out!(
                "sleep {period_us} us x {count}: {:.1} us of CPU per sleep-and-wake (wall {:.1} us per sleep)",
                cpu_ns / 1e3,
                wall.as_secs_f64() * 1e6
            );
        }
        Some(Cmd::MemLatency { loads }) => {
            out!("machine: {}", machine_line());
            let line = kafka_timer::measure::LATENCY_SIZES
                .iter()
                .map(|&b| {
                    let ns = kafka_timer::measure::load_latency(b, loads);
                    format!("{} KiB {ns:.1}", b >> 10)
                })
                .collect::<Vec<_>>()
                .join(", ");
            out!("ns per dependent load, random ring of: {line}");
        }
        Some(Cmd::ChurnProbe { probe, runs, warm }) => {
            let delays = churn::delays(probe.n, probe.range_ms);
            let f = measure(&probe.r#impl, runs, warm, &delays);
            out!(
                "{} {} {} {}",
                f.add_ns,
                f.cancel_ns,
                f.add_cpu_ns,
                f.cancel_cpu_ns
            );
        }
        Some(Cmd::RssProbe { probe }) => {
            out!(
                "{}",
                churn::rss_probe(&probe.r#impl, probe.n, probe.range_ms)
            );
        }
        None => return kafka_timer::load::run(&cli.w4),
    }
    // W1's and W5's checks run in their probes' child processes: a failed one ends the run with
    // status 1 where it is found (`or_exit`). What is left is the report.
    exit_status(true)
}

fn measure(name: &str, runs: usize, warm: bool, delays: &[u64]) -> ChurnFigures {
    match name {
        "wheel" => churn::run_median(runs, delays, warm, WheelTarget::new),
        "concurrent-wheel" => churn::run_median(runs, delays, warm, ConcurrentWheelTarget::new),
        "binary-heap" => churn::run_median(runs, delays, warm, HeapTarget::default),
        "system-timer" => churn::run_median(runs, delays, warm, TimerTarget::new),
        "system-timer-typed" => churn::run_median(runs, delays, warm, TypedTimerTarget::new),
        "system-timer-keyed" => churn::run_median(runs, delays, warm, KeyedTimerTarget::new),
        "delay-queue" => churn::run_median(runs, delays, warm, DelayQueueTarget::new),
        other => {
            note!("unknown implementation {other}; known: {:?}", churn::IMPLS);
            std::process::exit(2);
        }
    }
}

impl Probe {
    /// Runs the probe subcommand `sub` (with `extra` flags) in a child process and returns its
    /// standard output as `parse` reads it; on failure (no child, a non-zero exit, or output
    /// `parse` rejects), a message with the child's standard error.
    fn run<T>(
        &self,
        sub: &str,
        extra: &[&str],
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, String> {
        self.run_command(self.command(sub)?, sub, extra, parse)
    }

    /// [`run`](Self::run) with the command given.
    fn run_command<T>(
        &self,
        mut cmd: Command,
        sub: &str,
        extra: &[&str],
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, String> {
        let what = format!("{sub} on {} (N = {})", self.r#impl, self.n);
        kafka_timer::measure::run_child(cmd.args(extra), &what, parse)
    }
}

/// Prints a probe's failure and exits with status 1: a figure that could not be measured is
/// an error, never a silent gap in the table.
fn or_exit<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| {
        note!("error: {e}");
        std::process::exit(1);
    })
}

/// W1 on implementation `name` in a child process: every implementation (and every W5 size)
/// starts from the same process state. In one process, the allocator keeps what an earlier run
/// freed (glibc raises its mmap and trim thresholds after a large free), so a later run skips
/// the page faults and unmaps an earlier one paid: the figures depended on the position in
/// `--impls`. Exits the process if the child fails (a lost task, an unknown name).
fn measure_in_child(name: &str, runs: usize, warm: bool, n: usize, range_ms: u64) -> ChurnFigures {
    let probe = Probe {
        r#impl: name.to_owned(),
        n,
        range_ms,
    };
    let runs = runs.to_string();
    let mut extra = vec!["--runs", &runs];
    if warm {
        extra.push("--warm");
    }
    or_exit(probe.run("churn-probe", &extra, parse_churn))
}

/// A churn probe's output: exactly four numbers (add and cancel ns per op, wall then CPU);
/// anything else (a stray line, a missing figure) is a failed probe.
fn parse_churn(stdout: &str) -> Option<ChurnFigures> {
    let [add_ns, cancel_ns, add_cpu_ns, cancel_cpu_ns] = kafka_timer::measure::numbers(stdout)?;
    Some(ChurnFigures {
        add_ns,
        cancel_ns,
        add_cpu_ns,
        cancel_cpu_ns,
    })
}

/// Bytes per pending task of `name`: the peak RSS of a child that adds `n` tasks, minus that
/// of one that adds none, over `n`. Exits the process if either child fails.
fn bytes_per_task(name: &str, n: usize, range_ms: u64) -> f64 {
    let rss = |n: usize| {
        let probe = Probe {
            r#impl: name.to_owned(),
            n,
            range_ms,
        };
        // 0: the child could not read its peak RSS (`VmHWM`), which no process has.
        or_exit(probe.run("rss-probe", &[], |stdout| {
            stdout.trim().parse::<u64>().ok().filter(|&b| b > 0)
        }))
    };
    let (full, empty) = (rss(n), rss(0));
    or_exit(bytes_over(full, empty, n).ok_or_else(|| {
        format!(
            "{name}: the peak RSS with {n} tasks ({full} bytes) is not above the empty \
             probe's ({empty}): no bytes-per-task figure (too few tasks to measure; --no-bytes \
             skips it)"
        )
    }))
}

/// Bytes per task: the RSS of `n` tasks (`full`) over that of none (`empty`); `None` if it is
/// not above it (a figure of 0 met any memory target).
fn bytes_over(full: u64, empty: u64, n: usize) -> Option<f64> {
    (full > empty).then(|| (full - empty) as f64 / n.max(1) as f64)
}

fn w1(a: &W1Args) {
    out!(
        "W1 churn: N = {}, delay 1..={} ms, cancel 90%, medians of {} runs, {} structures",
        a.n,
        a.range_ms,
        a.runs,
        if a.warm { "warmed-up" } else { "fresh" }
    );
    out!("machine: {}", machine_line());
    out!(
        "{:<18} {:>10} {:>12} {:>12} {:>14} {:>12}",
        "impl",
        "add ns/op",
        "cancel ns/op",
        "add cpu ns",
        "cancel cpu ns",
        "bytes/task"
    );
    for name in while_stdout_taken(&a.impls) {
        let f = measure_in_child(name, a.runs, a.warm, a.n, a.range_ms);
        let bytes = if a.no_bytes {
            None
        } else {
            Some(bytes_per_task(name, a.n, a.range_ms))
        };
        out!(
            "{:<18} {:>10.1} {:>12.1} {:>12.1} {:>14.1} {:>12}",
            name,
            f.add_ns,
            f.cancel_ns,
            f.add_cpu_ns,
            f.cancel_cpu_ns,
            bytes.map_or("-".into(), |b| format!("{b:.1}"))
        );
    }
}

fn w5(a: &W5Args) {
    out!(
        "W5 scale: add / cancel ns/op by pending N (delay range N × 0.03 ms), medians of {} runs, {} structures",
        a.runs,
        if a.warm { "warmed-up" } else { "fresh" }
    );
    out!("machine: {}", machine_line());
    to_stdout(format_args!("{:<18}", "impl"));
    for n in &a.sizes {
        to_stdout(format_args!(" {:>18}", format!("N={n}")));
    }
    out!(" {:>12}", churn::scale_ratio_label(&a.sizes));
    for name in while_stdout_taken(&a.impls) {
        to_stdout(format_args!("{name:<18}"));
        let mut first = None;
        let mut last = None;
        for &n in while_stdout_taken(&a.sizes) {
            let range = ((n as f64) * 0.03).round().max(1.0) as u64;
            let f = measure_in_child(name, a.runs, a.warm, n, range);
            to_stdout(format_args!(
                " {:>18}",
                format!("{:.1} / {:.1}", f.add_ns, f.cancel_ns)
            ));
            first.get_or_insert(f);
            last = Some(f);
        }
        if let (Some(a0), Some(a1)) = (first, last) {
            to_stdout(format_args!(
                " {:>12}",
                format!(
                    "{:.2} / {:.2}",
                    a1.add_ns / a0.add_ns,
                    a1.cancel_ns / a0.cancel_ns
                )
            ));
        }
        out!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_timer::measure::MAX_TASKS;

    fn probe() -> Probe {
        Probe {
            r#impl: "wheel".into(),
            n: 10,
            range_ms: 5,
        }
    }

    /// A probe child that fails (non-zero exit) or prints what the parser rejects is an error
    /// naming the probe, never a figure (the bytes column used to show "-" and exit 0).
    #[test]
    fn a_failed_or_unparsable_probe_is_an_error() {
        let p = probe();
        let failed = p.run_command(p.command_of("false", "rss-probe"), "rss-probe", &[], |_| {
            Some(0u64)
        });
        let e = failed.unwrap_err();
        assert!(e.contains("rss-probe on wheel (N = 10) failed"), "{e}");
        // `echo` succeeds and prints its arguments: not a number.
        let unparsable = p.run_command(p.command_of("echo", "rss-probe"), "rss-probe", &[], |s| {
            s.trim().parse::<u64>().ok()
        });
        assert!(unparsable
            .unwrap_err()
            .contains("failed in its child process"));
        let missing = p.run_command(
            p.command_of("/nonexistent/kafka-timer", "rss-probe"),
            "rss-probe",
            &[],
            |_| Some(0u64),
        );
        assert!(missing
            .unwrap_err()
            .contains("could not run the child process"));
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kafka-timer").chain(args.iter().copied()))
    }

    /// A zero task count or run count measured nothing, yet printed figures for it (W1 and W1x2
    /// divided by `max(1)`, W2 passed its check on no task, `--runs 0` claimed medians of 0
    /// runs): the parser refuses them, as W5 does. One task (`i = 0`, kept) left W1's and
    /// W1x2's cancel phase nothing to cancel, yet it printed a cancel ns/op: refused too.
    #[test]
    fn zero_tasks_or_runs_are_refused() {
        for args in [
            &["w1", "--n", "0"][..],
            &["w1", "--n", "1"],
            &["w1", "--runs", "0"],
            &["w1x2", "--n", "0"],
            &["w1x2", "--n", "1"],
            &["w1x2", "--runs", "0"],
            &["w2", "--n", "0"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
        for args in [
            &["w1", "--n", "2", "--runs", "1"][..],
            &["w1x2", "--n", "2", "--runs", "1"],
            &["w2", "--n", "1"],
        ] {
            assert!(parse(args).is_ok(), "{args:?} refused");
        }
    }

    /// W5's sizes are a list, each value checked by the parser as W1's `--n` is: a size of 0 or
    /// 1 (no task to cancel) or past `MAX_TASKS`, and zero runs, are refused, naming the value.
    /// A check after parsing refused them with one message for all three ("every --sizes value
    /// must be at least 2 ... and --runs at least 1", for `--runs 0` too), naming no value.
    #[test]
    fn w5_refuses_sizes_with_nothing_to_cancel() {
        let refused = |args: &[&str]| {
            let e = parse(&[&["w5"][..], args].concat()).expect_err("refused");
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{args:?}: {e}"
            );
            e.to_string()
        };
        let e = refused(&["--sizes", "10,1"]);
        assert!(e.contains("'1'") && e.contains("--sizes"), "{e}");
        assert!(refused(&["--sizes", "0"]).contains("--sizes"));
        let e = refused(&["--runs", "0"]);
        assert!(
            e.contains("'0'") && e.contains("--runs") && !e.contains("--sizes"),
            "{e}"
        );
        let too_many = (MAX_TASKS + 1).to_string();
        assert!(refused(&["--sizes", &format!("2,{too_many}")]).contains(&too_many));
        for args in [
            &["--sizes", "2,10", "--runs", "1"][..],
            &[],
            &["--sizes", &MAX_TASKS.to_string()],
        ] {
            match parse(&[&["w5"][..], args].concat())
                .expect("parsed")
                .command
            {
                Some(Cmd::W5(_)) => {}
                other => panic!("not w5: {other:?}"),
            }
        }
    }

    /// A negative number is a flag's value, refused by that flag's own check (clap said
    /// "unexpected argument '-5' found"), at the top level and in the subcommands.
    #[test]
    fn negative_numbers_reach_the_flags_own_checks() {
        let cli = parse(&["--rate", "-5"]).expect("parsed");
        assert_eq!(cli.w4.rate, -5.0);
        assert!(kafka_timer::load::run(&cli.w4) == ExitCode::from(2));
        match parse(&["w3", "--seconds", "-1"]).expect("parsed").command {
            Some(Cmd::W3(a)) => assert_eq!(a.seconds, -1.0),
            other => panic!("not w3: {other:?}"),
        }
        // Unsigned flags: refused by their parser as a bad value, not as an unknown flag.
        for args in [
            &["w4", "--timeout", "-1"][..],
            &["w1", "--n", "-2"],
            &["wake-cost", "--count", "-1"],
        ] {
            let e = parse(args).expect_err("refused");
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{args:?}: {e}"
            );
        }
    }

    /// Task counts past `MAX_TASKS` panicked on a capacity overflow (w1x2, w2) or failed in a
    /// child process (w1): refused by the parser, the bound itself accepted. The waits in
    /// milliseconds past an hour hung the run (w2's grace, w3's settle) or overflowed the
    /// clock's arithmetic (w2's timeout); wake-cost's sleep past a second likewise.
    #[test]
    fn absurd_task_counts_and_waits_are_refused() {
        let (too_many, most) = ((MAX_TASKS + 1).to_string(), MAX_TASKS.to_string());
        let (too_long, longest) = (
            (kafka_timer::measure::MAX_WAIT_MS + 1).to_string(),
            kafka_timer::measure::MAX_WAIT_MS.to_string(),
        );
        for sub in ["w1", "w1x2", "w2"] {
            assert!(parse(&[sub, "--n", &too_many]).is_err(), "{sub}");
            assert!(
                parse(&[sub, "--n", "18446744073709551615"]).is_err(),
                "{sub}"
            );
            assert!(parse(&[sub, "--n", &most]).is_ok(), "{sub}");
        }
        for (sub, flag) in [
            ("w2", "--grace-ms"),
            ("w2", "--timeout-ms"),
            ("w3", "--settle-ms"),
        ] {
            assert!(parse(&[sub, flag, &too_long]).is_err(), "{sub} {flag}");
            assert!(parse(&[sub, flag, &longest]).is_ok(), "{sub} {flag}");
        }
        assert!(parse(&["wake-cost", "--period-us", "1000001"]).is_err());
        assert!(parse(&["wake-cost", "--period-us", "1000000"]).is_ok());
    }

    /// `wake-cost --count 0` timed no sleep and `--period-us 0` a sleep that returns at once
    /// (no wake-up): both printed "0.0 us of CPU per sleep-and-wake" and exited 0.
    #[test]
    fn wake_cost_refuses_no_sleep() {
        for args in [
            &["wake-cost", "--count", "0"][..],
            &["wake-cost", "--period-us", "0"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
        assert!(parse(&["wake-cost", "--period-us", "1", "--count", "1"]).is_ok());
    }

    /// `mem-latency --loads 0` would time nothing and print a latency of NaN.
    #[test]
    fn mem_latency_refuses_no_loads() {
        assert!(parse(&["mem-latency", "--loads", "0"]).is_err());
        assert!(parse(&["mem-latency", "--loads", "1"]).is_ok());
    }

    /// A delay range beyond what tokio-util's `DelayQueue` takes (2^36 ms, about 795 days) made
    /// the `delay-queue` baseline panic ("invalid deadline") mid-table: refused up front.
    #[test]
    fn delay_ranges_beyond_the_baselines_are_refused() {
        let too_long = (churn::MAX_RANGE_MS + 1).to_string();
        let longest = churn::MAX_RANGE_MS.to_string();
        for sub in ["w1", "w1x2"] {
            assert!(parse(&[sub, "--range-ms", &too_long]).is_err(), "{sub}");
            assert!(parse(&[sub, "--range-ms", &longest]).is_ok(), "{sub}");
        }
        // W2 waits for every task to fire on the real clock: its range is a wait, at most an
        // hour (10^10 ms was taken, and the run then waited 116 days).
        let an_hour = kafka_timer::measure::MAX_WAIT_MS;
        assert!(parse(&["w2", "--range-ms", &an_hour.to_string()]).is_ok());
        assert!(parse(&["w2", "--range-ms", &(an_hour + 1).to_string()]).is_err());
    }

    /// Bytes per task only when the tasks' RSS is above the empty probe's: an unreadable peak
    /// (0) or a smaller one was printed as 0.0 bytes per task.
    #[test]
    fn bytes_per_task_needs_the_tasks_rss_above_the_empty_probes() {
        assert_eq!(bytes_over(3_000, 1_000, 100), Some(20.0));
        assert_eq!(bytes_over(1_000, 1_000, 100), None);
        assert_eq!(bytes_over(900, 1_000, 100), None);
    }

    /// An unknown implementation name used to surface only when its turn came, in a child
    /// process, after the implementations before it had been measured (minutes, for W5 at
    /// 10^7): the parser refuses it up front, as the other workloads' do.
    #[test]
    fn unknown_implementations_are_refused_up_front() {
        for sub in ["w1", "w5"] {
            assert!(
                parse(&[sub, "--impls", "wheel,delay_queue"]).is_err(),
                "{sub}"
            );
            assert!(
                parse(&[sub, "--impls", "wheel,delay-queue"]).is_ok(),
                "{sub}"
            );
        }
    }

    /// A churn probe's output is four numbers and nothing else: a stray word among them was
    /// skipped, and the four numbers around it taken as the figures.
    #[test]
    fn a_churn_probe_prints_exactly_four_numbers() {
        let f = parse_churn("1.5 2 3 4.25\n").expect("four numbers");
        assert_eq!(
            (f.add_ns, f.cancel_ns, f.add_cpu_ns, f.cancel_cpu_ns),
            (1.5, 2.0, 3.0, 4.25)
        );
        for bad in ["1 2 3", "1 2 3 4 5", "1 2 warning 3 4", ""] {
            assert!(parse_churn(bad).is_none(), "{bad:?}");
        }
    }

    /// A child that succeeds hands its parsed output back, extra flags included.
    #[test]
    fn a_probe_that_succeeds_returns_its_parsed_output() {
        let p = probe();
        let got = p.run_command(
            p.command_of("echo", "churn-probe"),
            "churn-probe",
            &["--warm"],
            |s| Some(s.trim().to_owned()),
        );
        assert_eq!(
            got.unwrap(),
            "churn-probe --impl wheel --n 10 --range-ms 5 --warm"
        );
    }
}
