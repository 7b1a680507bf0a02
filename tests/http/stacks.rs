//! A 429 turned into a 200, headers dropped on 429, headers duplicated (the report
//! <https://github.com/benwis/tower-governor/issues/8>: without a `BufferLayer` the 429
//! reached the client as a 200 with an empty body).
//!
//! Two policies on `GET /api` (global 100 per 60 s; route: burst 1, 1 per 10 s), a custom
//! JSON rejection, and every stack variant: bare, `HandleErrorLayer`, `BufferLayer` +
//! `HandleErrorLayer` (axum needs `Infallible` errors, so `BufferLayer` alone is checked at
//! the tower level), and the two policies as nested layers (`Router::layer` +
//! `route_layer`). R1 at t = 0 and R2 at t = 1 ms.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use bytes::Bytes;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::report::Limited;
use ratekeeper_axum::{
    RateLimitLayer, core::Algorithm, core::Key, core::Policy, core::Quota, key::GlobalKey,
};
use ratekeeper_tests::TestServer;
use tower::buffer::BufferLayer;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// Fixed window, 100 per 60,000 ms.
fn global() -> Policy {
    Policy::new("global", Quota::per_minute(NonZeroU32::new(100).unwrap()))
        .with_algorithm(Algorithm::FixedWindow)
}

/// Token bucket (GCRA), burst 1, 1 per 10,000 ms.
fn route() -> Policy {
    Policy::new("route", Quota::new(1, Duration::from_secs(10)).unwrap())
}

/// The custom error handler: a JSON body, status from `Limited::status`, never from a message.
fn json_rejection(limited: &Limited<'_>) -> http::Response<Bytes> {
    let body = format!(
        "{{\"error\":\"rate_limited\",\"retry_after\":{}}}",
        limited.retry_after_secs().unwrap_or(0)
    );
    http::Response::builder()
        .status(limited.status())
        .header("content-type", "application/json")
        .body(Bytes::from(body))
        .unwrap()
}

type Layer = RateLimitLayer<GlobalKey, u64, MemoryStore<Key, ManualClock>>;

fn layer(policies: &[Policy], clock: &ManualClock) -> Layer {
    let mut builder = RateLimitLayer::builder()
        .key(GlobalKey)
        .store(MemoryStore::with_clock(clock.clone()))
        .rejection(json_rejection);
    for p in policies {
        builder = builder.policy(p.clone());
    }
    builder.build().unwrap()
}

fn api() -> Router {
    Router::new().route("/api", get(|| async { "api" }))
}

async fn handle(err: BoxError) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}"))
}

/// The error handler when nothing in the stack can fail.
async fn handle_infallible(err: Infallible) -> (StatusCode, String) {
    match err {}
}

fn once(headers: &HeaderMap, name: &str, value: &str) {
    let all: Vec<_> = headers.get_all(name).iter().collect();
    assert_eq!(all, vec![value], "{name}");
}

async fn run(server: TestServer, clock: &ManualClock, variant: &str) {
    let r1 = server.get("/api").send().await.unwrap();
    assert_eq!(r1.status(), 200, "{variant}");
    let h = r1.headers();
    once(h, "x-ratelimit-limit", "1");
    once(h, "x-ratelimit-remaining", "0");
    once(h, "x-ratelimit-reset", "10");
    assert!(h.get("retry-after").is_none(), "{variant}");
    assert_eq!(r1.text().await.unwrap(), "api");

    clock.advance(Duration::from_millis(1));
    let r2 = server.get("/api").send().await.unwrap();
    assert_eq!(r2.status(), 429, "{variant}");
    let h = r2.headers();
    once(h, "retry-after", "10");
    once(h, "x-ratelimit-limit", "1");
    once(h, "x-ratelimit-remaining", "0");
    once(h, "x-ratelimit-reset", "10");
    once(h, "cache-control", "no-store");
    once(h, "content-type", "application/json");
    assert_eq!(
        r2.text().await.unwrap(),
        "{\"error\":\"rate_limited\",\"retry_after\":10}",
        "{variant}"
    );
}

/// The 429's status, headers and JSON body survive every stack variant, each header once
/// (the report <https://github.com/benwis/tower-governor/issues/8>).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_headers_survive_every_stack() {
    // Bare.
    let clock = ManualClock::new();
    let app = api().layer(layer(&[global(), route()], &clock));
    run(TestServer::start(app).await, &clock, "bare").await;

    // HandleErrorLayer without BufferLayer.
    let clock = ManualClock::new();
    let app = api().layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(handle_infallible))
            .layer(layer(&[global(), route()], &clock)),
    );
    run(TestServer::start(app).await, &clock, "handle-error").await;

    // BufferLayer + HandleErrorLayer.
    let clock = ManualClock::new();
    let app = api().layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(handle))
            .layer(BufferLayer::new(64))
            .layer(layer(&[global(), route()], &clock)),
    );
    run(TestServer::start(app).await, &clock, "buffer+handle-error").await;

    // Global limit on the router, route limit on the route: nested layers, headers once.
    let clock = ManualClock::new();
    let app = api()
        .route_layer(layer(&[route()], &clock))
        .layer(layer(&[global()], &clock));
    run(TestServer::start(app).await, &clock, "nested").await;
}

/// At the tower level (<https://github.com/benwis/tower-governor/issues/8>): `BufferLayer` without
/// `HandleErrorLayer` keeps the 429 and its headers.
#[tokio::test]
async fn a_buffer_without_handle_error_keeps_the_429() {
    // Without HandleErrorLayer the stack's error type is BoxError, which axum cannot serve;
    // at the tower level the 429 is still a response, not an error.
    let clock = ManualClock::new();
    let svc = ServiceBuilder::new()
        .layer(BufferLayer::new(8))
        .layer(layer(&[global(), route()], &clock))
        .service_fn(|_req: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("api")))
        });
    let r1 = svc.clone().oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(r1.status(), 200);
    once(r1.headers(), "x-ratelimit-limit", "1");
    once(r1.headers(), "x-ratelimit-remaining", "0");
    once(r1.headers(), "x-ratelimit-reset", "10");
    clock.advance(Duration::from_millis(1));
    let r2 = svc.oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(r2.status(), 429);
    once(r2.headers(), "retry-after", "10");
    once(r2.headers(), "x-ratelimit-limit", "1");
    once(r2.headers(), "x-ratelimit-remaining", "0");
    once(r2.headers(), "x-ratelimit-reset", "10");
}
