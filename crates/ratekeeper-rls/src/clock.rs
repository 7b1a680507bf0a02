//! The service's clock: Unix time, so that fixed windows start on multiples of their unit
//! since the Unix epoch, as the reference's do.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratekeeper_core::clock::Clock;

/// Wall-clock nanoseconds since the Unix epoch, never going back (a step back of the
/// system clock holds time still until the clock catches up).
///
/// With this clock a window of `unit` seconds is `[i·unit, (i+1)·unit)` seconds since
/// 1970-01-01 00:00:00 UTC: a minute turns over at :00, a day at 00:00 UTC, a WEEK on
/// Thursday 00:00 UTC (1970-01-01 was a Thursday), a MONTH every 30 days and a YEAR every
/// 365 days, as in the reference service.
#[derive(Debug, Clone, Default)]
pub struct UnixClock {
    last: Arc<AtomicU64>,
}

impl UnixClock {
    /// A clock reading the system's wall clock.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clock for UnixClock {
    fn now(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        prev.max(wall)
    }

    fn unix_now(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

/// A clock shared behind an `Arc`, so that a test can inject any [`Clock`] (a
/// [`ManualClock`](ratekeeper_core::clock::ManualClock) set to a Unix time, say).
#[derive(Clone)]
pub(crate) struct SharedClock(pub(crate) Arc<dyn Clock>);

impl std::fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedClock")
    }
}

impl Clock for SharedClock {
    fn now(&self) -> u64 {
        self.0.now()
    }

    fn unix_now(&self) -> Duration {
        self.0.unix_now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_clock_reads_the_epoch_and_never_goes_back() {
        let clock = UnixClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        // Within a minute of the system clock, in nanoseconds since the epoch.
        assert!(wall.as_nanos().abs_diff(u128::from(a)) < 60_000_000_000);
        assert_eq!(
            clock.unix_now().as_nanos() / 1_000_000_000,
            u128::from(clock.now() / 1_000_000_000)
        );
    }
}
