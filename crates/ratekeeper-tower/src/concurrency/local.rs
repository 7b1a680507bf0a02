//! [`Local`]: the slots of one process, counted per key in memory.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Key, Outcome};

use super::answer::refused;
use super::counter::Counter;
use super::limit::{Acquire, Admitted, Limit};
use super::permit::Permit;
use super::upgrade::Held;
use crate::report::Reporter;

/// The slots of a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) counted in this
/// process's memory, per key (the default [`Limit`]). Every service the layer builds, and
/// their clones, share one counter.
pub struct Local {
    counter: Arc<Counter>,
    pub(crate) reporter: Arc<Reporter>,
}

impl Local {
    pub(crate) fn new(max: u32, reporter: Reporter) -> Self {
        Self {
            counter: Arc::new(Counter::new(max)),
            reporter: Arc::new(reporter),
        }
    }

    /// The same counter, with another reporter (header style, gRPC).
    pub(crate) fn with_reporter(&self, reporter: Reporter) -> Self {
        Self {
            counter: Arc::clone(&self.counter),
            reporter: Arc::new(reporter),
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.counter.max()
    }

    /// Requests of `key` in flight now.
    pub(crate) fn in_flight(&self, key: &Key) -> u32 {
        self.counter.in_flight(key)
    }
}

impl fmt::Debug for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("max", &self.counter.max())
            .field("style", &self.reporter.style)
            .finish_non_exhaustive()
    }
}

impl Limit for Local {
    fn acquire<B>(&self, key: &Key, req: &mut Request<B>) -> Acquire {
        let max = self.counter.max();
        match self.counter.acquire(key) {
            Some((slot, free)) => {
                let decisions =
                    Decisions::new([Decision::new(Outcome::Allowed, max, free, Duration::ZERO)]);
                Acquire::admitted(Admitted::Counted {
                    slot: Held::for_request(Permit::Local(slot), req),
                    reporter: Arc::clone(&self.reporter),
                    decisions,
                })
            }
            None => {
                let grpc = self.reporter.grpc_call(req.version(), req.headers());
                let (status, headers, body) = refused(&self.reporter, max, grpc);
                Acquire::refused(status, headers, body)
            }
        }
    }

    fn serves_grpc(&self) -> bool {
        self.reporter.grpc
    }

    fn describe(&self) -> &'static str {
        "concurrency limiter"
    }
}
