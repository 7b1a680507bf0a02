//! [`ResponseFuture`] and [`ConcurrencyBody`] of [`ConcurrencyLimit`](super::ConcurrencyLimit):
//! the held future of [`held`](super::held) (the inner service's response, whose body holds
//! the request's slot, or an answer the layer wrote), after the round trip of a shared store
//! when the slots live in one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use ratekeeper_core::store::slots::AcquireFuture;
use tower_service::Service;

use super::held::{HeldBody, HeldFuture};
use super::limit::{Admitted, Decide, Decided};
use super::permit::Permit;
use super::upgrade::Held;

pin_project! {
    /// Response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        kind: Kind<F, S, Req>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, S, Req> {
        // The inner service answers (or the layer did).
        Held {
            #[pin]
            inner: HeldFuture<F, Admitted>,
        },
        // A shared store is deciding; the ready inner service and the request wait here.
        Acquiring {
            acquire: AcquireFuture,
            pending: Option<(S, Req, Arc<dyn Decide>)>,
        },
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(crate) fn held(inner: HeldFuture<F, Admitted>) -> Self {
        Self {
            kind: Kind::Held { inner },
        }
    }

    /// Waits for a shared store's answer, then calls `inner` (the ready service) with `req`,
    /// or answers.
    pub(crate) fn acquiring(
        acquire: AcquireFuture,
        inner: S,
        req: Req,
        decide: Arc<dyn Decide>,
    ) -> Self {
        Self {
            kind: Kind::Acquiring {
                acquire,
                pending: Some((inner, req, decide)),
            },
        }
    }
}

impl<F, S, Req> fmt::Debug for ResponseFuture<F, S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB, E> Future for ResponseFuture<S::Future, S, Request<ReqB>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>, Error = E>,
{
    type Output = Result<Response<ConcurrencyBody<ResB>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.kind.project() {
                KindProj::Held { inner } => {
                    let res = ready!(inner.poll(cx))?;
                    return Poll::Ready(Ok(res.map(|inner| ConcurrencyBody { inner })));
                }
                KindProj::Acquiring { acquire, pending } => {
                    let answer = ready!(acquire.as_mut().poll(cx));
                    match pending.take() {
                        Some((mut inner, mut req, decide)) => {
                            match decide.decide(answer, req.version(), req.headers()) {
                                Decided::Slot {
                                    permit,
                                    reporter,
                                    decisions,
                                } => {
                                    let slot = Held::for_request(permit, &mut req);
                                    let admitted = Admitted::Counted {
                                        slot,
                                        reporter,
                                        decisions,
                                    };
                                    HeldFuture::called(inner.call(req), admitted)
                                }
                                Decided::Refused(status, headers, body) => {
                                    HeldFuture::answered(status, headers, body)
                                }
                                Decided::Pass => HeldFuture::passed(inner.call(req)),
                            }
                        }
                        None => HeldFuture::answered(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            HeaderMap::new(),
                            Bytes::from_static(b"response future polled after completion\n"),
                        ),
                    }
                }
            };
            self.set(Self::held(next));
        }
    }
}

pin_project! {
    /// The response body of a [`ConcurrencyLimit`](super::ConcurrencyLimit): holds the
    /// request's slot (or its place under an adaptive limit) until the body ends (last
    /// frame, error) or is dropped.
    pub struct ConcurrencyBody<B> {
        #[pin]
        inner: HeldBody<B, Permit>,
    }
}

impl<B> fmt::Debug for ConcurrencyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("holds_permit", &self.inner.holds_permit())
            .finish_non_exhaustive()
    }
}

impl<B> Body for ConcurrencyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
