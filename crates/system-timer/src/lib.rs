//! A timer people use: schedule millions of cancellable tasks from any thread; each runs once its
//! deadline is reached, never before; cancel is O(1) and frees the task at once. Built on the
//! Kafka-style hierarchical wheel of the `timing-wheel` crate, driven by a reaper thread that
//! sleeps until the next bucket is due, with tasks run on executor threads.
//!
//! # Hello, world!
//!
//! ```
//! use std::sync::mpsc;
//! use std::time::Duration;
//! use system_timer::SystemTimer;
//!
//! let timer = SystemTimer::new(); // tick 1 ms, wheel size 20 (Kafka's defaults)
//! let (tx, rx) = mpsc::channel();
//! timer.add(Duration::from_millis(10), move || tx.send("hello, world").unwrap())?;
//! assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "hello, world");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Where it goes beyond Kafka's `SystemTimer`
//!
//! * **Never early.** Deadlines are kept in nanoseconds and rounded up to the tick; Kafka
//!   truncates to whole ms and can fire up to a tick early.
//! * **No overflow.** `Duration::MAX` saturates to "never"; Kafka's `Long.MAX_VALUE` fires at once.
//! * **Deterministic time.** Every read goes through a [`Clock`]; the whole timer, reaper
//!   included, runs on a [`ManualClock`] in tests.
//! * **Cancel means never runs.** `cancel()` returns true only if it removed the task; the task
//!   is freed at once (no zombie entry) and `len()` is exact.
//! * **Idle is free.** The reaper sleeps until the next bucket is due (no 200 ms poll), and is
//!   woken at once by an earlier add or by shutdown.
//! * **Nothing is lost.** Task panics are caught and counted; shutdown joins every thread and
//!   hands back every task that neither ran nor was cancelled; scheduling after shutdown (or past
//!   the optional cap) returns the task in the error.
//!
//! # The cheap path
//!
//! * **Keys instead of handles.** [`SystemTimer::add_keyed`] returns a [`TimerKey`] (`Copy`, 16
//!   bytes, no reference count, nothing to drop); [`SystemTimer::cancel`] takes it. The
//!   [`TimerHandle`] of [`SystemTimer::add`] is the convenient form (cancel it from anywhere,
//!   ask it what happened) at the price of a shared reference count per task.
//! * **A task type of your own.** A timer is generic over its [`TimerTask`]; the default
//!   [`Task`] boxes a closure, or runs an `Arc` it is given ([`Task::from_arc`], no box).
//! * **A reaper that sleeps while callers keep time.** With a
//!   [`reaper_grace`](Builder::reaper_grace), threads that run anyway (a request handler; the
//!   purgatory after each new operation) call [`SystemTimer::advance_if_due`]: the first one
//!   after a bucket is due advances the wheel and moves the reaper's alarm past the next bucket
//!   without waking it, so a busy timer costs no thread wake-up per tick (a wake-up costs a
//!   thread far more CPU than the advance, above all on a virtual machine). The reaper steps in,
//!   `grace` late, only when the callers stop.
//! * **A cheap clock read for deadlines.** Deadlines come from an upper bound of the monotonic
//!   clock computed from the CPU's cycle counter (about 13 ns instead of 26 ns for
//!   `Instant::now()` here); see [`SystemClock`]. Deciding what is due always uses the real
//!   clock, so a task can be up to about 13 µs late for it, never early.
//!
//! # Implementation
//!
//! Adds take one shard lock of the wheel (the sharded read side of Kafka's read–write lock), so
//! threads add in parallel; the reaper takes every shard lock (the write side) to advance the
//! wheel and collect due tasks, releases them, and only then dispatches. See the ground rules at
//! the top of `timer.rs` and `reaper.rs`.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms,
    clippy::return_self_not_must_use
)]
#![cfg_attr(loom, allow(dead_code))]

#[cfg(all(target_os = "linux", not(loom)))]
mod alarm;
mod clock;
mod error;
mod handle;
mod parker;
mod reaper;
mod stats;
mod sync;
mod task;
mod timer;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{BuildError, ScheduleError};
pub use handle::{TimerHandle, TimerKey};
pub use stats::{Lateness, TimerStats};
pub use task::{SharedTask, Task, TimerTask};
#[cfg(loom)]
#[doc(hidden)]
pub use timer::SleepingReaper;
pub use timer::{Builder, SystemTimer, MAX_EXECUTOR_THREADS, REAPER_PANIC_BACKOFF};

/// What `#[must_use]` guards, checked: each `compile_fail` case is the example before it with
/// the result left unused, under `deny(unused_must_use)`, so it fails only for that.
///
/// A [`Builder`] method's result (a builder does nothing until it is built):
/// ```
/// #![deny(unused_must_use)]
/// let builder = system_timer::SystemTimer::builder();
/// let _builder = builder.name("leases");
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// let builder = system_timer::SystemTimer::builder();
/// builder.name("leases");
/// ```
/// The tasks [`SystemTimer::shutdown`] hands back (they never ran):
/// ```
/// #![deny(unused_must_use)]
/// let timer = system_timer::SystemTimer::builder().reaper(false).build();
/// let _never_ran = timer.shutdown();
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// let timer = system_timer::SystemTimer::builder().reaper(false).build();
/// timer.shutdown();
/// ```
/// The task [`SystemTimer::take`] and [`TimerHandle::take`] hand back (a `cancel` that drops
/// it is what an unused take means):
/// ```
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// let timer = system_timer::SystemTimer::builder().reaper(false).build();
/// let key = timer.add_keyed(Duration::from_secs(9), || ())?;
/// let handle = timer.add(Duration::from_secs(9), || ())?;
/// let _task = timer.take(key);
/// let _task = handle.take();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// let timer = system_timer::SystemTimer::builder().reaper(false).build();
/// let key = timer.add_keyed(Duration::from_secs(9), || ())?;
/// let handle = timer.add(Duration::from_secs(9), || ())?;
/// timer.take(key);
/// let _task = handle.take();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// let timer = system_timer::SystemTimer::builder().reaper(false).build();
/// let key = timer.add_keyed(Duration::from_secs(9), || ())?;
/// let handle = timer.add(Duration::from_secs(9), || ())?;
/// let _task = timer.take(key);
/// handle.take();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(doctest)]
pub struct MustUse;
