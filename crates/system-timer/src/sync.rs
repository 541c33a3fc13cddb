//! Synchronisation shim: parking_lot + std normally, loom under `--cfg loom`.
//!
//! The only module of the crate that names `parking_lot`, `std::sync`, `std::thread` or `loom`
//! (`clippy.toml` bans them elsewhere). Both halves expose the same surface, except `thread`
//! and `Weak`, which only the reaper and executors use: those are compiled out under loom, where
//! models drive the timer by hand. `Condvar` is in both: the reaper's `Parker` is modelled.
#![allow(
    dead_code,
    unused_imports,
    clippy::disallowed_types,
    clippy::disallowed_methods
)]

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::hint;
    pub(crate) use std::sync::{atomic, Arc, Weak};

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A mutex with parking_lot's API (no poisoning).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Self(parking_lot::Mutex::new(v))
        }
        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable paired with [`Mutex`] (reaper and executor only).
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }
        /// Takes the guard by value, as loom's (and `std`'s) condvar does.
        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }
        pub(crate) fn wait_for<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            d: std::time::Duration,
        ) -> MutexGuard<'a, T> {
            self.0.wait_for(&mut guard, d);
            guard
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub(crate) mod thread {
        pub(crate) use std::thread::JoinHandle;

        /// Spawns a named thread.
        pub(crate) fn spawn_named<F, R>(name: String, f: F) -> std::io::Result<JoinHandle<R>>
        where
            F: FnOnce() -> R + Send + 'static,
            R: Send + 'static,
        {
            std::thread::Builder::new().name(name).spawn(f)
        }
    }

    /// Gives up the CPU in a wait loop.
    pub(crate) fn thread_yield() {
        std::thread::yield_now();
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::hint;
    pub(crate) use loom::sync::{atomic, Arc, MutexGuard};

    /// A mutex with parking_lot's API, over loom's.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Self(loom::sync::Mutex::new(v))
        }
        #[track_caller]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // No poisoning, as parking_lot: a panic in one model thread must not turn every
            // later lock (e.g. in a Drop during unwinding) into an abort.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// A condition variable paired with [`Mutex`], over loom's: only the reaper's [`Parker`]
    /// uses it under loom. A timed wait is a plain wait (loom does not model time).
    ///
    /// [`Parker`]: crate::parker::Parker
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        #[track_caller]
        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|e| e.into_inner())
        }
        #[track_caller]
        pub(crate) fn wait_for<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _d: std::time::Duration,
        ) -> MutexGuard<'a, T> {
            self.wait(guard)
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// Gives up the CPU in a wait loop (lets loom run the thread being waited for).
    pub(crate) fn thread_yield() {
        loom::thread::yield_now();
    }
}

pub(crate) use imp::*;
