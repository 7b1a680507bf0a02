//! Refunds in any order: random interleavings of charges, refunds (of any earlier charge,
//! in any order) and clock steps on one key, every algorithm, on the memory store and on
//! Redis (a test-owned redis-server, injected time). Each refund gives back at most what
//! its own charge still holds (nothing the bucket already drained, nothing of another
//! charge), measured by peeking the key before and after it, and exactly what a simple
//! model says:
//!
//! - GCRA and the leaky bucket: a FIFO ledger of the charges' slots (`cost × T` each), which
//!   the bucket drains from the front one ns per ns; a refund takes its charge's undrained
//!   part out, and the slots after it move up. The key's `reset_after` is the ledger's sum.
//! - Fixed window: a charge holds its units while its window lasts.
//! - Sliding log: a charge holds its units while its entry counts (`ts + W > now`).
//! - Sliding window counter: a charge holds its units in its window and, weighted by the
//!   part of the window still overlapping, in the next; the estimate is rounded, so the
//!   measured give-back is bounded by the model's, rounded up.

use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use ratekeeper_axum::core::clock::{Clock, ManualClock};
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::core::store::{
    Charge, Checked, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_axum::core::{Algorithm, Decision, Key, Policy, Quota};
use ratekeeper_tests::redis::RedisServer;

const MS: u64 = 1_000_000;
/// 5 per second, burst 5: T = 200 ms, W = 1 s.
const LIMIT: u32 = 5;
const W: u64 = 1_000 * MS;
const T: u64 = W / LIMIT as u64;

#[derive(Debug, Clone)]
enum Op {
    /// Charge `cost` units now.
    Charge(u64),
    /// Refund the allowed charge picked by this number (modulo those not refunded yet).
    Refund(usize),
    /// Move the clock by this many ms.
    Wait(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (1u64..=3).prop_map(Op::Charge),
        3 => any::<usize>().prop_map(Op::Refund),
        2 => (0u64..=400).prop_map(Op::Wait),
    ];
    proptest::collection::vec(op, 1..30)
}

/// One store under test: memory or Redis, with one policy registered.
enum Under {
    Memory(MemoryStore<Key, ManualClock>),
    Redis(RedisStore),
}

impl Under {
    async fn check(&self, p: PolicyId, key: &Key, cost: u64) -> Decisions {
        let charges = [Charge::new(p, key, cost)];
        match self {
            Self::Memory(s) => match s.check(&charges) {
                Checked::Ready(r) => r.expect("memory answers"),
                Checked::Pending(_) => unreachable!("the memory store answers at once"),
            },
            Self::Redis(s) => match s.check(&charges) {
                Checked::Ready(r) => r.expect("redis answers"),
                Checked::Pending(f) => f.await.expect("redis answers"),
            },
        }
    }

    async fn peek(&self, p: PolicyId, key: &Key) -> Decision {
        match self {
            Self::Memory(s) => match s.peek(p, key) {
                Checked::Ready(r) => r.expect("peek").as_slice()[0],
                Checked::Pending(_) => unreachable!("the memory store answers at once"),
            },
            Self::Redis(s) => s.peek_async(p, key).await.expect("peek"),
        }
    }

    async fn refund(&self, p: PolicyId, key: &Key, cost: u64, receipt: Receipt) {
        match self {
            Self::Memory(s) => s.refund(&[Refund::new(Charge::new(p, key, cost), receipt)]),
            Self::Redis(s) => s
                .refund_async(&[((p, key.clone(), cost), receipt)])
                .await
                .expect("refund reaches redis"),
        }
    }
}

/// What a charge holds in the model at `now` (ns): units for the windows and the log,
/// ns of the bucket for GCRA and the leaky bucket.
#[derive(Debug, Clone)]
struct Held {
    cost: u64,
    at: u64,
    /// GCRA, leaky bucket: the undrained ns of its slot (the FIFO ledger).
    slot: u64,
    refunded: bool,
}

/// The FIFO ledger: drains `ns` from the front of the live slots.
fn drain(charges: &mut [Held], mut ns: u64) {
    for c in charges.iter_mut().filter(|c| !c.refunded) {
        let d = c.slot.min(ns);
        c.slot -= d;
        ns -= d;
        if ns == 0 {
            return;
        }
    }
}

/// The model's give-back of `c` at `now`, for `algorithm` (ns for the buckets, units × 1000
/// for the windows and the log, so the sliding window counter's weight fits).
fn model_give(algorithm: Algorithm, c: &Held, now: u64) -> u64 {
    match algorithm {
        Algorithm::Gcra | Algorithm::LeakyBucket => c.slot,
        Algorithm::FixedWindow if now / W == c.at / W => c.cost * 1000,
        Algorithm::SlidingLog if c.at + W > now => c.cost * 1000,
        Algorithm::SlidingWindow => {
            let (w, cw) = (now / W, c.at / W);
            if w == cw {
                c.cost * 1000
            } else if w == cw + 1 {
                // The previous window weighs (1 - elapsed / W); ceil to the 1/1000 unit.
                let left = W - now % W;
                (c.cost * 1000 * left).div_ceil(W)
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// The measured give-back: the change of `reset_after` (ns) for the buckets, of
/// `remaining` (× 1000) for the others.
fn measured(algorithm: Algorithm, before: &Decision, after: &Decision) -> u64 {
    match algorithm {
        Algorithm::Gcra | Algorithm::LeakyBucket => {
            let ns = |d: &Decision| u64::try_from(d.reset_after().as_nanos()).unwrap_or(u64::MAX);
            ns(before).saturating_sub(ns(after))
        }
        _ => u64::from(after.remaining().saturating_sub(before.remaining())) * 1000,
    }
}

async fn run_case(
    algorithm: Algorithm,
    under: &Under,
    p: PolicyId,
    clock: &ManualClock,
    key: &Key,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut held: Vec<Held> = Vec::new();
    let mut receipts: Vec<Receipt> = Vec::new();
    for op in ops {
        match op {
            Op::Wait(ms) => {
                clock.advance(Duration::from_millis(*ms));
                drain(&mut held, ms * MS);
            }
            Op::Charge(cost) => {
                let d = under.check(p, key, *cost).await;
                if d.is_allowed() {
                    held.push(Held {
                        cost: *cost,
                        at: clock.now(),
                        slot: cost * T,
                        refunded: false,
                    });
                    receipts.push(d.receipt(0));
                }
            }
            Op::Refund(pick) => {
                let live: Vec<usize> = (0..held.len()).filter(|&i| !held[i].refunded).collect();
                let Some(&i) = live.get(pick % live.len().max(1)) else {
                    continue;
                };
                let now = clock.now();
                let before = under.peek(p, key).await;
                under.refund(p, key, held[i].cost, receipts[i]).await;
                let after = under.peek(p, key).await;
                let gave = measured(algorithm, &before, &after);
                let may = model_give(algorithm, &held[i], now);
                let c = held[i].clone();
                prop_assert!(
                    gave <= may + u64::from(matches!(algorithm, Algorithm::SlidingWindow)) * 1000,
                    "{algorithm:?}: the refund of charge {i} ({c:?}) at {now} gave back {gave}, \
                     more than it held ({may}); before {before:?}, after {after:?}; ops {ops:?}"
                );
                if !matches!(algorithm, Algorithm::SlidingWindow) {
                    prop_assert_eq!(
                        gave,
                        may,
                        "{:?}: the refund of charge {} ({:?}) at {}; ops {:?}",
                        algorithm,
                        i,
                        c,
                        now,
                        ops
                    );
                }
                held[i].refunded = true;
                held[i].slot = 0;
            }
        }
    }
    Ok(())
}

/// The algorithms swept: every one that charges units (the concurrency counter's permits
/// are the same whatever the order).
const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// Runs the sweep for every algorithm on the store `build` makes (given the clock), a
/// fresh key per case, the clock an hour further for each.
fn sweep(name: &str, build: impl AsyncFnOnce(&ManualClock) -> Under) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let clock = ManualClock::new();
    clock.set(1_000_000 * W);
    let mut under = rt.block_on(build(&clock));
    let mut ids = Vec::new();
    for algorithm in ALGORITHMS {
        let policy = Policy::new(
            format!("p-{algorithm}"),
            Quota::per_second(NonZeroU32::new(LIMIT).unwrap()),
        )
        .with_algorithm(algorithm);
        let id = match &mut under {
            Under::Memory(s) => s.register(&policy),
            Under::Redis(s) => s.register(&policy),
        }
        .expect("register");
        ids.push((algorithm, id));
    }
    let case = std::cell::Cell::new(0u64);
    for (algorithm, id) in ids {
        let mut runner = TestRunner::new(Config {
            cases: 128,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&ops(), |ops| {
            case.set(case.get() + 1);
            clock.advance(Duration::from_secs(3_600));
            let key = Key::from(format!("{name}-{}", case.get()));
            rt.block_on(run_case(algorithm, &under, id, &clock, &key, &ops))
        });
        if let Err(e) = result {
            panic!("{name}, {algorithm:?}: {e}");
        }
    }
}

#[test]
fn refunds_in_any_order_give_back_what_their_charge_holds_in_memory() {
    sweep("memory", async |clock: &ManualClock| {
        Under::Memory(MemoryStore::with_clock(clock.clone()))
    });
}

#[test]
fn refunds_in_any_order_give_back_what_their_charge_holds_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    sweep("redis", async |clock: &ManualClock| {
        Under::Redis(
            RedisStore::builder()
                .clock(clock.clone())
                .min_ttl(Duration::from_secs(3_600))
                .deadline(ratekeeper_tests::redis::DECISION_DEADLINE)
                .standalone(&url)
                .await
                .expect("redis store"),
        )
    });
}
