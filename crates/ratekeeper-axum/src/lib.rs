//! # ratekeeper-axum
//!
//! Rate limiting for [axum](https://docs.rs/axum) apps: add a [`RateLimitLayer`] to a
//! `Router` and serve it with connect info, so each client IP gets its own budget.
//!
//! Responses carry `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
//! (seconds, rounded up) on every status; a limited request gets `429 Too Many Requests`
//! with `Retry-After` (seconds, rounded up, at least 1), `Cache-Control: no-store` and an
//! RFC 9457 `application/problem+json` body, and never reaches the handler.
//!
//! # Example
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::num::NonZeroU32;
//! use axum::{Router, routing::get};
//! use ratekeeper_axum::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     // 10 requests per minute per client IP, burst 10.
//!     .layer(RateLimitLayer::new(Quota::per_minute(NonZeroU32::new(10).unwrap())));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! `Router::layer` limits every route (and the fallback); `Router::route_layer` limits only
//! matched routes, so unknown paths get their 404 without being charged. Without connect
//! info the peer address is unknown: such requests get a `500` and an error log line naming
//! the fix, never a panic.

pub use ratekeeper_core::{self as core, Algorithm, Decision, Key, Outcome, Policy, Quota};
pub use ratekeeper_tower::{
    self as tower, BuildError, GlobalKey, KeyError, KeyExtractor, PeerIp, RateLimit,
    RateLimitBuilder, RateLimitLayer, cors, cost, key, policy, report, route,
};
