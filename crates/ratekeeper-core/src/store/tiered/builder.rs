//! [`TieredStoreBuilder`]: the lease size, period and TTL, checked when the store is built.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use super::inner::Inner;
use super::{TieredStore, nanos};
use crate::store::redis::RedisStore;

/// A [`TieredStoreBuilder`] setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TieredConfigError {
    /// The lease period is zero.
    #[error("the lease period must be longer than zero")]
    ZeroPeriod,
    /// The lease TTL is shorter than the lease period (leases would expire before the rate
    /// that sized them is measured again).
    #[error(
        "the lease TTL ({}) must be at least the lease period ({})",
        crate::seconds::seconds(*ttl),
        crate::seconds::seconds(*period)
    )]
    TtlBelowPeriod {
        /// The TTL given.
        ttl: Duration,
        /// The period given.
        period: Duration,
    },
}

/// Builds a [`TieredStore`] over a [`RedisStore`]: lease size, lease period, lease TTL.
#[derive(Debug, Clone)]
pub struct TieredStoreBuilder {
    max_lease: NonZeroU32,
    period: Duration,
    ttl: Duration,
}

impl Default for TieredStoreBuilder {
    fn default() -> Self {
        Self {
            max_lease: NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN),
            period: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
        }
    }
}

impl TieredStoreBuilder {
    /// The most units an instance holds for one (policy, client key): `N_max` in the
    /// over-admission bound `I * N_max` (default 100).
    pub fn max_lease(mut self, max_lease: NonZeroU32) -> Self {
        self.max_lease = max_lease;
        self
    }

    /// The period over which the local rate is measured (default 100 ms): a lease holds the
    /// units asked for in one period (at most [`max_lease`](Self::max_lease)), so a hot key
    /// goes to Redis about once per period per instance. It is also the period of the
    /// background sweeper that gives expired units back.
    pub fn lease_period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// How long leased units may stay unspent before they go back to Redis (default 1 s):
    /// they are back within `lease_ttl + lease_period` even if no request of the key comes
    /// again, and a denial is remembered at most that long.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The tiered store over `redis` (whose deadline, failure policy, breaker and clock it
    /// uses). Register policies on the tiered store (or a clone of it), not on `redis`.
    ///
    /// # Errors
    ///
    /// [`TieredConfigError`] for a zero lease period or a TTL shorter than the period.
    pub fn build(self, redis: RedisStore) -> Result<TieredStore, TieredConfigError> {
        if self.period.is_zero() {
            return Err(TieredConfigError::ZeroPeriod);
        }
        if self.ttl < self.period {
            return Err(TieredConfigError::TtlBelowPeriod {
                ttl: self.ttl,
                period: self.period,
            });
        }
        let clock = redis.decision_clock();
        let inner = Arc::new(Inner {
            leases: DashMap::default(),
            max_lease: u64::from(self.max_lease.get()),
            period: nanos(self.period),
            ttl: nanos(self.ttl),
            clock,
            generation: AtomicU64::new(1),
            epoch: AtomicU64::new(0),
            visits: Mutex::default(),
            sweeper: AtomicBool::new(false),
            decisions: AtomicU64::new(0),
            local: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            prefetches: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            returning: AtomicUsize::new(0),
            returns_done: tokio::sync::Notify::new(),
            tiers: Mutex::default(),
        });
        // Resets published by other instances drop this instance's leases of the key.
        let weak = Arc::downgrade(&inner);
        redis.on_invalidate(Box::new(move |what| {
            if let Some(inner) = weak.upgrade() {
                inner.invalidate(what);
            }
        }));
        Ok(TieredStore {
            redis: Arc::new(redis),
            policies: Vec::new(),
            inner,
        })
    }
}
