//! Outbound throttling: wait for capacity instead of being refused (feature `tokio`).
//!
//! A [`Throttle`] keeps a client under someone else's limit: before each call to an external
//! API, `acquire(key, cost, max_wait).await` returns when the call fits the same quotas the
//! API enforces, sleeping on tokio's timer for exactly the `retry_after` the algorithm
//! computes. It is bounded:
//!
//! - a cost larger than a policy's capacity fails at once with [`ThrottleError::CannotFit`]
//!   and never sleeps;
//! - when the wait would end after `max_wait`, it fails at once with
//!   [`ThrottleError::WouldExceedDeadline`] instead of sleeping in vain;
//! - a denied attempt charges nothing, so waiting never moves the state.
//!
//! Any [`Store`] works; use a store on [`TokioClock`](crate::clock::TokioClock) so tokio's
//! paused time (tests) and the limiter agree on "now".
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use ratekeeper_core::store::MemoryStore;
//! use ratekeeper_core::clock::TokioClock;
//! use ratekeeper_core::throttle::{Throttle, ThrottleError};
//! use ratekeeper_core::{Key, Policy};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The external API allows 10 per second; send at most that, one every 100 ms.
//! let policy = Policy::new("upstream", "10/s burst 1".parse()?);
//! let throttle = Throttle::new(MemoryStore::with_clock(TokioClock::new()), &[policy])?;
//! let start = tokio::time::Instant::now();
//! for _ in 0..5 {
//!     throttle.acquire(&Key::Global, 1, Duration::from_secs(1)).await?;
//! }
//! assert_eq!(start.elapsed(), Duration::from_millis(400));
//!
//! // Cost 2 can never fit a burst of 1: an error at once, no sleep.
//! let err = throttle.acquire(&Key::Global, 2, Duration::from_secs(60)).await.unwrap_err();
//! assert!(matches!(err, ThrottleError::CannotFit(_)));
//! assert_eq!(start.elapsed(), Duration::from_millis(400));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use smallvec::SmallVec;

use crate::Policy;
use crate::store::{Charge, Checked, Decisions, PolicyId, Store, StoreError};

/// Why [`Throttle::acquire`] gave up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThrottleError {
    /// The cost is larger than a policy's capacity: it can never pass, so nothing waited.
    #[error("the cost can never fit the quota")]
    CannotFit(Decisions),
    /// Capacity comes back only after `retry_after`, later than the deadline; returned at
    /// once, without sleeping.
    #[error("capacity comes back in {}, after the deadline", seconds(*retry_after))]
    WouldExceedDeadline {
        /// Time from the failed attempt until the same cost would pass.
        retry_after: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub use crate::seconds::seconds;

impl ThrottleError {
    /// Whether the cost can never fit.
    pub fn is_cannot_fit(&self) -> bool {
        matches!(self, Self::CannotFit(_))
    }

    /// Whether the wait would have exceeded the deadline.
    pub fn is_deadline(&self) -> bool {
        matches!(self, Self::WouldExceedDeadline { .. })
    }
}

/// Waits for capacity under one or more policies (see the [module docs](self)).
pub struct Throttle<K, St> {
    store: St,
    ids: SmallVec<[PolicyId; 4]>,
    key: PhantomData<fn(&K)>,
}

impl<K, St> fmt::Debug for Throttle<K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("policies", &self.ids)
            .finish_non_exhaustive()
    }
}

impl<K, St: Store<K>> Throttle<K, St> {
    /// Registers `policies` with `store`; every acquire charges all of them, all-or-nothing.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store refuses a policy (invalid name, unsupported algorithm).
    pub fn new(mut store: St, policies: &[Policy]) -> Result<Self, StoreError> {
        let mut ids = SmallVec::new();
        for p in policies {
            ids.push(store.register(p)?);
        }
        Ok(Self {
            store,
            ids,
            key: PhantomData,
        })
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// Returns once `cost` units are charged to `key` under every policy, sleeping (tokio's
    /// timer) for the exact `retry_after` between attempts, for at most `max_wait` in total.
    ///
    /// # Errors
    ///
    /// [`ThrottleError::CannotFit`] at once when the cost exceeds a capacity;
    /// [`ThrottleError::WouldExceedDeadline`] at once when capacity comes back after
    /// `max_wait`; [`ThrottleError::Store`] when the store fails. Nothing is charged then.
    pub async fn acquire(
        &self,
        key: &K,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decisions, ThrottleError> {
        let start = tokio::time::Instant::now();
        loop {
            let decisions = {
                let charges: SmallVec<[Charge<'_, K>; 4]> = self
                    .ids
                    .iter()
                    .map(|&id| Charge::new(id, key, cost))
                    .collect();
                match self.store.check(&charges) {
                    Checked::Ready(result) => result?,
                    Checked::Pending(future) => future.await?,
                }
            };
            if decisions.is_allowed() {
                return Ok(decisions);
            }
            let Some(retry_after) = decisions.retry_after() else {
                return Err(ThrottleError::CannotFit(decisions));
            };
            if start.elapsed().saturating_add(retry_after) > max_wait {
                return Err(ThrottleError::WouldExceedDeadline { retry_after });
            }
            tokio::time::sleep(retry_after).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TokioClock;
    use crate::store::MemoryStore;
    use crate::{Algorithm, Key, Quota};

    fn throttle(quota: &str, algorithm: Algorithm) -> Throttle<Key, MemoryStore<Key, TokioClock>> {
        let policy = Policy::new("p", quota.parse::<Quota>().unwrap()).with_algorithm(algorithm);
        Throttle::new(MemoryStore::with_clock(TokioClock::new()), &[policy]).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn spaces_calls_at_the_quota_rate_for_every_algorithm() {
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ] {
            let t = throttle("5/s", algorithm);
            let start = tokio::time::Instant::now();
            for _ in 0..20 {
                t.acquire(&Key::Global, 1, Duration::from_secs(10))
                    .await
                    .unwrap();
            }
            // 5 at once, then 15 more at 5 per second: 3 s. The sliding window counter's
            // estimate is conservative right after a full window, so it takes longer.
            let took = start.elapsed();
            let most = if algorithm == Algorithm::SlidingWindow {
                Duration::from_millis(4_500)
            } else {
                Duration::from_millis(3_000)
            };
            assert!(
                took >= Duration::from_millis(2_800) && took <= most,
                "{algorithm}: {took:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_and_cannot_fit_fail_at_once() {
        let t = throttle("1/min", Algorithm::Gcra);
        t.acquire(&Key::Global, 1, Duration::ZERO).await.unwrap();
        let start = tokio::time::Instant::now();
        let err = t
            .acquire(&Key::Global, 1, Duration::from_secs(59))
            .await
            .unwrap_err();
        assert!(err.is_deadline());
        assert_eq!(start.elapsed(), Duration::ZERO);
        let err = t
            .acquire(&Key::Global, u64::MAX, Duration::MAX)
            .await
            .unwrap_err();
        assert!(err.is_cannot_fit());
        assert_eq!(start.elapsed(), Duration::ZERO);
        t.acquire(&Key::Global, 1, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }
}
