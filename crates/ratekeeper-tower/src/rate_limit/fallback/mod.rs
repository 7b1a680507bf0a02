//! Degraded-response fallback: a service that answers limited requests instead of a 429.
//!
//! [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback) puts the rate limit
//! in front and [`Fallback`] behind it, which sends the requests
//! the rate limit denied (and, under the store failure policy
//! [`FailurePolicy::Degrade`](ratekeeper_core::store::FailurePolicy::Degrade), the requests it
//! could not decide) to the fallback service and every other request to the inner service.
//! Fallback responses carry `RateLimit-Degraded: "<policy>"`
//! ([`RATELIMIT_DEGRADED`](crate::report::RATELIMIT_DEGRADED)) and are counted in
//! `ratekeeper_degraded_total{policy, reason}`.
//!
//! # Where to put it
//!
//! Around the one service whose answer the fallback degrades, and nothing else. The fallback
//! answers *every* limited request that passes through the layer, whatever its method or
//! path, so a layer around a whole router would also answer a limited client's `404`s,
//! `405`s and other routes with the degraded body. In axum, put it on the method router of
//! that route: `Router::new().route("/prices", get(prices).route_layer(limit))` limits and
//! degrades `GET` (and `HEAD`) `/prices` only, while `POST /prices` stays a `405` and unknown
//! paths stay `404`s; `Router::layer` and `Router::route_layer` would wrap every route. In
//! plain tower, wrap only that route's service, below your routing.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_core::Quota;
//! use ratekeeper_tower::{GlobalKey, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(1).unwrap()))
//!     .key(GlobalKey)
//!     .build()?
//!     .with_fallback(service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new("cached".to_owned()))
//!     }));
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new("fresh".to_owned())) });
//! assert!(svc.clone().oneshot(Request::new(())).await?.headers().get("ratelimit-degraded").is_none());
//! let cached = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(cached.status(), StatusCode::OK);
//! assert_eq!(cached.headers()["ratelimit-degraded"], "\"default\"");
//! # Ok(())
//! # }
//! ```

mod future;
mod service;

pub use future::FallbackFuture;
pub use service::Fallback;
