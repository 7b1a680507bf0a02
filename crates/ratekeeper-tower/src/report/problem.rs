//! RFC 9457 problem details for a 429, and the [`Rejection`] that builds the response.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ratekeeper_core::Decision;
use ratekeeper_core::decision::ceil_secs;
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
    pub(super) fn new(name: &str) -> Self {
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
    pub(super) fn render(&self, retry_secs: u64) -> Bytes {
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

/// The RFC 9457 problem+json body of a 429, byte for byte what serde_json writes for
/// the `Problem` struct of this module's tests, in one allocation.
pub(super) fn problem_json<'a>(
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
