//! The fleet harness: `N` app instances (tasks, each with its own Redis store handle and
//! connection, or its own tiered store over one) share one quota through a real
//! `redis-server` (standalone, or a Cluster of 3 primaries and 3 replicas) while a fault is
//! injected (or an operator resets the key); every decision is logged with its time, and the
//! run is summed up per sliding 1 s window.
//!
//! Used by the `fleet` binary (`scripts/fleet.sh`: the table in `BENCHMARKS.md`) and, as a
//! short subset, by the `redis_fleet` test. Bounded in time: a run lasts
//! [`Scenario::duration`] plus the fault's own waits (at most 20 s for a Cluster failover).
//!
//! What a row reports:
//!
//! - `worst`: the most units admitted in any 1 s window (sliding, in 10 ms steps, over the
//!   whole run) divided by `burst + limit` (what one GCRA admits in a 1 s window that starts
//!   with a full bucket, for a quota of `limit` per second);
//! - `503`: decisions the layer would answer with 503 (failure policy `Deny`);
//! - `degraded`: decisions answered by the failure policy in the whole run (on a loaded
//!   machine some decisions miss their deadline without any fault);
//! - `window`: the fault's failure-policy window, from the first degraded decision at or
//!   after the fault's start to the end of the run of degraded decisions (no two more than
//!   100 ms apart) that reaches past the fault's end; against the fault's length `F` (a
//!   pause: `SIGSTOP` to `SIGCONT`; a restart: kill to the new server answering `PING`; a
//!   Cluster primary kill: kill to the replica's promotion) and the target
//!   `F + 2 × deadline + 100 ms`.
//!
//! A reset run ([`Fault::Reset`]) reports instead the units admitted in the 1 s from the
//! reset's answer on ([`Report::after_reset`]) against what one fresh bucket admits in it
//! (`burst + limit`) plus what the other instances may still spend of units leased before
//! the reset: their units held at the reset ([`Report::held_at_reset`]) and, the documented
//! bound, `(N - 1) × max_lease` ([`Report::reset_bound`]).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::store::tiered::TieredStore;
use ratekeeper_core::store::{Charge, Checked, FailurePolicy, PolicyId, Store, StoreError};
use ratekeeper_core::{Key, Policy, Quota};

use crate::redis::{RedisCluster, RedisServer};

/// The fault injected during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No fault.
    None,
    /// One app instance stops deciding (its load generator is aborted with the requests in
    /// flight, like `kill -9` or a drain); the others take its traffic. Its store is kept,
    /// unused, until the end of the run: for the tiered store that is an instance drained
    /// by a deploy, whose unspent leases its sweeper must give back.
    KillInstance,
    /// `SIGSTOP` Redis for this long, then `SIGCONT`.
    Pause(Duration),
    /// `kill -9` Redis and start it again on the same port (empty).
    Restart,
    /// `kill -9` the Cluster primary that holds the key; its replica is promoted.
    KillPrimary,
    /// An operator resets the key ([`Store::reset`]) through the first instance, under load.
    Reset,
}

impl Fault {
    /// The short name used in the table.
    pub fn name(self) -> String {
        match self {
            Self::None => "none".to_owned(),
            Self::KillInstance => "kill -9 instance".to_owned(),
            Self::Pause(d) => format!("SIGSTOP {} ms", d.as_millis()),
            Self::Restart => "restart Redis".to_owned(),
            Self::KillPrimary => "kill primary".to_owned(),
            Self::Reset => "reset".to_owned(),
        }
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// App instances.
    pub instances: usize,
    /// Failure policy of every instance.
    pub on_failure: FailurePolicy,
    /// The fault, injected at [`Scenario::fault_at`].
    pub fault: Fault,
    /// A Redis Cluster (3 primaries, 3 replicas) instead of one server.
    pub cluster: bool,
    /// Every instance decides through a [`TieredStore`] over its Redis store (leases; the
    /// builder's defaults, [`TIERED_MAX_LEASE`] units at most) instead of the Redis store.
    pub tiered: bool,
    /// Quota: `limit` units per second, burst `burst` (GCRA), one key shared by the fleet.
    pub limit: u32,
    /// Bucket capacity.
    pub burst: u32,
    /// Offered load as a multiple of `limit` (spread evenly over the live instances).
    pub offered: f64,
    /// Offered load before [`Scenario::fault_at`], when it differs from `offered` (a reset
    /// run: below the quota, so the instances lease ahead, then above it).
    pub offered_before: Option<f64>,
    /// Decision deadline of every store.
    pub deadline: Duration,
    /// How long load is offered.
    pub duration: Duration,
    /// When the fault starts (from the start of the load).
    pub fault_at: Duration,
    /// Seeds the instances' start offsets (so runs are repeatable in their shape).
    pub seed: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            instances: 2,
            on_failure: FailurePolicy::Allow,
            fault: Fault::None,
            cluster: false,
            tiered: false,
            limit: 200,
            burst: 20,
            offered: 2.0,
            offered_before: None,
            deadline: Duration::from_millis(50),
            duration: Duration::from_secs(5),
            fault_at: Duration::from_secs(2),
            seed: 1,
        }
    }
}

/// What one decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted by Redis.
    Admitted,
    /// Denied by Redis (or its negative cache): 429.
    Denied,
    /// Answered by the failure policy: admitted (`Allow`, or a fail-soft share that allows).
    DegradedAdmitted,
    /// Answered by the failure policy: denied by a fail-soft share (429).
    DegradedDenied,
    /// Answered by the failure policy `Deny`: 503.
    Unavailable,
}

impl Outcome {
    /// Whether the request was admitted.
    pub fn is_admitted(self) -> bool {
        matches!(self, Self::Admitted | Self::DegradedAdmitted)
    }

    /// Whether the failure policy answered.
    pub fn is_degraded(self) -> bool {
        matches!(
            self,
            Self::DegradedAdmitted | Self::DegradedDenied | Self::Unavailable
        )
    }
}

/// One logged decision: when it was answered (from the start of the load) and how.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// When the decision was answered.
    pub at: Duration,
    /// What it was.
    pub outcome: Outcome,
}

/// The summary of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario.
    pub scenario: Scenario,
    /// Every decision.
    pub events: Vec<Event>,
    /// Most units admitted in any 1 s window.
    pub worst_window: u64,
    /// `worst_window / (burst + limit)`.
    pub worst_ratio: f64,
    /// 503 answers.
    pub unavailable: usize,
    /// The fault's failure-policy window (see the module docs; zero when none).
    pub failure_window: Duration,
    /// The fault's length `F` (zero for no fault and an instance kill; a reset: its call).
    pub fault_len: Duration,
    /// A reset run: units the other instances held for the key when the reset was sent
    /// (leased before it; zero for the Redis store).
    pub held_at_reset: u64,
    /// A reset run: units admitted in the 1 s from the reset's answer on.
    pub after_reset: u64,
}

/// The tiered store's [`max_lease`](ratekeeper_core::store::tiered::TieredStoreBuilder::max_lease)
/// default: `N_max` in its over-admission bound.
pub const TIERED_MAX_LEASE: u64 = 100;

impl Report {
    /// `F + 2 × deadline + 100 ms`: the longest failure-policy window the fault may cost.
    pub fn window_target(&self) -> Duration {
        self.fault_len + 2 * self.scenario.deadline + Duration::from_millis(100)
    }

    /// Whether the failure-policy window is within [`Report::window_target`].
    pub fn window_met(&self) -> bool {
        self.failure_window <= self.window_target()
    }

    /// What one fresh bucket admits in the 1 s from a reset on: `burst + limit`.
    pub fn fresh_budget(&self) -> u64 {
        u64::from(self.scenario.burst) + u64::from(self.scenario.limit)
    }

    /// The documented bound of a reset run's 1 s from the reset: a fresh bucket, plus up to
    /// one lease ([`TIERED_MAX_LEASE`]) on each instance but the one that reset (whose lease
    /// the reset drops) for the tiered store; the fresh bucket alone for the Redis store.
    pub fn reset_bound(&self) -> u64 {
        let others = if self.scenario.tiered {
            (self.scenario.instances as u64).saturating_sub(1) * TIERED_MAX_LEASE
        } else {
            0
        };
        self.fresh_budget() + others
    }

    /// Whether [`Report::after_reset`] is within [`Report::reset_bound`].
    pub fn reset_held(&self) -> bool {
        self.after_reset <= self.reset_bound()
    }

    /// One markdown row of a reset run: instances, store, offered before and after, decisions,
    /// admitted, worst ratio, degraded, admitted in the 1 s from the reset, the units the
    /// others held at the reset, the fresh budget, the bound and whether it held.
    pub fn reset_row(&self) -> String {
        let s = &self.scenario;
        format!(
            "| {} | {} | {:.1}× → {:.1}× | {} | {} | {} | {:.2} | {} | {} | {} | {} {} |",
            s.instances,
            if s.tiered { "tiered" } else { "redis" },
            s.offered_before.unwrap_or(s.offered),
            s.offered,
            self.events.len(),
            self.admitted(),
            self.degraded(),
            self.worst_ratio,
            self.after_reset,
            self.held_at_reset,
            self.fresh_budget(),
            self.reset_bound(),
            if self.reset_held() {
                "held"
            } else {
                "not held"
            },
        )
    }

    /// The header of [`Report::reset_row`].
    pub fn reset_header() -> &'static str {
        "| N | store | offered | decisions | admitted | degraded | worst 1 s ÷ (burst + limit) | admitted in the 1 s from the reset | held by the others at the reset | burst + limit | bound |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
    }

    /// Degraded decisions.
    pub fn degraded(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.outcome.is_degraded())
            .count()
    }

    /// Admitted units.
    pub fn admitted(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.outcome.is_admitted())
            .count()
    }

    /// One markdown table row: instances, backend, fault, policy, decisions, admitted,
    /// worst ratio, 503s, failure-policy window, F, target and whether it was met.
    pub fn row(&self) -> String {
        let s = &self.scenario;
        let ms = |d: Duration| d.as_millis();
        let no_window = matches!(s.fault, Fault::None | Fault::KillInstance | Fault::Reset);
        let window = if no_window {
            "–".to_owned()
        } else {
            format!("{}", ms(self.failure_window))
        };
        let target = if no_window {
            "–".to_owned()
        } else {
            format!(
                "{} {}",
                ms(self.window_target()),
                if self.window_met() { "met" } else { "not met" }
            )
        };
        format!(
            "| {} | {} | {} | {} | {} | {:.1}× | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            s.instances,
            if s.tiered { "tiered" } else { "redis" },
            if s.cluster { "cluster" } else { "standalone" },
            s.fault.name(),
            s.on_failure,
            s.offered,
            self.events.len(),
            self.admitted(),
            self.degraded(),
            self.worst_ratio,
            self.unavailable,
            window,
            ms(self.fault_len),
            target,
        )
    }

    /// The header of [`Report::row`].
    pub fn header() -> &'static str {
        "| N | store | Redis | fault | policy | offered | decisions | admitted | degraded | worst 1 s ÷ (burst + limit) | 503 | failure window ms | F ms | target ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }
}

/// The Redis the fleet shares.
enum Backend {
    Single(RedisServer),
    Cluster(RedisCluster),
}

/// The hash tag body of the key (`Key::from("fleet-key")` encodes as `s:fleet-key`).
const KEY: &str = "fleet-key";

impl Backend {
    async fn store(&self, s: &Scenario) -> Result<RedisStore, StoreError> {
        let builder = RedisStore::builder()
            .deadline(s.deadline)
            .on_failure(s.on_failure)
            .prefix("fleet");
        match self {
            Self::Single(server) => builder.standalone(&server.url()).await,
            Self::Cluster(cluster) => {
                let urls = cluster.urls();
                let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
                builder.cluster(&nodes).await
            }
        }
    }
}

/// An instance's store: the Redis store, or a tiered store over it.
enum Handle {
    Redis(RedisStore),
    Tiered(TieredStore),
}

/// One instance: its store, the policy id and the limit Redis reports for it.
struct Instance {
    store: Handle,
    policy: PolicyId,
    /// The limit a decision made by Redis reports (the advertised burst); a fail-soft share
    /// reports its own, smaller one.
    redis_limit: u32,
}

impl Instance {
    async fn build(backend: &Backend, s: &Scenario, quota: Quota) -> Self {
        let redis = backend.store(s).await.expect("store ready");
        let policy = Policy::new("api", quota);
        let (store, id) = if s.tiered {
            let mut tiered = TieredStore::builder()
                .build(redis)
                .expect("the tiered store's defaults");
            let id = tiered.register(&policy).expect("policy");
            (Handle::Tiered(tiered), id)
        } else {
            let mut redis = redis;
            let id = redis.register(&policy).expect("policy");
            (Handle::Redis(redis), id)
        };
        Self {
            store,
            policy: id,
            redis_limit: s.burst,
        }
    }

    async fn decide(&self) -> Outcome {
        let key = Key::from(KEY);
        let result = match &self.store {
            Handle::Redis(store) => store.check_async(&[(self.policy, key, 1)]).await,
            Handle::Tiered(store) => match store.check(&[Charge::new(self.policy, &key, 1)]) {
                Checked::Ready(result) => result,
                Checked::Pending(future) => future.await,
            },
        };
        match result {
            // Redis's admissions carry a receipt (so do the tiered store's, spent from a
            // lease Redis granted); the failure policy's (fail-soft, local) never do: the
            // charge was not made in Redis.
            Ok(d) if d.is_allowed() => {
                if d.receipts().all(|r| r.is_some()) {
                    Outcome::Admitted
                } else {
                    Outcome::DegradedAdmitted
                }
            }
            // A denial by a fail-soft share reports the share's limit.
            Ok(d) => {
                if d.as_slice().iter().all(|x| x.limit() == self.redis_limit) {
                    Outcome::Denied
                } else {
                    Outcome::DegradedDenied
                }
            }
            Err(e) if e.failure_policy() == FailurePolicy::Deny => Outcome::Unavailable,
            // Fail open (and every other failure the layer lets through).
            Err(_) => Outcome::DegradedAdmitted,
        }
    }

    /// Units this instance holds for the key (leased, unspent; zero for the Redis store).
    fn held(&self) -> u64 {
        match &self.store {
            Handle::Redis(_) => 0,
            Handle::Tiered(store) => store.held(self.policy, &Key::from(KEY)),
        }
    }

    /// Resets the key through this instance's store.
    async fn reset(&self) -> Result<(), StoreError> {
        let key = Key::from(KEY);
        match &self.store {
            Handle::Redis(store) => store.reset_async(Some(self.policy), &key).await,
            Handle::Tiered(store) => store.reset_async(Some(self.policy), &key).await,
        }
        .map(drop)
    }

    /// Ends the instance: a tiered store gives its unused units back (bounded by the Redis
    /// store's deadline per call).
    async fn shutdown(&self) {
        if let Handle::Tiered(store) = &self.store {
            let _ = store.shutdown().await;
        }
    }
}

/// A tiny xorshift for the seeded start offsets.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Runs `scenario` against a fresh `redis-server` (or Cluster) and sums it up.
///
/// # Panics
///
/// When Redis cannot be started or a store cannot be built (a test environment failure).
pub async fn run(scenario: Scenario) -> Report {
    let backend = if scenario.cluster {
        Backend::Cluster(
            tokio::task::spawn_blocking(RedisCluster::start)
                .await
                .expect("cluster"),
        )
    } else {
        Backend::Single(
            tokio::task::spawn_blocking(RedisServer::start)
                .await
                .expect("server"),
        )
    };
    let quota = Quota::per_second(NonZeroU32::new(scenario.limit).expect("limit > 0"))
        .with_burst(scenario.burst)
        .expect("burst");
    let mut instances = Vec::new();
    for _ in 0..scenario.instances {
        instances.push(Arc::new(Instance::build(&backend, &scenario, quota).await));
    }
    let events = Arc::new(std::sync::Mutex::new(Vec::<Event>::new()));
    let live = Arc::new(AtomicUsize::new(scenario.instances));
    let stop = Arc::new(AtomicBool::new(false));
    let rate = f64::from(scenario.limit) * scenario.offered;
    let rate_before =
        f64::from(scenario.limit) * scenario.offered_before.unwrap_or(scenario.offered);
    let fault_at = scenario.fault_at;
    let start = Instant::now();
    let mut seed = scenario.seed.max(1);
    let mut generators = Vec::new();
    for instance in &instances {
        let instance = Arc::clone(instance);
        let events = Arc::clone(&events);
        let live = Arc::clone(&live);
        let stop = Arc::clone(&stop);
        let offset = Duration::from_micros(next(&mut seed) % 5_000);
        generators.push(tokio::spawn(async move {
            let mut at = start + offset;
            let mut inflight = tokio::task::JoinSet::new();
            while !stop.load(Ordering::Relaxed) {
                // Each live instance offers an equal part of the fleet's load.
                let rate = if at < start + fault_at {
                    rate_before
                } else {
                    rate
                };
                let per = rate / live.load(Ordering::Relaxed).max(1) as f64;
                at += Duration::from_secs_f64(1.0 / per);
                tokio::time::sleep_until(at.into()).await;
                let instance = Arc::clone(&instance);
                let events = Arc::clone(&events);
                inflight.spawn(async move {
                    let outcome = instance.decide().await;
                    let event = Event {
                        at: start.elapsed(),
                        outcome,
                    };
                    if let Ok(mut e) = events.lock() {
                        e.push(event);
                    }
                });
                while inflight.try_join_next().is_some() {}
            }
            while inflight.join_next().await.is_some() {}
        }));
    }

    tokio::time::sleep_until((start + scenario.fault_at).into()).await;
    let mut backend = backend;
    let fault_start = start.elapsed();
    let mut held_at_reset = 0;
    let fault_len = if scenario.fault == Fault::Reset {
        // What the other instances hold, leased before the reset, as it is sent.
        held_at_reset = instances.iter().skip(1).map(|i| i.held()).sum();
        let began = Instant::now();
        instances[0].reset().await.expect("the reset reaches Redis");
        began.elapsed()
    } else {
        inject(scenario.fault, &mut backend, &mut generators, &live).await
    };
    tokio::time::sleep_until((start + scenario.duration.max(scenario.fault_at + fault_len)).into())
        .await;
    stop.store(true, Ordering::Relaxed);
    for g in generators {
        let _ = g.await;
    }
    for instance in &instances {
        instance.shutdown().await;
    }
    drop(instances);
    let mut events = events.lock().map(|e| e.clone()).unwrap_or_default();
    events.sort_by_key(|e| e.at);
    let mut report = summarise(scenario, events, fault_len);
    if report.scenario.fault == Fault::Reset {
        // From the reset's answer on: a decision answered earlier may have been made by
        // Redis before the reset.
        let from = fault_start + fault_len;
        let to = from + Duration::from_secs(1);
        report.held_at_reset = held_at_reset;
        report.after_reset = report
            .events
            .iter()
            .filter(|e| e.outcome.is_admitted() && e.at >= from && e.at < to)
            .count() as u64;
    }
    report
}

/// Injects `fault`; returns its length `F`.
async fn inject(
    fault: Fault,
    backend: &mut Backend,
    generators: &mut Vec<tokio::task::JoinHandle<()>>,
    live: &AtomicUsize,
) -> Duration {
    match (fault, backend) {
        (Fault::None, _) => Duration::ZERO,
        (Fault::KillInstance, _) => {
            if let Some(g) = generators.pop() {
                g.abort();
                live.fetch_sub(1, Ordering::Relaxed);
            }
            Duration::ZERO
        }
        (Fault::Pause(d), Backend::Single(server)) => {
            let began = Instant::now();
            server.signal("STOP");
            tokio::time::sleep(d).await;
            server.signal("CONT");
            began.elapsed()
        }
        (Fault::Restart, Backend::Single(server)) => {
            let began = Instant::now();
            // `restart` waits for PING on this thread: keep the runtime's other workers free.
            tokio::task::block_in_place(|| {
                server.kill();
                server.restart();
            });
            began.elapsed()
        }
        (Fault::KillPrimary, Backend::Cluster(cluster)) => {
            tokio::task::block_in_place(|| kill_primary(cluster))
        }
        // Made by `run` through an instance.
        (Fault::Reset, _) => Duration::ZERO,
        // Not meaningful for this backend: no fault.
        (Fault::Pause(_) | Fault::Restart, Backend::Cluster(_))
        | (Fault::KillPrimary, Backend::Single(_)) => Duration::ZERO,
    }
}

/// Kills the primary holding the key and waits (at most 20 s) for its replica to be
/// promoted and the Cluster to be ok; returns kill to promotion. Blocking (`redis-cli`).
fn kill_primary(cluster: &mut RedisCluster) -> Duration {
    let key = format!("{{s:{KEY}}}");
    let primary = cluster.primary_for(&key);
    let port = cluster.nodes[primary].port().to_string();
    // The replica: the node whose ROLE names the primary's port.
    let replica = cluster
        .nodes
        .iter()
        .position(|n| {
            n.cli(&["ROLE"]).is_some_and(|r| {
                let mut lines = r.lines();
                lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str())
            })
        })
        .expect("the primary has a replica");
    let began = Instant::now();
    cluster.nodes[primary].kill();
    while began.elapsed() < Duration::from_secs(20) {
        let promoted = cluster.nodes[replica]
            .cli(&["ROLE"])
            .is_some_and(|r| r.starts_with("master"));
        let ok = cluster.nodes[replica]
            .cli(&["CLUSTER", "INFO"])
            .is_some_and(|i| i.contains("cluster_state:ok"));
        if promoted && ok {
            return began.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    began.elapsed()
}

/// Degraded decisions further apart than this belong to different failures.
const APART: Duration = Duration::from_millis(100);

/// The failure-policy window of the fault: from the first degraded decision at or after the
/// fault's start to the end of the run of degraded decisions (none more than [`APART`] from
/// the next) that reaches past the fault's end. Isolated failures elsewhere in the run (a
/// decision that missed its deadline on a loaded machine) are not part of it; they are
/// counted in the `degraded` column.
fn fault_window(degraded: &[Duration], fault_at: Duration, fault_len: Duration) -> Duration {
    let Some(first) = degraded.iter().position(|&t| t >= fault_at) else {
        return Duration::ZERO;
    };
    let fault_end = fault_at + fault_len;
    let mut last = first;
    while let Some(&next) = degraded.get(last + 1) {
        let here = degraded[last];
        if next <= fault_end || next - here <= APART {
            last += 1;
        } else {
            break;
        }
    }
    degraded[last] - degraded[first]
}

/// Sums up a run's events.
fn summarise(scenario: Scenario, events: Vec<Event>, fault_len: Duration) -> Report {
    let admitted: Vec<Duration> = events
        .iter()
        .filter(|e| e.outcome.is_admitted())
        .map(|e| e.at)
        .collect();
    // Sliding 1 s windows in 10 ms steps: two pointers over the sorted admission times.
    let mut worst = 0u64;
    let end = events.last().map_or(Duration::ZERO, |e| e.at);
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut from = Duration::ZERO;
    while from <= end {
        let to = from + Duration::from_secs(1);
        while lo < admitted.len() && admitted[lo] < from {
            lo += 1;
        }
        hi = hi.max(lo);
        while hi < admitted.len() && admitted[hi] < to {
            hi += 1;
        }
        worst = worst.max((hi - lo) as u64);
        from += Duration::from_millis(10);
    }
    let degraded: Vec<Duration> = events
        .iter()
        .filter(|e| e.outcome.is_degraded())
        .map(|e| e.at)
        .collect();
    let failure_window = fault_window(&degraded, scenario.fault_at, fault_len);
    let unavailable = events
        .iter()
        .filter(|e| e.outcome == Outcome::Unavailable)
        .count();
    let budget = f64::from(scenario.burst) + f64::from(scenario.limit);
    Report {
        worst_window: worst,
        worst_ratio: worst as f64 / budget,
        unavailable,
        failure_window,
        fault_len,
        held_at_reset: 0,
        after_reset: 0,
        scenario,
        events,
    }
}
