//! Outbound throttling: a client that calls a rate-limited API as fast as it can and never
//! gets a 429, because it waits for capacity under the same rate first.
//!
//! The example starts the upstream API itself (a ratekeeper-limited axum app, 50 requests
//! per second per client IP, on `ADDR`, default `127.0.0.1:3000`), then runs four client
//! tasks against it for `DURATION_SECS` seconds (default 5) and prints what they saw.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example outbound_throttle
//! ```

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let addr = ratekeeper_examples::listen_addr();
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("upstream listening on {local}");
    tokio::spawn(async move {
        let app = ratekeeper_examples::upstream_app()
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("upstream failed: {err}");
        }
    });
    let secs = std::env::var("DURATION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let report = ratekeeper_examples::run_outbound_client(
        &format!("http://{local}"),
        Duration::from_secs(secs),
        4,
    )
    .await?;
    println!(
        "{} ok, {} rate limited, {} failed in {:.2} s: {:.1} calls/s (quota {})",
        report.ok,
        report.limited,
        report.failed,
        report.elapsed.as_secs_f64(),
        report.rate(),
        ratekeeper_examples::UPSTREAM_QUOTA,
    );
    Ok(())
}
