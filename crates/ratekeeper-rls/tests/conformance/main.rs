//! Conformance of `ShouldRateLimit` with envoyproxy/ratelimit's behaviour, over a real gRPC
//! client on loopback against the running server, on the memory store and on a
//! `redis-server` the test starts (each behaviour is one `memory` and one `redis` test).

#[path = "../../../../tests/support/redis.rs"]
#[allow(dead_code, unreachable_pub, missing_docs)]
mod redis_support;

mod support;

mod addends;
mod e2e;
mod errors;
mod lookups;
mod modes;
mod stores;
