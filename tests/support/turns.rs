//! Delay-mode turns on the store's own clock: a store wrapper that records the slot every
//! live reservation holds, so a test checks the spacing of turns where the store decided
//! them, not on the app's clock.
//!
//! On a loaded machine a request enters its handler late by however long the scheduler
//! keeps its task waiting, so two entries can be closer than the emission interval `T` even
//! though the store booked them `T` apart; entry times are only exact on a virtual clock.
//! What the store booked is exact on any machine: for GCRA a reservation's receipt is the
//! TAT right after its charge, so its turn is `receipt - T`, and two live reservations
//! whose receipts are less than `T` apart share a slot (the defect a double booking or a
//! refund of a later reservation's slot causes).
//!
//! ```text
//! let (store, turns) = Booked::new(RedisStore::builder().standalone(&url).await?, Duration::from_micros(1));
//! // ... a Delay-mode layer over `store`, requests, dropped waiters ...
//! assert!(turns.log().min_spacing.is_none_or(|s| s >= t));
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ratekeeper_core::Policy;
use ratekeeper_core::store::{Charge, Checked, Decisions, PolicyId, Refund, Store, StoreError};

/// What a [`Booked`] store saw, in the order the store answered.
#[derive(Debug, Clone, Default)]
pub struct Log {
    /// Receipts of the allowed charges not refunded since, as durations on the store's clock
    /// (the stamp times the store's unit).
    pub live: Vec<Duration>,
    /// The delay of every allowed answer (zero: proceed now; positive: a reservation).
    pub delays: Vec<Duration>,
    /// Answers that were denials, and whether each was final.
    pub denials: Vec<bool>,
    /// Every answer the store gave (check or reserve, allowed or not, errors included).
    pub answers: usize,
    /// Store errors (a decision the failure policy would have made).
    pub errors: usize,
    /// The smallest distance between a new allowed charge's receipt and a live one, over
    /// the whole run; `None` while at most one charge was live at a time.
    pub min_spacing: Option<Duration>,
}

impl Log {
    fn note(&mut self, unit: Duration, result: &Result<Decisions, StoreError>) {
        self.answers += 1;
        let decisions = match result {
            Ok(d) => d,
            Err(_) => {
                self.errors += 1;
                return;
            }
        };
        if !decisions.is_allowed() {
            self.denials.push(decisions.is_final());
            return;
        }
        self.delays.push(decisions.delay());
        for stamp in decisions.receipts().filter_map(|r| r.stamp()) {
            let at = stamp_time(stamp, unit);
            for live in &self.live {
                let spacing = at.abs_diff(*live);
                self.min_spacing = Some(self.min_spacing.map_or(spacing, |m| m.min(spacing)));
            }
            self.live.push(at);
        }
    }

    fn refund(&mut self, unit: Duration, stamp: u64) {
        let at = stamp_time(stamp, unit);
        if let Some(i) = self.live.iter().position(|l| *l == at) {
            self.live.swap_remove(i);
        }
    }
}

/// A stamp in `unit` as a duration (Redis stamps are µs since the Unix epoch: about 2^51,
/// so their ns fit a `u64` for another 500 years).
fn stamp_time(stamp: u64, unit: Duration) -> Duration {
    let unit_ns = u64::try_from(unit.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(stamp.saturating_mul(unit_ns))
}

/// A handle on a [`Booked`] store's [`Log`].
#[derive(Debug, Clone, Default)]
pub struct Turns(Arc<Mutex<Log>>);

impl Turns {
    /// A copy of the log so far.
    pub fn log(&self) -> Log {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A store that forwards every call to `inner` and records its answers and refunds in a
/// [`Log`] (see the module docs).
#[derive(Debug)]
pub struct Booked<S> {
    inner: S,
    unit: Duration,
    turns: Turns,
}

impl<S> Booked<S> {
    /// Wraps `inner`, whose receipts are stamps in `unit` (the memory store: 1 ns; the Redis
    /// store: 1 µs); returns the store and the handle on its log.
    pub fn new(inner: S, unit: Duration) -> (Self, Turns) {
        let turns = Turns::default();
        let store = Self {
            inner,
            unit,
            turns: turns.clone(),
        };
        (store, turns)
    }

    fn record<F>(&self, checked: Checked<F>) -> Checked<BoxedCheck>
    where
        F: Future<Output = Result<Decisions, StoreError>> + Send + 'static,
    {
        let (log, unit) = (Arc::clone(&self.turns.0), self.unit);
        match checked {
            Checked::Ready(result) => {
                lock(&log).note(unit, &result);
                Checked::Ready(result)
            }
            Checked::Pending(future) => Checked::Pending(Box::pin(async move {
                let result = future.await;
                lock(&log).note(unit, &result);
                result
            })),
        }
    }
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The future of a [`Booked`] store's pending answer.
pub type BoxedCheck = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send>>;

impl<K, S> Store<K> for Booked<S>
where
    K: ?Sized + 'static,
    S: Store<K>,
{
    type Future = BoxedCheck;

    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        self.inner.register(policy)
    }

    fn check(&self, charges: &[Charge<'_, K>]) -> Checked<Self::Future> {
        self.record(self.inner.check(charges))
    }

    fn reserve(&self, charges: &[Charge<'_, K>], max_wait: Duration) -> Checked<Self::Future> {
        self.record(self.inner.reserve(charges, max_wait))
    }

    fn refund(&self, refunds: &[Refund<'_, K>]) {
        {
            let mut log = lock(&self.turns.0);
            for stamp in refunds.iter().filter_map(|r| r.receipt.stamp()) {
                log.refund(self.unit, stamp);
            }
        }
        self.inner.refund(refunds);
    }

    fn unix_now(&self) -> Duration {
        self.inner.unix_now()
    }
}
