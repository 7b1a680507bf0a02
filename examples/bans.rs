//! A login endpoint whose failed attempts ban the client: 3 failed logins per 15 minutes per
//! client IP (good logins cost nothing); the attempt after that is refused and bans the
//! address for 15 minutes, right password or not.
//!
//! ```text
//! cargo run --example bans
//! for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%{http_code}\n' -X POST -H 'X-Password: guess' http://127.0.0.1:3000/login; done
//! curl -si -X POST -H 'X-Password: open-sesame' http://127.0.0.1:3000/login   # 429, Retry-After: 900
//! ```

use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use ratekeeper_axum::RateLimitLayer;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::core::{Algorithm, Ban, Key, Policy, Quota};
use ratekeeper_axum::key::PeerIp;
use ratekeeper_axum::policy::Settle;

/// The demo password.
pub const PASSWORD: &str = "open-sesame";

/// The ban's length and the window failed logins are counted over: 15 minutes.
pub const FIFTEEN_MINUTES: Duration = Duration::from_secs(15 * 60);

/// The app on the monotonic clock.
pub fn app() -> Router {
    app_with(MonotonicClock::new())
}

/// `POST /login` (`200` for `X-Password: open-sesame`, else `401`) under the `login`
/// policy: 3 per 15 minutes per client IP over exactly the last 15 minutes (sliding log),
/// keeping only the charges of `401`s, with a ban after the first refusal lasting 15
/// minutes. The memory store reads time from `clock` (the tests pass a manual clock).
///
/// # Panics
///
/// Only if the static configuration above were invalid: a build error at startup, never at
/// request time.
pub fn app_with<C: Clock>(clock: C) -> Router {
    let quota = Quota::new(3, FIFTEEN_MINUTES).expect("3 per 15 minutes is a valid quota");
    let login = RateLimitLayer::builder()
        .policy(
            Policy::new("login", quota)
                .with_algorithm(Algorithm::SlidingLog)
                .with_ban(Ban::after(NonZeroU32::MIN, FIFTEEN_MINUTES).lasting(FIFTEEN_MINUTES)),
        )
        .settle("login", Settle::COUNT_UNAUTHORIZED)
        .key(PeerIp::new())
        .store(MemoryStore::<Key, C>::with_clock(clock))
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new().route("/login", post(login_handler).layer(login))
}

async fn login_handler(headers: HeaderMap) -> (StatusCode, &'static str) {
    if headers.get("x-password").is_some_and(|p| p == PASSWORD) {
        (StatusCode::OK, "welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong password\n")
    }
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
