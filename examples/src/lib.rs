//! The apps behind the runnable examples, as functions, so the end-to-end tests exercise
//! exactly what `cargo run --example ...` serves.
//!
//! ```
//! let app = ratekeeper_examples::quickstart_app();
//! # let _ = app;
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::handler::Handler;
use axum::routing::get;
use ratekeeper_axum::{Quota, RateLimitInfo, RateLimitLayer};

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

/// The "cache" behind `degraded_fallback`: the last fresh answer.
#[derive(Debug, Clone, Default)]
pub struct PriceCache {
    version: Arc<AtomicU64>,
}

/// `degraded_fallback`: `GET /prices` computes a fresh answer at most 2 times per minute per
/// client IP (burst 2); beyond that, instead of a 429, the client gets the last answer from
/// the cache, marked `RateLimit-Degraded: "default"` and counted in the `metrics` counter
/// `ratekeeper_degraded_total`.
pub fn degraded_fallback_app() -> Router {
    let quota = Quota::per_minute(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN));
    let cache = PriceCache::default();
    let limit = RateLimitLayer::new(quota).with_fallback(stale_prices.with_state(cache.clone()));
    Router::new()
        .route("/prices", get(fresh_prices))
        .with_state(cache)
        .layer(limit)
}

/// The expensive answer: a new price list version each time.
async fn fresh_prices(State(cache): State<PriceCache>) -> String {
    let version = cache.version.fetch_add(1, Ordering::Relaxed) + 1;
    format!("prices v{version} (fresh)\n")
}

/// The cheap answer for limited requests: the last version computed.
async fn stale_prices(State(cache): State<PriceCache>, info: Option<RateLimitInfo>) -> String {
    let version = cache.version.load(Ordering::Relaxed);
    let retry = info.map_or(0, |i| {
        ratekeeper_axum::core::decision::ceil_secs(i.reset_after())
    });
    format!("prices v{version} (cached; fresh data again within {retry} s)\n")
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
