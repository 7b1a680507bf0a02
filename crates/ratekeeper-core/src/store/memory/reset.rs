//! One key's state in a [`MemoryStore`]: peeks that charge nothing, whether a key holds a
//! state of its own, and resets (of one policy or of all, all or nothing).

use std::hash::Hash;

use smallvec::SmallVec;

use super::MemoryStore;
use super::keyed::with_keyed;
use crate::Decision;
use crate::clock::Clock;
use crate::store::{Decisions, PolicyId, StoreError};

impl<K, C> MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Forgets `key` under `policy`: its next request sees a full budget, and a ban of the
    /// key (or its count of refusals) under the policy ends. [`MemoryStore::reset_now`]
    /// (and [`Store::reset`](crate::store::Store::reset)) do the same and answer the state
    /// after the reset.
    ///
    /// Receipts of charges made before the reset give back nothing afterwards (the reset
    /// forgot those charges; their refunds must not free the ones made since). Until every
    /// stamp from before the reset is stale (about one tolerance `tau` for GCRA and the
    /// leaky bucket, two windows for the window algorithms, every permit released for the
    /// concurrency counter), the key's checks take a slower path behind a lock.
    ///
    /// A key that holds no state while the policy holds [`MemoryStore::with_max_keys`] keys
    /// is charged on the shared overflow state; its reset gives it a fresh state of its own
    /// instead, which takes room in the cap (after a sweep of idle keys if need be) and is
    /// kept at least until the stamps from before the reset are stale. Its earlier charges
    /// stay on the overflow state, shared with the other keys there, and their refunds still
    /// go there.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when `policy` was never registered;
    /// [`StoreError::KeysFull`] when the key is charged on the overflow state and every key
    /// the policy holds is live, so there is no room for a state of its own. Nothing is
    /// reset then.
    pub fn forget(&self, policy: PolicyId, key: &K) -> Result<(), StoreError> {
        if let Some(fresh) = self.refreshed() {
            return fresh.forget(policy, key);
        }
        self.forget_in(&[policy], key)
    }

    /// [`MemoryStore::forget`] under each of `policies`, all or nothing: room for every
    /// reset that needs some is taken before any is made.
    fn forget_in(&self, policies: &[PolicyId], key: &K) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut rooms = SmallVec::<[bool; 4]>::new();
        for (i, &id) in policies.iter().enumerate() {
            let taken = self.slot(id).and_then(|slot| {
                with_keyed!(slot, k => k.reset_room(key, now)).map_err(|_| StoreError::KeysFull(id))
            });
            match taken {
                Ok(room) => rooms.push(room),
                Err(e) => {
                    for (&id, &room) in policies[..i].iter().zip(&rooms) {
                        if room {
                            let slot = self.slot(id)?;
                            with_keyed!(slot, k => k.release_room());
                        }
                    }
                    return Err(e);
                }
            }
        }
        for (&id, &room) in policies.iter().zip(&rooms) {
            let slot = self.slot(id)?;
            with_keyed!(slot, k => k.reset(key, now, room));
            if let Some(bans) = self.bans_of(id)? {
                bans.reset(key);
            }
        }
        Ok(())
    }

    /// Forgets `key` under `policy`, or under every policy (`None`), and reports the state
    /// afterwards (see [`MemoryStore::peek_now`]): one decision for `Some(policy)`, one per
    /// policy in registration order for `None`. Same as
    /// [`Store::reset`](crate::store::Store::reset) without the
    /// [`Checked`](crate::store::Checked) wrapper; see [`MemoryStore::forget`] for what
    /// happens to receipts from before the reset and to a key charged on the overflow state.
    ///
    /// A ban of the key under a reset policy ends, and its count of refusals starts again
    /// from zero. A concurrency-counter policy forgets the permits the key holds: the key can take
    /// its whole limit again at once, and the release of a permit taken before the reset
    /// gives back nothing (so permits still in flight and permits leaked by a lost response
    /// are never counted twice, and never free a permit taken since).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when `policy` was never registered;
    /// [`StoreError::KeysFull`] when, under a policy at its cap of keys, none idle, the key
    /// is charged on the overflow state (see [`MemoryStore::forget`]). Nothing is reset
    /// then, under any policy.
    pub fn reset_now(&self, policy: Option<PolicyId>, key: &K) -> Result<Decisions, StoreError> {
        if let Some(fresh) = self.refreshed() {
            return fresh.reset_now(policy, key);
        }
        let ids: SmallVec<[PolicyId; 4]> = match policy {
            Some(id) => {
                self.slot(id)?;
                SmallVec::from_elem(id, 1)
            }
            None => (0..self.reg.len())
                .filter_map(|i| u32::try_from(i).ok())
                .map(PolicyId::from_index)
                .collect(),
        };
        self.forget_in(&ids, key)?;
        ids.iter()
            .map(|&id| self.peek_now(id, key))
            .collect::<Result<SmallVec<[Decision; 4]>, _>>()
            .map(Decisions::new)
    }

    /// `key`'s state under `policy` at the clock's current time, charging nothing: the
    /// decision of a free probe (cost 0). `limit`, `remaining` (whole cost-1 requests that
    /// would pass now) and `reset_after` (time until the budget is full again) are the
    /// state's, read where a check of the key would charge (its own state, or the shared
    /// overflow state while [`MemoryStore::with_max_keys`] keys are held and the key has
    /// none); the outcome is allowed. While a ban of the key under the policy is in force,
    /// the answer is the ban ([`Decision::banned`]: refused, `retry_after` and `reset_after`
    /// the time until it ends, `remaining` 0). Same as
    /// [`Store::peek`](crate::store::Store::peek) without the
    /// [`Checked`](crate::store::Checked) wrapper. Inserts nothing.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownPolicy`] when `policy` was never registered.
    pub fn peek_now(&self, policy: PolicyId, key: &K) -> Result<Decision, StoreError> {
        if let Some(fresh) = self.refreshed() {
            return fresh.peek_now(policy, key);
        }
        let slot = self.slot(policy)?;
        let now = self.clock.now();
        let state = with_keyed!(slot, k => k.peek(key, now, 0));
        let banned = self.bans_of(policy)?.and_then(|b| b.ends_in(key, now));
        Ok(match banned {
            Some(ends) => Decision::banned(state.limit(), std::time::Duration::from_nanos(ends)),
            None => state,
        })
    }

    /// Whether `key` holds state of its own under `policy`. A key that does not behaves as
    /// absent, or shares the overflow state while `max_keys` keys are held
    /// ([`MemoryStore::with_max_keys`]); an unknown policy holds nothing.
    pub fn holds(&self, policy: PolicyId, key: &K) -> bool {
        if let Some(fresh) = self.refreshed() {
            return fresh.holds(policy, key);
        }
        self.slot(policy)
            .is_ok_and(|slot| with_keyed!(slot, k => k.holds(key)))
    }
}
