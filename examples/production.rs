//! The usual production setup, end to end: an axum API behind a reverse proxy, with
//!
//! 1. an **edge limit** per client IP (30 requests per minute, burst 30), read from
//!    `X-Forwarded-For` only when the TCP peer is the trusted proxy (here 127.0.0.1 or ::1),
//!    placed **before authentication**: failed logins and guessed tokens spend it too, so a
//!    client that tries 31 bad tokens gets 30 `401`s and then `429`s;
//! 2. **authentication**: `Authorization: Bearer tok-<name>` puts a `User` in the request
//!    extensions; an unknown token is a `401`; no header is an anonymous request;
//! 3. a **per-user limit** after authentication (10 per minute, burst 10), so colleagues
//!    behind one office IP get separate budgets, falling back to the forwarded client IP for
//!    anonymous requests;
//! 4. a **stricter limit on `POST /search`** (3 per minute, burst 3, per user or IP), attached
//!    to the route template with a `RouteTable`, on top of the per-user limit;
//! 5. `/health` **exempt**: the load balancer's probes are never limited and carry no
//!    rate-limit headers;
//! 6. the IETF fields on every limited route, one item per policy that applies, e.g. for
//!    `GET /me`: `RateLimit-Policy: "per-user";q=10;w=60, "edge";q=30;w=60` and
//!    `RateLimit: "per-user";r=9;t=6, "edge";r=29;t=2` (`q` requests per `w` seconds, `r`
//!    requests left, `t` seconds until the bucket is full again).
//!
//! All state is in memory, per process, at most 100 000 keys per policy (beyond that, new
//! keys share one overflow budget, so a flood of addresses cannot exhaust memory); for
//! several instances use the Redis store with the same layers (see the `distributed`
//! example).
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example production
//! curl -si -H 'X-Forwarded-For: 198.51.100.7' -H 'Authorization: Bearer tok-alice' http://127.0.0.1:3000/me
//! curl -si -X POST -d 'rust' -H 'Authorization: Bearer tok-bob' http://127.0.0.1:3000/search
//! # token guessing from one client: 30 times 401, then 429 429
//! for i in $(seq 32); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Forwarded-For: 203.0.113.5' -H "Authorization: Bearer guess-$i" http://127.0.0.1:3000/me; done
//! curl -si http://127.0.0.1:3000/health   # 200, no rate-limit headers
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::{NonZeroU32, NonZeroUsize};

use axum::Router;
use axum::extract::{Extension, Request};
use axum::http::{Method, StatusCode, header::AUTHORIZATION};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::{ForwardedIp, UserKey};
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::route::RouteTable;
use ratekeeper_axum::{BuildError, RateLimitLayer, core::Key, core::Policy, core::Quota};

/// Edge limit: requests per minute (and burst) per client IP, before authentication.
pub const EDGE_PER_MINUTE: u32 = 30;
/// Per-user limit: requests per minute (and burst) per user, or per client IP when anonymous.
pub const USER_PER_MINUTE: u32 = 10;
/// `POST /search`: requests per minute (and burst) per user or client IP, on top of the
/// per-user limit.
pub const SEARCH_PER_MINUTE: u32 = 3;
/// Keys each policy holds in memory at most.
pub const MAX_KEYS: usize = 100_000;

/// `n` requests per minute, burst `n` (at least 1).
fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN))
}

/// An in-memory store reading time from `clock`, holding at most [`MAX_KEYS`] keys per
/// policy.
fn store<C: Clock + Clone>(clock: &C) -> MemoryStore<Key, C> {
    MemoryStore::with_clock(clock.clone())
        .with_max_keys(NonZeroUsize::new(MAX_KEYS).unwrap_or(NonZeroUsize::MIN))
}

/// The client IP: the rightmost `X-Forwarded-For` entry that is not a trusted proxy, read
/// only when the TCP peer is a trusted proxy; the peer itself otherwise. Here the proxy runs
/// on the same host (127.0.0.1 or ::1); list your load balancer's addresses or networks
/// instead. Never trust `X-Forwarded-For` from everyone: any client could then pick its key.
fn client_ip() -> ForwardedIp {
    ForwardedIp::trusting([
        IpAddr::V4(Ipv4Addr::LOCALHOST).into(),
        IpAddr::V6(Ipv6Addr::LOCALHOST).into(),
    ])
}

/// The principal [`authenticate`] inserts into the request extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
}

/// The per-user key: `user:<name>`.
fn user_key(user: &User) -> Key {
    Key::from(format!("user:{}", user.name))
}

/// Demo authentication: `Authorization: Bearer tok-alice` or `tok-bob` inserts a [`User`];
/// any other bearer token (or another scheme) is a `401`; no `Authorization` header is an
/// anonymous request. Replace the token check with your own (a session store, JWT
/// validation); keep it between the edge limit and the per-user limit.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return next.run(req).await;
    };
    let token = value.to_str().ok().and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    let name = match token {
        Some("tok-alice") => "alice",
        Some("tok-bob") => "bob",
        _ => return (StatusCode::UNAUTHORIZED, "invalid credentials\n").into_response(),
    };
    req.extensions_mut().insert(User {
        name: name.to_owned(),
    });
    next.run(req).await
}

/// `GET /me`: who the request was authenticated as.
async fn me(user: Option<Extension<User>>) -> String {
    match user {
        Some(Extension(user)) => format!("hello {}\n", user.name),
        None => "hello anonymous\n".to_owned(),
    }
}

/// `POST /search`: an expensive query (the body is the search text).
async fn search(query: String) -> String {
    format!("results for {:?}\n", query.trim())
}

/// The whole app: `GET /me`, `POST /search` and `GET /health` with the limits described in
/// the module docs, on the system's monotonic clock. Serve it with connect info
/// (`ConnectInfo<SocketAddr>`) so the client IP is known.
///
/// # Errors
///
/// A [`BuildError`] if the limits above were inconsistent (they are not; a configuration
/// read at startup would be checked here).
pub fn app() -> Result<Router, BuildError> {
    app_with_clock(MonotonicClock::new())
}

/// [`app`] reading time from `clock`; tests pass a manual clock so time moves only when
/// they say so.
///
/// # Errors
///
/// As [`app`].
pub fn app_with_clock<C: Clock + Clone>(clock: C) -> Result<Router, BuildError> {
    // 1. Outermost: every request (except /health) is charged per client IP first, whether
    //    or not its credentials are valid.
    let edge = RateLimitLayer::builder()
        .policy(Policy::new("edge", per_minute(EDGE_PER_MINUTE)))
        .key(client_ip())
        .headers(HeaderStyle::Ietf)
        .store(store(&clock))
        .build()?;
    // 3. After authentication: per user, or per client IP when anonymous; `POST /search`
    //    also spends its own, smaller budget (keyed by route template, user or IP).
    let per_user = RateLimitLayer::builder()
        .policy(Policy::new("per-user", per_minute(USER_PER_MINUTE)))
        .policy(Policy::new("search", per_minute(SEARCH_PER_MINUTE)))
        .key(UserKey::new(user_key).or(client_ip()))
        .resolver(RouteTable::new().limit(Method::POST, "/search", "search"))
        .headers(HeaderStyle::Ietf)
        .store(store(&clock))
        .build()?;
    Ok(Router::new()
        .route("/me", get(me))
        .route("/search", post(search))
        // Layers run outside-in from the last one added: edge, then authentication, then
        // the per-user limit, then the handler.
        .layer(per_user)
        .layer(middleware::from_fn(authenticate)) // 2.
        .layer(edge)
        // Added after the layers, so none of them wraps it: probes are never limited.
        .route("/health", get(health)))
}

/// `GET /health`: `200 ok`, never limited.
async fn health() -> &'static str {
    "ok\n"
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    ratekeeper_examples::init_tracing();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(app()?, &addr).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
