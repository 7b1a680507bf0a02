//! The quickstart limits (10 requests per minute per client IP, burst 10) on Redis: every
//! instance started with the same `REDIS_URL` shares one budget per client IP.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-redis --example distributed &
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3001 cargo run -p ratekeeper-examples-redis --example distributed &
//! for i in $(seq 6); do
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3000/
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3001/
//! done
//! ```
//!
//! The twelve requests alternate between the two instances; the remaining count goes down
//! 9, 8, ... 0 across both, and the last two are 429s.
//!
//! With `LEASE=<units>` (for example `LEASE=5`) each instance uses the tiered store instead:
//! for a busy client it leases up to that many units from Redis at a time and spends them
//! locally, so most requests skip the round trip; a client that is not busy is still decided
//! by Redis on every request. Both instances still share the one budget: Redis charges the
//! units when they are leased, so across both at most 10 requests pass in the minute (the
//! `x-ratelimit-remaining` of a lease-holding instance counts its held units as remaining).
//!
//! ```text
//! LEASE=5 REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-redis --example distributed &
//! LEASE=5 REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3001 cargo run -p ratekeeper-examples-redis --example distributed &
//! for i in $(seq 10); do
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/ &
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3001/ &
//! done | sort | uniq -c    # 10 × 200 and 10 × 429 across both instances
//! ```

use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota};

/// The Redis URL: the `REDIS_URL` environment variable, or `redis://127.0.0.1:6379/`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// The `LEASE` setting from the environment (see [`parse_lease`]; unset: `None`).
///
/// # Errors
///
/// When `LEASE` is set to something other than a whole number.
pub fn lease_setting() -> Result<Option<NonZeroU32>, String> {
    std::env::var("LEASE").map_or(Ok(None), |v| parse_lease(&v))
}

/// A `LEASE` value: the most units an instance leases at a time, a whole number; empty or
/// `0` means no leases (every decision is a Redis round trip).
///
/// # Errors
///
/// When `value` is not a whole number.
pub fn parse_lease(value: &str) -> Result<Option<NonZeroU32>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    value
        .parse::<u32>()
        .map(NonZeroU32::new)
        .map_err(|e| format!("LEASE={value:?}: not a whole number of units ({e})"))
}

/// The quickstart limits (10 requests per minute per client IP, burst 10) on the Redis
/// server at `redis_url`, so every instance of the app started with the same URL shares one
/// budget per client IP. Decisions have a 50 ms deadline; when Redis is down the app fails
/// open.
///
/// # Errors
///
/// When the URL is invalid or the layer cannot be built.
pub async fn app(redis_url: &str) -> Result<Router, Box<dyn std::error::Error>> {
    app_with_lease(redis_url, None).await
}

/// [`app`], and with `lease` set, on the tiered store: each instance leases up to `lease`
/// units at a time for a busy client IP and spends them without a round trip (see
/// [`lease_setting`]).
///
/// # Errors
///
/// When the URL is invalid or the layer cannot be built.
pub async fn app_with_lease(
    redis_url: &str,
    lease: Option<NonZeroU32>,
) -> Result<Router, Box<dyn std::error::Error>> {
    app_with(redis_url, lease, Duration::from_millis(50)).await
}

/// [`app_with_lease`] with another decision deadline (after it, the app fails open).
///
/// # Errors
///
/// When the URL is invalid or the layer cannot be built.
pub async fn app_with(
    redis_url: &str,
    lease: Option<NonZeroU32>,
    deadline: Duration,
) -> Result<Router, Box<dyn std::error::Error>> {
    let redis = RedisStore::builder()
        .deadline(deadline)
        .standalone(redis_url)
        .await?;
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    let policy = Policy::new("default", quota);
    let builder = RateLimitLayer::builder().policy(policy);
    let router = Router::new().route("/", get(|| async { "hello from ratekeeper on redis\n" }));
    Ok(match lease {
        None => router.layer(builder.store(redis).build()?),
        Some(max) => {
            let tiered = TieredStore::builder().max_lease(max).build(redis)?;
            router.layer(builder.store(tiered).build()?)
        }
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::init_tracing();
    // A bad `REDIS_URL` or `LEASE` prints one sentence ("error: configuration error: the
    // Redis URL is not valid; ..."), not the error's `Debug` form.
    let lease = match lease_setting() {
        Ok(lease) => lease,
        Err(err) => {
            eprintln!("error: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let app = match app_with_lease(&redis_url(), lease).await {
        Ok(app) => app,
        Err(err) => return ratekeeper_examples::fail(&*err),
    };
    match ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => ratekeeper_examples::fail(&err),
    }
}
