//! The Redis store against real `redis-server` processes: the conformance suite (memory,
//! standalone, Cluster), exact admission under concurrency, TTLs, hash slots, late refunds,
//! changed quotas and app clock skew.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ratekeeper_axum::core::ceil_secs;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::redis::{OwnedCharge, RedisStore, RedisStoreBuilder};
use ratekeeper_axum::core::store::{
    Charge, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_axum::{
    RateLimitLayer, RequestParts, core::Algorithm, core::Key, core::Policy, core::Quota,
    key::KeyError,
};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisCluster, RedisServer};
use ratekeeper_tests::{TestServer, ok_app, spawn};

// The `distributed` example app itself, shared with the other modules (see `main.rs`).
use crate::distributed;

const MS: u64 = 1_000_000;

fn quota(limit: u32, period_ms: u64, burst: u32) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .and_then(|q| q.with_burst(burst))
        .expect("valid quota")
}

/// The conformance policies: every T is a whole µs so ns (memory) and µs (Redis) agree.
fn conformance_policies() -> Vec<Policy> {
    vec![
        Policy::new("api", quota(10, 60_000, 10)), // T = 6 s
        Policy::new("burst", quota(5, 1_000, 2)),  // T = 200 ms, burst 2
        Policy::new("daily", quota(3, 86_400_000, 3)),
        Policy::new("fw", quota(3, 10_000, 3)).with_algorithm(Algorithm::FixedWindow),
        Policy::new("leaky", quota(5, 1_000, 2)).with_algorithm(Algorithm::LeakyBucket),
        Policy::new("sliding", quota(4, 10_000, 4)).with_algorithm(Algorithm::SlidingWindow),
    ]
}

/// One step of a trace at `t` ms: a request with these (policy index, key) charges with
/// `cost`, or (`refund_of`) the refund of an earlier step's charges with the receipts its
/// decisions carried.
struct Step {
    t: u64,
    charges: Vec<(usize, &'static str)>,
    cost: u64,
    refund_of: Option<usize>,
}

fn step(t: u64, charges: &[(usize, &'static str)], cost: u64) -> Step {
    Step {
        t,
        charges: charges.to_vec(),
        cost,
        refund_of: None,
    }
}

/// At `t` ms, give back what step `of` (an index into the same trace) charged.
fn refund(t: u64, of: usize) -> Step {
    Step {
        t,
        charges: Vec::new(),
        cost: 0,
        refund_of: Some(of),
    }
}

/// Refund traces (a late refund gives back nothing): an in-window fixed-window refund, a GCRA
/// refund of the latest charge, a multi-policy refund whose GCRA part the bucket already
/// drained, a fixed-window refund after the rollover and a stale GCRA receipt (both give back
/// nothing). Steps are indexed within this trace.
fn refund_traces() -> Vec<Step> {
    vec![
        // Fixed window 3 per 10 s, window [500 s, 510 s).
        step(500_000, &[(3, "hal")], 1), // 0
        step(500_000, &[(3, "hal")], 1), // 1
        step(500_000, &[(3, "hal")], 1), // 2
        step(500_000, &[(3, "hal")], 1), // 3: denied
        refund(501_000, 1),              // 4: in-window: gives back one
        step(501_000, &[(3, "hal")], 1), // 5: allowed, Remaining 0
        step(501_000, &[(3, "hal")], 1), // 6: denied
        // GCRA 10 per 60 s: the latest charge's refund gives back its whole slot.
        step(510_000, &[(0, "ivy")], 10), // 7: Remaining 0
        step(510_000, &[(0, "ivy")], 1),  // 8: denied
        refund(510_000, 7),               // 9
        step(510_000, &[(0, "ivy")], 10), // 10: allowed again
        // Two policies on one key: burst (GCRA 5/s, burst 2) and daily (3 per day).
        step(520_000, &[(1, "jay"), (2, "jay")], 1), // 11
        step(520_400, &[(1, "jay"), (2, "jay")], 1), // 12
        step(520_800, &[(1, "jay"), (2, "jay")], 1), // 13
        step(521_200, &[(1, "jay"), (2, "jay")], 1), // 14: daily denies
        refund(521_200, 13), // 15: daily gives back; burst was drained already
        step(521_200, &[(1, "jay"), (2, "jay")], 1), // 16: allowed
        step(521_200, &[(1, "jay"), (2, "jay")], 1), // 17: daily denies again
        // Fixed window, refund after the rollover: gives back nothing.
        step(559_000, &[(3, "kim")], 1), // 18: window [550 s, 560 s)
        step(560_500, &[(3, "kim")], 1), // 19
        step(560_500, &[(3, "kim")], 1), // 20
        step(560_500, &[(3, "kim")], 1), // 21: Remaining 0
        refund(561_000, 18),             // 22: its window closed: nothing
        step(562_000, &[(3, "kim")], 1), // 23: denied until 570 s
        // A stale GCRA receipt: drained long ago, the bucket refilled and filled again.
        step(600_000, &[(0, "lee")], 1),  // 24
        step(700_000, &[(0, "lee")], 10), // 25: Remaining 0
        refund(700_000, 24),              // 26: drained: nothing
        step(700_000, &[(0, "lee")], 1),  // 27: denied, 6 s
    ]
}

fn assert_refund_values(d: &[Decisions]) {
    let allowed: Vec<bool> = d.iter().map(Decisions::is_allowed).collect();
    assert_eq!(
        allowed,
        [
            true, true, true, false, true, false, true, false, true, true, true, true, false, true,
            false, true, true, true, true, false, true, true, false
        ]
    );
    assert_eq!(d[4].as_slice()[0].remaining(), 0);
    assert_eq!(d[19].retry_after(), Some(Duration::from_secs(8)));
    assert_eq!(d[22].retry_after(), Some(Duration::from_secs(6)));
}

/// Fixed traces: bursts, exact retry boundaries, refill, costs 0 / n / > burst, several
/// policies on one key (one script) and on different keys (reserve then refund).
fn traces() -> Vec<Step> {
    let mut v = Vec::new();
    for _ in 0..11 {
        v.push(step(0, &[(0, "alice")], 1));
    }
    v.push(step(5_999, &[(0, "alice")], 1));
    v.push(step(6_000, &[(0, "alice")], 1));
    v.push(step(6_000, &[(0, "alice")], 0));
    v.push(step(6_000, &[(0, "bob")], 11)); // can never fit
    v.push(step(6_000, &[(0, "bob")], 4));
    v.push(step(6_000, &[(0, "bob")], 7));
    v.push(step(30_000, &[(0, "bob")], 7));
    // Several policies on one key: all-or-nothing.
    for t in [40_000, 40_000, 40_000, 40_100, 40_200, 40_400] {
        v.push(step(t, &[(1, "carol"), (2, "carol")], 1));
    }
    v.push(step(41_000, &[(1, "carol"), (2, "carol")], 1));
    v.push(step(41_000, &[(1, "carol")], 1));
    // Different keys in one request: reserve then refund.
    v.push(step(50_000, &[(1, "dave"), (2, "global")], 1));
    v.push(step(50_000, &[(1, "dave"), (2, "global")], 1));
    v.push(step(50_000, &[(2, "global"), (1, "dave")], 1));
    v.push(step(50_000, &[(1, "dave"), (2, "global")], 1));
    v.push(step(50_000, &[(1, "dave")], 1));
    v.push(step(50_400, &[(1, "dave")], 2));
    v.push(step(
        200_000,
        &[(0, "alice"), (1, "alice"), (2, "alice")],
        2,
    ));
    // Fixed window (aligned to multiples of 10 s): the boundary double burst is expected.
    for t in [
        300_000, 305_000, 309_999, 309_999, 310_000, 310_000, 310_001,
    ] {
        v.push(step(t, &[(3, "erin")], 1));
    }
    v.push(step(310_500, &[(3, "erin")], 4)); // more than the limit: can never fit
    v.push(step(310_500, &[(3, "erin")], 2));
    v.push(step(310_500, &[(3, "erin")], 0));
    // Mixed algorithms on one key: one script, all-or-nothing.
    for t in [320_000, 320_000, 320_000, 320_100, 320_400] {
        v.push(step(t, &[(4, "frank"), (3, "frank"), (0, "frank")], 1));
    }
    v.push(step(330_000, &[(3, "frank"), (4, "frank")], 1));
    // Sliding window counter: estimate = previous * (1 - elapsed / W) + current.
    for t in [
        400_000, 401_000, 402_000, 409_000, 409_999, 410_000, 412_500, 412_500,
    ] {
        v.push(step(t, &[(5, "gina")], 1));
    }
    for t in [
        415_000, 415_000, 417_600, 419_000, 421_000, 425_000, 440_000,
    ] {
        v.push(step(t, &[(5, "gina")], 1));
    }
    v.push(step(440_000, &[(5, "gina")], 3));
    v.push(step(440_000, &[(5, "gina")], 5)); // more than the limit: can never fit
    v.push(step(445_000, &[(5, "gina"), (3, "gina")], 2));
    v.push(step(445_000, &[(5, "gina"), (3, "gina")], 1));
    v
}

fn run_memory(trace: &[Step]) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut store = MemoryStore::<Key, _>::with_clock(clock.clone());
    let ids: Vec<PolicyId> = conformance_policies()
        .iter()
        .map(|p| store.register(p).expect("register"))
        .collect();
    let mut seen: Vec<Option<Decisions>> = Vec::new();
    for s in trace {
        clock.set(s.t * MS);
        let charged = s.refund_of.map_or(s, |j| &trace[j]);
        let keys: Vec<Key> = charged.charges.iter().map(|(_, k)| Key::from(*k)).collect();
        let charges: Vec<Charge<'_, Key>> = charged
            .charges
            .iter()
            .zip(&keys)
            .map(|((p, _), k)| Charge::new(ids[*p], k, charged.cost))
            .collect();
        if let Some(j) = s.refund_of {
            let taken = seen[j].as_ref().expect("refund of a check");
            let refunds: Vec<Refund<'_, Key>> = charges
                .iter()
                .zip(taken.receipts())
                .map(|(c, r)| Refund::new(*c, r))
                .collect();
            store.refund(&refunds);
            seen.push(None);
        } else {
            seen.push(Some(store.check_now(&charges).expect("memory decides")));
        }
    }
    seen.into_iter().flatten().collect()
}

/// TTL floor of the conformance runs: longer than the whole test, so Redis's real-time
/// expiry never acts on the injected timeline (see `RedisStoreBuilder::min_ttl` and
/// `injected_time_decisions_do_not_depend_on_real_time_between_calls`).
const CONFORMANCE_MIN_TTL: Duration = Duration::from_secs(3_600);

async fn run_redis(
    trace: &[Step],
    build: impl AsyncFnOnce(RedisStoreBuilder) -> RedisStore,
) -> Vec<Decisions> {
    let clock = ManualClock::new();
    let mut store = build(
        RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .min_ttl(CONFORMANCE_MIN_TTL),
    )
    .await;
    let ids: Vec<PolicyId> = conformance_policies()
        .iter()
        .map(|p| store.register(p).expect("register"))
        .collect();
    let mut seen: Vec<Option<Decisions>> = Vec::new();
    for s in trace {
        clock.set(s.t * MS);
        let charged = s.refund_of.map_or(s, |j| &trace[j]);
        let charges: Vec<OwnedCharge> = charged
            .charges
            .iter()
            .map(|(p, k)| (ids[*p], Key::from(*k), charged.cost))
            .collect();
        if let Some(j) = s.refund_of {
            let taken = seen[j].as_ref().expect("refund of a check");
            let refunds: Vec<(OwnedCharge, Receipt)> =
                charges.into_iter().zip(taken.receipts()).collect();
            store.refund_async(&refunds).await.expect("redis refunds");
            seen.push(None);
        } else {
            seen.push(Some(
                store.check_async(&charges).await.expect("redis decides"),
            ));
        }
    }
    assert_eq!(store.stats().degraded, 0);
    seen.into_iter().flatten().collect()
}

fn assert_reference_values(d: &[Decisions]) {
    // Spot checks against the GCRA formulas (10 per 60 s, burst 10: T = 6 s).
    assert_eq!(d[0].as_slice()[0].remaining(), 9);
    assert_eq!(d[9].as_slice()[0].remaining(), 0);
    assert_eq!(d[10].retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(d[11].retry_after(), Some(Duration::from_millis(1)));
    assert!(d[12].is_allowed());
    assert!(d[14].is_cannot_fit());
    assert_eq!(d[14].retry_after(), None);
    assert!(d[15].is_allowed());
    assert_eq!(d[16].retry_after(), Some(Duration::from_secs(6)));
    let admitted = d.iter().filter(|x| x.is_allowed()).count();
    assert_eq!(admitted, 44, "decisions: {:?}", &d[49..]);
    // Fixed window: 3 in [300 s, 310 s), 3 more right after the boundary.
    let fw: Vec<bool> = d[33..40].iter().map(Decisions::is_allowed).collect();
    assert_eq!(fw, [true, true, true, false, true, true, true]);
    assert_eq!(d[36].retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(d[39].as_slice()[0].remaining(), 0);
    assert_eq!(
        d[39].as_slice()[0].reset_after(),
        Duration::from_millis(9_999)
    );
    assert!(d[40].is_cannot_fit());
    // Sliding window counter (4 per 10 s): the 5th at 409.999 s waits for the estimate
    // 4 * (1 - e / 10 s) + 1 <= 4 in the next window: e = 2.5 s, so 2.501 s.
    assert_eq!(d[53].retry_after(), Some(Duration::from_millis(2_501)));
    assert!(d[55].is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory_standalone_and_cluster_decide_identically() {
    let server = RedisServer::start();
    let url = server.url();
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    for (name, trace, check) in [
        (
            "traces",
            traces(),
            assert_reference_values as fn(&[Decisions]),
        ),
        ("refund-traces", refund_traces(), assert_refund_values),
    ] {
        let memory = run_memory(&trace);
        check(&memory);
        let standalone = run_redis(&trace, async |b: RedisStoreBuilder| {
            b.prefix(name).standalone(&url).await.expect("standalone")
        })
        .await;
        check(&standalone);
        assert_eq!(
            standalone, memory,
            "{name}: standalone Redis differs from memory"
        );
        let clustered = run_redis(&trace, async |b: RedisStoreBuilder| {
            b.prefix(name).cluster(&nodes).await.expect("cluster")
        })
        .await;
        assert_eq!(
            clustered, memory,
            "{name}: Redis Cluster differs from memory"
        );
    }
}

/// The tiered store (one instance over standalone Redis, injected time) on a conformance
/// trace. Policies the tiered store refuses at registration (the leaky bucket, the sliding
/// window counter) are checked to be refused, and the steps that charge them are `None`
/// (a limiter with such a policy on this store is never built). Refunds are awaited
/// (`TieredStore::refund_async`), as the Redis run awaits its own, so the next step sees
/// them.
async fn run_tiered(
    trace: &[Step],
    url: &str,
    prefix: &str,
    max_lease: u32,
) -> Vec<Option<Decisions>> {
    use ratekeeper_axum::core::store::tiered::TieredStore;
    use ratekeeper_axum::core::store::{Checked, StoreError};

    let clock = ManualClock::new();
    let redis = RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .min_ttl(CONFORMANCE_MIN_TTL)
        .prefix(prefix)
        .standalone(url)
        .await
        .expect("standalone");
    // Leases outlive the trace (700 s of injected time): unspent units never go back to
    // Redis in a background sweep that would race the next step, and a refund of leased
    // units always finds its lease.
    let mut store = TieredStore::builder()
        .max_lease(NonZeroU32::new(max_lease).expect("max_lease >= 1"))
        .lease_ttl(Duration::from_secs(3_600))
        .build(redis)
        .expect("tiered store");
    let ids: Vec<Option<PolicyId>> = conformance_policies()
        .iter()
        .map(|p| match store.register(p) {
            Ok(id) => Some(id),
            Err(StoreError::UnsupportedAlgorithm(a)) => {
                assert!(
                    matches!(a, Algorithm::LeakyBucket | Algorithm::SlidingWindow),
                    "{a:?} refused"
                );
                None
            }
            Err(e) => panic!("register {}: {e}", p.name()),
        })
        .collect();
    let mut seen: Vec<Option<Decisions>> = Vec::new();
    let mut answers: Vec<Option<Decisions>> = Vec::new();
    for s in trace {
        clock.set(s.t * MS);
        let charged = s.refund_of.map_or(s, |j| &trace[j]);
        let Some(policies) = charged
            .charges
            .iter()
            .map(|(p, _)| ids[*p])
            .collect::<Option<Vec<PolicyId>>>()
        else {
            seen.push(None);
            if s.refund_of.is_none() {
                answers.push(None);
            }
            continue;
        };
        let keys: Vec<Key> = charged.charges.iter().map(|(_, k)| Key::from(*k)).collect();
        let charges: Vec<Charge<'_, Key>> = policies
            .iter()
            .zip(&keys)
            .map(|(p, k)| Charge::new(*p, k, charged.cost))
            .collect();
        if let Some(j) = s.refund_of {
            let taken = seen[j].as_ref().expect("refund of a check");
            let refunds: Vec<Refund<'_, Key>> = charges
                .iter()
                .zip(taken.receipts())
                .map(|(c, r)| Refund::new(*c, r))
                .collect();
            store.refund_async(&refunds).await.expect("tiered refunds");
            seen.push(None);
        } else {
            let d = match store.check(&charges) {
                Checked::Ready(result) => result,
                Checked::Pending(future) => future.await,
            }
            .expect("tiered decides");
            seen.push(Some(d.clone()));
            answers.push(Some(d));
        }
    }
    assert_eq!(store.redis().stats().degraded, 0);
    answers
}

/// The conformance traces on the tiered store, one instance, both ends of its lease size.
///
/// - `max_lease` 1: no key is ever hot (a lease of 1 unit is never larger than a request's
///   cost), so every check goes to the Redis store and every decision (allowed, Remaining,
///   Retry-After, reset, receipts) equals the memory store's.
/// - `max_lease` 100 (the default): bursts at one instant are spent from leases. The bound
///   `redis(W) - I * N_max <= admitted(W) <= redis(W) + I * N_max` with one instance that
///   spends every unit it leases admits exactly what Redis charged, so *which* requests are
///   allowed is the memory store's at every step of the traces without refunds (checked),
///   and so is whether a cost can never fit. With refunds: units spent from a lease go back
///   into that lease only while it lives (a lease ends when its units run out, and the next
///   grant starts a new one), so a refund that comes later frees nothing where the memory
///   store frees the units. The tiered store then denies where the memory store allows,
///   never the reverse, and at most once per refunded unit (checked): the under-admission
///   side of the bound. What a decision reports may differ where units sit in the lease: a
///   decision the lease script makes sees Redis's state, which already holds the units
///   this instance leased and has not spent (`held <= N_max`). So Remaining can be lower
///   than the memory store's by at most `held`, and the reset and a denial's Retry-After
///   later by at most the time those units take to refill (`held * T`). Those values are
///   checked against that bound (`N_max` units, `N_max * T`) instead of for equality.
/// - The leaky bucket and the sliding window counter are refused at registration (a
///   configuration error when the limiter is built), so their steps have no decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_tiered_store_decides_like_memory_within_its_lease_bound() {
    let server = RedisServer::start();
    let url = server.url();
    let refused =
        |trace: &[Step], i: usize| trace[i].charges.iter().any(|(p, _)| matches!(*p, 4 | 5));
    for (name, trace) in [("traces", traces()), ("refund-traces", refund_traces())] {
        let memory = run_memory(&trace);
        // Which trace step each decision answers (refund steps have none).
        let step_of: Vec<usize> = (0..trace.len())
            .filter(|i| trace[*i].refund_of.is_none())
            .collect();
        for max_lease in [1, 100] {
            let tiered = run_tiered(&trace, &url, &format!("{name}-{max_lease}"), max_lease).await;
            assert_eq!(tiered.len(), memory.len());
            // Units refunded so far, and requests the memory store allowed and the tiered
            // store denied: never more than the units refunded.
            let (mut refunded, mut lost) = (0_u64, 0_u64);
            for (n, (t, m)) in tiered.iter().zip(&memory).enumerate() {
                let i = step_of[n];
                refunded = trace[..i]
                    .iter()
                    .filter_map(|s| s.refund_of.map(|j| &trace[j]))
                    .map(|c| c.cost * c.charges.len() as u64)
                    .sum();
                let Some(t) = t else {
                    assert!(refused(&trace, i), "{name} step {i}: no decision");
                    continue;
                };
                assert!(!refused(&trace, i), "{name} step {i}: decided");
                let at = format!("{name}, max_lease {max_lease}, step {i}: {t:?} vs {m:?}");
                if max_lease == 1 {
                    assert_eq!(t, m, "{at}");
                    continue;
                }
                assert_eq!(t.is_cannot_fit(), m.is_cannot_fit(), "{at}");
                if t.is_allowed() != m.is_allowed() {
                    // Only after a refund of units spent from a lease that has ended, and
                    // only ever a denial where the memory store allows (counted below).
                    assert!(!t.is_allowed() && refunded > 0, "{at}");
                    lost += 1;
                    continue;
                }
                // Every policy here has T <= 6 s, and N_max = 100: at most 600 s later.
                let late = |tiered: Duration, memory: Duration| {
                    tiered >= memory && tiered - memory <= Duration::from_secs(6) * 100
                };
                match (t.retry_after(), m.retry_after()) {
                    (Some(tr), Some(mr)) => assert!(late(tr, mr), "{at}"),
                    (tr, mr) => assert_eq!(tr, mr, "{at}"),
                }
                for (td, md) in t.as_slice().iter().zip(m.as_slice()) {
                    assert_eq!(td.limit(), md.limit(), "{at}");
                    let (tr, mr) = (td.remaining(), md.remaining());
                    assert!(tr <= mr && mr - tr <= 100, "{at}");
                    assert!(late(td.reset_after(), md.reset_after()), "{at}");
                }
            }
            assert!(
                lost <= refunded,
                "{name}: {lost} denied where memory allows"
            );
        }
    }
}

/// The root cause of the conformance flake: with injected time the fixed window's third
/// request at 309.999 s writes its count with PX = 1 ms (the time left in the window on the
/// injected clock), but Redis counts that TTL down in real time. On a loaded machine more
/// than 1 ms passed before the fourth request at the same injected instant, the key was
/// gone and Redis disagreed with the memory store. The real-time pause here stands in for
/// the load; with a TTL floor the decision is the timeline's whatever real time passes, and
/// without one the key is gone (which is what made the suite flaky).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_time_decisions_do_not_depend_on_real_time_between_calls() {
    let server = RedisServer::start();
    let fw = Policy::new("fw", quota(3, 10_000, 3)).with_algorithm(Algorithm::FixedWindow);
    let erin = Key::from("erin");
    for floor in [Some(CONFORMANCE_MIN_TTL), None] {
        let clock = ManualClock::new();
        // Without the negative cache: the third charge (remaining 0) would be remembered as
        // the denial it implies, and this test is about what Redis itself reads.
        let mut builder = RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .negative_cache(false)
            .prefix(if floor.is_some() { "floor" } else { "exact" });
        if let Some(ttl) = floor {
            builder = builder.min_ttl(ttl);
        }
        let mut store = builder.standalone(&server.url()).await.expect("store");
        let id = store.register(&fw).expect("register");
        let charge = [(id, erin.clone(), 1)];
        clock.set(309_999 * MS);
        for _ in 0..3 {
            assert!(
                store
                    .check_async(&charge)
                    .await
                    .expect("decides")
                    .is_allowed()
            );
        }
        let name = store.redis_key(id, &erin).expect("name");
        let ttl = pttl(&server, &name);
        // Real time passes, the injected clock does not (a descheduled test thread).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fourth = store.check_async(&charge).await.expect("decides");
        if floor.is_some() {
            assert!(ttl > 3_000_000, "PTTL {ttl}");
            assert_eq!(fourth.retry_after(), Some(Duration::from_millis(1)));
        } else {
            assert!(ttl <= 1, "PTTL {ttl} (-2: already expired)");
            assert!(
                fourth.is_allowed(),
                "the 1 ms key outlived 20 ms of real time"
            );
        }
    }
}

/// An app whose key is the `x-key` header, on the given store.
fn keyed_app(store: RedisStore, policy: Policy) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .key(|req: &RequestParts<'_>| {
            req.headers()
                .get("x-key")
                .and_then(|v| v.to_str().ok())
                .map(Key::from)
                .ok_or(KeyError::Missing("x-key header"))
        })
        .store(store)
        .build()
        .expect("layer");
    ok_app().layer(layer)
}

/// Fires `per_key` requests for each key at the given apps (round robin) from a barrier and
/// returns (key, status, remaining header) for each.
async fn hammer(
    addrs: &[std::net::SocketAddr],
    keys: &[String],
    per_key: usize,
) -> Vec<(String, u16, Option<u32>)> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let total = keys.len() * per_key;
    let barrier = Arc::new(tokio::sync::Barrier::new(total));
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let key = keys[i % keys.len()].clone();
        let addr = addrs[i % addrs.len()];
        let client = client.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let res = client
                .get(format!("http://{addr}/"))
                .header("x-key", &key)
                .send()
                .await
                .expect("request");
            let remaining = res
                .headers()
                .get("x-ratelimit-remaining")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            (key, res.status().as_u16(), remaining)
        }));
    }
    let mut out = Vec::with_capacity(total);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// Exact admission under concurrency: exactly `quota` 200s per key with Remaining exactly
/// {quota-1, ..., 0}, every 429 with Remaining 0.
fn assert_exact_admission_per_key(
    results: &[(String, u16, Option<u32>)],
    keys: &[String],
    quota: u32,
) {
    for key in keys {
        let mut remaining: Vec<u32> = results
            .iter()
            .filter(|(k, s, _)| k == key && *s == 200)
            .map(|(_, _, r)| r.expect("remaining on 200"))
            .collect();
        remaining.sort_unstable();
        let expected: Vec<u32> = (0..quota).collect();
        assert_eq!(remaining, expected, "key {key}");
    }
    for (_, status, remaining) in results.iter().filter(|(_, s, _)| *s != 200) {
        assert_eq!(*status, 429);
        assert_eq!(*remaining, Some(0));
    }
}

/// Concurrent requests never double-admit
/// (<https://github.com/TerminalWitchcraft/actix-ratelimit/issues/16>: two requests both saw one
/// remaining and both passed), on Redis: fixed window 4 per 86 400 000 ms, clock frozen at t=0, 2
/// app instances sharing one Redis, 1000 requests over k1..k10 released together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_double_admit_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let policy = Policy::new("day", Quota::per_day(NonZeroU32::new(4).expect("4")))
        .with_algorithm(Algorithm::FixedWindow);
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("store");
        addrs.push(spawn(keyed_app(store, policy.clone())).await);
    }
    let keys: Vec<String> = (1..=10).map(|i| format!("k{i}")).collect();
    let results = hammer(&addrs, &keys, 100).await;
    assert_eq!(results.iter().filter(|r| r.1 == 200).count(), 40);
    assert_eq!(results.iter().filter(|r| r.1 == 429).count(), 960);
    assert_exact_admission_per_key(&results, &keys, 4);
    assert_every_key_has_ttl(&server);
}

/// Concurrent requests never double-admit
/// (<https://github.com/TerminalWitchcraft/actix-ratelimit/issues/16>), on the memory store
/// (multi-thread runtime with 4 workers), same scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_double_admit_on_memory() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "day",
            Quota::per_day(NonZeroU32::new(4).expect("4")),
        ))
        .key(|req: &RequestParts<'_>| {
            req.headers()
                .get("x-key")
                .and_then(|v| v.to_str().ok())
                .map(Key::from)
                .ok_or(KeyError::Missing("x-key header"))
        })
        .store(MemoryStore::<Key, _>::with_clock(clock))
        .build()
        .expect("layer");
    let addr = spawn(ok_app().layer(layer)).await;
    let keys: Vec<String> = (1..=10).map(|i| format!("k{i}")).collect();
    let results = hammer(&[addr], &keys, 100).await;
    assert_eq!(results.iter().filter(|r| r.1 == 200).count(), 40);
    assert_exact_admission_per_key(&results, &keys, 4);
}

/// Three app instances, each with its own Redis connection, on one key: exactly the quota
/// is admitted in total (Redis `TIME`, 50 per hour: refilling one unit takes 72 s).
async fn three_instances_admit_exactly(builders: Vec<RedisStore>) {
    let policy = Policy::new("api", Quota::per_hour(NonZeroU32::new(50).expect("50")));
    let mut addrs = Vec::new();
    for store in builders {
        addrs.push(spawn(keyed_app(store, policy.clone())).await);
    }
    let keys = vec!["shared".to_owned()];
    let results = hammer(&addrs, &keys, 300).await;
    let admitted = results.iter().filter(|r| r.1 == 200).count();
    assert_eq!(admitted, 50, "over- or under-admission across instances");
    assert_eq!(results.iter().filter(|r| r.1 == 429).count(), 250);
    assert_exact_admission_per_key(&results, &keys, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_budget_standalone() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(
            RedisStore::builder()
                .deadline(DECISION_DEADLINE)
                .standalone(&server.url())
                .await
                .expect("store"),
        );
    }
    three_instances_admit_exactly(stores).await;
    assert_every_key_has_ttl(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_budget_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(
            RedisStore::builder()
                .deadline(DECISION_DEADLINE)
                .cluster(&nodes)
                .await
                .expect("store"),
        );
    }
    three_instances_admit_exactly(stores).await;
    for node in &cluster.nodes {
        if node.cli(&["ROLE"]).is_some_and(|r| r.starts_with("master")) {
            assert_every_key_has_ttl(node);
        }
    }
}

/// Every `rl:*` key on `server` has a TTL (PTTL > 0; -1 would be a key that never expires).
fn assert_every_key_has_ttl(server: &RedisServer) {
    for (k, ttl) in server.key_ttls("rl:*") {
        assert!(ttl >= 0, "key {k} has PTTL {ttl}");
    }
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cli(&["PTTL", key])
        .and_then(|s| s.trim().parse().ok())
        .expect("PTTL")
}

/// One step of a TTL trace: a request at `t` ms expecting `remaining`, then the key's PTTL
/// in `ttl` (ms); or a pause in real time after which the key must be gone.
enum TtlStep {
    Request {
        t: u64,
        remaining: u32,
        ttl: std::ops::RangeInclusive<i64>,
    },
    GoneAfterRealMs(u64),
}

/// Every key gets a TTL (<https://github.com/alisaifee/limits/pull/15>: INCR and EXPIRE sent
/// separately left keys without one), for every algorithm (5 per 60 000 ms, burst 5): every key
/// written has a PTTL equal to the time until its state is "absent" again (token bucket: until
/// full; fixed window: until the window ends; sliding window counter: until both counts are zero),
/// later writes never push it beyond that, the old window's key is gone once real time reaches its
/// end, and no key ever has PTTL -1. The reported fault ("drop the connection right after the
/// increment") cannot happen: the increment and the PX are one `SET` inside one script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_key_has_its_ttl_for_every_algorithm() {
    use TtlStep::{GoneAfterRealMs, Request as At};
    let table: Vec<(Algorithm, Vec<TtlStep>)> = vec![
        (
            Algorithm::Gcra,
            vec![
                // T = 12 s: one request is "absent" again 12 s later.
                At {
                    t: 0,
                    remaining: 4,
                    ttl: 1..=12_000,
                },
                At {
                    t: 1,
                    remaining: 3,
                    ttl: 12_001..=24_000,
                },
                // Refilled: the TTL is one emission interval, not a fresh 60 s.
                At {
                    t: 59_000,
                    remaining: 4,
                    ttl: 1..=12_000,
                },
            ],
        ),
        (
            Algorithm::FixedWindow,
            vec![
                At {
                    t: 0,
                    remaining: 4,
                    ttl: 1..=60_000,
                },
                At {
                    t: 1,
                    remaining: 3,
                    ttl: 1..=60_000,
                },
                // The window is not pushed out to a fresh 60 s.
                At {
                    t: 59_000,
                    remaining: 2,
                    ttl: 1..=1_000,
                },
                // Real time catches up with the window end (1 s after R3): the key is gone.
                GoneAfterRealMs(1_050),
                At {
                    t: 60_001,
                    remaining: 4,
                    ttl: 1..=60_000,
                },
            ],
        ),
        (
            Algorithm::SlidingWindow,
            vec![
                At {
                    t: 0,
                    remaining: 4,
                    ttl: 1..=120_000,
                },
                At {
                    t: 59_000,
                    remaining: 3,
                    ttl: 1..=61_000,
                },
                // Estimate 2 * (1 - 1/60 000) + 1: one more fits.
                At {
                    t: 60_001,
                    remaining: 2,
                    ttl: 1..=119_999,
                },
            ],
        ),
    ];
    let server = RedisServer::start();
    for (algorithm, steps) in table {
        let clock = ManualClock::new();
        let mut store = RedisStore::builder()
            .clock(clock.clone())
            .deadline(DECISION_DEADLINE)
            .standalone(&server.url())
            .await
            .expect("store");
        let name = format!("{algorithm:?}").to_lowercase();
        let id = store
            .register(&Policy::new(name.as_str(), quota(5, 60_000, 5)).with_algorithm(algorithm))
            .expect("register");
        let key = Key::from("user:1");
        let redis_key = store.redis_key(id, &key).expect("key name");
        assert_eq!(redis_key, format!("rl:v2:{{s:user:1}}:{name}"));
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                At { t, remaining, ttl } => {
                    clock.set(t * MS);
                    let asked = std::time::Instant::now();
                    let d = store
                        .check_async(&[(id, key.clone(), 1)])
                        .await
                        .expect("decides");
                    assert!(d.is_allowed(), "{algorithm:?} step {i}");
                    assert_eq!(
                        d.as_slice()[0].remaining(),
                        remaining,
                        "{algorithm:?} step {i}"
                    );
                    let got = pttl(&server, &redis_key);
                    // Redis counts the TTL down in real time from the write: on a loaded
                    // machine the read comes `spent` ms later, and a short TTL may be over.
                    let spent = i64::try_from(asked.elapsed().as_millis()).unwrap_or(i64::MAX);
                    let (lo, hi) = (*ttl.start(), *ttl.end());
                    let fits = if got == -2 {
                        spent >= lo
                    } else {
                        got <= hi && got + spent >= lo
                    };
                    assert!(
                        fits,
                        "{algorithm:?} step {i}: PTTL {got} read {spent} ms after the \
                         decision, want {ttl:?} at the write"
                    );
                }
                GoneAfterRealMs(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    assert_eq!(
                        pttl(&server, &redis_key),
                        -2,
                        "{algorithm:?}: the old window's key is still there"
                    );
                }
            }
            assert_every_key_has_ttl(&server);
        }
    }
}

/// Idle keys disappear: a token-bucket key whose state is "absent" after 1 ms of real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_token_bucket_keys_disappear() {
    let server = RedisServer::start();
    let mut store = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    let tiny = store
        .register(&Policy::new("tiny", quota(1_000, 1_000, 1)))
        .expect("register");
    let key = Key::from("user:1");
    let d = store
        .check_async(&[(tiny, key.clone(), 1)])
        .await
        .expect("decides");
    assert!(d.is_allowed());
    let name = store.redis_key(tiny, &key).expect("name");
    for _ in 0..100 {
        if pttl(&server, &name) == -2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pttl(&server, &name), -2, "idle key still present");
}

/// No CROSSSLOT on Cluster (<https://github.com/spring-cloud/spring-cloud-gateway/issues/248>):
/// every policy of one client key shares one hash tag (one slot), the script gets every key in
/// KEYS, zero CROSSSLOT errors, exact decisions; a script error is handled by the failure policy
/// and never becomes "allowed" with a made-up Remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_multi_key_scripts_never_cross_slots() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let clock = ManualClock::new();
    let mut store = RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .cluster(&nodes)
        .await
        .expect("cluster store");
    let a = store
        .register(&Policy::new("a", quota(2, 60_000, 2)))
        .expect("a");
    let b = store
        .register(&Policy::new("b", quota(2, 60_000, 2)))
        .expect("b");
    let u42 = Key::from("user:42");
    let (ka, kb) = (
        store.redis_key(a, &u42).expect("a"),
        store.redis_key(b, &u42).expect("b"),
    );
    let slot = |k: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k]);
    assert_eq!(slot(&ka), slot(&kb));

    let both = |key: &Key| vec![(a, key.clone(), 1), (b, key.clone(), 1)];
    let mut seen = Vec::new();
    for t in [0, 1, 2] {
        clock.set(t * MS);
        seen.push(store.check_async(&both(&u42)).await.expect("no CROSSSLOT"));
    }
    assert!(seen[0].is_allowed());
    assert_eq!(seen[0].as_slice()[0].remaining(), 1);
    assert!(seen[1].is_allowed());
    assert_eq!(seen[1].as_slice()[0].remaining(), 0);
    assert!(!seen[2].is_allowed());
    clock.set(3 * MS);
    let u43 = store
        .check_async(&both(&Key::from("user:43")))
        .await
        .expect("u43");
    assert!(u43.is_allowed());
    assert_eq!(u43.as_slice()[0].remaining(), 1);
    assert_eq!(store.stats().degraded, 0);

    // Fault injection: the key holds a value the script cannot use (a hash), so the node
    // answers a script error. The failure policy (fail open) handles it: an error, never an
    // "allowed" decision with a made-up Remaining.
    let victim = Key::from("user:44");
    let name = store.redis_key(a, &victim).expect("name");
    let node = &cluster.nodes[cluster.primary_for(&name)];
    node.cli(&["HSET", &name, "f", "v"]).expect("HSET");
    let err = store
        .check_async(&[(a, victim, 1)])
        .await
        .expect_err("a script error is not a decision");
    assert!(err.is_unavailable());
    assert_eq!(store.stats().degraded, 1);
}

/// The `distributed` example: two instances on two ports share one budget per client IP.
/// A 2 s decision deadline (the example's is 50 ms) so that a loaded CI machine cannot turn a
/// slow round trip into a fail-open answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_example_two_instances_share_one_budget() {
    let server = RedisServer::start();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let app = distributed::app_with(&server.url(), None, DECISION_DEADLINE)
            .await
            .expect("app");
        instances.push(TestServer::start(app).await);
    }
    let mut seen = Vec::new();
    for i in 0..12 {
        let res = instances[i % 2].get("/").send().await.expect("request");
        let remaining = res
            .headers()
            .get("x-ratelimit-remaining")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        seen.push((res.status().as_u16(), remaining));
    }
    let expected: Vec<(u16, Option<String>)> = (0..10)
        .rev()
        .map(|r| (200, Some(r.to_string())))
        .chain([(429, Some("0".to_owned())), (429, Some("0".to_owned()))])
        .collect();
    assert_eq!(seen, expected);
}

/// The negative cache: after a denial, the same request is denied locally (exact
/// `retry_after`, no round trip) until `retry_after` has passed; then Redis decides again.
/// The allowed charge that takes the last unit already implies the denial that follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_cache_denies_repeat_requests_without_redis_until_retry_after() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let mut store = RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .standalone(&server.url())
        .await
        .expect("store");
    // 2 per 10 s, burst 2: T = 5 s.
    let api = store
        .register(&Policy::new("api", quota(2, 10_000, 2)))
        .expect("register");
    let key = Key::from("abuser");
    let check = async |store: &RedisStore| {
        store
            .check_async(&[(api, key.clone(), 1)])
            .await
            .expect("decides")
    };
    assert!(check(&store).await.is_allowed());
    assert!(check(&store).await.is_allowed());
    let denied = check(&store).await;
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(5)));
    // The second answer (remaining 0, TAT 10 s ahead) implied the third.
    assert_eq!(
        (
            store.stats().redis_decisions,
            store.stats().negative_cache_hits
        ),
        (2, 1)
    );

    for i in 1..=100u64 {
        clock.set(i * 40 * MS); // up to 4 s later
        let d = check(&store).await;
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_millis(5_000 - i * 40)),
            "exact retry_after from the cache"
        );
        assert_eq!(d.as_slice()[0].remaining(), 0);
        assert_eq!(
            d.as_slice()[0].reset_after(),
            Duration::from_millis(10_000 - i * 40)
        );
    }
    let stats = store.stats();
    assert_eq!((stats.redis_decisions, stats.negative_cache_hits), (2, 101));

    clock.set(5_000 * MS);
    let d = check(&store).await;
    assert!(d.is_allowed());
    assert_eq!(d.as_slice()[0].remaining(), 0);
    assert_eq!(store.stats().redis_decisions, 3);
}

/// Every decision's round trip lands in the latency histogram. A current-thread
/// runtime inside `with_local_recorder`, so the store's futures see the test's recorder.
#[test]
fn every_redis_decision_is_timed() {
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let mut store = RedisStore::builder()
                .deadline(DECISION_DEADLINE)
                .standalone(&server.url())
                .await
                .expect("store");
            let id = store
                .register(&Policy::new(
                    "p",
                    Quota::per_minute(NonZeroU32::new(10).unwrap()),
                ))
                .expect("register");
            let key = Key::from("timed");
            for _ in 0..3 {
                let d = store
                    .check_async(&[(id, key.clone(), 1)])
                    .await
                    .expect("decides");
                assert!(d.is_allowed());
            }
        });
    });
    let samples: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let ok = key
                .labels()
                .any(|l| l.key() == "outcome" && l.value() == "ok");
            match value {
                DebugValue::Histogram(v)
                    if key.name() == "ratekeeper_store_latency_seconds" && ok =>
                {
                    Some(v.into_iter().map(|s| s.into_inner()))
                }
                _ => None,
            }
        })
        .flatten()
        .collect();
    assert_eq!(samples.len(), 3, "{samples:?}");
    assert!(samples.iter().all(|s| *s > 0.0 && *s < 2.0), "{samples:?}");
}

/// A store on `server` with injected time `clock`, prefix `prefix`, and `policy` registered.
async fn timed_store(
    server: &RedisServer,
    clock: &ManualClock,
    prefix: &str,
    policy: &Policy,
) -> (RedisStore, PolicyId) {
    let mut store = RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .min_ttl(CONFORMANCE_MIN_TTL)
        .prefix(prefix)
        .standalone(&server.url())
        .await
        .expect("store");
    let id = store.register(policy).expect("register");
    (store, id)
}

/// Late refunds (<https://github.com/express-rate-limit/express-rate-limit/pull/647>) on Redis,
/// every algorithm the store runs: a refund after the charge's window closed (or after the bucket
/// drained it) gives back nothing, so R4 is denied; the control (an in-window refund) still gives
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_after_rollover_frees_nothing_on_redis() {
    let server = RedisServer::start();
    let fw = Policy::new("fw", quota(2, 60_000, 2)).with_algorithm(Algorithm::FixedWindow);
    let sw = Policy::new("sw", quota(2, 60_000, 2)).with_algorithm(Algorithm::SlidingWindow);
    let gcra = Policy::new("gcra", quota(2, 60_000, 2)); // one unit per 30 000 ms, burst 2
    let lb = Policy::new("lb", quota(2, 60_000, 2)).with_algorithm(Algorithm::LeakyBucket);
    // (policy, R1, R2 and R3, refund, R4, R4's Retry-After in s), times in ms.
    let table = [
        (&fw, 59_000, 60_500, 61_000, 62_000, 58),
        (&sw, 0, 120_500, 121_000, 122_000, 88),
        (&gcra, 0, 120_000, 120_000, 120_001, 30),
        (&lb, 0, 120_000, 120_000, 120_001, 30),
    ];
    for (policy, r1, r23, refund_at, r4, retry_s) in table {
        let clock = ManualClock::new();
        let (store, id) = timed_store(&server, &clock, "b26", policy).await;
        let key = Key::from("10.0.0.1");
        let charge = [(id, key.clone(), 1)];
        clock.set(r1 * MS);
        let first = store.check_async(&charge).await.expect("R1");
        assert!(first.is_allowed());
        let receipt = first.receipt(0);
        assert!(receipt.is_some(), "an allowed charge carries a receipt");
        clock.set(r23 * MS);
        for remaining in [1, 0] {
            let d = store.check_async(&charge).await.expect("R2/R3");
            assert!(d.is_allowed(), "{}", policy.name());
            assert_eq!(d.as_slice()[0].remaining(), remaining, "{}", policy.name());
        }
        clock.set(refund_at * MS);
        store
            .refund_async(&[((id, key.clone(), 1), receipt)])
            .await
            .expect("refund");
        clock.set(r4 * MS);
        let d = store.check_async(&charge).await.expect("R4");
        assert!(
            !d.is_allowed(),
            "{}: the late refund freed quota",
            policy.name()
        );
        let retry = d.retry_after().expect("denied now, not never");
        assert_eq!(ceil_secs(retry), retry_s, "{}: {retry:?}", policy.name());
        assert_eq!(store.stats().degraded, 0);
    }

    // Control: R1 at 1 000, R2 and R3 at 1 500, refund R1 at 2 000, R4 at 3 000.
    let clock = ManualClock::new();
    let (store, id) = timed_store(&server, &clock, "b26-control", &fw).await;
    let charge = [(id, Key::from("10.0.0.1"), 1)];
    clock.set(1_000 * MS);
    let r1 = store.check_async(&charge).await.expect("R1");
    clock.set(1_500 * MS);
    let r2 = store.check_async(&charge).await.expect("R2");
    assert_eq!((r2.is_allowed(), r2.as_slice()[0].remaining()), (true, 0));
    assert!(!store.check_async(&charge).await.expect("R3").is_allowed());
    clock.set(2_000 * MS);
    store
        .refund_async(&[(charge[0].clone(), r1.receipt(0))])
        .await
        .expect("refund");
    clock.set(3_000 * MS);
    let r4 = store.check_async(&charge).await.expect("R4");
    assert_eq!((r4.is_allowed(), r4.as_slice()[0].remaining()), (true, 0));
}

/// A quota changed between deploys (<https://github.com/3scale/APIcast/issues/667>): state written
/// under an old quota is read under the quota in force. Deploy 1 (token bucket 1 per 3 600 000 ms,
/// burst 1) charges at t=0; deploy 2 (a new store, same Redis and policy name, 100 per 60 000 ms,
/// burst 100) is not held back by it at t=1 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_quota_applies_at_once_token_bucket() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let user = Key::from("user:7");
    let (old, old_id) = timed_store(
        &server,
        &clock,
        "rl",
        &Policy::new("api", quota(1, 3_600_000, 1)),
    )
    .await;
    assert!(
        old.check_async(&[(old_id, user.clone(), 1)])
            .await
            .expect("t=0")
            .is_allowed()
    );
    drop(old);

    let (new, id) = timed_store(
        &server,
        &clock,
        "rl",
        &Policy::new("api", quota(100, 60_000, 100)),
    )
    .await;
    clock.set(1_000 * MS);
    let d = new
        .check_async(&[(id, user.clone(), 1)])
        .await
        .expect("t=1000");
    assert!(d.is_allowed(), "{d:?}");
    let decision = d.as_slice()[0];
    assert!((98..=99).contains(&decision.remaining()), "{decision:?}");
    assert!(
        decision.reset_after() <= Duration::from_secs(60),
        "{decision:?}"
    );

    // And back down: a full bucket of 100 read as 1 per hour waits at most the new quota's
    // refill from empty (3 600 s), never longer.
    for _ in 0..98 {
        new.check_async(&[(id, user.clone(), 1)])
            .await
            .expect("drain");
    }
    let (lowered, low_id) = timed_store(
        &server,
        &clock,
        "rl",
        &Policy::new("api", quota(1, 3_600_000, 1)),
    )
    .await;
    let d = lowered
        .check_async(&[(low_id, user, 1)])
        .await
        .expect("lowered");
    let retry = d.retry_after().expect("denied now");
    assert!(retry <= Duration::from_secs(3_600), "{retry:?}");
    assert_eq!(d.as_slice()[0].remaining(), 0);
}

/// A quota changed between deploys (<https://github.com/3scale/APIcast/issues/667>), control: fixed
/// window 100 per 3 600 000 ms with 50 used, redeployed as 10 per 3 600 000 ms: at t=1 000 the
/// lower limit applies at once (429, Remaining 0, Retry-After until the hour window ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_applies_at_once_fixed_window() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let user = Key::from("user:7");
    let fw = |limit| {
        Policy::new("fw", quota(limit, 3_600_000, limit)).with_algorithm(Algorithm::FixedWindow)
    };
    let (old, old_id) = timed_store(&server, &clock, "rl", &fw(100)).await;
    let d = old
        .check_async(&[(old_id, user.clone(), 50)])
        .await
        .expect("50 used");
    assert_eq!(d.as_slice()[0].remaining(), 50);
    drop(old);

    let (new, id) = timed_store(&server, &clock, "rl", &fw(10)).await;
    clock.set(1_000 * MS);
    let d = new.check_async(&[(id, user, 1)]).await.expect("t=1000");
    assert!(!d.is_allowed());
    assert_eq!(d.as_slice()[0].remaining(), 0);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(3_599_000)));
    assert_eq!(ceil_secs(d.retry_after().unwrap_or_default()), 3_599);
}

/// A quota changed between deploys (<https://github.com/3scale/APIcast/issues/667>): a changed
/// window length never mixes windowings: the units a sliding window counter still counts move into
/// the new windowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_window_keeps_counted_units_sliding_window() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let user = Key::from("user:7");
    let sw = |period_ms| {
        Policy::new("sw", quota(4, period_ms, 4)).with_algorithm(Algorithm::SlidingWindow)
    };
    let (old, old_id) = timed_store(&server, &clock, "rl", &sw(10_000)).await;
    assert!(
        old.check_async(&[(old_id, user.clone(), 4)])
            .await
            .expect("4 used")
            .is_allowed()
    );
    let (new, id) = timed_store(&server, &clock, "rl", &sw(20_000)).await;
    clock.set(1_000 * MS);
    let d = new.check_async(&[(id, user, 1)]).await.expect("t=1000");
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.as_slice()[0].remaining(), 0);
}

/// An app clock that is `skew` behind (negative) or ahead of the real one; monotonic time
/// from its own origin.
#[derive(Debug, Clone)]
struct SkewedClock {
    mono: ratekeeper_axum::core::clock::MonotonicClock,
    skew_ms: i64,
}

impl ratekeeper_axum::core::clock::Clock for SkewedClock {
    fn now(&self) -> u64 {
        self.mono.now()
    }
    fn unix_now(&self) -> Duration {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let skew = Duration::from_millis(self.skew_ms.unsigned_abs());
        if self.skew_ms < 0 {
            real.saturating_sub(skew)
        } else {
            real + skew
        }
    }
}

/// App clock skew against Redis (the class of
/// <https://github.com/spring-cloud/spring-cloud-gateway/issues/1688>: app time mixed with Redis
/// time): instance A (correct clock) and instance B (app clock 10 000 ms behind, then in a second
/// run 10 000 ms ahead), separate stores and connections, one Redis, Redis `TIME`. GCRA burst 4. A:
/// 200 with Remaining 3, 2, 1, 0, then 429. B: 429, Remaining 0, a Retry-After on Redis's clock,
/// decided by Redis; 4 admitted in all; no degraded decision, neither in `RedisStats` nor in the
/// metrics counter.
///
/// The test's rate (2 per 1 000 ms: Retry-After 1) refills a unit every 500 ms of real time,
/// which a loaded machine can spend between two of these steps; at 2 per 60 000 ms (T = 30 s)
/// nothing refills during the test, and B's Retry-After is 30 s less the real time since
/// A's first charge (a wait on B's skewed clock would be 10 s off).
#[test]
fn app_clock_skew_never_fails_open() {
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let policy = Policy::new("api", quota(2, 60_000, 4));
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            for (run, skew_ms) in [(0, -10_000), (1, 10_000)] {
                let connect = async |clock: Option<SkewedClock>| {
                    // The test is about the app's clock, not the deadline (50 ms by default,
                    // missed on a loaded machine): a decision the failure policy answered
                    // would prove nothing. 5 s stays below the 10 s skew, so a stale guard
                    // measured on the app's clock (the defect) still calls B's checks stale.
                    let mut builder = RedisStore::builder()
                        .deadline(Duration::from_secs(5))
                        .stale_tolerance(Duration::ZERO)
                        .prefix(format!("b36-{run}"));
                    if let Some(clock) = clock {
                        builder = builder.app_clock(clock);
                    }
                    let mut store = builder.standalone(&server.url()).await.expect("store");
                    let id = store.register(&policy).expect("register");
                    // A first reply teaches the stale guard Redis's time (another key).
                    store
                        .check_async(&[(id, Key::from("warm"), 1)])
                        .await
                        .expect("warm");
                    (store, id)
                };
                let (a, a_id) = connect(None).await;
                let (b, b_id) = connect(Some(SkewedClock {
                    mono: ratekeeper_axum::core::clock::MonotonicClock::new(),
                    skew_ms,
                }))
                .await;
                let key = Key::from("client");
                let mut admitted = 0;
                let started = std::time::Instant::now();
                for expected in [3, 2, 1, 0] {
                    let d = a.check_async(&[(a_id, key.clone(), 1)]).await.expect("A");
                    assert!(d.is_allowed(), "run {run}: {d:?}");
                    assert_eq!(d.as_slice()[0].remaining(), expected);
                    admitted += 1;
                }
                assert!(
                    !a.check_async(&[(a_id, key.clone(), 1)])
                        .await
                        .expect("A5")
                        .is_allowed()
                );
                let d = b
                    .check_async(&[(b_id, key.clone(), 1)])
                    .await
                    .expect("decided by Redis");
                assert!(!d.is_allowed(), "run {run}: B failed open: {d:?}");
                assert_eq!(d.as_slice()[0].remaining(), 0);
                let retry = d.retry_after().expect("denied now");
                let t = Duration::from_secs(30);
                assert!(
                    retry <= t && retry + started.elapsed() >= t,
                    "run {run}: {retry:?} after {:?}",
                    started.elapsed()
                );
                assert_eq!(admitted, 4);
                assert_eq!(
                    (a.stats().degraded, b.stats().degraded),
                    (0, 0),
                    "run {run}"
                );
                assert_eq!(b.stats().redis_decisions, 2);
                // Epoch-style reset headers follow Redis TIME, not B's clock.
                let real = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let b_now = b.unix_now();
                let gap = b_now.max(real) - b_now.min(real);
                assert!(
                    gap < Duration::from_secs(2),
                    "run {run}: B's unix_now is {gap:?} off"
                );
            }
        });
    });
    let degraded: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, value)| {
            key.key().name() == "ratekeeper_store_degraded_total"
                && !matches!(value, DebugValue::Counter(0))
        })
        .collect();
    assert!(degraded.is_empty(), "{degraded:?}");
}

/// The advertised quota bounds Remaining on the Redis store: for GCRA and the leaky bucket a
/// decision's limit is the burst (P1 "1 per 1 000 ms, burst 10", P2 "100 per 60 000 ms, burst 10"),
/// Remaining counts down from 9 and never exceeds it, and the 11th request is denied with the same
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_decisions_limit_is_the_burst() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        for (name, q) in [("p1", quota(1, 1_000, 10)), ("p2", quota(100, 60_000, 10))] {
            let policy = Policy::new(name, q).with_algorithm(algorithm);
            let clock = ManualClock::new();
            let (store, id) =
                timed_store(&server, &clock, &format!("b37-{algorithm}"), &policy).await;
            let charge = [(id, Key::from("client"), 1)];
            for i in 0..11u32 {
                let d = store.check_async(&charge).await.expect("decided by Redis");
                let decision = d.as_slice()[0];
                let what = format!("{algorithm} {name} #{}", i + 1);
                assert_eq!(d.is_allowed(), i < 10, "{what}");
                assert_eq!(decision.limit(), 10, "{what}");
                assert_eq!(decision.remaining(), 9 - i.min(9), "{what}");
            }
        }
    }
}

/// A `min_ttl` longer than Redis can expire is lowered to `RedisStoreBuilder::MAX_MIN_TTL`:
/// decisions still come from Redis and every key has a TTL. (Unbounded, `PX`/`PEXPIRE`
/// refused the value: every decision failed to the failure policy, and the sliding log's
/// entry, added before its `PEXPIRE`, stayed without a TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_min_ttl_is_capped_and_decisions_still_come_from_redis() {
    let server = RedisServer::start();
    let mut store = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .min_ttl(Duration::MAX)
        .standalone(&server.url())
        .await
        .expect("store");
    let log = store
        .register(&Policy::new("log", quota(2, 60_000, 2)).with_algorithm(Algorithm::SlidingLog))
        .expect("sliding log");
    let gcra = store
        .register(&Policy::new("gcra", quota(2, 60_000, 2)))
        .expect("gcra");
    for id in [log, gcra] {
        let charge: OwnedCharge = (id, Key::from("client-1"), 1);
        let first = store.check_async(std::slice::from_ref(&charge)).await;
        let first = first.map_err(|e| e.to_string()).expect("Redis decides");
        assert!(first.is_allowed());
        assert_eq!(first.as_slice()[0].remaining(), 1);
    }
    let keys = server
        .cli(&["--scan", "--pattern", "*"])
        .expect("redis-cli");
    let max = i64::try_from(RedisStoreBuilder::MAX_MIN_TTL.as_millis()).unwrap();
    assert_eq!(keys.lines().count(), 2, "{keys}");
    for key in keys.lines() {
        let ttl: i64 = server
            .cli(&["PTTL", key])
            .expect("redis-cli")
            .trim()
            .parse()
            .expect("PTTL");
        assert!(ttl > 0 && ttl <= max, "{key}: PTTL {ttl}");
    }
}

/// A Redis error reads as a sentence: the server's message, without the `redis` crate's
/// `Debug`-written kinds (`Server(ResponseError)`, `ResponseError:`). The store is made
/// ready when built, so a Redis that refuses the connection's setup fails the build, at
/// once (no retries for an answer that cannot change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_errors_in_decisions_read_as_sentences() {
    let server = RedisServer::start();
    // Database 99 does not exist (16 by default): the connection cannot be set up.
    let url = format!("redis://127.0.0.1:{}/99", server.port());
    let started = std::time::Instant::now();
    let err = RedisStore::builder()
        .deadline(DECISION_DEADLINE)
        .connect_timeout(Duration::from_secs(30))
        .standalone(&url)
        .await
        .expect_err("no such database");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "retried a refusal"
    );
    assert!(err.is_unavailable(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("DB index is out of range"), "{text}");
    for debug_text in ["Server(", "ResponseError", "ExtensionError", " - "] {
        assert!(!text.contains(debug_text), "{text}");
    }
    assert!(!text.contains('\n'), "{text}");
}
