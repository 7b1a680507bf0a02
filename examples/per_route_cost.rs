//! An axum app where `GET /search` costs 10 units and `GET /status` 1, out of 100 per minute per client IP.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example per_route_cost
//! curl -si http://127.0.0.1:3000/search | grep -i x-ratelimit-remaining   # 90
//! ```

use std::num::NonZeroU32;

use axum::Router;
use axum::http::Method;
use axum::routing::get;
use ratekeeper_axum::core::clock::Clock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::route::RouteTable;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota};

/// One budget of 100 units per minute per client IP; `GET /search` costs 10 units,
/// `GET /status` costs 1. Costs are keyed by the route template, so `/search?q=x` and
/// `HEAD /search` cost 10 too. This app has no `NormalizePathLayer`, so `/search/` is a 404:
/// charged the default cost 1, it never reaches the search handler.
pub fn app() -> Router {
    app_with(MemoryStore::new())
}

/// [`app`] on a given store (the tests pass one with a manual clock).
///
/// # Panics
///
/// Only if the static configuration above were invalid (a route cost above the burst is a
/// build error): at startup, never at request time.
pub fn app_with<C: Clock>(store: MemoryStore<Key, C>) -> Router {
    let per_minute = Quota::per_minute(NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN));
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute))
        .resolver(RouteTable::new().cost(Method::GET, "/search", 10).cost(
            Method::GET,
            "/status",
            1,
        ))
        .store(store)
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route("/search", get(|| async { "expensive search results\n" }))
        .route("/status", get(|| async { "ok\n" }))
        .layer(layer)
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
