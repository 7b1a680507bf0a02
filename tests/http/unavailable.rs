//! The fail-closed answer over real HTTP: when the store cannot decide and its failure policy
//! is `Deny`, the layer answers a 503 that says when to retry, and a polite client waits that
//! long before its next request.

use std::convert::Infallible;
use std::future::Ready;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratekeeper_axum::client::PoliteLayer;
use ratekeeper_axum::core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_axum::{RateLimitLayer, core::Key, core::Policy, core::Quota, key::GlobalKey};
use ratekeeper_tests::{TestServer, ok_app};
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};

/// A store that never decides and fails closed; it logs when each check came (tokio time).
#[derive(Clone, Default)]
struct Down {
    checks: Arc<Mutex<Vec<Instant>>>,
}

impl Store<Key> for Down {
    type Future = Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, _policy: &Policy) -> Result<PolicyId, StoreError> {
        Ok(PolicyId::from_index(0))
    }

    fn check(&self, _charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        self.checks.lock().expect("log").push(Instant::now());
        Checked::Pending(std::future::ready(Err(StoreError::Failed {
            policy: FailurePolicy::Deny,
            source: Box::new(StoreError::Timeout),
        })))
    }

    fn refund(&self, _refunds: &[Refund<'_, Key>]) {}
}

fn layer(store: Down, wait: Option<Duration>) -> RateLimitLayer<GlobalKey, u64, Down> {
    let builder = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(10).expect("10")),
        ))
        .key(GlobalKey)
        .store(store);
    match wait {
        Some(wait) => builder.unavailable_retry_after(wait),
        None => builder,
    }
    .build()
    .expect("layer")
}

/// Every header but `date`, sorted, as `name: value` lines.
fn header_lines(res: &reqwest::Response) -> Vec<String> {
    let mut lines: Vec<String> = res
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| format!("{}: {}", n, v.to_str().expect("ascii")))
        .collect();
    lines.sort();
    lines
}

/// The fail-closed 503 byte for byte: problem+json of the temporary-reduced-capacity type,
/// `Retry-After` in whole seconds (the configured 1.2 s rounded up), `Cache-Control:
/// no-store`, and no rate-limit fields (the store could not say what is left).
#[tokio::test]
async fn fail_closed_503_is_problem_json_with_retry_after() {
    let server = TestServer::start(
        ok_app().layer(layer(Down::default(), Some(Duration::from_millis(1_200)))),
    )
    .await;
    let res = server.get("/").send().await.expect("answer");
    assert_eq!(res.status(), 503);
    let body = "{\"type\":\"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity\",\
\"title\":\"Service Unavailable\",\"status\":503,\
\"detail\":\"the rate limiter cannot decide now (its store is unavailable); retry after 2 s\"}";
    assert_eq!(
        header_lines(&res),
        [
            "cache-control: no-store".to_owned(),
            format!("content-length: {}", body.len()),
            "content-type: application/problem+json".to_owned(),
            "retry-after: 2".to_owned(),
        ]
    );
    assert_eq!(res.text().await.expect("body"), body);
}

/// A polite client in front of a fail-closed layer no longer comes back at once: its next
/// request waits the 503's `Retry-After` (1 s by default) before it reaches the layer.
#[tokio::test(start_paused = true)]
async fn a_polite_client_waits_out_the_fail_closed_503() {
    let store = Down::default();
    let server = ServiceBuilder::new()
        .layer(layer(store.clone(), None))
        .service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        });
    let client = PoliteLayer::new().layer(server);
    let first = client
        .clone()
        .oneshot(Request::get("http://api.test/").body(()).expect("request"))
        .await
        .expect("first answer");
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(first.headers()["retry-after"], "1");
    let second = client
        .oneshot(Request::get("http://api.test/").body(()).expect("request"))
        .await
        .expect("second answer");
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    let checks = store.checks.lock().expect("log").clone();
    assert_eq!(checks.len(), 2);
    assert!(
        checks[1] - checks[0] >= Duration::from_secs(1),
        "the second request reached the layer after {:?}",
        checks[1] - checks[0]
    );
}
