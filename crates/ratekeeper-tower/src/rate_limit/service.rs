use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Checked, Store};
use tower_service::Service;

use super::future::{Pending, ResponseFuture};
use super::limiter::{Answer, Limiter, Prepared, Reported, Verdict, store_failed};
use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::key::{KeyExtractor, PeerIp};
use crate::policy::{AllPolicies, Applied, Resolve};

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
    /// The inner service is a [`Fallback`](crate::fallback::Fallback): denied requests go to
    /// it.
    degrade: bool,
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R> {
    pub(crate) fn from_limiter(inner: S, limiter: Arc<Limiter<K, Co, St, R>>) -> Self {
        Self {
            inner,
            limiter,
            degrade: false,
        }
    }

    pub(crate) fn degrading(inner: S, limiter: Arc<Limiter<K, Co, St, R>>) -> Self {
        Self {
            inner,
            limiter,
            degrade: true,
        }
    }

    define_inner_service_accessors!();
}

impl<S: Clone, K, Co, St, R> Clone for RateLimit<S, K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            degrade: self.degrade,
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
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
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
        self.inner.poll_ready(cx)
    }

    // Out of line on purpose: inlined into a caller (axum's `MapIntoResponse`), the future
    // was built on the stack and then copied into place, some 100 instructions per request.
    #[inline(never)]
    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let limiter = &*self.limiter;
        let applied = match limiter.prepare(&req) {
            Prepared::Charge(applied) => applied,
            Prepared::Exempt => return ResponseFuture::unchecked(self.inner.call(req)),
            Prepared::Failed(err) => {
                return ResponseFuture::answered(
                    Answer::key_error(&err)
                        .for_request(limiter.reporter.grpc_call(req.version(), req.headers())),
                );
            }
        };
        let pk = limiter.pk(&applied);
        match limiter.check(&applied) {
            Checked::Ready(Ok(decisions)) => {
                let mut deadline = None;
                let verdict = limiter.verdict(
                    &applied,
                    pk.as_deref(),
                    &decisions,
                    &mut deadline,
                    self.degrade,
                    req.extensions_mut(),
                );
                match verdict {
                    Verdict::Pass => ResponseFuture::called(
                        self.inner.call(req),
                        self.limiter.clone(),
                        Reported {
                            decisions,
                            applied,
                            pk,
                        },
                    ),
                    Verdict::Answer(answer) => {
                        let grpc = limiter.reporter.grpc_call(req.version(), req.headers());
                        ResponseFuture::answered(answer.for_request(grpc))
                    }
                    verdict @ (Verdict::Wait | Verdict::Retry(_)) => {
                        let mut pending = self.hold(req, applied, pk);
                        pending.deadline = deadline;
                        ResponseFuture::after(pending, verdict, decisions)
                    }
                }
            }
            Checked::Ready(Err(err)) => match store_failed(&err, req.extensions_mut()) {
                None => ResponseFuture::unchecked(self.inner.call(req)),
                Some(answer) => {
                    let grpc = limiter.reporter.grpc_call(req.version(), req.headers());
                    ResponseFuture::answered(answer.for_request(grpc))
                }
            },
            Checked::Pending(check) => ResponseFuture::checking(check, self.hold(req, applied, pk)),
        }
    }
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R>
where
    S: Clone,
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    /// Hands the request, with the ready inner service, to the response future; this service
    /// keeps a fresh clone (see the tower-service docs, "Be careful when cloning inner
    /// services").
    fn hold<Req>(
        &mut self,
        req: Req,
        applied: Applied,
        pk: Option<Arc<str>>,
    ) -> Pending<S, Req, St::Future> {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Pending {
            inner,
            req,
            applied,
            pk,
            limiter: self.limiter.clone(),
            deadline: None,
            degrade: self.degrade,
        }
    }
}
