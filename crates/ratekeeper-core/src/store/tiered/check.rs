//! A check on the tiered store: spent from the key's lease without I/O, a background
//! renewal when it runs low, a blocking renewal when it is short, and the Redis store's own
//! check for cold keys, several policies at once, free probes and policies with a ban.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::TieredStore;
use super::inner::{Inner, give_back, start_sweeper};
use super::lease::{Lease, TierPolicy};
use crate::store::redis::{RedisCheck, RedisStore};
use crate::store::{Charge, Checked, Decisions, PolicyId, Store, StoreError};
use crate::{Decision, Key};

impl TieredStore {
    /// [`Store::check`] of the tiered store (see the module docs, "How it decides").
    pub(super) fn check_leased(&self, charges: &[Charge<'_, Key>]) -> Checked<RedisCheck> {
        let inner = &self.inner;
        inner.decisions.fetch_add(1, Ordering::Relaxed);
        let [charge] = charges else {
            return self.delegate(charges);
        };
        let tier = match self.policies.get(charge.policy.index()) {
            Some(&tier) => Some(tier),
            // Registered through another handle since this one was made.
            None => self.inner.tier(charge.policy),
        };
        let (Some(tier), true) = (tier, charge.cost > 0) else {
            return self.delegate(charges);
        };
        if tier.ban {
            // Refusals count and bans hold in Redis, for the whole fleet (see "Bans").
            return self.delegate(charges);
        }
        let now = inner.clock.now();
        start_sweeper(inner, &self.redis);
        let lease = inner.lease_of(charge.policy, charge.key, now);
        let cost = charge.cost;
        let (target, returns) = {
            let mut s = lease.lock();
            s.observe(now, cost, inner.period);
            let target = s.target(inner.max_lease);
            if let Some((decision, receipt)) = s.spend(now, cost, tier) {
                inner.local.fetch_add(1, Ordering::Relaxed);
                let low = s.held(now).saturating_mul(4) <= target
                    && !s.prefetching
                    && now >= s.prefetch_after;
                if low {
                    s.prefetching = true;
                }
                drop(s);
                if low {
                    self.prefetch(charge.policy, charge.key, &lease, target);
                }
                return Checked::Ready(Ok(Decisions::one_with_receipt(decision, receipt)));
            }
            if let Some(decision) = s.denied(now, cost) {
                inner.local.fetch_add(1, Ordering::Relaxed);
                return Checked::Ready(Ok(Decisions::one(decision)));
            }
            (target, s.expire(now))
        };
        if let Some(unused) = returns {
            give_back(
                &self.redis,
                inner,
                vec![(charge.policy, charge.key.clone(), unused)],
            );
        }
        if target <= cost {
            // A cold key: exactly the Redis store's decision.
            return self.delegate_cold(charge);
        }
        let fixed_window = self.is_fixed_window(charge.policy);
        Checked::Pending(Box::pin(renew(
            Arc::clone(&self.redis),
            Arc::clone(&self.inner),
            lease,
            (charge.policy, tier, fixed_window),
            charge.key.clone(),
            cost,
            target,
        )))
    }

    /// Starts one background renewal of `lease` (topping it up to `target`), unless one is
    /// running or there is no runtime.
    fn prefetch(&self, policy: PolicyId, key: &Key, lease: &Arc<Lease>, target: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let redis = Arc::clone(&self.redis);
        let inner = Arc::clone(&self.inner);
        let lease = Arc::clone(lease);
        let key = key.clone();
        let fixed_window = self.is_fixed_window(policy);
        let epoch = inner.epoch.load(Ordering::Acquire);
        runtime.spawn(async move {
            let guard = lease.renew.lock().await;
            let now = inner.clock.now();
            let held = lease.lock().held(now);
            if held.saturating_mul(4) <= target && inner.epoch.load(Ordering::Acquire) == epoch {
                inner.prefetches.fetch_add(1, Ordering::Relaxed);
                let want = target.saturating_sub(held).max(1);
                // No request waits for this one: it needs nothing, so near the limit it
                // takes nothing (see "Lease ahead" in the module docs).
                let sent = inner.clock.now();
                let back_within = inner.back_within();
                if let Ok(grant) = redis.lease(policy, &key, 0, want, back_within).await {
                    let now = inner.clock.now();
                    let mut s = lease.lock();
                    if grant.granted > 0 {
                        let expired = inner.add_grant(
                            &mut s,
                            (policy, &key),
                            (sent, now),
                            fixed_window,
                            &grant,
                        );
                        drop(s);
                        if let Some(unused) = expired {
                            give_back(&redis, &inner, vec![(policy, key, unused)]);
                        }
                    } else {
                        // Nothing to take ahead: no other background renewal for a period.
                        // (A denial here was computed for no units, so it is not remembered
                        // for the next request, which asks Redis itself.)
                        s.prefetch_after = now.saturating_add(inner.period);
                    }
                }
            }
            lease.lock().prefetching = false;
            drop(guard);
        });
    }

    fn is_fixed_window(&self, policy: PolicyId) -> bool {
        match self.policies.get(policy.index()) {
            Some(p) => p.fixed_window,
            None => self.inner.tier(policy).is_some_and(|p| p.fixed_window),
        }
    }

    fn delegate(&self, charges: &[Charge<'_, Key>]) -> Checked<RedisCheck> {
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        self.redis.check(charges)
    }

    /// A cold key's check, by the Redis store. A denial is not kept in the Redis store's
    /// negative cache: it counted units other instances may give back within the lease TTL,
    /// so it must not be remembered until its `retry_after` (a cold key asks at most about
    /// once per lease period, so it costs little). A denial whose `retry_after` is longer
    /// than a lease reads the key's lease record (one more round trip, writing nothing) and
    /// is bounded by it, as a denial of the lease script is.
    fn delegate_cold(&self, charge: &Charge<'_, Key>) -> Checked<RedisCheck> {
        let bound = self.inner.back_within();
        let cold = (charge.policy, charge.key.clone(), charge.cost);
        let redis = Arc::clone(&self.redis);
        match self.delegate(std::slice::from_ref(charge)) {
            Checked::Ready(Ok(decisions)) if !decisions.is_allowed() => {
                self.redis.forget_denial(charge.policy, charge.key);
                if retry_of(&decisions).is_some_and(|retry| retry > bound) {
                    Checked::Pending(Box::pin(bound_cold(redis, cold, bound, decisions)))
                } else {
                    Checked::Ready(Ok(decisions))
                }
            }
            Checked::Ready(result) => Checked::Ready(result),
            Checked::Pending(future) => Checked::Pending(Box::pin(async move {
                let decisions = future.await?;
                if decisions.is_allowed() {
                    return Ok(decisions);
                }
                redis.forget_denial(cold.0, &cold.1);
                if retry_of(&decisions).is_some_and(|retry| retry > bound) {
                    bound_cold(redis, cold, bound, decisions).await
                } else {
                    Ok(decisions)
                }
            })),
        }
    }
}

/// The `retry_after` of a one-charge denial.
fn retry_of(decisions: &Decisions) -> Option<Duration> {
    decisions.as_slice().first().and_then(Decision::retry_after)
}

/// A cold key's denial (`retry_after` longer than `bound`, a lease's TTL and period)
/// bounded by the key's lease record, read in one more round trip that writes nothing. If
/// the read fails, the denial stands as Redis decided it.
async fn bound_cold(
    redis: Arc<RedisStore>,
    (policy, key, cost): (PolicyId, Key, u64),
    bound: Duration,
    decisions: Decisions,
) -> Result<Decisions, StoreError> {
    let Some(&denial) = decisions.as_slice().first() else {
        return Ok(decisions);
    };
    match redis.lease(policy, &key, 0, 0, bound).await {
        Ok(read) => Ok(Decisions::one(redis.bound_by_leases(
            policy,
            denial,
            cost,
            read.leased,
        ))),
        Err(_) => Ok(decisions),
    }
}

/// The blocking renewal: waits for the renewal in flight, spends from it, or leases itself.
async fn renew(
    redis: Arc<RedisStore>,
    inner: Arc<Inner>,
    lease: Arc<Lease>,
    policy: (PolicyId, TierPolicy, bool),
    key: Key,
    cost: u64,
    target: u64,
) -> Result<Decisions, StoreError> {
    let (id, tier, fixed_window) = policy;
    let _guard = lease.renew.lock().await;
    let (need, want, returns) = {
        let now = inner.clock.now();
        let mut s = lease.lock();
        if let Some((decision, receipt)) = s.spend(now, cost, tier) {
            inner.local.fetch_add(1, Ordering::Relaxed);
            return Ok(Decisions::one_with_receipt(decision, receipt));
        }
        if let Some(decision) = s.denied(now, cost) {
            inner.local.fetch_add(1, Ordering::Relaxed);
            return Ok(Decisions::one(decision));
        }
        let returns = s.expire(now);
        let held = s.held(now);
        let need = cost - held.min(cost);
        (need, target.saturating_sub(held).max(need), returns)
    };
    if let Some(unused) = returns {
        give_back(&redis, &inner, vec![(id, key.clone(), unused)]);
    }
    inner.round_trips.fetch_add(1, Ordering::Relaxed);
    let sent = inner.clock.now();
    let grant = match redis.lease(id, &key, need, want, inner.back_within()).await {
        Ok(grant) => grant,
        Err(err) if err.is_config() => return Err(err),
        Err(err) => return redis.fail_over(&[(id, key, cost)], err),
    };
    let now = inner.clock.now();
    let mut s = lease.lock();
    if grant.decision.is_allowed() {
        let expired = inner.add_grant(&mut s, (id, &key), (sent, now), fixed_window, &grant);
        let spent = s.spend(now, cost, tier);
        drop(s);
        if let Some(unused) = expired {
            // The lease expired while this grant was on its way.
            give_back(&redis, &inner, vec![(id, key, unused)]);
        }
        return Ok(match spent {
            Some((decision, receipt)) => Decisions::one_with_receipt(decision, receipt),
            // The grant expired at once (a window that ended as it was granted): Redis
            // counted the request in that window, so it is allowed.
            None => Decisions::one(grant.decision),
        });
    }
    s.remember_denial(now, cost, grant.decision, inner.denial_bound());
    Ok(Decisions::one(grant.decision))
}
