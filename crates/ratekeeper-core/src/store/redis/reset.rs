//! Peeks and resets of one client key: the `peek` and `reset` modes of `limiter.lua`, one
//! atomic call for every policy of the key, outside the failure policy and the breaker.

use std::sync::Arc;

use super::group::Group;
use super::invalidate::{Invalidated, digest};
use super::reply::BadReply;
use super::script::{Mode, unavailable};
use super::shared::{Shared, collect};
use super::{RedisCheck, RedisStore};
use crate::store::{Checked, Decisions, PolicyId, Receipt, StoreError};
use crate::{Decision, Key};

impl RedisStore {
    /// `key`'s state under `policy` in Redis, charging nothing (the async form of
    /// [`Store::peek`](crate::store::Store::peek)): the decision of a free probe, with the
    /// state's `limit`, `remaining` and `reset_after` and an allowed outcome, or the ban
    /// while one of the key under the policy is in force ([`Decision::banned`]: refused,
    /// `retry_after` and `reset_after` the time until it ends). One script call (the
    /// `inspect` mode, which writes nothing), within the store's deadline.
    ///
    /// A peek reads the shared state or fails: the failure policy does not answer it, the
    /// negative cache is not consulted, and its outcome does not move the circuit breaker.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy; [`StoreError::Timeout`] or
    /// [`StoreError::Unavailable`] when Redis does not answer in time or fails.
    pub async fn peek_async(&self, policy: PolicyId, key: &Key) -> Result<Decision, StoreError> {
        let decisions = match self.peek_owned(policy, key) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }?;
        decisions
            .as_slice()
            .first()
            .copied()
            .ok_or_else(|| unavailable(BadReply("missing decision")))
    }

    /// Forgets `key` under `policy`, or under every registered policy (`None`), in one
    /// atomic script call, and answers the state afterwards as [`RedisStore::peek_async`]
    /// reports it (one decision per policy reset, in registration order for `None`). The
    /// async form of [`Store::reset`](crate::store::Store::reset).
    ///
    /// **Receipts from before the reset give back nothing after it.** The reset writes a
    /// fence beside each state (`<state key>#reset`, same hash tag, so the same Cluster
    /// slot): the largest receipt stamp a charge before the reset can hold (GCRA and the
    /// leaky bucket: the larger of the stored TAT and `now + tau`; the windows: the current
    /// window; the sliding log: the newest entry's time or now). A refund whose stamp is at or
    /// below the fence gives back nothing, whichever instance sends it (a late response-based
    /// refund, the tiered store returning the unused units of a lease taken before). The
    /// fence lives until every such stamp is stale (GCRA: until the fence time; fixed window:
    /// until the window ends; sliding window counter: one window more; sliding log: one
    /// window after the fence). Until then, a charge made after the reset whose stamp is
    /// still at or below the fence (the same window, or GCRA within about one `tau`) gives
    /// back nothing when refunded either: a refund then comes back short, never larger.
    ///
    /// A ban of the key under a reset policy ends, and its count of refusals starts again
    /// (the ban's key is deleted in the same call).
    ///
    /// This store forgets the negative-cache entries of the key, and the
    /// [`FailurePolicy::Local`](crate::store::FailurePolicy::Local) store forgets the key.
    /// **Other instances** on the same Redis and prefix are told at once: after the call the
    /// store publishes the reset on the Redis pub/sub channel `<prefix>:v2:invalidate`
    /// (naming the key only by the SHA-1 of its hash-tag body, and the policy by name), and
    /// each instance, subscribed on a connection of its own, forgets its remembered denials
    /// of the key under those policies (a remembered ban included), and a
    /// [`TieredStore`](crate::store::tiered::TieredStore) drops its lease of them. So the
    /// next request to any instance reaches Redis, one pub/sub hop after the reset. An
    /// instance whose channel is down (its subscription connection failed, or is not made
    /// yet) remembers a denial for at most 1 s meanwhile, and forgets every remembered
    /// denial when it subscribes again, so a lifted ban reaches it within about 1 s plus
    /// the time to resubscribe, never a ban's length. The local fallback store of another
    /// instance keeps its state (it decides only while Redis is unreachable).
    ///
    /// A reset reaches Redis even after the deadline (like a refund): a call that timed out
    /// may still have been applied.
    ///
    /// Concurrency limits shared through Redis are [`RedisSlots`](super::RedisSlots), not
    /// policies of this store: a reset leaves them alone (their leases are released by their
    /// holders or expire by themselves).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] for an unregistered policy (nothing is reset);
    /// [`StoreError::Timeout`] or [`StoreError::Unavailable`] when Redis does not answer in
    /// time or fails.
    pub async fn reset_async(
        &self,
        policy: Option<PolicyId>,
        key: &Key,
    ) -> Result<Decisions, StoreError> {
        match self.reset_owned(policy, key) {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }

    /// The group of `key` under `policies` (one hash tag), with a cost of 0 each.
    fn key_group(&self, policies: &[PolicyId], key: &Key) -> Result<Group, StoreError> {
        let mut groups = self.groups(policies.iter().map(|p| (*p, key, 0, Receipt::NONE)))?;
        groups
            .pop()
            .ok_or_else(|| unavailable(BadReply("no policy to call")))
    }

    pub(super) fn peek_owned(&self, policy: PolicyId, key: &Key) -> Checked<RedisCheck> {
        if let Some(fresh) = self.refreshed() {
            return fresh.peek_owned(policy, key);
        }
        let group = match self.key_group(&[policy], key) {
            Ok(group) => group,
            Err(err) => return Checked::Ready(Err(err)),
        };
        let shared = Arc::clone(&self.shared);
        Checked::Pending(Box::pin(async move {
            admin_call(&shared, &group, Mode::Inspect).await
        }))
    }

    pub(super) fn reset_owned(&self, policy: Option<PolicyId>, key: &Key) -> Checked<RedisCheck> {
        if let Some(fresh) = self.refreshed() {
            return fresh.reset_owned(policy, key);
        }
        let ids: Vec<PolicyId> = match policy {
            Some(id) => vec![id],
            None => (0..self.policies.len())
                .filter_map(|i| u32::try_from(i).ok())
                .map(PolicyId::from_index)
                .collect(),
        };
        if ids.is_empty() {
            return Checked::Ready(Ok(Decisions::new([])));
        }
        let group = match self.key_group(&ids, key) {
            Ok(group) => group,
            Err(err) => return Checked::Ready(Err(err)),
        };
        self.failover.reset_local(policy, key);
        let shared = Arc::clone(&self.shared);
        let key = key.clone();
        Checked::Pending(Box::pin(async move {
            let result = admin_call(&shared, &group, Mode::Reset).await;
            // After the call: a denial a concurrent check remembered from before the reset
            // would outlive it. Then every other instance is told (even after an error: a
            // call that timed out may have been applied).
            shared.invalidate(&Invalidated::Key {
                digest: digest(&key),
                policies: ids,
            });
            shared.publish_reset(policy, &key).await;
            result
        }))
    }
}

/// One `peek` or `reset` call within the deadline: counted and logged as an error when it
/// fails, but kept out of the breaker (an operator's call says nothing about the request
/// path's health).
async fn admin_call(shared: &Shared, group: &Group, mode: Mode) -> Result<Decisions, StoreError> {
    let call = shared.script.call(group, mode);
    let result = match tokio::time::timeout(shared.deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout),
    };
    match result {
        Ok(rows) => collect(rows.into_iter().map(Some).collect()),
        Err(err) => {
            shared.count_error();
            tracing::debug!(error = %err, ?mode, "redis store peek or reset failed");
            Err(err)
        }
    }
}
