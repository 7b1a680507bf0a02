//! Credentials never in clear with a Redis store: bearer tokens of 16 and 1 000 bytes sent
//! over HTTP to a layer keyed by `Authorization` leave no trace of the token (nor of its
//! plain SHA-256 digest, with a deployment secret set) in Redis key names
//! (`redis-cli --scan`), in the rendered metrics, or in the log lines (TRACE, raw keys on).

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use ratekeeper_axum::RateLimitLayer;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::{Policy, Quota};
use ratekeeper_axum::key::{CredentialSecret, HeaderKey};
use ratekeeper_tests::TestServer;
use ratekeeper_tests::logs::Captured;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};
use sha2::{Digest, Sha256};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A token of `len` bytes (token68 characters).
fn token(len: usize) -> String {
    let mut t = String::from("tok-");
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    t.extend((0..len - 4).map(|i| char::from(alphabet[(i * 7 + 3) % alphabet.len()])));
    assert_eq!(t.len(), len);
    t
}

/// For a 16-byte and a 1 000-byte bearer token: three requests over HTTP through a Redis
/// store (two allowed, one refused), then no Redis key name, no rendered metric and no log
/// line holds the token, a 12-byte piece of it, or its plain SHA-256 digest; the key names
/// hold the keyed digest instead. The test's runtime runs on this thread, inside the
/// local metrics recorder and log subscriber, so they see every event of the layer and the
/// store.
#[test]
fn bearer_tokens_never_reach_redis_metrics_or_logs_in_clear() {
    let server = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let tokens = [token(16), token(1000)];
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = RedisStore::builder()
                .deadline(DECISION_DEADLINE)
                .standalone(&server.url())
                .await
                .expect("store");
            let secret = CredentialSecret::new("a deployment secret of 32 bytes!").expect("secret");
            let layer = RateLimitLayer::builder()
                .policy(Policy::new(
                    "per-token",
                    Quota::per_minute(NonZeroU32::new(2).expect("2")),
                ))
                .key(HeaderKey::raw("Authorization").credential_secret(secret))
                .store(store)
                .log_raw_keys(true)
                .build()
                .expect("layer");
            let app = TestServer::start(
                Router::new()
                    .route("/", get(|| async { "ok" }))
                    .layer(layer),
            )
            .await;
            // A first request registers the layer's callsites (unless another test did);
            // then every callsite's interest is recomputed with this test's subscriber in
            // place: an interest computed on another thread while a callsite was being
            // registered, before this subscriber existed, cannot hide the events below.
            let warm_up = app
                .get("/")
                .header("authorization", "Bearer warm-up")
                .send()
                .await
                .expect("GET /");
            assert_eq!(warm_up.status().as_u16(), 200);
            tracing::callsite::rebuild_interest_cache();
            for token in &tokens {
                let mut statuses = Vec::new();
                for scheme in ["Bearer", "bearer", "BEARER"] {
                    let res = app
                        .get("/")
                        .header("authorization", format!("{scheme} {token}"))
                        .send()
                        .await
                        .expect("GET /");
                    statuses.push(res.status().as_u16());
                }
                assert_eq!(statuses, [200, 200, 429], "{}-byte token", token.len());
            }
        });
    });

    let keys = server.cli(&["--scan"]).expect("redis-cli --scan");
    let rendered = metrics.render();
    let logged = logs.text();
    assert!(
        keys.contains("hmac-sha256"),
        "the keys hold the keyed digest: {keys}"
    );
    assert!(
        rendered.contains("ratekeeper_"),
        "the recorder saw the layer: {rendered}"
    );
    assert!(
        logged.contains("hmac-sha256"),
        "raw keys are logged: {logged}"
    );
    for token in &tokens {
        let plain_digest = hex(&Sha256::digest(format!("bearer {token}").as_bytes()));
        let pieces = [token.as_str(), &token[4..16], plain_digest.as_str()];
        for (what, text) in [
            ("Redis key", &keys),
            ("metric", &rendered),
            ("log", &logged),
        ] {
            for piece in pieces {
                assert!(
                    !text.contains(piece),
                    "a {what} holds {piece:?} of the {}-byte token",
                    token.len()
                );
            }
        }
    }
}
