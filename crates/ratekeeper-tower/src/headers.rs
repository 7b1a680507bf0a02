//! Every HTTP field name the crate writes or reads, defined once, as constants.
//!
//! The rate-limit fields the layers write (the style is chosen with
//! [`HeaderStyle`](crate::report::HeaderStyle)), the degraded-response marker, and the gRPC
//! fields of trailers-only answers; [`client`](crate::client) reads the same rate-limit
//! fields. `Retry-After` and `Content-Type` are `http::header`'s.
//!
//! ```
//! use ratekeeper_tower::headers::{RATELIMIT, X_RATELIMIT_REMAINING};
//!
//! assert_eq!(X_RATELIMIT_REMAINING.as_str(), "x-ratelimit-remaining");
//! assert_eq!(RATELIMIT.as_str(), "ratelimit");
//! ```

use http::HeaderName;

/// `X-RateLimit-Limit`: the limit of the policy the headers report (de facto convention).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: the units left to the key.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: when the key is back at full capacity (delta seconds, or Unix
/// seconds with [`ResetFormat::UnixEpoch`](crate::report::ResetFormat::UnixEpoch)).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11 §4): current state per policy.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11 §3): the policies.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit-Limit` (drafts -00 to -03;
/// [`HeaderStyle::IetfLegacy`](crate::report::HeaderStyle::IetfLegacy)).
pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (drafts -00 to -03;
/// [`HeaderStyle::IetfLegacy`](crate::report::HeaderStyle::IetfLegacy)).
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (drafts -00 to -03, delta seconds;
/// [`HeaderStyle::IetfLegacy`](crate::report::HeaderStyle::IetfLegacy)).
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `RateLimit-Degraded`: set on a response that a degraded-response fallback produced
/// instead of a 429 (see [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)).
/// Its value is a Structured Field String (RFC 9651 §3.3.3) naming the policy that limited
/// the request, e.g. `RateLimit-Degraded: "burst"`, or `"store-unavailable"` when the store
/// could not decide. This field is ratekeeper's own, not part of any standard.
pub const RATELIMIT_DEGRADED: HeaderName = HeaderName::from_static("ratelimit-degraded");

/// `grpc-status` (gRPC over HTTP/2, "Responses").
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message` (gRPC over HTTP/2, "Responses").
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-status-details-bin`: a `google.rpc.Status`, base64.
pub(crate) const GRPC_STATUS_DETAILS_BIN: HeaderName =
    HeaderName::from_static("grpc-status-details-bin");
