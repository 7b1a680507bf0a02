//! The negative cache: denials remembered locally, every algorithm, with a stated bound.
//!
//! After Redis denies a request, the same request (same policies, keys and costs) is denied
//! locally, without a round trip, until the earliest instant at which Redis's answer could
//! differ, and its answer is the one Redis would give then, field by field:
//!
//! ```text
//! until = now + min(retry_after of every denied row, hold of every row)
//! ```
//!
//! where a row's **hold** (computed by the script from the state it read) is how long its
//! fields change only with elapsed time: `retry_after` and `reset_after` shrink one for one,
//! and `remaining` is constant (GCRA and the leaky bucket: it follows from `reset_after`,
//! `min(burst, floor((tau - reset_after) / T))`). Per algorithm:
//!
//! | algorithm | hold | so a remembered denial lasts |
//! |---|---|---|
//! | GCRA, leaky bucket | unbounded | until `retry_after` (exact) |
//! | fixed window | until the window ends | until `retry_after` (= the window's end) |
//! | sliding window counter | until the window ends or the estimate frees one more whole unit of `remaining` | at most until `retry_after` |
//! | sliding log | until its oldest live entry expires | at most until `retry_after` |
//!
//! The bound holds because nothing but a write to the key can change these answers sooner,
//! and every write that can make a denied request pass is either seen here or is a refund:
//! a charge that this store sends and Redis allows forgets the entries of its keys (the
//! state changed), so does every reservation that books a turn and every refund sent
//! through this store; charges by other instances only make the key fuller, which keeps a
//! denial a denial. A refund sent by **another** instance can free a key sooner: such a
//! denial is repeated at most until the bound above, computed from the state before that
//! refund, which never exceeds the time the key needs to free by itself (`retry_after`).
//! Requests that charge one policy and key twice are never remembered (their rows share an
//! entry). Times are ns on the store's decision clock, and only differences of them are used,
//! so the cache never compares the app's clock with Redis's.

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
        if self.map.is_empty() || charges.is_empty() || has_duplicates(charges) {
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
            // `remaining = min(burst, floor((tau - reset_after) / T))` follows exactly. The
            // other algorithms keep `remaining` for the row's hold (see the module docs).
            let reset = d.reset_after().saturating_sub(elapsed);
            let remaining = match policies.get(policy.index()) {
                Some(p) if p.algo == ALGO_GCRA => {
                    let room = u128::from(p.params[1]) * 1_000;
                    let t = u128::from(p.params[0]) * 1_000;
                    let whole = room.saturating_sub(reset.as_nanos()) / t.max(1);
                    u32::try_from(whole.min(u128::from(p.capacity))).unwrap_or(p.capacity)
                }
                _ => d.remaining(),
            };
            out.push(Decision::new(outcome, d.limit(), remaining, reset));
        }
        any_denied.then(|| Decisions::new(out))
    }

    /// After a Redis decision at `now` (ns): an allowed request changed the state of its
    /// pairs, so their entries go; a denial is remembered until the first of its rows'
    /// `retry_after` and `hold` (the shortest hold of its rows, `None`: unbounded).
    pub(super) fn update(
        &self,
        charges: &[OwnedCharge],
        decisions: &Decisions,
        hold: Option<Duration>,
        now: u64,
    ) {
        if decisions.is_allowed() {
            self.forget(charges.iter().map(|(p, k, _)| (*p, k)));
            return;
        }
        if decisions.is_cannot_fit() || has_duplicates(charges) {
            return;
        }
        let Some(first_change) = decisions
            .as_slice()
            .iter()
            .filter_map(Decision::retry_after)
            .chain(hold)
            .min()
        else {
            return;
        };
        if first_change.is_zero() {
            return;
        }
        let until = now.saturating_add(nanos(first_change));
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

    /// Forgets the pairs of `charges` (after a charge, a reservation or a refund changed
    /// their state).
    pub(super) fn forget<'a>(&self, pairs: impl IntoIterator<Item = (PolicyId, &'a Key)>) {
        if self.map.is_empty() {
            return;
        }
        for (policy, key) in pairs {
            self.map.remove(&(policy, key.clone()));
        }
    }
}

/// Whether two charges name the same policy and key (a duplicate charge: its rows would
/// share one entry).
fn has_duplicates(charges: &[OwnedCharge]) -> bool {
    charges.iter().enumerate().any(|(i, (p, k, _))| {
        charges[..i]
            .iter()
            .any(|(q, other, _)| q == p && other == k)
    })
}
