//! Late refunds over real HTTP (the report
//! <https://github.com/express-rate-limit/express-rate-limit/pull/647>: a request that
//! began in one window and finished after the counter reset was refunded anyway, freeing
//! someone else's quota), with a manual clock: a settle rule gives a charge back when the
//! response is a 5xx, and a refund that arrives after its charge expired (the window
//! closed, the log entry expired, the bucket drained it) frees nothing, for every algorithm
//! of the report. The control shows that an in-window refund still works.
//!
//! Config: limit 2 per 60,000 ms per client IP, `Settle::REFUND_SERVER_ERRORS`. `GET /slow`
//! answers 500 only when the test releases it; `GET /ok` answers 200.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use ratekeeper_axum::policy::Settle;
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Policy, core::Quota};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::MemoryStore;
use ratekeeper_tests::TestServer;
use tokio::sync::{Notify, mpsc};

const MS: u64 = 1_000_000;
/// The longest any single step of a test may take.
const STEP: Duration = Duration::from_secs(10);

/// Status, `X-RateLimit-Remaining` and `Retry-After` of one response.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    remaining: Option<String>,
    retry_after: Option<String>,
}

fn seen(status: u16, remaining: u32, retry_after: Option<u64>) -> Seen {
    Seen {
        status,
        remaining: Some(remaining.to_string()),
        retry_after: retry_after.map(|r| r.to_string()),
    }
}

async fn send(req: reqwest::RequestBuilder) -> Seen {
    let res = tokio::time::timeout(STEP, req.send())
        .await
        .expect("the server answers within the step timeout")
        .expect("the request reaches the server");
    let h = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Seen {
        status: res.status().as_u16(),
        remaining: h("x-ratelimit-remaining"),
        retry_after: h("retry-after"),
    }
}

/// The times (ms on the manual clock) of one run: R1 (`/slow`), R2 and R3 (`/ok`), R1's
/// 500 (the refund), R4 (`/ok`).
struct Times {
    r1: u64,
    r2_r3: u64,
    refund: u64,
    r4: u64,
}

/// Runs the late-refund trace for `algorithm` and returns what R1, R2, R3 and R4 saw.
async fn run(algorithm: Algorithm, t: Times) -> [Seen; 4] {
    let clock = ManualClock::new();
    // 2 per 60,000 ms; for the token bucket family burst 2, one unit per 30,000 ms.
    let quota = Quota::new(2, Duration::from_secs(60)).unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", quota).with_algorithm(algorithm))
        .settle("default", Settle::REFUND_SERVER_ERRORS)
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let entered_tx = entered_tx.clone();
                let gate = Arc::clone(&gate);
                async move {
                    let _ = entered_tx.send(());
                    gate.notified().await;
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            }),
        )
        .route("/ok", get(|| async { "ok" }))
        .layer(layer);
    let server = TestServer::start(app).await;

    clock.set(t.r1 * MS);
    let slow = tokio::spawn(send(server.get("/slow")));
    // R1 was charged and its handler is running before the clock moves on.
    tokio::time::timeout(STEP, entered.recv())
        .await
        .expect("R1 reaches its handler")
        .expect("the handler is alive");
    clock.set(t.r2_r3 * MS);
    let r2 = send(server.get("/ok")).await;
    let r3 = send(server.get("/ok")).await;
    clock.set(t.refund * MS);
    release.notify_one();
    let r1 = tokio::time::timeout(STEP, slow)
        .await
        .expect("R1 answers once released")
        .expect("R1's task completes");
    clock.set(t.r4 * MS);
    let r4 = send(server.get("/ok")).await;
    [r1, r2, r3, r4]
}

/// R1's 500 still carries the headers of its (allowed) decision.
fn r1_500(remaining: u32) -> Seen {
    seen(500, remaining, None)
}

/// Late refund (<https://github.com/express-rate-limit/express-rate-limit/pull/647>), fixed window:
/// R1's refund after its window closed frees nothing; R4 is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_late_refund_frees_nothing() {
    let times = Times {
        r1: 59_000,
        r2_r3: 60_500,
        refund: 61_000,
        r4: 62_000,
    };
    let [r1, r2, r3, r4] = run(Algorithm::FixedWindow, times).await;
    assert_eq!(r1, r1_500(1));
    assert_eq!(r2, seen(200, 1, None));
    assert_eq!(r3, seen(200, 0, None));
    // The window of 60,000..120,000 ms ends in 58 s.
    assert_eq!(r4, seen(429, 0, Some(58)));
}

/// Late refund (<https://github.com/express-rate-limit/express-rate-limit/pull/647>), sliding log:
/// R1's refund after its entry left the log frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_late_refund_frees_nothing() {
    let times = Times {
        r1: 0,
        r2_r3: 60_500,
        refund: 61_000,
        r4: 62_000,
    };
    let [r1, r2, r3, r4] = run(Algorithm::SlidingLog, times).await;
    assert_eq!(r1, r1_500(1));
    assert_eq!(r2, seen(200, 1, None));
    assert_eq!(r3, seen(200, 0, None));
    // The entry of t = 60,500 leaves at 120,500: 58.5 s, rounded up.
    assert_eq!(r4, seen(429, 0, Some(59)));
}

/// Late refund (<https://github.com/express-rate-limit/express-rate-limit/pull/647>), sliding
/// window counter: R1's refund after its window stopped counting frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_counter_late_refund_frees_nothing() {
    let times = Times {
        r1: 0,
        r2_r3: 120_500,
        refund: 121_000,
        r4: 122_000,
    };
    let [r1, r2, r3, r4] = run(Algorithm::SlidingWindow, times).await;
    assert_eq!(r1, r1_500(1));
    assert_eq!(r2, seen(200, 1, None));
    assert_eq!(r3, seen(200, 0, None));
    // The formula's wait: window 2 holds 2, so one more fits in window 3 once
    // 2 * (1 - e) + 1 <= 2, e >= 0.5: 58 s to its start plus 30 s.
    assert_eq!(r4, seen(429, 0, Some(88)));
}

/// Late refund (<https://github.com/express-rate-limit/express-rate-limit/pull/647>), token bucket
/// and leaky bucket: R1's refund after the bucket drained its charge frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_and_leaky_bucket_late_refund_frees_nothing() {
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        // The bucket is full again at 120,000 ms, when R2 and R3 arrive and R1 answers.
        let times = Times {
            r1: 0,
            r2_r3: 120_000,
            refund: 120_000,
            r4: 120_001,
        };
        let [r1, r2, r3, r4] = run(algorithm, times).await;
        assert_eq!(r1, r1_500(1), "{algorithm}");
        assert_eq!(r2, seen(200, 1, None), "{algorithm}");
        assert_eq!(r3, seen(200, 0, None), "{algorithm}");
        // The next unit drains at 150,000 ms: 29.999 s, rounded up.
        assert_eq!(r4, seen(429, 0, Some(30)), "{algorithm}");
    }
}

/// Late refund (<https://github.com/express-rate-limit/express-rate-limit/pull/647>), control: a
/// refund inside its charge's window still gives the charge back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_window_refund_still_works() {
    let times = Times {
        r1: 1_000,
        r2_r3: 1_500,
        refund: 2_000,
        r4: 3_000,
    };
    let [r1, r2, r3, r4] = run(Algorithm::FixedWindow, times).await;
    assert_eq!(r1, r1_500(1));
    assert_eq!(r2, seen(200, 0, None));
    assert_eq!(r3.status, 429);
    assert_eq!(r3.remaining.as_deref(), Some("0"));
    assert_eq!(r4, seen(200, 0, None));
}
