use std::fmt;

use tower_layer::Layer;

use super::Fallback;
use crate::policy::AllPolicies;
use crate::rate_limit::{RateLimit, RateLimitLayer};

/// A [`RateLimitLayer`] whose limited requests go to a fallback service instead of getting
/// a 429; made by [`RateLimitLayer::with_fallback`].
pub struct FallbackLayer<F, K, Co, St, R = AllPolicies> {
    limit: RateLimitLayer<K, Co, St, R>,
    fallback: F,
}

impl<K, Co, St, R> RateLimitLayer<K, Co, St, R> {
    /// Sends requests that would get a 429 to `fallback` instead: a tower service (an axum
    /// handler via `Handler::with_state`) that answers cheaply, for example from a stale
    /// cache. Its responses get the rate-limit headers and `RateLimit-Degraded: "<policy>"`
    /// ([`RATELIMIT_DEGRADED`](crate::report::RATELIMIT_DEGRADED)), and each one increments
    /// the `metrics` counter `ratekeeper_degraded_total` (labels `policy` and
    /// `reason="limited"`). When a shared store cannot decide and its failure policy is
    /// [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade), the fallback
    /// answers too, marked `RateLimit-Degraded: "store-unavailable"` (label
    /// `reason="store_unavailable"`; no rate-limit headers). The handler can read the decision
    /// with [`Info`](crate::info::Info) (`is_limited()` is true).
    ///
    /// The fallback answers every limited request the layer sees, so wrap only the route it
    /// degrades (in axum: `get(handler).route_layer(layer)` on that route, not
    /// `Router::layer`, or a limited client's `404`s and `405`s get the degraded body too).
    ///
    /// In [`Mode::Delay`](crate::rate_limit::Mode::Delay) the fallback answers the requests
    /// that could not be admitted within `max_wait`; in
    /// [`Mode::Shadow`](crate::rate_limit::Mode::Shadow) it is never used. "Cost can never
    /// fit" denials go to the fallback too. See the [module docs](crate::fallback) for an
    /// example.
    pub fn with_fallback<F>(self, fallback: F) -> FallbackLayer<F, K, Co, St, R> {
        FallbackLayer {
            limit: self,
            fallback,
        }
    }
}

impl<F: Clone, K, Co, St, R> Clone for FallbackLayer<F, K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<F, K, Co, St, R> fmt::Debug for FallbackLayer<F, K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackLayer")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<S, F: Clone, K, Co, St, R> Layer<S> for FallbackLayer<F, K, Co, St, R> {
    type Service = RateLimit<Fallback<S, F>, K, Co, St, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::degrading(
            Fallback::new(inner, self.fallback.clone()),
            self.limit.limiter(),
        )
    }
}
