//! [`Algorithm`]: which algorithm a policy uses, chosen in code or by name.

use std::fmt;
use std::str::FromStr;

use crate::Quota;

/// Which algorithm a policy uses.
///
/// Names (for [`FromStr`], [`Display`](fmt::Display) and serde): `gcra` (also
/// `token-bucket`), `leaky-bucket`, `fixed-window`, `sliding-log`, `sliding-window` (also
/// `sliding-window-counter`), `concurrency`; `_` may replace `-` and case is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a token bucket held in one number (the default).
    #[default]
    Gcra,
    /// Leaky bucket as a meter: GCRA with capacity = queue depth
    /// ([`LeakyBucket`](super::LeakyBucket)).
    LeakyBucket,
    /// Fixed window aligned to multiples of the period from time 0
    /// ([`FixedWindow`](super::FixedWindow)).
    FixedWindow,
    /// Sliding window log: exact ([`SlidingLog`](super::SlidingLog)).
    SlidingLog,
    /// Sliding window counter: weighted estimate in O(1) memory
    /// ([`SlidingWindow`](super::SlidingWindow)).
    SlidingWindow,
    /// In-flight requests per key ([`Concurrency`](super::Concurrency)); permits come back
    /// through a refund.
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
    ];

    /// The canonical name (`"gcra"`, `"leaky-bucket"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky-bucket",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// The largest cost that can ever pass under `quota`: `burst` for GCRA and the leaky
    /// bucket, `limit` for the window algorithms and the concurrency counter. A larger cost
    /// is [`Outcome::CannotFit`](crate::Outcome::CannotFit).
    pub const fn capacity(self, quota: &Quota) -> u32 {
        match self {
            Algorithm::Gcra | Algorithm::LeakyBucket => quota.burst(),
            Algorithm::FixedWindow
            | Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::Concurrency => quota.limit(),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that [`Algorithm::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown algorithm {0:?}: expected one of gcra, token-bucket, leaky-bucket, fixed-window, \
     sliding-log, sliding-window, concurrency"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase().replace('_', "-");
        Ok(match name.as_str() {
            "gcra" | "token-bucket" => Algorithm::Gcra,
            "leaky-bucket" => Algorithm::LeakyBucket,
            "fixed-window" => Algorithm::FixedWindow,
            "sliding-log" | "sliding-window-log" => Algorithm::SlidingLog,
            "sliding-window" | "sliding-window-counter" => Algorithm::SlidingWindow,
            "concurrency" => Algorithm::Concurrency,
            _ => return Err(UnknownAlgorithm(s.to_owned())),
        })
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Algorithm {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
            assert_eq!(a.to_string().to_uppercase().parse::<Algorithm>(), Ok(a));
        }
        let err = "leaky".parse::<Algorithm>().unwrap_err();
        assert!(err.to_string().contains("\"leaky\""));
    }
}
