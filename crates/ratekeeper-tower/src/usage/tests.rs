use std::collections::VecDeque;
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use ratekeeper_core::{Policy, Quota};
use tower::{Layer, Service, ServiceExt, service_fn};

use ratekeeper_core::Key;
use ratekeeper_core::store::MemoryStore;

use super::{BodyEvent, Usage};
use crate::policy::{Plan, Settle};
use crate::{BuildError, RateLimitBuilder, RateLimitLayer, RequestParts, key::GlobalKey};

/// A response body that yields its frames, then (if `hang`) waits for ever.
struct Frames {
    frames: VecDeque<Frame<Bytes>>,
    hang: bool,
}

impl Frames {
    fn new(data: &[&'static str], trailers: Option<HeaderMap>, hang: bool) -> Self {
        let mut frames: VecDeque<_> = data
            .iter()
            .map(|d| Frame::data(Bytes::from_static(d.as_bytes())))
            .collect();
        if let Some(t) = trailers {
            frames.push_back(Frame::trailers(t));
        }
        Self { frames, hang }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.hang
    }
}

const TOKENS: HeaderName = HeaderName::from_static("x-usage-tokens");

/// The resolver: "tokens" charged the request's `max-tokens` header (100 without it),
/// "requests" charged 1.
fn estimate(req: &RequestParts<'_>, plan: &mut Plan<'_>) {
    let estimate = req
        .headers()
        .get("max-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(100);
    plan.charge_cost("tokens", estimate).charge("requests");
}

type Resolver = fn(&RequestParts<'_>, &mut Plan<'_>);

/// "tokens" (1000 a day) and "requests" (`requests` a day), one global key. The headers
/// report the policy with the fewest units left: "tokens" unless `requests` is smaller.
fn layer(requests: u32) -> RateLimitBuilder<GlobalKey, u64, MemoryStore<Key>, Resolver> {
    RateLimitLayer::builder()
        .policy(Policy::new(
            "tokens",
            Quota::per_day(NonZeroU32::new(1000).unwrap()),
        ))
        .policy(Policy::new(
            "requests",
            Quota::per_day(NonZeroU32::new(requests).unwrap()),
        ))
        .key(GlobalKey)
        .resolver(estimate as Resolver)
}

fn builder() -> RateLimitBuilder<GlobalKey, u64, MemoryStore<Key>, Resolver> {
    layer(10_000)
}

fn ask(max_tokens: u64) -> Request<()> {
    Request::builder()
        .header("max-tokens", max_tokens)
        .body(())
        .unwrap()
}

/// `x-ratelimit-remaining`: the units left of the policy with the fewest.
fn remaining<B>(res: &Response<B>) -> u64 {
    res.headers()["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// What the next request (estimate 1) sees of the "tokens" budget, plus the 1 it takes.
async fn tokens_left<S, B>(svc: &mut S) -> u64
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    let res = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    remaining(&res) + 1
}

#[tokio::test]
async fn a_response_header_settles_the_charge_to_the_reported_usage() {
    let layer = builder()
        .usage("tokens", Usage::header(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let used = req.headers().get("used").cloned();
        let mut res = Response::new(String::new());
        if let Some(used) = used {
            res.headers_mut().insert(TOKENS, used);
        }
        Ok::<_, Infallible>(res)
    }));
    let mut req = ask(300);
    req.headers_mut()
        .insert("used", HeaderValue::from_static("40"));
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    // The headers describe the state after the estimate.
    assert_eq!(remaining(&res), 700);
    // Settled to 40 (and "requests" kept its 1: 100 - 1 - 1 for the probe).
    assert_eq!(tokens_left(&mut svc).await, 960);
}

#[tokio::test]
async fn a_usage_above_the_estimate_is_charged_without_refusing() {
    let layer = builder()
        .usage("tokens", Usage::header(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        let res = Response::builder()
            .header(TOKENS, "250")
            .body(String::new());
        Ok::<_, Infallible>(res.unwrap())
    }));
    let res = svc.ready().await.unwrap().call(ask(50)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(remaining(&res), 950);
    // 250 charged in all, then the probe's estimate of 1.
    let probe = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    assert_eq!(remaining(&probe), 749);
}

/// A reported usage far beyond the policy (a backend bug, or `u64::MAX` passed through) is
/// charged at most the policy's capacity: the key's budget is empty, but the next request
/// waits one refill of the whole burst, not centuries. A count too large for `u64` is the
/// same: charged the capacity, not taken for garbled.
#[tokio::test]
async fn a_usage_beyond_the_capacity_is_charged_the_capacity() {
    for value in [
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999",
    ] {
        let layer = builder()
            .usage("tokens", Usage::header(TOKENS))
            .build()
            .unwrap();
        let mut svc = layer.layer(service_fn(move |_req: Request<()>| async move {
            let res = Response::builder()
                .header(TOKENS, value)
                .body(String::new());
            Ok::<_, Infallible>(res.unwrap())
        }));
        let res = svc.ready().await.unwrap().call(ask(50)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        // 1000 tokens a day, all charged: the next token is one emission interval away
        // (86.4 s), not u64::MAX of them.
        let probe = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
        assert_eq!(probe.status(), StatusCode::TOO_MANY_REQUESTS, "{value}");
        assert_eq!(probe.headers()["retry-after"], "87", "{value}");
    }
}

/// The same for a trailer: a count too large for `u64` is charged the capacity.
#[tokio::test]
async fn a_trailer_beyond_u64_is_charged_the_capacity() {
    let layer = builder()
        .usage("tokens", Usage::trailer(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let streamed = req.headers()["max-tokens"] != "1";
        let trailers = streamed.then(|| {
            let mut t = HeaderMap::new();
            t.insert(TOKENS, HeaderValue::from_static("18446744073709551616"));
            t
        });
        Ok::<_, Infallible>(Response::new(Frames::new(&["a"], trailers, false)))
    }));
    let res = svc.ready().await.unwrap().call(ask(50)).await.unwrap();
    res.into_body().collect().await.unwrap();
    let probe = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    assert_eq!(probe.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(probe.headers()["retry-after"], "87");
}

#[tokio::test]
async fn a_missing_or_garbled_header_keeps_the_estimate() {
    // A repeated field (two counts, 5 and 50) is garbled too: neither is trusted.
    for values in [
        &[][..],
        &["lots"],
        &["-5"],
        &["+5"],
        &[""],
        &["5", "50"],
        &["50", "5"],
        &["5", "5"],
    ] {
        let layer = builder()
            .usage("tokens", Usage::header(TOKENS))
            .build()
            .unwrap();
        let mut svc = layer.layer(service_fn(move |req: Request<()>| async move {
            let mut res = Response::new(String::new());
            if req.headers().contains_key("max-tokens") {
                for v in values {
                    res.headers_mut()
                        .append(TOKENS, HeaderValue::from_str(v).unwrap());
                }
            }
            Ok::<_, Infallible>(res)
        }));
        svc.ready().await.unwrap().call(ask(300)).await.unwrap();
        let probe = svc
            .ready()
            .await
            .unwrap()
            .call(
                Request::builder()
                    .header("max-tokens", "1")
                    .body(())
                    .unwrap(),
            )
            .await
            .unwrap();
        // The probe sends `max-tokens` too, and gets the same value: a kept estimate of 1.
        assert_eq!(remaining(&probe), 699, "header values {values:?}");
    }
}

#[tokio::test]
async fn a_trailer_settles_the_charge_when_the_body_ends() {
    let layer = builder()
        .usage("tokens", Usage::trailer(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let streamed = req.headers()["max-tokens"] != "1";
        let trailers = streamed.then(|| {
            let mut t = HeaderMap::new();
            t.insert(TOKENS, HeaderValue::from_static("7"));
            t
        });
        Ok::<_, Infallible>(Response::new(Frames::new(&["a", "b"], trailers, false)))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    assert_eq!(remaining(&res), 700);
    // Not settled before the body is read.
    assert!(res.body().is_metered());
    let probe = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    assert_eq!(remaining(&probe), 699);
    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()[TOKENS], "7");
    // 1000 - 7 - 1 (the first probe, kept: no trailer) - 1 (this probe).
    assert_eq!(tokens_left(&mut svc).await, 992);
}

/// A repeated trailer (5 and 50) is garbled: the estimate is kept.
#[tokio::test]
async fn a_repeated_trailer_keeps_the_estimate() {
    let layer = builder()
        .usage("tokens", Usage::trailer(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        let mut t = HeaderMap::new();
        t.append(TOKENS, HeaderValue::from_static("5"));
        t.append(TOKENS, HeaderValue::from_static("50"));
        Ok::<_, Infallible>(Response::new(Frames::new(&["a"], Some(t), false)))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(
        collected.trailers().unwrap().get_all(TOKENS).iter().count(),
        2
    );
    assert_eq!(tokens_left(&mut svc).await, 700);
}

#[tokio::test]
async fn a_body_without_the_trailer_keeps_the_estimate() {
    let layer = builder()
        .usage("tokens", Usage::trailer(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Frames::new(&["a"], None, false)))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(tokens_left(&mut svc).await, 700);
}

/// Counts one unit per byte of data, and records the events it saw.
fn bytes_tally(seen: Arc<Mutex<Vec<String>>>) -> Usage {
    Usage::body(move |head| {
        assert_eq!(head.status, StatusCode::OK);
        let seen = Arc::clone(&seen);
        let mut total = 0u64;
        move |event: BodyEvent<'_>| {
            if let BodyEvent::Data(data) = event {
                total += data.len() as u64;
            }
            let name = match event {
                BodyEvent::Data(_) => "data",
                BodyEvent::Trailers(_) => "trailers",
                BodyEvent::End => "end",
                BodyEvent::Error => "error",
                BodyEvent::Dropped => "dropped",
            };
            assert_eq!(
                event.is_final(),
                matches!(name, "end" | "error" | "dropped")
            );
            seen.lock().unwrap().push(name.to_owned());
            total
        }
    })
}

#[tokio::test]
async fn a_tally_settles_the_charge_at_the_end_of_the_body() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = builder()
        .usage("tokens", bytes_tally(Arc::clone(&seen)))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let frames: &[&'static str] = if req.headers()["max-tokens"] == "1" {
            &["x"]
        } else {
            &["hello", " world"]
        };
        Ok::<_, Infallible>(Response::new(Frames::new(
            frames,
            Some(HeaderMap::new()),
            false,
        )))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello world");
    assert_eq!(*seen.lock().unwrap(), ["data", "data", "trailers", "end"]);
    // 11 bytes charged; the probe's own body is not read yet (its estimate, 1, stands).
    assert_eq!(tokens_left(&mut svc).await, 989);
}

#[tokio::test]
async fn a_dropped_body_is_charged_what_it_produced() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = builder()
        .usage("tokens", bytes_tally(Arc::clone(&seen)))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let hang = req.headers()["max-tokens"] != "1";
        Ok::<_, Infallible>(Response::new(Frames::new(&["abc", "de"], None, hang)))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    let mut body = res.into_body();
    // Two frames read, then the stream stalls and the client goes away.
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    let cx = &mut Context::from_waker(std::task::Waker::noop());
    assert!(Pin::new(&mut body).poll_frame(cx).is_pending());
    drop(body);
    assert_eq!(*seen.lock().unwrap(), ["data", "data", "dropped"]);
    assert_eq!(tokens_left(&mut svc).await, 995);
}

#[tokio::test]
async fn an_unwrapped_body_keeps_the_estimate() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = builder()
        .usage("tokens", bytes_tally(Arc::clone(&seen)))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Frames::new(&["abc"], None, false)))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    let Ok(inner) = res.into_body().into_inner() else {
        panic!("the inner service's body");
    };
    drop(inner);
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(tokens_left(&mut svc).await, 700);
}

#[tokio::test]
async fn a_charge_the_settle_rule_refunds_is_not_corrected() {
    let layer = builder()
        .usage("tokens", Usage::header(TOKENS))
        .settle("tokens", Settle::REFUND_SERVER_ERRORS)
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let status = if req.headers()["max-tokens"] == "1" {
            StatusCode::OK
        } else {
            StatusCode::BAD_GATEWAY
        };
        let res = Response::builder()
            .status(status)
            .header(TOKENS, "1")
            .body(String::new());
        Ok::<_, Infallible>(res.unwrap())
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    // Refunded whole by the settle rule; not charged 1 on top.
    assert_eq!(tokens_left(&mut svc).await, 1000);
}

#[tokio::test]
async fn a_policy_without_a_usage_rule_keeps_its_charge() {
    let layer = layer(100)
        .usage("tokens", Usage::header(TOKENS))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        let res = Response::builder().header(TOKENS, "0").body(String::new());
        Ok::<_, Infallible>(res.unwrap())
    }));
    for _ in 0..3 {
        let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    // "tokens" settled to 0 each time; "requests" kept 1 each: the probe sees 100 - 4.
    let probe = svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    assert_eq!(probe.headers()["x-ratelimit-limit"], "100");
    assert_eq!(remaining(&probe), 96);
}

#[test]
fn a_usage_rule_for_an_unknown_policy_is_a_build_error() {
    let built = builder().usage("tokenz", Usage::header(TOKENS)).build();
    assert!(matches!(built, Err(BuildError::UnknownPolicy(name)) if name == "tokenz"));
}

#[test]
fn usage_sources_print_what_they_read() {
    assert_eq!(
        format!("{:?}", Usage::header(TOKENS)),
        "Usage::header(\"x-usage-tokens\")"
    );
    assert_eq!(
        format!("{:?}", Usage::trailer(TOKENS)),
        "Usage::trailer(\"x-usage-tokens\")"
    );
    assert_eq!(
        format!("{:?}", Usage::body(|_| |_: BodyEvent<'_>| 0)),
        "Usage::body(..)"
    );
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn a_counted_body_turned_into_axums_body_is_still_counted() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = builder()
        .usage("tokens", bytes_tally(Arc::clone(&seen)))
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(axum::body::Body::from("twelve bytes")))
    }));
    let res = svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    let body = axum::body::Body::from(res.into_body());
    let bytes = axum::body::to_bytes(body, 64).await.unwrap();
    assert_eq!(&bytes[..], b"twelve bytes");
    assert_eq!(seen.lock().unwrap().last().map(String::as_str), Some("end"));
    assert_eq!(tokens_left(&mut svc).await, 1000 - 12);
}
