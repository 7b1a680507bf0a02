//! One Redis store shared by several layers: the store is a cheap handle, so a second
//! layer (and a policy registered while the first serves) opens no connection and loads no
//! script, and every clone knows every policy.

use std::num::NonZeroU32;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::RateLimitLayer;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{Charge, Checked, Store};
use ratekeeper_axum::core::{Key, Policy, Quota};
use ratekeeper_axum::key::GlobalKey;
use ratekeeper_tests::TestServer;
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};

/// The clients connected to `server` (`CLIENT LIST`, one line each), the test's own
/// `redis-cli` included.
fn clients(server: &RedisServer) -> usize {
    let list = server.cli(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    list.lines().filter(|l| l.contains("addr=")).count()
}

/// Scripts sent to `server` so far: `SCRIPT LOAD` calls plus `EVAL` calls (an `EVAL`
/// fallback loads its script too), from `INFO commandstats`.
fn script_loads(server: &RedisServer) -> u64 {
    let info = server
        .cli(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_script|load:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
                .expect("calls=N")
        })
        .sum()
}

fn per_minute(name: &str, n: u32) -> Policy {
    Policy::new(
        name,
        Quota::per_minute(NonZeroU32::new(n).expect("non-zero")),
    )
}

/// Two layers built on clones of one `RedisStore`: building the second and serving through
/// both adds no Redis connection and no script load, and each layer enforces its own
/// policy on the shared store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_share_one_connection_and_one_script_load() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");

    let first = RateLimitLayer::builder()
        .policy(per_minute("first", 2))
        .key(GlobalKey)
        .store(store.clone())
        .build()
        .expect("first layer");
    let app = TestServer::start(
        Router::new()
            .route("/a", get(|| async { "a" }).layer(first))
            .route("/b", get(|| async { "b" })),
    )
    .await;
    assert_eq!(app.get("/a").send().await.expect("GET /a").status(), 200);
    let (clients_before, loads_before) = (clients(&server), script_loads(&server));
    assert!(
        loads_before > 0,
        "the store loads its scripts when it is built"
    );

    let second = RateLimitLayer::builder()
        .policy(per_minute("second", 1))
        .key(GlobalKey)
        .store(store.clone())
        .build()
        .expect("second layer");
    let app2 =
        TestServer::start(Router::new().route("/c", get(|| async { "c" }).layer(second))).await;
    let mut statuses = Vec::new();
    for path in ["/a", "/a"] {
        statuses.push(app.get(path).send().await.expect("GET").status().as_u16());
    }
    for _ in 0..2 {
        statuses.push(
            app2.get("/c")
                .send()
                .await
                .expect("GET /c")
                .status()
                .as_u16(),
        );
    }
    // "first" allows 2 a minute (one spent above), "second" 1.
    assert_eq!(statuses, [200, 429, 200, 429]);

    assert_eq!(
        clients(&server),
        clients_before,
        "the second layer opened a Redis connection"
    );
    assert_eq!(
        script_loads(&server),
        loads_before,
        "the second layer loaded a script again"
    );
}

/// A policy registered through one clone, after another clone was made, is known to that
/// other clone (the Envoy rate limit service registers policies on a config reload while
/// it serves): its check goes to Redis under the same key as the registering clone's.
#[tokio::test]
async fn a_policy_registered_through_one_clone_is_known_to_every_clone() {
    let server = RedisServer::start();
    let serving = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    let mut reloading = serving.clone();
    let id = reloading
        .register(&per_minute("reloaded", 1))
        .expect("register");
    let key = Key::from("tenant-1");

    let decide = |store: &RedisStore| match store.check(&[Charge::new(id, &key, 1)]) {
        Checked::Ready(result) => futures_util::future::Either::Left(std::future::ready(result)),
        Checked::Pending(future) => futures_util::future::Either::Right(future),
    };
    let first = decide(&serving)
        .await
        .expect("the serving clone knows the policy");
    assert!(first.is_allowed());
    let second = decide(&reloading).await.expect("decision");
    assert!(!second.is_allowed(), "both clones charge one budget");
    assert_eq!(
        serving.redis_key(id, &key),
        reloading.redis_key(id, &key),
        "one key name for both clones"
    );
    assert!(serving.redis_key(id, &key).is_some());
}

/// The tiered store's clones share its leases and registry: a policy registered through one
/// clone after the other was made is leased through that other clone, and both spend one
/// budget (5 per hour: the sixth request through either is refused).
#[tokio::test]
async fn tiered_store_clones_share_leases_and_every_registration() {
    use ratekeeper_axum::core::store::tiered::TieredStore;

    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    let serving = TieredStore::builder().build(redis).expect("tiered store");
    let mut reloading = serving.clone();
    let policy = Policy::new("hot", Quota::per_hour(NonZeroU32::new(5).expect("5")));
    let id = reloading.register(&policy).expect("register");
    let key = Key::from("hot-client");
    let decide = |store: &TieredStore| match store.check(&[Charge::new(id, &key, 1)]) {
        Checked::Ready(result) => futures_util::future::Either::Left(std::future::ready(result)),
        Checked::Pending(future) => futures_util::future::Either::Right(future),
    };
    let mut allowed = Vec::new();
    for i in 0..6 {
        let store = if i % 2 == 0 { &serving } else { &reloading };
        allowed.push(decide(store).await.expect("decision").is_allowed());
    }
    assert_eq!(allowed, [true, true, true, true, true, false]);
    assert_eq!(serving.stats().decisions, 6, "one set of counters");
}
