//! [`Resolve`]: the strategy that chooses a request's policies, and the built-in resolvers.

use std::fmt;

use http::Request;
use ratekeeper_core::Policy;

use super::Plan;
use crate::error::BuildError;
use crate::request::RequestParts;

/// Chooses the policies a request is charged to.
///
/// The request comes through a generic method, so the trait has no body type parameter and
/// a closure `Fn(&RequestParts<'_>, &mut Plan<'_>)` is a resolver as it is (its
/// [`RequestParts`] is the request without the body). Rust infers a closure's parameter types
/// only from a direct `Fn` bound, so annotate them, or pass the closure through
/// [`resolve_fn`], which infers them:
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::{Policy, Quota};
/// use ratekeeper_tower::RequestParts;
/// use ratekeeper_tower::policy::{Plan, resolve_fn};
/// use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
///
/// let per_minute = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
/// // A bare closure.
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("reads", per_minute(100)))
///     .policy(Policy::new("writes", per_minute(10)))
///     .key(GlobalKey)
///     .resolver(|req: &RequestParts<'_>, plan: &mut Plan<'_>| {
///         if req.method() == axum::http::Method::GET { plan.charge("reads"); } else { plan.charge("writes"); }
///     })
///     .build()?;
/// # let _ = layer;
/// // The same through `resolve_fn`, without annotations.
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("reads", per_minute(100)))
///     .key(GlobalKey)
///     .resolver(resolve_fn(|req, plan| {
///         if req.uri().path() != "/health" { plan.charge("reads"); }
///     }))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), ratekeeper_tower::BuildError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate-limit policy resolver",
    label = "not a `Resolve`",
    note = "a closure resolver takes `(&RequestParts<'_>, &mut Plan<'_>)`: annotate both parameters, or wrap the closure in `ratekeeper_tower::policy::resolve_fn`"
)]
pub trait Resolve: Send + Sync + 'static {
    /// Adds this request's charges to `plan` (or marks it exempt). A plan with no charge is
    /// exempt.
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>);

    /// Checks the resolver against the layer's policies when the layer is built
    /// ([`RateLimitBuilder::build`](crate::RateLimitBuilder::build) calls it): policy names,
    /// static costs against bursts.
    ///
    /// The default accepts every set of policies, for resolvers that name policies only when
    /// each request is resolved (as closures do: a name no policy has then answers `500`).
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming what is wrong.
    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        let _ = policies;
        Ok(())
    }
}

impl<F> Resolve for F
where
    F: Fn(&RequestParts<'_>, &mut Plan<'_>) + Send + Sync + 'static,
{
    #[inline]
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        self(&RequestParts::new(req), plan);
    }
}

/// A resolver from a closure, with its parameter types inferred (policy names are checked
/// when each request is resolved: an unknown name answers `500`). A closure with annotated
/// parameters is a [`Resolve`] without it.
pub fn resolve_fn<F>(f: F) -> ResolveFn<F>
where
    F: Fn(&RequestParts<'_>, &mut Plan<'_>) + Send + Sync + 'static,
{
    ResolveFn(f)
}

/// A closure resolver, from [`resolve_fn`].
#[derive(Clone, Copy)]
pub struct ResolveFn<F>(F);

impl<F> fmt::Debug for ResolveFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResolveFn")
    }
}

impl<F> Resolve for ResolveFn<F>
where
    F: Fn(&RequestParts<'_>, &mut Plan<'_>) + Send + Sync + 'static,
{
    #[inline]
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        (self.0)(&RequestParts::new(req), plan);
    }
}

impl<F> ResolveFn<F> {
    /// Exempts requests for which `predicate` is true.
    pub fn except<P>(self, predicate: P) -> Except<Self, P> {
        Except::new(self, predicate)
    }
}

/// The default resolver: every policy, with the layer's key and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllPolicies;

impl Resolve for AllPolicies {
    #[inline]
    fn resolve<B>(&self, _req: &Request<B>, plan: &mut Plan<'_>) {
        plan.charge_all();
    }
}

impl AllPolicies {
    /// Exempts requests for which `predicate` is true.
    pub fn except<P>(self, predicate: P) -> Except<Self, P> {
        Except::new(self, predicate)
    }
}

/// Exempts requests matching a predicate `Fn(&RequestParts<'_>) -> bool`; resolves the others
/// with `inner`.
///
/// ```
/// use ratekeeper_tower::RequestParts;
/// use ratekeeper_tower::policy::AllPolicies;
///
/// let health_is_free = AllPolicies.except(|req: &RequestParts<'_>| req.uri().path() == "/health");
/// # let _ = health_is_free;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Except<R, P> {
    inner: R,
    predicate: P,
}

impl<R, P> Except<R, P> {
    /// `inner`, except for requests where `predicate` is true.
    pub const fn new(inner: R, predicate: P) -> Self {
        Self { inner, predicate }
    }
}

impl<R, P> Resolve for Except<R, P>
where
    R: Resolve,
    P: Fn(&RequestParts<'_>) -> bool + Send + Sync + 'static,
{
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        if (self.predicate)(&RequestParts::new(req)) {
            plan.exempt();
        } else {
            self.inner.resolve(req, plan);
        }
    }

    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        self.inner.check(policies)
    }
}
