//! Bans in the [`MemoryStore`]: the bans of one policy ([`Bans`], a small map beside the
//! policy's key map, made only for a policy with a [`Ban`], holding a key only while it has
//! refusals being counted or a ban in force, capped at the store's `max_keys` and swept),
//! and the store's checks and reservations while some policy has a ban.

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use smallvec::SmallVec;

use super::MemoryStore;
use super::keyed::{Hasher, with_keyed};
use crate::clock::Clock;
use crate::store::{Charge, Decisions, PolicyId, StoreError};
use crate::{Ban, Decision};

/// Sweeps never run before this many keys were added since the last one.
const MIN_SWEEP_INSERTS: usize = 1_024;

/// With `max_keys` set, sweeps run at least once per this many new keys.
const MIN_CAPPED_SWEEP_INSERTS: usize = 256;

/// One key's refusals and ban, in clock ns.
#[derive(Debug, Clone, Copy)]
struct BanState {
    /// When the count of refusals started (meaningful while `count > 0`).
    first: u64,
    /// Refusals counted since `first`.
    count: u32,
    /// The ban's end (0: none).
    until: u64,
}

impl BanState {
    /// Whether the state says nothing any more at `now`: no ban in force, no count running.
    fn is_idle(&self, now: u64, within: u64) -> bool {
        self.until <= now && (self.count == 0 || self.first.saturating_add(within) <= now)
    }
}

/// The bans of one policy.
pub(super) struct Bans<K> {
    refusals: u32,
    within: u64,
    duration: u64,
    map: DashMap<K, BanState, Hasher>,
    pub(super) max_keys: AtomicUsize,
    inserts_since_sweep: AtomicUsize,
    kept_by_last_sweep: AtomicUsize,
    sweeping: AtomicBool,
}

impl<K: Hash + Eq + Clone> Bans<K> {
    pub(super) fn new(ban: &Ban, max_keys: usize) -> Self {
        Self {
            refusals: ban.refusals().get(),
            within: ban.within_nanos(),
            duration: ban.duration_nanos(),
            map: DashMap::with_hasher(Hasher::default()),
            max_keys: AtomicUsize::new(max_keys),
            inserts_since_sweep: AtomicUsize::new(0),
            kept_by_last_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
    }

    /// The ban's length in ns.
    pub(super) fn duration(&self) -> u64 {
        self.duration
    }

    /// The ns until the ban of `key` ends, when one is in force at `now`.
    pub(super) fn ends_in(&self, key: &K, now: u64) -> Option<u64> {
        let state = self.map.get(key)?;
        (state.until > now).then(|| state.until - now)
    }

    /// Counts one refusal of `key` at `now`; true when it starts a ban (then the count is
    /// back at zero). A refusal while a ban is in force (a request that raced its start)
    /// counts nothing. A new key is not counted while `max_keys` keys are held and a sweep
    /// frees none: its refusals stay refusals, only the ban does not start.
    pub(super) fn refuse(&self, key: &K, now: u64) -> bool {
        let mut state = match self.map.get_mut(key) {
            Some(state) => state,
            None => {
                if !self.room(now) {
                    return false;
                }
                match self.map.entry(key.clone()) {
                    Entry::Occupied(state) => state.into_ref(),
                    Entry::Vacant(vacant) => vacant.insert(BanState {
                        first: now,
                        count: 0,
                        until: 0,
                    }),
                }
            }
        };
        if state.until > now {
            return false;
        }
        if state.count == 0 || state.first.saturating_add(self.within) <= now {
            state.first = now;
            state.count = 0;
        }
        state.count += 1;
        if state.count < self.refusals {
            return false;
        }
        state.count = 0;
        state.until = now.saturating_add(self.duration);
        true
    }

    /// Whether a new key may be added (below `max_keys`). Sweeps run once per as many new
    /// keys (or keys turned away) as the last sweep kept, at least 1 024, and at most
    /// `max(max_keys / 2, 256)`: O(1) amortised per key, and memory within twice the keys
    /// that are live.
    fn room(&self, now: u64) -> bool {
        let added = self.inserts_since_sweep.fetch_add(1, Ordering::Relaxed) + 1;
        let threshold = self
            .kept_by_last_sweep
            .load(Ordering::Relaxed)
            .max(MIN_SWEEP_INSERTS)
            .min(
                self.max_keys
                    .load(Ordering::Relaxed)
                    .div_ceil(2)
                    .max(MIN_CAPPED_SWEEP_INSERTS),
            );
        if added >= threshold {
            self.sweep(now);
        }
        let max_keys = self.max_keys.load(Ordering::Relaxed);
        max_keys == usize::MAX || self.map.len() < max_keys
    }

    /// Forgets `key`'s refusals and ban.
    pub(super) fn reset(&self, key: &K) {
        self.map.remove(key);
    }

    /// Keys with refusals counted or a ban in force (idle ones until the next sweep).
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Removes the keys whose ban ended and whose count ran out. Single-flight.
    pub(super) fn sweep(&self, now: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        self.map.retain(|_, state| !state.is_idle(now, self.within));
        self.kept_by_last_sweep
            .store(self.map.len(), Ordering::Relaxed);
        self.inserts_since_sweep.store(0, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}

impl<K, C> MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// A check (`max_wait` `None`) or reservation of `charges` in a store where some policy
    /// has a [`Ban`](crate::Ban):
    ///
    /// 1. a ban in force for a charge's key refuses the whole request and charges nothing:
    ///    that charge reports [`Decision::banned`] (the ban ending last, when several are in
    ///    force), the others their state as it is; a reservation's denial is final when the
    ///    ban ends after `max_wait`;
    /// 2. otherwise the charges are checked (or reserved) as without bans;
    /// 3. a denial that refuses the request (every denial of a check; of a reservation, a
    ///    final one or one whose `retry_after` is longer than `max_wait`) counts one refusal
    ///    for every policy with a ban that denied (each policy and key once), and a refusal
    ///    that starts a ban reports it ([`Decision::with_ban_started`]): `retry_after` is
    ///    the longer of the ban and the quota's wait, `remaining` 0.
    ///
    /// A ban that starts while the request is charged (a concurrent request's refusal
    /// started it) is found by a second look after the charge: the charges are given back
    /// by their receipts and the request is refused as in 1, so no charge outlives the start
    /// of a ban.
    #[cold]
    #[inline(never)]
    pub(super) fn with_bans(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
        max_wait: Option<u64>,
    ) -> Result<Decisions, StoreError> {
        if let Some((banned, ends)) = self.longest_ban(charges, now)? {
            return self.banned(charges, now, max_wait, banned, ends);
        }
        #[cfg(test)]
        self.run_before_charge();
        let decisions = match max_wait {
            None => self.check_plain(charges, now)?,
            Some(w) => self.reserve_at(charges, now, w)?,
        };
        if decisions.is_allowed() {
            // A ban started between the first look and the charge: the charge goes back.
            if let Some((banned, ends)) = self.longest_ban(charges, now)? {
                for (i, c) in charges.iter().enumerate().rev() {
                    let slot = self.slot(c.policy)?;
                    let receipt = decisions.receipt(i);
                    with_keyed!(slot, k => k.refund(c.key, now, c.cost, receipt));
                }
                return self.banned(charges, now, max_wait, banned, ends);
            }
            return Ok(decisions);
        }
        let refuses = match max_wait {
            None => true,
            Some(w) => {
                decisions.is_final()
                    || decisions
                        .retry_after()
                        .is_some_and(|r| crate::clock::nanos(r) > w)
            }
        };
        if !refuses {
            return Ok(decisions);
        }
        let mut started = false;
        let mut is_final = decisions.is_final();
        let mut report = SmallVec::<[Decision; 4]>::new();
        for (i, (c, d)) in charges.iter().zip(decisions.as_slice()).enumerate() {
            let counted = d.is_denied()
                && !d.is_cannot_fit()
                && !charges[..i]
                    .iter()
                    .any(|p| p.policy == c.policy && p.key == c.key);
            let bans = if counted {
                self.bans_of(c.policy)?
            } else {
                None
            };
            match bans {
                Some(bans) if bans.refuse(c.key, now) => {
                    started = true;
                    let ban = std::time::Duration::from_nanos(bans.duration());
                    let wait = d.retry_after().unwrap_or_default().max(ban);
                    is_final |= max_wait.is_some_and(|w| crate::clock::nanos(wait) > w);
                    report.push(Decision::banned(d.limit(), wait).with_ban_started());
                }
                _ => report.push(*d),
            }
        }
        if !started {
            return Ok(decisions);
        }
        Ok(Decisions::new(report).with_final(is_final))
    }

    /// The charge whose key has the ban in force that ends last, with the ns until it ends
    /// (`None`: no charge's key is banned).
    fn longest_ban(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
    ) -> Result<Option<(usize, u64)>, StoreError> {
        let mut longest: Option<(usize, u64)> = None;
        for (i, c) in charges.iter().enumerate() {
            let ends = self.bans_of(c.policy)?.and_then(|b| b.ends_in(c.key, now));
            if let Some(ends) = ends {
                if longest.is_none_or(|(_, e)| ends > e) {
                    longest = Some((i, ends));
                }
            }
        }
        Ok(longest)
    }

    /// The refusal of a request whose charge `banned` has a ban in force for `ends` ns:
    /// that charge reports [`Decision::banned`], the others their state as it is; a
    /// reservation's denial is final when the ban ends after `max_wait`.
    fn banned(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
        max_wait: Option<u64>,
        banned: usize,
        ends: u64,
    ) -> Result<Decisions, StoreError> {
        let mut report = SmallVec::<[Decision; 4]>::new();
        for (i, c) in charges.iter().enumerate() {
            let slot = self.slot(c.policy)?;
            let state = with_keyed!(slot, k => k.peek(c.key, now, c.cost));
            report.push(if i == banned {
                Decision::banned(state.limit(), std::time::Duration::from_nanos(ends))
            } else {
                state
            });
        }
        let is_final = max_wait.is_some_and(|w| ends > w);
        Ok(Decisions::new(report).with_final(is_final))
    }

    /// The bans of `policy` (`None`: it has no ban).
    pub(super) fn bans_of(&self, policy: PolicyId) -> Result<Option<&Bans<K>>, StoreError> {
        self.slot(policy)?;
        Ok(self.reg.bans.get(policy.index()).and_then(Option::as_deref))
    }

    /// Keys with refusals being counted or a ban in force under `policy` (0 for a policy
    /// without a ban). Keys whose ban ended stay counted until the next sweep.
    pub fn ban_len(&self, policy: PolicyId) -> usize {
        if let Some(fresh) = self.refreshed() {
            return fresh.ban_len(policy);
        }
        self.bans_of(policy).ok().flatten().map_or(0, Bans::len)
    }

    /// How long the ban of `key` under `policy` still lasts (`None`: no ban in force).
    pub fn ban_ends_in(&self, policy: PolicyId, key: &K) -> Option<std::time::Duration> {
        if let Some(fresh) = self.refreshed() {
            return fresh.ban_ends_in(policy, key);
        }
        let bans = self.bans_of(policy).ok().flatten()?;
        bans.ends_in(key, self.clock.now())
            .map(std::time::Duration::from_nanos)
    }
}
