//! What a timer runs.

use std::fmt;
use std::sync::Arc;

/// Work a timer runs once its deadline is reached. Implemented for every `FnOnce() + Send`
/// closure; implement it for your own type to schedule tasks without boxing (a timer is generic
/// over its task type, [`Task`] by default).
///
/// ```
/// use system_timer::TimerTask;
/// struct Expire(u64);
/// impl TimerTask for Expire {
///     fn run(self) {
///         println!("session {} expired", self.0);
///     }
/// }
/// ```
pub trait TimerTask: Send + 'static {
    /// Runs the task. A panic is caught and counted by the timer.
    fn run(self);
}

impl<F: FnOnce() + Send + 'static> TimerTask for F {
    #[inline]
    fn run(self) {
        self()
    }
}

/// The default task type of a [`SystemTimer`](crate::SystemTimer): a boxed closure, built from
/// any `FnOnce() + Send + 'static` with `into()` (which is what
/// [`SystemTimer::add`](crate::SystemTimer::add) does), or an `Arc` of a [`SharedTask`]
/// ([`Task::from_arc`]: no allocation per task).
///
/// ```
/// use system_timer::{Task, TimerTask};
/// let t: Task = (|| println!("hello")).into();
/// t.run();
/// ```
pub struct Task(Repr);

enum Repr {
    Boxed(Box<dyn FnOnce() + Send + 'static>),
    Shared(Arc<dyn SharedTask>),
}

/// Work kept in an `Arc` that a timer runs through the `Arc` itself: for objects that already
/// live in one (an operation waiting for its timeout, say), scheduling it as a [`Task`] with
/// [`Task::from_arc`] costs a reference count instead of a box per task.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use system_timer::{SharedTask, Task, TimerTask};
///
/// struct Lease(AtomicBool);
/// impl SharedTask for Lease {
///     fn run_shared(self: Arc<Self>) {
///         self.0.store(true, Ordering::Release); // expired
///     }
/// }
/// let lease = Arc::new(Lease(AtomicBool::new(false)));
/// Task::from_arc(lease.clone()).run();
/// assert!(lease.0.load(Ordering::Acquire));
/// ```
pub trait SharedTask: Send + Sync + 'static {
    /// Runs the task (the timer hands over its reference).
    fn run_shared(self: Arc<Self>);
}

impl Task {
    /// Boxes a closure.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Task(Repr::Boxed(Box::new(f)))
    }

    /// A task that runs `task` through this reference to it: no allocation.
    pub fn from_arc(task: Arc<impl SharedTask>) -> Self {
        Task(Repr::Shared(task))
    }
}

impl<F: FnOnce() + Send + 'static> From<F> for Task {
    fn from(f: F) -> Self {
        Task::new(f)
    }
}

impl TimerTask for Task {
    #[inline]
    fn run(self) {
        match self.0 {
            Repr::Boxed(f) => f(),
            Repr::Shared(t) => t.run_shared(),
        }
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Task { .. }")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Debug` of a task shows neither closure nor shared object, whichever it holds.
    #[test]
    fn task_debug_is_opaque() {
        struct Noop;
        impl SharedTask for Noop {
            fn run_shared(self: Arc<Self>) {}
        }
        let boxed = format!("{:?}", Task::new(|| ()));
        let shared = format!("{:?}", Task::from_arc(Arc::new(Noop)));
        assert_eq!([boxed, shared], ["Task { .. }", "Task { .. }"]);
    }

    /// Any `FnOnce() + Send` closure is a `TimerTask` (a timer may take closures as its task
    /// type), and its `run` calls it.
    #[test]
    fn a_closure_runs_as_a_timer_task() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let ran = Arc::new(AtomicBool::new(false));
        let r = Arc::clone(&ran);
        TimerTask::run(move || r.store(true, Ordering::SeqCst));
        assert!(ran.load(Ordering::SeqCst), "the closure did not run");
    }
}
