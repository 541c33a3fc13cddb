//! Synchronisation shim: parking_lot + std normally, loom under `--cfg loom`.
//!
//! The only module of the crate that names `parking_lot`, `std::sync` or `loom` (`clippy.toml`
//! bans them elsewhere). DashMap has no loom support: `watchers.rs` swaps it for one
//! `Mutex<HashMap>` under loom (see LOOM.md).
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

    /// A per-thread number, assigned in turn on a thread's first call and never given to
    /// another thread: picks the thread's counter stripe. The counters rely on it being unique
    /// (a thread with one of the first hints owns its stripe and updates it without a
    /// read-modify-write: see `operation.rs`).
    #[inline]
    pub(crate) fn thread_hint() -> usize {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static HINT: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        HINT.with(|h| {
            if h.get() == usize::MAX {
                h.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            h.get()
        })
    }

    thread_local! {
        /// How many operations' completion callbacks (`on_complete`, `on_expiration`, the
        /// payload's drop) this thread is running, nested.
        static IN_CALLBACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// While alive, marks the calling thread as running an operation's completion callbacks
    /// (under its op lock): see [`in_callbacks`].
    pub(crate) struct InCallbacks(());

    impl InCallbacks {
        #[inline]
        pub(crate) fn enter() -> Self {
            IN_CALLBACKS.with(|n| n.set(n.get() + 1));
            InCallbacks(())
        }
    }

    impl Drop for InCallbacks {
        #[inline]
        fn drop(&mut self) {
            // `try_with`: a payload dropped during thread-local destruction.
            let _ = IN_CALLBACKS.try_with(|n| n.set(n.get() - 1));
        }
    }

    /// True while this thread runs an operation's completion callbacks, so holds its op lock:
    /// a thread of the timer may be waiting for that lock (an expiry of the same operation that
    /// started before it completed), and must not be joined from here.
    pub(crate) fn in_callbacks() -> bool {
        IN_CALLBACKS.try_with(|n| n.get() > 0).unwrap_or(false)
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
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// Under loom there is one counter stripe.
    pub(crate) fn thread_hint() -> usize {
        0
    }

    /// Under loom the timer has no threads to join: nothing to mark.
    pub(crate) struct InCallbacks(());

    impl InCallbacks {
        pub(crate) fn enter() -> Self {
            InCallbacks(())
        }
    }

    pub(crate) fn in_callbacks() -> bool {
        false
    }
}

pub(crate) use imp::*;

// Not under loom (threads outside a model). Two attributes, not `cfg(all(..))`: cargo-mutants
// recognises only a plain `#[cfg(test)]` as test code.
#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;

    /// Round-robin hints: threads that ask in turn each get a number of their own, kept for
    /// every later call (so the operations' counters and common references spread over stripes).
    #[test]
    fn threads_get_distinct_hints_that_they_keep() {
        let mut seen = vec![thread_hint()];
        for _ in 0..3 {
            let (first, again) = std::thread::spawn(|| (thread_hint(), thread_hint()))
                .join()
                .unwrap();
            assert_eq!(first, again, "a thread's hint changed between calls");
            assert!(!seen.contains(&first), "hint {first} given twice: {seen:?}");
            seen.push(first);
        }
        assert_eq!(seen[0], thread_hint(), "the test thread's hint changed");
    }

    /// `in_callbacks` holds while a marker lives, through nested markers, and no longer once
    /// the outermost one is dropped (a later shutdown on this thread then joins its timer).
    #[test]
    fn in_callbacks_holds_while_a_marker_lives() {
        assert!(!in_callbacks(), "outside any callbacks");
        let outer = InCallbacks::enter();
        assert!(in_callbacks());
        drop(InCallbacks::enter());
        assert!(
            in_callbacks(),
            "the nested marker's drop ended the outer one"
        );
        drop(outer);
        assert!(!in_callbacks(), "still marked after the last marker's drop");
    }
}
