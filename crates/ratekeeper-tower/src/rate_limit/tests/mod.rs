//! Modes (Delay, Shadow) and nested layers, through the whole request path.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::Poll;

use http::{Request, Response, StatusCode};
use ratekeeper_core::store::MemoryStore;
use ratekeeper_core::{Policy, Quota};
use tower::{Service, ServiceBuilder, ServiceExt};

use std::sync::Arc;
use std::time::Duration;

use ratekeeper_core::Key;

use super::{Mode, TokioClock};
use crate::{GlobalKey, RateLimitLayer};

fn delayed(max_wait: Duration) -> RateLimitLayer<GlobalKey, u64, MemoryStore<Key, TokioClock>> {
    RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay { max_wait })
        .build()
        .unwrap()
}

fn ok(_req: Request<()>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::new())))
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

/// Issue 21: `Mode::Delay { max_wait: Duration::MAX }` answered 429 at once (the deadline
/// `now + max_wait` overflowed the clock and was read as "now"). It waits, for every
/// algorithm: GCRA reserves, the fixed window checks and retries.
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
    let far = super::limiter::saturating_deadline(now, Duration::MAX);
    assert!(far > now + Duration::from_secs(100 * 365 * 86_400));
    assert!(far.checked_add(Duration::from_secs(1)).is_none());
    let near = super::limiter::saturating_deadline(now, Duration::from_secs(5));
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

/// Case B10: in Delay mode a cost above the burst is a 429 at once, without `Retry-After`
/// and without sleeping.
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

/// Polls a future once with a no-op waker.
fn futures_poll<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.poll(&mut cx)
}

/// One call of `svc` with `content-type` set (or not): status, headers, body.
async fn call_with<S>(svc: &S, content_type: Option<&str>) -> (StatusCode, http::HeaderMap, String)
where
    S: Service<
            Request<()>,
            Response = Response<crate::body::ResponseBody<String>>,
            Error = Infallible,
        > + Clone,
{
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    if let Some(ct) = content_type {
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
    }
    let res = svc.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = http_body_util::BodyExt::collect(body)
        .await
        .unwrap()
        .to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn grpc_limited(style: crate::report::HeaderStyle) -> RateLimitLayer<GlobalKey, u64> {
    RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .headers(style)
        .grpc(true)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_limited_grpc_call_gets_resource_exhausted_trailers_only() {
    use crate::report::HeaderStyle;
    for style in [HeaderStyle::XRateLimit, HeaderStyle::Ietf] {
        let svc = ServiceBuilder::new()
            .layer(grpc_limited(style))
            .service_fn(ok_string);
        let (status, headers, _) = call_with(&svc, Some("application/grpc")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            headers.get("grpc-status").is_none(),
            "allowed calls are untouched"
        );

        let (status, headers, body) = call_with(&svc, Some("application/grpc+proto")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "");
        // The answer speaks the call's own content type.
        assert_eq!(headers["content-type"], "application/grpc+proto");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limit \"burst\" exceeded; retry after 60 s"
        );
        assert_eq!(headers["retry-after"], "60");
        assert!(headers.contains_key("grpc-status-details-bin"));
        assert!(headers.get("content-length").is_none());
        match style {
            HeaderStyle::Ietf => assert_eq!(headers["ratelimit"], "\"burst\";r=0;t=60"),
            _ => assert_eq!(headers["x-ratelimit-remaining"], "0"),
        }

        // The same limit answers plain HTTP with the usual 429.
        let (status, headers, body) = call_with(&svc, None).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(headers.get("grpc-status").is_none());
        assert!(body.contains("violated-policies"));
    }
}

/// A layer that does not serve gRPC (the default), or a call that is not gRPC by its
/// protocol's grammar (`application/grpc` over HTTP/1.1), keeps the HTTP status of a
/// refusal: a client cannot turn its own 429 into a 200.
#[tokio::test]
async fn a_client_cannot_turn_a_refusal_into_a_200_with_its_content_type() {
    let plain = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(plain).service_fn(ok_string);
    assert_eq!(call_with(&svc, None).await.0, StatusCode::OK);
    for ct in [
        "application/grpc",
        "application/grpc-web",
        "application/grpc+proto",
    ] {
        let (status, headers, _) = call_with(&svc, Some(ct)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{ct}");
        assert!(headers.get("grpc-status").is_none());
    }
    // A gRPC layer: `application/grpc` over HTTP/1.1 is no gRPC call.
    let svc = ServiceBuilder::new()
        .layer(grpc_limited(crate::report::HeaderStyle::XRateLimit))
        .service_fn(ok_string);
    assert_eq!(call_with(&svc, None).await.0, StatusCode::OK);
    let mut req = Request::new(());
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/grpc".parse().unwrap(),
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("grpc-status").is_none());
}

#[tokio::test]
async fn a_grpc_call_whose_cost_can_never_fit_gets_no_retry_information() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .cost_fn(|_req: &crate::RequestParts<'_>| 5)
        .grpc(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok_string);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(
        headers["grpc-message"],
        "rate limit \"burst\" exceeded: the request costs more than the policy can ever allow; do not retry"
    );
    assert!(headers.get("retry-after").is_none());
    assert!(headers.get("grpc-status-details-bin").is_none());
}

#[tokio::test]
async fn a_grpc_call_without_a_key_gets_invalid_argument() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .grpc(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok_string);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "3");
    assert!(!headers["grpc-message"].is_empty());
}

/// Behind a fallback only denials go to the fallback: a gRPC call the layer cannot key still
/// gets the gRPC form of its answer, decided once with the rest of its ticket.
#[tokio::test]
async fn behind_a_fallback_a_grpc_call_without_a_key_still_gets_invalid_argument() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .grpc(true)
        .build()
        .unwrap()
        .with_fallback(tower::service_fn(ok_string));
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok_string);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "3");
    assert!(headers.get(&crate::report::RATELIMIT_DEGRADED).is_none());
}

#[tokio::test]
async fn a_grpc_call_over_the_concurrency_limit_gets_resource_exhausted() {
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    let wait = Arc::new(tokio::sync::Mutex::new(Some(wait)));
    let svc = ServiceBuilder::new()
        .layer(
            crate::concurrency::ConcurrencyLimitLayer::new(NonZeroU32::MIN)
                .key(GlobalKey)
                .grpc(true),
        )
        .service_fn(move |_req: Request<()>| {
            let wait = wait.clone();
            async move {
                if let Some(wait) = wait.lock().await.take() {
                    let _ = wait.await;
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
    let held = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/grpc".parse().unwrap(),
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(
        res.headers()["grpc-message"],
        "rate limit \"concurrency\" exceeded; retry after 1 s"
    );
    assert_eq!(res.headers()["retry-after"], "1");
    release.send(()).unwrap();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

fn ok_string(_req: Request<()>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::new())))
}

/// One request per minute, globally, with `settle` on policy `default`, on a manual clock.
fn settled(settle: crate::policy::Settle) -> RateLimitLayer<GlobalKey> {
    RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .settle("default", settle)
        .build()
        .unwrap()
}

/// Whether a second request right after the first gets through (the first's charge was given
/// back).
async fn second_passes<S>(svc: &S) -> bool
where
    S: Service<Request<()>, Response = Response<crate::body::ResponseBody<String>>> + Clone,
    S::Error: std::fmt::Debug,
{
    svc.clone()
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .status()
        == StatusCode::OK
}

#[tokio::test]
async fn a_request_dropped_before_its_answer_is_settled_as_no_response() {
    use crate::policy::Settle;
    // The inner service answers `/hang` never; the client goes away after one poll.
    let hang_or_ok = |req: Request<()>| async move {
        if req.uri().path() == "/hang" {
            std::future::pending::<()>().await;
        }
        Ok::<_, Infallible>(Response::new(String::new()))
    };
    // Counting only 401s: a request that got no answer was no 401, so its unit comes back.
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::COUNT_UNAUTHORIZED))
        .service_fn(hang_or_ok);
    let mut first = Box::pin(svc.clone().oneshot(Request::get("/hang").body(()).unwrap()));
    assert!(futures_poll_once(first.as_mut()).await.is_pending());
    drop(first);
    assert!(
        second_passes(&svc).await,
        "a cancelled request spent a failed-login unit"
    );

    // Refunding server errors: a client that went away is no server error; the unit stays.
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::REFUND_SERVER_ERRORS))
        .service_fn(hang_or_ok);
    let mut first = Box::pin(svc.clone().oneshot(Request::get("/hang").body(()).unwrap()));
    assert!(futures_poll_once(first.as_mut()).await.is_pending());
    drop(first);
    assert!(!second_passes(&svc).await);
}

#[tokio::test]
async fn a_request_whose_service_failed_is_settled_as_a_server_error() {
    use crate::policy::Settle;
    let fail_once = {
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        move |_req: Request<()>| {
            let first = !failed.swap(true, std::sync::atomic::Ordering::SeqCst);
            async move {
                if first {
                    Err("inner service failed")
                } else {
                    Ok(Response::new(String::new()))
                }
            }
        }
    };
    let svc = ServiceBuilder::new()
        .layer(settled(Settle::REFUND_SERVER_ERRORS))
        .service_fn(fail_once);
    assert!(svc.clone().oneshot(Request::new(())).await.is_err());
    assert!(
        second_passes(&svc).await,
        "a failed request was not refunded as a 5xx"
    );
}

/// Polls a future once, without a runtime waker dependency.
async fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut fut = Some(fut);
    std::future::poll_fn(move |cx| Poll::Ready(fut.take().map(|f| f.poll(cx))))
        .await
        .unwrap_or(Poll::Pending)
}
