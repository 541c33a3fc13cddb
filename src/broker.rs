//! A broker-like simulation of the purgatory's main use (Kafka's DelayedProduce and
//! DelayedFetch), run by `examples/broker.rs` and checked by `tests/broker.rs`.
//!
//! * Partitions have a leader log end offset (LEO) and a high watermark (HW); follower threads
//!   fetch from the leaders (their offsets move to the LEO after a random lag; sometimes a
//!   follower's fetches from half the leaders stall) and the leader advances the HW to the
//!   smallest follower offset.
//! * Producers append to 1–3 partitions with acks=all: a `DelayedProduce` completes when the
//!   HW has passed its offset on every partition it wrote, or times out with its
//!   `REQUEST_TIMED_OUT` status preset (as Kafka's `DelayedProduce`).
//! * Consumers fetch with `min_bytes` and `max_wait` (a `DelayedFetch`): complete once at
//!   least `min_bytes` below the HW are available across their partitions, or at `max_wait`
//!   with whatever there is.
//! * Every HW move calls `check_and_complete` on both purgatories for that partition.
//!
//! What a run checks (its [`Report`]'s problems and [`Report::check`]):
//! * every produce and fetch is answered exactly once; a produce reports `None` on exactly the
//!   partitions whose HW its last `try_complete` saw at or past its offset, and
//!   `REQUEST_TIMED_OUT` on the others (a timed-out produce included, as Kafka's);
//! * no expiry before its timeout, nor later than [`LATE_EXPIRY`] after it;
//! * no lost wake-up: every HW raise is logged (value and time) right after the `fetch_max` that
//!   made it, whether or not a check follows, with the time the raising thread's checks of both
//!   purgatories then returned. An operation must be found ready by the check that follows the
//!   raise that made it ready (or by its own second try): found later (healed by a later check),
//!   or expired after that check returned, or after a raise no check followed, is a lost
//!   wake-up;
//! * outcomes: some produces acknowledged and some fetches satisfied, some of each by a check
//!   after they were watched;
//! * progress: a run whose logs and HWs stop moving while a consumer is behind (a stuck
//!   follower or producer) ends with a problem after [`Config::progress_timeout`] (or 20 times
//!   the longest configured pause, if longer) instead of hanging.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // simulation threads and locks

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{DelayedOperation, Purgatory, ReadyHint};

use crate::rng::SplitMix64;

/// How much later than its timeout an expiry may come before the run reports it: generous, for
/// a loaded 2-core machine (the timer's own precision is checked elsewhere, not here).
pub const LATE_EXPIRY: Duration = Duration::from_secs(1);

/// A produce's per-partition outcome, as Kafka's error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Acknowledged by every replica (HW passed the offset).
    None,
    /// Preset at construction; what an expired produce reports for unacknowledged partitions.
    RequestTimedOut,
}

/// Simulation parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// Partitions.
    pub partitions: u32,
    /// Follower replicas per partition.
    pub followers: usize,
    /// Producer threads.
    pub producers: usize,
    /// Produce requests per producer.
    pub produces_each: usize,
    /// Consumer threads.
    pub consumers: usize,
    /// Produce timeout (Kafka's `timeout.ms` of an acks=all produce).
    pub produce_timeout: Duration,
    /// Fetch `max.wait.ms`.
    pub fetch_max_wait: Duration,
    /// Fetch `min.bytes`.
    pub min_bytes: u64,
    /// Longest ordinary follower lag.
    pub follower_lag: Duration,
    /// Every `stall_every`-th round of a follower starts a stall of twice the produce timeout,
    /// in which it replicates only the first half of the partitions (those of the second half
    /// wait), so some produces time out, some of them with a partition acknowledged.
    pub stall_every: u64,
    /// Pause of a producer after every 4 requests.
    pub produce_pace: Duration,
    /// Print live stats every this often (`None`: quiet).
    pub stats_every: Option<Duration>,
    /// Random seed.
    pub seed: u64,
    /// Fetches the simulation can log (one byte each); a consumer that would issue more stops
    /// and the run reports it as a problem.
    pub max_fetches: usize,
    /// Fault injection, for the simulation's own failure path: follower 0 panics in its round
    /// of this number (`None`: never). A follower that dies (this, or a panic a check
    /// re-raised) stops the high watermark, so the consumers stop fetching and the run reports
    /// it as a problem, at once: before, they fetched until `max_fetches` (hours).
    pub follower_panics_in_round: Option<u64>,
    /// Fault injection: follower 0 stops in its round of this number (`None`: never) and stays
    /// stopped, without a panic, until the run ends. The HW stops moving; the run must end by
    /// its no-progress detection (see `progress_timeout`), with a problem.
    pub follower_stalls_in_round: Option<u64>,
    /// A consumer that has not caught up stops, and the run reports it as a problem, once no
    /// append and no HW move has happened for this long, or for 20 times the longest pause the
    /// configuration makes (a follower stall of twice the produce timeout, the follower lag, the
    /// producers' pace, the fetch wait), if that is longer: something is stuck. Before, such a
    /// run fetched until `max_fetches` (hours).
    pub progress_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            partitions: 8,
            followers: 2,
            producers: 4,
            produces_each: 2_000,
            consumers: 4,
            produce_timeout: Duration::from_millis(100),
            fetch_max_wait: Duration::from_millis(50),
            min_bytes: 4_096,
            follower_lag: Duration::from_millis(3),
            stall_every: 300,
            produce_pace: Duration::from_millis(2),
            stats_every: Some(Duration::from_millis(500)),
            seed: 42,
            max_fetches: 1_000_000,
            follower_panics_in_round: None,
            follower_stalls_in_round: None,
            progress_timeout: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// How long without an append or a HW move counts as stuck (see `progress_timeout`).
    fn stuck_after(&self) -> Duration {
        let longest = (self.produce_timeout * 2) // a follower's stall
            .max(self.follower_lag)
            .max(self.produce_pace)
            .max(self.fetch_max_wait);
        self.progress_timeout.max(longest.saturating_mul(20))
    }
}

/// What the simulation observed; [`Report::check`] says whether every request was answered
/// exactly once with the right status, and the run's outcomes are plausible.
#[derive(Debug, Default)]
pub struct Report {
    /// Produce requests issued.
    pub produces: usize,
    /// Produce responses with every partition acknowledged.
    pub produces_acked: usize,
    /// Produce responses that timed out (some partition `REQUEST_TIMED_OUT`).
    pub produces_timed_out: usize,
    /// Of those, the ones with some partition acknowledged (`None`).
    pub produces_partly_acked: usize,
    /// Produces found ready by a check after their `try_complete_else_watch` had returned (a
    /// lower bound of those a check completed: one completed by a check racing the call's
    /// return is not counted).
    pub produces_woken: usize,
    /// Fetch requests issued.
    pub fetches: usize,
    /// Fetches answered before `max_wait` (with at least `min_bytes`).
    pub fetches_satisfied: usize,
    /// Fetches answered at `max_wait`.
    pub fetches_expired: usize,
    /// Fetches found ready by a check after they were watched (as `produces_woken`).
    pub fetches_woken: usize,
    /// The latest expiry, past its timeout (produces and fetches).
    pub max_expiry_lateness: Duration,
    /// Problems found (empty when everything checked out).
    pub problems: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Report {
    /// Ok if every produce and fetch was answered exactly once with a consistent status, and
    /// the outcomes show the checks at work: a run that issued produces must have acknowledged
    /// some, and woken some (found them ready by a check after they were watched); one that
    /// issued fetches, satisfied some and woken some. (Counts, not rates: every configuration
    /// the simulation ships makes hundreds of each even on a loaded machine; a zero means the
    /// checks completed nothing.)
    pub fn check(&self) -> Result<(), String> {
        let mut problems = self.problems.clone();
        if self.produces > 0 && self.produces_acked == 0 {
            problems.push(format!(
                "none of {} produces was acknowledged",
                self.produces
            ));
        }
        if self.produces > 0 && self.produces_woken == 0 {
            problems.push(format!(
                "none of {} produces was completed by a check after it was watched",
                self.produces
            ));
        }
        if self.fetches > 0 && self.fetches_satisfied == 0 {
            problems.push(format!("none of {} fetches was satisfied", self.fetches));
        }
        if self.fetches > 0 && self.fetches_woken == 0 {
            problems.push(format!(
                "none of {} fetches was completed by a check after it was watched",
                self.fetches
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// A raise of a partition's HW.
#[derive(Clone, Copy, Debug)]
struct Raise {
    /// The HW it raised to.
    hw: u64,
    /// Read right after the `fetch_max` that raised it.
    at: Instant,
    /// When the raising thread's checks of both purgatories, which follow the raise, had
    /// returned (`None`: no check followed, or not yet).
    checked: Option<Instant>,
}

struct Partition {
    leo: AtomicU64,
    hw: AtomicU64,
    followers: Vec<AtomicU64>,
    /// Every raise of the HW, written right after the raise whether or not a check follows (the
    /// raising thread fills in `checked` of its own raise once its checks have returned): the
    /// lost-wake-up oracle (see `lost_wake_up`) knows every HW move, not only the checked ones.
    raises: Mutex<Vec<Raise>>,
}

struct Log {
    partitions: Vec<Partition>,
    /// The run's start, and the last append or HW raise (ns after `t0`): progress.
    t0: Instant,
    progress: AtomicU64,
}

impl Log {
    fn new(partitions: u32, followers: usize) -> Log {
        Log {
            partitions: (0..partitions)
                .map(|_| Partition {
                    leo: AtomicU64::new(0),
                    hw: AtomicU64::new(0),
                    followers: (0..followers).map(|_| AtomicU64::new(0)).collect(),
                    raises: Mutex::new(Vec::new()),
                })
                .collect(),
            t0: Instant::now(),
            progress: AtomicU64::new(0),
        }
    }

    fn hw(&self, p: u32) -> u64 {
        self.partitions[p as usize].hw.load(SeqCst)
    }

    fn note_progress(&self) {
        let now = u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.progress.fetch_max(now, SeqCst);
    }

    /// How long since the last append or HW raise.
    fn idle_for(&self) -> Duration {
        let last = Duration::from_nanos(self.progress.load(SeqCst));
        self.t0.elapsed().saturating_sub(last)
    }

    /// Appends `bytes` to partition `p`: the new LEO.
    fn append(&self, p: u32, bytes: u64) -> u64 {
        let end = self.partitions[p as usize].leo.fetch_add(bytes, SeqCst) + bytes;
        self.note_progress();
        end
    }

    /// Logs a raise of partition `p`'s HW to `hw` (just done): its index in the log.
    fn note_raise(&self, p: usize, hw: u64) -> usize {
        let at = Instant::now();
        self.note_progress();
        let mut raises = self.partitions[p].raises.lock().unwrap();
        raises.push(Raise {
            hw,
            at,
            checked: None,
        });
        raises.len() - 1
    }

    /// Notes that the checks following raise `i` of partition `p` have returned.
    fn note_checked(&self, p: usize, i: usize) {
        self.partitions[p].raises.lock().unwrap()[i].checked = Some(Instant::now());
    }

    /// The raise log, each partition's sorted by time (for the final pass, once the followers
    /// have stopped).
    fn raises(&self) -> Raises {
        Raises(
            self.partitions
                .iter()
                .map(|part| {
                    let mut raises = part.raises.lock().unwrap().clone();
                    raises.sort_by_key(|r| r.at);
                    raises
                })
                .collect(),
        )
    }
}

/// The raise log of every partition, each sorted by time.
struct Raises(Vec<Vec<Raise>>);

impl Raises {
    /// The raise that first made `ready` hold of the HWs of `parts` (in order), going by the
    /// raises in the order of their times: every raise up to it had been made (its `fetch_max`
    /// done) by its time, so the checks that follow it see them all.
    fn first_ready(&self, parts: &[u32], ready: impl Fn(&[u64]) -> bool) -> Option<Raise> {
        let mut hw = vec![0u64; parts.len()];
        let mut next = vec![0usize; parts.len()];
        loop {
            // The earliest raise not yet taken, across the partitions.
            let (k, raise) = parts
                .iter()
                .enumerate()
                .filter_map(|(k, &p)| self.0[p as usize].get(next[k]).map(|r| (k, *r)))
                .min_by_key(|(_, r)| r.at)?;
            next[k] += 1;
            hw[k] = hw[k].max(raise.hw);
            if ready(&hw) {
                return Some(raise);
            }
        }
    }
}

/// Whether an operation missed the wake-up of `made_ready`, the raise that made it ready (see
/// `Raises::first_ready`), and how (the problem's text). `entered`: when its
/// `try_complete_else_watch` returned (its second try done, after its watches); `found`: when
/// `try_complete` found it ready (`None`: completed by expiry), taken before the purgatory marks
/// it completed; `expired_by`: if it expired, a time no later than the expiry's marking it
/// completed (see `expired_by`).
///
/// Once it was watched, the check that follows `made_ready` must find it ready (it sees every
/// raise up to that one, and a visit finds it pending, or completed: found ready earlier); if
/// `made_ready` came before the second try, that try found it ready. So found ready after both
/// (`entered` and that check's return) is a lost wake-up that a later check healed, and expired
/// after that check returned is one that nothing healed. A raise that no check followed (the
/// simulation skipped it) leaves waiting every operation it made ready: found ready after that
/// raise (and `entered`), or expired after it, is a lost wake-up too.
fn lost_wake_up(
    made_ready: Option<Raise>,
    entered: Instant,
    found: Option<Instant>,
    expired_by: Option<Instant>,
) -> Option<String> {
    let r = made_ready?;
    match (found, expired_by, r.checked) {
        (Some(found), _, Some(checked)) => {
            let due = checked.max(entered);
            (found > due).then(|| {
                format!(
                    "found ready {:?} after the check following the HW move that made it ready \
                     had returned (a lost wake-up, healed by a later check)",
                    found - due
                )
            })
        }
        (Some(found), _, None) => {
            let due = r.at.max(entered);
            (found > due).then(|| {
                format!(
                    "found ready {:?} after the HW move (to {}) that made it ready, which no \
                     check followed (a lost wake-up, healed by a later check)",
                    found - due,
                    r.hw
                )
            })
        }
        (None, Some(expired_by), Some(checked)) => (checked < expired_by).then(|| {
            format!(
                "expired although the check following the HW move that made it ready had \
                 returned {:?} before (a lost wake-up)",
                expired_by - checked
            )
        }),
        (None, Some(expired_by), None) => (r.at < expired_by).then(|| {
            format!(
                "expired {:?} after the HW move (to {}) that made it ready, which no check \
                 followed (a lost wake-up)",
                expired_by - r.at,
                r.hw
            )
        }),
        (None, None, _) => None,
    }
}

/// For an expired operation: a time no later than the expiry's marking it completed, so that
/// a check that returned before it had visited the operation pending. Both bounds hold: the
/// timer fires no earlier than `issued + timeout` (an early expiry is reported on its own), and
/// `on_complete` begins after the mark. Not `completing_at` alone: a check that visits the
/// operation once the expiry has marked it returns at once, without the lock, possibly before
/// `on_complete` has read the clock (with an `on_complete` that takes time, often).
fn expired_by(completing_at: Instant, issued: Instant, timeout: Duration) -> Instant {
    completing_at.min(issued + timeout)
}

/// One produce partition: its required offset, its status (preset to `RequestTimedOut`), and
/// the HW its status was last decided on.
#[derive(Clone, Copy, Debug)]
struct ProducePart {
    p: u32,
    required: u64,
    status: Status,
    /// The HW the last `try_complete` that looked at this partition read.
    hw_seen: u64,
}

/// One produce response.
struct ProduceResponse {
    /// Per partition, with the HW when the response was built.
    statuses: Vec<(ProducePart, u64)>,
    expired: bool,
    /// Expired before its timeout had passed (the timer promises never early).
    expired_early: bool,
    /// How long after its timeout it expired (zero if not expired).
    expiry_lateness: Duration,
    /// When `try_complete` found it ready (`None`: completed by expiry). Before the purgatory
    /// marks it completed, so before any check that sees it completed returns.
    ready_at: Option<Instant>,
    /// If expired: no later than the expiry marked it completed (see `expired_by`).
    expired_by: Option<Instant>,
}

/// Kafka's `DelayedProduce` (acks = all).
struct DelayedProduce {
    id: usize,
    log: Arc<Log>,
    parts: Vec<ProducePart>,
    /// Per partition, set once `try_complete` has acknowledged it: what the ready hint reads.
    acked: Arc<Vec<AtomicBool>>,
    expired: bool,
    /// Read before the purgatory took it, and its timeout: an expiry must not come earlier.
    issued: Instant,
    timeout: Duration,
    /// When `on_complete` began (see `on_expiration`).
    completing_at: Option<Instant>,
    /// When `try_complete` found it ready.
    ready_at: Option<Instant>,
    responses: Arc<Vec<Mutex<Option<ProduceResponse>>>>,
    answered: Arc<Vec<AtomicU8>>,
}

impl DelayedOperation for DelayedProduce {
    fn try_complete(&mut self) -> bool {
        for (part, acked) in self.parts.iter_mut().zip(self.acked.iter()) {
            if part.status != Status::None {
                part.hw_seen = self.log.hw(part.p);
                if part.hw_seen >= part.required {
                    part.status = Status::None;
                    acked.store(true, SeqCst);
                }
            }
        }
        let ready = self.parts.iter().all(|part| part.status == Status::None);
        if ready {
            self.ready_at = Some(Instant::now());
        }
        ready
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        // A check skips this produce without its lock while try_complete would change nothing:
        // no partition it has not acknowledged yet has its HW at the offset (HWs only grow).
        // Not "until every partition's HW has reached its offset": try_complete acknowledges
        // partitions one by one, and a produce that then times out reports NONE for those (as
        // Kafka's, whose every check runs tryComplete); a hint that skipped the partial steps
        // would report them REQUEST_TIMED_OUT.
        let (log, acked) = (Arc::clone(&self.log), Arc::clone(&self.acked));
        let needs: Vec<(u32, u64)> = self
            .parts
            .iter()
            .map(|part| (part.p, part.required))
            .collect();
        Some(ReadyHint::new(move || {
            needs
                .iter()
                .zip(acked.iter())
                .any(|(&(p, r), a)| !a.load(SeqCst) && log.hw(p) >= r)
        }))
    }
    fn on_complete(&mut self) {
        self.completing_at = Some(Instant::now());
        // Built from the statuses as they stand: on expiry, unacknowledged partitions keep the
        // preset REQUEST_TIMED_OUT. (Kafka calls onComplete before onExpiration, so `expired`
        // is recorded by on_expiration below.)
        let statuses = self
            .parts
            .iter()
            .map(|&part| (part, self.log.hw(part.p)))
            .collect();
        self.answered[self.id].fetch_add(1, SeqCst);
        *self.responses[self.id].lock().unwrap() = Some(ProduceResponse {
            statuses,
            expired: false,
            expired_early: false,
            expiry_lateness: Duration::ZERO,
            ready_at: self.ready_at,
            expired_by: None,
        });
    }
    fn on_expiration(&mut self) {
        self.expired = true;
        let elapsed = self.issued.elapsed();
        let completing_at = self.completing_at.expect("on_complete ran first");
        if let Some(r) = self.responses[self.id].lock().unwrap().as_mut() {
            r.expired = true;
            r.expired_early = elapsed < self.timeout;
            r.expiry_lateness = elapsed.saturating_sub(self.timeout);
            r.expired_by = Some(expired_by(completing_at, self.issued, self.timeout));
        }
    }
}

/// One fetch response.
struct FetchResponse {
    bytes: u64,
    /// Per partition, the offset the data returned ends at (the HW when the response was
    /// built): the consumer's next fetch offset. Empty if the fetch never completed.
    ends: Vec<u64>,
    expired: bool,
    /// When `try_complete` found it ready (`None`: completed by expiry); see
    /// `ProduceResponse::ready_at`.
    ready_at: Option<Instant>,
    /// Expired before `max_wait` had passed (the timer promises never early).
    expired_early: bool,
    /// How long after `max_wait` it expired (zero if not expired).
    expiry_lateness: Duration,
    /// If expired: no later than the expiry marked it completed (see `expired_by`).
    expired_by: Option<Instant>,
}

/// Kafka's `DelayedFetch` (a consumer reading up to the HW).
struct DelayedFetch {
    id: usize,
    log: Arc<Log>,
    /// (partition, fetch offset).
    parts: Vec<(u32, u64)>,
    min_bytes: u64,
    /// Read before the purgatory took it, and its `max_wait`: an expiry must not come earlier.
    issued: Instant,
    max_wait: Duration,
    /// When `on_complete` began (see `expired_by`).
    completing_at: Option<Instant>,
    /// When `try_complete` found it ready.
    ready_at: Option<Instant>,
    reply: mpsc::Sender<(usize, FetchResponse)>,
    answered: Arc<Vec<AtomicU8>>,
    bytes: u64,
    ends: Vec<u64>,
    /// Set by `on_complete`: only a completed fetch is answered.
    completed: bool,
    expired: bool,
    expired_early: bool,
    expiry_lateness: Duration,
    expired_by: Option<Instant>,
}

impl DelayedFetch {
    fn available(&self) -> u64 {
        self.parts
            .iter()
            .map(|&(p, off)| self.log.hw(p).saturating_sub(off))
            .sum()
    }
}

impl DelayedOperation for DelayedFetch {
    fn try_complete(&mut self) -> bool {
        let ready = self.available() >= self.min_bytes;
        if ready {
            self.ready_at = Some(Instant::now());
        }
        ready
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        let (log, parts, min_bytes) = (Arc::clone(&self.log), self.parts.clone(), self.min_bytes);
        Some(ReadyHint::new(move || {
            let available: u64 = parts
                .iter()
                .map(|&(p, off)| log.hw(p).saturating_sub(off))
                .sum();
            available >= min_bytes
        }))
    }
    fn on_complete(&mut self) {
        self.completing_at = Some(Instant::now());
        self.completed = true;
        // One read of each HW: the bytes returned and where they end agree.
        self.ends = self
            .parts
            .iter()
            .map(|&(p, off)| self.log.hw(p).max(off))
            .collect();
        self.bytes = self
            .parts
            .iter()
            .zip(&self.ends)
            .map(|(&(_, off), &end)| end - off)
            .sum();
        self.answered[self.id].fetch_add(1, SeqCst);
    }
    fn on_expiration(&mut self) {
        self.expired = true;
        let elapsed = self.issued.elapsed();
        self.expired_early = elapsed < self.max_wait;
        self.expiry_lateness = elapsed.saturating_sub(self.max_wait);
        let completing_at = self.completing_at.expect("on_complete ran first");
        self.expired_by = Some(expired_by(completing_at, self.issued, self.max_wait));
    }
}

impl Drop for DelayedFetch {
    fn drop(&mut self) {
        // The purgatory drops an operation right after on_complete (and on_expiration), so the
        // response goes out here, once, with the expiry known. Not for an operation handed
        // back without completing (shutdown, a refused watch, `take`): it was never answered,
        // and its owner decides what to tell the client.
        if !self.completed {
            return;
        }
        let _ = self.reply.send((
            self.id,
            FetchResponse {
                bytes: self.bytes,
                ends: std::mem::take(&mut self.ends),
                expired: self.expired,
                ready_at: self.ready_at,
                expired_early: self.expired_early,
                expiry_lateness: self.expiry_lateness,
                expired_by: self.expired_by,
            },
        ));
    }
}

/// Sets its flag if dropped by a panic (a thread's unwinding).
struct SetOnPanic(Arc<AtomicBool>);

impl Drop for SetOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, SeqCst);
        }
    }
}

/// A fetch as the final pass judges it (see `lost_wake_up`).
struct FetchRecord {
    id: usize,
    parts: Vec<(u32, u64)>,
    entered: Instant,
    ready_at: Option<Instant>,
    expired_by: Option<Instant>,
}

/// What a consumer thread saw.
#[derive(Default)]
struct ConsumerOutcome {
    satisfied: usize,
    expired: usize,
    woken: usize,
    max_expiry_lateness: Duration,
    problems: Vec<String>,
    fetches: Vec<FetchRecord>,
}

/// Runs the simulation.
///
/// A configuration the simulation cannot run (no partitions, or no followers: the HW would
/// never move and the consumers would fetch until `max_fetches`) is reported as a problem.
pub fn run(cfg: &Config) -> Report {
    let t0 = Instant::now();
    if cfg.partitions == 0 || cfg.followers == 0 {
        return Report {
            problems: vec![format!(
                "cannot simulate {} partitions with {} followers: at least one of each",
                cfg.partitions, cfg.followers
            )],
            ..Report::default()
        };
    }
    let log = Arc::new(Log::new(cfg.partitions, cfg.followers));
    let produce: Arc<Purgatory<u32, DelayedProduce>> =
        Arc::new(Purgatory::builder().name("produce").build());
    let fetch: Arc<Purgatory<u32, DelayedFetch>> =
        Arc::new(Purgatory::builder().name("fetch").build());
    let n_produces = cfg.producers * cfg.produces_each;
    let responses: Arc<Vec<Mutex<Option<ProduceResponse>>>> =
        Arc::new((0..n_produces).map(|_| Mutex::new(None)).collect());
    let produce_answered: Arc<Vec<AtomicU8>> =
        Arc::new((0..n_produces).map(|_| AtomicU8::new(0)).collect());
    // When each produce's try_complete_else_watch returned (its second try done).
    let produce_entered: Arc<Vec<Mutex<Option<Instant>>>> =
        Arc::new((0..n_produces).map(|_| Mutex::new(None)).collect());
    let producing = Arc::new(AtomicUsize::new(cfg.producers));
    let stop = Arc::new(AtomicBool::new(false));
    // Set by a follower that panics: the HW no longer moves, and the consumers stop.
    let follower_died = Arc::new(AtomicBool::new(false));

    // Followers: each thread replicates every partition for one follower slot.
    let followers: Vec<_> = (0..cfg.followers)
        .map(|f| {
            let (log, produce, fetch, stop, cfg) = (
                log.clone(),
                produce.clone(),
                fetch.clone(),
                stop.clone(),
                cfg.clone(),
            );
            let died = SetOnPanic(follower_died.clone());
            std::thread::spawn(move || {
                let _died = died;
                let mut rng = SplitMix64::new(cfg.seed ^ (0xF0 + f as u64));
                let mut round = 0u64;
                let mut stalled_until: Option<Instant> = None;
                while !stop.load(SeqCst) {
                    round += 1;
                    if f == 0 && cfg.follower_panics_in_round == Some(round) {
                        panic!("follower 0: injected panic in round {round}");
                    }
                    if f == 0 && cfg.follower_stalls_in_round == Some(round) {
                        // Stuck (injected), until the run ends.
                        while !stop.load(SeqCst) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        break;
                    }
                    if cfg.stall_every > 0 && round.is_multiple_of(cfg.stall_every) {
                        stalled_until = Some(Instant::now() + cfg.produce_timeout * 2);
                    }
                    let lag = rng.next() % cfg.follower_lag.as_nanos().max(1) as u64;
                    std::thread::sleep(Duration::from_nanos(lag));
                    // A stall: this follower's fetches from the second half of the partitions'
                    // leaders hang (their HW stops) while the first half's go on, so a produce
                    // on both halves times out with some partitions acknowledged (they must
                    // report NONE, as in Kafka). With one partition, it stops.
                    let stalled = stalled_until.is_some_and(|until| Instant::now() < until);
                    let stalled_from = if stalled {
                        log.partitions.len() / 2
                    } else {
                        usize::MAX
                    };
                    for (p, part) in log.partitions.iter().enumerate() {
                        if p >= stalled_from {
                            break;
                        }
                        part.followers[f].store(part.leo.load(SeqCst), SeqCst);
                        // The leader's HW: the smallest offset every replica has.
                        let min = part
                            .followers
                            .iter()
                            .map(|o| o.load(SeqCst))
                            .min()
                            .unwrap_or(0);
                        let raised = part.hw.fetch_max(min, SeqCst) < min;
                        // Logged apart from the checks below, whether or not they run: a HW
                        // move that no check follows is what the lost-wake-up oracle must see.
                        let raise = raised.then(|| log.note_raise(p, min));
                        if raised {
                            produce.check_and_complete(&(p as u32));
                            fetch.check_and_complete(&(p as u32));
                            if let Some(i) = raise {
                                log.note_checked(p, i);
                            }
                        }
                    }
                }
            })
        })
        .collect();

    // Producers.
    let producers: Vec<_> = (0..cfg.producers)
        .map(|t| {
            let (log, produce, responses, answered, producing, cfg) = (
                log.clone(),
                produce.clone(),
                responses.clone(),
                produce_answered.clone(),
                producing.clone(),
                cfg.clone(),
            );
            let entered = produce_entered.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(cfg.seed ^ (0x100 + t as u64));
                for i in 0..cfg.produces_each {
                    let id = t * cfg.produces_each + i;
                    let n_parts = 1 + (rng.next() % 3) as u32;
                    let first = (rng.next() % u64::from(cfg.partitions)) as u32;
                    let mut parts = Vec::new();
                    let mut keys = Vec::new();
                    for k in 0..n_parts.min(cfg.partitions) {
                        let p = (first + k) % cfg.partitions;
                        let bytes = 100 + rng.next() % 900;
                        parts.push(ProducePart {
                            p,
                            required: log.append(p, bytes),
                            status: Status::RequestTimedOut,
                            hw_seen: 0,
                        });
                        keys.push(p);
                    }
                    let op = DelayedProduce {
                        id,
                        log: log.clone(),
                        acked: Arc::new(parts.iter().map(|_| AtomicBool::new(false)).collect()),
                        parts,
                        expired: false,
                        issued: Instant::now(),
                        timeout: cfg.produce_timeout,
                        completing_at: None,
                        ready_at: None,
                        responses: responses.clone(),
                        answered: answered.clone(),
                    };
                    produce
                        .try_complete_else_watch(op, cfg.produce_timeout, &keys)
                        .unwrap_or_else(|e| panic!("produce {id} refused: {e}"));
                    *entered[id].lock().unwrap() = Some(Instant::now());
                    if i % 4 == 3 {
                        std::thread::sleep(cfg.produce_pace);
                    }
                }
                producing.fetch_sub(1, SeqCst);
            })
        })
        .collect();

    // Consumers: fetch until the producers are done and everything produced was read.
    let fetches_issued = Arc::new(AtomicUsize::new(0));
    let fetch_answered: Arc<Vec<AtomicU8>> =
        Arc::new((0..cfg.max_fetches).map(|_| AtomicU8::new(0)).collect());
    let stuck_after = cfg.stuck_after();
    let consumers: Vec<_> = (0..cfg.consumers)
        .map(|c| {
            let (log, fetch, producing, issued, answered, cfg) = (
                log.clone(),
                fetch.clone(),
                producing.clone(),
                fetches_issued.clone(),
                fetch_answered.clone(),
                cfg.clone(),
            );
            let follower_died = follower_died.clone();
            std::thread::spawn(move || {
                let mine: Vec<u32> = (0..cfg.partitions)
                    .filter(|p| *p as usize % cfg.consumers == c)
                    .collect();
                let mut offsets: Vec<u64> = vec![0; mine.len()];
                let (tx, rx) = mpsc::channel();
                let mut out = ConsumerOutcome::default();
                // Bytes the responses carried: the consumer read exactly these.
                let mut delivered = 0u64;
                loop {
                    let done_producing = producing.load(SeqCst) == 0;
                    let caught_up = mine
                        .iter()
                        .zip(&offsets)
                        .all(|(&p, &o)| o >= log.partitions[p as usize].leo.load(SeqCst));
                    if mine.is_empty() || (done_producing && caught_up) {
                        break;
                    }
                    if follower_died.load(SeqCst) {
                        out.problems.push(format!(
                            "consumer {c} stopped before catching up: a follower died"
                        ));
                        break;
                    }
                    let idle = log.idle_for();
                    if idle > stuck_after {
                        out.problems.push(format!(
                            "consumer {c} stopped before catching up: no progress (no append, \
                             no HW move) for {idle:?} (a stuck follower or producer; the \
                             limit is {stuck_after:?})"
                        ));
                        break;
                    }
                    let id = issued.fetch_add(1, SeqCst);
                    if id >= answered.len() {
                        // Not silently: the partitions it had not read are never checked.
                        out.problems.push(format!(
                            "consumer {c} stopped before catching up: the fetch log ({} \
                             fetches) is full; shorten the run",
                            answered.len()
                        ));
                        break;
                    }
                    let parts: Vec<(u32, u64)> =
                        mine.iter().copied().zip(offsets.iter().copied()).collect();
                    let op = DelayedFetch {
                        id,
                        log: log.clone(),
                        parts: parts.clone(),
                        min_bytes: cfg.min_bytes,
                        issued: Instant::now(),
                        max_wait: cfg.fetch_max_wait,
                        completing_at: None,
                        ready_at: None,
                        reply: tx.clone(),
                        answered: answered.clone(),
                        bytes: 0,
                        ends: Vec::new(),
                        completed: false,
                        expired: false,
                        expired_early: false,
                        expiry_lateness: Duration::ZERO,
                        expired_by: None,
                    };
                    if fetch
                        .try_complete_else_watch(op, cfg.fetch_max_wait, &mine)
                        .is_err()
                    {
                        break;
                    }
                    let entered = Instant::now();
                    let Ok((rid, resp)) =
                        rx.recv_timeout(cfg.fetch_max_wait * 20 + Duration::from_secs(10))
                    else {
                        out.problems.push(format!("fetch {id} never answered"));
                        break;
                    };
                    if rid != id {
                        out.problems.push(format!("fetch {id}: response for {rid}"));
                    }
                    if resp.expired_early {
                        out.problems
                            .push(format!("fetch {id}: expired before its max wait"));
                    }
                    if resp.expiry_lateness > LATE_EXPIRY {
                        out.problems.push(format!(
                            "fetch {id}: expired {:?} after its max wait (more than {:?})",
                            resp.expiry_lateness, LATE_EXPIRY
                        ));
                    }
                    out.max_expiry_lateness = out.max_expiry_lateness.max(resp.expiry_lateness);
                    if resp.ready_at.is_some_and(|at| at > entered) {
                        out.woken += 1;
                    }
                    if resp.expired {
                        out.expired += 1;
                    } else {
                        out.satisfied += 1;
                        if resp.bytes < cfg.min_bytes {
                            out.problems.push(format!(
                                "fetch {id} answered early with {} < min bytes",
                                resp.bytes
                            ));
                        }
                    }
                    // Judged for lost wake-ups in the final pass, once every check has
                    // returned (the one that completed this fetch may not have yet).
                    out.fetches.push(FetchRecord {
                        id,
                        parts,
                        entered,
                        ready_at: resp.ready_at,
                        expired_by: resp.expired_by,
                    });
                    // Continue where the data the response carried ends (as a Kafka consumer
                    // does), not at the HW now: that may have moved on since the response was
                    // built, and the bytes in between were never delivered.
                    if resp.ends.len() == offsets.len() {
                        offsets.copy_from_slice(&resp.ends);
                    }
                    delivered += resp.bytes;
                }
                let advanced: u64 = offsets.iter().sum();
                if delivered != advanced {
                    out.problems.push(format!(
                        "consumer {c}: its responses carried {delivered} bytes but its offsets \
                         advanced over {advanced}"
                    ));
                }
                out
            })
        })
        .collect();

    // Live stats.
    // Stopped by dropping `stats_stop`: it wakes at once, not at the end of its sleep (a run
    // with stats every 3 s otherwise ends up to 3 s late, and reports that as its wall time).
    let (stats_stop, stats_stopped) = mpsc::channel::<()>();
    let stats_thread = cfg.stats_every.map(|every| {
        let (produce, fetch, issued) = (produce.clone(), fetch.clone(), fetches_issued.clone());
        let answered = produce_answered.clone();
        std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stats_stopped.recv_timeout(every) {
                let acked = answered.iter().filter(|a| a.load(SeqCst) > 0).count();
                let (ps, fs) = (produce.stats(), fetch.stats());
                crate::out!(
                    "[{:5.1}s] produce: answered {acked}, expired {}, waiting {} | fetch: issued {}, expired {}, waiting {}",
                    t0.elapsed().as_secs_f64(),
                    ps.expired,
                    ps.delayed,
                    issued.load(SeqCst),
                    fs.expired,
                    fs.delayed,
                );
            }
        })
    });

    for p in producers {
        p.join().expect("producer panicked");
    }
    let mut report = Report {
        produces: n_produces,
        ..Report::default()
    };
    let mut fetch_records = Vec::new();
    for c in consumers {
        let out = c.join().expect("consumer panicked");
        report.fetches_satisfied += out.satisfied;
        report.fetches_expired += out.expired;
        report.fetches_woken += out.woken;
        report.max_expiry_lateness = report.max_expiry_lateness.max(out.max_expiry_lateness);
        report.problems.extend(out.problems);
        fetch_records.extend(out.fetches);
    }
    // Let every produce be answered (acked, or timed out) before stopping the followers.
    let deadline = Instant::now() + cfg.produce_timeout * 4 + Duration::from_secs(20);
    while produce_answered.iter().any(|a| a.load(SeqCst) == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, SeqCst);
    drop(stats_stop);
    for (i, f) in followers.into_iter().enumerate() {
        if f.join().is_err() {
            report.problems.push(format!("follower {i} panicked"));
        }
    }
    if let Some(t) = stats_thread {
        t.join().expect("stats thread panicked");
    }
    // A panic in an operation's callbacks on a timer thread is caught (and counted) there.
    let panicked = produce.timer().stats().panicked + fetch.timer().stats().panicked;
    if panicked > 0 {
        report.problems.push(format!(
            "{panicked} panics on the purgatories' timer threads"
        ));
    }
    let left_produce = produce.shutdown();
    let left_fetch = fetch.shutdown();
    if !left_produce.is_empty() || !left_fetch.is_empty() {
        report.problems.push(format!(
            "{} produces and {} fetches were still pending at the end",
            left_produce.len(),
            left_fetch.len()
        ));
    }
    report.fetches = fetches_issued.load(SeqCst).min(fetch_answered.len());
    for (id, a) in fetch_answered.iter().take(report.fetches).enumerate() {
        if a.load(SeqCst) != 1 {
            report
                .problems
                .push(format!("fetch {id} answered {} times", a.load(SeqCst)));
        }
    }
    // The followers have stopped: every raise is logged, and every check has returned.
    let raises = log.raises();
    // Fetches: lost wake-ups (see `lost_wake_up`), now that every check has returned.
    fetch_records.sort_by_key(|f| f.id);
    for f in &fetch_records {
        let keys: Vec<u32> = f.parts.iter().map(|&(p, _)| p).collect();
        let made_ready = raises.first_ready(&keys, |hw| {
            let available: u64 = f
                .parts
                .iter()
                .zip(hw)
                .map(|(&(_, off), &h)| h.saturating_sub(off))
                .sum();
            available >= cfg.min_bytes
        });
        if let Some(problem) = lost_wake_up(made_ready, f.entered, f.ready_at, f.expired_by) {
            report.problems.push(format!("fetch {}: {problem}", f.id));
        }
    }
    // Produces: exactly once, statuses consistent with the HW and with expiry.
    for id in 0..n_produces {
        let n = produce_answered[id].load(SeqCst);
        if n != 1 {
            report
                .problems
                .push(format!("produce {id} answered {n} times"));
            continue;
        }
        let guard = responses[id].lock().unwrap();
        let r = guard.as_ref().expect("answered produce has a response");
        let entered = *produce_entered[id].lock().unwrap();
        if let Some(entered) = entered {
            let keys: Vec<u32> = r.statuses.iter().map(|(part, _)| part.p).collect();
            let made_ready = raises.first_ready(&keys, |hw| {
                r.statuses
                    .iter()
                    .zip(hw)
                    .all(|((part, _), &h)| h >= part.required)
            });
            if let Some(problem) = lost_wake_up(made_ready, entered, r.ready_at, r.expired_by) {
                report.problems.push(format!("produce {id}: {problem}"));
            }
            if r.ready_at.is_some_and(|at| at > entered) {
                report.produces_woken += 1;
            }
        }
        let all_acked = r
            .statuses
            .iter()
            .all(|(part, _)| part.status == Status::None);
        if all_acked {
            report.produces_acked += 1;
        } else {
            report.produces_timed_out += 1;
            if r.statuses
                .iter()
                .any(|(part, _)| part.status == Status::None)
            {
                report.produces_partly_acked += 1;
            }
        }
        for &(part, hw_then) in &r.statuses {
            let (p, required) = (part.p, part.required);
            if part.status == Status::None && hw_then < required {
                report.problems.push(format!(
                    "produce {id}: partition {p} acked with HW {hw_then} below offset {required}"
                ));
            }
            // As Kafka's: a partition is acknowledged (NONE) once a try saw its HW at or past
            // the offset, even if the request then timed out on another partition; the others
            // keep the preset REQUEST_TIMED_OUT.
            // And a check runs `try_complete` (as Kafka's every check runs tryComplete): a
            // partition whose HW move past the offset was followed by a check that returned
            // before the expiry (which then found the produce pending) is acknowledged.
            if let (Status::RequestTimedOut, Some(expired_by)) = (part.status, r.expired_by) {
                let acked_by = raises.first_ready(&[p], |hw| hw[0] >= required);
                if let Some(checked) = acked_by.and_then(|raise| raise.checked) {
                    if checked < expired_by {
                        report.problems.push(format!(
                            "produce {id}: partition {p} reports REQUEST_TIMED_OUT although the \
                             check following its HW move past offset {required} had returned \
                             {:?} before the produce expired",
                            expired_by - checked
                        ));
                    }
                }
            }
            let acked_by_hw = part.hw_seen >= required;
            if acked_by_hw != (part.status == Status::None) {
                report.problems.push(format!(
                    "produce {id}: partition {p} reports {:?} although its last try saw HW {} \
                     for offset {required}",
                    part.status, part.hw_seen
                ));
            }
        }
        // All acknowledged yet expired is not: try_complete acknowledges under the operation's
        // lock and completes it in the same hold once every partition is acknowledged.
        if all_acked && r.expired {
            report.problems.push(format!(
                "produce {id}: every partition acknowledged, yet expired"
            ));
        }
        if r.expired_early {
            report
                .problems
                .push(format!("produce {id}: expired before its timeout"));
        }
        if r.expiry_lateness > LATE_EXPIRY {
            report.problems.push(format!(
                "produce {id}: expired {:?} after its timeout (more than {:?})",
                r.expiry_lateness, LATE_EXPIRY
            ));
        }
        report.max_expiry_lateness = report.max_expiry_lateness.max(r.expiry_lateness);
        if !all_acked && !r.expired {
            report.problems.push(format!(
                "produce {id}: REQUEST_TIMED_OUT but not completed by expiry"
            ));
        }
    }
    report.elapsed = t0.elapsed();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_partition() -> Arc<Log> {
        Arc::new(Log::new(1, 1))
    }

    fn fetch(
        id: usize,
        log: &Arc<Log>,
        reply: &mpsc::Sender<(usize, FetchResponse)>,
    ) -> DelayedFetch {
        DelayedFetch {
            id,
            log: log.clone(),
            parts: vec![(0, 0)],
            min_bytes: 10,
            issued: Instant::now(),
            max_wait: Duration::from_secs(30),
            completing_at: None,
            ready_at: None,
            reply: reply.clone(),
            answered: Arc::new(vec![AtomicU8::new(0), AtomicU8::new(0)]),
            bytes: 0,
            ends: Vec::new(),
            completed: false,
            expired: false,
            expired_early: false,
            expiry_lateness: Duration::ZERO,
            expired_by: None,
        }
    }

    /// A fetch the purgatory hands back (shutdown, a refused watch) never completed: it must
    /// send no response (its caller answers it, or the connection closes), least of all one
    /// that looks like a satisfied fetch.
    #[test]
    fn a_fetch_handed_back_sends_no_response() {
        let log = one_partition();
        let (tx, rx) = mpsc::channel();
        let p: Purgatory<u32, DelayedFetch> = Purgatory::builder().reaper(false).build();
        let w = p.try_complete_else_watch(fetch(0, &log, &tx), Duration::from_secs(30), &[0]);
        assert!(!w.expect("watched").completed);
        drop(p.shutdown()); // the pending fetch handed back, then dropped
        let refused = p.try_complete_else_watch(fetch(1, &log, &tx), Duration::from_secs(30), &[0]);
        drop(refused.expect_err("shut down")); // refused, then dropped
        let sent: Vec<_> = rx
            .try_iter()
            .map(|(id, r)| (id, r.bytes, r.expired))
            .collect();
        assert!(sent.is_empty(), "responses (id, bytes, expired): {sent:?}");
    }

    #[test]
    fn a_completed_fetch_answers_once() {
        let log = one_partition();
        let (tx, rx) = mpsc::channel();
        let p: Purgatory<u32, DelayedFetch> = Purgatory::builder().reaper(false).build();
        let w = p.try_complete_else_watch(fetch(0, &log, &tx), Duration::from_secs(30), &[0]);
        assert!(!w.expect("watched").completed);
        log.partitions[0].hw.store(12, SeqCst);
        assert_eq!(p.check_and_complete(&0), 1);
        assert!(p.shutdown().is_empty());
        let sent: Vec<_> = rx
            .try_iter()
            .map(|(id, r)| (id, r.bytes, r.ends, r.expired))
            .collect();
        assert_eq!(sent, [(0, 12, vec![12], false)]);
    }

    /// A produce of `id` (of `n` answered slots) needing offset `required` on each of `parts`.
    fn produce(
        id: usize,
        n: usize,
        log: &Arc<Log>,
        parts: &[u32],
        required: u64,
    ) -> DelayedProduce {
        DelayedProduce {
            id,
            log: log.clone(),
            parts: parts
                .iter()
                .map(|&p| ProducePart {
                    p,
                    required,
                    status: Status::RequestTimedOut,
                    hw_seen: 0,
                })
                .collect(),
            acked: Arc::new(parts.iter().map(|_| AtomicBool::new(false)).collect()),
            expired: false,
            issued: Instant::now(),
            timeout: Duration::from_secs(30),
            completing_at: None,
            ready_at: None,
            responses: Arc::new((0..n).map(|_| Mutex::new(None)).collect()),
            answered: Arc::new((0..n).map(|_| AtomicU8::new(0)).collect()),
        }
    }

    /// A produce's hint says "maybe" only while some partition it has not acknowledged has its
    /// HW at the offset (`try_complete` would then acknowledge it); a fetch's, once `min_bytes`
    /// are below the HWs.
    #[test]
    fn the_ready_hints_say_maybe_only_when_try_complete_would_move() {
        let log = Arc::new(Log::new(2, 1));
        let mut op = produce(0, 1, &log, &[0, 1], 10);
        let hint = op.ready_hint().expect("a produce gives a hint");
        assert!(!hint.may_complete());
        log.partitions[0].hw.store(10, SeqCst);
        assert!(hint.may_complete());
        assert!(!op.try_complete()); // partition 0 acknowledged, 1 not yet
        assert!(!hint.may_complete());
        log.partitions[1].hw.store(10, SeqCst);
        assert!(hint.may_complete());
        assert!(op.try_complete());

        let one = one_partition();
        let (tx, _rx) = mpsc::channel();
        let hint = fetch(0, &one, &tx)
            .ready_hint()
            .expect("a fetch gives a hint");
        one.partitions[0].hw.store(9, SeqCst);
        assert!(!hint.may_complete());
        one.partitions[0].hw.store(10, SeqCst);
        assert!(hint.may_complete());
    }

    /// An expiry before the operation's timeout is flagged early; one after it, late by the
    /// difference (the timer is checked elsewhere: here, the flag the run reports).
    #[test]
    fn an_expiry_before_the_timeout_is_flagged_early_and_one_after_it_late() {
        let log = one_partition();
        let back = Duration::from_secs(10);
        let long_ago = Instant::now()
            .checked_sub(back)
            .expect("the machine has been up for 10 s");
        for (issued, timeout, early) in [
            (Instant::now(), Duration::from_secs(3600), true),
            (long_ago, Duration::from_secs(1), false),
        ] {
            // Zero if early; at least the 9 s past its timeout if not.
            let late_enough = |lateness: Duration| match early {
                true => lateness.is_zero(),
                false => lateness >= back - timeout,
            };
            let mut op = produce(0, 1, &log, &[0], 10);
            (op.issued, op.timeout) = (issued, timeout);
            op.on_complete();
            op.on_expiration();
            let r = op.responses[0].lock().unwrap().take().expect("answered");
            let produced = (r.expired, r.expired_early, r.expiry_lateness);

            let (tx, rx) = mpsc::channel();
            let mut op = fetch(0, &log, &tx);
            (op.issued, op.max_wait) = (issued, timeout);
            op.on_complete();
            op.on_expiration();
            drop(op);
            let (_, r) = rx.try_recv().expect("answered");
            let fetched = (r.expired, r.expired_early, r.expiry_lateness);

            for (expired, expired_early, lateness) in [produced, fetched] {
                assert!(expired && expired_early == early, "early {early}");
                assert!(late_enough(lateness), "{lateness:?}");
            }
        }
    }

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    /// The oracle, on hand-made timelines: found by the check that follows the raise that made
    /// it ready (or earlier) is fine, later is a lost wake-up; so is a raise no check followed.
    #[test]
    fn lost_wake_ups_are_judged_against_the_raise_that_made_the_operation_ready() {
        let t = Instant::now();
        let checked = Raise {
            hw: 10,
            at: ms(t, 10),
            checked: Some(ms(t, 12)),
        };
        let unchecked = Raise {
            checked: None,
            ..checked
        };
        let entered = ms(t, 5);
        // Never ready by the log: nothing to judge.
        assert!(lost_wake_up(None, entered, None, Some(ms(t, 50))).is_none());
        // Found by the check (before it returned), or by the second try.
        assert!(lost_wake_up(Some(checked), entered, Some(ms(t, 11)), None).is_none());
        assert!(lost_wake_up(Some(checked), ms(t, 20), Some(ms(t, 19)), None).is_none());
        // Found after that check had returned: healed by a later one.
        let late = lost_wake_up(Some(checked), entered, Some(ms(t, 30)), None).unwrap();
        assert!(late.contains("healed by a later check"), "{late}");
        // Expired after the check returned; not if the expiry came first.
        assert!(lost_wake_up(Some(checked), entered, None, Some(ms(t, 13))).is_some());
        assert!(lost_wake_up(Some(checked), entered, None, Some(ms(t, 11))).is_none());
        // No check followed the raise: found later, or expired after it.
        let skipped = lost_wake_up(Some(unchecked), entered, Some(ms(t, 30)), None).unwrap();
        assert!(skipped.contains("no check followed"), "{skipped}");
        assert!(lost_wake_up(Some(unchecked), entered, None, Some(ms(t, 60))).is_some());
        assert!(lost_wake_up(Some(unchecked), entered, None, Some(ms(t, 9))).is_none());
        assert!(lost_wake_up(Some(unchecked), ms(t, 20), Some(ms(t, 19)), None).is_none());
        // At the edges: found, or expired, at the very moment the check returned (or the
        // unchecked raise was made) is not after it.
        assert!(lost_wake_up(Some(checked), entered, Some(ms(t, 12)), None).is_none());
        assert!(lost_wake_up(Some(checked), entered, None, Some(ms(t, 12))).is_none());
        assert!(lost_wake_up(Some(unchecked), entered, Some(ms(t, 10)), None).is_none());
        assert!(lost_wake_up(Some(unchecked), entered, None, Some(ms(t, 10))).is_none());
    }

    /// An expiry's "no later than its marking" bound is the earlier of `on_complete`'s start and
    /// the timeout.
    #[test]
    fn expired_by_is_the_earlier_of_the_completion_and_the_timeout() {
        let t = Instant::now();
        let timeout = Duration::from_millis(100);
        assert_eq!(expired_by(ms(t, 130), t, timeout), ms(t, 100));
        assert_eq!(expired_by(ms(t, 70), t, timeout), ms(t, 70));
    }

    /// The raise that made an operation ready, across partitions, by the raises' times.
    #[test]
    fn first_ready_takes_the_raises_in_time_order() {
        let t = Instant::now();
        let raise = |hw, at| Raise {
            hw,
            at: ms(t, at),
            checked: None,
        };
        // Partition 0 reaches 100 at 3 ms (logged out of order), partition 1 reaches 50 at 7 ms.
        let raises = Raises(vec![
            vec![raise(40, 1), raise(100, 3), raise(60, 4)],
            vec![raise(20, 2), raise(50, 7), raise(90, 9)],
        ]);
        let both = |hw: &[u64]| hw[0] >= 100 && hw[1] >= 50;
        assert_eq!(raises.first_ready(&[0, 1], both).unwrap().at, ms(t, 7));
        let sum = |hw: &[u64]| hw[0] + hw[1] >= 120;
        assert_eq!(raises.first_ready(&[0, 1], sum).unwrap().at, ms(t, 3));
        assert!(raises.first_ready(&[0, 1], |hw| hw[1] > 90).is_none());
    }

    /// How long without progress counts as stuck: the progress timeout, or 20 times the
    /// longest pause the configuration makes if that is longer.
    #[test]
    fn stuck_after_is_the_progress_timeout_or_20_times_the_longest_pause() {
        let quick = Config {
            produce_timeout: Duration::from_millis(1),
            follower_lag: Duration::from_millis(1),
            produce_pace: Duration::from_millis(1),
            fetch_max_wait: Duration::from_millis(1),
            progress_timeout: Duration::from_secs(1),
            ..Config::default()
        };
        assert_eq!(quick.stuck_after(), Duration::from_secs(1));
        let ms = Duration::from_millis;
        for (cfg, stuck) in [
            // A follower's stall: twice the produce timeout.
            (
                Config {
                    produce_timeout: ms(100),
                    ..quick.clone()
                },
                ms(4_000),
            ),
            (
                Config {
                    follower_lag: ms(300),
                    ..quick.clone()
                },
                ms(6_000),
            ),
            (
                Config {
                    produce_pace: ms(70),
                    ..quick.clone()
                },
                ms(1_400),
            ),
            (
                Config {
                    fetch_max_wait: ms(500),
                    ..quick.clone()
                },
                ms(10_000),
            ),
        ] {
            assert_eq!(cfg.stuck_after(), stuck, "{cfg:?}");
        }
    }

    /// Progress is the last append or HW raise: the log is idle from its start until then.
    #[test]
    fn the_log_is_idle_since_its_last_append_or_raise() {
        let back = Duration::from_secs(10);
        for step in [
            |log: &Log| assert_eq!(log.append(0, 5), 5), // the new LEO
            |log: &Log| assert_eq!(log.note_raise(0, 5), 0), // its index
        ] {
            let mut log = Log::new(1, 1);
            log.t0 = log
                .t0
                .checked_sub(back)
                .expect("the machine has been up for 10 s");
            assert!(log.idle_for() >= back);
            step(&log);
            assert!(log.idle_for() < back, "{:?}", log.idle_for());
        }
    }

    /// The outcome checks: a run in which no check completed anything is a problem.
    #[test]
    fn a_run_without_acks_or_wake_ups_is_a_problem() {
        let ok = || Report {
            produces: 10,
            produces_acked: 5,
            produces_timed_out: 5,
            produces_woken: 3,
            fetches: 4,
            fetches_satisfied: 2,
            fetches_expired: 2,
            fetches_woken: 1,
            ..Report::default()
        };
        assert!(ok().check().is_ok());
        for bad in [
            Report {
                produces_acked: 0,
                produces_timed_out: 10,
                ..ok()
            },
            Report {
                produces_woken: 0,
                ..ok()
            },
            Report {
                fetches_satisfied: 0,
                fetches_expired: 4,
                ..ok()
            },
            Report {
                fetches_woken: 0,
                ..ok()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        // A run of produces only, or of fetches only, has nothing to show for the other kind.
        let produces_only = Report {
            fetches: 0,
            fetches_satisfied: 0,
            fetches_expired: 0,
            fetches_woken: 0,
            ..ok()
        };
        let fetches_only = Report {
            produces: 0,
            produces_acked: 0,
            produces_timed_out: 0,
            produces_woken: 0,
            ..ok()
        };
        for run in [produces_only, fetches_only] {
            assert!(run.check().is_ok(), "{run:?}");
        }
    }
}
