//! `/healthcheck`, `grpc.health.v1.Health/Check`, `/rlconfig` and `/json`.

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::*;

const CONFIG: &str = r#"
domain: ops
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_answers_ok_and_grpc_health_serves_both_names() {
    let rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    assert_eq!(rls.http_get("/healthcheck").await, (200, "OK".to_owned()));
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        rls.server().local_grpc_addr()
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "ratelimit"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_dumps_the_config_in_force() {
    let rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    let (status, body) = rls.debug_get("/rlconfig").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["domains"][0]["domain"], "ops");
    assert_eq!(v["domains"][0]["descriptors"][0]["key"], "user");
    assert_eq!(
        v["domains"][0]["descriptors"][0]["rate_limit"]["requests_per_unit"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_answers_200_then_429_and_400_for_bad_requests() {
    let rls = Rls::start(Backend::Memory, CONFIG, &[]).await;
    let url = format!("http://{}/json", rls.server().local_http_addr());
    let client = reqwest::Client::new();
    let body = r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#;
    let post = |b: &'static str| client.post(&url).body(b).send();
    let r = post(body).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["durationUntilReset"], "30s");
    let r = post(body).await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(post("not json").await.unwrap().status().as_u16(), 400);
    assert_eq!(
        post(r#"{"domain":"","descriptors":[]}"#)
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
}

/// The reference's health components: with Redis gone, both `/healthcheck` (500) and the
/// gRPC health service (`NOT_SERVING`) say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_store() {
    let mut rls = Rls::start(Backend::Redis, CONFIG, &[("REDIS_TIMEOUT", "200ms")]).await;
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        rls.server().local_grpc_addr()
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut health = HealthClient::new(channel);
    let status = |h: &mut HealthClient<tonic::transport::Channel>| {
        let mut h = h.clone();
        async move {
            h.check(HealthCheckRequest {
                service: "ratelimit".to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
        }
    };
    assert_eq!(status(&mut health).await, ServingStatus::Serving as i32);
    rls.redis.as_mut().unwrap().kill();
    // A call notices the store is gone (the breaker opens after failures).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while status(&mut health).await != ServingStatus::NotServing as i32 {
        let _ = rls
            .try_call(req("ops", vec![desc(&[("user", "h")])], 0))
            .await;
        assert!(
            std::time::Instant::now() < deadline,
            "gRPC health never turned NOT_SERVING"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(rls.http_get("/healthcheck").await.0, 500);
}

/// `Server::service()` mounted in a tonic server of one's own answers from the same config
/// and counters as the server's own listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_mounts_in_a_server_of_ones_own() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

    let mut rls = Rls::start(Backend::Memory, CONFIG.replace("1}", "3}").as_str(), &[]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = RateLimitServiceServer::new(rls.server().service());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let r = rls
        .call(req("ops", vec![desc(&[("user", "own")])], 0))
        .await;
    assert_eq!(cr(&r.statuses[0]), (ok(), 2));
    let mut own = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let r = own
        .should_rate_limit(req("ops", vec![desc(&[("user", "own")])], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cr(&r.statuses[0]), (ok(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_carries_dynamic_metadata_and_headers_when_enabled() {
    let env = [
        ("RESPONSE_DYNAMIC_METADATA", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
    ];
    let rls = Rls::start(Backend::Memory, CONFIG, &env).await;
    let url = format!("http://{}/json", rls.server().local_http_addr());
    let body = r#"{"domain":"ops","hitsAddend":1,"descriptors":[{"entries":[{"key":"user","value":"m"}]}]}"#;
    let r = reqwest::Client::new()
        .post(&url)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["dynamicMetadata"]["domain"], "ops");
    assert_eq!(v["dynamicMetadata"]["hitsAddend"], 1.0);
    assert_eq!(
        v["dynamicMetadata"]["descriptors"][0]["entries"][0],
        "user=m"
    );
    assert_eq!(v["responseHeadersToAdd"][0]["key"], "RateLimit-Limit");
    assert_eq!(v["responseHeadersToAdd"][1]["value"], "0");
}
