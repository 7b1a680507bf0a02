//! The layer on a manual clock: admission, answers, partitions, keys, metrics.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratekeeper_core::Key;
use ratekeeper_core::clock::ManualClock;
use tower::service_fn;
use tower_layer::Layer;
use tower_service::Service;

use crate::RequestParts;
use crate::adaptive::controller::ControllerSettings;
use crate::adaptive::*;
use crate::concurrency::{ConcurrencyBody, ConcurrencyLimitLayer};
use crate::key::KeyError;
use crate::metrics::{ADAPTIVE_IN_FLIGHT, ADAPTIVE_LIMIT, ADAPTIVE_REQUESTS_TOTAL};
use crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE;

type Inner = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<String>, Infallible>>>;

fn ok(_req: Request<()>) -> Ready<Result<Response<String>, Infallible>> {
    ready(Ok(Response::new("done".to_owned())))
}

fn inner() -> Inner {
    service_fn(ok as fn(_) -> _)
}

/// Calls and polls once (the inner service answers at once).
fn call<S>(svc: &mut S, req: Request<()>) -> Response<ConcurrencyBody<String>>
where
    S: Service<Request<()>, Response = Response<ConcurrencyBody<String>>, Error = Infallible>,
{
    let future = pin!(svc.call(req));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(res)) = future.poll(&mut cx) else {
        panic!("ready services answer at once");
    };
    res
}

/// Reads the body to its end (which releases the request's place in flight).
fn read(res: Response<ConcurrencyBody<String>>) -> Bytes {
    let mut body = pin!(res.into_body());
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) {
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
        }
    }
    Bytes::from(out)
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

fn global<K, C>(layer: &ConcurrencyLimitLayer<K, Adaptive<C>>) -> Snapshot {
    layer.snapshot(&Key::Global).unwrap()
}

#[test]
fn refusals_are_503_problem_json_with_retry_after() {
    let layer = ConcurrencyLimitLayer::adaptive()
        .min_limit(1)
        .retry_after(Duration::from_millis(1500))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    let held = call(&mut svc, get("/"));
    assert_eq!(held.status(), StatusCode::OK);
    let refused = call(&mut svc, get("/"));
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let h = refused.headers();
    assert_eq!(h["retry-after"], "2");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_slice(&read(refused)).unwrap();
    assert_eq!(body["type"], TEMPORARY_REDUCED_CAPACITY_TYPE);
    assert_eq!(body["status"], 503);
    assert_eq!(body["title"], "Service Unavailable");
    assert!(body["detail"].as_str().unwrap().contains("retry after 2 s"));
    // The place is held until the body ends.
    assert_eq!(read(held), "done");
    assert_eq!(call(&mut svc, get("/")).status(), StatusCode::OK);
}

#[test]
fn refusals_can_be_429_naming_the_layer() {
    let layer = ConcurrencyLimitLayer::adaptive()
        .min_limit(1)
        .too_many_requests()
        .name("api")
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    let _held = call(&mut svc, get("/"));
    let refused = call(&mut svc, get("/"));
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = serde_json::from_slice(&read(refused)).unwrap();
    assert_eq!(body["type"], crate::report::QUOTA_EXCEEDED_TYPE);
    assert_eq!(body["violated-policies"], serde_json::json!(["api"]));
}

#[test]
fn grpc_calls_get_unavailable_or_resource_exhausted() {
    let grpc = || {
        Request::post("/pkg.Svc/Call")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    for (too_many, code, message) in [
        (false, "14", "server overloaded; retry after 1 s"),
        (
            true,
            "8",
            "rate limit \"adaptive\" exceeded; retry after 1 s",
        ),
    ] {
        let mut builder = ConcurrencyLimitLayer::adaptive()
            .min_limit(1)
            .grpc(true)
            .clock(ManualClock::new());
        if too_many {
            builder = builder.too_many_requests();
        }
        let mut svc = builder.build().unwrap().layer(inner());
        let _held = call(&mut svc, grpc());
        let refused = call(&mut svc, grpc());
        assert_eq!(refused.status(), StatusCode::OK);
        let h = refused.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], code);
        assert_eq!(h["grpc-message"], message);
        assert_eq!(h["retry-after"], "1");
        assert!(read(refused).is_empty());
    }
    // A layer that does not serve gRPC answers every refusal with an HTTP status.
    let mut svc = ConcurrencyLimitLayer::adaptive()
        .min_limit(1)
        .clock(ManualClock::new())
        .build()
        .unwrap()
        .layer(inner());
    let _held = call(&mut svc, grpc());
    assert_eq!(call(&mut svc, grpc()).status(), 503);
}

#[test]
fn latency_moves_the_limit_through_the_service() {
    let clock = ManualClock::new();
    let layer = ConcurrencyLimitLayer::adaptive()
        .controller(ControllerSettings {
            min_rtt_requests: 5,
            ..ControllerSettings::default()
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    // Each request: admitted now, answered `latency` later (the inner future runs when
    // polled; the clock moves in between).
    let mut request = |latency: Duration| {
        let future = svc.call(get("/"));
        clock.advance(latency);
        let mut future = pin!(future);
        let Poll::Ready(Ok(res)) = future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        else {
            panic!("ready");
        };
        read(res);
    };
    for _ in 0..5 {
        request(Duration::from_millis(10));
    }
    let s = global(&layer);
    assert!(!s.measuring);
    assert_eq!(s.min_latency, Some(Duration::from_millis(10)));
    assert_eq!(s.limit, 20);
    // Three times slower: the limit falls interval after interval.
    let mut last = s.limit;
    for _ in 0..4 {
        for _ in 0..4 {
            request(Duration::from_millis(30));
        }
        let now = global(&layer).limit;
        assert!(now < last, "{now} !< {last}");
        last = now;
    }
    assert_eq!(global(&layer).latency, Some(Duration::from_millis(30)));
}

#[test]
fn sheddable_requests_are_shed_first_and_critical_keeps_its_share() {
    let layer = ConcurrencyLimitLayer::adaptive()
        .controller(ControllerSettings {
            min_limit: 10,
            initial_limit: 10,
            ..ControllerSettings::default()
        })
        .partition("critical", 0.9)
        .partition("sheddable", 0.1)
        .classify(|req: &RequestParts<'_>| {
            if req.uri().path() == "/critical" {
                "critical"
            } else {
                "other"
            }
        })
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    // Sheddable traffic (and unknown partitions) borrows the whole limit of 10...
    let mut held = Vec::new();
    for _ in 0..10 {
        let res = call(&mut svc, get("/batch"));
        assert_eq!(res.status(), StatusCode::OK);
        held.push(res);
    }
    assert_eq!(call(&mut svc, get("/batch")).status(), 503);
    // ...but critical requests still get their 9.
    for _ in 0..9 {
        let res = call(&mut svc, get("/critical"));
        assert_eq!(res.status(), StatusCode::OK);
        held.push(res);
    }
    assert_eq!(call(&mut svc, get("/critical")).status(), 503);
    assert_eq!(global(&layer).in_flight_by_partition, [9, 10]);
    // A sheddable request that ends frees nothing for sheddable traffic (over its share).
    read(held.remove(0));
    assert_eq!(call(&mut svc, get("/batch")).status(), 503);
    assert_eq!(
        layer.partitions().collect::<Vec<_>>(),
        ["critical", "sheddable"]
    );
}

#[test]
fn keyed_limits_are_separate_and_bounded() {
    let by_tenant = |req: &RequestParts<'_>| -> Result<Key, KeyError> {
        let tenant = req.uri().path().trim_start_matches('/');
        Ok(Key::Str(tenant.into()))
    };
    let layer = ConcurrencyLimitLayer::adaptive()
        .min_limit(1)
        .key(by_tenant)
        .max_keys(2)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    let _a = call(&mut svc, get("/a"));
    let _b = call(&mut svc, get("/b"));
    assert_eq!(call(&mut svc, get("/a")).status(), 503);
    assert_eq!(call(&mut svc, get("/b")).status(), 503);
    // Keys beyond `max_keys` share one overflow limit: limited, not unlimited.
    let c = call(&mut svc, get("/c"));
    assert_eq!(c.status(), 200);
    assert_eq!(call(&mut svc, get("/d")).status(), 503);
    assert!(layer.snapshot(&Key::Str("c".into())).is_none());
    assert_eq!(layer.snapshot(&Key::Str("a".into())).unwrap().in_flight, 1);
}

type Metrics = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of metric `name` with labels `labels` in one snapshot (taking a snapshot
/// resets the debugging recorder's values, so each check reads one snapshot).
fn metric<'a>(
    snapshot: &'a Metrics,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    snapshot
        .iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| value)
}

#[test]
fn metrics_report_limit_in_flight_and_shed_requests() {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    let gauge = |v: f64| DebugValue::Gauge(v.into());
    metrics::with_local_recorder(&recorder, || {
        let layer = ConcurrencyLimitLayer::adaptive()
            .min_limit(1)
            .partition("critical", 1.0)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let mut svc = layer.layer(inner());
        let held = call(&mut svc, get("/"));
        call(&mut svc, get("/"));
        call(&mut svc, get("/"));
        let snapshot = snapshotter.snapshot().into_vec();
        let global = [("name", "adaptive"), ("key", "global")];
        assert_eq!(
            metric(&snapshot, ADAPTIVE_LIMIT, &global),
            Some(&gauge(1.0))
        );
        assert_eq!(
            metric(&snapshot, ADAPTIVE_IN_FLIGHT, &global),
            Some(&gauge(1.0))
        );
        let requests = |outcome| {
            metric(
                &snapshot,
                ADAPTIVE_REQUESTS_TOTAL,
                &[("partition", "critical"), ("outcome", outcome)],
            )
        };
        assert_eq!(requests("admitted"), Some(&DebugValue::Counter(1)));
        assert_eq!(requests("shed"), Some(&DebugValue::Counter(2)));
        read(held);
        let snapshot = snapshotter.snapshot().into_vec();
        assert_eq!(
            metric(&snapshot, ADAPTIVE_IN_FLIGHT, &global),
            Some(&gauge(0.0))
        );
    });
}

#[test]
fn bad_settings_are_build_errors() {
    let field = |r: Result<ConcurrencyLimitLayer<_, Adaptive<_>>, crate::BuildError>| match r {
        Err(crate::BuildError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let b = ConcurrencyLimitLayer::adaptive;
    assert_eq!(
        field(b().partition("a", 0.8).partition("b", 0.3).build()),
        "adaptive.partition"
    );
    assert_eq!(
        field(b().partition("a", 0.5).partition("a", 0.5).build()),
        "adaptive.partition"
    );
    assert_eq!(field(b().partition("a", 0.0).build()), "adaptive.partition");
    assert_eq!(
        field(b().min_limit(5).max_limit(4).build()),
        "adaptive.max_limit"
    );
    assert_eq!(field(b().max_keys(0).build()), "adaptive.max_keys");
    assert!(b().partition("a", 0.9).partition("b", 0.1).build().is_ok());
}

#[test]
fn an_inner_error_releases_its_place_and_never_ends_a_min_rtt_measurement() {
    let clock = ManualClock::new();
    let layer = ConcurrencyLimitLayer::adaptive()
        .min_limit(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| {
        ready(Err::<Response<String>, _>("boom"))
    }));
    let future = pin!(svc.call(get("/")));
    clock.advance(Duration::from_millis(5));
    let Poll::Ready(Err("boom")) = future.poll(&mut Context::from_waker(Waker::noop())) else {
        panic!("the inner error");
    };
    let s = global(&layer);
    assert_eq!(s.in_flight, 0);
    assert!(s.measuring, "a failure never counts toward minRTT");
}
