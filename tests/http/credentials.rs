//! Keys from credentials over real HTTP: an `Authorization` credential is read by RFC 9110
//! §11 (scheme in any case, runs of whitespace as one), so every spelling of one bearer
//! token shares one budget, distinct tokens keep distinct budgets, and a value that is not a
//! credential falls back to the next extractor.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::{HeaderKey, PeerIp};
use ratekeeper_axum::{Key, Policy, Quota, RateLimitLayer};
use ratekeeper_tests::TestServer;

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
