//! [`Ledger`]: the explicit FIFO schedule of a GCRA (or leaky-bucket) key whose stamps no
//! longer tell where its charges stand.

/// The most spans a [`Ledger`] keeps. Past it, the smallest hole between two spans is
/// filled again (the refunds that cut it are undone for that time): the key may then wait
/// longer than its exact schedule says, never less, and no refund ever gives back another
/// charge's time. Each span holds part of at least one live charge, so a schedule of at
/// most 1,024 live charges never reaches the bound (with checks alone, a burst of at most
/// 1,024). A span is 16 bytes here and about 30 characters in a Redis value.
pub(crate) const MAX_SPANS: usize = 1024;

/// The schedule of one GCRA key as a FIFO ledger of slots.
///
/// A charge of `n` units takes the slot `(stamp - n * T, stamp]` in the coordinates of the
/// stamps; the bucket drains the live slots from the front, one unit of time per unit of
/// time; a refund takes out its slot's live part and the slots after it move up. The key's
/// TAT is `now + live` (the total live length). `spans` are the live parts of the
/// schedule, oldest first, disjoint, increasing and non-empty: holes between them are
/// slots refunded out of the middle. New slots are placed from `next` on, so no slot
/// handed out ever overlaps another, and a refund takes out exactly what its own charge
/// still holds.
///
/// All values are in the store's time unit, saturating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// `(from, to]` live parts of the schedule, oldest first.
    spans: Vec<(u64, u64)>,
    /// The time up to which the front has drained.
    at: u64,
    /// Where the next slot starts: at or above every stamp this ledger handed out.
    next: u64,
}

impl Ledger {
    /// The ledger of a key whose live schedule at `now` is `(from, to]` (nothing when
    /// `to <= from`), every stamp handed out so far at or below `next`.
    pub(crate) fn new(now: u64, from: u64, to: u64, next: u64) -> Self {
        let spans = if to > from {
            vec![(from, to)]
        } else {
            Vec::new()
        };
        Self {
            spans,
            at: now,
            next: next.max(to),
        }
    }

    /// Drains the front up to `now` (a time before the last one drains nothing).
    pub(crate) fn drain(&mut self, now: u64) {
        let mut left = now.saturating_sub(self.at);
        self.at = self.at.max(now);
        let mut gone = 0;
        for span in &mut self.spans {
            if left == 0 {
                break;
            }
            let len = span.1 - span.0;
            if left >= len {
                left -= len;
                gone += 1;
            } else {
                span.0 += left;
                left = 0;
            }
        }
        self.spans.drain(..gone);
    }

    /// The total live length (the time until the bucket is empty, from the last drain).
    pub(crate) fn live(&self) -> u64 {
        self.spans
            .iter()
            .fold(0u64, |sum, (from, to)| sum.saturating_add(to - from))
    }

    /// The TAT at `now`: `now + live` once drained to `now` (the front drains, so what is
    /// left is the live length less the time passed).
    pub(crate) fn tat(&self, now: u64) -> u64 {
        let live = self.live().saturating_sub(now.saturating_sub(self.at));
        self.at.max(now).saturating_add(live)
    }

    /// Whether the schedule is empty at `now` (without draining).
    pub(crate) fn is_idle(&self, now: u64) -> bool {
        self.at.saturating_add(self.live()) <= now
    }

    /// At or above every stamp this ledger handed out.
    pub(crate) const fn next(&self) -> u64 {
        self.next
    }

    /// Appends a slot of `len` at the end of the schedule (after draining to `now`);
    /// returns its stamp (the end of the slot).
    pub(crate) fn push(&mut self, now: u64, len: u64) -> u64 {
        self.drain(now);
        if len == 0 {
            return self.next;
        }
        // An empty schedule starts at `now` at the earliest, so that `next` stays near the
        // time while the key is idle.
        let from = if self.spans.is_empty() {
            self.next.max(now)
        } else {
            self.next
        };
        let to = from.saturating_add(len);
        match self.spans.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => {
                self.spans.push((from, to));
                self.bound();
            }
        }
        self.next = to;
        to
    }

    /// Appends a slot of `len` that no receipt names, placed above `floor` (and above every
    /// stamp handed out): time charged on another state of the key that joins this one.
    pub(crate) fn push_above(&mut self, now: u64, floor: u64, len: u64) {
        self.next = self.next.max(floor);
        self.push(now, len);
    }

    /// Gives back up to `len` of the charge whose slot ends at `stamp`, at `now`: the live
    /// time at or below `stamp`, from the top down, comes out of the schedule (the slots
    /// after it move up); returns how much. A charge's slot is cut only by the drain (from
    /// its front) and by its own give-backs (from its top), so its live part is the live time
    /// right below the dead top of its slot, and as long as a charge's give-backs total at
    /// most its cost, none of them reaches an earlier charge's slot. With `keep_turns =
    /// Some(tau)` (a refund, not a correction), a charge with live slots after it gives back
    /// nothing while the schedule reaches beyond `now + tau`: a later reservation waits for
    /// its turn, which moving up would hand to a newcomer.
    pub(crate) fn give_back(
        &mut self,
        now: u64,
        len: u64,
        stamp: u64,
        keep_turns: Option<u64>,
    ) -> u64 {
        self.drain(now);
        if let Some(tau) = keep_turns {
            let later = self.spans.last().is_some_and(|last| last.1 > stamp);
            if later && self.live() > tau {
                return 0;
            }
        }
        self.take_below(stamp, len)
    }

    /// Takes up to `len` of the live time at or below `stamp`, from the top down; returns
    /// the length taken.
    fn take_below(&mut self, stamp: u64, len: u64) -> u64 {
        let mut left = len;
        let mut i = self.spans.len();
        while i > 0 && left > 0 {
            i -= 1;
            let (a, b) = self.spans[i];
            if a >= stamp {
                continue;
            }
            let hi = b.min(stamp);
            let lo = hi.saturating_sub(left).max(a);
            left -= hi - lo;
            // (a, b] less (lo, hi]: what is left below and above the cut.
            match (a < lo, hi < b) {
                (true, true) => {
                    self.spans[i] = (a, lo);
                    self.spans.insert(i + 1, (hi, b));
                }
                (true, false) => self.spans[i] = (a, lo),
                (false, true) => self.spans[i] = (hi, b),
                (false, false) => {
                    self.spans.remove(i);
                }
            }
        }
        let taken = len - left;
        if taken > 0 {
            self.bound();
        }
        taken
    }

    /// Fills holes while there are more than [`MAX_SPANS`] spans (see there).
    fn bound(&mut self) {
        while self.spans.len() > MAX_SPANS {
            let mut best = 0;
            for i in 1..self.spans.len() - 1 {
                let gap = |j: usize| self.spans[j + 1].0 - self.spans[j].1;
                if gap(i) < gap(best) {
                    best = i;
                }
            }
            self.spans[best].1 = self.spans[best + 1].1;
            self.spans.remove(best + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_out_of_the_middle_moves_the_later_slots_up() {
        // Two slots of 200 at 0: (0, 200], (200, 400].
        let mut l = Ledger::new(0, 0, 0, 0);
        assert_eq!(l.push(0, 200), 200);
        assert_eq!(l.push(0, 200), 400);
        // The first is refunded: the second now drains first.
        assert_eq!(l.give_back(0, 200, 200, None), 200);
        assert_eq!(l.tat(0), 200);
        // A third slot is placed after every stamp handed out.
        assert_eq!(l.push(0, 200), 600);
        // 1 later, the second holds 199, the third 200.
        assert_eq!(l.give_back(1, 200, 400, None), 199);
        assert_eq!(l.give_back(1, 200, 600, None), 200);
        assert!(l.is_idle(1));
    }

    #[test]
    fn a_drained_slot_gives_back_nothing_and_a_partly_drained_one_its_rest() {
        let mut l = Ledger::new(0, 0, 300, 300);
        assert_eq!(l.give_back(300, 100, 100, None), 0);
        let mut l = Ledger::new(0, 0, 300, 300);
        // At 150 the second slot (100, 200] is half drained.
        assert_eq!(l.give_back(150, 100, 200, None), 50);
        assert_eq!(l.tat(150), 250);
    }

    #[test]
    fn give_backs_of_one_charge_come_off_its_own_slot_from_the_top() {
        // (0, 100], (100, 400]: the second charge (300) gives back 100, then 150, then the
        // 50 it has left; the first charge's slot stays whole.
        let mut l = Ledger::new(0, 0, 400, 400);
        assert_eq!(l.give_back(0, 100, 400, None), 100);
        assert_eq!(l.give_back(0, 150, 400, None), 150);
        assert_eq!(l.give_back(0, 50, 400, None), 50);
        assert_eq!(l.tat(0), 100);
    }

    #[test]
    fn a_waiting_later_turn_keeps_a_refund_from_moving_it_up() {
        // tau 100; three slots of 100 at 0 (the last two booked beyond the tolerance).
        let mut l = Ledger::new(0, 0, 300, 300);
        assert_eq!(l.give_back(0, 100, 100, Some(100)), 0);
        // The latest slot may go: nothing waits after it.
        assert_eq!(l.give_back(0, 100, 300, Some(100)), 100);
        // A correction pays off whatever it can.
        assert_eq!(l.give_back(0, 100, 100, None), 100);
    }

    #[test]
    fn past_the_bound_holes_fill_and_refunds_give_back_only_their_own() {
        let mut l = Ledger::new(0, 0, 0, 0);
        let stamps: Vec<u64> = (0..2 * MAX_SPANS as u64 + 2)
            .map(|_| l.push(0, 10))
            .collect();
        // Every other slot refunded: a hole before each kept one, one past the bound.
        for s in stamps.iter().step_by(2) {
            assert_eq!(l.give_back(0, 10, *s, None), 10);
        }
        assert_eq!(l.spans.len(), MAX_SPANS);
        // One hole was filled again: the schedule is one slot longer than exact.
        assert_eq!(l.live(), 10 * (MAX_SPANS as u64 + 2));
        // Each kept slot still gives back its own 10, and nothing of another's.
        for s in stamps.iter().skip(1).step_by(2) {
            assert_eq!(l.give_back(0, 10, *s, None), 10);
        }
        assert_eq!(l.live(), 10);
    }
}
