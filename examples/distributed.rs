//! The quickstart limits (10 requests per minute per client IP, burst 10) on Redis: every
//! instance started with the same `REDIS_URL` shares one budget per client IP.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3000 cargo run --example distributed &
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3001 cargo run --example distributed &
//! for i in $(seq 6); do
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3000/
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3001/
//! done
//! ```
//!
//! The twelve requests alternate between the two instances; the remaining count goes down
//! 9, 8, ... 0 across both, and the last two are 429s.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::{Policy, Quota, RateLimitLayer};

/// The Redis URL: the `REDIS_URL` environment variable, or `redis://127.0.0.1:6379/`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
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
    let store = RedisStore::builder().standalone(redis_url).await?;
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", quota))
        .store(store)
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello from ratekeeper on redis\n" }))
        .layer(layer))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::init_tracing();
    // A bad `REDIS_URL` prints one sentence ("error: configuration error: the Redis URL is
    // not valid; ..."), not the error's `Debug` form.
    let app = match app(&redis_url()).await {
        Ok(app) => app,
        Err(err) => return ratekeeper_examples::fail(&*err),
    };
    match ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => ratekeeper_examples::fail(&err),
    }
}
