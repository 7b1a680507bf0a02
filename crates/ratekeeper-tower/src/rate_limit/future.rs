use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use ratekeeper_core::store::{Checked, Decisions, FailurePolicy, StoreDegraded, StoreError};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::fallback::Degrade;
use super::mode::{Limiter, Mode};
use crate::body::ResponseBody;
use crate::info::Info;
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
/// ([`FailurePolicy::Deny`]: fail closed is not a rate limit, so not a 429; case B18b).
pub(crate) fn on_store_error<B>(err: &StoreError, req: &mut Request<B>) -> Option<Answer> {
    // `Local` is answered inside the store; should it ever reach the layer, it fails open.
    let action = match err.failure_policy() {
        FailurePolicy::Local => FailurePolicy::Allow,
        other => other,
    };
    match action {
        FailurePolicy::Deny => {
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

/// What the headers of one response report: the decisions, the charges they came from (to
/// name the policies and settle after the response) and the hashed partition key.
#[derive(Debug)]
pub(crate) struct Reported {
    pub(crate) decisions: Decisions,
    pub(crate) applied: Applied,
    pub(crate) pk: Option<Arc<str>>,
}

impl Reported {
    /// The layer's policy index of each decision.
    pub(crate) fn policies(&self) -> smallvec::SmallVec<[usize; 2]> {
        self.applied.indices().collect()
    }
}

/// Renders decisions; implemented by the layer's shared state (type-erased so the future does
/// not carry the key, cost and store types).
pub(crate) trait Report: Send + Sync {
    fn headers(&self, reported: &Reported, headers: &mut HeaderMap);
    fn limited(&self, reported: &Reported) -> Answer;
    /// Refunds the charges a policy's settle rule gives back for this status.
    fn settle(&self, reported: &Reported, status: StatusCode);
}

/// A request the layer still holds: waiting for an async store, or for capacity in
/// [`Mode::Delay`], or being routed after a denial.
pub(crate) struct Pending<S, Req, SF> {
    pub(crate) inner: S,
    pub(crate) req: Req,
    pub(crate) applied: Applied,
    pub(crate) pk: Option<Arc<str>>,
    pub(crate) limiter: Arc<dyn Limiter<SF>>,
    /// Set when a [`Mode::Delay`] wait starts: the request is rejected after it.
    pub(crate) deadline: Option<Instant>,
    /// The inner service is a [`Fallback`](super::Fallback): route denials to it.
    pub(crate) degrade: bool,
}

/// A [`Mode::Delay`] reservation: charged, waiting for its turn. Dropping it before it
/// proceeds (client gone, timeout) refunds the charges (DESIGN §3: "a Delay-mode reservation
/// that is dropped is refunded").
pub(crate) struct Reservation<S, Req, SF> {
    /// `None` once the request proceeded (or was never reserved).
    pending: Option<(Pending<S, Req, SF>, Decisions)>,
}

impl<S, Req, SF> Reservation<S, Req, SF> {
    /// The request proceeds: the charges stay.
    fn proceed(&mut self) -> Option<(Pending<S, Req, SF>, Decisions)> {
        self.pending.take()
    }
}

impl<S, Req, SF> Drop for Reservation<S, Req, SF> {
    fn drop(&mut self) {
        if let Some((pending, decisions)) = self.pending.take() {
            pending.limiter.refund(&pending.applied, &decisions);
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
        // The request was allowed (or the store failed open): the inner service answers.
        Called {
            #[pin]
            future: F,
            report: Option<(Arc<dyn Report>, Reported)>,
        },
        // The layer answers itself (429, or a key error).
        Answered {
            answer: Option<Answer>,
        },
        // A store that needs I/O is deciding; the ready inner service waits here.
        Checking {
            #[pin]
            check: SF,
            pending: Option<Pending<S, Req, SF>>,
        },
        // Delay mode, reserved: the request is charged and sleeps until its turn, then goes
        // to the inner service without a new check. Dropped before then, it is refunded.
        Reserved {
            #[pin]
            sleep: Sleep,
            reservation: Reservation<S, Req, SF>,
        },
        // Delay mode, check-and-retry (a store or algorithm that cannot reserve): sleeping
        // until the store said the request would pass, then reserving again.
        Waiting {
            #[pin]
            sleep: Sleep,
            pending: Option<Pending<S, Req, SF>>,
        },
    }
}

impl<F, S, Req, SF> ResponseFuture<F, S, Req, SF> {
    pub(crate) fn called(future: F, report: Arc<dyn Report>, reported: Reported) -> Self {
        Self {
            kind: Kind::Called {
                future,
                report: Some((report, reported)),
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
    /// Continues with a store's answer for a request the layer holds.
    pub(crate) fn decided(
        pending: Pending<S, Request<ReqB>, SF>,
        result: Result<Decisions, StoreError>,
    ) -> Self {
        Self {
            kind: pending.decided(result),
        }
    }
}

impl<S, ReqB, SF> Pending<S, Request<ReqB>, SF>
where
    S: Service<Request<ReqB>>,
{
    fn decided(
        self,
        result: Result<Decisions, StoreError>,
    ) -> Kind<S::Future, S, Request<ReqB>, SF> {
        if let Ok(decisions) = &result {
            self.limiter.record(&self.applied, decisions);
        }
        match result {
            Ok(decisions) if decisions.is_allowed() && !decisions.delay().is_zero() => {
                self.reserved(decisions)
            }
            Ok(decisions) if decisions.is_allowed() => self.pass(decisions),
            Ok(decisions) => self.denied(decisions),
            Err(err) => {
                let Self {
                    mut inner, mut req, ..
                } = self;
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
        }
    }

    /// Calls the inner service, with the decisions in the request's extensions when the
    /// layer asks for them ([`request_info`](super::Builder::request_info)) and always for a
    /// request let through over the limit (shadow mode, fallback).
    fn pass(self, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        let Self {
            mut inner,
            mut req,
            applied,
            pk,
            limiter,
            ..
        } = self;
        if limiter.reporter().wants_info(&decisions) {
            let names = limiter.reporter().names.clone();
            req.extensions_mut()
                .insert(Info::new(names, applied.indices(), decisions.clone()));
        }
        let reported = Reported {
            decisions,
            applied,
            pk,
        };
        Kind::Called {
            future: inner.call(req),
            report: Some((limiter.as_report(), reported)),
        }
    }

    /// A reservation: sleep for its delay, then proceed without checking again; the headers
    /// report the state as of the reservation.
    fn reserved(self, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        let delay = decisions.delay();
        if tokio::runtime::Handle::try_current().is_err() {
            // Cannot wait outside a tokio runtime: give the reservation back and reject.
            self.limiter.refund(&self.applied, &decisions);
            return self.reject(decisions);
        }
        tracing::debug!(
            ?delay,
            "delay mode: capacity reserved, waiting for its turn"
        );
        Kind::Reserved {
            sleep: tokio::time::sleep(delay),
            reservation: Reservation {
                pending: Some((self, decisions)),
            },
        }
    }

    fn denied(mut self, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        match self.limiter.reporter().mode {
            Mode::Shadow => {
                let policy = deciding_name(&self.limiter, &self.applied, &decisions);
                tracing::info!(target: "ratekeeper::shadow", policy, "shadow mode: request over the limit let through");
                self.pass(decisions)
            }
            Mode::Delay { max_wait } => {
                let now = Instant::now();
                let deadline = *self
                    .deadline
                    .get_or_insert_with(|| now.checked_add(max_wait).unwrap_or(now));
                match decisions.retry_after() {
                    // A final denial (the store reserved exactly) cannot pass in time.
                    Some(wait)
                        if !decisions.is_final()
                            && now.checked_add(wait).is_some_and(|at| at <= deadline)
                            && tokio::runtime::Handle::try_current().is_ok() =>
                    {
                        tracing::debug!(?wait, "delay mode: waiting for capacity");
                        Kind::Waiting {
                            sleep: tokio::time::sleep(wait),
                            pending: Some(self),
                        }
                    }
                    _ => self.reject(decisions),
                }
            }
            Mode::Reject => self.reject(decisions),
        }
    }

    fn reject(mut self, decisions: Decisions) -> Kind<S::Future, S, Request<ReqB>, SF> {
        if self.degrade {
            let policy = deciding_name(&self.limiter, &self.applied, &decisions);
            self.req.extensions_mut().insert(Degrade::new(policy));
            self.pass(decisions)
        } else {
            let reported = Reported {
                decisions,
                applied: self.applied,
                pk: self.pk,
            };
            Kind::Answered {
                answer: Some(self.limiter.limited(&reported)),
            }
        }
    }
}

fn deciding_name<'a, SF>(
    limiter: &'a Arc<dyn Limiter<SF>>,
    applied: &Applied,
    decisions: &Decisions,
) -> &'a str {
    decisions
        .deciding()
        .and_then(|i| applied.entries.get(i))
        .and_then(|e| limiter.reporter().names.get(e.index as usize))
        .map_or("", |n| &**n)
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
                    if let Some((report, reported)) = report.take() {
                        report.settle(&reported, parts.status);
                        report.headers(&reported, &mut parts.headers);
                    }
                    return Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::inner(body))));
                }
                KindProj::Answered { answer } => {
                    let answer = answer.take().unwrap_or_else(polled_after_completion);
                    return Poll::Ready(Ok(answer.into_response()));
                }
                KindProj::Checking { check, pending } => {
                    let result = ready!(check.poll(cx));
                    let next = match pending.take() {
                        Some(pending) => pending.decided(result),
                        None => Kind::Answered { answer: None },
                    };
                    this.kind.set(next);
                }
                KindProj::Reserved { sleep, reservation } => {
                    ready!(sleep.poll(cx));
                    let next = match reservation.proceed() {
                        Some((pending, decisions)) => pending.pass(decisions),
                        None => Kind::Answered { answer: None },
                    };
                    this.kind.set(next);
                }
                KindProj::Waiting { sleep, pending } => {
                    ready!(sleep.poll(cx));
                    let next = match pending.take() {
                        Some(pending) => match pending.limiter.recheck(
                            &pending.applied,
                            pending.deadline.map_or(Duration::ZERO, |d| {
                                d.saturating_duration_since(Instant::now())
                            }),
                        ) {
                            Checked::Ready(result) => pending.decided(result),
                            Checked::Pending(check) => Kind::Checking {
                                check,
                                pending: Some(pending),
                            },
                        },
                        None => Kind::Answered { answer: None },
                    };
                    this.kind.set(next);
                }
            }
        }
    }
}

fn polled_after_completion() -> Answer {
    Answer {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        headers: HeaderMap::new(),
        body: Bytes::from_static(b"response future polled after completion\n"),
    }
}
