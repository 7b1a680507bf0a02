//! CORS and rate limits: preflights are free, and 429s must be readable by the page.
//!
//! - A CORS preflight (`OPTIONS` with `Access-Control-Request-Method`) is **not counted** by
//!   default: it is the browser asking permission, not the client's request, and a 429 on it
//!   turns into an opaque "Failed to fetch" (case B23). Opt back in with
//!   [`Builder::count_preflight`](crate::RateLimitBuilder::count_preflight).
//! - Put `tower_http::cors::CorsLayer` **outside** the rate limit layer, so 429s carry
//!   `Access-Control-Allow-Origin` too, and expose [`EXPOSED_HEADERS`] so scripts can read
//!   `Retry-After` and the rate-limit headers.
//!
//! # Example
//!
//! ```
//! use http::{Method, Request};
//! use ratekeeper_tower::cors::{EXPOSED_HEADERS, is_preflight};
//!
//! let preflight = Request::builder()
//!     .method(Method::OPTIONS)
//!     .header("origin", "https://app.example")
//!     .header("access-control-request-method", "POST")
//!     .body(())
//!     .unwrap();
//! assert!(is_preflight(&preflight));
//! assert!(!is_preflight(&Request::builder().method(Method::OPTIONS).body(()).unwrap()));
//! assert!(EXPOSED_HEADERS.iter().any(|h| h == "retry-after"));
//! ```

use http::header::{ACCESS_CONTROL_REQUEST_METHOD, HeaderName, RETRY_AFTER};
use http::{Method, Request};

/// The response headers a browser script needs to read on a rate-limited API: `Retry-After`,
/// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, and the IETF
/// `RateLimit` and `RateLimit-Policy` fields. Pass them to
/// `CorsLayer::expose_headers`.
pub static EXPOSED_HEADERS: [HeaderName; 6] = [
    RETRY_AFTER,
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
    HeaderName::from_static("ratelimit"),
    HeaderName::from_static("ratelimit-policy"),
];

/// Whether `req` is a CORS preflight: `OPTIONS` carrying `Access-Control-Request-Method`
/// (Fetch standard, "CORS-preflight request").
pub fn is_preflight<B>(req: &Request<B>) -> bool {
    req.method() == Method::OPTIONS && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}
