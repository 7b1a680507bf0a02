//! A request the layer cannot key, over real HTTP: an RFC 9457 problem+json `400` in public
//! words by default, the user's answer when their rejection (the value that also shapes the
//! 429) implements `unkeyed`, and no answer at all when a fallback extractor keys it.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Response, StatusCode};
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::core::{Key, Policy, Quota};
use ratekeeper_axum::key::KeyExtractor;
use ratekeeper_axum::key::{HeaderKey, PeerIp};
use ratekeeper_axum::report::{Limited, Rejection, Unkeyed};
use ratekeeper_axum::{RateLimitBuilder, RateLimitLayer};
use ratekeeper_tests::TestServer;

fn limit<K: KeyExtractor>(key: K) -> RateLimitBuilder<K> {
    RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(1).expect("1")),
        ))
        .key(key)
}

async fn serve(layer: RateLimitLayer<impl KeyExtractor + Clone>) -> TestServer {
    TestServer::start(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

/// No API key: `400`, `application/problem+json`, a `detail` that names neither the header
/// nor the extractor (nothing like "rate-limit key missing: key header absent").
#[tokio::test]
async fn a_missing_key_gets_problem_json_in_public_words() {
    let server = serve(limit(HeaderKey::raw("x-api-key")).build().expect("layer")).await;
    let res = server.get("/").send().await.expect("GET /");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let text = res.text().await.expect("body");
    let problem: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["title"], "Bad Request");
    assert_eq!(problem["type"], "about:blank");
    assert!(
        problem["detail"].as_str().is_some_and(|d| d.len() > 20),
        "{text}"
    );
    for internal in ["x-api-key", "rate-limit key", "header", "missing"] {
        assert!(!text.contains(internal), "{internal:?} in {text}");
    }
    // An unrecognised credential (an `Authorization` value outside RFC 9110's grammar) is
    // answered the same way.
    let server = serve(
        limit(HeaderKey::raw("authorization"))
            .build()
            .expect("layer"),
    )
    .await;
    let res = server
        .get("/")
        .header("authorization", "Bearer")
        .send()
        .await
        .expect("GET /");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}

/// The user's rejection, the one that shapes the 429, answers the unkeyed request too when
/// it implements `unkeyed`: here a `401` with a challenge and a body of its own.
#[tokio::test]
async fn the_rejection_that_shapes_the_429_customises_the_missing_key_answer() {
    struct Branded;
    impl Rejection for Branded {
        fn reject(&self, limited: &Limited<'_>) -> Response<Bytes> {
            let mut res = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
            *res.status_mut() = limited.status();
            res
        }
        fn unkeyed(&self, unkeyed: &Unkeyed<'_>) -> Response<Bytes> {
            assert!(unkeyed.error().is_missing());
            Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header("www-authenticate", "ApiKey realm=\"api\"")
                .header("content-type", "application/json")
                .body(Bytes::from_static(b"{\"error\":\"send your API key\"}"))
                .expect("response")
        }
    }
    let layer = limit(HeaderKey::raw("x-api-key"))
        .rejection(Branded)
        .store(MemoryStore::<Key, _>::with_clock(ManualClock::new()))
        .build()
        .expect("layer");
    let server = TestServer::start(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let res = server.get("/").send().await.expect("GET /");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["www-authenticate"], "ApiKey realm=\"api\"");
    assert_eq!(
        res.text().await.expect("body"),
        "{\"error\":\"send your API key\"}"
    );
    // The same value still shapes the 429.
    let keyed = || server.get("/").header("x-api-key", "k-1");
    assert_eq!(keyed().send().await.expect("GET /").status(), 200);
    let limited = keyed().send().await.expect("GET /");
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        limited.text().await.expect("body"),
        "{\"error\":\"slow down\"}"
    );
}

/// With a fallback extractor, a request without an API key is keyed by its peer address
/// instead of being refused.
#[tokio::test]
async fn a_fallback_extractor_keys_the_request_instead() {
    let layer = limit(HeaderKey::raw("x-api-key").or(PeerIp::new()))
        .store(MemoryStore::<Key, _>::with_clock(ManualClock::new()))
        .build()
        .expect("layer");
    let server = TestServer::start(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    assert_eq!(server.get("/").send().await.expect("GET /").status(), 200);
    assert_eq!(server.get("/").send().await.expect("GET /").status(), 429);
}
