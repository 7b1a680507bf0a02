//! A descriptor's rate limit (`rate_limit:` and the descriptor flags that go with it) and its
//! time unit.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use ratekeeper_core::Algorithm;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use serde::Serialize;

/// The period of a rate limit, as in Envoy's `RateLimitResponse.RateLimit.Unit`.
///
/// Windows are fixed and aligned on the Unix epoch, as in envoyproxy/ratelimit: a month is 30
/// days and a year 365 days (see [`Unit::seconds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 604 800 s (7 days).
    Week,
    /// 2 592 000 s (30 days).
    Month,
    /// 31 536 000 s (365 days).
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds: 1, 60, 3 600, 86 400, 604 800, 2 592 000 (30 days) or
    /// 31 536 000 (365 days), the table of envoyproxy/ratelimit's `UnitToDivider`.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The unit that `current_limit` reports for a window of `period_secs` seconds: the
    /// shortest unit at least as long as the window, so that "`requests_per_unit` per unit"
    /// never claims more than the rule admits (over any span of one such unit, a rule of `n`
    /// per window admits at least `n`, and its sustained rate `n / period` is at least
    /// `n / unit`). `None` for a window longer than a [`Unit::Year`] (365 days).
    ///
    /// ```
    /// use ratekeeper_rls::config::Unit;
    ///
    /// assert_eq!(Unit::covering(10), Some(Unit::Minute));
    /// assert_eq!(Unit::covering(60), Some(Unit::Minute));
    /// assert_eq!(Unit::covering(61), Some(Unit::Hour));
    /// assert_eq!(Unit::covering(366 * 86_400), None);
    /// ```
    pub fn covering(period_secs: u64) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.seconds() >= period_secs)
    }

    /// The lower-case name used in config files: `second` .. `year`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The protobuf enum value (`RateLimitResponse.RateLimit.Unit`).
    pub fn to_proto(self) -> PbUnit {
        match self {
            Unit::Second => PbUnit::Second,
            Unit::Minute => PbUnit::Minute,
            Unit::Hour => PbUnit::Hour,
            Unit::Day => PbUnit::Day,
            Unit::Week => PbUnit::Week,
            Unit::Month => PbUnit::Month,
            Unit::Year => PbUnit::Year,
        }
    }

    /// The unit of a protobuf enum value; `None` for `UNKNOWN`.
    pub fn from_proto(unit: PbUnit) -> Option<Unit> {
        match unit {
            PbUnit::Unknown => None,
            PbUnit::Second => Some(Unit::Second),
            PbUnit::Minute => Some(Unit::Minute),
            PbUnit::Hour => Some(Unit::Hour),
            PbUnit::Day => Some(Unit::Day),
            PbUnit::Week => Some(Unit::Week),
            PbUnit::Month => Some(Unit::Month),
            PbUnit::Year => Some(Unit::Year),
        }
    }

    /// The unit of a protobuf enum's wire value (`i32`, as in a decoded message); `None` for
    /// `UNKNOWN` (0) and values the enum does not define.
    pub fn from_proto_i32(value: i32) -> Option<Unit> {
        PbUnit::try_from(value).ok().and_then(Unit::from_proto)
    }
}

impl From<Unit> for PbUnit {
    fn from(unit: Unit) -> PbUnit {
        unit.to_proto()
    }
}

impl TryFrom<PbUnit> for Unit {
    type Error = UnitParseError;

    /// Fails for `UNKNOWN`.
    fn try_from(unit: PbUnit) -> Result<Unit, UnitParseError> {
        Unit::from_proto(unit).ok_or_else(|| UnitParseError(unit.as_str_name().to_owned()))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the descriptors of one request are charged in a domain (`charging:` at the root of the
/// domain's file, an extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Charging {
    /// Each descriptor on its own (the reference's): a request refused by one descriptor
    /// still charges the others. `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` makes every
    /// domain [`Charging::AllOrNothing`].
    #[default]
    PerDescriptor,
    /// Every descriptor of a request is checked and charged in one store call: all are
    /// charged, or (when one refuses) none.
    AllOrNothing,
}

/// What a limit answers when the store cannot decide within its deadline
/// (`on_store_failure:` in `rate_limit`, `--on-store-failure` / `ON_STORE_FAILURE` for the
/// default; extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnStoreFailure {
    /// The call fails with gRPC `UNAVAILABLE` and Envoy's `failure_mode_deny` decides (the
    /// reference's behaviour, which fails with `UNKNOWN`). The default.
    #[default]
    Unavailable,
    /// Fail open: the descriptor answers `OK` without a limit (no made-up remaining).
    Allow,
    /// Fail closed: the descriptor answers `OVER_LIMIT`.
    Deny,
    /// Fail soft: the replica enforces its share of the limit in memory (the limit divided
    /// by the live replicas that registered in Redis) until Redis is back.
    FailSoft,
}

impl OnStoreFailure {
    /// Reads `unavailable`, `allow`, `deny` or `fail_soft` (any case, `-` for `_`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "unavailable" => Some(Self::Unavailable),
            "allow" => Some(Self::Allow),
            "deny" => Some(Self::Deny),
            "fail_soft" => Some(Self::FailSoft),
            _ => None,
        }
    }
}

/// A unit name that is not second, minute, hour, day, week, month or year.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate limit unit '{0}'")]
pub struct UnitParseError(pub String);

impl FromStr for Unit {
    type Err = UnitParseError;

    /// Case-insensitive, as the reference (which upper-cases and looks up the protobuf name).
    fn from_str(s: &str) -> Result<Unit, UnitParseError> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnitParseError(s.to_owned()))
    }
}

/// The limit of one config descriptor: its `rate_limit:` map and the descriptor flags that
/// apply to it.
///
/// Built only by loading a config ([`RateLimitConfig`](super::RateLimitConfig)).
///
/// `Serialize` writes the fields by their config names (`replaces` as a list of names); an
/// `unlimited` rule has no `unit` and no `requests_per_unit`, as in its file.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateLimitRule {
    /// Requests (hits) allowed per window ([`RateLimitRule::period_secs`]). A missing
    /// `requests_per_unit` is 0, which refuses every request (the reference's deny-list idiom).
    pub requests_per_unit: u32,
    /// The unit written in the file, or, for a rule given by `period` alone, the unit
    /// reported in `current_limit` ([`Unit::covering`] the period). For an `unlimited` rule
    /// (which has no unit in the file) this is [`Unit::Second`] and means nothing (it is not
    /// serialized).
    pub unit: Unit,
    /// `period:` (an extension): the window, in whole seconds from 1 s to 365 days. `None`:
    /// the window is `unit`.
    pub period: Option<Duration>,
    /// `algorithm:` (an extension): how hits are counted. Default
    /// [`Algorithm::FixedWindow`], the reference's epoch-aligned fixed window.
    pub algorithm: Algorithm,
    /// `on_store_failure:` (an extension): what this limit answers when the store fails.
    /// `None`: the service's default (`--on-store-failure`).
    pub on_store_failure: Option<OnStoreFailure>,
    /// `unlimited: true`: the descriptor is allowed without counting (`OK`, remaining
    /// `u32::MAX`).
    pub unlimited: bool,
    /// `rate_limit.name`, returned in the status's `current_limit.name` and the target of other
    /// rules' `replaces`. `None` when absent or empty.
    pub name: Option<String>,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode: true` on the descriptor: counted, but never refuses (not inherited by
    /// nested descriptors).
    pub shadow_mode: bool,
    /// `quota_mode: true` on the descriptor: refuses only when every quota-mode descriptor of
    /// the request is over.
    pub quota_mode: bool,
    /// `detailed_metric: true` on the descriptor: the stats key uses the request's values.
    pub detailed_metric: bool,
    /// The descriptor's `metadata` as JSON (returned in dynamic metadata).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl RateLimitRule {
    /// The window in seconds: `period` when given, else the `unit`'s length.
    pub fn period_secs(&self) -> u64 {
        self.period.map_or(self.unit.seconds(), |p| p.as_secs())
    }
}

impl Serialize for RateLimitRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if !self.unlimited {
            m.serialize_entry("requests_per_unit", &self.requests_per_unit)?;
            m.serialize_entry("unit", &self.unit)?;
            if let Some(p) = self.period {
                m.serialize_entry("period", &format!("{}s", p.as_secs()))?;
            }
            if self.algorithm != Algorithm::FixedWindow {
                m.serialize_entry("algorithm", &self.algorithm.name().replace('-', "_"))?;
            }
            if let Some(f) = self.on_store_failure {
                m.serialize_entry("on_store_failure", &f)?;
            }
        }
        m.serialize_entry("unlimited", &self.unlimited)?;
        if let Some(name) = &self.name {
            m.serialize_entry("name", name)?;
        }
        if !self.replaces.is_empty() {
            m.serialize_entry("replaces", &self.replaces)?;
        }
        m.serialize_entry("shadow_mode", &self.shadow_mode)?;
        m.serialize_entry("quota_mode", &self.quota_mode)?;
        m.serialize_entry("detailed_metric", &self.detailed_metric)?;
        if let Some(metadata) = &self.metadata {
            m.serialize_entry("metadata", metadata)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_case_insensitively_and_map_to_the_proto() {
        assert_eq!("MiNuTe".parse::<Unit>(), Ok(Unit::Minute));
        assert_eq!("WEEK".parse::<Unit>(), Ok(Unit::Week));
        assert!("unknown".parse::<Unit>().is_err());
        assert!("".parse::<Unit>().is_err());
        for unit in Unit::ALL {
            assert_eq!(Unit::from_proto(unit.to_proto()), Some(unit));
            assert_eq!(Unit::from_proto_i32(unit.to_proto() as i32), Some(unit));
        }
        assert_eq!(Unit::from_proto_i32(0), None);
        assert_eq!(Unit::try_from(PbUnit::Hour), Ok(Unit::Hour));
        assert!(Unit::try_from(PbUnit::Unknown).is_err());
        assert_eq!(PbUnit::from(Unit::Week), PbUnit::Week);
        assert_eq!(Unit::from_proto_i32(99), None);
        assert_eq!(Unit::Month.seconds(), 30 * 86_400);
        assert_eq!(Unit::Year.seconds(), 365 * 86_400);
        assert_eq!(Unit::Week.seconds(), 7 * 86_400);
    }
}
