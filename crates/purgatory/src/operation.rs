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
//! * `completed` goes `false → true` exactly once, under the op lock, by [`OpCell::complete_locked`]
//!   (or by a hand-back at shutdown). Whoever sets it runs `on_complete` (then `on_expiration` if
//!   expiry won) in the same lock hold, so `on_complete` runs exactly once. `try_complete` is
//!   never called once `completed` is set (every caller checks it under the lock first).
//! * Completion disarms the timer entry (cancel, in the same lock hold) and **drops the
//!   operation** at once: what is left in other keys' watch lists is an empty cell until a check
//!   or the purge sweeps it (KAFKA-19389 / KAFKA-19763: completed operations must not pin memory).
//! * Lock order: op lock → timer shard lock (arming, disarming). The timer never calls into an
//!   operation while holding its own locks (expiry runs on an executor, after the timer's locks
//!   are released), and the watch map's locks are never held while an op lock is taken by the
//!   checking side, so no cycle exists (R7 in LOOM.md).
//!
//! # State machine
//!
//! ```text
//! PENDING (op held) ──try_complete()=true / force_complete / expiry──▶ COMPLETED (op dropped)
//!        └──────────────────────shutdown / failed watch───────────────▶ HANDED BACK (op returned)
//! ```

use std::fmt;

use system_timer::{Task, TimerHandle};

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex, MutexGuard};

/// An operation that waits in a [`Purgatory`](crate::Purgatory) until it can complete, or until
/// its timeout expires.
///
/// All three methods run under the operation's own lock, so they never run concurrently for the
/// same operation, and take `&mut self`: plain fields are enough for the operation's state.
///
/// ```
/// use purgatory::DelayedOperation;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// /// Completes once the high watermark reaches `offset`.
/// struct DelayedProduce {
///     offset: u64,
///     high_watermark: Arc<AtomicU64>,
///     timed_out: bool,
///     respond: Box<dyn FnMut(&'static str) + Send>,
/// }
///
/// impl DelayedOperation for DelayedProduce {
///     fn try_complete(&mut self) -> bool {
///         self.high_watermark.load(Ordering::Acquire) >= self.offset
///     }
///     fn on_complete(&mut self) {
///         (self.respond)(if self.timed_out { "REQUEST_TIMED_OUT" } else { "NONE" });
///     }
///     fn on_expiration(&mut self) {
///         // Runs after on_complete when the timeout won; only meters here, as in Kafka.
///     }
/// }
/// ```
pub trait DelayedOperation: Send + 'static {
    /// Says whether the operation can complete now. Return `true` when ready: the purgatory then
    /// completes it (calls [`on_complete`](Self::on_complete)) in the same lock hold. Never
    /// called again once the operation has completed.
    fn try_complete(&mut self) -> bool;

    /// Called exactly once, when the operation completes, whichever way: ready at the first
    /// try, ready at a check on one of its keys, forced through its handle, or expired.
    fn on_complete(&mut self);

    /// Called after [`on_complete`](Self::on_complete), only when the timeout completed the
    /// operation. Default: nothing.
    fn on_expiration(&mut self) {}
}

/// How an operation completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// `try_complete` said ready, or a forced completion.
    Completed,
    /// The timeout fired first.
    Expired,
}

/// Counters shared by a purgatory's operations.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Operations armed in the timer and not completed (Kafka's `numDelayed`).
    pub(crate) delayed: AtomicUsize,
    /// Watched operations completed since the last purge: an upper bound on the empty cells
    /// left in watch lists (Kafka's `estimatedTotalOperations - numDelayed`).
    pub(crate) garbage: AtomicUsize,
    /// Operations completed, by any path.
    pub(crate) completed: AtomicUsize,
    /// Operations completed by expiry.
    pub(crate) expired: AtomicUsize,
}

/// What the op lock guards.
pub(crate) struct OpState<Op> {
    /// The operation, while pending.
    pub(crate) op: Option<Op>,
    /// Its timer entry, while armed.
    pub(crate) timer: Option<TimerHandle<Task>>,
    /// True once it has been added to a watch list.
    pub(crate) watched: bool,
}

/// One operation and its lock (see the ground rules).
pub(crate) struct OpCell<Op> {
    completed: AtomicBool,
    state: Mutex<OpState<Op>>,
    counters: Arc<Counters>,
}

impl<Op: DelayedOperation> OpCell<Op> {
    pub(crate) fn new(op: Op, counters: Arc<Counters>) -> Self {
        OpCell {
            completed: AtomicBool::new(false),
            state: Mutex::new(OpState {
                op: Some(op),
                timer: None,
                watched: false,
            }),
            counters,
        }
    }

    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::Acquire)
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
        self.completed.store(true, Ordering::Release);
        if let Some(timer) = st.timer.take() {
            if how == How::Completed {
                timer.cancel();
            }
            self.counters.delayed.fetch_sub(1, Ordering::AcqRel);
        }
        if st.watched {
            self.counters.garbage.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.completed.fetch_add(1, Ordering::Relaxed);
        if how == How::Expired {
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
        }
        let mut op = st.op.take().expect("a pending operation holds its op");
        op.on_complete();
        if how == How::Expired {
            op.on_expiration();
        }
        // `op` (the payload) is dropped here: completion releases it at once.
    }

    /// Under the op lock: takes a pending operation out without completing it (shutdown, or a
    /// watch refused because the purgatory closed). Disarms its timer.
    pub(crate) fn hand_back_locked(&self, st: &mut OpState<Op>) -> Op {
        debug_assert!(!self.is_completed());
        self.completed.store(true, Ordering::Release);
        if let Some(timer) = st.timer.take() {
            timer.cancel();
            self.counters.delayed.fetch_sub(1, Ordering::AcqRel);
        }
        st.op.take().expect("a pending operation holds its op")
    }

    /// The timer's task: completes the operation by expiry unless something else won, or its
    /// timer was disarmed meanwhile. Only an armed operation expires: every completion and
    /// `cancel_for_key` take the timer handle under this lock, so an expiry task the timer had
    /// already dispatched when `cancel_for_key` ran finds it gone and does nothing.
    pub(crate) fn expire(&self) {
        let mut st = self.lock();
        if !self.is_completed() && st.timer.is_some() {
            self.complete_locked(&mut st, How::Expired);
        }
    }
}

/// A handle on an operation in a purgatory: complete it by force, or ask whether it completed.
/// Cloning it is cheap (it shares the operation).
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
        let mut st = self.cell.lock();
        if self.cell.is_completed() {
            return false;
        }
        self.cell.complete_locked(&mut st, How::Completed);
        true
    }

    /// True once the operation has completed (or was handed back by a shutdown).
    #[doc(alias = "isCompleted")]
    pub fn is_completed(&self) -> bool {
        self.cell.is_completed()
    }

    /// Runs `f` on the operation under its lock, while it is pending; `None` once completed.
    pub fn with<R>(&self, f: impl FnOnce(&Op) -> R) -> Option<R> {
        self.cell.lock().op.as_ref().map(f)
    }
}

impl<Op> Clone for OperationHandle<Op> {
    fn clone(&self) -> Self {
        OperationHandle {
            cell: Arc::clone(&self.cell),
        }
    }
}

impl<Op> fmt::Debug for OperationHandle<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationHandle")
            .field("completed", &self.cell.completed.load(Ordering::Relaxed))
            .finish()
    }
}
