//! The quickstart limits (10 requests per minute per client IP, burst 10) on Redis: every
//! instance started with the same `REDIS_URL` shares one budget per client IP.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3000 cargo run --example distributed &
//! REDIS_URL=redis://127.0.0.1:6379/ ADDR=127.0.0.1:3001 cargo run --example distributed &
//! for i in $(seq 6); do
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3000/
//!   curl -s -o /dev/null -w '%{http_code} %header{x-ratelimit-remaining}\n' http://127.0.0.1:3001/
//! done
//! ```
//!
//! The twelve requests alternate between the two instances; the remaining count goes down
//! 9, 8, ... 0 across both, and the last two are 429s.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    let app = ratekeeper_examples::distributed_app(&ratekeeper_examples::redis_url()).await?;
    ratekeeper_examples::serve(app, &addr).await?;
    Ok(())
}
