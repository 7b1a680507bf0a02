//! The graceful stop: health turns NOT_SERVING, calls in flight finish, the binary exits 0
//! on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_support::free_port;
use crate::support::*;

const CONFIG: &str = r#"
domain: stop
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

/// A call waiting on a stopped (SIGSTOP) `redis-server` when the shutdown begins: health is
/// `NOT_SERVING` at once, the shutdown waits for the call, and the call gets its answer once
/// Redis runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_calls_in_flight() {
    let mut rls = Rls::start(Backend::Redis, CONFIG, &[]).await;
    assert_eq!(
        rls.call(req("stop", vec![desc(&[("k", "v")])], 0))
            .await
            .statuses[0]
            .limit_remaining,
        4
    );
    rls.redis.as_ref().unwrap().signal("STOP");
    let mut client = rls.client.clone();
    let call = tokio::spawn(async move {
        client
            .should_rate_limit(req("stop", vec![desc(&[("k", "v")])], 0))
            .await
            .map(tonic::Response::into_inner)
    });
    let server = std::sync::Arc::new(rls.server.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.calls_in_flight() == 0 {
        assert!(Instant::now() < deadline, "the call never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopping = std::sync::Arc::clone(&server);
    let shutdown = tokio::spawn(async move { stopping.shutdown().await });
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.is_healthy() {
        assert!(Instant::now() < deadline, "health never turned NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !shutdown.is_finished(),
        "the shutdown did not wait for the call in flight"
    );
    assert_eq!(server.calls_in_flight(), 1);
    rls.redis.as_ref().unwrap().signal("CONT");
    let answer = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call finishes")
        .unwrap()
        .expect("the call in flight is answered, not cut");
    assert_eq!(cr(&answer.statuses[0]), (ok(), 3));
    tokio::time::timeout(Duration::from_secs(30), shutdown)
        .await
        .expect("the shutdown finishes")
        .unwrap();
    assert_eq!(server.calls_in_flight(), 0);
}

/// The binary serves with nothing but a config file (memory store), then exits 0 on SIGTERM;
/// at the most verbose log level no descriptor value reaches its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_and_exits_zero_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), CONFIG).unwrap();
    let (grpc, http, debug) = (free_port(), free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratekeeper-rls"))
        .arg("--config")
        .arg(dir.path())
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--debug", &format!("127.0.0.1:{debug}")])
        .args(["--log-level", "trace"])
        .env_remove("REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Read the log while the binary runs, so that a full pipe never blocks it.
    let mut stderr = child.stderr.take().unwrap();
    let log_reader = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
        log
    });
    let health = format!("http://127.0.0.1:{http}/healthcheck");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = reqwest::get(&health).await
            && r.status().as_u16() == 200
        {
            break;
        }
        assert!(Instant::now() < deadline, "the binary never became healthy");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the binary exited early"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{grpc}"),
    )
    .await
    .unwrap();
    let r = client
        .should_rate_limit(req("stop", vec![desc(&[("k", "sk-live-SECRET-7")])], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 4);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the binary did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(exit.code(), Some(0));
    let log = log_reader.join().unwrap();
    assert!(log.contains("serving"), "{log}");
    assert!(!log.contains("SECRET"), "{log}");
}
