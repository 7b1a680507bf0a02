//! Modes over real HTTP: Delay spaces a burst at the configured rate and rejects beyond
//! `max_wait` (tokio paused time); Shadow never blocks; the degraded-response fallback; the
//! keyed concurrency limit holds a slot until the response body ends.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use http_body::Frame;
use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::clock::TokioClock;
use ratekeeper_axum::core::store::MemoryStore;
use ratekeeper_axum::rate_limit::Mode;
use ratekeeper_axum::report::HeaderStyle;
use ratekeeper_axum::{
    RateLimitLayer, core::Policy, core::Quota, extract::RateLimitInfo, key::GlobalKey,
};
use ratekeeper_tests::{TestServer, ok_app};
use tokio::sync::mpsc;
use tokio::time::Instant;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/degraded_fallback.rs"]
mod degraded_fallback;

#[tokio::test(start_paused = true)]
async fn delay_spaces_a_burst_at_the_rate_and_rejects_beyond_max_wait() {
    // 1 per second, burst 1; wait at most 3 s.
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_second(NonZeroU32::MIN)))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(TokioClock::new()))
        .mode(Mode::Delay {
            max_wait: Duration::from_secs(3),
        })
        .build()
        .unwrap();
    let server = TestServer::start(ok_app().layer(layer)).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let res = server.get("/").send().await.unwrap();
                let status = res.status().as_u16();
                let retry = res
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                (status, start.elapsed(), retry)
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    results.sort_by_key(|(status, at, _)| (*at, *status));
    let summary: Vec<(u16, u64)> = results
        .iter()
        .map(|(s, at, _)| (*s, at.as_millis() as u64 / 100))
        .collect();
    // 200s at 0, 1, 2, 3 s (in tenths of a second): each request reserves its turn. The
    // fifth would pass at 4 s > 3 s: rejected at once (t = 0, no waiting), Retry-After 1
    // (a reservation fits within 3 s after 1 s). The old check-and-retry Delay mode
    // rejected it only at 3 s, after waiting for nothing.
    assert_eq!(
        summary,
        vec![(200, 0), (429, 0), (200, 10), (200, 20), (200, 30)],
        "{results:?}"
    );
    let rejected = results.iter().find(|(s, _, _)| *s == 429).unwrap();
    assert_eq!(rejected.2.as_deref(), Some("1"));
    for (status, _, retry) in &results {
        if *status == 200 {
            assert!(retry.is_none());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_blocks_but_reports() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("default", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .mode(Mode::Shadow)
        .request_info(true) // the handler reads the decision of allowed requests too
        .build()
        .unwrap();
    let counter = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/",
            get(move |info: RateLimitInfo| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { format!("limited={}", info.is_limited()) }
            }),
        )
        .layer(layer);
    let server = TestServer::start(app).await;
    for i in 0..4 {
        let res = server.get("/").send().await.unwrap();
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(res.headers()["x-ratelimit-limit"], "1");
        assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
        assert_eq!(res.headers()["x-ratelimit-reset"], "60");
        assert!(res.headers().get("retry-after").is_none());
        let want = if i == 0 {
            "limited=false"
        } else {
            "limited=true"
        };
        assert_eq!(res.text().await.unwrap(), want);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_serves_the_limited_request_with_the_marker() {
    let server = TestServer::start(degraded_fallback::app()).await;
    for (i, want) in ["prices v1 (fresh)\n", "prices v2 (fresh)\n"]
        .iter()
        .enumerate()
    {
        let res = server.get("/prices").send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit-degraded").is_none());
        assert_eq!(
            res.headers()["x-ratelimit-remaining"],
            (1 - i).to_string().as_str()
        );
        assert_eq!(res.text().await.unwrap(), *want);
    }
    for _ in 0..2 {
        let res = server.get("/prices").send().await.unwrap();
        assert_eq!(res.status(), 200);
        let h = res.headers();
        assert_eq!(h["ratelimit-degraded"], "\"default\"");
        assert_eq!(h.get_all("ratelimit-degraded").iter().count(), 1);
        assert_eq!(h["x-ratelimit-limit"], "2");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "60");
        assert!(h.get("retry-after").is_none());
        assert_eq!(
            res.text().await.unwrap(),
            "prices v2 (cached; fresh data again within 60 s)\n"
        );
    }
}

/// The fallback wraps only `GET /prices`: while that route is limited (and answered from
/// the cache), `POST /prices` is still a 405 and an unknown path still a 404, neither
/// charged nor marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_answers_only_the_route_it_degrades() {
    let server = TestServer::start(degraded_fallback::app()).await;
    for _ in 0..3 {
        let res = server.get("/prices").send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = server.get("/prices").send().await.unwrap();
    assert_eq!(res.headers()["ratelimit-degraded"], "\"default\"");
    for _ in 0..2 {
        for (res, status) in [
            (server.post("/prices").send().await.unwrap(), 405),
            (server.get("/other").send().await.unwrap(), 404),
        ] {
            assert_eq!(res.status(), status);
            let h = res.headers();
            assert!(h.get("ratelimit-degraded").is_none(), "{status}");
            assert!(h.get("x-ratelimit-remaining").is_none(), "{status}");
            assert!(!res.text().await.unwrap().contains("prices"), "{status}");
        }
    }
    // Still limited, still degraded.
    let res = server.get("/prices").send().await.unwrap();
    assert_eq!(res.headers()["ratelimit-degraded"], "\"default\"");
    assert!(res.text().await.unwrap().starts_with("prices v2 (cached"));
}

/// A response body that stays open until the test sends its last chunk and drops the sender.
struct Held(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

type Senders = Arc<Mutex<Vec<mpsc::UnboundedSender<Bytes>>>>;

async fn streaming(State(senders): State<Senders>) -> Body {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Bytes::from_static(b"start;")).unwrap();
    senders.lock().unwrap().push(tx);
    Body::new(Held(rx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_rejects_the_third_and_admits_after_a_body_ends() {
    let senders: Senders = Arc::default();
    let app = Router::new()
        .route("/", get(streaming))
        .with_state(Arc::clone(&senders))
        .layer(
            ConcurrencyLimitLayer::new(NonZeroU32::new(2).unwrap())
                .key(GlobalKey)
                .headers(HeaderStyle::Both),
        );
    let server = TestServer::start(app).await;

    let a = server.get("/").send().await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(a.headers()["x-ratelimit-limit"], "2");
    assert_eq!(a.headers()["x-ratelimit-remaining"], "1");
    assert!(a.headers().get("x-ratelimit-reset").is_none());
    assert_eq!(
        a.headers()["ratelimit-policy"],
        "\"concurrency\";q=2;qu=\"concurrent-requests\""
    );
    assert_eq!(a.headers()["ratelimit"], "\"concurrency\";r=1");
    let b = server.get("/").send().await.unwrap();
    assert_eq!(b.status(), 200);
    assert_eq!(b.headers()["x-ratelimit-remaining"], "0");

    // Both bodies are still open: the third concurrent request is refused.
    let c = server.get("/").send().await.unwrap();
    assert_eq!(c.status(), 429);
    assert_eq!(c.headers()["retry-after"], "1");
    assert_eq!(c.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(c.headers()["ratelimit"], "\"concurrency\";r=0");

    // End A's body; once the client has read it to the end, the slot is free.
    let first = senders.lock().unwrap().remove(0);
    first.send(Bytes::from_static(b"end")).unwrap();
    drop(first);
    assert_eq!(a.text().await.unwrap(), "start;end");

    let d = server.get("/").send().await.unwrap();
    assert_eq!(d.status(), 200);
    assert_eq!(d.headers()["x-ratelimit-remaining"], "0");
    senders.lock().unwrap().clear();
    assert_eq!(b.text().await.unwrap(), "start;");
    assert_eq!(d.text().await.unwrap(), "start;");
}
