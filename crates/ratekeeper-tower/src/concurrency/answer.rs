//! The answer of a counted concurrency limit ([`Local`](super::Local),
//! [`Shared`](super::Shared)) when every slot of a key is taken.

use std::time::Duration;

use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Outcome};

use super::limit::unix_now;
use crate::report::{Reporter, trailers_only};

/// The policy name concurrency limits report in headers and problem bodies.
pub(crate) const NAME: &str = "concurrency";

/// The answer when all `max` slots of the key are taken: 429 with `Retry-After: 1` (or a
/// gRPC trailers-only `RESOURCE_EXHAUSTED` when `grpc`, from [`Reporter::grpc_call`], is set).
pub(crate) fn refused(
    reporter: &Reporter,
    max: u32,
    grpc: Option<http::HeaderValue>,
) -> (http::StatusCode, http::HeaderMap, bytes::Bytes) {
    tracing::debug!(max, "concurrency limit reached");
    let decisions = Decisions::new([Decision::new(
        Outcome::Denied {
            retry_after: Duration::from_secs(1),
        },
        max,
        0,
        Duration::ZERO,
    )]);
    let (mut status, mut headers, mut body) = reporter.limited(&decisions, &[0], None, unix_now);
    if let Some(content_type) = grpc {
        (status, body) = trailers_only(status, &mut headers, &body, Some(NAME), content_type);
    }
    (status, headers, body)
}
