//! The Redis store (feature `redis`): one budget shared by every app instance.
//!
//! [`RedisStore`] implements [`Store<Key>`] over Redis standalone or Redis Cluster through the
//! [`redis`] crate (tokio, connection manager, cluster-async, scripts), so the same policies,
//! algorithms and headers work unchanged when limits are shared (DESIGN §5).
//!
//! # How a decision is made
//!
//! - **One Lua script, one round trip per decision.** `limiter.lua` holds the twin of each
//!   supported algorithm with the state layouts of [`algorithm`](crate::algorithm): GCRA
//!   ([`Gcra`](crate::algorithm::Gcra), also the leaky-bucket meter, which is GCRA with
//!   capacity = queue depth), the fixed window
//!   ([`FixedWindow`](crate::algorithm::FixedWindow)) and the sliding window counter
//!   ([`SlidingWindow`](crate::algorithm::SlidingWindow); `2 * limit * W` must stay below
//!   2^53 µs so the doubles of Lua stay exact), with the same formulas in integer **µs**
//!   (`T` and `W` are the quota's ns values rounded up to a whole µs, so quotas whose `T` and
//!   `W` are whole µs decide exactly like the memory store: the conformance suite checks it).
//!   Policies with different algorithms on one client key still run in one atomic call. The
//!   sliding log and the concurrency counter are refused at build time
//!   ([`StoreError::UnsupportedAlgorithm`]) until their twins exist. The script is
//!   sent with `EVALSHA`; on `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`) the
//!   [`redis::Script`] type loads it and retries, so no manual step is ever needed.
//! - **Time** comes from Redis `TIME` inside the script, so app instances never disagree about
//!   "now". [`RedisStoreBuilder::clock`] injects time instead (the conformance suite).
//! - **Keys** are `rl:v1:{<client key>}:<policy>`. The hash tag holds the whole client key, so
//!   every policy of one client lives in one Cluster slot and a multi-policy check is one
//!   atomic script with every key passed in `KEYS` (case B19). The tag encodes the key's kind
//!   (`ip:`, `net:`, `i:`, `s:`, tuples in parentheses) so different keys never share a name;
//!   `{ } | % ( ) ,`, spaces, control and non-ASCII bytes are escaped as `%XX`, and encodings
//!   longer than 128 bytes become `h:<sha1>`. `v1` is the state-format version.
//! - **TTL on every write** (`SET ... PX`) equal to the time until the state equals "absent"
//!   (GCRA: `TAT - now`; fixed window: until the window ends; rounded up to a ms), so idle keys disappear and no key is ever left
//!   without a TTL (case B20). A denial writes nothing. [`RedisStoreBuilder::min_ttl`] sets a
//!   floor (for injected time, whose TTLs Redis still counts down in real time).
//! - **All-or-nothing**: within one client key the script charges every policy or none.
//!   Charges for different client keys (different slots) are checked one key group after the
//!   other; when a later group denies, the groups already charged are refunded
//!   (reserve-then-refund).
//!
//! # When Redis fails
//!
//! Every decision has a deadline (default 50 ms). When Redis is slow, down or answers an
//! error, the [`OnFailure`] policy decides: [`OnFailure::Allow`] (fail open, the default),
//! [`OnFailure::Deny`] (the layer answers 503), [`OnFailure::Local`] (an in-memory store with
//! the same or overridden policies decides) or [`OnFailure::Degrade`] (the degraded-response
//! fallback serves the request). Each such decision is counted ([`RedisStats::degraded`] and
//! the `ratekeeper_store_degraded_total` counter of the [`metrics`] crate, label `action`).
//! Every decision's round trip is timed in the `ratekeeper_store_latency_seconds` histogram
//! (label `outcome`: `ok` or `error`, a timeout included), and every failure counted in
//! `ratekeeper_store_errors_total`.
//!
//! A **circuit breaker** opens after 3 failures in a row: for the next 500 ms (configurable)
//! decisions go straight to the failure policy without waiting on Redis; then one request
//! probes Redis and closes the breaker when it answers. So a dead Redis costs at most one
//! deadline per open period, not one per request.
//!
//! A script call that reaches Redis after its deadline (plus [`RedisStoreBuilder::max_clock_skew`],
//! compared against Redis `TIME`) does nothing, so requests already answered by the failure
//! policy are not charged a second time when a paused Redis resumes.
//!
//! A **negative cache** remembers denials: until `retry_after` has passed, the same request
//! (same policies, keys and cost) is denied locally without a round trip. For GCRA and the
//! fixed window this is exact, headers included: nothing the key's other requests do can make
//! it pass sooner (refunds aside). Sliding-window denials are not cached (their estimate, and
//! so their headers, move with time).
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::store::redis::{OnFailure, RedisStore};
//! use ratekeeper_core::store::Store;
//! use ratekeeper_core::{Key, Policy, Quota};
//!
//! # struct Server(std::process::Child);
//! # impl Drop for Server {
//! #     fn drop(&mut self) { let _ = self.0.kill(); let _ = self.0.wait(); }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A throwaway redis-server on a free loopback port, killed at the end.
//! # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! # let _server = Server(std::process::Command::new("redis-server")
//! #     .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
//! #     .stdout(std::process::Stdio::null())
//! #     .spawn()?);
//! # for _ in 0..500 {
//! #     if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() { break; }
//! #     std::thread::sleep(Duration::from_millis(10));
//! # }
//! # let url = format!("redis://127.0.0.1:{port}/");
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let mut store = RedisStore::builder()
//!     .deadline(Duration::from_millis(50))
//!     .on_failure(OnFailure::Local)
//!     .standalone(&url) // for example "redis://127.0.0.1:6379/"
//!     .await?;
//! let quota = Quota::per_minute(NonZeroU32::new(2).unwrap());
//! let api = store.register(&Policy::new("api", quota))?;
//! let alice = Key::from("alice");
//! assert_eq!(store.redis_key(api, &alice).as_deref(), Some("rl:v1:{s:alice}:api"));
//!
//! let first = store.check_async(&[(api, alice.clone(), 1)]).await?;
//! assert_eq!(first.as_slice()[0].remaining(), 1);
//! store.check_async(&[(api, alice.clone(), 1)]).await?;
//! let third = store.check_async(&[(api, alice.clone(), 1)]).await?;
//! assert!(!third.is_allowed());
//! // T = 30 s: the next unit frees up 30 s after the first request (Redis TIME, µs).
//! let wait = third.retry_after().expect("denied now, not never");
//! assert_eq!(ratekeeper_core::decision::ceil_secs(wait), 30);
//! assert_eq!(store.stats().degraded, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

mod keys;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use redis::Script;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use super::{
    Charge, Checked, Decisions, FailureAction, MemoryStore, PolicyId, Refund, Store, StoreError,
};
use crate::clock::{Clock, MonotonicClock};
use crate::{Algorithm, Decision, Key, Outcome, Policy};

/// Largest state span the Redis store accepts (GCRA tolerance `burst * T`, fixed-window
/// length `W`), in µs: 2^48 µs, about 8.9 years.
/// Lua numbers are doubles, exact up to 2^53; Unix time in µs is below 2^51 until 2041, so
/// `now + tau` stays exact.
pub const MAX_TOLERANCE_MICROS: u64 = 1 << 48;

/// The negative cache is swept of expired entries when it holds more than this many.
const NEGATIVE_CACHE_SWEEP_AT: usize = 65_536;

/// What a [`RedisStore`] does when Redis cannot decide within the deadline (DESIGN §5, B18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Fail open (default): the request passes without rate-limit headers.
    #[default]
    Allow,
    /// Fail closed: the HTTP layer answers 503.
    Deny,
    /// An in-memory store takes over with the same policies (or the ones given to
    /// [`RedisStoreBuilder::local_policy`]); its decisions carry normal headers.
    Local,
    /// The degraded-response fallback serves the request (see
    /// [`FailureAction::Degrade`]).
    Degrade,
}

impl OnFailure {
    fn label(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Local => "local",
            Self::Degrade => "degrade",
        }
    }
}

/// Counters of one [`RedisStore`] (also exported through the [`metrics`] crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions Redis made.
    pub redis_decisions: u64,
    /// Requests the negative cache denied without a round trip.
    pub negative_cache_hits: u64,
    /// Decisions made by the failure policy (timeout, error or open breaker).
    pub degraded: u64,
    /// Redis errors and timeouts seen (a subset of `degraded`: the rest were skipped by the
    /// open circuit breaker).
    pub errors: u64,
}

/// One owned charge: policy, client key, cost. What [`RedisStore::check_async`] takes.
pub type OwnedCharge = (PolicyId, Key, u64);

/// The future of a Redis check (boxed: the Redis path does I/O anyway).
pub type RedisCheck = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send>>;

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Script algorithm codes (see `limiter.lua`).
const ALGO_GCRA: u64 = 1;
const ALGO_FIXED_WINDOW: u64 = 2;
const ALGO_SLIDING_WINDOW: u64 = 3;

/// Lua numbers are doubles: integers are exact up to 2^53.
const MAX_EXACT: u64 = 1 << 53;

#[derive(Debug, Clone)]
struct RedisPolicy {
    name: Arc<str>,
    limit: u32,
    /// Largest cost that can ever fit (burst for GCRA, limit for fixed window).
    capacity: u32,
    /// Script algorithm code and its three parameters (GCRA: T µs, tau µs, burst; fixed
    /// window: W µs, limit, 0).
    algo: u64,
    params: [u64; 3],
}

/// Builds a [`RedisStore`]: deadline, failure policy, breaker, negative cache, clock.
pub struct RedisStoreBuilder {
    prefix: String,
    deadline: Duration,
    on_failure: OnFailure,
    breaker_failures: u32,
    breaker_open_for: Duration,
    max_clock_skew: Duration,
    min_ttl: Duration,
    negative_cache: bool,
    clock: Option<Arc<dyn Clock>>,
    local_policies: Vec<Policy>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("on_failure", &self.on_failure)
            .field("negative_cache", &self.negative_cache)
            .field("injected_clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: "rl".to_owned(),
            deadline: Duration::from_millis(50),
            on_failure: OnFailure::Allow,
            breaker_failures: 3,
            breaker_open_for: Duration::from_millis(500),
            max_clock_skew: Duration::from_secs(1),
            min_ttl: Duration::ZERO,
            negative_cache: true,
            clock: None,
            local_policies: Vec::new(),
        }
    }
}

impl RedisStoreBuilder {
    /// Key prefix (default `"rl"`): keys are `<prefix>:v1:{<key>}:<policy>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Decision deadline (default 50 ms): after it, the failure policy decides.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What happens when Redis cannot decide (default [`OnFailure::Allow`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Circuit breaker: open after `failures` failures in a row (default 3, at least 1) for
    /// `open_for` (default 500 ms), then let one request probe Redis.
    pub fn breaker(mut self, failures: u32, open_for: Duration) -> Self {
        self.breaker_failures = failures.max(1);
        self.breaker_open_for = open_for;
        self
    }

    /// How far the app's wall clock may be behind Redis `TIME` (default 1 s). A script call
    /// reaching Redis later than `deadline + max_clock_skew` after it was sent does nothing.
    pub fn max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = skew;
        self
    }

    /// The least TTL of a written key (default 0: every write's `PX` is exactly the time
    /// until its state equals "absent", rounded up to a ms; case B20). A larger floor keeps
    /// idle keys longer and never changes a decision: the scripts read a state whose time has
    /// run out exactly like an absent key.
    ///
    /// Meant for an injected [`clock`](Self::clock): the scripts then compute TTLs on the
    /// injected timeline, but Redis still expires keys in real time, so a key written with
    /// 1 ms left on the injected clock vanishes after 1 ms of *real* time even when the
    /// injected clock has not moved. On a loaded machine the next call can come later than
    /// that and see the key absent where the timeline says it still counts. A floor longer
    /// than the test keeps expiry off the injected timeline. Whole ms (sub-ms parts dropped).
    pub fn min_ttl(mut self, ttl: Duration) -> Self {
        self.min_ttl = ttl;
        self
    }

    /// Whether denials are cached locally until `retry_after` (default on).
    pub fn negative_cache(mut self, enabled: bool) -> Self {
        self.negative_cache = enabled;
        self
    }

    /// Injects time: the scripts get `clock.now()` (ns, sent as whole µs) instead of reading
    /// Redis `TIME`, and the negative cache uses the same clock. For tests with a
    /// [`ManualClock`](crate::clock::ManualClock); every instance sharing the keys must use the
    /// same timeline.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// For [`OnFailure::Local`]: the in-memory store uses `policy` instead of the registered
    /// policy with the same name (for example a stricter fixed quota per instance).
    pub fn local_policy(mut self, policy: Policy) -> Self {
        self.local_policies.push(policy);
        self
    }

    /// Connects to a standalone Redis (`redis://host:port/db`). The connection manager
    /// connects lazily and reconnects by itself, so a Redis that is down at start-up only
    /// triggers the failure policy.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid.
    #[allow(clippy::unused_async)]
    pub async fn standalone(self, url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.deadline.max(Duration::from_millis(100))))
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let manager =
            ConnectionManager::new_lazy_with_config(client, config).map_err(unavailable)?;
        Ok(self.finish(Conn::Single(manager)))
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no node can be reached to read the slot map.
    pub async fn cluster(self, nodes: &[&str]) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().copied())
            .connection_timeout(self.deadline.max(Duration::from_millis(100)))
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(unavailable)?;
        let conn = client.get_async_connection().await.map_err(unavailable)?;
        Ok(self.finish(Conn::Cluster(conn)))
    }

    fn finish(self, conn: Conn) -> RedisStore {
        let (clock, injected): (Arc<dyn Clock>, bool) = match self.clock {
            Some(c) => (c, true),
            None => (Arc::new(MonotonicClock::new()), false),
        };
        let local = (self.on_failure == OnFailure::Local)
            .then(|| Arc::new(MemoryStore::with_clock(ClockRef(Arc::clone(&clock)))));
        RedisStore {
            policies: Vec::new(),
            local,
            local_policies: self.local_policies,
            shared: Arc::new(Shared {
                conn,
                script: Script::new(include_str!("limiter.lua")),
                prefix: self.prefix,
                deadline: self.deadline,
                max_clock_skew: self.max_clock_skew,
                min_ttl_ms: u64::try_from(self.min_ttl.as_millis()).unwrap_or(u64::MAX),
                on_failure: self.on_failure,
                clock,
                injected,
                wall: MonotonicClock::new(),
                breaker: Breaker {
                    failures: AtomicU32::new(0),
                    open_until: AtomicU64::new(0),
                    threshold: self.breaker_failures,
                    open_for: nanos(self.breaker_open_for),
                },
                negative: self.negative_cache.then(DashMap::default),
                redis_decisions: AtomicU64::new(0),
                negative_hits: AtomicU64::new(0),
                degraded: AtomicU64::new(0),
                errors: AtomicU64::new(0),
            }),
        }
    }
}

/// A clock shared with the Redis store (so the local fallback sees injected time too).
#[derive(Clone)]
struct ClockRef(Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn unix_now(&self) -> Duration {
        self.0.unix_now()
    }
}

impl fmt::Debug for ClockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClockRef")
    }
}

struct Breaker {
    failures: AtomicU32,
    /// 0 = closed; otherwise the breaker clock's ns until which Redis is skipped.
    open_until: AtomicU64,
    threshold: u32,
    open_for: u64,
}

impl Breaker {
    /// Whether this request may go to Redis. While open, only the first request after the
    /// open period wins the compare-and-swap and probes; the others keep skipping.
    fn admit(&self, now: u64) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        if now < until {
            return false;
        }
        let next = now.saturating_add(self.open_for).max(1);
        self.open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Release);
        self.open_until.store(0, Ordering::Release);
    }

    fn failure(&self, now: u64) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures >= self.threshold {
            let until = now.saturating_add(self.open_for).max(1);
            self.open_until.store(until, Ordering::Release);
        }
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

struct NegativeEntry {
    cost: u64,
    /// Store-clock ns when the entry was written.
    at: u64,
    /// Store-clock ns until which the request is denied.
    until: u64,
    decision: Decision,
}

struct Shared {
    conn: Conn,
    script: Script,
    prefix: String,
    deadline: Duration,
    max_clock_skew: Duration,
    /// Least PX of a write, ms (ARGV[4] of the script).
    min_ttl_ms: u64,
    on_failure: OnFailure,
    clock: Arc<dyn Clock>,
    injected: bool,
    /// Real time for the breaker (never the injected clock: Redis fails in real time).
    wall: MonotonicClock,
    breaker: Breaker,
    negative: Option<DashMap<(PolicyId, Key), NegativeEntry, foldhash::fast::RandomState>>,
    redis_decisions: AtomicU64,
    negative_hits: AtomicU64,
    degraded: AtomicU64,
    errors: AtomicU64,
}

/// Per-key state in Redis, shared by every app instance that uses the same Redis and prefix.
///
/// Built with [`RedisStore::builder`]; see the [module docs](self) for the scripts, keys,
/// TTLs, failure policy, breaker and negative cache. Supports [`Algorithm::Gcra`],
/// [`Algorithm::LeakyBucket`] (as a meter), [`Algorithm::FixedWindow`] and
/// [`Algorithm::SlidingWindow`]; the others are refused at build time with
/// [`StoreError::UnsupportedAlgorithm`].
///
/// # Runtime
///
/// Checks run on the tokio runtime that polls them and need its I/O and time drivers
/// (`#[tokio::main]` and `axum::serve` have both); tokio panics when a timer is created on a
/// runtime built without `enable_time`, so build custom runtimes with `enable_all()`.
/// [`Store::refund`] spawns its Redis call on the current runtime (outside one it is dropped
/// with a warning).
pub struct RedisStore {
    policies: Vec<RedisPolicy>,
    local: Option<Arc<MemoryStore<Key, ClockRef>>>,
    local_policies: Vec<Policy>,
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("policies", &self.policies)
            .field("on_failure", &self.shared.on_failure)
            .field("deadline", &self.shared.deadline)
            .finish_non_exhaustive()
    }
}

fn unavailable(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(err))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A group of charges sharing one client key (one hash tag, one script call).
struct Group {
    keys: Vec<String>,
    /// Five numbers per key: algorithm code, three parameters, cost.
    params: Vec<u64>,
    /// Each key's capacity (the most `remaining` can be).
    capacities: Vec<u32>,
    /// Index of each key's charge in the request.
    slots: Vec<usize>,
    /// Each key's policy limit (reported in decisions).
    limits: Vec<u32>,
}

/// A protocol problem in a script answer (never turned into "allowed").
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the rate-limit script: {0}")]
struct BadReply(&'static str);

impl RedisStore {
    /// A builder with the defaults: prefix `rl`, deadline 50 ms, [`OnFailure::Allow`],
    /// breaker 3 failures / 500 ms, negative cache on, Redis `TIME`.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStats {
        let s = &self.shared;
        RedisStats {
            redis_decisions: s.redis_decisions.load(Ordering::Relaxed),
            negative_cache_hits: s.negative_hits.load(Ordering::Relaxed),
            degraded: s.degraded.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }

    /// Whether the circuit breaker is open (Redis is being skipped).
    pub fn is_breaker_open(&self) -> bool {
        self.shared.breaker.is_open()
    }

    /// The Redis key of `policy` for `key`: `<prefix>:v1:{<encoded key>}:<policy name>`.
    /// `None` for an unknown policy.
    pub fn redis_key(&self, policy: PolicyId, key: &Key) -> Option<String> {
        let p = self.policies.get(policy.index())?;
        Some(keys::full(&self.shared.prefix, &keys::tag(key), &p.name))
    }

    /// Checks owned charges all-or-nothing (the async form of [`Store::check`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy; [`StoreError::Failed`] when
    /// Redis could not decide and the failure policy is not [`OnFailure::Local`].
    pub async fn check_async(&self, charges: &[OwnedCharge]) -> Result<Decisions, StoreError> {
        match self.check_owned(charges.to_vec()) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }

    fn check_owned(&self, charges: Vec<OwnedCharge>) -> Checked<RedisCheck> {
        let shared = &self.shared;
        let mut groups: Vec<Group> = Vec::new();
        let mut tags: Vec<String> = Vec::new();
        for (i, (policy, key, cost)) in charges.iter().enumerate() {
            let Some(p) = self.policies.get(policy.index()) else {
                return Checked::Ready(Err(StoreError::UnknownPolicy(*policy)));
            };
            let tag = keys::tag(key);
            let g = match tags.iter().position(|t| *t == tag) {
                Some(g) => g,
                None => {
                    tags.push(tag.clone());
                    groups.push(Group {
                        keys: Vec::new(),
                        params: Vec::new(),
                        slots: Vec::new(),
                        limits: Vec::new(),
                        capacities: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            if let Some(group) = groups.get_mut(g) {
                group.keys.push(keys::full(&shared.prefix, &tag, &p.name));
                group
                    .params
                    .extend([p.algo, p.params[0], p.params[1], p.params[2], *cost]);
                group.capacities.push(p.capacity);
                group.slots.push(i);
                group.limits.push(p.limit);
            }
        }
        if let Some(decisions) = self.negative_lookup(&charges) {
            shared.negative_hits.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("ratekeeper_negative_cache_hits_total").increment(1);
            return Checked::Ready(Ok(decisions));
        }
        if !shared.breaker.admit(shared.wall.now()) {
            return Checked::Ready(
                self.fail(&charges, StoreError::Unavailable(Box::new(BreakerOpen))),
            );
        }
        let cacheable = charges.iter().all(|(p, _, _)| {
            self.policies
                .get(p.index())
                .is_some_and(|p| p.algo != ALGO_SLIDING_WINDOW)
        });
        let this = self.handle();
        Checked::Pending(Box::pin(async move {
            let run = this.shared.run(&groups, charges.len());
            let started = std::time::Instant::now();
            let result = match tokio::time::timeout(this.shared.deadline, run).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Timeout),
            };
            metrics::histogram!(
                "ratekeeper_store_latency_seconds",
                "outcome" => if result.is_ok() { "ok" } else { "error" }
            )
            .record(started.elapsed().as_secs_f64());
            match result {
                Ok(decisions) => {
                    this.shared.breaker.success();
                    this.shared.redis_decisions.fetch_add(1, Ordering::Relaxed);
                    this.negative_update(&charges, &decisions, cacheable);
                    Ok(decisions)
                }
                Err(err) => {
                    this.shared.breaker.failure(this.shared.wall.now());
                    this.shared.errors.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("ratekeeper_store_errors_total").increment(1);
                    this.fail(&charges, err)
                }
            }
        }))
    }

    /// A cheap handle for a future: shares everything, copies nothing big.
    fn handle(&self) -> Handle {
        Handle {
            shared: Arc::clone(&self.shared),
            local: self.local.clone(),
        }
    }

    fn fail(&self, charges: &[OwnedCharge], err: StoreError) -> Result<Decisions, StoreError> {
        self.handle().fail(charges, err)
    }

    fn negative_lookup(&self, charges: &[OwnedCharge]) -> Option<Decisions> {
        let cache = self.shared.negative.as_ref()?;
        if cache.is_empty() || charges.is_empty() {
            return None;
        }
        let now = self.shared.clock.now();
        let mut out = Vec::with_capacity(charges.len());
        let mut any_denied = false;
        for (policy, key, cost) in charges {
            let entry = cache.get(&(*policy, key.clone()))?;
            if entry.cost != *cost || now >= entry.until {
                return None;
            }
            let elapsed = Duration::from_nanos(now.saturating_sub(entry.at));
            let d = entry.decision;
            let outcome = match d.outcome() {
                Outcome::Denied { retry_after } => {
                    any_denied = true;
                    Outcome::Denied {
                        retry_after: retry_after.saturating_sub(elapsed),
                    }
                }
                other => other,
            };
            // GCRA: the state (TAT) has not changed since the denial (an allowed charge of
            // this pair removes the entry), so `reset_after` shrinks with time and
            // `remaining = min(burst, floor((tau - reset_after) / T))` follows exactly.
            let reset = d.reset_after().saturating_sub(elapsed);
            let remaining = match self.policies.get(policy.index()) {
                Some(p) if p.algo == ALGO_GCRA => {
                    let room = u128::from(p.params[1]) * 1_000;
                    let t = u128::from(p.params[0]) * 1_000;
                    let whole = room.saturating_sub(reset.as_nanos()) / t.max(1);
                    u32::try_from(whole.min(u128::from(p.capacity))).unwrap_or(p.capacity)
                }
                // Fixed window: the count stays until the window ends (the entry's `until`).
                _ => d.remaining(),
            };
            out.push(Decision::new(outcome, d.limit(), remaining, reset));
        }
        any_denied.then(|| Decisions::new(out))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("circuit breaker open: Redis is skipped until the next probe")]
struct BreakerOpen;

#[derive(Clone)]
struct Handle {
    shared: Arc<Shared>,
    local: Option<Arc<MemoryStore<Key, ClockRef>>>,
}

impl Handle {
    fn fail(&self, charges: &[OwnedCharge], err: StoreError) -> Result<Decisions, StoreError> {
        let policy = self.shared.on_failure;
        self.shared.degraded.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ratekeeper_store_degraded_total", "action" => policy.label())
            .increment(1);
        tracing::warn!(error = %err, action = policy.label(), "redis store could not decide; failure policy applied");
        let action = match policy {
            OnFailure::Allow => FailureAction::Allow,
            OnFailure::Deny => FailureAction::Deny,
            OnFailure::Degrade => FailureAction::Degrade,
            OnFailure::Local => {
                if let Some(local) = &self.local {
                    let borrowed: Vec<Charge<'_, Key>> = charges
                        .iter()
                        .map(|(p, k, c)| Charge::new(*p, k, *c))
                        .collect();
                    return local.check_now(&borrowed);
                }
                FailureAction::Allow
            }
        };
        Err(StoreError::Failed {
            action,
            source: Box::new(err),
        })
    }

    /// After a Redis decision: an allowed request changed the state of its pairs, so their
    /// cached entries go; a denial is remembered until `retry_after`.
    fn negative_update(&self, charges: &[OwnedCharge], decisions: &Decisions, cacheable: bool) {
        let Some(cache) = &self.shared.negative else {
            return;
        };
        if decisions.is_allowed() {
            if !cache.is_empty() {
                for (policy, key, _) in charges {
                    cache.remove(&(*policy, key.clone()));
                }
            }
            return;
        }
        let Some(retry) = decisions.retry_after() else {
            return;
        };
        // Only where the cached headers stay exact: GCRA (remaining follows from reset) and
        // the fixed window (nothing changes until the window ends). A sliding-window
        // estimate moves with time, so those denials always ask Redis.
        if !cacheable {
            return;
        }
        if decisions.is_allowed() || retry.is_zero() {
            return;
        }
        let now = self.shared.clock.now();
        let until = now.saturating_add(nanos(retry));
        if cache.len() >= NEGATIVE_CACHE_SWEEP_AT {
            cache.retain(|_, e| e.until > now);
            if cache.len() >= NEGATIVE_CACHE_SWEEP_AT {
                cache.clear();
            }
        }
        for ((policy, key, cost), decision) in charges.iter().zip(decisions.as_slice()) {
            cache.insert(
                (*policy, key.clone()),
                NegativeEntry {
                    cost: *cost,
                    at: now,
                    until,
                    decision: *decision,
                },
            );
        }
    }
}

impl Shared {
    /// Runs every group; reserve-then-refund across groups.
    async fn run(&self, groups: &[Group], len: usize) -> Result<Decisions, StoreError> {
        let mut results: Vec<Option<Decision>> = vec![None; len];
        let mut charged: Vec<usize> = Vec::new();
        let mut denied = false;
        for (g, group) in groups.iter().enumerate() {
            let rows = self.call(group, "check").await?;
            let allowed = rows.iter().all(Decision::is_allowed);
            place(&mut results, group, &rows);
            if allowed {
                charged.push(g);
            } else {
                denied = true;
                break;
            }
        }
        if denied {
            for (g, group) in groups.iter().enumerate() {
                let mode = if charged.contains(&g) {
                    "refund"
                } else {
                    "peek"
                };
                if results.iter().all(Option::is_some) && mode == "peek" {
                    continue;
                }
                let rows = self.call(group, mode).await?;
                place(&mut results, group, &rows);
            }
        }
        let all: Option<Vec<Decision>> = results.into_iter().collect();
        all.map(Decisions::new)
            .ok_or_else(|| unavailable(BadReply("missing decision")))
    }

    async fn call(&self, group: &Group, mode: &str) -> Result<Vec<Decision>, StoreError> {
        let now_arg = if self.injected {
            (self.clock.now() / 1_000).to_string()
        } else {
            String::new()
        };
        // A refund always applies (it gives back a charge that did happen); a check or peek
        // that reaches Redis after its caller gave up does nothing.
        let stale = if mode == "refund" {
            String::new()
        } else {
            unix_micros(SystemTime::now() + self.deadline + self.max_clock_skew).to_string()
        };
        let mut invocation = self.script.prepare_invoke();
        for key in &group.keys {
            invocation.key(key);
        }
        invocation
            .arg(now_arg)
            .arg(stale)
            .arg(mode)
            .arg(self.min_ttl_ms);
        for v in &group.params {
            invocation.arg(*v);
        }
        let reply: Vec<i64> = match &self.conn {
            Conn::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
        .map_err(unavailable)?;
        if reply.first() == Some(&-1) {
            return Err(StoreError::Timeout);
        }
        if reply.len() != group.keys.len() * 4 {
            return Err(unavailable(BadReply("wrong number of values")));
        }
        let mut out = Vec::with_capacity(group.keys.len());
        for (row, chunk) in reply.chunks_exact(4).enumerate() {
            let burst = group.capacities.get(row).copied().unwrap_or(0);
            let &[code, remaining, reset, retry] = chunk else {
                return Err(unavailable(BadReply("short row")));
            };
            let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
            let outcome = match code {
                0 => Outcome::Allowed,
                1 => Outcome::Denied {
                    retry_after: us(retry),
                },
                2 => Outcome::CannotFit,
                _ => return Err(unavailable(BadReply("unknown outcome code"))),
            };
            let remaining = u32::try_from(remaining.clamp(0, i64::from(burst))).unwrap_or(0);
            let limit = group.limits.get(row).copied().unwrap_or(0);
            out.push(Decision::new(outcome, limit, remaining, us(reset)));
        }
        Ok(out)
    }
}

fn place(results: &mut [Option<Decision>], group: &Group, rows: &[Decision]) {
    for (slot, decision) in group.slots.iter().zip(rows) {
        if let Some(r) = results.get_mut(*slot) {
            *r = Some(*decision);
        }
    }
}

impl Store<Key> for RedisStore {
    type Future = RedisCheck;

    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        policy.validate()?;
        let quota = policy.quota();
        let (algo, params, capacity, span_us) = match policy.algorithm() {
            // The leaky-bucket meter is GCRA with capacity = queue depth (= burst).
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                let t_us = quota.emission_interval_nanos().div_ceil(1_000).max(1);
                let tau_us = t_us.saturating_mul(u64::from(quota.burst()));
                (
                    ALGO_GCRA,
                    [t_us, tau_us, u64::from(quota.burst())],
                    quota.burst(),
                    tau_us,
                )
            }
            Algorithm::FixedWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                (
                    ALGO_FIXED_WINDOW,
                    [w_us, u64::from(quota.limit()), 0],
                    quota.limit(),
                    w_us,
                )
            }
            Algorithm::SlidingWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                let limit = u64::from(quota.limit());
                // The estimate multiplies counts by W: keep 2 * limit * W exact in a double.
                if w_us.saturating_mul(limit).saturating_mul(2) > MAX_EXACT {
                    return Err(StoreError::UnsupportedQuota(format!(
                        "policy {:?}: 2 * limit * window is more than 2^53 µs, the Redis store's \
                         sliding window counter cannot compute it exactly",
                        policy.name()
                    )));
                }
                (ALGO_SLIDING_WINDOW, [w_us, limit, 0], quota.limit(), w_us)
            }
            other => return Err(StoreError::UnsupportedAlgorithm(other)),
        };
        if span_us > MAX_TOLERANCE_MICROS {
            return Err(StoreError::UnsupportedQuota(format!(
                "policy {:?}: its state spans {span_us} µs, more than the Redis store's {MAX_TOLERANCE_MICROS} µs",
                policy.name()
            )));
        }
        let id = PolicyId::from_index(
            u32::try_from(self.policies.len())
                .map_err(|_| StoreError::UnsupportedQuota("too many policies".to_owned()))?,
        );
        if let Some(local) = &mut self.local {
            let local_policy = self
                .local_policies
                .iter()
                .find(|p| p.name() == policy.name())
                .unwrap_or(policy);
            let store = Arc::get_mut(local).ok_or_else(|| {
                StoreError::UnsupportedQuota(
                    "policies must be registered before the store is used".to_owned(),
                )
            })?;
            store.register(local_policy)?;
        }
        self.policies.push(RedisPolicy {
            name: Arc::from(policy.name()),
            limit: policy.advertised().0,
            capacity,
            algo,
            params,
        });
        Ok(id)
    }

    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        let owned = charges
            .iter()
            .map(|c| (c.policy, c.key.clone(), c.cost))
            .collect();
        self.check_owned(owned)
    }

    fn refund(&self, refunds: &[Refund<'_, Key>]) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("redis store refund outside a tokio runtime; dropped");
            return;
        };
        let owned: Vec<OwnedCharge> = refunds
            .iter()
            .map(|r| (r.charge.policy, r.charge.key.clone(), r.charge.cost))
            .collect();
        let mut groups = Vec::new();
        for (i, (policy, key, cost)) in owned.iter().enumerate() {
            let Some(p) = self.policies.get(policy.index()) else {
                continue;
            };
            let tag = keys::tag(key);
            groups.push(Group {
                keys: vec![keys::full(&self.shared.prefix, &tag, &p.name)],
                params: vec![p.algo, p.params[0], p.params[1], p.params[2], *cost],
                slots: vec![i],
                limits: vec![p.limit],
                capacities: vec![p.capacity],
            });
        }
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move {
            for group in &groups {
                let call = shared.call(group, "refund");
                if let Ok(Err(err)) | Err(err) = tokio::time::timeout(shared.deadline, call)
                    .await
                    .map_err(|_| StoreError::Timeout)
                {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("ratekeeper_store_errors_total").increment(1);
                    tracing::warn!(error = %err, "redis store refund failed");
                }
            }
        });
    }

    fn unix_now(&self) -> Duration {
        self.shared.clock.unix_now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker {
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            threshold: 3,
            open_for: 500,
        }
    }

    #[test]
    fn breaker_opens_after_threshold_then_lets_one_probe_through() {
        let b = breaker();
        b.failure(10);
        b.failure(20);
        assert!(b.admit(30) && !b.is_open());
        b.failure(30);
        assert!(b.is_open());
        assert!(!b.admit(31));
        assert!(!b.admit(529));
        // Open period over: exactly one probe goes; the others keep skipping.
        assert!(b.admit(530));
        assert!(!b.admit(530));
        assert!(!b.admit(1_000));
        // The probe failed: open again from then.
        b.failure(1_000);
        assert!(!b.admit(1_499));
        assert!(b.admit(1_500));
        b.success();
        assert!(!b.is_open());
        assert!(b.admit(1_501) && b.admit(1_502));
    }

    #[test]
    fn a_dropped_probe_does_not_keep_the_breaker_open_forever() {
        let b = breaker();
        for t in 0..3 {
            b.failure(t);
        }
        assert!(b.admit(502)); // the probe is never answered (its future was dropped)
        assert!(!b.admit(600));
        assert!(b.admit(1_002)); // next open period over: another probe
    }
}
