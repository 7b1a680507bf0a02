//! An axum app limited to 10 requests per minute per client IP (burst 10), in memory.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example quickstart
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(ratekeeper_examples::quickstart_app(), &addr).await
}
