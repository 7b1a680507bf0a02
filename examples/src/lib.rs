//! The apps behind the runnable examples, as functions, so the end-to-end tests exercise
//! exactly what `cargo run --example ...` serves.
//!
//! ```
//! let app = ratekeeper_examples::quickstart_app();
//! # let _ = app;
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::{Quota, RateLimitLayer};

/// The address an example listens on: `ADDR`, or `127.0.0.1:3000`.
pub fn listen_addr() -> String {
    std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
}

/// `quickstart`: 10 requests per minute per client IP (burst 10), in memory.
pub fn quickstart_app() -> Router {
    let quota = Quota::per_minute(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
    Router::new()
        .route("/", get(|| async { "hello from ratekeeper\n" }))
        .layer(RateLimitLayer::new(quota))
}

/// Binds `addr`, prints `listening on <addr>` once connections are accepted, and serves
/// `app` with connect info (so the peer IP is known) until Ctrl-C.
///
/// # Errors
///
/// When the address cannot be bound or the server fails.
pub async fn serve(app: Router, addr: &str) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
