//! Rate-limiting algorithms.
//!
//! Every algorithm is a pure decision over `(state, now, cost)`: it never reads a clock.
//! Stores keep the state per key and update it atomically. All of them share these semantics:
//! time in integer nanoseconds with saturating arithmetic; a denial
//! charges nothing; `remaining` is whole cost-1 requests that would pass now;
//! `reset_after` is the time until the state equals "absent"; `retry_after` is exact; a
//! cost larger than the capacity is [`Outcome::CannotFit`](crate::Outcome::CannotFit); a
//! cost of 0 is a free probe.
//!
//! | algorithm | state per key | burst | smoothness | memory per key | accuracy |
//! |---|---|---|---|---|---|
//! | [`Gcra`] (default, token bucket) | one `u64` TAT | `burst` at once, then one per `T` | smooth after the burst | 8 bytes, lock-free | exact |
//! | [`LeakyBucket`] | one `u64` (time the bucket is empty) | meter: `burst` (queue depth) at once; shaper: none, output spaced by `T` | shaper: perfectly smooth | 8 bytes, lock-free | exact |
//! | [`FixedWindow`] | window index + count | up to `2 * limit` around a window boundary | bursty at boundaries | 16 bytes + lock | exact per aligned window, not per sliding period |
//! | [`SlidingLog`] | `(timestamp, units)` pairs | `limit` in any window `W` | as requested | up to `limit` entries (16 bytes each) | exact for every window `(t - W, t]` |
//! | [`SlidingWindow`] (counter) | window index + current + previous count | `limit` in any window, approximately | smoother than fixed | 24 bytes + lock | estimate; assumes the previous window's units were spread evenly |
//! | [`Concurrency`] | in-flight count | `limit` in flight | n/a | 8 bytes, lock-free | exact |
//!
//! `T = period / limit` (rounded up to a whole ns) and `W = period`. The token-bucket
//! family uses `burst` as its capacity; the window algorithms and the concurrency counter
//! use `limit` and take no burst ([`Algorithm::capacity`](crate::Algorithm::capacity)): a
//! policy pairing them with a burst other than the limit is refused when a limiter is built
//! ([`PolicyError::BurstNotSupported`](crate::PolicyError::BurstNotSupported)).
//!
//! The window-boundary trace (limit 10 per 60 s, one key, 10 requests at t = 59.9 s
//! then 10 at t = 60.1 s) gives, for the most admitted in any 60 s span:
//!
//! | algorithm | admitted | max in any 60 s | the second batch |
//! |---|---|---|---|
//! | fixed window (aligned to multiples of 60 s from time 0) | 20 | **20** | 200, Remaining 9..0, Reset 60 |
//! | sliding log | 10 | **10** | 429, `Retry-After: 60` (oldest entry leaves at 119.9 s) |
//! | sliding window counter | 10 | **10** | 429 (estimate 10 x (1 - 100/60000) = 9.983) |
//! | GCRA / token bucket, leaky bucket (burst 10) | 10 | **10** | 429, `Retry-After: 6` (5.8 s rounded up) |
//!
//! # The algorithms on one trace
//!
//! Every algorithm (but the concurrency counter) run in the memory store on a manual clock
//! over the same 180 s bursty trace, quota 10 per minute (burst 10): 12 requests at 0 s, 4
//! at 30 s, 3 at 75 s, 10 at 119.5 s and 10 at 120.5 s (either side of a window boundary),
//! then one every 3 s from 150 s on. Top: requests admitted so far; bottom: the remaining
//! capacity each reports (whole requests), read every 250 ms with a free probe (cost 0).
//! GCRA and the leaky bucket (as a meter) coincide and refill steadily; only the fixed window
//! admits a second batch of 10 right after the boundary (17 within 1 s), and then nothing
//! until its next window; the sliding log admits the fewest (23 of 49).
//! The chart is drawn by `cargo run -p ratekeeper-examples-chart --example algorithms_chart` in
//! the ratekeeper repository.
//!
#![doc = include_str!("../../docs/algorithms.svg")]
//!
//! # State layouts (for store implementations)
//!
//! A store that keeps state elsewhere (for example a Redis script) mirrors these exactly.
//! The formulas only add, subtract, multiply and divide integers, so they work in any time
//! unit (the memory store uses ns; a store in µs computes `T` and `W` in µs), with the same
//! rounding: `T = ceil(period / limit)`, at least 1. "Absent" is the state of a key never
//! seen; a store may delete a key whose state is idle, and `reset_after` of the last
//! decision is exactly the time until then (a TTL).
//!
//! | algorithm | stored values | absent / idle when |
//! |---|---|---|
//! | GCRA, leaky bucket | `tat` | `tat <= now` |
//! | fixed window | `window = floor(t / W)`, `count` | `count == 0` or `window != floor(now / W)` |
//! | sliding log | `(ts, units)` pairs, oldest first, merged per instant | every `ts + W <= now` |
//! | sliding window counter | `window`, `current`, `previous` | both counts zero after rolling to `floor(now / W)` |
//! | concurrency | `held` | `held == 0` |
//!
//! # Refunds work on receipts
//!
//! A refund gives back only what its own charge still holds. Every allowed charge has a
//! stamp (the [`Receipt`] a store hands out), and each algorithm's
//! `refunded` works on it:
//!
//! | algorithm | stamp | a refund of cost `n` at `now` gives back |
//! |---|---|---|
//! | GCRA, leaky bucket | TAT right after the charge (the end of its slot) | the undrained part of the charge's slot, in any order of refunds (the FIFO ledger of [`Receipt`]; [`Gcra::refunded`] on the TAT); nothing while a later reservation waits |
//! | fixed window | window index | `min(n, count)` while the window is still the current one; nothing after |
//! | sliding window counter | window index | `min(n, current)` in the same window; `min(n, previous)` in the next (the part the estimate still counts); nothing later |
//! | sliding log | the entry's timestamp | at most `n` units of that entry, while `ts + W > now`; nothing once it expired |
//! | concurrency | the time of the check (a store may use it to tell lives of a key apart) | `min(n, held)`: a permit is a permit |
//!
//! # Corrections: give back, or charge the extra without refusing
//!
//! When a charge's true cost becomes known after its decision
//! ([`Store::correct`](crate::store::Store::correct)), a lower cost gives back the
//! difference by the refund rules above, and a higher one is charged at the time of the
//! correction without refusing, so the state may go beyond the capacity (a debt):
//!
//! | algorithm | extra `x` at `now` | later requests |
//! |---|---|---|
//! | GCRA, leaky bucket | `TAT = max(TAT, now) + x * T` ([`Gcra::debited`]) | refused until `TAT + n * T - tau <= now`: each unit of debt waits `T` |
//! | fixed window | `count += x` in the window of `now` | refused until the window ends |
//! | sliding window counter | `current += x` in the window of `now` | the estimate counts the debt, in its window and weighted in the next |
//! | sliding log | `x` units in an entry stamped `now` | refused until enough units expired, oldest first |
//! | concurrency | nothing (a permit is a permit) | |
//!
//! A give-back pays a debt off: GCRA and the leaky bucket read a TAT beyond the tolerance as
//! a debt ([`Gcra::given_back`]), and the memory store reads window counts above the limit
//! as they are.
//!
//! # Parameters in force
//!
//! Every algorithm reads stored state under the quota it was built with, clamped so that a
//! state written under another quota (a store that outlives a deploy) is never "fuller than
//! full" and never needs a longer wait than this quota needs from empty: GCRA and the leaky
//! bucket read `TAT <= now + tau`; the window counts read `<= limit`; the sliding log's
//! waits never exceed `W` however many units its entries hold; the concurrency counter keeps
//! permits held above a lowered limit (they are real requests in flight) and denies until
//! enough are released. The [`MemoryStore`](crate::store::MemoryStore) fixes each policy's
//! quota when it is registered, so its state is always under the quota in force.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::algorithm::Gcra;
//! use ratekeeper_core::{Algorithm, Outcome, Quota};
//!
//! // 10 per minute, burst 10: T = 6 s, tau = 60 s.
//! let gcra = Gcra::new(&Quota::per_minute(NonZeroU32::new(10).unwrap()));
//! let mut tat = 0;
//! for expected in (0..10).rev() {
//!     let (d, new_tat) = gcra.decide(tat, 0, 1);
//!     assert_eq!(d.remaining(), expected);
//!     tat = new_tat.unwrap();
//! }
//! let (denied, unchanged) = gcra.decide(tat, 0, 1);
//! assert_eq!(denied.outcome(), Outcome::Denied { retry_after: Duration::from_secs(6) });
//! assert_eq!(unchanged, None);
//!
//! // Algorithms are also chosen by name (configuration files).
//! assert_eq!("sliding-log".parse::<Algorithm>(), Ok(Algorithm::SlidingLog));
//! assert_eq!("token_bucket".parse::<Algorithm>(), Ok(Algorithm::Gcra));
//! ```

mod concurrency;
mod fixed_window;
mod gcra;
pub(crate) mod kind;
mod leaky_bucket;
mod ledger;
mod sliding_log;
mod sliding_window;

pub use concurrency::Concurrency;
pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::Gcra;
pub use leaky_bucket::{LeakyBucket, Shaped};
pub(crate) use ledger::Ledger;
#[cfg(feature = "redis")]
pub(crate) use ledger::MAX_SPANS as LEDGER_MAX_SPANS;
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::Decision;
use crate::decision::Receipt;

/// Locks a per-key state. A poisoned lock (a panic elsewhere while holding it) still holds a
/// valid state, because every update is a single assignment, so it is used as is: the
/// request path never panics.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An algorithm bound to a quota, as the memory store runs it: per-key state with an atomic
/// check that returns the [`Receipt`] of what it charged, a refund that works on that
/// receipt, and an idleness test for eviction.
pub(crate) trait KeyedAlgorithm: Send + Sync + 'static {
    /// Per-key state; `Default` is "absent".
    type State: Default + Send + Sync + 'static;

    /// Decides and, if allowed, charges `cost` atomically. The receipt of an allowed charge
    /// carries the algorithm's stamp (see [`Receipt`]); nothing charged is
    /// [`Receipt::NONE`].
    fn check(&self, state: &Self::State, now: u64, cost: u64) -> (Decision, Receipt);

    /// Decides without charging.
    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision;

    /// Gives back what the charge of `cost` units with receipt `stamp` still holds at `now`
    /// (the rules of each algorithm's `refunded`). Only called for a [`Receipt`] that is not
    /// [`Receipt::NONE`].
    ///
    /// Returns true, changing nothing, for a refund this state cannot settle exactly: for
    /// GCRA and the leaky bucket, a refund out of the middle of the schedule (a charge other
    /// than the latest whose undrained part would come out). Taking it out of one TAT would
    /// leave the stamps of the charges after it above their slots, so that their refunds
    /// could give back more than they hold; the store settles it on the key's FIFO ledger
    /// instead ([`Ledger`]), where every slot keeps its place. False otherwise (the refund
    /// was applied, or gave back nothing).
    fn refund(&self, state: &Self::State, now: u64, cost: u64, stamp: u64) -> bool;

    /// Gives back `cost` units of the charge with receipt `stamp` for a correction (its
    /// true cost came out lower than its estimate): the rules of
    /// [`KeyedAlgorithm::refund`], whose answer it returns; GCRA and the leaky bucket read a
    /// TAT beyond the tolerance as a debt to pay off ([`Gcra::given_back`]).
    fn give_back(&self, state: &Self::State, now: u64, cost: u64, stamp: u64) -> bool {
        self.refund(state, now, cost, stamp)
    }

    /// Charges `extra` units at `now` without refusing (a correction whose true cost came
    /// out higher than its estimate): the state may go beyond the capacity, a debt that
    /// later checks wait out. The concurrency counter charges nothing (a permit is a
    /// permit, whatever the request cost).
    fn debit(&self, state: &Self::State, now: u64, extra: u64);

    /// Whether the state equals "absent" at `now`, so the key can be evicted unseen: no
    /// receipt it handed out can take anything from a state created later.
    fn is_idle(&self, state: &Self::State, now: u64) -> bool;

    /// How far past the time of its check a charge's stamp can lie: `tau` for GCRA and the
    /// leaky bucket (a stamp is a TAT), 0 for the others (a stamp is a time or a window).
    fn headroom(&self) -> u64 {
        0
    }

    /// The largest stamp a check made at or before `now` can have handed out.
    fn stamp_bound(&self, now: u64) -> u64 {
        now
    }

    /// A shift of time such that a state deciding at `now + shift` hands out only stamps
    /// above `bound` from `now` on, with the same decisions (for the window algorithms, a
    /// whole number of windows). Saturates.
    fn fence_shift(&self, bound: u64, now: u64) -> u64 {
        bound.saturating_add(1).saturating_sub(now)
    }

    /// Whether no stamp up to `bound` can take anything from a state created at or after
    /// `now` (in real time).
    fn stale(&self, bound: u64, now: u64) -> bool {
        bound < now
    }

    /// The GCRA family's state is one TAT: its cell, so that a store can run this
    /// algorithm's decisions on a TAT it keeps elsewhere (a key's [`Ledger`]). `None` for
    /// the others, which never return true from [`KeyedAlgorithm::refund`].
    fn tat_cell<'a>(&self, state: &'a Self::State) -> Option<&'a std::sync::atomic::AtomicU64> {
        let _ = state;
        None
    }

    /// The length of the slot a charge of `cost` takes in a [`Ledger`] (`cost * T`,
    /// saturating, for the GCRA family; 0 for the others).
    fn slot(&self, cost: u64) -> u64 {
        let _ = cost;
        0
    }

    /// Permits the state holds (the concurrency counter); 0 for the others.
    fn permits(&self, state: &Self::State) -> u64 {
        let _ = state;
        0
    }

    /// Reserves `cost` units for a request that may wait up to `max_wait` ns. The default
    /// cannot reserve: it is [`KeyedAlgorithm::check`] (no delay, denials not final), the
    /// check-and-retry fallback of the window algorithms and the concurrency counter.
    fn reserve(&self, state: &Self::State, now: u64, cost: u64, max_wait: u64) -> Reserved {
        let _ = max_wait;
        let (decision, receipt) = self.check(state, now, cost);
        Reserved {
            decision,
            receipt,
            delay: 0,
            exact: false,
        }
    }
}

/// The answer of [`KeyedAlgorithm::reserve`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reserved {
    pub(crate) decision: Decision,
    /// What the charge took ([`Receipt::NONE`] when nothing was charged).
    pub(crate) receipt: Receipt,
    /// ns to wait before proceeding (allowed only).
    pub(crate) delay: u64,
    /// The algorithm reserved exactly: a denial is final for this `max_wait`.
    pub(crate) exact: bool,
}

/// The receipt of a charge that stored `stamp`, or [`Receipt::NONE`] when nothing changed.
#[inline]
pub(crate) fn receipt(stamp: Option<u64>) -> Receipt {
    match stamp {
        Some(stamp) => Receipt::new(stamp),
        None => Receipt::NONE,
    }
}
