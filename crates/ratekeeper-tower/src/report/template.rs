//! The prebuilt header fields of the usual 429.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use ratekeeper_core::Decision;

use super::headers::{Shown, number};
use super::{
    HeaderStyle, Limited, Reporter, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

impl Reporter {
    /// Whether this 429 is the usual one (default rejection, `X-RateLimit` style, a retry
    /// time, a window), which [`Reporter::limited_from_template`] writes: its `Retry-After`
    /// seconds, the deciding decision and what the headers show for it.
    pub(super) fn template_fits<'l>(
        &self,
        limited: &Limited<'l>,
    ) -> Option<(&HeaderMap, u64, &'l Decision, Shown)> {
        if self.style != HeaderStyle::XRateLimit || self.windowless || self.rejection.is_some() {
            return None;
        }
        let template = self.template_429.as_ref()?;
        let retry_after = limited.retry_after_secs()?;
        let (d, shown) = self.deciding(limited.decisions(), limited.policy_indices())?;
        Some((template, retry_after, d, shown))
    }

    /// The usual 429: a clone of [`template_429`] with its four numbers written in place.
    /// Same fields and order as the general path, without hashing a header name per request
    /// (about 1 000 fewer instructions per 429 with the layer around the router, measured
    /// with `scripts/callgrind_http.sh`).
    pub(super) fn limited_from_template(
        &self,
        template: &HeaderMap,
        limited: &Limited<'_>,
        retry_after: u64,
        d: &Decision,
        shown: Shown,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let reset = self.reset_value(d, unix_now);
        let mut headers = template.clone();
        // The template's fields in order (`template_429`): content type, limit, remaining,
        // reset, cache control, retry after. Written by position: no name is compared.
        let numbers = [
            None,
            Some(u64::from(shown.limit)),
            Some(u64::from(shown.remaining)),
            Some(reset),
            None,
            Some(retry_after),
        ];
        for ((_, value), n) in headers.iter_mut().zip(numbers) {
            if let Some(n) = n {
                *value = number(n);
            }
        }
        // The template's last field is a stand-in: removed, it leaves the clone room for the
        // `Content-Length` that axum's `Router::layer` adds (a clone's field list is cut to
        // its length, so that insert grew and copied it: some 300 instructions per 429,
        // against about 100 for the removal).
        headers.remove(CONTENT_LENGTH);
        (limited.status(), headers, limited.problem_json())
    }
}

/// The fields of a default 429 in the `X-RateLimit` style, in the order the general path
/// writes them, with placeholder numbers. [`Reporter::limited_from_template`] writes its
/// numbers by position, so this checks, once, that the map iterates in insertion order (it
/// does for distinct names; `http` does not promise it): `None` otherwise, and every 429
/// takes the general path.
pub(super) fn template_429() -> Option<HeaderMap> {
    let names = [
        CONTENT_TYPE,
        X_RATELIMIT_LIMIT.clone(),
        X_RATELIMIT_REMAINING.clone(),
        X_RATELIMIT_RESET.clone(),
        CACHE_CONTROL,
        RETRY_AFTER,
        // The stand-in [`Reporter::limited_from_template`] removes from each clone.
        CONTENT_LENGTH,
    ];
    let values = [
        HeaderValue::from_static("application/problem+json"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("no-store"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("0"),
    ];
    // Room beyond the fields: a clone keeps the index table's size, so the
    // `Content-Length` that axum's `Router::layer` adds to the 429 then fits without
    // rebuilding the table (some 500 instructions per 429, callgrind).
    let mut headers = HeaderMap::with_capacity(names.len() + 1);
    for (name, value) in names.iter().zip(values) {
        headers.insert(name.clone(), value);
    }
    headers.keys().eq(names.iter()).then_some(headers)
}
