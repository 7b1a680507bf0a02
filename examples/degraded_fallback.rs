//! Degraded-response fallback: `GET /prices` is computed fresh twice per minute per client IP;
//! beyond that the client gets the cached answer, marked `RateLimit-Degraded`, instead of a 429.
//!
//! The limit and its fallback wrap only `GET /prices` (`get(..).route_layer(..)`): the
//! fallback answers with prices, so it must never answer a request that is not a price
//! lookup. `POST /prices` stays a 405 and an unknown path a 404, limited or not.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example degraded_fallback
//! for i in 1 2 3; do curl -si http://127.0.0.1:3000/prices | grep -iE '^(ratelimit-degraded|x-ratelimit-remaining)|prices'; done
//! ```

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::handler::Handler;
use axum::routing::get;
use ratekeeper_axum::core::ceil_secs;
use ratekeeper_axum::{RateLimitLayer, core::Quota, extract::RateLimitInfo};

/// The "cache" behind the app: the version of the last fresh answer.
#[derive(Debug, Clone, Default)]
pub struct PriceCache {
    version: Arc<AtomicU64>,
}

/// `GET /prices` computes a fresh answer at most 2 times per minute per client IP (burst 2);
/// beyond that, instead of a 429, the client gets the last answer from the cache, marked
/// `RateLimit-Degraded: "default"` and counted in the `metrics` counter
/// `ratekeeper_degraded_total`. Other methods and paths are neither limited nor degraded.
pub fn app() -> Router {
    let quota = Quota::per_minute(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN));
    let cache = PriceCache::default();
    let limit = RateLimitLayer::new(quota).with_fallback(stale_prices.with_state(cache.clone()));
    Router::new()
        // `route_layer` on the method router: only `GET` (and `HEAD`) /prices pass through
        // the limit and its fallback. `Router::layer` would also wrap the 405 of
        // `POST /prices` and the 404 of unknown paths (`Router::route_layer` the 405), and
        // once the client is limited the fallback would answer those with prices.
        .route("/prices", get(fresh_prices).route_layer(limit))
        .with_state(cache)
}

/// The expensive answer: a new price list version each time.
async fn fresh_prices(State(cache): State<PriceCache>) -> String {
    let version = cache.version.fetch_add(1, Ordering::Relaxed) + 1;
    format!("prices v{version} (fresh)\n")
}

/// The cheap answer for limited requests: the last version computed.
async fn stale_prices(State(cache): State<PriceCache>, info: Option<RateLimitInfo>) -> String {
    let version = cache.version.load(Ordering::Relaxed);
    let retry = info.map_or(0, |i| ceil_secs(i.reset_after()));
    format!("prices v{version} (cached; fresh data again within {retry} s)\n")
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
