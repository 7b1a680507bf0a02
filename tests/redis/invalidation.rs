//! Operator actions reach the whole fleet at once: two store handles on one redis-server
//! (two processes' worth of local state, each with its own negative cache, leases and
//! invalidation subscription). A ban made and lifted through A, a reset of a key A
//! exhausted, and a reset of a key whose lease B holds: the next request to B is admitted
//! within 100 ms of the reset, while B's local state alone would have refused it for a
//! minute or more. An instance whose invalidation channel is down falls back to short
//! remembered denials (at most 1 s), never to a ban's length. On Redis Cluster too.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::core::store::{Charge, Checked, Decisions, PolicyId, Store};
use ratekeeper_axum::core::{Ban, Key, Policy, Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

/// How soon after a reset returns the next request to the other instance is admitted.
const FLEET_WITHIN: Duration = Duration::from_millis(100);

/// 2 per minute; banned for 15 min after 3 refusals within 1 min.
fn login() -> Policy {
    Policy::new("login", Quota::per_minute(NonZeroU32::new(2).unwrap())).with_ban(
        Ban::after(NonZeroU32::new(3).unwrap(), Duration::from_secs(60))
            .lasting(Duration::from_secs(900)),
    )
}

/// 2 per minute, no ban.
fn api() -> Policy {
    Policy::new("api", Quota::per_minute(NonZeroU32::new(2).unwrap()))
}

async fn check<S>(store: &S, policy: PolicyId, key: &Key) -> Decisions
where
    S: Store<Key>,
    S::Future:
        std::future::Future<Output = Result<Decisions, ratekeeper_axum::core::store::StoreError>>,
{
    let charges = [Charge::new(policy, key, 1)];
    match store.check(&charges) {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    }
    .expect("redis answers")
}

/// Checks `key` through `store` every 2 ms from `since` until one is admitted (at most
/// 2 000 checks); how long after `since` the first admission came.
async fn admitted_after<S>(store: &S, policy: PolicyId, key: &Key, since: Instant) -> Duration
where
    S: Store<Key>,
    S::Future:
        std::future::Future<Output = Result<Decisions, ratekeeper_axum::core::store::StoreError>>,
{
    for _ in 0..2_000 {
        if check(store, policy, key).await.is_allowed() {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let last = check(store, policy, key).await;
    panic!("never admitted after {:?}: {last:?}", since.elapsed());
}

/// A store on `url` whose decisions never time out on a loaded machine (the deadline is
/// not what these tests are about).
async fn standalone(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .prefix(prefix)
        .standalone(url)
        .await
        .expect("standalone")
}

/// Bans `key` through `a` (two charges, three refusals) and has `b` remember the ban (a
/// refusal `b`'s negative cache then answers without Redis).
async fn ban_through_a_remembered_by_b(
    a: &RedisStore,
    b: &RedisStore,
    policy: PolicyId,
    key: &Key,
) {
    for i in 0..5 {
        let d = check(a, policy, key).await;
        assert_eq!(d.is_allowed(), i < 2, "check {i} through A: {d:?}");
    }
    let first = check(b, policy, key).await;
    assert!(first.as_slice()[0].is_banned(), "B sees the ban: {first:?}");
    let hits = b.stats().negative_cache_hits;
    let again = check(b, policy, key).await;
    assert!(again.as_slice()[0].is_banned());
    assert_eq!(
        b.stats().negative_cache_hits,
        hits + 1,
        "B answers the ban from its own negative cache"
    );
}

/// A ban made through A and lifted through A (a reset): B, which remembered the ban in its
/// negative cache, admits the next request within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_lifted_through_one_instance_admits_at_the_other_within_100_ms() {
    let server = RedisServer::start();
    let url = server.url();
    let mut a = standalone(&url, "inv-ban").await;
    let mut b = standalone(&url, "inv-ban").await;
    let id = a.register(&login()).unwrap();
    assert_eq!(b.register(&login()).unwrap(), id);
    let key = Key::from("alice");
    ban_through_a_remembered_by_b(&a, &b, id, &key).await;
    a.reset_async(Some(id), &key).await.expect("unban");
    let after = admitted_after(&b, id, &key, Instant::now()).await;
    assert!(
        after <= FLEET_WITHIN,
        "B admitted {after:?} after the unban"
    );
}

/// A key exhausted through A and remembered as denied by B (about 30 s to go): a reset of
/// every policy of the key through A admits at B within 100 ms. Another key B remembers
/// is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_of_an_exhausted_key_admits_at_the_other_instance_within_100_ms() {
    let server = RedisServer::start();
    let url = server.url();
    let mut a = standalone(&url, "inv-reset").await;
    let mut b = standalone(&url, "inv-reset").await;
    let id = a.register(&api()).unwrap();
    b.register(&api()).unwrap();
    let (key, other) = (Key::from("carol"), Key::from("dave"));
    for k in [&key, &other] {
        assert!(check(&a, id, k).await.is_allowed());
        assert!(check(&a, id, k).await.is_allowed());
        assert!(!check(&b, id, k).await.is_allowed(), "exhausted");
    }
    let hits = b.stats().negative_cache_hits;
    assert!(!check(&b, id, &key).await.is_allowed());
    assert_eq!(b.stats().negative_cache_hits, hits + 1, "B remembers it");
    a.reset_async(None, &key).await.expect("reset");
    let after = admitted_after(&b, id, &key, Instant::now()).await;
    assert!(
        after <= FLEET_WITHIN,
        "B admitted {after:?} after the reset"
    );
    // The other key is still remembered (and still refused).
    let hits = b.stats().negative_cache_hits;
    assert!(!check(&b, id, &other).await.is_allowed());
    assert_eq!(b.stats().negative_cache_hits, hits + 1);
}

/// B is a tiered store holding the key's lease, spent and remembering Redis's denial (for
/// up to its lease TTL, a minute here): a reset through A (another tiered store) drops
/// B's lease, and B admits within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_drops_the_lease_another_tiered_instance_holds() {
    let server = RedisServer::start();
    let url = server.url();
    let tiered = async || {
        TieredStore::builder()
            .lease_ttl(Duration::from_secs(60))
            .build(standalone(&url, "inv-lease").await)
            .expect("tiered")
    };
    let mut a = tiered().await;
    let mut b = tiered().await;
    // 20 per minute: B's burst leases units ahead, spends them, then is refused.
    let policy = Policy::new("bulk", Quota::per_minute(NonZeroU32::new(20).unwrap()));
    let id = a.register(&policy).unwrap();
    b.register(&policy).unwrap();
    let key = Key::from("erin");
    let mut allowed = 0;
    for _ in 0..40 {
        allowed += u32::from(check(&b, id, &key).await.is_allowed());
    }
    assert_eq!(allowed, 20, "B spends the whole quota");
    let local = b.stats().local;
    assert!(!check(&b, id, &key).await.is_allowed());
    assert_eq!(b.stats().local, local + 1, "B answers from its lease");
    a.reset_async(Some(id), &key).await.expect("reset");
    let after = admitted_after(&b, id, &key, Instant::now()).await;
    assert!(
        after <= FLEET_WITHIN,
        "B admitted {after:?} after the reset"
    );
}

/// An instance that cannot subscribe (its Redis user may not `SUBSCRIBE`) hears of no
/// reset: its remembered ban lasts at most 1 s (the unsubscribed hold), so the lifted ban
/// reaches it within about a second, never the ban's 15 minutes; an instance that can
/// subscribe hears of it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_channel_a_remembered_ban_lasts_at_most_a_second() {
    let server = RedisServer::start();
    let url = server.url();
    let deaf_url = server.url_without_subscribe();
    let mut a = standalone(&url, "inv-deaf").await;
    let mut b = standalone(&deaf_url, "inv-deaf").await;
    let id = a.register(&login()).unwrap();
    b.register(&login()).unwrap();
    let key = Key::from("frank");
    ban_through_a_remembered_by_b(&a, &b, id, &key).await;
    // The ban was remembered by B at most this long ago.
    let remembered = Instant::now();
    a.reset_async(Some(id), &key).await.expect("unban");
    let after = admitted_after(&b, id, &key, remembered).await;
    assert!(
        after <= Duration::from_millis(1_000) + Duration::from_secs(3),
        "B admitted {after:?} after it remembered the ban"
    );
}

/// On Redis Cluster: B subscribes through a node A does not publish through (a PUBLISH
/// reaches the subscribers of every node), and admits within 100 ms of A's unban.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_lifted_on_a_cluster_admits_at_the_other_instance_within_100_ms() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let reversed: Vec<&str> = nodes.iter().rev().copied().collect();
    let build = async |nodes: &[&str]| {
        RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .prefix("inv-cluster")
            .cluster(nodes)
            .await
            .expect("cluster")
    };
    let mut a = build(&nodes).await;
    let mut b = build(&reversed).await;
    let id = a.register(&login()).unwrap();
    b.register(&login()).unwrap();
    let key = Key::from("grace");
    ban_through_a_remembered_by_b(&a, &b, id, &key).await;
    a.reset_async(None, &key).await.expect("unban");
    let after = admitted_after(&b, id, &key, Instant::now()).await;
    assert!(
        after <= FLEET_WITHIN,
        "B admitted {after:?} after the unban"
    );
}

/// The channel drops (Redis closes every subscriber's connection, `CLIENT KILL TYPE pubsub`)
/// and the ban is lifted through A at once, maybe before B has subscribed again: B admits
/// within about a second all the same (it forgets every remembered denial when it
/// subscribes again, and remembers none for longer than 1 s meanwhile), never after the
/// ban's 15 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_lifted_while_the_channel_is_dropped_reaches_the_other_instance() {
    let server = RedisServer::start();
    let url = server.url();
    let mut a = standalone(&url, "inv-drop").await;
    let mut b = standalone(&url, "inv-drop").await;
    let id = a.register(&login()).unwrap();
    b.register(&login()).unwrap();
    let key = Key::from("heidi");
    ban_through_a_remembered_by_b(&a, &b, id, &key).await;
    let killed = tokio::task::block_in_place(|| server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]));
    let killed: u32 = killed
        .and_then(|n| n.trim().parse().ok())
        .expect("CLIENT KILL answers a count");
    assert!(
        killed >= 2,
        "both instances were subscribed ({killed} killed)"
    );
    let lifted = Instant::now();
    a.reset_async(Some(id), &key).await.expect("unban");
    let after = admitted_after(&b, id, &key, lifted).await;
    assert!(
        after <= Duration::from_secs(1) + Duration::from_secs(2),
        "B admitted {after:?} after the unban"
    );
}
