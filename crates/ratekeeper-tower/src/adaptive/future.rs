//! The response future and body of [`AdaptiveConcurrency`](super::AdaptiveConcurrency): the
//! shared ones of [`held`](crate::held), recording each response's latency, whose body
//! holds the request's place in flight.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use ratekeeper_core::clock::Clock;

use super::limiter::Permit;
use crate::held::{Admission, HeldFuture};
use crate::key::KeyError;

define_held_response! {
    /// Response future of [`AdaptiveConcurrency`](super::AdaptiveConcurrency).
    pub struct ResponseFuture;
    /// The response body of an [`AdaptiveConcurrency`](super::AdaptiveConcurrency): holds
    /// the request's place in flight until the body ends (last frame, error) or is dropped.
    pub struct AdaptiveBody;
    admission: Admitted;
}

/// An admitted request's permit (`None` once the response is out), and the clock its
/// latency is read on.
pub(crate) struct Admitted {
    permit: Option<Permit>,
    clock: Arc<dyn Clock>,
}

impl Admission for Admitted {
    type Permit = Permit;

    /// Records the latency (admission to response head).
    fn respond(mut self, _headers: &mut HeaderMap) -> Option<Permit> {
        let permit = self.permit.take()?;
        permit.sample(self.clock.now());
        Some(permit)
    }
}

/// The outcome hook: an admission dropped before a response (the inner service failed, or
/// the response future was dropped) records the request's elapsed time as a failure, so a
/// service that fails slowly lowers the limit.
impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            permit.failure(self.clock.now());
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F, permit: Permit, clock: Arc<dyn Clock>) -> Self {
        Self::new(HeldFuture::called(
            future,
            Admitted {
                permit: Some(permit),
                clock,
            },
        ))
    }

    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self::new(HeldFuture::answered(status, headers, body))
    }

    /// The answer to a request without a key (a gRPC call, `grpc` being its
    /// `content-type`, gets a trailers-only response).
    pub(crate) fn key_error(err: &KeyError, grpc: Option<HeaderValue>) -> Self {
        Self::new(HeldFuture::key_error(
            err,
            grpc,
            "adaptive concurrency limiter",
        ))
    }
}
