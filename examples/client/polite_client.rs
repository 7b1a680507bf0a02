//! A polite client: calls the `quickstart` server 13 times in a row through hyper's client
//! under `PoliteLayer`, and prints each status. The server allows 10 requests per minute; its
//! 10th answer says `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset: 60`, so the 11th call
//! waits until then (about a minute) instead of being refused: no 429 at all, or one if the
//! budget was already spent when the client started.
//!
//! ```text
//! ADDR=127.0.0.1:3000 cargo run --example quickstart &
//! ADDR=127.0.0.1:3000 cargo run -p ratekeeper-examples-client --example polite_client
//! ```
//!
//! `ADDR` is the server's address (default `127.0.0.1:3000`). The process exits with an error
//! if a call fails or more than one 429 comes back.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratekeeper_axum::client::PoliteLayer;
use tower::{Layer, ServiceExt};

const CALLS: usize = 13;

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let url: http::Uri = format!("http://{addr}/").parse()?;

    // Wait at most 90 s for a reset the server announced; a longer one fails the call.
    let polite = PoliteLayer::new().max_wait(Duration::from_secs(90));
    let client = polite.layer(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());

    let start = Instant::now();
    let mut refused = 0;
    for i in 1..=CALLS {
        let req = http::Request::get(url.clone()).body(Empty::new())?;
        let sent = Instant::now();
        let res = client.clone().oneshot(req).await?;
        let remaining = res
            .headers()
            .get("x-ratelimit-remaining")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        println!(
            "{i:>2}: {} remaining={remaining} (waited {:.1} s)",
            res.status().as_u16(),
            sent.elapsed().as_secs_f64()
        );
        if res.status() == http::StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    println!(
        "{CALLS} calls, {refused} rate limited (429), in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if refused > 1 {
        return Err(format!(
            "{refused} calls were refused with 429; a polite client gets at most one"
        )
        .into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
