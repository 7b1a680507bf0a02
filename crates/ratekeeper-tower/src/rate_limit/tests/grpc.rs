//! gRPC calls: refusals in the trailers-only form, only for a layer that serves gRPC.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use ratekeeper_core::{Policy, Quota};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::ok;
use crate::{RateLimitLayer, key::GlobalKey};

/// One call of `svc` with `content-type` set (or not): status, headers, body.
async fn call_with<S>(svc: &S, content_type: Option<&str>) -> (StatusCode, http::HeaderMap, String)
where
    S: Service<
            Request<()>,
            Response = Response<crate::body::ResponseBody<String>>,
            Error = Infallible,
        > + Clone,
{
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    if let Some(ct) = content_type {
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
    }
    let res = svc.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = http_body_util::BodyExt::collect(body)
        .await
        .unwrap()
        .to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn grpc_limited(style: crate::report::HeaderStyle) -> RateLimitLayer<GlobalKey, u64> {
    RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .headers(style)
        .grpc(true)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_limited_grpc_call_gets_resource_exhausted_trailers_only() {
    use crate::report::HeaderStyle;
    for style in [HeaderStyle::XRateLimit, HeaderStyle::Ietf] {
        let svc = ServiceBuilder::new()
            .layer(grpc_limited(style))
            .service_fn(ok);
        let (status, headers, _) = call_with(&svc, Some("application/grpc")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            headers.get("grpc-status").is_none(),
            "allowed calls are untouched"
        );

        let (status, headers, body) = call_with(&svc, Some("application/grpc+proto")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "");
        // The answer speaks the call's own content type.
        assert_eq!(headers["content-type"], "application/grpc+proto");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limit \"burst\" exceeded; retry after 60 s"
        );
        assert_eq!(headers["retry-after"], "60");
        assert!(headers.contains_key("grpc-status-details-bin"));
        assert!(headers.get("content-length").is_none());
        match style {
            HeaderStyle::Ietf => assert_eq!(headers["ratelimit"], "\"burst\";r=0;t=60"),
            _ => assert_eq!(headers["x-ratelimit-remaining"], "0"),
        }

        // The same limit answers plain HTTP with the usual 429.
        let (status, headers, body) = call_with(&svc, None).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(headers.get("grpc-status").is_none());
        assert!(body.contains("violated-policies"));
    }
}

/// A layer that does not serve gRPC (the default), or a call that is not gRPC by its
/// protocol's grammar (`application/grpc` over HTTP/1.1), keeps the HTTP status of a
/// refusal: a client cannot turn its own 429 into a 200.
#[tokio::test]
async fn a_client_cannot_turn_a_refusal_into_a_200_with_its_content_type() {
    let plain = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(plain).service_fn(ok);
    assert_eq!(call_with(&svc, None).await.0, StatusCode::OK);
    for ct in [
        "application/grpc",
        "application/grpc-web",
        "application/grpc+proto",
    ] {
        let (status, headers, _) = call_with(&svc, Some(ct)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{ct}");
        assert!(headers.get("grpc-status").is_none());
    }
    // A gRPC layer: `application/grpc` over HTTP/1.1 is no gRPC call.
    let svc = ServiceBuilder::new()
        .layer(grpc_limited(crate::report::HeaderStyle::XRateLimit))
        .service_fn(ok);
    assert_eq!(call_with(&svc, None).await.0, StatusCode::OK);
    let mut req = Request::new(());
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/grpc".parse().unwrap(),
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("grpc-status").is_none());
}

#[tokio::test]
async fn a_grpc_call_whose_cost_can_never_fit_gets_no_retry_information() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(GlobalKey)
        .cost_fn(|_req: &crate::RequestParts<'_>| 5)
        .grpc(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(
        headers["grpc-message"],
        "rate limit \"burst\" exceeded: the request costs more than the policy can ever allow; do not retry"
    );
    assert!(headers.get("retry-after").is_none());
    assert!(headers.get("grpc-status-details-bin").is_none());
}

#[tokio::test]
async fn a_grpc_call_without_a_key_gets_invalid_argument() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .grpc(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "3");
    assert!(!headers["grpc-message"].is_empty());
}

/// Behind a fallback only denials go to the fallback: a gRPC call the layer cannot key still
/// gets the gRPC form of its answer, decided once with the rest of its ticket.
#[tokio::test]
async fn behind_a_fallback_a_grpc_call_without_a_key_still_gets_invalid_argument() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("burst", Quota::per_minute(NonZeroU32::MIN)))
        .key(crate::key::HeaderKey::raw("x-api-key"))
        .grpc(true)
        .build()
        .unwrap()
        .with_fallback(tower::service_fn(ok));
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let (status, headers, body) = call_with(&svc, Some("application/grpc")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(headers["grpc-status"], "3");
    assert!(headers.get(&crate::headers::RATELIMIT_DEGRADED).is_none());
}

#[tokio::test]
async fn a_grpc_call_over_the_concurrency_limit_gets_resource_exhausted() {
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    let wait = Arc::new(tokio::sync::Mutex::new(Some(wait)));
    let svc = ServiceBuilder::new()
        .layer(
            crate::concurrency::ConcurrencyLimitLayer::new(NonZeroU32::MIN)
                .key(GlobalKey)
                .grpc(true),
        )
        .service_fn(move |_req: Request<()>| {
            let wait = wait.clone();
            async move {
                if let Some(wait) = wait.lock().await.take() {
                    let _ = wait.await;
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
    let held = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/grpc".parse().unwrap(),
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(
        res.headers()["grpc-message"],
        "rate limit \"concurrency\" exceeded; retry after 1 s"
    );
    assert_eq!(res.headers()["retry-after"], "1");
    release.send(()).unwrap();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}
