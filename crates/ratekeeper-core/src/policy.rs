//! [`Policy`]: a named quota plus an algorithm, and its [`Ban`].

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::{Algorithm, Quota};

/// Why a policy name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Names appear in headers (`RateLimit-Policy`) and store keys, so they must be 1..=64
    /// characters from `[A-Za-z0-9_.-]`.
    #[error("invalid policy name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 _ . -")]
    InvalidName(String),
    /// A [`Ban`]'s `within` or `duration` is zero, not a whole number of microseconds, or
    /// longer than [`Ban::MAX_DURATION`].
    #[error("invalid ban of policy {policy:?}: {reason}")]
    InvalidBan {
        /// The policy's name.
        policy: String,
        /// What is wrong, in a few words.
        reason: &'static str,
    },
    /// The quota has a burst other than its limit, but the algorithm cannot honour one: the
    /// window algorithms (fixed window, sliding log, sliding window counter) and the
    /// concurrency counter hold `limit` per window (or in flight). Only
    /// [`Algorithm::Gcra`] and [`Algorithm::LeakyBucket`] take a burst.
    #[error(
        "policy {policy:?} sets burst {burst} but algorithm {algorithm} takes no burst \
         (it holds the limit, {limit}): remove the burst, or use gcra or leaky-bucket, \
         the algorithms that take one"
    )]
    BurstNotSupported {
        /// The policy's name.
        policy: String,
        /// The policy's algorithm.
        algorithm: Algorithm,
        /// The quota's burst.
        burst: u32,
        /// The quota's limit.
        limit: u32,
    },
}

impl PolicyError {
    /// Whether the error is about a [`Ban`] (not the policy's name).
    pub fn is_ban(&self) -> bool {
        matches!(self, Self::InvalidBan { .. })
    }

    /// Whether the error is about a burst the policy's algorithm cannot honour.
    pub fn is_burst(&self) -> bool {
        matches!(self, Self::BurstNotSupported { .. })
    }
}

/// A ban: once a policy has refused a key `after` times within `within`, every check of
/// that policy for that key is refused for `duration`, however much of the quota has come
/// back meanwhile ("block the client for 15 minutes after 10 failed logins").
///
/// - **Refusals.** A refusal is a decision of the policy that denies (not a cost that can
///   never fit). The count starts at the first refusal and runs for `within`: the
///   `after`-th refusal less than `within` after the first starts the ban; a refusal at or
///   after `within` starts a new count. In the Delay mode a denial counts only when the
///   request is refused, not when it waits (a final denial, or one whose `retry_after` is
///   longer than the request may wait). Requests refused by the ban itself do not count,
///   so a ban is never extended by the requests it refuses.
/// - **During the ban** the policy's decision for the key is [`Outcome::Denied`] with
///   `retry_after` = the ban's end − now (exactly), `remaining` 0 and `reset_after` = the
///   ban's end − now; nothing is charged. [`Decision::is_banned`] tells it apart from a
///   denial by the quota, [`Decision::starts_ban`] marks the one decision that started it
///   (its `retry_after` is `duration`, or the quota's wait when that is longer). In the Delay
///   mode a banned request waits for the end only when its `max_wait` covers it; otherwise
///   the denial is final.
/// - **After the ban** the key is checked against its quota again, with the refusal count
///   back at zero; the quota's state is whatever elapsed time left (the refusals charged
///   nothing).
/// - **Shared stores** keep the ban with the key's state, so every instance refuses a key
///   one of them banned (the Redis store and the tiered store); the memory store keeps it in
///   the process.
///
/// `within` and `duration` are whole microseconds (the Redis store's unit), from 1 µs to
/// [`Ban::MAX_DURATION`]; [`Policy::validate`] refuses others with
/// [`PolicyError::InvalidBan`].
///
/// With the `serde` feature a ban reads as `{ after = 10, within = "15m", duration = "15m" }`
/// (durations as `<count><unit>`, the units of a quota's period: `ms`, `s`, `m`/`min`, `h`,
/// `d`).
///
/// [`Outcome::Denied`]: crate::Outcome::Denied
/// [`Decision::is_banned`]: crate::Decision::is_banned
/// [`Decision::starts_ban`]: crate::Decision::starts_ban
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use ratekeeper_core::{Ban, Policy};
///
/// let fifteen_minutes = Duration::from_secs(15 * 60);
/// // 10 failed logins per 15 minutes; the 11th attempt is refused and bans for 15 minutes.
/// let login = Policy::new("login", "10/15min".parse()?)
///     .with_ban(Ban::after(NonZeroU32::MIN, fifteen_minutes).lasting(fifteen_minutes));
/// assert_eq!(login.ban().unwrap().duration(), fifteen_minutes);
/// assert!(login.validate().is_ok());
///
/// let zero = Policy::new("p", "1/s".parse()?)
///     .with_ban(Ban::after(NonZeroU32::MIN, Duration::ZERO).lasting(fifteen_minutes));
/// assert!(zero.validate().unwrap_err().is_ban());
/// # Ok::<(), ratekeeper_core::QuotaParseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ban {
    after: NonZeroU32,
    within_ns: u64,
    duration_ns: u64,
}

/// The first half of a [`Ban`]: how many refusals within how long start it
/// ([`Ban::after`]); [`BanAfter::lasting`] says how long it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BanAfter {
    after: NonZeroU32,
    within_ns: u64,
}

impl BanAfter {
    /// The ban, lasting `duration` (saturating at `u64::MAX` ns).
    pub const fn lasting(self, duration: Duration) -> Ban {
        Ban {
            after: self.after,
            within_ns: self.within_ns,
            duration_ns: crate::clock::nanos(duration),
        }
    }
}

impl Ban {
    /// The longest `within` and `duration`: 365 days.
    pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

    /// A ban that starts at the `refusals`-th refusal within `within` (saturating at
    /// `u64::MAX` ns); [`BanAfter::lasting`] completes it.
    pub const fn after(refusals: NonZeroU32, within: Duration) -> BanAfter {
        BanAfter {
            after: refusals,
            within_ns: crate::clock::nanos(within),
        }
    }

    /// Refusals that start the ban.
    pub const fn refusals(&self) -> NonZeroU32 {
        self.after
    }

    /// How long after the first counted refusal the count runs.
    pub const fn within(&self) -> Duration {
        Duration::from_nanos(self.within_ns)
    }

    /// How long a ban lasts.
    pub const fn duration(&self) -> Duration {
        Duration::from_nanos(self.duration_ns)
    }

    /// [`Ban::within`] in ns.
    pub(crate) const fn within_nanos(&self) -> u64 {
        self.within_ns
    }

    /// [`Ban::duration`] in ns.
    pub(crate) const fn duration_nanos(&self) -> u64 {
        self.duration_ns
    }

    /// What is wrong with the ban, if anything (see [`PolicyError::InvalidBan`]).
    fn problem(&self) -> Option<&'static str> {
        let max = crate::clock::nanos(Self::MAX_DURATION);
        let check = |ns: u64, zero, fraction, long| {
            // Too long before a fraction: a duration beyond `u64::MAX` ns (`Duration::MAX`)
            // saturates to a value that is not whole microseconds either.
            if ns == 0 {
                Some(zero)
            } else if ns > max {
                Some(long)
            } else if ns % 1_000 != 0 {
                Some(fraction)
            } else {
                None
            }
        };
        check(
            self.within_ns,
            "`within` is zero",
            "`within` is not a whole number of microseconds",
            "`within` is longer than 365 days",
        )
        .or_else(|| {
            check(
                self.duration_ns,
                "`duration` is zero",
                "`duration` is not a whole number of microseconds",
                "`duration` is longer than 365 days",
            )
        })
    }
}

#[cfg(feature = "serde")]
mod ban_serde {
    use std::fmt;

    use super::{Ban, NonZeroU32};
    use crate::quota::{parse_duration_nanos, write_duration_nanos};

    /// A duration in ns, as `<count><unit>` text.
    struct Text(u64);

    impl fmt::Display for Text {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_duration_nanos(f, self.0)
        }
    }

    impl serde::Serialize for Text {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> serde::Deserialize<'de> for Text {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            parse_duration_nanos(&s).map(Text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid duration {s:?}: write a count and a unit, like \"15m\", \"30s\" or \"1h\""
                ))
            })
        }
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(
        deny_unknown_fields,
        expecting = "a ban such as { after = 10, within = \"15m\", duration = \"15m\" }"
    )]
    struct Form {
        after: NonZeroU32,
        within: Text,
        duration: Text,
    }

    impl serde::Serialize for Ban {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            Form {
                after: self.after,
                within: Text(self.within_ns),
                duration: Text(self.duration_ns),
            }
            .serialize(serializer)
        }
    }

    impl<'de> serde::Deserialize<'de> for Ban {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let form = Form::deserialize(deserializer)?;
            let ban = Ban {
                after: form.after,
                within_ns: form.within.0,
                duration_ns: form.duration.0,
            };
            match ban.problem() {
                None => Ok(ban),
                Some(reason) => Err(serde::de::Error::custom(reason)),
            }
        }
    }
}

/// A named quota plus an algorithm. Cheap to clone.
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use ratekeeper_core::{Algorithm, Policy, Quota};
///
/// let api = Policy::new("api", Quota::per_minute(NonZeroU32::new(1000).unwrap()));
/// assert_eq!(api.name(), "api");
/// assert_eq!(api.algorithm(), Algorithm::Gcra);
///
/// let search = Policy::new("search", "60/m".parse()?)
///     .with_algorithm(Algorithm::SlidingWindow);
/// assert_eq!(search.capacity(), 60); // window algorithms hold `limit` per window
///
/// // Only GCRA and the leaky bucket take a burst; a window algorithm refuses one.
/// let bursty = Policy::new("search", "60/m burst 10".parse()?)
///     .with_algorithm(Algorithm::SlidingWindow);
/// assert!(bursty.validate().unwrap_err().is_burst());
/// # Ok::<(), ratekeeper_core::QuotaParseError>(())
/// ```
///
/// With the `serde` feature a policy reads from configuration as
/// `{ name = "search", quota = "60/m", algorithm = "sliding-window" }` (`algorithm`
/// is optional and defaults to `gcra`; unknown fields are errors):
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use ratekeeper_core::{Algorithm, Policy};
/// let p: Policy = serde_json::from_str(
///     r#"{"name": "daily", "quota": "1000/day", "algorithm": "fixed-window"}"#,
/// ).unwrap();
/// assert_eq!(p.algorithm(), Algorithm::FixedWindow);
/// let err = serde_json::from_str::<Policy>(r#"{"name": "x", "quota": "-1/min"}"#).unwrap_err();
/// assert!(err.to_string().contains("invalid limit \"-1\""));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(
        deny_unknown_fields,
        expecting = "a policy such as { name = \"api\", quota = \"100/min\" }"
    )
)]
pub struct Policy {
    name: Arc<str>,
    quota: Quota,
    #[cfg_attr(feature = "serde", serde(default))]
    algorithm: Algorithm,
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    ban: Option<Ban>,
}

impl Policy {
    /// A GCRA policy. The name is checked by [`Policy::validate`] when a limiter is built.
    pub fn new(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self {
            name: name.into(),
            quota,
            algorithm: Algorithm::default(),
            ban: None,
        }
    }

    /// The same policy with a [`Ban`]: a key it refuses `ban.refusals()` times within
    /// `ban.within()` is refused for `ban.duration()`. The ban is checked by
    /// [`Policy::validate`] when a limiter is built.
    pub fn with_ban(mut self, ban: Ban) -> Self {
        self.ban = Some(ban);
        self
    }

    /// The policy's ban, if it has one.
    pub fn ban(&self) -> Option<&Ban> {
        self.ban.as_ref()
    }

    /// The same policy with another algorithm. A quota with a burst other than its limit
    /// pairs only with [`Algorithm::Gcra`] or [`Algorithm::LeakyBucket`]; with another
    /// algorithm [`Policy::validate`] refuses the policy with
    /// [`PolicyError::BurstNotSupported`].
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
    /// - GCRA and the leaky bucket: `(burst, burst * period / limit)`, the capacity and the
    ///   time an empty bucket takes to refill completely at the quota's rate
    ///   ([`Quota::refill_nanos`], rounded up to a whole ns). `q / w` is the sustained rate;
    ///   where `burst = limit` this is the quota itself (`7/s` advertises 7 per 1 s, not the
    ///   1.000000001 s that seven emission intervals of 142 857 143 ns add up to).
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
    /// let fw = Policy::new("fw", "10/m".parse()?).with_algorithm(Algorithm::FixedWindow);
    /// assert_eq!(fw.advertised(), (10, Duration::from_secs(60)));
    /// let p3 = Policy::new("p3", "7/s".parse()?);
    /// assert_eq!(p3.advertised(), (7, Duration::from_secs(1)));
    /// # Ok::<(), ratekeeper_core::QuotaParseError>(())
    /// ```
    pub fn advertised(&self) -> (u32, std::time::Duration) {
        let q = &self.quota;
        match self.algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                (q.burst(), std::time::Duration::from_nanos(q.refill_nanos()))
            }
            Algorithm::FixedWindow
            | Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::Concurrency => (q.limit(), q.period()),
        }
    }

    /// Checks the name, the quota against the algorithm, and the ban. Every store calls it
    /// when a policy is registered, so a limiter is never built with a policy it refuses.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidName`] when the name is empty, longer than 64 bytes or has a
    /// character outside `[A-Za-z0-9_.-]`; [`PolicyError::BurstNotSupported`] when the
    /// quota's burst differs from its limit and the algorithm is not GCRA or the leaky
    /// bucket; [`PolicyError::InvalidBan`] when the ban's `within` or `duration` is zero, not
    /// a whole number of µs, or longer than [`Ban::MAX_DURATION`].
    ///
    /// ```
    /// use ratekeeper_core::{Algorithm, Policy};
    ///
    /// let search = Policy::new("search", "10/m burst 3".parse()?)
    ///     .with_algorithm(Algorithm::SlidingLog);
    /// let err = search.validate().unwrap_err();
    /// assert!(err.is_burst());
    /// assert_eq!(
    ///     err.to_string(),
    ///     "policy \"search\" sets burst 3 but algorithm sliding-log takes no burst (it \
    ///      holds the limit, 10): remove the burst, or use gcra or leaky-bucket, the \
    ///      algorithms that take one"
    /// );
    /// let gcra = Policy::new("search", "10/m burst 3".parse()?);
    /// assert!(gcra.validate().is_ok());
    /// # Ok::<(), ratekeeper_core::QuotaParseError>(())
    /// ```
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_name()?;
        let q = &self.quota;
        let takes_burst = matches!(self.algorithm, Algorithm::Gcra | Algorithm::LeakyBucket);
        if q.burst() != q.limit() && !takes_burst {
            return Err(PolicyError::BurstNotSupported {
                policy: self.name.to_string(),
                algorithm: self.algorithm,
                burst: q.burst(),
                limit: q.limit(),
            });
        }
        match self.ban.as_ref().and_then(Ban::problem) {
            None => Ok(()),
            Some(reason) => Err(PolicyError::InvalidBan {
                policy: self.name.to_string(),
                reason,
            }),
        }
    }

    fn validate_name(&self) -> Result<(), PolicyError> {
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

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
