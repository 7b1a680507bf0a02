//! The `production` example over real HTTP on loopback: the edge limit per forwarded client
//! IP runs before authentication, per-user limits after it (with the client IP for anonymous
//! requests), `POST /search` has its own stricter limit, `/health` is exempt, the IETF fields
//! name every policy, and `X-Forwarded-For` counts only from the trusted proxy (127.0.0.1).
//!
//! The app is the example's own code (`examples/production.rs`, included below), built on a
//! `ManualClock`: no time passes unless a test advances it, so every count is exact.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_tests::TestServer;

// The example file itself, so the test exercises exactly what `cargo run --example
// production` serves. Its `main` (the example's entry point) is unused here, and its `pub`
// items are reachable only inside this test crate.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/production.rs"]
mod production;

use production::{EDGE_PER_MINUTE, SEARCH_PER_MINUTE, USER_PER_MINUTE};

/// The example's app on a fresh manual clock, served on 127.0.0.1 (the trusted proxy).
async fn start() -> (ManualClock, TestServer) {
    let clock = ManualClock::new();
    let app = production::app_with_clock(clock.clone()).expect("the example's limits are valid");
    (clock, TestServer::start(app).await)
}

/// `GET path` as the proxy forwarding for `client`, with an optional bearer `token`.
async fn get_as(
    server: &TestServer,
    path: &str,
    client: &str,
    token: Option<&str>,
) -> reqwest::Response {
    let mut req = server.get(path).header("x-forwarded-for", client);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.expect("request to the example app")
}

/// `POST /search` as the proxy forwarding for `client`, with bearer `token`.
async fn search_as(server: &TestServer, client: &str, token: &str) -> reqwest::Response {
    server
        .post("/search")
        .header("x-forwarded-for", client)
        .bearer_auth(token)
        .body("rust")
        .send()
        .await
        .expect("request to the example app")
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header in {res:?}"))
}

#[tokio::test]
async fn bad_tokens_spend_the_edge_budget_before_authentication() {
    assert_eq!(EDGE_PER_MINUTE, 30);
    let (_clock, server) = start().await;
    let mut statuses = Vec::new();
    for i in 0..40 {
        let token = format!("guess-{i}");
        let res = get_as(&server, "/me", "203.0.113.5", Some(&token)).await;
        statuses.push(res.status().as_u16());
        if i == 29 {
            // The last guess the edge admits: authentication refuses it, the budget is spent.
            assert_eq!(res.status(), 401);
            assert_eq!(header(&res, "ratelimit"), "\"edge\";r=0;t=60");
        }
        if i == 30 {
            assert_eq!(res.status(), 429);
            assert_eq!(header(&res, "ratelimit"), "\"edge\";r=0;t=60");
            assert_eq!(header(&res, "ratelimit-policy"), "\"edge\";q=30;w=60");
            assert_eq!(header(&res, "retry-after"), "2");
        }
    }
    let unauthorized = statuses.iter().filter(|&&s| s == 401).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((unauthorized, limited), (30, 10), "statuses: {statuses:?}");
    assert!(statuses[..30].iter().all(|&s| s == 401), "{statuses:?}");
    assert!(statuses[30..].iter().all(|&s| s == 429), "{statuses:?}");

    // A valid token from the same client is refused too: the edge is per client, not per
    // credential, and it runs first.
    let res = get_as(&server, "/me", "203.0.113.5", Some("tok-alice")).await;
    assert_eq!(res.status(), 429);
    // Another client behind the same proxy still gets an answer from authentication.
    let res = get_as(&server, "/me", "203.0.113.6", Some("guess-x")).await;
    assert_eq!(res.status(), 401);
}

#[tokio::test]
async fn users_behind_one_ip_get_separate_budgets() {
    let (_clock, server) = start().await;
    for left in (0..USER_PER_MINUTE).rev() {
        let res = get_as(&server, "/me", "198.51.100.7", Some("tok-alice")).await;
        assert_eq!(res.status(), 200);
        assert!(
            header(&res, "ratelimit").starts_with(&format!("\"per-user\";r={left};")),
            "{res:?}"
        );
    }
    let res = get_as(&server, "/me", "198.51.100.7", Some("tok-alice")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), "6");

    // Bob shares alice's IP (and its edge budget: 11 requests so far) but not her budget.
    let res = get_as(&server, "/me", "198.51.100.7", Some("tok-bob")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "hello bob\n");
    let res = get_as(&server, "/me", "198.51.100.7", Some("tok-bob")).await;
    assert_eq!(
        header(&res, "ratelimit"),
        "\"per-user\";r=8;t=12, \"edge\";r=17;t=26"
    );
}

#[tokio::test]
async fn anonymous_requests_fall_back_to_the_forwarded_client_ip() {
    let (_clock, server) = start().await;
    for _ in 0..USER_PER_MINUTE {
        let res = get_as(&server, "/me", "198.51.100.7", None).await;
        assert_eq!(res.status(), 200);
    }
    let res = get_as(&server, "/me", "198.51.100.7", None).await;
    assert_eq!(res.status(), 429);
    assert!(header(&res, "ratelimit").starts_with("\"per-user\";r=0;"));

    // Entries a client prepends do not change its key: the rightmost untrusted entry is the
    // client (the one the proxy appended).
    let res = get_as(&server, "/me", "192.0.2.99, 198.51.100.7", None).await;
    assert_eq!(res.status(), 429);

    // Another forwarded client, through the same proxy connection, has its own budget.
    let res = get_as(&server, "/me", "198.51.100.8", None).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "hello anonymous\n");
    // A user at the spent IP is keyed by name, not by IP.
    let res = get_as(&server, "/me", "198.51.100.7", Some("tok-alice")).await;
    assert_eq!(res.status(), 200);
    assert!(header(&res, "ratelimit").starts_with("\"per-user\";r=9;"));
}

#[tokio::test]
async fn post_search_has_the_stricter_limit() {
    assert_eq!(SEARCH_PER_MINUTE, 3);
    let (clock, server) = start().await;
    let expected = [
        "\"per-user\";r=9;t=6, \"search\";r=2;t=20, \"edge\";r=29;t=2",
        "\"per-user\";r=8;t=12, \"search\";r=1;t=40, \"edge\";r=28;t=4",
        "\"per-user\";r=7;t=18, \"search\";r=0;t=60, \"edge\";r=27;t=6",
    ];
    for want in expected {
        let res = search_as(&server, "198.51.100.7", "tok-alice").await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "ratelimit"), want);
        assert_eq!(res.text().await.unwrap(), "results for \"rust\"\n");
    }
    let res = search_as(&server, "198.51.100.7", "tok-alice").await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), "20");
    assert!(header(&res, "ratelimit").contains("\"search\";r=0;t=60"));

    // The refused search spent none of alice's per-user budget (7 left before it, 6 after
    // this request); bob's searches are his own.
    let res = get_as(&server, "/me", "198.51.100.7", Some("tok-alice")).await;
    assert_eq!(res.status(), 200);
    assert!(header(&res, "ratelimit").starts_with("\"per-user\";r=6;"));
    let res = search_as(&server, "198.51.100.7", "tok-bob").await;
    assert_eq!(res.status(), 200);

    // One search every 20 s after that.
    clock.advance(Duration::from_secs(20));
    let res = search_as(&server, "198.51.100.7", "tok-alice").await;
    assert_eq!(res.status(), 200);
    assert!(header(&res, "ratelimit").contains("\"search\";r=0;t=60"));
}

#[tokio::test]
async fn health_is_never_limited_and_carries_no_rate_limit_headers() {
    let (_clock, server) = start().await;
    // Spend the edge budget of the proxy's own address (no X-Forwarded-For).
    for _ in 0..EDGE_PER_MINUTE {
        server.get("/me").bearer_auth("guess").send().await.unwrap();
    }
    assert_eq!(server.get("/me").send().await.unwrap().status(), 429);

    for _ in 0..50 {
        let res = server.get("/health").send().await.unwrap();
        assert_eq!(res.status(), 200);
        for name in [
            "ratelimit",
            "ratelimit-policy",
            "retry-after",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert!(res.headers().get(name).is_none(), "{name} on /health");
        }
        assert_eq!(res.text().await.unwrap(), "ok\n");
    }
}

#[tokio::test]
async fn ietf_fields_name_every_policy() {
    let (_clock, server) = start().await;
    let res = get_as(&server, "/me", "198.51.100.7", None).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        "\"per-user\";q=10;w=60, \"edge\";q=30;w=60"
    );
    assert_eq!(
        header(&res, "ratelimit"),
        "\"per-user\";r=9;t=6, \"edge\";r=29;t=2"
    );
    assert!(res.headers().get("x-ratelimit-limit").is_none());

    let res = search_as(&server, "198.51.100.7", "tok-alice").await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        "\"per-user\";q=10;w=60, \"search\";q=3;w=60, \"edge\";q=30;w=60"
    );
}

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    let (_clock, server) = start().await;
    // 127.0.0.2 is loopback but not the trusted proxy (127.0.0.1).
    let untrusted = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .build()
        .unwrap();
    let from_untrusted = server.clone().with_client(untrusted);
    for i in 0..USER_PER_MINUTE {
        let res = get_as(&from_untrusted, "/me", &format!("192.0.2.{i}"), None).await;
        assert_eq!(res.status(), 200);
    }
    // A new X-Forwarded-For value buys no new budget: the key is the peer, 127.0.0.2.
    let res = get_as(&from_untrusted, "/me", "192.0.2.200", None).await;
    assert_eq!(res.status(), 429);
    assert!(header(&res, "ratelimit").starts_with("\"per-user\";r=0;"));
    assert!(header(&res, "ratelimit").ends_with("\"edge\";r=19;t=22"));

    // The trusted proxy forwarding for 127.0.0.2 reaches that same spent budget.
    let res = get_as(&server, "/me", "127.0.0.2", None).await;
    assert_eq!(res.status(), 429);
    // And none of the forwarded addresses the untrusted peer sent got charged.
    let res = get_as(&server, "/me", "192.0.2.0", None).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(&res, "ratelimit"),
        "\"per-user\";r=9;t=6, \"edge\";r=29;t=2"
    );
}
