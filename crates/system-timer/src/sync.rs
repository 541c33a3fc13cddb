//! Synchronisation shim: parking_lot + std normally, loom under `--cfg loom`.
//!
//! The only module of the crate that names `parking_lot`, `std::sync`, `std::thread` or `loom`
//! (`clippy.toml` bans them elsewhere). Both halves expose the same surface, except `Weak`
//! (the clock's waker, not modelled) and `thread_yield`'s loom meaning. `Condvar` is in both:
//! the reaper's `Parker` and the executors' semaphore are modelled; so is `thread`, under loom
//! for the executor threads a model's timer may start (`Builder::model_executors`).
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

    /// Under loom, makes the executors' channel visible to loom (see the loom half); nothing
    /// here.
    #[derive(Debug, Default)]
    pub(crate) struct ChannelTrace;

    impl ChannelTrace {
        pub(crate) fn new() -> Self {
            ChannelTrace
        }
        #[inline(always)]
        pub(crate) fn op(&self) {}
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

    /// Makes the operations on the executors' crossbeam channel visible to loom, which does not
    /// see crossbeam's own atomics: [`op`](Self::op), called right before each send, receive
    /// and disconnection, is a read-modify-write of one loom atomic, and the channel operation
    /// runs with it (loom switches threads only at its own operations). So loom orders any two
    /// channel operations as it orders their `op`s, exploring both orders of a send and a
    /// receive (without it, it saw no conflict between them and tried one order only), and a
    /// receive that finds a batch happens after its send, as crossbeam's release and acquire
    /// make it.
    #[derive(Debug)]
    pub(crate) struct ChannelTrace(loom::sync::atomic::AtomicUsize);

    impl Default for ChannelTrace {
        fn default() -> Self {
            Self::new()
        }
    }

    impl ChannelTrace {
        pub(crate) fn new() -> Self {
            Self(loom::sync::atomic::AtomicUsize::new(0))
        }
        pub(crate) fn op(&self) {
            self.0.fetch_add(1, loom::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Loom threads: the executors of a model's timer ([`Builder::model_executors`]).
    ///
    /// [`Builder::model_executors`]: crate::Builder::model_executors
    pub(crate) mod thread {
        pub(crate) use loom::thread::JoinHandle;

        /// Spawns a named loom thread.
        pub(crate) fn spawn_named<F, R>(name: String, f: F) -> std::io::Result<JoinHandle<R>>
        where
            F: FnOnce() -> R + Send + 'static,
            R: Send + 'static,
        {
            loom::thread::Builder::new().name(name).spawn(f)
        }
    }
}

pub(crate) use imp::*;
