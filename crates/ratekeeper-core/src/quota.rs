//! Quotas: `limit` units per `period`, with a `burst` (bucket capacity).
//!
//! A [`Quota`] is validated when it is built, so a limiter can never be silently built as
//! "unlimited" or "deny all" (see case B11): a zero limit, a zero period, a zero burst or a
//! period longer than `u64::MAX` nanoseconds (about 584 years) is a [`QuotaError`].
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::{Quota, QuotaError};
//!
//! // 10 requests per minute, all of which may arrive at once (burst 10).
//! let quota = Quota::per_minute(NonZeroU32::new(10).unwrap());
//! assert_eq!(quota.limit(), 10);
//! assert_eq!(quota.burst(), 10);
//! assert_eq!(quota.emission_interval(), Duration::from_secs(6));
//!
//! // 60 per minute, at most 10 at once.
//! let free_tier = Quota::new(60, Duration::from_secs(60))?.with_burst(10)?;
//! assert_eq!(free_tier.burst(), 10);
//!
//! // Invalid values are typed errors, never panics.
//! assert_eq!(Quota::new(0, Duration::from_secs(1)), Err(QuotaError::ZeroLimit));
//! assert_eq!(Quota::new(10, Duration::ZERO), Err(QuotaError::ZeroPeriod));
//! # Ok::<(), QuotaError>(())
//! ```

use std::num::NonZeroU32;
use std::time::Duration;

/// Why a [`Quota`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was 0: nothing could ever pass.
    #[error("quota limit must be at least 1")]
    ZeroLimit,
    /// The period was zero: the rate would be infinite.
    #[error("quota period must be longer than zero")]
    ZeroPeriod,
    /// The period does not fit in `u64` nanoseconds (about 584 years).
    #[error("quota period must be at most u64::MAX nanoseconds (about 584 years)")]
    PeriodTooLong,
    /// The burst was 0: nothing could ever pass.
    #[error("quota burst must be at least 1")]
    ZeroBurst,
}

impl QuotaError {
    /// Whether the error is about the limit.
    pub fn is_limit(&self) -> bool {
        matches!(self, Self::ZeroLimit)
    }
    /// Whether the error is about the period.
    pub fn is_period(&self) -> bool {
        matches!(self, Self::ZeroPeriod | Self::PeriodTooLong)
    }
    /// Whether the error is about the burst.
    pub fn is_burst(&self) -> bool {
        matches!(self, Self::ZeroBurst)
    }
}

/// `limit` units per `period`, with a `burst` (the bucket capacity; defaults to `limit`).
///
/// Derived GCRA values: the emission interval `T = period / limit` (rounded **up** to a whole
/// nanosecond and at least 1 ns, so the effective rate never exceeds the quota) and the
/// tolerance `tau = burst * T` (saturating).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU32,
    period_ns: u64,
    burst: NonZeroU32,
}

const NS_PER_SEC: u64 = 1_000_000_000;

impl Quota {
    /// `limit` units per `period`, burst = `limit`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroPeriod`] or [`QuotaError::PeriodTooLong`].
    pub fn new(limit: u32, period: Duration) -> Result<Self, QuotaError> {
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let period_ns = u64::try_from(period.as_nanos()).map_err(|_| QuotaError::PeriodTooLong)?;
        if period_ns == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        Ok(Self {
            limit,
            period_ns,
            burst: limit,
        })
    }

    /// `limit` per period of `period_ns` nanoseconds, burst = `limit`. Usable in `const`.
    ///
    /// Returns `None` when `period_ns` is 0.
    pub const fn from_nanos(limit: NonZeroU32, period_ns: u64) -> Option<Self> {
        if period_ns == 0 {
            return None;
        }
        Some(Self {
            limit,
            period_ns,
            burst: limit,
        })
    }

    /// `limit` per second, burst = `limit`.
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self {
            limit,
            period_ns: NS_PER_SEC,
            burst: limit,
        }
    }

    /// `limit` per minute, burst = `limit`.
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self {
            limit,
            period_ns: 60 * NS_PER_SEC,
            burst: limit,
        }
    }

    /// `limit` per hour, burst = `limit`.
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self {
            limit,
            period_ns: 3_600 * NS_PER_SEC,
            burst: limit,
        }
    }

    /// `limit` per day (86 400 s), burst = `limit`.
    pub const fn per_day(limit: NonZeroU32) -> Self {
        Self {
            limit,
            period_ns: 86_400 * NS_PER_SEC,
            burst: limit,
        }
    }

    /// The same quota with another burst (bucket capacity).
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroBurst`] when `burst` is 0.
    pub fn with_burst(self, burst: u32) -> Result<Self, QuotaError> {
        let burst = NonZeroU32::new(burst).ok_or(QuotaError::ZeroBurst)?;
        Ok(Self { burst, ..self })
    }

    /// Units per period.
    pub const fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The period in nanoseconds.
    pub const fn period_nanos(&self) -> u64 {
        self.period_ns
    }

    /// The bucket capacity: how many units may be spent at once.
    pub const fn burst(&self) -> u32 {
        self.burst.get()
    }

    /// GCRA emission interval `T = period / limit`, rounded up to a whole nanosecond (>= 1 ns).
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_interval_nanos())
    }

    /// [`Quota::emission_interval`] in nanoseconds.
    pub const fn emission_interval_nanos(&self) -> u64 {
        let limit = self.limit.get() as u64;
        let t = self.period_ns.div_ceil(limit);
        if t == 0 { 1 } else { t }
    }

    /// GCRA tolerance `tau = burst * T` in nanoseconds, saturating at `u64::MAX`.
    pub const fn tolerance_nanos(&self) -> u64 {
        self.emission_interval_nanos()
            .saturating_mul(self.burst.get() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_values_are_typed_errors() {
        assert_eq!(
            Quota::new(0, Duration::from_secs(1)),
            Err(QuotaError::ZeroLimit)
        );
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
        assert_eq!(
            Quota::new(1, Duration::from_secs(u64::MAX)),
            Err(QuotaError::PeriodTooLong)
        );
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert_eq!(q.with_burst(0), Err(QuotaError::ZeroBurst));
        assert!(QuotaError::ZeroBurst.is_burst());
        assert!(QuotaError::PeriodTooLong.is_period());
        assert!(QuotaError::ZeroLimit.is_limit());
    }

    #[test]
    fn emission_interval_rounds_up_and_is_never_zero() {
        let q = Quota::new(3, Duration::from_secs(1)).unwrap();
        assert_eq!(q.emission_interval_nanos(), 333_333_334);
        let q = Quota::new(u32::MAX, Duration::from_nanos(1)).unwrap();
        assert_eq!(q.emission_interval_nanos(), 1);
        let q = Quota::new(2_000_000_000, Duration::from_secs(1)).unwrap();
        assert_eq!(q.emission_interval_nanos(), 1);
    }

    #[test]
    fn tolerance_saturates() {
        let q = Quota::new(1, Duration::from_nanos(u64::MAX))
            .unwrap()
            .with_burst(u32::MAX)
            .unwrap();
        assert_eq!(q.tolerance_nanos(), u64::MAX);
    }
}
