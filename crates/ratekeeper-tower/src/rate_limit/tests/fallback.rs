//! The degraded-response fallback behind the rate limit: limited requests and requests a
//! store could not decide under `Degrade` are answered by the fallback, marked and counted.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratekeeper_core::Quota;
use tower::service_fn;
use tower_layer::Layer;
use tower_service::Service;

use ratekeeper_core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_core::{Key, Policy};

use crate::headers::RATELIMIT_DEGRADED;
use crate::{RateLimitLayer, StoreDegraded, key::GlobalKey};

/// `ratekeeper_degraded_total{policy="default"}` from a debugging recorder.
fn degraded(snapshotter: &Snapshotter) -> Option<DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == "ratekeeper_degraded_total"
                && key
                    .labels()
                    .any(|l| l.key() == "policy" && l.value() == "default")
        })
        .map(|(.., value)| value)
}

fn answer(
    text: &'static str,
) -> impl Fn(Request<()>) -> Ready<Result<Response<String>, Infallible>> + Clone {
    move |_req| ready(Ok(Response::new(text.to_owned())))
}

#[test]
fn degraded_responses_are_marked_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_minute(NonZeroU32::MIN))
        .key(GlobalKey)
        .build()
        .unwrap()
        .with_fallback(service_fn(answer("cached")));
    let mut svc = layer.layer(service_fn(answer("fresh")));
    metrics::with_local_recorder(&recorder, || {
        for (want, degraded) in [("fresh", false), ("cached", true), ("cached", true)] {
            let future = pin!(svc.call(Request::new(())));
            let mut cx = Context::from_waker(Waker::noop());
            let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
                panic!("ready services answer at once");
            };
            assert_eq!(res.status(), 200);
            assert_eq!(
                res.headers().get(&RATELIMIT_DEGRADED).is_some(),
                degraded,
                "{want}"
            );
            assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
            let body = res.into_body();
            let mut body = pin!(body);
            let Poll::Ready(Some(Ok(frame))) = http_body::Body::poll_frame(body.as_mut(), &mut cx)
            else {
                panic!("a full body");
            };
            assert_eq!(frame.into_data().unwrap(), want);
        }
    });
    assert_eq!(degraded(&snapshotter), Some(DebugValue::Counter(2)));
}

/// A store that cannot decide: every check fails with `policy`.
struct Failing(FailurePolicy);

impl Store<Key> for Failing {
    type Future = Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, _policy: &Policy) -> Result<PolicyId, StoreError> {
        Ok(PolicyId::from_index(0))
    }

    fn check(&self, _charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        Checked::Ready(Err(StoreError::Failed {
            policy: self.0,
            source: Box::new(StoreError::Timeout),
        }))
    }

    /// Nothing was charged, so nothing is given back.
    fn refund(&self, _refunds: &[Refund<'_, Key>]) {}
}

/// A store that could not decide sends the request to the fallback only under
/// [`FailurePolicy::Degrade`] (marked `store-unavailable`); under `Allow` it goes to the inner
/// service, unmarked. Both carry the [`StoreDegraded`] extension for the handler.
#[test]
fn store_degraded_requests_go_to_the_fallback_only_under_degrade() {
    for (action, want, marker) in [
        (
            FailurePolicy::Degrade,
            "cached",
            Some("\"store-unavailable\""),
        ),
        (FailurePolicy::Allow, "fresh", None),
    ] {
        let seen = |text: &'static str| {
            move |req: Request<()>| {
                let degraded = req.extensions().get::<StoreDegraded>().map(|d| d.action);
                assert_eq!(degraded, Some(action), "{text}");
                ready(Ok::<_, Infallible>(Response::new(text.to_owned())))
            }
        };
        let layer = RateLimitLayer::builder()
            .quota(Quota::per_minute(NonZeroU32::MIN))
            .key(GlobalKey)
            .store(Failing(action))
            .build()
            .unwrap()
            .with_fallback(service_fn(seen("cached")));
        let mut svc = layer.layer(service_fn(seen("fresh")));
        let future = pin!(svc.call(Request::new(())));
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
            panic!("ready services answer at once");
        };
        assert!(res.headers().get("x-ratelimit-limit").is_none());
        assert_eq!(
            res.headers()
                .get(&RATELIMIT_DEGRADED)
                .map(|v| v.to_str().unwrap()),
            marker
        );
        let mut body = pin!(res.into_body());
        let Poll::Ready(Some(Ok(frame))) = http_body::Body::poll_frame(body.as_mut(), &mut cx)
        else {
            panic!("a full body");
        };
        assert_eq!(frame.into_data().unwrap(), want);
    }
}
