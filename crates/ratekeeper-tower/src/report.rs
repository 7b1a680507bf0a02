//! What clients see: rate-limit headers, `Retry-After`, and the 429 body.
//!
//! Header syntax follows `HEADERS.md` of the project:
//!
//! - `Retry-After` (RFC 9110 §10.2.3) as delay-seconds rounded **up**, at least 1, on every
//!   429 except "cost can never fit" (which has no honest retry time).
//! - [`HeaderStyle::XRateLimit`] (the default): `X-RateLimit-Limit` / `-Remaining` / `-Reset`,
//!   the de-facto headers. The policy closest to exhaustion is reported (the denying one on a
//!   429). Reset is delta-seconds rounded up ([`ResetFormat::DeltaSeconds`], the default) or
//!   Unix epoch seconds ([`ResetFormat::UnixEpoch`]).
//! - [`HeaderStyle::Ietf`]: `RateLimit-Policy` and `RateLimit` of
//!   draft-ietf-httpapi-ratelimit-headers-11, both Structured Field Lists (RFC 9651 §3.1) with
//!   one named item per policy: `"name";q=<quota>;w=<window s>` (the policy's advertised
//!   quota) and `"name";r=<remaining>;t=<reset s>`.
//!   With [`PartitionKey`] set, each item also carries `pk`, a Byte Sequence (RFC 9651 §3.3.5)
//!   holding a salted SHA-256 of the key, never the key itself.
//! - [`HeaderStyle::IetfLegacy`]: the three fields of drafts -00 to -03 (`RateLimit-Limit`,
//!   `RateLimit-Remaining`, `RateLimit-Reset` as delta seconds), for older clients.
//! - [`HeaderStyle::Both`] (X-RateLimit and IETF -11) and [`HeaderStyle::None`].
//! - 429 responses carry `Cache-Control: no-store` (RFC 6585 §4) and, by default
//!   ([`ProblemJson`]), an RFC 9457 `application/problem+json` body with the quota-exceeded type
//!   of the draft and `violated-policies`. A [`Rejection`] replaces the body; the layer still
//!   sets the rate-limit headers, `Retry-After` and `Cache-Control` on whatever it returns, each
//!   exactly once.
//!
//! Every header is written with `insert`, never `append`, so each appears once. A 429's
//! rate-limit fields replace whatever the [`Rejection`] set. On a response from the inner
//! service, which may already report a limit (an inner ratekeeper layer, say a per-route
//! `route_layer` inside a global `Router::layer`, or a handler passing on an upstream's
//! fields), the `X-RateLimit-*` and legacy `RateLimit-*` fields keep the earlier report when
//! it is complete (limit and remaining are numbers, reset a number or absent) and more
//! restrictive: fewer remaining, or as many and a later reset, compared in seconds whether
//! each side writes delta seconds or a Unix time. Otherwise this layer's three values replace
//! it. The IETF `RateLimit` / `RateLimit-Policy` fields append this layer's item to the policy
//! lists already there (every field line that starts with a quoted name), on one line.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::num::NonZeroU32;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use ratekeeper_core::{Policy, Quota};
//! use ratekeeper_tower::report::{HeaderStyle, Limited, PartitionKey};
//! use ratekeeper_tower::{GlobalKey, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("burst", Quota::per_second(NonZeroU32::new(1).unwrap())))
//!     .policy(Policy::new("daily", Quota::per_day(NonZeroU32::new(1000).unwrap())))
//!     .key(GlobalKey)
//!     .headers(HeaderStyle::Ietf)
//!     .partition_key(PartitionKey::salted("demo-salt"))
//!     .rejection(|limited: &Limited<'_>| {
//!         let mut res = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
//!         *res.status_mut() = limited.status();
//!         res
//!     })
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//!
//! let ok = svc.clone().oneshot(Request::new(String::new())).await?;
//! // SHA-256("demo-salt" 0x00 "global"), first 16 bytes, base64.
//! let pk = "pk=:pGNiczWVHyujjdM1jL6klw==:";
//! assert_eq!(
//!     ok.headers()["ratelimit-policy"],
//!     format!("\"burst\";q=1;w=1;{pk}, \"daily\";q=1000;w=86400;{pk}").as_str()
//! );
//! assert_eq!(ok.headers()["ratelimit"], format!("\"burst\";r=0;t=1;{pk}, \"daily\";r=999;t=87;{pk}").as_str());
//!
//! let limited = svc.clone().oneshot(Request::new(String::new())).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "1");
//! assert_eq!(limited.headers()["cache-control"], "no-store");
//! # Ok(())
//! # }
//! ```

use std::cell::LazyCell;
use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use ratekeeper_core::decision::ceil_secs;
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Key, Policy};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::rate_limit::Mode;

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11 §4): current state per policy.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11 §3): the policies.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit-Limit` (drafts -00 to -03; [`HeaderStyle::IetfLegacy`]).
pub static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (drafts -00 to -03; [`HeaderStyle::IetfLegacy`]).
pub static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (drafts -00 to -03, delta seconds; [`HeaderStyle::IetfLegacy`]).
pub static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `RateLimit-Degraded`: set on a response that a degraded-response fallback produced
/// instead of a 429 (see [`crate::rate_limit::Fallback`]). Its value is a Structured Field
/// String (RFC 9651 §3.3.3) naming the policy that limited the request, e.g.
/// `RateLimit-Degraded: "burst"`, or `"store-unavailable"` when the store could not decide.
/// This field is ratekeeper's own, not part of any standard.
pub static RATELIMIT_DEGRADED: HeaderName = HeaderName::from_static("ratelimit-degraded");

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
    /// `RateLimit-Policy` and `RateLimit` per draft-ietf-httpapi-ratelimit-headers-11: one
    /// named item per policy.
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (delta seconds) as in
    /// drafts -00 to -03, reporting the policy closest to exhaustion.
    IetfLegacy,
    /// [`HeaderStyle::XRateLimit`] and [`HeaderStyle::Ietf`] together.
    Both,
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
    /// Unix time in seconds at which the quota is fully available again, rounded up. Only
    /// `X-RateLimit-Reset` uses it; the IETF fields are always delta seconds.
    UnixEpoch,
}

/// Adds the `pk` (partition key) parameter to the IETF fields.
///
/// The value is the first 16 bytes of `SHA-256(salt || 0x00 || key)` (FIPS 180-4, via the
/// RustCrypto `sha2` crate), written as a Byte Sequence (RFC 9651 §3.3.5, base64 between
/// colons). The raw key (an IP address, an API key) never appears. Use a secret salt: an
/// unsalted hash of an IPv4 address can be reversed by trying all 2^32 addresses. Servers
/// that share a budget should share the salt so clients see one `pk`.
///
/// ```
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::report::PartitionKey;
///
/// let pk = PartitionKey::salted("s3cret");
/// let value = pk.param(&Key::from("198.51.100.7"));
/// assert!(value.starts_with(':') && value.ends_with(':'));
/// assert!(!value.contains("198.51"));
/// assert_eq!(value, pk.param(&Key::from("198.51.100.7")));
/// assert_ne!(value, pk.param(&Key::from("198.51.100.8")));
/// ```
#[derive(Clone)]
pub struct PartitionKey {
    salt: Arc<[u8]>,
}

impl PartitionKey {
    /// Hashes keys with `salt`.
    pub fn salted(salt: impl AsRef<[u8]>) -> Self {
        Self {
            salt: Arc::from(salt.as_ref()),
        }
    }

    /// The Structured Field Byte Sequence for `key`: `:<base64 of 16 bytes>:`.
    pub fn param(&self, key: &Key) -> String {
        let mut hasher = Sha256::new();
        hasher.update(&self.salt);
        hasher.update([0u8]);
        hasher.update(key.to_string().as_bytes());
        let digest = hasher.finalize();
        let mut out = String::with_capacity(26);
        out.push(':');
        base64::engine::general_purpose::STANDARD
            .encode_string(digest.get(..16).unwrap_or(&[]), &mut out);
        out.push(':');
        out
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionKey").finish_non_exhaustive()
    }
}

/// A denied request, as a [`Rejection`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Limited<'a> {
    decisions: &'a Decisions,
    names: &'a [Box<str>],
    /// The layer's policy index of each decision.
    policies: &'a [usize],
    /// Per policy index: the problem+json body around `Retry-After`, made at build time.
    problems: &'a [ProblemParts],
}

impl<'a> Limited<'a> {
    pub(crate) fn new(
        decisions: &'a Decisions,
        names: &'a [Box<str>],
        policies: &'a [usize],
        problems: &'a [ProblemParts],
    ) -> Self {
        Self {
            decisions,
            names,
            policies,
            problems,
        }
    }

    /// The layer's policy index of the only denying policy, if exactly one denied.
    fn single_violated(&self) -> Option<usize> {
        let mut denied = self
            .policies
            .iter()
            .zip(self.decisions.as_slice())
            .filter(|(_, d)| d.is_denied())
            .map(|(&i, _)| i);
        let first = denied.next()?;
        denied.next().is_none().then_some(first)
    }

    /// The status to answer with: always `429 Too Many Requests`, whatever the reason
    /// (it never depends on a message).
    pub const fn status(&self) -> StatusCode {
        StatusCode::TOO_MANY_REQUESTS
    }

    /// Every policy's decision, in policy order.
    pub fn decisions(&self) -> &'a Decisions {
        self.decisions
    }

    /// `(policy name, decision)` for every policy, in policy order.
    pub fn policies(&self) -> impl Iterator<Item = (&'a str, &'a Decision)> + 'a {
        let names = self.names;
        self.policies
            .iter()
            .map(move |&i| names.get(i).map_or("", |n| &**n))
            .zip(self.decisions.as_slice())
    }

    /// The names of the policies that denied the request.
    pub fn violated_policies(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.policies()
            .filter(|(_, d)| d.is_denied())
            .map(|(n, _)| n)
    }

    /// Whether the cost can never fit (then there is no `Retry-After`).
    pub fn is_cannot_fit(&self) -> bool {
        self.decisions.is_cannot_fit()
    }

    /// The `Retry-After` value in whole seconds (rounded up, at least 1), or `None` when the
    /// cost can never fit.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.decisions.retry_after().map(|d| ceil_secs(d).max(1))
    }

    /// The RFC 9457 problem details document of the default rejection.
    pub fn problem_json(&self) -> Bytes {
        let retry_secs = self.retry_after_secs();
        // The usual case, one policy denied with a retry time: its precomputed parts.
        if let Some(secs) = retry_secs {
            if let Some(parts) = self.single_violated().and_then(|i| self.problems.get(i)) {
                return parts.render(secs);
            }
        }
        let violated: SmallVec<[&str; 4]> = self.violated_policies().collect();
        problem_json(violated.iter().copied(), retry_secs)
    }
}

/// The problem+json body of a 429 denied by one policy, split around the `Retry-After`
/// seconds: built once per policy so that a 429 only writes the number (same bytes as
/// [`problem_json`]).
#[derive(Debug, Clone)]
pub(crate) struct ProblemParts {
    head: Box<[u8]>,
    tail: Box<[u8]>,
}

impl ProblemParts {
    fn new(name: &str) -> Self {
        let mut head = Vec::with_capacity(200);
        head.extend_from_slice(b"{\"type\":\"");
        head.extend_from_slice(QUOTA_EXCEEDED_TYPE.as_bytes());
        head.extend_from_slice(b"\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"");
        head.extend_from_slice(b"quota exceeded for policy ");
        push_json_str(&mut head, name);
        head.extend_from_slice(b"; retry after ");
        let mut tail = Vec::with_capacity(40);
        tail.extend_from_slice(b" s\",\"violated-policies\":[\"");
        push_json_str(&mut tail, name);
        tail.extend_from_slice(b"\"]}");
        Self {
            head: head.into_boxed_slice(),
            tail: tail.into_boxed_slice(),
        }
    }

    /// The body for `retry_secs`, in one allocation.
    fn render(&self, retry_secs: u64) -> Bytes {
        let mut buf = itoa::Buffer::new();
        let secs = buf.format(retry_secs).as_bytes();
        let mut out = Vec::with_capacity(self.head.len() + secs.len() + self.tail.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(secs);
        out.extend_from_slice(&self.tail);
        Bytes::from(out)
    }
}

/// Builds the response for a denied request (the 429), replacing the default
/// [`ProblemJson`]. Closures `Fn(&Limited<'_>) -> Response<Bytes>` are rejections.
///
/// The status is the one you return (use [`Limited::status`]); the layer then sets the
/// rate-limit headers, `Retry-After` and `Cache-Control: no-store` on the response, replacing
/// any you set, so none is lost and none appears twice.
pub trait Rejection: Send + Sync + 'static {
    /// The response for `limited`.
    fn reject(&self, limited: &Limited<'_>) -> Response<Bytes>;
}

impl<F> Rejection for F
where
    F: Fn(&Limited<'_>) -> Response<Bytes> + Send + Sync + 'static,
{
    fn reject(&self, limited: &Limited<'_>) -> Response<Bytes> {
        self(limited)
    }
}

/// The default rejection: `429` with an RFC 9457 `application/problem+json` body of type
/// [`QUOTA_EXCEEDED_TYPE`], `violated-policies` and a plain-words `detail`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl Rejection for ProblemJson {
    fn reject(&self, limited: &Limited<'_>) -> Response<Bytes> {
        let mut res = Response::new(limited.problem_json());
        *res.status_mut() = limited.status();
        // Room for the 6 headers of a 429 (this one, 3 rate-limit headers, `Retry-After`,
        // `Cache-Control`) without growing the map.
        *res.headers_mut() = HeaderMap::with_capacity(8);
        res.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}

/// Renders decisions into headers and 429 responses. Built once per layer; per request only
/// the header values (and the 429 body) are allocated.
#[derive(Clone)]
pub(crate) struct Reporter {
    pub(crate) names: Arc<[Box<str>]>,
    /// Per policy: the problem+json body parts of a 429 it alone denies.
    problems: Arc<[ProblemParts]>,
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
    /// Per policy: `"name";q=..;w=..` (and `;qu=..`), without `pk`.
    policy_items: Vec<String>,
    /// The `RateLimit-Policy` value without `pk`.
    policy_value: Option<HeaderValue>,
    /// No window: concurrency limits have no reset time, so reset / `t` are left out.
    windowless: bool,
    pub(crate) partition_key: Option<PartitionKey>,
    pub(crate) rejection: Option<Arc<dyn Rejection>>,
    pub(crate) mode: Mode,
    /// Insert an `Info` extension into allowed requests.
    pub(crate) request_info: bool,
    /// The header fields of the default 429 in the `X-RateLimit` style, in order, with
    /// placeholder numbers (see [`Reporter::limited`]); `None` if the map does not keep
    /// them in that order.
    template_429: Option<HeaderMap>,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("names", &self.names)
            .field("style", &self.style)
            .field("reset", &self.reset)
            .field("partition_key", &self.partition_key)
            .field("custom_rejection", &self.rejection.is_some())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Sets `name` to `value`. With `merge`, when the field already holds lists of policy items
/// (each line starting with a quoted name, as draft-ietf-httpapi-ratelimit-headers-11 §3 and
/// §4 define them; an inner ratekeeper layer writes these), the field becomes those lists,
/// every line of them, followed by `value` (RFC 9651 §3.1: a List may be split across field
/// lines, and joining with ", " is the same List), on a single field line. Lines that are not
/// policy lists are dropped.
fn insert_or_append(headers: &mut HeaderMap, name: &HeaderName, value: HeaderValue, merge: bool) {
    let joined = merge
        .then(|| {
            let mut v = Vec::new();
            for old in headers.get_all(name) {
                if old.as_bytes().starts_with(b"\"") {
                    v.extend_from_slice(old.as_bytes());
                    v.extend_from_slice(b", ");
                }
            }
            if v.is_empty() {
                return None;
            }
            v.extend_from_slice(value.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        })
        .flatten();
    headers.insert(name.clone(), joined.unwrap_or(value));
}

/// A reset value at or above this is a Unix time, below it a delta (1e9 s is 2001-09-09,
/// and 31 years: no window is that long). Lets a layer compare an inner layer's reset
/// whatever [`ResetFormat`] that one writes.
const EPOCH_RESET_FROM: u64 = 1_000_000_000;

/// This layer's reset for one policy: the value written, and the same as delta seconds.
#[derive(Clone, Copy)]
struct Reset {
    value: u64,
    delta: u64,
}

/// Writes one policy's limit, remaining and reset (`None`: no window, the field is removed)
/// under `names`, replacing what was there.
///
/// With `merge` (a response from the inner service: an inner ratekeeper layer, or a handler
/// passing on an upstream's headers, may have reported already), an earlier report that is
/// complete (limit and remaining numbers, reset a number or absent) and more restrictive
/// (fewer remaining, or as many and a later reset, compared as delta seconds; `now_secs`
/// gives the Unix time for an earlier reset written as one) is put back, so the client sees
/// the tighter of the two limits, as one consistent set.
fn single_policy(
    headers: &mut HeaderMap,
    names: [&HeaderName; 3],
    d: &Decision,
    reset: Option<Reset>,
    merge: bool,
    now_secs: impl FnOnce() -> u64,
) {
    let [limit_name, remaining_name, reset_name] = names;
    let old_limit = headers.insert(limit_name.clone(), number(d.limit().into()));
    let old_remaining = headers.insert(remaining_name.clone(), number(d.remaining().into()));
    let old_reset = match reset {
        Some(reset) => headers.insert(reset_name.clone(), number(reset.value)),
        None => headers.remove(reset_name),
    };
    if !merge {
        return;
    }
    let (Some(_), Some(prior)) = (
        old_limit.as_ref().and_then(parse_number),
        old_remaining.as_ref().and_then(parse_number),
    ) else {
        return;
    };
    let prior_reset = match old_reset.as_ref().map(parse_number) {
        None => 0,
        Some(None) => return,
        Some(Some(at)) if at >= EPOCH_RESET_FROM => at.saturating_sub(now_secs()),
        Some(Some(delta)) => delta,
    };
    let mine = u64::from(d.remaining());
    if prior < mine || (prior == mine && prior_reset > reset.map_or(0, |r| r.delta)) {
        let restore = [
            (limit_name, old_limit),
            (remaining_name, old_remaining),
            (reset_name, old_reset),
        ];
        for (name, old) in restore {
            match old {
                Some(value) => headers.insert(name.clone(), value),
                None => headers.remove(name),
            };
        }
    }
}

/// A header value holding a decimal number, as the single-policy styles write.
fn parse_number(value: &HeaderValue) -> Option<u64> {
    value.to_str().ok()?.trim().parse().ok()
}

fn join_items<'a>(items: impl Iterator<Item = &'a str>, pk: Option<&str>) -> String {
    let mut out = String::new();
    for item in items {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(item);
        if let Some(pk) = pk {
            out.push_str(";pk=");
            out.push_str(pk);
        }
    }
    out
}

impl Reporter {
    pub(crate) fn new(policies: &[Policy], style: HeaderStyle, reset: ResetFormat) -> Self {
        let items = policies
            .iter()
            .map(|p| {
                let (q, w) = p.advertised();
                // `w` must be a positive integer: sub-second windows round up to 1 s.
                let w = ceil_secs(w).max(1);
                format!("\"{}\";q={q};w={w}", p.name())
            })
            .collect();
        Self::from_items(
            policies.iter().map(|p| p.name().into()).collect(),
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
            vec![item],
            style,
            ResetFormat::DeltaSeconds,
            true,
        )
    }

    fn from_items(
        names: Arc<[Box<str>]>,
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
            style,
            reset,
            policy_items,
            policy_value,
            windowless,
            partition_key: None,
            rejection: None,
            mode: Mode::Reject,
            request_info: false,
            template_429: template_429(),
        }
    }

    /// Whether a request let through with `decisions` carries an [`Info`](crate::info::Info):
    /// when the layer asks for it, and always over the limit (shadow mode, fallback).
    pub(crate) fn wants_info(&self, decisions: &Decisions) -> bool {
        self.request_info || !decisions.is_allowed()
    }

    /// The `pk` parameter for `key`, when partition keys are on and an IETF style is used.
    pub(crate) fn pk(&self, key: &Key) -> Option<Arc<str>> {
        match self.style {
            HeaderStyle::Ietf | HeaderStyle::Both => {
                self.partition_key.as_ref().map(|p| p.param(key).into())
            }
            _ => None,
        }
    }

    fn reset_value(&self, d: &Decision, unix_now: impl FnOnce() -> Duration) -> u64 {
        match self.reset {
            ResetFormat::DeltaSeconds => ceil_secs(d.reset_after()),
            ResetFormat::UnixEpoch => ceil_secs(unix_now().saturating_add(d.reset_after())),
        }
    }

    /// Adds the rate-limit headers for `decisions`, so that each appears once.
    ///
    /// The response may already report a limit: nested layers (a global `Router::layer`
    /// around a per-route `route_layer`), or a handler passing on an upstream's headers. The
    /// single-policy styles then keep the more restrictive of the two (fewer remaining, then
    /// the later reset), read back from the values the inserts replace, so the common case
    /// (nothing there yet) costs nothing extra; the IETF lists get this layer's items
    /// appended (RFC 9651 §3.1).
    pub(crate) fn headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
        headers: &mut HeaderMap,
    ) {
        self.write_headers(decisions, policies, pk, unix_now, headers, true);
    }

    /// [`Reporter::headers`], merging with an earlier report only when `merge`.
    fn write_headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
        headers: &mut HeaderMap,
        merge: bool,
    ) {
        let Some(d) = decisions
            .deciding()
            .and_then(|i| decisions.as_slice().get(i))
        else {
            return;
        };
        let (x, ietf, legacy) = match self.style {
            HeaderStyle::XRateLimit => (true, false, false),
            HeaderStyle::Ietf => (false, true, false),
            HeaderStyle::IetfLegacy => (false, false, true),
            HeaderStyle::Both => (true, true, false),
            HeaderStyle::None => (false, false, false),
        };
        // Read at most once, and only for a Unix-time reset.
        let unix_now = LazyCell::new(unix_now);
        let delta = ceil_secs(d.reset_after());
        if x {
            let reset = (!self.windowless).then(|| Reset {
                value: self.reset_value(d, || *unix_now),
                delta,
            });
            single_policy(
                headers,
                [
                    &X_RATELIMIT_LIMIT,
                    &X_RATELIMIT_REMAINING,
                    &X_RATELIMIT_RESET,
                ],
                d,
                reset,
                merge,
                || unix_now.as_secs(),
            );
        }
        if legacy {
            let reset = (!self.windowless).then_some(Reset {
                value: delta,
                delta,
            });
            single_policy(
                headers,
                [&RATELIMIT_LIMIT, &RATELIMIT_REMAINING, &RATELIMIT_RESET],
                d,
                reset,
                merge,
                || unix_now.as_secs(),
            );
        }
        if ietf {
            self.ietf_headers(decisions, policies, pk, headers, merge);
        }
    }

    fn ietf_headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        headers: &mut HeaderMap,
        merge: bool,
    ) {
        // The policies this request was charged to (a resolver may pick a subset).
        let every_policy = policies.len() == self.policy_items.len()
            && policies.iter().enumerate().all(|(i, p)| i == *p);
        let policy = match pk {
            None if every_policy => self.policy_value.clone(),
            _ => HeaderValue::try_from(join_items(
                policies
                    .iter()
                    .filter_map(|&i| self.policy_items.get(i))
                    .map(|s| &**s),
                pk,
            ))
            .ok(),
        };
        if let Some(policy) = policy {
            insert_or_append(headers, &RATELIMIT_POLICY, policy, merge);
        }
        let mut state = String::new();
        let names = policies
            .iter()
            .map(|&i| self.names.get(i).map_or("", |n| &**n));
        for (name, d) in names.zip(decisions.as_slice()) {
            if !state.is_empty() {
                state.push_str(", ");
            }
            // Writing to a String cannot fail.
            let _ = write!(state, "\"{name}\";r={}", d.remaining());
            if !self.windowless {
                let _ = write!(state, ";t={}", ceil_secs(d.reset_after()));
            }
            if let Some(pk) = pk {
                state.push_str(";pk=");
                state.push_str(pk);
            }
        }
        if let Ok(value) = HeaderValue::try_from(state) {
            insert_or_append(headers, &RATELIMIT, value, merge);
        }
    }

    /// The 429 for a denial: the rejection's response, then the rate-limit headers,
    /// `Retry-After` (unless the cost can never fit) and `Cache-Control: no-store`.
    pub(crate) fn limited(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let limited = Limited::new(decisions, &self.names, policies, &self.problems);
        if let Some((template, retry_after, d)) = self.template_fits(&limited) {
            return self.limited_from_template(template, &limited, retry_after, d, unix_now);
        }
        let res = match &self.rejection {
            Some(rejection) => rejection.reject(&limited),
            None => ProblemJson.reject(&limited),
        };
        let (parts, body) = res.into_parts();
        let mut headers = parts.headers;
        // The rejection's own rate-limit fields are replaced, not merged with.
        self.write_headers(decisions, policies, pk, unix_now, &mut headers, false);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match limited.retry_after_secs() {
            Some(secs) => {
                headers.insert(RETRY_AFTER, number(secs));
            }
            None => {
                headers.remove(RETRY_AFTER);
            }
        }
        (parts.status, headers, body)
    }
}

impl Reporter {
    /// Whether this 429 is the usual one (default rejection, `X-RateLimit` style, a retry
    /// time, a window), which [`Reporter::limited_from_template`] writes: its `Retry-After`
    /// seconds and the deciding decision.
    fn template_fits<'l>(&self, limited: &Limited<'l>) -> Option<(&HeaderMap, u64, &'l Decision)> {
        if self.style != HeaderStyle::XRateLimit || self.windowless || self.rejection.is_some() {
            return None;
        }
        let template = self.template_429.as_ref()?;
        let retry_after = limited.retry_after_secs()?;
        let decisions = limited.decisions;
        let d = decisions
            .deciding()
            .and_then(|i| decisions.as_slice().get(i))?;
        Some((template, retry_after, d))
    }

    /// The usual 429: a clone of [`template_429`] with its four numbers written in place.
    /// Same fields and order as the general path, without hashing a header name per request
    /// (about 1 000 fewer instructions per 429 with the layer around the router, measured
    /// with `scripts/callgrind_http.sh`).
    fn limited_from_template(
        &self,
        template: &HeaderMap,
        limited: &Limited<'_>,
        retry_after: u64,
        d: &Decision,
        unix_now: impl FnOnce() -> Duration,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let reset = self.reset_value(d, unix_now);
        let mut headers = template.clone();
        // The template's fields in order (`template_429`): content type, limit, remaining,
        // reset, cache control, retry after. Written by position: no name is compared.
        let numbers = [
            None,
            Some(u64::from(d.limit())),
            Some(u64::from(d.remaining())),
            Some(reset),
            None,
            Some(retry_after),
        ];
        for ((_, value), n) in headers.iter_mut().zip(numbers) {
            if let Some(n) = n {
                *value = number(n);
            }
        }
        (limited.status(), headers, limited.problem_json())
    }
}

/// The fields of a default 429 in the `X-RateLimit` style, in the order the general path
/// writes them, with placeholder numbers. [`Reporter::limited_from_template`] writes its
/// numbers by position, so this checks, once, that the map iterates in insertion order (it
/// does for distinct names; `http` does not promise it): `None` otherwise, and every 429
/// takes the general path.
fn template_429() -> Option<HeaderMap> {
    let names = [
        CONTENT_TYPE,
        X_RATELIMIT_LIMIT.clone(),
        X_RATELIMIT_REMAINING.clone(),
        X_RATELIMIT_RESET.clone(),
        CACHE_CONTROL,
        RETRY_AFTER,
    ];
    let values = [
        HeaderValue::from_static("application/problem+json"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("0"),
        HeaderValue::from_static("no-store"),
        HeaderValue::from_static("0"),
    ];
    let mut headers = HeaderMap::with_capacity(names.len());
    for (name, value) in names.iter().zip(values) {
        headers.insert(name.clone(), value);
    }
    headers.keys().eq(names.iter()).then_some(headers)
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
            reporter().limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
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
    fn precomputed_problem_parts_are_what_serde_json_writes() {
        for name in ["default", "we\"ird\\", "ctl\u{1}"] {
            let parts = ProblemParts::new(name);
            for secs in [1, 600, 86_400, u64::MAX] {
                assert_eq!(
                    String::from_utf8_lossy(&parts.render(secs)),
                    String::from_utf8_lossy(&serde_body(&[name], Some(secs)))
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
        let (_, headers, body) =
            reporter().limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
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
            &[0],
            None,
            || Duration::from_millis(1_700_000_009_999),
            &mut h,
        );
        assert_eq!(h[&X_RATELIMIT_RESET], "1700000010");
    }

    #[test]
    fn ietf_lists_every_policy_once() {
        let mut r = Reporter::new(
            &[
                Policy::new("burst", Quota::per_minute(NonZeroU32::new(100).unwrap())),
                Policy::new("daily", Quota::per_day(NonZeroU32::new(1000).unwrap())),
            ],
            HeaderStyle::Both,
            ResetFormat::DeltaSeconds,
        );
        let ds = Decisions::new([
            Decision::new(Outcome::Allowed, 100, 42, Duration::from_millis(17_200)),
            Decision::new(Outcome::Allowed, 1000, 999, Duration::from_secs(87)),
        ]);
        let mut h = HeaderMap::new();
        h.insert(RATELIMIT.clone(), HeaderValue::from_static("stale"));
        r.headers(&ds, &[0, 1], None, || Duration::ZERO, &mut h);
        assert_eq!(
            h[&RATELIMIT_POLICY],
            "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400"
        );
        assert_eq!(h[&RATELIMIT], "\"burst\";r=42;t=18, \"daily\";r=999;t=87");
        assert_eq!(h.get_all(&RATELIMIT).iter().count(), 1);
        assert_eq!(h[&X_RATELIMIT_REMAINING], "42");

        r.style = HeaderStyle::IetfLegacy;
        let mut h = HeaderMap::new();
        r.headers(&ds, &[0, 1], None, || Duration::ZERO, &mut h);
        assert_eq!(h[&RATELIMIT_LIMIT], "100");
        assert_eq!(h[&RATELIMIT_REMAINING], "42");
        assert_eq!(h[&RATELIMIT_RESET], "18");
        assert!(h.get(&RATELIMIT).is_none());
    }

    #[test]
    fn custom_rejection_keeps_status_and_gets_headers_once() {
        let mut r = reporter();
        r.rejection = Some(Arc::new(|l: &Limited<'_>| {
            let mut res = Response::new(Bytes::from_static(b"{}"));
            *res.status_mut() = l.status();
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("0"));
            res.headers_mut()
                .append(X_RATELIMIT_LIMIT.clone(), HeaderValue::from_static("1000"));
            res
        }));
        let d = Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_millis(2_500),
            },
            10,
            0,
            Duration::from_secs(60),
        );
        let (status, headers, body) =
            r.limited(&Decisions::new([d]), &[0], None, || Duration::ZERO);
        assert_eq!(status, 429);
        assert_eq!(&body[..], b"{}");
        assert_eq!(headers[RETRY_AFTER], "3");
        assert_eq!(headers.get_all(&X_RATELIMIT_LIMIT).iter().count(), 1);
        assert_eq!(headers[&X_RATELIMIT_LIMIT], "10");
    }

    #[test]
    fn an_earlier_more_restrictive_report_is_kept() {
        let r = reporter();
        let report = |remaining: u32, reset_secs: u64, h: &mut HeaderMap| {
            let d = Decision::new(
                Outcome::Allowed,
                10,
                remaining,
                Duration::from_secs(reset_secs),
            );
            r.headers(&Decisions::new([d]), &[0], None, || Duration::ZERO, h);
        };
        let fields = |h: &HeaderMap| {
            [
                &X_RATELIMIT_LIMIT,
                &X_RATELIMIT_REMAINING,
                &X_RATELIMIT_RESET,
            ]
            .map(|n| {
                h.get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned()
            })
        };
        // (inner remaining, inner reset) then this layer's (5, 60): what the response says.
        for (inner, want) in [
            // Inner reported fewer remaining: it stays.
            ((2, 30), ["10", "2", "30"]),
            // Inner reported more remaining: this layer's state replaces it.
            ((7, 30), ["10", "5", "60"]),
            // As many remaining: the later reset wins, whichever layer wrote it.
            ((5, 90), ["10", "5", "90"]),
            ((5, 30), ["10", "5", "60"]),
        ] {
            let mut h = HeaderMap::new();
            report(inner.0, inner.1, &mut h);
            report(5, 60, &mut h);
            assert_eq!(fields(&h), want, "inner {inner:?}");
        }
        // A field that is not a number is replaced.
        let mut h = HeaderMap::new();
        h.insert(
            X_RATELIMIT_REMAINING.clone(),
            HeaderValue::from_static("lots"),
        );
        report(5, 60, &mut h);
        assert_eq!(fields(&h), ["10", "5", "60"]);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn the_429_template_writes_what_the_general_path_writes() {
        let fast = reporter();
        // The same default rejection, given explicitly, takes the general path.
        let mut general = reporter();
        general.rejection = Some(Arc::new(ProblemJson));
        let fields = |h: &HeaderMap| {
            h.iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect::<Vec<_>>()
        };
        for (remaining, retry_ms, reset_ms, epoch) in [
            (0, 2_500, 60_000, false),
            (0, 1, 1, false),
            (3, 90_000, 3_600_000, false),
            (0, 999_999_000, 86_400_000_000, true),
        ] {
            let d = Decision::new(
                Outcome::Denied {
                    retry_after: Duration::from_millis(retry_ms),
                },
                10,
                remaining,
                Duration::from_millis(reset_ms),
            );
            let ds = Decisions::new([d]);
            let mut fast = fast.clone();
            let mut general = general.clone();
            if epoch {
                fast.reset = ResetFormat::UnixEpoch;
                general.reset = ResetFormat::UnixEpoch;
            }
            let now = || Duration::from_secs(1_700_000_000);
            let a = fast.limited(&ds, &[0], None, now);
            let b = general.limited(&ds, &[0], None, now);
            assert!(
                fast.template_fits(&Limited::new(&ds, &fast.names, &[0], &fast.problems))
                    .is_some()
            );
            assert_eq!(a.0, b.0);
            assert_eq!(fields(&a.1), fields(&b.1));
            assert_eq!(a.2, b.2);
        }
        // Cannot fit (no Retry-After) takes the general path.
        let ds = Decisions::new([Decision::new(Outcome::CannotFit, 10, 10, Duration::ZERO)]);
        assert!(
            fast.template_fits(&Limited::new(&ds, &fast.names, &[0], &fast.problems))
                .is_none()
        );
    }
}
