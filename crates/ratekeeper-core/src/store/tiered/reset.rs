//! Peeks and resets through the tiered store: the Redis store's, plus what this instance
//! holds in its leases.

use std::sync::Arc;

use super::TieredStore;
use super::lease::{Lease, TierPolicy};
use crate::store::redis::{RedisCheck, RedisStore};
use crate::store::{Checked, Decisions, PolicyId, Store, StoreError};
use crate::{Decision, Key};

impl TieredStore {
    /// `key`'s state under `policy`, charging nothing (the async form of
    /// [`Store::peek`]): the Redis store's peek ([`RedisStore::peek_async`]), with the units
    /// this instance holds for the key added to `remaining` (capped at the policy's
    /// capacity), as this instance's own decisions report them.
    ///
    /// What it reports: units leased and still unspent **on this instance** are counted as
    /// available (this instance admits them without asking Redis); units leased and unspent
    /// on **other** instances are counted as used, since Redis charged them when they were
    /// leased, until they come back (within the lease TTL and one lease period). The units
    /// this instance holds alone are [`TieredStore::held`].
    ///
    /// # Errors
    ///
    /// As [`RedisStore::peek_async`].
    pub async fn peek_async(&self, policy: PolicyId, key: &Key) -> Result<Decision, StoreError> {
        let decisions = match Store::peek(self, policy, key) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }?;
        decisions
            .as_slice()
            .first()
            .copied()
            .ok_or(StoreError::UnknownPolicy(policy))
    }

    /// Forgets `key` under `policy`, or under every registered policy (`None`), and answers
    /// the state afterwards (the async form of [`Store::reset`]).
    ///
    /// The lease this instance holds for the key is dropped first, without giving its units
    /// back (the reset forgets them in Redis), so the instance never spends units leased
    /// before the reset; its remembered denial goes too. A renewal in flight is waited for
    /// and its grant dropped with the rest, and no renewal of the key starts until the reset
    /// has reached Redis ([`RedisStore::reset_async`]: one atomic call for every policy, which
    /// fences the receipts of earlier grants and charges, so no instance's later return of
    /// a lease taken before the reset gives anything back). Receipts of units spent from the
    /// dropped lease give back nothing. Other instances hear of the reset at once through
    /// the Redis store's invalidation channel ([`RedisStore::reset_async`]) and drop their
    /// leases of the key the same way (units and remembered denial), so their next request
    /// asks Redis. A renewal of theirs already in flight may still bring in units leased
    /// before the reset (at most one lease each, within the over-admission bound of the
    /// tiered store). An instance whose channel is down keeps its lease until it expires
    /// (the lease TTL) and a remembered denial until it runs out (at most the lease TTL plus
    /// one lease period).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy (nothing is reset); the
    /// Redis store's error otherwise (the local leases are dropped all the same).
    pub async fn reset_async(
        &self,
        policy: Option<PolicyId>,
        key: &Key,
    ) -> Result<Decisions, StoreError> {
        match Store::reset(self, policy, key) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }

    pub(super) fn peek_owned(&self, policy: PolicyId, key: &Key) -> Checked<RedisCheck> {
        let redis_peek = self.redis.peek(policy, key);
        let Some(&tier) = self.policies.get(policy.index()) else {
            return redis_peek;
        };
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        Checked::Pending(Box::pin(async move {
            let decisions = match redis_peek {
                Checked::Ready(result) => result,
                Checked::Pending(future) => future.await,
            }?;
            let held = inner
                .leases
                .get(&(policy, key))
                .map_or(0, |lease| lease.lock().held(inner.clock.now()));
            Ok(Decisions::new(
                decisions
                    .as_slice()
                    .iter()
                    .map(|d| with_held(*d, held, tier)),
            ))
        }))
    }

    pub(super) fn reset_owned(&self, policy: Option<PolicyId>, key: &Key) -> Checked<RedisCheck> {
        let ids: Vec<PolicyId> = match policy {
            Some(id) if id.index() < self.policies.len() => vec![id],
            Some(id) => return Checked::Ready(Err(StoreError::UnknownPolicy(id))),
            None => (0..self.policies.len())
                .filter_map(|i| u32::try_from(i).ok())
                .map(PolicyId::from_index)
                .collect(),
        };
        let leases: Vec<Arc<Lease>> = ids
            .iter()
            .filter_map(|id| {
                let lease = self.inner.leases.get(&(*id, key.clone()))?;
                Some(Arc::clone(&lease))
            })
            .collect();
        let redis = Arc::clone(&self.redis);
        let key = key.clone();
        Checked::Pending(Box::pin(async move {
            drop_leases(&redis, &leases, policy, &key).await
        }))
    }
}

/// Drops `leases` (behind their renewal locks, so no renewal adds a grant from before the
/// reset), resets the key in Redis, then lets renewals go on.
async fn drop_leases(
    redis: &RedisStore,
    leases: &[Arc<Lease>],
    policy: Option<PolicyId>,
    key: &Key,
) -> Result<Decisions, StoreError> {
    let mut guards = Vec::with_capacity(leases.len());
    for lease in leases {
        guards.push(lease.renew.lock().await);
        let mut s = lease.lock();
        // Forgotten by the reset in Redis: not given back, never spent.
        let _ = s.take();
        s.forget_denial();
    }
    let result = match Store::reset(redis, policy, key) {
        Checked::Ready(result) => result,
        Checked::Pending(future) => future.await,
    };
    drop(guards);
    result
}

/// A Redis peek with `held` units of this instance's lease added to `remaining`.
fn with_held(d: Decision, held: u64, tier: TierPolicy) -> Decision {
    let remaining = u64::from(d.remaining())
        .saturating_add(held)
        .min(u64::from(tier.capacity));
    Decision::new(
        d.outcome(),
        d.limit(),
        u32::try_from(remaining).unwrap_or(u32::MAX),
        d.reset_after(),
    )
}
