//! CORS preflights over real HTTP: a made-up preflight on a catch-all route is counted like any
//! request that reaches a handler, while a real preflight answered by a CORS layer outside
//! the limiter stays free.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, Method};
use axum::routing::any;
use ratekeeper_axum::cors::EXPOSED_HEADERS;
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Policy, core::Quota};
use ratekeeper_tests::TestServer;
use tower_http::cors::CorsLayer;

const BODY: &str = r#"{"jsonrpc":"2.0","method":"eth_call","params":[],"id":1}"#;

/// Fixed window, 2 per 60,000 ms, per client IP (the default key).
fn limit(exempt_preflight: Option<bool>) -> RateLimitLayer {
    let builder = RateLimitLayer::builder().policy(
        Policy::new(
            "rpc",
            Quota::new(2, std::time::Duration::from_secs(60)).unwrap(),
        )
        .with_algorithm(Algorithm::FixedWindow),
    );
    match exempt_preflight {
        // The default, untouched.
        None => builder.build().unwrap(),
        Some(exempt) => builder.exempt_preflight(exempt).build().unwrap(),
    }
}

/// `/rpc`: a catch-all route whose handler does the work whatever the method; counts runs.
fn rpc(runs: &Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/rpc",
            any(|State(runs): State<Arc<AtomicUsize>>| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "result"
            }),
        )
        .with_state(Arc::clone(runs))
}

/// 3 POSTs, then 5 OPTIONS that look like preflights and carry the same JSON body; the
/// statuses, in order.
async fn preflight_sequence(server: &TestServer) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = server
            .post("/rpc")
            .header("content-type", "application/json")
            .body(BODY)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    for _ in 0..5 {
        let res = server
            .request(Method::OPTIONS, "/rpc")
            .header("origin", "https://evil.example")
            .header("access-control-request-method", "POST")
            .header("content-type", "application/json")
            .body(BODY)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    statuses
}

/// OPTIONS requests that look like preflights but reach the handler are counted like any
/// request (the report <https://github.com/sei-protocol/sei-chain/pull/3779>: every OPTIONS
/// request was exempt, and an RPC server dispatched one carrying a JSON-RPC body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_preflights_are_counted_by_default() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = TestServer::start(rpc(&runs).layer(limit(None))).await;
    let statuses = preflight_sequence(&server).await;
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429]);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the handler runs 2 times, not 7"
    );
}

/// The opt-in preflight exemption does not cover an OPTIONS request with a body (the report
/// <https://github.com/sei-protocol/sei-chain/pull/3779>).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opt_in_exemption_does_not_cover_a_preflight_with_a_body() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = TestServer::start(rpc(&runs).layer(limit(Some(true)))).await;
    let statuses = preflight_sequence(&server).await;
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Real preflights answered by a CORS layer outside the limiter are never counted (the
/// report <https://github.com/express-rate-limit/express-rate-limit/issues/69>: preflights
/// counted as full requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_preflights_answered_by_cors_outside_the_limiter_stay_free() {
    let origin = "https://app.example";
    let runs = Arc::new(AtomicUsize::new(0));
    let cors = CorsLayer::new()
        .allow_origin(HeaderValue::from_static(origin))
        .allow_methods([Method::POST])
        .expose_headers(EXPOSED_HEADERS.clone());
    let server = TestServer::start(rpc(&runs).layer(limit(None)).layer(cors)).await;
    // Real preflights (no body) before, between and after the POSTs: CORS answers them,
    // never the limiter, so they are free and never 429, even once the quota is spent.
    let preflight = || async {
        let res = server
            .request(Method::OPTIONS, "/rpc")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "{}", res.status());
        assert!(res.headers().get("x-ratelimit-remaining").is_none());
    };
    let mut statuses = Vec::new();
    for _ in 0..3 {
        preflight().await;
        let res = server
            .post("/rpc")
            .header("origin", origin)
            .body(BODY)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    preflight().await;
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
