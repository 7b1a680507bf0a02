//! [`Answer`]: a response the layer writes itself, and [`Refusal`]: where a request goes
//! when the layer refuses it, which also gives the answer its form (HTTP, or a gRPC
//! trailers-only response).

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::response::Parts;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::key::KeyError;
use crate::report::{Rejection, Unavailable, Unkeyed, trailers_only};

/// A response the layer writes itself (a 429, a 503 when the store fails closed, or a key
/// error), in HTTP form until [`Refusal::answer`] gives it the form the request reads.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status and header fields (default version, no extensions): the response's head
    /// as it is, so the response is put together without a head to replace.
    pub(crate) head: Parts,
    pub(crate) body: Bytes,
    /// For a 429 to a gRPC call: the layer's policy names and the index of the one the
    /// headers report, to name it in the gRPC answer (`None` for an HTTP answer).
    pub(crate) policy: Option<(Arc<[Box<str>]>, usize)>,
}

impl Answer {
    /// A plain-text answer.
    fn text(status: StatusCode, body: Bytes) -> Self {
        let (mut head, ()) = Response::new(()).into_parts();
        head.status = status;
        head.headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Self {
            head,
            body,
            policy: None,
        }
    }

    /// The answer to a request the layer could not key: `rejection`'s
    /// [`Rejection::unkeyed`], else the problem+json of [`Unkeyed::response`] (`400` for a
    /// missing key, `500` for a misconfiguration, with an error log line).
    #[cold]
    pub(crate) fn key_error(err: &KeyError, rejection: Option<&dyn Rejection>) -> Self {
        if err.status().is_server_error() {
            tracing::error!(error = %err, "rate limiter cannot key the request");
        } else {
            tracing::debug!(error = %err, "request has no rate-limit key");
        }
        let unkeyed = Unkeyed::new(err);
        let res = match rejection {
            Some(rejection) => rejection.unkeyed(&unkeyed),
            None => unkeyed.response(),
        };
        let (mut head, body) = res.into_parts();
        head.version = http::Version::default();
        head.extensions.clear();
        Self {
            head,
            body,
            policy: None,
        }
    }

    /// The `503 Service Unavailable` of a store that could not decide and fails closed,
    /// rendered when the layer was built.
    pub(crate) fn unavailable(unavailable: &Unavailable) -> Self {
        let (status, headers, body) = unavailable.parts();
        let (mut head, ()) = Response::new(()).into_parts();
        head.status = status;
        head.headers = headers;
        Self {
            head,
            body,
            policy: None,
        }
    }

    /// What a response future answers when polled after it completed.
    pub(crate) fn polled_after_completion() -> Self {
        Self::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(b"response future polled after completion\n"),
        )
    }
}

/// Where a request goes when the layer refuses it, decided once in `call` from the layer's
/// settings and the request's version and `content-type`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Refusal {
    /// A denial goes to the [`Fallback`](super::Fallback) behind the rate limit instead of
    /// getting a 429 (the inner service's type says so,
    /// [`Inner::FALLBACK`](super::Inner::FALLBACK)). Other answers (a 503, a key error) stay
    /// answers.
    pub(crate) fallback: bool,
    /// The request is a gRPC call to a layer that serves gRPC: answers are trailers-only
    /// responses carrying the request's `content-type` (see [`trailers_only`]).
    pub(crate) grpc: bool,
}

impl Refusal {
    /// `answer` in the form the request (whose header fields are `request`) reads:
    /// unchanged, or for a gRPC call a trailers-only response with the matching gRPC status
    /// and the request's `content-type`. Every answer of the layer goes through here, once.
    // Always inlined: an HTTP answer (every refusal but a gRPC call's) is handed on where it
    // is, not moved into and out of a call (`#[inline]` alone left it out of line in `call`:
    // one more copy of the answer, about 40 instructions per refusal).
    #[inline(always)]
    pub(crate) fn answer(self, mut answer: Answer, request: &HeaderMap) -> Answer {
        if self.grpc {
            grpc_form(&mut answer, request);
        }
        answer
    }
}

/// The trailers-only gRPC form of `answer` for a gRPC call whose header fields are
/// `request` (unchanged when the call carries no `content-type`).
#[cold]
#[inline(never)]
fn grpc_form(answer: &mut Answer, request: &HeaderMap) {
    let Some(content_type) = request.get(CONTENT_TYPE).cloned() else {
        return;
    };
    let policy = answer
        .policy
        .as_ref()
        .and_then(|(names, i)| names.get(*i))
        .map(|n| &**n);
    let (status, body) = trailers_only(
        answer.head.status,
        &mut answer.head.headers,
        &answer.body,
        policy,
        content_type,
    );
    answer.head.status = status;
    answer.body = body;
}
