//! The sliding log and Delay-mode reservations on Redis: they decide exactly as
//! the memory store (standalone and Cluster), and every key their scripts write has a TTL.

use std::time::Duration;

use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::{OwnedCharge, RedisStore, RedisStoreBuilder};
use ratekeeper_axum::core::store::{
    Charge, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_axum::{core::Algorithm, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};

const MS: u64 = 1_000_000;

fn quota(limit: u32, period_ms: u64, burst: u32) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .and_then(|q| q.with_burst(burst))
        .expect("valid quota")
}

/// Every T and W is a whole µs, so ns (memory) and µs (Redis) agree.
fn policies() -> Vec<Policy> {
    vec![
        // 0: sliding log, 4 per 10 s.
        Policy::new("log", quota(4, 10_000, 4)).with_algorithm(Algorithm::SlidingLog),
        // 1: GCRA 2 per s, burst 1 (T = 500 ms).
        Policy::new("pace", quota(2, 1_000, 1)),
        // 2: leaky bucket 5 per s, queue depth 2 (T = 200 ms).
        Policy::new("leaky", quota(5, 1_000, 2)).with_algorithm(Algorithm::LeakyBucket),
        // 3: fixed window 3 per 10 s.
        Policy::new("fw", quota(3, 10_000, 3)).with_algorithm(Algorithm::FixedWindow),
        // 4: sliding log, 3 per s.
        Policy::new("log2", quota(3, 1_000, 3)).with_algorithm(Algorithm::SlidingLog),
        // 5: GCRA 10 per 60 s (T = 6 s).
        Policy::new("api", quota(10, 60_000, 10)),
    ]
}

#[derive(Clone, Copy)]
enum Op {
    Check,
    /// Reserve for a request that may wait this many ms.
    Reserve(u64),
    /// Give back what step `of` took, with its receipts.
    Refund(usize),
}

struct Step {
    t: u64,
    charges: Vec<(usize, &'static str)>,
    cost: u64,
    op: Op,
}

fn check(t: u64, charges: &[(usize, &'static str)], cost: u64) -> Step {
    Step {
        t,
        charges: charges.to_vec(),
        cost,
        op: Op::Check,
    }
}

fn reserve(t: u64, charges: &[(usize, &'static str)], cost: u64, max_wait_ms: u64) -> Step {
    Step {
        t,
        charges: charges.to_vec(),
        cost,
        op: Op::Reserve(max_wait_ms),
    }
}

fn refund(t: u64, of: usize) -> Step {
    Step {
        t,
        charges: Vec::new(),
        cost: 0,
        op: Op::Refund(of),
    }
}

/// Sliding log: the half-open window, oldest-first freeing, merges at one instant,
/// cost 0 / n / > limit, all-or-nothing with GCRA and the fixed window on one key, and
/// refunds in and after the window. Indexes are the decisions' (refunds give none).
fn log_trace() -> Vec<Step> {
    vec![
        check(0, &[(0, "ann")], 1),      // 0: remaining 3
        check(1_000, &[(0, "ann")], 2),  // 1: remaining 1
        check(2_000, &[(0, "ann")], 1),  // 2: remaining 0
        check(2_000, &[(0, "ann")], 1),  // 3: denied, retry 8 s (the entry of 0 leaves)
        check(2_000, &[(0, "ann")], 3),  // 4: denied, retry 9 s (the entry of 1 s leaves)
        check(2_000, &[(0, "ann")], 5),  // 5: cannot fit
        check(2_000, &[(0, "ann")], 0),  // 6: free probe
        check(10_000, &[(0, "ann")], 1), // 7: at exactly ts + W the entry of 0 stops counting
        check(10_000, &[(0, "ann")], 1), // 8: denied until 11 s
        check(11_000, &[(0, "ann")], 2), // 9: the entry of 1 s left
        // Merges: five charges at one instant are one entry; a refund takes units off it.
        check(20_000, &[(4, "bea")], 1), // 10
        check(20_000, &[(4, "bea")], 1), // 11
        check(20_000, &[(4, "bea")], 1), // 12: remaining 0
        refund(20_100, 11),              // gives one unit back
        check(20_200, &[(4, "bea")], 1), // 13: allowed
        check(20_200, &[(4, "bea")], 1), // 14: denied until 21 s
        refund(21_000, 10),              // the entry of 20 s expired: nothing
        check(21_000, &[(4, "bea")], 2), // 15: remaining 0 (only 20.2 s counts)
        // All-or-nothing with GCRA and the fixed window on one key (one script).
        check(30_000, &[(0, "cal"), (5, "cal"), (3, "cal")], 1), // 16
        check(30_000, &[(0, "cal"), (5, "cal"), (3, "cal")], 2), // 17
        check(30_000, &[(0, "cal"), (5, "cal"), (3, "cal")], 1), // 18: fw denies: nothing
        check(30_000, &[(0, "cal")], 1),                         // 19: log has 1 left
        check(30_000, &[(0, "cal")], 1),                         // 20: denied
        // Different keys in one request: reserve then refund across keys.
        check(40_000, &[(0, "dee"), (4, "eve")], 3), // 21
        check(40_000, &[(0, "dee"), (4, "eve")], 1), // 22: eve denies; dee gives back
        check(40_000, &[(0, "dee")], 1),             // 23: remaining 0 (dee has 3 + 1)
        // A refund in the middle of the log moves the running totals of the later entries.
        check(50_000, &[(4, "fin")], 1), // 24
        check(50_100, &[(4, "fin")], 1), // 25
        check(50_200, &[(4, "fin")], 1), // 26: remaining 0
        refund(50_300, 25),              // the middle entry leaves
        check(50_300, &[(4, "fin")], 1), // 27: allowed, remaining 0
        check(50_300, &[(4, "fin")], 2), // 28: denied until the entry of 50.2 s leaves
        check(51_000, &[(4, "fin")], 1), // 29: the entry of 50 s left
    ]
}

/// Delay-mode reservations: GCRA books turns T apart and a denial beyond `max_wait` is
/// final; a dropped reservation with a later waiter gives back nothing, the latest one its
/// whole slot; the leaky bucket queues up to its depth; window algorithms check (not
/// final); several policies reserve all-or-nothing with the longest delay.
fn reserve_trace() -> Vec<Step> {
    vec![
        reserve(100_000, &[(1, "fay")], 1, 1_000), // 0: delay 0
        reserve(100_000, &[(1, "fay")], 1, 1_000), // 1: delay 500 ms
        reserve(100_000, &[(1, "fay")], 1, 1_000), // 2: delay 1 s
        reserve(100_000, &[(1, "fay")], 1, 1_000), // 3: denied, final, retry 500 ms
        refund(100_100, 1),                        // a later reservation waits: nothing
        reserve(100_100, &[(1, "fay")], 1, 1_000), // 4: still denied
        refund(100_100, 2),                        // the latest: gives back its slot
        reserve(100_100, &[(1, "fay")], 1, 1_000), // 5: delay 900 ms
        reserve(100_100, &[(1, "fay")], 2, 5_000), // 6: cannot fit (burst 1), final
        reserve(100_100, &[(1, "fay")], 0, 0),     // 7: free probe
        check(100_100, &[(1, "fay")], 1),          // 8: a check never takes a booked turn
        // Leaky-bucket shaper: queue depth 2, T = 200 ms.
        reserve(110_000, &[(2, "gus")], 1, 1_000), // 9: delay 0
        reserve(110_000, &[(2, "gus")], 1, 1_000), // 10: delay 200 ms
        reserve(110_000, &[(2, "gus")], 1, 1_000), // 11: queue full: denied, final
        reserve(110_000, &[(2, "gus")], 1, 100),   // 12: denied, final
        // Window algorithms check (denials not final).
        reserve(120_000, &[(3, "hal")], 3, 1_000), // 13
        reserve(120_000, &[(3, "hal")], 1, 1_000), // 14: denied, not final
        reserve(120_000, &[(0, "hal")], 4, 1_000), // 15: sliding log: allowed now
        reserve(120_000, &[(0, "hal")], 1, 1_000), // 16: denied, not final
        // Several policies on one key: the longest delay; all-or-nothing.
        reserve(130_000, &[(1, "ida"), (5, "ida")], 1, 2_000), // 17: delay 0
        reserve(130_000, &[(1, "ida"), (5, "ida")], 1, 2_000), // 18: delay 500 ms
        reserve(130_000, &[(5, "ida"), (1, "ida")], 1, 600),   // 19: pace denies, final
        reserve(130_000, &[(3, "ida"), (1, "ida")], 4, 2_000), // 20: cannot fit (fw), final
        reserve(130_000, &[(1, "ida"), (3, "ida")], 1, 2_000), // 21: delay 1 s
        // Different keys: the second key's denial gives the first key's turn back.
        reserve(140_000, &[(1, "jo"), (3, "kit")], 1, 1_000), // 22: delay 0
        reserve(140_000, &[(3, "kit")], 2, 1_000),            // 23: fw full now
        reserve(140_000, &[(1, "jo"), (3, "kit")], 1, 1_000), // 24: kit denies, jo undone
        reserve(140_000, &[(1, "jo")], 1, 1_000),             // 25: delay 500 ms (not 1 s)
    ]
}

/// A pseudo-random sliding-log trace (fixed seed): costs 0..=4 on limits 4 and 3, times
/// that advance by 0..700 ms (so entries merge, expire and pile up), several keys, a second
/// policy on the same key, and refunds of earlier decisions (in the window, after it, of
/// denials). Compared, not spot-checked: the decisions of memory, standalone and Cluster.
fn random_log_trace() -> Vec<Step> {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let keys = ["r1", "r2", "r3"];
    let mut v = Vec::new();
    let mut t = 600_000;
    let mut decisions = 0;
    for _ in 0..400 {
        t += next(700);
        if decisions > 0 && next(6) == 0 {
            v.push(refund(t, usize::try_from(next(decisions)).unwrap()));
            continue;
        }
        let key = keys[usize::try_from(next(3)).unwrap()];
        let charges: &[(usize, &'static str)] = match next(4) {
            0 => &[(0, "r1"), (4, "r1")],
            _ if next(2) == 0 => &[(0, key)],
            _ => &[(4, key)],
        };
        v.push(check(t, charges, next(5)));
        decisions += 1;
    }
    v
}

fn run_memory(trace: &[Step]) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut store = MemoryStore::<Key, _>::with_clock(clock.clone());
    let ids: Vec<PolicyId> = policies()
        .iter()
        .map(|p| store.register(p).expect("register"))
        .collect();
    let mut seen: Vec<Option<Decisions>> = Vec::new();
    for s in trace {
        clock.set(s.t * MS);
        let charged = match s.op {
            Op::Refund(j) => step_at(trace, j),
            _ => s,
        };
        let keys: Vec<Key> = charged.charges.iter().map(|(_, k)| Key::from(*k)).collect();
        let charges: Vec<Charge<'_, Key>> = charged
            .charges
            .iter()
            .zip(&keys)
            .map(|((p, _), k)| Charge::new(ids[*p], k, charged.cost))
            .collect();
        let d = match s.op {
            Op::Refund(j) => {
                let taken = seen[j].as_ref().expect("refund of a decision");
                let refunds: Vec<Refund<'_, Key>> = charges
                    .iter()
                    .zip(taken.receipts())
                    .map(|(c, r)| Refund::new(*c, r))
                    .collect();
                store.refund(&refunds);
                None
            }
            Op::Check => Some(store.check_now(&charges).expect("memory decides")),
            Op::Reserve(ms) => Some(
                store
                    .reserve_now(&charges, Duration::from_millis(ms))
                    .expect("memory reserves"),
            ),
        };
        seen.push(d);
    }
    seen.into_iter().flatten().collect()
}

/// Refund steps name the index of the step (not of the decision) they give back.
fn step_at(trace: &[Step], j: usize) -> &Step {
    &trace[j]
}

/// The trace's steps with refunds naming decision indexes turned into step indexes.
fn resolve(mut trace: Vec<Step>) -> Vec<Step> {
    let mut step_of_decision = Vec::new();
    for (i, s) in trace.iter().enumerate() {
        if !matches!(s.op, Op::Refund(_)) {
            step_of_decision.push(i);
        }
    }
    for s in &mut trace {
        if let Op::Refund(d) = s.op {
            s.op = Op::Refund(step_of_decision[d]);
        }
    }
    trace
}

const MIN_TTL: Duration = Duration::from_secs(3_600);

async fn run_redis(
    trace: &[Step],
    build: impl AsyncFnOnce(RedisStoreBuilder) -> RedisStore,
) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut store = build(
        RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .min_ttl(MIN_TTL),
    )
    .await;
    let ids: Vec<PolicyId> = policies()
        .iter()
        .map(|p| store.register(p).expect("register"))
        .collect();
    let mut seen: Vec<Option<Decisions>> = Vec::new();
    for s in trace {
        clock.set(s.t * MS);
        let charged = match s.op {
            Op::Refund(j) => &trace[j],
            _ => s,
        };
        let charges: Vec<OwnedCharge> = charged
            .charges
            .iter()
            .map(|(p, k)| (ids[*p], Key::from(*k), charged.cost))
            .collect();
        let d = match s.op {
            Op::Refund(j) => {
                let taken = seen[j].as_ref().expect("refund of a decision");
                let refunds: Vec<(OwnedCharge, Receipt)> =
                    charges.into_iter().zip(taken.receipts()).collect();
                store.refund_async(&refunds).await.expect("redis refunds");
                None
            }
            Op::Check => Some(store.check_async(&charges).await.expect("redis decides")),
            Op::Reserve(ms) => Some(
                store
                    .reserve_async(&charges, Duration::from_millis(ms))
                    .await
                    .expect("redis reserves"),
            ),
        };
        seen.push(d);
    }
    assert_eq!(store.stats().degraded, 0);
    seen.into_iter().flatten().collect()
}

fn allowed(d: &[Decisions]) -> Vec<bool> {
    d.iter().map(Decisions::is_allowed).collect()
}

fn assert_log_values(d: &[Decisions]) {
    assert_eq!(
        allowed(d),
        [
            true, true, true, false, false, false, true, true, false, true, // 0..10
            true, true, true, true, false, true, // 10..16
            true, true, false, true, false, // 16..21
            true, false, true, // 21..24
            true, true, true, true, false, true // 24..30
        ]
    );
    assert_eq!(d[27].as_slice()[0].remaining(), 0);
    assert_eq!(d[28].retry_after(), Some(Duration::from_millis(900)));
    assert_eq!(d[29].as_slice()[0].remaining(), 0);
    assert_eq!(d[0].as_slice()[0].remaining(), 3);
    assert_eq!(d[2].as_slice()[0].remaining(), 0);
    assert_eq!(d[3].retry_after(), Some(Duration::from_secs(8)));
    assert_eq!(d[4].retry_after(), Some(Duration::from_secs(9)));
    assert!(d[5].is_cannot_fit());
    assert_eq!(d[8].retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(d[14].retry_after(), Some(Duration::from_millis(800)));
    assert_eq!(d[15].as_slice()[0].remaining(), 0);
    assert_eq!(d[19].as_slice()[0].remaining(), 0);
    assert_eq!(d[23].as_slice()[0].remaining(), 0);
}

/// The random trace admits and denies both (so the comparison covers both paths).
fn assert_mixed(d: &[Decisions]) {
    let admitted = d.iter().filter(|x| x.is_allowed()).count();
    assert!(
        admitted > 50 && admitted + 50 < d.len(),
        "{admitted} of {}",
        d.len()
    );
}

fn assert_reserve_values(d: &[Decisions]) {
    let delays: Vec<u64> = d
        .iter()
        .map(|x| u64::try_from(x.delay().as_millis()).unwrap())
        .collect();
    assert_eq!(&delays[..3], [0, 500, 1_000]);
    assert!(!d[3].is_allowed() && d[3].is_final());
    assert_eq!(d[3].retry_after(), Some(Duration::from_millis(500)));
    assert!(!d[4].is_allowed());
    assert!(d[5].is_allowed());
    assert_eq!(delays[5], 900);
    assert!(d[6].is_cannot_fit() && d[6].is_final());
    assert!(d[7].is_allowed() && delays[7] == 0);
    assert!(!d[8].is_allowed());
    assert_eq!(&delays[9..11], [0, 200]);
    assert!(!d[11].is_allowed() && d[11].is_final());
    assert!(!d[12].is_allowed() && d[12].is_final());
    assert!(d[13].is_allowed());
    assert!(!d[14].is_allowed() && !d[14].is_final());
    assert!(d[15].is_allowed());
    assert!(!d[16].is_allowed() && !d[16].is_final());
    assert_eq!(&delays[17..19], [0, 500]);
    assert!(!d[19].is_allowed() && d[19].is_final());
    assert!(d[20].is_cannot_fit() && d[20].is_final());
    assert!(d[21].is_allowed());
    assert_eq!(delays[21], 1_000);
    assert!(d[22].is_allowed() && d[23].is_allowed());
    assert!(!d[24].is_allowed() && !d[24].is_final());
    assert_eq!(delays[25], 500);
}

/// Conformance: the sliding log and reservations on memory, standalone and Cluster give
/// identical decisions (decisions, delays and finality; headers included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_sliding_log_and_reservations_memory_standalone_cluster() {
    let server = RedisServer::start();
    let url = server.url();
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    for (name, trace, expect) in [
        (
            "log",
            resolve(log_trace()),
            assert_log_values as fn(&[Decisions]),
        ),
        ("reserve", resolve(reserve_trace()), assert_reserve_values),
        ("random-log", resolve(random_log_trace()), assert_mixed),
    ] {
        let memory = run_memory(&trace);
        expect(&memory);
        let standalone = run_redis(&trace, async |b: RedisStoreBuilder| {
            b.prefix(name).standalone(&url).await.expect("standalone")
        })
        .await;
        assert_eq!(standalone, memory, "{name}: standalone differs from memory");
        let clustered = run_redis(&trace, async |b: RedisStoreBuilder| {
            b.prefix(name).cluster(&nodes).await.expect("cluster")
        })
        .await;
        assert_eq!(clustered, memory, "{name}: Cluster differs from memory");
    }
}

/// Every `ttl:*` key on `server` with its PTTL.
fn pttls(server: &RedisServer) -> Vec<(String, i64)> {
    server.key_ttls("ttl:*")
}

/// Sliding-log charges (allowed, denied, refunded), reservations (GCRA turns booked beyond
/// the burst, the leaky-bucket shaper, a dropped reservation refunded) and concurrency slots
/// (held, renewed, one released), in real time; returns the slot leases still held.
async fn ttl_workload(mut store: RedisStore) -> Vec<ratekeeper_axum::core::store::slots::Acquired> {
    use ratekeeper_axum::core::store::slots::{Acquired, SharedSlots};
    let log = store
        .register(&Policy::new("log", quota(3, 10_000, 3)).with_algorithm(Algorithm::SlidingLog))
        .expect("register");
    let pace = store
        .register(&Policy::new("pace", quota(2, 1_000, 1)))
        .expect("register");
    let leaky = store
        .register(&Policy::new("leaky", quota(5, 1_000, 2)).with_algorithm(Algorithm::LeakyBucket))
        .expect("register");
    let k = Key::from("tess");
    let slots = store.slots().lease(Duration::from_millis(900));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(slots.acquire(&k, 5).await.expect("slot"));
    }
    assert!(held.iter().all(|a| matches!(a, Acquired::Held { .. })));
    held.pop(); // released in the background
    // Past a renewal (every 300 ms), so the renewed lease is checked too.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let mut taken = Vec::new();
    for cost in [1, 2, 1] {
        taken.push(
            store
                .check_async(&[(log, k.clone(), cost)])
                .await
                .expect("log"),
        );
    }
    assert!(!taken[2].is_allowed());
    store
        .refund_async(&[((log, k.clone(), 1), taken[0].receipt(0))])
        .await
        .expect("refund");
    let wait = Duration::from_secs(5);
    let mut delays = Vec::new();
    let mut last = None;
    // Turns are booked on Redis's clock from the first reservation: the third is 1 000 ms
    // after it, less the real time that passed until the third call (a loaded machine).
    let booking = std::time::Instant::now();
    for _ in 0..3 {
        let d = store
            .reserve_async(&[(pace, k.clone(), 1)], wait)
            .await
            .expect("reserve");
        delays.push(d.delay());
        last = Some(d.receipt(0));
    }
    // The last turn is booked beyond the burst (TAT > now + tau); dropping it refunds it.
    let spent = booking.elapsed();
    assert!(
        delays[2] + spent >= Duration::from_millis(900),
        "{delays:?} after {spent:?}"
    );
    store
        .refund_async(&[((pace, k.clone(), 1), last.expect("receipt"))])
        .await
        .expect("refund");
    for _ in 0..2 {
        let d = store
            .reserve_async(&[(leaky, k.clone(), 1)], wait)
            .await
            .expect("shape");
        assert!(d.is_allowed());
    }
    held
}

fn assert_ttls(all: &[(String, i64)]) {
    let names: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    // The log (10 s window) and the held slots (renewed while held) outlive the read. The
    // pace and shaper keys live 1 s and 400 ms after their last write, which a loaded
    // machine can spend before the read: gone, they had a TTL (a key without one never
    // goes); present, they are checked below like every key.
    for suffix in [":log", ":conc:concurrency"] {
        assert!(
            names.iter().any(|k| k.ends_with(suffix)),
            "no key ending in {suffix}: {names:?}"
        );
    }
    for (k, ttl) in all {
        assert!(*ttl >= 0, "key {k} has PTTL {ttl}");
        // No key outlives its state: the log's window (10 s), the booked turns (1 s), the
        // shaper's queue (400 ms) and the slots' lease (900 ms).
        assert!(*ttl <= 10_000, "key {k} has PTTL {ttl}");
    }
}

/// Every key the sliding-log, reservation and concurrency-slot scripts write has a TTL, on
/// standalone Redis and on every Cluster node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_the_new_scripts_has_a_ttl() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("ttl")
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("standalone");
    let held = ttl_workload(store).await;
    assert_ttls(&pttls(&server));
    drop(held);

    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::builder()
        .prefix("ttl")
        .deadline(DECISION_DEADLINE)
        .cluster(&nodes)
        .await
        .expect("cluster");
    let held = ttl_workload(store).await;
    let all: Vec<(String, i64)> = cluster.nodes.iter().flat_map(pttls).collect();
    assert_ttls(&all);
    drop(held);
}

/// The tower layer's Delay mode on the Redis store reserves exactly: five requests at once
/// on GCRA (burst 1, T = 200 ms) with `max_wait` = 3T are booked the turns 0, T, 2T, 3T and
/// reach the handler no earlier than those times, with one round trip each (no re-check);
/// the fifth, whose turn 4T lies beyond `max_wait`, gets a final denial and its 429 without
/// asking again.
///
/// Decision time is a manual clock injected into the store (frozen at 0), so the booked
/// turns and delays are exact whenever each request's round trip happens; the store calls
/// are recorded by a [`Booked`] wrapper. The waits themselves are real sleeps, and a loaded
/// machine can only make an entry later than its turn, never earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_mode_on_redis_books_turns_and_rejects_beyond_max_wait_at_once() {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use http::{Request, Response, StatusCode};
    use ratekeeper_axum::rate_limit::Mode;
    use ratekeeper_axum::{RateLimitLayer, key::GlobalKey};
    use ratekeeper_tests::turns::Booked;
    use tower::{Service, ServiceExt, service_fn};

    let server = RedisServer::start();
    let t = Duration::from_millis(200);
    let redis = RedisStore::builder()
        .prefix("delay")
        .clock(ManualClock::new())
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("redis store");
    let (store, turns) = Booked::new(redis, Duration::from_micros(1));
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("p", quota(1, 200, 1)))
        .key(GlobalKey)
        .store(store)
        .mode(Mode::Delay { max_wait: t * 3 })
        .build()
        .expect("layer");
    let entries: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let log = Arc::clone(&entries);
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(move |_req: Request<()>| {
            log.lock().unwrap().push(Instant::now());
            std::future::ready(Ok::<_, std::convert::Infallible>(Response::new(
                String::new(),
            )))
        }),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let future = svc.ready().await.unwrap().call(Request::new(()));
        tasks.push(tokio::spawn(async move {
            future.await.expect("infallible").status()
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((served, limited), (4, 1), "{statuses:?}");
    // On the store's clock: one answer per request (nobody asked again), the turns booked
    // exactly 0, T, 2T, 3T (receipts T apart), the fifth denied for good.
    let booked = turns.log();
    assert_eq!(booked.answers, 5, "{booked:?}");
    assert_eq!(booked.errors, 0, "{booked:?}");
    assert_eq!(booked.denials, [true], "{booked:?}");
    let mut delays = booked.delays.clone();
    delays.sort();
    assert_eq!(delays, [Duration::ZERO, t, t * 2, t * 3], "{booked:?}");
    assert_eq!(booked.min_spacing, Some(t), "{booked:?}");
    // On the app's clock: nobody entered before its turn.
    let mut entries = entries.lock().unwrap().clone();
    entries.sort();
    for (i, e) in entries.iter().enumerate() {
        let at = e.duration_since(start);
        let turn = t * u32::try_from(i).unwrap();
        assert!(
            at >= turn,
            "request {i} entered at {at:?}, its turn is {turn:?}"
        );
    }
}
