use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Charge, Checked, Decisions, Store};
use smallvec::SmallVec;
use tower_service::Service;

use super::future::{Answer, Report, ResponseFuture, on_store_error};
use super::layer::Shared;
use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::key::{KeyExtractor, PeerIp};

/// The rate-limiting service: decides in `call`, answers a denied request with a 429 without
/// calling the inner service, and adds rate-limit headers to the inner service's responses.
///
/// `poll_ready` only forwards to the inner service: readiness never consumes quota.
pub struct RateLimit<S, K = PeerIp, Co = u64, St = ratekeeper_core::store::MemoryStore<Key>> {
    inner: S,
    shared: Arc<Shared<K, Co, St>>,
}

impl<S, K, Co, St> RateLimit<S, K, Co, St> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<K, Co, St>>) -> Self {
        Self { inner, shared }
    }

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

    /// A layer that builds services sharing this service's state.
    pub fn layer(&self) -> super::RateLimitLayer<K, Co, St> {
        super::RateLimitLayer::from_shared(Arc::clone(&self.shared))
    }
}

impl<S: Clone, K, Co, St> Clone for RateLimit<S, K, Co, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, Co, St> fmt::Debug for RateLimit<S, K, Co, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policies", &self.shared.reporter.names)
            .finish()
    }
}

impl<K, Co, St> Report for Shared<K, Co, St>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
{
    fn headers(&self, decisions: &Decisions, headers: &mut http::HeaderMap) {
        self.reporter
            .headers(decisions, || self.store.unix_now(), headers);
    }

    fn limited(&self, decisions: &Decisions) -> Answer {
        let (status, headers, body) = self.reporter.limited(decisions, || self.store.unix_now());
        Answer {
            status,
            headers,
            body,
        }
    }
}

impl<S, K, Co, St, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, Co, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: KeyExtractor<ReqB>,
    Co: Cost<ReqB>,
    St: Store<Key>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, Request<ReqB>, St::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let shared = &*self.shared;
        let key = match shared.key.extract(&req) {
            Ok(key) => key,
            Err(err) => return ResponseFuture::key_error(&err),
        };
        let cost = shared.cost.cost(&req);
        let charges: SmallVec<[Charge<'_, Key>; 4]> = shared
            .ids
            .iter()
            .map(|&id| Charge::new(id, &key, cost))
            .collect();
        match shared.store.check(&charges) {
            Checked::Ready(Ok(decisions)) => {
                if decisions.is_allowed() {
                    let report: Arc<dyn Report> = self.shared.clone();
                    ResponseFuture::called(self.inner.call(req), report, decisions)
                } else {
                    log_denial(&key, cost, &decisions, &shared.reporter.names);
                    ResponseFuture::answered(shared.limited(&decisions))
                }
            }
            Checked::Ready(Err(err)) => match on_store_error(&err, &mut req) {
                Some(answer) => ResponseFuture::answered(answer),
                None => ResponseFuture::unchecked(self.inner.call(req)),
            },
            Checked::Pending(check) => {
                // The ready inner service goes into the future; this one gets a fresh clone
                // (see the tower-service docs, "Be careful when cloning inner services").
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let report: Arc<dyn Report> = self.shared.clone();
                ResponseFuture::checking(check, ready, req, report)
            }
        }
    }
}

pub(crate) fn log_denial(key: &Key, cost: u64, decisions: &Decisions, names: &[Box<str>]) {
    let policy = decisions
        .deciding()
        .and_then(|i| names.get(i))
        .map_or("", |n| &**n);
    if decisions.is_cannot_fit() {
        tracing::warn!(%key, cost, policy, "request cost is larger than the policy's burst; it can never be allowed");
    } else {
        tracing::debug!(%key, cost, policy, retry_after = ?decisions.retry_after(), "rate limited");
    }
}
