//! An axum app with tiers: free users 60 per minute, paid users 1000, anonymous by IP on the
//! free tier. Failed authentications are limited too (10 per minute per client IP), by a
//! limit that runs *before* authentication, so guessing tokens gets 429s after 10 tries.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example tiers
//! curl -si -H 'Authorization: Bearer tok-bob' http://127.0.0.1:3000/ | grep -i x-ratelimit-limit   # 1000
//! ```

use std::num::NonZeroU32;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::UserKey;
use ratekeeper_axum::policy::{Settle, resolve_fn};
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota, key::PeerIp};

/// The principal the demo authentication inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
    /// The user's plan.
    pub plan: Tier,
}

/// A user's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// 60 requests per minute.
    Free,
    /// 1000 requests per minute.
    Paid,
}

/// Demo authentication: `Authorization: Bearer tok-<name>` for `alice` and `carol` (free)
/// and `bob` (paid). A known token inserts a [`User`]; any other token is a `401`; no header
/// is an anonymous request.
async fn demo_auth(mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let Some(token) = token else {
        return next.run(req).await;
    };
    let (name, plan) = match token {
        "tok-alice" => ("alice", Tier::Free),
        "tok-carol" => ("carol", Tier::Free),
        "tok-bob" => ("bob", Tier::Paid),
        _ => return (StatusCode::UNAUTHORIZED, "unknown token\n").into_response(),
    };
    req.extensions_mut().insert(User {
        name: name.to_owned(),
        plan,
    });
    next.run(req).await
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN))
}

/// Three layers around `GET /`, outermost first:
///
/// 1. `auth-failures`, 10 per minute per client IP, counting only `401` responses
///    ([`Settle::COUNT_UNAUTHORIZED`]): wrong tokens get 10 `401`s, then `429`s until the
///    budget refills. Other requests are given back once their status is known (until then
///    they hold a unit: at most 10 in flight per address). No rate-limit headers: clients
///    see their tier's budget.
/// 2. The demo authentication.
/// 3. The tiers: free users get 60 requests per minute, paid users 1000, keyed by user;
///    anonymous requests get the free tier keyed by client IP.
pub fn app() -> Router {
    app_with(MonotonicClock::new())
}

/// [`app`] with both limits reading time from `clock` (the tests pass a manual clock).
///
/// # Panics
///
/// Only if the static configuration above were invalid: a build error at startup, never at
/// request time.
pub fn app_with<C: Clock + Clone>(clock: C) -> Router {
    let auth_failures = RateLimitLayer::builder()
        .policy(Policy::new("auth-failures", per_minute(10)))
        .key(PeerIp::new())
        .settle("auth-failures", Settle::COUNT_UNAUTHORIZED)
        .headers(HeaderStyle::None)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .expect("static rate-limit configuration is valid");
    let tiers = RateLimitLayer::builder()
        .policy(Policy::new("free", per_minute(60)))
        .policy(Policy::new("paid", per_minute(1000)))
        .key(UserKey::new(|u: &User| Key::from(format!("user:{}", u.name))).or(PeerIp::new()))
        .resolver(resolve_fn(|req, plan| {
            match req.extensions().get::<User>().map(|u| u.plan) {
                Some(Tier::Paid) => plan.charge("paid"),
                _ => plan.charge("free"),
            };
        }))
        .store(MemoryStore::with_clock(clock))
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        // Layers run outside-in from the last added: the failed-authentication limit
        // first, then authentication, then the tiers.
        .layer(tiers)
        .layer(middleware::from_fn(demo_auth))
        .layer(auth_failures)
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
