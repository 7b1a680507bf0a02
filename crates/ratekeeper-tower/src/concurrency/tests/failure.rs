//! Failures feed the controller: an upstream that times out on every request lowers the
//! limit to its minimum, on tokio's paused clock (whole seconds of load run in no real
//! time, and every figure is exact).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratekeeper_core::Key;
use ratekeeper_core::clock::TokioClock;
use tokio::time::{Instant, sleep, timeout};
use tower::{ServiceExt, service_fn};
use tower_layer::Layer;

use crate::adaptive::controller::{ControllerSettings, GradientController};
use crate::concurrency::ConcurrencyLimitLayer;

/// Healthy answers take this long.
const SERVICE_TIME: Duration = Duration::from_millis(10);
/// A failing upstream gives up after this long (its timeout).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(1);
/// Clients sending requests one after the other, each at once again after an answer.
const CLIENTS: usize = 40;
/// How long a refused client waits before it tries again.
const BACKOFF: Duration = Duration::from_millis(5);
/// The settle time: the limit reaches `min_limit` within this long after the upstream
/// starts timing out (about a dozen update intervals at 0.75× each, one per second of
/// timeouts; see the test's report line for the measured figure).
const SETTLE: Duration = Duration::from_secs(15);

/// How a failing upstream ends each request.
#[derive(Clone, Copy, Debug)]
enum Failing {
    /// The upstream returns an error after its timeout (a `tower::timeout` inside).
    Error,
    /// The caller drops the response future at the timeout (an outer timeout).
    Dropped,
}

/// Runs the load: healthy for 3 s, then every request fails after
/// [`UPSTREAM_TIMEOUT`] (as `failing` says); returns how long after the switch the limit
/// first read `min_limit`, and the limit at the switch.
async fn settle_time(failing: Failing) -> (Option<Duration>, u32) {
    let layer = ConcurrencyLimitLayer::adaptive()
        .controller(ControllerSettings {
            min_rtt_requests: 5,
            ..ControllerSettings::default()
        })
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let min_limit = ControllerSettings::default().min_limit;
    let broken = Arc::new(AtomicBool::new(false));
    let upstream = {
        let broken = Arc::clone(&broken);
        service_fn(move |_req: Request<()>| {
            let broken = broken.load(Ordering::SeqCst);
            async move {
                if broken {
                    sleep(UPSTREAM_TIMEOUT).await;
                    if matches!(failing, Failing::Error) {
                        return Err("upstream timed out");
                    }
                    // Dropped: never answers (the caller's timeout drops the future).
                    std::future::pending::<()>().await;
                }
                sleep(SERVICE_TIME).await;
                Ok::<_, &str>(Response::new(String::from("done")))
            }
        })
    };
    let svc = layer.layer(upstream);
    let start = Instant::now();
    let switch = start + Duration::from_secs(3);
    let end = switch + SETTLE + Duration::from_secs(5);
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let svc = svc.clone();
        clients.spawn(async move {
            // Bounded in time (the paused clock) and in count.
            for _ in 0..100_000 {
                if Instant::now() >= end {
                    break;
                }
                let call = svc.clone().oneshot(Request::get("/").body(()).unwrap());
                match timeout(UPSTREAM_TIMEOUT + Duration::from_millis(1), call).await {
                    Ok(Ok(res)) if res.status() == StatusCode::OK => {
                        // Reading the body to its end releases the place in flight.
                        let _ = res.into_body().collect().await;
                    }
                    Ok(Ok(_refused)) => sleep(BACKOFF).await,
                    // An error, or the outer timeout dropped the request.
                    Ok(Err(_)) | Err(_) => {}
                }
            }
        });
    }
    let snapshot = || layer.snapshot(&Key::Global).unwrap();
    sleep_until(switch).await;
    let at_switch = snapshot().limit;
    broken.store(true, Ordering::SeqCst);
    let mut settled = None;
    while Instant::now() < end {
        sleep(Duration::from_millis(10)).await;
        let s = snapshot();
        if s.limit == min_limit && settled.is_none() {
            settled = Some(Instant::now() - switch);
        }
        if settled.is_some() {
            // Once at the floor, it stays there while everything fails.
            assert_eq!(
                s.limit, min_limit,
                "{failing:?}: the limit rose again: {s:?}"
            );
        }
    }
    clients.shutdown().await;
    (settled, at_switch)
}

async fn sleep_until(t: Instant) {
    tokio::time::sleep_until(t).await;
}

async fn check(failing: Failing) {
    let (settled, at_switch) = settle_time(failing).await;
    let min_limit = ControllerSettings::default().min_limit;
    assert!(
        at_switch > 2 * min_limit,
        "{failing:?}: the healthy phase raised the limit first ({at_switch})"
    );
    let settled = settled.unwrap_or_else(|| {
        panic!("{failing:?}: the limit never reached {min_limit} (from {at_switch})")
    });
    // The measured figure (BENCHMARKS.md quotes it); `--nocapture` shows it.
    println!(
        "{failing:?}: limit {at_switch} -> {min_limit} in {settled:?} after the upstream began \
         timing out every request after {UPSTREAM_TIMEOUT:?}"
    );
    assert!(settled <= SETTLE, "{failing:?}: settled in {settled:?}");
}

/// Every request times out inside the service (the inner service returns an error after
/// 1 s): the failures' elapsed times lower the limit to its minimum.
#[tokio::test(start_paused = true)]
async fn an_upstream_that_times_out_lowers_the_limit_to_its_minimum() {
    check(Failing::Error).await;
}

/// Every request is dropped by an outer timeout after 1 s (the response future is dropped
/// before the inner service answers): the drops lower the limit to its minimum.
#[tokio::test(start_paused = true)]
async fn requests_dropped_at_an_outer_timeout_lower_the_limit_to_its_minimum() {
    check(Failing::Dropped).await;
}

/// A failure never ends a `minRTT` measurement: one during which every request fails keeps
/// the limit at its minimum.
#[test]
fn failures_never_count_toward_min_rtt() {
    let settings = ControllerSettings {
        min_rtt_requests: 5,
        ..ControllerSettings::default()
    };
    let mut c = GradientController::new(settings, 1, 0);
    let s = 1_000_000_000;
    for i in 0..100 {
        assert_eq!(c.failure(s, 0, 1, s + i * s), None);
    }
    assert!(c.is_measuring());
    assert_eq!(c.min_rtt_ns(), None);
    assert_eq!(c.limit(), settings.min_limit);
    // A success ends it, at its own latency.
    for i in 0..5 {
        c.sample(10_000_000, 200 * s, 1, 201 * s + i);
    }
    assert_eq!(c.min_rtt_ns(), Some(10_000_000));
}
