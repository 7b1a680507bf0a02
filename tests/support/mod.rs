//! Helpers for the end-to-end tests: real servers on 127.0.0.1, port 0.

pub mod redis;

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` with connect info on `127.0.0.1:0` in a background task; returns its address.
///
/// # Panics
///
/// When no loopback port can be bound (a test environment failure).
pub async fn spawn(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server failed");
    });
    addr
}

/// A client that opens a new TCP connection for every request (no keep-alive pool).
///
/// # Panics
///
/// When the client cannot be built.
pub fn fresh_connection_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}
