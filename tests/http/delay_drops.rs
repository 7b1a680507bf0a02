//! Delay mode: a waiter dropped while others queue behind it never lets two requests into
//! the handler closer than the emission interval `T`, whichever waiters are dropped and in
//! whatever order (a refund gives back only what the dropped charge still holds, never a slot
//! booked by a later reservation).
//!
//! GCRA, burst 1, `T` per request. One request passes at once and four waiters reserve the
//! turns at T, 2T, 3T and 4T; some are dropped (first, middle, last, all but one, several in
//! different orders) a little later; then three new requests arrive. Every request still
//! alive gets its 200, and the handler's entry times are at least `T` apart.
//!
//! Memory store: exact reservations on tokio's paused clock, so the entry times themselves
//! are exact. Redis: exact reservations too (the reservation script books the turn; a
//! dropped waiter's refund gives back nothing while a later turn is booked), in real time,
//! on Redis's clock. Entry times taken on the app's clock there would also measure how late
//! the scheduler woke each waiter (tens of ms on a loaded machine), so the Redis test checks
//! the turns where Redis booked them: every live reservation's receipt (the TAT right after
//! its charge) at least `T` from every other one ([`ratekeeper_tests::turns`]). The defect
//! this guards against books two requests into one slot: a spacing of 0.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratekeeper_axum::core::clock::TokioClock;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{MemoryStore, Store};
use ratekeeper_axum::rate_limit::Mode;
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};
use ratekeeper_tests::turns::Booked;
use tokio::time::Instant;
use tower::{Service, ServiceExt, service_fn};

/// Which waiters (1..=4) are dropped, in this order.
const DROPS: [&[usize]; 8] = [
    &[1],
    &[2],
    &[4],
    &[1, 2, 3],
    &[4, 3],
    &[2, 4],
    &[3, 2, 1],
    &[1, 2, 3, 4],
];

type Entries = Arc<Mutex<Vec<Instant>>>;

/// Runs one drop order; returns the handler's entry times, sorted.
async fn run<St: Store<Key>>(
    store: St,
    t: Duration,
    drops: &[usize],
    settle: Duration,
) -> Vec<Instant> {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("p", Quota::new(1, t).unwrap()))
        .key(GlobalKey)
        .store(store)
        .mode(Mode::Delay { max_wait: t * 20 })
        .build()
        .unwrap();
    let entries: Entries = Arc::default();
    let log = Arc::clone(&entries);
    let handler = move |_req: Request<()>| -> Ready<Result<Response<String>, Infallible>> {
        log.lock().unwrap().push(Instant::now());
        ready(Ok(Response::new(String::new())))
    };
    let mut svc = tower::Layer::layer(&layer, service_fn(handler));
    // The first request passes at once; waiters 1..=4 reserve.
    let first = svc.ready().await.unwrap().call(Request::new(())).await;
    assert_eq!(first.unwrap().status(), StatusCode::OK);
    // Index 0 stands for the first request.
    let mut tasks = vec![None];
    for _ in 0..4 {
        let future = svc.ready().await.unwrap().call(Request::new(()));
        tasks.push(Some(tokio::spawn(future)));
    }
    tokio::time::sleep(settle).await;
    for &i in drops {
        if let Some(task) = &tasks[i] {
            task.abort();
        }
        // Let the aborted task drop its future (and refund) before the next one.
        tokio::task::yield_now().await;
    }
    for _ in 0..3 {
        let future = svc.ready().await.unwrap().call(Request::new(()));
        tasks.push(Some(tokio::spawn(future)));
    }
    // Every request not dropped is served; a dropped one is cancelled, unless it had already
    // been served when it was dropped.
    let mut served = 1;
    for (i, task) in tasks.into_iter().enumerate() {
        let Some(task) = task else { continue };
        match task.await {
            Ok(res) => {
                assert_eq!(res.unwrap().status(), StatusCode::OK, "request {i}");
                served += 1;
            }
            Err(err) => assert!(err.is_cancelled() && drops.contains(&i), "request {i}"),
        }
    }
    assert!(
        served >= 5 - drops.len() + 3,
        "drops {drops:?}: {served} served"
    );
    let mut entries = entries.lock().unwrap().clone();
    entries.sort();
    assert_eq!(entries.len(), served, "drops {drops:?}");
    entries
}

/// The smallest gap between consecutive entries.
fn min_gap(entries: &[Instant]) -> Duration {
    entries
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .min()
        .unwrap_or(Duration::MAX)
}

#[tokio::test(start_paused = true)]
async fn memory_store_dropped_waiters_never_let_two_in_closer_than_t() {
    let t = Duration::from_millis(100);
    for drops in DROPS {
        let (store, turns) = Booked::new(
            MemoryStore::with_clock(TokioClock::new()),
            Duration::from_nanos(1),
        );
        let entries = run(store, t, drops, Duration::from_millis(50)).await;
        let gap = min_gap(&entries);
        assert!(gap >= t, "drops {drops:?}: two requests {gap:?} apart");
        let log = turns.log();
        assert!(
            log.min_spacing.is_some_and(|s| s >= t),
            "drops {drops:?}: two live turns booked {:?} apart",
            log.min_spacing
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_dropped_waiters_never_let_two_in_closer_than_t() {
    let server = RedisServer::start();
    let t = Duration::from_millis(200);
    for (n, drops) in DROPS.into_iter().enumerate() {
        let redis = RedisStore::builder()
            .prefix(format!("drops{n}"))
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("redis store");
        // Redis receipts are µs stamps on Redis's clock.
        let (store, turns) = Booked::new(redis, Duration::from_micros(1));
        run(store, t, drops, Duration::from_millis(50)).await;
        let log = turns.log();
        assert_eq!(log.errors, 0, "drops {drops:?}: {log:?}");
        assert!(
            log.min_spacing.is_some_and(|s| s >= t),
            "drops {drops:?}: two live turns booked {:?} apart on Redis's clock",
            log.min_spacing
        );
    }
}
