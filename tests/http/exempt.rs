//! Exempt networks are matched against the client's address as the layer's trust rules read
//! it, never against a proxy's: a reverse proxy inside an exempt network does not exempt the
//! clients it forwards, while callers that reach the app directly stay exempt.
//!
//! Over real HTTP on loopback: the test client's peer address is 127.0.0.1, so it plays
//! both the reverse proxy on 127.0.0.1 (requests with `X-Forwarded-For`) and a local caller
//! that reaches the app directly (requests without). Budgets are on a manual clock, so they
//! only refill when a test says so (none does).

use std::num::NonZeroU32;

use ratekeeper_axum::config::LayerConfig;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::key::{ForwardedIp, HeaderKey};
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota};
use ratekeeper_tests::{TestServer, ok_app};

/// Two requests per minute, the try-out's quota.
fn two_per_minute() -> Policy {
    Policy::new("default", Quota::per_minute(NonZeroU32::new(2).unwrap()))
}

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

/// Sends `GET /` `n` times with `headers`; each answer's status and whether it carried
/// rate-limit headers.
async fn send(server: &TestServer, headers: &[(&str, &str)], n: usize) -> Vec<(u16, bool)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut req = server.get("/");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = req.send().await.unwrap();
        out.push((
            res.status().as_u16(),
            res.headers().contains_key("x-ratelimit-limit"),
        ));
    }
    out
}

/// Limited: 200, 200, then 429s, every answer with rate-limit headers.
fn limited(n: usize) -> Vec<(u16, bool)> {
    (0..n)
        .map(|i| (if i < 2 { 200 } else { 429 }, true))
        .collect()
}

/// Exempt: every answer 200, none with rate-limit headers.
fn exempt(n: usize) -> Vec<(u16, bool)> {
    vec![(200, false); n]
}

/// The try-out's file: a `forwarded` key trusting the proxy on loopback, `2/m`, and the
/// proxy's network exempt. Clients the proxy forwards are limited by their own address
/// (200 200 429 429 429, with headers); a local caller without a forwarded chain is exempt;
/// an internal client the proxy forwards (a loopback address in the chain) is exempt too.
#[tokio::test]
async fn an_exempt_proxy_network_does_not_exempt_the_clients_it_forwards() {
    let doc = r#"
key = { kind = "forwarded", trusted = ["127.0.0.0/8"] }

[[policies]]
name = "default"
quota = "2/m"

[exempt]
networks = ["127.0.0.0/8"]
"#;
    let layer = LayerConfig::from_toml("file.toml", doc)
        .unwrap()
        .builder()
        .unwrap()
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let client = [("x-forwarded-for", "203.0.113.9")];
    assert_eq!(send(&server, &client, 5).await, limited(5));
    assert_eq!(send(&server, &[], 3).await, exempt(3));
    let internal = [("x-forwarded-for", "127.0.0.9")];
    assert_eq!(send(&server, &internal, 3).await, exempt(3));
    // Another forwarded client has its own budget; the first one is still refused.
    let other = [("x-forwarded-for", "198.51.100.7")];
    assert_eq!(send(&server, &other, 3).await, limited(3));
    assert_eq!(send(&server, &client, 1).await, vec![(429, true)]);
}

/// The builder form of the same layer, with an internal network behind the proxy: a
/// forwarded client inside it is exempt, one outside is limited, a local caller is exempt,
/// and a chain that names no client (its rightmost entry does not parse) exempts nobody:
/// it is limited under the key the extractor falls back to, the proxy's.
#[tokio::test]
async fn the_builder_matches_exempt_networks_against_the_forwarded_client() {
    let layer = RateLimitLayer::builder()
        .policy(two_per_minute())
        .key(ForwardedIp::trusting([net("127.0.0.0/8")]))
        .exempt_networks([net("127.0.0.0/8"), net("10.0.0.0/8")])
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let internal = [("x-forwarded-for", "10.1.2.3")];
    assert_eq!(send(&server, &internal, 3).await, exempt(3));
    let client = [("x-forwarded-for", "203.0.113.9")];
    assert_eq!(send(&server, &client, 4).await, limited(4));
    assert_eq!(send(&server, &[], 3).await, exempt(3));
    let unreadable = [("x-forwarded-for", "10.1.2.3, not-an-ip")];
    assert_eq!(send(&server, &unreadable, 3).await, limited(3));
}

/// A key that is not an address (an API key) with the proxies stated for the exemptions
/// (`exempt_client_ip` in code, `[exempt] trusted` in a file): forwarded clients are limited
/// per API key unless their own address is exempt; local callers are exempt.
#[tokio::test]
async fn stated_proxies_let_an_api_key_layer_exempt_by_the_forwarded_client() {
    let built = RateLimitLayer::builder()
        .policy(two_per_minute())
        .key(HeaderKey::raw("x-api-key"))
        .exempt_networks([net("127.0.0.0/8"), net("10.0.0.0/8")])
        .exempt_client_ip(ForwardedIp::trusting([net("127.0.0.1/32")]))
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let doc = r#"
key = { kind = "header", header = "x-api-key" }

[[policies]]
name = "default"
quota = "2/m"

[exempt]
networks = ["127.0.0.0/8", "10.0.0.0/8"]
trusted = ["127.0.0.1/32"]
"#;
    let configured = LayerConfig::from_toml("file.toml", doc)
        .unwrap()
        .builder()
        .unwrap()
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let servers = [
        TestServer::start(ok_app().layer(built)).await,
        TestServer::start(ok_app().layer(configured)).await,
    ];
    for server in servers {
        let outside = [("x-api-key", "k1"), ("x-forwarded-for", "203.0.113.9")];
        assert_eq!(send(&server, &outside, 4).await, limited(4));
        let inside = [("x-api-key", "k2"), ("x-forwarded-for", "10.0.0.7")];
        assert_eq!(send(&server, &inside, 3).await, exempt(3));
        assert_eq!(send(&server, &[("x-api-key", "k3")], 3).await, exempt(3));
    }
}

/// A key that is not an address and no proxies stated: a request that a proxy in an exempt
/// network forwarded is not exempt (the layer cannot read its client), whatever client the
/// chain names; a local caller without a forwarded chain still is. Never "everyone behind
/// the proxy is exempt".
#[tokio::test]
async fn without_stated_proxies_a_forwarded_request_is_never_exempt_by_the_proxy() {
    let doc = r#"
key = { kind = "header", header = "x-api-key" }

[[policies]]
name = "default"
quota = "2/m"

[exempt]
networks = ["127.0.0.0/8"]
"#;
    let layer = LayerConfig::from_toml("file.toml", doc)
        .unwrap()
        .builder()
        .unwrap()
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let forwarded = [("x-api-key", "k1"), ("x-forwarded-for", "203.0.113.9")];
    assert_eq!(send(&server, &forwarded, 4).await, limited(4));
    let rfc7239 = [("x-api-key", "k2"), ("forwarded", "for=127.0.0.9")];
    assert_eq!(send(&server, &rfc7239, 3).await, limited(3));
    assert_eq!(send(&server, &[("x-api-key", "k3")], 3).await, exempt(3));
}
