//! Outbound throttling: a client that calls a rate-limited API as fast as it can and never
//! gets a 429, because it waits for capacity under the same rate first.
//!
//! The example starts the upstream API itself (a ratekeeper-limited axum app, 50 requests
//! per second per client IP, on `ADDR`, default a free port on 127.0.0.1), then runs four client
//! tasks against it for `DURATION_SECS` seconds (default 5) and prints what they saw.
//!
//! ```text
//! cargo run -p ratekeeper-examples-client --example outbound_throttle
//! ```

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::core::throttle::{Throttle, ThrottleError};
use ratekeeper_axum::{BuildError, RateLimitLayer, core::Key, core::Policy, core::Quota};

/// The quota the upstream API enforces per client IP: 50 per second, burst 50.
pub const UPSTREAM_QUOTA: Quota = Quota::per_second(match NonZeroU32::new(50) {
    Some(n) => n,
    None => NonZeroU32::MIN,
});

/// The quota the client keeps: the upstream's rate, 50 per second, with burst 5, so its
/// calls leave nearly evenly spaced (one every 20 ms; the small burst lets tasks that a busy
/// machine wakes up to 80 ms late catch up instead of losing the time). The upstream's burst
/// of 50 then absorbs up to 45 intervals (900 ms) of network jitter, and the client never
/// sees a 429. Over `D` seconds it makes at most `5 + 50 * D` calls.
pub fn client_quota() -> Quota {
    UPSTREAM_QUOTA.with_burst(5).unwrap_or(UPSTREAM_QUOTA)
}

/// Server side: `GET /api`, limited to [`UPSTREAM_QUOTA`] per client IP.
pub fn upstream_app() -> Router {
    upstream_routes().layer(RateLimitLayer::new(UPSTREAM_QUOTA))
}

/// [`upstream_app`] with its limiter's store on `clock` (a test passes a
/// [`TokioClock`](ratekeeper_axum::core::clock::TokioClock) to run under tokio's paused
/// time).
///
/// # Errors
///
/// When the layer cannot be built (it cannot: the quota is valid).
pub fn upstream_app_on<C: Clock>(clock: C) -> Result<Router, BuildError> {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", UPSTREAM_QUOTA))
        .store(MemoryStore::<Key, C>::with_clock(clock))
        .build()?;
    Ok(upstream_routes().layer(layer))
}

fn upstream_routes() -> Router {
    Router::new().route("/api", get(|| async { "upstream answer\n" }))
}

/// What the client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboundReport {
    /// Responses with status 200.
    pub ok: u64,
    /// Responses with status 429.
    pub limited: u64,
    /// Other statuses and transport errors.
    pub failed: u64,
    /// From the first call until the last response arrived.
    pub elapsed: Duration,
}

impl OutboundReport {
    /// Successful calls per second over [`OutboundReport::elapsed`].
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// Client side: `workers` tasks call `GET {base}/api` as fast as [`client_quota`] allows for
/// `duration`, each waiting for capacity with [`Throttle::acquire`] before every call.
///
/// # Errors
///
/// When the throttle cannot be built (it cannot: the policy is valid) or the HTTP client
/// cannot be created.
pub async fn run_client(
    base: &str,
    duration: Duration,
    workers: usize,
) -> Result<OutboundReport, Box<dyn std::error::Error + Send + Sync>> {
    run_client_on(base, duration, workers, MonotonicClock::new()).await
}

/// [`run_client`] with the throttle's store on `clock` (a test passes a
/// [`TokioClock`](ratekeeper_axum::core::clock::TokioClock) to run under tokio's paused
/// time, where `duration` and the report's `elapsed` are tokio time too).
///
/// # Errors
///
/// As [`run_client`].
pub async fn run_client_on<C: Clock>(
    base: &str,
    duration: Duration,
    workers: usize,
    clock: C,
) -> Result<OutboundReport, Box<dyn std::error::Error + Send + Sync>> {
    let policy = Policy::new("upstream", client_quota());
    let store = MemoryStore::<Key, C>::with_clock(clock);
    let throttle = Arc::new(Throttle::new(store, &[policy])?);
    let client = reqwest::Client::builder().build()?;
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let start = tokio::time::Instant::now();
    let url = format!("{base}/api");
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (throttle, client, counts, url) = (
                throttle.clone(),
                client.clone(),
                counts.clone(),
                url.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let left = duration.saturating_sub(start.elapsed());
                    match throttle.acquire(&Key::Global, 1, left).await {
                        Ok(_) => {}
                        Err(ThrottleError::WouldExceedDeadline { .. }) => break,
                        Err(_) => {
                            counts[2].fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                    let slot = match client.get(&url).send().await.map(|r| r.status().as_u16()) {
                        Ok(200) => 0,
                        Ok(429) => 1,
                        _ => 2,
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    Ok(OutboundReport {
        ok: counts[0].load(Ordering::Relaxed),
        limited: counts[1].load(Ordering::Relaxed),
        failed: counts[2].load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    })
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The upstream is the example's own: any free port unless `ADDR` names one.
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("upstream listening on {local}");
    tokio::spawn(async move {
        let app = upstream_app().into_make_service_with_connect_info::<std::net::SocketAddr>();
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("upstream failed: {err}");
        }
    });
    let secs = std::env::var("DURATION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let report = run_client(&format!("http://{local}"), Duration::from_secs(secs), 4).await?;
    println!(
        "{} ok, {} rate limited, {} failed in {:.2} s: {:.1} calls/s (quota {})",
        report.ok,
        report.limited,
        report.failed,
        report.elapsed.as_secs_f64(),
        report.rate(),
        UPSTREAM_QUOTA,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
