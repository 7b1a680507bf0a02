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
//! costs and limits keyed by route template, [`cors`] for preflights, [`fallback`] for
//! answering limited requests with another service, [`degraded`] for the markers on requests
//! the store could not decide, [`RequestParts`] for the request view closure strategies get,
//! [`report`] for the headers and 429 bodies clients see, [`info`] for reading the decision in a handler and
//! [`concurrency`] for the keyed concurrency limit, [`adaptive`] for a concurrency limit
//! found from latency, with priority partitions. For the other side, [`client`] makes an HTTP
//! client wait when a server says nothing is left.
//!
//! The examples in the module docs are written for axum users, who depend on
//! `ratekeeper-axum` and `axum` only: every item of this crate is at the same path there
//! (`ratekeeper_tower::key::UserKey` is `ratekeeper_axum::key::UserKey`, the core types are
//! at the root or under `ratekeeper_axum::core`), and `axum::http` is the `http` crate. With
//! hyper or tonic, import from `ratekeeper_tower`, `ratekeeper_core` and `http` instead.
//!
//! Design note: headers and problem+json bodies are rendered here rather than in
//! `ratekeeper-axum`, because they are plain `http` and hyper and tonic users need them too;
//! `ratekeeper-axum` re-exports this crate and adds axum-only pieces.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `axum` | [`PeerIp`] also reads axum's `ConnectInfo<SocketAddr>`; [`route`] reads axum's `MatchedPath` |
//! | `serde` | `config`: a layer's settings (policies, key, routes and costs, tiers, exemptions, headers, mode) as `serde` types |
//! | `toml` | `config::LayerConfig::from_toml`: those settings from a TOML document, errors with file, line, column and field |

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
pub mod degraded;
mod error;
pub mod fallback;
pub mod info;
pub mod key;
pub mod policy;
pub mod rate_limit;
pub mod report;
pub mod request;
pub mod route;
mod type_name;

pub use degraded::StoreDegraded;
pub use error::BuildError;
pub use key::{GlobalKey, KeyError, KeyExtractor, PeerIp};
pub use rate_limit::{RateLimit, RateLimitBuilder, RateLimitLayer};
pub use ratekeeper_core as core;
pub use request::RequestParts;
