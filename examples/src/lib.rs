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
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::{Key, Policy, Quota, RateLimitLayer};
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::throttle::{Throttle, ThrottleError};

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

/// The quota the upstream API of `outbound_throttle` enforces per client IP: 50 per second,
/// burst 50.
pub const UPSTREAM_QUOTA: Quota = Quota::per_second(match NonZeroU32::new(50) {
    Some(n) => n,
    None => NonZeroU32::MIN,
});

/// The quota the `outbound_throttle` client keeps: the upstream's rate, 50 per second, with
/// burst 5, so its calls leave nearly evenly spaced (one every 20 ms; the small burst lets
/// tasks that a busy machine wakes up to 80 ms late catch up instead of losing the time).
/// The upstream's burst of 50 then absorbs up to 45 intervals (900 ms) of network jitter,
/// and the client never sees a 429. Over `D` seconds it makes at most `5 + 50 * D` calls.
pub fn client_quota() -> Quota {
    UPSTREAM_QUOTA.with_burst(5).unwrap_or(UPSTREAM_QUOTA)
}

/// `outbound_throttle`, server side: an API limited to [`UPSTREAM_QUOTA`] per client IP.
pub fn upstream_app() -> Router {
    Router::new()
        .route("/api", get(|| async { "upstream answer\n" }))
        .layer(RateLimitLayer::new(UPSTREAM_QUOTA))
}

/// What the `outbound_throttle` client saw.
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

/// `outbound_throttle`, client side: `workers` tasks call `GET {base}/api` as fast as
/// [`client_quota`] allows for `duration`, each waiting for capacity with
/// [`Throttle::acquire`] before every call.
///
/// # Errors
///
/// When the throttle cannot be built (it cannot: the policy is valid) or the HTTP client
/// cannot be created.
pub async fn run_outbound_client(
    base: &str,
    duration: Duration,
    workers: usize,
) -> Result<OutboundReport, Box<dyn std::error::Error + Send + Sync>> {
    let policy = Policy::new("upstream", client_quota());
    let throttle = Arc::new(Throttle::new(MemoryStore::<Key>::new(), &[policy])?);
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
