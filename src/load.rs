//! W4: the purgatory load generator (the main job), in the shape of Kafka's
//! TestPurgatoryPerformance (BENCHMARKS.md W4).
//!
//! Requests arrive at a target rate with exponential gaps; each has a log-normal completion
//! latency (μ = ln p50, σ = (ln p75 − μ) / 0.674490) and a timeout. A generator thread issues
//! them into a [`Purgatory`] with `try_complete_else_watch`; a completer thread completes each
//! one at its latency if that is below the timeout; the purgatory's timer expires the rest.
//!
//! * `kafka` model (Kafka's tool): every request watches the same keys (drawn once); the
//!   completer calls `force_complete` on the request's handle.
//! * `watch` model (a broker): each request watches its own keys drawn from the key space; the
//!   completer marks the request ready and calls `check_and_complete` on each of its keys.
//!   Each request gives its id to the purgatory's ready test (`Builder::with_ready_test`: a
//!   type of its own, inlined into the check's scan), which reads its ready flag, so checks
//!   skip the requests not yet ready without their locks or even reading them
//!   (`--ready-hint false`: Kafka's check, every watcher locked and asked).
//!
//! Differences from Kafka's tool, on purpose: latencies and gaps are not truncated to whole ms
//! (so no request completes at its first try); keys are `u32` ids rather than strings; the
//! generator sleeps between bursts instead of per request (no spinning, so its CPU is honest);
//! the completer waits on a millisecond calendar queue ([`CompletionQueue`]) rather than a
//! `DelayQueue`; progress is sampled by the generator between bursts, not by a thread of its own;
//! the completer is woken by the generator (which wakes every millisecond anyway at these rates)
//! once a request is due, rather than by a timer of its own (kept as the fallback, one completer
//! tick later, and used alone with `--completer-wake timer`): on the machines measured, a timer
//! wake-up costs a thread about three times what a wake-up from a running thread does.
//!
//! The timer is built with the reaper grace the purgatory suggests for busy purgatories
//! (`purgatory::BUSY_REAPER_GRACE`, 2 ms; `--reaper-grace-ms`), so the generator's
//! `try_complete_else_watch` calls advance the timer once a bucket is due (the purgatory's own
//! behaviour with that setting, not the harness's) and the reaper sleeps through while requests
//! arrive; `--reaper-grace-ms 0` (the purgatory's default) has the reaper wake for every bucket,
//! as Kafka's does.
//! The harness's own costs are counted in the CPU figure (as in Kafka's tool), so it keeps them
//! small: one cache line of bookkeeping per request, no shared counter, a wake-up per
//! millisecond at most per thread. The report splits the CPU by thread and estimates the share
//! that is thread wake-ups.
#![allow(clippy::disallowed_methods)] // benchmark code: std threads and clocks on purpose

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{
    fence, AtomicBool, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use purgatory::{DelayedOperation, OperationHandle, Purgatory, ReadyTest};
use system_timer::SystemTimer;

use crate::completion::CompletionQueue;
use crate::done_log::{self, Breach, Done};
use crate::measure::{
    exit_status, exit_status_written, live_threads, machine_line, peak_rss_bytes, prefaulted,
    process_cpu_ns, reset_peak_rss, rss_bytes, this_thread, to_stderr, to_stdout, ThreadUse,
};
use crate::note;
use crate::rng::SplitMix64;

/// How requests are completed before their timeout.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Kafka's tool: all requests watch the same keys; the completer forces completion.
    Kafka,
    /// A broker: per-request keys; the completer marks ready and checks each key.
    Watch,
}

/// What wakes the W4 completer (see [`Args::completer_wake`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompleterWake {
    /// The generator unparks it after a burst once something is due; its own timer is the
    /// fallback, one completer tick late.
    Generator,
    /// Its own timer, at the due time. (In both modes the generator also wakes it when it sends
    /// a request due more than a completer tick before the time it sleeps towards.)
    Timer,
}

/// Flags of the load generator (the default command).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Requests to issue, at most 2^31 (refused if their tables, 65 bytes a request plus 4 a key
    /// in the `watch` model, are more than the machine's memory).
    #[arg(long, default_value_t = 1_000_000)]
    pub num: usize,
    /// Target request rate (requests per second, 1 to 10^9).
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Median completion latency, ms (low-timeout point: 20; high-timeout point: 200).
    #[arg(long, default_value_t = 20.0)]
    pub pct50: f64,
    /// 75th-percentile completion latency, ms (low-timeout point: 60; high-timeout point: 400).
    #[arg(long, default_value_t = 60.0)]
    pub pct75: f64,
    /// Request timeout, ms.
    #[arg(long, default_value_t = 200)]
    pub timeout: u64,
    /// Keys per request.
    #[arg(long, default_value_t = 3)]
    pub keys: usize,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100)]
    pub key_space: u32,
    /// Completion model.
    #[arg(long, value_enum, default_value_t = Model::Kafka)]
    pub model: Model,
    /// Timer tick, ms.
    #[arg(long, default_value_t = 1.0)]
    pub tick_ms: f64,
    /// Timer wheel size.
    #[arg(long, default_value_t = 20)]
    pub wheel_size: usize,
    /// The timer's reaper grace, ms (see `system_timer::Builder::reaper_grace`): the first new
    /// request after a bucket is due advances the timer on the generator's thread (the reaper
    /// sleeps through), and the reaper's own timer fires this much later. Default:
    /// the purgatory's suggestion for busy purgatories (`BUSY_REAPER_GRACE`, 2 ms); 0 (the
    /// purgatory's default): the reaper's own timer at each bucket's time. After the last
    /// request no new one advances the timer: the last expiries come up to this much late, and
    /// the run lasts that much longer (at most 3,600,000).
    #[arg(long, default_value_t = purgatory::BUSY_REAPER_GRACE.as_secs_f64() * 1000.0)]
    pub reaper_grace_ms: f64,
    /// Purgatory purge interval (completed watched operations between purges, at least 1).
    #[arg(long, default_value_t = 1000)]
    pub purge_interval: usize,
    /// Timer executor threads (expiries run there), at most 256; 0 (the purgatory's default)
    /// runs expiries on the thread that advances the timer: the reaper, or with a reaper grace
    /// mostly the generator.
    #[arg(long, default_value_t = 0)]
    pub executors: usize,
    /// Random seed (splitmix64).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// The completer's granularity, µs: it wakes at most this often (Kafka's tool completes at
    /// whole-ms granularity; finer costs the harness CPU that is counted in the figures).
    #[arg(long, default_value_t = 1000)]
    pub completer_tick_us: u64,
    /// `watch` model: each request gives its id to the purgatory's ready test (a lock-free read
    /// of its ready flag, `purgatory::Builder::with_ready_test`), so a key's check skips the
    /// requests that are not ready without taking their locks or reading them;
    /// `false`: every check locks every pending watcher and calls `try_complete`, as Kafka's
    /// `checkAndComplete` does. (The `kafka` model never checks keys.)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub ready_hint: bool,
    /// What wakes the completer when a request is due: `generator` (the generator, which wakes
    /// every millisecond anyway at these rates, unparks it after its burst; the completer's own
    /// timer, set one completer tick past the due time, only steps in when the generator is
    /// late or done) or `timer` (its own timer at the due time: a timer wake-up per millisecond
    /// for the completer too, three times the CPU of a wake-up from a running thread here).
    /// Either way, a batch holding a request due more than a completer tick before the time the
    /// completer sleeps towards wakes it (a short latency issued at a low rate).
    #[arg(long, value_enum, default_value_t = CompleterWake::Generator)]
    pub completer_wake: CompleterWake,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub progress: f64,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw the completion-delay distribution and the achieved rate over time to this SVG file
    /// (its name must end in .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Search for the highest rate sustained (achieved within 2% of the rate its schedule asks
    /// for, the target up to the draws' chance, and checks passing), starting from --rate
    /// (with fewer than 10,000 requests it warns: the answer is then mostly noise). Each probe
    /// runs in a new process.
    #[arg(long)]
    pub find_max_rate: bool,
    /// Run the harness alone: the same arrivals, bursts, sleeps, batches, completer wake-ups
    /// and completion logs, but no purgatory and no timer; the completer logs each request at
    /// its latency, or at its timeout as an expiry. Its CPU is the floor the harness puts under
    /// every W4 figure (mostly the two threads' wake-ups).
    #[arg(long)]
    pub harness_only: bool,
    /// After the run, run the harness alone with the same flags (`--harness-only`), in a new
    /// process, and report its CPU beside the run's: the difference is the purgatory's own
    /// share. Not with --harness-only.
    #[arg(long)]
    pub baseline: bool,
    /// Internal: run once and print the report in a line format of its own (`to_wire`), for a
    /// parent process that runs its `--baseline` run or its `--find-max-rate` probes each in a
    /// process of their own (`run_in_child`).
    #[arg(long, hide = true)]
    pub child_run: bool,
}

/// The command line's defaults (W4's default point), for runs built in code: `Args { num: 1000,
/// ..Args::default() }`.
impl Default for Args {
    fn default() -> Self {
        use clap::{Args as _, FromArgMatches as _};
        let cmd = Args::augment_args(clap::Command::new("w4"));
        Args::from_arg_matches(&cmd.get_matches_from(["w4"])).expect("the defaults parse")
    }
}

impl Args {
    /// Checks use the ready test: asked for, and in the `watch` model (the only one that checks
    /// keys).
    fn uses_ready_hints(&self) -> bool {
        self.ready_hint && self.model == Model::Watch
    }
}

/// Per-request state the operations and the completer share. Leaked for the run (`&'static`),
/// so operations reference it without a shared reference count (which the generator and the
/// completer would bounce between cores).
struct Shared {
    start: Instant,
    /// The run's id in the completion logs ([`done_log`]).
    run: u64,
    /// Set by the completer before it checks the keys (watch model). Every check reads the flag
    /// of each operation on its key, so the flags of the pending requests (consecutive ids)
    /// should share as few cache lines as possible (a byte each).
    ready: &'static [AtomicBool],
    /// The completer's next due time (ns since start) while it sleeps and the generator runs;
    /// `u64::MAX` otherwise. The generator wakes it when it sends a batch holding a request due
    /// more than a completer tick earlier (both wake modes), and ([`CompleterWake::Generator`])
    /// once this time has passed.
    completer_due_ns: AtomicU64,
    /// True while the generator issues requests (and so wakes the completer).
    generating: AtomicBool,
    /// Requests give their id to the purgatory's ready test, which reads their flag
    /// ([`Args::ready_hint`], `watch` model only).
    ready_hint: bool,
    /// Requests the completer has logged, `--harness-only` runs only (added once per wake-up;
    /// the run waits on it and the progress display reads it).
    harness_done: AtomicU64,
    /// Of those, the ones logged as expiries (for the progress display's expired count).
    harness_expired: AtomicU64,
    // Totals come from the purgatory's own (per-thread striped) counters: a shared counter
    // here, bumped by the completer and the executor on every completion, cost more than the
    // purgatory's whole completion path.
}

/// `'static` slices of flags that runs borrow and give back, so that a process running many
/// runs (`--find-max-rate`'s probes, `--baseline`, the tests) allocates flags for its largest
/// run once, not for every run: each leaked slice used to stay in the RSS of every later run.
/// A run that panics never gives its slice back; that one stays leaked.
#[allow(clippy::disallowed_types)] // a std mutex in the benchmark harness, not the library
struct FlagPool(std::sync::Mutex<Vec<&'static [AtomicBool]>>);

/// The flags of [`Shared::ready`].
static READY_FLAGS: FlagPool = FlagPool::new();

#[allow(clippy::disallowed_types)]
impl FlagPool {
    const fn new() -> Self {
        FlagPool(std::sync::Mutex::new(Vec::new()))
    }

    /// The list, whether or not a thread panicked holding it (a `Vec` push or removal leaves
    /// it whole).
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<&'static [AtomicBool]>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slice of at least `n` flags, all false, and touched (so in the RSS from now on): the
    /// smallest given back that is long enough, else a new one of exactly `n`.
    fn take(&self, n: usize) -> &'static [AtomicBool] {
        let reused = {
            let mut pool = self.list();
            let best = (0..pool.len())
                .filter(|&i| pool[i].len() >= n)
                .min_by_key(|&i| pool[i].len());
            best.map(|i| pool.swap_remove(i))
        };
        match reused {
            Some(flags) => {
                for f in flags {
                    f.store(false, Relaxed);
                }
                flags
            }
            None => (0..n)
                .map(|_| AtomicBool::new(false))
                .collect::<Vec<_>>()
                .leak(),
        }
    }

    /// Gives back a slice [`take`](Self::take) returned, once nothing reads it any more.
    fn give(&self, flags: &'static [AtomicBool]) {
        self.list().push(flags);
    }
}

/// The purgatory's ready test: a request's ready flag, by the id it gave
/// ([`FakeOp::ready_arg`]). A type of its own, so that a check's scan reads the flag inline
/// (`purgatory::Builder::with_ready_test`) instead of calling a closure per watcher.
struct ReadyFlags(&'static [AtomicBool]);

impl ReadyTest<u32> for ReadyFlags {
    #[inline]
    fn maybe_ready(&self, _key: &u32, id: u64) -> bool {
        self.0[id as usize].load(Acquire)
    }
}

struct FakeOp {
    id: u32,
    s: &'static Shared,
}

impl DelayedOperation for FakeOp {
    fn try_complete(&mut self) -> bool {
        self.s.ready[self.id as usize].load(Acquire)
    }
    fn ready_arg(&self) -> Option<u64> {
        self.s.ready_hint.then_some(u64::from(self.id))
    }
    fn on_complete(&mut self) {
        done_log::push(
            self.s.run,
            Done {
                at_ns: self.s.start.elapsed().as_nanos() as u64,
                id: self.id,
                expired: false,
                breach: Breach::None,
            },
        );
    }
    fn on_expiration(&mut self) {
        done_log::mark_expired(self.s.run, self.id, || {
            self.s.start.elapsed().as_nanos() as u64
        });
    }
}

/// One thread (or group of threads) of a run: where the CPU went.
#[derive(Debug, Clone, Default)]
pub struct ThreadRow {
    /// `generator` (which also samples the progress), `completer`, or `timer` (its reaper and
    /// executors).
    pub name: &'static str,
    /// Its CPU seconds per million requests.
    pub cpu_s_per_million: f64,
    /// Its sleeps (wake-ups) per second.
    pub sleeps_per_s: f64,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The flags of the run.
    pub model: String,
    /// Requests.
    pub num: usize,
    /// Target rate, req/s.
    pub target_rate: f64,
    /// Achieved issue rate, req/s.
    pub achieved_rate: f64,
    /// Wall seconds until every request completed.
    pub elapsed_s: f64,
    /// Process CPU seconds per million requests (all threads).
    pub cpu_s_per_million: f64,
    /// Times a thread of the process went to sleep (voluntary context switches), per second of
    /// the run: each costs a wake-up (see the `wake-cost` subcommand for its CPU price here).
    pub sleeps_per_s: f64,
    /// The CPU one sleep and wake-up of a thread cost on this machine, µs, measured just before
    /// the run (200 sleeps of 1 ms on a thread of its own; noisy, ±20% on a shared machine).
    pub wake_cost_us: f64,
    /// The time of one dependent load from a random 32 MiB ring of cache lines, ns, measured
    /// just before the run ([`crate::measure::load_latency`], 1,000,000 loads): what a cache
    /// miss to memory cost that hour. The purgatory's share of the CPU figure follows it on a
    /// shared machine (HISTORY.md, 2026-11-29).
    pub mem_latency_ns: f64,
    /// `sleeps × wake_cost_us` per million requests: an estimate of the part of the CPU figure
    /// that is the threads' wake-ups rather than work; an upper one, since `wake_cost_us` is a
    /// timer wake-up's and the completer is mostly woken by the running generator, which costs
    /// it less (at 50,000 req/s on a fast machine it can come close to the whole figure).
    pub wakeups_s_per_million: f64,
    /// CPU and sleeps of the generator, the completer and the timer's threads.
    pub threads: Vec<ThreadRow>,
    /// Peak RSS of the process, bytes.
    pub peak_rss: u64,
    /// Peak RSS minus the RSS before the run, divided by the peak number of pending requests;
    /// `None` if nothing was ever pending (every request completed at its first try).
    pub bytes_per_pending: Option<f64>,
    /// Largest number of requests pending in the purgatory at once (sampled every 10 ms).
    pub peak_pending: usize,
    /// Requests completed before their timeout.
    pub completed_early: usize,
    /// Requests completed by expiry.
    pub expired: usize,
    /// Requests whose latency was at or above the timeout.
    pub expected_expired: usize,
    /// Requests whose latency is under the timeout by less than the tolerance (either outcome
    /// is right): the longer of the timer's tick and the completer's lateness (its own sleeps
    /// make it up to a `--completer-tick-us` late, two when the generator wakes it, turning
    /// such requests into expiries). Those at or past the timeout are never handed to the
    /// completer: they always expire.
    pub boundary: usize,
    /// Every request's `on_complete` ran exactly once.
    pub exactly_once: bool,
    /// Requests whose `on_complete` ran 0 or more than 1 times.
    pub not_exactly_once: usize,
    /// Requests whose completion contradicts the timing, whatever the load: one whose latency
    /// reached the timeout must expire (nothing else completes it); an expiry must not run before
    /// the deadline (never early); an expiry must not follow a completer call that had already
    /// returned before the deadline (a lost completion); and a completion other than by expiry
    /// must not come before the request's latency (a premature completion).
    pub wrong_outcome: usize,
    /// How late the completer ran, p99 (ms): its own lag, not the purgatory's.
    pub completer_lag_p99_ms: f64,
    /// Completion time minus intended completion time (the request's latency, capped at the
    /// timeout, whatever completed it), ms:
    /// p50, p99, p99.9, max.
    pub delay_ms: [f64; 4],
    /// Purges run.
    pub purges: u64,
    /// The timer's reaper wake-ups per second of the run.
    pub reaper_wakeups_per_s: f64,
    /// Advances done for the reaper by the purgatory's callers (the generator), per second (see
    /// `system_timer::Builder::reaper_grace`).
    pub caller_advances_per_s: f64,
    /// Achieved within 2% of the schedule's rate (the target, up to the draws' chance: see
    /// `README.md`), exactly once, expired count right.
    pub sustained: bool,
    /// The harness alone with the same flags, run right after (`--baseline`).
    pub baseline: Option<Box<Report>>,
    /// Issued requests per 100 ms window (for the plot).
    rate_series: Vec<f64>,
    /// Completion delays in ms (for the plot).
    delays: Vec<f64>,
}

impl Report {
    /// CPU s per million requests of the run minus the harness alone (`--baseline`): the
    /// purgatory's own share.
    pub fn purgatory_share(&self) -> Option<f64> {
        let b = self.baseline.as_deref()?;
        Some(self.cpu_s_per_million - b.cpu_s_per_million)
    }
}

/// Runs the load generator; returns the process exit code.
pub fn run(args: &Args) -> ExitCode {
    if let Err(e) = validate(args) {
        note!("error: {e}");
        return ExitCode::from(2);
    }
    if args.child_run {
        let wire = to_wire(&run_once(args));
        return exit_status(to_stdout(format_args!("{wire}")));
    }
    // The plot's file is opened (created if missing, not truncated) before the run: a path that
    // cannot be written was otherwise found out only once the whole run was done.
    if let Some(path) = &args.plot {
        let open = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path);
        if let Err(e) = open {
            note!("error: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if args.find_max_rate {
        return find_max_rate(args);
    }
    let report = match run_with_baseline(args, run_in_child) {
        Ok(report) => report,
        Err(e) => {
            note!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Exit status: correctness and the counts, as far as a slow or loaded machine cannot fake
    // them (see `correct`); a failed check wins over a report or plot that cannot be written
    // (`exit_status`). Whether the rate was sustained (at least the expected expiries, and no
    // more than those plus the requests under the timeout by less than a tick) is reported in
    // the table.
    let checks_passed = run_passed(&report);
    if args.json {
        to_stdout(format_args!("{}\n", to_json(args, &report)));
    } else {
        to_stdout(format_args!("{}", table(args, &report)));
    }
    let plot_written = args.plot.as_ref().is_none_or(|path| {
        let written = plot_svg(args, &report)
            .map_err(|e| format!("cannot draw the plot: {e}"))
            .and_then(|svg| {
                std::fs::write(path, svg)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))
            });
        match &written {
            Ok(()) => note!("plot written to {}", path.display()),
            Err(e) => note!("error: {e}"),
        }
        written.is_ok()
    });
    exit_status_written(checks_passed, plot_written)
}

/// Whether a run passes its checks, for the exit status: it and its baseline run
/// (`--baseline`), if any, are [`correct`].
fn run_passed(r: &Report) -> bool {
    correct(r) && r.baseline.as_deref().is_none_or(correct)
}

/// What the exit status requires of a run: every request completed exactly once, each one's
/// outcome consistent with when the completer acted, and the counts: every request counted once
/// (completed early or expired), and never fewer expired than the requests whose latency
/// reached the timeout (the completer is never given those). More expiries than that are what
/// a late completer on a loaded machine causes: reported as not sustained, not a failure.
fn correct(r: &Report) -> bool {
    r.exactly_once
        && r.wrong_outcome == 0
        && r.completed_early + r.expired == r.num
        && r.expired >= r.expected_expired
}

/// Runs W4 once, then (`--baseline`) the harness alone with the same flags, by `baseline`
/// (the command line's: [`run_in_child`]).
fn run_with_baseline(
    args: &Args,
    baseline: impl FnOnce(&Args) -> Result<Report, String>,
) -> Result<Report, String> {
    let mut report = run_once(args);
    if args.baseline && !args.harness_only {
        if args.progress > 0.0 {
            note!("baseline: the harness alone (--harness-only), same flags, in a new process");
        }
        report.baseline = Some(Box::new(baseline(&harness_alone(args))?));
    }
    Ok(report)
}

/// Runs W4 once with `args` in a new process of this program (`--child-run`) and returns its
/// report. A run after another in the same process would find the memory the allocator kept
/// from the first: its RSS growth, "bytes per pending request", came out at a few bytes (8 for
/// the harness alone at 100,000 requests, against about 370 in a process of its own), its peak
/// RSS counted the earlier run's, and its page faults were skipped. So `--baseline`'s run and
/// each `--find-max-rate` probe run in a process of their own.
fn run_in_child(args: &Args) -> Result<Report, String> {
    let mut cmd = std::process::Command::new(crate::measure::this_program()?);
    cmd.args(child_argv(args));
    crate::measure::run_child(&mut cmd, "the run in a new process", from_wire)
}

/// The command line that runs W4 with `args` once and prints its report in the wire format
/// (`--child-run`): every flag given explicitly, none that starts another run.
fn child_argv(a: &Args) -> Vec<String> {
    fn value(v: &impl clap::ValueEnum) -> String {
        let v = v.to_possible_value().expect("no skipped values");
        v.get_name().to_string()
    }
    let mut argv: Vec<String> = [
        ("w4", String::new()),
        ("--num", a.num.to_string()),
        ("--rate", format!("{:?}", a.rate)),
        ("--pct50", format!("{:?}", a.pct50)),
        ("--pct75", format!("{:?}", a.pct75)),
        ("--timeout", a.timeout.to_string()),
        ("--keys", a.keys.to_string()),
        ("--key-space", a.key_space.to_string()),
        ("--model", value(&a.model)),
        ("--tick-ms", format!("{:?}", a.tick_ms)),
        ("--wheel-size", a.wheel_size.to_string()),
        ("--reaper-grace-ms", format!("{:?}", a.reaper_grace_ms)),
        ("--purge-interval", a.purge_interval.to_string()),
        ("--executors", a.executors.to_string()),
        ("--seed", a.seed.to_string()),
        ("--completer-tick-us", a.completer_tick_us.to_string()),
        ("--ready-hint", a.ready_hint.to_string()),
        ("--completer-wake", value(&a.completer_wake)),
        ("--progress", "0".to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, v)| [flag.to_string(), v])
    .filter(|s| !s.is_empty())
    .collect();
    if a.harness_only {
        argv.push("--harness-only".into());
    }
    argv.push("--child-run".into());
    argv
}

/// A value of a [`Report`]'s field in the wire format: one line's text, `f64`s in full
/// precision (`{:?}`), so that a report comes back from a child process exactly.
trait Wire: Sized {
    fn put(&self) -> String;
    fn take(s: &str) -> Option<Self>;
}

macro_rules! wire_by_parse {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self) -> String {
                format!("{self:?}")
            }
            fn take(s: &str) -> Option<Self> {
                s.parse().ok()
            }
        }
    )*};
}
wire_by_parse!(usize, u64, f64, bool);

impl Wire for Option<f64> {
    fn put(&self) -> String {
        self.map_or("-".into(), |v| format!("{v:?}"))
    }
    fn take(s: &str) -> Option<Self> {
        match s {
            "-" => Some(None),
            s => s.parse().ok().map(Some),
        }
    }
}

impl Wire for String {
    fn put(&self) -> String {
        self.clone()
    }
    fn take(s: &str) -> Option<Self> {
        Some(s.to_string())
    }
}

/// Applies `$m` to the names of [`Report`]'s one-line fields (all but the threads, the delay
/// percentiles, the baseline and the plot's series).
macro_rules! report_scalars {
    ($m:ident) => {
        $m!(
            model,
            num,
            target_rate,
            achieved_rate,
            elapsed_s,
            cpu_s_per_million,
            sleeps_per_s,
            wake_cost_us,
            mem_latency_ns,
            wakeups_s_per_million,
            peak_rss,
            bytes_per_pending,
            peak_pending,
            completed_early,
            expired,
            expected_expired,
            boundary,
            exactly_once,
            not_exactly_once,
            wrong_outcome,
            completer_lag_p99_ms,
            purges,
            reaper_wakeups_per_s,
            caller_advances_per_s,
            sustained
        )
    };
}

/// A report as `name value` lines (`--child-run`'s output); [`from_wire`] reads it back. The
/// plot's series stay behind (a child's run is never plotted).
fn to_wire(r: &Report) -> String {
    let mut s = String::new();
    macro_rules! put {
        ($($f:ident),*) => {$(
            let _ = writeln!(s, "{} {}", stringify!($f), Wire::put(&r.$f));
        )*};
    }
    report_scalars!(put);
    let delays: Vec<String> = r.delay_ms.iter().map(Wire::put).collect();
    let _ = writeln!(s, "delay_ms {}", delays.join(" "));
    for t in &r.threads {
        let _ = writeln!(
            s,
            "thread {} {:?} {:?}",
            t.name, t.cpu_s_per_million, t.sleeps_per_s
        );
    }
    s
}

/// The report [`to_wire`] wrote; `None` if a field is missing, unknown or unreadable.
fn from_wire(text: &str) -> Option<Report> {
    let mut r = Report::default();
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        let (name, v) = line.split_once(' ')?;
        macro_rules! take {
            ($($f:ident),*) => {
                match name {
                    $(stringify!($f) => r.$f = Wire::take(v)?,)*
                    "delay_ms" => {
                        let d: Vec<f64> = v.split(' ').map(f64::take).collect::<Option<_>>()?;
                        r.delay_ms = d.try_into().ok()?;
                    }
                    "thread" => {
                        let mut f = v.split(' ');
                        let given = f.next()?;
                        let name = ["generator", "completer", "timer"]
                            .into_iter()
                            .find(|&n| n == given)?;
                        r.threads.push(ThreadRow {
                            name,
                            cpu_s_per_million: f64::take(f.next()?)?,
                            sleeps_per_s: f64::take(f.next()?)?,
                        });
                        continue;
                    }
                    _ => return None,
                }
            };
        }
        report_scalars!(take);
        seen.insert(name);
    }
    macro_rules! count {
        ($($f:ident),*) => { [$(stringify!($f)),*].len() };
    }
    (seen.len() == report_scalars!(count) + 1).then_some(r)
}

/// The flags of the harness-alone run that `--baseline` adds after a run with `args`.
fn harness_alone(args: &Args) -> Args {
    Args {
        harness_only: true,
        progress: 0.0,
        ..args.clone()
    }
}

/// The longest `--timeout` (ms) accepted: an hour (the completer's calendar holds a slot per
/// millisecond of it).
const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// The most keys one request may watch.
const MAX_KEYS: usize = 1024;
/// The highest `--rate` accepted (requests/s): a nanosecond a request (arrivals are whole
/// nanoseconds).
const MAX_RATE: f64 = 1e9;
/// Below this many requests, `--find-max-rate` warns that its answer is mostly noise.
const FIND_MAX_RATE_MIN_NUM: usize = 10_000;

/// The most timer executor threads `--executors` accepts.
const MAX_EXECUTORS: usize = 256;

fn validate(a: &Args) -> Result<(), String> {
    // At least one request a second: the gaps are whole nanoseconds in a u64. At most 10^9:
    // above it every gap rounds to 0 ns (a 1e300 target was accepted and printed in full).
    if a.num == 0 || !(1.0..=MAX_RATE).contains(&a.rate) {
        return Err(format!(
            "need --num >= 1 and 1 <= --rate <= {MAX_RATE:e} (requests/s)"
        ));
    }
    if a.num > EXPIRES as usize {
        return Err(format!("--num must be at most {EXPIRES}"));
    }
    if !(a.pct50 > 0.0 && a.pct75 >= a.pct50 && a.pct75.is_finite()) {
        return Err("need 0 < --pct50 <= --pct75, finite".into());
    }
    // More keys per request than there are keys: the run would watch fewer distinct keys than
    // its header says.
    if a.keys == 0
        || a.keys > MAX_KEYS
        || a.key_space == 0
        || a.keys as u64 > u64::from(a.key_space)
    {
        return Err(format!(
            "need 1 <= --keys <= {MAX_KEYS}, --key-space >= 1 and --keys <= --key-space"
        ));
    }
    if a.timeout == 0 || a.timeout > MAX_TIMEOUT_MS {
        return Err(format!("need 1 <= --timeout <= {MAX_TIMEOUT_MS} (ms)"));
    }
    if a.completer_tick_us > a.timeout.saturating_mul(1000) {
        return Err("--completer-tick-us must not exceed --timeout".into());
    }
    // A timer tick longer than the timeout, like a completer's: the timer expires requests only
    // at its ticks (every expiry up to a tick late: an hour-long wait for a run of a moment at
    // the longest tick), and the expired count's tolerance of a tick took in every request.
    if a.tick_ms > a.timeout as f64 {
        return Err("--tick-ms must not exceed --timeout".into());
    }
    // The timer's own limits: a tick of at least 1 µs and at most an hour, a wheel size it
    // accepts.
    let tick_ok = (0.001..=3_600_000.0).contains(&a.tick_ms);
    if !tick_ok || !(2..=timing_wheel::MAX_WHEEL_SIZE).contains(&a.wheel_size) {
        return Err(format!(
            "need 0.001 <= --tick-ms <= 3600000 and 2 <= --wheel-size <= {}",
            timing_wheel::MAX_WHEEL_SIZE
        ));
    }
    if a.find_max_rate && (a.json || a.plot.is_some() || a.baseline) {
        return Err(
            "--find-max-rate prints its search, one line per probe: not with --json, --plot \
             or --baseline (run the rate it finds with them)"
                .into(),
        );
    }
    // Up to an hour, like the tick (a grace in ms past u64 seconds panicked converting).
    if !(0.0..=3_600_000.0).contains(&a.reaper_grace_ms) {
        return Err("need 0 <= --reaper-grace-ms <= 3600000".into());
    }
    // A thread each: a huge count only fails (or exhausts the machine) spawning them.
    if a.executors > MAX_EXECUTORS {
        return Err(format!("need --executors <= {MAX_EXECUTORS}"));
    }
    // The purgatory clamps 0 to 1: the header and the JSON said 0 of a run purged at 1.
    if a.purge_interval == 0 {
        return Err("need --purge-interval >= 1 (completions between purges)".into());
    }
    // The harness-only run has no purgatory to take a share of: --baseline was dropped.
    if a.harness_only && a.baseline {
        return Err(
            "--baseline runs the harness alone after the run: not with --harness-only".into(),
        );
    }
    // The plot is always SVG: a `plot.png` got SVG in it.
    if let Some(path) = &a.plot {
        let svg = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
        if !svg {
            return Err(format!(
                "--plot draws SVG: give a file name ending in .svg, not {}",
                path.display()
            ));
        }
    }
    // 0 turns the display off; a negative or NaN interval did so silently.
    if !(a.progress >= 0.0 && a.progress.is_finite()) {
        return Err("need --progress >= 0 (seconds; 0: no progress lines)".into());
    }
    check_memory(a, crate::measure::memory_bytes())
}

/// The bytes of the per-request tables a run with `a` builds before its clock starts: the
/// draws, the arrival times, the completer's lags, attempts and completion log, the ready flags
/// and (`watch` model) each request's keys. A lower bound of what the run needs (the purgatory,
/// the calendar and the report's own tables come on top).
fn tables_bytes(a: &Args) -> u64 {
    use std::mem::size_of;
    let keys = match a.model {
        Model::Kafka => 0,
        Model::Watch => a.keys * size_of::<u32>(),
    };
    let per_request = 4 * size_of::<u64>() // latency, gap, arrival, completer lag
        + size_of::<(u32, u64)>() // the completer's attempt
        + size_of::<Done>() // the completer's completion log
        + size_of::<AtomicBool>() // the ready flag
        + keys;
    (a.num as u64).saturating_mul(per_request as u64)
}

/// Refuses a run whose per-request tables alone are more than `memory` (the RAM and swap the
/// process may use, if known: [`memory_bytes`](crate::measure::memory_bytes)): each flag within its bounds, it aborted on the failed allocation (`--model
/// watch --keys 1024 --key-space 1024 --num 10000000`: 40 GB of keys) or was killed once its
/// tables were filled.
fn check_memory(a: &Args, memory: Option<u64>) -> Result<(), String> {
    let need = tables_bytes(a);
    match memory {
        Some(memory) if need > memory => Err(format!(
            "--num {} ({}): its per-request tables alone need {:.1} GB, more than the \
             memory this process may use ({:.1} GB of RAM and swap: the machine's, or its \
             control group's limit)",
            a.num,
            match a.model {
                Model::Kafka => "kafka model".to_string(),
                Model::Watch => format!("watch model, {} keys each", a.keys),
            },
            need as f64 / 1e9,
            memory as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// The expired count is the requests whose latency reached the timeout, plus at most those
/// under it by less than a tick ([`Report::boundary`]).
fn expired_ok(r: &Report) -> bool {
    r.expired >= r.expected_expired && r.expired - r.expected_expired <= r.boundary
}

/// Of requests with `latency_ns`, those that must expire (latency at or past `timeout_ns`:
/// [`Report::expected_expired`]) and those under the timeout by less than `tolerance_ns` (either
/// outcome is right: [`Report::boundary`]).
fn expected_expiries(latency_ns: &[u64], timeout_ns: u64, tolerance_ns: u64) -> (usize, usize) {
    let expected_expired = latency_ns.iter().filter(|&&l| l >= timeout_ns).count();
    let boundary = latency_ns
        .iter()
        .filter(|&&l| l < timeout_ns && l.saturating_add(tolerance_ns) >= timeout_ns)
        .count();
    (expected_expired, boundary)
}

/// A standard normal from two uniforms (Box–Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// W4's completion latencies (ns) of `n` requests, the next `2n` outputs of `rng` (request `i`:
/// outputs `2i` and `2i + 1`, Box–Muller): log-normal with μ = ln p50 and σ = (ln p75 − μ) /
/// 0.674490 (BENCHMARKS.md), p50 and p75 in milliseconds. The run draws them first; the
/// `w4-replay` bench draws them the same way.
pub fn latencies_ns(rng: &mut SplitMix64, n: usize, pct50_ms: f64, pct75_ms: f64) -> Vec<u64> {
    let mu = pct50_ms.ln();
    let sigma = (pct75_ms.ln() - mu) / 0.674_490;
    (0..n)
        .map(|_| ((mu + sigma * normal(rng)).exp() * 1e6) as u64)
        .collect()
}

/// A request the completer waits to complete: its id and (kafka model) its handle.
type Pending = (u32, Option<OperationHandle<FakeOp>>);

/// In `--harness-only` runs, set in a request id the completer gets when the request is to be
/// logged as an expiry (its latency reached the timeout). Request ids stay below it.
const EXPIRES: u32 = 1 << 31;

/// Completer bookkeeping: queue a batch's requests by due time.
fn take(mut batch: Batch, queue: &mut CompletionQueue<Pending>, back: &Sender<Batch>) {
    for (due, id, h) in batch.drain(..) {
        queue.push(due, (id, h));
    }
    // The empty vector goes back to the generator, which refills it: a fresh vector per burst
    // grew by reallocation (several allocations and copies each burst).
    let _ = back.send(batch);
}

/// An empty batch vector for the generator: one the completer sent back, or a new one.
fn refill(back: &Receiver<Batch>) -> Batch {
    back.try_recv().unwrap_or_else(|_| Vec::with_capacity(64))
}

/// What the generator sends the completer: due time, id, handle.
type Batch = Vec<(u64, u32, Option<OperationHandle<FakeOp>>)>;

/// What the progress display shows of the requests issued so far (see [`Sampler::poll`]).
struct Counts {
    pending: usize,
    completed: u64,
    expired: u64,
}

/// The progress display and the samples taken during a run (peak pending, issue rate per
/// 100 ms), polled by whichever thread is awake: at most once per 10 ms of the run.
struct Sampler {
    every_s: f64,
    tty: bool,
    next_sample_ns: u64,
    next_print_s: f64,
    /// Requests issued by the end of the last whole window recorded (estimated: see `poll`).
    last_issued: f64,
    /// The previous sample: its time (ns) and the requests issued by then.
    last_sample: (u64, usize),
    peak: usize,
    series: Vec<f64>,
    printed: bool,
}

impl Sampler {
    fn new(every_s: f64) -> Self {
        Sampler {
            every_s,
            tty: std::io::stderr().is_terminal(),
            next_sample_ns: 10_000_000,
            next_print_s: every_s,
            last_issued: 0.0,
            last_sample: (0, 0),
            peak: 0,
            series: Vec::new(),
            printed: false,
        }
    }

    /// At `now_ns` into the run, with `issued` requests issued so far; `counts(issued, totals)`
    /// gives the pending requests, and the completed and expired ones if `totals` (read only
    /// when a sample is due, the totals only when a line is printed).
    fn poll(&mut self, now_ns: u64, issued: usize, counts: impl Fn(usize, bool) -> Counts) {
        if now_ns < self.next_sample_ns {
            return;
        }
        self.next_sample_ns = now_ns - now_ns % 10_000_000 + 10_000_000;
        self.peak = self.peak.max(counts(issued, false).pending);
        // The issue rate of each whole 100 ms window passed (spread evenly over the windows
        // that passed since the last sample, if more than one did). The requests issued by the
        // windows' end are interpolated between this sample and the previous one: this sample
        // also counts those issued since, in the window now under way.
        let windows = (now_ns / 100_000_000).saturating_sub(self.series.len() as u64);
        if windows > 0 {
            let end_ns = (self.series.len() as u64 + windows) * 100_000_000;
            let (t0, n0) = self.last_sample;
            let share = (end_ns - t0) as f64 / (now_ns - t0).max(1) as f64;
            let at_end = n0 as f64 + (issued - n0) as f64 * share.min(1.0);
            let rate = (at_end - self.last_issued) * 10.0 / windows as f64;
            self.series
                .extend(std::iter::repeat_n(rate, windows as usize));
            self.last_issued = at_end;
        }
        self.last_sample = (now_ns, issued);
        let t = now_ns as f64 / 1e9;
        if self.line_due(t) {
            let c = counts(issued, true);
            let line = format!(
                "[{t:6.1}s] issued {issued:>9}  rate {:>9.0}/s  pending {:>7}  completed {:>9}  expired {:>7}",
                issued as f64 / t,
                c.pending,
                c.completed,
                c.expired,
            );
            self.printed = true;
            if self.tty {
                to_stderr(format_args!("\r{line}"));
            } else {
                note!("{line}");
            }
        }
    }

    /// Whether a progress line is due `t` seconds into the run; if so, the next one is due at
    /// the end of the interval `t` is in. (One interval later than the last one due made a
    /// generator that had slept through several owe a line for each: it printed them one per
    /// sample, 10 ms apart.)
    fn line_due(&mut self, t: f64) -> bool {
        if self.every_s > 0.0 && t >= self.next_print_s {
            self.next_print_s = ((t / self.every_s).floor() + 1.0) * self.every_s;
            true
        } else {
            false
        }
    }

    /// Ends the progress display.
    fn finish(&self) {
        if self.tty && self.printed {
            to_stderr(format_args!("\n"));
        }
    }
}

/// `ms` milliseconds (`--tick-ms`, `--reaper-grace-ms`) as a duration.
fn millis(ms: f64) -> Duration {
    Duration::from_secs_f64(ms / 1000.0)
}

/// The ring [`Report::mem_latency_ns`] is measured on: past the last-level cache share of a
/// small machine, small enough to build in a tenth of a second.
const MEM_LATENCY_RING: usize = 32 << 20;

/// Runs W4 once with `args`.
pub fn run_once(args: &Args) -> Report {
    run_once_with(args, &READY_FLAGS)
}

/// [`run_once`], borrowing the ready flags from `flags`.
fn run_once_with(args: &Args, flags: &FlagPool) -> Report {
    let n = args.num;
    let timeout = Duration::from_millis(args.timeout);
    let tick = millis(args.tick_ms);
    // Draws, from one splitmix64 stream (seed `--seed`), quantity by quantity: the n latencies
    // first (request i: outputs 2i and 2i+1, Box–Muller), then the n gaps (request i: output
    // 2n + i), then the keys (once for `kafka`, per request for `watch`). BENCHMARKS.md's
    // "task i uses the i-th output" is for one draw per task; with several, a run of n requests
    // is not a prefix of a longer one (its gaps come after its own n latencies).
    let mut rng = SplitMix64::new(args.seed);
    let latency_ns = latencies_ns(&mut rng, n, args.pct50, args.pct75);
    let mean_gap_ns = 1e9 / args.rate;
    let gaps_ns = whole_ns_gaps((0..n).map(|_| -(1.0 - rng.next_f64()).ln() * mean_gap_ns));
    let fixed_keys: Vec<u32> = (0..args.keys)
        .map(|_| (rng.next() % u64::from(args.key_space)) as u32)
        .collect();
    let keys: Arc<Vec<u32>> = Arc::new(match args.model {
        Model::Kafka => Vec::new(),
        Model::Watch => (0..n * args.keys)
            .map(|_| (rng.next() % u64::from(args.key_space)) as u32)
            .collect(),
    });
    let keys_of = |i: usize| -> &[u32] {
        match args.model {
            Model::Kafka => &fixed_keys,
            Model::Watch => &keys[i * args.keys..(i + 1) * args.keys],
        }
    };
    let timeout_ns = timeout.as_nanos() as u64;
    let tolerance_ns = expired_tolerance_ns(args);
    let (expected_expired, boundary) = expected_expiries(&latency_ns, timeout_ns, tolerance_ns);

    let timer = SystemTimer::builder()
        .name("w4")
        .tick(tick)
        .wheel_size(args.wheel_size)
        .reaper_grace(millis(args.reaper_grace_ms));
    let timer = Arc::new(if args.executors == 0 {
        timer.inline().build()
    } else {
        timer.executor_threads(args.executors).build()
    });
    // The requests' ready flags (watch model): `'static`, so taken from the process's pool of
    // them and given back at the end of the run (see `FlagPool`).
    let ready_all = flags.take(n);
    let ready: &'static [AtomicBool] = &ready_all[..n];
    // A check rules a request out by its ready flag, from its id beside it in the list. Only
    // requests with ready hints give their ids (`FakeOp::ready_arg`: the `watch` model's
    // default); the test is asked about no other.
    let purgatory: Arc<Purgatory<u32, FakeOp, ReadyFlags>> = Arc::new(
        Purgatory::builder()
            .name("w4")
            .timer(Arc::clone(&timer))
            .purge_interval(args.purge_interval)
            .with_ready_test(ReadyFlags(ready))
            .build(),
    );

    // The per-request tables are built before the clock starts; `start` is the one time base
    // of arrivals, due times and completions.
    // The harness's own per-request tables, touched now so that they are in the baseline RSS.
    // What still grows with the pending requests besides the purgatory (the completer's
    // calendar and batches) is in "bytes per pending request": `--baseline` reports the
    // harness alone's figure beside it.
    let mut arrivals: Vec<u64> = prefaulted(n);
    let completer_lags: Vec<u64> = prefaulted(n);
    let attempts: Vec<(u32, u64)> = prefaulted(n);
    // The completion logs, their memory touched now: the completer's (most completions), and a
    // pool for the threads that run expiries (this one when it advances the timer, the reaper,
    // the executors), enough for the expiries the latencies call for (a late completer's extra
    // ones take fresh chunks; in `--harness-only` runs the completer logs the expiries too).
    let run = done_log::new_run();
    let completer_log = prefaulted(n);
    // The completer's calendar, a bucket per millisecond of the timeout (4 Mi buckets, about
    // 100 MB, for an hour): built now, so that it is in the baseline RSS too. Built on the
    // completer's thread, it was counted in bytes per pending request, which it does not grow
    // with.
    let queue: CompletionQueue<Pending> = CompletionQueue::new(args.timeout + 64);
    done_log::install(run, Vec::new());
    if !args.harness_only {
        let threads = 2 + args.executors;
        let records = expected_expired + boundary;
        done_log::provision(run, records.div_ceil(done_log::CHUNK) + threads);
    }
    // What a thread's sleep and wake-up costs here, measured before the clock starts (so not in
    // the run's CPU): the report splits the CPU figure into wake-ups and work with it.
    let (wake_cost_ns, _) = crate::measure::wake_cost(Duration::from_millis(1), 200);
    // And what a load from memory costs (its ring freed before the peak RSS is reset).
    let mem_latency_ns = crate::measure::load_latency(MEM_LATENCY_RING, 1_000_000);
    // This run's own peak, not an earlier run's in the same process (`--baseline`, the probes
    // of `--find-max-rate`).
    reset_peak_rss();
    let rss0 = rss_bytes();
    let cpu0 = process_cpu_ns();
    let (main0, threads0) = (this_thread(), live_threads());
    let timer0 = timer.stats();
    let start = Instant::now();
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        start,
        run,
        ready,
        completer_due_ns: AtomicU64::new(u64::MAX),
        generating: AtomicBool::new(true),
        ready_hint: args.uses_ready_hints(),
        harness_done: AtomicU64::new(0),
        harness_expired: AtomicU64::new(0),
    }));

    // The completer: completes each request at its intended time.
    // Batches (one per generator burst): a message per request would make the completer spin
    // and park once per request, and that CPU would be counted against the purgatory.
    let (tx, rx) = crossbeam_channel::unbounded::<Batch>();
    let (back_tx, back_rx) = crossbeam_channel::unbounded::<Batch>();
    let completer = {
        let purgatory = Arc::clone(&purgatory);
        let model = args.model;
        let harness_only = args.harness_only;
        let keys_all = Arc::clone(&keys);
        let k = args.keys;
        let tick_ns = args.completer_tick_us * 1_000;
        let wake = args.completer_wake;
        let mut lags = completer_lags;
        let mut attempts = attempts;
        let mut queue = queue;
        std::thread::Builder::new()
            .name("w4-completer".into())
            .spawn(move || {
                let mut due: Vec<(u64, Pending)> = Vec::new();
                let mut acted: Vec<u32> = Vec::new();
                done_log::install(run, completer_log);
                let mut open = true;
                loop {
                    let now = start.elapsed().as_nanos() as u64;
                    queue.pop_due(now, &mut due);
                    let (mut logged, mut logged_expired) = (0, 0);
                    for (due_ns, (id, handle)) in due.drain(..) {
                        // Only `--harness-only` runs send expiries (flagged) to the completer.
                        let expired = id & EXPIRES != 0;
                        let id = id & !EXPIRES;
                        if !expired {
                            lags.push(now - due_ns);
                            acted.push(id);
                        }
                        if harness_only {
                            // No purgatory: log what on_complete (or the expiry) would have.
                            let at_ns = start.elapsed().as_nanos() as u64;
                            done_log::push(
                                run,
                                Done {
                                    at_ns,
                                    id,
                                    expired,
                                    ..Done::default()
                                },
                            );
                            logged += 1;
                            logged_expired += u64::from(expired);
                            continue;
                        }
                        // What this call completes on this thread must be `id`, or nothing
                        // (and inline expiries): `acting_for` flags anything else.
                        done_log::acting_for(Some(id));
                        match model {
                            Model::Kafka => {
                                if let Some(h) = handle {
                                    h.force_complete();
                                }
                            }
                            Model::Watch => {
                                shared.ready[id as usize].store(true, Release);
                                let ks = &keys_all[id as usize * k..(id as usize + 1) * k];
                                for key in ks {
                                    purgatory.check_and_complete(key);
                                }
                            }
                        }
                    }
                    done_log::acting_for(None);
                    if logged_expired > 0 {
                        // Before the total: a reader that sees the total sees these.
                        shared.harness_expired.fetch_add(logged_expired, Release);
                    }
                    if logged > 0 {
                        shared.harness_done.fetch_add(logged, Release);
                    }
                    if !acted.is_empty() {
                        let end = start.elapsed().as_nanos() as u64;
                        attempts.extend(acted.drain(..).map(|id| (id, end)));
                    }
                    // Take what the generator sent (non-blocking), then sleep until the next
                    // request is due (see the tick below).
                    for batch in rx.try_iter() {
                        take(batch, &mut queue, &back_tx);
                    }
                    let now = start.elapsed().as_nanos() as u64;
                    match queue.next_due_ns() {
                        Some(due) if due <= now => continue,
                        Some(due) => {
                            let until_due = due - now;
                            if shared.generating.load(Acquire) {
                                // The generator wakes us when it sends a request due more than
                                // a tick before `due` (one with a short latency, at low rates:
                                // it would otherwise wait until `due`), and (`Generator` mode)
                                // once `due` has passed, a wake-up from a running thread, our
                                // own timer (`completer_sleep`: up to two ticks after `due`)
                                // being the fallback. A nudge that lands before the park makes
                                // the park return at once (the thread's token). The fences pair with the generator's (after
                                // its send, before it reads `completer_due_ns`): either it sees
                                // our due time or we see its batch.
                                shared.completer_due_ns.store(due, SeqCst);
                                fence(SeqCst);
                                if !rx.is_empty() {
                                    shared.completer_due_ns.store(u64::MAX, Relaxed);
                                    continue;
                                }
                                std::thread::park_timeout(completer_sleep(
                                    Some(wake),
                                    until_due,
                                    tick_ns,
                                ));
                                shared.completer_due_ns.store(u64::MAX, Relaxed);
                            } else if rx.is_empty() {
                                // The generator is done; its last batch may have come after
                                // the `try_iter` above (it sends, then clears `generating`):
                                // looked for again here, after `generating` was read.
                                std::thread::sleep(completer_sleep(None, until_due, tick_ns));
                            }
                        }
                        None if open => match rx.recv() {
                            Ok(b) => take(b, &mut queue, &back_tx),
                            Err(_) => open = false,
                        },
                        None => break,
                    }
                }
                // Its sleeps, read before it exits (an exited thread leaves /proc/self/task).
                (lags, attempts, this_thread())
            })
            .expect("spawn completer")
    };

    // Progress lines, peak pending and the issue-rate series are sampled by the generator
    // between bursts (and by this thread while it waits at the end): a sampler thread of its
    // own cost a wake-up every 10 ms, counted against the purgatory.
    let mut sampler = Sampler::new(args.progress);
    let counts = |issued: usize, totals: bool| -> Counts {
        if args.harness_only {
            // Expiries are logged by the completer too, counted with the rest (completed
            // includes them, as the purgatory's count does) and on their own.
            let done = shared.harness_done.load(Acquire);
            Counts {
                pending: issued.saturating_sub(done as usize),
                completed: done,
                expired: shared.harness_expired.load(Acquire).min(done),
            }
        } else {
            // `stats()` walks every map shard (for `watched`): only when a line is printed.
            let (completed, expired) = if totals {
                let st = purgatory.stats();
                (st.completed, st.expired)
            } else {
                (0, 0)
            };
            Counts {
                pending: purgatory.delayed(),
                completed,
                expired,
            }
        }
    };

    // The generator (this thread): sleeps until the next arrival when it is more than 1 ms
    // away, otherwise issues every request already due, in a burst.
    let mut arrival_ns = 0u64;
    let mut batch: Batch = Vec::new();
    // The earliest due time in `batch`.
    let mut batch_due = u64::MAX;
    // Wakes the completer once its next request is due (CompleterWake::Generator).
    let completer_thread = completer.thread().clone();
    let completer_tick_ns = args.completer_tick_us * 1_000;
    // Wakes the completer if it still sleeps: claims the due time it published, so one waker
    // per sleep.
    let wake = || {
        if shared.completer_due_ns.swap(u64::MAX, AcqRel) != u64::MAX {
            completer_thread.unpark();
        }
    };
    // Sends a batch, and wakes the completer if it sleeps towards a later time than (a tick
    // after) the batch's earliest due time (see `Shared::completer_due_ns`).
    let send = |batch: Batch, batch_due: u64| {
        let _ = tx.send(batch);
        fence(SeqCst);
        let target = shared.completer_due_ns.load(SeqCst);
        if target != u64::MAX && batch_due.saturating_add(completer_tick_ns) < target {
            wake();
        }
    };
    let nudge = |now_ns: u64| {
        if args.completer_wake == CompleterWake::Generator
            && now_ns >= shared.completer_due_ns.load(Acquire)
        {
            wake();
        }
    };
    for i in 0..n {
        arrival_ns += gaps_ns[i];
        let mut issue_ns = start.elapsed().as_nanos() as u64;
        if arrival_ns > issue_ns + 1_000_000 {
            if !batch.is_empty() {
                send(std::mem::replace(&mut batch, refill(&back_rx)), batch_due);
                batch_due = u64::MAX;
            }
            nudge(issue_ns);
            std::thread::sleep(Duration::from_nanos(arrival_ns - issue_ns));
            issue_ns = start.elapsed().as_nanos() as u64;
            sampler.poll(issue_ns, i, counts);
        } else if i % 1024 == 0 {
            // Not sleeping (a rate above what it can issue): sample and wake the completer anyway.
            sampler.poll(issue_ns, i, counts);
            nudge(issue_ns);
        }
        arrivals.push(issue_ns);
        if args.harness_only {
            // The completer logs it at its latency, or at its timeout as an expiry.
            let item = if latency_ns[i] < timeout_ns {
                (issue_ns + latency_ns[i], i as u32, None)
            } else {
                (issue_ns + timeout_ns, i as u32 | EXPIRES, None)
            };
            batch_due = batch_due.min(item.0);
            batch.push(item);
        } else {
            let op = FakeOp {
                id: i as u32,
                s: shared,
            };
            let w = purgatory
                .try_complete_else_watch(op, timeout, keys_of(i))
                .unwrap_or_else(|e| panic!("purgatory refused request {i}: {e}"));
            if latency_ns[i] < timeout_ns && !w.completed {
                let h = (args.model == Model::Kafka).then_some(w.handle);
                batch_due = batch_due.min(issue_ns + latency_ns[i]);
                batch.push((issue_ns + latency_ns[i], i as u32, h));
            }
        }
        if batch.len() >= 256 {
            send(std::mem::replace(&mut batch, refill(&back_rx)), batch_due);
            batch_due = u64::MAX;
        }
    }
    if !batch.is_empty() {
        send(batch, batch_due);
    }
    let gen_end = start.elapsed();
    drop(tx);
    // From now on the completer keeps time itself.
    shared.generating.store(false, Release);
    completer_thread.unpark();
    // Wait (generously) until every request has completed one way or the other: once the
    // generator stops advancing the timer, the last expiries wait for the reaper, up to a tick
    // plus the reaper grace after their deadline.
    let grace = millis(args.reaper_grace_ms);
    let deadline = Instant::now() + timeout + tick + grace + Duration::from_secs(30);
    while counts(n, true).completed < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        sampler.poll(start.elapsed().as_nanos() as u64, n, counts);
    }
    let (lags, attempts, completer_use) = completer.join().expect("completer");
    sampler.finish();
    let elapsed = start.elapsed();
    let cpu = process_cpu_ns() - cpu0;
    let (main1, threads1) = (this_thread(), live_threads());
    let (peak_pending, rate_series) = (sampler.peak, sampler.series);
    // The timer's threads (reaper, executors): alive before the start, so counted from there.
    let mut timer_use = ThreadUse::default();
    for (tid, name, u) in &threads1 {
        if name.starts_with("w4-reaper") || name.starts_with("w4-executor") {
            let before = threads0.iter().find(|t| t.0 == *tid).map(|t| t.2);
            let before = before.unwrap_or_default();
            timer_use.cpu_ns += u.cpu_ns.saturating_sub(before.cpu_ns);
            timer_use.sleeps += u.sleeps.saturating_sub(before.sleeps);
        }
    }
    let generator_use = ThreadUse {
        cpu_ns: main1.cpu_ns.saturating_sub(main0.cpu_ns),
        sleeps: main1.sleeps.saturating_sub(main0.sleeps),
    };
    // Every thread of the run is one of these three.
    let sleeps = generator_use.sleeps + completer_use.sleeps + timer_use.sleeps;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let row = |name: &'static str, u: ThreadUse| ThreadRow {
        name,
        cpu_s_per_million: u.cpu_ns as f64 / 1e9 / n as f64 * 1e6,
        sleeps_per_s: u.sleeps as f64 / secs,
    };
    let threads = vec![
        row("generator", generator_use),
        row("completer", completer_use),
        row("timer", timer_use),
    ];
    let peak_rss = peak_rss_bytes();
    let purges = purgatory.stats().purges;
    let timer_stats = timer.stats();
    drop(purgatory);
    let _ = timer.shutdown();
    // Nothing reads the flags any more: the completer has exited, and the purgatory's ready
    // test and operations are dropped with it (the timer's shutdown drops any left).
    flags.give(ready_all);

    // Every thread that completed requests has exited, but this one: the logs are whole.
    let t = tally(
        done_log::collect(run),
        &attempts,
        &arrivals,
        &latency_ns,
        timeout_ns,
    );
    let mut lag_ms: Vec<f64> = lags.iter().map(|&l| l as f64 / 1e6).collect();
    lag_ms.sort_by(f64::total_cmp);
    // Issued over the schedule's span at least: the generator issues a request up to 1 ms before
    // its arrival time, so over its own span alone a short run would beat its schedule.
    let (achieved, scheduled_rate) = issue_rates(n, gen_end.as_nanos() as u64, arrival_ns);
    let mut report = Report {
        model: format!("{:?}", args.model).to_lowercase(),
        num: n,
        target_rate: args.rate,
        achieved_rate: achieved,
        elapsed_s: elapsed.as_secs_f64(),
        cpu_s_per_million: cpu as f64 / 1e9 / n as f64 * 1e6,
        sleeps_per_s: sleeps as f64 / secs,
        wake_cost_us: wake_cost_ns / 1e3,
        mem_latency_ns,
        wakeups_s_per_million: sleeps as f64 * wake_cost_ns / 1e9 / n as f64 * 1e6,
        threads,
        peak_rss,
        bytes_per_pending: bytes_per_pending(peak_rss.saturating_sub(rss0), peak_pending),
        peak_pending,
        completed_early: t.completed_early,
        expired: t.expired,
        expected_expired,
        boundary,
        exactly_once: t.not_exactly_once == 0,
        not_exactly_once: t.not_exactly_once,
        completer_lag_p99_ms: percentile(&lag_ms, 0.99),
        wrong_outcome: t.wrong_outcome,
        delay_ms: [
            percentile(&t.delays, 0.50),
            percentile(&t.delays, 0.99),
            percentile(&t.delays, 0.999),
            t.delays.last().copied().unwrap_or(0.0),
        ],
        purges,
        reaper_wakeups_per_s: timer_stats
            .reaper_wakeups
            .saturating_sub(timer0.reaper_wakeups) as f64
            / secs,
        caller_advances_per_s: timer_stats
            .caller_advances
            .saturating_sub(timer0.caller_advances) as f64
            / secs,
        sustained: false,
        baseline: None,
        rate_series,
        delays: t.delays,
    };
    report.sustained = sustained(&report, scheduled_rate);
    report
}

/// [`Report::bytes_per_pending`]: the RSS growth `grown` (bytes) over the peak number of
/// requests pending, if any were.
fn bytes_per_pending(grown: u64, peak_pending: usize) -> Option<f64> {
    (peak_pending > 0).then(|| grown as f64 / peak_pending as f64)
}

/// What the completion logs say of a run's requests (see [`Report`]'s fields of these names).
#[derive(Debug, Default)]
struct Tally {
    completed_early: usize,
    expired: usize,
    not_exactly_once: usize,
    wrong_outcome: usize,
    /// Each request's completion time minus its intended one (its latency, capped at the
    /// timeout), ms, sorted; none for a request never completed.
    delays: Vec<f64>,
}

/// Tallies the completion records `done` of the requests that arrived at `arrivals` (ns since
/// the run's start) with `latency_ns`, given the times by which the completer's calls for them
/// had returned (`attempts`: id, ns).
fn tally(
    done: Vec<Done>,
    attempts: &[(u32, u64)],
    arrivals: &[u64],
    latency_ns: &[u64],
    timeout_ns: u64,
) -> Tally {
    let n = arrivals.len();
    // Per request: on_complete calls, the time of the first, whether expiry completed it, and
    // a time by which the completer's call for it had returned (0: it never acted).
    let mut completions = vec![0u8; n];
    let mut done_ns = vec![0u64; n];
    let mut expired_flag = vec![false; n];
    // A record that shows a breach of the purgatory's contract (see `Breach`) makes its
    // request's outcome wrong; an `on_expiration` alone is no completion.
    let mut breached = vec![false; n];
    for d in done {
        let i = d.id as usize;
        breached[i] |= d.breach != Breach::None;
        if d.breach == Breach::ExpirationAlone {
            continue;
        }
        completions[i] = completions[i].saturating_add(1);
        if completions[i] == 1 {
            done_ns[i] = d.at_ns;
            expired_flag[i] = d.expired;
        }
    }
    let mut attempted_ns = vec![0u64; n];
    for &(id, end) in attempts {
        attempted_ns[id as usize] = end;
    }
    let not_exactly_once = completions.iter().filter(|&&c| c != 1).count();
    let mut delays = Vec::with_capacity(n);
    let mut expired = 0;
    for i in 0..n {
        if completions[i] == 0 {
            continue;
        }
        let exp = expired_flag[i];
        expired += usize::from(exp);
        // Its own latency, whatever completed it: a request that expired only because the
        // completer was late is late by that much (it was measured from the timeout, which
        // showed a completer's collapse, most requests expiring, as delays near 0).
        let intended = arrivals[i] + latency_ns[i].min(timeout_ns);
        delays.push((done_ns[i] as f64 - intended as f64) / 1e6);
    }
    delays.sort_by(f64::total_cmp);
    let completed_early = (0..n)
        .filter(|&i| completions[i] == 1 && !expired_flag[i])
        .count();
    let wrong_outcome = (0..n)
        .filter(|&i| {
            // A request not completed exactly once is counted by the exactly-once check.
            completions[i] == 1
                && (breached[i]
                    || wrong_outcome(
                        Outcome {
                            expired: expired_flag[i],
                            done_ns: done_ns[i],
                            acted_ns: attempted_ns[i],
                        },
                        arrivals[i],
                        latency_ns[i],
                        timeout_ns,
                    ))
        })
        .count();
    Tally {
        completed_early,
        expired,
        not_exactly_once,
        wrong_outcome,
        delays,
    }
}

/// Gaps (ns) in whole nanoseconds whose sums follow those of `gaps` to within half a
/// nanosecond: each arrival is its exact time rounded, not the sum of gaps cut to whole
/// nanoseconds, which made the schedule faster than `--rate` by the half nanosecond lost per
/// gap on average (by 7% at 10^8 requests/s and 75% at 10^9; 0.005% at the default 10^5).
fn whole_ns_gaps(gaps: impl Iterator<Item = f64>) -> Vec<u64> {
    let (mut exact, mut whole) = (0.0f64, 0u64);
    gaps.map(|gap| {
        exact += gap;
        let next = exact.round() as u64;
        let gap = next - whole;
        whole = next;
        gap
    })
    .collect()
}

/// The `q` quantile (0 to 1) of `sorted` by nearest rank: the smallest value with at least
/// `q` of the values at or below it; 0 for no values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The achieved issue rate of `n` requests and their schedule's own rate (req/s), the generator
/// having issued the last at `gen_end_ns` and the schedule's last arrival being at
/// `schedule_ns`: the achieved rate is over the schedule's span at least, so never above the
/// schedule's (the generator issues a request up to 1 ms before its arrival time).
fn issue_rates(n: usize, gen_end_ns: u64, schedule_ns: u64) -> (f64, f64) {
    let rate = |span_ns: u64| n as f64 / (span_ns as f64 / 1e9).max(1e-9);
    (rate(gen_end_ns.max(schedule_ns)), rate(schedule_ns))
}

/// Whether a run sustained its rate: achieved within 2% of its schedule's rate
/// (`scheduled_rate`: a short run's gaps can sum to a few percent off the target by chance),
/// every request completed exactly once, every outcome consistent, the expired count right.
fn sustained(r: &Report, scheduled_rate: f64) -> bool {
    r.achieved_rate >= 0.98 * scheduled_rate
        && r.exactly_once
        && r.wrong_outcome == 0
        && expired_ok(r)
}

/// How long the completer sleeps when its next request is due in `until_due_ns`, with a tick of
/// `tick_ns`, woken as `wake` says while the generator runs (`None`: it has finished, and wakes
/// no one): at least a tick (waking per request would cost more than the purgatory). In
/// `Generator` mode that is the fallback, a tick longer, the generator's nudge coming first while
/// it runs; when it sleeps (low rates) nothing nudges, and the completer is up to two ticks late
/// ([`completer_lateness_ns`]). Ending the fallback a tick after the due time instead woke the
/// completer 1,400 times a second instead of 840 at 100,000/s and cost the run 20% more CPU
/// (5 interleaved pairs, 2026-11-29).
fn completer_sleep(wake: Option<CompleterWake>, until_due_ns: u64, tick_ns: u64) -> Duration {
    let sleep = until_due_ns.max(tick_ns);
    Duration::from_nanos(match wake {
        Some(CompleterWake::Generator) => sleep.saturating_add(tick_ns),
        Some(CompleterWake::Timer) | None => sleep,
    })
}

/// How late past a request's due time the completer may act, by its own sleeps
/// ([`completer_sleep`]): two ticks when the generator wakes it, one when its timer does.
fn completer_lateness_ns(wake: CompleterWake, tick_ns: u64) -> u64 {
    match wake {
        CompleterWake::Generator => tick_ns.saturating_mul(2),
        CompleterWake::Timer => tick_ns,
    }
}

/// The expired count's tolerance ([`Report::boundary`]): a tick of the timer, or the completer's
/// lateness ([`completer_lateness_ns`]), whichever is longer (a completer that wakes once a
/// millisecond is up to that late whatever the timer's tick).
fn expired_tolerance_ns(args: &Args) -> u64 {
    let timer_tick_ns = millis(args.tick_ms).as_nanos() as u64;
    let completer_tick_ns = args.completer_tick_us.saturating_mul(1000);
    timer_tick_ns.max(completer_lateness_ns(
        args.completer_wake,
        completer_tick_ns,
    ))
}

/// How one request was completed (its only `on_complete`), in ns since the run's start.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    /// Expiry completed it.
    expired: bool,
    /// When `on_complete` ran.
    done_ns: u64,
    /// When the completer's call for it (a forced completion or the checks of its keys) had
    /// returned; 0 if the completer never acted for it.
    acted_ns: u64,
}

/// True if the outcome of a request issued at `arrival_ns` with `latency_ns` contradicts the
/// timing, whatever the load: a request whose latency reached the timeout must expire (nothing
/// else completes it); an expiry must not run before the deadline (never early), nor follow a
/// completer call that had already returned before the deadline (a lost completion); and a
/// request completed other than by expiry must not complete before its latency (nothing makes
/// it completable earlier: the completer acts at its due time, `arrival + latency`, on the same
/// clock), and must complete within the completer's call for it (the generator hands it over
/// only after `try_complete_else_watch` returned, and then only that call makes it
/// completable: a completion after the call returned, by a later check of another request's
/// key, is a lost one that the neighbour's check rescued).
fn wrong_outcome(o: Outcome, arrival_ns: u64, latency_ns: u64, timeout_ns: u64) -> bool {
    let deadline = arrival_ns + timeout_ns;
    let must_expire = latency_ns >= timeout_ns;
    (must_expire && !o.expired)
        || (o.expired && o.done_ns < deadline)
        || (o.expired && o.acted_ns != 0 && o.acted_ns < deadline)
        || (!o.expired && o.done_ns < arrival_ns.saturating_add(latency_ns))
        || (!o.expired && (o.acted_ns == 0 || o.done_ns > o.acted_ns))
}

fn header(args: &Args) -> String {
    format!(
        "W4 purgatory load: model {:?}, {} requests at {} req/s, latency p50/p75 = {}/{} ms, timeout {} ms, {} keys of {}, tick {} ms, wheel {}, purge interval {}, {} executor(s), reaper grace {} ms, completer tick {} us, completer woken by {:?}{}, seed {}",
        args.model, args.num, args.rate, args.pct50, args.pct75, args.timeout, args.keys,
        args.key_space, args.tick_ms, args.wheel_size, args.purge_interval, args.executors,
        args.reaper_grace_ms, args.completer_tick_us, args.completer_wake,
        if args.harness_only {
            ", harness only (no purgatory)"
        } else {
            match (args.model, args.ready_hint) {
                (Model::Watch, true) => ", ready test",
                (Model::Watch, false) => ", no ready hints (every check locks every watcher)",
                (Model::Kafka, _) => "",
            }
        },
        args.seed
    )
    .to_lowercase()
    .replace("w4", "W4")
}

/// The report as a table (the header line, the machine line, a row per figure).
fn table(args: &Args, r: &Report) -> String {
    let mut out = format!("{}\nmachine: {}\n", header(args), machine_line());
    let yes = |b: bool| if b { "yes" } else { "NO" };
    let mut rows: Vec<(&str, String)> = vec![
        ("target rate (req/s)", format!("{:.0}", r.target_rate)),
        ("achieved rate (req/s)", format!("{:.0}", r.achieved_rate)),
        (
            "sustained (within 2%, checks pass)",
            yes(r.sustained).into(),
        ),
        ("elapsed (s)", format!("{:.2}", r.elapsed_s)),
        (
            "CPU s per million requests",
            format!("{:.2}", r.cpu_s_per_million),
        ),
        (
            "  of which thread wake-ups (upper estimate)",
            format!(
                "{:.2} ({:.0} sleeps/s x {:.1} us, measured before the run)",
                r.wakeups_s_per_million, r.sleeps_per_s, r.wake_cost_us
            ),
        ),
        (
            "  a load from memory (32 MiB ring)",
            format!("{:.1} ns, measured before the run", r.mem_latency_ns),
        ),
        (
            "  by thread: CPU s/M (sleeps/s)",
            r.threads
                .iter()
                .map(|t| {
                    format!(
                        "{} {:.2} ({:.0})",
                        t.name, t.cpu_s_per_million, t.sleeps_per_s
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
    ];
    if let (Some(b), Some(share)) = (&r.baseline, r.purgatory_share()) {
        rows.push((
            "harness alone, same flags: CPU s/M",
            format!(
                "{:.2} ({}; {:.0} sleeps/s; {})",
                b.cpu_s_per_million,
                b.threads
                    .iter()
                    .filter(|t| t.name != "timer")
                    .map(|t| format!("{} {:.2}", t.name, t.cpu_s_per_million))
                    .collect::<Vec<_>>()
                    .join(", "),
                b.sleeps_per_s,
                if b.sustained {
                    "sustained, checks pass"
                } else {
                    "NOT sustained"
                }
            ),
        ));
        rows.push((
            "  the purgatory's share (run minus harness)",
            format!("{share:.2}"),
        ));
    }
    let bytes = |b: Option<f64>| b.map_or("- (nothing pending)".into(), |b| format!("{b:.0}"));
    let bytes_per_pending = match &r.baseline {
        Some(b) => format!(
            "{} (harness alone: {})",
            bytes(r.bytes_per_pending),
            bytes(b.bytes_per_pending)
        ),
        None => bytes(r.bytes_per_pending),
    };
    rows.extend([
        ("peak RSS (MB)", format!("{:.1}", r.peak_rss as f64 / 1e6)),
        ("peak pending requests", r.peak_pending.to_string()),
        ("bytes per pending request (process)", bytes_per_pending),
        ("completed early", r.completed_early.to_string()),
        ("expired", r.expired.to_string()),
        (
            "expected expired (latency >= timeout)",
            format!(
                "{} (+{} within the tolerance under it)",
                r.expected_expired, r.boundary
            ),
        ),
        (
            "expired count as expected (+ the tolerance's at most)",
            yes(expired_ok(r)).into(),
        ),
        (
            "every outcome consistent with its timing",
            if r.wrong_outcome == 0 {
                "yes".into()
            } else {
                format!("NO: {} requests", r.wrong_outcome)
            },
        ),
        (
            "exactly once (on_complete per request)",
            if r.exactly_once {
                "yes".into()
            } else {
                format!("NO: {} requests", r.not_exactly_once)
            },
        ),
        (
            "completion delay vs intended p50/p99/p99.9/max (ms)",
            format!(
                "{:.3} / {:.3} / {:.3} / {:.3}",
                r.delay_ms[0], r.delay_ms[1], r.delay_ms[2], r.delay_ms[3]
            ),
        ),
        (
            "completer lag p99 (ms)",
            format!("{:.3}", r.completer_lag_p99_ms),
        ),
        ("purges", r.purges.to_string()),
        (
            "advances by generator / reaper wake-ups (/s)",
            format!(
                "{:.0} / {:.0}",
                r.caller_advances_per_s, r.reaper_wakeups_per_s
            ),
        ),
    ]);
    for (k, v) in rows {
        let _ = writeln!(out, "  {k:<52} {v}");
    }
    out
}

/// `t` as a JSON string: quoted, with `"`, `\` and the control characters escaped (RFC 8259
/// §7). The machine line comes from files of the system (`/proc/cpuinfo`, the kernel's
/// release): a control character there (a tab in a CPU's name) made the object invalid JSON,
/// when only `"` and `\` were escaped.
fn json_string(t: &str) -> String {
    let mut out = String::with_capacity(t.len() + 2);
    out.push('"');
    for c in t.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn to_json(args: &Args, r: &Report) -> String {
    let mut s = String::from("{");
    let mut field = |k: &str, v: String| {
        if s.len() > 1 {
            s.push(',');
        }
        let _ = write!(s, "\"{k}\":{v}");
    };
    let q = json_string;
    field("workload", q("W4"));
    field("machine", q(&machine_line()));
    field("model", q(&r.model));
    field("num", r.num.to_string());
    field("pct50_ms", args.pct50.to_string());
    field("pct75_ms", args.pct75.to_string());
    field("timeout_ms", args.timeout.to_string());
    field("keys", args.keys.to_string());
    field("key_space", args.key_space.to_string());
    field("tick_ms", args.tick_ms.to_string());
    field("wheel_size", args.wheel_size.to_string());
    field("reaper_grace_ms", args.reaper_grace_ms.to_string());
    field("executors", args.executors.to_string());
    field("purge_interval", args.purge_interval.to_string());
    field("seed", args.seed.to_string());
    field("completer_tick_us", args.completer_tick_us.to_string());
    field(
        "completer_wake",
        q(&format!("{:?}", args.completer_wake).to_lowercase()),
    );
    field("ready_hint", args.uses_ready_hints().to_string());
    field("target_rate", format!("{:.1}", r.target_rate));
    field("achieved_rate", format!("{:.1}", r.achieved_rate));
    field("sustained", r.sustained.to_string());
    field("elapsed_s", format!("{:.3}", r.elapsed_s));
    field("cpu_s_per_million", format!("{:.3}", r.cpu_s_per_million));
    field("sleeps_per_s", format!("{:.1}", r.sleeps_per_s));
    field("wake_cost_us", format!("{:.2}", r.wake_cost_us));
    field("mem_latency_ns", format!("{:.1}", r.mem_latency_ns));
    field(
        "wakeups_s_per_million",
        format!("{:.3}", r.wakeups_s_per_million),
    );
    field(
        "threads",
        format!(
            "{{{}}}",
            r.threads
                .iter()
                .map(|t| format!(
                    "\"{}\":{{\"cpu_s_per_million\":{:.3},\"sleeps_per_s\":{:.1}}}",
                    t.name, t.cpu_s_per_million, t.sleeps_per_s
                ))
                .collect::<Vec<_>>()
                .join(",")
        ),
    );
    field("peak_rss_bytes", r.peak_rss.to_string());
    field("peak_pending", r.peak_pending.to_string());
    field(
        "bytes_per_pending",
        r.bytes_per_pending
            .map_or("null".into(), |b| format!("{b:.1}")),
    );
    field("completed_early", r.completed_early.to_string());
    field("expired", r.expired.to_string());
    field("expected_expired", r.expected_expired.to_string());
    field("expired_tolerance", r.boundary.to_string());
    field("expired_ok", expired_ok(r).to_string());
    field("wrong_outcome", r.wrong_outcome.to_string());
    field("exactly_once", r.exactly_once.to_string());
    field("not_exactly_once", r.not_exactly_once.to_string());
    field(
        "completion_delay_ms",
        format!(
            "{{\"p50\":{:.4},\"p99\":{:.4},\"p999\":{:.4},\"max\":{:.4}}}",
            r.delay_ms[0], r.delay_ms[1], r.delay_ms[2], r.delay_ms[3]
        ),
    );
    field(
        "completer_lag_p99_ms",
        format!("{:.4}", r.completer_lag_p99_ms),
    );
    field("purges", r.purges.to_string());
    field(
        "caller_advances_per_s",
        format!("{:.1}", r.caller_advances_per_s),
    );
    field(
        "reaper_wakeups_per_s",
        format!("{:.1}", r.reaper_wakeups_per_s),
    );
    field("harness_only", args.harness_only.to_string());
    if let (Some(b), Some(share)) = (&r.baseline, r.purgatory_share()) {
        field("baseline", to_json(&harness_alone(args), b));
        field("purgatory_cpu_s_per_million", format!("{share:.3}"));
    }
    s.push('}');
    s
}

/// What [`search_max_rate`] found: the highest rate sustained and its run's report, the lowest
/// rate found not sustained above it (`None`: every probe was sustained), and the lowest rate
/// tried.
#[derive(Debug)]
struct Search<R> {
    good: Option<(f64, R)>,
    bad: Option<f64>,
    lowest: f64,
}

/// `--find-max-rate`'s search from `start`, `probe` running one rate (its report if
/// sustained): doubles the rate while it is sustained, 12 probes at most; if even the start is
/// not, halves it until one is, 8 probes at most; then bisects 4 times between the highest rate
/// sustained and the lowest not. Every rate tried is one the command line takes (1 to 10^9
/// req/s, the last step up or down stopping at the bound): it doubled past 10^9 (gaps that
/// round to 0 ns) and halved below 1 (from `--rate 2`, runs of a request every 2, 4, ... 256 s).
fn search_max_rate<R>(start: f64, mut probe: impl FnMut(f64) -> Option<R>) -> Search<R> {
    let mut good = None;
    let mut bad = None;
    let mut rate = start;
    let mut lowest = rate;
    for _ in 0..12 {
        match probe(rate) {
            Some(r) => {
                good = Some((rate, r));
                if rate >= MAX_RATE {
                    break;
                }
                rate = (rate * 2.0).min(MAX_RATE);
            }
            None => {
                bad = Some(rate);
                break;
            }
        }
    }
    if good.is_none() {
        // Even the starting rate failed: search downwards.
        let mut hi = rate;
        for _ in 0..8 {
            if hi <= 1.0 {
                break;
            }
            let above = hi;
            hi = (hi / 2.0).max(1.0);
            lowest = hi;
            if let Some(r) = probe(hi) {
                good = Some((hi, r));
                bad = Some(above);
                break;
            }
        }
    }
    if let (Some(lo), Some(hi)) = (good.as_ref().map(|g| g.0), bad) {
        let (mut lo, mut hi) = (lo, hi);
        for _ in 0..4 {
            let mid = (lo + hi) / 2.0;
            match probe(mid) {
                Some(r) => {
                    lo = mid;
                    good = Some((mid, r));
                }
                None => hi = mid,
            }
        }
    }
    Search { good, bad, lowest }
}

fn find_max_rate(args: &Args) -> ExitCode {
    find_max_rate_with(args, run_in_child)
}

/// [`find_max_rate`], each probe run by `run_once`.
fn find_max_rate_with(
    args: &Args,
    mut run_once: impl FnMut(&Args) -> Result<Report, String>,
) -> ExitCode {
    // A probe that breaks correctness (not merely the rate) fails the whole search; one that
    // could not run (its process) fails it too, and the probes after it are not run.
    let broken = std::cell::Cell::new(0usize);
    let failed = std::cell::RefCell::new(None::<String>);
    let mut probe = |rate: f64| -> Option<Report> {
        if failed.borrow().is_some() {
            return None;
        }
        let a = Args {
            rate,
            progress: 0.0,
            ..args.clone()
        };
        let r = match run_once(&a) {
            Ok(r) => r,
            Err(e) => {
                *failed.borrow_mut() = Some(format!("rate {rate:.0}: {e}"));
                return None;
            }
        };
        if !correct(&r) {
            broken.set(broken.get() + 1);
        }
        note!(
            "  rate {:>9.0}: achieved {:>9.0}, cpu {:.2} s/M, expired {} (expected {} +{}), exactly once {}: {}",
            rate,
            r.achieved_rate,
            r.cpu_s_per_million,
            r.expired,
            r.expected_expired,
            r.boundary,
            r.exactly_once,
            if r.sustained { "sustained" } else { "NOT sustained" }
        );
        Some(r)
    };
    if args.num < FIND_MAX_RATE_MIN_NUM {
        note!(
            "warning: --num {} is too few requests for the rate found to mean much (each probe \
             lasts a moment; use {FIND_MAX_RATE_MIN_NUM} or more)",
            args.num
        );
    }
    // Before the first probe: a standard output that cannot be written ends the search now,
    // not after every probe has run.
    if !to_stdout(format_args!(
        "{} -- searching for the highest sustained rate\nmachine: {}\n",
        header(args),
        machine_line()
    )) {
        return exit_status(true);
    }
    let Search { good, bad, lowest } =
        search_max_rate(args.rate, |rate| probe(rate).filter(|r| r.sustained));
    let (verdict, passed) = if let Some(e) = failed.take() {
        (format!("a probe could not run: {e}: failed"), false)
    } else if broken.get() > 0 {
        (
            format!(
                "{} probe(s) broke exactly-once, an outcome or the counts: failed",
                broken.get()
            ),
            false,
        )
    } else {
        match good {
            Some((rate, r)) => (
                format!(
                    "highest sustained rate: {rate:.0} req/s (achieved {:.0}, {:.2} CPU s per million, peak RSS {:.1} MB){}",
                    r.achieved_rate,
                    r.cpu_s_per_million,
                    r.peak_rss as f64 / 1e6,
                    match bad {
                        Some(_) => "",
                        None if rate >= MAX_RATE => "; the highest rate --rate takes",
                        None => "; every probe was sustained, so this is a lower bound (start higher with --rate)",
                    }
                ),
                true,
            ),
            None => (
                format!("no rate was sustained, down to {lowest:.0} req/s"),
                false,
            ),
        }
    };
    to_stdout(format_args!("{verdict}\n"));
    exit_status(passed)
}

/// The rate series' windows that the generator spent whole issuing: the first `floor(span ×
/// 10)`, the span being the run's issuing time (`num / achieved_rate`). The window it ended in,
/// partial, would look like a drop, and the later ones (sampled while the run drained) are
/// empty. One more whole window was dropped too (`floor − 1`).
fn generating_windows(r: &Report) -> &[f64] {
    let windows = ((r.num as f64 / r.achieved_rate.max(1.0)) * 10.0).floor() as usize;
    &r.rate_series[..r.rate_series.len().min(windows.max(1))]
}

/// A panel of the `--plot` figure: its axes' ranges and its line's points.
#[derive(Debug, PartialEq)]
struct Panel {
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    points: Vec<(f64, f64)>,
}

/// The completion-delay panel, from the delays (ms, sorted; `None` if there are none): the
/// empirical CDF up to p99.9 (the (i+1)-th smallest delay has i+1 of n at or below it, so the
/// line tops out at 1 with every request counted), thinned to every `n / 600`-th delay; x from
/// the smallest delay (or 0) to p99.9 (at least 1 µs wide), y from 0 to 1.
fn cdf_panel(d: &[f64]) -> Option<Panel> {
    let n = d.len();
    let lo = d.first()?.min(0.0);
    let hi = d[n * 999 / 1000].max(lo + 1e-3);
    let points = d
        .iter()
        .enumerate()
        .step_by((n / 600).max(1))
        .filter(|(_, v)| **v <= hi)
        .map(|(i, v)| (*v, (i + 1) as f64 / n as f64))
        .collect();
    Some(Panel {
        x: lo..hi,
        y: 0.0..1.0,
        points,
    })
}

/// The issue-rate panel, from the generating windows' rates (req/s per 100 ms window; `None`
/// if there are none): a point per window at its start (s), x over the windows, y from 0 to
/// 15% above the highest rate or the target, whichever is higher.
fn rate_panel(series: &[f64], target: f64) -> Option<Panel> {
    if series.is_empty() {
        return None;
    }
    let top = series.iter().copied().fold(target, f64::max) * 1.15;
    Some(Panel {
        x: 0.0..series.len() as f64 / 10.0,
        y: 0.0..top,
        points: (0..)
            .map(|i| f64::from(i) / 10.0)
            .zip(series.iter().copied())
            .collect(),
    })
}

/// The `--plot` figure, drawn with plotters (SVG backend): the run's header, then the
/// completion-delay distribution (CDF up to p99.9) and the achieved issue rate per 100 ms window
/// while the generator ran, against the target rate.
/// A drawing error is returned (nothing half-drawn is written).
fn plot_svg(args: &Args, r: &Report) -> Result<String, String> {
    let mut svg = String::new();
    draw_plot(&mut svg, args, r).map_err(|e| e.to_string())?;
    Ok(svg)
}

fn draw_plot(svg: &mut String, args: &Args, r: &Report) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::with_string(svg, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let head = header(args);
    let (a, b) = head.split_at(head.find(", tick").unwrap_or(head.len()));
    root.draw(&Text::new(
        a.to_string(),
        (10, 8),
        ("sans-serif", 15).into_font().style(FontStyle::Bold),
    ))?;
    // The flags after the tick on two lines (one ran past the figure's width).
    let b = b.trim_start_matches(", ");
    let (b, c) = b.split_at(b.find(", completer tick").unwrap_or(b.len()));
    for (line, y) in [(b, 28), (c.trim_start_matches(", "), 44)] {
        root.draw(&Text::new(line.to_string(), (10, y), ("sans-serif", 13)))?;
    }
    let (cdf_area, rate_area) = root.margin(64, 5, 5, 10).split_vertically(320);

    // Panel 1: CDF of the completion delay vs the intended time.
    if let Some(cdf) = cdf_panel(&r.delays) {
        let mut chart = ChartBuilder::on(&cdf_area)
            .caption(
                "completion time minus intended time (latency, capped at the timeout): CDF up to p99.9",
                ("sans-serif", 14),
            )
            .margin(8)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(cdf.x, cdf.y)?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("fraction of requests")
            .x_label_formatter(&|v| format!("{v:.2}"))
            .draw()?;
        chart.draw_series(LineSeries::new(
            cdf.points,
            ShapeStyle::from(&BLUE).stroke_width(2),
        ))?;
    }

    // Panel 2: issue rate over time, while generating.
    if let Some(rates) = rate_panel(generating_windows(r), args.rate) {
        let secs = rates.x.end;
        let mut chart = ChartBuilder::on(&rate_area)
            .caption(
                "issued requests per second (100 ms windows); dashed: the target rate",
                ("sans-serif", 14),
            )
            .margin(8)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(rates.x, rates.y)?;
        chart
            .configure_mesh()
            .x_desc("s")
            .y_desc("requests/s")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        chart.draw_series(LineSeries::new(
            rates.points,
            ShapeStyle::from(&RGBColor(230, 120, 0)).stroke_width(2),
        ))?;
        chart.draw_series(DashedLineSeries::new(
            [(0.0, args.rate), (secs, args.rate)],
            6,
            4,
            ShapeStyle::from(&BLACK),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character JSON requires escaped is (RFC 8259 §7: `"`, `\` and U+0000..U+001F);
    /// the rest pass through. Only `"` and `\` were: a tab or a newline in the machine line
    /// (read from system files) went out raw, and the object was not valid JSON.
    #[test]
    fn json_strings_escape_quotes_backslashes_and_control_characters() {
        assert_eq!(json_string("W4"), r#""W4""#);
        assert_eq!(json_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(json_string("AMD\tEPYC\n"), r#""AMD\tEPYC\n""#);
        assert_eq!(json_string("\r\u{0}\u{1f}"), r#""\r\u0000\u001f""#);
        assert_eq!(json_string("\u{7f}é ∞"), "\"\u{7f}é ∞\"");
        let all: String = (0u8..0x20).map(char::from).collect();
        let escaped = json_string(&all);
        assert!(
            escaped.chars().all(|c| u32::from(c) >= 0x20),
            "a raw control character: {escaped:?}"
        );
    }

    fn small(model: Model) -> Args {
        Args {
            num: 5_000,
            rate: 20_000.0,
            pct50: 5.0,
            pct75: 15.0,
            timeout: 50,
            key_space: 20,
            model,
            purge_interval: 100,
            executors: 1,
            progress: 0.0,
            ..Args::default()
        }
    }

    /// The harness alone logs every request exactly once, each at the outcome its latency
    /// decides (an expiry exactly when the latency reached the timeout, never before the
    /// deadline), with the same sleeps as a real run and no purgatory work; `--baseline` runs it
    /// after a real run and reports the difference.
    #[test]
    fn the_harness_alone_logs_each_request_once_and_is_the_baseline() {
        let a = Args {
            harness_only: true,
            ..small(Model::Kafka)
        };
        let r = run_once(&a);
        assert!(r.exactly_once, "{} not exactly once", r.not_exactly_once);
        assert_eq!(r.wrong_outcome, 0);
        assert_eq!(r.expired, r.expected_expired, "no timer: no boundary slack");
        assert_eq!(r.completed_early + r.expired, a.num);
        assert_eq!(
            (r.purges, r.caller_advances_per_s),
            (0, 0.0),
            "no purgatory"
        );
        assert!(
            r.peak_pending > 0,
            "pending is sampled from the completer's count"
        );
        for t in &r.threads[..2] {
            assert!(t.cpu_s_per_million > 0.0 && t.sleeps_per_s > 0.0, "{t:?}");
        }
        assert!(header(&a).contains("harness only"));

        let b = Args {
            baseline: true,
            ..small(Model::Watch)
        };
        let r = run_with_baseline(&b, |a| Ok(run_once(a))).unwrap();
        let alone = r.baseline.as_deref().expect("a baseline run");
        assert!(alone.exactly_once && alone.expired == alone.expected_expired);
        assert!(alone.baseline.is_none());
        let json = to_json(&b, &r);
        assert!(
            json.contains("\"baseline\":{\"workload\":\"W4\"")
                && json.contains("\"harness_only\":true")
                && json.contains("\"purgatory_cpu_s_per_million\":"),
            "{json}"
        );
    }

    /// A small run of each model completes every request exactly once, expires about the
    /// requests whose latency reached the timeout, and renders its JSON and SVG.
    #[test]
    fn small_runs_of_both_models_check_out() {
        // Both ways of waking the completer, across the two models; `watch` with and without
        // ready hints.
        for (model, wake, ready_hint) in [
            (Model::Kafka, CompleterWake::Generator, true),
            (Model::Watch, CompleterWake::Timer, false),
            (Model::Watch, CompleterWake::Generator, true),
        ] {
            let a = Args {
                completer_wake: wake,
                ready_hint,
                ..small(model)
            };
            let r = run_once(&a);
            assert!(
                r.exactly_once,
                "{model:?}: {} not exactly once",
                r.not_exactly_once
            );
            assert_eq!(r.completed_early + r.expired, a.num, "{model:?}");
            assert!(
                r.expected_expired > 0,
                "the distribution has a tail past the timeout"
            );
            // Never fewer expiries than the requests whose latency reached the timeout (the
            // completer is never given those), and no outcome against the completer's timing
            // (a lost completion expires): exact. More expiries are a late completer's: a
            // loaded machine (load 8 on 2 cores, helpers' builds beside it) made 3.3% of the
            // requests late, so the bound above is generous.
            assert_eq!(r.wrong_outcome, 0, "{model:?}");
            assert!(
                r.expired >= r.expected_expired,
                "{model:?}: expired {} < expected {}",
                r.expired,
                r.expected_expired
            );
            assert!(
                r.expired - r.expected_expired <= r.boundary + a.num / 20,
                "{model:?}: expired {} vs expected {} ±{}",
                r.expired,
                r.expected_expired,
                r.boundary
            );
            // The samples the generator took between bursts (5,000 requests at 20,000/s: 250 ms).
            assert!(r.peak_pending > 0, "{model:?}: pending was sampled");
            let counted: f64 = r.rate_series.iter().sum::<f64>() / 10.0;
            assert!(
                r.rate_series.len() >= 2 && r.rate_series[0] > 0.0 && counted <= a.num as f64 + 0.5,
                "{model:?}: one rate per whole 100 ms window: {:?}",
                r.rate_series
            );
            // Where the CPU went: wake-ups (estimated from a measured wake-up cost, which is
            // never zero), and the three threads, each with some CPU and some sleeps.
            assert!(
                r.wake_cost_us > 0.0 && r.wakeups_s_per_million > 0.0,
                "{r:?}"
            );
            assert!(
                r.mem_latency_ns.is_finite() && r.mem_latency_ns > 0.0,
                "{r:?}"
            );
            // The purgatory's timer has a reaper grace (W4's default 2 ms): the generator, which
            // issues a burst every millisecond, advances the timer for the reaper.
            assert!(r.caller_advances_per_s > 0.0, "{model:?}: {r:?}");
            let names: Vec<&str> = r.threads.iter().map(|t| t.name).collect();
            assert_eq!(names, ["generator", "completer", "timer"]);
            for t in &r.threads {
                assert!(t.cpu_s_per_million > 0.0 && t.sleeps_per_s > 0.0, "{t:?}");
            }
            let json = to_json(&a, &r);
            assert!(
                json.starts_with('{')
                    && json.ends_with('}')
                    && json.contains("\"exactly_once\":true")
                    && json.contains("\"completer\":{\"cpu_s_per_million\":")
                    && json.contains(&format!("\"executors\":{},", a.executors))
                    && json.contains(&format!("\"purge_interval\":{},", a.purge_interval))
                    && json.contains(&format!("\"seed\":{},", a.seed))
                    && json.contains(&format!("\"completer_tick_us\":{},", a.completer_tick_us))
            );
            let svg = plot_svg(&a, &r).expect("drawn");
            assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("CDF"));
            assert!(svg.contains("issued requests per second"), "no rate panel");
        }
    }

    #[test]
    fn bad_flags_are_rejected() {
        let mut a = small(Model::Kafka);
        a.pct75 = 1.0;
        assert!(validate(&a).is_err());
        a = small(Model::Kafka);
        a.keys = 0;
        assert!(validate(&a).is_err());
        assert!(validate(&small(Model::Watch)).is_ok());
        // Each of these used to panic, abort on a huge allocation, hang or print NaN.
        let bad: [fn(&mut Args); 23] = [
            |a| a.tick_ms = f64::INFINITY,
            |a| a.tick_ms = 1e-9,
            |a| a.wheel_size = 1_000_000_000,
            |a| (a.pct50, a.pct75) = (f64::INFINITY, f64::INFINITY),
            |a| a.completer_tick_us = 1_000_000_000,
            |a| a.timeout = 2_000_000_000,
            |a| a.keys = 1_000_000_000,
            |a| a.rate = 1e-300,
            |a| (a.find_max_rate, a.json) = (true, true),
            |a| (a.find_max_rate, a.baseline) = (true, true),
            |a| a.reaper_grace_ms = 1e30,
            |a| a.reaper_grace_ms = f64::NAN,
            |a| a.executors = 1_000_000,
            |a| (a.keys, a.key_space) = (5, 2),
            |a| a.progress = -1.0,
            |a| a.progress = f64::NAN,
            |a| a.progress = f64::INFINITY,
            |a| a.rate = 1e300,
            |a| a.rate = MAX_RATE * 2.0,
            |a| a.purge_interval = 0,
            |a| (a.harness_only, a.baseline) = (true, true),
            |a| a.plot = Some(PathBuf::from("plot.png")),
            |a| a.plot = Some(PathBuf::from("plot")),
        ];
        for (i, spoil) in bad.iter().enumerate() {
            let mut a = small(Model::Kafka);
            spoil(&mut a);
            assert!(validate(&a).is_err(), "case {i} accepted");
        }
        // The edges of what was just refused are accepted.
        let good: [fn(&mut Args); 4] = [
            |a| a.rate = MAX_RATE,
            |a| a.purge_interval = 1,
            |a| a.plot = Some(PathBuf::from("out/Plot.SVG")),
            |a| a.baseline = true,
        ];
        for (i, keep) in good.iter().enumerate() {
            let mut a = small(Model::Kafka);
            keep(&mut a);
            assert!(validate(&a).is_ok(), "case {i} refused");
        }
    }

    /// Each bound `validate` checks, at its edge and one step past it: the edge is accepted, the
    /// step past refused (a bound checked with `>=` for `>`, or one of two conditions joined
    /// with `&&` for `||`, passed `bad_flags_are_rejected`, which tries values far out).
    #[test]
    fn each_flag_bound_is_accepted_at_its_edge_and_refused_past_it() {
        type Spoil = fn(&mut Args);
        let edges: [(&str, Spoil, Spoil); 20] = [
            ("num", |a| a.num = 1, |a| a.num = 0),
            ("rate low", |a| a.rate = 1.0, |a| a.rate = 0.999),
            ("pct50", |a| a.pct50 = 1e-9, |a| a.pct50 = 0.0),
            (
                "pct75",
                |a| a.pct75 = a.pct50,
                |a| a.pct75 = a.pct50 * 0.999,
            ),
            ("keys low", |a| a.keys = 1, |a| a.keys = 0),
            (
                "keys high",
                |a| (a.keys, a.key_space) = (MAX_KEYS, MAX_KEYS as u32),
                |a| (a.keys, a.key_space) = (MAX_KEYS + 1, MAX_KEYS as u32 + 1),
            ),
            (
                "key space low",
                |a| (a.keys, a.key_space) = (1, 1),
                |a| a.key_space = 0,
            ),
            (
                "keys <= key space",
                |a| (a.keys, a.key_space) = (7, 7),
                |a| (a.keys, a.key_space) = (8, 7),
            ),
            (
                "timeout low",
                |a| (a.timeout, a.tick_ms, a.completer_tick_us) = (1, 1.0, 1000),
                |a| a.timeout = 0,
            ),
            (
                "timeout high",
                |a| a.timeout = MAX_TIMEOUT_MS,
                |a| a.timeout = MAX_TIMEOUT_MS + 1,
            ),
            (
                "completer tick",
                |a| a.completer_tick_us = a.timeout * 1000,
                |a| a.completer_tick_us = a.timeout * 1000 + 1,
            ),
            ("tick low", |a| a.tick_ms = 0.001, |a| a.tick_ms = 0.000_999),
            (
                "tick high",
                |a| (a.timeout, a.tick_ms) = (MAX_TIMEOUT_MS, 3_600_000.0),
                |a| (a.timeout, a.tick_ms) = (MAX_TIMEOUT_MS, 3_600_000.001),
            ),
            ("wheel low", |a| a.wheel_size = 2, |a| a.wheel_size = 1),
            (
                "wheel high",
                |a| a.wheel_size = timing_wheel::MAX_WHEEL_SIZE,
                |a| a.wheel_size = timing_wheel::MAX_WHEEL_SIZE + 1,
            ),
            (
                "find max rate",
                |a| a.find_max_rate = true,
                |a| (a.find_max_rate, a.plot) = (true, Some(PathBuf::from("p.svg"))),
            ),
            (
                "grace low",
                |a| a.reaper_grace_ms = 0.0,
                |a| a.reaper_grace_ms = -0.001,
            ),
            (
                "grace high",
                |a| a.reaper_grace_ms = 3_600_000.0,
                |a| a.reaper_grace_ms = 3_600_000.001,
            ),
            (
                "executors",
                |a| a.executors = MAX_EXECUTORS,
                |a| a.executors = MAX_EXECUTORS + 1,
            ),
            ("progress", |a| a.progress = 0.0, |a| a.progress = -0.001),
        ];
        for (name, edge, past) in edges {
            let mut a = small(Model::Kafka);
            edge(&mut a);
            assert_eq!(validate(&a), Ok(()), "{name}: the edge refused");
            let mut a = small(Model::Kafka);
            past(&mut a);
            assert!(validate(&a).is_err(), "{name}: one step past accepted");
        }
        // `--num`'s own bound: at it, only the memory check may refuse (2^31 requests' tables
        // are more than this machine has); one past it, `--num`'s check does.
        let num_bound = "--num must be at most";
        let mut a = small(Model::Kafka);
        a.num = EXPIRES as usize;
        assert!(!validate(&a).is_err_and(|e| e.contains(num_bound)));
        a.num += 1;
        assert!(validate(&a).is_err_and(|e| e.contains(num_bound)));
    }

    /// A run whose per-request tables alone (built before the clock starts) are more than the
    /// machine's memory is refused with status 2: each flag within its bounds, `--model watch
    /// --keys 1024 --key-space 1024 --num 10000000` aborted on a 40 GB allocation (status 134
    /// and a backtrace), and a `--num` near its bound was killed once its tables were filled.
    #[test]
    fn runs_whose_tables_exceed_the_memory_are_refused() {
        // 2^31 requests watching 1,024 keys each: 9 TB of tables, more than any machine here.
        let mut huge = small(Model::Watch);
        (huge.num, huge.keys, huge.key_space) = (EXPIRES as usize, MAX_KEYS, MAX_KEYS as u32);
        let e = validate(&huge).expect_err("9 TB of tables accepted");
        assert!(e.contains("memory"), "{e}");
        // Against a machine of 16 GB: 10^7 requests of 1,024 keys (41 GB) refused, in the
        // `watch` model only (the `kafka` model's requests share one set of keys); W4's default
        // run (about 65 MB of tables) accepted; a machine of unknown memory accepts anything.
        let gb16 = Some(16u64 << 30);
        let mut big = huge.clone();
        big.num = 10_000_000;
        assert!(check_memory(&big, gb16).is_err());
        big.model = Model::Kafka;
        assert!(check_memory(&big, gb16).is_ok());
        assert!(check_memory(&Args::default(), gb16).is_ok());
        assert!(check_memory(&huge, None).is_ok());
    }

    /// The per-request tables are 65 bytes a request, plus 4 a key in the `watch` model (what
    /// `--num`'s help says), and a machine with exactly the memory they need runs them.
    #[test]
    fn the_tables_are_65_bytes_a_request_plus_4_a_key_watched() {
        let mut a = Args {
            num: 1_000,
            keys: 3,
            ..small(Model::Kafka)
        };
        assert_eq!(tables_bytes(&a), 65_000);
        a.model = Model::Watch;
        assert_eq!(tables_bytes(&a), 77_000);
        assert!(check_memory(&a, Some(77_000)).is_ok());
        assert!(check_memory(&a, Some(76_999)).is_err());
    }

    /// The completer's sleep lasts at least a tick, and ends no later after its next due time
    /// than the lateness the expired count's tolerance allows for. That tolerance was one tick
    /// in `Generator` mode too, where the completer is up to two ticks late when the generator
    /// sleeps (low rates) and nudges no one: requests under the timeout by 1–2 ticks expired
    /// with a correct purgatory, and the run was "not sustained".
    #[test]
    fn the_completer_is_no_later_than_the_tolerance_allows() {
        let tick = 1_000_000;
        for wake in [CompleterWake::Generator, CompleterWake::Timer] {
            let late = completer_lateness_ns(wake, tick);
            for until_due in [0, 1, 10_000, tick - 1, tick, tick + 1, 50 * tick] {
                for phase in [Some(wake), None] {
                    let d = completer_sleep(phase, until_due, tick).as_nanos() as u64;
                    assert!(d <= until_due + late, "{phase:?} {until_due}: {d}");
                    assert!(d >= tick, "{phase:?} {until_due}: {d}");
                }
            }
        }
        let a = Args {
            completer_wake: CompleterWake::Generator,
            ..small(Model::Kafka)
        };
        assert_eq!(
            expired_tolerance_ns(&a),
            2 * a.completer_tick_us * 1_000,
            "the run's tolerance is the completer's lateness"
        );
    }

    /// Each way an outcome can contradict the timing is counted. A completion (not an expiry)
    /// before the request's latency, which nothing in a correct run causes (the completer acts
    /// at the due time), was not: the run reported every outcome consistent.
    #[test]
    fn outcomes_that_contradict_the_timing_are_counted() {
        let (arrival, timeout) = (1_000, 200_000_000);
        let latency = 20_000_000;
        let due = arrival + latency;
        let deadline = arrival + timeout;
        let o = |expired, done_ns, acted_ns| Outcome {
            expired,
            done_ns,
            acted_ns,
        };
        // Consistent: completed at or after its due time by the completer's call (before it
        // returned); expired at or after the deadline with no call before it (a late
        // completer), or after a call that returned at the deadline itself (not before it).
        for ok in [
            o(false, due, due + 10),
            o(false, due + 5, due + 5),
            o(true, deadline, 0),
            o(true, deadline, deadline),
        ] {
            assert!(!wrong_outcome(ok, arrival, latency, timeout), "{ok:?}");
        }
        assert!(!wrong_outcome(
            o(true, deadline + 1, deadline + 5),
            arrival,
            latency,
            timeout
        ));
        // Wrong: completed before its latency (premature), expired early, expired after the
        // completer's call had returned, a latency past the timeout not expired, completed
        // (not by expiry) after the completer's call had returned or with no call.
        for bad in [
            o(false, due - 1, due + 10),
            o(false, arrival, 0),
            o(true, deadline - 1, 0),
            o(true, deadline, due + 10),
            o(false, due + 11, due + 10),
            o(false, due + 5, 0),
        ] {
            assert!(wrong_outcome(bad, arrival, latency, timeout), "{bad:?}");
        }
        assert!(wrong_outcome(
            o(false, deadline + 1, 0),
            arrival,
            timeout,
            timeout
        ));
    }

    /// The table's header line (the plot's too) names every flag that changes the figures, as
    /// the JSON does: `--seed` (the draws) and `--completer-tick-us` (the completer's wake-ups,
    /// in the CPU figure) were missing, so the tables of runs that differed in them read the same.
    #[test]
    fn the_header_names_the_seed_and_the_completer_tick() {
        let a = Args {
            seed: 7,
            completer_tick_us: 250,
            ..small(Model::Kafka)
        };
        let h = header(&a);
        assert!(
            h.contains("completer tick 250 us") && h.ends_with(", seed 7"),
            "{h}"
        );
        // The plot's header, on three lines.
        let svg = plot_svg(&a, &Report::default()).expect("drawn");
        for line in [
            "W4 purgatory load: model kafka",
            "tick 1 ms, wheel 20",
            "seed 7",
        ] {
            assert!(svg.contains(line), "{line}: {svg}");
        }
    }

    /// `Args::default()` is what the command line gives with no flags: W4's default point.
    #[test]
    fn the_default_args_are_the_command_lines() {
        let a = Args::default();
        assert_eq!((a.num, a.rate, a.timeout), (1_000_000, 100_000.0, 200));
        assert_eq!((a.pct50, a.pct75, a.model), (20.0, 60.0, Model::Kafka));
        assert!(a.plot.is_none() && !a.json && !a.harness_only && a.progress == 1.0);
        assert!(validate(&a).is_ok());
    }

    /// A timer tick longer than the timeout, as the completer's is: the timer can only expire
    /// requests at its ticks, so every expiry came up to a tick late (`--tick-ms 3600000`, which
    /// the timer accepts, made a run of a few thousand requests wait an hour), and the expired
    /// count's tolerance (a tick under the timeout) took in every request, so the check that
    /// expiries match the latencies passed whatever expired.
    #[test]
    fn a_timer_tick_longer_than_the_timeout_is_refused() {
        let mut a = small(Model::Kafka);
        a.tick_ms = a.timeout as f64 + 0.5;
        assert!(validate(&a).is_err(), "tick {} ms accepted", a.tick_ms);
        a.tick_ms = 3_600_000.0;
        assert!(validate(&a).is_err(), "tick {} ms accepted", a.tick_ms);
        a.tick_ms = a.timeout as f64;
        assert!(
            validate(&a).is_ok(),
            "a tick as long as the timeout refused"
        );
    }

    /// The per-window issue rate (the plot's) counts each window's own requests: those issued
    /// after a window's end but before the sample that closes it go to the next window.
    #[test]
    fn the_rate_series_splits_a_sample_at_the_window_boundary() {
        let none = |_: usize, _: bool| Counts {
            pending: 0,
            completed: 0,
            expired: 0,
        };
        let mut s = Sampler::new(0.0);
        // 1,000 requests a second: 95 by 95 ms, 105 by 105 ms, 205 by 205 ms.
        s.poll(95_000_000, 95, none);
        s.poll(105_000_000, 105, none);
        s.poll(205_000_000, 205, none);
        assert_eq!(s.series.len(), 2);
        for rate in &s.series {
            assert!((rate - 1000.0).abs() < 1e-6, "{:?}", s.series);
        }
    }

    /// The table's two exactness rows say "yes" of a run without a fault, and name how many
    /// requests had one otherwise.
    #[test]
    fn the_table_names_the_requests_with_a_wrong_outcome_or_not_exactly_once() {
        let row = |table: &str, name: &str| -> String {
            let line = table
                .lines()
                .map(str::trim_start)
                .find(|l| l.starts_with(name))
                .expect(name);
            line[name.len()..].trim().to_string()
        };
        let (outcome, once) = (
            "every outcome consistent with its timing",
            "exactly once (on_complete per request)",
        );
        let a = small(Model::Kafka);
        let mut r = Report {
            exactly_once: true,
            ..Report::default()
        };
        let fine = table(&a, &r);
        assert_eq!(
            (row(&fine, outcome), row(&fine, once)),
            ("yes".into(), "yes".into())
        );
        (r.wrong_outcome, r.exactly_once, r.not_exactly_once) = (3, false, 5);
        let faulty = table(&a, &r);
        assert_eq!(row(&faulty, outcome), "NO: 3 requests");
        assert_eq!(row(&faulty, once), "NO: 5 requests");
    }

    /// The sampler samples (reads the pending count) at the first poll at or past each 10 ms
    /// of the run's clock, once; after a poll that slept through several windows, at the next
    /// 10 ms, not 10 ms after the poll. It reads the totals only for a progress line, which
    /// comes on the run's clock in seconds. The peak is the highest pending count sampled, and
    /// windows passed between two samples share the requests issued between them evenly.
    #[test]
    fn the_sampler_samples_on_a_10_ms_grid_and_reads_totals_only_for_a_line() {
        use std::cell::RefCell;
        let reads = RefCell::new(Vec::new());
        let mut s = Sampler::new(1.0);
        let ms = 1_000_000u64;
        for t in [
            0, 5, 9, 10, 11, 19, 20, 37, 39, 40, 41, 65, 70, 999, 1000, 1001,
        ] {
            let pending = [3, 7].get(reads.borrow().len()).copied().unwrap_or(1);
            s.poll(t * ms, t as usize, |issued, totals| {
                reads.borrow_mut().push((issued, totals));
                Counts {
                    pending,
                    completed: 0,
                    expired: 0,
                }
            });
            assert_eq!(s.printed, t >= 1000, "a progress line at {t} ms?");
        }
        let (samples, totals): (Vec<_>, Vec<_>) = reads.take().into_iter().partition(|r| !r.1);
        let sampled: Vec<usize> = samples.iter().map(|r| r.0).collect();
        assert_eq!(sampled, [10, 20, 37, 40, 65, 70, 999, 1000]);
        assert_eq!(
            totals,
            [(1000, true)],
            "the totals read once, for the line at 1 s"
        );
        assert_eq!(s.peak, 7);
        // One request a millisecond: 1,000 a second in every window, the nine that passed
        // between the samples at 70 and 999 ms included.
        assert_eq!(s.series.len(), 10);
        for rate in &s.series {
            assert!((rate - 1000.0).abs() < 1e-6, "{:?}", s.series);
        }
    }

    /// Progress lines come once per interval of the run's clock at most. A generator that
    /// slept through several intervals (a low rate) owed a line for each, and paid them back one
    /// per 10 ms sample once polled often again (`--rate 2 --num 6 --progress 0.1`: a dozen
    /// lines stamped 1.8 and 1.9 s, 10 ms apart).
    #[test]
    fn progress_lines_do_not_catch_up_on_missed_intervals() {
        let mut s = Sampler::new(0.1);
        // A first poll 1.85 s into the run (the generator slept until then), then one per ms
        // for 100 ms (the end of the run, waiting for the last completions).
        let due = (0..100)
            .filter(|ms| s.line_due(1.85 + f64::from(*ms) / 1000.0))
            .count();
        assert_eq!(due, 2, "a line at 1.85 s and one at 1.9 s");
        // Off: never a line.
        let mut off = Sampler::new(0.0);
        assert!(!(0..100).any(|t| off.line_due(f64::from(t))));
    }

    /// The search for the highest rate sustained, against a machine that sustains every rate up
    /// to a threshold: it reports the highest rate it sustained, within a sixteenth of the
    /// bracket it found; searches down when even the start is not sustained; says when nothing
    /// was (and how low it went) or when the top was never reached.
    #[test]
    fn the_rate_search_finds_the_highest_rate_sustained() {
        let search = |start: f64, top: f64| {
            let mut tried = Vec::new();
            let found = search_max_rate(start, |rate| {
                tried.push(rate);
                (rate <= top).then_some(rate)
            });
            (found, tried)
        };
        // Up from 100,000: 200,000 sustained, 400,000 not, then bisected.
        let (f, tried) = search(100_000.0, 300_000.0);
        let (best, r) = f.good.expect("a rate was sustained");
        assert_eq!(best, r, "the report is the best probe's");
        assert_eq!(best, 300_000.0, "{tried:?}");
        assert_eq!(f.bad, Some(400_000.0));
        // Down: the start is not sustained; 6,250 is, 12,500 is not; bisected.
        let (f, tried) = search(100_000.0, 10_000.0);
        let best = f.good.expect("a rate was sustained").0;
        assert!(
            best <= 10_000.0 && best > 10_000.0 * 0.9,
            "{best}: {tried:?}"
        );
        assert_eq!(
            tried
                .iter()
                .copied()
                .filter(|&t| t <= 10_000.0)
                .fold(0.0, f64::max),
            best
        );
        // Nothing sustained: 9 probes, the last a 256th of the start.
        let (f, tried) = search(100_000.0, 0.0);
        assert!(f.good.is_none() && tried.len() == 9, "{tried:?}");
        assert_eq!(f.lowest, 100_000.0 / 256.0);
        // Everything sustained: 12 doublings, no rate found not sustained.
        let (f, tried) = search(1_000.0, f64::INFINITY);
        assert_eq!((f.good.map(|g| g.0), f.bad), (Some(2_048_000.0), None));
        assert_eq!(tried.len(), 12);
        // The search stays within the rates the command line takes (1 to 10^9 req/s): it probed
        // 2 x 10^9 (gaps rounding to 0 ns) and, down from 2, half a request a second and less
        // (runs of hours).
        for (start, top) in [(MAX_RATE / 4.0, f64::INFINITY), (2.0, 0.0), (3.0, 0.0)] {
            let (f, tried) = search(start, top);
            assert!(
                tried.iter().all(|r| (1.0..=MAX_RATE).contains(r)),
                "from {start}: {tried:?}"
            );
            assert!(
                tried.contains(&MAX_RATE) || tried.contains(&1.0),
                "from {start}, the bound is tried: {tried:?}"
            );
            assert!(f.lowest >= 1.0);
        }
    }

    /// The CDF panel: from the smallest delay (or 0) to p99.9, a point per `n / 600`-th delay
    /// at the fraction of requests at or below it.
    #[test]
    fn the_cdf_panel_runs_to_p99_9_with_a_point_per_thinned_delay() {
        // 2,000 delays of 1..=2,000 ms: p99.9 is the 1,999th; every 3rd delay is drawn.
        let d: Vec<f64> = (1..=2_000).map(f64::from).collect();
        let cdf = cdf_panel(&d).expect("delays to draw");
        assert_eq!((cdf.x, cdf.y), (0.0..1_999.0, 0.0..1.0));
        assert_eq!(cdf.points.len(), 667); // the delays 1, 4, ..., 1,999
        assert_eq!(cdf.points[0], (1.0, 1.0 / 2_000.0));
        assert_eq!(cdf.points[1], (4.0, 4.0 / 2_000.0));
        assert_eq!(cdf.points[666], (1_999.0, 1_999.0 / 2_000.0));
        // Early completions (negative delays) widen the axis; few delays are all drawn, and
        // one delay, or equal ones, still make an axis 1 µs wide.
        let cdf = cdf_panel(&[-0.5, 0.25, 2.0]).expect("delays to draw");
        assert_eq!(cdf.x, -0.5..2.0);
        assert_eq!(
            cdf.points,
            [(-0.5, 1.0 / 3.0), (0.25, 2.0 / 3.0), (2.0, 1.0)]
        );
        let cdf = cdf_panel(&[0.0, 0.0]).expect("delays to draw");
        assert_eq!(
            (cdf.x, cdf.points),
            (0.0..1e-3, vec![(0.0, 0.5), (0.0, 1.0)])
        );
        assert_eq!(cdf_panel(&[]), None);
    }

    /// The rate panel: a point per 100 ms window at its start, under a top 15% above the
    /// highest rate or the target, whichever is higher.
    #[test]
    fn the_rate_panel_has_a_point_per_window_under_a_top_above_rate_and_target() {
        let p = rate_panel(&[100.0, 300.0, 200.0], 250.0).expect("windows to draw");
        assert_eq!(p.x, 0.0..0.3); // 3 windows
        assert!(
            (p.y.end - 345.0).abs() < 1e-9 && p.y.start == 0.0,
            "{:?}",
            p.y
        );
        assert_eq!(p.points, [(0.0, 100.0), (0.1, 300.0), (0.2, 200.0)]);
        let p = rate_panel(&[100.0], 1_000.0).expect("windows to draw");
        assert!((p.y.end - 1_150.0).abs() < 1e-9, "{:?}", p.y);
        assert_eq!(rate_panel(&[], 1_000.0), None);
    }

    /// The purgatory's ready test reads the flag of the request whose id the watcher gave.
    #[test]
    fn the_ready_test_reads_the_flag_of_the_id_given() {
        let flags = FlagPool::new().take(3);
        let test = ReadyFlags(flags);
        assert!(!(0..3).any(|id| test.maybe_ready(&7, id)));
        flags[1].store(true, Relaxed);
        assert_eq!(
            (0..3)
                .map(|id| test.maybe_ready(&7, id))
                .collect::<Vec<_>>(),
            [false, true, false]
        );
    }

    /// The generator refills from the vectors the completer sent back (their capacity kept),
    /// and starts a new one, room for 64 requests, only when none is there.
    #[test]
    fn the_generator_reuses_the_batch_vectors_sent_back() {
        let (back_tx, back_rx) = crossbeam_channel::unbounded();
        back_tx.send(Vec::with_capacity(1_000)).unwrap();
        assert_eq!(refill(&back_rx).capacity(), 1_000);
        assert_eq!(refill(&back_rx).capacity(), 64);
    }

    /// The plot's rate panel shows every window the generator spent whole issuing, and none
    /// after: 1,000 requests at 1,000/s are ten windows, at 800/s twelve (1.25 s: the
    /// thirteenth is partial); drained windows (zeros) are left out.
    #[test]
    fn the_rate_panel_shows_the_whole_generating_windows() {
        let r = |achieved_rate: f64| Report {
            num: 1_000,
            achieved_rate,
            rate_series: vec![1_000.0; 20],
            ..Report::default()
        };
        assert_eq!(generating_windows(&r(1_000.0)).len(), 10);
        assert_eq!(generating_windows(&r(800.0)).len(), 12);
        // A series shorter than the span (a run cut short) is shown whole.
        let short = Report {
            rate_series: vec![1_000.0; 4],
            ..r(1_000.0)
        };
        assert_eq!(generating_windows(&short).len(), 4);
    }

    /// The exit status's counts: a request counted neither way, or fewer expiries than the
    /// requests whose latency reached the timeout, fail the run; more expiries (a late
    /// completer) do not. A run without `--baseline` runs no harness-alone run after it.
    #[test]
    fn the_exit_status_checks_the_counts_load_cannot_fake() {
        let ok = run_with_baseline(&small(Model::Kafka), |_| unreachable!()).unwrap();
        assert!(correct(&ok), "a small run passes");
        assert!(ok.baseline.is_none(), "a baseline run without --baseline");
        let mut lost = ok.clone();
        lost.completed_early -= 1;
        assert!(!correct(&lost), "a request counted neither way");
        let mut missing = ok.clone();
        missing.expired = missing.expected_expired - 1;
        missing.completed_early = missing.num - missing.expired;
        assert!(!correct(&missing), "fewer expired than must");
        let mut late = ok.clone();
        late.expired += 10;
        late.completed_early -= 10;
        assert!(correct(&late), "more expired: not sustained, not a failure");
    }

    /// A report whose checks all pass: 100 requests, the 10 whose latency reached the timeout
    /// expired, 2 more within a tick of it, achieved at 1,000 req/s.
    fn passing() -> Report {
        Report {
            num: 100,
            achieved_rate: 1_000.0,
            completed_early: 90,
            expired: 10,
            expected_expired: 10,
            boundary: 2,
            exactly_once: true,
            ..Report::default()
        }
    }

    /// The exit status fails a run that breaks any one check (exactly once, an outcome, a
    /// request counted neither way, fewer expiries than must), and a run whose `--baseline` run
    /// breaks one, however correct the run itself.
    #[test]
    fn the_exit_status_fails_a_run_or_its_baseline_breaking_one_check() {
        assert!(run_passed(&passing()));
        let breaks: [fn(&mut Report); 4] = [
            |r| (r.exactly_once, r.not_exactly_once) = (false, 1),
            |r| r.wrong_outcome = 1,
            |r| r.completed_early -= 1,
            |r| (r.expired, r.completed_early) = (9, 91),
        ];
        for (i, spoil) in breaks.iter().enumerate() {
            let mut broken = passing();
            spoil(&mut broken);
            assert!(!correct(&broken), "case {i} correct");
            assert!(!run_passed(&broken), "case {i}");
            let with_baseline = Report {
                baseline: Some(Box::new(broken)),
                ..passing()
            };
            assert!(!run_passed(&with_baseline), "case {i}");
        }
        let with_baseline = Report {
            baseline: Some(Box::new(passing())),
            ..passing()
        };
        assert!(run_passed(&with_baseline));
    }

    /// The expired count is right from the requests whose latency reached the timeout up to
    /// those plus the ones within the tolerance under it, and wrong on either side.
    #[test]
    fn the_expired_count_is_right_up_to_a_tick_s_worth_over() {
        for (expired, ok) in [(9, false), (10, true), (12, true), (13, false)] {
            let r = Report {
                expired,
                completed_early: 100 - expired,
                ..passing()
            };
            assert_eq!(expired_ok(&r), ok, "{expired} expired of 10 (+2)");
        }
    }

    /// A run is sustained when it achieved at least 98% of its schedule's rate and every check
    /// passes; any one failing is not.
    #[test]
    fn sustained_needs_98_percent_of_the_schedule_and_every_check() {
        assert!(sustained(&passing(), 1_000.0 / 0.98));
        assert!(!sustained(&passing(), 1_000.0 / 0.979));
        let breaks: [fn(&mut Report); 4] = [
            |r| r.exactly_once = false,
            |r| r.wrong_outcome = 1,
            |r| r.expired = 9,
            |r| r.expired = 13,
        ];
        for (i, spoil) in breaks.iter().enumerate() {
            let mut r = passing();
            spoil(&mut r);
            assert!(!sustained(&r, 1_000.0), "case {i} sustained");
        }
    }

    /// The achieved rate is over the schedule's span at least (never above the schedule's
    /// rate), else over the generator's.
    #[test]
    fn the_achieved_rate_is_over_the_schedule_s_span_at_least() {
        const S: u64 = 1_000_000_000;
        assert_eq!(issue_rates(1_000, S / 2, S), (1_000.0, 1_000.0));
        assert_eq!(issue_rates(1_000, 4 * S, 2 * S), (250.0, 500.0));
    }

    /// Percentiles by nearest rank: the smallest value with at least that share of the values
    /// at or below it.
    #[test]
    fn percentiles_are_by_nearest_rank() {
        let v: Vec<f64> = (1..=1_000).map(f64::from).collect();
        for (q, want) in [
            (0.0, 1.0),
            (0.5, 500.0),
            (0.99, 990.0),
            (0.999, 999.0),
            (1.0, 1_000.0),
        ] {
            assert_eq!(percentile(&v, q), want, "q {q}");
        }
        assert_eq!(percentile(&[7.0], 0.5), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    /// The latencies are log-normal with the quartiles asked for (the median and the 75th
    /// percentile of 100,000 draws within 2% of p50 and p75), each from two outputs of the
    /// stream in order (Box–Muller), in nanoseconds, truncated.
    #[test]
    fn latencies_are_log_normal_with_the_given_median_and_p75() {
        let mut rng = SplitMix64::new(42);
        let mut l = latencies_ns(&mut rng, 100_000, 20.0, 60.0);
        // The stream moved on by exactly two outputs per latency.
        let mut skipped = SplitMix64::new(42);
        for _ in 0..200_000 {
            skipped.next();
        }
        assert_eq!(rng.next(), skipped.next());
        // The first latency from the first two outputs, by the formula.
        let mut first = SplitMix64::new(42);
        let (u1, u2) = (first.next_f64(), first.next_f64());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let sigma = (60f64.ln() - 20f64.ln()) / 0.674_490;
        assert_eq!(l[0], ((20f64.ln() + sigma * z).exp() * 1e6) as u64);
        l.sort_unstable();
        let (p50, p75) = (l[50_000] as f64 / 1e6, l[75_000] as f64 / 1e6);
        assert!((p50 / 20.0 - 1.0).abs() < 0.02, "median {p50} ms");
        assert!((p75 / 60.0 - 1.0).abs() < 0.02, "p75 {p75} ms");
    }

    /// Must expire: a latency at or past the timeout; either outcome right: under it by at most
    /// the tolerance.
    #[test]
    fn whole_nanosecond_gaps_keep_the_exact_schedule() {
        // A gap of 0.6 ns: cut to whole ns each, every gap was 0 and the schedule infinitely
        // fast; rounded sums, 1_000 gaps make 600 ns.
        let gaps = whole_ns_gaps(std::iter::repeat_n(0.6, 1_000));
        assert_eq!(gaps.iter().sum::<u64>(), 600);
        assert!(gaps.iter().all(|&g| g <= 1));
        assert_eq!(whole_ns_gaps([1.4, 1.4, 1.4].into_iter()), [1, 2, 1]);
        // At the W4 default's mean gap (10 µs), exactly the sums rounded.
        let exact = [10_000.7, 9_999.2, 10_000.4];
        assert_eq!(whole_ns_gaps(exact.into_iter()), [10_001, 9_999, 10_000]);
    }

    #[test]
    fn expected_expiries_count_the_latencies_past_the_timeout_and_within_a_tick() {
        let (timeout, tol) = (50_000_000, 1_000_000);
        let latencies = [
            timeout - tol - 1,
            timeout - tol,
            timeout - 1,
            timeout,
            timeout + 1,
        ];
        assert_eq!(expected_expiries(&latencies, timeout, tol), (2, 2));
    }

    /// The counts and delays come from each request's completion records: completed early,
    /// expired (each by its first record), not exactly once (twice, or never), and wrong
    /// outcomes (of those completed once only: premature, expired after the completer's call
    /// had returned, completed after it had returned, or with a record that shows a breach);
    /// a delay per completed request, from its latency capped at the timeout, however it
    /// completed (an expiry of a request under the timeout is late by the difference). An
    /// `on_expiration` alone is a breach, not a completion.
    #[test]
    fn the_tally_counts_each_request_by_its_completion_records() {
        let timeout = 4_000;
        let arrivals = [
            0, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000, 9_000,
        ];
        let latency = [500, 5_000, 100, 300, 200, 3_900, 1_000, 500, 500, 500];
        let d = |id, at_ns, expired| Done {
            at_ns,
            id,
            expired,
            breach: Breach::None,
        };
        let done = vec![
            d(0, 600, false),   // early, 100 ns after its latency
            d(1, 5_000, true),  // latency past the timeout: expired at the deadline
            d(2, 2_100, false), // twice
            d(2, 2_200, true),
            // 3: never completed
            d(4, 4_100, false), // premature by 100 ns
            d(5, 9_050, true),  // expired 50 ns after the deadline (a late completer)
            d(6, 10_000, true), // expired after the completer's call returned (at 7,100)
            d(7, 7_600, false), // completed after the completer's call returned (at 7,550)
            Done {
                breach: Breach::InAnothersCall, // completed in another request's call
                ..d(8, 8_600, false)
            },
            d(9, 9_600, false), // on time, but an on_expiration alone follows
            Done {
                breach: Breach::ExpirationAlone,
                ..d(9, 9_700, true)
            },
        ];
        let attempts = [(0, 650), (6, 7_100), (7, 7_550), (8, 8_700), (9, 9_650)];
        let t = tally(done, &attempts, &arrivals, &latency, timeout);
        assert_eq!(
            (
                t.completed_early,
                t.expired,
                t.not_exactly_once,
                t.wrong_outcome
            ),
            (5, 3, 2, 5),
            "{t:?}"
        );
        // 4 (premature), 1 and 2 (on time), 0, 7, 8, 9 (100 ns after their latencies), 5 (150
        // ns after its latency of 3,900), 6 (a latency of 1,000, expired 3,000 later: measured
        // from the timeout, it was 0).
        assert_eq!(
            t.delays,
            [-1e-4, 0.0, 0.0, 1e-4, 1e-4, 1e-4, 1e-4, 1.5e-4, 3e-3]
        );
    }

    /// `--find-max-rate` probes the rates its search picks, and its exit status is a failure
    /// when a probe broke a check, even one the search went past (a rate not sustained), or when
    /// no rate was sustained.
    #[test]
    fn the_rate_search_fails_when_a_probe_breaks_a_check() {
        let a = Args {
            num: FIND_MAX_RATE_MIN_NUM,
            rate: 1_000.0,
            find_max_rate: true,
            ..small(Model::Kafka)
        };
        // Sustained up to `top` req/s; the probe at `broken` breaks exactly-once.
        let search = |top: f64, broken: f64| {
            let mut rates = Vec::new();
            let status = find_max_rate_with(&a, |p| {
                rates.push(p.rate);
                Ok(Report {
                    sustained: p.rate <= top && p.rate != broken,
                    exactly_once: p.rate != broken,
                    ..passing()
                })
            });
            (status, rates)
        };
        let (status, rates) = search(3_000.0, 0.0);
        assert_eq!(status, ExitCode::SUCCESS);
        assert_eq!(rates[..3], [1_000.0, 2_000.0, 4_000.0]);
        assert_eq!(search(3_000.0, 2_000.0).0, ExitCode::FAILURE);
        assert_eq!(search(0.0, 0.0).0, ExitCode::FAILURE);
        // A probe that cannot run (its process) fails the search, and no probe runs after it.
        let mut rates = Vec::new();
        let status = find_max_rate_with(&a, |p| {
            rates.push(p.rate);
            if p.rate > 1_000.0 {
                return Err("no process".into());
            }
            Ok(Report {
                sustained: true,
                ..passing()
            })
        });
        assert_eq!(status, ExitCode::FAILURE);
        assert_eq!(rates, [1_000.0, 2_000.0]);
    }

    /// A report comes back from a child process (`--child-run`) exactly: every field the
    /// table, the JSON, the checks and the search read (not the plot's series).
    #[test]
    fn a_report_survives_the_wire_exactly() {
        let r = Report {
            model: "watch".into(),
            num: 12_345,
            target_rate: 100_000.0,
            achieved_rate: 99_876.123_456_789,
            elapsed_s: 10.1,
            cpu_s_per_million: 1.0 / 3.0,
            sleeps_per_s: 2_000.5,
            wake_cost_us: 12.25,
            mem_latency_ns: 160.125,
            wakeups_s_per_million: 0.1,
            threads: vec![
                ThreadRow {
                    name: "generator",
                    cpu_s_per_million: 0.7,
                    sleeps_per_s: 1_000.0,
                },
                ThreadRow {
                    name: "timer",
                    cpu_s_per_million: 1e-9,
                    sleeps_per_s: 0.0,
                },
            ],
            peak_rss: 75_000_000,
            bytes_per_pending: Some(726.5),
            peak_pending: 6_000,
            completed_early: 11_000,
            expired: 1_345,
            expected_expired: 1_300,
            boundary: 7,
            exactly_once: true,
            not_exactly_once: 0,
            wrong_outcome: 2,
            completer_lag_p99_ms: 1.5,
            delay_ms: [0.5, 1.25, f64::MIN_POSITIVE, 200.0],
            purges: 212,
            reaper_wakeups_per_s: 3.5,
            caller_advances_per_s: 999.0,
            sustained: false,
            ..Report::default()
        };
        let back = from_wire(&to_wire(&r)).expect("read back");
        assert_eq!(format!("{back:?}"), format!("{r:?}"));
        let none = Report {
            bytes_per_pending: None,
            ..r.clone()
        };
        let back = from_wire(&to_wire(&none)).expect("read back");
        assert_eq!(back.bytes_per_pending, None);
        // A missing, unknown or unreadable line is no report.
        let wire = to_wire(&r);
        let without_purges: String = wire
            .lines()
            .filter(|l| !l.starts_with("purges "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(from_wire(&without_purges).is_none());
        assert!(from_wire(&format!("{wire}bogus 1\n")).is_none());
        assert!(from_wire(&wire.replace("num 12345", "num many")).is_none());
        assert!(from_wire("").is_none());
    }

    /// The command line of a child run gives back every flag of the run (a field added to
    /// `Args` without a flag here fails to compile: the struct is spelled out in full), with
    /// `--child-run` and the progress display off, and nothing that starts another run.
    #[test]
    fn a_child_run_gets_every_flag_of_its_run() {
        use clap::{Args as _, FromArgMatches as _};
        let a = Args {
            num: 54_321,
            rate: 123_456.789,
            pct50: 21.5,
            pct75: 61.25,
            timeout: 250,
            keys: 4,
            key_space: 77,
            model: Model::Watch,
            tick_ms: 0.5,
            wheel_size: 32,
            reaper_grace_ms: 0.25,
            purge_interval: 500,
            executors: 2,
            seed: 7,
            completer_tick_us: 250,
            ready_hint: false,
            completer_wake: CompleterWake::Timer,
            progress: 3.0,
            json: true,
            plot: Some("x.svg".into()),
            find_max_rate: true,
            harness_only: true,
            baseline: true,
            child_run: false,
        };
        let argv = child_argv(&a);
        let cmd = Args::augment_args(clap::Command::new("kafka-timer").no_binary_name(true));
        let got = Args::from_arg_matches(&cmd.get_matches_from(&argv[1..])).expect("parses");
        assert_eq!(argv[0], "w4");
        let want = Args {
            progress: 0.0,
            json: false,
            plot: None,
            find_max_rate: false,
            baseline: false,
            child_run: true,
            ..a
        };
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    /// `--tick-ms` and `--reaper-grace-ms` are milliseconds, fractions included.
    #[test]
    fn tick_and_grace_flags_are_milliseconds() {
        assert_eq!(millis(2.0), Duration::from_millis(2));
        assert_eq!(millis(0.5), Duration::from_micros(500));
        assert_eq!(millis(0.0), Duration::ZERO);
    }

    /// The purgatory's share is the run's CPU minus the harness alone's (`--baseline`).
    #[test]
    fn the_purgatory_share_is_the_run_minus_the_harness_alone() {
        let run = |cpu: f64, baseline| Report {
            cpu_s_per_million: cpu,
            baseline,
            ..Report::default()
        };
        assert_eq!(run(5.0, None).purgatory_share(), None);
        let r = run(5.0, Some(Box::new(run(2.0, None))));
        assert_eq!(r.purgatory_share(), Some(3.0));
    }

    /// A request gives its own id to the purgatory's ready test when the run uses ready hints,
    /// and nothing otherwise: with another request's id, checks skipped (or locked) requests by
    /// that one's flag, and with none the hints were silently off.
    #[test]
    fn a_request_gives_its_id_to_the_ready_test_with_ready_hints_only() {
        for ready_hint in [true, false] {
            let s: &'static Shared = Box::leak(Box::new(Shared {
                start: Instant::now(),
                run: 0,
                ready: &[],
                completer_due_ns: AtomicU64::new(u64::MAX),
                generating: AtomicBool::new(false),
                ready_hint,
                harness_done: AtomicU64::new(0),
                harness_expired: AtomicU64::new(0),
            }));
            let op = FakeOp { id: 7, s };
            assert_eq!(op.ready_arg(), ready_hint.then_some(7));
        }
    }

    /// A `--plot` file that cannot be written is refused before the run, with status 2: it was
    /// found out only after the whole run (10 s here; minutes at the defaults), once the table
    /// had been printed.
    #[test]
    fn an_unwritable_plot_path_is_refused_before_the_run() {
        let a = Args {
            num: 2_000,
            rate: 200.0,
            plot: Some(PathBuf::from("/nonexistent-w4-dir/plot.svg")),
            ..small(Model::Kafka)
        };
        let t = Instant::now();
        assert_eq!(run(&a), ExitCode::from(2));
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "refused after {:?}",
            t.elapsed()
        );
    }

    /// A request due before the time the completer sleeps towards (a short latency, issued
    /// while the earliest request waiting is due tens of ms later, as at low rates) is completed
    /// on time: the batch that carries it wakes the completer, in both wake modes, instead of
    /// waiting until the later due time (which made the completer's lag, the completion delay
    /// and the outcome of requests near the timeout the harness's, not the purgatory's).
    #[test]
    fn an_earlier_due_request_wakes_the_sleeping_completer() {
        for wake in [CompleterWake::Generator, CompleterWake::Timer] {
            // 200 requests/s: gaps of 5 ms, latencies from well under a ms to the timeout.
            let a = Args {
                num: 200,
                rate: 200.0,
                completer_wake: wake,
                harness_only: true,
                ..small(Model::Kafka)
            };
            // A completer tick (1 ms) plus scheduling noise, with room for a loaded machine;
            // without the wake-up it is 40–80 ms at this rate, in every run (41–42 ms in three
            // runs with it removed, 2026-11-28). A bound on the real clock: a run
            // the machine stalled (the tests run in parallel on 2 cores) is run again, up to
            // three times; the fault above fails all three.
            const BOUND_MS: f64 = 30.0;
            let mut lags = Vec::new();
            while lags.len() < 3 && lags.last().is_none_or(|&l| l >= BOUND_MS) {
                let r = run_once(&a);
                assert!(r.exactly_once && r.wrong_outcome == 0, "{wake:?}");
                lags.push(r.completer_lag_p99_ms);
            }
            assert!(
                lags.last().is_some_and(|&l| l < BOUND_MS),
                "{wake:?}: completer lag p99 {lags:.3?} ms"
            );
        }
    }

    /// The expired count's tolerance covers the completer's tick too: with a timer tick finer
    /// than it (`--tick-ms 0.1`), requests due a fraction of a millisecond before their timeout
    /// expired whenever the completer (which wakes once a millisecond) was that late, and the
    /// run was "not sustained" at any rate (at 100,000/s: 15,686 expired for 15,650 ±18).
    #[test]
    fn the_expired_tolerance_covers_the_completer_tick() {
        // Every latency 0.3 ms short of the timeout: outside a 0.1 ms timer tick of it, inside
        // the completer's 1 ms.
        let a = Args {
            num: 2_000,
            pct50: 49.7,
            pct75: 49.7,
            tick_ms: 0.1,
            ..small(Model::Kafka)
        };
        let r = run_once(&a);
        assert!(r.exactly_once && r.wrong_outcome == 0 && correct(&r));
        assert_eq!((r.expected_expired, r.boundary), (0, a.num));
        assert!(expired_ok(&r), "{} expired, +{}", r.expired, r.boundary);
    }

    /// Runs give their ready flags back and later runs reuse them, cleared: a process running
    /// many runs no longer keeps every run's flags (`--find-max-rate` used to add a byte per
    /// request of every earlier probe to the later probes' RSS).
    #[test]
    fn ready_flags_are_given_back_and_reused_cleared() {
        let pool = FlagPool::new();
        let a = pool.take(100);
        assert_eq!(a.len(), 100);
        a[7].store(true, Relaxed);
        a[99].store(true, Relaxed);
        pool.give(a);
        // Long enough: the same flags, every one false again.
        let b = pool.take(60);
        assert!(
            std::ptr::eq(a, b),
            "a given-back slice long enough is reused"
        );
        assert!(
            b.iter().all(|f| !f.load(Relaxed)),
            "reused flags are cleared"
        );
        // Too short for a larger run, and lent out anyway: a new slice.
        let c = pool.take(200);
        assert_eq!(c.len(), 200);
        assert!(!std::ptr::eq(b.as_ptr(), c.as_ptr()));
        pool.give(b);
        pool.give(c);
        // The smallest that is long enough.
        assert!(std::ptr::eq(pool.take(80), a));
        assert!(std::ptr::eq(pool.take(80), c));
    }

    /// A whole run gives its flags back: the next run of the same size takes no new ones.
    #[test]
    fn a_run_gives_its_ready_flags_back() {
        let pool = FlagPool::new();
        let args = small(Model::Watch);
        let held = |pool: &FlagPool| -> Vec<*const AtomicBool> {
            pool.list().iter().map(|s| s.as_ptr()).collect()
        };
        assert!(run_once_with(&args, &pool).exactly_once);
        let first = held(&pool);
        assert_eq!(first.len(), 1, "the run gave its flags back");
        assert!(run_once_with(&args, &pool).exactly_once);
        assert_eq!(held(&pool), first, "the second run reused them");
    }

    /// Bytes per pending request is a figure only when something was pending: with latencies
    /// near zero (nothing seen pending by the 10 ms sampler) it used to divide the RSS growth
    /// by 1 and print it; now it is absent (`-` in the table, `null` in JSON).
    #[test]
    fn bytes_per_pending_needs_something_pending() {
        // The RSS growth over the peak pending, or none.
        assert_eq!(bytes_per_pending(1_000, 4), Some(250.0));
        assert_eq!(bytes_per_pending(1_000, 0), None);
        let quick = Args {
            num: 2_000,
            pct50: 1e-300,
            pct75: 2e-300,
            ..small(Model::Kafka)
        };
        // Whether the sampler saw one pending or not, the figure and the count agree.
        let r = run_once(&quick);
        assert!(r.exactly_once);
        match r.bytes_per_pending {
            Some(b) => assert!(r.peak_pending > 0 && b >= 0.0, "{b} at {}", r.peak_pending),
            None => assert_eq!(r.peak_pending, 0),
        }
        let json = to_json(&quick, &r);
        assert_eq!(
            json.contains("\"bytes_per_pending\":null"),
            r.peak_pending == 0,
            "{json}"
        );
        // Requests pending for tens of ms: always a figure.
        let r = run_once(&small(Model::Kafka));
        assert!(r.peak_pending > 0 && r.bytes_per_pending.is_some());
    }
}
