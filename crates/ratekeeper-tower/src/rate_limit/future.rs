//! The response future, and the one function that turns a store's answer into what happens
//! to a request. That function, [`dispatch`], asks the limiter for the verdict
//! ([`Erased::verdict`]) and picks the next state, for both ways a store answers: inside
//! `call` (the memory store: the service and the limiter are borrowed, nothing is cloned or
//! built unless the request must wait) and in the response future (an async store, a
//! Delay-mode wait: the future owns them). It is generic over how the service and the
//! limiter are held ([`Ready`], [`Share`]). The future itself only moves between states.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use ratekeeper_core::store::{Checked, Decisions, StoreError};
use tokio::time::Sleep;

use super::answer::{Answer, Refusal};
use super::inner::Inner;
use super::limiter::{
    Erased, FAILED, NO_RESPONSE, Prepared, Respond, StoreFailed, Verdict, store_failed,
};
use super::ticket::Ticket;
use crate::body::ResponseBody;
use crate::usage::Metered;

/// The ready inner service of a request: borrowed from the service in `call`, or owned
/// by the response future.
pub(crate) trait Ready<S> {
    /// The service, to call it.
    fn service(&mut self) -> &mut S;
    /// The service, owned, to go with the request into the response future.
    fn into_owned(self) -> S;
}

impl<S: Clone> Ready<S> for &mut S {
    #[inline(always)]
    fn service(&mut self) -> &mut S {
        self
    }

    /// Takes the ready service and leaves a fresh clone in its place (see the tower-service
    /// docs, "Be careful when cloning inner services").
    fn into_owned(self) -> S {
        let clone = self.clone();
        std::mem::replace(self, clone)
    }
}

impl<S> Ready<S> for S {
    #[inline(always)]
    fn service(&mut self) -> &mut S {
        self
    }

    fn into_owned(self) -> S {
        self
    }
}

/// The limiter of a request: borrowed (its concrete type, so the verdict is inlined) in
/// `call`, or shared as a trait object by the response future.
pub(crate) trait Share<SF> {
    /// The limiter's type as this holder sees it.
    type Limiter: Erased<SF> + ?Sized;
    /// The limiter, to ask for a verdict.
    fn limiter(&self) -> &Self::Limiter;
    /// The limiter, shared, for the response future.
    fn share(self) -> Arc<dyn Erased<SF>>;
    /// The limiter, shared, for a settlement.
    fn responder(self) -> Arc<dyn Respond>;
}

impl<SF, L: Erased<SF> + 'static> Share<SF> for &Arc<L> {
    type Limiter = L;

    #[inline]
    fn limiter(&self) -> &L {
        self
    }

    fn share(self) -> Arc<dyn Erased<SF>> {
        Arc::clone(self) as _
    }

    #[inline]
    fn responder(self) -> Arc<dyn Respond> {
        Arc::clone(self) as _
    }
}

impl<SF> Share<SF> for Arc<dyn Erased<SF>> {
    type Limiter = dyn Erased<SF>;

    #[inline]
    fn limiter(&self) -> &Self::Limiter {
        &**self
    }

    fn share(self) -> Arc<dyn Erased<SF>> {
        self
    }

    #[inline]
    fn responder(self) -> Arc<dyn Respond> {
        Erased::responder(self)
    }
}

/// A request the response future holds, with its ticket, its ready inner service and its
/// limiter: waiting for an async store, or for capacity in
/// [`Mode::Delay`](super::Mode::Delay).
pub(crate) struct Pending<S, Req, SF> {
    inner: S,
    req: Req,
    ticket: Ticket,
    limiter: Arc<dyn Erased<SF>>,
}

/// The one dispatch: what happens to the request `req`, from its ticket to the state that
/// follows. `prepare` gives the request's ticket (or exempts or refuses it before the store),
/// `check` the store's answer on the ticket's charges (or its check, still deciding); `inner`
/// is the ready inner service (a [`Ready`]), `limiter` the limiter (a [`Share`]). The verdict
/// on the store's decisions is the limiter's ([`Erased::verdict`]), a store error goes to
/// [`store_failed`], and every answer gets its form from the ticket's [`Refusal`].
///
/// Called by `call` (the limiter prepares the ticket and asks the store; the memory store
/// answers at once, the service and the limiter stay borrowed, and nothing is held or cloned
/// unless the request must wait) and by the response future ([`Pending::next`]: the held
/// ticket, and the store's later answer). Always inlined, and the request comes in before
/// anything borrows it and the ticket is made inside: each then moves once, into the inner
/// service's call and into the settlement. A request and ticket passed in after a borrow were
/// copied once more each (about 60 instructions per request).
#[inline(always)]
pub(crate) fn dispatch<I, L, S, ReqB, SF, P, C>(
    mut inner: I,
    mut req: Request<ReqB>,
    limiter: L,
    prepare: P,
    check: C,
) -> ResponseFuture<S::Future, S, Request<ReqB>, SF>
where
    I: Ready<S>,
    L: Share<SF>,
    S: Inner<Request<ReqB>>,
    P: FnOnce(&Request<ReqB>) -> Prepared,
    C: FnOnce(&Ticket) -> Checked<SF>,
{
    let ticket = match prepare(&req) {
        Prepared::Charge(ticket) => ticket,
        Prepared::Exempt => return ResponseFuture::unchecked(inner.service().pass(req)),
        Prepared::Failed(answer, refusal) => {
            return ResponseFuture::refused(answer, refusal, req.headers());
        }
    };
    let decisions = match check(&ticket) {
        Checked::Ready(Ok(decisions)) => decisions,
        Checked::Ready(Err(err)) => {
            return match store_failed(&err, req.extensions_mut(), limiter.limiter().unavailable()) {
                StoreFailed::Degrade(degrade) if S::FALLBACK => {
                    ResponseFuture::unchecked(inner.service().degrade(req, degrade))
                }
                StoreFailed::Pass | StoreFailed::Degrade(_) => {
                    ResponseFuture::unchecked(inner.service().pass(req))
                }
                StoreFailed::Answer(answer) => {
                    ResponseFuture::refused(answer, ticket.refusal, req.headers())
                }
            };
        }
        Checked::Pending(check) => {
            return ResponseFuture::checking(check, hold(inner, req, ticket, limiter));
        }
    };
    match limiter
        .limiter()
        .verdict(&ticket, &decisions, req.extensions_mut())
    {
        // `S::FALLBACK` is a constant: without a fallback this arm is compiled away (the
        // limiter never gives this verdict then).
        Verdict::Degrade if S::FALLBACK => ResponseFuture::called(
            inner
                .service()
                .degrade(req, limiter.limiter().degrade(&ticket, &decisions)),
            Settlement::new(limiter.responder(), ticket, decisions),
        ),
        Verdict::Pass | Verdict::Degrade => ResponseFuture::called(
            inner.service().pass(req),
            Settlement::new(limiter.responder(), ticket, decisions),
        ),
        Verdict::Answer(answer) => ResponseFuture::refused(answer, ticket.refusal, req.headers()),
        Verdict::Wait => ResponseFuture::reserved(decisions, hold(inner, req, ticket, limiter)),
        Verdict::Retry { wait, deadline } => {
            let ticket = Ticket {
                deadline: Some(deadline),
                ..ticket
            };
            ResponseFuture::waiting(wait, hold(inner, req, ticket, limiter))
        }
    }
}

impl<S, ReqB, SF> Pending<S, Request<ReqB>, SF>
where
    S: Inner<Request<ReqB>>,
{
    /// The [`dispatch`] for the held request, on the store's answer (or its check, still
    /// deciding).
    fn next(self, checked: Checked<SF>) -> ResponseFuture<S::Future, S, Request<ReqB>, SF> {
        let Self {
            inner,
            req,
            ticket,
            limiter,
        } = self;
        dispatch(
            inner,
            req,
            limiter,
            move |_| Prepared::Charge(ticket),
            move |_| checked,
        )
    }

    /// After a check-and-retry wait: checks the held request's charges again (for what is
    /// left until its deadline), then the [`dispatch`].
    fn recheck(self) -> ResponseFuture<S::Future, S, Request<ReqB>, SF> {
        let checked = self.limiter.recheck(&self.ticket);
        self.next(checked)
    }

    /// Calls the inner service after a Delay-mode reservation's wait; the ticket and
    /// `decisions` settle after its response.
    fn pass(self, decisions: Decisions) -> ResponseFuture<S::Future, S, Request<ReqB>, SF> {
        let Self {
            mut inner,
            req,
            ticket,
            limiter,
        } = self;
        ResponseFuture::called(
            inner.pass(req),
            Settlement::new(Share::responder(limiter), ticket, decisions),
        )
    }
}

/// The request, its ticket, the ready inner service and the limiter, owned, for the response
/// future.
pub(crate) fn hold<I, Req, L, S, SF>(
    inner: I,
    req: Req,
    ticket: Ticket,
    limiter: L,
) -> Pending<S, Req, SF>
where
    I: Ready<S>,
    L: Share<SF>,
{
    Pending {
        inner: inner.into_owned(),
        req,
        ticket,
        limiter: limiter.share(),
    }
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
            pending.limiter.release(&pending.ticket, &decisions);
        }
    }
}

/// A request the inner service answers, settled exactly once: by the response's status, or,
/// when there is none, on drop: as a 500 when the inner service failed ([`FAILED`]), as a 499
/// when the future was dropped before the answer ([`NO_RESPONSE`]: the client went away). A
/// charge whose settle rule would give it back for that status is refunded, so a cancelled
/// request does not spend a failed-login budget.
///
/// It owns the request's ticket and decisions and has no type parameter, so it can move on
/// with the response.
pub(crate) struct Settlement {
    pub(crate) limiter: Arc<dyn Respond>,
    pub(crate) ticket: Ticket,
    pub(crate) decisions: Decisions,
    /// The status to settle with on drop; `None` once settled.
    pub(crate) unsettled: Option<u16>,
}

impl Settlement {
    /// A passed request's settlement, settled as [`NO_RESPONSE`] unless a response comes.
    #[inline(always)]
    fn new(limiter: Arc<dyn Respond>, ticket: Ticket, decisions: Decisions) -> Self {
        Self {
            limiter,
            ticket,
            decisions,
            unsettled: Some(NO_RESPONSE),
        }
    }

    /// Settles by the response's status and adds the rate-limit headers to it; returns what
    /// the response body carries when a charge is settled from it (see [`crate::usage`]).
    #[inline]
    fn respond(&mut self, parts: &mut http::response::Parts) -> Option<Box<Metered>> {
        let metered = self.limiter.respond(&self.ticket, &self.decisions, parts);
        self.unsettled = None;
        if !metered {
            return None;
        }
        Arc::clone(&self.limiter).meter(&mut self.ticket, &self.decisions, parts)
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        if let Some(code) = self.unsettled.take() {
            let status =
                http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            self.limiter.settle(&self.ticket, &self.decisions, status);
        }
    }
}

pin_project! {
    /// Response future of [`RateLimit`](crate::RateLimit).
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
            report: Option<Settlement>,
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
    /// Straight to the inner service, without headers or settlement (exempt, or the store
    /// failed open).
    pub(crate) fn unchecked(future: F) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: None,
            },
        }
    }

    /// The layer answers: `answer` in the form `refusal` gives it for a request with the
    /// header fields `request` (the only place an answer gets its form).
    pub(crate) fn refused(answer: Answer, refusal: Refusal, request: &HeaderMap) -> Self {
        Self {
            kind: Kind::Answered {
                answer: Some(refusal.answer(answer, request)),
            },
        }
    }

    /// The inner service answers; `settlement` settles after its response.
    pub(crate) fn called(future: F, settlement: Settlement) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: Some(settlement),
            },
        }
    }

    /// Delay mode, reserved: sleep [`Decisions::delay`], then call the inner service.
    pub(crate) fn reserved(decisions: Decisions, pending: Pending<S, Req, SF>) -> Self {
        Self {
            kind: Kind::Reserved {
                sleep: tokio::time::sleep(decisions.delay()),
                reservation: Reservation {
                    pending: Some((pending, decisions)),
                },
            },
        }
    }

    /// Delay mode, check-and-retry: sleep `wait`, then reserve again.
    pub(crate) fn waiting(wait: Duration, pending: Pending<S, Req, SF>) -> Self {
        Self {
            kind: Kind::Waiting {
                sleep: tokio::time::sleep(wait),
                pending: Some(pending),
            },
        }
    }

    /// An async store is deciding on the held request.
    pub(crate) fn checking(check: SF, pending: Pending<S, Req, SF>) -> Self {
        Self {
            kind: Kind::Checking {
                check,
                pending: Some(pending),
            },
        }
    }

    /// What a state answers when polled again after it handed its request on.
    fn completed() -> Self {
        Self {
            kind: Kind::Answered { answer: None },
        }
    }
}

impl<F, S, ReqB, SF, ResB, E> Future for ResponseFuture<F, S, Request<ReqB>, SF>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    S: Inner<Request<ReqB>, Response = Response<ResB>, Error = E, Future = F>,
    SF: Future<Output = Result<Decisions, StoreError>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.kind.project() {
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
                    // Read in place and dropped in place: taking the settlement out would
                    // copy it (ticket and decisions, some 300 bytes) per response.
                    let meter = report.as_mut().and_then(|s| s.respond(&mut parts));
                    *report = None;
                    let body = match meter {
                        None => ResponseBody::inner(body),
                        Some(meter) => ResponseBody::metered(body, meter),
                    };
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                KindProj::Answered { answer } => {
                    let Answer { head, body, .. } = answer
                        .take()
                        .unwrap_or_else(Answer::polled_after_completion);
                    let res = Response::from_parts(head, ResponseBody::full(body));
                    return Poll::Ready(Ok(res));
                }
                KindProj::Checking { check, pending } => {
                    let result = ready!(check.poll(cx));
                    match pending.take() {
                        Some(pending) => pending.next(Checked::Ready(result)),
                        None => Self::completed(),
                    }
                }
                KindProj::Reserved { sleep, reservation } => {
                    ready!(sleep.poll(cx));
                    match reservation.pending.take() {
                        Some((pending, decisions)) => pending.pass(decisions),
                        None => Self::completed(),
                    }
                }
                KindProj::Waiting { sleep, pending } => {
                    ready!(sleep.poll(cx));
                    match pending.take() {
                        Some(pending) => pending.recheck(),
                        None => Self::completed(),
                    }
                }
            };
            self.set(next);
        }
    }
}
