//! Clocks: where "now" comes from.
//!
//! Algorithms never read a clock; stores read one and pass `now` in. Time is `u64`
//! nanoseconds since an arbitrary origin and never goes backwards.
//!
//! - [`MonotonicClock`] (the default) reads the CPU's time-stamp counter through `quanta`,
//!   scaled to nanoseconds (falling back to the OS monotonic clock).
//! - [`ManualClock`] is set by tests; its clones share one time, so a test can hold a clone
//!   while the limiter holds another.
//! - `TokioClock` (feature `tokio`) reads tokio's clock, so it follows tokio's paused and
//!   advanced time in tests.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use ratekeeper_core::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new();
//! let shared = clock.clone();
//! assert_eq!(clock.now(), 0);
//! shared.advance(Duration::from_millis(1500));
//! assert_eq!(clock.now(), 1_500_000_000);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of monotonic time in nanoseconds, plus wall-clock time for epoch headers.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin. Never decreases.
    fn now(&self) -> u64;

    /// Wall-clock time since the Unix epoch at this clock's `now`. Only used to format
    /// epoch-style reset headers; the default reads [`SystemTime::now`].
    fn unix_now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
}

/// The default clock: nanoseconds since the clock was created.
///
/// Reads the CPU's time-stamp counter through [`quanta`] (the clock governor uses too),
/// scaled to nanoseconds by a multiply and a shift. Where no invariant counter is available,
/// `quanta` reads `CLOCK_MONOTONIC` instead. A read is cheaper than
/// [`std::time::Instant::elapsed`] (figures in the repository's `BENCHMARKS.md`).
///
/// The first clock created in a process calibrates the counter against the OS monotonic
/// clock (about 1 ms, at most 200 ms); later ones reuse that calibration. Clones share the
/// origin.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // u64 nanoseconds cover about 584 years of uptime; a counter read behind the origin
        // (another core's counter a little behind) reads as 0 rather than wrapping.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// Its wall clock is `unix_origin + now` (default origin: the Unix epoch itself).
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
    unix_origin: Duration,
}

impl ManualClock {
    /// A clock at 0 ns whose wall clock starts at the Unix epoch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at 0 ns whose wall clock reads `unix_origin` at 0 ns.
    pub fn with_unix_origin(unix_origin: Duration) -> Self {
        Self {
            now: Arc::default(),
            unix_origin,
        }
    }

    /// Sets the time in nanoseconds. Setting an earlier time is ignored (time never goes back).
    pub fn set(&self, now_ns: u64) {
        self.now.fetch_max(now_ns, Ordering::SeqCst);
    }

    /// Sets the time to `at` after the origin (saturating at `u64::MAX` ns).
    pub fn set_elapsed(&self, at: Duration) {
        self.set(nanos(at));
    }

    /// Moves the time forward by `by` (saturating at `u64::MAX` ns).
    pub fn advance(&self, by: Duration) {
        let by = nanos(by);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn unix_now(&self) -> Duration {
        self.unix_origin
            .saturating_add(Duration::from_nanos(self.now()))
    }
}

/// A clock reading [`tokio::time::Instant`](https://docs.rs/tokio/1/tokio/time/struct.Instant.html), so it follows tokio's paused and advanced time
/// in tests. Nanoseconds since the clock was created.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock whose origin is tokio's now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now(&self) -> u64 {
        nanos(self.origin.elapsed())
    }
}

/// A duration in whole nanoseconds, the unit of every time in this crate, saturating at
/// `u64::MAX` ns (about 584 years) instead of overflowing.
#[inline]
pub(crate) const fn nanos(d: Duration) -> u64 {
    let ns = d.as_nanos();
    if ns > u64::MAX as u128 {
        u64::MAX
    } else {
        ns as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_never_goes_back_and_saturates() {
        let c = ManualClock::with_unix_origin(Duration::from_secs(1_700_000_000));
        c.set(10);
        c.set(5);
        assert_eq!(c.now(), 10);
        c.advance(Duration::MAX);
        assert_eq!(c.now(), u64::MAX);
        assert!(c.unix_now() >= Duration::from_secs(1_700_000_000));
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }

    #[test]
    fn monotonic_clock_counts_nanoseconds() {
        // The counter's scaling agrees with the OS clock (loose bounds: a loaded machine may
        // deschedule this thread, never make it early).
        let c = MonotonicClock::new();
        let clone = c.clone();
        let before = std::time::Instant::now();
        let start = c.now();
        std::thread::sleep(Duration::from_millis(20));
        let elapsed_ns = c.now() - start;
        let os_ns = u64::try_from(before.elapsed().as_nanos()).unwrap();
        assert!(elapsed_ns >= 19_000_000, "{elapsed_ns} ns");
        assert!(
            elapsed_ns <= os_ns + 1_000_000,
            "{elapsed_ns} ns > {os_ns} ns"
        );
        assert!(clone.now() >= start + 19_000_000);
    }
}
