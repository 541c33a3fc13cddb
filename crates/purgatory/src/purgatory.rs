//! [`Purgatory`] and its [`Builder`].

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::Duration;

use system_timer::{Clock, ScheduleError, SystemTimer, Task};

use crate::error::WatchError;
use crate::operation::{
    Common, CommonRefs, DelayedOperation, OpCell, OpState, OperationHandle, Purger,
};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, MutexGuard};
use crate::watchers::{Entry, WatchMap, NO_ARG};

/// A check sweeps its key once the completed entries it saw are at least `1 / SWEEP_FRACTION` of
/// the list (see [`Purgatory::check_and_complete`]).
const SWEEP_FRACTION: usize = 16;

/// Kafka's default purge interval (`*.purgatory.purge.interval.requests`).
pub const DEFAULT_PURGE_INTERVAL: usize = 1000;
/// Kafka's shard count (KAFKA-6431).
pub const DEFAULT_SHARDS: usize = 512;

/// The most watch-map shards a purgatory takes ([`Builder::shards`] caps its count here).
pub const MAX_SHARDS: usize = 1 << 16;
/// The own timer's reaper grace by default: none (the reaper alone expires operations, at each
/// bucket's time, as Kafka's does). See [`Builder::reaper_grace`].
pub const DEFAULT_REAPER_GRACE: Duration = Duration::ZERO;
/// A reaper grace for busy purgatories (two of the own timer's 1 ms ticks): see
/// [`Builder::reaper_grace`]. The W4 load generator uses it.
pub const BUSY_REAPER_GRACE: Duration = Duration::from_millis(2);

/// What [`Purgatory::try_complete_else_watch`] did with an operation it accepted.
pub struct Watched<Op> {
    /// True if this call completed the operation (ready at the first or second try); false if
    /// it is now watched and timed (another thread may have completed it since).
    pub completed: bool,
    /// A handle to force-complete it or ask whether it completed.
    pub handle: OperationHandle<Op>,
}

impl<Op> fmt::Debug for Watched<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("completed", &self.completed)
            .field("handle", &self.handle)
            .finish()
    }
}

/// A snapshot of a purgatory's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgatoryStats {
    /// Operations accepted by `try_complete_else_watch`.
    pub accepted: u64,
    /// Operations completed, by any path (expiries included).
    pub completed: u64,
    /// Operations completed by expiry.
    pub expired: u64,
    /// Operations handed back without completing: by shutdown, refused mid-watch by a
    /// shutdown or by a full shared timer ([`WatchError::Full`]),
    /// taken back through their handle ([`OperationHandle::take`]), or dropped because
    /// something panicked while [`Purgatory::try_complete_else_watch`] entered them (their
    /// `try_complete`, a key's `Clone`, `Hash` or `Eq`, the timer's clock), or dropped with
    /// the last handle [`Purgatory::cancel_for_key`] returned while no other key watched them.
    ///
    /// [`OperationHandle::take`]: crate::OperationHandle::take
    pub handed_back: u64,
    /// Operations armed in the timer and not completed ([`Purgatory::delayed`]).
    pub delayed: u64,
    /// Purges run.
    pub purges: u64,
    /// Entries in watch lists, completed ones not yet swept included ([`Purgatory::watched`]).
    pub watched: u64,
    /// Keys with a watch list.
    pub keys: u64,
}

struct Inner<K, Op, T> {
    name: String,
    watchers: Arc<WatchMap<K, Op>>,
    ready_test: Option<T>,
    own_timer: bool,
    /// The timer (`common.timer`) and the counters, shared with every operation (each cell
    /// reaches it through `refs`).
    common: Arc<Common>,
    /// What each new cell holds to reach `common` (one reference count per stripe).
    refs: CommonRefs,
    /// Set by shutdown: later watches are refused.
    closed: AtomicBool,
}

/// Kafka's `DelayedOperationPurgatory`: operations that cannot complete yet wait here, watched by
/// keys. A check on a key ([`check_and_complete`](Self::check_and_complete)) completes those that
/// are ready; the timer expires the rest. Each operation completes exactly once, whichever way.
///
/// # Invariants
///
/// * `on_complete` runs exactly once per accepted operation that is not handed back (see
///   [`PurgatoryStats::handed_back`]: one whose handles from
///   [`cancel_for_key`](Self::cancel_for_key) are all dropped while no other key watches it is
///   dropped without completing, and counted there);
///   `on_expiration` only when expiry won, right after `on_complete`.
/// * `try_complete`, `on_complete` and `on_expiration` of one operation never overlap (all run
///   under its lock), and `try_complete` is never called after completion.
/// * No user code runs under a watch-map or timer lock, but for drops: a sweep may drop a key
///   and the last reference to a completed operation's cell (whose operation is gone already:
///   only its [`ReadyHint`](crate::ReadyHint) closure is left to drop) under a watch-map shard
///   lock. Such a drop must not call back into the purgatory.
/// * A completed operation is dropped at once; its empty cell leaves each watch list at the next
///   check of that key that finds enough completed entries, or at the count-triggered purge.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use purgatory::{DelayedOperation, Purgatory};
///
/// struct WaitForFlag(Arc<AtomicBool>, Arc<AtomicBool>);
/// impl DelayedOperation for WaitForFlag {
///     fn try_complete(&mut self) -> bool { self.0.load(Ordering::SeqCst) }
///     fn on_complete(&mut self) { self.1.store(true, Ordering::SeqCst) }
/// }
///
/// let purgatory = Purgatory::builder().name("demo").build();
/// let (flag, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
/// let op = WaitForFlag(flag.clone(), done.clone());
/// let w = purgatory.try_complete_else_watch(op, Duration::from_secs(30), &["partition-0"])?;
/// assert!(!w.completed);
/// flag.store(true, Ordering::SeqCst);
/// assert_eq!(purgatory.check_and_complete(&"partition-0"), 1);
/// assert!(done.load(Ordering::SeqCst) && w.handle.is_completed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Purgatory<K, Op, T = DynReadyTest<K>>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
    T: ReadyTest<K>,
{
    inner: Arc<Inner<K, Op, T>>,
}

/// Configures a [`Purgatory`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder<K, Op, T = DynReadyTest<K>> {
    name: String,
    timer: Option<Arc<SystemTimer>>,
    /// `Send + Sync` (a `Clock` is), so that the builder is too.
    clock: Option<Box<dyn FnOnce(system_timer::Builder) -> system_timer::Builder + Send + Sync>>,
    reaper: bool,
    reaper_grace: Duration,
    expiry_threads: usize,
    purge_interval: usize,
    shards: usize,
    ready_test: Option<T>,
    _types: PhantomData<fn(K, Op)>,
}

/// A purgatory's ready test: a lock-free pre-test a check asks about each watcher before it
/// reads the operation (see [`Builder::ready_test`] for the contract).
///
/// A purgatory's third type parameter. The default, [`DynReadyTest`], holds any closure behind
/// a pointer ([`Builder::ready_test`]): a check then makes one indirect call per watcher it
/// tests. A type of one's own ([`Builder::with_ready_test`]) is called directly, and its body
/// can be inlined into the check's scan: for purgatories whose checks scan long lists of
/// operations the test rules out, where that call is most of each visit. Every
/// `Fn(&K, u64) -> bool + Send + Sync + 'static` is one.
pub trait ReadyTest<K>: Send + Sync + 'static {
    /// False only if the operation that gave `arg` ([`DelayedOperation::ready_arg`]) and watches
    /// `key` cannot be ready: its `try_complete` would return false, given everything that
    /// happened before the check began. Runs concurrently with anything, and must not block.
    fn maybe_ready(&self, key: &K, arg: u64) -> bool;
}

impl<K, F> ReadyTest<K> for F
where
    F: Fn(&K, u64) -> bool + Send + Sync + 'static,
{
    #[inline]
    fn maybe_ready(&self, key: &K, arg: u64) -> bool {
        self(key, arg)
    }
}

/// The default [`ReadyTest`] of a [`Purgatory`]: any closure, behind a shared pointer (what
/// [`Builder::ready_test`] sets). `std`'s `Arc` even under loom: immutable shared data, not part
/// of any protocol a model checks.
pub struct DynReadyTest<K>(std::sync::Arc<ReadyTestFn<K>>);

/// The closure behind a [`DynReadyTest`].
type ReadyTestFn<K> = dyn Fn(&K, u64) -> bool + Send + Sync;

impl<K: 'static> ReadyTest<K> for DynReadyTest<K> {
    #[inline]
    fn maybe_ready(&self, key: &K, arg: u64) -> bool {
        (self.0)(key, arg)
    }
}

impl<K> Clone for DynReadyTest<K> {
    fn clone(&self) -> Self {
        DynReadyTest(std::sync::Arc::clone(&self.0))
    }
}

impl<K> fmt::Debug for DynReadyTest<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DynReadyTest")
    }
}

// ===== impl Builder =====

impl<K, Op> Builder<K, Op>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
{
    /// Defaults: name `"purgatory"`, an own timer with Kafka's settings (tick 1 ms, wheel 20) whose
    /// reaper thread also runs the expiries (see [`expiry_threads`](Self::expiry_threads); for a
    /// busy purgatory, see [`reaper_grace`](Self::reaper_grace)), purge interval 1000, 512
    /// shards, no ready test.
    pub fn new() -> Self {
        Builder {
            name: "purgatory".into(),
            timer: None,
            clock: None,
            reaper: true,
            reaper_grace: DEFAULT_REAPER_GRACE,
            expiry_threads: 0,
            purge_interval: DEFAULT_PURGE_INTERVAL,
            shards: DEFAULT_SHARDS,
            ready_test: None,
            _types: PhantomData,
        }
    }

    /// A lock-free pre-test for checks, asked per watcher with the key being checked and the
    /// argument the operation gave ([`DelayedOperation::ready_arg`]): when it returns false the
    /// check skips the operation without reading it (the argument sits in the watch list
    /// beside it). It suits purgatories whose operations each wait for one key's state to
    /// pass a threshold: a delayed produce (key: a partition; argument: the offset it needs
    /// the partition's high watermark to reach). Operations without an argument (or with
    /// `u64::MAX`, which means the same) are not tested. Default: none.
    ///
    /// The contract is a [`ReadyHint`](crate::ReadyHint)'s: return false only when
    /// `try_complete` would return false, given everything that happened before the
    /// [`check_and_complete`](Purgatory::check_and_complete) call; it runs concurrently with
    /// anything (also for operations already completed) and must not block. A check cannot
    /// tell a completed operation the test rules out from a pending one, so such entries wait
    /// for the purge ([`purge_interval`](Self::purge_interval)) to be swept, not for the
    /// check.
    ///
    /// ```
    /// use purgatory::{DelayedOperation, Purgatory};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// struct DelayedProduce { offset: u64, hw: Arc<AtomicU64> }
    /// impl DelayedOperation for DelayedProduce {
    ///     fn try_complete(&mut self) -> bool { self.hw.load(Ordering::Acquire) > self.offset }
    ///     fn on_complete(&mut self) {}
    ///     fn ready_arg(&self) -> Option<u64> { Some(self.offset) }
    /// }
    ///
    /// let hw = Arc::new(AtomicU64::new(0)); // partition 7's high watermark
    /// let p: Purgatory<u32, DelayedProduce> = Purgatory::builder()
    ///     .reaper(false)
    ///     .ready_test({
    ///         let hw = Arc::clone(&hw);
    ///         move |_partition: &u32, offset| hw.load(Ordering::Acquire) > offset
    ///     })
    ///     .build();
    /// for offset in 0..100 {
    ///     let op = DelayedProduce { offset, hw: hw.clone() };
    ///     p.try_complete_else_watch(op, Duration::from_secs(30), &[7])?;
    /// }
    /// hw.store(10, Ordering::Release);
    /// // Ten are ready; the other ninety are skipped without reading them.
    /// assert_eq!(p.check_and_complete(&7), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ready_test(mut self, test: impl Fn(&K, u64) -> bool + Send + Sync + 'static) -> Self {
        self.ready_test = Some(DynReadyTest(std::sync::Arc::new(test)));
        self
    }
}

impl<K, Op, T> Builder<K, Op, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
    T: ReadyTest<K>,
{
    /// The purgatory's name (its own timer's threads are named after it).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// Use a timer shared with other users instead of an own one. The purgatory never shuts a
    /// shared timer down; at its own shutdown it disarms its operations' entries.
    ///
    /// A shared timer without a reaper must go on being advanced (or be shut down) by its
    /// owner: an expiry that was already due when its operation was armed (a zero timeout)
    /// waits among the timer's due tasks, which a disarm cannot reach, and it holds the
    /// operation's cell, which holds the timer. Such a timer, dropped by everyone without a
    /// shutdown and never advanced again, is never freed. (With a reaper, such an expiry may
    /// hold the timer's last reference when it runs: the timer then shuts down on a thread of
    /// its own once the expiry returns; see [`SystemTimer::shutdown`].)
    ///
    /// The timer must outlive this purgatory's use of it: if its owner shuts it down first
    /// (another purgatory's own timer, taken from [`Purgatory::timer`], is shut down with that
    /// purgatory), this purgatory's armed operations never expire; they stay in
    /// [`delayed`](Purgatory::delayed) until completed, or until its own shutdown hands them back.
    /// New operations that must wait are then refused ([`WatchError::Shutdown`]); one ready at
    /// its first or second try is still accepted and completed, as it needs no timer
    /// ([`Purgatory::is_shutdown`] stays false). The empty cells refused operations leave in
    /// their keys' lists are purged on the calling threads, as the timer can no longer run a
    /// purge.
    pub fn timer(mut self, timer: Arc<SystemTimer>) -> Self {
        self.timer = Some(timer);
        self
    }

    /// The clock of the purgatory's own timer (default: the system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Box::new(move |b| b.clock(clock)));
        self
    }

    /// Whether the own timer runs a reaper thread (default true). Without one, drive the
    /// purgatory with [`Purgatory::advance`]: expiries (and purges) then run on the caller's
    /// thread.
    pub fn reaper(mut self, on: bool) -> Self {
        self.reaper = on;
        self
    }

    /// The own timer's reaper grace (default zero; [`BUSY_REAPER_GRACE`], 2 ms, suits a busy
    /// purgatory; see [`system_timer::Builder::reaper_grace`]). With a grace, while operations
    /// keep arriving, the first `try_complete_else_watch` after a timer bucket is due advances the
    /// timer itself (one whose operation completes at the first try, before any watch, returns
    /// without looking), and the reaper sleeps through instead of waking every tick: a thread
    /// wake-up per tick saved, which on a virtual machine costs more CPU than the advance. With no
    /// new operations the reaper's own timer fires this much later than the bucket. So an
    /// operation never expires before its timeout, and at most one tick plus this grace after it
    /// (Kafka's reaper: up to a tick early or late).
    ///
    /// The price: the expiries of that bucket then run on the calling thread (in the own
    /// timer's inline mode; with [`expiry_threads`](Self::expiry_threads) they are sent there),
    /// after `try_complete_else_watch` has released every lock of its own; so no caller may hold
    /// a lock that an operation's callbacks take. Zero (the default): the reaper alone expires
    /// operations, at each bucket's time. A shared timer keeps its own setting (the purgatory
    /// helps any timer built with a grace).
    pub fn reaper_grace(mut self, grace: Duration) -> Self {
        self.reaper_grace = grace;
        self
    }

    /// Threads of the own timer that run expiries (`on_complete` and `on_expiration` of the
    /// operations whose timeout won). Default 0: the reaper runs them itself, right after it
    /// advances the wheel (no hand-off to another thread, one wake-up per tick instead of two).
    /// That suits callbacks that only hand a response on, as Kafka's do; give slow callbacks
    /// threads of their own (Kafka's purgatory timer uses one executor thread) so that they
    /// cannot delay later expiries. At most
    /// [`MAX_EXECUTOR_THREADS`](system_timer::MAX_EXECUTOR_THREADS), or
    /// [`try_build`](Self::try_build) refuses it. Ignored (never refused) where the own timer
    /// does not use them: without a [`reaper`](Self::reaper) (expiries then run on the thread
    /// that advances), or with a shared [`timer`](Self::timer).
    pub fn expiry_threads(mut self, n: usize) -> Self {
        self.expiry_threads = n;
        self
    }

    /// Sweep the watch lists after this many watched operations completed (default 1000,
    /// Kafka's `purgatory.purge.interval.requests`). While no key is checked (operations
    /// completed only by force or expiry), the sweep also waits until as many completed as are
    /// still delayed: it visits every entry, so this keeps its cost at most two entry visits per
    /// entry removed however many operations wait (Kafka walks them all every interval), and
    /// holds the empty cells awaiting it to `max(n, delayed operations)`: each cell's operation
    /// was dropped at completion (everything it owned is freed), the cell keeps its own
    /// allocation, `size_of::<Op>()` plus about 80 to 90 bytes for an operation aligned to at
    /// most 8 bytes (88 for one the size of a `u64`; more for an over-aligned one), and its
    /// [`ReadyHint`](crate::ReadyHint)'s closure, if it has one, until swept. The completions
    /// are counted per thread and added up in batches, so up to half an interval more cells
    /// may wait before the purge is scheduled. Checks walk the
    /// empty cells of their key too, so while keys are checked the interval alone decides, as in
    /// Kafka.
    pub fn purge_interval(mut self, n: usize) -> Self {
        self.purge_interval = n.max(1);
        self
    }

    /// Watch-map shards (default 512; rounded up to a power of two, at least 2 and at most
    /// [`MAX_SHARDS`]).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n.clamp(1, MAX_SHARDS);
        self
    }

    /// The same as [`ready_test`](Builder::ready_test), with a test of a type of one's own: the
    /// purgatory's third type parameter, called directly by a check (its body inlined into the
    /// scan) instead of through a pointer. Worth it where checks scan long lists of operations
    /// the test rules out (in W4's `watch` model the call was about a tenth of the run). The
    /// contract is [`ready_test`](Builder::ready_test)'s.
    ///
    /// ```
    /// use purgatory::{DelayedOperation, Purgatory, ReadyTest};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// struct DelayedProduce { offset: u64, hw: Arc<AtomicU64> }
    /// impl DelayedOperation for DelayedProduce {
    ///     fn try_complete(&mut self) -> bool { self.hw.load(Ordering::Acquire) > self.offset }
    ///     fn on_complete(&mut self) {}
    ///     fn ready_arg(&self) -> Option<u64> { Some(self.offset) }
    /// }
    ///
    /// /// Partition 7's high watermark against the offset a produce waits for.
    /// struct HighWatermark(Arc<AtomicU64>);
    /// impl ReadyTest<u32> for HighWatermark {
    ///     fn maybe_ready(&self, _partition: &u32, offset: u64) -> bool {
    ///         self.0.load(Ordering::Acquire) > offset
    ///     }
    /// }
    ///
    /// let hw = Arc::new(AtomicU64::new(0));
    /// let p: Purgatory<u32, DelayedProduce, HighWatermark> = Purgatory::builder()
    ///     .reaper(false)
    ///     .with_ready_test(HighWatermark(Arc::clone(&hw)))
    ///     .build();
    /// for offset in 0..100 {
    ///     let op = DelayedProduce { offset, hw: hw.clone() };
    ///     p.try_complete_else_watch(op, Duration::from_secs(30), &[7])?;
    /// }
    /// hw.store(10, Ordering::Release);
    /// assert_eq!(p.check_and_complete(&7), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_ready_test<U: ReadyTest<K>>(self, test: U) -> Builder<K, Op, U> {
        Builder {
            name: self.name,
            timer: self.timer,
            clock: self.clock,
            reaper: self.reaper,
            reaper_grace: self.reaper_grace,
            expiry_threads: self.expiry_threads,
            purge_interval: self.purge_interval,
            shards: self.shards,
            ready_test: Some(test),
            _types: PhantomData,
        }
    }

    /// Builds the purgatory (and its own timer, unless one was given).
    ///
    /// # Panics
    ///
    /// Where [`try_build`](Self::try_build) returns an error, with the error's message.
    pub fn build(self) -> Purgatory<K, Op, T> {
        match self.try_build() {
            Ok(p) => p,
            Err(e) => panic!("could not build the purgatory: {e}"),
        }
    }

    /// Builds the purgatory (and its own timer, unless one was given).
    ///
    /// # Errors
    ///
    /// The own timer's [`BuildError`](system_timer::BuildError): more
    /// [`expiry_threads`](Self::expiry_threads) than a timer takes, or its threads could not be
    /// spawned (or the [`name`](Self::name), which they take, has a NUL byte). With a shared
    /// [`timer`](Self::timer) it cannot fail.
    pub fn try_build(self) -> Result<Purgatory<K, Op, T>, system_timer::BuildError> {
        let own_timer = self.timer.is_none();
        let timer = match self.timer {
            Some(timer) => timer,
            None => {
                let mut b = SystemTimer::builder()
                    .name(&self.name)
                    .reaper(self.reaper)
                    .reaper_grace(self.reaper_grace);
                b = match self.expiry_threads {
                    0 => b.inline(),
                    n => b.executor_threads(n),
                };
                if !self.reaper || cfg!(loom) {
                    b = b.reaper(false).inline();
                }
                if let Some(set_clock) = self.clock {
                    b = set_clock(b);
                }
                Arc::new(b.try_build()?)
            }
        };
        let watchers = Arc::new(WatchMap::new(self.shards));
        let sweep = Arc::clone(&watchers);
        let purger = Purger::new(move || sweep.purge());
        let common = Arc::new(Common::new(timer, self.purge_interval, purger));
        Ok(Purgatory {
            inner: Arc::new(Inner {
                name: self.name,
                watchers,
                ready_test: self.ready_test,
                own_timer,
                refs: CommonRefs::new(&common),
                common,
                closed: AtomicBool::new(false),
            }),
        })
    }
}

impl<K, Op> Default for Builder<K, Op>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, Op, T> fmt::Debug for Builder<K, Op, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("shared_timer", &self.timer.is_some())
            .field("reaper", &self.reaper)
            .field("reaper_grace", &self.reaper_grace)
            .field("expiry_threads", &self.expiry_threads)
            .field("purge_interval", &self.purge_interval)
            .field("shards", &self.shards)
            .field("ready_test", &self.ready_test.is_some())
            .finish()
    }
}

// ===== impl Purgatory =====

impl<K, Op> Purgatory<K, Op>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
{
    /// A [`Builder`] with Kafka's defaults.
    pub fn builder() -> Builder<K, Op> {
        Builder::new()
    }
}

impl<K, Op, T> Purgatory<K, Op, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
    T: ReadyTest<K>,
{
    /// Kafka's `tryCompleteElseWatch`: tries to complete `op` under its lock; if it is not ready,
    /// watches it on every key, tries once more under the same lock hold (so an event between
    /// the first try and the watch is not lost), and only if it is still not ready arms its
    /// timer for `timeout`. The timer is disarmed again if another thread completes it first.
    ///
    /// Returns [`Watched::completed`] = true only if this call completed the operation.
    ///
    /// With a [`reaper_grace`](Builder::reaper_grace) (not the default), before it returns, with
    /// no lock of the purgatory held, the call may advance the timer for its reaper: the
    /// operations of a due bucket then expire on this thread (their `on_complete` and
    /// `on_expiration` run here, in inline mode). Do not then call it while holding a lock that
    /// an operation's callbacks take.
    ///
    /// # Errors
    ///
    /// [`WatchError::NoKeys`] for an empty key set (the operation is handed back untouched);
    /// [`WatchError::Shutdown`] after shutdown, or if the timer refused the operation because it
    /// was shut down; [`WatchError::Full`] if a timer with a
    /// [`max_pending`](system_timer::Builder::max_pending) limit is at it. In both the operation
    /// is handed back (`try_complete` may have run, `on_complete` never).
    ///
    /// # Panics
    ///
    /// A panic in the operation's `try_complete`, a key's `Clone`, `Hash` or `Eq`, or the
    /// timer's clock goes on to the caller after the operation has been taken out of the
    /// purgatory and dropped (counted under [`handed_back`](PurgatoryStats::handed_back); never
    /// left watched without a timer; the cells it left in watch lists count towards the next
    /// purge). One in `on_complete` goes on after the operation has completed, and so does one
    /// in the clock while this call's completion schedules a purge (after `on_complete`). One
    /// in its `ready_arg` or `ready_hint` goes on before anything is registered (not even
    /// [`accepted`](PurgatoryStats::accepted)).
    #[doc(alias = "tryCompleteElseWatch")]
    pub fn try_complete_else_watch(
        &self,
        op: Op,
        timeout: Duration,
        keys: &[K],
    ) -> Result<Watched<Op>, WatchError<Op>> {
        let inner = &self.inner;
        if keys.is_empty() {
            return Err(WatchError::NoKeys(op));
        }
        if inner.closed.load(Ordering::Acquire) {
            return Err(WatchError::Shutdown(op));
        }
        let arg = inner.ready_test.as_ref().and_then(|_| op.ready_arg());
        // The handle owns the new cell's first reference (no second one for this call).
        let handle = OperationHandle {
            cell: Arc::new(OpCell::new(op, inner.refs.mine())),
        };
        // Counted once the operation's own code (`ready_arg`, `ready_hint`) has run: a panic
        // there leaves nothing registered.
        inner.common.accepted_add();
        let cell = &handle.cell;
        let timer = &inner.common.timer;
        let mut st = cell.lock();
        // Everything from the first try to the arming under one lock hold, and under one
        // `catch_unwind`: a panic anywhere in it (the operation's `try_complete`, a key's
        // `Clone` or `Hash`, the clock) must not leave the operation watched but never armed.
        let entered = catch_unwind(AssertUnwindSafe(|| {
            self.enter(cell, &mut st, timeout, keys, arg.unwrap_or(NO_ARG))
        }));
        let entered = match entered {
            Ok(entered) => entered,
            Err(payload) => {
                // The operation is still pending (perhaps watched on some keys, perhaps armed):
                // take it out and drop it before the panic goes on to the caller, who gets no
                // handle to it. (If `on_complete` panicked, it has completed: nothing to do.)
                if !cell.is_completed() {
                    drop(cell.hand_back_locked(&mut st));
                }
                resume_unwind(payload)
            }
        };
        drop(st);
        // With no lock held: an advance if the reaper waits for a caller to (a timer with a
        // reaper grace: see [`Builder::reaper_grace`]). Expiries it runs execute here, on the
        // caller's thread, in inline mode (the own timer's default).
        let completed = match entered {
            Entered::ReadyAtFirstTry => true,
            Entered::ReadyAtSecondTry => {
                timer.advance_if_due();
                true
            }
            Entered::Armed(now) => {
                timer.advance_if_due_at(now);
                false
            }
            Entered::Refused(op) => return Err(WatchError::Shutdown(op)),
            Entered::Full(op) => return Err(WatchError::Full(op)),
        };
        Ok(Watched { completed, handle })
    }

    /// The locked part of [`try_complete_else_watch`](Self::try_complete_else_watch): the first
    /// try, the watches, the second try, the arming.
    #[inline]
    fn enter(
        &self,
        cell: &Arc<OpCell<Op>>,
        st: &mut MutexGuard<'_, OpState<Op>>,
        timeout: Duration,
        keys: &[K],
        arg: u64,
    ) -> Entered<Op> {
        let inner = &self.inner;
        if cell.try_complete_locked(st) {
            return Entered::ReadyAtFirstTry;
        }
        for key in keys {
            if !inner.watchers.watch(key, cell, arg) {
                // Closed under us: hand the operation back; cells already appended are empty
                // shells the shutdown's drain skips.
                return Entered::Refused(cell.hand_back_locked(st));
            }
            st.watched = true;
        }
        if cell.try_complete_locked(st) {
            return Entered::ReadyAtSecondTry;
        }
        // Still pending: arm the timer in the same lock hold. The expiry task takes this lock,
        // so it cannot run before the handle is stored. One clock reading serves the deadline
        // and, after the lock is released, the reaper's help.
        let timer = &inner.common.timer;
        let now = timer.deadline_base();
        match timer.add_at_keyed(now.saturating_add(timeout), expiry_task(cell)) {
            Ok(key) => {
                st.timer = Some(key);
                inner.common.armed_add();
                Entered::Armed(now)
            }
            // The timer refused: never leave an operation that can no longer expire.
            Err(ScheduleError::Shutdown(_)) => Entered::Refused(cell.hand_back_locked(st)),
            Err(ScheduleError::Full(_)) => Entered::Full(cell.hand_back_locked(st)),
        }
    }

    /// Kafka's `checkAndComplete`: runs `try_complete` on every pending operation watching
    /// `key` (blocking on each one's lock, never skipping a locked one) and completes the ready
    /// ones. An operation that the purgatory's [`ready_test`](Builder::ready_test) rules out is
    /// skipped without reading it; one with a [`ReadyHint`](crate::ReadyHint) that says not
    /// ready, without its lock. Returns how many this call completed. Runs no user code under
    /// any map lock (drops aside: see the invariants on [`Purgatory`]). Drops the key's list once every operation on it has completed (as far as
    /// the scan sees: completed entries the ready test rules out are not counted, and wait for
    /// the purge).
    ///
    /// # Panics
    ///
    /// If an operation's code (or the ready test, or a hint) panics, the check still visits the
    /// rest of the list, then raises the first panic again. An operation whose `try_complete`
    /// panicked stays pending (armed and watched, tried again at the next check); one whose
    /// `on_complete` panicked has completed.
    #[doc(alias = "checkAndComplete")]
    pub fn check_and_complete(&self, key: &K) -> usize {
        let inner = &self.inner;
        inner.common.note_check();
        let Some(list) = inner.watchers.snapshot(key) else {
            return 0;
        };
        let (mut completed, mut done) = (0, 0);
        // A panic of the operations' code (or the ready test's) does not end the scan, so that
        // one faulty operation does not cost the others this check: the scan resumes after the
        // entry that panicked, and the first panic is raised again at the end. One
        // `catch_unwind` per resumption, not per entry: the loop inside stays tight.
        let mut panic = None;
        let test = inner.ready_test.as_ref();
        let mut next = 0;
        while next < list.len() {
            let scan = catch_unwind(AssertUnwindSafe(|| {
                // The counts in locals (registers): only `next` must survive a panic. After
                // one, the counts of that stretch of the scan are lost, which only makes the
                // sweep below less likely (the return value is not seen: the panic goes on).
                let (mut completed, mut done) = (0, 0);
                for entry in &list[next..] {
                    // Advanced before the visit: after a panic, `next` is past the entry.
                    next += 1;
                    match visit(key, entry, test) {
                        Visit::Skipped => {}
                        Visit::Done => done += 1,
                        Visit::Completed => {
                            completed += 1;
                            done += 1;
                        }
                    }
                }
                (completed, done)
            }));
            match scan {
                Ok((c, d)) => {
                    completed += c;
                    done += d;
                }
                // A panic in `try_complete` leaves the operation pending (tried again at the
                // next check; it still expires); one in `on_complete`, completed.
                Err(payload) => {
                    panic.get_or_insert(payload);
                }
            }
        }
        let len = list.len();
        drop(list);
        // Sweep once the completed entries this scan saw are a sixteenth of the list (always
        // when all are: the key is then dropped), so a list holds at most about a sixteenth
        // more entries than its pending operations, counting the completed ones a check can
        // see (expired ones the ready test rules out wait for the purge). A sweep visits every
        // entry once, so it costs at most 16 visits per entry it removes; a scan visits every
        // entry, garbage included, on every check (W4 `watch` model, low-timeout point,
        // 50,000/s: about a fifth less completer CPU than sweeping at half the list).
        if done > 0 && done * SWEEP_FRACTION >= len {
            inner.watchers.sweep_key(key);
        }
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
        completed
    }

    /// Kafka's `cancelForKey`: removes `key`'s watch list and disarms the timers of the pending
    /// operations on it, without completing them (no `on_complete`); they stay watched on their
    /// other keys and can still be completed by a check or by force, but no longer expire.
    /// Returns one handle to each of those operations. One watched on no other key is then
    /// reachable only through its handle, and a shutdown no longer sees it: complete it by force,
    /// or take it back with [`OperationHandle::take`] (Kafka returns the operations themselves).
    /// Dropping the last handle to such an operation drops it without `on_complete` and counts
    /// it as handed back in [`stats`](Self::stats).
    #[doc(alias = "cancelForKey")]
    #[must_use = "an operation watched on no other key is reachable only through its handle: \
                  complete it by force or take it back"]
    pub fn cancel_for_key(&self, key: &K) -> Vec<OperationHandle<Op>> {
        let Some(list) = self.inner.watchers.take_key(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // An operation watched more than once on this key (duplicate keys) is returned once.
        let mut seen = std::collections::HashSet::new();
        for Entry { cell, .. } in list.iter() {
            // A completed cell needs no lock, and may be the one whose `on_complete` runs this
            // call: this thread holds its lock.
            if cell.is_completed() || !seen.insert(Arc::as_ptr(cell)) {
                continue;
            }
            let mut st = cell.lock();
            if cell.is_completed() {
                continue;
            }
            cell.disarm_locked(&mut st, false);
            drop(st);
            out.push(OperationHandle {
                cell: Arc::clone(cell),
            });
        }
        if !out.is_empty() {
            self.inner.common.count_garbage(0);
        }
        out
    }

    /// Entries in all watch lists (Kafka's `watched`, "PurgatorySize"): an operation counts once
    /// per key it was given (twice for a key given twice), and completed ones count until they
    /// are swept.
    #[doc(alias = "PurgatorySize")]
    pub fn watched(&self) -> usize {
        self.inner.watchers.watched()
    }

    /// Operations armed in the timer and not yet completed (Kafka's `numDelayed`). Exact, and
    /// updated by the completing call before it returns.
    #[doc(alias = "numDelayed")]
    pub fn delayed(&self) -> usize {
        self.inner.common.delayed()
    }

    /// Drives the purgatory's timer to the clock's time (for purgatories built with
    /// `.reaper(false)`): runs due expiries, and the purge when one is due (one these expiries
    /// made due included), on this thread in inline mode. Returns the number of timer tasks run.
    pub fn advance(&self) -> usize {
        let common = &self.inner.common;
        // A scheduled purge's zero-delay task waits for the timer's next tick: run it here.
        common.timer.advance() + usize::from(common.purger.run_scheduled())
    }

    /// The timer the purgatory uses. An own timer is shut down with the purgatory: share it
    /// with another purgatory only if this one outlives it (see [`Builder::timer`]).
    pub fn timer(&self) -> &Arc<SystemTimer> {
        &self.inner.common.timer
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PurgatoryStats {
        let inner = &self.inner;
        let c = &inner.common;
        PurgatoryStats {
            accepted: c.accepted(),
            completed: c.completed() as u64,
            expired: c.expired() as u64,
            handed_back: c.handed_back(),
            delayed: c.delayed() as u64,
            purges: c.purger.purges(),
            watched: inner.watchers.watched() as u64,
            keys: inner.watchers.keys() as u64,
        }
    }

    /// Sweeps every watch list now (the purge the purgatory otherwise runs by count: the
    /// completion, by any path, that brings the watched operations completed since the last
    /// purge became due to `purge_interval` (and, while no key has been checked since then, to
    /// at least as many as are still delayed) schedules it on the timer, which runs it at its
    /// next advance; completions in between count towards the next one). It counts as the last
    /// purge for both. Returns the number of completed entries removed.
    pub fn purge(&self) -> usize {
        self.inner.common.reset_garbage();
        self.inner.common.purger.run()
    }

    /// Stops the purgatory: later `try_complete_else_watch` calls fail with
    /// [`WatchError::Shutdown`], and every pending operation still watched is handed back (its
    /// timer disarmed, `on_complete` not called): all of them, unless `cancel_for_key` removed
    /// an operation's only key (see there). Shuts the own timer down (a shared one is left
    /// running). Idempotent; dropping the purgatory calls it.
    ///
    /// It may be called (or the purgatory dropped) from an operation's `on_complete` or
    /// `on_expiration` (or the drop of its payload), on any thread: that operation has
    /// completed, and the own timer then finishes its shutdown on a thread of its own once the
    /// callbacks return (see [`SystemTimer::shutdown_in_background`]).
    ///
    /// # Panics
    ///
    /// A panic in a key's drop (shutdown drops every key) goes on to the caller once every
    /// operation has been handed back (so dropped with the panic, but counted under
    /// [`handed_back`](PurgatoryStats::handed_back)) and the own timer shut down.
    #[must_use = "the pending operations are handed back, never completed: drop them explicitly \
                  if that is meant"]
    pub fn shutdown(&self) -> Vec<Op> {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return Vec::new();
        }
        let mut out = Vec::new();
        let (cells, key_drop_panic) = inner.watchers.close();
        for cell in cells {
            // A completed cell needs no lock, and may be the one whose `on_complete` (or
            // `on_expiration`) runs this shutdown: this thread holds its lock.
            if cell.is_completed() {
                continue;
            }
            let mut st = cell.lock();
            if !cell.is_completed() {
                out.push(cell.hand_back_locked(&mut st));
            }
        }
        if inner.own_timer {
            // Its remaining tasks are expiries of operations handed back above (now no-ops)
            // and purges: dropping them is right.
            if crate::sync::in_callbacks() {
                // From an operation's `on_complete` (or `on_expiration`, or its drop), under its
                // lock: a timer thread may be running that operation's expiry, which started
                // before it completed and waits for the lock. Joining it here would deadlock.
                inner.common.timer.shutdown_in_background();
            } else {
                drop(inner.common.timer.shutdown());
            }
        }
        if let Some(panic) = key_drop_panic {
            resume_unwind(panic);
        }
        out
    }

    /// True once [`shutdown`](Self::shutdown) has started: from then on
    /// [`try_complete_else_watch`](Self::try_complete_else_watch) refuses every operation with
    /// [`WatchError::Shutdown`].
    ///
    /// A purgatory on a shared timer whose owner shut the timer down first reads false here
    /// (it refuses only the operations it would have to arm); [`timer`](Self::timer)`()`'s
    /// [`is_shutdown`](SystemTimer::is_shutdown) tells that.
    pub fn is_shutdown(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Panics if an invariant is broken: every operation in a watch list is one this purgatory
    /// accepted, `delayed()` equals the armed pending operations found in the lists, and the
    /// timer's own invariants hold.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut armed = std::collections::HashSet::new();
        for (_, list) in self.inner.watchers.lists() {
            for Entry { cell, .. } in list.iter() {
                let st = cell.lock();
                if cell.is_completed() {
                    assert!(
                        st.op.is_none(),
                        "a completed operation still holds its payload"
                    );
                    assert!(st.timer.is_none(), "a completed operation is still armed");
                } else {
                    assert!(st.op.is_some());
                    assert!(st.watched);
                    if st.timer.is_some() {
                        armed.insert(Arc::as_ptr(cell));
                    }
                }
            }
        }
        if !self.inner.closed.load(Ordering::Acquire) {
            assert_eq!(
                armed.len(),
                self.delayed(),
                "delayed() disagrees with armed operations"
            );
        }
        self.inner.common.timer.check_invariants();
    }
}

impl<K, Op, T> Drop for Purgatory<K, Op, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
    T: ReadyTest<K>,
{
    fn drop(&mut self) {
        drop(self.shutdown());
    }
}

impl<K, Op, T> fmt::Debug for Purgatory<K, Op, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    Op: DelayedOperation,
    T: ReadyTest<K>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Purgatory")
            .field("name", &self.inner.name)
            .field("delayed", &self.inner.common.delayed())
            .finish()
    }
}

/// What a check's visit of one watch-list entry found.
enum Visit {
    /// Pending, and ruled out (by the ready test or the hint) or not ready.
    Skipped,
    /// Completed already.
    Done,
    /// Completed by this visit.
    Completed,
}

/// A check's visit of one entry of `key`'s list: the ready test, the hint, then the op lock and
/// `try_complete`.
#[inline]
fn visit<K, Op: DelayedOperation, T: ReadyTest<K>>(
    key: &K,
    entry: &Entry<Op>,
    test: Option<&T>,
) -> Visit {
    if let Some(test) = test {
        if entry.arg != NO_ARG && !test.maybe_ready(key, entry.arg) {
            // The purgatory's ready test rules it out: skipped without reading it.
            return Visit::Skipped;
        }
    }
    let cell = &entry.cell;
    if cell.is_completed() {
        return Visit::Done;
    }
    if !cell.may_complete() {
        // Its ReadyHint says not ready: skipped without the lock.
        return Visit::Skipped;
    }
    let mut st = cell.lock();
    if cell.is_completed() {
        Visit::Done
    } else if cell.try_complete_locked(&mut st) {
        Visit::Completed
    } else {
        Visit::Skipped
    }
}

/// What [`Purgatory::enter`] did with an operation, its lock still held.
enum Entered<Op> {
    /// Completed at the first try, before any watch.
    ReadyAtFirstTry,
    /// Completed at the second try, after the watches.
    ReadyAtSecondTry,
    /// Watched and armed, at this deadline base (for the reaper's help).
    Armed(Duration),
    /// Refused by a shutdown (of the purgatory or its timer) and handed back.
    Refused(Op),
    /// Refused by a timer at its pending-task limit and handed back.
    Full(Op),
}

/// The timer task that expires `cell`: the cell's own `Arc` (no allocation per operation).
#[cfg(not(loom))]
fn expiry_task<Op: DelayedOperation>(cell: &Arc<OpCell<Op>>) -> Task {
    Task::from_arc(Arc::clone(cell))
}

/// Under loom the shim's `Arc` is loom's, which `Task::from_arc` does not take: a closure.
#[cfg(loom)]
fn expiry_task<Op: DelayedOperation>(cell: &Arc<OpCell<Op>>) -> Task {
    let cell = Arc::clone(cell);
    Task::new(move || cell.expire())
}
