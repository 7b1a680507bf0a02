use std::fmt;
use std::hash::Hash as _;
use std::num::NonZeroU32;
use std::sync::Arc;

use dashmap::DashMap;
use ratekeeper_core::Key;
use ratekeeper_core::store::slots::{SharedSlots, SlotLease};
use tower_layer::Layer;

use super::ConcurrencyLimit;
use super::shared::SharedConcurrencyLimitLayer;
use crate::key::PeerIp;
use crate::report::{DEFAULT_UNAVAILABLE_RETRY_AFTER, HeaderStyle, Reporter, Unavailable};

/// The policy name concurrency limits report in headers and problem bodies.
pub(crate) const NAME: &str = "concurrency";

/// Requests in flight per key.
pub(crate) struct Counter {
    max: u32,
    counts: DashMap<Key, u32, foldhash::fast::RandomState>,
}

impl Counter {
    /// Takes a slot for `key`: the free slots left after it, or `None` when all `max` are
    /// taken.
    pub(crate) fn acquire(self: &Arc<Self>, key: &Key) -> Option<(Permit, u32)> {
        let mut count = self.counts.entry(key.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        let free = self.max - *count;
        drop(count);
        Some((
            Permit {
                kind: PermitKind::Local {
                    counter: Arc::clone(self),
                    key: key.clone(),
                },
            },
            free,
        ))
    }

    fn release(&self, key: &Key) {
        let now_zero = match self.counts.get_mut(key) {
            Some(mut count) => {
                *count = count.saturating_sub(1);
                *count == 0
            }
            None => false,
        };
        if now_zero {
            // Only if no request took the slot in between.
            self.counts.remove_if(key, |_, count| *count == 0);
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    fn in_flight(&self, key: &Key) -> u32 {
        self.counts.get(key).map_or(0, |c| *c)
    }
}

/// One admitted request's slot; released on drop.
pub(crate) struct Permit {
    kind: PermitKind,
}

enum PermitKind {
    /// A slot of this layer's own counter.
    Local { counter: Arc<Counter>, key: Key },
    /// A slot of a shared store (released by the lease's own drop).
    Shared(SlotLease),
}

impl Permit {
    /// A slot held in a shared store.
    pub(crate) fn shared(lease: SlotLease) -> Self {
        Self {
            kind: PermitKind::Shared(lease),
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let PermitKind::Local { counter, key } = &self.kind {
            counter.release(key);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            PermitKind::Local { key, .. } => {
                // The key may be personal data: only its hash is shown.
                let mut h = std::hash::DefaultHasher::new();
                key.hash(&mut h);
                f.debug_struct("Permit")
                    .field("key_hash", &std::hash::Hasher::finish(&h))
                    .finish()
            }
            PermitKind::Shared(lease) => f.debug_tuple("Permit").field(lease).finish(),
        }
    }
}

/// A [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) that limits concurrent requests per key (see the
/// [module docs](super)). All services it builds, and their clones, share one counter.
pub struct ConcurrencyLimitLayer<K = PeerIp> {
    pub(crate) key: Arc<K>,
    pub(crate) counter: Arc<Counter>,
    pub(crate) reporter: Arc<Reporter>,
}

impl ConcurrencyLimitLayer {
    /// At most `max` requests in flight per client IP (IPv6 by /64), `X-RateLimit-*` headers.
    pub fn new(max: NonZeroU32) -> Self {
        Self {
            key: Arc::new(PeerIp::new()),
            counter: Arc::new(Counter {
                max: max.get(),
                counts: DashMap::default(),
            }),
            reporter: Arc::new(Reporter::concurrency(
                NAME,
                max.get(),
                HeaderStyle::default(),
            )),
        }
    }
}

impl<K> ConcurrencyLimitLayer<K> {
    /// Sets the key extractor (a new counter is not made: call this before using the layer).
    pub fn key<K2>(self, key: K2) -> ConcurrencyLimitLayer<K2> {
        ConcurrencyLimitLayer {
            key: Arc::new(key),
            counter: self.counter,
            reporter: self.reporter,
        }
    }

    /// Sets the header style (default [`HeaderStyle::XRateLimit`]).
    pub fn headers(self, style: HeaderStyle) -> Self {
        let mut reporter = Reporter::concurrency(NAME, self.counter.max(), style);
        reporter.grpc = self.reporter.grpc;
        Self {
            reporter: Arc::new(reporter),
            ..self
        }
    }

    /// Whether this layer serves gRPC: a refused gRPC call then gets a trailers-only gRPC
    /// answer (`grpc-status: 8`, `RESOURCE_EXHAUSTED`) instead of a 429. Default `false`; see
    /// [`RateLimitBuilder::grpc`](crate::RateLimitBuilder::grpc) for what counts as a gRPC
    /// call. Kept by [`shared`](Self::shared).
    pub fn grpc(self, on: bool) -> Self {
        let mut reporter = (*self.reporter).clone();
        reporter.grpc = on;
        Self {
            reporter: Arc::new(reporter),
            ..self
        }
    }

    /// Requests of `key` in flight now (admitted, body not ended).
    pub fn in_flight(&self, key: &Key) -> u32 {
        self.counter.in_flight(key)
    }

    /// Counts the slots in a shared store instead of this process's memory, so the limit
    /// holds across every instance that shares `slots` (with the `redis` feature of
    /// `ratekeeper-core`: `RedisStore::slots`, whose leases free a dead instance's slots on
    /// their own). Keeps the key extractor, `max` and header style.
    ///
    /// The shared layer decides after one round trip, in the response future, so its
    /// service needs an inner service that is `Clone + Send` (axum's `Router` is); a store
    /// error is answered by the store's failure policy (see [`SharedConcurrencyLimitLayer`]).
    pub fn shared(self, slots: impl SharedSlots) -> SharedConcurrencyLimitLayer<K> {
        SharedConcurrencyLimitLayer {
            key: self.key,
            max: self.counter.max(),
            slots: Arc::new(slots),
            reporter: self.reporter,
            unavailable: Arc::new(Unavailable::concurrency(DEFAULT_UNAVAILABLE_RETRY_AFTER)),
        }
    }
}

impl<K> Clone for ConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            counter: Arc::clone(&self.counter),
            reporter: Arc::clone(&self.reporter),
        }
    }
}

impl<K> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("max", &self.counter.max())
            .field("style", &self.reporter.style)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, self.clone())
    }
}
