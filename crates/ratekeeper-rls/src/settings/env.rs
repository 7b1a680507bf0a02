//! Combining flags, environment and defaults.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::Parser as _;

use super::cli::Cli;
use super::values::{parse_addr, parse_bool, parse_duration, parse_host};
use super::{
    LogFormat, LogLevel, MetricsSettings, RedisSettings, ResponseHeaderNames, Settings, StoreKind,
};
use crate::config::LoadOptions;

/// Why the settings cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// `--help` or `--version`: the text to print (then exit 0).
    #[error("{0}")]
    Help(String),
    /// Unknown flag, missing flag value: clap's message with usage.
    #[error("{0}")]
    Usage(String),
    /// A variable with a value it cannot take. (Values of `REDIS_URL` and `REDIS_AUTH` are
    /// never echoed: they can hold a password.)
    #[error("environment variable {name}={value:?}: expected {expected}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it can be.
        expected: &'static str,
    },
    /// A flag with a value it cannot take.
    #[error("--{flag} {value:?}: expected {expected}")]
    InvalidFlag {
        /// The flag, without `--`.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What it can be.
        expected: &'static str,
    },
    /// A mode of the reference this service does not have, and whose absence would change
    /// what it does.
    #[error("{name}={value}: {reason}")]
    Unsupported {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// A Redis-backed store with no Redis URL.
    #[error("the {store} store needs a Redis URL: set --redis or REDIS_URL")]
    MissingRedisUrl {
        /// The store asked for.
        store: StoreKind,
    },
}

impl SettingsError {
    /// `--help` / `--version`: print the text and exit 0.
    pub fn is_help(&self) -> bool {
        matches!(self, SettingsError::Help(_))
    }
}

/// Variables of the reference that this service ignores, with what to say. `true`: warn only
/// when the variable is a true boolean; `false`: when it is set at all.
const IGNORED: &[(&str, bool, &str)] = &[
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
];

struct Env<F> {
    get: F,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The variable's value; empty counts as unset.
    fn var(&self, name: &str) -> Option<String> {
        (self.get)(name).filter(|v| !v.is_empty())
    }

    fn bool(&self, name: &'static str, default: bool) -> Result<bool, SettingsError> {
        match self.var(name) {
            None => Ok(default),
            Some(v) => parse_bool(&v).ok_or(SettingsError::InvalidEnv {
                name,
                value: v,
                expected: "a boolean (true/false, 1/0, t/f)",
            }),
        }
    }

    fn string(&self, name: &'static str, default: &str) -> String {
        self.var(name).unwrap_or_else(|| default.to_owned())
    }

    fn port(&self, name: &'static str, default: u16) -> Result<u16, SettingsError> {
        match self.var(name) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| SettingsError::InvalidEnv {
                name,
                value: v,
                expected: "a port number (0-65535)",
            }),
        }
    }

    fn host_port(
        &self,
        host: &'static str,
        port: &'static str,
        default_port: u16,
    ) -> Result<SocketAddr, SettingsError> {
        let ip = match self.var(host) {
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Some(v) => parse_host(&v).ok_or(SettingsError::InvalidEnv {
                name: host,
                value: v,
                expected: "an IP address, `::`, `0.0.0.0` or `localhost`",
            })?,
        };
        Ok(SocketAddr::new(ip, self.port(port, default_port)?))
    }
}

fn flag_addr(flag: &'static str, value: &str) -> Result<SocketAddr, SettingsError> {
    parse_addr(value).ok_or_else(|| SettingsError::InvalidFlag {
        flag,
        value: value.to_owned(),
        expected: "an address such as 0.0.0.0:8081, [::]:8081 or :8081",
    })
}

fn log_level(s: &str) -> Option<LogLevel> {
    Some(match s.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => LogLevel::Error,
        "warn" | "warning" => LogLevel::Warn,
        "info" => LogLevel::Info,
        "debug" => LogLevel::Debug,
        "trace" => LogLevel::Trace,
        _ => return None,
    })
}

fn log_format(s: &str) -> Option<LogFormat> {
    match s.to_ascii_lowercase().as_str() {
        "text" => Some(LogFormat::Text),
        "json" => Some(LogFormat::Json),
        _ => None,
    }
}

fn store_kind(s: &str) -> Option<StoreKind> {
    match s {
        "memory" => Some(StoreKind::Memory),
        "redis" => Some(StoreKind::Redis),
        "redis-cluster" => Some(StoreKind::RedisCluster),
        "tiered" => Some(StoreKind::Tiered),
        _ => None,
    }
}

/// Whether a header name is an HTTP token (RFC 9110 §5.6.2).
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

pub(super) fn parse<I, T>(
    args: I,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(Settings, Vec<String>), SettingsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            SettingsError::Help(e.to_string())
        }
        _ => SettingsError::Usage(e.to_string()),
    })?;
    let env = Env { get };
    let mut warnings = Vec::new();

    // Modes this service does not have.
    if let Some(v) = env.var("CONFIG_TYPE")
        && !v.eq_ignore_ascii_case("FILE")
    {
        return Err(SettingsError::Unsupported {
            name: "CONFIG_TYPE",
            value: v,
            reason: "only FILE is supported (no xDS client): mount the config as files",
        });
    }
    if let Some(v) = env.var("GRPC_UDS") {
        return Err(SettingsError::Unsupported {
            name: "GRPC_UDS",
            value: v,
            reason: "gRPC on a Unix socket is not supported: use GRPC_HOST/GRPC_PORT",
        });
    }
    if env.bool("GRPC_SERVER_USE_TLS", false)? {
        return Err(SettingsError::Unsupported {
            name: "GRPC_SERVER_USE_TLS",
            value: "true".to_owned(),
            reason: "gRPC TLS is not supported: terminate TLS in a sidecar or mesh",
        });
    }
    for &(name, only_if_true, why) in IGNORED {
        let Some(v) = env.var(name) else { continue };
        let active = if only_if_true {
            parse_bool(&v).unwrap_or(true)
        } else {
            true
        };
        if active {
            warnings.push(format!("{name} is ignored: {why}"));
        }
    }

    // Config location.
    let config = match cli.config {
        Some(p) => p,
        None => {
            let mut p = PathBuf::from(env.string("RUNTIME_ROOT", "/srv/runtime_data/current"));
            if let Some(sub) = env.var("RUNTIME_SUBDIRECTORY") {
                p.push(sub);
            }
            p.push(env.string("RUNTIME_APPDIRECTORY", "config"));
            p
        }
    };
    env.bool("RUNTIME_WATCH_ROOT", true)?;
    let load = LoadOptions::default()
        .merge_domains(cli.merge_domains || env.bool("MERGE_DOMAIN_CONFIG", false)?)
        .ignore_dotfiles(env.bool("RUNTIME_IGNOREDOTFILES", false)?);

    // Listeners.
    let grpc_addr = match &cli.grpc {
        Some(v) => flag_addr("grpc", v)?,
        None => env.host_port("GRPC_HOST", "GRPC_PORT", 8081)?,
    };
    let http_addr = match &cli.http {
        Some(v) => flag_addr("http", v)?,
        None => env.host_port("HOST", "PORT", 8080)?,
    };
    let debug_addr = match &cli.debug {
        Some(v) => flag_addr("debug", v)?,
        None => env.host_port("DEBUG_HOST", "DEBUG_PORT", 6070)?,
    };
    let metrics_path = env.string("PROMETHEUS_PATH", "/metrics");
    if !metrics_path.starts_with('/') {
        return Err(SettingsError::InvalidEnv {
            name: "PROMETHEUS_PATH",
            value: metrics_path,
            expected: "a path starting with /",
        });
    }
    let metrics = match &cli.metrics {
        Some(v) => Some(flag_addr("metrics", v)?),
        None if env.bool("USE_PROMETHEUS", false)? => {
            let v = env.string("PROMETHEUS_ADDR", ":9090");
            Some(parse_addr(&v).ok_or(SettingsError::InvalidEnv {
                name: "PROMETHEUS_ADDR",
                value: v,
                expected: "an address such as :9090 or 0.0.0.0:9090",
            })?)
        }
        None => None,
    }
    .map(|addr| MetricsSettings {
        addr,
        path: metrics_path,
    });

    // Store.
    let redis_type = match env.var("REDIS_TYPE") {
        None => None,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "single" => Some(false),
            "cluster" => Some(true),
            "sentinel" => {
                return Err(SettingsError::Unsupported {
                    name: "REDIS_TYPE",
                    value: v,
                    reason: "Redis Sentinel is not supported: use single or cluster",
                });
            }
            _ => {
                return Err(SettingsError::InvalidEnv {
                    name: "REDIS_TYPE",
                    value: v,
                    expected: "single or cluster",
                });
            }
        },
    };
    let redis_url = cli.redis.clone().or_else(|| env.var("REDIS_URL"));
    let redis_kind = if redis_type == Some(true) {
        StoreKind::RedisCluster
    } else {
        StoreKind::Redis
    };
    let store = match &cli.store {
        Some(v) => store_kind(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "store",
            value: v.clone(),
            expected: "memory, redis, redis-cluster or tiered",
        })?,
        None => match env.var("BACKEND_TYPE") {
            Some(v) if v.eq_ignore_ascii_case("redis") => redis_kind,
            Some(v) if v.eq_ignore_ascii_case("memcache") => {
                return Err(SettingsError::Unsupported {
                    name: "BACKEND_TYPE",
                    value: v,
                    reason: "memcache is not supported: use redis",
                });
            }
            Some(v) => {
                return Err(SettingsError::InvalidEnv {
                    name: "BACKEND_TYPE",
                    value: v,
                    expected: "redis",
                });
            }
            None if redis_url.is_some() => redis_kind,
            None => StoreKind::Memory,
        },
    };
    let redis = if store.uses_redis() {
        let Some(url) = redis_url else {
            return Err(SettingsError::MissingRedisUrl { store });
        };
        let from_flag = cli.redis.is_some();
        Some(redis_settings(
            &env,
            &url,
            from_flag,
            store == StoreKind::RedisCluster,
        )?)
    } else {
        None
    };
    let store_timeout = match (&cli.store_timeout, env.var("REDIS_TIMEOUT")) {
        (Some(v), _) => Some(parse_duration(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "store-timeout",
            value: v.clone(),
            expected: "a duration such as 500ms or 2s",
        })?),
        (None, Some(v)) => Some(parse_duration(&v).ok_or(SettingsError::InvalidEnv {
            name: "REDIS_TIMEOUT",
            value: v.clone(),
            expected: "a Go duration such as 500ms or 10s",
        })?),
        (None, None) => None,
    };

    // Decisions.
    let response_headers =
        if cli.limit_response_headers || env.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            let mut names = [
                ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
            ]
            .map(|(var, default)| (var, env.string(var, default)));
            for (var, name) in &mut names {
                if !is_header_name(name) {
                    return Err(SettingsError::InvalidEnv {
                        name: var,
                        value: std::mem::take(name),
                        expected: "an HTTP header name",
                    });
                }
            }
            let [(_, limit), (_, remaining), (_, reset)] = names;
            Some(ResponseHeaderNames {
                limit,
                remaining,
                reset,
            })
        } else {
            None
        };
    let near_limit_ratio = match env.var("NEAR_LIMIT_RATIO") {
        None => 0.8,
        Some(v) => match v.trim().parse::<f32>() {
            Ok(r) if r > 0.0 && r <= 1.0 => r,
            _ => {
                return Err(SettingsError::InvalidEnv {
                    name: "NEAR_LIMIT_RATIO",
                    value: v,
                    expected: "a number in (0, 1]",
                });
            }
        },
    };
    let log_level = match (&cli.log_level, env.var("LOG_LEVEL")) {
        (Some(v), _) => log_level(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "log-level",
            value: v.clone(),
            expected: "error, warn, info, debug or trace",
        })?,
        (None, Some(v)) => log_level(&v).ok_or(SettingsError::InvalidEnv {
            name: "LOG_LEVEL",
            value: v.clone(),
            expected: "error, warn, info, debug or trace",
        })?,
        (None, None) => LogLevel::Warn,
    };
    let log_format = match (&cli.log_format, env.var("LOG_FORMAT")) {
        (Some(v), _) => log_format(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "log-format",
            value: v.clone(),
            expected: "text or json",
        })?,
        (None, Some(v)) => log_format(&v).ok_or(SettingsError::InvalidEnv {
            name: "LOG_FORMAT",
            value: v.clone(),
            expected: "text or json",
        })?,
        (None, None) => LogFormat::Text,
    };

    let settings = Settings {
        config,
        validate: cli.validate,
        load,
        grpc_addr,
        http_addr,
        debug_addr,
        metrics,
        store,
        redis,
        store_timeout,
        shadow_mode: cli.shadow_mode || env.bool("SHADOW_MODE", false)?,
        quota_mode: cli.quota_mode || env.bool("QUOTA_MODE", false)?,
        response_headers,
        response_dynamic_metadata: cli.response_dynamic_metadata
            || env.bool("RESPONSE_DYNAMIC_METADATA", false)?,
        near_limit_ratio,
        cache_key_prefix: env.string("CACHE_KEY_PREFIX", ""),
        stop_increment_when_over_limit: env
            .bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?,
        healthy_with_at_least_one_config_loaded: env
            .bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
        force_start_without_initial_config: env
            .bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        log_level,
        log_format,
    };
    Ok((settings, warnings))
}

/// Splits `scheme://user:pass@rest` into the URL without credentials and the credentials.
fn split_credentials(url: &str) -> (String, Option<String>, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None, None);
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None, None);
    };
    let userinfo = &rest[..at];
    let (user, pass) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p.to_owned())),
        None => (userinfo, None),
    };
    let user = (!user.is_empty()).then(|| user.to_owned());
    (format!("{scheme}://{}", &rest[at + 1..]), user, pass)
}

fn redis_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    value: &str,
    from_flag: bool,
    cluster: bool,
) -> Result<RedisSettings, SettingsError> {
    let tls = env.bool("REDIS_TLS", false)?;
    let socket_type = env.var("REDIS_SOCKET_TYPE").map(|v| v.to_ascii_lowercase());
    if let Some(t) = &socket_type
        && t != "tcp"
        && t != "unix"
    {
        return Err(SettingsError::InvalidEnv {
            name: "REDIS_SOCKET_TYPE",
            value: t.clone(),
            expected: "tcp or unix",
        });
    }
    let mut urls = Vec::new();
    let mut username = None;
    let mut password = None;
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let url = if part.contains("://") {
            part.to_owned()
        } else {
            let unix = match (&socket_type, from_flag) {
                (Some(t), false) => t == "unix",
                _ => part.starts_with('/'),
            };
            match (unix, tls) {
                (true, _) => format!("redis+unix://{part}"),
                (false, true) => format!("rediss://{part}"),
                (false, false) => format!("redis://{part}"),
            }
        };
        let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s));
        if !scheme_ok {
            return Err(if from_flag {
                SettingsError::InvalidFlag {
                    flag: "redis",
                    value: "<redacted>".to_owned(),
                    expected: "redis://, rediss://, redis+unix:// or host:port",
                }
            } else {
                SettingsError::InvalidEnv {
                    name: "REDIS_URL",
                    value: "<redacted>".to_owned(),
                    expected: "host:port, a socket path, or a redis:// URL",
                }
            });
        }
        let (bare, user, pass) = split_credentials(&url);
        username = username.or(user);
        password = password.or(pass);
        urls.push(bare);
    }
    if urls.is_empty() {
        return Err(SettingsError::MissingRedisUrl {
            store: if cluster {
                StoreKind::RedisCluster
            } else {
                StoreKind::Redis
            },
        });
    }
    // REDIS_AUTH is `password` or `user:password` (the reference's form).
    if let Some(auth) = env.var("REDIS_AUTH") {
        match auth.split_once(':') {
            Some((u, p)) => {
                username = Some(u.to_owned());
                password = Some(p.to_owned());
            }
            None => password = Some(auth),
        }
    }
    Ok(RedisSettings {
        urls,
        cluster,
        username,
        password,
    })
}

/// Percent-encodes a URL user-info part (RFC 3986 unreserved characters kept).
fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL with `user:password@` inserted after the scheme (none when there is no password
/// and no user).
pub(super) fn with_credentials(url: &str, user: Option<&str>, password: Option<&str>) -> String {
    if user.is_none() && password.is_none() {
        return url.to_owned();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    if scheme == "redis+unix" || scheme == "unix" {
        // The redis crate reads Unix-socket credentials from the query.
        let mut query = Vec::new();
        if let Some(u) = user {
            query.push(format!("user={}", encode_userinfo(u)));
        }
        if let Some(p) = password {
            query.push(format!("pass={}", encode_userinfo(p)));
        }
        let sep = if rest.contains('?') { '&' } else { '?' };
        return format!("{scheme}://{rest}{sep}{}", query.join("&"));
    }
    let user = user.map(encode_userinfo).unwrap_or_default();
    match password {
        Some(p) => format!("{scheme}://{user}:{}@{rest}", encode_userinfo(p)),
        None => format!("{scheme}://{user}@{rest}"),
    }
}
