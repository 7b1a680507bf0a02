//! The held response future and body of the concurrency limit: the inner service's
//! response, whose body holds the request's permit until it ends, or an answer the layer
//! wrote itself. The public [`ResponseFuture`](super::ResponseFuture) and
//! [`ConcurrencyBody`](super::ConcurrencyBody) wrap them; [`Admission`] says what is done
//! with the response and what the body holds.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::key::KeyError;
use crate::report::trailers_only;

/// What a limiter admitted a request with, until the inner service answers.
pub(crate) trait Admission {
    /// What the response body holds until it ends (last frame, error) or is dropped.
    type Permit;

    /// Takes the head of the inner service's response (to add headers, or to record the
    /// latency) and gives what its body holds. Not called when the inner service fails:
    /// the admission is then dropped at once.
    fn respond(self, headers: &mut HeaderMap) -> Option<Self::Permit>;
}

pin_project! {
    /// The response future of the concurrency limit, before its public wrapper.
    #[project = HeldFutureProj]
    pub(crate) enum HeldFuture<F, A> {
        /// The inner service was called; `admission` is `None` for a request passed without
        /// one (a shared store that failed open), and once the response is out.
        Called {
            #[pin]
            future: F,
            admission: Option<A>,
        },
        /// The layer answers itself; `None` once the answer is out.
        Answered {
            answer: Option<(StatusCode, HeaderMap, Bytes)>,
        },
    }
}

impl<F, A> HeldFuture<F, A> {
    /// The inner service's response, its body holding what `admission` gives.
    pub(crate) fn called(future: F, admission: A) -> Self {
        Self::Called {
            future,
            admission: Some(admission),
        }
    }

    /// The inner service's response, passed through: no headers added, nothing held.
    pub(crate) fn passed(future: F) -> Self {
        Self::Called {
            future,
            admission: None,
        }
    }

    /// A response the layer wrote itself.
    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self::Answered {
            answer: Some((status, headers, body)),
        }
    }

    /// The answer to a request `limiter` (its name in the error log line) could not key: the
    /// problem+json `400` of [`Unkeyed::response`](crate::report::Unkeyed::response) (`500`
    /// for a misconfiguration, logged as an error), or for a gRPC call (`grpc` being its
    /// `content-type`) a trailers-only response.
    pub(crate) fn key_error(err: &KeyError, grpc: Option<HeaderValue>, limiter: &str) -> Self {
        let status = err.status();
        if status.is_server_error() {
            tracing::error!(error = %err, "{limiter} cannot key the request");
        }
        let (head, body) = crate::report::Unkeyed::new(err).response().into_parts();
        let mut headers = head.headers;
        if let Some(content_type) = grpc {
            let (status, body) = trailers_only(status, &mut headers, &body, None, content_type);
            return Self::answered(status, headers, body);
        }
        Self::answered(status, headers, body)
    }
}

impl<F, A, B, E> Future for HeldFuture<F, A>
where
    F: Future<Output = Result<Response<B>, E>>,
    A: Admission,
{
    type Output = Result<Response<HeldBody<B, A::Permit>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            HeldFutureProj::Called { future, admission } => {
                // An error drops the admission, and its permit, at once.
                let res = ready!(future.poll(cx));
                let admission = admission.take();
                let (mut parts, body) = res?.into_parts();
                let permit = admission.and_then(|a| a.respond(&mut parts.headers));
                let body = HeldBody {
                    inner: ResponseBody::inner(body),
                    permit,
                };
                Poll::Ready(Ok(Response::from_parts(parts, body)))
            }
            HeldFutureProj::Answered { answer } => {
                let (status, headers, body) = answer.take().unwrap_or_else(|| {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        HeaderMap::new(),
                        Bytes::from_static(b"response future polled after completion\n"),
                    )
                });
                let mut res = Response::new(HeldBody {
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
    /// A response body that holds `permit` until it ends (last frame, error, end of stream)
    /// or is dropped.
    pub(crate) struct HeldBody<B, P> {
        #[pin]
        inner: ResponseBody<B>,
        permit: Option<P>,
    }
}

impl<B, P> HeldBody<B, P> {
    /// Whether the body still holds its permit.
    pub(crate) fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<B, P> Body for HeldBody<B, P>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if ended {
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::Waker;

    use http::header::CONTENT_TYPE;

    use super::*;

    /// Counts itself in `held` until dropped.
    struct Counted(Arc<AtomicU32>);

    impl Counted {
        fn new(held: &Arc<AtomicU32>) -> Self {
            held.fetch_add(1, Ordering::SeqCst);
            Self(Arc::clone(held))
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Writes `x-admitted: yes` and hands its permit to the body.
    struct Admitted(Counted);

    impl Admission for Admitted {
        type Permit = Counted;

        fn respond(self, headers: &mut HeaderMap) -> Option<Counted> {
            headers.insert("x-admitted", HeaderValue::from_static("yes"));
            Some(self.0)
        }
    }

    /// A body of the given frames; it says it ended once none are left, unless `never_ends`.
    struct Frames {
        frames: VecDeque<Result<Frame<Bytes>, &'static str>>,
        never_ends: bool,
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            Poll::Ready(self.frames.pop_front())
        }

        fn is_end_stream(&self) -> bool {
            !self.never_ends && self.frames.is_empty()
        }
    }

    fn data(s: &'static str) -> Result<Frame<Bytes>, &'static str> {
        Ok(Frame::data(Bytes::from_static(s.as_bytes())))
    }

    fn poll<T: Future + Unpin>(f: &mut T) -> Poll<T::Output> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    /// What polling a test body for a frame gives.
    type NextFrame = Poll<Option<Result<Frame<Bytes>, &'static str>>>;

    fn next_frame(body: &mut HeldBody<Frames, Counted>) -> NextFrame {
        Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop()))
    }

    /// The response of an admitted request whose inner service answers with `frames`; the
    /// counter says whether its permit is held.
    fn admitted(frames: Frames) -> (HeldBody<Frames, Counted>, HeaderMap, Arc<AtomicU32>) {
        let held = Arc::new(AtomicU32::new(0));
        let inner = std::future::ready(Ok::<_, ()>(Response::new(frames)));
        let mut future = HeldFuture::called(inner, Admitted(Counted::new(&held)));
        let Poll::Ready(Ok(res)) = poll(&mut future) else {
            panic!("a ready inner response is ready");
        };
        let (parts, body) = res.into_parts();
        (body, parts.headers, held)
    }

    #[test]
    fn the_permit_is_held_until_the_last_frame() {
        let (mut body, headers, held) = admitted(Frames {
            frames: VecDeque::from([data("a"), data("b")]),
            never_ends: false,
        });
        assert_eq!(headers["x-admitted"], "yes");
        assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(held.load(Ordering::SeqCst), 1);
        assert!(body.holds_permit());
        // The last frame ends the body: released then, without waiting for `None`.
        assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(held.load(Ordering::SeqCst), 0);
        assert!(!body.holds_permit());
    }

    #[test]
    fn an_error_frame_or_the_end_of_a_body_that_never_said_so_releases_the_permit() {
        let (mut body, _, held) = admitted(Frames {
            frames: VecDeque::from([data("a"), Err("reset")]),
            never_ends: true,
        });
        assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(held.load(Ordering::SeqCst), 1);
        assert!(matches!(
            next_frame(&mut body),
            Poll::Ready(Some(Err("reset")))
        ));
        assert_eq!(held.load(Ordering::SeqCst), 0);

        let (mut body, _, held) = admitted(Frames {
            frames: VecDeque::from([data("a")]),
            never_ends: true,
        });
        assert!(matches!(next_frame(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(held.load(Ordering::SeqCst), 1);
        assert!(matches!(next_frame(&mut body), Poll::Ready(None)));
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_body_dropped_before_its_end_releases_the_permit() {
        let (body, _, held) = admitted(Frames {
            frames: VecDeque::from([data("a")]),
            never_ends: false,
        });
        assert_eq!(held.load(Ordering::SeqCst), 1);
        drop(body);
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_failed_inner_service_drops_the_admission_without_a_response() {
        let held = Arc::new(AtomicU32::new(0));
        let inner = std::future::ready(Err::<Response<Frames>, _>("inner failed"));
        let mut future = HeldFuture::called(inner, Admitted(Counted::new(&held)));
        assert!(matches!(
            poll(&mut future),
            Poll::Ready(Err("inner failed"))
        ));
        // Released with the error, not when the future is dropped.
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_answer_is_given_once_then_a_500() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("1"));
        let mut future =
            HeldFuture::<std::future::Ready<Result<Response<Frames>, ()>>, Admitted>::answered(
                StatusCode::TOO_MANY_REQUESTS,
                headers,
                Bytes::from_static(b"limited"),
            );
        let Poll::Ready(Ok(res)) = poll(&mut future) else {
            panic!("an answer is ready");
        };
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "1");
        let (_, mut body) = res.into_parts();
        assert!(!body.holds_permit());
        let Poll::Ready(Some(Ok(frame))) = next_frame(&mut body) else {
            panic!("the answer has a body");
        };
        assert_eq!(frame.into_data().ok().as_deref(), Some(&b"limited"[..]));
        let Poll::Ready(Ok(again)) = poll(&mut future) else {
            panic!("a second poll is ready");
        };
        assert_eq!(again.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_key_error_is_problem_json_or_trailers_only_for_grpc() {
        type Future = HeldFuture<std::future::Ready<Result<Response<Frames>, ()>>, Admitted>;
        let err = KeyError::Missing("x-api-key");
        let Poll::Ready(Ok(res)) = poll(&mut Future::key_error(&err, None, "test limiter")) else {
            panic!("a key error is ready");
        };
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        let Poll::Ready(Some(Ok(frame))) = next_frame(&mut res.into_body()) else {
            panic!("a key error has a body");
        };
        let text = frame.into_data().unwrap_or_default();
        let problem: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(problem["status"], 400);
        assert!(!String::from_utf8_lossy(&text).contains("x-api-key"));
        let grpc = Some(HeaderValue::from_static("application/grpc"));
        let Poll::Ready(Ok(res)) = poll(&mut Future::key_error(&err, grpc, "test limiter")) else {
            panic!("a key error is ready");
        };
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "3");
        assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc");
    }
}
