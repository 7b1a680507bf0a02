//! Combining flags, environment and defaults.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser as _;

use super::cli::Cli;
use super::ignored::IGNORED;
use super::redis::redis_settings;
use super::values::{parse_addr, parse_bool, parse_duration};
use super::vars::Env;
use super::{
    HeaderFormat, LogFormat, LogLevel, MetricsSettings, ResponseHeaderNames, Settings,
    SettingsError, StoreKind,
};
use crate::config::{LoadOptions, OnStoreFailure};

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

fn header_format(s: &str) -> Option<HeaderFormat> {
    match s.trim().to_ascii_lowercase().as_str() {
        "reference" => Some(HeaderFormat::Reference),
        "ietf" => Some(HeaderFormat::Ietf),
        "both" => Some(HeaderFormat::Both),
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
    let memory_max_keys = match (&cli.max_keys, env.var("MEMORY_MAX_KEYS")) {
        (Some(v), _) => v.trim().parse().map_err(|_| SettingsError::InvalidFlag {
            flag: "max-keys",
            value: v.clone(),
            expected: "a positive integer",
        })?,
        (None, Some(v)) => v.trim().parse().map_err(|_| SettingsError::InvalidEnv {
            name: "MEMORY_MAX_KEYS",
            value: v,
            expected: "a positive integer",
        })?,
        (None, None) => super::defaults::MEMORY_MAX_KEYS,
    };
    let tiered_max_lease = match env.var("TIERED_MAX_LEASE") {
        None => std::num::NonZeroU32::new(100).unwrap_or(std::num::NonZeroU32::MIN),
        Some(v) => v.trim().parse().map_err(|_| SettingsError::InvalidEnv {
            name: "TIERED_MAX_LEASE",
            value: v,
            expected: "an integer from 1 to 4294967295",
        })?,
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

    let response_headers_format = match (
        &cli.response_headers_format,
        env.var("LIMIT_RESPONSE_HEADERS_FORMAT"),
    ) {
        (Some(v), _) => header_format(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "response-headers-format",
            value: v.clone(),
            expected: "reference, ietf or both",
        })?,
        (None, Some(v)) => header_format(&v).ok_or(SettingsError::InvalidEnv {
            name: "LIMIT_RESPONSE_HEADERS_FORMAT",
            value: v.clone(),
            expected: "reference, ietf or both",
        })?,
        (None, None) => HeaderFormat::Reference,
    };

    let on_store_failure = match (&cli.on_store_failure, env.var("ON_STORE_FAILURE")) {
        (Some(v), _) => OnStoreFailure::parse(v).ok_or_else(|| SettingsError::InvalidFlag {
            flag: "on-store-failure",
            value: v.clone(),
            expected: "unavailable, allow, deny or fail_soft",
        })?,
        (None, Some(v)) => OnStoreFailure::parse(&v).ok_or(SettingsError::InvalidEnv {
            name: "ON_STORE_FAILURE",
            value: v.clone(),
            expected: "unavailable, allow, deny or fail_soft",
        })?,
        (None, None) => OnStoreFailure::Unavailable,
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
        tiered_max_lease,
        memory_max_keys,
        on_store_failure,
        shadow_mode: cli.shadow_mode || env.bool("SHADOW_MODE", false)?,
        quota_mode: cli.quota_mode || env.bool("QUOTA_MODE", false)?,
        response_headers,
        response_headers_format,
        problem_details: cli.problem_details || env.bool("OVER_LIMIT_PROBLEM_DETAILS", false)?,
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
