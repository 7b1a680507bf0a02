//! The failure policy of the Redis store: what a decision becomes when Redis cannot make it
//! (timeout, error, stale call or open breaker).
//!
//! [`FailurePolicy::Local`] is answered here by an in-memory store with the same (or
//! overridden) policies; every other policy is carried to the HTTP layer in
//! [`StoreError::Failed`]. Each such decision is counted (`RedisStats::degraded` and the
//! `ratekeeper_store_degraded_total` counter, label `action`); the outage is logged by the
//! circuit breaker, once per transition, and each decision at DEBUG only (here for `Local`,
//! by the HTTP layer for the others).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::OwnedCharge;
use crate::clock::Clock;
use crate::store::{Charge, Decisions, FailurePolicy, MemoryStore, Store, StoreError};
use crate::{Key, Policy};

/// A clock shared with the Redis store (so the local fallback sees injected time too).
#[derive(Clone)]
pub(super) struct ClockRef(pub(super) Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn unix_now(&self) -> Duration {
        self.0.unix_now()
    }
}

impl fmt::Debug for ClockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClockRef")
    }
}

/// The failure policy and, for [`FailurePolicy::Local`], its in-memory store. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    pub(super) policy: FailurePolicy,
    local: Option<Arc<MemoryStore<Key, ClockRef>>>,
}

impl Failover {
    /// The failure policy `policy`; with [`FailurePolicy::Local`] an in-memory store on
    /// `clock`.
    pub(super) fn new(policy: FailurePolicy, clock: &Arc<dyn Clock>) -> Self {
        let local = (policy == FailurePolicy::Local)
            .then(|| Arc::new(MemoryStore::with_clock(ClockRef(Arc::clone(clock)))));
        Self { policy, local }
    }

    /// Registers `policy` with the local store (the override of the same name among
    /// `overrides` if there is one). Called in the same order as the Redis registrations, so
    /// the policy ids agree.
    ///
    /// # Errors
    ///
    /// The local store's registration error; [`StoreError::UnsupportedQuota`] once the store
    /// has been used (cloned into a check).
    pub(super) fn register(
        &mut self,
        policy: &Policy,
        overrides: &[Policy],
    ) -> Result<(), StoreError> {
        let Some(local) = &mut self.local else {
            return Ok(());
        };
        let local_policy = overrides
            .iter()
            .find(|p| p.name() == policy.name())
            .unwrap_or(policy);
        let store = Arc::get_mut(local).ok_or_else(|| {
            StoreError::UnsupportedQuota(
                "policies must be registered before the store is used".to_owned(),
            )
        })?;
        store.register(local_policy)?;
        Ok(())
    }

    /// Applies the failure policy to `charges` that Redis could not decide because of `err`:
    /// counts it in `degraded` and the metrics, logs it (`DEBUG`, `Local` only), and answers.
    ///
    /// # Errors
    ///
    /// [`StoreError::Failed`] with the policy (and `err` as its source), except under
    /// [`FailurePolicy::Local`], which answers with the local store's decisions. Those carry
    /// no receipts: the charges were not made in Redis, so a refund of them gives back
    /// nothing there.
    pub(super) fn apply(
        &self,
        charges: &[OwnedCharge],
        err: StoreError,
        degraded: &AtomicU64,
    ) -> Result<Decisions, StoreError> {
        degraded.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ratekeeper_store_degraded_total", "action" => self.policy.as_str())
            .increment(1);
        // The breaker logs the outage's transitions; here one DEBUG event per decision, and
        // only for `Local`, which this store answers itself (the HTTP layer logs the others).
        if self.policy == FailurePolicy::Local {
            tracing::debug!(error = %err, "redis store could not decide; the local store answered");
        }
        let policy = match (self.policy, &self.local) {
            (FailurePolicy::Local, Some(local)) => {
                let borrowed: Vec<Charge<'_, Key>> = charges
                    .iter()
                    .map(|(p, k, c)| Charge::new(*p, k, *c))
                    .collect();
                return local
                    .check_now(&borrowed)
                    .map(|d| Decisions::new(d.as_slice().iter().copied()));
            }
            (FailurePolicy::Local, None) => FailurePolicy::Allow,
            (other, _) => other,
        };
        Err(StoreError::Failed {
            policy,
            source: Box::new(err),
        })
    }
}
