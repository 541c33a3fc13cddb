//! A broker-like simulation of the purgatory's main use (Kafka's DelayedProduce and
//! DelayedFetch), run by `examples/broker.rs` and checked by `tests/broker.rs`.
//!
//! * Partitions have a leader log end offset (LEO) and a high watermark (HW); follower threads
//!   fetch from the leaders (their offsets move to the LEO after a random lag, sometimes a long
//!   stall) and the leader advances the HW to the smallest follower offset.
//! * Producers append to 1–3 partitions with acks=all: a `DelayedProduce` completes when the
//!   HW has passed its offset on every partition it wrote, or times out with its
//!   `REQUEST_TIMED_OUT` status preset (as Kafka's `DelayedProduce`).
//! * Consumers fetch with `min_bytes` and `max_wait` (a `DelayedFetch`): complete once at
//!   least `min_bytes` below the HW are available across their partitions, or at `max_wait`
//!   with whatever there is.
//! * Every HW move calls `check_and_complete` on both purgatories for that partition.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // simulation threads and locks

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{DelayedOperation, Purgatory, ReadyHint};

use crate::rng::SplitMix64;

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
    /// Every `stall_every`-th follower round stalls (longer than the produce timeout), so some
    /// produces time out.
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
        }
    }
}

/// What the simulation observed; [`Report::check`] says whether every request was answered
/// exactly once with the right status.
#[derive(Debug, Default)]
pub struct Report {
    /// Produce requests issued.
    pub produces: usize,
    /// Produce responses with every partition acknowledged.
    pub produces_acked: usize,
    /// Produce responses that timed out (some partition `REQUEST_TIMED_OUT`).
    pub produces_timed_out: usize,
    /// Fetch requests issued.
    pub fetches: usize,
    /// Fetches answered before `max_wait` (with at least `min_bytes`).
    pub fetches_satisfied: usize,
    /// Fetches answered at `max_wait`.
    pub fetches_expired: usize,
    /// Problems found (empty when everything checked out).
    pub problems: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Report {
    /// Ok if every produce and fetch was answered exactly once with a consistent status.
    pub fn check(&self) -> Result<(), String> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self.problems.join("\n"))
        }
    }
}

struct Partition {
    leo: AtomicU64,
    hw: AtomicU64,
    followers: Vec<AtomicU64>,
    /// Each HW a follower raised, with the time its checks of both purgatories had returned:
    /// an operation ready by then must have completed (see `DelayedProduce::on_expiration`).
    checked: Mutex<Vec<(u64, Instant)>>,
}

struct Log {
    partitions: Vec<Partition>,
}

impl Log {
    fn hw(&self, p: u32) -> u64 {
        self.partitions[p as usize].hw.load(SeqCst)
    }

    /// When the checks of the partitions in `parts` (partition, fetch offset) had first made
    /// `min_bytes` available in total, going by the HW each check followed: the time the
    /// fetch must have completed by, if it has come.
    fn checked_bytes(&self, parts: &[(u32, u64)], min_bytes: u64) -> Option<Instant> {
        let mut moves: Vec<(Instant, usize, u64)> = Vec::new();
        for (k, &(p, _)) in parts.iter().enumerate() {
            let checked = self.partitions[p as usize].checked.lock().unwrap();
            moves.extend(checked.iter().map(|&(hw, at)| (at, k, hw)));
        }
        moves.sort_by_key(|m| m.0);
        let mut hw = vec![0u64; parts.len()];
        moves.into_iter().find_map(|(at, k, h)| {
            hw[k] = hw[k].max(h);
            let available: u64 = parts
                .iter()
                .zip(&hw)
                .map(|(&(_, off), &h)| h.saturating_sub(off))
                .sum();
            (available >= min_bytes).then_some(at)
        })
    }

    /// When the first check of partition `p` after its HW reached `offset` had returned, if
    /// one has.
    fn checked_past(&self, p: u32, offset: u64) -> Option<Instant> {
        let checked = self.partitions[p as usize].checked.lock().unwrap();
        checked
            .iter()
            .filter(|&&(hw, _)| hw >= offset)
            .map(|&(_, at)| at)
            .min()
    }

    /// When, for every (partition, offset) of `parts`, such a check had returned, if it has
    /// for all of them: the time a produce needing those offsets must have completed by.
    fn checked_past_all(&self, mut parts: impl Iterator<Item = (u32, u64)>) -> Option<Instant> {
        parts.try_fold(None, |latest: Option<Instant>, (p, offset)| {
            let at = self.checked_past(p, offset)?;
            Some(Some(latest.map_or(at, |l| l.max(at))))
        })?
    }
}

/// A lost wake-up healed by a later check: how much later than `due` (the first time it was
/// both watched, `entered`, and made ready by a check that had returned, `ready_by`) the
/// operation was found ready (`found`, taken in `try_complete`, before the purgatory marks it
/// completed, so before a check that returns at once on seeing it completed).
fn found_late(
    ready_by: Option<Instant>,
    entered: Instant,
    found: Option<Instant>,
) -> Option<Duration> {
    let due = ready_by?.max(entered);
    let found = found?;
    (found > due).then(|| found - due)
}

/// One produce response: per partition, the status and the HW when the response was built.
struct ProduceResponse {
    statuses: Vec<(u32, u64, Status, u64)>,
    expired: bool,
    /// Expired before its timeout had passed (the timer promises never early).
    expired_early: bool,
    /// When `try_complete` found it ready (`None`: completed by expiry). Before the purgatory
    /// marks it completed, so before any check that sees it completed returns.
    ready_at: Option<Instant>,
    /// Expired although, for every partition, a check after its HW reached the offset had
    /// already returned: that check must have completed it (a lost wake-up).
    expired_when_ready: bool,
}

/// Kafka's `DelayedProduce` (acks = all).
struct DelayedProduce {
    id: usize,
    log: Arc<Log>,
    /// (partition, required offset, status: preset to `RequestTimedOut`).
    parts: Vec<(u32, u64, Status)>,
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
        for (p, required, status) in &mut self.parts {
            if *status != Status::None && self.log.hw(*p) >= *required {
                *status = Status::None;
            }
        }
        let ready = self.parts.iter().all(|(_, _, s)| *s == Status::None);
        if ready {
            self.ready_at = Some(Instant::now());
        }
        ready
    }
    fn ready_hint(&self) -> Option<ReadyHint> {
        // High watermarks only grow, so "every partition's HW has reached its offset" is what
        // try_complete will find; a check skips this produce without its lock until then.
        let log = Arc::clone(&self.log);
        let needs: Vec<(u32, u64)> = self.parts.iter().map(|&(p, r, _)| (p, r)).collect();
        Some(ReadyHint::new(move || {
            needs.iter().all(|&(p, r)| log.hw(p) >= r)
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
            .map(|&(p, r, s)| (p, r, s, self.log.hw(p)))
            .collect();
        self.answered[self.id].fetch_add(1, SeqCst);
        *self.responses[self.id].lock().unwrap() = Some(ProduceResponse {
            statuses,
            expired: false,
            expired_early: false,
            ready_at: self.ready_at,
            expired_when_ready: false,
        });
    }
    fn on_expiration(&mut self) {
        self.expired = true;
        // A check that visits the operation once the expiry has marked it completed (just
        // before on_complete) returns at once, without the lock: only a check that had
        // returned before on_complete began must have completed it (or it was watched after the
        // HW move, and its own second try saw the HW). Not "before now": with an on_complete
        // that takes time (a response sent), a HW move during it was reported as a lost
        // wake-up.
        let now = self.completing_at.expect("on_complete ran first");
        let ready_since = self
            .log
            .checked_past_all(self.parts.iter().map(|&(p, required, _)| (p, required)));
        if let Some(r) = self.responses[self.id].lock().unwrap().as_mut() {
            r.expired = true;
            r.expired_early = self.issued.elapsed() < self.timeout;
            r.expired_when_ready = ready_since.is_some_and(|at| at < now);
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
    /// Expired although checks that had already returned made `min_bytes` available: they
    /// must have completed it (a lost wake-up).
    expired_when_ready: bool,
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
    /// When `on_complete` began (see `DelayedProduce::on_expiration`).
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
    expired_when_ready: bool,
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
        self.expired_early = self.issued.elapsed() < self.max_wait;
        // As for produces: a check that had returned before on_complete began visited it.
        let now = self.completing_at.expect("on_complete ran first");
        self.expired_when_ready = self
            .log
            .checked_bytes(&self.parts, self.min_bytes)
            .is_some_and(|at| at < now);
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
                expired_when_ready: self.expired_when_ready,
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
    let log = Arc::new(Log {
        partitions: (0..cfg.partitions)
            .map(|_| Partition {
                leo: AtomicU64::new(0),
                hw: AtomicU64::new(0),
                followers: (0..cfg.followers).map(|_| AtomicU64::new(0)).collect(),
                checked: Mutex::new(Vec::new()),
            })
            .collect(),
    });
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
                while !stop.load(SeqCst) {
                    round += 1;
                    if f == 0 && cfg.follower_panics_in_round == Some(round) {
                        panic!("follower 0: injected panic in round {round}");
                    }
                    let lag = if cfg.stall_every > 0 && round.is_multiple_of(cfg.stall_every) {
                        cfg.produce_timeout * 2
                    } else {
                        Duration::from_nanos(rng.next() % cfg.follower_lag.as_nanos().max(1) as u64)
                    };
                    std::thread::sleep(lag);
                    for (p, part) in log.partitions.iter().enumerate() {
                        part.followers[f].store(part.leo.load(SeqCst), SeqCst);
                        // The leader's HW: the smallest offset every replica has.
                        let min = part
                            .followers
                            .iter()
                            .map(|o| o.load(SeqCst))
                            .min()
                            .unwrap_or(0);
                        if part.hw.fetch_max(min, SeqCst) < min {
                            produce.check_and_complete(&(p as u32));
                            fetch.check_and_complete(&(p as u32));
                            part.checked.lock().unwrap().push((min, Instant::now()));
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
                        let end = log.partitions[p as usize].leo.fetch_add(bytes, SeqCst) + bytes;
                        parts.push((p, end, Status::RequestTimedOut));
                        keys.push(p);
                    }
                    let op = DelayedProduce {
                        id,
                        log: log.clone(),
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
                let mut outcomes = (0usize, 0usize, Vec::new());
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
                        outcomes.2.push(format!(
                            "consumer {c} stopped before catching up: a follower died"
                        ));
                        break;
                    }
                    let id = issued.fetch_add(1, SeqCst);
                    if id >= answered.len() {
                        // Not silently: the partitions it had not read are never checked.
                        outcomes.2.push(format!(
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
                        expired_when_ready: false,
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
                        outcomes.2.push(format!("fetch {id} never answered"));
                        break;
                    };
                    if rid != id {
                        outcomes.2.push(format!("fetch {id}: response for {rid}"));
                    }
                    if resp.expired_when_ready {
                        outcomes.2.push(format!(
                            "fetch {id}: expired although a check had made its bytes available \
                             (a lost wake-up)"
                        ));
                    }
                    if resp.expired_early {
                        outcomes
                            .2
                            .push(format!("fetch {id}: expired before its max wait"));
                    }
                    // As for produces (see the final pass of `run`): once it was watched and the
                    // checks of its partitions had made `min_bytes` available, it must have been
                    // found ready; found later is a lost wake-up, even if a later check healed it.
                    let checked = log.checked_bytes(&parts, cfg.min_bytes);
                    if let Some(late) = found_late(checked, entered, resp.ready_at) {
                        outcomes.2.push(format!(
                            "fetch {id}: found ready {late:?} after a check that made its bytes \
                             available had returned (a lost wake-up, healed by a later check)"
                        ));
                    }
                    if resp.expired {
                        outcomes.1 += 1;
                    } else {
                        outcomes.0 += 1;
                        if resp.bytes < cfg.min_bytes {
                            outcomes.2.push(format!(
                                "fetch {id} answered early with {} < min bytes",
                                resp.bytes
                            ));
                        }
                    }
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
                    outcomes.2.push(format!(
                        "consumer {c}: its responses carried {delivered} bytes but its offsets \
                         advanced over {advanced}"
                    ));
                }
                outcomes
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
    for c in consumers {
        let (ok, expired, problems) = c.join().expect("consumer panicked");
        report.fetches_satisfied += ok;
        report.fetches_expired += expired;
        report.problems.extend(problems);
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
        // Once its try_complete_else_watch had returned and, for each partition, a check after
        // the HW reached the offset had returned, the produce must have been found ready: a
        // check that visited it either found it ready or found it completed (found ready
        // earlier), and one that missed it ran before it was watched, so its second try saw
        // the HW. Found ready later (by a later check, which heals most lost wake-ups here as
        // the HW keeps moving) is a lost wake-up (see `found_late`); an expiry is judged in
        // `on_expiration` (its `ready_at` is `None`).
        let ready_since = log.checked_past_all(r.statuses.iter().map(|&(p, req, _, _)| (p, req)));
        if let Some(entered) = *produce_entered[id].lock().unwrap() {
            if let Some(late) = found_late(ready_since, entered, r.ready_at) {
                report.problems.push(format!(
                    "produce {id}: found ready {late:?} after a check following its HW moves had \
                     returned (a lost wake-up, healed by a later check)"
                ));
            }
        }
        let all_acked = r.statuses.iter().all(|s| s.2 == Status::None);
        if all_acked {
            report.produces_acked += 1;
        } else {
            report.produces_timed_out += 1;
        }
        for &(p, required, status, hw_then) in &r.statuses {
            if status == Status::None && hw_then < required {
                report.problems.push(format!(
                    "produce {id}: partition {p} acked with HW {hw_then} below offset {required}"
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
        if r.expired_when_ready {
            report.problems.push(format!(
                "produce {id}: expired although a check after its HW moves had returned (a \
                 lost wake-up)"
            ));
        }
        if r.expired_early {
            report
                .problems
                .push(format!("produce {id}: expired before its timeout"));
        }
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
        Arc::new(Log {
            partitions: vec![Partition {
                leo: AtomicU64::new(0),
                hw: AtomicU64::new(0),
                followers: vec![AtomicU64::new(0)],
                checked: Mutex::new(Vec::new()),
            }],
        })
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
            expired_when_ready: false,
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
}
