//! The circuit breaker: stop waiting on a Redis that keeps failing.
//!
//! After `threshold` failures in a row the breaker opens: for `open_for` decisions go
//! straight to the failure policy without a round trip. Then exactly one request probes
//! Redis; its success closes the breaker, its failure (or its future being dropped) opens it
//! for another period. So a dead Redis costs at most one deadline per open period, not one
//! per request. Besides, the store's prober (`Shared::start_prober`) reconnects in the
//! background from the first failure and closes the breaker as soon as Redis answers on a
//! fresh connection, so the open period rarely runs out during a fault that has ended.
//! Times are nanoseconds on the app's monotonic clock (Redis fails in real time, so never an
//! injected decision clock).

//!
//! # Logs
//!
//! The breaker logs its transitions, not each request: `WARN` when it opens (closed to open:
//! the failures in a row, the error that tripped it, the failure policy now in force), `DEBUG`
//! when a probe goes (half-open) and when a failed probe opens it again (with the decisions
//! the failure policy answered so far), and `INFO` when a probe succeeds and it closes (with
//! the decisions the failure policy answered while it was open). So a Redis outage logs two
//! `WARN` lines (its first degraded decision, logged by the failure policy, and the breaker
//! opening) and one `INFO` however many requests it lasts; each other degraded decision is
//! one `DEBUG` event, and counted in `ratekeeper_store_degraded_total`.

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug)]
pub(super) struct Breaker {
    /// Failures in a row (reset by a success).
    failures: AtomicU32,
    /// Decisions skipped (answered by the failure policy without Redis) since it opened.
    skipped: AtomicU64,
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
            skipped: AtomicU64::new(0),
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
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let next = now.saturating_add(self.open_for).max(1);
        let probe = self
            .open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if probe {
            tracing::debug!(
                skipped = self.skipped.load(Ordering::Relaxed),
                "redis store circuit breaker half-open: one request probes Redis"
            );
        } else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        probe
    }

    /// Redis answered: close (logged at `INFO` when it was open).
    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            let skipped = self.skipped.swap(0, Ordering::Relaxed);
            tracing::info!(
                skipped,
                "redis store recovered: circuit breaker closed; {skipped} decisions were \
                 answered by the failure policy while it was open"
            );
        }
    }

    /// Redis failed at `now` with `error`: count, and open at the threshold (logged at `WARN`
    /// when it was closed; `action` names the failure policy for the log).
    pub(super) fn failure(&self, now: u64, error: &dyn Display, action: &str) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures >= self.threshold {
            let until = now.saturating_add(self.open_for).max(1);
            if self.open_until.swap(until, Ordering::AcqRel) == 0 {
                self.skipped.store(0, Ordering::Relaxed);
                tracing::warn!(
                    failures,
                    %error,
                    action,
                    open_for_ms = self.open_for / 1_000_000,
                    "redis store failing: circuit breaker open after {failures} failures in a \
                     row; decisions go to the failure policy ({action}) without waiting on \
                     Redis until a probe succeeds"
                );
            } else {
                tracing::debug!(
                    failures,
                    %error,
                    skipped = self.skipped.load(Ordering::Relaxed),
                    "redis store probe failed; circuit breaker open again"
                );
            }
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
        b.failure(10, &"down", "allow");
        b.failure(20, &"down", "allow");
        assert!(b.admit(30) && !b.is_open());
        b.failure(30, &"down", "allow");
        assert!(b.is_open());
        assert!(!b.admit(31));
        assert!(!b.admit(529));
        // Open period over: exactly one probe goes; the others keep skipping.
        assert!(b.admit(530));
        assert!(!b.admit(530));
        assert!(!b.admit(1_000));
        // The probe failed: open again from then.
        b.failure(1_000, &"down", "allow");
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
            b.failure(t, &"down", "allow");
        }
        assert!(b.admit(502)); // the probe is never answered (its future was dropped)
        assert!(!b.admit(600));
        assert!(b.admit(1_002)); // next open period over: another probe
    }
}
