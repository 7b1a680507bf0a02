use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::{ConcurrencyBody, ResponseFuture};
use super::held::HeldFuture;
use super::limit::{Answer, Limit};
use super::local::Local;
use crate::key::{KeyExtractor, PeerIp};
use crate::report::grpc_content_type;

/// The keyed concurrency-limiting service (see the [module docs](super)). Decides in `call`;
/// `poll_ready` only forwards.
///
/// `L` counts the slots: [`Local`] (this process, the default), [`Shared`](super::Shared)
/// (a store shared by every instance; the ready inner service goes with the request while
/// the store decides, a clone takes its place) or [`Adaptive`](crate::adaptive::Adaptive).
pub struct ConcurrencyLimit<S, K = PeerIp, L = Local> {
    inner: S,
    pub(crate) key: Arc<K>,
    pub(crate) limit: Arc<L>,
}

impl<S, K, L> ConcurrencyLimit<S, K, L> {
    pub(crate) fn new(inner: S, key: Arc<K>, limit: Arc<L>) -> Self {
        Self { inner, key, limit }
    }

    define_inner_service_accessors!();
}

impl<S: Clone, K, L> Clone for ConcurrencyLimit<S, K, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: Arc::clone(&self.key),
            limit: Arc::clone(&self.limit),
        }
    }
}

impl<S: fmt::Debug, K, L: fmt::Debug> fmt::Debug for ConcurrencyLimit<S, K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<S, K, L, ReqB, ResB> Service<Request<ReqB>> for ConcurrencyLimit<S, K, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: KeyExtractor,
    L: Limit,
{
    type Response = Response<ConcurrencyBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, Request<ReqB>>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let key = match self.key.extract(&req) {
            Ok(key) => key,
            Err(err) => {
                let grpc = if self.limit.serves_grpc() {
                    grpc_content_type(req.version(), req.headers())
                } else {
                    None
                };
                let describe = self.limit.describe();
                return ResponseFuture::held(HeldFuture::key_error(&err, grpc, describe));
            }
        };
        match self.limit.acquire(&key, &mut req).0 {
            Answer::Admitted(admitted) => {
                ResponseFuture::held(HeldFuture::called(self.inner.call(req), admitted))
            }
            Answer::Refused(status, headers, body) => {
                ResponseFuture::held(HeldFuture::answered(status, headers, body))
            }
            Answer::Pending(pending) => {
                // The service that was made ready goes with this request; a clone takes its
                // place.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::acquiring(pending.acquire, inner, req, pending.decide)
            }
        }
    }
}
