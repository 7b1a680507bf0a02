use std::sync::Mutex;
use std::time::Duration;

use super::{KeyedAlgorithm, lock, receipt};
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

/// Per-key state of a [`FixedWindow`]: the index of the window last charged and the units
/// charged in it. `FixedWindowState::default()` (window 0, count 0) is "absent".
///
/// A Redis mirror stores the same two integers (`window`, `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FixedWindowState {
    /// `floor(t / W)` of the last charge, where `t` is in ns and `W` the window in ns.
    pub window: u64,
    /// Units charged in that window (at most `limit`).
    pub count: u64,
}

/// Fixed window counter: at most `limit` units in each window of `period`.
///
/// **Anchoring:** windows are aligned to multiples of the period from the clock's origin
/// (time 0): window `i` is `[i * W, (i + 1) * W)`. It does not start at a key's first hit.
/// This is documented and tested behaviour. Because of it, a client may spend
/// `limit` at the end of one window and `limit` again at the start of the next: up to
/// `2 * limit` inside one period around a boundary (the "boundary double burst"). Use
/// [`SlidingLog`](super::SlidingLog) or [`SlidingWindow`](super::SlidingWindow) when that
/// matters. The window holds `limit` units and takes no burst: a policy with a burst other
/// than the limit is refused by [`Policy::validate`](crate::Policy::validate).
///
/// What "time 0" is depends on the store's clock. In the
/// [`MemoryStore`](crate::store::MemoryStore) with the default
/// [`MonotonicClock`](crate::clock::MonotonicClock) it is the moment the store was created,
/// so a "per minute" window is **not** aligned to wall-clock minutes; the Redis store reads
/// Redis `TIME`, so its windows are aligned to the Unix epoch (a per-minute window turns over
/// at :00 seconds). Either way every key shares the same boundaries.
///
/// For a request of cost `n` at `now` (all ns, `u128` intermediate values, no overflow):
///
/// ```text
/// i          = now / W
/// count      = state.count if state.window == i else 0
/// allowed    = n <= limit - count               // then state := (i, count + n)
/// retry_after (denied)  = (i + 1) * W - now     // the next window starts empty
/// remaining  = limit - count'                   // count' after the charge, if any
/// reset_after = (i + 1) * W - now if count' > 0 else 0
/// ```
///
/// `n > limit` is [`Outcome::CannotFit`]; `n = 0` always passes and charges nothing.
///
/// **Parameters in force:** a stored count above `limit` (written under a larger quota) is
/// read as `limit`, so a lowered limit applies at once (for example 50 used under "100 per
/// hour", read under "10 per hour", is a full window: denied until it ends). A charge's
/// receipt stamp is its window index `i`; a refund gives back only in that same window
/// ([`FixedWindow::refunded`]).
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::{FixedWindow, FixedWindowState};
/// use ratekeeper_core::Quota;
///
/// // 2 per 10 s: windows [0, 10 s), [10 s, 20 s), ...
/// let fw = FixedWindow::new(&Quota::new(2, Duration::from_secs(10))?);
/// let ms = 1_000_000;
/// let (d, state) = fw.decide(FixedWindowState::default(), 9_999 * ms, 1);
/// assert_eq!((d.remaining(), d.reset_after()), (1, Duration::from_millis(1)));
/// let (d, _) = fw.decide(state.unwrap(), 10_000 * ms, 1);
/// assert_eq!((d.remaining(), d.reset_after()), (1, Duration::from_secs(10)));
/// # Ok::<(), ratekeeper_core::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    window: u64,
    limit: u32,
    /// Read the stored count as is, debt included (the memory store), rather than clamped
    /// to the limit.
    keeps_debt: bool,
}

impl FixedWindow {
    /// A fixed window of `quota.period()` holding `quota.limit()` units.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            window: quota.period_nanos(),
            limit: quota.limit(),
            keeps_debt: false,
        }
    }

    /// This window reading a stored count as is rather than clamped to the limit, so that a
    /// debt left by [`FixedWindow::debited`] counts in full (for a store whose quota never
    /// changes, where a count above the limit can only be a debt).
    pub(crate) const fn keeping_debt(mut self) -> Self {
        self.keeps_debt = true;
        self
    }

    /// The window length `W` in nanoseconds (never 0).
    pub const fn window_nanos(&self) -> u64 {
        self.window
    }

    /// Units admitted per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The state as seen at `now`: the current window index and its count.
    #[inline]
    fn current(&self, state: FixedWindowState, now: u64) -> FixedWindowState {
        let window = now / self.window;
        if state.window == window {
            let count = if self.keeps_debt {
                state.count
            } else {
                state.count.min(u64::from(self.limit))
            };
            FixedWindowState { window, count }
        } else {
            FixedWindowState { window, count: 0 }
        }
    }

    /// Nanoseconds from `now` to the end of window `i`, saturating at `u64::MAX`.
    #[inline]
    fn until_window_end(&self, window: u64, now: u64) -> u64 {
        let end = (u128::from(window) + 1) * u128::from(self.window);
        u64::try_from(end - u128::from(now)).unwrap_or(u64::MAX)
    }

    #[inline]
    fn report(&self, outcome: Outcome, s: FixedWindowState, now: u64) -> Decision {
        let reset = if s.count > 0 {
            self.until_window_end(s.window, now)
        } else {
            0
        };
        let remaining = u64::from(self.limit).saturating_sub(s.count);
        Decision::new(
            outcome,
            self.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(reset),
        )
    }

    /// The pure decision over `state` (the key's state; `Default` when absent). Returns the
    /// decision and, when the request is charged, the new state to store.
    #[inline]
    pub fn decide(
        &self,
        state: FixedWindowState,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<FixedWindowState>) {
        let s = self.current(state, now);
        let limit = u64::from(self.limit);
        if cost > limit {
            return (self.report(Outcome::CannotFit, s, now), None);
        }
        if cost == 0 {
            return (self.report(Outcome::Allowed, s, now), None);
        }
        if cost <= limit.saturating_sub(s.count) {
            let next = FixedWindowState {
                window: s.window,
                count: s.count + cost,
            };
            (self.report(Outcome::Allowed, next, now), Some(next))
        } else {
            let wait = self.until_window_end(s.window, now);
            let outcome = Outcome::Denied {
                retry_after: Duration::from_nanos(wait),
            };
            (self.report(outcome, s, now), None)
        }
    }

    /// What [`FixedWindow::decide`] would answer, with `remaining` and `reset_after` of the
    /// state as it is (nothing is charged).
    pub fn peek(&self, state: FixedWindowState, now: u64, cost: u64) -> Decision {
        let (d, _) = self.decide(state, now, cost);
        self.report(d.outcome(), self.current(state, now), now)
    }

    /// The state after giving back what the charge of `cost` units made in window `stamp`
    /// (its receipt: `floor(t / W)` at the charge) still holds at `now`: `min(cost, count)`
    /// while `stamp` is still the current window, nothing once it closed (a late
    /// refund never takes units off the next window's count).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::{FixedWindow, FixedWindowState};
    /// use ratekeeper_core::Quota;
    ///
    /// let fw = FixedWindow::new(&Quota::new(2, Duration::from_secs(60))?);
    /// let s = 1_000_000_000;
    /// let charged = FixedWindowState { window: 0, count: 1 };
    /// assert_eq!(fw.refunded(charged, 59 * s, 1, 0).count, 0);
    /// let next = FixedWindowState { window: 1, count: 2 };
    /// assert_eq!(fw.refunded(next, 61 * s, 1, 0), next);
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    pub fn refunded(
        &self,
        state: FixedWindowState,
        now: u64,
        cost: u64,
        stamp: u64,
    ) -> FixedWindowState {
        let s = self.current(state, now);
        if s.window != stamp {
            return state;
        }
        FixedWindowState {
            window: s.window,
            count: s.count - cost.min(s.count),
        }
    }

    /// The state after charging `extra` units at `now` without refusing (a correction whose
    /// true cost came out higher than its estimate): `count += extra` in the window of
    /// `now` (saturating). The count may exceed the limit: the window refuses until it
    /// ends. A window built by [`FixedWindow::new`] reads a count above the limit as the
    /// limit (the quota in force), so a give-back then starts from the limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::{FixedWindow, FixedWindowState};
    /// use ratekeeper_core::Quota;
    ///
    /// let fw = FixedWindow::new(&Quota::new(10, Duration::from_secs(60))?);
    /// let s = 1_000_000_000;
    /// let charged = FixedWindowState { window: 0, count: 8 };
    /// assert_eq!(fw.debited(charged, 59 * s, 5), FixedWindowState { window: 0, count: 13 });
    /// // Charged at the time of the correction: in the next window, from 0.
    /// assert_eq!(fw.debited(charged, 61 * s, 5), FixedWindowState { window: 1, count: 5 });
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    pub fn debited(&self, state: FixedWindowState, now: u64, extra: u64) -> FixedWindowState {
        let s = self.current(state, now);
        FixedWindowState {
            window: s.window,
            count: s.count.saturating_add(extra),
        }
    }

    /// Whether `state` equals "absent" at `now` (nothing charged in the current window).
    pub fn is_idle(&self, state: FixedWindowState, now: u64) -> bool {
        self.current(state, now).count == 0
    }
}

impl KeyedAlgorithm for FixedWindow {
    type State = Mutex<FixedWindowState>;

    fn check(&self, state: &Self::State, now: u64, cost: u64) -> (Decision, Receipt) {
        let mut s = lock(state);
        let (d, next) = self.decide(*s, now, cost);
        if let Some(next) = next {
            *s = next;
        }
        (d, receipt(next.map(|n| n.window)))
    }

    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision {
        FixedWindow::peek(self, *lock(state), now, cost)
    }

    fn refund(&self, state: &Self::State, now: u64, cost: u64, stamp: u64) -> bool {
        let mut s = lock(state);
        *s = self.refunded(*s, now, cost, stamp);
        false
    }

    fn debit(&self, state: &Self::State, now: u64, extra: u64) {
        let mut s = lock(state);
        *s = self.debited(*s, now, extra);
    }

    fn is_idle(&self, state: &Self::State, now: u64) -> bool {
        FixedWindow::is_idle(self, *lock(state), now)
    }

    /// A stamp is a window index.
    fn stamp_bound(&self, now: u64) -> u64 {
        now / self.window
    }

    /// Whole windows, so the fenced state's windows stay aligned with everyone's.
    fn fence_shift(&self, bound: u64, now: u64) -> u64 {
        let windows = bound.saturating_add(1).saturating_sub(now / self.window);
        windows.saturating_mul(self.window)
    }

    fn stale(&self, bound: u64, now: u64) -> bool {
        bound < now / self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn run(fw: &FixedWindow, s: &mut FixedWindowState, now: u64, cost: u64) -> Decision {
        let (d, next) = fw.decide(*s, now, cost);
        if let Some(n) = next {
            *s = n;
        }
        d
    }

    #[test]
    fn windows_are_aligned_to_multiples_of_the_period() {
        let fw = FixedWindow::new(&Quota::new(10, Duration::from_secs(60)).unwrap());
        let mut s = FixedWindowState::default();
        for rem in (0..10).rev() {
            let d = run(&fw, &mut s, 59_900 * MS, 1);
            assert_eq!(d.remaining(), rem);
            assert_eq!(d.reset_after(), Duration::from_millis(100));
        }
        let d = run(&fw, &mut s, 59_900 * MS, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        for rem in (0..10).rev() {
            let d = run(&fw, &mut s, 60_100 * MS, 1);
            assert_eq!(d.remaining(), rem);
            assert_eq!(d.reset_after(), Duration::from_millis(59_900));
        }
    }

    #[test]
    fn cost_n_cannot_fit_and_free_probe() {
        let fw = FixedWindow::new(&Quota::new(3, Duration::from_secs(1)).unwrap());
        let mut s = FixedWindowState::default();
        assert!(run(&fw, &mut s, 0, 4).is_cannot_fit());
        assert_eq!(run(&fw, &mut s, 0, 0).remaining(), 3);
        assert_eq!(s, FixedWindowState::default());
        assert_eq!(run(&fw, &mut s, 0, 2).remaining(), 1);
        let d = run(&fw, &mut s, 0, 2);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(d.remaining(), 1);
        assert!(!fw.is_idle(s, 0));
        assert!(fw.is_idle(s, 1_000 * MS));
        s = fw.refunded(s, 0, 2, 0);
        assert!(fw.is_idle(s, 0));
    }

    #[test]
    fn clock_near_the_end_of_time() {
        let fw = FixedWindow::new(&Quota::new(1, Duration::from_nanos(u64::MAX)).unwrap());
        let mut s = FixedWindowState::default();
        assert!(run(&fw, &mut s, u64::MAX - 1, 1).is_allowed());
        let d = run(&fw, &mut s, u64::MAX - 1, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
        assert!(run(&fw, &mut s, u64::MAX, 1).is_allowed());
        let d = run(&fw, &mut s, u64::MAX, 1);
        // Window 1 ends at 2 * (2^64 - 1) ns, beyond u64: saturates.
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
    }

    /// A debit past the limit refuses until the window ends; the memory store's reading
    /// keeps the debt whole for a later give-back.
    #[test]
    fn a_debt_refuses_until_the_window_ends() {
        let quota = Quota::new(4, Duration::from_millis(100)).unwrap();
        let (clamped, kept) = (
            FixedWindow::new(&quota),
            FixedWindow::new(&quota).keeping_debt(),
        );
        let s = kept.debited(FixedWindowState::default(), 10 * MS, 7);
        for fw in [clamped, kept] {
            let d = fw.peek(s, 20 * MS, 1);
            assert_eq!(d.retry_after(), Some(Duration::from_millis(80)));
            assert_eq!(d.remaining(), 0);
        }
        assert_eq!(kept.refunded(s, 20 * MS, 2, 0).count, 5);
        assert_eq!(clamped.refunded(s, 20 * MS, 2, 0).count, 2);
        // Charged at the time of the debit: the next window starts from it.
        assert_eq!(
            kept.debited(s, 100 * MS, 1),
            FixedWindowState {
                window: 1,
                count: 1
            }
        );
    }
}
