use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::headers::RATELIMIT_DEGRADED;

pin_project! {
    /// Response future of [`Fallback`](super::Fallback).
    pub struct FallbackFuture<Fu, F, FFu, Req> {
        #[pin]
        kind: Kind<Fu, F, FFu, Req>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<Fu, F, FFu, Req> {
        Inner { #[pin] future: Fu },
        Readying { fallback: F, req: Option<Req>, policy: Arc<str> },
        Degraded { #[pin] future: FFu, policy: Arc<str> },
    }
}

impl<Fu, F, FFu, Req> FallbackFuture<Fu, F, FFu, Req> {
    pub(super) fn inner(future: Fu) -> Self {
        Self {
            kind: Kind::Inner { future },
        }
    }

    pub(super) fn degraded(fallback: F, req: Req, policy: Arc<str>) -> Self {
        Self {
            kind: Kind::Readying {
                fallback,
                req: Some(req),
                policy,
            },
        }
    }
}

impl<Fu, F, ReqB, ResB, E> Future for FallbackFuture<Fu, F, F::Future, Request<ReqB>>
where
    Fu: Future<Output = Result<Response<ResB>, E>>,
    F: Service<Request<ReqB>, Response = Response<ResB>, Error = E>,
{
    type Output = Result<Response<ResB>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.kind.as_mut().project() {
                KindProj::Inner { future } => return future.poll(cx),
                KindProj::Readying {
                    fallback,
                    req,
                    policy,
                } => {
                    ready!(fallback.poll_ready(cx))?;
                    let Some(req) = req.take() else {
                        // Unreachable: the request is taken once, and this state is left in
                        // the same poll.
                        tracing::error!("fallback future polled after its request was sent");
                        return Poll::Pending;
                    };
                    let next = Kind::Degraded {
                        future: fallback.call(req),
                        policy: Arc::clone(policy),
                    };
                    this.kind.set(next);
                }
                KindProj::Degraded { future, policy } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Ok(value) = HeaderValue::try_from(format!("\"{policy}\"")) {
                        res.headers_mut().insert(RATELIMIT_DEGRADED.clone(), value);
                    }
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}
