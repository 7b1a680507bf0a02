//! [`RedisStoreBuilder`]: connection, deadline, failure policy, breaker, negative cache,
//! clocks; the store is connected and ready when built.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::Breaker;
use super::error::RedisFailure;
use super::failure::Failover;
use super::guard::Guard;
use super::link::{Link, Timing};
use super::negative::NegativeCache;
use super::script::{Conn, ScriptRunner};
use super::shared::Shared;
use super::{RedisStore, nanos};
use crate::Policy;
use crate::clock::{Clock, MonotonicClock};
use crate::store::{FailurePolicy, StoreError};

/// Builds a [`RedisStore`]: deadline, failure policy, breaker, negative cache, clocks.
pub struct RedisStoreBuilder {
    prefix: String,
    deadline: Duration,
    on_failure: FailurePolicy,
    breaker_failures: u32,
    breaker_open_for: Duration,
    stale_tolerance: Duration,
    min_ttl: Duration,
    negative_cache: bool,
    clock: Option<Arc<dyn Clock>>,
    app_clock: Option<Arc<dyn Clock>>,
    local_policies: Vec<Policy>,
    connect_timeout: Duration,
    require_ready: bool,
    instances: Option<NonZeroU32>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("on_failure", &self.on_failure)
            .field("stale_tolerance", &self.stale_tolerance)
            .field("negative_cache", &self.negative_cache)
            .field("connect_timeout", &self.connect_timeout)
            .field("require_ready", &self.require_ready)
            .field("instances", &self.instances)
            .field("injected_clock", &self.clock.is_some())
            .field("injected_app_clock", &self.app_clock.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: "rl".to_owned(),
            deadline: Duration::from_millis(50),
            on_failure: FailurePolicy::Allow,
            breaker_failures: 3,
            breaker_open_for: Duration::from_millis(500),
            stale_tolerance: Duration::from_millis(100),
            min_ttl: Duration::ZERO,
            negative_cache: true,
            clock: None,
            app_clock: None,
            local_policies: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            require_ready: true,
            instances: None,
        }
    }
}

impl RedisStoreBuilder {
    /// Key prefix (default `"rl"`): keys are `<prefix>:v2:{<key>}:<policy>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Decision deadline (default 50 ms): after it, the failure policy decides.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What happens when Redis cannot decide (default [`FailurePolicy::Allow`]).
    pub fn on_failure(mut self, on_failure: FailurePolicy) -> Self {
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

    /// How much later than its deadline a check may reach Redis and still run (default
    /// 100 ms). A later one does nothing (its caller already gave up and the failure policy
    /// answered), so a paused Redis that resumes never charges those requests a second time.
    ///
    /// The guard is measured on one clock, Redis `TIME`: the store learns the offset between
    /// its monotonic clock and Redis `TIME` from every reply, so **any** difference between
    /// the app's wall clock and Redis's is tolerated. The tolerance covers jitter in the
    /// time a call takes to reach Redis and a Redis clock stepped forward between two
    /// replies (which otherwise makes calls look stale until the next reply re-calibrates).
    pub fn stale_tolerance(mut self, tolerance: Duration) -> Self {
        self.stale_tolerance = tolerance;
        self
    }

    /// The least TTL of a written key (default 0: every write's `PX` is exactly the time
    /// until its state equals "absent", rounded up to a ms). A larger floor keeps idle keys
    /// longer and never changes a decision: the script reads a state whose time has run out
    /// exactly like an absent key.
    ///
    /// Meant for an injected [`clock`](Self::clock): the script then computes TTLs on the
    /// injected timeline, but Redis still expires keys in real time, so a key written with
    /// 1 ms left on the injected clock vanishes after 1 ms of *real* time even when the
    /// injected clock has not moved. On a loaded machine the next call can come later than
    /// that and see the key absent where the timeline says it still counts. A floor longer
    /// than the test keeps expiry off the injected timeline. Whole ms (sub-ms parts dropped),
    /// at most [`MAX_MIN_TTL`](Self::MAX_MIN_TTL) (longer floors are lowered to it: Redis
    /// refuses an expiry beyond its range, and every decision would fail).
    pub fn min_ttl(mut self, ttl: Duration) -> Self {
        self.min_ttl = ttl.min(Self::MAX_MIN_TTL);
        self
    }

    /// The longest [`min_ttl`](Self::min_ttl): 365 days.
    pub const MAX_MIN_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

    /// Whether denials are cached locally until `retry_after` (default on).
    pub fn negative_cache(mut self, enabled: bool) -> Self {
        self.negative_cache = enabled;
        self
    }

    /// Injects decision time: the script gets `clock.now()` (ns, sent as whole µs) instead
    /// of reading Redis `TIME`, and the negative cache, the local fallback and epoch-style
    /// reset headers use the same clock. For tests with a
    /// [`ManualClock`](crate::clock::ManualClock); every instance sharing the keys must use
    /// the same timeline. The stale guard and the breaker still run on the app's clock
    /// ([`app_clock`](Self::app_clock)) and Redis `TIME`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The app's own clock (default [`MonotonicClock`]): its `now()` times the circuit
    /// breaker and the stale guard's "sent" instants, and, without an injected
    /// [`clock`](Self::clock), the negative cache; its `unix_now()` is only read before the
    /// first Redis reply (for epoch-style reset headers, which then follow Redis `TIME`).
    /// Decisions never read it. For tests of app clocks that disagree with Redis.
    pub fn app_clock(mut self, clock: impl Clock) -> Self {
        self.app_clock = Some(Arc::new(clock));
        self
    }

    /// For [`FailurePolicy::Local`]: the in-memory store uses `policy` instead of the
    /// registered policy with the same name (for example a stricter fixed quota per
    /// instance).
    pub fn local_policy(mut self, policy: Policy) -> Self {
        self.local_policies.push(policy);
        self
    }

    /// How long building the store waits for Redis to become ready (default 5 s): connected,
    /// every script and the function library loaded (`SCRIPT LOAD`, `FUNCTION LOAD`), Redis
    /// `TIME` read. Attempts are repeated every
    /// 50 ms within it (Redis may still be starting).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether building fails when Redis is not ready within the
    /// [`connect_timeout`](Self::connect_timeout) (default `true`: the build returns
    /// [`StoreError::Unavailable`]). With `false` the store is built anyway, logs a WARN,
    /// answers with its failure policy (each such decision is degraded and counted) and
    /// connects in the background, like after an outage; [`RedisStore::is_ready`] says when
    /// it is.
    pub fn require_ready(mut self, require: bool) -> Self {
        self.require_ready = require;
        self
    }

    /// The number of app instances that share this Redis, for
    /// [`FailurePolicy::FailSoft`]: while Redis is unreachable each instance enforces
    /// `1 / instances` of every policy. Without it a fail-soft store uses the number of live
    /// instances registered in Redis: each registers itself when built and every 250 ms in
    /// the sorted set `<prefix>:v2:{fleet}:instances` (a registration lives 1 s; the key has
    /// a TTL), so an instance learns of one that joined within 250 ms and forgets one that
    /// died within 1 s. An outage uses the size last learned before it. Stores with another
    /// failure policy, or with `instances` set, never register.
    pub fn instances(mut self, instances: NonZeroU32) -> Self {
        self.instances = Some(instances);
        self
    }

    /// Connects to a standalone Redis (`redis://host:port/db`) and makes the store ready
    /// before returning it: connected, every script loaded, Redis `TIME` read (so the stale
    /// guard and epoch-style reset headers follow Redis from the first decision). The first
    /// decisions after a start therefore cost one round trip each, like every later one:
    /// first-use latency is never taken for a store failure. After a fault, the circuit
    /// breaker's prober opens a fresh connection and makes it ready the same way.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] when the URL is invalid (the sentence never repeats the URL,
    /// which may hold a password); [`StoreError::Unavailable`] when Redis is not ready within
    /// the [`connect_timeout`](Self::connect_timeout) (unless
    /// [`require_ready`](Self::require_ready) is off).
    pub async fn standalone(self, url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(|e| bad_url(e, "Redis URL"))?;
        let link = Link::single(client, self.timing());
        self.finish(Conn::Single(link)).await
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port`) and makes
    /// the store ready as [`standalone`](Self::standalone) does (every script loaded on every
    /// primary).
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] when a node URL is invalid, [`StoreError::Unavailable`] when the
    /// Cluster is not ready within the [`connect_timeout`](Self::connect_timeout) (unless
    /// [`require_ready`](Self::require_ready) is off).
    pub async fn cluster(self, nodes: &[&str]) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().copied())
            .connection_timeout(self.attempt_timeout())
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(100)
            .build()
            .map_err(|e| bad_url(e, "Redis Cluster node URL"))?;
        let link = Link::cluster(client, self.timing());
        self.finish(Conn::Cluster(link)).await
    }

    /// How long one connection attempt may take (the deadline, at least 100 ms).
    fn attempt_timeout(&self) -> Duration {
        self.deadline.max(Duration::from_millis(100))
    }

    /// The link's timing: an attempt's connect timeout, the deadline to make a connection
    /// ready, and half a deadline (5 to 50 ms) between two probes.
    fn timing(&self) -> Timing {
        Timing {
            connect: self.attempt_timeout(),
            ready: self.deadline,
            every: (self.deadline / 2).clamp(Duration::from_millis(5), Duration::from_millis(50)),
        }
    }

    async fn finish(self, conn: Conn) -> Result<RedisStore, StoreError> {
        let require = self.require_ready;
        let connect_timeout = self.connect_timeout;
        let store = self.assemble(conn);
        let shared = &store.shared;
        let weak = Arc::downgrade(shared);
        shared.script.conn.link().on_ready(move |server, ago| {
            if let Some(shared) = weak.upgrade() {
                shared.prober_succeeded(server, ago);
            }
        });
        let started = std::time::Instant::now();
        let last = loop {
            let err = match shared.reconnect().await {
                Ok(()) => break None,
                Err(err) => err,
            };
            if !retryable(&err) || started.elapsed() + READY_RETRY >= connect_timeout {
                break Some(err);
            }
            tokio::time::sleep(READY_RETRY).await;
        };
        let learn_fleet = store.failover.learns_fleet();
        match last {
            None if learn_fleet => shared.register_instance().await,
            None => {}
            Some(err) if require => return Err(err),
            Some(err) => {
                tracing::warn!(
                    error = %err,
                    action = store.failover.policy.as_str(),
                    "redis store not ready at start; the failure policy ({}) answers until it \
                     connects (in the background)",
                    store.failover.policy
                );
                shared.start_prober();
            }
        }
        if learn_fleet {
            shared.start_registration();
        }
        Ok(store)
    }

    fn assemble(self, conn: Conn) -> RedisStore {
        let app: Arc<dyn Clock> = self
            .app_clock
            .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let clock = self.clock.clone().unwrap_or_else(|| Arc::clone(&app));
        let allowance = self.deadline.saturating_add(self.stale_tolerance);
        let allowance_us = u64::try_from(allowance.as_micros()).unwrap_or(u64::MAX);
        // Announce the store's counters at 0 (a Prometheus series should exist before its
        // first event, so `rate()` and alerts see it); a no-op without a recorder installed.
        metrics::counter!("ratekeeper_store_errors_total").increment(0);
        metrics::counter!("ratekeeper_store_degraded_total", "action" => self.on_failure.as_str())
            .increment(0);
        if self.negative_cache {
            metrics::counter!("ratekeeper_negative_cache_hits_total").increment(0);
        }
        let failover = Failover::new(
            self.on_failure,
            &clock,
            &app,
            self.instances.map(NonZeroU32::get),
            self.breaker_failures,
        );
        RedisStore {
            policies: Arc::default(),
            local_policies: self.local_policies,
            shared: Arc::new(Shared {
                script: ScriptRunner::new(
                    conn,
                    u64::try_from(self.min_ttl.as_millis()).unwrap_or(u64::MAX),
                    self.clock,
                    Arc::clone(&app),
                    Guard::new(allowance_us),
                ),
                prefix: self.prefix,
                deadline: self.deadline,
                clock,
                app,
                breaker: Breaker::new(self.breaker_failures, nanos(self.breaker_open_for)),
                outage: Arc::clone(&failover.outage),
                instance_id: instance_id(),
                learns_fleet: failover.learns_fleet(),
                negative: self
                    .negative_cache
                    .then(|| NegativeCache::new(self.deadline)),
                redis_decisions: Default::default(),
                negative_hits: Default::default(),
                degraded: Default::default(),
                errors: Default::default(),
            }),
            failover,
        }
    }
}

/// Whether making the store ready may succeed if tried again: Redis unreachable, too slow,
/// the connection dropped, or Redis answering that it is loading its data or a Cluster that
/// is not serving yet. Other answers (a database that does not exist, a refused password, a
/// script Redis cannot compile) fail the build at once.
fn retryable(err: &StoreError) -> bool {
    let StoreError::Unavailable(source) = err else {
        return matches!(err, StoreError::Timeout);
    };
    let Some(failure) = source.downcast_ref::<RedisFailure>() else {
        return true;
    };
    let e = &failure.0;
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_cluster_error()
        || matches!(
            e.code(),
            None | Some("LOADING" | "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "BUSY")
        )
}

/// Pause between two attempts to make the store ready at build.
const READY_RETRY: Duration = Duration::from_millis(50);

/// An id for this store in the fleet registry: host process id, a per-process counter and
/// the wall-clock ns at creation (unique across the instances of a fleet in practice; a
/// collision only makes the learned fleet size smaller, never larger).
fn instance_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{n}-{wall}", std::process::id())
}

/// The configuration error for a URL the `redis` crate refused: one sentence that names what
/// to fix, with the `redis` error as its source (its text carries a debug-formatted kind).
/// A `rediss://` URL without the `redis` crate's TLS support gets its own sentence: the URL
/// is well formed, and the general one would tell the user to write what they wrote.
fn bad_url(err: redis::RedisError, what: &str) -> StoreError {
    let message = if err
        .to_string()
        .contains("with TLS, the feature is not enabled")
    {
        format!(
            "the {what} asks for TLS (rediss://), but the `redis` crate was built without TLS \
             support (its `tls-rustls` or `tls-native-tls` feature); enable one, or use \
             redis://"
        )
    } else {
        format!(
            "the {what} is not valid; expected redis://[user:password@]host:port/db \
             (or rediss:// for TLS, redis+unix:///path for a socket)"
        )
    };
    StoreError::Config {
        message,
        source: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(url: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(RedisStore::builder().standalone(url))
            .unwrap_err();
        assert!(err.is_config(), "{err}");
        err.to_string()
    }

    #[test]
    fn a_tls_url_without_tls_support_says_so() {
        let text = config_error("rediss://127.0.0.1:6379/");
        assert_eq!(
            text,
            "configuration error: the Redis URL asks for TLS (rediss://), but the `redis` crate \
             was built without TLS support (its `tls-rustls` or `tls-native-tls` feature); \
             enable one, or use redis://"
        );
        // Other bad URLs keep the general sentence.
        let text = config_error("http://127.0.0.1:6379/");
        assert!(
            text.starts_with("configuration error: the Redis URL is not valid; expected"),
            "{text}"
        );
    }
}
