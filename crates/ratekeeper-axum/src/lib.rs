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
//! use ratekeeper_axum::{core::Quota, RateLimitLayer};
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
//!
//! # One dependency, one path per item
//!
//! An axum app needs `ratekeeper-axum` and `axum` only. This crate is a facade with one rule:
//! it re-exports `ratekeeper_tower`'s public items **at the same paths** (the root items
//! [`RateLimitLayer`], [`RateLimitBuilder`], [`RateLimit`], [`BuildError`],
//! [`RequestParts`], [`StoreDegraded`], and the modules [`key`], [`cost`], [`policy`],
//! [`route`], [`report`], [`rate_limit`], [`concurrency`], [`headers`], [`metrics`], ...),
//! including [`core`], the whole of `ratekeeper_core` (quotas, policies, keys, stores,
//! clocks: `core::Quota`, `core::store::MemoryStore`), and adds [`extract`] for handlers.
//! Every item has exactly one path here, the path it has in `ratekeeper_tower`, so an
//! example written for one crate reads the same with the other. HTTP types come from
//! `axum::http`. Every example on these pages uses only those paths (and
//! `tower::ServiceExt` to send a request by hand, as axum's own docs do).
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::{Router, routing::get};
//! use ratekeeper_axum::key::{ForwardedIp, UserKey};
//! use ratekeeper_axum::{core::Algorithm, report::HeaderStyle, core::Key, core::Policy, core::Quota, RateLimitLayer};
//!
//! /// What your authentication layer inserts into the request extensions.
//! #[derive(Clone)]
//! struct User(u64);
//!
//! // Per user when the auth layer set one, else per client IP behind a proxy at 127.0.0.1.
//! let key = UserKey::new(|u: &User| Key::from(u.0))
//!     .or(ForwardedIp::trusting(["127.0.0.1/32".parse()?]));
//! let search = Policy::new("search", "60/m".parse()?)
//!     .with_algorithm(Algorithm::SlidingWindow);
//! let limit = RateLimitLayer::builder()
//!     .policy(search)
//!     .policy(Policy::new("all", Quota::per_second(NonZeroU32::new(20).unwrap())))
//!     .key(key)
//!     .headers(HeaderStyle::Ietf)
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/search", get(|| async { "results" }))
//!     .layer(limit);
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # `layer` and `route_layer`, header styles, the extractor
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
//! use ratekeeper_axum::report::HeaderStyle;
//! use ratekeeper_axum::{key::GlobalKey, core::Policy, core::Quota, extract::RateLimitInfo, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let api = RateLimitLayer::builder()
//!     .policy(Policy::new("burst", Quota::per_second(NonZeroU32::new(2).unwrap())))
//!     .key(GlobalKey)
//!     .headers(HeaderStyle::Ietf)
//!     .request_info(true) // for the RateLimitInfo extractor
//!     .build()?;
//! let app = Router::new()
//!     .route("/api", get(|info: RateLimitInfo| async move { info.remaining().to_string() }))
//!     .route_layer(api); // unmatched paths are not charged
//!
//! let res = app.clone().oneshot(Request::get("/api").body(Body::empty())?).await?;
//! assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=2;w=1");
//! assert_eq!(res.headers()["ratelimit"], "\"burst\";r=1;t=1");
//! let missing = app.clone().oneshot(Request::get("/nope").body(Body::empty())?).await?;
//! assert_eq!(missing.status(), StatusCode::NOT_FOUND);
//! assert!(missing.headers().get("ratelimit").is_none());
//! # Ok(())
//! # }
//! ```
//!
//! # Modes, fallback and concurrency
//!
//! - [`rate_limit::Mode`]: `Reject` (default), `Delay { max_wait }` (throttle) or `Shadow`
//!   (report, never block), set with `RateLimitBuilder::mode`.
//! - [`RateLimitLayer::with_fallback`]: limited requests are answered by another handler
//!   (`handler.with_state(())`) instead of a 429, marked `RateLimit-Degraded`.
//! - [`report::Rejection`]: replace the problem+json 429 body.
//! - [`concurrency::ConcurrencyLimitLayer`]: at most n requests in flight per key, until the
//!   response body ends; a WebSocket or other upgrade keeps its slot for the whole session
//!   when its handler calls [`concurrency::UpgradeSlot::keep`].
//! - [`ConcurrencyLimitLayer::adaptive`](concurrency::ConcurrencyLimitLayer::adaptive): an in-flight limit found from observed latency
//!   (gradient controller), with priority partitions that keep their share under overload.
//!
//! # One limit for the whole app, at the lowest cost
//!
//! `Router::layer` wraps every route in the layer and boxes it again, and axum boxes the
//! layer's response body once more, on top of the layer's own work; a rejected request is
//! routed before it is refused. A limit that applies to every request alike (a peer-IP or
//! API-key budget, no per-route costs) can wrap the whole router instead, tower style: a 429
//! then never reaches the router, and `Body::from` unwraps the layer's body without boxing
//! it:
//!
//! ```
//! use std::net::SocketAddr;
//! use std::num::NonZeroU32;
//! use axum::{Router, body::Body, extract::ConnectInfo, http::Request, routing::get};
//! use ratekeeper_axum::{core::Quota, RateLimitLayer};
//! use tower::{Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let app = Router::new().route("/", get(|| async { "hello" }));
//! let limit = RateLimitLayer::new(Quota::per_minute(NonZeroU32::new(10).unwrap()));
//! let mut svc = ServiceExt::<Request<Body>>::map_response(limit.layer(app), |res| {
//!     res.map(Body::from)
//! });
//! // Served with `axum::serve(listener, axum::ServiceExt::<Request<Body>>::
//! // into_make_service_with_connect_info::<SocketAddr>(svc))`; here, one request by hand.
//! let mut req = Request::new(Body::empty());
//! req.extensions_mut().insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 4321))));
//! let res = ServiceExt::<Request<Body>>::ready(&mut svc).await?.call(req).await?;
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "9");
//! # Ok(())
//! # }
//! ```
//!
//! Route-aware features ([`route::RouteTable`], `MatchedPath`) need the layer inside the
//! router: use `Router::layer` or `route_layer` for those.
//!
//! # Recipes: who is limited, and what a request costs
//!
//! | need | use | runnable example |
//! |---|---|---|
//! | a tighter limit or a higher cost on an expensive route | [`route::RouteTable`], keyed by the axum route template (`MatchedPath`), so no path spelling bypasses it | `per_route_cost` |
//! | users behind one NAT IP get their own budgets | [`key::UserKey`] (the principal your auth layer inserts) `.or(PeerIp::new())` for anonymous requests, in a layer inside the auth layer; outside it, a per-IP limit counting only `401`s ([`policy::Settle::COUNT_UNAUTHORIZED`]) so token guessing is limited too | `nat_users` |
//! | tiers (free 60/min, paid 1000/min) | [`policy::resolve_fn`] picking policies per request | `tiers` |
//! | clients behind a load balancer or proxy | [`key::ForwardedIp`], which trusts `X-Forwarded-For` / `Forwarded` only from proxies you list | |
//! | an API key | [`key::HeaderKey`], validated to a principal so rotated or empty keys get no fresh budget | |
//! | a cheaper answer (a stale cache) instead of a 429 on one route | [`RateLimitLayer::with_fallback`] on that route only: `.route("/prices", get(prices).route_layer(layer))`; under `Router::layer` the fallback would also answer a limited client's 404s and 405s | `degraded_fallback` |
//! | a cost known only from the response (the tokens a model generated, a streamed answer) | the estimate charged first, then settled with [`RateLimitBuilder::usage`] from a header, a trailer or the streamed body ([`usage`]) | `llm_tokens` |
//! | limits from a configuration file | `config::LayerConfig::from_toml` (features `serde` and `toml`) | `from_config` |
//! | metrics for Prometheus, usage analysis | the `metrics` crate's names in [`rate_limit`] (`ratekeeper_decisions_total`, `ratekeeper_usage_ratio`, ...) and an exporter | `observability` |
//! | one budget shared by many app instances | the Redis store, feature `redis`: `core::store::redis::RedisStore` | `distributed` |
//! | throttle calls *to* another rate-limited API | `core::throttle::Throttle` (core feature `tokio`) | `outbound_throttle` |
//! | an HTTP client that waits when a server says nothing is left (`Retry-After`, `RateLimit`, `X-RateLimit-*`) | [`client::PoliteLayer`] around hyper's client or any tower HTTP service | `polite_client` |
//! | a tonic (gRPC) service | the same [`RateLimitLayer`] on tonic's axum router, built with `.grpc(true)` (off by default): limited calls get `RESOURCE_EXHAUSTED` with the retry time, not an HTTP 429 ([`report`](crate::report#grpc)) | `grpc` |
//!
//! The examples are in the ratekeeper repository. Run the in-memory ones with
//! `ADDR=127.0.0.1:3000 cargo run --example <name>`; those with heavier dependencies are
//! packages of their own: `-p ratekeeper-examples-redis` (`distributed`, `observability`),
//! `-p ratekeeper-examples-grpc` (`grpc`), `-p ratekeeper-examples-client` (`polite_client`,
//! `outbound_throttle`) and `-p ratekeeper-examples-config` (`from_config`).
//!
//! # Features
//!
//! None is on by default; each only adds API.
//!
//! | feature | adds |
//! |---|---|
//! | `redis` | the Redis and tiered stores, `core::store::redis` and `core::store::tiered` (`ratekeeper-core`'s `redis` feature) |
//! | `serde` | `config`: a layer's settings as `serde` types, and `Quota`/`Policy`/`Algorithm` deserialisation (`ratekeeper-tower`'s `serde`) |
//! | `toml` | `config::LayerConfig::from_toml`: a layer from a TOML document (turns on `serde`) |

// docs.rs (`--cfg docsrs`, nightly rustdoc): "available on crate feature ..." badges on
// feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod extract;

/// A layer from a configuration file (feature `serde`; `toml` reads TOML).
#[cfg(feature = "serde")]
pub use ratekeeper_tower::config;
pub use ratekeeper_tower::{
    BuildError, RateLimit, RateLimitBuilder, RateLimitLayer, RequestParts, StoreDegraded, adaptive,
    body, client, concurrency, core, cors, cost, headers, info, key, metrics, policy, rate_limit,
    report, route, usage,
};
