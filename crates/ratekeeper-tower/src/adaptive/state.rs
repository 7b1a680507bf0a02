//! [`AdaptiveConcurrencyLayer`]: the state its services share (one limiter per key, the
//! refusal rendered once) and its metric names. The builder is in [`builder`](super::builder),
//! a key's limiter and its permits in [`limiter`](super::limiter).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use metrics::Counter;
use ratekeeper_core::Key;
use ratekeeper_core::clock::Clock;
use tower_layer::Layer;

use super::builder::AdaptiveConcurrencyBuilder;
use super::controller::ControllerSettings;
use super::limiter::{Gauges, Limiter, Permit, Snapshot};
use super::partition::Partitions;
use super::{AdaptiveConcurrency, Unclassified};
use crate::key::GlobalKey;

/// Gauge: the current in-flight limit, labels `name` (the layer's name) and `key`.
pub const LIMIT: &str = "ratekeeper_adaptive_limit";
/// Gauge: requests in flight (admitted, response body not ended), labels `name` and `key`.
pub const IN_FLIGHT: &str = "ratekeeper_adaptive_in_flight";
/// Gauge: the latency estimate of the last update interval (its percentile latency), in
/// seconds, labels `name` and `key`.
pub const LATENCY_SECONDS: &str = "ratekeeper_adaptive_latency_seconds";
/// Gauge: the measured minimum latency (`minRTT`), in seconds, labels `name` and `key`.
pub const MIN_LATENCY_SECONDS: &str = "ratekeeper_adaptive_min_latency_seconds";
/// Counter: requests by outcome, labels `name`, `partition` and `outcome` (`admitted`, or
/// `shed` for a request the layer answered because its partition was over its share at the
/// limit).
pub const REQUESTS_TOTAL: &str = "ratekeeper_adaptive_requests_total";
/// Counter: requests of keys beyond [`AdaptiveConcurrencyBuilder::max_keys`], which share
/// one overflow limiter (key label `overflow`), label `name`.
pub const OVERFLOW_TOTAL: &str = "ratekeeper_adaptive_overflow_total";

/// The refusal a layer answers with, rendered once.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) retry_after_secs: u64,
    pub(crate) headers: HeaderMap,
    /// Per partition: the problem+json body.
    pub(crate) bodies: Box<[Bytes]>,
}

impl Answer {
    pub(super) fn new(
        status: StatusCode,
        retry_after: Duration,
        name: &str,
        partitions: &Partitions,
    ) -> Self {
        // Delay-seconds rounded up, at least 1 (RFC 9110 §10.2.3).
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
            .max(1);
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        let bodies = partitions
            .names
            .iter()
            .map(|partition| problem(status, name, partition, secs))
            .collect();
        Self {
            status,
            retry_after_secs: secs,
            headers,
            bodies,
        }
    }
}

/// The RFC 9457 body of a refusal: `temporary-reduced-capacity` for a 503,
/// `quota-exceeded` with the layer's name as the violated policy for a 429 (the problem
/// types of draft-ietf-httpapi-ratelimit-headers, IANA HTTP problem types registry).
fn problem(status: StatusCode, name: &str, partition: &str, secs: u64) -> Bytes {
    let detail = format!(
        "the server is at its concurrency limit for {partition:?} requests; retry after {secs} s"
    );
    let mut body = serde_json::json!({
        "title": status.canonical_reason().unwrap_or("Service Unavailable"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if status == StatusCode::TOO_MANY_REQUESTS {
        body["type"] = crate::report::QUOTA_EXCEEDED_TYPE.into();
        body["violated-policies"] = serde_json::json!([name]);
    } else {
        body["type"] = TEMPORARY_REDUCED_CAPACITY_TYPE.into();
    }
    Bytes::from(body.to_string())
}

pub use crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE;

/// The state every service built by one layer shares.
pub(crate) struct Shared<K, C> {
    pub(crate) key: K,
    pub(crate) classify: C,
    pub(crate) partitions: Partitions,
    pub(crate) answer: Answer,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) name: Arc<str>,
    /// Whether refused gRPC calls get a gRPC answer.
    pub(crate) grpc: bool,
    pub(super) settings: ControllerSettings,
    pub(super) limiters: DashMap<Key, Arc<Limiter>, foldhash::fast::RandomState>,
    pub(super) overflow: OnceLock<Arc<Limiter>>,
    pub(super) max_keys: usize,
    pub(super) seed: AtomicU64,
    /// Per partition: `[admitted, shed]`.
    pub(super) counters: Box<[[OnceLock<Counter>; 2]]>,
    pub(super) overflow_counter: OnceLock<Counter>,
}

impl<K, C> Shared<K, C> {
    /// The limiter of `key`: its own, or the overflow limiter once `max_keys` keys have one.
    pub(crate) fn limiter(&self, key: &Key) -> Arc<Limiter> {
        if let Some(l) = self.limiters.get(key) {
            return Arc::clone(&l);
        }
        if self.limiters.len() >= self.max_keys {
            self.overflow_counter
                .get_or_init(|| metrics::counter!(OVERFLOW_TOTAL, "name" => self.name.to_string()))
                .increment(1);
            return Arc::clone(self.overflow.get_or_init(|| self.new_limiter("overflow")));
        }
        let entry = self
            .limiters
            .entry(key.clone())
            .or_insert_with(|| self.new_limiter(&key.to_string()));
        Arc::clone(&entry)
    }

    fn new_limiter(&self, key_label: &str) -> Arc<Limiter> {
        let labels = [
            ("name", self.name.to_string()),
            ("key", key_label.to_owned()),
        ];
        let gauges = Gauges {
            limit: metrics::gauge!(LIMIT, &labels),
            in_flight: metrics::gauge!(IN_FLIGHT, &labels),
            latency: metrics::gauge!(LATENCY_SECONDS, &labels),
            min_latency: metrics::gauge!(MIN_LATENCY_SECONDS, &labels),
        };
        // A different jitter sequence per key (and per process: the seed is random).
        let seed = self
            .seed
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        Arc::new(Limiter::new(
            self.settings,
            seed,
            self.clock.now(),
            self.partitions.len(),
            gauges,
        ))
    }

    /// The `content-type` of a refused gRPC call's answer, when the layer serves gRPC and
    /// `req` is a gRPC call; `None` for an HTTP answer.
    pub(crate) fn grpc_call<B>(&self, req: &http::Request<B>) -> Option<HeaderValue> {
        if !self.grpc {
            return None;
        }
        crate::report::grpc_content_type(req.version(), req.headers())
    }

    fn partition_name(&self, partition: usize) -> &str {
        self.partitions.names.get(partition).map_or("", |n| &**n)
    }

    /// Admits a request of `partition` on `limiter`, counting the outcome.
    pub(crate) fn try_admit(&self, limiter: &Arc<Limiter>, partition: usize) -> Option<Permit> {
        let permit = limiter.try_admit(partition, &self.partitions, self.clock.now(), &self.name);
        let outcome = usize::from(permit.is_none());
        if let Some(slot) = self.counters.get(partition).and_then(|c| c.get(outcome)) {
            slot.get_or_init(|| {
                metrics::counter!(
                    REQUESTS_TOTAL,
                    "name" => self.name.to_string(),
                    "partition" => self.partition_name(partition).to_owned(),
                    "outcome" => if outcome == 0 { "admitted" } else { "shed" },
                )
            })
            .increment(1);
        }
        if permit.is_none() {
            tracing::trace!(
                name = &*self.name,
                partition = self.partition_name(partition),
                "adaptive concurrency limit reached; request shed"
            );
        }
        permit
    }
}

/// A [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) that adapts the
/// number of requests in flight to the latency it observes (see the [module docs](super)).
/// Every service it builds, and their clones, share one limit per key.
pub struct AdaptiveConcurrencyLayer<K = GlobalKey, C = Unclassified> {
    pub(crate) shared: Arc<Shared<K, C>>,
}

impl AdaptiveConcurrencyLayer {
    /// One limit for every request, with the default [`ControllerSettings`], no partitions,
    /// `503` refusals with `Retry-After: 1`.
    pub fn new() -> Self {
        AdaptiveConcurrencyBuilder::new().finish()
    }

    /// A builder for the settings, partitions, key and answer.
    pub fn builder() -> AdaptiveConcurrencyBuilder {
        AdaptiveConcurrencyBuilder::new()
    }
}

impl Default for AdaptiveConcurrencyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, C> AdaptiveConcurrencyLayer<K, C> {
    /// The state of `key`'s limit (`Key::Global` for an unkeyed layer), `None` before its
    /// first request.
    pub fn snapshot(&self, key: &Key) -> Option<Snapshot> {
        self.shared.limiters.get(key).map(|l| l.snapshot())
    }

    /// The partition names, in the order they were declared (`["all"]` without partitions).
    pub fn partitions(&self) -> impl Iterator<Item = &str> {
        self.shared.partitions.names.iter().map(|n| &**n)
    }
}

impl<K, C> Clone for AdaptiveConcurrencyLayer<K, C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, C> fmt::Debug for AdaptiveConcurrencyLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveConcurrencyLayer")
            .field("name", &self.shared.name)
            .field("settings", &self.shared.settings)
            .field("partitions", &self.shared.partitions)
            .field("status", &self.shared.answer.status)
            .field("grpc", &self.shared.grpc)
            .field("keys", &self.shared.limiters.len())
            .finish_non_exhaustive()
    }
}

impl<S, K, C> Layer<S> for AdaptiveConcurrencyLayer<K, C> {
    type Service = AdaptiveConcurrency<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveConcurrency::new(inner, self.clone())
    }
}
