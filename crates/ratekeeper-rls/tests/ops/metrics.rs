//! The reference's metric names and labels, beside ratekeeper's own; descriptor values in
//! labels only under `detailed_metric`.

use crate::support::*;

const CONFIG: &str = r#"
domain: metered
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: plan
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_names_and_labels_are_the_references() {
    let mut rls = Rls::start(Backend::Redis, CONFIG, &[("SHADOW_MODE", "true")]).await;
    for _ in 0..3 {
        rls.call(req("metered", vec![desc(&[("user", "secret-user-id")])], 0))
            .await;
        rls.call(req(
            "metered",
            vec![desc(&[("tenant", "t1"), ("plan", "gold")])],
            0,
        ))
        .await;
    }
    rls.call(req("unknown-domain", vec![desc(&[("user", "u")])], 0))
        .await;
    let errors = r#"err_type="service_error""#;
    let error_name = "ratelimit_service_should_rate_limit_error";
    let before = sample(&rls.debug_get("/metrics").await.1, error_name, errors);
    let _ = rls.try_call(req("", vec![desc(&[("user", "u")])], 0)).await;
    let m = rls.debug_get("/metrics").await.1;
    // (`/json` tests of this binary count service errors too: at least this one.)
    assert!(sample(&m, error_name, errors) >= before + 1.0);
    let user = r#"domain="metered",key1="user",key2="""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", user),
        3.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_within_limit", user),
        2.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_over_limit", user),
        1.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_near_limit", user),
        1.0
    );
    let plan = r#"domain="metered",key1="tenant",key2="plan""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_shadow_mode", plan),
        2.0
    );
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_over_limit", plan),
        2.0
    );
    // The user's over-limit call was turned OK by the global shadow mode.
    assert!(sample(&m, "ratelimit_service_global_shadow_mode", "") >= 1.0);
    assert_eq!(
        sample(
            &m,
            "ratelimit_service_domain_not_found",
            r#"domain="unknown-domain""#
        ),
        1.0
    );
    let method = r#"grpc_method="ShouldRateLimit""#;
    assert!(sample(&m, "ratelimit_service_total_requests", method) >= 8.0);
    assert!(sample(&m, "ratelimit_service_response_time_seconds_count", method) >= 8.0);
    assert!(
        m.contains("ratelimit_service_response_time_seconds_bucket{"),
        "{m}"
    );
    assert!(sample(&m, "ratelimit_service_config_load_success", "") >= 1.0);
    // ratekeeper's own, from the Redis store.
    assert!(m.contains("ratekeeper_store_latency_seconds"), "{m}");
    // Descriptor values stay out of labels without detailed_metric.
    assert!(!m.contains("secret-user-id"), "{m}");
    assert!(!m.contains("gold") && !m.contains("t1"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_puts_values_in_labels() {
    let mut rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    rls.call(req("metered", vec![desc(&[("api_key", "k-123")])], 0))
        .await;
    let m = rls.debug_get("/metrics").await.1;
    let labels = r#"domain="metered",key1="api_key_k-123",key2="""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", labels),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_listener_serves_the_metrics_when_enabled() {
    let port = crate::redis_support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", addr.as_str()),
    ];
    let mut rls = Rls::start(Backend::Memory, CONFIG, &env).await;
    assert_eq!(
        rls.server().local_metrics_addr().map(|a| a.port()),
        Some(port)
    );
    rls.call(req("metered", vec![desc(&[("api_key", "p")])], 0))
        .await;
    let (status, body) = get(&format!("http://{addr}/metrics")).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("ratelimit_service_rate_limit_total_hits{"),
        "{body}"
    );
}

/// Divergence (`compat`, row R7): a descriptor with Envoy's `RateLimitOverride` is counted
/// under labels made of its keys only; the reference's stats key for it holds every value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_stats_labels_hold_keys_only() {
    let mut rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    rls.call(req(
        "metered",
        vec![desc_override(
            &[("account", "acct-SECRET"), ("route", "r1")],
            3,
            2,
        )],
        0,
    ))
    .await;
    let m = rls.debug_get("/metrics").await.1;
    let labels = r#"domain="metered",key1="account",key2="route""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", labels),
        1.0
    );
    assert!(!m.contains("acct-SECRET"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_puts_its_value_in_labels() {
    let mut rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    rls.call(req("metered", vec![desc(&[("route", "checkout")])], 0))
        .await;
    let m = rls.debug_get("/metrics").await.1;
    let labels = r#"domain="metered",key1="route_checkout",key2="""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", labels),
        1.0
    );
}

/// At most `MAX_SERIES` label sets per server: hits of further values (here under
/// `detailed_metric`) are counted under the `_overflow` labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_series_past_the_cap_go_to_overflow() {
    let mut rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    let cap = ratekeeper_rls::stats::MAX_SERIES;
    let values: Vec<String> = (0..cap + 10).map(|i| format!("capkey{i}")).collect();
    for chunk in values.chunks(500) {
        let descriptors = chunk.iter().map(|v| desc(&[("api_key", v)])).collect();
        rls.call(req("metered", descriptors, 0)).await;
    }
    let m = rls.debug_get("/metrics").await.1;
    let overflow = r#"domain="_overflow",key1="_overflow",key2="_overflow""#;
    assert_eq!(
        sample(&m, "ratelimit_service_rate_limit_total_hits", overflow),
        10.0
    );
    let kept = m
        .lines()
        .filter(|l| {
            l.starts_with("ratelimit_service_rate_limit_total_hits{") && l.contains("capkey")
        })
        .count();
    assert_eq!(kept, cap);
}
