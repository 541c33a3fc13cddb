//! Delayed operations: the user trait, and the cell the purgatory keeps each one in.
//!
//! # Ground rules
//!
//! * Every operation lives in an [`OpCell`]: its **op lock** (a mutex around the operation, its
//!   timer handle and its watched flag) and an atomic `completed` flag. The purgatory owns both;
//!   the user never completes an operation by hand (Kafka's `forceComplete`-inside-`tryComplete`
//!   contract cannot be misused here).
//! * `try_complete`, `on_complete` and `on_expiration` run **only under the op lock**, so they
//!   never overlap for one operation (Kafka's 2025 fix, KAFKA-19312: expiry takes the lock too).
//!   The pieces of user code that run without it are the optional [`ReadyHint`], set when
//!   the cell is made and never changed, and the purgatory's ready test
//!   ([`Builder::ready_test`](crate::Builder::ready_test)): a check runs them with no lock
//!   held, and only to skip the operation (they change no state).
//! * `completed` goes `false → true` exactly once, under the op lock, by [`OpCell::complete_locked`]
//!   or by a hand-back ([`OpCell::hand_back_locked`]: shutdown, a watch or arm refused,
//!   [`OperationHandle::take`], or `try_complete` panicking inside `try_complete_else_watch`).
//!   Whoever sets it runs `on_complete` (then `on_expiration` if expiry won) in the same lock
//!   hold, so `on_complete` runs exactly once. `try_complete` is
//!   never called once `completed` is set (every caller checks it under the lock first).
//! * Completion disarms the timer entry (cancel, in the same lock hold) and **drops the
//!   operation** at once: what is left in other keys' watch lists is an empty cell until a check
//!   or the purge sweeps it (KAFKA-19389 / KAFKA-19763: completed operations must not pin memory).
//! * Lock order: op lock → timer shard lock (arming, disarming). The timer never calls into an
//!   operation while holding its own locks (expiry runs on the reaper or an executor, after the
//!   timer's locks are released), and the watch map's locks are never held while an op lock is
//!   taken by the checking side, so no cycle exists (R7 in LOOM.md).
//!
//! # State machine
//!
//! ```text
//! PENDING (op held) ──try_complete()=true / force_complete / expiry──▶ COMPLETED (op dropped)
//!        └──────────shutdown / failed watch or arm / handle.take()──────▶ HANDED BACK (op returned)
//! ```

use std::fmt;

use system_timer::{SystemTimer, TimerKey};

use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread_hint, Arc, InCallbacks, Mutex, MutexGuard};

/// An operation that waits in a [`Purgatory`](crate::Purgatory) until it can complete, or until
/// its timeout expires.
///
/// All three methods run under the operation's own lock, so they never run concurrently for the
/// same operation, and take `&mut self`: plain fields are enough for the operation's state.
///
/// # Calling back into the purgatory
///
/// `on_complete` and `on_expiration` run once the operation has completed: they may use the
/// purgatory (new operations, checks, `cancel_for_key`, `shutdown`, dropping it) and any handle,
/// their own included (it answers "completed": `force_complete` false, `take` and `with` `None`).
/// `try_complete` runs while the operation is pending and its lock is held by the caller: it
/// should only read state and decide, and must not call into the purgatory or any operation's
/// handle. Its own lock deadlocks this thread (its own handle, a check or `cancel_for_key` of a
/// key it watches, `shutdown`, anything that may advance the timer, whose expiry takes the
/// lock); another operation's lock can deadlock two threads (a `check_and_complete` of a key it
/// does not watch waits for the locks of that key's operations, whose own `try_complete` may be
/// waiting for this one: AB-BA), and completing another operation from here runs its
/// `on_complete`, which may call back into this one. Likewise through another purgatory whose
/// operations may wait for this one's. Act on the outcome in `on_complete` instead.
///
/// # Answering a timeout
///
/// `on_complete` runs first however the operation completed (an expiry then calls
/// `on_expiration`, as in Kafka). To answer differently on a timeout, do as Kafka's
/// `DelayedProduce` does: start with the timeout's answer and overwrite it in `try_complete`
/// when the operation is ready. An operation forced through its handle answers with whatever
/// state it was left in (here: timed out, not ready), unless the caller sets it first with
/// [`OperationHandle::force_complete_with`].
///
/// ```
/// use purgatory::{DelayedOperation, Purgatory};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::{mpsc, Arc};
/// use std::time::Duration;
/// use purgatory::system_timer::ManualClock; // the timer crate, re-exported
///
/// /// Completes once the high watermark reaches `offset`.
/// struct DelayedProduce {
///     offset: u64,
///     high_watermark: Arc<AtomicU64>,
///     error: &'static str, // the answer; starts as the timeout's
///     respond: mpsc::Sender<(u64, &'static str)>,
/// }
///
/// impl DelayedOperation for DelayedProduce {
///     fn try_complete(&mut self) -> bool {
///         let ready = self.high_watermark.load(Ordering::Acquire) >= self.offset;
///         if ready {
///             self.error = "NONE";
///         }
///         ready
///     }
///     fn on_complete(&mut self) {
///         self.respond.send((self.offset, self.error)).unwrap();
///     }
///     fn on_expiration(&mut self) {
///         // Runs after on_complete when the timeout won; only meters here, as in Kafka.
///     }
/// }
///
/// let clock = ManualClock::new(0); // a hand-driven clock, as in a test
/// let produces: Purgatory<&str, DelayedProduce> =
///     Purgatory::builder().clock(clock.clone()).reaper(false).build();
/// let (hw, (tx, rx)) = (Arc::new(AtomicU64::new(0)), mpsc::channel());
/// for offset in [5, 50] {
///     let op = DelayedProduce {
///         offset,
///         high_watermark: hw.clone(),
///         error: "REQUEST_TIMED_OUT",
///         respond: tx.clone(),
///     };
///     produces.try_complete_else_watch(op, Duration::from_millis(30), &["orders-0"])?;
/// }
/// hw.store(10, Ordering::Release); // followers caught up to 10
/// produces.check_and_complete(&"orders-0");
/// assert_eq!(rx.try_recv()?, (5, "NONE"));
/// clock.advance(Duration::from_millis(30));
/// produces.advance(); // 50 never became ready: its timeout completes it
/// assert_eq!(rx.try_recv()?, (50, "REQUEST_TIMED_OUT"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait DelayedOperation: Send + 'static {
    /// Says whether the operation can complete now. Return `true` when ready: the purgatory then
    /// completes it (calls [`on_complete`](Self::on_complete)) in the same lock hold. Never
    /// called again once the operation has completed.
    fn try_complete(&mut self) -> bool;

    /// Called exactly once, when the operation completes, whichever way: ready at the first
    /// try, ready at a check on one of its keys, forced through its handle, or expired (to
    /// answer a timeout differently, see [Answering a timeout](#answering-a-timeout)).
    fn on_complete(&mut self);

    /// Called after [`on_complete`](Self::on_complete), only when the timeout completed the
    /// operation. Default: nothing.
    fn on_expiration(&mut self) {}

    /// Optional: a test [`check_and_complete`](crate::Purgatory::check_and_complete) may run
    /// *without* the operation's lock, to skip it when it certainly cannot complete. Called
    /// once, when the operation enters the purgatory. Default: none (every check takes the
    /// operation's lock and calls [`try_complete`](Self::try_complete), as Kafka's
    /// `checkAndComplete` does).
    ///
    /// See [`ReadyHint`] for the contract and when it pays.
    fn ready_hint(&self) -> Option<ReadyHint> {
        None
    }

    /// Optional: this operation's argument to the purgatory's ready test
    /// ([`Builder::ready_test`](crate::Builder::ready_test)), asked once, when the operation
    /// enters the purgatory, and kept beside it in each of its keys' watch lists: a check of
    /// key `k` skips the operation when `test(k, arg)` is false without reading the operation
    /// at all (not even its cell). A produce waiting for offset `o` on partition `k`: `o`, and
    /// the test compares it with `k`'s high watermark. Default: none (the test is not asked;
    /// `Some(u64::MAX)` means the same). Same contract as a [`ReadyHint`].
    fn ready_arg(&self) -> Option<u64> {
        None
    }
}

/// A lock-free pre-test for checks: "can this operation complete now?", answered from state
/// shared with the code that makes operations ready (a high watermark, a byte count, a flag).
///
/// [`check_and_complete`](crate::Purgatory::check_and_complete) visits every pending operation
/// watching the key. Without a hint each visit takes and releases the operation's lock (two
/// atomic read-modify-writes) to call [`try_complete`](DelayedOperation::try_complete); with
/// one, a visit whose hint returns `false` skips the operation with plain loads only. It pays
/// when a key's check finds most of its watchers not ready (a hot partition's fetches waiting
/// for more bytes than arrived).
///
/// # Contract
///
/// * Return `false` only when `try_complete` would return `false`, given everything that
///   happened before the `check_and_complete` call (the thread that makes an operation ready
///   publishes the state with `Release` before it checks; the hint reads it with `Acquire`).
///   A hint that says `false` wrongly loses that check's completion, as a `try_complete` that
///   says `false` wrongly does.
/// * It runs concurrently with anything, including `try_complete`, `on_complete` and after
///   completion; it must not block. `true` is always safe: the check then locks and calls
///   `try_complete` as usual.
/// * Only checks use it: the first tries in `try_complete_else_watch` always call
///   `try_complete`. It lives as long as the operation's entry in the watch lists (until a
///   check or the purge sweeps it), not only until completion: keep what it holds small.
///
/// ```
/// use purgatory::{DelayedOperation, Purgatory, ReadyHint};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// struct DelayedProduce { offset: u64, hw: Arc<AtomicU64> }
/// impl DelayedOperation for DelayedProduce {
///     fn try_complete(&mut self) -> bool { self.hw.load(Ordering::Acquire) > self.offset }
///     fn on_complete(&mut self) {}
///     fn ready_hint(&self) -> Option<ReadyHint> {
///         let (hw, offset) = (Arc::clone(&self.hw), self.offset);
///         Some(ReadyHint::new(move || hw.load(Ordering::Acquire) > offset))
///     }
/// }
///
/// let p: Purgatory<u32, DelayedProduce> = Purgatory::builder().reaper(false).build();
/// let hw = Arc::new(AtomicU64::new(0));
/// for offset in 0..100 {
///     let op = DelayedProduce { offset, hw: hw.clone() };
///     p.try_complete_else_watch(op, Duration::from_secs(30), &[7])?;
/// }
/// hw.store(10, Ordering::Release);
/// // Ten are ready; the other ninety are skipped without taking their locks.
/// assert_eq!(p.check_and_complete(&7), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ReadyHint {
    test: Box<dyn Fn() -> bool + Send + Sync>,
}

impl ReadyHint {
    /// A hint that runs `test` (see the contract above). When many operations ask the same
    /// question of one key's state with different thresholds, the purgatory's
    /// [`ready_test`](crate::Builder::ready_test) answers it without an allocation per
    /// operation and without reading the operation.
    pub fn new(test: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        ReadyHint {
            test: Box::new(test),
        }
    }

    /// Runs the test.
    #[inline]
    pub fn may_complete(&self) -> bool {
        (self.test)()
    }
}

impl fmt::Debug for ReadyHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyHint").finish_non_exhaustive()
    }
}

/// How an operation completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// `try_complete` said ready, or a forced completion.
    Completed,
    /// The timeout fired first.
    Expired,
}

/// Stripes of the [`CommonRefs`] per purgatory (a power of two; one under loom).
const STRIPES: usize = if cfg!(loom) { 1 } else { 8 };

/// Counter stripes each owned by one thread: the first `OWNED` threads to use a purgatory
/// crate's counters (by [`thread_hint`], unique per thread and never reused) count on a stripe
/// of their own with a plain load and store, no read-modify-write (three fewer per watched
/// operation: W4's generator counts it accepted and armed, its completer completed). None under
/// loom, whose threads all have hint 0.
const OWNED: usize = if cfg!(loom) { 0 } else { 8 };

/// Counter stripes the threads past the owners share, by read-modify-writes (a power of two).
const SHARED: usize = STRIPES;

/// One thread's counters, on its own cache lines.
///
/// Each completion writes one of the three `done_*` counts and nothing else (plus `expired` for
/// an expiry): completing an armed operation disarms it, and it was watched (an operation is
/// watched before it is armed), so `done_armed` counts at once a completion, a disarm and an
/// entry left in the watch lists for the purge.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    /// Operations armed in the timer on this stripe's threads.
    armed: AtomicU64,
    /// Armed operations completed on this stripe's threads (by any path, expiry included).
    done_armed: AtomicU64,
    /// Watched operations completed while not armed (at the second try, or after
    /// `cancel_for_key` disarmed them).
    done_watched: AtomicU64,
    /// Operations completed at the first try, before any watch.
    done_unwatched: AtomicU64,
    /// Armed operations disarmed without completing (`cancel_for_key`, hand-backs).
    disarmed: AtomicU64,
    /// Operations `try_complete_else_watch` accepted on this stripe's threads.
    accepted: AtomicU64,
    expired: AtomicU64,
}

/// What a purgatory's operations share: the timer they are armed in, and counters striped by
/// thread (the generator of a workload and the threads completing its operations each write
/// their own cache line, never a shared one: a shared counter would cost a cache-line transfer
/// on every operation).
pub(crate) struct Common {
    /// The timer operations are armed in (each cell holds its entry's key).
    pub(crate) timer: Arc<SystemTimer>,
    /// `OWNED` stripes owned by a thread each, then `SHARED` shared ones (see [`OWNED`]).
    stripes: [Stripe; OWNED + SHARED],
    /// A stripe adds this many to `garbage` each time one of its two watched-completion counts
    /// (`done_armed`, `done_watched`) reaches a multiple of it (so the shared line is written
    /// once per `flush_every` completions, and the total lags by less than
    /// `2 × (OWNED + SHARED) × flush_every`, at most a half of the purge interval). A power of
    /// two, so that the test is a mask, not a division.
    flush_every: u64,
    /// Garbage flushed from the stripes since the last purge.
    garbage: AtomicUsize,
    /// The purge interval.
    purge_interval: usize,
    /// Schedules and runs the purges.
    pub(crate) purger: Arc<Purger>,
    /// Operations handed back without completing (rare: shutdown, refused watches, takes; one
    /// shared counter, not striped).
    handed_back: AtomicU64,
    /// Set by `check_and_complete` (keys are being scanned, empty cells included), cleared when
    /// a purge becomes due.
    checked: AtomicBool,
}

impl Common {
    pub(crate) fn new(timer: Arc<SystemTimer>, purge_interval: usize, purger: Purger) -> Self {
        Common {
            timer,
            purger: Arc::new(purger),
            handed_back: AtomicU64::new(0),
            stripes: Default::default(),
            flush_every: prev_power_of_two((purge_interval / (4 * (OWNED + SHARED))).max(1)) as u64,
            garbage: AtomicUsize::new(0),
            purge_interval: purge_interval.max(1),
            checked: AtomicBool::new(false),
        }
    }

    /// Adds one to the calling thread's `count` and returns the new value: a plain load and
    /// store on a stripe the thread owns (no other thread writes it), a read-modify-write on a
    /// shared one.
    #[inline]
    fn bump(&self, count: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        let (i, owned) = stripe_of(thread_hint());
        let c = count(&self.stripes[i]);
        if owned {
            let n = c.load(Ordering::Relaxed).wrapping_add(1);
            c.store(n, Ordering::Release);
            n
        } else {
            c.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
        }
    }

    /// One count summed over the stripes (wrapping: see [`delayed`](Self::delayed)).
    fn sum(&self, count: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.stripes.iter().fold(0u64, |acc, s| {
            acc.wrapping_add(count(s).load(Ordering::Acquire))
        })
    }

    /// An operation was armed.
    #[inline]
    pub(crate) fn armed_add(&self) {
        self.bump(|s| &s.armed);
    }

    /// An armed operation was disarmed without completing.
    #[inline]
    fn disarmed_add(&self) {
        self.bump(|s| &s.disarmed);
    }

    /// An operation completed: `armed` if it was armed until now (the completion disarmed it),
    /// `watched` if it is in watch lists (true whenever `armed` is). True if a purge became due.
    #[inline]
    fn completion(&self, armed: bool, watched: bool, how: How) -> bool {
        debug_assert!(watched || !armed, "armed operations are watched");
        let n = if armed {
            self.bump(|s| &s.done_armed)
        } else if watched {
            self.bump(|s| &s.done_watched)
        } else {
            self.bump(|s| &s.done_unwatched)
        };
        if how == How::Expired {
            self.bump(|s| &s.expired);
        }
        watched && n & (self.flush_every - 1) == 0 && self.garbage_flush()
    }

    /// `try_complete_else_watch` accepted an operation.
    #[inline]
    pub(crate) fn accepted_add(&self) {
        self.bump(|s| &s.accepted);
    }

    /// Operations accepted: exact once the threads accepting them are done.
    pub(crate) fn accepted(&self) -> u64 {
        self.sum(|s| &s.accepted)
    }

    /// Operations armed and not disarmed: exact once the threads changing it are done.
    pub(crate) fn delayed(&self) -> usize {
        // Wrapping: an operation is often armed on one stripe and disarmed on another, and a
        // racing reader may see a disarm before its arm: never report "negative".
        let out = self
            .sum(|s| &s.done_armed)
            .wrapping_add(self.sum(|s| &s.disarmed));
        usize::try_from(self.sum(|s| &s.armed).wrapping_sub(out) as i64).unwrap_or(0)
    }

    /// `flush_every` more watched operations completed on a stripe: counts them towards the
    /// next purge. True if a purge is now due.
    ///
    /// A purge is due once the completed watched operations reach the purge interval (Kafka's
    /// rule), **unless no key was checked since the last purge**: then it also waits until they
    /// reach the operations still delayed. A purge walks every entry, pending ones included;
    /// when nothing else walks the lists (operations completed by force or expiry, as in
    /// Kafka's own benchmark), the empty cells cost nothing until then, and waiting keeps the
    /// walk at most two entry visits per entry removed (Kafka, with 5,000 operations pending on
    /// the same keys and an interval of 1,000, walks six for each). When keys are checked, each
    /// check walks the empty cells of its list too, so the interval alone decides.
    #[cold]
    fn garbage_flush(&self) -> bool {
        self.garbage_add(self.flush_every as usize)
    }

    /// Counts `n` more watched operations gone (completed, or handed back: their cells are
    /// garbage in the watch lists all the same) towards the next purge, by the rule of
    /// [`garbage_flush`](Self::garbage_flush). True if a purge is now due.
    fn garbage_add(&self, n: usize) -> bool {
        let total = self.garbage.fetch_add(n, Ordering::AcqRel) + n;
        let due = total >= self.purge_interval
            && (self.checked.load(Ordering::Relaxed) || total >= self.delayed());
        if due {
            self.garbage.store(0, Ordering::Relaxed);
            self.checked.store(false, Ordering::Relaxed);
        }
        due
    }

    /// [`garbage_add`](Self::garbage_add), scheduling the purge if one is now due: for `n`
    /// operations handed back (their cells are garbage), or with `n = 0` after operations were
    /// disarmed without completing (`cancel_for_key`: fewer are delayed, so the garbage counted
    /// so far may now make a purge due).
    pub(crate) fn count_garbage(&self, n: usize) {
        if self.garbage_add(n) {
            Purger::schedule(&self.purger, &self.timer);
        }
    }

    /// A key is being checked (see [`garbage_flush`](Self::garbage_flush)). Writes the shared flag
    /// only when it is not set already.
    #[inline]
    pub(crate) fn note_check(&self) {
        if !self.checked.load(Ordering::Relaxed) {
            self.checked.store(true, Ordering::Relaxed);
        }
    }

    /// Forgets the garbage counted so far and the checks seen (a manual purge is about to run,
    /// as a due one does: see [`garbage_add`](Self::garbage_add)). The stripes' counts since
    /// their last flush (fewer than `flush_every` per count) are kept: they count towards the
    /// next purge.
    pub(crate) fn reset_garbage(&self) {
        self.garbage.store(0, Ordering::Relaxed);
        self.checked.store(false, Ordering::Relaxed);
    }

    pub(crate) fn completed(&self) -> usize {
        (self.sum(|s| &s.done_armed)
            + self.sum(|s| &s.done_watched)
            + self.sum(|s| &s.done_unwatched)) as usize
    }

    /// An operation was handed back without completing.
    fn handed_back_add(&self) {
        self.handed_back.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn handed_back(&self) -> u64 {
        self.handed_back.load(Ordering::Relaxed)
    }

    pub(crate) fn expired(&self) -> usize {
        self.sum(|s| &s.expired) as usize
    }
}

/// The purge: a sweep of every watch list, run as a zero-delay task on the timer (so where
/// expiries run: on the reaper or its executors, or in the next advance when driven by hand).
///
/// Scheduled by the completion that makes one due, whatever completed it (a check, a forced
/// completion, an expiry), so a purgatory whose operations only expire, or are only completed
/// by force, purges with no other call (Kafka checks on its reaper's every step). At most one
/// is scheduled at a time. The sweep holds the watch map (a strong reference: the map holds
/// cells, the cells this `Common`, which holds this: a cycle that shutdown, which empties the
/// map, breaks).
pub(crate) struct Purger {
    sweep: Box<dyn Fn() -> usize + Send + Sync>,
    scheduled: AtomicBool,
    purges: AtomicU64,
}

impl Purger {
    pub(crate) fn new(sweep: impl Fn() -> usize + Send + Sync + 'static) -> Self {
        Purger {
            sweep: Box::new(sweep),
            scheduled: AtomicBool::new(false),
            purges: AtomicU64::new(0),
        }
    }

    /// Sweeps every list now; returns how many entries it dropped.
    pub(crate) fn run(&self) -> usize {
        let n = (self.sweep)();
        self.purges.fetch_add(1, Ordering::Relaxed);
        n
    }

    /// Purges run so far.
    pub(crate) fn purges(&self) -> u64 {
        self.purges.load(Ordering::Relaxed)
    }

    /// Runs the scheduled purge, if one is scheduled and has not run yet (its timer task, or a
    /// hand-driven advance that finds it scheduled: whichever comes first; the other does
    /// nothing). True if it ran. The flag is cleared first: a purge made due while this one
    /// sweeps schedules another (what this one no longer sees is left for it), never none.
    pub(crate) fn run_scheduled(&self) -> bool {
        if !self.scheduled.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.run();
        true
    }

    /// Schedules a purge on `timer` unless one is scheduled already. May run under an op lock
    /// (op lock → timer lock, the order arming takes); the purge itself takes no op lock.
    #[cold]
    #[inline(never)]
    fn schedule(this: &Arc<Purger>, timer: &SystemTimer) {
        if this.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        // The flag is cleared by the task when it runs, or by its drop when it never will (the
        // timer refused it, a panic of the timer's clock unwound through `add`, or the timer's
        // owner shut it down with the task still queued and dropped what it handed back): a
        // flag left set with no task behind it would stop every later purge.
        let task = ScheduledPurge {
            purger: Arc::clone(this),
            armed: true,
        };
        let task = system_timer::Task::new(move || task.run());
        let added = timer.add(std::time::Duration::ZERO, task);
        if let Err(refused) = added {
            // Refused: purge here rather than skip a whole interval (the count that made this
            // purge due is already reset). Under an op lock at most, the order the watches take
            // (op lock, then shard locks). A shared timer at its cap of pending tasks; or a shut
            // one: after this purgatory's own shutdown the map is drained and the sweep finds
            // nothing, but a shared timer its owner shut down first (a misuse, see
            // `Builder::timer`) refuses every new operation after it was watched, and each
            // leaves an empty cell per key: with no purge, a caller that goes on offering
            // operations would grow the lists without bound. The refused task's drop clears
            // the flag first.
            drop(refused);
            this.run();
        }
    }
}

/// The purge task's state: clears [`Purger::scheduled`] if dropped without having run.
///
/// A second purge scheduled between a hand-driven advance's run of this one and this task's
/// drop may see the flag cleared under it; the worst that does is one more sweep than needed
/// (each task runs at most one sweep, and only with the flag set).
struct ScheduledPurge {
    purger: Arc<Purger>,
    armed: bool,
}

impl ScheduledPurge {
    fn run(mut self) {
        // Disarmed before the sweep: the flag is the sweep's to clear, and a panic in it (a
        // key's `Drop`) must not clear a flag that a newer purge has set since.
        self.armed = false;
        self.purger.run_scheduled();
    }
}

impl Drop for ScheduledPurge {
    fn drop(&mut self) {
        if self.armed {
            self.purger.scheduled.store(false, Ordering::Release);
        }
    }
}

/// Schedules the purge a completion made due, when dropped at the end of
/// [`OpCell::complete_locked`] (after the callbacks and the payload's drop). Not while a
/// callback's panic unwinds: a second panic (the timer's clock) would then abort the process. That
/// purge is skipped and its garbage waits for the next one, an interval later.
struct PurgeWhenDone<'a> {
    common: &'a Common,
    due: bool,
}

impl Drop for PurgeWhenDone<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.due && !std::thread::panicking() {
            Purger::schedule(&self.common.purger, &self.common.timer);
        }
    }
}

/// A cell's reference to its purgatory's [`Common`]: one per counter stripe, each in an `Arc`
/// of its own, and every cell holds its creating thread's (see [`CommonRefs`]).
///
/// Why not an `Arc<Common>` per cell: that is one reference count for the whole purgatory,
/// incremented by every `try_complete_else_watch` and decremented by every cell's drop, so two
/// threads adding operations wrote one cache line on every operation, and the line also held
/// fields every completion reads (bench `concurrent-adders`, 2026-11-25: two threads took
/// 470 ns per operation each against 300 ns for one; with a reference per stripe, 345–387).
/// `align(128)` puts the `Arc`'s counts (written per operation) and this pointer (read per
/// completion, never written) on different cache lines.
#[repr(align(128))]
pub(crate) struct CommonRef(Arc<Common>);

impl std::ops::Deref for CommonRef {
    type Target = Common;
    #[inline]
    fn deref(&self) -> &Common {
        &self.0
    }
}

/// The purgatory's [`CommonRef`]s, one per stripe.
pub(crate) struct CommonRefs([Arc<CommonRef>; STRIPES]);

impl CommonRefs {
    pub(crate) fn new(common: &Arc<Common>) -> Self {
        CommonRefs(std::array::from_fn(|_| {
            Arc::new(CommonRef(Arc::clone(common)))
        }))
    }

    /// The calling thread's reference, for a new cell.
    #[inline]
    pub(crate) fn mine(&self) -> Arc<CommonRef> {
        Arc::clone(&self.0[stripe_index()])
    }
}

/// The counter stripe of the thread with `hint`, and whether the thread owns it: the first
/// `OWNED` hints own one each, the rest share the `SHARED` after them.
#[inline]
fn stripe_of(hint: usize) -> (usize, bool) {
    match hint.checked_sub(OWNED) {
        None => (hint, true),
        Some(past) => (OWNED + (past & (SHARED - 1)), false),
    }
}

/// The calling thread's stripe of the [`CommonRefs`].
#[inline]
fn stripe_index() -> usize {
    thread_hint() & (STRIPES - 1)
}

/// The largest power of two not above `n` (n ≥ 1).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// What the op lock guards.
pub(crate) struct OpState<Op> {
    /// The operation, while pending.
    pub(crate) op: Option<Op>,
    /// The key of its timer entry, while armed.
    pub(crate) timer: Option<TimerKey>,
    /// True once it has been added to a watch list.
    pub(crate) watched: bool,
}

/// One operation and its lock (see the ground rules).
///
/// `repr(C)`, the two fields a check's visit reads first: right after the `Arc`'s counters, in
/// one cache line (the default layout put `completed` last, 72 bytes after the hint, and each
/// visit of a cell not in cache missed twice).
#[repr(C)]
pub(crate) struct OpCell<Op> {
    completed: AtomicBool,
    /// The operation's [`ReadyHint`], set at creation and never changed (read without the lock).
    hint: Option<ReadyHint>,
    state: Mutex<OpState<Op>>,
    common: Arc<CommonRef>,
}

impl<Op: DelayedOperation> OpCell<Op> {
    pub(crate) fn new(op: Op, common: Arc<CommonRef>) -> Self {
        OpCell {
            completed: AtomicBool::new(false),
            hint: op.ready_hint(),
            state: Mutex::new(OpState {
                op: Some(op),
                timer: None,
                watched: false,
            }),
            common,
        }
    }

    /// Whether the operation has completed (or been handed back).
    ///
    /// `SeqCst`, as is the store that sets it (in [`complete_locked`](Self::complete_locked)
    /// and [`hand_back_locked`](Self::hand_back_locked)), because a thread that reads `false`
    /// here may go on to block on this cell's lock while it holds another's: a callback
    /// (`on_complete` of operation A, run under A's lock after A's flag was set) checks a key
    /// and finds operation B; B's own `on_complete`, on another thread under B's lock, checks a
    /// key and finds A. Each skips the other if it sees the other's flag; with only Release
    /// stores and Acquire loads (two locations: the store-buffering pattern) both may read
    /// `false`, and each then waits for the lock the other holds. In one total order of the
    /// `SeqCst` accesses, at least one of the two reads comes after the other thread's store.
    /// On x86 the load costs nothing more and the store is one `xchg`.
    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::SeqCst)
    }

    /// False when the operation's [`ReadyHint`] says it cannot complete now (a check may skip
    /// it without the lock); true without a hint.
    #[inline]
    pub(crate) fn may_complete(&self) -> bool {
        self.hint.as_ref().is_none_or(ReadyHint::may_complete)
    }

    /// Takes the op lock (blocking: never a try-lock, which loses completions, KAFKA-8334).
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, OpState<Op>> {
        self.state.lock()
    }

    /// Under the op lock: runs `try_complete` and, if ready, completes. True if it completed
    /// the operation now. The caller has checked `completed` under this lock hold.
    #[inline]
    pub(crate) fn try_complete_locked(&self, st: &mut OpState<Op>) -> bool {
        debug_assert!(
            !self.is_completed(),
            "try_complete on a completed operation"
        );
        let ready = st
            .op
            .as_mut()
            .expect("a pending operation holds its op")
            .try_complete();
        if ready {
            self.complete_locked(st, How::Completed);
        }
        ready
    }

    /// Under the op lock, on a pending operation: marks it completed, disarms its timer,
    /// runs `on_complete` (and `on_expiration` when expired), and drops the operation.
    pub(crate) fn complete_locked(&self, st: &mut OpState<Op>, how: How) {
        debug_assert!(!self.is_completed(), "completing twice");
        // SeqCst: see `is_completed`.
        self.completed.store(true, Ordering::SeqCst);
        let armed = self.take_timer_locked(st, how == How::Expired);
        // A purge this completion made due is scheduled last, once the callbacks have run and
        // the payload is dropped: scheduling reads the timer's clock and, on a full shared
        // timer, sweeps right here (dropping keys and hints), and nothing that may panic can
        // come between marking the operation completed and its `on_complete`.
        let _purge = PurgeWhenDone {
            common: &self.common,
            due: self.common.completion(armed, st.watched, how),
        };
        // The callbacks (and the payload's drop) may shut the purgatory down: see
        // `Purgatory::shutdown`, which must not join the own timer's threads from here. Declared
        // before `op`, so dropped after it.
        let _callbacks = InCallbacks::enter();
        let mut op = st.op.take().expect("a pending operation holds its op");
        op.on_complete();
        if how == How::Expired {
            op.on_expiration();
        }
        // `op` (the payload) is dropped here, then `_callbacks`, then `_purge`: completion
        // releases the payload at once.
    }

    /// Under the op lock, without completing the operation: if it is armed, takes its timer key
    /// out and counts it as no longer delayed, cancelling the timer entry unless it has `fired`
    /// (an expiry is running).
    #[inline]
    pub(crate) fn disarm_locked(&self, st: &mut OpState<Op>, fired: bool) {
        if self.take_timer_locked(st, fired) {
            self.common.disarmed_add();
        }
    }

    /// Under the op lock: takes the timer key out, cancelling the entry unless it has `fired`;
    /// true if the operation was armed. Counts nothing (the caller does).
    #[inline]
    fn take_timer_locked(&self, st: &mut OpState<Op>, fired: bool) -> bool {
        match st.timer.take() {
            Some(key) => {
                if !fired {
                    self.common.timer.cancel(key);
                }
                true
            }
            None => false,
        }
    }

    /// Under the op lock: takes a pending operation out without completing it (shutdown, a
    /// watch or arm refused, [`OperationHandle::take`], a panic while it entered the
    /// purgatory). Disarms its timer and counts it as handed back.
    ///
    /// A watched operation's cells stay in its keys' lists as garbage, like a completed one's:
    /// the hand-back counts towards the next purge (one shared count; hand-backs are rare), so
    /// operations taken back in bulk do not pile up empty cells and keys that nothing sweeps.
    pub(crate) fn hand_back_locked(&self, st: &mut OpState<Op>) -> Op {
        debug_assert!(!self.is_completed());
        // SeqCst: see `is_completed`.
        self.completed.store(true, Ordering::SeqCst);
        // Taken first: counting the garbage may schedule a purge, which reads the timer's clock.
        let op = st.op.take().expect("a pending operation holds its op");
        self.disarm_locked(st, false);
        self.common.handed_back_add();
        if st.watched {
            self.common.count_garbage(1);
        }
        op
    }

    /// The timer's task: completes the operation by expiry unless something else won, or its
    /// timer was disarmed meanwhile. Only an armed operation expires: every completion and
    /// `cancel_for_key` take the timer handle under this lock, so an expiry task the timer had
    /// already dispatched when `cancel_for_key` ran finds it gone and does nothing.
    pub(crate) fn expire(&self) {
        // Completed already: nothing to do, and no lock to take (this thread may hold it, if the
        // operation's own `on_complete` is what ran this expiry, through a nested advance).
        if self.is_completed() {
            return;
        }
        let mut st = self.lock();
        if !self.is_completed() && st.timer.is_some() {
            self.complete_locked(&mut st, How::Expired);
        }
    }
}

/// A cell dropped while it still holds its operation: the operation was neither completed nor
/// handed back, and nothing can reach it any more. Only [`Purgatory::cancel_for_key`] makes
/// such a cell (it takes the operation off the key and disarms it; once no other key watches
/// it and its last handle is dropped, this runs): the operation is dropped here, without
/// `on_complete`, and counted as handed back, so that every accepted operation is counted
/// once, as completed or handed back. Every other path takes the operation out of its cell
/// under its lock first (completion, hand-back, shutdown).
///
/// [`Purgatory::cancel_for_key`]: crate::Purgatory::cancel_for_key
impl<Op> Drop for OpCell<Op> {
    fn drop(&mut self) {
        if self.state.get_mut().op.is_some() {
            self.common.handed_back_add();
        }
    }
}

#[cfg(not(loom))]
impl<Op: DelayedOperation> system_timer::SharedTask for OpCell<Op> {
    fn run_shared(self: Arc<Self>) {
        self.expire();
    }
}

/// A handle on an operation in a purgatory: complete it by force, or ask whether it completed.
/// Cloning it is cheap (it shares the operation). Handles compare and hash by the operation
/// they name: equal exactly when they name the same one (an operation watched on two keys
/// comes back from [`cancel_for_key`](crate::Purgatory::cancel_for_key) on each, and a set of
/// handles keeps it once). Clippy's `mutable_key_type` lint cannot see that the operation's
/// state plays no part: list `purgatory::OperationHandle` under `ignore-interior-mutability`
/// in `clippy.toml`.
pub struct OperationHandle<Op> {
    pub(crate) cell: Arc<OpCell<Op>>,
}

impl<Op: DelayedOperation> OperationHandle<Op> {
    /// Completes the operation now, whether or not it is ready (Kafka's `forceComplete`):
    /// `on_complete` runs on this thread, the timer entry is disarmed and the operation dropped.
    /// Returns true if this call completed it; false if it had completed already (or was handed
    /// back by a shutdown). Blocks while another thread holds the operation's lock.
    ///
    /// ```
    /// # use purgatory::{DelayedOperation, Purgatory};
    /// # use std::time::Duration;
    /// # struct Never;
    /// # impl DelayedOperation for Never {
    /// #     fn try_complete(&mut self) -> bool { false }
    /// #     fn on_complete(&mut self) {}
    /// # }
    /// let purgatory: Purgatory<&str, Never> = Purgatory::builder().reaper(false).build();
    /// let w = purgatory.try_complete_else_watch(Never, Duration::from_secs(30), &["k"])?;
    /// assert_eq!(purgatory.delayed(), 1);
    /// assert!(w.handle.force_complete());
    /// assert!(!w.handle.force_complete());
    /// assert_eq!(purgatory.delayed(), 0, "completion disarms the timer at once");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "forceComplete")]
    pub fn force_complete(&self) -> bool {
        self.force_complete_with(|_| ())
    }

    /// [`force_complete`](Self::force_complete), running `f` on the operation first, in the
    /// same lock hold, only if it is still pending: the way to say *why* it is forced (a fetch
    /// whose partition moved answers "not leader", not "timed out"), since `on_complete` cannot
    /// tell a forced completion from an expiry (see [Answering a
    /// timeout](DelayedOperation#answering-a-timeout)). Returns as `force_complete` does; `f`
    /// ran exactly when it returns true.
    ///
    /// `f` must not call into the purgatory or this operation's handles (as [`with`](Self::with)).
    /// A panic in `f` goes on to the caller with the operation still pending (`on_complete` not
    /// called).
    ///
    /// ```
    /// # use purgatory::{DelayedOperation, Purgatory};
    /// # use std::time::Duration;
    /// # use std::sync::mpsc;
    /// struct Fetch { error: &'static str, respond: mpsc::Sender<&'static str> }
    /// impl DelayedOperation for Fetch {
    ///     fn try_complete(&mut self) -> bool { false } // no bytes arrive in this example
    ///     fn on_complete(&mut self) { self.respond.send(self.error).unwrap() }
    /// }
    /// let fetches: Purgatory<&str, Fetch> = Purgatory::builder().reaper(false).build();
    /// let (respond, responses) = mpsc::channel();
    /// let op = Fetch { error: "REQUEST_TIMED_OUT", respond };
    /// fetches.try_complete_else_watch(op, Duration::from_secs(30), &["orders-0"])?;
    /// // The partition moved to another broker: answer its fetches now, and say so.
    /// for fetch in fetches.cancel_for_key(&"orders-0") {
    ///     assert!(fetch.force_complete_with(|f| f.error = "NOT_LEADER_OR_FOLLOWER"));
    /// }
    /// assert_eq!(responses.try_recv()?, "NOT_LEADER_OR_FOLLOWER");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn force_complete_with(&self, f: impl FnOnce(&mut Op)) -> bool {
        // `completed` never goes back: once set, no lock is needed to answer (and the lock may
        // be this thread's, when the operation's own `on_complete` calls this).
        if self.cell.is_completed() {
            return false;
        }
        let mut st = self.cell.lock();
        if self.cell.is_completed() {
            return false;
        }
        f(st.op.as_mut().expect("a pending operation holds its op"));
        self.cell.complete_locked(&mut st, How::Completed);
        true
    }

    /// True once the operation has completed (or was handed back: by a shutdown, or
    /// [`take`](Self::take)).
    #[doc(alias = "isCompleted")]
    pub fn is_completed(&self) -> bool {
        self.cell.is_completed()
    }

    /// Runs `f` on the operation under its lock, while it is pending; `None` once completed.
    ///
    /// `f` must not call into the purgatory or this operation's handles: a shutdown, a check
    /// of one of its keys, an advance that expires it, or this operation's `force_complete` or
    /// `take` would wait for the lock this call holds, for ever. Read what you need and act
    /// after `with` returns.
    pub fn with<R>(&self, f: impl FnOnce(&Op) -> R) -> Option<R> {
        if self.cell.is_completed() {
            return None; // without the lock: see `force_complete`
        }
        self.cell.lock().op.as_ref().map(f)
    }

    /// Takes the operation back without completing it (`on_complete` is not called, as at
    /// shutdown): disarms its timer and counts it as handed back; its watch-list entries are
    /// empty cells the next sweep drops. `None` if it has completed or was handed back already.
    /// The way to recover an operation [`Purgatory::cancel_for_key`] returned a handle to.
    /// Blocks while another thread holds the operation's lock.
    ///
    /// [`Purgatory::cancel_for_key`]: crate::Purgatory::cancel_for_key
    ///
    /// ```
    /// # use purgatory::{DelayedOperation, Purgatory};
    /// # use std::time::Duration;
    /// # struct Never(u32);
    /// # impl DelayedOperation for Never {
    /// #     fn try_complete(&mut self) -> bool { false }
    /// #     fn on_complete(&mut self) { unreachable!("taken back, never completed") }
    /// # }
    /// let purgatory: Purgatory<&str, Never> = Purgatory::builder().reaper(false).build();
    /// purgatory.try_complete_else_watch(Never(7), Duration::from_secs(30), &["k"])?;
    /// let handles = purgatory.cancel_for_key(&"k");
    /// assert_eq!(handles[0].take().map(|op| op.0), Some(7));
    /// assert!(handles[0].take().is_none() && handles[0].is_completed());
    /// assert_eq!(purgatory.stats().handed_back, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use = "the operation taken back is dropped, never completed, if unused"]
    pub fn take(&self) -> Option<Op> {
        if self.cell.is_completed() {
            return None; // without the lock: see `force_complete`
        }
        let mut st = self.cell.lock();
        if self.cell.is_completed() {
            return None;
        }
        Some(self.cell.hand_back_locked(&mut st))
    }
}

impl<Op> Clone for OperationHandle<Op> {
    fn clone(&self) -> Self {
        OperationHandle {
            cell: Arc::clone(&self.cell),
        }
    }
}

impl<Op> PartialEq for OperationHandle<Op> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq::<OpCell<Op>>(&*self.cell, &*other.cell)
    }
}

impl<Op> Eq for OperationHandle<Op> {}

impl<Op> std::hash::Hash for OperationHandle<Op> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash::<OpCell<Op>, H>(&*self.cell, state);
    }
}

impl<Op> fmt::Debug for OperationHandle<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationHandle")
            .field("completed", &self.cell.completed.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use super::*;

    /// An operation that is never ready (the crate's unit tests share it).
    pub(crate) struct Nothing;
    impl DelayedOperation for Nothing {
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self) {}
    }

    /// A stripe owned by one thread is written by no other: the first `OWNED` hints own one
    /// each, every owned stripe has exactly one owner, and the others share stripes no thread
    /// owns.
    #[test]
    fn each_owned_stripe_has_one_writer_and_shared_ones_no_owner() {
        let mut owners = std::collections::HashMap::new();
        for hint in 0..10_000 {
            let (i, owned) = stripe_of(hint);
            assert!(i < OWNED + SHARED, "hint {hint}: stripe {i} out of range");
            if owned {
                assert!(hint < OWNED && i < OWNED, "hint {hint} owns stripe {i}");
                assert!(owners.insert(i, hint).is_none(), "stripe {i} owned twice");
            } else {
                assert!(hint >= OWNED && i >= OWNED, "hint {hint} shares stripe {i}");
            }
        }
        assert_eq!(owners.len(), OWNED);
    }

    #[test]
    fn prev_power_of_two_rounds_down() {
        let got: Vec<usize> = [1, 2, 3, 31, 32, 33, 1000].map(prev_power_of_two).to_vec();
        assert_eq!(got, [1, 2, 2, 16, 32, 32, 512]);
    }

    /// What an empty cell costs until it is swept (the purge interval's documentation quotes
    /// it: about 80 to 90 bytes beyond the operation for one aligned to at most 8 bytes): the
    /// cell and its `Arc` header, beyond the operation's own size (a hint's closure, when there
    /// is one, is a separate allocation).
    #[test]
    fn a_cell_costs_at_most_90_bytes_beyond_an_operation_aligned_to_8() {
        fn overhead<Op: DelayedOperation>() -> usize {
            std::mem::size_of::<OpCell<Op>>() + 2 * std::mem::size_of::<usize>()
                - std::mem::size_of::<Op>()
        }
        macro_rules! op {
            ($name:ident, $ty:ty) => {
                struct $name(#[allow(dead_code)] $ty);
                impl DelayedOperation for $name {
                    fn try_complete(&mut self) -> bool {
                        false
                    }
                    fn on_complete(&mut self) {}
                }
            };
        }
        op!(Bytes3, [u8; 3]);
        op!(Word, u64);
        op!(Words8, [u64; 8]);
        let got = [
            ("nothing", overhead::<Nothing>()),
            ("[u8; 3]", overhead::<Bytes3>()),
            ("u64", overhead::<Word>()),
            ("[u64; 8]", overhead::<Words8>()),
        ];
        assert!(got.iter().all(|&(_, n)| n <= 90), "{got:?}");
    }
}
