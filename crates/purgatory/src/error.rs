//! Errors. Each hands the operation back ([`WatchError::into_inner`]); `Debug` does not need
//! `Op: Debug`.

use std::fmt;

/// Why [`try_complete_else_watch`](crate::Purgatory::try_complete_else_watch) did not take an
/// operation. The operation is handed back, untouched by `on_complete`.
#[derive(PartialEq, Eq)]
pub enum WatchError<Op> {
    /// The key set was empty: an operation nobody can ever check would only ever expire (Kafka
    /// rejects this too).
    NoKeys(Op),
    /// The purgatory (or its timer) has been shut down.
    Shutdown(Op),
    /// The timer is at its [`max_pending`](system_timer::Builder::max_pending) limit (a shared
    /// timer built with one): it could not be armed, so it was not taken. The purgatory is
    /// still running: retry later, or shed the request.
    Full(Op),
}

impl<Op> WatchError<Op> {
    /// The operation that was not taken.
    pub fn into_inner(self) -> Op {
        match self {
            WatchError::NoKeys(op) | WatchError::Shutdown(op) | WatchError::Full(op) => op,
        }
    }
}

impl<Op> fmt::Debug for WatchError<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::NoKeys(_) => f.write_str("NoKeys(..)"),
            WatchError::Shutdown(_) => f.write_str("Shutdown(..)"),
            WatchError::Full(_) => f.write_str("Full(..)"),
        }
    }
}

impl<Op> fmt::Display for WatchError<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::NoKeys(_) => {
                f.write_str("an operation must be watched by at least one key")
            }
            WatchError::Shutdown(_) => f.write_str("purgatory is shut down"),
            WatchError::Full(_) => {
                f.write_str("the purgatory's timer is at its limit of pending tasks")
            }
        }
    }
}

impl<Op> std::error::Error for WatchError<Op> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation with no `Debug` of its own.
    struct Opaque;

    /// `Debug` names the variant and hides the operation (which need not be `Debug`).
    #[test]
    fn debug_names_the_variant_without_the_operation() {
        let texts = [
            WatchError::NoKeys(Opaque),
            WatchError::Shutdown(Opaque),
            WatchError::Full(Opaque),
        ]
        .map(|e| format!("{e:?}"));
        assert_eq!(texts, ["NoKeys(..)", "Shutdown(..)", "Full(..)"]);
    }
}
