//! Refunds and corrections of a policy's key map: a give-back lands on the state its
//! receipt names (the overflow state, the key's own state in the same life, or its fence),
//! an extra charge on the state a check of the key would charge now.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use crate::algorithm::{KeyedAlgorithm, lock};
use crate::store::Receipt;

use super::lanes::{FenceKey, Insert, on_lane};
use super::{Keyed, OVERFLOW_BIT};

impl<K: Hash + Eq + Clone + 'static, A: KeyedAlgorithm, H: BuildHasher + Clone> Keyed<K, A, H> {
    /// Gives back what the charge of `cost` with `receipt` still holds (nothing for
    /// [`Receipt::NONE`]), on the state the charge was made on: the overflow state for a
    /// receipt marked [`OVERFLOW_BIT`]; otherwise the key's own state in the same life (in
    /// its lane; behind its fence when the stamp is above the fence's boundary; on its
    /// ledger, where a refund out of the middle of a GCRA or leaky-bucket schedule moves
    /// the key). A charge whose state is gone (evicted when idle, or reset) gives back
    /// nothing. On the shared overflow state, a refund out of the middle of the schedule
    /// gives back nothing (the state is every overflowed key's; no ledger is kept for it).
    pub(in crate::store::memory) fn refund(&self, key: &K, now: u64, cost: u64, receipt: Receipt) {
        self.settle_back(key, now, cost, receipt, false);
    }

    /// [`Keyed::refund`] for a correction's give-back: by
    /// [`KeyedAlgorithm::give_back`], which pays off a debt.
    pub(in crate::store::memory) fn give_back(
        &self,
        key: &K,
        now: u64,
        cost: u64,
        receipt: Receipt,
    ) {
        self.settle_back(key, now, cost, receipt, true);
    }

    /// The algorithm's refund, or its give-back when `correcting`.
    fn back(&self, state: &A::State, now: u64, cost: u64, stamp: u64, correcting: bool) -> bool {
        if correcting {
            self.algorithm.give_back(state, now, cost, stamp)
        } else {
            self.algorithm.refund(state, now, cost, stamp)
        }
    }

    fn settle_back(&self, key: &K, now: u64, cost: u64, receipt: Receipt, correcting: bool) {
        let Some(stamp) = receipt.stamp() else {
            return;
        };
        if stamp & OVERFLOW_BIT != 0 {
            // Unless the key's own stamps can reach bit 63 by now (then the two cannot be
            // told apart, and nothing comes back).
            if now.saturating_add(self.algorithm.headroom()) < OVERFLOW_BIT {
                // The overflow state is never evicted. A refund out of the middle of its
                // schedule changes nothing (true): no ledger is kept for a shared state.
                let _ = self.back(&self.overflow, now, cost, stamp & !OVERFLOW_BIT, correcting);
            }
            return;
        }
        let found = on_lane!(self.map, key, |map, q, _own, _fence| map
            .get(q)
            .map(|state| self.back(&state, now, cost, stamp, correcting)));
        match found {
            // Out of the middle of the schedule: settled on the key's ledger.
            Some(true) => self.shift(key, now, cost, stamp, correcting),
            Some(false) => {}
            None if self.fenced.load(Ordering::Acquire) != 0 => {
                self.refund_fenced(key, now, cost, stamp, correcting);
            }
            None => {}
        }
    }

    #[cold]
    fn refund_fenced(&self, key: &K, now: u64, cost: u64, stamp: u64, correcting: bool) {
        let mut fences = lock(&self.fences);
        if let Some(fence) = fences.get_mut(&FenceKey::of(key)) {
            self.fence_back(fence, now, cost, stamp, correcting);
        }
    }

    /// Charges `extra` units to `key` at `now` without refusing (a correction's extra
    /// charge), on the state a check of `key` would charge now: its own (inserted if it
    /// holds none), its fence's, or the overflow state while `max_keys` keys are held.
    pub(in crate::store::memory) fn debit(&self, key: &K, now: u64, extra: u64) {
        if extra == 0 {
            return;
        }
        let held = on_lane!(self.map, key, |map, q, _own, _fence| map
            .get(q)
            .map(|state| self.algorithm.debit(&state, now, extra))
            .is_some());
        if !held {
            self.debit_new(key, now, extra);
        }
    }

    /// [`Keyed::debit`] of a key not in its lane (as [`Keyed::check_new`] charges one).
    #[cold]
    #[inline(never)]
    fn debit_new(&self, key: &K, now: u64, extra: u64) {
        if self.fenced.load(Ordering::Acquire) != 0 {
            let mut fences = lock(&self.fences);
            if let Some(fence) = fences.get_mut(&FenceKey::of(key)) {
                match &mut fence.ledger {
                    Some(ledger) => self.ledger_debit(ledger, now, extra),
                    None => {
                        let shifted = now.saturating_add(fence.shift);
                        self.algorithm.debit(&fence.state, shifted, extra);
                    }
                }
                return;
            }
        }
        on_lane!(self.map, key, |map, _q, own, _fence| {
            if !self.take_room() {
                self.after_insert(now);
                if !self.take_room() {
                    self.algorithm.debit(&self.overflow, now, extra);
                    return;
                }
            }
            let debited = map.insert_with(own(), |state, inserted| {
                if inserted {
                    self.keys_gauge().increment(1.0);
                } else {
                    self.release(1);
                }
                self.algorithm.debit(state, now, extra);
            });
            if debited.is_none() {
                // The lane has no room left for the key (2^32 keys in one slab shard).
                self.release(1);
                self.algorithm.debit(&self.overflow, now, extra);
                return;
            }
            self.after_insert(now);
        });
    }
}
