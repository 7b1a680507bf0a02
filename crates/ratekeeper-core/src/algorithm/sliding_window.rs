use std::sync::Mutex;
use std::time::Duration;

use super::{KeyedAlgorithm, lock, receipt};
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

/// Per-key state of a [`SlidingWindow`]: the index of the current window and the units
/// charged in it and in the window before. `Default` (all zero) is "absent".
///
/// A Redis mirror stores the same three integers (`window`, `current`, `previous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SlidingWindowState {
    /// `floor(t / W)` of the window `current` belongs to.
    pub window: u64,
    /// Units charged in window `window`.
    pub current: u64,
    /// Units charged in window `window - 1`.
    pub previous: u64,
}

/// Sliding window counter: near-exact in O(1) memory per key.
///
/// Windows are aligned to multiples of the period from time 0, like
/// [`FixedWindow`](super::FixedWindow). The previous window's count is weighted by the part of it that
/// still overlaps the sliding window `(now - W, now]` (Cloudflare, "How we built rate
/// limiting capable of scaling to millions of domains", 2017):
///
/// ```text
/// estimate = previous * (W - elapsed) / W + current        // elapsed = now - i * W
/// ```
///
/// A request of cost `n` passes when `estimate + n <= limit`, evaluated exactly in integers
/// as `previous * (W - elapsed) + (current + n) * W <= limit * W` (`u128`, no floats, no
/// rounding). Then:
///
/// ```text
/// remaining   = floor((limit * W - previous * (W - elapsed)) / W) - current   (>= 0)
/// retry_after = the smallest wait after which the same test passes: in this window
///               elapsed' = W - floor((limit - current - n) * W / previous) when
///               current + n <= limit, otherwise in the next window, where previous' =
///               current and current' = 0 (always passes by the window after that)
/// reset_after = end of the next window if current > 0, else end of this window if
///               previous > 0, else 0           // when both counts have aged out
/// ```
///
/// `n > limit` is [`Outcome::CannotFit`]; `n = 0` always passes and charges nothing. The
/// algorithm takes no burst: a policy with a burst other than the limit is refused by
/// [`Policy::validate`](crate::Policy::validate).
///
/// **Parameters in force:** stored counts above `limit` are read as `limit`. A charge's
/// receipt stamp is its window index; a refund gives back in that window or the next, as
/// far as the estimate still counts the charge ([`SlidingWindow::refunded`]).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::{SlidingWindow, SlidingWindowState};
/// use ratekeeper_core::Quota;
///
/// // 10 per minute; 10 at 59.9 s; at 60.1 s the estimate is
/// // 10 * (1 - 100 / 60000) = 9.983, so one more does not fit.
/// let sw = SlidingWindow::new(&Quota::new(10, Duration::from_secs(60))?);
/// let ms = 1_000_000;
/// let (_, state) = sw.decide(SlidingWindowState::default(), 59_900 * ms, 10);
/// let (denied, _) = sw.decide(state.unwrap(), 60_100 * ms, 1);
/// assert!(denied.is_denied());
/// assert_eq!(denied.remaining(), 0);
/// # Ok::<(), ratekeeper_core::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    window: u64,
    limit: u32,
    /// Read the stored counts as they are, debt included (the memory store), rather than
    /// clamped to the limit.
    keeps_debt: bool,
}

impl SlidingWindow {
    /// A sliding window counter over windows of `quota.period()` admitting `quota.limit()`.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            window: quota.period_nanos(),
            limit: quota.limit(),
            keeps_debt: false,
        }
    }

    /// This counter reading stored counts as they are rather than clamped to the limit, so
    /// that a debt left by [`SlidingWindow::debited`] counts in full, in its window and
    /// weighted in the next (for a store whose quota never changes, where a count above the
    /// limit can only be a debt).
    pub(crate) const fn keeping_debt(mut self) -> Self {
        self.keeps_debt = true;
        self
    }

    /// The window length `W` in nanoseconds.
    pub const fn window_nanos(&self) -> u64 {
        self.window
    }

    /// Units admitted per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The state rolled forward to the window of `now`.
    #[inline]
    fn current(&self, s: SlidingWindowState, now: u64) -> SlidingWindowState {
        let window = now / self.window;
        let cap = if self.keeps_debt {
            u64::MAX
        } else {
            u64::from(self.limit)
        };
        if s.window == window {
            SlidingWindowState {
                window,
                current: s.current.min(cap),
                previous: s.previous.min(cap),
            }
        } else if s.window.checked_add(1) == Some(window) {
            SlidingWindowState {
                window,
                current: 0,
                previous: s.current.min(cap),
            }
        } else {
            SlidingWindowState {
                window,
                current: 0,
                previous: 0,
            }
        }
    }

    /// `(window start, elapsed)` in ns for window `i` at `now`.
    #[inline]
    fn elapsed(&self, s: &SlidingWindowState, now: u64) -> u128 {
        u128::from(now) - u128::from(s.window) * u128::from(self.window)
    }

    #[inline]
    fn fits(&self, s: &SlidingWindowState, elapsed: u128, cost: u64) -> bool {
        let w = u128::from(self.window);
        let left =
            u128::from(s.previous) * (w - elapsed) + (u128::from(s.current) + u128::from(cost)) * w;
        left <= u128::from(self.limit) * w
    }

    /// The smallest `e` in `[0, W]` such that `previous * (W - e) + (current + n) * W <=
    /// limit * W`, or `None` when `current + n > limit`.
    #[inline]
    fn earliest(&self, previous: u64, current: u64, cost: u64) -> Option<u128> {
        let room = u64::from(self.limit)
            .checked_sub(current)?
            .checked_sub(cost)?;
        let w = u128::from(self.window);
        if previous == 0 {
            return Some(0);
        }
        let slack = (u128::from(room) * w) / u128::from(previous);
        Some(w.saturating_sub(slack))
    }

    fn retry_after(&self, s: &SlidingWindowState, elapsed: u128, cost: u64) -> u64 {
        let w = u128::from(self.window);
        let wait = match self.earliest(s.previous, s.current, cost) {
            Some(e) => e.max(elapsed) - elapsed,
            None => {
                // Next window: previous' = current, current' = 0. `cost <= limit` here, so
                // it fits by the end of that window at the latest.
                let e = self.earliest(s.current, 0, cost).unwrap_or(w);
                (w - elapsed) + e
            }
        };
        u64::try_from(wait).unwrap_or(u64::MAX)
    }

    fn report(&self, outcome: Outcome, s: &SlidingWindowState, now: u64) -> Decision {
        let w = u128::from(self.window);
        let elapsed = self.elapsed(s, now);
        let budget =
            (u128::from(self.limit) * w).saturating_sub(u128::from(s.previous) * (w - elapsed)) / w;
        let remaining = budget.saturating_sub(u128::from(s.current));
        let windows_left: u128 = if s.current > 0 {
            2
        } else if s.previous > 0 {
            1
        } else {
            0
        };
        let reset = (windows_left * w).saturating_sub(elapsed);
        Decision::new(
            outcome,
            self.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(u64::try_from(reset).unwrap_or(u64::MAX)),
        )
    }

    /// The pure decision over `state` (the key's state; `Default` when absent). Returns the
    /// decision and, when the request is charged, the new state to store.
    pub fn decide(
        &self,
        state: SlidingWindowState,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<SlidingWindowState>) {
        let s = self.current(state, now);
        if cost > u64::from(self.limit) {
            return (self.report(Outcome::CannotFit, &s, now), None);
        }
        if cost == 0 {
            return (self.report(Outcome::Allowed, &s, now), None);
        }
        let elapsed = self.elapsed(&s, now);
        if self.fits(&s, elapsed, cost) {
            let next = SlidingWindowState {
                current: s.current.saturating_add(cost),
                ..s
            };
            (self.report(Outcome::Allowed, &next, now), Some(next))
        } else {
            let wait = self.retry_after(&s, elapsed, cost);
            let outcome = Outcome::Denied {
                retry_after: Duration::from_nanos(wait),
            };
            (self.report(outcome, &s, now), None)
        }
    }

    /// What [`SlidingWindow::decide`] would answer, with `remaining` and `reset_after` of the
    /// state as it is (nothing is charged).
    pub fn peek(&self, state: SlidingWindowState, now: u64, cost: u64) -> Decision {
        let (d, _) = self.decide(state, now, cost);
        self.report(d.outcome(), &self.current(state, now), now)
    }

    /// The state after giving back what the charge of `cost` units made in window `stamp`
    /// (its receipt) still holds at `now`:
    ///
    /// ```text
    /// stamp == i      : current  -= min(cost, current)
    /// stamp == i - 1  : previous -= min(cost, previous)   // the estimate still weighs it
    /// older           : nothing                           // no longer counted at all
    /// ```
    pub fn refunded(
        &self,
        state: SlidingWindowState,
        now: u64,
        cost: u64,
        stamp: u64,
    ) -> SlidingWindowState {
        let s = self.current(state, now);
        if s.window == stamp {
            SlidingWindowState {
                current: s.current - cost.min(s.current),
                ..s
            }
        } else if stamp.checked_add(1) == Some(s.window) {
            SlidingWindowState {
                previous: s.previous - cost.min(s.previous),
                ..s
            }
        } else {
            state
        }
    }

    /// The state after charging `extra` units at `now` without refusing (a correction whose
    /// true cost came out higher than its estimate): `current += extra` in the window of
    /// `now` (saturating). The counts may exceed the limit: the estimate refuses until
    /// enough of them has aged out. A counter built by [`SlidingWindow::new`] reads counts
    /// above the limit as the limit (the quota in force).
    pub fn debited(&self, state: SlidingWindowState, now: u64, extra: u64) -> SlidingWindowState {
        let s = self.current(state, now);
        SlidingWindowState {
            current: s.current.saturating_add(extra),
            ..s
        }
    }

    /// Whether `state` equals "absent" at `now` (both counts have aged out).
    pub fn is_idle(&self, state: SlidingWindowState, now: u64) -> bool {
        let s = self.current(state, now);
        s.current == 0 && s.previous == 0
    }
}

impl KeyedAlgorithm for SlidingWindow {
    type State = Mutex<SlidingWindowState>;

    fn check(&self, state: &Self::State, now: u64, cost: u64) -> (Decision, Receipt) {
        let mut s = lock(state);
        let (d, next) = self.decide(*s, now, cost);
        if let Some(next) = next {
            *s = next;
        }
        (d, receipt(next.map(|n| n.window)))
    }

    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision {
        SlidingWindow::peek(self, *lock(state), now, cost)
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
        SlidingWindow::is_idle(self, *lock(state), now)
    }

    /// A stamp is a window index.
    fn stamp_bound(&self, now: u64) -> u64 {
        now / self.window
    }

    /// Whole windows, two past `bound` (a refund reaches one window back).
    fn fence_shift(&self, bound: u64, now: u64) -> u64 {
        let windows = bound.saturating_add(2).saturating_sub(now / self.window);
        windows.saturating_mul(self.window)
    }

    fn stale(&self, bound: u64, now: u64) -> bool {
        bound.saturating_add(1) < now / self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn run(sw: &SlidingWindow, s: &mut SlidingWindowState, now: u64, cost: u64) -> Decision {
        let (d, next) = sw.decide(*s, now, cost);
        if let Some(n) = next {
            *s = n;
        }
        d
    }

    #[test]
    fn previous_window_weight_decays_linearly() {
        // 10 per 100 ms; 10 in window 0; in window 1 the previous weight falls by one unit
        // every 10 ms.
        let sw = SlidingWindow::new(&Quota::new(10, Duration::from_millis(100)).unwrap());
        let mut s = SlidingWindowState::default();
        assert!(run(&sw, &mut s, 50 * MS, 10).is_allowed());
        let d = run(&sw, &mut s, 100 * MS, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(10)));
        assert_eq!(d.reset_after(), Duration::from_millis(100));
        let d = run(&sw, &mut s, 125 * MS, 1);
        assert!(d.is_allowed());
        // estimate after: 10 * 0.75 + 1 = 8.5 -> 1 more whole request (9.5 <= 10).
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after(), Duration::from_millis(175));
        // cost 3 needs 10 * (1 - e) + 1 + 3 <= 10 -> e >= 0.4 -> 40 ms into the window.
        let d = run(&sw, &mut s, 125 * MS, 3);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(15)));
    }

    #[test]
    fn a_full_current_window_waits_into_the_next() {
        let sw = SlidingWindow::new(&Quota::new(4, Duration::from_millis(100)).unwrap());
        let mut s = SlidingWindowState::default();
        assert!(run(&sw, &mut s, 0, 4).is_allowed());
        // Next window: previous 4, cost 2 needs 4 * (1 - e) + 2 <= 4 -> e >= 0.5.
        let d = run(&sw, &mut s, 0, 2);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(150)));
        let d = run(&sw, &mut s, 0, 4);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
        assert_eq!(d.reset_after(), Duration::from_millis(200));
        assert!(sw.is_idle(s, 200 * MS));
        assert!(!sw.is_idle(s, 199 * MS));
    }

    /// A debit past the limit: the quota-in-force reading counts it as the limit; the
    /// memory store's reading keeps it, in its window and weighted in the next.
    #[test]
    fn a_debt_is_kept_whole_only_when_keeping_debt() {
        let quota = Quota::new(4, Duration::from_millis(100)).unwrap();
        let (clamped, kept) = (
            SlidingWindow::new(&quota),
            SlidingWindow::new(&quota).keeping_debt(),
        );
        let s = clamped.debited(SlidingWindowState::default(), 10 * MS, 6);
        assert_eq!(
            s,
            SlidingWindowState {
                window: 0,
                current: 6,
                previous: 0
            }
        );
        // At 150 ms: previous 6 weighs 3 (kept) or 2 (clamped to 4) of the estimate.
        assert_eq!(kept.peek(s, 150 * MS, 1).remaining(), 1);
        assert_eq!(clamped.peek(s, 150 * MS, 1).remaining(), 2);
        // A give-back of 3 from the debt leaves 3 counted (kept), not 1.
        let back = kept.refunded(s, 50 * MS, 3, 0);
        assert_eq!(back.current, 3);
        assert_eq!(clamped.refunded(s, 50 * MS, 3, 0).current, 1);
    }
}
