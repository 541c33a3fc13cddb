//! A Kafka-style hierarchical timing wheel: O(1) add, O(1) cancel that frees the entry at once,
//! overflow levels created on demand, and no ticking through empty time.
//!
//! # Hello, world!
//!
//! ```
//! use timing_wheel::TimingWheel;
//!
//! // Kafka's defaults: a 1 ms tick and 20 buckets per level; time starts at 0.
//! let mut wheel = TimingWheel::new(1, 20, 0)?;
//! wheel.add(3, "hello")?;
//! let lease = wheel.add(30_000, "lease expired")?;
//! wheel.cancel(lease); // renewed: gone at once, its memory reused
//!
//! let mut out = Vec::new();
//! wheel.advance(5, |fired| out.push(fired.value));
//! assert_eq!(out, ["hello"]);
//! assert!(wheel.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two wheels share one core:
//!
//! * [`TimingWheel`]: single-threaded, `&mut self`, no locks or atomics; the caller supplies
//!   `now` (an engine's own event loop) and asks [`TimingWheel::next_expiration`] when to come
//!   back.
//! * [`ConcurrentWheel`]: adds and cancels through `&self` from any thread (an
//!   [`EntryHandle`] cancels from anywhere), advanced by one party holding
//!   [`ConcurrentWheel::lock`]. The `system-timer` crate drives it with a reaper thread.
//!
//! # Implementation
//!
//! Level `k` has `n` buckets (the wheel size), each `tick · n^k` wide, so it spans `tick · n^(k+1)`.
//! With Kafka's defaults (tick 1 ms, n = 20):
//!
//! ```text
//! level  bucket width   span (window)   created
//!   0         1 ms          20 ms       on the first add
//!   1        20 ms         400 ms       on the first deadline ≥ 20 ms ahead
//!   2       400 ms           8 s        ...
//!   3         8 s          160 s
//!   4       160 s        53.3 min
//!   …                                   the top level's window is unbounded (u64 saturates)
//! ```
//!
//! * An entry goes to the finest level whose window holds its deadline, in slot
//!   `⌊deadline / width⌋ mod n` (the absolute virtual id, as Kafka). A bucket's expiration is
//!   the start of its slot; when a coarse bucket comes due its entries cascade to finer levels,
//!   and entries whose deadline has been reached are handed out.
//! * Deadlines are rounded **up** to the tick before placement, so nothing is handed out before
//!   its deadline; with whole-tick deadlines this is exactly Kafka's rule ("expired when
//!   `deadline < current + tick`").
//! * An expiry queue (Kafka's `DelayQueue` of buckets) holds each non-empty bucket once, under
//!   its expiration: never entries, so it stays within `levels × n` items, and idle time costs
//!   nothing (advance jumps straight to the next due bucket).
//! * Each bucket is a circular doubly linked list with a sentinel head. The lists are linked by
//!   `u32` index through a paged arena of nodes rather than by pointer, so an entry costs one
//!   node (no allocation of its own once the arena has grown) and an [`EntryKey`] is 8 bytes.
//!   Cancel unlinks the node and releases the value at once; the node is reused by the next add.
//! * All `unsafe` code is in one private module (the arena's `MaybeUninit` payloads), with its
//!   rules stated at the top; loom models and valgrind runs cover it through the public API.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms,
    clippy::return_self_not_must_use
)]
#![cfg_attr(loom, allow(dead_code))]

mod bucket;
mod concurrent;
mod error;
mod list;
mod shard;
mod sync;
mod unwind;
mod wheel;

pub use bucket::{Bucket, MAX_WHEEL_SIZE};
pub use concurrent::{Added, ConcurrentWheel, EntryHandle, WheelGuard, WheelKey, MAX_SHARDS};
pub use error::{AddError, ConfigError};
pub use list::EntryKey;
pub use shard::{Fired, WheelCounts};
pub use wheel::TimingWheel;

/// What `#[must_use]` guards, checked: each `compile_fail` case is the example before it with
/// the result left unused, under `deny(unused_must_use)`, so it fails only for that.
///
/// A [`WheelGuard`] dropped at once unlocks the wheel at once:
/// ```
/// #![deny(unused_must_use)]
/// let wheel = timing_wheel::ConcurrentWheel::<u32>::new(1, 20, 0).unwrap();
/// let _guard = wheel.lock();
/// ```
/// ```compile_fail
/// #![deny(unused_must_use)]
/// let wheel = timing_wheel::ConcurrentWheel::<u32>::new(1, 20, 0).unwrap();
/// wheel.lock();
/// ```
#[cfg(doctest)]
pub struct MustUse;
