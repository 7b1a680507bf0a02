//! Checks and reservations: the charges of a request grouped by client key, the negative
//! cache, the circuit breaker and the failure policy around one script call per group.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::group::{Group, Groups};
use super::negative::Lookup;
use super::policy;
use super::{Owned, OwnedCharge, RedisCheck, RedisStore};
use crate::Key;
use crate::store::{Checked, Decisions, PolicyId, Receipt, StoreError};

impl RedisStore {
    /// Checks owned charges all-or-nothing (the async form of
    /// [`Store::check`](crate::store::Store::check)).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy; [`StoreError::Failed`] when
    /// Redis could not decide and the failure policy is not
    /// [`FailurePolicy::Local`](crate::store::FailurePolicy::Local).
    pub async fn check_async(&self, charges: &[OwnedCharge]) -> Result<Decisions, StoreError> {
        match self.check_owned(charges.iter().cloned().collect()) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }

    /// Groups charges by client key (one hash tag, one atomic script call each), keeping
    /// each charge's index in the request. Equal keys are exactly the keys with one hash tag
    /// (the tag encoding is injective), so keys are compared, not their names.
    pub(super) fn groups<'k>(
        &self,
        charges: impl Iterator<Item = (PolicyId, &'k Key, u64, Receipt)>,
    ) -> Result<Groups, StoreError> {
        let mut groups = Groups::new();
        // The client key of each group, in the groups' order.
        let mut group_keys: SmallVec<[&Key; 1]> = SmallVec::new();
        for (slot, (policy, key, cost, receipt)) in charges.enumerate() {
            let Some(p) = self.policies.get(policy.index()) else {
                return Err(StoreError::UnknownPolicy(policy));
            };
            let g = match group_keys.iter().position(|k| *k == key) {
                Some(g) => g,
                None => {
                    group_keys.push(key);
                    groups.push(Group::default());
                    groups.len() - 1
                }
            };
            if let Some(group) = groups.get_mut(g) {
                group.push(&self.shared.prefix, key, p, cost, receipt, slot);
            }
        }
        Ok(groups)
    }

    /// Reserves owned charges for a request that may wait up to `max_wait` (the async form
    /// of [`Store::reserve`](crate::store::Store::reserve); see the module docs, "Reservations").
    ///
    /// # Errors
    ///
    /// As [`RedisStore::check_async`].
    pub async fn reserve_async(
        &self,
        charges: &[OwnedCharge],
        max_wait: Duration,
    ) -> Result<Decisions, StoreError> {
        match self.reserve_owned(charges.iter().cloned().collect(), max_wait) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }

    /// [`RedisStore::reserve_async`] on charges the future owns (what `Store::reserve`
    /// runs).
    pub(super) fn reserve_owned(&self, charges: Owned, max_wait: Duration) -> Checked<RedisCheck> {
        // Each key's stamp says how its policy reserves (`RESERVE_*`, see `protocol.rs`):
        // `RESERVE_NONE` is the stamp of no receipt.
        let kinds = charges.iter().map(|(p, k, c)| {
            let kind = self
                .policies
                .get(p.index())
                .map_or(policy::RESERVE_NONE, |rp| rp.reserve);
            let stamp = u64::try_from(kind).map_or(Receipt::NONE, Receipt::new);
            (*p, k, *c, stamp)
        });
        let groups = match self.groups(kinds) {
            Ok(groups) => groups,
            Err(err) => return Checked::Ready(Err(err)),
        };
        let shared = &self.shared;
        if !shared.breaker.admit(shared.app.now()) {
            let err = StoreError::Unavailable(Box::new(BreakerOpen));
            return Checked::Ready(self.failover.apply(&charges, err, &shared.degraded));
        }
        let shared = Arc::clone(&self.shared);
        let failover = self.failover.clone();
        Checked::Pending(Box::pin(async move {
            let run = shared.reserve(&groups, charges.len(), max_wait);
            match shared.timed(run, failover.policy.as_str()).await {
                Ok(decisions) => {
                    // A reservation that books a turn changed its keys' state: a denial
                    // remembered for them could now be too short (or wrong).
                    if decisions.is_allowed() {
                        if let Some(cache) = &shared.negative {
                            cache.forget(charges.iter().map(|(p, k, _)| (*p, k)));
                        }
                    }
                    Ok(decisions)
                }
                Err(err) => failover.apply(&charges, err, &shared.degraded),
            }
        }))
    }

    /// [`RedisStore::check_async`] on charges the future owns (what `Store::check` runs):
    /// the negative cache first, then the breaker, then one script call per client key.
    pub(super) fn check_owned(&self, charges: Owned) -> Checked<RedisCheck> {
        let shared = &self.shared;
        let groups = match self.groups(charges.iter().map(|(p, k, c)| (*p, k, *c, Receipt::NONE))) {
            Ok(groups) => groups,
            Err(err) => return Checked::Ready(Err(err)),
        };
        let mut wait = None;
        let mut probe = false;
        if let Some(cache) = &shared.negative {
            match cache.lookup(&charges, &self.policies, shared.clock.now()) {
                Lookup::Hit(decisions) => return Checked::Ready(Ok(shared.hit(decisions))),
                Lookup::Wait(turn) => wait = Some(turn),
                Lookup::Probe => probe = true,
                Lookup::Miss => {}
            }
        }
        if wait.is_none() && !shared.breaker.admit(shared.app.now()) {
            if probe {
                if let Some(cache) = &shared.negative {
                    cache.release(&charges);
                }
            }
            let err = StoreError::Unavailable(Box::new(BreakerOpen));
            return Checked::Ready(self.failover.apply(&charges, err, &shared.degraded));
        }
        let shared = Arc::clone(&self.shared);
        let failover = self.failover.clone();
        let policies = Arc::clone(&self.policies);
        Checked::Pending(Box::pin(async move {
            let mut left = shared.deadline;
            if let Some(turn) = wait {
                // Another request of this key is probing Redis: its answer first (a probe
                // that failed hands over to the next one), then look again. All within the
                // deadline: a request still waiting then is a store that did not answer in
                // time, so the failure policy decides it, without one more call to the
                // Redis that is already late (the probe itself tells the breaker).
                let waited = std::time::Instant::now();
                let mut turn = Some(turn);
                while let Some(mut t) = turn.take() {
                    let left = shared.deadline.saturating_sub(waited.elapsed());
                    if tokio::time::timeout(left, t.changed()).await.is_err() {
                        return failover.apply(&charges, StoreError::Timeout, &shared.degraded);
                    }
                    let Some(cache) = &shared.negative else {
                        break;
                    };
                    match cache.lookup(&charges, &policies, shared.clock.now()) {
                        Lookup::Hit(decisions) => return Ok(shared.hit(decisions)),
                        Lookup::Probe => probe = true,
                        Lookup::Wait(next) => turn = Some(next),
                        Lookup::Miss => {}
                    }
                }
                if !shared.breaker.admit(shared.app.now()) {
                    if let (true, Some(cache)) = (probe, &shared.negative) {
                        cache.release(&charges);
                    }
                    let err = StoreError::Unavailable(Box::new(BreakerOpen));
                    return failover.apply(&charges, err, &shared.degraded);
                }
                left = left.saturating_sub(waited.elapsed());
            }
            let run = shared.run(&groups, charges.len());
            match shared
                .timed_within(run, failover.policy.as_str(), left)
                .await
            {
                Ok((decisions, hold)) => {
                    if let Some(cache) = &shared.negative {
                        cache.update(&charges, &decisions, hold, &policies, shared.clock.now());
                    }
                    Ok(decisions)
                }
                Err(err) => {
                    if let (true, Some(cache)) = (probe, &shared.negative) {
                        cache.release(&charges);
                    }
                    failover.apply(&charges, err, &shared.degraded)
                }
            }
        }))
    }
}

/// The error of a decision the open circuit breaker skipped.
#[derive(Debug, thiserror::Error)]
#[error("circuit breaker open: Redis is skipped until the next probe")]
pub(super) struct BreakerOpen;
