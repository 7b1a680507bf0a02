//! [`Inner`]: what the rate limit calls behind it, the inner service alone or the inner
//! service with a degraded-response fallback ([`Fallback`](super::Fallback)), so that the
//! limiter hands a refused request to the fallback in a typed call, never through the
//! request.

use std::future::Future;
use std::task::{Context, Poll};

use tower_service::Service;

use super::degrade::Degrade;

/// What a [`RateLimit`](crate::RateLimit) calls: every tower service (no fallback), or a
/// [`Fallback`](super::Fallback) (made by
/// [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)). Its methods are
/// the crate's own.
pub trait Inner<Req> {
    /// The response.
    type Response;
    /// The error.
    type Error;
    /// The response future.
    type Future: Future<Output = Result<Self::Response, Self::Error>>;

    /// Whether refused requests go to a fallback (known from the type, so the limiter's
    /// ticket records it without a flag on the service).
    #[doc(hidden)]
    const FALLBACK: bool;

    /// Readiness of the inner service.
    #[doc(hidden)]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>>;

    /// Calls the inner service with a request the rate limit passed.
    #[doc(hidden)]
    fn pass(&mut self, req: Req) -> Self::Future;

    /// Hands a request the rate limit refused (or could not decide) to the fallback. Without
    /// a fallback only a store that could not decide under
    /// [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade) comes here
    /// (a denial is answered), and the request goes on to the inner service (fail open).
    #[doc(hidden)]
    fn degrade(&mut self, req: Req, degrade: Degrade) -> Self::Future;
}

impl<S, Req> Inner<Req> for S
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    const FALLBACK: bool = false;

    #[inline(always)]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Service::poll_ready(self, cx)
    }

    #[inline(always)]
    fn pass(&mut self, req: Req) -> S::Future {
        self.call(req)
    }

    fn degrade(&mut self, req: Req, _degrade: Degrade) -> S::Future {
        self.call(req)
    }
}
