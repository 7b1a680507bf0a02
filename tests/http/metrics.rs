//! Every decision is counted exactly once in `ratekeeper_decisions_total{policy, outcome}`,
//! in every mode (Reject, Delay, Shadow, fallback), on the memory store (which decides in
//! `call`) and on Redis (which decides in the response future); and the "cost can never
//! fit" warning is logged on both paths.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{MemoryStore, Store};
use ratekeeper_axum::metrics::DECISIONS_TOTAL;
use ratekeeper_axum::rate_limit::Mode;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::logs::Captured;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};
use tower::{Service, ServiceExt, service_fn};

/// `ratekeeper_decisions_total` (and `ratekeeper_degraded_total`, outcome `degraded`) by
/// `(policy, outcome)`.
fn counts(snapshotter: &Snapshotter) -> HashMap<(String, String), u64> {
    let label = |key: &metrics::Key, name: &str| {
        key.labels()
            .find(|l| l.key() == name)
            .map_or_else(String::new, |l| l.value().to_owned())
    };
    let mut out = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let outcome = match key.name() {
            DECISIONS_TOTAL => label(key, "outcome"),
            "ratekeeper_degraded_total" => "degraded".to_owned(),
            _ => continue,
        };
        *out.entry((label(key, "policy"), outcome)).or_default() += n;
    }
    out
}

fn ok(_req: Request<()>) -> Ready<Result<Response<String>, Infallible>> {
    ready(Ok(Response::new("fresh".to_owned())))
}

fn cached(_req: Request<()>) -> Ready<Result<Response<String>, Infallible>> {
    ready(Ok(Response::new("cached".to_owned())))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Reject,
    Shadow,
    Fallback,
    /// Delay with a wait that fits: the second request waits, then passes.
    DelayWaits,
    /// Delay with a wait that does not fit: the second request is rejected.
    DelayRejects,
}

impl Case {
    const ALL: [Case; 5] = [
        Case::Reject,
        Case::Shadow,
        Case::Fallback,
        Case::DelayWaits,
        Case::DelayRejects,
    ];

    /// The policy: 1 per 300 ms for the waiting case, else 1 per minute; burst 1.
    fn quota(self) -> Quota {
        let period = if self == Case::DelayWaits {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(60)
        };
        Quota::new(1, period).unwrap()
    }

    fn mode(self) -> Mode {
        match self {
            Case::Reject | Case::Fallback => Mode::Reject,
            Case::Shadow => Mode::Shadow,
            Case::DelayWaits => Mode::Delay {
                max_wait: Duration::from_secs(2),
            },
            Case::DelayRejects => Mode::Delay {
                max_wait: Duration::from_millis(50),
            },
        }
    }

    /// Expected statuses of the two requests and `(allowed, denied, degraded)` counts.
    fn expected(self) -> ([StatusCode; 2], (u64, u64, u64)) {
        let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
        match self {
            Case::Reject | Case::DelayRejects => ([ok, limited], (1, 1, 0)),
            Case::Shadow => ([ok, ok], (1, 1, 0)),
            Case::Fallback => ([ok, ok], (1, 1, 1)),
            Case::DelayWaits => ([ok, ok], (2, 0, 0)),
        }
    }
}

/// Two requests through a layer on `store` in `case`; returns the statuses.
async fn two_requests<St: Store<Key>>(store: St, case: Case) -> Vec<StatusCode> {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("p", case.quota()))
        .key(GlobalKey)
        .store(store)
        .mode(case.mode())
        .build()
        .unwrap();
    let mut statuses = Vec::new();
    if case == Case::Fallback {
        let mut svc = tower::Layer::layer(&layer.with_fallback(service_fn(cached)), service_fn(ok));
        for _ in 0..2 {
            let res = svc.ready().await.unwrap().call(Request::new(())).await;
            statuses.push(res.unwrap().status());
        }
    } else {
        let mut svc = tower::Layer::layer(&layer, service_fn(ok));
        for _ in 0..2 {
            let res = svc.ready().await.unwrap().call(Request::new(())).await;
            statuses.push(res.unwrap().status());
        }
    }
    statuses
}

async fn redis_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store")
}

/// Runs every case with a fresh local recorder and checks the counts.
async fn check_every_mode<F, Fut, St>(mut store: F)
where
    F: FnMut(Case) -> Fut,
    Fut: Future<Output = St>,
    St: Store<Key>,
{
    for case in Case::ALL {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let statuses = {
            // Current-thread runtime: every poll, and so every count, is on this thread.
            let _guard = metrics::set_default_local_recorder(&recorder);
            two_requests(store(case).await, case).await
        };
        let (want_status, (allowed, denied, degraded)) = case.expected();
        assert_eq!(statuses, want_status, "{case:?}");
        let counts = counts(&snapshotter);
        let count = |policy: &str, outcome: &str| {
            counts
                .get(&(policy.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(
            count("p", "allowed"),
            allowed,
            "{case:?} allowed: {counts:?}"
        );
        assert_eq!(count("p", "denied"), denied, "{case:?} denied: {counts:?}");
        assert_eq!(count("p", "cannot_fit"), 0, "{case:?}: {counts:?}");
        assert_eq!(count("p", "degraded"), degraded, "{case:?}: {counts:?}");
    }
}

#[tokio::test]
async fn memory_store_counts_each_decision_once_in_every_mode() {
    check_every_mode(|_case| async { MemoryStore::<Key>::new() }).await;
}

#[tokio::test]
async fn redis_store_counts_each_decision_once_in_every_mode() {
    let server = RedisServer::start();
    let server = &server;
    check_every_mode(|case| async move { redis_store(server, &format!("{case:?}")).await }).await;
}

/// A cost larger than the burst: 429 without `Retry-After`, one WARN, counted once as
/// `cannot_fit`, on the memory store and on Redis.
async fn never_fits<St: Store<Key>>(store: St) {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "p",
            Quota::new(1, Duration::from_secs(60)).unwrap(),
        ))
        .key(GlobalKey)
        .cost_fn(|_req: &ratekeeper_axum::RequestParts<'_>| 2)
        .store(store)
        .build()
        .unwrap();
    let res = {
        let _trace = tracing::subscriber::set_default(subscriber);
        let _metrics = metrics::set_default_local_recorder(&recorder);
        let svc = tower::Layer::layer(&layer, service_fn(ok));
        svc.oneshot(Request::new(())).await.unwrap()
    };
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none());
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("can never be allowed"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("policy=\"p\""), "{text}");
    let counts = counts(&snapshotter);
    assert_eq!(
        counts.get(&("p".to_owned(), "cannot_fit".to_owned())),
        Some(&1),
        "{counts:?}"
    );
    assert_eq!(counts.len(), 1, "{counts:?}");
}

#[tokio::test]
async fn never_fits_is_logged_and_counted_once_on_the_memory_store() {
    never_fits(MemoryStore::<Key>::new()).await;
}

#[tokio::test]
async fn never_fits_is_logged_and_counted_once_on_redis() {
    let server = RedisServer::start();
    never_fits(redis_store(&server, "never").await).await;
}
