//! The apps behind the runnable examples, as functions, so the end-to-end tests exercise
//! exactly what `cargo run --example ...` serves.
//!
//! ```
//! let app = ratekeeper_examples::quickstart_app();
//! # let _ = app;
//! let apps = [
//!     ratekeeper_examples::per_route_cost_app(),
//!     ratekeeper_examples::nat_users_app(),
//!     ratekeeper_examples::tiers_app(),
//! ];
//! # let _ = apps;
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::key::UserKey;
use ratekeeper_axum::policy::resolve_fn;
use ratekeeper_axum::route::RouteTable;
use ratekeeper_axum::{Key, PeerIp, Policy, Quota, RateLimitInfo, RateLimitLayer};
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::throttle::{Throttle, ThrottleError};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN))
}

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

/// `per_route_cost`: one budget of 100 units per minute per client IP; `GET /search` costs
/// 10 units, `GET /status` costs 1. Costs are keyed by the route template, so
/// `/search?q=x` and `HEAD /search` cost 10 too. This app has no `NormalizePathLayer`, so
/// `/search/` is a 404: charged the default cost 1, it never reaches the search handler.
pub fn per_route_cost_app() -> Router {
    per_route_cost_app_with(MemoryStore::new())
}

/// [`per_route_cost_app`] on a given store (tests pass one with a manual clock).
///
/// # Panics
///
/// Only if the static configuration above were invalid (a route cost above the burst is a
/// build error): at startup, never at request time.
pub fn per_route_cost_app_with<C: Clock>(store: MemoryStore<Key, C>) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100)))
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

/// The principal the demo auth middleware of [`nat_users_app`] and [`tiers_app`] inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
    /// The user's plan.
    pub plan: Tier,
}

/// A user's plan in [`tiers_app`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// 60 requests per minute.
    Free,
    /// 1000 requests per minute.
    Paid,
}

/// Demo authentication: `Authorization: Bearer tok-<name>` for `alice` and `carol` (free),
/// `bob` (paid). A known token inserts a [`User`]; an unknown token is a `401`; no header is
/// an anonymous request.
async fn demo_auth(mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let Some(token) = token else {
        return next.run(req).await;
    };
    let user = match token {
        "tok-alice" => ("alice", Tier::Free),
        "tok-carol" => ("carol", Tier::Free),
        "tok-bob" => ("bob", Tier::Paid),
        _ => return (StatusCode::UNAUTHORIZED, "unknown token\n").into_response(),
    };
    req.extensions_mut().insert(User {
        name: user.0.to_owned(),
        plan: user.1,
    });
    next.run(req).await
}

fn user_key(u: &User) -> Key {
    Key::from(format!("user:{}", u.name))
}

/// `nat_users`: 5 requests per minute per **user**, so colleagues behind one NAT address get
/// their own budgets; anonymous requests fall back to the client IP. The demo auth middleware
/// runs before the limiter.
pub fn nat_users_app() -> Router {
    nat_users_app_with(MemoryStore::new())
}

/// [`nat_users_app`] on a given store.
///
/// # Panics
///
/// Only if the static configuration above were invalid: a build error at startup, never at
/// request time.
pub fn nat_users_app_with<C: Clock>(store: MemoryStore<Key, C>) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("per-user", per_minute(5)))
        .key(UserKey::new(user_key).or(PeerIp::new()))
        .store(store)
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route(
            "/",
            get(|user: Option<axum::Extension<User>>| async move {
                match user {
                    Some(axum::Extension(u)) => format!("hello {}\n", u.name),
                    None => "hello anonymous\n".to_owned(),
                }
            }),
        )
        // Layers run outside-in from the last added: auth first, then the limiter.
        .layer(layer)
        .layer(middleware::from_fn(demo_auth))
}

/// `tiers`: free users get 60 requests per minute, paid users 1000, keyed by user;
/// anonymous requests get the free tier keyed by client IP.
pub fn tiers_app() -> Router {
    tiers_app_with(MemoryStore::<Key, MonotonicClock>::new())
}

/// [`tiers_app`] on a given store.
///
/// # Panics
///
/// Only if the static configuration above were invalid: a build error at startup, never at
/// request time.
pub fn tiers_app_with<C: Clock>(store: MemoryStore<Key, C>) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("free", per_minute(60)))
        .policy(Policy::new("paid", per_minute(1000)))
        .key(UserKey::new(user_key).or(PeerIp::new()))
        .resolver(resolve_fn(|req, plan| {
            match req.extensions().get::<User>().map(|u| u.plan) {
                Some(Tier::Paid) => plan.charge("paid"),
                _ => plan.charge("free"),
            };
        }))
        .store(store)
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer)
        .layer(middleware::from_fn(demo_auth))
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
