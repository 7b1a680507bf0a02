//! Memory ≡ Redis: seeded, bounded random sequences of check / reserve / refund / correct /
//! peek run on the memory store (the reference) and on a standalone Redis store with an
//! aligned clock, every algorithm the Redis store takes, the answers compared field by
//! field after every step (see `ratekeeper_tests::differential`). proptest shrinks a
//! failing sequence to its smallest form.
//!
//! `SWEEP_CASES` multiplies the number of sequences (default 1) and `SWEEP_SEED` (a number)
//! picks another seed, as for the other sweeps; CI uses neither.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::any;
use proptest::test_runner::TestCaseError;
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::redis::{OwnedCharge, RedisStore};
use ratekeeper_core::store::{
    Charge, Correction, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};
use ratekeeper_tests::differential::{Pair, sequence, start_ns};
use ratekeeper_tests::redis::RedisServer;
use ratekeeper_tests::sweep::seeded_runner;

/// Sequences per run (times `SWEEP_CASES`).
const CASES: u32 = 1_000;
/// Steps per sequence, at most.
const MAX_STEPS: usize = 40;

#[test]
fn memory_and_redis_answer_every_sequence_alike() {
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut runner, seed) = seeded_runner(CASES, 0x6469_6666_6572_656e, 500);
    let case = AtomicU64::new(0);
    let compared = AtomicU64::new(0);
    let result = runner.run(&vec(any::<u8>(), 0..MAX_STEPS * 12), |data| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let steps = sequence(&data, MAX_STEPS);
        let clock = ManualClock::new();
        rt.block_on(async {
            let redis = RedisStore::builder()
                .prefix(format!("diff{n}"))
                .clock(clock.clone())
                .deadline(Duration::from_secs(5))
                // Longer than the test: Redis's real-time expiry never acts on the
                // injected timeline.
                .min_ttl(Duration::from_secs(3_600))
                .standalone(&url)
                .await
                .expect("standalone");
            Pair::new(redis, clock, start_ns(n)).run(&steps).await
        })
        .map(|n| compared.fetch_add(n as u64, Ordering::Relaxed))
        .map_err(TestCaseError::fail)?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("memory and Redis differ (seed {seed}): {e}");
    }
    // The sequences are not empty: most steps compared a check, peek or reservation.
    let compared = compared.into_inner();
    eprintln!("{compared} answers compared");
    assert!(
        compared >= u64::from(CASES) * 10,
        "only {compared} answers compared"
    );
}

const MS: u64 = 1_000_000;

/// A memory store and a Redis store (on its own server) with `policies`, both on clocks at
/// `t0` ms; the Redis store keeps its negative cache (the default).
async fn pair(
    server: &RedisServer,
    policies: &[Policy],
    t0_ms: u64,
) -> (
    MemoryStore<Key, ManualClock>,
    RedisStore,
    ManualClock,
    Vec<PolicyId>,
) {
    let clock = ManualClock::new();
    clock.set(t0_ms * MS);
    let mut memory = MemoryStore::<Key, _>::with_clock(clock.clone());
    let mut redis = RedisStore::builder()
        .clock(clock.clone())
        .deadline(Duration::from_secs(5))
        .min_ttl(Duration::from_secs(3_600))
        .standalone(&server.url())
        .await
        .expect("standalone");
    let mut ids = Vec::new();
    for p in policies {
        ids.push(memory.register(p).expect("memory registers"));
        assert_eq!(
            redis.register(p).expect("redis registers"),
            *ids.last().unwrap()
        );
    }
    (memory, redis, clock, ids)
}

fn quota(limit: u32, period_ms: u64, burst: u32) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .and_then(|q| q.with_burst(burst))
        .expect("valid quota")
}

/// One check on both stores; asserts they agree and returns the answer.
async fn both(
    memory: &MemoryStore<Key, ManualClock>,
    redis: &RedisStore,
    charges: &[(PolicyId, &Key, u64)],
) -> Decisions {
    let mem: Vec<Charge<'_, Key>> = charges
        .iter()
        .map(|&(p, k, c)| Charge::new(p, k, c))
        .collect();
    let red: Vec<OwnedCharge> = charges.iter().map(|&(p, k, c)| (p, k.clone(), c)).collect();
    let m = memory.check_now(&mem).expect("memory decides");
    let r = redis.check_async(&red).await.expect("redis decides");
    assert_eq!(m, r, "memory and Redis differ on {charges:?}");
    assert_eq!(redis.stats().degraded, 0, "the failure policy answered");
    m
}

/// Memory and Redis give one answer: a check that charges one policy and key twice is judged
/// on the total and refused as a whole by both (not admitted by Redis re-reading each charge
/// alone, nor denied by memory with the `remaining` of a charge it had given back).
#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_charge_is_refused_on_its_total_by_every_store() {
    let server = RedisServer::start();
    let policies = [Policy::new("api", quota(1, 1_000, 2))]; // T = 1 s, burst 2
    let (memory, redis, _clock, ids) = pair(&server, &policies, 10_000).await;
    let k = Key::from("dup");
    // One unit used: one more fits, two do not.
    assert!(both(&memory, &redis, &[(ids[0], &k, 1)]).await.is_allowed());
    let d = both(&memory, &redis, &[(ids[0], &k, 1), (ids[0], &k, 1)]).await;
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    // Nothing was charged: the state as it is (one unit left) on both rows.
    assert_eq!(d.as_slice()[1].remaining(), 1);
    assert!(both(&memory, &redis, &[(ids[0], &k, 1)]).await.is_allowed());
    // A total above the burst can never fit, whatever each charge alone.
    let fresh = Key::from("dup-total");
    let d = both(&memory, &redis, &[(ids[0], &fresh, 1), (ids[0], &fresh, 2)]).await;
    assert!(d.is_cannot_fit(), "{d:?}");
}

/// Memory and Redis give one answer: the sliding-log script decides a duplicate charge
/// itself (a script error there, `attempt to perform arithmetic on field 'count'`, would
/// leave the decision to the failure policy).
#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_sliding_log_charge_is_decided_by_the_script() {
    let server = RedisServer::start();
    let policies = [Policy::new("log", quota(2, 10_000, 2)).with_algorithm(Algorithm::SlidingLog)];
    let (memory, redis, _clock, ids) = pair(&server, &policies, 10_000).await;
    let k = Key::from("log");
    let d = both(&memory, &redis, &[(ids[0], &k, 1), (ids[0], &k, 2)]).await;
    assert!(d.is_cannot_fit(), "{d:?}");
    assert_eq!(d.as_slice()[1].remaining(), 2);
    // With one entry in the log, a duplicate whose total fits the limit but not the room.
    assert!(both(&memory, &redis, &[(ids[0], &k, 1)]).await.is_allowed());
    let d = both(&memory, &redis, &[(ids[0], &k, 1), (ids[0], &k, 1)]).await;
    assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
    assert_eq!(redis.stats().degraded, 0);
}

/// Memory and Redis give one answer: a reservation that books the key's next turn replaces
/// a denial remembered by the negative cache, so the next check's `retry_after` is not one
/// turn too short.
#[tokio::test(flavor = "current_thread")]
async fn a_reservation_ends_a_remembered_denial() {
    let server = RedisServer::start();
    let policies = [Policy::new("api", quota(1, 1_000, 1))]; // T = tau = 1 s
    let (memory, redis, clock, ids) = pair(&server, &policies, 10_000).await;
    let k = Key::from("booked");
    assert!(both(&memory, &redis, &[(ids[0], &k, 1)]).await.is_allowed());
    let d = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    clock.set(10_100 * MS);
    // The Delay mode books the next turn (at 11 s).
    let max_wait = Duration::from_secs(5);
    let m = memory
        .reserve_now(&[Charge::new(ids[0], &k, 1)], max_wait)
        .expect("memory reserves");
    let r = redis
        .reserve_async(&[(ids[0], k.clone(), 1)], max_wait)
        .await
        .expect("redis reserves");
    assert_eq!(m, r);
    assert!(r.is_allowed());
    // The next check waits for the turn after the booked one: 11 s + 1 s - now.
    let d = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1_900)));
}

/// Gives back `cost` of the charge (`policy`, `key`) with each store's own receipt, as a
/// refund (`actual` = `None`) or a correction to `actual`, on both stores.
async fn settle(
    memory: &MemoryStore<Key, ManualClock>,
    redis: &RedisStore,
    (policy, key, cost): (PolicyId, &Key, u64),
    receipts: (Receipt, Receipt),
    actual: Option<u64>,
) {
    let charge = Charge::new(policy, key, cost);
    let owned = (policy, key.clone(), cost);
    match actual {
        None => {
            memory.refund(&[Refund::new(charge, receipts.0)]);
            redis
                .refund_async(&[(owned, receipts.1)])
                .await
                .expect("redis refunds");
        }
        Some(actual) => {
            memory.correct(&[Correction::new(charge, receipts.0, actual)]);
            redis
                .correct_async(&[(owned, receipts.1, actual)])
                .await
                .expect("redis corrects");
        }
    }
}

/// A debt and a refund on the window algorithms (4 per 2 s): a correction charges 7 units
/// past the limit, a refund of another charge in the same window takes 1 off the count with
/// its debt, and both stores answer alike in that window and the next (the sliding window
/// counter weighs the whole debt there: 9 of the previous window, not the limit).
#[tokio::test(flavor = "current_thread")]
async fn a_debt_and_a_refund_weigh_alike_on_the_windows() {
    let server = RedisServer::start();
    for (name, algorithm) in [
        ("fw", Algorithm::FixedWindow),
        ("sw", Algorithm::SlidingWindow),
    ] {
        let policies = [Policy::new(name, quota(4, 2_000, 4)).with_algorithm(algorithm)];
        // 10 s: the start of window 5.
        let (memory, redis, clock, ids) = pair(&server, &policies, 10_000).await;
        let k = Key::from("debt");
        let a = both(&memory, &redis, &[(ids[0], &k, 2)]).await;
        let b = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
        assert!(a.is_allowed() && b.is_allowed(), "{algorithm}");
        clock.set(10_500 * MS);
        // A was 9: 7 units past the estimate, 10 counted, 6 of them beyond the limit.
        settle(
            &memory,
            &redis,
            (ids[0], &k, 2),
            (a.receipt(0), a.receipt(0)),
            Some(9),
        )
        .await;
        let d = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
        assert!(!d.is_allowed(), "{algorithm}: {d:?}");
        // B is refunded: 9 counted, still a debt.
        settle(
            &memory,
            &redis,
            (ids[0], &k, 1),
            (b.receipt(0), b.receipt(0)),
            None,
        )
        .await;
        for at_ms in [10_600, 11_999, 12_000, 12_700, 13_500, 13_999, 14_000] {
            clock.set(at_ms * MS);
            let d = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
            both(&memory, &redis, &[(ids[0], &k, 0)]).await;
            // In window 5 the debt refuses; in window 6 the sliding counter still refuses
            // at 12.7 s: the 9 units of window 5 weigh 9 * 0.65 = 5.85 > 3 (read as the
            // limit, 4 * 0.65 = 2.6, a unit would fit).
            let refused =
                at_ms < 12_000 || (algorithm == Algorithm::SlidingWindow && at_ms <= 12_700);
            assert_eq!(d.is_allowed(), !refused, "{algorithm} at {at_ms} ms: {d:?}");
        }
    }
}

/// A debt on the leaky bucket's shaper (4 per s, queue of 2: T = 250 ms, tau = 500 ms): a
/// charge of 1 corrected to 9 leaves the TAT 2.25 s ahead, beyond the queue. A reservation
/// waits the debt out on both stores: denied, final, until the unit fits (2 s) or, with a
/// shorter `max_wait`, until the queue is within it; it is not read as a full queue of
/// 500 ms.
#[tokio::test(flavor = "current_thread")]
async fn a_debt_on_the_shaper_is_waited_out_alike() {
    let server = RedisServer::start();
    let policies =
        [Policy::new("leaky", quota(4, 1_000, 2)).with_algorithm(Algorithm::LeakyBucket)];
    let (memory, redis, clock, ids) = pair(&server, &policies, 10_000).await;
    let k = Key::from("shaped");
    let d = both(&memory, &redis, &[(ids[0], &k, 1)]).await;
    settle(
        &memory,
        &redis,
        (ids[0], &k, 1),
        (d.receipt(0), d.receipt(0)),
        Some(9),
    )
    .await;
    clock.set(10_100 * MS);
    for (max_wait_ms, retry_ms) in [(0, 2_150), (1_000, 1_900), (5_000, 1_900)] {
        let max_wait = Duration::from_millis(max_wait_ms);
        let m = memory
            .reserve_now(&[Charge::new(ids[0], &k, 1)], max_wait)
            .expect("memory reserves");
        let r = redis
            .reserve_async(&[(ids[0], k.clone(), 1)], max_wait)
            .await
            .expect("redis reserves");
        assert_eq!(m, r, "max_wait {max_wait_ms} ms");
        assert!(!r.is_allowed() && r.is_final(), "{r:?}");
        assert_eq!(r.retry_after(), Some(Duration::from_millis(retry_ms)));
    }
}
