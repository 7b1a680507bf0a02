//! Keys, costs and policies end to end: real HTTP on loopback where the peer address does not
//! matter, and the axum router driven with `oneshot` and a `PeerAddr` extension where a case
//! needs peers other than 127.0.0.1 (forwarded-for, IPv6 and API-key keys).
//!
//! Every limiter here uses a `ManualClock` store, so time only moves when a test says so.
//! The traces of public reports use the fixed-window algorithm as the reports do (windows
//! aligned to multiples of 60,000 ms from t=0, hence `Retry-After: 60` early in the
//! window); the other tests use the default GCRA.

// Trace tables are tuples on purpose: one row per request of a trace.
#![allow(clippy::type_complexity)]

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::cors::EXPOSED_HEADERS;
use ratekeeper_axum::key::{ForwardedIp, HeaderKey, PeerAddr, Source, UserKey};
use ratekeeper_axum::policy::{Settle, resolve_fn};
use ratekeeper_axum::route::RouteTable;
use ratekeeper_axum::{
    RateLimitLayer, core::Algorithm, core::Key, core::Policy, core::Quota, key::PeerIp,
};
use ratekeeper_tests::keys::recording;
use ratekeeper_tests::{TestServer, ok_app, spawn_service};
use tower::{Layer, ServiceExt};
use tower_http::cors::CorsLayer;
use tower_http::normalize_path::NormalizePathLayer;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/nat_users.rs"]
mod nat_users;
// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/per_route_cost.rs"]
mod per_route_cost;
// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/tiers.rs"]
mod tiers;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// `n` per 60,000 ms, fixed window, named `default`.
fn fixed_window(n: u32) -> Policy {
    Policy::new("default", per_minute(n)).with_algorithm(Algorithm::FixedWindow)
}

fn manual_store() -> (ManualClock, MemoryStore<Key, ManualClock>) {
    let clock = ManualClock::new();
    (clock.clone(), MemoryStore::with_clock(clock))
}

fn at(clock: &ManualClock, ms: u64) {
    clock.set_elapsed(Duration::from_millis(ms));
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<absent>")
}

fn h<'a>(res: &'a Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<absent>")
}

/// Sends `req` to `app` as if from `peer`.
async fn from_peer(app: &Router, peer: &str, mut req: Request) -> Response {
    let ip: IpAddr = peer.parse().unwrap();
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(ip, 40_000)));
    app.clone().oneshot(req).await.unwrap()
}

fn last(log: &Mutex<Vec<String>>) -> String {
    log.lock().unwrap().last().cloned().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Keys, costs and policies over real HTTP
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nat_users_each_get_their_full_budget_and_anonymous_is_limited_by_ip() {
    let server = TestServer::start(nat_users::app_with(ManualClock::new())).await;
    // alice and carol share 127.0.0.1 and each get 5; the anonymous client is limited by IP.
    for who in ["alice", "carol"] {
        for expected in (0..5).rev() {
            let res = server
                .get("/")
                .bearer_auth(format!("tok-{who}"))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{who}");
            assert_eq!(header(&res, "x-ratelimit-remaining"), expected.to_string());
            assert_eq!(res.text().await.unwrap(), format!("hello {who}\n"));
        }
        let res = server
            .get("/")
            .bearer_auth(format!("tok-{who}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 429, "{who}");
    }
    for expected in (0..5).rev() {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "x-ratelimit-remaining"), expected.to_string());
        assert_eq!(res.text().await.unwrap(), "hello anonymous\n");
    }
    let res = server.get("/").send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), "12");
    // A logged-in user behind the same, exhausted IP still has their own budget.
    let res = server.get("/").bearer_auth("tok-bob").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_pick_the_policy_by_the_users_plan() {
    let server = TestServer::start(tiers::app_with(ManualClock::new())).await;
    for (token, limit, remaining) in [
        (Some("tok-alice"), "60", "59"),
        (Some("tok-bob"), "1000", "999"),
        (None, "60", "59"),
        (Some("tok-alice"), "60", "58"),
    ] {
        let mut req = server.get("/");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 200, "{token:?}");
        assert_eq!(header(&res, "x-ratelimit-limit"), limit, "{token:?}");
        assert_eq!(
            header(&res, "x-ratelimit-remaining"),
            remaining,
            "{token:?}"
        );
    }
    // An unknown token is refused by the auth middleware, inside the failed-authentication
    // limit (which sends no rate-limit fields) and before the tiers.
    let res = server
        .get("/")
        .bearer_auth("tok-mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(header(&res, "x-ratelimit-limit"), "<absent>");
}

/// Sends `n` requests with wrong bearer tokens (each a different guess) and returns the
/// statuses; checks that every 429 is the failed-authentication limit's.
async fn wrong_tokens(server: &TestServer, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for i in 0..n {
        let res = server
            .get("/")
            .bearer_auth(format!("tok-guess-{i}"))
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        if status == 429 {
            // 10 per minute: one more try every 6 s.
            assert_eq!(header(&res, "retry-after"), "6");
            assert_eq!(header(&res, "x-ratelimit-limit"), "<absent>");
            let body: serde_json::Value =
                serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
            assert_eq!(
                body["violated-policies"],
                serde_json::json!(["auth-failures"])
            );
        }
        statuses.push(status);
    }
    statuses
}

/// 30 wrong tokens from one client: exactly 10 `401`s, then `429`s. Requests that
/// authenticate (or send no token) cost nothing in the failed-authentication limit; once it
/// is exhausted the address is refused, valid tokens too, until it refills.
async fn thirty_wrong_tokens_get_ten_401s_then_429s(app: Router, clock: &ManualClock) {
    let server = TestServer::start(app).await;
    for _ in 0..3 {
        let res = server
            .get("/")
            .bearer_auth("tok-alice")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let statuses = wrong_tokens(&server, 30).await;
    let expected: Vec<u16> = [401; 10].into_iter().chain([429; 20]).collect();
    assert_eq!(statuses, expected);
    let res = server
        .get("/")
        .bearer_auth("tok-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        429,
        "the address is over its failed-authentication budget"
    );
    // 6 s later the budget holds one more failure.
    clock.advance(Duration::from_secs(6));
    assert_eq!(wrong_tokens(&server, 2).await, [401, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nat_users_thirty_wrong_tokens_get_ten_401s_then_429s() {
    let clock = ManualClock::new();
    thirty_wrong_tokens_get_ten_401s_then_429s(nat_users::app_with(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_thirty_wrong_tokens_get_ten_401s_then_429s() {
    let clock = ManualClock::new();
    thirty_wrong_tokens_get_ten_401s_then_429s(tiers::app_with(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_x_forwarded_for_from_an_untrusted_peer_is_keyed_by_the_peer() {
    let (_clock, store) = manual_store();
    let (log, key) = recording(ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]));
    let layer = RateLimitLayer::builder()
        .quota(per_minute(2))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for i in 1..=4 {
            let res = server
                .get("/")
                .header("x-forwarded-for", format!("1.1.1.{i}"))
                .header("x-real-ip", format!("9.9.9.{i}"))
                .send()
                .await
                .unwrap();
            assert_eq!(last(&log), "ip:127.0.0.1");
            v.push(res.status().as_u16());
        }
        v
    };
    assert_eq!(statuses, [200, 200, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_a_trusted_loopback_proxy_keys_each_client() {
    let (_clock, store) = manual_store();
    let (log, key) = recording(ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]));
    let layer = RateLimitLayer::builder()
        .quota(per_minute(1))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    for (xff, status, key) in [
        ("203.0.113.1, 127.0.0.2", 200, "ip:203.0.113.1"),
        ("6.6.6.6, 203.0.113.2:4711", 200, "ip:203.0.113.2"),
        ("203.0.113.1", 429, "ip:203.0.113.1"),
        ("203.0.113.3, not-an-ip", 200, "ip:127.0.0.1"),
    ] {
        let res = server
            .get("/")
            .header("x-forwarded-for", xff)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{xff}");
        assert_eq!(last(&log), key, "{xff}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_table_charges_the_configured_cost_under_every_spelling() {
    let (_clock, store) = manual_store();
    let app = per_route_cost::app_with(store);
    let addr = spawn_service(NormalizePathLayer::trim_trailing_slash().layer(app)).await;
    let server = TestServer::at(addr);
    let mut remaining = 100u64;
    let mut searches = 0;
    for (method, path) in [
        (Method::GET, "/search"),
        (Method::GET, "/search/"),
        (Method::GET, "/search?q=rust"),
        (Method::HEAD, "/search"),
        (Method::GET, "/SEARCH"),
        (Method::GET, "//search"),
        (Method::GET, "/%73earch"),
        (Method::GET, "/search//"),
        (Method::GET, "/status"),
    ] {
        let res = server.request(method.clone(), path).send().await.unwrap();
        let status = res.status();
        // A spelling the router sends to /search costs 10; /status costs 1; a 404 (no
        // route matched, so no template) costs the default 1.
        let cost = match status.as_u16() {
            200 if path.to_ascii_lowercase().contains("search") => {
                searches += 1;
                10
            }
            200 | 404 => 1,
            other => panic!("{method} {path}: unexpected status {other}"),
        };
        remaining -= cost;
        assert_eq!(
            header(&res, "x-ratelimit-remaining"),
            remaining.to_string(),
            "{method} {path} ({status})"
        );
    }
    assert!(searches >= 4, "the plain spellings reach /search");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_by_the_second_policy_charges_nothing_to_the_first() {
    let (_clock, store) = manual_store();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("per-ip", per_minute(5)))
        .policy(Policy::new("per-user", per_minute(1)))
        .resolver(resolve_fn(|req, plan| {
            plan.charge("per-ip");
            if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
                let cost = plan.cost();
                plan.charge_with("per-user", Key::from(format!("user:{user}")), cost);
            }
        }))
        .store(store)
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let send = |user: Option<&'static str>| {
        let mut req = server.get("/");
        if let Some(u) = user {
            req = req.header("x-user", u);
        }
        req.send()
    };
    let res = send(Some("u1")).await.unwrap();
    assert_eq!(res.status(), 200);
    // Headers report the policy closest to exhaustion: per-user.
    assert_eq!(header(&res, "x-ratelimit-limit"), "1");
    // Denied by per-user: per-ip must not be charged.
    for _ in 0..3 {
        let res = send(Some("u1")).await.unwrap();
        assert_eq!(res.status(), 429);
        let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["per-user"]));
    }
    let res = send(Some("u2")).await.unwrap();
    assert_eq!(res.status(), 200);
    // Only per-ip applies without a user: 5 - u1 - u2 - this one = 2 (not -1 for each denial).
    let res = send(None).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-limit"), "5");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_counting_only_401s_lets_good_users_through_and_blocks_failing_ones() {
    let (_clock, store) = manual_store();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("login", per_minute(3)))
        .settle("login", Settle::COUNT_UNAUTHORIZED)
        .key(HeaderKey::validated("x-user", |u: &str| {
            Some(Key::from(format!("login:{u}")))
        }))
        .store(store)
        .build()
        .unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let h2 = Arc::clone(&handled);
    let app = Router::new()
        .route(
            "/login",
            post(move |req: Request| {
                let h2 = Arc::clone(&h2);
                async move {
                    h2.fetch_add(1, Ordering::SeqCst);
                    if req
                        .headers()
                        .get("x-password")
                        .is_some_and(|p| p == "right")
                    {
                        StatusCode::OK
                    } else {
                        StatusCode::UNAUTHORIZED
                    }
                }
            }),
        )
        .layer(layer);
    let server = TestServer::start(app).await;
    let login = |user: &'static str, password: &'static str| {
        server
            .post("/login")
            .header("x-user", user)
            .header("x-password", password)
            .send()
    };
    for _ in 0..10 {
        assert_eq!(login("good", "right").await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(login("bad", "wrong").await.unwrap().status(), 401);
    }
    for _ in 0..3 {
        let res = login("bad", "wrong").await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(header(&res, "retry-after"), "20");
        // Even the right password waits: the budget is per user, counted on failures.
        assert_eq!(login("bad", "right").await.unwrap().status(), 429);
    }
    assert_eq!(login("good", "right").await.unwrap().status(), 200);
    assert_eq!(handled.load(Ordering::SeqCst), 10 + 3 + 1);
}

// ---------------------------------------------------------------------------------------
// Bad input: a defined answer, never a panic or a 500
// ---------------------------------------------------------------------------------------

async fn bad_input_app() -> TestServer {
    let (_clock, store) = manual_store();
    let api_key = HeaderKey::validated("x-api-key", |raw: &str| {
        (raw == "key-alice").then(|| Key::from("user:alice"))
    });
    let key = api_key.or(ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]));
    let layer = RateLimitLayer::builder()
        .quota(per_minute(100))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    TestServer::start(ok_app().layer(layer)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_header_bytes_are_ignored_not_a_500() {
    let server = bad_input_app().await;
    let bytes = HeaderValue::from_bytes(&[0xFF, 0xFE]).unwrap();
    let res = server
        .get("/")
        .header("x-api-key", bytes.clone())
        .header("x-forwarded-for", bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "99");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_kib_header_is_ignored_not_a_500() {
    let server = bad_input_app().await;
    let huge = "1.2.3.4, ".repeat(64 * 1024 / 9);
    let res = server
        .get("/")
        .header("x-forwarded-for", huge.clone())
        .header("x-api-key", huge)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "99");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_with_obfuscated_identifiers_falls_back_to_the_peer() {
    let (_clock, store) = manual_store();
    let (log, key) = recording(
        ForwardedIp::trusting(["127.0.0.0/8".parse().unwrap()]).source(Source::Forwarded),
    );
    let layer = RateLimitLayer::builder()
        .quota(per_minute(100))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    for (value, key) in [
        ("for=_hidden", "ip:127.0.0.1"),
        ("for=\"_gazonk\";proto=https", "ip:127.0.0.1"),
        ("for=unknown", "ip:127.0.0.1"),
        ("for=192.0.2.60, for=_hidden", "ip:127.0.0.1"),
        ("for=\"[2001:db8:cafe::17]:4711\"", "net:2001:db8:cafe::/64"),
    ] {
        let res = server
            .get("/")
            .header("forwarded", value)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{value}");
        assert_eq!(last(&log), key, "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_api_key_counts_as_absent() {
    let server = bad_input_app().await;
    let res = server
        .get("/")
        .header("x-api-key", "")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "99");
    // Same bucket as no header at all (the IP), not a shared "" bucket.
    let res = server.get("/").send().await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-remaining"), "98");
    let res = server
        .get("/")
        .header("x-api-key", "key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&res, "x-ratelimit-remaining"), "99");
}

// ---------------------------------------------------------------------------------------
// Traces of public reports
// ---------------------------------------------------------------------------------------

/// A spoofed `X-Forwarded-For` (<https://github.com/long2ice/fastapi-limiter/issues/9>: a random
/// one per request bypassed the limiter): fixed window 3 per 60,000 ms; trusted proxies 10.0.0.0/8.
#[tokio::test]
async fn spoofed_forwarded_for_and_trusted_proxies() {
    let (clock, store) = manual_store();
    let (log, key) = recording(ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]));
    let layer = RateLimitLayer::builder()
        .policy(fixed_window(3))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let req = |name: &str, value: &[u8]| {
        Request::builder()
            .uri("/")
            .header(name, HeaderValue::from_bytes(value).unwrap())
            .body(Body::empty())
            .unwrap()
    };
    let xff = "x-forwarded-for";
    #[rustfmt::skip]
    let trace: [(u64, &str, &str, &[u8], u16, &str, &str, &str); 12] = [
        // t, peer, header, value, status, key, remaining, retry-after
        (0, "203.0.113.50", xff, b"1.1.1.1", 200, "ip:203.0.113.50", "2", "<absent>"),
        (1, "203.0.113.50", xff, b"1.1.1.2", 200, "ip:203.0.113.50", "1", "<absent>"),
        (2, "203.0.113.50", xff, b"1.1.1.3", 200, "ip:203.0.113.50", "0", "<absent>"),
        (3, "203.0.113.50", xff, b"1.1.1.4", 429, "ip:203.0.113.50", "0", "60"),
        (4, "203.0.113.50", "x-real-ip", b"9.9.9.9", 429, "ip:203.0.113.50", "0", "60"),
        (5, "10.0.0.5", xff, b"6.6.6.6, 198.51.100.7", 200, "ip:198.51.100.7", "2", "<absent>"),
        (6, "10.0.0.5", xff, b"7.7.7.7, 198.51.100.7", 200, "ip:198.51.100.7", "1", "<absent>"),
        (7, "10.0.0.5", xff, b"198.51.100.7:51234", 200, "ip:198.51.100.7", "0", "<absent>"),
        (8, "10.0.0.5", xff, b"198.51.100.7", 429, "ip:198.51.100.7", "0", "60"),
        (9, "203.0.113.99", xff, b"198.51.100.7", 200, "ip:203.0.113.99", "2", "<absent>"),
        (10, "10.0.0.5", xff, b"198.51.100.8, not-an-ip", 200, "ip:10.0.0.5", "2", "<absent>"),
        // R12 is treated like R11: the same fallback key, so the same bucket.
        (11, "10.0.0.5", xff, b"\xFF\xFE", 200, "ip:10.0.0.5", "1", "<absent>"),
    ];
    for (i, (t, peer, name, value, status, key, remaining, retry)) in trace.into_iter().enumerate()
    {
        at(&clock, t);
        let res = from_peer(&app, peer, req(name, value)).await;
        let r = i + 1;
        assert_eq!(res.status(), status, "R{r}");
        assert_eq!(last(&log), key, "R{r}");
        assert_eq!(h(&res, "x-ratelimit-remaining"), remaining, "R{r}");
        assert_eq!(h(&res, "retry-after"), retry, "R{r}");
    }
}

/// IPv6 clients rotating inside their /64
/// (<https://github.com/express-rate-limit/express-rate-limit/issues/502>): fixed window 2 per
/// 60,000 ms; IPv6 by /64, IPv4-mapped as IPv4.
#[tokio::test]
async fn ipv6_prefix_and_ipv4_mapped_addresses() {
    let (clock, store) = manual_store();
    let (log, key) = recording(PeerIp::new());
    let layer = RateLimitLayer::builder()
        .policy(fixed_window(2))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    #[rustfmt::skip]
    let trace: [(&str, u16, &str, &str); 10] = [
        ("2001:db8:aa:1::1", 200, "1", "net:2001:db8:aa:1::/64"),
        ("2001:db8:aa:1::2", 200, "0", "net:2001:db8:aa:1::/64"),
        ("2001:db8:aa:1:ffff:ffff:ffff:ffff", 429, "0", "net:2001:db8:aa:1::/64"),
        ("2001:db8:aa:2::1", 200, "1", "net:2001:db8:aa:2::/64"),
        ("2001:0db8:00aa:0001:0000:0000:0000:0003", 429, "0", "net:2001:db8:aa:1::/64"),
        ("::ffff:192.0.2.1", 200, "1", "ip:192.0.2.1"),
        ("192.0.2.1", 200, "0", "ip:192.0.2.1"),
        ("::ffff:192.0.2.2", 200, "1", "ip:192.0.2.2"),
        ("::ffff:c000:202", 200, "0", "ip:192.0.2.2"),
        ("2001:db8:1234:5678::1.2.3.4", 200, "1", "net:2001:db8:1234:5678::/64"),
    ];
    for (i, (peer, status, remaining, key)) in trace.into_iter().enumerate() {
        at(&clock, i as u64);
        let res = from_peer(&app, peer, Request::new(Body::empty())).await;
        let r = i + 1;
        assert_eq!(res.status(), status, "R{r}");
        assert_eq!(h(&res, "x-ratelimit-remaining"), remaining, "R{r}");
        assert_eq!(last(&log), key, "R{r}");
        if status == 429 {
            assert_eq!(h(&res, "retry-after"), "60", "R{r}");
        }
    }
}

/// CORS preflights not counted, 429s readable cross-origin (the report
/// <https://github.com/express-rate-limit/express-rate-limit/issues/69>): fixed window 2 per
/// 60,000 ms per IP; CORS for `https://app.example`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_not_counted_and_429_readable() {
    let origin = "https://app.example";
    let cors = || {
        CorsLayer::new()
            .allow_origin(HeaderValue::from_static(origin))
            .allow_methods([Method::POST])
            .expose_headers(EXPOSED_HEADERS.clone())
    };
    // The recommended order (CORS outside the limiter: real preflights never reach it) and
    // the other one (the limiter's opt-in preflight exemption, safe here because the CORS
    // layer inside answers every preflight and no handler runs for OPTIONS; a made-up
    // preflight reaching a handler is why it is not the default) give the same trace.
    for cors_outside in [true, false] {
        let (clock, store) = manual_store();
        let layer = RateLimitLayer::builder()
            .policy(fixed_window(2))
            .exempt_preflight(!cors_outside)
            .store(store)
            .build()
            .unwrap();
        let routes = Router::new().route("/api", post(|| async { "posted" }));
        let app = if cors_outside {
            routes.layer(layer).layer(cors())
        } else {
            routes.layer(cors()).layer(layer)
        };
        let server = TestServer::start(app).await;
        for t in 0..6u64 {
            at(&clock, t);
            if t % 2 == 0 {
                let res = server
                    .request(Method::OPTIONS, "/api")
                    .header("origin", origin)
                    .header("access-control-request-method", "POST")
                    .send()
                    .await
                    .unwrap();
                assert!(res.status().is_success(), "t={t}: {}", res.status());
                assert_eq!(header(&res, "access-control-allow-origin"), origin);
                assert_eq!(header(&res, "x-ratelimit-remaining"), "<absent>");
                continue;
            }
            let res = server
                .post("/api")
                .header("origin", origin)
                .send()
                .await
                .unwrap();
            match t {
                1 | 3 => {
                    assert_eq!(res.status(), 200, "t={t}");
                    assert_eq!(header(&res, "access-control-allow-origin"), origin);
                    let expected = if t == 1 { "1" } else { "0" };
                    assert_eq!(header(&res, "x-ratelimit-remaining"), expected);
                }
                _ => {
                    assert_eq!(res.status(), 429, "t={t}");
                    if !cors_outside {
                        // A limiter outside CORS answers before CORS can add its headers:
                        // the page could not read this 429. Hence the documented order.
                        assert_eq!(header(&res, "access-control-allow-origin"), "<absent>");
                        continue;
                    }
                    assert_eq!(header(&res, "access-control-allow-origin"), origin);
                    assert_eq!(header(&res, "retry-after"), "60");
                    let exposed =
                        header(&res, "access-control-expose-headers").to_ascii_lowercase();
                    for name in [
                        "retry-after",
                        "x-ratelimit-limit",
                        "x-ratelimit-remaining",
                        "x-ratelimit-reset",
                    ] {
                        assert!(exposed.contains(name), "{name} not in {exposed}");
                    }
                }
            }
        }
    }
}

/// Path spellings cannot bypass a per-route limit (<https://github.com/outline/outline/pull/13504>:
/// the router matched case-insensitively and with an optional trailing slash, the limiter did not):
/// per-route fixed windows (login 3, avatar 1 per 60,000 ms) keyed by route template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_spellings_cannot_bypass_a_per_route_limit() {
    let (clock, store) = manual_store();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("login", per_minute(3)).with_algorithm(Algorithm::FixedWindow))
        .policy(Policy::new("avatar", per_minute(1)).with_algorithm(Algorithm::FixedWindow))
        .resolver(
            RouteTable::new()
                .limit(Method::POST, "/login", "login")
                .limit(Method::POST, "/users/{id}/avatar", "avatar"),
        )
        .store(store)
        .build()
        .unwrap();
    let logins = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&logins);
    let app = Router::new()
        .route(
            "/login",
            post(move || {
                l2.fetch_add(1, Ordering::SeqCst);
                async { "welcome" }
            }),
        )
        .route("/users/{id}/avatar", post(|| async { "avatar" }))
        .layer(layer);
    let addr = spawn_service(NormalizePathLayer::trim_trailing_slash().layer(app)).await;
    let server = TestServer::at(addr);
    let send = |path: &str| server.post(path).send();
    let trace = [
        (0, "/login", Some(200), "2"),
        (1, "/login/", Some(200), "1"),
        (2, "/login?x=1", Some(200), "0"),
        (3, "/LOGIN", None, ""),
        (4, "/%6Cogin", None, ""),
        (5, "//login", None, ""),
        (6, "/login", Some(429), "0"),
    ];
    for (t, path, status, remaining) in trace {
        at(&clock, t);
        let res = send(path).await.unwrap();
        match status {
            Some(s) => {
                assert_eq!(res.status(), s, "{path}");
                assert_eq!(header(&res, "x-ratelimit-remaining"), remaining, "{path}");
            }
            // The router may 404 these spellings, or send them to /login: then they share
            // its (exhausted) bucket. Never admitted.
            None => assert!(
                matches!(res.status().as_u16(), 404 | 429),
                "{path}: {}",
                res.status()
            ),
        }
        if status == Some(429) {
            assert_eq!(header(&res, "retry-after"), "60");
        }
    }
    assert_eq!(logins.load(Ordering::SeqCst), 3);
    at(&clock, 7);
    assert_eq!(send("/users/1/avatar").await.unwrap().status(), 200);
    at(&clock, 8);
    assert_eq!(send("/users/2/avatar").await.unwrap().status(), 429);
}

/// Unvalidated API keys as buckets (<https://github.com/TencentCloud/CubeSandbox/issues/1379>):
/// fixed window 3 per 60,000 ms per resolved key: user, validated API key, then IP.
#[tokio::test]
async fn api_key_and_user_extractors() {
    #[derive(Clone)]
    struct Principal(&'static str);

    async fn auth(mut req: Request, next: Next) -> Response {
        let principal = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .and_then(|(_, token)| (token == "tok-alice").then_some(Principal("alice")));
        if let Some(p) = principal {
            req.extensions_mut().insert(p);
        }
        next.run(req).await
    }

    let (clock, store) = manual_store();
    let chain = UserKey::new(|p: &Principal| Key::from(format!("user:{}", p.0)))
        .or(HeaderKey::validated("x-api-key", |raw: &str| match raw {
            "key-alice" => Some(Key::from("user:alice")),
            "key-bob" => Some(Key::from("user:bob")),
            _ => None,
        }))
        .or(PeerIp::new());
    let (log, key) = recording(chain);
    let layer = RateLimitLayer::builder()
        .policy(fixed_window(3))
        .key(key)
        .store(store)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(middleware::from_fn(auth));
    let req = |name: &str, value: &[u8]| {
        let mut b = Request::builder().uri("/");
        if !name.is_empty() {
            b = b.header(name, HeaderValue::from_bytes(value).unwrap());
        }
        b.body(Body::empty()).unwrap()
    };
    let key_h = "x-api-key";
    let auth_h = "authorization";
    #[rustfmt::skip]
    let trace: [(&str, &str, &[u8], u16, &str, &str); 12] = [
        ("198.51.100.20", key_h, b"key-alice", 200, "user:alice", "2"),
        ("198.51.100.20", auth_h, b"Bearer tok-alice", 200, "user:alice", "1"),
        ("198.51.100.20", auth_h, b"bearer tok-alice", 200, "user:alice", "0"),
        ("198.51.100.20", key_h, b"key-alice", 429, "user:alice", "0"),
        ("198.51.100.20", key_h, b"rotate-0001", 200, "ip:198.51.100.20", "2"),
        ("198.51.100.20", key_h, b"rotate-0002", 200, "ip:198.51.100.20", "1"),
        ("198.51.100.20", key_h, b"rotate-0003", 200, "ip:198.51.100.20", "0"),
        ("198.51.100.20", key_h, b"rotate-0004", 429, "ip:198.51.100.20", "0"),
        ("198.51.100.21", key_h, b"", 200, "ip:198.51.100.21", "2"),
        ("198.51.100.22", "", b"", 200, "ip:198.51.100.22", "2"),
        ("198.51.100.20", key_h, b"key-bob", 200, "user:bob", "2"),
        ("198.51.100.23", key_h, b"\xFF\xFE", 200, "ip:198.51.100.23", "2"),
    ];
    for (i, (peer, name, value, status, key, remaining)) in trace.into_iter().enumerate() {
        at(&clock, i as u64);
        let res = from_peer(&app, peer, req(name, value)).await;
        let r = i + 1;
        assert_eq!(res.status(), status, "R{r}");
        assert_eq!(last(&log), key, "R{r}");
        assert_eq!(h(&res, "x-ratelimit-remaining"), remaining, "R{r}");
        if status == 429 {
            assert_eq!(h(&res, "retry-after"), "60", "R{r}");
        }
    }
}
