//! What a timer runs.

use std::fmt;

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

/// A boxed closure: the default task type of a
/// [`SystemTimer`](crate::SystemTimer), built from any `FnOnce() + Send + 'static` with `into()`
/// (which is what [`SystemTimer::add`](crate::SystemTimer::add) does).
///
/// ```
/// use system_timer::{Task, TimerTask};
/// let t: Task = (|| println!("hello")).into();
/// t.run();
/// ```
pub struct Task(Box<dyn FnOnce() + Send + 'static>);

impl Task {
    /// Boxes a closure.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Task(Box::new(f))
    }
}

impl<F: FnOnce() + Send + 'static> From<F> for Task {
    fn from(f: F) -> Self {
        Task(Box::new(f))
    }
}

impl TimerTask for Task {
    #[inline]
    fn run(self) {
        (self.0)()
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Task { .. }")
    }
}
