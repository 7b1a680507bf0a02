//! Metrics and logs of a rate-limited app, served next to it: `GET /metrics` renders every
//! `ratekeeper_*` metric in the Prometheus text format (`metrics-exporter-prometheus`, rendered
//! by the app itself, no second listener), and the app logs what the limiter does at startup
//! and per decision.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ RUST_LOG=info,ratekeeper::decision=debug \
//!     ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-redis --example observability
//! for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics | grep '^ratekeeper_'
//! ```
//!
//! Three limits, outermost first:
//!
//! - `per-ip`: 20 per second per client IP (burst 20), in memory (the decision counter, the
//!   usage histogram and the memory store's key gauge);
//! - `daily`: 10,000 per day per client IP on Redis (the store latency histogram; without a
//!   Redis the app fails open and the histogram counts errors);
//! - `candidate`: a stricter limit under trial, 5 per minute, in shadow mode: it never
//!   refuses, its counters say what share of requests it would have refused.
//!
//! Without `REDIS_URL` the app uses `redis://127.0.0.1:6379/`.

use std::error::Error;
use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use ratekeeper_axum::core::store::redis::{RedisStore, RedisStoreBuilder};
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota, rate_limit::Mode};

/// Bucket bounds of `ratekeeper_usage_ratio` (share of capacity used, 0.0 to 1.0).
pub const USAGE_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Bucket bounds of `ratekeeper_store_latency_seconds` (s): 100 µs to the 50 ms deadline
/// and beyond.
pub const LATENCY_BUCKETS: [f64; 9] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
];

/// The process's Prometheus recorder, installed the first time (the `metrics` crate has one
/// global recorder), with histogram buckets for the usage ratio and the store latency (other
/// histograms render as summaries).
///
/// # Errors
///
/// When another recorder was installed first.
pub fn metrics_handle() -> Result<PrometheusHandle, BuildError> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(ratekeeper_axum::metrics::USAGE_RATIO.to_owned()),
            &USAGE_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("ratekeeper_store_latency_seconds".to_owned()),
            &LATENCY_BUCKETS,
        )?
        .install_recorder()?;
    Ok(HANDLE.get_or_init(|| handle).clone())
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

/// The app: `GET /` under the three limits, `GET /metrics` (not limited) rendering the
/// process's metrics.
///
/// # Errors
///
/// When the Redis URL is invalid, a layer cannot be built, or another metrics recorder was
/// installed first.
pub async fn app(redis_url: &str) -> Result<Router, Box<dyn Error>> {
    app_with(redis_url, RedisStore::builder()).await
}

/// [`app`] with the Redis store's other settings from `redis` (its decision deadline, say:
/// 50 ms by default, a test on a loaded machine gives it more).
///
/// # Errors
///
/// As [`app`].
pub async fn app_with(redis_url: &str, redis: RedisStoreBuilder) -> Result<Router, Box<dyn Error>> {
    let handle = metrics_handle()?;
    let per_ip = RateLimitLayer::builder()
        .policy(Policy::new("per-ip", Quota::per_second(nz(20))))
        .build()?;
    let daily = RateLimitLayer::builder()
        .policy(Policy::new("daily", Quota::per_day(nz(10_000))))
        .store(redis.standalone(redis_url).await?)
        .build()?;
    let candidate = RateLimitLayer::builder()
        .policy(Policy::new("candidate", Quota::per_minute(nz(5))))
        .mode(Mode::Shadow)
        .headers(HeaderStyle::None)
        .build()?;
    let limited = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(candidate)
        .layer(daily)
        .layer(per_ip);
    Ok(limited.route("/metrics", get(move || std::future::ready(handle.render()))))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::init_tracing();
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let app = match app(&redis_url).await {
        Ok(app) => app,
        Err(err) => return ratekeeper_examples::fail(&*err),
    };
    // Histogram upkeep (the exporter's buffers), as `metrics-exporter-prometheus` asks.
    if let Ok(handle) = metrics_handle() {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                handle.run_upkeep();
            }
        });
    }
    match ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => ratekeeper_examples::fail(&err),
    }
}
