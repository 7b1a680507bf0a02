//! The binary configured the way envoyproxy/ratelimit's users configure theirs: with the
//! reference's environment variables only, no flag.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// Generous: the tests pass on 2 cores beside 16 busy loops.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// Kills (SIGKILL) and reaps the child on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Four distinct free TCP ports on 127.0.0.1 (bound together, read, released).
fn distinct_free_ports() -> [u16; 4] {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let listeners = [bind(), bind(), bind(), bind()];
    listeners.map(|l| l.local_addr().expect("a bound address").port())
}

/// `ratekeeper-rls` started with an empty environment but for `PORT`, `GRPC_PORT`,
/// `RUNTIME_ROOT` + `RUNTIME_SUBDIRECTORY` (the example configuration:
/// `examples/ratelimit/config`) and `USE_PROMETHEUS=true` (plus the listeners' hosts and the
/// debug and Prometheus ports, also the reference's names, to stay on free loopback ports):
/// `/healthcheck` answers 200, a gRPC `ShouldRateLimit` for the example's per-client rule
/// answers `OK` with the rule's limit (3 per hour) and 2 remaining, and Prometheus' `/metrics`
/// counts the loaded config and the call under the reference's metric names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_environment_alone_serves_healthcheck_metrics_and_should_rate_limit() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let out = std::env::temp_dir().join(format!("ratekeeper-rls-env-{}.log", std::process::id()));
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    let client = reqwest::Client::new();
    // A port taken by another process between `free_port` and the bind makes the binary exit
    // at start: then again on other ports, at most 3 times.
    let mut started = None;
    for _ in 0..3 {
        let ports = distinct_free_ports();
        let [http, grpc, debug, prometheus] = ports;
        let log = std::fs::File::create(&out).expect("create the log file");
        let mut child = Killed(
            Command::new(env!("CARGO_BIN_EXE_ratekeeper-rls"))
                .env_clear()
                .env("PORT", http.to_string())
                .env("GRPC_PORT", grpc.to_string())
                .env("RUNTIME_ROOT", &examples)
                .env("RUNTIME_SUBDIRECTORY", "ratelimit")
                .env("USE_PROMETHEUS", "true")
                .env("HOST", "127.0.0.1")
                .env("GRPC_HOST", "127.0.0.1")
                .env("DEBUG_HOST", "127.0.0.1")
                .env("DEBUG_PORT", debug.to_string())
                .env("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log file"))
                .stderr(log)
                .spawn()
                .expect("start ratekeeper-rls"),
        );
        let deadline = Instant::now() + READY_DEADLINE;
        let healthy = loop {
            if let Ok(Some(_)) = child.0.try_wait() {
                break false;
            }
            let res = client
                .get(format!("http://127.0.0.1:{http}/healthcheck"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if let Ok(res) = res {
                assert_eq!(res.status(), 200, "/healthcheck; output:\n{}", output());
                break true;
            }
            assert!(
                Instant::now() < deadline,
                "no /healthcheck answer on port {http} within {READY_DEADLINE:?}; output:\n{}",
                output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if healthy {
            started = Some((child, ports));
            break;
        }
    }
    let Some((_child, [_, grpc, _, prometheus])) = started else {
        panic!(
            "ratekeeper-rls exited at start 3 times; its last output:\n{}",
            output()
        );
    };

    let grpc_addr: SocketAddr = ([127, 0, 0, 1], grpc).into();
    let mut rls = RateLimitServiceClient::connect(format!("http://{grpc_addr}"))
        .await
        .unwrap_or_else(|e| panic!("gRPC connect to {grpc_addr}: {e}; output:\n{}", output()));
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    let request = RateLimitRequest {
        domain: "api".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![entry("route", "api"), entry("client", "alice")],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let response = rls
        .should_rate_limit(request)
        .await
        .unwrap_or_else(|e| panic!("ShouldRateLimit: {e}; output:\n{}", output()))
        .into_inner();
    assert_eq!(response.overall_code(), Code::Ok, "{response:?}");
    assert_eq!(response.statuses.len(), 1, "{response:?}");
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref().expect("the rule's limit");
    assert_eq!(limit.requests_per_unit, 3, "{response:?}");
    assert_eq!(limit.name, "per-client", "{response:?}");
    assert_eq!(status.limit_remaining, 2, "{response:?}");

    let metrics = client
        .get(format!("http://127.0.0.1:{prometheus}/metrics"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("Prometheus /metrics: {e}; output:\n{}", output()));
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.expect("the /metrics body");
    // The reference's names: the config loaded once, the call above counted on its rule.
    for line in [
        "ratelimit_service_config_load_success 1",
        r#"ratelimit_service_rate_limit_total_hits{domain="api",key1="route_api",key2="client"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no `{line}` in /metrics:\n{text}"
        );
    }
    let _ = std::fs::remove_file(&out);
}
