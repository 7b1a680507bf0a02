//! The running service: gRPC (`ShouldRateLimit` and `grpc.health.v1`), HTTP
//! (`/healthcheck`, `/json`), debug (`/rlconfig`, `/metrics`) and, when enabled, Prometheus
//! (`/metrics`), with hot reload of the config and a graceful shutdown.
//!
//! ```
//! use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
//! use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
//! use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
//! use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
//! use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
//! use ratekeeper_rls::Server;
//! use ratekeeper_rls::settings::Settings;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("rls-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(
//!     dir.join("api.yaml"),
//!     "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
//! )?;
//! let config = dir.display().to_string();
//! let args = ["ratekeeper-rls", "--config", &config, "--grpc", "127.0.0.1:0",
//!             "--http", "127.0.0.1:0", "--debug", "127.0.0.1:0"];
//! let (settings, _warnings) = Settings::parse(args, |_| None)?;
//! let server = Server::bind(settings).await?;
//!
//! let mut client =
//!     RateLimitServiceClient::connect(format!("http://{}", server.local_grpc_addr())).await?;
//! let request = RateLimitRequest {
//!     domain: "api".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "user".into(), value: "alice".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let first = client.should_rate_limit(request.clone()).await?.into_inner();
//! assert_eq!(first.overall_code, Code::Ok as i32);
//! let second = client.should_rate_limit(request).await?.into_inner();
//! assert_eq!(second.overall_code, Code::OverLimit as i32);
//!
//! server.shutdown().await;
//! std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use ratekeeper_core::clock::Clock;
use ratekeeper_core::store::redis::RedisStore;
use ratekeeper_core::store::tiered::TieredStore;
use ratekeeper_core::store::{FailurePolicy, MemoryStore};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;

use crate::clock::{SharedClock, UnixClock};
use crate::config::{RateLimitConfig, watch as config_watch};
use crate::http;
use crate::limiter::{Backend, Limiter};
use crate::service::{Options, RateLimiter, Shared};
use crate::settings::{Settings, StoreKind};
use crate::stats::{self, Stats};

pub use crate::settings::defaults::MEMORY_MAX_KEYS;

/// How often the gRPC health status is brought in line with the health check.
const HEALTH_EVERY: Duration = Duration::from_millis(500);

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The first config load failed (and `FORCE_START_WITHOUT_INITIAL_CONFIG` is off).
    #[error("the config did not load: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// The store could not be built or reached.
    #[error("the store is not available: {0}")]
    Store(#[from] ratekeeper_core::store::StoreError),
    /// The tiered store's settings are invalid.
    #[error("the tiered store's settings are invalid: {0}")]
    Tiered(#[from] ratekeeper_core::store::tiered::TieredConfigError),
    /// Redis settings are missing for a Redis store.
    #[error("the {0} store needs a Redis URL (--redis or REDIS_URL)")]
    NoRedis(StoreKind),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Builds a [`Server`] with what tests inject: a clock, the config polling interval.
pub struct ServerBuilder {
    settings: Settings,
    clock: Option<Arc<dyn Clock>>,
    local_clock: Option<Arc<dyn Clock>>,
    reload_interval: Duration,
    on_failure: FailurePolicy,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("settings", &self.settings)
            .field("injected_clock", &self.clock.is_some())
            .field("injected_local_clock", &self.local_clock.is_some())
            .field("reload_interval", &self.reload_interval)
            .field("on_failure", &self.on_failure)
            .finish()
    }
}

impl ServerBuilder {
    /// The clock of decisions and `duration_until_reset` (default: the system's wall clock,
    /// [`UnixClock`]). Its `now()` must be nanoseconds since the Unix epoch for windows to be
    /// epoch-aligned, as a [`ManualClock`](ratekeeper_core::clock::ManualClock) set to a
    /// Unix time is. With Redis it replaces Redis `TIME` too.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// This process's own clock, as a host clock that may be skewed (default: the system's
    /// wall clock, [`UnixClock`]; nanoseconds since the Unix epoch). It decides for the
    /// memory store; on Redis and the tiered store it only times the store's deadline,
    /// circuit breaker and stale guard: windows and resets stay on Redis `TIME`, so
    /// replicas whose clocks disagree still count in one window. [`clock`](Self::clock),
    /// when given, wins.
    pub fn local_clock(mut self, clock: impl Clock) -> Self {
        self.local_clock = Some(Arc::new(clock));
        self
    }

    /// What a Redis or tiered store does when it cannot decide within its deadline
    /// (default [`FailurePolicy::Allow`]):
    ///
    /// - `Allow`: the call fails with gRPC `UNAVAILABLE`, and Envoy's `failure_mode_deny`
    ///   decides (the reference's behaviour, answered within the deadline);
    /// - `Deny`: the call is answered, each descriptor the store could not decide
    ///   `OVER_LIMIT` (fail closed);
    /// - `Local` / `FailSoft`: the store decides in memory (the whole quota, or this
    ///   instance's share of it) until Redis is back;
    /// - `Degrade`: as `Allow`.
    ///
    /// This is the store's own policy: with `Allow` (the default) each limit then answers as
    /// its `on_store_failure` says (the settings' `ON_STORE_FAILURE` when it has none);
    /// `Deny` here refuses every limit whatever its own value. The limits whose
    /// `on_store_failure` is `fail_soft` go through a second handle on the same keys, built
    /// with [`FailurePolicy::FailSoft`] at start on every Redis or tiered store (so a rule
    /// that a later reload brings fails soft too, and every replica counts in the shares).
    ///
    /// Every failure counts `ratelimit_service_should_rate_limit_error{err_type="redis_error"}`.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }

    /// How often the config path is polled for changes (default 250 ms).
    pub fn reload_interval(mut self, interval: Duration) -> Self {
        self.reload_interval = interval;
        self
    }

    /// Builds the store, loads the config, binds every listener and starts serving.
    ///
    /// # Errors
    ///
    /// [`ServerError`]: the first config load failed, the store is unreachable, a port is
    /// taken.
    pub async fn bind(self) -> Result<Server, ServerError> {
        Server::start(self).await
    }
}

struct Tasks {
    handles: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    watcher: Option<config_watch::Watcher>,
}

/// A running rate limit service.
pub struct Server {
    shared: Arc<Shared>,
    serving: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    debug_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    tasks: Mutex<Option<Tasks>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .field("debug_addr", &self.debug_addr)
            .field("metrics_addr", &self.metrics_addr)
            .finish_non_exhaustive()
    }
}

async fn listen(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

async fn build_backend(
    settings: &Settings,
    clock: &SharedClock,
    injected: bool,
    local_injected: bool,
    on_failure: FailurePolicy,
) -> Result<(Backend, Option<RedisStore>), ServerError> {
    if settings.store == StoreKind::Memory {
        return Ok((
            Backend::Memory(
                MemoryStore::with_clock(clock.clone()).with_max_keys(settings.memory_max_keys),
            ),
            None,
        ));
    }
    let redis = settings
        .redis
        .as_ref()
        .ok_or(ServerError::NoRedis(settings.store))?;
    let urls = redis.connection_urls();
    let cluster = redis.cluster || settings.store == StoreKind::RedisCluster;
    let connect = |on_failure: FailurePolicy| {
        let mut builder = RedisStore::builder().prefix(if settings.cache_key_prefix.is_empty() {
            "rls".to_owned()
        } else {
            format!("rls:{}", settings.cache_key_prefix)
        });
        if let Some(deadline) = settings.store_timeout {
            builder = builder.deadline(deadline);
        }
        builder = builder.on_failure(on_failure);
        if injected {
            builder = builder.clock(clock.clone());
        } else if local_injected {
            builder = builder.app_clock(clock.clone());
        }
        let urls = &urls;
        async move {
            if cluster {
                let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
                builder.cluster(&nodes).await.map_err(ServerError::from)
            } else {
                let url = urls.first().ok_or(ServerError::NoRedis(settings.store))?;
                builder.standalone(url).await.map_err(ServerError::from)
            }
        }
    };
    let store = connect(on_failure).await?;
    // The handle of the limits that fail soft: the same keys, each replica's share of the
    // limit in memory while Redis is unreachable. Built whatever the config at start says:
    // a reload may bring a `fail_soft` rule, and every replica registers, so the share each
    // one enforces counts them all.
    let soft = Some(connect(FailurePolicy::FailSoft).await?);
    if settings.store == StoreKind::Tiered {
        let tiered = TieredStore::builder()
            .max_lease(settings.tiered_max_lease)
            .build(store)?;
        return Ok((Backend::Tiered(tiered), soft));
    }
    Ok((Backend::Redis(store), soft))
}

impl Server {
    /// A builder for `settings`, to inject a clock or a reload interval.
    pub fn builder(settings: Settings) -> ServerBuilder {
        ServerBuilder {
            settings,
            clock: None,
            local_clock: None,
            reload_interval: config_watch::DEFAULT_INTERVAL,
            on_failure: FailurePolicy::Allow,
        }
    }

    /// Starts the service with `settings` (port 0 picks a free port: read the local
    /// addresses back).
    ///
    /// # Errors
    ///
    /// See [`ServerBuilder::bind`].
    pub async fn bind(settings: Settings) -> Result<Server, ServerError> {
        Self::builder(settings).bind().await
    }

    async fn start(b: ServerBuilder) -> Result<Server, ServerError> {
        let settings = b.settings;
        let injected = b.clock.is_some();
        let local_injected = !injected && b.local_clock.is_some();
        let clock = SharedClock(
            b.clock
                .or(b.local_clock)
                .unwrap_or_else(|| Arc::new(UnixClock::new())),
        );
        let _ = stats::prometheus();
        let (backend, soft) =
            build_backend(&settings, &clock, injected, local_injected, b.on_failure).await?;
        let mut limiter = Limiter::new(backend, clock);
        if let Some(soft) = soft {
            limiter = limiter.with_fail_soft(soft);
        }
        let shared = Arc::new(Shared {
            config: ArcSwapOption::empty(),
            limiter,
            stats: Stats::default(),
            options: Options::from_settings(&settings),
            in_flight: AtomicUsize::new(0),
        });

        // Watch first, then load: a change in between is reported, not lost.
        let path = settings.config_path().to_path_buf();
        let reloaded = Arc::clone(&shared);
        let watcher = config_watch::watch(
            path.clone(),
            settings.load.clone(),
            b.reload_interval,
            move |result| match result {
                Ok(config) => {
                    reloaded.swap_config(config);
                    stats::config_load(true);
                    tracing::info!("config reloaded");
                }
                Err(e) => {
                    stats::config_load(false);
                    tracing::error!(error = %e, "config not reloaded; the previous one stays in force");
                }
            },
        );
        match RateLimitConfig::load_path(&path, &settings.load) {
            Ok(config) => {
                shared.swap_config(config);
                stats::config_load(true);
            }
            Err(e) if settings.force_start_without_initial_config => {
                stats::config_load(false);
                tracing::error!(error = %e, "starting without a config");
            }
            Err(e) => {
                stats::config_load(false);
                return Err(e.into());
            }
        }

        let grpc = listen(settings.grpc_addr).await?;
        let http_l = listen(settings.http_addr).await?;
        let debug_l = listen(settings.debug_addr).await?;
        let metrics_l = match &settings.metrics {
            Some(m) => Some((listen(m.addr).await?, m.path.clone())),
            None => None,
        };
        let addr = |l: &TcpListener, fallback: SocketAddr| l.local_addr().unwrap_or(fallback);
        let grpc_addr = addr(&grpc, settings.grpc_addr);
        let http_addr = addr(&http_l, settings.http_addr);
        let debug_addr = addr(&debug_l, settings.debug_addr);
        let metrics_addr = metrics_l
            .as_ref()
            .map(|(l, _)| addr(l, l.local_addr().unwrap_or(grpc_addr)));

        let serving = Arc::new(AtomicBool::new(true));
        let (health, health_service) = tonic_health::server::health_reporter();
        let (stop, stopped) = watch::channel(false);
        let health_state = http::Health {
            shared: Arc::clone(&shared),
            serving: Arc::clone(&serving),
            need_config: settings.healthy_with_at_least_one_config_loaded,
        };
        let status = if health_state.is_healthy() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", "ratelimit"] {
            health.set_service_status(name, status).await;
        }

        let mut handles = Vec::new();
        // gRPC health follows the HTTP health check (store reachable, config when required).
        let watched = health_state.clone();
        let reporter = health.clone();
        let mut health_stop = stopped.clone();
        handles.push(tokio::spawn(async move {
            let mut last = status;
            loop {
                tokio::select! {
                    _ = health_stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(HEALTH_EVERY) => {}
                }
                let now = if watched.is_healthy() {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                if now != last {
                    for name in ["", "ratelimit"] {
                        reporter.set_service_status(name, now).await;
                    }
                    last = now;
                }
            }
        }));
        let service = RateLimitServiceServer::new(RateLimiter {
            shared: Arc::clone(&shared),
        });
        let mut grpc_stop = stopped.clone();
        handles.push(tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(grpc);
            let result = tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = grpc_stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "the gRPC server stopped");
            }
        }));
        let routers = [
            Some((http_l, http::main_router(health_state.clone()))),
            Some((
                debug_l,
                http::debug_router(health_state.clone(), "/metrics"),
            )),
            metrics_l.map(|(l, path)| (l, http::metrics_router(&path))),
        ];
        for (listener, router) in routers.into_iter().flatten() {
            let mut stop_rx = stopped.clone();
            handles.push(tokio::spawn(async move {
                let result = axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    })
                    .await;
                if let Err(e) = result {
                    tracing::error!(error = %e, "an HTTP listener stopped");
                }
            }));
        }
        tracing::info!(
            %grpc_addr, %http_addr, %debug_addr, store = shared.limiter.kind(),
            "serving"
        );
        Ok(Server {
            shared,
            serving,
            health,
            grpc_addr,
            http_addr,
            debug_addr,
            metrics_addr,
            tasks: Mutex::new(Some(Tasks {
                handles,
                stop,
                watcher: Some(watcher),
            })),
        })
    }

    /// The gRPC listener's address (`ShouldRateLimit`, `grpc.health.v1.Health`).
    pub fn local_grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The HTTP listener's address (`GET /healthcheck`, `POST /json`).
    pub fn local_http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The debug listener's address (`GET /rlconfig`, `GET /metrics`).
    pub fn local_debug_addr(&self) -> SocketAddr {
        self.debug_addr
    }

    /// The Prometheus listener's address, when enabled.
    pub fn local_metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Whether the service reports itself healthy (`/healthcheck` answers 200).
    pub fn is_healthy(&self) -> bool {
        http::Health {
            shared: Arc::clone(&self.shared),
            serving: Arc::clone(&self.serving),
            need_config: false,
        }
        .is_healthy()
    }

    /// The `ShouldRateLimit` service this server answers with (same config, store and
    /// stats), to mount in a tonic server of your own:
    /// `RateLimitServiceServer::new(server.service())`.
    pub fn service(&self) -> RateLimiter {
        RateLimiter {
            shared: Arc::clone(&self.shared),
        }
    }

    /// `ShouldRateLimit` calls (gRPC and `/json`) being answered now.
    pub fn calls_in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Stops the service as on SIGTERM: health turns `NOT_SERVING` (gRPC health and
    /// `/healthcheck` 500) at once, listeners stop accepting, calls in flight finish, the
    /// config watcher stops, and a tiered store gives its leased units back. Returns when
    /// all of that is done; a second call returns at once.
    pub async fn shutdown(&self) {
        self.serving.store(false, Ordering::SeqCst);
        for name in ["", "ratelimit"] {
            self.health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(mut tasks) = tasks else {
            return;
        };
        let _ = tasks.stop.send(true);
        for handle in tasks.handles.drain(..) {
            let _ = handle.await;
        }
        if let Some(w) = tasks.watcher.take() {
            let _ = tokio::task::spawn_blocking(move || w.stop()).await;
        }
        self.shared.limiter.shutdown().await;
    }
}
