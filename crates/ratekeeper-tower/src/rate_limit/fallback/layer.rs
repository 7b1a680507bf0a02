//! [`FallbackLayer`]: the rate limit with a degraded-response [`Fallback`] behind it, made
//! by [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback).

use std::fmt;

use tower_layer::Layer;

use super::service::Fallback;
use crate::policy::AllPolicies;
use crate::rate_limit::layer::RateLimitLayer;
use crate::rate_limit::service::RateLimit;

/// A [`RateLimitLayer`](crate::RateLimitLayer) whose limited requests go to a fallback service instead of getting
/// a 429; made by [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback). It puts the rate limit in front and a
/// [`Fallback`] behind it, which sends the requests
/// the rate limit denied (and, under the store failure policy
/// [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade), the requests it
/// could not decide) to the fallback service and every other request to the inner service.
/// Fallback responses carry `RateLimit-Degraded: "<policy>"`
/// ([`RATELIMIT_DEGRADED`](crate::headers::RATELIMIT_DEGRADED)) and are counted in
/// `ratekeeper_degraded_total{policy, reason}`.
///
/// # Where to put it
///
/// Around the one service whose answer the fallback degrades, and nothing else. The fallback
/// answers *every* limited request that passes through the layer, whatever its method or
/// path, so a layer around a whole router would also answer a limited client's `404`s,
/// `405`s and other routes with the degraded body. In axum, put it on the method router of
/// that route: `Router::new().route("/prices", get(prices).route_layer(limit))` limits and
/// degrades `GET` (and `HEAD`) `/prices` only, while `POST /prices` stays a `405` and unknown
/// paths stay `404`s; `Router::layer` and `Router::route_layer` would wrap every route. In
/// plain tower, wrap only that route's service, below your routing.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use std::num::NonZeroU32;
/// use axum::http::{Request, Response, StatusCode};
/// use ratekeeper_core::Quota;
/// use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_minute(NonZeroU32::new(1).unwrap()))
///     .key(GlobalKey)
///     .build()?
///     .with_fallback(service_fn(|_req: Request<()>| async {
///         Ok::<_, Infallible>(Response::new("cached".to_owned()))
///     }));
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new("fresh".to_owned())) });
/// assert!(svc.clone().oneshot(Request::new(())).await?.headers().get("ratelimit-degraded").is_none());
/// let cached = svc.clone().oneshot(Request::new(())).await?;
/// assert_eq!(cached.status(), StatusCode::OK);
/// assert_eq!(cached.headers()["ratelimit-degraded"], "\"default\"");
/// # Ok(())
/// # }
/// ```
pub struct FallbackLayer<F, K, Co, St, R = AllPolicies> {
    limit: RateLimitLayer<K, Co, St, R>,
    fallback: F,
}

impl<K, Co, St, R> RateLimitLayer<K, Co, St, R> {
    /// Sends requests that would get a 429 to `fallback` instead: a tower service (an axum
    /// handler via `Handler::with_state`) that answers cheaply, for example from a stale
    /// cache. Its responses get the rate-limit headers and `RateLimit-Degraded: "<policy>"`
    /// ([`RATELIMIT_DEGRADED`](crate::headers::RATELIMIT_DEGRADED)), and each one increments
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
    /// fit" denials go to the fallback too. See [`FallbackLayer`] for where to put it and an
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
        RateLimit::from_limiter(
            Fallback::new(inner, self.fallback.clone()),
            self.limit.limiter(),
        )
    }
}
