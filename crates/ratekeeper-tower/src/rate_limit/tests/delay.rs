//! Delay mode: requests wait for their turn up to `max_wait`, in arrival order.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Key, Policy, Quota};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::{futures_poll, ok};
use crate::rate_limit::Mode;
use crate::{RateLimitLayer, key::GlobalKey};
use ratekeeper_core::clock::TokioClock;

fn delayed(max_wait: Duration) -> RateLimitLayer<GlobalKey, u64, MemoryStore<Key, TokioClock>> {
    RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay { max_wait })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn delay_waits_exactly_retry_after_then_passes() {
    let svc = ServiceBuilder::new()
        .layer(delayed(Duration::from_secs(5)))
        .service_fn(ok);
    let start = tokio::time::Instant::now();
    assert_eq!(
        svc.clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status(),
        200
    );
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
}

#[tokio::test(start_paused = true)]
async fn delay_rejects_at_once_when_the_wait_exceeds_max_wait() {
    let svc = ServiceBuilder::new()
        .layer(delayed(Duration::from_millis(999)))
        .service_fn(ok);
    let start = tokio::time::Instant::now();
    svc.clone().oneshot(Request::new(())).await.unwrap();
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// `Mode::Delay { max_wait: Duration::MAX }` waits, for every algorithm (GCRA reserves, the
/// fixed window checks and retries), rather than answering 429 at once as it would if the
/// deadline `now + max_wait` overflowed the clock and were read as "now".
#[tokio::test(start_paused = true)]
async fn delay_with_an_unbounded_max_wait_waits_for_capacity() {
    for algorithm in [
        ratekeeper_core::Algorithm::Gcra,
        ratekeeper_core::Algorithm::FixedWindow,
    ] {
        let layer = RateLimitLayer::builder()
            .policy(
                Policy::new("default", Quota::per_second(NonZeroU32::MIN))
                    .with_algorithm(algorithm),
            )
            .key(GlobalKey)
            .store(MemoryStore::with_clock(TokioClock::new()))
            .mode(Mode::Delay {
                max_wait: Duration::MAX,
            })
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let start = tokio::time::Instant::now();
        let first = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        let second = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(second.status(), StatusCode::OK, "{algorithm}");
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{algorithm}");
    }
}

#[test]
fn a_deadline_beyond_the_clock_saturates() {
    let now = tokio::time::Instant::now();
    let far = crate::rate_limit::limiter::saturating_deadline(now, Duration::MAX);
    assert!(far > now + Duration::from_secs(100 * 365 * 86_400));
    assert!(far.checked_add(Duration::from_secs(1)).is_none());
    let near = crate::rate_limit::limiter::saturating_deadline(now, Duration::from_secs(5));
    assert_eq!(near, now + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_while_waiting_is_refunded() {
    let svc = ServiceBuilder::new()
        .layer(delayed(Duration::from_secs(5)))
        .service_fn(ok);
    let start = tokio::time::Instant::now();
    svc.clone().oneshot(Request::new(())).await.unwrap();
    {
        // The second request reserves the turn at 1 s, then its client goes away.
        let mut waiting = pin!(svc.clone().oneshot(Request::new(())));
        assert!(matches!(futures_poll(waiting.as_mut()), Poll::Pending));
    }
    // The third request takes the refunded turn at 1 s, not the next one at 2 s.
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// 2 per second, burst 1 (T = 500 ms), max_wait 2 s; seven requests arrive at t = 0.
/// Requests 1..5 reserve the turns at 0, 0.5, 1, 1.5 and 2 s and reach the service in
/// arrival order; 6 and 7 would need 2.5 s > 2 s: 429 at t = 0, `Retry-After: 1`
/// (0.5 s until a turn is within 2 s, rounded up), with nothing charged.
#[tokio::test(start_paused = true)]
async fn delay_reserves_turns_in_arrival_order_and_rejects_the_rest_at_once() {
    use std::sync::Mutex;
    let served = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&served);
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "default",
            Quota::per_second(NonZeroU32::new(2).unwrap())
                .with_burst(1)
                .unwrap(),
        ))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay {
            max_wait: Duration::from_secs(2),
        })
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req: Request<u32>| {
            let start = tokio::time::Instant::now();
            log.lock().unwrap().push((*req.body(), start));
            std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
        });
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 1..=7u32 {
        // Each request reserves in `call`, in arrival order.
        let fut = svc.ready().await.unwrap().call(Request::new(i));
        tasks.push(tokio::spawn(async move {
            let res = fut.await.unwrap();
            let retry = res
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (i, res.status().as_u16(), start.elapsed(), retry)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let ms = Duration::from_millis;
    assert_eq!(
        results,
        vec![
            (1, 200, ms(0), None),
            (2, 200, ms(500), None),
            (3, 200, ms(1_000), None),
            (4, 200, ms(1_500), None),
            (5, 200, ms(2_000), None),
            (6, 429, ms(0), Some("1".to_owned())),
            (7, 429, ms(0), Some("1".to_owned())),
        ]
    );
    let order: Vec<(u32, Duration)> = served
        .lock()
        .unwrap()
        .iter()
        .map(|(i, at)| (*i, at.duration_since(start)))
        .collect();
    assert_eq!(
        order,
        vec![
            (1, ms(0)),
            (2, ms(500)),
            (3, ms(1_000)),
            (4, ms(1_500)),
            (5, ms(2_000))
        ]
    );
}

/// Two policies: a reservation the second cannot make within `max_wait` is rejected at
/// once and the first one's reservation is refunded.
#[tokio::test(start_paused = true)]
async fn delay_reservations_are_all_or_nothing_across_policies() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("fast", Quota::per_second(NonZeroU32::MIN)))
        .policy(Policy::new(
            "slow",
            Quota::new(1, Duration::from_secs(10))
                .unwrap()
                .with_burst(2)
                .unwrap(),
        ))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay {
            max_wait: Duration::from_secs(2),
        })
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let start = tokio::time::Instant::now();
    // t = 0: passes; then the turn at 1 s ("fast"), still in "slow"'s burst.
    assert_eq!(
        svc.clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        svc.clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    // "fast" could give the turn at 2 s, "slow" only at 10 s: 429 at once (retry after
    // 10 - 1 - 2 = 7 s) and "fast" refunded.
    let res = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "7");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
}

/// A cost above the burst can never fit (<https://github.com/boinkor-net/governor/issues/11>): in
/// Delay mode it is a 429 at once, without `Retry-After` and without sleeping.
#[tokio::test(start_paused = true)]
async fn a_cost_above_the_burst_is_rejected_at_once_in_delay_mode() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
        .key(GlobalKey)
        .cost_fn(|_req: &crate::RequestParts<'_>| 2)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay {
            max_wait: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let start = tokio::time::Instant::now();
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(start.elapsed(), Duration::ZERO);
}
