//! An Envoy rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on ratekeeper,
//! meant as a drop-in for [envoyproxy/ratelimit](https://github.com/envoyproxy/ratelimit).
//!
//! - [`config`]: the reference's YAML files, read unchanged (same keys, same matching rules,
//!   every error with `file:line:column`), and their hot reload ([`config::watch`]).
//! - [`settings`]: the binary's flags and the reference's environment variables.
//! - [`compat`]: every difference from the reference, with its reason, and the extensions
//!   (keys and settings the reference's files do not use: `algorithm`, `period`,
//!   `charging`, `on_store_failure`, IETF headers, problem details, bounds on memory and
//!   leases).
//! - [`Server`]: the running service (the `ratekeeper-rls` binary is `Server::bind` plus
//!   SIGTERM): gRPC `ShouldRateLimit` and `grpc.health.v1` (services `""` and `ratelimit`),
//!   HTTP `/healthcheck` and `/json`, debug `/rlconfig`, `/metrics` and `/healthcheck`, and the
//!   Prometheus listener when enabled; hot reload; a graceful stop.
//! - [`service`]: how `ShouldRateLimit` answers (rules, hits, modes, headers, metadata) and
//!   [`service::RateLimiter`], the tonic service to mount in a server of your own.
//! - [`stats`]: the reference's metric names, with a cap on label series.
//!
//! Counting goes through ratekeeper-core's stores: a fixed window of `unit` seconds aligned on
//! the Unix epoch per (rule, descriptor values), as the reference counts, or the rule's own
//! `algorithm` and `period` (extensions, see [`compat`]), in memory (the default: nothing
//! else has to run), in Redis (standalone or Cluster) or in the tiered store. Descriptor
//! values, which may be credentials, reach a store key only hashed and a metric label only
//! under `detailed_metric`.
//!
//! **The tiered store** (`--store tiered`): each replica leases up to `TIERED_MAX_LEASE`
//! units (default 100) per counter from Redis and spends them without a round trip. Leased
//! units are charged in Redis, and a replica spends them only within the window they were
//! charged in by its own reading of the window's end, so a fleet of `R` replicas admits at
//! most `requests_per_unit + R × TIERED_MAX_LEASE` per window of Redis time (the excess is
//! units a replica still spends just after Redis's window turned over). The Redis store
//! admits at most `requests_per_unit`.
//!
//! ```
//! use ratekeeper_rls::config::{LoadOptions, Lookup, RateLimitConfig};
//!
//! let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";
//! let config = RateLimitConfig::from_sources([("api.yaml", yaml)], &LoadOptions::default())?;
//! let Lookup::Limit(m) = config.lookup("api", &[("user", "alice")]) else { panic!("no limit") };
//! assert_eq!(m.rule.requests_per_unit, 60);
//! # Ok::<(), ratekeeper_rls::config::ConfigError>(())
//! ```

mod clock;
pub mod compat;
pub mod config;
mod http;
mod limiter;
mod server;
pub mod service;
pub mod settings;
pub mod stats;

pub use clock::UnixClock;
pub use server::{MEMORY_MAX_KEYS, Server, ServerBuilder, ServerError};
