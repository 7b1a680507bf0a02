//! Values a client or a proxy writes, read by their grammar: RFC 7239 `Forwarded` with quoted
//! separators, IPv4 clients in IPv6 spellings (mapped, NAT64) through a trusted proxy, a
//! client-chosen `content-type: application/grpc` on a plain HTTP service, and bearer tokens
//! of any length (the README's recipe, compiled and run here).
//!
//! Keys are observed through a recording extractor on the axum router driven with `oneshot`
//! and a `PeerAddr` extension (the peers are not 127.0.0.1), with a `ManualClock` store, so
//! time only moves when a test says so; the gRPC and token tests run over real HTTP on
//! loopback with budgets whose refill is far slower than the test.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::{ForwardedIp, PeerAddr, Source};
use ratekeeper_axum::{RateLimitLayer, core::Algorithm, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::keys::recording;
use ratekeeper_tests::{TestServer, ok_app, readme};
use tower::ServiceExt;

// The README's recipe, exactly as the README shows it (checked below).
#[allow(dead_code, unreachable_pub)]
#[path = "recipes/bearer_token.rs"]
mod recipe;

/// One request per minute, fixed window, named `default`.
fn one_per_minute() -> Policy {
    Policy::new("default", Quota::per_minute(NonZeroU32::MIN))
        .with_algorithm(Algorithm::FixedWindow)
}

/// An app limited to one request per minute per key of `key`, on a clock that stands still;
/// and the log of the keys it charged.
fn limited_app(key: ForwardedIp) -> (Router, Arc<Mutex<Vec<String>>>) {
    let (log, key) = recording(key);
    let layer = RateLimitLayer::builder()
        .policy(one_per_minute())
        .key(key)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    (ok_app().layer(layer), log)
}

/// Sends `GET /` with header `name: value` to `app` as if from `peer`; the status and the key
/// charged.
async fn send(
    app: &Router,
    log: &Mutex<Vec<String>>,
    peer: &str,
    name: &str,
    value: &str,
) -> (StatusCode, String) {
    let mut req = Request::builder()
        .uri("/")
        .header(name, HeaderValue::from_str(value).unwrap())
        .body(Body::empty())
        .unwrap();
    let ip: IpAddr = peer.parse().unwrap();
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(ip, 40_000)));
    let res = app.clone().oneshot(req).await.unwrap();
    let key = log.lock().unwrap().last().cloned().unwrap_or_default();
    (res.status(), key)
}

/// RFC 7239 quoted strings (<https://github.com/jshttp/forwarded/issues/1>: splitting on `,` and
/// `;` smuggles a `for=` node): behind a trusted proxy (10.0.0.5) that copies the client's Host
/// into a quoted `host=`, the `for=` the client wrote inside the quotes is never the client
/// address: the request is charged to the proxy's `for=` (203.0.113.50 / .51), and the victim
/// addresses 198.51.100.99 / .98 keep their budgets. The controls key as RFC 7239 says.
#[tokio::test]
async fn a_for_inside_a_quoted_forwarded_value_is_never_the_client() {
    let (app, log) = limited_app(
        ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]).source(Source::Forwarded),
    );
    let proxy = "10.0.0.5";
    let fwd = "forwarded";
    #[rustfmt::skip]
    let trace: [(&str, u16, &str); 9] = [
        (r#"for=203.0.113.50;host="x,for=198.51.100.99;y=";proto=https"#, 200, "ip:203.0.113.50"),
        (r#"for=203.0.113.51;host="a;for=198.51.100.98""#, 200, "ip:203.0.113.51"),
        // The victims' budgets are untouched...
        ("for=198.51.100.99", 200, "ip:198.51.100.99"),
        ("for=198.51.100.98", 200, "ip:198.51.100.98"),
        // ...and the senders' are spent.
        ("for=203.0.113.50", 429, "ip:203.0.113.50"),
        ("for=203.0.113.51", 429, "ip:203.0.113.51"),
        // Controls.
        (r#"For="[2001:db8:cafe::17]:4711""#, 200, "net:2001:db8:cafe::/64"),
        ("for=192.0.2.43, for=198.51.100.17", 200, "ip:198.51.100.17"),
        ("for=192.0.2.60;proto=http;by=203.0.113.43", 200, "ip:192.0.2.60"),
    ];
    for (i, (value, status, key)) in trace.into_iter().enumerate() {
        let got = send(&app, &log, proxy, fwd, value).await;
        assert_eq!(
            got,
            (StatusCode::from_u16(status).unwrap(), key.to_owned()),
            "R{}: {value}",
            i + 1
        );
    }
}

/// The same three IPv4 clients written as NAT64 (`64:ff9b::/96`), IPv4-mapped and plain
/// IPv4, arriving through a trusted proxy whose network is configured (and whose address is
/// written) in any of those spellings: three buckets, keyed as plain IPv4, never one shared
/// /64 for the translator.
#[tokio::test]
async fn nat64_and_mapped_clients_behind_a_trusted_proxy_key_as_ipv4() {
    let clients = ["192.0.2.77", "198.51.100.9", "203.0.113.1"];
    for (net, proxy) in [
        ("10.0.0.0/8", "10.0.0.5"),
        ("::ffff:10.0.0.0/104", "64:ff9b::10.0.0.5"),
        ("64:ff9b::a00:0/104", "::ffff:10.0.0.5"),
    ] {
        for source in [Source::XForwardedFor, Source::Forwarded] {
            let (app, log) =
                limited_app(ForwardedIp::trusting([net.parse().unwrap()]).source(source));
            let (name, entry): (&str, fn(&str) -> String) = match source {
                Source::XForwardedFor => ("x-forwarded-for", |ip| ip.to_owned()),
                _ => ("forwarded", |ip| {
                    if ip.contains(':') {
                        format!("for=\"[{ip}]\"")
                    } else {
                        format!("for={ip}")
                    }
                }),
            };
            for client in clients {
                let key = format!("ip:{client}");
                let spellings = [
                    format!("64:ff9b::{client}"),
                    format!("::ffff:{client}"),
                    client.to_owned(),
                ];
                for (i, spelling) in spellings.iter().enumerate() {
                    // The first spelling takes the client's one request; the others find
                    // that same budget spent.
                    let status = if i == 0 {
                        StatusCode::OK
                    } else {
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    let got = send(&app, &log, proxy, name, &entry(spelling)).await;
                    assert_eq!(
                        got,
                        (status, key.clone()),
                        "{net} via {proxy}, {name}: {spelling}"
                    );
                }
            }
        }
    }
}

/// Exempt networks are compared in the same normal form: a network written IPv4-mapped
/// exempts the IPv4 peer, and an IPv4 network exempts its NAT64 spelling.
#[tokio::test]
async fn exempt_networks_match_every_spelling() {
    let layer = RateLimitLayer::builder()
        .policy(one_per_minute())
        .exempt_networks([
            "::ffff:192.0.2.0/120".parse().unwrap(),
            "198.51.100.0/24".parse().unwrap(),
        ])
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let app = ok_app().layer(layer);
    for peer in ["192.0.2.7", "64:ff9b::198.51.100.7", "::ffff:198.51.100.8"] {
        for _ in 0..3 {
            let mut req = Request::builder().uri("/").body(Body::empty()).unwrap();
            req.extensions_mut()
                .insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 1)));
            let res = app.clone().oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{peer}");
            assert!(res.headers().get("x-ratelimit-limit").is_none(), "{peer}");
        }
    }
}

/// Over HTTP/1.1 to an app that does not serve gRPC, a client that sends
/// `content-type: application/grpc` still gets its refusal as a 429 (not a 200 with
/// `grpc-status: 8`); and `application/grpc` over HTTP/1.1 is no gRPC call even for a layer
/// that serves gRPC.
#[tokio::test]
async fn a_grpc_content_type_cannot_turn_a_429_into_a_200() {
    for serves_grpc in [false, true] {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new("calls", Quota::per_hour(NonZeroU32::MIN)))
            .key(GlobalKey)
            .grpc(serves_grpc)
            .build()
            .unwrap();
        let server = TestServer::start(ok_app().layer(layer)).await;
        let call = || server.get("/").header("content-type", "application/grpc");
        let first = call().send().await.unwrap();
        assert_eq!(first.status(), 200);
        let refused = call().send().await.unwrap();
        assert_eq!(refused.version(), reqwest::Version::HTTP_11);
        assert_eq!(refused.status(), 429, "grpc({serves_grpc})");
        assert!(refused.headers().get("grpc-status").is_none());
        assert!(refused.headers().contains_key("retry-after"));
    }
}

/// The README's recipe is this file's `recipe` module, word for word.
#[test]
fn the_readme_recipe_is_the_tested_code() {
    assert_eq!(
        readme::recipe("bearer-token"),
        include_str!("recipes/bearer_token.rs").trim(),
        "README.md and tests/http/recipes/bearer_token.rs differ"
    );
}

/// An auth middleware for the recipe: a bearer token is known when it starts with `tok-`.
async fn require_token(req: Request, next: Next) -> Response {
    let known = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t.starts_with("tok-"));
    if known {
        next.run(req).await
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

/// The README's recipe over real HTTP: 1 200-byte bearer tokens that differ only in their
/// last byte get separate budgets (each starts at 99 remaining of 100), while one token's
/// requests share one; unknown tokens are refused by the auth layer before the limiter.
///
/// The budget refills one request per 600 ms; the 20 requests of one token would need 12 s
/// for the two tokens' figures to meet, so a loaded machine cannot make a shared budget pass.
#[tokio::test]
async fn bearer_tokens_of_any_length_get_their_own_budget() {
    let app = recipe::limit_by_token(Router::new().route("/api", get(|| async { "hello" })))
        .unwrap()
        .layer(middleware::from_fn(require_token));
    let server = TestServer::start(app).await;
    let token = |last: char| {
        let mut t = String::from("Bearer tok-");
        t.extend(std::iter::repeat_n('x', 1200 - t.len() - 1));
        t.push(last);
        assert_eq!(t.len(), 1200);
        t
    };
    let remaining = |res: &reqwest::Response| -> u32 {
        res.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut last_a = u32::MAX;
    for _ in 0..20 {
        let res = server
            .get("/api")
            .header("authorization", token('a'))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        last_a = remaining(&res);
    }
    assert!(last_a < 99, "token a was charged: {last_a} left");
    let res = server
        .get("/api")
        .header("authorization", token('b'))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(remaining(&res), 99, "token b has a budget of its own");
    // An unknown token never reaches the limiter.
    let res = server
        .get("/api")
        .header("authorization", "Bearer made-up")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
}
