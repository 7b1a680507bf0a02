//! The degraded-response fallback, part of the rate limit: [`FallbackLayer`] (made by
//! [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)) puts a
//! [`Fallback`] behind the [`RateLimit`](crate::RateLimit), which hands it the requests it
//! refused as a `Degrade` in a typed call ([`Inner::degrade`](super::inner::Inner)); the
//! [`FallbackFuture`] marks its answers.

mod future;
mod layer;
mod service;

pub use future::FallbackFuture;
pub use layer::FallbackLayer;
pub use service::Fallback;
