//! The server `scripts/http_bench.sh` loads with `wrk`: the same tiny axum app, bare or behind
//! a rate limiter, chosen by the `MODE` environment variable.
//!
//! | `MODE` | what answers |
//! |---|---|
//! | `bare` | axum alone |
//! | `allow` | ratekeeper's `RateLimitLayer`, per peer IP, a quota no load reaches (every request passes) |
//! | `reject` | ratekeeper's `RateLimitLayer`, per peer IP, 1 per day (after the first request every request gets a 429) |
//! | `governor_allow` | `tower_governor`'s `GovernorLayer`, per peer IP, the same never-reached quota |
//! | `governor_reject` | `tower_governor`'s `GovernorLayer`, per peer IP, 1 per day, burst 1 |
//!
//! ```text
//! MODE=allow ADDR=127.0.0.1:3000 cargo run --release --example bench_server
//! ```
//!
//! No tracing subscriber is installed, as in a server that logs nothing per request.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::{Quota, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// What every mode serves.
fn app() -> Router {
    Router::new().route("/", get(|| async { "hello from ratekeeper\n" }))
}

/// A quota no benchmark reaches: 2^32 - 1 per second, burst 2^32 - 1.
fn never_reached() -> Quota {
    let max = NonZeroU32::MAX;
    Quota::per_second(max)
        .with_burst(max.get())
        .unwrap_or(Quota::per_second(max))
}

/// tower_governor with `period` between replenishments and `burst`.
fn governor(period: Duration, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .period(period)
        .burst_size(burst)
        .finish();
    match config {
        Some(config) => app().layer(GovernorLayer::new(config)),
        None => {
            eprintln!("invalid tower_governor configuration");
            std::process::exit(2);
        }
    }
}

fn build(mode: &str) -> Option<Router> {
    Some(match mode {
        "bare" => app(),
        "allow" => app().layer(RateLimitLayer::new(never_reached())),
        "reject" => app().layer(RateLimitLayer::new(Quota::per_day(NonZeroU32::MIN))),
        // 1 ns between replenishments and the largest burst: never reached either.
        "governor_allow" => governor(Duration::from_nanos(1), u32::MAX),
        "governor_reject" => governor(Duration::from_secs(86_400), 1),
        _ => return None,
    })
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mode = std::env::var("MODE").unwrap_or_else(|_| "bare".to_owned());
    let Some(app) = build(&mode) else {
        eprintln!("unknown MODE {mode:?}: bare, allow, reject, governor_allow or governor_reject");
        std::process::exit(2);
    };
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(app, &addr).await
}
