//! # ratekeeper-core
//!
//! The algorithms, quotas, decisions, clocks and stores behind
//! [ratekeeper](https://crates.io/crates/ratekeeper-axum)'s HTTP rate limiting. This crate has
//! no HTTP dependency: it answers "may `key` spend `cost` units under `policy` now?".
//!
//! - [`Quota`]: `limit` per `period` with a `burst`; invalid values are [`QuotaError`]s.
//! - [`Policy`]: a named quota plus an [`Algorithm`] (GCRA by default).
//! - [`Decision`]: allowed / denied with an exact `retry_after` / can never fit, plus
//!   `limit`, `remaining` and `reset_after` for headers ([`ceil_secs`] rounds a duration up
//!   to the whole seconds a header carries).
//! - [`clock`]: the [`Clock`](clock::Clock) trait, a monotonic clock and a manual clock (and,
//!   with the `tokio` feature, a clock on tokio's time).
//! - [`store`]: the [`Store`](store::Store) trait and the in-memory [`MemoryStore`](store::MemoryStore)
//!   (and, with the `redis` feature, `store::redis::RedisStore`).
//! - [`algorithm`]: GCRA (default), leaky bucket, fixed window, sliding log, sliding window
//!   counter and a concurrency counter, with a table of their trade-offs.
//! - `throttle` (feature `tokio`): wait for capacity before calling someone else's API.
//!
//! Time is integer nanoseconds; all arithmetic saturates, so no quota, cost or clock value
//! can panic or overflow.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::clock::ManualClock;
//! use ratekeeper_core::store::{Charge, MemoryStore, Store};
//! use ratekeeper_core::{Key, Policy, Quota};
//!
//! let clock = ManualClock::new();
//! let mut store = MemoryStore::with_clock(clock.clone());
//! let quota = Quota::per_minute(NonZeroU32::new(10).unwrap());
//! let api = store.register(&Policy::new("api", quota))?;
//! let client = Key::from("198.51.100.7");
//!
//! for _ in 0..10 {
//!     assert!(store.check_now(&[Charge::new(api, &client, 1)])?.is_allowed());
//! }
//! let denied = store.check_now(&[Charge::new(api, &client, 1)])?;
//! assert_eq!(denied.retry_after(), Some(Duration::from_secs(6)));
//!
//! clock.advance(Duration::from_secs(6));
//! assert!(store.check_now(&[Charge::new(api, &client, 1)])?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//!
//! None is on by default; each only adds API.
//!
//! | feature | adds |
//! |---|---|
//! | `serde` | `Serialize`/`Deserialize` for [`Quota`] (as a string such as `"60/m burst 10"`), [`Algorithm`] (by name) and [`Policy`] |
// The links resolve only when the feature is on; without it the name is plain code.
#![cfg_attr(
    feature = "tokio",
    doc = "| `tokio` | [`throttle`]: async wait-for-capacity for outbound calls, and [`clock::TokioClock`] |"
)]
#![cfg_attr(
    not(feature = "tokio"),
    doc = "| `tokio` | `throttle`: async wait-for-capacity for outbound calls, and `clock::TokioClock` |"
)]
#![cfg_attr(
    feature = "redis",
    doc = "| `redis` | [`store::redis::RedisStore`]: the store shared by every app instance, on Redis standalone or Cluster (tokio, the `redis` crate) |"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "| `redis` | `store::redis::RedisStore`: the store shared by every app instance, on Redis standalone or Cluster (tokio, the `redis` crate) |"
)]
// docs.rs (`--cfg docsrs`, nightly rustdoc): "available on crate feature ..." badges on
// feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod algorithm;
pub mod clock;
mod decision;
mod key;
mod policy;
mod quota;
pub mod store;
#[cfg(feature = "tokio")]
pub mod throttle;

#[cfg(feature = "tokio")]
mod seconds;

pub use algorithm::kind::{Algorithm, UnknownAlgorithm};
pub use decision::{Decision, Outcome, ceil_secs};
pub use key::Key;
pub use policy::{Ban, BanAfter, Policy, PolicyError};
pub use quota::{Quota, QuotaError, QuotaParseError, QuotaPart};
