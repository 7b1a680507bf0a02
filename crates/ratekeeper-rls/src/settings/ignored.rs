//! The reference's variables that this service ignores.

/// Variables of the reference that this service ignores, with what to say. `true`: warn only
/// when the variable is a true boolean; `false`: when it is set at all.
pub(super) const IGNORED: &[(&str, bool, &str)] = &[
    (
        "USE_STATSD",
        true,
        "statsd is not supported; use USE_PROMETHEUS",
    ),
    (
        "USE_DOG_STATSD",
        true,
        "statsd is not supported; use USE_PROMETHEUS",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        false,
        "statsd is not supported",
    ),
    ("STATSD_HOST", false, "statsd is not supported"),
    ("STATSD_PORT", false, "statsd is not supported"),
    ("EXTRA_TAGS", false, "stats tags are not supported"),
    (
        "STATS_FLUSH_INTERVAL",
        false,
        "metrics are served, not flushed",
    ),
    (
        "DISABLE_STATS",
        true,
        "stats cannot be disabled; do not scrape them",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        false,
        "the metric names are fixed",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        true,
        "response time is in seconds",
    ),
    ("GRPC_MAX_CONNECTION_AGE", false, "not supported"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", false, "not supported"),
    ("GRPC_CLIENT_TLS_CACERT", false, "gRPC TLS is not supported"),
    ("GRPC_SERVER_TLS_CERT", false, "gRPC TLS is not supported"),
    ("GRPC_SERVER_TLS_KEY", false, "gRPC TLS is not supported"),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        false,
        "gRPC TLS is not supported",
    ),
    ("GRPC_CLIENT_TLS_SAN", false, "gRPC TLS is not supported"),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        false,
        "no local over-limit cache: the store answers",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        false,
        "keys expire at their window's end",
    ),
    (
        "REDIS_POOL_SIZE",
        false,
        "the Redis client multiplexes one connection",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        false,
        "the Redis client multiplexes one connection",
    ),
    ("REDIS_PIPELINE_WINDOW", false, "not supported"),
    ("REDIS_PIPELINE_LIMIT", false, "not supported"),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", false, "not supported"),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        true,
        "not supported",
    ),
    ("REDIS_STARTUP_INITIAL_INTERVAL", false, "not supported"),
    ("REDIS_STARTUP_MAX_INTERVAL", false, "not supported"),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", false, "not supported"),
    (
        "REDIS_SENTINEL_AUTH",
        false,
        "Redis Sentinel is not supported",
    ),
    (
        "REDIS_TLS_CLIENT_CERT",
        false,
        "client certificates are not supported",
    ),
    (
        "REDIS_TLS_CLIENT_KEY",
        false,
        "client certificates are not supported",
    ),
    (
        "REDIS_TLS_CACERT",
        false,
        "the system's CA certificates are used",
    ),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        true,
        "not supported",
    ),
    (
        "REDIS_PERSECOND",
        true,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_URL",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_SOCKET_TYPE",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_TYPE",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_AUTH",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_TLS",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_POOL_SIZE",
        false,
        "per-second limits use the main store",
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        false,
        "per-second limits use the main store",
    ),
    ("MEMCACHE_HOST_PORT", false, "memcache is not supported"),
    ("MEMCACHE_SRV", false, "memcache is not supported"),
    ("TRACING_ENABLED", true, "tracing export is not supported"),
    ("CONFIG_GRPC_XDS_SERVER_URL", false, "xDS is not supported"),
    ("CONFIG_GRPC_XDS_NODE_ID", false, "xDS is not supported"),
    (
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        true,
        "xDS is not supported",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        false,
        "xDS is not supported",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        false,
        "xDS is not supported",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        false,
        "xDS is not supported",
    ),
];
