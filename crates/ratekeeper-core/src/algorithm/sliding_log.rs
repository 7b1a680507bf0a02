use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use super::{KeyedAlgorithm, lock, receipt};
use crate::decision::Receipt;
use crate::{Decision, Outcome, Quota};

#[cfg(test)]
thread_local! {
    /// Log entries read by this thread's checks and peeks (tests measure the work per check
    /// with it, never the time).
    static VISITED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one log entry read (a no-op outside tests).
#[inline(always)]
fn visit() {
    #[cfg(test)]
    VISITED.with(|v| v.set(v.get() + 1));
}

/// Per-key state of a [`SlidingLog`]: `(timestamp ns, units)` entries, oldest first, with
/// strictly increasing timestamps (charges at the same instant are merged into one entry).
///
/// Every entry holds at least one unit and the units add up to at most `limit`, so a key
/// holds at most `limit` entries, and a request of cost `n` adds one entry, not `n`.
/// The empty log is "absent". A Redis mirror stores the same pairs (for example a sorted set
/// scored by timestamp, or a list of `timestamp:units` strings).
///
/// **Running totals.** Each entry is kept as its timestamp and the running total of units
/// charged up to and including it (a `u64` counter that may wrap; only differences are
/// read), with the total before the oldest entry beside them. The units in any suffix of the
/// log are then one subtraction, and "the first entry at which `k` units have left" is a
/// binary search, so a check does not read the whole log (16 bytes per entry, as before).
#[derive(Clone, Default)]
pub struct SlidingLogState {
    /// `(timestamp ns, running total through this entry)`, oldest first.
    entries: VecDeque<(u64, u64)>,
    /// The running total before the oldest entry.
    base: u64,
}

impl SlidingLogState {
    /// An empty log ("absent").
    pub const fn new() -> Self {
        Self {
            entries: VecDeque::new(),
            base: 0,
        }
    }

    /// The entries `(timestamp ns, units)`, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        (0..self.entries.len()).map(|i| {
            let (ts, end) = self.entries[i];
            (ts, end.wrapping_sub(self.total_before(i)))
        })
    }

    /// The number of entries held (at most the limit).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The running total before entry `i`.
    #[inline]
    fn total_before(&self, i: usize) -> u64 {
        match i.checked_sub(1).and_then(|j| self.entries.get(j)) {
            Some(&(_, end)) => end,
            None => self.base,
        }
    }

    /// The running total through the newest entry.
    #[inline]
    fn total(&self) -> u64 {
        self.entries.back().map_or(self.base, |&(_, end)| end)
    }

    /// The units held by entries `from..`.
    #[inline]
    fn used_from(&self, from: usize) -> u64 {
        self.total().wrapping_sub(self.total_before(from))
    }

    /// The first index in `lo..hi` at which `pred` holds (`hi` if none), for a `pred` that
    /// is false then true along the log: a binary search.
    fn first(&self, mut lo: usize, mut hi: usize, pred: impl Fn(u64, u64) -> bool) -> usize {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            visit();
            let (ts, end) = self.entries[mid];
            if pred(ts, end) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }
}

impl PartialEq for SlidingLogState {
    /// Equal when they hold the same `(timestamp, units)` entries.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.entries().eq(other.entries())
    }
}

impl Eq for SlidingLogState {}

impl fmt::Debug for SlidingLogState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingLogState")
            .field("entries", &self.entries().collect::<Vec<_>>())
            .finish()
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
/// Memory per key is O(limit) in the worst case (one entry per distinct instant). The
/// algorithm takes no burst: a policy with a burst other than the limit is refused by
/// [`Policy::validate`](crate::Policy::validate).
///
/// **Cost per check.** The state keeps running totals ([`SlidingLogState`]), so `used` is
/// one subtraction and the entry `k` of a denial is a binary search: with `e` entries held,
/// a check is O(1) amortized when allowed (each entry is dropped once) and O(log e) when
/// denied, a peek is O(log e) and copies nothing, and a refund is O(entries after the
/// refunded one) (usually the newest). The decisions are those of the formulas above.
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

    /// Drops the expired entries (each entry is dropped once: O(1) amortized).
    fn prune(&self, state: &mut SlidingLogState, now: u64) {
        while let Some(&(ts, end)) = state.entries.front() {
            visit();
            if ts.saturating_add(self.window) <= now {
                state.entries.pop_front();
                state.base = end;
            } else {
                break;
            }
        }
    }

    /// The index of the oldest entry that has not expired at `now` (a binary search).
    fn first_live(&self, state: &SlidingLogState, now: u64) -> usize {
        state.first(0, state.len(), |ts, _| ts.saturating_add(self.window) > now)
    }

    /// The report over the entries `from..` (the live ones).
    fn report(&self, outcome: Outcome, state: &SlidingLogState, from: usize, now: u64) -> Decision {
        let remaining = u64::from(self.limit).saturating_sub(state.used_from(from));
        let reset = if from < state.len() {
            state
                .entries
                .back()
                .map_or(0, |&(ts, _)| self.expires_in(ts, now))
        } else {
            0
        };
        Decision::new(
            outcome,
            self.limit,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_nanos(reset),
        )
    }

    /// The verdict over the entries `from..` (the live ones).
    fn verdict(&self, state: &SlidingLogState, from: usize, now: u64, cost: u64) -> Outcome {
        let limit = u64::from(self.limit);
        if cost > limit {
            return Outcome::CannotFit;
        }
        let used = state.used_from(from);
        if cost <= limit.saturating_sub(used) {
            return Outcome::Allowed;
        }
        // Free `need` units: the entries leave oldest first, so the wait is the expiry of
        // the first entry at which the units left so far reach `need` (`need <= used`, as
        // `cost <= limit`): a binary search over the running totals.
        let need = used.saturating_add(cost) - limit;
        let before = state.total_before(from);
        let k = state.first(from, state.len(), |_, end| end.wrapping_sub(before) >= need);
        let wait = state
            .entries
            .get(k)
            .or(state.entries.back())
            .map_or(0, |&(ts, _)| self.expires_in(ts, now));
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
        let outcome = self.verdict(state, 0, now, cost);
        let mut stamp = None;
        if outcome == Outcome::Allowed && cost > 0 {
            let total = state.total().wrapping_add(cost);
            match state.entries.back_mut() {
                Some((ts, end)) if *ts >= now => {
                    *end = total;
                    stamp = Some(*ts);
                }
                _ => {
                    state.entries.push_back((now, total));
                    stamp = Some(now);
                }
            }
        }
        (self.report(outcome, state, 0, now), stamp)
    }

    /// What [`SlidingLog::decide`] would answer, without changing `state` (the expired
    /// entries are skipped by a binary search, not copied).
    pub fn peek(&self, state: &SlidingLogState, now: u64, cost: u64) -> Decision {
        let from = self.first_live(state, now);
        let outcome = self.verdict(state, from, now, cost);
        self.report(outcome, state, from, now)
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
        let units = state.entries[i].1.wrapping_sub(state.total_before(i));
        let back = cost.min(units);
        // The running totals from this entry on drop by what comes back.
        for (_, end) in state.entries.range_mut(i..) {
            *end = end.wrapping_sub(back);
        }
        if back == units {
            state.entries.remove(i);
        }
    }

    /// Charges `extra` units at `now` without refusing (a correction whose true cost came
    /// out higher than its estimate): they join the newest entry when it is stamped `now`
    /// or later, else a new entry stamped `now`. The live units may exceed the limit: the
    /// log refuses until enough of them expired, oldest first (an entry more per
    /// correction, beyond the `limit` entries a log otherwise holds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_core::algorithm::{SlidingLog, SlidingLogState};
    /// use ratekeeper_core::Quota;
    ///
    /// let log = SlidingLog::new(&Quota::new(2, Duration::from_secs(60))?);
    /// let s = 1_000_000_000;
    /// let mut state = SlidingLogState::new();
    /// log.decide(&mut state, 0, 1);
    /// log.debit(&mut state, 10 * s, 2); // 3 units live, 1 over the limit
    /// // Both the first entry (at 60 s) and the debit (at 70 s) must leave for one unit.
    /// let wait = log.peek(&state, 20 * s, 1).retry_after();
    /// assert_eq!(wait, Some(Duration::from_secs(50)));
    /// # Ok::<(), ratekeeper_core::QuotaError>(())
    /// ```
    pub fn debit(&self, state: &mut SlidingLogState, now: u64, extra: u64) {
        self.prune(state, now);
        if extra == 0 {
            return;
        }
        let total = state.total().wrapping_add(extra);
        match state.entries.back_mut() {
            Some((ts, end)) if *ts >= now => *end = total,
            _ => state.entries.push_back((now, total)),
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

    fn refund(&self, state: &Self::State, now: u64, cost: u64, stamp: u64) -> bool {
        SlidingLog::refund(self, &mut lock(state), now, cost, stamp);
        false
    }

    fn debit(&self, state: &Self::State, now: u64, extra: u64) {
        SlidingLog::debit(self, &mut lock(state), now, extra);
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

    /// Item 4 of the sweep: a check's work does not grow with the entries one key holds.
    /// Counts the log entries each check and peek reads (work, not time) with one key
    /// holding n and 4n entries: a handful (a binary search), never the whole log.
    #[test]
    fn sweep_quadratic_sliding_log_check_work_is_flat() {
        let mut per_check = Vec::new();
        for n in [4_096u64, 16_384] {
            let limit = u32::try_from(n).unwrap();
            let log = SlidingLog::new(&Quota::new(limit, Duration::from_secs(3_600)).unwrap());
            let mut s = SlidingLogState::new();
            for i in 0..n {
                assert!(log.decide(&mut s, i, 1).is_allowed());
            }
            assert_eq!(s.len(), usize::try_from(n).unwrap());
            let now = n;
            let before = VISITED.with(std::cell::Cell::get);
            let rounds = 8;
            for _ in 0..rounds {
                // Denied: the oldest entry frees the room (retry_after from entry 0).
                let d = log.decide(&mut s, now, 1);
                assert_eq!(
                    d.retry_after(),
                    Some(Duration::from_nanos(3_600 * 1_000 * MS - now))
                );
                // Denied: the whole log must leave (the newest entry decides).
                let d = log.decide(&mut s, now, n);
                let newest = 3_600 * 1_000 * MS + (n - 1) - now;
                assert_eq!(d.retry_after(), Some(Duration::from_nanos(newest)));
                assert_eq!(log.peek(&s, now, n / 2).remaining(), 0);
                assert!(log.peek(&s, now, 0).is_allowed());
            }
            let visited = VISITED.with(std::cell::Cell::get) - before;
            per_check.push(visited / (4 * rounds));
        }
        // A binary search reads about 2 log2(n) entries; the whole log would be n or 2n.
        for (n, visited) in [4_096u64, 16_384].into_iter().zip(&per_check) {
            assert!(
                *visited <= 64,
                "{visited} entries read per check at n = {n}"
            );
        }
    }

    /// The running totals are differences of a wrapping counter: a log whose counter wraps
    /// past `u64::MAX` decides, peeks and refunds exactly as a fresh one.
    #[test]
    fn running_totals_may_wrap() {
        let log = SlidingLog::new(&Quota::new(5, Duration::from_secs(1)).unwrap());
        let mut fresh = SlidingLogState::new();
        let mut wrapped = SlidingLogState {
            entries: VecDeque::new(),
            base: u64::MAX - 2,
        };
        for (now, cost) in [(0, 2), (MS, 2), (2 * MS, 2), (3 * MS, 1), (1_000 * MS, 3)] {
            let a = log.decide_stamped(&mut fresh, now, cost);
            let b = log.decide_stamped(&mut wrapped, now, cost);
            assert_eq!(a, b);
            assert_eq!(fresh, wrapped);
            assert_eq!(log.peek(&fresh, now, 4), log.peek(&wrapped, now, 4));
        }
        log.refund(&mut fresh, 1_000 * MS, 1, MS);
        log.refund(&mut wrapped, 1_000 * MS, 1, MS);
        // At 1 s the entry of t = 0 expired and cost 3 was denied (2 + 1 + 3 > 5); the
        // refund took one unit off the entry of 1 ms.
        assert_eq!(fresh.entries().collect::<Vec<_>>(), [(MS, 1), (3 * MS, 1)]);
        assert_eq!(log.peek(&wrapped, 1_000 * MS, 3).remaining(), 3);
        assert_eq!(fresh, wrapped);
    }
}
