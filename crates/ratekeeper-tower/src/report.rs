//! What clients see: rate-limit headers, `Retry-After`, and the 429 problem+json body.
//!
//! Header syntax follows `HEADERS.md` of the project:
//!
//! - `Retry-After` (RFC 9110 §10.2.3) as delay-seconds rounded **up**, at least 1, on every
//!   429 except "cost can never fit" (which has no honest retry time).
//! - `X-RateLimit-Limit` / `-Remaining` / `-Reset` (the de-facto headers; the default): the
//!   policy closest to exhaustion is reported (the denying one on a 429). Reset is
//!   delta-seconds rounded up ([`ResetFormat::DeltaSeconds`], the default) or Unix epoch
//!   seconds ([`ResetFormat::UnixEpoch`]).
//! - 429 responses carry `Cache-Control: no-store` (RFC 6585 §4) and an RFC 9457
//!   `application/problem+json` body with the quota-exceeded type of
//!   draft-ietf-httpapi-ratelimit-headers and `violated-policies`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ratekeeper_core::decision::ceil_secs;
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Policy};
use serde::Serialize;

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The problem type of a 429 (draft-ietf-httpapi-ratelimit-headers, IANA HTTP problem types).
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Which rate-limit headers to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (the default).
    #[default]
    XRateLimit,
    /// No rate-limit headers (a 429 still carries `Retry-After`).
    None,
}

/// How reset values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds until the quota is fully available again, rounded up (the default).
    #[default]
    DeltaSeconds,
    /// Unix time in seconds at which the quota is fully available again, rounded up.
    UnixEpoch,
}

/// Renders decisions into headers and 429 responses. Built once per layer; nothing is
/// allocated per request except the header values and the 429 body.
#[derive(Debug, Clone)]
pub(crate) struct Reporter {
    pub(crate) names: Vec<Box<str>>,
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies")]
    violated_policies: Vec<&'a str>,
}

impl Reporter {
    pub(crate) fn new(policies: &[Policy], style: HeaderStyle, reset: ResetFormat) -> Self {
        Self {
            names: policies.iter().map(|p| p.name().into()).collect(),
            style,
            reset,
        }
    }

    fn reset_value(&self, d: &Decision, unix_now: impl FnOnce() -> Duration) -> u64 {
        match self.reset {
            ResetFormat::DeltaSeconds => ceil_secs(d.reset_after()),
            ResetFormat::UnixEpoch => ceil_secs(unix_now().saturating_add(d.reset_after())),
        }
    }

    /// Adds the rate-limit headers for `decisions` (replacing any the inner service set, so a
    /// header never appears twice).
    pub(crate) fn headers(
        &self,
        decisions: &Decisions,
        unix_now: impl FnOnce() -> Duration,
        headers: &mut HeaderMap,
    ) {
        let Some(i) = decisions.deciding() else {
            return;
        };
        let d = &decisions.as_slice()[i];
        match self.style {
            HeaderStyle::XRateLimit => {
                headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(d.limit()));
                headers.insert(
                    X_RATELIMIT_REMAINING.clone(),
                    HeaderValue::from(d.remaining()),
                );
                headers.insert(
                    X_RATELIMIT_RESET.clone(),
                    HeaderValue::from(self.reset_value(d, unix_now)),
                );
            }
            HeaderStyle::None => {}
        }
    }

    /// The 429 for a denial: status, headers and the problem+json body.
    /// `policies` gives the layer's policy index of each decision (a request may be charged
    /// to a subset of the layer's policies).
    pub(crate) fn limited(
        &self,
        decisions: &Decisions,
        policies: impl Iterator<Item = usize>,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut headers = HeaderMap::new();
        self.headers(decisions, unix_now, &mut headers);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let violated: Vec<&str> = decisions
            .as_slice()
            .iter()
            .zip(policies)
            .filter(|(d, _)| d.is_denied())
            .filter_map(|(_, i)| self.names.get(i).map(|n| &**n))
            .collect();
        let detail = match decisions.retry_after() {
            Some(wait) => {
                let secs = ceil_secs(wait).max(1);
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
                format!(
                    "quota exceeded for policy {}; retry after {secs} s",
                    violated.join(", ")
                )
            }
            None => format!(
                "the request's cost is larger than the capacity (burst) of policy {}: it can never be \
                 allowed",
                violated.join(", ")
            ),
        };
        let problem = Problem {
            kind: QUOTA_EXCEEDED_TYPE,
            title: "Too Many Requests",
            status: 429,
            detail,
            violated_policies: violated,
        };
        // Serialising a struct of strings and integers cannot fail.
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        (StatusCode::TOO_MANY_REQUESTS, headers, Bytes::from(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratekeeper_core::{Outcome, Quota};
    use std::num::NonZeroU32;

    fn reporter() -> Reporter {
        let q = Quota::per_minute(NonZeroU32::new(10).unwrap());
        Reporter::new(
            &[Policy::new("default", q)],
            HeaderStyle::XRateLimit,
            ResetFormat::DeltaSeconds,
        )
    }

    #[test]
    fn sub_second_retry_after_rounds_up_to_one() {
        let d = Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_millis(1),
            },
            10,
            0,
            Duration::from_millis(1),
        );
        let (status, headers, body) =
            reporter().limited(&Decisions::new([d]), 0..1, || Duration::ZERO);
        assert_eq!(status, 429);
        assert_eq!(headers[RETRY_AFTER], "1");
        assert_eq!(headers[&X_RATELIMIT_RESET], "1");
        assert_eq!(headers[CACHE_CONTROL], "no-store");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["violated-policies"][0], "default");
        assert_eq!(v["type"], QUOTA_EXCEEDED_TYPE);
    }

    #[test]
    fn cannot_fit_has_no_retry_after() {
        let d = Decision::new(Outcome::CannotFit, 10, 10, Duration::ZERO);
        let (_, headers, body) = reporter().limited(&Decisions::new([d]), 0..1, || Duration::ZERO);
        assert!(headers.get(RETRY_AFTER).is_none());
        assert!(String::from_utf8(body.to_vec()).unwrap().contains("never"));
    }

    #[test]
    fn epoch_reset_rounds_up() {
        let mut r = reporter();
        r.reset = ResetFormat::UnixEpoch;
        let d = Decision::new(Outcome::Allowed, 2, 0, Duration::from_millis(1));
        let mut h = HeaderMap::new();
        r.headers(
            &Decisions::new([d]),
            || Duration::from_millis(1_700_000_009_999),
            &mut h,
        );
        assert_eq!(h[&X_RATELIMIT_RESET], "1700000010");
    }
}
