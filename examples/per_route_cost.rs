//! An axum app where `GET /search` costs 10 units and `GET /status` 1, out of 100 per minute per client IP.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example per_route_cost
//! curl -si http://127.0.0.1:3000/search | grep -i x-ratelimit-remaining   # 90
//! ```

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(ratekeeper_examples::per_route_cost_app(), &addr).await
}
