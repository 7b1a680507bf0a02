//! Bans over real HTTP on loopback, with a manual clock: the recipe "ban for 15 minutes after
//! 10 failed logins" (a quota of 10 per 15 minutes counting only `401`s, banned after one
//! refusal), its `Retry-After` (the ban's end, whole seconds rounded up) and problem+json
//! 429s until the ban ends, other clients untouched; and the ban's metric and log line, once
//! per ban.
//!
//! Config: `POST /login` answers `200` when `x-password` is `right`, else `401`; keyed by the
//! `x-user` header; policy `login` = `10/15min`, sliding log, `Settle::COUNT_UNAUTHORIZED`,
//! ban after 1 refusal within 15 min, lasting 15 min.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use http::Request;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ratekeeper_axum::key::HeaderKey;
use ratekeeper_axum::metrics::BANS_TOTAL;
use ratekeeper_axum::policy::Settle;
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Ban, core::Policy};
use ratekeeper_core::Key;
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{MemoryStore, Store};
use ratekeeper_tests::TestServer;
use ratekeeper_tests::logs::Captured;
use tower::ServiceExt;

const FIFTEEN_MINUTES: Duration = Duration::from_secs(15 * 60);
/// The longest any single request of a test may take.
const STEP: Duration = Duration::from_secs(10);

/// The recipe: 10 failed logins per 15 minutes (only `401`s keep their charge), and the
/// first refusal bans the client for 15 minutes.
fn login_policy() -> Policy {
    Policy::new("login", "10/15min".parse().unwrap())
        .with_algorithm(Algorithm::SlidingLog)
        .with_ban(Ban::after(NonZeroU32::MIN, FIFTEEN_MINUTES).lasting(FIFTEEN_MINUTES))
}

/// The login app behind the recipe's layer on `store`.
fn app<St: Store<Key>>(store: St) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(login_policy())
        .settle("login", Settle::COUNT_UNAUTHORIZED)
        .key(HeaderKey::raw("x-user"))
        .store(store)
        .build()
        .unwrap();
    Router::new()
        .route(
            "/login",
            post(|headers: http::HeaderMap| async move {
                if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer)
}

/// Status, `Retry-After` and content type of one login attempt.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    problem: bool,
}

async fn login(server: &TestServer, user: &str, password: &str) -> Seen {
    let req = server
        .post("/login")
        .header("x-user", user)
        .header("x-password", password);
    let res = tokio::time::timeout(STEP, req.send())
        .await
        .expect("the server answers within the step timeout")
        .expect("the request reaches the server");
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let problem = res
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/problem+json");
    let status = res.status().as_u16();
    if problem {
        let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"][0], "login");
    }
    Seen {
        status,
        retry_after,
        problem,
    }
}

fn ok() -> Seen {
    Seen {
        status: 200,
        retry_after: None,
        problem: false,
    }
}

fn unauthorized() -> Seen {
    Seen {
        status: 401,
        retry_after: None,
        problem: false,
    }
}

fn banned(retry_after: u64) -> Seen {
    Seen {
        status: 429,
        retry_after: Some(retry_after),
        problem: true,
    }
}

/// Case BAN-HTTP: 10 failed logins, then every attempt (even with the right password) is a
/// 429 with `Retry-After` = the ban's end until the ban ends 15 minutes after the refusal
/// that started it; then the right password logs in. Another user is unaffected; good
/// logins before the failures cost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_failed_logins_ban_the_client_for_fifteen_minutes() {
    let clock = ManualClock::new();
    let server = TestServer::start(app(MemoryStore::with_clock(clock.clone()))).await;
    let s = Duration::from_secs;

    // Good logins keep no charge.
    for _ in 0..20 {
        assert_eq!(login(&server, "alice", "right").await, ok());
    }
    // Ten failures, one per second: each a 401.
    for _ in 0..10 {
        assert_eq!(login(&server, "alice", "wrong").await, unauthorized());
        clock.advance(s(1));
    }
    // t = 10 s: the 11th attempt is refused, and the refusal bans for 15 minutes.
    assert_eq!(login(&server, "alice", "right").await, banned(900));
    // Bob is unaffected.
    assert_eq!(login(&server, "bob", "wrong").await, unauthorized());
    assert_eq!(login(&server, "bob", "right").await, ok());

    // Long after the failures expired from the quota (t = 910 s is 15 min after the first
    // one), the ban still refuses, with its end: 10 s + 900 s.
    clock.advance(Duration::from_millis(600_500));
    assert_eq!(login(&server, "alice", "right").await, banned(300)); // 299.5 s, rounded up
    clock.advance(Duration::from_millis(299_499));
    assert_eq!(login(&server, "alice", "right").await, banned(1)); // 1 ms left
    // Refused attempts during the ban did not extend it: it ends at 910 s exactly.
    clock.advance(Duration::from_millis(1));
    assert_eq!(login(&server, "alice", "right").await, ok());
    assert_eq!(login(&server, "alice", "wrong").await, unauthorized());
}

/// Each ban is counted once in `ratekeeper_bans_total{policy}` and logged once at INFO
/// (target `ratekeeper`, key hashed), however many requests it then refuses.
#[tokio::test]
async fn a_ban_is_counted_and_logged_once() {
    let clock = ManualClock::new();
    let app = app(MemoryStore::with_clock(clock.clone()));
    let attempt = |user: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::post("/login")
                .header("x-user", user)
                .header("x-password", "wrong")
                .body(axum::body::Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("ratekeeper=info"))
        .with_writer(captured.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    {
        // Current-thread runtime: every poll, event and count is on this thread.
        let _metrics = metrics::set_default_local_recorder(&recorder);
        let _logs = tracing::subscriber::set_default(subscriber);
        for user in ["alice", "bob"] {
            for _ in 0..10 {
                assert_eq!(attempt(user).await, StatusCode::UNAUTHORIZED);
            }
            for _ in 0..5 {
                assert_eq!(attempt(user).await, StatusCode::TOO_MANY_REQUESTS);
            }
        }
        // After alice's ban ends, her next ban is a new one.
        clock.advance(FIFTEEN_MINUTES);
        for _ in 0..10 {
            assert_eq!(attempt("alice").await, StatusCode::UNAUTHORIZED);
        }
        assert_eq!(attempt("alice").await, StatusCode::TOO_MANY_REQUESTS);
    }
    let bans: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == BANS_TOTAL)
        .map(|(key, _, _, value)| {
            let policy = key.key().labels().find(|l| l.key() == "policy").unwrap();
            (policy.value().to_owned(), value)
        })
        .collect();
    assert_eq!(bans, [("login".to_owned(), DebugValue::Counter(3))]);
    let text = captured.text();
    let lines: Vec<_> = text.lines().filter(|l| l.contains("key banned")).collect();
    assert_eq!(lines.len(), 3, "{text}");
    for line in &lines {
        assert!(line.starts_with(" INFO ratekeeper:"), "{line}");
        assert!(
            line.contains("policy=\"login\"") && line.contains("seconds=900"),
            "{line}"
        );
        // Hashed, not the raw user name.
        assert!(!line.contains("alice") && !line.contains("bob"), "{line}");
    }
}
