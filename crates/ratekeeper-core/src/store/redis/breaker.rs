//! The circuit breaker: stop waiting on a Redis that keeps failing.
//!
//! After `threshold` failures in a row the breaker opens: for `open_for` decisions go
//! straight to the failure policy without a round trip. Then exactly one request probes
//! Redis; its success closes the breaker, its failure (or its future being dropped) opens it
//! for another period. So a dead Redis costs at most one deadline per open period, not one
//! per request. Times are nanoseconds on the app's monotonic clock (Redis fails in real
//! time, so never an injected decision clock).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug)]
pub(super) struct Breaker {
    failures: AtomicU32,
    /// 0 = closed; otherwise the clock's ns until which Redis is skipped.
    open_until: AtomicU64,
    threshold: u32,
    /// ns.
    open_for: u64,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` failures in a row for `open_for_ns`.
    pub(super) const fn new(threshold: u32, open_for_ns: u64) -> Self {
        Self {
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            threshold,
            open_for: open_for_ns,
        }
    }

    /// Whether this request may go to Redis. While open, only the first request after the
    /// open period wins the compare-and-swap and probes; the others keep skipping.
    pub(super) fn admit(&self, now: u64) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        if now < until {
            return false;
        }
        let next = now.saturating_add(self.open_for).max(1);
        self.open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Redis answered: close.
    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Release);
        self.open_until.store(0, Ordering::Release);
    }

    /// Redis failed at `now`: count, and open at the threshold.
    pub(super) fn failure(&self, now: u64) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures >= self.threshold {
            let until = now.saturating_add(self.open_for).max(1);
            self.open_until.store(until, Ordering::Release);
        }
    }

    /// Whether Redis is being skipped.
    pub(super) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_after_threshold_then_lets_one_probe_through() {
        let b = Breaker::new(3, 500);
        b.failure(10);
        b.failure(20);
        assert!(b.admit(30) && !b.is_open());
        b.failure(30);
        assert!(b.is_open());
        assert!(!b.admit(31));
        assert!(!b.admit(529));
        // Open period over: exactly one probe goes; the others keep skipping.
        assert!(b.admit(530));
        assert!(!b.admit(530));
        assert!(!b.admit(1_000));
        // The probe failed: open again from then.
        b.failure(1_000);
        assert!(!b.admit(1_499));
        assert!(b.admit(1_500));
        b.success();
        assert!(!b.is_open());
        assert!(b.admit(1_501) && b.admit(1_502));
    }

    #[test]
    fn a_dropped_probe_does_not_keep_the_breaker_open_forever() {
        let b = Breaker::new(3, 500);
        for t in 0..3 {
            b.failure(t);
        }
        assert!(b.admit(502)); // the probe is never answered (its future was dropped)
        assert!(!b.admit(600));
        assert!(b.admit(1_002)); // next open period over: another probe
    }
}
