//! Refused requests (gRPC errors, counted), a config that never loaded, a store that fails,
//! and malformed input, which never stops the server.

use std::time::{Duration, Instant};

use crate::on_both_stores;
use crate::support::*;

const ERRS: &str = r#"
domain: errs
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

async fn empty_domain_is_an_error_body(b: Backend) {
    let mut rls = Rls::start(b, ERRS, &[]).await;
    let e = rls
        .try_call(req("", vec![desc(&[("k", "v")])], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit domain must not be empty");
}
on_both_stores!(empty_domain_is_an_error, empty_domain_is_an_error_body);

async fn no_descriptors_is_an_error_body(b: Backend) {
    let mut rls = Rls::start(b, ERRS, &[]).await;
    let e = rls.try_call(req("errs", vec![], 0)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
}
on_both_stores!(no_descriptors_is_an_error, no_descriptors_is_an_error_body);

async fn no_config_loaded_is_an_error_until_one_loads_body(b: Backend) {
    let env = [("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")];
    let mut rls = Rls::start(b, "domain: errs\ndescriptors: [oops\n", &env).await;
    let e = rls
        .try_call(req("errs", vec![desc(&[("k", "v")])], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert_eq!(e.message(), "no rate limit configuration loaded");
    let (status, _) = rls.http_get("/healthcheck").await;
    assert_eq!(
        status, 200,
        "healthy without a config unless HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"
    );
    // A good file arrives: the watcher loads it (polled every 50 ms; bounded wait).
    std::fs::write(rls.dir.path().join("config.yaml"), ERRS).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rls
            .try_call(req("errs", vec![desc(&[("k", "v")])], 0))
            .await
        {
            Ok(r) => {
                assert_eq!(cr(&r.statuses[0]), (ok(), 2));
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable);
                assert!(Instant::now() < deadline, "the config never reloaded");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
on_both_stores!(
    no_config_loaded_is_an_error_until_one_loads,
    no_config_loaded_is_an_error_until_one_loads_body
);

async fn healthy_only_with_a_config_when_required_body(b: Backend) {
    let env = [
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
    ];
    let rls = Rls::start(b, "domain: errs\ndescriptors: [oops\n", &env).await;
    assert_eq!(rls.http_get("/healthcheck").await.0, 500);
    std::fs::write(rls.dir.path().join("config.yaml"), ERRS).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while rls.http_get("/healthcheck").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never healthy after the config loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rls.http_get("/healthcheck").await.1, "OK");
}
on_both_stores!(
    healthy_only_with_a_config_when_required,
    healthy_only_with_a_config_when_required_body
);

/// With Redis down, a call answers within the store's deadline (not the reference's 10 s
/// `REDIS_TIMEOUT` wait, <https://github.com/envoyproxy/ratelimit/issues/462>): a gRPC
/// `UNAVAILABLE` that Envoy's `failure_mode_deny` turns into an allow or a refusal, counted
/// as `redis_error`; `/healthcheck` turns 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failure_answers_within_the_deadline() {
    let mut rls = Rls::start(Backend::Redis, ERRS, &[("REDIS_TIMEOUT", "200ms")]).await;
    assert_eq!(
        rls.call(req("errs", vec![desc(&[("k", "v")])], 0))
            .await
            .statuses[0]
            .limit_remaining,
        2
    );
    let before = rls.debug_get("/metrics").await.1;
    rls.redis.as_mut().unwrap().kill();
    for _ in 0..3 {
        let started = Instant::now();
        let e = rls
            .try_call(req("errs", vec![desc(&[("k", "v")])], 0))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        // 200 ms deadline; 5 s is slack for a loaded machine, still half the reference's wait.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
    let after = rls.debug_get("/metrics").await.1;
    let name = "ratelimit_service_should_rate_limit_error";
    let label = "err_type=\"redis_error\"";
    assert!(
        sample(&after, name, label) >= sample(&before, name, label) + 3.0,
        "{after}"
    );
    assert_eq!(rls.http_get("/healthcheck").await.0, 500);
}

async fn malformed_input_never_stops_the_server_body(b: Backend) {
    let mut rls = Rls::start(b, ERRS, &[]).await;
    let weird = vec![
        desc(&[("", "")]),
        desc(&[("k", "\u{0}\u{ffff}é*")]),
        // An override with an unknown unit: no limit.
        desc_override(&[("k", "v")], 5, 0),
        desc_override(&[("k", "v")], 5, 99),
        // A zero override refuses, as a zero rule does.
        desc_override(&[("k", "zero")], 0, 1),
    ];
    let r = rls.call(req("errs", weird, 0)).await;
    let codes: Vec<_> = r.statuses.iter().map(cr).collect();
    assert_eq!(
        codes,
        [(ok(), 0), (ok(), 2), (ok(), 0), (ok(), 0), (over(), 0)]
    );
    // A thousand descriptors in one request.
    let many = (0..1_000)
        .map(|i| desc(&[("k", &format!("v{i}"))]))
        .collect();
    let r = rls.call(req("errs", many, 0)).await;
    assert_eq!(r.statuses.len(), 1_000);
    assert!(r.statuses.iter().all(|s| cr(s) == (ok(), 2)));
    // The overrides without a unit charged nothing.
    assert_eq!(
        rls.call(req("errs", vec![desc(&[("k", "v")])], 0))
            .await
            .statuses[0]
            .limit_remaining,
        2
    );
}
on_both_stores!(
    malformed_input_never_stops_the_server,
    malformed_input_never_stops_the_server_body
);

/// Divergence (`compat`, row R5): store keys are hashes of the domain and the rule's counter,
/// so descriptor values (an API key, say) never appear in a Redis key name; the reference
/// writes `prefix + domain_key_value_…_window` in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_keys_never_hold_descriptor_values() {
    let mut rls = Rls::start(Backend::Redis, ERRS, &[("CACHE_KEY_PREFIX", "team-a")]).await;
    rls.call(req("errs", vec![desc(&[("k", "sk-live-SECRET-42")])], 0))
        .await;
    let keys = rls.redis.as_ref().unwrap().key_ttls("*");
    // The counter, beside the fleet registry of the fail-soft handle (replica ids).
    let counters: Vec<_> = keys
        .iter()
        .filter(|(k, _)| k.starts_with("rls:team-a:") && k != "rls:team-a:v2:{fleet}:instances")
        .collect();
    assert_eq!(counters.len(), 1, "{keys:?}");
    for (k, ttl) in &keys {
        assert!(!k.contains("SECRET") && !k.contains("errs"), "{k}");
        // Every counter expires (its window and then some).
        if k.starts_with("rls:team-a:") {
            assert!(*ttl > 0, "{k} {ttl}");
        }
    }
}

/// A store built to fail closed (`on_store_failure(Deny)`): with Redis down the call is
/// answered within the deadline, every descriptor it could not decide `OVER_LIMIT`, and
/// counted once as `redis_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_store_refuses_within_the_deadline() {
    let mut rls = Rls::start_failing(
        Backend::Redis,
        ERRS,
        &[("REDIS_TIMEOUT", "200ms")],
        ratekeeper_core::store::FailurePolicy::Deny,
    )
    .await;
    rls.redis.as_mut().unwrap().kill();
    let before = rls.debug_get("/metrics").await.1;
    let started = Instant::now();
    let r = rls
        .call(req(
            "errs",
            vec![
                desc(&[("k", "v")]),
                desc(&[("k", "w")]),
                desc(&[("none", "x")]),
            ],
            0,
        ))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(r.overall_code, over());
    let codes: Vec<_> = r.statuses.iter().map(cr).collect();
    assert_eq!(codes, [(over(), 0), (over(), 0), (ok(), 0)]);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        3
    );
    let after = rls.debug_get("/metrics").await.1;
    let name = "ratelimit_service_should_rate_limit_error";
    let label = "err_type=\"redis_error\"";
    assert!(
        sample(&after, name, label) >= sample(&before, name, label) + 1.0,
        "{after}"
    );
}
