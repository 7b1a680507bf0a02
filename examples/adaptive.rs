//! An axum app that finds its own concurrency limit: a slow endpoint served by a pool of 4
//! workers (50 ms each, so 80 requests per second at most) behind an
//! the adaptive `ConcurrencyLimitLayer`, with two priority partitions. `/checkout` is critical (90 %
//! of the limit guaranteed), everything else sheddable (10 %): under overload, browsing
//! gets `503` with `Retry-After: 1` first, and checkouts keep their share.
//!
//! ```text
//! ADDR=127.0.0.1:3000 RUST_LOG=ratekeeper_tower=debug cargo run --example adaptive
//! # 40 browsing requests at once, then one checkout:
//! for i in $(seq 40); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/browse & done; \
//!   curl -s -o /dev/null -w 'checkout %{http_code}\n' http://127.0.0.1:3000/checkout; wait
//! ```
//!
//! The debug log shows each change of the limit (`adaptive concurrency limit changed`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use ratekeeper_axum::RequestParts;
use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
use tokio::sync::Semaphore;

/// Workers in the pool.
pub const WORKERS: usize = 4;
/// Time one worker spends on a request.
pub const SERVICE_TIME: Duration = Duration::from_millis(50);

/// The partition of a request: `/checkout` is critical, the rest sheddable.
pub fn priority(req: &RequestParts<'_>) -> &'static str {
    if req.uri().path() == "/checkout" {
        "critical"
    } else {
        "sheddable"
    }
}

/// Waits for a worker, then works for [`SERVICE_TIME`].
async fn work(State(pool): State<Arc<Semaphore>>) -> &'static str {
    match pool.acquire().await {
        Ok(_worker) => {
            tokio::time::sleep(SERVICE_TIME).await;
            "done\n"
        }
        Err(_) => "pool closed\n",
    }
}

/// `/checkout` and `/browse` on one worker pool, behind the adaptive limit (one limit for
/// the whole app: the pool is shared).
pub fn app() -> Router {
    let layer = ConcurrencyLimitLayer::adaptive()
        .min_limit(2)
        .initial_limit(8)
        .max_limit(64)
        .partition("critical", 0.9)
        .partition("sheddable", 0.1)
        .classify(priority)
        .build()
        .expect("static adaptive concurrency configuration is valid");
    Router::new()
        .route("/checkout", get(work))
        .route("/browse", get(work))
        .with_state(Arc::new(Semaphore::new(WORKERS)))
        .layer(layer)
}

async fn run() -> std::io::Result<()> {
    ratekeeper_examples::init_tracing();
    ratekeeper_examples::serve(app(), &ratekeeper_examples::listen_addr()).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(run().await)
}
