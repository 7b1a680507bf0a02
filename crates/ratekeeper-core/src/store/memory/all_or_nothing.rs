//! Several charges at once: the all-or-nothing check or reservation of a
//! [`MemoryStore`], key by key, with its rollback by receipts and the refusal it reports.

use std::hash::Hash;

use smallvec::SmallVec;

use super::MemoryStore;
use super::keyed::{Slot, with_keyed};
use crate::Decision;
use crate::algorithm::Reserved;
use crate::clock::Clock;
use crate::store::{Charge, Decisions, Receipt, StoreError};

impl<K, C> MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    pub(super) fn reserve_at(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
        max_wait: u64,
    ) -> Result<Decisions, StoreError> {
        self.all_or_nothing(
            charges,
            now,
            true,
            |slot, c| with_keyed!(slot, k => k.reserve(c.key, now, c.cost, max_wait)),
        )
    }

    /// Charges every charge with `charge` (a check or a reservation), all-or-nothing: at the
    /// first denial, the charges already taken are given back with their receipts (latest
    /// first) and every policy reports its state as it now is. A denial is final when
    /// `reserving` and the algorithm reserved exactly or the cost can never fit.
    ///
    /// Charges are taken key by key: every charge of the request's first key (in request
    /// order), then those of the next key, the order in which a shared store, which decides
    /// one client key per atomic call, takes them; so when several charges would be refused,
    /// every store names the same one as the refusal and the others report their state.
    #[inline(never)]
    pub(super) fn all_or_nothing(
        &self,
        charges: &[Charge<'_, K>],
        now: u64,
        reserving: bool,
        charge: impl Fn(&Slot<K>, &Charge<'_, K>) -> Reserved,
    ) -> Result<Decisions, StoreError> {
        // The policies' entries, looked up once for the whole call.
        let entries = self.reg.entries();
        let slot_of = |c: &Charge<'_, K>| {
            entries
                .get(c.policy.index())
                .map(|e| &e.1)
                .ok_or(StoreError::UnknownPolicy(c.policy))
        };
        for c in charges {
            slot_of(c)?;
        }
        // Key by key: each charge ranked by the first charge of its key, then its own index.
        // One or two charges are key by key in request order, whatever their keys.
        let ranked: SmallVec<[usize; 4]>;
        let order: &[usize] = match IN_ORDER.get(..charges.len()) {
            Some(order) => order,
            None => {
                ranked = by_key(charges);
                &ranked
            }
        };
        let mut taken: SmallVec<[(usize, Decision, Receipt); 2]> = SmallVec::new();
        let mut delay = 0;
        for &i in order {
            let c = &charges[i];
            let r = charge(slot_of(c)?, c);
            if r.decision.is_denied() {
                for &(j, _, receipt) in taken.iter().rev() {
                    let prev = &charges[j];
                    with_keyed!(slot_of(prev)?, k => k.refund(prev.key, now, prev.cost, receipt));
                }
                let refused = self.refusal(charges, i, r.decision, now, reserving)?;
                let mut report = SmallVec::<[Decision; 4]>::new();
                for (j, other) in charges.iter().enumerate() {
                    if j == i {
                        report.push(refused);
                    } else {
                        let slot = slot_of(other)?;
                        report.push(with_keyed!(slot, k => k.peek(other.key, now, other.cost)));
                    }
                }
                let is_final = reserving && (r.exact || refused.is_cannot_fit());
                return Ok(Decisions::new(report).with_final(is_final));
            }
            delay = r.delay.max(delay);
            taken.push((i, r.decision, r.receipt));
        }
        if order.len() > IN_ORDER.len() {
            taken.sort_unstable_by_key(|&(i, ..)| i);
        }
        Ok(
            Decisions::with_receipts(taken.into_iter().map(|(_, d, r)| (d, r)))
                .with_delay(std::time::Duration::from_nanos(delay)),
        )
    }

    /// The decision reported for charge `i`, refused with `decision` after the charges
    /// before it were given back.
    ///
    /// Charges of one request on the same policy and key (a duplicate charge) are
    /// cumulative: each is judged on the state the earlier ones left. When such a charge is
    /// refused, its outcome stays that judgement (`retry_after` is the time until the whole
    /// request fits), except that a total above the capacity can never fit
    /// ([`Outcome::CannotFit`](crate::Outcome::CannotFit)) whatever each cost alone; its
    /// `remaining` and `reset_after` are the state as it is, since the earlier charges were
    /// given back. A charge without an earlier one on its policy and key reports `decision`.
    /// GCRA reservations (`reserving`) are the exception to the capacity rule: each charge
    /// books its own turn, so their total may exceed the burst.
    fn refusal(
        &self,
        charges: &[Charge<'_, K>],
        i: usize,
        decision: Decision,
        now: u64,
        reserving: bool,
    ) -> Result<Decision, StoreError> {
        let Some(c) = charges.get(i) else {
            return Ok(decision);
        };
        let earlier = charges[..i]
            .iter()
            .filter(|p| p.policy == c.policy && p.key == c.key);
        let (count, total) = earlier.fold((0usize, c.cost), |(n, sum), p| {
            (n + 1, sum.saturating_add(p.cost))
        });
        if count == 0 {
            return Ok(decision);
        }
        let slot = self.slot(c.policy)?;
        let state = with_keyed!(slot, k => k.peek(c.key, now, c.cost));
        let books_turns = reserving
            && self
                .policy(c.policy)
                .is_some_and(|p| p.algorithm() == crate::Algorithm::Gcra);
        let outcome =
            if !books_turns && with_keyed!(slot, k => k.peek(c.key, now, total)).is_cannot_fit() {
                crate::Outcome::CannotFit
            } else {
                decision.outcome()
            };
        Ok(Decision::new(
            outcome,
            state.limit(),
            state.remaining(),
            state.reset_after(),
        ))
    }
}

/// The order of one or two charges: request order, which is key by key (the second charge's
/// key is either the first's or a later one).
const IN_ORDER: [usize; 2] = [0, 1];

/// The indices of `charges` key by key: each charge ranked by the first charge of its key,
/// then by its own index.
fn by_key<K: Eq>(charges: &[Charge<'_, K>]) -> SmallVec<[usize; 4]> {
    let mut order: SmallVec<[usize; 4]> = (0..charges.len()).collect();
    order.sort_by_key(|&i| {
        let first = charges
            .iter()
            .position(|c| c.key == charges[i].key)
            .unwrap_or(i);
        (first, i)
    });
    order
}
