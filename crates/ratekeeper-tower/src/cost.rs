//! Costs: how many units a request consumes.
//!
//! A [`Cost`] is a constant (`u64`) or a closure `Fn(&Request<B>) -> u64`. A constant cost is
//! checked when the layer is built: 0, or more than a policy's burst, is a build error (it
//! would make the policy "unlimited" or "never"). A cost computed per request that exceeds
//! the burst gets the "cost can never fit" response (429 without `Retry-After`).
//!
//! # Example
//!
//! ```
//! use http::{Method, Request};
//! use ratekeeper_tower::cost::Cost;
//!
//! let expensive_posts = |req: &Request<()>| if req.method() == Method::POST { 5 } else { 1 };
//! assert_eq!(expensive_posts.cost(&Request::post("/search").body(()).unwrap()), 5);
//! assert_eq!(3u64.cost(&Request::new(())), 3);
//! assert_eq!(Cost::<()>::fixed(&3u64), Some(3));
//! ```

use http::Request;

/// The units a request consumes.
pub trait Cost<B>: Send + Sync + 'static {
    /// Units this request consumes.
    fn cost(&self, req: &Request<B>) -> u64;

    /// The cost when it is the same for every request (checked at build time).
    fn fixed(&self) -> Option<u64> {
        None
    }
}

impl<B> Cost<B> for u64 {
    #[inline]
    fn cost(&self, _req: &Request<B>) -> u64 {
        *self
    }

    fn fixed(&self) -> Option<u64> {
        Some(*self)
    }
}

impl<B, F> Cost<B> for F
where
    F: Fn(&Request<B>) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, req: &Request<B>) -> u64 {
        self(req)
    }
}
