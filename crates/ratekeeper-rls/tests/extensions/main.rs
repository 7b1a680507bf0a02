//! The extensions of the config format that envoyproxy/ratelimit does not have (algorithms
//! and periods per limit, IETF headers and problem details, all-or-nothing charging), each
//! checked over a real gRPC client against the running server, on the memory store and on a
//! `redis-server` the test starts.

#[path = "../../../../tests/support/redis.rs"]
#[allow(dead_code, unreachable_pub, missing_docs)]
mod redis_support;

#[path = "../conformance/support.rs"]
#[allow(dead_code, unreachable_pub, unused_imports, unused_macros)]
mod support;

mod algorithms;
mod all_or_nothing;
mod config;
mod fleet;
mod headers;
mod memory;
mod redis_clock;
mod store_failure;
mod tiered;
