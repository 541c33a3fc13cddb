//! Errors. Each error that carries a task hands it back ([`ScheduleError::into_inner`]), and its
//! `Debug` does not require `T: Debug` (as crossbeam-channel's `SendError<T>`).

use std::fmt;

/// Why a task was not scheduled. The task is handed back, never dropped.
///
/// A `ScheduleError<Task>` holds a boxed closure, which need only be `Send`, so the error is
/// `Send` but not `Sync` (as `std::sync::mpsc::SendError<T>`), and `?` cannot turn it into a
/// `Box<dyn Error + Send + Sync>` or an `anyhow::Error`. Take the task back with
/// [`into_inner`](Self::into_inner), or give it up with [`without_task`](Self::without_task):
///
/// ```
/// use std::time::Duration;
/// use system_timer::SystemTimer;
///
/// fn arm(timer: &SystemTimer) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     timer
///         .add(Duration::from_secs(30), || println!("lease expired"))
///         .map_err(|e| e.without_task())?;
///     Ok(())
/// }
///
/// let timer = SystemTimer::builder().reaper(false).build();
/// assert!(arm(&timer).is_ok());
/// assert_eq!(timer.shutdown().len(), 1);
/// let e = arm(&timer).unwrap_err();
/// assert_eq!(e.to_string(), "timer is shut down");
/// ```
#[derive(PartialEq, Eq)]
pub enum ScheduleError<T> {
    /// The timer has been shut down.
    Shutdown(T),
    /// The timer's wheel already holds its configured maximum of waiting tasks
    /// ([`Builder::max_pending`](crate::Builder::max_pending)).
    Full(T),
}

impl<T> ScheduleError<T> {
    /// The task that was not scheduled.
    pub fn into_inner(self) -> T {
        match self {
            ScheduleError::Shutdown(t) | ScheduleError::Full(t) => t,
        }
    }

    /// The same error with its task dropped here: `Send + Sync` whatever the task type (see
    /// above).
    pub fn without_task(self) -> ScheduleError<()> {
        match self {
            ScheduleError::Shutdown(_) => ScheduleError::Shutdown(()),
            ScheduleError::Full(_) => ScheduleError::Full(()),
        }
    }

    /// True if the timer was shut down.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, ScheduleError::Shutdown(_))
    }

    /// True if the pending cap was reached.
    pub fn is_full(&self) -> bool {
        matches!(self, ScheduleError::Full(_))
    }
}

impl<T> fmt::Debug for ScheduleError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Shutdown(_) => f.write_str("Shutdown(..)"),
            ScheduleError::Full(_) => f.write_str("Full(..)"),
        }
    }
}

impl<T> fmt::Display for ScheduleError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Shutdown(_) => f.write_str("timer is shut down"),
            ScheduleError::Full(_) => f.write_str("timer is full (max_pending reached)"),
        }
    }
}

impl<T> std::error::Error for ScheduleError<T> {}

/// Why a timer could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The tick is zero, or below one nanosecond.
    ZeroTick,
    /// The wheel was rejected (wheel size out of range, span overflow, or a
    /// [`shards`](crate::Builder::shards) count out of range).
    Wheel(timing_wheel::ConfigError),
    /// Executor mode with zero threads (use [`Builder::inline`](crate::Builder::inline) to run
    /// tasks on the advancing thread instead).
    NoExecutorThreads,
    /// More executor threads than [`MAX_EXECUTOR_THREADS`](crate::MAX_EXECUTOR_THREADS) (the
    /// count asked for): refused before any thread is spawned.
    TooManyExecutorThreads(usize),
    /// A thread could not be spawned.
    Spawn(String),
    /// Under `--cfg loom`, timers must be built with `.reaper(false)`: loom cannot model real
    /// time or blocking threads (and a loom build always runs tasks inline).
    LoomNeedsManualDriving,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::ZeroTick => f.write_str("timer tick must be at least 1 ns"),
            BuildError::Wheel(e) => write!(f, "{e}"),
            BuildError::NoExecutorThreads => {
                f.write_str("executor needs at least 1 thread (or use .inline())")
            }
            BuildError::TooManyExecutorThreads(n) => write!(
                f,
                "{n} executor threads asked for (`executor_threads`, or a purgatory's \
                 `expiry_threads`), at most {} allowed",
                crate::MAX_EXECUTOR_THREADS
            ),
            BuildError::Spawn(e) => write!(f, "could not spawn a timer thread: {e}"),
            BuildError::LoomNeedsManualDriving => {
                f.write_str("under loom, build timers with .reaper(false)")
            }
        }
    }
}

impl std::error::Error for BuildError {}

impl From<timing_wheel::ConfigError> for BuildError {
    fn from(e: timing_wheel::ConfigError) -> Self {
        BuildError::Wheel(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task with no `Debug` of its own.
    struct Opaque;

    /// `Debug` names the variant and hides the task (which need not be `Debug`).
    #[test]
    fn schedule_error_debug_names_the_variant_without_the_task() {
        let texts = [ScheduleError::Shutdown(Opaque), ScheduleError::Full(Opaque)]
            .map(|e| format!("{e:?}"));
        assert_eq!(texts, ["Shutdown(..)", "Full(..)"]);
    }

    /// `is_shutdown` and `is_full` are each true for their own variant only.
    #[test]
    fn is_shutdown_and_is_full_are_true_for_their_own_variant_only() {
        let table = [ScheduleError::Shutdown(Opaque), ScheduleError::Full(Opaque)]
            .map(|e| [e.is_shutdown(), e.is_full()]);
        assert_eq!(table, [[true, false], [false, true]]);
    }

    /// `Display` says why the task was refused.
    #[test]
    fn schedule_error_display_says_why() {
        let texts =
            [ScheduleError::Shutdown(Opaque), ScheduleError::Full(Opaque)].map(|e| e.to_string());
        assert_eq!(
            texts,
            ["timer is shut down", "timer is full (max_pending reached)"]
        );
    }

    /// `is_shutdown` and `is_full` each hold for their own variant only (a caller retries a
    /// full timer, never a shut-down one).
    #[test]
    fn is_shutdown_and_is_full_tell_the_variants_apart() {
        let shutdown = ScheduleError::Shutdown(Opaque);
        assert!(shutdown.is_shutdown() && !shutdown.is_full());
        let full = ScheduleError::Full(Opaque);
        assert!(full.is_full() && !full.is_shutdown());
    }

    /// `without_task` keeps the variant and drops the task then and there.
    #[test]
    fn without_task_keeps_the_variant_and_drops_the_task() {
        let task = std::sync::Arc::new(());
        let shutdown = ScheduleError::Shutdown(task.clone()).without_task();
        assert_eq!(std::sync::Arc::strong_count(&task), 1, "the task kept");
        assert_eq!(shutdown, ScheduleError::Shutdown(()));
        let full = ScheduleError::Full(task.clone()).without_task();
        assert_eq!(std::sync::Arc::strong_count(&task), 1, "the task kept");
        assert_eq!(full, ScheduleError::Full(()));
    }
}
