//! The admin recipe as an app: `/api` limited per customer (3 per minute), the customer read
//! from `X-Api-Key` (`key-<name>`), and the README's admin routes, behind a bearer token,
//! that show a customer's usage and give them their budget back.
//!
//! ```text
//! ADMIN_TOKEN=s3cret cargo run --example admin
//! for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'X-Api-Key: key-alice' http://127.0.0.1:3000/api; done
//! curl -s -H 'Authorization: Bearer s3cret' http://127.0.0.1:3000/admin/limits/alice
//! curl -s -X DELETE -H 'Authorization: Bearer s3cret' http://127.0.0.1:3000/admin/limits/alice
//! ```
//!
//! Without `ADMIN_TOKEN` the example makes up a token and prints it.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::RateLimitLayer;
use ratekeeper_axum::core::clock::{Clock, MonotonicClock};
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::core::{Key, Policy, Quota};
use ratekeeper_axum::key::HeaderKey;

// The README's recipe ("Unblocking a customer: an admin route"), word for word.
#[path = "recipes/admin_route.rs"]
mod recipe;

pub use recipe::{admin_routes, customer_key};

/// The app on the monotonic clock.
pub fn app(admin_token: &str) -> Router {
    app_with(MonotonicClock::new(), admin_token)
}

/// `/api` limited to 3 requests per minute per customer (`X-Api-Key: key-<name>`; another
/// value or none is a `400`), and the admin routes for `admin_token`, on a memory store
/// reading time from `clock` (the tests pass a manual clock).
///
/// # Panics
///
/// Only if the static configuration above were invalid: a build error at startup, never at
/// request time.
pub fn app_with<C: Clock + Clone>(clock: C, admin_token: &str) -> Router {
    let limit = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN)),
        ))
        .key(HeaderKey::validated("X-Api-Key", |raw: &str| {
            raw.strip_prefix("key-").map(customer_key)
        }))
        .store(MemoryStore::<Key, C>::with_clock(clock))
        .build()
        .expect("static rate-limit configuration is valid");
    Router::new()
        .route("/api", get(|| async { "hello\n" }))
        .layer(limit.clone())
        .merge(admin_routes(&limit, admin_token))
}

/// `ADMIN_TOKEN`, or a token made up from the process's random hash keys (printed).
fn admin_token() -> String {
    if let Ok(token) = std::env::var("ADMIN_TOKEN") {
        return token;
    }
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    let token = format!("admin-{random:016x}");
    println!("ADMIN_TOKEN is not set; the admin token is {token}");
    token
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    let app = app(&admin_token());
    ratekeeper_examples::serve(app, &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
