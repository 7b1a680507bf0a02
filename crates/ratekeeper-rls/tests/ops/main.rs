//! Operations of the running service: health (HTTP and gRPC), `/rlconfig`, `/json`, the
//! Prometheus metrics and their names, hot reload, and the graceful stop (library and
//! binary, SIGTERM). Its own test binary: the metrics recorder is per process, and the
//! config-load counters here count this binary's loads only.

#[path = "../../../../tests/support/redis.rs"]
#[allow(dead_code, unreachable_pub, missing_docs)]
mod redis_support;

#[path = "../conformance/support.rs"]
#[allow(dead_code)]
mod support;

mod health;
mod metrics;
mod reload;
mod stop;
