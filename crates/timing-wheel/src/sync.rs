//! Synchronisation shim: parking_lot + std normally, loom under `--cfg loom`.
//!
//! This is the only module of the crate that names `parking_lot`, `std::sync` or `loom`
//! (`clippy.toml` bans them elsewhere). Both halves expose exactly the same surface.
#![allow(
    dead_code,
    unused_imports,
    clippy::disallowed_types,
    clippy::disallowed_methods
)]

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::{atomic, Arc};

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
        #[inline]
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut()
        }
    }

    /// A small per-thread number, assigned round-robin on a thread's first call; the concurrent
    /// wheel uses it to give each thread its own shard.
    #[inline]
    pub(crate) fn thread_hint() -> usize {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static HINT: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        HINT.with(|h| {
            let v = h.get();
            if v != usize::MAX {
                return v;
            }
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            h.set(v);
            v
        })
    }
}

#[cfg(loom)]
mod imp {
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
        #[track_caller]
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// Under loom every model thread gets a stable number from its loom thread id, so models
    /// with several shards put different threads on different shards deterministically.
    pub(crate) fn thread_hint() -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        loom::thread::current().id().hash(&mut h);
        h.finish() as usize
    }
}

pub(crate) use imp::*;

// Not under loom (threads outside a model). Two attributes, not `cfg(all(..))`: cargo-mutants
// recognises only a plain `#[cfg(test)]` as test code.
#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;

    /// A thread keeps one hint for all its calls, and two threads get different hints (so the
    /// concurrent wheel's `add` puts them on different shards while there are enough).
    #[test]
    fn each_thread_keeps_a_hint_of_its_own() {
        let mine = thread_hint();
        assert_eq!(thread_hint(), mine, "this thread's hint changed");
        let [first, second] =
            std::thread::scope(|s| s.spawn(|| [thread_hint(), thread_hint()]).join().unwrap());
        assert_eq!(first, second, "the other thread's hint changed");
        assert_ne!(first, mine, "two threads share hint {mine}");
    }
}
