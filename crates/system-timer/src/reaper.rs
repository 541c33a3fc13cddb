//! The only code that blocks: the reaper thread, the executor threads, and the blocking
//! [`advance_clock`]. Under loom no reaper thread runs (models drive the timer with `advance_to`,
//! and the reaper's turn, `Inner::reaper_step`, which with the [`Parker`] is compiled under loom
//! too); the executors and their [`Semaphore`], and [`advance_clock`], are compiled as they are,
//! for the models of `tests/loom_timer.rs` (a timer built with `Builder::model_executors` starts
//! its executors as loom threads), and so is the shutdown finished on a thread of its own
//! ([`shutdown_elsewhere`]: under loom only for `shutdown_in_background`, since loom's threads
//! share the std thread-locals that tell a timer's own threads apart). Not under loom: the
//! clock's waker (`Weak`).
//!
//! # The reaper's sleep
//!
//! The reaper sleeps until the earliest queued bucket is due, and no longer: on the system clock
//! for exactly that long, on a manual clock until the clock is moved. It is woken early by
//!
//! * an add that queued a bucket earlier than every other (the wheel reports it: `earliest`),
//! * a task that was already due when added, in inline mode,
//! * shutdown,
//! * with a grace ([`Builder::reaper_grace`](crate::Builder::reaper_grace)), it sleeps until
//!   `grace` past the earliest bucket, and publishes that bucket's time (`help_at_ns`): the first
//!   caller of [`advance_if_due`](crate::SystemTimer::advance_if_due) that finds the clock past
//!   it claims it (a compare-and-swap to `u64::MAX`), advances the wheel, publishes the next
//!   bucket's time and moves the reaper's alarm past that bucket (`Parker::rearm`, a timerfd on
//!   Linux), all without waking the reaper. On a busy timer the callers, already running, keep
//!   the wheel's time and the reaper sleeps through; it wakes on its own only when they stop.
//!
//! Lost wake-ups are impossible because the [`Parker`] keeps a permit: an `unpark` that lands
//! between the reaper's look at the queue and its `park` makes that `park` return at once. With
//! nothing queued the reaper sleeps without a timeout: zero wake-ups while idle.

use std::time::Duration;

use crossbeam_channel::{Receiver, TryRecvError};

use crate::clock::Clock;
use crate::handle::TimerId;
use crate::sync::atomic::Ordering;
use crate::sync::thread::{spawn_named, JoinHandle};
#[cfg(not(loom))]
use crate::sync::Weak;
use crate::sync::{Arc, Condvar, Mutex};

#[allow(unused_imports)] // the module docs' link
use crate::parker::Parker;

use crate::task::TimerTask;
use crate::timer::{Dispatch, Inner, Job};

/// Where idle executor threads sleep: a counting semaphore. The dispatcher adds a permit after
/// each batch it sends (and shutdown one per executor after closing the channel); an executor
/// that finds the channel empty takes a permit or sleeps until there is one. A permit added
/// between an executor's empty look and its sleep is not lost: the sleep returns at once. (The
/// channel's own blocking `recv` spins and yields before it sleeps: CPU burnt once per batch,
/// i.e. once per tick.)
#[derive(Debug, Default)]
pub(crate) struct Semaphore {
    permits: Mutex<usize>,
    cv: Condvar,
}

impl Semaphore {
    /// Takes a permit, sleeping until there is one.
    pub(crate) fn acquire(&self) {
        let mut p = self.permits.lock();
        while *p == 0 {
            p = self.cv.wait(p);
        }
        *p -= 1;
    }

    /// Takes a permit if there is one, without sleeping: an executor that received a batch
    /// takes the permit sent with it, so permits do not pile up while executors are busy (each
    /// left over would cost an idle executor one empty look).
    pub(crate) fn try_acquire(&self) {
        let mut p = self.permits.lock();
        *p = p.saturating_sub(1);
    }

    /// Adds `n` permits and wakes as many sleepers.
    pub(crate) fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        *self.permits.lock() += n;
        for _ in 0..n {
            self.cv.notify_one();
        }
    }
}

/// The threads of one timer, joined by shutdown.
#[derive(Default)]
pub(crate) struct Threads {
    reaper: Option<JoinHandle<()>>,
    executors: Vec<JoinHandle<()>>,
    /// Keeps the clock's weak reference to the parker's waker alive while the timer lives.
    waker: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads")
            .field("reaper", &self.reaper.is_some())
            .field("executors", &self.executors.len())
            .finish()
    }
}

impl Threads {
    /// Wakes the reaper (shutdown has set `stopping`) and joins it.
    pub(crate) fn stop_reaper<T: TimerTask>(&mut self, inner: &Inner<T>) {
        inner.parker.unpark();
        self.join_reaper();
    }

    /// Joins the reaper, once it has been woken with `stopping` set.
    pub(crate) fn join_reaper(&mut self) {
        if let Some(r) = self.reaper.take() {
            // The reaper catches task panics itself; a join error would be a bug of ours, and
            // shutdown must go on regardless.
            let _ = r.join();
        }
    }

    /// Wakes and joins the executors (shutdown has closed the channel's sender: each finds it
    /// disconnected once drained).
    pub(crate) fn join_executors<T: TimerTask>(&mut self, inner: &Inner<T>) {
        inner.idle_executors.release(self.executors.len());
        for e in self.executors.drain(..) {
            let _ = e.join();
        }
        self.waker = None;
    }
}

/// A shutdown called on one of the timer's own threads (from a task: an explicit call, or the
/// drop of the timer's last reference, which a task may hold, e.g. through a purgatory's
/// operation whose expiry was in flight). That thread can neither join itself nor wait for the
/// task it is running, so this thread closes the wheel (later adds fail with `Shutdown`) and a
/// short-lived thread (`<name>-shutdown`) finishes the shutdown once the task returns, and
/// drops the tasks it would have returned. (`shutdown_in_background` does the same from any
/// thread.) If that thread cannot be spawned, this thread also closes the dispatch and drops
/// the pending and ready tasks here, after releasing every lock; the timer's threads are left
/// to stop on their own (the reaper sees `stopping`, the executors a closed channel),
/// detached.
pub(crate) fn shutdown_elsewhere<T: TimerTask>(inner: Arc<Inner<T>>, threads: Threads) {
    // The wheel is closed here, before the caller returns, as a joining shutdown closes it
    // before it returns: later adds fail, and cancels and takes find nothing. (Left to the
    // thread below, it closed only after joining the reaper, and an add accepted meanwhile was
    // dropped there.) Safe on any thread: no task runs under the wheel lock, and its order
    // after an operation's lock is the arming's. The tasks it held are dropped by the thread
    // below, not here: this caller may hold what their drops need.
    let mut closed = Vec::new();
    inner.close_wheel(&mut closed);
    let name = format!("{}-shutdown", inner.name);
    let slot = Arc::new(Mutex::new(Some((inner, threads, closed))));
    let theirs = Arc::clone(&slot);
    let finish = move || {
        if let Some((inner, threads, mut closed)) = theirs.lock().take() {
            closed.append(&mut inner.finish_shutdown(threads));
            crate::timer::drop_each(closed);
        }
    };
    let spawned = spawn_unless_refused(name, finish);
    if spawned.is_err() {
        let taken = slot.lock().take();
        if let Some((inner, threads, mut dropped)) = taken {
            inner.parker.unpark();
            inner.close_dispatch(&mut dropped);
            inner.idle_executors.release(threads.executors.len());
            drop(threads);
            // Its threads stop on their own (detached): nothing more this shutdown can wait for.
            inner.finished.set();
            crate::timer::drop_each(dropped);
        }
    }
}

/// Tests make this thread's timer spawns (`start`'s, `shutdown_elsewhere`'s) fail once the
/// count they set runs out (`tests::SPAWNS_ALLOWED`).
#[cfg(all(test, not(loom)))]
fn spawn_refused_by_test() -> bool {
    tests::SPAWNS_ALLOWED.with(|left| match left.get() {
        None => false,
        Some(0) => true,
        Some(n) => {
            left.set(Some(n - 1));
            false
        }
    })
}

#[cfg(any(not(test), loom))]
#[inline(always)]
fn spawn_refused_by_test() -> bool {
    false
}

/// [`spawn_named`], unless a test refuses the spawn ([`spawn_refused_by_test`]).
fn spawn_unless_refused<F, R>(name: String, f: F) -> std::io::Result<JoinHandle<R>>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if spawn_refused_by_test() {
        Err(std::io::Error::other("spawn refused (test)"))
    } else {
        spawn_named(name, f)
    }
}

thread_local! {
    /// The id of the timer whose reaper or executor this thread is, if any.
    static TIMER_THREAD: std::cell::Cell<Option<TimerId>> = const { std::cell::Cell::new(None) };
}

/// True if the calling thread is the reaper or an executor of timer `id`: a task of the timer
/// may be running here.
pub(crate) fn on_timer_thread(id: TimerId) -> bool {
    TIMER_THREAD
        .try_with(|t| t.get() == Some(id))
        .unwrap_or(false)
}

/// Marks the calling thread as a thread of timer `id` (first thing in the reaper and executors).
fn mark_timer_thread(id: TimerId) {
    // Not under loom: there every model thread is on one OS thread, whose std thread-locals
    // they all share (and nothing under loom asks `on_timer_thread`).
    #[cfg(not(loom))]
    let _ = TIMER_THREAD.try_with(|t| t.set(Some(id)));
    #[cfg(loom)]
    let _ = id;
}

/// Set once a shutdown has finished (the reaper and executors joined, every task handed back or
/// dropped): a [`SystemTimer::shutdown`](crate::SystemTimer::shutdown) that finds another one
/// under way waits for it.
#[derive(Debug, Default)]
pub(crate) struct Finished {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Finished {
    pub(crate) fn set(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }

    pub(crate) fn wait(&self) {
        let mut done = self.done.lock();
        while !*done {
            done = self.cv.wait(done);
        }
    }
}

thread_local! {
    /// Ids of the timers whose tasks this thread is running inline, from an advance that raised
    /// the timer's `running` (innermost last; a task may advance another timer).
    static RUNS_INLINE: std::cell::RefCell<Vec<TimerId>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// While alive, marks the calling thread as running tasks of timer `id` inline (any thread that
/// advances an inline timer: the reaper, or a caller of `advance*`). A shutdown from such a task
/// cannot wait for the advance it runs in (`running`), so it finishes elsewhere, as on the
/// timer's own threads ([`shutdown_elsewhere`]).
pub(crate) struct RunsInline(bool);

impl RunsInline {
    pub(crate) fn enter(id: TimerId) -> Self {
        RunsInline(RUNS_INLINE.try_with(|r| r.borrow_mut().push(id)).is_ok())
    }

    /// True if the calling thread runs tasks of timer `id` inline (a task of it runs here).
    pub(crate) fn here(id: TimerId) -> bool {
        RUNS_INLINE
            .try_with(|r| r.borrow().contains(&id))
            .unwrap_or(false)
    }
}

impl Drop for RunsInline {
    fn drop(&mut self) {
        if self.0 {
            let _ = RUNS_INLINE.try_with(|r| r.borrow_mut().pop());
        }
    }
}

/// Starts the reaper (if asked) and the executors (unless inline), and subscribes the parker to
/// the clock so that a manual clock wakes sleepers when it moves.
pub(crate) fn start<T: TimerTask>(
    inner: &Arc<Inner<T>>,
    reaper: bool,
    executors: usize,
    receiver: Option<Receiver<Vec<Job<T>>>>,
) -> std::io::Result<Threads> {
    let mut threads = Threads::default();
    #[cfg(not(loom))]
    {
        let parker = Arc::clone(&inner.parker);
        let waker: Arc<dyn Fn() + Send + Sync> = Arc::new(move || parker.unpark());
        inner
            .clock
            .subscribe(Arc::downgrade(&waker) as Weak<dyn Fn() + Send + Sync>);
        threads.waker = Some(waker);
    }
    if let Some(rx) = receiver {
        for i in 0..executors {
            let (inner2, rx) = (Arc::clone(inner), rx.clone());
            let t = spawn_unless_refused(format!("{}-executor-{i}", inner.name), move || {
                mark_timer_thread(inner2.id);
                executor_loop(&inner2, &rx)
            });
            match t {
                Ok(t) => threads.executors.push(t),
                Err(e) => return Err(abort_start(inner, threads, e)),
            }
        }
    }
    if reaper {
        let inner2 = Arc::clone(inner);
        let name = format!("{}-reaper", inner.name);
        match spawn_unless_refused(name, move || {
            mark_timer_thread(inner2.id);
            reaper_loop(&inner2)
        }) {
            Ok(t) => threads.reaper = Some(t),
            Err(e) => return Err(abort_start(inner, threads, e)),
        }
    }
    Ok(threads)
}

/// A spawn failed half-way: stop and join whatever was started, so no thread outlives the
/// failed build, and report the error.
fn abort_start<T: TimerTask>(
    inner: &Inner<T>,
    mut threads: Threads,
    e: std::io::Error,
) -> std::io::Error {
    inner.stopping.store(true, Ordering::Release);
    *inner.dispatch.lock() = Dispatch::Closed;
    threads.stop_reaper(inner);
    threads.join_executors(inner);
    e
}

fn reaper_loop<T: TimerTask>(inner: &Inner<T>) {
    while inner.reaper_step().is_some() {}
}

fn executor_loop<T: TimerTask>(inner: &Inner<T>, rx: &Receiver<Vec<Job<T>>>) {
    // True when this executor holds a permit it slept for and has not yet matched with a batch:
    // that permit is the one sent with the next batch it takes, so it must not take a second
    // (which would leave an idle executor asleep while a batch waits).
    let mut holds_permit = false;
    loop {
        inner.channel.op();
        let batch = match rx.try_recv() {
            Ok(batch) => {
                if !std::mem::take(&mut holds_permit) {
                    inner.idle_executors.try_acquire();
                }
                batch
            }
            Err(TryRecvError::Empty) => {
                if !holds_permit {
                    inner.idle_executors.acquire();
                    holds_permit = true;
                } else {
                    // Woken for a batch another executor took first: the permit we hold was
                    // sent with it (that executor found none to take). Drop it and sleep.
                    holds_permit = false;
                }
                continue;
            }
            Err(TryRecvError::Disconnected) => return,
        };
        for job in batch {
            if inner.stopping.load(Ordering::Acquire) {
                inner.stats.returned.fetch_add(1, Ordering::Release);
                inner.returned.lock().push(job.task);
                continue;
            }
            inner.run_job(job);
        }
    }
}

/// Kafka's `advanceClock(timeout)`: wait (up to `timeout` on the timer's clock) for the earliest
/// bucket, then advance. True if a task was dispatched.
pub(crate) fn advance_clock<T: TimerTask>(inner: &Inner<T>, timeout: Duration) -> bool {
    let start = inner.clock.now_ns();
    let limit = start.saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
    loop {
        // Read before the state it waits on: an unpark (a clock move, an add, a shutdown) that
        // comes after it ends the sleep below.
        let epoch = inner.parker.epoch();
        if inner.stopping.load(Ordering::Acquire) {
            return false;
        }
        let now = inner.clock.now_ns();
        let next = inner.wheel.next_expiration();
        if next.is_some_and(|x| x <= now) || inner.has_ready() {
            if inner.advance_to_ns(now) > 0 {
                return true;
            }
            continue;
        }
        if now >= limit {
            return false;
        }
        let wake_at = next.map_or(limit, |x| x.min(limit));
        inner
            .parker
            .park_since(epoch, inner.clock.sleep_for(wake_at));
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::disallowed_types)] // tests use std's locks and atomics freely
mod tests {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::timer::tests::inline_manual;
    use crate::ManualClock;

    thread_local! {
        /// How many more timer threads this thread may spawn before a spawn fails (`None`: no
        /// limit).
        pub(super) static SPAWNS_ALLOWED: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// Counts its drops.
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// A park that finds a permit waiting, or is given no time, returns at once and says it did
    /// not sleep (the reaper counts a wake-up only after a real sleep: it used to count every
    /// return, so `reaper_wakeups` ran high under load); one that waits says it slept. With and
    /// without the alarm (the reaper's timerfd when it has a grace).
    #[test]
    fn a_park_that_does_not_sleep_says_so() {
        for alarm in [false, true] {
            let parker = crate::parker::Parker::new(alarm);
            parker.unpark();
            assert!(!parker.park_reaper(parker.stamp(), None), "permit waiting");
            assert!(!parker.park_reaper(parker.stamp(), Some(Duration::ZERO)));
            assert!(parker.park_reaper(parker.stamp(), Some(Duration::from_millis(1))));
            parker.unpark();
            assert!(
                !parker.park(Some(Duration::from_secs(60))),
                "permit waiting"
            );
            assert!(!parker.park(Some(Duration::ZERO)));
            assert!(parker.park(Some(Duration::from_millis(1))));
        }
    }

    /// `rearm` (a caller that advanced the wheel moving the reaper's alarm) publishes and moves
    /// the alarm only while no unpark is pending and none came since its caller read the epoch:
    /// either means the reaper will look at the wheel again (an add may have queued an earlier
    /// bucket), and a rearm then would move its wake-up past that bucket. With and without the
    /// alarm.
    ///
    /// Catches: `*n || epoch changed` in `rearm` turned into `&&` (a rearm over a pending permit,
    /// which on the alarm also clears its firing), or the epoch test inverted.
    #[test]
    fn rearm_yields_to_a_pending_or_later_unpark() {
        for alarm in [false, true] {
            let parker = crate::parker::Parker::new(alarm);
            let hour = Some(Duration::from_secs(3600));
            let mut published = 0;
            parker.rearm(parker.epoch(), parker.stamp(), hour, || published += 1);
            assert_eq!(published, 1, "no unpark since the reading: publishes");
            // An unpark before the reading, its permit not yet taken by the reaper.
            parker.unpark();
            parker.rearm(parker.epoch(), parker.stamp(), hour, || published += 1);
            assert_eq!(published, 1, "rearmed over a pending permit");
            assert!(
                !parker.park_reaper(parker.stamp(), hour),
                "the permit was kept"
            );
            // An unpark after the reading, its permit already taken.
            let epoch = parker.epoch();
            parker.unpark();
            assert!(!parker.park(Some(Duration::ZERO)));
            parker.rearm(epoch, parker.stamp(), hour, || published += 1);
            assert_eq!(published, 1, "rearmed after a later unpark");
        }
    }

    /// `park_since` (an `advance_clock` caller waiting for a bucket) returns at once when an
    /// unpark came after its caller read the epoch, or when given no time; otherwise it sleeps
    /// until an unpark, however long its timeout.
    ///
    /// Catches: `park_since` emptied, or its zero-timeout test made true for every timeout
    /// (the caller spins on the clock instead of sleeping), or its epoch test inverted (an
    /// unpark that came before the sleep is slept through).
    #[test]
    #[allow(clippy::disallowed_methods)] // hang timeouts on the real clock
    fn park_since_sleeps_until_an_unpark_after_the_epoch() {
        let parker = Arc::new(crate::parker::Parker::new(false));
        // Runs `park_since(epoch, timeout)` on a thread of its own; the channel says it returned.
        let park_since = |epoch, timeout| {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = parker.clone();
            std::thread::spawn(move || {
                p.park_since(epoch, timeout);
                tx.send(()).unwrap();
            });
            rx
        };
        let hang = Duration::from_secs(10);
        let hour = Some(Duration::from_secs(3600));

        let stale = parker.epoch();
        parker.unpark();
        park_since(stale, None)
            .recv_timeout(hang)
            .expect("slept through an unpark that came after the epoch was read");
        park_since(parker.epoch(), Some(Duration::ZERO))
            .recv_timeout(hang)
            .expect("slept with no time to sleep");

        for timeout in [hour, None] {
            let returned = park_since(parker.epoch(), timeout);
            assert!(
                returned.recv_timeout(Duration::from_millis(200)).is_err(),
                "returned without an unpark ({timeout:?})"
            );
            parker.unpark();
            returned
                .recv_timeout(hang)
                .expect("an unpark did not end the sleep");
        }
    }

    /// `try_acquire` (an executor that received a batch without sleeping for it) takes the
    /// permit sent with the batch when there is one, and leaves none behind to cost an idle
    /// executor an empty look; with none, it takes nothing and does not wait.
    ///
    /// Catches: `try_acquire` emptied (permits pile up while the executors are busy).
    #[test]
    fn try_acquire_takes_one_permit_if_there_is_one() {
        let sem = super::Semaphore::default();
        sem.release(2);
        sem.try_acquire();
        assert_eq!(*sem.permits.lock(), 1, "took one of two permits");
        sem.try_acquire();
        sem.try_acquire();
        assert_eq!(*sem.permits.lock(), 0, "none left, none owed");
    }

    /// A shutdown from a task whose `<name>-shutdown` thread cannot be spawned still shuts the
    /// timer: later adds fail with `Shutdown` (they used to be accepted into a wheel nobody
    /// would advance again), and the pending task is dropped, not run.
    #[test]
    fn a_deferred_shutdown_that_cannot_spawn_still_closes_the_timer() {
        let clock = ManualClock::new(0);
        let timer = Arc::new(inline_manual(&clock));
        let (drops, ran) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let weak = Arc::downgrade(&timer);
        timer
            .add(Duration::from_millis(10), move || {
                let returned = weak.upgrade().expect("timer alive").shutdown();
                assert!(returned.is_empty(), "a deferred shutdown returns nothing");
            })
            .unwrap();
        let (d, r) = (Dropped(drops.clone()), ran.clone());
        timer
            .add(Duration::from_secs(1), move || {
                let _d = d;
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        SPAWNS_ALLOWED.with(|f| f.set(Some(0)));
        clock.advance(Duration::from_millis(10));
        assert_eq!(timer.advance(), 1);
        SPAWNS_ALLOWED.with(|f| f.set(None));
        assert_eq!(drops.load(SeqCst), 1, "the pending task is dropped");
        let later = timer.add(Duration::from_millis(1), || ());
        assert!(later.unwrap_err().is_shutdown());
        clock.advance(Duration::from_secs(2));
        assert_eq!(timer.advance(), 0);
        assert_eq!(ran.load(SeqCst), 0);
    }

    /// The timer's threads of this process whose name starts with `prefix` (`comm`: the first
    /// 15 bytes of a thread's name).
    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.starts_with(prefix))
            .count()
    }

    /// A build whose spawn fails half-way (an executor, or the reaper after every executor)
    /// reports the error and leaves no thread behind: `abort_start` stops and joins the ones
    /// already started, asleep on the executors' semaphore or the reaper's parker.
    #[test]
    fn a_build_whose_spawn_fails_leaves_no_thread_behind() {
        // Three executors and the reaper: spawns 0..=2 are the executors, 3 the reaper.
        for allowed in 0..=3 {
            let name = format!("abort{allowed}");
            SPAWNS_ALLOWED.with(|f| f.set(Some(allowed)));
            let built = crate::SystemTimer::builder()
                .name(&name)
                .executor_threads(3)
                .try_build();
            SPAWNS_ALLOWED.with(|f| f.set(None));
            match built {
                Err(crate::BuildError::Spawn(e)) => assert!(e.contains("refused"), "{e}"),
                other => panic!("{allowed} spawns allowed: {other:?}"),
            }
            assert_eq!(threads_named(&name), 0, "{allowed} spawns allowed");
        }
    }
}
