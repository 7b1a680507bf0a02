use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use ratekeeper_core::store::Decisions;

use super::layer::Permit;
use super::service::unix_now;
use super::upgrade::Held;
use crate::body::ResponseBody;
use crate::key::KeyError;
use crate::report::{Reporter, trailers_only};

pin_project! {
    /// Response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            future: F,
            permit: Option<Held>,
            reporter: Arc<Reporter>,
            decisions: Decisions,
        },
        Answered {
            answer: Option<(StatusCode, HeaderMap, Bytes)>,
        },
        // Passed without a slot (a shared store failed open): no headers, nothing held.
        Passed {
            #[pin]
            future: F,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(
        future: F,
        permit: Held,
        reporter: Arc<Reporter>,
        decisions: Decisions,
    ) -> Self {
        Self {
            kind: Kind::Called {
                future,
                permit: Some(permit),
                reporter,
                decisions,
            },
        }
    }

    /// The inner service's response, passed through without a slot or headers.
    pub(crate) fn passed(future: F) -> Self {
        Self {
            kind: Kind::Passed { future },
        }
    }

    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            kind: Kind::Answered {
                answer: Some((status, headers, body)),
            },
        }
    }

    /// The answer to a request without a key (a gRPC request gets a trailers-only response).
    /// `grpc`: from [`Reporter::grpc_call`].
    pub(crate) fn key_error(err: &KeyError, grpc: Option<HeaderValue>) -> Self {
        let status = err.status();
        if status.is_server_error() {
            tracing::error!(error = %err, "concurrency limiter cannot key the request");
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let body = Bytes::from(format!("{err}\n"));
        if let Some(content_type) = grpc {
            let (status, body) = trailers_only(status, &mut headers, &body, None, content_type);
            return Self::answered(status, headers, body);
        }
        Self::answered(status, headers, body)
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ConcurrencyBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                permit,
                reporter,
                decisions,
            } => {
                // An error drops the permit with this future.
                let res = ready!(future.poll(cx))?;
                let (mut parts, body) = res.into_parts();
                reporter.headers(decisions, &[0], None, unix_now, &mut parts.headers);
                let body = ConcurrencyBody {
                    inner: ResponseBody::inner(body),
                    permit: permit.take().and_then(Held::into_permit),
                };
                Poll::Ready(Ok(Response::from_parts(parts, body)))
            }
            KindProj::Passed { future } => {
                let res = ready!(future.poll(cx))?;
                let (parts, body) = res.into_parts();
                let body = ConcurrencyBody {
                    inner: ResponseBody::inner(body),
                    permit: None,
                };
                Poll::Ready(Ok(Response::from_parts(parts, body)))
            }
            KindProj::Answered { answer } => {
                let (status, headers, body) = answer.take().unwrap_or_else(|| {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        HeaderMap::new(),
                        Bytes::from_static(b"response future polled after completion\n"),
                    )
                });
                let mut res = Response::new(ConcurrencyBody {
                    inner: ResponseBody::full(body),
                    permit: None,
                });
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                Poll::Ready(Ok(res))
            }
        }
    }
}

pin_project! {
    /// The response body of a [`ConcurrencyLimit`](super::ConcurrencyLimit): holds the
    /// request's slot until the body ends (last frame, error) or is dropped.
    pub struct ConcurrencyBody<B> {
        #[pin]
        inner: ResponseBody<B>,
        permit: Option<Permit>,
    }
}

impl<B> std::fmt::Debug for ConcurrencyBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("holds_slot", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Body for ConcurrencyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        crate::body::poll_holding(this.inner, this.permit, cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
