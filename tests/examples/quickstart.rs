//! The quickstart app over real HTTP: 12 requests from one client, and one budget shared by
//! every connection (hence every clone of the service).

use std::num::NonZeroU32;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Quota, key::GlobalKey};
use ratekeeper_tests::{TestServer, bind_loopback, fresh_connection_client};

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twelve_requests_get_ten_200s_then_two_429s() {
    let server = TestServer::start(quickstart::app()).await;
    for expected_remaining in (0..10).rev() {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 200);
        let h = res.headers();
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(
            h["x-ratelimit-remaining"],
            expected_remaining.to_string().as_str()
        );
        let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&reset), "reset {reset}");
        assert!(h.get("retry-after").is_none());
        assert_eq!(res.text().await.unwrap(), "hello from ratekeeper\n");
    }
    for _ in 0..2 {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 429);
        let h = res.headers();
        assert_eq!(h["retry-after"], "6");
        assert_eq!(h["content-type"], "application/problem+json");
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "60");
        let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"], serde_json::json!(["default"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_connections_share_one_budget_per_client_ip() {
    let server = TestServer::start(quickstart::app())
        .await
        .with_client(fresh_connection_client());
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                server
                    .get("/")
                    .header("connection", "close")
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, limited), (10, 40));
}

/// One layer on two routes shares one limiter; clones share it; readiness is free (the report
/// <https://github.com/tokio-rs/axum/issues/2634>: a rate limit's state not shared across an axum
/// router's clones).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_shared_across_routes_clones_and_readiness() {
    use axum::{Router, routing::get};
    use std::convert::Infallible;
    use tower::{Service, ServiceExt};

    let five = Quota::per_second(NonZeroU32::new(5).unwrap());
    // Time stands still (a manual clock), so no unit refills between the requests however
    // slowly a loaded machine sends them: the counts are exact.
    let store = || MemoryStore::<Key, _>::with_clock(ManualClock::new());
    // Test 2: the same layer on /a and /b.
    let layer = RateLimitLayer::builder()
        .quota(five)
        .key(GlobalKey)
        .store(store())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(layer.clone()))
        .route("/b", get(|| async { "b" }).layer(layer));
    let server = TestServer::start(app).await;
    let mut statuses = Vec::new();
    for path in ["/a", "/a", "/a", "/b", "/b", "/b"] {
        let res = server.get(path).send().await.unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);

    // Tests 3 and 4 at the tower level: clones share state; poll_ready never deducts.
    let layer = RateLimitLayer::builder()
        .quota(five)
        .key(GlobalKey)
        .store(store())
        .build()
        .unwrap();
    let svc1 =
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_req: http::Request<String>| async {
                Ok::<_, Infallible>(http::Response::new(String::new()))
            });
    let mut svc2 = svc1.clone();
    for _ in 0..100 {
        std::future::poll_fn(|cx| svc2.poll_ready(cx))
            .await
            .unwrap();
    }
    for _ in 0..5 {
        let res = svc1
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = svc2.call(http::Request::new(String::new())).await.unwrap();
    assert_eq!(res.status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_connect_info_is_a_500_not_a_panic() {
    use axum::{Router, routing::get};
    let app: Router = Router::new()
        .route("/", get(|| async { "x" }))
        .layer(RateLimitLayer::new(Quota::per_second(NonZeroU32::MIN)));
    let (listener, addr) = bind_loopback().await;
    // Served without connect info on purpose.
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
    assert_eq!(problem["status"], 500);
    assert_eq!(problem["title"], "Internal Server Error");
}
