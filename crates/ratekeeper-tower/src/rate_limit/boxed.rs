//! [`BoxRateLimitLayer`] and [`BoxRateLimit`]: a rate limit whose key extractor, cost and
//! resolver types are erased, so it is named by its store alone.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use ratekeeper_core::Key;
use ratekeeper_core::store::{Checked, MemoryStore, PolicyId, Store};
use tower_layer::Layer;
use tower_service::Service;

use super::admin::Admin;
use super::future::{ResponseFuture, dispatch};
use super::inner::Inner;
use super::layer::RateLimitLayer;
use super::limiter::{Erased, Limiter, Prepared};
use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::key::KeyExtractor;
use crate::policy::{Applied, Resolve};

/// A limiter as the boxed layer holds it: the request side reads only the request's head.
trait DynLimiter<St>: Send + Sync {
    /// The ticket of the request whose head (body taken out) is `head`.
    fn prepare_head(&self, head: &Request<()>, fallback: bool) -> Prepared;
    /// The store's answer to `applied`.
    fn check(&self, applied: &Applied) -> Checked<St::Future>
    where
        St: Store<Key>;
    /// The limiter, as the response future and settlements hold it.
    fn erased(self: Arc<Self>) -> Arc<dyn Erased<St::Future>>
    where
        St: Store<Key>;
    /// The admin handle.
    fn admin(self: Arc<Self>) -> Admin<St>;
    /// The policy names.
    fn names(&self) -> &[Box<str>];
    /// The store.
    fn store(&self) -> &St;
    /// The policy ids, in the order the policies were added.
    fn ids(&self) -> &[PolicyId];
}

impl<K, Co, St, R> DynLimiter<St> for Limiter<K, Co, St, R>
where
    K: KeyExtractor,
    Co: Cost,
    St: Store<Key>,
    R: Resolve,
{
    fn prepare_head(&self, head: &Request<()>, fallback: bool) -> Prepared {
        self.prepare(head, fallback)
    }

    fn check(&self, applied: &Applied) -> Checked<St::Future> {
        Limiter::check(self, applied)
    }

    fn erased(self: Arc<Self>) -> Arc<dyn Erased<St::Future>> {
        self
    }

    fn admin(self: Arc<Self>) -> Admin<St> {
        Admin::new(self)
    }

    fn names(&self) -> &[Box<str>] {
        Limiter::names(self)
    }

    fn store(&self) -> &St {
        &self.store
    }

    fn ids(&self) -> &[PolicyId] {
        &self.ids
    }
}

/// A [`RateLimitLayer`](crate::RateLimitLayer) with its key extractor, cost and resolver types erased (made by
/// [`RateLimitLayer::boxed`](crate::RateLimitLayer::boxed)): named by its store alone, `BoxRateLimitLayer` for the memory
/// store, so a function can take or return it, or its [`Admin`] handle, without spelling the
/// strategy types (a closure's type cannot be spelled at all).
///
/// It limits exactly as the layer it was made from, with the same state (clones and the
/// original layer share one budget). Its cost: the strategies are called through a trait
/// object, and the request is taken apart and put together again around them (moves, no
/// allocation); [`RateLimitLayer`](crate::RateLimitLayer) itself stays unboxed.
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::Quota;
/// use ratekeeper_tower::RateLimitLayer;
/// use ratekeeper_tower::policy::Plan;
/// use ratekeeper_tower::rate_limit::BoxRateLimitLayer;
/// use ratekeeper_tower::RequestParts;
///
/// /// Searches cost 5 units, everything else 1.
/// fn search_limit() -> Result<BoxRateLimitLayer, ratekeeper_tower::BuildError> {
///     let layer = RateLimitLayer::builder()
///         .quota(Quota::per_minute(NonZeroU32::new(100).unwrap()))
///         .resolver(|req: &RequestParts<'_>, plan: &mut Plan<'_>| {
///             let cost = if req.uri().path() == "/search" { 5 } else { 1 };
///             plan.charge_with("default", plan.key().clone(), cost);
///         })
///         .build()?;
///     Ok(layer.boxed())
/// }
/// let layer = search_limit()?;
/// assert_eq!(layer.admin().policies().collect::<Vec<_>>(), ["default"]);
/// # Ok::<(), ratekeeper_tower::BuildError>(())
/// ```
pub struct BoxRateLimitLayer<St = MemoryStore<Key>> {
    limiter: Arc<dyn DynLimiter<St>>,
}

impl<K, Co, St, R> RateLimitLayer<K, Co, St, R>
where
    K: KeyExtractor,
    Co: Cost,
    St: Store<Key>,
    R: Resolve,
{
    /// This layer with its key extractor, cost and resolver types erased (see
    /// [`BoxRateLimitLayer`]); it shares this layer's state.
    pub fn boxed(self) -> BoxRateLimitLayer<St> {
        BoxRateLimitLayer {
            limiter: self.limiter(),
        }
    }
}

impl<St> BoxRateLimitLayer<St> {
    /// The store, for calls of its own (as [`RateLimitLayer::store`](crate::RateLimitLayer::store)).
    pub fn store(&self) -> &St {
        self.limiter.store()
    }

    /// The ids of this layer's policies, in the order they were added.
    pub fn policy_ids(&self) -> &[PolicyId] {
        self.limiter.ids()
    }

    /// A handle to peek at and reset client keys in this layer's store (see [`Admin`]).
    pub fn admin(&self) -> Admin<St> {
        Arc::clone(&self.limiter).admin()
    }
}

impl<St> Clone for BoxRateLimitLayer<St> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<St> fmt::Debug for BoxRateLimitLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxRateLimitLayer")
            .field("policies", &self.limiter.names())
            .finish_non_exhaustive()
    }
}

impl<S, St> Layer<S> for BoxRateLimitLayer<St> {
    type Service = BoxRateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        BoxRateLimit {
            inner,
            limiter: Arc::clone(&self.limiter),
        }
    }
}

/// The service of a [`BoxRateLimitLayer`]: a [`RateLimit`](crate::RateLimit) whose strategy
/// types are erased. Decides in `call`; `poll_ready` only forwards.
pub struct BoxRateLimit<S, St = MemoryStore<Key>> {
    inner: S,
    limiter: Arc<dyn DynLimiter<St>>,
}

impl<S, St> BoxRateLimit<S, St> {
    define_inner_service_accessors!();

    /// A layer that builds services sharing this service's state.
    pub fn layer(&self) -> BoxRateLimitLayer<St> {
        BoxRateLimitLayer {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: Clone, St> Clone for BoxRateLimit<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for BoxRateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxRateLimit")
            .field("inner", &self.inner)
            .field("policies", &self.limiter.names())
            .finish()
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for BoxRateLimit<S, St>
where
    S: Inner<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store<Key>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, Request<ReqB>, St::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Inner::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The strategies read the head only: the body is set aside while they do.
        let (parts, body) = req.into_parts();
        let head = Request::from_parts(parts, ());
        let prepared = self.limiter.prepare_head(&head, S::FALLBACK);
        let (parts, ()) = head.into_parts();
        let req = Request::from_parts(parts, body);
        let limiter = &self.limiter;
        dispatch(
            &mut self.inner,
            req,
            Arc::clone(limiter).erased(),
            move |_| prepared,
            |ticket| limiter.check(&ticket.charges),
        )
    }
}
