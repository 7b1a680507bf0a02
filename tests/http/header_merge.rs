//! What the rate-limit headers say when something else already wrote some: nested layers
//! (different reset formats), a handler passing on an upstream's fields (complete or not,
//! on one field line or two), and a custom rejection setting its own. Also: `Info` only
//! when asked for, whatever the store or mode, and the prebuilt 429 against the general
//! path. Driven through the service (`oneshot`), with a manual clock.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::IntoResponse;

use bytes::Bytes;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::{
    Charge, Checked, Decisions, MemoryStore, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_axum::rate_limit::Mode;
use ratekeeper_axum::report::{HeaderStyle, Limited, ProblemJson, ResetFormat};
use ratekeeper_axum::{
    RateLimitLayer, RequestParts, core::Algorithm, core::Key, core::Policy, core::Quota,
    extract::RateLimitInfo, key::GlobalKey,
};
use tower::ServiceExt;

/// The manual clock's Unix time at its start.
const EPOCH: u64 = 1_700_000_000;

fn clock() -> ManualClock {
    ManualClock::with_unix_origin(Duration::from_secs(EPOCH))
}

fn fixed(name: &str, limit: u32, secs: u64) -> Policy {
    Policy::new(name, Quota::new(limit, Duration::from_secs(secs)).unwrap())
        .with_algorithm(Algorithm::FixedWindow)
}

type Layer = RateLimitLayer<GlobalKey, u64, MemoryStore<Key, ManualClock>>;

fn layer(policy: Policy, style: HeaderStyle, reset: ResetFormat, clock: &ManualClock) -> Layer {
    RateLimitLayer::builder()
        .policy(policy)
        .key(GlobalKey)
        .store(MemoryStore::with_clock(clock.clone()))
        .headers(style)
        .reset_format(reset)
        .build()
        .unwrap()
}

async fn get(app: &Router, path: &str) -> (StatusCode, HeaderMap, String) {
    let req = Request::get(path).body(Body::empty()).unwrap();
    let (parts, body) = app.clone().oneshot(req).await.unwrap().into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Every field line of `name`.
fn all(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The three `X-RateLimit-*` fields (`-` for a missing one; several lines joined by `|`).
fn x(h: &HeaderMap) -> [String; 3] {
    [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ]
    .map(|n| {
        let lines = all(h, n);
        if lines.is_empty() {
            "-".to_owned()
        } else {
            lines.join("|")
        }
    })
}

/// An app whose handler answers with `fields`, behind a 10-per-60-s fixed window.
fn upstream(fields: &'static [(&'static str, &'static str)], style: HeaderStyle) -> Router {
    Router::new()
        .route(
            "/",
            axum::routing::get(move || async move {
                let mut h = HeaderMap::new();
                for (name, value) in fields {
                    h.append(*name, HeaderValue::from_static(value));
                }
                (h, "hi").into_response()
            }),
        )
        .layer(layer(
            fixed("default", 10, 60),
            style,
            ResetFormat::DeltaSeconds,
            &clock(),
        ))
}

#[tokio::test]
async fn an_incomplete_or_unparsable_earlier_report_is_replaced_whole() {
    let cases: [&'static [(&str, &str)]; 5] = [
        // Only a remaining count: the set would lose limit and reset.
        &[("x-ratelimit-remaining", "0")],
        // A reset that is not a number.
        &[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "abc"),
        ],
        // A remaining count that is not one.
        &[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "-1"),
            ("x-ratelimit-reset", "5"),
        ],
        &[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "99999999999999999999999"),
            ("x-ratelimit-reset", "5"),
        ],
        // Complete, but less restrictive than this layer.
        &[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-reset", "5"),
        ],
    ];
    for fields in cases {
        let (status, h, _) = get(&upstream(fields, HeaderStyle::XRateLimit), "/").await;
        assert_eq!(status, 200);
        assert_eq!(x(&h), ["10", "9", "60"], "{fields:?}");
    }
}

#[tokio::test]
async fn a_complete_tighter_earlier_report_is_kept_whole() {
    let fields: &'static [(&str, &str)] = &[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "3"),
        ("x-ratelimit-reset", "30"),
    ];
    let (_, h, _) = get(&upstream(fields, HeaderStyle::XRateLimit), "/").await;
    assert_eq!(x(&h), ["5000", "3", "30"]);
}

#[tokio::test]
async fn nested_layers_compare_resets_across_formats() {
    for (inner, outer) in [
        (ResetFormat::UnixEpoch, ResetFormat::DeltaSeconds),
        (ResetFormat::DeltaSeconds, ResetFormat::UnixEpoch),
    ] {
        let c = clock();
        // Both allow 1 request; the route's window ends in 10 s, the app's in 60 s: after
        // one request both have 0 left and the app's reset is the later one.
        let app = Router::new()
            .route("/", axum::routing::get(|| async { "hi" }))
            .route_layer(layer(
                fixed("route", 1, 10),
                HeaderStyle::XRateLimit,
                inner,
                &c,
            ))
            .layer(layer(
                fixed("app", 1, 60),
                HeaderStyle::XRateLimit,
                outer,
                &c,
            ));
        let (status, h, _) = get(&app, "/").await;
        assert_eq!(status, 200);
        let [limit, remaining, reset] = x(&h);
        let reset: u64 = reset.parse().unwrap();
        let secs = if reset >= EPOCH { reset - EPOCH } else { reset };
        assert_eq!(
            (limit.as_str(), remaining.as_str(), secs),
            ("1", "0", 60),
            "route {inner:?}, app {outer:?}"
        );
    }
}

#[tokio::test]
async fn ietf_lists_on_several_field_lines_are_all_kept() {
    let fields: &'static [(&str, &str)] = &[
        ("ratelimit", "\"a\";r=5;t=10"),
        ("ratelimit", "\"b\";r=0;t=30"),
        ("ratelimit", "junk"),
    ];
    let (_, h, _) = get(&upstream(fields, HeaderStyle::Ietf), "/").await;
    assert_eq!(
        all(&h, "ratelimit"),
        ["\"a\";r=5;t=10, \"b\";r=0;t=30, \"default\";r=9;t=60"]
    );
}

/// A 1-per-60-s layer whose rejection writes its own rate-limit fields.
fn rejecting_app(style: HeaderStyle, c: &ManualClock) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(fixed("default", 10, 60))
        .key(GlobalKey)
        .cost_fn(|r: &RequestParts<'_>| if r.uri().path() == "/big" { 5 } else { 1 })
        .store(MemoryStore::with_clock(c.clone()))
        .headers(style)
        .rejection(|limited: &Limited<'_>| {
            http::Response::builder()
                .status(limited.status())
                .header("x-ratelimit-remaining", "0")
                .header("ratelimit", "\"default\";r=0;t=60")
                .header("ratelimit-policy", "\"default\";q=10;w=60")
                .body(Bytes::from_static(b"{}"))
                .unwrap()
        })
        .build()
        .unwrap();
    Router::new()
        .route("/", axum::routing::get(|| async { "hi" }))
        .route("/big", axum::routing::get(|| async { "big" }))
        .layer(layer)
}

#[tokio::test]
async fn a_rejections_own_fields_are_replaced() {
    for style in [HeaderStyle::XRateLimit, HeaderStyle::Ietf] {
        let app = rejecting_app(style, &clock());
        for _ in 0..7 {
            assert_eq!(get(&app, "/").await.0, 200);
        }
        // Cost 5 with 3 left: denied, and the headers say 3, not the rejection's 0.
        let (status, h, body) = get(&app, "/big").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::TOO_MANY_REQUESTS, "{}")
        );
        if style == HeaderStyle::XRateLimit {
            assert_eq!(x(&h), ["10", "3", "60"]);
        } else {
            assert_eq!(all(&h, "ratelimit"), ["\"default\";r=3;t=60"]);
            assert_eq!(all(&h, "ratelimit-policy"), ["\"default\";q=10;w=60"]);
        }
    }
}

/// The memory store answering through `Checked::Pending`, as Redis does.
struct PendingStore(MemoryStore<Key>);

impl Store<Key> for PendingStore {
    type Future = Ready<Result<Decisions, StoreError>>;
    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        self.0.register(policy)
    }
    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        Checked::Pending(ready(self.0.check_now(charges)))
    }
    fn refund(&self, charges: &[Refund<'_, Key>]) {
        self.0.refund(charges);
    }
}

async fn has_info(info: Option<RateLimitInfo>) -> Result<String, Infallible> {
    Ok(info.is_some().to_string())
}

#[tokio::test]
async fn info_only_when_asked_for_on_every_path() {
    for request_info in [false, true] {
        let want = request_info.to_string();
        // A store that decides asynchronously.
        let pending = RateLimitLayer::builder()
            .policy(fixed("p", 10, 60))
            .key(GlobalKey)
            .store(PendingStore(MemoryStore::new()))
            .request_info(request_info)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", axum::routing::get(has_info))
            .layer(pending);
        assert_eq!(get(&app, "/").await.2, want, "async store");
        // Delay mode: the second request waits for its reservation.
        let delay = RateLimitLayer::builder()
            .policy(Policy::new(
                "p",
                Quota::new(1, Duration::from_millis(50)).unwrap(),
            ))
            .key(GlobalKey)
            .mode(Mode::Delay {
                max_wait: Duration::from_secs(1),
            })
            .request_info(request_info)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", axum::routing::get(has_info))
            .layer(delay);
        assert_eq!(get(&app, "/").await.2, want, "delay, first");
        assert_eq!(get(&app, "/").await.2, want, "delay, reserved");
    }
}

#[tokio::test]
async fn the_prebuilt_429_is_the_general_429() {
    for reset in [ResetFormat::DeltaSeconds, ResetFormat::UnixEpoch] {
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ] {
            let app = |general: bool, c: &ManualClock| {
                let mut b = RateLimitLayer::builder()
                    .policy(
                        Policy::new("burst", Quota::new(3, Duration::from_secs(1)).unwrap())
                            .with_algorithm(algorithm),
                    )
                    .policy(
                        Policy::new("daily", Quota::new(7, Duration::from_secs(86_400)).unwrap())
                            .with_algorithm(algorithm),
                    )
                    .key(GlobalKey)
                    .cost_fn(|r: &RequestParts<'_>| match r.uri().path() {
                        "/big" => 2,
                        "/huge" => 100,
                        _ => 1,
                    })
                    .store(MemoryStore::with_clock(c.clone()))
                    .reset_format(reset);
                if general {
                    // The same default body, given explicitly: the general path.
                    b = b.rejection(ProblemJson);
                }
                Router::new()
                    .route("/", axum::routing::get(|| async { "hi" }))
                    .route("/big", axum::routing::get(|| async { "b" }))
                    .route("/huge", axum::routing::get(|| async { "h" }))
                    .layer(b.build().unwrap())
            };
            let (ca, cb) = (clock(), clock());
            let (fast, general) = (app(false, &ca), app(true, &cb));
            let mut limited = 0;
            for (i, path) in ["/", "/big", "/", "/huge", "/", "/", "/big", "/", "/", "/"]
                .iter()
                .cycle()
                .take(20)
                .enumerate()
            {
                let a = get(&fast, path).await;
                let b = get(&general, path).await;
                let lines = |h: &HeaderMap| {
                    h.iter()
                        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                        .collect::<Vec<_>>()
                };
                let at = format!("{algorithm:?} {reset:?} #{i} {path}");
                assert_eq!(a.0, b.0, "{at}");
                assert_eq!(lines(&a.1), lines(&b.1), "{at}");
                assert_eq!(a.2, b.2, "{at}");
                limited += usize::from(a.0 == StatusCode::TOO_MANY_REQUESTS);
                ca.advance(Duration::from_millis(150));
                cb.advance(Duration::from_millis(150));
            }
            assert!(limited > 0, "{algorithm:?} {reset:?}: no 429 was compared");
        }
    }
}
