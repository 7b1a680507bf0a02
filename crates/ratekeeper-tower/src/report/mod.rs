//! What clients see: rate-limit headers, `Retry-After`, the 429 body, and the gRPC status of
//! a limited gRPC call.
//!
//! The header fields and their syntax:
//!
//! - `Retry-After` (RFC 9110 §10.2.3) as delay-seconds rounded **up**, at least 1, on every
//!   429 except "cost can never fit" (which has no honest retry time).
//! - [`HeaderStyle::XRateLimit`] (the default): `X-RateLimit-Limit` / `-Remaining` / `-Reset`,
//!   the de-facto headers. The policy closest to exhaustion is reported (the denying one on a
//!   429). Reset is delta-seconds rounded up ([`ResetFormat::DeltaSeconds`], the default) or
//!   Unix epoch seconds ([`ResetFormat::UnixEpoch`]).
//! - [`HeaderStyle::Ietf`]: `RateLimit-Policy` and `RateLimit` of
//!   draft-ietf-httpapi-ratelimit-headers-11, both Structured Field Lists (RFC 9651 §3.1) with
//!   one named item per policy: `"name";q=<quota>;w=<window s>` and `"name";r=<remaining>;t=<reset s>`.
//!   With [`PartitionKey`] set, each item also carries `pk`, a Byte Sequence (RFC 9651 §3.3.5)
//!   holding a salted SHA-256 of the key, never the key itself.
//! - [`HeaderStyle::IetfLegacy`]: the three fields of drafts -00 to -03 (`RateLimit-Limit`,
//!   `RateLimit-Remaining`, `RateLimit-Reset` as delta seconds), for older clients.
//! - [`HeaderStyle::Both`] (X-RateLimit and IETF -11) and [`HeaderStyle::None`].
//! - The advertised quota (`X-RateLimit-Limit`, `RateLimit-Limit`, the IETF `q`) is the most
//!   that Remaining can ever show, so `0 <= Remaining <= Limit` always holds: for GCRA and the
//!   leaky bucket it is the capacity (the burst), and `w` the time an empty bucket takes to
//!   refill completely (burst × emission interval, rounded up to whole seconds), so `q / w` is
//!   the sustained rate ("1 per second, burst 10" is `q=10;w=10`); window algorithms report
//!   `limit` and the period.
//! - 429 responses carry `Cache-Control: no-store` (RFC 6585 §4) and, by default
//!   ([`ProblemJson`]), an RFC 9457 `application/problem+json` body with the quota-exceeded type
//!   of the draft and `violated-policies`. A [`Rejection`] replaces the body; the layer still
//!   sets the rate-limit headers, `Retry-After`, `Cache-Control` and `Content-Length` (the
//!   body's length in bytes) on whatever it returns, each exactly once.
//! - The `503 Service Unavailable` of a store that cannot decide and fails closed
//!   ([`FailurePolicy::Deny`](ratekeeper_core::store::FailurePolicy::Deny)) is an RFC 9457
//!   `application/problem+json` body of the [`TEMPORARY_REDUCED_CAPACITY_TYPE`] with a plain
//!   `detail`, `Retry-After` (delay-seconds, rounded up, at least 1: by default 1, see
//!   [`RateLimitBuilder::unavailable_retry_after`](crate::RateLimitBuilder::unavailable_retry_after))
//!   and `Cache-Control: no-store`, and no rate-limit fields (the store could not say what
//!   is left). A [`Rejection`] does not change it: it is not a rate limit.
//!
//! Every header is written with `insert`, never `append`, so each appears once. A 429's
//! rate-limit fields replace whatever the [`Rejection`] set. On a response from the inner
//! service, which may already report a limit (an inner ratekeeper layer, say a per-route
//! `route_layer` inside a global `Router::layer`, or a handler passing on an upstream's
//! fields), the `X-RateLimit-*` and legacy `RateLimit-*` fields keep the earlier report when
//! it is complete (limit and remaining are numbers, reset a number or absent) and more
//! restrictive: fewer remaining, or as many and a later reset, compared in seconds whether
//! each side writes delta seconds or a Unix time. Otherwise this layer's three values replace
//! it. The IETF `RateLimit` / `RateLimit-Policy` fields append this layer's item to the policy
//! lists already there (every field line that starts with a quoted name), on one line.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::body::Bytes;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::report::{HeaderStyle, Limited, PartitionKey};
//! use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("burst", Quota::per_second(NonZeroU32::new(1).unwrap())))
//!     .policy(Policy::new("daily", Quota::per_day(NonZeroU32::new(1000).unwrap())))
//!     .key(GlobalKey)
//!     .headers(HeaderStyle::Ietf)
//!     .partition_key(PartitionKey::salted("demo-salt"))
//!     .rejection(|limited: &Limited<'_>| {
//!         let mut res = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
//!         *res.status_mut() = limited.status();
//!         res
//!     })
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//!
//! let ok = svc.clone().oneshot(Request::new(String::new())).await?;
//! // SHA-256("demo-salt" 0x00 "global"), first 16 bytes, base64.
//! let pk = "pk=:pGNiczWVHyujjdM1jL6klw==:";
//! assert_eq!(
//!     ok.headers()["ratelimit-policy"],
//!     format!("\"burst\";q=1;w=1;{pk}, \"daily\";q=1000;w=86400;{pk}").as_str()
//! );
//! assert_eq!(ok.headers()["ratelimit"], format!("\"burst\";r=0;t=1;{pk}, \"daily\";r=999;t=87;{pk}").as_str());
//!
//! let limited = svc.clone().oneshot(Request::new(String::new())).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "1");
//! assert_eq!(limited.headers()["cache-control"], "no-store");
//! # Ok(())
//! # }
//! ```
//!
//! # gRPC
//!
//! gRPC clients read an HTTP 429 as `UNAVAILABLE`, and an HTTP 503 or 400 as `UNAVAILABLE` or
//! `INTERNAL`, without the reason. So a layer that serves gRPC (turned on with
//! [`RateLimitBuilder::grpc`](crate::RateLimitBuilder::grpc) or
//! [`ConcurrencyLimitLayer::grpc`](crate::concurrency::ConcurrencyLimitLayer::grpc); off by
//! default) answers a gRPC call it refuses itself (the rate limit, the keyed concurrency
//! limit, the fail-closed answer, a request without a key) with a gRPC trailers-only
//! response instead. A gRPC call is recognised by its protocol's grammar:
//! `content-type: application/grpc` or `application/grpc+<format>` on an HTTP/2 request, or a
//! gRPC-Web type (`application/grpc-web`, `application/grpc-web-text`, optional
//! `+<format>`) on any HTTP version. The answer is HTTP `200 OK`, the call's own
//! `content-type`, an empty body, and
//!
//! | layer's answer | `grpc-status` | `grpc-message` |
//! |---|---|---|
//! | 429, limited | `8` (`RESOURCE_EXHAUSTED`) | `rate limit "<policy>" exceeded; retry after <n> s` |
//! | 429, the cost can never fit | `8` (`RESOURCE_EXHAUSTED`) | `rate limit "<policy>" exceeded: the request costs more than the policy can ever allow; do not retry` |
//! | 503, store failed closed | `14` (`UNAVAILABLE`), with `retry-after` and `RetryInfo` | `rate limiter unavailable` |
//! | 400, no key | `3` (`INVALID_ARGUMENT`) | the key error |
//! | 500, misconfigured key | `13` (`INTERNAL`) | the key error |
//!
//! `<policy>` is the policy the rate-limit fields report and `<n>` the `Retry-After` seconds.
//! The `grpc-message` is percent-encoded as the gRPC over HTTP/2 protocol requires (bytes
//! outside printable ASCII, and `%`, as `%XX`). A limited call also carries the retry
//! information as response metadata: `retry-after` (seconds), the rate-limit fields of the
//! configured [`HeaderStyle`], `cache-control: no-store`, and `grpc-status-details-bin`, a
//! `google.rpc.Status` of the same code and message whose one detail is a
//! `google.rpc.RetryInfo` with `retry_delay` set to the `Retry-After` seconds (what
//! `tonic-types`' `StatusExt::get_details_retry_info` reads). A cost that can never fit stays
//! `RESOURCE_EXHAUSTED` (it is a quota denial, as its HTTP answer is a 429) but has no
//! `retry-after` and no `RetryInfo`: no wait makes it pass, so clients should not retry it.
//! A [`Rejection`]'s status and body are not used for gRPC calls (gRPC has no body for an
//! error); the fields it sets stay unless the layer writes them. Requests of other content
//! types, and every request the layer lets through, are untouched: the `content-type` is
//! read only when the layer answers. A layer that does not serve gRPC (the default) answers
//! every refusal with its HTTP status whatever the `content-type` says: otherwise any client
//! of a plain HTTP service could turn its own 429 into a `200` that access logs and proxies
//! do not count as a refusal.
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::{key::GlobalKey, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("calls", Quota::per_minute(NonZeroU32::new(1).unwrap())))
//!     .key(GlobalKey)
//!     .grpc(true)
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//! let grpc_call = || {
//!     Request::builder()
//!         .version(axum::http::Version::HTTP_2)
//!         .uri("/helloworld.Greeter/SayHello")
//!         .header("content-type", "application/grpc")
//!         .body(String::new())
//! };
//!
//! let ok = svc.clone().oneshot(grpc_call()?).await?;
//! assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
//!
//! let limited = svc.clone().oneshot(grpc_call()?).await?;
//! assert_eq!(limited.status(), StatusCode::OK);
//! assert_eq!(limited.headers()["content-type"], "application/grpc");
//! assert_eq!(limited.headers()["grpc-status"], "8");
//! assert_eq!(
//!     limited.headers()["grpc-message"],
//!     "rate limit \"calls\" exceeded; retry after 60 s"
//! );
//! assert_eq!(limited.headers()["retry-after"], "60");
//! assert!(limited.headers().contains_key("grpc-status-details-bin"));
//! # Ok(())
//! # }
//! ```
mod grpc;
mod headers;
pub(crate) mod json;
mod partition_key;
mod problem;
mod reporter;
mod template;
#[cfg(test)]
mod tests;
mod unavailable;
mod unkeyed;

pub(crate) use grpc::{grpc_content_type, trailers_only};
pub use headers::{HeaderStyle, ResetFormat};
pub use partition_key::PartitionKey;
pub(crate) use problem::ProblemParts;
pub use problem::{Limited, ProblemJson, Rejection};
pub(crate) use reporter::Reporter;
pub use unavailable::TEMPORARY_REDUCED_CAPACITY_TYPE;
pub(crate) use unavailable::{DEFAULT_UNAVAILABLE_RETRY_AFTER, Unavailable};
pub use unkeyed::Unkeyed;

/// The problem type of a 429 (draft-ietf-httpapi-ratelimit-headers, IANA HTTP problem types).
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
