//! Errors. Each hands the operation back ([`WatchError::into_inner`]); `Debug` does not need
//! `Op: Debug`.

use std::fmt;

/// Why [`try_complete_else_watch`](crate::Purgatory::try_complete_else_watch) did not take an
/// operation. The operation is handed back, untouched by `on_complete`.
///
/// An operation need only be `Send`, so a `WatchError<Op>` is `Sync` only if `Op` is, and `?`
/// cannot turn the error of an operation that holds, say, a boxed callback into a
/// `Box<dyn Error + Send + Sync>` or an `anyhow::Error`. Take the operation back with
/// [`into_inner`](Self::into_inner), or give it up with [`without_op`](Self::without_op):
///
/// ```
/// use std::time::Duration;
/// use purgatory::{DelayedOperation, Purgatory};
///
/// struct Fetch {
///     respond: Box<dyn FnMut(&'static str) + Send>, // `Send`, not `Sync`
/// }
/// impl DelayedOperation for Fetch {
///     fn try_complete(&mut self) -> bool {
///         false
///     }
///     fn on_complete(&mut self) {
///         (self.respond)("done");
///     }
/// }
///
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// fn park(purgatory: &Purgatory<&'static str, Fetch>, key: &'static str) -> Result<(), BoxError> {
///     let op = Fetch { respond: Box::new(|_| ()) };
///     purgatory
///         .try_complete_else_watch(op, Duration::from_secs(30), &[key])
///         .map_err(|e| e.without_op())?;
///     Ok(())
/// }
///
/// let purgatory = Purgatory::builder().reaper(false).build();
/// assert!(park(&purgatory, "partition-0").is_ok());
/// assert_eq!(purgatory.shutdown().len(), 1);
/// let e = park(&purgatory, "partition-0").unwrap_err();
/// assert_eq!(e.to_string(), "purgatory is shut down");
/// ```
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

    /// The same error with its operation dropped here (never completed): `Send + Sync`
    /// whatever the operation type (see above).
    pub fn without_op(self) -> WatchError<()> {
        match self {
            WatchError::NoKeys(_) => WatchError::NoKeys(()),
            WatchError::Shutdown(_) => WatchError::Shutdown(()),
            WatchError::Full(_) => WatchError::Full(()),
        }
    }

    /// True for [`WatchError::NoKeys`]: the call was wrong, and retrying it cannot help.
    pub fn is_no_keys(&self) -> bool {
        matches!(self, WatchError::NoKeys(_))
    }

    /// True for [`WatchError::Shutdown`].
    pub fn is_shutdown(&self) -> bool {
        matches!(self, WatchError::Shutdown(_))
    }

    /// True for [`WatchError::Full`]: the purgatory still runs; retry later or shed the request.
    pub fn is_full(&self) -> bool {
        matches!(self, WatchError::Full(_))
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

    /// One error of each variant, in declaration order, each with an operation `op` makes.
    fn each<T>(mut op: impl FnMut() -> T) -> [WatchError<T>; 3] {
        [
            WatchError::NoKeys(op()),
            WatchError::Shutdown(op()),
            WatchError::Full(op()),
        ]
    }

    /// `Debug` names the variant and hides the operation (which need not be `Debug`).
    #[test]
    fn debug_names_the_variant_without_the_operation() {
        let texts = each(|| Opaque).map(|e| format!("{e:?}"));
        assert_eq!(texts, ["NoKeys(..)", "Shutdown(..)", "Full(..)"]);
    }

    /// Each `is_*` is true for its own variant only.
    #[test]
    fn each_predicate_is_true_for_its_own_variant_only() {
        let table = each(|| Opaque).map(|e| [e.is_no_keys(), e.is_shutdown(), e.is_full()]);
        assert_eq!(
            table,
            [
                [true, false, false],
                [false, true, false],
                [false, false, true]
            ]
        );
    }

    /// `without_op` keeps the variant and drops the operation then and there.
    #[test]
    fn without_op_keeps_the_variant_and_drops_the_operation() {
        let op = std::sync::Arc::new(());
        let errors = each(|| op.clone()).map(WatchError::without_op);
        assert_eq!(std::sync::Arc::strong_count(&op), 1, "an operation kept");
        assert_eq!(errors, each(|| ()));
    }
}
