use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use http::Response;
use pin_project_lite::pin_project;
use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::deadline::OverDeadline;
use super::error::{Error, WaitTooLong};
use super::parse::announced_wait_at;
use super::state::Shared;

pin_project! {
    /// Response future of [`Polite`](super::Polite): waits if it must, sends, then records
    /// what the response announced.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        memory: Option<(Arc<Shared>, String)>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting {
            #[pin]
            sleep: Sleep,
            // Completes when a later answer shortened or cleared a recorded wait.
            #[pin]
            shortened: OwnedNotified,
            service: Option<S>,
            req: Option<Req>,
            // When the request was called: a wait lengthened (by a response that arrived
            // meanwhile) past `called + max_wait` is handled as `over_deadline` says.
            called: Instant,
            max_wait: Duration,
            over_deadline: OverDeadline,
        },
        Calling {
            #[pin]
            future: S::Future,
            // When the request was handed to the inner service.
            sent: Instant,
        },
        Refused { error: Option<WaitTooLong> },
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(super) fn call(future: S::Future, shared: Arc<Shared>, key: String) -> Self {
        Self {
            state: State::Calling {
                future,
                sent: Instant::now(),
            },
            memory: Some((shared, key)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn wait(
        until: Instant,
        called: Instant,
        max_wait: Duration,
        over_deadline: OverDeadline,
        service: S,
        req: Req,
        shared: Arc<Shared>,
        key: String,
    ) -> Self {
        Self {
            state: State::Waiting {
                sleep: tokio::time::sleep_until(until),
                shortened: shared.shortened(),
                service: Some(service),
                req: Some(req),
                called,
                max_wait,
                over_deadline,
            },
            memory: Some((shared, key)),
        }
    }

    pub(super) fn refused(error: WaitTooLong) -> Self {
        Self {
            state: State::Refused { error: Some(error) },
            memory: None,
        }
    }
}

impl<S, Req, ResB> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<ResB>>,
{
    type Output = Result<Response<ResB>, Error<S::Error>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Waiting {
                    mut sleep,
                    mut shortened,
                    service,
                    req,
                    called,
                    max_wait,
                    over_deadline,
                } => {
                    if let Some((shared, key)) = this.memory.as_ref() {
                        if shortened.as_mut().poll(cx).is_ready() {
                            // A later answer shortened or cleared a recorded wait: wake at
                            // the new time (now, if none is left), never later than planned.
                            let now = Instant::now();
                            shortened.set(shared.shortened());
                            let until = shared.blocked_until(key, now).unwrap_or(now);
                            if until < sleep.deadline() {
                                sleep.as_mut().reset(until);
                            }
                            continue;
                        }
                    }
                    ready!(sleep.as_mut().poll(cx));
                    // A response that arrived during the wait may have announced a longer one.
                    let now = Instant::now();
                    let later = this
                        .memory
                        .as_ref()
                        .and_then(|(shared, key)| shared.blocked_until(key, now));
                    if let Some(until) = later {
                        if called.checked_add(*max_wait).is_none_or(|d| until <= d) {
                            sleep.reset(until);
                            continue;
                        }
                        if *over_deadline == OverDeadline::Fail {
                            let error = WaitTooLong {
                                wait: until - *called,
                                max_wait: *max_wait,
                            };
                            this.memory.take();
                            this.state.set(State::Refused { error: None });
                            return Poll::Ready(Err(Error::WaitTooLong(error)));
                        }
                    }
                    let (Some(mut service), Some(req)) = (service.take(), req.take()) else {
                        // Both are taken together, right before leaving this state.
                        return Poll::Pending;
                    };
                    let future = service.call(req);
                    this.state.set(State::Calling { future, sent: now });
                }
                StateProj::Calling { future, sent } => {
                    let res = ready!(future.poll(cx)).map_err(Error::Service)?;
                    if let Some((shared, key)) = this.memory.take() {
                        let wait =
                            announced_wait_at(res.status(), res.headers(), SystemTime::now());
                        if let Some(wait) = wait {
                            let now = Instant::now();
                            // `checked_add`: the wait is at most a year, but be safe anyway.
                            if let Some(until) = now.checked_add(wait) {
                                shared.record(&key, until, *sent, now);
                            }
                        }
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Refused { error } => {
                    // `None` only when polled again after completion.
                    return match error.take() {
                        Some(e) => Poll::Ready(Err(Error::WaitTooLong(e))),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}
