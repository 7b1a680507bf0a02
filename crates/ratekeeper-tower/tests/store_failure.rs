//! How the layer answers when the store cannot decide (the failure policy; the report
//! <https://github.com/envoyproxy/ratelimit/issues/462>, where every request waited for a Redis
//! that was down): fail open passes the request without rate-limit headers, fail closed answers 503
//! (not 429), and degrade passes it on marked for the fallback.

use std::convert::Infallible;
use std::future::Ready;
use std::num::NonZeroU32;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratekeeper_core::store::{
    Charge, Checked, Decisions, FailurePolicy, PolicyId, Refund, Store, StoreError,
};
use ratekeeper_core::{Key, Policy, Quota};
use ratekeeper_tower::report::TEMPORARY_REDUCED_CAPACITY_TYPE;
use ratekeeper_tower::{RateLimitLayer, StoreDegraded, key::GlobalKey};
use tower::{ServiceBuilder, ServiceExt};

fn failed(action: FailurePolicy) -> Result<Decisions, StoreError> {
    Err(StoreError::Failed {
        policy: action,
        source: Box::new(StoreError::Timeout),
    })
}

/// A store that never decides: every check fails at once with its action.
struct Failing(FailurePolicy);

impl Store<Key> for Failing {
    type Future = Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, _policy: &Policy) -> Result<PolicyId, StoreError> {
        Ok(PolicyId::from_index(0))
    }

    fn check(&self, _charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        Checked::Ready(failed(self.0))
    }

    fn refund(&self, _refunds: &[Refund<'_, Key>]) {}
}

/// A store whose check is a future (like a networked store) that then fails.
struct FailingLater(FailurePolicy);

impl Store<Key> for FailingLater {
    type Future = Ready<Result<Decisions, StoreError>>;

    fn register(&mut self, _policy: &Policy) -> Result<PolicyId, StoreError> {
        Ok(PolicyId::from_index(0))
    }

    fn check(&self, _charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        Checked::Pending(std::future::ready(failed(self.0)))
    }

    fn refund(&self, _refunds: &[Refund<'_, Key>]) {}
}

/// Status, whether rate-limit headers were sent, and the body (the inner service echoes the
/// `StoreDegraded` action it saw, or "none").
async fn answer<St: Store<Key>>(store: St) -> (StatusCode, bool, String) {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(10).expect("10")),
        ))
        .key(GlobalKey)
        .store(store)
        .grpc(true)
        .build()
        .expect("layer");
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|req: Request<String>| async move {
            let seen = match req.extensions().get::<StoreDegraded>() {
                Some(d) => d.action.to_string(),
                None => "none".to_owned(),
            };
            Ok::<_, Infallible>(Response::new(seen))
        });
    let res = svc
        .oneshot(Request::new(String::new()))
        .await
        .expect("answer");
    let status = res.status();
    let has_headers = res.headers().contains_key("x-ratelimit-remaining");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
        .unwrap_or_default();
    (status, has_headers, body)
}

#[tokio::test]
async fn fail_open_passes_without_headers_and_marks_the_request() {
    for (status, headers, body) in [
        answer(Failing(FailurePolicy::Allow)).await,
        answer(FailingLater(FailurePolicy::Allow)).await,
    ] {
        assert_eq!(
            (status, headers, body.as_str()),
            (StatusCode::OK, false, "allow")
        );
    }
}

#[tokio::test]
async fn fail_closed_answers_503_not_429() {
    for (status, headers, body) in [
        answer(Failing(FailurePolicy::Deny)).await,
        answer(FailingLater(FailurePolicy::Deny)).await,
    ] {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!headers);
        let problem: serde_json::Value = serde_json::from_str(&body).expect("problem+json");
        assert_eq!(problem["type"], TEMPORARY_REDUCED_CAPACITY_TYPE);
        assert_eq!(problem["status"], 503);
    }
}

/// The fail-closed 503 says when to retry: `Retry-After` in whole seconds (the configured
/// wait rounded up), `Cache-Control: no-store`, and an RFC 9457 problem+json body of the
/// temporary-reduced-capacity type whose `detail` names the same seconds; no rate-limit
/// fields (the store could not say what is left).
#[tokio::test]
async fn fail_closed_503_is_problem_json_with_retry_after() {
    async fn unavailable<St: Store<Key>>(store: St, wait: Option<Duration>) -> Response<String> {
        let builder = RateLimitLayer::builder()
            .policy(Policy::new(
                "api",
                Quota::per_minute(NonZeroU32::new(10).expect("10")),
            ))
            .key(GlobalKey)
            .store(store);
        let builder = match wait {
            Some(wait) => builder.unavailable_retry_after(wait),
            None => builder,
        };
        let svc = ServiceBuilder::new()
            .layer(builder.build().expect("layer"))
            .service_fn(|_req: Request<String>| async move {
                Ok::<_, Infallible>(Response::new("called".to_owned()))
            });
        let res = svc
            .oneshot(Request::new(String::new()))
            .await
            .expect("answer");
        let (parts, body) = res.into_parts();
        let body = http_body_util::BodyExt::collect(body)
            .await
            .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
            .expect("body");
        Response::from_parts(parts, body)
    }
    for (res, secs) in [
        (unavailable(Failing(FailurePolicy::Deny), None).await, 1),
        (
            unavailable(FailingLater(FailurePolicy::Deny), None).await,
            1,
        ),
        (
            unavailable(
                Failing(FailurePolicy::Deny),
                Some(Duration::from_millis(2_500)),
            )
            .await,
            3,
        ),
        (
            unavailable(
                FailingLater(FailurePolicy::Deny),
                Some(Duration::from_millis(2_500)),
            )
            .await,
            3,
        ),
        // A zero wait would invite a retry at once: still 1.
        (
            unavailable(Failing(FailurePolicy::Deny), Some(Duration::ZERO)).await,
            1,
        ),
    ] {
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let headers = res.headers();
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(headers["cache-control"], "no-store");
        assert_eq!(headers["retry-after"], secs.to_string().as_str());
        assert!(headers.get("x-ratelimit-remaining").is_none());
        let problem: serde_json::Value = serde_json::from_str(res.body()).expect("problem+json");
        assert_eq!(
            problem,
            serde_json::json!({
                "type": TEMPORARY_REDUCED_CAPACITY_TYPE,
                "title": "Service Unavailable",
                "status": 503,
                "detail": format!(
                    "the rate limiter cannot decide now (its store is unavailable); retry after {secs} s"
                ),
            })
        );
    }
}

#[tokio::test]
async fn degrade_reaches_the_inner_service_marked_for_the_fallback() {
    for (status, headers, body) in [
        answer(Failing(FailurePolicy::Degrade)).await,
        answer(FailingLater(FailurePolicy::Degrade)).await,
    ] {
        assert_eq!(
            (status, headers, body.as_str()),
            (StatusCode::OK, false, "degrade")
        );
    }
}

/// The fail-closed answer to a gRPC call (HTTP/2, to a layer that serves gRPC), for a store
/// that answers at once and one that answers later: status, `grpc-status`, `grpc-message`,
/// body length, `retry-after`, and whether a `grpc-status-details-bin` (the `RetryInfo`) came.
async fn grpc_answer<St: Store<Key>>(
    store: St,
) -> (StatusCode, String, String, usize, String, bool) {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            Quota::per_minute(NonZeroU32::new(10).expect("10")),
        ))
        .key(GlobalKey)
        .store(store)
        .grpc(true)
        .build()
        .expect("layer");
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_req: Request<String>| async move {
            Ok::<_, Infallible>(Response::new("called".to_owned()))
        });
    let req = Request::builder()
        .version(http::Version::HTTP_2)
        .header("content-type", "application/grpc")
        .body(String::new())
        .expect("request");
    let res = svc.oneshot(req).await.expect("answer");
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (status, code, message) = (res.status(), header("grpc-status"), header("grpc-message"));
    let (retry, details) = (
        header("retry-after"),
        res.headers().contains_key("grpc-status-details-bin"),
    );
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .map(|c| c.to_bytes().len())
        .unwrap_or(usize::MAX);
    (status, code, message, body, retry, details)
}

#[tokio::test]
async fn fail_closed_answers_grpc_unavailable_to_grpc_calls() {
    for answer in [
        grpc_answer(Failing(FailurePolicy::Deny)).await,
        grpc_answer(FailingLater(FailurePolicy::Deny)).await,
    ] {
        assert_eq!(
            answer,
            (
                StatusCode::OK,
                "14".to_owned(),
                "rate limiter unavailable".to_owned(),
                0,
                "1".to_owned(),
                true
            )
        );
    }
}
