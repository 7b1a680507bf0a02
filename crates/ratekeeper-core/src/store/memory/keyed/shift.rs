//! Keys with a FIFO ledger (see the module docs of `keyed`): a GCRA or leaky-bucket key
//! that had a charge refunded out of the middle of its schedule leaves its lane and lives
//! in the fence table with an explicit [`Ledger`], which decides exactly as its TAT would.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use crate::Decision;
use crate::algorithm::{KeyedAlgorithm, Ledger, Reserved, lock};
use crate::store::Receipt;

use super::Keyed;
use super::fence::Fence;
use super::lanes::{FenceKey, on_lane};

impl<K: Hash + Eq + Clone + 'static, A: KeyedAlgorithm, H: BuildHasher + Clone> Keyed<K, A, H> {
    /// A state holding the TAT `tat` (the GCRA family; another algorithm's is "absent").
    fn state_at(&self, tat: u64) -> A::State {
        let state = A::State::default();
        if let Some(cell) = self.algorithm.tat_cell(&state) {
            cell.store(tat, Ordering::Relaxed);
        }
        state
    }

    /// The TAT a state holds (the GCRA family; 0 for the others).
    pub(super) fn tat_of(&self, state: &A::State) -> u64 {
        self.algorithm
            .tat_cell(state)
            .map_or(0, |cell| cell.load(Ordering::Acquire))
    }

    /// The receipt of a decision the algorithm made on `state`, which held `tat`: the slot
    /// it took appended to the ledger, stamped in the ledger's coordinates.
    fn booked(
        &self,
        ledger: &mut Ledger,
        now: u64,
        tat: u64,
        state: &A::State,
        r: Receipt,
    ) -> Receipt {
        if r.is_some() {
            let len = self.tat_of(state).saturating_sub(tat);
            Receipt::new(ledger.push(now, len))
        } else {
            Receipt::NONE
        }
    }

    /// [`KeyedAlgorithm::check`] on a ledger.
    pub(super) fn ledger_check(
        &self,
        ledger: &mut Ledger,
        now: u64,
        cost: u64,
    ) -> (Decision, Receipt) {
        let tat = ledger.tat(now);
        let state = self.state_at(tat);
        let (decision, receipt) = self.algorithm.check(&state, now, cost);
        (decision, self.booked(ledger, now, tat, &state, receipt))
    }

    /// [`KeyedAlgorithm::reserve`] on a ledger.
    pub(super) fn ledger_reserve(
        &self,
        ledger: &mut Ledger,
        now: u64,
        cost: u64,
        max_wait: u64,
    ) -> Reserved {
        let tat = ledger.tat(now);
        let state = self.state_at(tat);
        let mut reserved = self.algorithm.reserve(&state, now, cost, max_wait);
        reserved.receipt = self.booked(ledger, now, tat, &state, reserved.receipt);
        reserved
    }

    /// [`KeyedAlgorithm::peek`] on a ledger.
    pub(super) fn ledger_peek(&self, ledger: &Ledger, now: u64, cost: u64) -> Decision {
        self.algorithm
            .peek(&self.state_at(ledger.tat(now)), now, cost)
    }

    /// [`KeyedAlgorithm::debit`] on a ledger: the extra charge takes a slot of its own.
    pub(super) fn ledger_debit(&self, ledger: &mut Ledger, now: u64, extra: u64) {
        let tat = ledger.tat(now);
        let state = self.state_at(tat);
        self.algorithm.debit(&state, now, extra);
        ledger.push(now, self.tat_of(&state).saturating_sub(tat));
    }

    /// A refund (or, when `correcting`, a correction's give-back) on a ledger: the slot of
    /// the charge stamped `stamp` gives back its live part; a refund keeps the turn of a
    /// reservation waiting after it ([`Ledger::give_back`]).
    pub(super) fn ledger_back(
        &self,
        ledger: &mut Ledger,
        now: u64,
        cost: u64,
        stamp: u64,
        correcting: bool,
    ) {
        let keep_turns = (!correcting).then(|| self.algorithm.headroom());
        ledger.give_back(now, self.algorithm.slot(cost), stamp, keep_turns);
    }

    /// Settles a refund out of the middle of the schedule of `key`, held in its lane: the
    /// key leaves its lane for the fence table with its schedule as a ledger (live from
    /// `now` to its TAT, in the coordinates of the stamps it handed out), where the refund
    /// is settled. Its room in the cap passes to the ledger.
    #[cold]
    #[inline(never)]
    pub(super) fn shift(&self, key: &K, now: u64, cost: u64, stamp: u64, correcting: bool) {
        let mut fences = lock(&self.fences);
        // Announced before the key leaves its lane, so a concurrent check of it waits for
        // the ledger (on the lock) instead of inserting the key again.
        self.fenced.fetch_add(1, Ordering::AcqRel);
        let removed = on_lane!(self.map, key, |map, q, _own, _fence| map
            .remove(q)
            .map(|(_, s)| s));
        let fence_key = FenceKey::of(key);
        let Some(state) = removed else {
            // Gone meanwhile (evicted when idle, reset, or moved by another refund): the
            // refund goes where the key's state is now.
            self.fenced.fetch_sub(1, Ordering::AcqRel);
            if let Some(fence) = fences.get_mut(&fence_key) {
                self.fence_back(fence, now, cost, stamp, correcting);
            }
            return;
        };
        let tat = self.tat_of(&state);
        let fence = match fences.get_mut(&fence_key) {
            Some(fence) => {
                // A check that started before the fence put the key back in its lane (its
                // insertion raced the fence's). After a reset, the lane's state was the
                // key's: it takes the fence's place. Beside a ledger, its live time joins
                // the ledger's end (the key's limit holds; a refund of a charge made on that
                // state gives back time of the ledger's below its stamp, never more than
                // its cost), and every stamp bound is kept.
                self.fenced.fetch_sub(1, Ordering::AcqRel);
                self.release(1);
                self.keys_gauge().decrement(1.0);
                match &mut fence.ledger {
                    Some(ledger) => ledger.push_above(now, tat, tat.saturating_sub(now)),
                    None => {
                        fence.state = A::State::default();
                        fence.ledger = Some(Ledger::new(now, now, tat, tat.max(fence.bound)));
                    }
                }
                fence.bound = fence.bound.max(tat);
                fence
            }
            None => fences.entry(fence_key).or_insert(Fence {
                state: A::State::default(),
                shift: 0,
                boundary: 0,
                bound: tat,
                old_permits: 0,
                ledger: Some(Ledger::new(now, now, tat, tat)),
            }),
        };
        self.fence_back(fence, now, cost, stamp, correcting);
    }

    /// A refund (or a correction's give-back) of a key in the fence table: on its ledger;
    /// otherwise on the fence's state when the stamp is of its life (above the boundary),
    /// where a refund out of the middle turns the fence's schedule into a ledger (in the
    /// fence's shifted coordinates). A stamp of an earlier life gives back nothing (a
    /// permit is accounted).
    pub(super) fn fence_back(
        &self,
        fence: &mut Fence<A::State>,
        now: u64,
        cost: u64,
        stamp: u64,
        correcting: bool,
    ) {
        if let Some(ledger) = &mut fence.ledger {
            self.ledger_back(ledger, now, cost, stamp, correcting);
            return;
        }
        if stamp <= fence.boundary {
            fence.old_permits -= cost.min(fence.old_permits);
            return;
        }
        let shifted = now.saturating_add(fence.shift);
        let middle = if correcting {
            self.algorithm.give_back(&fence.state, shifted, cost, stamp)
        } else {
            self.algorithm.refund(&fence.state, shifted, cost, stamp)
        };
        if middle {
            let tat = self.tat_of(&fence.state);
            let mut ledger = Ledger::new(now, shifted, tat, tat.max(fence.bound));
            self.ledger_back(&mut ledger, now, cost, stamp, correcting);
            fence.state = A::State::default();
            fence.ledger = Some(ledger);
        }
    }
}
