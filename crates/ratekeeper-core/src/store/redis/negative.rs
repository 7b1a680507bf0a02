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
//! entry).
//!
//! **Resets** (which also lift bans) made through any instance are published on the
//! store's invalidation channel and forget the entries of their key here at once (see
//! `invalidate.rs`); an answer to a check sent before such an invalidation is not
//! remembered. While the channel is down every entry lasts at most 1 s from when Redis
//! gave it (`UNSUBSCRIBED_HOLD`), and the whole cache is dropped when it is subscribed
//! again.
//!
//! **An allowed charge that took the last units** is remembered as the denial it implies
//! for the same request (same policy, key and cost, one charge): GCRA and the leaky bucket
//! when `reset_after + cost * T - tau > 0` (the TAT the charge left is `now + reset_after`,
//! so the same request passes only `reset_after + cost * T - tau` later), the fixed window
//! when `remaining < cost` (until the window ends). Both are the answers Redis would give,
//! under the same bound.
//!
//! **Bans.** A request charging a policy with a [`Ban`](crate::Ban) is remembered only when
//! Redis answered with a ban ([`Decision::is_banned`]): until the ban's end (its row's hold is
//! unbounded), its `retry_after` counting down, `remaining` 0, and never again as the start
//! of the ban. Its other denials are not remembered: each refusal must reach Redis to be
//! counted toward a ban.
//!
//! **One probe per key.** When a remembered denial runs out, the first request to see it
//! goes to Redis (the probe) and the others of the same key on this instance wait for its
//! answer, at most the store's deadline: a denial it brings back answers them too, an
//! allowed answer sends them on to Redis. A flood of one key therefore costs each instance
//! at most one round trip at a time, however many requests wait; a probe whose caller went
//! away is taken over after the deadline. Times are ns on the store's decision clock, and only differences of them are used,
//! so the cache never compares the app's clock with Redis's.

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use tokio::sync::watch;

use super::invalidate::UNSUBSCRIBED_HOLD;
use super::policy::{ALGO_FIXED_WINDOW, ALGO_GCRA, RedisPolicy};
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
    /// Clock ns when a probe for this expired entry went to Redis (0: none).
    probe_at: u64,
    /// Dropped (so its receivers wake) when the entry is replaced or removed; a failed
    /// probe sends on it.
    turn: watch::Sender<()>,
}

/// What the cache says about a request.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The remembered answer.
    Hit(Decisions),
    /// Nothing remembered (or not for this request): ask Redis.
    Miss,
    /// The remembered denial ran out and this request is its probe: ask Redis.
    Probe,
    /// Another request is probing: wait for its answer (until the receiver changes or
    /// closes), at most the deadline, then look again.
    Wait(watch::Receiver<()>),
}

/// Denials by (policy, client key).
#[derive(Debug)]
pub(super) struct NegativeCache {
    /// Whether the store hears of resets by other instances (its invalidation channel is
    /// subscribed); while not, an entry lasts at most [`UNSUBSCRIBED_HOLD`].
    live: Arc<AtomicBool>,
    /// Bumped by each invalidation: an answer to a check sent before one is not
    /// remembered.
    epoch: Arc<AtomicU64>,
    map: DashMap<(PolicyId, Key), Entry, foldhash::fast::RandomState>,
    /// The number of entries, kept beside the map so the usual case (nothing remembered)
    /// is one load instead of a read lock on every shard. Raised after an entry is added
    /// and lowered after one is removed (wrapping, so a removal counted before its own
    /// addition only makes the cache look non-empty for a moment).
    len: AtomicUsize,
    /// After this many ns a probe is taken over (its caller gave up on it).
    probe_for: u64,
}

impl NegativeCache {
    /// An empty cache whose probes are taken over after `probe_for` (the deadline), reading
    /// the invalidation channel's `live` flag and `epoch`.
    pub(super) fn new(probe_for: Duration, live: Arc<AtomicBool>, epoch: Arc<AtomicU64>) -> Self {
        Self {
            live,
            epoch,
            map: DashMap::default(),
            len: AtomicUsize::new(0),
            probe_for: nanos(probe_for),
        }
    }

    /// The cached answer to `charges` at `now` (ns), if every charge has a live entry with
    /// the same cost and at least one of them is a denial; else whether to probe or wait
    /// (see the module docs).
    pub(super) fn lookup(
        &self,
        charges: &[OwnedCharge],
        policies: &[RedisPolicy],
        now: u64,
    ) -> Lookup {
        if self.is_empty() || charges.is_empty() || has_duplicates(charges) {
            return Lookup::Miss;
        }
        let mut out = Vec::with_capacity(charges.len());
        let mut any_denied = false;
        for (policy, key, cost) in charges {
            let Some(entry) = self.map.get(&(*policy, key.clone())) else {
                return Lookup::Miss;
            };
            if entry.cost != *cost {
                return Lookup::Miss;
            }
            if now >= self.until(&entry) {
                drop(entry);
                return self.gate(charges, now);
            }
            let elapsed = Duration::from_nanos(now.saturating_sub(entry.at));
            let d = entry.decision;
            if d.is_banned() {
                // A ban in force: its end comes nearer, nothing else changes (and its start
                // was reported once, by the answer remembered).
                any_denied = true;
                let left = d.retry_after().unwrap_or_default().saturating_sub(elapsed);
                out.push(Decision::banned(d.limit(), left));
                continue;
            }
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
        if any_denied {
            Lookup::Hit(Decisions::new(out))
        } else {
            Lookup::Miss
        }
    }

    /// When `entry` runs out: its `until`, or at most [`UNSUBSCRIBED_HOLD`] after it was
    /// written while the invalidation channel is down.
    fn until(&self, entry: &Entry) -> u64 {
        if self.live.load(Ordering::Acquire) {
            entry.until
        } else {
            entry
                .until
                .min(entry.at.saturating_add(nanos(UNSUBSCRIBED_HOLD)))
        }
    }

    /// The invalidation epoch now: pass it to [`NegativeCache::update`] for a check sent
    /// now.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Forgets every entry (the invalidation channel was subscribed again).
    pub(super) fn clear(&self) {
        self.forget_where(|_, _| true);
    }

    /// Forgets the entries `covers` names (an invalidation).
    pub(super) fn forget_where(&self, covers: impl Fn(PolicyId, &Key) -> bool) {
        if self.is_empty() {
            return;
        }
        let mut removed = 0;
        self.map.retain(|(policy, key), _| {
            let gone = covers(*policy, key);
            removed += usize::from(gone);
            !gone
        });
        self.len.fetch_sub(removed, Ordering::AcqRel);
    }

    /// An expired entry for the first charge: this request probes, unless another probe is
    /// under way (then it waits for that one).
    fn gate(&self, charges: &[OwnedCharge], now: u64) -> Lookup {
        let Some((policy, key, _)) = charges.first() else {
            return Lookup::Miss;
        };
        let Some(mut entry) = self.map.get_mut(&(*policy, key.clone())) else {
            return Lookup::Miss;
        };
        if entry.probe_at != 0 && now.saturating_sub(entry.probe_at) < self.probe_for {
            return Lookup::Wait(entry.turn.subscribe());
        }
        entry.probe_at = now.max(1);
        Lookup::Probe
    }

    /// After a probe failed (the failure policy answered): the next request probes again,
    /// and the requests waiting for this one look again.
    pub(super) fn release(&self, charges: &[OwnedCharge]) {
        let Some((policy, key, _)) = charges.first() else {
            return;
        };
        if let Some(mut entry) = self.map.get_mut(&(*policy, key.clone())) {
            entry.probe_at = 0;
            entry.turn.send_replace(());
        }
    }

    /// After a Redis decision at `now` (ns) on a check sent at invalidation epoch `sent`
    /// ([`NegativeCache::epoch`]): an allowed request changed the state of its pairs, so
    /// their entries go (a lone charge that took the last units is remembered as the denial
    /// it implies, see the module docs); a denial is remembered until the first of its rows'
    /// `retry_after` and `hold` (the shortest hold of its rows, `None`: unbounded), unless
    /// an invalidation came in since the check was sent (its answer may predate a reset).
    pub(super) fn update(
        &self,
        charges: &[OwnedCharge],
        decisions: &Decisions,
        hold: Option<Duration>,
        policies: &[RedisPolicy],
        (sent, now): (u64, u64),
    ) {
        // Whatever the answer, it replaces what was remembered (and ends a probe).
        self.forget(charges.iter().map(|(p, k, _)| (*p, k)));
        if self.epoch() != sent {
            return;
        }
        // A policy with a ban counts its refusals in Redis: a request charging one is
        // remembered only when the answer is a ban (whose end nothing but a reset moves).
        let banning = charges
            .iter()
            .any(|(p, ..)| policies.get(p.index()).is_some_and(|rp| rp.ban.is_some()));
        if banning && !decisions.as_slice().iter().any(Decision::is_banned) {
            return;
        }
        if decisions.is_allowed() {
            if let ([charge], [decision]) = (charges, decisions.as_slice()) {
                if let Some(denial) = implied_denial(charge, decision, policies) {
                    let until = now.saturating_add(nanos(denial.retry_after().unwrap_or_default()));
                    self.insert(charges, std::slice::from_ref(&denial), until, now);
                }
            }
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
        self.insert(charges, decisions.as_slice(), until, now);
    }

    fn insert(&self, charges: &[OwnedCharge], decisions: &[Decision], until: u64, now: u64) {
        if until <= now {
            return;
        }
        if self.len.load(Ordering::Acquire) >= SWEEP_AT {
            let mut swept = 0;
            self.map.retain(|_, e| {
                let keep = e.until > now;
                swept += usize::from(!keep);
                keep
            });
            if self.map.len() >= SWEEP_AT {
                self.map.retain(|_, _| {
                    swept += 1;
                    false
                });
            }
            self.len.fetch_sub(swept, Ordering::AcqRel);
        }
        for ((policy, key, cost), decision) in charges.iter().zip(decisions) {
            let previous = self.map.insert(
                (*policy, key.clone()),
                Entry {
                    cost: *cost,
                    at: now,
                    until,
                    decision: *decision,
                    probe_at: 0,
                    turn: watch::Sender::new(()),
                },
            );
            if previous.is_none() {
                self.len.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Forgets the pairs of `charges` (after a charge, a reservation or a refund changed
    /// their state).
    pub(super) fn forget<'a>(&self, pairs: impl IntoIterator<Item = (PolicyId, &'a Key)>) {
        if self.is_empty() {
            return;
        }
        for (policy, key) in pairs {
            if self.map.remove(&(policy, key.clone())).is_some() {
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Whether nothing is remembered (see `len`).
    fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }
}

/// The denial an allowed lone charge implies for the same request right after it (see the
/// module docs), or `None` when the same request would pass again.
fn implied_denial(
    (policy, _, cost): &OwnedCharge,
    decision: &Decision,
    policies: &[RedisPolicy],
) -> Option<Decision> {
    if *cost == 0 {
        // A cost of 0 always passes.
        return None;
    }
    let p = policies.get(policy.index())?;
    let reset = decision.reset_after();
    let retry = match p.algo {
        ALGO_GCRA => {
            // The TAT is now + reset_after; the same request passes when
            // TAT + cost * T - tau <= then.
            let t = Duration::from_micros(p.params[0]);
            let tau = Duration::from_micros(p.params[1]);
            let turn = t.checked_mul(u32::try_from(*cost).ok()?)?;
            reset.checked_add(turn)?.checked_sub(tau)?
        }
        ALGO_FIXED_WINDOW if u64::from(decision.remaining()) < *cost => reset,
        _ => return None,
    };
    (!retry.is_zero()).then(|| {
        Decision::new(
            Outcome::Denied { retry_after: retry },
            decision.limit(),
            decision.remaining(),
            reset,
        )
    })
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

#[cfg(test)]
mod tests;
