//! An axum app with tiers: free users 60 per minute, paid users 1000, anonymous by IP on the free tier.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example tiers
//! curl -si -H 'Authorization: Bearer tok-bob' http://127.0.0.1:3000/ | grep -i x-ratelimit-limit   # 1000
//! ```

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(ratekeeper_examples::tiers_app(), &addr).await
}
