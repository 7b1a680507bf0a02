//! [`FallbackLayer`]: the rate limit with a degraded-response
//! [`Fallback`](crate::fallback::Fallback) behind it, made by
//! [`RateLimitLayer::with_fallback`].

use std::fmt;

use tower_layer::Layer;

use super::layer::RateLimitLayer;
use super::service::RateLimit;
use crate::fallback::Fallback;
use crate::policy::AllPolicies;

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
        RateLimit::with_fallback(
            Fallback::new(inner, self.fallback.clone()),
            self.limit.limiter(),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Future, Ready, ready};
    use std::num::NonZeroU32;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use http::{Request, Response};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use ratekeeper_core::Quota;
    use tower::service_fn;
    use tower_layer::Layer;
    use tower_service::Service;

    use crate::report::RATELIMIT_DEGRADED;
    use crate::{GlobalKey, RateLimitLayer};

    /// `ratekeeper_degraded_total{policy="default"}` from a debugging recorder.
    fn degraded(snapshotter: &Snapshotter) -> Option<DebugValue> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| {
                let key = key.key();
                key.name() == "ratekeeper_degraded_total"
                    && key
                        .labels()
                        .any(|l| l.key() == "policy" && l.value() == "default")
            })
            .map(|(.., value)| value)
    }

    fn answer(
        text: &'static str,
    ) -> impl Fn(Request<()>) -> Ready<Result<Response<String>, Infallible>> + Clone {
        move |_req| ready(Ok(Response::new(text.to_owned())))
    }

    #[test]
    fn degraded_responses_are_marked_and_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let layer = RateLimitLayer::builder()
            .quota(Quota::per_minute(NonZeroU32::MIN))
            .key(GlobalKey)
            .build()
            .unwrap()
            .with_fallback(service_fn(answer("cached")));
        let mut svc = layer.layer(service_fn(answer("fresh")));
        metrics::with_local_recorder(&recorder, || {
            for (want, degraded) in [("fresh", false), ("cached", true), ("cached", true)] {
                let future = pin!(svc.call(Request::new(())));
                let mut cx = Context::from_waker(Waker::noop());
                let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
                    panic!("ready services answer at once");
                };
                assert_eq!(res.status(), 200);
                assert_eq!(
                    res.headers().get(&RATELIMIT_DEGRADED).is_some(),
                    degraded,
                    "{want}"
                );
                assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
                let body = res.into_body();
                let mut body = pin!(body);
                let Poll::Ready(Some(Ok(frame))) =
                    http_body::Body::poll_frame(body.as_mut(), &mut cx)
                else {
                    panic!("a full body");
                };
                assert_eq!(frame.into_data().unwrap(), want);
            }
        });
        assert_eq!(degraded(&snapshotter), Some(DebugValue::Counter(2)));
    }
}
