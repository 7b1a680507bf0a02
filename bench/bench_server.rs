//! The server `scripts/http_bench.sh` loads with `wrk`: the same tiny axum app, bare or behind
//! a rate limiter, chosen by the `MODE` environment variable.
//!
//! | `MODE` | what answers |
//! |---|---|
//! | `bare` | axum alone |
//! | `noop` | axum with `Router::layer(Identity)`: what axum's per-route re-boxing alone costs |
//! | `headers` | axum plus tower-http's `SetResponseHeaderLayer` (three, in one `ServiceBuilder`, so axum boxes the route once, as for one layer) adding the three `X-RateLimit-*` headers `allow` sends, as constant values: the floor for any `Router::layer` that sends them |
//! | `headers_min` | the same three constant headers inserted by one `map_response` function (tower's `MapResponseLayer`): the least any `Router::layer` that sends them can cost |
//! | `allow` | `Router::layer(RateLimitLayer::new(..))`, per peer IP, 1000 per millisecond, burst 1000: no load on loopback reaches it, every request passes |
//! | `allow_info` | `allow` built with `.request_info(true)` (the `Info` extension for the `RateLimitInfo` extractor) |
//! | `allow_outer` | the same layer around the whole router (`layer.layer(router)`, tower style): no per-route re-boxing |
//! | `reject` | `Router::layer(RateLimitLayer::new(..))`, per peer IP, 1 per 10 minutes: after the first request every request gets a 429 |
//! | `reject_outer` | the same around the whole router |
//! | `governor_allow` | `tower_governor`'s `GovernorLayer`, per peer IP, 1 per microsecond, burst 1000 (the same rate) |
//! | `governor_reject` | `tower_governor`'s `GovernorLayer`, per peer IP, 1 per 10 minutes, burst 1 |
//!
//! The quotas keep header values below 1024, as typical quotas do (`X-RateLimit-Limit: 1000`,
//! `Retry-After: 600`); larger values cost one allocation per header.
//!
//! ```text
//! MODE=allow ADDR=127.0.0.1:3000 cargo run --release -p ratekeeper-bench --bin bench_server
//! ```
//!
//! An unknown `MODE` prints every mode and exits with status 2.
//!
//! No tracing subscriber is installed, as in a server that logs nothing per request.

use std::num::NonZeroU32;
use std::time::Duration;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderName, HeaderValue};
use ratekeeper_axum::{RateLimitLayer, core::Quota};
use tower::ServiceBuilder;
use tower::{Layer as _, ServiceExt};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_http::set_header::SetResponseHeaderLayer;

/// What every mode serves.
fn app() -> Router {
    Router::new().route("/", get(|| async { "hello from ratekeeper\n" }))
}

/// The three `X-RateLimit-*` headers as constants, inserted by one function: the least any
/// `Router::layer` that sends them can cost.
fn three_headers(mut res: axum::response::Response) -> axum::response::Response {
    // Made at compile time: only the inserts cost per request.
    const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
    const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
    const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
    let headers = res.headers_mut();
    headers.insert(LIMIT, HeaderValue::from_static("1000"));
    headers.insert(REMAINING, HeaderValue::from_static("999"));
    headers.insert(RESET, HeaderValue::from_static("1"));
    res
}

/// A quota no load on loopback reaches: 1000 per millisecond (10^6 per second), burst 1000.
fn never_reached() -> Quota {
    Quota::new(1000, Duration::from_millis(1)).unwrap_or(Quota::per_second(NonZeroU32::MAX))
}

/// 1 per 10 minutes, burst 1.
fn ten_minutes() -> Quota {
    Quota::new(1, Duration::from_secs(600)).unwrap_or(Quota::per_hour(NonZeroU32::MIN))
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
        "reject" => app().layer(RateLimitLayer::new(ten_minutes())),
        "headers" => app().layer(
            ServiceBuilder::new()
                .layer(SetResponseHeaderLayer::overriding(
                    HeaderName::from_static("x-ratelimit-limit"),
                    HeaderValue::from_static("1000"),
                ))
                .layer(SetResponseHeaderLayer::overriding(
                    HeaderName::from_static("x-ratelimit-remaining"),
                    HeaderValue::from_static("999"),
                ))
                .layer(SetResponseHeaderLayer::overriding(
                    HeaderName::from_static("x-ratelimit-reset"),
                    HeaderValue::from_static("1"),
                )),
        ),
        "headers_min" => app().layer(tower::util::MapResponseLayer::new(
            three_headers as fn(axum::response::Response) -> axum::response::Response,
        )),
        "allow_info" => app().layer(
            RateLimitLayer::builder()
                .quota(never_reached())
                .request_info(true)
                .build()
                .ok()?,
        ),
        "noop" => app().layer(tower::layer::util::Identity::new()),
        "governor_allow" => governor(Duration::from_micros(1), 1000),
        "governor_reject" => governor(Duration::from_secs(600), 1),
        _ => return None,
    })
}

/// The layer around the whole router (`layer.layer(router)`, tower style) instead of
/// `Router::layer`, which wraps and re-boxes every route: one rate-limit service per app.
async fn serve_outer(layer: RateLimitLayer, addr: &str) -> std::io::Result<()> {
    // axum::serve wants axum's body; `Router::layer` converts the same way.
    let app = ServiceExt::<http::Request<Body>>::map_response(layer.layer(app()), |res| {
        res.map(Body::from)
    });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        axum::ServiceExt::<http::Request<Body>>::into_make_service_with_connect_info::<SocketAddr>(
            app,
        ),
    )
    .await
}

/// Every `MODE`, in the order of the table above.
const MODES: [&str; 11] = [
    "bare",
    "noop",
    "headers",
    "headers_min",
    "allow",
    "allow_info",
    "allow_outer",
    "reject",
    "reject_outer",
    "governor_allow",
    "governor_reject",
];

/// The address to listen on: `ADDR`, or `127.0.0.1:3000`.
fn listen_addr() -> String {
    std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
}

/// Binds `addr`, prints `listening on <addr>` (the scripts wait for that line) and serves
/// `app` with connect info, so the peer IP is known.
async fn serve(app: Router, addr: &str) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mode = std::env::var("MODE").unwrap_or_else(|_| "bare".to_owned());
    let addr = listen_addr();
    match mode.as_str() {
        "allow_outer" => return serve_outer(RateLimitLayer::new(never_reached()), &addr).await,
        "reject_outer" => return serve_outer(RateLimitLayer::new(ten_minutes()), &addr).await,
        _ => {}
    }
    let Some(app) = build(&mode) else {
        eprintln!("unknown MODE {mode:?}; the modes are: {}", MODES.join(", "));
        std::process::exit(2);
    };
    serve(app, &addr).await
}

#[cfg(test)]
mod tests {
    use super::{MODES, build};

    #[test]
    fn every_listed_mode_is_served_and_no_other() {
        for mode in MODES {
            let served = build(mode).is_some() || mode.ends_with("_outer");
            assert!(served, "{mode} is listed but not served");
        }
        assert!(
            build("allow_outer").is_none(),
            "served by serve_outer, not build"
        );
        assert!(build("governor").is_none());
        assert!(build("").is_none());
    }
}
