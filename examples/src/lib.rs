//! The apps behind the runnable examples, as functions, so the end-to-end tests exercise
//! exactly what `cargo run --example ...` serves.
//!
//! ```
//! let app = ratekeeper_examples::quickstart_app();
//! # let _ = app;
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::{Quota, RateLimitLayer};

/// The address an example listens on: `ADDR`, or `127.0.0.1:3000`.
pub fn listen_addr() -> String {
    std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
}

/// `quickstart`: 10 requests per minute per client IP (burst 10), in memory.
pub fn quickstart_app() -> Router {
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    Router::new()
        .route("/", get(|| async { "hello from ratekeeper\n" }))
        .layer(RateLimitLayer::new(quota))
}

/// The Redis URL of the `distributed` example: `REDIS_URL`, or `redis://127.0.0.1:6379/`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// `distributed`: the quickstart limits (10 requests per minute per client IP, burst 10) on
/// Redis, so every instance of the app started with the same `redis_url` shares one budget
/// per client IP. Decisions have a 50 ms deadline; when Redis is down the app fails open.
///
/// # Errors
///
/// When the URL is invalid or the layer cannot be built.
pub async fn distributed_app(redis_url: &str) -> Result<Router, Box<dyn std::error::Error>> {
    use ratekeeper_axum::core::store::redis::RedisStore;

    let store = RedisStore::builder().standalone(redis_url).await?;
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    let layer = RateLimitLayer::builder()
        .policy(ratekeeper_axum::Policy::new("default", quota))
        .store(store)
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello from ratekeeper on redis\n" }))
        .layer(layer))
}

/// Binds `addr`, prints `listening on <addr>` once connections are accepted, and serves
/// `app` with connect info (so the peer IP is known) until Ctrl-C.
///
/// # Errors
///
/// When the address cannot be bound or the server fails.
pub async fn serve(app: Router, addr: &str) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
