use std::fmt;
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use metrics::{Counter, Gauge};
use ratekeeper_core::Key;
use ratekeeper_core::clock::{Clock, MonotonicClock};
use tower_layer::Layer;

use super::AdaptiveConcurrency;
use super::controller::{ControllerSettings, GradientController, LimitChange};
use super::partition::{Classify, InFlight, Partitions, Unclassified};
use crate::BuildError;
use crate::key::{GlobalKey, KeyExtractor};

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

/// The `Retry-After` of a refusal when none is set: 1 s, the smallest the header can say.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One key's limit: the controller and the requests in flight, behind one lock, and its
/// gauges.
pub(crate) struct Limiter {
    state: Mutex<State>,
    gauges: Gauges,
}

struct State {
    controller: GradientController,
    in_flight: InFlight,
}

struct Gauges {
    limit: Gauge,
    in_flight: Gauge,
    latency: Gauge,
    min_latency: Gauge,
}

/// What the layer admitted: released (and counted out of the partition) on drop.
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    partition: usize,
    started: u64,
    in_flight: u32,
    name: Arc<str>,
}

impl Limiter {
    fn new(
        settings: ControllerSettings,
        seed: u64,
        now: u64,
        partitions: usize,
        gauges: Gauges,
    ) -> Self {
        let controller = GradientController::new(settings, seed, now);
        gauges.limit.set(f64::from(controller.limit()));
        Self {
            state: Mutex::new(State {
                controller,
                in_flight: InFlight::new(partitions),
            }),
            gauges,
        }
    }

    /// A poisoned lock only means a panic elsewhere while it was held; the state is still
    /// consistent (every update is a few plain assignments), so it is used as it is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_admit(
        self: &Arc<Self>,
        partition: usize,
        partitions: &Partitions,
        now: u64,
        name: &Arc<str>,
    ) -> Option<Permit> {
        let mut state = self.lock();
        let change = state.controller.tick(now);
        let limit = state.controller.limit();
        let admitted = state.in_flight.try_admit(partition, limit, partitions, now);
        let in_flight = state.in_flight.total;
        drop(state);
        if let Some(change) = change {
            self.report_change(change, name, None);
        }
        if !admitted {
            return None;
        }
        self.gauges.in_flight.set(f64::from(in_flight));
        Some(Permit {
            limiter: Arc::clone(self),
            partition,
            started: now,
            in_flight,
            name: Arc::clone(name),
        })
    }

    fn report_change(&self, change: LimitChange, name: &str, latency: Option<(u64, Option<u64>)>) {
        self.gauges.limit.set(f64::from(change.to));
        let (latency_ms, min_latency_ms) = match latency {
            Some((l, m)) => (l as f64 / 1e6, m.map_or(f64::NAN, |m| m as f64 / 1e6)),
            None => (f64::NAN, f64::NAN),
        };
        tracing::debug!(
            name,
            from = change.from,
            to = change.to,
            latency_ms,
            min_latency_ms,
            "adaptive concurrency limit changed"
        );
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            limit: state.controller.limit(),
            in_flight: state.in_flight.total,
            in_flight_by_partition: state.in_flight.by_partition.to_vec(),
            min_latency: state.controller.min_rtt_ns().map(Duration::from_nanos),
            latency: state.controller.sample_rtt_ns().map(Duration::from_nanos),
            measuring: state.controller.is_measuring(),
        }
    }
}

impl Permit {
    /// Records the request's latency (admission to response at `now`, ns).
    pub(crate) fn sample(&self, now: u64) {
        let latency = now.saturating_sub(self.started);
        let mut state = self.limiter.lock();
        let change = state
            .controller
            .sample(latency, self.started, self.in_flight, now);
        let estimate = state.controller.sample_rtt_ns();
        let min = state.controller.min_rtt_ns();
        drop(state);
        if let Some(change) = change {
            let g = &self.limiter.gauges;
            if let Some(e) = estimate {
                g.latency.set(e as f64 / 1e9);
            }
            if let Some(m) = min {
                g.min_latency.set(m as f64 / 1e9);
            }
            self.limiter
                .report_change(change, &self.name, estimate.map(|e| (e, min)));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        state.in_flight.release(self.partition);
        let total = state.in_flight.total;
        drop(state);
        self.limiter.gauges.in_flight.set(f64::from(total));
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("partition", &self.partition)
            .field("started_ns", &self.started)
            .finish_non_exhaustive()
    }
}

/// The state of one key's limit, from [`AdaptiveConcurrencyLayer::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Requests that may be in flight now.
    pub limit: u32,
    /// Requests in flight now (admitted, response body not ended).
    pub in_flight: u32,
    /// Requests in flight per partition, in the order the partitions were declared.
    pub in_flight_by_partition: Vec<u32>,
    /// The measured minimum latency, once measured.
    pub min_latency: Option<Duration>,
    /// The latency estimate of the last update interval that had requests.
    pub latency: Option<Duration>,
    /// Whether the minimum latency is being measured (the limit is then the lowest).
    pub measuring: bool,
}

/// The refusal a layer answers with, rendered once.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) retry_after_secs: u64,
    pub(crate) headers: HeaderMap,
    /// Per partition: the problem+json body.
    pub(crate) bodies: Box<[Bytes]>,
}

impl Answer {
    fn new(status: StatusCode, retry_after: Duration, name: &str, partitions: &Partitions) -> Self {
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

/// The problem type of a 503 refusal (IANA HTTP problem types).
pub const TEMPORARY_REDUCED_CAPACITY_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

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
    settings: ControllerSettings,
    limiters: DashMap<Key, Arc<Limiter>, foldhash::fast::RandomState>,
    overflow: OnceLock<Arc<Limiter>>,
    max_keys: usize,
    seed: AtomicU64,
    /// Per partition: `[admitted, shed]`.
    counters: Box<[[OnceLock<Counter>; 2]]>,
    overflow_counter: OnceLock<Counter>,
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

/// Builds an [`AdaptiveConcurrencyLayer`]; [`build`](Self::build) checks the settings.
pub struct AdaptiveConcurrencyBuilder<K = GlobalKey, C = Unclassified> {
    key: K,
    classify: C,
    settings: ControllerSettings,
    partitions: Vec<(Box<str>, f64)>,
    status: StatusCode,
    retry_after: Duration,
    clock: Arc<dyn Clock>,
    name: Box<str>,
    max_keys: usize,
    grpc: bool,
}

impl AdaptiveConcurrencyBuilder {
    fn new() -> Self {
        Self {
            key: GlobalKey,
            classify: Unclassified,
            settings: ControllerSettings::default(),
            partitions: Vec::new(),
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: DEFAULT_RETRY_AFTER,
            clock: Arc::new(MonotonicClock::new()),
            name: "adaptive".into(),
            max_keys: 1024,
            grpc: false,
        }
    }
}

impl<K, C> AdaptiveConcurrencyBuilder<K, C> {
    /// Every controller setting at once (see [`ControllerSettings`]).
    pub fn controller(mut self, settings: ControllerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The lowest limit, also the limit while the minimum latency is measured (default 3).
    pub fn min_limit(mut self, n: u32) -> Self {
        self.settings.min_limit = n;
        self
    }

    /// The highest limit (default 1000).
    pub fn max_limit(mut self, n: u32) -> Self {
        self.settings.max_limit = n;
        self
    }

    /// The limit before the first update (default 20).
    pub fn initial_limit(mut self, n: u32) -> Self {
        self.settings.initial_limit = n;
        self
    }

    /// Adds a priority partition with a guaranteed `share` of the limit, in `(0, 1]`; the
    /// shares of all partitions add up to at most 1 (what is left is shared by whoever
    /// comes first). Declare the most important partition first: a request whose
    /// [`Classify`] name matches no partition goes to the last one.
    pub fn partition(mut self, name: &str, share: f64) -> Self {
        self.partitions.push((name.into(), share));
        self
    }

    /// Sets the classifier that puts each request into a partition (a closure over a
    /// [`RequestParts`](crate::RequestParts) returning a partition name).
    pub fn classify<C2: Classify>(self, classify: C2) -> AdaptiveConcurrencyBuilder<K, C2> {
        AdaptiveConcurrencyBuilder {
            key: self.key,
            classify,
            settings: self.settings,
            partitions: self.partitions,
            status: self.status,
            retry_after: self.retry_after,
            clock: self.clock,
            name: self.name,
            max_keys: self.max_keys,
            grpc: self.grpc,
        }
    }

    /// Keeps one limit per key (a route, a downstream, a tenant) instead of one for every
    /// request. Key values become the `key` label of the gauges, so key by something with
    /// few values, not by client IP.
    pub fn key<K2>(self, key: K2) -> AdaptiveConcurrencyBuilder<K2, C> {
        AdaptiveConcurrencyBuilder {
            key,
            classify: self.classify,
            settings: self.settings,
            partitions: self.partitions,
            status: self.status,
            retry_after: self.retry_after,
            clock: self.clock,
            name: self.name,
            max_keys: self.max_keys,
            grpc: self.grpc,
        }
    }

    /// Most keys with a limit of their own (default 1024, at least 1); requests of further
    /// keys share one overflow limit, counted in [`OVERFLOW_TOTAL`].
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// Answers refusals with `429 Too Many Requests` (gRPC `RESOURCE_EXHAUSTED`) instead of
    /// `503 Service Unavailable` (gRPC `UNAVAILABLE`).
    pub fn too_many_requests(mut self) -> Self {
        self.status = StatusCode::TOO_MANY_REQUESTS;
        self
    }

    /// Whether this layer serves gRPC (tonic, gRPC-Web): a refused gRPC call then gets a
    /// trailers-only gRPC answer (HTTP `200 OK`, `grpc-status: 14` `UNAVAILABLE`, or `8`
    /// `RESOURCE_EXHAUSTED` with [`too_many_requests`](Self::too_many_requests)) instead of
    /// an HTTP status. A gRPC call is `content-type: application/grpc` (or
    /// `application/grpc+<format>`) on an HTTP/2 request, or a gRPC-Web content type on any
    /// HTTP version. Default `false`: every refusal is an HTTP status, whatever the
    /// request's `content-type` says.
    pub fn grpc(mut self, on: bool) -> Self {
        self.grpc = on;
        self
    }

    /// The `Retry-After` of a refusal, rounded up to whole seconds, at least 1 (default 1 s).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// The clock latencies are measured on (default [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The layer's name: the `name` label of its metrics, the policy named in a 429
    /// (default `"adaptive"`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] naming the field: a controller setting out of range (see
    /// [`ControllerSettings::validate`]), a partition share outside `(0, 1]`, shares adding
    /// up to more than 1, an empty or repeated partition name, `max_keys` of 0, or an empty
    /// name; or the key extractor's own error ([`KeyExtractor::check`]).
    pub fn build(self) -> Result<AdaptiveConcurrencyLayer<K, C>, BuildError>
    where
        K: KeyExtractor,
    {
        self.key.check()?;
        self.settings.validate()?;
        let err = |field: &str, message: String| BuildError::Config {
            field: format!("adaptive.{field}"),
            message,
        };
        let mut sum = 0.0;
        for (i, (name, share)) in self.partitions.iter().enumerate() {
            if name.is_empty() {
                return Err(err("partition", "a partition needs a name".into()));
            }
            if self.partitions[..i].iter().any(|(n, _)| n == name) {
                return Err(err("partition", format!("{name:?} is declared twice")));
            }
            if !(*share > 0.0 && *share <= 1.0) {
                return Err(err(
                    "partition",
                    format!("the share of {name:?}, {share}, is outside (0, 1]"),
                ));
            }
            sum += share;
        }
        if sum > 1.0 + 1e-9 {
            return Err(err(
                "partition",
                format!("the shares add up to {sum}, more than 1"),
            ));
        }
        if self.max_keys == 0 {
            return Err(err("max_keys", "must be at least 1".into()));
        }
        if self.name.is_empty() {
            return Err(err("name", "must not be empty".into()));
        }
        Ok(self.finish())
    }

    fn finish(self) -> AdaptiveConcurrencyLayer<K, C> {
        let partitions = Partitions::new(&self.partitions);
        let answer = Answer::new(self.status, self.retry_after, &self.name, &partitions);
        let seed = std::hash::RandomState::new().build_hasher();
        let mut seed = seed;
        self.name.hash(&mut seed);
        AdaptiveConcurrencyLayer {
            shared: Arc::new(Shared {
                key: self.key,
                classify: self.classify,
                counters: (0..partitions.len()).map(|_| Default::default()).collect(),
                partitions,
                answer,
                clock: self.clock,
                name: Arc::from(&*self.name),
                grpc: self.grpc,
                settings: self.settings,
                limiters: DashMap::default(),
                overflow: OnceLock::new(),
                max_keys: self.max_keys,
                seed: AtomicU64::new(seed.finish()),
                overflow_counter: OnceLock::new(),
            }),
        }
    }
}

impl<K, C> fmt::Debug for AdaptiveConcurrencyBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveConcurrencyBuilder")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("partitions", &self.partitions)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}
