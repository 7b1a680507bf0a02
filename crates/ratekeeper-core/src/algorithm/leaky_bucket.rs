use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Gcra, KeyedAlgorithm, Reserved, receipt};
use crate::clock::nanos;
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

/// The leaky bucket, as a meter (police) and as a shaper (queue).
///
/// The bucket leaks one unit every `T = period / limit` and holds `burst` units (the queue
/// depth). Its state is one `u64`: the time at which the bucket will be empty, which is the
/// GCRA theoretical arrival time `TAT` (the leaky bucket and GCRA are the same algorithm
/// seen from two sides; ITU-T I.371 Annex A). A Redis mirror stores the same integer.
///
/// - **Meter** ([`LeakyBucket::decide`], what the memory store runs for
///   [`Algorithm::LeakyBucket`](crate::Algorithm::LeakyBucket)): a request passes at once if
///   it fits in the bucket, otherwise it is refused, exactly like [`Gcra`] with `burst` =
///   queue depth. nginx `limit_req` with `burst=b` and no `nodelay` corresponds to burst
///   `b + 1` here (nginx counts the request being served apart from the queue), so nginx's
///   `burst=0` is burst 1.
/// - **Shaper** ([`LeakyBucket::shape`]): a request that fits is queued and told how long to
///   wait so the output leaves smoothly, one unit every `T`: `delay = max(TAT, now) - now`.
///   A request whose delay would exceed `max_wait` is refused (and charges nothing). This is
///   the primitive behind a `Delay` mode. A cost-0 request is a free probe: it takes no
///   place in the queue, so it passes at once (delay 0) whatever the queue and `max_wait`.
///
/// Formulas (ns, saturating, as [`Gcra`]):
///
/// ```text
/// tat      = max(stored, now)
/// new_tat  = tat + n * T
/// fits     = new_tat - tau <= now                 // tau = burst * T: the queue has room
/// meter:  allowed = fits;                      retry_after = new_tat - tau - now
/// shaper: allowed = fits && tat - now <= max_wait; delay = tat - now   (n > 0)
///         retry_after = max(new_tat - tau - now, tat - now - max_wait)
///         n = 0: allowed, delay 0, nothing charged
/// ```
///
/// As for [`Gcra`], a decision's `limit` is the capacity (`burst`, the queue depth), the
/// stored state is read clamped to `now + tau` (the quota in force), and a refund gives
/// back only what its charge still holds ([`LeakyBucket::refunded`]).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::LeakyBucket;
/// use ratekeeper_core::Quota;
///
/// // 10 per second, queue of 3: three requests at t = 0 are spaced 100 ms apart.
/// let bucket = LeakyBucket::new(&Quota::new(10, Duration::from_secs(1))?.with_burst(3)?);
/// let mut tat = 0;
/// for expected in [0, 100, 200] {
///     let (shaped, next) = bucket.shape(tat, 0, 1, Duration::from_secs(1));
///     assert_eq!(shaped.delay(), Some(Duration::from_millis(expected)));
///     tat = next.unwrap();
/// }
/// let (full, _) = bucket.shape(tat, 0, 1, Duration::from_secs(1));
/// assert_eq!(full.decision().retry_after(), Some(Duration::from_millis(100)));
/// # Ok::<(), ratekeeper_core::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    gcra: Gcra,
}

/// A shaper's answer: the decision and, when admitted, how long to wait before proceeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shaped {
    decision: Decision,
    delay: Option<Duration>,
}

impl Shaped {
    pub(crate) const fn new(decision: Decision, delay: Option<Duration>) -> Self {
        Self { decision, delay }
    }

    /// The decision (`remaining` and `reset_after` after the request is queued, if it was).
    pub const fn decision(&self) -> Decision {
        self.decision
    }

    /// When admitted, the time to wait before proceeding (0 when the output is idle).
    pub const fn delay(&self) -> Option<Duration> {
        self.delay
    }
}

impl LeakyBucket {
    /// A bucket leaking `quota.limit()` units per `quota.period()`, holding `quota.burst()`.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            gcra: Gcra::new(quota),
        }
    }

    /// The leak interval `T` in nanoseconds.
    pub const fn emission_interval_nanos(&self) -> u64 {
        self.gcra.emission_interval_nanos()
    }

    /// The meter: the pure decision over the stored `tat` (0 when absent); returns the
    /// decision and, when charged, the new state. Identical to [`Gcra::decide`].
    #[inline]
    pub fn decide(&self, stored_tat: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        self.gcra.decide(stored_tat, now, cost)
    }

    /// The meter's answer without charging.
    pub fn peek(&self, stored_tat: u64, now: u64, cost: u64) -> Decision {
        self.gcra.peek(stored_tat, now, cost)
    }

    /// The shaper: queues `cost` units if the queue has room and the wait is at most
    /// `max_wait`. Returns the answer and, when queued, the new state to store.
    pub fn shape(
        &self,
        stored_tat: u64,
        now: u64,
        cost: u64,
        max_wait: Duration,
    ) -> (Shaped, Option<u64>) {
        if cost == 0 {
            // A free probe: it takes no place in the queue, so it never waits nor fails.
            return (
                Shaped {
                    decision: self.gcra.peek(stored_tat, now, 0),
                    delay: Some(Duration::ZERO),
                },
                None,
            );
        }
        let tat = self.gcra.in_force(stored_tat, now);
        let delay = tat - now;
        let max_wait = nanos(max_wait);
        let (decision, next) = self.gcra.decide(stored_tat, now, cost);
        match decision.outcome() {
            Outcome::Allowed if delay <= max_wait => (
                Shaped {
                    decision,
                    delay: Some(Duration::from_nanos(delay)),
                },
                next,
            ),
            Outcome::Allowed | Outcome::Denied { .. } => {
                let room_wait = decision.retry_after().unwrap_or(Duration::ZERO);
                let queue_wait = Duration::from_nanos(delay - max_wait.min(delay));
                let retry_after = room_wait.max(queue_wait);
                let peek = self.gcra.peek(stored_tat, now, cost);
                let denied = Decision::new(
                    Outcome::Denied { retry_after },
                    peek.limit(),
                    peek.remaining(),
                    peek.reset_after(),
                );
                (
                    Shaped {
                        decision: denied,
                        delay: None,
                    },
                    None,
                )
            }
            _ => (
                Shaped {
                    decision,
                    delay: None,
                },
                None,
            ),
        }
    }

    /// The state after giving back what the charge of `cost` units with receipt stamp
    /// `stamp` (the state that charge stored) still holds at `now`: the rule of
    /// [`Gcra::refunded`] (the undrained part only; nothing while a later reservation waits).
    pub fn refunded(&self, stored_tat: u64, now: u64, cost: u64, stamp: u64) -> u64 {
        self.gcra.refunded(stored_tat, now, cost, stamp)
    }

    /// The state after charging `extra` units at `now` without refusing (a correction):
    /// [`Gcra::debited`]. The bucket may overflow; the meter and the shaper refuse until it
    /// has leaked below its depth again.
    pub fn debited(&self, stored_tat: u64, now: u64, extra: u64) -> u64 {
        self.gcra.debited(stored_tat, now, extra)
    }

    /// The shaper's denial of a bucket in debt (`tat > now + tau`, `0 < cost <= burst`):
    /// `retry_after = max(tat + n * T - tau - now, tat - now - max_wait)`, both read
    /// from the stored TAT.
    fn in_debt(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
        max_wait: u64,
    ) -> Option<(Shaped, Option<u64>)> {
        let tau = self.gcra.tolerance_nanos();
        if tat <= now.saturating_add(tau) || cost == 0 {
            return None;
        }
        let decision = self.gcra.peek_from(tat, now, cost);
        let room_wait = decision.retry_after()?;
        let queue_wait = Duration::from_nanos((tat - now).saturating_sub(max_wait));
        let denied = Decision::new(
            Outcome::Denied {
                retry_after: room_wait.max(queue_wait),
            },
            decision.limit(),
            decision.remaining(),
            decision.reset_after(),
        );
        Some((Shaped::new(denied, None), None))
    }

    /// Whether the bucket is empty at `now` ("absent").
    pub const fn is_idle(&self, stored_tat: u64, now: u64) -> bool {
        stored_tat <= now
    }
}

impl KeyedAlgorithm for LeakyBucket {
    type State = AtomicU64;

    #[inline]
    fn check(&self, state: &AtomicU64, now: u64, cost: u64) -> (Decision, Receipt) {
        KeyedAlgorithm::check(&self.gcra, state, now, cost)
    }

    fn peek(&self, state: &AtomicU64, now: u64, cost: u64) -> Decision {
        KeyedAlgorithm::peek(&self.gcra, state, now, cost)
    }

    fn refund(&self, state: &AtomicU64, now: u64, cost: u64, stamp: u64) -> bool {
        KeyedAlgorithm::refund(&self.gcra, state, now, cost, stamp)
    }

    fn give_back(&self, state: &AtomicU64, now: u64, cost: u64, stamp: u64) -> bool {
        KeyedAlgorithm::give_back(&self.gcra, state, now, cost, stamp)
    }

    fn debit(&self, state: &AtomicU64, now: u64, extra: u64) {
        KeyedAlgorithm::debit(&self.gcra, state, now, extra);
    }

    fn is_idle(&self, state: &AtomicU64, now: u64) -> bool {
        LeakyBucket::is_idle(self, state.load(Ordering::Acquire), now)
    }

    fn headroom(&self) -> u64 {
        self.gcra.headroom()
    }

    fn stamp_bound(&self, now: u64) -> u64 {
        self.gcra.stamp_bound(now)
    }

    fn fence_shift(&self, bound: u64, now: u64) -> u64 {
        self.gcra.fence_shift(bound, now)
    }

    fn stale(&self, bound: u64, now: u64) -> bool {
        self.gcra.stale(bound, now)
    }

    /// The shaper ([`LeakyBucket::shape`]), applied atomically. The shaper never queues
    /// beyond the tolerance, so a TAT beyond `now + tau` here is a debt left by a
    /// correction ([`LeakyBucket::debited`]): it is read as stored, not clamped, and the
    /// denial waits it out exactly.
    fn reserve(&self, state: &AtomicU64, now: u64, cost: u64, max_wait: u64) -> Reserved {
        shaped_cas(state, |tat| {
            self.in_debt(tat, now, cost, max_wait)
                .unwrap_or_else(|| self.shape(tat, now, cost, Duration::from_nanos(max_wait)))
        })
    }

    fn tat_cell<'a>(&self, state: &'a AtomicU64) -> Option<&'a AtomicU64> {
        Some(state)
    }

    fn slot(&self, cost: u64) -> u64 {
        cost.saturating_mul(self.gcra.emission_interval_nanos())
    }
}

/// Runs a reservation (`f` maps the stored TAT to the answer and the TAT to store) with a
/// compare-and-swap loop. Exact: a denial is final. The TAT stored is the receipt's stamp.
pub(super) fn shaped_cas(state: &AtomicU64, f: impl Fn(u64) -> (Shaped, Option<u64>)) -> Reserved {
    let mut current = state.load(Ordering::Acquire);
    loop {
        let (shaped, next) = f(current);
        let reserved = Reserved {
            decision: shaped.decision,
            receipt: receipt(next),
            delay: shaped.delay.map_or(0, nanos),
            exact: true,
        };
        let Some(next) = next else { return reserved };
        match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return reserved,
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_burst_zero_admits_one_per_interval() {
        // https://github.com/openresty/openresty/issues/553 (a leaky bucket at 3,000/s
        // admitted about 1,000/s), in small: 5000/s, burst 1 (nginx burst=0), requests every
        // 40 us.
        let q = Quota::new(5_000, Duration::from_secs(1))
            .unwrap()
            .with_burst(1)
            .unwrap();
        let b = LeakyBucket::new(&q);
        let mut tat = 0;
        let mut admitted = Vec::new();
        for i in 0..50u64 {
            let (d, next) = b.decide(tat, i * 40_000, 1);
            if let Some(n) = next {
                tat = n;
            }
            if d.is_allowed() {
                admitted.push(i);
            }
        }
        assert_eq!(admitted, (0..50).step_by(5).collect::<Vec<_>>());
    }

    #[test]
    fn shaper_refuses_beyond_max_wait_and_charges_nothing() {
        let q = Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_burst(10)
            .unwrap();
        let b = LeakyBucket::new(&q);
        let mut tat = 0;
        for _ in 0..3 {
            let (s, next) = b.shape(tat, 0, 1, Duration::from_millis(250));
            assert!(s.decision().is_allowed());
            tat = next.unwrap();
        }
        // Queue has room (7 left) but the wait would be 300 ms > 250 ms.
        let (s, next) = b.shape(tat, 0, 1, Duration::from_millis(250));
        assert_eq!(next, None);
        assert_eq!(s.delay(), None);
        assert_eq!(s.decision().retry_after(), Some(Duration::from_millis(50)));
        assert_eq!(s.decision().remaining(), 7);
        let (never, _) = b.shape(tat, 0, 11, Duration::MAX);
        assert!(never.decision().is_cannot_fit());
    }

    /// Item 7 of the sweep: a cost-0 request is a free probe; the shaper never makes it
    /// wait nor refuses it, however long the queue is (here 900 ms against a 250 ms limit).
    #[test]
    fn sweep_shaper_cost_zero_never_waits_nor_fails() {
        let q = Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_burst(10)
            .unwrap();
        let b = LeakyBucket::new(&q);
        let mut tat = 0;
        for _ in 0..9 {
            let (s, next) = b.shape(tat, 0, 1, Duration::from_secs(1));
            assert!(s.decision().is_allowed());
            tat = next.unwrap();
        }
        for max_wait in [Duration::ZERO, Duration::from_millis(250), Duration::MAX] {
            let (probe, next) = b.shape(tat, 0, 0, max_wait);
            assert_eq!(next, None, "a probe charges nothing");
            assert!(probe.decision().is_allowed(), "max_wait {max_wait:?}");
            assert_eq!(probe.delay(), Some(Duration::ZERO));
            assert_eq!(probe.decision().remaining(), 1);
            assert_eq!(probe.decision(), b.peek(tat, 0, 0));
        }
        // The same through the keyed (store) path.
        let state = AtomicU64::new(tat);
        let r = KeyedAlgorithm::reserve(&b, &state, 0, 0, 0);
        assert!(r.decision.is_allowed());
        assert_eq!((r.delay, r.receipt), (0, Receipt::NONE));
        assert_eq!(state.load(Ordering::Acquire), tat);
    }
}
