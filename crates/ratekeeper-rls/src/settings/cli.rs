//! The command-line flags (clap). Every flag is optional: a flag given wins over the
//! environment variable of the same setting.

use std::path::PathBuf;

use clap::Parser;

/// An Envoy rate limit service (envoy.service.ratelimit.v3), a drop-in for
/// envoyproxy/ratelimit: the same YAML config, environment variables and API.
///
/// Every setting can also come from the reference's environment variables (RUNTIME_ROOT,
/// REDIS_URL, GRPC_PORT, ...); a flag wins over its variable.
#[derive(Debug, Parser)]
#[command(name = "ratekeeper-rls", version)]
pub(crate) struct Cli {
    /// Config file or directory of *.yaml/*.yml files [env: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY]
    #[arg(long, value_name = "FILE|DIR")]
    pub(crate) config: Option<PathBuf>,
    /// Check the config files, print each error as file:line:col, and exit (0 valid, 1 not)
    #[arg(long)]
    pub(crate) validate: bool,
    /// gRPC listen address (default 0.0.0.0:8081) [env: GRPC_HOST, GRPC_PORT]
    #[arg(long, value_name = "ADDR")]
    pub(crate) grpc: Option<String>,
    /// HTTP listen address for /healthcheck and /json (default 0.0.0.0:8080) [env: HOST, PORT]
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<String>,
    /// Debug listen address for /rlconfig (default 0.0.0.0:6070) [env: DEBUG_HOST, DEBUG_PORT]
    #[arg(long, value_name = "ADDR")]
    pub(crate) debug: Option<String>,
    /// Serve Prometheus metrics on this address [env: USE_PROMETHEUS, PROMETHEUS_ADDR]
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<String>,
    /// Where counters live: memory, redis, redis-cluster or tiered (default: redis when
    /// REDIS_URL is set, else memory) [env: BACKEND_TYPE, REDIS_TYPE]
    #[arg(long, value_name = "KIND")]
    pub(crate) store: Option<String>,
    /// Redis URL (redis://, rediss://, redis+unix://) or host:port; comma-separated for a
    /// cluster [env: REDIS_URL, REDIS_SOCKET_TYPE, REDIS_AUTH, REDIS_TLS]
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// The store's deadline per call, a Go duration such as 500ms [env: REDIS_TIMEOUT]
    #[arg(long, value_name = "DURATION")]
    pub(crate) store_timeout: Option<String>,
    /// The memory store's most counters per limit (default 1048576); past it new counters
    /// share one overflow counter under the same limit [env: MEMORY_MAX_KEYS]
    #[arg(long, value_name = "N")]
    pub(crate) max_keys: Option<String>,
    /// What a limit without its own on_store_failure answers when the store fails:
    /// unavailable (gRPC UNAVAILABLE, Envoy's failure_mode_deny decides; the default), allow,
    /// deny or fail_soft [env: ON_STORE_FAILURE]
    #[arg(long, value_name = "POLICY")]
    pub(crate) on_store_failure: Option<String>,
    /// Never refuse: report OVER_LIMIT statuses but answer OK overall [env: SHADOW_MODE]
    #[arg(long)]
    pub(crate) shadow_mode: bool,
    /// Every limit is a quota-mode limit [env: QUOTA_MODE]
    #[arg(long)]
    pub(crate) quota_mode: bool,
    /// Add RateLimit-Limit/Remaining/Reset headers to responses [env: LIMIT_RESPONSE_HEADERS_ENABLED]
    #[arg(long)]
    pub(crate) limit_response_headers: bool,
    /// Which response headers, when enabled: reference (RateLimit-Limit/Remaining/Reset, the
    /// default), ietf (RateLimit-Policy and RateLimit, draft-ietf-httpapi-ratelimit-headers-11)
    /// or both [env: LIMIT_RESPONSE_HEADERS_FORMAT]
    #[arg(long, value_name = "FORMAT")]
    pub(crate) response_headers_format: Option<String>,
    /// On OVER_LIMIT, answer an RFC 9457 problem+json body (quota-exceeded) for Envoy to send
    /// [env: OVER_LIMIT_PROBLEM_DETAILS]
    #[arg(long)]
    pub(crate) problem_details: bool,
    /// Return dynamic metadata in responses [env: RESPONSE_DYNAMIC_METADATA]
    #[arg(long)]
    pub(crate) response_dynamic_metadata: bool,
    /// Merge files that share a domain [env: MERGE_DOMAIN_CONFIG]
    #[arg(long)]
    pub(crate) merge_domains: bool,
    /// Log level: error, warn, info, debug or trace (default warn) [env: LOG_LEVEL]
    #[arg(long, value_name = "LEVEL")]
    pub(crate) log_level: Option<String>,
    /// Log format: text or json (default text) [env: LOG_FORMAT]
    #[arg(long, value_name = "FORMAT")]
    pub(crate) log_format: Option<String>,
}
