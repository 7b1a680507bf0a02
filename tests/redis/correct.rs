//! Corrections (`Store::correct`) on the shared stores against real `redis-server`
//! processes: after a fleet of two store handles on one server (standalone, Cluster, tiered)
//! charges estimates and corrects them to their true costs in an interleaved order, the key
//! uses exactly the sum of the true costs, as the memory store does; an extra charge is
//! forced and waited out as in the memory store; every key a correction writes has its TTL.

use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::{OwnedCharge, RedisStore, RedisStoreBuilder};
use ratekeeper_axum::core::store::tiered::TieredStore;
use ratekeeper_axum::core::store::{
    Charge, Checked, Correction, Decisions, MemoryStore, PolicyId, Receipt, Store,
};
use ratekeeper_axum::{core::Algorithm, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

const MS: u64 = 1_000_000;

/// The algorithms the Redis store runs.
const ON_REDIS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// Longer than the test: Redis's real-time expiry never acts on the injected timeline.
const MIN_TTL: Duration = Duration::from_secs(3_600);

fn policy(algorithm: Algorithm, limit: u32, period_ms: u64) -> Policy {
    let quota = Quota::new(limit, Duration::from_millis(period_ms)).expect("valid quota");
    Policy::new("tokens", quota).with_algorithm(algorithm)
}

/// One request of a run: its estimate, its true cost, the handle that charges it and the
/// handle that corrects it.
#[derive(Debug, Clone, Copy)]
struct Request {
    estimate: u64,
    actual: u64,
    charged_by: usize,
    corrected_by: usize,
}

/// A run: `n` requests and the interleaving of their starts and ends (each index twice:
/// first its charge, then its correction), from a fixed seed (xorshift64), so every store
/// sees the same run.
fn run_of(n: usize, seed: u64) -> (Vec<Request>, Vec<usize>) {
    let mut x = seed;
    let mut next = move |bound: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % bound
    };
    let requests = (0..n)
        .map(|i| Request {
            estimate: 1 + next(20),
            actual: next(41),
            charged_by: i % 2,
            corrected_by: usize::from(next(2) == 1),
        })
        .collect();
    let mut order: Vec<usize> = (0..n).flat_map(|i| [i, i]).collect();
    for i in (1..order.len()).rev() {
        let j = usize::try_from(next(u64::try_from(i + 1).expect("small"))).expect("small");
        order.swap(i, j);
    }
    (requests, order)
}

/// The capacity of the runs' quota: every estimate and true cost of 40 requests fits.
const CAPACITY: u32 = 40 * (20 + 40);

/// What a store does with a run's steps.
trait Fleet {
    /// Charges `cost` through handle `by`: the decision's (allowed, remaining) and receipt.
    async fn charge(&self, by: usize, cost: u64) -> ((bool, u32), Receipt);
    /// Corrects through handle `by`, waiting until it is settled.
    async fn correct(&self, by: usize, cost: u64, receipt: Receipt, actual: u64);
    /// The key's remaining units (a free probe through handle 0).
    async fn remaining(&self) -> u32;
}

/// Runs `requests` in `order`; returns every charge's (allowed, remaining) and the sum of
/// the true costs of the admitted requests.
async fn play(
    fleet: &impl Fleet,
    requests: &[Request],
    order: &[usize],
) -> (Vec<(bool, u32)>, u64) {
    let mut receipts: Vec<Option<Receipt>> = vec![None; requests.len()];
    let mut started = vec![false; requests.len()];
    let (mut seen, mut total) = (Vec::new(), 0);
    for &i in order {
        let r = requests[i];
        if !started[i] {
            started[i] = true;
            let (decision, receipt) = fleet.charge(r.charged_by, r.estimate).await;
            seen.push(decision);
            if decision.0 {
                receipts[i] = Some(receipt);
                total += r.actual;
            }
        } else if let Some(receipt) = receipts[i].take() {
            fleet
                .correct(r.corrected_by, r.estimate, receipt, r.actual)
                .await;
        }
    }
    (seen, total)
}

struct Memory(MemoryStore<Key, ManualClock>, PolicyId, Key);

impl Fleet for Memory {
    async fn charge(&self, _by: usize, cost: u64) -> ((bool, u32), Receipt) {
        let d = self
            .0
            .check_now(&[Charge::new(self.1, &self.2, cost)])
            .expect("decides");
        ((d.is_allowed(), d.as_slice()[0].remaining()), d.receipt(0))
    }
    async fn correct(&self, _by: usize, cost: u64, receipt: Receipt, actual: u64) {
        let charge = Charge::new(self.1, &self.2, cost);
        self.0.correct(&[Correction::new(charge, receipt, actual)]);
    }
    async fn remaining(&self) -> u32 {
        self.charge(0, 0).await.0.1
    }
}

/// Two Redis store handles (an app fleet) on one server or cluster.
struct Redis([(RedisStore, PolicyId); 2], Key);

impl Fleet for Redis {
    async fn charge(&self, by: usize, cost: u64) -> ((bool, u32), Receipt) {
        let (store, id) = &self.0[by];
        let d = store
            .check_async(&[(*id, self.1.clone(), cost)])
            .await
            .expect("redis decides");
        ((d.is_allowed(), d.as_slice()[0].remaining()), d.receipt(0))
    }
    async fn correct(&self, by: usize, cost: u64, receipt: Receipt, actual: u64) {
        let (store, id) = &self.0[by];
        let charge: OwnedCharge = (*id, self.1.clone(), cost);
        store
            .correct_async(&[(charge, receipt, actual)])
            .await
            .expect("redis corrects");
    }
    async fn remaining(&self) -> u32 {
        self.charge(0, 0).await.0.1
    }
}

/// Two tiered store handles (leases) over one Redis server.
struct Tiered([(TieredStore, PolicyId); 2], Key);

impl Fleet for Tiered {
    async fn charge(&self, by: usize, cost: u64) -> ((bool, u32), Receipt) {
        let (store, id) = &self.0[by];
        let d = match store.check(&[Charge::new(*id, &self.1, cost)]) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        }
        .expect("tiered decides");
        ((d.is_allowed(), d.as_slice()[0].remaining()), d.receipt(0))
    }
    async fn correct(&self, by: usize, cost: u64, receipt: Receipt, actual: u64) {
        let (store, id) = &self.0[by];
        let charge = Charge::new(*id, &self.1, cost);
        store
            .correct_async(&[Correction::new(charge, receipt, actual)])
            .await
            .expect("tiered corrects");
    }
    async fn remaining(&self) -> u32 {
        unreachable!("read through a plain Redis store after shutdown")
    }
}

/// The memory store's run of `algorithm` (frozen at 1 800 s into an hour's window).
async fn on_memory(
    algorithm: Algorithm,
    requests: &[Request],
    order: &[usize],
) -> (Vec<(bool, u32)>, u32) {
    let clock = ManualClock::new();
    clock.set(1_800_000 * MS);
    let mut store = MemoryStore::with_clock(clock);
    let id = store
        .register(&policy(algorithm, CAPACITY, 3_600_000))
        .expect("register");
    let memory = Memory(store, id, Key::from("client"));
    let (seen, _) = play(&memory, requests, order).await;
    let left = memory.remaining().await;
    (seen, left)
}

/// A Redis store handle built by `build` on `clock` (prefix per algorithm), nothing
/// registered.
async fn handle(
    algorithm: Algorithm,
    clock: &ManualClock,
    build: &impl AsyncFn(RedisStoreBuilder) -> RedisStore,
) -> RedisStore {
    build(
        RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .min_ttl(MIN_TTL)
            .prefix(format!("correct-{algorithm}")),
    )
    .await
}

/// Two Redis handles built by `build`, on an injected clock frozen at 1 800 s into an
/// hour's window, so nothing refills.
async fn redis_fleet(
    algorithm: Algorithm,
    build: impl AsyncFn(RedisStoreBuilder) -> RedisStore,
) -> Redis {
    let clock = ManualClock::new();
    clock.set(1_800_000 * MS);
    let mut handles = Vec::new();
    for _ in 0..2 {
        let mut store = handle(algorithm, &clock, &build).await;
        let id = store
            .register(&policy(algorithm, CAPACITY, 3_600_000))
            .expect("register");
        handles.push((store, id));
    }
    let [a, b]: [(RedisStore, PolicyId); 2] = handles.try_into().expect("two handles");
    Redis([a, b], Key::from("client"))
}

/// Standalone and Cluster, every algorithm: two app instances charge 40 estimates and
/// correct them (each correction through either instance) in an interleaved order; the
/// key then uses exactly the sum of the true costs, and every decision on the way is the
/// memory store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrections_leave_the_sum_of_true_costs_on_redis_standalone_and_cluster() {
    let server = RedisServer::start();
    let url = server.url();
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    for (seed, algorithm) in (1..).zip(ON_REDIS) {
        let (requests, order) = run_of(40, 0x9e37_79b9_7f4a_7c15 ^ seed);
        let (expected, left) = on_memory(algorithm, &requests, &order).await;
        let standalone = redis_fleet(algorithm, async |b: RedisStoreBuilder| {
            b.standalone(&url).await.expect("standalone")
        })
        .await;
        let clustered = redis_fleet(algorithm, async |b: RedisStoreBuilder| {
            b.cluster(&nodes).await.expect("cluster")
        })
        .await;
        for (name, fleet) in [("standalone", standalone), ("cluster", clustered)] {
            let (seen, total) = play(&fleet, &requests, &order).await;
            assert_eq!(
                seen, expected,
                "{algorithm} on {name}: decisions differ from memory"
            );
            let used = u64::from(CAPACITY - fleet.remaining().await);
            assert_eq!(used, total, "{algorithm} on {name}");
            assert_eq!(fleet.remaining().await, left, "{algorithm} on {name}");
            for (store, _) in &fleet.0 {
                assert_eq!(store.stats().errors, 0, "{algorithm} on {name}");
            }
        }
    }
}

/// Two tiered handles (leases of up to 16 units, which an extra charge spends first) on one
/// server, GCRA and the fixed window: after the run and both shutdowns (unused units back
/// to Redis), a plain Redis store sees exactly the sum of the true costs used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrections_leave_the_sum_of_true_costs_on_the_tiered_store() {
    let server = RedisServer::start();
    for (seed, algorithm) in [(7, Algorithm::Gcra), (8, Algorithm::FixedWindow)] {
        let (mut requests, order) = run_of(40, 0x2545_f491_4f6c_dd1d ^ seed);
        // A lease's receipts belong to the instance that spent its units: each request is
        // corrected where it was served.
        for r in &mut requests {
            r.corrected_by = r.charged_by;
        }
        let build =
            async |b: RedisStoreBuilder| b.standalone(&server.url()).await.expect("standalone");
        let clock = ManualClock::new();
        clock.set(1_800_000 * MS);
        let mut tiered = Vec::new();
        for _ in 0..2 {
            let redis = handle(algorithm, &clock, &build).await;
            let mut store = TieredStore::builder()
                .max_lease(std::num::NonZeroU32::new(16).expect("non-zero"))
                .build(redis)
                .expect("tiered");
            let id = store
                .register(&policy(algorithm, CAPACITY, 3_600_000))
                .expect("register");
            tiered.push((store, id));
        }
        let [a, b]: [(TieredStore, PolicyId); 2] = tiered.try_into().expect("two handles");
        let fleet = Tiered([a, b], Key::from("client"));
        let (_, total) = play(&fleet, &requests, &order).await;
        assert!(
            fleet.0.iter().any(|(s, _)| s.stats().local > 0),
            "{algorithm}: some requests spent leased units"
        );
        for (store, _) in &fleet.0 {
            store.shutdown().await.expect("units back to Redis");
        }
        let plain = redis_fleet(algorithm, async |b: RedisStoreBuilder| {
            b.standalone(&server.url()).await.expect("standalone")
        })
        .await;
        let used = u64::from(CAPACITY - plain.remaining().await);
        assert_eq!(used, total, "{algorithm} on the tiered store");
    }
}

/// The memory store's `a_higher_true_cost_is_charged_without_refusal_and_the_debt_is_waited_out`
/// on Redis (10 per 10 s; an estimate of 2 at 0 corrected to 13 at 2 s, a unit at 3 s):
/// the same wait as the memory store for every algorithm; the sliding window counter's
/// debt weighs whole in the next window: 7 s + (10 s - 90 s / 13), not the 8 s of a debt
/// read as the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_charge_is_forced_and_waited_out_on_redis_as_in_memory() {
    let server = RedisServer::start();
    for algorithm in ON_REDIS {
        let clock = ManualClock::new();
        let mut store = RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .min_ttl(MIN_TTL)
            .prefix(format!("debt-{algorithm}"))
            .standalone(&server.url())
            .await
            .expect("standalone");
        let id = store
            .register(&policy(algorithm, 10, 10_000))
            .expect("register");
        let mut memory = MemoryStore::<Key, _>::with_clock(clock.clone());
        let mid = memory
            .register(&policy(algorithm, 10, 10_000))
            .expect("register");
        let key = Key::from("client");
        let d = store
            .check_async(&[(id, key.clone(), 2)])
            .await
            .expect("charge");
        let m = memory
            .check_now(&[Charge::new(mid, &key, 2)])
            .expect("charge");
        clock.set(2_000 * MS);
        store
            .correct_async(&[((id, key.clone(), 2), d.receipt(0), 13)])
            .await
            .expect("correct");
        memory.correct(&[Correction::new(Charge::new(mid, &key, 2), m.receipt(0), 13)]);
        clock.set(3_000 * MS);
        let on_redis: Decisions = store
            .check_async(&[(id, key.clone(), 1)])
            .await
            .expect("check");
        let on_memory = memory
            .check_now(&[Charge::new(mid, &key, 1)])
            .expect("check");
        assert!(!on_redis.is_allowed(), "{algorithm}");
        assert_eq!(
            on_redis.retry_after(),
            on_memory.retry_after(),
            "{algorithm}"
        );
        if algorithm == Algorithm::SlidingWindow {
            // 90 s / 13 = 6.923076923 s: the wait to the ns.
            assert_eq!(
                on_redis.retry_after(),
                Some(Duration::from_nanos(10_076_923_077))
            );
        }
    }
}

/// The memory store's `a_give_back_pays_off_a_debt` on Redis, every algorithm (20 per
/// hour, frozen): a give-back while the key is in debt pays it off, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_pays_off_a_debt_on_redis() {
    let server = RedisServer::start();
    for algorithm in ON_REDIS {
        let clock = ManualClock::new();
        clock.set(1_800_000 * MS);
        let mut store = RedisStore::builder()
            .clock(clock)
            .deadline(DECISION_DEADLINE)
            .min_ttl(MIN_TTL)
            .prefix(format!("pay-{algorithm}"))
            .standalone(&server.url())
            .await
            .expect("standalone");
        let id = store
            .register(&policy(algorithm, 20, 3_600_000))
            .expect("register");
        let key = Key::from("client");
        let mut taken = Vec::new();
        for (estimate, actual) in [(5, 1), (5, 16), (10, 0)] {
            let d = store
                .check_async(&[(id, key.clone(), estimate)])
                .await
                .expect("charge");
            assert!(d.is_allowed(), "{algorithm}");
            taken.push(((id, key.clone(), estimate), d.receipt(0), actual));
        }
        let remaining = async || {
            let d = store
                .check_async(&[(id, key.clone(), 0)])
                .await
                .expect("probe");
            d.as_slice()[0].remaining()
        };
        // The 16 first: 31 used, 11 of debt; then 27 used; then 17.
        store.correct_async(&taken[1..2]).await.expect("correct");
        assert_eq!(remaining().await, 0, "{algorithm}");
        store.correct_async(&taken[..1]).await.expect("correct");
        assert_eq!(remaining().await, 0, "{algorithm}");
        store.correct_async(&taken[2..]).await.expect("correct");
        assert_eq!(remaining().await, 3, "{algorithm}");
    }
}

/// Every key a correction writes has its TTL: an extra charge of 20 units on a full token
/// bucket (10 per 10 s) pushes the TAT 30 s ahead and the PTTL with it; a sliding log entry
/// of the extra units expires a window after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_charge_sets_the_ttl_its_state_needs() {
    let server = RedisServer::start();
    for (algorithm, ttl) in [
        (Algorithm::Gcra, 25_000..=30_000),
        (Algorithm::SlidingLog, 5_000..=10_000),
    ] {
        let mut store = RedisStore::builder()
            .deadline(DECISION_DEADLINE)
            .prefix(format!("ttl-{algorithm}"))
            .standalone(&server.url())
            .await
            .expect("standalone");
        let id = store
            .register(&policy(algorithm, 10, 10_000))
            .expect("register");
        let key = Key::from("client");
        let d = store
            .check_async(&[(id, key.clone(), 10)])
            .await
            .expect("charge");
        store
            .correct_async(&[((id, key.clone(), 10), d.receipt(0), 30)])
            .await
            .expect("correct");
        let name = store.redis_key(id, &key).expect("key name");
        let pttl: i64 = server
            .cli(&["PTTL", &name])
            .and_then(|s| s.trim().parse().ok())
            .expect("PTTL");
        assert!(ttl.contains(&pttl), "{algorithm}: PTTL {pttl}");
        for (k, ttl) in server.key_ttls("ttl-*") {
            assert!(ttl >= 0, "key {k} has PTTL {ttl}");
        }
    }
}

/// A give-back of units spent from a lease that has since expired goes to Redis by the
/// receipt of the lease's grant: once the lease's unused units are back too, a plain Redis
/// store sees exactly the true costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_its_lease_expired_goes_to_redis_by_the_grant() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000 * MS);
    let build = async |b: RedisStoreBuilder| b.standalone(&server.url()).await.expect("standalone");
    // 100 per 10 000 000 s: T = 100 000 s, nothing drains while the test runs.
    let gcra = policy(Algorithm::Gcra, 100, 10_000_000_000);
    let redis = handle(Algorithm::Gcra, &clock, &build).await;
    let mut store = TieredStore::builder()
        .max_lease(std::num::NonZeroU32::new(10).expect("non-zero"))
        .lease_ttl(Duration::from_secs(1))
        .build(redis)
        .expect("tiered");
    let id = store.register(&gcra).expect("register");
    let key = Key::from("client");
    let mut spent_locally = None;
    for _ in 0..6 {
        let d = match store.check(&[Charge::new(id, &key, 2)]) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        }
        .expect("decides");
        assert!(d.is_allowed());
        if d.receipt(0).stamp().is_some_and(|s| s >= 1 << 63) {
            spent_locally = Some(d.receipt(0));
        }
    }
    let receipt = spent_locally.expect("some units were spent from the lease");
    clock.set(1_002_000 * MS); // the lease expired
    let charge = Charge::new(id, &key, 2);
    store
        .correct_async(&[Correction::new(charge, receipt, 0)])
        .await
        .expect("corrects");
    store.shutdown().await.expect("unused units back to Redis");
    let mut plain = handle(Algorithm::Gcra, &clock, &build).await;
    let plain_id = plain.register(&gcra).expect("register");
    let d = plain
        .check_async(&[(plain_id, key, 0)])
        .await
        .expect("decides");
    // 6 charges of 2, one of them corrected to 0: 10 units used.
    assert_eq!(d.as_slice()[0].remaining(), 90, "{d:?}");
}

/// The tiered store's lease script on a fixed window whose count is above the limit (a
/// correction's extra charge, 7 counted of 4): a background renewal (need 0) grants
/// nothing and leaves the count whole, where it used to write the limit back over the
/// debt; a request's lease (need 1) is refused until the window ends.
#[test]
fn a_lease_renewal_leaves_a_fixed_window_debt_whole() {
    let [_, lease_script] = RedisStore::script_texts();
    let server = RedisServer::start();
    let key = "rl:v2:{s:client}:fw";
    // W = 10 s, limit 4; at 1 005 s (window 100, 5 s left) 7 units are counted.
    let state = "100:7:10000000";
    server
        .cli(&["SET", key, state, "PX", "600000"])
        .expect("set");
    let lease = |need: &str| {
        // KEYS: the state, its lease record. ARGV: now µs, no stale guard, no TTL floor,
        // fixed window, W µs, limit, -, need, want, back within 1 s.
        let record = format!("{key}#leased");
        let args = [
            "EVAL",
            lease_script,
            "2",
            key,
            &record,
            "1005000000",
            "",
            "0",
            "2",
            "10000000",
            "4",
            "0",
            need,
            "4",
            "1000000",
        ];
        let reply = server.cli(&args).expect("lease script answers");
        // After the server time: status, granted, code, remaining, reset_after µs,
        // retry_after µs, stamp, leased units, µs until they are back (none here).
        reply.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(
        lease("0"),
        ["0", "0", "0", "0", "5000000", "0", "100", "0", "0"]
    );
    assert_eq!(
        server.cli(&["GET", key]).as_deref().map(str::trim),
        Some(state)
    );
    assert_eq!(
        lease("1"),
        ["0", "0", "1", "0", "5000000", "5000000", "-1", "0", "0"]
    );
    assert_eq!(
        server.cli(&["GET", key]).as_deref().map(str::trim),
        Some(state)
    );
}
