//! [`RedisStoreBuilder`]: connection, deadline, failure policy, breaker, negative cache,
//! clocks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::breaker::Breaker;
use super::failure::Failover;
use super::guard::Guard;
use super::negative::NegativeCache;
use super::script::{Conn, ScriptRunner, redis_failure};
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
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("on_failure", &self.on_failure)
            .field("stale_tolerance", &self.stale_tolerance)
            .field("negative_cache", &self.negative_cache)
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

    /// Connects to a standalone Redis (`redis://host:port/db`). The connection manager
    /// connects lazily and reconnects by itself, so a Redis that is down at start-up only
    /// triggers the failure policy.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] when the URL is invalid (the sentence never repeats the URL,
    /// which may hold a password).
    #[allow(clippy::unused_async)]
    pub async fn standalone(self, url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(|e| bad_url(e, "Redis URL"))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.deadline.max(Duration::from_millis(100))))
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| bad_url(e, "Redis URL"))?;
        Ok(self.finish(Conn::Single(manager)))
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] when a node URL is invalid, [`StoreError::Unavailable`] when no
    /// node can be reached to read the slot map.
    pub async fn cluster(self, nodes: &[&str]) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().copied())
            .connection_timeout(self.deadline.max(Duration::from_millis(100)))
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(|e| bad_url(e, "Redis Cluster node URL"))?;
        let conn = client.get_async_connection().await.map_err(redis_failure)?;
        Ok(self.finish(Conn::Cluster(conn)))
    }

    fn finish(self, conn: Conn) -> RedisStore {
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
        RedisStore {
            policies: Arc::default(),
            failover: Failover::new(self.on_failure, &clock),
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
                negative: self
                    .negative_cache
                    .then(|| NegativeCache::new(self.deadline)),
                redis_decisions: Default::default(),
                negative_hits: Default::default(),
                degraded: Default::default(),
                errors: Default::default(),
            }),
        }
    }
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
