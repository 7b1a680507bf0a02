//! The tiered (lease) store against real `redis-server` processes: 2, 4 and 8 instances on
//! one hot key stay within `quota ± instances × N` per window, cold keys decide exactly like
//! the Redis store, every key the lease script writes has a TTL, unused units go back to
//! Redis, unsupported algorithms are refused, and a dead Redis falls back by the failure
//! policy.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::tiered::{TieredConfigError, TieredStore};
use ratekeeper_axum::core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_axum::{core::Algorithm, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::TestServer;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};

// The `distributed` example app itself, shared with the other modules (see `main.rs`).
use crate::distributed;

fn quota(limit: u32, period_ms: u64, burst: u32) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .and_then(|q| q.with_burst(burst))
        .expect("valid quota")
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

async fn check<S: Store<Key>>(store: &S, policy: PolicyId, key: &Key, cost: u64) -> Decisions {
    match store.check(&[Charge::new(policy, key, cost)]) {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    }
    .expect("decides")
}

/// The lease size of the hammer tests.
const N: u64 = 10;
/// Window length of the hammer tests, µs.
const W_US: u64 = 1_000_000;

/// `instances` tiered stores (each with its own Redis connection) hammer one key with two
/// callers each for `run`; returns every admission's and every denial's time in Redis
/// `TIME` µs (as each store learned it from its replies), each sorted.
async fn hammer(
    server: &RedisServer,
    instances: usize,
    policy: &Policy,
    run: Duration,
) -> (Vec<u64>, Vec<u64>) {
    let mut stores = Vec::new();
    for _ in 0..instances {
        let redis = RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("redis store");
        let mut store = TieredStore::builder()
            .max_lease(nz(u32::try_from(N).expect("small")))
            .lease_period(Duration::from_millis(50))
            .lease_ttl(Duration::from_secs(1))
            .build(redis)
            .expect("tiered store");
        let id = store.register(policy).expect("register");
        stores.push((Arc::new(store), id));
    }
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for (store, id) in &stores {
        for _ in 0..2 {
            let store = Arc::clone(store);
            let id = *id;
            tasks.push(tokio::spawn(async move {
                let key = Key::from("hot");
                let (mut admitted, mut denied) = (Vec::new(), Vec::new());
                while Instant::now() < end {
                    let d = check(&*store, id, &key, 1).await;
                    let at = u64::try_from(store.unix_now().as_micros()).expect("µs");
                    if d.is_allowed() {
                        admitted.push(at);
                    } else {
                        denied.push(at);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                (admitted, denied)
            }));
        }
    }
    let (mut admitted, mut denied) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, d) = t.await.expect("task");
        admitted.extend(a);
        denied.extend(d);
    }
    admitted.sort_unstable();
    denied.sort_unstable();
    for (store, _) in &stores {
        store.shutdown().await.expect("shutdown");
    }
    (admitted, denied)
}

/// Time in window `w` (µs) when no caller was asking: the gaps between consecutive checks
/// (and from the window's edges) beyond the 2 ms a caller takes between a denial and its
/// next check. On a loaded machine the callers can be kept off the CPU for a good part of
/// a window; units nobody asked for then are not under-admission.
fn idle_in_window(w: u64, admitted: &[u64], denied: &[u64]) -> u64 {
    let (start, end) = (w * W_US, (w + 1) * W_US);
    let mut asks: Vec<u64> = admitted
        .iter()
        .chain(denied)
        .copied()
        .filter(|t| (start..end).contains(t))
        .collect();
    asks.sort_unstable();
    let mut edges = vec![start];
    edges.extend(asks);
    edges.push(end);
    edges
        .windows(2)
        .map(|p| (p[1] - p[0]).saturating_sub(2_000))
        .sum()
}

/// Admissions per aligned window `floor(t / W)`, for the full windows only (the first and the
/// last, partial, are left out).
fn full_windows(times: &[u64]) -> Vec<(u64, usize)> {
    let (Some(first), Some(last)) = (times.first(), times.last()) else {
        return Vec::new();
    };
    let (first, last) = (first / W_US, last / W_US);
    ((first + 1)..last)
        .map(|w| (w, times.iter().filter(|t| **t / W_US == w).count()))
        .collect()
}

/// The most admissions in any window `[t, t + W)` starting at an admission.
fn busiest_sliding_window(times: &[u64]) -> usize {
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while j < times.len() && times[j] < times[i] + W_US {
            j += 1;
        }
        best = best.max(j - i);
    }
    best
}

/// GCRA 200/s, burst 20: the Redis store alone admits at most `burst + W / T` = 220 in any
/// 1 s window, and 200 per window at steady saturation.
async fn gcra_bound(instances: usize) {
    let server = RedisServer::start();
    let policy = Policy::new("gcra", quota(200, 1_000, 20));
    let (times, denied) = hammer(&server, instances, &policy, Duration::from_millis(3_300)).await;
    let slack = instances * N as usize;
    let busiest = busiest_sliding_window(&times);
    assert!(
        busiest <= 221 + slack,
        "{instances} instances: {busiest} admitted in one 1 s window, bound 221 + {slack}"
    );
    let windows = full_windows(&times);
    eprintln!(
        "GCRA, {instances} instances: busiest 1 s window {busiest}, full windows {windows:?}"
    );
    assert!(windows.len() >= 2, "{windows:?}");
    for (w, count) in &windows {
        // The lower bound holds under steady load; a unit refills every T = 5 ms, so time in
        // which no caller asked (a starved machine) can leave one unit per 5 ms unasked for.
        let idle = idle_in_window(*w, &times, &denied);
        let unasked = usize::try_from(idle / 5_000).expect("small");
        assert!(
            *count + slack + unasked >= 200,
            "{instances} instances, window {w}: {count} admitted, bound 200 - {slack} \
             (- {unasked} units nobody asked for in {idle} µs idle)"
        );
        assert!(*count <= 221 + slack, "window {w}: {count}");
    }
    assert_every_key_has_ttl(&server);
}

/// Fixed window 200 per 1 s: each aligned window admits between 200 - I × N and 200 + I × N.
async fn fixed_window_bound(instances: usize) {
    let server = RedisServer::start();
    let policy = Policy::new("fw", quota(200, 1_000, 200)).with_algorithm(Algorithm::FixedWindow);
    let (times, denied) = hammer(&server, instances, &policy, Duration::from_millis(3_300)).await;
    let slack = instances * N as usize;
    let windows = full_windows(&times);
    eprintln!("fixed window, {instances} instances: full windows {windows:?}");
    assert!(windows.len() >= 2, "{windows:?}");
    for (w, count) in &windows {
        assert!(
            *count <= 200 + slack,
            "{instances} instances, window {w}: {count} admitted, bound 200 + {slack}"
        );
        // The lower bound holds under steady load: once a check in the window was denied,
        // the only units left are the ones other instances hold (at most I × N). A window
        // without a denial admitted every check a loaded machine let the callers make.
        if denied.iter().any(|t| t / W_US == *w) {
            assert!(
                *count + slack >= 200,
                "{instances} instances, window {w}: {count} admitted, bound 200 - {slack}"
            );
        }
    }
    assert_every_key_has_ttl(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_hot_gcra_key_stay_within_quota_plus_minus_instances_times_n() {
    gcra_bound(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_on_one_hot_gcra_key_stay_within_quota_plus_minus_instances_times_n() {
    gcra_bound(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_on_one_hot_gcra_key_stay_within_quota_plus_minus_instances_times_n() {
    gcra_bound(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_hot_fixed_window_key_stay_within_the_bounds() {
    fixed_window_bound(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_on_one_hot_fixed_window_key_stay_within_the_bounds() {
    fixed_window_bound(8).await;
}

/// Every `rl:*` key on `server` has a TTL (PTTL > 0; -1 would be a key that never expires;
/// -2 is a key that expired between `KEYS` and `PTTL`, which is fine). A key read at PTTL 0
/// expires within the millisecond: it is read again (every 2 ms, at most 100 times) until
/// Redis says it is gone or a write gave it a new TTL.
fn assert_every_key_has_ttl(server: &RedisServer) {
    let keys = server.cli(&["KEYS", "rl:*"]).expect("KEYS");
    for k in keys.lines().filter(|l| !l.is_empty()) {
        let mut ttl = pttl(server, k);
        for _ in 0..100 {
            if ttl != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
            ttl = pttl(server, k);
        }
        assert!(ttl > 0 || ttl == -2, "key {k} has PTTL {ttl}");
    }
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cli(&["PTTL", key])
        .and_then(|s| s.trim().parse().ok())
        .expect("PTTL")
}

/// Cold keys (one request per second, so N = 1) are decided by the Redis store itself: the
/// same decisions, remaining, reset and retry as a plain Redis store on the same timeline,
/// for GCRA and the fixed window, costs 1 to 3, denials included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_keys_decide_exactly_like_the_redis_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let build = async || {
        RedisStore::builder()
            .clock(clock.clone())
            .min_ttl(Duration::from_secs(120))
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("redis store")
    };
    let policies = [
        // T = 2.5 s: a whole µs (the Redis store refuses a rate it cannot keep exactly).
        Policy::new("gcra", quota(4, 10_000, 3)),
        Policy::new("fw", quota(4, 5_000, 4)).with_algorithm(Algorithm::FixedWindow),
    ];
    let mut plain = build().await;
    let mut tiered = TieredStore::builder().build(build().await).expect("tiered");
    let mut ids = Vec::new();
    for p in &policies {
        let a = plain.register(p).expect("register");
        let b = tiered.register(p).expect("register");
        assert_eq!(a, b);
        ids.push(a);
    }
    let costs = [1, 1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 3, 1, 2, 1, 1];
    let (a, b) = (Key::from("plain"), Key::from("tiered"));
    let mut denied = 0;
    for (i, cost) in costs.iter().enumerate() {
        for id in &ids {
            let expected = check(&plain, *id, &a, *cost).await;
            let got = check(&tiered, *id, &b, *cost).await;
            assert_eq!(got, expected, "step {i}, cost {cost}, policy {id:?}");
            denied += usize::from(!expected.is_allowed());
        }
        clock.advance(Duration::from_millis(1_000));
    }
    assert!(
        denied >= 4,
        "the trace must reach the limits ({denied} denials)"
    );
    let stats = tiered.stats();
    assert_eq!(stats.round_trips, stats.decisions, "{stats:?}");
    assert_eq!(stats.local, 0, "{stats:?}");
}

/// The keys a lease writes carry a TTL: GCRA until the TAT, the fixed window until the window
/// ends (PTTL checked on each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_the_lease_script_writes_has_a_ttl() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let mut store = TieredStore::builder().build(redis).expect("tiered");
    // T = 1 s: 50 units leased put the TAT about 50 s ahead.
    let gcra = store
        .register(&Policy::new("gcra", quota(1_000, 1_000_000, 1_000)))
        .expect("register");
    let fw = store
        .register(
            &Policy::new("fw", quota(1_000, 60_000, 1_000)).with_algorithm(Algorithm::FixedWindow),
        )
        .expect("register");
    let key = Key::from("ttl");
    for _ in 0..50 {
        assert!(check(&store, gcra, &key, 1).await.is_allowed());
        assert!(check(&store, fw, &key, 1).await.is_allowed());
    }
    assert!(store.held(gcra, &key) > 0, "a lease is live");
    let stats = store.stats();
    assert!(stats.local > 50, "{stats:?}");
    let gcra_key = store.redis().redis_key(gcra, &key).expect("key");
    let fw_key = store.redis().redis_key(fw, &key).expect("key");
    let ttl = pttl(&server, &gcra_key);
    assert!(ttl > 40_000 && ttl <= 1_000_000, "GCRA PTTL {ttl}");
    let ttl = pttl(&server, &fw_key);
    assert!(ttl > 0 && ttl <= 60_000, "fixed window PTTL {ttl}");
    assert_every_key_has_ttl(&server);
}

/// Unused units go back to Redis on shutdown, and a refund of a locally spent unit goes back
/// into the lease: a plain Redis store then sees exactly the units that were spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_units_go_back_to_redis_and_refunds_go_back_into_the_lease() {
    let server = RedisServer::start();
    let policy = Policy::new("api", quota(100, 1_000_000, 100)); // T = 10 s
    let mut plain = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let plain_id = plain.register(&policy).expect("register");
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let mut store = TieredStore::builder().build(redis).expect("tiered");
    let id = store.register(&policy).expect("register");
    let key = Key::from("alice");
    let mut last = None;
    for _ in 0..8 {
        let d = check(&store, id, &key, 1).await;
        assert!(d.is_allowed());
        last = Some(d);
    }
    let held = store.held(id, &key);
    assert!(held > 0, "the hot key holds a lease");
    let last = last.expect("decided");
    let receipt = last.receipt(0);
    store.refund(&[Refund::new(Charge::new(id, &key, 1), receipt)]);
    assert_eq!(
        store.held(id, &key),
        held + 1,
        "the refund went back into the lease"
    );
    store.shutdown().await.expect("shutdown");
    assert_eq!(store.held(id, &key), 0);
    assert!(store.stats().returned_units > held);
    // 8 spent, 1 refunded: 7 units charged in Redis; this check takes the 8th.
    let d = plain
        .check_async(&[(plain_id, key.clone(), 1)])
        .await
        .expect("decides");
    assert_eq!(d.as_slice()[0].remaining(), 100 - 8, "{d:?}");
}

/// Only GCRA and the fixed window can be leased; other algorithms are a build-time error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_algorithms_are_refused_when_registered() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let mut store = TieredStore::builder().build(redis).expect("tiered");
    for algorithm in [
        Algorithm::LeakyBucket,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let err = store
            .register(&Policy::new("p", quota(10, 1_000, 10)).with_algorithm(algorithm))
            .expect_err("refused");
        assert!(
            matches!(err, StoreError::UnsupportedAlgorithm(a) if a == algorithm),
            "{err:?}"
        );
        assert!(err.is_config());
    }
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let err = TieredStore::builder()
        .lease_period(Duration::from_millis(500))
        .lease_ttl(Duration::from_millis(100))
        .build(redis)
        .expect_err("a TTL below the period is refused");
    assert!(
        matches!(err, TieredConfigError::TtlBelowPeriod { .. }),
        "{err:?}"
    );
}

/// With Redis gone, cold checks and lease calls alike are answered by the failure policy
/// (here fail-closed), then the breaker opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_falls_back_by_the_failure_policy() {
    let mut server = RedisServer::start();
    let redis = RedisStore::builder()
        .deadline(Duration::from_millis(100))
        .on_failure(FailurePolicy::Deny)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let mut store = TieredStore::builder().build(redis).expect("tiered");
    let id = store
        .register(&Policy::new("api", quota(1_000, 1_000, 1_000)))
        .expect("register");
    server.kill();
    let key = Key::from("k");
    for i in 0..5 {
        let result = match store.check(&[Charge::new(id, &key, 1)]) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        };
        let err = result.expect_err("no decision without Redis");
        assert_eq!(
            err.failure_policy(),
            FailurePolicy::Deny,
            "request {i}: {err}"
        );
        assert!(err.is_unavailable());
    }
    let stats = store.stats();
    assert!(
        stats.round_trips >= 2,
        "cold and lease paths were both tried: {stats:?}"
    );
    assert_eq!(store.redis().stats().degraded, 5);
    assert!(store.redis().is_breaker_open());
}

/// The `distributed` example with `LEASE=5`: two instances on two ports share one budget
/// through leases. 40 requests from one client, alternating between the instances and
/// several in flight at once: exactly the quota (10 per minute) passes across both, every
/// answer carries the rate-limit headers, and the 429s carry `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_example_with_lease_shares_one_budget_across_two_instances() {
    let server = RedisServer::start();
    let lease = Some(nz(5));
    let mut instances = Vec::new();
    for _ in 0..2 {
        // A 2 s deadline instead of the example's 50 ms: on a loaded test machine a timeout
        // would fail open (200 without headers) and blur the count.
        let app = distributed::app_with(&server.url(), lease, DECISION_DEADLINE)
            .await
            .expect("app");
        instances.push(Arc::new(TestServer::start(app).await));
    }
    let mut tasks = Vec::new();
    for i in 0..40 {
        let instance = Arc::clone(&instances[i % 2]);
        tasks.push(tokio::spawn(async move {
            let res = instance.get("/").send().await.expect("request");
            let remaining = res.headers().get("x-ratelimit-remaining").is_some();
            let retry = res.headers().get("retry-after").is_some();
            (res.status().as_u16(), remaining, retry)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (status, remaining, retry) = t.await.expect("task");
        assert!(remaining, "status {status} without x-ratelimit-remaining");
        match status {
            200 => ok += 1,
            429 => assert!(retry, "429 without Retry-After"),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        ok, 10,
        "the two instances share one budget of 10 per minute"
    );
}

#[test]
fn the_lease_setting_takes_a_whole_number_of_units() {
    assert_eq!(distributed::parse_lease("5"), Ok(Some(nz(5))));
    assert_eq!(distributed::parse_lease(" 100 "), Ok(Some(nz(100))));
    assert_eq!(distributed::parse_lease("0"), Ok(None));
    assert_eq!(distributed::parse_lease(""), Ok(None));
    assert!(distributed::parse_lease("five").is_err());
    assert!(distributed::parse_lease("-1").is_err());
}

/// Partial grants that shrink near the limit: with 10 units and no refill in sight, a lease
/// never takes more than half of what is left, so two instances alternating on one key both
/// get units, and together they admit exactly the 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_shrink_near_the_limit_and_two_instances_admit_exactly_the_budget() {
    let server = RedisServer::start();
    let policy = Policy::new("api", quota(10, 10_000_000, 10)); // T = 1 000 s
    let mut stores = Vec::new();
    for _ in 0..2 {
        let redis = RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("redis store");
        let mut store = TieredStore::builder()
            .max_lease(nz(100))
            .build(redis)
            .expect("tiered");
        let id = store.register(&policy).expect("register");
        stores.push((store, id));
    }
    let key = Key::from("k");
    let mut allowed = [0; 2];
    let mut most_held = [0; 2];
    for i in 0..40 {
        let (store, id) = &stores[i % 2];
        if check(store, *id, &key, 1).await.is_allowed() {
            allowed[i % 2] += 1;
        }
        most_held[i % 2] = most_held[i % 2].max(store.held(*id, &key));
    }
    assert_eq!(allowed[0] + allowed[1], 10, "{allowed:?}");
    assert!(
        allowed[0] > 0 && allowed[1] > 0,
        "both instances got units: {allowed:?}"
    );
    // The first lease could take at most ceil(10 / 2) = 5, one of them spent at once.
    assert!(most_held[0] <= 4 && most_held[1] <= 4, "{most_held:?}");
    assert!(
        stores.iter().any(|(s, _)| s.stats().local > 0),
        "some requests were answered from leased units"
    );
}

/// Single-flight renewal: 200 checks on one hot key at the same time queue behind one
/// renewal at a time instead of each making a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_an_empty_lease_share_one_renewal_at_a_time() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let mut store = TieredStore::builder()
        .max_lease(nz(100))
        .build(redis)
        .expect("tiered");
    let id = store
        .register(&Policy::new("api", quota(100_000, 1_000, 100_000)))
        .expect("register");
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            check(&*store, id, &Key::from("hot"), 1).await.is_allowed()
        }));
    }
    for t in tasks {
        assert!(t.await.expect("task"));
    }
    let stats = store.stats();
    assert_eq!(stats.decisions, 200);
    assert!(
        stats.round_trips + stats.prefetches <= 20,
        "200 concurrent checks made {} round trips: {stats:?}",
        stats.round_trips + stats.prefetches
    );
}

/// The lease script on Redis Cluster: 3 instances (cluster connections) on one hot key stay
/// within `quota ± 3 × N` per full window, and every key the lease script wrote has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_redis_cluster_stay_within_the_bound() {
    let cluster = ratekeeper_tests::redis::RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let policy = Policy::new("fw", quota(200, 1_000, 200)).with_algorithm(Algorithm::FixedWindow);
    let mut stores = Vec::new();
    for _ in 0..3 {
        let redis = RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .cluster(&nodes)
            .await
            .expect("cluster store");
        let mut store = TieredStore::builder()
            .max_lease(nz(u32::try_from(N).expect("small")))
            .lease_period(Duration::from_millis(50))
            .build(redis)
            .expect("tiered");
        let id = store.register(&policy).expect("register");
        stores.push((Arc::new(store), id));
    }
    let end = Instant::now() + Duration::from_millis(3_300);
    let mut tasks = Vec::new();
    for (store, id) in &stores {
        let store = Arc::clone(store);
        let id = *id;
        tasks.push(tokio::spawn(async move {
            let key = Key::from("hot");
            let mut admitted = Vec::new();
            while Instant::now() < end {
                if check(&*store, id, &key, 1).await.is_allowed() {
                    admitted.push(u64::try_from(store.unix_now().as_micros()).expect("µs"));
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            admitted
        }));
    }
    let mut times = Vec::new();
    for t in tasks {
        times.extend(t.await.expect("task"));
    }
    times.sort_unstable();
    let slack = 3 * N as usize;
    let windows = full_windows(&times);
    eprintln!("cluster, fixed window, 3 instances: full windows {windows:?}");
    assert!(windows.len() >= 2, "{windows:?}");
    for (w, count) in &windows {
        assert!(
            (200 - slack..=200 + slack).contains(count),
            "window {w}: {count} admitted, bounds 200 ± {slack}"
        );
    }
    for (store, _) in &stores {
        store.shutdown().await.expect("shutdown");
    }
    for node in &cluster.nodes {
        if node.cli(&["ROLE"]).is_some_and(|r| r.starts_with("master")) {
            assert_every_key_has_ttl(node);
        }
    }
}

/// What happened when one client's traffic moved from instance A to instance B.
#[derive(Debug)]
struct Moved {
    /// Admitted on A (its requests in a row).
    a: usize,
    /// Admitted on B when the client's first burst arrived there (all at once).
    b_at_once: usize,
    /// Admitted on B afterwards: its retries (if any) and its burst 2.5 s later (past A's
    /// lease TTL and one sweeper period).
    b_later: usize,
    /// Units A held when the client moved (a background renewal may still be in flight).
    a_held_when_moved: u64,
    /// Units A gave back to Redis by the end, and units it still held then.
    a_returned: u64,
    a_held_at_end: u64,
    /// The `retry_after` of B's first denial, if any.
    b_first_retry: Option<Duration>,
}

/// A client moving between instances (the timeline of the report
/// <https://github.com/envoyproxy/ratelimit/issues/1077>) on two tiered stores with the
/// default lease settings (TTL 1 s, period 100 ms, at most 100 units): GCRA `limit` per
/// `limit × 1 000 s`, burst `limit` (T = 1 000 s, nothing refills during the test). A takes
/// `on_a` requests in a row; then the client sends `limit` requests at once to B; then
/// (with `retry_every`) one more to B at that pace; 2.5 s after the burst `limit` more to
/// B. A never sees the key again.
async fn move_client(
    server: &RedisServer,
    limit: u32,
    on_a: usize,
    retry_every: Option<Duration>,
) -> Moved {
    let policy = Policy::new("api", quota(limit, u64::from(limit) * 1_000_000, limit));
    let mut stores = Vec::new();
    for _ in 0..2 {
        let redis = RedisStore::builder()
            .deadline(Duration::from_secs(2))
            .standalone(&server.url())
            .await
            .expect("redis store");
        let mut store = TieredStore::builder().build(redis).expect("tiered");
        let id = store.register(&policy).expect("register");
        stores.push((Arc::new(store), id));
    }
    let key = Key::from("client:1");
    let (a, id) = (&stores[0].0, stores[0].1);
    let mut on_a_admitted = 0;
    for _ in 0..on_a {
        on_a_admitted += usize::from(check(&**a, id, &key, 1).await.is_allowed());
    }
    let a_held_when_moved = a.held(id, &key);
    let b = &stores[1].0;
    let burst = async || {
        let tasks: Vec<_> = (0..limit)
            .map(|_| {
                let (b, key) = (Arc::clone(b), key.clone());
                tokio::spawn(async move { check(&*b, id, &key, 1).await })
            })
            .collect();
        let mut decisions = Vec::new();
        for t in tasks {
            decisions.push(t.await.expect("check task"));
        }
        decisions
    };
    let first = burst().await;
    let b_first_retry = first
        .iter()
        .find(|d| !d.is_allowed())
        .and_then(|d| d.as_slice()[0].retry_after());
    let later_at = tokio::time::Instant::now() + Duration::from_millis(2_500);
    let mut retries_admitted = 0;
    if let Some(every) = retry_every {
        while tokio::time::Instant::now() + every < later_at {
            tokio::time::sleep(every).await;
            retries_admitted += usize::from(check(&**b, id, &key, 1).await.is_allowed());
        }
    }
    tokio::time::sleep_until(later_at).await;
    let later = burst().await;
    let admitted = |ds: &[Decisions]| ds.iter().filter(|d| d.is_allowed()).count();
    Moved {
        a: on_a_admitted,
        b_at_once: admitted(&first),
        b_later: retries_admitted + admitted(&later),
        a_held_when_moved,
        a_returned: a.stats().returned_units,
        a_held_at_end: a.held(id, &key),
        b_first_retry,
    }
}

/// A client stranded on another instance (<https://github.com/envoyproxy/ratelimit/issues/1077>),
/// the documented promise: a client moves from instance A (6 requests) to instance B. B admits at
/// least `redis(W) - instances × max_lease` at once, and over the run the client gets exactly its
/// budget of 10: no unit stays stranded on A, which never sees the key again, and B's remembered
/// denial does not outlive A's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moved_to_another_instance_gets_its_whole_budget_within_the_lease() {
    let server = RedisServer::start();
    let moved = move_client(&server, 10, 6, None).await;
    eprintln!("{moved:?}");
    assert_eq!(moved.a, 6, "{moved:?}");
    let owed = 10 - 6;
    assert!(
        moved.b_at_once as i64 >= owed - 2 * 100,
        "the documented lower bound: {moved:?}"
    );
    assert_eq!(moved.a + moved.b_at_once + moved.b_later, 10, "{moved:?}");
    assert_eq!(moved.a_held_at_end, 0, "{moved:?}");
}

/// A client stranded on another instance (<https://github.com/envoyproxy/ratelimit/issues/1077>),
/// the strict values: B admits at once the 4 units the client is still owed (A, in the lower half
/// of the bucket, holds none unspent), nothing more later: 10 in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moved_to_another_instance_gets_what_it_is_owed_at_once() {
    let server = RedisServer::start();
    let moved = move_client(&server, 10, 6, None).await;
    eprintln!("{moved:?}");
    assert_eq!(moved.a, 6, "{moved:?}");
    assert_eq!(moved.a_held_when_moved, 0, "{moved:?}");
    assert_eq!(
        moved.a_returned, 0,
        "A never held a unit it did not spend: {moved:?}"
    );
    assert_eq!(moved.b_at_once, 4, "{moved:?}");
    assert_eq!(moved.b_later, 0, "{moved:?}");
    assert_eq!(moved.a + moved.b_at_once + moved.b_later, 10, "{moved:?}");
}

/// A client stranded on another instance (<https://github.com/envoyproxy/ratelimit/issues/1077>),
/// units taken ahead in the upper half of the bucket (burst 100): A holds units unspent when the
/// client moves. Its background sweeper gives them back within the lease TTL and one period
/// although A never sees the key again, and B's denial from the burst (the Redis state alone would
/// say hundreds of seconds, as it counts A's units) tells the client to come back when A's units
/// are back, not later, and is not remembered past that although the client keeps retrying on B
/// every 100 ms: B admits exactly the units A returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_an_instance_leased_come_home_although_it_never_sees_the_key_again() {
    let server = RedisServer::start();
    let moved = move_client(&server, 100, 6, Some(Duration::from_millis(100))).await;
    eprintln!("{moved:?}");
    assert_eq!(moved.a, 6, "{moved:?}");
    assert!(
        moved.a_returned > 0,
        "A took units ahead in the upper half and gave them back: {moved:?}"
    );
    assert_eq!(moved.a_held_at_end, 0, "{moved:?}");
    assert_eq!(moved.a + moved.b_at_once + moved.b_later, 100, "{moved:?}");
    assert!(
        moved.b_later as u64 <= moved.a_returned,
        "B admitted later only what came back: {moved:?}"
    );
    let retry = moved
        .b_first_retry
        .expect("B's burst was denied once it had taken the rest");
    // Lease TTL 1 s, period 100 ms, then the give-back's deadline (2 s) and stale tolerance
    // (100 ms).
    assert!(retry <= Duration::from_millis(3_200), "{moved:?}");
}

/// The lease TTL, sweeper period, Redis deadline and stale tolerance (default) of the
/// tests of a denial's `retry_after` while units are leased.
const LEASED_TTL: Duration = Duration::from_secs(1);
const LEASED_PERIOD: Duration = Duration::from_millis(100);
const LEASED_DEADLINE: Duration = Duration::from_secs(1);
const STALE_TOLERANCE: Duration = Duration::from_millis(100);

/// What B answered a client that moved there from A.
#[derive(Debug)]
struct FirstDenial {
    /// Units A held, unspent, when the client moved.
    a_held: u64,
    /// B's admissions before its first denial.
    b_admitted: usize,
    /// Whether the client's retry, made `retry` after that denial, was admitted.
    retry_admitted: bool,
}

/// Two tiered stores (lease TTL `ttl`, period 100 ms, deadline 1 s) on one Redis, GCRA 10 per
/// 10 000 000 ms with burst `burst` (T = 1 000 s: nothing refills during the test), key
/// `client:1`. A takes 6 requests in a row (it leases units ahead, in the upper half of the
/// bucket) and never sees the key again; the client moves to B and sends one request every
/// `pace` until the first denial (at most `burst` + 1 requests), whose `retry_after` must be
/// at most `ttl` + period + deadline + stale tolerance (asserted before the client waits it),
/// waits it, and retries once.
async fn first_denial_on_b(
    server: &RedisServer,
    burst: u32,
    ttl: Duration,
    pace: Duration,
) -> FirstDenial {
    let policy = Policy::new("api", quota(10, 10_000_000, burst));
    let mut stores = Vec::new();
    for _ in 0..2 {
        let redis = RedisStore::builder()
            .deadline(LEASED_DEADLINE)
            .stale_tolerance(STALE_TOLERANCE)
            .standalone(&server.url())
            .await
            .expect("redis store");
        let mut store = TieredStore::builder()
            .lease_ttl(ttl)
            .lease_period(LEASED_PERIOD)
            .build(redis)
            .expect("tiered");
        let id = store.register(&policy).expect("register");
        stores.push((store, id));
    }
    let key = Key::from("client:1");
    let ((a, id), (b, _)) = (&stores[0], &stores[1]);
    for _ in 0..6 {
        assert!(check(a, *id, &key, 1).await.is_allowed(), "A's 6 requests");
    }
    // A's last spend may have started a background renewal: its units land shortly.
    for _ in 0..200 {
        if a.held(*id, &key) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let a_held = a.held(*id, &key);
    let mut b_admitted = 0;
    let mut retry = None;
    for _ in 0..=burst {
        let d = check(b, *id, &key, 1).await;
        if let Some(after) = d.as_slice()[0].retry_after() {
            retry = Some(after);
            break;
        }
        assert!(d.is_allowed(), "{d:?}");
        b_admitted += 1;
        tokio::time::sleep(pace).await;
    }
    let retry = retry.expect("B denies once the bucket is empty");
    let back = ttl + LEASED_PERIOD + LEASED_DEADLINE + STALE_TOLERANCE;
    assert!(
        retry <= back,
        "B's first denial (after {b_admitted} admitted, A holding {a_held}) says {retry:?}"
    );
    tokio::time::sleep(retry).await;
    let retry_admitted = check(b, *id, &key, 1).await.is_allowed();
    FirstDenial {
        a_held,
        b_admitted,
        retry_admitted,
    }
}

/// A client stranded on another instance (<https://github.com/envoyproxy/ratelimit/issues/1077>):
/// the `Retry-After` of a denial while another instance holds leased units: A leased units ahead
/// and stops getting the client's traffic; the client's requests on B (hot there: one right after
/// the other, so B leases too) take what Redis has left. B's first denial must not tell the client
/// to wait 1 000 s (what the Redis state alone says, counting A's unspent units) but at most until
/// A's units are back: the lease TTL, a sweeper period and the give-back's allowance (deadline and
/// stale tolerance). The client's retry after that wait is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_while_units_are_leased_elsewhere_waits_only_until_they_are_back() {
    let server = RedisServer::start();
    let seen = first_denial_on_b(&server, 100, LEASED_TTL, Duration::ZERO).await;
    eprintln!("{seen:?}");
    assert!(seen.a_held > 0, "A holds units taken ahead: {seen:?}");
    assert!(seen.b_admitted > 0, "{seen:?}");
    assert!(seen.retry_admitted, "A's units came back: {seen:?}");
}

/// The same on a key that stays cold on B (one request every 150 ms, longer than the lease
/// period, so each is the Redis store's own check): the Redis store's denial is bounded by
/// the units A leased (lease TTL 3 s here, so A still holds them when B runs out), and the
/// retry after its `retry_after` is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_denial_while_units_are_leased_elsewhere_waits_only_until_they_are_back() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(3);
    let seen = first_denial_on_b(&server, 20, ttl, Duration::from_millis(150)).await;
    eprintln!("{seen:?}");
    assert!(seen.a_held > 0, "A holds units taken ahead: {seen:?}");
    assert!(seen.b_admitted > 0, "{seen:?}");
    assert!(seen.retry_admitted, "A's units came back: {seen:?}");
}

const MS: u64 = 1_000_000;

/// A Redis store on `clock` (an hour's least TTL, so Redis's real-time expiry never acts on
/// the injected timeline).
async fn redis_on(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .min_ttl(Duration::from_secs(3_600))
        .standalone(&server.url())
        .await
        .expect("redis store")
}

/// What a plain Redis store sees left of `policy` for `key` (a free probe).
async fn remaining_on_redis(
    server: &RedisServer,
    clock: &ManualClock,
    policy: &Policy,
    key: &Key,
) -> u32 {
    let mut plain = redis_on(server, clock).await;
    let id = plain.register(policy).expect("register");
    let d = plain
        .check_async(&[(id, key.clone(), 0)])
        .await
        .expect("decides");
    d.as_slice()[0].remaining()
}

/// A background renewal that finds its lease expired (the units it still held not given
/// back yet) starts a new lease and gives those units back to Redis: none are lost. On a
/// current-thread runtime the renewal started by the third spend runs only when the test
/// yields, after the injected clock moved past the lease's expiry; the sweeper ticks once,
/// at the first check, and not again within the hour-long lease period.
#[tokio::test(flavor = "current_thread")]
async fn a_background_renewal_after_its_lease_expired_gives_the_units_held_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000 * MS);
    let policy = Policy::new("api", quota(100, 10_000_000_000, 100)); // T = 100 000 s
    let hour = Duration::from_secs(3_600);
    let mut store = TieredStore::builder()
        .max_lease(nz(10))
        .lease_period(hour)
        .lease_ttl(hour)
        .build(redis_on(&server, &clock).await)
        .expect("tiered");
    let id = store.register(&policy).expect("register");
    let key = Key::from("alice");
    for _ in 0..6 {
        assert!(check(&store, id, &key, 2).await.is_allowed());
    }
    assert!(
        store.held(id, &key) > 0,
        "units held when the lease expires"
    );
    assert_eq!(store.stats().prefetches, 0, "the renewal has not run yet");
    clock.set((1_000_000 + 3_601_000) * MS);
    for _ in 0..500 {
        if store.stats().prefetches > 0 && store.held(id, &key) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.stats().prefetches,
        1,
        "the background renewal leased after the expiry"
    );
    store.shutdown().await.expect("unused units back to Redis");
    // 6 spends of 2: exactly 12 units stay charged in Redis.
    assert_eq!(remaining_on_redis(&server, &clock, &policy, &key).await, 88);
}

/// Shutdown waits for the units of an expired lease that are on their way back to Redis:
/// the sweeper takes them while Redis is paused (SIGSTOP), and shutdown returns only after
/// Redis resumed (200 ms later) and took them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_units_an_expired_lease_is_giving_back() {
    let server = Arc::new(RedisServer::start());
    let clock = ManualClock::new();
    clock.set(1_000_000 * MS);
    let policy = Policy::new("api", quota(100, 10_000_000_000, 100)); // T = 100 000 s
    let mut store = TieredStore::builder()
        .max_lease(nz(10))
        .lease_period(Duration::from_millis(10))
        .lease_ttl(Duration::from_secs(1))
        .build(redis_on(&server, &clock).await)
        .expect("tiered");
    let id = store.register(&policy).expect("register");
    let key = Key::from("alice");
    // A cold check, then a lease of 2 with 1 spent: 1 held, no background renewal.
    for _ in 0..2 {
        assert!(check(&store, id, &key, 1).await.is_allowed());
    }
    assert_eq!(store.held(id, &key), 1);
    server.signal("STOP");
    clock.set(1_002_000 * MS); // the lease expired: the sweeper gives its unit back
    for _ in 0..500 {
        if store.stats().returned_units > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.stats().returned_units, 1, "the sweeper took the unit");
    let resumed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resume = {
        let (server, resumed) = (Arc::clone(&server), Arc::clone(&resumed));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            resumed.store(true, std::sync::atomic::Ordering::SeqCst);
            server.signal("CONT");
        })
    };
    store.shutdown().await.expect("shutdown");
    assert!(
        resumed.load(std::sync::atomic::Ordering::SeqCst),
        "shutdown returned while the unit was still on its way back"
    );
    resume.await.expect("resumed");
    // 2 spent: the returned unit is back.
    assert_eq!(remaining_on_redis(&server, &clock, &policy, &key).await, 98);
}
