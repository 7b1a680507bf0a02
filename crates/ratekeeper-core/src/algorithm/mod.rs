//! Rate-limiting algorithms.
//!
//! Every algorithm is a pure decision over `(state, now, cost)`: it never reads a clock.
//! Stores keep the state per key and update it atomically.
//!
//! | algorithm | state per key | notes |
//! |---|---|---|
//! | [`Gcra`] (default) | one `u64` TAT | token bucket in one number; cost n advances TAT by `n * T` |
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::algorithm::Gcra;
//! use ratekeeper_core::{Outcome, Quota};
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
//! ```

mod gcra;

pub use gcra::Gcra;

use crate::Decision;

/// Which algorithm a policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a token bucket held in one number (the default).
    #[default]
    Gcra,
}

/// An algorithm bound to a quota, as the memory store runs it: per-key state with an atomic
/// check, a refund, and an idleness test for eviction.
pub(crate) trait KeyedAlgorithm: Send + Sync + 'static {
    /// Per-key state; `Default` is "absent".
    type State: Default + Send + Sync + 'static;

    /// Decides and, if allowed, charges `cost` atomically.
    fn check(&self, state: &Self::State, now: u64, cost: u64) -> Decision;

    /// Decides without charging.
    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision;

    /// Gives back `cost` units charged earlier.
    fn refund(&self, state: &Self::State, now: u64, cost: u64);

    /// Whether the state equals "absent" at `now`, so the key can be evicted unseen.
    fn is_idle(&self, state: &Self::State, now: u64) -> bool;
}
