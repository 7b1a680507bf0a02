//! The `503 Service Unavailable` a layer answers when its store cannot decide and the store's
//! failure policy fails closed: an RFC 9457 problem+json body of the
//! [`TEMPORARY_REDUCED_CAPACITY_TYPE`] with `Retry-After`, rendered once when the layer is
//! built (the request path only clones it).

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use ratekeeper_core::ceil_secs;

/// The problem type of a 503 (draft-ietf-httpapi-ratelimit-headers, IANA HTTP problem types):
/// the server can take less than usual for now.
pub const TEMPORARY_REDUCED_CAPACITY_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// The default `Retry-After` of a fail-closed 503: the Redis store's default circuit-breaker
/// open period (500 ms) rounded up to whole seconds. A client that waits this long comes back
/// after the breaker let a probe through, not while it still skips Redis.
pub(crate) const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A fail-closed 503, rendered: its header fields and body.
#[derive(Debug, Clone)]
pub(crate) struct Unavailable {
    headers: HeaderMap,
    body: Bytes,
}

impl Unavailable {
    /// The 503 of `what` (the limiter that cannot decide, in words: `"the rate limiter"`),
    /// telling clients to retry after `retry_after` rounded up to whole seconds, at least 1
    /// (RFC 9110 §10.2.3 has no fractions, and `0` would invite a retry at once).
    pub(crate) fn new(what: &str, retry_after: Duration) -> Self {
        let secs = ceil_secs(retry_after).max(1);
        let detail =
            format!("{what} cannot decide now (its store is unavailable); retry after {secs} s");
        // The problem details document: `type`, `title`, `status`, `detail`.
        let body = Bytes::from(super::json::problem(
            TEMPORARY_REDUCED_CAPACITY_TYPE,
            "Service Unavailable",
            StatusCode::SERVICE_UNAVAILABLE.as_u16(),
            &detail,
            None,
        ));
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        Self { headers, body }
    }

    /// The 503 of a rate limit ([`RateLimitLayer`](crate::RateLimitLayer)).
    pub(crate) fn rate_limit(retry_after: Duration) -> Self {
        Self::new("the rate limiter", retry_after)
    }

    /// The 503 of a keyed concurrency limit over shared slots
    /// ([`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)).
    pub(crate) fn concurrency(retry_after: Duration) -> Self {
        Self::new("the concurrency limiter", retry_after)
    }

    /// The status, header fields and body of the answer (a copy of the fields; the body is
    /// shared).
    pub(crate) fn parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            self.headers.clone(),
            self.body.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 503's body is problem+json of the temporary-reduced-capacity type, and its
    /// `Retry-After` the same whole seconds as the `detail`.
    #[test]
    fn unavailable_is_problem_json_with_retry_after() {
        let (status, headers, body) =
            Unavailable::new("the rate limiter", Duration::from_millis(2_500)).parts();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers[CONTENT_TYPE], "application/problem+json");
        assert_eq!(headers[CACHE_CONTROL], "no-store");
        assert_eq!(headers[RETRY_AFTER], "3");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], TEMPORARY_REDUCED_CAPACITY_TYPE);
        assert_eq!(v["title"], "Service Unavailable");
        assert_eq!(v["status"], 503);
        assert_eq!(
            v["detail"],
            "the rate limiter cannot decide now (its store is unavailable); retry after 3 s"
        );
    }

    /// A sub-second or zero wait is still `Retry-After: 1`, never `0`.
    #[test]
    fn unavailable_retry_after_is_at_least_one_second() {
        for wait in [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_secs(1),
        ] {
            let (_, headers, _) = Unavailable::new("the rate limiter", wait).parts();
            assert_eq!(headers[RETRY_AFTER], "1", "{wait:?}");
        }
        let (_, headers, _) = Unavailable::new("x", Duration::MAX).parts();
        assert_eq!(headers[RETRY_AFTER], u64::MAX.to_string().as_str());
    }
}
