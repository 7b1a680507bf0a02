//! The whole request path of [`RateLimit`](crate::RateLimit): Delay mode, nested layers,
//! gRPC answers and settlement, one file a theme.

mod delay;
mod fallback;
mod grpc;
mod settle;

use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use ratekeeper_core::{Policy, Quota};
use tower::{ServiceBuilder, ServiceExt};

use crate::{RateLimitLayer, key::GlobalKey};

fn ok(_req: Request<()>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::new())))
}

/// Polls a future once with a no-op waker.
fn futures_poll<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll(&mut cx)
}

#[tokio::test]
async fn nested_layers_report_the_most_restrictive_policy_once() {
    let inner = RateLimitLayer::builder()
        .policy(Policy::new(
            "route",
            Quota::per_minute(NonZeroU32::new(2).unwrap()),
        ))
        .key(GlobalKey)
        .headers(crate::report::HeaderStyle::Both)
        .build()
        .unwrap();
    let outer = RateLimitLayer::builder()
        .policy(Policy::new(
            "global",
            Quota::per_minute(NonZeroU32::new(100).unwrap()),
        ))
        .key(GlobalKey)
        .headers(crate::report::HeaderStyle::Both)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service_fn(ok);
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let h = res.headers();
    assert_eq!(h.get_all("x-ratelimit-limit").iter().count(), 1);
    assert_eq!(h["x-ratelimit-limit"], "2");
    assert_eq!(h["x-ratelimit-remaining"], "1");
    assert_eq!(h["x-ratelimit-reset"], "30");
    assert_eq!(h.get_all("ratelimit").iter().count(), 1);
    assert_eq!(h["ratelimit"], "\"route\";r=1;t=30, \"global\";r=99;t=1");
    assert_eq!(
        h["ratelimit-policy"],
        "\"route\";q=2;w=60, \"global\";q=100;w=60"
    );
}

/// `RateLimitLayer::new` is the builder with one default policy: quotas at the edges of what
/// a `Quota` holds (one unit, `u32::MAX` units, the largest burst, one unit per nanosecond
/// and per `u64::MAX` nanoseconds) build, and give the layer one policy.
#[test]
fn new_builds_any_quota() {
    let one = NonZeroU32::MIN;
    let max = NonZeroU32::MAX;
    let quotas = [
        Quota::per_second(one),
        Quota::per_day(max),
        Quota::per_second(one).with_burst(u32::MAX).unwrap(),
        Quota::from_nanos(one, 1).unwrap(),
        Quota::from_nanos(max, u64::MAX).unwrap(),
    ];
    for quota in quotas {
        let built = RateLimitLayer::builder().quota(quota).build();
        assert!(built.is_ok(), "{quota:?}: {built:?}");
        assert_eq!(RateLimitLayer::new(quota).policy_ids().len(), 1);
    }
}

/// A boxed layer limits as the layer it was made from, shares its budget (a request through
/// either spends it), reads the request head for its key, and reaches the same store
/// through its admin handle.
#[tokio::test]
async fn a_boxed_layer_shares_the_budget_of_its_layer() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_minute(NonZeroU32::new(2).unwrap()))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .build()
        .unwrap();
    let boxed = layer.clone().boxed();
    let plain = ServiceBuilder::new().layer(layer).service_fn(ok);
    let erased = ServiceBuilder::new().layer(boxed.clone()).service_fn(ok);
    let req = |key: &str| {
        Request::builder()
            .header("x-api-key", key)
            .body(())
            .unwrap()
    };
    let first = erased.clone().oneshot(req("a")).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
    let second = plain.clone().oneshot(req("a")).await.unwrap();
    assert_eq!(second.headers()["x-ratelimit-remaining"], "0");
    let third = erased.clone().oneshot(req("a")).await.unwrap();
    assert_eq!(third.status(), 429);
    // Another key has its own budget; a request without one is a 400, as unboxed.
    let other = erased.clone().oneshot(req("b")).await.unwrap();
    assert_eq!(other.headers()["x-ratelimit-remaining"], "1");
    let missing = erased.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(boxed.admin().policies().collect::<Vec<_>>(), ["default"]);
}
