//! What the layer logs, captured with a `tracing` subscriber that writes into a buffer
//! (installed for the test's thread only, with a current-thread runtime so every poll runs
//! on that thread).
//!
//! - route templates that can never match fail when the layer is built, with the fix;
//! - one INFO event per built layer lists its policies, key, store, header style and mode;
//! - the one-time proxy warning: once per layer, not with `ForwardedIp`, not when off;
//! - the one-time warning about a forwarding peer in an exempt network, naming the fix;
//! - one DEBUG decision event per decision, the key hashed unless raw keys are asked for;
//! - a Redis outage of 1,000 requests logs a handful of WARN lines (a `redis-server` this
//!   test started, then killed);
//! - a bad Redis URL is a one-line sentence that calls it a configuration error.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{Method, Request, Response, StatusCode};
use ratekeeper_axum::core::store::FailurePolicy;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::key::{ForwardedIp, PeerAddr};
use ratekeeper_axum::route::RouteTable;
use ratekeeper_axum::{BuildError, RateLimitLayer, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::logs::Captured;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};
use tower::{Layer, Service, ServiceExt, service_fn};

/// Captures events at `filter` (an `EnvFilter` directive) for the rest of the scope.
fn capture(filter: &str) -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(captured.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    (captured, guard)
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn ok(_req: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::new()))
}

/// A request from `peer`, with an `X-Forwarded-For` header when `xff` is set.
fn request(peer: &str, xff: Option<&str>) -> Request<()> {
    let mut req = Request::get("/").body(()).unwrap();
    req.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
    if let Some(xff) = xff {
        req.headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
    }
    req
}

/// Sends requests from one client until one carries rate-limit headers (Redis decided), at
/// most `tries` of them `pause` apart; whether one did.
async fn redis_answers<S, B>(svc: &mut S, tries: u32, pause: Duration) -> bool
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..tries {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("192.0.2.1:1", None))
            .await
            .unwrap();
        if res.headers().contains_key("x-ratelimit-limit") {
            return true;
        }
        tokio::time::sleep(pause).await;
    }
    false
}

#[test]
fn templates_that_can_never_match_fail_at_build_with_the_fix() {
    let build = |template: &str| {
        RateLimitLayer::builder()
            .policy(Policy::new("api", per_minute(100)))
            .resolver(RouteTable::new().cost(Method::GET, template, 2))
            .build()
            .unwrap_err()
    };
    let err = build("search");
    assert!(matches!(&err, BuildError::RouteTemplate { template, .. } if template == "search"));
    assert_eq!(
        err.to_string(),
        "route template \"search\" can never match: it does not start with `/`; write \"/search\""
    );
    let err = build("/items/:id");
    assert_eq!(
        err.to_string(),
        "route template \"/items/:id\" can never match: it uses axum 0.7's `:param` syntax; \
         write \"/items/{id}\" (axum 0.8 writes parameters as `{param}` and `{*rest}`)"
    );
    assert!(
        build("/static/*path")
            .to_string()
            .contains("write \"/static/{*path}\"")
    );
    // The same checks for a route-scoped policy.
    let err = RateLimitLayer::builder()
        .policy(Policy::new("login", per_minute(3)))
        .resolver(RouteTable::new().limit(Method::POST, "/users/:id/login", "login"))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("\"/users/{id}/login\""), "{err}");
    // axum 0.8 templates build.
    assert!(
        RateLimitLayer::builder()
            .policy(Policy::new("api", per_minute(100)))
            .resolver(RouteTable::new().cost(Method::GET, "/items/{id}", 2).cost(
                Method::GET,
                "/static/{*path}",
                1
            ))
            .build()
            .is_ok()
    );
}

#[test]
fn a_built_layer_logs_its_limits_once_at_info() {
    let (logs, _guard) = capture("info");
    let _layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", per_minute(60)))
        .policy(Policy::new(
            "daily",
            Quota::per_day(NonZeroU32::new(10_000).unwrap()),
        ))
        .build()
        .unwrap();
    let info = logs.lines("INFO");
    assert_eq!(info.len(), 1, "{}", logs.text());
    let line = &info[0];
    for part in [
        "rate limit built",
        "burst = 60/m",
        "daily = 10000/d",
        "gcra",
        "key=\"PeerIp\"",
        "store=\"MemoryStore<Key>\"",
        "headers=XRateLimit",
        "mode=reject",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
}

#[test]
fn the_proxy_warning_is_given_once_and_names_forwarded_ip() {
    let rt = runtime();
    let (logs, _guard) = capture("warn");
    let svc = RateLimitLayer::new(per_minute(100)).layer(service_fn(ok));
    rt.block_on(async {
        // A public peer with the header: no proxy of ours, no warning.
        svc.clone()
            .oneshot(request("192.0.2.1:1000", Some("198.51.100.1")))
            .await
            .unwrap();
        // A private peer without the header: no warning.
        svc.clone()
            .oneshot(request("10.0.0.2:1000", None))
            .await
            .unwrap();
        assert!(logs.lines("WARN").is_empty(), "{}", logs.text());
        for i in 0..5 {
            let xff = format!("198.51.100.{i}");
            let res = svc
                .clone()
                .oneshot(request("10.0.0.2:1000", Some(&xff)))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
        svc.clone()
            .oneshot(request("127.0.0.1:1000", Some("198.51.100.9")))
            .await
            .unwrap();
    });
    let warn = logs.lines("WARN");
    assert_eq!(warn.len(), 1, "{}", logs.text());
    assert!(warn[0].contains("ForwardedIp::trusting"), "{}", warn[0]);
    assert!(warn[0].contains("X-Forwarded-For"), "{}", warn[0]);
    assert!(warn[0].contains("10.0.0.2"), "{}", warn[0]);
}

#[test]
fn no_proxy_warning_with_forwarded_ip_or_when_turned_off() {
    let rt = runtime();
    let (logs, _guard) = capture("warn");
    let forwarded = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100)))
        .key(ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]))
        .build()
        .unwrap()
        .layer(service_fn(ok));
    let quiet = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100)))
        .warn_forwarded(false)
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        for _ in 0..3 {
            let res = forwarded
                .clone()
                .oneshot(request("10.0.0.2:1000", Some("198.51.100.1")))
                .await
                .unwrap();
            assert_eq!(res.headers()["x-ratelimit-limit"], "100");
            quiet
                .clone()
                .oneshot(request("10.0.0.2:1000", Some("198.51.100.1")))
                .await
                .unwrap();
        }
    });
    assert!(logs.lines("WARN").is_empty(), "{}", logs.text());
}

/// A peer in an exempt network that sends `X-Forwarded-For` the layer reads no client from
/// is a proxy: its requests are limited, and one WARN per layer says so and names the fix
/// (state the proxies; or, when the layer has rules that do not trust the peer, add it).
#[test]
fn a_forwarding_peer_in_an_exempt_network_is_warned_about_once() {
    let rt = runtime();
    let (logs, _guard) = capture("warn");
    let internal = || ["10.0.0.0/8".parse().unwrap()];
    let no_rules = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100)))
        .key(GlobalKey)
        .exempt_networks(internal())
        .build()
        .unwrap()
        .layer(service_fn(ok));
    let other_proxy = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100)))
        .key(ForwardedIp::trusting(["192.168.0.0/16".parse().unwrap()]))
        .exempt_networks(internal())
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        // Without the header: exempt, no warning.
        let res = no_rules
            .clone()
            .oneshot(request("10.0.0.2:1000", None))
            .await
            .unwrap();
        assert!(res.headers().get("x-ratelimit-limit").is_none());
        assert!(logs.lines("WARN").is_empty(), "{}", logs.text());
        for _ in 0..3 {
            let res = no_rules
                .clone()
                .oneshot(request("10.0.0.2:1000", Some("198.51.100.1")))
                .await
                .unwrap();
            assert_eq!(res.headers()["x-ratelimit-limit"], "100");
        }
        let warn = logs.lines("WARN");
        assert_eq!(warn.len(), 1, "{}", logs.text());
        for part in [
            "10.0.0.2",
            "X-Forwarded-For",
            "exempt network",
            ".exempt_client_ip(",
        ] {
            assert!(warn[0].contains(part), "{part:?} missing from {}", warn[0]);
        }
        for _ in 0..2 {
            let res = other_proxy
                .clone()
                .oneshot(request("10.0.0.3:1000", Some("198.51.100.1")))
                .await
                .unwrap();
            assert_eq!(res.headers()["x-ratelimit-limit"], "100");
        }
    });
    let warn = logs.lines("WARN");
    assert_eq!(warn.len(), 2, "{}", logs.text());
    assert!(warn[1].contains("10.0.0.3"), "{}", warn[1]);
    assert!(
        warn[1].contains("add the proxy to the trusted proxies"),
        "{}",
        warn[1]
    );
}

#[test]
fn one_debug_event_per_decision_with_the_key_hashed_by_default() {
    let rt = runtime();
    let (logs, _guard) = capture("ratekeeper::decision=debug");
    let hashed = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(2)))
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        for want in [200, 200, 429] {
            let res = hashed
                .clone()
                .oneshot(request("192.0.2.7:1", None))
                .await
                .unwrap();
            assert_eq!(res.status(), want);
        }
    });
    let debug = logs.lines("DEBUG");
    assert_eq!(debug.len(), 3, "{}", logs.text());
    assert!(debug[0].contains("outcome=\"allowed\"") || debug[0].contains("outcome=allowed"));
    assert!(
        debug[0].contains("remaining=1") && debug[0].contains("cost=1"),
        "{}",
        debug[0]
    );
    assert!(
        debug[2].contains("denied") && debug[2].contains("policy=\"api\"")
            || debug[2].contains("policy=api"),
        "{}",
        debug[2]
    );
    assert!(!logs.text().contains("192.0.2.7"), "{}", logs.text());
    assert!(
        debug[0].contains("key=\"h:") || debug[0].contains("key=h:"),
        "{}",
        debug[0]
    );

    let raw = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(2)))
        .log_raw_keys(true)
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        raw.oneshot(request("192.0.2.8:1", None)).await.unwrap();
    });
    assert!(logs.text().contains("ip:192.0.2.8"), "{}", logs.text());
}

#[test]
fn a_redis_outage_of_1000_requests_logs_a_handful_of_warnings() {
    let rt = runtime();
    let mut server = RedisServer::start();
    let (logs, _guard) = capture("info");
    let store = rt.block_on(async {
        RedisStore::builder()
            .deadline(Duration::from_millis(250))
            .on_failure(FailurePolicy::Allow)
            .breaker(3, Duration::from_millis(200))
            .standalone(&server.url())
            .await
            .unwrap()
    });
    let mut svc = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(100_000)))
        .store(store)
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        // Redis decides (the first call connects and loads the script: retried on a slow
        // machine until one lands within the deadline).
        let decided = redis_answers(&mut svc, 20, Duration::from_millis(100)).await;
        assert!(decided, "Redis never decided");
        server.kill();
        for i in 0..1_000u32 {
            let peer = format!("192.0.2.{}:1", i % 200);
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(request(&peer, None))
                .await
                .unwrap();
            // Fail open: the request goes on without rate-limit headers.
            assert_eq!(res.status(), StatusCode::OK);
            if i % 100 == 0 {
                // Let the breaker's open period pass a few times during the outage.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        }
    });
    let warn = logs.lines("WARN");
    assert!(
        (1..=5).contains(&warn.len()),
        "{} WARN lines:\n{}",
        warn.len(),
        logs.text()
    );
    assert!(warn[0].contains("circuit breaker open"), "{}", warn[0]);
    assert!(
        warn[0].contains("failures=3") || warn[0].contains("3 failures"),
        "{}",
        warn[0]
    );

    // Redis comes back: the breaker closes and says so once, with the count.
    server.restart();
    let back = rt.block_on(redis_answers(&mut svc, 200, Duration::from_millis(50)));
    assert!(back, "Redis never came back");
    let recovered: Vec<String> = logs
        .lines("INFO")
        .into_iter()
        .filter(|l| l.contains("recovered"))
        .collect();
    // One per outage (a slow start-up could have had a short one of its own).
    let last = recovered
        .last()
        .unwrap_or_else(|| panic!("no recovery line:\n{}", logs.text()));
    assert!(recovered.len() <= 2, "{}", logs.text());
    assert!(last.contains("skipped="), "{last}");
}

#[test]
fn a_bad_redis_url_is_a_one_line_configuration_error() {
    let rt = runtime();
    for url in ["not a url", "http://127.0.0.1:6379/", "redis://:bad port/"] {
        let err = rt
            .block_on(RedisStore::builder().standalone(url))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("configuration error: the Redis URL is not valid"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
        for debug_text in ["InvalidClientConfig", "Unavailable(", "{", "\""] {
            assert!(!text.contains(debug_text), "{text}");
        }
        assert!(err.is_config());
        assert!(std::error::Error::source(&err).is_some(), "cause chained");
        // As a layer build error it reads the same.
        let build: BuildError = err.into();
        assert_eq!(build.to_string(), text);
    }
}

/// The shared concurrency slots log a Redis outage like the store's breaker does: one WARN
/// when it starts (not one per request, nor per failed renewal or release), one INFO when a
/// call succeeds again.
#[test]
fn a_shared_slots_outage_logs_once_not_per_request() {
    use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
    use ratekeeper_axum::key::GlobalKey;

    let rt = runtime();
    let mut server = RedisServer::start();
    let (logs, _guard) = capture("info");
    let slots = rt.block_on(async {
        // The outage is a killed server (calls fail at once): the deadline only has to keep
        // a slow round trip on a loaded machine from counting as an outage of its own.
        RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .on_failure(FailurePolicy::Allow)
            .standalone(&server.url())
            .await
            .unwrap()
            .slots()
    });
    let mut svc = ConcurrencyLimitLayer::new(NonZeroU32::new(10).unwrap())
        .key(GlobalKey)
        .shared(slots)
        .layer(service_fn(ok));
    rt.block_on(async {
        // Redis answers (a slot, released at the end of the body).
        let held = redis_answers(&mut svc, 20, Duration::from_millis(100)).await;
        assert!(held, "Redis never answered");
        server.kill();
        for _ in 0..200 {
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(request("192.0.2.1:1", None))
                .await
                .unwrap();
            // Fail open: the request goes on without a slot.
            assert_eq!(res.status(), StatusCode::OK);
        }
    });
    let warn = logs.lines("WARN");
    assert_eq!(warn.len(), 1, "{}", logs.text());
    assert!(
        warn[0].contains("concurrency slots unavailable"),
        "{}",
        warn[0]
    );

    server.restart();
    let back = rt.block_on(redis_answers(&mut svc, 200, Duration::from_millis(50)));
    assert!(back, "Redis never came back");
    let recovered: Vec<String> = logs
        .lines("INFO")
        .into_iter()
        .filter(|l| l.contains("concurrency slots recovered"))
        .collect();
    assert_eq!(recovered.len(), 1, "{}", logs.text());
    assert!(recovered[0].contains("failures="), "{}", recovered[0]);
    assert_eq!(logs.lines("WARN").len(), 1, "{}", logs.text());
}

/// A cost larger than the burst (a cost that may come from client input) is a WARN once per
/// layer; the same denial again is a DEBUG event, so a client cannot flood the logs with it.
#[test]
fn a_cost_that_can_never_fit_warns_once_per_layer() {
    let rt = runtime();
    let (logs, _guard) = capture("info");
    let mut svc = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(10)))
        // A cost from the request (a fixed cost above the burst is refused at build).
        .cost_fn(|req: &ratekeeper_axum::RequestParts<'_>| {
            10 + u64::try_from(req.uri().path().len()).unwrap_or(u64::MAX)
        })
        .build()
        .unwrap()
        .layer(service_fn(ok));
    rt.block_on(async {
        for i in 0..100u32 {
            let peer = format!("192.0.2.{}:1", i % 50);
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(request(&peer, None))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        }
    });
    let warn = logs.lines("WARN");
    assert_eq!(warn.len(), 1, "{}", logs.text());
    assert!(warn[0].contains("can never be allowed"), "{}", warn[0]);
}
