//! A fleet of app instances on one Redis, at the moments operators live through: the start
//! (every store ready when built, so the first requests after a start are decided by Redis)
//! and an outage (fail-soft keeps each instance to its share of the quota; the breaker's
//! prober ends the outage when Redis answers again). A short, seeded subset of the fleet
//! harness (`scripts/fleet.sh`, `ratekeeper_tests::fleet`).
//!
//! Load-proof: what is asserted is counted (admissions, 503s, scripts in Redis, connected
//! clients), never a latency; the deadlines are long enough that a loaded machine does not
//! turn a Redis decision into a failure-policy one, and where the failure policy does act,
//! its bound is checked against the failure window the run measured.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{FailurePolicy, Store};
use ratekeeper_axum::{RateLimitLayer, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::fleet::{Fault, Outcome, Scenario, run};
use ratekeeper_tests::logs::Captured;
use ratekeeper_tests::redis::{RedisCluster, RedisServer};
use ratekeeper_tests::spawn;

/// The budget of the start test: 10 per minute, burst 10, one key for the whole fleet.
const BUDGET: u32 = 10;

type Layer = RateLimitLayer<GlobalKey, u64, RedisStore>;

/// One app instance: its own store (own connection) on `url`, failing open; the layer (for
/// its store) and the app.
async fn instance(url: &str) -> (Layer, Router) {
    let store = RedisStore::builder()
        // Long enough that a loaded machine never turns a decision into a failure-policy
        // one: what this test checks is that nothing is left for the first decisions to do.
        .deadline(Duration::from_secs(2))
        .on_failure(FailurePolicy::Allow)
        .standalone(url)
        .await
        .expect("store ready");
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(BUDGET).expect("budget")),
        ))
        .key(GlobalKey)
        .store(store)
        .build()
        .expect("layer");
    (
        layer.clone(),
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
}

/// Case: start. Two app instances start on a fresh `redis-server` and 20 requests arrive at
/// once, 10 at each; 20 times, each on a fresh server. Before the first request Redis
/// already has both instances' connections and every script of the store
/// (`SCRIPT EXISTS`): the stores were made ready when built, so no decision has to connect
/// or load a script inside its deadline. Then exactly the budget is admitted (fail open
/// would admit more), every decision by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_fresh_redis_admit_exactly_the_budget_from_the_first_request() {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let hashes = RedisStore::script_hashes();
    for trial in 0..20 {
        let server = RedisServer::start();
        let (a, app_a) = instance(&server.url()).await;
        let (b, app_b) = instance(&server.url()).await;

        // Redis side, before any request: the scripts are loaded and both connections open.
        let mut exists = vec!["SCRIPT", "EXISTS"];
        exists.extend(hashes.iter().map(String::as_str));
        let loaded = server.cli(&exists).expect("SCRIPT EXISTS");
        assert_eq!(
            loaded.lines().filter(|l| l.trim() == "1").count(),
            hashes.len(),
            "trial {trial}: scripts not loaded before the first request: {loaded}"
        );
        let clients = server.cli(&["CLIENT", "LIST"]).expect("CLIENT LIST");
        // Both stores, plus this redis-cli.
        assert!(
            clients.lines().count() >= 3,
            "trial {trial}: the stores are not connected before the first request: {clients}"
        );

        assert!(
            a.store().is_ready() && b.store().is_ready(),
            "trial {trial}: a store not ready"
        );

        let addrs = [spawn(app_a).await, spawn(app_b).await];
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..20 {
            let client = client.clone();
            let addr = addrs[i % 2];
            requests.spawn(async move {
                let res = client
                    .get(format!("http://{addr}/"))
                    .send()
                    .await
                    .expect("answered");
                (
                    res.status().as_u16(),
                    res.headers().contains_key("x-ratelimit-remaining"),
                )
            });
        }
        let mut admitted = 0;
        let mut limited = 0;
        while let Some(answer) = requests.join_next().await {
            let (status, decided) = answer.expect("request task");
            assert!(
                decided,
                "trial {trial}: a decision without headers (fail open)"
            );
            match status {
                200 => admitted += 1,
                429 => limited += 1,
                other => panic!("trial {trial}: status {other}"),
            }
        }
        assert_eq!(
            (admitted, limited),
            (BUDGET, 20 - BUDGET),
            "trial {trial}: admitted {admitted} for a budget of {BUDGET}"
        );
        for store in [&a, &b] {
            let stats = store.store().stats();
            assert_eq!(stats.degraded, 0, "trial {trial}: {stats:?}");
        }
    }
}

/// Case: outage. Two instances share 200/s (burst 20) at twice that load; Redis is paused
/// (`SIGSTOP`) for 600 ms. Under fail-soft no request gets a 503, and what the instances
/// admit on their own is their share of the quota over the failure window the run measured
/// (one unit each to start, then `limit` per second between them), not the offered load
/// (fail open would admit twice that); afterwards Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_soft_keeps_a_paused_redis_fleet_to_its_share_without_503() {
    let report = run(Scenario {
        instances: 2,
        on_failure: FailurePolicy::FailSoft,
        fault: Fault::Pause(Duration::from_millis(600)),
        limit: 200,
        burst: 20,
        offered: 2.0,
        deadline: Duration::from_millis(250),
        duration: Duration::from_secs(3),
        fault_at: Duration::from_secs(1),
        seed: 7,
        ..Scenario::default()
    })
    .await;
    assert_eq!(report.unavailable, 0, "fail-soft never answers 503");
    assert!(
        report.degraded() > 0,
        "the pause was never noticed: {}",
        report.row()
    );
    // What the instances admitted on their own during the pause's failure window (a
    // decision elsewhere that missed its deadline on a loaded machine is another, tiny
    // outage with its own share).
    let first = report
        .events
        .iter()
        .find(|e| e.at >= report.scenario.fault_at && e.outcome.is_degraded())
        .map(|e| e.at)
        .expect("a degraded decision");
    let end = first + report.failure_window;
    let locally_admitted = report
        .events
        .iter()
        .filter(|e| e.at >= first && e.at <= end && e.outcome == Outcome::DegradedAdmitted)
        .count();
    // The share's bound over that window: 1 unit per instance to start, then 200/s split
    // between them (each rounded down), plus one unit of refill each at the window's edges.
    let window = report.failure_window.as_secs_f64();
    let bound = 2 + (200.0 * window).ceil() as usize + 2;
    assert!(
        locally_admitted <= bound,
        "admitted {locally_admitted} on their own in {window:.3} s, share bound {bound}: {}",
        report.row()
    );
    let after = report.scenario.fault_at + report.fault_len + Duration::from_millis(1_000);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.at > after && e.outcome == Outcome::Admitted),
        "Redis never decided again: {}",
        report.row()
    );
}

/// Case: outage, restart. Redis is killed and started again (empty, on the same port) while
/// the breaker is open for a whole minute: the store's prober reconnects in the background,
/// loads the scripts into the new server and closes the breaker as soon as Redis answers,
/// so decisions come from Redis again long before the open period ends, and the first of
/// them finds its script already there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_decides_again_long_before_the_breaker_period_ends() {
    let mut server = RedisServer::start();
    let mut store = RedisStore::builder()
        .deadline(Duration::from_millis(500))
        .breaker(1, Duration::from_secs(60))
        .standalone(&server.url())
        .await
        .expect("store ready");
    let api = store
        .register(&Policy::new(
            "api",
            Quota::per_second(NonZeroU32::new(1_000).expect("n")),
        ))
        .expect("policy");
    let charge = [(api, ratekeeper_axum::core::Key::from("client"), 1)];
    assert!(
        store
            .check_async(&charge)
            .await
            .expect("Redis decides")
            .is_allowed()
    );

    server.kill();
    // One failure opens the breaker (threshold 1), for a minute.
    let failed = store.check_async(&charge).await.expect_err("Redis is down");
    assert_eq!(failed.failure_policy(), FailurePolicy::Allow);
    assert!(store.is_breaker_open());

    tokio::task::block_in_place(|| server.restart());
    let started = std::time::Instant::now();
    while store.is_breaker_open() && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !store.is_breaker_open(),
        "the breaker is still open {:?} after Redis came back",
        started.elapsed()
    );
    // Made ready before it was put in use: every script is in the new server already.
    let hashes = RedisStore::script_hashes();
    let mut exists = vec!["SCRIPT", "EXISTS"];
    exists.extend(hashes.iter().map(String::as_str));
    let loaded = server.cli(&exists).expect("SCRIPT EXISTS");
    assert_eq!(
        loaded.lines().filter(|l| l.trim() == "1").count(),
        hashes.len(),
        "{loaded}"
    );
    let before = store.stats().redis_decisions;
    let decided = store
        .check_async(&charge)
        .await
        .expect("Redis decides again");
    assert!(decided.is_allowed());
    assert!(decided.receipts().all(|r| r.is_some()), "decided by Redis");
    assert_eq!(store.stats().redis_decisions, before + 1);
}

/// Case: outage, its log. The first degraded decision of an outage logs a WARN at once (the
/// error and the failure policy in force), before the circuit breaker opens (here after 5
/// failures in a row), and the next degraded decisions do not log another.
#[test]
fn the_first_degraded_decision_warns_at_once() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(logs.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    // This thread only; a current-thread runtime polls everything on it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut server = RedisServer::start();
    let mut warned_after = Vec::new();
    let breaker_open = rt.block_on(async {
        let mut store = RedisStore::builder()
            .deadline(Duration::from_millis(500))
            .breaker(5, Duration::from_secs(60))
            .standalone(&server.url())
            .await
            .expect("store ready");
        let api = store
            .register(&Policy::new(
                "api",
                Quota::per_second(NonZeroU32::new(1_000).expect("n")),
            ))
            .expect("policy");
        let charge = [(api, ratekeeper_axum::core::Key::from("client"), 1)];
        // Other tests' threads (no subscriber) may have registered the WARN's callsite while
        // this thread's subscriber was being set up, leaving it cached as uninteresting:
        // recompute every callsite's interest with this subscriber in place.
        tracing::callsite::rebuild_interest_cache();
        server.kill();
        for _ in 0..3 {
            let err = store.check_async(&charge).await.expect_err("Redis is down");
            assert_eq!(err.failure_policy(), FailurePolicy::Allow);
            warned_after.push(logs.lines("WARN").len());
        }
        store.is_breaker_open()
    });
    let warnings = logs.lines("WARN");
    assert_eq!(warned_after, [1, 1, 1], "{warnings:?}");
    assert!(!breaker_open, "3 failures of 5 open nothing");
    assert!(warnings[0].contains("could not decide"), "{}", warnings[0]);
    assert!(warnings[0].contains("allow"), "{}", warnings[0]);
}

/// The primary serving `key`'s slot and its replica, killed (`kill -9`): the slot stays down
/// (no replica to promote) while the rest of the Cluster answers. Blocking (`redis-cli`).
fn kill_slot(cluster: &mut RedisCluster, key: &str) {
    let primary = cluster.primary_for(key);
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
    cluster.nodes[replica].kill();
    cluster.nodes[primary].kill();
}

/// Case: outage, a Cluster slot down. The primary holding the key dies with its replica, so
/// the slot stays down while the other primaries answer: the store's prober finds a fresh
/// connection ready (scripts loaded, `TIME` read) again and again, and each time the breaker
/// closes, the next decision fails on the slot and opens it again; another client's key,
/// on a slot that is up, is decided by Redis all along. Under fail-soft the instance keeps
/// to its share over the whole outage (here the whole quota, `instances(1)`: one unit to
/// start, then 20 per second); a share that started afresh whenever Redis answered (a
/// probe, the other key) would give one more unit each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_soft_keeps_its_share_while_a_cluster_slot_is_down() {
    const RATE: u32 = 20;
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("cluster");
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut store = RedisStore::builder()
        .deadline(Duration::from_millis(500))
        .on_failure(FailurePolicy::FailSoft)
        .instances(NonZeroU32::new(1).expect("1"))
        .cluster(&nodes)
        .await
        .expect("store ready");
    let api = store
        .register(&Policy::new(
            "api",
            Quota::per_second(NonZeroU32::new(RATE).expect("rate")),
        ))
        .expect("policy");
    let key = ratekeeper_axum::core::Key::from("slot-down");
    let charge = [(api, key, 1)];
    assert!(
        store
            .check_async(&charge)
            .await
            .expect("Redis decides")
            .is_allowed()
    );
    // `Key::from("slot-down")` is stored under the hash tag `{s:slot-down}`. Another
    // client's key on a slot that stays up: its decisions go on being Redis's.
    let other = tokio::task::block_in_place(|| {
        let down = cluster.primary_for("{s:slot-down}");
        let other = (0..64)
            .map(|i| format!("up-{i}"))
            .find(|k| cluster.primary_for(&format!("{{s:{k}}}")) != down)
            .expect("a key on another primary");
        kill_slot(&mut cluster, "{s:slot-down}");
        other
    });
    let up = [(api, ratekeeper_axum::core::Key::from(other.as_str()), 1)];

    // Two seconds of checks, one every 5 ms, each on its own task as in a server (a check
    // that goes to Redis may take up to the deadline): the share's units are all taken as
    // they come.
    let store = std::sync::Arc::new(store);
    let began = tokio::time::Instant::now();
    let mut checks = tokio::task::JoinSet::new();
    for i in 0..400u32 {
        tokio::time::sleep_until(began + Duration::from_millis(5) * i).await;
        let store = std::sync::Arc::clone(&store);
        let (charge, up) = (charge.clone(), up.clone());
        checks.spawn(async move {
            let decided = store.check_async(&charge).await;
            let at = tokio::time::Instant::now();
            // The other client, whose slot answers, as often (it does not count).
            let _ = store.check_async(&up).await;
            (at, decided)
        });
    }
    let mut first = None;
    let mut last = began;
    let mut local = 0u32;
    while let Some(done) = checks.join_next().await {
        let (at, decided) = done.expect("check task");
        match decided {
            Ok(d) if d.receipts().all(|r| r.is_some()) => {
                panic!("Redis decided although the key's slot is down: {d:?}")
            }
            Ok(d) => {
                first = Some(first.map_or(at, |f: tokio::time::Instant| f.min(at)));
                last = last.max(at);
                local += u32::from(d.is_allowed());
            }
            Err(e) => panic!("fail-soft answers every degraded decision: {e}"),
        }
    }
    let first = first.expect("a degraded decision");
    let elapsed = last.duration_since(first).as_secs_f64();
    // The share: one unit to start, then RATE per second, plus one unit of refill at the
    // edge.
    let bound = 1 + (f64::from(RATE) * elapsed).ceil() as u32 + 1;
    assert!(
        local <= bound,
        "admitted {local} on its own in {elapsed:.3} s, share bound {bound}: {:?}",
        store.stats()
    );
}
