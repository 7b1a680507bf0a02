//! The memory ≡ Redis differential sweep: one random sequence of operations run on the
//! memory store (the reference) and on a Redis store with the same policies and an aligned
//! clock, their answers compared field by field after every step.
//!
//! A sequence is read from bytes through [`Gen`], so every byte string is a valid sequence
//! and proptest shrinks a failing one to its smallest form. Each step first moves the clock
//! (by 0, 1 µs, 1 ms, ... or several seconds; always whole µs, the Redis store's unit) and
//! then does one of:
//!
//! - **check**: one to three charges (a policy, a key, a cost from 0 to over the capacity),
//!   where two charges may name the same policy and key (a duplicate charge);
//! - **peek**: one charge of cost 0 (it passes and writes nothing, reporting the state);
//! - **reserve**: the charges of a check with a `max_wait` (the Delay mode);
//! - **refund**: the charges of an earlier allowed check or reservation, each store with the
//!   receipts its own answer carried;
//! - **correct**: the same charges corrected to true costs from 0 to twice the capacity,
//!   each store with its own receipts: a give-back below the estimate, an extra charge
//!   (a debt, beyond the capacity) above it.
//!
//! Policies: one per algorithm the Redis store takes (GCRA, leaky bucket, fixed window,
//! sliding window counter, sliding log), every emission interval and window a whole µs. The
//! concurrency counter is left out: the Redis store refuses it as a policy (shared
//! concurrency limits are slots, with their own tests).

use std::fmt::Write as _;
use std::time::Duration;

use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::redis::{OwnedCharge, RedisStore};
use ratekeeper_core::store::{
    Charge, Correction, Decisions, MemoryStore, PolicyId, Receipt, Refund, Store,
};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};

use crate::sweep::Gen;

const MS: u64 = 1_000_000;

/// The policies of every sequence: one per algorithm, whole-µs parameters, small limits so
/// denials, boundaries and refills all happen within a few steps.
pub fn policies() -> Vec<Policy> {
    let q = |limit: u32, period_ms: u64, burst: u32| {
        Quota::new(limit, Duration::from_millis(period_ms))
            .and_then(|q| q.with_burst(burst))
            .expect("valid quota")
    };
    vec![
        Policy::new("gcra", q(5, 1_000, 3)), // T = 200 ms, burst 3
        Policy::new("leaky", q(4, 1_000, 2)).with_algorithm(Algorithm::LeakyBucket),
        Policy::new("fw", q(3, 2_000, 3)).with_algorithm(Algorithm::FixedWindow),
        Policy::new("sw", q(4, 2_000, 4)).with_algorithm(Algorithm::SlidingWindow),
        Policy::new("log", q(3, 1_500, 3)).with_algorithm(Algorithm::SlidingLog),
    ]
}

/// Client keys of the sequences.
const KEYS: [&str; 2] = ["a", "b"];

/// Clock moves before a step, in µs.
const STEPS_US: [u64; 12] = [
    0, 0, 0, 1, 1_000, 50_000, 137_000, 199_999, 250_000, 999_999, 1_500_000, 4_000_000,
];

/// Costs of a charge (4 exceeds every capacity: "can never fit").
const COSTS: [u64; 8] = [0, 1, 1, 1, 1, 2, 3, 4];

/// True costs of a correction (above 4: beyond every capacity, a debt).
const ACTUALS: [u64; 6] = [0, 1, 2, 3, 5, 9];

/// Reservation bounds.
const MAX_WAITS_MS: [u64; 4] = [0, 100, 1_000, 10_000];

/// One operation of a sequence.
#[derive(Debug, Clone)]
pub enum Op {
    /// Charges all-or-nothing: (policy index, key index, cost).
    Check(Vec<(usize, usize, u64)>),
    /// Reserves all-or-nothing for a request that may wait up to `max_wait`.
    Reserve(Vec<(usize, usize, u64)>, Duration),
    /// Gives back what step `of` (an allowed check or reservation) charged.
    Refund(usize),
    /// Corrects the charges of step `of` (an allowed check or reservation) to these true
    /// costs, one per charge.
    Correct(usize, Vec<u64>),
}

/// One step: the clock moves by `advance_us`, then `op` runs.
#[derive(Debug, Clone)]
pub struct Step {
    /// Clock move before the operation, µs.
    pub advance_us: u64,
    /// The operation.
    pub op: Op,
}

fn charges(g: &mut Gen<'_>, n_policies: usize) -> Vec<(usize, usize, u64)> {
    let n = 1 + g.below(3);
    let mut out: Vec<(usize, usize, u64)> = Vec::with_capacity(n);
    for _ in 0..n {
        // Now and then the same policy and key again (a duplicate charge).
        let dup = g.byte() < 40;
        let (p, k) = match out.last() {
            Some(&(p, k, _)) if dup => (p, k),
            _ => (g.below(n_policies), g.below(KEYS.len())),
        };
        out.push((p, k, g.pick(&COSTS)));
    }
    out
}

/// Reads a sequence of at most `max_steps` steps from `data`.
pub fn sequence(data: &[u8], max_steps: usize) -> Vec<Step> {
    let mut g = Gen::new(data);
    let n_policies = policies().len();
    let steps = g.below(max_steps + 1);
    let mut out: Vec<Step> = Vec::with_capacity(steps);
    for _ in 0..steps {
        let advance_us = g.pick(&STEPS_US);
        let op = match g.byte() % 8 {
            0..=3 => Op::Check(charges(&mut g, n_policies)),
            4 => Op::Check(vec![(g.below(n_policies), g.below(KEYS.len()), 0)]),
            5 => {
                let c = charges(&mut g, n_policies);
                Op::Reserve(c, Duration::from_millis(g.pick(&MAX_WAITS_MS)))
            }
            kind => {
                let allowed: Vec<usize> = (0..out.len())
                    .filter(|&i| matches!(out[i].op, Op::Check(_) | Op::Reserve(..)))
                    .collect();
                if allowed.is_empty() {
                    Op::Check(charges(&mut g, n_policies))
                } else {
                    let of = allowed[g.below(allowed.len())];
                    if kind == 6 {
                        Op::Refund(of)
                    } else {
                        let n = match &out[of].op {
                            Op::Check(c) | Op::Reserve(c, _) => c.len(),
                            _ => 0,
                        };
                        Op::Correct(of, (0..n).map(|_| g.pick(&ACTUALS)).collect())
                    }
                }
            }
        };
        out.push(Step { advance_us, op });
    }
    out
}

/// The two stores of one sequence, on clocks that always read the same time.
#[derive(Debug)]
pub struct Pair {
    memory: MemoryStore<Key, ManualClock>,
    memory_clock: ManualClock,
    redis: RedisStore,
    redis_clock: ManualClock,
    ids: Vec<PolicyId>,
    redis_ids: Vec<PolicyId>,
}

impl Pair {
    /// Registers [`policies`] on a fresh memory store and on `redis` (built with
    /// `redis_clock` injected), both clocks set to `start_ns`.
    ///
    /// # Panics
    ///
    /// When a store refuses a policy.
    pub fn new(mut redis: RedisStore, redis_clock: ManualClock, start_ns: u64) -> Self {
        let memory_clock = ManualClock::new();
        memory_clock.set(start_ns);
        redis_clock.set(start_ns);
        let mut memory = MemoryStore::<Key, _>::with_clock(memory_clock.clone());
        let mut ids = Vec::new();
        let mut redis_ids = Vec::new();
        for p in policies() {
            ids.push(memory.register(&p).expect("memory registers"));
            redis_ids.push(redis.register(&p).expect("redis registers"));
        }
        Self {
            memory,
            memory_clock,
            redis,
            redis_clock,
            ids,
            redis_ids,
        }
    }

    /// Runs `steps` on both stores and returns how many answers were compared; `Err`
    /// describes the first step whose answers differ (with the sequence up to it), or a
    /// Redis error.
    ///
    /// # Errors
    ///
    /// The description of the first difference.
    pub async fn run(&self, steps: &[Step]) -> Result<usize, String> {
        let keys: Vec<Key> = KEYS.iter().map(|k| Key::from(*k)).collect();
        let mut log = String::new();
        let mut answers: Vec<Option<(Decisions, Decisions)>> = Vec::with_capacity(steps.len());
        let mut now_ns = self.memory_clock.now_ns();
        for (i, step) in steps.iter().enumerate() {
            now_ns = now_ns.saturating_add(step.advance_us * 1_000);
            self.memory_clock.set(now_ns);
            self.redis_clock.set(now_ns);
            let _ = writeln!(log, "#{i} t={}µs {:?}", now_ns / 1_000, step.op);
            let (memory, redis) = match &step.op {
                Op::Check(c) | Op::Reserve(c, _) => {
                    let mem: Vec<Charge<'_, Key>> = c
                        .iter()
                        .map(|&(p, k, cost)| Charge::new(self.ids[p], &keys[k], cost))
                        .collect();
                    let red: Vec<OwnedCharge> = c
                        .iter()
                        .map(|&(p, k, cost)| (self.redis_ids[p], keys[k].clone(), cost))
                        .collect();
                    let (m, r) = match &step.op {
                        Op::Reserve(_, max_wait) => (
                            self.memory.reserve_now(&mem, *max_wait),
                            self.redis.reserve_async(&red, *max_wait).await,
                        ),
                        _ => (
                            self.memory.check_now(&mem),
                            self.redis.check_async(&red).await,
                        ),
                    };
                    let m = m.map_err(|e| format!("{log}memory failed: {e}"))?;
                    let r = r.map_err(|e| format!("{log}redis failed: {e}"))?;
                    (m, r)
                }
                Op::Correct(of, actual) => {
                    let Some(Some((m_taken, r_taken))) = answers.get(*of) else {
                        answers.push(None);
                        continue;
                    };
                    let (Op::Check(c) | Op::Reserve(c, _)) = &steps[*of].op else {
                        answers.push(None);
                        continue;
                    };
                    let mem: Vec<Correction<'_, Key>> = c
                        .iter()
                        .zip(m_taken.receipts())
                        .zip(actual)
                        .map(|((&(p, k, cost), r), &a)| {
                            Correction::new(Charge::new(self.ids[p], &keys[k], cost), r, a)
                        })
                        .collect();
                    let red: Vec<(OwnedCharge, Receipt, u64)> = c
                        .iter()
                        .zip(r_taken.receipts())
                        .zip(actual)
                        .map(|((&(p, k, cost), r), &a)| {
                            ((self.redis_ids[p], keys[k].clone(), cost), r, a)
                        })
                        .collect();
                    self.memory.correct(&mem);
                    self.redis
                        .correct_async(&red)
                        .await
                        .map_err(|e| format!("{log}redis correction failed: {e}"))?;
                    answers.push(None);
                    continue;
                }
                Op::Refund(of) => {
                    let Some(Some((m_taken, r_taken))) = answers.get(*of) else {
                        answers.push(None);
                        continue;
                    };
                    let (Op::Check(c) | Op::Reserve(c, _)) = &steps[*of].op else {
                        answers.push(None);
                        continue;
                    };
                    let mem: Vec<Refund<'_, Key>> = c
                        .iter()
                        .zip(m_taken.receipts())
                        .map(|(&(p, k, cost), r)| {
                            Refund::new(Charge::new(self.ids[p], &keys[k], cost), r)
                        })
                        .collect();
                    let red: Vec<(OwnedCharge, Receipt)> = c
                        .iter()
                        .zip(r_taken.receipts())
                        .map(|(&(p, k, cost), r)| ((self.redis_ids[p], keys[k].clone(), cost), r))
                        .collect();
                    self.memory.refund(&mem);
                    self.redis
                        .refund_async(&red)
                        .await
                        .map_err(|e| format!("{log}redis refund failed: {e}"))?;
                    answers.push(None);
                    continue;
                }
            };
            let _ = writeln!(log, "   memory {memory:?}");
            if memory != redis {
                return Err(format!("{log}   redis  {redis:?}\nstep #{i} differs"));
            }
            answers.push(Some((memory, redis)));
        }
        if self.redis.stats().degraded != 0 {
            return Err(format!("{log}redis answered by its failure policy"));
        }
        Ok(answers.iter().flatten().count())
    }
}

/// The clock's reading in ns.
trait NowNs {
    fn now_ns(&self) -> u64;
}

impl NowNs for ManualClock {
    fn now_ns(&self) -> u64 {
        ratekeeper_core::clock::Clock::now(self)
    }
}

/// A start time for sequence `case`: whole µs, away from 0, window boundaries varied.
pub fn start_ns(case: u64) -> u64 {
    1_000 * MS + (case % 7) * 333_000
}
