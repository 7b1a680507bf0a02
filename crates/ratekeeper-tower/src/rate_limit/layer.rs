//! [`RateLimitLayer`](crate::RateLimitLayer): the layer, sharing one limiter with every service it builds.

use std::fmt;
use std::sync::Arc;

use ratekeeper_core::store::{MemoryStore, PolicyId};
use ratekeeper_core::{Key, Quota};
use tower_layer::Layer;

use super::admin::Admin;
use super::limiter::Limiter;
use super::service::RateLimit;
use crate::key::PeerIp;
use crate::policy::AllPolicies;

/// A [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) that rate limits requests (see the [module docs](super)).
///
/// Every service the layer builds, and every clone of those services, shares one state
/// behind an [`Arc`], so one budget holds however many connections a server opens.
pub struct RateLimitLayer<K = PeerIp, Co = u64, St = MemoryStore<Key>, R = AllPolicies> {
    limiter: Arc<Limiter<K, Co, St, R>>,
}

impl RateLimitLayer {
    /// Limits each client IP (IPv6 by /64) to `quota`, with the GCRA algorithm, the
    /// in-memory store, cost 1 per request and `X-RateLimit-*` headers. The policy is named
    /// `"default"`. Logs the INFO event of a built layer (see
    /// [`RateLimitBuilder::build`](crate::RateLimitBuilder::build)).
    ///
    /// The same layer as `RateLimitLayer::builder().quota(quota).build()`, without a
    /// `Result`: these settings (one GCRA policy with a valid name, cost 1 within any burst,
    /// the peer IP key and the memory store, which accepts every such policy) cannot fail.
    pub fn new(quota: Quota) -> Self {
        Self::builder().single_quota_layer(quota)
    }
}

impl<K, Co, St, R> RateLimitLayer<K, Co, St, R> {
    pub(super) fn from_limiter(limiter: Limiter<K, Co, St, R>) -> Self {
        Self {
            limiter: Arc::new(limiter),
        }
    }

    pub(crate) fn limiter(&self) -> Arc<Limiter<K, Co, St, R>> {
        Arc::clone(&self.limiter)
    }

    /// The store, for calls of its own (for example [`MemoryStore::forget`]).
    /// [`RateLimitLayer::admin`](crate::RateLimitLayer::admin) peeks at and resets keys by policy name, with any store.
    pub fn store(&self) -> &St {
        &self.limiter.store
    }

    /// The ids of this layer's policies, in the order they were added.
    pub fn policy_ids(&self) -> &[PolicyId] {
        &self.limiter.ids
    }

    /// A handle to peek at and reset client keys in this layer's store, naming policies by
    /// their names (see [`Admin`]). Cheap to clone; it shares the layer's state.
    pub fn admin(&self) -> Admin<St>
    where
        K: Send + Sync + 'static,
        Co: Send + Sync + 'static,
        St: Send + Sync + 'static,
        R: Send + Sync + 'static,
    {
        Admin::new(Arc::clone(&self.limiter))
    }
}

impl<K, Co, St, R> Clone for RateLimitLayer<K, Co, St, R> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<K, Co, St, R> fmt::Debug for RateLimitLayer<K, Co, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", self.limiter.names())
            .finish_non_exhaustive()
    }
}

impl<S, K, Co, St, R> Layer<S> for RateLimitLayer<K, Co, St, R> {
    type Service = RateLimit<S, K, Co, St, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_limiter(inner, Arc::clone(&self.limiter))
    }
}

impl<S, K, Co, St, R> RateLimit<S, K, Co, St, R> {
    /// A layer that builds services sharing this service's state.
    pub fn layer(&self) -> RateLimitLayer<K, Co, St, R> {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
        }
    }
}
