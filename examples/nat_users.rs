//! An axum app with a per-user budget (5 per minute): users behind one IP do not share it;
//! anonymous requests are limited by IP. Failed authentications are limited too (10 per
//! minute per client IP), by a limit that runs *before* authentication, so guessing tokens
//! gets 429s after 10 tries instead of an unlimited stream of 401s.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example nat_users
//! curl -s -H 'Authorization: Bearer tok-alice' http://127.0.0.1:3000/   # hello alice
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' -H 'Authorization: Bearer guess' http://127.0.0.1:3000/; done
//! ```

use std::num::NonZeroU32;

use axum::Router;
use axum::extract::{Extension, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::UserKey;
use ratekeeper_axum::policy::Settle;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota, key::PeerIp};

/// The principal the demo authentication inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
}

/// Demo authentication: `Authorization: Bearer tok-<name>` for `alice`, `bob` and `carol`.
/// A known token inserts a [`User`]; any other token is a `401`; no header is an anonymous
/// request.
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
    let name = match token {
        "tok-alice" => "alice",
        "tok-bob" => "bob",
        "tok-carol" => "carol",
        _ => return (StatusCode::UNAUTHORIZED, "unknown token\n").into_response(),
    };
    req.extensions_mut().insert(User {
        name: name.to_owned(),
    });
    next.run(req).await
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN))
}

/// Three layers around `GET /`, outermost first:
///
/// 1. `auth-failures`, 10 per minute per client IP, counting only `401` responses
///    ([`Settle::COUNT_UNAUTHORIZED`]): a client that sends wrong tokens gets 10 `401`s, then
///    `429`s until the budget refills (one more try every 6 s). Requests that authenticate,
///    or send no token, are given back once their status is known, so they cost nothing
///    here. Each holds a unit until its status is known, though, so at most 10 requests
///    from one address are in flight at once: size this budget for the concurrency of the
///    busiest address you serve. It sends no rate-limit headers (a `429` still has
///    `Retry-After`): the headers clients see describe their own budget.
/// 2. The demo authentication.
/// 3. `per-user`, 5 requests per minute per **user**, so colleagues behind one NAT address
///    get their own budgets; anonymous requests fall back to the client IP.
///
/// Once an address is over its `auth-failures` budget every request from it is refused,
/// its users' too: before authentication the address is all there is to key on.
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
    let per_user = RateLimitLayer::builder()
        .policy(Policy::new("per-user", per_minute(5)))
        .key(UserKey::new(|u: &User| Key::from(format!("user:{}", u.name))).or(PeerIp::new()))
        .store(MemoryStore::with_clock(clock))
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route(
            "/",
            get(|user: Option<Extension<User>>| async move {
                match user {
                    Some(Extension(u)) => format!("hello {}\n", u.name),
                    None => "hello anonymous\n".to_owned(),
                }
            }),
        )
        // Layers run outside-in from the last added: the failed-authentication limit
        // first, then authentication, then the per-user limit.
        .layer(per_user)
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
