use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use super::{KeyedAlgorithm, lock, receipt};
use crate::store::Receipt;
use crate::{Decision, Outcome, Quota};

/// Per-key state of a [`SlidingLog`]: `(timestamp ns, units)` entries, oldest first, with
/// strictly increasing timestamps (charges at the same instant are merged into one entry).
///
/// Every entry holds at least one unit and the units add up to at most `limit`, so a key
/// holds at most `limit` entries, and a request of cost `n` adds one entry, not `n`.
/// The empty log is "absent". A Redis mirror stores the same pairs (for example a sorted set
/// scored by timestamp, or a list of `timestamp:units` strings).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    entries: VecDeque<(u64, u64)>,
}

impl SlidingLogState {
    /// An empty log ("absent").
    pub const fn new() -> Self {
        Self {
            entries: VecDeque::new(),
        }
    }

    /// The entries `(timestamp ns, units)`, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// The number of entries held (at most the limit).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn used(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |sum, &(_, units)| sum.saturating_add(units))
    }
}

/// Sliding window log: exact; at most `limit` units in any window of `period`.
///
/// A request at `now` counts the units of the entries in the half-open window
/// `(now - W, now]`: an entry at `ts` stops counting at `ts + W`. For cost `n` (all ns, with
/// saturating sums):
///
/// ```text
/// drop entries with ts + W <= now                      // expired; invisible to clients
/// used      = sum of units
/// allowed   = used + n <= limit                        // then append (now, n) or merge
/// retry_after (denied) = ts_k + W - now, where k is the first entry (oldest first) at
///             which the units expired so far reach used + n - limit
/// remaining = limit - used'                            // used' after the charge, if any
/// reset_after = newest_ts + W - now, or 0 when empty  // when every entry has expired
/// ```
///
/// `n > limit` is [`Outcome::CannotFit`]; `n = 0` always passes and charges nothing.
/// Memory per key is O(limit) in the worst case (one entry per distinct instant); the
/// quota's `burst` is not used.
///
/// **Parameters in force:** a log written under a larger limit may hold more units than
/// `limit`; it is then full (remaining 0), and no wait exceeds `W`, because every entry
/// leaves within `W` (an entry stamped in the future is read as leaving `W` from now). A
/// charge's receipt stamp is the timestamp of the entry it added to; a refund takes at most
/// its units off that entry, while it has not expired ([`SlidingLog::refund`]).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::{SlidingLog, SlidingLogState};
/// use ratekeeper_core::Quota;
///
/// // 10 per minute: 10 at 59.9 s, then one at 60.1 s is refused until the
/// // first entries leave at 119.9 s.
/// let log = SlidingLog::new(&Quota::new(10, Duration::from_secs(60))?);
/// let mut state = SlidingLogState::new();
/// let ms = 1_000_000;
/// assert!(log.decide(&mut state, 59_900 * ms, 10).is_allowed());
/// assert_eq!(state.len(), 1); // one entry for cost 10
/// let denied = log.decide(&mut state, 60_100 * ms, 1);
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(59_800)));
/// # Ok::<(), ratekeeper_core::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    window: u64,
    limit: u32,
}

impl SlidingLog {
    /// A log over windows of `quota.period()` admitting `quota.limit()` units.
    pub const fn new(quota: &Quota) -> Self {
        Self {
            window: quota.period_nanos(),
            limit: quota.limit(),
        }
    }

    /// The window length `W` in nanoseconds.
    pub const fn window_nanos(&self) -> u64 {
        self.window
    }

    /// Units admitted per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    #[inline]
    fn expires_in(&self, ts: u64, now: u64) -> u64 {
        ts.saturating_add(self.window)
            .saturating_sub(now)
            .min(self.window)
    }

    fn prune(&self, state: &mut SlidingLogState, now: u64) {
        while let Some(&(ts, _)) = state.entries.front() {
            if ts.saturating_add(self.window) <= now {
                state.entries.pop_front();
            } else {
                break;
            }
        }
    }

    fn report(&self, outcome: Outcome, state: &SlidingLogState, now: u64) -> Decision {
        let remaining = u64::from(self.limit).saturating_sub(state.used());
        let reset = state
            .entries
            .back()
            .map_or(0, |&(ts, _)| self.expires_in(ts, now));
        Decision::new(
            outcome,
            self.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(reset),
        )
    }

    fn verdict(&self, state: &SlidingLogState, now: u64, cost: u64) -> Outcome {
        let limit = u64::from(self.limit);
        if cost > limit {
            return Outcome::CannotFit;
        }
        let used = state.used();
        if cost <= limit.saturating_sub(used) {
            return Outcome::Allowed;
        }
        // Free `need` units: the entries leave oldest first.
        let need = used.saturating_add(cost) - limit;
        let mut freed = 0u64;
        let mut wait = 0;
        for &(ts, units) in &state.entries {
            freed = freed.saturating_add(units);
            wait = self.expires_in(ts, now);
            if freed >= need {
                break;
            }
        }
        Outcome::Denied {
            retry_after: Duration::from_nanos(wait),
        }
    }

    /// The pure decision: drops expired entries from `state` (invisible to clients) and, when
    /// the request is allowed with a cost above 0, records it.
    pub fn decide(&self, state: &mut SlidingLogState, now: u64, cost: u64) -> Decision {
        self.decide_stamped(state, now, cost).0
    }

    /// [`SlidingLog::decide`], also returning, when the request was charged, the timestamp
    /// of the entry its units went to (the stamp of its receipt).
    pub fn decide_stamped(
        &self,
        state: &mut SlidingLogState,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<u64>) {
        self.prune(state, now);
        let outcome = self.verdict(state, now, cost);
        let mut stamp = None;
        if outcome == Outcome::Allowed && cost > 0 {
            match state.entries.back_mut() {
                Some((ts, units)) if *ts >= now => {
                    *units = units.saturating_add(cost);
                    stamp = Some(*ts);
                }
                _ => {
                    state.entries.push_back((now, cost));
                    stamp = Some(now);
                }
            }
        }
        (self.report(outcome, state, now), stamp)
    }

    /// What [`SlidingLog::decide`] would answer, without changing `state`.
    pub fn peek(&self, state: &SlidingLogState, now: u64, cost: u64) -> Decision {
        let copy = SlidingLogState {
            entries: state
                .entries
                .iter()
                .copied()
                .filter(|&(ts, _)| ts.saturating_add(self.window) > now)
                .collect(),
        };
        let outcome = self.verdict(&copy, now, cost);
        self.report(outcome, &copy, now)
    }

    /// Gives back what the charge of `cost` units whose entry has timestamp `stamp` (its
    /// receipt) still holds at `now`: at most `cost` units off that entry, while
    /// `stamp + W > now`. Nothing once the entry expired, and never units of
    /// another entry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::{SlidingLog, SlidingLogState};
    /// use ratekeeper_core::Quota;
    ///
    /// let log = SlidingLog::new(&Quota::new(2, Duration::from_secs(60))?);
    /// let s = 1_000_000_000;
    /// let mut state = SlidingLogState::new();
    /// let (_, stamp) = log.decide_stamped(&mut state, 0, 1);
    /// log.decide(&mut state, 60 * s + s / 2, 2); // the first entry expired at 60 s
    /// log.refund(&mut state, 61 * s, 1, stamp.unwrap());
    /// assert_eq!(log.peek(&state, 61 * s, 1).remaining(), 0);
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    pub fn refund(&self, state: &mut SlidingLogState, now: u64, cost: u64, stamp: u64) {
        self.prune(state, now);
        let Ok(i) = state.entries.binary_search_by_key(&stamp, |&(ts, _)| ts) else {
            return;
        };
        let Some((_, units)) = state.entries.get_mut(i) else {
            return;
        };
        *units -= cost.min(*units);
        if *units == 0 {
            state.entries.remove(i);
        }
    }

    /// Whether `state` equals "absent" at `now` (every entry has expired).
    pub fn is_idle(&self, state: &SlidingLogState, now: u64) -> bool {
        state
            .entries
            .back()
            .is_none_or(|&(ts, _)| ts.saturating_add(self.window) <= now)
    }
}

impl KeyedAlgorithm for SlidingLog {
    type State = Mutex<SlidingLogState>;

    fn check(&self, state: &Self::State, now: u64, cost: u64) -> (Decision, Receipt) {
        let (d, stamp) = self.decide_stamped(&mut lock(state), now, cost);
        (d, receipt(stamp))
    }

    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision {
        SlidingLog::peek(self, &lock(state), now, cost)
    }

    fn refund(&self, state: &Self::State, now: u64, cost: u64, stamp: u64) {
        SlidingLog::refund(self, &mut lock(state), now, cost, stamp);
    }

    fn is_idle(&self, state: &Self::State, now: u64) -> bool {
        SlidingLog::is_idle(self, &lock(state), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn counts_the_half_open_window_and_frees_oldest_first() {
        let log = SlidingLog::new(&Quota::new(3, Duration::from_millis(100)).unwrap());
        let mut s = SlidingLogState::new();
        assert!(log.decide(&mut s, 0, 1).is_allowed());
        assert!(log.decide(&mut s, 10 * MS, 2).is_allowed());
        let d = log.decide(&mut s, 20 * MS, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(80)));
        assert_eq!(d.reset_after(), Duration::from_millis(90));
        let d = log.decide(&mut s, 20 * MS, 3);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(90)));
        // At exactly ts + W the entry no longer counts.
        assert_eq!(log.decide(&mut s, 100 * MS, 1).remaining(), 0);
        assert_eq!(s.len(), 2);
        assert!(log.is_idle(&s, 200 * MS));
    }

    #[test]
    fn same_instant_merges_and_refund_takes_off_its_entry() {
        let log = SlidingLog::new(&Quota::new(5, Duration::from_secs(1)).unwrap());
        let mut s = SlidingLogState::new();
        for _ in 0..5 {
            assert_eq!(log.decide_stamped(&mut s, 7, 1).1, Some(7));
        }
        assert_eq!(s.entries().collect::<Vec<_>>(), [(7, 5)]);
        log.refund(&mut s, 7, 2, 7);
        assert_eq!(log.peek(&s, 7, 1).remaining(), 2);
        assert!(log.decide(&mut s, 7, 6).is_cannot_fit());
        assert_eq!(log.decide(&mut s, 7, 0).remaining(), 2);
    }
}
