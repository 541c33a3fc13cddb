//! Delayed operations watched by keys (see the purgatory issue).
#![warn(missing_docs)]
