use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use ratekeeper_core::Key;
use ratekeeper_core::store::slots::SharedSlots;
use tower_layer::Layer;

use super::answer::NAME;
use super::local::Local;
use super::service::ConcurrencyLimit;
use super::shared::{Shared, State};
use crate::key::PeerIp;
use crate::report::{DEFAULT_UNAVAILABLE_RETRY_AFTER, HeaderStyle, Reporter, Unavailable};

/// A [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) that limits
/// concurrent requests per key (see the [module docs](super)). All services it builds, and
/// their clones, share one limit.
///
/// `K` is the key extractor, `L` what counts the slots (a [`Limit`](super::Limit)):
/// [`Local`] (this process's memory, the default, made by [`new`](Self::new)),
/// [`Shared`] (a store shared by every instance, made by [`shared`](Self::shared)) or
/// [`Adaptive`](crate::adaptive::Adaptive) (a limit found from latency, made by
/// [`adaptive`](Self::adaptive)).
pub struct ConcurrencyLimitLayer<K = PeerIp, L = Local> {
    pub(crate) key: Arc<K>,
    pub(crate) limit: Arc<L>,
}

impl ConcurrencyLimitLayer {
    /// At most `max` requests in flight per client IP (IPv6 by /64), `X-RateLimit-*` headers.
    pub fn new(max: NonZeroU32) -> Self {
        let reporter = Reporter::concurrency(NAME, max.get(), HeaderStyle::default());
        Self::from_parts(PeerIp::new(), Local::new(max.get(), reporter))
    }
}

impl<K, L> ConcurrencyLimitLayer<K, L> {
    pub(crate) fn from_parts(key: K, limit: L) -> Self {
        Self {
            key: Arc::new(key),
            limit: Arc::new(limit),
        }
    }

    /// Sets the key extractor (the limit's state is kept: call this before using the layer).
    pub fn key<K2>(self, key: K2) -> ConcurrencyLimitLayer<K2, L> {
        ConcurrencyLimitLayer {
            key: Arc::new(key),
            limit: self.limit,
        }
    }
}

impl<K> ConcurrencyLimitLayer<K, Local> {
    fn with_reporter(self, reporter: Reporter) -> Self {
        Self {
            key: self.key,
            limit: Arc::new(self.limit.with_reporter(reporter)),
        }
    }

    /// Sets the header style (default [`HeaderStyle::XRateLimit`]).
    pub fn headers(self, style: HeaderStyle) -> Self {
        let mut reporter = Reporter::concurrency(NAME, self.limit.max(), style);
        reporter.grpc = self.limit.reporter.grpc;
        self.with_reporter(reporter)
    }

    /// Whether this layer serves gRPC: a refused gRPC call then gets a trailers-only gRPC
    /// answer (`grpc-status: 8`, `RESOURCE_EXHAUSTED`) instead of a 429. Default `false`; see
    /// [`RateLimitBuilder::grpc`](crate::RateLimitBuilder::grpc) for what counts as a gRPC
    /// call. Kept by [`shared`](Self::shared).
    pub fn grpc(self, on: bool) -> Self {
        let mut reporter = (*self.limit.reporter).clone();
        reporter.grpc = on;
        self.with_reporter(reporter)
    }

    /// Requests of `key` in flight now (admitted, body not ended).
    pub fn in_flight(&self, key: &Key) -> u32 {
        self.limit.in_flight(key)
    }

    /// Counts the slots in a shared store instead of this process's memory, so the limit
    /// holds across every instance that shares `slots` (with the `redis` feature of
    /// `ratekeeper-core`: `RedisStore::slots`, whose leases free a dead instance's slots on
    /// their own). Keeps the key extractor, `max`, header style and gRPC setting.
    ///
    /// The shared layer decides after one round trip, in the response future; a store error
    /// is answered by the store's failure policy (see [`Shared`]).
    pub fn shared(self, slots: impl SharedSlots) -> ConcurrencyLimitLayer<K, Shared> {
        ConcurrencyLimitLayer {
            key: self.key,
            limit: Arc::new(Shared {
                state: Arc::new(State {
                    max: self.limit.max(),
                    slots: Arc::new(slots),
                    reporter: Arc::clone(&self.limit.reporter),
                    unavailable: Unavailable::concurrency(DEFAULT_UNAVAILABLE_RETRY_AFTER),
                }),
            }),
        }
    }
}

impl<K> ConcurrencyLimitLayer<K, Shared> {
    /// How long a client should wait before it retries after the `503 Service Unavailable`
    /// answered when the slot store cannot decide and fails closed
    /// ([`FailurePolicy::Deny`](ratekeeper_core::store::FailurePolicy::Deny)).
    ///
    /// The 503 carries it as `Retry-After` in whole seconds, rounded up and at least 1, with
    /// `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body of type
    /// [`TEMPORARY_REDUCED_CAPACITY_TYPE`](crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE)
    /// whose `detail` names the same seconds; a gRPC call (with
    /// [`grpc`](ConcurrencyLimitLayer::grpc)) gets `UNAVAILABLE` with the same delay as
    /// `retry-after` metadata and a `google.rpc.RetryInfo`. Default 1 s: the Redis store's
    /// default circuit-breaker open period (500 ms) rounded up; with a longer breaker period,
    /// set the same duration here.
    pub fn unavailable_retry_after(self, retry_after: Duration) -> Self {
        let state = &self.limit.state;
        ConcurrencyLimitLayer {
            key: self.key,
            limit: Arc::new(Shared {
                state: Arc::new(State {
                    max: state.max,
                    slots: Arc::clone(&state.slots),
                    reporter: Arc::clone(&state.reporter),
                    unavailable: Unavailable::concurrency(retry_after),
                }),
            }),
        }
    }
}

impl<K, L> Clone for ConcurrencyLimitLayer<K, L> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            limit: Arc::clone(&self.limit),
        }
    }
}

impl<K, L: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<S, K, L> Layer<S> for ConcurrencyLimitLayer<K, L> {
    type Service = ConcurrencyLimit<S, K, L>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, Arc::clone(&self.key), Arc::clone(&self.limit))
    }
}

impl<S, K, L> ConcurrencyLimit<S, K, L> {
    /// A layer that builds services sharing this service's limit.
    pub fn layer(&self) -> ConcurrencyLimitLayer<K, L> {
        ConcurrencyLimitLayer {
            key: Arc::clone(&self.key),
            limit: Arc::clone(&self.limit),
        }
    }
}
