//! The negative cache: denials remembered locally until their `retry_after`.
//!
//! Until `retry_after` has passed, the same request (same policies, keys and cost) is denied
//! without a round trip. For GCRA and the fixed window this is exact, headers included:
//! nothing the key's other requests do can make it pass sooner (refunds aside). Sliding
//! window denials are not cached (their estimate, and so their headers, move with time).
//! Times are ns on the store's decision clock, and only differences of them are used, so the
//! cache never compares the app's clock with Redis's.

use std::time::Duration;

use dashmap::DashMap;

use super::script::{ALGO_GCRA, RedisPolicy};
use super::{OwnedCharge, nanos};
use crate::store::{Decisions, PolicyId};
use crate::{Decision, Key, Outcome};

/// The cache is swept of expired entries when it holds more than this many.
const SWEEP_AT: usize = 65_536;

#[derive(Debug)]
struct Entry {
    cost: u64,
    /// Clock ns when the entry was written.
    at: u64,
    /// Clock ns until which the request is denied.
    until: u64,
    decision: Decision,
}

/// Denials by (policy, client key).
#[derive(Debug, Default)]
pub(super) struct NegativeCache {
    map: DashMap<(PolicyId, Key), Entry, foldhash::fast::RandomState>,
}

impl NegativeCache {
    /// The cached answer to `charges` at `now` (ns), if every charge has a live entry with
    /// the same cost and at least one of them is a denial.
    pub(super) fn lookup(
        &self,
        charges: &[OwnedCharge],
        policies: &[RedisPolicy],
        now: u64,
    ) -> Option<Decisions> {
        if self.map.is_empty() || charges.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(charges.len());
        let mut any_denied = false;
        for (policy, key, cost) in charges {
            let entry = self.map.get(&(*policy, key.clone()))?;
            if entry.cost != *cost || now >= entry.until {
                return None;
            }
            let elapsed = Duration::from_nanos(now.saturating_sub(entry.at));
            let d = entry.decision;
            let outcome = match d.outcome() {
                Outcome::Denied { retry_after } => {
                    any_denied = true;
                    Outcome::Denied {
                        retry_after: retry_after.saturating_sub(elapsed),
                    }
                }
                other => other,
            };
            // GCRA: the state (TAT) has not changed since the denial (an allowed charge of
            // this pair removes the entry), so `reset_after` shrinks with time and
            // `remaining = min(burst, floor((tau - reset_after) / T))` follows exactly.
            let reset = d.reset_after().saturating_sub(elapsed);
            let remaining = match policies.get(policy.index()) {
                Some(p) if p.algo == ALGO_GCRA => {
                    let room = u128::from(p.params[1]) * 1_000;
                    let t = u128::from(p.params[0]) * 1_000;
                    let whole = room.saturating_sub(reset.as_nanos()) / t.max(1);
                    u32::try_from(whole.min(u128::from(p.capacity))).unwrap_or(p.capacity)
                }
                // Fixed window: the count stays until the window ends (the entry's `until`).
                _ => d.remaining(),
            };
            out.push(Decision::new(outcome, d.limit(), remaining, reset));
        }
        any_denied.then(|| Decisions::new(out))
    }

    /// After a Redis decision at `now` (ns): an allowed request changed the state of its
    /// pairs, so their entries go; a denial is remembered until `retry_after` when
    /// `cacheable` (no sliding window among the charges).
    pub(super) fn update(
        &self,
        charges: &[OwnedCharge],
        decisions: &Decisions,
        cacheable: bool,
        now: u64,
    ) {
        if decisions.is_allowed() {
            if !self.map.is_empty() {
                for (policy, key, _) in charges {
                    self.map.remove(&(*policy, key.clone()));
                }
            }
            return;
        }
        let Some(retry) = decisions.retry_after() else {
            return;
        };
        if !cacheable || retry.is_zero() {
            return;
        }
        let until = now.saturating_add(nanos(retry));
        if self.map.len() >= SWEEP_AT {
            self.map.retain(|_, e| e.until > now);
            if self.map.len() >= SWEEP_AT {
                self.map.clear();
            }
        }
        for ((policy, key, cost), decision) in charges.iter().zip(decisions.as_slice()) {
            self.map.insert(
                (*policy, key.clone()),
                Entry {
                    cost: *cost,
                    at: now,
                    until,
                    decision: *decision,
                },
            );
        }
    }

    /// Forgets the pairs of `charges` (after a refund changed their state).
    pub(super) fn forget<'a>(&self, pairs: impl IntoIterator<Item = (PolicyId, &'a Key)>) {
        if self.map.is_empty() {
            return;
        }
        for (policy, key) in pairs {
            self.map.remove(&(policy, key.clone()));
        }
    }
}
