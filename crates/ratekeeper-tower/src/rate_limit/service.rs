use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::Key;
use ratekeeper_core::store::Store;
use tower_service::Service;

use super::future::{ResponseFuture, dispatch};
use super::inner::Inner;
use super::limiter::Limiter;
use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::key::{KeyExtractor, PeerIp};
use crate::policy::{AllPolicies, Resolve};

/// The rate-limiting service: decides in `call`, answers a denied request with a 429 (a gRPC
/// call with `RESOURCE_EXHAUSTED`, see [`report`](crate::report#grpc)) without
/// calling the inner service, and adds rate-limit headers to the inner service's responses.
///
/// `poll_ready` only forwards to the inner service: readiness never consumes quota.
pub struct RateLimit<
    S,
    K = PeerIp,
    Co = u64,
    St = ratekeeper_core::store::MemoryStore<Key>,
    R = AllPolicies,
> {
    inner: S,
    pub(super) limiter: Arc<Limiter<K, Co, St, R>>,
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R> {
    pub(crate) fn from_limiter(inner: S, limiter: Arc<Limiter<K, Co, St, R>>) -> Self {
        Self { inner, limiter }
    }

    define_inner_service_accessors!();
}

impl<S: Clone, K, Co, St, R> Clone for RateLimit<S, K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: fmt::Debug, K, Co, St, R> fmt::Debug for RateLimit<S, K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policies", self.limiter.names())
            .finish()
    }
}

impl<S, K, Co, St, R, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, Co, St, R>
where
    S: Inner<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: KeyExtractor,
    Co: Cost,
    St: Store<Key>,
    R: Resolve,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, Request<ReqB>, St::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Inner::poll_ready(&mut self.inner, cx)
    }

    // Out of line on purpose: inlined into a caller (axum's `MapIntoResponse`), the future
    // was built on the stack and then copied into place, some 100 instructions per request.
    #[inline(never)]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let limiter = &self.limiter;
        // Whether denials go to a fallback is the inner service's type's to say.
        let fallback = S::FALLBACK;
        // The memory store answers at once: the verdict is taken on the borrowed service and
        // limiter.
        dispatch(
            &mut self.inner,
            req,
            limiter,
            |req| limiter.prepare(req, fallback),
            |ticket| limiter.check(&ticket.charges),
        )
    }
}
