//! The seam between the one concurrency middleware and what counts its slots: [`Limit`],
//! implemented by the local counter ([`Local`](super::Local)), the slots of a shared store
//! ([`Shared`](super::Shared)) and the adaptive limiter
//! ([`Adaptive`](crate::adaptive::Adaptive)). The service asks the limit for a slot in
//! `call` ([`Acquire`]) and hands the admitted request's [`Admitted`] to the response future,
//! whose body holds the [`Permit`] until it ends.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use ratekeeper_core::Key;
use ratekeeper_core::clock::Clock;
use ratekeeper_core::store::slots::{AcquireFuture, Acquired};
use ratekeeper_core::store::{Decisions, StoreError};

use super::held::Admission;
use super::permit::Permit;
use super::upgrade::Held;
use crate::adaptive::Permit as AdaptivePermit;
use crate::report::Reporter;

/// What counts a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)'s slots: the layer's
/// second type parameter. Implemented by [`Local`](super::Local) (this process's counter,
/// the default), [`Shared`](super::Shared) (a store shared by every instance) and
/// [`Adaptive`](crate::adaptive::Adaptive) (a limit found from latency); its methods are
/// the crate's own.
pub trait Limit: Send + Sync + 'static {
    /// A slot for `req`, whose key is `key`.
    #[doc(hidden)]
    fn acquire<B>(&self, key: &Key, req: &mut Request<B>) -> Acquire;

    /// Whether refused gRPC calls get a gRPC answer.
    #[doc(hidden)]
    fn serves_grpc(&self) -> bool;

    /// The limiter's name in the log line of a request it cannot key.
    #[doc(hidden)]
    fn describe(&self) -> &'static str;
}

/// A limit's answer to a request (its content is the crate's own).
#[derive(Debug)]
pub struct Acquire(pub(crate) Answer);

impl Acquire {
    /// Admitted: call the inner service.
    pub(crate) fn admitted(admitted: Admitted) -> Self {
        Self(Answer::Admitted(admitted))
    }

    /// Refused: this answer, already in the form the request reads (HTTP or gRPC).
    pub(crate) fn refused(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self(Answer::Refused(status, headers, body))
    }
}

/// What [`Acquire`] holds.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Admitted: call the inner service.
    Admitted(Admitted),
    /// Refused: this answer, already in the form the request reads (HTTP or gRPC).
    Refused(StatusCode, HeaderMap, Bytes),
    /// A shared store decides; the response future waits for its answer.
    Pending(Pending),
}

/// A shared store's decision in flight, and what the layer needs to act on it.
pub(crate) struct Pending {
    /// The store's answer.
    pub(crate) acquire: AcquireFuture,
    /// The shared limit, to tell what follows the answer.
    pub(crate) decide: Arc<dyn Decide>,
}

/// What a shared limit makes of its store's answer.
pub(crate) trait Decide: Send + Sync {
    /// The answer for a request with this `version` and header fields.
    fn decide(
        &self,
        answer: Result<Acquired, StoreError>,
        version: Version,
        headers: &HeaderMap,
    ) -> Decided;
}

/// A shared store's answer, as the layer acts on it.
pub(crate) enum Decided {
    /// A slot: the headers of `decisions` on the response, the slot held by its body.
    Slot {
        permit: Permit,
        reporter: Arc<Reporter>,
        decisions: Decisions,
    },
    /// An answer (all slots taken, or the store failed closed), in the request's form.
    Refused(StatusCode, HeaderMap, Bytes),
    /// The store failed open: the request goes on without a slot or headers.
    Pass,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

/// An admitted request: what its response gets (headers, a latency sample) and what its
/// body holds.
pub(crate) enum Admitted {
    /// A counted slot ([`Local`](super::Local), [`Shared`](super::Shared)): the rate-limit
    /// headers of `decisions` on the response, the slot held by the body (or by a handler
    /// that keeps an upgrade's slot).
    Counted {
        /// The slot, shared with an [`UpgradeSlot`](super::UpgradeSlot) for an upgrade.
        slot: Held,
        /// Renders the headers.
        reporter: Arc<Reporter>,
        /// The decision the headers report.
        decisions: Decisions,
    },
    /// A place under the adaptive limit: its latency is sampled when the response head is
    /// ready, a failure's elapsed time when it is dropped before.
    Adaptive(Sampled),
}

/// A place under the adaptive limit and the clock its latency is read on. Its latency is
/// sampled when the response head is ready; dropped before that (the inner service returned
/// an error, or the response future was dropped, as an outer timeout does), it gives its
/// elapsed time as a failure sample, so a service that fails slowly lowers the limit.
pub(crate) struct Sampled {
    /// The place in flight (`None` once the response head is out).
    permit: Option<AdaptivePermit>,
    /// The clock latencies are read on.
    clock: Arc<dyn Clock>,
}

impl Sampled {
    /// The admission of `permit`, timed on `clock`.
    pub(crate) fn new(permit: AdaptivePermit, clock: Arc<dyn Clock>) -> Self {
        Self {
            permit: Some(permit),
            clock,
        }
    }

    /// Records the latency (admission to response head); the place, for the body to hold.
    fn respond(mut self) -> Option<AdaptivePermit> {
        let permit = self.permit.take()?;
        permit.sample(self.clock.now());
        Some(permit)
    }
}

impl Drop for Sampled {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            permit.failure(self.clock.now());
        }
    }
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Counted { .. } => f.debug_struct("Counted").finish_non_exhaustive(),
            Self::Adaptive(sampled) => f.debug_tuple("Adaptive").field(&sampled.permit).finish(),
        }
    }
}

impl Admission for Admitted {
    type Permit = Permit;

    /// A counted slot adds the headers; an adaptive place records the latency (admission to
    /// response head). A failed request's admission is dropped at once: an adaptive place
    /// records the failure ([`Sampled`]).
    fn respond(self, headers: &mut HeaderMap) -> Option<Permit> {
        match self {
            Self::Counted {
                slot,
                reporter,
                decisions,
            } => {
                reporter.headers(&decisions, &[0], None, unix_now, headers);
                slot.into_permit()
            }
            Self::Adaptive(sampled) => sampled.respond().map(Permit::Adaptive),
        }
    }
}

/// Seconds since the Unix epoch, for the headers' reset fields.
pub(crate) fn unix_now() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
