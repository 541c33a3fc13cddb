//! Panic safety for the user's callbacks.
//!
//! An advance or a close hands entries to a callback while a bucket's chain is detached from
//! every list (its nodes are re-placed or released one by one). A panic escaping the callback
//! there would leave the rest of the chain `PENDING` but in no list, with stale links: entries
//! that never fire, and a later cancel of one of them unlinking through a dead link. So every
//! callback call goes through [`Deferred::call`], which catches a panic where it happens; the
//! advance or close finishes its work (the lists' invariants hold again), and only then does
//! [`Deferred::resume`] raise the first panic again. Later panics of the same pass are dropped
//! (a payload whose own drop panics is leaked, never unwound).

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// The first panic caught in the callbacks of one pass, to raise once the wheel is consistent.
#[derive(Default)]
pub(crate) struct Deferred(Option<Box<dyn Any + Send>>);

impl Deferred {
    /// Calls `f(arg)`, catching a panic (kept if it is the first).
    #[inline(always)]
    pub(crate) fn call<A>(&mut self, f: &mut impl FnMut(A), arg: A) {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(arg))) {
            self.keep(payload);
        }
    }

    #[cold]
    #[inline(never)]
    fn keep(&mut self, payload: Box<dyn Any + Send>) {
        if self.0.is_none() {
            self.0 = Some(payload);
        } else if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(again);
        }
    }

    /// Raises the first panic caught, if any. Call it once the wheel is consistent.
    #[inline]
    pub(crate) fn resume(self) {
        if let Some(payload) = self.0 {
            resume_unwind(payload);
        }
    }
}
