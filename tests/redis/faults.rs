//! Fault tests of the Redis store over real HTTP: Redis never answers (the report
//! <https://github.com/envoyproxy/ratelimit/issues/462>: with Redis down every request
//! waited for it; here: fail open,
//! fail closed, local fallback), a crash under load (Redis paused, then `kill -9`) with
//! recovery, `SIGSTOP` for 4 s, `SCRIPT FLUSH`, and a Redis Cluster failover of a paused
//! primary. No panic, no hung request.
//!
//! The deadline itself is proven exactly on a virtual clock (`deadline.rs`). These tests
//! run on the wall clock, on a machine that may be loaded, so each request's time in the
//! server (the layers and the handler, measured by [`timed`], everything included) is
//! bounded on both sides: a request that waited for a paused Redis took **at least the
//! deadline** (the decision never comes before it), and every request took **at most the
//! deadline plus [`SLACK`]**, generous enough for 16 busy loops on 2 cores, and far below
//! the time Redis stays paused ([`PAUSE`]), so a store with no deadline at all fails it.
//! Redis is paused (`SIGSTOP`: connections stay open, nothing answers), never only killed:
//! a killed process refuses connections at once, which passes with no deadline. Every loop
//! is bounded in count and time.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::Request;
use ratekeeper_axum::StoreDegraded;
use ratekeeper_axum::core::store::FailurePolicy;
use ratekeeper_axum::core::store::redis::{RedisStore, RedisStoreBuilder};
use ratekeeper_axum::{
    RateLimitLayer, RequestParts, core::Key, core::Policy, core::Quota, key::KeyError,
};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

/// The decision deadline of every test here.
const DEADLINE: Duration = Duration::from_millis(50);
/// What a request may take beyond the deadline on a loaded machine (16 busy loops on 2
/// cores): the scheduler's delays, the HTTP stack, the handler.
const SLACK: Duration = Duration::from_secs(2);
/// How long Redis stays paused in the tests that bound requests by the deadline: longer
/// than the deadline and [`SLACK`], so a request that waited for Redis instead of the
/// deadline exceeds the bound.
const PAUSE: Duration = Duration::from_secs(4);
/// A client round trip longer than this is a hung request (the reported wrong behaviour), not
/// queueing on a busy machine.
const HUNG: Duration = Duration::from_secs(5);

type Layer = RateLimitLayer<fn(&RequestParts<'_>) -> Result<Key, KeyError>, u64, RedisStore>;

fn header_key(req: &RequestParts<'_>) -> Result<Key, KeyError> {
    req.headers()
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .map(Key::from)
        .ok_or(KeyError::Missing("x-key header"))
}

fn layer(store: RedisStore, policy: Policy) -> Layer {
    RateLimitLayer::builder()
        .policy(policy)
        .key(header_key as fn(&RequestParts<'_>) -> Result<Key, KeyError>)
        .store(store)
        .build()
        .expect("layer")
}

/// The handler says whether the layer marked the request degraded (the fallback hook).
fn app(layer: Layer) -> Router {
    Router::new()
        .route(
            "/",
            get(|req: Request<axum::body::Body>| async move {
                match req.extensions().get::<StoreDegraded>() {
                    Some(d) if d.action == FailurePolicy::Degrade => "fallback",
                    Some(_) => "degraded",
                    None => "ok",
                }
            }),
        )
        .layer(layer)
        .layer(axum::middleware::from_fn(timed))
}

/// Response header carrying the time [`timed`] measured, µs.
const SERVER_US: &str = "x-test-server-us";

/// Middleware (layered outermost): the wall-clock time of everything inside it (the rate
/// limit layer, its store calls, the handler), in [`SERVER_US`]. Nothing is taken out: a
/// bound on it holds whatever the wait was for.
async fn timed(
    req: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let start = Instant::now();
    let mut res = next.run(req).await;
    let took = start.elapsed().as_micros().to_string();
    if let Ok(v) = http::HeaderValue::from_str(&took) {
        res.headers_mut().insert(SERVER_US, v);
    }
    res
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

#[derive(Debug)]
struct Answer {
    status: u16,
    remaining: Option<u32>,
    retry_after: Option<u32>,
    body: String,
    /// Client round trip (reported, not bounded: it includes the client's own queueing).
    took: Duration,
    /// Time inside the rate-limit layer and the handler, measured by the server
    /// ([`timed`]), wall-clock.
    server: Duration,
}

impl Answer {
    /// Whether the failure policy answered (the handler saw the degraded marker, or the
    /// layer answered 503).
    fn degraded(&self) -> bool {
        self.body == "degraded" || self.body == "fallback" || self.status == 503
    }
}

async fn get_key(client: &reqwest::Client, addr: std::net::SocketAddr, key: &str) -> Answer {
    let start = Instant::now();
    let res = client
        .get(format!("http://{addr}/"))
        .header("x-key", key)
        .send()
        .await
        .expect("request answered");
    let status = res.status().as_u16();
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    let remaining = header("x-ratelimit-remaining");
    let retry_after = header("retry-after");
    let server = res
        .headers()
        .get(SERVER_US)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros)
        .expect("the answer passed through `timed`");
    let body = res.text().await.unwrap_or_default();
    Answer {
        status,
        remaining,
        retry_after,
        body,
        took: start.elapsed(),
        server,
    }
}

/// Every answer took at most the deadline and [`SLACK`] in the server.
fn assert_within_deadline(answers: &[Answer]) {
    let slowest = answers
        .iter()
        .max_by_key(|a| a.server)
        .expect("requests were sent");
    assert!(
        slowest.server <= DEADLINE + SLACK,
        "the slowest request took {:?} in the server, more than the deadline and {SLACK:?} \
         (Redis was paused for {PAUSE:?}): {slowest:?}",
        slowest.server
    );
}

/// Some answer of the failure policy waited for the deadline (Redis was paused, so the
/// requests sent to it waited, and were answered at the deadline, never before).
fn assert_some_waited_for_the_deadline(answers: &[Answer]) {
    let waited = answers
        .iter()
        .filter(|a| a.degraded())
        .max_by_key(|a| a.server)
        .expect("the failure policy answered");
    assert!(
        waited.server >= DEADLINE,
        "no degraded answer waited for the {DEADLINE:?} deadline (longest {waited:?})"
    );
}

fn store(on_failure: FailurePolicy) -> RedisStoreBuilder {
    RedisStore::builder()
        .deadline(DEADLINE)
        .on_failure(on_failure)
        .stale_tolerance(Duration::ZERO)
}

async fn sleep_until(start: Instant, at_ms: u64) {
    tokio::time::sleep_until((start + Duration::from_millis(at_ms)).into()).await;
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>): 3 per 60 s on Redis, deadline 50 ms; Redis accepts connections and never
/// answers (SIGSTOP) from t=0; R1..R5 at t = 0, 100, .., 400 ms; Redis recovers at
/// t = 4 s ([`PAUSE`]) and R6 is decided by Redis.
///
/// Proves: R1..R5 are answered by the failure policy (`stats.degraded` is 5; the callers
/// check the answers); R1..R3 waited for their 50 ms deadline (at least the deadline in the
/// server) and no answer took longer than the deadline and [`SLACK`] (the breaker then
/// answers R4, R5 at once; that they do not wait at all is proven on the virtual clock, in
/// `deadline.rs`); no answer is a 500. Once the store has reconnected to the resumed Redis
/// (its prober makes a fresh connection ready), R6 is decided by Redis: 200, Remaining 2,
/// so R1..R5 (sent to Redis and left queued there during the outage) were not counted.
async fn redis_down_or_slow(on_failure: FailurePolicy, local: Option<Policy>) -> Vec<Answer> {
    let server = RedisServer::start();
    let mut builder = store(on_failure);
    if let Some(p) = local {
        builder = builder.local_policy(p);
    }
    let policy = Policy::new("api", Quota::per_minute(NonZeroU32::new(3).expect("3")));
    let url = server.url();
    let handle = layer(builder.standalone(&url).await.expect("store"), policy);
    let addr = ratekeeper_tests::spawn(app(handle.clone())).await;
    let client = client();
    // Warm the connection on another key, so the test starts with a connected store.
    assert_eq!(get_key(&client, addr, "warm").await.status, 200);

    server.signal("STOP");
    let start = Instant::now();
    let mut answers = Vec::new();
    for at in [0, 100, 200, 300, 400] {
        sleep_until(start, at).await;
        answers.push(get_key(&client, addr, "client").await);
    }
    sleep_until(start, u64::try_from(PAUSE.as_millis()).expect("ms")).await;
    server.signal("CONT");
    // Redis has recovered once it answers again: the store's prober has made a fresh
    // connection ready and closed the breaker.
    wait_ready(handle.store()).await;
    // Stats before R6: R1..R5 were the failure policy's.
    let degraded = handle.store().stats().degraded;
    // R6, sent again (at most 20 times) while a loaded machine makes Redis answer later
    // than the deadline: the first answer Redis decides.
    let mut late = 0;
    let r6 = loop {
        let a = get_key(&client, addr, "client").await;
        // "ok": the handler saw no degraded marker, so Redis decided (and allowed).
        if a.body == "ok" || late == 20 {
            break a;
        }
        late += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    answers.push(r6);
    for (i, a) in answers.iter().enumerate().take(3) {
        assert!(
            a.server >= DEADLINE,
            "R{} was answered before its deadline: {a:?}",
            i + 1
        );
    }
    assert_within_deadline(&answers[..5]);
    for a in &answers {
        assert_ne!(a.status, 500);
        assert!(a.took < HUNG, "{a:?}");
    }
    // R6: decided by Redis: 200, Remaining 2 (R1..R5 were not counted; an R6 sent again
    // because Redis answered after its deadline may have been, one unit each).
    let r6 = &answers[5];
    assert_eq!(r6.status, 200, "R6 {r6:?}");
    let remaining = r6.remaining.expect("R6 decided by Redis");
    assert!(
        remaining <= 2 && remaining + late >= 2,
        "R6 {r6:?} after {late} late tries"
    );
    assert_eq!(r6.body, "ok");
    assert_eq!(degraded, 5);
    answers
}

/// Waits until `store` reports a ready connection and a closed breaker (its prober
/// reconnects once Redis answers again): at most 10 s, checked every 10 ms.
async fn wait_ready(store: &RedisStore) {
    for _ in 0..1_000 {
        if store.is_ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store is not ready 10 s after Redis recovered");
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>), fail open: R1..R5 pass as degraded decisions, with no made-up Remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_or_slow_fails_open() {
    let answers = redis_down_or_slow(FailurePolicy::Allow, None).await;
    for a in &answers[..5] {
        assert_eq!(a.status, 200);
        // No Remaining made up from a failed call; the handler saw the degraded marker.
        assert_eq!(a.remaining, None);
        assert_eq!(a.body, "degraded");
    }
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>), fail closed: R1..R5 get 503, with no made-up Remaining, and say when to
/// retry: `Retry-After: 1` (the layer's default, the breaker's 500 ms open period rounded
/// up) and a problem+json body of the temporary-reduced-capacity type naming the same wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_or_slow_fails_closed() {
    let answers = redis_down_or_slow(FailurePolicy::Deny, None).await;
    for a in &answers[..5] {
        assert_eq!(a.status, 503, "{a:?}");
        assert_eq!(a.remaining, None);
        assert_eq!(a.retry_after, Some(1), "{a:?}");
        let problem: serde_json::Value = serde_json::from_str(&a.body).expect("problem+json");
        assert_eq!(
            problem["type"],
            ratekeeper_axum::report::TEMPORARY_REDUCED_CAPACITY_TYPE,
            "{a:?}"
        );
        assert_eq!(problem["status"], 503);
        assert_eq!(
            problem["detail"],
            "the rate limiter cannot decide now (its store is unavailable); retry after 1 s"
        );
    }
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>): the in-memory fallback is a fixed window of 2 per 60 000 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_or_slow_falls_back_to_the_local_limiter() {
    let local = Policy::new(
        "api",
        Quota::new(2, Duration::from_secs(60)).expect("quota"),
    )
    .with_algorithm(ratekeeper_axum::core::Algorithm::FixedWindow);
    let answers = redis_down_or_slow(FailurePolicy::Local, Some(local)).await;
    assert_eq!((answers[0].status, answers[0].remaining), (200, Some(1)));
    assert_eq!((answers[1].status, answers[1].remaining), (200, Some(0)));
    for a in &answers[2..5] {
        assert_eq!((a.status, a.retry_after), (429, Some(60)), "{a:?}");
    }
}

/// Redis down or slow (<https://github.com/envoyproxy/ratelimit/issues/462>), degrade: R1..R5 are served by the axum fallback, with no made-up Remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_or_slow_degrade_reaches_the_fallback_hook() {
    let answers = redis_down_or_slow(FailurePolicy::Degrade, None).await;
    for a in &answers[..5] {
        assert_eq!((a.status, a.body.as_str()), (200, "fallback"), "{a:?}");
        assert_eq!(a.remaining, None);
    }
}

/// Sends requests from `workers` tasks until `stop` is set (at most `limit`); returns every
/// answer in completion order. Worker 0 sends the key `probe` (the key [`wait_recovered`]
/// sends, whose Cluster slot the failover test pauses), the others `w<n>`.
fn start_load(
    addr: std::net::SocketAddr,
    workers: usize,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> tokio::task::JoinHandle<Vec<Answer>> {
    tokio::spawn(async move {
        let client = client();
        let begin = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..workers {
            let client = client.clone();
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) && begin.elapsed() < limit {
                    let key = if w == 0 {
                        "probe".to_owned()
                    } else {
                        format!("w{w}")
                    };
                    out.push(get_key(&client, addr, &key).await);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                out
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("load task"));
        }
        all
    })
}

/// Waits (at most `limit`) until a request is decided by Redis again (it carries
/// X-RateLimit-Remaining); returns how long that took.
async fn wait_recovered(addr: std::net::SocketAddr, limit: Duration) -> Duration {
    let client = client();
    let start = Instant::now();
    while start.elapsed() < limit {
        if get_key(&client, addr, "probe").await.remaining.is_some() {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store did not recover within {limit:?}");
}

fn big_quota() -> Policy {
    Policy::new(
        "api",
        Quota::per_second(NonZeroU32::new(1_000_000).expect("n")),
    )
}

/// Serves [`app`] with [`big_quota`] on the store `connect` makes, and waits (at most 5 s)
/// until Redis decides a request; returns the server's address and a clone of the layer
/// (for the store's stats).
async fn serve_decided<F>(connect: F) -> (std::net::SocketAddr, Layer)
where
    F: Future<Output = RedisStore>,
{
    let layer = layer(connect.await, big_quota());
    let addr = ratekeeper_tests::spawn(app(layer.clone())).await;
    wait_recovered(addr, Duration::from_secs(5)).await;
    (addr, layer)
}

/// A crash under load: Redis is paused for [`PAUSE`] (requests in flight and new ones wait
/// for the deadline, then the breaker answers), then killed (`kill -9`) and restarted
/// empty. Fail open answers every request with 200, the ones that waited at their deadline
/// and none later than the deadline and [`SLACK`]; the store counts the degraded decisions
/// and recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_under_load_fails_open_within_the_deadline_and_recovers() {
    let mut server = RedisServer::start();
    let url = server.url();
    let (addr, handle) = serve_decided(async {
        store(FailurePolicy::Allow)
            .standalone(&url)
            .await
            .expect("store")
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(addr, 4, Arc::clone(&stop), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("STOP");
    tokio::time::sleep(PAUSE).await;
    tokio::task::block_in_place(|| server.kill());
    let degraded_while_down = handle.store().stats().degraded;
    tokio::task::block_in_place(|| server.restart());
    wait_recovered(addr, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = load.await.expect("load");

    assert!(degraded_while_down > 0, "no degraded decision counted");
    assert!(
        answers.iter().all(|a| a.status == 200),
        "fail open answers 200"
    );
    assert_some_waited_for_the_deadline(&answers);
    assert_within_deadline(&answers);
    assert!(answers.iter().any(|a| a.remaining.is_some()));
}

/// Redis paused for [`PAUSE`] under load, fail closed: 503s while it is paused, the ones
/// that waited at their deadline and none later than the deadline and [`SLACK`]; then the
/// store recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_fails_closed_within_the_deadline_then_recovers() {
    let server = RedisServer::start();
    let url = server.url();
    let (addr, handle) = serve_decided(async {
        store(FailurePolicy::Deny)
            .standalone(&url)
            .await
            .expect("store")
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(addr, 4, Arc::clone(&stop), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("STOP");
    tokio::time::sleep(PAUSE).await;
    server.signal("CONT");
    wait_recovered(addr, Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = load.await.expect("load");

    let unavailable = answers.iter().filter(|a| a.status == 503).count();
    assert!(
        unavailable > 0,
        "fail closed answers 503 while Redis is stopped"
    );
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 503));
    assert_some_waited_for_the_deadline(&answers);
    assert_within_deadline(&answers);
    assert!(handle.store().stats().degraded >= u64::try_from(unavailable).unwrap_or(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_reloads_the_script_without_errors() {
    let server = RedisServer::start();
    // About reloading the script, not the deadline: a slow round trip on a loaded machine
    // must not read as a failure.
    let mut store = store(FailurePolicy::Deny)
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    let api = ratekeeper_axum::core::store::Store::register(
        &mut store,
        &Policy::new("api", Quota::per_minute(NonZeroU32::new(3).expect("3"))),
    )
    .expect("register");
    let key = Key::from("flush");
    let mut remaining = Vec::new();
    for i in 0..4 {
        if i == 2 {
            assert_eq!(
                server.cli(&["SCRIPT", "FLUSH"]).as_deref().map(str::trim),
                Some("OK")
            );
        }
        let d = store
            .check_async(&[(api, key.clone(), 1)])
            .await
            .expect("decided by Redis after SCRIPT FLUSH");
        remaining.push((d.is_allowed(), d.as_slice()[0].remaining()));
    }
    assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    assert_eq!(store.stats().degraded, 0);
}

/// The calls and usec of one command in `INFO commandstats` (`cmdstat_<name>`), 0 when
/// Redis has not run it.
fn command_calls(server: &RedisServer, name: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]).unwrap_or_default();
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// Redis 7 serves the store's decisions as `FCALL`s of its function library; after a
/// `FUNCTION FLUSH` the store loads the library again and the call answers, with no
/// decision lost to the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_reloads_the_library_without_errors() {
    let server = RedisServer::start();
    let mut store = store(FailurePolicy::Deny)
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    let api = ratekeeper_axum::core::store::Store::register(
        &mut store,
        &Policy::new("api", Quota::per_minute(NonZeroU32::new(3).expect("3"))),
    )
    .expect("register");
    let key = Key::from("flush");
    let mut remaining = Vec::new();
    for i in 0..4 {
        if i == 2 {
            assert_eq!(
                server.cli(&["FUNCTION", "FLUSH"]).as_deref().map(str::trim),
                Some("OK")
            );
        }
        let d = store
            .check_async(&[(api, key.clone(), 1)])
            .await
            .expect("decided by Redis after FUNCTION FLUSH");
        remaining.push((d.is_allowed(), d.as_slice()[0].remaining()));
    }
    assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    assert_eq!(store.stats().degraded, 0);
    // Every decision was a function call (the one that found the library flushed was sent
    // again), none a script.
    assert!(command_calls(&server, "fcall") >= 4);
    assert_eq!(command_calls(&server, "evalsha"), 0);
}

/// A Redis that does not take the function library (here a user denied `FUNCTION`, as a
/// Redis 6 has no functions) is served with `EVALSHA` of the same code: the same
/// decisions, none lost to the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_functions_is_served_with_evalsha() {
    let server = RedisServer::start();
    assert_eq!(
        server
            .cli(&[
                "ACL",
                "SETUSER",
                "app",
                "on",
                ">secret",
                "~*",
                "&*",
                "+@all",
                "-function"
            ])
            .as_deref()
            .map(str::trim),
        Some("OK")
    );
    let url = format!("redis://app:secret@127.0.0.1:{}/", server.port());
    let mut store = store(FailurePolicy::Deny)
        .deadline(DECISION_DEADLINE)
        .standalone(&url)
        .await
        .expect("store");
    let api = ratekeeper_axum::core::store::Store::register(
        &mut store,
        &Policy::new("api", Quota::per_minute(NonZeroU32::new(3).expect("3"))),
    )
    .expect("register");
    let key = Key::from("no-functions");
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let d = store
            .check_async(&[(api, key.clone(), 1)])
            .await
            .expect("decided by Redis with EVALSHA");
        remaining.push((d.is_allowed(), d.as_slice()[0].remaining()));
    }
    assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    assert_eq!(store.stats().degraded, 0);
    // Every decision Redis made was an `EVALSHA` (the last denial may be the negative
    // cache's), none a function call.
    assert_eq!(command_calls(&server, "fcall"), 0);
    let decided = store.stats().redis_decisions;
    assert!(decided >= 3, "{decided} decisions by Redis");
    assert_eq!(command_calls(&server, "evalsha"), decided);
}

/// A Cluster failover of a paused primary under load: the primary of the `probe` key's
/// slot is paused (`SIGSTOP`, so requests to it wait) for [`PAUSE`], a replica takes over
/// after the node timeout (1 s), then the paused primary is killed, and the store follows
/// the new primary.
/// Every request is answered with 200, the ones on the paused slot at their deadline and
/// none later than the deadline and [`SLACK`] (without a deadline they would wait for the
/// paused primary until it is killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_of_a_paused_primary_keeps_answering_and_recovers() {
    let mut cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let (addr, handle) = serve_decided(async {
        // Building checks every primary within the decision deadline; on a loaded machine
        // one attempt may miss it (the store is fine): at most 5 attempts.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match RedisStore::builder()
                .deadline(DEADLINE)
                .on_failure(FailurePolicy::Allow)
                .stale_tolerance(Duration::ZERO)
                .cluster(&nodes)
                .await
            {
                Ok(store) => break store,
                Err(err) if attempts < 5 => {
                    eprintln!("cluster store, attempt {attempts}: {err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => panic!("cluster store after {attempts} attempts: {err:?}"),
            }
        }
    })
    .await;
    let probe_key = "rl:v2:{s:probe}:api";

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(addr, 4, Arc::clone(&stop), Duration::from_secs(40));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let primary = cluster.primary_for(probe_key);
    cluster.nodes[primary].signal("STOP");
    // A replica takes over after the node timeout (1 s) while the primary is paused; then
    // the paused primary crashes (`kill -9`), and the store follows the new one.
    tokio::time::sleep(PAUSE).await;
    tokio::task::block_in_place(|| cluster.nodes[primary].kill());
    wait_recovered(addr, Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = load.await.expect("load");

    assert!(answers.iter().all(|a| a.status == 200));
    assert_some_waited_for_the_deadline(&answers);
    assert_within_deadline(&answers);
    let stats = handle.store().stats();
    assert!(stats.redis_decisions > 0 && stats.errors > 0, "{stats:?}");
}

/// The stale guard (one time source, the other half of the app-clock-skew test): a check sent while Redis is
/// paused is answered by the failure policy at its deadline; when Redis resumes and finally
/// runs the queued script, the guard (in Redis time, learned from earlier replies) makes it
/// do nothing, so the request is not charged a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_reaching_redis_after_its_deadline_charges_nothing() {
    let server = RedisServer::start();
    // The paused call must outlive its deadline and the others must not: 2 s, which no
    // round trip on a loaded machine takes (50 ms did: the warm-up read as a timeout).
    // The queued script still reaches Redis after the deadline (the failure answer comes
    // at the deadline, CONT 300 ms after it), so the stale guard is what keeps it idle.
    let mut store = store(FailurePolicy::Allow)
        .deadline(Duration::from_secs(2))
        .breaker(1_000, Duration::from_millis(1))
        .standalone(&server.url())
        .await
        .expect("store");
    let api = ratekeeper_axum::core::store::Store::register(
        &mut store,
        &Policy::new("api", Quota::per_hour(NonZeroU32::new(1).expect("1"))),
    )
    .expect("register");
    // A first reply teaches the guard Redis's time.
    let warm = store
        .check_async(&[(api, Key::from("warm"), 1)])
        .await
        .expect("decided by Redis");
    assert!(warm.is_allowed());

    let key = Key::from("late");
    server.signal("STOP");
    let err = store
        .check_async(&[(api, key.clone(), 1)])
        .await
        .expect_err("Redis is paused: the failure policy answers");
    assert!(err.is_unavailable(), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("CONT");
    // The queued script has run by the time Redis answers a later command on the same
    // connection (one connection, in order).
    let d = store
        .check_async(&[(api, key.clone(), 1)])
        .await
        .expect("decided by Redis after CONT");
    assert!(
        d.is_allowed(),
        "the late call charged the quota of 1: {d:?}"
    );
    let stats = store.stats();
    assert_eq!((stats.degraded, stats.redis_decisions), (1, 2), "{stats:?}");
}

/// A Cluster with a primary down is not ready until its replica takes over: the prober's
/// fresh connection reaches the other primaries, but readiness asks every primary the slot
/// map names, so the breaker stays open (every decision answered at once by the failure
/// policy, none waiting on the dead slot) until the promotion, and then the store recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_primary_down_is_not_ready_until_its_replica_takes_over() {
    let mut cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    // One failure opens the breaker, and for longer than the failover takes: only the
    // prober can close it in this test.
    let mut store = store(FailurePolicy::Allow)
        .breaker(1, Duration::from_secs(60))
        .cluster(&nodes)
        .await
        .expect("cluster store");
    let api = ratekeeper_axum::core::store::Store::register(
        &mut store,
        &Policy::new(
            "api",
            Quota::per_hour(NonZeroU32::new(1_000).expect("1000")),
        ),
    )
    .expect("register");
    let key = Key::from("dead-slot");
    let redis_key = store.redis_key(api, &key).expect("redis key");
    store
        .check_async(&[(api, key.clone(), 1)])
        .await
        .expect("decided by Redis before the fault");
    assert!(store.is_ready());

    let primary = cluster.primary_for(&redis_key);
    let port = cluster.nodes[primary].port().to_string();
    let replica = cluster
        .nodes
        .iter()
        .position(|n| {
            n.cli(&["ROLE"]).is_some_and(|r| {
                let mut lines = r.lines();
                lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str())
            })
        })
        .expect("the primary has a replica");
    tokio::task::block_in_place(|| cluster.nodes[primary].kill());

    // Until the replica is a primary of a Cluster that is ok again (at most 20 s).
    let began = Instant::now();
    let mut first_failure = None;
    let mut after_open = 0u32;
    loop {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "no promotion within 20 s"
        );
        let promoted = tokio::task::block_in_place(|| {
            cluster.nodes[replica]
                .cli(&["ROLE"])
                .is_some_and(|r| r.starts_with("master"))
        });
        if promoted {
            break;
        }
        let sent = Instant::now();
        let result = store.check_async(&[(api, key.clone(), 1)]).await;
        let took = sent.elapsed();
        if first_failure.is_none() {
            if let Err(err) = &result {
                assert!(err.is_unavailable(), "{err:?}");
                first_failure = Some(began.elapsed());
            }
        } else {
            // Once the breaker opened, it stays open: nothing waits on the dead slot, and
            // the store does not read as ready while the slot has no primary.
            let err = result.expect_err("the breaker is open while the slot is down");
            assert!(err.is_unavailable(), "{err:?}");
            assert!(
                took < DEADLINE,
                "a decision waited {took:?} with the breaker open"
            );
            assert!(
                store.is_breaker_open(),
                "the breaker closed before the promotion"
            );
            assert!(!store.is_ready(), "ready before the promotion");
            after_open += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first_failure.is_some(), "the dead slot never failed");
    assert!(after_open > 0, "no decision while the slot was down");

    // The replica took over: the prober makes a connection ready and closes the breaker.
    let promoted_at = Instant::now();
    while !store.is_ready() {
        assert!(
            promoted_at.elapsed() < Duration::from_secs(20),
            "not ready 20 s after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let d = store
        .check_async(&[(api, key.clone(), 1)])
        .await
        .expect("decided by Redis after the promotion");
    assert!(d.is_allowed());
}
