use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::KeyedAlgorithm;
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

/// Keyed concurrency counter: at most `limit` units in flight per key.
///
/// The state is one `u64`: the units held now (0 is "absent"). A request of cost `n`
/// acquires `n` permits if `held + n <= limit`; the caller gives them back with
/// [`Concurrency::released`] (in the memory store:
/// [`Store::refund`](crate::store::Store::refund)) when the work ends, for HTTP when the response body ends.
///
/// An in-flight count has no exact retry time. **Design decision:** a denial's
/// `retry_after`, and `reset_after` while permits are held, report the quota's `period` as a
/// hint (so a quota of "10 per second" means 10 in flight, retry in 1 s). The period never
/// limits how long a permit is held. `remaining` is `limit - held`.
///
/// `n > limit` is [`Outcome::CannotFit`]; `n = 0` always passes and holds nothing.
///
/// **Parameters in force:** permits held above a lowered limit stay held (they are requests
/// really in flight); the counter reads as full (remaining 0) and denies until enough are
/// released. A permit is the same whenever it was taken, so a receipt's stamp is unused
/// (0) and a release gives back `min(n, held)`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::Concurrency;
/// use ratekeeper_core::Quota;
///
/// let c = Concurrency::new(&Quota::new(2, Duration::from_secs(1))?);
/// let (first, held) = c.decide(0, 1);
/// let (second, held) = c.decide(held.unwrap(), 1);
/// assert!(first.is_allowed() && second.is_allowed());
/// let (third, none) = c.decide(held.unwrap(), 1);
/// assert_eq!(third.retry_after(), Some(Duration::from_secs(1)));
/// assert_eq!(none, None);
/// assert_eq!(c.released(2, 1), 1);
/// # Ok::<(), ratekeeper_core::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    limit: u32,
    hint: u64,
}

impl Concurrency {
    /// At most `quota.limit()` in flight; `quota.period()` is the retry hint.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            limit: quota.limit(),
            hint: quota.period_nanos(),
        }
    }

    /// Units allowed in flight.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    fn report(&self, outcome: Outcome, held: u64) -> Decision {
        let remaining = u64::from(self.limit).saturating_sub(held);
        let reset = if held > 0 { self.hint } else { 0 };
        Decision::new(
            outcome,
            self.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(reset),
        )
    }

    /// The pure decision over `held` (units in flight; 0 when absent). Returns the decision
    /// and, when permits are taken, the new count.
    pub fn decide(&self, held: u64, cost: u64) -> (Decision, Option<u64>) {
        let limit = u64::from(self.limit);
        let held = held.min(limit);
        if cost > limit {
            (self.report(Outcome::CannotFit, held), None)
        } else if cost == 0 {
            (self.report(Outcome::Allowed, held), None)
        } else if cost <= limit - held {
            let next = held + cost;
            (self.report(Outcome::Allowed, next), Some(next))
        } else {
            let outcome = Outcome::Denied {
                retry_after: Duration::from_nanos(self.hint),
            };
            (self.report(outcome, held), None)
        }
    }

    /// The decision without taking permits.
    pub fn peek(&self, held: u64, cost: u64) -> Decision {
        let (d, _) = self.decide(held, cost);
        self.report(d.outcome(), held.min(u64::from(self.limit)))
    }

    /// The count after releasing `cost` permits.
    pub const fn released(&self, held: u64, cost: u64) -> u64 {
        held.saturating_sub(cost)
    }
}

impl KeyedAlgorithm for Concurrency {
    type State = AtomicU64;

    fn check(&self, state: &AtomicU64, now: u64, cost: u64) -> (Decision, Receipt) {
        let mut current = state.load(Ordering::Acquire);
        loop {
            let (decision, next) = self.decide(current, cost);
            let Some(next) = next else {
                return (decision, Receipt::NONE);
            };
            match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (decision, Receipt::new(now)),
                Err(actual) => current = actual,
            }
        }
    }

    fn peek(&self, state: &AtomicU64, _now: u64, cost: u64) -> Decision {
        Concurrency::peek(self, state.load(Ordering::Acquire), cost)
    }

    fn refund(&self, state: &AtomicU64, _now: u64, cost: u64, _stamp: u64) -> bool {
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            Some(self.released(held, cost))
        });
        false
    }

    /// A permit is a permit: a correction of a permit count only gives back.
    fn debit(&self, _state: &AtomicU64, _now: u64, _extra: u64) {}

    fn is_idle(&self, state: &AtomicU64, _now: u64) -> bool {
        state.load(Ordering::Acquire) == 0
    }

    /// Permits are counted, not stamped: a store tracks the ones taken before a reset.
    fn stale(&self, _bound: u64, _now: u64) -> bool {
        true
    }

    fn permits(&self, state: &AtomicU64) -> u64 {
        state.load(Ordering::Acquire)
    }
}
