//! [`Store`] for [`MemoryStore`]: every call of the trait, answered at once (the future is
//! always ready).

use std::future::Ready;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::MemoryStore;
use super::ban::Bans;
use super::keyed::{Slot, with_keyed};
use crate::Policy;
use crate::clock::Clock;
use crate::store::{Charge, Checked, Correction, Decisions, PolicyId, Refund, Store, StoreError};

impl<K, C> Store<K> for MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Future = Ready<Result<Decisions, StoreError>>;

    /// Registers `policy` in the registry every clone of this store shares: its id is
    /// valid through every clone, made before or after.
    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        policy.validate()?;
        let mut latest = self.registry.lock();
        let max_keys = self.registry.max_keys.load(Ordering::Relaxed);
        let index = u32::try_from(latest.len())
            .map_err(|_| StoreError::UnknownPolicy(PolicyId::from_index(u32::MAX)))?;
        let slot = Slot::new(policy, max_keys);
        let bans = policy.ban().map(|ban| Arc::new(Bans::new(ban, max_keys)));
        if bans.is_some() && !latest.has_bans {
            latest.has_bans = true;
            latest.banning = std::mem::take(&mut latest.policies);
        }
        let entry = Arc::new((policy.clone(), slot));
        if latest.has_bans {
            latest.banning.push(entry);
        } else {
            latest.policies.push(entry);
        }
        latest.bans.push(bans);
        self.registry.set_count(latest.len());
        self.reg = latest.clone();
        Ok(PolicyId::from_index(index))
    }

    // Inlined into the caller (the HTTP layer's `call`): out of line, the answer is written
    // to memory and copied, some 40 instructions of a 250-instruction check.
    #[inline(always)]
    fn check(&self, charges: &[Charge<'_, K>]) -> Checked<Self::Future> {
        let now = self.clock.now();
        // One charge: the decisions are built in place in the answer (wrapping the result of
        // `check_at` copied them, some 150 bytes). Its policy is found in `policies` only
        // while no policy has a ban; otherwise (or for an unknown policy) `check_at` decides.
        if let [only] = charges {
            if let Some(entry) = self.reg.policies.get(only.policy.index()) {
                let (d, receipt) = with_keyed!(&entry.1, k => k.check(only.key, now, only.cost));
                return Checked::Ready(Ok(Decisions::one_with_receipt(d, receipt)));
            }
        }
        Checked::Ready(self.check_at(charges, now))
    }

    /// Exact for GCRA and the leaky bucket; check-and-retry for the other algorithms (see
    /// [`MemoryStore::reserve_now`]).
    fn reserve(
        &self,
        charges: &[Charge<'_, K>],
        max_wait: std::time::Duration,
    ) -> Checked<Self::Future> {
        Checked::Ready(self.reserve_now(charges, max_wait))
    }

    /// See [`MemoryStore::peek_now`].
    fn peek(&self, policy: PolicyId, key: &K) -> Checked<Self::Future> {
        Checked::Ready(self.peek_now(policy, key).map(Decisions::one))
    }

    /// See [`MemoryStore::reset_now`].
    fn reset(&self, policy: Option<PolicyId>, key: &K) -> Checked<Self::Future> {
        Checked::Ready(self.reset_now(policy, key))
    }

    /// Gives back latest charge first (the reverse of `refunds`' order), so a request that
    /// charged one policy and key twice gets both back: its later charge is the latest.
    fn refund(&self, refunds: &[Refund<'_, K>]) {
        if let Some(fresh) = self.refreshed() {
            return fresh.refund(refunds);
        }
        let now = self.clock.now();
        for r in refunds.iter().rev() {
            let c = r.charge;
            if let Ok(slot) = self.slot(c.policy) {
                with_keyed!(slot, k => k.refund(c.key, now, c.cost, r.receipt));
            }
        }
    }

    /// Each correction on the state its receipt names (latest first, as refunds): a
    /// give-back by the refund rules, except that a token bucket or leaky bucket beyond its
    /// tolerance is read as a debt and paid off; an extra charge forced on the state a
    /// check of the key would charge now. The concurrency counter only gives back (a
    /// permit is a permit, whatever the request cost).
    fn correct(&self, corrections: &[Correction<'_, K>]) {
        if let Some(fresh) = self.refreshed() {
            return fresh.correct(corrections);
        }
        let now = self.clock.now();
        for c in corrections.iter().rev() {
            let charge = c.charge;
            if let Ok(slot) = self.slot(charge.policy) {
                let (back, extra) = (c.give_back(), c.extra());
                if back > 0 {
                    with_keyed!(slot, k => k.give_back(charge.key, now, back, c.receipt));
                }
                if extra > 0 {
                    with_keyed!(slot, k => k.debit(charge.key, now, extra));
                }
            }
        }
    }

    fn unix_now(&self) -> std::time::Duration {
        self.clock.unix_now()
    }
}
