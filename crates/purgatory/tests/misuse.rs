//! Call sequences a user could plausibly write that once hung (calls into a purgatory from inside
//! one of its operations' callbacks) or leaked (a purgatory used after its shared timer was shut
//! down).
#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use purgatory::{DelayedOperation, OperationHandle, Purgatory};
use system_timer::ManualClock;

type P = Purgatory<&'static str, Op>;
/// Where an operation finds its purgatory, and where it records what a shutdown returned.
type Stopper = (Arc<OnceLock<Weak<P>>>, Arc<Mutex<Option<usize>>>);

/// Runs `f` on a thread of its own and fails if it has not returned within 20 s (a hang: the
/// thread is leaked, the test process ends anyway).
fn within_20s<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: hung"))
}

/// Completes the operation behind `handle`, armed 5 ms from now: by expiry (the clock moves and
/// the purgatory advances) or by force.
fn expire_or_force<K, O>(
    clock: &ManualClock,
    p: &Purgatory<K, O>,
    handle: &OperationHandle<O>,
    expire: bool,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    if expire {
        clock.advance(Duration::from_millis(5));
        assert_eq!(p.advance(), 1);
    } else {
        assert!(handle.force_complete());
    }
}

/// An operation that is ready or not, and whose `on_complete` may shut its purgatory down (what
/// its shutdown returned is recorded).
struct Op {
    ready: bool,
    shut_down: Option<Stopper>,
}

impl DelayedOperation for Op {
    fn try_complete(&mut self) -> bool {
        self.ready
    }
    fn on_complete(&mut self) {
        if let Some((p, returned)) = &self.shut_down {
            let p = p
                .get()
                .and_then(Weak::upgrade)
                .expect("the purgatory is alive");
            *returned.lock().unwrap() = Some(p.shutdown().len());
        }
    }
}

/// A purgatory driven by hand on `clock` (no reaper), shared.
fn manual<O: DelayedOperation>(clock: &ManualClock) -> Arc<Purgatory<&'static str, O>> {
    Arc::new(
        Purgatory::builder()
            .clock(clock.clone())
            .reaper(false)
            .build(),
    )
}

/// `on_complete` shuts the purgatory down (a broker's "stop" operation; or the drop of the last
/// reference to the purgatory, which an operation held). The completing operation is still in
/// its keys' watch lists, locked by the very call that completes it. Before, the shutdown took
/// every listed operation's lock, that one's included: a deadlock with itself, on a check and
/// on an expiry alike.
#[test]
fn shutdown_from_on_complete_does_not_deadlock() {
    for expire in [false, true] {
        let (back, returned, stats) = within_20s("shutdown inside on_complete", move || {
            let clock = ManualClock::new(0);
            let p = manual(&clock);
            let slot = Arc::new(OnceLock::new());
            slot.set(Arc::downgrade(&p)).unwrap();
            let returned = Arc::new(Mutex::new(None));
            let stopper = Op {
                ready: false,
                shut_down: Some((slot, Arc::clone(&returned))),
            };
            let w = p
                .try_complete_else_watch(stopper, Duration::from_millis(5), &["k", "j"])
                .unwrap();
            assert!(!w.completed);
            let other = Op {
                ready: false,
                shut_down: None,
            };
            p.try_complete_else_watch(other, Duration::from_secs(60), &["k"])
                .unwrap();
            expire_or_force(&clock, &p, &w.handle, expire);
            let returned = returned.lock().unwrap().take();
            (p.shutdown().len(), returned, p.stats())
        });
        assert_eq!(
            returned,
            Some(1),
            "the pending operation is handed back (expire: {expire})"
        );
        assert_eq!(back, 0, "a second shutdown returns nothing");
        assert_eq!((stats.completed, stats.handed_back), (1, 1));
    }
}

/// What an operation's `on_complete` does with its own purgatory and handle.
#[derive(Clone, Copy, Debug)]
enum Reenter {
    ForceCompleteItself,
    TakeItself,
    WithItself,
    CancelForItsKey,
}

/// An operation whose `on_complete` calls back into its purgatory or its own handle, and
/// records what the call returned.
struct Reentrant {
    how: Reenter,
    p: Arc<OnceLock<Weak<Purgatory<&'static str, Reentrant>>>>,
    me: Arc<OnceLock<purgatory::OperationHandle<Reentrant>>>,
    got: Arc<Mutex<Option<String>>>,
}

impl DelayedOperation for Reentrant {
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self) {
        let me = self.me.get().expect("handle stored");
        let got = match self.how {
            Reenter::ForceCompleteItself => format!("{}", me.force_complete()),
            Reenter::TakeItself => format!("{}", me.take().is_some()),
            Reenter::WithItself => format!("{:?}", me.with(|_| ())),
            Reenter::CancelForItsKey => {
                let p = self.p.get().and_then(Weak::upgrade).expect("alive");
                format!("{}", p.cancel_for_key(&"k").len())
            }
        };
        *self.got.lock().unwrap() = Some(got);
    }
}

/// `on_complete` (or `on_expiration`) calls its own handle (`force_complete`, `take`, `with`:
/// all answer "completed") or `cancel_for_key` on a key it watches (say, to cancel its siblings
/// there). The operation has completed, but its lock is held by the call completing it. Before,
/// each of these took that lock: a deadlock with itself.
#[test]
fn callbacks_may_ask_their_own_handle_and_cancel_their_key() {
    use Reenter::*;
    for (how, expected) in [
        (ForceCompleteItself, "false"),
        (TakeItself, "false"),
        (WithItself, "None"),
        (CancelForItsKey, "1"),
    ] {
        for expire in [false, true] {
            let got = within_20s(&format!("{how:?} (expire: {expire})"), move || {
                let clock = ManualClock::new(0);
                let p: Arc<Purgatory<&'static str, Reentrant>> = manual(&clock);
                let (slot, me) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
                slot.set(Arc::downgrade(&p)).unwrap();
                let got = Arc::new(Mutex::new(None));
                let op = Reentrant {
                    how,
                    p: slot,
                    me: Arc::clone(&me),
                    got: Arc::clone(&got),
                };
                let w = p
                    .try_complete_else_watch(op, Duration::from_millis(5), &["k"])
                    .unwrap();
                me.set(w.handle.clone()).unwrap();
                // A sibling on the same key, pending: what cancel_for_key returns.
                let sibling = Reentrant {
                    how,
                    p: Arc::new(OnceLock::new()),
                    me: Arc::new(OnceLock::new()),
                    got: Arc::new(Mutex::new(None)),
                };
                p.try_complete_else_watch(sibling, Duration::from_secs(60), &["k"])
                    .unwrap();
                expire_or_force(&clock, &p, &w.handle, expire);
                let got = got.lock().unwrap().take();
                got
            });
            assert_eq!(got.as_deref(), Some(expected), "{how:?} (expire: {expire})");
        }
    }
}

/// An operation watched twice on one key (a duplicate in its key slice): `cancel_for_key`
/// returns one handle to it, not two. Before, it returned one per watch-list entry, and a
/// caller taking each operation back (`take().unwrap()`) panicked on the second.
#[test]
fn cancel_for_key_returns_each_operation_once_despite_duplicate_keys() {
    let clock = ManualClock::new(0);
    let p = manual(&clock);
    let op = || Op {
        ready: false,
        shut_down: None,
    };
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["k", "k", "j"])
        .unwrap();
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["k"])
        .unwrap();
    let handles = p.cancel_for_key(&"k");
    assert_eq!(handles.len(), 2, "one handle per operation");
    for h in handles {
        assert!(h.take().is_some());
    }
    assert_eq!(p.stats().handed_back, 2);
}

/// An operation that `cancel_for_key` took off its last key, and whose handles the caller then
/// dropped, is dropped without completing: it is counted as handed back, once, when its last
/// handle goes (before, it was counted nowhere: `accepted` exceeded `completed + handed_back`
/// for good). Operations completed or taken back first are not counted again when their
/// cells are dropped.
#[test]
fn an_operation_dropped_with_its_last_cancel_for_key_handle_counts_as_handed_back() {
    struct Counted {
        completed: Arc<Mutex<u32>>,
        _alive: Arc<()>,
    }
    impl DelayedOperation for Counted {
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self) {
            *self.completed.lock().unwrap() += 1;
        }
    }
    let clock = ManualClock::new(0);
    let p: Arc<Purgatory<&'static str, Counted>> = manual(&clock);
    let completed = Arc::new(Mutex::new(0));
    let alive = Arc::new(());
    let op = || Counted {
        completed: Arc::clone(&completed),
        _alive: Arc::clone(&alive),
    };
    let balanced = |p: &Purgatory<&'static str, Counted>| {
        let st = p.stats();
        assert_eq!(
            st.accepted,
            st.completed + st.handed_back + st.delayed,
            "every accepted operation is completed, handed back or pending: {st:?}"
        );
    };
    // Watched on "a" and "b": cancelling "a" and dropping its handle leaves it on "b".
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["a", "b"])
        .unwrap();
    drop(p.cancel_for_key(&"a"));
    assert_eq!(Arc::strong_count(&alive), 2, "still watched on \"b\"");
    assert_eq!(p.stats().handed_back, 0);
    // Its last key: the handle is now the only way to it.
    let handles = p.cancel_for_key(&"b");
    assert_eq!(handles.len(), 1);
    assert_eq!(Arc::strong_count(&alive), 2, "alive while a handle is");
    assert_eq!(p.stats().handed_back, 0);
    drop(handles);
    assert_eq!(Arc::strong_count(&alive), 1, "dropped with its last handle");
    assert_eq!(*completed.lock().unwrap(), 0, "never completed");
    assert_eq!(p.stats().handed_back, 1, "{:?}", p.stats());
    assert_eq!(p.stats().delayed, 0);
    balanced(&p);

    // Taken back through its handle: counted once, not again when the handle is dropped.
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["c"])
        .unwrap();
    let handles = p.cancel_for_key(&"c");
    assert!(handles[0].take().is_some());
    drop(handles);
    assert_eq!(p.stats().handed_back, 2, "{:?}", p.stats());
    balanced(&p);

    // Completed by force after `cancel_for_key`, then dropped: completed, not handed back.
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["d"])
        .unwrap();
    let handles = p.cancel_for_key(&"d");
    assert!(handles[0].force_complete());
    drop(handles);
    assert_eq!(*completed.lock().unwrap(), 1);
    assert_eq!(p.stats().handed_back, 2, "{:?}", p.stats());
    balanced(&p);

    // Completed by expiry, its cell dropped by the purge: not handed back either.
    p.try_complete_else_watch(op(), Duration::from_millis(5), &["e"])
        .unwrap();
    clock.advance(Duration::from_millis(5));
    assert_eq!(p.advance(), 1);
    drop(p.cancel_for_key(&"e"));
    assert_eq!(*completed.lock().unwrap(), 2);
    assert_eq!(p.stats().handed_back, 2, "{:?}", p.stats());
    balanced(&p);

    // Shutdown hands the pending ones back, once each; their cells then drop empty.
    p.try_complete_else_watch(op(), Duration::from_secs(60), &["f", "g"])
        .unwrap();
    assert_eq!(p.shutdown().len(), 1);
    assert_eq!(p.stats().handed_back, 3, "{:?}", p.stats());
    balanced(&p);
    drop(p);
    assert_eq!(Arc::strong_count(&alive), 1, "every operation dropped");
}

/// An operation that becomes ready when told; once completed, its `on_complete` watches a
/// follow-up operation (never ready) on key "k" of its own purgatory and records whether that
/// one was left pending.
struct FollowUp {
    p: Arc<OnceLock<Weak<Purgatory<&'static str, FollowUp>>>>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    follow_up: bool,
    got: Arc<Mutex<Option<bool>>>,
}

impl DelayedOperation for FollowUp {
    fn try_complete(&mut self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn on_complete(&mut self) {
        if !self.follow_up {
            return;
        }
        let p = self.p.get().and_then(Weak::upgrade).expect("alive");
        let next = FollowUp {
            p: Arc::clone(&self.p),
            ready: Arc::default(),
            follow_up: false,
            got: Arc::default(),
        };
        let w = p
            .try_complete_else_watch(next, Duration::from_secs(60), &["k"])
            .unwrap();
        *self.got.lock().unwrap() = Some(!w.completed);
    }
}

/// KAFKA-3994: Kafka once ran `tryComplete` while holding the key's watch-list lock, and
/// deadlocked. A check here scans a snapshot of the list with no map lock held, so operation
/// code that a check runs may write to the very key being checked: the `on_complete` of an
/// operation completed by `check_and_complete("k")` watches a follow-up operation on "k". The
/// loom models check the lock order on the loom build's map (a `Mutex<HashMap>`); this runs the
/// real one (DashMap).
///
/// Catches: a check that holds the key's shard lock while it runs operation code (the watch
/// inside `on_complete` then waits for it for ever: reported as a hang after 20 s).
#[test]
fn a_check_runs_operation_code_with_no_watch_list_lock_held() {
    let (checked, got, watched, delayed) = within_20s("watch inside a check's on_complete", || {
        let clock = ManualClock::new(0);
        let p: Arc<Purgatory<&'static str, FollowUp>> = manual(&clock);
        let slot = Arc::new(OnceLock::new());
        slot.set(Arc::downgrade(&p)).unwrap();
        let (ready, got) = (
            Arc::<std::sync::atomic::AtomicBool>::default(),
            Arc::default(),
        );
        let op = FollowUp {
            p: slot,
            ready: Arc::clone(&ready),
            follow_up: true,
            got: Arc::clone(&got),
        };
        let w = p
            .try_complete_else_watch(op, Duration::from_secs(60), &["k"])
            .unwrap();
        assert!(!w.completed);
        ready.store(true, std::sync::atomic::Ordering::SeqCst);
        let checked = p.check_and_complete(&"k");
        let got = *got.lock().unwrap();
        (checked, got, p.watched(), p.delayed())
    });
    assert_eq!(checked, 1);
    assert_eq!(got, Some(true), "the follow-up was watched, pending");
    assert_eq!(
        (watched, delayed),
        (1, 1),
        "the follow-up alone on 'k', armed"
    );
}

/// An operation whose `try_complete`, once `race` is set (the check's call, under its lock), lets
/// its own timeout come due and waits until the own timer's thread has started its expiry (which
/// then blocks on the operation's lock), then says ready; its `on_complete` shuts the purgatory
/// down.
struct RacedStopper {
    race: Arc<std::sync::atomic::AtomicBool>,
    clock: ManualClock,
    timer: Arc<system_timer::SystemTimer>,
    p: Arc<OnceLock<Weak<Purgatory<&'static str, RacedStopper>>>>,
    returned: Arc<Mutex<Option<usize>>>,
}

impl DelayedOperation for RacedStopper {
    fn try_complete(&mut self) -> bool {
        if !self.race.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        self.clock.advance(Duration::from_millis(5));
        while self.timer.stats().fired == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The expiry has started: it finds the operation pending and waits for its lock (its
        // thread goes to sleep; the reaper, if it is not the one, sleeps too).
        wait_until_threads_sleep(RACED);
        true
    }
    fn on_complete(&mut self) {
        let p = self.p.get().and_then(Weak::upgrade).expect("alive");
        *self.returned.lock().unwrap() = Some(p.shutdown().len());
    }
}

/// The name of [`RacedStopper`]'s purgatory (its timer's threads are named after it).
const RACED: &str = "raced-stop";

/// Waits (at most 20 s, then panics) until this process has threads whose names start with
/// `prefix` and all of them sleep (Linux: `/proc` state `S` or `D`): blocked on a lock, parked.
fn wait_until_threads_sleep(prefix: &str) {
    let states = || -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        dir.filter_map(|t| {
            let t = t.ok()?.path();
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.join("stat")).ok()?;
            // The state follows the name, which is in parentheses and may hold spaces.
            let state = stat.rsplit_once(") ")?.1.get(..1)?.to_owned();
            comm.starts_with(prefix).then_some(state)
        })
        .collect()
    };
    let t0 = std::time::Instant::now();
    loop {
        let s = states();
        if !s.is_empty() && s.iter().all(|s| s == "S" || s == "D") {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{prefix}: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `on_complete` of an operation completed by a check on a caller's thread shuts the purgatory
/// down while the own timer's thread (the reaper in inline mode, an executor otherwise) runs
/// that operation's expiry, blocked on the operation's lock (which the check holds). The
/// shutdown must not wait for that thread before the lock is released. Before, it joined it: a
/// deadlock between the check (in the join) and the expiry (waiting for the lock).
#[test]
fn shutdown_from_on_complete_while_the_expiry_waits_for_the_lock_does_not_deadlock() {
    for expiry_threads in [0, 1] {
        let (checked, returned, stats, timer) =
            within_20s(&format!("expiry_threads({expiry_threads})"), move || {
                let clock = ManualClock::new(0);
                let p: Arc<Purgatory<&'static str, RacedStopper>> = Arc::new(
                    Purgatory::builder()
                        .name(RACED)
                        .clock(clock.clone())
                        .expiry_threads(expiry_threads)
                        .build(),
                );
                let slot = Arc::new(OnceLock::new());
                slot.set(Arc::downgrade(&p)).unwrap();
                let (race, returned) = (Arc::default(), Arc::new(Mutex::new(None)));
                let op = RacedStopper {
                    race: Arc::clone(&race),
                    clock: clock.clone(),
                    timer: Arc::clone(p.timer()),
                    p: slot,
                    returned: Arc::clone(&returned),
                };
                let w = p
                    .try_complete_else_watch(op, Duration::from_millis(5), &["k"])
                    .unwrap();
                assert!(!w.completed);
                race.store(true, std::sync::atomic::Ordering::SeqCst);
                let checked = p.check_and_complete(&"k");
                let returned = returned.lock().unwrap().take();
                (checked, returned, p.stats(), Arc::clone(p.timer()))
            });
        assert_eq!(
            checked, 1,
            "the check completed it (expiry_threads {expiry_threads})"
        );
        assert_eq!(returned, Some(0));
        assert_eq!((stats.completed, stats.expired), (1, 0));
        assert!(timer.is_shutdown(), "the own timer is shut down");
        assert_eq!(
            timer.stats().fired,
            1,
            "the expiry ran, and found it completed"
        );
    }
}

/// A purgatory on a timer it shares (driven by hand, inline, on a manual clock), purging every
/// ten completions; and the timer.
fn on_a_shared_timer() -> (Arc<system_timer::SystemTimer>, Purgatory<&'static str, Op>) {
    let timer = Arc::new(
        system_timer::SystemTimer::builder()
            .clock(ManualClock::new(0))
            .inline()
            .reaper(false)
            .build(),
    );
    let p = Purgatory::builder()
        .timer(Arc::clone(&timer))
        .purge_interval(10)
        .build();
    (timer, p)
}

/// Offers 1,000 operations on three keys, each of which must be refused as `Shutdown` (the
/// purgatory's timer was shut down by its owner).
fn offer_1000_refused(p: &Purgatory<&'static str, Op>) {
    for _ in 0..1_000 {
        let op = Op {
            ready: false,
            shut_down: None,
        };
        match p.try_complete_else_watch(op, Duration::from_millis(5), &["a", "b", "c"]) {
            Err(purgatory::WatchError::Shutdown(_)) => {}
            Ok(_) => panic!("accepted on a shut timer"),
            Err(_) => panic!("refused, but not as Shutdown"),
        }
    }
}

/// A purgatory on a shared timer that its owner shut down first (a documented misuse): every
/// new operation is refused (`Shutdown`) after it was watched, and leaves an empty cell in each
/// of its keys' lists. Before, the purge those cells made due could not be scheduled on the shut
/// timer and was dropped, so a caller that went on offering operations grew the lists without
/// bound; the purge now runs on the calling thread instead.
#[test]
fn refused_operations_on_a_shut_timer_are_still_purged() {
    let (timer, p) = on_a_shared_timer();
    assert!(timer.shutdown().is_empty());
    // The purgatory's own flag is its own shutdown's; the timer's tells this case (as documented).
    assert!(!p.is_shutdown() && p.timer().is_shutdown());
    offer_1000_refused(&p);
    let s = p.stats();
    assert_eq!(s.handed_back, 1_000);
    assert!(s.purges > 0, "no purge ran");
    // At most an interval's worth of refused operations' cells (3 keys each) wait for a purge.
    assert!(
        s.watched <= 3 * 10,
        "{} entries left in watch lists",
        s.watched
    );
    // Every operation was refused and handed back at once: none was left to shut down.
    assert!(p.shutdown().is_empty());
}

/// The same misuse with a purge already queued on the shared timer when its owner shuts it down:
/// the shutdown hands the purge's task back and the owner drops it unrun. Before, the purgatory
/// still took its purge for scheduled, never scheduled another, and so never reached the inline
/// purge above: the lists grew by three empty cells per refused operation without bound.
#[test]
fn a_purge_queued_when_a_shared_timer_shuts_down_does_not_stop_later_purges() {
    let (timer, p) = on_a_shared_timer();
    let never = || Op {
        ready: false,
        shut_down: None,
    };
    // Ten forced completions make a purge due: its task waits in the timer for an advance.
    for _ in 0..10 {
        let watched = p
            .try_complete_else_watch(never(), Duration::from_secs(30), &["a"])
            .unwrap_or_else(|_| panic!("refused"));
        assert!(watched.handle.force_complete());
    }
    assert_eq!(p.stats().purges, 0, "the purge waits in the timer");
    let handed_back = timer.shutdown();
    assert!(!handed_back.is_empty(), "the purge's task is handed back");
    drop(handed_back);
    offer_1000_refused(&p);
    let s = p.stats();
    assert_eq!(s.handed_back, 1_000);
    assert!(s.purges > 0, "no purge ran: {s:?}");
    // The ten completed cells and at most an interval's worth of refused ones (3 keys each).
    assert!(
        s.watched <= 10 + 3 * 10,
        "{} entries left in watch lists",
        s.watched
    );
    assert!(p.shutdown().is_empty());
}

/// A name with a NUL byte cannot name the own timer's threads: `try_build` says so with the
/// timer's error, and `build` panics with its message. Before, there was no `try_build`, and
/// `build` panicked with the timer's generic "invalid configuration" message.
#[test]
fn a_name_no_thread_can_have_is_a_build_error_from_try_build() {
    let built = std::panic::catch_unwind(|| P::builder().name("fetch\0").try_build().map(drop));
    let err = built
        .expect("try_build does not panic")
        .expect_err("a NUL byte in the name is refused");
    assert!(matches!(err, system_timer::BuildError::Spawn(_)), "{err:?}");
    let panic = std::panic::catch_unwind(|| drop(P::builder().name("fetch\0").build()))
        .expect_err("build panics on what try_build refuses");
    let message = panic
        .downcast_ref::<String>()
        .expect("a formatted panic message");
    assert!(message.contains("NUL"), "{message}");
    // With a shared timer there is no thread to spawn: the same name is fine.
    let timer = Arc::new(system_timer::SystemTimer::builder().reaper(false).build());
    let p = P::builder()
        .name("fetch\0")
        .timer(Arc::clone(&timer))
        .try_build()
        .expect("no own timer, nothing to refuse");
    assert_eq!(p.delayed(), 0);
    drop(p);
    assert!(timer.shutdown().is_empty());
}

/// Too many expiry threads is refused by `try_build` with the timer's error, whose message
/// names the purgatory's setting as well as the timer's (a helper's review: it named only
/// `executor_threads`, a setting the purgatory's user never used).
#[test]
fn too_many_expiry_threads_is_a_build_error_naming_the_setting() {
    let n = system_timer::MAX_EXECUTOR_THREADS + 1;
    let err = P::builder()
        .expiry_threads(n)
        .try_build()
        .expect_err("refused before any thread is spawned");
    assert_eq!(err, system_timer::BuildError::TooManyExecutorThreads(n));
    let message = err.to_string();
    assert!(
        message.contains("expiry_threads") && message.contains("1024"),
        "{message}"
    );
}

/// A shard count past any sensible one is capped (at `MAX_SHARDS`) instead of overflowing the
/// round-up to a power of two (a panic in a debug build, a silent 2 shards in a release one)
/// or allocating billions of shards.
#[test]
fn an_absurd_shard_count_is_capped_and_the_purgatory_works() {
    for n in [usize::MAX, usize::MAX / 2 + 1, purgatory::MAX_SHARDS + 1] {
        let clock = ManualClock::new(0);
        let p: P = within_20s("build", move || {
            Purgatory::builder()
                .clock(clock)
                .reaper(false)
                .shards(n)
                .build()
        });
        let op = Op {
            ready: false,
            shut_down: None,
        };
        let w = p
            .try_complete_else_watch(op, Duration::from_secs(1), &["a", "b"])
            .expect("accepted");
        assert!(!w.completed);
        assert_eq!(p.watched(), 2);
        assert!(w.handle.force_complete());
        assert_eq!(p.stats().completed, 1);
    }
}
