//! Adaptive limits in the concurrency middleware: [`Adaptive`] as a [`Limit`], the layer's
//! constructor and builder's `build`, and what an adaptive layer tells about its limits. The
//! [`adaptive`](crate::adaptive) module (controller, partitions, per-key limiters) knows
//! nothing of this middleware; this file plugs it in.

use std::sync::Arc;

use http::Request;
use ratekeeper_core::Key;

use super::layer::ConcurrencyLimitLayer;
use super::limit::{Acquire, Admitted, Limit, Sampled};
use crate::BuildError;
use crate::adaptive::{Adaptive, AdaptiveConcurrencyBuilder, Classify, Snapshot};
use crate::key::KeyExtractor;

impl<C: Classify> Limit for Adaptive<C> {
    fn acquire<B>(&self, key: &Key, req: &mut Request<B>) -> Acquire {
        let partition = self.partitions.index(self.classify.classify(req));
        let limiter = self.limiter(key);
        match self.try_admit(&limiter, partition) {
            Some(permit) => Acquire::admitted(Admitted::Adaptive(Sampled::new(
                permit,
                Arc::clone(&self.clock),
            ))),
            None => {
                let (status, headers, body) = self.refusal(partition, req);
                Acquire::refused(status, headers, body)
            }
        }
    }

    fn serves_grpc(&self) -> bool {
        self.grpc
    }

    fn describe(&self) -> &'static str {
        "adaptive concurrency limiter"
    }
}

impl ConcurrencyLimitLayer {
    /// A builder for an adaptive concurrency limit: one limit for every request by default,
    /// found from latency with the default
    /// [`ControllerSettings`](crate::adaptive::controller::ControllerSettings), no partitions,
    /// `503` refusals with `Retry-After: 1` (see the [`adaptive`](crate::adaptive) module).
    pub fn adaptive() -> AdaptiveConcurrencyBuilder {
        AdaptiveConcurrencyBuilder::new()
    }
}

impl<K, C> AdaptiveConcurrencyBuilder<K, C> {
    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] naming the field: a controller setting out of range (see
    /// [`ControllerSettings::validate`](crate::adaptive::controller::ControllerSettings::validate)),
    /// a partition share outside `(0, 1]`, shares adding up to more than 1, an empty or
    /// repeated partition name, `max_keys` of 0, or an empty name; or the key extractor's own
    /// error ([`KeyExtractor::check`]).
    pub fn build(self) -> Result<ConcurrencyLimitLayer<K, Adaptive<C>>, BuildError>
    where
        K: KeyExtractor,
    {
        let (key, limit) = self.check()?;
        Ok(ConcurrencyLimitLayer::from_parts(key, limit))
    }
}

impl<K, C> ConcurrencyLimitLayer<K, Adaptive<C>> {
    /// The state of `key`'s limit (`Key::Global` for an unkeyed layer), `None` before its
    /// first request.
    pub fn snapshot(&self, key: &Key) -> Option<Snapshot> {
        self.limit.snapshot(key)
    }

    /// The partition names, in the order they were declared (`["all"]` without partitions).
    pub fn partitions(&self) -> impl Iterator<Item = &str> {
        self.limit.partitions.names.iter().map(|n| &**n)
    }
}
