//! An axum app with a per-user budget (5 per minute): users behind one IP do not share it; anonymous
//! requests are limited by IP.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example nat_users
//! curl -s -H 'Authorization: Bearer tok-alice' http://127.0.0.1:3000/   # hello alice
//! ```

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let addr = ratekeeper_examples::listen_addr();
    ratekeeper_examples::serve(ratekeeper_examples::nat_users_app(), &addr).await
}
