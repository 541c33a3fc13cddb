//! Kafka's delayed-operation purgatory for Rust: operations that cannot complete yet (a produce
//! waiting for replicas, a fetch waiting for bytes, a lock wait, a lease) wait here, watched by
//! keys; a check on a key completes the ready ones, and a timer expires the rest. Each operation
//! completes exactly once, whichever way wins.
//!
//! # Hello, world!
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use purgatory::{DelayedOperation, Purgatory};
//!
//! /// A produce with acks=all: done once the high watermark passes its offset.
//! struct DelayedProduce { offset: u64, hw: Arc<AtomicU64> }
//! impl DelayedOperation for DelayedProduce {
//!     fn try_complete(&mut self) -> bool { self.hw.load(Ordering::Acquire) > self.offset }
//!     fn on_complete(&mut self) { println!("produce at {} acknowledged", self.offset) }
//!     fn on_expiration(&mut self) { println!("produce at {} timed out", self.offset) }
//! }
//!
//! let produce: Purgatory<(&str, u32), DelayedProduce> = Purgatory::builder().build();
//! let hw = Arc::new(AtomicU64::new(0));
//! let key = ("orders", 0);
//! let op = DelayedProduce { offset: 10, hw: hw.clone() };
//! let w = produce.try_complete_else_watch(op, Duration::from_secs(30), &[key])?;
//! assert!(!w.completed);
//! hw.store(11, Ordering::Release); // followers caught up
//! assert_eq!(produce.check_and_complete(&key), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Where it goes beyond Kafka's `DelayedOperationPurgatory`
//!
//! * The purgatory owns each operation's completed flag and lock: users implement
//!   [`DelayedOperation::try_complete`] ("ready?") and the purgatory completes, so
//!   `on_complete` runs exactly once and cannot be bypassed.
//! * `try_complete`, `on_complete` and `on_expiration` never run concurrently for one operation
//!   (expiry takes the operation's lock: Kafka's 2025 fix).
//! * A completed operation is dropped at once, not when its other keys are next checked or
//!   purged (KAFKA-19389 / KAFKA-19763); its empty cell is swept later.
//! * While no key is checked, the count-triggered purge waits until the completed operations
//!   also reach the delayed ones, so a sweep walks at most two entries per entry it removes
//!   (Kafka walks every pending entry each `purge_interval` completions: six per removal at
//!   5,000 pending); while keys are checked, it runs at the interval, as Kafka's does.
//! * Completion disarms the timer before the completing call returns: [`Purgatory::delayed`] is
//!   exact.
//! * Time comes from the timer's clock: a purgatory on a manual clock with no reaper thread is
//!   fully deterministic ([`Purgatory::advance`]), purges included.
//! * Shutdown hands back the pending operations; nothing is lost.
//! * Checks can skip operations that cannot complete without taking their locks: an operation
//!   may offer a [`ReadyHint`], a lock-free "maybe ready?" read of shared state. Kafka's
//!   `checkAndComplete` takes every watcher's lock (two atomic read-modify-writes per
//!   operation visited); with hints, W4's `watch` model at 50,000 req/s spends 43% less CPU.
//!   Where operations wait for one key's state to pass a threshold (a produce's offset against
//!   a partition's high watermark), the purgatory's [`Builder::ready_test`] goes further: each
//!   operation's argument ([`DelayedOperation::ready_arg`]) sits beside it in the watch list,
//!   and a check rules it out without reading it at all (W4 `watch` model: a third less
//!   completer CPU than per-operation hints). A test of a type of its own
//!   ([`Builder::with_ready_test`], a [`ReadyTest`] as the purgatory's third type parameter,
//!   like a map's hasher) is called directly, its body inlined into the check's scan: 0.7 ns
//!   per operation ruled out instead of 1.8 through a closure's pointer (in cache), and 5% less
//!   CPU for W4's `watch` model.
//! * A busy purgatory's reaper need not wake every tick (Kafka's wakes for every bucket): with a
//!   [`Builder::reaper_grace`] ([`BUSY_REAPER_GRACE`], 2 ms), while operations keep arriving, the
//!   first `try_complete_else_watch` after a timer bucket is due (whose operation was not ready
//!   at its first try) advances the timer (expiring that bucket's operations on the caller's
//!   thread, with no lock held) and the reaper sleeps through; with no new operations it
//!   expires them at most the grace later.
//!
//! # Implementation
//!
//! Watch lists are copy-on-write vectors in a sharded map (see `watchers.rs`); checks scan a
//! snapshot outside every map lock. Expiry goes through the `system-timer` crate. The ground
//! rules (who holds which lock when) are at the top of `operation.rs` and `watchers.rs`.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms,
    clippy::return_self_not_must_use
)]
#![cfg_attr(loom, allow(dead_code))]

mod error;
mod operation;
mod purgatory;
mod sync;
mod watchers;

pub use error::WatchError;
pub use operation::{DelayedOperation, OperationHandle, ReadyHint};
pub use purgatory::{
    Builder, DynReadyTest, Purgatory, PurgatoryStats, ReadyTest, Watched, BUSY_REAPER_GRACE,
    DEFAULT_PURGE_INTERVAL, DEFAULT_REAPER_GRACE, DEFAULT_SHARDS, MAX_SHARDS,
};

/// The timer crate this purgatory runs on, re-exported: its [`ManualClock`](system_timer::ManualClock)
/// for [`Builder::clock`], its [`SystemTimer`](system_timer::SystemTimer) for [`Builder::timer`]
/// and the [`BuildError`](system_timer::BuildError) [`Builder::try_build`] returns, without a
/// dependency of your own to keep in step with this one's.
pub use system_timer;

/// What `#[must_use]` guards, checked: each `compile_fail` case is the example before it with
/// the result left unused, under `deny(unused_must_use)`, so it fails only for that.
///
/// A [`Builder`] method's result (a builder does nothing until it is built):
/// ```
/// #![deny(unused_must_use)]
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let builder = purgatory::Purgatory::<u32, Op>::builder();
/// let _builder = builder.purge_interval(100);
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let builder = purgatory::Purgatory::<u32, Op>::builder();
/// builder.purge_interval(100);
/// ```
/// The handles [`Purgatory::cancel_for_key`] returns (an operation watched on no other key is
/// reachable only through its handle), the operations [`Purgatory::shutdown`] and
/// [`OperationHandle::take`] hand back (never completed):
/// ```
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let p = purgatory::Purgatory::<u32, Op>::builder().reaper(false).build();
/// let w = p.try_complete_else_watch(Op, Duration::from_secs(30), &[1]).unwrap();
/// let _handles = p.cancel_for_key(&1);
/// let _op = w.handle.take();
/// let _pending = p.shutdown();
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let p = purgatory::Purgatory::<u32, Op>::builder().reaper(false).build();
/// let _w = p.try_complete_else_watch(Op, Duration::from_secs(30), &[1]).unwrap();
/// p.cancel_for_key(&1);
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use std::time::Duration;
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let p = purgatory::Purgatory::<u32, Op>::builder().reaper(false).build();
/// let w = p.try_complete_else_watch(Op, Duration::from_secs(30), &[1]).unwrap();
/// w.handle.take();
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # struct Op;
/// # impl purgatory::DelayedOperation for Op {
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self) {}
/// # }
/// let p = purgatory::Purgatory::<u32, Op>::builder().reaper(false).build();
/// p.shutdown();
/// ```
#[cfg(doctest)]
pub struct MustUse;
