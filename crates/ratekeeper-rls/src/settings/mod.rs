//! The service's settings: command-line flags and envoyproxy/ratelimit's environment
//! variables, so that its manifests (Istio's sample, Helm values) work unchanged.
//!
//! A flag wins over the environment; the environment wins over the defaults, which are the
//! reference's (gRPC on `0.0.0.0:8081`, HTTP on `0.0.0.0:8080`, debug on `0.0.0.0:6070`,
//! Prometheus on `:9090` when enabled, config in
//! `/srv/runtime_data/current/config`).
//!
//! ```
//! use ratekeeper_rls::settings::{Settings, StoreKind};
//!
//! // Istio's sample (samples/ratelimit/rate-limit-service.yaml).
//! let env = |name: &str| match name {
//!     "LOG_LEVEL" => Some("debug".to_owned()),
//!     "REDIS_SOCKET_TYPE" => Some("tcp".to_owned()),
//!     "REDIS_URL" => Some("redis.default.svc:6379".to_owned()),
//!     "USE_STATSD" => Some("false".to_owned()),
//!     "RUNTIME_ROOT" => Some("/data".to_owned()),
//!     "RUNTIME_SUBDIRECTORY" => Some("ratelimit".to_owned()),
//!     "RUNTIME_WATCH_ROOT" => Some("false".to_owned()),
//!     "RUNTIME_IGNOREDOTFILES" => Some("true".to_owned()),
//!     "HOST" | "GRPC_HOST" => Some("::".to_owned()),
//!     _ => None,
//! };
//! let (settings, warnings) = Settings::parse(["ratekeeper-rls"], env)?;
//! assert_eq!(settings.config_path(), std::path::Path::new("/data/ratelimit/config"));
//! assert_eq!(settings.store, StoreKind::Redis);
//! assert_eq!(settings.grpc_addr.to_string(), "[::]:8081");
//! assert!(warnings.is_empty());
//! # Ok::<(), ratekeeper_rls::settings::SettingsError>(())
//! ```
//!
//! # Environment variables
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` | `/srv/runtime_data/current`, empty, `config` | the config directory is `ROOT/SUBDIRECTORY/APPDIRECTORY` (`--config`) |
//! | `RUNTIME_WATCH_ROOT` | `true` | accepted; the watcher follows symbolic links, so a swap of the root and a change inside the directory both reload |
//! | `RUNTIME_IGNOREDOTFILES` | `false` | skip files whose name starts with `.` |
//! | `MERGE_DOMAIN_CONFIG` | `false` | merge files that share a domain (`--merge-domains`) |
//! | `GRPC_HOST`, `GRPC_PORT` | `0.0.0.0`, `8081` | gRPC listener (`--grpc`) |
//! | `HOST`, `PORT` | `0.0.0.0`, `8080` | HTTP listener: `/healthcheck`, `/json` (`--http`) |
//! | `DEBUG_HOST`, `DEBUG_PORT` | `0.0.0.0`, `6070` | debug listener: `/rlconfig` (`--debug`) |
//! | `USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH` | `false`, `:9090`, `/metrics` | Prometheus endpoint (`--metrics`) |
//! | `BACKEND_TYPE` | see below | `redis`; `memcache` is refused |
//! | `REDIS_URL`, `REDIS_SOCKET_TYPE`, `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS` | | the Redis store (`--redis`); `REDIS_TYPE` is `single` or `cluster` (`sentinel` is refused) |
//! | `MEMORY_MAX_KEYS` (extension) | `1048576` | the memory store's most counters per limit; past it new counters share one overflow counter under the same limit, counted by `ratekeeper_memory_store_overflowed_total{policy}` (`--max-keys`) |
//! | `TIERED_MAX_LEASE` (extension) | `100` | with `--store tiered`: the most units a replica leases ahead per counter; `R` replicas admit at most `requests_per_unit + R × TIERED_MAX_LEASE` per window |
//! | `REDIS_TIMEOUT` | the store's default | the store's deadline per call, a Go duration (`--store-timeout`) |
//! | `ON_STORE_FAILURE` (extension) | `unavailable` | what a limit without its own `on_store_failure` answers when the store cannot decide: `unavailable`, `allow`, `deny` or `fail_soft` (`--on-store-failure`) |
//! | `SHADOW_MODE`, `QUOTA_MODE` | `false` | global shadow / quota mode |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED`, `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` | `false`, `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` | response headers |
//! | `LIMIT_RESPONSE_HEADERS_FORMAT` (extension) | `reference` | with headers enabled: `reference` (the three above), `ietf` (`RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-11) or `both` (`--response-headers-format`) |
//! | `OVER_LIMIT_PROBLEM_DETAILS` (extension) | `false` | on `OVER_LIMIT`, an RFC 9457 `application/problem+json` body (`quota-exceeded`) in `raw_body` (`--problem-details`) |
//! | `RESPONSE_DYNAMIC_METADATA` | `false` | dynamic metadata in responses |
//! | `NEAR_LIMIT_RATIO` | `0.8` | the `near_limit` stat's threshold |
//! | `CACHE_KEY_PREFIX` | empty | prefix of store keys |
//! | `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` | `false` | do not charge a descriptor when the request is refused |
//! | `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` | `false` | unhealthy until a config with a domain is loaded |
//! | `FORCE_START_WITHOUT_INITIAL_CONFIG` | `false` | start even when the first load fails |
//! | `LOG_LEVEL`, `LOG_FORMAT` | `warn`, `text` | logging (`--log-level`, `--log-format`) |
//!
//! **The store.** The reference always uses Redis (its `REDIS_URL` defaults to a Unix socket).
//! Here the store is Redis when `--store`/`BACKEND_TYPE` says so or when `REDIS_URL` (or
//! `--redis`) is set, and the in-process memory store otherwise (one replica's counters).
//! `REDIS_SOCKET_TYPE` unset means `unix` for a URL that starts with `/` and `tcp` otherwise
//! (the reference assumes `unix`).
//!
//! Booleans read as Go's `strconv.ParseBool` (`1 t T TRUE true True`, `0 f F FALSE false
//! False`); an empty variable counts as unset. A bad value is a [`SettingsError`] naming the
//! variable. Variables only the Go server knows (`USE_STATSD=true`, `STATSD_HOST`,
//! `REDIS_POOL_SIZE`, ...) give a warning and are ignored; those whose absence would change
//! what the service does (`CONFIG_TYPE=GRPC_XDS_SOTW`, `BACKEND_TYPE=memcache`,
//! `REDIS_TYPE=sentinel`, `GRPC_UDS`, `GRPC_SERVER_USE_TLS=true`) are errors.

mod cli;
pub(crate) mod defaults;
mod env;
mod error;
mod ignored;
mod redis;
mod values;
mod vars;

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::LoadOptions;

pub use error::SettingsError;

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreKind {
    /// In-process memory: counters are per replica.
    Memory,
    /// One Redis server (`REDIS_TYPE=single`).
    Redis,
    /// A Redis Cluster (`REDIS_TYPE=cluster`).
    RedisCluster,
    /// Redis with an in-process cache in front.
    Tiered,
}

impl StoreKind {
    /// The flag's spelling: `memory`, `redis`, `redis-cluster`, `tiered`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::Tiered => "tiered",
        }
    }

    /// Whether this store needs Redis settings.
    pub fn uses_redis(self) -> bool {
        !matches!(self, StoreKind::Memory)
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to reach Redis. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSettings {
    /// Server URLs without credentials: `redis://host:port`, `rediss://host:port` (TLS) or
    /// `redis+unix:///path`; several for a cluster's seed nodes.
    pub urls: Vec<String>,
    /// `REDIS_TYPE=cluster` or `--store redis-cluster`.
    pub cluster: bool,
    /// The user name (`REDIS_AUTH=user:password`, or in the URL).
    pub username: Option<String>,
    password: Option<String>,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("urls", &self.urls)
            .field("cluster", &self.cluster)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl RedisSettings {
    /// The password (`REDIS_AUTH`, or in the URL). A credential: never log it.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The URLs with the credentials in them, for a Redis client. Never log these.
    pub fn connection_urls(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|url| redis::with_credentials(url, self.username.as_deref(), self.password()))
            .collect()
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Listen address (`PROMETHEUS_ADDR`, default `:9090`).
    pub addr: SocketAddr,
    /// Path (`PROMETHEUS_PATH`, default `/metrics`).
    pub path: String,
}

/// The names of the response headers (`LIMIT_*_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeaderNames {
    /// Default `RateLimit-Limit`.
    pub limit: String,
    /// Default `RateLimit-Remaining`.
    pub remaining: String,
    /// Default `RateLimit-Reset`.
    pub reset: String,
}

/// Which rate-limit headers a response carries when headers are enabled
/// (`LIMIT_RESPONSE_HEADERS_FORMAT`, an extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderFormat {
    /// The reference's three headers, named by `LIMIT_*_HEADER` (the default).
    #[default]
    Reference,
    /// `RateLimit-Policy: "<name>";q=<limit>;w=<period s>` and
    /// `RateLimit: "<name>";r=<remaining>;t=<reset s>`, draft-ietf-httpapi-ratelimit-headers-11.
    Ietf,
    /// Both sets.
    Both,
}

impl HeaderFormat {
    /// Whether the reference's three headers are sent.
    pub fn reference(self) -> bool {
        matches!(self, Self::Reference | Self::Both)
    }

    /// Whether the IETF draft's two fields are sent.
    pub fn ietf(self) -> bool {
        matches!(self, Self::Ietf | Self::Both)
    }
}

/// The log level (`LOG_LEVEL`; the reference's logrus levels `panic` and `fatal` read as
/// `error`, `warning` as `warn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors (the default).
    Warn,
    /// Information.
    Info,
    /// Debugging.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The lower-case name, as `tracing` filters take it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The log line format (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable text (the default).
    Text,
    /// One JSON object per line.
    Json,
}

/// Everything the service reads at start-up.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// The config file or directory.
    pub config: PathBuf,
    /// `--validate`: check the config and exit.
    pub validate: bool,
    /// How the config files are read.
    pub load: LoadOptions,
    /// gRPC listener.
    pub grpc_addr: SocketAddr,
    /// HTTP listener (`/healthcheck`, `/json`).
    pub http_addr: SocketAddr,
    /// Debug listener (`/rlconfig`).
    pub debug_addr: SocketAddr,
    /// The Prometheus endpoint, when enabled.
    pub metrics: Option<MetricsSettings>,
    /// Where counters live.
    pub store: StoreKind,
    /// Redis, when the store uses it.
    pub redis: Option<RedisSettings>,
    /// The store's deadline per call (`REDIS_TIMEOUT`); `None`: the store's default.
    pub store_timeout: Option<Duration>,
    /// The tiered store's most units held per (limit, counter) by one replica
    /// (`TIERED_MAX_LEASE`, an extension; default 100). A fleet of `R` replicas on the
    /// tiered store admits at most `requests_per_unit + R × max_lease` per window.
    pub tiered_max_lease: std::num::NonZeroU32,
    /// The most counters the memory store holds per (limit, period, algorithm)
    /// (`MEMORY_MAX_KEYS` / `--max-keys`, an extension; default 2^20). Past it, idle
    /// counters are evicted, and new ones share one overflow counter under the same limit
    /// while every counter held is live (never unlimited); each decision on it counts
    /// `ratekeeper_memory_store_overflowed_total{policy}`.
    pub memory_max_keys: std::num::NonZeroUsize,
    /// What a limit without its own `on_store_failure` answers when the store fails
    /// (`ON_STORE_FAILURE`, an extension; default
    /// [`OnStoreFailure::Unavailable`](crate::config::OnStoreFailure::Unavailable)).
    pub on_store_failure: crate::config::OnStoreFailure,
    /// Global shadow mode (`SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Global quota mode (`QUOTA_MODE`).
    pub quota_mode: bool,
    /// Response headers, when enabled (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub response_headers: Option<ResponseHeaderNames>,
    /// Which headers, when [`Settings::response_headers`] enables them
    /// (`LIMIT_RESPONSE_HEADERS_FORMAT`, an extension).
    pub response_headers_format: HeaderFormat,
    /// On `OVER_LIMIT`, an RFC 9457 problem+json `raw_body` (`OVER_LIMIT_PROBLEM_DETAILS`, an
    /// extension).
    pub problem_details: bool,
    /// Dynamic metadata in responses (`RESPONSE_DYNAMIC_METADATA`).
    pub response_dynamic_metadata: bool,
    /// The `near_limit` threshold, a ratio in (0, 1] (`NEAR_LIMIT_RATIO`, default 0.8).
    pub near_limit_ratio: f32,
    /// Prefix of store keys (`CACHE_KEY_PREFIX`).
    pub cache_key_prefix: String,
    /// Do not charge descriptors of a refused request
    /// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub stop_increment_when_over_limit: bool,
    /// Unhealthy until a config with at least one domain is loaded
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_with_at_least_one_config_loaded: bool,
    /// Start even when the first config load fails (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub force_start_without_initial_config: bool,
    /// Log level.
    pub log_level: LogLevel,
    /// Log format.
    pub log_format: LogFormat,
}

impl Settings {
    /// Reads the flags (`args`, program name first) and the environment (`env` looks a
    /// variable up: `|name| std::env::var(name).ok()` in the binary). Returns the settings and
    /// warnings to log (ignored variables).
    ///
    /// # Errors
    ///
    /// [`SettingsError`]: `--help`/`--version` (its text, to print), a bad flag, a bad value
    /// (naming the flag or variable), an unsupported mode, a Redis store without URL.
    pub fn parse<I, T>(
        args: I,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Settings, Vec<String>), SettingsError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        env::parse(args, env)
    }

    /// The config file or directory.
    pub fn config_path(&self) -> &Path {
        &self.config
    }
}
