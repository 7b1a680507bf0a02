//! Flags and the reference's environment: manifests from the field (Istio's sample, Envoy
//! Gateway's deployment), flags over environment, bad values, ignored variables.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ratekeeper_rls::settings::{LogFormat, LogLevel, Settings, SettingsError, StoreKind};

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

fn parse(args: &[&str], vars: &[(&str, &str)]) -> Result<(Settings, Vec<String>), SettingsError> {
    let mut argv = vec!["ratekeeper-rls"];
    argv.extend_from_slice(args);
    Settings::parse(argv, env(vars))
}

fn ok(args: &[&str], vars: &[(&str, &str)]) -> (Settings, Vec<String>) {
    parse(args, vars).unwrap_or_else(|e| panic!("{args:?} {vars:?}: {e}"))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

/// Istio's `samples/ratelimit/rate-limit-service.yaml` (the env of its ratelimit container).
const ISTIO: &[(&str, &str)] = &[
    ("LOG_LEVEL", "debug"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis:6379"),
    ("USE_STATSD", "false"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("HOST", "::"),
    ("GRPC_HOST", "::"),
];

#[test]
fn istio_sample_environment() {
    let (s, warnings) = ok(&[], ISTIO);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(s.config_path(), Path::new("/data/ratelimit/config"));
    assert!(s.load.ignore_dotfiles);
    assert!(!s.load.merge_domains);
    assert_eq!(s.grpc_addr, addr("[::]:8081"));
    assert_eq!(s.http_addr, addr("[::]:8080"));
    assert_eq!(s.debug_addr, addr("0.0.0.0:6070"));
    assert_eq!(s.store, StoreKind::Redis);
    let redis = s.redis.expect("redis settings");
    assert_eq!(redis.urls, ["redis://redis:6379"]);
    assert!(!redis.cluster);
    assert_eq!(redis.password(), None);
    assert_eq!(s.log_level, LogLevel::Debug);
    assert_eq!(s.log_format, LogFormat::Text);
    assert_eq!(s.metrics, None);
    assert!(!s.validate);
}

/// Envoy Gateway's rate limit deployment (internal/infrastructure/kubernetes/ratelimit
/// testdata), without its xDS and gRPC TLS settings: the file mode.
const ENVOY_GATEWAY_FILE_MODE: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "true"),
    ("STATSD_PORT", "9125"),
    ("CONFIG_TYPE", "FILE"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
];

#[test]
fn envoy_gateway_file_mode_environment() {
    let (s, warnings) = ok(&[], ENVOY_GATEWAY_FILE_MODE);
    assert_eq!(s.config_path(), Path::new("/data/ratelimit/config"));
    assert!(s.force_start_without_initial_config);
    assert_eq!(s.log_level, LogLevel::Info);
    assert_eq!(
        s.redis.map(|r| r.urls),
        Some(vec!["redis://redis.redis.svc:6379".to_owned()])
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("USE_STATSD is ignored"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("STATSD_PORT is ignored"),
        "{warnings:?}"
    );
}

#[test]
fn envoy_gateway_xds_mode_is_refused() {
    let mut vars = ENVOY_GATEWAY_FILE_MODE.to_vec();
    vars.retain(|(k, _)| *k != "CONFIG_TYPE");
    vars.push(("CONFIG_TYPE", "GRPC_XDS_SOTW"));
    vars.push(("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"));
    let e = parse(&[], &vars).unwrap_err();
    assert!(
        matches!(&e, SettingsError::Unsupported { name: "CONFIG_TYPE", value, .. } if value == "GRPC_XDS_SOTW"),
        "{e}"
    );
}

#[test]
fn defaults_are_the_reference_defaults() {
    let (s, warnings) = ok(&[], &[]);
    assert!(warnings.is_empty());
    assert_eq!(
        s.config_path(),
        Path::new("/srv/runtime_data/current/config")
    );
    assert_eq!(s.grpc_addr, addr("0.0.0.0:8081"));
    assert_eq!(s.http_addr, addr("0.0.0.0:8080"));
    assert_eq!(s.debug_addr, addr("0.0.0.0:6070"));
    assert_eq!(s.store, StoreKind::Memory);
    assert_eq!(s.redis, None);
    assert_eq!(s.store_timeout, None);
    assert_eq!(s.log_level, LogLevel::Warn);
    assert!((s.near_limit_ratio - 0.8).abs() < f32::EPSILON);
    assert_eq!(s.response_headers, None);
    assert!(!s.shadow_mode && !s.quota_mode && !s.response_dynamic_metadata);
    assert!(!s.healthy_with_at_least_one_config_loaded);
    assert!(!s.stop_increment_when_over_limit);
    assert_eq!(s.cache_key_prefix, "");
}

#[test]
fn decision_settings_from_the_environment() {
    let (s, _) = ok(
        &[],
        &[
            ("SHADOW_MODE", "true"),
            ("QUOTA_MODE", "1"),
            ("RESPONSE_DYNAMIC_METADATA", "T"),
            ("MERGE_DOMAIN_CONFIG", "TRUE"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("CACHE_KEY_PREFIX", "rl:"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":9191"),
            ("PROMETHEUS_PATH", "/m"),
            ("REDIS_TIMEOUT", "1500ms"),
            ("LOG_FORMAT", "json"),
            ("RUNTIME_APPDIRECTORY", "rules"),
        ],
    );
    assert!(s.shadow_mode && s.quota_mode && s.response_dynamic_metadata);
    assert!(s.load.merge_domains);
    let h = s.response_headers.clone().expect("headers on");
    assert_eq!(
        (h.limit.as_str(), h.remaining.as_str(), h.reset.as_str()),
        ("RateLimit-Limit", "X-Left", "RateLimit-Reset")
    );
    assert!((s.near_limit_ratio - 0.9).abs() < f32::EPSILON);
    assert_eq!(s.cache_key_prefix, "rl:");
    assert!(s.healthy_with_at_least_one_config_loaded);
    assert!(s.stop_increment_when_over_limit);
    let m = s.metrics.clone().expect("prometheus on");
    assert_eq!((m.addr, m.path.as_str()), (addr("0.0.0.0:9191"), "/m"));
    assert_eq!(s.store_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(s.log_format, LogFormat::Json);
    assert_eq!(
        s.config_path(),
        Path::new("/srv/runtime_data/current/rules")
    );
}

#[test]
fn flags_win_over_the_environment() {
    let (s, _) = ok(
        &[
            "--config",
            "/etc/rl",
            "--grpc",
            "127.0.0.1:9001",
            "--http",
            ":9002",
            "--debug",
            "[::1]:9003",
            "--metrics",
            "9004",
            "--store",
            "memory",
            "--log-level",
            "trace",
            "--store-timeout",
            "250ms",
            "--shadow-mode",
            "--validate",
        ],
        &[
            ("RUNTIME_ROOT", "/data"),
            ("GRPC_PORT", "1"),
            ("PORT", "2"),
            ("DEBUG_PORT", "3"),
            ("PROMETHEUS_ADDR", ":4"),
            ("REDIS_URL", "redis:6379"),
            ("LOG_LEVEL", "error"),
            ("REDIS_TIMEOUT", "10s"),
        ],
    );
    assert_eq!(s.config_path(), Path::new("/etc/rl"));
    assert_eq!(s.grpc_addr, addr("127.0.0.1:9001"));
    assert_eq!(s.http_addr, addr("0.0.0.0:9002"));
    assert_eq!(s.debug_addr, addr("[::1]:9003"));
    assert_eq!(s.metrics.map(|m| m.addr), Some(addr("0.0.0.0:9004")));
    assert_eq!(s.store, StoreKind::Memory);
    assert_eq!(s.redis, None);
    assert_eq!(s.log_level, LogLevel::Trace);
    assert_eq!(s.store_timeout, Some(Duration::from_millis(250)));
    assert!(s.shadow_mode && s.validate);
}

#[test]
fn redis_flag_and_cluster() {
    let (s, _) = ok(
        &["--redis", "redis://a:1,redis://b:2"],
        &[("REDIS_TYPE", "cluster")],
    );
    assert_eq!(s.store, StoreKind::RedisCluster);
    let r = s.redis.expect("redis");
    assert!(r.cluster);
    assert_eq!(r.urls, ["redis://a:1", "redis://b:2"]);
    let (s, _) = ok(&["--store", "redis-cluster", "--redis", "a:1,b:2"], &[]);
    assert_eq!(
        s.redis.map(|r| r.urls),
        Some(vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()])
    );
}

#[test]
fn redis_credentials_stay_out_of_debug_and_errors() {
    let (s, _) = ok(
        &[],
        &[
            ("REDIS_URL", "redis://u:s3cret@r:6379"),
            ("REDIS_TLS", "true"),
        ],
    );
    let r = s.redis.expect("redis");
    assert_eq!(r.urls, ["redis://r:6379"]);
    assert_eq!(r.username.as_deref(), Some("u"));
    assert_eq!(r.password(), Some("s3cret"));
    assert!(!format!("{r:?}").contains("s3cret"));
    assert_eq!(r.connection_urls(), ["redis://u:s3cret@r:6379"]);
    let (s, _) = ok(
        &[],
        &[
            ("REDIS_URL", "r:6379"),
            ("REDIS_AUTH", "p@ss:w"),
            ("REDIS_TLS", "true"),
        ],
    );
    let r = s.redis.expect("redis");
    assert_eq!(r.urls, ["rediss://r:6379"]);
    assert_eq!(r.connection_urls(), ["rediss://p%40ss:w@r:6379"]);
    let (s, _) = ok(
        &[],
        &[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "pw")],
    );
    let r = s.redis.expect("redis");
    assert_eq!(r.urls, ["redis+unix:///run/redis.sock"]);
    assert_eq!(
        r.connection_urls(),
        ["redis+unix:///run/redis.sock?pass=pw"]
    );
    let e = parse(&[], &[("REDIS_URL", "http://u:s3cret@x")]).unwrap_err();
    assert!(matches!(
        e,
        SettingsError::InvalidEnv {
            name: "REDIS_URL",
            ..
        }
    ));
    assert!(!e.to_string().contains("s3cret"), "{e}");
}

#[test]
fn memory_store_without_redis_url() {
    // compat S1: the reference would use Redis on its default socket.
    let (s, _) = ok(&[], &[("REDIS_SOCKET_TYPE", "tcp")]);
    assert_eq!(s.store, StoreKind::Memory);
    let (s, _) = ok(&[], &[("REDIS_URL", "r:1")]);
    assert_eq!(s.store, StoreKind::Redis);
    let e = parse(&[], &[("BACKEND_TYPE", "redis")]).unwrap_err();
    assert_eq!(
        e,
        SettingsError::MissingRedisUrl {
            store: StoreKind::Redis
        }
    );
    let e = parse(&["--store", "tiered"], &[]).unwrap_err();
    assert_eq!(
        e,
        SettingsError::MissingRedisUrl {
            store: StoreKind::Tiered
        }
    );
}

#[test]
fn socket_type_is_inferred_when_unset() {
    // compat S2: the reference assumes unix.
    let (s, _) = ok(&[], &[("REDIS_URL", "redis:6379")]);
    assert_eq!(
        s.redis.map(|r| r.urls),
        Some(vec!["redis://redis:6379".to_owned()])
    );
    let (s, _) = ok(&[], &[("REDIS_URL", "/var/run/r.sock")]);
    assert_eq!(
        s.redis.map(|r| r.urls),
        Some(vec!["redis+unix:///var/run/r.sock".to_owned()])
    );
    // Set explicitly, it is obeyed.
    let (s, _) = ok(
        &[],
        &[("REDIS_URL", "r.sock"), ("REDIS_SOCKET_TYPE", "unix")],
    );
    assert_eq!(
        s.redis.map(|r| r.urls),
        Some(vec!["redis+unix://r.sock".to_owned()])
    );
}

#[test]
fn unsupported_modes_are_errors() {
    // compat S3.
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("BACKEND_TYPE", "memcache"),
        ("REDIS_TYPE", "SENTINEL"),
        ("GRPC_UDS", "/tmp/rls.sock"),
        ("GRPC_SERVER_USE_TLS", "true"),
    ] {
        let e = parse(&[], &[(name, value), ("REDIS_URL", "r:1")]).unwrap_err();
        assert!(
            matches!(&e, SettingsError::Unsupported { name: n, .. } if *n == name),
            "{name}={value}: {e}"
        );
        assert!(e.to_string().starts_with(&format!("{name}=")), "{e}");
    }
}

#[test]
fn go_only_variables_warn() {
    // compat S4.
    let (_, warnings) = ok(
        &[],
        &[
            ("USE_STATSD", "true"),
            ("REDIS_POOL_SIZE", "20"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
            ("REDIS_PERSECOND", "false"),
            ("TRACING_ENABLED", "false"),
        ],
    );
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    for (w, name) in
        warnings
            .iter()
            .zip(["USE_STATSD", "LOCAL_CACHE_SIZE_IN_BYTES", "REDIS_POOL_SIZE"])
    {
        assert!(w.starts_with(&format!("{name} is ignored")), "{warnings:?}");
    }
}

#[test]
fn empty_variables_are_unset() {
    // compat S5.
    let (s, _) = ok(
        &[],
        &[("SHADOW_MODE", ""), ("GRPC_PORT", ""), ("RUNTIME_ROOT", "")],
    );
    assert!(!s.shadow_mode);
    assert_eq!(s.grpc_addr.port(), 8081);
    assert_eq!(
        s.config_path(),
        Path::new("/srv/runtime_data/current/config")
    );
}

#[test]
fn bad_values_name_their_variable_or_flag() {
    for (name, value) in [
        ("SHADOW_MODE", "yes"),
        ("QUOTA_MODE", "2"),
        ("GRPC_PORT", "http"),
        ("PORT", "70000"),
        ("HOST", "example.com"),
        ("REDIS_TIMEOUT", "10"),
        ("NEAR_LIMIT_RATIO", "1.5"),
        ("LOG_LEVEL", "verbose"),
        ("LOG_FORMAT", "xml"),
        ("REDIS_TYPE", "ring"),
        ("REDIS_SOCKET_TYPE", "udp"),
        ("LIMIT_LIMIT_HEADER", "Bad Header"),
        ("PROMETHEUS_PATH", "metrics"),
        ("BACKEND_TYPE", "etcd"),
    ] {
        let mut vars = vec![(name, value), ("REDIS_URL", "r:1")];
        if name == "LIMIT_LIMIT_HEADER" {
            vars.push(("LIMIT_RESPONSE_HEADERS_ENABLED", "true"));
        }
        let e = parse(&[], &vars).unwrap_err();
        assert!(
            matches!(&e, SettingsError::InvalidEnv { name: n, .. } if *n == name),
            "{name}={value}: {e:?}"
        );
        assert!(e.to_string().contains(name), "{e}");
    }
    for (flag, value) in [
        ("grpc", "nowhere"),
        ("store", "disk"),
        ("log-level", "loud"),
        ("store-timeout", "soon"),
    ] {
        let e = parse(&[&format!("--{flag}"), value], &[]).unwrap_err();
        assert!(
            matches!(&e, SettingsError::InvalidFlag { flag: f, .. } if *f == flag),
            "--{flag} {value}: {e:?}"
        );
    }
    assert!(matches!(
        parse(&["--no-such-flag"], &[]),
        Err(SettingsError::Usage(_))
    ));
}

#[test]
fn help_is_text_to_print() {
    let e = parse(&["--help"], &[]).unwrap_err();
    assert!(e.is_help());
    assert!(e.to_string().contains("--validate"), "{e}");
}
