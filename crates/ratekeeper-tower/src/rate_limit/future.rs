//! The response future: a state machine over a request the layer holds. It makes no decision
//! itself: every store answer goes to [`Limiter::verdict`](super::limiter::Limiter::verdict)
//! (through [`Erased`]), and the verdict picks the next state.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use ratekeeper_core::store::{Checked, Decisions, StoreError};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::limiter::{Answer, Erased, FAILED, NO_RESPONSE, Reported, Verdict, store_failed};
use crate::body::ResponseBody;
use crate::policy::Applied;

/// A request the layer still holds: waiting for an async store, or for capacity in
/// [`Mode::Delay`](super::Mode::Delay).
pub(crate) struct Pending<S, Req, SF> {
    pub(crate) inner: S,
    pub(crate) req: Req,
    pub(crate) applied: Applied,
    pub(crate) pk: Option<Arc<str>>,
    pub(crate) limiter: Arc<dyn Erased<SF>>,
    /// Set at the first Delay-mode denial: the request is rejected after it.
    pub(crate) deadline: Option<Instant>,
    /// The inner service is a [`Fallback`](crate::fallback::Fallback): route denials to it.
    pub(crate) degrade: bool,
}

/// A [`Mode::Delay`](super::Mode::Delay) reservation: charged, waiting for its turn.
/// Dropping it before it proceeds (client gone, timeout) gives back what its charges still
/// hold, by their receipts.
struct Reservation<S, Req, SF> {
    /// `None` once the request proceeded.
    pending: Option<(Pending<S, Req, SF>, Decisions)>,
}

impl<S, Req, SF> Drop for Reservation<S, Req, SF> {
    fn drop(&mut self) {
        if let Some((pending, decisions)) = self.pending.take() {
            pending.limiter.release(&pending.applied, &decisions);
        }
    }
}

/// The report of a request the inner service answers, settled exactly once: by the
/// response's status, or, when there is none, on drop: as a 500 when the inner service failed
/// ([`FAILED`]), as a 499 when the future was dropped before the answer ([`NO_RESPONSE`]: the
/// client went away). A charge whose settle rule would give it back for that status is
/// refunded, so a cancelled request does not spend a failed-login budget.
pub(crate) struct Settlement<SF> {
    limiter: Arc<dyn Erased<SF>>,
    reported: Reported,
    /// The status to settle with on drop; `None` once settled.
    unsettled: Option<u16>,
}

impl<SF> Settlement<SF> {
    fn new(limiter: Arc<dyn Erased<SF>>, reported: Reported) -> Self {
        Self {
            limiter,
            reported,
            unsettled: Some(NO_RESPONSE),
        }
    }
}

impl<SF> Drop for Settlement<SF> {
    fn drop(&mut self) {
        if let Some(code) = self.unsettled.take() {
            let status =
                http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            self.limiter.settle_status(&self.reported, status);
        }
    }
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
        // The inner service answers; the limiter settles and adds headers (unless the request
        // was exempt or the store failed open).
        Called {
            #[pin]
            future: F,
            report: Option<Settlement<SF>>,
        },
        // The layer answers itself (429, 503, or a key error).
        Answered {
            answer: Option<Answer>,
        },
        // A store that needs I/O is deciding; the ready inner service waits here.
        Checking {
            #[pin]
            check: SF,
            pending: Option<Pending<S, Req, SF>>,
        },
        // Delay mode, reserved: charged, sleeping until its turn, then to the inner service
        // without a new check.
        Reserved {
            #[pin]
            sleep: Sleep,
            reservation: Reservation<S, Req, SF>,
        },
        // Delay mode, check-and-retry: holding nothing, sleeping until the store said the
        // request would pass, then reserving again.
        Waiting {
            #[pin]
            sleep: Sleep,
            pending: Option<Pending<S, Req, SF>>,
        },
    }
}

impl<F, S, Req, SF> ResponseFuture<F, S, Req, SF> {
    pub(crate) fn called(future: F, limiter: Arc<dyn Erased<SF>>, reported: Reported) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: Some(Settlement::new(limiter, reported)),
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

    pub(crate) fn checking(check: SF, pending: Pending<S, Req, SF>) -> Self {
        Self {
            kind: Kind::Checking {
                check,
                pending: Some(pending),
            },
        }
    }
}

impl<F, S, ReqB, SF> ResponseFuture<F, S, Request<ReqB>, SF>
where
    S: Service<Request<ReqB>, Future = F>,
{
    /// Continues a held request after the verdict on its decisions.
    pub(crate) fn after(
        pending: Pending<S, Request<ReqB>, SF>,
        verdict: Verdict,
        decisions: Decisions,
    ) -> Self {
        Self {
            kind: pending.next(verdict, decisions),
        }
    }
}

impl<S, ReqB, SF> Pending<S, Request<ReqB>, SF>
where
    S: Service<Request<ReqB>>,
{
    /// Asks the limiter for the verdict on a store's answer, then moves on.
    fn decide(
        mut self,
        result: Result<Decisions, StoreError>,
    ) -> Kind<S::Future, S, Request<ReqB>, SF> {
        match result {
            Ok(decisions) => {
                let verdict = self.limiter.verdict(
                    &self.applied,
                    self.pk.as_deref(),
                    &decisions,
                    &mut self.deadline,
                    self.degrade,
                    self.req.extensions_mut(),
                );
                self.next(verdict, decisions)
            }
            Err(err) => match store_failed(&err, self.req.extensions_mut()) {
                None => {
                    let Self { mut inner, req, .. } = self;
                    Kind::Called {
                        future: inner.call(req),
                        report: None,
                    }
                }
                Some(answer) => {
                    let grpc = self
                        .limiter
                        .grpc_call(self.req.version(), self.req.headers());
                    Kind::Answered {
                        answer: Some(answer.for_request(grpc)),
                    }
                }
            },
        }
    }

    /// The state a verdict on `decisions` leads to.
    fn next(self, verdict: Verdict, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        match verdict {
            Verdict::Pass => self.pass(decisions),
            Verdict::Answer(answer) => {
                let grpc = self
                    .limiter
                    .grpc_call(self.req.version(), self.req.headers());
                Kind::Answered {
                    answer: Some(answer.for_request(grpc)),
                }
            }
            Verdict::Wait => Kind::Reserved {
                sleep: tokio::time::sleep(decisions.delay()),
                reservation: Reservation {
                    pending: Some((self, decisions)),
                },
            },
            Verdict::Retry(wait) => Kind::Waiting {
                sleep: tokio::time::sleep(wait),
                pending: Some(self),
            },
        }
    }

    fn pass(self, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        let Self {
            mut inner,
            req,
            applied,
            pk,
            limiter,
            ..
        } = self;
        Kind::Called {
            future: inner.call(req),
            report: Some(Settlement::new(
                limiter,
                Reported {
                    decisions,
                    applied,
                    pk,
                },
            )),
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
            let next = match this.kind.as_mut().project() {
                KindProj::Called { future, report } => {
                    let res = match ready!(future.poll(cx)) {
                        Ok(res) => res,
                        Err(err) => {
                            // No status to settle by: the charge is settled as a 500.
                            if let Some(settlement) = report.as_mut() {
                                settlement.unsettled = Some(FAILED);
                            }
                            *report = None;
                            return Poll::Ready(Err(err));
                        }
                    };
                    let (mut parts, body) = res.into_parts();
                    // Read in place and dropped in place: taking the report out would copy
                    // it (decisions and charges, some 300 bytes) per response.
                    let mut meter = None;
                    if let Some(settlement) = report.as_mut() {
                        if settlement.limiter.respond(&settlement.reported, &mut parts) {
                            meter = Arc::clone(&settlement.limiter)
                                .meter(&mut settlement.reported, &parts);
                        }
                        settlement.unsettled = None;
                    }
                    *report = None;
                    let body = match meter {
                        None => ResponseBody::inner(body),
                        Some(meter) => ResponseBody::metered(body, meter),
                    };
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                KindProj::Answered { answer } => {
                    let answer = answer
                        .take()
                        .unwrap_or_else(Answer::polled_after_completion);
                    let mut res = Response::new(ResponseBody::full(answer.body));
                    *res.status_mut() = answer.status;
                    *res.headers_mut() = answer.headers;
                    return Poll::Ready(Ok(res));
                }
                KindProj::Checking { check, pending } => {
                    let result = ready!(check.poll(cx));
                    match pending.take() {
                        Some(pending) => pending.decide(result),
                        None => Kind::Answered { answer: None },
                    }
                }
                KindProj::Reserved { sleep, reservation } => {
                    ready!(sleep.poll(cx));
                    match reservation.pending.take() {
                        Some((pending, decisions)) => pending.pass(decisions),
                        None => Kind::Answered { answer: None },
                    }
                }
                KindProj::Waiting { sleep, pending } => {
                    ready!(sleep.poll(cx));
                    match pending.take() {
                        Some(pending) => {
                            let left = pending.deadline.map_or(Duration::ZERO, |d| {
                                d.saturating_duration_since(Instant::now())
                            });
                            match pending.limiter.recheck(&pending.applied, left) {
                                Checked::Ready(result) => pending.decide(result),
                                Checked::Pending(check) => Kind::Checking {
                                    check,
                                    pending: Some(pending),
                                },
                            }
                        }
                        None => Kind::Answered { answer: None },
                    }
                }
            };
            this.kind.set(next);
        }
    }
}
