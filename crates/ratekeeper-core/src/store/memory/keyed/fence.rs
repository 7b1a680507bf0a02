//! The fences of reset keys (see the module docs of `keyed`): a reset key's new state runs
//! behind a fence until every stamp of its earlier lives is stale, and the reset itself,
//! with the room in the cap a key on the overflow state needs for a state of its own.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use crate::Decision;
use crate::algorithm::{KeyedAlgorithm, Ledger, Reserved, lock};
use crate::store::Receipt;

use super::lanes::{FenceKey, on_lane};
use super::{Keyed, own_receipt};

/// A reset key's state (see the module docs): it decides at `now + shift`, so every stamp
/// it hands out is above `boundary`, the largest stamp any earlier life handed out. Or a
/// key with a FIFO ledger (GCRA, leaky bucket: see `shift`), which decides instead of
/// `state`.
pub(super) struct Fence<S> {
    pub(super) state: S,
    pub(super) shift: u64,
    pub(super) boundary: u64,
    /// The largest stamp handed out for the key in any life (it goes when this is stale).
    pub(super) bound: u64,
    /// Concurrency permits taken before the reset and not yet released (their releases
    /// give back nothing).
    pub(super) old_permits: u64,
    /// The key's schedule as a ledger, after a refund out of its middle.
    pub(super) ledger: Option<Ledger>,
}

impl<K: Hash + Eq + Clone + 'static, A: KeyedAlgorithm, H: BuildHasher + Clone> Keyed<K, A, H> {
    /// A check of a fenced key, or `None` when `key` has no fence (or its fence just went).
    #[cold]
    pub(super) fn check_fenced(
        &self,
        key: &FenceKey<K>,
        now: u64,
        cost: u64,
    ) -> Option<(Decision, Receipt)> {
        let mut fences = lock(&self.fences);
        let fence = fences.get_mut(key)?;
        if self.fence_is_done(fence, now) {
            fences.remove(key);
            self.unfence(1);
            return None;
        }
        let (decision, receipt) = match &mut fence.ledger {
            Some(ledger) => self.ledger_check(ledger, now, cost),
            None => self
                .algorithm
                .check(&fence.state, now.saturating_add(fence.shift), cost),
        };
        if let Some(stamp) = receipt.stamp() {
            fence.bound = fence.bound.max(stamp);
        }
        Some((decision, own_receipt(receipt)))
    }

    /// A reservation of a fenced key, or `None` when `key` has no fence (or its fence just
    /// went).
    #[cold]
    pub(super) fn reserve_fenced(
        &self,
        key: &FenceKey<K>,
        now: u64,
        cost: u64,
        max_wait: u64,
    ) -> Option<Reserved> {
        let mut fences = lock(&self.fences);
        let fence = fences.get_mut(key)?;
        if self.fence_is_done(fence, now) {
            fences.remove(key);
            self.unfence(1);
            return None;
        }
        let mut reserved = match &mut fence.ledger {
            Some(ledger) => self.ledger_reserve(ledger, now, cost, max_wait),
            None => self.algorithm.reserve(
                &fence.state,
                now.saturating_add(fence.shift),
                cost,
                max_wait,
            ),
        };
        if let Some(stamp) = reserved.receipt.stamp() {
            fence.bound = fence.bound.max(stamp);
        }
        reserved.receipt = own_receipt(reserved.receipt);
        Some(reserved)
    }

    /// Whether a fence can go: its state (or ledger) is idle and no stamp of any life of
    /// the key can take anything from a state created now (concurrency: every permit is
    /// back).
    pub(super) fn fence_is_done(&self, fence: &Fence<A::State>, now: u64) -> bool {
        let idle = match &fence.ledger {
            Some(ledger) => ledger.is_idle(now) && self.algorithm.stale(ledger.next(), now),
            None => self
                .algorithm
                .is_idle(&fence.state, now.saturating_add(fence.shift)),
        };
        fence.old_permits == 0 && idle && self.algorithm.stale(fence.bound, now)
    }

    /// `n` fences went: their keys no longer hold state.
    pub(super) fn unfence(&self, n: usize) {
        self.fenced.fetch_sub(n, Ordering::AcqRel);
        self.release(n);
        // Precision: a gauge is an f64; key counts stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        self.keys_gauge().decrement(n as f64);
    }

    /// The room in the cap a reset of `key` needs: a key that holds no state while
    /// `max_keys` keys are held would be charged on the shared overflow state, so its reset
    /// gives it a state of its own (a fence), which takes room. `Ok(true)`: room was taken
    /// (pass it to [`Keyed::reset`]); `Ok(false)`: none is needed; `Err(CapFull)`: none is
    /// free even after a sweep (every key held is live), so the key cannot be reset.
    pub(in crate::store::memory) fn reset_room(&self, key: &K, now: u64) -> Result<bool, CapFull> {
        if !self.is_full() || self.holds(key) {
            return Ok(false);
        }
        if self.take_room() {
            return Ok(true);
        }
        self.sweep(now);
        if self.take_room() {
            Ok(true)
        } else {
            Err(CapFull)
        }
    }

    /// Gives back room taken by [`Keyed::reset_room`] for a reset that does not happen.
    pub(in crate::store::memory) fn release_room(&self) {
        self.release(1);
    }

    /// Forgets `key`'s charges (its next request sees a full budget), fencing its state so
    /// that no receipt handed out before gives back anything after (see the module docs).
    /// With `room` (taken by [`Keyed::reset_room`]), a key that holds no state gets a fresh
    /// one behind a fence, so its next request is not charged on the overflow state; its
    /// earlier charges there stay there (their refunds still go there).
    pub(in crate::store::memory) fn reset(&self, key: &K, now: u64, room: bool) {
        let mut fences = lock(&self.fences);
        // Announced before the key leaves its lane, so a concurrent check of it waits for
        // the fence (on the lock) instead of inserting the key again.
        self.fenced.fetch_add(1, Ordering::AcqRel);
        let removed = on_lane!(self.map, key, |map, q, _own, _fence| map
            .remove(q)
            .map(|(_, s)| s));
        let before = self
            .algorithm
            .stamp_bound(now)
            .max(self.max_booked.load(Ordering::Acquire));
        let permits = removed.as_ref().map_or(0, |s| self.algorithm.permits(s));
        let fence_key = FenceKey::of(key);
        if let Some(fence) = fences.get_mut(&fence_key) {
            // Fenced already: a new life behind a higher fence.
            let side = match fence.ledger.take() {
                Some(ledger) => ledger.next(),
                None => self.algorithm.stamp_bound(now.saturating_add(fence.shift)),
            };
            fence.old_permits = fence
                .old_permits
                .saturating_add(self.algorithm.permits(&fence.state))
                .saturating_add(permits);
            fence.bound = fence.bound.max(before).max(side);
            fence.boundary = fence.bound;
            fence.shift = self.algorithm.fence_shift(fence.boundary, now);
            fence.state = A::State::default();
            self.fenced.fetch_sub(1, Ordering::AcqRel);
            if removed.is_some() {
                // A check that raced the first fence put the key back in its lane.
                self.release(1);
                self.keys_gauge().decrement(1.0);
            }
            if room {
                self.release(1);
            }
        } else if removed.is_some() || room {
            // The key's room in the cap passes to the fence: the room it held in its lane,
            // or the room taken for it (one is enough, if a check inserted the key since).
            if removed.is_none() {
                self.keys_gauge().increment(1.0);
            } else if room {
                self.release(1);
            }
            fences.insert(
                fence_key,
                Fence {
                    state: A::State::default(),
                    shift: self.algorithm.fence_shift(before, now),
                    boundary: before,
                    bound: before,
                    old_permits: permits,
                    ledger: None,
                },
            );
        } else {
            // Not held while the cap had room: the key's next request gets a state of its
            // own, as a new key's. Its charges, if any, were on a state that went when idle,
            // or on the overflow state, which stays shared (their refunds still go there).
            self.fenced.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A reset found `max_keys` keys held, none idle, so the key, which holds no state, could
/// not get one of its own (see [`Keyed::reset_room`]).
#[derive(Debug)]
pub(in crate::store::memory) struct CapFull;
