use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::leaky_bucket::shaped_cas;
use super::{KeyedAlgorithm, Reserved, Shaped};
use crate::clock::nanos;
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

enum Verdict {
    /// Allowed; store this TAT.
    Charge(u64),
    /// Allowed at no cost; nothing changes.
    Free,
    /// Denied or cannot fit; nothing changes.
    Refuse(Outcome),
}

/// The generic cell rate algorithm (GCRA), a token bucket held in one number.
///
/// Terms (ITU-T I.371 and the ATM Forum TM 4.0 "virtual scheduling" form; see also
/// Brandur Leach, "Rate limiting, cells, and GCRA", 2015): emission interval
/// `T = period / limit`, tolerance `tau = burst * T`, theoretical arrival time `TAT`.
/// All values are `u64` nanoseconds and all arithmetic saturates.
///
/// For a request of cost `n` at `now`:
///
/// ```text
/// tat      = min(max(stored_tat, now), now + tau)  // refills, never beyond burst; the
///                                                  // quota in force bounds what is stored
/// new_tat  = tat + n * T
/// allow_at = new_tat - tau
/// allowed  = allow_at <= now               // then stored_tat := new_tat
/// retry_after (denied) = allow_at - now    // exact
/// remaining = floor((now + tau - tat') / T)  with tat' = new_tat if allowed, else tat
/// reset_after = tat' - now                 // time until the bucket is full again
/// ```
///
/// `n > burst` can never pass ([`Outcome::CannotFit`]) and `n = 0` always passes without
/// charging. Neither changes the state.
///
/// **Advertised quota.** A decision's [`limit`](Decision::limit) is the capacity, `burst`
/// (not the quota's per-period `limit`), so `0 <= remaining <= limit` always holds: a
/// bucket of 10 refilling one per second reports limit 10 and counts down from 9. The
/// matching window is the time an empty bucket takes to refill, `burst * T`
/// ([`Policy::advertised`](crate::Policy::advertised)).
///
/// **Parameters in force.** [`Gcra::decide`] and [`Gcra::peek`] read the stored TAT clamped
/// to `now + tau`, so a TAT written under another quota (a larger period, a larger burst)
/// is never "fuller than full": the longest wait it can cause is the one this quota needs
/// from an empty bucket (`n * T`). For example, a TAT of 3,600 s written under "1 per hour" and
/// read at t = 1 s under "100 per minute, burst 100" (tau = 60 s) is read as 61 s, so the
/// request waits 0.6 s, not an hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Never 0 (a quota's emission interval is at least 1 ns), so divisions by it need no check.
    t: NonZeroU64,
    tau: u64,
    burst: u32,
}

impl Gcra {
    /// GCRA parameters for a quota.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            t: match NonZeroU64::new(quota.emission_interval_nanos()) {
                Some(t) => t,
                None => NonZeroU64::MIN,
            },
            tau: quota.tolerance_nanos(),
            burst: quota.burst(),
        }
    }

    /// Emission interval `T` in nanoseconds.
    pub const fn emission_interval_nanos(&self) -> u64 {
        self.t.get()
    }

    /// Tolerance `tau = burst * T` in nanoseconds.
    pub const fn tolerance_nanos(&self) -> u64 {
        self.tau
    }

    #[inline]
    fn remaining(&self, tat: u64, now: u64) -> u32 {
        let burst = u64::from(self.burst);
        let whole = match now.checked_add(self.tau) {
            // The common case, in u64 (a 128-bit division costs a library call).
            Some(horizon) => horizon.saturating_sub(tat) / self.t,
            None => {
                let room = (u128::from(now) + u128::from(self.tau)).saturating_sub(u128::from(tat));
                u64::try_from(room / u128::from(self.t.get())).unwrap_or(u64::MAX)
            }
        };
        // Never more than the burst (saturation near u64::MAX could otherwise overstate it).
        whole.min(burst) as u32
    }

    /// The stored TAT as the quota in force reads it: `max(stored, now)` (an idle bucket is
    /// full) and at most `now + tau` (never fuller than full; see "Parameters in force").
    #[inline]
    pub const fn in_force(&self, stored_tat: u64, now: u64) -> u64 {
        let horizon = now.saturating_add(self.tau);
        if stored_tat < now {
            now
        } else if stored_tat > horizon {
            horizon
        } else {
            stored_tat
        }
    }

    /// The pure decision: `stored_tat` is the key's state (0 when absent), read through
    /// [`Gcra::in_force`]. Returns the decision and, when the state changes, the new TAT to
    /// store (which is also the stamp of the charge's receipt).
    #[inline]
    pub fn decide(&self, stored_tat: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        self.decide_from(self.in_force(stored_tat, now), now, cost)
    }

    /// [`Gcra::decide`] from `tat = max(stored, now)` read as is. The memory store reads its
    /// state this way: its quota never changes, and a TAT beyond `now + tau` there is a wait
    /// booked by [`Gcra::reserve`], which a check must not take.
    #[inline]
    pub(crate) fn decide_from(&self, tat: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        match self.verdict(tat, now, cost) {
            Verdict::Charge(new_tat) => {
                (self.report(Outcome::Allowed, new_tat, now), Some(new_tat))
            }
            Verdict::Free => (self.report(Outcome::Allowed, tat, now), None),
            Verdict::Refuse(outcome) => (self.report(outcome, tat, now), None),
        }
    }

    /// What [`Gcra::decide`] would answer, without charging: the outcome for `cost`, with
    /// `remaining` and `reset_after` of the state as it is.
    #[inline]
    pub fn peek(&self, stored_tat: u64, now: u64, cost: u64) -> Decision {
        self.peek_from(self.in_force(stored_tat, now), now, cost)
    }

    /// [`Gcra::peek`] from `tat = max(stored, now)` read as is (see [`Gcra::decide_from`]).
    #[inline]
    pub(crate) fn peek_from(&self, tat: u64, now: u64, cost: u64) -> Decision {
        let outcome = match self.verdict(tat, now, cost) {
            Verdict::Charge(_) | Verdict::Free => Outcome::Allowed,
            Verdict::Refuse(outcome) => outcome,
        };
        self.report(outcome, tat, now)
    }

    /// `tat` is already `max(stored, now)`. Works in `u128` so that no intermediate value
    /// saturates into a wrong "allowed"; only a stored TAT beyond `u64::MAX` ns is clamped.
    #[inline]
    fn verdict(&self, tat: u64, now: u64, cost: u64) -> Verdict {
        if cost > u64::from(self.burst) {
            return Verdict::Refuse(Outcome::CannotFit);
        }
        if cost == 0 {
            return Verdict::Free;
        }
        // The common case: no intermediate value leaves u64, so u64 arithmetic is exact and
        // agrees with the u128 path below.
        if let Some(new_tat) = cost
            .checked_mul(self.t.get())
            .and_then(|step| tat.checked_add(step))
        {
            let allow_at = new_tat.saturating_sub(self.tau);
            return if allow_at > now {
                Verdict::Refuse(Outcome::Denied {
                    retry_after: Duration::from_nanos(allow_at - now),
                })
            } else {
                Verdict::Charge(new_tat)
            };
        }
        let new_tat = u128::from(tat) + u128::from(cost) * u128::from(self.t.get());
        let allow_at = new_tat.saturating_sub(u128::from(self.tau));
        if allow_at > u128::from(now) {
            let wait = u64::try_from(allow_at - u128::from(now)).unwrap_or(u64::MAX);
            Verdict::Refuse(Outcome::Denied {
                retry_after: Duration::from_nanos(wait),
            })
        } else {
            Verdict::Charge(u64::try_from(new_tat).unwrap_or(u64::MAX))
        }
    }

    #[inline]
    fn report(&self, outcome: Outcome, tat: u64, now: u64) -> Decision {
        Decision::with_reset_ns(
            outcome,
            self.burst,
            self.remaining(tat, now),
            tat.saturating_sub(now),
        )
    }

    /// The reservation (used by the `Delay` mode): charges `cost` now and says how long to
    /// wait before proceeding, if that wait is at most `max_wait`. Returns the answer and,
    /// when reserved, the new TAT to store. With the terms of [`Gcra`] (ns, saturating):
    ///
    /// ```text
    /// tat      = max(stored, now)
    /// new_tat  = tat + n * T
    /// wait     = max(new_tat - tau - now, 0)        // allow_at - now
    /// reserved = wait <= max_wait                   // stored_tat := new_tat; delay = wait
    /// denied   : retry_after = wait - max_wait      // when a new reservation would fit
    /// ```
    ///
    /// The burst passes at once (delay 0); beyond it, requests are spaced by `T` in the
    /// order they reserve. A reserved decision reports the state after the charge
    /// (`remaining` 0 while it waits). `n > burst` is [`Outcome::CannotFit`] whatever
    /// `max_wait`; `n = 0` passes with no delay and no charge.
    ///
    /// The stored TAT is read as is (`max(stored, now)`, not clamped to `now + tau`): in a
    /// store that reserves, a TAT beyond `now + tau` is waits already booked. Such a store
    /// must therefore not outlive a quota change (the memory store's quotas are fixed).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::Gcra;
    /// use ratekeeper_core::Quota;
    ///
    /// // 2 per second, burst 1 (T = 500 ms); wait at most 1 s.
    /// let gcra = Gcra::new(&Quota::new(2, Duration::from_secs(1))?.with_burst(1)?);
    /// let mut tat = 0;
    /// for expected in [0, 500, 1_000] {
    ///     let (r, next) = gcra.reserve(tat, 0, 1, Duration::from_secs(1));
    ///     assert_eq!(r.delay(), Some(Duration::from_millis(expected)));
    ///     tat = next.unwrap();
    /// }
    /// let (full, unchanged) = gcra.reserve(tat, 0, 1, Duration::from_secs(1));
    /// assert_eq!(full.decision().retry_after(), Some(Duration::from_millis(500)));
    /// assert_eq!(unchanged, None);
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    pub fn reserve(
        &self,
        stored_tat: u64,
        now: u64,
        cost: u64,
        max_wait: Duration,
    ) -> (Shaped, Option<u64>) {
        let tat = stored_tat.max(now);
        if cost > u64::from(self.burst) {
            return (
                Shaped::new(self.report(Outcome::CannotFit, tat, now), None),
                None,
            );
        }
        if cost == 0 {
            return (
                Shaped::new(
                    self.report(Outcome::Allowed, tat, now),
                    Some(Duration::ZERO),
                ),
                None,
            );
        }
        let max_wait = nanos(max_wait);
        let step = u64::try_from(u128::from(cost) * u128::from(self.t.get())).unwrap_or(u64::MAX);
        let new_tat = tat.saturating_add(step);
        let wait = new_tat.saturating_sub(self.tau).saturating_sub(now);
        if wait <= max_wait {
            let decision = self.report(Outcome::Allowed, new_tat, now);
            (
                Shaped::new(decision, Some(Duration::from_nanos(wait))),
                Some(new_tat),
            )
        } else {
            let outcome = Outcome::Denied {
                retry_after: Duration::from_nanos(wait - max_wait),
            };
            (Shaped::new(self.report(outcome, tat, now), None), None)
        }
    }

    /// The TAT after giving back what the charge of `cost` units whose receipt stamp is
    /// `stamp` (the TAT that charge stored) still holds at `now`.
    ///
    /// A charge of `n` units took the slot `(stamp - n * T, stamp]` of the bucket's
    /// schedule, which drains from the front one unit per `T`. With the terms of [`Gcra`]
    /// (ns, saturating):
    ///
    /// ```text
    /// stored <= now      : unchanged                  // drained: the charge holds nothing
    /// stored == stamp    : stored - n * T             // the latest charge: undo it (a TAT
    ///                                                 // below now reads as "absent", so
    ///                                                 // only the undrained part counts)
    /// stored - tau > now : unchanged                  // a later reservation still waits
    /// otherwise          : stored - min(n * T, min(stamp, stored) - now)
    /// ```
    ///
    /// Exact under the FIFO ledger (see [`Receipt`]) as long as every slot still lies where
    /// its stamp says: the charge is the latest, or the bucket drained it, or no charge
    /// before the latest was ever refunded with a part still undrained. The last rule is a
    /// refund out of the middle: it moves the slots after the charge up, so their stamps
    /// then lie above their slots by an amount one TAT cannot record, and a later refund
    /// read by these rules could give back part of another charge. A store that keeps the
    /// promise for every order of refunds (the memory and Redis stores do) applies the last
    /// rule to an explicit ledger of the key's slots instead of the TAT.
    ///
    /// Why the third rule: a TAT beyond `now + tau` means a reservation made after this
    /// charge is booked for a later slot. Pulling the TAT back would let a newcomer in at
    /// the instant that waiter proceeds, so two requests would pass closer than `T` (the
    /// Delay-mode defect of a dropped waiter). The dropped slot stays unused instead: the
    /// refund gives back nothing rather than someone else's turn. In the last rule every
    /// later charge has proceeded: the TAT moves back by at most the undrained part of this
    /// charge and never below `now` (a charge the bucket already drained gives back
    /// nothing).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::Gcra;
    /// use ratekeeper_core::Quota;
    ///
    /// // 2 per minute, burst 2: T = 30 s, tau = 60 s. A charge at t = 0 stores TAT 30 s.
    /// let gcra = Gcra::new(&Quota::new(2, Duration::from_secs(60))?);
    /// let s = 1_000_000_000;
    /// let (_, tat) = gcra.decide(0, 0, 1);
    /// let stamp = tat.unwrap();
    /// // Refunded at 10 s with no later charge: the charge is undone.
    /// assert_eq!(gcra.refunded(stamp, 10 * s, 1, stamp), 0);
    /// // At 120 s the bucket drained it long ago, and two new charges filled the bucket
    /// // (TAT 180 s): the late refund gives back nothing.
    /// assert_eq!(gcra.refunded(180 * s, 120 * s, 1, stamp), 180 * s);
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    #[inline]
    pub fn refunded(&self, stored_tat: u64, now: u64, cost: u64, stamp: u64) -> u64 {
        if stored_tat > now && stored_tat != stamp && stored_tat.saturating_sub(self.tau) > now {
            return stored_tat;
        }
        self.given_back(stored_tat, now, cost, stamp)
    }

    /// The TAT after a correction gives back `cost` units of the charge whose receipt stamp
    /// is `stamp` (a charge whose true cost came out lower than its estimate): the rules of
    /// [`Gcra::refunded`] without the third one. A TAT beyond `now + tau` is then read as a
    /// debt left by extra charges ([`Gcra::debited`]), which the give-back pays off, rather
    /// than as turns booked by reservations:
    ///
    /// ```text
    /// stored <= now      : unchanged                  // drained: the charge holds nothing
    /// stored == stamp    : stored - n * T             // the latest charge
    /// otherwise          : stored - min(n * T, min(stamp, stored) - now)
    /// ```
    ///
    /// A Delay-mode reservation waiting beyond the tolerance keeps its own turn; the units
    /// given back may go to a later request before it (they are the corrected charge's own,
    /// so the quota holds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::Gcra;
    /// use ratekeeper_core::Quota;
    ///
    /// // 10 per 10 s, burst 10: T = 1 s, tau = 10 s. An estimate of 5 at t = 0 (TAT 5 s),
    /// // then 11 units charged on top by another correction: TAT 16 s, 6 s beyond
    /// // now + tau (a debt of 6 units).
    /// let gcra = Gcra::new(&Quota::new(10, Duration::from_secs(10))?);
    /// let s = 1_000_000_000;
    /// let (_, tat) = gcra.decide(0, 0, 5);
    /// let stamp = tat.unwrap();
    /// let in_debt = gcra.debited(stamp, 0, 11);
    /// assert_eq!(in_debt, 16 * s);
    /// // The estimate was 3 too high: 3 s of the debt are paid off.
    /// assert_eq!(gcra.given_back(in_debt, 0, 3, stamp), 13 * s);
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    #[inline]
    pub fn given_back(&self, stored_tat: u64, now: u64, cost: u64, stamp: u64) -> u64 {
        if stored_tat <= now {
            return stored_tat;
        }
        let step = u64::try_from(u128::from(cost) * u128::from(self.t.get())).unwrap_or(u64::MAX);
        if stored_tat == stamp {
            return stamp.saturating_sub(step);
        }
        let undrained = stamp.min(stored_tat).saturating_sub(now);
        stored_tat - step.min(undrained)
    }

    /// The TAT after charging `extra` units at `now` without refusing (a correction whose
    /// true cost came out higher than its estimate): `max(stored, now) + extra * T`
    /// (saturating). The TAT may go beyond `now + tau`: the debt is waited out, a later
    /// charge of `n` passing once `TAT + n * T - tau <= now`.
    #[inline]
    pub fn debited(&self, stored_tat: u64, now: u64, extra: u64) -> u64 {
        let step = u64::try_from(u128::from(extra) * u128::from(self.t.get())).unwrap_or(u64::MAX);
        stored_tat.max(now).saturating_add(step)
    }
}

impl KeyedAlgorithm for Gcra {
    type State = AtomicU64;

    /// The common case (`0 < cost <= burst`, every value within `u64` ns) is worked out in
    /// ns here, with the decision's fields computed once, after the compare-and-swap; the
    /// rest goes through [`Gcra::decide_from`] ([`Gcra::check_general`]). Both give the same
    /// answer (a property test compares them).
    #[inline]
    fn check(&self, state: &AtomicU64, now: u64, cost: u64) -> (Decision, Receipt) {
        let burst = u64::from(self.burst);
        let (Some(step), Some(horizon), true) = (
            cost.checked_mul(self.t.get()),
            now.checked_add(self.tau),
            cost != 0 && cost <= burst,
        ) else {
            return self.check_general(state, now, cost);
        };
        let mut current = state.load(Ordering::Acquire);
        loop {
            let tat = current.max(now);
            let Some(new_tat) = tat.checked_add(step) else {
                return self.check_general(state, now, cost);
            };
            let allow_at = new_tat.saturating_sub(self.tau);
            if allow_at > now {
                // Denied, so `horizon - tat < cost * T`: fewer than `cost` whole intervals,
                // none at all for a cost of 1 (the usual denial; a 64-bit division costs
                // more than the rest of the decision). `remaining <= burst`: the cast keeps it.
                let room = horizon.saturating_sub(tat);
                let remaining = if room < self.t.get() {
                    0
                } else {
                    (room / self.t).min(burst) as u32
                };
                let denied = Decision::denied_ns(allow_at - now, self.burst, remaining, tat - now);
                return (denied, Receipt::NONE);
            }
            match state.compare_exchange_weak(current, new_tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // Allowed: `new_tat <= now + tau = horizon`.
                    let remaining = ((horizon - new_tat) / self.t).min(burst) as u32;
                    let allowed = Decision::allowed_ns(self.burst, remaining, new_tat - now);
                    return (allowed, Receipt::new(new_tat));
                }
                Err(actual) => current = actual,
            }
        }
    }

    fn peek(&self, state: &AtomicU64, now: u64, cost: u64) -> Decision {
        self.peek_from(state.load(Ordering::Acquire).max(now), now, cost)
    }

    /// Applies [`Gcra::refunded`] unless it is a refund out of the middle (see
    /// [`KeyedAlgorithm::refund`]), which changes nothing and returns true.
    fn refund(&self, state: &AtomicU64, now: u64, cost: u64, stamp: u64) -> bool {
        settle(state, stamp, |tat| self.refunded(tat, now, cost, stamp))
    }

    /// As [`KeyedAlgorithm::refund`], by [`Gcra::given_back`].
    fn give_back(&self, state: &AtomicU64, now: u64, cost: u64, stamp: u64) -> bool {
        settle(state, stamp, |tat| self.given_back(tat, now, cost, stamp))
    }

    fn debit(&self, state: &AtomicU64, now: u64, extra: u64) {
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            Some(self.debited(tat, now, extra))
        });
    }

    fn is_idle(&self, state: &AtomicU64, now: u64) -> bool {
        state.load(Ordering::Acquire) <= now
    }

    fn headroom(&self) -> u64 {
        self.tau
    }

    fn stamp_bound(&self, now: u64) -> u64 {
        now.saturating_add(self.tau)
    }

    /// A stamp is at least `now + T` (`T >= 1`), so a shift of `bound - now` suffices.
    fn fence_shift(&self, bound: u64, now: u64) -> u64 {
        bound.saturating_sub(now)
    }

    /// A stamp at or before `now` is drained: it takes nothing from any state.
    fn stale(&self, bound: u64, now: u64) -> bool {
        bound <= now
    }

    fn reserve(&self, state: &AtomicU64, now: u64, cost: u64, max_wait: u64) -> Reserved {
        shaped_cas(state, |tat| {
            Gcra::reserve(self, tat, now, cost, Duration::from_nanos(max_wait))
        })
    }

    fn tat_cell<'a>(&self, state: &'a AtomicU64) -> Option<&'a AtomicU64> {
        Some(state)
    }

    fn slot(&self, cost: u64) -> u64 {
        cost.saturating_mul(self.t.get())
    }
}

/// Moves the TAT in `state` to `back(tat)` unless that is a refund out of the middle: a
/// charge other than the latest (`tat != stamp`) whose give-back would pull the TAT back,
/// which would leave the stamps of the charges after it above their slots. Such a refund
/// changes nothing and returns true (the store settles it on the key's ledger).
pub(super) fn settle(state: &AtomicU64, stamp: u64, back: impl Fn(u64) -> u64) -> bool {
    let mut middle = false;
    let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
        let next = back(tat);
        middle = next != tat && tat != stamp;
        (next != tat && !middle).then_some(next)
    });
    middle
}

impl Gcra {
    /// [`KeyedAlgorithm::check`] for every input, through [`Gcra::decide_from`]: costs of 0 or
    /// beyond the burst, values near `u64::MAX` ns.
    #[cold]
    #[inline(never)]
    fn check_general(&self, state: &AtomicU64, now: u64, cost: u64) -> (Decision, Receipt) {
        let mut current = state.load(Ordering::Acquire);
        loop {
            let (decision, next) = self.decide_from(current.max(now), now, cost);
            let Some(next) = next else {
                return (decision, Receipt::NONE);
            };
            match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (decision, Receipt::new(next)),
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
#[path = "gcra_tests.rs"]
mod tests;
