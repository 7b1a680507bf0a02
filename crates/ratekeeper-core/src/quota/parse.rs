//! Reading and writing quotas as text: the grammar of [`Quota`]'s `FromStr` and `Display`,
//! its errors ([`QuotaParseError`], [`QuotaPart`]), and the serde forms built on them.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use super::{NS_PER_SEC, Quota};

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
    /// period 0 or longer than `u64::MAX` ns) are errors too, never an "unlimited" quota.
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
