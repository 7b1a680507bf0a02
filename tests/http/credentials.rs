//! Keys from credentials over real HTTP: an `Authorization` credential is read by RFC 9110
//! §11 (scheme in any case, runs of whitespace as one), so every spelling of one bearer
//! token shares one budget, distinct tokens keep distinct budgets, and a value that is not a
//! credential falls back to the next extractor.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::RateLimitLayer;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::core::{Key, Policy, Quota};
use ratekeeper_axum::key::{HeaderKey, PeerIp};
use ratekeeper_tests::TestServer;
use ratekeeper_tests::logs::Captured;

/// A server limiting `GET /` to `limit` requests a minute per `Authorization` credential,
/// falling back to the peer IP, on a store whose clock never moves.
async fn per_credential(limit: u32) -> TestServer {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "per-token",
            Quota::per_minute(NonZeroU32::new(limit).expect("non-zero")),
        ))
        .key(HeaderKey::raw("Authorization").or(PeerIp::new()))
        .store(MemoryStore::<Key, _>::with_clock(ManualClock::new()))
        .build()
        .expect("layer");
    TestServer::start(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

async fn status(server: &TestServer, authorization: &str) -> u16 {
    server
        .get("/")
        .header("authorization", authorization)
        .send()
        .await
        .expect("GET /")
        .status()
        .as_u16()
}

/// `Bearer abc`, `bearer abc`, `Bearer  abc` and `BEARER abc` are one credential: four
/// requests spend a budget of four, the fifth (in any spelling) is refused, and another
/// token still has its own budget.
#[tokio::test]
async fn spellings_of_one_bearer_token_share_one_budget() {
    let server = per_credential(4).await;
    let mut statuses = Vec::new();
    for spelling in ["Bearer abc", "bearer abc", "Bearer  abc", "BEARER abc"] {
        statuses.push(status(&server, spelling).await);
    }
    assert_eq!(statuses, [200; 4]);
    assert_eq!(status(&server, "Bearer\tabc").await, 429);
    assert_eq!(status(&server, "Bearer abd").await, 200, "another token");
    // token68 is case-sensitive: `ABC` is another token.
    assert_eq!(status(&server, "Bearer ABC").await, 200);
}

/// 16-byte and 1 000-byte tokens alike: the same token in two spellings shares a budget,
/// tokens differing only in their last byte do not.
#[tokio::test]
async fn tokens_of_16_and_1000_bytes_are_one_key_per_token() {
    for len in [16, 1000] {
        let server = per_credential(2).await;
        let token = |last: char| {
            let mut t = "t".repeat(len - 1);
            t.push(last);
            t
        };
        assert_eq!(
            status(&server, &format!("Bearer {}", token('a'))).await,
            200
        );
        assert_eq!(
            status(&server, &format!("bearer  {}", token('a'))).await,
            200
        );
        assert_eq!(
            status(&server, &format!("BEARER {}", token('a'))).await,
            429,
            "{len}"
        );
        assert_eq!(
            status(&server, &format!("Bearer {}", token('b'))).await,
            200,
            "{len}"
        );
    }
}

/// A scheme without credentials (`Bearer`) or a value outside the grammar is no credential:
/// the request is keyed by the peer IP instead, so it never shares a budget with a token.
#[tokio::test]
async fn a_value_that_is_not_a_credential_falls_back_to_the_peer() {
    let server = per_credential(1).await;
    assert_eq!(status(&server, "Bearer abc").await, 200);
    assert_eq!(status(&server, "Bearer").await, 200, "the peer's budget");
    assert_eq!(
        status(&server, "Bearer a b").await,
        429,
        "the peer's budget, spent"
    );
    assert_eq!(status(&server, "Bearer abc").await, 429);
}

/// With the memory store, through the router: 16-byte and 1 000-byte bearer tokens appear in no log
/// line (TRACE, raw keys on) and no rendered metric, while the logs do name the keys (by
/// their digest). The runtime runs on this thread, inside the local recorder and subscriber.
#[test]
fn tokens_reach_no_log_line_or_metric() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Other tests of this binary register and drop subscribers on their threads at the same
    // time; recompute every callsite's interest with this one in place, so an interest
    // cached while no subscriber wanted DEBUG cannot hide the decisions' events here.
    tracing::callsite::rebuild_interest_cache();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let tokens = [
        "tok-0123456789ab".to_owned(),
        format!("tok-{}", "Zq9".repeat(332)),
    ];
    assert_eq!((tokens[0].len(), tokens[1].len()), (16, 1000));
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let layer = RateLimitLayer::builder()
                .policy(Policy::new(
                    "per-token",
                    Quota::per_minute(NonZeroU32::new(1).expect("1")),
                ))
                .key(HeaderKey::raw("Authorization"))
                .log_raw_keys(true)
                .build()
                .expect("layer");
            let app = Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer);
            // The router called in this task (no socket between), so every event the layer
            // writes is on this thread, under this test's subscriber.
            let status = |authorization: String| {
                let app = app.clone();
                async move {
                    let req = axum::http::Request::get("/")
                        .header("authorization", authorization)
                        .extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                            [127, 0, 0, 1],
                            4000,
                        ))))
                        .body(axum::body::Body::empty())
                        .expect("request");
                    tower::ServiceExt::oneshot(app, req)
                        .await
                        .expect("infallible")
                        .status()
                        .as_u16()
                }
            };
            // A first request registers the layer's callsites (unless another test did);
            // then every callsite's interest is recomputed with this test's subscriber in
            // place: an interest computed on another thread while a callsite was being
            // registered, before this subscriber existed, cannot hide the events below.
            assert_eq!(status("Bearer warm-up".to_owned()).await, 200);
            tracing::callsite::rebuild_interest_cache();
            for token in &tokens {
                let first = status(format!("Bearer {token}")).await;
                let second = status(format!("bearer  {token}")).await;
                assert_eq!((first, second), (200, 429), "{}-byte token", token.len());
            }
        });
    });
    let rendered = metrics.render();
    let logged = logs.text();
    assert!(
        rendered.contains("ratekeeper_decisions_total"),
        "{rendered}"
    );
    assert!(
        logged.contains("sha256\u{b7}"),
        "raw keys are logged as digests: {logged}"
    );
    for token in &tokens {
        for piece in [token.as_str(), &token[4..16]] {
            assert!(!logged.contains(piece), "a log line holds {piece:?}");
            assert!(!rendered.contains(piece), "a metric holds {piece:?}");
        }
    }
}
