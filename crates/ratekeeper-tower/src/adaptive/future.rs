use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use ratekeeper_core::clock::Clock;

use super::limiter::Permit;
use crate::body::ResponseBody;
use crate::key::KeyError;
use crate::report::trailers_only;

pin_project! {
    /// Response future of [`AdaptiveConcurrency`](super::AdaptiveConcurrency).
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
            permit: Option<Permit>,
            clock: Arc<dyn Clock>,
        },
        Answered {
            answer: Option<(StatusCode, HeaderMap, Bytes)>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F, permit: Permit, clock: Arc<dyn Clock>) -> Self {
        Self {
            kind: Kind::Called {
                future,
                permit: Some(permit),
                clock,
            },
        }
    }

    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            kind: Kind::Answered {
                answer: Some((status, headers, body)),
            },
        }
    }

    /// The answer to a request without a key (a gRPC call, `grpc` being its
    /// `content-type`, gets a trailers-only response).
    pub(crate) fn key_error(err: &KeyError, grpc: Option<HeaderValue>) -> Self {
        let status = err.status();
        if status.is_server_error() {
            tracing::error!(error = %err, "adaptive concurrency limiter cannot key the request");
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
    type Output = Result<Response<AdaptiveBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                permit,
                clock,
            } => {
                // An error drops the permit with this future, without a latency sample: a
                // failure says nothing about how long a success takes.
                let res = ready!(future.poll(cx));
                let permit = permit.take();
                let res = res?;
                if let Some(p) = &permit {
                    p.sample(clock.now());
                }
                let (parts, body) = res.into_parts();
                let body = AdaptiveBody {
                    inner: ResponseBody::inner(body),
                    permit,
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
                let mut res = Response::new(AdaptiveBody {
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
    /// The response body of an [`AdaptiveConcurrency`](super::AdaptiveConcurrency): holds
    /// the request's place in flight until the body ends (last frame, error) or is dropped.
    pub struct AdaptiveBody<B> {
        #[pin]
        inner: ResponseBody<B>,
        permit: Option<Permit>,
    }
}

impl<B> std::fmt::Debug for AdaptiveBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveBody")
            .field("in_flight", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Body for AdaptiveBody<B>
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
