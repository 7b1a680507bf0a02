use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use ratekeeper_core::store::{Decisions, FailureAction, StoreDegraded, StoreError};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::key::KeyError;
use crate::policy::Applied;

/// A response the layer writes itself.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    fn into_response<B>(self) -> Response<ResponseBody<B>> {
        let mut res = Response::new(ResponseBody::full(self.body));
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }
}

/// What the layer does when the store could not decide: the request goes on (marked with a
/// [`StoreDegraded`] extension for a fallback or handler to read), or a 503 answer
/// ([`FailureAction::Deny`]: fail closed is not a rate limit, so not a 429; case B18b).
pub(crate) fn on_store_error<B>(err: &StoreError, req: &mut Request<B>) -> Option<Answer> {
    let action = err.failure_action();
    match action {
        FailureAction::Deny => {
            tracing::warn!(error = %err, "rate-limit store failed; answering 503 (fail closed)");
            let mut headers = HeaderMap::new();
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            headers.insert(
                http::header::CACHE_CONTROL,
                HeaderValue::from_static("no-store"),
            );
            Some(Answer {
                status: StatusCode::SERVICE_UNAVAILABLE,
                headers,
                body: Bytes::from_static(b"rate limiter unavailable\n"),
            })
        }
        _ => {
            tracing::warn!(error = %err, %action, "rate-limit store failed; the request goes on without rate-limit headers");
            req.extensions_mut().insert(StoreDegraded { action });
            None
        }
    }
}

/// Renders decisions; implemented by the layer's shared state (type-erased so the future does
/// not carry the key, cost and store types).
pub(crate) trait Report: Send + Sync {
    fn headers(&self, decisions: &Decisions, applied: &Applied, headers: &mut HeaderMap);
    fn limited(&self, decisions: &Decisions, applied: &Applied) -> Answer;
    /// Refunds the charges a policy's settle rule gives back for this status.
    fn settle(&self, applied: &Applied, status: StatusCode);
}

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<F, S, Req, SF> {
        #[pin]
        kind: Kind<F, S, Req, SF>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, S, Req, SF> {
        // The request was allowed (or the store failed open): the inner service answers.
        Called {
            #[pin]
            future: F,
            report: Option<(Arc<dyn Report>, Decisions, Applied)>,
        },
        // The layer answers itself (429, or a key error).
        Answered {
            answer: Option<Answer>,
        },
        // A store that needs I/O is deciding; the ready inner service waits here.
        Checking {
            #[pin]
            check: SF,
            inner: Option<S>,
            req: Option<Req>,
            report: Arc<dyn Report>,
            applied: Applied,
        },
    }
}

impl<F, S, Req, SF> ResponseFuture<F, S, Req, SF> {
    pub(crate) fn called(
        future: F,
        report: Arc<dyn Report>,
        decisions: Decisions,
        applied: Applied,
    ) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: Some((report, decisions, applied)),
            },
        }
    }

    pub(crate) fn unchecked(future: F) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: None,
            },
        }
    }

    pub(crate) fn answered(answer: Answer) -> Self {
        Self {
            kind: Kind::Answered {
                answer: Some(answer),
            },
        }
    }

    pub(crate) fn key_error(err: &KeyError) -> Self {
        let status = err.status();
        let message = if status.is_server_error() {
            tracing::error!(error = %err, "rate limiter cannot key the request");
            "rate limiter misconfigured: no key for this request\n".to_owned()
        } else {
            tracing::debug!(error = %err, "request has no rate-limit key");
            format!("{err}\n")
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Self::answered(Answer {
            status,
            headers,
            body: Bytes::from(message),
        })
    }

    pub(crate) fn checking(
        check: SF,
        inner: S,
        req: Req,
        report: Arc<dyn Report>,
        applied: Applied,
    ) -> Self {
        Self {
            kind: Kind::Checking {
                check,
                inner: Some(inner),
                req: Some(req),
                report,
                applied,
            },
        }
    }
}

impl<F, S, ReqB, SF, ResB, E> Future for ResponseFuture<F, S, Request<ReqB>, SF>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    S: Service<Request<ReqB>, Response = Response<ResB>, Error = E, Future = F>,
    SF: Future<Output = Result<Decisions, StoreError>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.kind.as_mut().project() {
                KindProj::Called { future, report } => {
                    let res = ready!(future.poll(cx))?;
                    let (mut parts, body) = res.into_parts();
                    if let Some((report, decisions, applied)) = report.take() {
                        report.settle(&applied, parts.status);
                        report.headers(&decisions, &applied, &mut parts.headers);
                    }
                    return Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::inner(body))));
                }
                KindProj::Answered { answer } => {
                    let answer = answer.take().unwrap_or(Answer {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        headers: HeaderMap::new(),
                        body: Bytes::from_static(b"response future polled after completion\n"),
                    });
                    return Poll::Ready(Ok(answer.into_response()));
                }
                KindProj::Checking {
                    check,
                    inner,
                    req,
                    report,
                    applied,
                } => {
                    let result = ready!(check.poll(cx));
                    let (Some(mut inner), Some(req)) = (inner.take(), req.take()) else {
                        this.kind.set(Kind::Answered { answer: None });
                        continue;
                    };
                    let next = match result {
                        Ok(decisions) if decisions.is_allowed() => Kind::Called {
                            future: inner.call(req),
                            report: Some((Arc::clone(report), decisions, std::mem::take(applied))),
                        },
                        Ok(decisions) => Kind::Answered {
                            answer: Some(report.limited(&decisions, applied)),
                        },
                        Err(err) => {
                            let mut req = req;
                            match on_store_error(&err, &mut req) {
                                Some(answer) => Kind::Answered {
                                    answer: Some(answer),
                                },
                                None => Kind::Called {
                                    future: inner.call(req),
                                    report: None,
                                },
                            }
                        }
                    };
                    this.kind.set(next);
                }
            }
        }
    }
}
