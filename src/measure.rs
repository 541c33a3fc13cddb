//! Measurement helpers for the workloads: process and thread CPU time (nanoseconds, from
//! `/proc`), peak RSS, and the machine line every report carries.
#![allow(clippy::disallowed_methods)] // measuring wall time is this module's job

use std::fs;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether a write to standard output has failed in this process (see [`to_stdout`]).
static STDOUT_LOST: AtomicBool = AtomicBool::new(false);

/// Writes a workload's report to standard output. A write that fails (a reader that has gone
/// away: `| head -1`) is reported once on standard error; it and every later write are
/// dropped, and [`exit_status`] turns the loss into status 2. `println!` panicked instead:
/// status 101, a backtrace, and the checks' verdict lost. Returns whether standard output
/// still takes the report, so that a long run (W1's and W5's rows, the rate search) can stop at
/// its next step instead of measuring for no reader.
pub fn to_stdout(text: std::fmt::Arguments<'_>) -> bool {
    if STDOUT_LOST.load(Ordering::Relaxed) {
        return false;
    }
    let mut out = std::io::stdout().lock();
    match out.write_fmt(text).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) => {
            if !STDOUT_LOST.swap(true, Ordering::Relaxed) {
                to_stderr(format_args!(
                    "error: cannot write the report to standard output: {e}\n"
                ));
            }
            false
        }
    }
}

/// Whether a write to standard output has failed (see [`to_stdout`]).
pub fn stdout_lost() -> bool {
    STDOUT_LOST.load(Ordering::Relaxed)
}

/// Writes to standard error, best effort: what goes there (the progress display, the search's
/// log, notes and errors) is for a person watching, and a reader of it that has gone away
/// (`2>&1 >report.txt | head -1`, a pager quit) must not end the run. `eprint!` panics when
/// the write fails: the run died with status 101, its report on standard output never written.
pub fn to_stderr(text: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(text);
}

/// `items` until standard output is lost ([`to_stdout`]): a workload's steps (its rows), so
/// that a run with no reader left stops at its next step instead of measuring on for minutes.
pub fn while_stdout_taken<I: IntoIterator>(items: I) -> impl Iterator<Item = I::Item> {
    items.into_iter().take_while(|_| !stdout_lost())
}

/// A workload's exit status: 1 when a check failed, whether or not the report could be
/// written (the failure is the news, and the lost report is named on standard error); else 2
/// when the report could not be written ([`to_stdout`]); else 0.
pub fn exit_status(checks_passed: bool) -> ExitCode {
    exit_status_written(checks_passed, true)
}

/// [`exit_status`] for a run that also writes its report elsewhere (W4's plot): `written`
/// false is a lost report too, with the same rule (a failed check wins).
pub fn exit_status_written(checks_passed: bool, written: bool) -> ExitCode {
    ExitCode::from(status(checks_passed, stdout_lost() || !written))
}

/// [`exit_status`]'s number.
fn status(checks_passed: bool, stdout_lost: bool) -> u8 {
    match (checks_passed, stdout_lost) {
        (false, _) => 1,
        (true, true) => 2,
        (true, false) => 0,
    }
}

/// `println!` for a workload's report, through [`to_stdout`]: a standard output that cannot be
/// written is an error for the exit status, not a panic. Evaluates to whether standard output
/// still takes the report.
#[macro_export]
macro_rules! out {
    () => {
        $crate::measure::to_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::measure::to_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!`, best effort (see [`to_stderr`]).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::measure::to_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// CPU time of the whole process so far, in nanoseconds: `CLOCK_PROCESS_CPUTIME_ID`, exact to
/// the nanosecond for every thread, running ones (brought up to date by the call) and exited
/// ones included. (`/proc/self/stat` counts in 10 ms ticks, and a running thread's `schedstat`
/// lags by up to a scheduler tick.)
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// CPU time of the threads alive now but the calling one, in nanoseconds: what the other
/// threads (a timer's background threads, say) used, with none of the measuring thread's own
/// work in it. The sum of their `/proc/self/task/*/schedstat`, each as of its thread's last
/// context switch or scheduler tick (a running thread's lags by up to a tick: use
/// [`process_cpu_ns`] to time work that does not sleep).
pub fn other_threads_cpu_ns() -> u64 {
    // "/proc/thread-self" links to "<pid>/task/<tid>".
    let me = fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_owned()));
    tasks()
        .filter(|t| me.is_none() || t.file_name() != me.as_deref())
        .map(|t| schedstat_ns(&t))
        .sum()
}

/// The `/proc/self/task/<tid>` directories of the threads alive now.
fn tasks() -> impl Iterator<Item = std::path::PathBuf> {
    fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .map(|t| t.path())
}

/// A thread's on-CPU nanoseconds, from its `schedstat` (0 if unreadable).
fn schedstat_ns(task: &std::path::Path) -> u64 {
    fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// What one thread has used so far: CPU time (schedstat run time, ns) and sleeps (voluntary
/// context switches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadUse {
    /// On-CPU nanoseconds.
    pub cpu_ns: u64,
    /// Times it went to sleep (each one a wake-up later).
    pub sleeps: u64,
}

/// The summed [`ThreadUse`] of this process's live threads whose names start with `prefix`.
pub fn threads_named(prefix: &str) -> ThreadUse {
    live_threads()
        .into_iter()
        .filter(|(_, name, _)| name.starts_with(prefix))
        .fold(ThreadUse::default(), |sum, (_, _, u)| ThreadUse {
            cpu_ns: sum.cpu_ns + u.cpu_ns,
            sleeps: sum.sleeps + u.sleeps,
        })
}

/// True if every live thread of this process whose name starts with `prefix` is asleep
/// (state `S` in its `/proc` stat: blocked, e.g. in a futex), and there is at least one.
pub fn threads_asleep(prefix: &str) -> bool {
    let states: Vec<Option<char>> = tasks()
        .filter(|t| {
            fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim_end().starts_with(prefix))
        })
        .map(|t| {
            let stat = fs::read_to_string(t.join("stat")).ok()?;
            // `tid (comm) S ...`: the state follows the last `)`.
            stat[stat.rfind(')')? + 1..].trim_start().chars().next()
        })
        .collect();
    !states.is_empty() && states.iter().all(|&s| s == Some('S'))
}

/// The calling thread's [`ThreadUse`] so far.
pub fn this_thread() -> ThreadUse {
    thread_use(std::path::Path::new("/proc/thread-self"))
}

/// Every live thread of the process: its id, its name (`comm`, at most 15 bytes) and its
/// [`ThreadUse`] so far.
pub fn live_threads() -> Vec<(u64, String, ThreadUse)> {
    tasks()
        .filter_map(|path| {
            let tid = path.file_name()?.to_str()?.parse().ok()?;
            let name = fs::read_to_string(path.join("comm")).unwrap_or_default();
            Some((tid, name.trim_end().to_string(), thread_use(&path)))
        })
        .collect()
}

fn thread_use(task: &std::path::Path) -> ThreadUse {
    ThreadUse {
        cpu_ns: schedstat_ns(task),
        sleeps: sleeps(task),
    }
}

/// A thread's voluntary context switches, from its `status` (0 if unreadable).
fn sleeps(task: &std::path::Path) -> u64 {
    status_field(&task.join("status"), "voluntary_ctxt_switches:")
}

/// The number after `field` in a `/proc` status file (0 if the file or the field is missing).
fn status_field(path: &std::path::Path, field: &str) -> u64 {
    fs::read_to_string(path).map_or(0, |text| field_value(&text, field))
}

/// The number after `field` in the text of a `/proc` status file (0 if missing).
fn field_value(text: &str, field: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// CPU time of the calling thread, in nanoseconds, as of its last context switch or scheduler
/// tick (the kernel brings a running thread's total up to date only then): read it after a
/// sleep for an exact figure.
pub fn thread_cpu_ns() -> u64 {
    schedstat_ns(std::path::Path::new("/proc/thread-self"))
}

/// Resets the process's peak resident set size (`VmHWM`) to its current size (Linux 4.0+:
/// `/proc/self/clear_refs`), so that a run that follows another in the same process measures
/// its own peak. Best effort: where it is not supported the peak stays the process's.
pub fn reset_peak_rss() {
    let _ = fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size of the process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> u64 {
    status_kb("VmHWM:") * 1024
}

/// Current resident set size of the process (`VmRSS`), in bytes.
pub fn rss_bytes() -> u64 {
    status_kb("VmRSS:") * 1024
}

/// The memory this process may use, RAM and swap, in bytes: the machine's (`MemTotal` +
/// `SwapTotal` of `/proc/meminfo`), or its control group's limit where that is lower (a
/// container's: a run past it is killed, not refused); `None` where neither can be read.
pub fn memory_bytes() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let groups = fs::read_to_string("/proc/self/cgroup").ok();
    memory_limit(&meminfo, groups.as_deref(), |p| fs::read_to_string(p).ok())
}

/// [`memory_bytes`] from the text of `/proc/meminfo` (empty if unreadable) and of
/// `/proc/self/cgroup` (`None` if unreadable); `read` reads a file under `/sys/fs/cgroup` (see
/// [`cgroup_limit`]).
fn memory_limit(
    meminfo: &str,
    proc_self_cgroup: Option<&str>,
    read: impl Fn(&str) -> Option<String>,
) -> Option<u64> {
    let swap = field_value(meminfo, "SwapTotal:").saturating_mul(1024);
    let machine = field_value(meminfo, "MemTotal:").saturating_mul(1024) + swap;
    let cgroup = proc_self_cgroup.and_then(|groups| cgroup_limit(groups, swap, read));
    [(machine > 0).then_some(machine), cgroup]
        .into_iter()
        .flatten()
        .min()
}

/// The RAM and swap that the control groups named by `proc_self_cgroup` (the text of
/// `/proc/self/cgroup`) allow, in bytes: the lowest limit of the process's group and its
/// ancestors, in cgroup v2 (`memory.max`, plus `memory.swap.max` or else the machine's `swap`)
/// and v1 (`memory.memsw.limit_in_bytes`, or else `memory.limit_in_bytes` plus `swap`); `None`
/// when none is set. `read` reads a file under `/sys/fs/cgroup`.
fn cgroup_limit(
    proc_self_cgroup: &str,
    swap: u64,
    read: impl Fn(&str) -> Option<String>,
) -> Option<u64> {
    // v1 writes "no limit" as a page-rounded i64::MAX; v2 as "max" (not a number).
    let number = |path: String| {
        read(&path)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&v| v < 1 << 62)
    };
    let mut lowest: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let v1 = controllers.split(',').any(|c| c == "memory");
        let base = match (controllers, v1) {
            ("", _) => "/sys/fs/cgroup",
            (_, true) => "/sys/fs/cgroup/memory",
            _ => continue,
        };
        // The group and each ancestor, up to the hierarchy's root.
        let mut dir = path.trim_end_matches('/');
        loop {
            let limit = if v1 {
                number(format!("{base}{dir}/memory.memsw.limit_in_bytes")).or_else(|| {
                    number(format!("{base}{dir}/memory.limit_in_bytes"))
                        .map(|ram| ram.saturating_add(swap))
                })
            } else {
                number(format!("{base}{dir}/memory.max")).map(|ram| {
                    let swap_max = number(format!("{base}{dir}/memory.swap.max"));
                    ram.saturating_add(swap_max.map_or(swap, |m| m.min(swap)))
                })
            };
            if let Some(limit) = limit {
                lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
            }
            match dir.rfind('/') {
                Some(i) => dir = &dir[..i],
                None => break,
            }
        }
    }
    lowest
}

fn status_kb(field: &str) -> u64 {
    status_field(std::path::Path::new("/proc/self/status"), field)
}

/// The process's global allocator as [`set_allocator`] recorded it.
static ALLOCATOR: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Records the name of the process's global allocator for [`machine_line`] (the load
/// generator's `main` does, when it runs on jemalloc); the first call wins.
pub fn set_allocator(name: &'static str) {
    let _ = ALLOCATOR.set(name);
}

/// `nproc`, the CPU model, the kernel, a warning if this build has debug assertions on, and the
/// global allocator ("system" unless [`set_allocator`] said otherwise): the machine line reports
/// carry.
///
/// The warning matters: debug assertions change what the baselines cost, not only ours
/// (tokio-util's `DelayQueue` walks a whole slot's list on every removal under them: W1's
/// cancel measured 156 µs instead of tens of ns at N = 100,000), and nothing else in a report
/// says which build made it.
pub fn machine_line() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1).map(|m| m.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let allocator = ALLOCATOR.get().copied().unwrap_or("system");
    let build = if cfg!(debug_assertions) {
        ", DEBUG ASSERTIONS ON (not a release build: figures not comparable)"
    } else {
        ""
    };
    format!("nproc {cpus}, {model}, Linux {kernel}{build}, allocator {allocator}")
}

/// An empty vector with room for `n` elements whose memory has been written (every page
/// faulted in), so that a run that fills it later pays no first-touch page faults (counted in
/// its CPU) and the memory is already in its baseline RSS. (`vec![0; n]` alone maps zero pages
/// lazily.)
pub fn prefaulted<T: Clone + Default>(n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    v.iter_mut()
        .for_each(|x| *x = std::hint::black_box(T::default()));
    v.clear();
    v
}

/// Wall time and process CPU time of a closure.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Duration, u64) {
    let cpu0 = process_cpu_ns();
    let t0 = Instant::now();
    let r = f();
    let wall = t0.elapsed();
    (r, wall, process_cpu_ns().saturating_sub(cpu0))
}

/// The CPU time one sleep-and-wake of a thread costs on this machine (what every timer, reaper
/// and completer thread pays per wake-up): a thread sleeps `period` `count` times; returns the
/// on-CPU nanoseconds per sleep (its schedstat run time, which counts the kernel's work to put it
/// to sleep and wake it, and on a virtual machine the exits around an idle CPU) and the wall
/// time per sleep.
pub fn wake_cost(period: Duration, count: u32) -> (f64, Duration) {
    std::thread::spawn(move || {
        let (cpu0, t0) = (thread_cpu_ns(), Instant::now());
        for _ in 0..count {
            std::thread::sleep(period);
        }
        let cpu = thread_cpu_ns().saturating_sub(cpu0);
        (
            cpu as f64 / f64::from(count.max(1)),
            t0.elapsed() / count.max(1),
        )
    })
    .join()
    .expect("wake-cost thread")
}

/// One cache line of [`load_latency`]'s ring: the index of the next line to visit.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line {
    next: usize,
}

/// A ring through `lines` cache lines in a random order, one cycle that visits every line once
/// (Sattolo's shuffle of the identity, splitmix64 seeded with 42).
fn ring(lines: usize) -> Vec<Line> {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut rng = crate::rng::SplitMix64::new(42);
    for i in (1..lines).rev() {
        // j < i (not <= i): the permutation is then one cycle.
        let j = (rng.next() % i as u64) as usize;
        order.swap(i, j);
    }
    let mut ring = vec![Line { next: 0 }; lines];
    for w in 0..lines {
        ring[order[w]].next = order[(w + 1) % lines];
    }
    ring
}

/// The cache lines in a ring of `bytes`: at least 2, so that each load goes to another line.
fn lines_in(bytes: usize) -> usize {
    (bytes / std::mem::size_of::<Line>()).max(2)
}

/// The time of one load from memory on this machine, as the workloads' misses see it: `loads`
/// dependent loads (each one's address comes from the one before, so none overlaps another)
/// around a random ring of `bytes` of cache lines (at least 2 lines); nanoseconds per load.
/// A ring within a cache level gives that level's latency; one well past the last level,
/// memory's. On a shared virtual machine the figures move with the neighbours' load, as the
/// workloads' do: W4's share per request follows them (HISTORY.md, 2026-11-29).
pub fn load_latency(bytes: usize, loads: u64) -> f64 {
    let ring = ring(lines_in(bytes));
    // One lap first: the ring's pages are faulted in by its construction, its lines warmed to
    // where they settle.
    let mut at = 0;
    for _ in 0..ring.len() {
        at = ring[at].next;
    }
    let t0 = Instant::now();
    for _ in 0..loads {
        at = std::hint::black_box(ring[at].next);
    }
    let elapsed = t0.elapsed();
    std::hint::black_box(at);
    elapsed.as_nanos() as f64 / loads.max(1) as f64
}

/// The ring sizes `mem-latency` measures: the first-level cache, the second, the last level's
/// share of a small machine, and memory.
pub const LATENCY_SIZES: [usize; 6] = [32 << 10, 256 << 10, 2 << 20, 8 << 20, 32 << 20, 256 << 20];

/// The parser of a count flag that must be at least `min`: a task count or run count of zero
/// would measure nothing and still print figures; W1's, W1x2's and W5's task counts need 2
/// (the cancel phase cancels the tasks with `i % 10 != 0`, and one task, `i = 0`, would leave it
/// nothing to cancel, yet print a cancel ns/op over none).
pub fn at_least(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..)
}

/// The most tasks a churn workload (W1, W1x2, W2, each W5 point) takes: 10^8, ten times W5's
/// largest point. Past it the task vectors' capacity overflowed (a panic, not an error).
pub const MAX_TASKS: u64 = 100_000_000;

/// The parser of a task count: from `min` (see [`at_least`]) to [`MAX_TASKS`].
pub fn task_count(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..=MAX_TASKS)
}

/// The longest wait a flag in milliseconds takes: an hour. Longer ones only hung the run, or
/// overflowed the clock's arithmetic (a panic).
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// The parser of a wait in milliseconds: 0 to [`MAX_WAIT_MS`].
pub fn wait_ms() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::new().range(0..=MAX_WAIT_MS)
}

/// Exactly `N` whitespace-separated numbers, as a child process prints its figures; `None` for
/// anything else (a stray word, a missing or an extra figure: a failed child).
pub fn numbers<const N: usize>(text: &str) -> Option<[f64; N]> {
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

/// This program's path, to run it again in a child process: for a measurement that must start
/// from a fresh process (the allocator keeps what an earlier run in the same process freed, so
/// a later run there skips the page faults, and finds the memory, an earlier one paid for).
pub fn this_program() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("this program's path: {e}"))
}

/// Runs `cmd` to its end and hands back its standard output as `parse` reads it. `what` names
/// the run in the error, which carries the child's status, its standard error and its output,
/// when the child cannot be started, exits non-zero, or prints what `parse` rejects. A child
/// that succeeds has its standard error (warnings) passed on to this process's.
pub fn run_child<T>(
    cmd: &mut std::process::Command,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: could not run the child process: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.success().then(|| parse(&stdout)).flatten() {
        Some(v) => {
            if !stderr.is_empty() {
                to_stderr(format_args!("{stderr}"));
            }
            Ok(v)
        }
        None => Err(format!(
            "{stderr}{what} failed in its child process ({}; output {:?})",
            out.status,
            stdout.trim()
        )),
    }
}

/// The median of a list of samples (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control group's memory limit is found in v1 and v2, on the process's group or an
    /// ancestor, the lowest winning; "no limit" (v2's `max`, v1's huge number) is none; swap
    /// counts where the group allows it.
    #[test]
    fn cgroup_limits_are_read_in_v1_and_v2() {
        let files = |list: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                list.iter()
                    .find(|(path, _)| *path == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        const GB: u64 = 1 << 30;
        // v2: the group says max, its parent 4 GB of RAM and 1 GB of swap (of the machine's 2).
        let v2 = files(&[
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "4294967296\n"),
            ("/sys/fs/cgroup/a/memory.swap.max", "1073741824\n"),
            ("/sys/fs/cgroup/memory.max", "8589934592\n"),
        ]);
        assert_eq!(cgroup_limit("0::/a/b\n", 2 * GB, v2), Some(5 * GB));
        // No swap limit given: the machine's swap.
        let v2_ram_only = files(&[("/sys/fs/cgroup/a/memory.max", "1073741824")]);
        assert_eq!(cgroup_limit("0::/a\n", 2 * GB, v2_ram_only), Some(3 * GB));
        assert_eq!(cgroup_limit("0::/\n", 2 * GB, files(&[])), None);
        // v1: memory and swap together where given, else memory plus the machine's swap; the
        // unlimited value and other controllers' lines are ignored.
        let v1 = files(&[
            (
                "/sys/fs/cgroup/memory/c/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "3221225472"),
            ("/sys/fs/cgroup/cpu/c/memory.limit_in_bytes", "1"),
        ]);
        let groups = "5:cpu,cpuacct:/c\n4:memory:/c\n1:name=systemd:/\n";
        assert_eq!(cgroup_limit(groups, GB, v1), Some(4 * GB));
        let memsw = files(&[
            (
                "/sys/fs/cgroup/memory/c/memory.memsw.limit_in_bytes",
                "2147483648",
            ),
            (
                "/sys/fs/cgroup/memory/c/memory.limit_in_bytes",
                "1073741824",
            ),
        ]);
        assert_eq!(cgroup_limit(groups, 8 * GB, memsw), Some(2 * GB));
        assert_eq!(
            cgroup_limit(
                "4:memory:/c\n",
                GB,
                files(&[(
                    "/sys/fs/cgroup/memory/c/memory.limit_in_bytes",
                    "9223372036854771712"
                )])
            ),
            None
        );
    }

    /// A failed check is status 1 whether or not the report could be written: a lost standard
    /// output (status 2) used to hide it. A run whose checks pass is 2 without its report, 0
    /// with it.
    #[test]
    fn a_failed_check_wins_over_a_lost_report() {
        assert_eq!(status(false, true), 1);
        assert_eq!(status(false, false), 1);
        assert_eq!(status(true, true), 2);
        assert_eq!(status(true, false), 0);
    }

    /// Reports must say which allocator their figures were taken on (`--features jemalloc`
    /// changes W4's): no test here calls `set_allocator`, so a test process reports "system"
    /// (CI's smoke checks the jemalloc build's line).
    #[test]
    fn machine_line_names_the_allocator() {
        assert!(
            machine_line().ends_with(", allocator system"),
            "{}",
            machine_line()
        );
    }

    /// `threads_asleep` is true once every thread of the prefix is blocked, and false with none
    /// of them (or one running).
    #[test]
    fn threads_asleep_sees_blocked_threads_only() {
        assert!(!threads_asleep("asleeptest-"), "no such thread");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::Builder::new()
            .name("asleeptest-b".into())
            .spawn(move || rx.recv())
            .unwrap();
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !threads_asleep("asleeptest-") {
            assert!(std::time::Instant::now() < give_up, "never seen asleep");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinning = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::Builder::new()
                .name("asleeptest-s".into())
                .spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
                .unwrap()
        };
        // A spinning thread is running or runnable (`R`), never asleep. (It names itself once
        // it runs: until then it is not among the prefix's threads.)
        while !live_threads().iter().any(|(_, n, _)| n == "asleeptest-s") {
            assert!(std::time::Instant::now() < give_up, "never named");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for _ in 0..20 {
            assert!(
                !threads_asleep("asleeptest-"),
                "a spinning thread counted asleep"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinning.join().unwrap();
        drop(tx);
        blocked.join().unwrap().unwrap_err();
    }

    /// A build with debug assertions (as the tests are: the test profile keeps them) says so in
    /// its reports; a release build's line does not.
    #[test]
    fn machine_line_flags_debug_assertions() {
        let flagged = machine_line().contains("DEBUG ASSERTIONS ON");
        assert_eq!(flagged, cfg!(debug_assertions), "{}", machine_line());
    }

    /// `iterations` steps of arithmetic on this thread, then a 1 ms sleep: the thread's CPU
    /// reading is up to date after it (the kernel updates a running thread's at switches).
    fn work_then_sleep(iterations: u64) {
        let mut x = 0u64;
        for i in 0..iterations {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        std::thread::sleep(Duration::from_millis(1));
    }

    #[test]
    fn cpu_time_grows_with_work() {
        // The thread's own reading is exact as of its last switch off the CPU (the kernel
        // brings a running thread's total up to date at context switches and ticks, so each
        // reading follows a sleep); the process's includes it. (Comparing two process readings
        // is not exact: a test thread exiting in between moves its time from the per-thread sum
        // to /proc/self/stat's 10 ms ticks.)
        std::thread::sleep(Duration::from_millis(1));
        let (a, sleeps) = (thread_cpu_ns(), this_thread().sleeps);
        work_then_sleep(20_000_000);
        let b = thread_cpu_ns();
        assert!(b > a, "{b} > {a}");
        assert!(process_cpu_ns() >= b);
        std::thread::sleep(Duration::from_millis(2));
        assert!(this_thread().sleeps > sleeps, "a sleep is counted");
        assert!(this_thread().cpu_ns >= b);
        let me = live_threads();
        assert!(
            me.iter().any(|(_, _, u)| u.cpu_ns >= b),
            "this thread is listed"
        );
        assert!(peak_rss_bytes() >= rss_bytes() / 2 && rss_bytes() > 0);
    }

    /// The other threads' CPU is the sum over the live threads but the calling one: at least
    /// what a live worker has used (here busy, then blocked, so that its reading is up to
    /// date), and more than the calling thread's alone.
    #[test]
    fn other_threads_cpu_counts_the_live_others() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            work_then_sleep(20_000_000);
            tx.send(thread_cpu_ns()).expect("sent");
            let _ = stop_rx.recv();
        });
        let worker_ns = rx.recv().expect("the worker's CPU");
        let others = other_threads_cpu_ns();
        assert!(
            worker_ns > 0 && others >= worker_ns,
            "{others} >= {worker_ns}"
        );
        drop(stop_tx);
        worker.join().expect("worker");
    }

    /// A prefix's use is the sum over its live threads: at least each one's own reading (taken
    /// after a sleep, so up to date, and before the thread blocks), and nothing of a thread
    /// the prefix does not name.
    #[test]
    fn threads_named_sums_the_prefixs_threads() {
        let (tx, rx) = std::sync::mpsc::channel();
        // The workers stay alive (blocked) until the sum is taken.
        let done = std::sync::Arc::new(std::sync::Barrier::new(3));
        let workers: Vec<_> = (0..2)
            .map(|i| {
                let (tx, done) = (tx.clone(), std::sync::Arc::clone(&done));
                std::thread::Builder::new()
                    .name(format!("namedsum-{i}"))
                    .spawn(move || {
                        work_then_sleep(5_000_000);
                        tx.send(this_thread()).expect("sent");
                        done.wait();
                    })
                    .expect("spawned")
            })
            .collect();
        let own: Vec<ThreadUse> = (0..2).map(|_| rx.recv().expect("a reading")).collect();
        let sum = threads_named("namedsum-");
        let least = ThreadUse {
            cpu_ns: own.iter().map(|u| u.cpu_ns).sum(),
            sleeps: own.iter().map(|u| u.sleeps).sum(),
        };
        assert!(own.iter().all(|u| u.cpu_ns > 0 && u.sleeps > 0), "{own:?}");
        assert!(
            sum.cpu_ns >= least.cpu_ns && sum.sleeps >= least.sleeps,
            "{sum:?} >= {least:?}"
        );
        assert_eq!(threads_named("namedsum-none"), ThreadUse::default());
        done.wait();
        for w in workers {
            w.join().expect("worker");
        }
    }

    /// The memory a process may use is the machine's RAM and swap, or its control group's
    /// limit where that is lower (RAM, plus the machine's swap where the group sets no swap
    /// limit); a `/proc/meminfo` that cannot be read leaves the group's, or nothing: never 0
    /// bytes, which would refuse every run.
    #[test]
    fn the_memory_is_the_machines_ram_and_swap_or_the_groups_lower_limit() {
        let meminfo = "MemTotal:        1000 kB\nMemFree:  10 kB\nSwapTotal:  500 kB\n";
        let group = |limit: &'static str| {
            move |p: &str| (p == "/sys/fs/cgroup/a/memory.max").then(|| limit.to_string())
        };
        let lower = group("1000000");
        assert_eq!(memory_limit(meminfo, None, lower), Some(1500 * 1024));
        assert_eq!(
            memory_limit(meminfo, Some("0::/a\n"), lower),
            Some(1_000_000 + 500 * 1024)
        );
        assert_eq!(
            memory_limit(meminfo, Some("0::/a\n"), group("max")),
            Some(1500 * 1024)
        );
        assert_eq!(memory_limit("", Some("0::/a\n"), lower), Some(1_000_000));
        assert_eq!(memory_limit("", None, lower), None);
        assert_eq!(memory_limit("", Some("0::/\n"), lower), None);
    }

    /// Memory figures are bytes: the process's resident set is over a megabyte, and the
    /// machine's memory over that.
    #[test]
    fn memory_figures_are_bytes() {
        let rss = rss_bytes();
        assert!(rss >= 1 << 20, "{rss}");
        let machine = memory_bytes().expect("readable /proc/meminfo");
        assert!(machine >= rss, "{machine} >= {rss}");
    }

    /// The process's CPU time is its CPU clock (`CLOCK_PROCESS_CPUTIME_ID`) in nanoseconds:
    /// between readings of that clock taken around it.
    #[test]
    fn process_cpu_is_the_process_cpu_clock_in_nanoseconds() {
        let clock = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
            t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
        };
        let before = clock();
        let ns = u128::from(process_cpu_ns());
        let after = clock();
        assert!(before <= ns && ns <= after, "{before} <= {ns} <= {after}");
    }

    /// A prefaulted vector is empty with room for its elements.
    #[test]
    fn a_prefaulted_vector_is_empty_with_room() {
        let v: Vec<u64> = prefaulted(10_000);
        assert!(v.is_empty() && v.capacity() >= 10_000);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    /// The latency figure is only a load's if the ring is one cycle through every line: a
    /// shorter cycle would stay in a smaller (faster) part of the buffer.
    #[test]
    fn the_ring_is_one_cycle_through_every_line() {
        for lines in [2, 3, 64, 1000, 4097] {
            let r = ring(lines);
            let mut seen = vec![false; lines];
            let mut at = 0;
            for _ in 0..lines {
                assert!(!seen[at], "{lines} lines: line {at} visited twice");
                seen[at] = true;
                at = r[at].next;
            }
            assert_eq!(at, 0, "{lines} lines: not back at the start");
            assert!(
                seen.iter().all(|&s| s),
                "{lines} lines: a line never visited"
            );
        }
        assert_eq!(std::mem::size_of::<Line>(), 64);
    }

    /// A ring of `bytes` spans them, a line per 64 bytes (a ring of a few lines stays in the
    /// first-level cache, whatever size was asked for), and at least two lines.
    #[test]
    fn a_ring_of_bytes_has_a_line_per_64_bytes() {
        assert_eq!(lines_in(32 << 20), 512 << 10);
        assert_eq!(lines_in(64 << 10), 1024);
        assert_eq!((lines_in(64), lines_in(0)), (2, 2));
    }

    /// `mem-latency`'s rings go up through the cache levels to memory: in whole KiB (as it
    /// prints them), ascending from a first-level cache's 32 KiB to past any last-level cache
    /// of a small machine.
    #[test]
    fn the_latency_rings_ascend_from_the_first_cache_level_to_memory() {
        assert_eq!(LATENCY_SIZES[0], 32 << 10);
        assert!(
            LATENCY_SIZES.windows(2).all(|w| w[0] < w[1]),
            "{LATENCY_SIZES:?}"
        );
        assert!(LATENCY_SIZES.iter().all(|b| b % 1024 == 0));
        assert!(LATENCY_SIZES[LATENCY_SIZES.len() - 1] >= 128 << 20);
    }

    #[test]
    fn a_load_latency_is_positive_and_finite() {
        let ns = load_latency(64 << 10, 100_000);
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
    }
}
