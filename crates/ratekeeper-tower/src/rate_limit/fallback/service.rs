use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::store::FailurePolicy;
use tower_service::Service;

use super::FallbackFuture;
use crate::degraded::{Degrade, StoreDegraded};

/// Routes requests the rate limit denied to the fallback service, the others to the inner
/// service. Built by the layer of
/// [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback); it sits between
/// [`RateLimit`](crate::RateLimit) and the inner service.
#[derive(Clone)]
pub struct Fallback<S, F> {
    inner: S,
    fallback: F,
}

impl<S, F> Fallback<S, F> {
    pub(crate) fn new(inner: S, fallback: F) -> Self {
        Self { inner, fallback }
    }

    define_inner_service_accessors!();
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
            req.extensions()
                .get::<StoreDegraded>()
                .filter(|d| d.action == FailurePolicy::Degrade)
                .map(|_| Degrade::store_unavailable())
        });
        match degrade {
            Some(Degrade { policy, reason }) => {
                metrics::counter!(
                    "ratekeeper_degraded_total",
                    "policy" => policy.to_string(),
                    "reason" => reason,
                )
                .increment(1);
                tracing::debug!(policy = &*policy, reason, "answering with the fallback");
                FallbackFuture::degraded(self.fallback.clone(), req, policy)
            }
            None => FallbackFuture::inner(self.inner.call(req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Future, Ready, ready};
    use std::pin::pin;
    use std::task::Waker;

    use tower::service_fn;

    use super::*;
    use crate::report::RATELIMIT_DEGRADED;

    fn answer(
        text: &'static str,
    ) -> impl Fn(Request<()>) -> Ready<Result<Response<String>, Infallible>> + Clone {
        move |_req| ready(Ok(Response::new(text.to_owned())))
    }

    #[test]
    fn store_degraded_requests_go_to_the_fallback_only_under_degrade() {
        let mut svc = Fallback::new(service_fn(answer("fresh")), service_fn(answer("cached")));
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
