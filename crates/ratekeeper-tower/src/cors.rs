//! CORS and rate limits: real preflights stay free, made-up ones are counted, and 429s must
//! be readable by the page.
//!
//! - Put `tower_http::cors::CorsLayer` **outside** the rate limit layer. It answers real CORS
//!   preflights itself, so they never reach the limiter: not counted, never a 429 (a 429 on a
//!   preflight turns into an opaque "Failed to fetch"). Every 429 then carries
//!   `Access-Control-Allow-Origin` too; expose [`EXPOSED_HEADERS`] so scripts can read
//!   `Retry-After` and the rate-limit headers.
//! - By default the limiter counts **every** request that reaches it, `OPTIONS` included: a
//!   request that only looks like a preflight (any client can send `Origin` and
//!   `Access-Control-Request-Method`) must not run a catch-all handler unlimited.
//!   [`Builder::exempt_preflight`](crate::RateLimitBuilder::exempt_preflight) opts in to
//!   exempting requests that [`is_preflight`] accepts; that exemption is client-controlled,
//!   so use it only where no handler does work for `OPTIONS`.
//!
//! # Example
//!
//! ```
//! use axum::http::{Method, Request};
//! use ratekeeper_tower::cors::{EXPOSED_HEADERS, is_preflight};
//!
//! let preflight = Request::builder()
//!     .method(Method::OPTIONS)
//!     .header("origin", "https://app.example")
//!     .header("access-control-request-method", "POST")
//!     .body(())
//!     .unwrap();
//! assert!(is_preflight(&preflight));
//! // No `Origin`, or a body: not a preflight a browser would send.
//! assert!(!is_preflight(&Request::builder().method(Method::OPTIONS).header("access-control-request-method", "POST").body(()).unwrap()));
//! let with_body = Request::builder()
//!     .method(Method::OPTIONS)
//!     .header("origin", "https://app.example")
//!     .header("access-control-request-method", "POST")
//!     .header("content-length", "17")
//!     .body(())
//!     .unwrap();
//! assert!(!is_preflight(&with_body));
//! assert!(EXPOSED_HEADERS.iter().any(|h| h == "retry-after"));
//! ```

use http::header::{
    ACCESS_CONTROL_REQUEST_METHOD, CONTENT_LENGTH, HeaderName, ORIGIN, RETRY_AFTER,
    TRANSFER_ENCODING,
};
use http::{Method, Request};

use crate::headers;

/// The response headers a browser script needs to read on a rate-limited API: `Retry-After`,
/// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, and the IETF
/// `RateLimit` and `RateLimit-Policy` fields. Pass them to
/// `CorsLayer::expose_headers`.
pub static EXPOSED_HEADERS: [HeaderName; 6] = [
    RETRY_AFTER,
    headers::X_RATELIMIT_LIMIT,
    headers::X_RATELIMIT_REMAINING,
    headers::X_RATELIMIT_RESET,
    headers::RATELIMIT,
    headers::RATELIMIT_POLICY,
];

/// Whether `req` looks like a CORS preflight a browser sends (Fetch standard,
/// "CORS-preflight request"): `OPTIONS` with `Origin` and `Access-Control-Request-Method`,
/// and no body (no `Transfer-Encoding`, no `Content-Length` other than `0`).
///
/// Every one of these is under the client's control: this tells a browser's preflight from
/// an ordinary request, not an honest client from a dishonest one. Over HTTP/2 and HTTP/3 a
/// request body needs neither `Content-Length` nor `Transfer-Encoding`, so there this test
/// cannot see a body at all: one more reason to let a CORS layer answer preflights instead
/// of exempting them.
pub fn is_preflight<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    req.method() == Method::OPTIONS
        && headers.contains_key(ORIGIN)
        && headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
        && !headers.contains_key(TRANSFER_ENCODING)
        && headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .all(|v| v.as_bytes() == b"0")
}
