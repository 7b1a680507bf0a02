//! Refunds and corrections: give-backs by receipt and extra charges, one script call per
//! client key (`refund` and `correct` modes), awaited or spawned in the background.

use std::sync::Arc;

use super::group::Groups;
use super::shared::{correct_groups, refund_groups};
use super::{OwnedCharge, RedisStore};
use crate::Key;
use crate::store::{Correction, PolicyId, Receipt, Refund, StoreError};

impl RedisStore {
    /// Gives back `refunds` (charge and receipt each) and waits for Redis: the async form of
    /// [`Store::refund`](crate::store::Store::refund), with the same rules. Refunds with
    /// [`Receipt::NONE`] give back nothing and are not sent.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy, the Redis error of a failed
    /// call (the other groups are still sent), [`StoreError::Timeout`] after the deadline.
    pub async fn refund_async(&self, refunds: &[(OwnedCharge, Receipt)]) -> Result<(), StoreError> {
        if let Some(fresh) = self.refreshed() {
            return fresh.refund_boxed(refunds).await;
        }
        let groups = self.groups(
            refunds
                .iter()
                .filter(|(_, r)| r.is_some())
                .map(|((p, k, c), r)| (*p, k, *c, *r)),
        )?;
        if let Some(cache) = &self.shared.negative {
            cache.forget(refunds.iter().map(|((p, k, _), _)| (*p, k)));
        }
        refund_groups(&self.shared, &groups).await
    }

    /// Corrects charges whose true cost is now known and waits for Redis: the async form of
    /// [`Store::correct`](crate::store::Store::correct), with the same rules. Each correction
    /// is the charge as it was made, the receipt its decision carried and the true cost. One
    /// script call per client key gives back (by the receipt: nothing for
    /// [`Receipt::NONE`]) or charges the extra without refusing; corrections to the
    /// estimate itself are not sent.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy (nothing is sent), the Redis
    /// error of a failed call (the other groups are still sent), [`StoreError::Timeout`]
    /// after the deadline.
    pub async fn correct_async(
        &self,
        corrections: &[(OwnedCharge, Receipt, u64)],
    ) -> Result<(), StoreError> {
        if let Some(fresh) = self.refreshed() {
            return fresh.correct_boxed(corrections).await;
        }
        let groups = self.correction_groups(
            corrections
                .iter()
                .map(|((p, k, c), r, actual)| (*p, k, *c, *r, *actual)),
        )?;
        if let Some(cache) = &self.shared.negative {
            cache.forget(corrections.iter().map(|((p, k, _), _, _)| (*p, k)));
        }
        correct_groups(&self.shared, &groups).await
    }

    /// [`RedisStore::refund_async`] boxed (a handle refreshed from the registry calls it).
    fn refund_boxed<'a>(
        &'a self,
        refunds: &'a [(OwnedCharge, Receipt)],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 'a>>
    {
        Box::pin(self.refund_async(refunds))
    }

    /// [`RedisStore::correct_async`] boxed (a handle refreshed from the registry calls it).
    fn correct_boxed<'a>(
        &'a self,
        corrections: &'a [(OwnedCharge, Receipt, u64)],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 'a>>
    {
        Box::pin(self.correct_async(corrections))
    }

    /// Groups corrections `(policy, key, cost, receipt, actual)` by client key: each one a
    /// give-back of `cost - actual` by its receipt (none without a receipt) or an extra
    /// charge of `actual - cost` (marked with
    /// [`Group::mark_debits`](super::group::Group::mark_debits)).
    fn correction_groups<'k>(
        &self,
        corrections: impl Iterator<Item = (PolicyId, &'k Key, u64, Receipt, u64)>,
    ) -> Result<Groups, StoreError> {
        let settled: Vec<(PolicyId, &Key, u64, Receipt, bool)> = corrections
            .filter_map(|(policy, key, cost, receipt, actual)| {
                if actual > cost {
                    Some((policy, key, actual - cost, receipt, true))
                } else if actual < cost && receipt.is_some() {
                    Some((policy, key, cost - actual, receipt, false))
                } else {
                    None
                }
            })
            .collect();
        let mut groups =
            self.groups(settled.iter().map(|&(p, k, units, r, _)| (p, k, units, r)))?;
        for group in &mut groups {
            group.mark_debits(|slot| settled.get(slot).is_some_and(|s| s.4));
        }
        Ok(groups)
    }

    /// [`Store::refund`](crate::store::Store::refund): the refund spawned on the current
    /// tokio runtime (dropped with a warning outside one).
    pub(super) fn refund_in_background(&self, refunds: &[Refund<'_, Key>]) {
        if let Some(fresh) = self.refreshed() {
            return fresh.refund_in_background(refunds);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("redis store refund outside a tokio runtime; dropped");
            return;
        };
        let groups = match self.groups(
            refunds
                .iter()
                .filter(|r| r.receipt.is_some())
                .map(|r| (r.charge.policy, r.charge.key, r.charge.cost, r.receipt)),
        ) {
            Ok(groups) if groups.is_empty() => return,
            Ok(groups) => groups,
            Err(err) => {
                tracing::warn!(error = %err, "redis store refund of an unknown policy; dropped");
                return;
            }
        };
        if let Some(cache) = &self.shared.negative {
            cache.forget(refunds.iter().map(|r| (r.charge.policy, r.charge.key)));
        }
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move {
            let _ = refund_groups(&shared, &groups).await;
        });
    }

    /// [`Store::correct`](crate::store::Store::correct): the correction spawned on the
    /// current tokio runtime (dropped with a warning outside one).
    pub(super) fn correct_in_background(&self, corrections: &[Correction<'_, Key>]) {
        if let Some(fresh) = self.refreshed() {
            return fresh.correct_in_background(corrections);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("redis store correction outside a tokio runtime; dropped");
            return;
        };
        let groups = match self.correction_groups(corrections.iter().map(|c| {
            let charge = c.charge;
            (charge.policy, charge.key, charge.cost, c.receipt, c.actual)
        })) {
            Ok(groups) if groups.is_empty() => return,
            Ok(groups) => groups,
            Err(err) => {
                tracing::warn!(error = %err, "redis store correction of an unknown policy; dropped");
                return;
            }
        };
        if let Some(cache) = &self.shared.negative {
            cache.forget(corrections.iter().map(|c| (c.charge.policy, c.charge.key)));
        }
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move {
            let _ = correct_groups(&shared, &groups).await;
        });
    }
}
