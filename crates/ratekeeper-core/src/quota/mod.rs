//! [`Quota`]: `limit` units per `period`, with a `burst`, and its parser.

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
    /// `burst × T` (the time an empty bucket takes to refill, `T = ceil(period / limit)`)
    /// does not fit in `u64` nanoseconds (about 584 years): the bucket could not hold
    /// `burst` units. [`Quota::max_burst`] is the largest burst the rate accepts.
    #[error(
        "quota burst times period / limit must be at most u64::MAX nanoseconds \
         (about 584 years)"
    )]
    ToleranceTooLong,
}

impl QuotaError {
    /// Whether the error is about the limit.
    pub fn is_limit(&self) -> bool {
        matches!(self, Self::ZeroLimit)
    }
    /// Whether the error is about the period ([`QuotaError::ToleranceTooLong`] is about
    /// both the period and the burst).
    pub fn is_period(&self) -> bool {
        matches!(
            self,
            Self::ZeroPeriod | Self::PeriodTooLong | Self::ToleranceTooLong
        )
    }
    /// Whether the error is about the burst.
    pub fn is_burst(&self) -> bool {
        matches!(self, Self::ZeroBurst | Self::ToleranceTooLong)
    }
}

/// `limit` units per `period`, with a `burst` (the bucket capacity; defaults to `limit`).
///
/// A `Quota` is validated when it is built, so a limiter can never be silently built as
/// "unlimited" or "deny all": a zero limit, a zero period, a zero burst, a
/// period longer than `u64::MAX` nanoseconds (about 584 years), or a burst whose refill time
/// `burst × T` (the GCRA tolerance, `T = period / limit`) exceeds `u64::MAX` ns is a
/// [`QuotaError`].
///
/// Why the last rule: GCRA and the leaky bucket hold `burst × T` nanoseconds in one `u64`.
/// If that product saturated, the usable capacity would be `u64::MAX / T` rather than
/// `burst`, and a cost in between would be refused with a finite wait, again after that
/// wait, for ever. Refusing the quota keeps capacity, "can never fit" and `Remaining` one
/// number (`burst`). [`Quota::max_burst`] gives the largest burst a rate accepts: 213,503
/// for 1 per day (`u64::MAX / 86_400_000_000_000`).
///
/// Derived GCRA values: the emission interval `T = period / limit` (rounded **up** to a whole
/// nanosecond and at least 1 ns, so the effective rate never exceeds the quota: a rate above
/// 1 per ns refills at 1 per ns, while its burst is exact) and the
/// tolerance `tau = burst * T`, which every `Quota` keeps within `u64::MAX` ns (exact, never
/// saturated: a larger one is [`QuotaError::ToleranceTooLong`]).
///
/// `burst` is the capacity of GCRA and the leaky bucket. The window algorithms and the
/// concurrency counter hold `limit` per window (or in flight) and take no burst: a policy
/// pairing one of them with a burst other than the limit is refused by
/// [`Policy::validate`](crate::Policy::validate); see
/// [`Algorithm::capacity`](crate::Algorithm::capacity).
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use ratekeeper_core::{Quota, QuotaError};
///
/// // 10 requests per minute, all of which may arrive at once (burst 10).
/// let quota = Quota::per_minute(NonZeroU32::new(10).unwrap());
/// assert_eq!(quota.limit(), 10);
/// assert_eq!(quota.burst(), 10);
/// assert_eq!(quota.emission_interval(), Duration::from_secs(6));
///
/// // 60 per minute, at most 10 at once.
/// let free_tier = Quota::new(60, Duration::from_secs(60))?.with_burst(10)?;
/// assert_eq!(free_tier.burst(), 10);
///
/// // Invalid values are typed errors, never panics.
/// assert_eq!(Quota::new(0, Duration::from_secs(1)), Err(QuotaError::ZeroLimit));
/// assert_eq!(Quota::new(10, Duration::ZERO), Err(QuotaError::ZeroPeriod));
/// let daily = Quota::per_day(NonZeroU32::new(1).unwrap());
/// assert_eq!(daily.max_burst(), 213_503);
/// assert_eq!(daily.with_burst(213_504), Err(QuotaError::ToleranceTooLong));
///
/// // From strings (configuration files, environment variables).
/// let parsed: Quota = "60/m burst 10".parse().unwrap();
/// assert_eq!(parsed, free_tier);
/// assert_eq!("5000 per second".parse::<Quota>().unwrap().limit(), 5000);
/// assert_eq!("1000/day".parse::<Quota>().unwrap().period(), Duration::from_secs(86_400));
/// let err = "100/fortnight".parse::<Quota>().unwrap_err();
/// assert_eq!(err.to_string(), "invalid quota \"100/fortnight\": unknown time unit \"fortnight\" \
///     (use ns, us, ms, s, m, h or d, or their names)");
/// # Ok::<(), QuotaError>(())
/// ```
///
/// # Syntax
///
/// ```text
/// quota  = limit sep period [ "burst" burst ]
/// sep    = "/" | "per"
/// period = [ count ] unit          e.g. "min", "10s", "1500 ms", "second"
/// unit   = ns | us | ms | s | sec | second(s) | m | min | minute(s) | h | hr | hour(s)
///        | d | day(s)              (case-insensitive)
/// ```
///
/// `limit`, `count` and `burst` are decimal integers (`_` allowed as a separator); `limit` and
/// `burst` fit in `u32`. [`Quota`]'s `Display` writes this syntax back, so a quota survives a
/// round trip through a string, and serde (feature `serde`) uses it.
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
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroPeriod`], [`QuotaError::PeriodTooLong`],
    /// or [`QuotaError::ToleranceTooLong`] when `limit × ceil(period / limit)` exceeds
    /// `u64::MAX` ns (only for periods within `limit` ns of `u64::MAX`).
    pub fn new(limit: u32, period: Duration) -> Result<Self, QuotaError> {
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let period_ns = u64::try_from(period.as_nanos()).map_err(|_| QuotaError::PeriodTooLong)?;
        if period_ns == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        Self::from_nanos(limit, period_ns).ok_or(QuotaError::ToleranceTooLong)
    }

    /// `limit` per period of `period_ns` nanoseconds, burst = `limit`. Usable in `const`.
    ///
    /// Returns `None` when `period_ns` is 0 or `limit × ceil(period_ns / limit)` exceeds
    /// `u64::MAX` (see [`QuotaError::ToleranceTooLong`]).
    pub const fn from_nanos(limit: NonZeroU32, period_ns: u64) -> Option<Self> {
        if period_ns == 0 {
            return None;
        }
        let quota = Self {
            limit,
            period_ns,
            burst: limit,
        };
        if quota.fits(limit) { Some(quota) } else { None }
    }

    /// Whether `burst × T` fits in `u64` nanoseconds.
    const fn fits(&self, burst: NonZeroU32) -> bool {
        self.emission_interval_nanos()
            .checked_mul(burst.get() as u64)
            .is_some()
    }

    /// The largest burst [`Quota::with_burst`] accepts at this rate:
    /// `min(u32::MAX, floor(u64::MAX / T))` with `T` = [`Quota::emission_interval_nanos`],
    /// so that `burst × T` (the time an empty bucket takes to refill) fits in `u64` ns.
    pub const fn max_burst(&self) -> u32 {
        let most = u64::MAX / self.emission_interval_nanos();
        if most > u32::MAX as u64 {
            u32::MAX
        } else {
            most as u32
        }
    }

    /// `limit` per second, burst = `limit`.
    ///
    /// A `limit` above 1 000 000 000 is more than 1 per nanosecond: it refills at 1 per ns
    /// (the emission interval is a whole ns), with its burst exact.
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
    /// [`QuotaError::ZeroBurst`] when `burst` is 0; [`QuotaError::ToleranceTooLong`] when
    /// `burst` is above [`Quota::max_burst`] (`burst × T` would exceed `u64::MAX` ns).
    pub fn with_burst(self, burst: u32) -> Result<Self, QuotaError> {
        let burst = NonZeroU32::new(burst).ok_or(QuotaError::ZeroBurst)?;
        if !self.fits(burst) {
            return Err(QuotaError::ToleranceTooLong);
        }
        Ok(Self { burst, ..self })
    }

    /// The time an empty bucket takes to refill at the quota's own rate, in ns:
    /// `ceil(burst × period / limit)`, without the rounding of [`Quota::emission_interval`]
    /// (`period` itself when `burst = limit`). At most [`Quota::tolerance_nanos`].
    pub const fn refill_nanos(&self) -> u64 {
        let exact =
            (self.burst.get() as u128 * self.period_ns as u128).div_ceil(self.limit.get() as u128);
        if exact > u64::MAX as u128 {
            u64::MAX
        } else {
            exact as u64
        }
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

    /// GCRA tolerance `tau = burst * T` in nanoseconds: the time an empty bucket takes to
    /// refill. Exact: every `Quota` keeps it within `u64::MAX` (see
    /// [`QuotaError::ToleranceTooLong`]).
    pub const fn tolerance_nanos(&self) -> u64 {
        self.emission_interval_nanos()
            .saturating_mul(self.burst.get() as u64)
    }
}

mod parse;

pub use parse::{QuotaParseError, QuotaPart};
#[cfg(feature = "serde")]
pub(crate) use parse::{parse_duration_nanos, write_duration_nanos};

#[cfg(test)]
mod tests;
