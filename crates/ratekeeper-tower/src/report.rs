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

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ratekeeper_core::decision::ceil_secs;
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Policy};

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
                headers.insert(X_RATELIMIT_LIMIT.clone(), number(d.limit().into()));
                headers.insert(X_RATELIMIT_REMAINING.clone(), number(d.remaining().into()));
                headers.insert(
                    X_RATELIMIT_RESET.clone(),
                    number(self.reset_value(d, unix_now)),
                );
            }
            HeaderStyle::None => {}
        }
    }

    /// The 429 for a denial: status, headers and the problem+json body.
    /// `policies` gives the layer's policy index of each decision (a request may be charged
    /// to a subset of the layer's policies).
    ///
    /// Per request this allocates the header map, the body and header values above 1023;
    /// the body is written directly (no serializer, no intermediate strings).
    pub(crate) fn limited(
        &self,
        decisions: &Decisions,
        policies: impl Iterator<Item = usize> + Clone,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut headers = HeaderMap::with_capacity(8);
        self.headers(decisions, unix_now, &mut headers);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry_secs = decisions.retry_after().map(|wait| ceil_secs(wait).max(1));
        if let Some(secs) = retry_secs {
            headers.insert(RETRY_AFTER, number(secs));
        }
        let violated = decisions
            .as_slice()
            .iter()
            .zip(policies)
            .filter(|(d, _)| d.is_denied())
            .filter_map(|(_, i)| self.names.get(i).map(|n| &**n));
        let body = problem_json(violated, retry_secs);
        (StatusCode::TOO_MANY_REQUESTS, headers, body)
    }
}

/// Header values for 0..SMALL_NUMBERS are made once per process and cloned for free.
const SMALL_NUMBERS: usize = 1024;

/// A header value holding `n` in decimal: a clone of a precomputed static value below 1024
/// (no allocation, no shared counter), otherwise a fresh one.
fn number(n: u64) -> HeaderValue {
    static SMALL: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let small = SMALL.get_or_init(|| {
        // One string of all the digits, leaked once (about 3 KiB) so that the values are
        // `'static` and cloning them touches no reference count.
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SMALL_NUMBERS);
        for i in 0..SMALL_NUMBERS {
            text.push_str(itoa::Buffer::new().format(i));
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let digits = text.get(start..end).unwrap_or("0");
                start = end;
                HeaderValue::from_static(digits)
            })
            .collect()
    });
    usize::try_from(n)
        .ok()
        .and_then(|i| small.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// Appends `s` as the inside of a JSON string (RFC 8259 §7). Policy names are validated to
/// `[A-Za-z0-9_.-]`, which never needs escaping; anything else goes through serde_json.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.extend_from_slice(s.as_bytes());
    } else {
        let quoted = serde_json::to_string(s).unwrap_or_default();
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or_default();
        out.extend_from_slice(inner.as_bytes());
    }
}

/// The RFC 9457 problem+json body of a 429, byte for byte what serde_json writes for
/// the `Problem` struct of this module's tests, in one allocation.
fn problem_json<'a>(
    violated: impl Iterator<Item = &'a str> + Clone,
    retry_secs: Option<u64>,
) -> Bytes {
    let names = |out: &mut Vec<u8>, separator: &[u8], quoted: bool| {
        for (i, name) in violated.clone().enumerate() {
            if i > 0 {
                out.extend_from_slice(separator);
            }
            if quoted {
                out.push(b'"');
            }
            push_json_str(out, name);
            if quoted {
                out.push(b'"');
            }
        }
    };
    let mut out = Vec::with_capacity(320);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(QUOTA_EXCEEDED_TYPE.as_bytes());
    out.extend_from_slice(b"\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"");
    match retry_secs {
        Some(secs) => {
            out.extend_from_slice(b"quota exceeded for policy ");
            names(&mut out, b", ", false);
            out.extend_from_slice(b"; retry after ");
            out.extend_from_slice(itoa::Buffer::new().format(secs).as_bytes());
            out.extend_from_slice(b" s");
        }
        None => {
            out.extend_from_slice(
                b"the request's cost is larger than the capacity (burst) of policy ",
            );
            names(&mut out, b", ", false);
            out.extend_from_slice(b": it can never be allowed");
        }
    }
    out.extend_from_slice(b"\",\"violated-policies\":[");
    names(&mut out, b",", true);
    out.extend_from_slice(b"]}");
    Bytes::from(out)
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

    #[derive(serde::Serialize)]
    struct Problem<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        title: &'static str,
        status: u16,
        detail: String,
        #[serde(rename = "violated-policies")]
        violated_policies: Vec<&'a str>,
    }

    /// The serde_json rendering the direct writer replaces.
    fn serde_body(violated: &[&str], retry_secs: Option<u64>) -> Vec<u8> {
        let detail = match retry_secs {
            Some(secs) => format!(
                "quota exceeded for policy {}; retry after {secs} s",
                violated.join(", ")
            ),
            None => format!(
                "the request's cost is larger than the capacity (burst) of policy {}: it can never be \
                 allowed",
                violated.join(", ")
            ),
        };
        serde_json::to_vec(&Problem {
            kind: QUOTA_EXCEEDED_TYPE,
            title: "Too Many Requests",
            status: 429,
            detail,
            violated_policies: violated.to_vec(),
        })
        .unwrap()
    }

    #[test]
    fn problem_body_is_what_serde_json_writes() {
        for names in [
            &["default"][..],
            &["burst", "daily"],
            &["we\"ird\\", "ctl\u{1}"],
        ] {
            for retry in [Some(1), Some(86_400), Some(u64::MAX), None] {
                let fast = problem_json(names.iter().copied(), retry);
                assert_eq!(
                    String::from_utf8_lossy(&fast),
                    String::from_utf8_lossy(&serde_body(names, retry))
                );
            }
        }
    }

    #[test]
    fn numbers_small_and_large() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            1023,
            1024,
            86_400,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            assert_eq!(number(n), n.to_string().as_str());
        }
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
