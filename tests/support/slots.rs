//! One app instance for the shared concurrency tests: its own Redis store (own connection),
//! its own keyed concurrency layer over `RedisStore::slots`, keyed by `x-merchant`, and a slow
//! handler that tracks the requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratekeeper_axum::concurrency::ConcurrencyLimitLayer;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::key::HeaderKey;

/// Where the instances' Redis is.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A standalone server's URL.
    Standalone(String),
    /// The Cluster nodes' URLs.
    Cluster(Vec<String>),
}

impl Backend {
    /// `standalone <url>` or `cluster <url,url,...>` (the helper binary's arguments).
    pub fn to_args(&self) -> [String; 2] {
        match self {
            Self::Standalone(url) => ["standalone".to_owned(), url.clone()],
            Self::Cluster(urls) => ["cluster".to_owned(), urls.join(",")],
        }
    }

    /// The inverse of [`Backend::to_args`].
    pub fn from_args(kind: &str, urls: &str) -> Option<Self> {
        match kind {
            "standalone" => Some(Self::Standalone(urls.to_owned())),
            "cluster" => Some(Self::Cluster(urls.split(',').map(str::to_owned).collect())),
            _ => None,
        }
    }

    /// A new store with its own connection.
    ///
    /// # Panics
    ///
    /// When Redis cannot be reached (a test environment failure).
    pub async fn store(&self, prefix: &str) -> RedisStore {
        let builder = RedisStore::builder()
            .prefix(prefix)
            .deadline(Duration::from_secs(2));
        match self {
            Self::Standalone(url) => builder.standalone(url).await.expect("redis standalone"),
            Self::Cluster(urls) => {
                let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
                builder.cluster(&nodes).await.expect("redis cluster")
            }
        }
    }
}

/// Requests in flight in the handlers sharing this gauge, and the most ever seen.
#[derive(Debug, Default)]
pub struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    /// The most requests that were ever in flight at once.
    pub fn max_seen(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// Requests in flight now.
    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The app of one instance: at most `max` requests in flight per `x-merchant` across every
/// instance on the same Redis and `prefix`, slots leased for `lease` (`Duration::ZERO`: the
/// default lease of `RedisSlots`); the handler holds each request `hold` and counts it in
/// `gauge`.
pub async fn instance(
    backend: &Backend,
    prefix: &str,
    max: u32,
    lease: Duration,
    hold: Duration,
    gauge: Arc<InFlight>,
) -> Router {
    let store = backend.store(prefix).await;
    let slots = if lease.is_zero() {
        store.slots()
    } else {
        store.slots().lease(lease)
    };
    let limit = std::num::NonZeroU32::new(max).expect("max > 0");
    Router::new()
        .route(
            "/",
            get(move || {
                let gauge = Arc::clone(&gauge);
                async move {
                    gauge.enter();
                    tokio::time::sleep(hold).await;
                    gauge.leave();
                    "done"
                }
            }),
        )
        .layer(
            ConcurrencyLimitLayer::new(limit)
                // A merchant id is no secret: keyed as it is (the tests read slot sets
                // by its name).
                .key(HeaderKey::raw("x-merchant").in_clear())
                .shared(slots),
        )
}
