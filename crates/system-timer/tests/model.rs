//! Model-based test of `SystemTimer` on a [`ManualClock`]: hundreds of seeded random sequences
//! of adds (every public form: `add`, `add_keyed`, `add_at`, `add_at_keyed`; boxed closures,
//! `Arc`-shared tasks and a task type of its own), cancels (by handle and by key, twice, after
//! the task ran, across timers), clock moves and hand-driven advances (`advance`, `advance_to`,
//! `advance_to_ns`, `advance_clock(0)`, `advance_if_due`), handles dropped at once
//! (fire-and-forget), the clock pushed to the end of its range, and tasks that panic, cancel
//! other tasks, add new ones or advance the timer (nested) from inside their run, checked after
//! every step against a plain `BTreeMap` model of every task. The timer has no reaper and runs
//! its tasks inline, so the whole run is deterministic. Ticks of 1 ms (most sequences), 1.5 ms
//! and 7 ns; wheel sizes 2, 3 and 20; a `max_pending` cap in a fifth of the sequences.
//!
//! The rules the model holds the timer to (`timer.rs`'s ground rules, `bucket.rs`):
//!
//! * a task added with delay `d` when the clock reads `t` has the deadline `t + d`; one added at
//!   an instant has that instant; either is "never" past the clock's range (`Duration::MAX`);
//! * the wheel's time `W` is the last advance's clock reading rounded down to the tick (the
//!   start reading before any); a deadline `d` is due at `e = ⌈d / tick⌉ · tick`, or never if `d`
//!   is past the last multiple of the tick below `u64::MAX`;
//! * an add whose `e <= W` is dispatched at once: its handle says fired, its key matches nothing,
//!   it counts in `len()`, and it runs at the next advance (as does one in the wheel's last tick
//!   the clock has already reached); with a `max_pending` cap, an add while `cap` tasks wait in
//!   the wheel is refused with `Full` and hands its task back;
//! * an advance to time `t` runs exactly the tasks dispatched at once plus the pending tasks with
//!   `e <= ⌊t / tick⌋ · tick`, each once, at a clock reading at or after its deadline (never
//!   early, to the nanosecond), so no task whose `deadline + tick <= t` is left (at most a tick
//!   late); tasks added by those tasks wait for the next advance;
//! * `cancel` wins exactly when the task is pending, drops the task at once, and a cancelled task
//!   never runs; a task the running batch already took out cannot be cancelled;
//! * `len()`, `is_empty()` and every counter of `stats()` (lateness count, mean and max
//!   included) equal the model's exactly after every step, as do the handles' and keys' states
//!   and deadlines (of tasks that ran or were cancelled, and the wheel's own invariants, every
//!   eighth step); `next_expiration()` is at or before the earliest pending task's `e`;
//! * shutdown hands back exactly the model's pending tasks (seen through their drops).
//!
//! Every sequence is seeded from its index: a failure names its seed and step, and
//! `MODEL_SEED=<seed>` (with `MODEL_TRACE=1` to print each step) replays it alone;
//! `MODEL_SEQUENCES=<n>` runs more sequences (a longer search).
#![cfg(not(loom))]
#![allow(clippy::disallowed_types)] // tests use std's locks freely

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::time::Duration;

use system_timer::{
    Builder, ManualClock, ScheduleError, SharedTask, SystemTimer, Task, TimerHandle, TimerKey,
    TimerTask,
};

/// Sequences per test (each on a configuration of its own).
const SEQUENCES: u64 = 200;
/// Steps per sequence, before the final shutdown.
const STEPS: usize = 250;
const MS: u64 = 1_000_000;
/// Wheel sizes: two and three buckets per level make a deep hierarchy of overflow levels with
/// cascades on most advances; 20 is Kafka's default.
const SIZES: [usize; 3] = [2, 3, 20];

// ===== random numbers =====

mod common;

/// splitmix64 ([`common::splitmix`]), seeded per sequence.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0xA076_1D64_78BD_642F) ^ 0x5157_4D52_5449_4D45)
    }

    fn next(&mut self) -> u64 {
        common::splitmix(&mut self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

// ===== what the tasks do and record =====

/// When a task is due, as given to the timer.
#[derive(Clone, Copy, Debug)]
enum When {
    /// `add` / `add_keyed`: a delay from the clock's reading at the add.
    Delay(Duration),
    /// `add_at` / `add_at_keyed`: an instant on the clock.
    At(Duration),
}

/// What a task does when it runs (after recording that it ran).
#[derive(Clone, Debug)]
enum Action {
    Nothing,
    /// Panics (the timer must catch and count it).
    Panic,
    /// Cancels the task with this id, through its handle or key.
    Cancel(u64),
    /// Adds a new task.
    Add(Box<Spec>),
    /// Advances the timer (a nested advance: it runs what running tasks dispatched at once).
    Advance,
}

/// A task to add.
#[derive(Clone, Debug)]
struct Spec {
    id: u64,
    keyed: bool,
    /// Drops the handle at once (fire-and-forget: the task must still run).
    drop_handle: bool,
    when: When,
    action: Action,
}

/// What happened, in the order it happened (recorded by the tasks, on whatever thread).
#[derive(Debug)]
enum Event {
    /// Task `id` started running; the clock read `now`.
    Ran { id: u64, now: u64 },
    /// Task `id` was dropped without running (cancelled, refused or handed back).
    Dropped { id: u64 },
    /// Running task `by` cancelled task `target`; `won` is what the cancel returned.
    Cancelled { by: u64, target: u64, won: bool },
    /// Running task `by` added task `id` when the clock read `now`.
    Added {
        by: u64,
        id: u64,
        now: u64,
        outcome: Outcome,
    },
    /// Running task `by` starts advancing the timer.
    AdvanceBegin { by: u64 },
    /// ... and its advance returned `n`.
    AdvanceEnd { by: u64, n: usize },
}

/// The result of an add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Full,
    Shutdown,
}

/// A handle, with its task type erased (tasks cancel through handles too).
trait HandleOps: Send + Sync {
    fn cancel(&self) -> bool;
    fn is_pending(&self) -> bool;
    fn is_fired(&self) -> bool;
    fn is_cancelled(&self) -> bool;
    fn is_handed_back(&self) -> bool;
    fn deadline_ns(&self) -> u64;
    fn deadline(&self) -> Duration;
}

impl<T: TimerTask> HandleOps for TimerHandle<T>
where
    TimerHandle<T>: Send + Sync,
{
    fn cancel(&self) -> bool {
        TimerHandle::cancel(self)
    }
    fn is_pending(&self) -> bool {
        TimerHandle::is_pending(self)
    }
    fn is_fired(&self) -> bool {
        TimerHandle::is_fired(self)
    }
    fn is_cancelled(&self) -> bool {
        TimerHandle::is_cancelled(self)
    }
    fn is_handed_back(&self) -> bool {
        TimerHandle::is_handed_back(self)
    }
    fn deadline_ns(&self) -> u64 {
        TimerHandle::deadline_ns(self)
    }
    fn deadline(&self) -> Duration {
        TimerHandle::deadline(self)
    }
}

/// How a task added successfully is named.
#[derive(Clone)]
enum Ref {
    Handle(Arc<dyn HandleOps>),
    Key(TimerKey),
    /// The handle was dropped.
    Gone,
}

/// The timer, with its task type erased, for the tasks' own adds and cancels.
trait Sched: Send + Sync {
    fn add(&self, ctx: &Arc<Ctx>, spec: &Spec) -> Outcome;
    fn cancel(&self, key: TimerKey) -> bool;
    fn advance(&self) -> usize;
}

struct WeakTimer<T: Make>(Weak<SystemTimer<T>>);

impl<T: Make> Sched for WeakTimer<T> {
    fn add(&self, ctx: &Arc<Ctx>, spec: &Spec) -> Outcome {
        add(&self.0.upgrade().expect("the timer is alive"), ctx, spec)
    }
    fn cancel(&self, key: TimerKey) -> bool {
        self.0.upgrade().expect("the timer is alive").cancel(key)
    }
    fn advance(&self) -> usize {
        self.0.upgrade().expect("the timer is alive").advance()
    }
}

/// What one sequence's tasks share.
struct Ctx {
    clock: ManualClock,
    events: Mutex<Vec<Event>>,
    sched: OnceLock<Box<dyn Sched>>,
    /// The handle or key of every task added successfully, by id.
    refs: Mutex<BTreeMap<u64, Ref>>,
}

impl Ctx {
    fn log(&self, e: Event) {
        self.events.lock().unwrap().push(e);
    }

    fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }

    fn get_ref(&self, id: u64) -> Ref {
        self.refs
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .expect("known id")
    }
}

/// The payload of the panics tasks are asked to make (kept out of the test's output).
struct PlannedPanic;

/// The work of every task: records its run (or, if dropped without running, its drop), then
/// does its action.
struct Probe {
    id: u64,
    ctx: Arc<Ctx>,
    /// `Some` until the task runs.
    action: Option<Action>,
}

impl Probe {
    fn fire(mut self) {
        let action = self.action.take().expect("a task runs once");
        let (id, ctx) = (self.id, Arc::clone(&self.ctx));
        drop(self);
        ctx.log(Event::Ran {
            id,
            now: ctx.clock.now_ns(),
        });
        match action {
            Action::Nothing => {}
            Action::Panic => std::panic::panic_any(PlannedPanic),
            Action::Cancel(target) => {
                let won = match ctx.get_ref(target) {
                    Ref::Handle(h) => h.cancel(),
                    Ref::Key(k) => ctx.sched.get().expect("set").cancel(k),
                    Ref::Gone => return,
                };
                ctx.log(Event::Cancelled {
                    by: id,
                    target,
                    won,
                });
            }
            Action::Add(spec) => {
                let now = ctx.clock.now_ns();
                let outcome = ctx.sched.get().expect("set").add(&ctx, &spec);
                ctx.log(Event::Added {
                    by: id,
                    id: spec.id,
                    now,
                    outcome,
                });
            }
            Action::Advance => {
                ctx.log(Event::AdvanceBegin { by: id });
                let n = ctx.sched.get().expect("set").advance();
                ctx.log(Event::AdvanceEnd { by: id, n });
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if self.action.is_some() {
            self.ctx.log(Event::Dropped { id: self.id });
        }
    }
}

impl TimerTask for Probe {
    fn run(self) {
        self.fire();
    }
}

/// A task type the model can build from a [`Probe`].
trait Make: TimerTask + Sized {
    fn make(p: Probe) -> Self;
}

/// The task type of its own.
impl Make for Probe {
    fn make(p: Probe) -> Self {
        p
    }
}

/// The default task type: a boxed closure for even ids, an `Arc` run through
/// [`Task::from_arc`] for odd ones.
impl Make for Task {
    fn make(p: Probe) -> Self {
        if p.id % 2 == 0 {
            Task::new(move || p.fire())
        } else {
            Task::from_arc(Arc::new(SharedProbe(Mutex::new(Some(p)))))
        }
    }
}

struct SharedProbe(Mutex<Option<Probe>>);

impl SharedTask for SharedProbe {
    fn run_shared(self: Arc<Self>) {
        let p = self.0.lock().unwrap().take().expect("run once");
        p.fire();
    }
}

/// Adds the task `spec` describes through the form it names; records its handle or key.
fn add<T: Make>(timer: &SystemTimer<T>, ctx: &Arc<Ctx>, spec: &Spec) -> Outcome {
    let task = T::make(Probe {
        id: spec.id,
        ctx: Arc::clone(ctx),
        action: Some(spec.action.clone()),
    });
    let handle = |h: TimerHandle<T>| {
        if spec.drop_handle {
            drop(h);
            Ref::Gone
        } else {
            Ref::Handle(Arc::new(h))
        }
    };
    let added = match (spec.keyed, spec.when) {
        (false, When::Delay(d)) => timer.add(d, task).map(handle),
        (false, When::At(d)) => timer.add_at(d, task).map(handle),
        (true, When::Delay(d)) => timer.add_keyed(d, task).map(Ref::Key),
        (true, When::At(d)) => timer.add_at_keyed(d, task).map(Ref::Key),
    };
    match added {
        Ok(r) => {
            ctx.refs.lock().unwrap().insert(spec.id, r);
            Outcome::Ok
        }
        // The refused task is dropped here (and records it).
        Err(ScheduleError::Full(_)) => Outcome::Full,
        Err(ScheduleError::Shutdown(_)) => Outcome::Shutdown,
    }
}

// ===== the model =====

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// In the wheel.
    Pending,
    /// Dispatched at once when added: waits for the next advance.
    Ready,
    /// Taken out by the advance in progress (at this nesting depth), not yet seen running.
    InBatch(usize),
    Ran,
    Cancelled,
    HandedBack,
}

#[derive(Debug)]
struct MTask {
    keyed: bool,
    /// `None`: past the clock's range.
    deadline: Option<u64>,
    /// `⌈deadline / tick⌉ · tick`; `None`: never due.
    due: Option<u64>,
    /// Dispatched at once when added (its handle has no wheel entry).
    immediate: bool,
    panics: bool,
    st: St,
    /// Seen dropped without running.
    dropped: bool,
}

struct Model {
    tick: u64,
    /// The last multiple of the tick below `u64::MAX`: a later deadline is never due.
    max_expiration: u64,
    /// The wheel's time: the last advance's reading, rounded down to the tick.
    wheel_time: u64,
    cap: Option<usize>,
    tasks: BTreeMap<u64, MTask>,
    /// Tasks that running tasks will add, by id.
    planned: BTreeMap<u64, Spec>,
    /// Refused adds whose tasks have not yet been seen dropped.
    refused: BTreeSet<u64>,
    /// Tasks seen dropped before their add returned (refused adds made by running tasks).
    dropped_unknown: BTreeSet<u64>,
    next_id: u64,
    scheduled: u64,
    fired: u64,
    cancelled: u64,
    panicked: u64,
    handed_back: u64,
    late_sum: u128,
    late_max: u64,
    shut_down: bool,
    /// The tasks each nested advance (by a running task) took out, innermost last.
    nested: Vec<Vec<u64>>,
    /// Coverage: cancels and adds made by running tasks, adds refused as full.
    task_cancels: u64,
    task_adds: u64,
    task_advances: u64,
    /// Tasks run by nested advances.
    nested_runs: u64,
    /// Adds dispatched at once through the clock's-last-tick rule.
    last_tick: u64,
    /// Adds already due by the clock but not by the wheel's time (it lags the clock until the
    /// next advance): pending, then run by the next advance.
    behind: u64,
    full: u64,
}

impl Model {
    fn new(tick: u64, start: u64, cap: Option<usize>) -> Self {
        Model {
            tick,
            max_expiration: (u64::MAX - 1) - (u64::MAX - 1) % tick,
            wheel_time: start - start % tick,
            cap,
            tasks: BTreeMap::new(),
            planned: BTreeMap::new(),
            refused: BTreeSet::new(),
            dropped_unknown: BTreeSet::new(),
            next_id: 0,
            scheduled: 0,
            fired: 0,
            cancelled: 0,
            panicked: 0,
            handed_back: 0,
            late_sum: 0,
            late_max: 0,
            shut_down: false,
            nested: Vec::new(),
            task_cancels: 0,
            task_adds: 0,
            task_advances: 0,
            nested_runs: 0,
            last_tick: 0,
            behind: 0,
            full: 0,
        }
    }

    fn due(&self, deadline: Option<u64>) -> Option<u64> {
        let d = deadline?;
        if d > self.max_expiration {
            return None;
        }
        Some(d.div_ceil(self.tick) * self.tick)
    }

    fn count(&self, st: St) -> usize {
        self.tasks.values().filter(|t| t.st == st).count()
    }

    /// Tasks scheduled and not yet started, cancelled or handed back (`len()`).
    fn pending(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| matches!(t.st, St::Pending | St::Ready))
            .count()
    }

    /// Checks an add made when the clock read `now` against the model, and records it.
    fn added(&mut self, spec: &Spec, now: u64, outcome: Outcome, at: &str) {
        let deadline: Option<u64> = match spec.when {
            When::Delay(d) => u64::try_from(u128::from(now) + d.as_nanos()).ok(),
            When::At(d) => u64::try_from(d.as_nanos()).ok(),
        };
        let due = self.due(deadline);
        // A deadline in the wheel's last tick that the clock has reached is dispatched at once,
        // before the cap is looked at.
        let last_tick = deadline.is_some_and(|d| d > u64::MAX - self.tick && d <= now);
        let expect = if self.shut_down {
            Outcome::Shutdown
        } else if last_tick {
            Outcome::Ok
        } else if self.cap.is_some_and(|c| self.count(St::Pending) >= c) {
            Outcome::Full
        } else {
            Outcome::Ok
        };
        assert_eq!(
            outcome, expect,
            "{at}: add of task {} ({:?}, deadline {deadline:?}, wheel time {}, {} pending in the wheel)",
            spec.id, spec.when, self.wheel_time, self.count(St::Pending)
        );
        if outcome != Outcome::Ok {
            self.full += u64::from(outcome == Outcome::Full);
            if !self.dropped_unknown.remove(&spec.id) {
                self.refused.insert(spec.id);
            }
            return;
        }
        let immediate = last_tick || due.is_some_and(|e| e <= self.wheel_time);
        self.scheduled += 1;
        self.last_tick += u64::from(last_tick);
        self.behind += u64::from(!immediate && due.is_some_and(|e| e <= now));
        let prev = self.tasks.insert(
            spec.id,
            MTask {
                keyed: spec.keyed,
                deadline,
                due,
                immediate,
                panics: matches!(spec.action, Action::Panic),
                st: if immediate { St::Ready } else { St::Pending },
                dropped: false,
            },
        );
        assert!(prev.is_none(), "{at}: id {} reused", spec.id);
    }

    /// Records the start of an advance to `t` at nesting depth `depth`: the tasks it must run.
    fn begin_advance(&mut self, t: u64, depth: usize) -> Vec<u64> {
        self.wheel_time = self.wheel_time.max(t - t % self.tick);
        let w = self.wheel_time;
        let mut batch = Vec::new();
        for (&id, task) in &mut self.tasks {
            let take = match task.st {
                St::Ready => true,
                St::Pending => task.due.is_some_and(|e| e <= w),
                _ => false,
            };
            if take {
                task.st = St::InBatch(depth);
                batch.push(id);
            }
        }
        batch
    }

    /// Replays what the tasks recorded, in order, against the model. `now` is the clock's
    /// reading (it does not move while tasks run).
    fn apply(&mut self, events: Vec<Event>, now: u64, at: &str) {
        for e in events {
            match e {
                Event::Ran { id, now: ran_at } => {
                    let t = self.tasks.get_mut(&id).expect("known task ran");
                    assert_eq!(
                        t.st,
                        St::InBatch(self.nested.len()),
                        "{at}: task {id} ran ({t:?})"
                    );
                    assert_eq!(ran_at, now, "{at}: the clock moved under task {id}");
                    let d = t.deadline.expect("a task past the clock's range ran");
                    assert!(
                        ran_at >= d,
                        "{at}: task {id} ran early: at {ran_at} ns, deadline {d} ns"
                    );
                    t.st = St::Ran;
                    self.fired += 1;
                    if t.panics {
                        self.panicked += 1;
                    }
                    let late = ran_at - d;
                    self.late_sum += u128::from(late);
                    self.late_max = self.late_max.max(late);
                }
                Event::Dropped { id } => {
                    if self.refused.remove(&id) {
                        continue;
                    }
                    let Some(t) = self.tasks.get_mut(&id) else {
                        // A refused add by a running task: its task is dropped before the add
                        // returns (matched when the add is replayed).
                        assert!(self.dropped_unknown.insert(id), "{at}: {id} dropped twice");
                        continue;
                    };
                    assert!(!t.dropped, "{at}: task {id} dropped twice");
                    // A cancel by a running task drops its target before it returns: whether
                    // the drop matches a cancel or a hand-back is checked once the step is over.
                    t.dropped = true;
                }
                Event::Cancelled { by, target, won } => {
                    assert_eq!(self.tasks[&by].st, St::Ran, "{at}: canceller {by}");
                    let t = self.tasks.get_mut(&target).expect("known target");
                    assert_eq!(
                        won,
                        t.st == St::Pending,
                        "{at}: cancel of task {target} ({t:?}) by running task {by}"
                    );
                    if won {
                        t.st = St::Cancelled;
                        self.cancelled += 1;
                    }
                    self.task_cancels += 1;
                }
                Event::Added {
                    by,
                    id,
                    now: added_at,
                    outcome,
                } => {
                    assert_eq!(self.tasks[&by].st, St::Ran, "{at}: adder {by}");
                    assert_eq!(added_at, now, "{at}: the clock moved under task {by}");
                    let spec = self.planned.remove(&id).expect("planned child");
                    self.task_adds += 1;
                    self.added(&spec, added_at, outcome, at);
                }
                Event::AdvanceBegin { by } => {
                    assert_eq!(self.tasks[&by].st, St::Ran, "{at}: advancer {by}");
                    let batch = self.begin_advance(now, self.nested.len() + 1);
                    self.nested.push(batch);
                }
                Event::AdvanceEnd { by, n } => {
                    let batch = self.nested.pop().expect("a nested advance");
                    assert_eq!(
                        n,
                        batch.len(),
                        "{at}: nested advance by task {by}: {batch:?}"
                    );
                    for id in batch {
                        assert_eq!(self.tasks[&id].st, St::Ran, "{at}: task {id} (nested)");
                    }
                    self.task_advances += 1;
                    self.nested_runs += n as u64;
                }
            }
        }
    }
}

// ===== one sequence =====

/// A delay: zero, sub-tick, whole ticks, within the first levels, spanning many levels, huge,
/// `Duration::MAX`, or one that ends in the clock's last ticks.
fn random_delay(rng: &mut Rng, tick: u64, size: u64, now: u64) -> Duration {
    let ns = match rng.below(100) {
        0..=7 => 0,
        8..=17 => 1 + rng.below(tick.max(2) - 1),
        18..=27 => rng.below(4) * tick,
        28..=57 => rng.below(2 * size * tick),
        58..=84 => rng.below(size.pow(4).saturating_mul(tick)),
        85..=88 => rng.next(),
        89..=93 => return Duration::MAX,
        94..=96 => (u64::MAX - now).saturating_sub(rng.below(3 * tick)),
        _ => {
            return Duration::new(
                u64::MAX / 1_000_000_000 + rng.below(2),
                rng.below(1 << 30) as u32,
            )
        }
    };
    Duration::from_nanos(ns)
}

/// An instant: in the past, now, in the future (as a delay would be), or in the clock's last
/// ticks, or past its range.
fn random_instant(rng: &mut Rng, tick: u64, size: u64, now: u64) -> Duration {
    match rng.below(10) {
        0..=2 => Duration::from_nanos(now.saturating_sub(rng.below(3 * size * tick))),
        3 => Duration::from_nanos(now),
        4 => Duration::from_nanos(u64::MAX - rng.below(3 * tick)),
        _ => {
            let d = random_delay(rng, tick, size, now);
            Duration::from_nanos(now).saturating_add(d)
        }
    }
}

/// A clock move: none, sub-tick, a tick, a few ticks, a bucket's worth at the higher levels.
fn random_move(rng: &mut Rng, tick: u64, size: u64) -> u64 {
    match rng.below(100) {
        0..=9 => 0,
        10..=29 => 1 + rng.below(tick.max(2) - 1),
        30..=44 => tick,
        45..=74 => rng.below(3 * size) * tick + rng.below(tick),
        75..=94 => rng.below(size.pow(3).saturating_mul(tick)),
        _ => rng.below(size.pow(5).saturating_mul(tick)),
    }
}

/// What a new task does when it runs.
fn random_action(rng: &mut Rng, model: &mut Model, depth: u32) -> Action {
    match rng.below(100) {
        0..=69 => Action::Nothing,
        70..=74 => Action::Panic,
        75..=86 if !model.tasks.is_empty() => {
            let ids: Vec<u64> = model.tasks.keys().copied().collect();
            Action::Cancel(ids[rng.below(ids.len() as u64) as usize])
        }
        87..=89 => Action::Advance,
        90..=99 if depth < 2 => {
            let id = model.next_id;
            model.next_id += 1;
            // The child's time is measured from when it is added, not from now.
            let (tick, size) = (model.tick, 3);
            let when = if rng.percent(50) {
                When::Delay(random_delay(rng, tick, size, 0))
            } else {
                When::At(Duration::from_nanos(rng.below(1 << 40)))
            };
            let spec = Spec {
                id,
                keyed: rng.percent(50),
                drop_handle: rng.percent(10),
                when,
                action: random_action(rng, model, depth + 1),
            };
            model.planned.insert(id, spec.clone());
            Action::Add(Box::new(spec))
        }
        _ => Action::Nothing,
    }
}

/// Checks everything observable against the model; the handles and keys of tasks that ran or
/// were cancelled, and the wheel's own invariants, only when `all` (every few steps: most tasks
/// end so, and their states cannot change short of a bug). Returns the wheel's levels.
fn check<T: Make>(timer: &SystemTimer<T>, ctx: &Ctx, model: &Model, all: bool, at: &str) -> usize {
    let pending = model.pending();
    assert_eq!(timer.len(), pending, "{at}: len");
    assert_eq!(timer.is_empty(), pending == 0, "{at}: is_empty");
    let s = timer.stats();
    assert_eq!(
        (
            s.scheduled,
            s.fired,
            s.cancelled,
            s.panicked,
            s.handed_back,
            s.pending
        ),
        (
            model.scheduled,
            model.fired,
            model.cancelled,
            model.panicked,
            model.handed_back,
            pending as u64
        ),
        "{at}: stats (scheduled, fired, cancelled, panicked, handed_back, pending)"
    );
    assert_eq!(s.lateness.count, model.fired, "{at}: lateness count");
    assert_eq!(s.lateness.max_ns, model.late_max, "{at}: lateness max");
    let mean = model
        .late_sum
        .checked_div(u128::from(model.fired))
        .unwrap_or(0);
    assert_eq!(u128::from(s.lateness.mean_ns), mean, "{at}: lateness mean");
    if all {
        // The wheel's structural check walks every bucket: half the test's time at opt-level 0.
        timer.check_invariants();
    }

    let refs = ctx.refs.lock().unwrap();
    let mut earliest_due = None::<u64>;
    for (&id, t) in &model.tasks {
        let gone = matches!(t.st, St::Cancelled | St::HandedBack);
        assert_eq!(
            t.dropped, gone,
            "{at}: task {id} ({t:?}): dropped without running"
        );
        if t.st == St::Pending {
            if let Some(e) = t.due {
                earliest_due = Some(earliest_due.map_or(e, |x| x.min(e)));
            }
        }
        if !all && matches!(t.st, St::Ran | St::Cancelled) {
            continue;
        }
        let deadline_ns = t.deadline.unwrap_or(u64::MAX);
        match &refs[&id] {
            Ref::Handle(h) => {
                assert!(!t.keyed);
                let (fired, handed_back) = match t.st {
                    St::Pending | St::Cancelled => (false, false),
                    St::Ready | St::Ran => (true, false),
                    St::HandedBack => (t.immediate, !t.immediate),
                    St::InBatch(_) => unreachable!("{at}: task {id} left in a batch"),
                };
                let got = (
                    h.is_pending(),
                    h.is_fired(),
                    h.is_cancelled(),
                    h.is_handed_back(),
                );
                assert_eq!(
                    got,
                    (
                        t.st == St::Pending,
                        fired,
                        t.st == St::Cancelled,
                        handed_back
                    ),
                    "{at}: handle of task {id} ({t:?}): (pending, fired, cancelled, handed back)"
                );
                assert_eq!(h.deadline_ns(), deadline_ns, "{at}: task {id}");
                assert_eq!(h.deadline(), Duration::from_nanos(deadline_ns));
            }
            Ref::Key(k) => {
                assert!(t.keyed);
                assert_eq!(
                    timer.is_pending(*k),
                    t.st == St::Pending,
                    "{at}: key of task {id} ({t:?})"
                );
                let want = (t.st == St::Pending).then(|| Duration::from_nanos(deadline_ns));
                assert_eq!(timer.deadline(*k), want, "{at}: deadline of task {id}");
            }
            Ref::Gone => assert!(!t.keyed),
        }
    }
    assert!(
        model.refused.is_empty() && model.dropped_unknown.is_empty(),
        "{at}: refused tasks not dropped {:?}, unknown tasks dropped {:?}",
        model.refused,
        model.dropped_unknown
    );
    // The reaper's next wake-up is at or before the earliest pending task's due time.
    if let Some(e) = earliest_due {
        let next = timer.next_expiration();
        assert!(
            next.is_some_and(|x| x <= Duration::from_nanos(e)),
            "{at}: next expiration {next:?}, earliest pending due at {e} ns"
        );
    }
    s.levels
}

/// After the timer was advanced to `t`: no pending task is due by then, and none whose
/// deadline plus a tick is reached (at most a tick late).
fn check_nothing_overdue(model: &Model, t: u64, at: &str) {
    for (id, task) in &model.tasks {
        if task.st != St::Pending {
            continue;
        }
        if let Some(e) = task.due {
            assert!(
                e > t - t % model.tick,
                "{at}: task {id} ({task:?}) due, not run by {t}"
            );
            let d = task.deadline.expect("due");
            assert!(
                d.checked_add(model.tick).is_none_or(|late| late > t),
                "{at}: task {id} ({task:?}) more than a tick late at {t}"
            );
        }
    }
}

/// What an advance says it dispatched.
enum Dispatched {
    /// How many tasks (`advance*`).
    Count(usize),
    /// Whether any (`advance_clock`).
    Any(bool),
}

/// Drives the timer with `drive` after telling the model it advances to `t`, then replays the
/// tasks' records.
fn drive(ctx: &Ctx, model: &mut Model, t: u64, at: &str, drive: impl FnOnce() -> Dispatched) {
    let batch = model.begin_advance(t, 0);
    let expect = batch.len();
    if tracing() {
        eprintln!(
            "  advance to {t} (wheel time {}): expect {batch:?}",
            model.wheel_time
        );
    }
    let n = drive();
    let now = ctx.clock.now_ns();
    model.apply(ctx.take_events(), now, at);
    match n {
        Dispatched::Count(n) => {
            assert_eq!(n, expect, "{at}: tasks dispatched by the advance to {t}")
        }
        Dispatched::Any(any) => {
            assert_eq!(any, expect > 0, "{at}: advance_clock to {t} ({expect} due)")
        }
    }
    let left: Vec<_> = batch
        .into_iter()
        .filter(|id| model.tasks[id].st != St::Ran)
        .collect();
    assert!(left.is_empty(), "{at}: due but did not run: {left:?}");
    assert!(
        model.nested.is_empty(),
        "{at}: a nested advance did not end"
    );
    check_nothing_overdue(model, t, at);
}

/// Coverage counters, summed over the sequences: the test fails if a path was never taken.
#[derive(Default, Debug)]
struct Coverage {
    immediate: u64,
    fired: u64,
    cancelled_in_task: u64,
    cancel_lost: u64,
    added_in_task: u64,
    advanced_in_task: u64,
    nested_runs: u64,
    last_tick: u64,
    behind: u64,
    full: u64,
    never: u64,
    handed_back: u64,
    panicked: u64,
    max_levels: usize,
}

fn run_sequence<T: Make>(seed: u64, trace: bool) -> Coverage {
    let mut rng = Rng::new(seed);
    let tick = match seed % 8 {
        6 => 1_500_000, // not a whole millisecond: deadlines never fall on a tick by chance
        7 => 7,         // ns: many levels
        _ => MS,
    };
    let size = SIZES[(seed as usize / 8) % SIZES.len()];
    let cap = rng.percent(20).then(|| 1 + rng.below(30) as usize);
    let clock = ManualClock::new(0);
    // A start off the tick, or far into the clock's range.
    match rng.below(4) {
        0 => {}
        1 => clock.set_ns(rng.below(1 << 40)),
        2 => clock.set_ns(rng.next() >> 2),
        _ => clock.set_ms(rng.below(1000)),
    }
    let start = clock.now_ns();
    let mut b = Builder::<T>::new()
        .clock(clock.clone())
        .tick(Duration::from_nanos(tick))
        .wheel_size(size)
        .shards(1 << rng.below(4))
        .reaper(false)
        .inline();
    if let Some(c) = cap {
        b = b.max_pending(c);
    }
    let timer = Arc::new(b.build());
    let ctx = Arc::new(Ctx {
        clock: clock.clone(),
        events: Mutex::new(Vec::new()),
        sched: OnceLock::new(),
        refs: Mutex::new(BTreeMap::new()),
    });
    if ctx
        .sched
        .set(Box::new(WeakTimer(Arc::downgrade(&timer))))
        .is_err()
    {
        unreachable!();
    }
    // Another timer on the same clock, with a pending task: keys never cross timers.
    let other: SystemTimer = SystemTimer::builder()
        .clock(clock.clone())
        .reaper(false)
        .inline()
        .build();
    let other_key = other.add_keyed(Duration::MAX, || ()).unwrap();

    let mut model = Model::new(tick, start, cap);
    let mut cov = Coverage::default();
    let size64 = size as u64;
    let cfg = format!("seed {seed} (tick {tick} ns, size {size}, cap {cap:?}, start {start})");
    for step in 0..STEPS {
        let now = clock.now_ns();
        let op = rng.below(100);
        let at = format!("{cfg} step {step} op {op} at {now} ns");
        if trace {
            eprintln!("{at}");
        }
        match op {
            // Adds, through each form.
            0..=39 => {
                let id = model.next_id;
                model.next_id += 1;
                let when = if rng.percent(60) {
                    When::Delay(random_delay(&mut rng, tick, size64, now))
                } else {
                    When::At(random_instant(&mut rng, tick, size64, now))
                };
                let spec = Spec {
                    id,
                    keyed: rng.percent(50),
                    drop_handle: rng.percent(10),
                    when,
                    action: random_action(&mut rng, &mut model, 0),
                };
                if trace {
                    eprintln!("  add {spec:?}");
                }
                let outcome = add(&timer, &ctx, &spec);
                model.added(&spec, now, outcome, &at);
                model.apply(ctx.take_events(), now, &at);
            }
            // Cancels through the handle or key, of tasks in any state.
            40..=54 => {
                if let Some(&id) = model
                    .tasks
                    .keys()
                    .nth(rng.below(model.tasks.len().max(1) as u64) as usize)
                {
                    let won = match ctx.get_ref(id) {
                        Ref::Handle(h) => h.cancel(),
                        Ref::Key(k) => timer.cancel(k),
                        Ref::Gone => continue,
                    };
                    let t = model.tasks.get_mut(&id).unwrap();
                    if trace {
                        eprintln!("  cancel {id} ({t:?}): {won}");
                    }
                    assert_eq!(
                        won,
                        t.st == St::Pending,
                        "{at}: cancel of task {id} ({t:?})"
                    );
                    if won {
                        t.st = St::Cancelled;
                        model.cancelled += 1;
                    } else {
                        cov.cancel_lost += 1;
                    }
                    model.apply(ctx.take_events(), now, &at);
                }
            }
            // The clock moves; the timer is advanced (or not).
            55..=84 => {
                let by = random_move(&mut rng, tick, size64);
                clock.advance(Duration::from_nanos(by));
                let now = clock.now_ns();
                match rng.below(10) {
                    0..=5 => drive(&ctx, &mut model, now, &at, || {
                        Dispatched::Count(timer.advance())
                    }),
                    6 => {
                        // An explicit time: behind the clock, or ahead of it (clamped).
                        let to = if rng.percent(50) {
                            now.saturating_sub(rng.below(3 * tick))
                        } else {
                            now.saturating_add(rng.below(3 * tick))
                        };
                        drive(&ctx, &mut model, to.min(now), &at, || {
                            Dispatched::Count(timer.advance_to_ns(to))
                        });
                    }
                    7 => {
                        let ms = now / MS - rng.below(2).min(now / MS);
                        drive(&ctx, &mut model, (ms * MS).min(now), &at, || {
                            Dispatched::Count(timer.advance_to(ms))
                        });
                    }
                    8 => {
                        // Advances only if a bucket is due or a task waits to run.
                        let due = timer
                            .next_expiration()
                            .is_some_and(|x| x.as_nanos() <= u128::from(now))
                            || model.count(St::Ready) > 0;
                        if due {
                            drive(&ctx, &mut model, now, &at, || {
                                Dispatched::Any(timer.advance_clock(Duration::ZERO))
                            });
                        } else {
                            assert!(!timer.advance_clock(Duration::ZERO), "{at}");
                            model.apply(ctx.take_events(), now, &at);
                        }
                    }
                    _ => {
                        // No reaper to help: a no-op.
                        assert_eq!(timer.advance_if_due(), 0, "{at}");
                        assert_eq!(
                            timer.advance_if_due_at(Duration::from_nanos(now)),
                            0,
                            "{at}"
                        );
                        model.apply(ctx.take_events(), now, &at);
                    }
                }
            }
            // An advance without a clock move (runs tasks dispatched at once).
            85..=89 => drive(&ctx, &mut model, now, &at, || {
                Dispatched::Count(timer.advance())
            }),
            // Keys never cross timers.
            90..=91 => {
                assert!(!timer.cancel(other_key), "{at}");
                assert!(!timer.is_pending(other_key) && timer.deadline(other_key).is_none());
                assert!(other.is_pending(other_key));
                let keys: Vec<(u64, TimerKey)> = ctx
                    .refs
                    .lock()
                    .unwrap()
                    .iter()
                    .filter_map(|(&id, r)| match r {
                        Ref::Key(k) => Some((id, *k)),
                        Ref::Handle(_) | Ref::Gone => None,
                    })
                    .collect();
                for (_, k) in keys.iter().take(3) {
                    assert!(!other.cancel(*k) && !other.is_pending(*k), "{at}");
                }
            }
            // The clock jumps near (or to) the end of its range, rarely.
            92 if rng.percent(3) => {
                if rng.percent(50) {
                    clock.advance(Duration::MAX);
                } else {
                    clock.set_ns(u64::MAX - rng.below(3 * tick));
                }
                let now = clock.now_ns();
                drive(&ctx, &mut model, now, &at, || {
                    Dispatched::Count(timer.advance())
                });
            }
            _ => {}
        }
        let levels = check(&timer, &ctx, &model, step % 8 == 0, &at);
        cov.max_levels = cov.max_levels.max(levels);
    }

    // Shutdown hands back exactly the pending tasks (dropped by the caller here).
    let at = format!("{cfg} shutdown");
    let expect: BTreeSet<u64> = model
        .tasks
        .iter()
        .filter(|(_, t)| matches!(t.st, St::Pending | St::Ready))
        .map(|(id, _)| *id)
        .collect();
    let back = timer.shutdown();
    assert_eq!(back.len(), expect.len(), "{at}: handed back");
    let events = ctx.take_events();
    assert!(
        events.is_empty(),
        "{at}: tasks ran or were dropped: {events:?}"
    );
    drop(back);
    let dropped: BTreeSet<u64> = ctx
        .take_events()
        .into_iter()
        .map(|e| match e {
            Event::Dropped { id } => id,
            e => panic!("{at}: {e:?}"),
        })
        .collect();
    assert_eq!(dropped, expect, "{at}: the tasks handed back");
    for id in &expect {
        let t = model.tasks.get_mut(id).unwrap();
        t.st = St::HandedBack;
        t.dropped = true;
        model.handed_back += 1;
    }
    model.shut_down = true;
    let _ = check(&timer, &ctx, &model, true, &at);
    // After shutdown: every cancel loses, adds are refused with the task handed back.
    for (&id, t) in &model.tasks {
        let won = match ctx.get_ref(id) {
            Ref::Handle(h) => h.cancel(),
            Ref::Key(k) => timer.cancel(k),
            Ref::Gone => false,
        };
        assert!(!won, "{at}: cancel of task {id} ({t:?}) after shutdown");
    }
    let spec = Spec {
        id: model.next_id,
        keyed: seed % 2 == 0,
        drop_handle: false,
        when: When::Delay(Duration::ZERO),
        action: Action::Nothing,
    };
    let outcome = add(&timer, &ctx, &spec);
    model.added(&spec, clock.now_ns(), outcome, &at);
    model.apply(ctx.take_events(), clock.now_ns(), &at);
    let _ = check(&timer, &ctx, &model, true, &at);
    assert!(timer.shutdown().is_empty(), "{at}: a second shutdown");
    let s = timer.stats();
    assert_eq!(
        s.scheduled,
        s.fired + s.cancelled + s.handed_back,
        "{at}: {s:?}"
    );

    for t in model.tasks.values() {
        cov.immediate += u64::from(t.immediate);
        cov.never += u64::from(t.due.is_none());
    }
    cov.fired = model.fired;
    cov.handed_back = model.handed_back;
    cov.panicked = model.panicked;
    cov.full = model.full;
    cov.cancelled_in_task = model.task_cancels;
    cov.added_in_task = model.task_adds;
    cov.advanced_in_task = model.task_advances;
    cov.nested_runs = model.nested_runs;
    cov.last_tick = model.last_tick;
    cov.behind = model.behind;
    cov
}

fn tracing() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("MODEL_TRACE").is_some())
}

fn quiet_planned_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<PlannedPanic>() {
                default(info);
            }
        }));
    });
}

fn run_all<T: Make>(first: u64) {
    quiet_planned_panics();
    let trace = tracing();
    let seeds: Vec<u64> = match std::env::var("MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("MODEL_SEED is a number")],
        Err(_) => {
            let n = std::env::var("MODEL_SEQUENCES").map_or(SEQUENCES, |n| {
                n.parse().expect("MODEL_SEQUENCES is a number")
            });
            (first..first + n).collect()
        }
    };
    let mut total = Coverage::default();
    for seed in seeds.iter().copied() {
        let cov = match catch_unwind(AssertUnwindSafe(|| run_sequence::<T>(seed, trace))) {
            Ok(c) => c,
            Err(p) => {
                eprintln!("model: seed {seed} failed (replay with MODEL_SEED={seed})");
                std::panic::resume_unwind(p);
            }
        };
        total.immediate += cov.immediate;
        total.fired += cov.fired;
        total.cancel_lost += cov.cancel_lost;
        total.cancelled_in_task += cov.cancelled_in_task;
        total.added_in_task += cov.added_in_task;
        total.advanced_in_task += cov.advanced_in_task;
        total.nested_runs += cov.nested_runs;
        total.last_tick += cov.last_tick;
        total.behind += cov.behind;
        total.full += cov.full;
        total.never += cov.never;
        total.handed_back += cov.handed_back;
        total.panicked += cov.panicked;
        total.max_levels = total.max_levels.max(cov.max_levels);
    }
    if seeds.len() > 1 {
        eprintln!("model coverage: {total:?}");
        assert!(total.immediate > 0 && total.fired > 0 && total.cancel_lost > 0);
        assert!(total.never > 0 && total.handed_back > 0 && total.panicked > 0);
        assert!(total.cancelled_in_task > 0 && total.added_in_task > 0);
        assert!(total.advanced_in_task > 0 && total.nested_runs > 0);
        assert!(total.last_tick > 0 && total.behind > 0);
        assert!(total.full > 0, "no add refused as Full");
        assert!(total.max_levels >= 6, "levels: {}", total.max_levels);
    }
}

/// The default task type (boxed closures and `Arc`-shared tasks).
#[test]
fn boxed_and_shared_tasks_match_the_model() {
    run_all::<Task>(0);
}

/// A task type of its own (no box).
#[test]
fn a_task_type_of_its_own_matches_the_model() {
    run_all::<Probe>(1_000_000);
}
