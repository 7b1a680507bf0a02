//! The prebuilt header fields of the usual 429.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::response::Parts;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ratekeeper_core::Decision;
use ratekeeper_core::ceil_secs;

use super::headers::{Shown, number};
use super::{HeaderStyle, Limited, Reporter};
use crate::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};

impl Reporter {
    /// Whether this 429 is the usual one (default rejection, `X-RateLimit` style, a retry
    /// time, a window), which [`Reporter::limited_from_template`] writes: its `Retry-After`
    /// seconds, the deciding decision and what the headers show for it.
    #[inline]
    pub(super) fn template_fits<'l>(
        &self,
        limited: &Limited<'l>,
    ) -> Option<(&Parts, u64, &'l Decision, Shown)> {
        if self.style != HeaderStyle::XRateLimit || self.windowless || self.rejection.is_some() {
            return None;
        }
        let template = self.template_429.as_ref()?;
        let policies = limited.policy_indices();
        let (retry_after, d, shown) = match limited.decisions().as_slice() {
            // One decision (the usual layer): it decides, and its retry time is the 429's
            // (`Limited::retry_after_secs` of one decision, without the general search).
            [d] => {
                let retry_after = ceil_secs(d.retry_after()?).max(1);
                (retry_after, d, self.shown(policies.first().copied(), d))
            }
            _ => {
                let retry_after = limited.retry_after_secs()?;
                let (d, shown) = self.deciding(limited.decisions(), policies)?;
                (retry_after, d, shown)
            }
        };
        Some((template, retry_after, d, shown))
    }

    /// The usual 429: a clone of [`template_429`] with its five numbers written in place
    /// (or of the last one, when its numbers repeat).
    /// Same fields and order as the general path, without hashing a header name per request:
    /// the clone copies the name index as it is (one `memcpy`), and the numbers are written
    /// by position.
    #[inline]
    pub(super) fn limited_from_template(
        &self,
        template: &Parts,
        limited: &Limited<'_>,
        retry_after: u64,
        d: &Decision,
        shown: Shown,
        unix_now: impl FnOnce() -> Duration,
    ) -> (Parts, Bytes) {
        let reset = self.reset_value(d, unix_now);
        // One decision: the numbers and the policy determine the whole answer.
        let numbers = (limited.decisions().len() == 1).then(|| Numbers {
            policy: limited.policy_indices().first().copied(),
            limit: shown.limit,
            remaining: shown.remaining,
            reset,
            retry_after,
        });
        let render =
            || self.render_from_template(template, limited, retry_after, shown, reset, numbers);
        match numbers {
            Some(numbers) => self.recent_429.kept_or(numbers, render),
            None => render(),
        }
    }

    /// [`Reporter::limited_from_template`] when no kept answer has its numbers: the body
    /// rendered and the numbers written into a clone of the template.
    #[inline(never)]
    fn render_from_template(
        &self,
        template: &Parts,
        limited: &Limited<'_>,
        retry_after: u64,
        shown: Shown,
        reset: u64,
        numbers: Option<Numbers>,
    ) -> (Parts, Bytes) {
        let body = limited.problem_json_after(Some(retry_after));
        let mut head = template.clone();
        // The template's fields in order (`template_429`): content type, limit, remaining,
        // reset, cache control, retry after, content length. Written by position: no name is
        // compared, and the constant ones are left as they are.
        let mut values = head.headers.values_mut();
        let _content_type = values.next();
        for n in [u64::from(shown.limit), u64::from(shown.remaining), reset] {
            if let Some(value) = values.next() {
                *value = number(n);
            }
        }
        let _cache_control = values.next();
        for n in [retry_after, body.len() as u64] {
            if let Some(value) = values.next() {
                *value = number(n);
            }
        }
        if let Some(numbers) = numbers {
            self.recent_429.offer(numbers, &head, &body);
        }
        (head, body)
    }
}

/// What varies between two usual 429s of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Numbers {
    policy: Option<usize>,
    limit: u32,
    remaining: u32,
    reset: u64,
    retry_after: u64,
}

/// The last usual 429, kept while 429s repeat it: a client that keeps knocking gets the
/// same numbers for a second at a time, and a clone of the finished answer spares writing
/// five numbers by position and rendering the body (about 300 instructions per 429).
///
/// An answer is kept only when the same numbers come twice in a row, so 429s that keep
/// changing (many keys, each at its own point of its window) never pay for a copy they do
/// not use. Never waits: when another 429 holds it, each renders its own.
#[derive(Debug, Default)]
pub(super) struct Recent429 {
    last: Mutex<Last>,
}

#[derive(Debug, Default)]
struct Last {
    /// The numbers of the last usual 429.
    numbers: Option<Numbers>,
    /// Its answer, once the same numbers came twice.
    answer: Option<(Parts, Bytes)>,
}

impl Clone for Recent429 {
    /// A fresh, empty one: a clone may be configured differently.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Recent429 {
    /// Whether an answer is kept (for tests).
    #[cfg(test)]
    pub(super) fn holds_an_answer(&self) -> bool {
        self.last.lock().is_ok_and(|last| last.answer.is_some())
    }

    /// A copy of the kept answer for `numbers`, or (none kept for them, or another 429
    /// holds it) the one `render` makes. The copy is made where the answer is returned to,
    /// not moved there.
    #[inline]
    fn kept_or(&self, numbers: Numbers, render: impl FnOnce() -> (Parts, Bytes)) -> (Parts, Bytes) {
        if let Ok(last) = self.last.try_lock() {
            if let Last {
                numbers: Some(kept),
                answer: Some((head, body)),
            } = &*last
            {
                if *kept == numbers {
                    return (head.clone(), body.clone());
                }
            }
        }
        render()
    }

    /// Records the answer just rendered for `numbers`; keeps a copy when the previous one
    /// had the same numbers.
    fn offer(&self, numbers: Numbers, head: &Parts, body: &Bytes) {
        let Ok(mut last) = self.last.try_lock() else {
            return;
        };
        if last.numbers == Some(numbers) {
            last.answer = Some((head.clone(), body.clone()));
        } else {
            *last = Last {
                numbers: Some(numbers),
                answer: None,
            };
        }
    }
}

/// The head of a default 429 in the `X-RateLimit` style: its status, and its fields in the
/// order the general path writes them, with placeholder numbers. [`Reporter::limited_from_template`] writes its
/// numbers by position, so this checks, once, that the map iterates in insertion order (it
/// does for distinct names; `http` does not promise it): `None` otherwise, and every 429
/// takes the general path.
///
/// The last field, `Content-Length`, is the body's length: sent by the layer, it spares
/// axum's `Router::layer` its own insert (which would outgrow a clone's field list, cut to
/// its length, and copy it), and hyper writes the field as it finds it.
pub(super) fn template_429() -> Option<Parts> {
    let names = [
        CONTENT_TYPE,
        X_RATELIMIT_LIMIT.clone(),
        X_RATELIMIT_REMAINING.clone(),
        X_RATELIMIT_RESET.clone(),
        CACHE_CONTROL,
        RETRY_AFTER,
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
    let mut headers = HeaderMap::with_capacity(names.len());
    for (name, value) in names.iter().zip(values) {
        headers.insert(name.clone(), value);
    }
    if !headers.keys().eq(names.iter()) {
        return None;
    }
    let (mut head, ()) = Response::new(()).into_parts();
    head.status = StatusCode::TOO_MANY_REQUESTS;
    head.headers = headers;
    Some(head)
}
