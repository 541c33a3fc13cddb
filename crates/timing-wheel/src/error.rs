//! Errors. Each error that carries a value hands it back (`into_inner`), and its `Debug` does not
//! require `T: Debug` (as crossbeam-channel's `SendError<T>`).

use std::fmt;

/// Why a wheel could not be built: the programmer errors of DESIGN.md, rejected at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The tick is zero.
    ZeroTick,
    /// The wheel size is below 2 (a wheel of one bucket cannot tell its slots apart).
    WheelSizeTooSmall(usize),
    /// The wheel size is above [`MAX_WHEEL_SIZE`](crate::MAX_WHEEL_SIZE).
    WheelSizeTooLarge(usize),
    /// `tick × wheel_size`, the span of the first level, does not fit in a `u64`.
    SpanOverflow {
        /// The tick asked for.
        tick: u64,
        /// The wheel size asked for.
        wheel_size: usize,
    },
    /// A concurrent wheel needs between 1 and [`MAX_SHARDS`](crate::MAX_SHARDS) shards.
    BadShardCount(usize),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::ZeroTick => f.write_str("timing wheel tick must be at least 1"),
            ConfigError::WheelSizeTooSmall(n) => {
                write!(f, "timing wheel size must be at least 2 (got {n})")
            }
            ConfigError::WheelSizeTooLarge(n) => write!(
                f,
                "timing wheel size must be at most {} (got {n})",
                crate::MAX_WHEEL_SIZE
            ),
            ConfigError::SpanOverflow { tick, wheel_size } => write!(
                f,
                "timing wheel span tick × wheel_size = {tick} × {wheel_size} overflows u64"
            ),
            ConfigError::BadShardCount(n) => write!(
                f,
                "a concurrent wheel needs 1..={} shards (got {n})",
                crate::MAX_SHARDS
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why [`add`](crate::TimingWheel::add) did not schedule an entry. The value is handed back.
///
/// The error of a value that is `Send` but not `Sync` (a boxed callback, say) is not `Sync`
/// either, so `?` cannot turn it into a `Box<dyn Error + Send + Sync>` or an `anyhow::Error`:
/// take the value back with [`into_inner`](Self::into_inner), or give it up with
/// [`without_value`](Self::without_value).
#[derive(PartialEq, Eq)]
pub enum AddError<T> {
    /// The deadline is not after the wheel's current time: the entry is already due. Kafka's
    /// `TimingWheel.add` returns `false` here and the caller runs the task at once.
    Expired(T),
    /// The wheel was closed (see [`WheelGuard::close`](crate::WheelGuard::close)).
    Closed(T),
}

impl<T> AddError<T> {
    /// The value that was not scheduled.
    pub fn into_inner(self) -> T {
        match self {
            AddError::Expired(v) | AddError::Closed(v) => v,
        }
    }

    /// The same error with its value dropped here: `Send + Sync` whatever the value's type.
    pub fn without_value(self) -> AddError<()> {
        match self {
            AddError::Expired(_) => AddError::Expired(()),
            AddError::Closed(_) => AddError::Closed(()),
        }
    }

    /// True for [`AddError::Expired`].
    pub fn is_expired(&self) -> bool {
        matches!(self, AddError::Expired(_))
    }

    /// True for [`AddError::Closed`].
    pub fn is_closed(&self) -> bool {
        matches!(self, AddError::Closed(_))
    }
}

impl<T> fmt::Debug for AddError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Expired(_) => f.write_str("Expired(..)"),
            AddError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for AddError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Expired(_) => f.write_str("deadline already reached"),
            AddError::Closed(_) => f.write_str("timing wheel is closed"),
        }
    }
}

impl<T> std::error::Error for AddError<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value with no `Debug` of its own.
    struct Opaque;

    /// `Debug` names the variant and hides the value; `Display` says why it was refused.
    #[test]
    fn add_error_debug_and_display_name_the_reason_without_the_value() {
        let debug = [AddError::Expired(Opaque), AddError::Closed(Opaque)].map(|e| format!("{e:?}"));
        assert_eq!(debug, ["Expired(..)", "Closed(..)"]);
        let display = [AddError::Expired(Opaque), AddError::Closed(Opaque)].map(|e| e.to_string());
        assert_eq!(
            display,
            ["deadline already reached", "timing wheel is closed"]
        );
    }

    /// `is_expired` is true for an entry already due and false for one refused by a closed
    /// wheel (which must not be run at once as a due one would); `is_closed` the other way round.
    #[test]
    fn is_expired_and_is_closed_tell_a_due_entry_from_a_closed_wheel() {
        assert!(AddError::Expired(Opaque).is_expired());
        assert!(!AddError::Closed(Opaque).is_expired());
        assert!(AddError::Closed(Opaque).is_closed());
        assert!(!AddError::Expired(Opaque).is_closed());
    }

    /// `without_value` keeps the variant and drops the value then and there.
    #[test]
    fn without_value_keeps_the_variant_and_drops_the_value() {
        let value = std::sync::Arc::new(());
        let errors = [
            AddError::Expired(value.clone()).without_value(),
            AddError::Closed(value.clone()).without_value(),
        ];
        assert_eq!(std::sync::Arc::strong_count(&value), 1, "a value kept");
        assert_eq!(errors, [AddError::Expired(()), AddError::Closed(())]);
    }
}
