//! Rate-limit middleware: [`RateLimitLayer`](crate::RateLimitLayer) and the [`RateLimit`](crate::RateLimit) service.
//!
//! For each request the service extracts a key (default: the peer IP, IPv6 by /64), computes
//! a cost (default 1), and checks every policy in the store all-or-nothing, in `call`.
//! Allowed requests go to the inner service and get rate-limit headers on the response;
//! denied ones get a `429 Too Many Requests` with `Retry-After` (whole seconds, rounded up),
//! the headers, `Cache-Control: no-store` and an RFC 9457 problem+json body, without the
//! inner service being called. All clones share one state, and `poll_ready` never
//! consumes quota.
//!
//! With [`RateLimitBuilder::request_info`](crate::RateLimitBuilder::request_info), requests that pass carry an [`Info`](crate::info::Info)
//! extension with the decisions. Every decision is counted once in the `metrics` counter
//! [`DECISIONS_TOTAL`](crate::metrics::DECISIONS_TOTAL) (`ratekeeper_decisions_total{policy, outcome}`), whatever the mode
//! and whether the store answers at once or later, and recorded in the [`USAGE_RATIO`](crate::metrics::USAGE_RATIO)
//! histogram (`ratekeeper_usage_ratio{policy}`: the share of the capacity used, 0.0 to 1.0);
//! in [`Mode::Shadow`], [`SHADOW_CHECKED_TOTAL`](crate::metrics::SHADOW_CHECKED_TOTAL) and
//! [`SHADOW_WOULD_REFUSE_TOTAL`](crate::metrics::SHADOW_WOULD_REFUSE_TOTAL) give the
//! share of requests a trial limit would refuse. A policy with a
//! [`Ban`](ratekeeper_core::Ban) counts each ban it starts in [`BANS_TOTAL`](crate::metrics::BANS_TOTAL)
//! (`ratekeeper_bans_total{policy}`), once per ban.
//!
//! # Logs
//!
//! `tracing` events: one INFO event (target `ratekeeper`) when a layer is built, naming its
//! policies (name, quota, algorithm), key, store, header style and mode; a one-time WARN
//! (target `ratekeeper`) when a layer keyed by the peer address sees `X-Forwarded-For` or
//! `Forwarded` from a private or loopback peer ([`RateLimitBuilder::warn_forwarded`](crate::RateLimitBuilder::warn_forwarded)); one
//! DEBUG event per decision (target `ratekeeper::decision`: policy, outcome, cost,
//! remaining, limit, mode, and the key hashed unless [`RateLimitBuilder::log_raw_keys`](crate::RateLimitBuilder::log_raw_keys)),
//! checked with `tracing::enabled!` so it costs a level check when DEBUG is off; one INFO
//! event (target `ratekeeper`) per ban a policy starts (policy, key hashed unless raw keys,
//! seconds), not per request the ban refuses; and one
//! DEBUG event per request a failing store could not decide (the Redis store logs the outage
//! itself, once per circuit-breaker transition). Over the limit, [`Mode`] decides: reject
//! (default), wait within a bound ([`Mode::Delay`]) or only report ([`Mode::Shadow`]);
//! [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback) answers rejected requests with another service instead
//! of a 429 (see [`FallbackLayer`]), and [`RateLimitBuilder::rejection`](crate::RateLimitBuilder::rejection) replaces the
//! 429 body (see [`report`](crate::report)).
//!
//! When a shared store cannot decide (Redis slow or down), its failure policy
//! ([`FailurePolicy`](ratekeeper_core::store::FailurePolicy), carried by
//! [`StoreError::Failed`](ratekeeper_core::store::StoreError::Failed)) chooses: the request goes
//! on without rate-limit headers and with a
//! [`StoreDegraded`](crate::StoreDegraded) request extension (fail open, or
//! degrade: the hook a fallback reads), or the layer answers `503 Service Unavailable` (fail
//! closed: not a 429, the client exceeded nothing) with `Retry-After` (1 s by default, see
//! [`RateLimitBuilder::unavailable_retry_after`](crate::RateLimitBuilder::unavailable_retry_after)), `Cache-Control: no-store` and a
//! problem+json body of the
//! [`TEMPORARY_REDUCED_CAPACITY_TYPE`](crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE).
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_core::Quota;
//! use ratekeeper_tower::key::PeerAddr;
//! use ratekeeper_tower::RateLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(Quota::per_minute(NonZeroU32::new(2).unwrap())))
//!     .service_fn(|_req: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("hello")))
//!     });
//!
//! let request = || {
//!     let mut req = Request::new(String::new());
//!     req.extensions_mut().insert(PeerAddr("192.0.2.1:5000".parse().unwrap()));
//!     req
//! };
//! let ok = svc.clone().oneshot(request()).await.unwrap();
//! assert_eq!(ok.status(), StatusCode::OK);
//! assert_eq!(ok.headers()["x-ratelimit-remaining"], "1");
//! svc.clone().oneshot(request()).await.unwrap();
//! let limited = svc.clone().oneshot(request()).await.unwrap();
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "30");
//! assert_eq!(limited.headers()["content-type"], "application/problem+json");
//! # }
//! ```

//! # Structure
//!
//! One request, one ticket: `call` asks the private `Limiter` (`limiter/`: the request
//! side in `mod.rs`, the response side in `respond.rs`) to `prepare`
//! the request into a `Ticket` (`ticket.rs`: key and charges, partition key, Delay-mode
//! deadline, and where a refusal goes, `answer.rs`), which then moves through the path
//! until its settlement after the response. One function (`dispatch` in `future.rs`)
//! asks the limiter for the verdict on the store's answer and picks what follows (call the
//! inner service, hand the request to the fallback, answer, wait), both inside `call` (the memory store: nothing is held or
//! cloned) and in the [`ResponseFuture`] (an async store, Delay-mode waits). Every answer
//! gets its form (HTTP or gRPC) from the ticket's refusal, in one function. Imports run one
//! way:
//!
//! ```text
//! builder ──> layer ──> service ──> future ──> limiter ──> ticket ──> answer
//! fallback/ ────┘    └───────────┴──> inner ──> fallback/degrade <──┘
//!                                                 limiter ──> mode, meter, diag
//! ```
//!
//! Each file imports only files to its right. `limiter` uses `policy`, `report`, `key`,
//! `cost`, `info`, `degraded` and `usage` (a charge settled from the response: the
//! settlement hands the response body what it must count, `body.rs` carries it until the
//! body ends). None of those imports `rate_limit`. What the service calls is an [`Inner`]
//! (`inner.rs`): any tower service, or the inner service with the degraded-response
//! [`Fallback`] (`fallback/`: [`FallbackLayer`], made by
//! [`RateLimitLayer::with_fallback`](crate::RateLimitLayer::with_fallback)), to which the limiter's verdict hands a refused
//! request with its `Degrade` (policy and reason) in a typed call: no request extension, no
//! flag on the service.
//! Beside the request path, `admin.rs` ([`Admin`], made by the layer) reads the limiter's
//! store, policy ids and names, and imports nothing else of `rate_limit`.

mod admin;
mod answer;
mod boxed;
pub(crate) mod builder;
mod degrade;
mod diag;
mod fallback;
mod future;
mod inner;
pub(crate) mod layer;
mod limiter;
mod meter;
mod mode;
pub(crate) mod service;
#[cfg(test)]
mod tests;
mod ticket;

pub use admin::{Admin, AdminError, PolicyState};
pub use boxed::{BoxRateLimit, BoxRateLimitLayer};
pub use fallback::{Fallback, FallbackFuture, FallbackLayer};
pub use future::ResponseFuture;
pub use inner::Inner;
pub use mode::Mode;
