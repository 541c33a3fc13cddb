//! The W4 harness's record of completions: each thread that completes requests appends to a log
//! of its own, and the run collects the logs once its threads are done.
//!
//! Appending is a sequential write on the completing thread. A table indexed by request id (the
//! harness's first design) cost a cache miss and a TLB miss per completion (32 MB of slots for a
//! million requests, touched in completion order, i.e. at random): a third of the completer's
//! CPU, counted against the purgatory in W4's figure. The per-request checks (exactly once,
//! outcome against timing) are computed from the logs after the run, outside the measured time.
//!
//! A thread's log is either installed (the completer's, sized for every request) or taken from
//! the run's pool ([`provision`]): chunks of [`CHUNK`] records touched before the run, handed out
//! one at a time to whichever thread logs (the timer's reaper and executors, the generator when
//! it runs expiries), a full chunk going to the `FINISHED` list. A log that grew by itself on
//! those threads put 16 bytes per completion into the run's RSS growth, which W4 divides by
//! the pending requests: its bytes per pending request grew with the number of requests.
//!
//! Ground rules: a log is keyed by its run's id, so runs in one process (`--find-max-rate`) and
//! runs on concurrent test threads keep apart. A thread's records go to the shared `FINISHED`
//! list when it exits (its thread-local's destructor, which runs before a `join` of the thread
//! returns) or when it starts logging for another run; [`collect`] takes a run's records from
//! that list and from the calling thread's own log. So once every thread that completed a run's
//! requests has exited (the completer joined, the timer shut down), except the caller, `collect`
//! sees every record of the run.
#![allow(clippy::disallowed_types)] // a std mutex in the benchmark harness, not the library

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One `on_complete` call (or, [`Breach::ExpirationAlone`], an `on_expiration` call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// When it ran, ns since the run's start.
    pub at_ns: u64,
    /// The request.
    pub id: u32,
    /// Expiry completed it (`on_expiration` ran right after, on the same thread).
    pub expired: bool,
    /// A breach of the purgatory's contract that this record shows, if any (the run fails on
    /// it; the record itself stays 16 bytes).
    pub breach: Breach,
}

/// How a completion record contradicts the purgatory's contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Breach {
    /// None seen.
    #[default]
    None,
    /// Not expiry, and it ran on the completer during its call for another request: the
    /// request's own call (which had made it completable) had returned without completing it,
    /// and a later check, of another request's key, found it (a lost completion that a
    /// neighbour's check happened to rescue).
    InAnothersCall,
    /// An `on_expiration` with no `on_complete` of the request just before it on this thread:
    /// not a completion (it is not counted as one), only the breach.
    ExpirationAlone,
}

/// Records per chunk of a run's pool (64 KiB).
pub const CHUNK: usize = 4096;

static NEXT_RUN: AtomicU64 = AtomicU64::new(1);
static FINISHED: Mutex<Vec<(u64, Vec<Done>)>> = Mutex::new(Vec::new());
/// The runs' pools of empty chunks, their memory already touched (see [`provision`]).
static POOL: Mutex<Vec<(u64, Vec<Done>)>> = Mutex::new(Vec::new());

/// A fresh run id (never 0, which no log starts with).
pub fn new_run() -> u64 {
    NEXT_RUN.fetch_add(1, Ordering::Relaxed)
}

struct ThreadLog {
    run: u64,
    done: Vec<Done>,
}

impl ThreadLog {
    /// Hands the records kept so far to `FINISHED`.
    fn finish(&mut self) {
        if !self.done.is_empty() {
            let done = std::mem::take(&mut self.done);
            FINISHED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((self.run, done));
        }
    }
}

impl Drop for ThreadLog {
    fn drop(&mut self) {
        self.finish();
    }
}

thread_local! {
    static LOG: RefCell<ThreadLog> = const {
        RefCell::new(ThreadLog {
            run: 0,
            done: Vec::new(),
        })
    };
}

/// Makes `buf` (empty; its capacity already touched by the caller, outside the measured time:
/// see `measure::prefaulted`) this thread's log for run `run`, finishing any records it held.
pub fn install(run: u64, buf: Vec<Done>) {
    LOG.with(|l| {
        let mut l = l.borrow_mut();
        l.finish();
        l.run = run;
        l.done = buf;
    });
}

/// Gives run `run` a pool of `chunks` empty chunks of [`CHUNK`] records each, their memory
/// touched now (call it before the run's baseline RSS is read): the logs of the threads that
/// have none installed take them as they fill. Enough for `records` records logged by `threads`
/// threads: `records.div_ceil(CHUNK) + threads` (each thread leaves at most one chunk partly
/// filled). A pool that runs dry hands out fresh chunks.
pub fn provision(run: u64, chunks: usize) {
    let fresh: Vec<(u64, Vec<Done>)> = (0..chunks)
        .map(|_| (run, crate::measure::prefaulted(CHUNK)))
        .collect();
    POOL.lock().unwrap_or_else(|e| e.into_inner()).extend(fresh);
}

/// An empty chunk of run `run`'s pool, or a fresh one (not touched) if it has none left.
#[cold]
fn chunk(run: u64) -> Vec<Done> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    match pool.iter().rposition(|(r, _)| *r == run) {
        Some(i) => pool.swap_remove(i).1,
        None => Vec::with_capacity(CHUNK),
    }
}

thread_local! {
    /// The request whose completer call this thread is making, if any (`u32::MAX`: none). A
    /// plain cell, apart from `LOG`: it is set per call, and a thread-local without a destructor
    /// is the cheapest to reach.
    static ACTING: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// Says that this thread (the completer) now makes its call for request `id` (`None`: no call):
/// until the next, a completion it logs of another request, not an expiry, is a
/// [`Breach::InAnothersCall`]. In a correct run the call completes `id` or nothing (inline
/// expiries aside): the generator hands a request over only after `try_complete_else_watch`
/// returned, and only the request's own call makes it completable.
#[inline]
pub fn acting_for(id: Option<u32>) {
    ACTING.with(|a| a.set(id.unwrap_or(u32::MAX)));
}

/// Appends a completion of run `run` to this thread's log (flagged as a
/// [`Breach::InAnothersCall`] if it is not an expiry's and this thread is making a call for
/// another request: see [`acting_for`]).
#[inline]
pub fn push(run: u64, mut done: Done) {
    let acting = ACTING.with(Cell::get);
    if acting != u32::MAX && acting != done.id && !done.expired {
        done.breach = Breach::InAnothersCall;
    }
    LOG.with(|l| {
        let mut l = l.borrow_mut();
        if l.run != run {
            l.finish();
            l.run = run;
        }
        if l.done.len() == l.done.capacity() {
            // Full (or none yet): hand it over and take a chunk of the run's pool, rather than
            // grow it (a reallocation, and new memory in the run's RSS growth).
            l.finish();
            l.done = chunk(run);
        }
        l.done.push(done);
    });
}

/// Marks this thread's last record (which must be request `id`'s, of run `run`) as an expiry.
///
/// `on_expiration` always follows `on_complete` on the same thread (the purgatory's contract).
/// If it did not, the call is logged as a [`Breach::ExpirationAlone`] (which fails the run)
/// rather than panicking: `on_expiration` runs inside the timer's and the purgatory's panic
/// guards, which would catch the panic and let the run go on.
#[inline]
pub fn mark_expired(run: u64, id: u32, at_ns: impl FnOnce() -> u64) {
    let marked = LOG.with(|l| {
        let mut l = l.borrow_mut();
        let this_run = l.run == run;
        match l.done.last_mut().filter(|_| this_run) {
            // (An `ExpirationAlone` record is already an expiry.)
            Some(d) if d.id == id && !d.expired => {
                d.expired = true;
                // An expiry the call ran inline completes another request rightly.
                if d.breach == Breach::InAnothersCall {
                    d.breach = Breach::None;
                }
                true
            }
            _ => false,
        }
    });
    if !marked {
        push(
            run,
            Done {
                at_ns: at_ns(),
                id,
                expired: true,
                breach: Breach::ExpirationAlone,
            },
        );
    }
}

/// Every record of run `run`: those of the threads that have exited (or moved to another run)
/// and the calling thread's own. Frees what is left of the run's pool.
pub fn collect(run: u64) -> Vec<Done> {
    POOL.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(r, _)| *r != run);
    let mut out = Vec::new();
    LOG.with(|l| {
        let mut l = l.borrow_mut();
        if l.run == run {
            out.append(&mut l.done);
        }
    });
    FINISHED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain_mut(|(r, done)| {
            if *r == run {
                out.append(done);
                false
            } else {
                true
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: u32) -> Done {
        Done {
            at_ns: u64::from(id) * 10,
            id,
            ..Done::default()
        }
    }

    /// Runs `f` on a thread of its own, to its end (its log finished).
    fn on_another_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    /// The chunks left in run `run`'s pool.
    fn pooled(run: u64) -> usize {
        POOL.lock().unwrap().iter().filter(|p| p.0 == run).count()
    }

    #[test]
    fn records_of_exited_threads_and_the_caller_are_collected_per_run() {
        let (a, b) = (new_run(), new_run());
        push(a, d(1));
        on_another_thread(move || {
            push(a, d(2));
            mark_expired(a, 2, || 25);
            push(b, d(3)); // moves this thread to run b: run a's records are finished
            push(b, d(4));
        });
        let mut got = collect(a);
        got.sort_by_key(|x| x.id);
        assert_eq!(
            got,
            [
                d(1),
                Done {
                    expired: true,
                    ..d(2)
                }
            ]
        );
        let ids: Vec<u32> = collect(b).iter().map(|x| x.id).collect();
        assert_eq!(ids, [3, 4], "the exited thread's records of run b");
        assert!(collect(a).is_empty(), "collected once");
    }

    /// A thread with no log installed fills chunks of the run's pool, one after another, each
    /// full one finished; every record is collected once, and so is what is left of the pool.
    #[test]
    fn threads_without_a_log_fill_chunks_of_the_pool() {
        let r = new_run();
        provision(r, 4); // one more than it needs
        let n = 2 * CHUNK as u32 + 5;
        on_another_thread(move || {
            for id in 0..n {
                let before = LOG.with(|l| l.borrow().done.capacity());
                push(r, d(id));
                let after = LOG.with(|l| l.borrow().done.capacity());
                assert_eq!(after, CHUNK, "a chunk, never a grown vector");
                assert!(before == 0 || before == CHUNK);
            }
        });
        let mut ids: Vec<u32> = collect(r).iter().map(|x| x.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..n).collect::<Vec<_>>());
        assert_eq!(pooled(r), 0, "the pool is freed with the run's records");
    }

    /// A thread with its log installed (the completer) logs into that buffer, taking nothing
    /// from the run's pool, and the records it held for another run are finished, not lost.
    #[test]
    fn an_installed_log_takes_nothing_from_the_pool() {
        let (a, r) = (new_run(), new_run());
        provision(r, 1);
        on_another_thread(move || {
            push(a, d(99));
            install(r, Vec::with_capacity(10));
            for id in 0..10 {
                push(r, d(id));
            }
            let cap = LOG.with(|l| l.borrow().done.capacity());
            assert_eq!(cap, 10, "the installed buffer, not a chunk");
        });
        assert_eq!(pooled(r), 1, "the pool's chunk is left as it was");
        let ids: Vec<u32> = collect(r).iter().map(|x| x.id).collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>());
        assert_eq!(
            collect(a),
            [d(99)],
            "the other run's record, finished at the install"
        );
    }

    /// An `on_expiration` not right after its request's `on_complete` on the same thread (of
    /// another request, a second one for the same record, or on a thread with no record) is
    /// logged as a breach of its own, and the record before it is left as it was.
    #[test]
    fn an_expiry_without_its_completion_is_logged_as_a_breach() {
        let r = new_run();
        push(r, d(7));
        mark_expired(r, 8, || 85);
        mark_expired(r, 7, || 86);
        mark_expired(r, 7, || 87);
        let alone = |id, at_ns| Done {
            at_ns,
            id,
            expired: true,
            breach: Breach::ExpirationAlone,
        };
        assert_eq!(collect(r), [d(7), alone(8, 85), alone(7, 86), alone(7, 87)]);
        let r = new_run();
        on_another_thread(move || mark_expired(r, 1, || 5));
        assert_eq!(collect(r), [alone(1, 5)]);
    }

    /// While a thread acts for a request, a completion it logs of another request is flagged,
    /// unless an expiry follows it at once (an expiry run inline); its own request's is not,
    /// nor any once the call is over, nor any on another thread.
    #[test]
    fn completions_of_other_requests_during_a_call_are_flagged() {
        let r = new_run();
        push(r, d(1)); // no call
        acting_for(Some(2));
        push(r, d(2)); // the request the call is for
        push(r, d(3)); // another request: flagged
        push(r, d(4));
        mark_expired(r, 4, || 45); // an inline expiry: not flagged
        on_another_thread(move || push(r, d(5))); // another thread
        acting_for(None);
        push(r, d(6)); // no call
        let mut got = collect(r);
        got.sort_by_key(|x| x.id);
        let flagged: Vec<u32> = got
            .iter()
            .filter(|x| x.breach == Breach::InAnothersCall)
            .map(|x| x.id)
            .collect();
        assert_eq!(flagged, [3]);
        assert!(got[3].expired && got[3].breach == Breach::None);
    }
}
