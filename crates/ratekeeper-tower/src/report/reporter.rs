//! [`Reporter`]: renders decisions into headers and 429 responses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, RETRY_AFTER};
use http::response::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, Version};
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Key, Policy};

use super::headers::{advertised_quota, join_items, number};
use super::template::{Recent429, template_429};
use super::{
    HeaderStyle, Limited, PartitionKey, ProblemJson, ProblemParts, Rejection, ResetFormat,
};

/// Renders decisions into headers and 429 responses. Built once per layer; per request only
/// the header values (and the 429 body) are allocated.
#[derive(Clone)]
pub(crate) struct Reporter {
    pub(crate) names: Arc<[Box<str>]>,
    /// Per policy: the advertised quota, `X-RateLimit-Limit` and the IETF `q`
    /// ([`advertised_quota`]); remaining is never shown above it.
    pub(super) limits: Arc<[u32]>,
    /// Per policy: the problem+json body parts of a 429 it alone denies.
    pub(super) problems: Arc<[ProblemParts]>,
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
    /// Per policy: `"name";q=..;w=..` (and `;qu=..`), without `pk`.
    pub(super) policy_items: Vec<String>,
    /// The `RateLimit-Policy` value without `pk`.
    pub(super) policy_value: Option<HeaderValue>,
    /// No window: concurrency limits have no reset time, so reset / `t` are left out.
    pub(super) windowless: bool,
    pub(crate) partition_key: Option<PartitionKey>,
    pub(crate) rejection: Option<Arc<dyn Rejection>>,
    /// The head (status and header fields) of the default 429 in the `X-RateLimit` style,
    /// the fields in order, with placeholder numbers (see [`Reporter::limited`]); `None` if
    /// the map does not keep them in that order.
    pub(super) template_429: Option<Parts>,
    /// The last usual 429, while 429s repeat it.
    pub(super) recent_429: Recent429,
    /// The layer serves gRPC: a gRPC call's refusal is a trailers-only gRPC answer (see
    /// [`grpc_content_type`](super::grpc_content_type)).
    pub(crate) grpc: bool,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("names", &self.names)
            .field("style", &self.style)
            .field("reset", &self.reset)
            .field("partition_key", &self.partition_key)
            .field("custom_rejection", &self.rejection.is_some())
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    pub(crate) fn new(policies: &[Policy], style: HeaderStyle, reset: ResetFormat) -> Self {
        let advertised: Vec<(u32, u64)> = policies.iter().map(advertised_quota).collect();
        let items = policies
            .iter()
            .zip(&advertised)
            .map(|(p, (q, w))| format!("\"{}\";q={q};w={w}", p.name()))
            .collect();
        Self::from_items(
            policies.iter().map(|p| p.name().into()).collect(),
            advertised.iter().map(|&(q, _)| q).collect(),
            items,
            style,
            reset,
            false,
        )
    }

    /// A reporter for a concurrency limit: `q` is the number of concurrent requests, with
    /// `qu="concurrent-requests"` and no window.
    pub(crate) fn concurrency(name: &str, max: u32, style: HeaderStyle) -> Self {
        let item = format!("\"{name}\";q={max};qu=\"concurrent-requests\"");
        Self::from_items(
            Arc::from([Box::<str>::from(name)]),
            Arc::from([max]),
            vec![item],
            style,
            ResetFormat::DeltaSeconds,
            true,
        )
    }

    fn from_items(
        names: Arc<[Box<str>]>,
        limits: Arc<[u32]>,
        policy_items: Vec<String>,
        style: HeaderStyle,
        reset: ResetFormat,
        windowless: bool,
    ) -> Self {
        // Names are checked by `Policy::validate` (`[A-Za-z0-9_.-]`), so they are valid
        // sf-strings and header values.
        let policy_value =
            HeaderValue::try_from(join_items(policy_items.iter().map(|s| &**s), None)).ok();
        Self {
            problems: names.iter().map(|n| ProblemParts::new(n)).collect(),
            names,
            limits,
            style,
            reset,
            policy_items,
            policy_value,
            windowless,
            partition_key: None,
            rejection: None,
            template_429: template_429(),
            recent_429: Recent429::default(),
            grpc: false,
        }
    }

    /// The `content-type` to answer a refusal of this request with in gRPC, when the layer
    /// serves gRPC and the request is a gRPC call; `None` for an HTTP answer.
    #[inline]
    pub(crate) fn grpc_call(
        &self,
        version: http::Version,
        headers: &HeaderMap,
    ) -> Option<HeaderValue> {
        if !self.grpc {
            return None;
        }
        super::grpc_content_type(version, headers)
    }

    /// The `pk` parameter for `key`, when partition keys are on and an IETF style is used.
    #[inline]
    pub(crate) fn pk(&self, key: &Key) -> Option<Arc<str>> {
        match self.style {
            HeaderStyle::Ietf | HeaderStyle::Both => {
                self.partition_key.as_ref().map(|p| p.param(key).into())
            }
            _ => None,
        }
    }

    /// The 429 for a denial: the rejection's response, then the rate-limit headers,
    /// `Retry-After` (unless the cost can never fit), `Cache-Control: no-store` and
    /// `Content-Length`.
    pub(crate) fn limited(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let (head, body) = self.limited_response(decisions, policies, pk, unix_now);
        (head.status, head.headers, body)
    }

    /// [`Reporter::limited`] as a response head and body, ready to become the response
    /// (`Response::from_parts`). The head has the default version and no extensions.
    #[inline]
    pub(crate) fn limited_response(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
    ) -> (Parts, Bytes) {
        let limited = Limited::new(decisions, &self.names, policies, &self.problems);
        if let Some((template, retry_after, d, shown)) = self.template_fits(&limited) {
            return self.limited_from_template(template, &limited, retry_after, d, shown, unix_now);
        }
        self.limited_general(&limited, decisions, policies, pk, unix_now)
    }

    /// [`Reporter::limited_response`] for every 429 but the usual one: the rejection's
    /// response with the layer's fields.
    #[inline(never)]
    fn limited_general(
        &self,
        limited: &Limited<'_>,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
    ) -> (Parts, Bytes) {
        let res = match &self.rejection {
            Some(rejection) => rejection.reject(limited),
            None => ProblemJson.reject(limited),
        };
        let (mut head, body) = res.into_parts();
        // What the layer answered with before: the rejection's status and fields.
        head.version = Version::default();
        head.extensions.clear();
        let headers = &mut head.headers;
        // The rejection's own rate-limit fields are replaced, not merged with.
        self.write_headers(decisions, policies, pk, unix_now, headers, false);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match limited.retry_after_secs() {
            Some(secs) => {
                headers.insert(RETRY_AFTER, number(secs));
            }
            None => {
                headers.remove(RETRY_AFTER);
            }
        }
        // The body is complete: its length is known here (and the usual 429 sends it too).
        headers.insert(CONTENT_LENGTH, number(body.len() as u64));
        (head, body)
    }
}
