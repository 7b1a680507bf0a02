//! [`Adaptive`]: the adaptive limit as a [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)
//! counts it (one limiter per key, the refusal rendered once), and its metric names. The
//! builder is in [`builder`](super::builder), a key's limiter and its permits in
//! [`limiter`](super::limiter).

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

use super::controller::ControllerSettings;
use super::limiter::{Gauges, Limiter, Permit, Snapshot};
use super::partition::{Partitions, Unclassified};
use crate::headers::GRPC_MESSAGE;
use crate::metrics::{
    ADAPTIVE_IN_FLIGHT, ADAPTIVE_LATENCY_SECONDS, ADAPTIVE_LIMIT, ADAPTIVE_MIN_LATENCY_SECONDS,
    ADAPTIVE_OVERFLOW_TOTAL, ADAPTIVE_REQUESTS_TOTAL,
};
use crate::report::trailers_only;

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
    let title = status.canonical_reason().unwrap_or("Service Unavailable");
    let body = if status == StatusCode::TOO_MANY_REQUESTS {
        crate::report::json::problem(
            crate::report::QUOTA_EXCEEDED_TYPE,
            title,
            status.as_u16(),
            &detail,
            Some(&[name]),
        )
    } else {
        crate::report::json::problem(
            TEMPORARY_REDUCED_CAPACITY_TYPE,
            title,
            status.as_u16(),
            &detail,
            None,
        )
    };
    Bytes::from(body)
}

use crate::report::TEMPORARY_REDUCED_CAPACITY_TYPE;

/// The limit of an adaptive [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)
/// (its [`Limit`](crate::concurrency::Limit), made by [`AdaptiveConcurrencyBuilder::build`](super::AdaptiveConcurrencyBuilder::build)):
/// one limiter per key, found from latency, with the partitions that `C` puts requests into.
/// Every service the layer builds, and their clones, share it.
pub struct Adaptive<C = Unclassified> {
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

impl<C> Adaptive<C> {
    /// The limiter of `key`: its own, or the overflow limiter once `max_keys` keys have one.
    pub(crate) fn limiter(&self, key: &Key) -> Arc<Limiter> {
        if let Some(l) = self.limiters.get(key) {
            return Arc::clone(&l);
        }
        if self.limiters.len() >= self.max_keys {
            self.overflow_counter
                .get_or_init(
                    || metrics::counter!(ADAPTIVE_OVERFLOW_TOTAL, "name" => self.name.to_string()),
                )
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
            limit: metrics::gauge!(ADAPTIVE_LIMIT, &labels),
            in_flight: metrics::gauge!(ADAPTIVE_IN_FLIGHT, &labels),
            latency: metrics::gauge!(ADAPTIVE_LATENCY_SECONDS, &labels),
            min_latency: metrics::gauge!(ADAPTIVE_MIN_LATENCY_SECONDS, &labels),
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
                    ADAPTIVE_REQUESTS_TOTAL,
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

impl<C> Adaptive<C> {
    /// The state of `key`'s limit, `None` before its first request.
    pub(crate) fn snapshot(&self, key: &Key) -> Option<Snapshot> {
        self.limiters.get(key).map(|l| l.snapshot())
    }

    /// The answer to a request of `partition` over the limit, in the form `req` reads.
    pub(crate) fn refusal<B>(
        &self,
        partition: usize,
        req: &http::Request<B>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let answer = &self.answer;
        let mut headers = answer.headers.clone();
        let body = answer.bodies.get(partition).cloned().unwrap_or_default();
        let grpc = if self.grpc {
            crate::report::grpc_content_type(req.version(), req.headers())
        } else {
            None
        };
        let Some(content_type) = grpc else {
            return (answer.status, headers, body);
        };
        let (status, body) = trailers_only(
            answer.status,
            &mut headers,
            &body,
            Some(&self.name),
            content_type,
        );
        if answer.status != StatusCode::TOO_MANY_REQUESTS {
            // UNAVAILABLE: say why, rather than the fail-closed store text.
            let message = format!(
                "server overloaded; retry after {} s",
                answer.retry_after_secs
            );
            if let Ok(v) = HeaderValue::try_from(message) {
                headers.insert(GRPC_MESSAGE, v);
            }
        }
        (status, headers, body)
    }
}

impl<C> fmt::Debug for Adaptive<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adaptive")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("partitions", &self.partitions)
            .field("status", &self.answer.status)
            .field("grpc", &self.grpc)
            .field("keys", &self.limiters.len())
            .finish_non_exhaustive()
    }
}
