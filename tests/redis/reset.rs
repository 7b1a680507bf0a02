//! Reset and peek on the shared stores (Redis standalone, Redis Cluster, tiered), on
//! injected time: a peek charges nothing, a reset gives the key its whole burst back
//! exactly, a refund or a correction of a receipt from before the reset gives back nothing,
//! a reset of one policy leaves the other's state, and a second store handle on the same
//! server sees the reset; a reset ends a ban, which a peek reports. The tiered store also drops its lease of the key, and a lease taken before the
//! reset and returned after it by another instance gives nothing back.

use std::num::NonZeroU32;
use std::time::Duration;

use ratekeeper_axum::core::Ban;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::{RedisStore, RedisStoreBuilder};
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::core::store::{
    Charge, Checked, Correction, Decisions, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_axum::{core::Algorithm, core::Decision, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

/// Injected time: 2026-01-01 in ns (any instant works; the state only sees differences).
const NOW_NS: u64 = 1_767_225_600_000_000_000;

/// TTL floor: longer than the test, so Redis's real-time expiry never acts on the
/// injected timeline.
const MIN_TTL: Duration = Duration::from_secs(3_600);

/// Stores whose refunds and corrections can be awaited (the trait's methods send in the
/// background).
trait Refunds: Store<Key> {
    async fn refund_now(&self, policy: PolicyId, key: &Key, receipt: Receipt);
    /// Corrects a charge of 1 unit with `receipt` to a true cost of 0 (a give-back).
    async fn give_back_now(&self, policy: PolicyId, key: &Key, receipt: Receipt);
}

impl Refunds for RedisStore {
    async fn refund_now(&self, policy: PolicyId, key: &Key, receipt: Receipt) {
        self.refund_async(&[((policy, key.clone(), 1), receipt)])
            .await
            .expect("refund reaches Redis");
    }

    async fn give_back_now(&self, policy: PolicyId, key: &Key, receipt: Receipt) {
        self.correct_async(&[((policy, key.clone(), 1), receipt, 0)])
            .await
            .expect("correction reaches Redis");
    }
}

impl Refunds for TieredStore {
    async fn refund_now(&self, policy: PolicyId, key: &Key, receipt: Receipt) {
        self.refund_async(&[Refund::new(Charge::new(policy, key, 1), receipt)])
            .await
            .expect("refund reaches Redis");
    }

    async fn give_back_now(&self, policy: PolicyId, key: &Key, receipt: Receipt) {
        self.correct_async(&[Correction::new(Charge::new(policy, key, 1), receipt, 0)])
            .await
            .expect("correction reaches Redis");
    }
}

async fn answer<S: Store<Key>>(checked: Checked<S::Future>) -> Decisions {
    match checked {
        Checked::Ready(result) => result,
        Checked::Pending(future) => future.await,
    }
    .expect("the store answers")
}

async fn check<S: Store<Key>>(store: &S, policy: PolicyId, key: &Key) -> Decisions {
    answer::<S>(store.check(&[Charge::new(policy, key, 1)])).await
}

async fn peek<S: Store<Key>>(store: &S, policy: PolicyId, key: &Key) -> Decision {
    let d = answer::<S>(store.peek(policy, key)).await;
    assert_eq!(d.len(), 1, "a peek answers one decision");
    d.as_slice()[0]
}

async fn reset<S: Store<Key>>(store: &S, policy: Option<PolicyId>, key: &Key) -> Decisions {
    answer::<S>(store.reset(policy, key)).await
}

fn per_minute(limit: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(limit).expect("non-zero"))
}

/// Policies of capacity 3 per minute, one per algorithm, and "other" (GCRA).
fn policies(algorithms: &[Algorithm]) -> Vec<Policy> {
    let mut out: Vec<Policy> = algorithms
        .iter()
        .map(|a| Policy::new(format!("{a:?}").to_lowercase(), per_minute(3)).with_algorithm(*a))
        .collect();
    out.push(Policy::new("other", per_minute(3)));
    out
}

const REDIS_ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

fn builder(clock: &ManualClock, prefix: &str, negative_cache: bool) -> RedisStoreBuilder {
    RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .min_ttl(MIN_TTL)
        .prefix(prefix)
        .negative_cache(negative_cache)
}

fn register<S: Store<Key>>(store: &mut S, policies: &[Policy]) -> Vec<PolicyId> {
    policies
        .iter()
        .map(|p| store.register(p).expect("register"))
        .collect()
}

/// The reset and peek checks on two handles of one server: `a` charges, `b` peeks and resets.
/// `ids` ends with the "other" policy.
async fn reset_and_peek<S: Refunds>(a: &S, b: &S, ids: &[PolicyId], what: &str) {
    let (&other, ids) = ids.split_last().expect("policies");
    let key = Key::from("alice");
    check(a, other, &key).await;
    for &p in ids {
        let fresh = peek(a, p, &key).await;
        assert_eq!(
            (fresh.limit(), fresh.remaining()),
            (3, 3),
            "{what} {p:?}: fresh"
        );
        assert!(fresh.is_allowed());
        let first = check(a, p, &key).await;
        // Peeking twice, on either handle, charges nothing: a check then sees the same.
        assert_eq!(peek(a, p, &key).await.remaining(), 2, "{what} {p:?}");
        assert_eq!(peek(b, p, &key).await.remaining(), 2, "{what} {p:?}");
        assert_eq!(
            check(a, p, &key).await.as_slice()[0].remaining(),
            1,
            "{what} {p:?}: a peek charged"
        );
        check(a, p, &key).await;
        assert!(
            !check(a, p, &key).await.is_allowed(),
            "{what} {p:?}: exhausted"
        );

        // The other handle resets; the charging handle sees the whole burst, exactly.
        let after = reset(b, Some(p), &key).await;
        assert_eq!(after.len(), 1);
        assert_eq!(
            after.as_slice()[0].remaining(),
            3,
            "{what} {p:?}: after reset"
        );
        assert_eq!(
            peek(a, p, &key).await.remaining(),
            3,
            "{what} {p:?}: a sees it"
        );
        for n in 0..3 {
            assert!(
                check(a, p, &key).await.is_allowed(),
                "{what} {p:?}: charge {n} after the reset"
            );
        }
        assert!(
            !check(a, p, &key).await.is_allowed(),
            "{what} {p:?}: more than the burst"
        );

        // The receipt from before the reset gives back nothing.
        let receipt = first.receipt(0);
        assert!(receipt.is_some(), "{what} {p:?}: a receipt");
        a.refund_now(p, &key, receipt).await;
        a.give_back_now(p, &key, receipt).await;
        assert_eq!(
            peek(a, p, &key).await.remaining(),
            0,
            "{what} {p:?}: old refund"
        );
        assert!(
            !check(a, p, &key).await.is_allowed(),
            "{what} {p:?}: old refund"
        );

        // The other policy's state is untouched.
        assert_eq!(
            peek(b, other, &key).await.remaining(),
            2,
            "{what} {p:?}: other"
        );
    }
    // A reset of every policy: one answer per policy, in registration order, all full.
    let all = reset(b, None, &key).await;
    assert_eq!(all.len(), ids.len() + 1, "{what}");
    assert!(
        all.as_slice().iter().all(|d| d.remaining() == 3),
        "{what}: {all:?}"
    );
    assert_eq!(peek(a, other, &key).await.remaining(), 3, "{what}");
}

/// The handle that resets forgets its own negative cache: a denial it remembered does not
/// outlive the reset.
async fn own_negative_cache_is_forgotten(store: &RedisStore, p: PolicyId, what: &str) {
    let key = Key::from("bob");
    for _ in 0..3 {
        check(store, p, &key).await;
    }
    assert!(!check(store, p, &key).await.is_allowed());
    assert!(!check(store, p, &key).await.is_allowed());
    reset(store, Some(p), &key).await;
    assert!(
        check(store, p, &key).await.is_allowed(),
        "{what}: a remembered denial"
    );
}

/// A ban made through one handle shows in the other's peek; that handle's reset ends it
/// (and the count of refusals), and the first handle is admitted again at once.
async fn a_reset_ends_a_ban(a: &RedisStore, b: &RedisStore, p: PolicyId, what: &str) {
    let key = Key::from("mallory");
    assert!(check(a, p, &key).await.is_allowed());
    assert!(!check(a, p, &key).await.is_allowed());
    let started = check(a, p, &key).await.as_slice()[0];
    assert!(started.starts_ban(), "{what}: {started:?}");
    let banned = peek(b, p, &key).await;
    assert!(banned.is_banned(), "{what}: {banned:?}");
    assert_eq!(
        banned.retry_after(),
        Some(Duration::from_secs(900)),
        "{what}"
    );
    let after = reset(b, Some(p), &key).await.as_slice()[0];
    assert!(
        after.is_allowed() && !after.is_banned(),
        "{what}: {after:?}"
    );
    assert_eq!(after.remaining(), 1, "{what}");
    assert!(!peek(a, p, &key).await.is_banned(), "{what}");
    assert!(check(a, p, &key).await.is_allowed(), "{what}: still banned");
    assert!(
        !check(a, p, &key).await.as_slice()[0].starts_ban(),
        "{what}: count kept"
    );
    assert!(check(a, p, &key).await.as_slice()[0].starts_ban(), "{what}");
}

/// One login a minute, banned for 15 minutes after 2 refusals within a minute.
fn login() -> Policy {
    let ban = Ban::after(NonZeroU32::new(2).expect("2"), Duration::from_secs(60))
        .lasting(Duration::from_secs(900));
    Policy::new("login", per_minute(1)).with_ban(ban)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_peek_on_redis_standalone() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(NOW_NS);
    let policies = policies(&REDIS_ALGORITHMS);
    let url = server.url();
    let mut a = builder(&clock, "rp", false)
        .standalone(&url)
        .await
        .expect("a");
    let mut b = builder(&clock, "rp", false)
        .standalone(&url)
        .await
        .expect("b");
    let ids = register(&mut a, &policies);
    assert_eq!(register(&mut b, &policies), ids);
    reset_and_peek(&a, &b, &ids, "standalone").await;

    let mut cached = builder(&clock, "rp-neg", true)
        .standalone(&url)
        .await
        .expect("c");
    let ids = register(&mut cached, &policies);
    own_negative_cache_is_forgotten(&cached, ids[0], "standalone").await;

    let mut a = builder(&clock, "rp-ban", false)
        .standalone(&url)
        .await
        .expect("a");
    let mut b = builder(&clock, "rp-ban", false)
        .standalone(&url)
        .await
        .expect("b");
    let p = register(&mut a, &[login()])[0];
    assert_eq!(register(&mut b, &[login()])[0], p);
    a_reset_ends_a_ban(&a, &b, p, "standalone").await;

    // Every fence has a TTL (no key is ever left without one).
    for (key, ttl) in server.key_ttls("rp*") {
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_peek_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let clock = ManualClock::new();
    clock.set(NOW_NS);
    let policies = policies(&REDIS_ALGORITHMS);
    let mut a = builder(&clock, "rpc", false)
        .cluster(&nodes)
        .await
        .expect("a");
    let mut b = builder(&clock, "rpc", false)
        .cluster(&nodes)
        .await
        .expect("b");
    let ids = register(&mut a, &policies);
    assert_eq!(register(&mut b, &policies), ids);
    reset_and_peek(&a, &b, &ids, "cluster").await;

    let mut cached = builder(&clock, "rpc-neg", true)
        .cluster(&nodes)
        .await
        .expect("c");
    let ids = register(&mut cached, &policies);
    own_negative_cache_is_forgotten(&cached, ids[0], "cluster").await;

    let mut a = builder(&clock, "rpc-ban", false)
        .cluster(&nodes)
        .await
        .expect("a");
    let mut b = builder(&clock, "rpc-ban", false)
        .cluster(&nodes)
        .await
        .expect("b");
    let p = register(&mut a, &[login()])[0];
    assert_eq!(register(&mut b, &[login()])[0], p);
    a_reset_ends_a_ban(&a, &b, p, "cluster").await;
}

async fn tiered(url: &str, clock: &ManualClock, prefix: &str) -> TieredStore {
    let redis = builder(clock, prefix, false)
        .standalone(url)
        .await
        .expect("redis store");
    TieredStore::builder()
        .max_lease(NonZeroU32::new(10).expect("non-zero"))
        .build(redis)
        .expect("tiered store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_peek_on_the_tiered_store() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new();
    clock.set(NOW_NS);
    let policies = policies(&[Algorithm::Gcra, Algorithm::FixedWindow]);
    // One handle charges and resets: another instance's remembered denial of the key (the
    // tiered store's own, bounded by the lease TTL and period) would outlive a reset it did
    // not send, on a clock that does not move. Two handles: the next test.
    let mut a = tiered(&url, &clock, "rpt").await;
    let ids = register(&mut a, &policies);
    reset_and_peek(&a, &a, &ids, "tiered").await;
}

/// Leases and resets: a peek counts the units this instance holds as available (and those
/// another instance holds as used); a reset drops this instance's lease, so it admits the
/// whole burst exactly and no stale unit; and a lease taken before the reset and returned
/// after it (another instance's shutdown) gives nothing back. The other instance cannot
/// subscribe to the fleet's invalidations here (an instance whose channel is down), so it
/// keeps its lease through the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiered_reset_drops_the_lease_and_fences_returns() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new();
    clock.set(NOW_NS);
    let hot = [Policy::new("hot", per_minute(20))];
    let mut a = tiered(&url, &clock, "rpl").await;
    let mut b = tiered(&server.url_without_subscribe(), &clock, "rpl").await;
    let p = register(&mut a, &hot)[0];
    assert_eq!(register(&mut b, &hot)[0], p);
    let key = Key::from("carol");
    // Both instances lease ahead (the bucket's upper half has room).
    for store in [&a, &b] {
        for _ in 0..6 {
            assert!(check(store, p, &key).await.is_allowed());
            if store.held(p, &key) > 0 {
                break;
            }
        }
    }
    let (held_a, held_b) = (a.held(p, &key), b.held(p, &key));
    assert!(held_a > 0 && held_b > 0, "leases: {held_a}, {held_b}");

    // Each peek adds the units its own instance holds to what Redis has left.
    let (peek_a, peek_b) = (peek(&a, p, &key).await, peek(&b, p, &key).await);
    assert_eq!(
        u64::from(peek_a.remaining()) - held_a,
        u64::from(peek_b.remaining()) - held_b,
        "{peek_a:?} {peek_b:?}"
    );

    let after = a.reset_async(Some(p), &key).await.expect("reset");
    assert_eq!(after.as_slice()[0].remaining(), 20);
    assert_eq!(a.held(p, &key), 0, "the lease is dropped");
    assert_eq!(a.peek_async(p, &key).await.expect("peek").remaining(), 20);
    // The other handle sees the reset in Redis (it still holds its own lease).
    let shared = b.redis().peek_async(p, &key).await.expect("peek");
    assert_eq!(shared.remaining(), 20);
    assert_eq!(b.held(p, &key), held_b);
    // A gets the whole burst, exactly: no unit of its dropped lease is spent.
    for n in 0..20 {
        assert!(
            check(&a, p, &key).await.is_allowed(),
            "charge {n} after the reset"
        );
    }
    assert!(
        !check(&a, p, &key).await.is_allowed(),
        "a stale unit was spent"
    );
    // B returns its lease, taken before the reset: the fence makes it give back nothing.
    b.shutdown().await.expect("b returns its units");
    assert_eq!(a.peek_async(p, &key).await.expect("peek").remaining(), 0);
    assert!(
        !check(&a, p, &key).await.is_allowed(),
        "a lease taken before the reset gave units back"
    );
}
