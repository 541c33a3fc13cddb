//! [`SystemTimer`] and its [`Builder`].
//!
//! # Ground rules
//!
//! * **Time.** Every reading comes from the timer's [`Clock`], in nanoseconds. A task added with
//!   delay `d` when the clock reads `t` has the deadline `t + d` (saturating: `Duration::MAX` is
//!   "never"). The wheel works in nanoseconds with a tick of `tick`; it rounds deadlines **up** to
//!   the tick and hands an entry out only once its time reaches that, and the timer only ever
//!   advances the wheel to a `now_ns()` reading it has taken, so no task starts before its
//!   deadline. The base of a new task's deadline may come from `deadline_base_ns()`, a reading at
//!   or after `now_ns()` (cheaper on the system clock): later deadlines, never earlier ones.
//! * **Locks.** The wheel's shard locks are the read side of a sharded reader–writer lock
//!   ([`timing_wheel::ConcurrentWheel`]): `add` and `cancel` take one shard's lock; advancing
//!   takes all of them. Then, in this order only: wheel locks → `dispatch`. No user code (a task's
//!   `run`, or the drop of a task) ever runs under any of these locks: tasks are collected under
//!   the locks and run, sent or dropped after release.
//! * **Runners.** A task leaves the wheel only by being cancelled (through its handle or key; the
//!   canceller drops it), by being handed back (shutdown), or by being dispatched: sent to the
//!   executor threads over a crossbeam channel (each batch followed by a permit on the idle
//!   executors' semaphore), or (inline mode) run by the thread that advanced the wheel. A task
//!   whose deadline the wheel's time (its last advance) has already reached when it is added is
//!   dispatched at once, from the adding thread; any other waits in the wheel for its tick.
//! * **Who advances.** The reaper, callers of `advance*`, and, with a reaper grace, callers of
//!   [`SystemTimer::advance_if_due`]: at most one of those per publication of `help_at_ns` (a
//!   compare-and-swap claims it), all through the same advance under the wheel's locks, so
//!   helping changes only which thread advances, never what an advance does. A helper publishes
//!   the next bucket's time and moves the reaper's alarm under the parker's mutex, and only if
//!   no `unpark` came since it read the wheel (see `parker::Parker`): a stale rearm can make the
//!   reaper wake early, never late.
//! * **Shutdown** (exactly-once accounting). 1. `stopping` is set and the reaper is woken and
//!   joined. 2. The wheel is closed under its write side: every pending entry is handed back and
//!   later adds fail with [`ScheduleError::Shutdown`]. 3. Shutdown waits until no advance is
//!   between taking tasks out of the wheel and dispatching them (`running`, raised under the wheel
//!   lock). 4. `dispatch` is closed: the inline ready list is handed back, the channel's sender is
//!   dropped. 5. The executors, which hand back (instead of run) every job they receive once
//!   `stopping` is set, drain the channel and are joined. So every task ends exactly one way:
//!   run, cancelled, or in the returned list.
//!
//! # State of a task
//!
//! `PENDING` (in the wheel) → `CANCELLED` (handle or key) | `HANDED_BACK` (shutdown) |
//! `DISPATCHED`; `DISPATCHED` → `STARTED` (a runner took it; panics are caught and counted) | `HANDED_BACK`
//! (executor saw `stopping`). The wheel's shard lock decides the first transition, so a task
//! runs at most once, and `cancel() == true` means it never runs.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use timing_wheel::{AddError, Added, ConcurrentWheel, WheelKey};

use crate::clock::{Clock, SystemClock, TimerClock};
use crate::error::{BuildError, ScheduleError};
use crate::handle::{TimerHandle, TimerKey};
use crate::stats::{Counters, TimerStats};
use crate::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex};
use crate::task::{Task, TimerTask};

/// The largest job vector (in jobs) an inline timer keeps between advances: 16 Ki jobs, a few
/// hundred KiB; a burst beyond it allocates afresh rather than pinning that memory.
const SPARE_JOBS_MAX: usize = 1 << 14;

/// A task on its way to a runner, with the deadline it was due at.
pub(crate) struct Job<T> {
    pub(crate) task: T,
    pub(crate) deadline_ns: u64,
}

/// Where dispatched tasks go.
pub(crate) enum Dispatch<T> {
    /// Executor threads, over a channel. Jobs travel in batches (one message per advance, split
    /// across the executors): a message per task would make the receivers spin and park once
    /// per task.
    Executor(crossbeam_channel::Sender<Vec<Job<T>>>),
    /// Run by whoever advances next: tasks due at add time wait here (the reaper is woken).
    Inline(Vec<Job<T>>),
    /// Shut down.
    Closed,
}

/// The cap on pending tasks, shared with handles (a winning cancel gives a slot back).
#[derive(Debug)]
pub(crate) struct Cap {
    pub(crate) max: usize,
    pub(crate) used: AtomicUsize,
}

/// Everything the timer's threads share.
pub(crate) struct Inner<T> {
    pub(crate) wheel: ConcurrentWheel<T>,
    /// This timer's id, carried by its [`TimerKey`]s.
    pub(crate) id: crate::handle::TimerId,
    pub(crate) clock: TimerClock,
    pub(crate) tick_ns: u64,
    /// How long past a due bucket the reaper's own timer waits for an add to wake it (0: no
    /// waiting, and no nudges). See [`Builder::reaper_grace`].
    pub(crate) grace_ns: u64,
    /// With a grace: the time (ns) from which a caller of `advance_if_due` should advance the
    /// wheel for the reaper (the earliest bucket's expiration plus `parker::HELP_MARGIN_NS`);
    /// `u64::MAX` while no help is wanted. Published by the reaper before it sleeps and by each
    /// helper after its advance; a caller claims it with a compare-and-swap to `u64::MAX`, so one
    /// caller advances per publication.
    pub(crate) help_at_ns: AtomicU64,
    pub(crate) inline: bool,
    /// Executor threads (0 in inline mode).
    pub(crate) executors: usize,
    pub(crate) dispatch: Mutex<Dispatch<T>>,
    pub(crate) cap: Option<Arc<Cap>>,
    pub(crate) stats: Counters,
    /// Set first thing by shutdown.
    pub(crate) stopping: AtomicBool,
    /// Advances between taking tasks out of the wheel and finishing their dispatch.
    pub(crate) running: AtomicUsize,
    /// A sequence number, odd while an advance (under the wheel lock) has taken tasks out of
    /// the wheel's count and not yet added them to `dispatched`: [`SystemTimer::len`] reads
    /// both counts at an even, unchanged value (a seqlock), so it never misses such a batch.
    pub(crate) moving: AtomicU64,
    /// How many jobs the last advance took out of the wheel: the next one sizes its job vector
    /// by it (growing it push by push cost several reallocations per advance on a busy timer).
    /// Read and written only under the wheel lock; a hint, not state, so `std`'s atomic even
    /// under loom.
    pub(crate) jobs_hint: std::sync::atomic::AtomicUsize,
    /// Inline mode: the job vector of the last advance, emptied and kept for the next one (up
    /// to [`SPARE_JOBS_MAX`] jobs of capacity). A fresh vector per advance cost a malloc and a
    /// free each time, and its growth past glibc's small sizes consolidated the allocator's fast
    /// bins, which then slowed every small allocation of the thread (W4: a twentieth of the
    /// generator's CPU). Taken and put back without holding any other lock; holds no task.
    pub(crate) spare_jobs: Mutex<Vec<Job<T>>>,
    /// Jobs the executors handed back after `stopping` was set.
    pub(crate) returned: Mutex<Vec<T>>,
    /// Where the reaper sleeps (and `advance_clock` callers): see `parker.rs`.
    pub(crate) parker: Arc<crate::parker::Parker>,
    /// Where idle executors sleep; a permit per batch sent.
    pub(crate) idle_executors: crate::reaper::Semaphore,
    /// Under loom, the executors' channel made visible to loom: see `sync::ChannelTrace`
    /// (nothing otherwise). `op()` right before each send, receive and drop of the sender.
    pub(crate) channel: crate::sync::ChannelTrace,
    /// Set when the shutdown has finished (see [`SystemTimer::shutdown`]).
    pub(crate) finished: crate::reaper::Finished,
    pub(crate) name: String,
}

/// A timer: schedule tasks by delay or deadline from any thread, cancel them in O(1) through
/// their handles, and have them run once their deadline is reached, never before.
///
/// A reaper thread sleeps until the earliest bucket of the wheel is due (no periodic wake-ups),
/// advances the wheel, and hands due tasks to executor threads (or runs them itself in inline
/// mode). The timer can also be driven by hand ([`advance`](Self::advance),
/// [`advance_to`](Self::advance_to), [`advance_clock`](Self::advance_clock)) with the reaper off,
/// on the system clock or a [`ManualClock`](crate::ManualClock).
///
/// # Examples
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use system_timer::SystemTimer;
///
/// let timer = SystemTimer::new(); // Kafka's defaults: tick 1 ms, wheel size 20
/// let (tx, rx) = mpsc::channel();
/// let tx2 = tx.clone();
/// timer.add(Duration::from_millis(20), move || tx.send("fired").unwrap())?;
/// let lease = timer.add(Duration::from_secs(30), move || tx2.send("lease lost").unwrap())?;
/// assert!(lease.cancel()); // renewed: it will never run
/// assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "fired");
/// let left = timer.shutdown(); // joins the threads; hands back what never ran
/// assert!(left.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Driven deterministically, with a manual clock and no reaper thread:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use system_timer::{ManualClock, SystemTimer};
///
/// let clock = ManualClock::new(0);
/// let timer = SystemTimer::builder().clock(clock.clone()).reaper(false).inline().build();
/// let runs = Arc::new(AtomicUsize::new(0));
/// let r = runs.clone();
/// let h = timer.add(Duration::from_millis(6), move || { r.fetch_add(1, Ordering::SeqCst); })?;
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(timer.advance(), 0);
/// clock.advance(Duration::from_millis(1));
/// assert_eq!(timer.advance(), 1);
/// assert!(h.is_fired() && runs.load(Ordering::SeqCst) == 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SystemTimer<T: TimerTask = Task> {
    inner: Arc<Inner<T>>,
    threads: Mutex<crate::reaper::Threads>,
}

/// The most executor threads a timer takes ([`Builder::executor_threads`]): far past any use
/// (executors only run due tasks), and short of what would exhaust a host's threads.
pub const MAX_EXECUTOR_THREADS: usize = 1024;

/// How long the reaper thread sleeps after a panic in its own turn (a [`Clock`] that panicked)
/// before it reads the clock again; an add or a shutdown wakes it sooner. See
/// [`TimerStats::reaper_panics`](crate::TimerStats::reaper_panics).
pub const REAPER_PANIC_BACKOFF: Duration = Duration::from_millis(10);

/// Configures and builds a [`SystemTimer`].
///
/// ```
/// use std::time::Duration;
/// use system_timer::SystemTimer;
/// let timer = SystemTimer::builder()
///     .tick(Duration::from_millis(1))
///     .wheel_size(20)
///     .executor_threads(2)
///     .max_pending(1_000_000)
///     .name("leases")
///     .build();
/// assert_eq!(timer.len(), 0);
/// ```
#[must_use = "a builder does nothing until `build` or `try_build` is called"]
pub struct Builder<T: TimerTask = Task> {
    tick: Duration,
    wheel_size: usize,
    clock: Option<Box<dyn Clock>>,
    executor_threads: usize,
    inline: bool,
    max_pending: Option<usize>,
    name: String,
    reaper: bool,
    reaper_grace: Duration,
    shards: Option<usize>,
    /// Under loom: keep executor mode (see [`model_executors`](Self::model_executors)).
    #[cfg(loom)]
    model_executors: bool,
    _task: std::marker::PhantomData<fn(T)>,
}

// ===== impl Builder =====

impl<T: TimerTask> Builder<T> {
    /// A builder with Kafka's defaults: tick 1 ms, wheel size 20, the system clock, one executor
    /// thread, a reaper thread, no cap, name `"timer"`.
    pub fn new() -> Self {
        Builder {
            tick: Duration::from_millis(1),
            wheel_size: 20,
            clock: None,
            executor_threads: 1,
            inline: false,
            max_pending: None,
            name: "timer".into(),
            reaper: true,
            reaper_grace: Duration::ZERO,
            shards: None,
            #[cfg(loom)]
            model_executors: false,
            _task: std::marker::PhantomData,
        }
    }

    /// Width of a level-0 bucket (default 1 ms). Deadlines are rounded up to it: a task runs at
    /// most about one tick after its deadline, never before.
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Buckets per level (default 20; at least 2, at most
    /// [`timing_wheel::MAX_WHEEL_SIZE`]).
    pub fn wheel_size(mut self, n: usize) -> Self {
        self.wheel_size = n;
        self
    }

    /// The clock (default: a new [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Box::new(clock));
        self
    }

    /// Run expired tasks on `n` executor threads (default 1; at most
    /// [`MAX_EXECUTOR_THREADS`], or
    /// [`try_build`](Self::try_build) refuses it).
    pub fn executor_threads(mut self, n: usize) -> Self {
        self.executor_threads = n;
        self.inline = false;
        self
    }

    /// Run expired tasks on the thread that advances the timer (the reaper, or the caller of
    /// `advance*`) instead of executor threads. Tasks should then be short: a slow task delays
    /// every later expiry.
    pub fn inline(mut self) -> Self {
        self.inline = true;
        self
    }

    /// Refuse new tasks with [`ScheduleError::Full`] while `max` tasks wait in the wheel. A
    /// task leaves the cap when it leaves the wheel: tasks dispatched to the executors and not
    /// yet started, and tasks already due when added (dispatched at once), are not counted, so
    /// [`SystemTimer::len`] can exceed `max` while the executors are behind.
    ///
    /// The cap errs on the side of refusing, for a moment: an add takes its slot (one atomic
    /// add, no lock) before the wheel says whether the task is already due, and gives it back
    /// right after if it is; an advance gives its fired tasks' slots back just after it releases
    /// the wheel. So while the tasks waiting plus the slots that such adds and advances on
    /// other threads hold for that moment reach `max`, an add (of a task already due too) is
    /// refused `Full` although fewer than `max` tasks wait. `Full` means "retry later"; it
    /// never loses the task, which comes back in the error.
    pub fn max_pending(mut self, max: usize) -> Self {
        self.max_pending = Some(max);
        self
    }

    /// Names the threads (`<name>-reaper`, `<name>-executor-<i>`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// For loom models only: build in executor mode (without it, a loom build runs the tasks
    /// inline, whatever was asked), with [`executor_threads`](Self::executor_threads) executors
    /// (default 1) started as loom threads, which the timer's shutdown wakes and joins, as it
    /// joins real ones. Mind loom's limit of 4 spawned threads per model.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn model_executors(mut self) -> Self {
        self.model_executors = true;
        self.inline = false;
        self
    }

    /// Whether to start a reaper thread (default true). Without one, drive the timer with
    /// [`SystemTimer::advance`] and friends.
    pub fn reaper(mut self, on: bool) -> Self {
        self.reaper = on;
        self
    }

    /// Lets callers that run anyway advance the wheel for the reaper, and has the reaper's own
    /// timer wait `grace` longer for them (default zero: the reaper wakes on its own timer when
    /// the earliest bucket is due, and [`advance_if_due`](SystemTimer::advance_if_due) does
    /// nothing).
    ///
    /// With a grace, while the reaper sleeps towards the earliest bucket, the first call of
    /// [`SystemTimer::advance_if_due`] that finds the clock past that bucket's expiration (plus
    /// 25 µs, above the error bound of its cheap clock reading) advances the wheel itself,
    /// and moves the reaper's wake-up past the next bucket without waking it (on Linux, where
    /// the reaper then sleeps on a timerfd; elsewhere the reaper still wakes at the time it chose
    /// and sleeps again). Due tasks go where they would have: to the executors, or, in inline
    /// mode, run on the calling thread. A thread that runs every tick anyway (one taking
    /// requests, say; the purgatory calls it after each new operation) so keeps the wheel's time,
    /// and the reaper sleeps through: on a virtual machine a thread's timer wake-up costs it far
    /// more CPU than the advance it does (see the project's README).
    ///
    /// Tasks still never run early. What changes is the bound on lateness: while callers keep
    /// coming (at least one per tick), a due bucket is advanced at the first call after it;
    /// when they stop, the reaper's own timer fires up to `grace` later than without this
    /// option, so a task runs at most one tick plus `grace` after its deadline (plus scheduling
    /// noise). Without callers of `advance_if_due` a grace only makes expiry later. The
    /// purgatory suggests two ticks for a busy one. No effect on a timer without a reaper.
    pub fn reaper_grace(mut self, grace: Duration) -> Self {
        self.reaper_grace = grace;
        self
    }

    /// Wheel shards (default: twice the machine's parallelism, a power of two, at least 2).
    /// `n` is rounded up to a power of two; it must be between 1 and
    /// [`timing_wheel::MAX_SHARDS`] (256), or [`try_build`](Self::try_build) refuses it with
    /// [`BuildError::Wheel`]`(`[`ConfigError::BadShardCount`](timing_wheel::ConfigError::BadShardCount)`)`.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Builds the timer and starts its threads.
    ///
    /// # Panics
    ///
    /// On an invalid configuration (see [`try_build`](Self::try_build)), with the error's message.
    pub fn build(self) -> SystemTimer<T> {
        match self.try_build() {
            Ok(t) => t,
            Err(e) => panic!("invalid SystemTimer configuration: {e}"),
        }
    }

    /// Builds the timer and starts its threads.
    ///
    /// # Errors
    ///
    /// [`BuildError`] for a zero tick, a bad wheel size (below 2 or above
    /// [`MAX_WHEEL_SIZE`](timing_wheel::MAX_WHEEL_SIZE)), a tick × wheel size that overflows a
    /// `u64` of nanoseconds, a [`shards`](Self::shards) count outside `1..=256` (those three as
    /// [`BuildError::Wheel`]), zero executor threads or more than
    /// [`MAX_EXECUTOR_THREADS`], a failed thread
    /// spawn (or a [`name`](Self::name) with a NUL byte, which no thread can have), or (under
    /// `--cfg loom`) a reaper. (Under loom, executors are not an error: the timer runs its tasks
    /// inline instead, unless a model asked for loom executor threads.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use system_timer::{BuildError, SystemTimer};
    /// let e = SystemTimer::builder().tick(Duration::ZERO).try_build().unwrap_err();
    /// assert_eq!(e, BuildError::ZeroTick);
    /// assert!(SystemTimer::builder().wheel_size(1).try_build().is_err());
    /// ```
    pub fn try_build(self) -> Result<SystemTimer<T>, BuildError> {
        let tick_ns = u64::try_from(self.tick.as_nanos()).unwrap_or(u64::MAX);
        if tick_ns == 0 {
            return Err(BuildError::ZeroTick);
        }
        if !self.inline && self.executor_threads == 0 {
            return Err(BuildError::NoExecutorThreads);
        }
        // Before any spawn: a count past any use would spawn threads until the system refused
        // one, taking them from every process on the host meanwhile.
        if !self.inline && self.executor_threads > crate::MAX_EXECUTOR_THREADS {
            return Err(BuildError::TooManyExecutorThreads(self.executor_threads));
        }
        // The threads are named after the timer; the standard library panics on a NUL byte.
        if self.name.contains('\0') {
            return Err(BuildError::Spawn(format!(
                "timer name {:?} contains a NUL byte",
                self.name
            )));
        }
        if cfg!(loom) && self.reaper {
            return Err(BuildError::LoomNeedsManualDriving);
        }
        // Under loom a model's timer runs its tasks inline, on the thread that calls `advance*`,
        // unless the model asked for loom executor threads (`model_executors`).
        #[cfg(not(loom))]
        let inline = self.inline;
        #[cfg(loom)]
        let inline = self.inline || !self.model_executors;
        let clock = match self.clock {
            Some(clock) => TimerClock::Other(clock),
            None => TimerClock::System(SystemClock::new()),
        };
        let start = clock.now_ns();
        let wheel = match self.shards {
            Some(s) => ConcurrentWheel::with_shards(tick_ns, self.wheel_size, start, s)?,
            None => ConcurrentWheel::new(tick_ns, self.wheel_size, start)?,
        };
        let (dispatch, receiver) = if inline {
            (Dispatch::Inline(Vec::new()), None)
        } else {
            let (tx, rx) = crossbeam_channel::unbounded();
            (Dispatch::Executor(tx), Some(rx))
        };
        let inner = Arc::new(Inner {
            wheel,
            id: crate::handle::TimerId::next(),
            clock,
            tick_ns,
            grace_ns: crate::clock::duration_ns(self.reaper_grace),
            help_at_ns: AtomicU64::new(u64::MAX),
            inline,
            executors: if inline { 0 } else { self.executor_threads },
            dispatch: Mutex::new(dispatch),
            cap: self.max_pending.map(|max| {
                Arc::new(Cap {
                    max,
                    used: AtomicUsize::new(0),
                })
            }),
            stats: Counters::new(),
            stopping: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            moving: AtomicU64::new(0),
            jobs_hint: std::sync::atomic::AtomicUsize::new(0),
            spare_jobs: Mutex::new(Vec::new()),
            returned: Mutex::new(Vec::new()),
            parker: Arc::new(crate::parker::Parker::new(
                self.reaper && self.reaper_grace > Duration::ZERO,
            )),
            idle_executors: crate::reaper::Semaphore::default(),
            channel: crate::sync::ChannelTrace::new(),
            finished: crate::reaper::Finished::default(),
            name: self.name,
        });
        let threads = crate::reaper::start(&inner, self.reaper, self.executor_threads, receiver)
            .map_err(|e| BuildError::Spawn(e.to_string()))?;
        Ok(SystemTimer {
            inner,
            threads: Mutex::new(threads),
        })
    }
}

impl<T: TimerTask> Default for Builder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: TimerTask> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("tick", &self.tick)
            .field("wheel_size", &self.wheel_size)
            .field("executor_threads", &self.executor_threads)
            .field("inline", &self.inline)
            .field("max_pending", &self.max_pending)
            .field("name", &self.name)
            .field("reaper", &self.reaper)
            .field("reaper_grace", &self.reaper_grace)
            .field("shards", &self.shards)
            .field("clock", &self.clock)
            .finish()
    }
}

// ===== impl SystemTimer =====

impl SystemTimer<Task> {
    /// A timer with Kafka's defaults (tick 1 ms, wheel size 20), the system clock, a reaper and
    /// one executor thread, running boxed closures ([`Task`]).
    ///
    /// # Panics
    ///
    /// If the threads cannot be spawned.
    #[doc(alias = "SystemTimer")]
    pub fn new() -> Self {
        Builder::new().build()
    }

    /// A [`Builder`] for a timer of boxed closures. For a timer of your own task type, use
    /// `Builder::<MyTask>::new()`.
    pub fn builder() -> Builder<Task> {
        Builder::new()
    }
}

impl Default for SystemTimer<Task> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: TimerTask> SystemTimer<T> {
    /// Schedules `task` to run `delay` from now (on the timer's clock). O(1), from any thread.
    /// Like every deadline, a zero delay's is rounded up to the tick: the task runs at the next
    /// tick, or is dispatched at once from this thread if the timer's last advance already
    /// reached its deadline. Dispatched means sent to the executors; in
    /// [`inline`](Builder::inline) mode the task does not run on this thread but waits for the
    /// next advance (the reaper is woken for it; without a reaper, the caller's next
    /// `advance*`), and its handle already reports [`is_fired`](TimerHandle::is_fired).
    /// `Duration::MAX` never fires.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Shutdown`] after [`shutdown`](Self::shutdown), [`ScheduleError::Full`]
    /// at the [`max_pending`](Builder::max_pending) cap; both hand the task back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use system_timer::SystemTimer;
    /// let timer = SystemTimer::builder().reaper(false).build();
    /// let h = timer.add(Duration::from_secs(5), || println!("later"))?;
    /// assert_eq!(timer.len(), 1);
    /// assert!(h.deadline() >= Duration::from_secs(5));
    /// assert_eq!(timer.shutdown().len(), 1); // the task never ran: handed back
    /// let e = timer.add(Duration::ZERO, || ()).unwrap_err();
    /// assert!(e.is_shutdown());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "schedule")]
    #[inline(always)]
    pub fn add(
        &self,
        delay: Duration,
        task: impl Into<T>,
    ) -> Result<TimerHandle<T>, ScheduleError<T>> {
        let now = self.inner.clock.deadline_base_ns();
        let deadline = crate::clock::deadline_after(now, delay);
        self.inner.schedule(deadline, task.into())
    }

    /// Schedules `task` at an absolute deadline: `deadline` after the clock's epoch (compare
    /// [`now`](Self::now)). Like every deadline it is rounded up to the tick, a past one
    /// included: dispatched at once from this thread if the timer's last advance already
    /// reached it (in inline mode: queued for the next advance, see [`add`](Self::add)), else
    /// run by the first advance that reaches its tick (the next advance once
    /// the clock has passed that tick; a deadline earlier in the clock's current tick waits for
    /// the next tick, as a zero delay does; the reaper is woken for it). A deadline past the
    /// clock's range (`Duration::MAX`) never fires; nor does one past the wheel's last tick
    /// (the last multiple of the tick below `u64::MAX` ns), unless the clock has already
    /// reached it when the task is added (only a manual clock gets there).
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    ///
    /// ```
    /// use std::time::Duration;
    /// use system_timer::{ManualClock, SystemTimer};
    /// let clock = ManualClock::new(1_000);
    /// let timer = SystemTimer::builder().clock(clock.clone()).reaper(false).inline().build();
    /// let h = timer.add_at(Duration::from_millis(1_500), || ())?;
    /// assert_eq!(h.deadline_ms(), 1_500);
    /// // 0.5 ms into the current 1 ms tick: passed, but due at the next tick.
    /// clock.advance(Duration::from_micros(700));
    /// let past = timer.add_at(Duration::from_micros(1_000_500), || ())?;
    /// assert!(past.is_pending());
    /// assert_eq!(timer.advance(), 0);
    /// clock.advance(Duration::from_micros(300));
    /// assert_eq!(timer.advance(), 1);
    /// assert!(past.is_fired());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn add_at(
        &self,
        deadline: Duration,
        task: impl Into<T>,
    ) -> Result<TimerHandle<T>, ScheduleError<T>> {
        self.inner
            .schedule(crate::clock::deadline_at(deadline), task.into())
    }

    /// [`add`](Self::add), returning a [`TimerKey`] instead of a [`TimerHandle`]: the cheapest
    /// way to schedule (no reference count taken, nothing to drop). Cancel with
    /// [`cancel`](Self::cancel). A task dispatched at once (its deadline already reached by the
    /// timer's last advance, see [`add`](Self::add)) gets a key that matches nothing.
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    ///
    /// ```
    /// use std::time::Duration;
    /// use system_timer::SystemTimer;
    /// let timer = SystemTimer::new();
    /// let key = timer.add_keyed(Duration::from_secs(30), || unreachable!("renewed"))?;
    /// assert!(timer.is_pending(key));
    /// assert!(timer.cancel(key)); // won: the task never runs
    /// assert!(!timer.cancel(key));
    /// assert!(!timer.is_pending(key) && timer.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn add_keyed(
        &self,
        delay: Duration,
        task: impl Into<T>,
    ) -> Result<TimerKey, ScheduleError<T>> {
        let now = self.inner.clock.deadline_base_ns();
        let deadline = crate::clock::deadline_after(now, delay);
        self.inner.schedule_keyed(deadline, task.into())
    }

    /// [`add_at`](Self::add_at), returning a [`TimerKey`] (see [`add_keyed`](Self::add_keyed)).
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add).
    #[inline]
    pub fn add_at_keyed(
        &self,
        deadline: Duration,
        task: impl Into<T>,
    ) -> Result<TimerKey, ScheduleError<T>> {
        self.inner
            .schedule_keyed(crate::clock::deadline_at(deadline), task.into())
    }

    /// Cancels the task `key` names: O(1), from any thread. Returns true if this call won: the
    /// task was pending, is removed at once (its memory released, dropped on this thread after
    /// the timer's lock is released) and will never run. False if it already started or was
    /// dispatched, was cancelled before, was handed back by a shutdown, or the key is another
    /// timer's.
    ///
    /// # Panics
    ///
    /// If the task's drop panics, once the cancel has won (as [`TimerHandle::cancel`]).
    #[inline(always)]
    pub fn cancel(&self, key: TimerKey) -> bool {
        // The slot is given back first: a panic in the task's drop must not keep it for ever.
        self.take(key).map(drop).is_some()
    }

    /// Cancels the task `key` names and hands it back instead of dropping it: `Some(task)` if
    /// this call won (when [`cancel`](Self::cancel) would return true), `None` otherwise. The
    /// timer no longer holds it (its [`max_pending`](Builder::max_pending) slot is free) and
    /// will never run it; add it again with a new delay (a renewed lease keeps its task, no new
    /// closure), run it, or drop it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use system_timer::SystemTimer;
    /// let timer = SystemTimer::new();
    /// let mut session = timer.add_keyed(Duration::from_secs(10), || println!("expired"))?;
    /// // A heartbeat: the same task, ten seconds from now.
    /// if let Some(task) = timer.take(session) {
    ///     session = timer.add_keyed(Duration::from_secs(10), task)?;
    /// }
    /// assert!(timer.is_pending(session) && timer.len() == 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    #[must_use = "the task is handed back, not dropped: add it again, run it, or use cancel"]
    pub fn take(&self, key: TimerKey) -> Option<T> {
        if key.timer != self.inner.id {
            return None;
        }
        let task = self.inner.wheel.cancel(key.key)?;
        if let Some(cap) = &self.inner.cap {
            cap.used.fetch_sub(1, Ordering::AcqRel);
        }
        Some(task)
    }

    /// True while the task `key` names waits in this timer for its deadline.
    pub fn is_pending(&self, key: TimerKey) -> bool {
        key.timer == self.inner.id && self.inner.wheel.is_pending(key.key)
    }

    /// The deadline of the task `key` names (time since the clock's epoch), while it is pending.
    pub fn deadline(&self, key: TimerKey) -> Option<Duration> {
        if key.timer != self.inner.id {
            return None;
        }
        self.inner.wheel.deadline(key.key).map(Duration::from_nanos)
    }

    /// The clock's reading, as a duration since its epoch.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.inner.clock.now_ns())
    }

    /// The reading [`add`](Self::add) bases a delay's deadline on: the clock's time now or up
    /// to about 13 µs later, never earlier (see [`Clock::deadline_base_ns`]); on the
    /// system clock, cheaper than [`now`](Self::now). A caller that adds and then helps the
    /// reaper reads the clock once with it: [`add_at_keyed`](Self::add_at_keyed)`(base +
    /// delay, ..)`, then [`advance_if_due_at`](Self::advance_if_due_at)`(base)`.
    ///
    /// [`Clock::deadline_base_ns`]: crate::Clock::deadline_base_ns
    #[inline]
    pub fn deadline_base(&self) -> Duration {
        Duration::from_nanos(self.inner.clock.deadline_base_ns())
    }

    /// Advances the timer to the clock's current time, dispatching every task due by then (in
    /// inline mode: running them on this thread). Returns how many were dispatched. Non-blocking
    /// apart from the wheel's locks.
    pub fn advance(&self) -> usize {
        self.inner.advance_to_ns(self.inner.clock.now_ns())
    }

    /// Advances the timer for its reaper if the reaper waits for a caller to (a timer built with
    /// a [`reaper_grace`](Builder::reaper_grace)) and a bucket is due: see there. Call it from a
    /// thread that runs every tick or so anyway, at a point where running due tasks is safe in
    /// inline mode (no lock held that a task might take). Returns how many tasks it dispatched.
    ///
    /// Cheap when there is nothing to do: one relaxed atomic load (plus a clock reading of about
    /// 13 ns once a bucket may be due). At most one caller advances per due bucket; the others
    /// return 0 at once, never waiting for it.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use system_timer::SystemTimer;
    ///
    /// // A grace longer than the test: once the reaper sleeps, only a caller runs the task in time.
    /// let timer = SystemTimer::builder().inline().reaper_grace(Duration::from_secs(3600)).build();
    /// let ran = Arc::new(AtomicUsize::new(0));
    /// let r = ran.clone();
    /// timer.add(Duration::from_millis(5), move || { r.fetch_add(1, Ordering::SeqCst); })?;
    /// while ran.load(Ordering::SeqCst) == 0 {
    ///     std::thread::sleep(Duration::from_millis(1));
    ///     timer.advance_if_due(); // this thread keeps the wheel's time; the reaper sleeps
    /// }
    /// assert_eq!(ran.load(Ordering::SeqCst), 1);
    /// // Usually `caller_advances` is now 1. Not asserted: on a busy machine the reaper, woken by
    /// // the add, may first run when the bucket is already due and advance itself (0), or the
    /// // wheel's time may lag the clock so that the bucket is cascaded down first (2).
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn advance_if_due(&self) -> usize {
        self.inner.help(|| self.inner.clock.deadline_base_ns())
    }

    /// [`advance_if_due`](Self::advance_if_due), judged against `now`: a reading of this
    /// timer's clock the caller already holds (from [`deadline_base`](Self::deadline_base) or
    /// [`now`](Self::now)), so that the call reads no clock unless it advances. An earlier
    /// reading only delays the help; a later one cannot make a task fire early (an advance
    /// reads the clock itself, and runs only what is due by then), but each call with one
    /// claims the help and advances for nothing: pass real readings.
    #[inline]
    pub fn advance_if_due_at(&self, now: Duration) -> usize {
        self.inner.help(|| crate::clock::duration_ns(now))
    }

    /// [`advance`](Self::advance) to an explicit time in ms on the timer's clock, for callers
    /// that drive time themselves. A time ahead of the clock is clamped to the clock (never early).
    #[doc(alias = "advanceClock")]
    pub fn advance_to(&self, now_ms: u64) -> usize {
        self.advance_to_ns(now_ms.saturating_mul(1_000_000))
    }

    /// [`advance_to`](Self::advance_to) in nanoseconds.
    pub fn advance_to_ns(&self, now_ns: u64) -> usize {
        let now = now_ns.min(self.inner.clock.now_ns());
        self.inner.advance_to_ns(now)
    }

    /// Kafka's `advanceClock(timeoutMs)`: waits up to `timeout` (on the timer's clock; with a
    /// manual clock, until the clock is moved far enough) for a task to become due, then
    /// advances. Returns true if at least one task was dispatched. For callers who run no reaper
    /// thread; do not combine with a running reaper.
    pub fn advance_clock(&self, timeout: Duration) -> bool {
        crate::reaper::advance_clock(&self.inner, timeout)
    }

    /// Tasks scheduled and not yet started, cancelled or handed back: those in the wheel plus
    /// those dispatched and waiting for an executor. Exact: cancelled tasks leave at once, and
    /// a batch on its way from the wheel to the executors is counted once, never missed (the
    /// call waits out the few locked microseconds of an advance moving it).
    #[doc(alias = "size")]
    pub fn len(&self) -> usize {
        self.inner.pending()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time (since the clock's epoch) at which the reaper next has work: the earliest
    /// queued bucket's start, which is at or before the earliest pending deadline rounded up to
    /// the tick (a deadline between ticks is due at the next tick). In inline mode, while tasks
    /// that were due when added wait for the next advance to run them, the clock's time (or an
    /// earlier bucket's): the next advance has work at once. `None` when no bucket is queued
    /// and nothing waits to run. A bucket that cancels emptied stays queued until its time (the
    /// advance then moves the wheel's time past it, as for any due bucket), so this can name a
    /// time while nothing is pending ([`is_empty`](Self::is_empty)).
    pub fn next_expiration(&self) -> Option<Duration> {
        let next = self.inner.wheel.next_expiration();
        if self.inner.has_ready() {
            let now = self.inner.clock.now_ns();
            return Some(Duration::from_nanos(next.map_or(now, |x| x.min(now))));
        }
        next.map(Duration::from_nanos)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TimerStats {
        let inner = &self.inner;
        let s = &inner.stats;
        // One pass under the wheel's locks (not a second round of per-shard locks for counts).
        let (w, queued_buckets, levels) = {
            let g = inner.wheel.lock();
            (g.counts(), g.queued_buckets(), g.levels())
        };
        TimerStats {
            scheduled: w.added + s.immediate.load(Ordering::Relaxed),
            fired: s.started.load(Ordering::Relaxed),
            cancelled: w.cancelled,
            panicked: s.panicked.load(Ordering::Relaxed),
            handed_back: w.handed_back + s.returned.load(Ordering::Relaxed),
            pending: self.len() as u64,
            queued_buckets,
            levels,
            reaper_wakeups: s.wakeups.load(Ordering::Relaxed),
            reaper_panics: s.reaper_panics.load(Ordering::Relaxed),
            caller_advances: s.helps.load(Ordering::Relaxed),
            lateness: s.lateness.snapshot(),
        }
    }

    /// The tick, as configured.
    pub fn tick(&self) -> Duration {
        Duration::from_nanos(self.inner.tick_ns)
    }

    /// True once [`shutdown`](Self::shutdown) has started.
    pub fn is_shutdown(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Stops the timer promptly: wakes and joins the reaper and executors, and returns every task
    /// that neither ran nor was cancelled (pending in the wheel, or dispatched but not yet
    /// started). Later `add`s fail with [`ScheduleError::Shutdown`] (an add racing the
    /// shutdown may still be accepted, and is then handed back), and handles' `cancel` returns
    /// false. Idempotent: a second call returns nothing. Dropping the
    /// timer calls it and drops those tasks one by one: a panic in one's `Drop` is caught (the
    /// panic hook reports it) and the others are still dropped.
    ///
    /// Called from inside one of the timer's tasks (or by the drop of a last reference a task
    /// held), whether the task runs on the reaper, an executor, or inline in a caller's
    /// `advance*`, it cannot wait for the task it runs in nor join its own thread:
    /// it then returns at once, with nothing, and a short-lived thread (`<name>-shutdown`)
    /// finishes the shutdown once that task has returned, dropping the tasks it would have
    /// returned (one by one, as the drop of the timer does). Call it from elsewhere to get them
    /// back. The wheel is closed before the call returns, as by a joining shutdown: later
    /// `add`s fail, and `cancel` and `take` find nothing.
    ///
    /// A call while another shutdown is under way (from another thread, or finishing in the
    /// background) returns nothing once that one has finished: the threads joined, no task of
    /// the timer running. From inside a task it returns at once, as above.
    #[doc(alias = "close")]
    #[must_use = "the tasks that never ran are handed back: drop them explicitly if that is meant"]
    pub fn shutdown(&self) -> Vec<T> {
        self.stop(false)
    }

    /// [`shutdown`](Self::shutdown) as it runs from inside one of the timer's tasks, from any
    /// thread: stops the timer (later `add`s fail with [`ScheduleError::Shutdown`]) and returns
    /// at once, without waiting for the reaper, the executors or a task in flight; a
    /// short-lived thread (`<name>-shutdown`) finishes the shutdown (joins the threads once
    /// their tasks have returned) and drops the tasks `shutdown` would have returned (one by
    /// one: a panic in a task's `Drop` is caught there, reported by the panic hook). The wheel
    /// is closed before it returns: later `add`s fail, and `cancel` and `take` find nothing.
    /// For a
    /// caller that holds something a running task may be waiting for (a purgatory's operation
    /// lock, say), which a joining shutdown would deadlock with. Idempotent, and a no-op after
    /// `shutdown`.
    pub fn shutdown_in_background(&self) {
        drop(self.stop(true));
    }

    /// Both shutdowns: the first call stops the timer. It finishes the shutdown on a thread of
    /// its own when asked to (`background`) or when it must (called from one of the timer's
    /// threads, or from a task run inline here), else here.
    fn stop(&self, background: bool) -> Vec<T> {
        let inner = &self.inner;
        if inner.stopping.swap(true, Ordering::AcqRel) {
            // Another shutdown is under way (or done): wait until it has joined the threads, so
            // that no task of the timer still runs when this call returns. Not from inside a
            // task: that shutdown waits for this task's return. (Under loom too: no model shuts
            // the timer down from inside a task, whose thread loom could not tell apart here.)
            if !background
                && !crate::reaper::on_timer_thread(inner.id)
                && !crate::reaper::RunsInline::here(inner.id)
            {
                inner.finished.wait();
            }
            return Vec::new();
        }
        #[cfg(not(loom))]
        {
            let threads = std::mem::take(&mut *self.threads.lock());
            if background
                || crate::reaper::on_timer_thread(inner.id)
                || crate::reaper::RunsInline::here(inner.id)
            {
                crate::reaper::shutdown_elsewhere(Arc::clone(inner), threads);
                return Vec::new();
            }
            inner.finish_shutdown(threads)
        }
        #[cfg(loom)]
        {
            let threads = std::mem::take(&mut *self.threads.lock());
            if background {
                crate::reaper::shutdown_elsewhere(Arc::clone(inner), threads);
                return Vec::new();
            }
            inner.finish_shutdown(threads)
        }
    }

    /// Panics if an invariant of the wheel or the counters is broken (for tests and models).
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let g = self.inner.wheel.lock();
        g.check_invariants();
        let w = g.counts();
        drop(g);
        // Reconciled from the counters directly (not `stats()`, whose lateness histogram would
        // add hundreds of atomic reads to every loom model that calls this).
        let s = &self.inner.stats;
        let scheduled = w.added + s.immediate.load(Ordering::Acquire);
        let fired = s.started.load(Ordering::Acquire);
        let handed_back = w.handed_back + s.returned.load(Ordering::Acquire);
        let pending = self.len() as u64;
        assert_eq!(
            scheduled,
            fired + w.cancelled + handed_back + pending,
            "task accounting does not reconcile: scheduled {scheduled}, fired {fired}, cancelled {}, handed back {handed_back}, pending {pending} (wheel {w:?})",
            w.cancelled
        );
    }
}

impl<T: TimerTask> SystemTimer<T> {
    /// For loom models only (no reaper thread runs under loom): one turn of the reaper's loop,
    /// as the reaper thread runs it: `None` once shutdown has started; otherwise advances if
    /// something is due, or sleeps until woken (under loom a timed sleep is a plain wait: a
    /// model must arrange a wake-up, or loom reports a deadlock). `Some(n)`: tasks dispatched.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn reaper_step(&self) -> Option<usize> {
        self.inner.reaper_step()
    }

    /// For loom models only: waits until a thread running [`reaper_step`](Self::reaper_step)
    /// sleeps (it must be about to: loom reports a deadlock otherwise), and returns what it
    /// sleeps for: the time its alarm is set to (the timerfd's, with a grace; `None`: until
    /// woken) and the time published for callers of `advance_if_due` (`help_at_ns`; `None`: no
    /// help wanted). Read under the parker's mutex, while the reaper sleeps on it.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn sleeping_reaper(&self) -> SleepingReaper {
        let alarm = self.inner.parker.sleeping_reaper();
        let help_at = self.inner.help_at_ns.load(Ordering::Acquire);
        SleepingReaper {
            alarm: alarm.map(Duration::from_nanos),
            help_at: (help_at != u64::MAX).then(|| Duration::from_nanos(help_at)),
        }
    }
}

/// For loom models only: what a sleeping reaper waits for ([`SystemTimer::sleeping_reaper`]).
#[cfg(loom)]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SleepingReaper {
    /// When its alarm fires (on the timer's clock); `None`: only when woken.
    pub alarm: Option<Duration>,
    /// From when callers of `advance_if_due` advance for it; `None`: no help wanted.
    pub help_at: Option<Duration>,
}

impl<T: TimerTask> Drop for SystemTimer<T> {
    fn drop(&mut self) {
        drop_each(self.shutdown());
    }
}

impl<T: TimerTask> fmt::Debug for SystemTimer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemTimer")
            .field("name", &self.inner.name)
            .field("tick", &self.tick())
            .field("len", &self.len())
            .field("shutdown", &self.is_shutdown())
            .finish()
    }
}

/// Splits a batch into at most `parts` batches of near-equal size (one per executor thread).
fn split<J>(mut jobs: Vec<J>, parts: usize) -> Vec<Vec<J>> {
    let parts = parts.clamp(1, jobs.len().max(1));
    let size = jobs.len().div_ceil(parts);
    let mut out = Vec::with_capacity(parts);
    while jobs.len() > size {
        let tail = jobs.split_off(jobs.len() - size);
        out.push(tail);
    }
    out.push(jobs);
    out.reverse();
    out
}

/// Drops a caught panic's payload; one whose own drop panics too is leaked instead.
fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// Drops tasks that nobody can be handed (a background shutdown's, or a dropped timer's), one
/// at a time: a panic in one task's drop is caught (the panic hook has reported it), so the
/// others are still dropped, and a second one cannot abort the process, as it would while the
/// first unwound through the vector's drop.
pub(crate) fn drop_each<T>(tasks: Vec<T>) {
    for task in tasks {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(task))) {
            drop_payload(payload);
        }
    }
}

// ===== impl Inner =====

impl<T: TimerTask> Inner<T> {
    /// Schedules `task` at `deadline` (ns on the clock; `None`: past the end of the clock's
    /// range, never reached).
    #[inline(always)]
    pub(crate) fn schedule(
        &self,
        deadline: Option<u64>,
        task: T,
    ) -> Result<TimerHandle<T>, ScheduleError<T>> {
        let deadline_ns = deadline.unwrap_or(u64::MAX);
        Ok(
            match self.schedule_with(deadline, task, ConcurrentWheel::add)? {
                Some(entry) => TimerHandle::new(Some(entry), deadline_ns, self.cap.clone()),
                None => TimerHandle::new(None, deadline_ns, None),
            },
        )
    }

    #[inline(always)]
    pub(crate) fn schedule_keyed(
        &self,
        deadline: Option<u64>,
        task: T,
    ) -> Result<TimerKey, ScheduleError<T>> {
        let key = self.schedule_with(deadline, task, ConcurrentWheel::add_keyed)?;
        Ok(TimerKey {
            key: key.unwrap_or(WheelKey::NONE),
            timer: self.id,
        })
    }

    /// Schedules through `add` (the wheel's handle- or key-returning add). `None`: the task was
    /// already due and has been dispatched. A `deadline` of `None` is past the end of the
    /// clock's range: the task never runs (it waits in the wheel, as "never", until cancelled or
    /// handed back).
    #[inline(always)]
    fn schedule_with<H>(
        &self,
        deadline: Option<u64>,
        task: T,
        add: impl FnOnce(&ConcurrentWheel<T>, u64, T) -> Result<Added<H>, AddError<T>>,
    ) -> Result<Option<H>, ScheduleError<T>> {
        let deadline_ns = deadline.unwrap_or(u64::MAX);
        if deadline_ns > u64::MAX - self.tick_ns {
            // Past the wheel's last tick: "never" to the wheel. Unless the clock has reached it
            // (a clock at the end of its range, e.g. a saturated manual clock): then it is due,
            // as any deadline in the past is. A deadline past the clock's range (`None`) is not
            // reached even then: it is not `u64::MAX`, only stored as that.
            if deadline.is_some() && deadline_ns <= self.clock.now_ns() {
                self.dispatch_now(Job { task, deadline_ns })?;
                return Ok(None);
            }
        }
        if let Some(cap) = &self.cap {
            if cap.used.fetch_add(1, Ordering::AcqRel) >= cap.max {
                cap.used.fetch_sub(1, Ordering::AcqRel);
                // A shut-down timer says so, full or not: `Full` invites a retry.
                if self.stopping.load(Ordering::Acquire) {
                    return Err(ScheduleError::Shutdown(task));
                }
                return Err(ScheduleError::Full(task));
            }
        }
        match add(&self.wheel, deadline_ns, task) {
            Ok(added) => {
                if added.earliest {
                    self.parker.unpark();
                }
                Ok(Some(added.handle))
            }
            Err(e) => {
                if let Some(cap) = &self.cap {
                    cap.used.fetch_sub(1, Ordering::AcqRel);
                }
                match e {
                    AddError::Closed(task) => Err(ScheduleError::Shutdown(task)),
                    AddError::Expired(task) => {
                        self.dispatch_now(Job { task, deadline_ns })?;
                        Ok(None)
                    }
                }
            }
        }
    }

    /// [`SystemTimer::advance_if_due`]: advances the wheel for the reaper if it waits for help
    /// past a bucket that is due by now (see `help_at_ns`). One relaxed load when it does not
    /// (the line is written once per tick, so it stays shared in the callers' caches), a cheap
    /// clock reading when it does: `now` gives it, called only once help is wanted.
    #[inline]
    pub(crate) fn help(&self, now: impl FnOnce() -> u64) -> usize {
        let at = self.help_at_ns.load(Ordering::Relaxed);
        if at == u64::MAX || now() < at {
            return 0;
        }
        self.help_claimed(at)
    }

    #[cold]
    fn help_claimed(&self, at: u64) -> usize {
        if self
            .help_at_ns
            .compare_exchange(at, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return 0; // another caller (or the reaper, republishing) got there first
        }
        self.stats.helps.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now_ns();
        self.advance_to_ns_then(now, || {
            // The wheel lock is released; the tasks have not run yet (they may be slow): hand
            // the next bucket on to the next helper, and move the reaper's alarm past it. Unless
            // the reaper was unparked since this reading of the wheel (an add queued an earlier
            // bucket): it then publishes and sets its alarm itself, from a fresh reading.
            let epoch = self.parker.epoch();
            let next = self.wheel.next_expiration();
            // Nothing queued (`None`): the add that queues the next bucket finds it the earliest
            // and unparks the reaper. The alarm counts the sleep from a stamp taken before the
            // clock is read (in `sleep_for`), not from the rearm: this thread may be descheduled
            // before it gets the parker's lock.
            let stamp = self.parker.stamp();
            let timeout = next.and_then(|x| self.clock.sleep_for(x.saturating_add(self.grace_ns)));
            #[cfg(loom)]
            let stamp = stamp.at(next.map(|x| x.saturating_add(self.grace_ns)));
            self.parker.rearm(epoch, stamp, timeout, || {
                if let Some(x) = next {
                    self.help_at_ns.store(
                        x.saturating_add(crate::parker::HELP_MARGIN_NS),
                        Ordering::Release,
                    );
                }
            });
        })
    }

    /// Inline mode: true while tasks that were due when added wait for the next advance.
    pub(crate) fn has_ready(&self) -> bool {
        self.inline && matches!(&*self.dispatch.lock(), Dispatch::Inline(v) if !v.is_empty())
    }

    /// Dispatches a task that was already due when added.
    fn dispatch_now(&self, job: Job<T>) -> Result<(), ScheduleError<T>> {
        let mut d = self.dispatch.lock();
        match &mut *d {
            Dispatch::Executor(tx) => {
                self.stats.immediate.fetch_add(1, Ordering::Relaxed);
                self.stats.dispatched.fetch_add(1, Ordering::Release);
                self.channel.op();
                if let Err(e) = tx.send(vec![job]) {
                    // Receivers gone means the executors died; never drop a task silently.
                    self.stats.immediate.fetch_sub(1, Ordering::Relaxed);
                    self.stats.dispatched.fetch_sub(1, Ordering::Release);
                    let job = e.into_inner().pop().expect("one job sent");
                    return Err(ScheduleError::Shutdown(job.task));
                }
                self.idle_executors.release(1);
                Ok(())
            }
            Dispatch::Inline(ready) => {
                self.stats.immediate.fetch_add(1, Ordering::Relaxed);
                self.stats.dispatched.fetch_add(1, Ordering::Release);
                ready.push(job);
                drop(d);
                self.parker.unpark();
                Ok(())
            }
            Dispatch::Closed => Err(ScheduleError::Shutdown(job.task)),
        }
    }

    /// The wheel's count plus the dispatched tasks not yet started or handed back, read at one
    /// even value of `moving` (so a batch on its way from the wheel to `dispatched` is counted
    /// once, never missed). Waits out an advance's few locked microseconds at most.
    fn pending(&self) -> usize {
        let mut spins = 0u32;
        loop {
            let seq = self.moving.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let n = self.wheel.len() + self.stats.in_flight() as usize;
                fence(Ordering::Acquire);
                if self.moving.load(Ordering::Relaxed) == seq {
                    return n;
                }
            }
            spins += 1;
            if spins < 64 {
                crate::sync::hint::spin_loop();
            } else {
                crate::sync::thread_yield();
            }
        }
    }

    /// Advances the wheel to `now_ns`, dispatching what is due. Returns how many tasks.
    pub(crate) fn advance_to_ns(&self, now_ns: u64) -> usize {
        self.advance_to_ns_then(now_ns, || {})
    }

    /// [`advance_to_ns`](Self::advance_to_ns), calling `unlocked` once the wheel's locks are
    /// released and before the tasks are dispatched (not if the wheel is closed).
    fn advance_to_ns_then(&self, now_ns: u64, unlocked: impl FnOnce()) -> usize {
        // Inline mode reuses the last advance's vector (executors keep theirs). A nested advance
        // (a task advancing the timer) finds it taken and starts a fresh one.
        let mut jobs = if self.inline {
            std::mem::take(&mut *self.spare_jobs.lock())
        } else {
            Vec::new()
        };
        let from_wheel;
        {
            let mut g = self.wheel.lock();
            if g.is_closed() {
                return 0;
            }
            // Odd from before the wheel's count drops until `dispatched` has risen (the seqlock
            // writer; the wheel lock makes it the only one).
            self.moving.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::Release);
            let hint = self.jobs_hint.load(Ordering::Relaxed);
            from_wheel = g.advance(now_ns, |f| {
                if jobs.capacity() == 0 {
                    jobs.reserve(hint);
                }
                jobs.push(Job {
                    task: f.value,
                    deadline_ns: f.deadline,
                })
            });
            self.jobs_hint.store(from_wheel, Ordering::Relaxed);
            if from_wheel > 0 {
                self.stats
                    .dispatched
                    .fetch_add(from_wheel as u64, Ordering::Release);
            }
            self.moving.fetch_add(1, Ordering::Release);
            if self.inline {
                if let Dispatch::Inline(ready) = &mut *self.dispatch.lock() {
                    jobs.append(ready);
                }
            }
            // Raised under the wheel lock: shutdown, which closes the wheel under that lock and
            // then waits for `running` to drop to zero, cannot miss these jobs.
            self.running.fetch_add(1, Ordering::AcqRel);
        }
        unlocked();
        if from_wheel > 0 {
            if let Some(cap) = &self.cap {
                cap.used.fetch_sub(from_wheel, Ordering::AcqRel);
            }
        }
        let n = jobs.len();
        if n > 0 {
            self.deliver(jobs);
        } else if self.inline {
            self.keep_spare(jobs);
        }
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Pairs with the fence in `wait_idle`: this decrement and shutdown's `stopping`
            // swap are stores to different atomics, each followed by a load of the other's.
            // Acquire and release alone let both loads read the old values (the C++ model's
            // store buffering; a loom model of a parking `wait_idle` found it): this advance
            // then skipped its unpark and `wait_idle` slept out its timeout. With a SeqCst
            // fence on both sides, at least one load sees the other's store. Once per advance
            // that ends the last one in flight.
            fence(Ordering::SeqCst);
            if self.stopping.load(Ordering::Acquire) {
                self.parker.unpark();
            }
        }
        n
    }

    /// Hands jobs to their runner: runs them here (inline) or sends them to the executors.
    fn deliver(&self, jobs: Vec<Job<T>>) {
        if self.inline {
            // Marks this thread as running this timer's tasks under a raised `running`: a task
            // that shuts the timer down here must not wait for that count (see `shutdown`).
            #[cfg(not(loom))]
            let _runs = crate::reaper::RunsInline::enter(self.id);
            let mut jobs = jobs;
            // `run_job` catches the task's panics, so the drain runs to its end.
            for job in jobs.drain(..) {
                self.run_job(job);
            }
            self.keep_spare(jobs);
        } else {
            self.send_to_executors(jobs);
        }
    }

    /// Keeps an emptied job vector for the next inline advance, unless it is too large to hold
    /// on to or a larger one is kept already.
    fn keep_spare(&self, jobs: Vec<Job<T>>) {
        debug_assert!(jobs.is_empty());
        if jobs.capacity() <= SPARE_JOBS_MAX {
            let mut spare = self.spare_jobs.lock();
            if spare.capacity() < jobs.capacity() {
                *spare = jobs;
            }
        }
    }

    /// Sends jobs to the executor threads, in one batch per executor.
    fn send_to_executors(&self, jobs: Vec<Job<T>>) {
        let sent = match &*self.dispatch.lock() {
            Dispatch::Executor(tx) => split(jobs, self.executors)
                .into_iter()
                .map(|batch| {
                    self.channel.op();
                    tx.send(batch).map_err(|e| self.hand_back(e.into_inner()))
                })
                .filter(Result::is_ok)
                .count(),
            // Unreachable while `running` is raised (shutdown waits for it), but never lose a
            // task: hand it back.
            _ => {
                self.hand_back(jobs);
                0
            }
        };
        // One permit per batch, so that as many idle executors wake.
        self.idle_executors.release(sent);
    }

    /// Keeps jobs that could not be dispatched for shutdown to return.
    fn hand_back(&self, jobs: Vec<Job<T>>) {
        self.stats
            .returned
            .fetch_add(jobs.len() as u64, Ordering::Release);
        self.returned
            .lock()
            .extend(jobs.into_iter().map(|j| j.task));
    }

    /// Runs one job: records its lateness, catches and counts a panic.
    pub(crate) fn run_job(&self, job: Job<T>) {
        // The cheap reading (at most about 13 µs high): a statistic, not a decision.
        let late = self
            .clock
            .deadline_base_ns()
            .saturating_sub(job.deadline_ns);
        self.stats.lateness.record(late);
        self.stats.started.fetch_add(1, Ordering::Release);
        let task = job.task;
        if let Err(payload) = catch_unwind(AssertUnwindSafe(move || task.run())) {
            self.stats.panicked.fetch_add(1, Ordering::Relaxed);
            // The payload's own drop may panic too (`panic_any` of a value whose `Drop`
            // panics): that must not escape either, or it would unwind through the advance
            // (leaving `running` raised, so shutdown would wait for ever) and lose the rest of
            // the batch.
            drop_payload(payload);
        }
    }

    /// One turn of the reaper's loop: `None` once `stopping` is set (the reaper returns);
    /// otherwise advances the wheel if a bucket is due (or, in inline mode, a task waits), or
    /// sleeps until the earliest bucket is due or an `unpark` comes (an add that queued an
    /// earlier bucket, a task due at add time, a shutdown, a moved manual clock). `Some(n)`: the
    /// tasks this turn dispatched.
    ///
    /// A panic in the turn itself (the clock is user code: [`Clock::now_ns`] and
    /// [`Clock::sleep_for`] run here; or a bug of ours in the advance) does not end the reaper, which alone expires the tasks
    /// (Kafka's reaper thread dies on any throwable): it is counted
    /// ([`TimerStats::reaper_panics`]), and the reaper sleeps for
    /// [`REAPER_PANIC_BACKOFF`] (an `unpark` ends the sleep early: an add, a shutdown) before
    /// it tries again, so a clock that keeps panicking costs a try per backoff, not a spin.
    ///
    /// [`Clock::now_ns`]: crate::Clock::now_ns
    /// [`Clock::sleep_for`]: crate::Clock::sleep_for
    /// [`TimerStats::reaper_panics`]: crate::TimerStats::reaper_panics
    pub(crate) fn reaper_step(&self) -> Option<usize> {
        match catch_unwind(AssertUnwindSafe(|| self.reaper_turn())) {
            Ok(step) => step,
            Err(payload) => {
                self.stats.reaper_panics.fetch_add(1, Ordering::Relaxed);
                drop_payload(payload);
                self.parker.park(Some(REAPER_PANIC_BACKOFF));
                Some(0)
            }
        }
    }

    /// [`reaper_step`](Self::reaper_step)'s turn, panics not caught.
    fn reaper_turn(&self) -> Option<usize> {
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let now = self.clock.now_ns();
        let next = self.wheel.next_expiration();
        if next.is_some_and(|x| x <= now) || self.has_ready() {
            // advance_to_ns never lets a task panic escape (run_job catches it); the turn's guard
            // (`reaper_step`) keeps the reaper alive even if our own code had a bug.
            return Some(self.advance_to_ns(now));
        }
        // The alarm's reading before the clock's reading in `sleep_for`: the sleep computed
        // from the second counts from the first (never later than it should). Taken only on
        // the way to sleep, not on each advance.
        let stamp = self.parker.stamp();
        let timeout = match next {
            // Callers that run anyway may advance the wheel for us once `x` has passed
            // (`advance_if_due`); our own alarm is the fallback, `grace` later, and each of their
            // advances moves it past the next bucket (`rearm`).
            Some(x) if self.grace_ns > 0 => {
                self.help_at_ns.store(
                    x.saturating_add(crate::parker::HELP_MARGIN_NS),
                    Ordering::Release,
                );
                self.clock.sleep_for(x.saturating_add(self.grace_ns))
            }
            Some(x) => self.clock.sleep_for(x),
            None => {
                // Nothing queued: no help wanted (a stale time would make the next caller
                // claim an empty advance) until an add queues a bucket and unparks us.
                if self.grace_ns > 0 {
                    self.help_at_ns.store(u64::MAX, Ordering::Release);
                }
                None
            }
        };
        #[cfg(loom)]
        let stamp = stamp.at(next.map(|x| {
            if self.grace_ns > 0 {
                x.saturating_add(self.grace_ns)
            } else {
                x
            }
        }));
        // Counted only after a real sleep: a pending unpark (a bucket queued while it advanced)
        // or a zero timeout returns at once, which is no wake-up.
        if self.parker.park_reaper(stamp, timeout) {
            self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        }
        Some(0)
    }

    /// The rest of [`SystemTimer::shutdown`], once `stopping` is set: joins the reaper, closes
    /// the wheel, waits for advances in flight, closes the dispatch, joins the executors, and
    /// returns every task that neither ran nor was cancelled.
    pub(crate) fn finish_shutdown(&self, mut threads: crate::reaper::Threads) -> Vec<T> {
        // Step 1: wake the reaper (it sees `stopping` and returns) and join it.
        self.parker.unpark();
        threads.join_reaper();
        let mut out = Vec::new();
        self.close_wheel(&mut out);
        self.wait_idle();
        self.close_dispatch(&mut out);
        threads.join_executors(self);
        out.append(&mut self.returned.lock());
        self.finished.set();
        out
    }

    /// Shutdown's step 2: closes the wheel (later adds fail with
    /// [`ScheduleError::Shutdown`]) and hands its entries back into `out`, with their cap slots.
    pub(crate) fn close_wheel(&self, out: &mut Vec<T>) {
        let closed = self.wheel.lock().close(|f| out.push(f.value));
        // The wheel's entries held the cap's slots: give them back with the entries.
        if let Some(cap) = &self.cap {
            cap.used.fetch_sub(closed, Ordering::AcqRel);
        }
    }

    /// Shutdown's step 4: closes `dispatch`, handing the inline ready list back into `out` and
    /// dropping the executors' channel sender (after the lock is released).
    pub(crate) fn close_dispatch(&self, out: &mut Vec<T>) {
        let closed = std::mem::replace(&mut *self.dispatch.lock(), Dispatch::Closed);
        match closed {
            Dispatch::Inline(jobs) => {
                self.stats
                    .returned
                    .fetch_add(jobs.len() as u64, Ordering::Release);
                out.extend(jobs.into_iter().map(|j| j.task));
            }
            Dispatch::Executor(tx) => {
                self.channel.op();
                drop(tx);
            }
            Dispatch::Closed => {}
        }
    }

    /// Waits until no advance is between taking tasks out of the wheel and dispatching them.
    /// `stopping` is set (the caller's shutdown set it): an advance that brings `running` to
    /// zero after this reads it wakes this thread (the fences: see the end of `advance_to_ns_then`).
    /// The timeout is a second line only (under loom a timed wait never times out, so the
    /// models check the wake-up).
    fn wait_idle(&self) {
        fence(Ordering::SeqCst);
        while self.running.load(Ordering::Acquire) != 0 {
            let _ = self.parker.park(Some(Duration::from_millis(1)));
        }
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::disallowed_types)] // tests use std's locks freely
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Mutex as StdMutex};
    use std::time::Duration;

    use crate::{ManualClock, SystemTimer};

    /// A timer on `clock`, no reaper, tasks run by whoever advances it.
    pub(crate) fn inline_manual(clock: &ManualClock) -> SystemTimer {
        SystemTimer::builder()
            .clock(clock.clone())
            .reaper(false)
            .inline()
            .build()
    }

    /// An inline timer keeps its emptied job vector between advances: the second batch runs
    /// through the same allocation (no malloc per advance).
    #[test]
    fn inline_advances_reuse_one_job_vector() {
        let clock = ManualClock::new(0);
        let timer = inline_manual(&clock);
        let ran = Arc::new(AtomicUsize::new(0));
        let batch = |at_ms: u64| {
            for _ in 0..100 {
                let r = ran.clone();
                timer
                    .add(Duration::from_millis(at_ms), move || {
                        r.fetch_add(1, SeqCst);
                    })
                    .unwrap();
            }
        };
        batch(5);
        clock.advance(Duration::from_millis(5));
        assert_eq!(timer.advance(), 100);
        let (cap, ptr) = {
            let spare = timer.inner.spare_jobs.lock();
            assert!(spare.is_empty());
            (spare.capacity(), spare.as_ptr())
        };
        assert!(cap >= 100, "capacity {cap}");
        batch(5);
        clock.advance(Duration::from_millis(5));
        assert_eq!(timer.advance(), 100);
        let spare = timer.inner.spare_jobs.lock();
        assert_eq!((spare.capacity(), spare.as_ptr()), (cap, ptr));
        drop(spare);
        assert_eq!(ran.load(SeqCst), 200);
    }

    /// `check_invariants`, the oracle of the model, loom and stress suites, panics when the task
    /// accounting does not reconcile (here: a task counted as scheduled that is nowhere).
    ///
    /// Catches: `check_invariants` emptied (every suite that relies on it would pass vacuously).
    #[test]
    fn check_invariants_panics_when_the_accounting_does_not_reconcile() {
        let clock = ManualClock::new(0);
        let timer = inline_manual(&clock);
        timer.add(Duration::from_millis(5), || ()).unwrap();
        timer.check_invariants();
        timer.inner.stats.immediate.fetch_add(1, SeqCst);
        let checked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer.check_invariants()));
        assert!(
            checked.is_err(),
            "a scheduled task that is nowhere went unnoticed"
        );
    }

    /// A caller's help is due from the published `help_at_ns` on, that time included: a reading
    /// one nanosecond before it leaves the publication alone, a reading equal to it claims it
    /// (one caller advance, the publication taken).
    ///
    /// Catches: `now() < at` in `help` turned into `now() <= at` (help a nanosecond late).
    #[test]
    fn a_caller_helps_from_the_published_time_on_inclusive() {
        let clock = ManualClock::new(0);
        let timer = inline_manual(&clock);
        let at = 5_000_000 + crate::parker::HELP_MARGIN_NS;
        // Published by hand: this timer has no reaper to do it.
        timer.inner.help_at_ns.store(at, SeqCst);
        assert_eq!(timer.advance_if_due_at(Duration::from_nanos(at - 1)), 0);
        assert_eq!(timer.stats().caller_advances, 0, "helped before the time");
        assert_eq!(timer.inner.help_at_ns.load(SeqCst), at, "claimed early");
        timer.advance_if_due_at(Duration::from_nanos(at));
        assert_eq!(timer.stats().caller_advances, 1, "no help at the time");
        assert_eq!(timer.inner.help_at_ns.load(SeqCst), u64::MAX, "not claimed");
    }

    /// With a grace, a reaper that finds nothing queued withdraws its call for help
    /// (`help_at_ns` back to `u64::MAX`): once it has run the only task itself, a caller of
    /// `advance_if_due` finds nothing to claim, and no caller advance is counted.
    ///
    /// Catches: the reaper's `grace_ns > 0` test before that withdrawal mutated to `==` or `<`
    /// (the stale time stays published, and the next caller claims an empty advance).
    #[test]
    #[allow(clippy::disallowed_methods)] // hang timeouts on the real clock
    fn a_reaper_with_nothing_queued_withdraws_its_call_for_help() {
        let clock = ManualClock::new(0);
        let timer = SystemTimer::builder()
            .clock(clock.clone())
            .reaper_grace(Duration::from_millis(2))
            .inline()
            .build();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        timer
            .add(Duration::from_millis(5), move || {
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        let help_at = || timer.inner.help_at_ns.load(SeqCst);
        let published = 5_000_000 + crate::parker::HELP_MARGIN_NS;
        let t0 = std::time::Instant::now();
        while help_at() != published {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the reaper never published"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The move wakes the reaper, which runs the task itself and finds nothing queued.
        clock.advance(Duration::from_millis(10));
        let t0 = std::time::Instant::now();
        while ran.load(SeqCst) == 0 || help_at() != u64::MAX {
            // A hang limit only (a loaded machine may not schedule the reaper for a while);
            // the assertions below say what went wrong.
            if t0.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ran.load(SeqCst), 1, "the reaper never ran the task");
        assert_eq!(timer.advance_if_due_at(timer.now()), 0);
        assert_eq!(
            timer.stats().caller_advances,
            0,
            "a caller claimed an advance with nothing queued"
        );
    }

    /// The `Debug` of a timer's threads says whether it has a reaper and how many executors;
    /// after shutdown (which takes them to join them), neither.
    ///
    /// Catches: `Debug for Threads` emptied (writing nothing).
    #[test]
    fn the_threads_debug_shows_the_reaper_and_the_executor_count() {
        let clock = ManualClock::new(0);
        let timer = SystemTimer::builder()
            .clock(clock.clone())
            .executor_threads(2)
            .build();
        let threads = || format!("{:?}", *timer.threads.lock());
        assert_eq!(threads(), "Threads { reaper: true, executors: 2 }");
        assert!(timer.shutdown().is_empty());
        assert_eq!(threads(), "Threads { reaper: false, executors: 0 }");
    }

    /// Timers built after 2³² − 1 others: before, their 32-bit id wrapped to 0 ("no timer"), the
    /// timer then took every thread for one of its own, and its `shutdown` handed back nothing
    /// (it dropped the tasks on a thread of its own, as if called from a task); and its keys
    /// matched those of the timer with id 1 (built first, alive here).
    #[test]
    fn timers_past_two_to_the_32_builds_keep_distinct_ids_and_hand_back_their_tasks() {
        let clock = ManualClock::new(0);
        let first = inline_manual(&clock);
        let first_key = first.add_keyed(Duration::from_secs(60), || ()).unwrap();
        // Jump the process's count (never backwards: other tests build timers meanwhile).
        crate::handle::NEXT_TIMER_ID
            .fetch_max(u64::from(u32::MAX), std::sync::atomic::Ordering::Relaxed);
        let late: Vec<_> = (0..3).map(|_| inline_manual(&clock)).collect();
        let mut ids: Vec<_> = late.iter().map(|t| t.inner.id).collect();
        ids.push(first.inner.id);
        ids.sort_unstable_by_key(|id| format!("{id:?}"));
        ids.dedup();
        assert_eq!(ids.len(), 4, "distinct ids");
        for timer in &late {
            let key = timer.add_keyed(Duration::from_secs(60), || ()).unwrap();
            // A key of the first timer (same entry position in a fresh wheel) is not this one's.
            assert!(!timer.cancel(first_key));
            assert!(timer.is_pending(key));
            assert_eq!(timer.shutdown().len(), 1, "the pending task is handed back");
        }
        assert_eq!(first.shutdown().len(), 1);
    }

    /// A task that advances the same timer (the nested advance finds the vector taken and uses
    /// its own): every task runs exactly once, and the larger vector is kept.
    #[test]
    fn a_nested_inline_advance_runs_everything_once() {
        let clock = ManualClock::new(0);
        let timer = Arc::new(inline_manual(&clock));
        let runs = Arc::new(StdMutex::new(Vec::new()));
        for id in 0..10u32 {
            let r = runs.clone();
            timer
                .add(Duration::from_millis(1), move || r.lock().unwrap().push(id))
                .unwrap();
        }
        // The outer advance takes everything due at once, so the nested advance's work must be
        // added from inside the task.
        let (t, r) = (Arc::downgrade(&timer), runs.clone());
        timer
            .add(Duration::from_millis(1), move || {
                let timer = t.upgrade().unwrap();
                for id in 100..150u32 {
                    let r = r.clone();
                    // Due at once (the wheel's time is 1 ms): waits in the ready list for the
                    // next advance, which this task makes itself.
                    timer
                        .add(Duration::ZERO, move || r.lock().unwrap().push(id))
                        .unwrap();
                }
                assert_eq!(timer.advance(), 50);
            })
            .unwrap();
        clock.advance(Duration::from_millis(1));
        assert_eq!(timer.advance(), 11);
        let mut got = runs.lock().unwrap().clone();
        got.sort_unstable();
        let want: Vec<u32> = (0..10).chain(100..150).collect();
        assert_eq!(got, want);
        assert!(timer.inner.spare_jobs.lock().capacity() >= 50);
        assert_eq!(timer.advance(), 0);
    }
}
