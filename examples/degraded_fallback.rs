//! Degraded-response fallback: `GET /prices` is computed fresh twice per minute per client IP;
//! beyond that the client gets the cached answer, marked `RateLimit-Degraded`, instead of a 429.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example degraded_fallback
//! for i in 1 2 3; do curl -si http://127.0.0.1:3000/prices | grep -iE '^(ratelimit-degraded|x-ratelimit-remaining)|prices'; done
//! ```

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(ratekeeper_examples::degraded_fallback_app(), &addr).await
}
