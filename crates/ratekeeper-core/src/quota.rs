//! Quotas: `limit` units per `period`, with a `burst` (bucket capacity).
//!
//! A [`Quota`] is validated when it is built, so a limiter can never be silently built as
//! "unlimited" or "deny all": a zero limit, a zero period, a zero burst, a
//! period longer than `u64::MAX` nanoseconds (about 584 years), a rate above 1 unit per
//! nanosecond (the clock's resolution: `limit` larger than the period in ns), or a burst whose
//! refill time `burst × T` (the GCRA tolerance, `T = period / limit`) exceeds `u64::MAX` ns is
//! a [`QuotaError`].
//!
//! Why the last rule: GCRA and the leaky bucket hold `burst × T` nanoseconds in one `u64`.
//! If that product saturated, the usable capacity would be `u64::MAX / T` rather than
//! `burst`, and a cost in between would be refused with a finite wait, again after that
//! wait, for ever. Refusing the quota keeps capacity, "can never fit" and `Remaining` one
//! number (`burst`). [`Quota::max_burst`] gives the largest burst a rate accepts: 213,503
//! for 1 per day (`u64::MAX / 86_400_000_000_000`).
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
//! assert_eq!(Quota::new(2, Duration::from_nanos(1)), Err(QuotaError::RateTooHigh));
//! let daily = Quota::per_day(NonZeroU32::new(1).unwrap());
//! assert_eq!(daily.max_burst(), 213_503);
//! assert_eq!(daily.with_burst(213_504), Err(QuotaError::ToleranceTooLong));
//!
//! // From strings (configuration files, environment variables).
//! let parsed: Quota = "60/m burst 10".parse().unwrap();
//! assert_eq!(parsed, free_tier);
//! assert_eq!("5000 per second".parse::<Quota>().unwrap().limit(), 5000);
//! assert_eq!("1000/day".parse::<Quota>().unwrap().period(), Duration::from_secs(86_400));
//! let err = "100/fortnight".parse::<Quota>().unwrap_err();
//! assert_eq!(err.to_string(), "invalid quota \"100/fortnight\": unknown time unit \"fortnight\" \
//!     (use ns, us, ms, s, m, h or d, or their names)");
//! # Ok::<(), QuotaError>(())
//! ```
//!
//! # Syntax
//!
//! ```text
//! quota  = limit sep period [ "burst" burst ]
//! sep    = "/" | "per"
//! period = [ count ] unit          e.g. "min", "10s", "1500 ms", "second"
//! unit   = ns | us | ms | s | sec | second(s) | m | min | minute(s) | h | hr | hour(s)
//!        | d | day(s)              (case-insensitive)
//! ```
//!
//! `limit`, `count` and `burst` are decimal integers (`_` allowed as a separator); `limit` and
//! `burst` fit in `u32`. [`Quota`]'s `Display` writes this syntax back, so a quota survives a
//! round trip through a string, and serde (feature `serde`) uses it.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
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
    /// More than 1 unit per nanosecond (`limit` larger than the period in ns): the emission
    /// interval `T` is a whole number of ns, so such a rate cannot be represented (it would
    /// act as 1 per ns).
    #[error("quota rate must be at most 1 per nanosecond (limit at most the period in ns)")]
    RateTooHigh,
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
    /// Whether the error is about the limit ([`QuotaError::RateTooHigh`] is about both the
    /// limit and the period).
    pub fn is_limit(&self) -> bool {
        matches!(self, Self::ZeroLimit | Self::RateTooHigh)
    }
    /// Whether the error is about the period ([`QuotaError::ToleranceTooLong`] is about
    /// both the period and the burst, [`QuotaError::RateTooHigh`] about both the period and
    /// the limit).
    pub fn is_period(&self) -> bool {
        matches!(
            self,
            Self::ZeroPeriod | Self::PeriodTooLong | Self::ToleranceTooLong | Self::RateTooHigh
        )
    }
    /// Whether the error is about the burst.
    pub fn is_burst(&self) -> bool {
        matches!(self, Self::ZeroBurst | Self::ToleranceTooLong)
    }
}

/// `limit` units per `period`, with a `burst` (the bucket capacity; defaults to `limit`).
///
/// Derived GCRA values: the emission interval `T = period / limit` (rounded **up** to a whole
/// nanosecond, so the effective rate never exceeds the quota; at least 1 ns, as a rate above
/// 1 per ns is [`QuotaError::RateTooHigh`]) and the
/// tolerance `tau = burst * T`, which every `Quota` keeps within `u64::MAX` ns (exact, never
/// saturated: a larger one is [`QuotaError::ToleranceTooLong`]).
///
/// `burst` is the capacity of GCRA and the leaky bucket. The window algorithms and the
/// concurrency counter hold `limit` per window (or in flight) and take no burst: a policy
/// pairing one of them with a burst other than the limit is refused by
/// [`Policy::validate`](crate::Policy::validate); see
/// [`Algorithm::capacity`](crate::Algorithm::capacity).
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
    /// [`QuotaError::RateTooHigh`] when `limit` is larger than the period in ns, or
    /// [`QuotaError::ToleranceTooLong`] when `limit × ceil(period / limit)` exceeds
    /// `u64::MAX` ns (only for periods within `limit` ns of `u64::MAX`).
    pub fn new(limit: u32, period: Duration) -> Result<Self, QuotaError> {
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let period_ns = u64::try_from(period.as_nanos()).map_err(|_| QuotaError::PeriodTooLong)?;
        if period_ns == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if u64::from(limit.get()) > period_ns {
            return Err(QuotaError::RateTooHigh);
        }
        Self::from_nanos(limit, period_ns).ok_or(QuotaError::ToleranceTooLong)
    }

    /// `limit` per period of `period_ns` nanoseconds, burst = `limit`. Usable in `const`.
    ///
    /// Returns `None` when `period_ns` is 0, `limit` is larger than `period_ns` (see
    /// [`QuotaError::RateTooHigh`]) or `limit × ceil(period_ns / limit)` exceeds `u64::MAX`
    /// (see [`QuotaError::ToleranceTooLong`]).
    pub const fn from_nanos(limit: NonZeroU32, period_ns: u64) -> Option<Self> {
        if period_ns == 0 || limit.get() as u64 > period_ns {
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
    /// A `limit` above 1 000 000 000 is more than 1 per nanosecond, which no algorithm can
    /// represent: [`Quota::validate`] refuses it with [`QuotaError::RateTooHigh`], and so does
    /// [`Policy::validate`](crate::Policy::validate) when a limiter is built with it.
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

    /// Checks what the `const` constructors cannot: [`Quota::per_second`] with a `limit`
    /// above 1 000 000 000 is more than 1 per ns. Every other constructor refuses a bad quota
    /// itself, so for those this is always `Ok`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::RateTooHigh`] when `limit` is larger than the period in ns.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use ratekeeper_core::{Quota, QuotaError};
    ///
    /// assert_eq!(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()).validate(), Ok(()));
    /// let too_fast = Quota::per_second(NonZeroU32::MAX);
    /// assert_eq!(too_fast.validate(), Err(QuotaError::RateTooHigh));
    /// ```
    pub const fn validate(&self) -> Result<(), QuotaError> {
        if self.limit.get() as u64 > self.period_ns {
            Err(QuotaError::RateTooHigh)
        } else {
            Ok(())
        }
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

/// Which part of a quota string was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaPart {
    /// The limit before `/` or `per`.
    Limit,
    /// The separator `/` or `per`.
    Separator,
    /// The count before the unit (`10` in `100/10s`).
    PeriodCount,
    /// The time unit.
    Unit,
    /// The value after `burst`.
    Burst,
    /// Text after the quota.
    Trailing,
}

/// Why a quota string could not be parsed: the input, the part at fault and what was
/// expected. `Display` names the bad part, for example
/// `invalid quota "-1/min": invalid limit "-1" (expected a whole number from 1 to 4294967295)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quota {input:?}: {reason}")]
pub struct QuotaParseError {
    input: String,
    part: QuotaPart,
    reason: String,
}

impl QuotaParseError {
    fn new(input: &str, part: QuotaPart, reason: String) -> Self {
        Self {
            input: input.to_owned(),
            part,
            reason,
        }
    }

    /// The part of the input at fault.
    pub const fn part(&self) -> QuotaPart {
        self.part
    }

    /// The whole input.
    pub fn input(&self) -> &str {
        &self.input
    }
}

const U32_RANGE: &str = "a whole number from 1 to 4294967295";

fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(end)
}

fn parse_int(digits: &str) -> Option<u64> {
    if digits.is_empty() || digits.starts_with('_') {
        return None;
    }
    digits.replace('_', "").parse().ok()
}

/// Nanoseconds per unit name.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "ns" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "microsecond" | "microseconds" => 1_000,
        "ms" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => NS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NS_PER_SEC,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * NS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NS_PER_SEC,
        _ => return None,
    })
}

#[cfg(feature = "serde")]
/// A duration written as `<count><unit>` (`"15m"`, `"900 s"`, `"1h"`, `"1500ms"`; the units of
/// a quota's period, count required): its ns, or `None` when it is not a count and a unit.
/// A duration beyond `u64::MAX` ns (a count of any length) saturates there, so a caller
/// bounding durations reports it as too long rather than as unreadable.
pub(crate) fn parse_duration_nanos(input: &str) -> Option<u64> {
    let (count, unit) = split_number(input.trim());
    let per = unit_nanos(unit.trim())?;
    if count.is_empty() || count.starts_with('_') {
        return None;
    }
    // Only digits are left, so the parse fails only when the count overflows.
    let count = count.replace('_', "").parse::<u64>().unwrap_or(u64::MAX);
    Some(count.saturating_mul(per))
}

#[cfg(feature = "serde")]
/// Writes `ns` in the largest unit that divides it (`15min`, `90s`, `1500ms`), a form
/// [`parse_duration_nanos`] reads back.
pub(crate) fn write_duration_nanos(f: &mut fmt::Formatter<'_>, ns: u64) -> fmt::Result {
    let (per, unit) = DISPLAY_UNITS
        .iter()
        .copied()
        .find(|(per, _)| ns % per == 0)
        .unwrap_or((1, "ns"));
    write!(f, "{}{unit}", ns / per)
}

#[cfg(feature = "serde")]
/// Units [`write_duration_nanos`] writes, largest first.
const DISPLAY_UNITS: [(u64, &str); 7] = [
    (86_400 * NS_PER_SEC, "day"),
    (3_600 * NS_PER_SEC, "h"),
    (60 * NS_PER_SEC, "min"),
    (NS_PER_SEC, "s"),
    (1_000_000, "ms"),
    (1_000, "us"),
    (1, "ns"),
];

impl FromStr for Quota {
    type Err = QuotaParseError;

    /// Parses `"100/min"`, `"5000 per second"`, `"60/m burst 10"`, `"1000/day"`,
    /// `"10/1500ms"`. The syntax, case-insensitive, with optional spaces:
    ///
    /// ```text
    /// quota  = limit sep period [ "burst" burst ]
    /// sep    = "/" | "per"
    /// period = [ count ] unit          e.g. "min", "10s", "1500 ms", "second"
    /// unit   = ns | us | ms | s | sec | second(s) | m | min | minute(s) | h | hr | hour(s)
    ///        | d | day(s)
    /// ```
    ///
    /// `limit`, `count` and `burst` are decimal integers (`_` allowed as a separator);
    /// `limit` and `burst` fit in `u32`. Without `burst`, the burst is the limit.
    /// `Display` writes this syntax back.
    ///
    /// ```
    /// # use ratekeeper_core::Quota;
    /// use std::time::Duration;
    ///
    /// let quota: Quota = "60/m burst 10".parse().unwrap();
    /// assert_eq!((quota.limit(), quota.burst()), (60, 10));
    /// assert_eq!("10/1500ms".parse::<Quota>().unwrap().period(), Duration::from_millis(1500));
    /// assert!("0/s".parse::<Quota>().is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// A [`QuotaParseError`] naming the bad part; values the quota refuses (limit 0, burst 0,
    /// period 0 or longer than `u64::MAX` ns, more than 1 per ns) are errors too, never an
    /// "unlimited" quota.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |part, reason: String| QuotaParseError::new(input, part, reason);
        let s = input.trim();
        let (limit_text, rest) = split_number(s);
        let limit = parse_int(limit_text)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                let shown = s.split(['/', ' ']).next().unwrap_or(s);
                err(
                    QuotaPart::Limit,
                    format!("invalid limit {shown:?} (expected {U32_RANGE})"),
                )
            })?;
        let rest = rest.trim_start();
        let rest = if let Some(r) = rest.strip_prefix('/') {
            r
        } else if let Some(r) = rest
            .get(..3)
            .filter(|w| w.eq_ignore_ascii_case("per"))
            .and_then(|_| rest.get(3..))
        {
            r
        } else {
            return Err(err(
                QuotaPart::Separator,
                format!("expected \"/\" or \"per\" after the limit, found {rest:?}"),
            ));
        };
        let rest = rest.trim_start();
        let (count_text, rest) = split_number(rest);
        let count = if count_text.is_empty() {
            1
        } else {
            parse_int(count_text).filter(|&n| n > 0).ok_or_else(|| {
                err(
                    QuotaPart::PeriodCount,
                    format!("invalid period count {count_text:?} (expected a whole number >= 1)"),
                )
            })?
        };
        let rest = rest.trim_start();
        let unit_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        let per_unit = unit_nanos(unit).ok_or_else(|| {
            err(
                QuotaPart::Unit,
                format!(
                    "unknown time unit {unit:?} (use ns, us, ms, s, m, h or d, or their names)"
                ),
            )
        })?;
        let period_ns = count.checked_mul(per_unit).ok_or_else(|| {
            err(
                QuotaPart::PeriodCount,
                format!("period {count_text}{unit} is longer than u64::MAX nanoseconds"),
            )
        })?;
        let limit = NonZeroU32::new(limit).unwrap_or(NonZeroU32::MIN);
        if period_ns != 0 && u64::from(limit.get()) > period_ns {
            return Err(err(
                QuotaPart::Limit,
                format!(
                    "limit {limit} per {count_text}{unit} is more than 1 per nanosecond \
                     (at most {period_ns} per {count_text}{unit})"
                ),
            ));
        }
        let quota = Quota::from_nanos(limit, period_ns).ok_or_else(|| {
            let reason = if period_ns == 0 {
                "the period is zero".to_owned()
            } else {
                format!(
                    "period {count_text}{unit} is too long for limit {limit}: \
                     limit x ceil(period / limit) exceeds u64::MAX nanoseconds"
                )
            };
            err(QuotaPart::PeriodCount, reason)
        })?;
        let rest = rest.trim();
        if rest.is_empty() {
            return Ok(quota);
        }
        let Some(burst_text) = rest
            .get(..5)
            .filter(|w| w.eq_ignore_ascii_case("burst"))
            .and_then(|_| rest.get(5..))
            .map(str::trim)
        else {
            return Err(err(
                QuotaPart::Trailing,
                format!("unexpected {rest:?} after the period (expected \"burst <n>\")"),
            ));
        };
        let burst = parse_int(burst_text)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                err(
                    QuotaPart::Burst,
                    format!("invalid burst {burst_text:?} (expected {U32_RANGE})"),
                )
            })?;
        quota.with_burst(burst).map_err(|_| {
            err(
                QuotaPart::Burst,
                format!(
                    "burst {burst} takes longer than u64::MAX nanoseconds to refill at this \
                     rate (burst x period / limit; at most {})",
                    quota.max_burst()
                ),
            )
        })
    }
}

impl fmt::Display for Quota {
    /// Writes the string syntax: `10/min`, `100/10s`, `7/1500ms`, `60/min burst 10`; parsing
    /// it gives the same quota back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 7] = [
            (86_400 * NS_PER_SEC, "day"),
            (3_600 * NS_PER_SEC, "h"),
            (60 * NS_PER_SEC, "min"),
            (NS_PER_SEC, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        let (per, unit) = UNITS
            .iter()
            .copied()
            .find(|(per, _)| self.period_ns % per == 0)
            .unwrap_or((1, "ns"));
        let count = self.period_ns / per;
        write!(f, "{}/", self.limit)?;
        if count != 1 {
            write!(f, "{count}")?;
        }
        f.write_str(unit)?;
        if self.burst != self.limit {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Quota {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Quota {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
