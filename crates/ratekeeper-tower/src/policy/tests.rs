//! Resolvers, exemptions and settle rules through the layer.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::num::NonZeroU32;

use http::{Method, Request, Response, StatusCode};
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{
    Charge, Checked, Decisions, MemoryStore, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_core::{Key, Policy, Quota};
use tower::{ServiceBuilder, ServiceExt};

use super::{AllPolicies, Plan, Settle, resolve_fn};
use crate::RequestParts;
use crate::key::{KeyError, PeerAddr};
use crate::{BuildError, RateLimitLayer};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

fn req(peer: &str, path: &str) -> Request<()> {
    let mut req = Request::builder().uri(path).body(()).unwrap();
    req.extensions_mut()
        .insert(PeerAddr(format!("{peer}:1").parse().unwrap()));
    req
}

/// Answers `500` when the path is `/fail`, `200` otherwise.
async fn app(req: Request<()>) -> Result<Response<String>, Infallible> {
    let mut res = Response::new(String::new());
    if req.uri().path() == "/fail" {
        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    }
    Ok(res)
}

/// The memory store answering through the async (`Checked::Pending`) path.
struct Pending(MemoryStore<Key, ManualClock>);

impl Store<Key> for Pending {
    type Future = Ready<Result<Decisions, StoreError>>;
    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        self.0.register(policy)
    }
    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        Checked::Pending(ready(self.0.check_now(charges)))
    }
    fn refund(&self, refunds: &[Refund<'_, Key>]) {
        self.0.refund(refunds);
    }
}

#[test]
fn settle_rules() {
    assert!(Settle::REFUND_SERVER_ERRORS.refunds(StatusCode::BAD_GATEWAY));
    assert!(!Settle::REFUND_SERVER_ERRORS.refunds(StatusCode::OK));
    assert!(Settle::COUNT_UNAUTHORIZED.refunds(StatusCode::OK));
    assert!(!Settle::COUNT_UNAUTHORIZED.refunds(StatusCode::UNAUTHORIZED));
}

#[test]
fn unknown_policy_fails_the_plan() {
    let names: Vec<Box<str>> = vec!["a".into(), "b".into()];
    let key = Key::Global;
    let mut plan = Plan::new(&names, &key, 2);
    plan.charge("b").charge_with("a", Key::from("x"), 5);
    assert!(plan.error.is_none());
    assert_eq!(plan.entries.len(), 2);
    assert_eq!(plan.entries[0].index, 1);
    assert_eq!(plan.entries[0].cost, 2);
    assert_eq!(plan.entries[1].cost, 5);
    plan.charge("c");
    assert_eq!(
        plan.error.as_ref().map(KeyError::status),
        Some(StatusCode::INTERNAL_SERVER_ERROR)
    );
}

#[test]
fn unknown_settle_policy_is_a_build_error() {
    let err = RateLimitLayer::builder()
        .quota(per_minute(1))
        .settle("login", Settle::COUNT_UNAUTHORIZED)
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::UnknownPolicy(n) if n == "login"));
}

#[tokio::test]
async fn exemptions_are_neither_charged_nor_reported() {
    let layer = RateLimitLayer::builder()
        .quota(per_minute(1))
        .exempt_networks(["192.0.2.0/24".parse().unwrap()])
        .exempt_keys([Key::Ip("198.51.100.1".parse().unwrap())])
        .resolver(AllPolicies.except(|r: &RequestParts<'_>| r.uri().path() == "/health"))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    for (peer, path) in [
        ("192.0.2.7", "/"),
        ("[::ffff:192.0.2.8]", "/"),
        ("198.51.100.1", "/"),
        ("203.0.113.1", "/health"),
    ] {
        for _ in 0..3 {
            let res = svc.clone().oneshot(req(peer, path)).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{peer}{path}");
            assert!(res.headers().get("x-ratelimit-limit").is_none());
        }
    }
    let res = svc.clone().oneshot(req("203.0.113.1", "/")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    let res = svc.clone().oneshot(req("203.0.113.1", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Sends `GET /` from `peer` with `X-Forwarded-For: xff` (when set) `n` times; whether each
/// answer was exempt (200 without rate-limit headers).
async fn exempt_answers<S, B>(svc: &S, peer: &str, xff: Option<&str>, n: usize) -> Vec<bool>
where
    S: tower::Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        let mut req = req(peer, "/");
        if let Some(xff) = xff {
            req.headers_mut()
                .insert("x-forwarded-for", xff.parse().unwrap());
        }
        let res = svc.clone().oneshot(req).await.unwrap();
        out.push(
            res.status() == StatusCode::OK && !res.headers().contains_key("x-ratelimit-limit"),
        );
    }
    out
}

/// The exempt networks are read by `exempt_client_ip`'s rules when set, in place of the key
/// extractor's: here the key trusts 10.0.0.0/8 only, the exemption also the proxy on
/// 127.0.0.1, whose forwarded client 192.0.2.7 is exempt and 203.0.113.9 is not.
#[tokio::test]
async fn exempt_client_ip_replaces_the_key_extractors_rules() {
    use crate::key::ForwardedIp;
    let build = |exempt_rules: Option<ForwardedIp>| {
        let mut builder = RateLimitLayer::builder()
            .quota(per_minute(2))
            .key(ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]))
            .exempt_networks(["192.0.2.0/24".parse().unwrap()]);
        if let Some(rules) = exempt_rules {
            builder = builder.exempt_client_ip(rules);
        }
        ServiceBuilder::new()
            .layer(builder.build().unwrap())
            .service_fn(app)
    };
    let stated = build(Some(ForwardedIp::trusting(["127.0.0.1/32"
        .parse()
        .unwrap()])));
    assert_eq!(
        exempt_answers(&stated, "127.0.0.1", Some("192.0.2.7"), 3).await,
        [true; 3]
    );
    assert_eq!(
        exempt_answers(&stated, "127.0.0.1", Some("203.0.113.9"), 3).await,
        [false; 3]
    );
    // The key's rules alone do not trust 127.0.0.1: its forwarded request is not exempt.
    let key_only = build(None);
    assert_eq!(
        exempt_answers(&key_only, "127.0.0.1", Some("192.0.2.7"), 3).await,
        [false; 3]
    );
    assert_eq!(
        exempt_answers(&key_only, "10.0.0.5", Some("192.0.2.7"), 3).await,
        [true; 3]
    );
}

/// The NAT64 prefix of the rules the exempt networks are read by applies to the networks:
/// a network written in the translator's spelling holds the IPv4 clients it embeds.
#[tokio::test]
async fn the_trust_rules_nat64_prefix_applies_to_exempt_networks() {
    use crate::key::{ForwardedIp, Nat64Prefix};
    let nsp = Nat64Prefix::new("2001:db8:64::/96".parse().unwrap()).unwrap();
    let layer = RateLimitLayer::builder()
        .quota(per_minute(2))
        .key(ForwardedIp::trusting(["10.0.0.0/8".parse().unwrap()]).nat64(nsp))
        // 192.0.2.0/24 in the translator's spelling.
        .exempt_networks(["2001:db8:64::c000:200/120".parse().unwrap()])
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    assert_eq!(
        exempt_answers(&svc, "10.0.0.5", Some("192.0.2.7"), 3).await,
        [true; 3]
    );
    assert_eq!(
        exempt_answers(&svc, "10.0.0.5", Some("2001:db8:64::c000:207"), 3).await,
        [true; 3]
    );
    assert_eq!(
        exempt_answers(&svc, "10.0.0.5", Some("198.51.100.7"), 1).await,
        [false]
    );
}

/// With the default key (the peer) and no rules, a peer in an exempt network that forwards
/// (`X-Forwarded-For`) is a proxy: its requests are limited under its key, never exempt.
#[tokio::test]
async fn a_forwarding_peer_is_not_exempt_without_rules() {
    let layer = RateLimitLayer::builder()
        .quota(per_minute(2))
        .exempt_networks(["127.0.0.0/8".parse().unwrap()])
        .warn_forwarded(false)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    assert_eq!(exempt_answers(&svc, "127.0.0.1", None, 3).await, [true; 3]);
    assert_eq!(
        exempt_answers(&svc, "127.0.0.1", Some("203.0.113.9"), 2).await,
        [false; 2]
    );
    let mut forwarded = req("127.0.0.1", "/");
    forwarded
        .headers_mut()
        .insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
    let res = svc.clone().oneshot(forwarded).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn an_exempt_route_needs_no_key_and_others_still_do() {
    // Keyed by API key; the health check sends none.
    let layer = RateLimitLayer::builder()
        .quota(per_minute(1))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .resolver(AllPolicies.except(|r: &RequestParts<'_>| r.uri().path() == "/health"))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(req("192.0.2.1", "/health"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
    }
    // Not exempt and no key: the key error, as before.
    let res = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // A resolver that charges nothing for the stand-in key does not open a bypass.
    let layer = RateLimitLayer::builder()
        .quota(per_minute(1))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .resolver(resolve_fn(|_, plan: &mut Plan<'_>| {
            if plan.key() != &Key::Global {
                plan.charge_all();
            }
        }))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    let res = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// Made-up preflights (<https://github.com/sei-protocol/sei-chain/pull/3779>: every OPTIONS request
/// was exempt): preflights are counted by default; the opt-in exemption only matches a real
/// preflight (`Origin`, `Access-Control-Request-Method`, no body).
#[tokio::test]
async fn preflights_are_counted_unless_exempted_and_only_real_ones_are_exempt() {
    let preflight = |body: Option<&'static str>| {
        let mut r = req("192.0.2.1", "/");
        *r.method_mut() = Method::OPTIONS;
        let h = r.headers_mut();
        h.insert("origin", "https://app.example".parse().unwrap());
        h.insert("access-control-request-method", "POST".parse().unwrap());
        if let Some(len) = body {
            h.insert("content-length", len.parse().unwrap());
        }
        r
    };
    for (exempt, body, expected) in [
        (false, None, StatusCode::TOO_MANY_REQUESTS),
        (true, None, StatusCode::OK),
        (true, Some("0"), StatusCode::OK),
        (true, Some("17"), StatusCode::TOO_MANY_REQUESTS),
    ] {
        let layer = RateLimitLayer::builder()
            .quota(per_minute(1))
            .exempt_preflight(exempt)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(app);
        svc.clone().oneshot(preflight(body)).await.unwrap();
        let second = svc.clone().oneshot(preflight(body)).await.unwrap();
        assert_eq!(second.status(), expected, "exempt {exempt}, body {body:?}");
    }
}

#[tokio::test]
async fn server_errors_are_refunded() {
    let layer = RateLimitLayer::builder()
        .quota(per_minute(1))
        .settle("default", Settle::REFUND_SERVER_ERRORS)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    for _ in 0..5 {
        let res = svc
            .clone()
            .oneshot(req("192.0.2.1", "/fail"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let ok = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let limited = svc.clone().oneshot(req("192.0.2.1", "/")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn pending_store_path_charges_the_planned_subset_and_settles() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("wide", per_minute(10)))
        .policy(Policy::new("narrow", per_minute(1)))
        .settle("narrow", Settle::REFUND_SERVER_ERRORS)
        .resolver(resolve_fn(|r, plan: &mut Plan<'_>| {
            let cost = plan.cost();
            plan.charge_with("narrow", Key::from(r.uri().path()), cost);
        }))
        .store(Pending(MemoryStore::with_clock(ManualClock::new())))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(app);
    // Refunded after the 500: never limited.
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(req("192.0.2.1", "/fail"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    }
    let ok = svc.clone().oneshot(req("192.0.2.1", "/a")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let limited = svc.clone().oneshot(req("192.0.2.2", "/a")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = http_body_util::BodyExt::collect(limited.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["violated-policies"], serde_json::json!(["narrow"]));
}
