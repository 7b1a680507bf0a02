//! An axum app limited to 10 requests per minute per client IP (burst 10), in memory.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example quickstart
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::{RateLimitLayer, core::Quota};

/// `GET /`, limited to 10 requests per minute per client IP (burst 10), in memory.
pub fn app() -> Router {
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    Router::new()
        .route("/", get(|| async { "hello from ratekeeper\n" }))
        .layer(RateLimitLayer::new(quota))
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
