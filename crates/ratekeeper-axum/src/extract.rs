//! [`RateLimitInfo`]: read the rate-limit decision in a handler.
//!
//! A [`RateLimit`](crate::RateLimit) service built with `.request_info(true)` puts the
//! decision of every policy into the request before the handler runs (off by default, as it
//! costs an allocation per request; requests let through over the limit by shadow mode or a
//! fallback always carry it). Extract it as `RateLimitInfo` (a `500` with
//! [`MissingRateLimitInfo`] when no decision is there) or as `Option<RateLimitInfo>` (never
//! fails).
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::{Router, body::Body, http::Request, routing::get};
//! use ratekeeper_axum::{key::GlobalKey, core::Quota, extract::RateLimitInfo, RateLimitLayer};
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
//!     .request_info(true)
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

/// The handler asked for [`RateLimitInfo`] but the request carries no decision: the layer
/// was built without `.request_info(true)`, or the route is not behind a `RateLimitLayer`.
/// Answered with `500 Internal Server Error` and an error log line: it is a server bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[error(
    "no rate-limit decision for this request: build the RateLimitLayer with .request_info(true), and put the route behind it"
)]
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use ratekeeper_core::Quota;
    use tower::ServiceExt;

    use super::*;
    use crate::RateLimitLayer;
    use crate::key::GlobalKey;

    async fn body(app: Router, path: &str) -> (StatusCode, String) {
        let res = app
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    fn app() -> Router {
        let limited = Router::new()
            .route(
                "/limited",
                get(|info: RateLimitInfo| async move {
                    let (name, d) = info.deciding().unwrap();
                    format!("{name} {} {}", d.limit(), info.remaining())
                }),
            )
            .route_layer(
                RateLimitLayer::builder()
                    .quota(Quota::per_minute(NonZeroU32::new(7).unwrap()))
                    .key(GlobalKey)
                    .request_info(true)
                    .build()
                    .unwrap(),
            );
        let quiet = Router::new()
            .route(
                "/quiet",
                get(|info: Option<RateLimitInfo>| async move { format!("{}", info.is_some()) }),
            )
            .route_layer(
                RateLimitLayer::builder()
                    .quota(Quota::per_minute(NonZeroU32::new(7).unwrap()))
                    .key(GlobalKey)
                    .build()
                    .unwrap(),
            );
        Router::new()
            .route(
                "/required",
                get(|_info: RateLimitInfo| async { "unreachable" }),
            )
            .route(
                "/optional",
                get(|info: Option<RateLimitInfo>| async move { format!("{}", info.is_some()) }),
            )
            .merge(limited)
            .merge(quiet)
    }

    #[tokio::test]
    async fn reads_the_decision_behind_a_layer() {
        assert_eq!(
            body(app(), "/limited").await,
            (StatusCode::OK, "default 7 6".to_owned())
        );
    }

    #[tokio::test]
    async fn missing_info_is_a_500_with_a_clear_message() {
        let (status, text) = body(app(), "/required").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(text.contains(".request_info(true)"), "{text}");
        assert_eq!(
            body(app(), "/optional").await,
            (StatusCode::OK, "false".to_owned())
        );
    }

    #[tokio::test]
    async fn request_info_is_off_by_default() {
        assert_eq!(
            body(app(), "/quiet").await,
            (StatusCode::OK, "false".to_owned())
        );
    }
}
