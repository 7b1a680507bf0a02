//! Defects a randomized sweep found in the tower layer, each with the smallest input that
//! showed it: `Info` naming decisions after the wrong policy, RFC 7239 obfuscated ports, the
//! header merge keeping non-canonical numbers, and a policy charged twice in one request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use ratekeeper_core::clock::TokioClock;
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Key, Policy, Quota};
use ratekeeper_tower::info::Info;
use ratekeeper_tower::key::{ForwardedIp, KeyExtractor, PeerAddr, Source};
use ratekeeper_tower::policy::resolve_fn;
use ratekeeper_tower::rate_limit::Mode;
use ratekeeper_tower::route::{RouteTable, RouteTemplate};
use ratekeeper_tower::{RateLimitLayer, key::GlobalKey};
use tower::{ServiceBuilder, ServiceExt};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// A handler answering with the `(policy, remaining)` pairs of the request's [`Info`] and
/// its deciding policy.
async fn names(req: Request<()>) -> Result<Response<String>, Infallible> {
    let body = match req.extensions().get::<Info>() {
        Some(info) => {
            let pairs: Vec<String> = info
                .policies()
                .map(|(n, d)| format!("{n}={}", d.remaining()))
                .collect();
            let deciding = info.deciding().map_or("", |(n, _)| n);
            format!("{} deciding={deciding}", pairs.join(","))
        }
        None => "no info".to_owned(),
    };
    Ok(Response::new(body))
}

async fn body<B: http_body::Body>(res: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn sweep_info_names_name_the_policy_the_resolver_charged() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("free", per_minute(1)))
        .policy(Policy::new("paid", per_minute(100)))
        .key(GlobalKey)
        .resolver(resolve_fn(|_req, plan| {
            plan.charge("paid");
        }))
        .request_info(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(names);
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(body(res).await, "paid=99 deciding=paid");
}

#[tokio::test]
async fn sweep_info_names_route_table_subsets() {
    // "login" is scoped to POST /login; GET /search is charged "api" (index 1) only.
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("login", per_minute(3)))
        .policy(Policy::new("api", per_minute(100)))
        .key(GlobalKey)
        .resolver(
            RouteTable::new()
                .limit(Method::POST, "/login", "login")
                .cost(Method::GET, "/search", 10),
        )
        .request_info(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(names);
    let mut req = Request::get("/search").body(()).unwrap();
    req.extensions_mut().insert(RouteTemplate("/search".into()));
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(body(res).await, "api=90 deciding=api");
    let mut req = Request::post("/login").body(()).unwrap();
    req.extensions_mut().insert(RouteTemplate("/login".into()));
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(body(res).await, "login=2,api=89 deciding=login");
}

fn forwarded_key(forwarded: &str) -> String {
    let ip = ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]).source(Source::Forwarded);
    let mut req = Request::builder()
        .header("forwarded", forwarded)
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(PeerAddr("10.0.0.5:1".parse::<SocketAddr>().unwrap()));
    ip.extract(&req).unwrap().to_string()
}

#[test]
fn sweep_obfuscated_ports_key_the_client_not_the_proxy() {
    // RFC 7239 §6: node-port = port / obfport; obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-").
    for (header, want) in [
        ("for=\"192.0.2.43:_abc\"", "ip:192.0.2.43"),
        ("for=\"192.0.2.43:_a.B-9_\"", "ip:192.0.2.43"),
        ("for=\"192.0.2.43:_\"", "ip:10.0.0.5"),
        ("for=\"[2001:db8::1]:_x\"", "net:2001:db8::/64"),
        (
            "for=\"[2001:db8::1]:_X-y.z\";proto=https",
            "net:2001:db8::/64",
        ),
        (
            "for=6.6.6.6, for=\"198.51.100.9:_hidden\"",
            "ip:198.51.100.9",
        ),
        // Numeric ports are 1*5DIGIT, as before.
        ("for=\"192.0.2.43:4711\"", "ip:192.0.2.43"),
        ("for=\"[2001:db8::1]:4711\"", "net:2001:db8::/64"),
    ] {
        assert_eq!(forwarded_key(header), want, "{header}");
    }
}

#[test]
fn sweep_obfuscated_ports_malformed_ports_and_obfuscated_names_still_fall_back() {
    for header in [
        "for=\"192.0.2.43:\"",
        "for=\"192.0.2.43:_a/b\"",
        "for=\"192.0.2.43:_a:b\"",
        "for=\"192.0.2.43:123456\"",
        "for=\"192.0.2.43:x1\"",
        "for=\"[2001:db8::1]_x\"",
        "for=\"[2001:db8::1]:\"",
        "for=\"[2001:db8::1]:_\"",
        "for=\"2001:db8::1:_x\"",
        "for=192.0.2.43:_abc",
        "for=\"_hidden:_abc\"",
        "for=\"_hidden:80\"",
        "for=_hidden",
        "for=unknown",
        "for=\"unknown:_x\"",
    ] {
        assert_eq!(forwarded_key(header), "ip:10.0.0.5", "{header}");
    }
}

/// The response headers when a handler already set `X-RateLimit-*` to `upstream` (limit,
/// remaining, reset) behind a layer allowing 10 per minute.
async fn merged(upstream: [&'static str; 3]) -> HeaderMap {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("api", per_minute(10)))
        .key(GlobalKey)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |_req: Request<()>| async move {
            let mut res = Response::new(String::new());
            let names = [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ];
            for (name, value) in names.into_iter().zip(upstream) {
                res.headers_mut()
                    .insert(name, HeaderValue::from_static(value));
            }
            Ok::<_, Infallible>(res)
        });
    svc.oneshot(Request::new(()))
        .await
        .unwrap()
        .headers()
        .clone()
}

fn x_ratelimit(headers: &HeaderMap) -> [&str; 3] {
    [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ]
    .map(|n| headers.get(n).map_or("-", |v| v.to_str().unwrap()))
}

#[tokio::test]
async fn sweep_header_merge_keeps_only_canonical_numbers() {
    // This layer reports 10 / 9 / 6 (one request of 10 per minute: 6 s until full again).
    let mine = ["10", "9", "6"];
    // A complete, tighter upstream report written canonically is kept, as before.
    assert_eq!(
        x_ratelimit(&merged(["5", "0", "30"]).await),
        ["5", "0", "30"]
    );
    for upstream in [
        ["+5", "0", "30"],
        ["5", "+0", "30"],
        ["5", " 0 ", "30"],
        ["5", "00", "30"],
        ["005", "0", "30"],
        ["5", "0", "007"],
        ["5", "0", "+30"],
        ["5", "0", "30 "],
        ["5", "0", "3e1"],
        ["5", "-0", "30"],
        ["5", "0x0", "30"],
        ["5", "0", "99999999999999999999999"],
        // Not a consistent report either: more remaining than its own limit.
        ["5", "7", "30"],
    ] {
        assert_eq!(x_ratelimit(&merged(upstream).await), mine, "{upstream:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn sweep_charged_twice_sum_over_capacity_can_never_fit() {
    // Each half (2) fits the capacity (2); the whole (4) never does. Delay mode must answer
    // at once, like any cost that can never fit, not retry until `max_wait`.
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("a", per_minute(2)))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay {
            max_wait: Duration::from_secs(600),
        })
        .resolver(resolve_fn(|_req, plan| {
            plan.charge_cost("a", 2).charge_cost("a", 2);
        }))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(names);
    let start = tokio::time::Instant::now();
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none(), "{res:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn sweep_charged_twice_is_one_charge_of_the_summed_cost() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("a", per_minute(4)))
        .policy(Policy::new("b", per_minute(100)))
        .key(GlobalKey)
        .resolver(resolve_fn(|_req, plan| {
            plan.charge("a");
            // The layer's key given explicitly is the same budget as no key.
            plan.charge_with("a", Key::Global, 2);
            // Another key is another budget: a separate charge.
            plan.charge_with("a", Key::from("other"), 1);
            plan.charge("b");
        }))
        .request_info(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(names);
    // One decision for ("a", global) of cost 3, one for ("a", other), one for "b".
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(body(res).await, "a=1,a=3,b=99 deciding=a");
    // The second request needs 3 of the 1 left: denied, and all-or-nothing charges nothing.
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
}

#[test]
fn sweep_charged_twice_route_table_attaches_a_policy_once() {
    // Attaching a policy to a route twice is the same as once: a table is static and never
    // charges one policy twice, so it builds, and a cost of the whole capacity fits.
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("login", per_minute(3)))
        .key(GlobalKey)
        .resolver(
            RouteTable::new()
                .limit(Method::POST, "/login", "login")
                .limit(Method::POST, "/login", "login")
                .cost(Method::POST, "/login", 3),
        )
        .build();
    assert!(layer.is_ok());
}
