//! Costs: how many units a request consumes.
//!
//! A [`Cost`] is a constant (`u64`) or a closure `Fn(&RequestParts<'_>) -> u64`
//! ([`RequestParts`]: the request's head, borrowed, whatever the body type). A constant cost
//! is checked when the layer is built: 0, or more than a policy's burst, is a build error (it
//! would make the policy "unlimited" or "never"). A cost computed per request that exceeds
//! the burst gets the "cost can never fit" response (429 without `Retry-After`).
//!
//! A per-request cost of 0 is a free probe: the request passes and is charged nothing. Never
//! derive a cost from a value the client controls (a header, a query parameter) without a
//! floor of 1, or the client can make every request free.
//!
//! A cost known only once the response is (the tokens a model generated) is charged here as
//! an estimate, and settled to its true cost with
//! [`RateLimitBuilder::usage`](crate::RateLimitBuilder::usage) (see [`usage`](crate::usage)).
//!
//! # Example
//!
//! ```
//! use axum::http::{Method, Request};
//! use ratekeeper_tower::RequestParts;
//! use ratekeeper_tower::cost::Cost;
//!
//! let expensive_posts = |req: &RequestParts<'_>| if req.method() == Method::POST { 5 } else { 1 };
//! assert_eq!(expensive_posts.cost(&Request::post("/search").body(()).unwrap()), 5);
//! assert_eq!(expensive_posts.cost(&Request::get("/search").body(String::new()).unwrap()), 1);
//! assert_eq!(3u64.cost(&Request::new(())), 3);
//! assert_eq!(3u64.fixed(), Some(3));
//! assert_eq!(expensive_posts.fixed(), None);
//! ```
//!
//! As the layer's cost function:
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::http::Method;
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::{key::GlobalKey, RateLimitLayer, RequestParts};
//!
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("api", Quota::per_minute(NonZeroU32::new(100).unwrap())))
//!     .key(GlobalKey)
//!     .cost_fn(|req: &RequestParts<'_>| if req.method() == Method::POST { 10 } else { 1 })
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```

use http::Request;

use crate::RequestParts;

/// The units a request consumes.
///
/// The trait has no body type parameter: [`Cost::cost`] is generic over the body. Closures
/// `Fn(&RequestParts<'_>) -> u64` are costs too.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate-limit cost",
    label = "not a `Cost`",
    note = "use a constant (`u64`, with `.cost(n)`), or a closure taking `&RequestParts<'_>` and returning `u64`",
    note = "a closure's parameter type must be written out: `|req: &RequestParts<'_>| ...`"
)]
pub trait Cost: Send + Sync + 'static {
    /// Units this request consumes.
    fn cost<B>(&self, req: &Request<B>) -> u64;

    /// The cost in units when it is the same for every request, or `None` (the default) when
    /// it depends on the request. The layer's builder reads it when the cost is set
    /// ([`RateLimitBuilder::cost`](crate::RateLimitBuilder::cost) or
    /// [`cost_fn`](crate::RateLimitBuilder::cost_fn)), and
    /// [`build`](crate::RateLimitBuilder::build) then refuses a fixed cost of 0 or one above a
    /// policy's capacity with a [`BuildError`](crate::BuildError).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use axum::http::Request;
    /// use ratekeeper_tower::cost::Cost;
    /// use ratekeeper_core::{Policy, Quota};
    /// use ratekeeper_tower::{BuildError, key::GlobalKey, RateLimitLayer};
    ///
    /// /// Every upload costs 20 units.
    /// struct Upload;
    /// impl Cost for Upload {
    ///     fn cost<B>(&self, _req: &Request<B>) -> u64 {
    ///         20
    ///     }
    ///     fn fixed(&self) -> Option<u64> {
    ///         Some(20)
    ///     }
    /// }
    ///
    /// // Burst 10: a request costing 20 could never pass, so the layer is not built.
    /// let built = RateLimitLayer::builder()
    ///     .policy(Policy::new("uploads", Quota::per_minute(NonZeroU32::new(10).unwrap())))
    ///     .key(GlobalKey)
    ///     .cost_fn(Upload)
    ///     .build();
    /// assert!(matches!(built, Err(BuildError::CostExceedsBurst { cost: 20, .. })));
    /// ```
    fn fixed(&self) -> Option<u64> {
        None
    }
}

impl Cost for u64 {
    #[inline]
    fn cost<B>(&self, _req: &Request<B>) -> u64 {
        *self
    }

    fn fixed(&self) -> Option<u64> {
        Some(*self)
    }
}

impl<F> Cost for F
where
    F: Fn(&RequestParts<'_>) -> u64 + Send + Sync + 'static,
{
    #[inline]
    fn cost<B>(&self, req: &Request<B>) -> u64 {
        self(&RequestParts::new(req))
    }
}
