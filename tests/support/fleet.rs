//! The fleet harness: `N` app instances (tasks, each with its own Redis store handle and
//! connection) share one quota through a real `redis-server` (standalone, or a Cluster of 3
//! primaries and 3 replicas) while a fault is injected; every decision is logged with its
//! time, and the run is summed up per sliding 1 s window.
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

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::store::{FailurePolicy, PolicyId, Store, StoreError};
use ratekeeper_core::{Key, Policy, Quota};

use crate::redis::{RedisCluster, RedisServer};

/// The fault injected during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No fault.
    None,
    /// One app instance dies (its task is aborted and its store dropped, like `kill -9`);
    /// the others take its traffic.
    KillInstance,
    /// `SIGSTOP` Redis for this long, then `SIGCONT`.
    Pause(Duration),
    /// `kill -9` Redis and start it again on the same port (empty).
    Restart,
    /// `kill -9` the Cluster primary that holds the key; its replica is promoted.
    KillPrimary,
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
    /// Quota: `limit` units per second, burst `burst` (GCRA), one key shared by the fleet.
    pub limit: u32,
    /// Bucket capacity.
    pub burst: u32,
    /// Offered load as a multiple of `limit` (spread evenly over the live instances).
    pub offered: f64,
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
            limit: 200,
            burst: 20,
            offered: 2.0,
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
    /// The fault's length `F` (zero for no fault and an instance kill).
    pub fault_len: Duration,
}

impl Report {
    /// `F + 2 × deadline + 100 ms`: the longest failure-policy window the fault may cost.
    pub fn window_target(&self) -> Duration {
        self.fault_len + 2 * self.scenario.deadline + Duration::from_millis(100)
    }

    /// Whether the failure-policy window is within [`Report::window_target`].
    pub fn window_met(&self) -> bool {
        self.failure_window <= self.window_target()
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
        let window = if matches!(s.fault, Fault::None | Fault::KillInstance) {
            "–".to_owned()
        } else {
            format!("{}", ms(self.failure_window))
        };
        let target = if matches!(s.fault, Fault::None | Fault::KillInstance) {
            "–".to_owned()
        } else {
            format!(
                "{} {}",
                ms(self.window_target()),
                if self.window_met() { "met" } else { "not met" }
            )
        };
        format!(
            "| {} | {} | {} | {} | {:.1}× | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            s.instances,
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
        "| N | Redis | fault | policy | offered | decisions | admitted | degraded | worst 1 s ÷ (burst + limit) | 503 | failure window ms | F ms | target ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
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

/// One instance: its store, the policy id and the limit Redis reports for it.
struct Instance {
    store: RedisStore,
    policy: PolicyId,
    /// The limit a decision made by Redis reports (the advertised burst); a fail-soft share
    /// reports its own, smaller one.
    redis_limit: u32,
}

impl Instance {
    async fn decide(&self) -> Outcome {
        let result = self
            .store
            .check_async(&[(self.policy, Key::from(KEY), 1)])
            .await;
        match result {
            // Redis's admissions carry a receipt; the failure policy's (fail-soft, local)
            // never do: the charge was not made in Redis.
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
        let mut store = backend.store(&scenario).await.expect("store ready");
        let policy = store.register(&Policy::new("api", quota)).expect("policy");
        instances.push(Arc::new(Instance {
            store,
            policy,
            redis_limit: scenario.burst,
        }));
    }
    let events = Arc::new(std::sync::Mutex::new(Vec::<Event>::new()));
    let live = Arc::new(AtomicUsize::new(scenario.instances));
    let stop = Arc::new(AtomicBool::new(false));
    let rate = f64::from(scenario.limit) * scenario.offered;
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
    let fault_len = inject(scenario.fault, &mut backend, &mut generators, &live).await;
    tokio::time::sleep_until((start + scenario.duration.max(scenario.fault_at + fault_len)).into())
        .await;
    stop.store(true, Ordering::Relaxed);
    for g in generators {
        let _ = g.await;
    }
    drop(instances);
    let mut events = events.lock().map(|e| e.clone()).unwrap_or_default();
    events.sort_by_key(|e| e.at);
    summarise(scenario, events, fault_len)
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
        scenario,
        events,
    }
}
