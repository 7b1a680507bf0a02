use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Checked, Decisions, Store};
use tower_service::Service;

use super::future::{Answer, Pending, Report, Reported, ResponseFuture, on_store_error};
use super::layer::Shared;
use super::mode::Mode;
use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::info::Info;
use crate::key::{KeyExtractor, PeerIp};
use crate::policy::{AllPolicies, Applied, Prepared, Resolve};

/// The rate-limiting service: decides in `call`, answers a denied request with a 429 without
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
    shared: Arc<Shared<K, Co, St, R>>,
    /// The inner service is a [`Fallback`](super::Fallback): denied requests go to it.
    degrade: bool,
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<K, Co, St, R>>) -> Self {
        Self {
            inner,
            shared,
            degrade: false,
        }
    }

    pub(crate) fn degrading(inner: S, shared: Arc<Shared<K, Co, St, R>>) -> Self {
        Self {
            inner,
            shared,
            degrade: true,
        }
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
    pub fn layer(&self) -> super::RateLimitLayer<K, Co, St, R> {
        super::RateLimitLayer::from_shared(Arc::clone(&self.shared))
    }
}

impl<S: Clone, K, Co, St, R> Clone for RateLimit<S, K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            degrade: self.degrade,
        }
    }
}

impl<S: fmt::Debug, K, Co, St, R> fmt::Debug for RateLimit<S, K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policies", &self.shared.reporter.names)
            .finish()
    }
}

impl<K, Co, St, R> Report for Shared<K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    fn headers(&self, reported: &Reported, headers: &mut http::HeaderMap) {
        // Only the IETF fields and several policies need the list.
        let policies = if self.reporter.needs_policy_indices() {
            reported.policies()
        } else {
            smallvec::SmallVec::new()
        };
        self.reporter.headers(
            &reported.decisions,
            &policies,
            reported.pk.as_deref(),
            || self.store.unix_now(),
            headers,
        );
    }

    fn settle(&self, reported: &Reported, status: http::StatusCode) {
        let applied = &reported.applied;
        let refunds = applied.refunds(&self.rules, &self.ids, &reported.decisions, status);
        if !refunds.is_empty() {
            tracing::debug!(key = %applied.key, %status, "refunding rate-limit charge after the response");
            self.store.refund(&refunds);
        }
    }

    fn limited(&self, reported: &Reported) -> Answer {
        let (status, headers, body) = self.reporter.limited(
            &reported.decisions,
            &reported.policies(),
            reported.pk.as_deref(),
            || self.store.unix_now(),
        );
        Answer {
            status,
            headers,
            body,
        }
    }
}

impl<S, K, Co, St, R, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, Co, St, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    K: KeyExtractor,
    Co: Cost,
    St: Store<Key>,
    R: Resolve<ReqB>,
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
        let applied = match shared.prepare(&req) {
            Prepared::Charge(applied) => applied,
            Prepared::Exempt => return ResponseFuture::unchecked(self.inner.call(req)),
            Prepared::Failed(err) => return ResponseFuture::key_error(&err),
        };
        let pk = shared.reporter.pk(&applied.key);
        let charges = applied.charges(&shared.ids);
        let checked = match shared.reporter.mode {
            // Delay mode reserves (it needs tokio's timer to wait; without a runtime it
            // checks, and a denied request is rejected).
            Mode::Delay { max_wait } if tokio::runtime::Handle::try_current().is_ok() => {
                shared.store.reserve(&charges, max_wait)
            }
            _ => shared.store.check(&charges),
        };
        drop(charges);
        match checked {
            Checked::Ready(Ok(decisions)) => {
                shared.meter.record(&applied, &decisions);
                if decisions.is_allowed() && decisions.delay().is_zero() {
                    if shared.reporter.wants_info(&decisions) {
                        req.extensions_mut().insert(Info::new(
                            shared.reporter.names.clone(),
                            applied.indices(),
                            decisions.clone(),
                        ));
                    }
                    let report: Arc<dyn Report> = self.shared.clone();
                    let reported = Reported {
                        decisions,
                        applied,
                        pk,
                    };
                    ResponseFuture::called(self.inner.call(req), report, reported)
                } else {
                    if !decisions.is_allowed() {
                        log_denial(&applied, &decisions, &shared.reporter.names);
                    }
                    if shared.reporter.mode == Mode::Reject && !self.degrade {
                        return ResponseFuture::answered(shared.limited(&Reported {
                            decisions,
                            applied,
                            pk,
                        }));
                    }
                    // Shadow, Delay (reserved or denied) or a fallback: the request goes on
                    // with the ready inner service (this one gets a fresh clone).
                    let clone = self.inner.clone();
                    let ready = std::mem::replace(&mut self.inner, clone);
                    let pending = self.pending(ready, req, applied, pk);
                    ResponseFuture::decided(pending, Ok(decisions))
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
                let pending = self.pending(ready, req, applied, pk);
                ResponseFuture::checking(check, pending)
            }
        }
    }
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R>
where
    K: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    fn pending<Req>(
        &self,
        inner: S,
        req: Req,
        applied: Applied,
        pk: Option<Arc<str>>,
    ) -> Pending<S, Req, St::Future> {
        Pending {
            inner,
            req,
            applied,
            pk,
            limiter: self.shared.clone(),
            deadline: None,
            degrade: self.degrade,
        }
    }
}

pub(crate) fn log_denial(applied: &Applied, decisions: &Decisions, names: &[Box<str>]) {
    let entry = decisions.deciding().and_then(|i| applied.entries.get(i));
    let policy = entry
        .and_then(|e| names.get(e.index as usize))
        .map_or("", |n| &**n);
    let key = entry.and_then(|e| e.key.as_ref()).unwrap_or(&applied.key);
    let cost = entry.map_or(0, |e| e.cost);
    if decisions.is_cannot_fit() {
        tracing::warn!(%key, cost, policy, "request cost is larger than the policy's burst; it can never be allowed");
    } else {
        tracing::debug!(%key, cost, policy, retry_after = ?decisions.retry_after(), "rate limited");
    }
}
