use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::FallbackFuture;
use crate::rate_limit::degrade::Degrade;
use crate::rate_limit::inner::Inner;

/// The inner service and the degraded-response fallback behind a
/// [`RateLimit`](crate::RateLimit) (built by the layer of
/// [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)): the rate limit
/// calls the inner service with the requests it passes and hands the fallback the ones it
/// refused. Not a service of its own: only the rate limit in front of it routes requests.
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

impl<S, F, ReqB, ResB> Inner<Request<ReqB>> for Fallback<S, F>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    F: Service<Request<ReqB>, Response = Response<ResB>, Error = S::Error> + Clone,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = FallbackFuture<S::Future, F, F::Future, Request<ReqB>>;

    const FALLBACK: bool = true;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn pass(&mut self, req: Request<ReqB>) -> Self::Future {
        FallbackFuture::inner(self.inner.call(req))
    }

    fn degrade(&mut self, req: Request<ReqB>, degrade: Degrade) -> Self::Future {
        let Degrade { policy, reason } = degrade;
        metrics::counter!(
            crate::metrics::DEGRADED_TOTAL,
            "policy" => policy.to_string(),
            "reason" => reason,
        )
        .increment(1);
        tracing::debug!(policy = &*policy, reason, "answering with the fallback");
        FallbackFuture::degraded(self.fallback.clone(), req, policy)
    }
}
