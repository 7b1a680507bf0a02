//! [`RateLimitInfo`]: read the rate-limit decision in a handler.
//!
//! The [`RateLimit`](crate::RateLimit) service puts the decision of every policy into the
//! request before the handler runs. Extract it as `RateLimitInfo` (a `500` with
//! [`MissingRateLimitInfo`] when the route is not behind a rate limit) or as
//! `Option<RateLimitInfo>` (never fails).
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::{Router, body::Body, http::Request, routing::get};
//! use ratekeeper_axum::{GlobalKey, Quota, RateLimitInfo, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! async fn handler(info: RateLimitInfo) -> String {
//!     format!("{} requests left", info.remaining())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(3).unwrap()))
//!     .key(GlobalKey)
//!     .build()?;
//! let app = Router::new().route("/", get(handler)).route_layer(layer);
//! let res = app.oneshot(Request::new(Body::empty())).await?;
//! let body = axum::body::to_bytes(res.into_body(), 1024).await?;
//! assert_eq!(&body[..], b"2 requests left");
//! # Ok(())
//! # }
//! ```

use std::ops::Deref;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use ratekeeper_tower::info::Info;

/// The rate-limit decision for this request (see the [module docs](self)). Derefs to
/// [`Info`]: `remaining()`, `reset_after()`, `deciding()`, `policies()`, `is_limited()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitInfo(pub Info);

impl Deref for RateLimitInfo {
    type Target = Info;

    fn deref(&self) -> &Info {
        &self.0
    }
}

/// The handler asked for [`RateLimitInfo`] but no rate limit ran for this request (the
/// route is not behind a `RateLimitLayer`, or the layer is inside the extractor's route).
/// Answered with `500 Internal Server Error` and an error log line: it is a server bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[error("no rate-limit decision for this request: is the route behind a RateLimitLayer?")]
pub struct MissingRateLimitInfo;

impl IntoResponse for MissingRateLimitInfo {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "RateLimitInfo extractor failed");
        (StatusCode::INTERNAL_SERVER_ERROR, format!("{self}\n")).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RateLimitInfo {
    type Rejection = MissingRateLimitInfo;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Info>()
            .cloned()
            .map(Self)
            .ok_or(MissingRateLimitInfo)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RateLimitInfo {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Info>().cloned().map(Self))
    }
}
