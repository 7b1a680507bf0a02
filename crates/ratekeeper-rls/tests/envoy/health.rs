//! Envoy's active gRPC health check of our server (`grpc.health.v1.Health/Check`, service
//! `ratelimit`) agrees with our `/healthcheck`.

use std::time::{Duration, Instant};

use crate::harness::{
    Envoy, Listener, MEMBERSHIP_HEALTHY, Rls, Scenario, TempDir, example_config_dir,
};

/// Waits (at most 60 s) until Envoy's [`MEMBERSHIP_HEALTHY`] is `expected`.
async fn wait_membership(envoy: &Envoy, expected: u64, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let healthy = envoy.counter(MEMBERSHIP_HEALTHY).await;
        if healthy == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: Envoy's health check still finds {healthy} healthy host(s) after 60 s, \
             expected {expected}\nEnvoy's log:\n{}",
            envoy.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true`, our server started without a
/// config it can load (`FORCE_START_WITHOUT_INITIAL_CONFIG=true`) is unhealthy: 500 on
/// `/healthcheck`, and Envoy's gRPC health check marks it unhealthy. Once a good file is
/// written into the directory and reloaded, `/healthcheck` answers 200 and Envoy's health
/// check finds it healthy again: the gRPC health status follows the config as
/// `/healthcheck` does (the reference's health checker updates both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_grpc_health_check_follows_our_health_as_a_config_loads() {
    let dir = TempDir::new("late-config");
    std::fs::write(
        dir.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n",
    )
    .expect("write the config");
    let rls = Rls::start_with(
        dir.path(),
        &[],
        &[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
    )
    .await;
    assert_eq!(rls.healthcheck().await, 500, "no config loaded yet");
    let scenario = Scenario::start_with_health_check(&[Listener::open("open")], rls).await;
    wait_membership(&scenario.envoy, 0, "no config loaded").await;

    let good = std::fs::read(example_config_dir().join("api.yaml")).expect("the example");
    std::fs::write(dir.path().join("api.yaml"), good).expect("write the good config");
    let deadline = Instant::now() + Duration::from_secs(60);
    while scenario.rls.healthcheck().await != 200 {
        assert!(
            Instant::now() < deadline,
            "/healthcheck not 200 within 60 s of a good config"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_membership(&scenario.envoy, 1, "a config loaded, /healthcheck 200").await;
}

/// A server with its config loaded answers Envoy's gRPC health check `SERVING`: Envoy counts
/// it healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_grpc_health_check_finds_a_serving_server_healthy() {
    let rls = Rls::start(&[]).await;
    let scenario = Scenario::start_with_health_check(&[Listener::open("open")], rls).await;
    wait_membership(&scenario.envoy, 1, "config loaded, /healthcheck 200").await;
}
