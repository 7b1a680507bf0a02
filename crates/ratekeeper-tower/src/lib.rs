//! # ratekeeper-tower
//!
//! HTTP rate limiting as a [`tower`](https://docs.rs/tower) layer, generic over request and
//! response bodies, so it works for axum, hyper and tonic services.
//!
//! ```
//! use std::num::NonZeroU32;
//! use ratekeeper_core::Quota;
//! use ratekeeper_tower::RateLimitLayer;
//!
//! // 10 requests per minute per client IP, burst 10, in memory.
//! let layer = RateLimitLayer::new(Quota::per_minute(NonZeroU32::new(10).unwrap()));
//! # let _ = layer;
//! ```
//!
//! See [`rate_limit`] for a complete example (and its modes and fallback), [`key`] for who is
//! limited, [`cost`] for what a request costs, [`policy`] for choosing policies per request
//! (tiers, per-policy keys, exemptions, refunds after the response), [`route`] for per-route
//! costs and limits keyed by route template, [`cors`] for preflights,
//! [`RateLimitLayer::with_fallback`] for answering limited requests with another service,
//! [`StoreDegraded`] for the marker on requests the store could not decide,
//! [`RequestParts`] for the request view closure strategies get, [`headers`] and [`metrics`]
//! for every field and metric name the crate uses,
//! [`report`] for the headers and 429 bodies clients see, [`info`] for reading the decision in a handler and
//! [`usage`] for charges settled from the response (tokens a model generated, read from a
//! header, a trailer or the streamed body), [`concurrency`] for the keyed concurrency limit, [`adaptive`] for a concurrency limit
//! found from latency, with priority partitions. For the other side, [`client`] makes an HTTP
//! client wait when a server says nothing is left.
//!
//! The examples import from this crate, `ratekeeper_core` (quotas, policies, keys, stores,
//! clocks; also at [`core`]) and `http`; some build an axum `Router` to show the layer in an
//! app. An axum app can depend on `ratekeeper-axum` alone, which re-exports this crate's
//! modules at the same paths (`ratekeeper_tower::key::UserKey` is also reachable there as
//! `key::UserKey`) and adds an extractor for handlers.
//!
//! Each public item has one path: the root holds [`RateLimitLayer`], [`RateLimitBuilder`],
//! [`RateLimit`], [`BuildError`], [`RequestParts`] and [`StoreDegraded`] (and [`core`], the
//! `ratekeeper_core` crate); every other item lives in its module only.
//!
//! Design note: headers and problem+json bodies are rendered here rather than in
//! `ratekeeper-axum`, because they are plain `http` and hyper and tonic users need them too;
//! `ratekeeper-axum` re-exports this crate and adds axum-only pieces.
//!
//! # Features
//!
//! None is on by default; each only adds API.
//!
//! | feature | adds |
//! |---|---|
//! | `axum` | [`PeerIp`](key::PeerIp) also reads axum's `ConnectInfo<SocketAddr>`; [`route`] reads axum's `MatchedPath` |
//! | `serde` | `config`: a layer's settings (policies, key, routes and costs, tiers, exemptions, headers, mode) as `serde` types |
//! | `toml` | `config::LayerConfig::from_toml`: those settings from a TOML document, errors with file, line, column and field (turns on `serde`) |

// docs.rs (`--cfg docsrs`, nightly rustdoc): "available on crate feature ..." badges on
// feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[macro_use]
mod macros;

pub mod adaptive;
pub mod body;
pub mod client;
pub mod concurrency;
#[cfg(feature = "serde")]
pub mod config;
pub mod cors;
pub mod cost;
mod degraded;
mod error;
pub mod headers;
pub mod info;
pub mod key;
pub mod metrics;
pub mod policy;
pub mod rate_limit;
pub mod report;
mod request;
pub mod route;
mod type_name;
pub mod usage;

pub use degraded::StoreDegraded;
pub use error::BuildError;
pub use rate_limit::builder::RateLimitBuilder;
pub use rate_limit::layer::RateLimitLayer;
pub use rate_limit::service::RateLimit;
pub use ratekeeper_core as core;
pub use request::RequestParts;
