//! RFC 9457 problem details for a 429, and the [`Rejection`] that builds the response.

use std::fmt;
use std::sync::Mutex;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ratekeeper_core::Decision;
use ratekeeper_core::ceil_secs;
use ratekeeper_core::store::Decisions;
use smallvec::SmallVec;

use super::QUOTA_EXCEEDED_TYPE;

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

    /// The layer's policy index of each decision.
    pub(super) fn policy_indices(&self) -> &'a [usize] {
        self.policies
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
    #[inline]
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.decisions.retry_after().map(|d| ceil_secs(d).max(1))
    }

    /// The RFC 9457 problem details document of the default rejection.
    pub fn problem_json(&self) -> Bytes {
        self.problem_json_after(self.retry_after_secs())
    }

    /// [`Limited::problem_json`] with its [`Limited::retry_after_secs`], when the caller has
    /// them already.
    pub(super) fn problem_json_after(&self, retry_secs: Option<u64>) -> Bytes {
        // The usual case, one policy denied with a retry time: its precomputed parts.
        if let Some(secs) = retry_secs {
            let parts = self.single_violated().and_then(|i| self.problems.get(i));
            if let Some(body) = parts.and_then(|p| p.render(secs)) {
                return body;
            }
        }
        let violated: SmallVec<[&str; 4]> = self.violated_policies().collect();
        problem_json(&violated, retry_secs)
    }
}

/// The RFC 9457 problem details document of a 429: `type`, `title`, `status`, `detail`,
/// `violated-policies`, in that order (written as serde_json would write it).
struct Problem<'a> {
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    violated_policies: &'a [&'a str],
}

impl<'a> Problem<'a> {
    fn new(detail: &'a str, violated_policies: &'a [&'a str]) -> Self {
        Self {
            kind: QUOTA_EXCEEDED_TYPE,
            title: "Too Many Requests",
            status: 429,
            detail,
            violated_policies,
        }
    }

    /// The JSON text.
    fn to_vec(&self) -> Vec<u8> {
        super::json::problem(
            self.kind,
            self.title,
            self.status,
            self.detail,
            Some(self.violated_policies),
        )
    }
}

/// The `detail` of a 429: the violated policies and the retry time in plain words.
fn detail(violated: &[&str], retry_secs: Option<impl fmt::Display>) -> String {
    let names = violated.join(", ");
    match retry_secs {
        Some(secs) => format!("quota exceeded for policy {names}; retry after {secs} s"),
        None => format!(
            "the request's cost is larger than the capacity (burst) of policy {names}: it can \
             never be allowed"
        ),
    }
}

/// The problem+json body of a 429 for `violated` policies and a retry time (`None`: the cost
/// can never fit).
pub(super) fn problem_json(violated: &[&str], retry_secs: Option<u64>) -> Bytes {
    Bytes::from(Problem::new(&detail(violated, retry_secs), violated).to_vec())
}

/// Stands for the `Retry-After` seconds in the `detail` while a [`ProblemParts`] is built:
/// JSON writes it as `\u0000`, which digits never are.
const RETRY_MARK: char = '\u{0}';

/// The serialized mark and what follows it: the end of the `detail` string and the next
/// member's name. An escaped policy name cannot contain this (every `"` inside a JSON string
/// is preceded by a backslash, here it follows `s`), so it is found exactly once, at the
/// retry time.
const RETRY_MARK_JSON: &[u8] = b"\\u0000 s\",\"violated-policies\":[";

/// The problem+json body of a 429 denied by one policy, split around the `Retry-After`
/// seconds: serialized once per policy when the layer is built, so that a
/// 429 only writes the number (same bytes as [`problem_json`]).
#[derive(Debug)]
pub(crate) struct ProblemParts {
    /// `None` if the mark was not found (never for the writer's output); the body is then
    /// serialized per request.
    parts: Option<HeadTail>,
    /// The last body rendered and its seconds. A client that keeps knocking gets 429s
    /// with the same `Retry-After` for a second at a time: sharing that body costs an atomic
    /// increment instead of an allocation and copies (about 300 instructions per 429).
    last: Mutex<Option<(u64, Bytes)>>,
}

impl Clone for ProblemParts {
    fn clone(&self) -> Self {
        Self {
            parts: self.parts.clone(),
            last: Mutex::new(None),
        }
    }
}

/// The bytes before and after the `Retry-After` seconds.
#[derive(Debug, Clone)]
struct HeadTail {
    head: Box<[u8]>,
    tail: Box<[u8]>,
}

impl ProblemParts {
    pub(super) fn new(name: &str) -> Self {
        let json = Problem::new(&detail(&[name], Some(RETRY_MARK)), &[name]).to_vec();
        let at = json
            .windows(RETRY_MARK_JSON.len())
            .position(|w| w == RETRY_MARK_JSON);
        let parts = at.and_then(|at| {
            let head = json.get(..at)?;
            // The tail starts after the mark itself, at ` s",...`.
            let tail = json.get(at + br"\u0000".len()..)?;
            Some(HeadTail {
                head: Box::from(head),
                tail: Box::from(tail),
            })
        });
        Self {
            parts,
            last: Mutex::new(None),
        }
    }

    /// The body for `retry_secs` (the last one rendered, when it had the same seconds);
    /// `None` when no parts were made.
    pub(super) fn render(&self, retry_secs: u64) -> Option<Bytes> {
        // Never waits: when another 429 holds the cache (or it is poisoned), render anew.
        let Ok(mut last) = self.last.try_lock() else {
            return self.render_new(retry_secs);
        };
        if let Some((secs, body)) = last.as_ref() {
            if *secs == retry_secs {
                return Some(body.clone());
            }
        }
        let body = self.render_new(retry_secs)?;
        *last = Some((retry_secs, body.clone()));
        Some(body)
    }

    /// The body for `retry_secs`, in one allocation.
    fn render_new(&self, retry_secs: u64) -> Option<Bytes> {
        let HeadTail { head, tail } = self.parts.as_ref()?;
        let mut buf = itoa::Buffer::new();
        let secs = buf.format(retry_secs).as_bytes();
        let mut out = Vec::with_capacity(head.len() + secs.len() + tail.len());
        out.extend_from_slice(head);
        out.extend_from_slice(secs);
        out.extend_from_slice(tail);
        Some(Bytes::from(out))
    }
}

/// Builds the response for a denied request (the 429), replacing the default
/// [`ProblemJson`]. Closures `Fn(&Limited<'_>) -> Response<Bytes>` are rejections.
///
/// The status is the one you return (use [`Limited::status`]); the layer then sets the
/// rate-limit headers, `Retry-After`, `Cache-Control: no-store` and `Content-Length` (the
/// length of your body) on the response, replacing any you set, so none is lost and none
/// appears twice.
///
/// The same value answers a request the layer could not key ([`Rejection::unkeyed`]): by
/// default the problem+json `400` of [`Unkeyed::response`](super::Unkeyed::response);
/// implement the method on your type to replace it as well.
pub trait Rejection: Send + Sync + 'static {
    /// The response for `limited`.
    fn reject(&self, limited: &Limited<'_>) -> Response<Bytes>;

    /// The response for a request no key extractor could key (see
    /// [`Unkeyed`](super::Unkeyed)). The default is [`Unkeyed::response`](super::Unkeyed::response);
    /// the layer sends the status, header fields and body you return (a gRPC call gets them
    /// as a trailers-only answer).
    fn unkeyed(&self, unkeyed: &super::Unkeyed<'_>) -> Response<Bytes> {
        unkeyed.response()
    }
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
        // Room for the 7 headers of a 429 (this one, 3 rate-limit headers, `Retry-After`,
        // `Cache-Control`, `Content-Length`) without growing the map.
        *res.headers_mut() = HeaderMap::with_capacity(8);
        res.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}
