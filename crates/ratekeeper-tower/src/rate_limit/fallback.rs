//! Degraded-response fallback: a service that answers limited requests instead of a 429.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{RateLimit, RateLimitLayer};
use ratekeeper_core::store::{FailurePolicy, StoreDegraded};

use crate::policy::AllPolicies;
use crate::report::RATELIMIT_DEGRADED;

/// Marks a request that the rate limit denied, so that [`Fallback`] answers it.
#[derive(Debug, Clone)]
pub(crate) struct Degrade {
    policy: Arc<str>,
    reason: &'static str,
}

impl Degrade {
    pub(crate) fn new(policy: &str) -> Self {
        Self {
            policy: Arc::from(policy),
            reason: "limited",
        }
    }
}

/// The `RateLimit-Degraded` value when the store could not decide.
const STORE_UNAVAILABLE: &str = "store-unavailable";

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
    /// ([`RATELIMIT_DEGRADED`]), and each one increments the `metrics` counter
    /// `ratekeeper_degraded_total` (labels `policy` and `reason="limited"`). When a shared
    /// store cannot decide and its failure policy is
    /// [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade), the fallback
    /// answers too, marked `RateLimit-Degraded: "store-unavailable"` (label
    /// `reason="store_unavailable"`; no rate-limit headers). The handler can read the decision with
    /// [`Info`](crate::info::Info) (`is_limited()` is true).
    ///
    /// In [`Mode::Delay`](super::Mode::Delay) the fallback answers the requests that could not
    /// be admitted within `max_wait`; in [`Mode::Shadow`](super::Mode::Shadow) it is never
    /// used. "Cost can never fit" denials go to the fallback too.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::num::NonZeroU32;
    /// use http::{Request, Response, StatusCode};
    /// use ratekeeper_core::Quota;
    /// use ratekeeper_tower::{GlobalKey, RateLimitLayer};
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
    /// let fresh = svc.clone().oneshot(Request::new(())).await?;
    /// assert!(fresh.headers().get("ratelimit-degraded").is_none());
    /// let cached = svc.clone().oneshot(Request::new(())).await?;
    /// assert_eq!(cached.status(), StatusCode::OK);
    /// assert_eq!(cached.headers()["ratelimit-degraded"], "\"default\"");
    /// assert_eq!(cached.headers()["x-ratelimit-remaining"], "0");
    /// # Ok(())
    /// # }
    /// ```
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
        let inner = Fallback {
            inner,
            fallback: self.fallback.clone(),
        };
        RateLimit::degrading(inner, self.limit.shared())
    }
}

/// Routes requests the rate limit denied to the fallback service, the others to the inner
/// service. Built by [`FallbackLayer`]; it sits between [`RateLimit`] and the inner service.
#[derive(Clone)]
pub struct Fallback<S, F> {
    inner: S,
    fallback: F,
}

impl<S, F> Fallback<S, F> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, F> fmt::Debug for Fallback<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, F, ReqB, ResB> Service<Request<ReqB>> for Fallback<S, F>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    F: Service<Request<ReqB>, Response = Response<ResB>, Error = S::Error> + Clone,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = FallbackFuture<S::Future, F, F::Future, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let degrade = req.extensions_mut().remove::<Degrade>().or_else(|| {
            // The store could not decide and its failure policy is `Degrade`.
            req.extensions()
                .get::<StoreDegraded>()
                .filter(|d| d.action == FailurePolicy::Degrade)
                .map(|_| Degrade {
                    policy: Arc::from(STORE_UNAVAILABLE),
                    reason: "store_unavailable",
                })
        });
        match degrade {
            Some(Degrade { policy, reason }) => {
                metrics::counter!(
                    "ratekeeper_degraded_total",
                    "policy" => policy.to_string(),
                    "reason" => reason,
                )
                .increment(1);
                tracing::info!(policy = &*policy, reason, "answering with the fallback");
                FallbackFuture {
                    kind: Kind::Readying {
                        fallback: self.fallback.clone(),
                        req: Some(req),
                        policy,
                    },
                }
            }
            None => FallbackFuture {
                kind: Kind::Inner {
                    future: self.inner.call(req),
                },
            },
        }
    }
}

pin_project! {
    /// Response future of [`Fallback`].
    pub struct FallbackFuture<Fu, F, FFu, Req> {
        #[pin]
        kind: Kind<Fu, F, FFu, Req>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<Fu, F, FFu, Req> {
        Inner { #[pin] future: Fu },
        Readying { fallback: F, req: Option<Req>, policy: Arc<str> },
        Degraded { #[pin] future: FFu, policy: Arc<str> },
    }
}

impl<Fu, F, ReqB, ResB, E> Future for FallbackFuture<Fu, F, F::Future, Request<ReqB>>
where
    Fu: Future<Output = Result<Response<ResB>, E>>,
    F: Service<Request<ReqB>, Response = Response<ResB>, Error = E>,
{
    type Output = Result<Response<ResB>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.kind.as_mut().project() {
                KindProj::Inner { future } => return future.poll(cx),
                KindProj::Readying {
                    fallback,
                    req,
                    policy,
                } => {
                    ready!(fallback.poll_ready(cx))?;
                    let Some(req) = req.take() else {
                        // Unreachable: the request is taken once, and this state is left in
                        // the same poll.
                        tracing::error!("fallback future polled after its request was sent");
                        return Poll::Pending;
                    };
                    let next = Kind::Degraded {
                        future: fallback.call(req),
                        policy: Arc::clone(policy),
                    };
                    this.kind.set(next);
                }
                KindProj::Degraded { future, policy } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Ok(value) = HeaderValue::try_from(format!("\"{policy}\"")) {
                        res.headers_mut().insert(RATELIMIT_DEGRADED.clone(), value);
                    }
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Future, Ready, ready};
    use std::num::NonZeroU32;
    use std::pin::pin;
    use std::task::Waker;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use ratekeeper_core::Quota;
    use tower::service_fn;

    use super::*;
    use crate::GlobalKey;

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

    #[test]
    fn store_degraded_requests_go_to_the_fallback_only_under_degrade() {
        let mut svc = Fallback {
            inner: service_fn(answer("fresh")),
            fallback: service_fn(answer("cached")),
        };
        for (action, want, marker) in [
            (
                FailurePolicy::Degrade,
                "cached",
                Some("\"store-unavailable\""),
            ),
            (FailurePolicy::Allow, "fresh", None),
        ] {
            let mut req = Request::new(());
            req.extensions_mut().insert(StoreDegraded { action });
            let future = pin!(svc.call(req));
            let mut cx = Context::from_waker(Waker::noop());
            let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
                panic!("ready services answer at once");
            };
            assert_eq!(res.body(), want);
            assert_eq!(
                res.headers()
                    .get(&RATELIMIT_DEGRADED)
                    .map(|v| v.to_str().unwrap()),
                marker
            );
        }
    }
}
