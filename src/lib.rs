//! The root package of the workspace: the load generator (the main job), the workloads of
//! BENCHMARKS.md as library code (so tests can run small versions of them), and a re-export of
//! the `timing-wheel` crate.
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub use timing_wheel;

pub mod broker;
pub mod churn;
pub mod completion;
pub mod done_log;
pub mod idle;
pub mod load;
pub mod measure;
pub mod parallel;
pub mod precision;
pub mod rng;

/// README.md's examples, compiled and run as doc tests (`cargo test --doc`), so they cannot go
/// stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
