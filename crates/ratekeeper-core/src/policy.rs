//! Policies: a named quota plus an algorithm.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use ratekeeper_core::{Algorithm, Policy, Quota};
//!
//! let api = Policy::new("api", Quota::per_minute(NonZeroU32::new(1000).unwrap()));
//! assert_eq!(api.name(), "api");
//! assert_eq!(api.algorithm(), Algorithm::Gcra);
//!
//! let search = Policy::new("search", "60/m burst 10".parse()?)
//!     .with_algorithm(Algorithm::SlidingWindow);
//! assert_eq!(search.capacity(), 60); // window algorithms hold `limit`, not `burst`
//! # Ok::<(), ratekeeper_core::quota::QuotaParseError>(())
//! ```
//!
//! With the `serde` feature a policy reads from configuration as
//! `{ name = "search", quota = "60/m burst 10", algorithm = "sliding-window" }` (`algorithm`
//! is optional and defaults to `gcra`; unknown fields are errors):
//!
//! ```
//! # #[cfg(feature = "serde")] {
//! use ratekeeper_core::{Algorithm, Policy};
//! let p: Policy = serde_json::from_str(
//!     r#"{"name": "daily", "quota": "1000/day", "algorithm": "fixed-window"}"#,
//! ).unwrap();
//! assert_eq!(p.algorithm(), Algorithm::FixedWindow);
//! let err = serde_json::from_str::<Policy>(r#"{"name": "x", "quota": "-1/min"}"#).unwrap_err();
//! assert!(err.to_string().contains("invalid limit \"-1\""));
//! # }
//! ```

use std::sync::Arc;

use crate::{Algorithm, Quota};

/// Why a policy name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Names appear in headers (`RateLimit-Policy`) and store keys, so they must be 1..=64
    /// characters from `[A-Za-z0-9_.-]`.
    #[error("invalid policy name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 _ . -")]
    InvalidName(String),
}

/// A named quota plus an algorithm. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct Policy {
    name: Arc<str>,
    quota: Quota,
    #[cfg_attr(feature = "serde", serde(default))]
    algorithm: Algorithm,
}

impl Policy {
    /// A GCRA policy. The name is checked by [`Policy::validate`] when a limiter is built.
    pub fn new(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self {
            name: name.into(),
            quota,
            algorithm: Algorithm::default(),
        }
    }

    /// The same policy with another algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy's quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The policy's algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The largest cost that can ever pass: [`Algorithm::capacity`] of the quota (`burst`
    /// for GCRA and the leaky bucket, `limit` for the others).
    pub fn capacity(&self) -> u32 {
        self.algorithm.capacity(&self.quota)
    }

    /// The quota this policy advertises to clients, `(q, w)`: at most `q` units per window
    /// of `w`, as the `X-RateLimit-Limit` header and the `q` / `w` parameters of the IETF
    /// `RateLimit-Policy` field (draft-ietf-httpapi-ratelimit-headers) report it. Every
    /// decision of the policy has `0 <= remaining <= q`.
    ///
    /// - GCRA and the leaky bucket: `(burst, burst * T)`, the capacity and the time an empty
    ///   bucket takes to refill completely (`T` = [`Quota::emission_interval`], a whole
    ///   number of ns). `q / w` is the sustained rate; where `burst = limit` this is the
    ///   quota itself.
    /// - Fixed window, sliding log, sliding window counter and concurrency: `(limit, period)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use ratekeeper_core::{Algorithm, Policy};
    ///
    /// // "1 per second, burst 10" advertises 10 per 10 s; "100 per minute, burst
    /// // 10" advertises 10 per 6 s.
    /// let p1 = Policy::new("p1", "1/s burst 10".parse()?);
    /// assert_eq!(p1.advertised(), (10, Duration::from_secs(10)));
    /// let p2 = Policy::new("p2", "100/m burst 10".parse()?);
    /// assert_eq!(p2.advertised(), (10, Duration::from_secs(6)));
    /// let fw = Policy::new("fw", "10/m burst 50".parse()?).with_algorithm(Algorithm::FixedWindow);
    /// assert_eq!(fw.advertised(), (10, Duration::from_secs(60)));
    /// # Ok::<(), ratekeeper_core::quota::QuotaParseError>(())
    /// ```
    pub fn advertised(&self) -> (u32, std::time::Duration) {
        let q = &self.quota;
        match self.algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket => (
                q.burst(),
                std::time::Duration::from_nanos(q.tolerance_nanos()),
            ),
            Algorithm::FixedWindow
            | Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::Concurrency => (q.limit(), q.period()),
        }
    }

    /// Checks the name.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidName`] when the name is empty, longer than 64 bytes or has a
    /// character outside `[A-Za-z0-9_.-]`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(())
        } else {
            Err(PolicyError::InvalidName(self.name.to_string()))
        }
    }
}
