//! The bans of one policy in the [`MemoryStore`](super::MemoryStore): a small map beside the
//! policy's key map, made only for a policy with a [`Ban`], holding a key only while it has
//! refusals being counted or a ban in force, capped at the store's `max_keys` and swept.

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::keyed::Hasher;
use crate::Ban;

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
    pub(super) max_keys: usize,
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
            max_keys,
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
            .min(self.max_keys.div_ceil(2).max(MIN_CAPPED_SWEEP_INSERTS));
        if added >= threshold {
            self.sweep(now);
        }
        self.max_keys == usize::MAX || self.map.len() < self.max_keys
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
