//! One lease: the units an instance holds for one (policy, client key), its local rate and
//! its cached denial. Times are ns on the Redis store's decision clock.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::store::Receipt;
use crate::{Decision, Outcome};

/// Receipts of units spent from a lease carry this bit (Redis stamps stay below 2^53), with
/// the lease's generation in the other bits.
pub(super) const LEASE_BIT: u64 = 1 << 63;

/// What a policy needs for local decisions.
#[derive(Debug, Clone, Copy)]
pub(super) struct TierPolicy {
    /// The reported limit (the Redis store's, so headers agree).
    pub(super) limit: u32,
    /// The most `remaining` can be.
    pub(super) capacity: u32,
    /// Fixed window (else GCRA): leased units expire when their window ends.
    pub(super) fixed_window: bool,
    /// The policy has a [`Ban`](crate::Ban): never leased, every check goes to Redis.
    pub(super) ban: bool,
}

/// A lease and the single-flight lock of its renewals.
#[derive(Debug, Default)]
pub(super) struct Lease {
    state: Mutex<LeaseState>,
    /// Held by the one renewal in flight; requests that find no units wait on it.
    pub(super) renew: tokio::sync::Mutex<()>,
}

impl Lease {
    pub(super) fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Units to give back to Redis: how many, and the receipt of the grant they came from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unused {
    pub(super) units: u64,
    pub(super) receipt: Receipt,
}

#[derive(Debug, Default)]
pub(super) struct LeaseState {
    /// Units held (charged in Redis, not spent yet).
    units: u64,
    /// 0: no lease; otherwise the generation stamped into local receipts.
    generation: u64,
    /// The Redis receipt of the latest grant (a refund of the unused units uses it).
    receipt: Receipt,
    /// When the held units go back to Redis.
    expires_at: u64,
    /// Redis `remaining` right after the latest grant.
    remaining: u32,
    /// When the Redis state resets (as of the latest grant).
    reset_at: u64,
    /// A denial from Redis, reused for costs at least `deny_cost` until `deny_until`.
    deny: Option<(Decision, u64)>,
    deny_until: u64,
    deny_cost: u64,
    /// Units asked in the current rate period, and in the one before.
    period_start: u64,
    period_units: u64,
    last_units: u64,
    /// A background renewal was started and has not finished.
    pub(super) prefetching: bool,
    /// No background renewal before this time: the last one found nothing to take ahead
    /// (the key is in the lower half of its bucket or window).
    pub(super) prefetch_after: u64,
    /// The last time a request asked for this key.
    pub(super) last_used: u64,
    /// When the sweeper visits this lease next (0: no visit owed).
    pub(super) visit_at: u64,
    /// The generation that ended last and the receipt of its latest grant: a correction's
    /// give-back of units spent from it goes to Redis by that receipt.
    ended: Option<(u64, Receipt)>,
}

impl LeaseState {
    /// Counts `cost` units asked at `now` towards the local rate.
    pub(super) fn observe(&mut self, now: u64, cost: u64, period: u64) {
        if now.saturating_sub(self.period_start) >= period {
            self.last_units = if now.saturating_sub(self.period_start) < 2 * period {
                self.period_units
            } else {
                0
            };
            self.period_start = now;
            self.period_units = 0;
        }
        self.period_units = self.period_units.saturating_add(cost);
        self.last_used = now;
    }

    /// The lease size for the key's local rate: the units asked in one rate period (the
    /// busier of the current and the previous one), between 1 and `max`.
    pub(super) fn target(&self, max: u64) -> u64 {
        self.last_units.max(self.period_units).clamp(1, max)
    }

    /// The units held right now (0 once the lease has expired).
    pub(super) fn held(&self, now: u64) -> u64 {
        if self.generation != 0 && now < self.expires_at {
            self.units
        } else {
            0
        }
    }

    /// Nothing held, nothing in flight, no request for a TTL: the entry can go.
    pub(super) fn is_idle(&self, now: u64, ttl: u64) -> bool {
        now.saturating_sub(self.last_used) >= ttl && self.held(now) == 0 && !self.prefetching
    }

    /// When the sweeper should look at this lease again: when its units expire, or when it
    /// has been idle for a TTL.
    pub(super) fn next_visit(&self, ttl: u64) -> u64 {
        if self.generation != 0 && self.units > 0 {
            self.expires_at
        } else {
            self.last_used.saturating_add(ttl)
        }
    }

    /// Ends an expired lease: the units to give back (if any).
    pub(super) fn expire(&mut self, now: u64) -> Option<Unused> {
        if self.generation == 0 || now < self.expires_at {
            return None;
        }
        self.take()
    }

    /// Ends the lease now (shutdown, sweep): the units to give back (if any).
    pub(super) fn take(&mut self) -> Option<Unused> {
        let units = std::mem::take(&mut self.units);
        let receipt = std::mem::take(&mut self.receipt);
        self.end_generation(receipt);
        self.generation = 0;
        (units > 0 && receipt.is_some()).then_some(Unused { units, receipt })
    }

    fn local(&self, policy: TierPolicy, now: u64) -> Decision {
        let remaining = u64::from(self.remaining)
            .saturating_add(self.units)
            .min(u64::from(policy.capacity));
        Decision::new(
            Outcome::Allowed,
            policy.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(self.reset_at.saturating_sub(now)),
        )
    }

    /// Spends `cost` held units: the decision and its receipt, or `None` when too few are
    /// held.
    pub(super) fn spend(
        &mut self,
        now: u64,
        cost: u64,
        policy: TierPolicy,
    ) -> Option<(Decision, Receipt)> {
        if self.held(now) < cost {
            return None;
        }
        self.units -= cost;
        Some((
            self.local(policy, now),
            Receipt::new(LEASE_BIT | self.generation),
        ))
    }

    /// The cached Redis denial for `cost` at `now`, with `retry_after` counted down.
    pub(super) fn denied(&self, now: u64, cost: u64) -> Option<Decision> {
        let (d, at) = self.deny?;
        if now >= self.deny_until || cost < self.deny_cost || self.held(now) >= cost {
            return None;
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(at));
        let outcome = match d.outcome() {
            Outcome::Denied { retry_after } => Outcome::Denied {
                retry_after: retry_after.saturating_sub(elapsed),
            },
            other => other,
        };
        Some(Decision::new(
            outcome,
            d.limit(),
            d.remaining(),
            d.reset_after().saturating_sub(elapsed),
        ))
    }

    /// Forgets the remembered denial (units went back to Redis).
    pub(super) fn forget_denial(&mut self) {
        self.deny = None;
    }

    /// Remembers a Redis denial of `cost` at `now`, until its `retry_after` or for at most
    /// `bound` ns (the time in which units leased by other instances come back), whichever
    /// is sooner.
    pub(super) fn remember_denial(&mut self, now: u64, cost: u64, decision: Decision, bound: u64) {
        if let Some(retry) = decision.retry_after() {
            self.deny = Some((decision, now));
            self.deny_until = now.saturating_add(super::nanos(retry).min(bound));
            self.deny_cost = cost;
        }
    }

    /// Adds a grant of `granted` units taken at `now`; the lease lives until `expires_at`.
    /// Starts a new generation when no lease was live (none yet, ended, or expired); a live
    /// lease that ran dry keeps its generation, so the units spent from it can still come
    /// back into it.
    pub(super) fn add(
        &mut self,
        now: u64,
        granted: u64,
        decision: Decision,
        receipt: Receipt,
        expires_at: u64,
        generation: impl FnOnce() -> u64,
    ) {
        if self.generation == 0 || now >= self.expires_at {
            self.end_generation(self.receipt);
            self.units = 0;
            self.generation = generation();
        }
        self.units = self.units.saturating_add(granted);
        self.receipt = receipt;
        self.expires_at = expires_at;
        self.remaining = decision.remaining();
        self.reset_at = now.saturating_add(super::nanos(decision.reset_after()));
        self.deny = None;
    }

    /// Remembers the generation ending now with the receipt of its latest grant.
    fn end_generation(&mut self, receipt: Receipt) {
        if self.generation != 0 && receipt.is_some() {
            self.ended = Some((self.generation, receipt));
        }
    }

    /// The receipt of the latest grant of `generation` (the units spent from it are
    /// charged in Redis under that grant) when it is this lease's generation (live or
    /// expired) or the generation that ended last.
    pub(super) fn grant_of(&self, generation: u64) -> Option<Receipt> {
        if generation != 0 && generation == self.generation && self.receipt.is_some() {
            return Some(self.receipt);
        }
        self.ended
            .and_then(|(g, receipt)| (g == generation).then_some(receipt))
    }

    /// Spends up to `units` held units without a decision (a correction's extra charge):
    /// how many it took (at most what is held).
    pub(super) fn consume(&mut self, now: u64, units: u64) -> u64 {
        let taken = self.held(now).min(units);
        self.units -= taken;
        taken
    }

    /// Gives `cost` units spent from generation `generation` back to the lease, when it is
    /// still live. Whether they were taken back.
    pub(super) fn give_back(&mut self, now: u64, generation: u64, cost: u64) -> bool {
        if generation == 0 || self.generation != generation || now >= self.expires_at {
            return false;
        }
        self.units = self.units.saturating_add(cost);
        self.deny = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn denial(retry_after: Duration) -> Decision {
        Decision::new(
            Outcome::Denied { retry_after },
            10,
            0,
            Duration::from_secs(10_000),
        )
    }

    /// A client stranded by another instance's remembered denial
    /// (<https://github.com/envoyproxy/ratelimit/issues/1077>): a denial whose `retry_after` is
    /// 1 000 s is remembered only as long as other instances' leases may still give units back
    /// (the bound), then the next check asks Redis again.
    #[test]
    fn a_remembered_denial_ends_at_the_bound_not_at_its_retry_after() {
        let mut s = LeaseState::default();
        let bound = 1_100 * MS;
        s.remember_denial(5 * MS, 1, denial(Duration::from_secs(1_000)), bound);
        let during = s.denied(5 * MS + bound - 1, 1).expect("still remembered");
        // The answer keeps Redis's retry_after, counted down.
        assert_eq!(
            during.retry_after(),
            Some(Duration::from_secs(1_000) - Duration::from_nanos(bound - 1))
        );
        assert!(
            s.denied(5 * MS + bound, 1).is_none(),
            "forgotten at the bound"
        );
    }

    /// A denial that ends sooner than the bound is remembered until its `retry_after` only.
    #[test]
    fn a_short_denial_is_remembered_until_its_retry_after() {
        let mut s = LeaseState::default();
        s.remember_denial(0, 1, denial(Duration::from_millis(300)), 1_100 * MS);
        assert!(s.denied(299 * MS, 1).is_some());
        assert!(s.denied(300 * MS, 1).is_none());
    }

    /// The sweeper's next visit: at the expiry while units are held, one TTL after the last
    /// request otherwise; idle only with nothing held, nothing in flight, a TTL unused.
    #[test]
    fn the_next_visit_follows_the_units_then_the_last_request() {
        let mut s = LeaseState::default();
        s.observe(10 * MS, 1, 100 * MS);
        s.add(
            10 * MS,
            3,
            Decision::new(Outcome::Allowed, 10, 7, Duration::from_secs(1)),
            Receipt::new(42),
            1_010 * MS,
            || 1,
        );
        assert_eq!(s.next_visit(1_000 * MS), 1_010 * MS);
        assert!(!s.is_idle(1_009 * MS, 1_000 * MS));
        assert_eq!(s.expire(1_010 * MS).map(|u| u.units), Some(3));
        assert_eq!(s.next_visit(1_000 * MS), 1_010 * MS);
        assert!(s.is_idle(1_010 * MS, 1_000 * MS));
        s.prefetching = true;
        assert!(!s.is_idle(2_000 * MS, 1_000 * MS), "a renewal in flight");
    }

    /// A live lease that ran dry keeps its generation when renewed, so units spent from it
    /// still come back into it; a lease that ended remembers the receipt of its latest grant
    /// for the correction of units spent from it; an extra charge spends at most what is
    /// held.
    #[test]
    fn a_dry_lease_keeps_its_generation_and_an_ended_one_its_grant() {
        let allowed = Decision::new(Outcome::Allowed, 10, 7, Duration::from_secs(1));
        let mut s = LeaseState::default();
        s.add(0, 3, allowed, Receipt::new(42), 1_000 * MS, || 1);
        let policy = TierPolicy {
            limit: 10,
            capacity: 10,
            fixed_window: false,
            ban: false,
        };
        let (_, spent) = s.spend(MS, 3, policy).expect("held");
        s.add(2 * MS, 2, allowed, Receipt::new(43), 1_000 * MS, || 2);
        assert!(s.give_back(3 * MS, spent.stamp().expect("stamp") & !LEASE_BIT, 1));
        assert_eq!(s.held(3 * MS), 3);
        assert_eq!(s.consume(3 * MS, 5), 3);
        assert_eq!(s.held(3 * MS), 0);
        assert_eq!(
            s.grant_of(1),
            Some(Receipt::new(43)),
            "the live lease's grant"
        );
        // Expired: nothing comes back into it; its grant is still the one to give back by.
        assert!(!s.give_back(1_000 * MS, 1, 1));
        assert_eq!(s.grant_of(1), Some(Receipt::new(43)));
        // Renewed: a new generation; the ended one keeps its latest grant.
        s.add(1_000 * MS, 4, allowed, Receipt::new(44), 2_000 * MS, || 2);
        assert!(!s.give_back(1_001 * MS, 1, 1));
        assert_eq!(s.grant_of(1), Some(Receipt::new(43)));
        assert_eq!(s.take().map(|u| u.units), Some(4));
        assert_eq!(s.grant_of(2), Some(Receipt::new(44)));
        assert!(s.grant_of(1).is_none(), "only the last ended lease");
    }
}
