//! The response future and body of [`ConcurrencyLimit`](super::ConcurrencyLimit): the
//! shared ones of [`held`](crate::held), whose body holds the request's slot.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use ratekeeper_core::store::Decisions;

use super::layer::Permit;
use super::service::unix_now;
use super::upgrade::Held;
use crate::held::{Admission, HeldFuture};
use crate::key::KeyError;
use crate::report::Reporter;

define_held_response! {
    /// Response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    pub struct ResponseFuture;
    /// The response body of a [`ConcurrencyLimit`](super::ConcurrencyLimit): holds the
    /// request's slot until the body ends (last frame, error) or is dropped.
    pub struct ConcurrencyBody;
    admission: Admitted;
}

/// An admitted request's slot, and the decision its response reports in its headers.
pub(crate) struct Admitted {
    slot: Held,
    reporter: Arc<Reporter>,
    decisions: Decisions,
}

impl Admission for Admitted {
    type Permit = Permit;

    fn respond(self, headers: &mut HeaderMap) -> Option<Permit> {
        self.reporter
            .headers(&self.decisions, &[0], None, unix_now, headers);
        self.slot.into_permit()
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(
        future: F,
        slot: Held,
        reporter: Arc<Reporter>,
        decisions: Decisions,
    ) -> Self {
        Self::new(HeldFuture::called(
            future,
            Admitted {
                slot,
                reporter,
                decisions,
            },
        ))
    }

    /// The inner service's response, passed through without a slot or headers.
    pub(crate) fn passed(future: F) -> Self {
        Self::new(HeldFuture::passed(future))
    }

    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self::new(HeldFuture::answered(status, headers, body))
    }

    /// The answer to a request without a key (a gRPC request gets a trailers-only response).
    /// `grpc`: from [`Reporter::grpc_call`].
    pub(crate) fn key_error(err: &KeyError, grpc: Option<HeaderValue>) -> Self {
        Self::new(HeldFuture::key_error(err, grpc, "concurrency limiter"))
    }
}
