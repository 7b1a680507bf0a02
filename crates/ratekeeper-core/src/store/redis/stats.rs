//! The counters a Redis store keeps ([`RedisStats`]).

/// Counters of one [`RedisStore`](super::RedisStore) (also exported through the
/// [`metrics`] crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions Redis made.
    pub redis_decisions: u64,
    /// Requests the negative cache denied without a round trip.
    pub negative_cache_hits: u64,
    /// Decisions made by the failure policy (timeout, error, stale call or open breaker).
    pub degraded: u64,
    /// Redis errors and timeouts seen (a subset of `degraded`: the rest were skipped by the
    /// open circuit breaker), refund failures included.
    pub errors: u64,
}
