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
