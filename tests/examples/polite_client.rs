//! A polite client (hyper's client under `ratekeeper_tower::client::PoliteLayer`) against a
//! real limited server on loopback: 10 requests per minute per client IP, burst 10, as in the
//! `quickstart` example. The server's limiter and the client's waits both read tokio's paused
//! clock, so a 60 s wait takes no real time; the server logs when each request reached it,
//! before the limiter, so a request sent during a wait would show.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::routing::get;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratekeeper_axum::client::{ClientKey, Origin, PoliteLayer};
use ratekeeper_axum::core::clock::TokioClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota};
use ratekeeper_tests::spawn;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// Times (since the test's start) at which requests reached the server.
type Seen = Arc<Mutex<Vec<Duration>>>;

/// The quickstart app's limit (10/min per client IP) on tokio's clock, with `style` headers,
/// behind a middleware that logs every request before the limiter sees it.
async fn limited_server(style: HeaderStyle, start: Instant) -> (String, Seen) {
    let limit = RateLimitLayer::builder()
        .policy(Policy::new(
            "default",
            Quota::per_minute(NonZeroU32::new(10).unwrap()),
        ))
        .store(MemoryStore::with_clock(TokioClock::new()))
        .headers(style)
        .build()
        .unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello from ratekeeper\n" }))
        .layer(limit)
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            log.lock().unwrap().push(start.elapsed());
            next.run(req)
        }));
    let addr = spawn(app).await;
    (format!("http://{addr}/"), seen)
}

/// What the client saw of one response: status, and when it arrived (since the start).
#[derive(Debug)]
struct Got {
    status: u16,
    at: Duration,
    /// The wait the layer recorded for the server's origin right after this response.
    wait_after: Option<Duration>,
}

/// Sends `n` GETs to `url` one after another through a polite hyper client.
async fn polite_calls(url: &str, n: usize, start: Instant) -> Vec<Got> {
    let layer = PoliteLayer::new().max_wait(Duration::from_secs(120));
    let hyper = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = layer.layer(hyper);
    let uri: http::Uri = url.parse().unwrap();
    let (parts, ()) = http::Request::get(uri.clone())
        .body(())
        .unwrap()
        .into_parts();
    let key = Origin.key(&parts);
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        let req = http::Request::get(uri.clone()).body(Empty::new()).unwrap();
        let res = client.clone().oneshot(req).await.unwrap();
        got.push(Got {
            status: res.status().as_u16(),
            at: start.elapsed(),
            wait_after: layer.wait_for(&key),
        });
    }
    got
}

/// The properties every run must show: at most one 429; after each response that announced
/// a wait, the server saw nothing until the wait was over; and the client did wait.
fn assert_polite(got: &[Got], seen: &[Duration]) {
    let refused = got.iter().filter(|g| g.status == 429).count();
    assert!(refused <= 1, "{refused} 429s: {got:?}");
    assert!(got.iter().all(|g| matches!(g.status, 200 | 429)), "{got:?}");
    assert_eq!(seen.len(), got.len(), "the server saw every request once");
    let mut waits = 0;
    for (i, g) in got.iter().enumerate() {
        let Some(wait) = g.wait_after else { continue };
        waits += 1;
        let quiet_until = g.at + wait;
        for &t in &seen[i + 1..] {
            assert!(
                t >= quiet_until,
                "a request reached the server at {t:?}, during the wait until {quiet_until:?}: {got:?} {seen:?}"
            );
        }
    }
    assert!(waits >= 1, "the client never had to wait: {got:?}");
}

#[tokio::test(start_paused = true)]
async fn thirteen_calls_with_x_ratelimit_headers_get_no_429() {
    let start = Instant::now();
    let (url, seen) = limited_server(HeaderStyle::XRateLimit, start).await;
    let got = polite_calls(&url, 13, start).await;
    let seen = seen.lock().unwrap().clone();
    assert_polite(&got, &seen);
    // The 10th response says "remaining 0, reset in 60 s": the 11th request waits a minute.
    assert!(got.iter().all(|g| g.status == 200), "{got:?}");
    assert_eq!(got[9].wait_after, Some(Duration::from_secs(60)));
    assert!(seen[10] - seen[9] >= Duration::from_secs(60), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn thirteen_calls_with_ietf_headers_get_no_429() {
    let start = Instant::now();
    let (url, seen) = limited_server(HeaderStyle::Ietf, start).await;
    let got = polite_calls(&url, 13, start).await;
    let seen = seen.lock().unwrap().clone();
    assert_polite(&got, &seen);
    assert!(got.iter().all(|g| g.status == 200), "{got:?}");
    assert!(seen[10] - seen[9] >= Duration::from_secs(60), "{seen:?}");
}

/// A budget already spent by someone else on the same IP: the first call gets the one 429
/// (with `Retry-After: 6`), and the next waits until the reset it announced.
#[tokio::test(start_paused = true)]
async fn an_exhausted_budget_costs_exactly_one_429() {
    let start = Instant::now();
    let (url, seen) = limited_server(HeaderStyle::XRateLimit, start).await;
    let plain = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for _ in 0..10 {
        let req = http::Request::get(url.as_str()).body(Empty::new()).unwrap();
        assert_eq!(plain.request(req).await.unwrap().status(), 200);
    }
    let got = polite_calls(&url, 3, start).await;
    let seen = seen.lock().unwrap().clone();
    let statuses: Vec<u16> = got.iter().map(|g| g.status).collect();
    assert_eq!(statuses, [429, 200, 200]);
    assert_polite(&got, &seen[10..]);
    assert!(seen[11] - seen[10] >= Duration::from_secs(60), "{seen:?}");
}
