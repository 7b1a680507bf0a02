//! The layer around a `service_fn` server on tokio's paused clock: when requests reach the
//! server, and what the caller gets.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};

use super::{Error, OverDeadline, PoliteLayer};

type Log = Arc<Mutex<Vec<(String, Duration)>>>;

/// The status and headers the server answers its n-th request (0-based) with.
type Answer = fn(usize) -> (u16, Vec<(&'static str, &'static str)>);

/// A server that logs `(uri, time since start)` for each request it sees and answers with
/// the headers `answer` gives for that request's index (0-based).
fn server(
    start: Instant,
    answer: Answer,
) -> (
    impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone,
    Log,
) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let svc = service_fn(move |req: Request<()>| {
        let mut seen = seen.lock().unwrap();
        let (status, headers) = answer(seen.len());
        seen.push((req.uri().to_string(), start.elapsed()));
        let mut res = Response::builder().status(status);
        for (k, v) in headers {
            res = res.header(k, v);
        }
        std::future::ready(Ok::<_, Infallible>(res.body(()).unwrap()))
    });
    (svc, log)
}

fn get(uri: &str) -> Request<()> {
    Request::get(uri).body(()).unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(start_paused = true)]
async fn remaining_zero_holds_the_next_request_until_the_reset() {
    let start = Instant::now();
    let (svc, log) = server(start, |i| {
        let remaining = if i == 1 { "0" } else { "1" };
        (
            200,
            vec![
                ("x-ratelimit-remaining", remaining),
                ("x-ratelimit-reset", "5"),
            ],
        )
    });
    let client = PoliteLayer::new().layer(svc);
    for _ in 0..3 {
        let res = client.clone().oneshot(get("http://a.test/")).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(0), secs(5)]);
    assert_eq!(client.polite_layer().wait_for("http://a.test:80"), None);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_holds_only_its_origin() {
    let start = Instant::now();
    let (svc, log) = server(start, |i| match i {
        0 => (429, vec![("retry-after", "3")]),
        _ => (200, vec![]),
    });
    let client = PoliteLayer::new().layer(svc);
    let res = client
        .clone()
        .oneshot(get("http://a.test/1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        client.polite_layer().wait_for("http://a.test:80"),
        Some(secs(3))
    );
    // Another origin goes at once, and so does readiness, while a.test waits.
    let waiting = tokio::spawn(client.clone().oneshot(get("http://a.test/2")));
    client
        .clone()
        .oneshot(get("https://b.test/"))
        .await
        .unwrap();
    waiting.await.unwrap().unwrap();
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("http://a.test/1".to_owned(), secs(0)),
            ("https://b.test/".to_owned(), secs(0)),
            ("http://a.test/2".to_owned(), secs(3)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn ietf_ratelimit_r0_waits_t_seconds() {
    let start = Instant::now();
    let (svc, log) = server(start, |i| match i {
        0 => (
            200,
            vec![("ratelimit", "\"burst\";r=0;t=4, \"day\";r=900;t=80000")],
        ),
        _ => (200, vec![("ratelimit", "\"burst\";r=1;t=4")]),
    });
    let client = PoliteLayer::new().layer(svc);
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(4)]);
}

#[tokio::test(start_paused = true)]
async fn a_wait_beyond_max_wait_fails_without_sending() {
    let start = Instant::now();
    let (svc, log) = server(start, |_| (429, vec![("retry-after", "120")]));
    let client = PoliteLayer::new().max_wait(secs(60)).layer(svc);
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    let err = client
        .clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert!(err.is_wait_too_long());
    // The server cannot fail (`Infallible`), so this is the only error there is.
    let Error::WaitTooLong(e) = err;
    assert_eq!((e.wait(), e.max_wait()), (secs(120), secs(60)));
    assert_eq!(
        e.to_string(),
        "the server asked to wait 120 s before the next request, longer than the 60 s allowed"
    );
    assert_eq!(log.lock().unwrap().len(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn send_anyway_sends_at_once() {
    let start = Instant::now();
    let (svc, log) = server(start, |_| (429, vec![("retry-after", "120")]));
    let client = PoliteLayer::new()
        .max_wait(secs(1))
        .over_deadline(OverDeadline::SendAnyway)
        .layer(svc);
    for _ in 0..2 {
        let res = client.clone().oneshot(get("http://a.test/")).await.unwrap();
        assert_eq!(res.status(), 429);
    }
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(0)]);
}

#[tokio::test(start_paused = true)]
async fn a_custom_key_and_clear() {
    let start = Instant::now();
    let (svc, log) = server(start, |_| (429, vec![("retry-after", "10")]));
    let layer = PoliteLayer::new().key(|p: &http::request::Parts| {
        p.headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    });
    let client = layer.layer(svc);
    let with = |token: &'static str| {
        Request::get("http://a.test/")
            .header("authorization", token)
            .body(())
            .unwrap()
    };
    client.clone().oneshot(with("alice")).await.unwrap();
    client.clone().oneshot(with("bob")).await.unwrap();
    assert_eq!(layer.wait_for("alice"), Some(secs(10)));
    layer.clear();
    client.clone().oneshot(with("alice")).await.unwrap();
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(0), secs(0)]);
}

#[tokio::test]
async fn inner_errors_pass_through() {
    let failing = service_fn(|_req: Request<()>| async {
        Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    });
    let err = PoliteLayer::new()
        .layer(failing)
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert!(err.is_service());
    assert_eq!(
        err.into_service().unwrap().to_string(),
        "connection refused"
    );
}

/// A request already waiting must not go out at the end of its wait when a response that
/// arrived meanwhile announced a longer one: it waits for the new time.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_honours_a_wait_lengthened_while_it_slept() {
    let start = Instant::now();
    let log: Log = Arc::default();
    let seen = log.clone();
    let svc = service_fn(move |req: Request<()>| {
        let uri = req.uri().to_string();
        seen.lock().unwrap().push((uri.clone(), start.elapsed()));
        async move {
            // The slow request answers at t = 2 s with `Retry-After: 10`; the fast one at once
            // with `Retry-After: 3`; any other with a 200.
            let (delay, status, retry) = match uri.as_str() {
                "http://a.test/slow" => (secs(2), 429, Some("10")),
                "http://a.test/fast" => (secs(0), 429, Some("3")),
                _ => (secs(0), 200, None),
            };
            tokio::time::sleep(delay).await;
            let mut res = Response::builder().status(status);
            if let Some(r) = retry {
                res = res.header("retry-after", r);
            }
            Ok::<_, Infallible>(res.body(()).unwrap())
        }
    });
    let client = PoliteLayer::new().layer(svc);
    let slow = tokio::spawn(client.clone().oneshot(get("http://a.test/slow")));
    tokio::task::yield_now().await;
    client
        .clone()
        .oneshot(get("http://a.test/fast"))
        .await
        .unwrap();
    // Blocked until t = 3 s; at t = 2 s the slow answer moves that to t = 12 s.
    let waiting = tokio::spawn(client.clone().oneshot(get("http://a.test/next")));
    slow.await.unwrap().unwrap();
    let res = waiting.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("http://a.test/slow".to_owned(), secs(0)),
            ("http://a.test/fast".to_owned(), secs(0)),
            ("http://a.test/next".to_owned(), secs(12)),
        ]
    );
}

/// A wait lengthened, while the request slept, past `max_wait` from its call fails it
/// without sending.
#[tokio::test(start_paused = true)]
async fn a_wait_lengthened_past_max_wait_fails_without_sending() {
    let start = Instant::now();
    let log: Log = Arc::default();
    let seen = log.clone();
    let svc = service_fn(move |req: Request<()>| {
        let uri = req.uri().to_string();
        seen.lock().unwrap().push((uri.clone(), start.elapsed()));
        async move {
            let (delay, retry) = match uri.as_str() {
                "http://a.test/slow" => (secs(2), "30"),
                _ => (secs(0), "3"),
            };
            tokio::time::sleep(delay).await;
            let res = Response::builder().status(429).header("retry-after", retry);
            Ok::<_, Infallible>(res.body(()).unwrap())
        }
    });
    let client = PoliteLayer::new().max_wait(secs(10)).layer(svc);
    let slow = tokio::spawn(client.clone().oneshot(get("http://a.test/slow")));
    tokio::task::yield_now().await;
    client
        .clone()
        .oneshot(get("http://a.test/fast"))
        .await
        .unwrap();
    let err = client
        .clone()
        .oneshot(get("http://a.test/next"))
        .await
        .unwrap_err();
    slow.await.unwrap().unwrap();
    assert!(err.is_wait_too_long());
    let Error::WaitTooLong(e) = err;
    assert_eq!(e.wait(), secs(32));
    assert_eq!(log.lock().unwrap().len(), 2, "the third request was sent");
}

/// A server whose first answer is a 200 with `X-RateLimit-Limit: 100`,
/// `X-RateLimit-Remaining: 0` and the reset `reset` computes from the wall clock; later
/// answers are plain 200s. Logs when each request arrives.
fn exhausted_then_ok(
    start: Instant,
    reset: fn(Duration) -> String,
) -> (
    impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone,
    Log,
) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let svc = service_fn(move |req: Request<()>| {
        let mut seen = seen.lock().unwrap();
        let mut res = Response::builder().status(200);
        if seen.is_empty() {
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            res = res
                .header("x-ratelimit-limit", "100")
                .header("x-ratelimit-remaining", "0")
                .header("x-ratelimit-reset", reset(unix));
        }
        seen.push((req.uri().to_string(), start.elapsed()));
        std::future::ready(Ok::<_, Infallible>(res.body(()).unwrap()))
    });
    (svc, log)
}

/// A reset sent as Unix milliseconds (13 digits; the report
/// <https://github.com/RocketChat/docs-old/issues/1358>) is read as milliseconds: the
/// second request is sent after at most 1.5 s, not refused for a year.
#[tokio::test(start_paused = true)]
async fn a_reset_in_unix_milliseconds_waits_milliseconds() {
    let start = Instant::now();
    let (svc, log) = exhausted_then_ok(start, |unix| (unix.as_millis() + 1500).to_string());
    let client = PoliteLayer::new().layer(svc);
    client
        .clone()
        .oneshot(get("http://a.test/1"))
        .await
        .unwrap();
    let res = client.clone().oneshot(get("http://a.test/2")).await;
    assert_eq!(
        res.unwrap().status(),
        200,
        "the second request was not sent"
    );
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    // The wall clock moved a little between the server's reading and the client's, so the
    // wait is at most the 1.5 s announced (the paused clock moves only by the wait).
    assert!(seen[1].1 <= Duration::from_millis(1500), "{seen:?}");
}

/// A reset in Unix seconds already in the past (the report
/// <https://github.com/withcoral/coral/issues/89>, where it was taken as a huge wait): the
/// second request is sent at once.
#[tokio::test(start_paused = true)]
async fn a_reset_in_the_past_does_not_wait() {
    let start = Instant::now();
    let (svc, log) = exhausted_then_ok(start, |unix| (unix.as_secs() - 5).to_string());
    let client = PoliteLayer::new().layer(svc);
    client
        .clone()
        .oneshot(get("http://a.test/1"))
        .await
        .unwrap();
    let res = client.clone().oneshot(get("http://a.test/2")).await;
    assert_eq!(res.unwrap().status(), 200);
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(0)]);
}

/// An answer to a request sent after a wait was recorded replaces it: here the request sent
/// anyway finds the server has budget again (`Remaining: 5`), so the following requests go at
/// once instead of waiting out the two minutes first announced.
#[tokio::test(start_paused = true)]
async fn a_later_answer_shortens_a_recorded_wait() {
    let start = Instant::now();
    let (svc, log) = server(start, |i| match i {
        0 => (429, vec![("retry-after", "120")]),
        _ => (
            200,
            vec![("x-ratelimit-remaining", "5"), ("x-ratelimit-reset", "60")],
        ),
    });
    let layer = PoliteLayer::new()
        .max_wait(secs(1))
        .over_deadline(OverDeadline::SendAnyway);
    let client = layer.clone().layer(svc);
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    assert_eq!(layer.wait_for("http://a.test:80"), Some(secs(120)));
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    assert_eq!(layer.wait_for("http://a.test:80"), None);
    let at: Vec<_> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(at, [secs(0), secs(0)]);
}

/// A request already waiting wakes when a later answer shortens the wait it waits for: here
/// a request sent at t = 1 s (after the 30 s wait was announced) finds budget again, and the
/// waiting request goes at t = 1 s instead of t = 30 s.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_wakes_when_a_later_answer_shortens_its_wait() {
    let start = Instant::now();
    let (svc, log) = server(start, |i| match i {
        0 => (429, vec![("retry-after", "30")]),
        _ => (
            200,
            vec![("x-ratelimit-remaining", "5"), ("x-ratelimit-reset", "60")],
        ),
    });
    let layer = PoliteLayer::new();
    let eager = layer
        .clone()
        .max_wait(Duration::ZERO)
        .over_deadline(OverDeadline::SendAnyway)
        .layer(svc.clone());
    let patient = layer.layer(svc);
    let res = patient
        .clone()
        .oneshot(get("http://a.test/1"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let waiting = tokio::spawn(patient.clone().oneshot(get("http://a.test/waits")));
    tokio::time::sleep(secs(1)).await;
    eager.oneshot(get("http://a.test/eager")).await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().status(), 200);
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("http://a.test/1".to_owned(), secs(0)),
            ("http://a.test/eager".to_owned(), secs(1)),
            ("http://a.test/waits".to_owned(), secs(1)),
        ]
    );
}
