//! Adaptive concurrency: an in-flight limit the layer finds itself from the latency it
//! observes, with priority partitions that keep their share under overload.
//!
//! A fixed concurrency limit protects a service only if the number was chosen well, and
//! the right number moves with deploys, hardware and downstream health.
//! An adaptive [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)
//! ([`ConcurrencyLimitLayer::adaptive`](crate::concurrency::ConcurrencyLimitLayer::adaptive): the
//! concurrency layer with an [`Adaptive`] limit) measures instead: it admits requests up to a limit, records
//! each admitted request's latency (from admission to the inner service's response), and a
//! [`GradientController`](controller::GradientController) lowers the limit when latency rises above the minimum latency
//! (`minRTT`, re-measured periodically at a low concurrency) and raises it while latency
//! stays near it. The algorithm, its sources (Envoy's adaptive concurrency filter and
//! Netflix concurrency-limits' Gradient2) and its settings are in [`controller`]'s docs.
//!
//! A request over the limit is answered at once (never queued): by default
//! `503 Service Unavailable` with `Retry-After: 1` (whole seconds, rounded up, at least 1),
//! `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body of type
//! [`TEMPORARY_REDUCED_CAPACITY_TYPE`](crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE); with
//! [`too_many_requests`](AdaptiveConcurrencyBuilder::too_many_requests), a `429` whose body
//! has the `quota-exceeded` type and names the layer as the violated policy. A layer that
//! serves gRPC ([`grpc(true)`](AdaptiveConcurrencyBuilder::grpc)) answers a refused gRPC
//! call with a trailers-only `UNAVAILABLE` (14, message
//! `server overloaded; retry after <n> s`), or `RESOURCE_EXHAUSTED` (8) with `429`, with the
//! `retry-after` metadata (see [`report`](crate::report#grpc)). The limit is not advertised
//! in rate-limit headers: it is the server's own, moving figure, not a client's quota.
//!
//! A request stays in flight until its response **body** ends (or fails, or is dropped),
//! as with every [`concurrency`](crate::concurrency) limit; its latency sample is taken when the
//! response head is ready, so a long download does not read as a slow server. A request
//! that gets no response head (the inner service returns an error, such as a timeout or a
//! reset connection, or the response future is dropped, as an outer timeout does) gives
//! its elapsed time as a failure sample
//! ([`GradientController::failure`](controller::GradientController::failure)): a service
//! that fails slowly lowers the limit to its minimum.
//!
//! # Priority partitions
//!
//! [`partition`](AdaptiveConcurrencyBuilder::partition) declares partitions with a
//! guaranteed share of the limit and [`classify`](AdaptiveConcurrencyBuilder::classify)
//! puts each request into one (a closure over the request, see [`Classify`]). A partition
//! below its share (`share × limit` requests in flight, in whole requests by the largest
//! remainder method, so the shares of 0.9 and 0.1 of a limit of 11 are 10 and 1) is always
//! admitted; one at or
//! above it may borrow free slots below the limit, except those owed to partitions with
//! recent demand (their share, or their peak in flight over the last 1 to 2 s if smaller).
//! So under overload a `critical 0.9 / sheddable 0.1` split sheds sheddable requests first
//! and keeps 90 % of the limit for critical ones, while a partition with no traffic lends
//! its whole share. The guarantee is the partitioned limiter of Netflix concurrency-limits;
//! the reservation for partitions with demand is ratekeeper's (without it a borrower whose
//! requests arrive as often as the owner's takes half of every slot that frees up). A
//! partition reclaiming its share from a borrower is admitted at once, so the requests in
//! flight can exceed the limit by at most the shares being reclaimed until the borrowed
//! requests complete.
//!
//! # Keys
//!
//! One limit covers every request by default. [`key`](AdaptiveConcurrencyBuilder::key)
//! keeps one limit per key instead (any [`KeyExtractor`](crate::key::KeyExtractor): a route,
//! a downstream, a tenant), up to [`max_keys`](AdaptiveConcurrencyBuilder::max_keys) keys;
//! further keys share one overflow limit (never unlimited). Keys are metric labels, so
//! choose a key with few values.
//!
//! # Metrics and logs
//!
//! With a `metrics` recorder installed: the gauges
//! [`ADAPTIVE_LIMIT`](crate::metrics::ADAPTIVE_LIMIT),
//! [`ADAPTIVE_IN_FLIGHT`](crate::metrics::ADAPTIVE_IN_FLIGHT),
//! [`ADAPTIVE_LATENCY_SECONDS`](crate::metrics::ADAPTIVE_LATENCY_SECONDS) and
//! [`ADAPTIVE_MIN_LATENCY_SECONDS`](crate::metrics::ADAPTIVE_MIN_LATENCY_SECONDS) (labels
//! `name`, `key`), the counter
//! [`ADAPTIVE_REQUESTS_TOTAL`](crate::metrics::ADAPTIVE_REQUESTS_TOTAL) (labels `name`,
//! `partition`, `outcome` = `admitted` | `shed`) and
//! [`ADAPTIVE_OVERFLOW_TOTAL`](crate::metrics::ADAPTIVE_OVERFLOW_TOTAL). Every change of the limit is a `DEBUG` event
//! `adaptive concurrency limit changed` with `name`, `from`, `to`, `latency_ms` and
//! `min_latency_ms`.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use axum::http::{Request, Response, StatusCode};
//! use ratekeeper_tower::RequestParts;
//! use ratekeeper_tower::concurrency::ConcurrencyLimitLayer;
//! use ratekeeper_core::clock::ManualClock;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = ConcurrencyLimitLayer::adaptive()
//!     .min_limit(2)
//!     .partition("critical", 0.5)
//!     .partition("sheddable", 0.5)
//!     .classify(|req: &RequestParts<'_>| {
//!         if req.uri().path().starts_with("/checkout") { "critical" } else { "sheddable" }
//!     })
//!     .clock(ManualClock::new())
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer.clone())
//!     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//!
//! // The layer starts by measuring the minimum latency at `min_limit` (2) requests in
//! // flight. Responses whose bodies are not read yet stay in flight.
//! let a = svc.clone().oneshot(Request::get("/browse").body(())?).await?;
//! let b = svc.clone().oneshot(Request::get("/checkout").body(())?).await?;
//! assert_eq!(a.status(), StatusCode::OK);
//! assert_eq!(b.status(), StatusCode::OK);
//!
//! let shed = svc.clone().oneshot(Request::get("/browse").body(())?).await?;
//! assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(shed.headers()["retry-after"], "1");
//! assert_eq!(shed.headers()["content-type"], "application/problem+json");
//!
//! let snapshot = layer.snapshot(&ratekeeper_core::Key::Global).unwrap();
//! assert_eq!((snapshot.limit, snapshot.in_flight), (2, 2));
//! assert!(snapshot.measuring);
//! # Ok(())
//! # }
//! ```

mod builder;
pub mod controller;
mod limiter;
mod partition;
mod state;

pub use builder::AdaptiveConcurrencyBuilder;
pub(crate) use limiter::Permit;
pub use limiter::Snapshot;
pub use partition::{Classify, Unclassified};
pub use state::Adaptive;
