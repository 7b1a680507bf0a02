//! [`AdaptiveConcurrencyBuilder`]: the settings, partitions, key and answer of an adaptive
//! concurrency limit, checked when the layer is built (the layer itself is assembled by the
//! `concurrency` module, which adaptive limits plug into).

use std::fmt;
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use http::StatusCode;
use ratekeeper_core::clock::{Clock, MonotonicClock};

use super::controller::ControllerSettings;
use super::partition::{Classify, Partitions, Unclassified};
use super::state::{Adaptive, Answer};
use crate::BuildError;
use crate::key::{GlobalKey, KeyExtractor};

/// The `Retry-After` of a refusal when none is set: 1 s, the smallest the header can say.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Builds an adaptive [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer)
/// (made by
/// [`ConcurrencyLimitLayer::adaptive`](crate::concurrency::ConcurrencyLimitLayer::adaptive));
/// [`build`](Self::build) checks the settings.
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
    pub(crate) fn new() -> Self {
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
    /// keys share one overflow limit, counted in [`ADAPTIVE_OVERFLOW_TOTAL`](crate::metrics::ADAPTIVE_OVERFLOW_TOTAL).
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

    /// The settings checked, as [`build`](Self::build) builds the layer from them: its key
    /// extractor and limit.
    pub(crate) fn check(self) -> Result<(K, Adaptive<C>), BuildError>
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

    fn finish(self) -> (K, Adaptive<C>) {
        let partitions = Partitions::new(&self.partitions);
        let answer = Answer::new(self.status, self.retry_after, &self.name, &partitions);
        let seed = std::hash::RandomState::new().build_hasher();
        let mut seed = seed;
        self.name.hash(&mut seed);
        (
            self.key,
            Adaptive {
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
            },
        )
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
