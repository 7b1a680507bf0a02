//! Bans on Redis (standalone and Cluster) across two store handles, with injected time: a
//! key one handle's refusals ban is refused through the other until the ban's exact end,
//! then admitted; the ban does not outlive its duration; other keys are unaffected; the
//! Delay mode waits for a ban only when `max_wait` covers it; every answer equals the memory
//! store's on the same trace; the ban key shares the limiter key's hash tag and expires
//! with the ban.

use std::num::NonZeroU32;
use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::{OwnedCharge, RedisStore, RedisStoreBuilder};
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::core::store::{Charge, Checked, Decisions, MemoryStore, PolicyId, Store};
use ratekeeper_axum::{core::Algorithm, core::Ban, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

const MS: u64 = 1_000_000;

/// 2 per minute; banned for 15 min after 3 refusals within 1 min.
fn policy(algorithm: Algorithm) -> Policy {
    Policy::new(
        format!("login-{}", algorithm),
        Quota::per_minute(NonZeroU32::new(2).unwrap()),
    )
    .with_algorithm(algorithm)
    .with_ban(
        Ban::after(NonZeroU32::new(3).unwrap(), Duration::from_secs(60))
            .lasting(Duration::from_secs(900)),
    )
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// One step: at `t` ms, through handle `via` (0 or 1), `key` checks (`None`) or reserves
/// with `max_wait` ms.
struct Step {
    t: u64,
    via: usize,
    key: &'static str,
    reserve: Option<u64>,
}

const fn at(t: u64, via: usize, key: &'static str) -> Step {
    Step {
        t,
        via,
        key,
        reserve: None,
    }
}

const fn reserve(t: u64, via: usize, key: &'static str, max_wait: u64) -> Step {
    Step {
        t,
        via,
        key,
        reserve: Some(max_wait),
    }
}

/// Alice is charged twice, refused three times (alternating handles) and banned at 3 s;
/// refused during the ban through both handles (bob is not); her ban ends at 903 s; a
/// Delay-mode request waits for a ban only when its `max_wait` covers it.
const TRACE: [Step; 18] = [
    at(0, 0, "alice"),                     // 0: allowed
    at(0, 1, "alice"),                     // 1: allowed (the other handle: one budget)
    at(1_000, 1, "alice"),                 // 2: refusal 1
    at(2_000, 0, "alice"),                 // 3: refusal 2
    at(3_000, 1, "alice"),                 // 4: refusal 3: the ban starts, 900 s
    at(3_000, 0, "bob"),                   // 5: bob is allowed
    at(300_250, 0, "alice"),               // 6: banned, 602.75 s left
    at(300_250, 1, "alice"),               // 7: banned through the other handle too
    reserve(600_000, 0, "alice", 200_000), // 8: banned 303 s > max_wait: final
    reserve(600_000, 1, "alice", 400_000), // 9: banned, max_wait covers it: not final
    at(902_999, 1, "alice"),               // 10: banned, 1 ms left
    at(903_000, 0, "alice"),               // 11: the ban is over: allowed
    at(903_000, 1, "alice"),               // 12: allowed
    at(903_000, 0, "alice"),               // 13: refusal 1 of a new count
    at(903_000, 1, "bob"),                 // 14: bob
    at(970_000, 1, "alice"),               // 15: 67 s later: the old count ran out
    at(2_000_000, 0, "alice"),             // 16
    at(2_000_000, 1, "carol"),             // 17
];

async fn run_memory(algorithm: Algorithm) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut store = MemoryStore::<Key, _>::with_clock(clock.clone());
    let id = store.register(&policy(algorithm)).expect("register");
    let mut out = Vec::new();
    for s in &TRACE {
        clock.set(s.t * MS);
        let key = Key::from(s.key);
        let charges = [Charge::new(id, &key, 1)];
        let answer = match s.reserve {
            None => store.check_now(&charges),
            Some(w) => store.reserve_now(&charges, Duration::from_millis(w)),
        };
        out.push(answer.expect("memory decides"));
    }
    out
}

/// The trace through two handles built by `build` on the same Redis, with the same injected
/// clock.
async fn run_redis(
    algorithm: Algorithm,
    build: impl AsyncFn(RedisStoreBuilder) -> RedisStore,
) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut handles = Vec::new();
    let mut ids: Vec<PolicyId> = Vec::new();
    for _ in 0..2 {
        let mut store = build(
            RedisStore::builder()
                .clock(clock.clone())
                .deadline(DECISION_DEADLINE)
                // Redis counts TTLs down in real time: keep them beyond the test.
                .min_ttl(Duration::from_secs(3_600)),
        )
        .await;
        ids.push(store.register(&policy(algorithm)).expect("register"));
        handles.push(store);
    }
    let mut out = Vec::new();
    for s in &TRACE {
        clock.set(s.t * MS);
        let charges: [OwnedCharge; 1] = [(ids[s.via], Key::from(s.key), 1)];
        let store = &handles[s.via];
        let answer = match s.reserve {
            None => store.check_async(&charges).await,
            Some(w) => {
                store
                    .reserve_async(&charges, Duration::from_millis(w))
                    .await
            }
        };
        out.push(answer.expect("redis decides"));
    }
    out
}

/// The trace's own promises, whatever the store.
fn assert_trace(algorithm: Algorithm, d: &[Decisions]) {
    let one = |i: usize| d[i].as_slice()[0];
    let secs = Duration::from_millis;
    assert!(one(0).is_allowed() && one(1).is_allowed(), "{algorithm:?}");
    for i in 2..=3 {
        assert!(
            one(i).is_denied() && !one(i).is_banned(),
            "{algorithm:?} {i}"
        );
    }
    assert!(one(4).starts_ban(), "{algorithm:?}: {:?}", one(4));
    assert_eq!(one(4).retry_after(), Some(secs(900_000)));
    assert!(one(5).is_allowed(), "{algorithm:?}: bob");
    for i in 6..=7 {
        assert!(
            one(i).is_banned() && !one(i).starts_ban(),
            "{algorithm:?} {i}"
        );
        assert_eq!(
            one(i).retry_after(),
            Some(secs(602_750)),
            "{algorithm:?} {i}"
        );
        assert_eq!(one(i).remaining(), 0);
    }
    assert!(d[8].is_final() && one(8).is_banned(), "{algorithm:?}");
    assert_eq!(one(8).retry_after(), Some(secs(303_000)));
    assert!(!d[9].is_final() && one(9).is_banned(), "{algorithm:?}");
    assert_eq!(one(10).retry_after(), Some(secs(1)), "{algorithm:?}");
    assert!(
        one(11).is_allowed() && one(12).is_allowed(),
        "{algorithm:?}"
    );
    assert!(one(13).is_denied() && !one(13).is_banned(), "{algorithm:?}");
    assert!(one(14).is_allowed(), "{algorithm:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_made_through_one_handle_refuses_through_another_standalone_and_cluster() {
    let server = RedisServer::start();
    let url = server.url();
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    for algorithm in ALGORITHMS {
        let memory = run_memory(algorithm).await;
        assert_trace(algorithm, &memory);
        let prefix = format!("bans-{}", algorithm);
        let standalone = run_redis(algorithm, async |b: RedisStoreBuilder| {
            b.prefix(&prefix)
                .standalone(&url)
                .await
                .expect("standalone")
        })
        .await;
        assert_trace(algorithm, &standalone);
        assert_eq!(
            standalone, memory,
            "{algorithm:?}: standalone differs from memory"
        );
        let clustered = run_redis(algorithm, async |b: RedisStoreBuilder| {
            b.prefix(&prefix).cluster(&nodes).await.expect("cluster")
        })
        .await;
        assert_eq!(
            clustered, memory,
            "{algorithm:?}: Cluster differs from memory"
        );
    }
}

/// The ban lives in its own key, in the limiter key's slot, with a TTL equal to what remains
/// of the ban; a ban that started through one handle is answered by the other one's negative
/// cache afterwards without changing its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ban_key_shares_the_hash_tag_and_expires_with_the_ban() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let build = async || {
        RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .prefix("ttl")
            .standalone(&server.url())
            .await
            .expect("standalone")
    };
    let policy = Policy::new("p", Quota::per_hour(NonZeroU32::new(1).unwrap())).with_ban(
        Ban::after(NonZeroU32::MIN, Duration::from_secs(60)).lasting(Duration::from_secs(30)),
    );
    let (mut a, mut b) = (build().await, build().await);
    let (ia, ib) = (a.register(&policy).unwrap(), b.register(&policy).unwrap());
    let dave = Key::from("dave");
    clock.set(1_000 * MS);
    assert!(
        a.check_async(&[(ia, dave.clone(), 1)])
            .await
            .unwrap()
            .is_allowed()
    );
    let start = a.check_async(&[(ia, dave.clone(), 1)]).await.unwrap();
    // The hourly quota's wait is longer than the 30 s ban: it shows.
    assert!(start.starts_ban());
    let limiter = a.redis_key(ia, &dave).unwrap();
    assert_eq!(limiter, "ttl:v2:{s:dave}:p");
    let ttl: i64 = server
        .cli(&["PTTL", "ttl:v2:{s:dave}:ban:p"])
        .and_then(|t| t.trim().parse().ok())
        .expect("the ban key exists");
    // What remains of the ban (30 s; the count ended with it), counted in real time since.
    assert!((25_000..=30_000).contains(&ttl), "{ttl}");
    for _ in 0..3 {
        clock.set(11_000 * MS);
        let d = b.check_async(&[(ib, dave.clone(), 1)]).await.unwrap();
        assert!(d.as_slice()[0].is_banned() && !d.starts_ban());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(20)));
    }
    // At the ban's end, the quota decides again (and its refusal bans anew).
    clock.set(31_000 * MS);
    let after = b.check_async(&[(ib, dave.clone(), 1)]).await.unwrap();
    assert!(after.starts_ban(), "{after:?}");
}

/// The tiered store never leases a policy with a ban: a hot key spends leased units of its
/// plain policy, while its policy with a ban goes to Redis every time, so a ban made through
/// one instance refuses at once through another (no leased unit outlives it), until its
/// exact end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tiered_store_honours_a_ban_made_through_another_instance() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let plain = Policy::new("plain", Quota::per_second(NonZeroU32::new(1_000).unwrap()));
    // 100 per second; banned for 10 s after 2 refusals within 1 s.
    let banned = Policy::new("banned", Quota::per_second(NonZeroU32::new(100).unwrap())).with_ban(
        Ban::after(NonZeroU32::new(2).unwrap(), Duration::from_secs(1))
            .lasting(Duration::from_secs(10)),
    );
    let mut stores = Vec::new();
    for _ in 0..2 {
        let redis = RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .min_ttl(Duration::from_secs(3_600))
            .prefix("tiered-bans")
            .standalone(&server.url())
            .await
            .expect("standalone");
        let mut store = TieredStore::builder()
            .max_lease(NonZeroU32::new(50).unwrap())
            .build(redis)
            .expect("tiered");
        let ids = (
            store.register(&plain).expect("plain"),
            store.register(&banned).expect("banned"),
        );
        stores.push((store, ids));
    }
    let check = async |i: usize, banned_policy: bool| {
        let (store, (p, b)) = &stores[i];
        let id = if banned_policy { *b } else { *p };
        let key = Key::from("hot");
        match store.check(&[Charge::new(id, &key, 1)]) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        }
        .expect("decides")
    };
    clock.set(5_000 * MS);
    // Instance 0 takes the whole budget of "banned"; none of it is leased.
    for _ in 0..100 {
        assert!(check(0, true).await.is_allowed());
        assert!(check(0, false).await.is_allowed());
    }
    let hot = Key::from("hot");
    let (s0, (p0, b0)) = &stores[0];
    assert_eq!(s0.held(*b0, &hot), 0, "a policy with a ban is never leased");
    assert!(s0.held(*p0, &hot) > 0, "the plain policy leases");
    // Two refusals through instance 1 ban the key; instance 0 is refused at once.
    assert!(!check(1, true).await.is_allowed());
    assert!(check(1, true).await.starts_ban());
    clock.set(6_000 * MS);
    let d = check(0, true).await;
    assert!(d.as_slice()[0].is_banned(), "{d:?}");
    assert_eq!(d.retry_after(), Some(Duration::from_secs(9)));
    // The plain policy of the same key is not banned.
    assert!(check(0, false).await.is_allowed());
    clock.set(14_999 * MS);
    assert_eq!(
        check(1, true).await.retry_after(),
        Some(Duration::from_millis(1))
    );
    clock.set(15_000 * MS);
    assert!(check(0, true).await.is_allowed());
    assert!(check(1, true).await.is_allowed());
}
